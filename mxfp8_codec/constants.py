"""Constants of the MXFP8 (E4M3 element, UE8M0 scale, 32-element block) format, and the scale rules.

Values are given in comments so a reader never has to evaluate an expression to know them.

* Element: OCP FP8 E4M3 ("float8_e4m3fn"): ``S EEEE MMM``, bias 7, no infinities, ``0x7F``/``0xFF``
  are NaN, max normal ``0x7E`` = 1.75 * 2^8 = 448, min normal ``0x08`` = 2^-6, subnormals
  ``k * 2^-9`` for k = 1..7.
* Scale: UE8M0 ("float8_e8m0fnu"): unsigned biased exponent, value ``2^(byte - 127)``; byte ``0xFF``
  is NaN (the whole block decodes to NaN); byte 0 is 2^-127, *not* zero.
* Block: 32 consecutive elements along the last axis; a partial trailing block is allowed.
* Scale rules (:class:`ScaleRule`): how the encoder picks the block exponent ``e`` (scale byte
  ``e + 127``) from the block's largest magnitude ``amax = m * 2^E`` with ``m`` in [1, 2):

  - ``RCEIL`` (default): the smallest power of two X with ``amax / X <= 448``:
    ``e = E - 8 + (m > 1.75)``. Never clips the block maximum. Equals ``ceil(log2(amax / 448))``,
    NVIDIA Transformer Engine / cuBLAS / ModelOpt and torchao's RCEIL mode.
  - ``FLOOR``: the OCP MX v1.0 recommendation ``e = E - 8``; elements above 448 saturate to 448.

  Both are clamped to [-127, 127]. A zero block gets scale byte 0 and an all-zero payload.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TypeVar

from mxfp8_codec.errors import MXFP8Error

__all__ = [
    "BF16_CANONICAL_NAN",
    "BLOCK_SIZE",
    "C_HEADER",
    "E4M3_BIAS",
    "E4M3_MANTISSA_BITS",
    "E4M3_MAX",
    "E4M3_MAX_CODE",
    "E4M3_MAX_POW2",
    "E4M3_MIN_NORMAL",
    "E4M3_MIN_SUBNORMAL",
    "E4M3_NAN_MAG",
    "E4M3_SIGN",
    "E8M0_BIAS",
    "E8M0_NAN",
    "F32_CANONICAL_NAN",
    "F32_EXP_MASK",
    "F32_MANT_175",
    "SCALE_EXP_MAX",
    "SCALE_EXP_MIN",
    "TINY_AMAX",
    "TOP_CLAMP_CODE",
    "TOP_CLAMP_SCALE_BYTE",
    "TOP_CLAMP_VALUE",
    "WEIGHTS_DTYPE",
    "Rounding",
    "ScaleRule",
    "parse_rounding",
    "parse_scale_rule",
]

BLOCK_SIZE = 32  # elements per shared scale ("K32"), along the last axis

# --- E4M3 element (OCP "e4m3fn") ---------------------------------------------------------------
E4M3_BIAS = 7  # exponent bias
E4M3_MANTISSA_BITS = 3  # grid spacing in a binade [2^E, 2^(E+1)): 2^(E - 3)
E4M3_MAX = 448.0  # largest finite magnitude, 1.75 * 2^8, code 0x7E
E4M3_MAX_CODE = 0x7E  # 126: magnitude bits of +448
E4M3_MAX_POW2 = 8  # floor(log2(448)) = 8 ("emax_elem" in the OCP spec)
E4M3_MIN_NORMAL = 2.0**-6  # 0.015625, code 0x08
E4M3_MIN_SUBNORMAL = 2.0**-9  # 0.001953125, code 0x01
E4M3_NAN_MAG = 0x7F  # 127: magnitude bits of NaN (0x7F and 0xFF are NaN, there is no Inf)
E4M3_SIGN = 0x80  # 128: sign bit; -0 is 0x80

# --- UE8M0 scale ("e8m0fnu") ---------------------------------------------------------------------
E8M0_BIAS = 127  # value = 2^(byte - 127)
E8M0_NAN = 0xFF  # 255: NaN scale, the whole block decodes to NaN
SCALE_EXP_MIN = -127  # byte 0 = 2^-127 (not zero); also the scale of an all-zero block
SCALE_EXP_MAX = 127  # byte 254 = 2^127

# "Tiny" blocks: below amax = 1.75 * 2^-119 (~2.6e-36) RCEIL asks for e < -127 and the clamp
# gives byte 0. We still encode them exactly (elements scaled by exactly 2^127, rounded once),
# unlike torchao FLOOR (factor-2 error, pytorch/ao#1104) or TE/torchao RCEIL (flush to zero).
# Tests use the round bound amax < 2^-118 (every such block has byte 0 or 1).
TINY_AMAX = 2.0**-118  # 3.39e-36

# --- The top of the float32/bfloat16 range ------------------------------------------------------
# With RCEIL, amax >= 1.9375 * 2^127 (the top 8 bfloat16 codes per sign) gives e = 120 (byte 247)
# and an element that rounds to 256 = 2^8, i.e. a decoded value 2^128 = +inf. We never let a finite
# input decode to inf: in a block with scale byte 247 elements saturate at code 0x77 (240), decoded
# 240 * 2^120 = 1.875 * 2^127 (relative error <= 5.9 %). FLOOR never reaches byte 247.
TOP_CLAMP_SCALE_BYTE = 247  # 0xF7 = 120 + 127
TOP_CLAMP_CODE = 0x77  # 119: magnitude bits of 240 = 1.875 * 2^7
TOP_CLAMP_VALUE = 240.0  # the value of TOP_CLAMP_CODE: largest magnitude in a block with byte 247

# RCEIL's threshold: the float32 mantissa field of 1.75 (0.75 * 2^23); amax mantissa above it -> e + 1
F32_MANT_175 = 0x600000  # 6291456
F32_EXP_MASK = 0x7F800000  # float32 exponent field; a magnitude's bits >= this <=> Inf or NaN

# --- Canonical NaN bit patterns produced by decode ----------------------------------------------
BF16_CANONICAL_NAN = 0x7FC0  # quiet NaN, positive sign
F32_CANONICAL_NAN = 0x7FC00000  # quiet NaN, positive sign

WEIGHTS_DTYPE = "MXFP8_E4M3_UE8M0_K32"  # value of the required `weights_dtype` metadata key

# The C / CUDA spelling of these constants, the scale rule, the counter RNG and the grid-rounding
# block encoder: #included by the codec's C kernel and by nvfp4_cuda's C and CUDA sources (compile
# with -I C_HEADER.parent); tests/mxfp8_codec/test_native_header.py checks it against this module.
C_HEADER = Path(__file__).with_name("mxfp8.h")


class Rounding(str, enum.Enum):
    """How the encoder rounds a scaled element onto the E4M3 grid.

    Attributes:
        RNE: round to nearest, ties to even (the default; the checkpoint format's rule).
        STOCHASTIC: round up with probability equal to the fraction of the grid step, using 24 bits
            of the counter RNG word of the element's flat index under ``(seed, step, tensor_id)``
            (:mod:`mxfp8_codec.rng`): unbiased, and the same bits on numpy, torch, C and CUDA.
            For optimizer write-back into an MXFP8 master (an update below half a grid step would
            be lost to RNE).

    Example:
        >>> Rounding("stochastic") is Rounding.STOCHASTIC
        True
    """

    RNE = "rne"
    STOCHASTIC = "stochastic"


class ScaleRule(str, enum.Enum):
    """How the encoder chooses a block's shared exponent from its largest magnitude ``amax``.

    Attributes:
        RCEIL: ``e = floor(log2 amax) - 8 + (mantissa(amax) > 1.75)``, the smallest power of two
            that keeps ``amax / 2^e <= 448`` (never clips). The default.
        FLOOR: ``e = floor(log2 amax) - 8`` (OCP MX v1.0 Algorithm 1); values above 448 saturate.

    Example:
        >>> ScaleRule("rceil") is ScaleRule.RCEIL
        True
    """

    RCEIL = "rceil"
    FLOOR = "floor"


def parse_scale_rule(scale_rule: str | ScaleRule) -> ScaleRule:
    """The :class:`ScaleRule` named by ``scale_rule``; an :class:`MXFP8Error` listing the rules otherwise.

    Example:
        >>> parse_scale_rule("floor") is ScaleRule.FLOOR
        True
    """
    return _member(ScaleRule, scale_rule, "scale_rule")


def parse_rounding(rounding: str | Rounding) -> Rounding:
    """The :class:`Rounding` named by ``rounding``; an :class:`MXFP8Error` listing the modes otherwise.

    Example:
        >>> parse_rounding("stochastic") is Rounding.STOCHASTIC
        True
    """
    return _member(Rounding, rounding, "rounding")


_E = TypeVar("_E", ScaleRule, Rounding)


def _member(kind: type[_E], value: str | _E, what: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise MXFP8Error(f"unknown {what} {value!r}; expected one of {[m.value for m in kind]}") from None
