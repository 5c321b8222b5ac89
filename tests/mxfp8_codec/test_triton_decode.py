"""The Triton decode kernel (mxfp8_codec/triton_decode.py) gives the codec's CPU decode bit for bit.

On the CPU it runs in Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors), in a child process: the
variable must be set before the kernel is defined, and this process may have imported the module without
it. The child (this file run as a script) decodes every case with the kernel and saves the bits; the tests
here compare them with ``decode_mxfp8`` on the CPU (the native C kernel), for every code byte x every
scale byte, both output dtypes, both layouts and odd shapes. The ``gpu`` test does the same on CUDA
through ``decode_into`` (what ``MXFP8Linear`` runs) at 4B-model projection shapes. Skipped, with the
reason, where Triton is not installed; the argument checks run without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mxfp8_codec import hf_modules, triton_decode
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.numerics import decode_mxfp8, encode_mxfp8

needs_triton = pytest.mark.skipif(not triton_decode.AVAILABLE, reason="triton is not installed (pip install triton)")
DTYPES = {"bf16": (torch.bfloat16, torch.int16), "f32": (torch.float32, torch.int32)}


def _every_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """[256, 256] codes (each row all 256 codes) and [256, 8] scales with scale (r + 37 b) % 256 for row r,
    block b: every (code, scale byte) pair occurs, and the scale changes along each row."""
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 1)
    r, b = torch.meshgrid(torch.arange(256), torch.arange(8), indexing="ij")
    return q, ((r + 37 * b) % 256).to(torch.uint8)


def _random(rows: int, cols: int, seed: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """Random codes and random scale bytes (NaN codes and the 0x00 / 0xFF scales included)."""

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng(seed)
        q = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        s = rng.integers(0, 256, (rows, cols // 32), dtype=np.uint8)
        return torch.from_numpy(q), torch.from_numpy(s)

    return make


def _encoded() -> tuple[torch.Tensor, torch.Tensor]:
    """A weight as the trainer writes one: 0.02 x normal values, encoded."""
    x = 0.02 * torch.from_numpy(np.random.default_rng(7).standard_normal((96, 320)).astype(np.float32))
    return encode_mxfp8(x)


# name -> (payload [R, C], scales [R, C/32]); the tiles are 16 x 256 (64 x 64 transposed): these shapes
# cover one partial tile, several tiles along both axes, one row, one block, and no rows at all
CASES: dict[str, Callable[[], tuple[torch.Tensor, torch.Tensor]]] = {
    "every code x every scale": _every_pair,
    "1 x 32": _random(1, 32, 1),
    "3 x 64": _random(3, 64, 2),
    "17 x 96": _random(17, 96, 3),
    "65 x 288": _random(65, 288, 4),
    "130 x 544": _random(130, 544, 5),
    "encoded 96 x 320": _encoded,
    "0 x 64": _random(0, 64, 6),
}


def _key(case: str, dtype: str, transpose: bool) -> str:
    return f"{case}|{dtype}|{'T' if transpose else 'N'}"


def interpreter_main(out_path: str) -> int:
    """The child: decode every case with the kernel (in Triton's interpreter), save the bits to ``out_path``."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning)  # numpy's overflow/NaN notes from inf * 0
    found: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    for case, make in CASES.items():
        q, s = make()
        for dname, (dtype, ibits) in DTYPES.items():
            for transpose in (False, True):
                shape = (q.shape[1], q.shape[0]) if transpose else tuple(q.shape)
                out = torch.full(shape, float("nan"), dtype=dtype)
                if case == "every code x every scale":  # also through decode_into, with float8 views
                    got = hf_modules.decode_into(
                        q.view(torch.float8_e4m3fn), s.view(torch.float8_e8m0fnu), out, transpose=transpose,
                        backend="triton",
                    )  # fmt: skip
                else:
                    got = triton_decode.decode_mxfp8_triton(q, s, out, transpose=transpose)
                assert got is out
                found[_key(case, dname, transpose)] = out.view(ibits).numpy()
    for case in LINEAR_CASES:  # the fused linear kernel, through its operator (what MXFP8Linear calls)
        x, p, s, bias, orientation = _linear_inputs(case)
        y = hf_modules.linear_fused_op(x, p, s, bias, orientation, "w")
        found[f"linear|{case}"] = y.view(torch.int16).numpy()
    found["seconds"] = np.array(time.perf_counter() - t0)
    np.savez(out_path, **found)
    return 0


# the fused linear kernel (linear_mxfp8_triton): name -> (orientation, M, K, N, bias, values, a NaN scale byte).
# Its tiles are BLOCK_M (16-64, from M) x 64 x 64: one partial tile, several along each axis, M above 64.
# "exact": small integers times powers of two, so that every partial sum is exact in float32 and the result
# cannot depend on the summation order; "random": normal activations and an encoded normal weight.
LINEAR_CASES = {
    "in_out 1x64x32": ("in_out", 1, 64, 32, False, "exact", False),
    "in_out 5x96x96 bias": ("in_out", 5, 96, 96, True, "exact", False),
    "in_out 17x160x64": ("in_out", 17, 160, 64, False, "exact", False),
    "in_out 70x64x160 NaN block": ("in_out", 70, 64, 160, True, "exact", True),
    "out_in 1x64x32": ("out_in", 1, 64, 32, False, "exact", False),
    "out_in 5x96x96 bias": ("out_in", 5, 96, 96, True, "exact", False),
    "out_in 33x160x96 NaN block": ("out_in", 33, 160, 96, False, "exact", True),
    "in_out random 64x320x96": ("in_out", 64, 320, 96, True, "random", False),
    "out_in random 3x192x64": ("out_in", 3, 192, 64, False, "random", False),
    # every code x every scale byte (_every_pair), through an identity: y is the decoded weight itself
    "in_out every code x every scale": ("in_out", 64, 256, 256, False, "every", False),
    "out_in every code x every scale": ("out_in", 64, 256, 256, False, "every", False),
}


def _linear_inputs(case: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, str]:
    """x (bfloat16 [M, K]), the weight's payload and scales as the orientation stores them, bias, orientation."""
    orientation, m, k, n, has_bias, values, nan_block = LINEAR_CASES[case]
    g = torch.Generator().manual_seed(sum(map(ord, case)))
    if values == "every":  # the payload as stored: [K, N] or [N, K], 256 x 256 either way
        p, s = _every_pair()
        return torch.eye(k, dtype=torch.bfloat16)[64 : 64 + m], p, s, None, orientation
    if values == "exact":
        w = torch.randint(-8, 9, (n, k), generator=g).float() * 2.0 ** torch.randint(-4, 2, (n, k), generator=g).float()
        x = torch.randint(-4, 5, (m, k), generator=g).to(torch.bfloat16)
        bias = torch.randint(-3, 4, (n,), generator=g).to(torch.bfloat16) if has_bias else None
    else:
        w = 0.02 * torch.randn(n, k, generator=g)
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        bias = (0.1 * torch.randn(n, generator=g)).to(torch.bfloat16) if has_bias else None
    p, s = encode_mxfp8(w.t().contiguous() if orientation == "in_out" else w)
    if nan_block:
        s[1, 1] = 0xFF  # the block's 32 weights are NaN
    return x, p, s, bias, orientation


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The kernel's bits for every case, from a child process running Triton's interpreter."""
    out = tmp_path_factory.mktemp("triton") / "bits.npz"
    repo = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, f"interpreter child failed:\n{proc.stdout}\n{proc.stderr}"
    with np.load(out) as f:
        found = dict(f)
    print(f"triton interpreter: {float(found['seconds']):.1f} s of decodes, {time.perf_counter() - t0:.1f} s in all")
    return found


@needs_triton
@pytest.mark.parametrize("transpose", [False, True], ids=["same layout", "transposed"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_kernel_equals_cpu_decode(
    interpreted: dict[str, np.ndarray], case: str, dtype: str, transpose: bool
) -> None:
    q, s = CASES[case]()
    tdtype, ibits = DTYPES[dtype]
    want = decode_mxfp8(q, s, dtype=tdtype, transpose=transpose).view(ibits).numpy()
    got = interpreted[_key(case, dtype, transpose)]
    assert got.shape == want.shape
    bad = np.argwhere(got != want)
    assert bad.size == 0, (
        f"{len(bad)} values differ, first at {tuple(bad[0])}: kernel {got[tuple(bad[0])]:#x}, codec {want[tuple(bad[0])]:#x}"
    )


@needs_triton
@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_interpreted_fused_linear_equals_linear_of_the_decoded_weight(
    interpreted: dict[str, np.ndarray], case: str
) -> None:
    """``x @ W^T + bias`` from the fused kernel against float64 arithmetic on the codec's decoded weight,
    rounded once to bfloat16: equal bit for bit where every partial sum is exact ("exact" cases; NaN exactly
    where a NaN weight takes part), within float32 summation of the rounded result otherwise."""
    x, p, s, bias, orientation = _linear_inputs(case)
    w = decode_mxfp8(p, s, dtype=torch.float32)  # the values the kernel must use (bfloat16-exact)
    w = w.t() if orientation == "in_out" else w  # [N, K]
    ref = x.double() @ w.double().t() + (bias.double() if bias is not None else 0.0)
    got = torch.from_numpy(interpreted[f"linear|{case}"]).view(torch.bfloat16)
    assert got.shape == ref.shape
    assert torch.equal(got.isnan(), ref.isnan())
    if LINEAR_CASES[case][5] in ("exact", "every"):
        assert torch.equal(got[~ref.isnan()], ref[~ref.isnan()].to(torch.bfloat16))
        assert not LINEAR_CASES[case][6] or bool(got.isnan().any())
    else:  # a float32 sum of K products, then one bfloat16 rounding
        err = (got.double() - ref).abs()
        bound = 2.0**-8 * ref.abs() + 1e-5 * (x.double().abs() @ w.double().abs().t())
        assert bool((err <= bound).all()), float((err - bound).max())


def _compile_for_hopper(
    kernel: object, signature: dict[str, str], consts: dict[str, object], warps: int, aligned: bool = False
) -> dict[str, Any]:
    """The kernel compiled ahead of time for sm_90 (an H100 / H200) with the ptxas in Triton's wheel, no GPU
    needed; its ``asm`` (``ptx``, ``cubin``...). ``aligned``: every non-constexpr argument marked divisible by
    16, as a launch specializes on aligned pointers and sizes (what lets Triton vectorize and pipeline loads)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    full = {**signature, **{name: "constexpr" for name in consts}}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(signature))} if aligned else None
    src = ASTSource(fn=kernel, signature=full, constexprs=consts, attrs=attrs)
    return triton_compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 3}).asm


