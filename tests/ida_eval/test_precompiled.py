"""What every compile of a language reads, built once (ida_eval.precompiled): C++'s precompiled ``bits/stdc++.h``
and the JVM compilers' class-data archives. The same binaries / class files and diagnostics as mxeval's compile,
used inside the sandbox and never writable there."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ida_common import native_build
from ida_eval import precompiled
from ida_eval.isolation import probe_isolation
from ida_eval.languages import LANGUAGES, Language, assemble, missing_tools, tool_env
from ida_eval.sandbox import SAFE_PATH, readable_in_sandbox, run_program
from ida_eval.sandbox_types import DEFAULT_LIMITS, Isolation, ProgramJob
from tests.ida_eval.toys import TOYS, toy_problem

CPP = LANGUAGES["cpp"]
needs_gpp = pytest.mark.skipif(bool(missing_tools(CPP)), reason="no g++ (python -m ida_eval.toolchains --install)")
ENV = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def pch() -> str:
    """The cache's precompiled header directory (built by the first test that needs it, ~7 s; then reused)."""
    if missing_tools(CPP):
        pytest.skip("no g++ (python -m ida_eval.toolchains --install)")
    argv, read_only = precompiled.compile_command(CPP, probe_isolation())
    assert read_only and argv == (CPP.compile[0], "-I", read_only[0], *CPP.compile[1:])
    return read_only[0]


def test_it_is_built_once_readable_by_every_uid_and_reused(pch: str) -> None:
    gch = Path(pch) / "bits" / "stdc++.h.gch"
    assert gch.stat().st_mode & 0o777 == 0o644 and Path(pch).stat().st_mode & 0o777 == 0o755
    before = gch.stat().st_mtime_ns
    precompiled._dirs.clear()  # a new process: found in the cache, not built again
    assert precompiled.header_dir(CPP.compile[0]) == pch and gch.stat().st_mtime_ns == before
    assert not [p for p in Path(pch).parent.iterdir() if p.name.startswith(".pch-")]  # no temporary left


def _compile(tmp: Path, completion: str, argv: tuple[str, ...]) -> tuple[int, str, bytes]:
    tmp.mkdir()
    for name, text in assemble(CPP, toy_problem("cpp"), completion):
        (tmp / name).write_text(text)
    res = subprocess.run(argv, cwd=tmp, env=ENV, capture_output=True, text=True, check=False)
    binary = (tmp / "prog").read_bytes() if res.returncode == 0 else b""
    return res.returncode, res.stderr.replace(str(tmp), "<dir>"), binary


@pytest.mark.parametrize("completion", ["right", "compile"])
def test_the_same_binary_and_diagnostics_as_without_it(pch: str, completion: str, tmp_path: Path) -> None:
    plain = _compile(tmp_path / "plain", TOYS["cpp"][completion], CPP.compile)
    with_pch = _compile(tmp_path / "pch", TOYS["cpp"][completion], (CPP.compile[0], "-I", pch, *CPP.compile[1:]))
    assert with_pch == plain
    assert (plain[0] == 0) == (completion == "right") and (plain[2] != b"") == (completion == "right")


def test_a_sandboxed_compile_uses_it_and_no_program_can_write_it(pch: str) -> None:
    gch = f"{pch}/bits/stdc++.h.gch"
    job = ProgramJob(
        files=(("prog.cpp", "#include <bits/stdc++.h>\nint main() {}\n"),),
        # g++ -H marks a precompiled header it used with "!"; grep's status is the compile's
        compile=("sh", "-c", f"g++ -I {pch} -H -fsyntax-only prog.cpp 2>&1 | grep -qxF '! {gch}'"),
        compile_timeout=120.0,
        # the run passes (echoes the nonce) only if the program cannot write the header nor add a file beside it
        run=("sh", "-c", f"[ -r {gch} ] && [ ! -w {gch} ] && ! touch {pch}/planted 2>/dev/null && cat"),
        read_only=(pch,),
    )
    iso = probe_isolation()
    res = run_program(job, DEFAULT_LIMITS, isolation=iso)
    assert res.passed, (iso.description, res.stderr_tail, res.compile_output)
    assert not Path(pch, "planted").exists()
    if iso.uses_namespaces:  # the cache lies under the hidden home: without read_only, not there at all
        hidden = run_program(
            ProgramJob(files=job.files, run=("sh", "-c", f"[ ! -e {pch} ] && cat")), DEFAULT_LIMITS, isolation=iso
        )
        assert hidden.passed, hidden.stderr_tail


