"""How an MXFP8 checkpoint becomes a transformers model: the load plan and the steps the quantizer runs.

:class:`mxfp8_codec.hf.MXFP8HfQuantizer` keeps transformers' hooks and nothing else; each hook calls
one function here:

1. :func:`plan_load` (before any weight is read): where the directory has a ``SHA256SUMS`` (and
   ``check_sums`` is on), its weights and side files checked against it
   (:func:`mxfp8_codec.checkpoint.check_sums`: a damaged copy is named, not loaded as other numbers); every
   file header parsed and validated by the codec,
   the file metadata checked against config.json's ``quantization_config``, every tensor the model
   expects found with its shape (in the file's orientation for projections), nothing unexpected
   stored, only projection weights quantized, and a stored copy of a tied weight equal to its source.
   Every problem found is :class:`MXFP8LoadError` naming the file and the tensor(s); missing and
   unexpected tensors are listed together. No weight has been loaded, so there is never a half-loaded
   model.
2. :func:`replace_projections`: every projection ``nn.Linear`` becomes an
   :class:`~mxfp8_codec.hf_modules.MXFP8Linear` without a ``weight`` parameter, and
   :func:`ignore_patterns` tells transformers' loader to skip the stored ``X.weight`` /
   ``X.weight.scale`` entries; it loads everything else (embeddings, norms, biases, ``lm_head``).
3. :func:`load_projections` (after transformers' loader): the projections from the files, either as
   payload + scale bytes (views of a private mapping on the CPU, copies on a GPU) or, with
   ``dequantize``, decoded once into plain ``nn.Linear`` of the model dtype; folded norm gains
   unfolded where the architecture's norms add 1; on the CPU an untied input embedding becomes a
   :class:`~mxfp8_codec.hf_modules.FileRowsEmbedding`.
4. :func:`state_dict_for_save` (``save_pretrained``): our format again.

The module docstring of :mod:`mxfp8_codec.hf` says what each step guarantees and why.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mxfp8_codec.checkpoint import check_sums
from mxfp8_codec.constants import WEIGHTS_DTYPE
from mxfp8_codec.convert import numpy_dtype_of, torch_dtype_of
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import DTYPES, FLOAT_DTYPES, SCALE_SUFFIX
from mxfp8_codec.hf_config import FORMAT_VERSION
from mxfp8_codec.hf_modules import (
    KERNEL_DTYPES,
    FileRows,
    FileRowsEmbedding,
    MXFP8Linear,
    decode_cpu,
    mxfp8_modules,
    prepare_cpu_decode,
)
from mxfp8_codec.layout import is_projection_weight, norm_adds_one, unfold_norm
from mxfp8_codec.reader import open_mxfp8

__all__ = [
    "LoadPlan",
    "MXFP8LoadError",
    "StoredTensor",
    "as_load_error",
    "dequantize_modules",
    "ignore_patterns",
    "listed_names",
    "load_projections",
    "plan_load",
    "replace_projections",
    "state_dict_for_save",
    "tied_keys",
]

MAX_LISTED_KEYS = 20  # tensor names shown in a missing/unexpected error


class MXFP8LoadError(MXFP8Error):
    """A checkpoint cannot be loaded into the model; the message names the file and the tensor."""


@contextlib.contextmanager
def as_load_error() -> Iterator[None]:
    """Inside ``from_pretrained`` every codec error (a header that fails validation, a missing shard,
    a NaN scale byte) is the documented :class:`MXFP8LoadError`, with the codec's one-line message.
    Usable as a decorator too."""
    try:
        yield
    except MXFP8LoadError:
        raise
    except MXFP8Error as exc:
        raise MXFP8LoadError(str(exc)) from None


@dataclass
class StoredTensor:
    """Where and how one tensor is stored."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    quantized: bool
    orientation: str
    norm_convention: str


