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
* **cffi declarations** (:func:`cffi_ffi`): the C declarations each library is opened with are
  parsed by cffi once per machine, not once per process: the parse is saved as a generated
  "out-of-line ABI" module in the cache (~0.5 ms to import instead of ~12 ms of pycparser).
* **Concurrency**: builders take an exclusive ``fcntl`` lock (:func:`file_lock`) around
  check-build-install; outputs are written to a temporary file in the same directory, fsynced and
  ``os.replace``d into place (:func:`install_atomic`), so readers never see a partial library.

Standard library only, like all of :mod:`ida_common`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Hashable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "CACHE_ENV",
    "DISTRIBUTION",
    "LEGACY_CACHE_ENVS",
    "build_key",
    "cache_dir",
    "cache_root",
    "cffi_ffi",
    "compiler_banner",
    "cpu_identity",
    "file_lock",
    "find_c_compiler",
    "install_atomic",
    "package_version",
    "switch_enabled",
    "tool_from_env",
    "warn_once",
]

CACHE_ENV = "IDA_CACHE_DIR"  # root of every native build cache
# old per-build variables still honoured (with a warning) when IDA_CACHE_DIR is unset: component -> variable
LEGACY_CACHE_ENVS: dict[str, str] = {"nvfp4_cuda": "NVFP4_CUDA_CACHE_DIR"}
DISTRIBUTION = "ida"  # the installed distribution whose version goes into every build key
_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")
_warned: set[Hashable] = set()


def warn_once(key: Hashable, message: str, category: type[Warning] = UserWarning, stacklevel: int = 3) -> None:
    """``warnings.warn(message, category)`` the first time ``key`` is seen in this process, never again.
    ``stacklevel`` counts from here, as ``warnings.warn``'s does: the default 3 names the line that called the
    function that called this."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, category, stacklevel=stacklevel)


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
        warn_once(
            legacy,
            f"{legacy} is deprecated; set {CACHE_ENV} (the cache of every ida native build, "
            f"this one in {CACHE_ENV}/{component})",
        )
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
        warn_once(
            variable,
            f"{variable}={os.environ[variable]!r} is not one of 0/1/false/true/no/yes/off/on; "
            "ignored (the native path stays on)",
        )
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
    raise FileNotFoundError(
        f"{variable}={value}: no such executable (it should name the {what}; "
        f"unset {variable} to search the usual places)"
    )


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


def cffi_ffi(component: str, cdef: str) -> Any:
    """A cffi FFI declaring ``cdef``, ready for ``ffi.dlopen`` (cffi's ABI mode).

    The declarations are parsed once per machine: cffi's "out-of-line ABI" module for them
    (``_ida_ffi_<key>.py``, keyed on ``cdef`` and the cffi version) is generated into
    ``cache_dir(component)`` under the lock and imported from there. Importing it takes ~0.5 ms;
    parsing ``cdef`` with pycparser in every process took ~12 ms (the codec's kernel). Where the
    module cannot be written or imported (read-only cache, damaged file), the declarations are
    parsed in this process instead: the same FFI, only slower.

    Example:
        >>> ffi = cffi_ffi("example", "size_t strlen(const char *s);")
        >>> ffi.dlopen(None).strlen(b"four")
        4
    """
    import cffi  # a dependency of the packages that call this; ida_common itself stays stdlib-only

    name = f"_ida_ffi_{build_key(cdef, cffi.__version__, length=20)}"
    path = cache_dir(component) / f"{name}.py"
    try:
        return _import_ffi(name, path)
    except Exception:  # noqa: BLE001 -- not generated yet, or damaged: (re)generate it
        return _generate_ffi(cffi, cdef, name, path)


def _generate_ffi(cffi: Any, cdef: str, name: str, path: Path) -> Any:
    """Write the out-of-line module ``name`` at ``path`` (atomically, under the lock) and import it;
    where that fails, an FFI parsed in this process."""
    try:
        with file_lock(path.with_name(f"{name}.lock")):
            builder = cffi.FFI()
            builder.cdef(cdef)
            builder.set_source(name, None)
            with install_atomic(path) as tmp, contextlib.redirect_stdout(io.StringIO()):  # cffi prints "generating"
                builder.emit_python_code(str(tmp))
        return _import_ffi(name, path)
    except Exception:  # noqa: BLE001 -- only speed is at stake: parse the declarations in this process
        ffi = cffi.FFI()
        ffi.cdef(cdef)
        return ffi


def _import_ffi(name: str, path: Path) -> Any:
    """The ``ffi`` object of the generated module at ``path``; ImportError (or what importing
    raised) when the file is missing or is not such a module."""
    import _cffi_backend

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not importable")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ffi = getattr(module, "ffi", None)
    if not isinstance(ffi, _cffi_backend.FFI):
        raise ImportError(f"{path}: not a cffi out-of-line module")
    return ffi
