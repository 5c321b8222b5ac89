"""The safetensors header of an MXFP8 checkpoint: parse it safely, validate it, build it.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of UTF-8 JSON + a data section. The JSON
object maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end)}`` (offsets relative
to the data section) plus an optional ``"__metadata__"`` object of string -> string.

Why our own parser: numpy cannot read ``F8_E4M3`` / ``F8_E8M0`` through ``safetensors`` (it has no
such numpy dtypes), and the upstream loader silently accepts things a checkpoint we must *trust*
should not contain (duplicate keys where the last one wins, NUL padding via other writers, orphan
scales). So this module reads the header with a bounded read (never the whole file), and checks:

* the 8-byte length is at most 100 MB (``MAX_HEADER_BYTES``) and fits in the file;
* the header is UTF-8, begins with ``{``, is a JSON object with no duplicate keys at any level, and
  is padded only with spaces (0x20) -- NUL padding is rejected;
* ``__metadata__`` maps strings to strings;
* every entry has exactly ``dtype``/``shape``/``data_offsets``, a known dtype, non-negative integer
  dims, and ``end - begin == prod(shape) * itemsize``;
* entries sorted by offset start at 0, are contiguous (no gap, no overlap) and cover the data
  section exactly;
* MXFP8 pairing: a payload ``NAME`` (``F8_E4M3``, rank >= 1) has a companion ``NAME.scale``
  (``U8`` or ``F8_E8M0``) of shape ``(*shape[:-1], ceil(shape[-1] / 32))`` and vice versa, and a
  file holding any such pair declares ``weights_dtype = "MXFP8_E4M3_UE8M0_K32"``.

Every violation raises :class:`~mxfp8_codec.errors.MXFP8Error` whose message names the file, the
tensor (when there is one) and the reason. Integer arithmetic on shapes uses Python ints, so a
hostile shape like ``[2**62, 2**62]`` is rejected by the size check instead of overflowing.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import operator
import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, NamedTuple

import ml_dtypes
import numpy as np

from mxfp8_codec.constants import WEIGHTS_DTYPE
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.layout import NORM_CONVENTIONS, ORIENTATIONS  # allowed metadata values (the layout rules' home)
from mxfp8_codec.numerics_numpy import scales_shape

HEADER_LENGTH_BYTES = 8  # the u64 little-endian header length that starts every file
MAX_HEADER_BYTES = 100_000_000  # 100 MB, the same limit as safetensors' MAX_HEADER_SIZE
HEADER_ALIGNMENT = 8  # writers pad the JSON with spaces so the data section starts 8-aligned
SCALE_SUFFIX = ".scale"  # companion entry holding one UE8M0 byte per block
METADATA_KEY = "__metadata__"  # the reserved header key for string -> string metadata

FORMAT_VERSION = "1"  # __metadata__["format_version"]
SCALE_RULES = ("rceil", "floor")  # allowed __metadata__["scale_rule"] values

PAYLOAD_DTYPE = "F8_E4M3"  # dtype of a quantized payload entry
SCALE_DTYPES = ("U8", "F8_E8M0")  # dtypes accepted for a .scale entry (writers use U8)

# safetensors dtype name -> numpy dtype (ml_dtypes for the 8/16-bit floats). Sub-byte (F4, F6_*)
# and complex dtypes exist in safetensors but are outside this format; they are rejected by name.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})  # plain floating entries (convertible)


class TensorEntry(NamedTuple):
    """One stored entry of the header (immutable; a named tuple so that a 1.7-million-entry header
    builds in seconds and takes 80 bytes per entry).

    Attributes:
        name: the stored name (a scale entry keeps its ``.scale`` suffix).
        dtype: the safetensors dtype name, e.g. ``"F8_E4M3"``.
        shape: the stored shape.
        begin: first byte, relative to the data section.
        end: one past the last byte, relative to the data section.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """Number of bytes the entry occupies."""
        return self.end - self.begin

    @property
    def numel(self) -> int:
        """Number of elements (1 for a 0-d tensor)."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    """A parsed and validated safetensors header.

    Attributes:
        path: the file the header came from (``"<memory>"`` for parsed bytes).
        header_len: ``N``, the JSON length in bytes (padding included).
        data_start: file offset of the data section (``8 + N``).
        file_size: total file size in bytes.
        entries: stored entries in header order, by stored name.
        metadata: ``__metadata__`` (empty when absent).
        quantized: logical names of MXFP8 payloads (each has ``name + ".scale"``), header order.
    """

    path: str
    header_len: int
    data_start: int
    file_size: int
    entries: dict[str, TensorEntry]
    metadata: dict[str, str]
    quantized: tuple[str, ...] = field(default=())

    @property
    def data_size(self) -> int:
        """Size of the data section in bytes."""
        return self.file_size - self.data_start

    @property
    def is_mxfp8(self) -> bool:
        """True when the file declares the MXFP8 format or holds a quantized pair."""
        return bool(self.quantized) or self.metadata.get("weights_dtype") == WEIGHTS_DTYPE

    def logical_names(self) -> list[str]:
        """Names as a user sees them: every entry except the ``.scale`` companions."""
        q = set(self.quantized)
        companions = {n + SCALE_SUFFIX for n in q}
        return [n for n in self.entries if n not in companions]

    def entries_by_offset(self) -> list[TensorEntry]:
        """Entries in data-section order (by ``(begin, end)``)."""
        return _by_offset(self.entries.values())


def _fail(path: str, tensor: str | None, reason: str) -> MXFP8Error:
    where = f"{path}: tensor {tensor!r}: " if tensor is not None else f"{path}: "
    return MXFP8Error(where + reason)


# numpy's limits, so that a header that passes validation can always be read into arrays:
# at most NPY_MAXDIMS dimensions (64 since numpy 2, 32 before), and the product of the non-zero
# dims times the itemsize must fit in a signed 64-bit intp -- numpy raises "array is too big" even
# for an empty array such as [0, 2**62]. We bound it for the widest array a reader can produce
# (float64, 8 bytes), so a decoded or converted tensor fits too.
MAX_RANK = 64 if int(np.__version__.split(".")[0]) >= 2 else 32
MAX_NONZERO_NUMEL = (2**63 - 1) // 8
_ITEMSIZE = {name: dt.itemsize for name, dt in DTYPES.items()}
_ENTRY_KEYS = ("dtype", "shape", "data_offsets")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # how a lone surrogate can enter a str from JSON


class _Spec(tuple):
    """A well-formed entry object, ``(dtype, shape tuple, begin, end)``, made while parsing.

    The JSON hook turns each valid ``{"dtype", "shape", "data_offsets"}`` object into this as soon as
    the parser has read it, and the enclosing object turns it into a :class:`TensorEntry` under its
    key, so a header with millions of entries never holds millions of dicts and lists at once (parse
    time and memory stay linear and small). Anything else stays a dict and is checked (and reported,
    with its name) by :func:`_parse_entry`.
    """

    __slots__ = ()


def _as_json(x: Any) -> Any:
    """The JSON value a compact form stands for (for checks and messages about misplaced objects)."""
    if type(x) is _Spec:
        dtype, shape, begin, end = x
    elif type(x) is TensorEntry:
        _, dtype, shape, begin, end = x
    else:
        return x
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}


def _object_hook(path: str) -> Any:
    """The ``object_pairs_hook``: reject duplicate keys at any level; compact valid entries.

    An entry object becomes a :class:`_Spec`; every other object becomes a dict whose compact values
    are :class:`TensorEntry` named by their key. Equal shapes share one tuple.
    """
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
    new_tuple = tuple.__new__  # TensorEntry(key, *spec) without the named tuple's Python-level __new__

    def duplicate(key: str) -> MXFP8Error:
        return _fail(path, key, "duplicate key in header JSON (safetensors would keep the last one)")

    def build(pairs: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i in range(len(pairs)):
            key, value = pairs[i]
            pairs[i] = None  # release each (key, compact) pair as its entry is made: one copy at a time
            if key in out:
                raise duplicate(key)
            out[key] = new_tuple(TensorEntry, (key, *value)) if type(value) is _Spec else value
        return out

    def hook(pairs: list[tuple[str, Any]]) -> Any:
        if len(pairs) != 3:
            return build(pairs)
        (k0, dtype), (k1, shape), (k2, offsets) = pairs
        if k0 != "dtype" or k1 != "shape" or k2 != "data_offsets":  # keys in another order, or not an entry
            d = dict(pairs)
            if len(d) != 3:
                return build(pairs)  # raises on the duplicate
            dtype, shape, offsets = d.get("dtype"), d.get("shape"), d.get("data_offsets")
        if type(dtype) is not str or type(shape) is not list or type(offsets) is not list or len(offsets) != 2:
            return build(pairs)
        itemsize = _ITEMSIZE.get(dtype)
        begin, end = offsets
        if itemsize is None or type(begin) is not int or type(end) is not int or not 0 <= begin <= end:
            return build(pairs)
        if len(shape) > MAX_RANK:
            return build(pairs)
        nonzero, empty = 1, False
        for dim in shape:
            if type(dim) is not int or dim < 0:
                return build(pairs)
            if dim:
                nonzero *= dim
            else:
                empty = True
        if nonzero > MAX_NONZERO_NUMEL or (0 if empty else nonzero) * itemsize != end - begin:
            return build(pairs)
        t = tuple(shape)
        return new_tuple(_Spec, (dtype, shapes.setdefault(t, t), begin, end))

    return hook


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: parsing a big header makes millions of small acyclic objects, which the
    collector would otherwise rescan again and again (a third of the parse time, for nothing)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-standard JSON constant {token}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_entry(path: str, name: str, raw: Any) -> TensorEntry:
    """Check one entry object in full and say what is wrong (the slow path of :func:`_object_hook`)."""
    raw = _as_json(raw)
    if not isinstance(raw, dict):
        raise _fail(path, name, f"entry must be a JSON object, got {type(raw).__name__}")
    keys = set(raw)
    expected = set(_ENTRY_KEYS)
    if keys != expected:
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        raise _fail(
            path, name, f"entry keys must be exactly {sorted(expected)} (missing {missing}, unexpected {extra})"
        )
    dtype = raw["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _fail(path, name, f"unknown or unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})")
    shape = raw["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _fail(path, name, f"shape must be a list of non-negative integers, got {_short(shape)}")
    if len(shape) > MAX_RANK:
        raise _fail(path, name, f"rank {len(shape)} exceeds the {MAX_RANK} dimensions numpy can represent")
    nonzero = math.prod(d for d in shape if d)
    if nonzero > MAX_NONZERO_NUMEL:
        raise _fail(
            path,
            name,
            f"shape {_short(shape)} is too big for numpy (the non-zero dims multiply to {nonzero}, "
            f"more than {MAX_NONZERO_NUMEL} elements), so no reader can represent it, not even empty",
        )
    offsets = raw["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets):
        raise _fail(path, name, f"data_offsets must be [begin, end] non-negative integers, got {_short(offsets)}")
    begin, end = offsets
    if end < begin:
        raise _fail(path, name, f"data_offsets end {end} < begin {begin}")
    entry = TensorEntry(name, dtype, tuple(shape), begin, end)
    expected_bytes = entry.numel * DTYPES[dtype].itemsize
    if expected_bytes != entry.nbytes:
        raise _fail(
            path,
            name,
            f"size mismatch: shape {_short(shape)} x {dtype} needs {expected_bytes} bytes, data_offsets span {entry.nbytes}",
        )
    return entry


def _short(x: Any, limit: int = 200) -> str:
    """``repr(x)`` cut to ``limit`` characters (a rank-1,000,000 shape must not become the message)."""
    text = repr(x)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def _check_text(path: str, entries: Mapping[str, TensorEntry], metadata: Mapping[str, str]) -> None:
    """Every name and metadata string must encode as UTF-8: a JSON escape such as ``\\ud800`` makes
    a lone surrogate that parses but fails later in every reader that prints or writes it."""
    for key, value in metadata.items():
        for text in (key, value):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _fail(path, METADATA_KEY, f"metadata {ascii(text)}: {_surrogate_reason(exc)}") from None
    for name in entries:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise MXFP8Error(f"{path}: tensor {ascii(name)}: name is {_surrogate_reason(exc)}") from None


def _surrogate_reason(exc: UnicodeEncodeError) -> str:
    bad = exc.object[exc.start : exc.end]
    return (
        f"not valid Unicode text (lone surrogate {ascii(bad)[1:-1]} from a JSON \\u escape); "
        "no reader can print or write it"
    )


def _check_metadata(path: str, raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise _fail(path, METADATA_KEY, f"__metadata__ must be a JSON object of strings, got {type(raw).__name__}")
    for k, v in raw.items():
        if not isinstance(v, str):
            v = _as_json(v)
            raise _fail(
                path, METADATA_KEY, f"metadata value for key {k!r} must be a string, got {type(v).__name__} {_short(v)}"
            )
    return dict(raw)


def _by_offset(entries: Iterable[TensorEntry]) -> list[TensorEntry]:
    """Entries sorted by ``(begin, end)``: two stable sorts on int keys, no key tuples (linear memory)."""
    out = sorted(entries, key=_END)
    out.sort(key=_BEGIN)
    return out


_BEGIN, _END = operator.attrgetter("begin"), operator.attrgetter("end")


def _check_layout(path: str, entries: Mapping[str, TensorEntry], data_size: int) -> None:
    pos = 0
    for e in _by_offset(entries.values()):
        if e.begin != pos:
            kind = "overlaps the previous tensor" if e.begin < pos else "leaves a gap after the previous tensor"
            raise _fail(path, e.name, f"data_offsets [{e.begin}, {e.end}] {kind} (expected begin {pos})")
        if e.end > data_size:
            raise _fail(path, e.name, f"data_offsets end {e.end} beyond the data section ({data_size} bytes)")
        pos = e.end
    if pos != data_size:
        raise _fail(
            path, None, f"data section not fully covered: tensors end at byte {pos}, data section has {data_size} bytes"
        )


def _check_pairs(path: str, entries: Mapping[str, TensorEntry], metadata: Mapping[str, str]) -> tuple[str, ...]:
    quantized: list[str] = []
    for name, e in entries.items():
        if e.dtype == PAYLOAD_DTYPE:
            sname = name + SCALE_SUFFIX
            if sname not in entries:
                raise _fail(path, name, f"F8_E4M3 payload without its scale entry {sname!r}")
            s = entries[sname]
            if s.dtype not in SCALE_DTYPES:
                raise _fail(path, sname, f"scale dtype must be one of {list(SCALE_DTYPES)}, got {s.dtype}")
            if len(e.shape) == 0:
                raise _fail(path, name, "quantized payload must have rank >= 1, got a 0-d tensor")
            want = scales_shape(e.shape)
            if s.shape != want:
                raise _fail(
                    path,
                    sname,
                    f"scale shape {list(s.shape)} does not match payload shape {list(e.shape)} (expected {list(want)})",
                )
            quantized.append(name)
        elif name.endswith(SCALE_SUFFIX) and e.dtype in SCALE_DTYPES:
            base = name[: -len(SCALE_SUFFIX)]
            if base not in entries:
                raise _fail(path, name, f"orphan scale: no payload entry {base!r}")
            if entries[base].dtype != PAYLOAD_DTYPE:
                raise _fail(
                    path, name, f"scale for payload {base!r} of dtype {entries[base].dtype} (payloads must be F8_E4M3)"
                )
    if quantized:
        wd = metadata.get("weights_dtype")
        if wd is None:
            raise _fail(
                path, METADATA_KEY, f"file holds MXFP8 tensors but __metadata__ lacks weights_dtype={WEIGHTS_DTYPE!r}"
            )
    return tuple(quantized)


def _check_format_metadata(path: str, metadata: Mapping[str, str]) -> None:
    wd = metadata.get("weights_dtype")
    if wd is not None and wd != WEIGHTS_DTYPE:
        raise _fail(path, METADATA_KEY, f"weights_dtype {wd!r} is not {WEIGHTS_DTYPE!r}")
    if wd is None:
        return
    allowed = {
        "format_version": (FORMAT_VERSION,),
        "orientation": ORIENTATIONS,
        "scale_rule": SCALE_RULES,
        "norm_convention": NORM_CONVENTIONS,
    }
    for key, values in allowed.items():
        v = metadata.get(key)
        if v is not None and v not in values:
            raise _fail(path, METADATA_KEY, f"metadata {key}={v!r} is not one of {list(values)}")


def parse_header_bytes(raw: bytes, *, data_size: int, path: str = "<memory>", require_mxfp8: bool = False) -> Header:
    """Parse and validate the JSON part of a header (the ``N`` bytes after the length).

    Args:
        raw: the header bytes, padding included.
        data_size: size of the data section the offsets must cover exactly.
        path: file name used in error messages.
        require_mxfp8: also require ``weights_dtype`` in the metadata (an MXFP8 file).

    Returns:
        The validated :class:`Header` (``file_size`` = 8 + len(raw) + data_size).

    Raises:
        MXFP8Error: on any violation, naming ``path``, the tensor and the reason.
    """
    return _parse_text(
        _decode(raw, path), header_len=len(raw), data_size=data_size, path=path, require_mxfp8=require_mxfp8
    )


def _decode(raw: bytes, path: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, None, f"header is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _parse_text(text: str, *, header_len: int, data_size: int, path: str, require_mxfp8: bool) -> Header:
    if not text.startswith("{"):
        raise _fail(path, None, f"header must begin with '{{', got {text[:1]!r}")
    at = text.find("\x00")
    if at >= 0:
        raise _fail(path, None, f"header contains a NUL byte at offset {at} (padding must be spaces, 0x20)")
    decoder = json.JSONDecoder(object_pairs_hook=_object_hook(path), parse_constant=_reject_constant)
    try:
        # raw_decode + a check of the rest instead of loads(text.rstrip()): no copy of a 100 MB text
        with _gc_paused():
            obj, end = decoder.raw_decode(text)
        rest = text[end:]
        if rest.strip(" \t\n\r"):
            raise ValueError(f"Extra data after the JSON object at offset {end + len(rest) - len(rest.lstrip())}")
        del rest
    except MXFP8Error:
        raise
    except RecursionError:
        raise _fail(path, None, "header JSON nests too deeply") from None
    except ValueError as exc:
        raise _fail(path, None, f"header is not valid JSON: {exc}") from None
    obj = _as_json(obj)
    if not isinstance(obj, dict):
        raise _fail(path, None, f"header must be a JSON object, got {type(obj).__name__}")
    metadata = _check_metadata(path, _as_json(obj.pop(METADATA_KEY, {})))
    entries: dict[str, TensorEntry] = obj  # valid entries are TensorEntry already (see _object_hook)
    for name, value in obj.items():
        if not name:
            raise _fail(path, name, "empty tensor name")
        if type(value) is not TensorEntry:
            entries[name] = _parse_entry(path, name, value)
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None:
        _check_text(path, entries, metadata)
    _check_layout(path, entries, data_size)
    _check_format_metadata(path, metadata)
    quantized = _check_pairs(path, entries, metadata)
    if require_mxfp8 and metadata.get("weights_dtype") != WEIGHTS_DTYPE:
        raise _fail(path, METADATA_KEY, f"not an MXFP8 checkpoint: __metadata__ lacks weights_dtype={WEIGHTS_DTYPE!r}")
    return Header(
        path=path,
        header_len=header_len,
        data_start=HEADER_LENGTH_BYTES + header_len,
        file_size=HEADER_LENGTH_BYTES + header_len + data_size,
        entries=entries,
        metadata=metadata,
        quantized=quantized,
    )


def read_header_from(f: BinaryIO, path: str, *, require_mxfp8: bool = False) -> Header:
    """Read and validate the header of an open binary file (bounded reads only)."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    if size < HEADER_LENGTH_BYTES:
        raise _fail(path, None, f"file is {size} bytes, too short for the 8-byte header length (truncated?)")
    (n,) = struct.unpack("<Q", f.read(HEADER_LENGTH_BYTES))
    if n > MAX_HEADER_BYTES:
        raise _fail(path, None, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if n > size - HEADER_LENGTH_BYTES:
        raise _fail(path, None, f"header length {n} runs beyond the end of the file ({size} bytes; truncated?)")
    if n == 0:
        raise _fail(path, None, "header length is 0 (no JSON header)")
    raw = f.read(n)
    if len(raw) != n:
        raise _fail(path, None, f"short read: wanted {n} header bytes, got {len(raw)}")
    text = _decode(raw, path)
    del raw  # up to 100 MB: only the decoded text is needed from here on
    return _parse_text(
        text, header_len=n, data_size=size - HEADER_LENGTH_BYTES - n, path=path, require_mxfp8=require_mxfp8
    )


def read_header(path: str | os.PathLike[str], *, require_mxfp8: bool = False) -> Header:
    """Read and validate the header of a safetensors file.

    Args:
        path: the file.
        require_mxfp8: require the MXFP8 ``weights_dtype`` metadata.

    Returns:
        The validated :class:`Header`.

    Raises:
        MXFP8Error: naming the file, tensor and reason (also for a missing or unreadable file).

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import write_mxfp8_safetensors
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> write_mxfp8_safetensors(p, {"l.q_proj.weight": np.ones((64, 32), np.float32)})
        >>> h = read_header(p)
        >>> h.quantized, h.entries["l.q_proj.weight.scale"].shape
        (('l.q_proj.weight',), (64, 1))
    """
    p = str(path)
    try:
        with open(p, "rb") as f:
            return read_header_from(f, p, require_mxfp8=require_mxfp8)
    except OSError as exc:
        raise _fail(p, None, f"cannot read file: {exc.strerror or exc}") from None


def sniff_mxfp8(path: str | os.PathLike[str]) -> bool:
    """Whether the safetensors file ``path`` is in this format, judged from its header alone.

    True when ``__metadata__`` says ``weights_dtype = "MXFP8_E4M3_UE8M0_K32"`` or an ``F8_E4M3``
    entry ``NAME`` has a ``NAME.scale`` partner. Reads the 8-byte length and the ``N`` header bytes
    (``N`` at most ``MAX_HEADER_BYTES``), never the data section, and validates nothing: it only
    decides who must read the file (``mxfp8_codec.hf`` refuses to let transformers load such a file
    as plain weights). Never raises: a file that cannot be read or whose header is not JSON is not
    called MXFP8 here, and whoever reads it reports what is wrong.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import write_mxfp8_safetensors
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> write_mxfp8_safetensors(p, {"l.q_proj.weight": np.ones((64, 32), np.float32)})
        >>> sniff_mxfp8(p), sniff_mxfp8(p + ".missing")
        (True, False)
    """
    try:
        with open(path, "rb", buffering=0) as f:  # unbuffered: exactly 8 + N bytes are read
            prefix = f.read(HEADER_LENGTH_BYTES)
            if len(prefix) != HEADER_LENGTH_BYTES:
                return False
            (n,) = struct.unpack("<Q", prefix)
            if not 0 < n <= MAX_HEADER_BYTES:
                return False
            obj = json.loads(f.read(n).rstrip(b" \x00"))
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON
        return False
    if not isinstance(obj, dict):
        return False
    meta = obj.get(METADATA_KEY)
    if isinstance(meta, dict) and meta.get("weights_dtype") == WEIGHTS_DTYPE:
        return True
    return any(
        isinstance(v, dict) and v.get("dtype") == PAYLOAD_DTYPE and k + SCALE_SUFFIX in obj for k, v in obj.items()
    )


def encode_header(
    entries: Iterable[tuple[str, str, Sequence[int], int]], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[TensorEntry]]:
    """Lay out entries back to back and serialise the header (length prefix included).

    Args:
        entries: ``(name, dtype, shape, nbytes)`` in data-section order.
        metadata: ``__metadata__`` (string -> string) or None.

    Returns:
        ``(prefix, layout)``: the 8-byte length + JSON padded with spaces so the data section
        starts at a multiple of 8, and the entries with their offsets.
    """
    obj: dict[str, Any] = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise MXFP8Error(f"metadata must map str to str, got {k!r}: {type(v).__name__}")
        obj[METADATA_KEY] = dict(metadata)
    layout: list[TensorEntry] = []
    pos = 0
    for name, dtype, shape, nbytes in entries:
        if name in obj:
            raise MXFP8Error(f"tensor {name!r}: duplicate or reserved name")
        obj[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [pos, pos + nbytes]}
        layout.append(TensorEntry(name, dtype, tuple(int(d) for d in shape), pos, pos + nbytes))
        pos += nbytes
    js = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    js += b" " * (-len(js) % HEADER_ALIGNMENT)
    if len(js) > MAX_HEADER_BYTES:
        raise MXFP8Error(f"header would be {len(js)} bytes, over the {MAX_HEADER_BYTES}-byte limit")
    return struct.pack("<Q", len(js)) + js, layout
