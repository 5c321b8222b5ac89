"""MXFP8 decode as one Triton kernel: E4M3 payload + UE8M0 block scales -> bfloat16 / float32, in the
payload's layout or transposed, bit for bit the codec's decode (:func:`mxfp8_codec.decode_mxfp8`).

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

__all__ = ["AVAILABLE", "BLOCK_C", "BLOCK_R", "MAX_COLUMN_TILES", "NUM_WARPS", "decode_mxfp8_triton"]

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
        scale = tl.where(s == 0, _POW2_M127, s << 23).to(tl.float32, bitcast=True)  # 2^(s - 127), exact
        scale_nan = s == _SCALE_NAN
        # the codes: [BLOCK_R, NBLK, 32]
        cols = blocks[None, :, None] * _BLOCK + lanes[None, None, :]
        mask = row_ok[:, None, None] & (cols < C)
        q = tl.load(p_ptr + rows[:, None, None] * C + cols, mask=mask, other=0).to(tl.int32)
        mag = q & 0x7F
        normal = ((mag << 20) + _REBIAS).to(tl.float32, bitcast=True)  # exact for mag >= 8
        sub = mag.to(tl.float32) * _E4M3_SUB  # mag * 2^-9: exact for mag < 8
        value = tl.where(mag >= 8, normal, sub) * scale[:, :, None]  # one rounding: exact or +inf
        bits = value.to(tl.int32, bitcast=True) | ((q & 0x80) << 24)
        nan = (mag == _E4M3_NAN) | scale_nan[:, :, None]
        if BF16:
            u = bits.to(tl.uint32, bitcast=True)
            half = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
            out = tl.where(nan, _BF16_NAN, half.to(tl.int32)).to(tl.int16)
        else:
            out = tl.where(nan, _F32_NAN, bits)
        if TRANSPOSE:
            tl.store(o_ptr + cols * R + rows[:, None, None], out, mask=mask)
        else:
            tl.store(o_ptr + rows[:, None, None] * C + cols, out, mask=mask)


def _check(payload: Any, scales: Any, out: Any, transpose: bool, name: str | None) -> None:
    """MXFP8Error naming the op, the tensor and the shapes when the input is not what the kernel takes."""
    import torch

    who = f"decode_mxfp8_triton: tensor {name!r}" if name else "decode_mxfp8_triton"
    for what, t in (("payload", payload), ("scales", scales), ("out", out)):
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
    want = (cols, rows) if transpose else (rows, cols)
    if out.dtype not in (torch.float32, torch.bfloat16) or tuple(out.shape) != want:
        raise MXFP8Error(
            f"{who}: out must be float32 or bfloat16 of shape {want} (payload {tuple(payload.shape)}, "
            f"transpose={transpose}), got {out.dtype} {tuple(out.shape)}"
        )
    for what, t in (("payload", payload), ("scales", scales), ("out", out)):
        if not t.is_contiguous():
            raise MXFP8Error(f"{who}: {what} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")
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
