"""Whole checkpoints: quantize a transformers checkpoint directory to MXFP8, dequantize one back.

The library behind ``python -m mxfp8_codec quantize`` / ``dequantize`` (:mod:`mxfp8_codec.cli` parses
and prints; this module does the work) and the side-file policy every writer of a checkpoint directory
shares (:mod:`mxfp8_codec.export`, the trainer's export):

* :func:`quantize_checkpoint`: a transformers BF16/F32 checkpoint directory (one file or sharded) ->
  one MXFP8 ``model.safetensors``. 2-D projection weights
  (:func:`~mxfp8_codec.layout.is_projection_weight`) are stored in ``orientation`` (default ``in_out``,
  the trainer's native ``[in, out]``) and encoded; everything else is written as stored.
* :func:`dequantize_checkpoint`: an MXFP8 file or directory -> plain BF16 safetensors in transformers'
  layout (projections transposed back, folded norms unfolded where the architecture's norms add 1:
  :class:`~mxfp8_codec.layout.CheckpointLayout`), loadable by ``from_pretrained``.
* :func:`copy_side_files`: config, tokenizer and generation files go along with the weights; weight
  files (:data:`WEIGHT_SUFFIXES`: optimizer states too), the shard index, training state
  (:data:`TRAINING_STATE_FILES`) and ``SHA256SUMS`` (:mod:`ida_common.checksums`: it lists the bytes of
  its own directory) do not (:func:`is_side_file`).
* :class:`CheckpointTensors`: the name -> array view over all shards that both directions stream
  through, one tensor in memory at a time.

Outputs follow :mod:`ida_common.files`: never onto, into or around the input, an existing output
replaced only with ``overwrite``, a directory built in a hidden sibling that appears complete in one
rename, each file written to a temporary, fsynced and renamed.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np

from ida_common.checksums import SUMS_FILE, ChecksumError, verify_sums, write_sums
from ida_common.files import atomic_directory, atomic_write_text, check_output, copy_file_atomic
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import DTYPES, read_header
from mxfp8_codec.hf_config import write_config_json
from mxfp8_codec.layout import CheckpointLayout, is_projection_weight, model_type_of
from mxfp8_codec.reader import INDEX_FILE, MXFP8Reader, check_inside_checkpoint, checkpoint_files, open_mxfp8
from mxfp8_codec.writer import write_mxfp8_safetensors, write_safetensors

__all__ = [
    "CheckpointTensors",
    "TRAINING_STATE_FILES",
    "WEIGHT_SUFFIXES",
    "check_sums",
    "copy_side_files",
    "dequantize_checkpoint",
    "is_side_file",
    "printable",
    "quantize_checkpoint",
]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf", ".ckpt")  # not copied
# ida_trainer's (its optimizer state in the safetensors format, not named *.safetensors) and transformers'
# Trainer's: not model files
TRAINING_STATE_FILES = ("trainer_state.json", "optimizer.st")


def printable(text: str) -> str:
    """``text`` as it can be shown on one terminal line: a name with control or other non-printable
    characters (a newline, an escape sequence from a hostile header) is shown as a quoted Python
    literal with them escaped; ordinary names, non-ASCII letters included, are shown as they are.

    Example:
        >>> print(printable("model.embed_tokens.weight"))
        model.embed_tokens.weight
        >>> print(printable("evil\\x1b[2Jname"))
        'evil\\x1b[2Jname'
    """
    return text if text.isprintable() else repr(text)


class CheckpointTensors(Mapping[str, np.ndarray]):
    """Name -> array over all shards of a checkpoint, loaded (and re-laid-out) on access.

    ``self[name]`` decodes one tensor (MXFP8 -> float32, plain tensors as stored) and maps it with
    ``layout`` (:class:`mxfp8_codec.layout.CheckpointLayout`): ``to_transformers`` (dequantize:
    transpose ``in_out`` projections, unfold folded norms to ``gamma - 1`` in float32) or, with
    ``from_transformers=True``, the inverse (quantize). Nothing is cached (a decoded tensor's file pages
    leave the resident set once it is read), and :meth:`spec` answers shape/dtype from the headers, so the
    writers' planning pass loads nothing and peak memory is one tensor.
    """

    def __init__(
        self, readers: Sequence[MXFP8Reader], layout: CheckpointLayout, *, from_transformers: bool = False
    ) -> None:
        self._where: dict[str, MXFP8Reader] = {}
        for r in readers:
            for name in r.keys():
                self._where[name] = r
        self._layout = layout
        self._map = layout.from_transformers if from_transformers else layout.to_transformers

    def __getitem__(self, name: str) -> np.ndarray:
        r = self._where[name]
        value = r.get(name, dtype=None)
        r.release_pages(name)  # decoded from the map: its file pages leave this process's resident set
        return np.ascontiguousarray(self._map(name, value))

    def spec(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype ``self[name]`` will have, from the header alone."""
        r = self._where[name]
        shape, stored = r.shape(name), r.dtype(name)
        if self._layout.transposes(name, len(shape)):
            shape = (shape[1], shape[0])
        if r.is_quantized(name) or self._layout.unfolds(name, len(shape)):
            return shape, np.dtype(np.float32)
        return shape, DTYPES[stored]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def is_side_file(name: str) -> bool:
    """A config/tokenizer/generation file that goes along with a checkpoint's weights: every file but weights,
    the shard index, training state and ``SHA256SUMS`` (it describes its own directory's bytes)."""
    return not name.endswith(WEIGHT_SUFFIXES) and name not in (INDEX_FILE, SUMS_FILE, *TRAINING_STATE_FILES)


