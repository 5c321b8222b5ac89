"""Exhaustive and corner-case tests of mxfp8_codec.numerics against the exact fraction oracle.

* decode: every (E4M3 code, scale byte) pair, float32 and bfloat16, numpy and torch;
* scale rules: every positive finite bfloat16 amax, RCEIL and FLOOR;
* element encoding: bit patterns equal torch's saturating float8_e4m3fn cast of the exactly scaled
  values, for every finite bfloat16 magnitude <= 448 under several block maxima and exponents;
* corner cases: zero / -0 blocks, tiny blocks, the top of the range, NaN/Inf errors, bad input.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from mxfp8_codec.constants import TOP_CLAMP_CODE, TOP_CLAMP_SCALE_BYTE, ScaleRule
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.numerics import (
    decode_mxfp8,
    decode_mxfp8_numpy,
    decode_mxfp8_torch,
    encode_mxfp8,
    encode_mxfp8_numpy,
    encode_mxfp8_torch,
    scale_exponent,
    scales_shape,
)
from tests.mxfp8_codec.test_numerics_oracle import (
    BF16,
    F32,
    e4m3_fraction,
    floor_exponent,
    rceil_exponent,
    round_fraction,
)

ALL_CODES = np.arange(256, dtype=np.uint8)


def _all_pairs() -> tuple[np.ndarray, np.ndarray]:
    """payload[s, q] = q, one row per scale byte s (8 blocks of 32 codes each)."""
    payload = np.tile(ALL_CODES, (256, 1))
    scales = np.repeat(ALL_CODES[:, None], 8, axis=1)
    return payload, scales


def _check_against_oracle(decoded: np.ndarray, fmt: tuple[int, int, int]) -> None:
    as_f64 = decoded.astype(np.float64)
    for s in range(256):
        for q in range(256):
            got = as_f64[s, q]
            exact = e4m3_fraction(q)
            if s == 0xFF or exact is None:
                assert math.isnan(got), (s, q, got)
                continue
            ref = round_fraction(exact * Fraction(2) ** (s - 127), fmt)
            if isinstance(ref, float):  # +-inf
                assert got == ref, (s, q, got, ref)
            else:
                assert Fraction(float(got)) == ref, (s, q, got, ref)
            assert bool(np.signbit(got)) == bool(q & 0x80), (s, q, got)


@pytest.mark.parametrize("kind", ["f32", "bf16"])
@pytest.mark.slow
def test_decode_every_code_and_scale_against_fraction_oracle(kind: str) -> None:
    payload, scales = _all_pairs()
    dtype = np.float32 if kind == "f32" else ml_dtypes.bfloat16
    decoded = decode_mxfp8(payload, scales, dtype=dtype)
    assert decoded.dtype == np.dtype(dtype) and decoded.shape == (256, 256)
    _check_against_oracle(decoded, F32 if kind == "f32" else BF16)
    # the pure-numpy path, the torch path and the public path agree bit for bit
    bits = decoded.view(np.uint32 if kind == "f32" else np.uint16)
    np_bits = decode_mxfp8_numpy(payload, scales, dtype=dtype).view(bits.dtype)
    t = decode_mxfp8_torch(
        torch.from_numpy(payload),
        torch.from_numpy(scales),
        dtype=torch.float32 if kind == "f32" else torch.bfloat16,
    )
    t_bits = t.view(torch.int32 if kind == "f32" else torch.int16).numpy().view(bits.dtype)
    assert np.array_equal(bits, np_bits)
    assert np.array_equal(bits, t_bits)


def test_decode_bf16_matches_torch_cast_times_scale() -> None:
    payload, scales = _all_pairs()
    ours = decode_mxfp8(payload, scales, dtype=ml_dtypes.bfloat16).astype(np.float32)
    q = torch.from_numpy(payload).view(torch.float8_e4m3fn).to(torch.bfloat16)
    s = torch.from_numpy(np.repeat(scales, 32, axis=1)).view(torch.float8_e8m0fnu).to(torch.bfloat16)
    ref = (q * s).float().numpy()
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(ours[ok].view(np.uint32), ref[ok].view(np.uint32))


def test_decode_nan_rules_and_canonical_nan_bits() -> None:
    p = np.array([[0x7F, 0xFF, 0x00, 0x38] + [0] * 28, [0x00, 0x80, 0x38, 0x7E] + [0] * 28], np.uint8)
    s = np.array([[127], [255]], np.uint8)
    f = decode_mxfp8(p, s).view(np.uint32)
    assert f[0, 0] == f[0, 1] == 0x7FC00000 and f[0, 2] == 0 and f[0, 3] == 0x3F800000
    assert (f[1] == 0x7FC00000).all()  # scale 0xFF: the whole block is NaN
    b = decode_mxfp8(p, s, dtype=ml_dtypes.bfloat16).view(np.uint16)
    assert b[0, 0] == b[0, 1] == 0x7FC0 and (b[1] == 0x7FC0).all()


def test_decode_scale_byte_zero_is_two_to_minus_127_not_zero() -> None:
    out = decode_mxfp8(np.array([0x38, 0x01], np.uint8), np.array([0], np.uint8))
    assert out.tolist() == [2.0**-127, 2.0**-136]


# ---------------------------------------------------------------------------------------------
# scale rules over every positive finite bfloat16 amax
# ---------------------------------------------------------------------------------------------
POS_BF16 = np.arange(1, 0x7F80, dtype=np.uint16).view(ml_dtypes.bfloat16)  # 32 639 values


@pytest.mark.parametrize("rule", [ScaleRule.RCEIL, ScaleRule.FLOOR])
def test_scale_rule_every_positive_bfloat16_amax(rule: ScaleRule) -> None:
    oracle = rceil_exponent if rule is ScaleRule.RCEIL else floor_exponent
    expected = np.array([oracle(Fraction(float(v))) + 127 for v in POS_BF16.astype(np.float64)], np.uint8)
    # each amax alone in a block, and leading a full block of smaller values of both signs
    lone = POS_BF16.reshape(-1, 1)
    full = np.concatenate([lone, -(lone.astype(np.float32) * np.float32(0.5)).astype(ml_dtypes.bfloat16)] * 16, axis=1)
    for x in (lone, full, full.astype(np.float32), full.astype(np.float32)[:, :17]):
        _, s = encode_mxfp8(x, scale_rule=rule)
        assert np.array_equal(s[:, 0], expected)
    _, st = encode_mxfp8_torch(torch.from_numpy(lone.astype(np.float32)), scale_rule=rule)
    assert np.array_equal(st.numpy()[:, 0], expected)
    # the scalar helper agrees too (spot check: every 97th value)
    for v, e in zip(POS_BF16[::97].astype(np.float64), expected[::97], strict=True):
        assert scale_exponent(float(v), rule) + 127 == e


def test_rceil_matches_exact_ceil_log2_in_double() -> None:
    amax = POS_BF16.astype(np.float64)
    ref = np.clip(np.ceil(np.log2(amax / 448.0)), -127, 127).astype(np.int64) + 127
    _, s = encode_mxfp8(POS_BF16.reshape(-1, 1))
    assert np.array_equal(s[:, 0].astype(np.int64), ref)


# ---------------------------------------------------------------------------------------------
# element bits == torch's saturating float8_e4m3fn cast of the exactly scaled values
# ---------------------------------------------------------------------------------------------
def _bf16_magnitudes_up_to_448() -> np.ndarray:
    v = np.arange(0, 0x7F80, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    v = v[v <= 448.0]
    return np.concatenate([v, -v])  # includes +-0, every bf16 subnormal, every RNE tie


def _oracle_encode(x: np.ndarray, rule: ScaleRule) -> tuple[np.ndarray, np.ndarray]:
    """Reference encode of float32 rows of whole blocks: fraction scale rule + torch's cast."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 32, 32)
    amax = np.abs(xb).max(axis=2)
    pick = rceil_exponent if rule is ScaleRule.RCEIL else floor_exponent
    e = np.array([[pick(Fraction(float(a))) for a in row] for row in amax], np.int64)
    y = xb.astype(np.float64) * np.ldexp(1.0, -e)[:, :, None]  # exact in float64
    top = (e + 127 == TOP_CLAMP_SCALE_BYTE)[:, :, None]
    y = np.where(top, np.clip(y, -240.0, 240.0), y)  # our documented top-of-range clamp
    # saturating: torch >= 2.13's cast saturates at +-448 by itself, older ones give NaN from 464 up; clipping
    # first gives the same bits in both (anything in [448, 464) rounds to 448 either way)
    y = np.clip(y, -448.0, 448.0)
    q = torch.from_numpy(y).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    return q.reshape(rows, k), (e + 127).astype(np.uint8)


