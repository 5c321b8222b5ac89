"""In-sandbox bootstrap: run as a script (``python -s -P -S _sandbox_boot.py ARGS``), never imported.

:mod:`ida_eval.sandbox` starts this file, under ``unshare`` when namespaces are available, once per
program; a ProgramJob run by a root runner goes through :func:`serve` instead (one warm copy per
worker slot forks each program's sandbox and runs :func:`boot` in it). Standard library only, and
only cheap imports (no ``json``/``re``/``signal``/``subprocess``, which pull in ``enum`` and ``re``:
~25 ms of CPU per program, as much as a Node.js run): it runs once per program, 974 times per MBXP
pass.

1. As the first process of the new PID namespace ("PID 1"; still privileged) it joins the run's
   cgroups (``0`` written to each ``cgroup.procs``) and, with namespaces, builds the program's view
   of the file system (:func:`make_filesystem_read_only`): a fresh tmpfs of ``disk_bytes`` over the
   task root holds the work directory (its files copied in) and fresh writable ``/tmp``,
   ``/var/tmp`` and ``/dev/shm`` (the total disk cap; nothing reaches the host's disk); the
   caller's home, ``/run`` and the temp root are covered by empty file systems (keeping the
   interpreter's own directory visible); the host's unix sockets elsewhere are covered by
   ``/dev/null``; a fresh ``/proc``; then every other mount point is remounted read-only with
   ``MS_REMOUNT | MS_BIND | MS_RDONLY`` (per-mount flags: the host's mounts are untouched; locked
   flags such as ``nosuid`` are carried over so a user namespace may remount them).
2. It forks. PID 1 stays privileged, reaps every child and reports the program's raw wait status
   on the status pipe (``exit <status>``, plus `` disk-full`` when the task's tmpfs is full); the
   program cannot signal or ptrace it. It also kills
   the whole run by itself past ``deadline_s`` or as soon as the caller dies (the caller holds
   the write end of a "lifeline" pipe; its EOF means the caller is gone).
3. The child applies rlimits, drops privileges (per-worker uid, or every capability plus the
   ``SECBIT_NOROOT`` lock when it stays uid 0), sets ``no_new_privs``, installs a seccomp filter
   that denies new namespaces (:func:`deny_new_namespaces`), reads the nonce from stdin
   until EOF, replaces stdin with ``/dev/null``, compiles ``prog.py`` (bytes: encoding errors become
   the program's own ``SyntaxError``) and ``exec``s it as ``__main__``. Only if that returns does it
   write the nonce to the sentinel pipe.

A ProgramJob (another language) has no Python child: after step 1, PID 1 takes on the program's
identity and limits itself, makes itself unreachable to the program (not dumpable; signals from
inside the namespace never reach a PID 1 without handlers) and ``posix_spawn``s the job's compile
and run commands (see :func:`run_job`); steps 2 and 3 otherwise hold as written.

Any failure before the program starts is reported as ``setup-error <repr>`` on the status pipe,
so the caller can tell a broken sandbox from a failing program.
"""

import os
import sys

# Linux constants (uapi/linux/mount.h, prctl.h, capability.h, securebits.h)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 28, 38
SECURE_ALL_NOROOT_LOCKED = 0x2F  # NOROOT | NOROOT_LOCKED | NO_SETUID_FIXUP | its LOCKED | KEEP_CAPS_LOCKED
CAP_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3
SETUP_FAILED_EXIT = 125  # exit code when the sandbox itself could not be set up
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
# NEWTIME | NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NEW_ANY = 0x80 | CLONE_NEWNS | 0x02000000 | 0x04000000 | 0x08000000 | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
EPERM, ENOSYS = 1, 38
SIGKILL = 9  # Linux, every architecture (importing ``signal`` imports ``enum``)
# seccomp: per architecture (AUDIT_ARCH_*, clone, unshare, clone3, x32 syscall bit)
SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 56, 272, 435, 0x40000000),
    "aarch64": (0xC00000B7, 220, 97, 435, 0),
}
INODE_BYTES = 4096  # the task tmpfs allows one inode per this many bytes of its size
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
    "fresh",
    "sockets",
    "disk_bytes",
    "job",  # "" for a Python program; else a ProgramJob's JSON spec (see run_job)
)
LIST_SEP = "\n"  # separates the paths of the hide/keep/fresh/sockets lists (a path with a newline is skipped)
_OPTION_FLAGS = {
    b"nosuid": MS_NOSUID,
    b"nodev": MS_NODEV,
    b"noexec": MS_NOEXEC,
    b"noatime": MS_NOATIME,
    b"nodiratime": MS_NODIRATIME,
    b"relatime": MS_RELATIME,
}


