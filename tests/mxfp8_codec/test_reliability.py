"""Issue 11, the codec's part: nothing lost, nothing stuck, one line.

Every command refuses to write onto, into or around its own input and over an existing output
without ``--overwrite``; a killed ``quantize`` (deterministic kill points, and a kill at a file-size
threshold that also hits the old code) never leaves a damaged file under a final name; the next run
sweeps what a killed one left; hostile inputs give one line; NaN output is announced; names with
control characters are printed escaped.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ida_common.checksums import SUMS_FILE, read_sums, verify_sums, write_sums
from mxfp8_codec import MXFP8Tensor, write_mxfp8_safetensors, write_safetensors
from mxfp8_codec.cli import main
from tests.conftest import flip_bit

pytestmark = pytest.mark.slow  # each case kills a real quantize process

REPO = Path(__file__).resolve().parents[2]
SIDE_BYTES = 3 << 20  # a 3 MiB tokenizer.json: far bigger than the model file


def _hf_dir(path: Path, seed: int = 0) -> Path:
    """A small transformers-style checkpoint: BF16 weights, config, a big tokenizer.json."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True)
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 64)).astype(np.float32),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((64, 96)).astype(np.float32),
        "model.norm.weight": np.ones(64, np.float32),
    }
    write_safetensors(path / "model.safetensors", tensors, metadata={"format": "pt"}, float_dtype=np.float32)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    vocab = {f"tok{i}": i for i in range(SIDE_BYTES // 16)}
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    return path


def _snapshot(root: Path) -> dict[str, str]:
    """relative path -> sha256 for every file under ``root`` (what "nothing changed" means)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# python ignores SIGXFSZ (a write past RLIMIT_FSIZE then fails with EFBIG); this restores the
# default action, so the kernel kills the process at the first write past the limit.
KILLED_BY_SIZE = "import runpy, signal; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); runpy.run_module('mxfp8_codec', run_name='__main__')"


def _cli(
    *args: str, env: dict[str, str] | None = None, fsize: int | None = None, kill_at_fsize: bool = False
) -> subprocess.CompletedProcess[str]:
    def limit() -> None:  # a kill (or an EFBIG write error) at a file-size threshold
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [sys.executable, *(["-c", KILLED_BY_SIZE] if kill_at_fsize else ["-m", "mxfp8_codec"]), *args],
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=limit,
    )


def _one_error_line(err: str) -> str:
    """The one ``mxfp8_codec: error:`` line of ``err`` (progress-bar lines aside), and no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and "tensor/s]" not in line and "it/s]" not in line]
    assert len(lines) == 1 and lines[0].startswith("mxfp8_codec: error: "), err
    return lines[0]


# -- item 2: never onto the input, never over an existing output without --overwrite ---------------


def test_quantize_onto_into_or_around_its_source_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = _hf_dir(tmp_path / "hf")
    (tmp_path / "hf-link").symlink_to(hf)
    before = _snapshot(tmp_path)
    for out in (hf, tmp_path / "hf-link", hf / "sub" / "..", tmp_path / "hf-link" / ".." / "hf", hf / "mx", tmp_path):
        for extra in ([], ["--overwrite"]):
            assert main(["quantize", str(hf), str(out), *extra]) == 2, out
            line = _one_error_line(capsys.readouterr().err)
            assert str(out) in line and ("is the input" in line or "inside the input" in line or "contains" in line)
    assert _snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["hf", "hf-link"]


def test_existing_outputs_are_replaced_only_with_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf, mx = _hf_dir(tmp_path / "hf"), tmp_path / "mx"
    assert main(["quantize", str(hf), str(mx)]) == 0
    first = _snapshot(mx)
    assert main(["quantize", str(hf), str(mx), "--scale-rule", "floor"]) == 2
    assert "exists and is not empty; pass --overwrite" in _one_error_line(capsys.readouterr().err)
    assert _snapshot(mx) == first
    assert main(["quantize", str(hf), str(mx), "--scale-rule", "floor", "--overwrite"]) == 0
    assert _snapshot(mx)["model.safetensors"] != first["model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["hf", "mx"]  # the old copy is gone, no temporaries left
    # dequantize (directory and file) and rename follow the same rule
    back = tmp_path / "back"
    assert main(["dequantize", str(mx), str(back)]) == 0
    assert main(["dequantize", str(mx), str(back)]) == 2
    assert "pass --overwrite" in _one_error_line(capsys.readouterr().err)
    assert main(["dequantize", str(mx), str(back), "--overwrite"]) == 0
    f = mx / "model.safetensors"
    for args, why in [
        (["dequantize", str(f), str(f)], "is the input"),
        (["dequantize", str(f), str(hf / "model.safetensors")], "exists; pass --overwrite"),
        (["rename", str(f), str(f), "--prefix", "model.=m."], "is the input"),
        (["rename", str(f), str(f), "--prefix", "model.=m.", "--overwrite"], "is the input"),
        (["rename", str(f), str(hf / "model.safetensors"), "--prefix", "model.=m."], "exists; pass --overwrite"),
        # item 7: rename onto an existing directory was an IsADirectoryError
        (["rename", str(f), str(back), "--prefix", "model.=m."], "is a directory; give the output file's name"),
        (["rename", str(f), str(back), "--prefix", "model.=m.", "--overwrite"], "is a directory"),
    ]:
        assert main(args) == 2, args
        assert why in _one_error_line(capsys.readouterr().err), args
    assert main(["rename", str(f), str(tmp_path / "r.safetensors"), "--prefix", "model.=m."]) == 0


# -- item 3 and 11: kills ---------------------------------------------------------------------------


@pytest.mark.parametrize("kill_at", ["writer.tensor_written:2", "copy_file.partial", "atomic_directory.complete"])
def test_killed_quantize_leaves_no_damaged_file_and_the_next_run_sweeps(tmp_path: Path, kill_at: str) -> None:
    """A SIGKILL at a named phase (ida_common.killpoint), into a fresh OUT_DIR and over an existing one."""
    hf, mx = _hf_dir(tmp_path / "hf"), tmp_path / "mx"
    r = _cli("quantize", str(hf), str(mx), env={"IDA_KILL_AT": kill_at})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not mx.exists()  # nothing under the final name
    (stale,) = [p for p in os.listdir(tmp_path) if p not in ("hf", "mx")]
    assert stale.startswith(".mx.") and stale.endswith(".tmp")
    r = _cli("quantize", str(hf), str(mx))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["hf", "mx"]  # the killed run's temporary was swept
    good = _snapshot(mx)
    assert good["tokenizer.json"] == _snapshot(hf)["tokenizer.json"]
    r = _cli("quantize", str(hf), str(mx), "--overwrite", "--scale-rule", "floor", env={"IDA_KILL_AT": kill_at})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert _snapshot(mx) == good  # the previous output, complete and untouched
    assert _cli("verify", str(mx)).returncode == 0
    assert _cli("quantize", str(hf), str(mx), "--overwrite").returncode == 0
    assert sorted(os.listdir(tmp_path)) == ["hf", "mx"]


@pytest.mark.parametrize("killed", [True, False], ids=["killed", "write-error"])
def test_quantize_stopped_at_a_file_size_threshold_never_leaves_a_truncated_side_file(
    tmp_path: Path, killed: bool
) -> None:
    """The issue's finding: a kill mid-copy left tokenizer.json truncated under its final name (and
    verify said OK). RLIMIT_FSIZE makes the kernel stop the process at the first write past 1 MiB --
    during the tokenizer copy, the only file that big -- on any version of the code: killed by
    SIGXFSZ, or (python's default) the write fails with EFBIG, like a full disk."""
    hf, mx = _hf_dir(tmp_path / "hf"), tmp_path / "mx"
    assert (hf / "model.safetensors").stat().st_size < 1 << 20 < (hf / "tokenizer.json").stat().st_size
    r = _cli("quantize", str(hf), str(mx), fsize=1 << 20, kill_at_fsize=killed)
    if killed:
        assert r.returncode == -signal.SIGXFSZ, r.stderr
    else:
        assert r.returncode == 2 and "File too large" in _one_error_line(r.stderr)
    source = _snapshot(hf)
    copies = _snapshot(mx) if mx.exists() else {}  # side files must be byte copies (config.json is rewritten)
    damaged = [n for n, sha in copies.items() if n not in ("model.safetensors", "config.json") and source[n] != sha]
    assert not damaged, f"truncated under the final name: {damaged}"
    assert not mx.exists()
    assert sorted(os.listdir(tmp_path)) == (["hf"] if not killed else sorted(os.listdir(tmp_path)))
    assert _cli("quantize", str(hf), str(mx)).returncode == 0
    assert _snapshot(mx)["tokenizer.json"] == source["tokenizer.json"]
    assert sorted(os.listdir(tmp_path)) == ["hf", "mx"]


# -- item 7 and the extras: one line, warnings, escaping, symlinks ----------------------------------


def test_deeply_nested_shard_index_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model.safetensors.index.json").write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for cmd in ("verify", "inspect"):
        assert main([cmd, str(d)]) in (1, 2)
        assert "nests too deeply" in _one_error_line(capsys.readouterr().err)
    assert main(["quantize", str(d), str(tmp_path / "out")]) == 2
    assert "nests too deeply" in _one_error_line(capsys.readouterr().err)


def test_dequantize_warns_naming_each_tensor_with_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "nan.safetensors"
    scales = np.array([[127, 255], [127, 127]], np.uint8)  # one NaN block of 32 values
    write_mxfp8_safetensors(
        src,
        {
            "a.q_proj.weight": MXFP8Tensor(np.full((2, 64), 0x38, np.uint8), scales),
            "b.q_proj.weight": MXFP8Tensor(np.full((2, 32), 0x38, np.uint8), np.full((2, 1), 127, np.uint8)),
        },
    )
    assert main(["dequantize", str(src), str(tmp_path / "out.safetensors")]) == 0
    err = capsys.readouterr().err
    assert "mxfp8_codec: warning: tensor a.q_proj.weight: 32 of 128 values are NaN/Inf" in err
    assert "b.q_proj.weight" not in err and len(err.strip().splitlines()) == 1


def test_inspect_escapes_control_characters_in_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ctl.safetensors"
    hostile = "x\x1b[2J\nforged line\r"
    write_safetensors(
        path,
        {hostile: np.zeros(2, np.float32), "ünïcode.name": np.zeros(2, np.float32)},
        metadata={"note\x07": "bell\x1b"},
    )
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert not any(line.startswith("forged line") for line in out.splitlines())
    assert repr(hostile) in out and "ünïcode.name" in out  # ordinary non-ASCII names stay readable
    assert main(["rename", str(path), str(tmp_path / "r.safetensors"), "--map", json.dumps({hostile: "y"})]) == 0
    assert "\x1b" not in capsys.readouterr().out


def test_a_shard_or_side_file_linked_outside_the_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_safetensors(outside / "model-00001-of-00001.safetensors", {"x": np.zeros(2, np.float32)})
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model-00001-of-00001.safetensors").symlink_to(outside / "model-00001-of-00001.safetensors")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "model-00001-of-00001.safetensors"}})
    )
    for cmd in ("verify", "inspect"):
        assert main([cmd, str(d), *(["--allow-plain"] if cmd == "verify" else [])]) in (1, 2)
        assert "outside the checkpoint directory" in _one_error_line(capsys.readouterr().err)
    # a side file linked out (e.g. to a secret) is not copied into the output
    hf = _hf_dir(tmp_path / "hf")
    (outside / "secret").write_text("secret")
    (hf / "special_tokens_map.json").symlink_to(outside / "secret")
    assert main(["quantize", str(hf), str(tmp_path / "mx")]) == 2
    assert "special_tokens_map.json: is a symlink to" in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "mx").exists()
    # the Hugging Face hub cache links snapshots/<rev>/<file> to ../../blobs/<sha>: accepted
    snap, blobs = tmp_path / "hub" / "snapshots" / "abc", tmp_path / "hub" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in hf.iterdir():
        if not f.is_symlink():
            (blobs / f.name).write_bytes(f.read_bytes())
            (snap / f.name).symlink_to(Path("..", "..", "blobs", f.name))
    assert main(["quantize", str(snap), str(tmp_path / "mx")]) == 0


