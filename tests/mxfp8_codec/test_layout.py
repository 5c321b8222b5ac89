"""mxfp8_codec.layout: projection names, orientation and the per-architecture norm-folding rule."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from mxfp8_codec import MXFP8Error
from mxfp8_codec.layout import (
    NORM_RULES,
    PROJECTION_NAMES,
    CheckpointLayout,
    file_norm_convention,
    file_orientation,
    fold_norm,
    is_norm_weight,
    is_projection_weight,
    model_type_of,
    norm_adds_one,
    transposes,
    unfold_norm,
)

MODEL_TYPES = [t for rule in NORM_RULES for t in rule.model_types]


def test_projection_names() -> None:
    for p in PROJECTION_NAMES:
        assert is_projection_weight(f"model.layers.0.mlp.{p}.weight")
        assert is_projection_weight(f"{p}.weight")
        assert not is_projection_weight(f"model.layers.0.mlp.{p}.bias")
        assert not is_projection_weight(f"model.layers.0.mlp.x{p}.weight")
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight", "model.layers.0.qkv_proj.weight"):
        assert not is_projection_weight(name)


def test_orientation_rules() -> None:
    assert transposes("a.q_proj.weight", 2, "in_out") and not transposes("a.q_proj.weight", 2, "out_in")
    assert not transposes("a.q_proj.weight", 1, "in_out")  # only 2-D projection weights
    assert not transposes("lm_head.weight", 2, "in_out")
    with pytest.raises(MXFP8Error, match="orientation must be one of"):
        transposes("a.q_proj.weight", 2, "row_major")
    assert file_orientation({"weights_dtype": "MXFP8_E4M3_UE8M0_K32"}) == "in_out"  # MXFP8 default
    assert file_orientation({}) == "out_in"  # a plain transformers file
    assert file_orientation({"orientation": "out_in", "weights_dtype": "MXFP8_E4M3_UE8M0_K32"}) == "out_in"
    assert file_norm_convention({}) == "zero_centered"
    with pytest.raises(MXFP8Error, match=r"f.safetensors: norm_convention must be one of .*'shifted'"):
        file_norm_convention({"norm_convention": "shifted"}, source="f.safetensors")


def test_to_and_from_transformers_are_inverse() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    g = rng.standard_normal(4).astype(np.float32)
    for lay in (CheckpointLayout("in_out", "folded", "nemotron"), CheckpointLayout("out_in", "folded", "gemma")):
        stored = lay.from_transformers("m.o_proj.weight", w)
        assert stored.shape == ((4, 8) if lay.orientation == "in_out" else (8, 4))
        np.testing.assert_array_equal(lay.to_transformers("m.o_proj.weight", stored), w)
        np.testing.assert_array_equal(lay.from_transformers("m.norm.weight", g), g + 1)
        np.testing.assert_array_equal(
            lay.to_transformers("m.norm.weight", lay.from_transformers("m.norm.weight", g)), (g + 1) - 1
        )
        np.testing.assert_array_equal(lay.to_transformers("m.norm.bias", g), g)  # biases never fold
    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    assert torch.equal(CheckpointLayout().to_transformers("x.up_proj.weight", t), t.t())
    assert unfold_norm(torch.tensor([1.5], dtype=torch.bfloat16)).dtype == torch.float32
    assert fold_norm(np.array([0.5], ml_dtypes.bfloat16)).dtype == np.float32


def test_folded_norm_rule_per_architecture() -> None:
    assert is_norm_weight("model.layers.0.input_layernorm.weight", 1) and is_norm_weight("x.self_attn.q_norm.weight", 1)
    assert not is_norm_weight("model.norm.weight", 2) and not is_norm_weight("model.norm.bias", 1)
    for mt, adds in [("nemotron", True), ("gemma", True), ("gemma3_text", True), ("llama", False), ("qwen3", False)]:
        assert norm_adds_one("model.norm.weight", 1, mt) is adds
        assert not norm_adds_one("model.layers.0.mlp.up_proj.weight", 2, mt)
    # a folded Llama file is the zero-centred file: nothing to unfold
    assert CheckpointLayout("out_in", "folded", "llama").is_transformers_layout
    assert not CheckpointLayout("out_in", "folded", "nemotron").is_transformers_layout
    # an unknown architecture with folded norms is refused (no guess); zero_centered needs no type
    with pytest.raises(
        MXFP8Error, match=r"ckpt: norm_convention=folded, but model_type 'mamba' is not in the norm table"
    ):
        CheckpointLayout("in_out", "folded", "mamba", source="ckpt")
    with pytest.raises(MXFP8Error, match="model type is unknown"):
        CheckpointLayout("in_out", "folded")
    assert CheckpointLayout("in_out", "zero_centered", "mamba").unfolds("model.norm.weight", 1) is False


def test_model_type_of(tmp_path: Path) -> None:
    assert model_type_of(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert model_type_of(tmp_path) == "qwen3" and model_type_of(tmp_path / "model.safetensors") == "qwen3"
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"model_type": "gemma3_text"}}))
    assert model_type_of(tmp_path) == "gemma3_text"
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(MXFP8Error, match="config.json: not a JSON object"):
        model_type_of(tmp_path)


def _tiny_config(model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(
        model_type,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        num_experts=2,
        num_local_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_norm_table_matches_the_modules(model_type: str) -> None:
    """The table (decided without a model) agrees with what each norm module does at run time:
    with its weight set to 0 a norm that multiplies by ``w`` outputs 0; one that uses ``1 + w`` does not."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(_tiny_config(model_type)).eval()
    norms = [n for n, p in model.named_parameters() if is_norm_weight(n, p.dim())]
    assert norms, f"{model_type}: no norm weights found"
    gen = torch.Generator().manual_seed(0)
    for name in norms:
        module = model.get_submodule(name.rsplit(".", 1)[0])
        x = torch.randn(1, 3, module.weight.shape[0], generator=gen) + 0.5
        with torch.no_grad():
            module.weight.zero_()
            out = module(x)
        adds = bool(out.abs().max() > 0)
        assert norm_adds_one(name, 1, model_type) is adds, (
            f"{model_type}: {name} ({type(module).__name__}) adds 1: {adds}"
        )
