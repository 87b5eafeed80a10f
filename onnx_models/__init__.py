"""ONNX model definitions, exported model files and pipeline specs."""
