"""Hypothesis property tests of MXFP8 encode/decode.

Properties: error bound per element relative to its block amax; encode(decode(p, s)) == (p, s)
for canonical pairs; numpy, torch-ops, public (native) paths bit-identical; partial trailing
blocks and ranks 1-3; zero / -0 blocks; tiny blocks exact; bfloat16 decode rounded once.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mxfp8_codec.constants import ScaleRule
from mxfp8_codec.numerics import (
    decode_mxfp8,
    decode_mxfp8_numpy,
    decode_mxfp8_torch,
    encode_mxfp8,
    encode_mxfp8_numpy,
    encode_mxfp8_torch,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shapes = st.one_of(
    st.tuples(st.integers(1, 100)),
    st.tuples(st.integers(1, 4), st.integers(1, 80)),
    st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 70)),
)
finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def float_arrays(draw: st.DrawFn) -> np.ndarray:
    """Finite float32 arrays: raw hypothesis floats (extremes, subnormals, +-0) or scaled normals."""
    shape = draw(shapes)
    if draw(st.booleans()):
        return draw(arrays(np.float32, shape, elements=finite_f32))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    exp = draw(st.integers(-140, 120))
    x = rng.standard_normal(shape) * 2.0**exp
    if draw(st.booleans()):  # zero out some rows/blocks, sometimes as -0
        x[..., : draw(st.integers(0, shape[-1]))] = draw(st.sampled_from([0.0, -0.0]))
    return np.clip(x, -3.0e38, 3.0e38).astype(np.float32)


def _block_amax(x: np.ndarray) -> np.ndarray:
    """Per-element amax of the element's block (float64), partial trailing block included."""
    k = x.shape[-1]
    kp = -(-k // 32) * 32
    pad = np.zeros((*x.shape[:-1], kp), np.float64)
    pad[..., :k] = np.abs(x.astype(np.float64))
    amax = pad.reshape(*x.shape[:-1], kp // 32, 32).max(axis=-1)
    return np.repeat(amax, 32, axis=-1)[..., :k]


@SETTINGS
@given(x=float_arrays(), bf16_input=st.booleans())
def test_roundtrip_error_bounded_by_element_and_block_amax_rceil(x: np.ndarray, bf16_input: bool) -> None:
    if bf16_input:
        x = x.astype(ml_dtypes.bfloat16)
        x = np.where(np.isfinite(x.astype(np.float32)), x, 0).astype(ml_dtypes.bfloat16)
    q, s = encode_mxfp8(x)
    d = decode_mxfp8(q, s).astype(np.float64)
    xf = x.astype(np.float64)
    amax = _block_amax(x)
    # normal E4M3 rounding: half an ulp <= |x| / 16; subnormal: 2^(e-10) < amax / (224 * 1024)
    bound = np.maximum(np.abs(xf) / 16, np.maximum(amax / (224 * 1024), 2.0**-137))
    assert np.isfinite(d).all()
    assert (np.abs(d - xf) <= bound).all(), np.max(np.abs(d - xf) / bound)


@SETTINGS
@given(x=float_arrays())
def test_roundtrip_error_bound_floor(x: np.ndarray) -> None:
    q, s = encode_mxfp8(x, scale_rule="floor")
    d = decode_mxfp8(q, s).astype(np.float64)
    xf = x.astype(np.float64)
    bound = np.maximum(np.abs(xf) / 8, np.maximum(_block_amax(x) / (256 * 1024), 2.0**-137))
    assert (np.abs(d - xf) <= bound).all()


@st.composite
def canonical_pairs(draw: st.DrawFn, rule: ScaleRule) -> tuple[np.ndarray, np.ndarray]:
    """(payload, scales) an encoder can produce: the block max code matches the scale rule."""
    rows = draw(st.integers(1, 4))
    k = draw(st.integers(1, 100))
    nb = -(-k // 32)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    codes = rng.integers(0, 0x7F, (rows, k)).astype(np.uint8)  # non-NaN magnitudes 0..0x7E
    codes |= (rng.integers(0, 2, (rows, k)) * 0x80).astype(np.uint8)
    scales = np.empty((rows, nb), np.uint8)
    lo = 0x77 if rule is ScaleRule.RCEIL else 0x78  # smallest canonical block-max code
    top_byte = 247 if rule is ScaleRule.RCEIL else 246
    for r in range(rows):
        for b in range(nb):
            blk = codes[r, b * 32 : (b + 1) * 32]
            kind = draw(st.sampled_from(["normal", "tiny", "zero"]))
            if kind == "zero":
                blk[:] &= 0x80  # +-0 only
                scales[r, b] = 0
            elif kind == "tiny":  # scale byte 0 holds any codes (amax < 2^-118)
                scales[r, b] = 0
            else:
                sb = draw(st.integers(1, top_byte))
                blk_mag = blk & 0x7F
                cap = 0x77 if sb == 247 else 0x7E
                blk_mag = np.minimum(blk_mag, cap)
                lead = draw(st.integers(0, len(blk) - 1))
                blk_mag[lead] = draw(st.integers(lo, cap)) if cap >= lo else cap
                blk[:] = (blk & 0x80) | blk_mag
                scales[r, b] = sb
    return codes, scales


@SETTINGS
@given(data=st.data(), rule=st.sampled_from(list(ScaleRule)))
def test_encode_decode_idempotent_on_canonical_pairs(data: st.DataObject, rule: ScaleRule) -> None:
    p, s = data.draw(canonical_pairs(rule))
    d = decode_mxfp8(p, s)  # float32 decode is exact for these pairs
    q2, s2 = encode_mxfp8(d, scale_rule=rule)
    assert np.array_equal(s2, s)
    assert np.array_equal(q2, p)
    qt, st_ = encode_mxfp8(torch.from_numpy(d), scale_rule=rule)
    assert np.array_equal(qt.numpy(), p) and np.array_equal(st_.numpy(), s)


@SETTINGS
@given(x=float_arrays(), rule=st.sampled_from(list(ScaleRule)), dt=st.sampled_from(["f32", "bf16", "f16"]))
def test_numpy_torch_and_public_paths_bit_identical(x: np.ndarray, rule: ScaleRule, dt: str) -> None:
    with np.errstate(over="ignore"):
        xin = {"f32": x, "bf16": x.astype(ml_dtypes.bfloat16), "f16": x.astype(np.float16)}[dt]
    xin = np.where(np.isfinite(xin.astype(np.float32)), xin, 0).astype(xin.dtype)
    q, s = encode_mxfp8_numpy(xin, scale_rule=rule)
    qp, sp = encode_mxfp8(xin, scale_rule=rule)
    tx = torch.from_numpy(xin.view(np.int16)).view(torch.bfloat16) if dt == "bf16" else torch.from_numpy(xin)
    qt, st_ = encode_mxfp8_torch(tx, scale_rule=rule)
    qc, sc = encode_mxfp8(tx, scale_rule=rule)
    for a, b in ((qp, q), (sp, s), (qt.numpy(), q), (st_.numpy(), s), (qc.numpy(), q), (sc.numpy(), s)):
        assert a.shape == b.shape and np.array_equal(a, b)


@SETTINGS
@given(data=st.data(), shape=shapes)
def test_decode_paths_bit_identical_on_arbitrary_bytes(data: st.DataObject, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    p = rng.integers(0, 256, shape).astype(np.uint8)
    s_shape = (*shape[:-1], -(-shape[-1] // 32))
    s = rng.integers(0, 256, s_shape).astype(np.uint8)
    if data.draw(st.booleans()):  # mostly realistic scale bytes, sometimes extremes
        s = np.clip(s, 100, 140).astype(np.uint8)
    for dtype, tdtype, view in (
        (np.float32, torch.float32, np.uint32),
        (ml_dtypes.bfloat16, torch.bfloat16, np.uint16),
    ):
        ref = decode_mxfp8_numpy(p, s, dtype=dtype).view(view)
        pub = decode_mxfp8(p, s, dtype=dtype).view(view)
        tp, ts = torch.from_numpy(p), torch.from_numpy(s)
        tor = decode_mxfp8_torch(tp, ts, dtype=tdtype)
        cpu = decode_mxfp8(tp, ts, dtype=tdtype)
        ibits = torch.int32 if tdtype == torch.float32 else torch.int16
        assert np.array_equal(pub, ref)
        assert np.array_equal(tor.view(ibits).numpy().view(view), ref)
        assert np.array_equal(cpu.view(ibits).numpy().view(view), ref)


@SETTINGS
@given(data=st.data(), shape=shapes)
def test_bf16_decode_is_exact_value_rounded_once(data: st.DataObject, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    p = rng.integers(0, 256, shape).astype(np.uint8)
    s = rng.integers(0, 255, (*shape[:-1], -(-shape[-1] // 32))).astype(np.uint8)
    exact_f32 = decode_mxfp8(p, s)  # exact in float32 (or +-inf beyond its range)
    bf16 = decode_mxfp8(p, s, dtype=ml_dtypes.bfloat16).astype(np.float32)
    ref = exact_f32.astype(ml_dtypes.bfloat16).astype(np.float32)  # ml_dtypes' RNE
    assert np.array_equal(np.isnan(bf16), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(bf16[ok], ref[ok])


@SETTINGS
@given(
    x=arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.integers(1, 32)),  # one block per row
        elements=st.floats(-(2.0**-118), 2.0**-118, width=32, exclude_min=True, exclude_max=True),
    )
)
# found by the explore profile (seed 9): at scale byte 1 a value below E4M3's smallest step 2^-135 is off
# by up to half that step, 2^-136 -- more than the 2^-137 this test allowed for every scale
@example(x=np.array([[2.7182724e-36, 3.8360545e-41]], np.float32))
def test_tiny_blocks_encoded_exactly(x: np.ndarray) -> None:
    q, s = encode_mxfp8(x)
    # the rule asks for e < -127 below 1.75 * 2^-119 (clamped to byte 0), else e = -126 (byte 1)
    amax = np.abs(x.astype(np.float64)).max(axis=1)
    assert np.array_equal(s[:, 0], (amax > 1.75 * 2.0**-119).astype(np.uint8))
    # no flush to zero, no factor-2 error: the exact scaled value x * 2^-e (float64 holds it)
    # through torch's saturating RNE cast
    e = s[:, :1].astype(np.int64) - 127
    ref = torch.from_numpy(x.astype(np.float64) * np.ldexp(1.0, -e)).to(torch.float8_e4m3fn).view(torch.uint8)
    assert np.array_equal(q, ref.numpy())
    d = decode_mxfp8(q, s).astype(np.float64)
    # E4M3 rounds to 3 mantissa bits (error <= |x| / 16) above its subnormals, and to half its smallest
    # step, 2^-9 * 2^e, below them
    assert (np.abs(d - x) <= np.maximum(np.abs(x) / 16, np.ldexp(1.0, e - 10))).all()


@SETTINGS
@given(shape=shapes, neg=st.booleans(), dt=st.sampled_from([np.float32, ml_dtypes.bfloat16, np.float16]))
def test_zero_blocks_any_rank(shape: tuple[int, ...], neg: bool, dt: type) -> None:
    x = np.full(shape, -0.0 if neg else 0.0, dt)
    q, s = encode_mxfp8(x)
    assert (q == (0x80 if neg else 0)).all() and (s == 0).all()
    d = decode_mxfp8(q, s, dtype=ml_dtypes.bfloat16)
    assert (d.astype(np.float32) == 0).all() and bool(np.signbit(d.astype(np.float32)).all()) == neg
    assert not math.isnan(float(d.astype(np.float32).sum()))
