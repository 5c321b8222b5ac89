"""The sandbox's vocabulary: limits, results, jobs, errors, isolation levels; no processes are started here.

What a caller hands to :func:`ida_eval.sandbox.run_program` and gets back, in one small module that both
the runner (:mod:`ida_eval.sandbox`) and the isolation probe (:mod:`ida_eval.isolation`, which runs a
probe program through the runner) import:

* :class:`SandboxLimits` (per-program resource limits), :class:`ProgramJob` (a program in another
  language: files, compile step, run command) and :class:`SandboxResult` (what happened);
* :class:`Isolation` (how programs are isolated on this machine) and :data:`ISOLATION_LEVELS`;
* :class:`SandboxError` / :class:`Cancelled`, and :func:`check_seconds`, the one rule for a time limit.

Example:
    >>> SandboxLimits(timeout=5.0).memory_bytes == 4 * GiB
    True
    >>> check_seconds(float("inf"), "timeout")
    Traceback (most recent call last):
    ...
    ValueError: timeout must be a number of seconds > 0 and <= 604800 (a week), got inf
"""

from __future__ import annotations

import dataclasses
import marshal
import math
import os

__all__ = [
    "COMPILE_LOG",
    "COMPILE_OUTPUT_BYTES",
    "DEFAULT_LIMITS",
    "Cancelled",
    "GiB",
    "ISOLATION_LEVELS",
    "Isolation",
    "KiB",
    "MAX_TIMEOUT_S",
    "MiB",
    "ProgramJob",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "check_seconds",
]

GiB = 1 << 30  # bytes
MiB = 1 << 20  # bytes
KiB = 1 << 10  # bytes

MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: the largest time limit accepted (CPU rlimits and deadlines stay finite)


def check_seconds(value: object, what: str) -> float:
    """A time limit: a finite number of seconds in ``(0, MAX_TIMEOUT_S]``, as float; else ValueError naming ``what``.

    ``inf`` or ``1e300`` would reach the CPU rlimit (``int(timeout) + 1``) and the supervisor's deadline;
    they are refused here, where the limit is given, in one line.
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and 0 < value <= MAX_TIMEOUT_S):  # type: ignore[operator]
        raise ValueError(f"{what} must be a number of seconds > 0 and <= {MAX_TIMEOUT_S:g} (a week), got {value!r}")
    return float(value)  # type: ignore[arg-type]


COMPILE_LOG = "ida-compile.log"  # a ProgramJob's compiler output, in its work directory
COMPILE_OUTPUT_BYTES = 2 * KiB  # bytes of it kept in SandboxResult.compile_output


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a failure of the program under test)."""


class Cancelled(SandboxError):
    """The run was cancelled through its ``cancel`` event (its process tree has been killed)."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Per-program resource limits.

    Attributes:
        timeout: wall-clock seconds before the whole process tree is killed.
        memory_bytes: ``RLIMIT_AS`` per process (address space; 4 GiB default) and, where
            available, the memory cgroup limit of the whole tree.
        max_processes: processes of the whole tree (pids cgroup where available) and
            ``RLIMIT_NPROC`` (enforced for the per-worker uid; the kernel exempts uid 0).
        open_files: ``RLIMIT_NOFILE``.
        file_size_bytes: ``RLIMIT_FSIZE``: largest file the program may write.
        disk_bytes: everything the program may write together (work directory, ``/tmp``,
            ``/var/tmp``, ``/dev/shm``): the size of its private tmpfs (namespaces only; its
            pages also count against the memory cgroup). A write past it fails with ``ENOSPC``.
        max_output_bytes: stdout + stderr bytes after which the program is killed.
        tail_bytes: bytes of stdout and of stderr kept for the result record.
        hash_seed: ``PYTHONHASHSEED`` (None: run a literal ``python -I`` with a random seed).
        site_packages: import ``site`` (site-packages visible); off: standard library only.
    """

    timeout: float = 30.0
    memory_bytes: int = 4 * GiB
    max_processes: int = 64
    open_files: int = 256
    file_size_bytes: int = 64 * MiB
    disk_bytes: int = 256 * MiB
    max_output_bytes: int = 16 * MiB
    tail_bytes: int = 4 * KiB
    hash_seed: int | None = 0
    site_packages: bool = False

    def __post_init__(self) -> None:
        check_seconds(self.timeout, "timeout")
        minimums = {
            "memory_bytes": 64 * MiB,
            "max_processes": 1,
            "open_files": 16,
            "file_size_bytes": 0,
            "disk_bytes": 1 * MiB,
            "max_output_bytes": 1,
            "tail_bytes": 0,
        }
        for name, low in minimums.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if self.hash_seed is not None and not (0 <= self.hash_seed <= 4294967295):
            raise ValueError(f"hash_seed must be None or in [0, 2**32-1], got {self.hash_seed!r}")


