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

How loading works (transformers 5.x, the quantizer hooks every 5.x release has):

1. **Plan and validate before any weight is read** (``_process_model_before_weight_loading``, which
   receives the checkpoint files): every file header is parsed and validated by the codec; the
   file metadata must agree with config.json's ``quantization_config`` (orientation, norm
   convention, format version); every tensor the model expects must be stored, with its shape
   (in the file's orientation for projections); nothing unexpected may be stored; only projection
   weights may be quantized. The first problem raises :class:`MXFP8LoadError` naming the file and
   the tensor -- no weight has been loaded, so there is never a half-loaded model.
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
   ``dequantize=True`` each is decoded once instead into a plain bf16 ``nn.Linear`` (the codec's
   decode, transposed for ``in_out`` files: the same call ``ida_eval.load_model`` makes). Folded
   norm gains are re-read and unfolded (``w = gamma - 1`` in float32, rounded once) where the
   architecture's norms add 1 at run time (``mxfp8_codec.layout.norm_adds_one`` by
   ``config.model_type``: NemotronLayerNorm1P, GemmaRMSNorm).
4. MXFP8-resident models on the CPU: an untied input embedding becomes a
   :class:`FileRowsEmbedding` (the same module, its class swapped): inference lookups read the
   needed rows from the file with ``os.preadv`` instead of touching the mapped table, whose page
   cache folios would otherwise become resident whole (up to 2 MiB per token). Same values.

At each forward an :class:`MXFP8Linear` decodes its weight, in the file's layout (no transpose
pass), into one scratch buffer shared by all projections on that device and dtype (one per thread;
no allocation per call): on CPU the codec's native C kernel (``decode_mxfp8(..., out=)``, one thread: see
:func:`_decode_cpu`); on other devices torch ops
(:func:`decode_into`). The values are those of the ``[out, in]`` matrix ``ida_eval.load_model``
holds, bit for bit; ``F.linear`` gets the ``[out, in]`` view of the buffer (for ``in_out`` files a
transposed view, which BLAS reads as it is). The same GEMM on the same values: on the CPU the
logits are bit-identical to the bf16 model ``load_model`` builds (tests/mxfp8_codec/test_hf.py
checks ``torch.equal`` on logits for both orientations; a BLAS that picked a different reduction
order for a transposed operand could change the last bits). When autograd would save the weight
(grad enabled and the input requires grad), a fresh tensor is used instead of the shared scratch.

``model.save_pretrained(out)`` writes our format again: the payload and scale bytes as loaded,
every other tensor in the file's orientation, norm convention and stored dtype (a folded gain is
written as its original stored bytes while the parameter still equals its unfolding; a bf16 tensor
of a float32 load as bf16 while its values fit), the first file's ``__metadata__`` and config.json's
``quantization_config``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.quantizers import HfQuantizer
from transformers.quantizers.auto import register_quantization_config, register_quantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from mxfp8_codec.constants import WEIGHTS_DTYPE
from mxfp8_codec.convert import numpy_dtype_of, torch_dtype_of
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import DTYPES, FLOAT_DTYPES, SCALE_SUFFIX, read_header, sniff_mxfp8
from mxfp8_codec.hf_config import FORMAT_VERSION, QUANT_METHOD, quantization_config_dict
from mxfp8_codec.layout import NORM_CONVENTIONS, ORIENTATIONS, is_projection_weight, norm_adds_one, unfold_norm
from mxfp8_codec.numerics import decode_mxfp8, decode_mxfp8_split
from mxfp8_codec.reader import open_mxfp8

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
    "quantization_config_dict",
]


class MXFP8LoadError(MXFP8Error):
    """A checkpoint cannot be loaded into the model; the message names the file and the tensor."""


