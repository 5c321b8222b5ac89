"""MXFP8 numerics: encode float arrays to (E4M3 payload, UE8M0 scales) and decode them back.

Pure functions, arrays in and arrays out (numpy in -> numpy out, torch in -> torch out on the same
device); no files, no environment (the native-kernel switch lives in :mod:`mxfp8_codec._native`).

Encoding one block of 32 values (the last axis is cut into blocks; the last block may be partial
and its amax covers only the real elements):

1. ``amax = max |x_i|`` read from the float32 bit pattern ``amax = m * 2^E`` (m in [1, 2)).
   Integer arithmetic only -- never ``log2`` in floating point and never a float->e8m0 cast
   (torch rounds those half-up, ml_dtypes maps 0 to NaN).
2. Shared exponent: ``RCEIL`` (default) ``e = E - 8 + (m > 1.75)`` -- the smallest power of two
   with ``amax / 2^e <= 448`` -- or ``FLOOR`` ``e = E - 8``; clamped to [-127, 127]; an all-zero
   block (or a block of float32 subnormals, whose E is below -126) gets ``e = -127``. Scale byte
   ``s = e + 127``.
3. Elements: ``y = x * 2^-e`` (exact in float32: a power-of-two multiply that can only lose bits
   in float32 subnormals, which are far below E4M3's 2^-10 rounding threshold), then round to
   nearest even into E4M3 and **saturate** to +-448 (ml_dtypes' cast would give NaN above 464, so
   we clip first; torch >= 2.12 saturates itself). -0 stays 0x80.

Policy choices (the OCP spec leaves them open; tested in tests/mxfp8_codec/test_numerics*.py):

* **Tiny blocks** (amax < 2^-118): the clamp e = -127 still lets every element be scaled exactly by
  2^127, so they round correctly instead of flushing to zero (TE / torchao RCEIL) or being off by a
  factor 2 (torchao FLOOR, pytorch/ao#1104).
* **Top of the range**: with RCEIL an amax >= 1.9375 * 2^127 (the top 8 bfloat16 magnitudes) would
  give e = 120 (byte 247) and an element that rounds to 2^8, decoding to 2^128 = inf. A finite weight
  must never decode to inf, so in blocks with byte 247 elements saturate at 240 (code 0x77),
  decoding to 1.875 * 2^127 (error <= 5.9 %). This is the only place our bits differ from
  torchao/TE RCEIL.
* **Non-finite input** (NaN, +-Inf) raises :class:`~mxfp8_codec.errors.MXFP8Error` naming the
  tensor and the index: a weight with NaN is a training failure, not something to archive.

Decoding: ``value = e4m3(q) * 2^(s - 127)``; scale byte 0xFF makes the whole block NaN; codes with
``q & 0x7F == 0x7F`` are NaN; NaNs come out as the canonical quiet NaN (0x7FC0 / 0x7FC00000). The
product is exact in float32 except overflow to +-inf (scale bytes 247..254 with large codes);
bfloat16 output is that exact value rounded once to nearest even (only scale bytes 0..2 can be
inexact, in bfloat16's subnormal range).

Three implementations, identical bits (tests/mxfp8_codec/test_numerics*.py prove it):

* pure numpy (``*_numpy``, the fallback and oracle): decode gathers from an exact 65 536-entry
  table indexed by ``(s << 8) | q`` (built once from float64, which holds every product exactly),
  encode clips and casts with ml_dtypes; both in L2-sized chunks (256 Ki elements);
* pure torch (``*_torch``): the same rules in torch ops, used for tensors on CUDA/other devices;
* native C (:mod:`mxfp8_codec._native`, used for numpy arrays and CPU tensors when a C compiler
  exists): bit arithmetic on whole blocks -- a normal code decodes to bfloat16 bits
  ``(mag << 4) + ((s - 7) << 7)``, and encoding folds the 2^-e scaling into the exponent before
  rounding on the bit pattern -- with the table / exact float path for the rare blocks outside
  that fast path (E4M3 subnormals, extreme scales, partial blocks). About memory speed.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Literal, Union

import ml_dtypes
import numpy as np

from .constants import (
    BF16_CANONICAL_NAN,
    BLOCK_SIZE,
    E4M3_MAX,
    E4M3_NAN_MAG,
    E8M0_BIAS,
    E8M0_NAN,
    F32_CANONICAL_NAN,
    SCALE_EXP_MAX,
    SCALE_EXP_MIN,
    TOP_CLAMP_SCALE_BYTE,
    ScaleRule,
)
from .errors import MXFP8Error

if TYPE_CHECKING:  # torch is optional for the codec: imported lazily where needed
    import torch

__all__ = [
    "decode_mxfp8",
    "decode_mxfp8_numpy",
    "decode_mxfp8_torch",
    "decode_table",
    "e4m3_values",
    "encode_mxfp8",
    "encode_mxfp8_numpy",
    "encode_mxfp8_torch",
    "scale_exponent",
    "scales_shape",
]

ArrayLike = Union[np.ndarray, "torch.Tensor"]
OutKind = Literal["f32", "bf16"]

CHUNK_ELEMENTS = 1 << 18  # 262 144 elements per numpy chunk: ~1 MiB float32 = one core's L2
_TOP_CLAMP_VALUE = 240.0  # largest E4M3 magnitude allowed in a block with scale byte 247 (0x77)
_F32_EXP_MASK = 0x7F800000  # float32 exponent field; |bits| >= this <=> Inf or NaN
_F32_MANT_175 = 0x600000  # float32 mantissa field of 1.75 (0.75 * 2^23)


# ---------------------------------------------------------------------------------------------
# Small shared helpers
# ---------------------------------------------------------------------------------------------
def scales_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the scale array for a payload of ``shape``: ``(*shape[:-1], ceil(shape[-1] / 32))``.

    Example:
        >>> scales_shape((4096, 1000))
        (4096, 32)
    """
    if len(shape) < 1:
        raise MXFP8Error("MXFP8 tensors must have rank >= 1 (blocks run along the last axis)")
    return (*shape[:-1], -(-shape[-1] // BLOCK_SIZE))


def _rule(scale_rule: str | ScaleRule) -> ScaleRule:
    try:
        return ScaleRule(scale_rule)
    except ValueError:
        raise MXFP8Error(
            f"unknown scale_rule {scale_rule!r}; expected one of {[r.value for r in ScaleRule]}"
        ) from None


def scale_exponent(amax: float, scale_rule: str | ScaleRule = ScaleRule.RCEIL) -> int:
    """The shared exponent ``e`` (scale byte ``e + 127``) the encoder picks for a block maximum.

    Args:
        amax: the block's largest magnitude, a finite float (rounded to float32 first, as the
            encoder sees it).
        scale_rule: ``"rceil"`` (default) or ``"floor"``.

    Returns:
        ``e`` in [-127, 127].

    Example:
        >>> scale_exponent(448.0), scale_exponent(449.0), scale_exponent(1.9, "floor")
        (0, 1, -8)
    """
    bits = int(np.array([abs(amax)], np.float32).view(np.uint32)[0])
    if bits >= _F32_EXP_MASK:
        raise MXFP8Error(f"scale_exponent: amax must be finite, got {amax!r}")
    e = _exponents_from_amax_bits(np.array([bits], np.uint32), _rule(scale_rule))
    return int(e[0])


def _exponents_from_amax_bits(amax_bits: np.ndarray, rule: ScaleRule) -> np.ndarray:
    """Shared exponents (int32) from float32 bit patterns of |amax| (finite, sign bit clear)."""
    biased = (amax_bits >> 23).astype(np.int32)
    e = biased - (127 + 8)
    if rule is ScaleRule.RCEIL:
        e += (amax_bits & 0x7FFFFF) > _F32_MANT_175
    e[biased == 0] = SCALE_EXP_MIN  # zero or float32-subnormal amax: far below 2^-118
    np.clip(e, SCALE_EXP_MIN, SCALE_EXP_MAX, out=e)
    return e


@functools.cache
def e4m3_values() -> np.ndarray:
    """float64 value of every E4M3 code 0..255 (NaN for 0x7F and 0xFF), computed from the bits.

    Example:
        >>> v = e4m3_values(); float(v[0x7E]), float(v[0x01]), float(v[0x80])
        (448.0, 0.001953125, -0.0)
    """
    out = np.empty(256, np.float64)
    for code in range(256):
        mag = code & 0x7F
        exp, man = mag >> 3, mag & 7
        if mag == E4M3_NAN_MAG:
            val = math.nan
        elif exp == 0:
            val = math.ldexp(man, -9)  # subnormal: man * 2^-9
        else:
            val = math.ldexp(8 + man, exp - 7 - 3)  # (1 + man/8) * 2^(exp-7)
        out[code] = -val if code & 0x80 else val
    out.setflags(write=False)
    return out


def _f32_bits_to_bf16_rne(bits: np.ndarray) -> np.ndarray:
    """Round float32 bit patterns (uint32) to bfloat16 bit patterns (uint16), nearest-even.

    Exact for subnormals (bfloat16 is truncated float32); NaN becomes the canonical 0x7FC0.
    """
    bits = bits.astype(np.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    nan = (bits & 0x7FFFFFFF) > _F32_EXP_MASK
    return np.where(nan, BF16_CANONICAL_NAN, rounded).astype(np.uint16)


@functools.cache
def decode_table(kind: OutKind) -> np.ndarray:
    """The exact decode lookup table: entry ``(s << 8) | q`` is the decoded bit pattern.

    Args:
        kind: ``"f32"`` (uint32 float32 bits) or ``"bf16"`` (uint16 bfloat16 bits).

    Returns:
        A read-only array of 65 536 bit patterns: ``e4m3(q) * 2^(s - 127)`` rounded once to the
        output format (float64 holds every product exactly), canonical NaN for ``s == 0xFF`` or a
        NaN code.

    Example:
        >>> hex(int(decode_table("bf16")[(127 << 8) | 0x38]))  # 1.0 * 2^0
        '0x3f80'
    """
    if kind not in ("f32", "bf16"):
        raise MXFP8Error(f"decode_table: kind must be 'f32' or 'bf16', got {kind!r}")
    exact = e4m3_values()[None, :] * np.ldexp(1.0, np.arange(256) - E8M0_BIAS)[:, None]
    exact[E8M0_NAN, :] = np.nan
    with np.errstate(over="ignore"):
        f32 = exact.astype(np.float32)  # exact, or +-inf on overflow (RNE of the exact value)
    f32_bits = f32.view(np.uint32)
    f32_bits = np.where(np.isnan(f32), np.uint32(F32_CANONICAL_NAN), f32_bits).astype(np.uint32)
    table = f32_bits if kind == "f32" else _f32_bits_to_bf16_rne(f32_bits)
    table = np.ascontiguousarray(table.reshape(-1))
    table.setflags(write=False)
    return table


def _out_kind(dtype: Any) -> OutKind:
    """Map a requested output dtype (numpy, ml_dtypes, torch or a string) to 'f32' / 'bf16'."""
    name = str(dtype).lower().removeprefix("torch.").removeprefix("<class '").rstrip("'>")
    name = name.rsplit(".", 1)[-1]
    if name in ("float32", "f32", "fp32", "float"):
        return "f32"
    if name in ("bfloat16", "bf16"):
        return "bf16"
    raise MXFP8Error(
        f"unsupported decode dtype {dtype!r}; use np.float32, ml_dtypes.bfloat16, "
        "torch.float32 or torch.bfloat16"
    )


def _index_of(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def _nonfinite_error(name: str | None, value: float, index: tuple[int, ...]) -> MXFP8Error:
    who = f"tensor {name!r}" if name else "tensor"
    return MXFP8Error(
        f"{who}: cannot encode non-finite value {value!r} at index {index} "
        "(a weight with NaN/Inf is a training failure, not something to archive)"
    )


def _is_torch(x: object) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "device") and hasattr(x, "dtype")


# ---------------------------------------------------------------------------------------------
# numpy path
# ---------------------------------------------------------------------------------------------
_ENCODE_NP_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


def _as_2d(a: np.ndarray) -> np.ndarray:
    k = a.shape[-1]
    rows = math.prod(a.shape[:-1])
    return a.reshape(rows, k)


def _encode_rows_numpy(
    x: np.ndarray, rule: ScaleRule, q_out: np.ndarray, s_out: np.ndarray
) -> int:
    """Encode float32 rows ``x [r, nb*32]`` into ``q_out`` / ``s_out``; -1, or first bad block."""
    r, kp = x.shape
    xb = x.reshape(r, kp // BLOCK_SIZE, BLOCK_SIZE)
    mag_bits = xb.view(np.uint32) & np.uint32(0x7FFFFFFF)
    amax_bits = mag_bits.max(axis=2)
    bad = amax_bits >= _F32_EXP_MASK
    if bad.any():
        return int(np.flatnonzero(bad)[0])
    e = _exponents_from_amax_bits(amax_bits, rule)
    s = (e + E8M0_BIAS).astype(np.uint8)
    factor = ((E8M0_BIAS - e).astype(np.uint32) << 23).view(np.float32)  # 2^-e, normal float32
    y = xb * factor[:, :, None]
    bound = np.where(s == TOP_CLAMP_SCALE_BYTE, _TOP_CLAMP_VALUE, E4M3_MAX).astype(np.float32)
    bound = bound[:, :, None]
    np.clip(y, -bound, bound, out=y)
    q_out[...] = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(r, kp)
    s_out[...] = s
    return -1


def encode_mxfp8_numpy(
    x: np.ndarray,
    *,
    scale_rule: str | ScaleRule = ScaleRule.RCEIL,
    name: str | None = None,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pure-numpy MXFP8 encode (the fallback and the oracle for the native kernel).

    Same contract as :func:`encode_mxfp8` for numpy input; processed in L2-sized chunks of rows.

    Example:
        >>> p, s = encode_mxfp8_numpy(np.array([1.0, -2.0, 0.5], np.float32))
        >>> p.tolist(), s.tolist()
        ([112, 248, 104], [120])
    """
    rule = _rule(scale_rule)
    x = _check_encode_input_numpy(x, name)
    payload, scales = _encode_out(out, x.shape, name)
    if payload.size == 0 or scales.size == 0:
        return payload, scales
    x2, q2, s2 = _as_2d(x), _as_2d(payload), _as_2d(scales)
    rows, k = x2.shape
    nb = s2.shape[1]
    kp = nb * BLOCK_SIZE
    step = max(1, CHUNK_ELEMENTS // kp)
    pad = np.zeros((min(step, rows), kp), np.float32) if kp != k else None
    qpad = np.empty((min(step, rows), kp), np.uint8) if kp != k else None
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        chunk = x2[r0:r1].astype(np.float32, copy=False)
        if pad is not None and qpad is not None:
            buf = pad[: r1 - r0]
            buf[:, :k] = chunk
            qbuf = qpad[: r1 - r0]
            bad = _encode_rows_numpy(buf, rule, qbuf, s2[r0:r1])
            q2[r0:r1] = qbuf[:, :k]
        else:
            bad = _encode_rows_numpy(np.ascontiguousarray(chunk), rule, q2[r0:r1], s2[r0:r1])
        if bad >= 0:
            _raise_nonfinite_in_block(x2, r0 + bad // nb, bad % nb, x.shape, name)
    return payload, scales


def _encode_out(
    out: tuple[np.ndarray, np.ndarray] | None, shape: tuple[int, ...], name: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """New (payload, scales) arrays, or the caller's ``out`` pair after checking it."""
    s_shape = scales_shape(shape)
    if out is None:
        return np.empty(shape, np.uint8), np.empty(s_shape, np.uint8)
    who = f"tensor {name!r}" if name else "tensor"
    try:
        payload, scales = out
    except (TypeError, ValueError):
        raise MXFP8Error(f"{who}: out must be a (payload, scales) pair") from None
    for what, arr, want in (("payload", payload, shape), ("scales", scales, s_shape)):
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or tuple(arr.shape) != want:
            got = f"{getattr(arr, 'dtype', type(arr).__name__)} {tuple(getattr(arr, 'shape', ()))}"
            raise MXFP8Error(f"{who}: out {what} must be a uint8 array of shape {want}, got {got}")
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            raise MXFP8Error(f"{who}: out {what} must be a writeable C-contiguous array")
    return payload, scales


def _raise_nonfinite_in_block(
    x2: np.ndarray, row: int, block: int, shape: tuple[int, ...], name: str | None
) -> None:
    seg = x2[row, block * BLOCK_SIZE : (block + 1) * BLOCK_SIZE].astype(np.float32)
    col = block * BLOCK_SIZE + int(np.flatnonzero(~np.isfinite(seg))[0])
    flat = row * x2.shape[1] + col
    raise _nonfinite_error(name, float(x2[row, col]), _index_of(flat, shape))


def _check_encode_input_numpy(x: np.ndarray, name: str | None) -> np.ndarray:
    who = f"tensor {name!r}" if name else "tensor"
    if not isinstance(x, np.ndarray):
        raise MXFP8Error(f"{who}: expected a numpy array or torch tensor, got {type(x).__name__}")
    if x.dtype not in _ENCODE_NP_DTYPES:
        raise MXFP8Error(
            f"{who}: cannot encode dtype {x.dtype}; expected float32, bfloat16 or float16 "
            "(convert float64 to float32 yourself: rounding twice is a choice we do not make)"
        )
    if x.ndim < 1:
        raise MXFP8Error(f"{who}: MXFP8 tensors must have rank >= 1, got a 0-d array")
    return x


def _check_decode_input_numpy(p: np.ndarray, s: np.ndarray, name: str | None) -> tuple[np.ndarray, np.ndarray]:
    who = f"tensor {name!r}" if name else "tensor"
    if not isinstance(p, np.ndarray) or not isinstance(s, np.ndarray):
        raise MXFP8Error(f"{who}: payload and scales must both be numpy arrays (or both torch)")
    if p.dtype == np.dtype(ml_dtypes.float8_e4m3fn):
        p = p.view(np.uint8)
    if s.dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
        s = s.view(np.uint8)
    if p.dtype != np.uint8 or s.dtype != np.uint8:
        raise MXFP8Error(
            f"{who}: payload and scales must be uint8 (or float8_e4m3fn / float8_e8m0fnu), "
            f"got {p.dtype} and {s.dtype}"
        )
    if p.ndim < 1:
        raise MXFP8Error(f"{who}: payload must have rank >= 1, got a 0-d array")
    if s.shape != scales_shape(p.shape):
        raise MXFP8Error(
            f"{who}: scales shape {tuple(s.shape)} does not match payload shape "
            f"{tuple(p.shape)}; expected {scales_shape(p.shape)} (one per 32 along the last axis)"
        )
    return p, s


def decode_mxfp8_numpy(
    payload: np.ndarray,
    scales: np.ndarray,
    *,
    dtype: Any = np.float32,
    name: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Pure-numpy MXFP8 decode (the fallback and the oracle for the native kernel).

    Chunked 2-D table gather ``table[(s << 8) | q]``; same contract as :func:`decode_mxfp8`.

    Example:
        >>> decode_mxfp8_numpy(np.array([112, 248], np.uint8), np.array([120], np.uint8)).tolist()
        [1.0, -2.0]
    """
    kind = _out_kind(dtype)
    p, s = _check_decode_input_numpy(payload, scales, name)
    table = decode_table(kind)
    out_bits = _out_bits(out, p.shape, kind, name)
    if p.size:
        _decode_rows_numpy(_as_2d(p), _as_2d(s), table, _as_2d(out_bits))
    if out is not None:
        return out
    return out_bits.view(np.float32 if kind == "f32" else ml_dtypes.bfloat16)


def _out_bits(out: np.ndarray | None, shape: tuple[int, ...], kind: OutKind, name: str | None) -> np.ndarray:
    """The output buffer as a bit-pattern view: a new array, or the caller's ``out`` checked."""
    bits_dtype = np.uint32 if kind == "f32" else np.uint16
    if out is None:
        return np.empty(shape, bits_dtype)
    want = np.dtype(np.float32 if kind == "f32" else ml_dtypes.bfloat16)
    who = f"tensor {name!r}" if name else "tensor"
    if not isinstance(out, np.ndarray) or out.dtype != want or tuple(out.shape) != tuple(shape):
        got = f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
        raise MXFP8Error(f"{who}: out must be a {want} array of shape {tuple(shape)}, got {got}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise MXFP8Error(f"{who}: out must be a writeable C-contiguous array")
    return out.view(bits_dtype)


def _decode_rows_numpy(p2: np.ndarray, s2: np.ndarray, table: np.ndarray, o2: np.ndarray) -> None:
    rows, k = p2.shape
    nfull = k // BLOCK_SIZE
    kf = nfull * BLOCK_SIZE
    step = max(1, CHUNK_ELEMENTS // max(k, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        if nfull:
            q = p2[r0:r1, :kf].reshape(r1 - r0, nfull, BLOCK_SIZE)
            idx = (s2[r0:r1, :nfull, None].astype(np.uint16) << 8) | q
            np.take(table, idx, out=o2[r0:r1, :kf].reshape(r1 - r0, nfull, BLOCK_SIZE))
        if kf != k:
            idx = (s2[r0:r1, nfull:].astype(np.uint16) << 8) | p2[r0:r1, kf:]
            o2[r0:r1, kf:] = np.take(table, idx)


# ---------------------------------------------------------------------------------------------
# torch path (any device; pure torch ops, bit-identical to the numpy path)
# ---------------------------------------------------------------------------------------------
def _torch_module() -> Any:
    import torch

    return torch


def encode_mxfp8_torch(
    x: "torch.Tensor",
    *,
    scale_rule: str | ScaleRule = ScaleRule.RCEIL,
    name: str | None = None,
) -> tuple["torch.Tensor", "torch.Tensor"]:
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
    k = shape[-1]
    nb = s_shape[-1]
    xf = x.detach().reshape(-1, k).to(torch.float32)
    if nb * BLOCK_SIZE != k:
        xf = torch.nn.functional.pad(xf, (0, nb * BLOCK_SIZE - k))
    xb = xf.reshape(-1, nb, BLOCK_SIZE)
    mag_bits = xb.view(torch.int32) & 0x7FFFFFFF
    amax_bits = mag_bits.amax(dim=2)
    bad = amax_bits >= _F32_EXP_MASK
    if bool(bad.any()):
        flat_x = x.detach().reshape(-1).to(torch.float32)
        first = int(torch.nonzero(~torch.isfinite(flat_x))[0, 0])
        raise _nonfinite_error(name, float(flat_x[first]), _index_of(first, shape))
    biased = amax_bits >> 23
    e = biased - (127 + 8)
    if rule is ScaleRule.RCEIL:
        e = e + ((amax_bits & 0x7FFFFF) > _F32_MANT_175).to(torch.int32)
    e = torch.where(biased == 0, torch.full_like(e, SCALE_EXP_MIN), e)
    e = e.clamp(SCALE_EXP_MIN, SCALE_EXP_MAX)
    s = (e + E8M0_BIAS).to(torch.int32)
    factor = ((E8M0_BIAS - e) << 23).view(torch.float32)
    y = xb * factor[:, :, None]
    bound = torch.where(
        s == TOP_CLAMP_SCALE_BYTE,
        torch.full_like(factor, _TOP_CLAMP_VALUE),
        torch.full_like(factor, E4M3_MAX),
    )[:, :, None]
    y = torch.minimum(torch.maximum(y, -bound), bound)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1, nb * BLOCK_SIZE)[:, :k]
    return q.reshape(shape).contiguous(), s.to(torch.uint8).reshape(s_shape)


@functools.cache
def _torch_table(kind: OutKind, device: str) -> "torch.Tensor":
    torch = _torch_module()
    table = decode_table(kind)
    signed = table.view(np.int32 if kind == "f32" else np.int16).copy()
    return torch.from_numpy(signed).to(device)


def _check_decode_input_torch(
    p: "torch.Tensor", s: "torch.Tensor", name: str | None
) -> tuple["torch.Tensor", "torch.Tensor"]:
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
    payload: "torch.Tensor",
    scales: "torch.Tensor",
    *,
    dtype: Any = None,
    name: str | None = None,
) -> "torch.Tensor":
    """MXFP8 decode with torch ops on the payload's device; same bits as the numpy path.

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
    if p.numel() == 0:
        return torch.empty(shape, dtype=out_dtype, device=p.device)
    k = shape[-1]
    nb = s.shape[-1]
    cols = torch.arange(k, device=p.device) // BLOCK_SIZE
    s2 = s.reshape(-1, nb).to(torch.int64)[:, cols]
    idx = (s2 << 8) | p.reshape(-1, k).to(torch.int64)
    bits = _torch_table(kind, str(p.device))[idx]
    return bits.view(out_dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Native dispatch (numpy arrays and CPU torch tensors; identical bits to the pure paths above)
# ---------------------------------------------------------------------------------------------
def _native_kernel() -> Any:
    from . import _native  # lazy: building the kernel is the loader's business

    return _native.get_kernel()


def _encode_numpy_dispatch(
    x: np.ndarray, rule: ScaleRule, name: str | None, out: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    kernel = _native_kernel()
    if kernel is None:
        return encode_mxfp8_numpy(x, scale_rule=rule, name=name, out=out)
    x = _check_encode_input_numpy(x, name)
    payload, scales = _encode_out(out, x.shape, name)
    if payload.size == 0 or scales.size == 0:
        return payload, scales
    x2 = np.ascontiguousarray(_as_2d(x))
    q2, s2 = _as_2d(payload), _as_2d(scales)
    rceil = rule is ScaleRule.RCEIL
    if x2.dtype == np.float16:  # no native half loader: widen (exactly) one chunk at a time
        step = max(1, CHUNK_ELEMENTS // x2.shape[1])
        for r0 in range(0, x2.shape[0], step):
            chunk = x2[r0 : r0 + step].astype(np.float32)
            bad = kernel.encode(chunk, q2[r0 : r0 + step], s2[r0 : r0 + step], rceil)
            if bad >= 0:
                nb = s2.shape[1]
                _raise_nonfinite_in_block(x2, r0 + bad // nb, bad % nb, x.shape, name)
        return payload, scales
    bits = x2 if x2.dtype == np.float32 else x2.view(np.uint16)
    bad = kernel.encode(bits, q2, s2, rceil)
    if bad >= 0:
        nb = s2.shape[1]
        _raise_nonfinite_in_block(x2, bad // nb, bad % nb, x.shape, name)
    return payload, scales


def _decode_numpy_dispatch(
    payload: np.ndarray, scales: np.ndarray, dtype: Any, name: str | None, out: np.ndarray | None = None
) -> np.ndarray:
    kernel = _native_kernel()
    if kernel is None:
        return decode_mxfp8_numpy(payload, scales, dtype=dtype, name=name, out=out)
    kind = _out_kind(dtype)
    p, s = _check_decode_input_numpy(payload, scales, name)
    table = decode_table(kind)
    out_bits = _out_bits(out, p.shape, kind, name)
    if p.size:
        p2, s2 = np.ascontiguousarray(_as_2d(p)), np.ascontiguousarray(_as_2d(s))
        kernel.decode(p2, s2, _as_2d(out_bits), table)
    if out is not None:
        return out
    return out_bits.view(np.float32 if kind == "f32" else ml_dtypes.bfloat16)


def _torch_cpu_to_numpy(x: "torch.Tensor") -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor (bfloat16 as ml_dtypes.bfloat16, float8 as uint8)."""
    torch = _torch_module()
    t = x.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _torch_out_view(out: "torch.Tensor", name: str | None) -> np.ndarray:
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


def _copy_into(out: "torch.Tensor", result: "torch.Tensor", name: str | None) -> "torch.Tensor":
    if out.dtype != result.dtype or tuple(out.shape) != tuple(result.shape):
        raise MXFP8Error(
            f"tensor {name!r}: out must be {result.dtype} of shape {tuple(result.shape)}, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    return out.copy_(result)


def _numpy_to_torch(a: np.ndarray) -> "torch.Tensor":
    torch = _torch_module()
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------
def encode_mxfp8(
    x: ArrayLike,
    *,
    scale_rule: str | ScaleRule = ScaleRule.RCEIL,
    name: str | None = None,
    out: tuple[ArrayLike, ArrayLike] | None = None,
) -> tuple[ArrayLike, ArrayLike]:
    """Quantize a float tensor to MXFP8: E4M3 payload bits plus one UE8M0 scale per 32 elements.

    Args:
        x: numpy array (float32, ml_dtypes.bfloat16, float16) or torch tensor (same dtypes, any
            device), rank >= 1. Blocks of 32 run along the last axis; the last one may be partial.
        scale_rule: ``"rceil"`` (default, never clips the block max) or ``"floor"`` (OCP).
        name: tensor name, used only in error messages.
        out: optional ``(payload, scales)`` pair of C-contiguous uint8 arrays (tensors for torch
            input) of the result shapes, written in place and returned -- e.g. to re-encode a
            weight master into its existing storage. On error they may be partly written.

    Returns:
        ``(payload, scales)``: uint8 E4M3 bit patterns of ``x``'s shape and uint8 biased exponents
        of shape ``(*x.shape[:-1], ceil(x.shape[-1] / 32))``; numpy in -> numpy out, torch in ->
        torch out on the same device.

    Raises:
        MXFP8Error: ``x`` holds NaN or +-Inf (the message names ``name`` and the index), has an
            unsupported dtype or rank 0, or ``scale_rule`` is unknown.

    Example:
        >>> import numpy as np
        >>> p, s = encode_mxfp8(np.array([[1.0, -2.0, 0.0, 3.0]], np.float32))
        >>> p.tolist(), s.tolist()
        ([[112, 248, 0, 124]], [[120]])
        >>> decode_mxfp8(p, s).tolist()
        [[1.0, -2.0, 0.0, 3.0]]
    """
    rule = _rule(scale_rule)
    if _is_torch(x):
        outs = _torch_encode_out(out, name)
        on_cpu = x.device.type == "cpu" and all(o.device.type == "cpu" for o in outs)
        if not on_cpu or x.dtype not in _torch_float_dtypes() or x.dim() < 1:
            q, s = encode_mxfp8_torch(x, scale_rule=rule, name=name)
            if out is None:
                return q, s
            _copy_into(outs[0], q, name)
            _copy_into(outs[1], s, name)
            return outs[0], outs[1]
        np_out = None if out is None else (_torch_cpu_to_numpy(outs[0]), _torch_cpu_to_numpy(outs[1]))
        q, s = _encode_numpy_dispatch(_torch_cpu_to_numpy(x), rule, name, np_out)
        return (outs[0], outs[1]) if out is not None else (_numpy_to_torch(q), _numpy_to_torch(s))
    if out is not None and not all(isinstance(o, np.ndarray) for o in out):
        raise MXFP8Error(f"tensor {name!r}: out must be numpy arrays for numpy input")
    return _encode_numpy_dispatch(x, rule, name, out)


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


def decode_mxfp8(
    payload: ArrayLike,
    scales: ArrayLike,
    *,
    dtype: Any = np.float32,
    name: str | None = None,
    out: ArrayLike | None = None,
) -> ArrayLike:
    """Dequantize MXFP8: ``e4m3(payload) * 2^(scales - 127)`` per 32-element block.

    Args:
        payload: uint8 E4M3 bits (or float8_e4m3fn), numpy array or torch tensor, rank >= 1.
        scales: uint8 biased exponents (or float8_e8m0fnu) of shape
            ``(*payload.shape[:-1], ceil(payload.shape[-1] / 32))``, same array type as payload.
        dtype: output dtype: np.float32 (default) / ml_dtypes.bfloat16 / torch.float32 /
            torch.bfloat16 (numpy and torch spellings are interchangeable). bfloat16 is rounded
            once, to nearest even, from the exact value.
        name: tensor name, used only in error messages.
        out: optional C-contiguous destination of the payload's shape and the requested dtype
            (numpy array, or torch tensor for torch input, e.g. a parameter's storage); it is
            filled and returned, saving the allocation (and page faults) of a new array.

    Returns:
        The decoded array (``out`` when given), same type (numpy / torch, same device) as the
        input. Scale byte 0xFF
        gives a NaN block, codes 0x7F / 0xFF give NaN, very large products give +-inf.

    Raises:
        MXFP8Error: wrong dtypes, mismatched shapes, or an unsupported ``dtype``.

    Example:
        >>> import numpy as np, ml_dtypes
        >>> decode_mxfp8(np.array([0x7E, 0x01], np.uint8), np.array([127], np.uint8),
        ...              dtype=ml_dtypes.bfloat16).tolist()
        [448.0, 0.001953125]
    """
    if _is_torch(payload):
        p, s = _check_decode_input_torch(payload, scales, name)
        if out is not None and not _is_torch(out):
            raise MXFP8Error(f"tensor {name!r}: out must be a torch tensor for torch input")
        if p.device.type != "cpu" or (out is not None and out.device.type != "cpu"):
            result = decode_mxfp8_torch(p, s, dtype=dtype, name=name)
            return result if out is None else _copy_into(out, result, name)
        np_out = None if out is None else _torch_out_view(out, name)
        decoded = _decode_numpy_dispatch(_torch_cpu_to_numpy(p), _torch_cpu_to_numpy(s), dtype, name, np_out)
        return out if out is not None else _numpy_to_torch(decoded)
    if out is not None and not isinstance(out, np.ndarray):
        raise MXFP8Error(f"tensor {name!r}: out must be a numpy array for numpy input")
    return _decode_numpy_dispatch(payload, scales, dtype, name, out)


def _torch_float_dtypes() -> tuple[Any, ...]:
    torch = _torch_module()
    return (torch.float32, torch.bfloat16, torch.float16)
