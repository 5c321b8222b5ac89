"""E2M1 / E4M3 / UE8M0 conversions of nvfp4_cuda.formats against ml_dtypes and torch (exhaustive where small).

Run: python -m pytest -q tests/nvfp4_cuda/test_formats.py
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nvfp4_cuda import formats as F


def _all_finite_f16_as_f32() -> torch.Tensor:
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    v = bits.view(torch.float16).to(torch.float32)
    return v[torch.isfinite(v)]


def _ml_e2m1_codes(v: torch.Tensor) -> np.ndarray:
    return v.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F


def test_e2m1_table_matches_ml_dtypes() -> None:
    ours = F.e2m1_decode_table().numpy()
    theirs = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(ours, theirs)
    assert np.signbit(ours[8]) and ours[8] == 0.0  # code 8 is -0


@pytest.mark.parametrize("encode", [F.e2m1_encode, F.e2m1_encode_grid], ids=["fast", "grid"])
@pytest.mark.parametrize(
    ("value", "code"),
    [
        (0.0, 0),
        (-0.0, 8),
        (0.25, 0),
        (0.2500001, 1),
        (0.75, 2),
        (0.7499999, 1),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
        (5.0000005, 7),
        (6.0, 7),
        (7.0, 7),
        (1e30, 7),
        (-0.1, 8),
        (-0.25, 8),
        (-6.5, 15),
        (-3.0, 13),
        (1.5, 3),
    ],
)
def test_e2m1_rne_ties_saturation_negative_zero(encode, value: float, code: int) -> None:
    assert int(encode(torch.tensor([value], dtype=torch.float32))[0]) == code


def test_e2m1_exhaustive_fp16_grid_three_way() -> None:
    """Every finite float16 value (as float32): fast path == grid path (the CUDA algorithm) == ml_dtypes."""
    v = torch.cat((_all_finite_f16_as_f32(), torch.randn(20000) * 4))
    fast, grid = F.e2m1_encode(v).numpy(), F.e2m1_encode_grid(v).numpy()
    assert np.array_equal(fast, grid)
    assert np.array_equal(fast, _ml_e2m1_codes(v))


def test_nibble_order_matches_te_formula_and_torch_fp4_dtype() -> None:
    """Even element in the low nibble: TE's ``result[:, ::2] + result[:, 1::2] * 16`` and torch's fp4x2 view."""
    v = torch.randn(4, 32) * 3
    codes = _ml_e2m1_codes(v)
    te_packed = codes[:, ::2] + codes[:, 1::2] * 16
    ours = F.pack_nibbles(F.e2m1_encode(v))
    assert np.array_equal(ours.numpy(), te_packed.astype(np.uint8))
    assert torch.equal(F.unpack_nibbles(ours), torch.from_numpy(codes))
    fp4 = ours.view(torch.float4_e2m1fn_x2)  # one byte = two E2M1 values
    assert fp4.shape == (4, 16) and torch.equal(fp4.view(torch.uint8), ours)
    # a byte holding (low=1.0, high=-6.0) is 0xF2
    assert int(F.pack_nibbles(F.e2m1_encode(torch.tensor([[1.0, -6.0]])))[0, 0]) == 0xF2


def test_e4m3_grid_equals_torch_cast_and_ml_dtypes() -> None:
    """E4M3 RNE: grid path == torch cast == ml_dtypes (clipped) on all float16 values and random wide-range data."""
    wide = torch.randn(100000) * torch.exp2(torch.randint(-20, 12, (100000,)).float())
    ties = torch.tensor([2.0**-10, 1.5 * 2**-10, 2.5 * 2**-9, 448.0, 464.0, 480.0, -500.0, 2.0**-6 * 1.0625])
    v = torch.cat((_all_finite_f16_as_f32(), wide, ties))
    grid = F.e4m3_encode_grid(v)
    fast = F.e4m3_encode(v)
    ml = np.clip(v.numpy(), -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert torch.equal(grid, fast)
    assert np.array_equal(grid.numpy(), ml)


def test_e4m3_decode_table() -> None:
    t = F.e4m3_decode_table().numpy()
    ml = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(np.isnan(t), np.isnan(ml)) and np.array_equal(t[~np.isnan(t)], ml[~np.isnan(ml)])
    assert np.isnan(t[0x7F]) and np.isnan(t[0xFF]) and t[0x7E] == 448.0 and t[1] == 2.0**-9


def test_every_e2m1_times_e4m3_product_is_exact_in_bf16() -> None:
    """All 16 x 254 finite products (238 distinct magnitudes) survive a bfloat16 round trip exactly."""
    e2m1 = F.e2m1_decode_table(torch.float64)
    e4m3 = F.e4m3_decode_table().double()
    e4m3 = e4m3[~torch.isnan(e4m3)]
    prod = (e2m1[:, None] * e4m3[None, :]).reshape(-1)
    assert torch.equal(prod.to(torch.bfloat16).double(), prod)
    assert torch.equal(prod.to(torch.float16).double(), prod)
    mags = torch.unique(prod.abs())
    assert mags.numel() == 238 and mags[1] == 2.0**-10 and mags[-1] == 2688.0


def test_pow2_and_e8m0_decode_exhaustive() -> None:
    e = torch.arange(-149, 128)
    assert torch.equal(F.pow2_f32(e).double(), torch.tensor([2.0 ** int(k) for k in e], dtype=torch.float64))
    s = torch.arange(256).to(torch.uint8)
    dec = F.e8m0_decode(s)
    ml = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert torch.isnan(dec[255]) and np.array_equal(dec[:255].numpy(), ml[:255])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-100, 100, width=32), min_size=1, max_size=64), st.integers(0, 2**24 - 1))
def test_e2m1_rounding_lands_on_a_neighbour(values: list[float], r: int) -> None:
    """RNE picks a nearest grid point; stochastic rounding picks one of the two bracketing grid points."""
    v = torch.tensor(values, dtype=torch.float32)
    table = F.e2m1_decode_table(torch.float64)
    grid = table[:8]
    near = table[F.e2m1_encode(v).long()].abs()
    a = v.double().abs().clamp(max=6.0)
    best = (grid[None, :] - a[:, None]).abs().min(dim=1).values
    assert torch.equal((near - a).abs(), best)
    sr = table[F.e2m1_encode(v, torch.full(v.shape, r, dtype=torch.int64)).long()].abs()
    lo = torch.stack([grid[grid <= x].max() for x in a])
    hi = torch.stack([grid[grid >= x].min() for x in a])
    assert bool(((sr == lo) | (sr == hi)).all())
