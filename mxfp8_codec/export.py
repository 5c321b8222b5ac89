"""Export an MXFP8 checkpoint to the compressed-tensors ``mxfp8-quantized`` layout (vLLM, transformers).

vLLM and transformers' ``compressed-tensors`` quantizer read MXFP8 weights in this layout (written
by compressed-tensors 0.20.1's own ``MXFP8QuantizationCompressor``):

* per projection ``X.weight`` F8_E4M3 ``[out, in]`` (``nn.Linear`` layout) and
  ``X.weight_scale`` U8 ``[out, in / 32]`` (UE8M0 bytes, 2^(s - 127)); every other tensor plain
  (BF16), in transformers' layout and values (folded norm gains unfolded);
* safetensors ``__metadata__ = {"format": "pt"}``;
* config.json ``quantization_config`` = :func:`compressed_tensors_config` (one group targeting
  ``Linear``: 8-bit float weights, group strategy, group size 32, symmetric, static,
  ``scale_dtype = torch.uint8``, no input activations, ``ignore = ["lm_head"]``).

How the bytes get there:

* ``orientation = out_in`` source: the payload and scale bytes are copied unchanged -- only names,
  metadata and config change; :class:`ExportReport` lists the sha256 of each projection's payload
  and scale in the source and in the written file (equal, checked before the export is moved into
  place).
* ``orientation = in_out`` source (the trainer's master, blocks along ``out``): blocks must run
  along ``in``, so each projection is decoded exactly (float32), transposed and encoded again: a
  second rounding. The report counts the values whose decoded value changed and the largest
  change; the sha256 chain of the payload ends at the master (the exported bytes are new bytes).
  Scale rule: RCEIL (``e = floor(log2 amax) - 8 + (mantissa > 1.75)``), what vLLM's own online
  MXFP8 quantization (flashinfer / torchao RCEIL) produces and what our codec writes.
  compressed-tensors' ``generate_mx_scales`` rounds amax to one mantissa bit first and so bumps
  at mantissa >= 1.75: the two differ only for blocks whose amax mantissa is exactly 1.75 (ours
  then codes the maximum as 448 with the smaller scale, theirs as 224 with the larger). vLLM
  decodes either as ``e4m3 * 2^(s - 127)``, so both load identically; the choice only decides
  which bytes we write.

Refused, each with one line naming the file and tensor: ``in_features % 32 != 0`` (vLLM's
MXFP8 layers need whole blocks), a quantized tensor that is not a projection weight (embeddings,
``lm_head``), a projection stored plain (vLLM fuses q/k/v and gate/up and cannot mix), a
non-2-D projection, a plain (non-MXFP8) source, a folded file of an architecture the layout table
does not know, and an existing ``DST`` without ``overwrite``. The export is written into a
temporary directory beside ``DST`` and renamed into place only when complete and verified
(:func:`ida_common.files.check_output` and :func:`ida_common.files.atomic_directory`, like every
ida command that writes a directory).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ida_common.checksums import write_sums
from ida_common.files import atomic_directory, check_output
from mxfp8_codec.checkpoint import check_sums, copy_side_files
from mxfp8_codec.constants import BLOCK_SIZE, WEIGHTS_DTYPE
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.layout import CheckpointLayout, is_projection_weight, model_type_of
from mxfp8_codec.numerics import decode_mxfp8, encode_mxfp8
from mxfp8_codec.reader import INDEX_FILE, checkpoint_files, open_mxfp8

__all__ = ["CT_SCALE_SUFFIX", "ExportReport", "compressed_tensors_config", "export_compressed_tensors"]

CT_SCALE_SUFFIX = "_scale"  # compressed-tensors: X.weight -> X.weight_scale


def compressed_tensors_config() -> dict[str, Any]:
    """config.json ``quantization_config`` of an ``mxfp8-quantized`` checkpoint, as compressed-tensors
    0.20.1 writes it for the MXFP8A16 scheme (tests validate it with compressed-tensors itself)."""
    return {
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": "float",
                    "symmetric": True,
                    "group_size": BLOCK_SIZE,
                    "strategy": "group",
                    "dynamic": False,
                    "scale_dtype": "torch.uint8",
                },
                "input_activations": None,
                "output_activations": None,
                "format": None,
            }
        },
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": None,
        "format": "mxfp8-quantized",
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
    }


@dataclass
class ExportReport:
    """What :func:`export_compressed_tensors` did.

    Attributes:
        src, dst: the directories.
        orientation: the source's orientation.
        projections: ``(name, source payload sha256, source scale sha256, written payload sha256,
            written scale sha256)`` per projection (equal pairs for an ``out_in`` source).
        values: projection values exported; ``changed``: values whose decoded value changed
            (``in_out`` re-encode; 0 for ``out_in``); ``max_change`` / ``max_change_tensor``: the
            largest absolute change and where.
        scale_rule: the rule of the written scales (``"as stored"`` for an ``out_in`` source).
    """

    src: str
    dst: str
    orientation: str
    scale_rule: str
    projections: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    values: int = 0
    changed: int = 0
    max_change: float = 0.0
    max_change_tensor: str = ""

    def lines(self) -> list[str]:
        """The human-readable report the CLI prints."""
        out = [
            f"exported {self.src} -> {self.dst} (compressed-tensors mxfp8-quantized, "
            f"{len(self.projections)} projections, {self.values} values)"
        ]
        if self.orientation == "out_in":
            out.append("source orientation out_in: payload and scale bytes unchanged (sha256 source = written):")
            for name, sp, ss, dp, ds in self.projections:
                mark = "=" if (sp, ss) == (dp, ds) else "!="
                out.append(f"  {name}  payload {sp} {mark} {dp}  scale {ss} {mark} {ds}")
        else:
            frac = self.changed / self.values if self.values else 0.0
            out.append(
                f"source orientation in_out: decoded, transposed and re-encoded along in_features "
                f"(scale rule {self.scale_rule}): {self.changed} of {self.values} values changed ({frac:.4%}), "
                f"largest change {self.max_change:.6g}" + (f" in {self.max_change_tensor}" if self.changed else "")
            )
            out.append(
                "the sha256 chain ends at the master: the exported payloads are new bytes; source sha256 per projection:"
            )
            for name, sp, ss, dp, ds in self.projections:
                out.append(f"  {name}  source payload {sp} scale {ss} -> written payload {dp} scale {ds}")
        return out


def _sha(data: Any) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(data)).cast("B")).hexdigest()


def _plan(files: list[Path], model_type: str | None) -> tuple[str, Any]:
    """Validate every header; return (orientation, layout). Raises MXFP8Error naming file and tensor."""
    orientation = None
    layout = None
    for f in files:
        with open_mxfp8(f) as r:
            meta = dict(r.metadata)
            if meta.get("weights_dtype") != WEIGHTS_DTYPE:
                raise MXFP8Error(f"{f}: not an MXFP8 file (no weights_dtype={WEIGHTS_DTYPE}); nothing to export")
            lay = CheckpointLayout.from_metadata(meta, model_type=model_type, source=str(f))
            if layout is None:
                layout, orientation = lay, lay.orientation
            elif (lay.orientation, lay.norm_convention) != (layout.orientation, layout.norm_convention):
                raise MXFP8Error(f"{f}: orientation/norm convention differ from {files[0].name}'s")
            for name in r.keys():
                shape = r.shape(name)
                if r.is_quantized(name) and not is_projection_weight(name):
                    raise MXFP8Error(
                        f"{f}: tensor {name!r} is MXFP8 but not a projection weight; compressed-tensors/vLLM "
                        "quantize only Linear projections (python -m mxfp8_codec dequantize makes it plain)"
                    )
                if not is_projection_weight(name):
                    continue
                if not r.is_quantized(name):
                    raise MXFP8Error(
                        f"{f}: tensor {name!r} is a projection stored {r.dtype(name)}, not MXFP8; vLLM fuses "
                        "q/k/v and gate/up projections and cannot mix quantized and plain ones"
                    )
                if len(shape) != 2:
                    raise MXFP8Error(f"{f}: tensor {name!r} has shape {list(shape)}; only 2-D projections export")
                k = shape[0] if lay.orientation == "in_out" else shape[1]
                if k % BLOCK_SIZE:
                    raise MXFP8Error(
                        f"{f}: tensor {name!r}: in_features={k} is not a multiple of {BLOCK_SIZE}; compressed-tensors "
                        "mxfp8 needs whole blocks of 32 along in_features"
                    )
    assert orientation is not None and layout is not None
    return orientation, layout


def export_compressed_tensors(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    model_type: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> ExportReport:
    """Write the compressed-tensors ``mxfp8-quantized`` copy of the MXFP8 checkpoint ``src``.

    Args:
        src: an MXFP8 checkpoint directory (config.json, tokenizer files, weights).
        dst: the directory to create (refused if it exists, unless ``overwrite``).
        overwrite: replace an existing ``dst`` (only once the new export is complete).
        model_type: for folded norms when config.json lacks ``model_type``.
        progress: called with each tensor name as it is written.

    Returns:
        An :class:`ExportReport`.

    Raises:
        MXFP8Error: one line naming the file/tensor for every refusal (module docstring).

    Example:
        >>> export_compressed_tensors("runs/sft/ckpt-000100", "served/sft-100")  # doctest: +SKIP
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    src_p, dst_p = Path(src), Path(dst)
    if not (src_p / "config.json").is_file():
        raise MXFP8Error(f"{src_p}: no config.json (export needs a checkpoint directory)")
    check_output(dst_p, inputs=[src_p], overwrite=overwrite, kind="dir", what="DST")
    check_sums(src_p)
    files = checkpoint_files(src_p)
    mt = model_type or model_type_of(src_p)
    orientation, layout = _plan(files, mt)
    report = ExportReport(str(src_p), str(dst_p), orientation, "as stored" if orientation == "out_in" else "rceil")
    # the whole directory appears at once, complete, or not at all (ida_common.files)
    with atomic_directory(dst_p, overwrite=overwrite) as tmp:
        weight_map: dict[str, str] = {}
        expected: dict[str, tuple[str, str]] = {}  # written name -> (file, sha256)
        for f in files:
            out_name = "model.safetensors" if len(files) == 1 else f.name
            tensors: dict[str, torch.Tensor] = {}
            with open_mxfp8(f) as r:
                for name in r.keys():
                    if progress is not None:
                        progress(name)
                    if r.is_quantized(name):
                        raw = r.get_raw(name)
                        src_pay, src_sc = _sha(raw.payload), _sha(raw.scales)
                        if orientation == "out_in":
                            payload, scales = np.array(raw.payload), np.array(raw.scales)
                        else:
                            old = decode_mxfp8(raw.payload, raw.scales, dtype=np.float32, transpose=True, name=name)
                            payload, scales = encode_mxfp8(old, scale_rule="rceil", name=name)
                            new = decode_mxfp8(payload, scales, dtype=np.float32, name=name)
                            diff = np.abs(new - old)
                            changed = int(np.count_nonzero(diff))
                            report.changed += changed
                            if changed and float(diff.max()) > report.max_change:
                                report.max_change, report.max_change_tensor = float(diff.max()), name
                            del old, new, diff
                        report.values += payload.size
                        pay_sha, sc_sha = _sha(payload), _sha(scales)
                        report.projections.append((name, src_pay, src_sc, pay_sha, sc_sha))
                        tensors[name] = torch.from_numpy(payload).view(torch.float8_e4m3fn)
                        tensors[name + CT_SCALE_SUFFIX] = torch.from_numpy(scales)
                        expected[name] = (out_name, pay_sha)
                        expected[name + CT_SCALE_SUFFIX] = (out_name, sc_sha)
                    else:
                        stored = r.get(name, framework="pt")
                        if layout.unfolds(name, stored.dim()):  # gamma -> w in float32, rounded once
                            stored = layout.to_transformers(name, stored).to(stored.dtype)
                        tensors[name] = stored.contiguous()
                    weight_map[name] = out_name
                    if r.is_quantized(name):
                        weight_map[name + CT_SCALE_SUFFIX] = out_name
            save_file(tensors, str(tmp / out_name), metadata={"format": "pt"})
            del tensors
        # verify what was written (the bytes of every projection entry) before moving it into place
        by_file: dict[str, list[str]] = {}
        for name, (fname, _) in expected.items():
            by_file.setdefault(fname, []).append(name)
        for fname, names in by_file.items():
            with safe_open(str(tmp / fname), framework="pt") as g:
                for name in names:
                    got = _sha(g.get_tensor(name).view(torch.uint8).numpy())
                    if got != expected[name][1]:
                        raise MXFP8Error(f"{tmp / fname}: tensor {name!r}: written sha256 {got} != {expected[name][1]}")
        _copy_side_files_and_config(src_p, tmp, len(files) > 1, weight_map)
        write_sums(tmp, sync=True)
    return report


def _copy_side_files_and_config(src: Path, out: Path, sharded: bool, weight_map: dict[str, str]) -> None:
    copy_side_files(src, out)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"] = compressed_tensors_config()
    (out / "config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )  # in the temp dir
    if sharded:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
