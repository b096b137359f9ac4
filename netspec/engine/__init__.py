"""Running nets: the backend (NumPy/CuPy), blobs, the layer contract, registries, fillers and the Net."""
