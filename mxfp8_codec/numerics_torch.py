"""MXFP8 numerics, torch path: the same rules as :mod:`mxfp8_codec.numerics_numpy` in torch ops.

Used for tensors on CUDA (or any non-CPU device): everything stays on the tensor's device, the
decode table is a 65 536-entry device tensor, and the encoder's bit arithmetic runs on int32 views.
CPU tensors normally go through the numpy/native path instead (zero-copy views through
:mod:`mxfp8_codec.convert`, the one numpy <-> torch bridge; faster); the tests check that all paths
give identical bits. torch is imported lazily: the codec works without it.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .constants import (
    BLOCK_SIZE,
    E4M3_BIAS,
    E4M3_MANTISSA_BITS,
    E4M3_MAX,
    E4M3_MIN_NORMAL,
    E8M0_BIAS,
    E8M0_NAN,
    F32_EXP_MASK,
    F32_MANT_175,
    SCALE_EXP_MAX,
    SCALE_EXP_MIN,
    TOP_CLAMP_SCALE_BYTE,
    TOP_CLAMP_VALUE,
    Rounding,
    ScaleRule,
    parse_rounding,
    parse_scale_rule,
)
from .convert import is_torch
from .errors import MXFP8Error
from .numerics_numpy import (
    OutKind,
    decode_table,
    decoded_shape,
    index_of,
    nonfinite_error,
    out_kind,
    scales_shape,
)
from .rng import SR_BITS, SR_SCALE, random_words_like

if TYPE_CHECKING:
    import torch

__all__ = [
    "TORCH_CHUNK_ELEMENTS",
    "bits_to_f32",
    "check_decode_input_torch",
    "decode_mxfp8_torch",
    "e4m3_bits_from_grid",
    "e4m3_decode",
    "e4m3_decode_table",
    "e4m3_encode",
    "e4m3_encode_grid",
    "e4m3_round",
    "e8m0_decode",
    "encode_mxfp8_torch",
    "f32_bits",
    "floor_log2_f32",
    "pow2_f32",
    "round_to_grid",
]

TORCH_CHUNK_ELEMENTS = 1 << 22  # 4 Mi elements per chunk: bounds the int64/float32 temporaries


def _torch_module() -> Any:
    import torch

    return torch


def encode_mxfp8_torch(
    x: torch.Tensor,
    *,
    scale_rule: str | ScaleRule = ScaleRule.RCEIL,
    name: str | None = None,
    rounding: str | Rounding = Rounding.RNE,
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 encode with torch ops on ``x``'s device (CPU or CUDA); same bits as the numpy path.

    ``rounding="stochastic"`` rounds each element with 24 bits of the counter RNG's word for its
    flat index under ``(seed, step, tensor_id)`` (see :func:`mxfp8_codec.encode_mxfp8`).

    Example:
        >>> import torch
        >>> p, s = encode_mxfp8_torch(torch.tensor([1.0, -2.0, 0.5]))
        >>> p.tolist(), s.tolist()
        ([112, 248, 104], [120])
    """
    torch = _torch_module()
    rule = parse_scale_rule(scale_rule)
    mode = parse_rounding(rounding)
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
    step_key, step = step, max(1, TORCH_CHUNK_ELEMENTS // (nb * BLOCK_SIZE))
    for r0 in range(0, x2.shape[0], step):
        rand24 = None
        if mode is Rounding.STOCHASTIC:
            rows = x2[r0 : r0 + step].shape[0]
            words = random_words_like((rows, k), seed, step_key, tensor_id, device=x.device, offset=r0 * k)
            rand24 = words >> (32 - SR_BITS)
        if not _encode_rows_torch(x2[r0 : r0 + step], rule, q[r0 : r0 + step], sc[r0 : r0 + step], rand24):
            flat_x = x2[r0 : r0 + step].reshape(-1).to(torch.float32)
            first = int(torch.nonzero(~torch.isfinite(flat_x))[0, 0]) + r0 * k
            value = float(x2.reshape(-1)[first])
            raise nonfinite_error(name, value, index_of(first, shape))
    return q.reshape(shape), sc.reshape(s_shape)


def _encode_rows_torch(
    x2: torch.Tensor, rule: ScaleRule, q_out: torch.Tensor, s_out: torch.Tensor, rand24: torch.Tensor | None = None
) -> bool:
    """Encode rows ``x2 [r, k]`` into ``q_out [r, k]`` / ``s_out [r, nb]``; False on Inf/NaN.

    ``rand24`` (``[r, k]`` integers below 2^24) selects stochastic grid rounding."""
    torch = _torch_module()
    k = x2.shape[1]
    nb = s_out.shape[1]
    xf = x2.to(torch.float32)
    if nb * BLOCK_SIZE != k:
        xf = torch.nn.functional.pad(xf, (0, nb * BLOCK_SIZE - k))
    xb = xf.reshape(-1, nb, BLOCK_SIZE)
    amax_bits = (xb.view(torch.int32) & 0x7FFFFFFF).amax(dim=2)
    if bool((amax_bits >= F32_EXP_MASK).any()):
        return False
    biased = amax_bits >> 23
    e = biased - (127 + 8)
    if rule is ScaleRule.RCEIL:
        e = e + ((amax_bits & 0x7FFFFF) > F32_MANT_175).to(torch.int32)
    e = torch.where(biased == 0, torch.full_like(e, SCALE_EXP_MIN), e)
    e = e.clamp(SCALE_EXP_MIN, SCALE_EXP_MAX)
    s = e + E8M0_BIAS
    factor = ((E8M0_BIAS - e) << 23).view(torch.float32)  # 2^-e, a normal float32
    y = xb * factor[:, :, None]
    bound = torch.where(
        s == TOP_CLAMP_SCALE_BYTE,
        torch.full_like(factor, TOP_CLAMP_VALUE),
        torch.full_like(factor, E4M3_MAX),
    )[:, :, None]
    y = torch.minimum(torch.maximum(y, -bound), bound)  # keeps -0.0
    if rand24 is not None:
        y = y.reshape(-1, nb * BLOCK_SIZE)[:, :k]
        q_out.copy_(e4m3_encode_grid(y, rand24))
        s_out.copy_(s.to(torch.uint8))
        return True
    q_out.copy_(y.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1, nb * BLOCK_SIZE)[:, :k])
    s_out.copy_(s.to(torch.uint8))
    return True


