"""Benchmark (GPU): MXFP8 decode on CUDA (one Triton kernel vs torch ops) and MXFP8Linear's forward vs bf16.

Baselines, measured in the same run on the same device:

* decode: a device-to-device copy of the same bytes (``dst.copy_(src)`` with ``src`` half the decode's
  bytes: the decode reads codes + scales and writes the output, the copy reads and writes as many).
  ``/ copy`` is the copy's time over the decode's. Target (issue 22): the Triton kernel >= 0.8x copy for
  the forward's decode (the file's layout, ``transpose=False``) at 4B projection shapes and a 128 Mi-value
  weight; the transposed decode (load / ``decode_weight``) and the torch ops are shown for comparison.
* forward: a Minitron-4B layer's projections (q, k, v, o, up, down; stored ``[in, out]`` as files store
  them) as ``MXFP8Linear`` (weights resident in MXFP8, decoded at each forward: Triton, then torch ops)
  against ``nn.Linear`` holding the same values in bf16, under ``torch.no_grad()``, at 1x64, 1x2048 and
  16x512 tokens. ``/ bf16`` is the MXFP8 time over the bf16 time (lower is better; informational). Also the
  fused kernel (``hf_modules.use_fused_linear``: the weight decoded inside the GEMM's tiles, no decoded weight
  written) at each token count, to show where it beats decode + cuBLAS.

Each time is the median of 5 rounds of ``--iters`` calls timed with CUDA events after a warm-up
(``cuda_time`` of bench_nvfp4_gpu.py). Writes a JSON file and a markdown table (``--out-prefix``).
Exits 0 with a message when there is no GPU; 1 when a target is missed (the table says which).

Run (step 5 of scripts/device_check.sh)::

    python benchmarks/bench_mxfp8_gpu.py --out-prefix /tmp/mxfp8_gpu
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from collections.abc import Iterator

import torch
from bench_nvfp4_gpu import cuda_time  # this directory is on sys.path

from ida_common.cli import error_line
from ida_common.files import atomic_write_text
from mxfp8_codec import encode_mxfp8, hf_modules, triton_decode

DEVICE = "cuda"  # (a CPU smoke run of this script's logic sets "cpu" under TRITON_INTERPRET=1)
DECODE_TARGET = 0.80  # Triton decode (file layout) / copy of the same bytes

HIDDEN, KV, MLP = 3072, 1024, 9216  # Minitron-4B
# (name, rows, cols) of a stored [in, out] payload
DECODE_SHAPES = (
    ("attn q/o 3072x3072", HIDDEN, HIDDEN),
    ("attn k/v 3072x1024", HIDDEN, KV),
    ("mlp up 3072x9216", HIDDEN, MLP),
    ("mlp down 9216x3072", MLP, HIDDEN),
    ("16384x8192 (128 Mi values)", 16384, 8192),
)
LAYER = (("q", HIDDEN, HIDDEN), ("k", HIDDEN, KV), ("v", HIDDEN, KV), ("o", HIDDEN, HIDDEN), ("up", HIDDEN, MLP))
LAYER += (("down", MLP, HIDDEN),)  # (name, in, out): Nemotron's MLP has no gate (relu^2)
TOKENS = ((1, 64), (1, 2048), (16, 512))


def _weight(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return encode_mxfp8(0.02 * torch.randn(rows, cols, device=DEVICE, generator=g))


def decode_rows(iters: int, backends: tuple[str, ...]) -> list[dict[str, object]]:
    """Decode time vs a copy of the same bytes, per shape, dtype, layout and backend."""
    rows = []
    for name, r, c in DECODE_SHAPES:
        p, s = _weight(r, c, r + c)
        for dtype in (torch.bfloat16, torch.float32):
            if dtype == torch.float32 and r * c > 64 << 20:
                continue  # float32 at the big shape adds nothing but time
            nbytes = p.numel() + s.numel() + p.numel() * dtype.itemsize
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEVICE)
            dst = torch.empty_like(src)
            t_copy = cuda_time(lambda src=src, dst=dst: dst.copy_(src), iters)
            for transpose in (False, True):
                out = torch.empty((c, r) if transpose else (r, c), dtype=dtype, device=DEVICE)
                for backend in backends:
                    call = functools.partial(hf_modules.decode_into, p, s, out, transpose=transpose, backend=backend)
                    t = cuda_time(call, iters)
                    target = DECODE_TARGET if backend == "triton" and not transpose else None
                    rows.append(
                        {
                            "name": f"{name} {str(dtype).removeprefix('torch.')}{' transposed' if transpose else ''}",
                            "backend": backend,
                            "us": t * 1e6,
                            "GBps": nbytes / t / 1e9,
                            "fraction_of_copy": t_copy / t,
                            "target": target,
                        }
                    )
            del src, dst, out
    return rows


@contextlib.contextmanager
def _decode_backend(backend: str) -> Iterator[None]:
    """MXFP8Linear's forwards decode with ``backend`` (it calls hf_modules.decode_into)."""
    original = hf_modules.decode_into
    hf_modules.decode_into = functools.partial(original, backend=backend)
    try:
        yield
    finally:
        hf_modules.decode_into = original


