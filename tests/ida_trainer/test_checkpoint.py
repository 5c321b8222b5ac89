"""Checkpoint directories: exact round trip, loadable by ida_eval, atomic under a crash, keep-K, export."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ida_common.checksums import SUMS_FILE, read_sums, verify_sums, write_sums
from ida_trainer import checkpoint as ckpt
from ida_trainer.config import ModelConfig, OptimConfig, PrecisionConfig
from ida_trainer.demo import build_demo_model, corpus_texts
from ida_trainer.precision import (
    apply_recipe,
    build_optimizer,
    export_state,
    load_state,
)
from tests.conftest import flip_bit

TINY = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)


def _trained(tok, recipe="nvfp4"):
    model = build_demo_model(TINY, tok, seed=0)
    prec = PrecisionConfig(recipe=recipe)
    apply_recipe(model, prec)
    opt = build_optimizer(model, OptimConfig(name="lion" if recipe == "nvfp4" else "adamw", lr=1e-2), prec)
    ids = torch.tensor([tok(corpus_texts()[0])["input_ids"]])
    for _ in range(2):
        model(input_ids=ids).logits.float().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _save(root, step, model, opt, tok, keep=2, **kw):
    return ckpt.save_checkpoint(
        root,
        step,
        tensors=export_state(model),
        model_config=model.config,
        generation_config=model.generation_config,
        tokenizer=tok,
        optimizer_state=opt.state_dict(),
        trainer_state={"step": step, "rng": ckpt.rng_state()},
        metadata={"producer": "test"},
        keep=keep,
        **kw,
    )


def assert_same_state(got, want, where="state"):
    """Equal structure, types, values; tensors bit for bit, in their dtype and shape."""
    assert type(got) is type(want), where
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            assert_same_state(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_state(g, w, f"{where}.{i}")
    else:
        assert got == want or (got != got and want != want), where  # NaN equals NaN here


@pytest.mark.parametrize("recipe", ["nvfp4", "bf16"])
def test_the_optimizer_state_file_is_safetensors_read_back_exactly(tok, tmp_path, recipe):
    """optimizer.st: every tensor in its own dtype under its path, the rest as JSON in the header; read back as
    it was (int keys, tuples, None, dtypes, 0-d step tensors), and by the safetensors library itself."""
    from safetensors import safe_open

    model, opt = _trained(tok, recipe)
    want = opt.state_dict()
    path = tmp_path / "optimizer.st"
    ckpt.write_optimizer_state(path, want)
    assert_same_state(ckpt.read_optimizer_state(path), want)
    skeleton, tensors = ckpt.flatten_state(want)
    with safe_open(path, framework="pt") as f:  # Hugging Face's reader: the same tensors by the same names
        assert sorted(f.keys()) == sorted(tensors)
        for name in tensors:
            assert torch.equal(f.get_tensor(name), tensors[name]) and f.get_tensor(name).dtype == tensors[name].dtype
        assert json.loads(f.metadata()[ckpt.OPTIM_STATE_KEY]) == json.loads(json.dumps(skeleton))
    assert any(t.dim() == 0 for t in tensors.values()) == (recipe == "bf16")  # AdamW's step: stays 0-d
    # a fresh model and optimizer loaded as --resume loads them step on exactly as the ones that wrote them
    fresh_model, fresh = _trained(tok, recipe)
    load_state(fresh_model, export_state(model))
    fresh.load_state_dict(ckpt.read_optimizer_state(path))
    ids = torch.tensor([tok(corpus_texts()[1])["input_ids"]])
    for m, o in ((model, opt), (fresh_model, fresh)):
        m(input_ids=ids).logits.float().mean().backward()
        o.step()
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.uint8]).map(
        lambda dt: torch.arange(6).reshape(2, 3).to(dt)
    ),
    st.just(torch.tensor(3.0)),
)
_states = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.integers(0, 9), st.text("abc_", max_size=4)), inner, max_size=3),
    ),
    max_leaves=12,
)


@given(state=st.dictionaries(st.sampled_from(["state", "param_groups", "ida"]), _states, max_size=3))
@settings(max_examples=60, deadline=None)
def test_any_state_of_tensors_numbers_and_strings_comes_back_as_it_was(tmp_path_factory, state):
    try:
        ckpt.flatten_state(state)
    except ValueError as exc:  # two tensors at one dotted path ({"a.b": t, "a": {"b": t}}): refused, never merged
        assert "two tensors at" in str(exc)
        return
    path = tmp_path_factory.mktemp("state") / "optimizer.st"
    ckpt.write_optimizer_state(path, state)
    assert_same_state(ckpt.read_optimizer_state(path), state)


def test_what_the_optimizer_state_file_cannot_hold_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"optimizer state: state\.0\.f is a set, not a tensor"):
        ckpt.write_optimizer_state(tmp_path / "o.st", {"state": {0: {"f": {1, 2}}}})
    with pytest.raises(ValueError, match=r"key \(1, 2\) at 'state' is neither str nor int"):
        ckpt.write_optimizer_state(tmp_path / "o.st", {"state": {(1, 2): 0}})
    assert not (tmp_path / "o.st").exists()
    from mxfp8_codec import write_safetensors

    write_safetensors(tmp_path / "w.st", {"x": torch.ones(2)})  # weights, not an optimizer state
    with pytest.raises(ValueError, match=r"w\.st: its header has no 'ida_optimizer_state' entry"):
        ckpt.read_optimizer_state(tmp_path / "w.st")
    write_safetensors(tmp_path / "m.st", {"x": torch.ones(2)}, metadata={ckpt.OPTIM_STATE_KEY: '{"tensor": "y"}'})
    with pytest.raises(ValueError, match=r"m\.st: the state names a tensor 'y' the file does not hold"):
        ckpt.read_optimizer_state(tmp_path / "m.st")
    for deep in ("[" * 100_000 + "]" * 100_000, '{"tuple": [' * 5000 + "]}" * 5000):
        write_safetensors(tmp_path / "d.st", {"x": torch.ones(2)}, metadata={ckpt.OPTIM_STATE_KEY: deep})
        with pytest.raises(ValueError, match=r"d\.st: not an optimizer state: its structure is nested too deeply"):
            ckpt.read_optimizer_state(tmp_path / "d.st")


def _as_bytes(v):
    if isinstance(v, tuple):
        return tuple(_as_bytes(x) for x in v)
    return v.detach().contiguous().view(torch.uint8).flatten().numpy().tobytes()


def test_round_trip_is_byte_exact_and_loadable_by_ida_eval(tok, tmp_path):
    from ida_eval import load_model

    model, opt = _trained(tok)
    path = _save(tmp_path / "ck", 2, model, opt, tok)
    assert path.name == "ckpt-000002"
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "optimizer.st",
        "trainer_state.json",
    ):
        assert (path / name).is_file(), name
    assert [p.name for p in path.glob("*.safetensors")] == ["model.safetensors"]  # what vLLM takes for weights
    with ckpt.load_checkpoint(path) as loaded:
        assert_same_state(loaded.optimizer_state, opt.state_dict())
        want = export_state(model)
        assert loaded.tensors.keys() == want.keys()
        for k in want:
            assert _as_bytes(loaded.tensors[k]) == _as_bytes(want[k]), k
        # a fresh model restored from the checkpoint computes the same logits, bit for bit
        fresh = build_demo_model(TINY, tok, seed=1)
        apply_recipe(fresh, PrecisionConfig(recipe="nvfp4"))
        load_state(fresh, loaded.tensors)
    ids = torch.tensor([tok(corpus_texts()[1])["input_ids"]])
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, model(input_ids=ids).logits)
    # and the published loader reads the directory (decode, transpose) into a plain transformers model
    plain, tok2 = load_model(path, dtype=torch.float32)
    from ida_trainer.precision import nvfp4_modules

    plain_sd = plain.state_dict()
    masters = dict(nvfp4_modules(model))
    assert masters, "the nvfp4 recipe must have produced NVFP4 linears"
    for name, mod in masters.items():  # decoded and transposed back to nn.Linear's [out, in]: exact
        assert torch.equal(plain_sd[f"{name}.weight"], mod.dequantized_weight(torch.float32)), name
    for key, t in model.state_dict().items():
        if key in plain_sd and not any(key.startswith(n + ".") for n in masters):
            assert torch.equal(plain_sd[key], t.float()), key
    assert tok2.decode(ids[0]) == tok.decode(ids[0])
    # config.json names our quantization method; from_pretrained loads the directory directly
    import json

    from transformers import AutoModelForCausalLM

    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc == {
        "quant_method": "mxfp8_codec",
        "weights_dtype": "MXFP8_E4M3_UE8M0_K32",
        "format_version": "1",
        "orientation": "in_out",
        "norm_convention": "zero_centered",
        "scale_rule": "rceil",
    }
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for name, mod in masters.items():
        assert torch.equal(hf.get_submodule(name).decode_weight(), mod.dequantized_weight(torch.float32)), name


def test_crash_before_rename_keeps_previous_checkpoint(tok, tmp_path):
    model, opt = _trained(tok)
    root = tmp_path / "ck"
    first = _save(root, 1, model, opt, tok)
    before = (first / "model.safetensors").read_bytes()

    def crash(tmp):
        raise KeyboardInterrupt("simulated crash after writing, before the rename")

    with pytest.raises(KeyboardInterrupt):
        _save(root, 2, model, opt, tok, before_rename=crash)
    assert ckpt.latest_checkpoint(root) == first
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-000001"]  # the temporary went with the exception
    assert (first / "model.safetensors").read_bytes() == before
    # a killed writer leaves its temporary (tests/ida_trainer/test_kill.py kills real ones): the next
    # start sweeps those whose writer is gone, and the directories of older versions
    left = [root / ".ckpt-000002.k1ll3d_x.tmp", root / "ckpt-000003.tmp"]
    for d in left:
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"partial")
    assert ckpt.remove_partial(root) == sorted(left)
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [1]
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-000001"]


def test_keep_last_k(tok, tmp_path):
    model, opt = _trained(tok, recipe="bf16")
    root = tmp_path / "ck"
    for step in (1, 2, 3, 4):
        _save(root, step, model, opt, tok, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [3, 4]
    _save(root, 4, model, opt, tok, keep=2)  # re-saving a step replaces it
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [3, 4]


def test_pruning_keeps_only_the_runs_own_checkpoints(tok, tmp_path):
    """Checkpoints of another run (here 5 and 6, sorting newer) are never pruned, and never count against
    ``keep``: before, the new run's ckpt-1 was deleted the moment it was written."""
    model, opt = _trained(tok)
    root = tmp_path / "ck"

    def save(step, run_id):
        return ckpt.save_checkpoint(
            root,
            step,
            tensors=export_state(model),
            model_config=model.config,
            generation_config=model.generation_config,
            tokenizer=tok,
            optimizer_state=opt.state_dict(),
            trainer_state={"step": step, "rng": ckpt.rng_state(), "run_id": run_id},
            metadata={"producer": "test"},
            keep=2,
        )

    for step in (5, 6):
        save(step, "old")
    for step in (1, 2, 3):
        save(step, "new")
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [2, 3, 5, 6]
    assert [s for s, _ in ckpt.list_checkpoints(root, run_id="new")] == [2, 3]
    assert ckpt.checkpoint_run_id(root / "ckpt-000005") == "old"


