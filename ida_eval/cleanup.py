"""Remove whatever an untrusted program left in its work directory: no recursion, no surprises.

``shutil.rmtree`` recurses once per directory level, so a program that does
``for i in range(3000): os.mkdir("d"); os.chdir("d")`` makes it raise ``RecursionError`` (and the
paths are longer than ``PATH_MAX`` anyway). :func:`remove_tree` walks the tree iteratively with a
single open directory descriptor at a time (descending with ``openat(name, O_NOFOLLOW)``, coming
back with ``openat("..")`` checked against the remembered device and inode), so its depth is bounded
only by memory for the names, and every operation is relative to a directory descriptor (no path
length limit, no symlink is ever followed). On the way it copes with what a program can leave:

* directories without read/write/search permission: ``chmod 0700`` and retry;
* immutable or append-only entries (``chattr +i``/``+a``, possible for a program that runs as root
  in the ``rlimits`` fallback): the flags are cleared (``FS_IOC_SETFLAGS``) and the removal retried;
* fifos, sockets, device nodes and symlinks: unlinked without ever being opened;
* huge numbers of files: each directory is listed once, names only.

What still cannot be removed (a mount point, a file system gone read-only) is skipped; everything
else is removed, and one :class:`OSError` then names the first failure and how many there were.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import stat
import struct
from collections.abc import Callable

FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long) (the kernel reads and writes an int)
FS_IOC_SETFLAGS = 0x40086602  # _IOW('f', 2, long)
FS_IMMUTABLE_FL = 0x00000010
FS_APPEND_FL = 0x00000020
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_ALL = 0o700  # mode given to a directory we must list, enter or change


@dataclasses.dataclass
class _Level:
    """One directory on the way down: its name in the parent, identity and subdirectories to do."""

    name: str
    ident: tuple[int, int]  # (st_dev, st_ino): the ".." we come back through must be this one
    subdirs: list[str] | None = None


class _Errors:
    def __init__(self) -> None:
        self.count = 0
        self.first: OSError | None = None

    def add(self, exc: OSError, where: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = OSError(exc.errno, f"{exc.strerror or exc}", where)


def _clear_flags(name: str, dir_fd: int | None) -> None:
    """Clear the immutable and append-only flags of a regular file or directory (others: no-op)."""
    try:
        mode = os.lstat(name, dir_fd=dir_fd).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # never open a fifo, socket or device
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=dir_fd)
    except OSError:
        return
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        flags = struct.unpack_from("=i", buf)[0]
        if flags & (FS_IMMUTABLE_FL | FS_APPEND_FL):
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("=iI", flags & ~(FS_IMMUTABLE_FL | FS_APPEND_FL), 0))
    except OSError:  # no such ioctl on this file system, or not permitted
        pass
    finally:
        os.close(fd)


def _loosen(dir_fd: int, name: str | None) -> None:
    """Make an entry of ``dir_fd`` (or the directory itself) removable: modes and flags."""
    try:
        os.fchmod(dir_fd, _OWNER_ALL)
    except OSError:
        pass
    _clear_flags(".", dir_fd)
    if name is not None:
        _clear_flags(name, dir_fd)


def _retry(op: Callable[..., None], dir_fd: int, name: str, errors: _Errors, where: Callable[[], str]) -> bool:
    """Run ``op(name, dir_fd=dir_fd)``; on a permission error loosen modes/flags and try once more."""
    for attempt in range(2):
        try:
            op(name, dir_fd=dir_fd)
            return True
        except FileNotFoundError:
            return True
        except PermissionError as e:
            if attempt:
                errors.add(e, where())
                return False
            _loosen(dir_fd, name)
        except OSError as e:
            errors.add(e, where())
            return False
    return False


def _open_subdir(dir_fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, _OWNER_ALL, dir_fd=dir_fd)  # lstat said directory: no symlink to follow
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _where(path: str, stack: list[_Level], name: str) -> str:
    """A readable location for an error message (the middle of very deep paths elided)."""
    names = [lv.name for lv in stack[1:]] + [name]
    if len(names) > 8:
        return f"{path}/{'/'.join(names[:3])}/.../{'/'.join(names[-3:])} (depth {len(names)})"
    return "/".join([path, *names])


def _remove_entries(fd: int, errors: _Errors, path: str, stack: list[_Level]) -> list[str]:
    """Unlink every non-directory in ``fd``; return the names of its subdirectories."""
    try:
        os.fchmod(fd, _OWNER_ALL)  # we list it, enter it and remove from it
    except OSError:
        pass
    names: list[tuple[str, bool]] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                names.append((entry.name, is_dir))
    except OSError as e:
        errors.add(e, _where(path, stack, "."))
        return []
    subdirs = []
    for name, is_dir in names:
        if is_dir:
            subdirs.append(name)
        else:
            _retry(os.unlink, fd, name, errors, lambda name=name: _where(path, stack, name))
    subdirs.reverse()  # popped from the end: visit in listing order
    return subdirs


def remove_tree(path: str) -> None:
    """Remove ``path`` (a directory tree, a file or nothing) without recursion.

    Args:
        path: what to remove; symlinks are removed, never followed.

    Raises:
        OSError: something could not be removed (everything removable has been removed); the
            message names the first failure and how many entries failed.

    Example:
        >>> import os, tempfile
        >>> top = tempfile.mkdtemp()
        >>> d = os.open(top, os.O_RDONLY)
        >>> for _ in range(2000):  # deeper than Python's recursion limit, longer than PATH_MAX
        ...     os.mkdir("d", dir_fd=d)
        ...     d, old = os.open("d", os.O_RDONLY, dir_fd=d), d
        ...     os.close(old)
        >>> os.close(d)
        >>> remove_tree(top)
        >>> os.path.exists(top)
        False
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    errors = _Errors()
    parent = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(os.path.abspath(path))
    if stat.S_ISDIR(st.st_mode):
        _remove_below(path, st, errors)
        remove = os.rmdir
    else:
        remove = os.unlink
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _retry(remove, pfd, base, errors, lambda: path)
    finally:
        os.close(pfd)
    if errors.first is not None:
        first = errors.first
        raise OSError(
            first.errno,
            f"could not remove {errors.count} entr{'y' if errors.count == 1 else 'ies'} under {path} "
            f"(first: {first.filename}: {first.strerror})",
        )


def _remove_below(path: str, st: os.stat_result, errors: _Errors) -> None:
    """Empty the directory ``path`` (depth-first, one open descriptor at a time)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except PermissionError:
        os.chmod(path, _OWNER_ALL)
        fd = os.open(path, _DIR_FLAGS)
    stack = [_Level("", (st.st_dev, st.st_ino))]
    try:
        while True:
            level = stack[-1]
            if level.subdirs is None:
                level.subdirs = _remove_entries(fd, errors, path, stack)
            if level.subdirs:
                name = level.subdirs.pop()
                try:
                    child = _open_subdir(fd, name)
                except OSError as e:
                    errors.add(e, _where(path, stack, name))
                    continue
                cst = os.fstat(child)
                os.close(fd)
                fd = child
                stack.append(_Level(name, (cst.st_dev, cst.st_ino)))
                continue
            stack.pop()
            if not stack:
                return
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = up
            ust = os.fstat(fd)
            if (ust.st_dev, ust.st_ino) != stack[-1].ident:
                raise OSError(errno.ESTALE, "directory moved while it was being removed", _where(path, stack, ".."))
            _retry(os.rmdir, fd, level.name, errors, lambda name=level.name: _where(path, stack, name))
    finally:
        os.close(fd)