def check_sums(directory: str | os.PathLike[str], *, hashed: Mapping[str, str] | None = None) -> bool:
    """Where ``directory`` has a ``SHA256SUMS`` (ida's checkpoints, exports and conversions list every file in
    it: :mod:`ida_common.checksums`), check the files a reader of the model takes from it: weights, the shard
    index and side files (not training state). ``hashed``: sha256 the caller already computed. Returns False
    when there is no ``SHA256SUMS``.

    Raises:
        MXFP8Error: a listed file is missing or its bytes differ from its recorded sha256 (names it, and
            what to do: copy it again, or, after an edit on purpose, delete the list).
    """
    directory = Path(directory)
    try:
        return verify_sums(
            directory, only=lambda n: n.endswith(".safetensors") or n == INDEX_FILE or is_side_file(n), hashed=hashed
        )
    except ChecksumError as exc:
        raise MXFP8Error(
            f"{exc}: a damaged copy? copy the checkpoint again; changed on purpose? delete {directory / SUMS_FILE}"
        ) from None


def copy_side_files(src: Path, dst: Path) -> list[str]:
    """Copy the side files (:func:`is_side_file`), each atomically (temp + fsync + rename): a kill mid-copy
    never leaves a truncated file under its final name; returns the names copied. A file that links outside
    ``src`` is refused (it would be copied without anyone noticing where it came from)."""
    copied = []
    for f in sorted(src.iterdir()):
        if f.is_file() and is_side_file(f.name):
            check_inside_checkpoint(src, f)
            copy_file_atomic(f, dst / f.name)
            copied.append(f.name)
    return copied


def quantize_checkpoint(
    src_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    scale_rule: str = "rceil",
    orientation: str = "in_out",
    overwrite: bool = False,
) -> Path:
    """Convert a transformers checkpoint directory to an MXFP8 checkpoint directory.

    ``out_dir`` must not be, contain or lie inside ``src_dir``; an existing non-empty ``out_dir`` is
    replaced only with ``overwrite`` (atomically: the old one stays until the new one is complete).

    Returns:
        The written ``model.safetensors``.
    """
    src, out = Path(src_dir), Path(out_dir)
    check_output(out, inputs=[src], overwrite=overwrite, kind="dir", what="OUT_DIR")
    check_sums(src)
    files = checkpoint_files(src)
    readers = [open_mxfp8(f) for f in files]
    try:
        for r in readers:
            if r.header.quantized:
                raise MXFP8Error(
                    f"{r.path}: already holds MXFP8 tensors (e.g. {r.header.quantized[0]!r}); nothing to quantize"
                )
        tensors = CheckpointTensors(readers, CheckpointLayout(orientation, source=str(src)), from_transformers=True)
        # The whole directory appears at once, complete (ida_common.files.atomic_directory): a kill
        # leaves OUT_DIR as it was plus a hidden temporary that the next run sweeps.
        with atomic_directory(out, overwrite=overwrite) as tmp:
            write_mxfp8_safetensors(
                tmp / "model.safetensors",
                tensors,
                quantize=lambda n: is_projection_weight(n) and len(tensors.spec(n)[0]) == 2,
                scale_rule=scale_rule,
                orientation=orientation,
                metadata={"source": src.resolve().name, "producer": "mxfp8_codec quantize"},
                progress=True,
            )
            copy_side_files(src, tmp)
            if (tmp / "config.json").is_file():  # record the method, orientation and norm convention
                write_config_json(tmp, tmp / "model.safetensors")
            write_sums(tmp, sync=True)
    finally:
        for r in readers:
            r.close()
    return out / "model.safetensors"


