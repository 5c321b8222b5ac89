"""Register layouts of both GEMM kernels, as host code: pack fragments exactly as the kernels do, then simulate.

The native GEMM kernel (``csrc/nvfp4_gemm.cu``) issues, per warp,
``mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3``.
This module writes down *which bytes every lane loads* (exactly the kernel's loads) and a simulator
that computes the MMA from the per-lane registers using only the PTX ISA's fragment definitions, so
that a CPU test can check the layout against the reference GEMM before any sm_120 hardware runs it.
(The emulated backend's kernels need no such replay: tests/nvfp4_cuda/kernel_emu.py runs their CUDA source
on the CPU.)

Fragments (PTX ISA "Matrix Fragments for mma.m16n8k64" with .e2m1; ``g = lane >> 2``, ``t = lane & 3``;
nibble j of a 32-bit register is element j, low nibble first)::

    a0 = A[g    ][ 8t .. 8t+7]      a1 = A[g + 8][ 8t .. 8t+7]
    a2 = A[g    ][32+8t .. +7]      a3 = A[g + 8][32+8t .. +7]
    b0 = B[n = g][ 8t .. 8t+7]      b1 = B[n = g][32+8t .. +7]          (B stored [N][K], K contiguous)
    c0, c1 = C[g][2t, 2t+1]         c2, c3 = C[g + 8][2t, 2t+1]

Because NVFP4 codes are stored [rows, K/2] with the even element in the low nibble, each fragment
register is one aligned little-endian 32-bit load of 4 code bytes.

Block scales, ``scale_vec::4X`` with ``.ue4m3``: each lane supplies one 32-bit word whose byte j is the
scale of K-block j (k in [16j, 16j+16)) of the 64-wide slice; with selectors byte-id 0 and thread-id 0
row m of A takes its scales from lane ``4*(m % 8) + (m // 8)`` and column n of B from lane ``4*n``
(hardware-probed mapping reported by shiinamiyuki/sm120_gemm; the simplest loader, used by the kernel,
has every lane load ``SFA[row0 + (lane >> 2) + 8*(lane & 1)]`` and ``SFB[col0 + (lane >> 2)]``).
"""

from __future__ import annotations

import numpy as np
import torch

from nvfp4_cuda.formats import E2M1_VALUES
from nvfp4_cuda.tensor import NVFP4Tensor

MMA_M, MMA_N, MMA_K = 16, 8, 64  # m16n8k64
WARP = 32  # lanes per warp

_E2M1 = np.array(list(E2M1_VALUES) + [-v for v in E2M1_VALUES], dtype=np.float64)


def _words(codes: np.ndarray, row: int, byte0: int) -> int:
    """Little-endian 32-bit word of 4 code bytes starting at codes[row, byte0] (one aligned load)."""
    return int(codes[row, byte0 : byte0 + 4].view("<u4")[0])


