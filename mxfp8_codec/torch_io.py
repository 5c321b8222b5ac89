"""``load_file`` / ``save_file``: MXFP8 checkpoints to and from torch tensors in transformers' layout.

The safetensors-style pair (``safetensors.torch.load_file`` / ``save_file``) for this format:

* :func:`save_file` takes a transformers ``state_dict`` (``nn.Linear.weight`` is ``[out, in]``, norm
  weights as the parameters), maps it to the requested stored layout with
  :class:`mxfp8_codec.layout.CheckpointLayout` (transpose projections for ``in_out``, fold norms to
  ``1 + w`` for ``folded`` where the architecture adds 1) and writes it with
  :func:`mxfp8_codec.write_mxfp8_safetensors` (2-D projection weights MXFP8, the rest BF16).
* :func:`load_file` reads any MXFP8 (or plain) file back into exactly that ``state_dict`` layout,
  whatever its stored orientation and norm convention: MXFP8 projections are decoded straight into
  ``[out, in]`` (``decode_mxfp8(..., transpose=True)``: one pass, no intermediate array), folded
  norms unfolded (``gamma - 1`` in float32, rounded once). ``model.load_state_dict(load_file(p))``
  then gives the same model as ``ida_eval.load_model`` and ``python -m mxfp8_codec dequantize``.

Example:
    >>> import tempfile, os, torch
    >>> from mxfp8_codec import load_file, save_file
    >>> sd = {"model.layers.0.mlp.up_proj.weight": torch.randn(64, 32), "model.norm.weight": torch.ones(32)}
    >>> p = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> save_file(sd, p)
    >>> back = load_file(p, dtype=torch.bfloat16)
    >>> back["model.layers.0.mlp.up_proj.weight"].shape, back["model.norm.weight"].dtype
    (torch.Size([64, 32]), torch.bfloat16)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mxfp8_codec.convert import BF16, float_target_dtype, numpy_dtype_of, numpy_to_torch, torch_dtype_of
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import DTYPES
from mxfp8_codec.layout import CheckpointLayout, is_projection_weight, model_type_of
from mxfp8_codec.numerics import decode_mxfp8
from mxfp8_codec.reader import checkpoint_files, open_mxfp8
from mxfp8_codec.writer import write_mxfp8_safetensors

__all__ = ["load_file", "save_file"]


def load_file(
    path: str | os.PathLike[str], *, device: Any = "cpu", dtype: Any = None, model_type: str | None = None
) -> dict[str, Any]:
    """Read an MXFP8 (or plain) checkpoint into torch tensors in transformers' layout.

    Args:
        path: a ``.safetensors`` file, or a checkpoint directory (single file or shards).
        device: where the tensors go (``"cpu"``, ``"cuda:0"``, a ``torch.device``).
        dtype: float dtype for floating tensors (``torch.bfloat16``, ``torch.float32``, ...); None
            decodes MXFP8 to float32 and keeps plain tensors as stored.
        model_type: config.json's ``model_type``, needed for ``norm_convention=folded`` files;
            default: the config.json of the directory / beside the file.

    Returns:
        ``{name: tensor}`` ready for ``model.load_state_dict``.

    Raises:
        MXFP8Error: an invalid file, or a folded file of an unknown model type (naming the file).

    Example:
        >>> import tempfile, os, torch
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> save_file({"a.o_proj.weight": torch.eye(32, 64)}, p)
        >>> torch.equal(load_file(p)["a.o_proj.weight"], torch.eye(32, 64))
        True
    """
    import torch

    p = Path(path)
    files = checkpoint_files(p) if p.is_dir() else [p]
    if model_type is None:
        model_type = model_type_of(p)
    target = float_target_dtype(dtype) if dtype is not None else None
    dev = torch.device(device)
    out: dict[str, Any] = {}
    for f in files:
        with open_mxfp8(f) as r:
            layout = CheckpointLayout.from_metadata(r.metadata, model_type=model_type, source=str(f))
            for name in r.keys():
                out[name] = _load_one(r, name, layout, target).to(dev)
    return out


def _load_one(r: Any, name: str, layout: CheckpointLayout, target: np.dtype | None) -> Any:
    """One tensor in transformers' layout: unfolded from float32, or decoded (transposed) once."""
    shape = r.shape(name)
    if layout.unfolds(name, len(shape)):
        w = layout.to_transformers(name, r.get(name, framework="pt", dtype=np.float32))  # gamma - 1, float32
        stored = np.dtype(np.float32) if r.is_quantized(name) else DTYPES[r.dtype(name)]
        return w.to(torch_dtype_of(target if target is not None else stored))  # the one rounding
    flip = layout.transposes(name, len(shape))
    if r.is_quantized(name) and flip:
        payload, scales = r.raw_view(name)
        direct = target if target in (np.dtype(np.float32), BF16) else np.dtype(np.float32)
        t = numpy_to_torch(decode_mxfp8(payload, scales, dtype=direct.type, transpose=True, name=name))
        return t if target is None or target == direct else t.to(torch_dtype_of(target))
    t = r.get(name, framework="pt", dtype=target)
    return t.t().contiguous() if flip else t


class _Stored(Mapping[str, Any]):
    """The state_dict mapped to the stored layout, one tensor at a time (nothing copied up front)."""

    def __init__(self, tensors: Mapping[str, Any], layout: CheckpointLayout) -> None:
        self._t, self._layout = tensors, layout

    def __getitem__(self, name: str) -> Any:
        v = self._layout.from_transformers(name, self._t[name])
        return v.contiguous() if hasattr(v, "contiguous") else np.ascontiguousarray(v)

    def __iter__(self) -> Iterator[str]:
        return iter(self._t)

    def __len__(self) -> int:
        return len(self._t)


def save_file(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, str] | None = None,
    orientation: str = "in_out",
    norm_convention: str = "zero_centered",
    model_type: str | None = None,
    scale_rule: str = "rceil",
) -> None:
    """Write a transformers ``state_dict`` as an MXFP8 checkpoint file (atomically).

    2-D projection weights (:func:`mxfp8_codec.layout.is_projection_weight`) are stored MXFP8 in
    ``orientation``; everything else BF16 (integers unchanged). With ``norm_convention="folded"``
    the norm weights of architectures whose norms add 1 are stored as ``1 + w`` (``model_type``
    required). Tied copies are written as they are in ``tensors``.

    Raises:
        MXFP8Error: bad layout options, non-finite weights, name collisions (naming the file).
    """
    layout = CheckpointLayout(orientation, norm_convention, model_type, source=str(path))
    for name, v in tensors.items():
        if not hasattr(v, "shape"):
            raise MXFP8Error(f"{path}: tensor {name!r}: expected a torch tensor or numpy array, got {type(v).__name__}")
        numpy_dtype_of(v)  # unsupported dtypes fail here, naming the tensor
    write_mxfp8_safetensors(
        path,
        _Stored(tensors, layout),
        quantize=lambda n: is_projection_weight(n) and len(tensors[n].shape) == 2,
        metadata=metadata,
        scale_rule=scale_rule,
        orientation=orientation,
        norm_convention=norm_convention,
    )