def test_a_resave_killed_between_its_renames_is_recovered(tok, tmp_path):
    """Older versions re-saved step N by moving the complete ckpt-N aside first; if the process died before
    the new one took its name, the next start moves the old one back instead of deleting it. (Today a
    re-save is one atomic exchange: ida_common.files.atomic_directory.)"""
    model, opt = _trained(tok)
    root = tmp_path / "ck"
    path = _save(root, 4, model, opt, tok)
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    path.rename(root / ("ckpt-000004" + ckpt.OLD_SUFFIX))  # the state between the two renames
    (root / ("ckpt-000004" + ckpt.TMP_SUFFIX)).mkdir()  # the new one, not yet renamed
    ckpt.remove_partial(root)
    assert [p.name for p in root.iterdir()] == ["ckpt-000004"]
    assert hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest() == digest


def test_a_checkpoints_model_tensors_are_read_when_looked_up(tok, tmp_path):
    """load_checkpoint(...).tensors answers names from the header and reads a tensor only when it is looked up
    (--resume then holds one tensor, not the file): a file cut short after the load still lists and contains every
    name, and only a lookup past the cut fails, naming the file and the tensor."""
    from mxfp8_codec import open_mxfp8

    model, opt = _trained(tok)
    path = _save(tmp_path / "ck", 1, model, opt, tok)
    want = export_state(model)  # the nvfp4 recipe: the bytes the file holds
    with open_mxfp8(path / "model.safetensors") as reader:  # the tensor whose bytes end the file, and another
        entries = sorted(reader.header.entries.values(), key=lambda e: e.end)
    last, first = entries[-1].name.removesuffix(".scale"), entries[0].name.removesuffix(".scale")
    with ckpt.load_checkpoint(path) as loaded:
        names = list(loaded.tensors)
        assert _as_bytes(loaded.tensors[first]) == _as_bytes(want[first])
        os.truncate(path / "model.safetensors", (path / "model.safetensors").stat().st_size - 64)
        assert list(loaded.tensors) == names and len(loaded.tensors) == len(want) and set(names) == set(want)
        assert last in loaded.tensors and f"{last}.scale" not in loaded.tensors and "nope" not in loaded.tensors
        assert _as_bytes(loaded.tensors[first]) == _as_bytes(want[first])  # before the cut: still read
        with pytest.raises(ValueError, match=rf"model.safetensors: tensor '{re.escape(last)}.*': the file ends"):
            loaded.tensors[last]


