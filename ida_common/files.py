"""Where outputs go and how they appear: complete under their final name, or not at all.

:func:`atomic_output` writes a file to a temporary in the target's directory, fsyncs it, moves it into
place with ``os.replace`` (atomic on POSIX within one filesystem) and fsyncs the directory so the
rename itself survives a crash. On any exception -- an encoding error half-way through a checkpoint,
Ctrl-C, a full disk -- the temporary file is removed and an existing file under the final name is
untouched. Every writer of the project (checkpoints, summaries, logs, shard indexes) uses it.

Three rules every ida command that writes follows (issue 11: ``quantize HF HF`` replaced its own
BF16 source and then crashed; a kill mid-copy left a truncated ``tokenizer.json`` under its final
name; temporary files of killed runs piled up):

* :func:`check_output` -- before anything is read or written: the output is never the input, never
  inside it and never contains it (paths compared after resolving symlinks and ``..``, and by device
  and inode, so a bind mount or a symlinked parent does not hide the overlap); an existing output is
  replaced only with ``overwrite`` (``--overwrite``); a file output is not an existing directory.
  Each refusal is one ``ValueError`` line naming the path and what to do.
* :func:`atomic_directory` -- the output directory is built in a hidden sibling
  ``.NAME.XXXXXXXX.tmp``, every file and the directory are fsynced, and it is moved into place with
  one ``rename`` (or, over an existing directory with ``overwrite``, one atomic exchange,
  ``renameat2(RENAME_EXCHANGE)``, after which the old copy is deleted). At every moment ``NAME`` is
  the complete old directory, the complete new one, or absent -- never half of either.
* :func:`sweep_stale` -- a temporary (file or directory) of the form ``.NAME.XXXXXXXX.tmp`` whose
  writer died is removed by the next writer of ``NAME``. A writer holds an exclusive ``flock`` on
  its temporary for as long as it lives (the kernel drops it when the process dies, even by
  SIGKILL), so the sweep removes only temporaries it can lock: never a live writer's, never a file
  that merely looks similar (the random part must be mkstemp's 8 characters).

:func:`copy_file_atomic` copies one file through :func:`atomic_output`. Kill points
(:mod:`ida_common.killpoint`): ``atomic_directory.complete`` (everything written and fsynced, not yet in place) and
``copy_file.partial`` (half of a file copied).

Example:
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> out = os.path.join(root, "out")
    >>> with atomic_directory(out) as tmp:
    ...     _ = (tmp / "a.txt").write_text("hello")
    >>> sorted(os.listdir(out)), sorted(os.listdir(root))
    (['a.txt'], ['out'])
    >>> check_output(os.path.join(out, "sub"), inputs=[out], kind="dir")
    Traceback (most recent call last):
    ...
    ValueError: .../out/sub: is inside the input .../out; write the output somewhere else
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from ida_common.killpoint import kill_point

__all__ = [
    "atomic_directory",
    "atomic_output",
    "atomic_write_text",
    "check_output",
    "copy_file_atomic",
    "fsync_dir",
    "fsync_tree",
    "lock_temporary",
    "nearest_existing",
    "sweep_stale",
    "temp_owner",
    "temp_pattern",
]

COPY_CHUNK = 1 << 20  # 1 MiB copy buffer


# --------------------------------------------------------------------------------------------------
# may the output be written there?


def _ids_upwards(path: Path) -> list[tuple[int, int]]:
    """``(st_dev, st_ino)`` of ``path`` (when it exists) and of every existing ancestor."""
    ids = []
    p = Path(os.path.realpath(path))
    while True:
        with contextlib.suppress(OSError):
            st = os.stat(p)
            ids.append((st.st_dev, st.st_ino))
        if p.parent == p:
            return ids
        p = p.parent


def nearest_existing(path: str | os.PathLike[str]) -> Path:
    """``path`` (made absolute) or its nearest ancestor that exists: where a write to ``path`` is decided."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output(
    out: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    overwrite: bool = False,
    kind: str = "file",
    what: str = "",
) -> Path:
    """Refuse an output that would overwrite an input, or an existing output without ``overwrite``.

    Args:
        out: the file or directory the command will write.
        inputs: the files/directories the command reads.
        overwrite: ``--overwrite`` was given: an existing output may be replaced (never an input).
        kind: ``"file"`` or ``"dir"``: what ``out`` will be. An existing empty directory is not
            "existing output" for ``kind="dir"`` (nothing would be lost).
        what: how the command calls the argument (``"OUT_DIR"``), put before the path in messages.

    Returns:
        ``Path(out)``.

    Raises:
        ValueError: one line, ``[WHAT ]OUT: reason; what to do``.
    """
    target = Path(out)
    name = f"{what} {target}" if what else str(target)
    real = Path(os.path.realpath(target))  # symlinks and .. resolved (also through missing parts)
    out_ids = _ids_upwards(real)  # the output first (when it exists), then its ancestors
    real_id = out_ids[0] if os.path.exists(real) else None
    for src in inputs:
        src_p = Path(src)
        try:
            st = os.stat(src_p)
        except OSError:
            continue  # a missing input is the reader's error to report
        src_id = (st.st_dev, st.st_ino)
        if real_id == src_id:
            raise ValueError(
                f"{name}: is the input {src_p} itself; writing there would destroy it; choose another output"
            )
        if src_id in out_ids:
            raise ValueError(f"{name}: is inside the input {src_p}; write the output somewhere else")
        if real_id is not None and real.is_dir() and real_id in _ids_upwards(src_p):
            raise ValueError(f"{name}: contains the input {src_p}; write the output somewhere else")
    exists = os.path.lexists(target) or real_id is not None
    if not exists:
        return target
    if kind == "file":
        if os.path.isdir(real):
            raise ValueError(
                f"{name}: is a directory; give the output file's name (e.g. {target / 'model.safetensors'})"
            )
        if not overwrite:
            raise ValueError(f"{name}: exists; pass --overwrite to replace it")
    elif kind == "dir":
        if not os.path.isdir(real) or os.path.islink(target):
            raise ValueError(f"{name}: exists and is not a directory; remove it or choose another output")
        if not overwrite and any(os.scandir(real)):
            raise ValueError(f"{name}: exists and is not empty; pass --overwrite to replace it")
    else:
        raise ValueError(f"kind must be 'file' or 'dir', got {kind!r}")
    return target


