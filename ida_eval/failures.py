"""One vocabulary for how an executed sample ended: the names every classifier and summary uses.

Two levels, one table each, one spelling (``snake_case``) for every name:

* :data:`FAILURE_TABLE` -- the *failure class* of a task (``ida_eval.analysis.classify_failure``),
  in precedence order: a failed sample gets the first class that applies. These are the counts in
  ``summary.json`` and in run comparisons.
* :data:`RESULT_KIND_TABLE` -- the executor's finer *result kind* of one mxeval result text
  (``ida_eval.execute.result_class``), counted in the executor summary's ``result_classes``. An
  exception's type name (``AssertionError``, ``NameError``) is also a result kind.

A name that appears at both levels means the same thing (``timeout``). mxeval's own result text
stays ``"timed out"`` (:data:`MXEVAL_TIMED_OUT`) in results files for compatibility; it is the
record's text, not a class name. New kinds (compile errors, missing toolchains, per-phase timeouts
for other MBXP languages) are added as rows here, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BAD_INPUT",
    "COMPILE_ERROR",
    "COMPILE_TIMEOUT",
    "COMPILE_TIMED_OUT_TEXT",
    "DEGENERATE",
    "EARLY_EXIT",
    "EXIT_STATUS",
    "FAILURE_CLASSES",
    "FAILURE_TABLE",
    "FailureKind",
    "KILLED",
    "MXEVAL_TIMED_OUT",
    "OTHER",
    "OUTPUT_LIMIT",
    "PASSED",
    "RESULT_KINDS",
    "RESULT_KIND_TABLE",
    "RUNTIME_ERROR",
    "SYNTAX_ERROR",
    "TIMEOUT",
    "TOOLCHAIN_MISSING",
    "TOOLCHAIN_MISSING_TEXT",
    "WRONG_ANSWER",
]


@dataclass(frozen=True)
class FailureKind:
    """One name of the vocabulary and what it means."""

    name: str
    meaning: str


PASSED = "passed"  # not a failure; the first key of every count
MXEVAL_TIMED_OUT = "timed out"  # mxeval's result text for a timeout (results files keep it)
COMPILE_TIMED_OUT_TEXT = "timed out (compile)"  # result text of a compile step past its limit
TOOLCHAIN_MISSING_TEXT = "toolchain missing"  # result text prefix: the language's tools are not installed

DEGENERATE = "degenerate"
TIMEOUT = "timeout"
SYNTAX_ERROR = "syntax_error"
WRONG_ANSWER = "wrong_answer"
RUNTIME_ERROR = "runtime_error"
TOOLCHAIN_MISSING = "toolchain_missing"

FAILURE_TABLE: tuple[FailureKind, ...] = (
    FailureKind(DEGENERATE, "the completion (or raw generation) shows repetition collapse"),
    FailureKind(TIMEOUT, "the program ran past its time limit"),
    FailureKind(SYNTAX_ERROR, "prompt + completion does not parse (SyntaxError, IndentationError, TabError)"),
    FailureKind(WRONG_ANSWER, "the program ran and a test assertion failed"),
    FailureKind(RUNTIME_ERROR, "anything else: another exception, an early exit, a kill"),
    FailureKind(TOOLCHAIN_MISSING, "not run: the language's toolchain is not installed (not a model failure)"),
)
FAILURE_CLASSES: tuple[str, ...] = tuple(k.name for k in FAILURE_TABLE)
"""Every failed task gets exactly one of these (in this precedence order)."""

OUTPUT_LIMIT = "output_limit"
KILLED = "killed"
EARLY_EXIT = "early_exit"
EXIT_STATUS = "exit_status"
OTHER = "other"
COMPILE_ERROR = "compile_error"
COMPILE_TIMEOUT = "compile_timeout"
BAD_INPUT = "bad_input"

RESULT_KIND_TABLE: tuple[FailureKind, ...] = (
    FailureKind(PASSED, "check() returned"),
    FailureKind(TIMEOUT, "the program ran past its time limit (result text 'timed out')"),
    FailureKind(OUTPUT_LIMIT, "the program wrote more than the output limit"),
    FailureKind(KILLED, "the program was killed by a signal (e.g. the memory limit)"),
    FailureKind(EARLY_EXIT, "the program exited with status 0 before check() returned"),
    FailureKind(EXIT_STATUS, "the program exited non-zero without a traceback"),
    FailureKind(OTHER, "a failure text none of the rules recognise"),
    # other MBXP languages (ida_eval.languages)
    FailureKind(COMPILE_ERROR, "the compiler rejected the program (result text 'failed: compile error: ...')"),
    FailureKind(COMPILE_TIMEOUT, "the compile step ran past its limit (result text 'timed out (compile)')"),
    FailureKind(WRONG_ANSWER, "a test check failed (result text 'failed: wrong answer: ...')"),
    FailureKind(RUNTIME_ERROR, "any other non-zero exit or signal (result text 'failed: runtime error: ...')"),
    FailureKind(TOOLCHAIN_MISSING, "not run: the language's tools are not installed (result text 'toolchain missing: ...')"),
    FailureKind(BAD_INPUT, "not run: unknown language, no test, a test the driver cannot wrap ('failed: bad input: ...')"),
)
RESULT_KINDS: tuple[str, ...] = tuple(k.name for k in RESULT_KIND_TABLE)
"""Executor result kinds besides exception type names."""
