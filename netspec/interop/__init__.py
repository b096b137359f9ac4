"""Other formats: Caffe prototxt and caffemodel import, ONNX export and import (``import_onnx``)."""

from netspec.interop.onnx_import import import_onnx

__all__ = ["import_onnx"]
