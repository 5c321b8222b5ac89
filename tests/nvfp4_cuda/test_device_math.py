"""The CUDA kernels' fast element math equals the reference spellings, checked on the host without a GPU.

``nvfp4_common.cuh`` marks its rounding helpers ``__host__ __device__``, so nvcc compiles them into a host
program here.  Over every float32 bit pattern:

* ``nv_e2m1_encode_rne`` and ``nv_e2m1_encode_sr`` (the quantizer's paths: a power-of-two scaling per
  binade, the code read from a float's bits) == ``nv_e2m1_encode`` (the grid formula of
  ``formats.e2m1_encode_grid``), SR with a different random word per input and with 0, 2^23 and 2^24 - 1;
* ``nv_e4m3x2_encode_rne`` (cuda_fp8.h's ``cvt.rn.satfinite.e4m3x2.f32``; its software path on the host,
  the one sm_80 runs) == mxfp8.h's ``mx_e4m3_grid_code`` RNE, NaN excepted;

and over every pair of E4M3 bytes, ``nv_e4m3x2_value`` == ``mx_e4m3_value``.  On sm_89 and later the two
cuda_fp8 helpers are single hardware instructions; the GPU tests (``-m gpu``) check the kernels that use
them bit for bit against the PyTorch reference.  The program also counts how often truncation differs
from RNE, so a comparison that cannot see a rounding error would fail.

Run: python -m pytest -q tests/nvfp4_cuda/test_device_math.py      (~1 min on 2 cores: nvcc, then 3 x 2^32 cases)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mxfp8_codec.constants import C_HEADER
from nvfp4_cuda import build, cpu_native

NVCC = os.environ.get(build.NVCC_ENV) or shutil.which("nvcc")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(NVCC is None, reason="no nvcc: device math not compiled")

PROGRAM = r"""
#include <stdio.h>
#include "nvfp4_common.cuh"

static int same_value(float got, float want) {  /* bit-equal, or both NaN */
  return (want != want) ? got != got : mx_f32_bits(got) == mx_f32_bits(want);
}

int main(void) {
  unsigned long long rne_bad = 0, sr_bad = 0, sr_edge_bad = 0, trunc_diff = 0, e4m3_bad = 0, dec_bad = 0, n = 0;
#pragma omp parallel for reduction(+ : rne_bad, sr_bad, sr_edge_bad, trunc_diff, e4m3_bad, n) schedule(static, 1 << 20)
  for (long long b = 0; b < (1ll << 32); ++b) {
    const float v = mx_bits_f32((uint32_t)b);
    const uint32_t fast = nv_e2m1_encode_rne(v);
    rne_bad += fast != nv_e2m1_encode(v, false, 0u);
    const uint32_t r24 = mx_rng_word((uint64_t)b, 7u, 9u) >> 8;  /* a different random word per input */
    sr_bad += nv_e2m1_encode_sr(v, r24) != nv_e2m1_encode(v, true, r24);
    if ((b & 0xFFFu) == 0) {
      trunc_diff += fast != nv_e2m1_encode(v, true, 0xFFFFFFu);  /* r24 = 2^24 - 1: always down */
      const uint32_t edges[3] = {0u, 0xFFFFFFu, 0x800000u};
      for (int i = 0; i < 3; ++i) sr_edge_bad += nv_e2m1_encode_sr(v, edges[i]) != nv_e2m1_encode(v, true, edges[i]);
    }
    if (v == v) {
      const uint32_t two = nv_e4m3x2_encode_rne(v, -v);
      e4m3_bad += two != (mx_e4m3_grid_code(v, 0, 0u) | (mx_e4m3_grid_code(-v, 0, 0u) << 8));
    }
    ++n;
  }
  for (uint32_t t = 0; t < 65536u; ++t) {
    const float2 d = nv_e4m3x2_value(t);
    dec_bad += !same_value(d.x, mx_e4m3_value(t & 0xFFu)) || !same_value(d.y, mx_e4m3_value(t >> 8));
  }
  printf("%llu %llu %llu %llu %llu %llu %llu\n", n, rne_bad, sr_bad, sr_edge_bad, e4m3_bad, dec_bad, trunc_diff);
  return 0;
}
"""


@pytest.mark.slow
def test_fast_element_math_equals_the_reference_on_every_input(tmp_path: Path) -> None:
    src = tmp_path / "device_math.cu"
    src.write_text(PROGRAM)
    exe = tmp_path / "device_math"
    flags = [f for f in build.BASE_FLAGS if f not in ("--threads", "2")]  # the library's flags: -fmad=false, -I
    # the host code as the CPU kernels are built (-march=native -ffp-contract=off: no FMA contraction, like
    # -fmad=false on the device): fminf / rintf / floorf inline instead of libm calls, ~20 % less CPU here
    host = ",".join(f for f in cpu_native.CFLAGS if f.startswith(("-march", "-ffp", "-fno-fast")))
    subprocess.run(
        [
            NVCC,
            *flags,
            "-Xcompiler",
            f"-fopenmp,{host}",
            f"-I{build.CSRC}",
            f"-I{C_HEADER.parent}",
            str(src),
            "-o",
            str(exe),
        ],
        check=True,
        capture_output=True,
    )
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, check=True)
    n, rne_bad, sr_bad, sr_edge_bad, e4m3_bad, dec_bad, trunc_diff = map(int, res.stdout.split())
    assert n == 2**32
    assert (rne_bad, sr_bad, sr_edge_bad, e4m3_bad, dec_bad) == (0, 0, 0, 0, 0), res.stdout
    assert trunc_diff > 1000  # truncating instead of rounding would have been seen


# Instruction ceilings of the hot paths (static sm_90 SASS per thread, scripts/sass_hot_path.py), about 10 %
# above what nvcc 13.0 gives today (docs/benchmarks.md): the quantize and Lion kernels are bound by
# instructions on the H200, so a change that brings the counts back up is a slowdown found without a GPU.
# A quantizer thread owns two 1x16 blocks (32 elements, NV_QUANT_NB), a Lion thread 8 elements.
SASS_CEILINGS = {
    "quantize 1x16 RNE": 850,
    "quantize 1x16 RNE, BF16 values out (quantize_decoded)": 910,  # the trainer's forward / dgrad operands
    "quantize 1x16 stochastic": 1810,
    "quantize transposed input, RNE + Hadamard, BF16 values out": 1285,  # the trainer's wgrad operands
    "quantize 16x16 RNE from the MXFP8 master, BF16 values out": 1285,  # the trainer's weights, every forward
    "Lion on MXFP8, rne": 420,
    "Lion on MXFP8, compensated": 490,
    "Lion on MXFP8, stochastic": 760,
}


def test_hot_paths_stay_within_their_instruction_budget() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sass_hot_path", ROOT / "scripts" / "sass_hot_path.py")
    assert spec is not None and spec.loader is not None
    sass = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass)
    try:
        counts = sass.count(None)
    except SystemExit as exc:  # cuobjdump / nvdisasm missing: the test extra installs them on Linux
        pytest.skip(str(exc))
    over = {k: (counts[k], ceiling) for k, ceiling in SASS_CEILINGS.items() if counts[k] > ceiling}
    assert not over, f"hot paths above their SASS ceiling (count, ceiling): {over}"
