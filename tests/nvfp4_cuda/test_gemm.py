"""NVFP4 GEMM: reference vs TE's per-16-block qgemm loop, exact cases, epilogue options, and the host-side
simulation of the sm_120a m16n8k64 MMA built from the documented fragment and scale-lane layout.

Run: python -m pytest -q tests/nvfp4_cuda/test_gemm.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nvfp4_cuda
from nvfp4_cuda import formats as F
from nvfp4_cuda import fragments


def te_qgemm_oracle(a: nvfp4_cuda.NVFP4Tensor, b: nvfp4_cuda.NVFP4Tensor) -> np.ndarray:
    """TE reference_nvfp4.qgemm in float64: y += outer(sa[:, k], sb[:, k]) * (qa_k @ qb_k^T); y *= alpha."""
    table = F.e2m1_decode_table(torch.float64).numpy()
    qa = table[F.unpack_nibbles(a.codes).numpy()]
    qb = table[F.unpack_nibbles(b.codes).numpy()]
    sa = F.e4m3_decode(a.block_scales).double().numpy()
    sb = F.e4m3_decode(b.block_scales).double().numpy()
    y = np.zeros((a.shape[0], b.shape[0]))
    for k in range(a.shape[1] // 16):
        blk = qa[:, 16 * k : 16 * k + 16] @ qb[:, 16 * k : 16 * k + 16].T
        y += np.outer(sa[:, k], sb[:, k]) * blk
    alpha = np.float32(a.tensor_scale.item()) * np.float32(b.tensor_scale.item())
    return y * float(alpha)


def exact_operand(rows: int, k: int, seed: int) -> torch.Tensor:
    """Values already on the E2M1 grid with a 6 in every 16-block: quantization is exact and all GEMM sums are too."""
    g = torch.Generator().manual_seed(seed)
    vals = F.e2m1_decode_table()[torch.randint(0, 16, (rows, k), generator=g)]
    vals.view(rows, k // 16, 16)[:, :, 0] = 6.0
    return vals


def test_reference_matches_te_loop_on_random_data() -> None:
    x, w = torch.randn(24, 128), torch.randn(40, 128) * 0.05
    a, b = nvfp4_cuda.quantize_nvfp4(x), nvfp4_cuda.quantize_nvfp4(w, block_2d=True)
    y = nvfp4_cuda.nvfp4_matmul(a, b, out_dtype=torch.float32)
    want = te_qgemm_oracle(a, b)
    assert np.allclose(y.numpy(), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    # and it approximates the float matmul (NVFP4 relative error ~ 10-15 %)
    ref = x @ w.t()
    assert float((y - ref).norm() / ref.norm()) < 0.25


def test_exact_inputs_bit_exact_and_dequant_consistent() -> None:
    a = nvfp4_cuda.quantize_nvfp4(exact_operand(32, 256, 1))
    b = nvfp4_cuda.quantize_nvfp4(exact_operand(16, 256, 2), block_2d=True)
    y = nvfp4_cuda.nvfp4_matmul(a, b, out_dtype=torch.float32)
    assert np.array_equal(y.numpy(), te_qgemm_oracle(a, b).astype(np.float32))
    dq = nvfp4_cuda.dequantize_nvfp4(a, dtype=torch.float64) @ nvfp4_cuda.dequantize_nvfp4(b, dtype=torch.float64).t()
    assert torch.allclose(y.double(), dq, rtol=1e-6)


def test_output_dtype_out_and_accumulate() -> None:
    a = nvfp4_cuda.quantize_nvfp4(torch.randn(8, 64))
    b = nvfp4_cuda.quantize_nvfp4(torch.randn(16, 64))
    y32 = nvfp4_cuda.nvfp4_matmul(a, b, out_dtype=torch.float32)
    ybf = nvfp4_cuda.nvfp4_matmul(a, b)
    assert ybf.dtype == torch.bfloat16 and torch.equal(ybf, y32.to(torch.bfloat16))
    out = torch.ones(8, 16)
    res = nvfp4_cuda.nvfp4_matmul(a, b, out=out, accumulate=True)
    assert res is out and torch.equal(out, y32 + 1.0)
    out2 = torch.empty(8, 16, dtype=torch.bfloat16)
    nvfp4_cuda.nvfp4_matmul(a, b, out=out2)
    assert torch.equal(out2, ybf)


def test_gemm_errors() -> None:
    a = nvfp4_cuda.quantize_nvfp4(torch.randn(8, 64))
    with pytest.raises(ValueError, match="contraction"):
        nvfp4_cuda.nvfp4_matmul(a, nvfp4_cuda.quantize_nvfp4(torch.randn(8, 32)))
    with pytest.raises(ValueError, match="accumulate"):
        nvfp4_cuda.nvfp4_matmul(a, a, accumulate=True)
    with pytest.raises(ValueError, match="backend"):
        nvfp4_cuda.nvfp4_matmul(a, a, backend="tensorcore")
    with pytest.raises(ValueError, match="shape"):
        nvfp4_cuda.nvfp4_matmul(a, a, out=torch.empty(3, 3))


def test_forward_and_dgrad_see_the_same_2d_weight() -> None:
    """y = x W^T uses W [out, in]; dx = dy W uses W^T [in, out] = q.t(): both decode to the same matrix."""
    w = torch.randn(32, 64)
    qw = nvfp4_cuda.quantize_nvfp4(w, block_2d=True)
    dy = torch.randn(8, 32)
    dx = nvfp4_cuda.nvfp4_matmul(nvfp4_cuda.quantize_nvfp4(dy), qw.t(), out_dtype=torch.float32)
    wq = nvfp4_cuda.dequantize_nvfp4(qw, dtype=torch.float64)
    dyq = nvfp4_cuda.dequantize_nvfp4(nvfp4_cuda.quantize_nvfp4(dy), dtype=torch.float64)
    assert torch.allclose(dx.double(), dyq @ wq, rtol=1e-5, atol=1e-5)


def test_fragment_words_are_single_aligned_loads() -> None:
    """a0 of lane (g, t) holds A[g][8t..8t+7] in nibble order: check one lane by hand."""
    x = exact_operand(16, 64, 3)
    q = nvfp4_cuda.quantize_nvfp4(x)
    regs = fragments.pack_a(q.codes.numpy(), 0, 0)
    lane = 4 * 5 + 2  # g = 5, t = 2
    codes = F.unpack_nibbles(q.codes)
    want = sum(int(codes[5, 16 + j]) << (4 * j) for j in range(8))
    assert int(regs[lane, 0]) == want
    want3 = sum(int(codes[13, 32 + 16 + j]) << (4 * j) for j in range(8))
    assert int(regs[lane, 3]) == want3


@pytest.mark.parametrize(("m", "n", "k"), [(16, 8, 64), (32, 16, 128)])
def test_mma_fragment_simulation_matches_reference(m: int, n: int, k: int) -> None:
    # exact operands: identical bits
    a = nvfp4_cuda.quantize_nvfp4(exact_operand(m, k, 4))
    b = nvfp4_cuda.quantize_nvfp4(exact_operand(n, k, 5), block_2d=(n % 16 == 0))
    sim = fragments.simulate_gemm(a, b).to(torch.float32)
    assert torch.equal(sim, nvfp4_cuda.nvfp4_matmul(a, b, out_dtype=torch.float32))
    # random operands with different block scales per row: equal up to float32 accumulation order
    a = nvfp4_cuda.quantize_nvfp4(torch.randn(m, k) * torch.exp(torch.randn(m, 1)))
    b = nvfp4_cuda.quantize_nvfp4(torch.randn(n, k) * torch.exp(torch.randn(n, k)))
    sim = fragments.simulate_gemm(a, b)
    ref = nvfp4_cuda.nvfp4_matmul(a, b, out_dtype=torch.float32).double()
    assert torch.allclose(sim, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_simulation_detects_a_wrong_scale_lane_mapping() -> None:
    """Guard against a vacuous simulator: swapping the row halves of the SFA loader changes the result."""
    a = nvfp4_cuda.quantize_nvfp4(torch.randn(16, 64) * torch.exp(2 * torch.randn(16, 1)))
    b = nvfp4_cuda.quantize_nvfp4(torch.randn(8, 64))
    ac, asf = a.codes.numpy(), a.block_scales.numpy()
    table = F.e4m3_decode_table().double().numpy()
    good = fragments.pack_sfa(asf, 0, 0)
    bad = np.array([good[lane ^ 1] for lane in range(32)], dtype=np.uint32)  # rows g <-> g+8
    args = (fragments.pack_a(ac, 0, 0), fragments.pack_b(b.codes.numpy(), 0, 0))
    sfb = fragments.pack_sfb(b.block_scales.numpy(), 0, 0)
    c = np.zeros((32, 4))
    d_good = fragments.simulate_mma(*args, good, sfb, c, table)
    d_bad = fragments.simulate_mma(*args, bad, sfb, c, table)
    assert not np.allclose(d_good, d_bad)
