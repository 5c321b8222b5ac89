"""The torch modules of the transformers integration: an MXFP8-resident ``nn.Linear`` and an embedding
that reads its rows from the checkpoint file, with the decodes they run at each forward.

:class:`MXFP8Linear` keeps a projection's E4M3 payload and UE8M0 scale bytes exactly as the file stores
them and decodes the weight at each forward (in the file's layout with no transpose pass where the GEMM
allows, :func:`gemm_takes_transposed`), into one scratch buffer shared by all projections on that device and
dtype (:data:`SCRATCH`, one per thread): on the CPU
the codec's native C kernel on torch's own OpenMP team (:func:`decode_cpu`), on CUDA one Triton kernel
(:mod:`mxfp8_codec.triton_decode`) where Triton is installed, else torch ops (:func:`decode_into`).
Under ``torch.compile`` a projection decodes through one registered operator instead
(:func:`decode_op`, ``mxfp8_codec::decode``), so a compiled forward is one graph.
:func:`use_fused_linear` (opt-in) lets few-token BF16 forwards on CUDA skip the decoded weight: one Triton
kernel decodes each weight tile inside the GEMM (:func:`linear_fused_op`, ``mxfp8_codec::linear_fused``).
:class:`FileRowsEmbedding` answers inference lookups with ``os.preadv`` of the needed rows. Both are
installed by :class:`mxfp8_codec.hf.MXFP8HfQuantizer` through :mod:`mxfp8_codec.hf_load`; nothing here
imports transformers.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ida_common.cli import error_line
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.numerics import decode_mxfp8, decode_mxfp8_split
from mxfp8_codec.reader import pread_into

__all__ = [
    "DECODE_BACKENDS",
    "KERNEL_DTYPES",
    "SCRATCH",
    "FileRows",
    "FileRowsEmbedding",
    "MXFP8Linear",
    "decode_cpu",
    "decode_into",
    "decode_op",
    "gemm_takes_transposed",
    "kernel_dtype",
    "linear_fused_op",
    "mxfp8_modules",
    "prepare_cpu_decode",
    "use_fused_linear",
]

KERNEL_DTYPES = (torch.bfloat16, torch.float32)  # what the decode kernels write; other dtypes go through float32


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a weight of ``dtype`` is decoded in: itself when a kernel writes it (bf16, f32),
    else float32, rounded once into ``dtype`` afterwards (float32 holds every decoded value exactly)."""
    return dtype if dtype in KERNEL_DTYPES else torch.float32


DECODE_BACKENDS = ("auto", "triton", "torch")


def decode_into(
    payload: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, *, transpose: bool, backend: str = "auto"
) -> torch.Tensor:
    """Decode MXFP8 ``payload`` (uint8 ``[R, C]``) into ``out``, no allocation of ``out``'s size: ``out``
    is ``[R, C]`` (or ``[C, R]`` with ``transpose``), bfloat16 or float32. The codec's bits either way.

    ``backend``: ``"auto"`` (default) runs one Triton kernel (:mod:`mxfp8_codec.triton_decode`) on
    CUDA tensors when Triton is importable, else torch ops (also after the kernel once failed to compile
    or launch: one warning, then torch ops for the process); ``"triton"`` / ``"torch"`` pick one (on
    the CPU ``"triton"`` runs only under ``TRITON_INTERPRET=1``: the tests). Partial blocks
    (``C % 32 != 0``) and other dtypes go through the codec (``decode_mxfp8``) whatever the backend.

    The torch ops: ``e4m3 -> out dtype`` is exact; the per-block factor ``2^(s - 127)`` comes from the
    UE8M0 byte as ``float8_e8m0fnu`` (byte 255 -> NaN, byte 0 -> 2^-127, both representable in
    bf16/f32), and the product is rounded once (torch multiplies bf16 in float32 and rounds): the
    codec's rule, bit for bit (tests compare both backends with ``decode_mxfp8`` over every code and
    scale byte).
    """
    if backend not in DECODE_BACKENDS:
        raise MXFP8Error(f"decode_into: backend must be one of {DECODE_BACKENDS}, got {backend!r}")
    if payload.dim() != 2:
        raise MXFP8Error(f"decode_into: payload must be 2-D [R, C], got shape {tuple(payload.shape)}")
    rows, cols = payload.shape
    if cols % 32 or out.dtype not in KERNEL_DTYPES:
        decode_mxfp8(payload, scales, dtype=out.dtype, out=out, transpose=transpose)
        return out
    if backend == "triton":
        from mxfp8_codec.triton_decode import decode_mxfp8_triton  # imports triton: only where it runs

        return decode_mxfp8_triton(payload, scales, out, transpose=transpose)
    if backend == "auto" and payload.device.type == "cuda" and _triton_available() and _TRITON_FAILED is None:
        from mxfp8_codec.triton_decode import decode_mxfp8_triton

        try:
            return decode_mxfp8_triton(payload, scales, out, transpose=transpose)
        except Exception as e:  # noqa: BLE001  (whatever Triton raises while it compiles or launches)
            _give_up_triton(e)  # then the torch ops below: the same values
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


