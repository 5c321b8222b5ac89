"""Hostile programs against ida_eval.sandbox: each must fail (or be contained) and leave nothing behind.

Every test runs real programs in real sandboxed interpreters. After each one the ``clean`` fixture
checks that no process carrying the test's marker survives, that no work directory is left in the
test's tmp root, and that no cgroup of ours remains.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ida_eval import cleanup, isolation, sandbox_types
from ida_eval import sandbox as sb
from ida_eval.cgroups import cgroup_parents, cgroup_support, leftover_groups
from ida_eval.cleanup import remove_tree
from tests.conftest import processes_with

FAST = sb.SandboxLimits(timeout=3.0, memory_bytes=1 << 30)


@pytest.fixture(scope="module")
def iso() -> isolation.Isolation:
    return isolation.probe_isolation()


@pytest.fixture
def marker() -> str:
    """A unique, valid extra ``sleep`` interval (GNU sleep sums its arguments): ``sleep 300 MARKER``
    runs 300 s and carries the marker in its command line, where /proc finds it."""
    return f"0.{secrets.randbelow(10**12):012d}7"


WAIT_FOR_MARKER = """
def wait_for(marker, n=1):
    import os, time
    for _ in range(200):
        seen = 0
        for pid in os.listdir('/proc'):
            try:
                seen += marker.encode() in open(f'/proc/{pid}/cmdline', 'rb').read()
            except (OSError, ValueError):
                pass
        if seen >= n:
            print('up', seen, flush=True)
            return
        time.sleep(0.01)
