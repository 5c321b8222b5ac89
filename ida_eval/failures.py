"""One vocabulary for how an executed sample ended: the names every verdict, classifier and summary uses.

Two levels, one enum and one table each, one spelling (``snake_case``) for every name:

* :class:`ResultKind` (rows of :data:`RESULT_KIND_TABLE`) -- how one program ended, decided where the
  executor makes its verdict (:class:`Verdict`) and stored in the result record as ``"kind"``, next to
  mxeval's ``"result"`` text (kept byte for byte for mxeval compatibility: ``"passed"``, ``"timed
  out"``, ``"failed: <reason>"``). Nothing reads the text back to learn the kind.
* :class:`FailureClass` (rows of :data:`FAILURE_TABLE`) -- the *failure class* of a task
  (``ida_eval.analysis.classify_failure``, which reads the kind), in precedence order: a failed sample
  gets the first class that applies. These are the counts in ``summary.json`` and in run comparisons.

The *result class* counted in the executor summary's ``result_classes`` (:func:`result_class`) is the
kind's value, except for :attr:`ResultKind.EXCEPTION`, where it is the exception's type name
(``AssertionError``, ``NameError``: the record's ``"exception"``). A name at both levels means the
same thing (``timeout``, ``wrong_answer``, ``runtime_error``, ``toolchain_missing``). New kinds are
added as members and rows here, and nowhere else.

Records written before the ``"kind"`` field existed (a results file being resumed) are read once, at
the file boundary, by :func:`with_kind`: its :func:`legacy_kind` is the one place that still knows the
result texts' prefixes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "EXCEPTION_LINE",
    "FAILURE_CLASSES",
    "FAILURE_TABLE",
    "FailureClass",
    "FailureKind",
    "RESULT_KINDS",
    "RESULT_KIND_TABLE",
    "ResultKind",
    "Verdict",
    "legacy_kind",
    "record_kind",
    "result_class",
    "with_kind",
]


class ResultKind(str, Enum):
    """How one executed sample ended (the record's ``"kind"``; meanings in :data:`RESULT_KIND_TABLE`).

    Example:
        >>> ResultKind("compile_timeout") is ResultKind.COMPILE_TIMEOUT, str(ResultKind.TIMEOUT)
        (True, 'timeout')
    """

    PASSED = "passed"
    TIMEOUT = "timeout"
    EXCEPTION = "exception"
    OUTPUT_LIMIT = "output_limit"
    KILLED = "killed"
    EARLY_EXIT = "early_exit"
    EXIT_STATUS = "exit_status"
    OTHER = "other"
    COMPILE_ERROR = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TOOLCHAIN_MISSING = "toolchain_missing"
    BAD_INPUT = "bad_input"

    def __str__(self) -> str:
        return self.value


class FailureClass(str, Enum):
    """The failure class of a task (``"passed"`` for none; meanings in :data:`FAILURE_TABLE`)."""

    PASSED = "passed"
    DEGENERATE = "degenerate"
    TIMEOUT = "timeout"
    SYNTAX_ERROR = "syntax_error"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TOOLCHAIN_MISSING = "toolchain_missing"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class FailureKind:
    """One name of the vocabulary and what it means."""

    name: str
    meaning: str


FAILURE_TABLE: tuple[FailureKind, ...] = (
    FailureKind(FailureClass.DEGENERATE.value, "the completion (or raw generation) shows repetition collapse"),
    FailureKind(FailureClass.TIMEOUT.value, "the program (or its compile step) ran past its time limit"),
    FailureKind(
        FailureClass.SYNTAX_ERROR.value,
        "prompt + completion does not parse (SyntaxError, IndentationError, TabError) or compile",
    ),
    FailureKind(FailureClass.WRONG_ANSWER.value, "the program ran and a test assertion failed"),
    FailureKind(FailureClass.RUNTIME_ERROR.value, "anything else: another exception, an early exit, a kill"),
    FailureKind(
        FailureClass.TOOLCHAIN_MISSING.value, "not run: the language's toolchain is not installed (not a model failure)"
    ),
)
FAILURE_CLASSES: tuple[str, ...] = tuple(k.name for k in FAILURE_TABLE)
"""Every failed task gets exactly one of these (in this precedence order)."""

RESULT_KIND_TABLE: tuple[FailureKind, ...] = (
    FailureKind(ResultKind.PASSED.value, "check() returned (result text 'passed')"),
    FailureKind(ResultKind.TIMEOUT.value, "the program ran past its time limit (result text 'timed out', mxeval's)"),
    FailureKind(
        ResultKind.EXCEPTION.value,
        "a Python exception ended the program ('failed: NameError: ...'); its type name, the record's "
        "'exception', is the result class",
    ),
    FailureKind(ResultKind.OUTPUT_LIMIT.value, "the program wrote more than the output limit"),
    FailureKind(ResultKind.KILLED.value, "the program was killed by a signal (e.g. the memory limit)"),
    FailureKind(
        ResultKind.EARLY_EXIT.value, "the program exited with status 0 before check() (or the test driver) finished"
    ),
    FailureKind(ResultKind.EXIT_STATUS.value, "the program exited non-zero without a traceback"),
    FailureKind(ResultKind.OTHER.value, "an old record's failure text none of the legacy rules recognise"),
    # other MBXP languages (ida_eval.languages)
    FailureKind(
        ResultKind.COMPILE_ERROR.value, "the compiler rejected the program (result text 'failed: compile error: ...')"
    ),
    FailureKind(
        ResultKind.COMPILE_TIMEOUT.value, "the compile step ran past its limit (result text 'timed out (compile)')"
    ),
    FailureKind(ResultKind.WRONG_ANSWER.value, "a test check failed (result text 'failed: wrong answer: ...')"),
    FailureKind(
        ResultKind.RUNTIME_ERROR.value, "any other non-zero exit or signal (result text 'failed: runtime error: ...')"
    ),
    FailureKind(
        ResultKind.TOOLCHAIN_MISSING.value,
        "not run: the language's tools are not installed (result text 'toolchain missing: ...')",
    ),
    FailureKind(
        ResultKind.BAD_INPUT.value,
        "not run: unknown language, no test, a test the driver cannot wrap ('failed: bad input: ...')",
    ),
)
RESULT_KINDS: tuple[str, ...] = tuple(k.name for k in RESULT_KIND_TABLE)
"""Every value of a record's ``"kind"`` (result classes add the exception type names)."""

assert RESULT_KINDS == tuple(k.value for k in ResultKind), "RESULT_KIND_TABLE: one row per ResultKind, in order"
assert FAILURE_CLASSES == tuple(c.value for c in FailureClass if c is not FailureClass.PASSED), "FAILURE_TABLE"

EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
"""The last line of a Python traceback: the exception's type name, then ``: message`` if any."""


@dataclass(frozen=True)
class Verdict:
    """How one program ended: its kind, mxeval's result text, and the exception's type name.

    Example:
        >>> v = Verdict(ResultKind.EXCEPTION, "failed: NameError: name 'y' is not defined", "NameError")
        >>> v.passed, v.fields()["kind"], result_class(v.fields())
        (False, 'exception', 'NameError')
    """

    kind: ResultKind
    text: str
    exception: str | None = None

    @property
    def passed(self) -> bool:
        return self.kind is ResultKind.PASSED

    def fields(self) -> dict[str, Any]:
        """The record fields this verdict decides: ``passed``, ``result``, ``kind`` and ``exception``."""
        return {"passed": self.passed, "result": self.text, "kind": self.kind.value, "exception": self.exception}


def record_kind(record: Mapping[str, Any]) -> ResultKind:
    """The :class:`ResultKind` of a result record (its ``"kind"``).

    Raises:
        ValueError: the record has no ``"kind"`` (one written before the field existed: read it through
            :func:`with_kind`), or an unknown one.
    """
    value = record.get("kind")
    if value is None:
        raise ValueError(
            f"result record {record.get('task_id', '?')!r} has no 'kind' (written before typed verdicts): "
            "read it through ida_eval.failures.with_kind"
        )
    try:
        return ResultKind(value)
    except ValueError:
        raise ValueError(
            f"result record {record.get('task_id', '?')!r}: unknown kind {value!r} (known: {', '.join(RESULT_KINDS)})"
        ) from None


def result_class(record: Mapping[str, Any]) -> str:
    """The result class of a record, for counting: its kind's value, or for
    :attr:`ResultKind.EXCEPTION` the exception's type name (``"AssertionError"``).

    Example:
        >>> result_class({"kind": "early_exit", "exception": None})
        'early_exit'
        >>> result_class({"kind": "exception", "exception": "AssertionError"})
        'AssertionError'
    """
    kind = record_kind(record)
    if kind is ResultKind.EXCEPTION:
        return str(record.get("exception") or ResultKind.OTHER.value)
    return kind.value


# ---------------------------------------------------------------------------------------------
# Records written before the "kind" field: the one legacy parser

_LEGACY_FIXED = {
    "passed": ResultKind.PASSED,
    "timed out": ResultKind.TIMEOUT,
    "timed out (compile)": ResultKind.COMPILE_TIMEOUT,
}
_LEGACY_REASONS = (  # "failed: <reason>" of the old executor, first match wins
    ("compile error:", ResultKind.COMPILE_ERROR),
    ("wrong answer:", ResultKind.WRONG_ANSWER),
    ("runtime error:", ResultKind.RUNTIME_ERROR),
    ("bad input:", ResultKind.BAD_INPUT),
    ("output limit", ResultKind.OUTPUT_LIMIT),
    ("killed by", ResultKind.KILLED),
    ("exited with status 0", ResultKind.EARLY_EXIT),
    ("exit status", ResultKind.EXIT_STATUS),
)


def legacy_kind(result: str) -> tuple[ResultKind, str | None]:
    """The kind (and exception type name) of a result text written before records carried ``"kind"``.

    The executor's result texts up to then, read by their prefixes: ``passed``, ``timed out``, ``timed
    out (compile)``, ``toolchain missing: ...``, ``failed: compile error|wrong answer|runtime error|bad
    input: ...``, ``failed: output limit ...``, ``failed: killed by ...``, ``failed: exited with status
    0 ...``, ``failed: exit status ...``, ``failed: <Exception>[: message]``; anything else is
    :attr:`ResultKind.OTHER`. This is the only code that reads a result text; records written since
    carry their kind, decided with the verdict.

    Example:
        >>> legacy_kind("failed: NameError: name 'y' is not defined")
        (<ResultKind.EXCEPTION: 'exception'>, 'NameError')
        >>> legacy_kind("timed out (compile)")[0], legacy_kind("failed: wrong answer: test case 1")[0]
        (<ResultKind.COMPILE_TIMEOUT: 'compile_timeout'>, <ResultKind.WRONG_ANSWER: 'wrong_answer'>)
    """
    if result in _LEGACY_FIXED:
        return _LEGACY_FIXED[result], None
    if result.startswith("toolchain missing"):
        return ResultKind.TOOLCHAIN_MISSING, None
    reason = result.removeprefix("failed: ")
    for prefix, kind in _LEGACY_REASONS:
        if reason.startswith(prefix):
            return kind, None
    m = EXCEPTION_LINE.match(reason.split("\n", 1)[0])
    return (ResultKind.EXCEPTION, m.group(1)) if m else (ResultKind.OTHER, None)


def with_kind(record: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a result record read from a file, with its ``"kind"``: a record that has one is checked
    (:func:`record_kind`), one written before the field existed gets :func:`legacy_kind`'s of its
    ``"result"`` text (and, for an exception, ``"exception"`` when it lacked one).

    Raises:
        ValueError: an unknown ``"kind"``, or no ``"result"`` text to read one from.

    Example:
        >>> with_kind({"task_id": "MBPP/2", "passed": False, "result": "failed: AssertionError"})["kind"]
        'exception'
    """
    out = dict(record)
    if out.get("kind") is not None:
        record_kind(out)
        return out
    if not isinstance(out.get("result"), str):
        raise ValueError(f"result record {out.get('task_id', '?')!r} has neither 'kind' nor a 'result' text")
    kind, exception = legacy_kind(out["result"])
    out["kind"] = kind.value
    if exception is not None and out.get("exception") is None:
        out["exception"] = exception
    return out
