"""Load an MXFP8 (or plain transformers) checkpoint directory into a transformers causal LM.

One path: ``from_pretrained``. An MXFP8 checkpoint goes through our quantizer
(:mod:`mxfp8_codec.hf`, registered with transformers): ``weights="bf16"`` passes
``MXFP8Config(dequantize=True)`` (every projection decoded once into a plain, trainable ``nn.Linear``
of ``dtype``: the codec's decode straight from the memory map into the new parameter, transposed for
the trainer's native ``[in, out]`` files, split over the CPUs), ``weights="mxfp8"`` keeps the
projections MXFP8 in memory (:class:`mxfp8_codec.hf.MXFP8Linear`, decoded at each forward: the same
weights bit for bit, about half the memory). The quantizer validates every header against config.json
and the architecture before any weight is read (missing and unexpected tensors listed in one error, a
stored copy of a tied weight compared with its source, NaN scale bytes refused), unfolds folded norm
gains where the architecture adds 1 at run time, and places tensors per ``device_map``. A plain
checkpoint is transformers' own ``from_pretrained``, with its missing / unexpected / mismatched keys
turned into one error instead of a warning.

What this module adds on top: the cheap checks before anything is loaded
(:func:`check_checkpoint_dir`: config.json and tokenizer files), the tokenizer, one error type
(:class:`CheckpointLoadError`, with the codec's message naming file and tensor), and the provenance of
a checkpoint for results files (:func:`describe_checkpoint`). torch and transformers are imported by the loads
alone: the checks and the description run without them.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ida_common.checksums import file_sha256
from mxfp8_codec import WEIGHTS_DTYPE, MXFP8Error, checkpoint_files, open_mxfp8
from mxfp8_codec.checkpoint import check_sums
from mxfp8_codec.layout import file_norm_convention, file_orientation

if TYPE_CHECKING:
    import torch

# load_model(weights=...): decoded once / MXFP8-resident / MXFP8-resident with the fused kernel for few-token forwards
WEIGHTS_CHOICES: tuple[str, ...] = ("bf16", "mxfp8", "mxfp8-fused")
# weights="mxfp8-fused": forwards of up to this many tokens (a decoding step of that many sequences) on CUDA run
# the fused kernel (mxfp8_codec.hf_modules.use_fused_linear); prefill and larger steps decode + cuBLAS. Untuned.
FUSED_MAX_TOKENS = 128


class CheckpointLoadError(ValueError):
    """A checkpoint directory cannot be loaded; the message names the directory/file/tensor and why."""


# Files any transformers tokenizer is built from (fast JSON, sentencepiece, BPE/WordPiece vocabularies);
# tokenizer_config.json alone builds nothing. ``*.tiktoken`` files count too.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def check_checkpoint_dir(checkpoint_dir: str | Path, what: str = "checkpoint") -> Path:
    """The cheap checks before a load: a directory with ``config.json`` and tokenizer files.

    Run before anything is loaded or created, so a directory with weights but no tokenizer fails in one
    line instead of deep inside transformers (which asks to install sentencepiece or tiktoken).

    Raises:
        CheckpointLoadError: ``WHAT DIR: no such directory``, ``DIR: no config.json ...`` or
            ``no tokenizer files in DIR ...``.
    """
    ckpt = Path(checkpoint_dir)
    if not ckpt.is_dir():
        raise CheckpointLoadError(f"{what} {ckpt}: no such directory")
    if not (ckpt / "config.json").is_file():
        raise CheckpointLoadError(f"{ckpt}: no config.json (not a checkpoint directory)")
    if not any((ckpt / f).is_file() for f in TOKENIZER_FILES) and not any(ckpt.glob("*.tiktoken")):
        raise CheckpointLoadError(
            f"no tokenizer files in {ckpt} (looked for {', '.join(TOKENIZER_FILES)}, *.tiktoken): copy the "
            "base model's tokenizer files into it"
        )
    return ckpt


@dataclass(frozen=True)
class WeightFile:
    """How one safetensors file of a checkpoint is stored.

    Attributes:
        path: the file.
        mxfp8: True when the file carries ``weights_dtype = MXFP8_E4M3_UE8M0_K32``.
        orientation: ``"in_out"`` (trainer native, transposed at load) or ``"out_in"`` (HF).
        norm_convention: ``"zero_centered"`` or ``"folded"``.
        metadata: the file's ``__metadata__``.
        n_tensors: logical tensors in the file (payload + scale count once).
    """

    path: Path
    mxfp8: bool
    orientation: str
    norm_convention: str
    metadata: dict[str, str]
    n_tensors: int = 0


def inspect_weight_file(path: str | Path) -> WeightFile:
    """Read a weight file's header and classify it (MXFP8 vs plain, orientation, norm convention).

    The defaults and allowed values are the codec's (:mod:`mxfp8_codec.layout`).

    Raises:
        CheckpointLoadError: unknown orientation / norm convention values.
        MXFP8Error: an invalid header (including an unknown ``weights_dtype``), naming the file.
    """
    path = Path(path)
    with open_mxfp8(path) as reader:
        meta = dict(reader.metadata)
        n_tensors = len(reader.keys())
    try:
        orientation = file_orientation(meta, source=str(path))
        norm_convention = file_norm_convention(meta, source=str(path))
    except MXFP8Error as e:
        raise CheckpointLoadError(str(e)) from None
    return WeightFile(
        path=path,
        mxfp8=meta.get("weights_dtype") == WEIGHTS_DTYPE,
        orientation=orientation,
        norm_convention=norm_convention,
        metadata=meta,
        n_tensors=n_tensors,
    )


def _weight_files(checkpoint_dir: Path) -> list[WeightFile]:
    try:
        files = checkpoint_files(checkpoint_dir)
    except MXFP8Error as e:
        raise CheckpointLoadError(f"{checkpoint_dir}: no loadable safetensors weights: {e}") from e
    return [inspect_weight_file(f) for f in files]


def torch_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    """The parameter dtype of :func:`load_model`'s ``dtype``: a floating-point ``torch.dtype``, its name
    (``"bfloat16"``, ``"float32"``: what a command line gives) or None (``torch.bfloat16``).

    Raises:
        ValueError: a name that is not one of torch's floating-point dtypes.
    """
    import torch

    if dtype is None:
        return torch.bfloat16
    found = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ValueError(f"dtype {dtype!r}: not a floating-point torch dtype")
    return found


@contextmanager
def _progress_bars(show: bool) -> Any:
    """transformers' loading progress bars on (``show``) or off for one call, restored after."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def load_model(
    checkpoint_dir: str | Path,
    *,
    dtype: torch.dtype | str | None = None,
    device_map: Any = None,
    progress: bool = False,
    weights: str = "bf16",
    check_sums: bool = True,
) -> tuple[Any, Any]:
    """Load a checkpoint directory (our MXFP8 format or plain transformers safetensors).

    Args:
        checkpoint_dir: directory with ``config.json``, tokenizer files and ``model.safetensors``
            (or shards + ``model.safetensors.index.json``).
        dtype: parameter dtype (floating tensors are decoded/cast to it; rotary buffers stay float32): a
            floating-point ``torch.dtype`` or its name (``"float32"``); default ``torch.bfloat16``.
        device_map: None (CPU), a device (``"cuda"``, ``"cuda:1"``), ``"auto"`` (accelerate splits
            whole decoder layers over the visible GPUs) or an explicit accelerate device map, as
            ``from_pretrained`` takes it.
        progress: show transformers' loading progress bar.
        weights: ``"bf16"`` (default): every weight decoded once into ``dtype`` (trainable
            ``nn.Linear``; ``from_pretrained`` with ``MXFP8Config(dequantize=True)``). ``"mxfp8"``: the
            projections of an MXFP8 checkpoint stay MXFP8 in memory (:class:`mxfp8_codec.hf.MXFP8Linear`,
            decoded at each forward: the same weights bit for bit, about half the memory); a plain
            checkpoint has no MXFP8 weights and loads as with ``"bf16"`` (with a warning).
            ``"mxfp8-fused"``: as ``"mxfp8"``, and on a GPU forwards of up to :data:`FUSED_MAX_TOKENS` tokens
            decode the weight inside one Triton GEMM kernel (:func:`mxfp8_codec.hf_modules.use_fused_linear`:
            faster decoding steps, logits not bit-identical to ``"bf16"``'s; the CPU forward is unchanged).
        check_sums: where the directory has a ``SHA256SUMS`` (ida's checkpoints, exports and conversions),
            check the weights and side files against it first (:func:`mxfp8_codec.checkpoint.check_sums`;
            it reads every byte once). False where the caller has just checked (:func:`describe_checkpoint`
            does).

    Returns:
        ``(model, tokenizer)``, the model in eval mode (parameters require grad, as with
        ``from_pretrained``).

    Raises:
        CheckpointLoadError: no weights, bad metadata, wrong shapes, or missing/unexpected keys
            (all listed in one message); a file differs from its recorded sha256, or is missing.

    Example:
        >>> model, tok = load_model("runs/sft/checkpoint-1000")  # doctest: +SKIP
        >>> model.model.layers[0].self_attn.q_proj.weight.dtype  # doctest: +SKIP
        torch.bfloat16
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import mxfp8_codec.hf as mxhf
    from mxfp8_codec.hf_load import listed_names

    if weights not in WEIGHTS_CHOICES:
        raise CheckpointLoadError(f"weights={weights!r}, expected one of {WEIGHTS_CHOICES}")
    ckpt = check_checkpoint_dir(checkpoint_dir)
    files = _weight_files(ckpt)
    if check_sums:  # here, not by the quantizer: plain checkpoints have lists too
        _check_listed(ckpt)
    mxfp8 = any(f.mxfp8 for f in files)
    if weights != "bf16" and not mxfp8:
        warnings.warn(f"{ckpt}: a plain checkpoint has no MXFP8 weights; loading it with weights='bf16'", stacklevel=2)
    if not mxfp8:
        odd = next((f for f in files if (f.orientation, f.norm_convention) != ("out_in", "zero_centered")), None)
        if odd is not None:  # transformers would read these plain tensors as if they were its own layout
            raise CheckpointLoadError(
                f"{odd.path}: a plain (not MXFP8) file whose metadata says orientation={odd.orientation!r}, "
                f"norm_convention={odd.norm_convention!r}; transformers reads plain files only as out_in / "
                "zero_centered: write it with python -m mxfp8_codec quantize or dequantize"
            )
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype), "output_loading_info": True}
    if mxfp8:  # config.json's own quantization_config (if any) is checked against the files by the quantizer
        # "mxfp8*": resident; the list is checked above
        kwargs["quantization_config"] = mxhf.MXFP8Config(dequantize=weights == "bf16", check_sums=False)
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        with warnings.catch_warnings(), _progress_bars(progress):
            warnings.simplefilter("ignore")
            model, info = AutoModelForCausalLM.from_pretrained(ckpt, **kwargs)
    except MXFP8Error as e:
        raise CheckpointLoadError(str(e)) from None
    problems = [
        f"{what} {len(keys)}: {listed_names(sorted(str(k) for k in keys))}"
        for what, keys in (
            ("missing", info.get("missing_keys") or ()),
            ("unexpected", info.get("unexpected_keys") or ()),
            ("mismatched", info.get("mismatched_keys") or ()),
        )
        if keys
    ]
    if problems:
        raise CheckpointLoadError(f"{ckpt}: checkpoint does not match {type(model).__name__} ({'; '.join(problems)})")
    model.eval()  # parameters keep requires_grad=True, as from_pretrained leaves them (the trainer loads here too)
    if weights == "mxfp8-fused":
        from mxfp8_codec.hf_modules import use_fused_linear

        use_fused_linear(model, FUSED_MAX_TOKENS)
    return model, tokenizer


def empty_model(checkpoint_dir: str | Path, *, dtype: torch.dtype | str | None = None) -> tuple[Any, Any]:
    """:func:`load_model`'s model built on the meta device, and its tokenizer: the same modules, parameter and
    buffer names, shapes and dtypes (``weights="bf16"``), tied weights tied, and the checkpoint's generation
    config, without reading a weight. The ranks of an FSDP2 or pipelined run but rank 0 build this and get their
    shards or their stage's tensors from rank 0's loaded model (:func:`ida_trainer.sharded.fill_from_rank_0`,
    which compares the structures first): one host copy of the base per machine instead of one per rank (16 GB
    each for Qwen3-4B in FP32).

    Raises:
        CheckpointLoadError: the directory has no config or tokenizer files (:func:`check_checkpoint_dir`).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    ckpt = check_checkpoint_dir(checkpoint_dir)
    config = AutoConfig.from_pretrained(ckpt)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    if (ckpt / "generation_config.json").is_file():  # as from_pretrained reads it (its EOS ids stop generation)
        model.generation_config = GenerationConfig.from_pretrained(ckpt)
    model.eval()
    return model, AutoTokenizer.from_pretrained(ckpt)


