"""Number formats used by nvfp4_cuda: E2M1 (NVFP4 element), E4M3 (NVFP4 block scale, MXFP8 element), UE8M0.

Every conversion here is written as *round a magnitude to a grid of equally spaced points* so that the
PyTorch reference and the CUDA kernels (``csrc/nvfp4_common.cuh``) perform literally the same float32
operations, each of which is exact:

* ``u`` (the grid spacing at ``a = |v|``) is a power of two chosen from ``a``'s binade, so ``t = a / u``
  is exact (a power-of-two scaling of a float32, far from the under/overflow limits we reach);
* round-to-nearest-even: ``n = rint(t)`` (``torch.round`` / CUDA ``rintf`` both round half to even, and
  the parity of ``n`` is the parity of the format's mantissa LSB inside a binade, so this *is* RNE);
* stochastic rounding: ``n = floor(t) + (r24 < (t - floor(t)) * 2**24)`` where ``r24`` is a 24-bit
  integer from the counter-based RNG (:mod:`nvfp4_cuda.rng`); ``t - floor(t)`` and the scaling by
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

# ---- block sizes -------------------------------------------------------------------------------
NVFP4_BLOCK = 16  # elements per NVFP4 block scale (along K)
MX_BLOCK = 32  # elements per MXFP8 block scale (along the last axis)

# ---- E2M1 --------------------------------------------------------------------------------------
E2M1_MAX = 6.0  # largest E2M1 magnitude
E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of code 0..7
E2M1_SIGN_BIT = 0x8  # bit 3 of a nibble

# ---- E4M3 (OCP e4m3fn) ---------------------------------------------------------------------------
E4M3_MAX = 448.0  # largest finite E4M3 magnitude
E4M3_MIN_NORMAL = 2.0**-6  # 0.015625
E4M3_SUBNORMAL_STEP = 2.0**-9  # 0.001953125, spacing below E4M3_MIN_NORMAL
E4M3_BIAS = 7  # exponent bias
E4M3_MANTISSA_BITS = 3

# ---- UE8M0 -------------------------------------------------------------------------------------
E8M0_BIAS = 127  # byte s decodes to 2**(s - 127)
E8M0_NAN = 0xFF  # scale byte 255 = NaN

# ---- float32 / NVFP4 tensor scale ----------------------------------------------------------------
FLT_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
NVFP4_ENCODE_NUMERATOR = 2688.0  # 448 * 6: S_enc = 2688 / amax (Transformer Engine)
ONE_SIXTH_F32 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))  # fp32(1/6) = 0.16666667163372040
SR_BITS = 24  # random bits used by stochastic rounding to a grid
SR_SCALE = float(2**SR_BITS)  # 16777216.0

# Random Hadamard sign vector shared by all layers (Transformer Engine get_wgrad_sign_vector()).
HADAMARD_SIGNS: tuple[int, ...] = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """Return the IEEE bits of a float32 tensor as non-negative int64 (0 .. 2**32-1)."""
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def bits_to_f32(bits: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`f32_bits` (input int64 in 0 .. 2**32-1)."""
    b = torch.where(bits >= 2**31, bits - 2**32, bits)
    return b.to(torch.int32).view(torch.float32)


def pow2_f32(exponent: torch.Tensor) -> torch.Tensor:
    """Exact float32 ``2**exponent`` for integer exponents in [-149, 127] (int64 tensor in, float32 out)."""
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
    if rand24 is None:
        return torch.round(t)  # half to even
    fl = torch.floor(t)
    frac = (t - fl) * SR_SCALE  # exact
    return fl + (rand24.to(torch.float32) < frac).to(torch.float32)


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


# ---- E4M3 ------------------------------------------------------------------------------------------
def e4m3_round(a: torch.Tensor, rand24: torch.Tensor | None = None) -> torch.Tensor:
    """Round non-negative float32 magnitudes onto the E4M3 grid (RNE or stochastic), saturating at 448.

    Returns float32 values that are exactly representable in E4M3.
    """
    e = floor_log2_f32(a)
    normal = a >= E4M3_MIN_NORMAL
    # spacing exponent: e - 3 for normal values, -9 for subnormals; t = a * 2**-(spacing exponent)
    ue = torch.where(normal, e - E4M3_MANTISSA_BITS, torch.full_like(e, -9))
    t = a * pow2_f32(-ue)
    n = round_to_grid(t, rand24)
    return (n * pow2_f32(ue)).clamp(max=E4M3_MAX)


def e4m3_bits_from_grid(q: torch.Tensor) -> torch.Tensor:
    """E4M3 bit pattern (int64, no sign) of non-negative float32 values already on the E4M3 grid."""
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
    if rand24 is None:
        return v.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return e4m3_encode_grid(v, rand24)


def e4m3_encode_grid(v: torch.Tensor, rand24: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`e4m3_encode` written as grid rounding (device-agnostic; the CUDA kernels' algorithm)."""
    q = e4m3_round(v.abs(), rand24)
    sign = torch.signbit(v).to(torch.int64) << 7
    return (e4m3_bits_from_grid(q) | sign).to(torch.uint8)


_E4M3_TABLES: dict[tuple[str, str], torch.Tensor] = {}


def e4m3_decode_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 values of all 256 E4M3 bytes (0x7F and 0xFF are NaN)."""
    dev = torch.device(device)
    key = (str(dev), "e4m3")
    if key not in _E4M3_TABLES:
        t = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
        _E4M3_TABLES[key] = t.to(dev)
    return _E4M3_TABLES[key]


def e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    """Decode E4M3 bytes (uint8) to float32 through a 256-entry table."""
    return e4m3_decode_table(b.device)[b.to(torch.int64)]


# ---- UE8M0 -----------------------------------------------------------------------------------------
def e8m0_decode(s: torch.Tensor) -> torch.Tensor:
    """Decode UE8M0 scale bytes to float32 ``2**(s - 127)`` (byte 0 is 2**-127, byte 255 is NaN)."""
    e = s.to(torch.int64) - E8M0_BIAS
    v = pow2_f32(e.clamp(max=127))
    return torch.where(s.to(torch.int64) == E8M0_NAN, torch.full_like(v, float("nan")), v)
