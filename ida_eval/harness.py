"""The MBXP harness: problems -> generate -> execute in the sandbox -> classify -> ``summary.json``.

:func:`evaluate_model` scores an in-memory model (the trainer's entry point);
:func:`evaluate_checkpoint` loads a checkpoint directory first (MXFP8 or plain), and
:func:`evaluate_checkpoint_languages` scores one checkpoint on several languages' problems files with
the model loaded once. ``python -m ida_eval.mbxp`` (:mod:`ida_eval.mbxp`) is their command line.

Every language of ``ida_eval.languages`` runs through the same steps; a run directory holds one language
(its stop strings and decoding settings are pinned there: :mod:`ida_eval.rundir`, which also says what
each file holds). One greedy completion per task is the default; with ``samples_per_task`` > 1 and a
temperature, each task's samples depend only on the seed, the task and their number, and pass@k is
mxeval's unbiased estimator (:mod:`ida_eval.stats`). Under torchrun every rank calls the same function:
each generates a disjoint share into its own shard, rank 0 merges, executes and writes the summary
(:mod:`ida_eval.parallel`).

``summary.json`` (written atomically): pass@1 and pass@k over the evaluated tasks with 95 % intervals,
counts per failure class (:mod:`ida_eval.analysis`), the achievable ceiling (8 MBXP tasks cannot be
passed as shipped), the class of every task, the degenerate-output count with examples, timings and
tokens/s per rank, the sandbox isolation modes the programs ran under (empty when no program ran), the
decoding and truncation rules, the model (class, weights, dtype, device) and the checkpoint's provenance
(sha256 of every weight file, its precision metadata). ``summary.png`` draws its pass rate and classes.

The model is loaded only when some sample still needs generating: a finished run directory is scored
again (or resumed) without it, and a directory holding another run is refused before any load.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ida_common.cli import check_output_dir
from ida_eval.analysis import ceiling_report, degenerate_report, failure_counts, score_results, task_classes
from ida_eval.decoding import DEFAULT_BATCH_SIZE, DEFAULT_MAX_NEW_TOKENS, STOP_STRINGS, DecodingConfig
from ida_eval.execute import ExecutionConfig, execute_samples, read_results, summarize
from ida_eval.failures import FailureClass
from ida_eval.figures import plot_runs
from ida_eval.languages import LANGUAGES, language_of
from ida_eval.loader import check_checkpoint_dir, describe_checkpoint, load_model, torch_dtype
from ida_eval.parallel import ONE_PROCESS, Ranks, cuda_device_for, shard_name
from ida_eval.problems import find_problems_file, load_problems, problems_sha256
from ida_eval.reports import figure_data, languages_figure_data
from ida_eval.rundir import (
    FIGURE_FILE,
    LANGUAGES_FIGURE_FILE,
    LANGUAGES_FILE,
    RESULTS_FILE,
    SAMPLES_FILE,
    SUMMARY_FILE,
    append_samples,
    check_run_file,
    merge_shards,
    pin_run,
    read_samples,
    run_record,
    samples_done,
    write_json_atomic,
)
from ida_eval.stats import mean_pass_at_k

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_PASS_AT",
    "evaluate_checkpoint",
    "evaluate_checkpoint_languages",
    "evaluate_model",
    "pass_at_ks",
    "select_problems",
    "stop_strings_for",
]

DEFAULT_PASS_AT = (1, 10, 100)  # the k reported by default, where there are at least k samples per task


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
    to_pin = check_run_file(out, run_record(decoding, checkpoint_info, chosen))
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
    if to_pin and ranks.is_main:  # the inputs are valid and work starts: only now is the directory this run's
        pin_run(out, to_pin)
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
            on_batch=lambda b: append_samples(shard_path, b, numbered=decoding.sampling),
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
            "toolchains": exec_summary["toolchains"],
            "timeout_s": config.timeout,
            "workers": config.workers,
        },
        "decoding": decoding.describe(),
        "checkpoint": dict(checkpoint_info) if checkpoint_info else None,
        "model": _model_info(model),
        "problems": {
            "n_selected": len(chosen),
            "limit": limit,
            "first": next(iter(chosen), None),
            "sha256": problems_sha256(chosen),
        },
        "per_task": per_task,
    }
    write_json_atomic(out / SUMMARY_FILE, summary)
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
    check_run_file(out_dir, run_record(decoding, info, problems))  # refuse a different run before a long load
    have = samples_done(out_dir)
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
    ``pass@1``, ``n_tasks``, ``passed``, ``toolchain_missing``, ``pass@1_runnable`` (None where no sample
    could run), the ``toolchains`` that ran it, pass@k with intervals and the failure-class counts; and
    ``overall``: pass@k pooled over every task (``pass@k``, ``n_tasks``, ``languages``; a task whose
    toolchain is missing counts as failed, as mxeval counts it), the languages none of whose samples could
    run (``not_run``), and the same pass@k over the tasks that ran (``runnable``: ``pass@k``, ``n_tasks``,
    ``languages``), the number to compare between machines with different toolchains.
    ``on_language(language, summary)`` is called after each language.
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
    ran: set[tuple[str, str]] = set()  # (language, task) whose samples ran: no toolchain missing
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
            "toolchains": summary["executor"].get("toolchains", []),
            "samples_per_task": summary["samples_per_task"],
            "pass@k": summary["pass@k"],
            "intervals": summary["intervals"],
            "counts": summary["counts"],
            "problems_file": str(path),
        }
        classes = _classes(summary)
        per_task_counts[lang] = {t: (len(cs), cs.count(FailureClass.PASSED.value)) for t, cs in classes.items()}
        ran |= {(lang, t) for t, cs in classes.items() if FailureClass.TOOLCHAIN_MISSING.value not in cs}
        if on_language is not None:
            on_language(lang, summary)
    pooled = {(lang, t): c for lang, counts in per_task_counts.items() for t, c in counts.items()}
    runnable = {key: c for key, c in pooled.items() if key in ran}
    result = {
        "languages": table,
        "overall": {
            **_pooled(pooled, ks),
            "languages": len(table),
            "not_run": [lang for lang, row in table.items() if row["pass@1_runnable"] is None],
            "runnable": {**_pooled(runnable, ks), "languages": len({lang for lang, _ in runnable})},
        },
        "checkpoint": dict(info) if info else None,
    }
    if ranks.is_main:
        write_json_atomic(out / LANGUAGES_FILE, result)
        plot_runs([languages_figure_data(result, out.name)], out / LANGUAGES_FIGURE_FILE)
    return result


def _classes(summary: Mapping[str, Any]) -> dict[str, list[str]]:
    return {t: task_classes(c) for t, c in summary["per_task"].items()}


def _pooled(counts: Mapping[tuple[str, str], tuple[int, int]], ks: Sequence[int]) -> dict[str, Any]:
    """pass@k over the (language, task) -> (samples, passed) of several languages, and their number."""
    return {"pass@k": {f"pass@{k}": mean_pass_at_k(counts, k) for k in ks} if counts else {}, "n_tasks": len(counts)}
