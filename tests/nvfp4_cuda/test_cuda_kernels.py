"""CUDA kernels vs the PyTorch reference (needs a GPU; skipped otherwise).

Bit-for-bit where the math is exact: quantize (1x16, 16x16, RNE, SR, Hadamard, from MXFP8, transposed input,
16-byte and element-wise loads), dequantize, the exact BF16 decode (every code byte x every scale), Hadamard,
MXFP8 encode/decode, Lion (all write-backs, same seed, vector and element-wise paths), BF16 SR, and the
GEMM (decode + cuBLASLt, transposed operand views) on operands whose products and sums are exact.
On general inputs the GEMM may differ by float32 accumulation order only: |cuda - ref| <= 1e-5 * max|ref|
(tolerance stated here).  On compute capability 12.x the native FP4 MMA is also checked against the
emulated path.

Run: python -m pytest -q tests/nvfp4_cuda/test_cuda_kernels.py     (on a machine with a CUDA GPU)
"""

from __future__ import annotations

import pytest
import torch

import mxfp8_codec
import nvfp4_cuda
from nvfp4_cuda import cuda_ops
from nvfp4_cuda import formats as F
from nvfp4_cuda import reference as R

from .kernel_cases import LION_CASES, check_lion_over_steps, check_quantize_transposed
from .kernel_cases import data as _data
from .kernel_cases import same as _same

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU kernel tests skipped"),
]

GEMM_RTOL = 1e-5  # relative to max |ref|: float32 accumulation-order differences only


@pytest.mark.parametrize("block_2d", [False, True])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_bit_exact(block_2d: bool, rounding: str, hadamard: bool, dtype: torch.dtype) -> None:
    x = _data(67, 96, 1).to(dtype)
    kw = {"block_2d": block_2d, "rounding": rounding, "hadamard": hadamard, "seed": 3, "step": 5, "tensor_id": 7}
    _same(nvfp4_cuda.quantize_nvfp4(x.cuda(), **kw), R.quantize_nvfp4(x, **kw))


@pytest.mark.parametrize("offset", [0, 1])
def test_quantize_vector_and_elementwise_loads_agree_with_reference(offset: int) -> None:
    """offset 0: 16-byte loads; offset 1 (a view one element into its storage): the element-wise path."""
    x = _data(300, 4096, 11).to(torch.bfloat16)
    x[123, 777] = 1e4  # one spike: the grid-stride amax must find it across many CUDA blocks
    flat = torch.empty(x.numel() + offset, dtype=torch.bfloat16, device="cuda")
    xg = flat[offset:].view(300, 4096)
    xg.copy_(x.cuda())
    assert (xg.data_ptr() % 16 == 0) == (offset == 0)
    for kw in (
        {"rounding": "rne"},
        {"rounding": "stochastic", "seed": 1, "step": 2, "tensor_id": 3},
        {"block_2d": True},
        {"hadamard": True},
    ):
        _same(nvfp4_cuda.quantize_nvfp4(xg, **kw), R.quantize_nvfp4(x, **kw))


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"rounding": "stochastic", "seed": 4, "step": 5, "tensor_id": 6},
        {"block_2d": True},
        {"hadamard": True, "rounding": "stochastic", "seed": 1},
    ],
)
def test_quantize_decoded_equals_quantize_then_decode(kw: dict) -> None:
    """The one-pass operand (BF16 values, no codes) has the bits of quantize_nvfp4 followed by decode_scaled."""
    x = _data(130, 4096, 12).to(torch.bfloat16)
    v, ts = nvfp4_cuda.quantize_decoded(x.cuda(), **kw)
    q = R.quantize_nvfp4(x, **kw)
    assert v.dtype == torch.bfloat16 and torch.equal(v.float().cpu(), R.decode_scaled(q))
    assert torch.equal(ts.cpu(), q.tensor_scale)
    p, s = mxfp8_codec.encode_mxfp8_torch(_data(64, 96, 13) * 0.02)
    v, ts = nvfp4_cuda.quantize_decoded_from_mxfp8(p.cuda(), s.cuda())
    q = R.quantize_nvfp4_from_mxfp8(p, s)
    assert torch.equal(v.float().cpu(), R.decode_scaled(q)) and torch.equal(ts.cpu(), q.tensor_scale)


