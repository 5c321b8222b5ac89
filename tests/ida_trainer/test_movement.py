"""ida_trainer.movement: how much of the MXFP8 master a Lion step moved, against a full decode of the master,
and the two write-backs it tells apart; the trainer logs it for the nvfp4 recipe only."""

from __future__ import annotations

import json

import pytest
import torch

import nvfp4_cuda
from ida_trainer.movement import SAMPLE_PER_TENSOR, MasterMovement
from ida_trainer.nvfp4_linear import NVFP4Linear
from mxfp8_codec import decode_mxfp8, encode_mxfp8


def _master(rows: int, cols: int, seed: int) -> NVFP4Linear:
    """An NVFP4Linear ([out, in] = [cols, rows]) holding N(0, 0.02) weights in its MXFP8 master."""
    lin = NVFP4Linear(rows, cols)
    g = torch.Generator().manual_seed(seed)
    payload, scales = encode_mxfp8(torch.randn(rows, cols, generator=g) * 0.02)
    lin.weight_payload.copy_(payload)
    lin.weight_scales.copy_(scales)
    return lin


def _lion(lin: NVFP4Linear, lr: float, writeback: str, seed: int = 0) -> None:
    g = torch.randn(lin.weight_payload.shape, generator=torch.Generator().manual_seed(seed + 1))
    momentum = torch.zeros(lin.weight_payload.shape, dtype=torch.bfloat16)
    compensation = torch.zeros(lin.weight_payload.shape) if writeback == "compensated" else None
    nvfp4_cuda.lion_step_mxfp8_(
        lin.weight_payload, lin.weight_scales, g, momentum, lr=lr, writeback=writeback, compensation=compensation
    )


def _decoded(lin: NVFP4Linear) -> torch.Tensor:
    return decode_mxfp8(lin.weight_payload, lin.weight_scales, dtype=torch.float32).double()


@pytest.mark.parametrize("writeback", ["stochastic", "rne", "compensated"])
def test_a_master_watched_whole_counts_what_a_full_decode_sees(writeback):
    """Masters of up to SAMPLE_PER_TENSOR values are watched whole: the counts equal a comparison of the
    whole decoded master before and after the step."""
    masters = [_master(32, 32, seed=1), _master(16, 48, seed=2)]  # 1024 and 768 values; a partial block
    assert all(m.weight_payload.numel() <= SAMPLE_PER_TENSOR for m in masters)
    watch = MasterMovement(masters)
    old = [_decoded(m) for m in masters]
    watch.before()
    for i, m in enumerate(masters):
        _lion(m, lr=3e-4, writeback=writeback, seed=i)
    changed, watched, change = watch.moved()
    new = [_decoded(m) for m in masters]
    assert watched == 1024 + 768
    assert changed == sum(int((a != b).sum()) for a, b in zip(old, new, strict=True)) > 0
    assert change == pytest.approx(sum(float((a - b).abs().sum()) for a, b in zip(old, new, strict=True)), rel=1e-12)


def test_a_block_written_under_another_scale_has_not_moved():
    """A step of lr 0 re-encodes some blocks under another scale (other bytes, the same values): not a move."""
    lin = _master(256, 256, seed=3)
    before = (lin.weight_payload.clone(), lin.weight_scales.clone())
    watch = MasterMovement([lin])
    watch.before()
    _lion(lin, lr=0.0, writeback="rne")
    assert not torch.equal(lin.weight_scales, before[1])  # the bytes did change...
    assert watch.moved() == (0, SAMPLE_PER_TENSOR, 0.0)  # ...the values did not


def test_the_share_of_the_step_kept_tells_stochastic_from_round_to_nearest():
    """Lion at lr 1e-5 on N(0, 0.02) weights: stochastic write-back keeps the whole step on average, round to
    nearest about 1 % of it (only values near zero, whose spacing is finer than the step, move)."""
    kept = {}
    for writeback in ("stochastic", "rne"):
        masters = [_master(512, 512, seed=s) for s in range(4)]
        watch = MasterMovement(masters)
        watch.before()
        for s, m in enumerate(masters):
            _lion(m, lr=1e-5, writeback=writeback, seed=s)
        changed, watched, change = watch.moved()
        kept[writeback] = (changed / watched, change / (watched * 1e-5))
    assert 0.7 < kept["stochastic"][1] < 1.3 and kept["stochastic"][0] > 0.01
    assert kept["rne"][1] < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the masters' device path)")
def test_masters_on_the_gpu_count_what_the_same_masters_on_the_cpu_count():
    """On CUDA the watched values are gathered and decoded on the device (mxfp8_codec's torch path)."""
    counts = {}
    for device in ("cpu", "cuda"):
        masters = [_master(512, 256, seed=s).to(device) for s in range(2)]
        after = [_master(512, 256, seed=s) for s in range(2)]
        for m in after:
            _lion(m, lr=1e-4, writeback="stochastic")
        watch = MasterMovement(masters)
        watch.before()
        for m, a in zip(masters, after, strict=True):  # the same step's bytes, written on either device
            m.weight_payload.copy_(a.weight_payload)
            m.weight_scales.copy_(a.weight_scales)
        counts[device] = watch.moved()
    assert counts["cuda"] == counts["cpu"] and counts["cpu"][0] > 0


def test_the_trainer_logs_it_for_the_nvfp4_recipe_only(tmp_path, capsys):
    from ida_trainer.__main__ import main

    common = ["--steps", "3", "--eval.final", "false", "--checkpoint.export", "false", "--train.progress", "false"]
    assert main(["--out", str(tmp_path / "nvfp4"), *common, "--lr", "1e-5"]) == 0
    assert "master moved" in capsys.readouterr().out
    records = [json.loads(x) for x in (tmp_path / "nvfp4" / "train_log.jsonl").read_text().splitlines()]
    watched = [r for r in records if "master_moved" in r]  # the console's steps: the first and the last
    assert [r["step"] for r in watched] == [1, 3]
    assert all(0.0 < r["master_moved"] < 0.2 and r["master_step_kept"] > 0.3 for r in watched), watched
    precision = json.loads((tmp_path / "nvfp4" / "report.json").read_text())["precision"]
    assert precision["mean_master_moved"] == pytest.approx(sum(r["master_moved"] for r in watched) / 2)
    assert precision["mean_master_step_kept"] == pytest.approx(sum(r["master_step_kept"] for r in watched) / 2)
    assert main(["--out", str(tmp_path / "bf16"), *common, "--recipe", "bf16"]) == 0
    records = [json.loads(x) for x in (tmp_path / "bf16" / "train_log.jsonl").read_text().splitlines()]
    assert all("master_moved" not in r and "master_step_kept" not in r for r in records)
    assert "mean_master_moved" not in json.loads((tmp_path / "bf16" / "report.json").read_text())["precision"]
