"""Load an MXFP8 (or plain BF16) checkpoint directory into a transformers causal LM.

Why not ``from_pretrained``: our projection weights are MXFP8 (E4M3 payload + UE8M0 scale per 32
values) stored in the trainer's native ``[in_features, out_features]`` orientation, which
transformers cannot read. The users' first recipe — decode the whole file to a dict of float32,
transpose with ``.T.copy()``, ``load_state_dict`` — peaked at ~4.6x the model's BF16 bytes. Here:

1. The model is built on the meta device (``accelerate.init_empty_weights(include_buffers=False)``,
   parameters in the target dtype): no parameter memory, while non-persistent buffers such as the
   rotary ``inv_freq`` are created for real in float32 — exactly as ``from_pretrained`` keeps them.
   (Building inside ``torch.device("meta")`` would leave ``inv_freq`` on meta, and ``model.to(bf16)``
   would round it to bf16 and move logits by ~4e-3.)
2. Tensors are streamed one at a time: MXFP8 decoded by the codec straight from the memory map
   into a new tensor in the target dtype (bf16 is rounded once from the exact value
   e4m3 x 2^(s-127)); 2-D projection weights, when the file's ``orientation`` is ``in_out``, are
   decoded with ``transpose=True`` so the codec writes nn.Linear's ``[out, in]`` layout directly
   (one tiled pass: no intermediate array, no separate transpose). Large tensors are split over
   the usable CPUs (disjoint slices of one output: same bits). Norm weights are unfolded
   (``w = gamma - 1``, in float32, rounded once) when ``norm_convention`` is ``folded`` and the
   architecture's norms add 1 at run time (NemotronLayerNorm1P, GemmaRMSNorm), decided by
   :class:`mxfp8_codec.CheckpointLayout` from ``config.model_type`` exactly as the codec's CLI
   decides it (Llama/Qwen3 RMSNorm weights are the gain itself and stay as stored), then everything
   is placed with ``load_state_dict(..., assign=True)``
   (the tensor becomes the parameter: no copy). Each tensor's file pages are unmapped once it is
   decoded (``MXFP8Reader.release_pages``; they stay in the page cache) so that mapped file pages
   do not pile up in the resident set: peak host memory is about one model plus the file pages of
   two tensors.
3. Strict key check: missing and unexpected names are listed in one error (a LayerNorm1P weight
   left at its init value of ones would silently double every activation scale). Tied weights
   (``tie_word_embeddings``) are tied after loading and verified to share storage; a stored copy
   (``lm_head.weight`` in a tied checkpoint) is not decoded but must equal its source.
4. With ``device_map`` each tensor is placed directly on its device (MXFP8 tensors bound for a GPU
   travel as payload + scales and are decoded and transposed there) and accelerate's
   ``dispatch_model`` adds the hooks (``"auto"`` splits whole decoder layers over GPUs).

Plain transformers safetensors checkpoints (no MXFP8 metadata, HF orientation) load through the
same call, so baselines are measured with the same code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from tqdm.auto import tqdm

import mxfp8_codec.hf  # noqa: F401 - registers the "mxfp8_codec" quantization method with transformers
from mxfp8_codec import WEIGHTS_DTYPE, CheckpointLayout, MXFP8Error, checkpoint_files, decode_mxfp8, open_mxfp8
from mxfp8_codec.layout import file_norm_convention, file_orientation
from mxfp8_codec.numerics import SPLIT_MIN_VALUES, decode_mxfp8_split

PREFETCH_MAX_BYTES = 32 << 20  # 32 MiB: larger tensors are not decoded ahead (bounds peak memory)
_STORED_TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}  # copied as bits
MAX_DECODE_THREADS = 4  # threads sharing one tensor's decode (at most the CPUs this process may use)
HASH_CHUNK = 8 << 20  # 8 MiB read size for sha256
MAX_LISTED_KEYS = 20  # key names shown in a missing/unexpected error


WEIGHTS_CHOICES: tuple[str, ...] = ("bf16", "mxfp8")  # load_model(weights=...): decoded once / MXFP8-resident


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


def _layout(wf: WeightFile, model_type: str | None) -> CheckpointLayout:
    """The file's layout for a model of ``model_type`` (a folded file of an unknown type is refused)."""
    try:
        return CheckpointLayout(wf.orientation, wf.norm_convention, model_type, source=str(wf.path))
    except MXFP8Error as e:
        raise CheckpointLoadError(str(e)) from None


