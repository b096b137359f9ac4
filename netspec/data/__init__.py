"""Datasets and what feeds the data layers: record formats, LMDB/HDF5 files, images, transforms, batches."""
