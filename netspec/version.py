"""The netspec version: written into weights, solver states and model cards, and read by packaging."""

__version__ = "0.1.0"
