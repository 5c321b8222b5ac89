"""Run one untrusted Python program in a throw-away sandbox and say whether it really finished.

Why not mxeval's executor: it ``exec``s the program inside a forked copy of the harness, with a
monkeypatched ``os`` (``reliability_guard``) that ``os.posix_spawn``, ``ctypes`` or ``os.execv``
walk straight past, no memory limit, unbounded in-memory output and no way to reach grandchildren
at the timeout. Here every program gets:

* **A fresh interpreter** (``sys.executable``), started from an empty environment (``PATH``,
  ``LANG``, ``HOME``/``TMPDIR`` = its directory, ``PYTHONHASHSEED=0``) in its own directory.
  By default it runs ``python -s -P -S``: ``-I`` would also imply ``-E``, which ignores
  ``PYTHONHASHSEED`` and makes string-set order differ between runs; since we build the environment
  from scratch, ``-E`` protects nothing and the remaining parts of ``-I`` (``-s -P``) are kept.
  ``-S`` (no ``site``) gives a standard-library-only interpreter, which is all MBXP needs, and
  saves ~40 ms of ``.pth`` processing per program (``hash_seed=None`` gives a literal ``-I``).
* **Kernel isolation** when available (the caller passes what :mod:`ida_eval.isolation` probed):
  ``unshare --net --pid --fork --kill-child --mount`` (plus ``--user --map-root-user`` when not
  root). Inside, a small bootstrap running as PID 1 of the new PID namespace mounts a fresh tmpfs
  of ``disk_bytes`` that holds the work directory and private ``/tmp``, ``/var/tmp`` and
  ``/dev/shm`` (the total disk cap; nothing reaches the host's disk), covers home, the temp root,
  ``/run`` and the host's unix sockets, mounts a fresh ``/proc`` and remounts *every* other mount
  read-only (per-mount flags, so the host is untouched). The program then runs with
  rlimits, ``no_new_privs`` and either a per-worker unprivileged uid (``setuid``: real
  ``RLIMIT_NPROC`` accounting, no permission on other users' files; used when that uid can read
  the interpreter) or uid 0 with every capability dropped (``capdrop``: the read-only mounts and
  namespaces do the containing; the pids cgroup does the process cap). PID 1 also puts the tree
  in fresh cgroups (:mod:`ida_eval.cgroups`: ``pids.max``, memory limit) where writable.
  There is no network (only a down loopback), and when PID 1 exits or is killed the kernel kills
  every process of the namespace, daemonized grandchildren included. In every mode a seccomp
  filter denies new namespaces (no nested user namespace).
* **Job servers** for ProgramJobs (other languages) where the runner is root and has
  namespaces: a per-slot server (``_sandbox_boot.py --serve``, started on the slot's first job,
  stopped by :func:`close_job_servers` or with the runner) forks each job's sandbox instead of
  starting ``unshare`` and a bootstrap interpreter per program; the fork makes the same namespaces
  (``unshare(2)``; the network namespace is the server's own, shared by the slot's runs one after
  another: empty, loopback down) and runs the same bootstrap code as PID 1. It lives in the slot's
  cgroups so each run is born inside them (joining a cgroup v1 group costs a ~10 ms RCU grace
  period per program; see :class:`ida_eval.cgroups.ServerRunCgroups`). ``JOB_SERVER = False``
  turns it off. A Python program runs in a forked child of PID 1; for a job, PID 1 takes on the
  program's uid and limits itself and ``posix_spawn``s the compile and run steps (no copy of the
  interpreter per program; see :func:`ida_eval._sandbox_boot.run_job`).
* **Fallbacks** with a warning: ``setuid`` (root without namespaces: per-worker uid, rlimits, and
  ``kill(-1, SIGKILL)`` issued *as that uid* to reap escaped processes; no network isolation and
  world-writable directories stay writable) and ``rlimits`` (process group kill only).
* **A pass only when ``check(...)`` returned**: the bootstrap reads a random per-run nonce from
  stdin (then replaces stdin with ``/dev/null``), ``exec``s the program and writes the nonce to a
  pipe only after ``exec`` returned. ``sys.exit(0)``, ``os._exit(0)``, ``atexit`` tricks or a
  killed interpreter never produce it. The nonce never appears in the program text, argv or the
  environment (a program that deliberately walks interpreter frames could find it: this guards
  against early exits, not against a program written to forge a pass).
* **Output**: stdout and stderr are drained concurrently, only the last ``tail_bytes`` of each
  are kept, and a program that writes more than ``max_output_bytes`` in total is killed.
* **Timeout**: wall clock; the whole process tree is killed (``SIGKILL`` to the process group,
  which takes down PID 1 and with it the namespace). PID 1 also enforces the timeout (plus
  ``SUPERVISOR_GRACE_S``) by itself and kills the run when the caller dies (EOF on a lifeline
  pipe), so a SIGKILLed harness leaves no program running; :func:`sweep_stale` removes the work
  directories and cgroups such a harness left behind (``execute_samples`` calls it).
* **Cleanup** never recurses and never turns a verdict into a crash: work directories are removed
  by :func:`ida_eval.cleanup.remove_tree` (iterative, descriptor-relative: any depth, modes,
  immutable flags, fifos, sockets); what still cannot be removed is a ``RuntimeWarning``, and
  :func:`sweep_stale` likewise warns and goes on.

What a caller hands in and gets back (:class:`~ida_eval.sandbox_types.SandboxLimits`,
:class:`~ida_eval.sandbox_types.ProgramJob`, :class:`~ida_eval.sandbox_types.SandboxResult`,
:class:`~ida_eval.sandbox_types.Isolation`, :class:`~ida_eval.sandbox_types.SandboxError`) is defined in
:mod:`ida_eval.sandbox_types`; which isolation to pass is :func:`ida_eval.isolation.probe_isolation`'s answer.
"""

