"""One command-line convention for every ida entry point: the error line, the exit codes, Ctrl-C.

Every ``python -m ...`` command of the project (``mxfp8_codec``, ``nvfp4_cuda``, ``ida_trainer``,
``ida_trainer.memory``, ``ida_eval.mbxp``, ``ida_eval.execute``, ``ida_eval.toolchains``) has a
``main(argv) -> int`` that hands its work to :func:`run_main`. That one wrapper decides how a run ends:

* **A user error** (a bad argument, setting, file, tensor or line; an output that cannot be
  written) ends with ONE line on stderr, ``PROG: error: WHAT: what is wrong``, where WHAT names the
  file / tensor / task / setting, and exit status 2. ``ValueError`` (and its subclasses: the
  codec's ``MXFP8Error``, the trainer's ``DataError``, ...) and ``OSError`` are user errors; an
  ``OSError`` that carries a file name prints as ``FILE: strerror`` rather than ``[Errno 2] ...``.
* **The checked thing failed** (``verify`` found an invalid file, training diverged to a
  non-finite loss, the codec demo did not round-trip): one line, exit status 1 (raise
  :class:`CheckFailed`, or map your own type with ``codes=``).
* **This machine cannot do it** (no usable sandbox, no compiler, no GPU or driver, out of memory or
  disk): one line, exit status 3 (raise :class:`CannotRunHere`, or map your own type).
* **Ctrl-C** ends with one line ``PROG: interrupted; <what was kept and how to resume>`` (the
  command sets :attr:`Run.kept` as soon as there is something to resume) and exit status 130.
* **Anything else is a bug**: one line ``PROG: internal error: Type: message (a bug: rerun with
  --debug ... for the traceback)`` and exit status 70 (``EX_SOFTWARE`` of sysexits.h).

No traceback is ever printed unless ``--debug`` is on the command line or ``IDA_DEBUG=1`` is set;
then every exception (Ctrl-C included) propagates with its full traceback.

Exit statuses (:data:`EXIT_CODES`, also in docs/cli.md; argparse's own usage errors are 2 as well):

=====  ====================================================================================
0      success
1      the checked thing failed (verify mismatch, non-finite loss, demo round-trip mismatch)
2      bad input or usage (argument, setting, file, tensor, line; output not writable)
3      this machine cannot do it (no sandbox, compiler, GPU/driver; out of memory or disk)
70     internal error: a bug in ida (``--debug`` / ``IDA_DEBUG=1`` shows the traceback)
130    interrupted (Ctrl-C); the line says what was kept and how to resume
=====  ====================================================================================

Warnings raised while a command runs (``warnings.warn``) print in the same voice, one line
``PROG: warning: message``, without Python's source-line echo.

Under ``torchrun`` every rank runs the same checks and fails the same way; only rank 0 (``RANK``
unset or ``0``) prints the line, the other ranks exit with the same status silently. What torchrun
itself prints afterwards (its ``ChildFailedError`` summary) is the launcher's and is documented in
docs/cli.md.

Checks before work: :func:`check_output_dir`, :func:`check_output_file` and :func:`check_input_file` are
the pre-flight checks
every command runs on its paths before it loads a model or creates a directory.

Example:
    >>> def body(run: Run) -> int:
    ...     raise ValueError("data.jsonl:3: not JSON")
    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     status = run_main("demo_prog", body, [])
    >>> status, err.getvalue()
    (2, 'demo_prog: error: data.jsonl:3: not JSON\\n')
"""

from __future__ import annotations

import argparse
import errno
import functools
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

from ida_common.files import nearest_existing