@dataclass
class LoadPlan:
    stored: dict[str, StoredTensor] = field(default_factory=dict)
    projections: dict[str, tuple[int, int]] = field(default_factory=dict)  # module name -> (out, in)
    unfold: list[str] = field(default_factory=list)  # norm weight names to unfold after loading
    metadata: dict[str, str] = field(default_factory=dict)  # first MXFP8 file's __metadata__
    orientation: str = "in_out"
    norm_convention: str = "zero_centered"
    folded_originals: dict[str, torch.Tensor] = field(default_factory=dict)


def tied_keys(model: Any) -> dict[str, str]:
    """Parameter names tied to another parameter (target -> source) when the config ties them
    (``tie_word_embeddings``): ``{"lm_head.weight": "model.embed_tokens.weight"}``."""
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(text_config, "tie_word_embeddings", False):
        return {}
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if isinstance(tied, Mapping):
        return {str(k): str(v) for k, v in tied.items()}
    # older list form: every entry is tied to the input embeddings
    emb = next(n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    return {str(k): emb for k in tied}


def listed_names(keys: Sequence[str]) -> str:
    """``a, b, c`` -- at most :data:`MAX_LISTED_KEYS` names, then ``... (N more)`` (load errors list keys)."""
    shown = ", ".join(keys[:MAX_LISTED_KEYS])
    return shown + (f", ... ({len(keys) - MAX_LISTED_KEYS} more)" if len(keys) > MAX_LISTED_KEYS else "")


def plan_load(model: Any, files: Sequence[str], qc: Any) -> LoadPlan:
    """Check the files against their directory's ``SHA256SUMS`` (where there is one and ``qc.check_sums``),
    then read and validate every header against ``qc`` (an :class:`mxfp8_codec.hf.MXFP8Config`: its
    ``orientation``, ``norm_convention``, ``format_version``) and the model (built on the meta device).

    Raises:
        MXFP8Error: a listed file is missing or its bytes differ from its recorded sha256 (the quantizer's
            hooks raise every codec error as :class:`MXFP8LoadError`).
        MXFP8LoadError: the first problem of a file (naming it and the tensor); the tensors the model
            needs but no file stores and those stored but not the model's, all listed in one message.
    """
    if not files:
        raise MXFP8LoadError("no checkpoint files to load (mxfp8_codec reads safetensors checkpoints)")
    if qc.check_sums:  # the root cause first: a damaged copy, before what its bytes would make of a header
        for directory in sorted({Path(f).parent for f in files}):
            check_sums(directory)
    plan = LoadPlan()
    mxfp8_files = 0
    for f in files:
        if not str(f).endswith(".safetensors"):
            raise MXFP8LoadError(f"{f}: not a safetensors file (mxfp8_codec reads safetensors checkpoints)")
        with open_mxfp8(f) as r:  # validates V1-V12 (a missing scale, a bad shape): MXFP8Error names file/tensor
            meta = dict(r.metadata)
            mx = meta.get("weights_dtype") == WEIGHTS_DTYPE
            orientation = meta.get("orientation", "in_out") if mx else "out_in"
            norm = meta.get("norm_convention", "zero_centered") if mx else "zero_centered"
            if mx:
                mxfp8_files += 1
                if not plan.metadata:
                    plan.metadata = meta
                    plan.orientation, plan.norm_convention = orientation, norm
                version = meta.get("format_version", FORMAT_VERSION)
                first_proj = next((n for n in r.keys() if is_projection_weight(n)), None)
                where = f"{f}" + (f": tensor {first_proj!r}" if first_proj else "")
                for key, want, got in (
                    ("orientation", qc.orientation, orientation),
                    ("norm_convention", qc.norm_convention, norm),
                    ("format_version", qc.format_version, version),
                ):
                    if want is not None and want != got:
                        raise MXFP8LoadError(
                            f"{where}: file metadata says {key}={got!r} but config.json quantization_config says "
                            f"{key}={want!r}; fix config.json (python -m mxfp8_codec inspect shows the file's metadata)"
                        )
            for name in r.keys():
                if name in plan.stored:
                    raise MXFP8LoadError(f"{f}: tensor {name!r} is also stored in {plan.stored[name].path}")
                plan.stored[name] = StoredTensor(
                    str(f), r.dtype(name), tuple(r.shape(name)), r.is_quantized(name), orientation, norm
                )
    if mxfp8_files == 0:
        raise MXFP8LoadError(
            f"{files[0]}: not an MXFP8 checkpoint (no weights_dtype={WEIGHTS_DTYPE} metadata); load it without "
            "MXFP8Config, or quantize it first with: python -m mxfp8_codec quantize"
        )

    expected = dict(model.state_dict())  # meta tensors: names and shapes only
    persistent = set(expected)
    non_persistent = {n for n, _ in model.named_buffers()} - persistent
    tied = tied_keys(model)
    for name, t in expected.items():
        module_name, _, leaf = name.rpartition(".")
        if leaf == "weight" and is_projection_weight(name) and t.dim() == 2:
            module = model.get_submodule(module_name)
            if type(module) is not nn.Linear:
                raise MXFP8LoadError(f"{name}: projection module is {type(module).__name__}, not nn.Linear")
            plan.projections[module_name] = (module.out_features, module.in_features)
    missing = []
    for name, t in expected.items():
        s = plan.stored.get(name)
        if s is None:
            if name not in tied:
                missing.append(name)
            continue
        want = tuple(t.shape)
        if name.removesuffix(".weight") in plan.projections and name.endswith(".weight") and s.orientation == "in_out":
            want = want[::-1]
        if s.shape != want:
            raise MXFP8LoadError(
                f"{s.path}: tensor {name!r} has shape {list(s.shape)} but {type(model).__name__} needs "
                f"{list(want)} (orientation={s.orientation})"
            )
        if s.quantized and not (name.endswith(".weight") and name.removesuffix(".weight") in plan.projections):
            hint = (
                f"config.json ties it to {tied[name]!r} (tie_word_embeddings): store it as its source is stored, "
                "or drop the copy"
                if name in tied
                else "python -m mxfp8_codec dequantize makes a plain copy"
            )
            raise MXFP8LoadError(
                f"{s.path}: tensor {name!r} is MXFP8 but is not a projection weight; transformers loading keeps "
                f"only projections in MXFP8 ({hint})"
            )
        if s.norm_convention == "folded" and norm_adds_one(
            name, t.dim(), getattr(model.config, "model_type", None), source=s.path
        ):  # the per-architecture rule of mxfp8_codec.layout (docs/format.md section 9)
            plan.unfold.append(name)
    unexpected = sorted(set(plan.stored) - persistent - non_persistent - set(tied))
    if missing or unexpected:
        parts = [f"missing {len(missing)}: {listed_names(sorted(missing))}"] if missing else []
        if unexpected:
            named = [f"{n} ({Path(plan.stored[n].path).name})" for n in unexpected]
            parts.append(f"unexpected {len(unexpected)}: {listed_names(named)}")
        where = files[0] if len(files) == 1 else Path(files[0]).parent
        raise MXFP8LoadError(
            f"{where}: the checkpoint does not match {type(model).__name__} ({'; '.join(parts)}); "
            "wrong architecture in config.json?"
        )
    _check_tied_copies(plan, tied)
    return plan


def _check_tied_copies(plan: LoadPlan, tied: Mapping[str, str]) -> None:
    """A stored copy of a tied tensor (``lm_head.weight`` next to the embedding) must equal its
    source: the model keeps only the source, so a different copy would be dropped silently.

    Raises:
        MXFP8LoadError: naming both tensors and their files.
    """
    for dst, src in tied.items():
        a, b = plan.stored.get(dst), plan.stored.get(src)
        if a is None or b is None:
            continue  # no copy stored (a missing source was reported above)
        with open_mxfp8(a.path) as ra, open_mxfp8(b.path) as rb:
            if _same_stored_values(ra, dst, rb, src):
                continue
        raise MXFP8LoadError(
            f"{a.path}: tensor {dst!r} differs from {src!r} ({Path(b.path).name}), but config.json ties "
            f"them (tie_word_embeddings): the model would silently use {src!r}; fix the config or drop the copy"
        )


def _same_stored_values(a: Any, a_name: str, b: Any, b_name: str) -> bool:
    """Equal shapes and values; stored the same way -> compared as bytes, else decoded to float32."""
    if a.shape(a_name) != b.shape(b_name):
        return False
    if a.dtype(a_name) != b.dtype(b_name) or a.is_quantized(a_name) != b.is_quantized(b_name):
        return bool(np.array_equal(a.get(a_name), b.get(b_name)))  # rare (stored differently): decode both whole
    raw_a, raw_b = a.raw_view(a_name), b.raw_view(b_name)
    parts = zip(raw_a, raw_b, strict=True) if a.is_quantized(a_name) else [(raw_a, raw_b)]
    return all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in parts)


