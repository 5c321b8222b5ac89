"""Atomic file output: a file appears under its final name complete, or not at all.

:func:`atomic_output` writes to a temporary file in the target's directory, fsyncs it, moves it into
place with ``os.replace`` (atomic on POSIX within one filesystem) and fsyncs the directory so the
rename itself survives a crash. On any exception -- an encoding error half-way through a checkpoint,
Ctrl-C, a full disk -- the temporary file is removed and an existing file under the final name is
untouched. Every writer of the project (checkpoints, summaries, logs, shard indexes) uses it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_output"]


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
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise OSError(
            exc.errno, f"{target}: cannot create a temporary file in {parent}: {exc.strerror or exc}"
        ) from None
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
    with contextlib.suppress(OSError):
        dfd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
