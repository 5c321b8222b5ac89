"""Benchmark: the CPU reference NVFP4 GEMM (quantize + dequantize included) against float32 torch.matmul.

For each shape C[M,N] = A[M,K] B[N,K]^T, measured in the same run with the same torch thread count:

* baseline: ``torch.matmul(a, b.T)`` in float32;
* ours: ``quantize_nvfp4(a)`` (1x16, RNE) + ``quantize_nvfp4(b, block_2d=True)`` + ``nvfp4_matmul``
  (decode both operands to float32 ``e2m1 * e4m3`` and one float32 matmul, alpha in the epilogue);
* ours with the stochastic-rounding + Hadamard quantizer on A (the gradient operand of the weight-
  gradient GEMM), for information;
* for information: the fused Lion step on an MXFP8 master (SR write-back) vs ``torch.optim.AdamW`` on a
  float32 parameter of the same size.

Target (issue 4): ours / baseline <= 3.0.

Run::

    python benchmarks/bench_nvfp4_cpu.py                      # default shapes
    python benchmarks/bench_nvfp4_cpu.py --shapes 2048x2048x2048 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import torch
from timing import samples  # this directory is on sys.path

import mxfp8_codec
import nvfp4_cuda

TARGET = 3.0  # max ratio ours / float32 matmul
DEFAULT_SHAPES = ("512x1024x1024", "1024x1024x1024", "2048x2048x2048")


def _time(fn: Callable[[], object], repeats: int) -> float:
    return statistics.median(samples(fn, repeats))


def bench_shape(m: int, n: int, k: int, repeats: int) -> dict[str, float]:
    """Median seconds for the baseline and our variants at one shape."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(n, k, generator=g) * 0.02

    def ours() -> torch.Tensor:
        return nvfp4_cuda.nvfp4_matmul(
            nvfp4_cuda.quantize_nvfp4(a), nvfp4_cuda.quantize_nvfp4(b, block_2d=True), out_dtype=torch.float32
        )

    def ours_sr_rht() -> torch.Tensor:
        qa = nvfp4_cuda.quantize_nvfp4(a, rounding="stochastic", hadamard=True, seed=1, step=1, tensor_id=1)
        return nvfp4_cuda.nvfp4_matmul(qa, nvfp4_cuda.quantize_nvfp4(b, hadamard=True), out_dtype=torch.float32)

    base = _time(lambda: torch.matmul(a, b.t()), repeats)
    res = {"fp32_matmul_s": base, "nvfp4_s": _time(ours, repeats), "nvfp4_sr_rht_s": _time(ours_sr_rht, repeats)}
    qa = nvfp4_cuda.quantize_nvfp4(a)
    qb = nvfp4_cuda.quantize_nvfp4(b, block_2d=True)
    res["quantize_a_s"] = _time(lambda: nvfp4_cuda.quantize_nvfp4(a), repeats)
    res["gemm_only_s"] = _time(lambda: nvfp4_cuda.nvfp4_matmul(qa, qb, out_dtype=torch.float32), repeats)
    res["ratio"] = res["nvfp4_s"] / base
    res["ratio_sr_rht"] = res["nvfp4_sr_rht_s"] / base
    return res


def bench_optimizer(rows: int, cols: int, repeats: int) -> dict[str, float]:
    """Fused Lion on an MXFP8 master (SR write-back) vs torch.optim.AdamW on a float32 parameter, same size."""
    g = torch.Generator().manual_seed(1)
    w = 0.02 * torch.randn(rows, cols, generator=g)
    grad = torch.randn(rows, cols, generator=g).to(torch.bfloat16)
    payload, scales = mxfp8_codec.encode_mxfp8(w)
    mom = torch.zeros(rows, cols, dtype=torch.bfloat16)
    step = iter(range(10**9))
    lion = _time(lambda: nvfp4_cuda.lion_step_mxfp8_(payload, scales, grad, mom, lr=1e-5, step=next(step)), repeats)
    p = torch.nn.Parameter(w.clone())
    p.grad = grad.float()
    opt = torch.optim.AdamW([p], lr=1e-5)
    adamw = _time(opt.step, repeats)
    return {"lion_mxfp8_s": lion, "adamw_fp32_s": adamw, "ratio": lion / adamw}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print a table, optionally write JSON; exit 1 if a shape misses the target."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="MxNxK")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, target ours/fp32 <= {TARGET}")
    print(
        f"{'M x N x K':>18} {'fp32 mm':>9} {'nvfp4':>9} {'ratio':>6} {'SR+RHT':>9} {'ratio':>6} "
        f"{'quant A':>9} {'gemm':>9}"
    )
    results = {}
    ok = True
    for s in args.shapes:
        m, n, k = (int(v) for v in s.split("x"))
        r = bench_shape(m, n, k, args.repeats)
        results[s] = r
        ok &= r["ratio"] <= TARGET
        print(
            f"{s:>18} {r['fp32_matmul_s'] * 1e3:8.1f}m {r['nvfp4_s'] * 1e3:8.1f}m {r['ratio']:6.2f} "
            f"{r['nvfp4_sr_rht_s'] * 1e3:8.1f}m {r['ratio_sr_rht']:6.2f} {r['quantize_a_s'] * 1e3:8.1f}m "
            f"{r['gemm_only_s'] * 1e3:8.1f}m"
        )
    opt = bench_optimizer(4096, 1024, args.repeats)
    print(
        f"optimizer, 4096 x 1024 params: Lion on MXFP8 master (SR) {opt['lion_mxfp8_s'] * 1e3:.1f} ms, "
        f"torch AdamW float32 {opt['adamw_fp32_s'] * 1e3:.1f} ms, ratio {opt['ratio']:.2f} (information)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"torch": torch.__version__, "threads": torch.get_num_threads(), "results": results, "optimizer": opt},
                f,
                indent=2,
            )
    print("target met" if ok else "TARGET MISSED on at least one shape")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