from __future__ import annotations

import atexit
import functools
import marshal
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from ida_eval._sandbox_boot import ARGS as _BOOT_ARGS
from ida_eval._sandbox_boot import CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID
from ida_eval._sandbox_boot import LIST_SEP as _LIST_SEP
from ida_eval.cgroups import (
    SandboxCgroups,
    ServerRunCgroups,
    cgroup_parents,
    remove_group,
)
from ida_eval.cleanup import remove_tree

# the sandbox's vocabulary (limits, results, jobs, errors, isolation) lives in ida_eval.sandbox_types
from ida_eval.sandbox_types import (
    DEFAULT_LIMITS,
    Cancelled,
    Isolation,
    ProgramJob,
    SandboxError,
    SandboxLimits,
    SandboxResult,
)

UID_BASE = 1_000_000  # first uid handed to sandboxed programs (per-process offset added, see _slot_ids)
UID_SLOTS_PER_PROCESS = 256  # at most this many concurrent sandboxes per executing process
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"  # the only PATH a sandboxed program sees
WORK_PREFIX = "ida-exec-"  # work dirs are <tmp>/ida-exec-<runner pid>-<random>/w
SUPERVISOR_GRACE_S = 5.0  # PID 1 kills the run by itself this long after the timeout (if we did not)
KILL_GRACE_S = 0.5  # after the program's main process exits, wait this long for pipes to close


# ---------------------------------------------------------------------------------------------
BOOT_SCRIPT = str(Path(__file__).with_name("_sandbox_boot.py"))
"""The in-sandbox bootstrap (run as a script; see its docstring for the steps)."""


@functools.cache
def _slot_ids() -> tuple[int, int]:
    """(uid, gid) base for this process' sandboxes: distinct per executing process and worker slot."""
    base = UID_BASE + (os.getpid() % 65536) * UID_SLOTS_PER_PROCESS
    return base, base


# ---------------------------------------------------------------------------------------------
# Running one program


def _interpreter_args(limits: SandboxLimits) -> list[str]:
    flags = ["-I"] if limits.hash_seed is None else ["-s", "-P"]
    if not limits.site_packages:
        flags.append("-S")
    return [sys.executable, *flags]


def _environment(workdir: str, limits: SandboxLimits, job: ProgramJob | None = None) -> dict[str, str]:
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    if job is not None:
        env.update((k, v.replace("{work}", workdir)) for k, v in job.env)
        return env
    if limits.hash_seed is not None:
        env["PYTHONHASHSEED"] = str(limits.hash_seed)
        env["PYTHONIOENCODING"] = "utf-8"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _rlimits(limits: SandboxLimits, job: ProgramJob | None = None) -> list[tuple[str, int, int]]:
    cpu = int(limits.timeout) + 1
    if job is not None:  # compilers and VMs run several busy threads: CPU seconds outrun the wall clock
        cpu = int((limits.timeout + job.compile_timeout) * max(2, os.cpu_count() or 1)) + 1
    return [
        ("RLIMIT_AS", limits.memory_bytes, limits.memory_bytes),
        ("RLIMIT_NPROC", limits.max_processes, limits.max_processes),
        ("RLIMIT_NOFILE", limits.open_files, limits.open_files),
        ("RLIMIT_FSIZE", limits.file_size_bytes, limits.file_size_bytes),
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_CORE", 0, 0),
    ]


