"""Benchmark (GPU): NVFP4 kernels against baselines measured in the same run on the same device.

Baselines: ``torch.matmul`` in BF16 (cuBLAS) for the GEMMs; a device-to-device copy (``dst.copy_(src)``,
1 GiB, bytes read + written) for the bandwidth-bound kernels.  Targets (issue 22):

* GEMM (emulated: exact BF16 decode of both NVFP4 operands + cuBLASLt with alpha on the device):
  >= 0.85x torch bf16 at 4096^3; >= 0.8x at Minitron-4B's shapes (8192 tokens, hidden 3072, MLP 9216:
  forward, data-gradient and weight-gradient GEMMs of the attention and MLP projections).  Also shown:
  the GEMM on an already decoded weight (how the trainer runs forward and dgrad), informational.
* Quantize (16384 x 4096 BF16 activations): 1x16 and 16x16 blocks, RNE and stochastic, >= 0.8x copy
  bandwidth; with the Hadamard rotation >= 0.6x.  Bytes counted: the input read twice (the amax pass and
  the quantize pass: a per-tensor scale needs the whole tensor's amax first), codes and scales written.
* NVFP4 -> BF16 decode (the GEMM's operand): informational, bytes = codes + scales read, BF16 written.
* Lion on an MXFP8 master (4096 x 8192, BF16 gradient), every write-back: >= 0.8x copy bandwidth,
  bytes = payload + scales read and written, gradient read, momentum read and written, compensation
  read and written (``compensated`` only).

Each time is the median of 5 rounds of ``--iters`` calls timed with CUDA events after a warm-up.
Writes a JSON file and a markdown table (``--out-prefix``).  Exits 0 with a message when no GPU; exit 1
when a target is missed (the table says which).  ``--no-gemm`` measures the bandwidth-bound kernels only:
how step 5 of ``scripts/device_check.sh`` compares a library built with other flags
(``NVFP4_CUDA_NVCC_FLAGS=-DNV_QUANT_NB=1``: one 1x16 block per quantizer thread; the header says which).

Run::

    python -m nvfp4_cuda build && python benchmarks/bench_nvfp4_gpu.py --out-prefix /tmp/nvfp4_gpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import torch

import mxfp8_codec
import nvfp4_cuda
from nvfp4_cuda import build

GEMM_TARGET_4096 = 0.85  # emulated NVFP4 / torch bf16 throughput at 4096^3
GEMM_TARGET_SHAPES = 0.80  # ... at Minitron-4B's shapes
QUANT_TARGET = 0.80  # fraction of copy bandwidth
HADAMARD_TARGET = 0.60
LION_TARGET = 0.80

TOKENS, HIDDEN, MLP = 8192, 3072, 9216  # Minitron-4B: hidden 3072, MLP 9216; 8192 tokens per micro-batch
# (name, M, N, K) of C[M, N] = A[M, K] B[N, K]^T for the projections' three GEMMs
MINITRON_GEMMS: tuple[tuple[str, int, int, int], ...] = (
    ("fprop attn 3072->3072", TOKENS, HIDDEN, HIDDEN),
    ("fprop mlp up 3072->9216", TOKENS, MLP, HIDDEN),
    ("fprop mlp down 9216->3072", TOKENS, HIDDEN, MLP),
    ("dgrad mlp up (K=9216)", TOKENS, HIDDEN, MLP),
    ("dgrad mlp down (K=3072)", TOKENS, MLP, HIDDEN),
    ("wgrad attn (K=8192)", HIDDEN, HIDDEN, TOKENS),
    ("wgrad mlp up (K=8192)", HIDDEN, MLP, TOKENS),
    ("wgrad mlp down (K=8192)", MLP, HIDDEN, TOKENS),
)


def cuda_time(fn: Callable[[], object], iters: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean seconds per call, CUDA events, after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) / 1e3 / iters)
    return statistics.median(per_call)


def gemm_rows(iters: int) -> list[dict[str, object]]:
    """torch bf16 vs emulated NVFP4 for 4096^3 and the Minitron shapes."""
    dev = torch.device("cuda")
    rows = []
    for name, m, n, k in (("4096^3", 4096, 4096, 4096), *MINITRON_GEMMS):
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        t_bf16 = cuda_time(lambda a=a, b=b: torch.matmul(a, b.t()), iters)
        qa, qb = nvfp4_cuda.quantize_nvfp4(a), nvfp4_cuda.quantize_nvfp4(b, block_2d=True)
        t_emu = cuda_time(lambda qa=qa, qb=qb: nvfp4_cuda.nvfp4_matmul(qa, qb, backend="emulated"), iters)
        db = nvfp4_cuda.decode_scaled(qb)  # a weight decoded once per step
        t_pre = cuda_time(
            lambda qa=qa, qb=qb, db=db: nvfp4_cuda.gemm_decoded(
                nvfp4_cuda.decode_scaled(qa), db, qa.tensor_scale, qb.tensor_scale
            ),
            iters,
        )
        row = {
            "name": name,
            "m": m,
            "n": n,
            "k": k,
            "torch_bf16_tflops": flops / t_bf16 / 1e12,
            "emulated_tflops": flops / t_emu / 1e12,
            "emulated_vs_torch_bf16": t_bf16 / t_emu,
            "decoded_weight_vs_torch_bf16": t_bf16 / t_pre,
            "target": GEMM_TARGET_4096 if name == "4096^3" else GEMM_TARGET_SHAPES,
        }
        if torch.cuda.get_device_capability()[0] == 12:
            t_nat = cuda_time(lambda qa=qa, qb=qb: nvfp4_cuda.nvfp4_matmul(qa, qb, backend="native"), iters)
            row["native_vs_torch_bf16"] = t_bf16 / t_nat
        rows.append(row)
        del a, b, qa, qb, db
    return rows


def copy_bandwidth(iters: int) -> float:
    """Bytes/s of a 1 GiB device-to-device copy, read + write."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = cuda_time(lambda: dst.copy_(src), iters)
    return 2 * src.numel() / t


