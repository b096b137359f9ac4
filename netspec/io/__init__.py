"""Dataset file formats, shared by the data layers and the conversion tools."""
