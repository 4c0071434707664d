"""Graph wrappers that turn eager models into ONNX graphs; imported lazily by the CLI."""

DEFAULT_OPSET = 18
