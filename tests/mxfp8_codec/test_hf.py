"""mxfp8_codec.hf: from_pretrained loads our MXFP8 checkpoints (weights stay MXFP8), bit-identical to
ida_eval.load_model; save_pretrained writes the same bytes back; bad checkpoints fail in one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import threading
import warnings
from copy import deepcopy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mxfp8_codec.hf as mxhf
from ida_common.checksums import write_sums
from ida_eval import load_model
from mxfp8_codec import (
    decode_mxfp8,
    encode_mxfp8,
    hf_modules,
    is_projection_weight,
    open_mxfp8,
    write_mxfp8_safetensors,
)
from mxfp8_codec.header import read_header, sniff_mxfp8
from tests.conftest import flip_bit
from tests.ida_eval.support import (
    ARCHS,
    logits_of,
    native_state_dict,
    save_mxfp8_checkpoint,
    tiny_model,
)


def _from_pretrained(d, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(d, **kw)


def _save(model, tok, d: Path, *, orientation: str = "in_out", folded: bool = False, with_config: bool = True) -> Path:
    """An MXFP8 checkpoint in either orientation, with (or without) config.json's quantization_config."""
    if orientation == "in_out":
        save_mxfp8_checkpoint(model, tok, d, folded=folded)
    else:
        d.mkdir(parents=True)
        model.config.save_pretrained(d)
        tok.save_pretrained(d)
        sd = {
            n: (t.t().contiguous() if is_projection_weight(n) else t)
            for n, t in native_state_dict(model, folded=folded).items()
        }
        write_mxfp8_safetensors(
            d / "model.safetensors", sd, orientation="out_in", norm_convention="folded" if folded else "zero_centered"
        )
    if with_config:
        cfg = json.loads((d / "config.json").read_text())
        cfg["quantization_config"] = mxhf.quantization_config_dict(
            orientation=orientation, norm_convention="folded" if folded else "zero_centered"
        )
        (d / "config.json").write_text(json.dumps(cfg))
    return d


def _projection_weights(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, mxhf.MXFP8Linear):
            out[name] = m.decode_weight()
        elif isinstance(m, torch.nn.Linear) and is_projection_weight(name + ".weight"):
            out[name] = m.weight.detach()
    return out


CASES = [
    (a, o, f) for a in ARCHS for o in ("in_out", "out_in") for f in (False, True) if not f or a in ("nemotron", "llama")
]