DEFAULT_LIMITS = SandboxLimits()  # frozen: one shared instance is the default everywhere


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What happened to one program."""

    finished: bool  # the sentinel arrived: the program's top level (and check(...)) returned
    exit_status: int | None  # exit code; negative = killed by that signal; None = unknown (timeout)
    timed_out: bool
    output_exceeded: bool
    stdout_tail: str
    stderr_tail: str
    output_bytes: int  # stdout + stderr bytes the program wrote
    elapsed_s: float
    oom_killed: bool = False  # the tree's cgroup memory limit was hit and the kernel killed a process
    disk_full: bool = False  # the program filled its disk cap (``disk_bytes``; namespaces only)
    # a ProgramJob's compile step (None / False / "" / 0.0 when there was none or it did not end)
    compile_status: int | None = None  # the compiler's exit code (negative: killed by that signal)
    compile_ok: bool | None = None  # the status is one of the job's compile_ok (and its output exists)
    compile_timed_out: bool = False
    compile_output: str = ""  # the first bytes of the compiler's stdout + stderr
    compile_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.finished and self.exit_status == 0 and not self.timed_out and not self.output_exceeded


@dataclasses.dataclass(frozen=True)
class ProgramJob:
    """A program in another language than Python: files, an optional compile step, a run command.

    The files are written into the work directory, the compile command (if any) runs there with its
    own wall-clock limit (``compile_timeout``; the run's ``limits.timeout`` starts when it is done),
    output to a log; a compile exit status outside ``compile_ok`` ends the job, and the log's first
    ``COMPILE_OUTPUT_BYTES`` come back on stderr and as ``compile_output``. The run command then replaces the bootstrap's
    child (same rlimits, uid, namespaces) with the nonce on its stdin: the job's test driver reads it
    before any program code runs and proves it ran to its end by writing it to stdout as its last
    act, so ``finished`` means the nonce arrived on stdout. Commands are argv lists resolved through the sandbox's ``PATH``; ``{work}``
    in ``env`` values is replaced by the work directory. ``read_only`` names host directories the commands
    read (C++'s precompiled header, :mod:`ida_eval.precompiled`) that must stay visible where the sandbox hides
    their parent (home, the temp dirs): they are mounted back read-only. Per-language rules live in
    :mod:`ida_eval.languages`.
    """

    files: tuple[tuple[str, str], ...]  # (file name, text) written into the work dir
    run: tuple[str, ...]
    compile: tuple[str, ...] | None = None
    compile_timeout: float = 0.0
    compile_ok: tuple[int, ...] = (0,)
    compile_output_file: str | None = None  # the compile step must have produced this file
    env: tuple[tuple[str, str], ...] = ()
    read_only: tuple[str, ...] = ()  # absolute host directories the commands read, visible read-only

    def __post_init__(self) -> None:
        if not self.run:
            raise ValueError("a ProgramJob needs a run command")
        for path in self.read_only:
            if not os.path.isabs(path):
                raise ValueError(f"ProgramJob read_only path {path!r} must be absolute")
        for name, _ in self.files:
            if not name or "/" in name or name.startswith(".") or name == COMPILE_LOG:
                raise ValueError(f"ProgramJob file name {name!r} must be a plain name")
        if self.compile is not None:
            check_seconds(self.compile_timeout, "compile_timeout")

    def spec(self) -> str:
        """The job as the bootstrap reads it: one argv string, ``marshal`` data in hex (the
        bootstrap runs under this same interpreter; ``marshal`` is built in, where importing
        ``json`` would cost it ~10 ms of CPU per program)."""
        return marshal.dumps(
            {
                "compile": list(self.compile) if self.compile else None,
                "compile_timeout": self.compile_timeout,
                "compile_ok": list(self.compile_ok),
                "compile_output_file": self.compile_output_file,
                "compile_output_bytes": COMPILE_OUTPUT_BYTES,
                "run": list(self.run),
                "log": COMPILE_LOG,
            }
        ).hex()


ISOLATION_LEVELS = ("namespaces", "setuid", "rlimits")
"""Strongest first. ``auto`` picks the first that works here."""


@dataclasses.dataclass(frozen=True)
class Isolation:
    """How programs are isolated on this machine (the outcome of :func:`ida_eval.isolation.probe_isolation`)."""

    level: str  # one of ISOLATION_LEVELS
    privilege: str  # "setuid" (per-worker uid), "capdrop" (caps dropped, uid kept) or "none"
    unshare: tuple[str, ...]  # command prefix ("" when no namespaces)
    description: str

    @property
    def uses_namespaces(self) -> bool:
        return self.level == "namespaces"