@needs_triton
def test_the_kernels_compile_for_hopper_and_the_linear_uses_its_tensor_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the interpreter cannot show: Triton compiles each kernel for sm_90 as launched (the module's tiles and
    warps; the linear's 16- and 64-row tiles, both orientations, with and without split K) and the fused linear's
    products run on the tensor cores (wgmma for 64-row tiles, mma.sync for 16), not on the CUDA cores."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # (triton 3.9 warns when it is unset)
    dec = {"p_ptr": "*u8", "s_ptr": "*u8", "o_ptr": "*i16", "R": "i32", "C": "i32"}
    for transpose in (False, True):
        consts = {"TRANSPOSE": transpose, "BF16": True, "WIDE": False}
        consts |= {"BLOCK_R": triton_decode.BLOCK_R[transpose], "BLOCK_C": triton_decode.BLOCK_C[transpose]}
        assert (
            ".entry" in _compile_for_hopper(triton_decode._decode_kernel, dec, consts, triton_decode.NUM_WARPS)["ptx"]
        )
    lin = {"x_ptr": "*bf16", "p_ptr": "*u8", "s_ptr": "*u8", "b_ptr": "*bf16", "y_ptr": "*i16", "M": "i32", "N": "i32"}
    for orientation in ("in_out", "out_in"):
        for block_m, split in ((16, 1), (64, 4)):
            consts = {"K": 3072, "IN_OUT": orientation == "in_out", "HAS_BIAS": True, "WIDE": False, "BLOCK_M": block_m}
            consts |= {"BLOCK_N": triton_decode.LINEAR_BLOCK_N, "BLOCK_K": triton_decode.LINEAR_BLOCK_K}
            consts |= {"SPLIT_K": split, "TILES": 3072 // triton_decode.LINEAR_BLOCK_K // split, "F32_DOT": False}
            sig = {**lin, "y_ptr": "*i16" if split == 1 else "*fp32"}
            ptx = _compile_for_hopper(triton_decode._linear_kernel, sig, consts, triton_decode.LINEAR_NUM_WARPS)["ptx"]
            assert ("wgmma.mma_async" if block_m == 64 else "mma.sync.aligned") in ptx, (orientation, block_m, split)
    sums = {"part_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*i16", "MN": "i32", "N": "i32"}
    ptx = _compile_for_hopper(triton_decode._split_sum_kernel, sums, {"SPLIT_K": 4, "HAS_BIAS": True, "BLOCK": 1024}, 4)
    assert ".entry" in ptx["ptx"]


FUSED_LOOP_CEILING = 12.0  # SASS instructions per weight in the fused linear's K loop (10.6 on 2026-12-06, triton 3.9)


@needs_triton
def test_the_fused_linear_loop_stays_within_its_instruction_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoding step's fused linear is bound by the instructions its K loop issues per weight (docs/format.md:
    ~10.5 where reading the weight's bytes would allow ~8 on an H200), not by the dot: the loop of the 64-row
    tile, both orientations, compiled as a launch specializes it, counted in SASS (scripts/sass_hot_path.py's
    parser and cuobjdump). The integer decode steps took 22 (41 compiled without the alignment hints)."""
    import importlib.util

    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    spec = importlib.util.spec_from_file_location(
        "sass_hot_path", Path(__file__).parents[2] / "scripts" / "sass_hot_path.py"
    )
    assert spec is not None and spec.loader is not None
    sass = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass)
    try:
        cuobjdump = sass._tool("cuobjdump")
    except SystemExit as exc:  # the test extra installs it on Linux
        pytest.skip(str(exc))
    lin = {"x_ptr": "*bf16", "p_ptr": "*u8", "s_ptr": "*u8", "b_ptr": "*bf16", "y_ptr": "*fp32", "M": "i32", "N": "i32"}
    # one turn of the loop decodes a BLOCK_K x BLOCK_N weight tile, spread over the CUDA block's threads
    weights_per_thread = (
        triton_decode.LINEAR_BLOCK_K * triton_decode.LINEAR_BLOCK_N // (32 * triton_decode.LINEAR_NUM_WARPS)
    )
    per_weight = {}
    for orientation in ("in_out", "out_in"):
        consts = {"K": 3072, "IN_OUT": orientation == "in_out", "HAS_BIAS": False, "WIDE": False, "BLOCK_M": 64}
        consts |= {"BLOCK_N": triton_decode.LINEAR_BLOCK_N, "BLOCK_K": triton_decode.LINEAR_BLOCK_K}
        consts |= {"SPLIT_K": 4, "TILES": 3072 // triton_decode.LINEAR_BLOCK_K // 4, "F32_DOT": False}
        asm = _compile_for_hopper(triton_decode._linear_kernel, lin, consts, triton_decode.LINEAR_NUM_WARPS, True)
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "k.cubin"
            cubin.write_bytes(asm["cubin"])
            text = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        (ops,) = sass.parse_sass(text, {"_linear_kernel": orientation}).values()
        per_weight[orientation] = max(sass.loop_lengths(ops)) / weights_per_thread
    assert all(n <= FUSED_LOOP_CEILING for n in per_weight.values()), per_weight


def _good(rows: int = 4, cols: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.zeros((rows, cols), dtype=torch.uint8),
        torch.full((rows, cols // 32), 127, dtype=torch.uint8),
        torch.empty((rows, cols), dtype=torch.bfloat16),
    )


BAD_INPUT = {
    "payload dtype": (lambda p, s, o: (p.to(torch.int16), s, o), r"uint8.*got torch.int16 and torch.uint8"),
    "payload rank": (lambda p, s, o: (p.reshape(2, 2, 64), s, o), r"2-D \[R, C\], got shape \(2, 2, 64\)"),
    "partial block": (lambda p, s, o: (p[:, :48].contiguous(), s, o[:, :48]), r"\(4, 48\) has a partial block"),
    "scales shape": (lambda p, s, o: (p, s[:, :1], o), r"scales shape \(4, 1\) does not match payload shape \(4, 64\)"),
    "out dtype": (lambda p, s, o: (p, s, o.half()), r"float32 or bfloat16 of shape \(4, 64\).*torch.float16"),
    "out shape": (lambda p, s, o: (p, s, o.t()), r"shape \(4, 64\) \(payload \(4, 64\), transpose=False\), got .* \(64, 4\)"),
    "non-contiguous payload": (
        lambda p, s, o: (torch.zeros((4, 128), dtype=torch.uint8)[:, ::2], s, o),
        r"payload must be contiguous, got strides \(128, 2\) for shape \(4, 64\)",
    ),
    "non-contiguous out": (
        lambda p, s, o: (p, s, torch.empty((64, 4), dtype=torch.bfloat16).t()),
        r"out must be contiguous, got strides \(1, 4\)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_names_the_op_and_the_shapes(case: str) -> None:
    """Checked before anything runs (also without Triton): one MXFP8Error naming the function and the shapes."""
    change, message = BAD_INPUT[case]
    p, s, o = change(*_good())
    with pytest.raises(MXFP8Error, match=r"^decode_mxfp8_triton: tensor 'w': .*" + message):
        triton_decode.decode_mxfp8_triton(p, s, o, name="w")


def _good_linear() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.zeros((3, 64), dtype=torch.bfloat16),  # x [M, K]
        torch.zeros((64, 96), dtype=torch.uint8),  # payload [K, N] ("in_out")
        torch.full((64, 3), 127, dtype=torch.uint8),
    )


BAD_LINEAR = {
    "x dtype": (lambda x, p, s: (x.float(), p, s, None), r"x must be bfloat16 \[M, 64\] .*got torch.float32 \(3, 64\)"),
    "x width": (lambda x, p, s: (x[:, :32], p, s, None), r"x must be bfloat16 \[M, 64\] for a payload \(64, 96\) \(in_out\)"),
    "x rank": (lambda x, p, s: (x[None], p, s, None), r"got torch.bfloat16 \(1, 3, 64\)"),
    "scales shape": (lambda x, p, s: (x, p, s[:, :2], None), r"scales shape \(64, 2\) does not match payload shape"),
    "partial block": (lambda x, p, s: (x, p[:, :48].contiguous(), s, None), r"\(64, 48\) has a partial block"),
    "bias": (lambda x, p, s: (x, p, s, torch.zeros(95, dtype=torch.bfloat16)), r"bias must be bfloat16 \[96\], got .*\(95,\)"),
    "devices": (lambda x, p, s: (x.to("meta"), p, s, None), r"must be on one device, got \['meta', 'cpu', 'cpu'\]"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_LINEAR))
def test_fused_linear_bad_input_names_the_op_and_the_shapes(case: str) -> None:
    """Checked before anything runs (also without Triton): one MXFP8Error naming the function and the shapes."""
    change, message = BAD_LINEAR[case]
    x, p, s, bias = change(*_good_linear())
    with pytest.raises(MXFP8Error, match=r"^linear_mxfp8_triton: tensor 'w': .*" + message):
        triton_decode.linear_mxfp8_triton(x, p, s, orientation="in_out", bias=bias, name="w")
    with pytest.raises(MXFP8Error, match=r"orientation must be 'in_out' or 'out_in', got 'rows'"):
        triton_decode.linear_mxfp8_triton(*_good_linear(), orientation="rows")


def test_use_fused_linear_leaves_the_cpu_forward_as_it_was() -> None:
    """use_fused_linear sets every MXFP8Linear's token limit (0 turns it off; anything but an integer >= 0 is a
    ValueError); on the CPU, where the fused kernel does not run, the forward stays decode + F.linear: the same
    bits as nn.Linear of the decoded weight."""
    x, w = torch.randn(2, 7, 64).to(torch.bfloat16), 0.02 * torch.randn(64, 96)
    p, s = encode_mxfp8(w)  # stored [in, out]
    model = torch.nn.Sequential(
        *(hf_modules.MXFP8Linear(64, 96, bias=None, orientation="in_out", dtype=torch.bfloat16) for _ in range(2))
    )
    for m in model:
        m.payload, m.scales = p, s
    want = model[0](x)
    assert hf_modules.use_fused_linear(model, 64) == 2 and all(m.fused_max_tokens == 64 for m in model)
    assert torch.equal(model[0](x), want)
    assert torch.equal(want, torch.nn.functional.linear(x, model[0].decode_weight()))
    assert hf_modules.use_fused_linear(model, 0) == 2 and model[1].fused_max_tokens == 0
    for bad in (-1, 1.5, True, "64"):
        with pytest.raises(ValueError, match=r"use_fused_linear: max_tokens must be an integer >= 0"):
            hf_modules.use_fused_linear(model, bad)


def test_without_triton_the_kernel_says_so_and_decode_into_uses_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_decode, "AVAILABLE", False)
    with pytest.raises(MXFP8Error, match="triton is not installed"):
        triton_decode.decode_mxfp8_triton(*_good())
    with pytest.raises(MXFP8Error, match="linear_mxfp8_triton: triton is not installed"):
        triton_decode.linear_mxfp8_triton(*_good_linear(), orientation="in_out")
    with pytest.raises(MXFP8Error, match=r"decode_into: backend must be one of .*got 'cuda'"):
        hf_modules.decode_into(*_good(), transpose=False, backend="cuda")
    with pytest.raises(MXFP8Error, match=r"decode_into: payload must be 2-D \[R, C\], got shape \(256,\)"):
        hf_modules.decode_into(torch.zeros(256, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8), torch.empty(256),
                               transpose=False)  # fmt: skip
    q, s = _every_pair()
    for dtype, ibits in DTYPES.values():  # on the CPU "auto" is the torch ops, whatever is installed
        want = decode_mxfp8(q, s, dtype=dtype)
        got = hf_modules.decode_into(q, s, torch.empty(q.shape, dtype=dtype), transpose=False)
        assert _torch_ops_equal(got, want, ibits)


def _torch_ops_equal(got: torch.Tensor, want: torch.Tensor, ibits: torch.dtype) -> bool:
    """The torch ops' bits, but for NaN: they give NaNs of other bits (0xFFFF in bfloat16), not the
    codec's canonical 0x7FC0 / 0x7FC00000 (the Triton kernel does)."""
    nan = want.isnan()
    return torch.equal(got.isnan(), nan) and torch.equal(got.view(ibits)[~nan], want.view(ibits)[~nan])


# 4B-model projections as files store them ([in, out]; and [out, in]): Minitron-4B (hidden 3072, kv 1024,
# MLP 9216) and Qwen3-4B (hidden 2560, q 4096, kv 1024, MLP 9728)
GPU_SHAPES = (
    (3072, 3072),
    (3072, 1024),
    (3072, 9216),
    (9216, 3072),
    (2560, 4096),
    (4096, 2560),
    (2560, 9728),
    (9728, 2560),
)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the Triton decode on GPU)")
@needs_triton
def test_cuda_decode_into_equals_cpu_decode_bit_for_bit() -> None:
    """decode_into on CUDA (Triton, what MXFP8Linear runs; and the torch ops) against the CPU decode: every
    (code, scale) pair, and random codes with weight-like scales at 4B projection shapes, both layouts."""
    assert hf_modules._triton_available(), "triton is installed but mxfp8_codec.triton_decode cannot use it"
    rng = np.random.default_rng(11)
    cases = [_every_pair(), _random(65, 288, 4)()]
    for rows, cols in GPU_SHAPES:
        q = torch.from_numpy(rng.integers(0, 256, (rows, cols), dtype=np.uint8))
        s = torch.from_numpy(rng.integers(105, 135, (rows, cols // 32), dtype=np.uint8))
        s[:3, :3] = torch.tensor([[0, 255, 254], [1, 127, 133], [6, 7, 246]], dtype=torch.uint8)  # edges too
        cases.append((q, s))
    for q, s in cases:
        qc, sc = q.cuda(), s.cuda()
        for dtype, ibits in DTYPES.values():
            for transpose in (False, True):
                want = decode_mxfp8(q, s, dtype=dtype, transpose=transpose)
                for backend in ("auto", "triton"):
                    out = torch.full(want.shape, float("nan"), dtype=dtype, device="cuda")
                    hf_modules.decode_into(qc, sc, out, transpose=transpose, backend=backend)
                    n_bad = int((out.cpu().view(ibits) != want.view(ibits)).sum())
                    assert n_bad == 0, (
                        f"{tuple(q.shape)} {dtype} transpose={transpose} {backend}: {n_bad} values differ"
                    )
                out = torch.empty(want.shape, dtype=dtype, device="cuda")
                hf_modules.decode_into(qc, sc, out, transpose=transpose, backend="torch")
                assert _torch_ops_equal(out.cpu(), want, ibits), f"{tuple(q.shape)} {dtype} torch ops"
    # the module path: MXFP8Linear on CUDA decodes what the CPU decodes
    q, s = cases[-1]
    lin = hf_modules.MXFP8Linear(q.shape[0], q.shape[1], bias=None, orientation="in_out", dtype=torch.bfloat16)
    lin.payload, lin.scales = q.cuda(), s.cuda()
    want = decode_mxfp8(q, s, dtype=torch.bfloat16, transpose=True)
    assert torch.equal(lin.decode_weight().cpu().view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the Triton decode on GPU)")
@needs_triton
def test_cuda_fused_linear_uses_the_decoded_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """MXFP8Linear after use_fused_linear on CUDA, at 4B projection shapes and 1 / 64 / 65 tokens (65: above the
    limit, the decode + F.linear path): bit for bit F.linear of the decoded weight where every sum is exact,
    close elsewhere; eager and compiled (the operator in one graph) give the same bits."""
    # cuBLAS may otherwise reduce split-K partial sums in BF16: then even exact sums would be rounded
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False)
    g = torch.Generator().manual_seed(5)
    for n_in, n_out in GPU_SHAPES[2:4]:  # Minitron-4B's MLP: K = 3072 and 9216 (each shape compiles anew)
        for orientation in ("in_out", "out_in"):
            w = (
                torch.randint(-8, 9, (n_out, n_in), generator=g).float()
                * 2.0 ** torch.randint(-6, 0, (n_out, n_in), generator=g).float()
            )
            p, s = encode_mxfp8(w.t().contiguous() if orientation == "in_out" else w)
            lin = hf_modules.MXFP8Linear(n_in, n_out, bias=None, orientation=orientation, dtype=torch.bfloat16)
            lin.payload, lin.scales = p.cuda(), s.cuda()
            dense = lin.decode_weight()
            hf_modules.use_fused_linear(lin, 64)
            for tokens in (1, 64, 65):
                x = torch.randint(-2, 3, (1, tokens, n_in), generator=g).to(torch.bfloat16).cuda()  # exact sums
                with torch.no_grad():
                    assert torch.equal(lin(x), torch.nn.functional.linear(x, dense)), (n_in, n_out, orientation, tokens)
                    xr = torch.randn(1, tokens, n_in, generator=g).to(torch.bfloat16).cuda()
                    torch.testing.assert_close(lin(xr), torch.nn.functional.linear(xr, dense), rtol=2e-2, atol=2e-2)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(lin, fullgraph=True)
        assert torch.equal(compiled(xr[:, :8]), lin(xr[:, :8]))
    # every code with every scale byte's class, through an identity: y = the decoded weight itself (on the GPU the
    # kernel decodes with the hardware E4M3 conversion, which the interpreter cannot run)
    q, sc = _every_pair()  # [256, 256] codes, [256, 8] scales
    for orientation in ("in_out", "out_in"):
        lin = hf_modules.MXFP8Linear(256, 256, bias=None, orientation=orientation, dtype=torch.bfloat16)
        lin.payload, lin.scales = q.cuda(), sc.cuda()
        hf_modules.use_fused_linear(lin, 64)
        dense = lin.decode_weight()  # [out, in]
        for rows in range(0, 256, 64):
            eye = torch.eye(256, dtype=torch.bfloat16, device="cuda")[rows : rows + 64]
            with torch.no_grad():
                got, want = lin(eye), torch.nn.functional.linear(eye, dense)
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~want.isnan()], want[~want.isnan()])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the Triton decode on GPU)")
def test_where_triton_fails_auto_warns_once_and_decodes_with_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Triton that cannot compile the kernel (injected: the kernel raises as a failed compilation does):
    "auto" says so once and decodes with the torch ops from then on; "triton" raises."""

    def broken(*_a: object, **_k: object) -> torch.Tensor:
        raise RuntimeError("PassManager::run failed\n(more lines)")

    monkeypatch.setattr(triton_decode, "decode_mxfp8_triton", broken)
    monkeypatch.setattr(hf_modules, "_TRITON_FAILED", None)
    monkeypatch.setattr(hf_modules, "_triton_available", lambda: True)
    q, s = _every_pair()
    qc, sc = q.cuda(), s.cuda()
    want = decode_mxfp8(q, s, dtype=torch.bfloat16)
    with pytest.warns(
        RuntimeWarning,
        match=r"Triton MXFP8 decode failed here \(RuntimeError: PassManager::run failed; \(more lines\)\)",
    ):
        got = hf_modules.decode_into(qc, sc, torch.empty(q.shape, dtype=torch.bfloat16, device="cuda"), transpose=False)
    assert _torch_ops_equal(got.cpu(), want, torch.int16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        hf_modules.decode_into(qc, sc, torch.empty(q.shape, dtype=torch.bfloat16, device="cuda"), transpose=False)
    with pytest.raises(RuntimeError, match="PassManager"):
        hf_modules.decode_into(qc, sc, torch.empty(q.shape, device="cuda"), transpose=False, backend="triton")


if __name__ == "__main__":
    sys.exit(interpreter_main(sys.argv[1]))