def test_incomplete_checkpoint_is_named(tok, tmp_path):
    model, opt = _trained(tok, recipe="bf16")
    path = _save(tmp_path / "ck", 1, model, opt, tok)
    (path / "optimizer.st").unlink()
    with pytest.raises(ValueError, match="optimizer.st is missing"):
        ckpt.load_checkpoint(path)
    assert ckpt.list_checkpoints(tmp_path / "ck") != []  # model + state still present: listed, load explains
    path = _save(tmp_path / "ck", 2, model, opt, tok)
    (path / "trainer_state.json").write_text("[]")
    with pytest.raises(ValueError, match=r"trainer_state.json is damaged \(its bytes differ from the sha256 recorded"):
        ckpt.load_checkpoint(path)
    (path / SUMS_FILE).unlink()  # a checkpoint of an older ida: the reader's own checks name the damage
    with pytest.raises(ValueError, match=r"trainer_state.json is damaged \(a JSON list, not an object\)"):
        ckpt.load_checkpoint(path)
    path = _save(tmp_path / "ck", 3, model, opt, tok)
    (path / SUMS_FILE).unlink()
    with (path / "optimizer.st").open("r+b") as f:
        f.truncate(1000)  # torn
    with pytest.raises(ValueError) as info:
        ckpt.load_checkpoint(path)
    assert str(info.value).startswith(f"{path / 'optimizer.st'} is damaged (header length ")
    assert str(info.value).count("optimizer.st") == 1 and str(info.value).endswith("before it")
    assert ckpt.checkpoint_run_id(path) is None  # pruning never takes it for the run's own


