"""Fused decode-with-transpose (``decode_mxfp8(..., transpose=True)``): the native tiled kernel,
the numpy fallback and the torch path all give exactly the bits of ``decode(...).T``.

The oracle is the plain numpy decode (itself checked exhaustively against float64 in
test_numerics_oracle.py) followed by numpy's own transpose copy.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mxfp8_codec import _native
from mxfp8_codec.convert import cpu_tensor_view
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.numerics import decode_mxfp8, decode_mxfp8_numpy, decode_mxfp8_torch, decode_table

KERNEL = _native.get_kernel()
needs_native = pytest.mark.skipif(KERNEL is None, reason=f"native kernel unavailable: {_native.kernel_info()}")
DTYPES = ((np.float32, np.uint32, torch.float32), (ml_dtypes.bfloat16, np.uint16, torch.bfloat16))
# shapes around the 32 x 32 tile: exact tiles, partial row tiles, partial (and tiny) blocks; the
# last two cross the native kernel's 256 x 256 tile groups in both directions (partial groups)
SHAPES = [
    (1, 1),
    (1, 40),
    (40, 1),
    (31, 33),
    (32, 32),
    (33, 31),
    (64, 96),
    (100, 45),
    (257, 65),
    (70, 200),
    (300, 530),
    (512, 512),
]


def _case(shape: tuple[int, int], seed: int, *, realistic: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Random payload and scales; edge cases unless ``realistic`` (then mostly fast-path blocks)."""
    rng = np.random.default_rng(seed)
    rows, k = shape
    q = rng.integers(0, 256, shape).astype(np.uint8)
    nb = -(-k // 32)
    if realistic:
        s = rng.integers(110, 130, (rows, nb)).astype(np.uint8)
        q = np.where((q & 0x7F) < 8, q | 0x40, q).astype(np.uint8)  # normal codes only ...
        q.reshape(-1)[:: max(1, q.size // 7)] = 0x03  # ... but a few subnormal codes (table path)
    else:
        s = rng.integers(0, 256, (rows, nb)).astype(np.uint8)  # every scale byte, 0 and 255 included
        s.reshape(-1)[::5] = 247  # top-of-range blocks
    return q, s


def _oracle(q: np.ndarray, s: np.ndarray, view: type) -> np.ndarray:
    dtype = np.float32 if view is np.uint32 else ml_dtypes.bfloat16
    return np.ascontiguousarray(decode_mxfp8_numpy(q, s, dtype=dtype).view(view).T)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("realistic", [False, True])
def test_transpose_equals_decode_then_transpose(shape: tuple[int, int], realistic: bool) -> None:
    q, s = _case(shape, seed=shape[0] * 1000 + shape[1], realistic=realistic)
    for dtype, view, tdtype in DTYPES:
        ref = _oracle(q, s, view)
        got = decode_mxfp8(q, s, dtype=dtype, transpose=True)  # native when available
        assert got.shape == (shape[1], shape[0]) and got.flags.c_contiguous
        assert np.array_equal(got.view(view), ref)
        fallback = decode_mxfp8_numpy(q, s, dtype=dtype, transpose=True)
        assert np.array_equal(fallback.view(view), ref)
        tq, ts = torch.from_numpy(q), torch.from_numpy(s)
        ibits = torch.int32 if view is np.uint32 else torch.int16
        on_torch = decode_mxfp8_torch(tq, ts, dtype=tdtype, transpose=True)  # the CUDA path, on CPU
        assert on_torch.is_contiguous() and tuple(on_torch.shape) == (shape[1], shape[0])
        assert np.array_equal(on_torch.view(ibits).numpy().view(view), ref)
        cpu_tensor = decode_mxfp8(tq, ts, dtype=tdtype, transpose=True)  # CPU tensor: native/numpy
        assert cpu_tensor.dtype == tdtype and cpu_tensor.is_contiguous()
        assert np.array_equal(cpu_tensor.view(ibits).numpy().view(view), ref)


def test_every_code_at_every_scale_byte() -> None:
    """All 65 536 (scale, code) pairs, laid out so that each lands in several tile positions."""
    q = np.tile(np.arange(256, dtype=np.uint8), (256, 1))  # row r: every code, scale byte r
    s = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 8, axis=1)
    for qq, ss in ((q, s), (q[:, ::-1].copy(), s), (q[:, 3:250].copy(), s[:, :8].copy())):
        for dtype, view, _ in DTYPES:
            ref = _oracle(qq, ss, view)
            assert np.array_equal(decode_mxfp8(qq, ss, dtype=dtype, transpose=True).view(view), ref)
            assert np.array_equal(decode_mxfp8_numpy(qq, ss, dtype=dtype, transpose=True).view(view), ref)


@pytest.mark.parametrize("native", [True, False])
def test_out_variants(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not native:
        monkeypatch.setenv(_native.ENV_SWITCH, "0")
    q, s = _case((96, 70), seed=7)
    for dtype, view, tdtype in DTYPES:
        ref = _oracle(q, s, view)
        out = np.full((70, 96), 9, dtype)
        assert decode_mxfp8(q, s, dtype=dtype, transpose=True, out=out) is out
        assert np.array_equal(out.view(view), ref)
        weight = torch.nn.Parameter(torch.full((70, 96), 9.0, dtype=tdtype))
        res = decode_mxfp8(torch.from_numpy(q), torch.from_numpy(s), dtype=tdtype, transpose=True, out=weight.data)
        assert res.data_ptr() == weight.data_ptr()
        bits = weight.data.view(torch.int32 if view is np.uint32 else torch.int16).numpy().view(view)
        assert np.array_equal(bits, ref)
        with pytest.raises(MXFP8Error, match="shape"):  # the untransposed shape is refused
            decode_mxfp8(q, s, dtype=dtype, transpose=True, out=np.empty((96, 70), dtype))
        with pytest.raises(MXFP8Error, match="C-contiguous"):  # so is a transposed view
            decode_mxfp8(q, s, dtype=dtype, transpose=True, out=np.empty((96, 70), dtype).T)


def test_transpose_needs_2d_payload() -> None:
    for shape in ((64,), (2, 3, 32)):
        q = np.zeros(shape, np.uint8)
        s = np.zeros((*shape[:-1], -(-shape[-1] // 32)), np.uint8)
        for fn in (decode_mxfp8, decode_mxfp8_numpy):
            with pytest.raises(MXFP8Error, match="2-D"):
                fn(q, s, transpose=True, name="w")
        with pytest.raises(MXFP8Error, match="2-D"):
            decode_mxfp8_torch(torch.from_numpy(q), torch.from_numpy(s), transpose=True, name="w")


def test_empty_shapes() -> None:
    for shape in ((0, 40), (5, 0)):
        q = np.zeros(shape, np.uint8)
        s = np.zeros((shape[0], -(-shape[1] // 32)), np.uint8)
        assert decode_mxfp8(q, s, transpose=True).shape == (shape[1], shape[0])
        assert decode_mxfp8_numpy(q, s, transpose=True).shape == (shape[1], shape[0])


@needs_native
def test_native_row_range_into_column_range() -> None:
    """``decode_transposed`` of a row range into ``out[:, r0:r1]`` (output row stride > rows)."""
    assert KERNEL is not None
    q, s = _case((130, 77), seed=3, realistic=True)
    for kind, view in (("bf16", np.uint16), ("f32", np.uint32)):
        ref = _oracle(q, s, view)
        out = np.zeros((77, 130), view)
        for r0, r1 in ((0, 64), (64, 100), (100, 130)):
            KERNEL.decode_transposed(q[r0:r1], s[r0:r1], out[:, r0:r1], decode_table(kind))
        assert np.array_equal(out, ref)


@needs_native
def test_portable_c_transpose_equals_numpy(tmp_path: Path) -> None:
    """The portable-C block routines (no AVX-512) in the tiled transpose give the same bits."""
    kernel = _native.build_variant(tmp_path / "portable.so", _native.PORTABLE_CFLAGS)
    for shape in ((64, 96), (33, 45), (300, 530)):
        for realistic in (False, True):
            q, s = _case(shape, seed=11, realistic=realistic)
            for kind, view in (("bf16", np.uint16), ("f32", np.uint32)):
                out = np.empty((shape[1], shape[0]), view)
                kernel.decode_transposed(q, s, out, decode_table(kind))
                assert np.array_equal(out, _oracle(q, s, view))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 80),
    k=st.integers(1, 100),
    seed=st.integers(0, 2**32 - 1),
    realistic=st.booleans(),
)
def test_transpose_property(rows: int, k: int, seed: int, realistic: bool) -> None:
    q, s = _case((rows, k), seed, realistic=realistic)
    for dtype, view, _ in DTYPES:
        ref = _oracle(q, s, view)
        assert np.array_equal(decode_mxfp8(q, s, dtype=dtype, transpose=True).view(view), ref)
        assert np.array_equal(decode_mxfp8_numpy(q, s, dtype=dtype, transpose=True).view(view), ref)


@pytest.mark.parametrize("native", [True, False])
def test_column_ranges_and_strided_inputs(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Block-aligned column ranges of a payload decode into row ranges of one output (how the
    loader splits a tensor over two threads); strided views give the bits of their copies."""
    if not native:
        monkeypatch.setenv(_native.ENV_SWITCH, "0")
    q, s = _case((130, 200), seed=5, realistic=True)
    for dtype, view, _ in DTYPES:
        ref = _oracle(q, s, view)
        out = np.zeros((200, 130), dtype)
        for c0, c1 in ((0, 64), (64, 192), (192, 200)):
            res = decode_mxfp8(q[:, c0:c1], s[:, c0 // 32 : -(-c1 // 32)], dtype=dtype, out=out[c0:c1], transpose=True)
            assert np.shares_memory(res, out)
        assert np.array_equal(out.view(view), ref)
        for qq in (q[::2], q[:, ::2], q[::-1]):
            ss = s[: qq.shape[0], : -(-qq.shape[1] // 32)]
            want = _oracle(np.ascontiguousarray(qq), np.ascontiguousarray(ss), view)
            assert np.array_equal(decode_mxfp8(qq, ss, dtype=dtype, transpose=True).view(view), want)


@pytest.mark.parametrize("misalign", [0, 1, 8])
def test_aligned_and_unaligned_outputs(misalign: int) -> None:
    """Outputs at a 64-byte boundary (whole-cache-line tile rows: the native kernel's streaming
    stores) and off it by ``misalign`` elements (unaligned stores) give the same bits."""
    q, s = _case((96, 128), seed=13, realistic=True)
    for dtype, view, _ in DTYPES:
        ref = _oracle(q, s, view)
        raw = np.zeros(ref.size + 64, view)
        start = (-raw.ctypes.data % 64) // raw.itemsize + misalign
        out = raw[start : start + ref.size].view(dtype).reshape(ref.shape)
        assert (out.ctypes.data - misalign * raw.itemsize) % 64 == 0
        decode_mxfp8(q, s, dtype=dtype, out=out, transpose=True)
        assert np.array_equal(out.view(view), ref)


@pytest.mark.parametrize("shape", [(31, 33), (257, 65), (300, 530), (512, 512)])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_split_decode_equals_one_call(
    shape: tuple[int, int], transpose: bool, parts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decode_mxfp8_split: disjoint pieces on a thread pool give the bits of one decode, for numpy
    arrays and CPU torch tensors, both layouts, every dtype; uneven and block-aligned splits."""
    from concurrent.futures import ThreadPoolExecutor

    import mxfp8_codec.numerics as numerics

    monkeypatch.setattr(numerics, "SPLIT_MIN_VALUES", 1)  # split even these small cases
    q, s = _case(shape, seed=parts)
    out_shape = shape[::-1] if transpose else shape
    with ThreadPoolExecutor(max_workers=max(1, parts - 1)) as pool:
        for np_dtype, bits, torch_dtype in DTYPES:
            want = decode_mxfp8(q, s, dtype=np_dtype, transpose=transpose).view(bits)
            got = np.full(out_shape, 0x5A, dtype=np_dtype)
            numerics.decode_mxfp8_split(q, s, got, pool=pool, parts=parts, transpose=transpose, name="w")
            np.testing.assert_array_equal(got.view(bits), want)
            got_t = torch.full(out_shape, 7.0, dtype=torch_dtype)
            numerics.decode_mxfp8_split(
                torch.from_numpy(q), torch.from_numpy(s), got_t, pool=pool, parts=parts, transpose=transpose, name="w"
            )
            np.testing.assert_array_equal(cpu_tensor_view(got_t).view(bits), want)


@needs_native
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_team_decode_equals_one_call(threads: int) -> None:
    """decode_mxfp8(team=(torch's OpenMP runtime, threads)): the rows (transposed: the block columns)
    split over an OpenMP team give the bits of one decode, every dtype and shape (fewer rows or blocks
    than threads, partial blocks), numpy and torch; a team wider than the machine too."""
    from mxfp8_codec.hf_modules import _torch_openmp_runtime

    runtime = _torch_openmp_runtime()
    if runtime is None:
        pytest.skip(f"torch's parallel backend is not a findable OpenMP runtime: {torch.__config__.parallel_info()}")
    for i, shape in enumerate(SHAPES):
        q, s = _case(shape, seed=100 + i)
        for np_dtype, bits, torch_dtype in DTYPES:
            want = decode_mxfp8(q, s, dtype=np_dtype).view(bits)
            got = np.full(shape, 0x5A, dtype=np_dtype)
            decode_mxfp8(q, s, dtype=np_dtype, out=got, team=(runtime, threads))
            np.testing.assert_array_equal(got.view(bits), want, err_msg=str(shape))
            got_t = torch.full(shape, 7.0, dtype=torch_dtype)
            decode_mxfp8(
                torch.from_numpy(q), torch.from_numpy(s), dtype=torch_dtype, out=got_t, team=(runtime, threads)
            )
            np.testing.assert_array_equal(
                got_t.view(torch.int16 if bits == np.uint16 else torch.int32).numpy().view(bits),
                want,
                err_msg=str(shape),
            )
            if len(shape) == 2:
                got = np.full(shape[::-1], 0x5A, dtype=np_dtype)
                decode_mxfp8(q, s, dtype=np_dtype, out=got, transpose=True, team=(runtime, threads))
                np.testing.assert_array_equal(got.view(bits), want.T, err_msg=f"{shape} transposed")


def test_forwards_find_torchs_openmp_runtime() -> None:
    """Where torch runs on OpenMP and /proc exists, mxfp8_codec.hf finds the runtime library torch
    loaded (so a forward's decode runs on torch's threads, not on one)."""
    from mxfp8_codec.hf_modules import _torch_openmp_runtime

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info() or not Path("/proc/self/maps").exists():
        pytest.skip("torch's parallel backend is not OpenMP here, or no /proc")
    runtime = _torch_openmp_runtime()
    assert runtime is not None
    assert any(line.rstrip().endswith(runtime) for line in Path("/proc/self/maps").read_text().splitlines())