@pytest.mark.parametrize("rule", [ScaleRule.RCEIL, ScaleRule.FLOOR])
@pytest.mark.parametrize("pin", [448.0, 449.0, 464.0, 480.0, 500.0, 300.0, 230.0])
def test_element_bits_equal_torch_saturating_cast(rule: ScaleRule, pin: float) -> None:
    vals = _bf16_magnitudes_up_to_448()
    vals = np.concatenate([vals, np.zeros((-len(vals)) % 31, np.float32)])
    blocks = np.concatenate([np.full((len(vals) // 31, 1), pin, np.float32), vals.reshape(-1, 31)], axis=1)
    for k in (0, -60, 100, -127):
        x = np.ldexp(blocks, k).astype(np.float32)
        q_ref, s_ref = _oracle_encode(x, rule)
        q, s = encode_mxfp8(x, scale_rule=rule)
        assert np.array_equal(s, s_ref)
        assert np.array_equal(q, q_ref), np.argwhere(q != q_ref)[:5]
        qt, st = encode_mxfp8_torch(torch.from_numpy(x), scale_rule=rule)
        assert np.array_equal(qt.numpy(), q) and np.array_equal(st.numpy(), s)


def test_rne_ties_and_saturation_corner_values() -> None:
    # one block pinned at 448 so the scale is 2^0: elements are encoded as themselves
    x = np.array([448.0, 1.0625, 1.1875, 17.0, 19.0, 2.0**-10, 3 * 2.0**-10, 447.0, 2.0**-9] + [0.0] * 23, np.float32)
    q, s = encode_mxfp8(x)
    assert s.tolist() == [127]
    vals = q.view(ml_dtypes.float8_e4m3fn).astype(np.float64)[:9].tolist()
    assert vals == [448.0, 1.0, 1.25, 16.0, 20.0, 0.0, 2.0**-8, 448.0, 2.0**-9]
    # FLOOR keeps 2^0 up to amax < 512: 464 is a tie -> even 448, 500 saturates to 448
    q, s = encode_mxfp8(np.array([464.0, 500.0, -480.0, 256.0], np.float32), scale_rule="floor")
    assert s.tolist() == [127] and decode_mxfp8(q, s).tolist() == [448.0, 448.0, -448.0, 256.0]
    # FLOOR saturates: amax 1.9 * 2^k -> 1.75 * 2^k
    q, s = encode_mxfp8(np.array([1.9, 0.5], np.float32), scale_rule="floor")
    assert decode_mxfp8(q, s).tolist() == [1.75, 0.5]


# ---------------------------------------------------------------------------------------------
# policy corner cases
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_zero_and_negative_zero_blocks(dtype: type) -> None:
    x = np.zeros((2, 40), dtype)
    x[1] = -x[1]  # -0.0
    q, s = encode_mxfp8(x)
    assert (q[0] == 0).all() and (q[1] == 0x80).all() and (s == 0).all()
    d = decode_mxfp8(q, s)
    assert (d == 0).all() and np.signbit(d[1]).all() and not np.signbit(d[0]).any()
    qt, st = encode_mxfp8(
        torch.from_numpy(x.view(np.uint16 if dtype != np.float32 else np.uint32)).view(
            {np.float32: torch.float32, np.float16: torch.float16}.get(dtype, torch.bfloat16)
        )
    )
    assert np.array_equal(qt.numpy(), q) and np.array_equal(st.numpy(), s)


def test_tiny_blocks_are_encoded_exactly_with_scale_two_to_minus_127() -> None:
    # amax < 2^-118 forces e = -127; elements are scaled by exactly 2^127 and rounded once
    x = np.array([2.0**-120, -3 * 2.0**-125, 1e-40, -1e-45, 2.0**-130 * 1.0625] + [0.0] * 27, np.float32)
    q, s = encode_mxfp8(x)
    assert s.tolist() == [0]
    for xi, qi in zip(x.tolist(), q.tolist(), strict=True):
        ref = round_fraction(Fraction(xi) * Fraction(2) ** 127, (4, -6, 8))  # E4M3 as a float format
        assert e4m3_fraction(qi) == ref, (xi, qi)
    assert decode_mxfp8(q, s)[0] == 2.0**-120  # exact round trip (torchao: 2^-121 or 0)


def test_top_of_range_never_decodes_to_inf() -> None:
    top = np.arange(0x7F70, 0x7F80, dtype=np.uint16).view(ml_dtypes.bfloat16)  # 1.875..1.992 * 2^127
    x = np.concatenate([top, -top]).reshape(-1, 1)
    q, s = encode_mxfp8(x)
    d = decode_mxfp8(q, s).astype(np.float64)
    assert np.isfinite(d).all()
    xf = x.astype(np.float64)
    assert (np.abs(d - xf) <= 0.059 * np.abs(xf)).all()
    big = np.abs(xf[:, 0]) >= 1.9375 * 2.0**127
    assert (s[big] == TOP_CLAMP_SCALE_BYTE).all() and ((q[big] & 0x7F) == TOP_CLAMP_CODE).all()
    qt, st = encode_mxfp8(torch.from_numpy(x.astype(np.float32)))
    assert np.array_equal(qt.numpy(), q) and np.array_equal(st.numpy(), s)
    # FLOOR never needs the clamp: bf16 max -> 448 * 2^119
    qf, sf = encode_mxfp8(x, scale_rule="floor")
    assert np.isfinite(decode_mxfp8(qf, sf)).all() and (sf <= 246).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("framework", ["np", "pt"])
def test_non_finite_input_raises_naming_tensor_and_index(bad: float, framework: str) -> None:
    x = np.ones((3, 70), np.float32)
    x[2, 65] = bad
    x[2, 66] = bad
    arr = torch.from_numpy(x) if framework == "pt" else x
    with pytest.raises(MXFP8Error, match=r"'layers\.0\.q_proj\.weight'.*index \(2, 65\)"):
        encode_mxfp8(arr, name="layers.0.q_proj.weight")
    with pytest.raises(ValueError, match=r"non-finite .* at index \(205,\)"):  # a ValueError subclass
        encode_mxfp8(arr.reshape(-1))


def test_bad_inputs_raise_mxfp8error() -> None:
    with pytest.raises(MXFP8Error, match="dtype float64"):
        encode_mxfp8(np.ones(4), name="w")
    with pytest.raises(MXFP8Error, match="rank >= 1"):
        encode_mxfp8(np.zeros((), np.float32))
    with pytest.raises(MXFP8Error, match="scale_rule"):
        encode_mxfp8(np.ones(4, np.float32), scale_rule="nearest")
    with pytest.raises(MXFP8Error, match=r"'w'.*scales shape \(3,\).*expected \(2,\)"):
        decode_mxfp8(np.zeros(40, np.uint8), np.zeros(3, np.uint8), name="w")
    with pytest.raises(MXFP8Error, match="uint8"):
        decode_mxfp8(np.zeros(4, np.int8), np.zeros(1, np.uint8))
    with pytest.raises(MXFP8Error, match="decode dtype"):
        decode_mxfp8(np.zeros(4, np.uint8), np.zeros(1, np.uint8), dtype=np.float16)
    with pytest.raises(MXFP8Error, match="both"):
        decode_mxfp8(torch.zeros(4, dtype=torch.uint8), np.zeros(1, np.uint8))


def test_shapes_types_and_float8_views() -> None:
    assert scales_shape((5, 0)) == (5, 0) and scales_shape((2, 3, 65)) == (2, 3, 3)
    q, s = encode_mxfp8(np.zeros((3, 0), np.float32))
    assert q.shape == (3, 0) and s.shape == (3, 0) and decode_mxfp8(q, s).shape == (3, 0)
    x = np.linspace(-3, 3, 2 * 3 * 65, dtype=np.float32).reshape(2, 3, 65)
    q, s = encode_mxfp8(x)
    assert q.dtype == np.uint8 and s.shape == (2, 3, 3)
    # payload / scales may arrive as float8 views (what the safetensors reader sees)
    d1 = decode_mxfp8(q.view(ml_dtypes.float8_e4m3fn), s.view(ml_dtypes.float8_e8m0fnu))
    d2 = decode_mxfp8(torch.from_numpy(q).view(torch.float8_e4m3fn), torch.from_numpy(s).view(torch.float8_e8m0fnu))
    assert np.array_equal(d1, decode_mxfp8(q, s)) and np.array_equal(d2.numpy(), d1)
    # non-contiguous input
    xt = np.asfortranarray(x[0])
    assert np.array_equal(encode_mxfp8(xt)[0], encode_mxfp8(np.ascontiguousarray(xt))[0])
    tq, ts = encode_mxfp8(torch.from_numpy(x).transpose(0, 1))
    nq, ns = encode_mxfp8(np.ascontiguousarray(x.transpose(1, 0, 2)))
    assert np.array_equal(tq.numpy(), nq) and np.array_equal(ts.numpy(), ns)
    dt = decode_mxfp8(torch.from_numpy(q), torch.from_numpy(s), dtype=torch.bfloat16)
    assert dt.dtype == torch.bfloat16 and dt.device.type == "cpu"


def test_encode_numpy_path_direct_and_chunking_boundaries() -> None:
    # more rows than one chunk holds, with a partial last block, to cross chunk edges
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((9000, 45)) * np.exp(rng.uniform(-30, 30, (9000, 1)))).astype(np.float32)
    q, s = encode_mxfp8_numpy(x)
    qt, st = encode_mxfp8_torch(torch.from_numpy(x))
    assert np.array_equal(q, qt.numpy()) and np.array_equal(s, st.numpy())
    d = decode_mxfp8_numpy(q, s)
    assert np.array_equal(d, decode_mxfp8_torch(qt, st).numpy())


def test_decode_into_out_buffers() -> None:
    x = np.random.default_rng(0).standard_normal((5, 70)).astype(np.float32)
    q, s = encode_mxfp8(x)
    for dtype in (np.float32, ml_dtypes.bfloat16):
        ref = decode_mxfp8(q, s, dtype=dtype)
        for fn in (decode_mxfp8, decode_mxfp8_numpy):
            out = np.full((5, 70), 7, dtype)
            assert fn(q, s, dtype=dtype, out=out) is out
            assert np.array_equal(out.view(np.uint8), ref.view(np.uint8))
    t = torch.full((5, 70), 7.0, dtype=torch.bfloat16)
    assert decode_mxfp8(torch.from_numpy(q), torch.from_numpy(s), dtype=torch.bfloat16, out=t) is t
    assert np.array_equal(t.float().numpy(), decode_mxfp8(q, s, dtype=ml_dtypes.bfloat16).astype(np.float32))
    with pytest.raises(MXFP8Error, match=r"'w': out must be a float32 array of shape \(5, 70\)"):
        decode_mxfp8(q, s, out=np.empty((5, 70), np.float16), name="w")
    with pytest.raises(MXFP8Error, match="C-contiguous"):
        decode_mxfp8(q, s, out=np.empty((70, 5), np.float32).T)
    with pytest.raises(MXFP8Error, match="contiguous float32 or bfloat16"):
        decode_mxfp8(torch.from_numpy(q), torch.from_numpy(s), out=torch.empty(70, 5).T)
    with pytest.raises(MXFP8Error, match="torch tensor for torch input"):
        decode_mxfp8(torch.from_numpy(q), torch.from_numpy(s), out=np.empty((5, 70), np.float32))


def test_encode_into_out_buffers() -> None:
    x = np.random.default_rng(1).standard_normal((5, 70)).astype(np.float32)
    q, s = encode_mxfp8(x)
    for fn in (encode_mxfp8, encode_mxfp8_numpy):
        qo, so = np.full_like(q, 9), np.full_like(s, 9)
        rq, rs = fn(x, out=(qo, so))
        assert rq is qo and rs is so and np.array_equal(qo, q) and np.array_equal(so, s)
    tq, ts = torch.zeros(5, 70, dtype=torch.uint8), torch.zeros(5, 3, dtype=torch.uint8)
    rq, rs = encode_mxfp8(torch.from_numpy(x), out=(tq, ts))
    assert rq is tq and rs is ts and np.array_equal(tq.numpy(), q) and np.array_equal(ts.numpy(), s)
    with pytest.raises(MXFP8Error, match=r"'w': out scales must be a uint8 array of shape \(5, 3\)"):
        encode_mxfp8(x, out=(np.empty((5, 70), np.uint8), np.empty((5, 2), np.uint8)), name="w")
    with pytest.raises(MXFP8Error, match="pair"):
        encode_mxfp8(x, out=(np.empty((5, 70), np.uint8),), name="w")
    with pytest.raises(MXFP8Error, match="numpy arrays for numpy input"):
        encode_mxfp8(x, out=(tq, ts))
    with pytest.raises(MXFP8Error, match="contiguous uint8"):
        encode_mxfp8(torch.from_numpy(x), out=(tq, ts.float()))


def test_torch_path_chunking_matches_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    import mxfp8_codec.numerics_torch as nt

    monkeypatch.setattr(nt, "TORCH_CHUNK_ELEMENTS", 200)  # many chunks of 2-3 rows
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((23, 70)) * np.exp(rng.uniform(-20, 20, (23, 1)))).astype(np.float32)
    q, s = encode_mxfp8_numpy(x)
    qt, st = encode_mxfp8_torch(torch.from_numpy(x))
    assert np.array_equal(qt.numpy(), q) and np.array_equal(st.numpy(), s)
    for dtype, tdtype in ((np.float32, torch.float32), (ml_dtypes.bfloat16, torch.bfloat16)):
        ref = decode_mxfp8_numpy(q, s, dtype=dtype).astype(np.float32)
        got = decode_mxfp8_torch(torch.from_numpy(q), torch.from_numpy(s), dtype=tdtype).float().numpy()
        assert np.array_equal(got, ref)
    x[17, 41] = -np.inf
    with pytest.raises(MXFP8Error, match=r"'w'.*-inf at index \(17, 41\)"):
        encode_mxfp8_torch(torch.from_numpy(x), name="w")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the torch path on GPU)")
def test_cuda_tensors_stay_on_device_with_identical_bits() -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((64, 100)) * np.exp(rng.uniform(-40, 40, (64, 1)))).astype(np.float32)
    x[0] = 0.0
    x[1] = -0.0
    x[2, :5] = [2.0**-130, 3.3e38, -1e-45, 464.0, 1.9375 * 2.0**127]
    q, s = encode_mxfp8(x)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        xin = torch.from_numpy(x).to(dt)
        if dt == torch.float16:  # 3.3e38 and the like overflow to inf: refused on both devices alike
            for device in ("cpu", "cuda"):
                with pytest.raises(MXFP8Error, match=r"non-finite value inf at index \(2, 1\)"):
                    encode_mxfp8(xin.to(device))
            xin = torch.from_numpy(np.clip(x, -65504.0, 65504.0)).to(dt)
        ref_q, ref_s = encode_mxfp8(xin)  # CPU: numpy/native path
        qc, sc = encode_mxfp8(xin.cuda())
        assert qc.device.type == "cuda" and sc.device.type == "cuda"
        assert torch.equal(qc.cpu(), ref_q) and torch.equal(sc.cpu(), ref_s)
    tq, ts = torch.from_numpy(q).cuda(), torch.from_numpy(s).cuda()
    for tdtype, dtype, ibits in (
        (torch.float32, np.float32, torch.int32),
        (torch.bfloat16, ml_dtypes.bfloat16, torch.int16),
    ):
        d = decode_mxfp8(tq, ts, dtype=tdtype)
        assert d.device.type == "cuda"
        ref = decode_mxfp8(q, s, dtype=dtype)
        assert np.array_equal(d.cpu().view(ibits).numpy(), ref.view(np.int32 if tdtype == torch.float32 else np.int16))
        out = torch.empty_like(d)
        assert decode_mxfp8(tq, ts, dtype=tdtype, out=out) is out and torch.equal(out.view(ibits), d.view(ibits))
