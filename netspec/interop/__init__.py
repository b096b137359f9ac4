"""Other formats: Caffe prototxt and caffemodel import, ONNX export."""
