"""The config.json side of an MXFP8 checkpoint: the ``quantization_config`` our writers record.

Every MXFP8 checkpoint directory our tools write (``python -m mxfp8_codec quantize``, the trainer's
export) carries in config.json::

    "quantization_config": {"quant_method": "mxfp8_codec", "weights_dtype": "MXFP8_E4M3_UE8M0_K32",
                            "format_version": "1", "orientation": "in_out",
                            "norm_convention": "zero_centered", "scale_rule": "rceil"}

derived from the weight file's own ``__metadata__`` (so the two cannot disagree when written);
``import mxfp8_codec.hf`` makes ``AutoModelForCausalLM.from_pretrained(d)`` load such a directory
(docs/format.md §15). This module needs no transformers: writers import it.

Why this is not a safeguard on its own: a transformers without our quantizer only warns
("Unknown quantization type, got mxfp8_codec ... we will skip the quantization") and loads the raw
E4M3 codes. :func:`how_to_load` is the line ``inspect``/``verify`` print.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ida_common.files import atomic_write_text
from mxfp8_codec.constants import WEIGHTS_DTYPE
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import read_header
from mxfp8_codec.layout import NORM_CONVENTIONS, ORIENTATIONS

__all__ = [
    "FORMAT_VERSION",
    "how_to_load",
    "NORM_CONVENTIONS",
    "QUANT_METHOD",
    "quantization_config_dict",
    "quantization_config_from_metadata",
    "write_config_json",
]

QUANT_METHOD = "mxfp8_codec"  # quant_method in config.json ("mxfp8" is transformers' own FP8 method)
FORMAT_VERSION = "1"


def quantization_config_dict(
    *, orientation: str, norm_convention: str, scale_rule: str | None = None
) -> dict[str, str]:
    """The ``quantization_config`` for config.json.

    Example:
        >>> quantization_config_dict(orientation="in_out", norm_convention="zero_centered")["quant_method"]
        'mxfp8_codec'
    """
    if orientation not in ORIENTATIONS:
        raise MXFP8Error(f"orientation {orientation!r} is not one of {ORIENTATIONS}")
    if norm_convention not in NORM_CONVENTIONS:
        raise MXFP8Error(f"norm_convention {norm_convention!r} is not one of {NORM_CONVENTIONS}")
    d = {
        "quant_method": QUANT_METHOD,
        "weights_dtype": WEIGHTS_DTYPE,
        "format_version": FORMAT_VERSION,
        "orientation": orientation,
        "norm_convention": norm_convention,
    }
    if scale_rule is not None:
        d["scale_rule"] = scale_rule
    return d


def quantization_config_from_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """The ``quantization_config`` matching an MXFP8 file's ``__metadata__`` (format defaults §4)."""
    if metadata.get("weights_dtype") != WEIGHTS_DTYPE:
        raise MXFP8Error(f"metadata has no weights_dtype={WEIGHTS_DTYPE}: not an MXFP8 file")
    return quantization_config_dict(
        orientation=metadata.get("orientation", "in_out"),
        norm_convention=metadata.get("norm_convention", "zero_centered"),
        scale_rule=metadata.get("scale_rule"),
    )


def write_config_json(
    directory: str | os.PathLike[str],
    weights: str | os.PathLike[str] | None,
    *,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """(Re)write ``directory/config.json`` atomically with the ``quantization_config`` of the MXFP8
    file ``weights``, or without any ``quantization_config`` when ``weights`` is None (a plain copy).

    Args:
        directory: the checkpoint directory.
        weights: an MXFP8 weight file of the checkpoint (its metadata decides), or None.
        config: the config to write (default: the directory's config.json).

    Raises:
        MXFP8Error: no config.json / not a JSON object / ``weights`` not MXFP8.
    """
    path = Path(directory) / "config.json"
    if config is None:
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise MXFP8Error(f"{path}: cannot read config.json: {exc}") from None
    if not isinstance(config, Mapping):
        raise MXFP8Error(f"{path}: config.json is not a JSON object")
    out = {k: v for k, v in config.items() if k != "quantization_config"}
    if weights is not None:
        out["quantization_config"] = quantization_config_from_metadata(read_header(weights).metadata)
    atomic_write_text(path, json.dumps(out, indent=2, sort_keys=True) + "\n")
    return path


def how_to_load(path: str | os.PathLike[str]) -> str | None:
    """One line telling how to load the MXFP8 checkpoint at ``path`` (file or directory), or None
    for a plain file. Printed by ``python -m mxfp8_codec inspect`` and ``verify``."""
    p = Path(path)
    directory = p if p.is_dir() else p.parent
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():  # a lone file, not a transformers checkpoint directory
        return (
            f"how to load: mxfp8_codec.load_file({str(p)!r}) (torch tensors in transformers' layout); "
            f"from_pretrained needs a config.json beside it, and {directory} has none"
        )
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    except (OSError, ValueError):
        qc = None
    named = isinstance(qc, dict) and qc.get("quant_method") == QUANT_METHOD
    how = (
        f"import mxfp8_codec.hf; AutoModelForCausalLM.from_pretrained({str(directory)!r})"
        if named
        else f"import mxfp8_codec.hf; AutoModelForCausalLM.from_pretrained({str(directory)!r}, "
        "quantization_config=mxfp8_codec.hf.MXFP8Config())"
    )
    return (
        f"how to load: {how}  (or ida_eval.load_model; config.json "
        f"{'names' if named else 'does not name'} quant_method={QUANT_METHOD!r}; transformers without "
        "mxfp8_codec.hf would warn and run the raw E4M3 codes)"
    )
