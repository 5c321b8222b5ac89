"""Per-sandbox control groups: bound a whole process tree's process count and memory.

rlimits are per process: ``RLIMIT_AS`` bounds one process' address space, so a program that forks
``n`` children may use ``n`` times that, and ``RLIMIT_NPROC`` is not enforced at all for uid 0
(which the sandbox's ``capdrop`` mode keeps). A cgroup bounds the tree: every sandbox gets a fresh
group (joined by its PID 1 before the program starts, inherited by every descendant) with

* ``pids.max = max_processes`` (cgroup v1 ``pids`` hierarchy, or v2 ``pids.max``), and
* ``memory.limit_in_bytes`` (+ ``memory.memsw.limit_in_bytes`` so swap is no way out) on v1, or
  ``memory.max`` + ``memory.swap.max = 0`` on v2, set to ``memory_bytes``: the resident memory of
  all its processes together. Exceeding it gets a process OOM-killed inside the group (reported by
  :meth:`SandboxCgroups.oom_killed`), never anything outside.

Where cgroups are not writable (no root, a read-only ``/sys/fs/cgroup`` in a container, a v2
hierarchy without delegated controllers), :func:`cgroup_support` reports nothing and the sandbox
relies on rlimits, per-worker uids and its PID namespace.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import signal
import time
import warnings
from pathlib import Path

CGROUP_MOUNT = "/sys/fs/cgroup"  # where cgroup hierarchies are mounted
REMOVE_TRIES = 300  # rmdir attempts (10 ms apart) while the kernel reaps the group's processes
NAME_PREFIX = "ida-exec-"  # every group we create is called ida-exec-<pid>-<slot>-<random>


@dataclasses.dataclass(frozen=True)
class CgroupSupport:
    """Parent directories under which we may create groups (None: controller unavailable)."""

    pids_parent: str | None
    memory_parent: str | None
    version: str  # "v1", "v2" or "none"

    def describe(self) -> str:
        parts = [n for n, p in (("pids", self.pids_parent), ("memory", self.memory_parent)) if p]
        return f"cgroup {self.version} ({'+'.join(parts)})" if parts else "no cgroups"


def _own_paths() -> dict[str, str]:
    """controller -> this process' cgroup path, from /proc/self/cgroup (v2 under key "")."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _usable(parent: str, control_file: str) -> bool:
    probe = os.path.join(parent, f"ida-probe-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return os.path.exists(os.path.join(probe, control_file))
    finally:
        os.rmdir(probe)


@functools.cache
def cgroup_support() -> CgroupSupport:
    """Probe (once per process) where per-sandbox groups can be created."""
    own = _own_paths()
    v1_pids = os.path.join(CGROUP_MOUNT, "pids")
    v1_mem = os.path.join(CGROUP_MOUNT, "memory")
    if os.path.isdir(v1_pids) or os.path.isdir(v1_mem):
        pids = v1_pids + own.get("pids", "/").rstrip("/")
        mem = v1_mem + own.get("memory", "/").rstrip("/")
        return CgroupSupport(
            pids if os.path.isdir(pids) and _usable(pids, "pids.max") else None,
            mem if os.path.isdir(mem) and _usable(mem, "memory.limit_in_bytes") else None,
            "v1",
        )
    if os.path.exists(os.path.join(CGROUP_MOUNT, "cgroup.controllers")):
        parent = CGROUP_MOUNT + own.get("", "/").rstrip("/")
        try:
            enabled = Path(parent, "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        pids = parent if "pids" in enabled and _usable(parent, "pids.max") else None
        mem = parent if "memory" in enabled and _usable(parent, "memory.max") else None
        return CgroupSupport(pids, mem, "v2")
    return CgroupSupport(None, None, "none")


class SandboxCgroups:
    """The groups of one sandbox run; create with :meth:`create`, always :meth:`remove` after."""

    def __init__(self, paths: list[str], version: str) -> None:
        self.paths = paths
        self.version = version
        self._oom_files: list[str] | None = None

    @classmethod
    def create(cls, max_processes: int, memory_bytes: int, slot: int) -> SandboxCgroups:
        """Make fresh groups with the limits set; empty (no paths) when cgroups are unavailable."""
        sup = cgroup_support()
        name = f"{NAME_PREFIX}{os.getpid()}-{slot}-{secrets.token_hex(4)}"
        settings: dict[str, list[tuple[str, str]]] = {}
        if sup.pids_parent:
            settings.setdefault(os.path.join(sup.pids_parent, name), []).append(("pids.max", str(max_processes)))
        if sup.memory_parent:
            files = settings.setdefault(os.path.join(sup.memory_parent, name), [])
            if sup.version == "v1":
                files.append(("memory.limit_in_bytes", str(memory_bytes)))
                files.append(("memory.memsw.limit_in_bytes", str(memory_bytes)))
            else:
                files += [("memory.max", str(memory_bytes)), ("memory.swap.max", "0")]
        group = cls([], sup.version)
        try:
            for path, files in settings.items():
                os.mkdir(path)
                group.paths.append(path)
                for fname, value in files:
                    target = Path(path, fname)
                    if target.exists():  # memsw / swap files exist only with swap accounting
                        target.write_text(value)
        except OSError:
            group.remove()
            raise
        return group

    def oom_kills(self) -> int:
        """How many processes of this group the kernel OOM-killed so far (memory limit hit)."""
        if self._oom_files is None:  # looked up once: a job server's groups are read twice per run
            names = ("memory.oom_control", "memory.events")  # v1, v2
            self._oom_files = [f for p in self.paths for f in (os.path.join(p, n) for n in names) if os.path.exists(f)]
        kills = 0
        for fname in self._oom_files:
            try:
                text = Path(fname).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    kills += int(value or 0)
        return kills

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of this group (memory limit hit)."""
        return self.oom_kills() > 0

    def join(self, pid: int) -> None:
        """Move process ``pid`` (not its existing children) into the groups."""
        for path in self.paths:
            Path(path, "cgroup.procs").write_text(str(pid))

    def kill(self) -> None:
        """SIGKILL every process in the groups (whatever session or process group it moved to)."""
        for path in self.paths:
            self._kill_members(path)

    def remove(self) -> None:
        """SIGKILL anything still inside, then remove the groups (retrying while the kernel reaps)."""
        for path in self.paths:
            for _ in range(REMOVE_TRIES):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self._kill_members(path)
                    time.sleep(0.01)
            else:
                warnings.warn(f"ida_eval sandbox: could not remove cgroup {path}", RuntimeWarning, stacklevel=2)
        self.paths = []

    @staticmethod
    def _kill_members(path: str, spare: int | None = None) -> None:
        try:
            pids = Path(path, "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            if int(pid) == spare:
                continue
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class ServerRunCgroups(SandboxCgroups):
    """One run inside the groups a job server lives in (:class:`ida_eval.sandbox` forks each
    ProgramJob's sandbox from a per-slot server, one run at a time): joining a group costs a
    kernel RCU grace period (~10 ms of wall time per program on cgroup v1), being born in it costs
    nothing. Seen by the sandbox as the run's own fresh groups: nothing to join (``paths`` is empty;
    PID 1 is forked inside), OOM kills counted from the run's start, and :meth:`remove` kills
    whatever of the run is left, sparing only the server. What the groups charge for memory
    carries over between runs (page cache of files earlier runs read; the kernel reclaims it before
    it OOM-kills anything)."""

    def __init__(self, groups: SandboxCgroups, server_pid: int) -> None:
        super().__init__([], groups.version)
        self.groups, self.server_pid = groups, server_pid
        self.baseline = groups.oom_kills()

    def oom_kills(self) -> int:
        return self.groups.oom_kills() - self.baseline

    def kill(self) -> None:
        for path in self.groups.paths:
            self._kill_members(path, spare=self.server_pid)

    def remove(self) -> None:
        self.kill()


def cgroup_parents() -> list[str]:
    """The directories our groups are created in (empty without cgroup support)."""
    sup = cgroup_support()
    return sorted({p for p in (sup.pids_parent, sup.memory_parent) if p})


def remove_group(path: str) -> None:
    """Remove one group (killing what is left in it), e.g. one left behind by a dead runner."""
    SandboxCgroups([path], cgroup_support().version).remove()


def leftover_groups() -> list[str]:
    """Groups this process created and did not remove (for tests: should always be empty)."""
    sup = cgroup_support()
    found: list[str] = []
    for parent in {p for p in (sup.pids_parent, sup.memory_parent) if p}:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        found += [os.path.join(parent, n) for n in names if n.startswith(f"{NAME_PREFIX}{os.getpid()}-")]
    return found