class _Tail:
    """Keeps the last ``keep`` bytes of a stream and counts all of them."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.buf = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > self.keep:
            del self.buf[: len(self.buf) - self.keep]

    def text(self) -> str:
        return self.buf.decode("utf-8", errors="replace")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(tmp_root: str | None = None) -> list[str]:
    """Remove work directories and cgroups left by runners that died (SIGKILL, power loss).

    Only entries named ``ida-exec-<pid>-...`` whose ``<pid>`` no longer exists are touched (a
    recycled pid keeps its entries: conservative). Their processes are already gone: PID 1 of each
    run kills everything when its runner's lifeline closes. Never raises: an entry that cannot be
    removed is left in place with a ``RuntimeWarning`` naming it and why (the next sweep tries
    again), so a leftover can never keep a run from starting. Returns what was removed.
    """
    removed: list[str] = []
    places = [tmp_root or tempfile.gettempdir(), *cgroup_parents()]
    for parent in places:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            pid_text = name[len(WORK_PREFIX) :].split("-", 1)[0]
            if not name.startswith(WORK_PREFIX) or not pid_text.isdigit() or _pid_alive(int(pid_text)):
                continue
            path = os.path.join(parent, name)
            try:
                if parent in places[1:]:
                    remove_group(path)
                else:
                    remove_tree(path)
                removed.append(path)
            except Exception as e:  # noqa: BLE001 - whatever it is, the run must go on
                warnings.warn(
                    f"ida_eval sandbox: cannot remove stale {path}: {e}; left in place", RuntimeWarning, stacklevel=2
                )
    return removed


def _kill_uid(uid: int, gid: int) -> None:
    """SIGKILL every process of ``uid``: ``kill -9 -1`` run *as that uid* reaches exactly its processes
    (whatever session they escaped to) and nothing else."""
    kill = shutil.which("kill", path=SAFE_PATH)
    if kill is None:
        warnings.warn(
            "ida_eval sandbox: no kill(1) binary; escaped processes may survive", RuntimeWarning, stacklevel=2
        )
        return
    for _ in range(2):  # the second pass catches anything forked while the first was running
        subprocess.run(
            [kill, "-9", "-1"],
            user=uid,
            group=gid,
            extra_groups=[],
            env={"PATH": SAFE_PATH},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=10,
        )


def _kill_tree(proc: subprocess.Popen[bytes] | _ServedRun) -> None:
    if isinstance(proc, _ServedRun):  # the namespace dies with its PID 1
        proc.kill()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _remove_work_dir(root: str, workdir: str, names: Sequence[str]) -> None:
    """Remove a run's work directory; a failure is a warning, never an exception (the program's
    verdict stands and the run goes on; :func:`sweep_stale` retries once this process is gone).
    ``names``: the files we wrote into ``workdir`` (under ``root``); when they are all that is there
    (a program in namespaces writes to its own tmpfs), they go without a walk of the tree."""
    try:
        for name in names:
            os.unlink(os.path.join(workdir, name))
        os.rmdir(workdir)
        os.rmdir(root)
        return
    except OSError:
        pass
    try:
        remove_tree(root)
    except Exception as e:  # noqa: BLE001 - whatever the program left, the verdict must survive
        warnings.warn(f"ida_eval sandbox: cannot remove work directory {root}: {e}", RuntimeWarning, stacklevel=3)


def run_program(
    source: str | ProgramJob,
    limits: SandboxLimits = DEFAULT_LIMITS,
    *,
    isolation: Isolation,
    slot: int = 0,
    tmp_root: str | None = None,
    cancel: threading.Event | None = None,
) -> SandboxResult:
    """Run one Python program in a fresh sandboxed interpreter (or a :class:`ProgramJob`).

    Args:
        source: the program text (written to ``prog.py`` in a new temporary directory), or a
            :class:`ProgramJob` (its files written there, compiled and run by its commands).
        limits: resource limits.
        isolation: how to isolate: what :func:`ida_eval.isolation.probe_isolation` found works here
            (the probe itself runs its probe program through this function under each candidate).
        slot: worker slot (0 .. 255); concurrent runs must use distinct slots (it picks the uid).
        tmp_root: where to create the temporary directory (default: the system's).
        cancel: when this event gets set, the program's tree is killed and :class:`Cancelled`
            raised (checked before starting and every 0.25 s while it runs).

    Returns:
        A :class:`SandboxResult`; ``.passed`` is true only when the program ran to its end.

    Raises:
        SandboxError: the sandbox could not be set up. Cancelled: ``cancel`` was set.

    Example:
        >>> from ida_eval.isolation import probe_isolation
        >>> run_program("assert 1 + 1 == 2", isolation=probe_isolation()).passed
        True
        >>> run_program("import sys; sys.exit(0)", isolation=probe_isolation()).passed
        False
    """
    if not 0 <= slot < UID_SLOTS_PER_PROCESS:
        raise ValueError(f"slot must be in [0, {UID_SLOTS_PER_PROCESS}), got {slot}")
    if cancel is not None and cancel.is_set():
        raise Cancelled("cancelled before start")
    uid = gid = None
    if isolation.privilege == "setuid":
        uid_base, gid_base = _slot_ids()
        uid, gid = uid_base + slot, gid_base + slot
    root = os.path.realpath(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=tmp_root))
    workdir = os.path.join(root, "w")
    job = source if isinstance(source, ProgramJob) else None
    files = job.files if job is not None else (("prog.py", source),)
    try:
        os.chmod(root, 0o711)
        os.mkdir(workdir, 0o700)
        for name, text in files:
            path = os.path.join(workdir, name)
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)  # lone surrogates stay invalid UTF-8: the program then fails to compile
            if uid is not None:
                os.chown(path, uid, gid)
        program = os.path.join(workdir, files[0][0])
        if uid is not None:
            os.chown(workdir, uid, gid)
        server = _JobServer.for_slot(slot, limits) if job is not None and _served_unshare_flags(isolation) else None
        groups = (
            server.run_groups() if server else SandboxCgroups.create(limits.max_processes, limits.memory_bytes, slot)
        )
        try:
            res = _spawn_and_wait(program, workdir, limits, isolation, uid, gid, groups, cancel, job, server)
        finally:
            groups.remove()
        return res
    finally:
        _remove_work_dir(root, workdir, [name for name, _ in files])


# ---------------------------------------------------------------------------------------------
# Job servers: a warm bootstrap per worker slot that forks each ProgramJob's sandbox

JOB_SERVER = True  # run ProgramJobs through a per-slot job server where it can reproduce the isolation
_UNSHARE_FLAGS = {"--net": CLONE_NEWNET, "--pid": CLONE_NEWPID, "--mount": CLONE_NEWNS}
_UNSHARE_SERVED = ("--fork", "--kill-child", "--propagation", "private")  # what the server itself does
SERVER_START_TIMEOUT_S = 30.0  # a job server must answer a request within this (it only forks)


def _served_unshare_flags(iso: Isolation) -> int:
    """The ``unshare(2)`` flags with which a job server reproduces ``iso.unshare`` exactly; 0 where
    it cannot: no PID + mount namespaces, a user namespace (``--user``: a non-root runner), or an
    option it does not know."""
    if not (JOB_SERVER and iso.uses_namespaces and os.geteuid() == 0):
        return 0
    flags = 0
    for arg in iso.unshare[1:]:
        if arg in _UNSHARE_FLAGS:
            flags |= _UNSHARE_FLAGS[arg]
        elif arg not in _UNSHARE_SERVED:
            return 0
    return flags if flags & CLONE_NEWPID and flags & CLONE_NEWNS else 0


class _JobServer:
    """``_sandbox_boot.py --serve`` (see :func:`ida_eval._sandbox_boot.serve`): one per executing
    process and worker slot, started on its first ProgramJob, one request at a time.

    Starting a bootstrap per program cost an interpreter start-up and an ``unshare(1)`` exec, ~25 ms
    of CPU: more than a whole PHP or Perl test run. The server pays it once; each program's sandbox
    is then a fork of it that makes the same namespaces and runs the same bootstrap code as PID 1.
    It exits when this process closes its socket or dies."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _servers: ClassVar[dict[tuple[int, int], _JobServer]] = {}

    def __init__(self, slot: int, limits: SandboxLimits) -> None:
        self.limits = (limits.max_processes, limits.memory_bytes)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-s", "-P", "-S", BOOT_SCRIPT, "--serve", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"},
                cwd="/",
                start_new_session=True,
            )
        except OSError as e:
            ours.close()
            raise SandboxError(f"cannot start the job server {sys.executable!r}: {e}") from e
        finally:
            theirs.close()
        self.sock = ours
        try:  # before its first fork: every run is born inside (+1 process: the server)
            self.groups = SandboxCgroups.create(limits.max_processes + 1, limits.memory_bytes, slot)
            self.groups.join(self.proc.pid)
        except OSError as e:
            self.close()
            raise SandboxError(f"cannot put the job server into its cgroups: {e}") from e

    @classmethod
    def for_slot(cls, slot: int, limits: SandboxLimits) -> _JobServer:
        """The slot's server (a new one if it died or was started with other limits). Only the
        thread that holds the slot uses its server."""
        key = (os.getpid(), slot)  # a forked runner starts servers of its own
        with cls._lock:
            server = cls._servers.get(key)
        if server is not None and (
            server.proc.poll() is not None or server.limits != (limits.max_processes, limits.memory_bytes)
        ):
            server.close()
            server = None
        if server is None:
            server = cls(slot, limits)
            with cls._lock:
                cls._servers[key] = server
        return server

    def run_groups(self) -> ServerRunCgroups:
        """The cgroups of the next run (see :class:`ida_eval.cgroups.ServerRunCgroups`)."""
        return ServerRunCgroups(self.groups, self.proc.pid)

    @classmethod
    def close_all(cls) -> None:
        with cls._lock:
            servers = [s for (pid, _), s in cls._servers.items() if pid == os.getpid()]
            cls._servers.clear()
        for server in servers:
            server.close()

    def close(self) -> None:
        self.sock.close()  # EOF: the server exits
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if hasattr(self, "groups"):
            self.groups.remove()

    def start(self, argv: list[str], env: dict[str, str], flags: int, fds: Sequence[int]) -> _ServedRun:
        """Send one run request; returns once the server has forked the run's PID 1."""
        self.sock.settimeout(SERVER_START_TIMEOUT_S)
        try:
            socket.send_fds(self.sock, [marshal.dumps({"argv": argv, "env": env, "unshare": flags})], fds)
            reply, got, _, _ = socket.recv_fds(self.sock, 64, 1)
        except OSError as e:
            raise SandboxError(
                f"job server (pid {self.proc.pid}, exit {self.proc.poll()}) did not start the run: {e}"
            ) from e
        finally:
            self.sock.settimeout(None)
        if not reply.startswith(b"started ") or len(got) != 1:
            for fd in got:
                os.close(fd)
            raise SandboxError(f"job server (pid {self.proc.pid}) answered {reply!r}")
        return _ServedRun(self.sock, int(reply.split()[1]), got[0])