def pack_a(codes: np.ndarray, row0: int, k0: int) -> np.ndarray:
    """A fragments [32 lanes, 4 regs] (uint32) for rows row0..row0+15 and K slice k0..k0+63."""
    regs = np.zeros((WARP, 4), dtype=np.uint32)
    for lane in range(WARP):
        g, t = lane >> 2, lane & 3
        for r, (dm, dk) in enumerate(((0, 0), (8, 0), (0, 32), (8, 32))):
            regs[lane, r] = _words(codes, row0 + g + dm, (k0 + dk + 8 * t) // 2)
    return regs


def pack_b(codes: np.ndarray, col0: int, k0: int) -> np.ndarray:
    """B fragments [32 lanes, 2 regs] (uint32) for columns col0..col0+7 (rows of B [N, K])."""
    regs = np.zeros((WARP, 2), dtype=np.uint32)
    for lane in range(WARP):
        g, t = lane >> 2, lane & 3
        regs[lane, 0] = _words(codes, col0 + g, (k0 + 8 * t) // 2)
        regs[lane, 1] = _words(codes, col0 + g, (k0 + 32 + 8 * t) // 2)
    return regs


def pack_sfa(scales: np.ndarray, row0: int, k0: int) -> np.ndarray:
    """Per-lane A scale words: lane loads the 4 block scales of row ``row0 + (lane>>2) + 8*(lane&1)``."""
    return np.array(
        [_words(scales, row0 + (lane >> 2) + 8 * (lane & 1), k0 // 16) for lane in range(WARP)], dtype=np.uint32
    )


def pack_sfb(scales: np.ndarray, col0: int, k0: int) -> np.ndarray:
    """Per-lane B scale words: lane loads the 4 block scales of column ``col0 + (lane>>2)``."""
    return np.array([_words(scales, col0 + (lane >> 2), k0 // 16) for lane in range(WARP)], dtype=np.uint32)


def _nib(word: int, j: int) -> int:
    return (int(word) >> (4 * j)) & 0xF


def simulate_mma(
    a: np.ndarray, b: np.ndarray, sfa: np.ndarray, sfb: np.ndarray, c: np.ndarray, e4m3_table: np.ndarray
) -> np.ndarray:
    """D = A*diag(sf) B^T + C for one m16n8k64 from per-lane registers (PTX fragment semantics).

    Reassembles A [16, 64], B [8, 64] and the scales *from the registers alone*, then accumulates in
    float64 (every product is exact; the hardware's float32 accumulation order is unspecified).
    ``c`` is the accumulator fragment [32 lanes, 4]; the result has the same layout.
    """
    am = np.zeros((MMA_M, MMA_K))
    bm = np.zeros((MMA_N, MMA_K))
    sa = np.zeros((MMA_M, 4))
    sb = np.zeros((MMA_N, 4))
    for lane in range(WARP):
        g, t = lane >> 2, lane & 3
        for r, (dm, dk) in enumerate(((0, 0), (8, 0), (0, 32), (8, 32))):
            for j in range(8):
                am[g + dm, dk + 8 * t + j] = _E2M1[_nib(a[lane, r], j)]
        for r, dk in enumerate((0, 32)):
            for j in range(8):
                bm[g, dk + 8 * t + j] = _E2M1[_nib(b[lane, r], j)]
    for m in range(MMA_M):  # scale lane mapping with thread-id-a = 0
        word = int(sfa[4 * (m % 8) + (m // 8)])
        sa[m] = [e4m3_table[(word >> (8 * j)) & 0xFF] for j in range(4)]
    for n in range(MMA_N):  # thread-id-b = 0
        word = int(sfb[4 * n])
        sb[n] = [e4m3_table[(word >> (8 * j)) & 0xFF] for j in range(4)]
    a_s = am * np.repeat(sa, 16, axis=1)
    b_s = bm * np.repeat(sb, 16, axis=1)
    prod = a_s @ b_s.T
    d = c.astype(np.float64).copy()
    for lane in range(WARP):
        g, t = lane >> 2, lane & 3
        d[lane] += [prod[g, 2 * t], prod[g, 2 * t + 1], prod[g + 8, 2 * t], prod[g + 8, 2 * t + 1]]
    return d


def simulate_gemm(a: NVFP4Tensor, b: NVFP4Tensor) -> torch.Tensor:
    """Whole GEMM ``alpha * A B^T`` by tiling into m16n8k64 MMAs fed from :func:`pack_a` etc. (float64 out).

    ``alpha = float32(S_dec_a * S_dec_b)``; the float64 result rounded to float32 equals the kernel's
    epilogue whenever the float32 accumulation is exact.

    Needs M % 16 == 0, N % 8 == 0, K % 64 == 0 (the kernel pads otherwise).
    """
    m, k = a.shape
    n = b.shape[0]
    if m % MMA_M or n % MMA_N or k % MMA_K:
        raise ValueError(f"simulate_gemm: shape M={m} N={n} K={k} is not a multiple of m16n8k64")
    ac, asf = a.codes.cpu().numpy(), a.block_scales.cpu().numpy()
    bc, bsf = b.codes.cpu().numpy(), b.block_scales.cpu().numpy()
    table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()
    out = np.zeros((m, n))
    for row0 in range(0, m, MMA_M):
        for col0 in range(0, n, MMA_N):
            acc = np.zeros((WARP, 4))
            for k0 in range(0, k, MMA_K):
                acc = simulate_mma(
                    pack_a(ac, row0, k0),
                    pack_b(bc, col0, k0),
                    pack_sfa(asf, row0, k0),
                    pack_sfb(bsf, col0, k0),
                    acc,
                    table,
                )
            for lane in range(WARP):
                g, t = lane >> 2, lane & 3
                out[row0 + g, col0 + 2 * t : col0 + 2 * t + 2] = acc[lane, 0:2]
                out[row0 + g + 8, col0 + 2 * t : col0 + 2 * t + 2] = acc[lane, 2:4]
    alpha = np.float32(a.tensor_scale.item()) * np.float32(b.tensor_scale.item())  # float32, as the epilogue
    return torch.from_numpy(out * float(alpha))
