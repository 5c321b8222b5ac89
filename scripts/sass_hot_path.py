"""Count the sm_90 SASS instructions of the quantize and Lion kernels' hot paths, on a machine without a GPU.

The quantize kernel and the Lion step on the MXFP8 master are bound by instructions on an H200 (ncu: SM
64-88 %, DRAM 21-39 %; docs/benchmarks.md), so the instruction count of the path the benchmarks run is
the number to bring down between device sessions.  This script copies each kernel out of
``nvfp4_cuda/csrc`` (of the working tree, or of a git revision with ``--rev``), fixes the runtime
switches the benchmark's inputs take (BF16 row-major input read with 16-byte loads, 1x16 blocks; Lion:
vector loads, rows a multiple of 32) as template constants, compiles it for sm_90 with the library's nvcc and flags
(``nvfp4_cuda.build``) and counts the SASS instructions of every variant (NOPs excluded).

Each hot path is straight-line code, so the count is what one thread executes, except the IEEE division's
slow path (a subroutine the scales' divisions call only for extreme operands), which is counted but rarely
run.  Per element: quantize threads own 16 elements per 1x16 block (two blocks since ``NV_QUANT_NB``), Lion
threads 8.

Needs nvcc, and cuobjdump + nvdisasm (the test extra installs them: the ``nvidia-cuda-cuobjdump`` and
``nvidia-cuda-nvdisasm`` wheels, in ``site-packages/nvidia/cu13/bin``, found automatically).  Also the
ceilings test of tests/nvfp4_cuda/test_device_math.py.  Run::

    python scripts/sass_hot_path.py                 # the working tree
    python scripts/sass_hot_path.py --rev 4e6ab40   # an earlier revision, to compare
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nvfp4_cuda import build  # noqa: E402  (the library's nvcc and flags)

CSRC = "nvfp4_cuda/csrc"
FLAGS = (*(f for f in build.BASE_FLAGS if f not in ("--threads", "2", "-Xcompiler", "-fPIC")), "-cubin", "-arch=sm_90")
QUANT_PATHS = (  # (name, SR, HADAMARD, DECODED, transposed input, input dtype: 1 BF16 / 2 MXFP8, 16x16 tiles)
    ("quantize 1x16 RNE", "false", "false", "false", 0, 1, 0),
    ("quantize 1x16 RNE, BF16 values out (quantize_decoded)", "false", "false", "true", 0, 1, 0),
    ("quantize 1x16 RNE + Hadamard", "false", "true", "false", 0, 1, 0),
    ("quantize 1x16 stochastic", "true", "false", "false", 0, 1, 0),
    ("quantize 1x16 stochastic + Hadamard", "true", "true", "false", 0, 1, 0),
    # the trainer's weight-gradient operands: X^T and dY^T read in place, BF16 values out (since the transposed read)
    ("quantize transposed input, RNE + Hadamard, BF16 values out", "false", "true", "true", 1, 1, 0),
    ("quantize transposed input, stochastic + Hadamard, BF16 values out", "true", "true", "true", 1, 1, 0),
    # the trainer's weights, every forward: 16x16 tiles of the MXFP8 master, BF16 values out
    ("quantize 16x16 RNE from the MXFP8 master, BF16 values out", "false", "false", "true", 0, 2, 1),
)


def _plain(path: tuple[str, str, str, str, int, int, int]) -> bool:
    """A row-major BF16 1x16 path: what the sources before the transposed read could be asked for."""
    return path[4] == 0 and path[5] == 1 and path[6] == 0


LION_PATHS = (("Lion on MXFP8, stochastic", 0), ("Lion on MXFP8, rne", 1), ("Lion on MXFP8, compensated", 2))


def _replace(text: str, old: str, new: str, what: str) -> str:
    if old not in text:
        raise SystemExit(
            f"sass_hot_path: {what} not found in the kernel source; update this script to the new signature"
        )
    return text.replace(old, new)


@functools.cache  # read once per run: elements_per_thread asks for the same file for every path
def _source(rev: str | None, name: str) -> str:
    if rev is None:
        return (ROOT / CSRC / name).read_text()
    return subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:{CSRC}/{name}"], capture_output=True, text=True, check=True
    ).stdout


def specialise(rev: str | None) -> tuple[str, dict[str, str]]:
    """The .cu text with one instantiation per hot path, and {mangled-name prefix: path name}."""
    quant, master = _source(rev, "nvfp4_quant.cu"), _source(rev, "nvfp4_master.cu")
    k = quant[
        quant.index("__device__ __forceinline__ void nv_tensor_scales") : quant.index(
            "__global__ void nv_dequantize_kernel"
        )
    ]
    names: dict[str, str] = {}
    nb = re.search(r"#define NV_QUANT_NB .*\n", quant)  # blocks per thread (since 2 per thread)
    if nb:
        k = nb.group(0) + k
    if "int64_t valid_cols, int transpose," in k:  # since the transposed read: transpose fixed too
        k = _replace(
            k,
            "template <bool SR, bool HADAMARD, bool DECODED>\n__global__ void nv_quantize_kernel(const void *x, int dtype,",
            "template <bool SR, bool HADAMARD, bool DECODED, int dtype, int vec, int block_2d, int transpose>\n"
            "__global__ void hot_quantize(const void *x, int dtype_,",
            "the quantize kernel's signature",
        )
        k = _replace(
            k,
            "int64_t valid_cols, int transpose, int vec, int block_2d,",
            "int64_t valid_cols, int transpose_, int vec_, int block_2d_,",
            "its flags",
        )
        sig = (
            "(const void *, int, const uint8_t *, int64_t, int64_t, int64_t, int, int, int, uint32_t, uint32_t, "
            "const float *, uint8_t *, uint8_t *, float *, __nv_bfloat16 *)"
        )
        inst = "".join(
            f"template __global__ void hot_quantize<{sr}, {had}, {dec}, {dt}, {1 - tr}, {b2}, {tr}>{sig};\n"
            for _, sr, had, dec, tr, dt, b2 in QUANT_PATHS
        )
        tmpl = [
            f"Lb{int(sr == 'true')}ELb{int(had == 'true')}ELb{int(dec == 'true')}ELi{dt}ELi{1 - tr}ELi{b2}ELi{tr}E"
            for _, sr, had, dec, tr, dt, b2 in QUANT_PATHS
        ]
    elif "template <bool SR, bool HADAMARD, bool DECODED>" in k:  # since the kernels became templates
        k = _replace(
            k,
            "template <bool SR, bool HADAMARD, bool DECODED>\n__global__ void nv_quantize_kernel(const void *x, int dtype,",
            "template <bool SR, bool HADAMARD, bool DECODED, int dtype, int vec, int block_2d>\n"
            "__global__ void hot_quantize(const void *x, int dtype_,",
            "the quantize kernel's signature",
        )
        k = _replace(k, "int transpose, int vec, int block_2d,", "int transpose, int vec_, int block_2d_,", "its flags")
        sig = (
            "(const void *, int, const uint8_t *, int64_t, int64_t, int, int, int, uint32_t, uint32_t, const float *, "
            "uint8_t *, uint8_t *, float *, __nv_bfloat16 *)"
        )
        inst = "".join(
            f"template __global__ void hot_quantize<{q[1]}, {q[2]}, {q[3]}, 1, 1, 0>{sig};\n"
            for q in QUANT_PATHS
            if _plain(q)
        )
        tmpl = [
            f"Lb{int(q[1] == 'true')}ELb{int(q[2] == 'true')}ELb{int(q[3] == 'true')}E"
            for q in QUANT_PATHS
            if _plain(q)
        ]
    else:  # the kernel branching on runtime flags
        k = _replace(
            k,
            "__global__ void nv_quantize_kernel(const void *x, int dtype, const uint8_t *x_scales, int64_t rows, "
            "int64_t cols,\n                                   int transpose, int hadamard, int vec, int block_2d, "
            "int rounding,",
            "template <int rounding, int hadamard, int DEC, int dtype, int vec, int block_2d>\n"
            "__global__ void hot_quantize(const void *x, const uint8_t *x_scales, int64_t rows, int64_t cols, "
            "int transpose,",
            "the quantize kernel's signature",
        )
        k = _replace(k, "if (decoded != nullptr)", "if (DEC)", "the decoded switch")
        sig = (
            "(const void *, const uint8_t *, int64_t, int64_t, int, uint32_t, uint32_t, const float *, uint8_t *, "
            "uint8_t *, float *, __nv_bfloat16 *)"
        )
        as_int = {"false": 0, "true": 1}
        inst = "".join(
            f"template __global__ void hot_quantize<{as_int[q[1]]}, {as_int[q[2]]}, {as_int[q[3]]}, 1, 1, 0>{sig};\n"
            for q in QUANT_PATHS
            if _plain(q)
        )
        tmpl = [f"Li{as_int[q[1]]}ELi{as_int[q[2]]}ELi{as_int[q[3]]}E" for q in QUANT_PATHS if _plain(q)]
    paths = [q for q in QUANT_PATHS if _plain(q)] if len(tmpl) < len(QUANT_PATHS) else list(QUANT_PATHS)
    for (name, *_), t in zip(paths, tmpl, strict=True):
        names[f"_Z12hot_quantizeI{t}"] = name
    lion = master[master.index("#define NV_MX ") : master.index("// BF16 bits of float32 x rounded")]
    lion = lion[: lion.index("// Encode v[0..len)")] + lion[lion.index("// ---- the fused Lion step") :]
    if "template <int WRITEBACK>" in lion:
        lion = _replace(
            lion,
            "template <int WRITEBACK>\n__global__ void nv_lion_kernel(",
            "template <int WRITEBACK, int vec, int full>\n__global__ void hot_lion(",
            "the Lion kernel's signature",
        )
    else:
        lion = _replace(
            lion,
            "__global__ void nv_lion_kernel(",
            "template <int writeback, int vec, int full>\n__global__ void hot_lion(",
            "the Lion kernel's signature",
        )
        lion = _replace(
            lion, "float omb2, int writeback, uint32_t key2,", "float omb2, uint32_t key2,", "its writeback"
        )
    lion = _replace(lion, "int vec, int full) {", "int vec_, int full_) {", "its flags")
    lsig = (
        "(uint8_t *, uint8_t *, const void *, int, __nv_bfloat16 *, float *, int64_t, int64_t, float, float, float, "
        "float, float, float, uint32_t, uint32_t, int, int)"
    )
    lion += "".join(f"template __global__ void hot_lion<{wb}, 1, 1>{lsig};\n" for _, wb in LION_PATHS)
    for name, wb in LION_PATHS:
        names[f"_Z8hot_lionILi{wb}E"] = name
    return '#include "nvfp4_common.cuh"\n' + k + inst + lion, names


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    wheel_bin = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13" / "bin" / name
    if wheel_bin.exists():
        return str(wheel_bin)
    raise SystemExit(f"sass_hot_path: {name} not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


class Op(NamedTuple):
    """One SASS instruction: its address, opcode and, for a branch, its target address."""

    addr: int
    opcode: str
    target: int | None


def opcodes(rev: str | None) -> dict[str, list[Op]]:
    """{path name: its SASS instructions, NOPs left out} for the sources at ``rev`` (None: the working tree)."""
    text, names = specialise(rev)
    cuobjdump = _tool("cuobjdump")
    env = dict(os.environ, PATH=f"{Path(_tool('nvdisasm')).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        common = d / "nvfp4_common.cuh"
        common.write_text(_source(rev, "nvfp4_common.cuh"))
        (d / "hot.cu").write_text(text)
        subprocess.run(
            [
                _tool("nvcc"),
                *FLAGS,
                f"-I{d}",
                f"-I{ROOT / 'mxfp8_codec'}",
                str(d / "hot.cu"),
                "-o",
                str(d / "hot.cubin"),
            ],
            check=True,
        )
        sass = subprocess.run(
            [cuobjdump, "-sass", str(d / "hot.cubin")], capture_output=True, text=True, check=True, env=env
        )
    return parse_sass(sass.stdout, names)


def parse_sass(text: str, names: dict[str, str]) -> dict[str, list[Op]]:
    """``cuobjdump -sass`` output -> {name: its instructions in order, NOPs left out} for each function whose
    mangled name starts with a key of ``names`` (the value is the name given)."""
    ops: dict[str, list[Op]] = {}  # path name -> its instructions in order
    current = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = next((v for k, v in names.items() if m.group(1).startswith(k)), None)
            if current is not None:
                ops[current] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)([^;]*)", line)
        if current is not None and m and m.group(2) != "NOP":
            target = re.search(r"0x([0-9a-f]+)", m.group(3)) if m.group(2) == "BRA" else None
            ops[current].append(Op(int(m.group(1), 16), m.group(2), int(target.group(1), 16) if target else None))
    return ops


def count(rev: str | None) -> dict[str, int]:
    """{path name: SASS instructions} for the sources at ``rev`` (None: the working tree)."""
    return {name: len(o) for name, o in opcodes(rev).items()}


def main_body(ops: list[Op]) -> int:
    """Instructions before the function's subroutines (the IEEE division's slow paths, which a thread calls
    only for extreme operands): up to its last EXIT before the first RET. Still counted: the branch one
    thread per CUDA block takes to compute the tensor scales, and the division's fallback test."""
    names = [op.opcode for op in ops]
    first_ret = names.index("RET") if "RET" in names else len(names)
    return max(i for i, name in enumerate(names[:first_ret]) if name == "EXIT") + 1