class _Payload:
    """What a hostile optimizer.pt could hold: unpickling it would run os.system."""

    def __reduce__(self):
        import os

        return (os.system, ("touch ran",))


def test_an_older_checkpoints_optimizer_pt_is_read_as_before(tok, tmp_path):
    """ida before 2026-12-07 wrote torch.save(optimizer.state_dict()) as optimizer.pt: such a checkpoint still
    resumes, with the same state the new file holds."""
    model, opt = _trained(tok, recipe="bf16")
    path = _save(tmp_path / "ck", 1, model, opt, tok)
    with ckpt.load_checkpoint(path) as loaded:
        new = loaded.optimizer_state
    torch.save(opt.state_dict(), path / "optimizer.pt")
    (path / "optimizer.st").unlink()
    write_sums(path)
    with ckpt.load_checkpoint(path) as loaded:
        assert_same_state(loaded.optimizer_state, new)


def test_an_optimizer_state_is_read_without_running_code_from_the_file(tok, tmp_path, monkeypatch):
    """The new file holds no pickle at all; an older checkpoint's optimizer.pt is read weights-only."""
    model, opt = _trained(tok, recipe="bf16")
    path = _save(tmp_path / "ck", 1, model, opt, tok)
    torch.save({"state": {}, "param_groups": [], "ida": _Payload()}, path / "optimizer.pt")
    (path / "optimizer.st").unlink()  # an older checkpoint
    write_sums(path)  # whoever planted it can list its sha256 too
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"optimizer.pt holds objects other than tensors.*runs no code from one"):
        ckpt.load_checkpoint(path)
    assert not (tmp_path / "ran").exists()


