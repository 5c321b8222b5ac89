"""Sampling, pass@k and run comparison in ida_eval (issue 25 parts 1, 3, 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ida_eval import DecodingConfig, ExecutionConfig, evaluate_model, generate, generate_completions
from ida_eval.decoding import Generation
from ida_eval.generate import sample_tokens, sample_uniform
from ida_eval.mbxp import main
from ida_eval.rundir import RunDirError, read_samples
from ida_eval.stats import mcnemar_exact, mean_pass_at_k
from tests.conftest import HEAVY_MODULES, run_noting_imports
from tests.ida_eval.support import SMALL_PROBLEMS, tiny_model, train_tokenizer

EXEC = ExecutionConfig(workers=2, timeout=20)


@pytest.fixture(scope="module")
def setup():
    tok = train_tokenizer([p["prompt"] + p["canonical_solution"] for p in SMALL_PROBLEMS] * 2, vocab_size=300)
    return tiny_model("llama", len(tok), seed=2), tok


def _oracle(logits: np.ndarray, u: float, temperature: float, top_p: float) -> int:
    """The sampling rule written out with numpy, one row at a time."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    kept, total = [], 0.0
    for i in order:
        if total >= top_p and kept:
            break
        kept.append(i)
        total += p[i]
    target = u * sum(p[i] for i in kept)
    acc = 0.0
    for i in kept:
        acc += p[i]
        if acc > target:
            return i
    return kept[-1]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.floats(0.3, 2.0),
    st.sampled_from([1.0, 0.95, 0.5, 0.1]),
)
def test_sample_tokens_follows_the_rule(seed, temperature, top_p):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=(6, 40)).astype(np.float32)
    u = rng.random(6)
    got = sample_tokens(torch.from_numpy(logits), torch.from_numpy(u), temperature, top_p).tolist()
    # float32 softmax vs float64: a u within rounding of a boundary may pick the neighbour
    for row, (g, uu) in enumerate(zip(got, u, strict=True)):
        want = _oracle(logits[row], uu, temperature, top_p)
        if g != want:
            near = [_oracle(logits[row], min(max(uu + d, 0.0), 1 - 1e-12), temperature, top_p) for d in (-1e-6, 1e-6)]
            assert g in near, (row, g, want)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.2, 0.8, 1.3]),
    st.sampled_from([0.999, 0.95, 0.8, 0.5, 0.05]),
    st.sampled_from([1, 4, 16, 64]),
)
def test_the_candidates_path_draws_what_the_full_sort_draws(seed, temperature, top_p, candidates):
    """``sample_tokens`` sorts a row's ``candidates`` most probable tokens when they hold its nucleus: the
    same token as sorting the whole row, bit for bit, also with ties at the candidates' edge (logits on a
    coarse grid), flat rows that fall back to the full sort, masked (-inf) tokens and rows of both kinds in
    one batch."""
    rng = np.random.default_rng(seed)
    b, v = 12, 300
    # Zipf-like rows (a few likely tokens, a long tail), some flat, logits rounded to a grid so that ties abound
    ranks = np.argsort(rng.random((b, v)), axis=1) + 1
    alpha = rng.choice([0.0, 0.3, 1.0, 2.0, 4.0], size=(b, 1))
    logits = np.round(-alpha * np.log(ranks) * 4) / 4
    logits[rng.random((b, v)) < 0.2] = -np.inf
    logits[:, 0] = np.maximum(logits[:, 0], 0.0)  # every row keeps a finite token
    scores = torch.from_numpy(logits.astype(np.float32))
    u = torch.from_numpy(rng.random(b))
    full = sample_tokens(scores, u, temperature, top_p, candidates=0)
    assert torch.equal(sample_tokens(scores, u, temperature, top_p, candidates=candidates), full)
    peaked = torch.from_numpy((-6 * np.log(ranks)).astype(np.float32))  # every row's nucleus among 16 tokens
    full = sample_tokens(peaked, u, temperature, top_p, candidates=0)
    assert torch.equal(sample_tokens(peaked, u, temperature, top_p, candidates=16), full)