def forward_rows(iters: int, backends: tuple[str, ...]) -> list[dict[str, object]]:
    """A layer's projections, MXFP8-resident (Triton / torch-op decode) vs bf16 nn.Linear."""
    mx, dense = [], []
    for i, (name, n_in, n_out) in enumerate(LAYER):
        p, s = _weight(n_in, n_out, i)  # stored [in, out]
        lin = hf_modules.MXFP8Linear(n_in, n_out, bias=None, orientation="in_out", dtype=torch.bfloat16, name=name)
        lin.payload, lin.scales = p, s
        ref = torch.nn.Linear(n_in, n_out, bias=False, device=DEVICE, dtype=torch.bfloat16)
        ref.weight.data = lin.decode_weight()
        mx.append(lin)
        dense.append(ref)
    rows = []
    with torch.no_grad():
        for b, t in TOKENS:
            xs = [torch.randn(b, t, m.in_features, device=DEVICE, dtype=torch.bfloat16) for m in mx]

            def run(mods: list[torch.nn.Module], xs: list[torch.Tensor] = xs) -> None:
                for m, x in zip(mods, xs, strict=True):
                    m(x)

            t_bf16 = cuda_time(lambda: run(dense), iters)
            row: dict[str, object] = {"tokens": f"{b}x{t}", "bf16_ms": t_bf16 * 1e3}
            for backend in backends:
                with _decode_backend(backend):
                    for m, d, x in zip(mx, dense, xs, strict=True):  # same weights (the GEMM may sum in another order)
                        torch.testing.assert_close(m(x), d(x), rtol=2e-2, atol=1e-3)
                    t_mx = cuda_time(lambda: run(mx), iters)
                row[f"mxfp8_{backend}_ms"] = t_mx * 1e3
                row[f"mxfp8_{backend}_vs_bf16"] = t_mx / t_bf16
            if "triton" in backends:  # the fused kernel (use_fused_linear), at every token count, to find where it pays
                try:
                    for m in mx:
                        m.fused_max_tokens = b * t
                    for m, d, x in zip(mx, dense, xs, strict=True):
                        torch.testing.assert_close(m(x), d(x), rtol=2e-2, atol=1e-3)
                    t_fused = cuda_time(lambda: run(mx), iters)
                    row["mxfp8_fused_ms"], row["mxfp8_fused_vs_bf16"] = t_fused * 1e3, t_fused / t_bf16
                except Exception as e:  # noqa: BLE001  (a kernel Triton cannot compile here: said in the table)
                    row["fused_error"] = error_line(e)
                finally:
                    for m in mx:
                        m.fused_max_tokens = 0
            rows.append(row)
    return rows


