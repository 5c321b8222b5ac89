"""Every reader of an MXFP8 checkpoint yields the same model, for every architecture x norm convention
x orientation (mxfp8_codec.layout is the one rule): ``python -m mxfp8_codec dequantize`` +
``from_pretrained``, ``ida_eval.load_model``, ``mxfp8_codec.load_file`` + ``load_state_dict``, and the
seeds' plain recipe (``read_mxfp8_safetensors``, transpose projections) where it applies -- and a
warning naming the file where it does not."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from ida_eval import load_model
from mxfp8_codec import is_projection_weight, load_file, read_mxfp8_safetensors, save_file
from mxfp8_codec.cli import main as codec_main
from tests.ida_eval.support import tiny_model

ARCHS = ("nemotron", "llama", "qwen3", "gemma")
ADDS_ONE = {"nemotron": True, "gemma": True, "llama": False, "qwen3": False}  # run-time norm gain 1 + w?


def _model(arch: str, vocab: int):
    if arch != "gemma":
        return tiny_model(arch, vocab)
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "gemma",
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.bfloat16) if v.is_floating_point() else v for k, v in model.state_dict().items()}


@pytest.mark.parametrize("orientation", ["in_out", "out_in"])
@pytest.mark.parametrize("convention", ["zero_centered", "folded"])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_reader_yields_the_same_model(arch, convention, orientation, tok, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = _model(arch, len(tok))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    model.config.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    save_file(
        model.state_dict(),
        ckpt / "model.safetensors",
        orientation=orientation,
        norm_convention=convention,
        model_type=model.config.model_type,
    )

    # 1. the CLI: dequantize to plain BF16, then transformers' own from_pretrained
    assert codec_main(["dequantize", str(ckpt), str(tmp_path / "plain")]) == 0
    cli = _state(AutoModelForCausalLM.from_pretrained(tmp_path / "plain", dtype=torch.bfloat16))
    # 2. ida_eval.load_model
    loaded = _state(load_model(ckpt)[0])
    # 3. mxfp8_codec.load_file + load_state_dict into a model built from the config
    fresh = AutoModelForCausalLM.from_config(model.config, dtype=torch.bfloat16)
    fresh.load_state_dict(load_file(ckpt / "model.safetensors", dtype=torch.bfloat16), strict=True)
    via_load_file = _state(fresh)

    assert cli.keys() == loaded.keys() == via_load_file.keys()
    for name in cli:
        assert torch.equal(cli[name], loaded[name]), f"{name}: dequantize vs load_model"
        assert torch.equal(cli[name], via_load_file[name]), f"{name}: dequantize vs load_file"
    # the norm weights are the original parameters (up to bf16 rounding of 1 + w when folded)
    w = model.model.norm.weight.detach()
    want = ((1.0 + w).to(torch.bfloat16).float() - 1.0) if (convention == "folded" and ADDS_ONE[arch]) else w
    assert torch.equal(loaded["model.norm.weight"], want.to(torch.bfloat16))

    # 4. the seeds' recipe: read_mxfp8_safetensors, transpose projections, load_state_dict
    recipe_ok = orientation == "in_out" and not (convention == "folded" and ADDS_ONE[arch])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arrays = read_mxfp8_safetensors(ckpt / "model.safetensors")
    ours = [w for w in caught if "model.safetensors" in str(w.message) and "load_file" in str(w.message)]
    assert bool(ours) is not recipe_ok, [str(w.message) for w in caught]
    if recipe_ok:
        sd = {n: torch.from_numpy(a.T.copy() if is_projection_weight(n) else a) for n, a in arrays.items()}
        recipe = AutoModelForCausalLM.from_config(model.config, dtype=torch.bfloat16)
        recipe.load_state_dict(sd, strict=True)
        for name, t in _state(recipe).items():
            assert torch.equal(t, cli[name]), f"{name}: plain recipe vs dequantize"
