"""python -m mxfp8_codec export --format compressed-tensors: transformers + compressed-tensors load the
export on CPU with load_model's weights (out_in: bit-identical) and greedy tokens (both orientations)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("compressed_tensors")

from ida_eval import load_model
from mxfp8_codec import (
    MXFP8Tensor,
    decode_mxfp8,
    encode_mxfp8,
    is_projection_weight,
    open_mxfp8,
    write_mxfp8_safetensors,
)
from mxfp8_codec.cli import main
from mxfp8_codec.export import compressed_tensors_config, export_compressed_tensors
from tests.ida_eval.support import native_state_dict, tiny_model


def _checkpoint(model, tok, d: Path, orientation: str, *, folded: bool = False, edit=None) -> Path:
    d.mkdir(parents=True)
    model.config.save_pretrained(d)
    tok.save_pretrained(d)
    sd = native_state_dict(model, folded=folded)
    if orientation == "out_in":
        sd = {n: (t.t().contiguous() if is_projection_weight(n) else t) for n, t in sd.items()}
    if edit is not None:
        sd = edit(sd)
    write_mxfp8_safetensors(
        d / "model.safetensors", sd, orientation=orientation, norm_convention="folded" if folded else "zero_centered"
    )
    return d


def _ct_load(d: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()


def _greedy(model, ids, tok):
    return model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.eos_token_id)


@pytest.mark.parametrize("arch", ["nemotron", "qwen3"])
def test_out_in_export_keeps_bytes_and_loads_bit_identically(arch, tok, ids, tmp_path, capsys):
    model = tiny_model(arch, len(tok))
    src = _checkpoint(model, tok, tmp_path / "src", "out_in", folded=arch == "nemotron")
    dst = tmp_path / "ct"
    assert main(["export", "--format", "compressed-tensors", str(src), str(dst)]) == 0
    out = capsys.readouterr().out
    assert "payload and scale bytes unchanged" in out
    # every projection's payload and scale: the same sha256 in the source and in the export (printed and re-checked)
    from safetensors import safe_open

    with open_mxfp8(src / "model.safetensors") as r, safe_open(str(dst / "model.safetensors"), "pt") as g:
        assert g.metadata() == {"format": "pt"}
        n = 0
        for name in r.keys():
            if r.is_quantized(name):
                for a, b in ((name, name), (name + ".scale", name + "_scale")):
                    want = hashlib.sha256(bytes(r.tensor_bytes(a))).hexdigest()
                    got = hashlib.sha256(g.get_tensor(b).view(torch.uint8).numpy().tobytes()).hexdigest()
                    assert got == want, b
                    assert want in out
                assert g.get_tensor(name).dtype == torch.float8_e4m3fn
                assert g.get_tensor(name + "_scale").dtype == torch.uint8
                n += 1
        assert n > 0 and not any(k.endswith(".scale") for k in g.keys())
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["quantization_config"] == compressed_tensors_config()
    ct, ours = _ct_load(dst), load_model(src)[0]
    # greedy tokens identical (compressed-tensors decompresses the weights on the first forward)
    assert torch.equal(_greedy(ct, ids, tok), _greedy(ours, ids, tok))
    ours_sd = ours.state_dict()
    ct_sd = {n: t for n, t in ct.state_dict().items() if not n.endswith("weight_scale")}
    assert ct_sd.keys() == ours_sd.keys()
    for name, t in ct_sd.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, ours_sd[name]), name  # decoded weights bit-identical


def test_in_out_export_reencodes_and_counts_changes(tok, ids, tmp_path, capsys):
    model = tiny_model("llama", len(tok))
    with torch.no_grad():  # outlier input channels: re-encoding along in_features must change some values
        for name, p in model.named_parameters():
            if name.endswith("mlp.down_proj.weight"):
                p[:, ::7] *= 40.0
    src = _checkpoint(model, tok, tmp_path / "src", "in_out")
    report = export_compressed_tensors(src, tmp_path / "ct")
    # independent count: decode the master, transpose, quantize again with the codec, compare values
    changed = total = 0
    biggest = 0.0
    with open_mxfp8(src / "model.safetensors") as r:
        for name in r.keys():
            if r.is_quantized(name):
                raw = r.get_raw(name)
                old = decode_mxfp8(raw.payload, raw.scales, dtype=np.float32).T
                new = decode_mxfp8(*encode_mxfp8(np.ascontiguousarray(old)), dtype=np.float32)
                changed += int((new != old).sum())
                total += old.size
                biggest = max(biggest, float(np.abs(new - old).max()))
    assert report.changed == changed > 0 and report.values == total and report.max_change == biggest
    lines = "\n".join(report.lines())
    assert f"{changed} of {total} values changed" in lines and "the sha256 chain ends at the master" in lines
    ct, ours = _ct_load(tmp_path / "ct"), load_model(src)[0]
    assert torch.equal(_greedy(ct, ids, tok), _greedy(ours, ids, tok))


def test_config_is_what_compressed_tensors_reads():
    from compressed_tensors.quantization import QuantizationConfig

    qc = QuantizationConfig.model_validate(compressed_tensors_config())
    w = qc.config_groups["group_0"].weights
    assert (w.num_bits, w.type, w.group_size, w.strategy, w.scale_dtype) == (8, "float", 32, "group", torch.uint8)
    assert qc.format == "mxfp8-quantized" and qc.ignore == ["lm_head"]


def test_refusals_are_one_line_and_leave_nothing(tok, tmp_path, capsys):
    model = tiny_model("llama", len(tok))
    ok = _checkpoint(model, tok, tmp_path / "ok", "out_in")

    def run(src: Path, dst: Path, *extra: str) -> str:
        code = main(["export", "--format", "compressed-tensors", str(src), str(dst), *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert not [p for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")]  # no temp left
        return err

    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "old.txt").write_text("old")
    assert "exists and is not empty; pass --overwrite" in run(ok, tmp_path / "exists")
    assert "is inside the input" in run(ok, ok / "ct")
    assert main(["export", "--format", "compressed-tensors", str(ok), str(tmp_path / "exists"), "--overwrite"]) == 0
    assert (tmp_path / "exists" / "model.safetensors").is_file() and not (tmp_path / "exists" / "old.txt").exists()
    capsys.readouterr()

    def quantize_embedding(sd):
        t = sd["model.embed_tokens.weight"]
        return {**sd, "model.embed_tokens.weight": MXFP8Tensor(*encode_mxfp8(t.contiguous()))}

    bad = _checkpoint(model, tok, tmp_path / "emb", "out_in", edit=quantize_embedding)
    assert "'model.embed_tokens.weight' is MXFP8 but not a projection weight" in run(bad, tmp_path / "o1")

    odd = tiny_model("llama", len(tok), hidden=48)  # in_features 48: not whole blocks of 32
    bad = _checkpoint(odd, tok, tmp_path / "odd", "out_in")
    assert "in_features=48 is not a multiple of 32" in run(bad, tmp_path / "o2")

    plain = tmp_path / "plainproj"
    shutil.copytree(ok, plain)
    f = plain / "model.safetensors"
    with open_mxfp8(f) as r:
        tensors = {n: r.get_raw(n) for n in r.keys()}
    tensors["model.layers.0.self_attn.k_proj.weight"] = decode_mxfp8(
        tensors["model.layers.0.self_attn.k_proj.weight"].payload,
        tensors["model.layers.0.self_attn.k_proj.weight"].scales,
    )
    f.unlink()
    write_mxfp8_safetensors(f, tensors, quantize=None, orientation="out_in")
    assert "is a projection stored BF16, not MXFP8" in run(plain, tmp_path / "o3")
    assert "without its scale entry" in run(tmp_path / "exists", tmp_path / "o4")  # an export is not a source
    model.save_pretrained(tmp_path / "hf")
    capsys.readouterr()  # save_pretrained's progress bar
    assert "not an MXFP8 file" in run(tmp_path / "hf", tmp_path / "o5")