def _reader(readers: dict[str, Any], path: str, **kwargs: Any) -> Any:
    """The reader of ``path`` in ``readers``, opened with ``kwargs`` (and kept there) on first use;
    the loader closes them all at the end."""
    r = readers.get(path)
    if r is None:
        r = readers[path] = open_mxfp8(path, **kwargs)
    return r


def read_rows_from_file(model: Any, plan: LoadPlan, readers: dict[str, Any]) -> None:
    """Make the input embedding a :class:`FileRowsEmbedding` where that saves memory and is exact:
    a plain ``nn.Embedding`` on the CPU whose weight holds its stored bytes (stored unquantized in
    the model's dtype) and is not also the output layer's (a tied ``lm_head`` reads the whole
    table at every forward anyway). The module keeps its identity (hooks, references)."""
    try:
        emb = model.get_input_embeddings()
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return
    if (
        type(emb) is not nn.Embedding
        or emb.weight.device.type != "cpu"
        or getattr(head, "weight", None) is emb.weight
        or emb.weight.is_inference()  # loaded under inference_mode: no version counter to see changes by
    ):
        return
    name = next(n for n, m in model.named_modules() if m is emb) + ".weight"
    s = plan.stored.get(name)
    if s is None or s.quantized or s.shape != tuple(emb.weight.shape) or DTYPES[s.dtype] != numpy_dtype_of(emb.weight):
        return
    r = _reader(readers, s.path)
    emb.__class__ = FileRowsEmbedding
    emb._rows = FileRows(s.path, name, r.file_offset(name), row_bytes=emb.embedding_dim * emb.weight.element_size())
    emb._weight_key = emb._weight_state()


