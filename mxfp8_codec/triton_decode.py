"""MXFP8 decode as one Triton kernel: E4M3 payload + UE8M0 block scales -> bfloat16 / float32, in the
payload's layout or transposed, bit for bit the codec's decode (:func:`mxfp8_codec.decode_mxfp8`); and a
linear layer whose weight is decoded inside its GEMM tiles to the same values (:func:`linear_mxfp8_triton`).

What :func:`mxfp8_codec.hf_modules.decode_into` runs on CUDA tensors (an ``MXFP8Linear`` forward decodes
its weight with it) when Triton is importable and the payload is whole 32-value blocks: one pass that
reads each code byte and each scale byte once and writes each output value once, where the torch-op
decode needs a cast, a factor tensor and a multiply (three kernels, the output written twice).

Numerics, per element (code ``q``, its block's scale byte ``s``), exact for every ``(q, s)`` pair:

* ``|e4m3(q)|`` as float32, exactly: a normal code (exponent field >= 1) is the float32 with bits
  ``((q & 0x7F) << 20) + (120 << 23)`` (the E4M3 exponent re-biased from 7 to 127, the three mantissa
  bits moved to the top of float32's 23); a subnormal code ``m = q & 0x7F < 8`` is ``float(m) * 2^-9``
  (an integer below 8 and a power of two: exact).
* ``2^(s - 127)`` as float32, exactly: the bits ``s << 23`` for ``s >= 1`` (a normal power of two),
  ``0x00400000`` (the subnormal ``2^-127``) for ``s == 0``.
* one float32 multiply of the two: the true product ``M * 2^E`` (``M < 16``) is a float32 normal or
  subnormal (the smallest, ``2^-9 * 2^-127 = 2^-136``, is above float32's ``2^-149``), so the multiply
  is exact, or it overflows to +inf (the codec's rule: the exact value rounded once to the output
  format). This needs a multiply that keeps subnormals (IEEE; no flush-to-zero): Triton compiles ``*``
  on float32 to ``mul.rn.f32`` without ``.ftz`` (its ``enable_reflect_ftz`` touches libdevice only).
* the sign bit of ``q`` OR-ed into bit 31 (so ``-0`` stays ``-0``); NaN (code ``0x7F``/``0xFF`` or
  ``s == 0xFF``) becomes the canonical quiet NaN ``0x7FC00000``.
* bfloat16: the float32 bits rounded to nearest even in integers
  (``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``, exact for subnormals; NaN becomes ``0x7FC0``).

The kernel stores those bits through an int32 / int16 view of ``out``: no float conversion touches the
result. Tiles are ``BLOCK_R`` rows x ``BLOCK_C`` columns of the payload (``BLOCK_C`` a multiple of 32,
so a tile holds whole blocks and their scales are loaded once per block); with ``transpose`` the tile is
written into ``out[C, R]`` (Triton stages it through shared memory so both sides stay coalesced).

Tested exhaustively (every code byte x every scale byte, both output dtypes, both layouts, odd shapes)
in Triton's interpreter on the CPU (``TRITON_INTERPRET=1``, tests/mxfp8_codec/test_triton_decode.py);
the GPU test compares the CUDA path with the CPU decode. Triton is optional: this module imports without
it (:data:`AVAILABLE` is then False and :func:`decode_mxfp8_triton` raises).
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

from .constants import (
    BF16_CANONICAL_NAN,
    BLOCK_SIZE,
    E4M3_BIAS,
    E4M3_MIN_SUBNORMAL,
    E4M3_NAN_MAG,
    E8M0_NAN,
    F32_CANONICAL_NAN,
)
from .errors import MXFP8Error

if TYPE_CHECKING:
    import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # triton ships with CUDA builds of torch; the CPU build and the codec work without it
    triton = None
    tl = None

__all__ = [
    "AVAILABLE",
    "BLOCK_C",
    "BLOCK_R",
    "MAX_COLUMN_TILES",
    "NUM_WARPS",
    "decode_mxfp8_triton",
    "linear_mxfp8_triton",
]

AVAILABLE = triton is not None  # whether this module can launch its kernel

# Tile shapes (payload rows x payload columns), per layout; BLOCK_C is a multiple of 32 (whole blocks).
# Chosen for ~32 values per thread at 4 warps; not yet tuned on a GPU.
BLOCK_R = {False: 16, True: 64}
BLOCK_C = {False: 256, True: 64}
NUM_WARPS = 4
MAX_COLUMN_TILES = 65535  # CUDA's limit on the grid's second dimension (column tiles)

if triton is not None:
    # the format's constants, as Triton takes globals into a kernel
    _F32_NAN = tl.constexpr(F32_CANONICAL_NAN)  # 0x7FC00000
    _BF16_NAN = tl.constexpr(BF16_CANONICAL_NAN)  # 0x7FC0
    _E4M3_NAN = tl.constexpr(E4M3_NAN_MAG)  # 0x7F: code 0x7F / 0xFF
    _SCALE_NAN = tl.constexpr(E8M0_NAN)  # 0xFF
    _REBIAS = tl.constexpr((127 - E4M3_BIAS) << 23)  # E4M3 exponent field -> float32's
    _E4M3_SUB = tl.constexpr(E4M3_MIN_SUBNORMAL)  # 2^-9: subnormal codes are m * 2^-9
    _POW2_M127 = tl.constexpr(0x00400000)  # float32 bits of 2^-127 (scale byte 0), a subnormal
    _BLOCK = tl.constexpr(BLOCK_SIZE)  # 32

    @triton.jit
    def _bf16_rne(bits):
        """float32 bits (int32) -> the bfloat16 bits (int32) rounded to nearest even, in integers: exact for
        subnormals, on every backend (Triton's interpreter casts float32 to bfloat16 by truncation). A NaN's
        low bits may carry into its exponent: callers put a canonical NaN there."""
        u = bits.to(tl.uint32, bitcast=True)
        return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).to(tl.int32)

    @triton.jit
    def _decoded_bits(q, s, BF16: tl.constexpr):
        """E4M3 codes ``q`` times ``2^(s - 127)``, ``s`` their UE8M0 scale bytes (both int32; ``s`` broadcastable
        to ``q``, e.g. one per block, so that the scale's arithmetic runs once per block): the output's bits,
        int16 (bfloat16) or int32 (float32), exactly the codec's decode (the module docstring's steps)."""
        scale = tl.where(s == 0, _POW2_M127, s << 23).to(tl.float32, bitcast=True)  # 2^(s - 127), exact
        mag = q & 0x7F
        normal = ((mag << 20) + _REBIAS).to(tl.float32, bitcast=True)  # exact for mag >= 8
        sub = mag.to(tl.float32) * _E4M3_SUB  # mag * 2^-9: exact for mag < 8
        value = tl.where(mag >= 8, normal, sub) * scale  # one rounding: exact or +inf
        bits = value.to(tl.int32, bitcast=True) | ((q & 0x80) << 24)
        nan = (mag == _E4M3_NAN) | (s == _SCALE_NAN)
        if BF16:
            return tl.where(nan, _BF16_NAN, _bf16_rne(bits)).to(tl.int16)
        else:
            return tl.where(nan, _F32_NAN, bits)

    @triton.jit
    def _gemm_weight(q, s, HW_FP8: tl.constexpr):
        """E4M3 codes ``q`` (uint8) times ``2^(s - 127)`` (``s``: their scale bytes, uint8, broadcastable to ``q``:
        one per block, so that the scale's steps run once per block) as bfloat16, for a GEMM operand: the
        values of :func:`_decoded_bits` (NaN for a NaN code or scale byte, any NaN bits) in fewer steps. The 7
        magnitude bits shifted into a float16's exponent and mantissa (``mag << 7``, the sign to bit 15) are
        the E4M3 value times 2^-8 for every code, subnormals included (both formats put 3 mantissa bits under
        the exponent, biases 7 and 15); ``* 256`` in float16 gives the E4M3 value exactly (every one is a
        float16), float16 -> float32 is exact, and ``* 2^(s - 127)`` applies the scale (exact or +-inf, as in the
        codec); then one RNE to bfloat16 (exact but for underflow, as the codec's bfloat16 decode). With ``HW_FP8``
        (compiled for a GPU) the first steps are the hardware's E4M3 -> float16 conversion and the last its
        bfloat16 one: about 10.5 instructions per weight in the GEMM's loop where the integer steps took 22 (sm_90
        SASS, 64-row tiles); without (Triton's interpreter: the tests) the bit steps, rounding in integers."""
        if HW_FP8:  # a GPU (sm_89+): one cvt.rn.f16x2.e4m3x2 per two codes (exact; NaN codes give NaN)
            half = q.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        else:
            qi = q.to(tl.int32)
            half = (((qi & 0x80) << 8) | ((qi & 0x7F) << 7)).to(tl.int16).to(tl.float16, bitcast=True) * 256.0
        si = s.to(tl.int32)
        scale = tl.where(si == 0, _POW2_M127, si << 23).to(tl.float32, bitcast=True)  # 2^(s - 127), exact
        scale = tl.where(si == _SCALE_NAN, float("nan"), scale)
        value = half.to(tl.float32) * scale
        if HW_FP8:
            w = value.to(tl.bfloat16)  # cvt.rn.bf16x2.f32
        else:  # the interpreter's float32 -> bfloat16 cast truncates: round in integers
            bits = _bf16_rne(value.to(tl.int32, bitcast=True))
            w = tl.where((qi & 0x7F) == _E4M3_NAN, _BF16_NAN, bits).to(tl.int16).to(tl.bfloat16, bitcast=True)
        return w

    @triton.jit
    def _decode_kernel(
        p_ptr,  # uint8 [R, C]
        s_ptr,  # uint8 [R, C / 32]
        o_ptr,  # int32 (float32 bits) or int16 (bfloat16 bits): [R, C], or [C, R] with TRANSPOSE
        R,
        C,
        TRANSPOSE: tl.constexpr,
        BF16: tl.constexpr,
        WIDE: tl.constexpr,  # 64-bit offsets (R * C >= 2^31)
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        NBLK: tl.constexpr = BLOCK_C // _BLOCK
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        blocks = tl.program_id(1) * NBLK + tl.arange(0, NBLK)  # block index along the row
        lanes = tl.arange(0, _BLOCK)
        if WIDE:
            rows = rows.to(tl.int64)
            blocks = blocks.to(tl.int64)
        nb = C // _BLOCK
        row_ok = rows < R
        # the block's scale: loaded once per block, [BLOCK_R, NBLK]
        s_mask = row_ok[:, None] & (blocks < nb)[None, :]
        s = tl.load(s_ptr + rows[:, None] * nb + blocks[None, :], mask=s_mask, other=127).to(tl.int32)
        # the codes: [BLOCK_R, NBLK, 32]
        cols = blocks[None, :, None] * _BLOCK + lanes[None, None, :]
        mask = row_ok[:, None, None] & (cols < C)
        q = tl.load(p_ptr + rows[:, None, None] * C + cols, mask=mask, other=0).to(tl.int32)
        out = _decoded_bits(q, s[:, :, None], BF16)
        if TRANSPOSE:
            tl.store(o_ptr + cols * R + rows[:, None, None], out, mask=mask)
        else:
            tl.store(o_ptr + rows[:, None, None] * C + cols, out, mask=mask)

    @triton.jit
    def _linear_kernel(
        x_ptr,  # bfloat16 [M, K], contiguous
        p_ptr,  # uint8: [K, N] (IN_OUT, blocks of 32 along N) or [N, K] (blocks along K)
        s_ptr,  # uint8: [K, N / 32] or [N, K / 32]
        b_ptr,  # bfloat16 [N] (HAS_BIAS; else not read)
        y_ptr,  # SPLIT_K == 1: int16 [M, N], the bfloat16 result's bits; else float32 [SPLIT_K, M, N] partial sums
        M,
        N,
        K: tl.constexpr,  # a compile-time constant (one per projection shape), so the loop's bound is one too
        IN_OUT: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        WIDE: tl.constexpr,  # 64-bit offsets
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr,  # program_id(2) sums K tiles [s * TILES, (s + 1) * TILES) of K's tiles
        TILES: tl.constexpr,
        F32_DOT: tl.constexpr,  # Triton's interpreter: the products in float32 (see linear_mxfp8_triton)
    ):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        if WIDE:
            rm = rm.to(tl.int64)
            rn = rn.to(tl.int64)
        m_ok = rm < M
        n_ok = rn < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        lanes = tl.arange(0, _BLOCK)
        for t in range(TILES):
            k0 = (tl.program_id(2) * TILES + t) * BLOCK_K
            rk = k0 + tl.arange(0, BLOCK_K)
            if WIDE:
                rk = rk.to(tl.int64)
            k_ok = rk < K
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            # the weight's tile decoded in registers to the codec's bfloat16 values (_gemm_weight); padding is code 0
            # with scale 2^0
            if IN_OUT:  # [BLOCK_K, BLOCK_N]: blocks along N, [BLOCK_K, NB, 32] with one scale byte per block
                NBN: tl.constexpr = BLOCK_N // _BLOCK
                bl = tl.program_id(1) * NBN + tl.arange(0, NBN)
                cols = bl[None, :, None] * _BLOCK + lanes[None, None, :]
                q = tl.load(p_ptr + rk[:, None, None] * N + cols, mask=k_ok[:, None, None] & (cols < N), other=0)
                s_ok = k_ok[:, None] & (bl < N // _BLOCK)[None, :]
                s = tl.load(s_ptr + rk[:, None] * (N // _BLOCK) + bl[None, :], mask=s_ok, other=127)
                w = tl.reshape(_gemm_weight(q, s[:, :, None], not F32_DOT), (BLOCK_K, BLOCK_N))
            else:  # [BLOCK_N, BLOCK_K]: blocks along K, transposed for the dot
                NBK: tl.constexpr = BLOCK_K // _BLOCK
                bl = k0 // _BLOCK + tl.arange(0, NBK)
                cols = bl[None, :, None] * _BLOCK + lanes[None, None, :]
                q = tl.load(p_ptr + rn[:, None, None] * K + cols, mask=n_ok[:, None, None] & (cols < K), other=0)
                s_ok = n_ok[:, None] & (bl < K // _BLOCK)[None, :]
                s = tl.load(s_ptr + rn[:, None] * (K // _BLOCK) + bl[None, :], mask=s_ok, other=127)
                w = tl.trans(tl.reshape(_gemm_weight(q, s[:, :, None], not F32_DOT), (BLOCK_N, BLOCK_K)))
            if F32_DOT:
                acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
        out = rm[:, None] * N + rn[None, :]
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            y = tl.where(acc != acc, _BF16_NAN, _bf16_rne(acc.to(tl.int32, bitcast=True))).to(tl.int16)
            tl.store(y_ptr + out, y, mask=m_ok[:, None] & n_ok[None, :])
        else:
            tl.store(y_ptr + tl.program_id(2) * (M * N) + out, acc, mask=m_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _split_sum_kernel(
        part_ptr,  # float32 [SPLIT_K, M * N]
        b_ptr,  # bfloat16 [N] (HAS_BIAS)
        y_ptr,  # int16 [M * N]: the bfloat16 result's bits
        MN,
        N,
        SPLIT_K: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """The split-K partial sums added in split order (fixed: the same bits every run), the bias, one rounding."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < MN
        acc = tl.load(part_ptr + i, mask=ok, other=0.0)
        for j in range(1, SPLIT_K):
            acc += tl.load(part_ptr + j * MN + i, mask=ok, other=0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + i % N, mask=ok, other=0.0).to(tl.float32)
        y = tl.where(acc != acc, _BF16_NAN, _bf16_rne(acc.to(tl.int32, bitcast=True))).to(tl.int16)
        tl.store(y_ptr + i, y, mask=ok)


def _check_weight(payload: Any, scales: Any, who: str) -> None:
    """MXFP8Error naming ``who`` and the shapes when payload and scales are not whole blocks the kernels take."""
    import torch

    for what, t in (("payload", payload), ("scales", scales)):
        if not isinstance(t, torch.Tensor):
            raise MXFP8Error(f"{who}: {what} must be a torch tensor, got {type(t).__name__}")
    if payload.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise MXFP8Error(
            f"{who}: payload and scales must be uint8 (or float8_e4m3fn / float8_e8m0fnu), "
            f"got {payload.dtype} and {scales.dtype}"
        )
    if payload.dim() != 2:
        raise MXFP8Error(f"{who}: payload must be 2-D [R, C], got shape {tuple(payload.shape)}")
    rows, cols = payload.shape
    if cols % BLOCK_SIZE:
        raise MXFP8Error(
            f"{who}: payload shape {tuple(payload.shape)} has a partial block ({cols} columns is not a multiple "
            f"of {BLOCK_SIZE}); decode it with mxfp8_codec.decode_mxfp8"
        )
    if tuple(scales.shape) != (rows, cols // BLOCK_SIZE):
        raise MXFP8Error(
            f"{who}: scales shape {tuple(scales.shape)} does not match payload shape {tuple(payload.shape)}; "
            f"expected {(rows, cols // BLOCK_SIZE)} (one per {BLOCK_SIZE} along the last axis)"
        )
    for what, t in (("payload", payload), ("scales", scales)):
        if not t.is_contiguous():
            raise MXFP8Error(f"{who}: {what} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")


def _check(payload: Any, scales: Any, out: Any, transpose: bool, name: str | None) -> None:
    """MXFP8Error naming the op, the tensor and the shapes when the input is not what the kernel takes."""
    import torch

    who = f"decode_mxfp8_triton: tensor {name!r}" if name else "decode_mxfp8_triton"
    _check_weight(payload, scales, who)
    if not isinstance(out, torch.Tensor):
        raise MXFP8Error(f"{who}: out must be a torch tensor, got {type(out).__name__}")
    rows, cols = payload.shape
    want = (cols, rows) if transpose else (rows, cols)
    if out.dtype not in (torch.float32, torch.bfloat16) or tuple(out.shape) != want:
        raise MXFP8Error(
            f"{who}: out must be float32 or bfloat16 of shape {want} (payload {tuple(payload.shape)}, "
            f"transpose={transpose}), got {out.dtype} {tuple(out.shape)}"
        )
    if not out.is_contiguous():
        raise MXFP8Error(f"{who}: out must be contiguous, got strides {out.stride()} for shape {tuple(out.shape)}")
    if not (payload.device == scales.device == out.device):
        raise MXFP8Error(
            f"{who}: payload, scales and out must be on one device, got {payload.device}, {scales.device}, {out.device}"
        )
    if out.requires_grad:
        raise MXFP8Error(f"{who}: out must not require grad (decode into .data)")
    if -(-cols // BLOCK_C[transpose]) > MAX_COLUMN_TILES:
        raise MXFP8Error(f"{who}: payload shape {tuple(payload.shape)} has too many columns for one launch")


def decode_mxfp8_triton(
    payload: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    *,
    transpose: bool = False,
    name: str | None = None,
) -> torch.Tensor:
    """Decode MXFP8 into ``out`` with one Triton kernel; the codec's bits (``decode_mxfp8``).

    Args:
        payload: uint8 E4M3 codes ``[R, C]`` (or float8_e4m3fn), contiguous, ``C`` a multiple of 32.
        scales: uint8 UE8M0 bytes ``[R, C / 32]`` (or float8_e8m0fnu), contiguous, same device.
        out: contiguous float32 or bfloat16, ``[R, C]``, or ``[C, R]`` with ``transpose``.
        transpose: write ``out[c, r] = decode(payload[r, c])``: an ``[in, out]`` projection straight into
            nn.Linear's ``[out, in]`` weight.
        name: tensor name, for error messages.

    Returns:
        ``out``. Runs on ``payload``'s CUDA device (on the CPU only under ``TRITON_INTERPRET=1``).

    Raises:
        MXFP8Error: Triton is not installed, or the tensors are not what the kernel takes (dtype, shape,
            partial block, non-contiguous, devices), naming this function and the shapes.
    """
    import torch

    if payload.dtype == torch.float8_e4m3fn:
        payload = payload.view(torch.uint8)
    if scales.dtype == torch.float8_e8m0fnu:
        scales = scales.view(torch.uint8)
    _check(payload, scales, out, transpose, name)
    if not AVAILABLE:
        raise MXFP8Error("decode_mxfp8_triton: triton is not installed (it ships with CUDA builds of torch)")
    rows, cols = payload.shape
    if rows == 0 or cols == 0:
        return out
    bf16 = out.dtype == torch.bfloat16
    bits = out.view(torch.int16 if bf16 else torch.int32)
    br, bc = BLOCK_R[transpose], BLOCK_C[transpose]
    grid = (triton.cdiv(rows, br), triton.cdiv(cols, bc))
    wide = (rows + br) * (cols + bc) >= 2**31  # offsets of the last tile, masked lanes included
    args = (payload, scales, bits, rows, cols)
    meta = {"TRANSPOSE": transpose, "BF16": bf16, "WIDE": wide, "BLOCK_R": br, "BLOCK_C": bc, "num_warps": NUM_WARPS}
    if payload.device.type == "cuda" and payload.device.index != torch.cuda.current_device():
        with torch.cuda.device(payload.device):
            _decode_kernel[grid](*args, **meta)
    else:
        _decode_kernel[grid](*args, **meta)
    return out


# Fused linear tiles (activation rows x weight outputs x reduction), for the few-token forwards it is
# meant for (a decoding step: one row per sequence); not yet tuned on a GPU.  Where the output has fewer tiles
# than twice the multiprocessors, K is split (SPLIT_K runs of whole K tiles, summed by a second kernel in a
# fixed order); the interpreter (tests) counts 4 multiprocessors, so the tests take the split path too.
LINEAR_BLOCK_N = 64
LINEAR_BLOCK_K = 64  # a multiple of 32: whole scale blocks along K for "out_in" weights
LINEAR_NUM_WARPS = 8  # at 4 warps, "out_in" 64-row tiles spilled registers (sm_90, triton 3.9)
LINEAR_NUM_STAGES = 3


def linear_mxfp8_triton(
    x: torch.Tensor,
    payload: torch.Tensor,
    scales: torch.Tensor,
    *,
    orientation: str,
    bias: torch.Tensor | None = None,
    name: str | None = None,
) -> torch.Tensor:
    """``x @ W^T (+ bias)`` in one Triton kernel that decodes the MXFP8 weight ``W`` tile by tile in registers:
    each weight byte is read once from memory and no decoded weight is written, where ``MXFP8Linear``'s
    default forward writes the decoded weight and a BF16 GEMM reads it back (5 bytes moved per weight
    instead of 1.03 when a few activation rows make the GEMM memory-bound).

    Numerics: the weight's values are the codec's BF16 decode (``decode_mxfp8``), bit for bit; the products
    are summed in float32 (``tl.dot``; where the output has few tiles, K is split over CUDA blocks and their
    partial sums added in split order by a second kernel: the same bits on every run of one GPU model) and
    rounded once to BF16, the bias added in float32 before that rounding. The summation order is the kernel's,
    not cuBLAS's: the result equals ``F.linear`` of the decoded weight wherever every partial sum is exact
    (tested), and elsewhere may differ in the last bits, so logits are not bit-identical to
    ``MXFP8Config(dequantize=True)``'s (``MXFP8Linear``'s default is).

    Args:
        x: bfloat16 ``[M, K]`` (activation rows).
        payload, scales: the weight as stored, ``orientation="in_out"``: ``[K, N]`` and ``[K, N / 32]``;
            ``"out_in"``: ``[N, K]`` and ``[N, K / 32]`` (uint8, or float8_e4m3fn / float8_e8m0fnu), whole
            32-value blocks.
        bias: bfloat16 ``[N]`` or None.
        name: tensor name, for error messages.

    Returns:
        bfloat16 ``[M, N]``, on ``x``'s device (CUDA; the CPU only under ``TRITON_INTERPRET=1``).

    Raises:
        MXFP8Error: Triton is not installed, or the tensors are not what the kernel takes, naming this
            function, the tensor and the shapes.
    """
    import torch

    who = f"linear_mxfp8_triton: tensor {name!r}" if name else "linear_mxfp8_triton"
    if payload.dtype == torch.float8_e4m3fn:
        payload = payload.view(torch.uint8)
    if scales.dtype == torch.float8_e8m0fnu:
        scales = scales.view(torch.uint8)
    if orientation not in ("in_out", "out_in"):
        raise MXFP8Error(f"{who}: orientation must be 'in_out' or 'out_in', got {orientation!r}")
    _check_weight(payload, scales, who)  # dtypes, 2-D, whole blocks, scales' shape, contiguity
    k, n = payload.shape if orientation == "in_out" else payload.shape[::-1]
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != k:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise MXFP8Error(
            f"{who}: x must be bfloat16 [M, {k}] for a payload {tuple(payload.shape)} ({orientation}), got {got}"
        )
    if bias is not None and (bias.dtype != torch.bfloat16 or tuple(bias.shape) != (n,)):
        raise MXFP8Error(f"{who}: bias must be bfloat16 [{n}], got {bias.dtype} {tuple(bias.shape)}")
    tensors = [x, payload, scales] + ([bias] if bias is not None else [])
    if len({t.device for t in tensors}) != 1:
        raise MXFP8Error(
            f"{who}: x, payload, scales and bias must be on one device, got {[str(t.device) for t in tensors]}"
        )
    if not AVAILABLE:
        raise MXFP8Error("linear_mxfp8_triton: triton is not installed (it ships with CUDA builds of torch)")
    x = x.contiguous()
    m = x.shape[0]
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.copy_(bias.expand(m, n)) if bias is not None else y.zero_()
    block_m = min(64, max(16, triton.next_power_of_2(m)))  # tl.dot takes at least 16 rows
    grid_mn = triton.cdiv(m, block_m) * triton.cdiv(n, LINEAR_BLOCK_N)
    k_tiles = triton.cdiv(k, LINEAR_BLOCK_K)
    # split K where the output's tiles alone would leave multiprocessors idle (a decoding step's few rows):
    # about two CUDA blocks per multiprocessor, each split summing a run of whole K tiles
    split = max(1, min(k_tiles, -(-2 * _multiprocessors(x.device) // grid_mn)))
    tiles = triton.cdiv(k_tiles, split)
    split = triton.cdiv(k_tiles, tiles)  # no empty split
    if split * m * n >= 2**31:  # (partial sums' offsets in int32; an output that large fills the device anyway)
        split, tiles = 1, k_tiles
    wide = max((m + block_m) * k, (k + LINEAR_BLOCK_K) * (n + LINEAR_BLOCK_N), (m + block_m) * n) >= 2**31
    y_bits = y.view(torch.int16)
    part = y_bits if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    args = (x, payload, scales, bias if bias is not None else y, part, m, n, k)
    meta = {
        "IN_OUT": orientation == "in_out",
        "HAS_BIAS": bias is not None,
        "WIDE": wide,
        "BLOCK_M": block_m,
        "BLOCK_N": LINEAR_BLOCK_N,
        "BLOCK_K": LINEAR_BLOCK_K,
        "SPLIT_K": split,
        "TILES": tiles,
        "num_warps": LINEAR_NUM_WARPS,
        "num_stages": LINEAR_NUM_STAGES,
        # Triton's CPU interpreter multiplies bfloat16 tl.dot operands as their raw 16-bit patterns (triton 3.9):
        # there the operands go in as float32 (exact: they are bfloat16 values) with IEEE products
        "F32_DOT": x.device.type == "cpu",
    }
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, LINEAR_BLOCK_N), split)
    with torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext():
        _linear_kernel[grid](*args, **meta)
        if split > 1:
            mn, block = m * n, 1024
            _split_sum_kernel[(triton.cdiv(mn, block),)](
                part,
                bias if bias is not None else y,
                y_bits,
                mn,
                n,
                SPLIT_K=split,
                HAS_BIAS=bias is not None,
                BLOCK=block,
            )
    return y


@functools.cache
def _multiprocessors_of(device: str) -> int:
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def _multiprocessors(device: torch.device) -> int:
    """The device's multiprocessors (CUDA), 4 on the CPU (Triton's interpreter: the tests)."""
    return _multiprocessors_of(str(device)) if device.type == "cuda" else 4
