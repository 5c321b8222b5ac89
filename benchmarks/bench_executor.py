"""Executor throughput: ida_eval's sandboxed executor vs the plain runner mxeval's design amounts to.

Both execute every ``canonical_solution`` of the MBXP Python problems with the same worker count:

* baseline ``plain-subprocess``: per program a ``tempfile.TemporaryDirectory``, ``prog.py`` written
  there, ``subprocess.run([sys.executable, "-I", "prog.py"], timeout=...)``, pass = exit status 0.
  No namespaces, no limits, no output cap, no tree kill, no check-returned sentinel.
* reference ``plain-subprocess-S``: the same with ``python -I -S`` (no ``site``), which our
  sandbox also uses, so that the price of the isolation itself is visible separately.
* ``ida_eval.execute``: :func:`execute_samples` (``canonical=True``) with the default isolation
  (namespaces + read-only fs + dropped privileges + rlimits + pids cgroup here).

The runs alternate (baseline, ours, baseline, ours, ...) so machine load hits both alike; the
script prints wall time, child CPU time and pass counts for each and the ratio ours / baseline.

Usage:
    python benchmarks/bench_executor.py [--problems FILE] [--workers N] [--repeats R] [--limit N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ida_eval.execute import (
    ExecutionConfig,
    build_program,
    execute_samples,
    isolation_in_force,
)
from ida_eval.problems import find_problems_file, load_problems

DEFAULT_PROBLEMS = Path(__file__).resolve().parents[2] / "shared" / "mbxp" / "mbpp_release_v1.jsonl"
TIMEOUT_S = 30.0  # per program, both runners


def plain_runner(
    problems: dict[str, dict[str, Any]], workers: int, timeout: float, flags: tuple[str, ...] = ("-I",)
) -> int:
    """The baseline: one ``python -I prog.py`` per program in a temp dir; returns how many passed."""

    def one(problem: dict[str, Any]) -> bool:
        with tempfile.TemporaryDirectory() as d:
            prog = Path(d, "prog.py")
            prog.write_text(build_program(problem, problem["canonical_solution"]), encoding="utf-8")
            try:
                r = subprocess.run(
                    [sys.executable, *flags, str(prog)], cwd=d, capture_output=True, timeout=timeout, check=False
                )
            except subprocess.TimeoutExpired:
                return False
            return r.returncode == 0

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(one, problems.values()))


def plain_runner_no_site(problems: dict[str, dict[str, Any]], workers: int, timeout: float) -> int:
    """The baseline with ``-I -S``: no ``site`` import (the interpreter mode our sandbox uses)."""
    return plain_runner(problems, workers, timeout, ("-I", "-S"))


def ida_runner(problems: dict[str, dict[str, Any]], workers: int, timeout: float) -> int:
    """Ours: sandboxed, every limit on; returns how many passed."""
    res = execute_samples(
        problems, canonical=True, config=ExecutionConfig(workers=workers, timeout=timeout), progress=False
    )
    return sum(r["passed"] for r in res)


def _measure(fn: Callable[[], int]) -> tuple[float, float, int]:
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    passed = fn()
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    return wall, cpu, passed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=str(DEFAULT_PROBLEMS) if DEFAULT_PROBLEMS.is_file() else None)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="first N problems only")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S)
    args = ap.parse_args(argv)
    problems = load_problems(find_problems_file(args.problems))
    if args.limit:
        problems = dict(list(problems.items())[: args.limit])
    print(f"{len(problems)} canonical solutions, {args.workers} workers, timeout {args.timeout:g} s")
    print(f"ours isolates with: {isolation_in_force()}")
    runners = (
        ("plain-subprocess", plain_runner),
        ("plain-subprocess-S", plain_runner_no_site),
        ("ida_eval.execute", ida_runner),
    )
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name, _ in runners}
    for rep in range(args.repeats):
        for name, fn in runners:
            wall, cpu, passed = _measure(lambda fn=fn: fn(problems, args.workers, args.timeout))
            runs[name].append((wall, cpu, passed))
            print(f"  run {rep + 1}: {name:18s} wall {wall:7.2f} s  child cpu {cpu:7.2f} s  passed {passed}")
    print()
    print(f"{'runner':18s} {'wall (median)':>14s} {'child cpu':>10s} {'passed':>7s}")
    med = {}
    for name, rs in runs.items():
        med[name] = (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        print(f"{name:18s} {med[name][0]:12.2f} s {med[name][1]:8.2f} s {rs[-1][2]:7d}")
    ours = med["ida_eval.execute"]
    for base in ("plain-subprocess", "plain-subprocess-S"):
        ratio, cpu_ratio = ours[0] / med[base][0], ours[1] / med[base][1]
        verdict = "no slower" if ratio <= 1.0 else "slower"
        print(f"ratio ida_eval.execute / {base}: wall {ratio:.2f}x, child cpu {cpu_ratio:.2f}x ({verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