"""
"""Program prelude: wait until ``n`` processes carrying the marker run (a positive control)."""


@pytest.fixture
def clean(tmp_path: Path, marker: str):
    """Yields a tmp root for work dirs; afterwards checks nothing of the run survives."""
    root = tmp_path / "work"
    root.mkdir()
    yield str(root)
    deadline = time.monotonic() + 2.0
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == [], "a process of the sandboxed program survived"
    assert list(root.iterdir()) == [], "work directory left behind"
    sb.close_job_servers()  # ProgramJobs' per-slot servers live on (a cache): their groups go with them
    assert leftover_groups() == [], "cgroups left behind"


def needs_namespaces(iso: isolation.Isolation) -> None:
    if not iso.uses_namespaces:
        pytest.skip(f"kernel namespaces unavailable here (isolation in force: {iso.description})")


def run(src: str, root: str, limits: sb.SandboxLimits = FAST, **kw) -> sb.SandboxResult:
    kw.setdefault("isolation", isolation.probe_isolation())  # the strongest that works here (probed once)
    return sb.run_program(textwrap.dedent(src), limits, tmp_root=root, **kw)


# ------------------------------------------------------------------ the basic contract


def daemon_program(marker: str) -> str:
    """A program that leaves a daemonized grandchild (double fork + setsid) running ``sleep ... marker``."""
    return WAIT_FOR_MARKER + textwrap.dedent(f"""
    import os
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp('sleep', ['sleep', '300', '{marker}'])
        os._exit(0)
    os.wait()
    wait_for('{marker}')
    """)


def test_plain_program_passes_and_reports(clean: str, iso: isolation.Isolation) -> None:
    res = run("print('hello'); assert sum(range(10)) == 45", clean)
    assert res.passed and res.finished and res.exit_status == 0 and not res.timed_out
    assert res.stdout_tail == "hello\n"
    assert res.output_bytes == 6


def test_the_largest_accepted_timeout_runs(clean: str) -> None:
    """MAX_TIMEOUT_S (check_seconds' bound) reaches the CPU rlimit and the supervisor's deadline as a
    usable limit (inf and 1e300 did not: an internal error and a failed sandbox set-up)."""
    res = run("print('ok')", clean, dataclasses.replace(FAST, timeout=sandbox_types.MAX_TIMEOUT_S))
    assert res.passed and res.stdout_tail == "ok\n"


def test_exception_fails_with_traceback(clean: str) -> None:
    res = run("def f():\n    raise KeyError('boom')\nf()", clean)
    assert not res.passed and not res.finished and res.exit_status == 1
    assert res.stderr_tail.rstrip().endswith("KeyError: 'boom'")


@pytest.mark.parametrize(
    "src, passed, error",
    [
        ("x = 1\x00", False, "SyntaxError"),  # NUL byte
        ('x = "\ud800"', False, "SyntaxError"),  # lone surrogate: invalid UTF-8 on disk
        ('assert "é€😀" == "\\u00e9\\u20ac\\U0001f600"', True, ""),
        ("\t\nif True:\n\tx = 1\nassert x == 1", True, ""),  # tabs are kept as they are
    ],
    ids=["nul", "surrogate", "unicode", "tabs"],
)
def test_odd_source_text_is_a_program_result_not_a_crash(src: str, passed: bool, error: str, clean: str) -> None:
    res = run(src, clean)
    assert res.passed is passed
    assert error in res.stderr_tail


@pytest.mark.parametrize(
    "src",
    [
        "import sys\nsys.exit(0)\nassert False",
        "import os\nos._exit(0)\nassert False",
        "raise SystemExit(0)\nassert False",
        # atexit handler that would turn a failing run into status 0
        "import atexit, os\natexit.register(lambda: os._exit(0))\nassert 1 == 2",
        # exit from inside the test function, after one assertion ran
        "def check(c):\n    assert c(1) == 1\n    import sys; sys.exit(0)\n    assert c(2) == 3\ncheck(lambda x: x)",
        # the process replaces itself with a program that exits 0
        "import os\nos.execv('/bin/true', ['true'])",
        # the forked child exits 0 first; the parent is killed
        "import os, signal\nif os.fork() == 0:\n    os._exit(0)\nos.kill(os.getpid(), signal.SIGKILL)",
    ],
    ids=["sys.exit", "os._exit", "SystemExit", "atexit", "exit-in-check", "execv", "fork-exit"],
)
def test_early_exit_tricks_never_pass(src: str, clean: str) -> None:
    res = run(src, clean)
    assert not res.passed
    assert not res.finished


def test_atexit_cannot_fake_status_after_real_failure_and_success_needs_status0(clean: str) -> None:
    # check() returned, but the program then exits non-zero from an atexit handler: not a pass
    res = run("import atexit, os\natexit.register(lambda: os._exit(3))\nassert True", clean)
    assert res.finished and res.exit_status == 3 and not res.passed


def test_nonce_is_invisible_to_the_program(clean: str, monkeypatch: pytest.MonkeyPatch) -> None:
    known = "d1e2a3d4b5e6e7f8" * 2  # make the per-run nonce known to the test only
    monkeypatch.setattr(sb, "_new_nonce", lambda: known.encode())
    src = """
    import os, sys
    print(repr(sys.argv), repr(dict(os.environ)))
    for pid in os.listdir('/proc'):
        for what in ('cmdline', 'environ'):
            try:
                print(open(f'/proc/{pid}/{what}', 'rb').read())
            except OSError:
                pass
    for name in os.listdir('.'):
        print(open(name, 'rb').read())
    """
    res = run(src, clean, sb.SandboxLimits(timeout=3.0, memory_bytes=1 << 30, tail_bytes=1 << 20))
    assert res.passed  # the known nonce was used and came back
    assert "PATH" in res.stdout_tail and known not in res.stdout_tail


# ------------------------------------------------------------------ time


@pytest.mark.parametrize(
    "src",
    [
        "while True:\n    pass",
        "sum(range(10**12))",  # C-level loop, never returns to the eval loop's signal checks
        "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')",  # catastrophic backtracking in C
        "x = 10 ** (10 ** 9)",  # C-level bignum
    ],
    ids=["python-loop", "sum-range", "regex-backtracking", "bignum"],
)
@pytest.mark.slow
def test_infinite_loops_time_out(src: str, clean: str) -> None:
    limits = sb.SandboxLimits(timeout=2.0, memory_bytes=1 << 30)
    t0 = time.monotonic()
    res = run(src, clean, limits)
    took = time.monotonic() - t0
    assert res.timed_out and not res.passed
    assert 2.0 <= took < 6.0


def test_timeout_kills_whole_tree(clean: str, marker: str) -> None:
    src = f"""
    import subprocess
    subprocess.Popen(['sleep', '300', '{marker}'])
    subprocess.Popen(['sh', '-c', 'sleep 301; : {marker}'])
    wait_for('{marker}', 2)
    while True:
        pass
    """
    res = run(WAIT_FOR_MARKER + textwrap.dedent(src), clean, sb.SandboxLimits(timeout=2.0, memory_bytes=1 << 30))
    assert res.timed_out
    assert res.stdout_tail.startswith("up")
    assert processes_with(marker) == []  # checked again (with a grace period) by `clean`


def test_daemonized_grandchild_does_not_survive(clean: str, marker: str, iso: isolation.Isolation) -> None:
    src = daemon_program(marker)
    res = run(src, clean)
    assert res.passed  # the program itself finished normally, with its daemon running ...
    assert res.stdout_tail.startswith("up")
    deadline = time.monotonic() + 2.0
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []  # ... and its daemon is gone


RUNNER = """
import sys, types
pkg = types.ModuleType("ida_eval")  # import the sandbox without the package's heavy __init__
pkg.__path__ = [{pkg_dir!r}]
sys.modules["ida_eval"] = pkg
from ida_eval import isolation, sandbox
sandbox.run_program({src!r}, sandbox.SandboxLimits(timeout=120.0), isolation=isolation.probe_isolation())
"""


def test_a_killed_runner_takes_its_programs_with_it(marker: str) -> None:
    src = f"import subprocess\nsubprocess.Popen(['sleep', '300', '{marker}'])\nwhile True: pass"
    code = RUNNER.format(pkg_dir=str(Path(sb.__file__).parent), src=src)
    runner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
    sleeper = f"300\0{marker}"  # the sleep's argv, not the runner's (nor its forks' before they exec)
    try:
        deadline = time.monotonic() + 30
        while not processes_with(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(sleeper), "the program never started"
    finally:
        runner.kill()  # SIGKILL: no cleanup code of the runner runs
        runner.wait()
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []  # PID 1 saw the lifeline close and killed the run
    sb.sweep_stale()  # (another runner on this machine may have swept them already: same effect)
    tag = f"ida-exec-{runner.pid}-"
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(tag)], "work dir left behind"
    assert not [g for parent in cgroup_parents() for g in os.listdir(parent) if g.startswith(tag)]


def test_killing_the_parent_does_not_hurt_the_runner(clean: str) -> None:
    src = """
    import os, signal
    for target in (os.getppid(), 1, -1, 0):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
    assert 2 + 2 == 4
    """
    res = run(src, clean)
    # we are still here; the result is a well-formed verdict either way
    assert res.exit_status is not None or res.timed_out
    assert not res.timed_out


# ------------------------------------------------------------------ resources


def test_fork_bomb_is_contained(clean: str, marker: str, iso: isolation.Isolation) -> None:
    if os.geteuid() == 0 and iso.privilege != "setuid" and cgroup_support().pids_parent is None:
        pytest.skip("uid 0 without a pids cgroup: no process cap exists here (RLIMIT_NPROC exempts root)")
    src = f"""
    import os, sys
    sys.argv[0] = '{marker}'
    n = 0
    while True:
        try:
            if os.fork() == 0:
                os.execvp('sleep', ['sleep', '300', '{marker}'])
            n += 1
        except OSError:
            break
    print(n)
    assert n < 64
    """
    res = run(src, clean, sb.SandboxLimits(timeout=5.0, memory_bytes=1 << 30, max_processes=32))
    assert res.passed, res.stderr_tail  # fork() failed before 64 processes: the cap held
    assert int(res.stdout_tail.strip()) < 32


def test_memory_bomb_fails_with_memory_error(clean: str) -> None:
    res = run("x = bytearray(8 * 2**30)", clean, sb.SandboxLimits(timeout=5.0, memory_bytes=512 << 20))
    assert not res.passed and "MemoryError" in res.stderr_tail


def test_growing_memory_bomb_fails(clean: str) -> None:
    src = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))"
    res = run(src, clean, sb.SandboxLimits(timeout=5.0, memory_bytes=512 << 20))
    assert not res.passed and not res.timed_out and "MemoryError" in res.stderr_tail


def test_memory_of_the_whole_tree_is_bounded(clean: str) -> None:
    if cgroup_support().memory_parent is None:
        pytest.skip("no writable memory cgroup here: only the per-process RLIMIT_AS applies")
    # each child stays under RLIMIT_AS (768 MiB), together they exceed the tree's 768 MiB
    src = """
    import os, time
    kids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            block = b'x' * (300 << 20)
            time.sleep(1.0)
            os._exit(0)
        kids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids]
    print(codes)
    assert all(c == 0 for c in codes)
    """
    res = run(src, clean, sb.SandboxLimits(timeout=10.0, memory_bytes=768 << 20))
    assert not res.passed and res.oom_killed
    assert "-9" in res.stdout_tail  # a child was OOM-killed inside the group


def test_output_flood_is_capped_and_killed(clean: str) -> None:
    limits = sb.SandboxLimits(timeout=10.0, memory_bytes=1 << 30, max_output_bytes=2 << 20, tail_bytes=1000)
    t0 = time.monotonic()
    res = run(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 100)", clean, limits
    )
    assert res.output_exceeded and not res.passed
    assert len(res.stdout_tail) <= 1000 and len(res.stderr_tail) <= 1000
    assert time.monotonic() - t0 < 8.0


def test_file_size_limit(clean: str) -> None:
    limits = sb.SandboxLimits(timeout=5.0, memory_bytes=1 << 30, file_size_bytes=1 << 20)
    res = run("open('big.bin', 'wb').write(b'0' * (4 << 20))", clean, limits)
    assert not res.passed
    assert "File too large" in res.stderr_tail or res.exit_status == -25  # EFBIG or SIGXFSZ


def test_open_files_limit(clean: str) -> None:
    limits = sb.SandboxLimits(timeout=5.0, memory_bytes=1 << 30, open_files=32)
    res = run("fs = [open('/dev/null') for _ in range(100)]", clean, limits)
    assert not res.passed and "Too many open files" in res.stderr_tail


# ------------------------------------------------------------------ file system, network, secrets


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A fresh directory outside the temp dir, /run and home: visible, read-only, inside the sandbox.

    Beside the tests when the checkout itself is visible inside; a checkout under /tmp or home
    (a CI clone may live there) is hidden, so another host directory is used, or the test skips."""
    hidden, _, fresh = sb._hidden_paths(os.path.join(tempfile.gettempdir(), "ida-exec-probe", "work"))
    for parent in (Path(__file__).resolve().parent, Path("/srv"), Path("/opt"), Path("/var/lib")):
        if parent.is_dir() and os.access(parent, os.W_OK) and not sb._under(str(parent), hidden + fresh):
            break
    else:
        pytest.skip("no writable host directory outside the sandbox's hidden and fresh ones")
    d = parent / f".ida-host-{secrets.token_hex(4)}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d)


