"""NeuralActuator model: NAD loader, feature pipeline, differentiable dynamics, training/evaluation/export, and the ONNX Runtime engine and node."""
