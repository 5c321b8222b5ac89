"""Counter-based random numbers for stochastic rounding, identical in numpy, PyTorch, C and CUDA.

The one home of the stream used by ``encode_mxfp8(..., rounding="stochastic")`` and by nvfp4_cuda's
stochastic rounding (NVFP4 quantization, the Lion master write-back, bfloat16 SR); the C/CUDA
spelling is ``mx_rng_word`` in ``mxfp8_codec/mxfp8.h`` (its constants are checked against this
module by tests/mxfp8_codec/test_native_header.py). torch is optional: the tensor functions import
it when called.

Stochastic rounding must give the *same bits* on the CPU reference and on the GPU, and must be
reproducible from ``(seed, step, tensor_id, element index)`` alone, independent of how work is split
into threads.  So there is no generator state: each element's random word is a pure function of its
key and index.

The mixing function is a 32-bit integer hash (the "degski" / hash-prospector style xorshift-multiply
hash, constant 0x045D9F3B = 73244475)::

    mix32(x): x = ((x >> 16) ^ x) * 0x045D9F3B mod 2**32
              x = ((x >> 16) ^ x) * 0x045D9F3B mod 2**32
              x =  (x >> 16) ^ x

It is a bijection on 32-bit words (xorshift and multiplication by an odd constant are invertible) and
every multiplication is of a value < 2**32 by a constant < 2**27, so it is computed exactly in int64
tensors (product < 2**59, no overflow) and natively with ``uint32_t`` wrap-around in CUDA.

Keys (Python ints, folded to 32 bits by ``fold(v) = (v mod 2**32) xor (v >> 32 mod 2**32)``)::

    k0 = mix32(fold(seed)      ^ 0x3C6EF372)
    k1 = mix32(k0 ^ fold(step) ^ 0x1B873593)
    k2 = mix32(k1 ^ fold(tensor_id) ^ 0x68E31DA4)       # key of the first round
    k3 = mix32(k2 ^ 0x2545F491)                          # key of the second round

Element with flat (row-major) index ``i``::

    word(i) = mix32( mix32((i mod 2**32) ^ k2) ^ (i >> 32) ^ k3 )

``rand24 = word >> 8`` (stochastic rounding to a grid: ``mx_round_grid`` in mxfp8.h) and
``rand16 = word >> 16`` (float32 -> bfloat16 stochastic rounding).  Different ``tensor_id``/``step``
values give independent-looking streams; the same key always gives the same stream on every device.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "KEY_SALTS",
    "MASK32",
    "MIX_MULT",
    "SR_BITS",
    "SR_SCALE",
    "mix32",
    "mix32_int",
    "rand16_like",
    "rand24_like",
    "rand24_numpy",
    "random_words",
    "random_words_like",
    "random_words_numpy",
    "stream_keys",
]

MASK32 = 0xFFFFFFFF  # 2**32 - 1
MIX_MULT = 0x045D9F3B  # 73244475, odd, < 2**27
KEY_SALTS = (0x3C6EF372, 0x1B873593, 0x68E31DA4, 0x2545F491)  # xor constants of the key schedule
SR_BITS = 24  # random bits used by stochastic rounding to a grid (rand24 = word >> 8)
SR_SCALE = float(2**SR_BITS)  # 16777216.0


def _torch() -> Any:
    import torch

    return torch


def mix32_int(x: int) -> int:
    """The 32-bit mixing hash on a Python int (used for keys)."""
    x &= MASK32
    x = (((x >> 16) ^ x) * MIX_MULT) & MASK32
    x = (((x >> 16) ^ x) * MIX_MULT) & MASK32
    return (x >> 16) ^ x


def mix32(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit mixing hash on an int64 tensor holding values in [0, 2**32)."""
    x = (((x >> 16) ^ x) * MIX_MULT) & MASK32
    x = (((x >> 16) ^ x) * MIX_MULT) & MASK32
    return (x >> 16) ^ x


def _fold(v: int) -> int:
    if v < 0:
        raise ValueError(f"RNG key components must be non-negative integers, got {v}")
    v &= (1 << 64) - 1
    return (v & MASK32) ^ ((v >> 32) & MASK32)


def stream_keys(seed: int, step: int, tensor_id: int) -> tuple[int, int]:
    """The two 32-bit round keys ``(k2, k3)`` of the stream for ``(seed, step, tensor_id)``.

    Example:
        >>> stream_keys(0, 0, 0) == stream_keys(0, 0, 0)
        True
    """
    k0 = mix32_int(_fold(int(seed)) ^ KEY_SALTS[0])
    k1 = mix32_int(k0 ^ _fold(int(step)) ^ KEY_SALTS[1])
    k2 = mix32_int(k1 ^ _fold(int(tensor_id)) ^ KEY_SALTS[2])
    k3 = mix32_int(k2 ^ KEY_SALTS[3])
    return k2, k3