def test_writes_outside_the_directory_are_blocked(
    clean: str, tmp_path: Path, host_dir: Path, iso: isolation.Isolation
) -> None:
    needs_namespaces(iso)
    victim = host_dir / "victim.txt"  # visible inside, read-only
    victim.write_text("original")
    tmp_victim = tmp_path / "victim.txt"  # in the host's temp dir: not even visible inside
    tmp_victim.write_text("original")
    targets = [host_dir / "new-0.txt", host_dir / "new-1.txt", tmp_path / "new-2.txt", tmp_path / "new-3.txt"]
    shm = Path("/dev/shm") / f"ida-test-{secrets.token_hex(4)}"
    src = f"""
    import os, subprocess
    blocked = 0
    attempts = [
        lambda: open({str(victim)!r}, 'a').write('pwned'),
        lambda: open({str(targets[0])!r}, 'w').write('x'),
        lambda: os.unlink({str(victim)!r}),
    ]
    for attempt in attempts:
        try:
            attempt()
        except OSError:
            blocked += 1
    for attempt in (  # private /tmp and /dev/shm: these may succeed, but never on the host
        lambda: open({str(tmp_victim)!r}, 'a').write('pwned'),
        lambda: os.unlink({str(tmp_victim)!r}),
        lambda: open({str(shm)!r}, 'w').write('x'),
    ):
        try:
            attempt()
        except OSError:
            pass
    # through a shell (subprocess) and through posix_spawn (the reliability_guard escape)
    subprocess.run(['sh', '-c', 'echo x > {targets[1]}; echo x >> {victim}; echo x >> {tmp_victim}'])
    pid = os.posix_spawn('/bin/sh', ['sh', '-c', 'echo x > {targets[2]}'], {{}})
    os.waitpid(pid, 0)
    os.system('touch {targets[3]}')
    # our own directory stays writable
    open('mine.txt', 'w').write('ok')
    assert open('mine.txt').read() == 'ok'
    print(blocked)
    """
    res = run(src, clean)
    assert res.passed, res.stderr_tail
    assert res.stdout_tail.strip() == "3"
    assert victim.read_text() == "original" and tmp_victim.read_text() == "original"
    assert not any(t.exists() for t in targets)
    assert not shm.exists()


def test_work_directory_with_odd_characters_stays_writable(tmp_path: Path, iso: isolation.Isolation) -> None:
    root = tmp_path / "dir with space\tand tab é"
    root.mkdir()
    res = sb.run_program(
        "open('f.txt', 'w').write('x' * 10)\nimport os\nassert os.path.getsize('f.txt') == 10",
        FAST,
        tmp_root=str(root),
        isolation=iso,
    )
    assert res.passed, res.stderr_tail
    assert list(root.iterdir()) == []


def test_no_network_to_a_local_listener(clean: str, iso: isolation.Isolation) -> None:
    needs_namespaces(iso)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    t = threading.Thread(target=accept)
    t.start()
    src = f"""
    import socket
    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)
    s.sendall(b'stolen')
    """
    try:
        res = run(src, clean)
    finally:
        time.sleep(0.3)  # a connection that got through would be accepted by now
        stop.set()
        t.join()
        server.close()
    assert not res.passed
    assert accepted == []
    assert "OSError" in res.stderr_tail or "Error" in res.stderr_tail


def test_caller_environment_secrets_are_invisible(clean: str, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    monkeypatch.setenv("IDA_TEST_SECRET", secret)
    src = """
    import os
    print(dict(os.environ))
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            try:
                print(open(f'/proc/{pid}/environ', 'rb').read())
            except OSError:
                pass
    """
    res = run(src, clean, sb.SandboxLimits(timeout=3.0, memory_bytes=1 << 30, tail_bytes=1 << 20))
    assert res.passed
    assert "IDA_TEST_SECRET" not in res.stdout_tail and secret not in res.stdout_tail
    assert "PATH" in res.stdout_tail  # the program did print its environment


def test_environment_is_minimal_and_deterministic(clean: str) -> None:
    src = "import os, sys\nprint(sorted(os.environ), sys.flags.hash_randomization, hash('abc'))"
    a = run(src, clean)
    b = run(src, clean)
    assert a.passed and a.stdout_tail == b.stdout_tail  # PYTHONHASHSEED=0: same string hashes
    assert "HOME" in a.stdout_tail and "PYTHONHASHSEED" in a.stdout_tail


def test_namespaces_are_used_whenever_the_kernel_allows_them(iso: isolation.Isolation) -> None:
    # independent oracle: can plain unshare(1) create these namespaces here?
    cmd = ["unshare", "--net", "--pid", "--fork", "--mount", "true"]
    if os.geteuid() != 0:
        cmd[1:1] = ["--user", "--map-root-user"]
    try:
        works = subprocess.run(cmd, capture_output=True, timeout=30, check=False).returncode == 0
    except FileNotFoundError:
        works = False
    if not works:
        pytest.skip("unshare cannot create namespaces on this machine")
    assert iso.uses_namespaces, iso.description


def test_callers_home_and_run_are_hidden(clean: str, iso: isolation.Isolation) -> None:
    needs_namespaces(iso)
    home = Path.home().resolve()
    outside = sorted(p.name for p in home.iterdir()) if home.is_dir() else []
    src = f"""
    import os, sys
    print(sorted(os.listdir({str(home)!r})) if os.path.isdir({str(home)!r}) else [])
    print(sorted(os.listdir('/run')))
    """
    res = run(src, clean)
    assert res.passed, res.stderr_tail
    inside_home, inside_run = (eval(line) for line in res.stdout_tail.splitlines())
    interpreter_parts = {
        Path(p).resolve().relative_to(home).parts[0]
        for p in (sys.base_prefix, sys.executable)
        if Path(p).resolve().is_relative_to(home)
    }
    assert set(inside_home) <= interpreter_parts  # only the way to the interpreter, if it lives there
    assert inside_run == []
    if len(outside) > len(interpreter_parts):
        assert set(outside) - set(inside_home)  # something that exists outside is not visible inside


def test_auto_picks_the_strongest_mode_that_works(iso: isolation.Isolation) -> None:
    first_working = next(c for c in isolation.candidates() if isolation.probe_one(c) is None)
    assert iso == first_working
    assert isolation.isolation_description(iso).startswith(iso.level + ": ")


def test_cancel_kills_a_running_program(clean: str, marker: str) -> None:
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(sb.Cancelled):
        run(
            f"import subprocess\nsubprocess.Popen(['sleep', '300', '{marker}'])\nwhile True: pass",
            clean,
            sb.SandboxLimits(timeout=20.0),
            cancel=cancel,
        )
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(sb.Cancelled):
        run("pass", clean, cancel=cancel)  # already set: nothing starts


def _working_modes() -> list[isolation.Isolation]:
    return list(isolation.candidates())


@pytest.mark.parametrize("mode", _working_modes(), ids=lambda i: f"{i.level}-{i.privilege}")
def test_every_mode_that_works_here_contains_the_basics(mode: isolation.Isolation, clean: str, marker: str) -> None:
    why = isolation.probe_one(mode)
    if why is not None:
        pytest.skip(f"{mode.level}/{mode.privilege} does not work on this machine: {why[:200]}")
    assert run("assert 1 == 1", clean, isolation=mode).passed
    assert not run("import os\nos._exit(0)", clean, isolation=mode).passed
    assert not run("import sys\nsys.exit(0)", clean, isolation=mode).passed
    assert run("while True: pass", clean, sb.SandboxLimits(timeout=1.0), isolation=mode).timed_out
    daemon = daemon_program(marker)
    res = run(daemon, clean, isolation=mode)
    assert res.passed and res.stdout_tail.startswith("up")
    if mode.level != "rlimits" or cgroup_support().pids_parent:  # the weakest level without cgroups cannot
        deadline = time.monotonic() + 2.0
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker) == []
    else:
        for pid in processes_with(marker):
            os.kill(pid, 9)
    if mode.uses_namespaces:
        res = run("open('/etc/ida-sandbox-test', 'w')", clean, isolation=mode)
        assert not res.passed and "Read-only file system" in res.stderr_tail
        assert not Path("/etc/ida-sandbox-test").exists()


