"""Pure-PyTorch reference of every nvfp4_cuda op: the oracle for the CUDA kernels and the CPU backend.

NVFP4 quantization follows NVIDIA Transformer Engine's exact order of float32 operations
(``core_nvfp4.cuh`` / ``reference_nvfp4.py``), so block scales and codes are reproducible bit for bit::

    amax   = max |x|                                    (after the optional Hadamard transform)
    S_enc  = 2688 / amax        -> FLT_MAX if it overflows; 1.0 if amax == 0 or S_enc == 0
    S_dec  = 1 / S_enc                                  (stored as ``tensor_scale``, decode direction)
    sf     = e4m3_rne( min(block_amax * (S_enc * fp32(1/6)), 448) )
    enc    = min( 1 / (sf * S_dec), FLT_MAX )           (zero block: sf = 0 -> enc = FLT_MAX -> codes 0)
    code   = e2m1_satfinite( x * enc )                  (RNE, or stochastic rounding for gradients)

Each line is one IEEE float32 operation (no fused multiply-add), which the CUDA kernels reproduce with
``__fmul_rn`` / ``__fdiv_rn``.  ``block_amax`` is the max over 16 consecutive elements (1x16) or over
the 16x16 tile (``block_2d``; the tile's scale is repeated for its 16 rows).

GEMM (``C[M,N] = A[M,K] B[N,K]^T``) is Transformer Engine's ``qgemm`` formula,
``C = alpha * sum_k (q_a sf_a)(q_b sf_b)`` with ``alpha = S_dec_a * S_dec_b`` applied to the float32
accumulator in the epilogue.  Implementation: each operand is decoded once to float32 ``q * sf``
(exact: at most 2 + 4 = 6 significant bits), then ONE float32 ``torch.matmul`` accumulates.  Every
product of two decoded values has at most 12 significant bits and is exact in float32, so the only
rounding is in the float32 accumulation, whose order PTX leaves unspecified for the tensor-core
paths too (TE's reference loops over 16-blocks; we fold the block scales into the operands, which
is the same mathematical sum).  Whenever all partial sums are exactly representable (small integer
codes, power-of-two scales, modest K) CPU, emulated-CUDA and native-sm120a results are identical.
Folding the scales into one matmul (instead of a loop over K/16 blocks) keeps the CPU cost at about
one float32 GEMM plus O(MK + NK) decode work.

The 16-point random Hadamard transform is ``x' = x diag(s) H16 / 4`` per 16-element group along the
last axis (Sylvester H16, TE's fixed sign vector ``s``), computed as a fixed 4-stage butterfly
(strides 1, 2, 4, 8) so the float32 additions happen in the same order on every backend.

NVFP4 from an MXFP8 master (:func:`quantize_nvfp4_from_mxfp8`) decodes the master exactly to float32
and quantizes that. The master's own ops (Lion, bfloat16 stochastic rounding) live in
:mod:`nvfp4_cuda.reference_master` and are re-exported here, so this module is the oracle of every op;
MXFP8 encode/decode themselves are ``mxfp8_codec``'s (``encode_mxfp8_torch`` / ``decode_mxfp8_torch``
are the pure-PyTorch oracle).

The argument checks (:func:`check_matrix`, :func:`check_rounding`, :func:`check_gemm_operands`) are
public: :mod:`nvfp4_cuda.api` and :mod:`nvfp4_cuda.cuda_ops` run the native paths behind the same checks.
"""

from __future__ import annotations

import torch

from mxfp8_codec.numerics_torch import decode_mxfp8_torch
from mxfp8_codec.rng import rand24_like
from nvfp4_cuda.formats import (
    E4M3_MAX,
    FLT_MAX,
    HADAMARD_SIGNS,
    NVFP4_BLOCK,
    NVFP4_ENCODE_NUMERATOR,
    ONE_SIXTH_F32,
    e2m1_decode_table,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    pack_nibbles,
)
from nvfp4_cuda.reference_master import lion_step_mxfp8_, stochastic_round_to_bf16_
from nvfp4_cuda.tensor import NVFP4Tensor

__all__ = [
    "NVFP4Tensor",
    "check_gemm_operands",
    "check_matrix",
    "check_rounding",
    "decode_scaled",
    "dequantize_nvfp4",
    "gemm_decoded",
    "hadamard16",
    "lion_step_mxfp8_",
    "nvfp4_matmul",
    "nvfp4_scales",
    "quantize_nvfp4",
    "quantize_nvfp4_from_mxfp8",
    "stochastic_round_to_bf16_",
]

