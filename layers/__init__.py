"""Built-in layer types, one module per type or tight family, registered on import.

This package is installed as ``netspec.layers``; importing it under any other
name (``import layers`` from the repository root) would register every type a
second time, so it is refused.
"""

if not __name__.startswith("netspec."):
    raise ImportError(f"import this package as netspec.layers, not as '{__name__}'")

from netspec.layers import (  # noqa: F401 - imported to register the layer types
    accuracy,
    activations,
    argmax,
    arithmetic,
    attention,
    batch_norm,
    concat_slice,
    convolution,
    crop,
    data,
    deconvolution,
    dropout,
    eltwise,
    embed,
    hdf5_data,
    hdf5_output,
    image_data,
    inner_product,
    layer_norm,
    losses,
    lrn,
    matmul,
    memory_data,
    mvn,
    pad,
    parameter,
    pooling,
    python_layer,
    record_data,
    recurrent,
    reduction,
    reshaping,
    resize,
    scale_bias,
    selection,
    softmax,
    spp,
)
