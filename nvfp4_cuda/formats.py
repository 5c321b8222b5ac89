"""Number formats used by nvfp4_cuda: E2M1 (NVFP4 element), E4M3 (NVFP4 block scale, MXFP8 element), UE8M0.

Every conversion here is written as *round a magnitude to a grid of equally spaced points* so that the
PyTorch reference and the CUDA kernels (``csrc/nvfp4_common.cuh``) perform literally the same float32
operations, each of which is exact:

* ``u`` (the grid spacing at ``a = |v|``) is a power of two chosen from ``a``'s binade, so ``t = a / u``
  is exact (a power-of-two scaling of a float32, far from the under/overflow limits we reach);
* round-to-nearest-even: ``n = rint(t)`` (``torch.round`` / CUDA ``rintf`` both round half to even, and
  the parity of ``n`` is the parity of the format's mantissa LSB inside a binade, so this *is* RNE);
* stochastic rounding: ``n = floor(t) + (r24 < (t - floor(t)) * 2**24)`` where ``r24`` is a 24-bit
  integer from the counter-based RNG (:mod:`mxfp8_codec.rng`); ``t - floor(t)`` and the scaling by
  2**24 are exact, so the probability of rounding up is ``ceil(frac * 2**24) / 2**24`` - unbiased to
  within 2**-24 of a grid step;
* the result ``n * u`` is clamped to the format's largest finite magnitude (``satfinite``) and the
  sign is reapplied from the sign bit (so ``-0`` and negative values that round to zero keep the
  sign, as ``cvt.rn.satfinite.e2m1x2`` and ``ml_dtypes.float4_e2m1fn`` do).

E2M1 magnitudes (code 0..7): 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.  Spacing: 0.5 below 2,
1 in [2, 4), 2 in [4, 6].  E4M3 ("e4m3fn", OCP FP8): bias 7, max 448, spacing 2**(floor(log2 a) - 3)
for normal values (a >= 2**-6) and 2**-9 below (subnormals); 0x7F / 0xFF are NaN.  UE8M0: byte s
means 2**(s - 127), 0xFF is NaN.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

# E4M3 (the MXFP8 element and the NVFP4 block scale) and UE8M0 live in mxfp8_codec, once: their
# constants, the grid rounding (RNE / stochastic) and the decode tables are imported from there.
from mxfp8_codec.constants import E4M3_MAX
from mxfp8_codec.numerics_torch import (
    bits_to_f32,
    e4m3_bits_from_grid,
    e4m3_decode,
    e4m3_decode_table,
    e4m3_encode,
    e4m3_encode_grid,
    e4m3_round,
    e8m0_decode,
    f32_bits,
    floor_log2_f32,
    pow2_f32,
    round_to_grid,
)
from mxfp8_codec.rng import SR_BITS, SR_SCALE

__all__ = [
    "E2M1_MAX",
    "E2M1_SIGN_BIT",
    "E2M1_VALUES",
    "E4M3_MAX",
    "FLT_MAX",
    "HADAMARD_SIGNS",
    "NVFP4_BLOCK",
    "NVFP4_ENCODE_NUMERATOR",
    "ONE_SIXTH_F32",
    "SR_BITS",
    "SR_SCALE",
    "bits_to_f32",
    "e2m1_decode_table",
    "e2m1_encode",
    "e2m1_encode_grid",
    "e4m3_bits_from_grid",
    "e4m3_decode",
    "e4m3_decode_table",
    "e4m3_encode",
    "e4m3_encode_grid",
    "e4m3_round",
    "e8m0_decode",
    "f32_bits",
    "floor_log2_f32",
    "pack_nibbles",
    "pow2_f32",
    "round_to_grid",
    "unpack_nibbles",
]

# ---- block sizes -------------------------------------------------------------------------------
NVFP4_BLOCK = 16  # elements per NVFP4 block scale (along K); MXFP8's is mxfp8_codec's BLOCK_SIZE

# ---- E2M1 --------------------------------------------------------------------------------------
E2M1_MAX = 6.0  # largest E2M1 magnitude
E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of code 0..7
E2M1_SIGN_BIT = 0x8  # bit 3 of a nibble

# ---- float32 / NVFP4 tensor scale ----------------------------------------------------------------
FLT_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
NVFP4_ENCODE_NUMERATOR = 2688.0  # 448 * 6: S_enc = 2688 / amax (Transformer Engine)
ONE_SIXTH_F32 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))  # fp32(1/6) = 0.16666667163372040

# Random Hadamard sign vector shared by all layers (Transformer Engine get_wgrad_sign_vector()).
HADAMARD_SIGNS: tuple[int, ...] = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


# ---- E2M1 ----------------------------------------------------------------------------------------
def e2m1_encode(v: torch.Tensor, rand24: torch.Tensor | None = None) -> torch.Tensor:
    """Encode float32 values to 4-bit E2M1 codes (uint8, one per element), RNE or stochastic, satfinite.

    Args:
        v: float32 tensor (finite; already multiplied by the block encode scale).
        rand24: None (RNE) or int64 random integers in [0, 2**24) of v's shape.

    Returns:
        uint8 tensor of codes 0..15 (bit 3 = sign; ``-0`` and negative underflow give code 8).

    Example:
        >>> e2m1_encode(torch.tensor([0.25, 0.75, -5.0, 7.0])).tolist()
        [0, 2, 14, 7]
    """
    if rand24 is None and v.device.type == "cpu":
        # Fast path: ml_dtypes' float32 -> float4_e2m1fn cast is RNE + satfinite with the same sign
        # handling (tested against the grid path below, which is what the CUDA kernels do).
        f4 = v.detach().to(torch.float32).contiguous().numpy().astype(ml_dtypes.float4_e2m1fn)
        return torch.from_numpy(f4.view(np.uint8) & 0x0F)
    return e2m1_encode_grid(v, rand24)


def e2m1_encode_grid(v: torch.Tensor, rand24: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`e2m1_encode` written as grid rounding (device-agnostic; the CUDA kernels' algorithm)."""
    a = v.abs()
    region = (a >= 2.0).to(torch.int32) + (a >= 4.0).to(torch.int32)  # 0: [0,2)  1: [2,4)  2: [4,inf)
    inv_u = torch.where(a < 2.0, 2.0, torch.where(a < 4.0, 1.0, 0.5)).to(torch.float32)
    n = round_to_grid(a * inv_u, rand24).clamp(max=8.0).to(torch.int32)  # exact scaling by a power of two
    code = (n + 2 * region).clamp(max=7)  # region offsets: n in 0..4 | 2..4 | 2..3 (+ saturation)
    sign = torch.signbit(v).to(torch.int32) << 3
    return (code | sign).to(torch.uint8)


def e2m1_decode_table(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """Values of the 16 E2M1 codes (code 8 is -0.0)."""
    vals = list(E2M1_VALUES) + [-x for x in E2M1_VALUES]
    return torch.tensor(vals, dtype=dtype, device=device)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes [R, C] (C even) into bytes [R, C/2]: even element in the low nibble."""
    c = codes.to(torch.uint8).contiguous()
    if c.device.type == "cpu":  # numpy on a uint16 view: contiguous ops instead of strided uint8 slices
        u16 = c.numpy().view(np.uint16)  # little-endian: low byte = even element
        packed = (u16 & 0x000F) | ((u16 >> 4) & 0x00F0)
        return torch.from_numpy(packed.astype(np.uint8))
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: bytes [R, C/2] -> codes [R, C] (uint8)."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