# --------------------------------------------------------------------------------------------------
# temporaries: names, locks, the sweep


_TEMP_TAIL = r"\.[a-z0-9_]{8}\.tmp"  # mkstemp's 8 characters, then .tmp


def temp_pattern(name: str) -> re.Pattern[str]:
    """The names of the temporaries written for ``name``: ``.NAME.XXXXXXXX.tmp``."""
    return re.compile(rf"\.{re.escape(name)}{_TEMP_TAIL}")


def temp_owner(entry: str) -> str | None:
    """The ``NAME`` whose temporary ``entry`` is (``.NAME.XXXXXXXX.tmp``), else None."""
    m = re.fullmatch(rf"\.(.+?){_TEMP_TAIL}", entry)
    return m.group(1) if m else None


def lock_temporary(fd: int) -> bool:
    """Take the writer's exclusive lock on a just-created temporary; False if a sweep removed it first.

    Between ``mkstemp``/``mkdtemp`` and this call a concurrent :func:`sweep_stale` could lock and
    delete the new temporary; the caller then makes another one.
    """
    fcntl.flock(fd, fcntl.LOCK_EX)
    return os.fstat(fd).st_nlink > 0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def sweep_stale(directory: str | os.PathLike[str], name: str) -> list[Path]:
    """Remove the temporaries of ``name`` in ``directory`` whose writer is gone; returns what was removed.

    Only names matching :func:`temp_pattern` are considered, and only those whose writer's ``flock``
    can be taken (the writer died: the kernel released it). A live writer keeps its temporary.
    """
    d = Path(directory)
    pattern = temp_pattern(name)
    removed = []
    try:
        entries = [e for e in os.scandir(d) if pattern.fullmatch(e.name)]
    except OSError:
        return removed
    for e in entries:
        p = d / e.name
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            st = os.lstat(p)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                continue  # never a link, fifo or socket that merely has our name
            fd = os.open(p, flags)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live writer holds it
            _remove(p)  # under our lock: a writer that raced us sees st_nlink == 0 and starts over
            removed.append(p)
        finally:
            os.close(fd)
    return removed


# --------------------------------------------------------------------------------------------------
# fsync, atomic copies, atomic directories


