"""transformers integration: ``from_pretrained`` loads our MXFP8 checkpoints, weights stay MXFP8.

``import mxfp8_codec.hf`` registers the quantization method ``"mxfp8_codec"`` with transformers'
own hooks (``transformers.quantizers.auto.register_quantization_config`` / ``register_quantizer``);
``import mxfp8_codec`` alone never imports transformers. Then::

    import mxfp8_codec.hf
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(d)                       # config.json names the method
    model = AutoModelForCausalLM.from_pretrained(d, quantization_config=mxfp8_codec.hf.MXFP8Config())
    model = AutoModelForCausalLM.from_pretrained(d, quantization_config=MXFP8Config(dequantize=True))

The second form is for checkpoints whose config.json has no ``quantization_config`` (the seeds'
published ones: the same file, a plain config).

**No raw-code model, even without a quantization_config.** transformers 5.x loads such a checkpoint
as plain ``nn.Linear`` layers holding the E4M3 codes (it only reports the ``.scale`` entries as
unexpected). With this module imported, ``from_pretrained(d)`` of a checkpoint whose safetensors
header says ``weights_dtype = MXFP8_E4M3_UE8M0_K32`` or holds an ``F8_E4M3`` entry with a ``.scale``
partner (:func:`mxfp8_codec.header.sniff_mxfp8`: the header only, never tensor data) loads it
through our quantizer or fails with :class:`MXFP8LoadError`:

* no ``quantization_config`` (absent or null) and none passed: loaded as if
  ``quantization_config=MXFP8Config()`` had been given -- the same model (resident MXFP8 weights,
  bit-identical logits) as when config.json names the method, since the file and not config.json
  is the source of truth (docs/format.md section 15); a ``UserWarning`` names the file (Python shows
  it once per file). A transformers user expects a quantized checkpoint to load quantized, as
  transformers' own pre-quantized formats do; refusing would only make them pass the one config
  that can read the file. ``dequantize`` stays an explicit choice:
  ``MXFP8Config(dequantize=True)``.
* a ``quantization_config`` of another method (in config.json, or passed) or one transformers does
  not know: :class:`MXFP8LoadError` naming the file and the method; nothing reads those codes right.
* our method: every header is validated before transformers opens any file, so a truncated file,
  a missing shard or a malformed scale is :class:`MXFP8LoadError` (naming the file and tensor), not
  transformers' own error; like every codec error raised inside our quantizer.

transformers offers no registered hook for this: the quantizer is chosen (``get_hf_quantizer``,
from config.json and the arguments) *before* the checkpoint files are resolved, and no hook sees
both. So two functions of ``transformers.modeling_utils`` are wrapped, once (idempotent), only on a
5.x release where they have the shape checked at import (else a warning says the check is off):

1. ``_get_dtype(dtype, checkpoint_files, config, ..., hf_quantizer)``, the first call of
   ``from_pretrained`` that has the resolved (downloaded) files, the config and the chosen
   quantizer together, before any model is built: runs the check above (headers only).
2. ``PreTrainedModel.from_pretrained``: when that check found our file with no
   ``quantization_config`` (a private :class:`MXFP8LoadError` subclass), warns and calls the
   original once more with ``quantization_config=MXFP8Config()`` -- nothing was built or read but
   headers; the files are local (cached) by then.

A wrongly typed ``quantization_config`` in config.json (a list, number or string) fails inside
transformers' config loading (``AutoConfig.from_pretrained`` raises ``AttributeError ... to_dict``)
before either hook runs, with or without this module; ``MXFP8Config.from_dict`` checks the type of
every field of ours (one ``ValueError`` naming the key).

How loading works (transformers 5.x, the quantizer hooks every 5.x release has; this module keeps the
hooks, :mod:`mxfp8_codec.hf_load` the steps, :mod:`mxfp8_codec.hf_modules` the modules):

1. **Plan and validate before any weight is read** (``_process_model_before_weight_loading``, which
   receives the checkpoint files): where the directory has a ``SHA256SUMS`` (every model directory ida
   writes), the weights and side files are checked against it first (``MXFP8Config(check_sums=False)``
   skips that), so a damaged copy is named instead of loading as other weights; every file header is
   parsed and validated by the codec; the
   file metadata must agree with config.json's ``quantization_config`` (orientation, norm
   convention, format version); every tensor the model expects must be stored, with its shape
   (in the file's orientation for projections); nothing unexpected may be stored; only projection
   weights may be quantized; a stored copy of a tied weight must equal its source. A problem raises
   :class:`MXFP8LoadError` naming the file and the tensor (missing and unexpected tensors listed
   together) -- no weight has been loaded, so there is never a half-loaded model.
2. Every projection ``nn.Linear`` (``mxfp8_codec.is_projection_weight``) becomes an
   :class:`MXFP8Linear` without a ``weight`` parameter, so transformers' own loader skips the
   stored ``X.weight`` / ``X.weight.scale`` entries (listed in ``_keys_to_ignore_on_load_unexpected``)
   and loads everything else (embeddings, norms, biases, ``lm_head``) as it always does.
3. After transformers' loader (``_process_model_after_weight_loading``) the projections are taken
   from the files: the E4M3 payload and UE8M0 scale bytes, unchanged and in the file's layout
   (1.03 bytes per weight). Each projection's scale bytes are scanned first: a NaN scale (0xFF)
   is :class:`MXFP8LoadError` naming the entry and index (~0.5 % of a load from the page cache).
   On the CPU they are views of a private (copy-on-write) mapping of the file, as transformers
   keeps bf16 weights: nothing is copied or read at load (but the scale bytes), pages are read on
   first use and belong to the page cache; a write to a payload stays in this process. (Rewriting
   the file in place while the model is loaded is unsupported, as for any mapped weights; our
   writers and ``save_pretrained`` replace files, which is safe.) On a GPU they are copied onto the
   device of the module's decoder layer. With
   ``dequantize=True`` each is decoded once instead into a plain ``nn.Linear`` of the model dtype
   (the codec's decode, transposed for ``in_out`` files, split over the CPUs; ``ida_eval.load_model``
   is this path). Folded
   norm gains are re-read and unfolded (``w = gamma - 1`` in float32, rounded once) where the
   architecture's norms add 1 at run time (``mxfp8_codec.layout.norm_adds_one`` by
   ``config.model_type``: NemotronLayerNorm1P, GemmaRMSNorm).
4. MXFP8-resident models on the CPU: an untied input embedding becomes a
   :class:`FileRowsEmbedding` (the same module, its class swapped): inference lookups read the
   needed rows from the file with ``os.preadv`` instead of touching the mapped table, whose page
   cache folios would otherwise become resident whole (up to 2 MiB per token). Same values.

At each forward an :class:`MXFP8Linear` decodes its weight into one scratch buffer shared by all
projections on that device and dtype (one per thread; no allocation per call): on CPU the codec's native
C kernel (``decode_mxfp8(..., out=)`` on torch's OpenMP team: see :func:`mxfp8_codec.hf_modules.decode_cpu`);
on other devices a Triton kernel or torch ops
(:func:`decode_into`). The values are those of the ``[out, in]`` matrix ``dequantize=True`` (and so
``ida_eval.load_model``) holds, bit for bit, and ``F.linear`` sums them as it sums that matrix: for
``in_out`` files it gets the transposed view of a decode in the file's layout (no transpose pass) only
where the GEMM is known to sum that layout in the same order (CUDA; BF16 on oneDNN, i.e. AVX-512 CPUs),
else the weight is decoded into ``[out, in]`` (:func:`mxfp8_codec.hf_modules.gemm_takes_transposed`). So
the logits are bit-identical to the dequantized model (tests/mxfp8_codec/test_hf.py checks ``torch.equal``
on logits for both orientations, BF16 and float32). When autograd would save the weight (grad enabled and
the input requires grad), a fresh tensor is used instead of the shared scratch.

``model.save_pretrained(out)`` writes our format again: the payload and scale bytes as loaded,
every other tensor in the file's orientation, norm convention and stored dtype (a folded gain is
written as its original stored bytes while the parameter still equals its unfolding; a bf16 tensor
of a float32 load as bf16 while its values fit), the first file's ``__metadata__`` and config.json's
``quantization_config``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers.quantizers import HfQuantizer
from transformers.quantizers.auto import register_quantization_config, register_quantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from mxfp8_codec.constants import WEIGHTS_DTYPE
from mxfp8_codec.header import read_header, sniff_mxfp8
from mxfp8_codec.hf_config import FORMAT_VERSION, QUANT_METHOD, quantization_config_dict
from mxfp8_codec.hf_load import (
    LoadPlan,
    MXFP8LoadError,
    as_load_error,
    dequantize_modules,
    load_projections,
    plan_load,
    replace_projections,
    state_dict_for_save,
)
from mxfp8_codec.hf_modules import FileRowsEmbedding, MXFP8Linear, decode_into, mxfp8_modules
from mxfp8_codec.layout import NORM_CONVENTIONS, ORIENTATIONS

__all__ = [
    "FORMAT_VERSION",
    "FileRowsEmbedding",
    "MXFP8Config",
    "MXFP8HfQuantizer",
    "MXFP8Linear",
    "MXFP8LoadError",
    "NORM_CONVENTIONS",
    "QUANT_METHOD",
    "decode_into",
    "mxfp8_modules",
    "quantization_config_dict",
]


@register_quantization_config(QUANT_METHOD)
class MXFP8Config(QuantizationConfigMixin):
    """Quantization config of our MXFP8 checkpoints (``quant_method = "mxfp8_codec"``).

    Args:
        orientation: ``"in_out"`` / ``"out_in"`` as the checkpoint's files must say, or None to
            take it from the files (checkpoints without a ``quantization_config``).
        norm_convention: ``"zero_centered"`` / ``"folded"``, or None (from the files).
        format_version: ``"1"``.
        weights_dtype: ``"MXFP8_E4M3_UE8M0_K32"``.
        scale_rule: recorded only (decoding never depends on it).
        dequantize: False (default) keeps projection weights in MXFP8 (:class:`MXFP8Linear`);
            True decodes them once into plain ``nn.Linear`` of the model dtype.
        check_sums: True (default): where the checkpoint's directory has a ``SHA256SUMS`` (every model
            directory ida writes), its weights and side files are checked against it before anything is
            read, so a damaged copy is :class:`MXFP8LoadError` naming the file, not other numbers
            (:func:`mxfp8_codec.checkpoint.check_sums`: it reads every byte once). False skips that, e.g.
            where the caller has just checked. A loading option: never written to config.json.

    Example:
        >>> MXFP8Config().to_dict()["quant_method"]
        'mxfp8_codec'
    """

    def __init__(
        self,
        orientation: str | None = None,
        norm_convention: str | None = None,
        format_version: str = FORMAT_VERSION,
        weights_dtype: str = WEIGHTS_DTYPE,
        scale_rule: str | None = None,
        dequantize: bool = False,
        check_sums: bool = True,
        **kwargs: Any,
    ) -> None:
        self.quant_method = QUANT_METHOD
        self.orientation = orientation
        self.norm_convention = norm_convention
        self.format_version = str(format_version)
        self.weights_dtype = weights_dtype
        self.scale_rule = scale_rule
        self.dequantize = dequantize
        self.check_sums = check_sums
        unknown = sorted(k for k in kwargs if k != "quant_method")
        if unknown:
            raise ValueError(f"MXFP8Config: unknown fields {unknown}")
        self.post_init()

    def post_init(self) -> None:
        """Validate every field's type and value (actionable ``ValueError`` naming the key)."""
        for key in ("dequantize", "check_sums"):  # "dequantize": "no" in a config.json must not mean True
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"MXFP8Config: {key} must be true or false, got {getattr(self, key)!r}")
        for key in ("orientation", "norm_convention", "scale_rule"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                raise ValueError(f"MXFP8Config: {key} must be a string or null, got {getattr(self, key)!r}")
        if not isinstance(self.weights_dtype, str):
            raise ValueError(f"MXFP8Config: weights_dtype must be a string, got {self.weights_dtype!r}")
        if self.orientation is not None and self.orientation not in ORIENTATIONS:
            raise ValueError(f"MXFP8Config: orientation={self.orientation!r}, expected one of {ORIENTATIONS} or None")
        if self.norm_convention is not None and self.norm_convention not in NORM_CONVENTIONS:
            raise ValueError(
                f"MXFP8Config: norm_convention={self.norm_convention!r}, expected one of {NORM_CONVENTIONS} or None"
            )
        if self.format_version != FORMAT_VERSION:
            raise ValueError(
                f"MXFP8Config: format_version={self.format_version!r}; this mxfp8_codec reads version {FORMAT_VERSION}"
            )
        if self.weights_dtype != WEIGHTS_DTYPE:
            raise ValueError(f"MXFP8Config: weights_dtype={self.weights_dtype!r}, expected {WEIGHTS_DTYPE!r}")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "quant_method": QUANT_METHOD,
            "weights_dtype": self.weights_dtype,
            "format_version": self.format_version,
        }
        for key in ("orientation", "norm_convention", "scale_rule"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.dequantize:
            d["dequantize"] = True
        return d

    def to_diff_dict(self) -> dict[str, Any]:
        return self.to_dict()

    def get_loading_attributes(self) -> dict[str, Any]:
        """What ``from_pretrained(..., quantization_config=MXFP8Config(dequantize=True))`` may change
        on a checkpoint whose config.json already names the method."""
        return {"dequantize": self.dequantize, "check_sums": self.check_sums}


def _allow_loading_attributes() -> None:
    """transformers merges loading attributes (``dequantize``) from a passed config into the
    checkpoint's only for config classes in ``LOADING_ATTRIBUTES_CONFIG_TYPES``; add ours there
    (otherwise ``MXFP8Config(dequantize=True)`` would be ignored with a warning)."""
    from transformers.quantizers import auto

    types = getattr(auto, "LOADING_ATTRIBUTES_CONFIG_TYPES", None)
    if isinstance(types, tuple) and MXFP8Config not in types:
        auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (*types, MXFP8Config)


_allow_loading_attributes()


# --------------------------------------------------------------------------- quantizer


@register_quantizer(QUANT_METHOD)
class MXFP8HfQuantizer(HfQuantizer):
    """Loads (and saves) our MXFP8 checkpoints through ``from_pretrained`` / ``save_pretrained``:
    transformers' hooks, each calling one step of :mod:`mxfp8_codec.hf_load`."""

    requires_calibration = False
    requires_parameters_quantization = False

    def __init__(self, quantization_config: MXFP8Config, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self._plan: LoadPlan | None = None
        self._dtype = torch.bfloat16

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        device_map = kwargs.get("device_map")
        if isinstance(device_map, Mapping) and "disk" in device_map.values():
            raise MXFP8LoadError("device_map offloads to disk; mxfp8_codec does not support that")

    def update_dtype(self, dtype: torch.dtype | None) -> torch.dtype:
        return torch.bfloat16 if dtype is None else dtype

    def param_needs_quantization(self, model: Any, param_name: str, **kwargs: Any) -> bool:
        return False

    def check_quantized_param(self, *args: Any, **kwargs: Any) -> bool:  # transformers 4.x name
        return False

    @as_load_error()
    def _process_model_before_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        files = kwargs.get("checkpoint_files")
        if files is None:
            raise MXFP8LoadError("this transformers version does not pass checkpoint files to quantizers")
        dtype = kwargs.get("dtype") or getattr(model.config, "dtype", None) or torch.bfloat16
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self._plan = plan_load(model, [str(f) for f in files], self.quantization_config)
        self._dtype = dtype
        replace_projections(model, self._plan, dtype)
        return model

    @as_load_error()
    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        assert self._plan is not None
        load_projections(model, self._plan, self._dtype, dequantize=self.quantization_config.dequantize)
        if self.quantization_config.dequantize:  # a plain model: save_pretrained writes plain safetensors
            self.remove_quantization_config(model)
        return model

    # ------------------------------------------------------------------ save

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return bool(self.quantization_config.dequantize)

    @property
    def is_compileable(self) -> bool:
        """transformers may ``torch.compile`` the forward (static-cache generation on CUDA): a
        dequantized model is plain ``nn.Linear``s, and an MXFP8-resident projection decodes through one
        opaque operator while compiling (:func:`mxfp8_codec.hf_modules.decode_op`)."""
        return True

    def get_state_dict_and_metadata(
        self, model: Any, *args: Any, **kwargs: Any
    ) -> tuple[dict[str, torch.Tensor], dict]:
        """Our format again (:func:`mxfp8_codec.hf_load.state_dict_for_save`)."""
        assert self._plan is not None
        return state_dict_for_save(model, self._plan)

    def _dequantize(self, model: Any, dtype: torch.dtype | None = None) -> Any:
        return dequantize_modules(model, dtype)


# --------------------------------------------------------------------------- without a quantization_config


class _QuantizationConfigMissing(MXFP8LoadError):
    """An MXFP8 checkpoint whose config has no ``quantization_config``: raised by the check in
    transformers' ``_get_dtype`` before any model is built, caught by the ``from_pretrained`` hook,
    which loads it again with ``MXFP8Config()``. Should it ever escape (a ``from_pretrained`` that
    bypasses ``PreTrainedModel``'s), it is still the documented error with an actionable message."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path}: an MXFP8 checkpoint ({WEIGHTS_DTYPE}) but config.json has no quantization_config; load it "
            "with from_pretrained(..., quantization_config=mxfp8_codec.hf.MXFP8Config())"
        )
        self.path = path


_HOOKED = "__mxfp8_codec_hook__"  # set on our wrappers: installing them again is a no-op


def _check_checkpoint_files(files: Sequence[Any] | None, config: Any, hf_quantizer: Any) -> None:
    """The check run inside ``from_pretrained`` once the checkpoint files are resolved (downloaded)
    and the quantizer is chosen, before any model is built (see the module docstring)."""
    names = [str(f) for f in files or () if str(f).endswith(".safetensors")]
    method = getattr(getattr(hf_quantizer, "quantization_config", None), "quant_method", None)
    if method == QUANT_METHOD:
        with as_load_error():  # before transformers opens them itself (its header errors name no file)
            for f in names:
                read_header(f)
        return
    ours = next((f for f in names if sniff_mxfp8(f)), None)  # headers only
    if ours is None:
        return
    text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    qc = getattr(config, "quantization_config", None) or getattr(text_config, "quantization_config", None)
    if hf_quantizer is None and qc is None:
        raise _QuantizationConfigMissing(ours)
    if hf_quantizer is None:  # a method transformers does not know ("Unknown quantization type" warning)
        method = qc.get("quant_method") if isinstance(qc, Mapping) else getattr(qc, "quant_method", None)
    raise MXFP8LoadError(
        f"{ours}: an MXFP8 checkpoint ({WEIGHTS_DTYPE}) but the quantization_config says "
        f"quant_method={getattr(method, 'value', method)!r}; only {QUANT_METHOD!r} (mxfp8_codec.hf.MXFP8Config) reads "
        "it, anything else would run the raw E4M3 codes as weights"
    )


def _hooked(fn: Callable[..., Any]) -> Callable[..., Any]:
    setattr(fn, _HOOKED, True)
    return fn


def _install_from_pretrained_hooks() -> None:
    """Wrap two functions of ``transformers.modeling_utils`` (idempotent, feature-checked; see the
    module docstring for why and what each does)."""
    import transformers
    from transformers import modeling_utils as mu

    if getattr(getattr(mu, "_get_dtype", None), _HOOKED, False):
        return
    from_pretrained = mu.PreTrainedModel.__dict__.get("from_pretrained")
    get_dtype = getattr(mu, "_get_dtype", None)
    if not (
        transformers.__version__.split(".")[0] == "5"
        and isinstance(from_pretrained, classmethod)
        and callable(get_dtype)
        and {"checkpoint_files", "config", "hf_quantizer"} <= set(inspect.signature(get_dtype).parameters)
    ):
        warnings.warn(
            f"mxfp8_codec.hf: transformers {transformers.__version__} is not a 5.x release this module knows: "
            "from_pretrained does not check for MXFP8 checkpoints without a quantization_config (it would run their "
            "raw E4M3 codes); pass quantization_config=mxfp8_codec.hf.MXFP8Config() for them",
            stacklevel=3,
        )
        return
    signature = inspect.signature(get_dtype)
    original_from_pretrained = from_pretrained.__func__

    @_hooked
    @functools.wraps(get_dtype)
    def checked_get_dtype(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs).arguments
        _check_checkpoint_files(bound.get("checkpoint_files"), bound.get("config"), bound.get("hf_quantizer"))
        return get_dtype(*args, **kwargs)

    @_hooked
    @functools.wraps(original_from_pretrained)
    def from_pretrained_loading_mxfp8(cls: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original_from_pretrained(cls, *args, **kwargs)
        except _QuantizationConfigMissing as exc:
            missing = exc  # loaded again below, outside this handler (no chained traceback on a later error)
        warnings.warn(
            f"{missing.path}: an MXFP8 checkpoint whose config.json has no quantization_config: loading it as "
            "from_pretrained(..., quantization_config=mxfp8_codec.hf.MXFP8Config()) (weights stay MXFP8); pass that, "
            "or MXFP8Config(dequantize=True) for plain nn.Linear, to silence this",
            stacklevel=2,
        )
        return original_from_pretrained(cls, *args, **{**kwargs, "quantization_config": MXFP8Config()})

    mu._get_dtype = checked_get_dtype
    mu.PreTrainedModel.from_pretrained = classmethod(from_pretrained_loading_mxfp8)


_install_from_pretrained_hooks()
