"""Published ONNX models: where their files are kept (`store`) and what their inputs and outputs are (`signature`)."""
