"""``python -m ida_eval.mbxp``: score a checkpoint on MBXP (or multilingual HumanEval), or compare runs.

::

    python -m ida_eval.mbxp --checkpoint DIR [--problems FILE | --language LANG|all] [--out OUT] ...
    torchrun --nproc-per-node N -m ida_eval.mbxp --checkpoint DIR ...      # data-parallel generation
    python -m ida_eval.mbxp --compare RUN_A RUN_B [RUN_C ...] [--out DIR]

The command parses and checks its arguments (output directory, problems file, checkpoint directory,
tokenizer files, ``SHA256SUMS``) before torch is imported, then runs :mod:`ida_eval.harness`: load ->
generate (greedy by default; ``--samples-per-task`` / ``--temperature`` / ``--top-p`` / ``--seed`` to
sample) -> execute in the sandbox -> classify -> ``OUT/summary.json`` and ``summary.png`` (what a run
directory holds: :mod:`ida_eval.rundir`). Rerunning the same command resumes: finished samples and
results are never redone. ``--language all`` scores each language in turn into ``OUT/<language>/`` and
writes ``OUT/languages.json``. ``--compare`` reads finished runs only (:mod:`ida_eval.reports`: pass rates
with 95 % intervals, a paired test of each pass@1 difference -- McNemar's exact test, or the permutation test
with several samples per task, Holm-adjusted where several are read together -- flipped tasks, failure-class
shifts) and needs neither torch nor a model.

Errors are one line, as in ``python -m ida_eval.execute``: exit status 2 for bad input, 3 when the
sandbox cannot run here, 130 on Ctrl-C (or a SIGTERM from torchrun when another rank died); rerunning
the same command resumes (docs/cli.md).
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ida_common.cli import ArgumentParser, Run, check_output_dir, run_main
from ida_eval.decoding import CACHES, DEFAULT_BATCH_SIZE, DEFAULT_MAX_NEW_TOKENS, DecodingConfig
from ida_eval.execute import ExecutionConfig, SandboxError, sandbox_unavailable, seconds_arg
from ida_eval.figures import plot_runs
from ida_eval.harness import evaluate_checkpoint, evaluate_checkpoint_languages, pass_at_ks
from ida_eval.loader import WEIGHTS_CHOICES
from ida_eval.parallel import current_ranks
from ida_eval.problems import language_files
from ida_eval.reports import (
    compare_dirs,
    comparison_figure_data,
    format_compare_dirs,
    format_language_table,
    format_summary,
)
from ida_eval.rundir import COMPARISON_FIGURE_FILE, COMPARISON_FILE, LANGUAGES_FILE, write_json_atomic

__all__ = ["PROG", "main"]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(
        prog="python -m ida_eval.mbxp",
        short_prog=PROG,
        description="Score a checkpoint on MBXP or multilingual HumanEval, any of their languages or all: greedy "
        "pass@1 or sampled pass@k with failure analysis, in one process or under torchrun; or compare finished "
        "runs. "
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
        help="compare finished runs with the first (pass rates with 95 %% intervals, a paired test of each "
        "difference: McNemar's exact test, or a permutation test with several samples per task, Holm-adjusted "
        "where several are read together; flipped tasks, class shifts); with --out, also comparison.json and "
        "comparison.png there",
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
            write_json_atomic(out / COMPARISON_FILE, result)
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
                on_language=lambda lang, s: print(format_summary(s, out / lang)) if main_rank else None,
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
        print(format_summary(summary, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