def test_each_output_lists_its_own_files_and_a_damaged_input_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """quantize, dequantize and export write a SHA256SUMS of their own output (a source's list names other
    bytes: never copied); verify, dequantize and export check a source's list before they trust its bytes."""
    hf = _hf_dir(tmp_path / "hf")
    write_sums(hf)
    (hf / "trainer_state.json").write_text("{}")
    outs = {"mx": ["quantize", str(hf)], "bf16": ["dequantize", str(tmp_path / "mx")]}
    outs["ct"] = ["export", "--format", "compressed-tensors", str(tmp_path / "mx")]
    for out, cmd in outs.items():
        assert main([*cmd, str(tmp_path / out)]) == 0
        names = {p.name for p in (tmp_path / out).iterdir()}
        assert "tokenizer.json" in names and "trainer_state.json" not in names, names
        assert sorted(read_sums(tmp_path / out) or {}) == sorted(names - {SUMS_FILE})
        assert verify_sums(tmp_path / out)
    capsys.readouterr()
    mx = tmp_path / "mx"
    assert main(["verify", str(mx)]) == 0
    assert f"OK {mx / SUMS_FILE}: the weights, index and side files match" in capsys.readouterr().out
    (mx / "notes.txt").write_text("not listed, not checked")
    flip_bit(mx / "tokenizer.json", 100)
    assert main(["verify", str(mx)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"{mx / 'tokenizer.json'}: its bytes differ from the sha256 recorded in SHA256SUMS" in line
    assert f"changed on purpose? delete {mx / SUMS_FILE}" in line
    for cmd in (["dequantize", str(mx)], ["export", "--format", "compressed-tensors", str(mx)]):
        assert main([*cmd, str(tmp_path / "again")]) == 2
        assert "tokenizer.json: its bytes differ" in _one_error_line(capsys.readouterr().err)
        assert not (tmp_path / "again").exists()
    (mx / SUMS_FILE).unlink()  # what the line says to do after an edit on purpose
    assert main(["verify", str(mx)]) == 0


def test_lone_surrogate_names_are_one_line_in_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "g.safetensors"
    write_safetensors(good, {"n": np.zeros(2, np.float32)})
    raw = good.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].replace(b'"n"', b'"\\udc80"')
    bad = tmp_path / "s.safetensors"
    bad.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n :])
    for args in (
        ["inspect", str(bad)],
        ["verify", str(bad), "--allow-plain"],
        ["dequantize", str(bad), str(tmp_path / "o.safetensors")],
        ["rename", str(bad), str(tmp_path / "r.safetensors"), "--prefix", "a=b"],
    ):
        assert main(args) in (1, 2), args
        assert "lone surrogate" in _one_error_line(capsys.readouterr().err), args