class _ServedRun:
    """A job server's forked PID 1 of one run, seen as much like a ``Popen`` as ``_spawn_and_wait``
    needs: ``pid`` (it leads its own session and process group), ``poll``, ``wait``, ``returncode``,
    ``kill`` (through a pidfd: never another process that got its pid)."""

    def __init__(self, sock: socket.socket, pid: int, pidfd: int) -> None:
        self.sock, self.pid, self.pidfd = sock, pid, pidfd
        self.returncode: int | None = None
        self.stdin: Any = None
        self.stdout: Any = None
        self.stderr: Any = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.pidfd], [], [], 0)[0]:
            return self.wait()
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            reply = self.sock.recv(64)  # the server reaps PID 1, then reports its wait status
            if not reply.startswith(b"exit "):
                raise SandboxError(f"job server answered {reply!r} instead of the exit status")
            self.returncode = os.waitstatus_to_exitcode(int(reply.split()[1]))
            os.close(self.pidfd)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)  # the PID namespace ends with it
            except ProcessLookupError:
                pass


def _start_served(
    server: _JobServer, argv: list[str], env: dict[str, str], flags: int, pipes: Sequence[int]
) -> _ServedRun:
    """Start one program through a job server, with new stdin/stdout/stderr pipes; ``pipes`` are
    the sentinel, status and lifeline ends."""
    ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
    theirs = [ends[0][0], ends[1][1], ends[2][1], *pipes]
    try:
        session = server.start(argv, env, flags, theirs)
    except BaseException:
        for fd in (ends[0][1], ends[1][0], ends[2][0]):
            os.close(fd)
        raise
    finally:
        for fd in theirs[:3]:
            os.close(fd)
    session.stdin = open(ends[0][1], "wb", buffering=0)  # closed by _spawn_and_wait
    session.stdout = open(ends[1][0], "rb", buffering=0)
    session.stderr = open(ends[2][0], "rb", buffering=0)
    return session


