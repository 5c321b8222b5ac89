"""MBXP (Python) pass@1 for a checkpoint: load -> generate -> execute -> classify -> summary.json.

``python -m ida_eval.mbxp --checkpoint DIR`` (or :func:`evaluate_checkpoint` /
:func:`evaluate_model` from Python) writes three files under ``--out``:

* ``samples.jsonl``: mxeval samples (``task_id``, ``completion``) plus ``raw`` (the generation before
  truncation), ``n_tokens`` and ``stop_reason``. Appended batch by batch (one write + fsync), so an
  interrupted run resumes: tasks already there are not generated again (a torn last line is dropped).
* ``results.jsonl``: the executor's mxeval results (:func:`ida_eval.execute.execute_samples`, which
  resumes its own file and never re-executes a finished task).
* ``summary.json`` (written atomically): pass@1 over the evaluated tasks, counts per failure class
  (:mod:`ida_eval.analysis`), the achievable ceiling (8 MBXP tasks cannot be passed as shipped), the
  class of every task, degenerate-output count with examples, timings and tokens/s, the sandbox
  isolation modes the programs ran under (a list of mode names, empty when no program ran), the
  decoding and truncation rules, and the checkpoint's provenance (sha256 of every weight file, its
  precision metadata).

``run.json`` pins the decoding settings and checkpoint hashes of a run directory: resuming with
different settings or a different checkpoint is refused rather than mixing two runs' samples. It is
written once the inputs are validated and work starts, so a call that fails before (e.g. no model for
the tasks left to generate) pins nothing.

The CLI reports errors in one line, like ``python -m ida_eval.execute``: status 2 for bad input, 1 when
the sandbox cannot run here, 130 on Ctrl-C (rerunning the same command resumes).

pass@1 with one greedy sample per task is the fraction of tasks whose program passed. With
``--limit N`` only the first N problems of the file are evaluated and pass@1 is over those N.
``--compare DIR_A DIR_B`` prints two finished runs side by side (pass@1, classes, flipped tasks).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ida_common.cli import ArgumentParser, Run, check_output_dir, run_main
from ida_common.files import atomic_write_text
from ida_common.jsonl import dumps_utf8, iter_jsonl, repair_torn_tail
from ida_eval.analysis import (
    ceiling_report,
    compare_runs,
    degenerate_report,
    failure_counts,
    format_comparison,
    load_run,
    score_results,
    task_classes,
)
from ida_eval.decoding import (
    CACHES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_NEW_TOKENS,
    STOP_STRINGS,
    DecodingConfig,
    Generation,
)
from ida_eval.execute import (
    ExecutionConfig,
    SandboxError,
    execute_samples,
    read_results,
    sandbox_unavailable,
    seconds_arg,
    summarize,
)
from ida_eval.figures import plot_runs
from ida_eval.languages import LANGUAGES, language_of
from ida_eval.loader import WEIGHTS_CHOICES, check_checkpoint_dir, describe_checkpoint, load_model, torch_dtype
from ida_eval.parallel import ONE_PROCESS, Ranks, cuda_device_for, current_ranks, shard_name, shard_paths
from ida_eval.problems import find_problems_file, language_files, load_problems
from ida_eval.stats import mean_pass_at_k

if TYPE_CHECKING:
    import torch

SAMPLES_FILE = "samples.jsonl"
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"
LANGUAGES_FILE = "languages.json"  # the table over languages of a --language all run
COMPARISON_FILE = "comparison.json"  # --compare ... --out DIR
COMPARISON_FIGURE_FILE = "comparison.png"
FIGURE_FILE = "summary.png"  # pass rates with intervals and failure classes, drawn from summary.json
LANGUAGES_FIGURE_FILE = "languages.png"  # the same over the languages of languages.json
DEFAULT_PASS_AT = (1, 10, 100)  # the k reported by default, where there are at least k samples per task


class RunDirError(ValueError):
    """An output directory holds files of a different run, or a malformed samples file."""


# ---------------------------------------------------------------------------------------------
# files


def _write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write_text(path, dumps_utf8(obj, indent=2) + "\n")


def read_samples(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Read ``samples.jsonl`` ((task_id, completion_id) -> record) after
    :func:`~ida_common.jsonl.repair_torn_tail`. A greedy record has no ``completion_id`` (it is 0).

    Raises:
        RunDirError: a malformed complete line, or a (task, sample) pair written twice, naming the file
            and line.
    """
    data = repair_torn_tail(path)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    lines: dict[tuple[str, int], int] = {}
    for lineno, where, rec in iter_jsonl(data.splitlines(), path, RunDirError):
        if not isinstance(rec.get("task_id"), str) or not isinstance(rec.get("completion"), str):
            raise RunDirError(f"{where}: a sample needs string 'task_id' and 'completion'")
        cid = rec.get("completion_id", 0)
        if not isinstance(cid, int) or isinstance(cid, bool) or cid < 0:
            raise RunDirError(f"{where}: 'completion_id' must be a non-negative integer, got {cid!r}")
        key = (rec["task_id"], cid)
        if key in out:
            raise RunDirError(
                f"{where}: {key[0]} sample {cid} is already on line {lines[key]}; a samples file holds each "
                "(task, sample) once"
            )
        out[key], lines[key] = rec, lineno
    return out


def _append_samples(path: Path, gens: Sequence[Generation], *, numbered: bool) -> None:
    """Append generations; ``numbered`` records carry their ``completion_id`` (sampling runs; a greedy
    run's records stay as mxeval's)."""
    _append_records(
        path,
        [
            {
                "task_id": g.task_id,
                **({"completion_id": g.completion_id} if numbered else {}),
                "completion": g.completion,
                "raw": g.raw,
                "n_tokens": g.n_tokens,
                "stop_reason": g.stop_reason,
            }
            for g in gens
        ],
    )