_TRITON_FAILED: str | None = None  # why "auto" stopped using Triton in this process, once it had to


def _give_up_triton(error: Exception) -> None:
    """Where Triton cannot compile or launch the decode kernel (a Triton or driver this code has not met),
    ``"auto"`` decodes with torch ops from then on: the same values, three kernels instead of one. Said once,
    as a warning naming the error; ``backend="triton"`` raises it instead."""
    global _TRITON_FAILED
    _TRITON_FAILED = error_line(error)
    warnings.warn(
        f"mxfp8_codec: the Triton MXFP8 decode failed here ({_TRITON_FAILED}); decoding with torch ops from "
        "now on (the same values, slower)",
        RuntimeWarning,
        stacklevel=3,
    )


@functools.cache
def _triton_available() -> bool:
    """Whether Triton imports here (else CUDA tensors decode with torch ops); asked at the first CUDA
    decode, so a CPU-only process never imports Triton."""
    from mxfp8_codec import triton_decode

    return triton_decode.AVAILABLE


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


def decode_cpu(
    payload: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, transpose: bool, name: str, *, split: bool = False
) -> None:
    """The codec's C kernel into ``out`` (same bits however it is split).

    A forward's decode (in the file's layout, or transposed where :func:`gemm_takes_transposed` says no) runs
    on torch's own OpenMP thread team (``decode_mxfp8(team=...)``), ``torch.get_num_threads()`` wide. A decode
    on threads of our own made forwards slower, not faster: torch's OpenMP threads keep spinning after a GEMM
    and a competing thread fought them (64-token forwards ~1.5x, greedy tokens ~1.7x slower than one thread);
    on torch's team there is nothing to fight (benchmarks/bench_hf.py). With ``split`` (loading) the pieces go
    to a thread pool, when no GEMM is running."""
    if not split:  # the forward's path: no pool, no lock
        runtime = _torch_openmp_runtime()
        team = (runtime, torch.get_num_threads()) if runtime and torch.get_num_threads() > 1 else None
        decode_mxfp8(payload, scales, dtype=out.dtype, out=out, transpose=transpose, name=name, team=team)
        return
    decode_mxfp8_split(
        payload, scales, out, pool=_threads(), parts=min(torch.get_num_threads(), 8), transpose=transpose, name=name
    )


def prepare_cpu_decode(dtype: torch.dtype) -> None:
    """Do at load what the first CPU forward would otherwise do once: load (or build) the native
    kernel, its decode table and the OpenMP runtime, with one tiny decode through the forward's
    path. Inside a forward the same work took ~0.2 s rather than ~0.05 s (torch's OpenMP threads
    spin beside it). ``dtype`` is the model's: every dtype :class:`MXFP8Linear` takes (float16 and
    float64 decode through float32, :func:`kernel_dtype`)."""
    block = torch.zeros((2, 32), dtype=torch.uint8)
    out = torch.empty((2, 32), dtype=kernel_dtype(dtype))
    decode_cpu(block, torch.full((2, 1), 127, dtype=torch.uint8), out, False, "warm-up")


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