_LOADED = {}  # what a job server prepares once for every run it forks (see serve)


def _libc():
    if "libc" not in _LOADED:
        import ctypes

        _LOADED["libc"] = ctypes, ctypes.CDLL(None, use_errno=True)
    return _LOADED["libc"]


def _unescape(field):
    """Undo /proc/self/mountinfo's octal escapes (the kernel escapes space, tab, newline, backslash)."""
    for esc, raw in ((b"\\040", b" "), (b"\\011", b"\t"), (b"\\012", b"\n"), (b"\\134", b"\\")):
        field = field.replace(esc, raw)
    return field


def make_filesystem_read_only(work, hide=(), keep=(), fresh=(), sockets=(), disk_bytes=0, owner=None):
    """Everything read-only except the task's own size-limited tmpfs; host sockets covered.

    Args:
        work: the work directory (bytes path). Inside, it is a directory of a fresh tmpfs of
            ``disk_bytes`` (mounted over its parent, the task root, on the host side nothing of
            the program's writes lands on disk and nothing needs cleaning up). What the caller
            put into the work directory (``prog.py``, any other sources) is copied into it,
            modes kept, owned by ``owner`` = (uid, gid) when given.
        hide: directories covered by an empty read-only tmpfs (the caller's home, /run with its
            sockets, the temp root, a non-searchable ancestor of the work directory).
        keep: paths under hidden directories that must stay visible at the same place (the
            interpreter's prefix): each is opened (``O_PATH``) before the hiding and bind-mounted
            back from ``/proc/self/fd/N`` on top of the empty tmpfs, whose new parent directories
            are world-searchable (so a per-worker uid gets through).
        fresh: directories replaced by a fresh, empty, writable (1777) directory of the task's
            tmpfs (``/tmp``, ``/var/tmp``, ``/dev/shm``): writable, private, inside the disk cap.
        sockets: unix socket paths of the host (from ``/proc/net/unix``) to cover with
            ``/dev/null`` (``connect`` then fails); socket files that are mount points are found
            in the mount table and covered too.
        disk_bytes: size of the task's tmpfs (and ``disk_bytes // INODE_BYTES`` inodes).
    """
    ctypes, libc = _libc()

    def mount(src, dst, fstype, flags, data=None):
        if libc.mount(src, dst, fstype, ctypes.c_ulong(flags), data) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {dst!r}: {os.strerror(err)}")

    import stat

    os.umask(0o022)  # directories made for mount points must be searchable by the per-worker uid
    given = _read_tree(work)
    task = os.path.dirname(work)
    size = b"size=%d,nr_inodes=%d,mode=0711" % (disk_bytes, max(64, disk_bytes // INODE_BYTES))
    mount(b"tmpfs", task, b"tmpfs", MS_NOSUID | MS_NODEV, size)
    tfd = os.open(task, os.O_PATH | os.O_DIRECTORY)
    os.mkdir(work, 0o700)
    if owner is not None:
        os.chown(work, *owner)
    for rel, mode, data in given:  # parents first (os.walk is top-down)
        path = os.path.join(work, rel)
        if data is None:
            os.mkdir(path, 0o700)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "wb") as f:
                f.write(data)
        os.chmod(path, stat.S_IMODE(mode))
        if owner is not None:
            os.chown(path, *owner)
    for i in range(len(fresh)):
        os.mkdir(b"%s/fresh%d" % (task, i))
        os.chmod(b"%s/fresh%d" % (task, i), 0o1777)
    held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in keep]
    for path in hide:
        mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=0755")
    for i, path in enumerate(fresh):
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(b"/proc/self/fd/%d/fresh%d" % (tfd, i), path, None, MS_BIND)
    for path, fd in held:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(b"/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
        os.close(fd)
    os.makedirs(work, mode=0o755, exist_ok=True)
    mount(b"/proc/self/fd/%d/%s" % (tfd, os.path.basename(work)), work, None, MS_BIND)
    os.close(tfd)

    for path in sockets:
        _cover_socket(path, mount)
    mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    with open("/proc/self/mountinfo", "rb") as f:
        rows = [line.split() for line in f.read().splitlines()]
    points = {_unescape(row[4]) for row in rows}
    for point in points:  # a socket bind-mounted from elsewhere (e.g. another network namespace)
        _cover_socket(point, mount)
    writable = {work, *fresh}
    done = set()
    for row in reversed(rows):  # the last row for a mount point is the visible (topmost) mount
        point = _unescape(row[4])
        if point in done:
            continue
        done.add(point)
        flags = MS_REMOUNT | MS_BIND
        for option in row[5].split(b","):
            flags |= _OPTION_FLAGS.get(option, 0)
        flags |= (MS_NOSUID | MS_NODEV) if point in writable else MS_RDONLY
        try:
            mount(None, point, None, flags)
        except OSError:
            if _mount_id(point) == int(row[0]):
                raise
            # else a mount covered by a later one (the task tmpfs under the fresh /tmp): unreachable


def _cover_socket(path, mount):
    """Bind ``/dev/null`` over ``path`` if it is a socket (``connect`` then fails). A socket unlinked between
    the look and the mount (its server ended: ENOENT; the name now a directory: ENOTDIR) has nothing left to
    cover; any other failure is the sandbox's and raises."""
    import stat

    try:
        is_socket = stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return
    if is_socket:
        try:
            mount(b"/dev/null", path, None, MS_BIND)
        except (FileNotFoundError, NotADirectoryError):
            pass


def _mount_id(path):
    """The id of the mount that ``path`` resolves to (as in /proc/self/mountinfo), or None."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with open(b"/proc/self/fdinfo/%d" % fd, "rb") as f:
            for line in f:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    finally:
        os.close(fd)
    return None


def _read_tree(top):
    """``[(relative path, mode, bytes or None for a directory)]`` under ``top``, parents first
    (regular files and directories only: what a caller puts into a work directory)."""
    import stat

    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        rel = os.path.relpath(dirpath, top)
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            relpath = os.path.normpath(os.path.join(rel, name))
            if stat.S_ISDIR(st.st_mode):
                out.append((relpath, st.st_mode, None))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    out.append((relpath, st.st_mode, f.read()))
    return out


def deny_new_namespaces():
    """A seccomp filter: ``clone``/``unshare`` with any ``CLONE_NEW*`` flag fail with EPERM (above
    all ``CLONE_NEWUSER``: inside a new user namespace an unprivileged program could make mount and
    network namespaces; the others matter for a program that runs as root in the ``rlimits``
    fallback), ``clone3`` (whose flags a filter cannot read) with ENOSYS (libc then falls back to
    ``clone``), and every system call of a foreign ABI (i386, x32) with ENOSYS. Needs
    ``no_new_privs``.

    Returns False where it cannot be installed (unknown architecture, kernel without seccomp).
    """
    fprog = _seccomp_program()
    if fprog is None:
        return False
    ctypes, libc = _libc()
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


def _seccomp_program():
    """The filter of :func:`deny_new_namespaces` as a ``sock_fprog`` (None: unknown architecture)."""
    if "seccomp" in _LOADED:
        return _LOADED["seccomp"]
    arch = SECCOMP_ARCHES.get(os.uname().machine)
    if arch is None:
        return None
    audit_arch, nr_clone, nr_unshare, nr_clone3, x32_bit = arch
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno_ret = 0x7FFF0000, 0x00050000
    prog = [
        (ld, 0, 0, 4),  # A = arch
        (jeq, 1, 0, audit_arch),
        (ret, 0, 0, errno_ret | ENOSYS),  # foreign ABI
        (ld, 0, 0, 0),  # A = syscall number
        (jge, 0, 1, x32_bit or 0xFFFFFFFF),
        (ret, 0, 0, errno_ret | ENOSYS),  # x32 ABI
        (jeq, 0, 1, nr_clone3),
        (ret, 0, 0, errno_ret | ENOSYS),
        (jeq, 1, 0, nr_clone),
        (jeq, 0, 3, nr_unshare),
        (ld, 0, 0, 16),  # A = low 32 bits of args[0] (flags of clone and unshare)
        (jset, 0, 1, CLONE_NEW_ANY),
        (ret, 0, 0, errno_ret | EPERM),
        (ret, 0, 0, allow),
    ]
    ctypes, _ = _libc()

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(prog))(*[SockFilter(*row) for row in prog])
    _LOADED["seccomp"] = SockFprog(len(prog), filters)  # (it keeps a reference to filters)
    return _LOADED["seccomp"]


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
    deny_new_namespaces()  # best effort: the isolation probe reports whether it holds
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
    cfg = dict(zip(ARGS, argv, strict=True))
    for key in ("uid", "gid", "status_fd", "sentinel_fd", "lifeline_fd"):
        cfg[key] = int(cfg[key]) if cfg[key] else None
    cfg["deadline_s"] = float(cfg["deadline_s"])
    cfg["disk_bytes"] = int(cfg["disk_bytes"])
    for key in ("hide", "keep", "fresh", "sockets"):
        cfg[key] = [os.fsencode(p) for p in cfg[key].split(LIST_SEP) if p]
    cfg["rlimits"] = [(n, int(a), int(b)) for n, a, b in (r.split(":") for r in cfg["rlimits"].split(","))]
    return cfg


def _kill_everything(pid, cfg):
    """SIGKILL the program, everything in the run's cgroups and our process group, then exit."""
    try:
        os.kill(pid, SIGKILL)
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
                    os.kill(member, SIGKILL)
                except OSError:
                    pass
    os.killpg(0, SIGKILL)  # includes this process: in a PID namespace that ends it all


def _supervise(pid, cfg, until=None):
    """Wait for process ``pid``; kill the whole run at its own deadline or when the caller goes away.

    The caller normally enforces the timeout itself. This is the second line: if the caller is
    killed (its end of the lifeline pipe closes) or stalls past the run's deadline (``deadline_s``
    after the bootstrap started), nothing of the run outlives it. Waits on a pidfd and the
    lifeline with ``select`` (no polling). Returns the raw wait status, or None once the monotonic
    time ``until`` (a step's own limit, e.g. a compile timeout) has passed with ``pid`` running.
    """
    import select
    import time

    lifeline = cfg["lifeline_fd"]
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernel < 5.3: plain wait, the caller's timeout still applies
        pidfd = None
    while pidfd is not None:
        now = time.monotonic()
        if now >= cfg["deadline"]:
            _kill_everything(pid, cfg)
        if until is not None and now >= until:
            os.close(pidfd)
            return None
        limit = cfg["deadline"] if until is None else min(until, cfg["deadline"])
        ready, _, _ = select.select([pidfd, lifeline], [], [], limit - now)
        if pidfd in ready:
            os.close(pidfd)
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


def _disk_full(cfg):
    """Whether the task's tmpfs ran out of space or inodes (the program hit its disk cap)."""
    if not cfg["mounts"]:
        return False
    try:
        st = os.statvfs(cfg["workdir"])
    except OSError:
        return False
    return st.f_bavail == 0 or st.f_favail == 0


def run_job(cfg):
    """PID 1 runs a ProgramJob (another language) itself, step by step; never returns.

    It takes on the program's identity and limits (:func:`enter_program_context`: rlimits, uid or
    capabilities, ``no_new_privs``, the seccomp filter), makes itself unreachable to the program
    (:func:`_guard_pid1`), and starts each step with ``posix_spawn`` (``vfork`` + ``exec``: no
    copy of this interpreter, whose fork cost ~1 ms of CPU per program). The compile command runs
    in its own session with stdout + stderr to the job's log; past its ``compile_timeout`` its
    process group is killed (anything that escaped it dies with the PID namespace).
    ``compiled <wait status> <1 if it counts as compiled else 0>;`` or ``compile-timeout;`` goes to
    the status pipe. After a successful compile the run command starts with the nonce waiting in a
    pipe on stdin (the test driver copies it to stdout after its last check); its wait status is
    reported as ``exit <status>``, as for a Python program.
    """
    import marshal
    import time

    job = marshal.loads(bytes.fromhex(cfg["job"]))  # ProgramJob.spec()
    status_fd = cfg["status_fd"]
    try:
        os.close(cfg["sentinel_fd"])
        for fd in (status_fd, cfg["lifeline_fd"]):
            os.set_inheritable(fd, False)  # the steps get 0-2 only
        nonce = enter_program_context(cfg)
        _guard_pid1()
    except BaseException as exc:  # noqa: BLE001
        _setup_failed(status_fd, exc)
    if job["compile"]:
        with open(job["log"], "wb") as log:
            pid = _spawn_step(
                job["compile"], [(os.POSIX_SPAWN_DUP2, log.fileno(), 1), (os.POSIX_SPAWN_DUP2, log.fileno(), 2)]
            )
        if pid is None:  # the compiler is not there (or not executable): an ordinary failure
            os.write(status_fd, b"compiled %d 0;" % (127 << 8))
            _report_exit(cfg, 127 << 8)
        status = _supervise(pid, cfg, until=time.monotonic() + job["compile_timeout"])
        try:
            os.killpg(pid, SIGKILL)  # on a timeout the compiler, else a daemon it left in its session
        except OSError:
            pass
        if status is None:
            _supervise(pid, cfg)
            os.write(status_fd, b"compile-timeout;")
            _report_exit(cfg, 124 << 8)
        code = os.waitstatus_to_exitcode(status)
        ok = code in job["compile_ok"] and (
            not job["compile_output_file"] or os.path.isfile(job["compile_output_file"])
        )
        os.write(status_fd, b"compiled %d %d;" % (status, ok))
        if not ok:  # the compiler's first lines go to stderr (the work dir is private to the sandbox)
            with open(job["log"], "rb") as log:
                os.write(2, log.read(job["compile_output_bytes"]))
            _report_exit(cfg, (code if code > 0 else 1) << 8)
    r, w = os.pipe()
    os.write(w, nonce)
    os.close(w)
    pid = _spawn_step(job["run"], [(os.POSIX_SPAWN_DUP2, r, 0)], setsid=False)
    os.close(r)
    _report_exit(cfg, 127 << 8 if pid is None else _supervise(pid, cfg))


def _spawn_step(argv, actions, setsid=True):
    """``posix_spawnp`` one step of a job (PATH and environment: ours); None (and a line on stderr)
    if it cannot be started."""
    try:
        return os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions, setsid=setsid)
    except OSError as exc:
        os.write(2, ("cannot run %s: %s\n" % (argv[0], exc.strerror)).encode())
        return None


