"""End to end on CPU: a tiny Nemotron trained here to memorise a few MBXP problems, saved as MXFP8,
scored by ``python -m ida_eval.mbxp`` in a subprocess, passes exactly those problems."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ida_eval import FAILURE_CLASSES, STOP_STRINGS
from tests.conftest import REPO_ROOT, mbxp_dir
from tests.ida_eval.support import (
    SMALL_PROBLEMS,
    memorise,
    read_problems,
    save_mxfp8_checkpoint,
    tiny_model,
    train_tokenizer,
    write_problems,
)

N_TRAINED = 4  # problems the model memorises
N_UNTRAINED = 2  # problems it never saw: they must fail, and be classified


def _problem_set() -> tuple[list[dict], list[dict]]:
    d = mbxp_dir()
    if d is None:  # our own small problems
        return SMALL_PROBLEMS[:N_TRAINED], SMALL_PROBLEMS[N_TRAINED : N_TRAINED + N_UNTRAINED]
    every = read_problems(d / "mbpp_release_v1.jsonl")
    ranked = sorted(every, key=lambda p: len(p["prompt"] + p["canonical_solution"]))
    return ranked[:N_TRAINED], ranked[N_TRAINED : N_TRAINED + N_UNTRAINED]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "ida_eval.mbxp", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_memorised_checkpoint_passes_its_problems(tmp_path: Path) -> None:
    trained, untrained = _problem_set()
    tok = train_tokenizer([p["prompt"] + p["canonical_solution"] for p in trained + untrained] * 3, vocab_size=400)
    torch.manual_seed(0)
    model = tiny_model("nemotron", len(tok), hidden=128, layers=1)
    loss = memorise(model, tok, trained)
    assert loss < 0.05, f"the tiny model did not memorise its problems (loss {loss:.3f})"
    ckpt = save_mxfp8_checkpoint(model, tok, tmp_path / "ckpt")
    # interleave trained and untrained tasks in the problems file
    problems_file = write_problems(tmp_path / "problems.jsonl", [*untrained[:1], *trained, *untrained[1:]])
    out = tmp_path / "run"
    args = [
        "--checkpoint",
        str(ckpt),
        "--problems",
        str(problems_file),
        "--out",
        str(out),
        "--batch-size",
        "3",
        "--max-new-tokens",
        "48",
        "--device",
        "cpu",
        "--workers",
        "2",
        "--no-progress",
    ]
    proc = _run(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pass@1 = " in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    per_task = summary["per_task"]
    assert {t: per_task[t] for t in (p["task_id"] for p in trained)} == {p["task_id"]: "passed" for p in trained}
    for p in untrained:
        assert per_task[p["task_id"]] in FAILURE_CLASSES
    n = N_TRAINED + N_UNTRAINED
    assert summary["n_tasks"] == n and summary["pass@1"] == pytest.approx(N_TRAINED / n)
    assert sum(summary["counts"].values()) == n
    assert summary["decoding"]["stop_strings"] == list(STOP_STRINGS)
    assert summary["decoding"]["do_sample"] is False
    weights = ckpt / "model.safetensors"
    assert summary["checkpoint"]["files"][0]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert summary["checkpoint"]["precision"]["weights_dtype"] == "MXFP8_E4M3_UE8M0_K32"
    assert summary["timings"]["generated_tasks"] == n and summary["timings"]["tokens_per_s"] > 0
    assert summary["isolation"]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    by_id = {s["task_id"]: s for s in samples}
    for p in trained:  # the executed completion is exactly the memorised solution
        assert by_id[p["task_id"]]["completion"] == p["canonical_solution"]
    results = (out / "results.jsonl").read_text().splitlines()
    assert len(samples) == len(results) == n

    # rerun: nothing regenerated (the model is not even loaded), nothing re-executed, same verdicts
    before = (out / "samples.jsonl").read_bytes()
    proc2 = _run(*args)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    again = json.loads((out / "summary.json").read_text())
    assert again["timings"]["generated_tasks"] == 0 and again["model"] is None
    assert again["per_task"] == per_task
    assert (out / "samples.jsonl").read_bytes() == before
    assert len((out / "results.jsonl").read_text().splitlines()) == n

    assert summary["model"]["weights"] == "bf16"
    # --weights mxfp8: projections stay MXFP8 in memory; the same greedy samples, byte for byte
    out_mx = tmp_path / "run-mxfp8"
    proc_mx = _run(*[out_mx.as_posix() if a == str(out) else a for a in args], "--weights", "mxfp8")
    assert proc_mx.returncode == 0, proc_mx.stderr[-3000:]
    assert json.loads((out_mx / "summary.json").read_text())["model"]["weights"] == "mxfp8"
    assert (out_mx / "samples.jsonl").read_bytes() == before
    # --weights mxfp8-fused: recorded as such; on the CPU the fused kernel does not run, the samples are the same
    out_fused = tmp_path / "run-mxfp8-fused"
    proc_f = _run(*[out_fused.as_posix() if a == str(out) else a for a in args], "--weights", "mxfp8-fused")
    assert proc_f.returncode == 0, proc_f.stderr[-3000:]
    assert json.loads((out_fused / "summary.json").read_text())["model"]["weights"] == "mxfp8-fused"
    assert (out_fused / "samples.jsonl").read_bytes() == before

    # --compare prints both runs side by side
    proc3 = _run("--compare", str(out), str(out))
    assert proc3.returncode == 0, proc3.stderr
    assert "pass@1" in proc3.stdout and "(gained) (0)" in proc3.stdout