@torch.library.custom_op("mxfp8_codec::decode", mutates_args=())
def decode_op(
    payload: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, name: str, transpose: bool
) -> torch.Tensor:
    """A weight decoded into a new tensor (in its stored layout, or transposed), as one operator that
    ``torch.compile`` sees whole (:meth:`MXFP8Linear.forward` calls it while compiling): the graph holds no
    Python of ours, so a compiled decoding step (CUDA graphs) replays the decode kernel with the rest."""
    shape = payload.shape[::-1] if transpose else payload.shape
    out = torch.empty(shape, dtype=kernel_dtype(dtype), device=payload.device)
    if payload.device.type == "cpu":
        decode_cpu(payload, scales, out, transpose, name)
    else:
        decode_into(payload, scales, out, transpose=transpose)
    return out if out.dtype == dtype else out.to(dtype)  # float16/float64: exact in float32, rounded once


@decode_op.register_fake
def _decode_shape(
    payload: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, name: str, transpose: bool
) -> torch.Tensor:
    return payload.new_empty(payload.shape[::-1] if transpose else payload.shape, dtype=dtype)


def _onednn_bf16() -> bool:
    """Whether this CPU runs torch's BF16 GEMMs on oneDNN (AVX-512 and newer: ``ideep``'s check, which torch
    exposes as ``torch.ops.mkldnn._is_mkldnn_bf16_supported``)."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(torch.backends.mkldnn.is_available() and probe is not None and probe())
    except RuntimeError:
        return False


_ONEDNN_BF16 = _onednn_bf16()  # at import: torch.compile may not trace torch.backends' functions
_ONEDNN_BF16_CHECKED = False


def _check_onednn_bf16_layouts() -> None:
    """Once per process, when the first projection is built (never inside a compiled forward): where oneDNN
    runs BF16 GEMMs, check the premise of :func:`gemm_takes_transposed` on three products, that a transposed
    weight gets the bits of the contiguous one (measured on AMD EPYC and Intel Xeon; another CPU or torch may
    differ). Where it does not hold, the projections decode into ``[out, in]`` instead, and a warning says so."""
    global _ONEDNN_BF16, _ONEDNN_BF16_CHECKED
    if _ONEDNN_BF16_CHECKED or not _ONEDNN_BF16:
        return
    _ONEDNN_BF16_CHECKED = True
    g = torch.Generator().manual_seed(0)
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = True  # oneDNN's sums, also where a user turned it off for now
    try:
        with torch.no_grad():
            same = True
            for tokens, k in ((1, 512), (7, 512), (64, 1024)):  # device="cpu": models are built on the meta device
                w = torch.randn(k, 256, generator=g, device="cpu").to(torch.bfloat16)  # a decoded [in, out] weight
                x = torch.randn(tokens, k, generator=g, device="cpu").to(torch.bfloat16)
                same = torch.equal(F.linear(x, w.t()), F.linear(x, w.t().contiguous()))
                if not same:
                    break
    finally:
        torch.backends.mkldnn.enabled = enabled
    if not same:
        _ONEDNN_BF16 = False
        warnings.warn(
            f"mxfp8_codec: torch {torch.__version__}'s oneDNN BF16 GEMM sums a transposed weight in another "
            f"order on this CPU ({tokens} x {k} x 256): resident projections decode into [out, in] "
            "(the bits of dequantize=True, slower)",
            RuntimeWarning,
            stacklevel=3,
        )


def gemm_takes_transposed(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``F.linear`` may take an ``in_out`` weight as the transposed view of its ``[in, out]`` decode
    (no transpose pass) and still give the bits it gives for the ``[out, in]`` tensor of
    ``dequantize=True``. Where the GEMM's order of summation depends on the operand's layout it may not,
    and the weight is decoded into ``[out, in]`` (the codec's transposing decode) instead.

    * CUDA: yes (cuBLAS; bit-identical logits on the H200, scripts/device_check.sh).
    * CPU, BF16, torch's GEMM on oneDNN (AVX-512 CPUs, ``torch.backends.mkldnn.enabled``): yes, measured
      bit-identical on AMD EPYC and Intel Xeon (docs/format.md), and faster than the transposing decode.
      Checked again on this CPU when the first projection is built (``_check_onednn_bf16_layouts``).
    * CPU otherwise: no. Without oneDNN (AVX2 CPUs) torch's own BF16 GEMM sums a transposed operand in
      another order and takes ~60x as long (an AMD EPYC with AVX2: 3.8 s against 61 ms for a [64, 1536] x
      [1536, 6144] product); MKL's float32 GEMM on a single row differs by layout too.
    """
    if device.type != "cpu":
        return True
    return dtype == torch.bfloat16 and _ONEDNN_BF16 and bool(torch.backends.mkldnn.enabled)


