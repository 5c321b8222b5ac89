"""Loader memory and time: ``ida_eval.load_model`` on an MXFP8 checkpoint vs two baselines.

A random NemotronForCausalLM (default ~400 M parameters) is saved twice: as a plain transformers
BF16 checkpoint (``save_pretrained``) and in our MXFP8 format (projections in native [in, out]
orientation). Each variant then runs in a fresh subprocess that loads the model and runs one forward
pass on a fixed 64-token input (transformers maps safetensors lazily, so load time alone would flatter
it), and reports:

* ``added peak RSS``: the process's peak resident set (``VmHWM``, reset after the imports) minus
  its resident set after the imports, divided by the BF16 model's bytes (2 x parameters);
* ``time``: wall seconds from the start of loading to the end of the first forward.

Variants:
  ours             ida_eval.load_model(mxfp8_dir)               (target: <= 1.15x bytes, time <= baseline)
  from_pretrained  AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=bf16)  (the time baseline)
  users_recipe     read_mxfp8_safetensors -> dict of float32, .T.copy() projections, load_state_dict
                   into a from_config model (the original users' recipe)

The logits of ``ours`` and ``users_recipe`` must be bit-identical (both round the exact decoded value
to bf16 once); the script checks it.

``--cold`` evicts the checkpoint files from the page cache before every run (posix_fadvise), so
loading includes reading from disk -- the situation of a freshly written or copied checkpoint.

Usage:
    python benchmarks/bench_loader.py                       # ~400 M params, all variants, warm cache
    python benchmarks/bench_loader.py --cold                # the same, files read from disk each run
    python benchmarks/bench_loader.py --layers 4 --hidden 512 --vocab 8000   # quick smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS: tuple[str, ...] = ("ours", "from_pretrained", "users_recipe")
SEQ_LEN = 64  # tokens in the forward pass
MEMORY_TARGET = 1.15  # ours: added peak RSS / BF16 model bytes


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _evict(root: Path) -> None:
    """Drop every file under ``root`` from the page cache (only these files; needs no privileges)."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _build(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Create the random model and save both checkpoints (in this process)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, NemotronConfig, PreTrainedTokenizerFast

    from mxfp8_codec import is_projection_weight, write_mxfp8_safetensors

    cfg = NemotronConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 128,
        num_key_value_heads=max(1, args.hidden // 512),
        head_dim=128,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    sd = {n: (torch.randn(p.shape) * 0.02).to(torch.bfloat16) for n, p in meta.state_dict().items()}
    n_params = sum(t.numel() for t in sd.values())
    # a word-level tokenizer covering the vocabulary (content does not matter here)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, args.vocab)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>")

    bf16_dir, mx_dir = root / "bf16", root / "mxfp8"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.load_state_dict(sd, assign=True)
    model.save_pretrained(bf16_dir)
    tok.save_pretrained(bf16_dir)
    del model
    mx_dir.mkdir()
    cfg.save_pretrained(mx_dir)
    tok.save_pretrained(mx_dir)
    native = {n: (t.t().contiguous() if is_projection_weight(n) else t) for n, t in sd.items()}
    write_mxfp8_safetensors(mx_dir / "model.safetensors", native)
    return {"n_params": n_params, "bf16_bytes": 2 * n_params, "bf16_dir": str(bf16_dir), "mxfp8_dir": str(mx_dir)}


def _child(variant: str, info: dict[str, Any], out: Path) -> None:
    """One measurement, in its own process."""
    # every variant pays the same imports before the clock starts (we measure loading, not importing)
    import accelerate  # noqa: F401
    import numpy as np
    import torch
    import transformers.models.nemotron.modeling_nemotron  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    import ida_eval
    import ida_eval.loader  # ida_eval imports lazily; ml_dtypes 0.7.0 alone takes ~0.5 s here
    from mxfp8_codec import is_projection_weight, read_mxfp8_safetensors

    AutoConfig.from_pretrained(info["bf16_dir"])
    ids = torch.arange(3, 3 + SEQ_LEN).unsqueeze(0) % info["vocab"]
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS (import peaks do not count)
        f.write("5")
    base_kib = _status_kib("VmRSS")
    t0 = time.perf_counter()
    if variant == "ours":
        model, _ = ida_eval.load_model(info["mxfp8_dir"])
    elif variant == "from_pretrained":
        model = AutoModelForCausalLM.from_pretrained(info["bf16_dir"], dtype=torch.bfloat16).eval()
        AutoTokenizer.from_pretrained(info["bf16_dir"])
    elif variant == "users_recipe":
        d = Path(info["mxfp8_dir"])
        arrays = read_mxfp8_safetensors(d / "model.safetensors", dtype=np.float32)
        sd = {n: torch.from_numpy(a.T.copy() if is_projection_weight(n) else a) for n, a in arrays.items()}
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), dtype=torch.bfloat16)
        model.load_state_dict(sd)
        model.eval()
        AutoTokenizer.from_pretrained(d)
    else:
        raise ValueError(variant)
    with torch.no_grad():
        logits = model(ids).logits
    seconds = time.perf_counter() - t0
    peak_kib = _status_kib("VmHWM")
    torch.save(logits[0, -4:].clone(), out / f"{variant}.logits.pt")
    rec = {
        "variant": variant,
        "seconds": seconds,
        "added_peak_bytes": (peak_kib - base_kib) * 1024,
        "base_rss_bytes": base_kib * 1024,
    }
    (out / f"{variant}.json").write_text(json.dumps(rec))


