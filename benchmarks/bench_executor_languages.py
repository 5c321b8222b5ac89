"""Executor speed per language: ida_eval's sandboxed executor vs a plain unsandboxed runner.

For each language, the canonical solutions (or, for the samples-only go/perl/scala files, the
example samples) of the first ``--limit`` tasks are executed twice, alternating:

* baseline ``plain``: per program a temporary directory, the *same files* (program + driver, from
  :func:`ida_eval.languages.assemble`), the *same* compile and run commands, environment (Go's
  build cache in that directory, ``NODE_PATH``) and time limits through ``subprocess.run``, with the
  same worker count; pass = compile ok and run exit 0. No namespaces, no limits, no tree kill.
* ``ida_eval``: :func:`ida_eval.execute.execute_samples` with the default isolation. Its C++ compiles
  read the precompiled ``bits/stdc++.h`` (:mod:`ida_eval.precompiled`; the plain runner's command is
  mxeval's); ``IDA_EVAL_CPP_PCH=0`` gives both the same command.

It prints wall seconds of each, the ratio ours / plain, the CPU seconds each used (this process and
its waited-for descendants: compilers, runtimes, the sandbox), and pass counts (which must agree but
for the early-exit trap, which the plain runner lacks). Wall time is the target's measure; it needs
an idle machine (quote ``uptime``). The CPU ratio is steadier on a busy one.

Usage:
    python benchmarks/bench_executor_languages.py [--languages java,go] [--limit N] [--workers N]
        [--repeats R] [--data-dir DIR] [--no-job-server]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ida_eval import sandbox
from ida_eval.execute import ExecutionConfig, canonical_samples, execute_samples, isolation_in_force, load_samples
from ida_eval.languages import LANGUAGES, assemble, environment, missing_tools
from ida_eval.problems import example_samples_file, language_files, load_problems
from ida_eval.sandbox import SAFE_PATH

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "mbxp"


def tasks_for(lang: str, data_dir: Path, limit: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    path = language_files("mbxp", data_dir)[lang]
    problems = load_problems(path)
    samples = canonical_samples(problems) or load_samples(example_samples_file(path), problems)  # samples-only file
    return problems, samples[:limit]


def plain_runner(
    lang: str, problems: dict[str, Any], samples: list[dict[str, Any]], workers: int, cfg: ExecutionConfig
) -> int:
    """The baseline: same files and commands, plain subprocesses; returns how many passed."""
    language = LANGUAGES[lang]

    def one(sample: dict[str, Any]) -> bool:
        with tempfile.TemporaryDirectory(prefix="bench-plain-") as d:
            for name, text in assemble(language, problems[sample["task_id"]], sample["completion"]):
                Path(d, name).write_text(text, encoding="utf-8")
            env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": d, "TMPDIR": d}
            env.update((k, v.replace("{work}", d)) for k, v in environment(language))
            try:
                if language.compile is not None:
                    c = subprocess.run(
                        language.compile,
                        cwd=d,
                        env=env,
                        capture_output=True,
                        timeout=cfg.compile_timeout(language),
                        check=False,
                    )
                    if c.returncode not in language.compile_ok:
                        return False
                r = subprocess.run(
                    language.run,
                    cwd=d,
                    env=env,
                    capture_output=True,
                    stdin=subprocess.DEVNULL,
                    timeout=cfg.run_timeout(language),
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return False
            return r.returncode == 0

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(one, samples))


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for descendants so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--languages", default="javascript,typescript,java,go,cpp,csharp,ruby,php,perl")
    ap.add_argument("--limit", type=int, default=40, help="tasks per language")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--data-dir", default=str(DEFAULT_DIR))
    ap.add_argument(
        "--no-job-server",
        action="store_true",
        help="start a bootstrap per program, as before job servers (ida_eval.sandbox.JOB_SERVER)",
    )
    args = ap.parse_args(argv)
    cfg = ExecutionConfig(workers=args.workers)
    sandbox.JOB_SERVER = not args.no_job_server
    print(
        f"isolation: {isolation_in_force()}; job server {'off' if args.no_job_server else 'on'}; "
        f"workers {args.workers}; load {os.getloadavg()}"
    )
    print(
        f"{'language':<11} {'tasks':>5} {'plain s':>8} {'ida s':>8} {'ratio':>6} {'plain cpu':>9} {'ida cpu':>8} "
        f"{'ratio':>6}  passed plain/ida"
    )
    for lang in args.languages.split(","):
        if missing_tools(LANGUAGES[lang]):
            print(f"{lang:<11} toolchain missing: {', '.join(missing_tools(LANGUAGES[lang]))}")
            continue
        problems, samples = tasks_for(lang, Path(args.data_dir), args.limit)
        plain_t, ours_t, plain_c, ours_c = [], [], [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), _cpu_seconds()
            plain_pass = plain_runner(lang, problems, samples, args.workers, cfg)
            plain_t.append(time.perf_counter() - t0)
            plain_c.append(_cpu_seconds() - c0)
            t0, c0 = time.perf_counter(), _cpu_seconds()
            res = execute_samples(problems, samples, config=cfg, progress=False)
            ours_t.append(time.perf_counter() - t0)
            ours_c.append(_cpu_seconds() - c0)
            ours_pass = sum(r["passed"] for r in res)
        p, o = statistics.median(plain_t), statistics.median(ours_t)
        pc, oc = statistics.median(plain_c), statistics.median(ours_c)
        print(
            f"{lang:<11} {len(samples):>5} {p:>8.1f} {o:>8.1f} {o / p:>6.2f} {pc:>9.1f} {oc:>8.1f} {oc / pc:>6.2f}  "
            f"{plain_pass}/{ours_pass}",
            flush=True,
        )
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
