"""Memory per parameter per recipe, checked on the meta device (4B preset) and against real tensors (tiny)."""

from __future__ import annotations

import pytest
import torch
from transformers import NemotronConfig, NemotronForCausalLM

from ida_trainer.cli import PRESETS, preset_config
from ida_trainer.config import OptimConfig, PrecisionConfig
from ida_trainer.memory import (
    GIB,
    PRESET_ARCHITECTURES,
    ActivationSpec,
    fsdp_memory,
    job_memory,
    main,
    memory_warning,
    minitron_4b_config,
    qwen3_4b_config,
    stage_memory,
)
from ida_trainer.precision import apply_recipe, build_optimizer, count_parameters

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="module")
def nvfp4_4b() -> list:
    return stage_memory(
        minitron_4b_config(),
        PrecisionConfig(recipe="nvfp4"),
        stages=2,
        activations=ActivationSpec(tokens_per_microbatch=1024, checkpointing=True),
    )


def test_minitron_4b_nvfp4_fits_two_16gb_stages(nvfp4_4b: list) -> None:
    assert sum(s.params for s in nvfp4_4b) == pytest.approx(4.19e9, rel=2e-3)
    for s in nvfp4_4b:
        assert s.total_bytes < 16 * GIB, s.row()
    # the last stage carries lm_head + logits, the first the embeddings: both present and counted
    assert nvfp4_4b[0].logits_bytes == 0 and nvfp4_4b[1].logits_bytes > 0


def test_bytes_per_parameter_follow_the_documented_table(nvfp4_4b: list) -> None:
    cfg = minitron_4b_config()
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    s0 = nvfp4_4b[0]
    head_dim, kv = cfg.head_dim, cfg.num_key_value_heads
    proj = 16 * (2 * hidden * hidden + 2 * hidden * kv * head_dim + 2 * hidden * cfg.intermediate_size)
    bf16 = s0.params - proj  # embeddings + norms
    assert bf16 > vocab * hidden
    static = s0.weights_bytes + s0.grads_bytes + s0.optimizer_bytes
    # nvfp4: 1 + 1/32 (MXFP8) + 2 (BF16 grad) + 2 (BF16 Lion momentum) per projection parameter, 6 B per BF16 one
    assert static == pytest.approx(proj * (1 + 1 / 32 + 2 + 2) + bf16 * 6, rel=1e-6)
    comp = stage_memory(minitron_4b_config(), PrecisionConfig(recipe="nvfp4", writeback="compensated"), stages=2)
    assert comp[0].optimizer_bytes - s0.optimizer_bytes == proj * 4


def test_bf16_recipe_does_not_fit_and_keep_bf16_costs_memory() -> None:
    bf16 = stage_memory(minitron_4b_config(), PrecisionConfig(recipe="bf16"), stages=2)
    assert all(s.total_bytes > 32 * GIB for s in bf16)  # 18 B/param: why the original run needed NVFP4 + MXFP8
    base = stage_memory(minitron_4b_config(), PrecisionConfig(recipe="nvfp4"), stages=2)
    kept = stage_memory(
        minitron_4b_config(), PrecisionConfig(recipe="nvfp4", keep_bf16=("model.layers.31.*",)), stages=2
    )
    assert kept[0].total_bytes == base[0].total_bytes and kept[1].total_bytes > base[1].total_bytes


@pytest.mark.parametrize("recipe", ["nvfp4", "bf16"])
def test_meta_count_matches_real_tensors_after_a_step(recipe: str) -> None:
    # Oracle: materialize a tiny model, take one optimizer step, sum the bytes of every real tensor.
    torch.manual_seed(0)
    model = NemotronForCausalLM(NemotronConfig(**TINY))
    prec = PrecisionConfig(recipe=recipe)
    apply_recipe(model, prec)
    opt = build_optimizer(model, OptimConfig(name="lion" if recipe == "nvfp4" else "adamw", lr=1e-3), prec)
    ids = torch.randint(0, 256, (1, 16))
    model(input_ids=ids).logits.float().sum().backward()
    opt.step()
    anchors = {id(m.weight) for m in model.modules() if hasattr(m, "weight_payload")}
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in anchors)
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    state = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )
    est = stage_memory(NemotronConfig(**TINY), prec, stages=1)[0]
    # bf16: autocast's BF16 copies for the GEMMs (embedding lookups make none). With activation checkpointing
    # lm_head's is held for backward and one layer's at a time is a transient; without, every one is held.
    copies = {n: 2 * p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n}
    per_layer = [sum(b for n, b in copies.items() if f"layers.{i}." in n) for i in range(TINY["num_hidden_layers"])]
    held = 0 if recipe == "nvfp4" else copies["lm_head.weight"]
    assert est.weights_bytes == weights + held
    if recipe == "bf16":
        assert est.transient_bytes == max(per_layer)
        unchecked = stage_memory(NemotronConfig(**TINY), prec, stages=1, activations=ActivationSpec(16, False))[0]
        assert unchecked.weights_bytes == weights + sum(copies.values()) and unchecked.transient_bytes == 0
    assert est.grads_bytes == grads
    assert est.optimizer_bytes == state
    assert est.params == count_parameters(model)


def test_cli_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--stages", "2", "--tokens", "512"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 16-31 |" in out and "Minitron-4B" in out


