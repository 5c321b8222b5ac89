"""MBXP evaluation: load MXFP8 checkpoints into transformers, generate, execute in a sandbox, score.

Modules: :mod:`ida_eval.loader` (``load_model``: meta-device build, streamed MXFP8 decode, transpose,
strict keys), :mod:`ida_eval.generate` (batched greedy generation, stop strings, truncation),
:mod:`ida_eval.analysis` (failure classes, degenerate-output detection, run comparison),
:mod:`ida_eval.execute` (the sandboxed executor) and :mod:`ida_eval.mbxp` (the harness and its CLI
``python -m ida_eval.mbxp``).

Example:
    >>> from ida_eval import load_model, is_degenerate
    >>> is_degenerate("\\t\\t\\t\\t" * 20)
    'whitespace flood (80 chars)'
"""

from typing import Any

from ida_eval.analysis import FAILURE_CLASSES, classify_failure, compare_runs, format_comparison, is_degenerate
from ida_eval.generate import STOP_STRINGS, DecodingConfig, Generation, generate_completions, truncate_completion
from ida_eval.execute import ExecutionConfig, execute_samples, isolation_in_force, load_problems
from ida_eval.loader import CheckpointLoadError, describe_checkpoint, load_model
from ida_eval.problems import find_problems_file

_LAZY = {"evaluate_checkpoint": "ida_eval.mbxp", "evaluate_model": "ida_eval.mbxp"}


def __getattr__(name: str) -> Any:
    # ida_eval.mbxp is imported on first use, not here: ``python -m ida_eval.mbxp`` runs that module as
    # __main__, and importing it from the package first would load it twice (runpy warns about that).
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ida_eval' has no attribute {name!r}")


__all__ = [
    "CheckpointLoadError",
    "DecodingConfig",
    "ExecutionConfig",
    "FAILURE_CLASSES",
    "Generation",
    "STOP_STRINGS",
    "classify_failure",
    "compare_runs",
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
    "truncate_completion",
]
