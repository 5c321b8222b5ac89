"""Files built once per machine that every compile of a language reads: the same programs in less time.

* **C++: a precompiled ``bits/stdc++.h``.** Every MBCPP prompt begins with ``#include <bits/stdc++.h>``
  (848 of 848), and parsing that header is almost all of the reference compile
  ``g++ ida_end.cpp prog.cpp -o prog`` (about 3 s of CPU here; 0.75 s with the header precompiled). GCC
  looks for ``bits/stdc++.h.gch`` in each include directory before the header itself, and uses it only
  when the same compiler built it with compatible options; otherwise it reads the header as before. So
  the compile command gets ``-I DIR``, where ``DIR/bits/stdc++.h.gch`` was compiled from the very header
  the compile would read: the binaries are byte-identical, and a precompiled header GCC cannot use costs
  time, never a verdict (docs/eval.md, "C++ compiles"). ``IDA_EVAL_CPP_PCH=0`` turns it off.
* **Java, Kotlin, Scala: a class-data archive of the compiler's JVM** (HotSpot's dynamic CDS: the classes
  a compile loads, parsed and verified once, mapped by the next JVM instead of read from the jars).
  ``javac`` / ``kotlinc`` / ``scalac`` get ``-J-XX:SharedArchiveFile=DIR/classes.jsa`` and
  ``-J-XX:+VerifySharedSpaces`` (the JVM checks the archive's checksum when it maps it): the compiler
  is the same code, so are its class files; a JVM that cannot use the archive compiles without it (a
  damaged archive or another class path: one warning line in the compile's output; another heap mode:
  silently, hence the training JVM's pinned heap). ``IDA_EVAL_JVM_CDS=0`` turns it off.

How each is had:

* **Built once per machine and toolchain** into the ida cache
  (:func:`ida_common.native_build.cache_dir` ``("ida_eval") / "<kind>-<key>"``; the key covers what the
  file depends on: the compiler's ``--version`` and the header's path, size and mtime for C++; the
  compiler's and the JVM's files, the JVM flags and the language's environment for the JVM compilers;
  and ida's version) under a file lock, in a temporary directory that is checked (GCC must report using
  the header; a JVM started with ``-Xshare:on``, which refuses to start without the archive, must compile
  a program with it) and then renamed into place with a manifest of its files' sizes, which each process
  checks before its first use (a damaged directory is built again). C++: about 7 s of CPU and 100 MB;
  javac ~3 s and 11 MB, kotlinc ~12 s and 53 MB, scalac ~7 s and 37 MB. Where it cannot be built (no
  compiler, a compiler without ``bits/stdc++.h``, a full disk), a warning says so once and programs
  compile without it.
* **Shared read-only.** It is a file every task's compile reads; no program can write it: in the
  namespace modes it is mounted back read-only into each sandbox
  (:attr:`ida_eval.sandbox_types.ProgramJob.read_only`), under ``setuid`` programs run as another uid.
  Where a program's uid could not reach it (a root runner without namespaces, the cache under root's
  0700 home), it is not passed (``g++`` fails on an include directory it may not enter instead of
  skipping it; :func:`ida_eval.sandbox.readable_in_sandbox`), with one warning. Under the ``rlimits``
  fallback a program runs as the cache's owner and could rewrite it, as it could every other file of
  that user: that fallback does not isolate programs at all (docs/eval.md, "Isolation").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ida_common.native_build import build_key, cache_dir, compiler_banner, file_lock, switch_enabled, warn_once
from ida_eval.languages import JVM_COMPILER_FLAGS, LANGUAGES, Language, assemble, tool_env
from ida_eval.sandbox import SAFE_PATH, readable_in_sandbox
from ida_eval.sandbox_types import Isolation

__all__ = ["ARCHIVE", "HEADER", "JVM_SWITCH", "SWITCH", "archive_dir", "compile_command", "header_dir"]

HEADER = "bits/stdc++.h"  # what every MBCPP prompt includes first
SWITCH = "IDA_EVAL_CPP_PCH"  # 0/false/no/off: C++ compiles without it
ARCHIVE = "classes.jsa"  # the JVM compilers' class-data archive, in its directory
JVM_SWITCH = "IDA_EVAL_JVM_CDS"  # 0/false/no/off: javac, kotlinc and scalac run without it
BUILD_TIMEOUT_S = 600.0  # a header: ~7 s of CPU on an idle core, an archive up to ~15 s; generous for a busy machine
MANIFEST = "manifest.json"  # {relative path: size} of a finished directory, written last


class _Unavailable(Exception):
    """Why the file cannot be had here (the warning's text)."""


@dataclass(frozen=True)
class _Kind:
    """One kind of precompiled file: what it is keyed on, how it is built and checked, how a compile uses it."""

    prefix: str  # of its cache directory: "<prefix>-<key>"
    what: str  # in messages
    switch: str
    inputs: Callable[[str, Language], tuple[str, ...]]  # (compiler path, language) -> the key's parts
    build: Callable[[str, Language, Path], None]  # into a temporary directory; raises _Unavailable
    argv: Callable[[tuple[str, ...], str], tuple[str, ...]]  # (compile argv, directory) -> the argv using it
    without: str  # what compiling without it costs (the warning's end)


# ------------------------------------------------------------------------------------------ C++ header


def _header_inputs(exe: str, lang: Language) -> tuple[str, ...]:
    header = _find_header(exe)
    st = header.stat()
    return compiler_banner(exe), str(header), str(st.st_size), str(st.st_mtime_ns)


def _find_header(exe: str) -> Path:
    """The ``bits/stdc++.h`` an ``#include <bits/stdc++.h>`` of ``exe`` reads: the first one on its search path."""
    res = _run([exe, "-x", "c++", "-E", "-v", os.devnull])
    lines = res.stderr.splitlines()
    try:
        start = lines.index("#include <...> search starts here:") + 1
        dirs = [ln.strip() for ln in lines[start : lines.index("End of search list.")]]
    except ValueError:
        raise _Unavailable(f"{exe} -v printed no include search list") from None
    for d in dirs:
        if (Path(d) / HEADER).is_file():
            return Path(d) / HEADER
    raise _Unavailable(f"no {HEADER} on {exe}'s include path")


def _build_header(exe: str, lang: Language, tmp: Path) -> None:
    header = _find_header(exe)
    (tmp / HEADER).parent.mkdir()
    res = _run([exe, "-x", "c++-header", str(header), "-o", str(tmp / f"{HEADER}.gch")])
    if res.returncode != 0:
        raise _Unavailable(f"{exe} -x c++-header {header} failed: {res.stderr.strip()[:300]}")
    probe = _run([exe, "-I", str(tmp), "-H", "-fsyntax-only", "-x", "c++", "-"], stdin=f"#include <{HEADER}>\n")
    used = f"! {tmp / HEADER}.gch"
    if probe.returncode != 0 or used not in probe.stderr.splitlines():
        raise _Unavailable(f"{exe} does not use the header it precompiled ({probe.stderr.strip()[:300]})")


# ------------------------------------------------------------------------------------------ JVM archive

# What the archive is trained on: a program of each language's MBXP shape (the prompt's imports, a function,
# the test's checks), compiled once with -XX:ArchiveClassesAtExit; the classes that compile loaded are archived
_TRAINING = {
    "java": (
        "import java.io.*;\nimport java.lang.*;\nimport java.util.*;\nimport java.math.*;\n\n\nclass Count {\n"
        "    public static HashMap<String, Integer> count(List<String> words) {\n",
        "        HashMap<String, Integer> seen = new HashMap<>();\n"
        "        for (String w : words) seen.put(w.toLowerCase(), seen.getOrDefault(w, 0) + 1);\n"
        "        return seen;\n    }\n}",
        "\n\nclass Main {\n    public static void main(String[] args) throws Exception {\n"
        '        HashMap<String, Integer> x0 = Count.count(Arrays.asList("a", "b", "a"));\n'
        '        if (!(x0.equals(new HashMap<>(Map.of("a", 2, "b", 1))))) {\n'
        '            throw new java.lang.Exception("Exception -- test case 0 did not pass. x0 = " + x0);\n'
        "        }\n}\n}\n",
    ),
    "kotlin": (
        "/**\n * Count the words.\n */\nfun count(words : List<String>) : Map<String, Int> {\n",
        "    return words.map { it.toLowerCase() }.groupingBy { it }.eachCount()\n}",
        '\nfun main() {\n    var x0 : Map<String, Int> = count(listOf("a", "b", "a"));\n'
        '    if (x0 != mapOf("a" to 2, "b" to 1)) {\n'
        '        throw Exception("Exception -- test case 0 did not pass. x0 = " + x0)\n    }\n}\n',
    ),
    "scala": (
        "import scala.math._\nimport scala.collection.mutable._\nobject Main extends App {\n"
        "    def count(words : List[String]) : scala.collection.immutable.Map[String, Int] = {\n",
        "        words.map(_.toLowerCase).groupBy(identity).map { case (w, ws) => (w, ws.size) }\n    }",
        '\n\n    var x0 = count(List("a", "b", "a"))\n'
        '    assert(x0 == scala.collection.immutable.Map("a" -> 2, "b" -> 1), "Exception -- test case 0 x0 = " + x0)\n}\n',
    ),
}


# The training compile's JVM (and the check's): a heap under 32 GiB, so compressed oops and class pointers, as in
# every sandbox (a JVM there sizes its heap from the memory cgroup's limit). A JVM on a machine with 128 GiB or more
# sizes a 32 GiB heap without them, and a JVM whose modes differ from the archive's does not use it (silently).
_TRAINING_JVM_FLAGS = ("-J-Xmx1g",)


def _file_identity(path: str) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def _archive_inputs(exe: str, lang: Language) -> tuple[str, ...]:
    """The compiler's launcher and the JVM it starts (``java`` on the sandbox's PATH, or the launcher's own JDK
    for ``javac``: the files of both count), the flags and the language's environment: what the archive's
    classes and its validity depend on."""
    java = shutil.which("java", path=SAFE_PATH)
    jvms = {Path(p).resolve().parent.parent for p in (exe, java) if p}  # javac's JDK is usually java's
    libjvm = sorted(str(p) for d in jvms for p in d.glob("lib/server/libjvm.so"))
    return (
        _file_identity(exe),
        *(_file_identity(p) for p in libjvm),
        *JVM_COMPILER_FLAGS,
        *_TRAINING_JVM_FLAGS,
        *(f"{k}={v}" for k, v in lang.env),
    )


def _build_archive(exe: str, lang: Language, tmp: Path) -> None:
    archive = tmp / ARCHIVE
    dump = _compile_training(exe, lang, tmp, f"-J-XX:ArchiveClassesAtExit={archive}")
    if dump.returncode != 0 or not archive.is_file():
        raise _Unavailable(f"{exe} wrote no class-data archive: {(dump.stdout + dump.stderr).strip()[:300]}")
    # -Xshare:on: a JVM that cannot map the archive refuses to start instead of running without it
    probe = _compile_training(exe, lang, tmp, "-J-Xshare:on", *_archive_flags(str(tmp)))
    if probe.returncode != 0:
        raise _Unavailable(f"{exe} cannot use the archive it wrote: {(probe.stdout + probe.stderr).strip()[:300]}")


def _compile_training(exe: str, lang: Language, tmp: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """The training program of ``lang`` compiled by ``exe`` with JVM ``flags`` in a scratch directory of ``tmp``
    (removed after), with the language's own environment (``JAVA_OPTS``)."""
    assert lang.compile is not None
    prompt, completion, test = _TRAINING[lang.name]
    work = Path(tempfile.mkdtemp(prefix=".work.", dir=tmp))
    try:
        for name, text in assemble(lang, {"prompt": prompt, "test": test, "task_id": "training"}, completion):
            (work / name).write_text(text)
        return _run([exe, *_TRAINING_JVM_FLAGS, *flags, *lang.compile[1:]], cwd=work, lang=lang)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _archive_flags(directory: str) -> tuple[str, ...]:
    return f"-J-XX:SharedArchiveFile={directory}/{ARCHIVE}", "-J-XX:+VerifySharedSpaces"


# ------------------------------------------------------------------------------------------ both

_HEADER_KIND = _Kind(
    prefix="pch",
    what=f"precompiled <{HEADER}>",
    switch=SWITCH,
    inputs=_header_inputs,
    build=_build_header,
    argv=lambda compile, d: (compile[0], "-I", d, *compile[1:]),
    without="the same binaries, about 4x the compile time",
)
_ARCHIVE_KIND = _Kind(
    prefix="cds",
    what="class-data archive",
    switch=JVM_SWITCH,
    inputs=_archive_inputs,
    build=_build_archive,
    argv=lambda compile, d: (compile[0], *_archive_flags(d), *compile[1:]),
    without="the same class files, about 1.1-1.3x the compile's CPU time",
)
_KINDS = {"cpp": _HEADER_KIND, "java": _ARCHIVE_KIND, "kotlin": _ARCHIVE_KIND, "scala": _ARCHIVE_KIND}

_lock = threading.Lock()
_dirs: dict[tuple[str, str], str | None] = {}  # (language, compiler) -> its directory, None where none can be had


def compile_command(
    lang: Language, isolation: Isolation, tmp_root: str | None = None
) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """``(compile argv, read-only directories it needs)`` of ``lang``'s programs run under ``isolation``.

    C++: ``g++ -I DIR ida_end.cpp prog.cpp -o prog`` (``DIR``: :func:`header_dir`); Java, Kotlin, Scala:
    the compiler with ``-J-XX:SharedArchiveFile=DIR/classes.jsa -J-XX:+VerifySharedSpaces``
    (:func:`archive_dir`); where the directory can be built, the sandbox's programs can read it
    (:func:`ida_eval.sandbox.readable_in_sandbox`) and its switch does not turn it off. Every other case:
    the language's own command.
    """
    kind = _KINDS.get(lang.name)
    if lang.compile is None or kind is None or not switch_enabled(kind.switch):
        return lang.compile, ()
    directory = _directory(kind, lang, lang.compile[0])
    if directory is None:
        return lang.compile, ()
    if not readable_in_sandbox(directory, isolation, tmp_root):
        warn_once(
            (__name__, "unreadable", directory, isolation.privilege),
            f"ida_eval: the {kind.what} in {directory} is out of reach of the sandbox's programs "
            f"({isolation.level}/{isolation.privilege}: a directory on its path is not readable for their uid); "
            f"{lang.name} programs compile without it",
            RuntimeWarning,
            stacklevel=4,
        )
        return lang.compile, ()
    return kind.argv(lang.compile, directory), (directory,)


def header_dir(compiler: str) -> str | None:
    """The directory holding ``bits/stdc++.h.gch`` for ``compiler`` (a name on the sandbox's ``PATH``),
    built into the cache on first use; ``None`` (with a warning, once) where it cannot be built."""
    return _directory(_HEADER_KIND, LANGUAGES["cpp"], compiler)


def archive_dir(lang: Language) -> str | None:
    """The directory holding ``classes.jsa`` for ``lang``'s compiler (Java, Kotlin or Scala), built into the
    cache on first use; ``None`` (with a warning, once) where it cannot be built."""
    assert lang.compile is not None
    return _directory(_ARCHIVE_KIND, lang, lang.compile[0])


def _directory(kind: _Kind, lang: Language, compiler: str) -> str | None:
    with _lock:
        if (lang.name, compiler) not in _dirs:
            try:
                _dirs[lang.name, compiler] = _cached(kind, lang, compiler)
            except _Unavailable as e:
                warn_once(
                    (__name__, "unavailable", lang.name, compiler),
                    f"ida_eval: no {kind.what} for {compiler} ({e}); {lang.name} programs compile without it "
                    f"({kind.without})",
                    RuntimeWarning,
                    stacklevel=5,
                )
                _dirs[lang.name, compiler] = None
        return _dirs[lang.name, compiler]


def _cached(kind: _Kind, lang: Language, compiler: str) -> str:
    exe = shutil.which(compiler, path=SAFE_PATH)
    if exe is None:
        raise _Unavailable(f"{compiler} not found")
    key = build_key(*kind.inputs(exe, lang))
    root = cache_dir("ida_eval")
    target = root / f"{kind.prefix}-{key}"
    if _intact(target):
        return os.path.realpath(target)
    try:
        with file_lock(root / f"{kind.prefix}.lock"):
            if not _intact(target):
                _build(kind, exe, lang, root, target)
    except OSError as e:
        raise _Unavailable(f"cannot write {target}: {e}") from e
    return os.path.realpath(target)


def _intact(target: Path) -> bool:
    """Whether ``target`` is a finished directory whose files still have the sizes its manifest recorded."""
    try:
        sizes = json.loads((target / MANIFEST).read_text())
        return all((target / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError, AttributeError):
        return False


def _build(kind: _Kind, exe: str, lang: Language, root: Path, target: Path) -> None:
    """Build into a temporary directory, check, record the files' sizes, rename it into place (an older
    damaged ``target`` is moved aside first, then removed: the caller holds the lock)."""
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(f".{kind.prefix}-*"):  # of a build that was killed: we hold the lock, none is running
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    aside = tmp.with_name(f"{tmp.name}.damaged")  # a leftover too, should this process be killed
    try:
        kind.build(exe, lang, tmp)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        (tmp / MANIFEST).write_text(json.dumps({str(p.relative_to(tmp)): p.stat().st_size for p in files}))
        for path in (tmp, *tmp.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)  # every sandbox uid may read it (mkdtemp made it 0700)
        if target.exists():
            os.rename(target, aside)  # not removed file by file where a compile may be reading it
        os.rename(tmp, target)
    finally:
        for path in (tmp, aside):
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)


def _run(
    argv: list[str], *, stdin: str = "", cwd: Path | None = None, lang: Language | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` run outside the sandbox, as tools are (:func:`ida_eval.languages.tool_env`)."""
    try:
        return subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            env=tool_env(lang),
            cwd=cwd,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise _Unavailable(f"{argv[0]}: {e}") from e
