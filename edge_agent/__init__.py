"""Edge agents: sensing task servers for Raspberry-Pi clusters (no numpy, torch or onnxruntime)."""
