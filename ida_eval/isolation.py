"""Which isolation works on this machine: the candidate levels, strongest first, and the probe.

The sandbox (:mod:`ida_eval.sandbox`) can isolate a program three ways, and what works depends on
the kernel, on privileges and on where the interpreter lives:

* ``namespaces``: ``unshare --net --pid --fork --kill-child --mount`` (``--user --map-root-user``
  when not root), read-only file system, hidden home/temp//run, plus a privilege drop: ``setuid``
  (a per-worker uid; needs root) or ``capdrop`` (uid kept, every capability dropped).
* ``setuid``: no namespaces, but root: per-worker uid, rlimits, uid-wide kill.
* ``rlimits``: neither: rlimits and process-group kill only.

:func:`probe_isolation` does not trust any of this: it runs a real probe program under each
candidate, strongest first, and takes the first that demonstrably isolates (namespaces: no
connection to 127.0.0.1, no write next to its work directory; setuid: uid not 0). A weaker level
than ``namespaces`` is announced with a ``RuntimeWarning``. The result is cached per process.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import tempfile
import threading
import warnings

from ida_eval.cgroups import cgroup_support

ISOLATION_LEVELS = ("namespaces", "setuid", "rlimits")
"""Strongest first. ``auto`` picks the first that works here."""


@dataclasses.dataclass(frozen=True)
class Isolation:
    """How programs are isolated on this machine (the outcome of :func:`probe_isolation`)."""

    level: str  # one of ISOLATION_LEVELS
    privilege: str  # "setuid" (per-worker uid), "capdrop" (caps dropped, uid kept) or "none"
    unshare: tuple[str, ...]  # command prefix ("" when no namespaces)
    description: str

    @property
    def uses_namespaces(self) -> bool:
        return self.level == "namespaces"


def _is_root() -> bool:
    return os.geteuid() == 0


_PROBE_PROGRAM = r"""
import errno, os, socket, sys
work = os.getcwd()
with open(os.path.join(work, "probe.txt"), "w") as f:
    f.write("ok")
import re, collections, json
report = {"uid": os.getuid(), "net": "open", "outside": "writable"}
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(0.5)
try:
    s.connect(("127.0.0.1", 9))
except OSError as e:
    report["net"] = "unreachable" if e.errno in (errno.ENETUNREACH, errno.EADDRNOTAVAIL) else "open"
blocked = 0
for d in (os.path.dirname(work), TEMP_DIR):  # beside the work dir; the (world-writable) temp dir
    target = os.path.join(d, "ida-probe-outside-%d.txt" % os.getpid())
    try:
        open(target, "w").close()
        os.unlink(target)
    except OSError:
        blocked += 1
report["outside"] = "blocked" if blocked == 2 else "writable"
print(json.dumps(report))
"""


def candidates() -> list[Isolation]:
    """Every isolation this machine might support, strongest first (not yet probed)."""
    root = _is_root()
    out: list[Isolation] = []
    cg = cgroup_support()
    procs = "+" + cg.describe()
    uncapped = "" if cg.pids_parent else " (NO process cap for uid 0: no pids cgroup)"
    unshare = shutil.which("unshare")
    if unshare:
        prefix = [unshare, "--net", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private"]
        if not root:
            prefix += ["--user", "--map-root-user"]
        ns = "unshare(net,pid,mount" + ("" if root else ",user") + ")+read-only fs (home, temp, /run hidden)"
        if root:
            out.append(
                Isolation("namespaces", "setuid", tuple(prefix), ns + "+per-worker uid+no_new_privs+rlimits" + procs)
            )
        out.append(
            Isolation(
                "namespaces",
                "capdrop",
                tuple(prefix),
                ns + "+capabilities dropped+no_new_privs+rlimits" + procs + (uncapped if root else ""),
            )
        )
    if root:
        out.append(
            Isolation("setuid", "setuid", (), "per-worker uid+no_new_privs+rlimits+uid-wide kill (NO namespaces)")
        )
    out.append(
        Isolation(
            "rlimits",
            "none",
            (),
            "rlimits+process-group kill only (NO namespaces, NO uid drop)" + procs + (uncapped if root else ""),
        )
    )
    return out


def probe_one(iso: Isolation) -> str | None:
    """Run the probe program under ``iso``; None when it behaves as promised, else why not."""
    from ida_eval.sandbox import (  # (sandbox imports this module)
        SandboxError,
        SandboxLimits,
        run_program,
    )

    try:
        program = f"TEMP_DIR = {tempfile.gettempdir()!r}\n" + _PROBE_PROGRAM
        res = run_program(program, SandboxLimits(timeout=20.0), isolation=iso, slot=0)
    except (SandboxError, OSError) as e:
        return str(e)
    if not res.passed:
        last = (res.stderr_tail.strip().splitlines() or ["(no stderr)"])[-1]
        hint = " (can the per-worker uid read the interpreter?)" if iso.privilege == "setuid" else ""
        return f"probe program failed (exit {res.exit_status}): {last}{hint}"
    try:
        report = json.loads(res.stdout_tail.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"probe printed no report: {res.stdout_tail[-200:]!r}"
    if iso.uses_namespaces and (report["net"] != "unreachable" or report["outside"] != "blocked"):
        return f"namespaces did not isolate: {report}"
    if iso.privilege == "setuid" and report["uid"] == 0:
        return "uid was not dropped"
    return None


_PROBE_LOCK = threading.Lock()


@functools.cache
def _probe_cached(requested: str) -> Isolation:
    reasons: list[str] = []
    for iso in candidates():
        if requested != "auto" and iso.level != requested:
            continue
        why = probe_one(iso)
        if why is None:
            if iso.level != "namespaces":
                warnings.warn(
                    f"ida_eval sandbox: kernel namespaces unavailable here ({'; '.join(reasons) or 'no unshare'}); "
                    f"falling back to weaker isolation: {iso.description}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return iso
        reasons.append(f"{iso.level}/{iso.privilege}: {why}")
    from ida_eval.sandbox import SandboxError

    raise SandboxError(f"no sandbox isolation level {requested!r} works on this machine: {'; '.join(reasons)}")


def probe_isolation(requested: str = "auto") -> Isolation:
    """Find the strongest isolation that works here (cached per process).

    Args:
        requested: ``"auto"`` or one of :data:`ISOLATION_LEVELS` to insist on a level.

    Raises:
        ValueError: unknown level. SandboxError: the requested level does not work here.
    """
    if requested != "auto" and requested not in ISOLATION_LEVELS:
        raise ValueError(f"isolation must be 'auto' or one of {ISOLATION_LEVELS}, got {requested!r}")
    with _PROBE_LOCK:
        return _probe_cached(requested)


def isolation_description(isolation: Isolation | None = None) -> str:
    """``"<level>: <description>"`` of the given (default: probed) isolation."""
    iso = isolation if isolation is not None else probe_isolation()
    return f"{iso.level}: {iso.description}"
