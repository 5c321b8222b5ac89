"""Kernel checks shared by the GPU tests (test_cuda_kernels.py) and the CPU kernel emulator's (test_kernel_emu.py).

Each check takes ``to_dev``, which puts a CPU tensor where the kernels run (``Tensor.cuda`` on a GPU, the
identity under the emulator), and calls ``nvfp4_cuda.cuda_ops`` there; the expected bits come from the
PyTorch reference on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import mxfp8_codec
from nvfp4_cuda import cuda_ops
from nvfp4_cuda import reference as R
from nvfp4_cuda.tensor import NVFP4Tensor

ToDev = Callable[[torch.Tensor], torch.Tensor]

# (shape, gradient dtype, spread): (33, 100) takes the element-wise path; spread 4 puts magnitudes over ~2^20
# inside a block (E4M3 subnormals and saturation)
LION_CASES = [
    ((48, 96), torch.float32, 0.0),
    ((64, 256), torch.bfloat16, 0.0),
    ((33, 100), torch.bfloat16, 0.0),
    ((64, 256), torch.bfloat16, 4.0),
]
TRANSPOSED_QUANTIZE_KWARGS: list[dict[str, Any]] = [
    {},
    {"rounding": "stochastic", "seed": 2, "step": 3, "tensor_id": 4},
    {"hadamard": True},
    {"hadamard": True, "rounding": "stochastic", "seed": 5},
    {"block_2d": True},
]


def data(r: int, c: int, seed: int) -> torch.Tensor:
    """Gaussian rows with magnitudes spread over ~e^4 between rows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(r, c, generator=g) * torch.exp(2 * torch.randn(r, 1, generator=g))


def same(q: NVFP4Tensor, ref: NVFP4Tensor) -> None:
    assert torch.equal(q.codes.cpu(), ref.codes)
    assert torch.equal(q.block_scales.cpu(), ref.block_scales)
    assert torch.equal(q.tensor_scale.cpu(), ref.tensor_scale)


def check_quantize_transposed(x: torch.Tensor, to_dev: ToDev) -> None:
    """transpose=True reads x [tokens, features] in place: the bits of quantizing transpose_padded(x)."""
    xd = to_dev(x)
    for kw in TRANSPOSED_QUANTIZE_KWARGS:
        ref = R.quantize_nvfp4(R.transpose_padded(x), **kw)
        same(cuda_ops.quantize_nvfp4(xd, transpose=True, **kw), ref)
        values, ts = cuda_ops.quantize_decoded(xd, transpose=True, **kw)
        assert values.shape == ref.shape
        assert torch.equal(values.float().cpu(), R.decode_scaled(ref)) and torch.equal(ts.cpu(), ref.tensor_scale)


def check_lion_over_steps(
    to_dev: ToDev, writeback: str, shape: tuple[int, int], grad_dtype: torch.dtype, spread: float, steps: int
) -> None:
    """``steps`` fused Lion steps on an MXFP8 master equal the reference's, payload to compensation buffer."""
    g = torch.Generator().manual_seed(5)
    w = 0.02 * torch.randn(*shape, generator=g) * torch.exp(spread * torch.randn(*shape, generator=g))
    p, s = mxfp8_codec.encode_mxfp8_torch(w)
    m = torch.zeros(*shape, dtype=torch.bfloat16)
    comp = torch.zeros(*shape) if writeback == "compensated" else None
    pd, sd, md = to_dev(p.clone()), to_dev(s.clone()), to_dev(m.clone())
    compd = to_dev(comp.clone()) if comp is not None else None
    for step in range(steps):
        grad = torch.randn(*shape, generator=g).to(grad_dtype)
        kw = {"lr": 1e-3, "weight_decay": 0.1, "writeback": writeback, "seed": 9, "step": step, "tensor_id": 2}
        R.lion_step_mxfp8_(p, s, grad, m, compensation=comp, **kw)
        cuda_ops.lion_step_mxfp8_(pd, sd, to_dev(grad), md, compensation=compd, **kw)
    assert torch.equal(pd.cpu(), p) and torch.equal(sd.cpu(), s) and torch.equal(md.cpu(), m)
    if comp is not None:
        assert compd is not None and torch.equal(compd.cpu(), comp)
    assert not torch.equal(p, mxfp8_codec.encode_mxfp8_torch(w)[0])  # the steps moved the master