def test_export_renames_header_only_with_sha256_proof(tok, tmp_path):
    from mxfp8_codec import open_mxfp8

    model, opt = _trained(tok)
    path = _save(tmp_path / "ck", 2, model, opt, tok)
    manifest = ckpt.export_checkpoint(path, tmp_path / "export", rename=ckpt.parse_prefix_mapping("model.=backbone."))
    out = tmp_path / "export"
    assert json.loads((out / "export_manifest.json").read_text()) == manifest
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    with open_mxfp8(path / "model.safetensors") as src, open_mxfp8(out / "model.safetensors") as dst:
        src_names, dst_names = src.keys(), dst.keys()
        assert sorted(dst_names) == sorted(
            n.replace("model.", "backbone.", 1) if n.startswith("model.") else n for n in src_names
        )
        for entry in manifest["tensors"]:
            old, new = entry["old"], entry["new"]
            if old.endswith(".scale"):
                continue
            assert hashlib.sha256(bytes(src.tensor_bytes(old))).hexdigest() == entry["sha256"]
            assert bytes(dst.tensor_bytes(new)) == bytes(src.tensor_bytes(old))
        assert src.metadata["weights_dtype"] == dst.metadata["weights_dtype"]
    # identity export (default) keeps the names
    ckpt.export_checkpoint(path, tmp_path / "same")
    with open_mxfp8(tmp_path / "same" / "model.safetensors") as dst:
        assert "model.embed_tokens.weight" in list(dst.keys())


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils' sha256sum is not installed")
def test_a_byte_damaged_after_the_save_is_named_not_loaded(tok, tmp_path):
    """Nothing in a torch zip archive or a safetensors file detects a flipped byte: it loads as another number.
    SHA256SUMS, written last into every checkpoint (and export), is checked by resume and export, and by
    coreutils' ``sha256sum -c`` where ida is not installed."""
    model, opt = _trained(tok, recipe="bf16")
    path = _save(tmp_path / "ck", 2, model, opt, tok)
    listed = (path / SUMS_FILE).read_text()
    assert sorted(line.split("  ", 1)[1] for line in listed.splitlines()) == sorted(
        p.name for p in path.iterdir() if p.name != SUMS_FILE
    )
    check = ["sha256sum", "-c", "--quiet", SUMS_FILE]
    assert subprocess.run(check, cwd=path, capture_output=True, check=False).returncode == 0
    good = {n: t.clone() for n, t in ckpt.flatten_state(ckpt.read_optimizer_state(path / "optimizer.st"))[1].items()}
    flip_bit(path / "optimizer.st", mask=0x40)
    flipped = ckpt.flatten_state(ckpt.read_optimizer_state(path / "optimizer.st"))[1]  # read without a word
    assert [n for n in good if not torch.equal(good[n], flipped[n])]
    res = subprocess.run(check, cwd=path, capture_output=True, text=True, check=False)
    assert res.returncode == 1 and "optimizer.st: FAILED" in res.stdout
    with pytest.raises(
        ValueError, match=r"ckpt-000002/optimizer.st is damaged \(its bytes differ from the sha256"
    ) as info:
        ckpt.load_checkpoint(path)
    assert str(info.value).endswith(
        f"to resume from the checkpoint before it; changed on purpose? delete {path / SUMS_FILE}"
    )
    ckpt.export_checkpoint(path, tmp_path / "export")  # the export reads no training state: it goes on

    path = _save(tmp_path / "ck", 3, model, opt, tok)
    flip_bit(path / "model.safetensors", mask=0x40)
    with pytest.raises(ValueError, match=r"ckpt-000003/model.safetensors: its bytes differ from the sha256"):
        ckpt.export_checkpoint(path, tmp_path / "export2")
    assert not (tmp_path / "export2").exists()
    (path / SUMS_FILE).unlink()  # an older ida's checkpoint: read as it is
    with ckpt.load_checkpoint(path) as loaded:
        assert loaded.trainer_state["step"] == 3