def test_the_switches_turn_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    java = LANGUAGES["java"]
    monkeypatch.setenv(precompiled.SWITCH, "0")
    assert precompiled.compile_command(CPP, probe_isolation()) == (CPP.compile, ())
    monkeypatch.setenv(precompiled.JVM_SWITCH, "0")
    assert precompiled.compile_command(java, probe_isolation()) == (java.compile, ())
    for name in ("python", "javascript", "go", "csharp"):  # nothing precompiled for them
        assert precompiled.compile_command(LANGUAGES[name], probe_isolation()) == (LANGUAGES[name].compile, ())


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A 0755 directory in the system temp dir (pytest's own are under a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="ida-test-pch-"))
    try:
        path.chmod(0o755)
        if any(not p.stat().st_mode & 0o001 for p in path.parents):
            pytest.skip(f"the system temp dir {path.parent} is not searchable by others")
        yield path
    finally:
        for p in (path, *path.rglob("*")):
            p.chmod(0o755)
        shutil.rmtree(path)


def test_a_header_the_programs_uid_cannot_reach_is_not_passed(monkeypatch: pytest.MonkeyPatch, open_dir: Path) -> None:
    """g++ fails on an include directory it may not enter ("Permission denied"), so a per-worker uid that cannot
    search a directory on the path (a root runner without namespaces, the cache in root's 0700 home) compiles
    without the header rather than failing every program."""
    locked = open_dir / "home"
    (locked / "cache" / "bits").mkdir(parents=True)
    (locked / "cache").chmod(0o755)
    locked.chmod(0o700)
    where = str(locked / "cache")
    setuid = Isolation("setuid", "setuid", (), "per-worker uid, no namespaces")
    assert not readable_in_sandbox(where, setuid)
    assert readable_in_sandbox(where, Isolation("setuid", "capdrop", (), "the runner's uid, capabilities dropped"))
    monkeypatch.setattr(precompiled, "_dirs", {("cpp", CPP.compile[0]): where})  # as if built there
    monkeypatch.setattr(native_build, "_warned", set())
    with pytest.warns(RuntimeWarning, match="out of reach of the sandbox's programs"):
        assert precompiled.compile_command(CPP, setuid) == (CPP.compile, ())
    locked.chmod(0o711)  # searchable by others: now it is passed
    assert readable_in_sandbox(where, setuid)
    assert precompiled.compile_command(CPP, setuid) == ((CPP.compile[0], "-I", where, *CPP.compile[1:]), (where,))


def test_where_it_cannot_be_built_a_warning_says_so_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(precompiled, "_dirs", {})
    monkeypatch.setattr(native_build, "_warned", set())
    fake = tmp_path / "fake-g++"  # a compiler that knows no include path
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    with pytest.warns(
        RuntimeWarning, match=r"no precompiled <bits/stdc\+\+\.h> for .*fake-g\+\+ \(.* printed no include"
    ):
        assert precompiled.header_dir(str(fake)) is None
    with pytest.warns(RuntimeWarning, match=r"for no-such-g\+\+ \(no-such-g\+\+ not found\)"):
        assert precompiled.header_dir("no-such-g++") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precompiled.header_dir(str(fake)) is None  # once per process


@needs_gpp
def test_a_cache_it_cannot_write_is_a_warning_not_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(precompiled, "_dirs", {})
    monkeypatch.setattr(native_build, "_warned", set())
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("IDA_CACHE_DIR", str(blocked))
    with pytest.warns(RuntimeWarning, match="cannot write"):
        assert precompiled.header_dir("g++") is None


@needs_gpp
def test_a_build_into_an_empty_cache_clears_what_a_killed_build_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The build path itself (CI's cache is warm after its first run): built, checked, renamed into place, and a
    killed build's temporary directory removed (~7 s)."""
    monkeypatch.setenv("IDA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(precompiled, "_dirs", {})
    leftover = tmp_path / "cache" / "ida_eval" / ".pch-0123456789abcdef.x1y2"
    leftover.mkdir(parents=True)
    (leftover / "stdc++.h.gch").write_bytes(b"half a header")
    built = precompiled.header_dir(CPP.compile[0])
    assert built is not None and Path(built).parent == (tmp_path / "cache" / "ida_eval").resolve()
    assert (Path(built) / "bits" / "stdc++.h.gch").stat().st_size > 1 << 20
    assert not leftover.exists()


# ------------------------------------------------------------------------------------------ JVM archives

JVM = [
    pytest.param("java", id="java"),
    pytest.param("kotlin", id="kotlin", marks=pytest.mark.slow),  # ~5 s of CPU per compile, ~12 s to build
    pytest.param("scala", id="scala", marks=pytest.mark.slow),
]


def _jvm_or_skip(name: str) -> Language:
    lang = LANGUAGES[name]
    if missing_tools(lang):
        pytest.skip(f"no {name} toolchain (python -m ida_eval.toolchains --install)")
    return lang


def _archive(lang: Language) -> str:
    argv, read_only = precompiled.compile_command(lang, probe_isolation())
    assert lang.compile is not None and read_only
    assert argv == (lang.compile[0], *precompiled._archive_flags(read_only[0]), *lang.compile[1:])
    return read_only[0]


def _class_files(d: Path) -> dict[str, bytes]:
    """Every class file a compile left in ``d``, also those inside a jar (kotlinc's ``prog.jar``)."""
    out = {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*.class")}
    for jar in d.glob("*.jar"):
        with zipfile.ZipFile(jar) as z:
            out.update({f"{jar.name}!{i.filename}": z.read(i) for i in z.infolist() if not i.is_dir()})
    return out


@pytest.mark.parametrize("name", JVM)
@pytest.mark.parametrize("completion", ["right", "compile"])
def test_the_same_class_files_and_diagnostics_as_without_it(name: str, completion: str, tmp_path: Path) -> None:
    lang = _jvm_or_skip(name)
    archive = _archive(lang)
    assert lang.compile is not None
    ran = []
    for label, argv in (("plain", lang.compile), ("cds", (lang.compile[0], *precompiled._archive_flags(archive)))):
        work = tmp_path / label
        work.mkdir()
        for file, text in assemble(lang, toy_problem(name), TOYS[name][completion]):
            (work / file).write_text(text)
        argv = (*argv, *lang.compile[1:]) if label == "cds" else argv
        res = subprocess.run(argv, cwd=work, env=tool_env(lang), capture_output=True, text=True, check=False)
        ran.append((res.returncode, (res.stdout + res.stderr).replace(str(work), "<dir>"), _class_files(work)))
    assert ran[1] == ran[0]
    assert (ran[0][0] == 0) == (completion == "right") and bool(ran[0][2]) == (completion == "right")


def test_a_sandboxed_compile_maps_it_and_no_program_can_write_it() -> None:
    lang = _jvm_or_skip("java")
    iso = probe_isolation()
    argv, read_only = precompiled.compile_command(lang, iso)  # what the executor's jobs get
    assert argv is not None and read_only
    archive = read_only[0]
    jsa = f"{archive}/{precompiled.ARCHIVE}"
    job = ProgramJob(
        files=assemble(lang, toy_problem("java"), TOYS["java"]["right"]),
        # -Xshare:on: a JVM that cannot map the archive (not there, unreadable, damaged) does not start
        compile=(argv[0], "-J-Xshare:on", *argv[1:]),
        compile_timeout=120.0,
        run=("sh", "-c", f"[ -r {jsa} ] && [ ! -w {jsa} ] && ! touch {archive}/planted 2>/dev/null && cat"),
        read_only=read_only,
    )
    res = run_program(job, DEFAULT_LIMITS, isolation=iso)
    assert res.passed, (iso.description, res.stderr_tail, res.compile_output)
    assert not Path(archive, "planted").exists()


def test_a_damaged_archive_is_built_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A JVM maps a truncated archive and crashes (SIGBUS): each process checks the sizes its manifest recorded
    before the first use, and builds a damaged directory again (here: into an empty cache, ~3 s)."""
    lang = _jvm_or_skip("java")
    monkeypatch.setenv("IDA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(precompiled, "_dirs", {})
    built = precompiled.archive_dir(lang)
    assert built is not None and Path(built).parent == (tmp_path / "cache" / "ida_eval").resolve()
    jsa = Path(built) / precompiled.ARCHIVE
    size = jsa.stat().st_size
    assert size > 1 << 20 and jsa.stat().st_mode & 0o777 == 0o644 and Path(built).stat().st_mode & 0o777 == 0o755
    assert json.loads((Path(built) / precompiled.MANIFEST).read_text()) == {precompiled.ARCHIVE: size}
    jsa.chmod(0o644)
    with open(jsa, "r+b") as fh:
        fh.truncate(size // 2)
    monkeypatch.setattr(precompiled, "_dirs", {})  # a new process
    assert precompiled.archive_dir(lang) == built and jsa.stat().st_size == size
    assert sorted(p.name for p in Path(built).parent.iterdir()) == sorted(["cds.lock", Path(built).name])


def test_an_archive_built_on_a_large_machine_maps_in_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A JVM on a machine with >= 128 GiB sizes a 32 GiB heap without compressed oops; one in the sandbox (its memory
    cgroup: 4 GiB) uses them, and a JVM does not use an archive of the other mode. The training JVM's heap is pinned
    below 32 GiB: here a 256 GiB machine is simulated (``-XX:MaxRAM``) for the build and a 4 GiB one for the use."""
    lang = _jvm_or_skip("java")
    assert lang.compile is not None
    monkeypatch.setenv("IDA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(precompiled, "_dirs", {})
    monkeypatch.setattr(precompiled, "_TRAINING_JVM_FLAGS", ("-J-XX:MaxRAM=256g", *precompiled._TRAINING_JVM_FLAGS))
    built = precompiled.archive_dir(lang)
    assert built is not None
    work = tmp_path / "work"
    work.mkdir()
    for file, text in assemble(lang, toy_problem("java"), TOYS["java"]["right"]):
        (work / file).write_text(text)
    argv = (lang.compile[0], "-J-XX:MaxRAM=4g", "-J-Xshare:on", *precompiled._archive_flags(built), *lang.compile[1:])
    res = subprocess.run(argv, cwd=work, env=tool_env(lang), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
