"""Data formats, completion-only labels, packing without cross-contamination, resumable batching."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ida_trainer.config import DataConfig, ModelConfig
from ida_trainer.data import (
    IGNORE_INDEX,
    DataError,
    Example,
    StepBatcher,
    build_batcher,
    collate,
    end_of_turn_marker,
    load_examples,
    pack_examples,
    strip_think,
)
from ida_trainer.demo import build_demo_model, corpus_texts, train_demo_tokenizer


def _write(tmp_path, name, records):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return p


def _targets(tok, ex):
    return tok.decode([i for i, s in zip(ex.input_ids, ex.supervised, strict=True) if s])


def test_plain_supervises_everything_and_appends_eos(tok, tmp_path):
    p = _write(tmp_path, "p.jsonl", [{"text": "def f(x):\n\treturn x\n"}])
    (ex,), stats = load_examples(DataConfig(path=str(p)), tok, path=p)
    assert all(ex.supervised) and ex.input_ids[-1] == tok.eos_token_id
    assert tok.decode(ex.input_ids[:-1]) == "def f(x):\n\treturn x\n"
    assert stats.num_targets == len(ex.input_ids) - 1


def test_alpaca_template_and_completion_only(tok, tmp_path):
    p = _write(
        tmp_path,
        "a.jsonl",
        [{"instruction": "Add.", "input": "2 3", "output": "5"}, {"instruction": "Say hi.", "output": "hi"}],
    )
    (a, b), _ = load_examples(DataConfig(path=str(p), format="alpaca"), tok, path=p)
    assert tok.decode(a.input_ids) == "### Instruction:\nAdd.\n\n### Input:\n2 3\n\n### Response:\n5<|endoftext|>"
    assert _targets(tok, a) == "5<|endoftext|>"
    assert "### Input" not in tok.decode(b.input_ids) and _targets(tok, b) == "hi<|endoftext|>"


def test_chat_one_example_per_assistant_turn_with_think_free_history(tok, tmp_path):
    conv = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n5"},
            {"role": "user", "content": "and +4?"},
            {"role": "assistant", "content": "<think>5+4</think>\n\n9"},
        ]
    }
    p = _write(tmp_path, "c.jsonl", [conv])
    (first, second), _ = load_examples(DataConfig(path=str(p), format="chat"), tok, path=p)
    assert _targets(tok, first) == "<think>\nadd them\n</think>\n\n5<|im_end|>"
    assert _targets(tok, second) == "<think>5+4</think>\n\n9<|im_end|>"
    history = tok.decode([i for i, s in zip(second.input_ids, second.supervised, strict=True) if not s])
    assert "add them" not in history and "<|im_start|>assistant\n5<|im_end|>" in history
    assert history.endswith("<|im_start|>assistant\n")
    assert end_of_turn_marker(tok) == "<|im_end|>"
    assert "(assistant turn 4)" in second.source


def test_strip_think():
    assert strip_think("<think>a\nb</think>\n\nanswer") == "answer"
    assert strip_think("no think") == "no think"


@pytest.mark.parametrize(
    "fmt, line, needle",
    [
        ("plain", "{not json", "not valid JSON"),
        ("plain", json.dumps({"txt": "x"}), '{"text": string}'),
        ("plain", json.dumps([1, 2]), "expected a JSON object"),
        ("alpaca", json.dumps({"instruction": "x"}), '"output"'),
        ("alpaca", json.dumps({"instruction": "x", "output": ""}), "nothing to train on"),
        ("chat", json.dumps({"messages": [{"role": "user", "content": "hi"}]}), "no assistant message"),
        ("chat", json.dumps({"messages": [{"role": "robot", "content": "hi"}]}), "role 'robot'"),
        ("chat", json.dumps({"messages": [{"role": "user"}]}), "content"),
    ],
)
def test_bad_lines_name_file_and_line(tok, tmp_path, fmt, line, needle):
    good = {
        "plain": {"text": "ok"},
        "alpaca": {"instruction": "i", "output": "o"},
        "chat": {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]},
    }[fmt]
    p = _write(tmp_path, "bad.jsonl", [good, "", line])
    with pytest.raises(DataError) as info:
        load_examples(DataConfig(path=str(p), format=fmt), tok, path=p)
    assert f"{p}:3:" in str(info.value) and needle in str(info.value)


def test_missing_and_empty_files(tok, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_examples(DataConfig(path="x"), tok, path=tmp_path / "none.jsonl")
    p = _write(tmp_path, "empty.jsonl", [""])
    with pytest.raises(DataError, match="no records"):
        load_examples(DataConfig(path=str(p)), tok, path=p)


def test_truncation_and_dropping(tok, tmp_path):
    long_prompt = "word " * 80
    p = _write(
        tmp_path,
        "a.jsonl",
        [{"instruction": long_prompt, "output": "x"}, {"instruction": "short", "output": "y " * 40}],
    )
    exs, stats = load_examples(DataConfig(path=str(p), format="alpaca", max_len=40), tok, path=p)
    assert stats.num_dropped == 1 and stats.num_truncated == 2 and len(exs) == 1
    assert len(exs[0].input_ids) == 40 and exs[0].supervised[-1]


def test_labels_are_preshifted_and_padding_ignored():
    a = Example((5, 6, 7), (False, True, True), "a")
    b = Example((8, 9), (True, True), "b")
    mb = collate([(a,), (b,)], pad_id=0, length=4, packed=False)
    assert mb["labels"].tolist() == [[6, 7, IGNORE_INDEX, IGNORE_INDEX], [9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]
    assert mb["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert mb["input_ids"].tolist() == [[5, 6, 7, 0], [8, 9, 0, 0]]


def test_packing_has_no_cross_contamination(tok):
    """Logits of documents packed into one row equal the logits of each document alone."""
    model = build_demo_model(
        ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2), tok, seed=0
    ).eval()
    texts = corpus_texts()[:3]
    exs = [
        Example(tuple(tok(t)["input_ids"]), (True,) * len(tok(t)["input_ids"]), f"t{i}") for i, t in enumerate(texts)
    ]
    rows = pack_examples(exs, max_len=10_000)
    assert len(rows) == 1 and len(rows[0]) == 3
    length = sum(len(e.input_ids) for e in exs) + 3
    mb = collate(rows, pad_id=0, length=length, packed=True)
    assert mb["attention_mask"].shape == (1, 1, length, length)
    with torch.no_grad():
        packed = model(
            input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"]
        ).logits[0]
        t = 0
        for ex in exs:
            alone = model(input_ids=torch.tensor([ex.input_ids])).logits[0]
            n = len(ex.input_ids)
            torch.testing.assert_close(packed[t : t + n], alone, rtol=1e-4, atol=1e-4)
            assert mb["position_ids"][0, t : t + n].tolist() == list(range(n))
            t += n
    # a label never points across a document boundary
    labels = mb["labels"][0]
    assert labels[len(exs[0].input_ids) - 1] == IGNORE_INDEX


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.integers(1, 50), st.booleans()), min_size=1, max_size=12), min_size=1, max_size=6),
    st.booleans(),
)
def test_collate_labels_property(docs, packed):
    exs = [Example(tuple(t for t, _ in d), tuple(s for _, s in d), f"d{i}") for i, d in enumerate(docs)]
    rows = pack_examples(exs, 20) if packed else [(e,) for e in exs]
    length = max(sum(len(e.input_ids) for e in r) for r in rows) + 1
    mb = collate(rows, pad_id=0, length=length, packed=packed)
    assert int((mb["labels"] != IGNORE_INDEX).sum()) == sum(e.num_targets for e in exs)
    ids, labels = mb["input_ids"], mb["labels"]
    nxt = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)
    sel = labels != IGNORE_INDEX
    assert torch.equal(labels[sel], nxt[sel])


def test_batcher_is_deterministic_resumable_and_counts_global_tokens():
    rows = [(Example(tuple(range(1, 2 + i % 5)), (True,) * (1 + i % 5), f"r{i}"),) for i in range(10)]
    a = StepBatcher(rows, global_batch_size=4, microbatches=2, seed=3, pad_id=0)
    steps = [a.next_step() for _ in range(5)]  # crosses epochs
    assert all(len(s.microbatches) == 2 and s.microbatches[0]["input_ids"].shape[0] == 2 for s in steps)
    for s in steps:
        assert s.global_valid_tokens == sum(int((mb["labels"] != IGNORE_INDEX).sum()) for mb in s.microbatches)
    b = StepBatcher(rows, global_batch_size=4, microbatches=2, seed=3, pad_id=0)
    for _ in range(3):
        b.next_step()
    c = StepBatcher(rows, global_batch_size=4, microbatches=2, seed=3, pad_id=0)
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    for want in steps[3:]:
        got = c.next_step()
        assert got.sources == want.sources
        assert all(
            torch.equal(x["input_ids"], y["input_ids"])
            for x, y in zip(got.microbatches, want.microbatches, strict=True)
        )
    with pytest.raises(ValueError, match="same data"):
        StepBatcher(rows[:5], global_batch_size=4, microbatches=2, seed=3, pad_id=0).load_state_dict(b.state_dict())
    # data-parallel ranks split the global batch and agree on the token count
    r0 = StepBatcher(rows, global_batch_size=4, microbatches=1, seed=3, pad_id=0, dp_rank=0, dp_size=2).next_step()
    r1 = StepBatcher(rows, global_batch_size=4, microbatches=1, seed=3, pad_id=0, dp_rank=1, dp_size=2).next_step()
    assert r0.global_valid_tokens == r1.global_valid_tokens == steps[0].global_valid_tokens
    assert r0.microbatches[0]["input_ids"].shape[0] == r1.microbatches[0]["input_ids"].shape[0] == 2
    with pytest.raises(ValueError, match="multiple"):
        StepBatcher(rows, global_batch_size=3, microbatches=2, seed=0, pad_id=0)


def test_build_batcher_packs_when_asked(tok, tmp_path):
    p = _write(tmp_path, "p.jsonl", [{"text": t} for t in corpus_texts()[:12]])
    exs, _ = load_examples(DataConfig(path=str(p), max_len=256), tok, path=p)
    b = build_batcher(
        DataConfig(path=str(p), max_len=256, packing=True), exs, global_batch_size=2, microbatches=1, seed=0, pad_id=0
    )
    assert len(b.rows) < len(exs)
    mb = b.next_step().microbatches[0]
    assert mb["attention_mask"].dim() == 4 and mb["input_ids"].shape[1] <= 256


# --------------------------------------------------------------------------------------------------
# Bad bytes and hostile lines: one DataError naming file:line (issue 11 items 7 and 9)


@pytest.mark.parametrize(
    "fmt, raw, needle",
    [
        ("plain", b'{"text": "caf\xff"}', "invalid UTF-8 (byte 0xff at byte column 14)"),
        ("plain", b'{"text": "\\ud800 x"}', 'field "text" holds a lone surrogate (\\ud800 at character 1)'),
        ("alpaca", b'{"instruction": "i", "output": "ok \\udfff"}', 'field "output" holds a lone surrogate'),
        (
            "chat",
            b'{"messages": [{"role": "user", "content": "\\ud83d"}, {"role": "assistant", "content": "a"}]}',
            'message 0 "content" holds a lone surrogate',
        ),
        ("plain", b'{"text": "x", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        ("plain", b'{"text": "unterminated', "not valid JSON (Unterminated string starting at column 10)"),
    ],
    ids=["invalid-utf8", "surrogate-plain", "surrogate-alpaca", "surrogate-chat", "deep-nesting", "unterminated"],
)
def test_bad_bytes_name_file_and_line(tok, tmp_path, fmt, raw, needle):
    good = {
        "plain": {"text": "ok"},
        "alpaca": {"instruction": "i", "output": "o"},
        "chat": {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]},
    }[fmt]
    p = tmp_path / "bad.jsonl"
    p.write_bytes(json.dumps(good).encode() + b"\n" + raw)  # the bad line last, no newline (a torn tail)
    with pytest.raises(DataError) as info:
        load_examples(DataConfig(path=str(p), format=fmt), tok, path=p)
    msg = str(info.value)
    assert msg.startswith(f"{p}:2: ") and needle in msg and "at at" not in msg, msg
    assert "\n" not in msg


def test_cli_data_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    """A deeply nested line used to end in RecursionError (a traceback, exit 1, the code of numerics
    failures), invalid UTF-8 in a bare codec message without file or line."""
    from ida_trainer.__main__ import main

    for name, raw in (
        ("nested.jsonl", b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("bytes.jsonl", b'{"text": "ok"}\n{"text": "\xc3\x28"}'),
    ):
        p = tmp_path / name
        p.write_bytes(raw + b"\n")
        rc = main(["--data", str(p), "--out", str(tmp_path / ("run-" + name)), "--train.progress", "false"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and f"{p}:" in err[0], err


# --------------------------------------------------------------------------------------------------
# Tokenisation bounded by max_len (issue 11 item 5)


def _real_tokenizers():
    """The demo's byte-level BPE plus two other real tokenizer families trained on the same corpus: a
    SentencePiece-style BPE without pre-tokenisation (merges may span words, like Llama 2) and a Unigram
    model behind an NFKC normaliser (a cut can split a sequence the normaliser composes)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = corpus_texts()
    out = {"demo-bytelevel-bpe": train_demo_tokenizer(texts)}
    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    sp.decoder = decoders.Metaspace(prepend_scheme="first", split=False)
    sp.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>"], show_progress=False))
    out["metaspace-bpe-nosplit"] = PreTrainedTokenizerFast(tokenizer_object=sp, unk_token="<unk>")
    uni = Tokenizer(models.Unigram())
    uni.normalizer = normalizers.NFKC()
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    uni.train_from_iterator(
        texts, trainers.UnigramTrainer(vocab_size=800, special_tokens=["<unk>"], unk_token="<unk>", show_progress=False)
    )
    out["nfkc-unigram"] = PreTrainedTokenizerFast(tokenizer_object=uni, unk_token="<unk>")
    return out


