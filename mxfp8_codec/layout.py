"""Checkpoint layout: how stored tensors map to a transformers model's parameters, in one place.

Three rules decide how a tensor in an MXFP8 checkpoint becomes the parameter transformers expects.
Every reader and writer of the project (``python -m mxfp8_codec quantize/dequantize``,
``ida_eval.load_model``, the trainer's export, :func:`mxfp8_codec.load_file` /
:func:`mxfp8_codec.save_file`, the transformers quantizer) calls the functions below, so a file
means the same model whichever of them reads it.

1. **Projections** (:func:`is_projection_weight`): the attention and MLP projection weights by
   transformers' module names, ``q/k/v/o_proj`` and ``gate/up/down_proj`` (:data:`PROJECTION_NAMES`)
   followed by ``.weight``. These are the tensors the writer quantizes and the only tensors whose
   orientation can differ from transformers'.

2. **Orientation** (``__metadata__["orientation"]``, :func:`transposes`): ``in_out`` stores a 2-D
   projection weight as ``[in_features, out_features]``, the transpose of ``nn.Linear.weight`` and
   the trainer's native layout (MXFP8 blocks of 32 then run along ``out_features``); ``out_in``
   stores it exactly like ``nn.Linear.weight``. Going either way is the same transpose, so
   :meth:`CheckpointLayout.to_transformers` and :meth:`CheckpointLayout.from_transformers` are each
   other's inverse. A file without ``weights_dtype`` (a plain transformers file) is ``out_in``; an
   MXFP8 file without the key is ``in_out`` (:func:`file_orientation`).

3. **Norm convention** (``__metadata__["norm_convention"]``, :func:`norm_adds_one`): some
   architectures' norms use ``1 + w`` as their gain at run time (Nemotron's ``NemotronLayerNorm1P``,
   Gemma's ``GemmaRMSNorm``: ``x * (1 + w)``), others multiply by ``w`` directly (Llama, Qwen2/3,
   Mistral RMSNorm: ``w * x``). ``zero_centered`` stores every norm weight exactly as the
   transformers parameter ``w``. ``folded`` stores the gain the norm actually applies: ``1 + w``
   for norms that add 1, and ``w`` itself (unchanged) for norms that multiply directly. A reader of
   a folded file therefore subtracts 1 **only** from the 1-D ``*norm.weight`` tensors of an
   architecture whose norms add 1; a folded Llama file is byte-for-byte a zero-centred one.
   Which architectures add 1 is an explicit table (:data:`NORM_RULES`) keyed by config.json's
   ``model_type``, so a reader without a model object (the CLI) decides exactly like one with a
   model (the loader); a test checks the table against the modules' run-time behaviour. A folded
   file whose ``model_type`` is unknown (or absent) is an error, never a guess: subtracting 1 from
   a gain that is used directly would silently scale every activation.

Numerics of folding: ``w = gamma - 1`` and ``gamma = 1 + w`` are computed in float32 from the stored
(or given) values and rounded once to the target dtype. Unfolding a BF16 gamma is exact in float32;
rounding the result to BF16 is the one rounding.

Example:
    >>> import numpy as np
    >>> lay = CheckpointLayout(orientation="in_out", norm_convention="folded", model_type="nemotron")
    >>> lay.to_transformers("model.layers.0.mlp.up_proj.weight", np.zeros((4, 8), np.float32)).shape
    (8, 4)
    >>> lay.to_transformers("model.norm.weight", np.array([1.5, 0.75], np.float32))
    array([ 0.5 , -0.25], dtype=float32)
    >>> CheckpointLayout(norm_convention="folded", model_type="llama").unfolds("model.norm.weight", 1)
    False
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxfp8_codec.constants import WEIGHTS_DTYPE
from mxfp8_codec.errors import MXFP8Error

__all__ = [
    "CheckpointLayout",
    "NORM_CONVENTIONS",
    "NORM_RULES",
    "NormRule",
    "ORIENTATIONS",
    "PROJECTION_NAMES",
    "file_norm_convention",
    "file_orientation",
    "fold_norm",
    "is_norm_weight",
    "is_projection_weight",
    "model_type_of",
    "norm_adds_one",
    "norm_rule",
    "transposes",
    "unfold_norm",
]

PROJECTION_NAMES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ORIENTATIONS: tuple[str, ...] = ("in_out", "out_in")  # allowed __metadata__["orientation"] values
NORM_CONVENTIONS: tuple[str, ...] = ("zero_centered", "folded")  # allowed __metadata__["norm_convention"] values
CONFIG_FILE = "config.json"  # transformers' model config, beside the weights

_PROJECTION_RE = re.compile(r"(?:^|\.)(?:%s)\.weight$" % "|".join(re.escape(n) for n in PROJECTION_NAMES))
_NORM_RE = re.compile(r"norm\.weight$")


@dataclass(frozen=True)
class NormRule:
    """How one family of architectures' norm modules use their weight at run time.

    Attributes:
        model_types: config.json ``model_type`` values the rule covers.
        adds_one: True when the norms compute with ``1 + w`` (stored folded as ``1 + w``).
        modules: the transformers norm classes and their forward, for the reader of this table.
    """

    model_types: tuple[str, ...]
    adds_one: bool
    modules: str

    def __post_init__(self) -> None:
        if not self.model_types or not all(isinstance(t, str) and t for t in self.model_types):
            raise ValueError(f"NormRule.model_types must be non-empty strings, got {self.model_types!r}")


NORM_RULES: tuple[NormRule, ...] = (
    NormRule(("nemotron",), True, "NemotronLayerNorm1P: layer_norm(x, weight + 1, bias)"),
    # (not "gemma3": the multimodal model's vision tower has plain LayerNorms; its text model is gemma3_text)
    NormRule(("gemma", "gemma2", "gemma3_text"), True, "GemmaRMSNorm & co.: rms_norm(x) * (1 + weight)"),
    NormRule(
        ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3"),
        False,
        "LlamaRMSNorm & co.: weight * rms_norm(x)",
    ),
)
_RULES: dict[str, NormRule] = {t: rule for rule in NORM_RULES for t in rule.model_types}


def is_projection_weight(name: str) -> bool:
    """True for attention/MLP projection weights by transformers' names (:data:`PROJECTION_NAMES`).

    The writer quantizes these (when floating and of rank >= 1); transformer projections are 2-D.

    Example:
        >>> is_projection_weight("model.layers.0.self_attn.q_proj.weight")
        True
        >>> is_projection_weight("model.layers.0.input_layernorm.weight")
        False
    """
    return _PROJECTION_RE.search(name) is not None


def is_norm_weight(name: str, ndim: int) -> bool:
    """True for a 1-D normalisation weight (a name ending in ``norm.weight``): what folding applies to.

    Example:
        >>> is_norm_weight("model.layers.3.post_attention_layernorm.weight", 1), is_norm_weight("model.norm.bias", 1)
        (True, False)
    """
    return ndim == 1 and _NORM_RE.search(name) is not None


def transposes(name: str, ndim: int, orientation: str) -> bool:
    """True when the stored tensor is the transpose of the transformers parameter.

    Only 2-D projection weights of an ``in_out`` file are; embeddings, ``lm_head`` and every other
    tensor are always stored in transformers' layout.

    Example:
        >>> transposes("model.layers.0.mlp.down_proj.weight", 2, "in_out"), transposes("lm_head.weight", 2, "in_out")
        (True, False)
    """
    _check_choice("orientation", orientation, ORIENTATIONS)
    return orientation == "in_out" and ndim == 2 and is_projection_weight(name)


def norm_rule(model_type: str | None, *, source: str = "") -> NormRule:
    """The :class:`NormRule` of an architecture, by config.json's ``model_type``.

    Raises:
        MXFP8Error: an unknown or missing model type (the message lists the known ones).
    """
    rule = _RULES.get(model_type) if model_type is not None else None
    if rule is None:
        where = f"{source}: " if source else ""
        what = (
            "the model type is unknown (no config.json with model_type beside the weights)"
            if model_type is None
            else f"model_type {model_type!r} is not in the norm table (known: {', '.join(sorted(_RULES))})"
        )
        raise MXFP8Error(
            f"{where}norm_convention=folded, but {what}; which norm weights are stored as 1 + w depends on the "
            f"architecture: give the model type (model_type= / --model-type), or store the file zero_centered"
        )
    return rule


def norm_adds_one(name: str, ndim: int, model_type: str | None, *, source: str = "") -> bool:
    """True when ``name`` is a norm weight that the architecture's module uses as ``1 + w``.

    Raises:
        MXFP8Error: for a norm weight when ``model_type`` has no rule in :data:`NORM_RULES`.

    Example:
        >>> norm_adds_one("model.norm.weight", 1, "nemotron"), norm_adds_one("model.norm.weight", 1, "qwen3")
        (True, False)
    """
    if not is_norm_weight(name, ndim):
        return False
    return norm_rule(model_type, source=source).adds_one


def unfold_norm(gamma: Any) -> Any:
    """``w = gamma - 1`` computed in float32 (numpy array or torch tensor in, float32 out).

    Example:
        >>> import numpy as np
        >>> unfold_norm(np.array([1.25], np.float32))
        array([0.25], dtype=float32)
    """
    return _as_float32(gamma) - 1.0


def fold_norm(w: Any) -> Any:
    """``gamma = 1 + w`` computed in float32 (numpy array or torch tensor in, float32 out).

    Example:
        >>> import numpy as np
        >>> fold_norm(np.array([0.25], np.float32))
        array([1.25], dtype=float32)
    """
    return _as_float32(w) + 1.0


def file_orientation(metadata: Mapping[str, str], *, source: str = "") -> str:
    """A file's orientation from its ``__metadata__``: the ``orientation`` value, else ``in_out``
    for an MXFP8 file (``weights_dtype`` present) and ``out_in`` for a plain transformers file.

    Raises:
        MXFP8Error: a value outside :data:`ORIENTATIONS`, naming ``source``.
    """
    value = metadata.get("orientation", "in_out" if metadata.get("weights_dtype") == WEIGHTS_DTYPE else "out_in")
    _check_choice("orientation", value, ORIENTATIONS, source)
    return value


def file_norm_convention(metadata: Mapping[str, str], *, source: str = "") -> str:
    """A file's norm convention from its ``__metadata__`` (``zero_centered`` when absent).

    Raises:
        MXFP8Error: a value outside :data:`NORM_CONVENTIONS`, naming ``source``.
    """
    value = metadata.get("norm_convention", "zero_centered")
    _check_choice("norm_convention", value, NORM_CONVENTIONS, source)
    return value


def model_type_of(path: str | Path) -> str | None:
    """config.json's ``model_type`` for a checkpoint directory or a weight file inside one.

    Multimodal configs whose top level has no ``model_type`` use ``text_config.model_type``.
    Returns None when there is no config.json.

    Raises:
        MXFP8Error: config.json exists but is not a JSON object or ``model_type`` is not a string.
    """
    p = Path(path)
    config = (p if p.is_dir() else p.parent) / CONFIG_FILE
    if not config.is_file():
        return None
    try:
        obj = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise MXFP8Error(f"{config}: cannot read model_type: {exc}") from None
    if not isinstance(obj, dict):
        raise MXFP8Error(f"{config}: not a JSON object")
    value = obj.get("model_type")
    if value is None and isinstance(obj.get("text_config"), dict):
        value = obj["text_config"].get("model_type")
    if value is not None and not isinstance(value, str):
        raise MXFP8Error(f"{config}: model_type must be a string, got {value!r}")
    return value


@dataclass(frozen=True)
class CheckpointLayout:
    """How the tensors of one file map to transformers parameters (validated on construction).

    Attributes:
        orientation: ``"in_out"`` (trainer native, projections transposed) or ``"out_in"``.
        norm_convention: ``"zero_centered"`` or ``"folded"``.
        model_type: config.json's ``model_type``; required (and must be in :data:`NORM_RULES`)
            when ``norm_convention`` is ``"folded"``.
        source: the file or directory, named in error messages.

    Raises:
        MXFP8Error: a bad orientation / norm convention, or a folded layout without a known
            model type.
    """

    orientation: str = "in_out"
    norm_convention: str = "zero_centered"
    model_type: str | None = None
    source: str = ""

    def __post_init__(self) -> None:
        _check_choice("orientation", self.orientation, ORIENTATIONS, self.source)
        _check_choice("norm_convention", self.norm_convention, NORM_CONVENTIONS, self.source)
        if self.norm_convention == "folded":
            norm_rule(self.model_type, source=self.source)

    @classmethod
    def from_metadata(
        cls, metadata: Mapping[str, str], *, model_type: str | None = None, source: str = ""
    ) -> CheckpointLayout:
        """The layout a file's ``__metadata__`` declares (defaults as in :func:`file_orientation`)."""
        return cls(
            orientation=file_orientation(metadata, source=source),
            norm_convention=file_norm_convention(metadata, source=source),
            model_type=model_type,
            source=source,
        )

    @property
    def is_transformers_layout(self) -> bool:
        """True when every stored tensor already is the transformers parameter (nothing to do)."""
        return self.orientation == "out_in" and (
            self.norm_convention == "zero_centered" or not norm_rule(self.model_type).adds_one
        )

    def transposes(self, name: str, ndim: int) -> bool:
        """True when the stored ``name`` is the transpose of the parameter (see :func:`transposes`)."""
        return transposes(name, ndim, self.orientation)

    def unfolds(self, name: str, ndim: int) -> bool:
        """True when the stored ``name`` is ``1 + w`` and readers must subtract 1."""
        return self.norm_convention == "folded" and norm_adds_one(name, ndim, self.model_type, source=self.source)

    def to_transformers(self, name: str, stored: Any) -> Any:
        """Stored tensor -> the transformers parameter's layout and values.

        Projections of an ``in_out`` file come back as a transposed *view* (call
        ``np.ascontiguousarray`` / ``.contiguous()`` if you need contiguous memory); folded norm
        weights as a new float32 array/tensor ``gamma - 1``; everything else unchanged.
        """
        ndim = len(stored.shape)
        if self.transposes(name, ndim):
            return stored.T
        if self.unfolds(name, ndim):
            return unfold_norm(stored)
        return stored

    def from_transformers(self, name: str, param: Any) -> Any:
        """Transformers parameter -> the tensor to store (the inverse of :meth:`to_transformers`)."""
        ndim = len(param.shape)
        if self.transposes(name, ndim):
            return param.T
        if self.unfolds(name, ndim):
            return fold_norm(param)
        return param


def _check_choice(key: str, value: Any, allowed: tuple[str, ...], source: str = "") -> None:
    if value not in allowed:
        where = f"{source}: " if source else ""
        raise MXFP8Error(f"{where}{key} must be one of {list(allowed)}, got {value!r}")


def _as_float32(x: Any) -> Any:
    import sys

    import numpy as np

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.to(torch.float32)
    return np.asarray(x).astype(np.float32)