def _check_listed(ckpt: Path, *, hashed: Mapping[str, str] | None = None) -> bool:
    """:func:`mxfp8_codec.checkpoint.check_sums`, its error as :class:`CheckpointLoadError`."""
    try:
        return check_sums(ckpt, hashed=hashed)
    except MXFP8Error as exc:
        raise CheckpointLoadError(str(exc)) from None


def describe_checkpoint(checkpoint_dir: str | Path) -> dict[str, Any]:
    """Provenance of a checkpoint for results files: weight files with sha256, format, precision metadata.

    A directory with a ``SHA256SUMS`` (:mod:`ida_common.checksums`: ida_trainer's checkpoints and exports)
    is checked against it first: the weight files and the side files the model is built from, so a score
    is the score of the bytes that were written.

    Returns:
        ``{"path", "format": "mxfp8"|"plain", "architectures", "files": [{"name", "bytes", "sha256"}],
        "sha256sums": checked against a SHA256SUMS (bool), "precision": {...metadata of the first file...}}``.

    Raises:
        CheckpointLoadError: a file differs from its recorded sha256 (a damaged copy), or is missing.
    """
    ckpt = Path(checkpoint_dir)
    files = _weight_files(ckpt)
    hashed = {f.path.name: file_sha256(f.path) for f in files}
    listed = _check_listed(ckpt, hashed=hashed)
    config = json.loads((ckpt / "config.json").read_text()) if (ckpt / "config.json").is_file() else {}
    return {
        "path": str(ckpt.resolve()),
        "format": "mxfp8" if any(f.mxfp8 for f in files) else "plain",
        "architectures": config.get("architectures"),
        "files": [{"name": f.path.name, "bytes": f.path.stat().st_size, "sha256": hashed[f.path.name]} for f in files],
        "sha256sums": listed,  # True: the files matched the SHA256SUMS written with them; False: none there
        "precision": {
            **files[0].metadata,
            "orientation": files[0].orientation,
            "norm_convention": files[0].norm_convention,
        },
    }