def _weight_files(checkpoint_dir: Path) -> list[WeightFile]:
    try:
        files = checkpoint_files(checkpoint_dir)
    except MXFP8Error as e:
        raise CheckpointLoadError(f"{checkpoint_dir}: no loadable safetensors weights: {e}") from e
    return [inspect_weight_file(f) for f in files]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _host_out_view(t: torch.Tensor) -> np.ndarray:
    """numpy view of a CPU float32 / bfloat16 tensor's storage (for the codec's ``out=``)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _decode_threads() -> int:
    """Threads that share one tensor's decode: the usable CPUs, at most :data:`MAX_DECODE_THREADS`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_DECODE_THREADS, cpus))


def _split_copy(src: np.ndarray, dst: np.ndarray, helpers: Any, parts: int) -> None:
    """``dst[...] = src`` in ``parts`` row ranges, all but one on ``helpers`` (numpy copies of
    plain integer arrays release the GIL)."""
    rows = src.shape[0]
    step = -(-rows // parts)
    futures = [helpers.submit(np.copyto, dst[a : a + step], src[a : a + step]) for a in range(step, rows, step)]
    try:
        np.copyto(dst[:step], src[:step])
    finally:
        for f in futures:
            f.result()


def _stream(
    wf: WeightFile,
    dtype: torch.dtype,
    device_for: Callable[[str], torch.device],
    transpose_for: Callable[[str], bool] = lambda name: False,
    skip: Callable[[str], bool] = lambda name: False,
    layout: CheckpointLayout | None = None,
) -> Iterator[tuple[str, torch.Tensor | None, bool]]:
    """Yield ``(name, tensor, transposed)`` decoded to ``dtype`` (floats), one tensor at a time;
    ``(name, None, False)`` for names where ``skip`` says so (nothing is decoded for those).
    Norm weights that ``layout`` unfolds are read in float32, unfolded (``gamma - 1``) and
    rounded once to ``dtype``, as every reader of the codec does.

    MXFP8 tensors bound for the host are decoded by the codec straight from the memory map into
    a new tensor that becomes the parameter (``out=``); for 2-D tensors where ``transpose_for``
    says so (native ``[in, out]`` projections) the codec writes the transposed ``[out, in]``
    layout directly (``transpose=True``: one tiled pass, no intermediate array, no separate
    transpose) and ``transposed`` is True. An MXFP8 tensor bound for a CUDA device is copied
    there as payload + scales (1.03 bytes per value) and decoded (and transposed) on the GPU by
    the codec's torch path. Other tensors come from the reader, untransposed.

    Tensors of ``mxfp8_codec.numerics.SPLIT_MIN_VALUES`` or more are decoded (or, when stored in the target
    dtype, copied) in parts on up to
    :data:`MAX_DECODE_THREADS` threads (the usable CPUs): disjoint slices of one output, so the
    bits are those of one call. The next tensor is decoded on a worker thread while the caller
    places the current one (the codec's decoder releases the GIL), unless it is larger than
    :data:`PREFETCH_MAX_BYTES` (then it is decoded afterwards, so at most one large tensor's
    file pages are mapped at a time). The next tensor's file pages are requested while the
    current one decodes (``prefetch_pages``: a cold file is read in large requests) and each
    tensor's pages are unmapped after its decode (``release_pages``), so touched file pages leave
    the resident set.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    item = torch.empty((), dtype=dtype).element_size()
    reader = open_mxfp8(wf.path)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ida-decode")
    parts = _decode_threads()
    helpers = ThreadPoolExecutor(max_workers=max(1, parts - 1), thread_name_prefix="ida-decode-part")

    def decode(r: Any, name: str) -> tuple[torch.Tensor | None, bool]:
        if skip(name):
            return None, False
        try:
            return decode_mapped(r, name)
        finally:
            r.release_pages(name)

    def decode_mapped(r: Any, name: str) -> tuple[torch.Tensor, bool]:
        device = device_for(name)
        shape = tuple(r.shape(name))
        if layout is not None and layout.unfolds(name, len(shape)):
            return layout.to_transformers(name, r.get(name, framework="pt", dtype=torch.float32)).to(dtype), False
        if not r.is_quantized(name):
            stored = _STORED_TORCH_DTYPES.get(r.dtype(name))
            if stored == dtype and parts > 1 and _numel(shape) >= SPLIT_MIN_VALUES and len(shape) >= 1:
                # large tensor already in the target dtype (embeddings, lm_head): copy it from
                # the map in parts on several threads (first touch of new pages is the cost)
                out = torch.empty(shape, dtype=dtype)
                bits = np.uint16 if out.element_size() == 2 else np.uint32
                src = np.frombuffer(r.tensor_bytes(name), dtype=bits).reshape(shape)
                dst = out.view(torch.int16 if bits is np.uint16 else torch.int32).numpy().view(bits)
                _split_copy(src, dst, helpers, parts)
                return out, False
            is_float = r.dtype(name) in ("BF16", "F16", "F32", "F64")
            return r.get(name, framework="pt", dtype=dtype if is_float else None), False
        flip = len(shape) == 2 and transpose_for(name)
        if device.type == "cuda":
            raw = r.get_raw(name)
            payload = torch.from_numpy(raw.payload).to(device)
            scales = torch.from_numpy(raw.scales).to(device)
            return decode_mxfp8(payload, scales, dtype=dtype, name=name, transpose=flip), flip
        if dtype not in (torch.bfloat16, torch.float32):  # e.g. float16: the reader rounds once from float32
            return r.get(name, framework="pt", dtype=dtype), False
        payload, scales = r.raw_view(name)
        out = torch.empty((shape[1], shape[0]) if flip else shape, dtype=dtype)
        out_np = _host_out_view(out)
        decode_mxfp8_split(payload, scales, out_np, pool=helpers, parts=parts, transpose=flip, name=name)
        return out, flip

    try:
        names = reader.keys()
        decoded = {n: _numel(reader.shape(n)) * item for n in names}

        def submit(i: int) -> Future[tuple[torch.Tensor | None, bool]]:
            if i + 1 < len(names):  # a cold file: its next tensor is read while this one decodes
                reader.prefetch_pages(names[i + 1])
            return pool.submit(decode, reader, names[i])

        pending: Future[tuple[torch.Tensor | None, bool]] | None = None
        if names:
            reader.prefetch_pages(names[0])
            pending = submit(0)
        for i, name in enumerate(names):
            assert pending is not None
            tensor, transposed = pending.result()
            pending = None
            nxt = names[i + 1] if i + 1 < len(names) else None
            if nxt is not None and decoded[nxt] <= PREFETCH_MAX_BYTES:
                pending = submit(i + 1)
            yield name, tensor, transposed
            del tensor
            if nxt is not None and pending is None:
                pending = submit(i + 1)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        helpers.shutdown(wait=True)
        reader.close()


_LAYER_RE = re.compile(r"^(.*?\blayers\.\d+)\.")


def _chunk_key(name: str) -> str:
    """Tensors of one decoder layer are placed together (one ``load_state_dict`` per layer)."""
    m = _LAYER_RE.match(name)
    return m.group(1) if m else ""


def _tied_keys(model: Any) -> dict[str, str]:
    """Parameter names that are tied to another parameter (target -> source) when the config ties."""
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(text_config, "tie_word_embeddings", False):
        return {}
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if isinstance(tied, Mapping):
        return {str(k): str(v) for k, v in tied.items()}
    # older list form: every entry is tied to the input embeddings
    emb = next(n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    return {str(k): emb for k in tied}


def _check_tied_copies(files: list[WeightFile], tied: Mapping[str, str]) -> None:
    """A stored copy of a tied tensor (``lm_head.weight`` next to the embedding) must equal its
    source: the model keeps only the source, so a different copy would be dropped silently.

    Raises:
        CheckpointLoadError: naming both tensors and their files.
    """
    where: dict[str, Path] = {}
    for wf in files:
        with open_mxfp8(wf.path) as r:
            for name in r.keys():
                where.setdefault(name, wf.path)
    for dst, src in tied.items():
        if dst not in where or src not in where:
            continue  # no copy stored / a missing source is reported by the key check
        with open_mxfp8(where[dst]) as a, open_mxfp8(where[src]) as b:
            if _same_stored_values(a, dst, b, src):
                continue
        raise CheckpointLoadError(
            f"{where[dst]}: tensor {dst!r} differs from {src!r} ({where[src].name}), but config.json ties "
            f"them (tie_word_embeddings): the model would silently use {src!r}; fix the config or drop the copy"
        )


def _same_stored_values(a: Any, a_name: str, b: Any, b_name: str) -> bool:
    """Equal shapes and values; stored the same way -> compared as bytes, else decoded to float32."""
    if a.shape(a_name) != b.shape(b_name):
        return False
    if a.dtype(a_name) != b.dtype(b_name) or a.is_quantized(a_name) != b.is_quantized(b_name):
        # rare (stored differently): decode both whole
        return bool(np.array_equal(a.get(a_name), b.get(b_name)))
    raw_a, raw_b = a.raw_view(a_name), b.raw_view(b_name)
    parts = zip(raw_a, raw_b, strict=True) if a.is_quantized(a_name) else [(raw_a, raw_b)]
    return all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in parts)


def _resolve_device_map(model: Any, device_map: Any, dtype: torch.dtype) -> dict[str, Any] | None:
    if device_map is None:
        return None
    if isinstance(device_map, (torch.device, int)) or (
        isinstance(device_map, str) and device_map not in ("auto", "balanced", "balanced_low_0", "sequential")
    ):
        return {
            "": str(torch.device(device_map) if not isinstance(device_map, int) else torch.device("cuda", device_map))
        }
    if isinstance(device_map, str):
        from accelerate import infer_auto_device_map
        from accelerate.utils import get_balanced_memory

        no_split = list(getattr(model, "_no_split_modules", None) or [])
        max_memory = None
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model, dtype=dtype, no_split_module_classes=no_split, low_zero=device_map == "balanced_low_0"
            )
        dm = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dtype)
    elif isinstance(device_map, Mapping):
        dm = dict(device_map)
    else:
        raise CheckpointLoadError(f"device_map must be None, a device, 'auto' or a dict, got {device_map!r}")
    if "disk" in dm.values():
        raise CheckpointLoadError(f"device_map {dm} offloads to disk; that is not supported (not enough memory?)")
    return dm


def _device_for(name: str, dm: dict[str, Any] | None) -> torch.device:
    if dm is None:
        return torch.device("cpu")
    best, best_len = dm.get(""), -1
    for prefix, dev in dm.items():
        if prefix and (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
            best, best_len = dev, len(prefix)
    if best is None:
        raise CheckpointLoadError(f"device_map has no entry for tensor {name!r}")
    return torch.device(f"cuda:{best}" if isinstance(best, int) else best)


def _no_init() -> Any:
    """transformers' ``no_init_weights`` (random init of meta parameters is wasted work), if available."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        import contextlib

        return contextlib.nullcontext()
    return no_init_weights()


def _list(keys: list[str]) -> str:
    shown = ", ".join(keys[:MAX_LISTED_KEYS])
    return shown + (f", ... ({len(keys) - MAX_LISTED_KEYS} more)" if len(keys) > MAX_LISTED_KEYS else "")


def load_model(
    checkpoint_dir: str | Path,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device_map: Any = None,
    progress: bool = False,
    weights: str = "bf16",
) -> tuple[Any, Any]:
    """Load a checkpoint directory (our MXFP8 format or plain transformers safetensors).

    Args:
        checkpoint_dir: directory with ``config.json``, tokenizer files and ``model.safetensors``
            (or shards + ``model.safetensors.index.json``).
        dtype: parameter dtype (floating tensors are decoded/cast to it; rotary buffers stay float32).
        device_map: None (CPU), a device (``"cuda"``, ``"cuda:1"``), ``"auto"`` (accelerate splits
            whole decoder layers over the visible GPUs) or an explicit accelerate device map.
        weights: ``"bf16"`` (default): every weight decoded once into ``dtype`` by this module's
            streaming loader (trainable ``nn.Linear``). ``"mxfp8"``: an MXFP8 checkpoint goes through
            transformers' ``from_pretrained`` with :class:`mxfp8_codec.hf.MXFP8Config` and its
            projections stay MXFP8 in memory (:class:`mxfp8_codec.hf.MXFP8Linear`, decoded at each
            forward: the same weights bit for bit, about half the memory); a plain checkpoint has
            no MXFP8 weights and loads as with ``"bf16"`` (with a warning).

    Returns:
        ``(model, tokenizer)``, the model in eval mode (parameters require grad, as with
        ``from_pretrained``).

    Raises:
        CheckpointLoadError: no weights, bad metadata, wrong shapes, or missing/unexpected keys
            (all listed in one message).

    Example:
        >>> model, tok = load_model("runs/sft/checkpoint-1000")  # doctest: +SKIP
        >>> model.model.layers[0].self_attn.q_proj.weight.dtype  # doctest: +SKIP
        torch.bfloat16
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if weights not in WEIGHTS_CHOICES:
        raise CheckpointLoadError(f"weights={weights!r}, expected one of {WEIGHTS_CHOICES}")
    ckpt = check_checkpoint_dir(checkpoint_dir)
    files = _weight_files(ckpt)
    if weights == "mxfp8":
        if any(f.mxfp8 for f in files):
            return _load_mxfp8_resident(ckpt, dtype=dtype, device_map=device_map)
        warnings.warn(f"{ckpt}: a plain checkpoint has no MXFP8 weights; loading it with weights='bf16'", stacklevel=2)
    config = AutoConfig.from_pretrained(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    with init_empty_weights(include_buffers=False), _no_init(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    dm = _resolve_device_map(model, device_map, dtype)

    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    persistent = set(shapes)
    non_persistent = {n for n, _ in model.named_buffers()} - persistent
    tied = _tied_keys(model)
    _check_tied_copies(files, tied)
    expected = persistent - set(tied)
    loaded: set[str] = set()
    unexpected: list[str] = []
    chunk: dict[str, torch.Tensor] = {}
    cpu = torch.device("cpu")
    bar = tqdm(total=sum(f.n_tensors for f in files), desc="load", unit="tensor", disable=not progress)
    for wf in files:
        layout = _layout(wf, config.model_type)
        stream = _stream(
            wf,
            dtype,
            lambda n: _device_for(n, dm) if n in expected else cpu,
            lambda n, lay=layout: n in expected and lay.transposes(n, 2),
            lambda n: n in tied or n in non_persistent,  # not decoded: tied copies, stale buffers
            layout,
        )
        for name, tensor, transposed in stream:
            bar.update()
            if tensor is None:
                continue  # tied copies (checked above, re-tied below), stale buffers such as old inv_freq
            if name not in expected:
                unexpected.append(f"{name} ({wf.path.name})")
                continue
            if name in loaded:
                raise CheckpointLoadError(f"{wf.path}: tensor {name!r} appears twice in the checkpoint")
            if not transposed and layout.transposes(name, tensor.dim()):
                tensor = tensor.t().contiguous()  # BF16-stored projections of an in_out file
            if tuple(tensor.shape) != shapes[name]:
                raise CheckpointLoadError(
                    f"{wf.path}: tensor {name!r}: shape {tuple(tensor.shape)} after loading "
                    f"(orientation={wf.orientation}) does not match the model's {shapes[name]}"
                )
            if chunk and _chunk_key(name) != _chunk_key(next(iter(chunk))):
                model.load_state_dict(chunk, strict=False, assign=True)  # assign: the tensor becomes the parameter
                chunk = {}
            chunk[name] = tensor.to(_device_for(name, dm))
            loaded.add(name)
            del tensor
    if chunk:
        model.load_state_dict(chunk, strict=False, assign=True)
        chunk = {}
    bar.close()
    missing = sorted(expected - loaded)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: {_list(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)}: {_list(sorted(unexpected))}")
        raise CheckpointLoadError(f"{ckpt}: checkpoint does not match {type(model).__name__} ({'; '.join(parts)})")
    if tied:
        model.tie_weights()
        for dst, src in tied.items():
            if model.get_parameter(dst) is not model.get_parameter(src):
                raise CheckpointLoadError(f"{ckpt}: tying {dst} to {src} failed")
    still_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if still_meta:
        raise CheckpointLoadError(f"{ckpt}: tensors left on the meta device: {_list(still_meta)}")
    model.eval()  # parameters keep requires_grad=True, as from_pretrained leaves them (the trainer loads here too)
    if dm is not None:
        _dispatch(model, dm)
    return model, tokenizer


def _load_mxfp8_resident(ckpt: Path, *, dtype: torch.dtype, device_map: Any) -> tuple[Any, Any]:
    """``from_pretrained`` through :mod:`mxfp8_codec.hf`: projections stay MXFP8 in memory.

    The quantizer validates every header against config.json and the architecture before any
    weight is read; its :class:`~mxfp8_codec.MXFP8Error` (naming file and tensor) becomes our
    :class:`CheckpointLoadError`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import mxfp8_codec.hf as mxhf

    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    named = (config.get("quantization_config") or {}).get("quant_method") == mxhf.QUANT_METHOD
    kwargs: dict[str, Any] = {"dtype": dtype}
    if not named:  # the seeds' checkpoints: same file, plain config
        kwargs["quantization_config"] = mxhf.MXFP8Config()
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(ckpt, **kwargs)
    except MXFP8Error as e:
        raise CheckpointLoadError(str(e)) from None
    model.eval()
    return model, tokenizer


def _dispatch(model: Any, dm: dict[str, Any]) -> None:
    """Move buffers / add accelerate hooks for ``dm`` (parameters are already on their devices)."""
    from accelerate import dispatch_model

    devices = {str(v) for v in dm.values()}
    if len(devices) == 1:
        model.to(_device_for("", {"": next(iter(dm.values()))}))  # buffers only; keeps their dtypes
    else:
        dispatch_model(model, device_map=dm)
    model.hf_device_map = dm


def file_sha256(path: str | Path) -> str:
    """sha256 of a whole file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def describe_checkpoint(checkpoint_dir: str | Path, *, hash_files: bool = True) -> dict[str, Any]:
    """Provenance of a checkpoint for results files: weight files with sha256, format, precision metadata.

    Returns:
        ``{"path", "format": "mxfp8"|"plain", "architectures", "files": [{"name", "bytes", "sha256"}],
        "precision": {...metadata of the first file...}}``.
    """
    ckpt = Path(checkpoint_dir)
    files = _weight_files(ckpt)
    config = json.loads((ckpt / "config.json").read_text()) if (ckpt / "config.json").is_file() else {}
    return {
        "path": str(ckpt.resolve()),
        "format": "mxfp8" if any(f.mxfp8 for f in files) else "plain",
        "architectures": config.get("architectures"),
        "files": [
            {
                "name": f.path.name,
                "bytes": f.path.stat().st_size,
                **({"sha256": file_sha256(f.path)} if hash_files else {}),
            }
            for f in files
        ],
        "precision": {
            **files[0].metadata,
            "orientation": files[0].orientation,
            "norm_convention": files[0].norm_convention,
        },
    }