def _module_device(model: nn.Module, module_name: str) -> torch.device:
    """Device of the nearest enclosing module that holds a real (loaded) tensor."""
    parts = module_name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        mod = model.get_submodule(".".join(parts[:i])) if i else model
        for t in [*mod.parameters(), *mod.buffers()]:
            if t.device.type != "meta":
                return t.device
    return torch.device("cpu")


def ignore_patterns(module_names: Iterable[str]) -> list[str]:
    """Patterns for transformers' ``_keys_to_ignore_on_load_unexpected`` that match the stored
    ``X.weight`` / ``X.weight.scale`` of every projection in ``module_names``: one pattern per name
    shape, layer numbers as ``\\d+`` (``model.layers.0.mlp.up_proj`` ... ``model.layers.N.mlp.up_proj``
    share one). transformers joins all patterns into one alternation and compiles it at every load;
    one pattern per projection (2 x 72 for a 12-layer model) cost ~0.3 s of ``re`` parsing, more
    than the rest of the load. Matching a few more names than were replaced cannot hide anything:
    :func:`plan_load` has already checked every stored tensor against the model."""
    shapes = {re.sub(r"\d+", r"\\d+", re.escape(name)) for name in module_names}
    return [rf"^{shape}\.weight(?:{re.escape(SCALE_SUFFIX)})?$" for shape in sorted(shapes)]


