"""Command line: ``python -m nvfp4_cuda build [--force]`` and ``python -m nvfp4_cuda info [--json]``.

``build`` compiles the shared library into the cache (see :mod:`nvfp4_cuda.build`) and prints its
path; ``info`` reports the backend CUDA tensors would use, the device, the library path, and - when a
library is already built - whether it loads and what the driver says (no compilation happens).

Errors follow the project's CLI convention (:mod:`ida_common.cli`, docs/cli.md): one line
``nvfp4_cuda: error: ...``; a build that cannot run here (no nvcc, compiler failure) is status 3.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ida_common.cli import EXIT_CANNOT_RUN, ArgumentParser, Run, run_main
from nvfp4_cuda import build as _build


def _info() -> dict[str, object]:
    from nvfp4_cuda.api import backend_info  # torch: only here (--help and build do without)

    info = backend_info()
    try:
        nvcc = _build.find_nvcc()
        lib = _build.library_path(nvcc)
        info["nvcc"] = nvcc
        extra = _build.extra_flags()  # $NVFP4_CUDA_NVCC_FLAGS: a library of its own
        if extra:
            info["nvcc_extra_flags"] = " ".join(extra)
        info["library"] = str(lib)
        info["library_built"] = lib.is_file()
    except _build.BuildError as e:
        info["nvcc"] = None
        info["library_built"] = False
        info["nvcc_error"] = str(e)
    if info.get("driver") == "no NVIDIA driver":
        return info  # nothing to ask the library: the CUDA runtime would only say "insufficient driver"
    if info.get("library_built"):
        from nvfp4_cuda import cuda_ops

        try:
            info["driver"] = cuda_ops.device_query()
        except (cuda_ops.NVFP4CudaError, OSError) as e:
            text = str(e)
            if "InsufficientDriver" in text or "insufficient" in text:
                text = f"NVIDIA driver too old for this CUDA runtime ({text})"
            info["driver"] = f"unavailable: {text}"
    return info


PROG = "nvfp4_cuda"
DESCRIPTION = (
    "NVFP4 CUDA kernels: 'build' compiles the shared library into the cache and prints its path; "
    "'info' reports the backend CUDA tensors would use, the device and the library (compiles nothing)."
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (docs/cli.md)."""
    return run_main(PROG, _run, argv, codes={_build.BuildError: EXIT_CANNOT_RUN})


def _run(run: Run) -> int:
    parser = ArgumentParser(prog="python -m nvfp4_cuda", short_prog=PROG, description=DESCRIPTION)
    sub = parser.add_subparsers(
        dest="cmd",
        required=True,
        metavar="{build,info}",
        help="the command (python -m nvfp4_cuda COMMAND --help for its options)",
    )
    b = sub.add_parser("build", help="compile libnvfp4_cuda.so into the cache (sm_80, sm_90, sm_120a)")
    b.add_argument("--force", action="store_true", help="rebuild even if a cached library exists")
    i = sub.add_parser("info", help="report backend, device and library path")
    i.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(run.argv)
    if args.cmd == "build":
        print(_build.build(force=args.force))
        return 0
    info = _info()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        for k, v in info.items():
            print(f"{k}: {v}")
    return 0