def _fsync_path(path: Path, *, directory: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory: makes the renames and creations in it durable."""
    _fsync_path(Path(path), directory=True)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """fsync every regular file and directory under ``root`` (``root`` included), files first."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for f in filenames:
            p = Path(dirpath, f)
            if p.is_file() and not p.is_symlink():
                _fsync_path(p, directory=False)
        with contextlib.suppress(OSError):
            _fsync_path(Path(dirpath), directory=True)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_output`: complete or not at all."""
    with atomic_output(path) as f:
        f.write(text.encode("utf-8"))


def copy_file_atomic(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copy ``src`` to ``dst`` through :func:`atomic_output` (locked temporary, fsync, rename).

    A kill at any moment leaves ``dst`` as it was (absent or the previous complete file) plus at most
    a stale temporary that the next writer of ``dst`` sweeps (kill point ``copy_file.partial``: half
    of the bytes copied).
    """
    with open(src, "rb") as fin, atomic_output(dst) as fout:
        size = os.fstat(fin.fileno()).st_size
        copied = 0
        while chunk := fin.read(COPY_CHUNK):
            fout.write(chunk)
            copied += len(chunk)
            if copied >= size // 2 > 0:
                fout.flush()
                kill_point("copy_file.partial")


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory in a hidden locked sibling and move it into place complete, or not at all.

    Yields the temporary directory to write into. On success every file and directory in it is
    fsynced and it becomes ``path``: a plain ``rename`` when ``path`` is absent or an empty
    directory; with ``overwrite``, an atomic exchange with the existing ``path`` (whose old contents
    are then deleted). On an exception the temporary is removed and ``path`` is untouched; after a
    kill the next call for the same ``path`` sweeps it (:func:`sweep_stale`).

    Raises:
        ValueError: ``path`` exists and is not empty, without ``overwrite`` (checked again at the end).
        OSError: ``path``'s directory cannot be written (a file in the way, a read-only mount,
            permissions); its ``filename`` is ``path`` and the message says which ancestor blocks it.
    """
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(parent, out.name)
        while True:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
            lock_fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
            if lock_temporary(lock_fd):
                break
            os.close(lock_fd)
    except OSError as exc:  # name the output the caller gave, not our hidden temporary
        base = nearest_existing(parent)
        why = (
            f"{base} is a file, not a directory"
            if not base.is_dir()
            else (f"cannot create a directory in {base} ({exc.strerror or exc})")
        )
        raise OSError(exc.errno, why, str(out)) from None
    try:
        yield tmp
        fsync_tree(tmp)
        kill_point("atomic_directory.complete")
        try:
            _move_into_place(tmp, out, overwrite=overwrite)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot move the finished output into place ({exc.strerror or exc})", str(out)
            ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock_fd)
    with contextlib.suppress(OSError):
        _fsync_path(parent, directory=True)


def _move_into_place(tmp: Path, out: Path, *, overwrite: bool) -> None:
    if not os.path.lexists(out):
        os.rename(tmp, out)
        return
    if out.is_dir() and not out.is_symlink() and not any(os.scandir(out)):
        os.rename(tmp, out)  # rename(2) replaces an empty directory
        return
    if not overwrite:
        raise ValueError(f"{out}: exists and is not empty; pass --overwrite to replace it")
    if not out.is_dir() or out.is_symlink():
        raise ValueError(f"{out}: exists and is not a directory; remove it or choose another output")
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # the old contents, now under the temporary's name
        return
    # No RENAME_EXCHANGE on this filesystem: two renames. Between them the old copy is complete under
    # a temporary name and the new one complete under another; a kill there loses neither until the
    # next run (which rewrites the output) sweeps them.
    fd, old_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    os.unlink(old_name)
    os.rename(out, old_name)
    os.rename(tmp, out)
    shutil.rmtree(old_name, ignore_errors=True)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path``; on success fsync it, ``os.replace`` it, fsync the dir.

    On any exception the temporary file is removed and ``path`` is untouched. The yielded file's
    ``.name`` is the temporary path (useful to read back before the rename). The new file gets the
    permissions a plain ``open(path, "wb")`` would (``0o666`` less the umask).

    Raises:
        OSError: the temporary file cannot be created; the message names ``path`` and the directory.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
        >>> with atomic_output(p) as f:
        ...     _ = f.write(b"hello")
        >>> open(p, "rb").read()
        b'hello'
    """
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    sweep_stale(parent, target.name)  # temporaries of writers of this file that were killed
    while True:
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
        except OSError as exc:
            raise OSError(
                exc.errno, f"{target}: cannot create a temporary file in {parent}: {exc.strerror or exc}"
            ) from None
        if lock_temporary(fd):  # held until we are done: the sweep of another writer leaves it alone
            break
        os.close(fd)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        _fsync_path(parent, directory=True)
