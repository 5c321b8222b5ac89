"""Header-only rename of the tensors in a safetensors checkpoint, with a sha256 proof.

Why: the trainer saves its master under its own module names; publishing it under transformers'
names must not touch a single weight byte. Re-encoding would risk exactly that (and an MXFP8
payload re-encoded from its decode is only identical for canonical pairs), so the rename rewrites
the JSON header only:

1. parse and validate the source header; resolve the mapping on *logical* names (a quantized
   tensor's ``NAME.scale`` follows ``NAME`` automatically; naming a ``.scale`` directly is an error);
2. refuse unknown names and collisions (two tensors to one name, a new name that an untouched tensor
   already has), then build the new header with the same dtypes, shapes and ``data_offsets`` and
   validate it with the same parser as any file;
3. stream the data section into a temporary file through one fixed 1 MiB buffer (constant memory
   whatever the checkpoint size), hashing every tensor's bytes and the whole data section (sha256)
   on the way -- the "before" digests;
4. re-read the temporary file, hash every tensor under its new name and the whole data section --
   the "after" digests -- and fail loudly (:class:`~mxfp8_codec.errors.MXFP8Error`, nothing
   written) on any difference; otherwise fsync and move it into place atomically.

The returned :class:`RenameReport` lists ``(old, new, sha256)`` per stored entry and the data
section's sha256, so anyone can re-check the published file later with :func:`verify_renamed`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

from tqdm.auto import tqdm

from ida_common.files import atomic_output
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import (
    HEADER_ALIGNMENT,
    HEADER_LENGTH_BYTES,
    METADATA_KEY,
    SCALE_SUFFIX,
    Header,
    parse_header_bytes,
    read_header,
    read_header_from,
)

COPY_BUFFER_BYTES = 1 << 20  # 1 MiB: the only buffer the copy and the hashing use


@dataclass(frozen=True)
class RenameReport:
    """What a rename did, with the digests that prove the data is unchanged.

    Attributes:
        src: the source file.
        dst: the written file.
        tensors: ``(old_name, new_name, sha256_hex)`` for every stored entry (scales included), in
            data-section order; the digest is over the entry's bytes, identical before and after.
        data_sha256: sha256 of the whole data section (identical in both files).
    """

    src: str
    dst: str
    tensors: list[tuple[str, str, str]]
    data_sha256: str

    @property
    def renamed(self) -> list[tuple[str, str]]:
        """``(old, new)`` pairs whose name actually changed."""
        return [(o, n) for o, n, _ in self.tensors if o != n]


def _resolve(header: Header, mapping: Mapping[str, str] | Callable[[str], str]) -> dict[str, str]:
    """Stored old name -> stored new name for every entry."""
    path = header.path
    logical = header.logical_names()
    quantized = set(header.quantized)
    if callable(mapping) and not isinstance(mapping, Mapping):
        new_logical = {}
        for name in logical:
            new = mapping(name)
            if not isinstance(new, str):
                raise MXFP8Error(f"{path}: tensor {name!r}: rename function returned {type(new).__name__}, not str")
            new_logical[name] = new
    else:
        known = set(logical)
        companions = {q + SCALE_SUFFIX for q in quantized}
        for old in mapping:
            if old in companions:
                raise MXFP8Error(
                    f"{path}: tensor {old!r}: a scale follows its payload; rename {old[: -len(SCALE_SUFFIX)]!r} instead"
                )
        unknown = sorted(k for k in mapping if k not in known)
        if unknown:
            more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
            raise MXFP8Error(f"{path}: tensor {unknown[0]!r}: not in the file; unknown names: {unknown[:5]}{more}")
        for old, new in mapping.items():
            if not isinstance(new, str):
                raise MXFP8Error(f"{path}: tensor {old!r}: new name must be a str, got {type(new).__name__}")
        new_logical = {name: mapping.get(name, name) for name in logical}
    stored: dict[str, str] = {}
    for old, new in new_logical.items():
        if not new or new == METADATA_KEY:
            raise MXFP8Error(f"{path}: tensor {old!r}: invalid new name {new!r}")
        stored[old] = new
        if old in quantized:
            stored[old + SCALE_SUFFIX] = new + SCALE_SUFFIX
    owners: dict[str, str] = {}
    for old, new in stored.items():
        if new in owners:
            raise MXFP8Error(
                f"{path}: tensor {new!r}: rename collision, both {owners[new]!r} and {old!r} would get this name"
            )
        owners[new] = old
    return stored


def _renamed_header(
    header: Header, names: Mapping[str, str], metadata: Mapping[str, str] | None, dst: str
) -> tuple[bytes, Header]:
    obj: dict[str, object] = {}
    meta = dict(header.metadata)
    meta.update(metadata or {})
    if meta:
        obj[METADATA_KEY] = meta
    for e in header.entries_by_offset():
        obj[names[e.name]] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [e.begin, e.end]}
    raw = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % HEADER_ALIGNMENT)
    new_header = parse_header_bytes(raw, data_size=header.data_size, path=dst)
    return len(raw).to_bytes(HEADER_LENGTH_BYTES, "little") + raw, new_header


def _hash_data(
    f: BinaryIO, header: Header, buf: bytearray, out: BinaryIO | None = None, desc: str = ""
) -> tuple[dict[str, str], str]:
    """Stream the data section of ``f`` (optionally copying it to ``out``); per-entry and total sha256."""
    view = memoryview(buf)
    total = hashlib.sha256()
    digests: dict[str, str] = {}
    f.seek(header.data_start)
    with tqdm(total=header.data_size, unit="B", unit_scale=True, desc=desc, disable=None, leave=False) as bar:
        for e in header.entries_by_offset():
            h = hashlib.sha256()
            left = e.nbytes
            while left:
                n = f.readinto(view[: min(left, len(buf))])
                if not n:
                    raise MXFP8Error(f"{header.path}: tensor {e.name!r}: file ended while reading its bytes")
                chunk = view[:n]
                h.update(chunk)
                total.update(chunk)
                if out is not None:
                    out.write(chunk)
                left -= n
                bar.update(n)
            digests[e.name] = h.hexdigest()
    return digests, total.hexdigest()


def rename_tensors(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    mapping: Mapping[str, str] | Callable[[str], str],
    *,
    metadata: Mapping[str, str] | None = None,
) -> RenameReport:
    """Write ``dst`` = ``src`` with tensors renamed; only the header changes.

    Args:
        src: the source safetensors file (MXFP8 or plain).
        dst: the output file (may equal ``src``; written atomically).
        mapping: ``{old: new}`` on logical names (unlisted names are kept), or a function applied
            to every logical name. ``NAME.scale`` follows ``NAME``.
        metadata: metadata keys to add or replace in the new header.

    Returns:
        A :class:`RenameReport` with per-tensor and data-section sha256, checked equal before/after.

    Raises:
        MXFP8Error: unknown names, collisions, an invalid resulting header, or any digest mismatch.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import write_mxfp8_safetensors, open_mxfp8
        >>> d = tempfile.mkdtemp()
        >>> write_mxfp8_safetensors(f"{d}/a.safetensors", {"blk.0.q_proj.weight": np.ones((2, 32), np.float32)})
        >>> new = {"blk.0.q_proj.weight": "model.layers.0.self_attn.q_proj.weight"}
        >>> rep = rename_tensors(f"{d}/a.safetensors", f"{d}/b.safetensors", new)
        >>> rep.renamed[1]
        ('blk.0.q_proj.weight.scale', 'model.layers.0.self_attn.q_proj.weight.scale')
        >>> open_mxfp8(f"{d}/b.safetensors").keys()
        ['model.layers.0.self_attn.q_proj.weight']
    """
    src_s, dst_s = str(src), str(dst)
    header = read_header(src_s)
    names = _resolve(header, mapping)
    prefix, new_header = _renamed_header(header, names, metadata, dst_s)
    buf = bytearray(COPY_BUFFER_BYTES)
    try:
        fin = open(src_s, "rb")
    except OSError as exc:
        raise MXFP8Error(f"{src_s}: cannot open: {exc.strerror or exc}") from None
    with fin, atomic_output(dst_s) as fout:
        if os.fstat(fin.fileno()).st_size != header.file_size:
            raise MXFP8Error(f"{src_s}: file changed size since its header was read")
        fout.write(prefix)
        before, total_before = _hash_data(fin, header, buf, out=fout, desc="copying data")
        fout.flush()
        os.fsync(fout.fileno())
        with open(fout.name, "rb") as check:
            written = read_header_from(check, dst_s)
            if written.entries != new_header.entries:
                raise MXFP8Error(f"{dst_s}: header read back differs from the header written")
            after, total_after = _hash_data(check, written, buf, desc="verifying")
        for old, new in names.items():
            if before[old] != after[new]:
                raise MXFP8Error(
                    f"{dst_s}: tensor {new!r}: sha256 after rename {after[new]} != before {before[old]} (was {old!r})"
                )
        if total_before != total_after:
            raise MXFP8Error(f"{dst_s}: data section sha256 after rename {total_after} != before {total_before}")
    tensors = [(e.name, names[e.name], before[e.name]) for e in header.entries_by_offset()]
    return RenameReport(src=src_s, dst=dst_s, tensors=tensors, data_sha256=total_before)


def verify_renamed(path: str | os.PathLike[str], report: RenameReport) -> None:
    """Re-hash ``path`` and check every tensor and the data section against ``report``.

    Raises:
        MXFP8Error: naming the first tensor whose bytes differ (or that is missing).
    """
    p = str(path)
    try:
        f = open(p, "rb")
    except OSError as exc:
        raise MXFP8Error(f"{p}: cannot open: {exc.strerror or exc}") from None
    with f:
        header = read_header_from(f, p)
        digests, total = _hash_data(f, header, bytearray(COPY_BUFFER_BYTES), desc="verifying")
    for _old, new, sha in report.tensors:
        if new not in digests:
            raise MXFP8Error(f"{p}: tensor {new!r}: missing")
        if digests[new] != sha:
            raise MXFP8Error(f"{p}: tensor {new!r}: sha256 {digests[new]} != expected {sha}")
    if total != report.data_sha256:
        raise MXFP8Error(f"{p}: data section sha256 {total} != expected {report.data_sha256}")


def prefix_mapping(rules: Mapping[str, str]) -> Callable[[str], str]:
    """A rename function replacing the first matching prefix (``{"blk.": "model.layers."}``).

    Example:
        >>> prefix_mapping({"blk.": "model.layers."})("blk.3.mlp.up_proj.weight")
        'model.layers.3.mlp.up_proj.weight'
    """
    items = list(rules.items())

    def rename(name: str) -> str:
        for old, new in items:
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    return rename


__all__ = ["COPY_BUFFER_BYTES", "RenameReport", "prefix_mapping", "rename_tensors", "verify_renamed"]