# ---------------------------------------------------------------------------------------------
# Element-level torch helpers: E4M3 grid rounding (RNE or stochastic), E4M3 / UE8M0 decode.
# The one torch spelling of these rules; nvfp4_cuda.formats imports them (NVFP4's block scale is
# E4M3 too) and mxfp8.h is their C/CUDA spelling. Every float32 operation is exact or rounds once.
# ---------------------------------------------------------------------------------------------


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """Return the IEEE bits of a float32 tensor as non-negative int64 (0 .. 2**32-1)."""
    torch = _torch_module()
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def bits_to_f32(bits: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`f32_bits` (input int64 in 0 .. 2**32-1)."""
    torch = _torch_module()
    b = torch.where(bits >= 2**31, bits - 2**32, bits)
    return b.to(torch.int32).view(torch.float32)


def pow2_f32(exponent: torch.Tensor) -> torch.Tensor:
    """Exact float32 ``2**exponent`` for integer exponents in [-149, 127] (int64 tensor in, float32 out)."""
    torch = _torch_module()
    normal = (exponent + 127).clamp(min=1) << 23
    sub = torch.ones_like(exponent) << (exponent + 149).clamp(min=0, max=22)
    return bits_to_f32(torch.where(exponent >= -126, normal, sub))


def floor_log2_f32(a: torch.Tensor) -> torch.Tensor:
    """``floor(log2(a))`` of positive normal float32 values from the exponent field (int64 out).

    Zero and float32 subnormals give -127; callers only use the result where it matters (a >= 2**-6).
    """
    return ((f32_bits(a) >> 23) & 0xFF) - 127


def round_to_grid(t: torch.Tensor, rand24: torch.Tensor | None) -> torch.Tensor:
    """Round non-negative grid coordinates ``t = a / u`` to integers: RNE, or stochastic with ``rand24``.

    Args:
        t: float32, non-negative, exact grid coordinate.
        rand24: None for round-to-nearest-even, else int64 random integers in [0, 2**24).
    """
    torch = _torch_module()
    if rand24 is None:
        return torch.round(t)  # half to even
    fl = torch.floor(t)
    frac = (t - fl) * SR_SCALE  # exact
    return fl + (rand24.to(torch.float32) < frac).to(torch.float32)


def e4m3_round(a: torch.Tensor, rand24: torch.Tensor | None = None) -> torch.Tensor:
    """Round non-negative float32 magnitudes onto the E4M3 grid (RNE or stochastic), saturating at 448.

    Returns float32 values that are exactly representable in E4M3.
    """
    torch = _torch_module()
    e = floor_log2_f32(a)
    normal = a >= E4M3_MIN_NORMAL
    # spacing exponent: e - 3 for normal values, -9 for subnormals; t = a * 2**-(spacing exponent)
    ue = torch.where(normal, e - E4M3_MANTISSA_BITS, torch.full_like(e, -9))
    t = a * pow2_f32(-ue)
    n = round_to_grid(t, rand24)
    return (n * pow2_f32(ue)).clamp(max=E4M3_MAX)


def e4m3_bits_from_grid(q: torch.Tensor) -> torch.Tensor:
    """E4M3 bit pattern (int64, no sign) of non-negative float32 values already on the E4M3 grid."""
    torch = _torch_module()
    bits = f32_bits(q)
    e = ((bits >> 23) & 0xFF) - 127
    m3 = (bits >> 20) & 0x7
    normal_code = ((e + E4M3_BIAS) << 3) | m3
    sub_code = (q * 512.0).to(torch.int64)  # q = n * 2**-9, n in 0..7
    return torch.where(q >= E4M3_MIN_NORMAL, normal_code, sub_code)


def e4m3_encode(v: torch.Tensor, rand24: torch.Tensor | None = None) -> torch.Tensor:
    """Encode float32 values to E4M3 bytes (uint8), RNE or stochastic, saturating to +-448, sign kept.

    RNE uses torch's float8_e4m3fn cast after clamping to +-448 (tested equal to the grid path
    :func:`e4m3_encode_grid`, which the CUDA kernels implement).
    """
    torch = _torch_module()
    if rand24 is None:
        return v.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return e4m3_encode_grid(v, rand24)


def e4m3_encode_grid(v: torch.Tensor, rand24: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`e4m3_encode` written as grid rounding (device-agnostic; the CUDA kernels' algorithm)."""
    torch = _torch_module()
    q = e4m3_round(v.abs(), rand24)
    sign = torch.signbit(v).to(torch.int64) << 7
    return (e4m3_bits_from_grid(q) | sign).to(torch.uint8)


