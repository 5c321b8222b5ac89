"""read_mxfp8_safetensors is no trap (metadata, bf16, warnings); load_file / save_file round trip."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from mxfp8_codec import (
    MXFP8Error,
    decode_mxfp8,
    encode_mxfp8,
    load_file,
    read_mxfp8_metadata,
    read_mxfp8_safetensors,
    save_file,
    write_mxfp8_safetensors,
)


def test_metadata_is_available(tmp_path: Path) -> None:
    p = tmp_path / "m.safetensors"
    write_mxfp8_safetensors(p, {"a.q_proj.weight": np.ones((32, 64), np.float32)}, metadata={"step": "7"})
    tensors, meta = read_mxfp8_safetensors(p, with_metadata=True)
    assert meta["orientation"] == "in_out" and meta["step"] == "7" and tensors["a.q_proj.weight"].shape == (32, 64)
    assert read_mxfp8_metadata(p) == meta
    assert isinstance(read_mxfp8_safetensors(p), dict)


def test_torch_bfloat16_request_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "m.safetensors"
    write_mxfp8_safetensors(p, {"a.q_proj.weight": np.ones((32, 64), np.float32)})
    with pytest.raises(MXFP8Error, match=r"m.safetensors: .*torch.from_numpy.*load_file\(path, dtype=torch.bfloat16\)"):
        read_mxfp8_safetensors(p, dtype=torch.bfloat16)
    arrays = read_mxfp8_safetensors(p, dtype=torch.float32)  # what torch.from_numpy takes
    assert torch.from_numpy(arrays["a.q_proj.weight"]).dtype == torch.float32


def test_warning_names_the_file_only_when_the_recipe_would_be_wrong(tmp_path: Path) -> None:
    w = np.ones((32, 64), np.float32)
    cases = {
        "plain": ({}, False),
        "out_in": ({"orientation": "out_in"}, True),
        "folded_unknown": ({"norm_convention": "folded"}, True),
    }
    for name, (kw, warns) in cases.items():
        p = tmp_path / name / "model.safetensors"
        p.parent.mkdir()
        write_mxfp8_safetensors(p, {"a.q_proj.weight": w, "a.norm.weight": np.ones(32, np.float32)}, **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            read_mxfp8_safetensors(p)
        assert bool([c for c in caught if str(p) in str(c.message)]) is warns, name
    (tmp_path / "folded_unknown" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a folded Llama file is the zero-centred file: no warning
        read_mxfp8_safetensors(tmp_path / "folded_unknown" / "model.safetensors")


@pytest.mark.parametrize("orientation", ["in_out", "out_in"])
def test_save_file_load_file_round_trip(orientation: str, tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    sd = {
        "model.layers.0.self_attn.o_proj.weight": torch.randn(48, 64, generator=g) * 0.02,  # [out, in]
        "model.layers.0.input_layernorm.weight": torch.randn(64, generator=g) * 0.1,
        "model.embed_tokens.weight": torch.randn(10, 64, generator=g),
        "ids": torch.arange(3),
    }
    p = tmp_path / "model.safetensors"
    save_file(sd, p, orientation=orientation, norm_convention="folded", model_type="nemotron")
    meta = read_mxfp8_metadata(p)
    assert meta["orientation"] == orientation and meta["norm_convention"] == "folded"
    back = load_file(p, dtype=torch.float32, model_type="nemotron")
    w = sd["model.layers.0.self_attn.o_proj.weight"]
    stored = w.t().contiguous() if orientation == "in_out" else w
    want = decode_mxfp8(*encode_mxfp8(stored), dtype=torch.float32)
    assert torch.equal(back["model.layers.0.self_attn.o_proj.weight"], want.t() if orientation == "in_out" else want)
    n = sd["model.layers.0.input_layernorm.weight"]
    assert torch.equal(back["model.layers.0.input_layernorm.weight"], (1 + n).to(torch.bfloat16).float() - 1)
    assert torch.equal(back["ids"], sd["ids"])
    bf = load_file(tmp_path, dtype=torch.bfloat16, model_type="nemotron")  # a directory works too
    assert bf["model.layers.0.self_attn.o_proj.weight"].dtype == torch.bfloat16
    assert torch.equal(
        bf["model.layers.0.self_attn.o_proj.weight"], back["model.layers.0.self_attn.o_proj.weight"].to(torch.bfloat16)
    )
    with pytest.raises(MXFP8Error, match="model type is unknown"):
        load_file(p)  # folded, no config.json, no model_type: refused, not guessed