def test_weakest_fallback_still_detects_early_exit(clean: str) -> None:
    weak = next(i for i in isolation.candidates() if i.level == "rlimits")
    assert run("assert 1 == 1", clean, isolation=weak).passed
    assert not run("import os\nos._exit(0)", clean, isolation=weak).passed
    assert run("while True: pass", clean, sb.SandboxLimits(timeout=1.0), isolation=weak).timed_out


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout"):
        sb.SandboxLimits(timeout=0)
    with pytest.raises(ValueError, match="memory_bytes"):
        sb.SandboxLimits(memory_bytes=1000)
    with pytest.raises(ValueError, match="isolation"):
        isolation.probe_isolation("docker")
    assert errno.ENETUNREACH  # (errno imported for readers of the network test)


def test_docstring_examples_run() -> None:
    import doctest

    for module in (sb, sandbox_types, isolation, cleanup):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__
    assert doctest.testmod(sb).attempted >= 2  # run_program's examples really ran


# ------------------------------------------------------------------ cleanup (issue 11, item 1)

DEEP_TREE = "import os\nfor i in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nopen('leaf', 'w').write('x')"
"""The completion that made shutil.rmtree recurse (RecursionError) and blocked every later run."""

LEFTOVERS = """
import os, socket, subprocess
os.mkdir('locked'); os.mkdir('locked/inner'); open('locked/inner/f', 'w').write('x')
os.chmod('locked/inner', 0); os.chmod('locked', 0)
os.mkfifo('fifo')
s = socket.socket(socket.AF_UNIX); s.bind('sock'); s.listen(1)
os.symlink('/etc/passwd', 'link'); os.symlink('/', 'rootlink')
os.mkdir('many')
for i in range(5000):
    os.close(os.open(f'many/{i}', os.O_CREAT | os.O_WRONLY))
open('immutable', 'w').write('x'); os.mkdir('immdir'); open('immdir/f', 'w').write('x')
r = subprocess.run(['chattr', '+i', 'immutable', 'immdir'], capture_output=True)
r2 = subprocess.run(['chattr', '+a', 'many/1'], capture_output=True)
print('chattr', r.returncode, r2.returncode)
os.chmod('.', 0o500)
"""


@pytest.mark.parametrize("mode", _working_modes(), ids=lambda i: f"{i.level}-{i.privilege}")
def test_cleanup_survives_deep_trees_and_odd_leftovers(mode: isolation.Isolation, clean: str) -> None:
    why = isolation.probe_one(mode)
    if why is not None:
        pytest.skip(f"{mode.level}/{mode.privilege} does not work on this machine: {why[:200]}")
    res = run(DEEP_TREE, clean, sb.SandboxLimits(timeout=20.0, memory_bytes=1 << 30), isolation=mode)
    assert res.passed, res.stderr_tail  # and `clean` checks the work directory is gone
    res = run(LEFTOVERS, clean, sb.SandboxLimits(timeout=20.0, memory_bytes=1 << 30), isolation=mode)
    assert res.passed, res.stderr_tail
    if mode.privilege == "none" and os.geteuid() == 0:  # a root program: chattr +i really happened
        assert "chattr 0 0" in res.stdout_tail


def _deep_leftovers(top: Path, depth: int) -> None:
    """What a hostile program leaves, built on the host: deep dirs, modes, flags, fifo, socket."""
    fd = os.open(top, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.mkfifo("fifo", dir_fd=fd)
    os.close(fd)
    (top / "locked" / "inner").mkdir(parents=True)
    (top / "locked" / "inner" / "f").write_text("x")
    os.chmod(top / "locked" / "inner", 0)
    os.chmod(top / "locked", 0)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(top / "sock"))
    s.close()
    (top / "imm").write_text("x")
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(top / "imm")], check=False, capture_output=True)


def test_remove_tree_removes_what_shutil_cannot(tmp_path: Path) -> None:
    top = tmp_path / "left"
    top.mkdir()
    _deep_leftovers(top, 5000)
    with pytest.raises((RecursionError, OSError)):  # the old cleanup (positive control)
        shutil.rmtree(top)
    remove_tree(str(top))
    assert not top.exists()
    remove_tree(str(top))  # nothing there: no error


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_sweep_stale_removes_deep_leftovers_and_never_blocks(tmp_path: Path) -> None:
    stale = tmp_path / f"{sb.WORK_PREFIX}{_dead_pid()}-abc"
    stale.mkdir()
    _deep_leftovers(stale, 3000)
    alive = tmp_path / f"{sb.WORK_PREFIX}{os.getpid()}-mine"
    alive.mkdir()
    removed = sb.sweep_stale(str(tmp_path))  # (also cgroups of other dead runners on this machine)
    assert [r for r in removed if r.startswith(str(tmp_path))] == [str(stale)]
    assert not stale.exists() and alive.exists()