@pytest.mark.parametrize("arch,orientation,folded", CASES)
def test_from_pretrained_equals_load_model(arch, orientation, folded, tok, ids, tmp_path):
    """Both orientations and norm conventions: every decoded projection weight and every other
    parameter equals load_model's bit for bit, logits too, greedy tokens too; MXFP8-resident by
    default, plain nn.Linear with dequantize=True."""
    model = tiny_model(arch, len(tok), hidden=64)
    d = _save(model, tok, tmp_path / "c", orientation=orientation, folded=folded)
    ref, _ = load_model(d)
    got = _from_pretrained(d)
    assert isinstance(got.model.layers[0].self_attn.q_proj, mxhf.MXFP8Linear)
    # rows read from the file unless a tied lm_head reads the whole table anyway (qwen3 here)
    assert isinstance(got.get_input_embeddings(), mxhf.FileRowsEmbedding) == (not model.config.tie_word_embeddings)
    q = got.model.layers[0].self_attn.q_proj
    assert q.payload.dtype == torch.uint8 and q.payload.shape == q.stored_shape
    ref_w = _projection_weights(ref)
    got_w = _projection_weights(got)
    assert ref_w.keys() == got_w.keys() and len(ref_w) > 0
    for name in ref_w:
        assert torch.equal(got_w[name], ref_w[name]), name
    got_params = dict(got.named_parameters())
    for name, p in ref.named_parameters():
        if name.rpartition(".")[0] not in ref_w or name.endswith("bias"):
            assert torch.equal(got_params[name], p), name
    assert torch.equal(logits_of(got, ids), logits_of(ref, ids))
    gen = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
    assert torch.equal(got.generate(ids, **gen), ref.generate(ids, **gen))
    deq = _from_pretrained(d, quantization_config=mxhf.MXFP8Config(dequantize=True))
    assert type(deq.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert type(deq.get_input_embeddings()) is torch.nn.Embedding
    assert torch.equal(logits_of(deq, ids), logits_of(ref, ids))
    if arch == "llama" and orientation == "in_out" and not folded:  # a dequantized model saves as plain bf16
        deq.save_pretrained(tmp_path / "plain")
        assert "quantization_config" not in json.loads((tmp_path / "plain" / "config.json").read_text())
        assert torch.equal(logits_of(_from_pretrained(tmp_path / "plain"), ids), logits_of(ref, ids))


def test_plain_config_needs_mxfp8config(tok, ids, tmp_path):
    """The seeds' checkpoints (no quantization_config) load with quantization_config=MXFP8Config();
    the saved-back config names the method, so the copy loads directly."""
    model = tiny_model("llama", len(tok))
    d = _save(model, tok, tmp_path / "seed", with_config=False)
    got = _from_pretrained(d, quantization_config=mxhf.MXFP8Config())
    ref, _ = load_model(d)
    assert torch.equal(logits_of(got, ids), logits_of(ref, ids))
    assert got.config.quantization_config.to_dict()["quant_method"] == "mxfp8_codec"


def _set_quantization_config(d: Path, value) -> None:
    cfg = json.loads((d / "config.json").read_text())
    if value is _ABSENT:
        cfg.pop("quantization_config", None)
    else:
        cfg["quantization_config"] = value
    (d / "config.json").write_text(json.dumps(cfg))


_ABSENT = object()


@pytest.mark.parametrize("config_says", ["absent", "null"])
@pytest.mark.parametrize("shards", [1, 2])
def test_no_quantization_config_still_loads_through_the_quantizer(config_says, shards, tok, ids, tmp_path):
    """Issue 23 item 1: with mxfp8_codec.hf imported, from_pretrained(d) of an MXFP8 checkpoint whose
    config.json has no quantization_config (or null) ran the raw E4M3 codes in plain nn.Linear (square
    projections: no size mismatch to stop it). Now the file's header says what it is: the model loads
    as with MXFP8Config() -- logits bit-identical to the load of the same files with config.json naming
    the method -- with one warning naming the file; the Auto class and the model class alike."""
    from transformers import LlamaForCausalLM

    model = tiny_model("llama", len(tok))  # q_proj and o_proj are square: 64 x 64
    named = save_mxfp8_checkpoint(model, tok, tmp_path / "named", shards=shards)
    bare = tmp_path / "bare"
    shutil.copytree(named, bare)
    _set_quantization_config(
        named, mxhf.quantization_config_dict(orientation="in_out", norm_convention="zero_centered")
    )
    _set_quantization_config(bare, _ABSENT if config_says == "absent" else None)
    want = logits_of(_from_pretrained(named), ids)
    first = "model.safetensors" if shards == 1 else "model-00001-of-00002.safetensors"
    for load in (_from_pretrained, LlamaForCausalLM.from_pretrained):
        with pytest.warns(
            UserWarning, match=rf"{first}: an MXFP8 checkpoint whose config.json has no quantization_config"
        ):
            got = load(bare)
        assert isinstance(got.model.layers[0].self_attn.q_proj, mxhf.MXFP8Linear)
        assert torch.equal(logits_of(got, ids), want)
        assert got.config.quantization_config.quant_method == mxhf.QUANT_METHOD  # save_pretrained names it
    deq = _from_pretrained(bare, quantization_config=mxhf.MXFP8Config(dequantize=True))  # an explicit choice holds
    assert type(deq.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert torch.equal(logits_of(deq, ids), want)


@pytest.mark.filterwarnings("ignore:.*has no quantization_config:UserWarning")  # tested above
@pytest.mark.parametrize("named", [True, False], ids=["config-names-the-method", "no-quantization-config"])
def test_a_byte_damaged_since_the_sums_were_written_is_named_not_loaded(named, tok, ids, tmp_path):
    """A flipped payload bit is another valid E4M3 code: nothing in a safetensors file detects it, and
    from_pretrained loaded it as other numbers. Where the directory has a SHA256SUMS (every model
    directory ida writes) the quantizer checks the weights and side files against it before reading
    anything: MXFP8LoadError naming the file, resident or dequantized. MXFP8Config(check_sums=False)
    skips the check (what it catches: other logits), is never written to a config, and a directory
    without a list loads as before."""
    d = save_mxfp8_checkpoint(tiny_model("llama", len(tok)), tok, tmp_path / "c")
    if named:
        _set_quantization_config(
            d, mxhf.quantization_config_dict(orientation="in_out", norm_convention="zero_centered")
        )
    write_sums(d)
    want = logits_of(_from_pretrained(d), ids)
    weights = d / "model.safetensors"
    h = read_header(weights)
    flip_bit(weights, h.data_start + h.entries["model.layers.0.self_attn.q_proj.weight"].begin)
    for kw in ({}, {"quantization_config": mxhf.MXFP8Config(dequantize=True)}):
        with pytest.raises(mxhf.MXFP8LoadError) as info:
            _from_pretrained(d, **kw)
        assert str(info.value) == (
            f"{weights}: its bytes differ from the sha256 recorded in SHA256SUMS when it was written: a damaged "
            f"copy? copy the checkpoint again; changed on purpose? delete {d / 'SHA256SUMS'}"
        )
    unchecked = _from_pretrained(d, quantization_config=mxhf.MXFP8Config(check_sums=False))
    assert not torch.equal(logits_of(unchecked, ids), want)
    assert "check_sums" not in unchecked.config.quantization_config.to_dict()
    flip_bit(weights, h.data_start + h.entries["model.layers.0.self_attn.q_proj.weight"].begin)
    flip_bit(d / "tokenizer.json")  # a side file the model is built with is checked too
    with pytest.raises(mxhf.MXFP8LoadError, match=rf"^{d / 'tokenizer.json'}: its bytes differ"):
        _from_pretrained(d)
    (d / "SHA256SUMS").unlink()
    assert torch.equal(logits_of(_from_pretrained(d), ids), want)


def test_the_from_pretrained_hooks_are_installed_once():
    """The two wraps of transformers.modeling_utils are in place on the installed transformers (a 5.x
    whose shape the import checks) and installing them again changes nothing (no double wrap)."""
    from transformers import modeling_utils as mu

    hooks = (mu._get_dtype, mu.PreTrainedModel.__dict__["from_pretrained"].__func__)
    assert all(getattr(h, "__mxfp8_codec_hook__", False) for h in hooks)
    mxhf._install_from_pretrained_hooks()
    assert (mu._get_dtype, mu.PreTrainedModel.__dict__["from_pretrained"].__func__) == hooks
    assert not getattr(hooks[0].__wrapped__, "__mxfp8_codec_hook__", False)


def test_mxfp8_files_under_another_quant_method_are_refused(tok, tmp_path):
    """Issue 23 item 1: our files under a quantization_config of another method (one transformers knows,
    here compressed-tensors, or one it does not know and would skip) fail with MXFP8LoadError naming the
    file and the method, before any model is built."""
    from mxfp8_codec.export import compressed_tensors_config

    d = _save(tiny_model("llama", len(tok)), tok, tmp_path / "c", with_config=False)
    for qc, method in (
        (compressed_tensors_config(), "compressed-tensors"),
        ({"quant_method": "mxfp8-codec"}, "mxfp8-codec"),
    ):
        _set_quantization_config(d, qc)
        with pytest.raises(
            mxhf.MXFP8LoadError,
            match=rf"model.safetensors: an MXFP8 checkpoint \(MXFP8_E4M3_UE8M0_K32\) "
            rf"but the quantization_config says quant_method='{method}'",
        ):
            _from_pretrained(d)


def test_plain_checkpoints_load_as_before_and_the_check_reads_headers_only(tok, ids, tmp_path):
    """A plain bf16 checkpoint loads as it always did with mxfp8_codec.hf imported (no quantizer, the
    saved parameters), and the check reads only the 8 + N header bytes of each file (/proc/self/io, a
    64 MiB embedding); an F8_E4M3 + .scale pair without our metadata is recognised from the header too."""
    model = tiny_model("llama", 65536, hidden=256).to(torch.bfloat16)  # a 32 MiB embedding and lm_head each
    d = tmp_path / "plain"
    model.save_pretrained(d)
    got = _from_pretrained(d)
    assert getattr(got, "hf_quantizer", None) is None and type(got.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    params = dict(got.named_parameters())
    assert params.keys() == dict(model.named_parameters()).keys()
    assert all(torch.equal(params[n], p) for n, p in model.named_parameters())
    f = d / "model.safetensors"
    with open(f, "rb") as fh:
        header_bytes = 8 + struct.unpack("<Q", fh.read(8))[0]
    assert f.stat().st_size > 64 << 20
    io = Path("/proc/self/io")
    if io.exists():

        def rchar() -> int:
            return int(next(line.split()[1] for line in io.read_text().splitlines() if line.startswith("rchar")))

        before = rchar()
        assert sniff_mxfp8(f) is False
        assert rchar() - before - 2 * len(io.read_text()) <= header_bytes  # the reads of /proc/self/io itself
    from safetensors.torch import save_file

    bare = tmp_path / "pair.safetensors"
    save_file(
        {
            "a.weight": torch.zeros(2, 32, dtype=torch.float8_e4m3fn),
            "a.weight.scale": torch.zeros(2, 1, dtype=torch.uint8),
        },
        bare,
    )
    assert sniff_mxfp8(bare) and not sniff_mxfp8(tmp_path / "missing.safetensors")


@pytest.mark.parametrize(
    "kw",
    [
        dict(dtype=torch.float32),
        dict(device_map="cpu"),
        dict(device_map="auto"),
        dict(low_cpu_mem_usage=True, dtype=torch.bfloat16),
    ],
)
def test_loading_options(kw, tok, ids, tmp_path):
    model = tiny_model("nemotron", len(tok))
    d = _save(model, tok, tmp_path / "c")
    ref, _ = load_model(d, dtype=kw.get("dtype", torch.bfloat16))
    got = _from_pretrained(d, **kw)
    assert got.model.embed_tokens.weight.dtype == kw.get("dtype", torch.bfloat16)
    assert torch.equal(logits_of(got, ids), logits_of(ref, ids))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_every_dtype_mxfp8linear_decodes_loads(dtype, tok, ids, tmp_path):
    """Issue 23 item 5: ``dtype=torch.float16`` (and float64) failed in the load-time warm-up decode
    ("tensor 'warm-up': out must be ... float32 or bfloat16") although MXFP8Linear decodes them
    (through float32, rounded once). Now they load; weights and logits equal load_model's in that dtype
    (out_in: F.linear gets the same contiguous [out, in] weight both ways)."""
    model = tiny_model("llama", len(tok))
    d = _save(model, tok, tmp_path / "c", orientation="out_in")
    got = _from_pretrained(d, dtype=dtype)
    q = got.model.layers[0].self_attn.q_proj
    assert isinstance(q, mxhf.MXFP8Linear) and q.dtype == dtype and q.weight.dtype == dtype
    ref, _ = load_model(d, dtype=dtype)
    ref_w, got_w = _projection_weights(ref), _projection_weights(got)
    assert ref_w.keys() == got_w.keys() and all(torch.equal(got_w[n], ref_w[n]) for n in ref_w)
    assert torch.equal(logits_of(got, ids), logits_of(ref, ids))


def _tensor_sha256(path: Path) -> dict[str, str]:
    with open_mxfp8(path) as r:
        out = {}
        for n in r.keys():
            out[n] = hashlib.sha256(bytes(r.tensor_bytes(n))).hexdigest()
            if r.is_quantized(n):
                out[n + ".scale"] = hashlib.sha256(bytes(r.tensor_bytes(n + ".scale"))).hexdigest()
        return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("orientation", ["in_out", "out_in"])
def test_a_resident_projection_gives_the_bits_of_its_dequantized_linear(orientation, dtype):
    """MXFP8Linear's forward == F.linear on the [out, in] weight dequantize=True holds, bit for bit, at the
    sizes where a CPU GEMM's order of summation depends on the weight's layout (on an AMD EPYC without
    AVX-512 a transposed BF16 operand differed from 64 tokens and K = 128 up, a float32 one for a single
    token): the layout F.linear gets is chosen so that it cannot (hf_modules.gemm_takes_transposed)."""
    g = torch.Generator().manual_seed(3)
    n_in, n_out = 512, 384
    w = torch.randn(n_out, n_in, generator=g) * 0.05
    p, s = encode_mxfp8(w.t().contiguous() if orientation == "in_out" else w)
    lin = hf_modules.MXFP8Linear(n_in, n_out, bias=None, orientation=orientation, dtype=dtype)
    lin.payload, lin.scales = p, s
    dense = lin.decode_weight()
    assert dense.is_contiguous() and dense.shape == (n_out, n_in)
    with torch.no_grad():
        for tokens in (1, 7, 64):
            x = torch.randn(tokens, n_in, generator=g).to(dtype)
            assert torch.equal(lin(x), F.linear(x, dense)), tokens
    x = torch.randn(5, n_in, generator=g).to(dtype).requires_grad_()  # autograd: a fresh weight, same bits
    assert torch.equal(lin(x), F.linear(x, dense))


def test_the_first_projection_checks_that_onednn_sums_both_layouts_alike(monkeypatch):
    """The transposed view's premise is checked on the CPU at hand when the first projection is built: here it
    holds (nothing changes, no warning); a GEMM that sums a transposed BF16 weight in another order (simulated:
    torch's F.linear off by one ulp for such a weight) turns the view off, with one warning, once."""
    monkeypatch.setattr(hf_modules, "_ONEDNN_BF16_CHECKED", False)
    monkeypatch.setattr(hf_modules, "_ONEDNN_BF16", hf_modules._onednn_bf16())
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)  # turned off for now: oneDNN is checked anyway
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.device("meta"):  # as transformers builds models: the check still computes on the CPU
            hf_modules.MXFP8Linear(64, 32, bias=None, orientation="in_out", dtype=torch.bfloat16)
    assert hf_modules._ONEDNN_BF16 == hf_modules._onednn_bf16()
    assert hf_modules._ONEDNN_BF16_CHECKED == hf_modules._onednn_bf16()  # a check ran only where oneDNN runs BF16
    assert torch.backends.mkldnn.enabled is False  # the user's setting, restored

    linear = F.linear

    def other_order(x, w, bias=None):
        y = linear(x, w, bias)
        return y if w.is_contiguous() else torch.nextafter(y, torch.full_like(y, float("inf")))

    monkeypatch.setattr(F, "linear", other_order)
    monkeypatch.setattr(hf_modules, "_ONEDNN_BF16_CHECKED", False)
    monkeypatch.setattr(hf_modules, "_ONEDNN_BF16", True)
    with pytest.warns(RuntimeWarning, match=r"sums a transposed weight in another order on this CPU \(1 x 512"):
        hf_modules.MXFP8Linear(64, 32, bias=None, orientation="in_out", dtype=torch.bfloat16)
    assert not hf_modules.gemm_takes_transposed(torch.device("cpu"), torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf_modules.MXFP8Linear(64, 32, bias=None, orientation="in_out", dtype=torch.bfloat16)  # once a process


@pytest.mark.parametrize(
    "arch,orientation,folded", [("nemotron", "in_out", True), ("qwen3", "out_in", False), ("llama", "in_out", False)]
)
def test_save_pretrained_writes_identical_bytes(arch, orientation, folded, tok, ids, tmp_path):
    model = tiny_model(arch, len(tok), tie=arch == "qwen3")
    d = _save(model, tok, tmp_path / "src", orientation=orientation, folded=folded)
    got = _from_pretrained(d)
    got.save_pretrained(tmp_path / "out")
    src, out = d / "model.safetensors", tmp_path / "out" / "model.safetensors"
    assert _tensor_sha256(out) == _tensor_sha256(src)
    with open_mxfp8(src) as a, open_mxfp8(out) as b:
        assert dict(b.metadata) == dict(a.metadata)  # no "format" key added (docs/format.md §15)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["quantization_config"]["orientation"] == orientation
    again = _from_pretrained(tmp_path / "out")
    assert torch.equal(logits_of(again, ids), logits_of(got, ids))


def test_save_pretrained_of_a_float32_load_keeps_the_stored_dtype(tok, ids, tmp_path):
    """Issue 23 item 11: a model loaded with dtype=torch.float32 wrote its norms and embeddings back as
    float32, so "every tensor's bytes identical" held only for a bf16 load. Now each plain tensor is
    written in its stored dtype where that loses nothing (same sha256 for every tensor), and a value
    changed after loading that bf16 cannot hold stays float32 rather than being rounded silently."""
    model = tiny_model("nemotron", len(tok))
    d = _save(model, tok, tmp_path / "src", folded=True)
    got = _from_pretrained(d, dtype=torch.float32)
    assert got.model.norm.weight.dtype == torch.float32
    got.save_pretrained(tmp_path / "out")
    assert _tensor_sha256(tmp_path / "out" / "model.safetensors") == _tensor_sha256(d / "model.safetensors")
    with torch.no_grad():
        got.model.layers[0].input_layernorm.weight[0] += 2.0**-20  # not a bfloat16 value any more
    got.save_pretrained(tmp_path / "changed")
    with open_mxfp8(tmp_path / "changed" / "model.safetensors") as r:
        assert r.dtype("model.layers.0.input_layernorm.weight") == "F32"
        assert r.dtype("model.layers.1.input_layernorm.weight") == "BF16"
    again = _from_pretrained(tmp_path / "changed", dtype=torch.float32)
    assert torch.equal(again.model.layers[0].input_layernorm.weight, got.model.layers[0].input_layernorm.weight)


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of ``path`` (/proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == str(path.resolve()):
                a, b = (int(x, 16) for x in fields[0].split("-"))
                out.append((a, b))
    return out


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps (Linux)")
def test_resident_weights_map_the_file_copy_on_write(tok, ids, tmp_path):
    """MXFP8-resident payloads and scales are views of a private mapping of the checkpoint (no copy
    at load); writing to them never reaches the file; saving into the source directory itself
    writes the same bytes and leaves the loaded model intact."""
    model = tiny_model("llama", len(tok))
    d = _save(model, tok, tmp_path / "c")
    f = d / "model.safetensors"
    want = _tensor_sha256(f)
    file_bytes = f.read_bytes()
    got = _from_pretrained(d)
    logits = logits_of(got, ids)
    ranges = _mapped_ranges(f)
    for _, m in mxhf.mxfp8_modules(got):
        for t in (m.payload, m.scales):
            assert any(a <= t.data_ptr() < b for a, b in ranges), m.name
    q = got.model.layers[0].self_attn.q_proj
    code = int(q.payload[0, 0])
    q.payload[0, 0] = code ^ 1  # copy-on-write: this process only
    assert f.read_bytes() == file_bytes
    q.payload[0, 0] = code
    got.save_pretrained(d)
    assert _tensor_sha256(f) == want
    assert torch.equal(logits_of(got, ids), logits)


def _present_pages(t: torch.Tensor) -> int:
    """How many of the pages under ``t``'s bytes are mapped into this process (/proc/self/pagemap)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = t.data_ptr() // page, (t.data_ptr() + t.numel() * t.element_size() - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = f.read((last - first + 1) * 8)
    return sum(e >> 63 for (e,) in struct.iter_unpack("<Q", entries))


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="needs /proc/self/pagemap (Linux)")
def test_embedding_lookups_read_rows_from_the_file_not_the_mapping(tok, tmp_path):
    """An untied input embedding reads the looked-up rows with pread: its mapped weight gains no
    resident page, the output equals F.embedding's bit for bit; a weight changed in place, a
    copied module and autograd all use the weight itself."""
    model = tiny_model("nemotron", 16384, hidden=256)  # an 8 MiB table: rows 8000.. lie far from its ends
    d = _save(model, tok, tmp_path / "c")
    got = _from_pretrained(d)
    emb = got.get_input_embeddings()
    assert type(emb) is mxhf.FileRowsEmbedding
    far = torch.arange(8000, 8064).view(2, 32)
    w = emb.weight
    span = w[8000:8064]
    assert _present_pages(span) == 0  # transformers' load touches no page of the table
    with torch.no_grad():
        out = emb(far)
    assert _present_pages(span) == 0
    ref = F.embedding(far, w.detach())  # the mapping: these rows' pages become resident
    assert _present_pages(span) > 0
    assert out.dtype == w.dtype and torch.equal(out, ref)
    with torch.no_grad():
        w[8001] += 1.0  # in place: the file no longer holds the weight
        assert torch.equal(emb(far), F.embedding(far, w))
        copy = deepcopy(emb)
        assert copy._rows.fd is None and torch.equal(copy(far), F.embedding(far, w))
    assert emb(far).grad_fn is not None  # autograd: nn.Embedding's own lookup
    with pytest.raises(IndexError):
        emb(torch.tensor([16384]))
    fresh = _from_pretrained(d).get_input_embeddings()
    with torch.inference_mode():  # a change made in inference mode is seen too
        assert torch.equal(fresh(far), ref)
        fresh.weight[8002] -= 1.0
        assert not torch.equal(fresh(far), ref) and torch.equal(fresh(far), F.embedding(far, fresh.weight))


def _edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"].update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def test_bad_checkpoints_fail_with_one_message(tok, tmp_path):
    model = tiny_model("nemotron", len(tok))
    d = _save(model, tok, tmp_path / "ok")
    # config says out_in, file says in_out
    bad = tmp_path / "orient"
    shutil.copytree(d, bad)
    _edit_config(bad, orientation="out_in")
    with pytest.raises(
        mxhf.MXFP8LoadError,
        match=r"model.safetensors: tensor 'model.layers.0.*_proj.weight': file "
        r"metadata says orientation='in_out' but config.json quantization_config says orientation='out_in'",
    ):
        _from_pretrained(bad)
    # a scale missing: the codec names the file and the tensor
    from safetensors.torch import load_file, save_file

    noscale = tmp_path / "noscale"
    shutil.copytree(d, noscale)
    f = noscale / "model.safetensors"
    with open_mxfp8(f) as r:
        meta = dict(r.metadata)
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.up_proj.weight.scale"]
    save_file(tensors, f, metadata=meta)
    with pytest.raises(mxhf.MXFP8LoadError, match=r"model.safetensors.*model.layers.1.mlp.up_proj.weight"):
        _from_pretrained(noscale)
    # a shape not matching the architecture
    wrong = tmp_path / "shape"
    shutil.copytree(d, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (wrong / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        mxhf.MXFP8LoadError,
        match=r"model.safetensors: tensor 'model.layers.0.mlp.(up|down)_proj.weight' "
        r"has shape \[\d+, \d+\] but NemotronForCausalLM needs \[\d+, \d+\] \(orientation=in_out\)",
    ):
        _from_pretrained(wrong)
    # a plain checkpoint with MXFP8Config
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    with pytest.raises(mxhf.MXFP8LoadError, match="not an MXFP8 checkpoint"):
        _from_pretrained(plain, quantization_config=mxhf.MXFP8Config())


UP = "model.layers.1.mlp.up_proj.weight"


def _edit_scale(d: Path, edit) -> None:
    """Rewrite ``d/model.safetensors`` with ``UP``'s scale replaced by ``edit(scale)`` (None: removed)."""
    from safetensors.torch import load_file, save_file

    f = d / "model.safetensors"
    with open_mxfp8(f) as r:
        meta = dict(r.metadata)
    tensors = load_file(f)
    scale = edit(tensors.pop(UP + ".scale"))
    if scale is not None:
        tensors[UP + ".scale"] = scale
    save_file(tensors, f, metadata=meta)


def _nan_at_3_1(scale: torch.Tensor) -> torch.Tensor:
    scale[3, 1] = 0xFF
    return scale


BROKEN = {  # issue 23 item 7: how each checkpoint is broken, and what the one line must say
    "missing scale": (
        lambda d: _edit_scale(d, lambda s: None),
        rf"model.safetensors: tensor '{UP}': F8_E4M3 payload without its scale entry",
    ),
    "scale shape": (
        lambda d: _edit_scale(d, lambda s: s[:, :1].contiguous()),
        rf"model.safetensors: tensor '{UP}.scale': scale shape \[\d+, 1\] does not match",
    ),
    "scale dtype": (
        lambda d: _edit_scale(d, lambda s: s.to(torch.int16)),
        rf"model.safetensors: tensor '{UP}.scale': scale dtype must be one of \['U8', 'F8_E8M0'\], got I16",
    ),
    "truncated file": (
        lambda d: os.truncate(d / "model.safetensors", (d / "model.safetensors").stat().st_size - 100),
        r"model.safetensors: tensor '.*': data_offsets end \d+ beyond the data section",
    ),
    "missing shard": (
        lambda d: os.unlink(d / "model-00002-of-00002.safetensors"),
        r"model-00002-of-00002.safetensors: cannot read file: No such file or directory",
    ),
    "NaN scale byte": (
        lambda d: _edit_scale(d, _nan_at_3_1),
        rf"model.safetensors: tensor '{UP}.scale': NaN scale byte 0xFF at index \(3, 1\)",
    ),
}


@pytest.mark.filterwarnings("ignore:.*has no quantization_config:UserWarning")  # tested above
@pytest.mark.parametrize("named", [True, False], ids=["config-names-the-method", "no-quantization-config"])
@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_checkpoints_raise_the_documented_mxfp8loaderror(case, named, tok, tmp_path):
    """Issue 23 items 7 and 11: inside from_pretrained a missing or malformed scale, a truncated file
    and a missing shard raised the codec's MXFP8Error (or safetensors' own error, naming no file)
    where docs/format.md promises MXFP8LoadError; a NaN scale byte (0xFF, its whole block NaN) loaded
    silently. Each is now MXFP8LoadError, one line naming the file and the tensor, whether config.json
    names the method or has no quantization_config, resident or dequantized."""
    break_it, message = BROKEN[case]
    d = save_mxfp8_checkpoint(
        tiny_model("llama", len(tok)), tok, tmp_path / "c", shards=2 if case == "missing shard" else 1
    )
    if named:
        _set_quantization_config(
            d, mxhf.quantization_config_dict(orientation="in_out", norm_convention="zero_centered")
        )
    break_it(d)
    for kw in ({}, {"quantization_config": mxhf.MXFP8Config(dequantize=True)}):
        with pytest.raises(mxhf.MXFP8LoadError, match=message) as info:
            _from_pretrained(d, **kw)
        assert "\n" not in str(info.value)


def test_decode_into_torch_ops_equals_codec():
    """The torch-op decode (used on GPUs) equals the codec for every (code, scale byte) pair, both layouts."""
    q = torch.arange(256, dtype=torch.uint8).repeat(256, 1)  # [256 scales, 256 codes]
    q = q.reshape(256 * 8, 32)  # each row one block
    s = torch.arange(256, dtype=torch.uint8).repeat_interleave(8).reshape(-1, 1)
    for dtype in (torch.bfloat16, torch.float32):
        want = decode_mxfp8(q, s, dtype=dtype)
        got = mxhf.decode_into(q, s, torch.empty(q.shape, dtype=dtype), transpose=False)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(torch.nan_to_num(got, nan=0.0), torch.nan_to_num(want, nan=0.0))
        p = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (64, 96), dtype=np.uint8))
        sc = torch.from_numpy(np.random.default_rng(1).integers(100, 140, (64, 3), dtype=np.uint8))
        want_t = decode_mxfp8(p, sc, dtype=dtype, transpose=True)
        got_t = mxhf.decode_into(p, sc, torch.empty((96, 64), dtype=dtype), transpose=True)
        assert torch.equal(got_t.nan_to_num(0.0), want_t.nan_to_num(0.0))


def test_forward_uses_shared_scratch_but_not_under_autograd(tok, tmp_path):
    model = tiny_model("llama", len(tok))
    got = _from_pretrained(_save(model, tok, tmp_path / "c"))
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        got(ids)
    before = dict(hf_modules.SCRATCH._buffers)
    with torch.no_grad():
        got(ids)
    assert all(hf_modules.SCRATCH._buffers[k] is v for k, v in before.items())  # reused, not reallocated
    x = torch.randn(2, 64, requires_grad=True)
    q = got.model.layers[0].self_attn.q_proj
    y = q(x.to(torch.bfloat16))
    w = q.decode_weight()
    got.model.layers[1].self_attn.q_proj(x.detach().to(torch.bfloat16))  # overwrites the scratch
    y.float().sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    torch.nn.functional.linear(x2.to(torch.bfloat16), w.clone()).float().sum().backward()
    assert torch.equal(x.grad, x2.grad)


def test_forwards_in_several_threads_use_their_own_scratch(tok, ids, tmp_path):
    """The decode scratch is per thread: concurrent forwards of one model give the sequential logits."""
    from concurrent.futures import ThreadPoolExecutor

    got = _from_pretrained(_save(tiny_model("llama", len(tok), hidden=96), tok, tmp_path / "c"))
    want = logits_of(got, ids)
    barrier, ptrs = threading.Barrier(2), []

    def grab() -> None:
        buf = hf_modules.SCRATCH.get((8, 8), torch.float32, torch.device("cpu"))
        barrier.wait()  # both threads hold their buffer now
        ptrs.append(buf.data_ptr())

    threads = [threading.Thread(target=grab) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ptrs) == 2 and ptrs[0] != ptrs[1]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: [logits_of(got, ids) for _ in range(5)], range(4)))
    for run in results:
        for logits in run:
            assert torch.equal(logits, want)


