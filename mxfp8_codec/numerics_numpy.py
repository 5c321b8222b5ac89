"""MXFP8 numerics, pure-numpy path: the scale rules, the exact decode tables, encode and decode.

This is the reference implementation the native kernel and the torch path are tested against
(bit for bit); :mod:`mxfp8_codec.numerics` explains the numerics and dispatches between paths.

* Scale rules work on the float32 bit pattern of the block amax (integer arithmetic only).
* Encode: ``y = x * 2^-e`` in float32 (a power-of-two multiply: exact wherever it matters), clip
  to +-448 (+-240 in blocks with scale byte 247), then ml_dtypes' round-to-nearest-even cast to
  float8_e4m3fn (it would give NaN above 464 without the clip).
* Decode: a 65 536-entry table indexed by ``(s << 8) | q``, built once from float64 (which holds
  every product ``e4m3(q) * 2^(s-127)`` exactly) and rounded once to float32 / bfloat16.
* Both run in L2-sized chunks (:data:`CHUNK_ELEMENTS`), which nearly halves the time of the
  table gather compared with whole-array temporaries.
* The argument checks, output buffers and the non-finite error of the numpy path
  (:func:`check_encode_input_numpy`, :func:`encode_out`, :func:`decode_out_bits`, ...) are public: the
  dispatcher in :mod:`mxfp8_codec.numerics` runs the native kernel behind the same checks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, Literal

import ml_dtypes
import numpy as np

from .constants import (
    BF16_CANONICAL_NAN,
    BLOCK_SIZE,
    E4M3_BIAS,
    E4M3_MANTISSA_BITS,
    E4M3_MAX,
    E4M3_MIN_NORMAL,
    E4M3_NAN_MAG,
    E8M0_BIAS,
    E8M0_NAN,
    F32_CANONICAL_NAN,
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
from .errors import MXFP8Error
from .rng import SR_SCALE, rand24_numpy

__all__ = [
    "CHUNK_ELEMENTS",
    "OutKind",
    "as_2d",
    "check_decode_input_numpy",
    "check_encode_input_numpy",
    "decode_mxfp8_numpy",
    "decode_out_bits",
    "decode_table",
    "decoded_shape",
    "e4m3_values",
    "encode_mxfp8_numpy",
    "encode_out",
    "index_of",
    "nonfinite_error",
    "out_kind",
    "raise_nonfinite_in_block",
    "scale_exponent",
    "scales_shape",
]

OutKind = Literal["f32", "bf16"]

CHUNK_ELEMENTS = 1 << 18  # 262 144 elements per numpy chunk: ~1 MiB float32 = one core's L2


# ---------------------------------------------------------------------------------------------
# Small shared helpers
# ---------------------------------------------------------------------------------------------
def scales_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Shape of the scale array for a payload of ``shape``: ``(*shape[:-1], ceil(shape[-1] / 32))``.

    The one spelling of the shape rule: the header validator, the writer, the readers and the
    encoders all call it.

    Example:
        >>> scales_shape((4096, 1000))
        (4096, 32)
    """
    if len(shape) < 1:
        raise MXFP8Error("MXFP8 tensors must have rank >= 1 (blocks run along the last axis)")
    return (*(int(d) for d in shape[:-1]), -(-int(shape[-1]) // BLOCK_SIZE))


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
    if bits >= F32_EXP_MASK:
        raise MXFP8Error(f"scale_exponent: amax must be finite, got {amax!r}")
    e = _exponents_from_amax_bits(np.array([bits], np.uint32), parse_scale_rule(scale_rule))
    return int(e[0])


def _exponents_from_amax_bits(amax_bits: np.ndarray, rule: ScaleRule) -> np.ndarray:
    """Shared exponents (int32) from float32 bit patterns of |amax| (finite, sign bit clear)."""
    biased = (amax_bits >> 23).astype(np.int32)
    e = biased - (127 + 8)
    if rule is ScaleRule.RCEIL:
        e += (amax_bits & 0x7FFFFF) > F32_MANT_175
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
    nan = (bits & 0x7FFFFFFF) > F32_EXP_MASK
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


def out_kind(dtype: Any) -> OutKind:
    """Map a requested output dtype (numpy, ml_dtypes, torch or a string) to 'f32' / 'bf16'."""
    name = str(dtype).lower().removeprefix("torch.").removeprefix("<class '").rstrip("'>")
    name = name.rsplit(".", 1)[-1]
    if name in ("float32", "f32", "fp32", "float"):
        return "f32"
    if name in ("bfloat16", "bf16"):
        return "bf16"
    raise MXFP8Error(
        f"unsupported decode dtype {dtype!r}; use np.float32, ml_dtypes.bfloat16, torch.float32 or torch.bfloat16"
    )


def index_of(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index in ``shape`` of flat (row-major) position ``flat``, as a tuple of ints."""
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def nonfinite_error(name: str | None, value: float, index: tuple[int, ...]) -> MXFP8Error:
    """The encoders' one error for a NaN/Inf input, naming the tensor, the value and its index."""
    who = f"tensor {name!r}" if name else "tensor"
    return MXFP8Error(
        f"{who}: cannot encode non-finite value {value!r} at index {index} "
        "(a weight with NaN/Inf is a training failure, not something to archive)"
    )


# ---------------------------------------------------------------------------------------------
# numpy path
# ---------------------------------------------------------------------------------------------
_ENCODE_NP_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


def as_2d(a: np.ndarray) -> np.ndarray:
    """``a`` as rows of its last axis, ``[prod(shape[:-1]), shape[-1]]`` (a view where numpy can)."""
    k = a.shape[-1]
    rows = math.prod(a.shape[:-1])
    return a.reshape(rows, k)


def _pow2_f32(e: np.ndarray) -> np.ndarray:
    """Exact float32 ``2^e`` for int32 exponents in the normal range [-126, 127]."""
    return ((e + 127).astype(np.uint32) << np.uint32(23)).view(np.float32)


def _e4m3_grid_codes(y: np.ndarray, rand24: np.ndarray) -> np.ndarray:
    """E4M3 bytes of finite float32 ``y`` (already scaled and clipped) by stochastic grid rounding.

    numpy spelling of ``mx_e4m3_grid_code`` (mxfp8.h) and of the torch ``e4m3_encode_grid``: the grid
    step of ``|y|`` is ``u = 2^(floor(log2 |y|) - 3)`` (``2^-9`` below 2^-6), ``t = |y| / u`` is exact,
    ``n = floor(t) + (rand24 < frac(t) * 2^24)``, the value ``n * u`` saturates at 448, the sign bit
    is kept. Every float32 operation is exact.
    """
    bits = y.view(np.uint32)
    a_bits = bits & np.uint32(0x7FFFFFFF)
    a = a_bits.view(np.float32)
    e = (a_bits >> np.uint32(23)).astype(np.int32) - 127
    ue = np.where(a >= np.float32(E4M3_MIN_NORMAL), e - E4M3_MANTISSA_BITS, -9).astype(np.int32)
    t = a * _pow2_f32(-ue)
    fl = np.floor(t)
    frac = (t - fl) * np.float32(SR_SCALE)
    n = fl + (rand24.astype(np.float32) < frac).astype(np.float32)
    q = np.minimum(n * _pow2_f32(ue), np.float32(E4M3_MAX))
    qb = q.view(np.uint32)
    normal = ((((qb >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32) - 127 + E4M3_BIAS) << 3) | (
        (qb >> np.uint32(20)) & np.uint32(7)
    ).astype(np.int32)
    sub = (q * np.float32(512.0)).astype(np.int32)  # q = n * 2^-9, n in 0..7
    code = np.where(q >= np.float32(E4M3_MIN_NORMAL), normal, sub)
    return (code | ((bits >> np.uint32(24)) & np.uint32(0x80)).astype(np.int32)).astype(np.uint8)


def _encode_rows_numpy(
    x: np.ndarray, rule: ScaleRule, q_out: np.ndarray, s_out: np.ndarray, rand24: np.ndarray | None = None
) -> int:
    """Encode float32 rows ``x [r, nb*32]`` into ``q_out`` / ``s_out``; -1, or first bad block.

    ``rand24`` (``[r, nb*32]`` integers below 2^24) selects stochastic grid rounding."""
    r, kp = x.shape
    xb = x.reshape(r, kp // BLOCK_SIZE, BLOCK_SIZE)
    mag_bits = xb.view(np.uint32) & np.uint32(0x7FFFFFFF)
    amax_bits = mag_bits.max(axis=2)
    bad = amax_bits >= F32_EXP_MASK
    if bad.any():
        return int(np.flatnonzero(bad)[0])
    e = _exponents_from_amax_bits(amax_bits, rule)
    s = (e + E8M0_BIAS).astype(np.uint8)
    factor = ((E8M0_BIAS - e).astype(np.uint32) << 23).view(np.float32)  # 2^-e, normal float32
    y = xb * factor[:, :, None]
    bound = np.where(s == TOP_CLAMP_SCALE_BYTE, TOP_CLAMP_VALUE, E4M3_MAX).astype(np.float32)
    bound = bound[:, :, None]
    np.clip(y, -bound, bound, out=y)
    if rand24 is not None:
        q_out[...] = _e4m3_grid_codes(y.reshape(r, kp), rand24)
    else:
        q_out[...] = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(r, kp)
    s_out[...] = s
    return -1


def encode_mxfp8_numpy(
    x: np.ndarray,
    *,
    scale_rule: str | ScaleRule = ScaleRule.RCEIL,
    name: str | None = None,
    out: tuple[np.ndarray, np.ndarray] | None = None,
    rounding: str | Rounding = Rounding.RNE,
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Pure-numpy MXFP8 encode (the fallback and the oracle for the native kernel).

    Same contract as :func:`encode_mxfp8` for numpy input; processed in L2-sized chunks of rows.

    Example:
        >>> p, s = encode_mxfp8_numpy(np.array([1.0, -2.0, 0.5], np.float32))
        >>> p.tolist(), s.tolist()
        ([112, 248, 104], [120])
    """
    rule = parse_scale_rule(scale_rule)
    stochastic = parse_rounding(rounding) is Rounding.STOCHASTIC
    x = check_encode_input_numpy(x, name)
    payload, scales = encode_out(out, x.shape, name)
    if payload.size == 0 or scales.size == 0:
        return payload, scales
    x2, q2, s2 = as_2d(x), as_2d(payload), as_2d(scales)
    rows, k = x2.shape
    nb = s2.shape[1]
    kp = nb * BLOCK_SIZE
    chunk_rows = max(1, CHUNK_ELEMENTS // kp)
    pad = np.zeros((min(chunk_rows, rows), kp), np.float32) if kp != k else None
    qpad = np.empty((min(chunk_rows, rows), kp), np.uint8) if kp != k else None
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        chunk = x2[r0:r1].astype(np.float32, copy=False)
        rand = None
        if stochastic:  # the words of flat indices r0 * k .. r1 * k - 1, laid out like the padded rows
            words = rand24_numpy((r1 - r0) * k, seed, step, tensor_id, offset=r0 * k).reshape(r1 - r0, k)
            rand = words if kp == k else np.pad(words, ((0, 0), (0, kp - k)))
        if pad is not None and qpad is not None:
            buf = pad[: r1 - r0]
            buf[:, :k] = chunk
            qbuf = qpad[: r1 - r0]
            bad = _encode_rows_numpy(buf, rule, qbuf, s2[r0:r1], rand)
            q2[r0:r1] = qbuf[:, :k]
        else:
            bad = _encode_rows_numpy(np.ascontiguousarray(chunk), rule, q2[r0:r1], s2[r0:r1], rand)
        if bad >= 0:
            raise_nonfinite_in_block(x2, r0 + bad // nb, bad % nb, x.shape, name)
    return payload, scales


def encode_out(
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


def raise_nonfinite_in_block(x2: np.ndarray, row: int, block: int, shape: tuple[int, ...], name: str | None) -> None:
    """Raise :func:`nonfinite_error` for the first NaN/Inf in 32-block ``block`` of row ``row`` of the
    2-D view ``x2`` of an input of ``shape`` (a block an encoder reported as not finite)."""
    seg = x2[row, block * BLOCK_SIZE : (block + 1) * BLOCK_SIZE].astype(np.float32)
    col = block * BLOCK_SIZE + int(np.flatnonzero(~np.isfinite(seg))[0])
    flat = row * x2.shape[1] + col
    raise nonfinite_error(name, float(x2[row, col]), index_of(flat, shape))


def check_encode_input_numpy(x: np.ndarray, name: str | None) -> np.ndarray:
    """``x`` if the numpy encoders take it (float32 / bfloat16 / float16, rank >= 1), else MXFP8Error."""
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


def check_decode_input_numpy(p: np.ndarray, s: np.ndarray, name: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(payload, scales) as uint8 arrays (float8 views accepted) of matching shapes, else MXFP8Error."""
    who = f"tensor {name!r}" if name else "tensor"
    if not isinstance(p, np.ndarray) or not isinstance(s, np.ndarray):
        raise MXFP8Error(f"{who}: payload and scales must both be numpy arrays (or both torch)")
    if p.dtype == np.dtype(ml_dtypes.float8_e4m3fn):
        p = p.view(np.uint8)
    if s.dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
        s = s.view(np.uint8)
    if p.dtype != np.uint8 or s.dtype != np.uint8:
        raise MXFP8Error(
            f"{who}: payload and scales must be uint8 (or float8_e4m3fn / float8_e8m0fnu), got {p.dtype} and {s.dtype}"
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
    transpose: bool = False,
) -> np.ndarray:
    """Pure-numpy MXFP8 decode (the fallback and the oracle for the native kernel).

    Chunked 2-D table gather ``table[(s << 8) | q]``; same contract as :func:`decode_mxfp8`
    (``transpose=True``: a 2-D ``[R, C]`` payload decodes to ``[C, R]``, chunk by chunk of rows:
    decode, then copy the chunk's ``.T`` into its columns of the output).

    Example:
        >>> decode_mxfp8_numpy(np.array([112, 248], np.uint8), np.array([120], np.uint8)).tolist()
        [1.0, -2.0]
    """
    kind = out_kind(dtype)
    p, s = check_decode_input_numpy(payload, scales, name)
    table = decode_table(kind)
    out_bits = decode_out_bits(out, decoded_shape(p.shape, transpose, name), kind, name)
    if p.size and transpose:
        rows, k = p.shape
        step = max(1, CHUNK_ELEMENTS // max(k, 1))
        tmp = np.empty((min(step, rows), k), out_bits.dtype)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            _decode_rows_numpy(p[r0:r1], s[r0:r1], table, tmp[: r1 - r0])
            out_bits[:, r0:r1] = tmp[: r1 - r0].T
    elif p.size:
        _decode_rows_numpy(as_2d(p), as_2d(s), table, as_2d(out_bits))
    if out is not None:
        return out
    return out_bits.view(np.float32 if kind == "f32" else ml_dtypes.bfloat16)


def decoded_shape(shape: tuple[int, ...], transpose: bool, name: str | None = None) -> tuple[int, ...]:
    """Shape of the decoded array: ``shape``, or ``(C, R)`` for a 2-D ``(R, C)`` with ``transpose``.

    Example:
        >>> decoded_shape((4096, 1024), True)
        (1024, 4096)
    """
    if not transpose:
        return tuple(shape)
    if len(shape) != 2:
        who = f"tensor {name!r}" if name else "tensor"
        raise MXFP8Error(f"{who}: transpose=True needs a 2-D payload, got shape {tuple(shape)}")
    return (shape[1], shape[0])


def decode_out_bits(out: np.ndarray | None, shape: tuple[int, ...], kind: OutKind, name: str | None) -> np.ndarray:
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