def test_candidates_that_all_tie_with_tokens_outside_fall_back_to_the_full_sort():
    """Three tokens share the top probability; torch.topk picks the later ones on a tie, the rule the first."""
    logits = torch.log(torch.tensor([[0.1, 0.3, 0.3, 0.3]]))
    u = torch.tensor([0.5], dtype=torch.float64)
    for candidates in (0, 1, 2, 3):
        assert sample_tokens(logits, u, 1.0, 0.05, candidates=candidates).item() == 1  # the nucleus: token 1 alone


def test_sampler_benchmark_runs_on_the_cpu(capsys, monkeypatch):
    """benchmarks/bench_sampler.py at toy size: a row per vocabulary and temperature, the same tokens both ways."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_sampler

    assert bench_sampler.main(["--batch", "8", "--vocab", "300", "2000", "--alphas", "0.5", "3", "--repeats", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "yes |" in line]
    assert len(rows) == 4, rows


def test_sampled_frequencies_match_the_distribution():
    """Over an even grid of u, each token is drawn in proportion to its probability (top-p off)."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    m = 10_000
    u = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    picks = sample_tokens(logits.expand(m, -1), u, 1.0, 1.0)
    freq = torch.bincount(picks, minlength=5).double() / m
    assert torch.allclose(freq, torch.softmax(logits[0].double(), -1), atol=1.5 / m)
    # top-p keeps the most probable tokens until they reach p: 0.56 alone for 0.5, + 0.21 for 0.7
    assert sample_tokens(logits.expand(m, -1), u, 1.0, 0.5).unique().tolist() == [0]
    assert sample_tokens(logits.expand(m, -1), u, 1.0, 0.7).unique().tolist() == [0, 1]


def test_uniform_is_a_function_of_seed_task_sample_and_step():
    us = {sample_uniform(s, t, j, k) for s in (0, 1) for t in ("a", "b") for j in (0, 1) for k in (0, 1)}
    assert len(us) == 16 and all(0 <= u < 1 for u in us)
    assert sample_uniform(0, "a", 0, 0) == sample_uniform(0, "a", 0, 0)


# (0.7, 0.9): in this model about half the draws are made on a row's 256 candidates, half on its whole vocabulary
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_a_sample_depends_on_the_seed_task_and_number_only(setup, temperature, top_p):
    model, tok = setup
    model = model.float()
    prompts = {p["task_id"]: p["prompt"] for p in SMALL_PROBLEMS[:4]}
    cfg = DecodingConfig(
        batch_size=8,
        max_new_tokens=10,
        stop_strings=("\nXYZ",),
        samples_per_task=3,
        temperature=temperature,
        top_p=top_p,
    )
    full = generate_completions(model, tok, prompts, cfg, progress=False)
    assert [(g.task_id, g.completion_id) for g in full] == [(t, j) for t in prompts for j in range(3)]
    by_key = {(g.task_id, g.completion_id): g.raw for g in full}
    assert len(set(by_key.values())) > 4  # the samples differ from each other
    one = generate_completions(model, tok, prompts, DecodingConfig(**{**cfg.__dict__, "batch_size": 1}), progress=False)
    assert [g.raw for g in one] == [g.raw for g in full]
    three = generate_completions(
        model, tok, prompts, DecodingConfig(**{**cfg.__dict__, "batch_size": 3}), progress=False
    )
    assert [g.raw for g in three] == [g.raw for g in full]
    # one sample alone, without its batch-mates or its task's other samples
    alone = generate_completions(model, tok, {"T/3": prompts["T/3"]}, cfg, progress=False, completion_ids={"T/3": [2]})
    assert [(g.completion_id, g.raw) for g in alone] == [(2, by_key[("T/3", 2)])]
    other_seed = generate_completions(
        model, tok, prompts, DecodingConfig(**{**cfg.__dict__, "seed": 7}), progress=False
    )
    assert [g.raw for g in other_seed] != [g.raw for g in full]