SWEEP_UNREMOVABLE = """
import os, subprocess, sys, warnings
sys.path.insert(0, {repo!r})
from ida_eval import sandbox as sb
root, pid = {root!r}, {pid}
bad, good = os.path.join(root, f"ida-exec-{{pid}}-bad"), os.path.join(root, f"ida-exec-{{pid}}-good")
os.makedirs(bad + "/mnt"); os.makedirs(good + "/x")
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", bad + "/mnt"], check=True)  # a mount point: EBUSY
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    removed = sb.sweep_stale(root)
print([r for r in removed if r.startswith(root)] == [good], os.path.exists(bad), [str(w.message) for w in caught])
subprocess.run(["umount", bad + "/mnt"], check=True)
"""


def test_sweep_stale_warns_and_goes_on_when_something_cannot_be_removed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make an unremovable mount point in a private mount namespace")
    code = SWEEP_UNREMOVABLE.format(repo=str(Path(sb.__file__).parents[1]), root=str(tmp_path), pid=_dead_pid())
    try:
        r = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if "Operation not permitted" in r.stderr:
        pytest.skip(f"cannot make a private mount namespace here: {r.stderr[-200:]}")
    assert r.returncode == 0, r.stderr
    ok, bad_left, messages = r.stdout.strip().split(" ", 2)
    assert ok == "True" and bad_left == "True"
    assert "cannot remove stale" in messages and "ida-exec-" in messages


def test_a_deep_tree_completion_does_not_stop_the_run(tmp_path: Path) -> None:
    """The issue's scenario end to end: all records written, nothing left, the next run starts."""
    from ida_eval import execute as ex

    problem = {
        "task_id": "T/0",
        "language": "python",
        "prompt": "\ndef f():\n",
        "canonical_solution": "    return 1\n",
        "test": "\ndef check(c):\n    assert c() == 1\n",
        "entry_point": "f",
        "description": "",
    }
    problems = {"T/0": problem}
    deep = "    import os\n    for i in range(3000):\n        os.mkdir('d')\n        os.chdir('d')\n    return 1\n"
    samples = [{"task_id": "T/0", "completion": c} for c in ["    return 1\n", deep, "    return 2\n", deep]]
    root = tmp_path / "work"
    root.mkdir()
    out = tmp_path / "results.jsonl"
    cfg = ex.ExecutionConfig(timeout=20.0, workers=2, memory_bytes=1 << 30, tmp_root=str(root))
    res = ex.execute_samples(problems, samples, out_path=out, config=cfg, progress=False)
    assert [r["passed"] for r in res] == [True, True, False, True]
    assert len(out.read_text().splitlines()) == 4
    assert list(root.iterdir()) == []
    more = samples + [{"task_id": "T/0", "completion": "    return 1\n"}]
    res = ex.execute_samples(problems, more, out_path=out, config=cfg, progress=False)  # resume
    assert len(res) == 5 and res[-1]["passed"]


# ------------------------------------------------------------------ sandbox gaps (issue 11)


SOCKET_LISTENER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o777)
s.listen(8)
print('ready', flush=True)
while True:
    c, _ = s.accept()
    print('accepted', c.recv(100), flush=True)
    c.close()