def test_the_minitron_4b_preset_as_configured_fits_two_16gb_stages() -> None:
    # The preset's own settings: keep_bf16 layers, 2 stages, checkpointing, 4 packed 2048-token rows per micro-batch.
    job = preset_config("minitron-4b")
    assert job.parallel.pipeline_stages == 2 and job.model.activation_checkpointing
    report = job_memory(minitron_4b_config(), job)
    assert len(report) == 2
    for s in report:
        assert s.total_bytes < 16 * GIB, s.row()
    # the last stage only fits because lm_head + loss run in token chunks (whole logits: 27 GiB)
    assert 4 * job.data.max_len * minitron_4b_config().vocab_size * 14 > 16 * GIB


def test_the_qwen3_4b_nvfp4_preset_as_configured_fits_two_16gb_stages() -> None:
    # nvfp4 over two stages, the tied lm_head borrowed by the last one; 2 rows of up to 4096 tokens per micro-batch
    job = preset_config("qwen3-4b-nvfp4")
    report = job_memory(qwen3_4b_config(), job)
    assert len(report) == 2 and max(s.total_bytes for s in report) < 16 * GIB, [s.row() for s in report]
    assert set(PRESET_ARCHITECTURES) == set(PRESETS) - {"demo"}  # every preset can be counted


def test_the_qwen3_4b_preset_as_configured_fits_80gb_ranks_only_with_chunked_logits() -> None:
    # The preset's own settings on 2 FSDP ranks: bf16 recipe, checkpointing, 8 rows of up to 4096 tokens.
    job = preset_config("qwen3-4b")
    assert job.parallel.data_parallel == "fsdp" and job.model.activation_checkpointing
    [est] = job_memory(qwen3_4b_config(), job, world_size=2)
    assert est.params * 2 == pytest.approx(4.02e9, rel=2e-3)  # Qwen3-4B, embeddings tied
    assert est.weights_bytes + est.grads_bytes + est.optimizer_bytes == pytest.approx(16 * est.params, rel=1e-6)
    assert est.total_bytes < 64 * GIB, est.row()  # an 80 GB card, with room to spare
    # the whole logits alone (as LocalEngine made them before it chunked) would not fit beside the rest
    tokens = 8 * job.data.max_len
    assert est.total_bytes - est.logits_bytes + tokens * qwen3_4b_config().vocab_size * 14 > 80 * GIB
    same = fsdp_memory(qwen3_4b_config(), job.precision, ranks=2, activations=ActivationSpec(tokens))
    assert est == same  # job_memory's micro-batch: 64 rows / (4 micro-batches x 2 ranks) x 4096 tokens


def test_the_cli_prints_a_preset_as_configured(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--preset", "qwen3-4b", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "FSDP2 over 2 rank(s), rank 0, 8 row(s) of up to 4096 tokens per micro-batch" in out
    assert "| 0 | 0-35 | 2.011 B |" in out and "largest per GPU: 55.7 GiB" in out
    assert main(["--preset", "minitron-4b"]) == 0
    out = capsys.readouterr().out
    assert (
        "2 stage(s), 4 row(s) of up to 2048 tokens" in out
        and "| 1 | 16-31 |" in out
        and "largest per GPU: 15.5 GiB" in out
    )


def test_fsdp_memory_refuses_nvfp4_and_the_cli_prints_a_rank(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="runs the bf16 recipe only"):
        fsdp_memory(qwen3_4b_config(), PrecisionConfig(recipe="nvfp4"), ranks=2)
    assert main(["--model", "qwen3-4b", "--recipe", "bf16", "--data-parallel", "fsdp", "--ranks", "4"]) == 0
    out = capsys.readouterr().out
    assert "FSDP2 over 4 rank(s)" in out and "| rank | layers |" in out and "| 0 | 0-35 |" in out
    assert main(["--data-parallel", "fsdp"]) == 2  # nvfp4, the default recipe
    assert "--data-parallel fsdp runs the bf16 recipe only" in capsys.readouterr().err


def test_the_tables_in_docs_are_the_estimates() -> None:
    # docs/trainer_precision.md quotes these tables: each row must be what the code computes (bold aside)
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "trainer_precision.md").read_text().replace("**", "")
    for recipe in ("nvfp4", "bf16"):
        for s in stage_memory(minitron_4b_config(), PrecisionConfig(recipe=recipe), stages=2):
            assert f"| {recipe} {s.row()}" in doc, s.row()
    for stages in (1, 2):  # Qwen3-4B, nvfp4, one 4096-token row per micro-batch
        for s in stage_memory(
            qwen3_4b_config(), PrecisionConfig(recipe="nvfp4"), stages=stages, activations=ActivationSpec(4096)
        ):
            assert f"| {stages} {s.row()}" in doc, s.row()
    for ranks in (1, 2, 4, 8):
        tokens = 16 * 4096 // ranks
        est = fsdp_memory(
            qwen3_4b_config(), PrecisionConfig(recipe="bf16"), ranks=ranks, activations=ActivationSpec(tokens)
        )
        assert f"| {ranks} | {tokens} " + est.row().removeprefix("| 0 | 0-35 ") in doc, est.row()


def test_the_trainer_warns_when_the_count_exceeds_the_gpu() -> None:
    # what Trainer.setup warns on a GPU (rank 0) after loading the base: the qwen3-4b preset needs 103.6 GiB in one
    # process, 55.7 per rank on two
    job = preset_config("qwen3-4b")
    line = memory_warning(qwen3_4b_config(), job, world_size=1, device_bytes=80 * 10**9)
    assert line is not None and line.startswith("this run needs about 103.6 GiB per GPU")
    assert "and the GPU has 74.5 GiB: expect it to run out of memory; lower --train.global_batch_size" in line
    assert memory_warning(qwen3_4b_config(), job, world_size=2, device_bytes=80 * 10**9) is None
