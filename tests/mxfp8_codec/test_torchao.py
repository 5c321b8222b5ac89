"""The codec against torchao's MX implementation (``torchao.prototype.mx_formats``: ``to_mx`` / ``to_dtype``),
the reference for MX training in PyTorch: the same scale bytes under both scale rules, the same element codes
except where torchao flushes, and the same values from every (scale, code) pair (docs/format.md, section 6)."""

from __future__ import annotations

import functools
import warnings
from types import ModuleType

import numpy as np
import pytest
import torch

from mxfp8_codec import ScaleRule, decode_mxfp8, encode_mxfp8


@functools.cache
def _mx_tensor() -> ModuleType:
    """torchao's MX module, imported by the tests that use it (not at collection, in every worker)."""
    with warnings.catch_warnings():  # its CUDA extensions do not load with a CPU build of torch: it says so
        warnings.simplefilter("ignore")
        return pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")


def _torchao_decode(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torchao's dequantization of our bytes: ``codes`` [R, C] uint8, ``scales`` [R, C / 32] uint8."""
    data = codes.view(torch.float8_e4m3fn).reshape(-1, 32)
    scale = scales.view(torch.float8_e8m0fnu).reshape(-1, 1)
    return _mx_tensor().to_dtype(data, scale, torch.float8_e4m3fn, 32, dtype).reshape(codes.shape)


def _torchao_encode(x: torch.Tensor, rule: ScaleRule) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's ``to_mx`` of ``x`` [R, C] under our scale rule's namesake: (codes, scale bytes) as ours."""
    mode = _mx_tensor().ScaleCalculationMode(rule.value)  # "rceil" / "floor"
    scale, data = _mx_tensor().to_mx(x, torch.float8_e4m3fn, 32, scaling_mode=mode)
    return data.view(torch.uint8).reshape(x.shape), scale.view(torch.uint8).reshape(x.shape[0], -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torchao_decodes_every_code_at_every_scale_to_our_values(dtype: torch.dtype) -> None:
    codes = torch.arange(256, dtype=torch.uint8).repeat(256, 1)  # row r: every code, in 8 blocks of scale byte r
    scales = torch.arange(256, dtype=torch.uint8)[:, None].repeat(1, 8)
    ours = decode_mxfp8(codes, scales, dtype=dtype)
    theirs = _torchao_decode(codes, scales, dtype)
    assert ours.dtype == theirs.dtype == dtype
    nan = ours.isnan()
    assert torch.equal(nan, theirs.isnan()) and int(nan.sum()) > 0  # NaN codes and the NaN scale byte 255
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(ours[~nan].view(int_dtype), theirs[~nan].view(int_dtype))  # bit for bit, signed zeros too


def _inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every finite bfloat16 value (sorted: blocks of neighbours; shuffled: mixed blocks), and Gaussian rows at
    every power of two from 2^-150 to 2^127 (every scale byte, the clamped bottom and top of the range)."""
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    every = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float()
    every = every[torch.isfinite(every)]
    every = every[: every.numel() // 32 * 32]
    g = torch.Generator().manual_seed(7)
    shuffled = every[torch.randperm(every.numel(), generator=g)]
    exponents = torch.arange(-150, 120, dtype=torch.float32)[:, None]
    ranged = torch.randn(exponents.numel(), 256, generator=g) * torch.exp2(exponents)
    return {
        "every bfloat16, sorted": every.reshape(-1, 32).to(dtype),
        "every bfloat16, shuffled": shuffled.reshape(-1, 64).to(dtype),
        "gaussian rows, 2^-150..2^119": ranged.to(dtype),
    }


@pytest.mark.parametrize("rule", list(ScaleRule))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torchao_encodes_our_bytes_but_at_the_two_ends_of_the_scale_range(dtype: torch.dtype, rule: ScaleRule) -> None:
    """Scale bytes: equal everywhere. Codes: equal in every block but two kinds (docs/format.md, section 6):

    * scale byte 0 (2^-127: blocks with amax below ~2^-118): torchao loses the elements (``rceil``: zeros;
      ``floor``: zeros or codes of half the value); ours keeps the correctly rounded element (step 5), which
      decodes strictly closer to the input wherever the two differ;
    * scale byte 247 (``rceil``, amax >= 1.9375 x 2^127): torchao writes code 0x78, which decodes to infinity;
      ours saturates at 0x77 (240 x 2^120, step 6).
    """
    seen = {"flush": 0, "inf": 0}
    for name, x in _inputs(dtype).items():
        q, s = encode_mxfp8(x, scale_rule=rule)
        tq, ts = _torchao_encode(x, rule)
        assert torch.equal(s, ts), f"{name}: scale bytes differ"
        per_element = s.repeat_interleave(32, dim=1)
        differ = q != tq
        assert not bool((differ & (per_element != 0) & (per_element != 247)).any()), f"{name}: codes differ"
        flushed = differ & (per_element == 0)
        if rule is ScaleRule.RCEIL:
            assert torch.equal(tq[flushed] & 0x7F, torch.zeros_like(tq[flushed])), f"{name}: more than a flush"
        x64 = x.double()
        ours_err = (decode_mxfp8(q, s).double() - x64).abs()[flushed]
        theirs_err = (decode_mxfp8(tq, s).double() - x64).abs()[flushed]
        assert bool((ours_err < theirs_err).all()), f"{name}: where the codes differ at 2^-127, ours is not closer"
        top = differ & (per_element == 247)
        assert bool(((tq[top] & 0x7F) == 0x78).all() and ((q[top] & 0x7F) == 0x77).all()), f"{name}: at the top"
        assert bool(decode_mxfp8(tq, s)[top].isinf().all()) and bool(decode_mxfp8(q, s).isfinite().all())
        seen["flush"] += int(flushed.sum())
        seen["inf"] += int(top.sum())
    # the inputs reach both ends (else this test could not see them); only rceil has scale byte 247
    assert seen["flush"] > 0 and (seen["inf"] > 0) == (rule is ScaleRule.RCEIL)