_E4M3_TABLES: dict[tuple[str, str], Any] = {}


def e4m3_decode_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 values of all 256 E4M3 bytes (0x7F and 0xFF are NaN)."""
    torch = _torch_module()
    dev = torch.device(device)
    key = (str(dev), "e4m3")
    if key not in _E4M3_TABLES:
        t = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
        _E4M3_TABLES[key] = t.to(dev)
    return _E4M3_TABLES[key]


def e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    """Decode E4M3 bytes (uint8) to float32 through a 256-entry table."""
    torch = _torch_module()
    return e4m3_decode_table(b.device)[b.to(torch.int64)]


def e8m0_decode(s: torch.Tensor) -> torch.Tensor:
    """Decode UE8M0 scale bytes to float32 ``2**(s - 127)`` (byte 0 is 2**-127, byte 255 is NaN)."""
    torch = _torch_module()
    e = s.to(torch.int64) - E8M0_BIAS
    v = pow2_f32(e.clamp(max=127))
    return torch.where(s.to(torch.int64) == E8M0_NAN, torch.full_like(v, float("nan")), v)


@functools.cache
def _torch_table(kind: OutKind, device: str) -> torch.Tensor:
    torch = _torch_module()
    table = decode_table(kind)
    signed = table.view(np.int32 if kind == "f32" else np.int16).copy()
    return torch.from_numpy(signed).to(device)


def check_decode_input_torch(p: torch.Tensor, s: torch.Tensor, name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload, scales) as uint8 tensors (float8 views accepted) of matching shapes on one device,
    else MXFP8Error: the torch twin of :func:`~mxfp8_codec.numerics_numpy.check_decode_input_numpy`."""
    torch = _torch_module()
    who = f"tensor {name!r}" if name else "tensor"
    if not is_torch(p) or not is_torch(s):
        raise MXFP8Error(f"{who}: payload and scales must both be torch tensors (or both numpy)")
    if p.dtype == torch.float8_e4m3fn:
        p = p.view(torch.uint8)
    if s.dtype == torch.float8_e8m0fnu:
        s = s.view(torch.uint8)
    if p.dtype != torch.uint8 or s.dtype != torch.uint8:
        raise MXFP8Error(
            f"{who}: payload and scales must be uint8 (or float8_e4m3fn / float8_e8m0fnu), got {p.dtype} and {s.dtype}"
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
    kind = out_kind(torch.float32 if dtype is None else dtype)
    p, s = check_decode_input_torch(payload, scales, name)
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