@pytest.mark.slow
def test_without_the_quantizer_transformers_only_warns(tok, tmp_path):
    """What docs/format.md section 15 says about a transformers without mxfp8_codec.hf, checked on the
    installed one: 5.x names our method in an "Unknown quantization type" warning and loads the raw
    E4M3 codes (no safeguard holds there); < 5 refuses the file (no safetensors "format" metadata)."""
    import subprocess
    import sys

    model = tiny_model("llama", len(tok))
    d = _save(model, tok, tmp_path / "c", orientation="out_in")
    code = (
        "import sys, transformers\n"
        "from transformers import AutoModelForCausalLM\n"
        "assert 'mxfp8_codec.hf' not in sys.modules\n"
        "try:\n"
        f"    AutoModelForCausalLM.from_pretrained({str(d)!r})\n"
        "    print('LOADED', transformers.__version__)\n"
        "except Exception as e:\n"
        "    print('REFUSED', transformers.__version__, str(e).splitlines()[0])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        assert "LOADED" in proc.stdout, proc.stdout + proc.stderr[-2000:]
        assert "Unknown quantization type, got mxfp8_codec" in proc.stdout + proc.stderr
    else:
        assert "REFUSED" in proc.stdout and "metadata" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("dequantize", "no"),
        ("dequantize", 1),
        ("orientation", ["in_out"]),
        ("norm_convention", 3),
        ("scale_rule", {"rule": "rceil"}),
        ("weights_dtype", 5),
    ],
)
def test_wrongly_typed_config_fields_are_one_value_error_naming_the_key(key, value):
    """Issue 23 item 6: ``"dequantize": "no"`` was taken as True; every field's type is checked up front."""
    with pytest.raises(ValueError, match=rf"MXFP8Config: {key} must be"):
        mxhf.MXFP8Config.from_dict({"quant_method": mxhf.QUANT_METHOD, key: value})
    assert mxhf.MXFP8Config.from_dict({"quant_method": mxhf.QUANT_METHOD, "dequantize": True}).dequantize is True


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("onednn", [False, True], ids=["decoded-out-in", "transposed-view"])
def test_a_compiled_forward_of_resident_weights_is_one_graph_with_the_same_logits(
    arch, onednn, tok, ids, tmp_path, monkeypatch
):
    """torch.compile(fullgraph=True) traces MXFP8Linear through the opaque decode operator and
    FileRowsEmbedding through nn.Embedding: no graph break, logits bit-identical to eager (the
    ``aot_eager`` backend: the graph torch.compile builds, run without code generation). Both layouts
    F.linear may get (hf_modules.gemm_takes_transposed: the CPU's answer set either way)."""
    monkeypatch.setattr(hf_modules, "_ONEDNN_BF16", onednn)
    monkeypatch.setattr(hf_modules, "_ONEDNN_BF16_CHECKED", True)  # as set, also where oneDNN would disagree
    d = save_mxfp8_checkpoint(tiny_model(arch, len(tok), seed=3), tok, tmp_path / "c")
    model = _from_pretrained(d)
    assert any(isinstance(m, hf_modules.MXFP8Linear) for m in model.modules())
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(ids).logits, model(ids).logits)


def test_static_cache_generation_compiles_resident_weights(tok, ids, tmp_path):
    """What transformers does on a GPU with a static cache (generate compiles the decoding step),
    forced on the CPU: the quantizer says the model may be compiled, and greedy tokens are unchanged."""
    from transformers import CompileConfig, GenerationConfig

    d = save_mxfp8_checkpoint(tiny_model("llama", len(tok), seed=3), tok, tmp_path / "c")
    model = _from_pretrained(d, dtype=torch.float32)
    assert model.hf_quantizer.is_compileable
    kw = dict(do_sample=False, max_new_tokens=8, pad_token_id=tok.eos_token_id)
    compile_config = CompileConfig(backend="aot_eager", fullgraph=True)
    compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told (private flag)
    plain = GenerationConfig(**kw)
    static = GenerationConfig(**kw, cache_implementation="static", compile_config=compile_config)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        assert torch.equal(model.generate(ids, generation_config=static), model.generate(ids, generation_config=plain))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the decoding step was compiled