def _guard_pid1():
    """Keep the program, which now has our uid, from reaching us: not dumpable (no ``ptrace``, no
    ``/proc/1/mem`` or ``fd``), and SIGINT back to its default, which PID 1 of a namespace never
    receives from the namespace's members (Python's own handler would let them raise
    ``KeyboardInterrupt`` in us). ``exec`` makes each step dumpable again, as usual."""
    import _signal

    ctypes, libc = _libc()
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE")
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)


def _report_exit(cfg, status):
    """PID 1's last words: the program's raw wait status (and whether the disk cap was hit)."""
    os.write(cfg["status_fd"], b"exit %d%s" % (status, b" disk-full" if _disk_full(cfg) else b""))
    os._exit(0)


def _setup_failed(status_fd, exc):
    os.write(status_fd, f"setup-error {exc!r}".encode())
    os._exit(SETUP_FAILED_EXIT)


def boot(cfg):
    """Steps 1-3 of the module docstring for one program (the caller is PID 1 of its namespaces)."""
    import time

    cfg["deadline"] = time.monotonic() + cfg["deadline_s"]
    status_fd, sentinel_fd = cfg["status_fd"], cfg["sentinel_fd"]
    sys.argv = [cfg["program"]]
    try:
        for group in filter(None, cfg["cgroups"].split(":")):
            with open(group + "/cgroup.procs", "w") as f:
                f.write("0")
        if cfg["mounts"]:
            make_filesystem_read_only(
                os.fsencode(cfg["workdir"]),
                cfg["hide"],
                cfg["keep"],
                cfg["fresh"],
                cfg["sockets"],
                cfg["disk_bytes"],
                (cfg["uid"], cfg["gid"]) if cfg["uid"] is not None else None,
            )
        if not cfg["job"]:
            pid = os.fork()
    except BaseException as exc:  # noqa: BLE001 - everything here is a sandbox failure
        _setup_failed(status_fd, exc)
    if cfg["job"]:
        run_job(cfg)
    if pid:  # PID 1: watch the program, the deadline and the caller; report the program's status
        os.close(sentinel_fd)
        os.close(0)
        _report_exit(cfg, _supervise(pid, cfg))
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
    exec(code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": builtins})  # the point
    write(sentinel_fd, nonce)  # reached only when the program (and its check(...)) returned


# ---------------------------------------------------------------------------------------------
# The job server: one per worker slot, forks every ProgramJob's sandbox from a warm interpreter


def serve(sock_fd):
    """Answer run requests on the unix socket ``sock_fd`` until the caller closes it.

    A request is one message: ``marshal`` data ``{"argv": [...ARGS values], "env": {...},
    "unshare": flags}`` with six descriptors (the program's stdin, stdout, stderr, then the
    sentinel, status and lifeline pipes). For each we ``unshare(CLONE_NEWPID)`` and fork: the child
    is PID 1 of a new PID namespace (and dies with us: ``PR_SET_PDEATHSIG``); then ``setns`` takes
    us back to forking into our own. The child does what ``unshare --fork --kill-child
    --propagation private`` plus ``subprocess.Popen(..., start_new_session=True, env=..., cwd=...)``
    did for a bootstrap started per program: a new session, the descriptors as 0-2, the
    environment, ``unshare`` of the other namespaces, mount propagation private, then
    :func:`boot`. We answer ``started <pid>`` with a pidfd of that PID 1 (killing it ends the
    namespace), then ``exit <raw wait status>``. (No session leader between us and PID 1, as
    ``unshare(1)`` has: each fork of a Python process costs ~1 ms of CPU here.) One
    request at a time: a slot runs one program at a time. ``CLONE_NEWNET`` is done once, by the
    server itself: its runs share one empty network namespace (loopback down), one run after
    another, as a new one per run costs the kernel milliseconds to make and tear down. The modules
    and the seccomp filter every run's bootstrap needs are loaded here once.
    """
    import gc
    import marshal
    import resource  # noqa: F401 - imported once here for every run's bootstrap (see boot)
    import select  # noqa: F401
    import socket
    import stat  # noqa: F401
    import time  # noqa: F401

    ctypes, libc = _libc()
    _seccomp_program()
    gc.freeze()  # what is loaded now is never collected: forks don't copy its pages for the collector
    own_net = False
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    sock = socket.socket(fileno=sock_fd)
    with open("/proc/self/oom_score_adj", "rb") as f:
        own_score = f.read().strip()
    try:  # its cgroups' OOM killer then picks a run's process, never the server
        _oom_score_adj(b"-1000")
    except OSError:  # no CAP_SYS_RESOURCE (some containers): the server is small, rarely the pick
        own_score = None
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 6)
        except OSError:
            os._exit(0)
        if not msg:  # the caller closed its end (or died): nothing of ours outlives it
            os._exit(0)
        req = marshal.loads(msg)
        if req["unshare"] & CLONE_NEWNET:  # one network namespace (empty, loopback down) for all runs
            own_net = own_net or libc.unshare(CLONE_NEWNET) == 0  # of this slot (else: per run)
            if own_net:
                req["unshare"] &= ~CLONE_NEWNET
        if libc.unshare(CLONE_NEWPID) != 0:  # our next child is PID 1 of a new PID namespace
            err = ctypes.get_errno()
            for fd in fds:
                os.close(fd)
            sock.send(b"failed unshare(CLONE_NEWPID): %s" % os.strerror(err).encode())
            continue
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                _served_pid1(req, fds, own_score)
            finally:  # never back into the server's loop
                os._exit(SETUP_FAILED_EXIT)
        if libc.setns(own_pid_ns, CLONE_NEWPID) != 0:  # our later children: back in our own
            os._exit(SETUP_FAILED_EXIT)  # (cannot fail for root; if it did, no run could start)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(sock, [b"started %d" % pid], [pidfd])
        finally:
            os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        try:
            sock.send(b"exit %d" % status)
        except OSError:
            os._exit(0)


def _oom_score_adj(value):
    with open("/proc/self/oom_score_adj", "wb") as f:
        f.write(value)


def _served_pid1(req, fds, score):
    """PID 1 of one served program's new PID namespace (see :func:`serve`); never returns."""
    try:
        cfg = _parse(req["argv"])
        stdin, stdout, stderr, cfg["sentinel_fd"], cfg["status_fd"], cfg["lifeline_fd"] = fds
        ctypes, libc = _libc()
        if libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0:  # the server's end is ours
            raise OSError(ctypes.get_errno(), "PR_SET_PDEATHSIG")
        if score is not None:
            _oom_score_adj(score)
        os.setsid()
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(cfg["workdir"])
        os.environ.clear()
        os.environ.update(req["env"])
        flags = req["unshare"] & ~CLONE_NEWPID
        if flags and libc.unshare(flags) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        if flags & CLONE_NEWNS and libc.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None):
            raise OSError(ctypes.get_errno(), "mount propagation private")
    except BaseException as exc:  # noqa: BLE001 - the sandbox could not be set up
        _setup_failed(fds[4], exc)
    boot(cfg)  # ends in exec or _exit


def main():
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]))
    boot(_parse(sys.argv[1:]))


if __name__ == "__main__":
    main()