def random_words(index: torch.Tensor, seed: int, step: int, tensor_id: int) -> torch.Tensor:
    """32-bit random words (int64 tensor in [0, 2**32)) for non-negative int64 element indices."""
    k2, k3 = stream_keys(seed, step, tensor_id)
    lo = index & MASK32
    hi = index >> 32
    return mix32(mix32(lo ^ k2) ^ hi ^ k3)


def _np_mix32(x: np.ndarray) -> np.ndarray:
    """mix32 on a numpy uint32 array, in place (numpy unsigned arithmetic wraps modulo 2**32)."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(MIX_MULT)
    x ^= x >> np.uint32(16)
    x *= np.uint32(MIX_MULT)
    x ^= x >> np.uint32(16)
    return x


def _np_words(n: int, offset: int, k2: int, k3: int) -> np.ndarray:
    """CPU fast path of :func:`random_words` over flat indices offset .. offset+n-1 (uint32 out)."""
    if offset + n <= 2**32:
        x = np.arange(offset, offset + n, dtype=np.uint32)
        hi = np.uint32(0)
    else:
        i = np.arange(offset, offset + n, dtype=np.uint64)
        x = (i & np.uint64(MASK32)).astype(np.uint32)
        hi = (i >> np.uint64(32)).astype(np.uint32)
    x ^= np.uint32(k2)
    x = _np_mix32(x)
    x ^= hi
    x ^= np.uint32(k3)
    return _np_mix32(x)


def random_words_numpy(n: int, seed: int, step: int, tensor_id: int, *, offset: int = 0) -> np.ndarray:
    """The words (uint32) of flat indices ``offset .. offset + n - 1`` for ``(seed, step, tensor_id)``.

    Example:
        >>> int(random_words_numpy(1, 0, 0, 0)[0]) == int(random_words_like((1,), 0, 0, 0)[0])
        True
    """
    k2, k3 = stream_keys(seed, step, tensor_id)
    return _np_words(n, offset, k2, k3)


def rand24_numpy(n: int, seed: int, step: int, tensor_id: int, *, offset: int = 0) -> np.ndarray:
    """24-bit random integers (uint32, ``word >> 8``) for stochastic rounding, numpy."""
    w = random_words_numpy(n, seed, step, tensor_id, offset=offset)
    w >>= np.uint32(32 - SR_BITS)
    return w


def random_words_like(
    shape: tuple[int, ...], seed: int, step: int, tensor_id: int, *, device: torch.device | str = "cpu", offset: int = 0
) -> torch.Tensor:
    """Random words (int64 in [0, 2**32)) for every element of a row-major tensor of ``shape``.

    The counter is the flat index plus ``offset``.  On CPU this runs in numpy uint32 arithmetic
    (same values, ~30x faster than int64 tensors); elsewhere in int64 torch ops.
    """
    torch = _torch()
    n = math.prod(int(s) for s in shape)
    if torch.device(device).type == "cpu":
        k2, k3 = stream_keys(seed, step, tensor_id)
        return torch.from_numpy(_np_words(n, offset, k2, k3).astype(np.int64)).reshape(shape)
    idx = torch.arange(offset, offset + n, dtype=torch.int64, device=device).reshape(shape)
    return random_words(idx, seed, step, tensor_id)


def _shifted(
    shape: tuple[int, ...], seed: int, step: int, tensor_id: int, device: torch.device | str, shift: int
) -> torch.Tensor:
    torch = _torch()
    n = math.prod(int(s) for s in shape)
    if torch.device(device).type == "cpu":
        k2, k3 = stream_keys(seed, step, tensor_id)
        w = _np_words(n, 0, k2, k3)
        w >>= np.uint32(shift)
        return torch.from_numpy(w.view(np.int32)).reshape(shape)  # < 2**24 after the shift
    return random_words_like(shape, seed, step, tensor_id, device=device) >> shift


def rand24_like(
    shape: tuple[int, ...], seed: int, step: int, tensor_id: int, *, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """24-bit random integers (int32 on CPU, int64 elsewhere) used by stochastic rounding to a grid."""
    return _shifted(shape, seed, step, tensor_id, device, 32 - SR_BITS)


def rand16_like(
    shape: tuple[int, ...], seed: int, step: int, tensor_id: int, *, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """16-bit random integers (int32 on CPU, int64 elsewhere) used by float32 -> bfloat16 SR."""
    return _shifted(shape, seed, step, tensor_id, device, 16)