def test_decode_scaled_exact_for_every_code_and_scale() -> None:
    """decode_scaled (BF16) = e2m1 * e4m3 exactly: every code byte under every scale byte."""
    codes = torch.arange(256, dtype=torch.uint8).repeat(256, 1)  # [256, 256]: row s holds every code byte
    scales = torch.arange(256, dtype=torch.uint8).view(256, 1).expand(256, 512 // 16).contiguous()
    scales[(scales & 0x7F) == 0x7F] = 0x7E  # E4M3 NaN is never a block scale
    q = nvfp4_cuda.NVFP4Tensor(codes, scales, torch.tensor(1.0), (256, 512))
    ref = R.decode_scaled(q)
    qg = nvfp4_cuda.NVFP4Tensor(codes.cuda(), scales.cuda(), torch.tensor(1.0, device="cuda"), (256, 512))
    got = nvfp4_cuda.decode_scaled(qg)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.float().cpu(), ref)
    assert torch.equal(got.view(torch.int16).cpu(), ref.to(torch.bfloat16).view(torch.int16))  # -0.0 kept


@pytest.mark.parametrize("shape", [(3, 16), (1000, 48), (129, 4096)])
def test_decode_scaled_every_half_block_written(shape: tuple[int, int]) -> None:
    """Half-block counts that are not a multiple of a warp's 4 x 32 (the kernel's tail) and several grid strides."""
    q = nvfp4_cuda.quantize_nvfp4(torch.randn(*shape) * 3)
    qg = nvfp4_cuda.NVFP4Tensor(q.codes.cuda(), q.block_scales.cuda(), q.tensor_scale.cuda(), q.shape)
    assert torch.equal(nvfp4_cuda.decode_scaled(qg).float().cpu(), R.decode_scaled(q))


def test_gemm_decoded_takes_transposed_views_without_changing_bits() -> None:
    a = R.quantize_nvfp4(_exact_operand(96, 256, 7))
    w = R.quantize_nvfp4(_exact_operand(256, 160, 8), block_2d=True)  # a weight [in=K, out=N]
    ref = R.nvfp4_matmul(a, w.t(), out_dtype=torch.float32)
    ag = nvfp4_cuda.NVFP4Tensor(a.codes.cuda(), a.block_scales.cuda(), a.tensor_scale.cuda(), a.shape)
    wg = nvfp4_cuda.NVFP4Tensor(w.codes.cuda(), w.block_scales.cuda(), w.tensor_scale.cuda(), w.shape, block_2d=True)
    da, dw = nvfp4_cuda.decode_scaled(ag), nvfp4_cuda.decode_scaled(wg)
    for db in (dw.t(), dw.t().contiguous()):
        for dt in (torch.float32, torch.bfloat16):
            y = nvfp4_cuda.gemm_decoded(da, db, ag.tensor_scale, wg.tensor_scale, out_dtype=dt)
            assert torch.equal(y.cpu(), ref.to(dt))
    yt = nvfp4_cuda.gemm_decoded(
        da.t().contiguous().t(), dw.t(), ag.tensor_scale, wg.tensor_scale, out_dtype=torch.float32
    )  # A given as a transposed view too
    assert torch.equal(yt.cpu(), ref)


def test_gemm_bad_input_names_the_op() -> None:
    a = nvfp4_cuda.quantize_nvfp4(torch.randn(16, 64, device="cuda"))
    da = nvfp4_cuda.decode_scaled(a)
    with pytest.raises(ValueError, match="gemm_decoded: a_scale is on cpu"):
        nvfp4_cuda.gemm_decoded(da, da, torch.tensor(1.0), a.tensor_scale)
    with pytest.raises(ValueError, match="gemm_decoded: db is on cpu"):
        nvfp4_cuda.gemm_decoded(da, da.cpu(), a.tensor_scale, a.tensor_scale)
    with pytest.raises(ValueError, match="contraction mismatch"):
        nvfp4_cuda.gemm_decoded(da, da[:, :32], a.tensor_scale, a.tensor_scale)


def test_dequantize_and_hadamard_bit_exact() -> None:
    x = _data(40, 64, 2)
    q = R.quantize_nvfp4(x)
    qg = nvfp4_cuda.NVFP4Tensor(q.codes.cuda(), q.block_scales.cuda(), q.tensor_scale.cuda(), q.shape)
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(nvfp4_cuda.dequantize_nvfp4(qg, dtype=dt).cpu(), R.dequantize_nvfp4(q, dtype=dt))
    assert torch.equal(nvfp4_cuda.hadamard16(x.cuda()).cpu(), R.hadamard16(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 48), (1000, 3072), (8190, 96), (5, 16)])