_TOKENIZERS = None


def _tokenizers():
    global _TOKENIZERS
    if _TOKENIZERS is None:
        _TOKENIZERS = _real_tokenizers()
    return _TOKENIZERS


def _hard_text():
    """Code, prose with combining marks and wide characters, and long runs (one huge 'word')."""
    parts = list(corpus_texts()[:20])
    parts += [
        "e\u0301t\u00e9 \ufb01 \u2460 \uff21 ",
        "\u4e2d\u6587 \U0001f600 " * 20,
        "a" * 3000,
        " " * 700,
        "\t\t\n" * 300,
        "x=1;" * 500,
        "==" * 900,
    ]
    return "".join(parts * 2)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["demo-bytelevel-bpe", "metaspace-bpe-nosplit", "nfkc-unigram"]),
    start=st.integers(0, 60_000),
    limit=st.integers(1, 400),
)
def test_bounded_tokenisation_equals_full_tokenisation(name, start, limit):
    from ida_trainer.data import encode_prefix

    t = _tokenizers()[name]
    text = _hard_text()[start:]
    full = t(text, add_special_tokens=False)["input_ids"]
    assert encode_prefix(t, text, limit) == full[:limit]


@pytest.mark.parametrize("fmt", ["plain", "alpaca", "chat"])
@pytest.mark.parametrize("max_len", [40, 200, 3000])
def test_bounded_examples_equal_the_unbounded_path(tok, tmp_path, fmt, max_len):
    """Every example (ids and completion-only mask), and the truncated/dropped counts, are what tokenising
    whole lines and then truncating gives."""
    from ida_trainer.data import encode_record, read_jsonl

    texts = corpus_texts()
    long = "".join(texts) * 3  # longer than the first prefix encode_prefix tries, even for max_len 3000
    recs = []
    for i, body in enumerate([texts[0], long, long[:5000], "short"]):
        if fmt == "plain":
            recs.append({"text": body})
        elif fmt == "alpaca":
            recs.append(
                {"instruction": body if i % 2 else "write it", "input": "ctx" * i, "output": long if i else body}
            )
        else:
            recs.append(
                {
                    "messages": [
                        {"role": "user", "content": body},
                        {"role": "assistant", "content": "<think>r</think>" + long[: 3000 * i + 10]},
                        {"role": "user", "content": "again"},
                        {"role": "assistant", "content": body},
                    ]
                }
            )
    p = _write(tmp_path, "d.jsonl", recs)
    cfg = DataConfig(path=str(p), format=fmt, max_len=max_len)
    got, stats = load_examples(cfg, tok, path=p)
    marker = end_of_turn_marker(tok) if fmt == "chat" else None
    want, truncated, dropped = [], 0, 0
    for lineno, rec in read_jsonl(p, fmt):
        for ex in encode_record(rec, fmt, tok, source=f"{p}:{lineno}", end_marker=marker):  # unbounded
            if len(ex.input_ids) > max_len:
                truncated += 1
                ex = Example(ex.input_ids[:max_len], ex.supervised[:max_len], ex.source)
            if ex.num_targets == 0:
                dropped += 1
                continue
            want.append(ex)
    assert got == want
    assert (stats.num_truncated, stats.num_dropped) == (truncated, dropped)
    assert truncated > 0


def test_a_huge_line_costs_what_max_len_needs(tmp_path):
    """An 8 MB training line with max_len 64: before, the whole line was tokenised (about 2 GB and half a
    minute for 10 MB); now memory and time do not depend on the line's length."""
    import subprocess
    import sys

    p = tmp_path / "huge.jsonl"
    text = "".join(corpus_texts())
    p.write_text(json.dumps({"text": (text * (8_000_000 // len(text) + 1))[:8_000_000]}) + "\n")
    script = f"""
import resource, time
from ida_trainer.config import DataConfig
from ida_trainer.data import load_examples
from ida_trainer.demo import corpus_texts, train_demo_tokenizer
tok = train_demo_tokenizer(corpus_texts())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
exs, stats = load_examples(DataConfig(path={str(p)!r}, max_len=64), tok, path={str(p)!r})
dt = time.perf_counter() - t0
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
assert len(exs) == 1 and len(exs[0].input_ids) == 64 and stats.num_truncated == 1
print(grew // 1024, dt)
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    grew_mib, seconds = res.stdout.split()
    assert int(grew_mib) < 200, f"peak memory grew {grew_mib} MiB while loading one 8 MB line (max_len 64)"
    assert float(seconds) < 20, seconds