@contextlib.contextmanager
def _as_load_error() -> Iterator[None]:
    """Inside ``from_pretrained`` every codec error (a header that fails validation, a missing shard,
    a NaN scale byte) is the documented :class:`MXFP8LoadError`, with the codec's one-line message.
    Usable as a decorator too."""
    try:
        yield
    except MXFP8LoadError:
        raise
    except MXFP8Error as exc:
        raise MXFP8LoadError(str(exc)) from None


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
        **kwargs: Any,
    ) -> None:
        self.quant_method = QUANT_METHOD
        self.orientation = orientation
        self.norm_convention = norm_convention
        self.format_version = str(format_version)
        self.weights_dtype = weights_dtype
        self.scale_rule = scale_rule
        self.dequantize = dequantize
        unknown = sorted(k for k in kwargs if k != "quant_method")
        if unknown:
            raise ValueError(f"MXFP8Config: unknown fields {unknown}")
        self.post_init()

    def post_init(self) -> None:
        """Validate every field's type and value (actionable ``ValueError`` naming the key)."""
        if not isinstance(self.dequantize, bool):  # "dequantize": "no" in a config.json must not mean True
            raise ValueError(f"MXFP8Config: dequantize must be true or false, got {self.dequantize!r}")
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
        return {"dequantize": self.dequantize}


def _allow_loading_attributes() -> None:
    """transformers merges loading attributes (``dequantize``) from a passed config into the
    checkpoint's only for config classes in ``LOADING_ATTRIBUTES_CONFIG_TYPES``; add ours there
    (otherwise ``MXFP8Config(dequantize=True)`` would be ignored with a warning)."""
    from transformers.quantizers import auto

    types = getattr(auto, "LOADING_ATTRIBUTES_CONFIG_TYPES", None)
    if isinstance(types, tuple) and MXFP8Config not in types:
        auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (*types, MXFP8Config)


_allow_loading_attributes()


# --------------------------------------------------------------------------- decode


_KERNEL_DTYPES = (torch.bfloat16, torch.float32)  # what the decode kernels write; other dtypes go through float32


def _kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a weight of ``dtype`` is decoded in: itself when a kernel writes it (bf16, f32),
    else float32, rounded once into ``dtype`` afterwards (float32 holds every decoded value exactly)."""
    return dtype if dtype in _KERNEL_DTYPES else torch.float32


def decode_into(payload: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, *, transpose: bool) -> torch.Tensor:
    """Decode MXFP8 ``payload`` (uint8 ``[R, C]``) into ``out`` with torch ops, no allocation of
    ``out``'s size: ``out`` is ``[R, C]`` (or ``[C, R]`` with ``transpose``), bfloat16 or float32.

    ``e4m3 -> out dtype`` is exact; the per-block factor ``2^(s - 127)`` comes from the UE8M0 byte
    as ``float8_e8m0fnu`` (byte 255 -> NaN, byte 0 -> 2^-127, both representable in bf16/f32), and
    the product is rounded once (torch multiplies bf16 in float32 and rounds): the codec's rule,
    bit for bit (tests compare with ``decode_mxfp8`` over every code and scale byte). Used on
    non-CPU devices; partial blocks (``C % 32 != 0``) go through the codec.
    """
    rows, cols = payload.shape
    if cols % 32 or out.dtype not in _KERNEL_DTYPES:
        decode_mxfp8(payload, scales, dtype=out.dtype, out=out, transpose=transpose)
        return out
    factor = scales.view(torch.float8_e8m0fnu).to(out.dtype).unsqueeze(-1)  # [R, C/32, 1]: 1/32 of the size
    if not transpose:
        view = out.view(rows, cols // 32, 32)
        view.copy_(payload.view(torch.float8_e4m3fn).view(rows, cols // 32, 32))
        view.mul_(factor)
        return out
    view = out.t().view(rows, cols // 32, 32)  # out is [C, R]: its transpose is a strided [R, C] view
    view.copy_(payload.view(torch.float8_e4m3fn).view(rows, cols // 32, 32))
    view.mul_(factor)
    return out


_pool_lock = threading.Lock()
_pool: Any = None


def _threads() -> Any:
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads() - 1), thread_name_prefix="mxfp8-hf")
        return _pool


@functools.cache
def _torch_openmp_runtime() -> str | None:
    """The path of the OpenMP runtime torch's intra-op threads belong to, or None.

    Found among the libraries this process has mapped (``/proc/self/maps``): a ``libgomp``,
    ``libomp`` or ``libiomp5`` inside torch's installation (``torch/lib``, ``torch.libs``), else
    the only one loaded; None when torch's parallel backend is not OpenMP, or where that cannot
    be told (no /proc, several runtimes)."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps") as f:
            fields = [line.split(maxsplit=5) for line in f]
    except OSError:
        return None
    paths = {f[5].strip() for f in fields if len(f) == 6}
    runtimes = sorted(p for p in paths if re.match(r"lib(gomp|omp|iomp5)\b", Path(p).name))
    home = Path(torch.__file__).resolve().parent  # torch/ (torch/lib) and its sibling torch.libs
    own = [
        p for p in runtimes if any(Path(p).resolve().is_relative_to(d) for d in (home, home.with_name("torch.libs")))
    ]
    found = own or runtimes
    return found[0] if len(found) == 1 else None


