"""The native C kernel gives the same bits as the pure-numpy path; its loader builds, caches, locks
and falls back as documented (mxfp8_codec/_native.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ida_common import native_build
from mxfp8_codec import _native
from mxfp8_codec.constants import ScaleRule
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.numerics import (
    decode_mxfp8,
    decode_mxfp8_numpy,
    decode_table,
    encode_mxfp8,
    encode_mxfp8_numpy,
)

REPO = Path(__file__).resolve().parents[2]
KERNEL = _native.get_kernel()
needs_native = pytest.mark.skipif(KERNEL is None, reason=f"native kernel unavailable: {_native.kernel_info()}")


def _special_values() -> np.ndarray:
    """Every finite bfloat16 value (as float32) plus float32 extremes, in a shuffled order."""
    bf = np.arange(0, 0x10000, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    extra = np.array([3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 1.1754942e-38, 447.99997, 464.0], np.float32)
    v = np.concatenate([bf[np.isfinite(bf)], extra])
    return np.random.default_rng(0).permutation(v)


@needs_native
@pytest.mark.parametrize("rule", list(ScaleRule))
@pytest.mark.parametrize("k", [32, 96, 45, 7])
def test_native_encode_equals_numpy_on_all_bf16_values(rule: ScaleRule, k: int) -> None:
    v = _special_values()
    # blocks mixing magnitudes freely, and blocks of neighbours (shared scale is informative)
    for x in (v, np.sort(v)):
        x = x[: len(x) // k * k].reshape(-1, k)
        with np.errstate(over="ignore"):  # float16 cannot hold the large values: they become inf, then 0
            variants = (x, x.astype(ml_dtypes.bfloat16), x.astype(np.float16))
        for arr in variants:
            with np.errstate(over="ignore"):
                arr = np.where(np.isfinite(arr.astype(np.float32)), arr, 0).astype(arr.dtype)
            q_ref, s_ref = encode_mxfp8_numpy(arr, scale_rule=rule)
            q, s = encode_mxfp8(arr, scale_rule=rule)
            assert np.array_equal(s, s_ref), arr.dtype
            assert np.array_equal(q, q_ref), arr.dtype


@needs_native
@pytest.mark.parametrize("k", [32, 64, 33, 5])
def test_native_decode_equals_numpy_on_every_pair(k: int) -> None:
    rng = np.random.default_rng(k)
    rows = 256 * 4
    q = rng.integers(0, 256, (rows, k)).astype(np.uint8)
    q[:256, 0] = np.arange(256)  # every code at every scale byte below
    s = np.repeat(np.arange(256, dtype=np.uint8), 4)[:, None].repeat(-(-k // 32), axis=1)
    for dtype, view in ((np.float32, np.uint32), (ml_dtypes.bfloat16, np.uint16)):
        ref = decode_mxfp8_numpy(q, s, dtype=dtype).view(view)
        assert np.array_equal(decode_mxfp8(q, s, dtype=dtype).view(view), ref)


@needs_native
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    x=arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 100)),
        elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
    ),
    rule=st.sampled_from(list(ScaleRule)),
)
def test_native_equals_numpy_property(x: np.ndarray, rule: ScaleRule) -> None:
    q_ref, s_ref = encode_mxfp8_numpy(x, scale_rule=rule)
    q, s = encode_mxfp8(x, scale_rule=rule)
    assert np.array_equal(q, q_ref) and np.array_equal(s, s_ref)
    for dtype, view in ((np.float32, np.uint32), (ml_dtypes.bfloat16, np.uint16)):
        assert np.array_equal(
            decode_mxfp8(q, s, dtype=dtype).view(view), decode_mxfp8_numpy(q, s, dtype=dtype).view(view)
        )


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_native_reports_first_non_finite_index(dtype: type) -> None:
    x = np.ones((4, 100), dtype)
    x[3, 70] = np.inf
    x[1, 99] = np.nan
    with pytest.raises(MXFP8Error, match=r"'w'.*nan at index \(1, 99\)"):
        encode_mxfp8(x, name="w")


@needs_native
def test_native_ignores_flush_to_zero_mode() -> None:
    """torch.set_flush_denormal(True) sets FTZ/DAZ; the kernel must still see subnormals."""
    tiny = np.array([2.0**-130, -(2.0**-140), 2.0**-120] + [0.0] * 29, np.float32)
    q_ref, s_ref = encode_mxfp8_numpy(tiny)
    dec_ref = decode_mxfp8_numpy(q_ref, s_ref)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        q, s = encode_mxfp8(tiny)
        dec = decode_mxfp8(q, s)
        still_flushing = float((torch.tensor([1e-39]) * 1.0)[0]) == 0.0
    finally:
        torch.set_flush_denormal(False)
    assert np.array_equal(q, q_ref) and np.array_equal(s, s_ref)
    assert np.array_equal(dec.view(np.uint32), dec_ref.view(np.uint32))
    assert still_flushing  # the kernel restored the caller's floating-point mode


def _run_probe(env: dict[str, str]) -> dict[str, str]:
    code = (
        "import json, numpy as np, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from mxfp8_codec import _native\n"
        "from mxfp8_codec.numerics import encode_mxfp8, decode_mxfp8\n"
        "q, s = encode_mxfp8(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32))\n"
        "info = _native.kernel_info()\n"
        "info['sum'] = str(float(decode_mxfp8(q, s).sum()))\n"
        "print(json.dumps(info))\n"
    )
    # the caller's MXFP8_CODEC_NATIVE (e.g. =0 for a fallback run of the suite) must not leak in
    full_env = {**{k: v for k, v in os.environ.items() if k != _native.ENV_SWITCH}, **env}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_env_switch_forces_numpy_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_native.ENV_SWITCH, "0")
    assert _native.get_kernel() is None
    assert _native.kernel_info() == {"backend": "numpy", "reason": "MXFP8_CODEC_NATIVE=0"}
    x = np.linspace(-3, 3, 100, dtype=np.float32).reshape(2, 50)
    q, s = encode_mxfp8(x)
    monkeypatch.delenv(_native.ENV_SWITCH)
    q2, s2 = encode_mxfp8(x)
    assert np.array_equal(q, q2) and np.array_equal(s, s2)


def test_without_compiler_falls_back_with_identical_bits(tmp_path: Path) -> None:
    info = _run_probe({"IDA_CACHE_DIR": str(tmp_path), "CC": str(tmp_path / "no-such-cc")})
    assert info["backend"] == "numpy" and "no C compiler" in info["reason"]
    assert not list(tmp_path.rglob("*.so"))
    ref = _run_probe({_native.ENV_SWITCH: "0"})
    assert info["sum"] == ref["sum"]


@needs_native
def test_concurrent_processes_build_once_into_the_cache(tmp_path: Path) -> None:
    """Three processes start on an empty cache at once: one library, no temporaries left."""
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from mxfp8_codec import _native; print(_native.kernel_info()['library'])\n"
    )
    env = {**os.environ, "IDA_CACHE_DIR": str(tmp_path)}
    env.pop(_native.ENV_SWITCH, None)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    paths = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    libs = list((tmp_path / "mxfp8_codec").glob("*.so"))
    assert [str(p) for p in libs] == list(paths)
    assert not list((tmp_path / "mxfp8_codec").glob("*.tmp"))
    # the key covers the source: same source -> same file name as this process's cache entry
    assert KERNEL is not None and libs[0].name == KERNEL.path.name


@needs_native
@pytest.mark.parametrize(
    ("cflags", "simd"),
    [
        (_native.PORTABLE_CFLAGS, "portable-c"),
        pytest.param(
            _native.AVX2_CFLAGS,
            "avx2",
            marks=pytest.mark.skipif(
                "avx2" not in native_build.cpu_identity().split(),
                reason="the CPU has no AVX2: its build cannot run here",
            ),
        ),
    ],
    ids=["portable-c", "avx2"],
)
def test_other_cpus_fast_paths_equal_numpy(tmp_path: Path, cflags: tuple[str, ...], simd: str) -> None:
    """The fast paths of the builds other CPUs get (portable C; AVX2 without AVX-512) give numpy's bits too:
    the decode, row-wise and transposed, of every code at every scale byte."""
    kernel = _native.build_variant(tmp_path / f"{simd}.so", cflags)
    assert kernel.simd == simd
    rng = np.random.default_rng(5)
    v = _special_values()
    rows = [v[: len(v) // 64 * 64].reshape(-1, 64), np.sort(v)[: len(v) // 64 * 64].reshape(-1, 64)]
    rows.append((rng.standard_normal((512, 96)) * 0.02).astype(np.float32))
    for x in rows:
        for arr in (x, x.astype(ml_dtypes.bfloat16)):
            arr = np.where(np.isfinite(arr.astype(np.float32)), arr, 0).astype(arr.dtype)
            for rule in ScaleRule:
                q_ref, s_ref = encode_mxfp8_numpy(arr, scale_rule=rule)
                q, s = np.empty_like(q_ref), np.empty_like(s_ref)
                bits = arr if arr.dtype == np.float32 else arr.view(np.uint16)
                assert kernel.encode(np.ascontiguousarray(bits), q, s, rule is ScaleRule.RCEIL) == -1
                assert np.array_equal(q, q_ref) and np.array_equal(s, s_ref)
    every = np.tile(np.arange(256, dtype=np.uint8), (256, 1))  # row r: every code, in 8 blocks of scale byte r
    for q, s in (
        (
            rng.integers(0, 256, (1024, 64)).astype(np.uint8),
            np.repeat(np.arange(256, dtype=np.uint8), 8).reshape(-1, 2),
        ),
        (every, np.repeat(np.arange(256, dtype=np.uint8)[:, None], 8, axis=1)),
        # partial tiles (1000 rows) and a partial block (k = 75) for the transposed decode's edges
        (rng.integers(0, 256, (1000, 75)).astype(np.uint8), rng.integers(100, 140, (1000, 3)).astype(np.uint8)),
    ):
        for kind, dtype in (("f32", np.float32), ("bf16", ml_dtypes.bfloat16)):
            table = decode_table(kind)
            want = decode_mxfp8_numpy(q, s, dtype=dtype).view(table.dtype)
            out = np.empty(q.shape, table.dtype)
            kernel.decode(q, s, out, table)
            assert np.array_equal(out, want)
            out_t = np.empty(q.shape[::-1], table.dtype)
            kernel.decode_transposed(q, s, out_t, table)
            assert np.array_equal(out_t, want.T)


@needs_native
def test_damaged_cache_entry_is_rebuilt(tmp_path: Path) -> None:
    assert KERNEL is not None
    lib_dir = tmp_path / "mxfp8_codec"
    lib_dir.mkdir()
    (lib_dir / KERNEL.path.name).write_bytes(b"not a shared library")  # e.g. a foreign/damaged file
    info = _run_probe({"IDA_CACHE_DIR": str(tmp_path)})
    assert info["backend"] == "native" and info["library"] == str(lib_dir / KERNEL.path.name)
    assert (lib_dir / KERNEL.path.name).read_bytes() != b"not a shared library"