@torch.library.custom_op("mxfp8_codec::linear_fused", mutates_args=())
def linear_fused_op(
    x: torch.Tensor, payload: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, orientation: str, name: str
) -> torch.Tensor:
    """``x @ W^T + bias`` with the weight decoded inside the GEMM's tiles (one Triton kernel,
    :func:`mxfp8_codec.triton_decode.linear_mxfp8_triton`), as one operator ``torch.compile`` sees whole:
    what :meth:`MXFP8Linear.forward` runs for few-token inputs after :func:`use_fused_linear`."""
    from mxfp8_codec.triton_decode import linear_mxfp8_triton

    return linear_mxfp8_triton(x, payload, scales, orientation=orientation, bias=bias, name=name)


@linear_fused_op.register_fake
def _linear_fused_shape(
    x: torch.Tensor, payload: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, orientation: str, name: str
) -> torch.Tensor:
    n = payload.shape[1] if orientation == "in_out" else payload.shape[0]
    return x.new_empty((x.shape[0], n), dtype=torch.bfloat16)


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
        fused_max_tokens: 0 (default): every forward decodes the weight, then ``F.linear`` -- logits
            bit-identical to ``MXFP8Config(dequantize=True)``. N > 0 (:func:`use_fused_linear`): a BF16
            inference forward on CUDA of at most N tokens runs one Triton kernel that decodes the weight in
            its GEMM tiles (:func:`linear_fused_op`): the same weight values, summed in another order.
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
        self.fused_max_tokens = 0
        self.register_buffer("payload", None, persistent=False)
        self.register_buffer("scales", None, persistent=False)
        _check_onednn_bf16_layouts()

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
        if out.dtype not in KERNEL_DTYPES:
            tmp = torch.empty(out.shape, dtype=kernel_dtype(out.dtype), device=out.device)
            return out.copy_(self._decode(tmp, transpose=transpose))  # exact in float32: rounded once here
        payload = self._payload()
        if payload.device.type == "cpu":
            decode_cpu(payload, self.scales, out, transpose, self.name)
        else:
            decode_into(payload, self.scales, out, transpose=transpose)
        return out

    @property
    def weight(self) -> torch.Tensor:
        """A decoded copy (``[out, in]``, model dtype) -- for inspection; the module keeps MXFP8."""
        return self.decode_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_max_tokens and self._fused_applies(x):
            y = linear_fused_op(
                x.reshape(-1, self.in_features), self._payload(), self.scales, self.bias, self.orientation, self.name
            )
            return y.view(*x.shape[:-1], self.out_features)
        # F.linear gets the [out, in] weight: for in_out files the transposed view of the file-layout
        # decode where the GEMM sums it as it sums [out, in] (no transpose pass), else decoded into
        # [out, in] (gemm_takes_transposed): the bits of dequantize=True either way.
        view = self.orientation == "in_out" and gemm_takes_transposed(x.device, x.dtype)  # the GEMM's dtype
        shape = self.stored_shape if view else (self.out_features, self.in_features)
        if torch.compiler.is_compiling():  # one opaque operator, a fresh output (no shared scratch)
            w = decode_op(
                self._payload(), self.scales, self.dtype, self.name, not view and self.orientation == "in_out"
            )
        elif torch.is_grad_enabled() and x.requires_grad:  # autograd keeps the weight: no shared scratch
            w = self.decode_stored() if view else self.decode_weight()
        else:
            scratch = SCRATCH.get(shape, self.dtype, self._payload().device)
            w = self.decode_stored(scratch) if view else self.decode_weight(scratch)
        w = w.t() if view else w
        return F.linear(x, w.to(x.dtype) if w.dtype != x.dtype else w, self.bias)

    def _fused_applies(self, x: torch.Tensor) -> bool:
        """Whether this forward takes the fused kernel (``fused_max_tokens`` > 0 asked for it): BF16 on CUDA,
        at most that many tokens, no gradient wanted, Triton importable, whole 32-value blocks."""
        return (
            x.is_cuda
            and x.dtype == torch.bfloat16 == self.dtype
            and x.numel() <= self.fused_max_tokens * self.in_features
            and not (
                torch.is_grad_enabled() and (x.requires_grad or (self.bias is not None and self.bias.requires_grad))
            )
            and self._payload().shape[1] % 32 == 0
            and _triton_available()
        )