__all__ = [
    "DEBUG_ENV",
    "EXIT_CANNOT_RUN",
    "EXIT_CODES",
    "EXIT_FAILED",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "ArgumentParser",
    "CannotRunHere",
    "CheckFailed",
    "Run",
    "check_input_file",
    "check_output_dir",
    "check_output_file",
    "debug_requested",
    "describe",
    "exit_code",
    "is_out_of_memory",
    "is_rank0",
    "run_main",
]

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and the thing it checks failed
EXIT_USAGE = 2  # bad input or usage (same as argparse's own errors)
EXIT_CANNOT_RUN = 3  # this machine cannot do it
EXIT_INTERNAL = 70  # a bug (sysexits.h EX_SOFTWARE)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, what shells report)

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_FAILED: "the checked thing failed (verify mismatch, non-finite loss, demo round-trip mismatch)",
    EXIT_USAGE: "bad input or usage (argument, setting, file, tensor, line; output not writable)",
    EXIT_CANNOT_RUN: "this machine cannot do it (no sandbox, compiler, GPU/driver; out of memory or disk)",
    EXIT_INTERNAL: "internal error: a bug in ida (--debug or IDA_DEBUG=1 shows the traceback)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); the line says what was kept and how to resume",
}

DEBUG_ENV = "IDA_DEBUG"
DEBUG_FLAG = "--debug"
DEBUG_HELP = f"show full tracebacks instead of one-line errors (also {DEBUG_ENV}=1)"

_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM})


class CheckFailed(Exception):
    """The command ran and what it checks failed (exit status 1); the message is the line."""


class CannotRunHere(Exception):
    """This machine cannot do what was asked: no sandbox, compiler, GPU or driver (exit status 3)."""


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """True when ``--debug`` is among the options of ``argv`` (before ``--``) or ``IDA_DEBUG`` is set
    to anything but ``""``/``0``."""
    if os.environ.get(DEBUG_ENV, "").strip() not in ("", "0"):
        return True
    for a in argv or ():
        if a == "--":
            break
        if a == DEBUG_FLAG:
            return True
    return False


