"""Run logs: JSONL records, MLLOG line format, resume truncation, report and PNG."""

from __future__ import annotations

import json

import pytest

from ida_trainer.logs import (
    MLLOG_PREFIX,
    STEP_KEYS,
    MLLogger,
    RunLogger,
    TrainLogError,
    format_step,
    read_mllog,
    read_train_log,
)


def _rec(step, loss=1.0):
    return {
        "step": step,
        "loss": loss,
        "grad_norm": 0.5,
        "lr": 1e-3,
        "tokens_per_s": 100.0,
        "mem_gib": 0.1,
        "step_time_s": 0.01,
        "valid_tokens": 10,
        "samples": step * 4,
    }


def test_mllog_line_format(tmp_path):
    p = tmp_path / "mlperf_log.txt"
    ml = MLLogger(p)
    ml.event("opt_base_learning_rate", 0.001)
    ml.start("run_start")
    ml.end("run_stop", None, {"status": "success"})
    lines = p.read_text().splitlines()
    assert all(line.startswith(MLLOG_PREFIX) for line in lines)
    first = json.loads(lines[0][len(MLLOG_PREFIX) :])
    assert list(first) == ["namespace", "time_ms", "event_type", "key", "value", "metadata"]
    assert first["metadata"]["file"] == "test_logs.py" and isinstance(first["metadata"]["lineno"], int)
    recs = read_mllog(p)
    assert [r["event_type"] for r in recs] == ["POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"]
    assert recs[2]["metadata"]["status"] == "success"
    # same separators as json.dumps defaults (what mlperf_logging emits)
    assert lines[0][len(MLLOG_PREFIX) :] == json.dumps(first)


def test_step_records_console_and_resume_truncation(tmp_path, capsys):
    log = RunLogger(tmp_path, total_steps=5, log_every=2, progress=False)
    for s in range(1, 5):
        log.log_step(_rec(s, loss=5.0 - s))
    log.log_eval(4, {"pass@1": 0.25, "num_degenerate": 1, "num_problems": 4}, samples_count=16)
    recs = read_train_log(tmp_path / "train_log.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and list(recs[0]) == list(STEP_KEYS)
    out = capsys.readouterr().out
    assert "step      2/5 | loss 3.0000" in out and "pass@1 0.25" in out
    ml = read_mllog(tmp_path / "mlperf_log.txt")
    assert [r["value"] for r in ml if r["key"] == "train_loss"] == [4.0, 3.0, 2.0, 1.0]
    assert [r["metadata"]["samples_count"] for r in ml if r["key"] == "train_loss"] == [4, 8, 12, 16]
    acc = [r for r in ml if r["key"] == "eval_accuracy"]
    assert acc[0]["value"] == 0.25 and acc[0]["metadata"]["samples_count"] == 16
    # a resumed run from step 2 drops records 3 and 4 written after that checkpoint
    log2 = RunLogger(tmp_path, total_steps=5, start_step=2, progress=False)
    assert [r["step"] for r in read_train_log(tmp_path / "train_log.jsonl")] == [1, 2]
    assert log2.losses == [(1, 4.0), (2, 3.0)]


def test_resume_repairs_a_torn_log_and_cuts_the_mllog_back(tmp_path):
    """A kill mid-write leaves half a record as the last line of train_log.jsonl (and of mlperf_log.txt):
    resume used to stop on it ("Expecting ',' delimiter: line 1 column 25", no file named); the MLLOG kept
    the replayed steps' train_loss lines, so they appeared twice."""
    log = RunLogger(tmp_path, total_steps=6, progress=False)
    for s in range(1, 5):
        log.log_step(_rec(s, loss=5.0 - s))
    log.log_eval(4, {"pass@1": 0.5, "num_degenerate": 0, "num_problems": 2}, samples_count=16)
    with open(tmp_path / "train_log.jsonl", "a") as f:
        f.write(json.dumps(_rec(5, loss=0.5))[:30])
    with open(tmp_path / "mlperf_log.txt", "a") as f:
        f.write(':::MLLOG {"namespace": "", "time_ms": 1')
    with pytest.warns(RuntimeWarning, match="dropping an incomplete last line"):
        log2 = RunLogger(tmp_path, total_steps=6, start_step=2, progress=False)
    assert [r["step"] for r in read_train_log(tmp_path / "train_log.jsonl")] == [1, 2]
    for s in range(3, 7):  # the resumed run replays 3 and 4, then goes on
        log2.log_step(_rec(s, loss=float(s)))
    assert [r["step"] for r in read_train_log(tmp_path / "train_log.jsonl")] == [1, 2, 3, 4, 5, 6]
    ml = read_mllog(tmp_path / "mlperf_log.txt")
    assert [r["metadata"]["step_num"] for r in ml if r["key"] == "train_loss"] == [1, 2, 3, 4, 5, 6]
    assert not [r for r in ml if r["key"] == "eval_accuracy"]  # the step-4 eval belonged to the lost steps
    assert (tmp_path / "mlperf_log.txt").read_text().endswith("\n")


def test_a_damaged_log_line_in_the_middle_names_file_and_line(tmp_path):
    p = tmp_path / "train_log.jsonl"
    p.write_text(json.dumps(_rec(1)) + "\n{broken\n" + json.dumps(_rec(2)) + "\n")
    with pytest.raises(TrainLogError, match=f"{p}:2: malformed train_log line"):
        RunLogger(tmp_path, total_steps=3, start_step=1, progress=False)


def test_report_and_plot(tmp_path):
    log = RunLogger(tmp_path, total_steps=3, progress=True)
    for s in range(1, 4):
        log.log_step(_rec(s))
    log.close()
    log.evals.append({"step": 3, "pass@1": 0.5, "num_degenerate": 0, "num_problems": 2})
    assert json.loads(log.write_report({"a": 1}).read_text()) == {"a": 1}
    png = log.plot_loss(title="t")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    legend = log.loss_figure(title="t").axes[0].get_legend()  # the red pass@1 dot is named, not guessed
    assert [t.get_text() for t in legend.get_texts()] == ["train loss (left axis)", "pass@1 of the eval (right axis)"]


def test_disabled_logger_writes_nothing(tmp_path):
    log = RunLogger(tmp_path / "r", total_steps=2, enabled=False)
    log.log_step(_rec(1))
    assert not (tmp_path / "r").exists()


def test_format_step():
    assert format_step(_rec(7), 10).startswith("step      7/10 | loss 1.0000 | grad_norm 0.5000 | lr 1.000e-03")