def _append_records(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Append sample records as they are (one write + fsync)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(dumps_utf8(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def merge_shards(out_dir: Path) -> int:
    """Move the samples of rank shards (``samples.rank<R>.jsonl``, :mod:`ida_eval.parallel`) into
    ``samples.jsonl``; returns how many were new. Idempotent: a sample already there is skipped (a
    kill between the append and the shard's removal repeats nothing), a different text under the same
    (task, sample) is an error.

    Raises:
        RunDirError: a malformed shard, or two different samples under one (task, sample).
    """
    shards = shard_paths(out_dir)
    if not shards:
        return 0
    main_path = out_dir / SAMPLES_FILE
    have = read_samples(main_path)
    new: dict[tuple[str, int], dict[str, Any]] = {}
    for shard in shards:
        for key, rec in read_samples(shard).items():
            old = have.get(key) or new.get(key)
            if old is None:
                new[key] = rec
            elif old["completion"] != rec["completion"]:
                raise RunDirError(
                    f"{shard}: {key[0]} sample {key[1]} differs from the one already kept; use a fresh --out directory"
                )
    if new:
        _append_records(main_path, list(new.values()))
    for shard in shards:
        shard.unlink()
    return len(new)


def _samples_done(out_dir: Path) -> set[tuple[str, int]]:
    """The (task, sample) pairs already generated: in ``samples.jsonl`` or a rank's shard."""
    done = set(read_samples(out_dir / SAMPLES_FILE))
    for shard in shard_paths(out_dir) if out_dir.is_dir() else []:
        done |= set(read_samples(shard))
    return done


def _check_run_file(out_dir: Path, run: dict[str, Any]) -> bool:
    """Refuse a run directory that holds a different run (decoding settings, checkpoint identity).

    Writes nothing: returns True when the directory is not pinned yet, and the caller writes ``run``
    to ``run.json`` with :func:`_pin_run` once its inputs are validated and work is about to start,
    so a call that fails validation leaves a fresh directory free for other settings.
    """
    path = out_dir / RUN_FILE
    if path.is_file():
        old = json.loads(path.read_text())
        for key in ("decoding", "checkpoint_sha256"):
            if old.get(key) != run.get(key):
                raise RunDirError(
                    f"{out_dir}: holds a run with different {key} ({old.get(key)!r} vs now {run.get(key)!r}); "
                    "use a fresh --out directory"
                )
        return False
    if (out_dir / SAMPLES_FILE).is_file():
        raise RunDirError(f"{out_dir}: has {SAMPLES_FILE} but no {RUN_FILE}; use a fresh --out directory")
    return True


def _run_record(decoding: DecodingConfig, checkpoint_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``run.json`` pins: the decoding settings (but the batch size and the KV cache, which do not
    change greedy output in float32 and may change between resumes) and the checkpoint's file hashes."""
    describe = decoding.describe()
    describe.pop("batch_size")
    describe.pop("cache", None)  # like the batch size, the cache may change between resumes
    return {"decoding": describe, "checkpoint_sha256": _sha_of(checkpoint_info)}


def _pin_run(out_dir: Path, run: dict[str, Any]) -> None:
    """Create the run directory and write ``run.json``: from now on it holds this run only."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json_atomic(out_dir / RUN_FILE, run)


def _sha_of(info: Mapping[str, Any] | None) -> list[str] | None:
    if not info:
        return None
    return [f"{f['name']}:{f.get('sha256')}" for f in info.get("files", [])]


# ---------------------------------------------------------------------------------------------
# the harness


def stop_strings_for(problems: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """The generation stop strings of the problems' language (one language per run: a mixed file
    is refused, since one decoding setting is pinned per run directory)."""
    langs = {language_of(p) for p in problems.values()}
    if len(langs) > 1:
        raise ValueError(f"problems of several languages ({', '.join(sorted(langs))}): run one language per --out")
    return LANGUAGES[langs.pop()].stop_sequences if langs else STOP_STRINGS


def pass_at_ks(pass_at: Sequence[int] | None, samples_per_task: int) -> list[int]:
    """The k of pass@k to report: ``pass_at`` checked against the samples per task, or by default those
    of :data:`DEFAULT_PASS_AT` there are enough samples for.

    Example:
        >>> pass_at_ks(None, 20), pass_at_ks([10, 1], 10)
        ([1, 10], [1, 10])
    """
    if pass_at is None:
        return [k for k in DEFAULT_PASS_AT if k <= samples_per_task]
    ks = sorted(set(pass_at))
    bad = [k for k in ks if not isinstance(k, int) or isinstance(k, bool) or k < 1]
    if bad or not ks:
        raise ValueError(f"pass@k: k must be integers >= 1, got {list(pass_at)!r}")
    if ks[-1] > samples_per_task:
        raise ValueError(
            f"pass@{ks[-1]} needs at least {ks[-1]} samples per task, the run has {samples_per_task} "
            "(raise --samples-per-task or lower --pass-at)"
        )
    return ks


def figure_data(summary: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What :func:`ida_eval.figures.plot_runs` draws for one run: per language its pass@1, the 95 %
    interval and the classes of its samples, all read from ``summary`` (summary.json)."""
    langs = list(summary.get("languages") or {}) or ["python"]
    return {
        "name": name,
        "languages": {
            lang: {
                "rate": summary["pass@1"],
                "interval": summary["intervals"]["pass@1"],
                "classes": dict(summary["counts"]),
            }
            for lang in langs[:1]  # one language per run directory (stop_strings_for)
        },
    }


def select_problems(problems: Mapping[str, Mapping[str, Any]] | str | Path, limit: int | None) -> dict[str, Any]:
    """Problems as a dict in file order, the first ``limit`` of them when given."""
    if isinstance(problems, (str, Path)):
        problems = load_problems(problems)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    ids = list(problems)[:limit] if limit is not None else list(problems)
    return {t: problems[t] for t in ids}


def evaluate_model(
    model: Any,
    tokenizer: Any,
    problems: Mapping[str, Mapping[str, Any]] | str | Path,
    out_dir: str | Path,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    limit: int | None = None,
    exec_config: ExecutionConfig | None = None,
    progress: bool = True,
    checkpoint_info: Mapping[str, Any] | None = None,
    stop_strings: Sequence[str] | None = None,
    samples_per_task: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    pass_at: Sequence[int] | None = None,
    cache: str = "dynamic",
    ranks: Ranks = ONE_PROCESS,
) -> dict[str, Any]:
    """Generate, execute and score MBXP problems with an in-memory model (the trainer's entry point).

    Args:
        model: a transformers causal LM (may be None when ``out_dir`` already holds every sample).
        tokenizer: its tokenizer.
        problems: ``{task_id: problem}`` or a problems JSONL path.
        out_dir: run directory (created; an existing run with the same settings is resumed).
        batch_size: rows per generate call.
        max_new_tokens: generation budget per completion.
        limit: evaluate only the first ``limit`` problems.
        exec_config: executor limits/workers (default ``ExecutionConfig()``).
        progress: tqdm bars for generation and execution.
        checkpoint_info: provenance recorded in the summary (see
            :func:`ida_eval.loader.describe_checkpoint`).
        stop_strings: generation stop strings (recorded; default: the problems' language's,
            :data:`ida_eval.languages.LANGUAGES` ``stop_sequences``, Python's being
            :data:`~ida_eval.decoding.STOP_STRINGS`).
        samples_per_task, temperature, top_p, seed: sampling (:class:`~ida_eval.decoding.DecodingConfig`;
            the default is one greedy completion per task).
        pass_at: the k of pass@k to report (default: 1, and 10 and 100 where there are that many
            samples per task); each k <= ``samples_per_task``.
        cache: the KV cache of generation, ``"dynamic"`` or ``"static"`` (compiled on a GPU).
        ranks: the processes sharing this evaluation (:func:`ida_eval.parallel.current_ranks` under
            torchrun: every rank calls this with the same arguments); default one process, as when a
            trainer's rank 0 evaluates alone.

    Returns:
        The summary dict also written to ``out_dir/summary.json``.

    Example:
        >>> summary = evaluate_model(model, tok, "mbpp_release_v1.jsonl", "runs/eval", limit=50)  # doctest: +SKIP
        >>> summary["pass@1"], summary["counts"]["degenerate"]  # doctest: +SKIP
    """
    t_start = time.perf_counter()
    chosen = select_problems(problems, limit)
    if stop_strings is None:
        stop_strings = stop_strings_for(chosen)
    decoding = DecodingConfig(
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        stop_strings=tuple(stop_strings),
        samples_per_task=samples_per_task,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        cache=cache,
    )
    ks = pass_at_ks(pass_at, decoding.samples_per_task)
    out = Path(out_dir)
    run = _run_record(decoding, checkpoint_info)
    unpinned = _check_run_file(out, run)
    progress = progress and ranks.is_main  # one set of bars: rank 0's share stands for all
    if ranks.is_main and out.is_dir():
        merge_shards(out)  # what ranks of an interrupted run generated
    ranks.barrier()

    samples_path = out / SAMPLES_FILE
    have = read_samples(samples_path)
    n = decoding.samples_per_task
    missing = {t: [j for j in range(n) if (t, j) not in have] for t in chosen}
    todo = {t: p["prompt"] for t, p in chosen.items() if missing[t]}
    wanted, left = len(chosen) * n, sum(len(m) for m in missing.values())
    if left < wanted and ranks.is_main:
        print(
            f"resumed: {wanted - left} of {wanted} already done (generation, {samples_path})",
            file=sys.stderr,
            flush=True,
        )
    if todo and model is None:
        raise ValueError(f"{out}: {left} completions still need generating but no model was given")
    if unpinned and ranks.is_main:  # the inputs are valid and work starts: only now is the directory this run's
        _pin_run(out, run)
    ranks.barrier()
    shard_path = samples_path if ranks.world_size == 1 else out / shard_name(ranks.rank)
    mine = _share(todo, missing, ranks) if ranks.world_size > 1 else {t: missing[t] for t in todo}

    gen_seconds, new_tokens = 0.0, 0
    if mine:
        how = (
            "greedy"
            if not decoding.sampling
            else f"{n} samples per task, temperature {decoding.temperature}, top-p {decoding.top_p}, seed {decoding.seed}"
        )
        what = f"{left} samples of {len(todo)} problems" if decoding.sampling else f"{len(todo)} problems"
        if ranks.world_size > 1:
            what = f"{sum(len(v) for v in mine.values())} of {what} (rank {ranks.rank} of {ranks.world_size})"
        _phase(
            f"generate: {what}, {decoding.batch_size} at a time, up to {decoding.max_new_tokens} new tokens "
            f"each ({how})"
        )
        from ida_eval.generate import generate_completions  # torch and transformers: only to generate

        t0 = time.perf_counter()
        gens = generate_completions(
            model,
            tokenizer,
            {t: todo[t] for t in mine},
            decoding,
            progress=progress,
            on_batch=lambda b: _append_samples(shard_path, b, numbered=decoding.sampling),
            completion_ids=mine,
        )
        gen_seconds = time.perf_counter() - t0
        new_tokens = sum(g.n_tokens for g in gens)
    per_rank = ranks.gather(
        {
            "rank": ranks.rank,
            "device": _model_info(model)["device"] if model is not None else None,
            "samples": sum(len(v) for v in mine.values()),
            "tokens": new_tokens,
            "seconds": round(gen_seconds, 3),
            "tokens_per_s": round(new_tokens / gen_seconds, 2) if gen_seconds > 0 else None,
        }
    )
    if ranks.world_size > 1:
        ranks.barrier()  # every shard complete
        if not ranks.is_main:
            ranks.barrier()  # rank 0 merges, executes and writes the summary
            return json.loads((out / SUMMARY_FILE).read_text())
        merge_shards(out)
        gen_seconds = max(r["seconds"] for r in per_rank)
        new_tokens = sum(r["tokens"] for r in per_rank)
    if todo:
        have = read_samples(samples_path)
    samples = [{"completion_id": j, **have[(t, j)]} for t in chosen for j in range(n)]

    t0 = time.perf_counter()
    config = exec_config if exec_config is not None else ExecutionConfig()
    before = read_results(out / RESULTS_FILE)
    executed = sum((s["task_id"], s["completion_id"]) not in before for s in samples)
    _phase(f"execute: {len(samples)} programs in the sandbox, {config.workers} at a time -> {out / RESULTS_FILE}")
    results = execute_samples(chosen, samples, out_path=out / RESULTS_FILE, config=config, progress=progress)
    exec_seconds = time.perf_counter() - t0

    # the independent ast.parse check is for Python prompts only
    prompts = {t: p["prompt"] for t, p in chosen.items() if language_of(p) == "python"}
    raws = {(s["task_id"], s["completion_id"]): s["raw"] for s in samples if isinstance(s.get("raw"), str)}
    counts, per_task = failure_counts(results, prompts, raws)
    exec_summary = summarize(results, chosen)
    summary: dict[str, Any] = {
        "pass@1": exec_summary["pass@1"],
        **score_results(results, ks),
        "languages": exec_summary["languages"],
        "n_tasks": len(chosen),
        "samples_per_task": n,
        "passed": counts["passed"],
        "counts": counts,
        "degenerate": degenerate_report(samples),
        "ceiling": ceiling_report(per_task),
        "timings": {
            "generation_s": round(gen_seconds, 3),
            "execution_s": round(exec_seconds, 3),
            "total_s": round(time.perf_counter() - t_start, 3),
            "generated_tasks": len(todo),
            "generated_samples": left if todo else 0,
            "generated_tokens": new_tokens,
            "tokens_per_s": round(new_tokens / gen_seconds, 2) if gen_seconds > 0 else None,
            "ranks": per_rank,
            "executed_programs": executed,
            "programs_per_s": round(executed / exec_seconds, 2) if executed and exec_seconds > 0 else None,
        },
        "isolation": exec_summary["isolation"],
        "executor": {
            "result_classes": exec_summary["result_classes"],
            "timed_out": exec_summary["timed_out"],
            "pass@1_runnable": exec_summary["pass@1_runnable"],
            "timeout_s": config.timeout,
            "workers": config.workers,
        },
        "decoding": decoding.describe(),
        "checkpoint": dict(checkpoint_info) if checkpoint_info else None,
        "model": _model_info(model),
        "problems": {"n_selected": len(chosen), "limit": limit, "first": next(iter(chosen), None)},
        "per_task": per_task,
    }
    _write_json_atomic(out / SUMMARY_FILE, summary)
    if results:  # nothing ran, nothing to draw
        plot_runs([figure_data(summary, out.name)], out / FIGURE_FILE)
    if ranks.world_size > 1:
        ranks.barrier()  # the summary is written: the other ranks read it
    return summary


def _share(todo: Mapping[str, str], missing: Mapping[str, list[int]], ranks: Ranks) -> dict[str, list[int]]:
    """This rank's samples: every ``world_size``-th of the missing ones, longest prompt first (by
    characters; ties in task order), so that each rank gets long and short prompts alike."""
    units = [(t, j) for t in sorted(todo, key=lambda t: -len(todo[t])) for j in missing[t]]
    mine: dict[str, list[int]] = {}
    for t, j in units[ranks.rank :: ranks.world_size]:
        mine.setdefault(t, []).append(j)
    return mine


def _phase(line: str) -> None:
    """One line on stderr when a phase of the evaluation starts (load, generate, execute)."""
    print(line, file=sys.stderr, flush=True)


def _lazy_model(
    checkpoint_dir: str | Path,
    info: Mapping[str, Any] | None,
    dtype: torch.dtype | str | None,
    device_map: Any,
    progress: bool,
    weights: str,
) -> Any:
    """A function that loads the checkpoint on its first call (with a phase line) and returns it after."""
    loaded: list[Any] = []

    def model_and_tokenizer() -> tuple[Any, Any]:
        if not loaded:
            kind = (info or {}).get("format", "")
            _phase(
                f"load: {checkpoint_dir} ({kind + ' ' if kind else ''}safetensors -> "
                f"{str(torch_dtype(dtype)).removeprefix('torch.')} model, weights {weights})"
            )
            loaded.extend(  # describe_checkpoint has checked the files against their SHA256SUMS
                load_model(
                    checkpoint_dir,
                    dtype=dtype,
                    device_map=device_map,
                    progress=progress,
                    weights=weights,
                    check_sums=info is None,
                )
            )
        return loaded[0], loaded[1]

    return model_and_tokenizer


def _model_info(model: Any) -> dict[str, Any] | None:
    if model is None:
        return None
    p = next(model.parameters())
    import torch
    import transformers

    mxfp8 = [m for m in model.modules() if type(m).__name__ == "MXFP8Linear"]
    fused = any(m.fused_max_tokens for m in mxfp8)
    return {
        "class": type(model).__name__,
        # projections decoded once, MXFP8-resident, or resident with the fused kernel for decoding steps
        "weights": ("mxfp8-fused" if fused else "mxfp8") if mxfp8 else "bf16",
        "dtype": str(p.dtype).removeprefix("torch."),
        "device": str(p.device),
        "device_map": getattr(model, "hf_device_map", None),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _device_map_for(device: str, device_map: Any, ranks: Ranks) -> Any:
    """transformers' ``device_map`` for ``--device`` / ``--device-map``; under torchrun each rank takes
    its own GPU (``cuda:LOCAL_RANK``)."""
    if ranks.world_size > 1 and device_map is not None:
        raise ValueError(
            f"--device-map {device_map}: under torchrun each of the {ranks.world_size} ranks loads the whole "
            "model on its own GPU; leave --device-map out (or run one process to split a model over GPUs)"
        )
    if device_map is not None:
        return device_map
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if device == "cuda" and ranks.world_size > 1:
        if ranks.env.local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"rank {ranks.rank}: LOCAL_RANK {ranks.env.local_rank} but only {torch.cuda.device_count()} "
                "CUDA devices here; start at most that many processes per node"
            )
        torch.cuda.set_device(ranks.env.local_rank)
        return cuda_device_for(ranks)
    return None if device == "cpu" else device


def evaluate_checkpoint(
    checkpoint_dir: str | Path,
    *,
    problems_path: str | Path | None = None,
    out_dir: str | Path,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    limit: int | None = None,
    device: str = "auto",
    device_map: Any = None,
    dtype: torch.dtype | str | None = None,
    exec_config: ExecutionConfig | None = None,
    progress: bool = True,
    weights: str = "bf16",
    samples_per_task: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    pass_at: Sequence[int] | None = None,
    cache: str = "dynamic",
    ranks: Ranks = ONE_PROCESS,
) -> dict[str, Any]:
    """Load a checkpoint directory (MXFP8 or plain) and run :func:`evaluate_model` on it.

    ``dtype``: the model's parameter dtype, a ``torch.dtype`` or its name (default bfloat16).
    ``weights``: ``"bf16"`` (decoded once), ``"mxfp8"`` (projections stay MXFP8 in memory) or
    ``"mxfp8-fused"`` (and a fused kernel for decoding steps on a GPU): :func:`ida_eval.loader.load_model`;
    summary.json's ``model.weights`` records which.

    The model is not loaded at all when ``out_dir`` already holds every sample (resume), nor when
    ``out_dir`` holds a run with other settings or another checkpoint (:class:`RunDirError` first).

    Example:
        >>> evaluate_checkpoint("runs/sft/final", out_dir="runs/sft/final-mbxp", limit=100)  # doctest: +SKIP
    """
    check_output_dir(out_dir, "--out")  # checks before work: nothing loaded or created until they pass
    problems = select_problems(load_problems(find_problems_file(problems_path)), limit)
    settings = dict(
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        limit=limit,
        exec_config=exec_config,
        progress=progress,
        samples_per_task=samples_per_task,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        pass_at=pass_at,
        cache=cache,
        ranks=ranks,
    )
    info, model_and_tokenizer = _checkpoint_for(checkpoint_dir, settings, dtype, device, device_map, weights)
    return _evaluate_loaded(problems, Path(out_dir), info, model_and_tokenizer, settings)


def _checkpoint_for(
    checkpoint_dir: str | Path,
    settings: Mapping[str, Any],
    dtype: torch.dtype | str | None,
    device: str,
    device_map: Any,
    weights: str,
) -> tuple[dict[str, Any], Any]:
    """The checks of a checkpoint run before work (the directory, ``--pass-at``; then its files against their
    ``SHA256SUMS`` while :func:`describe_checkpoint` hashes them), its description for results files, and the
    function that loads the model on first need (:func:`_lazy_model`)."""
    check_checkpoint_dir(checkpoint_dir, "--checkpoint")
    pass_at_ks(settings["pass_at"], settings["samples_per_task"])  # bad --pass-at before hashing or loading
    info = settings["ranks"].once_per_machine(lambda: describe_checkpoint(checkpoint_dir))  # hashed once per machine
    device_map = _device_map_for(device, device_map, settings["ranks"])
    return info, _lazy_model(checkpoint_dir, info, dtype, device_map, settings["progress"], weights)


def _evaluate_loaded(
    problems: Mapping[str, Mapping[str, Any]],
    out_dir: Path,
    info: Mapping[str, Any],
    model_and_tokenizer: Any,
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """:func:`evaluate_model` (with ``settings``, its keyword arguments) with the model loaded (by
    ``model_and_tokenizer()``) only when some sample still needs generating, and a run with other
    settings refused before that load."""
    decoding = DecodingConfig(
        stop_strings=stop_strings_for(problems), **{k: v for k, v in settings.items() if k in _DECODING_FIELDS}
    )
    _check_run_file(out_dir, _run_record(decoding, info))  # refuse a different run before a long load
    have = _samples_done(out_dir)
    model = tokenizer = None
    if any((t, j) not in have for t in problems for j in range(decoding.samples_per_task)):
        model, tokenizer = model_and_tokenizer()
    return evaluate_model(model, tokenizer, problems, out_dir, checkpoint_info=info, **settings)


_DECODING_FIELDS = frozenset(f.name for f in dataclasses.fields(DecodingConfig))


def evaluate_checkpoint_languages(
    checkpoint_dir: str | Path,
    files: Mapping[str, str | Path],
    *,
    out_dir: str | Path,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    limit: int | None = None,
    device: str = "auto",
    device_map: Any = None,
    dtype: torch.dtype | str | None = None,
    exec_config: ExecutionConfig | None = None,
    progress: bool = True,
    on_language: Any = None,
    weights: str = "bf16",
    samples_per_task: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    pass_at: Sequence[int] | None = None,
    cache: str = "dynamic",
    ranks: Ranks = ONE_PROCESS,
) -> dict[str, Any]:
    """Score a checkpoint on several languages' problems files in turn (the model loaded once).

    Each language's run goes to ``out_dir/<language>/`` (a full run directory: samples, results,
    summary, resumable); ``out_dir/languages.json`` (written atomically) holds one row per language:
    ``pass@1``, ``n_tasks``, ``passed``, ``toolchain_missing``, ``pass@1_runnable`` and the
    failure-class counts. ``on_language(language, summary)`` is called after each language.
    """
    check_output_dir(out_dir, "--out")
    settings = dict(
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        limit=limit,
        exec_config=exec_config,
        progress=progress,
        samples_per_task=samples_per_task,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        pass_at=pass_at,
        cache=cache,
        ranks=ranks,
    )
    info, model_and_tokenizer = _checkpoint_for(checkpoint_dir, settings, dtype, device, device_map, weights)
    ks = pass_at_ks(pass_at, samples_per_task)
    out = Path(out_dir)
    table: dict[str, Any] = {}
    per_task_counts: dict[str, dict[str, tuple[int, int]]] = {}
    for lang, path in files.items():
        problems = select_problems(load_problems(path), limit)
        summary = _evaluate_loaded(problems, out / lang, info, model_and_tokenizer, settings)
        lang_row = summary["languages"].get(lang, {})
        table[lang] = {
            "pass@1": summary["pass@1"],
            "n_tasks": summary["n_tasks"],
            "passed": summary["passed"],
            "toolchain_missing": lang_row.get("toolchain_missing", 0),
            "pass@1_runnable": summary["executor"].get("pass@1_runnable", summary["pass@1"]),
            "samples_per_task": summary["samples_per_task"],
            "pass@k": summary["pass@k"],
            "intervals": summary["intervals"],
            "counts": summary["counts"],
            "problems_file": str(path),
        }
        per_task_counts[lang] = {t: (len(cs), cs.count("passed")) for t, cs in _classes(summary).items()}
        if on_language is not None:
            on_language(lang, summary)
    pooled = {(lang, t): c for lang, counts in per_task_counts.items() for t, c in counts.items()}
    overall = {f"pass@{k}": mean_pass_at_k(pooled, k) for k in ks} if pooled else {}
    result = {
        "languages": table,
        "overall": {"pass@k": overall, "n_tasks": len(pooled), "languages": len(table)},
        "checkpoint": dict(info) if info else None,
    }
    if ranks.is_main:
        _write_json_atomic(out / LANGUAGES_FILE, result)
        plot_runs([languages_figure_data(result, out.name)], out / LANGUAGES_FIGURE_FILE)
    return result


def _classes(summary: Mapping[str, Any]) -> dict[str, list[str]]:
    return {t: task_classes(c) for t, c in summary["per_task"].items()}


def languages_figure_data(table: Mapping[str, Any], name: str) -> dict[str, Any]:
    """:func:`figure_data` for a ``--language all`` run, read from ``languages.json``."""
    return {
        "name": name,
        "languages": {
            lang: {"rate": r["pass@1"], "interval": r["intervals"]["pass@1"], "classes": dict(r["counts"])}
            for lang, r in table["languages"].items()
        },
    }


def format_language_table(table: Mapping[str, Mapping[str, Any]], overall: Mapping[str, Any] | None = None) -> str:
    """One line per language: pass@1 with its 95 % interval, passed/tasks (samples, with several per
    task), every other pass@k, runnable pass@1 and the toolchain-missing count; then the ``overall``
    pass@k of ``languages.json`` over all tasks when given."""
    w = max([len(k) for k in table] + [8])
    extra = sorted({k for r in table.values() for k in r.get("pass@k", {})} - {"pass@1"}, key=lambda k: int(k[5:]))
    lines = [
        f"{'language':<{w}}  pass@1  95 % interval     passed/total  "
        + "".join(f"{k:>9}" for k in extra)
        + "  runnable pass@1  toolchain missing"
    ]
    for lang, r in table.items():
        lo, hi = r.get("intervals", {}).get("pass@1", (float("nan"), float("nan")))
        ks = "".join(f"{r.get('pass@k', {}).get(k, float('nan')):>9.4f}" for k in extra)
        lines.append(
            f"{lang:<{w}}  {r['pass@1']:.4f}  [{lo:.4f}, {hi:.4f}]  {r['passed']:>6}/{r['n_tasks'] * r.get('samples_per_task', 1):<6}"
            f"{ks}  {r['pass@1_runnable']:.4f}           {r['toolchain_missing']}"
        )
    if overall and overall.get("pass@k"):
        lines.append(
            f"overall over {overall['n_tasks']} tasks of {overall['languages']} languages: "
            + ", ".join(f"{k} {v:.4f}" for k, v in overall["pass@k"].items())
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# comparing runs


def _run_languages(run_dir: Path) -> dict[str, Path]:
    """language -> run directory: the per-language directories of a ``--language all`` run, or the
    directory itself (its summary's language)."""
    table = run_dir / LANGUAGES_FILE
    if table.is_file():
        langs = json.loads(table.read_text())["languages"]
        return {lang: run_dir / lang for lang in langs if (run_dir / lang / SUMMARY_FILE).is_file()}
    langs = list(load_run(run_dir).get("languages") or {}) or ["python"]
    return {langs[0]: run_dir}


def compare_dirs(dirs: Sequence[Path]) -> dict[str, Any]:
    """Compare finished runs with the first, per language they all have (:func:`compare_runs` each).

    Returns the JSON written to ``comparison.json``: ``{"baseline", "runs", "languages": {language:
    {"runs": [pass rates, intervals, class counts of each run], "comparisons": [compare_runs(first,
    other) for each other run]}}}``.

    Raises:
        ValueError: a directory that is not a finished run, or runs without a language in common.
    """
    per_run = [_run_languages(d) for d in dirs]
    common = [lang for lang in per_run[0] if all(lang in r for r in per_run[1:])]
    if not common:
        raise ValueError(
            "--compare: the runs have no language in common ("
            + "; ".join(f"{d}: {', '.join(r) or 'none'}" for d, r in zip(dirs, per_run, strict=True))
            + ")"
        )
    languages: dict[str, Any] = {}
    for lang in common:
        comparisons = [compare_runs(per_run[0][lang], r[lang]) for r in per_run[1:]]
        runs = [comparisons[0]["a"]] + [c["b"] for c in comparisons]
        languages[lang] = {"runs": runs, "comparisons": comparisons}
    return {"baseline": str(dirs[0]), "runs": [str(d) for d in dirs], "languages": languages}


def format_compare_dirs(result: Mapping[str, Any]) -> str:
    """The text of :func:`compare_dirs`: per language, each run against the baseline."""
    blocks = []
    for lang, entry in result["languages"].items():
        for cmp in entry["comparisons"]:
            blocks.append(f"=== {lang}\n{format_comparison(cmp)}")
    return "\n".join(blocks)


def comparison_figure_data(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the comparison figure draws, read from :func:`compare_dirs`' result (comparison.json)."""
    names = [Path(d).name or d for d in result["runs"]]
    if len(set(names)) < len(names):
        names = list(result["runs"])
    return [
        {
            "name": name,
            "languages": {
                lang: {
                    "rate": e["runs"][i]["pass@1"],
                    "interval": e["runs"][i]["interval"],
                    "classes": e["runs"][i]["counts"],
                }
                for lang, e in result["languages"].items()
            },
        }
        for i, name in enumerate(names)
    ]


# ---------------------------------------------------------------------------------------------
# CLI


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(
        prog="python -m ida_eval.mbxp",
        short_prog=PROG,
        description="Score a checkpoint on MBXP Python (greedy pass@1 with failure analysis), or compare two runs. "
        "Exit status: 0 done, 2 bad input, 3 no sandbox here, 130 interrupted (docs/cli.md).",
    )
    ap.add_argument("--checkpoint", help="checkpoint directory (MXFP8 or plain safetensors, config + tokenizer)")
    ap.add_argument(
        "--problems", help="problems JSONL of any language (default: an installed mxeval's MBXP Python data)"
    )
    ap.add_argument(
        "--language",
        help="a language's file from the benchmark directory's metadata.json, or 'all' "
        "(each language in turn into OUT/<language>/, plus OUT/languages.json)",
    )
    ap.add_argument(
        "--benchmark",
        choices=("mbxp", "humaneval"),
        default="mbxp",
        help="with --language: MBXP or multilingual HumanEval (default mbxp)",
    )
    ap.add_argument(
        "--data-dir",
        help="with --language: the benchmark directory (default $IDA_MBXP_DIR / "
        "$IDA_HUMANEVAL_DIR, else an installed mxeval's data/)",
    )
    ap.add_argument("--out", help="output directory (default: ./mbxp-<checkpoint name>)")
    ap.add_argument("--limit", type=int, help="only the first N problems")
    ap.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"prompts generated at once (default {DEFAULT_BATCH_SIZE})",
    )
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help=f"generation budget per problem (default {DEFAULT_MAX_NEW_TOKENS})",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="auto",
        help="where the model runs (default auto: cuda when available)",
    )
    ap.add_argument("--device-map", help="accelerate device map, e.g. 'auto' to split layers over GPUs")
    ap.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="dtype of the loaded weights (default bfloat16)",
    )
    ap.add_argument(
        "--weights",
        choices=WEIGHTS_CHOICES,
        default="bf16",
        help="bf16: weights decoded once (default); mxfp8: projections stay MXFP8 in memory and are "
        "decoded at each forward (same logits, about half the weight memory); mxfp8-fused: as mxfp8, and on a "
        "GPU decoding steps decode the weight inside one fused kernel (faster; logits not bit-identical); "
        "summary.json records it",
    )
    ap.add_argument(
        "--samples-per-task",
        type=int,
        default=1,
        metavar="N",
        help="completions per task (default 1; more than one needs --temperature)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature (default 0: greedy); a task's samples depend only on --seed, the task and "
        "their number",
    )
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold in (0, 1] (default 1)")
    ap.add_argument("--seed", type=int, help="sampling seed (default 0; needs --temperature)")
    ap.add_argument(
        "--pass-at",
        type=_k_list,
        metavar="K,K,...",
        help="the k of pass@k, each <= --samples-per-task (default: 1, and 10, 100 where there are that many "
        "samples; mxeval's unbiased estimator)",
    )
    ap.add_argument(
        "--cache",
        choices=CACHES,
        default="dynamic",
        help="KV cache of generation: dynamic (default) or static (one shape for every batch; on a GPU "
        "transformers compiles the decoding step: faster, first batch slower)",
    )
    ap.add_argument("--workers", type=int, help="programs executed at once (default: nproc)")
    ap.add_argument("--timeout", type=seconds_arg, help="seconds per program (executor default when omitted)")
    ap.add_argument(
        "--compare",
        nargs="+",
        metavar="DIR",
        help="compare finished runs with the first (pass rates with 95 %% intervals, McNemar's exact test, "
        "flipped tasks, class shifts); with --out, also comparison.json and comparison.png there",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    if args.compare is None and not args.checkpoint:
        ap.error("give --checkpoint DIR (or --compare DIR_A DIR_B ...)")
    if args.compare is not None and len(args.compare) < 2:
        ap.error("--compare needs at least two run directories")
    if args.seed is not None and args.temperature == 0:
        ap.error("--seed needs --temperature > 0 (greedy decoding does not sample)")
    try:
        DecodingConfig(
            samples_per_task=args.samples_per_task,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed or 0,
        )
        pass_at_ks(args.pass_at, args.samples_per_task)
    except ValueError as e:
        ap.error(str(e))
    if args.language and args.problems:
        ap.error("give --problems FILE or --language LANG, not both")
    return args


def _k_list(text: str) -> list[int]:
    """argparse type of --pass-at: comma-separated integers >= 1."""
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"each k must be an integer >= 1: {text!r}")
    return ks


def _print_summary(s: Mapping[str, Any], out: Path) -> None:
    c = s["counts"]
    n = s.get("samples_per_task", 1)
    lo, hi = s["intervals"].get("pass@1", (0.0, 1.0))
    what = f"{s['passed']}/{s['n_tasks']} tasks" if n == 1 else f"{s['passed']}/{s['n_tasks'] * n} samples"
    print(f"pass@1 = {s['pass@1']:.4f} [95 % {lo:.4f}, {hi:.4f}]  ({what})  -> {out / SUMMARY_FILE}")
    for name, value in s["pass@k"].items():
        if name != "pass@1":
            lo, hi = s["intervals"][name]
            print(f"{name} = {value:.4f} [95 % {lo:.4f}, {hi:.4f}]")
    print("classes: " + ", ".join(f"{k}: {v}" for k, v in c.items()))
    d = s["degenerate"]
    print(
        f"degenerate completions: {d['count']}"
        + (f" (e.g. {d['examples'][0]['task_id']}: {d['examples'][0]['reason']})" if d["examples"] else "")
    )
    t = s["timings"]
    print(
        f"generation {t['generation_s']} s ({t['tokens_per_s']} tokens/s), execution {t['execution_s']} s "
        f"({t['programs_per_s']} programs/s); "
        f"isolation: {', '.join(s['isolation']) or 'none (nothing ran)'}"
    )


PROG = "ida_eval.mbxp"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad input, 3 the sandbox cannot run here, 130
    interrupted: :mod:`ida_common.cli`, docs/cli.md)."""
    return run_main(PROG, _main, argv)


def _main(run: Run) -> int:
    args = _parse_args(run.argv)
    if args.compare:
        result = compare_dirs([Path(d) for d in args.compare])
        print(format_compare_dirs(result))
        if args.out:
            out = Path(args.out)
            check_output_dir(out, "--out")
            out.mkdir(parents=True, exist_ok=True)
            _write_json_atomic(out / COMPARISON_FILE, result)
            plot_runs(comparison_figure_data(result), out / COMPARISON_FIGURE_FILE)
            print(f"-> {out / COMPARISON_FILE}, {out / COMPARISON_FIGURE_FILE}")
        return 0
    out = Path(args.out) if args.out else Path(f"mbxp-{Path(args.checkpoint).resolve().name}")
    ranks = current_ranks()  # under torchrun: join the other ranks (each runs this same command)
    if ranks.env.launched:
        # torchrun stops the other ranks with SIGTERM when one dies: stop as on Ctrl-C (the sandboxed
        # programs are cancelled, one line says what is kept and how to resume) instead of vanishing
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    run.kept = f"finished samples and results are kept in {out}: rerun the same command (same --out) to resume"
    cfg: dict[str, Any] = {}
    if args.workers is not None:
        cfg["workers"] = args.workers
    if args.timeout is not None:
        cfg["timeout"] = args.timeout
    options = dict(
        samples_per_task=args.samples_per_task,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed or 0,
        pass_at=args.pass_at,
        cache=args.cache,
        ranks=ranks,
    )
    common = dict(
        out_dir=out,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        limit=args.limit,
        device=args.device,
        device_map=args.device_map,
        dtype=args.dtype,  # its name: torch is imported once the cheap checks have passed
        weights=args.weights,
        exec_config=ExecutionConfig(**cfg),
        progress=not args.no_progress,
        **options,
    )
    if args.language:
        files = language_files(args.benchmark, args.data_dir)
        if args.language != "all" and args.language not in files:
            raise ValueError(
                f"--language {args.language!r}: not in the {args.benchmark} metadata.json "
                f"(there: all, {', '.join(files)})"
            )
        chosen = files if args.language == "all" else {args.language: files[args.language]}
        main_rank = ranks.is_main
        try:
            result = evaluate_checkpoint_languages(
                args.checkpoint,
                chosen,
                on_language=lambda lang, s: _print_summary(s, out / lang) if main_rank else None,
                **common,
            )
        except SandboxError as e:
            raise sandbox_unavailable(e) from None
        if not main_rank:
            return 0
        print(format_language_table(result["languages"], result.get("overall")))
        print(f"-> {out / LANGUAGES_FILE}")
        return 0
    try:
        summary = evaluate_checkpoint(args.checkpoint, problems_path=args.problems, **common)
    except SandboxError as e:
        raise sandbox_unavailable(e) from None
    if ranks.is_main:
        _print_summary(summary, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