def test_quantize_transposed_input_bit_exact(shape: tuple[int, int], dtype: torch.dtype) -> None:
    check_quantize_transposed(_data(*shape, 14).to(dtype), torch.Tensor.cuda)


@pytest.mark.parametrize("transpose", [False, True])
def test_quantize_from_mxfp8_bit_exact(transpose: bool) -> None:
    p, s = mxfp8_codec.encode_mxfp8_torch(_data(64, 96, 3) * 0.02)
    kw = {"transpose": transpose, "rounding": "rne"}
    _same(nvfp4_cuda.quantize_nvfp4_from_mxfp8(p.cuda(), s.cuda(), **kw), R.quantize_nvfp4_from_mxfp8(p, s, **kw))


@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_mxfp8_encode_decode_bit_exact(rounding: str) -> None:
    x = _data(33, 100, 4)
    x[0, :32] = 0.0
    x[1, :] = 3e38 * torch.rand(100)
    p, s = cuda_ops.encode_mxfp8_cuda(x.cuda(), rounding=rounding, seed=1, step=2, tensor_id=3)
    rp, rs = mxfp8_codec.encode_mxfp8_torch(x, rounding=rounding, seed=1, step=2, tensor_id=3)
    assert torch.equal(p.cpu(), rp) and torch.equal(s.cpu(), rs)
    cp, cs = mxfp8_codec.encode_mxfp8(x, rounding=rounding, seed=1, step=2, tensor_id=3)  # native C (mxfp8.h)
    assert torch.equal(p.cpu(), cp) and torch.equal(s.cpu(), cs)
    gp, gs = mxfp8_codec.encode_mxfp8(x.cuda(), rounding=rounding, seed=1, step=2, tensor_id=3)  # torch on GPU
    assert gp.is_cuda and torch.equal(gp.cpu(), cp) and torch.equal(gs.cpu(), cs)
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(
            cuda_ops.decode_mxfp8_cuda(p, s, dtype=dt).cpu(), mxfp8_codec.decode_mxfp8_torch(rp, rs, dtype=dt)
        )


@pytest.mark.parametrize("writeback", ["stochastic", "rne", "compensated"])
@pytest.mark.parametrize(("shape", "grad_dtype", "spread"), LION_CASES)
def test_lion_bit_exact_over_steps(
    writeback: str, shape: tuple[int, int], grad_dtype: torch.dtype, spread: float
) -> None:
    check_lion_over_steps(torch.Tensor.cuda, writeback, shape, grad_dtype, spread, steps=5)


@pytest.mark.parametrize("writeback", ["stochastic", "rne"])
@pytest.mark.parametrize(
    ("n", "grad_dtype", "offset"), [(4096 * 33, torch.bfloat16, 0), (1001, torch.float32, 0), (4099, torch.bfloat16, 1)]
)  # 1: element-wise path
def test_lion_bf16_bit_exact_over_steps(writeback: str, n: int, grad_dtype: torch.dtype, offset: int) -> None:
    from nvfp4_cuda import reference_master

    p = (0.02 * torch.randn(n)).to(torch.bfloat16)
    m = (1e-3 * torch.randn(n)).to(torch.bfloat16)
    flat_p = torch.empty(n + offset, dtype=torch.bfloat16, device="cuda")
    flat_m = torch.empty(n + offset, dtype=torch.bfloat16, device="cuda")
    pg, mg = flat_p[offset:], flat_m[offset:]
    pg.copy_(p.cuda())
    mg.copy_(m.cuda())
    for step in range(4):
        g = torch.randn(n).to(grad_dtype)
        g[:7] = 0.0  # sign(c) = 0 where the momentum is zero too
        kw = {"lr": 1e-3, "weight_decay": 0.1, "writeback": writeback, "seed": 2, "step": step, "tensor_id": 5}
        reference_master.lion_step_bf16_(p, g, m, **kw)
        nvfp4_cuda.lion_step_bf16_(pg, g.cuda(), mg, **kw)
    assert torch.equal(pg.cpu(), p) and torch.equal(mg.cpu(), m)


