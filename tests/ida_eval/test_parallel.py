"""Data-parallel generation with torchrun (2 gloo processes on the CPU), merging and resume (issue 25 part 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ida_eval.mbxp import main
from ida_eval.rundir import RunDirError, merge_shards, read_samples
from tests.ida_eval.support import SMALL_PROBLEMS, save_mxfp8_checkpoint, tiny_model, train_tokenizer, write_problems
from tests.torchrun import torchrun_cmd, torchrun_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("dp")
    tok = train_tokenizer([p["prompt"] + p["canonical_solution"] for p in SMALL_PROBLEMS] * 2, vocab_size=300)
    save_mxfp8_checkpoint(tiny_model("llama", len(tok), seed=2), tok, d / "ckpt")
    write_problems(d / "problems.jsonl", SMALL_PROBLEMS)
    return d


def _args(d: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--checkpoint",
        str(d / "ckpt"),
        "--problems",
        str(d / "problems.jsonl"),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--dtype",
        "float32",  # float32: a row's tokens do not depend on its batch-mates (left padding, tested)
        "--workers",
        "2",
        "--no-progress",
        *extra,
    ]


def _torchrun(n: int, args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        torchrun_cmd(n, "ida_eval.mbxp", *args),
        cwd=ROOT,
        env=torchrun_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def _rank_pid(agent: int, rank: int) -> int:
    """The pid of torchrun's worker with ``RANK=rank`` (a child of the agent process)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == agent and f"RANK={rank}".encode() in env:
            return int(entry.name)
    raise AssertionError(f"no worker with RANK={rank} under torchrun pid {agent}")


def _records(path: Path) -> dict[tuple[str, int], dict]:
    return {(r["task_id"], r.get("completion_id", 0)): r for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow
def test_torchrun_two_ranks_leave_the_run_directory_of_one_process(checkpoint, tmp_path):
    d = checkpoint
    flags = ("--max-new-tokens", "12", "--batch-size", "2")
    assert main(_args(d, tmp_path / "one", *flags)) == 0
    proc = _torchrun(2, _args(d, tmp_path / "two", *flags))
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log
    one, two = tmp_path / "one", tmp_path / "two"
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())  # no shard left
    assert _records(two / "samples.jsonl") == _records(one / "samples.jsonl")
    r1, r2 = _records(one / "results.jsonl"), _records(two / "results.jsonl")
    assert {k: (r["passed"], r["result"]) for k, r in r2.items()} == {
        k: (r["passed"], r["result"]) for k, r in r1.items()
    }
    s1, s2 = (json.loads((x / "summary.json").read_text()) for x in (one, two))
    assert [k for k in s1 if s1[k] != s2[k]] == ["timings"]
    ranks = s2["timings"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and sum(r["samples"] for r in ranks) == len(SMALL_PROBLEMS)
    assert s2["timings"]["generated_tokens"] == sum(r["tokens"] for r in ranks) == s1["timings"]["generated_tokens"]
    assert log.count("pass@1 =") == 1  # rank 0 alone reports


@pytest.mark.slow
def test_a_killed_torchrun_resumes_with_another_number_of_processes(checkpoint, tmp_path):
    d = checkpoint
    flags = ("--max-new-tokens", "48", "--batch-size", "1", "--temperature", "1", "--samples-per-task", "6")
    assert main(_args(d, tmp_path / "ref", *flags)) == 0
    out = tmp_path / "run"
    proc = _torchrun(2, _args(d, out, *flags))
    deadline = time.monotonic() + 240
    while not (out / "samples.rank1.jsonl").is_file() or not (out / "samples.rank1.jsonl").stat().st_size:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.01)
    os.kill(_rank_pid(proc.pid, 1), signal.SIGKILL)  # rank 1 dies mid-generation; torchrun stops rank 0
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, log
    # rank 0, stopped by torchrun's SIGTERM, says in one line what is kept and how to resume
    assert f"ida_eval.mbxp: interrupted; finished samples and results are kept in {out}" in log
    shards = sorted(out.glob("samples.rank*.jsonl"))
    done = sum(len(read_samples(s)) for s in shards) + len(read_samples(out / "samples.jsonl"))
    assert 0 < done < 36 and not (out / "summary.json").exists()
    assert main(_args(d, out, *flags)) == 0  # one process now: it merges the shards and generates the rest
    assert not list(out.glob("samples.rank*.jsonl"))
    assert _records(out / "samples.jsonl") == _records(tmp_path / "ref" / "samples.jsonl")
    s, ref = (json.loads((x / "summary.json").read_text()) for x in (out, tmp_path / "ref"))
    assert s["pass@k"] == ref["pass@k"] and s["per_task"] == ref["per_task"]
    assert s["timings"]["generated_samples"] == 36 - done


def test_merging_shards_is_idempotent_and_refuses_a_conflict(tmp_path):
    line = {"task_id": "T/1", "completion_id": 0, "completion": "x", "raw": "x", "n_tokens": 1, "stop_reason": "eos"}
    other = {**line, "completion_id": 1}
    (tmp_path / "samples.jsonl").write_text(json.dumps(line) + "\n")
    # a kill between appending and removing the shard: the shard still holds a sample already merged
    (tmp_path / "samples.rank0.jsonl").write_text(json.dumps(line) + "\n" + json.dumps(other) + "\n")
    (tmp_path / "samples.rank1.jsonl").write_text(json.dumps(other) + "\n" + json.dumps(other)[:20])  # torn tail
    with pytest.warns(RuntimeWarning, match="incomplete last line"):
        assert merge_shards(tmp_path) == 1
    assert sorted(read_samples(tmp_path / "samples.jsonl")) == [("T/1", 0), ("T/1", 1)]
    assert not list(tmp_path.glob("samples.rank*")) and merge_shards(tmp_path) == 0
    (tmp_path / "samples.rank3.jsonl").write_text(json.dumps({**other, "completion": "y"}) + "\n")
    with pytest.raises(RunDirError, match=r"samples.rank3.jsonl: T/1 sample 1 differs"):
        merge_shards(tmp_path)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"WORLD_SIZE": "x"}, "WORLD_SIZE='x' is not an integer"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "-1"}, "RANK=0, WORLD_SIZE=2, LOCAL_RANK=-1"),
    ],
)
def test_a_malformed_launch_environment_is_one_line(env, message, checkpoint, tmp_path, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(_args(checkpoint, tmp_path / "o")) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "o").exists()


@pytest.mark.timeout(120)
def test_a_library_call_on_one_rank_of_a_launch_evaluates_alone(checkpoint, tmp_path, monkeypatch):
    """The trainer's periodic eval runs on its rank 0 only, inside a torchrun launch: evaluate_checkpoint
    must not wait for ranks that never call it (data parallel is the CLI's, or an explicit ``ranks``)."""
    from ida_eval import ExecutionConfig, evaluate_checkpoint

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    s = evaluate_checkpoint(
        checkpoint / "ckpt",
        problems_path=checkpoint / "problems.jsonl",
        out_dir=tmp_path / "o",
        max_new_tokens=4,
        limit=2,
        device="cpu",
        exec_config=ExecutionConfig(workers=2),
        progress=False,
    )
    assert s["n_tasks"] == 2 and [r["rank"] for r in s["timings"]["ranks"]] == [0]
