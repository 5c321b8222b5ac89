"""numpy <-> torch at the edges of the codec, with the float8/bfloat16 dtypes both sides spell differently.

The codec's file logic is numpy (plus ml_dtypes for ``bfloat16``/``float8_*``); torch is optional and
imported only when a torch tensor is passed in or requested. numpy has no native bfloat16 or float8,
and ``torch.from_numpy`` does not understand ml_dtypes arrays, so tensors cross the boundary as
same-width integer views (``bfloat16`` <-> ``int16``, ``float8_*`` <-> ``uint8``): zero-copy and
bit-exact in both directions.
"""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np

from mxfp8_codec.errors import MXFP8Error

F8_NUMPY_DTYPES = frozenset(
    {np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2), np.dtype(ml_dtypes.float8_e8m0fnu)}
)  # float8 dtypes: raw encoded data, never converted as floats
BF16 = np.dtype(ml_dtypes.bfloat16)  # the numpy (ml_dtypes) bfloat16 dtype
TARGET_FLOAT_DTYPES = (np.dtype(np.float32), BF16, np.dtype(np.float16), np.dtype(np.float64))  # decode targets


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch: no torch loaded, no tensor)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def cpu_tensor_view(t: Any) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor, strides kept (writes go to the tensor).

    bfloat16 and float8 tensors are viewed through their same-width integer types and come out as
    ml_dtypes' ``bfloat16`` / ``float8_*`` arrays; every other dtype is ``Tensor.numpy()``.
    """
    import torch

    t = t.detach()
    views = {
        torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
        torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
        torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
        torch.float8_e8m0fnu: (torch.uint8, ml_dtypes.float8_e8m0fnu),
    }
    if t.dtype in views:
        carrier, np_dtype = views[t.dtype]
        return t.view(carrier).numpy().view(np_dtype)
    return t.numpy()


def torch_to_numpy(t: Any) -> np.ndarray:
    """A C-contiguous numpy array of a tensor on any device (a copy unless it is CPU and contiguous)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return cpu_tensor_view(t.contiguous())


def numpy_to_torch(a: np.ndarray) -> Any:
    """A CPU tensor sharing ``a``'s memory (a C copy first if ``a`` is not C-contiguous); ml_dtypes'
    ``bfloat16`` / ``float8_*`` arrays become the torch dtypes of the same name. A 0-d array stays 0-d."""
    import torch

    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)  # (which makes a 0-d array 1-d: never called on one, always contiguous)
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    f8 = {
        np.dtype(ml_dtypes.float8_e4m3fn): torch.float8_e4m3fn,
        np.dtype(ml_dtypes.float8_e5m2): torch.float8_e5m2,
        np.dtype(ml_dtypes.float8_e8m0fnu): torch.float8_e8m0fnu,
    }
    if a.dtype in f8:
        return torch.from_numpy(a.view(np.uint8)).view(f8[a.dtype])
    return torch.from_numpy(a)


def as_numpy(x: Any, name: str) -> np.ndarray:
    if is_torch(x):
        return torch_to_numpy(x)
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            x = x.astype(x.dtype.newbyteorder("<"))
        return x
    raise MXFP8Error(f"tensor {name!r}: expected a numpy array, torch tensor or MXFP8Tensor, got {type(x).__name__}")


def float_target_dtype(dtype: Any) -> np.dtype:
    """Map np / ml_dtypes / torch float dtypes (or their names) to a numpy dtype."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        table = {
            torch.float32: np.dtype(np.float32),
            torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
            torch.float16: np.dtype(np.float16),
            torch.float64: np.dtype(np.float64),
        }
        if dtype not in table:
            raise MXFP8Error(f"unsupported target dtype {dtype} (use float32, bfloat16, float16 or float64)")
        return table[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise MXFP8Error(f"unsupported target dtype {dtype!r}") from None
    if dt not in TARGET_FLOAT_DTYPES:
        raise MXFP8Error(f"unsupported target dtype {dt} (use float32, bfloat16, float16 or float64)")
    return dt


def as_u8(a: Any, name: str, what: str) -> np.ndarray:
    arr = as_numpy(a, name)
    if arr.dtype in F8_NUMPY_DTYPES:
        arr = arr.view(np.uint8)
    if arr.dtype != np.uint8:
        raise MXFP8Error(f"tensor {name!r}: MXFP8Tensor {what} must be uint8 bytes, got {arr.dtype}")
    return arr


def numpy_dtype_of(value: Any) -> np.dtype:
    if is_torch(value):
        import torch

        special = {
            torch.bfloat16: ml_dtypes.bfloat16,
            torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
            torch.float8_e5m2: ml_dtypes.float8_e5m2,
            torch.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
        }
        if value.dtype in special:
            return np.dtype(special[value.dtype])
        return torch.empty((), dtype=value.dtype).numpy().dtype
    return np.dtype(value.dtype)


def torch_dtype_of(dt: np.dtype) -> Any:
    """The torch dtype of the numpy (ml_dtypes) dtype ``dt``: the inverse of :func:`numpy_dtype_of`."""
    return numpy_to_torch(np.empty(0, dt)).dtype


def is_float_dtype(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16)


def torch_encodable_dtypes() -> tuple[Any, ...]:
    """The torch dtypes the MXFP8 encoders take: float32, bfloat16, float16."""
    import torch

    return (torch.float32, torch.bfloat16, torch.float16)
