"""The native C CPU path (quantize, decode, Hadamard, GEMM via decode) equals the pure-PyTorch reference bit for bit,
and ``NVFP4_CPU_NATIVE=0`` switches it off.

Run: python -m pytest -q tests/nvfp4_cuda/test_cpu_native.py
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mxfp8_codec
import nvfp4_cuda
from nvfp4_cuda import cpu_native
from nvfp4_cuda import reference as R

pytestmark = pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: native CPU path unavailable")


def _same(a: nvfp4_cuda.NVFP4Tensor, b: nvfp4_cuda.NVFP4Tensor) -> None:
    assert torch.equal(a.codes, b.codes)
    assert torch.equal(a.block_scales, b.block_scales)
    assert a.tensor_scale.numpy().tobytes() == b.tensor_scale.numpy().tobytes()
    assert a.block_2d == b.block_2d and a.shape == b.shape


@pytest.mark.parametrize("block_2d", [False, True])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
@pytest.mark.parametrize("hadamard", [False, True])
def test_quantize_matches_reference(block_2d: bool, rounding: str, hadamard: bool) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(75, 128, generator=g) * torch.exp(3 * torch.randn(75, 1, generator=g))
    x[3, :16] = -0.0
    x[4, 16:32] = 0.0
    kw = {"block_2d": block_2d, "rounding": rounding, "hadamard": hadamard, "seed": 4, "step": 9, "tensor_id": 2}
    _same(nvfp4_cuda.quantize_nvfp4(x, **kw), R.quantize_nvfp4(x, **kw))


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 48), st.integers(1, 5), st.floats(-120, 120), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1)
)
def test_property_quantize_dequantize_gemm(
    rows: int, blocks: int, log_scale: float, block_2d: bool, sr: bool, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 16 * blocks, generator=g).double() * 2.0**log_scale).float()
    rounding = "stochastic" if sr else "rne"
    q = nvfp4_cuda.quantize_nvfp4(x, block_2d=block_2d, rounding=rounding, seed=seed)
    _same(q, R.quantize_nvfp4(x, block_2d=block_2d, rounding=rounding, seed=seed))
    assert torch.equal(nvfp4_cuda.dequantize_nvfp4(q), R.dequantize_nvfp4(q))
    w = nvfp4_cuda.quantize_nvfp4(torch.randn(8, 16 * blocks, generator=g))
    assert torch.equal(
        nvfp4_cuda.nvfp4_matmul(q, w, out_dtype=torch.float32), R.nvfp4_matmul(q, w, out_dtype=torch.float32)
    )


def test_hadamard_and_from_mxfp8_match_reference() -> None:
    x = torch.randn(9, 64)
    assert torch.equal(nvfp4_cuda.hadamard16(x), R.hadamard16(x))
    p, s = mxfp8_codec.encode_mxfp8_torch(torch.randn(48, 64) * 0.02)
    for t in (False, True):
        _same(nvfp4_cuda.quantize_nvfp4_from_mxfp8(p, s, transpose=t), R.quantize_nvfp4_from_mxfp8(p, s, transpose=t))


def test_nonfinite_error_and_env_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(4, 32)
    x[1, 17] = float("inf")
    with pytest.raises(ValueError, match=r"\[1, 17\]"):
        nvfp4_cuda.quantize_nvfp4(x)
    monkeypatch.setenv(cpu_native.ENV_SWITCH, "0")
    assert not cpu_native.available()
    assert nvfp4_cuda.backend_info()["cpu_native"] is False
    with pytest.raises(ValueError, match=r"\[1, 17\]"):
        nvfp4_cuda.quantize_nvfp4(x)


@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_mxfp8_encode_decode_match_reference(rounding: str) -> None:
    x = torch.randn(37, 100) * torch.exp(4 * torch.randn(37, 1))
    x[0, :32] = 0.0
    x[1, 5] = -0.0
    x[2] = 3e38 * torch.rand(100)
    x[3] = 1e-40
    kw = {"rounding": rounding, "seed": 1, "step": 2, "tensor_id": 3}
    p, s = mxfp8_codec.encode_mxfp8(x, **kw)
    rp, rs = mxfp8_codec.encode_mxfp8_torch(x, **kw)
    assert torch.equal(p, rp) and torch.equal(s, rs)
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(mxfp8_codec.decode_mxfp8(p, s, dtype=dt), mxfp8_codec.decode_mxfp8_torch(p, s, dtype=dt))
    x[4, 7] = float("nan")
    with pytest.raises(ValueError, match=r"\(4, 7\)"):
        mxfp8_codec.encode_mxfp8(x)


@pytest.mark.parametrize("writeback", ["stochastic", "rne", "compensated"])
def test_lion_matches_reference_over_steps(writeback: str) -> None:
    w = 0.02 * torch.randn(48, 70)
    p, s = mxfp8_codec.encode_mxfp8_torch(w)
    m = torch.zeros(48, 70, dtype=torch.bfloat16)
    comp = torch.zeros(48, 70)
    p2, s2, m2, c2 = p.clone(), s.clone(), m.clone(), comp.clone()
    for step in range(4):
        g = torch.randn(48, 70).to(torch.bfloat16)
        kw = {"lr": 1e-3, "weight_decay": 0.1, "writeback": writeback, "seed": 9, "step": step, "tensor_id": 2}
        R.lion_step_mxfp8_(p, s, g, m, compensation=comp, **kw)
        nvfp4_cuda.lion_step_mxfp8_(p2, s2, g, m2, compensation=c2, **kw)
    assert torch.equal(p, p2) and torch.equal(s, s2) and torch.equal(m, m2) and torch.equal(comp, c2)
    g = torch.randn(48, 70)
    g[5, 6] = float("nan")
    before = p2.clone()
    with pytest.raises(ValueError, match="non-finite gradient"):
        nvfp4_cuda.lion_step_mxfp8_(p2, s2, g, m2, lr=1e-3, writeback=writeback, compensation=c2)
    assert torch.equal(p2, before)


def test_sr_bf16_matches_reference() -> None:
    src = torch.randn(1000, 33) * 100
    src[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    a, b = torch.empty(1000, 33, dtype=torch.bfloat16), torch.empty(1000, 33, dtype=torch.bfloat16)
    R.stochastic_round_to_bf16_(a, src, seed=1, step=2, tensor_id=3)
    nvfp4_cuda.stochastic_round_to_bf16_(b, src, seed=1, step=2, tensor_id=3)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
