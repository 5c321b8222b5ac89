"""Reading MXFP8 safetensors checkpoints: validated, memory-mapped, one decoded tensor at a time.

The header is parsed and validated by :mod:`mxfp8_codec.header` with bounded reads; the data section
is memory-mapped read-only and each stored entry is a zero-copy numpy view at its offset. Undecoded copies
(``get_raw``, ``get`` of a tensor kept as stored) are read with positional reads instead, past the map. Decoding a
tensor therefore allocates only its output (plus the decoder's fixed chunk working set), and the
streaming reader holds one decoded tensor beyond what the caller keeps -- a 4B-parameter checkpoint
is loaded with about one model plus one tensor of host memory.

Names are *logical*: a quantized tensor appears once, without its ``.scale`` companion, and is
decoded exactly (``value = e4m3(q) * 2^(s - 127)``, :func:`mxfp8_codec.numerics.decode_mxfp8`),
rounded once to the requested float type. Plain tensors are returned as stored or converted.
Plain (non-MXFP8) safetensors files read through the same API, which is how baselines load.

Also here: :func:`validate` (every rule of docs/format.md §11) and :func:`checkpoint_files`
(single-file and sharded checkpoint directories).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm.auto import tqdm

from mxfp8_codec.constants import E8M0_NAN
from mxfp8_codec.convert import BF16, float_target_dtype, numpy_to_torch
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import (
    DTYPES,
    FLOAT_DTYPES,
    SCALE_SUFFIX,
    Header,
    TensorEntry,
    read_header,
    read_header_from,
)
from mxfp8_codec.layout import file_norm_convention, file_orientation, model_type_of, norm_rule
from mxfp8_codec.numerics import decode_mxfp8
from mxfp8_codec.writer import MXFP8Tensor

SINGLE_FILE = "model.safetensors"  # transformers' single-file checkpoint name
INDEX_FILE = "model.safetensors.index.json"  # transformers' shard index name
MAX_INDEX_BYTES = 64 * 1024 * 1024  # 64 MiB: a shard index larger than this is not an index
SCAN_CHUNK = 1 << 20  # 1 Mi elements per chunk when scanning values (bounded temporaries)


def pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Fill ``buf`` from ``fd`` at ``offset`` with positional reads (``os.preadv``, looped: one read returns at
    most ~2 GiB); returns the bytes read, fewer than ``len(buf)`` only where the file ends first."""
    done = 0
    while done < len(buf):
        got = os.preadv(fd, [buf[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done


def _decode_to(payload: np.ndarray, scales: np.ndarray, dt: np.dtype) -> np.ndarray:
    if dt in (np.dtype(np.float32), BF16):
        return decode_mxfp8(payload, scales, dtype=dt.type)
    # float32 holds every decoded value exactly, so one more rounding is the only rounding.
    return decode_mxfp8(payload, scales, dtype=np.float32).astype(dt)


class MXFP8Reader:
    """A memory-mapped, validated view of one safetensors file (MXFP8 or plain).

    Use :func:`open_mxfp8`. Names are *logical*: a quantized tensor appears once, without its
    ``.scale`` companion. ``get`` decodes one tensor; nothing else is materialised.

    Attributes:
        path: the file.
        metadata: ``__metadata__`` of the file (empty dict when absent).
        header: the validated :class:`~mxfp8_codec.header.Header`.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, require_mxfp8: bool = False, copy_on_write: bool = False
    ) -> None:
        self.path = str(path)
        try:
            self._file: BinaryIO | None = open(self.path, "rb")
        except OSError as exc:
            raise MXFP8Error(f"{self.path}: cannot open: {exc.strerror or exc}") from None
        try:
            self.header: Header = read_header_from(self._file, self.path, require_mxfp8=require_mxfp8)
            access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
            self._mm: mmap.mmap | None = mmap.mmap(self._file.fileno(), 0, access=access)
            if len(self._mm) != self.header.file_size:
                raise MXFP8Error(
                    f"{self.path}: file changed size while opening ({len(self._mm)} != {self.header.file_size})"
                )
        except BaseException:
            self._file.close()
            raise
        self.metadata: dict[str, str] = dict(self.header.metadata)
        self._quantized = frozenset(self.header.quantized)
        self._scales = frozenset(q + SCALE_SUFFIX for q in self.header.quantized)  # companions, not tensors
        self._names = self.header.logical_names()

    # -- context manager / lifetime --
    def __enter__(self) -> MXFP8Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the mapping and the file (views handed out by ``tensor_bytes`` keep it alive)."""
        if self._mm is not None:
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- names and shapes --
    def keys(self) -> list[str]:
        """Logical tensor names in header order (payloads without their ``.scale``)."""
        return list(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self.header.entries and name not in self._scales

    def _entry(self, name: str) -> TensorEntry:
        if name not in self.header.entries or name in self._scales:
            raise MXFP8Error(f"{self.path}: tensor {name!r}: no such tensor")
        return self.header.entries[name]

    def is_quantized(self, name: str) -> bool:
        """True when ``name`` is stored as MXFP8 (payload + scale)."""
        self._entry(name)
        return name in self._quantized

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored (logical) shape of ``name``."""
        return self._entry(name).shape

    def dtype(self, name: str) -> str:
        """The stored safetensors dtype of ``name`` (``"F8_E4M3"`` for quantized tensors)."""
        return self._entry(name).dtype

    # -- raw access --
    def _view(self, e: TensorEntry) -> np.ndarray:
        if self._mm is None:
            raise MXFP8Error(f"{self.path}: reader is closed")
        dt = DTYPES[e.dtype]
        if e.numel == 0:
            return np.empty(e.shape, dt)
        arr = np.frombuffer(self._mm, dtype=dt, count=e.numel, offset=self.header.data_start + e.begin)
        return arr.reshape(e.shape)

    def _copy(self, e: TensorEntry) -> np.ndarray:
        """One stored entry in a new array that owns its memory, read with positional reads where the platform
        has them: the file's pages never join this process's resident set (a copy through the map holds the
        tensor twice at its peak), and a file cut short since it was opened is an error, not a SIGBUS."""
        if self._file is None:
            raise MXFP8Error(f"{self.path}: reader is closed")
        if not hasattr(os, "preadv"):
            return self._view(e).copy()
        out = np.empty(e.shape, DTYPES[e.dtype])
        start = self.header.data_start + e.begin
        got = pread_into(self._file.fileno(), memoryview(out.reshape(-1).view(np.uint8)), start)
        if got != e.nbytes:
            raise MXFP8Error(
                f"{self.path}: tensor {e.name!r}: the file ends {e.nbytes - got} bytes before its end "
                "(was it truncated or rewritten in place since it was opened?)"
            )
        return out

    def tensor_bytes(self, name: str) -> memoryview:
        """Raw bytes of one stored entry (``NAME`` or ``NAME.scale``), zero-copy and read-only."""
        if name not in self.header.entries:
            raise MXFP8Error(f"{self.path}: tensor {name!r}: no such entry")
        if self._mm is None:
            raise MXFP8Error(f"{self.path}: reader is closed")
        e = self.header.entries[name]
        start = self.header.data_start + e.begin
        return memoryview(self._mm)[start : start + e.nbytes]

    def file_offset(self, name: str) -> int:
        """Offset in the file of the first byte of one stored entry (``NAME`` or ``NAME.scale``),
        for positional reads (``os.preadv``) that bypass the mapping."""
        if name not in self.header.entries:
            raise MXFP8Error(f"{self.path}: tensor {name!r}: no such entry")
        return self.header.data_start + self.header.entries[name].begin

    def prefetch_pages(self, name: str) -> None:
        """Ask the OS to start reading one tensor's file pages (payload and scales) in the background.

        ``madvise(MADV_WILLNEED)``: returns at once; pages already in the page cache cost nothing.
        A streaming loader calls this for the next tensor while it decodes the current one, so
        that a cold file is read in large requests while the CPU works (access through the map
        alone faults it in one read-around window at a time). A no-op where unavailable.
        """
        self._advise(name, "MADV_WILLNEED")

    def release_pages(self, name: str) -> None:
        """Unmap one tensor's file pages (payload and scales) from this process's resident set.

        The pages stay in the OS page cache and are read again if touched (the mapping is shared
        and read-only, so this never loses data); views stay valid. A streaming loader calls this
        after decoding each tensor so that its peak RSS holds the decoded model, not the file too.
        A no-op where ``madvise(MADV_DONTNEED)`` is not available.
        """
        self._advise(name, "MADV_DONTNEED")

    def _advise(self, name: str, advice: str) -> None:
        if self._mm is None:
            raise MXFP8Error(f"{self.path}: reader is closed")
        entries = [self._entry(name)]  # unknown names raise even where madvise is missing
        if not hasattr(mmap, advice):
            return
        if name in self._quantized:
            entries.append(self.header.entries[name + SCALE_SUFFIX])
        for e in entries:
            start = self.header.data_start + e.begin
            first = start - start % mmap.PAGESIZE  # madvise needs a page-aligned start
            if e.nbytes:
                self._mm.madvise(getattr(mmap, advice), first, start + e.nbytes - first)

    def raw_view(self, name: str) -> MXFP8Tensor | np.ndarray:
        """Undecoded data as zero-copy views of the map: :class:`MXFP8Tensor` of uint8
        ``(payload, scales)`` for a quantized tensor, else the stored array. Read-only, or
        writable with copy-on-write for a reader opened with ``copy_on_write=True``. The views
        keep the mapping alive after :meth:`close`; use :meth:`get_raw` for copies."""
        e = self._entry(name)
        if name in self._quantized:
            s = self.header.entries[name + SCALE_SUFFIX]
            return MXFP8Tensor(self._view(e).view(np.uint8), self._view(s).view(np.uint8))
        return self._view(e)

    def get_raw(self, name: str) -> MXFP8Tensor | np.ndarray:
        """Undecoded data: :class:`MXFP8Tensor` (uint8 copies) or a copy in the stored dtype."""
        e = self._entry(name)
        if name in self._quantized:
            s = self.header.entries[name + SCALE_SUFFIX]
            return MXFP8Tensor(self._copy(e).view(np.uint8), self._copy(s).view(np.uint8))
        return self._copy(e)

    def get(self, name: str, *, framework: str = "np", dtype: Any = None) -> Any:
        """One tensor, decoded.

        Args:
            name: logical name.
            framework: ``"np"`` (numpy) or ``"pt"`` (torch, CPU).
            dtype: target float dtype for floating tensors (np / ml_dtypes / torch float32,
                bfloat16, float16, float64). None: quantized -> float32, others as stored.

        Returns:
            A new array/tensor that owns its memory.
        """
        if framework not in ("np", "pt"):
            raise MXFP8Error(f"{self.path}: framework must be 'np' or 'pt', got {framework!r}")
        e = self._entry(name)
        target = float_target_dtype(dtype) if dtype is not None else None
        if name in self._quantized:
            s = self.header.entries[name + SCALE_SUFFIX]
            out = _decode_to(self._view(e).view(np.uint8), self._view(s).view(np.uint8), target or np.dtype(np.float32))
        elif e.dtype in FLOAT_DTYPES and target is not None:
            out = self._view(e).astype(target)
        else:
            out = self._copy(e)
        return numpy_to_torch(out) if framework == "pt" else out

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self._names:
            yield name, self.get(name)

    def check_values(self) -> None:
        """Scan the data: NaN payload codes (0x7F/0xFF), NaN scale bytes (0xFF), non-finite floats.

        Raises:
            MXFP8Error: naming the tensor and the first offending flat index.
        """
        for name in tqdm(
            self._names, desc=f"scanning {Path(self.path).name}", unit="tensor", disable=None, leave=False
        ):
            e = self.header.entries[name]
            if name in self._quantized:
                checks = [(e, lambda c: (c & 0x7F) == 0x7F, "NaN payload code (0x7F/0xFF)")]
                s = self.header.entries[name + SCALE_SUFFIX]
                checks.append((s, lambda c: c == E8M0_NAN, "NaN scale byte 0xFF"))
            elif e.dtype in FLOAT_DTYPES:
                checks = [(e, lambda c: ~np.isfinite(c.astype(np.float32)), "non-finite value")]
            else:
                continue
            for entry, bad, what in checks:
                self._raise_first(entry, bad, what)

    def check_scales(self, name: str) -> None:
        """Reject a NaN scale byte (0xFF: its whole block decodes to NaN) of the quantized tensor
        ``name``. Cheap: one byte per 32 values, one vectorised ``max`` unless there is a hit;
        ``mxfp8_codec.hf`` runs it on every projection it loads.

        Raises:
            MXFP8Error: naming the file, the scale entry and the first offending index.
        """
        if name not in self._quantized:
            return
        entry = self.header.entries[name + SCALE_SUFFIX]
        flat = self._view(entry).reshape(-1).view(np.uint8)
        if flat.size and int(flat.max()) == E8M0_NAN:
            self._raise_first(entry, lambda c: c == E8M0_NAN, "NaN scale byte 0xFF")

    def _raise_first(self, entry: TensorEntry, bad: Any, what: str) -> None:
        """Scan ``entry``'s data in chunks; raise naming the first index where ``bad`` holds."""
        flat = self._view(entry).reshape(-1)
        if entry.dtype in ("F8_E4M3", "U8", "F8_E8M0"):
            flat = flat.view(np.uint8)
        for start in range(0, flat.size, SCAN_CHUNK):
            hits = np.flatnonzero(bad(flat[start : start + SCAN_CHUNK]))
            if hits.size:
                idx = np.unravel_index(start + int(hits[0]), entry.shape)
                raise MXFP8Error(f"{self.path}: tensor {entry.name!r}: {what} at index {tuple(int(i) for i in idx)}")


def open_mxfp8(
    path: str | os.PathLike[str], *, require_mxfp8: bool = False, copy_on_write: bool = False
) -> MXFP8Reader:
    """Open a checkpoint file for reading (validates the header, memory-maps the data).

    ``copy_on_write=True`` maps the file privately and writable (``MAP_PRIVATE``): views from
    :meth:`MXFP8Reader.raw_view` can be handed to torch as ordinary tensors; a write to one copies
    that page into this process and never reaches the file. (Pages stay the file's, shared with the
    page cache, until written. As with any mapping, the file must not be rewritten in place while
    views are alive; the codec's writers replace files by rename, which is safe.)

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import write_mxfp8_safetensors
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> write_mxfp8_safetensors(p, {"a.o_proj.weight": np.eye(32, dtype=np.float32)})
        >>> with open_mxfp8(p) as r:
        ...     r.keys(), r.is_quantized("a.o_proj.weight"), r.get("a.o_proj.weight")[3, 3]
        (['a.o_proj.weight'], True, np.float32(1.0))
    """
    return MXFP8Reader(path, require_mxfp8=require_mxfp8, copy_on_write=copy_on_write)


def iter_mxfp8_safetensors(
    path: str | os.PathLike[str], *, framework: str = "np", dtype: Any = None
) -> Iterator[tuple[str, Any]]:
    """Stream ``(name, decoded)`` pairs one tensor at a time (peak memory: one decoded tensor).

    Args:
        path: the file.
        framework: ``"np"`` or ``"pt"``.
        dtype: target float dtype (see :meth:`MXFP8Reader.get`).
    """
    with open_mxfp8(path) as reader:
        for name in reader.keys():
            yield name, reader.get(name, framework=framework, dtype=dtype)


def read_mxfp8_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """A file's ``__metadata__`` (orientation, norm convention, scale rule, provenance), from the
    header alone.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import write_mxfp8_safetensors
        >>> p = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> write_mxfp8_safetensors(p, {"m.k_proj.weight": np.ones((4, 32), np.float32)})
        >>> read_mxfp8_metadata(p)["orientation"]
        'in_out'
    """
    return dict(read_header(path).metadata)


def _warn_if_recipe_misreads(path: str | os.PathLike[str], metadata: dict[str, str]) -> None:
    """Warn when the seeds' plain recipe (transpose every projection, load the rest as is) would
    build a wrong model from this file: an ``out_in`` file or norm weights stored as ``1 + w``."""
    problems = []
    if metadata.get("weights_dtype") is not None and file_orientation(metadata) == "out_in":
        problems.append(
            "orientation=out_in: projections are already in nn.Linear's [out, in] layout (do not transpose)"
        )
    if file_norm_convention(metadata) == "folded":
        model_type = model_type_of(path)
        try:
            adds_one = norm_rule(model_type).adds_one
        except MXFP8Error:  # unknown architecture: the recipe may or may not be right
            adds_one = True
        if adds_one:
            who = f"model_type {model_type!r}" if model_type else "an unknown model type"
            problems.append(f"norm_convention=folded for {who}: norm weights may be stored as 1 + w")
    if problems:
        warnings.warn(
            f"{path}: {'; '.join(problems)}. The returned arrays are as stored; "
            "mxfp8_codec.load_file(path) returns them in transformers' layout",
            stacklevel=3,
        )


def read_mxfp8_safetensors(
    path: str | os.PathLike[str], *, dtype: Any = np.float32, with_metadata: bool = False
) -> dict[str, np.ndarray] | tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read every tensor of a file into numpy, MXFP8 tensors decoded, floats converted to ``dtype``.

    The ``.scale`` companions are consumed, not returned. Integer/bool tensors keep their dtype.
    ``dtype=None`` keeps plain tensors in their stored dtype and decodes MXFP8 to float32.
    Tensors come back *as stored*: 2-D projections of an ``in_out`` file are ``[in, out]`` (the
    transpose of ``nn.Linear.weight``). A file whose layout the plain recipe (transpose every
    projection, load the rest as is) would get wrong -- ``orientation=out_in``, or folded norms of an
    architecture that adds 1 -- gives a warning naming the file; :func:`mxfp8_codec.load_file`
    returns torch tensors in transformers' layout for any file.

    Args:
        path: the file.
        dtype: float dtype for floating tensors (np / ml_dtypes / torch float32, float16, float64,
            ``ml_dtypes.bfloat16``). ``torch.bfloat16`` is refused: numpy arrays of bfloat16 are
            ml_dtypes arrays, which ``torch.from_numpy`` cannot take -- use ``load_file``.
        with_metadata: also return the file's ``__metadata__``.

    Returns:
        ``{name: array}``, or ``({name: array}, metadata)`` with ``with_metadata=True``.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import write_mxfp8_safetensors
        >>> p = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> write_mxfp8_safetensors(p, {"m.k_proj.weight": np.full((4, 32), 0.5, np.float32)})
        >>> read_mxfp8_safetensors(p)["m.k_proj.weight"].dtype
        dtype('float32')
        >>> tensors, meta = read_mxfp8_safetensors(p, with_metadata=True)
        >>> meta["orientation"], tensors["m.k_proj.weight"].shape  # [in, out]: transpose for nn.Linear
        ('in_out', (4, 32))
    """
    torch = sys.modules.get("torch")
    if torch is not None and dtype is torch.bfloat16:
        raise MXFP8Error(
            f"{path}: read_mxfp8_safetensors returns numpy arrays, and torch.from_numpy cannot take numpy "
            "bfloat16; for torch bfloat16 tensors use mxfp8_codec.load_file(path, dtype=torch.bfloat16), "
            "or pass dtype=np.float32 here"
        )
    with open_mxfp8(path) as reader:
        metadata = dict(reader.metadata)
        _warn_if_recipe_misreads(path, metadata)
        tensors = {name: reader.get(name, framework="np", dtype=dtype) for name in reader.keys()}
    return (tensors, metadata) if with_metadata else tensors


def validate(path: str | os.PathLike[str], *, require_mxfp8: bool = True, check_values: bool = False) -> Header:
    """Check a file against every validation rule of the format (docs/format.md).

    Args:
        path: the file.
        require_mxfp8: require ``weights_dtype`` metadata; False also accepts plain files.
        check_values: also scan the data for NaN codes/scales and non-finite floats.

    Returns:
        The validated header (so a caller that reports on the file need not parse it again).

    Raises:
        MXFP8Error: naming the file, tensor and reason.
    """
    if not check_values:
        return read_header(path, require_mxfp8=require_mxfp8)
    with MXFP8Reader(path, require_mxfp8=require_mxfp8) as reader:
        reader.check_values()
        return reader.header


def _load_index(index: Path) -> dict[str, str]:
    try:
        size = index.stat().st_size
        if size > MAX_INDEX_BYTES:
            raise MXFP8Error(f"{index}: {size} bytes is too large for a shard index")
        with open(index, "rb") as f:
            text = f.read(MAX_INDEX_BYTES + 1).decode("utf-8")
    except OSError as exc:
        raise MXFP8Error(f"{index}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise MXFP8Error(f"{index}: not UTF-8") from None

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise MXFP8Error(f"{index}: tensor {k!r}: listed twice in the index")
            out[k] = v
        return out

    try:
        obj = json.loads(text, object_pairs_hook=hook)
    except MXFP8Error:
        raise
    except RecursionError:
        raise MXFP8Error(f"{index}: JSON nests too deeply to be a shard index") from None
    except ValueError as exc:
        raise MXFP8Error(f"{index}: not valid JSON: {exc}") from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise MXFP8Error(f"{index}: needs a 'weight_map' object of tensor name -> shard file name")
    return wm


def check_inside_checkpoint(checkpoint_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Refuse a file of a checkpoint directory that is a symlink to somewhere outside it.

    A checkpoint directory is read (and its side files copied) as a unit; a shard or tokenizer file
    that links to ``/etc/...`` or another user's files would be read, and copied into an output,
    without anyone noticing. The one layout where links leave the directory on purpose is the
    Hugging Face hub cache: ``snapshots/<revision>/<file>`` links to ``../../blobs/<sha>``; targets
    in that ``blobs`` directory are accepted.

    Raises:
        MXFP8Error: ``FILE: is a symlink to TARGET, outside the checkpoint directory DIR``.
    """
    d, p = Path(checkpoint_dir), Path(path)
    if not p.is_symlink() and Path(os.path.realpath(p.parent)) == Path(os.path.realpath(d)):
        return
    root = Path(os.path.realpath(d))
    target = Path(os.path.realpath(p))
    allowed = [root]
    if root.parent.name == "snapshots":  # Hugging Face hub cache: snapshots/<rev>/x -> ../../blobs/<sha>
        allowed.append(root.parent.parent / "blobs")
    if not any(target.is_relative_to(a) for a in allowed):
        raise MXFP8Error(
            f"{p}: is a symlink to {target}, outside the checkpoint directory {d}; copy the file in instead"
        )


def checkpoint_files(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of a checkpoint directory.

    ``model.safetensors`` when present, else the shards listed by ``model.safetensors.index.json``
    (validated: every shard exists inside the directory and has a valid header, every listed tensor
    is in its shard, no tensor is stored in two shards).

    Raises:
        MXFP8Error: naming the directory/index/shard and what is wrong.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import write_mxfp8_safetensors
        >>> d = tempfile.mkdtemp()
        >>> write_mxfp8_safetensors(os.path.join(d, "model.safetensors"), {"x": np.zeros(2, np.float32)})
        >>> [p.name for p in checkpoint_files(d)]
        ['model.safetensors']
    """
    d = Path(checkpoint_dir)
    if not d.is_dir():
        raise MXFP8Error(f"{d}: not a checkpoint directory")
    if (d / SINGLE_FILE).is_file():
        check_inside_checkpoint(d, d / SINGLE_FILE)
        return [d / SINGLE_FILE]
    index = d / INDEX_FILE
    if not index.is_file():
        raise MXFP8Error(f"{d}: no {SINGLE_FILE} or {INDEX_FILE}")
    wm = _load_index(index)
    shards: dict[str, list[str]] = {}
    for tensor, shard in wm.items():
        if Path(shard).name != shard or shard in ("", ".", ".."):
            raise MXFP8Error(f"{index}: tensor {tensor!r}: shard {shard!r} must be a file name inside {d}")
        shards.setdefault(shard, []).append(tensor)
    if not shards:
        raise MXFP8Error(f"{index}: weight_map is empty")
    owner: dict[str, str] = {}
    for shard in sorted(shards):
        p = d / shard
        if not p.is_file():
            raise MXFP8Error(f"{index}: shard {shard!r} listed for tensor {shards[shard][0]!r} does not exist")
        check_inside_checkpoint(d, p)
        header = read_header(p)
        for name in header.entries:
            if name in owner:
                raise MXFP8Error(f"{d}: tensor {name!r} stored in two shards: {owner[name]} and {shard}")
            owner[name] = shard
        for tensor in shards[shard]:
            if tensor not in header.entries:
                raise MXFP8Error(f"{index}: tensor {tensor!r} is listed in {shard} but that shard does not contain it")
    return [d / s for s in sorted(shards)]
