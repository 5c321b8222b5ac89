"""MXFP8 numerics, torch path: the same rules as :mod:`mxfp8_codec.numerics_numpy` in torch ops.

Used for tensors on CUDA (or any non-CPU device): everything stays on the tensor's device, the
decode table is a 65 536-entry device tensor, and the encoder's bit arithmetic runs on int32 views.
CPU tensors normally go through the numpy/native path instead (zero-copy views, faster); the tests
check that all paths give identical bits. Also holds the small torch <-> numpy bridges the
dispatcher in :mod:`mxfp8_codec.numerics` uses. torch is imported lazily: the codec works without
it.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from .constants import (
    BLOCK_SIZE,
    E4M3_MAX,
    E8M0_BIAS,
    SCALE_EXP_MAX,
    SCALE_EXP_MIN,
    TOP_CLAMP_SCALE_BYTE,
    ScaleRule,
)
from .errors import MXFP8Error
from .numerics_numpy import (
    _F32_EXP_MASK,
    _F32_MANT_175,
    _TOP_CLAMP_VALUE,
    OutKind,
    _index_of,
    _is_torch,
    _nonfinite_error,
    _out_kind,
    _rule,
    decode_table,
    decoded_shape,
    scales_shape,
)

if TYPE_CHECKING:
    import torch

__all__ = ["TORCH_CHUNK_ELEMENTS", "decode_mxfp8_torch", "encode_mxfp8_torch"]

TORCH_CHUNK_ELEMENTS = 1 << 22  # 4 Mi elements per chunk: bounds the int64/float32 temporaries


def _torch_module() -> Any:
    import torch

    return torch


def encode_mxfp8_torch(
    x: torch.Tensor,
    *,
    scale_rule: str | ScaleRule = ScaleRule.RCEIL,
    name: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 encode with torch ops on ``x``'s device (CPU or CUDA); same bits as the numpy path.

    Example:
        >>> import torch
        >>> p, s = encode_mxfp8_torch(torch.tensor([1.0, -2.0, 0.5]))
        >>> p.tolist(), s.tolist()
        ([112, 248, 104], [120])
    """
    torch = _torch_module()
    rule = _rule(scale_rule)
    who = f"tensor {name!r}" if name else "tensor"
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise MXFP8Error(f"{who}: cannot encode dtype {x.dtype}; expected float32, bfloat16 or float16")
    if x.dim() < 1:
        raise MXFP8Error(f"{who}: MXFP8 tensors must have rank >= 1, got a 0-d tensor")
    shape = tuple(x.shape)
    s_shape = scales_shape(shape)
    if x.numel() == 0 or math.prod(s_shape) == 0:
        return (
            torch.empty(shape, dtype=torch.uint8, device=x.device),
            torch.empty(s_shape, dtype=torch.uint8, device=x.device),
        )
    k, nb = shape[-1], s_shape[-1]
    x2 = x.detach().reshape(-1, k)
    q = torch.empty((x2.shape[0], k), dtype=torch.uint8, device=x.device)
    sc = torch.empty((x2.shape[0], nb), dtype=torch.uint8, device=x.device)
    step = max(1, TORCH_CHUNK_ELEMENTS // (nb * BLOCK_SIZE))
    for r0 in range(0, x2.shape[0], step):
        if not _encode_rows_torch(x2[r0 : r0 + step], rule, q[r0 : r0 + step], sc[r0 : r0 + step]):
            flat_x = x2[r0 : r0 + step].reshape(-1).to(torch.float32)
            first = int(torch.nonzero(~torch.isfinite(flat_x))[0, 0]) + r0 * k
            value = float(x2.reshape(-1)[first])
            raise _nonfinite_error(name, value, _index_of(first, shape))
    return q.reshape(shape), sc.reshape(s_shape)


def _encode_rows_torch(x2: torch.Tensor, rule: ScaleRule, q_out: torch.Tensor, s_out: torch.Tensor) -> bool:
    """Encode rows ``x2 [r, k]`` into ``q_out [r, k]`` / ``s_out [r, nb]``; False on Inf/NaN."""
    torch = _torch_module()
    k = x2.shape[1]
    nb = s_out.shape[1]
    xf = x2.to(torch.float32)
    if nb * BLOCK_SIZE != k:
        xf = torch.nn.functional.pad(xf, (0, nb * BLOCK_SIZE - k))
    xb = xf.reshape(-1, nb, BLOCK_SIZE)
    amax_bits = (xb.view(torch.int32) & 0x7FFFFFFF).amax(dim=2)
    if bool((amax_bits >= _F32_EXP_MASK).any()):
        return False
    biased = amax_bits >> 23
    e = biased - (127 + 8)
    if rule is ScaleRule.RCEIL:
        e = e + ((amax_bits & 0x7FFFFF) > _F32_MANT_175).to(torch.int32)
    e = torch.where(biased == 0, torch.full_like(e, SCALE_EXP_MIN), e)
    e = e.clamp(SCALE_EXP_MIN, SCALE_EXP_MAX)
    s = e + E8M0_BIAS
    factor = ((E8M0_BIAS - e) << 23).view(torch.float32)  # 2^-e, a normal float32
    y = xb * factor[:, :, None]
    bound = torch.where(
        s == TOP_CLAMP_SCALE_BYTE,
        torch.full_like(factor, _TOP_CLAMP_VALUE),
        torch.full_like(factor, E4M3_MAX),
    )[:, :, None]
    y = torch.minimum(torch.maximum(y, -bound), bound)  # keeps -0.0
    q_out.copy_(y.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1, nb * BLOCK_SIZE)[:, :k])
    s_out.copy_(s.to(torch.uint8))
    return True