def _decode_cpu(
    payload: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, transpose: bool, name: str, *, split: bool = False
) -> None:
    """The codec's C kernel into ``out`` (same bits however it is split).

    A forward's decode (``transpose=False``) runs on torch's own OpenMP thread team
    (``decode_mxfp8(team=...)``), ``torch.get_num_threads()`` wide. A decode on threads of our own
    made forwards slower, not faster: torch's OpenMP threads keep spinning after a GEMM and a
    competing thread fought them (64-token forwards ~1.5x, greedy tokens ~1.7x slower than one
    thread); on torch's team there is nothing to fight (benchmarks/bench_hf.py). With ``split``
    (loading, transposing decodes) the pieces go to a thread pool, when no GEMM is running."""
    if not split:  # the forward's path: no pool, no lock
        runtime = _torch_openmp_runtime()
        team = (runtime, torch.get_num_threads()) if runtime and torch.get_num_threads() > 1 else None
        decode_mxfp8(payload, scales, dtype=out.dtype, out=out, transpose=transpose, name=name, team=team)
        return
    decode_mxfp8_split(
        payload, scales, out, pool=_threads(), parts=min(torch.get_num_threads(), 8), transpose=transpose, name=name
    )


def _prepare_cpu_decode(dtype: torch.dtype) -> None:
    """Do at load what the first CPU forward would otherwise do once: load (or build) the native
    kernel, its decode table and the OpenMP runtime, with one tiny decode through the forward's
    path. Inside a forward the same work took ~0.2 s rather than ~0.05 s (torch's OpenMP threads
    spin beside it). ``dtype`` is the model's: every dtype :class:`MXFP8Linear` takes (float16 and
    float64 decode through float32, :func:`_kernel_dtype`)."""
    block = torch.zeros((2, 32), dtype=torch.uint8)
    out = torch.empty((2, 32), dtype=_kernel_dtype(dtype))
    _decode_cpu(block, torch.full((2, 1), 127, dtype=torch.uint8), out, False, "warm-up")


class _Scratch:
    """One decode buffer per (thread, device, dtype), grown to the largest weight: every
    MXFP8Linear on that device decodes into it (a forward runs one layer at a time). Per thread,
    so that forwards of the same model in several threads never share a buffer."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def _buffers(self) -> dict[tuple[str, torch.dtype], torch.Tensor]:
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = {}
        return buffers

    def get(self, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (str(device), dtype)
        n = shape[0] * shape[1]
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = torch.empty(n, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:n].view(shape)

    def clear(self) -> None:
        """Free this thread's buffers."""
        self._buffers.clear()


SCRATCH = _Scratch()


