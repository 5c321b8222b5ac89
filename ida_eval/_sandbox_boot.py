"""In-sandbox bootstrap: run as a script (``python -s -P -S _sandbox_boot.py ARGS``), never imported.

:mod:`ida_eval.sandbox` starts this file, under ``unshare`` when namespaces are available, once per
program. Standard library only and no ``json``/``re`` imports: it runs 974 times per MBXP pass.

1. As the first process of the new PID namespace ("PID 1"; still privileged) it joins the run's
   cgroups (``0`` written to each ``cgroup.procs``) and, with namespaces, makes the file system
   read-only except the work directory: bind-mount the work directory onto itself, mount a fresh
   ``/proc`` for the new PID namespace, cover the caller's home directory and ``/run`` (sockets of
   local daemons) with empty file systems, keeping the interpreter's own directory visible, then
   remount every mount point read-only with
   ``MS_REMOUNT | MS_BIND | MS_RDONLY`` (per-mount flags: the host's mounts are untouched; locked
   flags such as ``nosuid`` are carried over so a user namespace may remount them).
2. It forks. PID 1 stays privileged, reaps every child and reports the program's raw wait status
   on the status pipe (``exit <status>``); the program cannot signal or ptrace it. It also kills
   the whole run by itself past ``deadline_s`` or as soon as the caller dies (the caller holds
   the write end of a "lifeline" pipe; its EOF means the caller is gone).
3. The child applies rlimits, drops privileges (per-worker uid, or every capability plus the
   ``SECBIT_NOROOT`` lock when it stays uid 0), sets ``no_new_privs``, reads the nonce from stdin
   until EOF, replaces stdin with ``/dev/null``, compiles ``prog.py`` (bytes: encoding errors become
   the program's own ``SyntaxError``) and ``exec``s it as ``__main__``. Only if that returns does it
   write the nonce to the sentinel pipe.

Any failure before the program starts is reported as ``setup-error <repr>`` on the status pipe,
so the caller can tell a broken sandbox from a failing program.
"""

import os
import sys

# Linux constants (uapi/linux/mount.h, prctl.h, capability.h, securebits.h)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 32, 4096, 8192, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 24, 28, 38
SECURE_ALL_NOROOT_LOCKED = 0x2F  # NOROOT | NOROOT_LOCKED | NO_SETUID_FIXUP | its LOCKED | KEEP_CAPS_LOCKED
CAP_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3
SETUP_FAILED_EXIT = 125  # exit code when the sandbox itself could not be set up
# positional argv (plain strings: importing json here would cost ~10 ms per program)
ARGS = (
    "workdir",
    "program",
    "mounts",
    "privilege",
    "uid",
    "gid",
    "rlimits",
    "status_fd",
    "sentinel_fd",
    "cgroups",
    "hide",
    "keep",
    "lifeline_fd",
    "deadline_s",
)
_OPTION_FLAGS = {
    b"nosuid": MS_NOSUID,
    b"nodev": MS_NODEV,
    b"noexec": MS_NOEXEC,
    b"noatime": MS_NOATIME,
    b"nodiratime": MS_NODIRATIME,
    b"relatime": MS_RELATIME,
}


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _unescape(field):
    """Undo /proc/self/mountinfo's octal escapes (the kernel escapes space, tab, newline, backslash)."""
    for esc, raw in ((b"\\040", b" "), (b"\\011", b"\t"), (b"\\012", b"\n"), (b"\\134", b"\\")):
        field = field.replace(esc, raw)
    return field


