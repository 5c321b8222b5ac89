"""Reading and writing MXFP8 safetensors checkpoints.

On disk (see docs/format.md) a quantized tensor ``NAME`` is two entries: ``NAME`` (``F8_E4M3``, the
tensor's stored shape) and ``NAME.scale`` (``U8``, one UE8M0 byte per 32 elements along the last
axis). Everything else is plain ``BF16`` (``F32``/``F16`` accepted on read), integers and bools
unchanged.

Reading: the header is parsed and validated by :mod:`mxfp8_codec.header` with bounded reads; the
data section is memory-mapped read-only and each tensor is a zero-copy numpy view at its offset, so
decoding streams one tensor at a time -- peak memory is one decoded tensor beyond what the caller
keeps. Decoding is exact: ``value = e4m3(q) * 2^(s - 127)`` computed by
:func:`mxfp8_codec.numerics.decode_mxfp8` and rounded once to the requested float type.

Writing: the whole layout (names, dtypes, shapes, byte sizes) is planned before any tensor is
encoded, so the header is written first and each tensor is encoded and written in turn (peak memory
one encoded tensor). Entries are ordered by item size (largest first), then by name, with each
``.scale`` right after its payload, so every tensor starts at a multiple of its item size (the
header is space-padded to 8 bytes). The file is written to a temporary file in the same directory,
fsynced, moved into place with ``os.replace`` and the directory fsynced: a crash never leaves a
half-written checkpoint under the final name.

torch is optional: it is imported only when a torch tensor is passed or requested.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import ml_dtypes
import numpy as np
from tqdm.auto import tqdm

from mxfp8_codec.constants import WEIGHTS_DTYPE, ScaleRule
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import (
    DTYPES,
    FLOAT_DTYPES,
    FORMAT_VERSION,
    NORM_CONVENTIONS,
    ORIENTATIONS,
    SCALE_SUFFIX,
    Header,
    TensorEntry,
    encode_header,
    read_header,
    read_header_from,
    scale_shape,
)
from mxfp8_codec.numerics import decode_mxfp8, encode_mxfp8

SINGLE_FILE = "model.safetensors"  # transformers' single-file checkpoint name
INDEX_FILE = "model.safetensors.index.json"  # transformers' shard index name
MAX_INDEX_BYTES = 64 * 1024 * 1024  # 64 MiB: a shard index larger than this is not an index
SCAN_CHUNK = 1 << 20  # 1 Mi elements per chunk when scanning values (bounded temporaries)

_PROJECTION_RE = re.compile(r"(?:^|\.)(?:q|k|v|o|gate|up|down)_proj\.weight$")
_NP_TO_ST = {dt: name for name, dt in DTYPES.items()}
_F8_NP = {np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2), np.dtype(ml_dtypes.float8_e8m0fnu)}


class MXFP8Tensor(NamedTuple):
    """An already-encoded tensor that the writer stores byte-for-byte.

    Attributes:
        payload: E4M3 bit patterns, ``uint8`` (numpy array or torch tensor), the tensor's shape.
        scales: UE8M0 bytes, ``uint8``, shape ``(*payload.shape[:-1], ceil(payload.shape[-1] / 32))``.
    """

    payload: Any
    scales: Any


def is_projection_weight(name: str) -> bool:
    """Default quantize predicate: attention/MLP projection weights by transformers' names.

    The writer applies it to floating tensors of rank >= 1; transformer projections are 2-D.

    Example:
        >>> is_projection_weight("model.layers.0.self_attn.q_proj.weight")
        True
        >>> is_projection_weight("model.layers.0.input_layernorm.weight")
        False
    """
    return _PROJECTION_RE.search(name) is not None


# --------------------------------------------------------------------------------------------------
# array helpers (numpy core, torch at the edges)


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    views = {
        torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
        torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
        torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
        torch.float8_e8m0fnu: (torch.uint8, ml_dtypes.float8_e8m0fnu),
    }
    if t.dtype in views:
        carrier, np_dtype = views[t.dtype]
        return t.view(carrier).numpy().view(np_dtype)
    return t.numpy()


def _numpy_to_torch(a: np.ndarray) -> Any:
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    f8 = {
        np.dtype(ml_dtypes.float8_e4m3fn): torch.float8_e4m3fn,
        np.dtype(ml_dtypes.float8_e5m2): torch.float8_e5m2,
        np.dtype(ml_dtypes.float8_e8m0fnu): torch.float8_e8m0fnu,
    }
    if a.dtype in f8:
        return torch.from_numpy(a.view(np.uint8)).view(f8[a.dtype])
    return torch.from_numpy(a)


def _as_numpy(x: Any, name: str) -> np.ndarray:
    if _is_torch(x):
        return _torch_to_numpy(x)
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            x = x.astype(x.dtype.newbyteorder("<"))
        return x
    raise MXFP8Error(f"tensor {name!r}: expected a numpy array, torch tensor or MXFP8Tensor, got {type(x).__name__}")


def _np_float_dtype(dtype: Any) -> np.dtype:
    """Map np / ml_dtypes / torch float dtypes (or their names) to a numpy dtype."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        table = {
            torch.float32: np.dtype(np.float32),
            torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
            torch.float16: np.dtype(np.float16),
            torch.float64: np.dtype(np.float64),
        }
        if dtype not in table:
            raise MXFP8Error(f"unsupported target dtype {dtype} (use float32, bfloat16, float16 or float64)")
        return table[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise MXFP8Error(f"unsupported target dtype {dtype!r}") from None
    if dt not in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float64)):
        raise MXFP8Error(f"unsupported target dtype {dt} (use float32, bfloat16, float16 or float64)")
    return dt