class _NoFormatKey(dict):
    """File metadata that keeps our files free of safetensors' ``"format"`` key.

    ``save_pretrained`` sets ``metadata["format"] = "pt"`` after asking the quantizer; our files
    deliberately have no ``"format"``: transformers < 5 refuses a safetensors file without it,
    the only version range where that refusal stops a loader without mxfp8_codec.hf from running
    raw E4M3 codes (docs/format.md §15).
    """

    def __setitem__(self, key: str, value: str) -> None:
        if key != "format":
            super().__setitem__(key, value)


def replace_projections(model: Any, plan: LoadPlan, dtype: torch.dtype) -> None:
    """Step 2: every planned projection becomes an :class:`MXFP8Linear` (no ``weight`` parameter,
    the old bias kept), and transformers' loader is told to skip their stored entries."""
    for module_name, (out_f, in_f) in plan.projections.items():
        old = model.get_submodule(module_name)
        parent_name, _, leaf = module_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        new = MXFP8Linear(
            in_f,
            out_f,
            bias=old.bias,
            orientation=plan.stored[module_name + ".weight"].orientation,
            dtype=dtype,
            name=module_name + ".weight",
        )
        setattr(parent, leaf, new)
    ignore = ignore_patterns(plan.projections)
    existing = getattr(model, "_keys_to_ignore_on_load_unexpected", None)
    if isinstance(existing, set):  # transformers >= 5.1 merges a set, 5.0 a list
        model._keys_to_ignore_on_load_unexpected = existing | set(ignore)
    else:
        model._keys_to_ignore_on_load_unexpected = [*(existing or []), *ignore]


def load_projections(model: Any, plan: LoadPlan, dtype: torch.dtype, *, dequantize: bool) -> None:
    """Step 3, after transformers' loader: projections from the files (resident MXFP8, or decoded once
    into ``nn.Linear`` with ``dequantize``), the input embedding's rows read from the file where that
    is exact (resident models on the CPU), folded norm gains unfolded."""
    readers: dict[str, Any] = {}
    try:
        for module_name in plan.projections:
            name = module_name + ".weight"
            s = plan.stored[name]
            r = _reader(readers, s.path, copy_on_write=True)  # writable views for torch.from_numpy
            module = model.get_submodule(module_name)
            device = _module_device(model, module_name)
            if not _load_projection(model, module_name, module, r, name, s, device, dtype, dequantize):
                r.release_pages(name)  # read and copied: drop the file pages from our resident set
        if not dequantize:
            read_rows_from_file(model, plan, readers)
            if any(m.payload.device.type == "cpu" for _, m in mxfp8_modules(model)):
                prepare_cpu_decode(dtype)
        for name in plan.unfold:
            s = plan.stored[name]
            r = _reader(readers, s.path)
            stored = r.get(name, framework="pt", dtype=torch.float32)
            param = model.get_parameter(name)
            plan.folded_originals[name] = r.get(name, framework="pt")  # as stored (for save_pretrained)
            with torch.no_grad():
                param.copy_(unfold_norm(stored).to(param.dtype))  # float32 gamma - 1, rounded once
    finally:
        for r in readers.values():
            r.close()


