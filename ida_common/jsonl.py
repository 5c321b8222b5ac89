"""JSON Lines files: read with errors that name file:line, and torn-tail repair of append-only logs.

One implementation for every JSONL file of the project: ``ida_eval``'s problems, samples and results
files and ``ida_trainer``'s data files and ``train_log.jsonl``.

Append-only logs (samples, results, the trainer's step log) are written while work runs, so a crash can
leave the last line without its newline. :func:`repair_torn_tail` settles that before anything is appended again: a
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

__all__ = [
    "MAX_JSON_DEPTH_MESSAGE",
    "decode_error_text",
    "dumps_utf8",
    "iter_jsonl",
    "json_error_text",
    "repair_torn_tail",
]

MAX_JSON_DEPTH_MESSAGE = "nested too deeply to parse (more levels of [ or { than the JSON reader allows)"


def dumps_utf8(obj: Any, **kwargs: Any) -> str:
    r"""``json.dumps`` for a UTF-8 file: non-ASCII text kept as is, unless a string holds a lone surrogate.

    ``"\udcff"`` is valid JSON and decodes to a str with a lone surrogate, which has no UTF-8 form: written
    with ``ensure_ascii=False`` it fails at the write (and a results file's writer died on it, on every
    resume). Such an object is written with ``\uXXXX`` escapes instead; ``json.loads`` gives the same
    strings back, so nothing is lost.

    Example:
        >>> dumps_utf8({"c": "é"}), dumps_utf8({"c": "\udcff"})
        ('{"c": "é"}', '{"c": "\\udcff"}')
        >>> json.loads(dumps_utf8({"c": "\udcff"}))["c"] == "\udcff"
        True
    """
    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, **kwargs)
    return text


def json_error_text(err: json.JSONDecodeError) -> str:
    """``Expecting ',' delimiter at column 25`` (json's own message plus where; never "at at").

    Some of json's messages end in "at" already ("Unterminated string starting at").

    Example:
        >>> try:
        ...     json.loads('{"a": "x')
        ... except json.JSONDecodeError as e:
        ...     json_error_text(e)
        'Unterminated string starting at column 7'
    """
    msg = err.msg[:-3] if err.msg.endswith(" at") else err.msg
    return f"{msg} at column {err.colno}"


def decode_error_text(err: UnicodeDecodeError) -> str:
    """``invalid UTF-8 (byte 0xff at column 407)``: the bad byte and its 1-based byte column in the line."""
    bad = err.object[err.start : err.start + 1].hex()
    return f"invalid UTF-8 (byte 0x{bad} at byte column {err.start + 1})"


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
        reason = "not valid JSON" if what == "line" else f"malformed {what}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{where}: {reason} ({json_error_text(e)})") from None
        except UnicodeDecodeError as e:
            raise error(f"{where}: {reason} ({decode_error_text(e)})") from None
        except RecursionError:
            raise error(f"{where}: {reason} ({MAX_JSON_DEPTH_MESSAGE})") from None
        if not isinstance(obj, dict):
            raise error(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, where, obj


def repair_torn_tail(path: str | Path) -> bytes:
    """Make an append-only JSONL file line-aligned again after a crash; return its (repaired) bytes.

    A last line without a newline that still parses as JSON is kept and terminated; one that does not is
    truncated away with a :class:`RuntimeWarning`. Returns ``b""`` for a missing file.
    """
    path = Path(path)
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