def _as_u8(a: Any, name: str, what: str) -> np.ndarray:
    arr = _as_numpy(a, name)
    if arr.dtype in _F8_NP:
        arr = arr.view(np.uint8)
    if arr.dtype != np.uint8:
        raise MXFP8Error(f"tensor {name!r}: MXFP8Tensor {what} must be uint8 bytes, got {arr.dtype}")
    return arr


def _decode_to(payload: np.ndarray, scales: np.ndarray, dt: np.dtype) -> np.ndarray:
    if dt in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)):
        return decode_mxfp8(payload, scales, dtype=dt.type)
    # float32 holds every decoded value exactly, so one more rounding is the only rounding.
    return decode_mxfp8(payload, scales, dtype=np.float32).astype(dt)


# --------------------------------------------------------------------------------------------------
# writing


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path``; on success fsync it, ``os.replace`` it, fsync the dir.

    On any exception the temporary file is removed and ``path`` is untouched. The yielded file's
    ``.name`` is the temporary path (useful to read back before the rename).

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
        raise MXFP8Error(f"{target}: cannot create a temporary file in {parent}: {exc.strerror or exc}") from None
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


@dataclass(frozen=True)
class _Item:
    """One planned stored entry: how many bytes, and how to produce them at write time."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    logical: str
    is_scale: bool
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        size = DTYPES[self.dtype].itemsize
        n = 1
        for d in self.shape:
            n *= d
        return n * size


def _write_items(path: str | os.PathLike[str], items: list[_Item], metadata: Mapping[str, str], progress: bool | None) -> None:
    items = sorted(items, key=lambda it: (-DTYPES[it.dtype].itemsize, it.logical, it.is_scale))
    names = [it.name for it in items]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise MXFP8Error(f"{path}: tensor {dup[0]!r}: name used twice (a '.scale' name collides with a quantized tensor's scale?)")
    prefix, _ = encode_header(((it.name, it.dtype, it.shape, it.nbytes) for it in items), metadata)
    with atomic_output(path) as f:
        f.write(prefix)
        for it in tqdm(items, desc=f"writing {Path(path).name}", unit="tensor", disable=None if progress is None else not progress, leave=False):
            arr = it.produce()
            flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if arr.shape != it.shape or flat.nbytes != it.nbytes:
                raise MXFP8Error(f"{path}: tensor {it.name!r}: produced shape {arr.shape} / {flat.nbytes} bytes, planned {it.shape} / {it.nbytes}")
            f.write(memoryview(flat))


def _quantized_items(name: str, shape: tuple[int, ...], encode: Callable[[], tuple[np.ndarray, np.ndarray]]) -> list[_Item]:
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def get(i: int, release: bool) -> np.ndarray:
        if "v" not in cache:
            cache["v"] = encode()
        out = cache["v"][i]
        if release:
            cache.clear()
        return out

    # The payload is written first (sort key is_scale=False), so the scale releases the cache.
    return [
        _Item(name, "F8_E4M3", shape, name, False, lambda: get(0, False)),
        _Item(name + SCALE_SUFFIX, "U8", scale_shape(shape), name, True, lambda: get(1, True)),
    ]


def _np_dtype_of(value: Any) -> np.dtype:
    if _is_torch(value):
        import torch

        special = {
            torch.bfloat16: ml_dtypes.bfloat16,
            torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
            torch.float8_e5m2: ml_dtypes.float8_e5m2,
            torch.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
        }
        if value.dtype in special:
            return np.dtype(special[value.dtype])
        return torch.empty((), dtype=value.dtype).numpy().dtype
    return np.dtype(value.dtype)


def _describe(tensors: Mapping[str, Any], name: str) -> tuple[Any, tuple[int, ...], np.dtype | None]:
    """``(value, shape, numpy dtype)`` of ``tensors[name]``; value is None when the mapping's
    optional ``spec(name) -> (shape, numpy dtype)`` answered without loading. dtype is None for
    an :class:`MXFP8Tensor`."""
    spec = getattr(tensors, "spec", None)
    if callable(spec):
        shape, dt = spec(name)
        return None, tuple(int(d) for d in shape), np.dtype(dt)
    value = tensors[name]
    if isinstance(value, MXFP8Tensor):
        return value, (), None
    if not (_is_torch(value) or isinstance(value, np.ndarray)):
        raise MXFP8Error(f"tensor {name!r}: expected a numpy array, torch tensor or MXFP8Tensor, got {type(value).__name__}")
    return value, tuple(int(d) for d in value.shape), _np_dtype_of(value)


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16)


def _plain_item(name: str, get_value: Callable[[], Any], shape: tuple[int, ...], dt: np.dtype, float_target: np.dtype | None) -> _Item:
    """An entry stored as-is (ints, bools) or converted to ``float_target`` (floats)."""
    if dt in _F8_NP:
        raise MXFP8Error(f"tensor {name!r}: float8 data must be passed as MXFP8Tensor(payload, scales)")
    out_dt = float_target if (_is_float(dt) and float_target is not None) else dt
    if out_dt not in _NP_TO_ST:
        raise MXFP8Error(f"tensor {name!r}: dtype {dt} cannot be stored in safetensors by this codec")

    def produce() -> np.ndarray:
        a = _as_numpy(get_value(), name)
        return a if a.dtype == out_dt else a.astype(out_dt)

    return _Item(name, _NP_TO_ST[out_dt], shape, name, False, produce)


def write_mxfp8_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    quantize: Callable[[str], bool] | None = is_projection_weight,
    metadata: Mapping[str, str] | None = None,
    scale_rule: str | ScaleRule = "rceil",
    orientation: str = "in_out",
    norm_convention: str = "zero_centered",
    progress: bool | None = None,
) -> None:
    """Write an MXFP8 checkpoint atomically.

    Floating tensors selected by ``quantize`` (and of rank >= 1) are encoded with
    :func:`~mxfp8_codec.numerics.encode_mxfp8`; :class:`MXFP8Tensor` values are stored byte-for-byte;
    every other floating tensor is written as BF16 (exact for BF16 input, RNE otherwise); integer and
    bool tensors are written unchanged. The layout is planned before anything is encoded, then each
    tensor is fetched again, encoded and written, so a lazy Mapping that loads on ``__getitem__``
    keeps peak memory at one tensor; if it also has ``spec(name) -> (shape, numpy dtype)`` the
    planning pass loads nothing (such a mapping must not hold MXFP8Tensor values).

    Args:
        path: output file.
        tensors: name -> numpy array, torch tensor or :class:`MXFP8Tensor`.
        quantize: predicate on the name; None quantizes nothing.
        metadata: extra ``__metadata__`` entries (str -> str); may not override the format keys.
        scale_rule: ``"rceil"`` (default) or ``"floor"``; recorded in the metadata.
        orientation: ``"in_out"`` (trainer-native, default) or ``"out_in"``; recorded only.
        norm_convention: ``"zero_centered"`` or ``"folded"``; recorded only.
        progress: show a progress bar (None: only on a terminal).

    Raises:
        MXFP8Error: non-finite values in a tensor to quantize, bad MXFP8Tensor shapes, name
            collisions, bad metadata.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import read_mxfp8_safetensors
        >>> p = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> w = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)
        >>> write_mxfp8_safetensors(p, {"l.up_proj.weight": w, "l.norm.weight": np.ones(32, np.float32)})
        >>> out = read_mxfp8_safetensors(p)
        >>> float(np.abs(out["l.up_proj.weight"] - w).max()) < 0.04
        True
    """
    rule = ScaleRule(scale_rule).value if not isinstance(scale_rule, ScaleRule) else scale_rule.value
    if orientation not in ORIENTATIONS:
        raise MXFP8Error(f"{path}: orientation must be one of {list(ORIENTATIONS)}, got {orientation!r}")
    if norm_convention not in NORM_CONVENTIONS:
        raise MXFP8Error(f"{path}: norm_convention must be one of {list(NORM_CONVENTIONS)}, got {norm_convention!r}")
    meta = {
        "weights_dtype": WEIGHTS_DTYPE,
        "format_version": FORMAT_VERSION,
        "orientation": orientation,
        "scale_rule": rule,
        "norm_convention": norm_convention,
    }
    for k, v in (metadata or {}).items():
        if k in meta and meta[k] != v:
            raise MXFP8Error(f"{path}: metadata key {k!r} is set by the writer ({meta[k]!r}); got {v!r}")
        meta[k] = v

    items: list[_Item] = []
    for name in tensors:
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise MXFP8Error(f"{path}: invalid tensor name {name!r}")
        value, shape, dt = _describe(tensors, name)
        if dt is None:  # an MXFP8Tensor, stored byte-for-byte
            p = _as_u8(value.payload, name, "payload")
            s = _as_u8(value.scales, name, "scales")
            if p.ndim == 0 or s.shape != scale_shape(p.shape):
                want = scale_shape(p.shape) if p.ndim else "(rank >= 1 payload)"
                raise MXFP8Error(f"{path}: tensor {name!r}: MXFP8Tensor scales shape {s.shape} does not match payload {p.shape} (expected {want})")

            def enc_raw(n: str = name) -> tuple[np.ndarray, np.ndarray]:
                v = tensors[n]
                return _as_u8(v.payload, n, "payload"), _as_u8(v.scales, n, "scales")

            items += _quantized_items(name, tuple(int(d) for d in p.shape), enc_raw)
        elif quantize is not None and _is_float(dt) and dt.itemsize > 1 and len(shape) >= 1 and quantize(name):

            def enc(n: str = name) -> tuple[np.ndarray, np.ndarray]:
                x = tensors[n]
                if _is_torch(x):
                    if x.dtype not in _torch_encodable():
                        x = x.float()
                elif x.dtype == np.float64:
                    x = x.astype(np.float32)
                p, s = encode_mxfp8(x, scale_rule=rule, name=n)
                return _as_numpy(p, n), _as_numpy(s, n)

            items += _quantized_items(name, shape, enc)
        else:
            items.append(_plain_item(name, (lambda n=name: tensors[n]), shape, dt, np.dtype(ml_dtypes.bfloat16)))
        del value
    _write_items(path, items, meta, progress)


def _torch_encodable() -> tuple[Any, ...]:
    import torch

    return (torch.float32, torch.bfloat16, torch.float16)


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    metadata: Mapping[str, str] | None = None,
    float_dtype: Any = None,
    progress: bool | None = None,
) -> None:
    """Write a plain safetensors file atomically (no quantization), e.g. a dequantized checkpoint.

    Args:
        path: output file.
        tensors: name -> numpy array or torch tensor (read twice, like the MXFP8 writer).
        metadata: ``__metadata__`` (str -> str).
        float_dtype: convert floating tensors to this dtype (e.g. ``ml_dtypes.bfloat16``); None keeps them.
        progress: show a progress bar (None: only on a terminal).
    """
    target = _np_float_dtype(float_dtype) if float_dtype is not None else None
    items = []
    for name in tensors:
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise MXFP8Error(f"{path}: invalid tensor name {name!r}")
        _value, shape, dt = _describe(tensors, name)
        if dt is None:
            raise MXFP8Error(f"{path}: tensor {name!r}: write_safetensors stores plain tensors; use write_mxfp8_safetensors for MXFP8Tensor")
        del _value
        items.append(_plain_item(name, (lambda n=name: tensors[n]), shape, dt, target))
    _write_items(path, items, dict(metadata or {}), progress)


# --------------------------------------------------------------------------------------------------
# reading


class MXFP8Reader:
    """A memory-mapped, validated view of one safetensors file (MXFP8 or plain).

    Use :func:`open_mxfp8`. Names are *logical*: a quantized tensor appears once, without its
    ``.scale`` companion. ``get`` decodes one tensor; nothing else is materialised.

    Attributes:
        path: the file.
        metadata: ``__metadata__`` of the file (empty dict when absent).
        header: the validated :class:`~mxfp8_codec.header.Header`.
    """

    def __init__(self, path: str | os.PathLike[str], *, require_mxfp8: bool = False) -> None:
        self.path = str(path)
        try:
            self._file: BinaryIO | None = open(self.path, "rb")
        except OSError as exc:
            raise MXFP8Error(f"{self.path}: cannot open: {exc.strerror or exc}") from None
        try:
            self.header: Header = read_header_from(self._file, self.path, require_mxfp8=require_mxfp8)
            self._mm: mmap.mmap | None = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            if len(self._mm) != self.header.file_size:
                raise MXFP8Error(f"{self.path}: file changed size while opening ({len(self._mm)} != {self.header.file_size})")
        except BaseException:
            self._file.close()
            raise
        self.metadata: dict[str, str] = dict(self.header.metadata)
        self._quantized = frozenset(self.header.quantized)
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
        return name in self._names

    def _entry(self, name: str) -> TensorEntry:
        if name not in self.header.entries or (name.endswith(SCALE_SUFFIX) and name not in self._names):
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

    def tensor_bytes(self, name: str) -> memoryview:
        """Raw bytes of one stored entry (``NAME`` or ``NAME.scale``), zero-copy and read-only."""
        if name not in self.header.entries:
            raise MXFP8Error(f"{self.path}: tensor {name!r}: no such entry")
        if self._mm is None:
            raise MXFP8Error(f"{self.path}: reader is closed")
        e = self.header.entries[name]
        start = self.header.data_start + e.begin
        return memoryview(self._mm)[start : start + e.nbytes]

    def get_raw(self, name: str) -> MXFP8Tensor | np.ndarray:
        """Undecoded data: :class:`MXFP8Tensor` (uint8 copies) or a copy in the stored dtype."""
        e = self._entry(name)
        if name in self._quantized:
            s = self.header.entries[name + SCALE_SUFFIX]
            return MXFP8Tensor(self._view(e).view(np.uint8).copy(), self._view(s).view(np.uint8).copy())
        return self._view(e).copy()

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
        target = _np_float_dtype(dtype) if dtype is not None else None
        if name in self._quantized:
            s = self.header.entries[name + SCALE_SUFFIX]
            out = _decode_to(self._view(e).view(np.uint8), self._view(s).view(np.uint8), target or np.dtype(np.float32))
        elif e.dtype in FLOAT_DTYPES and target is not None:
            out = self._view(e).astype(target)
        else:
            out = self._view(e).copy()
        return _numpy_to_torch(out) if framework == "pt" else out

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self._names:
            yield name, self.get(name)

    def check_values(self) -> None:
        """Scan the data: NaN payload codes (0x7F/0xFF), NaN scale bytes (0xFF), non-finite floats.

        Raises:
            MXFP8Error: naming the tensor and the first offending flat index.
        """
        for name in self._names:
            e = self.header.entries[name]
            if name in self._quantized:
                checks = [(e, lambda c: (c & 0x7F) == 0x7F, "NaN payload code (0x7F/0xFF)")]
                s = self.header.entries[name + SCALE_SUFFIX]
                checks.append((s, lambda c: c == 0xFF, "NaN scale byte 0xFF"))
            elif e.dtype in FLOAT_DTYPES:
                checks = [(e, lambda c: ~np.isfinite(c.astype(np.float32)), "non-finite value")]
            else:
                continue
            for entry, bad, what in checks:
                flat = self._view(entry).reshape(-1)
                if entry.dtype in ("F8_E4M3", "U8", "F8_E8M0"):
                    flat = flat.view(np.uint8)
                for start in range(0, flat.size, SCAN_CHUNK):
                    hits = np.flatnonzero(bad(flat[start : start + SCAN_CHUNK]))
                    if hits.size:
                        idx = np.unravel_index(start + int(hits[0]), entry.shape)
                        raise MXFP8Error(f"{self.path}: tensor {entry.name!r}: {what} at index {tuple(int(i) for i in idx)}")


def open_mxfp8(path: str | os.PathLike[str], *, require_mxfp8: bool = False) -> MXFP8Reader:
    """Open a checkpoint file for reading (validates the header, memory-maps the data).

    Example:
        >>> import numpy as np, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> write_mxfp8_safetensors(p, {"a.o_proj.weight": np.eye(32, dtype=np.float32)})
        >>> with open_mxfp8(p) as r:
        ...     r.keys(), r.is_quantized("a.o_proj.weight"), r.get("a.o_proj.weight")[3, 3]
        (['a.o_proj.weight'], True, np.float32(1.0))
    """
    return MXFP8Reader(path, require_mxfp8=require_mxfp8)


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


def read_mxfp8_safetensors(path: str | os.PathLike[str], *, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Read every tensor of a file into numpy, MXFP8 tensors decoded, floats converted to ``dtype``.

    The ``.scale`` companions are consumed, not returned. Integer/bool tensors keep their dtype.
    ``dtype=None`` keeps plain tensors in their stored dtype and decodes MXFP8 to float32.

    Example:
        >>> import numpy as np, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> write_mxfp8_safetensors(p, {"m.k_proj.weight": np.full((4, 32), 0.5, np.float32)})
        >>> read_mxfp8_safetensors(p)["m.k_proj.weight"].dtype
        dtype('float32')
    """
    return dict(iter_mxfp8_safetensors(path, framework="np", dtype=dtype))


