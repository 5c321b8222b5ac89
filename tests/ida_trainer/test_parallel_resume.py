"""Parallel runs resume, with any number of processes (``torchrun --nproc-per-node 2 -m ida_trainer``, gloo on
the CPU).

FSDP2 (``--data-parallel fsdp``): a checkpoint holds the full optimizer state, laid out as a single-process
run's, written one full tensor at a time (ida_trainer.checkpoint.streamed_state): killed with SIGKILL and
resumed with ``--resume``, the run's loss records and last checkpoint equal the unkilled run's bit for bit;
the same checkpoint resumes in one process too (the loss goes on to float32 rounding: the gradients are
summed in another order). A checkpoint whose optimizer state holds one rank's shard (FSDP runs of an older
ida wrote those) is refused in one line.

Pipeline (``--pipeline-stages 2``): the stages' optimizer states are merged into a single-process run's
(ida_trainer.precision.merge_stage_states), and a pipelined run computes what one process computes, bit for
bit; so a pipelined checkpoint resumes in one process, and a single-process one with two stages, and both
go on exactly as the run that was not interrupted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ida_common.checksums import SUMS_FILE, file_sha256
from ida_trainer.checkpoint import LEGACY_OPTIM_FILE, OPTIM_FILE, latest_checkpoint, load_checkpoint, read_model_tensors
from ida_trainer.logs import read_mllog, read_train_log
from ida_trainer.sharded import holds_shards
from mxfp8_codec import MXFP8Tensor
from tests.ida_trainer.support import loss_records
from tests.torchrun import ROOT, free_port, torchrun_cmd, torchrun_env

pytestmark = pytest.mark.slow  # torchrun launches

STEPS = 6
RUN = [  # a checkpoint every 2 steps, all kept; no export, no eval
    *("--checkpoint.every", "2", "--checkpoint.keep", "3", "--checkpoint.export", "false"),
    *("--eval.final", "false", "--train.progress", "false", "--train.log_every", "1"),
]
ARGS = ["--recipe", "bf16", "--optim.name", "adamw", "--microbatches", "2", "--steps", str(STEPS), *RUN]
FSDP = ["--data-parallel", "fsdp"]
ONE_PROCESS = [sys.executable, "-m", "ida_trainer"]


def _run(cmd: list[str], out: Path, *args: str, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    env = torchrun_env(OMP_NUM_THREADS="1", IDA_KILL_AT=kill_at)  # one thread: the same float sums every run
    return subprocess.run(
        [*cmd, "--out", str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def _train(out: Path, *extra: str, processes: int = 2, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    """The FSDP run of ARGS (``processes=1``: the same in one process)."""
    cmd = torchrun_cmd(processes, "ida_trainer", *FSDP) if processes > 1 else ONE_PROCESS
    return _run(cmd, out, *ARGS, *extra, kill_at=kill_at)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp_reference") / "run"
    res = _train(out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_a_killed_fsdp_run_resumes_bit_for_bit_also_in_one_process(reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    killed = _train(out, kill_at="checkpoint.renamed:2")  # rank 0 dies right after ckpt-4 is in place
    assert killed.returncode != 0 and "-9" in killed.stderr, killed.stderr[-3000:]
    newest = latest_checkpoint(out / "checkpoints")
    assert newest is not None and newest.name == "ckpt-000004"
    with load_checkpoint(newest) as loaded:
        assert not holds_shards(loaded.optimizer_state)  # full tensors, as a single-process run's
        embed = loaded.optimizer_state["ida"]["exact_params"]["model.embed_tokens.weight"]
        assert embed.shape[0] == loaded.tensors["model.embed_tokens.weight"].shape[0]
    single = tmp_path / "single"
    shutil.copytree(out, single)

    resumed = _train(out, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {newest}" in resumed.stdout
    assert loss_records(out) == loss_records(reference)
    last = f"ckpt-{STEPS:06d}"
    assert file_sha256(out / "checkpoints" / last / "model.safetensors") == file_sha256(
        reference / "checkpoints" / last / "model.safetensors"
    )
    losses = [r["metadata"]["step_num"] for r in read_mllog(out / "mlperf_log.txt") if r["key"] == "train_loss"]
    assert losses == list(range(1, STEPS + 1))
    assert not list((out / "checkpoints").glob("*.tmp"))

    # the same checkpoint in one process: a config that differs (said), the loss curve goes on
    alone = _train(single, "--resume", processes=1)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "config that differs" in alone.stderr
    got, ref = loss_records(single), loss_records(reference)
    assert got[:4] == ref[:4] and [r[0] for r in got] == list(range(1, STEPS + 1))
    for g, r in zip(got[4:], ref[4:], strict=True):
        assert g[1:] == pytest.approx(r[1:], rel=2e-3)


def test_an_fsdp_run_from_a_base_starts_from_rank_0s_load(tok, tmp_path: Path) -> None:
    """``--base`` under FSDP: only rank 0 loads the base (and re-initialises its untrained rows, some of
    them in rank 1's shard), the
    other rank builds the model empty and gets rank 0's weights (ida_trainer.sharded.fill_from_rank_0). The run
    computes what one process computes from the same base: step 1 to float32 rounding (the ranks' losses are
    summed in another order), the rest as a one-process continuation of an FSDP checkpoint goes on."""
    import json

    from ida_trainer.config import ModelConfig
    from ida_trainer.demo import build_demo_model

    base = tmp_path / "base"
    model = build_demo_model(ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2), tok, seed=0)
    chat = [
        [{"role": "user", "content": f"square {i}"}, {"role": "assistant", "content": f"{i * i}"}] for i in range(8)
    ]
    used = {i for m in chat for turn in m for i in tok(turn["content"])["input_ids"]}
    upper = [i for i in used if i >= model.config.vocab_size // 2]  # rows in rank 1's shard
    assert upper
    broken = [*tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]), *upper]
    with torch.no_grad():
        for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            w[broken] = w[-1].clone()  # untrained (identical) rows: rank 0's fix must reach rank 1's shard
    model.to(torch.bfloat16).save_pretrained(base)
    tok.save_pretrained(base)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chat))
    args = [*ARGS, "--steps", "3", "--base", str(base), "--data", str(data), "--data.format", "chat"]
    fsdp = _run(torchrun_cmd(2, "ida_trainer", *FSDP), tmp_path / "fsdp", *args)
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    alone = _run(ONE_PROCESS, tmp_path / "alone", *args)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "untrained embedding rows re-initialised" in fsdp.stdout and fsdp.stdout.count("re-initialised") == 1
    got, ref = loss_records(tmp_path / "fsdp"), loss_records(tmp_path / "alone")
    assert [r[0] for r in got] == [r[0] for r in ref] == [1, 2, 3]
    assert got[0][1] == pytest.approx(ref[0][1], rel=1e-6)  # rank 1's half of the step-1 loss: rank 0's weights
    for g, r in zip(got, ref, strict=True):
        assert g[1:] == pytest.approx(r[1:], rel=2e-3)


def test_a_checkpoint_holding_one_ranks_shard_is_refused_in_one_line(reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    for ckpt in sorted((out / "checkpoints").iterdir())[1:]:
        shutil.rmtree(ckpt)  # resume from ckpt-2
    ckpt = out / "checkpoints" / "ckpt-000002"
    (ckpt / SUMS_FILE).unlink()  # an older ida wrote none
    # what an older ida wrote: optimizer.pt, rank 0's optimizer.state_dict() with its DTensor shards (made in a
    # 1-rank group)
    script = (
        "import sys, torch, torch.distributed as dist\n"
        "from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh\n"
        "from ida_trainer.checkpoint import read_optimizer_state\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%d', rank=0, world_size=1)\n"
        "sd = read_optimizer_state(sys.argv[1])\n"
        "mesh = init_device_mesh('cpu', (1,))\n"
        "st = sd['state'][0]\n"
        "st['exp_avg'] = distribute_tensor(st['exp_avg'], mesh, [Shard(0)])\n"
        "torch.save(sd, sys.argv[2])\n"
        "dist.destroy_process_group()\n"
    )
    subprocess.run(
        [sys.executable, "-c", script % free_port(), str(ckpt / OPTIM_FILE), str(ckpt / LEGACY_OPTIM_FILE)],
        cwd=ROOT,
        env=torchrun_env(),
        check=True,
        capture_output=True,
    )
    (ckpt / OPTIM_FILE).unlink()
    res = _train(out, "--resume", processes=1)
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("ida_trainer: error:")]
    assert len(errors) == 1 and "holds one process's shard" in errors[0] and f"--base {ckpt}" in errors[0], res.stderr
    assert "Traceback" not in res.stderr


def test_pipelined_and_single_process_checkpoints_resume_each_other_bit_for_bit(tmp_path: Path) -> None:
    args = ["--microbatches", "2", "--steps", "4", *RUN]  # the nvfp4 demo
    pipeline = torchrun_cmd(2, "ida_trainer", "--pipeline-stages", "2")
    runs = {"pipeline": tmp_path / "pipeline", "single": tmp_path / "single"}
    for name, cmd in (("pipeline", pipeline), ("single", ONE_PROCESS)):
        res = _run(cmd, runs[name], *args)
        assert res.returncode == 0, res.stderr[-3000:]
    assert loss_records(runs["pipeline"]) == loss_records(runs["single"])  # the same computation, bit for bit
    moved = {  # the same master values watched (keyed by name) and the two stages' counts summed
        name: [(r["master_moved"], r["master_step_kept"]) for r in read_train_log(d / "train_log.jsonl")]
        for name, d in runs.items()
    }
    assert moved["pipeline"] == moved["single"] and all(m > 0 for m, _ in moved["single"])
    last = Path("checkpoints") / "ckpt-000004" / "model.safetensors"
    for src, cmd in (("pipeline", ONE_PROCESS), ("single", pipeline)):  # each resumed by the other
        out = tmp_path / f"{src}-resumed"
        shutil.copytree(runs[src], out)
        shutil.rmtree(out / last.parent)
        res = _run(cmd, out, *args, "--resume")
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"resumed from {out / 'checkpoints' / 'ckpt-000002'}" in res.stdout
        assert "config that differs" not in res.stderr  # another number of stages computes the same
        assert loss_records(out) == loss_records(runs[src]), src
        # the same tensors, bit for bit (the files' headers differ: the config digest names the parallelism)
        got, want = read_model_tensors(out / last), read_model_tensors(runs[src] / last)
        assert got.keys() == want.keys()
        for name, t in want.items():
            parts = zip(got[name], t, strict=True) if isinstance(t, MXFP8Tensor) else [(got[name], t)]
            assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b)) for a, b in parts), (src, name)


def test_a_pipeline_over_a_tied_base_trains_one_matrix_and_resumes_exactly(tok, tmp_path: Path) -> None:
    """Qwen3 (Qwen3-4B too) ties its lm_head to its input embedding. Over two stages, stage 0 holds the matrix and
    lends it to the last stage each step (ida_trainer.distributed.PipelineEngine), so the run trains the model it
    loaded: one process's losses, step 1 bit for bit, then to the rounding of a gradient summed in another order
    (until 2026-12-07 the stages trained a copy each: step 2 was 1.9e-4 apart). A killed run resumes bit for bit,
    pipelined or in one process, without reading the base's weights (the model is built empty, its ties kept), and
    its checkpoint is one transformers loads with the head tied."""
    from transformers import AutoModelForCausalLM

    import mxfp8_codec.hf  # noqa: F401  (registers the MXFP8 quantizer with transformers)
    from tests.ida_eval.support import tiny_model

    base = tmp_path / "base"
    tiny_model("qwen3", len(tok)).to(torch.bfloat16).save_pretrained(base)
    tok.save_pretrained(base)
    args = ["--microbatches", "2", "--steps", "4", *RUN, "--base", str(base)]  # the nvfp4 recipe
    pipeline = torchrun_cmd(2, "ida_trainer", "--pipeline-stages", "2")
    # (FSDP2 keeps ties through its own to_empty: test_distributed.py's fill test compares them on the empty rank)
    commands = {"pipeline": pipeline, "alone": ONE_PROCESS}
    runs = {name: tmp_path / name for name in commands}
    for name, cmd in commands.items():
        res = _run(cmd, runs[name], *args)
        assert res.returncode == 0, res.stderr[-3000:]
    got, ref = loss_records(runs["pipeline"]), loss_records(runs["alone"])
    assert [r[0] for r in got] == [r[0] for r in ref] == [1, 2, 3, 4]
    losses, ref_losses = [r[1] for r in got], [r[1] for r in ref]
    assert losses[0] == ref_losses[0]  # the same forward
    assert losses[1] == pytest.approx(ref_losses[1], rel=1e-5)  # after one update (measured 7e-8; the copies: 1.9e-4)
    # then Lion's signs amplify the BF16 rounding of the two sums (measured at step 4: 2.5e-4)
    assert losses[2:] == pytest.approx(ref_losses[2:], rel=1e-3)

    # a resume reads no weight of the base (every tensor comes from the checkpoint): here it has none left to read
    (base / "model.safetensors").write_bytes(b"")
    for name, cmd in commands.items():  # in one process the head is still tied (to_empty alone unties it)
        out = tmp_path / f"{name}-resumed"
        shutil.copytree(runs[name], out)
        shutil.rmtree(out / "checkpoints" / "ckpt-000004")
        res = _run(cmd, out, *args, "--resume")
        assert res.returncode == 0, res.stderr[-3000:]
        assert loss_records(out) == loss_records(runs[name]), name

    ckpt = tmp_path / "pipeline-resumed" / "checkpoints" / "ckpt-000004"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    saved = read_model_tensors(runs["pipeline"] / "checkpoints" / "ckpt-000004" / "model.safetensors")
    assert torch.equal(model.lm_head.weight, saved["model.embed_tokens.weight"])
    alone = read_model_tensors(runs["alone"] / "checkpoints" / "ckpt-000004" / "model.safetensors")
    assert saved.keys() == alone.keys() and "lm_head.weight" not in saved  # the matrix once, in both
