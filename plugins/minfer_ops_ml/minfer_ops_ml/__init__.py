"""minfer-ops-ml: kernels for the ai.onnx.ml operators that take and return tensors."""