def bandwidth_rows(iters: int, copy_bw: float) -> list[dict[str, object]]:
    """Quantize variants, decode, Lion write-backs: achieved bytes/s over copy bandwidth."""
    dev = torch.device("cuda")
    rows = []
    x = torch.randn(16384, 4096, device=dev, dtype=torch.bfloat16)
    n = x.numel()
    q_bytes = 2 * 2 * n + n // 2 + n // 16  # read twice (amax, quantize), codes + scales written
    variants = (
        ("quantize 1x16 RNE", {}, QUANT_TARGET),
        ("quantize 1x16 stochastic", {"rounding": "stochastic", "seed": 1, "step": 2, "tensor_id": 3}, QUANT_TARGET),
        ("quantize 16x16 RNE", {"block_2d": True}, QUANT_TARGET),
        ("quantize 1x16 RNE + Hadamard", {"hadamard": True}, HADAMARD_TARGET),
        (
            "quantize 1x16 stochastic + Hadamard",
            {"hadamard": True, "rounding": "stochastic", "seed": 1},
            HADAMARD_TARGET,
        ),
    )
    for name, kw, target in variants:
        t = cuda_time(lambda x=x, kw=kw: nvfp4_cuda.quantize_nvfp4(x, **kw), iters)
        rows.append(
            {"name": name, "GBps": q_bytes / t / 1e9, "fraction_of_copy": q_bytes / t / copy_bw, "target": target}
        )
    for name, kw in (
        ("quantize_decoded 1x16 RNE (BF16 values out)", {}),
        ("quantize_decoded 1x16 stochastic + Hadamard", {"hadamard": True, "rounding": "stochastic"}),
    ):
        t = cuda_time(lambda x=x, kw=kw: nvfp4_cuda.quantize_decoded(x, **kw), iters)
        b = 2 * 2 * n + 2 * n  # read twice, BF16 values written
        rows.append({"name": name, "GBps": b / t / 1e9, "fraction_of_copy": b / t / copy_bw, "target": None})
    from nvfp4_cuda import cuda_ops

    amax = torch.empty(1, dtype=torch.float32, device=dev)
    st = torch.cuda.current_stream().cuda_stream
    t = cuda_time(
        lambda x=x: cuda_ops._call(
            "nvfp4_amax", x.data_ptr(), 1, 0, x.shape[0], x.shape[1], x.shape[1], 0, 0, amax.data_ptr(), st
        ),
        iters,
    )
    rows.append(
        {"name": "amax pass alone", "GBps": 2 * n / t / 1e9, "fraction_of_copy": 2 * n / t / copy_bw, "target": None}
    )
    q = nvfp4_cuda.quantize_nvfp4(x)
    d_bytes = n // 2 + n // 16 + 2 * n
    t = cuda_time(lambda q=q: nvfp4_cuda.decode_scaled(q), iters)
    rows.append(
        {
            "name": "decode NVFP4 -> BF16",
            "GBps": d_bytes / t / 1e9,
            "fraction_of_copy": d_bytes / t / copy_bw,
            "target": None,
        }
    )
    del x, q
    shape = (4096, 8192)
    p, s = mxfp8_codec.encode_mxfp8(0.02 * torch.randn(*shape, device=dev))
    # the trainer's weights, every forward (and every recomputation): 16x16 tiles of the MXFP8 master
    t = cuda_time(lambda: nvfp4_cuda.quantize_decoded_from_mxfp8(p, s, block_2d=True), iters)
    w_bytes = 2 * (p.numel() + s.numel()) + 2 * p.numel()  # the master read twice (amax, quantize), BF16 written
    rows.append(
        {
            "name": "quantize_decoded 16x16 RNE from the MXFP8 master (the trainer's weights)",
            "GBps": w_bytes / t / 1e9,
            "fraction_of_copy": w_bytes / t / copy_bw,
            "target": None,
        }
    )
    grad = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
    mom = torch.zeros(*shape, device=dev, dtype=torch.bfloat16)
    comp = torch.zeros(*shape, device=dev, dtype=torch.float32)
    step = iter(range(10**9))
    for wb in ("stochastic", "rne", "compensated"):
        c = comp if wb == "compensated" else None
        t = cuda_time(
            lambda wb=wb, c=c: nvfp4_cuda.lion_step_mxfp8_(
                p, s, grad, mom, lr=1e-5, writeback=wb, compensation=c, step=next(step)
            ),
            iters,
        )
        l_bytes = p.numel() * (2 + 2 + 4) + 2 * s.numel() + (8 * p.numel() if c is not None else 0)
        rows.append(
            {
                "name": f"Lion on MXFP8 master, {wb}",
                "GBps": l_bytes / t / 1e9,
                "fraction_of_copy": l_bytes / t / copy_bw,
                "target": LION_TARGET,
            }
        )
    return rows


