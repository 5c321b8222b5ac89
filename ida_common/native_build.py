"""One build cache, one switch syntax, one compiler search and one lock for ida's native code.

Three native builds share these rules: the codec's C kernel (``mxfp8_codec/_native.py``), the NVFP4
CPU fast path (``nvfp4_cuda/cpu_native.py``) and the CUDA library (``nvfp4_cuda/build.py``).

* **Cache**: ``$IDA_CACHE_DIR`` (the variable README names), else ``$XDG_CACHE_HOME/ida``, else
  ``~/.cache/ida``; each build has its own subdirectory (:func:`cache_dir`). The old
  ``$NVFP4_CUDA_CACHE_DIR`` is still honoured for the NVFP4 builds when ``$IDA_CACHE_DIR`` is unset,
  with a one-time warning (it names the NVFP4 directory itself, as before).
* **Switches** (``MXFP8_CODEC_NATIVE``, ``NVFP4_CPU_NATIVE``): ``0/false/no/off`` turn a native path
  off, ``1/true/yes/on`` (or unset / empty) leave it on, case-insensitive; anything else is warned
  about once and ignored (:func:`switch_enabled`).
* **Compilers**: ``$CC`` if set (a name on ``PATH`` or a file), else ``cc``, ``gcc``, ``clang``
  (:func:`find_c_compiler`). A tool named by an environment variable that does not exist is an
  error naming the variable, never silently replaced by another one (:func:`tool_from_env`).
* **Keys**: a library's file name carries a sha256 over everything that affects its bits: sources,
  flags, the compiler's ``--version`` banner, the CPU (for ``-march=native`` code, :func:`cpu_identity`)
  and the installed package version (from package metadata, :func:`package_version`).
* **Concurrency**: builders take an exclusive ``fcntl`` lock (:func:`file_lock`) around
  check-build-install; outputs are written to a temporary file in the same directory, fsynced and
  ``os.replace``d into place (:func:`install_atomic`), so readers never see a partial library.

Standard library only, like all of :mod:`ida_common`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "DISTRIBUTION",
    "LEGACY_CACHE_ENVS",
    "build_key",
    "cache_dir",
    "cache_root",
    "compiler_banner",
    "cpu_identity",
    "file_lock",
    "find_c_compiler",
    "install_atomic",
    "package_version",
    "switch_enabled",
    "tool_from_env",
]

CACHE_ENV = "IDA_CACHE_DIR"  # root of every native build cache
# old per-build variables still honoured (with a warning) when IDA_CACHE_DIR is unset: component -> variable
LEGACY_CACHE_ENVS: dict[str, str] = {"nvfp4_cuda": "NVFP4_CUDA_CACHE_DIR"}
DISTRIBUTION = "ida"  # the installed distribution whose version goes into every build key
_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=3)


def cache_root() -> Path:
    """``$IDA_CACHE_DIR``, else ``$XDG_CACHE_HOME/ida``, else ``~/.cache/ida``.

    Example:
        >>> cache_root().name in ("ida",) or "IDA_CACHE_DIR" in os.environ
        True
    """
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ida"


def cache_dir(component: str) -> Path:
    """The cache directory of one native build: ``cache_root() / component``.

    For a component with a legacy variable (``nvfp4_cuda``: ``$NVFP4_CUDA_CACHE_DIR``) that variable
    is used as the directory itself when ``$IDA_CACHE_DIR`` is unset, with a one-time warning.
    """
    legacy = LEGACY_CACHE_ENVS.get(component)
    if legacy and os.environ.get(legacy) and not os.environ.get(CACHE_ENV):
        _warn_once(legacy, f"{legacy} is deprecated; set {CACHE_ENV} (the cache of every ida native build, "
                           f"this one in {CACHE_ENV}/{component})")
        return Path(os.environ[legacy])
    return cache_root() / component


def switch_enabled(variable: str) -> bool:
    """Whether the native path that ``variable`` switches is on (the one on/off syntax).

    Example:
        >>> os.environ["IDA_DOCTEST_SWITCH"] = "off"; switch_enabled("IDA_DOCTEST_SWITCH")
        False
    """
    value = os.environ.get(variable, "").strip().lower()
    if value in _OFF:
        return False
    if value not in _ON:
        _warn_once(variable, f"{variable}={os.environ[variable]!r} is not one of 0/1/false/true/no/yes/off/on; "
                             "ignored (the native path stays on)")
    return True


def tool_from_env(variable: str, what: str) -> str | None:
    """The executable named by ``$variable`` (a path or a name on ``PATH``), None when unset.

    Raises:
        FileNotFoundError: the variable is set but names nothing executable (the message names the
            variable and its value, e.g. ``NVFP4_CUDA_NVCC=/nonexistent/nvcc: no such executable``).
    """
    value = os.environ.get(variable)
    if not value:
        return None
    found = shutil.which(value) if os.sep not in value else None
    if found:
        return found
    if Path(value).is_file() and os.access(value, os.X_OK):
        return value
    raise FileNotFoundError(f"{variable}={value}: no such executable (it should name the {what}; "
                            f"unset {variable} to search the usual places)")


def find_c_compiler() -> str | None:
    """``$CC`` (must exist if set), else the first of ``cc``, ``gcc``, ``clang`` on ``PATH``, else None.

    Raises:
        FileNotFoundError: ``$CC`` is set but names nothing executable.
    """
    cc = tool_from_env("CC", "C compiler")
    if cc:
        return cc
    for cand in ("cc", "gcc", "clang"):
        path = shutil.which(cand)
        if path:
            return path
    return None


def compiler_banner(compiler: str) -> str:
    """``compiler --version`` output (part of every build key); the path itself if it cannot run."""
    try:
        res = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return compiler
    return res.stdout.strip() or compiler


def cpu_identity() -> str:
    """Machine, model name and feature flags of this CPU (``-march=native`` code is CPU-specific)."""
    ident = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    ident.append(line.strip())
                    if len(ident) >= 5:
                        break
    except OSError:
        pass
    return "\n".join(ident)


def package_version() -> str:
    """The installed ``ida`` version (importlib.metadata); ``"0+unknown"`` when not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def build_key(*parts: bytes | str, length: int = 16) -> str:
    """The first ``length`` hex digits of sha256 over ``parts`` (NUL-separated) and the package version.

    Example:
        >>> len(build_key(b"source", "-O3"))
        16
    """
    h = hashlib.sha256()
    for part in (*parts, package_version()):
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:length]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on ``path`` (created if needed) for the ``with`` block.

    On platforms without ``fcntl`` the block runs unlocked (builds are still installed atomically).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def install_atomic(target: Path) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success fsync it and ``os.replace`` it onto ``target``.

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> with install_atomic(d / "lib.so") as tmp: _ = tmp.write_bytes(b"x")
        >>> (d / "lib.so").read_bytes()
        b'x'
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