def test_sampling_settings_are_checked():
    for kw, msg in (
        ({"samples_per_task": 2}, "need a temperature"),
        ({"top_p": 0.9}, "needs a temperature"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
        ({"temperature": 1.0, "samples_per_task": 0}, "samples per task"),
        ({"temperature": 1.0, "seed": -1}, "seed"),
    ):
        with pytest.raises(ValueError, match=msg):
            DecodingConfig(**kw)
    greedy = DecodingConfig().describe()
    assert greedy["strategy"] == "greedy" and "seed" not in greedy and "samples_per_task" not in greedy
    sampled = DecodingConfig(temperature=0.8, samples_per_task=5, seed=3).describe()
    assert sampled["strategy"] == "sample" and sampled["seed"] == 3 and sampled["samples_per_task"] == 5


def test_sampling_run_resumes_and_reports_pass_at_k(setup, tmp_path):
    model, tok = setup
    problems = {p["task_id"]: p for p in SMALL_PROBLEMS[:4]}
    out = tmp_path / "run"
    kw = dict(
        batch_size=4,
        max_new_tokens=10,
        samples_per_task=4,
        temperature=1.0,
        seed=5,
        pass_at=[1, 2, 4],
        exec_config=EXEC,
        progress=False,
    )
    s = evaluate_model(model, tok, problems, out, **kw)
    lines = (out / "samples.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    assert sorted((r["task_id"], r["completion_id"]) for r in records) == [(t, j) for t in problems for j in range(4)]
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    counts: dict[str, list[int]] = {}
    for r in results:
        c = counts.setdefault(r["task_id"], [0, 0])
        c[0] += 1
        c[1] += r["passed"]
    order = {t: (n, c) for t, (n, c) in counts.items()}
    want = {t: order[t] for t in problems}
    assert s["pass@k"] == {f"pass@{k}": mean_pass_at_k(want, k) for k in (1, 2, 4)}
    assert s["pass@1"] == s["pass@k"]["pass@1"] and s["samples_per_task"] == 4
    assert all(lo <= s["pass@k"][k] <= hi for k, (lo, hi) in s["intervals"].items())
    assert all(len(v) == 4 for v in s["per_task"].values()) and sum(s["counts"].values()) == 16
    assert s["timings"]["generated_samples"] == 16 and s["timings"]["executed_programs"] == 16
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # lose two samples from the middle of the file: a rerun regenerates exactly those, identically
    kept = [x for i, x in enumerate(lines) if i not in (2, 9)]
    (out / "samples.jsonl").write_text("".join(x + "\n" for x in kept))
    s2 = evaluate_model(model, tok, problems, out, **kw)
    assert s2["timings"]["generated_samples"] == 2 and s2["timings"]["executed_programs"] == 0
    assert sorted((out / "samples.jsonl").read_text().splitlines()) == sorted(lines)
    assert s2["pass@k"] == s["pass@k"]

    # a (task, sample) written twice is refused, naming both lines
    (out / "samples.jsonl").write_text("".join(x + "\n" for x in lines + [lines[0]]))
    with pytest.raises(RunDirError, match=r"samples.jsonl:17: .* already on line 1"):
        read_samples(out / "samples.jsonl")
    # other sampling settings may not be mixed into this directory
    with pytest.raises(RunDirError, match="different decoding"):
        evaluate_model(model, tok, problems, tmp_path / "run", **{**kw, "seed": 6})


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--samples-per-task", "3"], "need a temperature"),
        (["--top-p", "0.9"], "needs a temperature"),
        (["--seed", "1"], "--seed needs --temperature"),
        (["--temperature", "-1"], "temperature"),
        (["--temperature", "1", "--samples-per-task", "5", "--pass-at", "1,10"], "pass@10 needs at least 10"),
        (["--temperature", "1", "--samples-per-task", "0"], "samples per task"),
        (["--pass-at", "0"], "integer >= 1"),
        (["--pass-at", "a,b"], "comma-separated"),
    ],
)
def test_cli_refuses_bad_sampling_flags_in_one_line(flags, message, tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and not (tmp_path / "o").exists()


def test_compare_three_runs_with_mcnemar_json_and_figure(tmp_path, monkeypatch, capsys):
    problems = {p["task_id"]: p for p in SMALL_PROBLEMS[:6]}
    good = {p["task_id"]: p["canonical_solution"] for p in SMALL_PROBLEMS}
    bad = "  return None"
    plans = {  # task -> passes, per run
        "base": {"T/1"},
        "better": {"T/1", "T/2", "T/3", "T/4", "T/5"},
        "same": {"T/2"},
    }
    for name, passing in plans.items():

        def fixed(model, tokenizer, prompts, config, *, progress=True, on_batch=None, completion_ids=None, p=passing):
            gens = [Generation(t, good[t] if t in p else bad, good[t] if t in p else bad, 3, "eos") for t in prompts]
            if on_batch is not None:
                on_batch(gens)
            return gens

        monkeypatch.setattr(generate, "generate_completions", fixed)
        evaluate_model(torch.nn.Linear(2, 2), None, problems, tmp_path / name, exec_config=EXEC, progress=False)
    dirs = [str(tmp_path / n) for n in plans]
    assert main(["--compare", *dirs, "--out", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert "McNemar exact" in printed and "95 % interval" in printed
    # the command compares finished runs without importing torch or transformers: the same table
    res, imported = run_noting_imports("ida_eval.mbxp", "--compare", *dirs, "--no-progress")
    assert res.returncode == 0 and res.stdout == printed.split("\n-> ")[0] + "\n", res.stderr[-2000:]
    assert "ida_eval" in imported and not imported & HEAVY_MODULES, sorted(imported)
    result = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    better, same = result["languages"]["python"]["comparisons"]
    assert better["paired"]["b_only"] == 4 and better["paired"]["a_only"] == 0
    assert better["paired"]["p_value"] == mcnemar_exact(0, 4) == 0.125
    assert same["paired"]["p_value"] == mcnemar_exact(1, 1) == 1.0
    assert better["paired"]["p_holm"] == 2 * 0.125 and same["paired"]["p_holm"] == 1.0  # two tests read together
    assert better["paired"]["tests_in_family"] == 2
    assert "p = 0.125 (Holm-adjusted for the 2 tests read together: 0.25): not distinguishable" in printed
    table = printed.split("=== summary")[1].splitlines()[1:4]
    assert [line.split() for line in table][1:] == [
        ["python", "better", "0.1667", "0.8333", "+0.6667", "0.125", "0.25", "4/0"],
        ["python", "same", "0.1667", "0.1667", "+0.0000", "1", "1", "1/1"],
    ]
    assert better["gained"] == ["T/2", "T/3", "T/4", "T/5"] and same["lost"] == ["T/1"]
    assert better["class_shift"]["passed"] == 4
    runs = result["languages"]["python"]["runs"]
    assert [r["pass@1"] for r in runs] == [1 / 6, 5 / 6, 1 / 6]
    assert all(r["interval"][0] <= r["pass@1"] <= r["interval"][1] for r in runs)
    assert (tmp_path / "cmp" / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --compare never writes into the runs it reads
    assert not (tmp_path / "base" / "comparison.json").exists()
    assert main(["--compare", dirs[0]]) == 2


def test_language_all_sampled_run_reports_pass_at_k_per_language_and_overall(tmp_path, capsys):
    from tests.ida_eval.support import save_mxfp8_checkpoint, write_problems

    tok = train_tokenizer([p["prompt"] + p["canonical_solution"] for p in SMALL_PROBLEMS] * 2, vocab_size=300)
    ckpt = save_mxfp8_checkpoint(tiny_model("qwen3", len(tok), seed=1), tok, tmp_path / "ckpt")
    data = tmp_path / "data"
    data.mkdir()
    write_problems(data / "py.jsonl", SMALL_PROBLEMS[:3])
    (data / "metadata.json").write_text(json.dumps({"python": "py.jsonl"}))
    out = tmp_path / "run"
    args = ["--checkpoint", str(ckpt), "--language", "all", "--data-dir", str(data), "--out", str(out)]
    args += ["--max-new-tokens", "6", "--device", "cpu", "--workers", "2", "--no-progress"]
    args += ["--temperature", "0.7", "--samples-per-task", "3", "--pass-at", "1,2"]
    assert main(args) == 0
    result = json.loads((out / "languages.json").read_text())
    row = result["languages"]["python"]
    summary = json.loads((out / "python" / "summary.json").read_text())
    assert row["pass@k"] == summary["pass@k"] and set(row["pass@k"]) == {"pass@1", "pass@2"}
    assert result["overall"]["pass@k"] == summary["pass@k"] and result["overall"]["n_tasks"] == 3
    printed = capsys.readouterr().out
    assert "pass@2" in printed and "overall over 3 tasks of 1 languages" in printed
    assert (out / "languages.png").read_bytes()[:4] == b"\x89PNG"
