"""Which isolation works on this machine: the candidate levels, strongest first, and the probe.

The sandbox (:mod:`ida_eval.sandbox`) can isolate a program three ways (:class:`Isolation`, defined
with the sandbox's other types in :mod:`ida_eval.sandbox_types`), and what works depends on the kernel,
on privileges and on where the interpreter lives:

* ``namespaces``: ``unshare --net --pid --fork --kill-child --mount`` (``--user --map-root-user``
  when not root), read-only file system, hidden home, temp root, ``/run`` and host unix sockets,
  a private size-limited tmpfs for the work directory, ``/tmp``, ``/var/tmp`` and ``/dev/shm``,
  plus a privilege drop: ``setuid`` (a per-worker uid; needs root) or ``capdrop`` (uid kept,
  every capability dropped).
* ``setuid``: no namespaces, but root: per-worker uid, rlimits, uid-wide kill.
* ``rlimits``: neither: rlimits and process-group kill only.

Every level installs a seccomp filter that denies new user namespaces (and with them every other
namespace an unprivileged program could make).

:func:`probe_isolation` does not trust any of this: it runs a real probe program under each
candidate, strongest first, and takes the first that demonstrably isolates (namespaces: no
connection to 127.0.0.1, nothing it writes to the temp dir or ``/`` appears on the host; setuid:
uid not 0). A weaker level than ``namespaces`` is announced with a ``RuntimeWarning``, and so is a
probe that could create a user namespace (no seccomp here). The result is cached per process.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import tempfile
import threading
import warnings

from ida_eval.cgroups import cgroup_support
from ida_eval.sandbox import run_program
from ida_eval.sandbox_types import ISOLATION_LEVELS, Isolation, SandboxError, SandboxLimits


def _is_root() -> bool:
    return os.geteuid() == 0


_PROBE_PROGRAM = r"""
import ctypes, errno, os, socket, sys
work = os.getcwd()
with open(os.path.join(work, "probe.txt"), "w") as f:
    f.write("ok")
import re, collections, json
report = {"uid": os.getuid(), "net": "open", "userns": "allowed"}
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(0.5)
try:
    s.connect(("127.0.0.1", 9))
except OSError as e:
    report["net"] = "unreachable" if e.errno in (errno.ENETUNREACH, errno.EADDRNOTAVAIL) else "open"
for target in TARGETS:  # the host checks that none of these appeared on its side
    try:
        with open(target, "w") as f:
            f.write("x")
    except OSError:
        pass
if os.fork() == 0:  # in a child: a successful unshare must not change the probe itself
    libc = ctypes.CDLL(None, use_errno=True)
    os._exit(0 if libc.unshare(0x10000000) == 0 else 1)  # CLONE_NEWUSER
report["userns"] = "allowed" if os.waitstatus_to_exitcode(os.wait()[1]) == 0 else "denied"
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
        ns = (
            "unshare(net,pid,mount"
            + ("" if root else ",user")
            + ")+read-only fs (home, temp, /run, host sockets hidden)"
            + "+private tmpfs (work dir, /tmp, /dev/shm; disk cap)"
        )
        if root:
            drop = "+per-worker uid+no_new_privs+no user namespaces+rlimits"
            out.append(Isolation("namespaces", "setuid", tuple(prefix), ns + drop + procs))
        drop = "+capabilities dropped+no_new_privs+no user namespaces+rlimits"
        out.append(Isolation("namespaces", "capdrop", tuple(prefix), ns + drop + procs + (uncapped if root else "")))
    if root:
        what = "per-worker uid+no_new_privs+no user namespaces+rlimits+uid-wide kill (NO namespaces)"
        out.append(Isolation("setuid", "setuid", (), what))
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
    return _probe(iso)[0]


def _probe(iso: Isolation) -> tuple[str | None, dict[str, object]]:
    """(why ``iso`` does not isolate or None, the probe program's report)."""
    name = f"ida-probe-outside-{os.getpid()}-{secrets.token_hex(4)}.txt"
    targets = [os.path.join(tempfile.gettempdir(), name), os.path.join("/", name)]
    try:
        program = f"TARGETS = {targets!r}\n" + _PROBE_PROGRAM
        res = run_program(program, SandboxLimits(timeout=20.0), isolation=iso, slot=0)
    except (SandboxError, OSError) as e:
        return str(e), {}
    finally:
        escaped = [t for t in targets if os.path.lexists(t)]
        for t in escaped:
            os.unlink(t)
    if not res.passed:
        last = (res.stderr_tail.strip().splitlines() or ["(no stderr)"])[-1]
        hint = " (can the per-worker uid read the interpreter?)" if iso.privilege == "setuid" else ""
        return f"probe program failed (exit {res.exit_status}): {last}{hint}", {}
    try:
        report = json.loads(res.stdout_tail.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"probe printed no report: {res.stdout_tail[-200:]!r}", {}
    if iso.uses_namespaces and (report["net"] != "unreachable" or escaped):
        return f"namespaces did not isolate: {report}, written outside: {escaped}", report
    if iso.privilege == "setuid" and report["uid"] == 0:
        return "uid was not dropped", report
    return None, report


_PROBE_LOCK = threading.Lock()


@functools.cache
def _probe_cached(requested: str) -> Isolation:
    reasons: list[str] = []
    for iso in candidates():
        if requested != "auto" and iso.level != requested:
            continue
        why, report = _probe(iso)
        if why is None:
            if report.get("userns") != "denied":
                warnings.warn(
                    "ida_eval sandbox: programs can create user namespaces here (no seccomp filter on this "
                    f"kernel/architecture: {os.uname().machine})",
                    RuntimeWarning,
                    stacklevel=3,
                )
            if iso.level != "namespaces":
                warnings.warn(
                    f"ida_eval sandbox: kernel namespaces unavailable here ({'; '.join(reasons) or 'no unshare'}); "
                    f"falling back to weaker isolation: {iso.description}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return iso
        reasons.append(f"{iso.level}/{iso.privilege}: {why}")
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