def per_iteration(ops: list[Op]) -> int:
    """What a thread executes per unit of work: the loop that holds most of the main body (a grid-stride
    loop: the Lion step, one MXFP8 block's 8 elements per turn), or the whole main body where there is none
    (the quantizer: straight-line code; a short loop inside it, e.g. a table's, is part of the body). A
    thread that makes one turn only still pays the rest of the main body: how many turns it makes is the
    launcher's choice, which this count cannot see."""
    body = ops[: main_body(ops)]
    work = [n for n in loop_lengths(body) if 2 * n > len(body)]
    return max(work, default=len(body))


def loop_lengths(ops: list[Op]) -> list[int]:
    """The instructions of each loop (from a backward branch's target to the branch, both included)."""
    index = {op.addr: i for i, op in enumerate(ops)}
    return [i - index[op.target] + 1 for i, op in enumerate(ops) if op.target is not None and op.target < op.addr]


def elements_per_thread(rev: str | None, name: str) -> int:
    """Elements one thread of the hot path ``name`` handles per unit of work at ``rev``: a Lion thread 8 per
    turn of its loop, a quantizer thread 16 per 1x16 block it owns (``NV_QUANT_NB``, 2 since the quantizer
    took two blocks per thread)."""
    if not name.startswith("quantize"):
        return 8
    nb = re.search(r"#define NV_QUANT_NB (\d+)", _source(rev, "nvfp4_quant.cu"))
    return 16 * (int(nb.group(1)) if nb else 1)


def main(argv: list[str] | None = None) -> int:
    """Print a markdown table: instructions per thread (all, main body, one turn of the work) and per
    element, and against ``--rev`` when given (per element: a thread may own more elements at one revision
    than at the other)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=None, help="also count this git revision's kernels, side by side")
    args = ap.parse_args(argv)
    now = opcodes(None)
    before = opcodes(args.rev) if args.rev else {}
    head = "| hot path (sm_90) | SASS / thread | main body | per turn | elements / turn | per element |"
    print(head + (f" per element at {args.rev} | ratio |" if before else ""))
    print("|---|---|---|---|---|---|" + ("---|---|" if before else ""))
    for name in [q[0] for q in QUANT_PATHS] + [lp[0] for lp in LION_PATHS]:
        ops, per = now[name], elements_per_thread(None, name)
        turn = per_iteration(ops)
        row = f"| {name} | {len(ops)} | {main_body(ops)} | {turn} | {per} | {turn / per:.1f} |"
        if before:
            if name in before:
                b = per_iteration(before[name]) / elements_per_thread(args.rev, name)
                row += f" {b:.1f} | {turn / per / b:.2f}x |"
            else:
                row += " - | - |"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