ROUNDING_MODES = ("rne", "stochastic")


def _f32(v: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32, device=device)


def check_matrix(x: torch.Tensor, what: str, *, transpose: bool = False) -> None:
    """``x`` must be a floating 2-D tensor [R, C] with C % 16 == 0 (TypeError / ValueError naming ``what``).

    ``transpose``: ``x`` is quantized as :func:`transpose_padded` ``(x)``, so any R and C will do.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{what}: expected a 2-D tensor [R, C], got shape {list(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{what}: expected a floating tensor, got {x.dtype}")
    if x.shape[1] % NVFP4_BLOCK and not transpose:
        raise ValueError(f"{what}: last dimension {x.shape[1]} is not a multiple of {NVFP4_BLOCK}")


def padded_to_block(n: int) -> int:
    """``n`` rounded up to a multiple of the 16-element block."""
    return -(-n // NVFP4_BLOCK) * NVFP4_BLOCK


def transpose_padded(x: torch.Tensor) -> torch.Tensor:
    """``x.T`` [C, R'] contiguous, R' = R rounded up to 16 with zero columns: what ``transpose=True`` quantizes.

    The weight-gradient operands ``X^T`` and ``dY^T`` of a linear layer, blocks along the token axis (zero
    tokens add nothing to the GEMM's sum).  The CUDA quantizer reads ``x`` in place instead (no copy).
    """
    r, c = x.shape
    out = x.new_zeros(c, padded_to_block(r))
    out[:, :r] = x.t()
    return out


def check_rounding(rounding: str, what: str) -> None:
    """``rounding`` must be one of :data:`ROUNDING_MODES` (ValueError naming ``what``)."""
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"{what}: rounding must be one of {ROUNDING_MODES}, got {rounding!r}")


def hadamard16(x: torch.Tensor) -> torch.Tensor:
    """16-point random Hadamard transform along the last axis: ``x diag(s) H16 / 4`` per 16 elements.

    Orthonormal, so applying it to both operands of a GEMM along the shared K axis leaves the exact
    product unchanged while spreading outliers across each 16-block.  Returns float32.

    Example:
        >>> x = torch.randn(4, 32)
        >>> y = hadamard16(x)
        >>> bool(torch.allclose((y.view(4, 2, 16) ** 2).sum(-1), (x.view(4, 2, 16) ** 2).sum(-1)))
        True
    """
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"hadamard16: last dimension {x.shape[-1]} is not a multiple of {NVFP4_BLOCK}")
    lead = x.shape[:-1]
    signs = torch.tensor(HADAMARD_SIGNS, dtype=torch.float32, device=x.device)
    y = x.to(torch.float32).reshape(-1, 16) * signs
    h = 1
    while h < 16:
        y = y.view(-1, 16 // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, 16)
        h *= 2
    return (y * 0.25).reshape(*lead, x.shape[-1])


def nvfp4_scales(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor encode/decode scales ``(S_enc, S_dec)`` from a float32 amax (TE's guards included)."""
    amax = amax.to(torch.float32)
    s_enc = _f32(NVFP4_ENCODE_NUMERATOR, amax.device) / amax
    s_enc = torch.clamp(s_enc, max=FLT_MAX)
    s_enc = torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    s_dec = torch.ones_like(s_enc) / s_enc
    return s_enc, s_dec


def _block_amax(x: torch.Tensor, block_2d: bool) -> torch.Tensor:
    """Block amax [R, C/16] of |x| for x [R, C] (2-D: the 16x16 tile max, repeated per row).

    One pass with ``aminmax`` (max(|x|) = max(max x, -min x)); NaN propagates, so the caller's
    finiteness check on the global amax catches it.
    """
    r, c = x.shape
    lo, hi = torch.aminmax(x.view(r, c // NVFP4_BLOCK, NVFP4_BLOCK), dim=-1)
    bam = torch.maximum(hi, -lo).abs()  # .abs(): an all -0.0 block must give +0.0
    if not block_2d:
        return bam
    pad = (-r) % NVFP4_BLOCK
    if pad:
        bam = torch.cat((bam, bam.new_zeros(pad, bam.shape[1])), dim=0)
    tiles = bam.view(-1, NVFP4_BLOCK, bam.shape[1]).amax(dim=1)  # [ceil(R/16), C/16]
    return tiles.repeat_interleave(NVFP4_BLOCK, dim=0)[:r]


def quantize_nvfp4(
    x: torch.Tensor,
    *,
    block_2d: bool = False,
    rounding: str = "rne",
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
    hadamard: bool = False,
    transpose: bool = False,
) -> NVFP4Tensor:
    """Quantize a 2-D float tensor [R, C] (C % 16 == 0) to NVFP4, blocks along the last axis.

    Args:
        x: float32/bfloat16/float16 tensor [R, C], finite.
        block_2d: share each block scale over a 16x16 tile (weights) instead of 1x16 (activations).
        rounding: ``"rne"`` or ``"stochastic"`` (counter RNG keyed by seed, step, tensor_id, index).
        seed, step, tensor_id: the stochastic-rounding stream key (ignored for RNE).
        hadamard: apply :func:`hadamard16` along the last axis first (weight-gradient GEMM operands).
        transpose: quantize :func:`transpose_padded` ``(x)`` [C, R'] (any R and C): blocks along x's first axis.

    Returns:
        NVFP4Tensor with codes [R, C/2], block_scales [R, C/16], tensor_scale = S_dec.

    Raises:
        ValueError: wrong rank/dtype/shape, unknown rounding, or a non-finite input element.

    Example:
        >>> x = torch.tensor([[0.0, 1.0, -2.0, 3.0] * 4])
        >>> q = quantize_nvfp4(x)
        >>> [round(v, 4) for v in dequantize_nvfp4(q)[0, :4].tolist()]
        [0.0, 1.0, -2.0, 3.0]
    """
    check_matrix(x, "quantize_nvfp4", transpose=transpose)
    check_rounding(rounding, "quantize_nvfp4")
    if transpose:
        x = transpose_padded(x)
    x32 = hadamard16(x) if hadamard else x.to(torch.float32).contiguous()
    r, c = x32.shape
    bam = _block_amax(x32, block_2d)
    amax = bam.max() if bam.numel() else torch.zeros((), dtype=torch.float32, device=x.device)
    if not torch.isfinite(amax):
        bad = (~torch.isfinite(x32)).nonzero()[0].tolist()
        raise ValueError(f"quantize_nvfp4: non-finite input at index {bad} (value {x32[bad[0], bad[1]].item()})")
    s_enc, s_dec = nvfp4_scales(amax)
    sf_f = torch.clamp(bam * (s_enc * _f32(ONE_SIXTH_F32, x.device)), max=E4M3_MAX)
    sf_bits = e4m3_encode(sf_f)  # RNE (sf_f >= 0, so the sign bit is clear)
    sf = e4m3_decode(sf_bits)
    enc = torch.clamp(torch.ones_like(sf) / (sf * s_dec), max=FLT_MAX)
    v = (x32.view(r, c // NVFP4_BLOCK, NVFP4_BLOCK) * enc.unsqueeze(-1)).view(r, c)
    rand = rand24_like((r, c), seed, step, tensor_id, device=x.device) if rounding == "stochastic" else None
    codes = e2m1_encode(v, rand)
    return NVFP4Tensor(
        codes=pack_nibbles(codes), block_scales=sf_bits, tensor_scale=s_dec.reshape(()), shape=(r, c), block_2d=block_2d
    )


def quantize_nvfp4_from_mxfp8(
    payload: torch.Tensor,
    scales: torch.Tensor,
    *,
    block_2d: bool = True,
    rounding: str = "rne",
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
    hadamard: bool = False,
    transpose: bool = False,
) -> NVFP4Tensor:
    """NVFP4-quantize a 2-D MXFP8 tensor (decoded exactly to float32 first; optionally its transpose).

    ``transpose=True`` quantizes ``decode(payload, scales).T`` - with the trainer's master stored
    [in, out] this gives the forward GEMM operand W [out, in] directly.
    """
    if payload.dim() != 2:
        raise ValueError(f"quantize_nvfp4_from_mxfp8: expected a 2-D payload, got shape {list(payload.shape)}")
    w = decode_mxfp8_torch(payload, scales, dtype=torch.float32)
    if transpose:
        w = w.t().contiguous()
    return quantize_nvfp4(
        w, block_2d=block_2d, rounding=rounding, seed=seed, step=step, tensor_id=tensor_id, hadamard=hadamard
    )


_PAIR_TABLES: dict[str, torch.Tensor] = {}


def _byte_pair_table(device: torch.device) -> torch.Tensor:
    """[256, 2] float32: the two E2M1 values (low nibble first) of every code byte."""
    key = str(device)
    if key not in _PAIR_TABLES:
        vals = e2m1_decode_table(torch.float32, device)
        b = torch.arange(256, device=device)
        _PAIR_TABLES[key] = torch.stack((vals[b & 0xF], vals[b >> 4]), dim=-1)
    return _PAIR_TABLES[key]


def decode_scaled(q: NVFP4Tensor) -> torch.Tensor:
    """Decode to float32 ``e2m1 * e4m3(block scale)`` WITHOUT the tensor scale (exact values)."""
    r, c = q.shape
    vals = _byte_pair_table(q.codes.device).index_select(0, q.codes.reshape(-1).to(torch.int32))  # [R*C/2, 2]
    sf = e4m3_decode(q.block_scales)  # [R, C/16]
    return (vals.view(r, c // NVFP4_BLOCK, NVFP4_BLOCK) * sf.unsqueeze(-1)).view(r, c)


def dequantize_nvfp4(q: NVFP4Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode an NVFP4Tensor: ``(e2m1 * sf)`` exactly, times ``tensor_scale`` in float32, cast to dtype."""
    return (decode_scaled(q) * q.tensor_scale).to(dtype)


def check_gemm_operands(a: NVFP4Tensor, b: NVFP4Tensor) -> None:
    """``a`` [M, K] and ``b`` [N, K] must be NVFP4Tensors with the same K (TypeError / ValueError)."""
    if not isinstance(a, NVFP4Tensor) or not isinstance(b, NVFP4Tensor):
        raise TypeError("nvfp4_matmul: a and b must be NVFP4Tensor")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"nvfp4_matmul: contraction mismatch, a is {list(a.shape)} and b is {list(b.shape)} "
            "(computes a @ b.T: both are [*, K])"
        )


def nvfp4_matmul(
    a: NVFP4Tensor,
    b: NVFP4Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    backend: str = "reference",
) -> torch.Tensor:
    """``C[M, N] = A[M, K] @ B[N, K]^T`` with float32 accumulation and tensor scales in the epilogue.

    Epilogue (float32): ``y = acc * (S_dec_a * S_dec_b)``; with ``accumulate``, ``y = y + float(out)``;
    then one cast to ``out_dtype`` (or ``out.dtype``).

    Args:
        a: NVFP4Tensor [M, K].  b: NVFP4Tensor [N, K].
        out_dtype: result dtype when ``out`` is None (bfloat16 or float32).
        out: optional [M, N] tensor written in place (and read when ``accumulate``).
        accumulate: add the product to ``out``.
        backend: ignored by the reference (accepted for signature compatibility).

    Example:
        >>> x, w = torch.randn(8, 64), torch.randn(32, 64)
        >>> y = nvfp4_matmul(quantize_nvfp4(x), quantize_nvfp4(w, block_2d=True))
        >>> tuple(y.shape), y.dtype
        ((8, 32), torch.bfloat16)
    """
    del backend
    check_gemm_operands(a, b)
    if accumulate and out is None:
        raise ValueError("nvfp4_matmul: accumulate=True needs out=")
    m, n = a.shape[0], b.shape[0]
    if out is not None and tuple(out.shape) != (m, n):
        raise ValueError(f"nvfp4_matmul: out has shape {list(out.shape)}, expected {[m, n]}")
    return gemm_decoded(
        decode_scaled(a),
        decode_scaled(b),
        a.tensor_scale,
        b.tensor_scale,
        out_dtype=out_dtype,
        out=out,
        accumulate=accumulate,
    )


def gemm_decoded(
    da: torch.Tensor,
    db: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """The float32 GEMM + epilogue of :func:`nvfp4_matmul` on decoded ``q * sf`` operands [M, K] and [N, K].

    ``y = (da @ db.T) * (a_scale * b_scale)`` in float32 (``+ float(out)`` with ``accumulate``), one cast.
    Operands are taken in float32 and ``db`` contiguous, whatever view is passed: the same GEMM call, hence
    the same float32 summation order, as when the decoded operands are materialised row-major.
    """
    if da.shape[1] != db.shape[1]:
        raise ValueError(f"gemm_decoded: contraction mismatch, da is {list(da.shape)} and db is {list(db.shape)}")
    acc = torch.matmul(da.to(torch.float32), db.to(torch.float32).contiguous().t())
    y = acc * (a_scale * b_scale)
    if accumulate:
        assert out is not None
        y = y + out.to(torch.float32)
    if out is None:
        return y.to(out_dtype)
    out.copy_(y.to(out.dtype))
    return out
