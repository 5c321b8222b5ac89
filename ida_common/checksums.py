"""``SHA256SUMS``: what a directory's files held when they were written, checkable by anyone.

A checkpoint directory is read long after it was written, often on another machine (copied with rsync,
cloud storage, a shared filesystem). Nothing in a safetensors file or a torch zip archive detects a
flipped byte: a damaged payload decodes as another valid E4M3 value and a damaged optimizer moment loads as
another number (measured: one flipped bit in the middle of an ``optimizer.pt`` loads without an error).
So the writers record a sha256 of every file beside them, in the format of GNU coreutils' ``sha256sum``::

    3f4c...e1  model.safetensors
    9a0b...77  optimizer.st

and the readers check it before trusting the bytes. Anyone can check a copy without ida:
``cd ckpt-000120 && sha256sum -c SHA256SUMS``.

The files are hashed in parallel threads (``hashlib`` releases the GIL on large buffers): a save pays for
the largest file's hash (~1.7 GB/s with SHA extensions), not the sum of all of them.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_text("hello")
    >>> write_sums(d)
    {'a.txt': '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824'}
    >>> verify_sums(d)
    True
    >>> _ = (d / "a.txt").write_text("hellO")
    >>> verify_sums(d)
    Traceback (most recent call last):
    ...
    ida_common.checksums.ChecksumError: .../a.txt: its bytes differ from the sha256 recorded in SHA256SUMS when it was written
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ida_common.files import atomic_write_text, fsync_tree

__all__ = ["SUMS_FILE", "ChecksumError", "file_sha256", "read_sums", "verify_sums", "write_sums"]

SUMS_FILE = "SHA256SUMS"
HASH_CHUNK = 1 << 20  # 1 MiB reads into one buffer per thread: as fast as 8 MiB (it stays in cache), 1/8 the memory
MAX_THREADS = 8
MAX_SUMS_BYTES = 16 << 20  # ~160,000 lines: a model directory lists tens of files
_LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)")  # sha256sum's text (" ") and binary ("*") markers


class ChecksumError(ValueError):
    """A file whose bytes differ from its recorded sha256, a listed file that is missing, or an unreadable
    ``SHA256SUMS``. ``path``: that file."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a whole file, streamed."""
    h = hashlib.sha256()
    view = memoryview(bytearray(HASH_CHUNK))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
    return h.hexdigest()


def _hash_all(directory: Path, names: Iterable[str]) -> dict[str, str]:
    names = list(names)
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(names), os.cpu_count() or 1, MAX_THREADS)) as pool:
        return dict(zip(names, pool.map(lambda n: file_sha256(directory / n), names), strict=True))


def write_sums(directory: str | os.PathLike[str], *, sync: bool = False) -> dict[str, str]:
    """Hash every regular file under ``directory`` (subdirectories included, ``SHA256SUMS`` itself not) and
    write ``directory/SHA256SUMS``, one ``sha256sum`` line per file, sorted by name. Returns name -> sha256.

    ``sync``: fsync the files in another thread while they are hashed (a writer about to make the directory
    durable, e.g. inside :func:`ida_common.files.atomic_directory`, then waits for the slower of the disk
    and the hash, not for both one after the other).

    Raises:
        ValueError: a file name that ``sha256sum`` would escape (a newline or a backslash in it).
    """
    directory = Path(directory)
    names = sorted(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and not p.is_symlink() and p.name != SUMS_FILE
    )
    for name in names:
        if "\n" in name or "\\" in name:
            raise ValueError(
                f"{directory / name}: a file name with a newline or backslash cannot be listed in {SUMS_FILE}"
            )
    with ThreadPoolExecutor(max_workers=1) as pool:
        synced = pool.submit(fsync_tree, directory) if sync else None
        sums = _hash_all(directory, names)
        if synced is not None:
            synced.result()
    atomic_write_text(directory / SUMS_FILE, "".join(f"{sums[n]}  {n}\n" for n in names))
    return sums


def read_sums(directory: str | os.PathLike[str]) -> dict[str, str] | None:
    """``directory/SHA256SUMS`` as name -> sha256, or None when there is none (written before ida recorded them).

    Raises:
        ChecksumError: a line that is not ``<64 hex digits>  <name>`` (names the line), a name listed twice,
            or one outside the directory (absolute, or with a ``..``: a list never makes ida read elsewhere);
            a ``SHA256SUMS`` that is not a regular file (a FIFO, a device, a directory, a dangling link) or
            is larger than :data:`MAX_SUMS_BYTES`.
    """
    path = Path(directory) / SUMS_FILE
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise ChecksumError(path, "a link to a file that does not exist") from None
        return None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the reader, /dev/zero would never end
        raise ChecksumError(path, "not a regular file")
    with open(path, "rb") as f:
        data = f.read(MAX_SUMS_BYTES + 1)
    if len(data) > MAX_SUMS_BYTES:
        raise ChecksumError(path, f"larger than {MAX_SUMS_BYTES >> 20} MiB, far more than a list of files needs")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChecksumError(path, f"not UTF-8 text ({exc.reason})") from None
    sums: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        m = _LINE.fullmatch(line)
        if m is None:
            raise ChecksumError(path, f"line {i} is not '<sha256>  <file name>': {line[:80]!r}")
        name = m.group(2)
        if name.startswith("/") or ".." in name.split("/"):
            raise ChecksumError(path, f"line {i} names a file outside its directory: {name[:80]!r}")
        if name in sums:
            raise ChecksumError(path, f"line {i} lists {name} a second time")
        sums[name] = m.group(1)
    return sums


def verify_sums(
    directory: str | os.PathLike[str],
    names: Iterable[str] | None = None,
    *,
    only: Callable[[str], bool] | None = None,
    hashed: Mapping[str, str] | None = None,
) -> bool:
    """Check files of ``directory`` against its ``SHA256SUMS``: ``names`` (each must be listed), or every
    file listed; of those, the ones ``only`` selects. ``hashed``: sha256 the caller has already computed for
    some of them (not read again). Returns False when the directory has no ``SHA256SUMS`` (nothing to
    check), True when every file matches.

    Raises:
        ChecksumError: the first file (in name order) that is missing, not listed, or whose bytes differ.
    """
    directory = Path(directory)
    sums = read_sums(directory)
    if sums is None:
        return False
    wanted = sorted(n for n in (sums if names is None else set(names)) if only is None or only(n))
    for name in wanted:
        if name not in sums:
            raise ChecksumError(directory / name, f"not listed in {SUMS_FILE}")
        if not (directory / name).is_file():  # never opened: a FIFO listed would block the hash
            what = "not a regular file" if os.path.lexists(directory / name) else "missing"
            raise ChecksumError(directory / name, f"{what} (listed in {SUMS_FILE})")
    hashed = dict(hashed or {})
    got = {**hashed, **_hash_all(directory, [n for n in wanted if n not in hashed])}
    for name in wanted:
        if got[name] != sums[name]:
            raise ChecksumError(
                directory / name, f"its bytes differ from the sha256 recorded in {SUMS_FILE} when it was written"
            )
    return True