class MXFP8Linear(nn.Module):
    """A projection whose weight stays MXFP8 in memory and is decoded at each forward.

    Buffers (not in ``state_dict``: ``save_pretrained`` goes through the quantizer):
    ``payload`` (uint8 E4M3 codes) and ``scales`` (uint8 UE8M0 bytes), both exactly as stored in
    the file -- ``[in, out]`` / ``[in, ceil(out / 32)]`` for ``orientation="in_out"``, ``[out, in]``
    / ``[out, ceil(in / 32)]`` for ``"out_in"``. ``bias`` is an ordinary parameter.

    Attributes:
        in_features, out_features: as ``nn.Linear``.
        orientation: the file's layout of ``payload``.
        dtype: the decoded weight's dtype (the model dtype).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: nn.Parameter | None,
        orientation: str,
        dtype: torch.dtype,
        name: str = "",
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.orientation = orientation
        self.dtype = dtype
        self.name = name
        self.bias = bias
        self.register_buffer("payload", None, persistent=False)
        self.register_buffer("scales", None, persistent=False)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"orientation={self.orientation}, dtype={self.dtype}"
        )

    @property
    def stored_shape(self) -> tuple[int, int]:
        return (
            (self.in_features, self.out_features)
            if self.orientation == "in_out"
            else (self.out_features, self.in_features)
        )

    def decode_weight(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight as ``nn.Linear`` holds it: ``[out, in]``, contiguous, ``self.dtype``; into
        ``out`` when given (else a new tensor)."""
        if out is None:
            out = torch.empty((self.out_features, self.in_features), dtype=self.dtype, device=self._payload().device)
        return self._decode(out, transpose=self.orientation == "in_out")

    def decode_stored(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight decoded in the file's layout (``stored_shape``, contiguous, ``self.dtype``):
        ``[in, out]`` for ``in_out``, i.e. the transpose of :meth:`decode_weight`, the same values.
        No transpose pass: what each forward decodes (into ``out``, else a new tensor)."""
        if out is None:
            out = torch.empty(self.stored_shape, dtype=self.dtype, device=self._payload().device)
        return self._decode(out, transpose=False)

    def _payload(self) -> torch.Tensor:
        if self.payload is None or self.scales is None:
            raise MXFP8Error(f"{self.name}: MXFP8 weight not loaded")
        return self.payload

    def _decode(self, out: torch.Tensor, *, transpose: bool) -> torch.Tensor:
        if out.dtype not in _KERNEL_DTYPES:
            tmp = torch.empty(out.shape, dtype=_kernel_dtype(out.dtype), device=out.device)
            return out.copy_(self._decode(tmp, transpose=transpose))  # exact in float32: rounded once here
        payload = self._payload()
        if payload.device.type == "cpu":
            _decode_cpu(payload, self.scales, out, transpose, self.name)
        else:
            decode_into(payload, self.scales, out, transpose=transpose)
        return out

    @property
    def weight(self) -> torch.Tensor:
        """A decoded copy (``[out, in]``, model dtype) -- for inspection; the module keeps MXFP8."""
        return self.decode_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Decode in the file's layout and hand F.linear the [out, in] view of it: for in_out files
        # a transposed view, which BLAS takes as it is (no transpose pass over the weight).
        if torch.is_grad_enabled() and x.requires_grad:  # autograd keeps the weight: no shared scratch
            stored = self.decode_stored()
        else:
            stored = self.decode_stored(SCRATCH.get(self.stored_shape, self.dtype, self._payload().device))
        w = stored.t() if self.orientation == "in_out" else stored
        return F.linear(x, w.to(x.dtype) if w.dtype != x.dtype else w, self.bias)


class _FileRows:
    """Positional reads of one stored 2-D tensor's rows from its checkpoint file.

    Holds its own descriptor of the file as it was opened at load, so a checkpoint replaced on
    disk (our writers and ``save_pretrained`` replace files) is still read as loaded. A copy
    (``copy.deepcopy``, pickling) has no descriptor: the module it belongs to then looks rows up
    in its weight as ``nn.Embedding`` does.
    """

    def __init__(self, path: str, name: str, offset: int, row_bytes: int) -> None:
        self.path, self.name, self.offset, self.row_bytes = path, name, offset, row_bytes
        self.fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, rows: list[int], out: np.ndarray) -> None:
        """Read ``rows`` into ``out`` (uint8 ``[len(rows), row_bytes]``)."""
        assert self.fd is not None
        for i, row in enumerate(rows):
            got = os.preadv(self.fd, [out[i]], self.offset + row * self.row_bytes)
            if got != self.row_bytes:
                raise MXFP8Error(
                    f"{self.path}: tensor {self.name!r}: row {row} is cut short ({got} of {self.row_bytes} bytes; "
                    "was the file truncated or rewritten in place while the model was loaded?)"
                )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "fd": None}

    def __del__(self) -> None:
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
            self.fd = None


class FileRowsEmbedding(nn.Embedding):
    """``nn.Embedding`` whose inference lookups read the looked-up rows from the checkpoint file.

    transformers keeps a bf16 embedding as a view of the mapped file. A lookup then maps, on
    kernels with large page-cache folios (Linux >= 6.18 on ext4, as measured), the whole folio
    around each row -- up to 2 MiB per token: 64 tokens made ~65 MiB of a 94 MiB table resident.
    Reading each needed row with ``os.preadv`` instead adds only the rows to the process; the
    table stays in the page cache, as the rest of a mapped checkpoint does before it is touched.
    The rows are the stored bytes, so the output equals ``F.embedding``'s bit for bit.

    The weight parameter is unchanged (``state_dict``, ``save_pretrained`` and autograd see it).
    A lookup falls back to ``nn.Embedding.forward`` -- the weight as it is now -- whenever the
    file may not hold it: the parameter was replaced or moved (``.to``, ``.data =``), changed in
    place through autograd's view of it (its version counter moved), or gradients are wanted, or
    ``max_norm`` is set, or the indices are not on the CPU or out of range (``nn.Embedding``'s
    error), or not integers. Only :class:`MXFP8HfQuantizer` installs it (see ``_read_rows_from_file``).
    """

    _rows: _FileRows | None = None
    _weight_key: tuple[int, int, torch.dtype, tuple[int, ...]] | None = None

    def _weight_state(self) -> tuple[int, int, torch.dtype, tuple[int, ...]]:
        w = self.weight
        return (w.data_ptr(), w._version, w.dtype, tuple(w.shape))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = self._rows
        if (
            rows is None
            or rows.fd is None
            or self.max_norm is not None
            or input.device.type != "cpu"
            or (torch.is_grad_enabled() and self.weight.requires_grad)
            or self._weight_state() != self._weight_key
            or input.numel() == 0
            or input.dtype not in (torch.int64, torch.int32)
        ):
            return super().forward(input)
        flat = input.reshape(-1)
        if int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings:
            return super().forward(input)  # nn.Embedding's own IndexError
        unique, inverse = torch.unique(flat, return_inverse=True)
        table = torch.empty((unique.numel(), self.embedding_dim), dtype=self.weight.dtype)
        rows.read(unique.tolist(), table.view(torch.uint8).numpy())
        return table[inverse].view(*input.shape, self.embedding_dim)


# --------------------------------------------------------------------------- plan


@dataclass
class _Stored:
    """Where and how one tensor is stored."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    quantized: bool
    orientation: str
    norm_convention: str


@dataclass
class _Plan:
    stored: dict[str, _Stored] = field(default_factory=dict)
    projections: dict[str, tuple[int, int]] = field(default_factory=dict)  # module name -> (out, in)
    unfold: list[str] = field(default_factory=list)  # norm weight names to unfold after loading
    metadata: dict[str, str] = field(default_factory=dict)  # first MXFP8 file's __metadata__
    orientation: str = "in_out"
    norm_convention: str = "zero_centered"
    folded_originals: dict[str, torch.Tensor] = field(default_factory=dict)


def _tied_targets(model: Any) -> set[str]:
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(text_config, "tie_word_embeddings", False):
        return set()
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return {str(k) for k in (tied.keys() if isinstance(tied, Mapping) else tied)}


def _plan(model: Any, files: Sequence[str], qc: MXFP8Config) -> _Plan:
    """Read and validate every header against the config and the model; raise on the first problem."""
    if not files:
        raise MXFP8LoadError("no checkpoint files to load (mxfp8_codec reads safetensors checkpoints)")
    plan = _Plan()
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
                plan.stored[name] = _Stored(
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
    tied = _tied_targets(model)
    for name, t in expected.items():
        module_name, _, leaf = name.rpartition(".")
        if leaf == "weight" and is_projection_weight(name) and t.dim() == 2:
            module = model.get_submodule(module_name)
            if type(module) is not nn.Linear:
                raise MXFP8LoadError(f"{name}: projection module is {type(module).__name__}, not nn.Linear")
            plan.projections[module_name] = (module.out_features, module.in_features)
    for name, t in expected.items():
        if name in tied and name not in plan.stored:
            continue
        s = plan.stored.get(name)
        if s is None:
            raise MXFP8LoadError(
                f"{files[0] if len(files) == 1 else Path(files[0]).parent}: tensor {name!r} is missing "
                f"(the {type(model).__name__} model needs it)"
            )
        want = tuple(t.shape)
        if name.removesuffix(".weight") in plan.projections and name.endswith(".weight") and s.orientation == "in_out":
            want = want[::-1]
        if s.shape != want:
            raise MXFP8LoadError(
                f"{s.path}: tensor {name!r} has shape {list(s.shape)} but {type(model).__name__} needs "
                f"{list(want)} (orientation={s.orientation})"
            )
        if s.quantized and not (name.endswith(".weight") and name.removesuffix(".weight") in plan.projections):
            raise MXFP8LoadError(
                f"{s.path}: tensor {name!r} is MXFP8 but is not a projection weight; transformers loading keeps "
                "only projections in MXFP8 (python -m mxfp8_codec dequantize makes a plain copy)"
            )
        if s.norm_convention == "folded" and norm_adds_one(
            name, t.dim(), getattr(model.config, "model_type", None), source=s.path
        ):  # the per-architecture rule of mxfp8_codec.layout (docs/format.md section 9)
            plan.unfold.append(name)
    unexpected = sorted(set(plan.stored) - persistent - non_persistent - tied)
    if unexpected:
        s = plan.stored[unexpected[0]]
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise MXFP8LoadError(
            f"{s.path}: tensor {unexpected[0]!r}{more} is not a tensor of {type(model).__name__}; "
            "wrong architecture in config.json?"
        )
    return plan


def _reader(readers: dict[str, Any], path: str, **kwargs: Any) -> Any:
    """The reader of ``path`` in ``readers``, opened with ``kwargs`` (and kept there) on first use;
    the loader closes them all at the end."""
    r = readers.get(path)
    if r is None:
        r = readers[path] = open_mxfp8(path, **kwargs)
    return r


def _read_rows_from_file(model: Any, plan: _Plan, readers: dict[str, Any]) -> None:
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
    emb._rows = _FileRows(s.path, name, r.file_offset(name), row_bytes=emb.embedding_dim * emb.weight.element_size())
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


def _ignore_patterns(module_names: Iterable[str]) -> list[str]:
    """Patterns for transformers' ``_keys_to_ignore_on_load_unexpected`` that match the stored
    ``X.weight`` / ``X.weight.scale`` of every projection in ``module_names``: one pattern per name
    shape, layer numbers as ``\\d+`` (``model.layers.0.mlp.up_proj`` ... ``model.layers.N.mlp.up_proj``
    share one). transformers joins all patterns into one alternation and compiles it at every load;
    one pattern per projection (2 x 72 for a 12-layer model) cost ~0.3 s of ``re`` parsing, more
    than the rest of the load. Matching a few more names than were replaced cannot hide anything:
    :func:`_plan` has already checked every stored tensor against the model."""
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


# --------------------------------------------------------------------------- quantizer


@register_quantizer(QUANT_METHOD)
class MXFP8HfQuantizer(HfQuantizer):
    """Loads (and saves) our MXFP8 checkpoints through ``from_pretrained`` / ``save_pretrained``."""

    requires_calibration = False
    requires_parameters_quantization = False

    def __init__(self, quantization_config: MXFP8Config, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self._plan: _Plan | None = None

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

    @_as_load_error()
    def _process_model_before_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        files = kwargs.get("checkpoint_files")
        if files is None:
            raise MXFP8LoadError("this transformers version does not pass checkpoint files to quantizers")
        dtype = kwargs.get("dtype") or getattr(model.config, "dtype", None) or torch.bfloat16
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        plan = _plan(model, [str(f) for f in files], self.quantization_config)
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
        ignore = _ignore_patterns(plan.projections)
        existing = getattr(model, "_keys_to_ignore_on_load_unexpected", None)
        if isinstance(existing, set):  # transformers >= 5.1 merges a set, 5.0 a list
            model._keys_to_ignore_on_load_unexpected = existing | set(ignore)
        else:
            model._keys_to_ignore_on_load_unexpected = [*(existing or []), *ignore]
        self._plan = plan
        self._dtype = dtype
        return model

    @_as_load_error()
    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        plan = self._plan
        assert plan is not None
        readers: dict[str, Any] = {}
        try:
            for module_name in plan.projections:
                name = module_name + ".weight"
                s = plan.stored[name]
                r = _reader(readers, s.path, copy_on_write=True)  # writable views for torch.from_numpy
                module = model.get_submodule(module_name)
                device = _module_device(model, module_name)
                if not self._load_projection(model, module_name, module, r, name, s, device):
                    r.release_pages(name)  # read and copied: drop the file pages from our resident set
            if not self.quantization_config.dequantize:
                _read_rows_from_file(model, plan, readers)
                if any(m.payload.device.type == "cpu" for _, m in mxfp8_modules(model)):
                    _prepare_cpu_decode(self._dtype)
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
        if self.quantization_config.dequantize:  # a plain bf16 model: save_pretrained writes plain safetensors
            self.remove_quantization_config(model)
        return model

    def _load_projection(
        self, model: Any, module_name: str, module: MXFP8Linear, r: Any, name: str, s: _Stored, device: torch.device
    ) -> bool:
        """Load one projection; True when its tensors still view the file's mapping (CPU, MXFP8).
        A NaN scale byte (0xFF) is refused first: it would make its whole block NaN, and it costs one
        vectorised pass over 1/32 of the weight's bytes to know."""
        flip = s.orientation == "in_out"
        r.check_scales(name)
        if s.quantized and not self.quantization_config.dequantize:
            payload, scales = r.raw_view(name)  # views of the private mapping: no copy, no read yet
            module.payload = torch.from_numpy(payload).to(device)
            module.scales = torch.from_numpy(scales).to(device)
            return device.type == "cpu"
        # plain bf16 Linear: decoded once (MXFP8) or read (stored plain), in nn.Linear's layout
        if s.quantized:
            shape = (module.out_features, module.in_features)
            if device.type == "cpu" and self._dtype in _KERNEL_DTYPES:
                weight = torch.empty(shape, dtype=self._dtype)
                payload, scales = r.raw_view(name)
                _decode_cpu(torch.from_numpy(payload), torch.from_numpy(scales), weight, flip, name, split=True)
            else:
                tmp = MXFP8Linear(
                    module.in_features,
                    module.out_features,
                    bias=None,
                    orientation=s.orientation,
                    dtype=self._dtype,
                    name=name,
                )
                payload, scales = r.raw_view(name)
                tmp.payload = torch.from_numpy(payload).to(device)
                tmp.scales = torch.from_numpy(scales).to(device)
                weight = tmp.decode_weight()
        else:
            weight = r.get(name, framework="pt", dtype=self._dtype)
            if flip:
                weight = weight.t().contiguous()
        linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
        linear.weight = nn.Parameter(weight.to(device), requires_grad=True)
        if module.bias is not None:
            linear.bias = module.bias
        parent_name, _, leaf = module_name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, linear)
        return False

    # ------------------------------------------------------------------ save

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return bool(self.quantization_config.dequantize)

    def get_state_dict_and_metadata(
        self, model: Any, *args: Any, **kwargs: Any
    ) -> tuple[dict[str, torch.Tensor], dict]:
        """Our format again: payload/scale bytes as loaded, other tensors in the file's orientation,
        norm convention and stored dtype, the first file's metadata.

        A plain floating tensor is written in the dtype it was stored in (a bf16 norm of a model
        loaded with ``dtype=torch.float32`` is written as bf16 again) whenever that loses nothing
        (its values round-trip); a value the stored dtype cannot hold (changed after loading) keeps
        the model's dtype rather than being rounded silently."""
        plan = self._plan
        assert plan is not None
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

    def _dequantize(self, model: Any, dtype: torch.dtype | None = None) -> Any:
        for module_name, module in list(model.named_modules()):
            if isinstance(module, MXFP8Linear):
                weight = module.decode_weight()
                linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
                linear.weight = nn.Parameter(weight if dtype is None else weight.to(dtype))
                if module.bias is not None:
                    linear.bias = module.bias
                parent_name, _, leaf = module_name.rpartition(".")
                setattr(model.get_submodule(parent_name) if parent_name else model, leaf, linear)
        return model


def mxfp8_modules(model: nn.Module) -> Iterable[tuple[str, MXFP8Linear]]:
    """``(name, module)`` of every MXFP8-resident projection in ``model``."""
    return ((n, m) for n, m in model.named_modules() if isinstance(m, MXFP8Linear))


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
        with _as_load_error():  # before transformers opens them itself (its header errors name no file)
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
