"""Independent exact oracle for MXFP8 numerics tests: Python fractions, no code from mxfp8_codec.

Everything here is computed from the format's definition (bit fields, powers of two, round to
nearest even on exact rationals), so it can judge the codec's table- and bit-trick-based code.
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = [
    "BF16",
    "F32",
    "e4m3_fraction",
    "floor_exponent",
    "ilog2",
    "rceil_exponent",
    "round_fraction",
]

# (precision bits incl. the implicit one, minimum normal exponent, maximum exponent)
F32 = (24, -126, 127)  # IEEE binary32
BF16 = (8, -126, 127)  # bfloat16


def e4m3_fraction(code: int) -> Fraction | None:
    """Exact value of an E4M3 (OCP e4m3fn) code, or None for NaN (0x7F, 0xFF)."""
    sign = -1 if code & 0x80 else 1
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and man == 0x7:
        return None
    if exp == 0:
        return sign * Fraction(man, 2**9)
    return sign * Fraction(8 + man, 8) * Fraction(2) ** (exp - 7)


def ilog2(a: Fraction) -> int:
    """floor(log2(a)) for a positive rational, exactly."""
    assert a > 0
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    return e


def round_fraction(v: Fraction, fmt: tuple[int, int, int]) -> Fraction | float:
    """Round an exact rational to the float format ``fmt`` (nearest, ties to even).

    Returns the rounded value as a Fraction, or +-inf (a float) on overflow.
    """
    p, emin, emax = fmt
    if v == 0:
        return Fraction(0)
    sign = -1 if v < 0 else 1
    a = abs(v)
    e = max(ilog2(a), emin)
    ulp = Fraction(2) ** (e - (p - 1))
    q = a / ulp
    n = math.floor(q)
    rem = q - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    r = n * ulp
    max_finite = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if r > max_finite:
        return sign * math.inf
    return sign * r


def rceil_exponent(amax: Fraction) -> int:
    """Smallest integer e with amax / 2^e <= 448, i.e. ceil(log2(amax / 448)), clamped [-127, 127]."""
    if amax == 0:
        return -127
    e = ilog2(amax / 448)
    if amax / Fraction(2) ** e > 448:
        e += 1
    while e > -200 and amax / Fraction(2) ** (e - 1) <= 448:
        e -= 1
    return max(-127, min(127, e))


def floor_exponent(amax: Fraction) -> int:
    """OCP MX Algorithm 1: floor(log2 amax) - 8, clamped [-127, 127] (zero -> -127)."""
    if amax == 0:
        return -127
    return max(-127, min(127, ilog2(amax) - 8))


# --- the oracle checks itself against two unrelated implementations (ml_dtypes, numpy casts) ----
def test_oracle_e4m3_matches_ml_dtypes_all_codes() -> None:
    import ml_dtypes
    import numpy as np

    vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    for code in range(256):
        ref = e4m3_fraction(code)
        if ref is None:
            assert math.isnan(vals[code])
        else:
            assert Fraction(float(vals[code])) == ref
    assert e4m3_fraction(0x7E) == 448 and e4m3_fraction(0x01) == Fraction(1, 512)


def test_oracle_rounding_matches_numpy_float32() -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    xs = np.concatenate([rng.standard_normal(300) * 10.0 ** rng.integers(-45, 39, 300), [3.4028235677973366e38, 1e-45]])
    with np.errstate(over="ignore"):
        f32 = xs.astype(np.float32)
    for x, r in zip(xs, f32, strict=True):
        got = round_fraction(Fraction(float(x)), F32)
        assert (got == float(r)) if math.isinf(r) else got == Fraction(float(r))


def test_oracle_scale_rules_examples() -> None:
    assert rceil_exponent(Fraction(448)) == 0
    assert rceil_exponent(Fraction(449)) == 1
    assert rceil_exponent(Fraction(150)) == -1  # pytorch/ao#2035: amax 150 -> byte 126
    assert floor_exponent(Fraction(19, 10)) == -8
    assert rceil_exponent(Fraction(1, 2**130)) == -127