def make_filesystem_read_only(work, hide=(), keep=()):
    """Everything read-only except ``work``; ``hide`` dirs replaced by empty ones; a fresh /proc.

    Args:
        work: the work directory (bytes path); stays writable.
        hide: directories covered by an empty tmpfs (the caller's home, /run with its sockets, a
            non-searchable ancestor of the work directory).
        keep: paths under hidden directories that must stay visible at the same place (the
            interpreter's prefix, the work directory): each is opened (``O_PATH``) before the
            hiding and bind-mounted back from ``/proc/self/fd/N`` on top of the empty tmpfs,
            whose new parent directories are world-searchable (so a per-worker uid gets through).
    """
    ctypes, libc = _libc()

    def mount(src, dst, fstype, flags):
        if libc.mount(src, dst, fstype, ctypes.c_ulong(flags), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {dst!r}: {os.strerror(err)}")

    mount(work, work, None, MS_BIND)
    held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in keep]
    for path in hide:
        mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV)
    for path, fd in held:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(b"/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
        os.close(fd)
    mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    with open("/proc/self/mountinfo", "rb") as f:
        rows = [line.split() for line in f.read().splitlines()]
    done = set()
    for row in reversed(rows):  # the last row for a mount point is the visible (topmost) mount
        point = _unescape(row[4])
        if point in done:
            continue
        done.add(point)
        flags = MS_REMOUNT | MS_BIND
        for option in row[5].split(b","):
            flags |= _OPTION_FLAGS.get(option, 0)
        flags |= (MS_NOSUID | MS_NODEV) if point == work else MS_RDONLY
        mount(None, point, None, flags)


def enter_program_context(cfg):
    """rlimits, privilege drop, no_new_privs, nonce from stdin, cwd; returns the nonce."""
    import resource

    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    ctypes, libc = _libc()
    if cfg["privilege"] == "capdrop":
        if libc.prctl(PR_SET_SECUREBITS, SECURE_ALL_NOROOT_LOCKED, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_SECUREBITS")
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: fine
        header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
        if libc.capset(header, data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    chunks = []
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(cfg["workdir"])
    return b"".join(chunks)


def _parse(argv):
    cfg = dict(zip(ARGS, argv))
    for key in ("uid", "gid", "status_fd", "sentinel_fd", "lifeline_fd"):
        cfg[key] = int(cfg[key]) if cfg[key] else None
    cfg["deadline_s"] = float(cfg["deadline_s"])
    cfg["rlimits"] = [(n, int(a), int(b)) for n, a, b in (r.split(":") for r in cfg["rlimits"].split(","))]
    return cfg


def _kill_everything(pid, cfg):
    """SIGKILL the program, everything in the run's cgroups and our process group, then exit."""
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    for group in filter(None, cfg["cgroups"].split(":")):
        try:
            with open(group + "/cgroup.procs") as f:
                members = [int(x) for x in f.read().split()]
        except OSError:
            continue
        for member in members:
            if member != os.getpid():
                try:
                    os.kill(member, signal.SIGKILL)
                except OSError:
                    pass
    os.killpg(0, signal.SIGKILL)  # includes this process: in a PID namespace that ends it all


def _supervise(pid, cfg):
    """Wait for the program; kill the whole run at its own deadline or when the caller goes away.

    The caller normally enforces the timeout itself. This is the second line: if the caller is
    killed (its end of the lifeline pipe closes) or stalls past ``deadline_s``, nothing of the run
    outlives it. Waits on a pidfd and the lifeline with ``select`` (no polling). Returns the raw
    wait status.
    """
    import select
    import time

    deadline = time.monotonic() + cfg["deadline_s"]
    lifeline = cfg["lifeline_fd"]
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernel < 5.3: plain wait, the caller's timeout still applies
        pidfd = None
    while pidfd is not None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _kill_everything(pid, cfg)
        ready, _, _ = select.select([pidfd, lifeline], [], [], remaining)
        if pidfd in ready:
            break
        if lifeline in ready:  # the caller never writes: readable means EOF, i.e. it is gone or done
            _kill_everything(pid, cfg)
    while True:
        try:
            got, status = os.waitpid(-1, 0)  # as PID 1 of a namespace, also reaps orphans
        except ChildProcessError:
            os._exit(SETUP_FAILED_EXIT)
        if got == pid:
            return status


def _setup_failed(status_fd, exc):
    os.write(status_fd, f"setup-error {exc!r}".encode())
    os._exit(SETUP_FAILED_EXIT)


def main():
    cfg = _parse(sys.argv[1:])
    status_fd, sentinel_fd = cfg["status_fd"], cfg["sentinel_fd"]
    sys.argv = [cfg["program"]]
    try:
        for group in filter(None, cfg["cgroups"].split(":")):
            with open(group + "/cgroup.procs", "w") as f:
                f.write("0")
        if cfg["mounts"]:
            hide = [os.fsencode(h) for h in filter(None, cfg["hide"].split(":"))]
            keep = [os.fsencode(k) for k in filter(None, cfg["keep"].split(":"))]
            make_filesystem_read_only(os.fsencode(cfg["workdir"]), hide, keep)
        pid = os.fork()
    except BaseException as exc:  # noqa: BLE001 - everything here is a sandbox failure
        _setup_failed(status_fd, exc)
    if pid:  # PID 1: watch the program, the deadline and the caller; report the program's status
        os.close(sentinel_fd)
        os.close(0)
        status = _supervise(pid, cfg)
        os.write(status_fd, b"exit %d" % status)
        os._exit(0)
    os.close(cfg["lifeline_fd"])
    try:
        nonce = enter_program_context(cfg)
        with open(cfg["program"], "rb") as f:
            source = f.read()
    except BaseException as exc:  # noqa: BLE001
        _setup_failed(status_fd, exc)
    os.close(status_fd)
    write = os.write
    import builtins

    code = compile(source, cfg["program"], "exec")
    del source, cfg
    exec(code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": builtins})  # noqa: S102 - the point
    write(sentinel_fd, nonce)  # reached only when the program (and its check(...)) returned


if __name__ == "__main__":
    main()
