"""Writing MXFP8 safetensors checkpoints, atomically and one tensor at a time.

On disk (docs/format.md) a quantized tensor ``NAME`` is two entries: ``NAME`` (``F8_E4M3``, the
tensor's stored shape) and ``NAME.scale`` (``U8``, one UE8M0 byte per 32 elements along the last
axis); every other floating tensor is ``BF16`` and integer/bool tensors are unchanged.

The whole layout (names, dtypes, shapes, byte sizes) is planned before any tensor is encoded:
quantized sizes follow from the shape alone (``prod(shape)`` payload bytes,
``prod(shape[:-1]) * ceil(K / 32)`` scale bytes). So the header is written first and each tensor is
then fetched, encoded by :func:`mxfp8_codec.numerics.encode_mxfp8` and written in turn -- peak memory
one encoded tensor, even for a lazy Mapping that loads on access. Entries are ordered by item size
(largest first), then by name, with each ``.scale`` right after its payload; with the header
space-padded to 8 bytes every tensor starts at a multiple of its item size, so zero-copy readers
(``np.frombuffer``, ``safe_open``) see aligned data.

Atomicity: the file is written to a temporary file in the same directory, fsynced, moved into place
with ``os.replace`` and the directory fsynced. A crash or an error (e.g. a NaN in a weight) never
leaves a half-written checkpoint under the final name and never touches an existing one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tqdm.auto import tqdm

from ida_common.files import atomic_output
from ida_common.killpoint import kill_point
from mxfp8_codec.constants import WEIGHTS_DTYPE, ScaleRule
from mxfp8_codec.convert import (
    BF16,
    F8_NUMPY_DTYPES,
    as_numpy,
    as_u8,
    float_target_dtype,
    is_float_dtype,
    is_torch,
    numpy_dtype_of,
    torch_encodable_dtypes,
)
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import DTYPES, FORMAT_VERSION, SCALE_SUFFIX, encode_header
from mxfp8_codec.layout import file_norm_convention, file_orientation, is_projection_weight
from mxfp8_codec.numerics import encode_mxfp8, scales_shape

_NP_TO_ST = {dt: name for name, dt in DTYPES.items()}


class MXFP8Tensor(NamedTuple):
    """An already-encoded tensor that the writer stores byte-for-byte.

    Attributes:
        payload: E4M3 bit patterns, ``uint8`` (numpy array or torch tensor), the tensor's shape.
        scales: UE8M0 bytes, ``uint8``, shape ``(*payload.shape[:-1], ceil(payload.shape[-1] / 32))``.
    """

    payload: Any
    scales: Any


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


def _write_items(
    path: str | os.PathLike[str], items: list[_Item], metadata: Mapping[str, str], progress: bool | None
) -> None:
    items = sorted(items, key=lambda it: (-DTYPES[it.dtype].itemsize, it.logical, it.is_scale))
    names = [it.name for it in items]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise MXFP8Error(
            f"{path}: tensor {dup[0]!r}: name used twice (a '.scale' name collides with a quantized tensor's scale?)"
        )
    try:
        prefix, _ = encode_header(((it.name, it.dtype, it.shape, it.nbytes) for it in items), metadata)
    except MXFP8Error as exc:
        raise MXFP8Error(f"{path}: {exc}") from None
    with atomic_output(path) as f:
        f.write(prefix)
        for it in tqdm(
            items,
            desc=f"writing {Path(path).name}",
            unit="tensor",
            disable=None if progress is None else not progress,
            leave=False,
        ):
            arr = it.produce()
            flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if arr.shape != it.shape or flat.nbytes != it.nbytes:
                raise MXFP8Error(
                    f"{path}: tensor {it.name!r}: produced shape {arr.shape} / {flat.nbytes} bytes, planned {it.shape} / {it.nbytes}"
                )
            f.write(memoryview(flat))
            del arr, flat  # before the next tensor is fetched: one tensor in memory at a time, not two
            kill_point("writer.tensor_written")  # crash tests: IDA_KILL_AT=writer.tensor_written:N


def _quantized_items(
    name: str, shape: tuple[int, ...], encode: Callable[[], tuple[np.ndarray, np.ndarray]]
) -> list[_Item]:
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
        _Item(name + SCALE_SUFFIX, "U8", scales_shape(shape), name, True, lambda: get(1, True)),
    ]


def _describe(tensors: Mapping[str, Any], name: str) -> tuple[Any, tuple[int, ...], np.dtype | None]:
    """``(value, shape, numpy dtype)`` of ``tensors[name]``; value is None when the mapping's
    optional ``spec(name) -> (shape, numpy dtype)`` answered without loading. dtype is None for
    an :class:`MXFP8Tensor` (which ``spec`` announces with the dtype None and the payload's shape)."""
    spec = getattr(tensors, "spec", None)
    if callable(spec):
        shape, dt = spec(name)
        return None, tuple(int(d) for d in shape), None if dt is None else np.dtype(dt)
    value = tensors[name]
    if isinstance(value, MXFP8Tensor):
        return value, (), None
    if not (is_torch(value) or isinstance(value, np.ndarray)):
        raise MXFP8Error(
            f"tensor {name!r}: expected a numpy array, torch tensor or MXFP8Tensor, got {type(value).__name__}"
        )
    return value, tuple(int(d) for d in value.shape), numpy_dtype_of(value)


def _plain_item(
    name: str, get_value: Callable[[], Any], shape: tuple[int, ...], dt: np.dtype, float_target: np.dtype | None
) -> _Item:
    """An entry stored as-is (ints, bools) or converted to ``float_target`` (floats)."""
    if dt in F8_NUMPY_DTYPES:
        raise MXFP8Error(f"tensor {name!r}: float8 data must be passed as MXFP8Tensor(payload, scales)")
    out_dt = float_target if (is_float_dtype(dt) and float_target is not None) else dt
    if out_dt not in _NP_TO_ST:
        raise MXFP8Error(f"tensor {name!r}: dtype {dt} cannot be stored in safetensors by this codec")

    def produce() -> np.ndarray:
        a = as_numpy(get_value(), name)
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
    planning pass loads nothing (``spec`` gives the dtype None and the payload's shape for an
    MXFP8Tensor value; its payload and scales shapes are checked when it is written).

    Args:
        path: output file.
        tensors: name -> numpy array, torch tensor or :class:`MXFP8Tensor`.
        quantize: predicate on the name; None quantizes nothing.
        metadata: extra ``__metadata__`` entries (str -> str); may not override the format keys.
        scale_rule: ``"rceil"`` (default) or ``"floor"``; recorded in the metadata.
        orientation: ``"in_out"`` (trainer-native, default) or ``"out_in"``; recorded only: the
            tensors must already be in that layout (:mod:`mxfp8_codec.layout`,
            :func:`mxfp8_codec.save_file` takes transformers-layout tensors and applies it).
        norm_convention: ``"zero_centered"`` or ``"folded"``; recorded only (see
            :mod:`mxfp8_codec.layout`: readers of a folded file need config.json's ``model_type``).
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
    try:
        rule = ScaleRule(scale_rule).value
    except ValueError:
        raise MXFP8Error(
            f"{path}: scale_rule must be one of {[r.value for r in ScaleRule]}, got {scale_rule!r}"
        ) from None
    file_orientation({"orientation": orientation}, source=str(path))  # validated here, applied by the caller
    file_norm_convention({"norm_convention": norm_convention}, source=str(path))
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
            if value is None:  # announced by spec(): the shapes it produces are checked as it is written
                if not shape:
                    raise MXFP8Error(f"{path}: tensor {name!r}: an MXFP8Tensor payload needs rank >= 1")
            else:
                p = as_u8(value.payload, name, "payload")
                s = as_u8(value.scales, name, "scales")
                if p.ndim == 0 or s.shape != scales_shape(p.shape):
                    want = scales_shape(p.shape) if p.ndim else "(rank >= 1 payload)"
                    raise MXFP8Error(
                        f"{path}: tensor {name!r}: MXFP8Tensor scales shape {s.shape} does not match payload {p.shape} (expected {want})"
                    )
                shape = tuple(int(d) for d in p.shape)

            def enc_raw(n: str = name) -> tuple[np.ndarray, np.ndarray]:
                v = tensors[n]
                return as_u8(v.payload, n, "payload"), as_u8(v.scales, n, "scales")

            items += _quantized_items(name, shape, enc_raw)
        elif quantize is not None and is_float_dtype(dt) and dt.itemsize > 1 and len(shape) >= 1 and quantize(name):

            def enc(n: str = name) -> tuple[np.ndarray, np.ndarray]:
                x = tensors[n]
                if is_torch(x):
                    if x.dtype not in torch_encodable_dtypes():
                        x = x.float()
                elif x.dtype == np.float64:
                    x = x.astype(np.float32)
                p, s = encode_mxfp8(x, scale_rule=rule, name=n)
                return as_numpy(p, n), as_numpy(s, n)

            items += _quantized_items(name, shape, enc)
        else:
            items.append(_plain_item(name, (lambda n=name: tensors[n]), shape, dt, BF16))
        del value
    _write_items(path, items, meta, progress)


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
    target = float_target_dtype(float_dtype) if float_dtype is not None else None
    items = []
    for name in tensors:
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise MXFP8Error(f"{path}: invalid tensor name {name!r}")
        _value, shape, dt = _describe(tensors, name)
        if dt is None:
            raise MXFP8Error(
                f"{path}: tensor {name!r}: write_safetensors stores plain tensors; use write_mxfp8_safetensors for MXFP8Tensor"
            )
        del _value
        items.append(_plain_item(name, (lambda n=name: tensors[n]), shape, dt, target))
    _write_items(path, items, dict(metadata or {}), progress)