@functools.cache
def _torch_table(kind: OutKind, device: str) -> torch.Tensor:
    torch = _torch_module()
    table = decode_table(kind)
    signed = table.view(np.int32 if kind == "f32" else np.int16).copy()
    return torch.from_numpy(signed).to(device)


def _check_decode_input_torch(
    p: torch.Tensor, s: torch.Tensor, name: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    torch = _torch_module()
    who = f"tensor {name!r}" if name else "tensor"
    if not _is_torch(p) or not _is_torch(s):
        raise MXFP8Error(f"{who}: payload and scales must both be torch tensors (or both numpy)")
    if p.dtype == torch.float8_e4m3fn:
        p = p.view(torch.uint8)
    if s.dtype == torch.float8_e8m0fnu:
        s = s.view(torch.uint8)
    if p.dtype != torch.uint8 or s.dtype != torch.uint8:
        raise MXFP8Error(
            f"{who}: payload and scales must be uint8 (or float8_e4m3fn / float8_e8m0fnu), "
            f"got {p.dtype} and {s.dtype}"
        )
    if p.dim() < 1:
        raise MXFP8Error(f"{who}: payload must have rank >= 1, got a 0-d tensor")
    if tuple(s.shape) != scales_shape(tuple(p.shape)):
        raise MXFP8Error(
            f"{who}: scales shape {tuple(s.shape)} does not match payload shape "
            f"{tuple(p.shape)}; expected {scales_shape(tuple(p.shape))} (one per 32 along the last axis)"
        )
    if p.device != s.device:
        raise MXFP8Error(f"{who}: payload on {p.device} but scales on {s.device}")
    return p, s


def decode_mxfp8_torch(
    payload: torch.Tensor,
    scales: torch.Tensor,
    *,
    dtype: Any = None,
    name: str | None = None,
    transpose: bool = False,
) -> torch.Tensor:
    """MXFP8 decode with torch ops on the payload's device; same bits as the numpy path.

    ``transpose=True`` (2-D ``[R, C]`` payload only) returns the contiguous ``[C, R]`` transpose:
    decode, then one ``.t().contiguous()`` copy on the device.

    Example:
        >>> import torch
        >>> decode_mxfp8_torch(torch.tensor([112, 248], dtype=torch.uint8),
        ...                    torch.tensor([120], dtype=torch.uint8)).tolist()
        [1.0, -2.0]
    """
    torch = _torch_module()
    kind = _out_kind(torch.float32 if dtype is None else dtype)
    p, s = _check_decode_input_torch(payload, scales, name)
    shape = tuple(p.shape)
    out_dtype = torch.float32 if kind == "f32" else torch.bfloat16
    if transpose:
        decoded_shape(shape, True, name)  # 2-D check
        return decode_mxfp8_torch(p, s, dtype=out_dtype, name=name).t().contiguous()
    if p.numel() == 0:
        return torch.empty(shape, dtype=out_dtype, device=p.device)
    k, nb = shape[-1], s.shape[-1]
    table = _torch_table(kind, str(p.device))
    p2, s2 = p.reshape(-1, k), s.reshape(-1, nb)
    out = torch.empty((p2.shape[0], k), dtype=table.dtype, device=p.device)
    cols = torch.arange(k, device=p.device) // BLOCK_SIZE
    step = max(1, TORCH_CHUNK_ELEMENTS // k)
    for r0 in range(0, p2.shape[0], step):
        idx = (s2[r0 : r0 + step].to(torch.int64)[:, cols] << 8) | p2[r0 : r0 + step].to(torch.int64)
        out[r0 : r0 + step] = table[idx]
    return out.view(out_dtype).reshape(shape)


def _torch_cpu_to_numpy(x: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor (bfloat16 as ml_dtypes.bfloat16, float8 as uint8)."""
    torch = _torch_module()
    t = x.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _torch_out_view(out: torch.Tensor, name: str | None) -> np.ndarray:
    """numpy view of a CPU torch ``out`` tensor (must be contiguous, float32 or bfloat16)."""
    torch = _torch_module()
    if out.dtype not in (torch.float32, torch.bfloat16) or not out.is_contiguous():
        raise MXFP8Error(
            f"tensor {name!r}: out must be a contiguous float32 or bfloat16 tensor, "
            f"got {out.dtype} (contiguous={out.is_contiguous()})"
        )
    if out.requires_grad:
        raise MXFP8Error(f"tensor {name!r}: out must not require grad (decode into .data)")
    return _torch_cpu_to_numpy(out)


def _copy_into(out: torch.Tensor, result: torch.Tensor, name: str | None) -> torch.Tensor:
    if out.dtype != result.dtype or tuple(out.shape) != tuple(result.shape):
        raise MXFP8Error(
            f"tensor {name!r}: out must be {result.dtype} of shape {tuple(result.shape)}, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    return out.copy_(result)


def _numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    torch = _torch_module()
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _torch_encode_out(out: Any, name: str | None) -> tuple[Any, ...]:
    """Check a torch ``out`` pair's types (shapes are checked by the encoder); () when None."""
    if out is None:
        return ()
    torch = _torch_module()
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(_is_torch(o) for o in out):
        raise MXFP8Error(f"tensor {name!r}: out must be a (payload, scales) pair of torch tensors")
    if any(o.dtype != torch.uint8 or not o.is_contiguous() for o in out):
        raise MXFP8Error(f"tensor {name!r}: out tensors must be contiguous uint8")
    return tuple(out)


def _torch_float_dtypes() -> tuple[Any, ...]:
    torch = _torch_module()
    return (torch.float32, torch.bfloat16, torch.float16)
