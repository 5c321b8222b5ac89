"""A model built on the meta device and made real for a resume: its ties kept, its computed buffers computed."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ida_trainer.config import PrecisionConfig
from ida_trainer.precision import apply_recipe
from ida_trainer.sharded import compute_non_persistent_buffers, to_empty_keeping_ties
from tests.ida_eval.support import tiny_config, tiny_model


@pytest.mark.parametrize("arch", ["qwen3", "llama", "nemotron"])
def test_a_model_built_empty_gets_the_buffers_no_checkpoint_holds_and_keeps_its_ties(arch: str) -> None:
    """``--resume`` builds the model empty on every rank and loads every persistent tensor from the checkpoint;
    the rotary tables are not in it and must be transformers' own, and a tied lm_head must stay the embedding
    (``to_empty`` alone makes it a second matrix)."""
    real = tiny_model(arch, 300, tie=True)
    with torch.device("meta"):
        empty = AutoModelForCausalLM.from_config(tiny_config(arch, 300, tie=True))
    apply_recipe(empty, PrecisionConfig(recipe="nvfp4"))
    to_empty_keeping_ties(empty, "cpu")
    assert empty.lm_head.weight is empty.model.embed_tokens.weight and not empty.lm_head.weight.is_meta
    compute_non_persistent_buffers(empty)
    persistent = set(real.state_dict())
    computed = {n: b for n, b in real.named_buffers() if n not in persistent}
    assert computed and all("rotary_emb" in n for n in computed)
    mine = dict(empty.named_buffers())
    for name, want in computed.items():
        assert torch.equal(mine[name], want) and mine[name].dtype == want.dtype, name


def test_a_non_persistent_buffer_nothing_computes_is_named() -> None:
    model = tiny_model("llama", 300)
    model.model.layers[0].register_buffer("scratch", torch.zeros(3), persistent=False)
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.scratch: a non-persistent buffer of a LlamaDecoderLayer"):
        compute_non_persistent_buffers(model)