def close_job_servers() -> None:
    """Stop this process' job servers and remove their cgroups (``execute_samples`` does it when
    it is done; otherwise they end with the process)."""
    _JobServer.close_all()


atexit.register(_JobServer.close_all)


HIDDEN_DIRS = ("/run", "/var/run")  # covered by an empty tmpfs inside namespaces (daemons' sockets)
FRESH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # replaced by private writable dirs of the task's tmpfs
UNIX_SOCKETS_TABLE = "/proc/net/unix"  # the bound unix sockets of our network namespace


def _under(path: str, dirs: Sequence[str]) -> bool:
    return any(os.path.commonpath([d, path]) == d for d in dirs)


def readable_in_sandbox(path: str, isolation: Isolation, tmp_root: str | None = None) -> bool:
    """Whether a program run under ``isolation`` can read the directory ``path`` (a
    :attr:`ProgramJob.read_only` entry): ``path`` readable and searchable, and every directory above it
    searchable, for the uid the program runs as.

    That uid is a per-worker one (``setuid``: the "other" permission bits), the runner's own with every
    capability dropped (``capdrop``: the owner bits where the runner owns the directory), or the runner
    itself (``rlimits``). In the namespace modes a path under a hidden directory (the home, the temp dirs)
    is mounted back with new, searchable parents: only the directories above the hidden one count. A
    compiler told to search a directory it may not enter fails (``g++``: "Permission denied") instead of
    skipping it, so a caller asks this first.
    """
    if isolation.privilege not in ("setuid", "capdrop"):
        return os.access(path, os.R_OK | os.X_OK)
    path = os.path.realpath(path)
    above = [str(p) for p in Path(path).parents]
    if isolation.uses_namespaces:
        hidden, _, fresh = _hidden_paths_for(
            os.path.realpath(tmp_root or tempfile.gettempdir()), os.path.expanduser("~"), tempfile.gettempdir()
        )
        cover = [d for d in (*hidden, *fresh) if _under(path, [d])]
        if cover:
            top = min(cover, key=len)  # the outermost hidden directory: a fresh tmpfs, searchable
            above = [d for d in above if not _under(d, [top])]
    try:
        return _allowed(os.stat(path), isolation, 0o5) and all(_allowed(os.stat(d), isolation, 0o1) for d in above)
    except OSError:
        return False