def main(argv: list[str] | None = None) -> int:
    """Build the checkpoints, run every variant in a fresh subprocess, print the side-by-side table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeats", type=int, default=1, help="runs per variant (best time, max memory reported)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--cold",
        action="store_true",
        help="evict the checkpoint files from the page cache (posix_fadvise DONTNEED) before each run",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--info", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, json.loads(args.info), Path(args.out))
        return 0

    import torch

    with tempfile.TemporaryDirectory(prefix="bench_loader_") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        info = _build(args, root)
        info["vocab"] = args.vocab
        mx_bytes = (root / "mxfp8" / "model.safetensors").stat().st_size
        print(
            ("cold page cache; " if args.cold else "warm page cache; ")
            + f"random Nemotron: {info['n_params'] / 1e6:.1f} M params, BF16 {info['bf16_bytes'] / 2**20:.0f} MiB, "
            f"MXFP8 file {mx_bytes / 2**20:.0f} MiB (built in {time.perf_counter() - t0:.0f} s); "
            f"torch {torch.__version__}, {os.cpu_count()} CPUs"
        )
        results: dict[str, dict[str, float]] = {}
        for _ in range(args.repeats):  # interleaved, so machine noise hits every variant alike
            for variant in args.variants.split(","):
                if args.cold:
                    _evict(root)
                subprocess.run(
                    [sys.executable, __file__, "--child", variant, "--info", json.dumps(info), "--out", tmp],
                    check=True,
                )
                rec = json.loads((root / f"{variant}.json").read_text())
                best = results.setdefault(variant, {"seconds": float("inf"), "added_peak_bytes": 0, "runs": []})
                best["runs"].append(rec["seconds"])
                best["seconds"] = min(best["seconds"], rec["seconds"])
                best["added_peak_bytes"] = max(best["added_peak_bytes"], rec["added_peak_bytes"])
        base_t = results.get("from_pretrained", {}).get("seconds")
        print(
            f"{'variant':<16} {'load+forward s':>15} {'vs from_pretrained':>19} {'added peak RSS':>15} {'x BF16 bytes':>13}"
        )
        for variant, r in results.items():
            ratio_t = f"{r['seconds'] / base_t:.2f}x" if base_t else "-"
            print(
                f"{variant:<16} {r['seconds']:>15.2f} {ratio_t:>19} {r['added_peak_bytes'] / 2**20:>11.0f} MiB "
                f"{r['added_peak_bytes'] / info['bf16_bytes']:>12.2f}x   runs: "
                + " ".join(f"{t:.2f}" for t in r["runs"])
            )
        ok = True
        if "ours" in results:
            mem = results["ours"]["added_peak_bytes"] / info["bf16_bytes"]
            print(f"ours: memory {mem:.2f}x (target <= {MEMORY_TARGET}x): {'OK' if mem <= MEMORY_TARGET else 'MISSED'}")
            ok &= mem <= MEMORY_TARGET
            if base_t:
                rt = results["ours"]["seconds"] / base_t
                print(f"ours: time {rt:.2f}x from_pretrained (target <= 1.00x): {'OK' if rt <= 1.0 else 'MISSED'}")
                ok &= rt <= 1.0
        if "ours" in results and "users_recipe" in results:
            a = torch.load(root / "ours.logits.pt")
            b = torch.load(root / "users_recipe.logits.pt")
            same = torch.equal(a, b)
            print(f"ours vs users_recipe logits bit-identical: {same}")
            ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
