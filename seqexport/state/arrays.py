"""State arrays: numpy on the CPU, onnxruntime OrtValues where the state stays on a device."""

import numpy as np
import onnxruntime as ort

from seqexport.errors import InputError

NP_DTYPES = {"int64": np.int64, "float32": np.float32, "float16": np.float16}
ORT_TYPES = {"tensor(int64)": "int64", "tensor(float)": "float32", "tensor(float16)": "float16"}


def shape_and_dtype(name: str, a) -> tuple[tuple[int, ...], str]:
    """Shape and dtype name of a numpy array or an OrtValue (state kept on the device)."""
    if isinstance(a, ort.OrtValue):
        return tuple(a.shape()), ORT_TYPES.get(a.data_type(), a.data_type())
    if not isinstance(a, np.ndarray):
        raise InputError(f"{name}: expected a numpy array, got {type(a).__name__}")
    return a.shape, a.dtype.name


def to_numpy(a) -> np.ndarray:
    return a.numpy() if isinstance(a, ort.OrtValue) else a