def _allowed(st: os.stat_result, isolation: Isolation, bits: int) -> bool:
    owner = isolation.privilege == "capdrop" and st.st_uid == os.geteuid()
    return (st.st_mode >> 6 if owner else st.st_mode) & bits == bits


def _hidden_paths(workdir: str) -> tuple[list[str], list[str], list[str]]:
    """(directories to cover with an empty tmpfs, paths under them to keep visible, fresh dirs).

    Hidden: the caller's home, the temp root of the work directory and the system temp dir
    (other programs' files, whatever ``TMPDIR`` says), ``/run`` and ``/var/run`` (daemons'
    sockets) and the highest ancestor of the work directory that others cannot search (e.g. a 0700
    pytest dir, which would lock the per-worker uid out of its own directory). Fresh (private,
    writable, inside the disk cap): ``/tmp``, ``/var/tmp``, ``/dev/shm``, whatever ``TMPDIR``
    says. Kept: the interpreter's directories, when they lie under a hidden or fresh one.
    (What they are depends only on the temp root, the home and the temp dir: worked out once for
    each, as it costs ~0.5 ms per program.)
    """
    hidden, kept, fresh = _hidden_paths_for(
        os.path.dirname(os.path.dirname(workdir)), os.path.expanduser("~"), tempfile.gettempdir()
    )
    return list(hidden), list(kept), list(fresh)


@functools.lru_cache(maxsize=64)
def _hidden_paths_for(temp_root: str, home: str, temp_dir: str) -> tuple[tuple[str, ...], ...]:
    fresh: list[str] = []
    for d in FRESH_DIRS:
        d = os.path.realpath(d)
        if d != "/" and os.path.isdir(d) and d not in fresh:
            fresh.append(d)
    hidden: list[str] = []
    for d in (home, temp_dir, temp_root, *HIDDEN_DIRS):
        d = os.path.realpath(d)
        if d != "/" and os.path.isdir(d) and not _under(d, fresh):
            hidden.append(d)
    parts = Path(temp_root).parts
    for i in range(2, len(parts) + 1):
        ancestor = str(Path(*parts[:i]))
        try:
            searchable = os.stat(ancestor).st_mode & 0o001
        except OSError:
            break
        if not searchable:
            hidden.append(ancestor)
            break
    hidden = [h for h in hidden if not any(h != o and os.path.commonpath([h, o]) == o for o in hidden + fresh)]
    needed = {
        os.path.realpath(p)
        for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable))
    }
    kept: list[str] = []
    for path in sorted(needed):
        if not _under(path, hidden + fresh):
            continue
        if not _under(path, kept):  # else visible through a kept ancestor
            kept.append(path)
    return tuple(sorted(set(hidden))), tuple(kept), tuple(fresh)


