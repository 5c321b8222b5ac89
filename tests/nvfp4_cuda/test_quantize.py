"""NVFP4 quantization against an independent numpy/ml_dtypes oracle of Transformer Engine's op order.

Covers: bit-exact codes / block scales / tensor scale for 1x16 and 16x16 blocks on several value
distributions, TE's guards on zero / tiny / saturating blocks, -0, the exact transpose of 2-D-block
weights, the Hadamard transform, and stochastic rounding (reproducible, unbiased).

Run: python -m pytest -q tests/nvfp4_cuda/test_quantize.py
"""

from __future__ import annotations

import math
import zlib

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nvfp4_cuda
from nvfp4_cuda import formats as F

FLT_MAX = np.float32(np.finfo(np.float32).max)


def oracle_quantize(x: np.ndarray, block_2d: bool) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """TE's formula with numpy float32 scalars/arrays and ml_dtypes casts; returns (codes [R,C], sf bits, S_dec)."""
    x = x.astype(np.float32)
    r, c = x.shape
    amax = np.float32(np.abs(x).max())
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.float32(np.float32(448.0 * 6.0) / amax)
    s_enc = min(s_enc, FLT_MAX)
    if amax == 0 or s_enc == 0:
        s_enc = np.float32(1.0)
    s_dec = np.float32(np.float32(1.0) / s_enc)
    bam = np.abs(x).reshape(r, c // 16, 16).max(axis=2)
    if block_2d:
        for t in range(0, r, 16):
            bam[t : t + 16] = bam[t : t + 16].max(axis=0, keepdims=True)
    sf_f = np.minimum(bam * np.float32(s_enc * np.float32(1.0 / 6.0)), np.float32(448.0)).astype(np.float32)
    sf = sf_f.astype(ml_dtypes.float8_e4m3fn)
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.minimum(np.float32(1.0) / (sf.astype(np.float32) * s_dec), FLT_MAX).astype(np.float32)
    v = (x.reshape(r, c // 16, 16) * enc[:, :, None]).reshape(r, c)
    codes = v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    return codes, sf.view(np.uint8), s_dec


def _check_against_oracle(x: torch.Tensor, block_2d: bool) -> nvfp4_cuda.NVFP4Tensor:
    q = nvfp4_cuda.quantize_nvfp4(x, block_2d=block_2d)
    codes, sf, s_dec = oracle_quantize(x.float().numpy(), block_2d)
    assert np.array_equal(F.unpack_nibbles(q.codes).numpy(), codes)
    assert np.array_equal(q.block_scales.numpy(), sf)
    assert q.tensor_scale.numpy().tobytes() == np.float32(s_dec).tobytes()
    return q


DISTRIBUTIONS = {
    "normal": lambda g: torch.randn(48, 96, generator=g),
    "heavy_tail": lambda g: torch.randn(48, 96, generator=g) * torch.exp(3 * torch.randn(48, 96, generator=g)),
    "tiny": lambda g: torch.randn(48, 96, generator=g) * 1e-30,
    "huge": lambda g: torch.randn(48, 96, generator=g) * 1e30,
    "fp32_subnormal": lambda g: torch.randn(48, 96, generator=g) * 1e-41,
    "with_zero_blocks": lambda g: (
        torch.randn(48, 96, generator=g)
        * (torch.rand(48, 6, 1, generator=g) > 0.3).float().expand(48, 6, 16).reshape(48, 96)
    ),
    "integers": lambda g: torch.randint(-8, 9, (48, 96), generator=g).float(),
}


@pytest.mark.parametrize("block_2d", [False, True], ids=["1x16", "16x16"])
@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_quantize_matches_te_oracle(dist: str, block_2d: bool) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(dist.encode()))
    _check_against_oracle(DISTRIBUTIONS[dist](g), block_2d)


def test_bf16_input_same_as_its_fp32_value() -> None:
    x = torch.randn(16, 64).to(torch.bfloat16)
    a, b = nvfp4_cuda.quantize_nvfp4(x), nvfp4_cuda.quantize_nvfp4(x.float())
    assert torch.equal(a.codes, b.codes) and torch.equal(a.block_scales, b.block_scales)
    _check_against_oracle(x, False)


def test_all_zero_tensor_uses_unit_scale() -> None:
    q = nvfp4_cuda.quantize_nvfp4(torch.zeros(16, 32))
    assert float(q.tensor_scale) == 1.0
    assert int(q.codes.max()) == 0 and int(q.block_scales.max()) == 0


def test_zero_block_and_negative_zero_keep_sign() -> None:
    x = torch.zeros(1, 32)
    x[0, 16:] = torch.randn(16)
    x[0, 3] = -0.0
    q = nvfp4_cuda.quantize_nvfp4(x)
    codes = F.unpack_nibbles(q.codes)[0]
    assert int(q.block_scales[0, 0]) == 0  # zero block: sf = 0, enc = FLT_MAX, codes stay 0
    assert int(codes[3]) == 8 and int(codes[0]) == 0  # -0 keeps its sign bit
    assert torch.equal(nvfp4_cuda.dequantize_nvfp4(q)[0, :16], torch.zeros(16))


def test_saturating_block_rounds_scale_down_then_clips_to_6() -> None:
    """sf_f = 13.4 rounds to E4M3 13, so amax * enc = 6.18 and the block max saturates to code 7 (6)."""
    x = torch.zeros(1, 32)
    x[0, 0] = 2688.0  # global amax -> S_enc = 1, S_dec = 1
    x[0, 16] = 80.4  # block amax: sf_f = 80.4 / 6 = 13.4 -> 13
    q = nvfp4_cuda.quantize_nvfp4(x)
    assert float(q.tensor_scale) == 1.0
    assert float(F.e4m3_decode(q.block_scales)[0, 1]) == 13.0
    assert int(F.unpack_nibbles(q.codes)[0, 16]) == 7
    assert float(nvfp4_cuda.dequantize_nvfp4(q)[0, 16]) == 6.0 * 13.0


def test_tiny_global_amax_clamps_encode_scale_to_flt_max() -> None:
    x = torch.zeros(1, 16)
    x[0, 0] = 1e-40  # float32 subnormal: 2688 / amax overflows -> FLT_MAX
    q = _check_against_oracle(x, False)
    assert float(q.tensor_scale) == pytest.approx(1.0 / float(FLT_MAX), rel=1e-6)


@pytest.mark.parametrize("shape", [(32, 64), (48, 16)])
def test_2d_blocks_share_tile_scale_and_transpose_exactly(shape: tuple[int, int]) -> None:
    w = torch.randn(*shape) * torch.exp(torch.randn(*shape))
    q = nvfp4_cuda.quantize_nvfp4(w, block_2d=True)
    tiles = q.block_scales.view(shape[0] // 16, 16, -1)
    assert bool((tiles == tiles[:, :1, :]).all())
    qt = nvfp4_cuda.quantize_nvfp4(w.t().contiguous(), block_2d=True)
    assert torch.equal(F.unpack_nibbles(qt.codes), F.unpack_nibbles(q.codes).t())
    t = q.t()
    assert torch.equal(t.codes, qt.codes) and torch.equal(t.block_scales, qt.block_scales)
    assert torch.equal(t.tensor_scale, qt.tensor_scale) and t.shape == qt.shape
    assert torch.equal(nvfp4_cuda.dequantize_nvfp4(t), nvfp4_cuda.dequantize_nvfp4(q).t())


def test_transpose_of_1x16_tensor_is_refused() -> None:
    with pytest.raises(ValueError, match="16x16"):
        nvfp4_cuda.quantize_nvfp4(torch.randn(16, 32)).t()


@pytest.mark.parametrize("shape", [(20, 48), (16, 33), (1, 5)])
def test_transpose_flag_quantizes_the_zero_padded_transpose(shape: tuple[int, int]) -> None:
    """transpose=True: x [tokens, features] as x.T [features, tokens'], tokens zero-padded to 16 (written out here)."""
    x = torch.randn(*shape)
    r, c = shape
    xt = torch.zeros(c, -(-r // 16) * 16)
    xt[:, :r] = x.t()
    for kw in ({}, {"hadamard": True, "rounding": "stochastic", "seed": 3}):
        q = nvfp4_cuda.quantize_nvfp4(x, transpose=True, **kw)
        want = nvfp4_cuda.quantize_nvfp4(xt, **kw)
        assert q.shape == want.shape and torch.equal(q.codes, want.codes)
        assert torch.equal(q.block_scales, want.block_scales) and torch.equal(q.tensor_scale, want.tensor_scale)
        v, s = nvfp4_cuda.quantize_decoded(x, transpose=True, **kw)
        assert torch.equal(v, nvfp4_cuda.decode_scaled(want)) and torch.equal(s, want.tensor_scale)
    with pytest.raises(ValueError, match="quantize_nvfp4: expected a 2-D tensor"):
        nvfp4_cuda.quantize_nvfp4(torch.randn(16), transpose=True)


def test_partial_row_tile_for_2d_blocks() -> None:
    _check_against_oracle(torch.randn(20, 32), True)


def _hadamard_matrix() -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    for _ in range(4):
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    s = torch.tensor(F.HADAMARD_SIGNS, dtype=torch.float64)
    return torch.diag(s) @ h / 4.0


def test_hadamard16_matches_matrix_and_is_orthonormal() -> None:
    x = torch.randn(8, 64)
    m = _hadamard_matrix()
    assert torch.allclose(m @ m.t(), torch.eye(16, dtype=torch.float64))
    y = nvfp4_cuda.hadamard16(x)
    want = (x.double().view(8, 4, 16) @ m).view(8, 64)
    assert torch.allclose(y.double(), want, atol=1e-6)
    # integer inputs: every butterfly sum is exact, so the float32 result is exactly the matrix product
    xi = torch.randint(-50, 50, (4, 32)).float()
    assert torch.equal(nvfp4_cuda.hadamard16(xi).double(), (xi.double().view(4, 2, 16) @ m).view(4, 32))
    # (A H)(B H)^T = A B^T: the weight-gradient GEMM is unchanged by rotating both operands along K
    a, b = torch.randn(5, 32).double(), torch.randn(7, 32).double()
    ha, hb = nvfp4_cuda.hadamard16(a).double(), nvfp4_cuda.hadamard16(b).double()
    assert torch.allclose(ha @ hb.t(), a @ b.t(), atol=1e-4)


def test_quantize_with_hadamard_is_quantize_of_transform() -> None:
    x = torch.randn(16, 48)
    a = nvfp4_cuda.quantize_nvfp4(x, hadamard=True)
    b = nvfp4_cuda.quantize_nvfp4(nvfp4_cuda.hadamard16(x))
    assert torch.equal(a.codes, b.codes) and torch.equal(a.block_scales, b.block_scales)


def test_stochastic_rounding_reproducible_and_keyed() -> None:
    x = torch.randn(32, 64)
    kw = {"rounding": "stochastic", "seed": 3, "step": 10, "tensor_id": 2}
    a, b = nvfp4_cuda.quantize_nvfp4(x, **kw), nvfp4_cuda.quantize_nvfp4(x, **kw)
    assert torch.equal(a.codes, b.codes)
    c = nvfp4_cuda.quantize_nvfp4(x, **{**kw, "step": 11})
    assert not torch.equal(a.codes, c.codes)
    assert torch.equal(a.block_scales, c.block_scales)  # scales are always RNE


@pytest.mark.parametrize("value", [2.3, 0.6, 4.9, 1.1])
def test_stochastic_rounding_unbiased(value: float) -> None:
    """Mean of SR codes over 2**17 elements equals the scaled input within 5 standard errors.

    Every 16-block holds one 6.0 so that S_enc = 448 and enc = 1 / (448 * S_dec) is known; the
    expected code value is value * enc and the per-element rounding is Bernoulli(frac) on the grid.
    """
    n_rows = 2**17 // 16
    x = torch.full((n_rows, 16), value)
    x[:, 0] = 6.0
    q = nvfp4_cuda.quantize_nvfp4(x, rounding="stochastic", seed=1, step=0, tensor_id=0)
    s_dec = np.float32(q.tensor_scale.item())
    enc = np.float32(1.0) / (np.float32(448.0) * s_dec)
    target = float(np.float32(value) * enc)
    vals = F.e2m1_decode_table(torch.float64)[F.unpack_nibbles(q.codes)[:, 1:].long()]
    u = 0.5 if target < 2 else (1.0 if target < 4 else 2.0)
    p = (target % u) / u
    stderr = u * math.sqrt(p * (1 - p) / vals.numel())
    assert abs(float(vals.mean()) - target) < 5 * stderr + 1e-7
    assert set(torch.unique(vals).tolist()) <= {target - target % u, target - target % u + u}


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (torch.randn(16), "2-D"),
        (torch.randn(4, 24), "multiple of 16"),
        (torch.ones(2, 16, dtype=torch.int32), "floating"),
    ],
)
def test_bad_input_errors(bad: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        nvfp4_cuda.quantize_nvfp4(bad)


def test_nonfinite_input_names_index() -> None:
    x = torch.randn(4, 32)
    x[2, 5] = float("nan")
    with pytest.raises(ValueError, match=r"\[2, 5\]"):
        nvfp4_cuda.quantize_nvfp4(x)
    with pytest.raises(ValueError, match="rounding"):
        nvfp4_cuda.quantize_nvfp4(torch.randn(4, 32), rounding="up")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.floats(-30, 30), st.booleans(), st.integers(0, 2**31 - 1))
def test_property_oracle_and_error_bound(rows: int, blocks: int, log_scale: float, block_2d: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 16 * blocks, generator=g) * float(2.0**log_scale)
    q = _check_against_oracle(x, block_2d)
    # decode error per element is at most half the E2M1 spacing at 6 (i.e. 1) times the block's step
    sf = F.e4m3_decode(q.block_scales).double() * float(q.tensor_scale)
    err = nvfp4_cuda.dequantize_nvfp4(q).double() - x.double()
    bound = sf.repeat_interleave(16, dim=1) * 1.0 * (1 + 1e-5) + 1e-30
    sat = x.abs().double() > 6 * sf.repeat_interleave(16, dim=1)
    assert bool(((err.abs() <= bound) | sat).all())


def test_empty_tensor() -> None:
    q = nvfp4_cuda.quantize_nvfp4(torch.zeros(0, 32))
    assert q.codes.shape == (0, 16) and float(q.tensor_scale) == 1.0
    assert nvfp4_cuda.nvfp4_matmul(q, nvfp4_cuda.quantize_nvfp4(torch.randn(4, 32))).shape == (0, 4)