def _load_projection(
    model: Any,
    module_name: str,
    module: MXFP8Linear,
    r: Any,
    name: str,
    s: StoredTensor,
    device: torch.device,
    dtype: torch.dtype,
    dequantize: bool,
) -> bool:
    """Load one projection; True when its tensors still view the file's mapping (CPU, MXFP8).
    A NaN scale byte (0xFF) is refused first: it would make its whole block NaN, and it costs one
    vectorised pass over 1/32 of the weight's bytes to know."""
    flip = s.orientation == "in_out"
    r.check_scales(name)
    if s.quantized and not dequantize:
        payload, scales = r.raw_view(name)  # views of the private mapping: no copy, no read yet
        module.payload = torch.from_numpy(payload).to(device)
        module.scales = torch.from_numpy(scales).to(device)
        return device.type == "cpu"
    # plain Linear: decoded once (MXFP8) or read (stored plain), in nn.Linear's layout
    if s.quantized:
        shape = (module.out_features, module.in_features)
        if device.type == "cpu" and dtype in KERNEL_DTYPES:
            weight = torch.empty(shape, dtype=dtype)
            payload, scales = r.raw_view(name)
            decode_cpu(torch.from_numpy(payload), torch.from_numpy(scales), weight, flip, name, split=True)
        else:
            tmp = MXFP8Linear(
                module.in_features, module.out_features, bias=None, orientation=s.orientation, dtype=dtype, name=name
            )
            payload, scales = r.raw_view(name)
            tmp.payload = torch.from_numpy(payload).to(device)
            tmp.scales = torch.from_numpy(scales).to(device)
            weight = tmp.decode_weight()
    else:
        weight = r.get(name, framework="pt", dtype=dtype)
        if flip:
            weight = weight.t().contiguous()
    _replace_with_linear(model, module_name, module, weight.to(device))
    return False


def _replace_with_linear(model: Any, module_name: str, module: MXFP8Linear, weight: torch.Tensor) -> None:
    """Put a plain ``nn.Linear`` holding ``weight`` (``[out, in]``) and ``module``'s bias in its place."""
    linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=True)
    if module.bias is not None:
        linear.bias = module.bias
    parent_name, _, leaf = module_name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, leaf, linear)


def dequantize_modules(model: Any, dtype: torch.dtype | None = None) -> Any:
    """Every :class:`MXFP8Linear` of ``model`` becomes a plain ``nn.Linear`` (transformers'
    ``model.dequantize()``), its weight decoded (in ``dtype`` when given)."""
    for module_name, module in list(mxfp8_modules(model)):
        weight = module.decode_weight()
        _replace_with_linear(model, module_name, module, weight if dtype is None else weight.to(dtype))
    return model


def state_dict_for_save(model: Any, plan: LoadPlan) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Step 4, ``save_pretrained``: our format again. Payload/scale bytes as loaded, other tensors in the
    file's orientation, norm convention and stored dtype, the first file's metadata.

    A plain floating tensor is written in the dtype it was stored in (a bf16 norm of a model
    loaded with ``dtype=torch.float32`` is written as bf16 again) whenever that loses nothing
    (its values round-trip); a value the stored dtype cannot hold (changed after loading) keeps
    the model's dtype rather than being rounded silently."""
    sd = dict(model.state_dict())
    for module_name, module in model.named_modules():
        if isinstance(module, MXFP8Linear):
            sd[module_name + ".weight"] = module.payload.view(torch.float8_e4m3fn)
            sd[module_name + ".weight" + SCALE_SUFFIX] = module.scales
        elif module_name in plan.projections and plan.orientation == "in_out":
            sd[module_name + ".weight"] = module.weight.detach().t().contiguous()
    for name in plan.unfold:
        w = sd[name]
        original = plan.folded_originals.get(name)
        if original is not None and torch.equal((original.float() - 1.0).to(w.dtype), w.detach().cpu()):
            sd[name] = original
        else:
            sd[name] = (w.detach().float() + 1.0).to(w.dtype)
    for name, s in plan.stored.items():
        t = sd.get(name)
        if t is None or s.quantized or s.dtype not in FLOAT_DTYPES or numpy_dtype_of(t) == DTYPES[s.dtype]:
            continue
        as_stored = t.detach().to(torch_dtype_of(DTYPES[s.dtype]))
        if torch.equal(as_stored.to(t.dtype), t.detach()):
            sd[name] = as_stored
    return sd, _NoFormatKey(plan.metadata)
