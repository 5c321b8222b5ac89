"""Compare our executor's verdicts with the reference executor's (mxeval), task for task.

Usage::

    git clone https://github.com/amazon-science/mxeval /tmp/mxeval     # run unmodified (commit e09974f)
    PYTHONPATH=. python scripts/mxeval_compare.py --mxeval /tmp/mxeval --language typescript \\
        --set canonical --out /tmp/cmp [--limit 300] [--chunk 100] [--update-anchors]

Both executors run over the same tasks of the language's MBXP file (``--data-dir``, default as for
``python -m ida_eval.mbxp``): its canonical solutions (``--set canonical``: every task with one, in
file order) or mxeval's example samples (``--set samples``: ``examples/<stem>_samples.jsonl``), the
first ``--limit`` of them if given. Ours: :func:`ida_eval.execute.execute_samples` (default limits,
``--workers``). Reference: ``mxeval.execution.check_correctness_<language>`` imported from the
``--mxeval`` checkout, run timeout ``--ref-timeout`` (15 s), ``--workers`` threads. The two run one
after the other (never both at once), alternating every ``--chunk`` tasks, so that an interrupted
run leaves both with the same finished prefix.

Results go to ``OUT/<language>-<set>.ours.jsonl`` and ``OUT/<language>-<set>.mxeval.jsonl``; both
are appended as tasks finish, and a rerun with the same ``--out`` reuses every finished task.

The report: a table (tasks, ours passed, reference passed, differ), then every task whose verdicts
differ with both verdicts (our result class and message, the reference's first stderr line).
``--update-anchors`` writes our verdicts and the reference's counts into
``tests/ida_eval/mbxp_language_anchors.json`` (``{language: {set: {n, passed, failed: {task_id:
class}, reference: {n, passed, differ: {task_id: "ref passed" | "ref failed"}}}}}``), the file
``tests/ida_eval/test_languages.py -k anchor`` checks. mxeval has no sandbox: run it only on the
benchmark's own programs. For C#, mxeval calls ``dotnet build`` (see docs/eval.md "Anchors per
language" for the stand-in used where there is no .NET SDK).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import threading
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ida_common.files import atomic_write_text
from ida_eval import execute as ex
from ida_eval.problems import example_samples_file, language_files, load_problems

ANCHORS = Path(__file__).resolve().parent.parent / "tests" / "ida_eval" / "mbxp_language_anchors.json"


def task_samples(
    lang: str, which: str, data_dir: str | None, limit: int | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The problems of ``lang``'s MBXP file and the samples to run: canonical solutions or mxeval's examples."""
    path = language_files("mbxp", data_dir)[lang]
    problems = load_problems(path)
    if which == "canonical":
        samples = ex.canonical_samples(problems)
    else:
        samples = ex.load_samples(example_samples_file(path), problems)
    samples = samples[:limit] if limit else samples
    seen: Counter[str] = Counter()
    for s in samples:  # the same (task_id, completion_id) keys as execute_samples gives
        s["completion_id"] = seen[s["task_id"]]
        seen[s["task_id"]] += 1
    return problems, samples


def run_ours(
    problems: dict[str, Any], samples: list[dict[str, Any]], out: Path, workers: int
) -> dict[tuple[str, int], dict[str, Any]]:
    with warnings.catch_warnings():  # records past a smaller --limit are 'not among the samples'
        warnings.simplefilter("ignore")
        res = ex.execute_samples(
            problems,
            [{k: v for k, v in s.items() if k != "completion_id"} for s in samples],
            out_path=out,
            config=ex.ExecutionConfig(workers=workers),
            progress=False,
        )
    return {(r["task_id"], r["completion_id"]): r for r in res}