def validate(path: str | os.PathLike[str], *, require_mxfp8: bool = True, check_values: bool = False) -> None:
    """Check a file against every validation rule of the format (docs/format.md).

    Args:
        path: the file.
        require_mxfp8: require ``weights_dtype`` metadata; False also accepts plain files.
        check_values: also scan the data for NaN codes/scales and non-finite floats.

    Raises:
        MXFP8Error: naming the file, tensor and reason.
    """
    if not check_values:
        read_header(path, require_mxfp8=require_mxfp8)
        return
    with MXFP8Reader(path, require_mxfp8=require_mxfp8) as reader:
        reader.check_values()


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
    except ValueError as exc:
        raise MXFP8Error(f"{index}: not valid JSON: {exc}") from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise MXFP8Error(f"{index}: needs a 'weight_map' object of tensor name -> shard file name")
    return wm


def checkpoint_files(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of a checkpoint directory.

    ``model.safetensors`` when present, else the shards listed by ``model.safetensors.index.json``
    (validated: every shard exists inside the directory and has a valid header, every listed tensor
    is in its shard, no tensor is stored in two shards).

    Raises:
        MXFP8Error: naming the directory/index/shard and what is wrong.

    Example:
        >>> import numpy as np, tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> write_mxfp8_safetensors(os.path.join(d, "model.safetensors"), {"x": np.zeros(2, np.float32)})
        >>> [p.name for p in checkpoint_files(d)]
        ['model.safetensors']
    """
    d = Path(checkpoint_dir)
    if not d.is_dir():
        raise MXFP8Error(f"{d}: not a checkpoint directory")
    if (d / SINGLE_FILE).is_file():
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
        header = read_header(p)
        for name in header.entries:
            if name in owner:
                raise MXFP8Error(f"{d}: tensor {name!r} stored in two shards: {owner[name]} and {shard}")
            owner[name] = shard
        for tensor in shards[shard]:
            if tensor not in header.entries:
                raise MXFP8Error(f"{index}: tensor {tensor!r} is listed in {shard} but that shard does not contain it")
    return [d / s for s in sorted(shards)]