def run(iters: int) -> dict[str, object]:
    """All measurements; returns a result dict."""
    import triton

    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "capability": torch.cuda.get_device_capability(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "tiles": {"BLOCK_R": triton_decode.BLOCK_R, "BLOCK_C": triton_decode.BLOCK_C, "warps": triton_decode.NUM_WARPS},
    }
    p, s = _weight(64, 256, 0)
    try:  # a Triton that cannot compile or launch the kernel: say so, and still measure the torch ops
        hf_modules.decode_into(p, s, torch.empty(p.shape, device=DEVICE), transpose=False, backend="triton")
        torch.cuda.synchronize()
        backends, res["triton_error"] = ("triton", "torch"), None
    except Exception as e:  # noqa: BLE001
        backends, res["triton_error"] = ("torch",), error_line(e)
    res["decode"] = decode_rows(iters, backends)
    res["forward"] = forward_rows(iters, backends)
    res["missed"] = [
        f"{r['name']} ({r['backend']})"
        for r in res["decode"]
        if r["target"] is not None and r["fraction_of_copy"] < r["target"]
    ] + ([f"the Triton decode failed: {res['triton_error']}"] if res["triton_error"] else [])
    return res


def markdown(res: dict[str, object]) -> str:
    """The side-by-side tables."""
    cap = res["capability"]
    lines = [
        f"Device: {res['device']} (sm_{cap[0]}{cap[1]}), torch {res['torch']}, CUDA {res['cuda']}, "
        f"triton {res['triton']}; tiles {res['tiles']}",
        "",
        "| MXFP8 decode | backend | us | GB/s | / copy of the same bytes | target |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["decode"]:
        ok = r["target"] is None or r["fraction_of_copy"] >= r["target"]
        tgt = f">= {r['target']}" if r["target"] is not None else "(info)"
        lines.append(
            f"| {r['name']} | {r['backend']} | {r['us']:.1f} | {r['GBps']:.0f} | "
            f"{r['fraction_of_copy']:.2f}{'' if ok else ' **MISSED**'} | {tgt} |"
        )
    lines += [
        "",
        "| Minitron-4B layer projections, tokens | bf16 ms | MXFP8 (Triton) ms | / bf16 | MXFP8 (torch ops) ms | / bf16 "
        "| MXFP8 fused ms | / bf16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["forward"]:
        triton_cells = (
            f"{r['mxfp8_triton_ms']:.3f} | {r['mxfp8_triton_vs_bf16']:.2f}x" if "mxfp8_triton_ms" in r else "failed | -"
        )
        fused_cells = (
            f"{r['mxfp8_fused_ms']:.3f} | {r['mxfp8_fused_vs_bf16']:.2f}x" if "mxfp8_fused_ms" in r else "failed | -"
        )
        lines.append(
            f"| {r['tokens']} | {r['bf16_ms']:.3f} | {triton_cells} | "
            f"{r['mxfp8_torch_ms']:.3f} | {r['mxfp8_torch_vs_bf16']:.2f}x | {fused_cells} |"
        )
    lines += [f"Fused kernel failed at {r['tokens']}: {r['fused_error']}" for r in res["forward"] if "fused_error" in r]
    lines += ["", "All targets met." if not res["missed"] else f"Missed: {', '.join(res['missed'])}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run and print; write JSON/markdown when asked."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out-prefix", default=None, help="write <prefix>.json and <prefix>.md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: GPU benchmark not run")
        return 0
    if not triton_decode.AVAILABLE:
        print("triton is not installed: the Triton decode cannot run (CUDA builds of torch ship it)")
        return 1
    res = run(args.iters)
    md = markdown(res)
    if args.out_prefix:
        atomic_write_text(args.out_prefix + ".json", json.dumps(res, indent=2, default=str))
        atomic_write_text(args.out_prefix + ".md", md)
    print(md)
    return 1 if res["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