"""


@pytest.mark.parametrize("netns", ["same", "other"], ids=["same-netns", "other-netns"])
def test_host_unix_sockets_are_unreachable(netns: str, clean: str, host_dir: Path, iso: isolation.Isolation) -> None:
    """A world-writable listening socket outside /run, the temp dir and home, bound in our network
    namespace or in another one (a container's): the program cannot connect to it."""
    needs_namespaces(iso)
    path = host_dir / "s"
    os.chmod(host_dir, 0o777)
    cmd = [sys.executable, "-c", SOCKET_LISTENER, str(path)]
    if netns == "other":
        if os.geteuid() != 0:
            cmd = ["unshare", "--user", "--map-root-user", "--net", *cmd]
        else:
            cmd = ["unshare", "--net", *cmd]
    listener = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        if listener.stdout.readline().strip() != "ready":
            pytest.skip(f"cannot start the listener: {listener.stderr.read()[-300:] if listener.stderr else ''}")
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(str(path))  # positive control: reachable from the host
        probe.sendall(b"host")
        probe.close()
        src = f"""
        import os, socket, stat
        print(stat.S_ISSOCK(os.stat({str(path)!r}).st_mode))
        s = socket.socket(socket.AF_UNIX)
        s.connect({str(path)!r})
        s.sendall(b'stolen')
        """
        res = run(src, clean)
        time.sleep(0.3)  # a connection that got through would be accepted by now
    finally:
        listener.kill()
        out, _ = listener.communicate()
    assert out.splitlines() == ["accepted b'host'"]
    assert not res.passed and res.stdout_tail.strip() == "False"
    assert "ConnectionRefusedError" in res.stderr_tail or "OSError" in res.stderr_tail


NESTED_USERNS = """
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
out = []
for flags in (CLONE_NEWUSER, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWNET):
    out.append((libc.unshare(flags), ctypes.get_errno()))
r = subprocess.run(['unshare', '--user', '--map-root-user', '--mount', '--net', 'true'], capture_output=True)
out.append(r.returncode)
# ordinary process and thread creation still works (fork, posix_spawn/clone3 fallback, threads)
t = threading.Thread(target=lambda: None); t.start(); t.join()
pid = os.posix_spawn('/bin/true', ['true'], {})
out.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
out.append(subprocess.run(['sh', '-c', 'exit 3']).returncode)
print(out)
"""


@pytest.mark.parametrize("mode", _working_modes(), ids=lambda i: f"{i.level}-{i.privilege}")
def test_nested_user_namespaces_are_denied(mode: isolation.Isolation, clean: str) -> None:
    why = isolation.probe_one(mode)
    if why is not None:
        pytest.skip(f"{mode.level}/{mode.privilege} does not work on this machine: {why[:200]}")
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("no seccomp filter for this architecture")
    res = run(NESTED_USERNS, clean, isolation=mode)
    assert res.passed, res.stderr_tail
    out = eval(res.stdout_tail.strip())  # our own program's repr
    assert out[:4] == [(-1, errno.EPERM)] * 4  # no namespace at all, even for a program that runs as root
    assert out[4] != 0  # unshare(1) fails too
    assert out[5:] == [0, 3]


def test_total_disk_use_is_capped_and_the_verdict_says_so(clean: str, iso: isolation.Isolation) -> None:
    needs_namespaces(iso)
    from ida_eval.execute import _verdict

    limits = sb.SandboxLimits(timeout=10.0, memory_bytes=1 << 30, disk_bytes=8 << 20, file_size_bytes=64 << 20)
    src = """
    import os
    total = 0
    try:
        for i, d in enumerate(['.', '/tmp', '/var/tmp', '/dev/shm'] * 4):  # 16 files of up to 1 MiB each
            with open(f'{d}/f{i}', 'wb') as f:
                for _ in range(16):
                    f.write(b'x' * 65536)
                    f.flush()
                    total += 65536
    finally:
        print(total)
    """
    t0 = time.monotonic()
    res = run(src, clean, limits)
    assert time.monotonic() - t0 < 8.0
    written = int(res.stdout_tail.strip())
    assert 6 << 20 <= written <= 8 << 20  # everything together, not per file
    assert not res.passed and res.disk_full and not res.timed_out
    assert "No space left on device" in res.stderr_tail
    verdict = _verdict(res, limits.max_output_bytes)
    assert not verdict.passed and verdict.exception == "OSError" and verdict.text.endswith("(disk limit reached)")
    small = run("open('f', 'wb').write(b'x' * (1 << 20))", clean, limits)
    assert small.passed and not small.disk_full


TMPDIR_RUNNER = """
import os, sys, tempfile, types
pkg = types.ModuleType("ida_eval")
pkg.__path__ = [{pkg_dir!r}]
sys.modules["ida_eval"] = pkg
from ida_eval import isolation, sandbox
assert tempfile.gettempdir() == {tmpdir!r}, tempfile.gettempdir()
res = sandbox.run_program({src!r}, sandbox.SandboxLimits(timeout=20.0), isolation=isolation.probe_isolation())
print(res.stdout_tail.strip(), res.passed)
"""


def test_host_tmp_is_never_visible_whatever_tmpdir_says(host_dir: Path, iso: isolation.Isolation) -> None:
    needs_namespaces(iso)
    marker = Path(tempfile.mkdtemp(prefix="ida-marker-", dir="/tmp"))
    elsewhere = host_dir / "tmpdir"
    elsewhere.mkdir()
    (elsewhere / "other-file").write_text("x")
    try:
        src = (
            f"import os\nprint(repr((os.path.exists({str(marker)!r}),"
            f" os.path.exists({str(elsewhere / 'other-file')!r}),"
            " sorted(os.listdir('/tmp')), os.environ['TMPDIR'] == os.getcwd())))"
        )
        code = TMPDIR_RUNNER.format(pkg_dir=str(Path(sb.__file__).parent), tmpdir=str(elsewhere), src=src)
        env = {**os.environ, "TMPDIR": str(elsewhere)}
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().endswith("True"), r.stdout  # the program passed
        seen_marker, seen_other, listing, tmpdir_is_cwd = eval(r.stdout.strip().rsplit(" ", 1)[0])
        assert not seen_marker and not seen_other and tmpdir_is_cwd
        assert not any(name.startswith("ida-marker-") for name in listing)
    finally:
        marker.rmdir()
    assert list(elsewhere.iterdir()) == [elsewhere / "other-file"]  # its work dir was removed


JAVA_MAIN = (
    "public class Main { public static void main(String[] a) throws Exception {"
    ' System.out.println("hi " + java.io.File.createTempFile("ida", ".t").getParent()); } }'
)
TOOLCHAINS = {
    "java": (["javac", "Main.java"], ["java", "-Xmx256m", "-cp", ".", "Main"]),
    "node": (
        None,
        [
            "node",
            "-e",
            "const os=require('os'); require('fs').writeFileSync(os.tmpdir()+'/a', 'x'); "
            "console.log('hi', require('crypto').randomBytes(2).length)",
        ],
    ),
}


@pytest.mark.parametrize("lang", sorted(TOOLCHAINS))
def test_toolchains_under_usr_still_run(lang: str, clean: str, iso: isolation.Isolation) -> None:
    """JVM and node need /proc, /dev/null, /dev/urandom, a writable /tmp (java.io.tmpdir): all there."""
    compile_cmd, run_cmd = TOOLCHAINS[lang]
    if shutil.which(run_cmd[0]) is None or (compile_cmd and shutil.which(compile_cmd[0]) is None):
        pytest.skip(f"{run_cmd[0]} is not installed here")
    src = f"""
    import subprocess
    open('Main.java', 'w').write({JAVA_MAIN!r})
    for cmd in ({compile_cmd!r}, {run_cmd!r}):
        if cmd:
            r = subprocess.run(cmd, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            print(r.stdout.strip())
    """
    res = run(src, clean, sb.SandboxLimits(timeout=120.0, memory_bytes=16 << 30))
    assert res.passed, res.stderr_tail
    assert "hi" in res.stdout_tail


def test_files_the_caller_puts_beside_the_program_are_there(tmp_path: Path) -> None:
    """Other files of the work directory (sources, an executable helper, a subdirectory) reach the
    program with their modes: inside, the work directory is a fresh tmpfs and they are copied in
    (the interface a multilingual executor builds on)."""
    mode = next((c for c in isolation.candidates() if c.privilege == "capdrop"), None)
    if mode is None or isolation.probe_one(mode) is not None:
        pytest.skip("no working namespaces/capdrop mode here")
    from ida_eval.cgroups import SandboxCgroups

    work = tmp_path / "ida-exec-0-x" / "w"
    (work / "data").mkdir(parents=True)
    (work / "data" / "x.txt").write_text("payload")
    (work / "helper.sh").write_text("#!/bin/sh\necho helper-ran\n")
    os.chmod(work / "helper.sh", 0o755)
    program = work / "prog.py"
    program.write_text(
        "import os, subprocess\n"
        "print(open('data/x.txt').read(), subprocess.run(['./helper.sh'], capture_output=True, text=True).stdout)\n"
        "open('data/y.txt', 'w').write('inside only')\n"
    )
    res = sb._spawn_and_wait(str(program), str(work), FAST, mode, None, None, SandboxCgroups([], "none"), None)
    assert res.passed, res.stderr_tail
    assert res.stdout_tail.split() == ["payload", "helper-ran"]
    assert not (work / "data" / "y.txt").exists()  # the program's writes stayed in its tmpfs


def test_a_socket_mounted_in_from_elsewhere_is_unreachable(
    clean: str, host_dir: Path, iso: isolation.Isolation
) -> None:
    """A socket bind-mounted onto a file (how docker.sock reaches a container), bound under a
    relative name (so no socket table names its path): the mount table gives it away, it is covered."""
    needs_namespaces(iso)
    if os.geteuid() != 0:
        pytest.skip("needs root to bind-mount a socket on the host")
    os.chmod(host_dir, 0o777)
    (host_dir / "t").write_text("")
    cmd = [sys.executable, "-c", SOCKET_LISTENER, "s"]  # relative: /proc/net/unix lists just "s"
    listener = subprocess.Popen(cmd, cwd=host_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mounted = False
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        mounted = subprocess.run(["mount", "--bind", str(host_dir / "s"), str(host_dir / "t")]).returncode == 0
        if not mounted:
            pytest.skip("cannot bind-mount here")
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(str(host_dir / "t"))  # positive control
        probe.sendall(b"host")
        probe.close()
        res = run(f"import socket\nsocket.socket(socket.AF_UNIX).connect({str(host_dir / 't')!r})", clean)
        time.sleep(0.3)
    finally:
        if mounted:
            subprocess.run(["umount", str(host_dir / "t")], check=False)
        listener.kill()
        out, _ = listener.communicate()
    assert out.splitlines() == ["accepted b'host'"]
    assert not res.passed and "ConnectionRefusedError" in res.stderr_tail


@pytest.mark.parametrize("err", [errno.ENOENT, errno.ENOTDIR, errno.EPERM])
def test_a_socket_gone_before_its_cover_is_mounted_is_skipped_and_nothing_else(tmp_path: Path, err: int) -> None:
    """A host socket listed for covering may be unlinked before the bootstrap mounts over it (its server ended;
    CI met it: another test's listener). Nothing is left to connect to, so that is not a setup failure; any
    other mount error still is. ``mount`` fails as the bootstrap's own does (an OSError with the errno)."""
    from ida_eval import _sandbox_boot as boot

    path = tmp_path / "s"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    tried = []

    def mount(src, dst, fstype, flags, data=None):
        tried.append(dst)
        raise OSError(err, f"mount {dst!r}: {os.strerror(err)}")

    try:
        if err == errno.EPERM:
            with pytest.raises(PermissionError):
                boot._cover_socket(str(path), mount)
        else:
            boot._cover_socket(str(path), mount)
        boot._cover_socket(str(tmp_path / "never-there"), mount)  # not even looked at
    finally:
        listener.close()
    assert tried == [str(path)]


NON_ROOT_RUNNER = """
import os, sys, types
pkg = types.ModuleType("ida_eval")
pkg.__path__ = [{pkg_dir!r}]
sys.modules["ida_eval"] = pkg
from ida_eval import isolation, sandbox as sb
iso = isolation.probe_isolation()
limits = sb.SandboxLimits(timeout=20.0, memory_bytes=1 << 30, disk_bytes=4 << 20)
out = [os.getuid(), iso.level, iso.privilege, "--user" in iso.unshare]
for src in (
    "import os\\nfor i in range(3000):\\n    os.mkdir('d')\\n    os.chdir('d')",
    "open('/tmp/big', 'wb').write(b'x' * (8 << 20))",
    "import ctypes\\nassert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == -1",
    "import os\\nassert os.listdir('/run') == [] and not os.path.exists(%r)" % {marker!r},  # the task's own /tmp
):
    res = sb.run_program(src, limits, isolation=iso)
    out.append((res.passed, res.disk_full))
out.append([n for n in os.listdir({tmp!r}) if n.startswith("ida-exec-%d-" % os.getpid())])
print(repr(out))
"""


def test_a_non_root_runner_gets_the_same_sandbox_through_a_user_namespace() -> None:
    """The unprivileged path (``unshare --user --map-root-user``), run as ``nobody``: the task tmpfs,
    the disk cap, the seccomp filter, the hidden /run and the recursion-free cleanup all hold."""
    runuser = shutil.which("runuser")
    if os.geteuid() != 0 or runuser is None:
        pytest.skip("needs root and runuser(1) to start a runner as an unprivileged user")
    python = next((p for p in (sys.executable, "/usr/bin/python3") if _runs_as_nobody(runuser, p)), None)
    pkg_dir = str(Path(sb.__file__).parent)
    readable = subprocess.run([runuser, "-u", "nobody", "--", "test", "-r", pkg_dir + "/sandbox.py"]).returncode == 0
    if python is None or not readable:
        pytest.skip("no interpreter or checkout that the user nobody can read")
    tmp = Path(tempfile.mkdtemp(prefix="ida-nobody-"))  # (pytest's tmp_path is not searchable by others)
    marker = Path(f"/tmp/ida-host-marker-{os.getpid()}")  # in the host's /tmp, so never in the task's
    marker.touch()
    try:
        os.chown(tmp, 65534, 65534)
        code = NON_ROOT_RUNNER.format(pkg_dir=pkg_dir, tmp=str(tmp), marker=str(marker))
        env = {"PATH": sb.SAFE_PATH, "HOME": str(tmp), "TMPDIR": str(tmp)}
        r = subprocess.run(
            [runuser, "-u", "nobody", "--", python, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        shutil.rmtree(tmp)
        marker.unlink()
    if r.returncode != 0 and "no sandbox isolation level" in r.stderr:
        pytest.skip(f"no isolation for an unprivileged user here: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    out = eval(r.stdout.strip().splitlines()[-1])  # our own program's repr
    if out[1] != "namespaces":
        pytest.skip(f"user namespaces unavailable to an unprivileged user here ({out[1]})")
    assert out[:4] == [65534, "namespaces", "capdrop", True]
    assert out[4] == (False, True)  # 3000 nested dirs exceed the 4 MiB tmpfs' inodes: ENOSPC, not a crash
    assert out[5] == (False, True) and out[6] == (True, False) and out[7] == (True, False)
    assert out[8] == []  # no work directory left


def _runs_as_nobody(runuser: str, python: str) -> bool:
    try:
        r = subprocess.run([runuser, "-u", "nobody", "--", python, "-c", "pass"], capture_output=True, timeout=60)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_bootstrap_imports_stay_cheap_for_an_interpreted_job(monkeypatch):
    """The bootstrap starts once per program: for a job without a compile step it must not import
    json, re, enum, signal or subprocess (~25 ms of CPU per program, as much as a Node.js run), and
    its SIGKILL constant and job spec must agree with the modules it avoids. Checked on a real run
    with the bootstrap's ``-X importtime`` report (its stderr, before it execs the job)."""
    import marshal
    import signal

    from ida_eval import _sandbox_boot as boot

    assert boot.SIGKILL == signal.SIGKILL
    job = sb.ProgramJob(files=(("a.txt", "x"),), run=("cat",))
    spec = marshal.loads(bytes.fromhex(job.spec()))
    assert spec["run"] == ["cat"] and spec["compile"] is None and spec["log"] == sandbox_types.COMPILE_LOG
    plain = sb._interpreter_args
    monkeypatch.setattr(sb, "JOB_SERVER", False)  # a bootstrap per program (as without root)
    monkeypatch.setattr(sb, "_interpreter_args", lambda limits: [*plain(limits), "-X", "importtime"])
    res = sb.run_program(job, isolation=isolation.probe_isolation())
    assert res.passed, res
    imported = {
        line.rpartition("|")[2].strip() for line in res.stderr_tail.splitlines() if line.startswith("import time:")
    }
    assert "os" in imported  # the report is there
    assert not imported & {"json", "re", "enum", "signal", "subprocess"}, sorted(imported)


# ------------------------------------------------------------------ job servers (ProgramJobs as root)


def needs_job_server(iso: isolation.Isolation) -> None:
    if not sb._served_unshare_flags(iso):
        pytest.skip(f"no job server here (needs root and namespaces; isolation in force: {iso.description})")


def sh_job(script: str) -> sb.ProgramJob:
    """A shell job whose driver ends by copying stdin (the nonce) to stdout, as language drivers do."""
    return sb.ProgramJob(files=(("a.sh", textwrap.dedent(script) + "cat\n"),), run=("/bin/sh", "a.sh"))


def test_jobs_share_a_warm_server_per_slot_yet_each_gets_its_own_pids_mounts_and_tmp(
    clean: str, iso: isolation.Isolation
) -> None:
    needs_job_server(iso)
    job = sh_job(
        "echo $$ $(readlink /proc/self/ns/net) $(readlink /proc/self/ns/mnt) $(ls /tmp)\ntouch /tmp/left-over\n"
    )
    runs = [sb.run_program(job, FAST, tmp_root=clean, slot=slot, isolation=iso) for slot in (0, 0, 1)]
    assert all(r.passed for r in runs), runs
    servers = {slot: s.proc.pid for (pid, slot), s in sb._JobServer._servers.items() if pid == os.getpid()}
    assert sorted(servers) == [0, 1] and servers[0] != servers[1]
    seen = [r.stdout_tail.split()[:3] for r in runs]
    host = {os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt")}
    assert all(pid == "2" for pid, *_ in seen)  # a fresh PID namespace: PID 1 is the bootstrap, the driver its child
    assert not {ns for _, net, mnt in seen for ns in (net, mnt)} & host
    assert seen[0][1] == seen[1][1] != seen[2][1]  # one empty network namespace per slot (its server's)
    assert not any("left-over" in r.stdout_tail for r in runs)  # each run's /tmp is its own
    groups = sb._JobServer._servers[(os.getpid(), 0)].groups.paths
    assert groups and all(str(servers[0]) in Path(g, "cgroup.procs").read_text().split() for g in groups)
    sb.close_job_servers()
    assert not any(os.path.exists(g) for g in groups) and not sb._JobServer._servers


@pytest.mark.parametrize("served", [True, False], ids=["served", "bootstrap-per-program"])
def test_a_job_cannot_reach_its_pid_1_which_shares_its_uid(
    clean: str, iso: isolation.Isolation, served: bool, monkeypatch
) -> None:
    """A job's PID 1 runs as the program's uid (it spawns the steps itself): signals from inside
    the namespace must not reach it (not even SIGINT, which Python handles), nor ``ptrace`` or
    its ``/proc`` files; the run must still end with PID 1's report."""
    if not iso.uses_namespaces:
        pytest.skip(f"no PID namespace here ({iso.description})")
    if served:
        needs_job_server(iso)
    monkeypatch.setattr(sb, "JOB_SERVER", served)
    python = shutil.which("python3", path=sb.SAFE_PATH)
    if python is None:
        pytest.skip("no python3 on the sandbox's PATH")
    ptrace = "import ctypes; c = ctypes.CDLL(None, use_errno=True); print('ptrace', c.ptrace(16, 1, 0, 0), ctypes.get_errno())"
    job = sh_job(f"""
        for sig in INT TERM HUP USR1 QUIT KILL STOP; do kill -s $sig 1 2>/dev/null && echo sent-$sig; done
        sleep 0.2
        cat /proc/1/environ >/dev/null 2>&1 && echo read-environ
        ls /proc/1/fd >/dev/null 2>&1 && echo read-fds
        {python} -c "{ptrace}"
        echo uid $(id -u) pid1 $(stat -c %u /proc/1)
    """)
    res = sb.run_program(job, FAST, tmp_root=clean, isolation=iso)
    assert res.passed, res
    assert "read-" not in res.stdout_tail, res.stdout_tail
    assert "ptrace -1 1" in res.stdout_tail, res.stdout_tail  # EPERM
    # a signal may be "sent" (same uid) but is dropped: PID 1 lived to report exit 0


def test_a_served_run_that_hits_the_memory_limit_says_so_and_the_next_does_not(
    clean: str, iso: isolation.Isolation
) -> None:
    needs_job_server(iso)
    if cgroup_support().memory_parent is None:
        pytest.skip("no writable memory cgroup here")
    python = shutil.which("python3", path=sb.SAFE_PATH)
    if python is None:
        pytest.skip("no python3 on the sandbox's PATH")
    # four children under RLIMIT_AS (512 MiB) each, together over the tree's 512 MiB
    bomb = sh_job(
        f"for i in 1 2 3 4; do {python} -c 'import time; b = bytearray(200 << 20); "
        "b[::4096] = bytes(len(range(0, 200 << 20, 4096))); time.sleep(1)' & done; wait\n"
    )
    limits = sb.SandboxLimits(timeout=20.0, memory_bytes=512 << 20)
    first = sb.run_program(bomb, limits, tmp_root=clean, isolation=iso)
    assert first.oom_killed, first
    after = sb.run_program(sh_job("true\n"), limits, tmp_root=clean, isolation=iso)
    assert after.passed and not after.oom_killed  # the group's OOM count is taken per run


def test_a_dead_job_server_is_replaced(clean: str, iso: isolation.Isolation) -> None:
    needs_job_server(iso)
    assert sb.run_program(sh_job(""), FAST, tmp_root=clean, isolation=iso).passed
    old = sb._JobServer._servers[(os.getpid(), 0)].proc
    old.kill()
    old.wait()
    assert sb.run_program(sh_job(""), FAST, tmp_root=clean, isolation=iso).passed
    assert sb._JobServer._servers[(os.getpid(), 0)].proc.pid != old.pid


RUNNER_JOB = """
import sys, types
pkg = types.ModuleType("ida_eval")
pkg.__path__ = [{pkg_dir!r}]
sys.modules["ida_eval"] = pkg
from ida_eval import isolation, sandbox
job = sandbox.ProgramJob(files=(("a.sh", {script!r}),), run=("/bin/sh", "a.sh"))
sandbox.run_program(job, sandbox.SandboxLimits(timeout=120.0), isolation=isolation.probe_isolation())
"""


def test_a_killed_runner_takes_its_served_programs_and_servers_with_it(marker: str, iso: isolation.Isolation) -> None:
    needs_job_server(iso)
    script = f"sleep 300 {marker} &\nwhile :; do :; done\n"
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER_JOB.format(pkg_dir=str(Path(sb.__file__).parent), script=script)]
    )
    try:
        sleeper = f"300\0{marker}"  # the sleep's argv (the runner's, and its forks before they exec, have "300 ")
        deadline = time.monotonic() + 30
        while not processes_with(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(sleeper), "the program never started"
        servers = [p for p in processes_with("--serve") if _parent_of(p) == runner.pid]
        assert len(servers) == 1
    finally:
        runner.kill()
        runner.wait()
    deadline = time.monotonic() + 5
    while (processes_with(sleeper) or _pid_exists(servers[0])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(sleeper) == [] and not _pid_exists(servers[0])
    sb.sweep_stale()
    tag = f"ida-exec-{runner.pid}-"
    assert not [g for parent in cgroup_parents() for g in os.listdir(parent) if g.startswith(tag)]


def _proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...); [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def _parent_of(pid: int) -> int:
    fields = _proc_stat(pid)
    return int(fields[1]) if fields else -1


def _pid_exists(pid: int) -> bool:
    fields = _proc_stat(pid)
    return bool(fields) and fields[0] != "Z"  # a zombie has exited
