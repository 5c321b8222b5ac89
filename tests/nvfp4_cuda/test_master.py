"""MXFP8 master ops: the codec's torch path (the oracle nvfp4_cuda's reference uses) bit-identical to its
numpy/native paths, stochastic rounding, NVFP4-from-MXFP8, the fused Lion
step (one-step float32 oracle, the frozen-master regression under RNE, SR realising the mean update,
the compensation buffer) and float32 -> bfloat16 stochastic rounding.

Run: python -m pytest -q tests/nvfp4_cuda/test_master.py
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mxfp8_codec
import nvfp4_cuda

SHAPES = [(70,), (5, 96), (3, 4, 40), (2, 33)]


def _data(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp(4 * torch.randn(*shape, generator=g))
    flat = x.view(-1)
    flat[:3] = torch.tensor([0.0, -0.0, 1e-40])
    if flat.numel() > 40:
        flat[32:40] = 0.0
    return x


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_encode_rne_bit_identical_to_codec(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _data(shape, len(shape)).to(dtype)
    p, s = mxfp8_codec.encode_mxfp8_torch(x)
    cp, cs = mxfp8_codec.encode_mxfp8(x)
    assert torch.equal(p, cp) and torch.equal(s, cs)
    npp, nps = mxfp8_codec.encode_mxfp8(x.float().numpy())
    assert np.array_equal(p.numpy(), npp) and np.array_equal(s.numpy(), nps)


def test_encode_corner_blocks_identical_to_codec() -> None:
    x = torch.zeros(6, 32)
    x[0] = 2.0**-125 * torch.rand(32)  # tiny block (scale clamps at 2**-127, still exact)
    x[1] = 3.0e38 * torch.rand(32)  # top of the range: elements saturate at 240
    x[1, 0] = 3.4e38
    x[2, :] = -0.0
    x[3] = torch.tensor([448.0 * 2**k for k in range(-16, 16)])
    x[4] = 1.75 * 2.0 ** torch.arange(-16, 16).float()  # mantissa exactly 1.75 (RCEIL boundary)
    x[5] = 1.7500001
    p, s = mxfp8_codec.encode_mxfp8_torch(x)
    cp, cs = mxfp8_codec.encode_mxfp8(x)
    assert torch.equal(p, cp) and torch.equal(s, cs)
    assert int(s[2, 0]) == 0 and bool((p[2] == 0x80).all())
    assert torch.isfinite(mxfp8_codec.decode_mxfp8_torch(p, s)).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 100), st.floats(-60, 60), st.integers(0, 2**31 - 1))
def test_property_encode_identical_to_codec(rows: int, cols: int, log_scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * float(2.0**log_scale)
    p, s = mxfp8_codec.encode_mxfp8_torch(x)
    cp, cs = mxfp8_codec.encode_mxfp8(x)
    assert torch.equal(p, cp) and torch.equal(s, cs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_all_code_scale_pairs_identical_to_codec(dtype: torch.dtype) -> None:
    payload = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 1)  # [256 scales, 256 codes]
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 8)
    ours = mxfp8_codec.decode_mxfp8_torch(payload, scales, dtype=dtype)
    theirs = mxfp8_codec.decode_mxfp8(payload, scales, dtype=dtype)
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
    finite = ~torch.isnan(ours)
    assert torch.equal(ours[finite], theirs[finite])


def test_encode_decode_errors() -> None:
    x = torch.randn(2, 40)
    x[1, 33] = float("inf")
    with pytest.raises(ValueError, match=r"\(1, 33\)"):
        mxfp8_codec.encode_mxfp8_torch(x)
    with pytest.raises(ValueError, match="scales shape"):
        mxfp8_codec.decode_mxfp8_torch(torch.zeros(2, 40, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="rounding"):
        mxfp8_codec.encode_mxfp8_torch(torch.randn(4), rounding="down")


def test_stochastic_encode_unbiased_reproducible_and_on_neighbours() -> None:
    n = 2**16
    x = torch.full((n,), 0.0213)
    x[::32] = 0.05  # block amax fixes the scale: 2**-12 * ... (element spacing 2**-9 at 0.0213 -> see below)
    kw = {"rounding": "stochastic", "seed": 5, "step": 1, "tensor_id": 3}
    p, s = mxfp8_codec.encode_mxfp8_torch(x, **kw)
    p2, _ = mxfp8_codec.encode_mxfp8_torch(x, **kw)
    assert torch.equal(p, p2)
    assert not torch.equal(p, mxfp8_codec.encode_mxfp8_torch(x, **{**kw, "step": 2})[0])
    d = mxfp8_codec.decode_mxfp8_torch(p, s).double()
    mask = torch.ones(n, dtype=torch.bool)
    mask[::32] = False
    vals = d[mask]
    lo, hi = float(vals.min()), float(vals.max())
    assert len(torch.unique(vals)) == 2 and lo < 0.0213 < hi
    p_up = (0.0213 - lo) / (hi - lo)
    stderr = (hi - lo) * math.sqrt(p_up * (1 - p_up) / vals.numel())
    assert abs(float(vals.mean()) - float(np.float32(0.0213))) < 5 * stderr


@pytest.mark.parametrize("transpose", [False, True])
def test_quantize_nvfp4_from_mxfp8(transpose: bool) -> None:
    w = torch.randn(64, 32) * 0.02
    p, s = mxfp8_codec.encode_mxfp8_torch(w)
    q = nvfp4_cuda.quantize_nvfp4_from_mxfp8(p, s, transpose=transpose)
    dec = mxfp8_codec.decode_mxfp8_torch(p, s)
    want = nvfp4_cuda.quantize_nvfp4(dec.t().contiguous() if transpose else dec, block_2d=True)
    assert q.block_2d and torch.equal(q.codes, want.codes) and torch.equal(q.block_scales, want.block_scales)
    if transpose:
        direct = nvfp4_cuda.quantize_nvfp4_from_mxfp8(p, s).t()
        assert torch.equal(direct.codes, q.codes) and torch.equal(direct.block_scales, q.block_scales)


# ---- Lion -------------------------------------------------------------------------------------------
def lion_oracle(w: np.ndarray, g: np.ndarray, m: np.ndarray, lr: float, b1: float, b2: float, wd: float):
    """The documented float32 op order in numpy, re-encoded with mxfp8_codec (RNE)."""
    f = np.float32
    c = (m * f(b1)) + (g * f(1.0 - b1))
    t = (w * f(1.0 - lr * wd)) + np.sign(c).astype(np.float32) * f(-lr)
    p, s = mxfp8_codec.encode_mxfp8(t.astype(np.float32))
    m_new = ((m * f(b2)) + (g * f(1.0 - b2))).astype(ml_dtypes.bfloat16)
    return p, s, m_new, t


def _master(shape: tuple[int, int], seed: int, mean: float = 0.0, std: float = 0.02):
    g = torch.Generator().manual_seed(seed)
    w = mean + std * torch.randn(*shape, generator=g)
    p, s = mxfp8_codec.encode_mxfp8_torch(w)
    return p, s


def test_lion_one_step_rne_matches_oracle() -> None:
    p, s = _master((8, 64), 0)
    grad = torch.randn(8, 64)
    mom = (0.01 * torch.randn(8, 64)).to(torch.bfloat16)
    w0 = mxfp8_codec.decode_mxfp8_torch(p, s).numpy()
    op, os_, om, _ = lion_oracle(w0, grad.numpy(), mom.float().numpy(), 1e-2, 0.9, 0.99, 0.1)
    nvfp4_cuda.lion_step_mxfp8_(p, s, grad, mom, lr=1e-2, weight_decay=0.1, writeback="rne")
    assert np.array_equal(p.numpy(), op) and np.array_equal(s.numpy(), os_)
    assert np.array_equal(mom.float().numpy(), om.astype(np.float32))


def test_lion_compensated_keeps_exact_residual() -> None:
    p, s = _master((4, 64), 1)
    w0 = mxfp8_codec.decode_mxfp8_torch(p, s).numpy()
    grad, mom = torch.randn(4, 64), torch.zeros(4, 64, dtype=torch.bfloat16)
    comp = torch.zeros(4, 64)
    nvfp4_cuda.lion_step_mxfp8_(p, s, grad, mom, lr=1e-5, writeback="compensated", compensation=comp)
    _, _, _, t = lion_oracle(w0, grad.numpy(), np.zeros((4, 64), np.float32), 1e-5, 0.9, 0.99, 0.0)
    assert np.array_equal((mxfp8_codec.decode_mxfp8_torch(p, s) + comp).numpy(), t)


LR, STEPS = 1e-5, 200


def _run_lion(writeback: str, shape=(512, 64), steps: int = STEPS):
    """Weights ~ 0.02 (|w| in [0.015, 0.025]), constant positive gradient: intended change -lr per step."""
    g = torch.Generator().manual_seed(7)
    w = 0.015 + 0.01 * torch.rand(*shape, generator=g)
    p, s = mxfp8_codec.encode_mxfp8_torch(w)
    w0 = mxfp8_codec.decode_mxfp8_torch(p, s).double()
    mom = torch.zeros(*shape, dtype=torch.bfloat16)
    comp = torch.zeros(*shape) if writeback == "compensated" else None
    grad = torch.ones(*shape)
    p0, s0 = p.clone(), s.clone()
    for step in range(steps):
        nvfp4_cuda.lion_step_mxfp8_(
            p, s, grad, mom, lr=LR, writeback=writeback, compensation=comp, seed=11, step=step, tensor_id=4
        )
    return p0, s0, p, s, w0, comp


def test_regression_rne_writeback_freezes_the_master() -> None:
    """The original failure: at lr 1e-5 and |w| ~ 0.02 round-to-nearest discards every Lion update."""
    p0, s0, p, s, _, _ = _run_lion("rne", steps=50)
    assert torch.equal(p, p0) and torch.equal(s, s0)


def test_stochastic_writeback_realises_mean_update_within_5_percent() -> None:
    _, _, p, s, w0, _ = _run_lion("stochastic")
    realised = float((mxfp8_codec.decode_mxfp8_torch(p, s).double() - w0).mean())
    intended = -LR * STEPS
    assert abs(realised - intended) < 0.05 * abs(intended), (realised, intended)


def test_compensated_writeback_realises_update() -> None:
    _, _, p, s, w0, comp = _run_lion("compensated", shape=(64, 64), steps=100)
    true_w = mxfp8_codec.decode_mxfp8_torch(p, s).double() + comp.double()
    assert abs(float((true_w - w0).mean()) + LR * 100) < 0.01 * LR * 100
    assert not torch.equal(mxfp8_codec.decode_mxfp8_torch(p, s).double(), w0)  # stored weights did move


def test_lion_argument_errors() -> None:
    p, s = _master((2, 32), 2)
    grad, mom = torch.zeros(2, 32), torch.zeros(2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="compensation"):
        nvfp4_cuda.lion_step_mxfp8_(p, s, grad, mom, lr=1e-3, writeback="compensated")
    with pytest.raises(ValueError, match="bfloat16"):
        nvfp4_cuda.lion_step_mxfp8_(p, s, grad, mom.float(), lr=1e-3)
    with pytest.raises(ValueError, match="grad has shape"):
        nvfp4_cuda.lion_step_mxfp8_(p, s, torch.zeros(2, 31), mom, lr=1e-3)
    with pytest.raises(ValueError, match="writeback"):
        nvfp4_cuda.lion_step_mxfp8_(p, s, grad, mom, lr=1e-3, writeback="nearest")
    bad = torch.full((2, 32), float("nan"))
    before = p.clone()
    with pytest.raises(ValueError, match="non-finite"):
        nvfp4_cuda.lion_step_mxfp8_(p, s, bad, mom, lr=1e-3, weight_decay=float("inf"))
    assert torch.equal(p, before)  # nothing written on error


# ---- float32 -> bfloat16 stochastic rounding ----------------------------------------------------------
def test_sr_bf16_exact_values_unchanged_and_neighbours() -> None:
    exact = torch.randn(1000).to(torch.bfloat16).float()
    dst = torch.empty(1000, dtype=torch.bfloat16)
    nvfp4_cuda.stochastic_round_to_bf16_(dst, exact, seed=1, step=2, tensor_id=3)
    assert torch.equal(dst.float(), exact)
    x = torch.randn(5000) * 1e3
    nvfp4_cuda.stochastic_round_to_bf16_(dst := torch.empty(5000, dtype=torch.bfloat16), x, seed=1, step=2, tensor_id=3)
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    down = (bits & ~0xFFFF) >> 16  # truncation toward zero, as bf16 bits
    up = down + 1  # next bf16 magnitude away from zero
    got = dst.view(torch.int16).long() & 0xFFFF
    assert bool(((got == down) | (got == up)).all())
    assert bool((got == up).any()) and bool((got == down).any())


def test_sr_bf16_unbiased_reproducible_nonfinite() -> None:
    n = 2**17
    v = 1.0 + 2.0**-9  # between bf16 1.0 and 1.0078125 (p_up = 0.25)
    x = torch.full((n,), v)
    a = torch.empty(n, dtype=torch.bfloat16)
    nvfp4_cuda.stochastic_round_to_bf16_(a, x, seed=0, step=0, tensor_id=0)
    b = torch.empty(n, dtype=torch.bfloat16)
    nvfp4_cuda.stochastic_round_to_bf16_(b, x, seed=0, step=0, tensor_id=0)
    assert torch.equal(a, b)
    stderr = 2.0**-7 * math.sqrt(0.25 * 0.75 / n)
    assert abs(float(a.double().mean()) - v) < 5 * stderr
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    out = torch.empty(4, dtype=torch.bfloat16)
    nvfp4_cuda.stochastic_round_to_bf16_(out, special, seed=0, step=0, tensor_id=0)
    assert out[0] == float("inf") and out[1] == -float("inf") and torch.isnan(out[2]) and torch.signbit(out[3])


@pytest.mark.parametrize("writeback", ["stochastic", "rne", "compensated"])
def test_lion_bf16_api_equals_reference(writeback: str) -> None:
    """nvfp4_cuda.lion_step_bf16_ (C stochastic rounding on the CPU) == the pure-PyTorch reference."""
    from nvfp4_cuda import reference_master

    g = torch.Generator().manual_seed(4)
    p = (0.02 * torch.randn(3, 1000, generator=g)).to(torch.bfloat16)
    m = torch.zeros(3, 1000, dtype=torch.bfloat16)
    p0, p2, m2 = p.clone(), p.clone(), m.clone()
    for step in range(3):
        grad = torch.randn(3, 1000, generator=g).to(torch.bfloat16)
        kw = {"lr": 1e-4, "weight_decay": 0.1, "writeback": writeback, "seed": 1, "step": step, "tensor_id": 9}
        nvfp4_cuda.lion_step_bf16_(p, grad, m, **kw)
        reference_master.lion_step_bf16_(p2, grad, m2, **kw)
    assert torch.equal(p, p2) and torch.equal(m, m2)
    assert not torch.equal(p, p0)  # the weights moved


@pytest.mark.parametrize(
    "module",
    ["nvfp4_cuda", "nvfp4_cuda.api", "nvfp4_cuda.reference", "nvfp4_cuda.reference_master", "nvfp4_cuda.tensor"],
)
def test_docstring_examples_run(module: str) -> None:
    """The public functions' examples (decode_scaled, gemm_decoded, quantize_decoded, lion_step_bf16_, ...) run."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
