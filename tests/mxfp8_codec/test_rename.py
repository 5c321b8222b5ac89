"""Header-only rename: data bytes untouched, sha256 proof, collisions refused, constant memory."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file as np_save_file

from mxfp8_codec import (
    MXFP8Error,
    MXFP8Tensor,
    open_mxfp8,
    prefix_mapping,
    read_header,
    rename_tensors,
    validate,
    verify_renamed,
    write_mxfp8_safetensors,
)
from mxfp8_codec.rename import COPY_BUFFER_BYTES
from tests.conftest import flip_bit


def _ckpt(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tensors = {
        "blk.0.attn.q_proj.weight": rng.standard_normal((64, 96)).astype(np.float32),
        "blk.0.mlp.up_proj.weight": rng.standard_normal((64, 40)).astype(np.float32),
        "blk.0.norm.weight": rng.standard_normal(64).astype(np.float32),
        "tok.weight": rng.standard_normal((16, 64)).astype(np.float32),
    }
    write_mxfp8_safetensors(path, tensors)
    return tensors


def _data_section(path: Path) -> bytes:
    h = read_header(path)
    return path.read_bytes()[h.data_start :]


def test_rename_keeps_every_data_byte_and_reports_sha256(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.safetensors", tmp_path / "dst.safetensors"
    _ckpt(src)
    report = rename_tensors(
        src, dst, {"blk.0.attn.q_proj.weight": "model.layers.0.self_attn.q_proj.weight"}, metadata={"renamed": "yes"}
    )
    assert _data_section(src) == _data_section(dst)
    assert report.data_sha256 == hashlib.sha256(_data_section(src)).hexdigest()
    assert ("blk.0.attn.q_proj.weight.scale", "model.layers.0.self_attn.q_proj.weight.scale") in report.renamed
    assert len(report.renamed) == 2 and len(report.tensors) == 6
    with open_mxfp8(src) as a, open_mxfp8(dst) as b:
        assert b.metadata == {**a.metadata, "renamed": "yes"}
        for old, new, sha in report.tensors:
            assert hashlib.sha256(bytes(a.tensor_bytes(old))).hexdigest() == sha
            assert hashlib.sha256(bytes(b.tensor_bytes(new))).hexdigest() == sha
            assert a.header.entries[old].dtype == b.header.entries[new].dtype
        assert b.is_quantized("model.layers.0.self_attn.q_proj.weight")
        np.testing.assert_array_equal(
            a.get("blk.0.attn.q_proj.weight"), b.get("model.layers.0.self_attn.q_proj.weight")
        )
    validate(dst)
    verify_renamed(dst, report)


def test_prefix_function_and_in_place_rename(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    tensors = _ckpt(path)
    data = _data_section(path)
    report = rename_tensors(path, path, prefix_mapping({"blk.": "model.layers.", "tok.": "model.embed_tokens."}))
    assert _data_section(path) == data
    with open_mxfp8(path) as r:
        assert sorted(r.keys()) == sorted(
            prefix_mapping({"blk.": "model.layers.", "tok.": "model.embed_tokens."})(k) for k in tensors
        )
    assert len(report.renamed) == 6


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ({"nope": "x"}, "'nope': not in the file"),
        ({"blk.0.attn.q_proj.weight.scale": "x.scale"}, "a scale follows its payload"),
        ({"blk.0.norm.weight": "tok.weight"}, "'tok.weight': rename collision"),
        ({"blk.0.norm.weight": "x", "tok.weight": "x"}, "'x': rename collision"),
        ({"blk.0.norm.weight": "blk.0.mlp.up_proj.weight.scale"}, "rename collision"),
        ({"blk.0.norm.weight": ""}, "invalid new name"),
        ({"blk.0.norm.weight": "__metadata__"}, "invalid new name"),
        ({"blk.0.norm.weight": 3}, "must be a str"),
        (lambda n: None, "returned NoneType"),
    ],
)
def test_rename_refuses_bad_mappings(tmp_path: Path, mapping, match: str) -> None:
    src = tmp_path / "src.safetensors"
    _ckpt(src)
    with pytest.raises(MXFP8Error, match=match):
        rename_tensors(src, tmp_path / "dst.safetensors", mapping)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.safetensors"]


def test_rename_result_must_be_a_valid_file(tmp_path: Path) -> None:
    """Renaming a plain U8 tensor to 'X.scale' without a payload X would create an orphan scale."""
    src = tmp_path / "s.safetensors"
    write_mxfp8_safetensors(src, {"idx": np.zeros(4, np.uint8), "w.q_proj.weight": np.ones((1, 32), np.float32)})
    with pytest.raises(MXFP8Error, match="orphan scale"):
        rename_tensors(src, tmp_path / "d.safetensors", {"idx": "ghost.scale"})


def test_verify_renamed_detects_changed_bytes(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.safetensors", tmp_path / "dst.safetensors"
    _ckpt(src)
    report = rename_tensors(src, dst, prefix_mapping({"blk.": "layers."}))
    h = read_header(dst)
    target = h.entries["layers.0.norm.weight"]
    flip_bit(dst, h.data_start + target.begin + 3)  # one bit of one BF16 value
    validate(dst)  # structurally still fine ...
    with pytest.raises(MXFP8Error, match="'layers.0.norm.weight': sha256"):  # ... but not the same weights
        verify_renamed(dst, report)


def test_plain_safetensors_files_can_be_renamed(tmp_path: Path) -> None:
    src, dst = tmp_path / "hf.safetensors", tmp_path / "out.safetensors"
    np_save_file(
        {"a": np.arange(10, dtype=np.float32), "b": np.ones((2, 2), np.int32)}, str(src), metadata={"format": "pt"}
    )
    rename_tensors(src, dst, {"a": "model.a"})
    with open_mxfp8(dst) as r:
        assert r.metadata == {"format": "pt"}
        np.testing.assert_array_equal(r.get("model.a"), np.arange(10, dtype=np.float32))
    assert _data_section(src) == _data_section(dst)


def test_rename_copies_in_constant_memory(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    src = tmp_path / "big.safetensors"
    payload = rng.integers(0, 256, (4096, 4096), dtype=np.uint8)  # 16 MiB of data
    write_mxfp8_safetensors(src, {"w": MXFP8Tensor(payload, rng.integers(0, 255, (4096, 128), dtype=np.uint8))})
    size = src.stat().st_size
    del payload
    tracemalloc.start()
    try:
        rename_tensors(src, tmp_path / "renamed.safetensors", {"w": "model.w"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size > 16 * COPY_BUFFER_BYTES
    assert peak < COPY_BUFFER_BYTES + 512 * 1024, f"peak {peak} bytes while renaming a {size}-byte file"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    names=st.lists(
        st.from_regex(r"[a-z]{1,6}(\.[a-z0-9]{1,4}){0,2}", fullmatch=True), min_size=1, max_size=6, unique=True
    ),
    seed=st.integers(0, 2**32 - 1),
    quantize_mask=st.integers(0, 63),
)
def test_rename_there_and_back_is_byte_identical(
    tmp_path: Path, names: list[str], seed: int, quantize_mask: int
) -> None:
    """Renaming every tensor to a fresh name and back reproduces the writer's file exactly."""
    rng = np.random.default_rng(seed)
    tensors = {n: rng.standard_normal((3, int(rng.integers(1, 70)))).astype(np.float32) for n in names}
    chosen = {n for i, n in enumerate(names) if quantize_mask >> i & 1}
    a, b, c = (tmp_path / f"{x}.safetensors" for x in "abc")
    write_mxfp8_safetensors(a, tensors, quantize=lambda n: n in chosen)
    there = {n: f"renamed_{i}" for i, n in enumerate(names)}
    r1 = rename_tensors(a, b, there)
    r2 = rename_tensors(b, c, {v: k for k, v in there.items()})
    assert c.read_bytes() == a.read_bytes()
    assert r1.data_sha256 == r2.data_sha256
    assert [t[2] for t in r1.tensors] == [t[2] for t in r2.tensors]