def _unix_socket_tables() -> list[str]:
    """``/proc/<pid>/net/unix`` of one process per network namespace on this machine (ours first).

    Sockets of other network namespaces (containers, other sandboxes) are listed only there, yet
    their files may lie in directories a program can see. Walked afresh for every program (about
    0.2 ms for 120 processes): a list reused for even a second missed a namespace made in that second.
    """
    tables = [UNIX_SOCKETS_TABLE]
    seen: set[str] = set()
    try:
        seen.add(os.readlink("/proc/self/ns/net"))
        pids = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return tables
    for pid in pids:
        try:
            ns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:  # gone, or not ours to look at
            continue
        if ns not in seen:
            seen.add(ns)
            tables.append(f"/proc/{pid}/net/unix")
    return tables


def _host_sockets(covered: Sequence[str]) -> list[str]:
    """Paths of the bound unix sockets of every network namespace, except those under ``covered``.

    (Relative and abstract names are skipped: abstract sockets are per network namespace, and the
    program has its own. The bootstrap also covers socket files that are mount points.)
    """
    found: set[str] = set()
    for table in _unix_socket_tables():
        try:
            with open(table, "rb") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split(None, 7)
            if len(fields) == 8 and fields[7].startswith(b"/"):
                path = os.fsdecode(fields[7])
                if not _under(path, covered):
                    found.add(path)
    return sorted(found)


def _path_list(paths: Sequence[str]) -> str:
    return _LIST_SEP.join(p for p in paths if _LIST_SEP not in p)


