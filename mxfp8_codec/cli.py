"""``python -m mxfp8_codec``: inspect, verify, rename, quantize, dequantize and demo.

* ``inspect PATH [--stats]``: per-tensor table (name, dtype, shape, encoding, bytes) and metadata
  of a file or checkpoint directory; ``--stats`` adds each MXFP8 tensor's scale-byte histogram
  (scale byte ``b`` means ``2^(b - 127)``), which shows at a glance whether a checkpoint's weights
  sit at sane magnitudes (a trained 4B model's projections have bytes around 118-122).
* ``verify PATH [--values] [--allow-plain]``: every validation rule of docs/format.md; exit 1 with
  the reason on failure. ``--values`` also scans for NaN codes/scales and non-finite floats. A directory's
  ``SHA256SUMS`` (ida writes one beside every model it writes) is checked first.
* ``rename SRC DST --map JSON | --prefix OLD=NEW``: header-only rename with the sha256 proof.
* ``quantize HF_DIR OUT_DIR``: a transformers BF16/F32 checkpoint directory (single file or
  sharded) -> MXFP8 directory. Projection weights (``is_projection_weight``, 2-D) are transposed to
  the native ``[in, out]`` orientation (``--orientation in_out``, default) and encoded; everything
  else is written as BF16; config/tokenizer/generation files are copied
  (:func:`mxfp8_codec.checkpoint.quantize_checkpoint`).
* ``dequantize IN OUT [--model-type T]``: MXFP8 file or directory -> plain BF16 safetensors in
  transformers' layout (projections transposed back, folded norms unfolded where the architecture's
  norms add 1: :mod:`mxfp8_codec.layout`), loadable by ``from_pretrained``; for a directory the
  config/tokenizer files are copied too (:func:`mxfp8_codec.checkpoint.dequantize_checkpoint`).
* ``export --format compressed-tensors SRC DST [--overwrite]``: the compressed-tensors
  ``mxfp8-quantized`` copy that vLLM and transformers' compressed-tensors quantizer load
  (:mod:`mxfp8_codec.export`).
* ``demo OUT_DIR``: builds a small random Llama checkpoint with transformers, quantizes it,
  inspects and verifies the result, dequantizes it and reports the logits error.

Outputs (:mod:`ida_common.files`): no command writes onto its own input, into it or around it
(``quantize HF HF`` is refused before anything is read), and an existing output is replaced only
with ``--overwrite``; each refusal is one line. Output directories (``quantize``, ``dequantize`` of a
directory, ``demo``) are built in a hidden sibling and appear complete in one rename; files are
written to a temporary, fsynced and renamed. Temporaries of killed runs are swept by the next run
into the same place. A tensor name with control characters is printed escaped.

This module parses arguments and prints; the work is done by :mod:`mxfp8_codec.checkpoint`,
:mod:`mxfp8_codec.export`, :mod:`mxfp8_codec.reader` and :mod:`mxfp8_codec.rename`.

Every command returns an exit status from :func:`main`, which follows the project's CLI convention
(:mod:`ida_common.cli`, docs/cli.md): bad input (an :class:`MXFP8Error` naming file, tensor and
reason; a missing file) is one line ``mxfp8_codec: error: ...`` with status 2; a file that ``verify``
finds invalid, or a ``demo`` that does not round-trip, is status 1; Ctrl-C is status 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from ida_common.checksums import SUMS_FILE, write_sums
from ida_common.cli import ArgumentParser, CheckFailed, Run, check_output_dir, run_main
from ida_common.files import atomic_directory, check_output
from mxfp8_codec.checkpoint import check_sums, dequantize_checkpoint, printable, quantize_checkpoint
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.export import export_compressed_tensors
from mxfp8_codec.header import SCALE_RULES, SCALE_SUFFIX, read_header
from mxfp8_codec.hf_config import how_to_load
from mxfp8_codec.layout import ORIENTATIONS, is_projection_weight
from mxfp8_codec.numerics import decode_mxfp8, encode_mxfp8
from mxfp8_codec.reader import checkpoint_files, open_mxfp8, validate
from mxfp8_codec.rename import prefix_mapping, rename_tensors

PROG = "mxfp8_codec"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _files(path: Path) -> list[Path]:
    return checkpoint_files(path) if path.is_dir() else [path]


# --------------------------------------------------------------------------------------------------
# inspect / verify


def _histogram(scales: np.ndarray) -> str:
    counts = np.bincount(scales.reshape(-1), minlength=256)
    parts = [f"{b}:{int(c)}" for b, c in enumerate(counts) if c]
    return " ".join(parts) if parts else "(empty)"


def inspect_file(path: Path, *, stats: bool, out: TextIO) -> None:
    """Print the tensor table and metadata of one file."""
    with open_mxfp8(path) as r:
        h = r.header
        print(
            f"{path}  ({_human(h.file_size)}, header {h.header_len} bytes, {len(r)} tensors, {len(h.quantized)} MXFP8)",
            file=out,
        )
        for k in sorted(r.metadata):
            print(f"  {printable(k)} = {printable(r.metadata[k])}", file=out)
        rows = []
        for name in r.keys():
            e = h.entries[name]
            if r.is_quantized(name):
                s = h.entries[name + SCALE_SUFFIX]
                rows.append(
                    (
                        printable(name),
                        f"{e.dtype}+{s.dtype}",
                        str(list(e.shape)),
                        "mxfp8 e4m3/ue8m0/32",
                        e.nbytes + s.nbytes,
                    )
                )
            else:
                rows.append((printable(name), e.dtype, str(list(e.shape)), "plain", e.nbytes))
        widths = [
            max([len(h_)] + [len(str(row[i])) for row in rows])
            for i, h_ in enumerate(("name", "dtype", "shape", "encoding", "bytes"))
        ]
        fmt = "  {:<%d}  {:<%d}  {:<%d}  {:<%d}  {:>%d}" % tuple(widths)
        print(fmt.format("name", "dtype", "shape", "encoding", "bytes"), file=out)
        for row in rows:
            print(fmt.format(*row), file=out)
        print(f"  total data: {h.data_size} bytes", file=out)
        if stats:
            print("  scale-byte histograms (byte b = 2^(b-127)):", file=out)
            for name in h.quantized:
                sc = r.get_raw(name).scales
                nan = int((sc == 0xFF).sum())
                note = f", {nan} NaN blocks" if nan else ""
                lo, hi = (int(sc.min()), int(sc.max())) if sc.size else (0, 0)
                print(f"  {printable(name)}: blocks={sc.size} min={lo} max={hi}{note}", file=out)
                print(f"    {_histogram(sc)}", file=out)


def _print_how_to_load(path: Path, files: Sequence[Path], is_mxfp8: bool | None = None) -> None:
    if is_mxfp8 if is_mxfp8 is not None else any(read_header(f).is_mxfp8 for f in files):
        print(how_to_load(path))


def _cmd_inspect(args: argparse.Namespace) -> int:
    files = _files(Path(args.path))
    for f in files:
        inspect_file(f, stats=args.stats, out=sys.stdout)
    _print_how_to_load(Path(args.path), files)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():  # nothing to check is bad input (status 2), not a failed check
        raise ValueError(f"{path}: no such file or directory")
    files = _files(path)
    if path.is_dir():
        try:
            listed = check_sums(path)
        except MXFP8Error as exc:  # bytes changed since they were written: the check failed (status 1)
            raise CheckFailed(str(exc)) from None
        if listed:
            print(f"OK {path / SUMS_FILE}: the weights, index and side files match their recorded sha256")
    any_mxfp8 = False
    for f in files:
        try:
            h = validate(f, require_mxfp8=not args.allow_plain, check_values=args.values)
        except MXFP8Error as exc:  # the checked thing failed: status 1, not "bad input"
            raise CheckFailed(str(exc)) from None
        checks = "structure and values" if args.values else "structure"
        n = len(h.entries) - len(h.quantized)  # logical tensors: a quantized pair counts once
        print(f"OK {f}: {n} tensors ({len(h.quantized)} MXFP8), {h.file_size} bytes, {checks} valid")
        any_mxfp8 = any_mxfp8 or h.is_mxfp8
    _print_how_to_load(path, files, any_mxfp8)  # headers parsed once (a 100 MB one takes seconds)
    return 0


# --------------------------------------------------------------------------------------------------
# rename


def _parse_map(text: str) -> dict[str, str]:
    src = Path(text)
    if not text.lstrip().startswith("{") and src.is_file():
        text = src.read_text(encoding="utf-8")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise MXFP8Error(f"--map: not a JSON object or a JSON file: {exc}") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise MXFP8Error("--map: must be a JSON object of old name -> new name strings")
    return obj


def _cmd_rename(args: argparse.Namespace) -> int:
    mapping: Mapping[str, str] | Callable[[str], str]
    if args.map is not None:
        mapping = _parse_map(args.map)
    else:
        rules = {}
        for rule in args.prefix:
            old, sep, new = rule.partition("=")
            if not sep or not old:
                raise MXFP8Error(f"--prefix {rule!r}: expected OLD=NEW")
            rules[old] = new
        mapping = prefix_mapping(rules)
    check_output(args.dst, inputs=[args.src], overwrite=args.overwrite, kind="file", what="DST")
    report = rename_tensors(args.src, args.dst, mapping)
    for old, new, sha in report.tensors:
        arrow = f"{printable(old)} -> {printable(new)}" if old != new else f"{printable(old)} (unchanged)"
        print(f"  {sha[:16]}  {arrow}")
    print(
        f"sha256 check passed: {len(report.tensors)} tensors byte-identical before/after, {len(report.renamed)} renamed"
    )
    print(f"data section sha256 {report.data_sha256} (identical in {report.src} and {report.dst})")
    return 0


# --------------------------------------------------------------------------------------------------
# quantize / export / dequantize (the work: mxfp8_codec.checkpoint, mxfp8_codec.export)


def _cmd_quantize(args: argparse.Namespace) -> int:
    target = quantize_checkpoint(
        args.hf_dir, args.out_dir, scale_rule=args.scale_rule, orientation=args.orientation, overwrite=args.overwrite
    )
    with open_mxfp8(target) as r:
        print(f"wrote {target}: {len(r)} tensors, {len(r.header.quantized)} MXFP8, {r.header.file_size} bytes")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    report = export_compressed_tensors(args.src, args.dst, overwrite=args.overwrite, model_type=args.model_type)
    for line in report.lines():
        print(line)
    return 0


def _cmd_dequantize(args: argparse.Namespace) -> int:
    for target in dequantize_checkpoint(args.src, args.out, model_type=args.model_type, overwrite=args.overwrite):
        with open_mxfp8(target) as r:
            print(f"wrote {target}: {len(r)} BF16/plain tensors, {r.header.file_size} bytes")
    return 0


# --------------------------------------------------------------------------------------------------
# demo


def _cmd_demo(args: argparse.Namespace) -> int:
    root = check_output_dir(args.out_dir, "OUT_DIR")  # before importing transformers or creating anything
    check_output(root, overwrite=args.overwrite, kind="dir", what="OUT_DIR")
    hf_dir, mx_dir, back_dir = root / "hf", root / "mxfp8", root / "dequantized"
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with atomic_directory(hf_dir, overwrite=args.overwrite) as tmp:
        model.save_pretrained(tmp)
        write_sums(tmp, sync=True)
    print(f"[1/4] random Llama checkpoint ({sum(p.numel() for p in model.parameters())} parameters) -> {hf_dir}")
    quantize_checkpoint(hf_dir, mx_dir, overwrite=args.overwrite)
    print(f"[2/4] quantized -> {mx_dir}")
    inspect_file(mx_dir / "model.safetensors", stats=False, out=sys.stdout)
    validate(mx_dir / "model.safetensors")
    print("[3/4] verify: OK")
    dequantize_checkpoint(mx_dir, back_dir, overwrite=args.overwrite)
    back = AutoModelForCausalLM.from_pretrained(back_dir, dtype=torch.bfloat16).eval()
    # The exact expectation: every projection equals decode(encode(W^T))^T, everything else is unchanged.
    mismatched = []
    restored = back.state_dict()
    for name, w in model.state_dict().items():
        want = w
        if is_projection_weight(name):
            p, s = encode_mxfp8(w.T.contiguous())
            want = decode_mxfp8(p, s, dtype=torch.bfloat16).T
        if not torch.equal(restored[name], want):
            mismatched.append(name)
    ids = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = model(ids).logits.float(), back(ids).logits.float()
    rel = float((a - b).norm() / a.norm())
    print(
        f"[4/4] dequantized -> {back_dir}; from_pretrained weights bit-exact: {not mismatched}; "
        f"logits relative error vs the unquantized original: {rel:.4f}"
    )
    if mismatched:
        raise CheckFailed(f"{back_dir}: weights differ from decode(encode(.)): {mismatched[:5]}")
    return 0


# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m mxfp8_codec``."""
    p = ArgumentParser(
        prog="python -m mxfp8_codec",
        short_prog=PROG,
        description="MXFP8 (E4M3 + UE8M0/32) safetensors checkpoint tool. Exit status: 0 ok, 1 verify/demo "
        "check failed, 2 bad input, 3 cannot run here, 70 internal error, 130 interrupted (docs/cli.md).",
    )
    sub = p.add_subparsers(
        dest="command", required=True, help="the command (python -m mxfp8_codec COMMAND --help for its options)"
    )

    s = sub.add_parser("inspect", help="tensor table and metadata of a file or checkpoint directory")
    s.add_argument("path", help="a .safetensors file or a checkpoint directory")
    s.add_argument("--stats", action="store_true", help="per-tensor scale-byte histogram")
    s.set_defaults(func=_cmd_inspect)

    s = sub.add_parser("verify", help="check every validation rule; exit 1 with the reason on failure")
    s.add_argument("path", help="a .safetensors file or a checkpoint directory")
    s.add_argument("--values", action="store_true", help="also scan for NaN codes/scales and non-finite floats")
    s.add_argument("--allow-plain", action="store_true", help="accept plain safetensors files without MXFP8 metadata")
    s.set_defaults(func=_cmd_verify)

    s = sub.add_parser("rename", help="header-only rename of one file, with a sha256 proof")
    s.add_argument("src", help="the .safetensors file to read (a file, not a directory)")
    s.add_argument("dst", help="the .safetensors file to write (a file, not a directory)")
    s.add_argument("--overwrite", action="store_true", help="replace DST if it exists (never SRC itself)")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--map", help="JSON object {old: new} or a path to a JSON file")
    g.add_argument(
        "--prefix", action="append", metavar="OLD=NEW", help="replace a name prefix (repeatable; first match wins)"
    )
    s.set_defaults(func=_cmd_rename)

    s = sub.add_parser("quantize", help="transformers checkpoint dir -> MXFP8 checkpoint dir")
    s.add_argument("hf_dir", help="transformers checkpoint directory (config.json + *.safetensors)")
    s.add_argument("out_dir", help="MXFP8 checkpoint directory to write")
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT_DIR if it exists and is not empty (atomically, once the new one is complete)",
    )
    s.add_argument("--scale-rule", choices=SCALE_RULES, default="rceil", help="UE8M0 scale rule (default rceil)")
    s.add_argument(
        "--orientation",
        choices=ORIENTATIONS,
        default="in_out",
        help="stored orientation of projections (default in_out: the trainer's native [in, out])",
    )
    s.set_defaults(func=_cmd_quantize)

    s = sub.add_parser("dequantize", help="MXFP8 file/dir -> plain BF16 safetensors in transformers orientation")
    s.add_argument("src", help="MXFP8 .safetensors file or checkpoint directory")
    s.add_argument("out", help="file to write for a file, directory to write for a directory")
    s.add_argument(
        "--model-type",
        help="config.json model_type deciding which norms a folded file unfolds (default: from the config.json "
        "of SRC or beside it)",
    )
    s.add_argument(
        "--overwrite", action="store_true", help="replace OUT if it exists (atomically, once the new one is complete)"
    )
    s.set_defaults(func=_cmd_dequantize)

    s = sub.add_parser("export", help="MXFP8 checkpoint dir -> compressed-tensors mxfp8-quantized dir (vLLM)")
    s.add_argument("src", help="MXFP8 checkpoint directory (config.json + weights)")
    s.add_argument("dst", help="directory to create")
    s.add_argument("--format", choices=("compressed-tensors",), required=True, help="target layout")
    s.add_argument("--overwrite", action="store_true", help="replace an existing DST once the export is complete")
    s.add_argument("--model-type", help="config model_type, for folded norms when config.json has none")
    s.set_defaults(func=_cmd_export)

    s = sub.add_parser("demo", help="make a tiny random model, quantize, inspect, verify, dequantize")
    s.add_argument("out_dir", help="directory to create (hf/, mxfp8/, dequantized/ inside)")
    s.add_argument("--overwrite", action="store_true", help="replace the outputs of a previous demo in OUT_DIR")
    s.add_argument("--seed", type=int, default=0, help="seed of the random model (default 0)")
    s.set_defaults(func=_cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from mxfp8_codec import write_mxfp8_safetensors
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> write_mxfp8_safetensors(p, {"x.q_proj.weight": np.ones((2, 32), np.float32)})
        >>> main(["verify", p]) == 0  # doctest: +ELLIPSIS
        OK ...
        True
    """
    return run_main(PROG, _run, argv)


def _run(run: Run) -> int:
    args = build_parser().parse_args(run.argv)
    return int(args.func(args))