def run_reference(
    mxeval_dir: str,
    lang: str,
    problems: dict[str, Any],
    samples: list[dict[str, Any]],
    out: Path,
    workers: int,
    timeout: float,
) -> dict[tuple[str, int], dict[str, Any]]:
    sys.path.insert(0, str(Path(mxeval_dir).resolve()))
    check = getattr(importlib.import_module("mxeval.execution"), f"check_correctness_{lang}")
    done: dict[tuple[str, int], dict[str, Any]] = {}
    if out.is_file():
        for line in out.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["task_id"], r["completion_id"])] = r
    lock = threading.Lock()

    def one(s: dict[str, Any]) -> None:
        r = check(problems[s["task_id"]], s["completion"], timeout)
        rec = {
            "task_id": s["task_id"],
            "completion_id": s["completion_id"],
            "passed": bool(r["passed"]),
            "result": str(r["result"] or "")[-2000:],
        }
        with lock:
            with open(out, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            done[(s["task_id"], s["completion_id"])] = rec

    todo = [s for s in samples if (s["task_id"], s["completion_id"]) not in done]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, todo))
    return {(s["task_id"], s["completion_id"]): done[(s["task_id"], s["completion_id"])] for s in samples}


def first_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return (lines[0] if lines else "")[:150]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mxeval", required=True, help="an mxeval checkout (run unmodified)")
    ap.add_argument("--language", required=True)
    ap.add_argument("--set", dest="which", choices=("canonical", "samples"), required=True)
    ap.add_argument("--out", required=True, help="directory for both executors' results (a rerun resumes)")
    ap.add_argument("--limit", type=int, help="only the first N tasks in file order")
    ap.add_argument("--chunk", type=int, default=0, help="alternate the executors every N tasks (default: all at once)")
    ap.add_argument("--workers", type=int, default=3, help="programs at once, per executor (default 3)")
    ap.add_argument("--ref-timeout", type=float, default=15.0, help="mxeval's run timeout, seconds (default 15)")
    ap.add_argument("--data-dir", help="the MBXP directory (default: as python -m ida_eval.mbxp finds it)")
    ap.add_argument("--update-anchors", action="store_true", help=f"write our verdicts into {ANCHORS.name}")
    args = ap.parse_args(argv)

    problems, samples = task_samples(args.language, args.which, args.data_dir, args.limit)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{args.language}-{args.which}"
    step = args.chunk or len(samples)
    for end in range(step, len(samples) + step, step):
        part = samples[: min(end, len(samples))]
        ours = run_ours(problems, part, stem.with_suffix(".ours.jsonl"), args.workers)
        ref = run_reference(
            args.mxeval,
            args.language,
            problems,
            part,
            stem.with_suffix(".mxeval.jsonl"),
            args.workers,
            args.ref_timeout,
        )
        print(f"{len(part)} of {len(samples)} tasks done", file=sys.stderr, flush=True)

    keys = [(s["task_id"], s["completion_id"]) for s in samples]
    differ = [k for k in keys if ours[k]["passed"] != ref[k]["passed"]]
    n_ours, n_ref = sum(ours[k]["passed"] for k in keys), sum(ref[k]["passed"] for k in keys)
    print(
        f"| language | set | tasks | ours passed | reference passed | differ |\n|---|---|---|---|---|---|\n"
        f"| {args.language} | {args.which} | {len(keys)} | {n_ours} | {n_ref} | {len(differ)} |"
    )
    for k in differ:
        o, r = ours[k], ref[k]
        print(
            f"{k[0]}: ours {'passed' if o['passed'] else ex.result_class(o)} ({first_line(o['result'])}); "
            f"reference {'passed' if r['passed'] else 'failed'} ({first_line(r['result'])})"
        )

    if args.update_anchors:
        anchors = json.loads(ANCHORS.read_text(encoding="utf-8"))
        anchors.setdefault(args.language, {})[args.which] = {
            "n": len(keys),
            "passed": n_ours,
            "failed": {k[0]: ex.result_class(ours[k]) for k in keys if not ours[k]["passed"]},
            "reference": {
                "n": len(keys),
                "passed": n_ref,
                "differ": {k[0]: "ref passed" if ref[k]["passed"] else "ref failed" for k in differ},
            },
        }
        atomic_write_text(ANCHORS, json.dumps(anchors, indent=1, sort_keys=True))
        print(f"updated {ANCHORS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
