"""MBXP evaluation: load MXFP8 checkpoints into transformers, generate, execute in a sandbox, score.

Modules: :mod:`ida_eval.loader` (``load_model``: meta-device build, streamed MXFP8 decode, transpose,
strict keys), :mod:`ida_eval.decoding` (the decoding settings and rules, recorded with a run),
:mod:`ida_eval.generate` (batched greedy or sampled generation, stop strings, truncation),
:mod:`ida_eval.analysis` (failure classes, degenerate-output detection, run comparison),
:mod:`ida_eval.stats` (pass@k as mxeval computes it, intervals, McNemar's exact test),
:mod:`ida_eval.figures` (pass rates and failure classes as a PNG), :mod:`ida_eval.parallel`
(data-parallel generation under torchrun),
:mod:`ida_eval.failures` (the one failure vocabulary: the ``ResultKind`` of every record, failure classes),
:mod:`ida_eval.execute` (the sandboxed executor), :mod:`ida_eval.harness` (generate, execute, score:
``evaluate_model`` / ``evaluate_checkpoint``), :mod:`ida_eval.rundir` (the files of a run directory),
:mod:`ida_eval.reports` (summaries, figures' data, comparing runs) and :mod:`ida_eval.mbxp` (the CLI
``python -m ida_eval.mbxp``).

Example:
    >>> from ida_eval import load_model, is_degenerate, degeneration_reason
    >>> is_degenerate("\\t\\t\\t\\t" * 20), degeneration_reason("\\t\\t\\t\\t" * 20)
    (True, 'whitespace flood (80 chars)')
"""

from ida_common.lazy import lazy_attributes

# Every public name is imported on first use. ``python -m ida_eval.execute`` / ``python -m ida_eval.mbxp``
# run those modules as __main__; importing them from the package first would load them twice (runpy
# warns), and the executor needs neither torch nor transformers, so it should not pay for their import.
_LAZY = {
    **dict.fromkeys(
        ["classify_failure", "compare_runs", "degeneration_reason", "format_comparison", "is_degenerate"],
        "ida_eval.analysis",
    ),
    **dict.fromkeys(["FAILURE_CLASSES", "FAILURE_TABLE", "RESULT_KINDS", "ResultKind"], "ida_eval.failures"),
    **dict.fromkeys(["STOP_STRINGS", "DecodingConfig", "Generation"], "ida_eval.decoding"),
    **dict.fromkeys(["generate_completions", "truncate_completion"], "ida_eval.generate"),
    **dict.fromkeys(["ExecutionConfig", "execute_samples", "isolation_in_force", "load_problems"], "ida_eval.execute"),
    **dict.fromkeys(["CheckpointLoadError", "describe_checkpoint", "load_model"], "ida_eval.loader"),
    **dict.fromkeys(["evaluate_checkpoint", "evaluate_model"], "ida_eval.harness"),
    **dict.fromkeys(
        ["mcnemar_exact", "mean_pass_at_k", "paired_permutation_test", "pass_at_k", "wilson_interval"], "ida_eval.stats"
    ),
    "find_problems_file": "ida_eval.problems",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "CheckpointLoadError",
    "DecodingConfig",
    "ExecutionConfig",
    "FAILURE_CLASSES",
    "FAILURE_TABLE",
    "Generation",
    "RESULT_KINDS",
    "ResultKind",
    "STOP_STRINGS",
    "classify_failure",
    "compare_runs",
    "degeneration_reason",
    "describe_checkpoint",
    "evaluate_checkpoint",
    "evaluate_model",
    "execute_samples",
    "find_problems_file",
    "format_comparison",
    "generate_completions",
    "is_degenerate",
    "isolation_in_force",
    "load_model",
    "load_problems",
    "mcnemar_exact",
    "mean_pass_at_k",
    "paired_permutation_test",
    "pass_at_k",
    "truncate_completion",
    "wilson_interval",
]
