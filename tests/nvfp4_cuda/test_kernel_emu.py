"""The library's CUDA kernels, run on the CPU by an emulator, equal the PyTorch reference bit for bit.

``kernel_emu`` compiles nvfp4_quant.cu, nvfp4_master.cu and nvfp4_api.cu with the host C++ compiler
(``emu/cuda_emu.h``: each CUDA block as blockDim cooperative threads, barriers for __syncthreads and warp
shuffles) and points ``nvfp4_cuda.cuda_ops`` at the result, so the wrappers, the C entry points' checks, the
launchers' grid arithmetic and the kernels' indexing, shared memory and shuffles all run as written, on host
memory.  The pretend device has 2 multiprocessors, so grid-stride loops take several rounds on these small
tensors.

What this cannot see (the GPU tests, ``-m gpu``, do): the hardware conversions on sm_89+ (cuda_fp8.h's
software path runs here; tests/nvfp4_cuda/test_device_math.py compares the two spellings), ``__fadd_rz``
(its host spelling runs), races outside barriers, and speed.  The GEMMs (cuBLASLt, FP4 MMA) are not emulated.

Run: python -m pytest -q tests/nvfp4_cuda/test_kernel_emu.py      (~5 s to compile, then ~1 min on 2 cores)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import mxfp8_codec
from nvfp4_cuda import build, cuda_ops, reference_master
from nvfp4_cuda import reference as R
from nvfp4_cuda.tensor import NVFP4Tensor

from . import kernel_emu
from .kernel_cases import LION_CASES, check_lion_over_steps, check_quantize_transposed
from .kernel_cases import data as _data
from .kernel_cases import same as _same

NVCC = os.environ.get(build.NVCC_ENV) or shutil.which("nvcc")
pytestmark = pytest.mark.skipif(
    NVCC is None or shutil.which("g++") is None, reason="no nvcc (CUDA headers) or g++: kernel emulator not built"
)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with kernel_emu.installed(kernel_emu.build(tmp_path_factory.mktemp("emu"))) as lib:
        yield lib


def test_launch_rewrite_keeps_templates_and_macros() -> None:
    src = "#define L(W) k<W, 2><<<grid, dim3(16, 16), 0, st>>>(a, f(b, c)) \\\n  ;\nz<<<1, 2, 0, s>>>();"
    out = kernel_emu.rewrite_launches(src)
    assert out == (
        "#define L(W) emu::launch(dim3(grid), dim3(dim3(16, 16)), [&] { k<W, 2>(a, f(b, c)); }) \\\n  ;\n"
        "emu::launch(dim3(1), dim3(2), [&] { z(); });"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 16), (67, 96), (40, 1024)])
def test_quantize_every_path(emu: Any, shape: tuple[int, int], dtype: torch.dtype) -> None:
    x = _data(*shape, seed=1).to(dtype)
    x[shape[0] // 2, shape[1] // 3] = 1e3  # one spike: the grid-stride amax must find it
    for block_2d in (False, True):
        for rounding in ("rne", "stochastic"):
            for hadamard in (False, True):
                kw = {
                    "block_2d": block_2d,
                    "rounding": rounding,
                    "hadamard": hadamard,
                    "seed": 3,
                    "step": 5,
                    "tensor_id": 7,
                }
                ref = R.quantize_nvfp4(x, **kw)
                _same(cuda_ops.quantize_nvfp4(x, **kw), ref)
                values, ts = cuda_ops.quantize_decoded(x, **kw)  # one pass, BF16 values instead of codes
                assert values.dtype == torch.bfloat16 and torch.equal(values.float(), R.decode_scaled(ref))
                assert torch.equal(ts, ref.tensor_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 48), (37, 100), (300, 33), (5, 16)])
def test_quantize_transposed_input_in_place(emu: Any, shape: tuple[int, int], dtype: torch.dtype) -> None:
    x = _data(*shape, seed=8).to(dtype)
    x[shape[0] - 1, 0] = -500.0  # the last token, next to the padding
    check_quantize_transposed(x, lambda t: t)


def test_quantize_elementwise_loads(emu: Any) -> None:
    """A view one element into its storage is not 16-byte aligned: the element-wise load path."""
    x = _data(37, 64, 2).to(torch.bfloat16)
    flat = torch.empty(x.numel() + 1, dtype=torch.bfloat16)
    xv = flat[1:].view(37, 64)
    xv.copy_(x)
    for kw in ({}, {"rounding": "stochastic", "seed": 1}, {"block_2d": True}, {"hadamard": True}):
        _same(cuda_ops.quantize_nvfp4(xv, **kw), R.quantize_nvfp4(x, **kw))


@pytest.mark.parametrize("transpose", [False, True])
def test_quantize_from_mxfp8(emu: Any, transpose: bool) -> None:
    p, s = mxfp8_codec.encode_mxfp8_torch(_data(64, 96, 3) * 0.02)
    kw = {"transpose": transpose, "rounding": "rne"}
    _same(cuda_ops.quantize_nvfp4_from_mxfp8(p, s, **kw), R.quantize_nvfp4_from_mxfp8(p, s, **kw))
    values, ts = cuda_ops.quantize_nvfp4_from_mxfp8(p, s, decoded=True, **kw)
    ref = R.quantize_nvfp4_from_mxfp8(p, s, **kw)
    assert torch.equal(values.float(), R.decode_scaled(ref)) and torch.equal(ts, ref.tensor_scale)


@pytest.mark.parametrize("cols", [512, 48])  # whole MXFP8 blocks; a partial last block (48 = 32 + 16)
def test_quantize_from_mxfp8_every_code(emu: Any, cols: int) -> None:
    """Every non-NaN E4M3 code of an MXFP8 master (the kernel decodes them two at a time) under scales
    2^-27 .. 2^12, quantized as the trainer quantizes its weights (16x16 tiles, BF16 values) and as codes."""
    rows = 64
    finite = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    p = finite[torch.randperm(rows * cols, generator=torch.Generator().manual_seed(3)) % len(finite)]
    p = p.view(rows, cols)
    s = torch.randint(
        100, 140, (rows, (cols + 31) // 32), generator=torch.Generator().manual_seed(4), dtype=torch.uint8
    )
    for block_2d in (True, False):
        kw = {"block_2d": block_2d}
        ref = R.quantize_nvfp4_from_mxfp8(p, s, **kw)
        _same(cuda_ops.quantize_nvfp4_from_mxfp8(p, s, **kw), ref)
        values, ts = cuda_ops.quantize_nvfp4_from_mxfp8(p, s, decoded=True, **kw)
        assert torch.equal(values.float(), R.decode_scaled(ref)) and torch.equal(ts, ref.tensor_scale)


def test_decode_every_code_under_every_scale(emu: Any) -> None:
    codes = torch.arange(256, dtype=torch.uint8).repeat(256, 1)  # row s holds every code byte
    scales = torch.arange(256, dtype=torch.uint8).view(256, 1).expand(256, 512 // 16).contiguous()
    scales[(scales & 0x7F) == 0x7F] = 0x7E  # E4M3 NaN is never a block scale
    q = NVFP4Tensor(codes, scales, torch.tensor(1.0), (256, 512))
    got = cuda_ops.decode_scaled(q)
    assert torch.equal(got.view(torch.int16), R.decode_scaled(q).to(torch.bfloat16).view(torch.int16))  # -0.0 kept


@pytest.mark.parametrize("shape", [(3, 16), (1000, 48), (129, 4096)])
def test_decode_tails_and_grid_strides(emu: Any, shape: tuple[int, int]) -> None:
    q = R.quantize_nvfp4(torch.randn(*shape) * 3)
    assert torch.equal(cuda_ops.decode_scaled(q).float(), R.decode_scaled(q))


def test_dequantize_and_hadamard(emu: Any) -> None:
    x = _data(40, 64, 2)
    q = R.quantize_nvfp4(x)
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(cuda_ops.dequantize_nvfp4(q, dtype=dt), R.dequantize_nvfp4(q, dtype=dt))
    assert torch.equal(cuda_ops.hadamard16(x), R.hadamard16(x))


@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_mxfp8_encode_decode(emu: Any, rounding: str) -> None:
    x = _data(33, 100, 4)
    x[0, :32] = 0.0
    x[1, :] = 3e38 * torch.rand(100)
    p, s = cuda_ops.encode_mxfp8_cuda(x, rounding=rounding, seed=1, step=2, tensor_id=3)
    rp, rs = mxfp8_codec.encode_mxfp8_torch(x, rounding=rounding, seed=1, step=2, tensor_id=3)
    assert torch.equal(p, rp) and torch.equal(s, rs)
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(cuda_ops.decode_mxfp8_cuda(p, s, dtype=dt), mxfp8_codec.decode_mxfp8_torch(rp, rs, dtype=dt))


@pytest.mark.parametrize("writeback", ["stochastic", "rne", "compensated"])
@pytest.mark.parametrize(("shape", "grad_dtype", "spread"), LION_CASES)
def test_lion_over_steps(
    emu: Any, writeback: str, shape: tuple[int, int], grad_dtype: torch.dtype, spread: float
) -> None:
    check_lion_over_steps(lambda t: t, writeback, shape, grad_dtype, spread, steps=3)


@pytest.mark.parametrize("writeback", ["stochastic", "rne"])
@pytest.mark.parametrize(
    ("n", "grad_dtype", "offset"),
    [(4096 * 3 + 8, torch.bfloat16, 0), (1001, torch.float32, 0), (4099, torch.bfloat16, 1)],
)  # offset 1: element-wise path
def test_lion_bf16_over_steps(emu: Any, writeback: str, n: int, grad_dtype: torch.dtype, offset: int) -> None:
    g = torch.Generator().manual_seed(6)
    p = (0.02 * torch.randn(n, generator=g)).to(torch.bfloat16)
    m = (1e-3 * torch.randn(n, generator=g)).to(torch.bfloat16)
    flat_p, flat_m = torch.empty(n + offset, dtype=torch.bfloat16), torch.empty(n + offset, dtype=torch.bfloat16)
    pe, me = flat_p[offset:], flat_m[offset:]
    pe.copy_(p)
    me.copy_(m)
    for step in range(3):
        grad = torch.randn(n, generator=g).to(grad_dtype)
        grad[:7] = 0.0
        kw = {"lr": 1e-3, "weight_decay": 0.1, "writeback": writeback, "seed": 2, "step": step, "tensor_id": 5}
        reference_master.lion_step_bf16_(p, grad, m, **kw)
        cuda_ops.lion_step_bf16_(pe, grad, me, **kw)
    assert torch.equal(pe, p) and torch.equal(me, m)


def test_sr_bf16(emu: Any) -> None:
    x = torch.randn(1000, 33, generator=torch.Generator().manual_seed(7)) * 100
    a = torch.empty(1000, 33, dtype=torch.bfloat16)
    R.stochastic_round_to_bf16_(a, x, seed=1, step=2, tensor_id=3)
    b = torch.empty(1000, 33, dtype=torch.bfloat16)
    cuda_ops.stochastic_round_to_bf16_(b, x, seed=1, step=2, tensor_id=3)
    assert torch.equal(b, a)


def test_out_of_memory_names_the_op_and_its_operands(emu: Any) -> None:
    """An output or a copy the allocator refuses (here the host's, for a broadcast view of 2^44 elements that
    the op must make contiguous) is a torch.OutOfMemoryError naming the op and the operand's shape, which the
    CLI ends with status 3."""
    from ida_common.cli import EXIT_CANNOT_RUN, exit_code

    huge = torch.zeros(1, 1).expand(2**20, 2**24)
    with pytest.raises(
        torch.OutOfMemoryError, match=r"^hadamard16: out of memory for x \[1048576, 16777216\] float32: "
    ) as e:
        cuda_ops.hadamard16(huge)
    assert exit_code(e.value) == EXIT_CANNOT_RUN
    with pytest.raises(torch.OutOfMemoryError, match=r"^quantize_decoded: out of memory for x \[1048576, 16777216\] "):
        cuda_ops.quantize_decoded(huge, transpose=True)
    # an op that calls another names the innermost op once (nvfp4_matmul decodes its operands first)
    r, c = 2**20, 2**24
    codes = torch.zeros(1, 1, dtype=torch.uint8).expand(r, c // 2)
    q = NVFP4Tensor(codes, torch.zeros(1, 1, dtype=torch.uint8).expand(r, c // 16), torch.ones(()), (r, c))
    with pytest.raises(
        torch.OutOfMemoryError, match=r"^decode_scaled: out of memory for q \[1048576, 16777216\] NVFP4Tensor: "
    ) as e2:
        cuda_ops.nvfp4_matmul(q, q, backend="emulated")
    assert str(e2.value).count("out of memory for") == 1
