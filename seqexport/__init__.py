"""seqexport: export PyTorch sequence models to ONNX, prove parity, decode without torch.

This package root imports nothing heavy, so that `seqexport.runtime` stays
usable in an application that has numpy and onnxruntime but no torch.
"""

__version__ = "0.1.0"