def test_the_export_lists_its_own_files(tok, tmp_path):
    model, opt = _trained(tok)
    path = _save(tmp_path / "ck", 2, model, opt, tok)
    out = tmp_path / "export"
    ckpt.export_checkpoint(path, out)
    listed = read_sums(out)
    assert listed is not None and sorted(listed) == sorted(p.name for p in out.iterdir() if p.name != SUMS_FILE)
    assert "export_manifest.json" in listed and "optimizer.st" not in listed
    assert verify_sums(out)


def test_the_checkpoint_benchmark_runs_and_prints_both_tables():
    """benchmarks/bench_checkpoint.py at toy size: the command docs/benchmarks.md quotes keeps running."""
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run(
        [sys.executable, "benchmarks/bench_checkpoint.py", "--hidden", "32", "--layers", "1", "--intermediate", "64",
         "--repeats", "1"],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [
        line.split(" | ")[0]
        for line in res.stdout.splitlines()
        if line.startswith("| nvfp4") or line.startswith("| bf16")
    ]
    assert rows == ["| nvfp4", "| bf16"] * 2, res.stdout


def test_what_an_optimizer_keeps_on_the_cpu_does_not_keep_the_file_mapped(tok, tmp_path):
    """AdamW keeps its 0-d `step` tensors as it is given them: as views of the mapped optimizer.st, they kept the
    whole file mapped for the rest of the run (and its disk space in use after the checkpoint was pruned). With the
    garbage collector off: a reference cycle in the reader kept the map until a collection, which comes when it
    comes (the legacy path failed alone and passed in a full run)."""

    def mapped(path):
        return str(path) in Path("/proc/self/maps").read_text(encoding="utf-8")

    model, opt = _trained(tok, recipe="bf16")
    ck = _save(tmp_path / "ck", 1, model, opt, tok)
    legacy = _save(tmp_path / "legacy", 1, model, opt, tok)  # an older ida's checkpoint: optimizer.pt
    torch.save(opt.state_dict(), legacy / "optimizer.pt")
    (legacy / "optimizer.st").unlink()
    write_sums(legacy)
    gc.collect()
    gc.disable()
    try:
        for path in (ck / "optimizer.st", legacy / "optimizer.pt"):
            with ckpt.load_checkpoint(path.parent) as loaded:
                state = loaded.optimizer_state
            del loaded  # a with block's target outlives it
            assert mapped(path)  # the moments are mapped, not read
            fresh_model, fresh = _trained(tok, recipe="bf16")
            fresh.load_state_dict(state)
            assert any(torch.is_tensor(s.get("step")) for s in fresh.state.values())
            del state
            for s in fresh.state.values():  # what a GPU run does: the moments go to the device, the steps stay
                s["exp_avg"], s["exp_avg_sq"] = s["exp_avg"].clone(), s["exp_avg_sq"].clone()
            assert not mapped(path), path.name
    finally:
        gc.enable()