class _WarnNonFinite(CheckpointTensors):
    """:class:`CheckpointTensors` that warns, naming the tensor, when a value it hands out is NaN/Inf.

    Dequantizing is faithful: a NaN scale byte or payload code decodes to NaN, and the BF16 output
    says so. But a BF16 checkpoint full of NaN loads without complaint in transformers, so each such
    tensor gets one warning line (``verify --values`` on the source finds the first index).
    """

    def __getitem__(self, name: str) -> np.ndarray:
        arr = super().__getitem__(name)
        if arr.dtype.kind == "f" and arr.size:
            bad = int(np.count_nonzero(~np.isfinite(arr)))
            if bad:
                warnings.warn(
                    f"tensor {printable(name)}: {bad} of {arr.size} values are NaN/Inf in the output "
                    f"(NaN scale bytes or payload codes in the source; verify --values shows the first)",
                    stacklevel=2,
                )
        return arr


def dequantize_checkpoint(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    model_type: str | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """MXFP8 file or directory -> plain BF16 safetensors in transformers' layout.

    A directory becomes a directory (``model.safetensors`` + copied config/tokenizer files), which
    appears at once, complete (:func:`ida_common.files.atomic_directory`); a file becomes a file
    (written atomically). The output must not be the input or overlap it; an existing output is
    replaced only with ``overwrite``. Each file's tensors are mapped by
    :class:`~mxfp8_codec.layout.CheckpointLayout` from its metadata: ``in_out`` projections
    transposed, and for ``norm_convention=folded`` the norm weights of architectures whose norms add
    1 unfolded (``model_type`` from the argument, else the config.json of the directory / beside the
    file). A tensor with NaN/Inf values gets a warning naming it. Returns the written safetensors
    files (under their final names).

    Raises:
        MXFP8Error: bad files, or a folded file whose model type is unknown.
    """
    src_p, out_p = Path(src), Path(out)
    check_output(out_p, inputs=[src_p], overwrite=overwrite, kind="dir" if src_p.is_dir() else "file", what="OUT")
    if model_type is None:
        model_type = model_type_of(src_p)
    if not src_p.is_dir():
        _dequantize_file(src_p, out_p, model_type)
        return [out_p]
    check_sums(src_p)
    files = checkpoint_files(src_p)
    names = ["model.safetensors" if len(files) == 1 else f.name for f in files]
    with atomic_directory(out_p, overwrite=overwrite) as tmp:
        for f, name in zip(files, names, strict=True):
            _dequantize_file(f, tmp / name, model_type)
        copy_side_files(src_p, tmp)
        if (tmp / "config.json").is_file():  # a plain copy: no quantization_config
            write_config_json(tmp, None)
        if len(files) > 1:
            index = json.loads((src_p / INDEX_FILE).read_text())
            weight_map = {}
            for name in names:
                with open_mxfp8(tmp / name) as r:
                    weight_map.update({n: name for n in r.keys()})
            index["weight_map"] = weight_map
            index.setdefault("metadata", {})["total_size"] = sum(read_header(tmp / n).data_size for n in names)
            atomic_write_text(tmp / INDEX_FILE, json.dumps(index, indent=2))
        write_sums(tmp, sync=True)
    return [out_p / name for name in names]


def _dequantize_file(f: Path, target: Path, model_type: str | None) -> None:
    with open_mxfp8(f) as r:
        layout = CheckpointLayout.from_metadata(r.metadata, model_type=model_type, source=str(f))
        tensors = _WarnNonFinite([r], layout)
        meta = {"format": "pt", "producer": "mxfp8_codec dequantize", "source": f.name}
        write_safetensors(target, tensors, metadata=meta, float_dtype=ml_dtypes.bfloat16, progress=True)