def _strip_debug(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    for i, a in enumerate(argv):
        if a == "--":
            return out + list(argv[i:])
        if a != DEBUG_FLAG:
            out.append(a)
    return out


def is_rank0() -> bool:
    """True unless this process is a non-zero rank of a ``torchrun`` / torch.distributed launch."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


def describe(exc: BaseException) -> str:
    """The one-line text of an exception: ``FILE: strerror`` for an ``OSError`` with a file name,
    else ``str(exc)`` with its lines joined by ``"; "`` (the class name when the message is empty).

    Example:
        >>> describe(FileNotFoundError(2, "No such file or directory", "/x/data.jsonl"))
        '/x/data.jsonl: No such file or directory'
        >>> describe(ValueError("first\\n  second"))
        'first; second'
    """
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        where = os.fsdecode(exc.filename)
        if exc.filename2 is not None:
            where += f" -> {os.fsdecode(exc.filename2)}"
        return f"{where}: {exc.strerror}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        text = repr(exc.args[0])
    return text or type(exc).__name__


def error_line(exc: BaseException, limit: int = 300) -> str:
    """``ClassName: describe(exc)``, at most ``limit`` characters: a failure recorded beside other results (a
    benchmark row, a warning), where what kind of error it was matters as much as its text.

    Example:
        >>> error_line(KeyError("tokens_per_s"))
        "KeyError: 'tokens_per_s'"
    """
    return f"{type(exc).__name__}: {describe(exc)}"[:limit]


def is_out_of_memory(exc: BaseException) -> bool:
    """Python's ``MemoryError``, torch's ``OutOfMemoryError`` (a ``RuntimeError``: CUDA and other devices) or
    torch's CPU allocator failing (a plain ``RuntimeError`` naming ``DefaultCPUAllocator``); torch is not
    imported for this."""
    if isinstance(exc, MemoryError):
        return True
    if any(c.__name__ == "OutOfMemoryError" and c.__module__.split(".")[0] == "torch" for c in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc)


def exit_code(exc: BaseException, codes: Mapping[type[BaseException], int] | None = None) -> int:
    """The exit status :func:`run_main` gives ``exc`` (see the table in the module docstring).

    ``codes`` maps a command's own exception types to statuses; it is consulted first (most derived
    class wins through the MRO).
    """
    for cls in type(exc).__mro__:
        if codes and cls in codes:
            return codes[cls]
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, CheckFailed):
        return EXIT_FAILED
    if isinstance(exc, CannotRunHere) or is_out_of_memory(exc):
        return EXIT_CANNOT_RUN
    if isinstance(exc, OSError) and exc.errno in _NO_ROOM:
        return EXIT_CANNOT_RUN
    if isinstance(exc, (ValueError, OSError)):
        return EXIT_USAGE
    return EXIT_INTERNAL


@dataclass
class Run:
    """What the command body of :func:`run_main` gets: its arguments and the run's voice.

    Attributes:
        prog: the short program name used in every line (``mxfp8_codec``, ``ida_eval.mbxp``).
        argv: the arguments, ``--debug`` removed.
        debug: tracebacks wanted (``--debug`` or ``IDA_DEBUG=1``).
        kept: what an interruption keeps and how to resume (``"finished results are kept in r.jsonl:
            rerun the same command to resume"``); set it as soon as there is something to resume. A
            callable is asked at the moment of the interruption (it may look at what is on disk).
            ``None``: the Ctrl-C line says only ``interrupted``.
    """

    prog: str
    argv: list[str]
    debug: bool = False
    kept: str | Callable[[], str | None] | None = None

    def warn(self, message: str) -> None:
        """Print ``PROG: warning: message`` once (rank 0)."""
        _print(f"{self.prog}: warning: {message}")

    def error(self, message: str) -> None:
        """Print ``PROG: error: message`` once (rank 0), for a command that returns its status itself."""
        _print(f"{self.prog}: error: {message}")


def _print(line: str, stream: TextIO | None = None) -> None:
    if not is_rank0():
        return
    stream = stream if stream is not None else sys.stderr
    try:
        print(line, file=stream, flush=True)
    except (OSError, ValueError):  # stderr closed or broken: nothing left to tell
        pass


def _line(prog: str, exc: BaseException, status: int, kept: str | Callable[[], str | None] | None) -> str:
    if status == EXIT_INTERRUPTED and isinstance(exc, KeyboardInterrupt):
        if callable(kept):
            try:
                kept = kept()
            except Exception:  # noqa: BLE001 - the interruption line must still be printed
                kept = None
        return f"{prog}: interrupted" + (f"; {kept}" if kept else "")
    text = describe(exc)
    if status == EXIT_INTERNAL:
        return (
            f"{prog}: internal error: {type(exc).__name__}: {text} (a bug in ida: rerun with {DEBUG_FLAG} "
            f"or {DEBUG_ENV}=1 for the traceback, and please report it)"
        )
    if is_out_of_memory(exc) and "out of memory" not in text.lower():
        text = f"out of memory{': ' + text if text != 'MemoryError' else ''}"
    return f"{prog}: error: {text}"


def run_main(
    prog: str,
    body: Callable[[Run], int | None],
    argv: Sequence[str] | None = None,
    *,
    codes: Mapping[type[BaseException], int] | None = None,
) -> int:
    """Run a command body under the project's CLI convention and return its exit status.

    Args:
        prog: short program name for every line (``"mxfp8_codec"``).
        body: the command; gets a :class:`Run` (``run.argv`` has ``--debug`` removed) and returns its
            exit status (``None`` counts as 0). It raises to fail.
        argv: the arguments (``None``: ``sys.argv[1:]``).
        codes: the command's own exception types -> exit status (e.g. ``{NonFiniteError: 1}``).

    Returns:
        0 or the status of the table in the module docstring. ``SystemExit`` (argparse's ``--help``
        and usage errors) passes through as the exit status it carries.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    run = Run(prog=prog, argv=_strip_debug(args), debug=debug_requested(args))
    old_showwarning = warnings.showwarning
    if not run.debug:
        warnings.showwarning = _warning_printer(prog)
    try:
        status = body(run)
        return EXIT_OK if status is None else int(status)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        _print(str(e.code))
        return EXIT_USAGE
    except BrokenPipeError:
        # stdout went to a pager or `head` that closed: not an error worth a line
        try:
            sys.stdout = open(os.devnull, "w")  # keeps the interpreter's final flush quiet
        except OSError:
            pass
        return 141
    except BaseException as e:  # this is the one place that turns exceptions into lines
        if run.debug or isinstance(e, GeneratorExit):
            raise
        status = exit_code(e, codes)
        _print(_line(prog, e, status, run.kept))
        return status
    finally:
        warnings.showwarning = old_showwarning


def _warning_printer(prog: str) -> Callable[..., None]:
    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        kind = "" if issubclass(category, UserWarning) and category is UserWarning else f"{category.__name__}: "
        _print(f"{prog}: warning: {kind}{describe(message) if isinstance(message, Warning) else message}", file)

    return show


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` in the project's voice.

    A usage error is one line, ``PROG: error: message (see python -m X --help)``, exit status 2;
    ``--debug`` is listed in ``--help`` (:func:`run_main` removes it from the arguments before parsing,
    so it works before or after a subcommand).

    Args:
        short_prog: the program name of the error line (``mxfp8_codec``); ``prog`` stays the
            runnable ``python -m mxfp8_codec`` shown in usage.
    """

    def __init__(self, *args: Any, short_prog: str | None = None, debug_flag: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.short_prog = short_prog or self.prog
        if debug_flag:
            self.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)

    def add_subparsers(self, **kwargs: Any) -> Any:  # subcommands speak with the same short name
        kwargs.setdefault("parser_class", functools.partial(type(self), short_prog=self.short_prog))
        return super().add_subparsers(**kwargs)

    def error(self, message: str) -> NoReturn:
        _print(f"{self.short_prog}: error: {message} (see {self.prog} --help)")
        raise SystemExit(EXIT_USAGE)


# ----------------------------------------------------------------------------------------------
# checks before work


def check_output_dir(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """Check that ``path`` is or can become a writable directory, creating nothing.

    The nearest existing ancestor must be a directory in which a probe directory can be created (and
    is removed again): this catches read-only mounts, ``/proc``, permissions, a file in the way.

    Raises:
        ValueError: ``WHAT DIR: reason``, naming the path and the blocking ancestor.

    Example:
        >>> check_output_dir("/proc/x")
        Traceback (most recent call last):
        ...
        ValueError: --out /proc/x: cannot create a directory in /proc (No such file or directory)
    """
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{what} {target}: exists and is not a directory")
    base = nearest_existing(target)
    if not base.is_dir():
        raise ValueError(f"{what} {target}: {base} is a file, not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=".ida-write-probe-", dir=base)
    except OSError as e:
        raise ValueError(f"{what} {target}: cannot create a directory in {base} ({e.strerror or e})") from None
    os.rmdir(probe)
    return target


def check_output_file(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """Check that the file ``path`` can be written (its directory is or can become a writable
    directory; ``path`` itself is not a directory), creating nothing.

    Raises:
        ValueError: ``WHAT FILE: reason``.

    Example:
        >>> check_output_file("/proc/x/results.jsonl")
        Traceback (most recent call last):
        ...
        ValueError: --out /proc/x/results.jsonl: cannot create a directory in /proc (No such file or directory)
    """
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{what} {target}: is a directory, expected a file")
    try:
        check_output_dir(target.parent, what)
    except ValueError as e:
        raise ValueError(str(e).replace(f"{what} {target.parent}:", f"{what} {target}:", 1)) from None
    return target


def check_input_file(path: str | os.PathLike[str], what: str) -> Path:
    """Check that ``path`` is an existing, readable regular file.

    Raises:
        ValueError: ``WHAT FILE: no such file`` / ``is a directory`` / ``not readable``.

    Example:
        >>> check_input_file("/nonexistent/data.jsonl", "--data")
        Traceback (most recent call last):
        ...
        ValueError: --data /nonexistent/data.jsonl: no such file
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{what} {p}: no such file")
    if p.is_dir():
        raise ValueError(f"{what} {p}: is a directory, expected a file")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{what} {p}: not readable (permission denied)")
    return p