def use_fused_linear(model: nn.Module, max_tokens: int = 64) -> int:
    """Let every :class:`MXFP8Linear` of ``model`` run BF16 inference forwards of at most ``max_tokens``
    tokens on CUDA as one Triton kernel that decodes the weight inside its GEMM tiles (``0``: back to
    decode + ``F.linear``, the default). Returns how many modules it set.

    What it trades: a decoding step (one token per sequence) is memory-bound, and decode-then-GEMM moves
    about 5 bytes per weight (the codes and scales read, the BF16 weight written and read back) where the
    fused kernel reads 1.03 and the BF16 model reads 2. The weights are the same values; the sums run in the
    kernel's order, not cuBLAS's, so logits may differ from ``MXFP8Config(dequantize=True)``'s in the last
    bits (near-ties of greedy decoding can flip). The estimate and the status: docs/format.md ("Few-token
    forwards on a GPU").
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise ValueError(f"use_fused_linear: max_tokens must be an integer >= 0, got {max_tokens!r}")
    count = 0
    for _, module in mxfp8_modules(model):
        module.fused_max_tokens = max_tokens
        count += 1
    return count


class FileRows:
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
            got = pread_into(self.fd, memoryview(out[i]), self.offset + row * self.row_bytes)
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
    error), or not integers, or while ``torch.compile`` traces it. Only
    :class:`mxfp8_codec.hf.MXFP8HfQuantizer` installs it (:func:`mxfp8_codec.hf_load.read_rows_from_file`).
    """

    _rows: FileRows | None = None
    _weight_key: tuple[int, int, torch.dtype, tuple[int, ...]] | None = None

    def _weight_state(self) -> tuple[int, int, torch.dtype, tuple[int, ...]]:
        w = self.weight
        return (w.data_ptr(), w._version, w.dtype, tuple(w.shape))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = self._rows
        if (
            torch.compiler.is_compiling()  # a compiled graph holds no file reads: the weight, same bits
            or rows is None
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


def mxfp8_modules(model: nn.Module) -> Iterable[tuple[str, MXFP8Linear]]:
    """``(name, module)`` of every MXFP8-resident projection in ``model``."""
    return ((n, m) for n, m in model.named_modules() if isinstance(m, MXFP8Linear))
