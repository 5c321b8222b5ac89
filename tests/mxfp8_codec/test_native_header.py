"""mxfp8_codec/mxfp8.h (the C and CUDA spelling of the format) against the Python constants, and the
"written once per language" rule: no other C/CUDA/Python source defines its own copy.

The header's functions are exercised bit for bit elsewhere: the codec's C kernel (which includes it)
against numpy on every bfloat16 value and every (scale, code) pair (test_numerics_native.py), the
stochastic encoder below, and nvfp4_cuda's C Lion step and CUDA kernels against the torch reference
(tests/nvfp4_cuda/).

Run: python -m pytest -q tests/mxfp8_codec/test_native_header.py
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from mxfp8_codec import constants as C
from mxfp8_codec import rng
from mxfp8_codec.numerics import encode_mxfp8, encode_mxfp8_numpy, encode_mxfp8_torch

ROOT = Path(__file__).resolve().parents[2]
HEADER = C.C_HEADER

# header name -> the Python value it must equal
EXPECTED: dict[str, float | int] = {
    "MX_BLOCK_SIZE": C.BLOCK_SIZE,
    "MX_E4M3_BIAS": C.E4M3_BIAS,
    "MX_E4M3_MANTISSA_BITS": C.E4M3_MANTISSA_BITS,
    "MX_E4M3_MAX": C.E4M3_MAX,
    "MX_E4M3_MAX_CODE": C.E4M3_MAX_CODE,
    "MX_E4M3_MAX_POW2": C.E4M3_MAX_POW2,
    "MX_E4M3_MIN_NORMAL": C.E4M3_MIN_NORMAL,
    "MX_E4M3_MIN_SUBNORMAL": C.E4M3_MIN_SUBNORMAL,
    "MX_E4M3_NAN_MAG": C.E4M3_NAN_MAG,
    "MX_E4M3_SIGN": C.E4M3_SIGN,
    "MX_E8M0_BIAS": C.E8M0_BIAS,
    "MX_E8M0_NAN": C.E8M0_NAN,
    "MX_SCALE_EXP_MIN": C.SCALE_EXP_MIN,
    "MX_SCALE_EXP_MAX": C.SCALE_EXP_MAX,
    "MX_TOP_CLAMP_SCALE_BYTE": C.TOP_CLAMP_SCALE_BYTE,
    "MX_TOP_CLAMP_CODE": C.TOP_CLAMP_CODE,
    "MX_TOP_CLAMP_VALUE": C.TOP_CLAMP_VALUE,
    "MX_F32_MANT_175": C.F32_MANT_175,
    "MX_F32_CANONICAL_NAN": C.F32_CANONICAL_NAN,
    "MX_BF16_CANONICAL_NAN": C.BF16_CANONICAL_NAN,
    "MX_RNG_MIX_MULT": rng.MIX_MULT,
    "MX_SR_BITS": rng.SR_BITS,
    "MX_SR_SCALE": rng.SR_SCALE,
}


def _c_number(text: str) -> float | int:
    text = text.strip().strip("()")
    if re.fullmatch(r"-?0[xX][0-9a-fA-F]+[uU]?", text):
        return int(text.rstrip("uU"), 16)
    if re.fullmatch(r"-?\d+[uU]?", text):
        return int(text.rstrip("uU"))
    if re.fullmatch(r"-?\d+\.\d*(e[-+]?\d+)?[fF]", text):
        return float(text.rstrip("fF"))
    raise AssertionError(f"not a literal: {text!r}")


def _header_defines() -> dict[str, float | int]:
    out = {}
    for m in re.finditer(r"^#define\s+(MX_\w+)\s+([^\s/]+)", HEADER.read_text(), re.M):
        if m.group(1) != "MX_HD":
            out[m.group(1)] = _c_number(m.group(2))
    return out


def test_every_header_constant_equals_python() -> None:
    defines = _header_defines()
    assert set(defines) == set(EXPECTED), "mxfp8.h and this table list different constants"
    for name, value in EXPECTED.items():
        assert defines[name] == value, (name, defines[name], value)
        assert type(defines[name]) is type(value) or isinstance(value, float), name


def test_header_constants_can_fail() -> None:
    """The parser really reads the values (a wrong literal would be seen)."""
    text = HEADER.read_text().replace("#define MX_E4M3_MAX 448.0f", "#define MX_E4M3_MAX 449.0f")
    m = re.search(r"^#define\s+MX_E4M3_MAX\s+([^\s/]+)", text, re.M)
    assert m is not None and _c_number(m.group(1)) != C.E4M3_MAX


@pytest.mark.parametrize(
    "path",
    ["mxfp8_codec/_kernel.c", "nvfp4_cuda/cpu/nvfp4_cpu.c", "nvfp4_cuda/csrc/nvfp4_common.cuh"],
)
def test_native_sources_include_the_header(path: str) -> None:
    assert '#include "mxfp8.h"' in (ROOT / path).read_text()


# literals that spell an MXFP8 constant, scale rule or RNG constant; only mxfp8.h may contain them
FORBIDDEN_C = [
    (r"0x045D9F3B", "RNG multiplier"),
    (r"0x600000", "RCEIL mantissa threshold"),
    (r"\b240\.0f", "top-of-range clamp value"),
    (r"\be == 120\b", "top-of-range exponent"),
    (r"#define\s+\w*BLOCK\w*\s+32\b", "block size"),
    (r"0x7FC00000u?\s*\)?\s*;\s*$", "canonical NaN as a definition"),
]


def _native_sources() -> list[Path]:
    files = [ROOT / "mxfp8_codec" / "_kernel.c", ROOT / "nvfp4_cuda" / "cpu" / "nvfp4_cpu.c"]
    files += sorted((ROOT / "nvfp4_cuda" / "csrc").glob("*.cu*"))
    return files


@pytest.mark.parametrize(("pattern", "what"), FORBIDDEN_C)
def test_no_second_copy_in_c_or_cuda(pattern: str, what: str) -> None:
    for path in _native_sources():
        hits = [
            ln
            for ln in path.read_text().splitlines()
            if re.search(pattern, ln) and not ln.lstrip().startswith(("/*", "*", "//"))
        ]
        assert not hits, f"{path.relative_to(ROOT)} spells the {what} itself: {hits[:2]}"


FORBIDDEN_PY = [
    (r"^\s*\w*(BLOCK|MX_BLOCK|MXFP8_BLOCK)\w*\s*=\s*32\b", "MXFP8 block size"),
    (r"^\s*\w*E4M3_MAX\w*\s*=", "E4M3 max"),
    (r"^\s*\w*E8M0_(BIAS|NAN)\w*\s*=", "E8M0 constant"),
    (r"^\s*\w*TOP_(SCALE_EXPONENT|CLAMP)\w*\s*=", "top-of-range rule"),
    (r"^def (rceil_exponent|scale_shape|mxfp8_encode|mxfp8_decode)\b", "second MXFP8 encoder / rule / shape"),
    (r"^\s*MIX_MULT\s*=", "RNG multiplier"),
]


@pytest.mark.parametrize(("pattern", "what"), FORBIDDEN_PY)
def test_python_defines_each_constant_once(pattern: str, what: str) -> None:
    home = {ROOT / "mxfp8_codec" / "constants.py", ROOT / "mxfp8_codec" / "rng.py"}
    for pkg in ("mxfp8_codec", "nvfp4_cuda", "ida_trainer", "ida_eval", "ida_common"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path in home:
                continue
            hits = [ln for ln in path.read_text().splitlines() if re.search(pattern, ln)]
            assert not hits, f"{path.relative_to(ROOT)} defines the {what} again: {hits[:2]}"


def test_stochastic_encode_same_bits_on_every_backend() -> None:
    """rounding="stochastic": native C (mxfp8.h) == numpy == torch, and it draws the documented words."""
    g = np.random.default_rng(3)
    x = (g.standard_normal((37, 100)) * np.exp(4 * g.standard_normal((37, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 5] = -0.0
    x[2] = 3e38 * g.random(100)
    x[3] = 1e-40
    kw = {"rounding": "stochastic", "seed": 1, "step": 2, "tensor_id": 3}
    q, s = encode_mxfp8(x, **kw)
    nq, ns = encode_mxfp8_numpy(x, **kw)
    tq, ts = encode_mxfp8_torch(torch.from_numpy(x), **kw)
    assert np.array_equal(q, nq) and np.array_equal(s, ns)
    assert np.array_equal(q, tq.numpy()) and np.array_equal(s, ts.numpy())
    assert not np.array_equal(q, encode_mxfp8(x, **{**kw, "step": 3})[0])  # the key matters
    rq, _ = encode_mxfp8(x)
    assert 0.2 < float((q != rq).mean()) < 0.8  # stochastic, not RNE


def test_stochastic_rounding_draws_from_the_element_index() -> None:
    """One element at 1 + 1/4 of a grid step rounds up exactly when its rand24 word is below 2^22."""
    n = 4096
    x = np.full((n // 32, 32), 1.0 + 0.125 * 0.25, np.float32)  # grid step at 1.0 is 0.125
    x[:, 0] = 1.75  # block amax: scale byte 127 - 8 + 0 + ... keeps the element at 1.03125 / step 0.125
    q, s = encode_mxfp8(x, rounding="stochastic", seed=9, step=8, tensor_id=7)
    e = int(s[0, 0]) - C.E8M0_BIAS
    up = q.reshape(-1) != encode_mxfp8(x)[0].reshape(-1)
    r24 = rng.rand24_numpy(n, 9, 8, 7)
    frac = (float(np.float32(x[0, 1]) * 2.0**-e) / 2.0 ** (np.floor(np.log2(x[0, 1] * 2.0**-e)) - 3)) % 1.0
    expect = r24.astype(np.float64) < frac * 2**24
    expect[::32] = False
    assert np.array_equal(up, expect)


E4M3_ORACLE_C = r"""
#include <stdio.h>
#include "mxfp8.h"
/* the float-grid formula (module docstring of mxfp8.h), written out with float operations */
static uint32_t oracle(float v, int sr, uint32_t r24) {
    const float a = fabsf(v);
    const int e = (int)((mx_f32_bits(a) >> 23) & 0xFFu) - 127;
    const int ue = a >= MX_E4M3_MIN_NORMAL ? e - MX_E4M3_MANTISSA_BITS : -9;
    const float n = mx_round_grid(a * mx_pow2f(-ue), sr, r24);
    float q = n * mx_pow2f(ue);
    q = q < MX_E4M3_MAX ? q : MX_E4M3_MAX;
    uint32_t code;
    if (q >= MX_E4M3_MIN_NORMAL) {
        const uint32_t b = mx_f32_bits(q);
        code = ((((b >> 23) & 0xFFu) - 127u + MX_E4M3_BIAS) << 3) | ((b >> 20) & 7u);
    } else {
        code = (uint32_t)(q * 512.0f);
    }
    return code | ((mx_f32_bits(v) >> 24) & MX_E4M3_SIGN);
}
int main(void) {
    const uint32_t lows[] = {0u, 1u, 0x3Fu, 0x40u, 0x41u, 0x7Fu};
    unsigned long long n = 0, bad = 0;
    for (uint32_t ex = 0; ex <= 140; ++ex)              /* every exponent up to 2^13 (saturation) */
        for (uint32_t hi = 0; hi < 65536u; ++hi)        /* mantissa bits 22..7, every pattern */
            for (int l = 0; l < 6; ++l) {
                const uint32_t bits = (ex << 23) | (hi << 7) | lows[l];
                const uint32_t f20 = bits & 0xFFFFFu;
                const uint32_t rs[4] = {mx_rng_word(bits, 1u, 2u) >> 8, 0u, 0xFFFFFFu,
                                        f20 ? 16u * f20 - 1u : 7u};
                for (int sign = 0; sign < 2; ++sign) {
                    const float v = mx_bits_f32(bits | (sign ? 0x80000000u : 0u));
                    bad += mx_e4m3_grid_code(v, 0, 0u) != oracle(v, 0, 0u);
                    for (int k = 0; k < 4; ++k) bad += mx_e4m3_grid_code(v, 1, rs[k]) != oracle(v, 1, rs[k]);
                    n += 5;
                }
            }
    const float specials[] = {INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 479.9f, 480.0f, 1e30f};
    for (int i = 0; i < 8; ++i) bad += mx_e4m3_grid_code(specials[i], 0, 0u) != oracle(specials[i], 0, 0u);
    printf("%llu %llu\n", n, bad);
    return bad != 0;
}
"""


@pytest.mark.slow
def test_e4m3_grid_code_on_the_bits_equals_the_float_grid_formula(tmp_path: Path) -> None:
    """mx_e4m3_grid_code (integer rounding of the mantissa) == the documented float formula, RNE and SR.

    Every exponent up to 2^13, every pattern of mantissa bits 22..7 with six low-bit endings (ties,
    one past, all ones), both signs; SR with a random word, 0, 2^24 - 1 and the word just below the
    round-up threshold; inf, NaN and values around the 448 saturation.
    """
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "oracle.c"
    src.write_text(E4M3_ORACLE_C)
    exe = tmp_path / "oracle"
    subprocess.run([cc, "-O2", "-ffp-contract=off", f"-I{HEADER.parent}", str(src), "-o", str(exe), "-lm"], check=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, check=False)
    checked, bad = map(int, res.stdout.split())
    assert res.returncode == 0 and bad == 0 and checked > 10**8, res.stdout
