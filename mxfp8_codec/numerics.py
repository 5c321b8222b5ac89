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

* **Tiny blocks** (amax <= 1.75 * 2^-119 ~ 2.6e-36, where RCEIL asks for e < -127): the clamp
  e = -127 still lets every element be scaled exactly by 2^127, so they round correctly instead of
  flushing to zero (TE / torchao RCEIL) or being off by a factor 2 (torchao FLOOR, pytorch/ao#1104).
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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import ml_dtypes
import numpy as np

from .constants import Rounding, ScaleRule, parse_rounding, parse_scale_rule
from .convert import cpu_tensor_view, is_torch, numpy_to_torch, torch_encodable_dtypes
from .errors import MXFP8Error
from .numerics_numpy import (
    CHUNK_ELEMENTS,
    as_2d,
    check_decode_input_numpy,
    check_encode_input_numpy,
    decode_mxfp8_numpy,
    decode_out_bits,
    decode_table,
    decoded_shape,
    e4m3_values,
    encode_mxfp8_numpy,
    encode_out,
    out_kind,
    raise_nonfinite_in_block,
    scale_exponent,
    scales_shape,
)
from .numerics_torch import check_decode_input_torch, decode_mxfp8_torch, encode_mxfp8_torch
from .rng import stream_keys

if TYPE_CHECKING:  # torch is optional for the codec: imported lazily where needed
    import torch

__all__ = [
    "backend_info",
    "decode_mxfp8",
    "decode_mxfp8_numpy",
    "decode_mxfp8_split",
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

SPLIT_MIN_VALUES = 1 << 18  # 256 Ki values: smaller payloads are decoded in one call (decode_mxfp8_split)


# ---------------------------------------------------------------------------------------------
# Dispatch: numpy arrays and CPU tensors -> native kernel (else pure numpy); other devices -> torch
# ---------------------------------------------------------------------------------------------
def _native_kernel() -> Any:
    from . import _native  # lazy: building the kernel is the loader's business

    return _native.get_kernel()


def backend_info() -> dict[str, str]:
    """Which implementation encodes/decodes numpy arrays and CPU tensors, and why.

    Returns:
        ``{"backend": "native", "library": path, "simd": "avx512" | "avx2" | "portable-c"}`` or
        ``{"backend": "numpy", "reason": ...}`` (no compiler, failed build, or
        ``MXFP8_CODEC_NATIVE=0``). Tensors on other devices always use the torch path.

    Example:
        >>> backend_info()["backend"] in ("native", "numpy")
        True
    """
    from . import _native

    return _native.kernel_info()


@dataclass(frozen=True)
class _SR:
    """Stochastic-rounding key: the counter RNG stream ``(seed, step, tensor_id)``."""

    seed: int
    step: int
    tensor_id: int


def _encode_numpy_dispatch(
    x: np.ndarray,
    rule: ScaleRule,
    name: str | None,
    out: tuple[np.ndarray, np.ndarray] | None = None,
    sr: _SR | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    kernel = _native_kernel()
    if kernel is None:
        if sr is None:
            return encode_mxfp8_numpy(x, scale_rule=rule, name=name, out=out)
        return encode_mxfp8_numpy(
            x,
            scale_rule=rule,
            name=name,
            out=out,
            rounding=Rounding.STOCHASTIC,
            seed=sr.seed,
            step=sr.step,
            tensor_id=sr.tensor_id,
        )
    x = check_encode_input_numpy(x, name)
    payload, scales = encode_out(out, x.shape, name)
    if payload.size == 0 or scales.size == 0:
        return payload, scales
    x2 = np.ascontiguousarray(as_2d(x))
    q2, s2 = as_2d(payload), as_2d(scales)
    rceil = rule is ScaleRule.RCEIL
    keys = stream_keys(sr.seed, sr.step, sr.tensor_id) if sr is not None else (0, 0)

    def run(bits: np.ndarray, q: np.ndarray, s: np.ndarray, row0: int) -> int:
        if sr is None:
            return kernel.encode(bits, q, s, rceil)
        return kernel.encode_grid(bits, q, s, rceil, True, row0 * x2.shape[1], keys)

    if x2.dtype == np.float16:  # no native half loader: widen (exactly) one chunk at a time
        step = max(1, CHUNK_ELEMENTS // x2.shape[1])
        for r0 in range(0, x2.shape[0], step):
            chunk = x2[r0 : r0 + step].astype(np.float32)
            bad = run(chunk, q2[r0 : r0 + step], s2[r0 : r0 + step], r0)
            if bad >= 0:
                nb = s2.shape[1]
                raise_nonfinite_in_block(x2, r0 + bad // nb, bad % nb, x.shape, name)
        return payload, scales
    bits = x2 if x2.dtype == np.float32 else x2.view(np.uint16)
    bad = run(bits, q2, s2, 0)
    if bad >= 0:
        nb = s2.shape[1]
        raise_nonfinite_in_block(x2, bad // nb, bad % nb, x.shape, name)
    return payload, scales


def _unit_last_stride(a: np.ndarray) -> np.ndarray:
    """``a`` if its last axis is contiguous and its row stride non-negative, else a C copy."""
    ok = (a.shape[-1] <= 1 or a.strides[-1] == a.itemsize) and a.strides[0] >= 0
    return a if ok else np.ascontiguousarray(a)


def _decode_numpy_dispatch(
    payload: np.ndarray,
    scales: np.ndarray,
    dtype: Any,
    name: str | None,
    out: np.ndarray | None = None,
    transpose: bool = False,
    team: tuple[str, int] | None = None,
) -> np.ndarray:
    kernel = _native_kernel()
    if kernel is None:
        return decode_mxfp8_numpy(payload, scales, dtype=dtype, name=name, out=out, transpose=transpose)
    kind = out_kind(dtype)
    p, s = check_decode_input_numpy(payload, scales, name)
    table = decode_table(kind)
    out_bits = decode_out_bits(out, decoded_shape(p.shape, transpose, name), kind, name)
    if p.size and transpose:  # strided 2-D views (e.g. a column range of a payload) need no copy
        kernel.decode_transposed(_unit_last_stride(p), _unit_last_stride(s), out_bits, table, team=team)
    elif p.size:
        p2, s2 = np.ascontiguousarray(as_2d(p)), np.ascontiguousarray(as_2d(s))
        kernel.decode(p2, s2, as_2d(out_bits), table, team=team)
    if out is not None:
        return out
    return out_bits.view(np.float32 if kind == "f32" else ml_dtypes.bfloat16)


# ---------------------------------------------------------------------------------------------
# torch in, numpy/native inside: checks of the caller's torch ``out`` buffers
# ---------------------------------------------------------------------------------------------
def _torch_out_view(out: torch.Tensor, name: str | None) -> np.ndarray:
    """numpy view of a CPU torch ``out`` tensor (must be contiguous, float32 or bfloat16)."""
    import torch

    if out.dtype not in (torch.float32, torch.bfloat16) or not out.is_contiguous():
        raise MXFP8Error(
            f"tensor {name!r}: out must be a contiguous float32 or bfloat16 tensor, "
            f"got {out.dtype} (contiguous={out.is_contiguous()})"
        )
    if out.requires_grad:
        raise MXFP8Error(f"tensor {name!r}: out must not require grad (decode into .data)")
    return cpu_tensor_view(out)


def _copy_into(out: torch.Tensor, result: torch.Tensor, name: str | None) -> torch.Tensor:
    """``out.copy_(result)`` once ``out`` has ``result``'s dtype and shape (MXFP8Error otherwise)."""
    if out.dtype != result.dtype or tuple(out.shape) != tuple(result.shape):
        raise MXFP8Error(
            f"tensor {name!r}: out must be {result.dtype} of shape {tuple(result.shape)}, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    return out.copy_(result)


def _torch_encode_out(out: Any, name: str | None) -> tuple[Any, ...]:
    """Check a torch ``out`` pair's types (shapes are checked by the encoder); () when None."""
    if out is None:
        return ()
    import torch

    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(is_torch(o) for o in out):
        raise MXFP8Error(f"tensor {name!r}: out must be a (payload, scales) pair of torch tensors")
    if any(o.dtype != torch.uint8 or not o.is_contiguous() for o in out):
        raise MXFP8Error(f"tensor {name!r}: out tensors must be contiguous uint8")
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------
def encode_mxfp8(
    x: ArrayLike,
    *,
    scale_rule: str | ScaleRule = ScaleRule.RCEIL,
    name: str | None = None,
    out: tuple[ArrayLike, ArrayLike] | None = None,
    rounding: str | Rounding = Rounding.RNE,
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
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
        rounding: ``"rne"`` (default: round to nearest even, the format's rule) or
            ``"stochastic"``: element ``i`` (flat row-major index) rounds up with probability equal
            to its fraction of the E4M3 grid step, using the counter RNG word of ``i`` under
            ``(seed, step, tensor_id)`` (:mod:`mxfp8_codec.rng`) -- unbiased, reproducible, and the
            same bits on numpy, torch (any device), the C kernel and nvfp4_cuda's CUDA kernels.
            The scale is chosen by ``scale_rule`` either way.
        seed, step, tensor_id: the stochastic-rounding key (non-negative ints; ignored for RNE).

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
    rule = parse_scale_rule(scale_rule)
    sr = None
    if parse_rounding(rounding) is Rounding.STOCHASTIC:
        stream_keys(seed, step, tensor_id)  # validates the key (non-negative) before any work
        sr = _SR(int(seed), int(step), int(tensor_id))
    if is_torch(x):
        outs = _torch_encode_out(out, name)
        on_cpu = x.device.type == "cpu" and all(o.device.type == "cpu" for o in outs)
        if not on_cpu or x.dtype not in torch_encodable_dtypes() or x.dim() < 1:
            q, s = encode_mxfp8_torch(
                x, scale_rule=rule, name=name, rounding=rounding, seed=seed, step=step, tensor_id=tensor_id
            )
            if out is None:
                return q, s
            _copy_into(outs[0], q, name)
            _copy_into(outs[1], s, name)
            return outs[0], outs[1]
        np_out = None if out is None else (cpu_tensor_view(outs[0]), cpu_tensor_view(outs[1]))
        q, s = _encode_numpy_dispatch(cpu_tensor_view(x), rule, name, np_out, sr)
        return (outs[0], outs[1]) if out is not None else (numpy_to_torch(q), numpy_to_torch(s))
    if out is not None and not all(isinstance(o, np.ndarray) for o in out):
        raise MXFP8Error(f"tensor {name!r}: out must be numpy arrays for numpy input")
    return _encode_numpy_dispatch(x, rule, name, out, sr)


def decode_mxfp8(
    payload: ArrayLike,
    scales: ArrayLike,
    *,
    dtype: Any = np.float32,
    name: str | None = None,
    out: ArrayLike | None = None,
    transpose: bool = False,
    team: tuple[str, int] | None = None,
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
            With ``transpose=True`` it has the transposed shape ``(C, R)``.
        transpose: False (default) keeps the payload's layout. True (2-D ``[R, C]`` payload only)
            returns the decoded values in ``[C, R]`` layout, C-contiguous -- bit for bit
            ``decode_mxfp8(...).T`` copied, without the intermediate array or the separate
            transpose pass (the native kernel decodes 32 x 32 tiles and writes them transposed;
            the numpy and torch paths decode then copy ``.T``). Use it to turn a projection
            stored ``[in, out]`` into nn.Linear's ``[out, in]`` weight, e.g. into the
            parameter's storage via ``out``.
        team: ``(runtime, threads)``: with the native kernel, decode on the thread team of an
            OpenMP runtime library already loaded in this process (its path, e.g. torch's libgomp:
            ``mxfp8_codec.hf`` passes torch's, so the decode runs on torch's intra-op threads rather
            than competing with them), ``threads`` wide, one row range (with ``transpose``: one
            range of block columns) per thread. The same bits as one thread; ignored otherwise.

    Returns:
        The decoded array (``out`` when given), same type (numpy / torch, same device) as the
        input. Scale byte 0xFF
        gives a NaN block, codes 0x7F / 0xFF give NaN, very large products give +-inf.

    Raises:
        MXFP8Error: wrong dtypes, mismatched shapes, an unsupported ``dtype``, or
            ``transpose=True`` with a payload that is not 2-D.

    Example:
        >>> import numpy as np, ml_dtypes
        >>> decode_mxfp8(np.array([0x7E, 0x01], np.uint8), np.array([127], np.uint8),
        ...              dtype=ml_dtypes.bfloat16).tolist()
        [448.0, 0.001953125]
        >>> p, s = encode_mxfp8(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
        >>> decode_mxfp8(p, s, transpose=True).tolist()
        [[1.0, 3.0], [2.0, 4.0]]
    """
    if is_torch(payload):
        p, s = check_decode_input_torch(payload, scales, name)
        if out is not None and not is_torch(out):
            raise MXFP8Error(f"tensor {name!r}: out must be a torch tensor for torch input")
        if p.device.type != "cpu" or (out is not None and out.device.type != "cpu"):
            result = decode_mxfp8_torch(p, s, dtype=dtype, name=name, transpose=transpose)
            return result if out is None else _copy_into(out, result, name)
        np_out = None if out is None else _torch_out_view(out, name)
        decoded = _decode_numpy_dispatch(cpu_tensor_view(p), cpu_tensor_view(s), dtype, name, np_out, transpose, team)
        return out if out is not None else numpy_to_torch(decoded)
    if out is not None and not isinstance(out, np.ndarray):
        raise MXFP8Error(f"tensor {name!r}: out must be a numpy array for numpy input")
    return _decode_numpy_dispatch(payload, scales, dtype, name, out, transpose, team)


def decode_mxfp8_split(
    payload: ArrayLike,
    scales: ArrayLike,
    out: ArrayLike,
    *,
    pool: Any,
    parts: int,
    transpose: bool = False,
    name: str | None = None,
) -> None:
    """:func:`decode_mxfp8` into ``out`` in up to ``parts`` disjoint pieces, all but the first on
    ``pool`` (a ``concurrent.futures`` executor); returns when every piece is done.

    The bits are those of one call (every value depends only on its own code and block scale), in
    about ``1/parts`` of the time: the native kernel releases the GIL. The pieces are row ranges of
    a 2-D payload and of ``out``, or, with ``transpose``, block-aligned column ranges of the payload
    (row ranges of the ``[C, R]`` ``out``). numpy arrays, or CPU torch tensors (viewed as numpy,
    no copy; ``out`` contiguous float32 / bfloat16). A payload of fewer than
    :data:`SPLIT_MIN_VALUES` values, not 2-D, or ``parts <= 1`` is decoded in one call.
    """
    if is_torch(payload):
        payload, scales = cpu_tensor_view(payload), cpu_tensor_view(scales)
        out = _torch_out_view(out, name)
    if parts <= 1 or payload.ndim != 2 or payload.size < SPLIT_MIN_VALUES:
        decode_mxfp8(payload, scales, dtype=out.dtype, name=name, out=out, transpose=transpose)
        return
    rows = payload.shape[1] if transpose else payload.shape[0]
    unit = 32 if transpose else 1  # columns split only at block boundaries
    step = -(-rows // (parts * unit)) * unit
    pieces = []
    for a in range(0, rows, step):
        b = min(rows, a + step)
        if transpose:
            pieces.append((payload[:, a:b], scales[:, a // 32 : -(-b // 32)], out[a:b]))
        else:
            pieces.append((payload[a:b], scales[a:b], out[a:b]))
    futures = [
        pool.submit(decode_mxfp8, p, sc, dtype=o.dtype, name=name, out=o, transpose=transpose)
        for p, sc, o in pieces[1:]
    ]
    try:
        p, sc, o = pieces[0]
        decode_mxfp8(p, sc, dtype=o.dtype, name=name, out=o, transpose=transpose)
    finally:
        for f in futures:
            f.result()
