"""A precompiled ``bits/stdc++.h`` for the compiles of C++ programs: the same binaries in about a quarter of the time.

Every MBCPP prompt begins with ``#include <bits/stdc++.h>`` (848 of 848), and parsing that header is
almost all of the reference compile ``g++ ida_end.cpp prog.cpp -o prog`` (about 3 s of CPU here; 0.75 s
with the header precompiled). GCC looks for ``bits/stdc++.h.gch`` in each include directory before the
header itself, and uses it only when the same compiler built it with compatible options; otherwise it
reads the header as before. So the compile command gets ``-I DIR``, where ``DIR/bits/stdc++.h.gch`` was
compiled from the very header the compile would read: the binaries are byte-identical, and a
precompiled header GCC cannot use costs time, never a verdict (docs/eval.md, "C++ compiles").

* **Built once per machine and compiler** into the ida cache
  (:func:`ida_common.native_build.cache_dir` ``("ida_eval") / "pch-<key>"``; the key covers the
  compiler's ``--version``, the header's path, size and mtime, and ida's version) under a file lock,
  in a temporary directory that is checked (GCC must report using it) and then renamed into place:
  about 7 s of CPU and 100 MB, once. Where it cannot be built (no ``g++``, a compiler without
  ``bits/stdc++.h``, a full disk), a warning says so once and programs compile without it.
* **Shared read-only.** It is the one file every task's compile reads; no program can write it: in
  the namespace modes it is mounted back read-only into each sandbox
  (:attr:`ida_eval.sandbox_types.ProgramJob.read_only`), under ``setuid`` programs run as another uid.
  Where a program's uid could not reach it (a root runner without namespaces, the cache under root's
  0700 home), it is not passed (``g++`` fails on an include directory it may not enter instead of
  skipping it; :func:`ida_eval.sandbox.readable_in_sandbox`), with one warning. Under the
  ``rlimits`` fallback a program runs as the cache's owner and could rewrite it, as it could every
  other file of that user: that fallback does not isolate programs at all (docs/eval.md, "Isolation").
* ``IDA_EVAL_CPP_PCH=0`` turns it off: the compile command is then exactly mxeval's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ida_common.native_build import build_key, cache_dir, compiler_banner, file_lock, switch_enabled, warn_once
from ida_eval.languages import Language, tool_env
from ida_eval.sandbox import SAFE_PATH, readable_in_sandbox
from ida_eval.sandbox_types import Isolation

__all__ = ["HEADER", "SWITCH", "compile_command", "header_dir"]

HEADER = "bits/stdc++.h"  # what every MBCPP prompt includes first
SWITCH = "IDA_EVAL_CPP_PCH"  # 0/false/no/off: compile without it
BUILD_TIMEOUT_S = 600.0  # ~7 s of CPU on an idle core; generous for a busy machine

_lock = threading.Lock()
_dirs: dict[str, str | None] = {}


def compile_command(
    lang: Language, isolation: Isolation, tmp_root: str | None = None
) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """``(compile argv, read-only directories it needs)`` of ``lang``'s programs run under ``isolation``.

    C++: ``g++ -I DIR ida_end.cpp prog.cpp -o prog`` with ``DIR`` (:func:`header_dir`), where it can be
    built, the sandbox's programs can read it (:func:`ida_eval.sandbox.readable_in_sandbox`: ``g++``
    fails on an include directory it may not enter) and ``IDA_EVAL_CPP_PCH`` does not turn it off; every
    other case: the language's own command.
    """
    if lang.name != "cpp" or lang.compile is None or not switch_enabled(SWITCH):
        return lang.compile, ()
    directory = header_dir(lang.compile[0])
    if directory is None:
        return lang.compile, ()
    if not readable_in_sandbox(directory, isolation, tmp_root):
        warn_once(
            (__name__, "unreadable", directory, isolation.privilege),
            f"ida_eval: the precompiled <{HEADER}> in {directory} is out of reach of the sandbox's programs "
            f"({isolation.level}/{isolation.privilege}: a directory on its path is not readable for their uid); "
            "C++ programs compile without it",
            RuntimeWarning,
            stacklevel=4,
        )
        return lang.compile, ()
    return (lang.compile[0], "-I", directory, *lang.compile[1:]), (directory,)


def header_dir(compiler: str) -> str | None:
    """The directory holding ``bits/stdc++.h.gch`` for ``compiler`` (a name on the sandbox's ``PATH``),
    built into the cache on first use; ``None`` (with a warning, once) where it cannot be built."""
    with _lock:
        if compiler not in _dirs:
            try:
                _dirs[compiler] = _cached(compiler)
            except _Unavailable as e:
                warn_once(
                    (__name__, "unavailable", compiler),
                    f"ida_eval: no precompiled <{HEADER}> for {compiler} ({e}); C++ programs compile without it "
                    "(the same binaries, about 4x the compile time)",
                    RuntimeWarning,
                    stacklevel=4,
                )
                _dirs[compiler] = None
        return _dirs[compiler]


class _Unavailable(Exception):
    """Why no precompiled header can be had here (the warning's text)."""


def _cached(compiler: str) -> str:
    exe = shutil.which(compiler, path=SAFE_PATH)
    if exe is None:
        raise _Unavailable(f"{compiler} not found")
    header = _find_header(exe)
    st = header.stat()
    key = build_key(compiler_banner(exe), str(header), str(st.st_size), str(st.st_mtime_ns))
    root = cache_dir("ida_eval")
    target = root / f"pch-{key}"
    if (target / f"{HEADER}.gch").is_file():
        return os.path.realpath(target)
    try:
        with file_lock(root / "pch.lock"):
            if not (target / f"{HEADER}.gch").is_file():
                _build(exe, header, root, target)
    except OSError as e:
        raise _Unavailable(f"cannot write {target}: {e}") from e
    return os.path.realpath(target)


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


def _build(exe: str, header: Path, root: Path, target: Path) -> None:
    """Compile ``header`` into ``target`` through a checked temporary directory (renamed into place)."""
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".pch-*"):  # of a build that was killed: we hold the lock, none is running
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        (tmp / HEADER).parent.mkdir()
        res = _run([exe, "-x", "c++-header", str(header), "-o", str(tmp / f"{HEADER}.gch")])
        if res.returncode != 0:
            raise _Unavailable(f"{exe} -x c++-header {header} failed: {res.stderr.strip()[:300]}")
        probe = _run([exe, "-I", str(tmp), "-H", "-fsyntax-only", "-x", "c++", "-"], f"#include <{HEADER}>\n")
        used = f"! {tmp / HEADER}.gch"
        if probe.returncode != 0 or used not in probe.stderr.splitlines():
            raise _Unavailable(f"{exe} does not use the header it precompiled ({probe.stderr.strip()[:300]})")
        for path, mode in ((tmp, 0o755), ((tmp / HEADER).parent, 0o755), (tmp / f"{HEADER}.gch", 0o644)):
            path.chmod(mode)  # every sandbox uid may read it (mkdtemp made it 0700)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _run(argv: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env=tool_env(), timeout=BUILD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise _Unavailable(f"{argv[0]}: {e}") from e