def _spawn_and_wait(
    program: str,
    workdir: str,
    limits: SandboxLimits,
    iso: Isolation,
    uid: int | None,
    gid: int | None,
    groups: SandboxCgroups,
    cancel: threading.Event | None,
    job: ProgramJob | None = None,
    server: _JobServer | None = None,
) -> SandboxResult:
    hidden, kept, fresh = _hidden_paths(workdir) if iso.uses_namespaces else ([], [], [])
    for path in job.read_only if job is not None and iso.uses_namespaces else ():
        if _under(path, hidden + fresh) and not _under(path, kept):  # mounted back; remounted read-only with the rest
            kept.append(path)
    sockets = _host_sockets(hidden + fresh) if iso.uses_namespaces else []
    sent_r, sent_w = os.pipe()
    stat_r, stat_w = os.pipe()
    life_r, life_w = os.pipe()  # we hold life_w until the end: its EOF tells PID 1 that we are gone
    cfg = {
        "workdir": workdir,
        "program": program,
        "mounts": "1" if iso.uses_namespaces else "",
        "privilege": iso.privilege,
        "uid": uid,
        "gid": gid,
        "rlimits": ",".join(f"{n}:{a}:{b}" for n, a, b in _rlimits(limits, job)),
        "status_fd": stat_w,
        "sentinel_fd": sent_w,
        "cgroups": ":".join(groups.paths),
        "hide": _path_list(hidden),
        "keep": _path_list(kept),
        "lifeline_fd": life_r,
        "deadline_s": limits.timeout + (job.compile_timeout if job else 0.0) + SUPERVISOR_GRACE_S,
        "fresh": _path_list(fresh),
        "sockets": _path_list(sockets),
        "disk_bytes": limits.disk_bytes,
        "job": job.spec() if job is not None else "",
    }
    args = [str(cfg[k]) if cfg[k] is not None else "" for k in _BOOT_ARGS]
    cmd: Sequence[str] = [*iso.unshare, *_interpreter_args(limits), BOOT_SCRIPT, *args]
    nonce = _new_nonce()
    start = time.monotonic()
    proc: subprocess.Popen[bytes] | _ServedRun
    try:
        if server is None:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(sent_w, stat_w, life_r),
                env=_environment(workdir, limits, job),
                cwd=workdir,
                start_new_session=True,
            )
        else:
            env = _environment(workdir, limits, job)
            proc = _start_served(server, args, env, _served_unshare_flags(iso), (sent_w, stat_w, life_r))
    except (OSError, SandboxError) as e:
        for fd in (sent_r, sent_w, stat_r, stat_w, life_r, life_w):
            os.close(fd)
        if isinstance(e, SandboxError):
            raise
        raise SandboxError(f"cannot start sandbox {cmd[0]!r}: {e}") from e
    os.close(sent_w)
    os.close(stat_w)
    os.close(life_r)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(nonce)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    out, err = _Tail(limits.tail_bytes), _Tail(limits.tail_bytes)
    sentinel, status = bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    streams = {proc.stdout.fileno(): out.add, proc.stderr.fileno(): err.add}
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ)
    sel.register(proc.stderr.fileno(), selectors.EVENT_READ)
    sel.register(sent_r, selectors.EVENT_READ)
    sel.register(stat_r, selectors.EVENT_READ)
    deadline = start + limits.timeout + (job.compile_timeout if job is not None else 0.0)
    compiling = job is not None and job.compile is not None
    compile_status: int | None = None
    compile_ok: bool | None = None
    compile_timed_out = False
    compile_s = 0.0
    timed_out = exceeded = cancelled = False
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
                if not iso.uses_namespaces:  # no PID namespace: reap escaped processes ourselves
                    _reap_escapees(proc, iso, uid, gid, groups)
            if exited_at is not None and now - exited_at > KILL_GRACE_S:
                break  # something outside our control still holds a pipe open
            for key, _ in sel.select(timeout=min(0.25, deadline - now)):
                fd = key.fd
                data = os.read(fd, 65536)
                if not data:
                    sel.unregister(fd)
                elif fd in streams:
                    streams[fd](data)
                elif fd == sent_r:
                    sentinel += data[:64]
                else:
                    status += data[:256]
            if compiling and b";" in status:  # the bootstrap's "compiled <status> <ms>;": the run clock starts
                compiling = False
                word, _, rest = bytes(status).partition(b";")[0].partition(b" ")
                compile_s = time.monotonic() - start
                if word == b"compiled":
                    raw, _, ok = rest.partition(b" ")
                    compile_status = os.waitstatus_to_exitcode(int(raw))
                    compile_ok = ok == b"1"
                    deadline = time.monotonic() + limits.timeout
                else:
                    compile_timed_out = word == b"compile-timeout"
            if out.total + err.total > limits.max_output_bytes:
                exceeded = True
                break
    finally:
        sel.close()
        if timed_out or exceeded or cancelled or proc.poll() is None:
            _kill_tree(proc)
        proc.wait()
        if not iso.uses_namespaces:
            _reap_escapees(proc, iso, uid, gid, groups)
        for fd in (sent_r, stat_r, life_w):
            os.close(fd)
        proc.stdout.close()
        proc.stderr.close()
    elapsed = time.monotonic() - start
    if cancelled:
        raise Cancelled(f"cancelled after {elapsed:.1f} s")
    text = status.decode("ascii", errors="replace").rpartition(";")[2]  # the compile report comes first
    if timed_out and compiling:
        compile_timed_out, compile_s = True, elapsed
    if text.startswith("setup-error"):
        raise SandboxError(f"sandbox setup failed ({iso.description}): {text[12:]}; stderr: {err.text()[-500:]}")
    exit_status: int | None
    if text.startswith("exit "):
        exit_status = os.waitstatus_to_exitcode(int(text.split()[1]))
    elif timed_out or exceeded:
        exit_status = None
    else:
        exit_status = proc.returncode
    if job is not None:  # the driver wrote the nonce it read from stdin to stdout as its last act
        finished = nonce.decode() in out.text()
    else:
        finished = bytes(sentinel) == nonce
    compile_output = err.text() if compile_ok is False else ""  # nothing else wrote to stderr then
    return SandboxResult(
        finished=finished,
        exit_status=exit_status,
        timed_out=timed_out,
        output_exceeded=exceeded,
        stdout_tail=out.text(),
        stderr_tail=err.text(),
        output_bytes=out.total + err.total,
        elapsed_s=elapsed,
        oom_killed=groups.oom_killed(),
        disk_full=text.endswith(" disk-full"),
        compile_status=compile_status,
        compile_ok=compile_ok,
        compile_output=compile_output,
        compile_timed_out=compile_timed_out,
        compile_s=compile_s,
    )


def _new_nonce() -> bytes:
    """32 random hex characters, fresh for every program."""
    return secrets.token_hex(16).encode()


def _reap_escapees(
    proc: subprocess.Popen[bytes], iso: Isolation, uid: int | None, gid: int | None, groups: SandboxCgroups
) -> None:
    _kill_tree(proc)
    groups.kill()
    if uid is not None and gid is not None:
        _kill_uid(uid, gid)