def run(iters: int, gemm: bool = True) -> dict[str, object]:
    """All measurements (without the GEMM rows unless ``gemm``); returns a result dict."""
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "capability": torch.cuda.get_device_capability(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "backend_info": nvfp4_cuda.backend_info(),
        "nvcc_extra_flags": " ".join(build.extra_flags()),  # the library this run measures
    }
    res["gemm"] = gemm_rows(iters) if gemm else []
    from nvfp4_cuda import cuda_ops

    res["cublaslt"] = cuda_ops.cublaslt_library()
    copy_bw = copy_bandwidth(iters)
    res["copy_GBps"] = copy_bw / 1e9
    res["bandwidth"] = bandwidth_rows(iters, copy_bw)
    missed = [r["name"] for r in res["gemm"] if r["emulated_vs_torch_bf16"] < r["target"]]
    missed += [r["name"] for r in res["bandwidth"] if r["target"] is not None and r["fraction_of_copy"] < r["target"]]
    res["missed"] = missed
    return res


def markdown(res: dict[str, object]) -> str:
    """The side-by-side tables."""
    lines = [
        f"Device: {res['device']} (sm_{res['capability'][0]}{res['capability'][1]}), torch {res['torch']}, "
        f"CUDA {res['cuda']}; copy bandwidth {res['copy_GBps']:.0f} GB/s (read + write); "
        f"cuBLASLt {res['cublaslt'] or '?'}"
        + (
            f"; library built with {build.EXTRA_FLAGS_ENV}={res['nvcc_extra_flags']}" if res["nvcc_extra_flags"] else ""
        ),
    ]
    if res["gemm"]:
        lines += [
            "",
            "| GEMM (M x N x K) | torch bf16 TFLOP/s | emulated NVFP4 TFLOP/s | emulated / bf16 | "
            "decoded weight / bf16 | target |",
            "|---|---|---|---|---|---|",
        ]
    for r in res["gemm"]:
        mark = "" if r["emulated_vs_torch_bf16"] >= r["target"] else " **MISSED**"
        lines.append(
            f"| {r['name']} ({r['m']} x {r['n']} x {r['k']}) | {r['torch_bf16_tflops']:.0f} | "
            f"{r['emulated_tflops']:.0f} | {r['emulated_vs_torch_bf16']:.2f}x{mark} | "
            f"{r['decoded_weight_vs_torch_bf16']:.2f}x | >= {r['target']} |"
        )
    lines += ["", "| kernel | GB/s | / copy | target |", "|---|---|---|---|"]
    for r in res["bandwidth"]:
        ok = r["target"] is None or r["fraction_of_copy"] >= r["target"]
        tgt = f">= {r['target']}" if r["target"] is not None else "(info)"
        lines.append(
            f"| {r['name']} | {r['GBps']:.0f} | {r['fraction_of_copy']:.2f}{'' if ok else ' **MISSED**'} | {tgt} |"
        )
    lines += ["", "All targets met." if not res["missed"] else f"Missed: {', '.join(res['missed'])}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run and print; write JSON/markdown when asked."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out-prefix", default=None, help="write <prefix>.json and <prefix>.md")
    ap.add_argument("--no-gemm", action="store_true", help="the bandwidth-bound kernels only (no GEMM rows)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: GPU benchmark not run")
        return 0
    res = run(args.iters, gemm=not args.no_gemm)
    md = markdown(res)
    if args.out_prefix:
        with open(args.out_prefix + ".json", "w") as f:
            json.dump(res, f, indent=2, default=str)
        with open(args.out_prefix + ".md", "w") as f:
            f.write(md)
    print(md)
    return 1 if res["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