def test_sr_bf16_bit_exact() -> None:
    x = torch.randn(1000, 33) * 100
    a = torch.empty(1000, 33, dtype=torch.bfloat16)
    R.stochastic_round_to_bf16_(a, x, seed=1, step=2, tensor_id=3)
    b = torch.empty(1000, 33, dtype=torch.bfloat16, device="cuda")
    nvfp4_cuda.stochastic_round_to_bf16_(b, x.cuda(), seed=1, step=2, tensor_id=3)
    assert torch.equal(b.cpu(), a)


def _exact_operand(rows: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vals = F.e2m1_decode_table()[torch.randint(0, 16, (rows, k), generator=g)]
    vals.view(rows, k // 16, 16)[:, :, 0] = 6.0
    return vals


def _backends() -> list[str]:
    major, _ = torch.cuda.get_device_capability()
    return ["emulated", "native"] if major == 12 else ["emulated"]


@pytest.mark.parametrize(("m", "n", "k"), [(128, 128, 256), (37, 19, 80), (256, 384, 512)])
def test_gemm_exact_inputs_bit_exact(m: int, n: int, k: int) -> None:
    a = R.quantize_nvfp4(_exact_operand(m, k, 1))
    b = R.quantize_nvfp4(_exact_operand(n, k, 2))
    ref = R.nvfp4_matmul(a, b, out_dtype=torch.float32)
    ag = nvfp4_cuda.quantize_nvfp4(_exact_operand(m, k, 1).cuda())
    bg = nvfp4_cuda.quantize_nvfp4(_exact_operand(n, k, 2).cuda())
    for backend in _backends():
        y = nvfp4_cuda.nvfp4_matmul(ag, bg, out_dtype=torch.float32, backend=backend)
        assert torch.equal(y.cpu(), ref), backend


def test_gemm_random_within_tolerance_and_native_agrees_with_emulated() -> None:
    x, w = _data(200, 320, 5), _data(96, 320, 6)
    a, b = R.quantize_nvfp4(x), R.quantize_nvfp4(w, block_2d=True)
    ref = R.nvfp4_matmul(a, b, out_dtype=torch.float32)
    ag, bg = nvfp4_cuda.quantize_nvfp4(x.cuda()), nvfp4_cuda.quantize_nvfp4(w.cuda(), block_2d=True)
    outs = {}
    for backend in _backends():
        outs[backend] = nvfp4_cuda.nvfp4_matmul(ag, bg, out_dtype=torch.float32, backend=backend).cpu()
        assert (outs[backend] - ref).abs().max() <= GEMM_RTOL * ref.abs().max()
    if "native" in outs:
        assert (outs["native"] - outs["emulated"]).abs().max() <= GEMM_RTOL * ref.abs().max()


def test_gemm_bf16_out_and_accumulate() -> None:
    a = nvfp4_cuda.quantize_nvfp4(_exact_operand(64, 128, 3).cuda())
    b = nvfp4_cuda.quantize_nvfp4(_exact_operand(32, 128, 4).cuda())
    y32 = nvfp4_cuda.nvfp4_matmul(a, b, out_dtype=torch.float32)
    assert torch.equal(nvfp4_cuda.nvfp4_matmul(a, b), y32.to(torch.bfloat16))
    out = torch.ones(64, 32, device="cuda")
    nvfp4_cuda.nvfp4_matmul(a, b, out=out, accumulate=True)
    assert torch.equal(out, y32 + 1.0)


def test_native_backend_refused_off_sm120() -> None:
    if torch.cuda.get_device_capability()[0] == 12:
        pytest.skip("device has native FP4 MMA")
    a = nvfp4_cuda.quantize_nvfp4(torch.randn(16, 64, device="cuda"))
    with pytest.raises(RuntimeError, match="12.x"):
        nvfp4_cuda.nvfp4_matmul(a, a, backend="native")


def test_backend_info_reports_device() -> None:
    info = nvfp4_cuda.backend_info()
    assert info["backend"] in ("native-sm120a", "emulated-cuda") and "sm_" in info["device"]


def test_empty_shapes_do_not_launch_zero_grids() -> None:
    q = nvfp4_cuda.quantize_nvfp4(torch.zeros(0, 32, device="cuda"))
    assert q.codes.shape == (0, 16) and float(q.tensor_scale) == 1.0
    w = nvfp4_cuda.quantize_nvfp4(torch.randn(4, 32, device="cuda"))
    assert nvfp4_cuda.nvfp4_matmul(q, w).shape == (0, 4)
