"""JSON Lines files of the harness: problems, samples and results, read with errors that name file:line.

Samples and results files are append-only logs written while work runs, so a crash can leave the last
line without its newline. :func:`repair_torn_tail` settles that before anything is appended again: a
complete record gets its newline back, a partial one is cut off with a warning (the task it belonged to
is simply not done yet, and the rerun does it). Every other malformed line is an error: a results file
is evidence, and guessing around damage in the middle of it would hide a real problem.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["iter_jsonl", "repair_torn_tail"]


def iter_jsonl(
    lines: Iterable[str | bytes], path: str | Path, error: type[Exception], *, what: str = "line"
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Yield ``(lineno, "file:line", object)`` for every non-blank line; each must be a JSON object.

    Args:
        lines: the file's lines (a text file object, or ``bytes.splitlines()``).
        path: the file, for messages.
        error: the exception type raised (the caller's own ``ValueError`` subclass).
        what: how a bad line is described: ``"not valid JSON"`` reads ``"malformed results line"`` when
            ``what="results line"``.

    Raises:
        error: a line that is not JSON, or not a JSON object, naming the file and line.
    """
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
            detail = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
            reason = "not valid JSON" if what == "line" else f"malformed {what}"
            raise error(f"{where}: {reason} ({detail})") from None
        if not isinstance(obj, dict):
            raise error(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, where, obj


def repair_torn_tail(path: Path) -> bytes:
    """Make an append-only JSONL file line-aligned again after a crash; return its (repaired) bytes.

    A last line without a newline that still parses as JSON is kept and terminated; one that does not is
    truncated away with a :class:`RuntimeWarning`. Returns ``b""`` for a missing file.
    """
    if not path.exists():
        return b""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    tail = data[end:]
    if not tail.strip():
        return data
    try:
        json.loads(tail)
        intact = True
    except ValueError:
        intact = False
    with open(path, "r+b") as f:
        if intact:  # a whole record without its newline: add it so appends start a new line
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
            data += b"\n"
        else:
            warnings.warn(f"{path}: dropping an incomplete last line (interrupted write)", RuntimeWarning, stacklevel=3)
            f.truncate(end)
            data = data[:end]
        f.flush()
        os.fsync(f.fileno())
    return data
