#!/usr/bin/env bash
# scripts/device_check.sh REPORT_DIR -- everything this project can check only on a CUDA GPU, in one run.
#
#   1. environment (GPU, driver, torch, nvcc,      4. 20-step nvfp4 training of the demo model on the GPU
#      pyproject's requirements: check_deps.py)       and on the CPU reference (concurrently), compared:
#   2. build libnvfp4_cuda.so (cached)                loss curve and final MXFP8 master bytes
#   3. every GPU-marked test (pytest -m gpu)
#   5. the kernel benchmarks (benchmarks/bench_nvfp4_gpu.py: GEMM, quantize, decode, Lion vs baselines;
#      benchmarks/bench_mxfp8_gpu.py: the Triton MXFP8 decode vs a copy, MXFP8Linear forward vs bf16;
#      the bandwidth rows again with one 1x16 block per quantizer thread: NVFP4_CUDA_NVCC_FLAGS=-DNV_QUANT_NB=1)
#   6. training throughput and memory, nvfp4 vs bf16 recipe (benchmarks/bench_gpu_train.py, 4B shape)
#   7. MBXP generation tokens/s: dynamic vs static KV cache, bf16 vs MXFP8, with a per-step profile
#      (benchmarks/bench_generate.py); last of all (7b), one sampling draw, top_p 0.95, 256 candidates vs
#      the whole row sorted (benchmarks/bench_sampler.py)
#   8. a sampled MBXP run of step 4's export on the GPU (top_p 0.95, pass@1/4, tokens/s, programs/s), end to end
#   9. after 7b, FSDP2 over NCCL (torchrun, 1 rank): a 4-layer Qwen3-4B-shaped bf16 training, its peak memory
#      beside ida_trainer.memory.fsdp_memory's count, then the streamed checkpoint save of it (GPU and host memory
#      it added, read back exactly) (benchmarks/bench_fsdp_memory.py)
#
# Writes REPORT_DIR/report.md (the summary) and one log / JSON / XML file per step beside it.
# On one H200 with 16 cores it took 169-219 s (three runs, 2026-12-04, before steps 5b, 5c, 7 and 8:
# allow ~30 + 40 + 120 + 60 s more, unmeasured); each step has its own time limit (listed below), so a 15-minute device
# lease runs it once with a little room; the CUDA build is cached ($IDA_CACHE_DIR/nvfp4_cuda), so a
# rerun skips step 2.  The device image has no cffi and an older transformers than pyproject's floor:
# `python scripts/device_prep.py` (here, before the lease) puts their wheels in .whl/ and the MBPP prompts in
# .devrun/, and prints the device call (carry both); this script installs .whl/*.whl first (--no-deps, into a
# folder put first on PYTHONPATH).
#
# DEVICE_CHECK_STEPS="7 8" runs steps 1, 2 and those only (a rerun of what a short lease cut off); 8 brings 4.
# DEVICE_CHECK_BUDGET=S (default 540): the whole run's seconds; a step gets at most what is left.
#
# Exit status: 0 all steps passed, or no GPU here (it says "no GPU" and writes a report saying so);
# 1 some step failed (report.md says which); 2 bad usage. See docs/nvfp4.md, "Device check".
set -u -o pipefail

usage() { echo "usage: scripts/device_check.sh REPORT_DIR   (writes REPORT_DIR/report.md)" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$1"
PY="${PYTHON:-python}"
mkdir -p "$OUT" || { echo "device_check: error: cannot create report directory $OUT" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
REPORT="$OUT/report.md"
cd "$REPO" || exit 2
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# time limits per step (seconds); the build takes ~20 s there, the training benchmark ~2 min
T_ENV=20 T_BUILD=120 T_TESTS=120 T_TRAIN=75 T_BENCH=90 T_BENCH_MXFP8=75 T_COMPARE=30 T_TRAIN_BENCH=300 T_GEN=200 T_MBXP=120
T_BUILD_NB1=60 T_BENCH_NB1=60 T_SAMPLER=30 T_FSDP=150
STEPS=20
# the whole run's budget (seconds): each step's limit is cut to what is left of it, a step with under 20 s
# left is skipped (and said so), and the report is always finished; the per-call limit of a lent machine
# is 600 s: run it as `timeout 590 bash scripts/device_check.sh DIR`
BUDGET="${DEVICE_CHECK_BUDGET:-540}"
# DEVICE_CHECK_STEPS: which of steps 3-9 to run (default all; 1 and 2 always run, 8 brings 4: it evaluates 4's model)
WANTED=" ${DEVICE_CHECK_STEPS:-3 4 5 6 7 8 9} "
case "$WANTED" in *" 8 "*) WANTED="${WANTED}4 " ;; esac
FAILED=0
START=$(date +%s)

note() { echo "$*" | tee -a "$REPORT"; }
elapsed() { echo $(( $(date +%s) - START )); }
want() { case "$WANTED" in *" $1 "*) return 0 ;; esac; note "- step $1: not selected (DEVICE_CHECK_STEPS)"; return 1; }

# run NAME LIMIT CMD...: run a step with a time limit, log to OUT/NAME.log, one report line
run() {
    local name="$1" limit="$2"; shift 2
    local t0 rc left
    left=$(( BUDGET - $(elapsed) - 15 ))  # 10 s of --kill-after, 5 s to finish the report
    if [ "$left" -lt 20 ]; then
        note "- **$name**: SKIPPED, ${left} s left of the ${BUDGET} s budget (DEVICE_CHECK_BUDGET, DEVICE_CHECK_STEPS)"
        FAILED=1
        return 124
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    local took=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then
        note "- **$name**: ok (${took} s)"
    else
        [ $rc -eq 124 ] || [ $rc -eq 137 ] && note "- **$name**: TIMED OUT after ${limit} s (log: $name.log)" \
            || note "- **$name**: FAILED, exit $rc (${took} s; log: $name.log, last lines below)"
        { echo '```'; tail -n 15 "$OUT/$name.log"; echo '```'; } >>"$REPORT"
        FAILED=1
    fi
    return $rc
}

{
    echo "# Device check ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
    echo
    echo "Repository: $REPO at $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
} >"$REPORT"

# ---- 0. is there a GPU? -------------------------------------------------------------------------------
GPU_PROBE=$(timeout 120 "$PY" - <<'EOF' 2>&1
import torch
if not torch.cuda.is_available():
    from nvfp4_cuda.api import nvidia_driver  # (here only: it needs cffi, which the device image lacks)
    d = nvidia_driver()
    print("no GPU: " + ("no NVIDIA driver (libcuda.so.1 not found)" if d is None
                         else f"driver {d!r} present but torch sees no CUDA device (torch {torch.__version__})"))
else:
    print("gpu: " + ", ".join(f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
                              for i in range(torch.cuda.device_count())))
EOF
)
if [ "${GPU_PROBE#gpu: }" = "$GPU_PROBE" ]; then
    [ "${GPU_PROBE#no GPU}" = "$GPU_PROBE" ] && GPU_PROBE="no GPU: the probe (torch.cuda.is_available()) failed or timed out: $(echo "$GPU_PROBE" | tail -n 1)"
    note "device_check: $GPU_PROBE -- nothing to check on this machine (run it where a CUDA GPU is visible)."
    exit 0
fi
note "- **gpu**: ${GPU_PROBE#gpu: }"

# ---- carried wheels: what the device image lacks (cffi) or has too old (transformers), from .whl/ --------
# (scripts/device_prep.py downloads them here; installed without their dependencies into a folder put first
# on PYTHONPATH, so that they take precedence over the image's; step 1 checks every requirement)
WHEELS=("$REPO"/.whl/*.whl)
if [ -e "${WHEELS[0]}" ]; then
    SITE="${TMPDIR:-/tmp}/ida_device_site"
    rm -rf "$SITE"
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${WHEELS[@]}" \
        >"$OUT/wheels.log" 2>&1; then
        export PYTHONPATH="$SITE:$PYTHONPATH"
        note "- **wheels**: installed $(cd "$REPO/.whl" && ls -- *.whl | tr '\n' ' ')"
    else
        note "- **wheels**: FAILED to install .whl/*.whl (log: wheels.log, last lines below)"
        { echo '```'; tail -n 5 "$OUT/wheels.log"; echo '```'; } >>"$REPORT"
        FAILED=1
    fi
fi

# ---- 1. environment ---------------------------------------------------------------------------------------
run env "$T_ENV" bash -c "nvidia-smi; $PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda)'; \
    (nvcc --version || echo 'nvcc: not on PATH'); $PY -m nvfp4_cuda info; info=\$?; \
    $PY scripts/check_deps.py && exit \$info"
grep -E "^UNMET|^check_deps" "$OUT/env.log" | sed 's/^/  - /' >>"$REPORT"

# ---- 2. build ---------------------------------------------------------------------------------------------
run build "$T_BUILD" "$PY" -m nvfp4_cuda build
BUILD_OK=$?

# ---- 3. every GPU-marked test -------------------------------------------------------------------------------
if want 3; then
    if [ $BUILD_OK -eq 0 ]; then
        run gpu_tests "$T_TESTS" "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" tests
        grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -n 1 | sed 's/^/  - pytest: /' >>"$REPORT"
    else
        note "- **gpu_tests**: skipped (no library)"
    fi
fi

# ---- 4. 20-step nvfp4 training: GPU and CPU reference, concurrently ----------------------------------------
if want 4; then
    TRAIN_ARGS=(--steps "$STEPS" --eval.final false --train.log_every 1 --train.progress false)
    rm -rf "$OUT/train_gpu" "$OUT/train_cpu"
    ( run train_cpu "$T_TRAIN" env CUDA_VISIBLE_DEVICES= "$PY" -m ida_trainer "${TRAIN_ARGS[@]}" --out "$OUT/train_cpu" ) &
    CPU_PID=$!
    run train_gpu "$T_TRAIN" "$PY" -m ida_trainer "${TRAIN_ARGS[@]}" --out "$OUT/train_gpu"
    wait $CPU_PID || FAILED=1
    run compare_training "$T_COMPARE" "$PY" - "$OUT" <<'EOF'
"""Loss curves and final MXFP8 masters of the GPU and CPU runs, side by side."""
import json, sys
from pathlib import Path

import numpy as np

from mxfp8_codec import open_mxfp8

out = Path(sys.argv[1])
runs = {k: out / f"train_{k}" for k in ("gpu", "cpu")}
logs = {k: [json.loads(l) for l in (d / "train_log.jsonl").read_text().splitlines() if l.strip()] for k, d in runs.items()}
gpu, cpu = ({r["step"]: r["loss"] for r in logs[k]} for k in ("gpu", "cpu"))
steps = sorted(set(gpu) & set(cpu))
rel = [abs(gpu[s] - cpu[s]) / max(abs(cpu[s]), 1e-12) for s in steps]
lines = ["| step | loss GPU | loss CPU | rel. diff |", "|---|---|---|---|"]
lines += [f"| {s} | {gpu[s]:.6f} | {cpu[s]:.6f} | {r:.2e} |" for s, r in zip(steps, rel)]
ident_loss = sum(gpu[s] == cpu[s] for s in steps)
files = {k: d / "export" / "model.safetensors" for k, d in runs.items()}
same_bytes = total_bytes = same_tensors = n_tensors = 0
with open_mxfp8(files["gpu"]) as g, open_mxfp8(files["cpu"]) as c:
    for name in sorted(g.header.entries):  # every stored entry: payloads, .scale bytes, bf16 tensors
        a = np.frombuffer(g.tensor_bytes(name), np.uint8)
        b = np.frombuffer(c.tensor_bytes(name), np.uint8)
        n_tensors += 1
        same_tensors += int(np.array_equal(a, b))
        same_bytes += int((a == b).sum())
        total_bytes += a.size
kept = {k: [r["master_step_kept"] for r in logs[k] if r.get("master_step_kept") is not None] for k in runs}
summary = {"steps": len(steps), "identical_losses": ident_loss, "max_rel_loss_diff": max(rel),
           "final_loss_gpu": gpu[steps[-1]], "final_loss_cpu": cpu[steps[-1]],
           "identical_tensors": f"{same_tensors}/{n_tensors}", "identical_bytes": f"{same_bytes}/{total_bytes}",
           "mean_master_step_kept": {k: sum(v) / len(v) if v else None for k, v in kept.items()}}
(out / "compare_training.json").write_text(json.dumps(summary, indent=2))
(out / "compare_training.md").write_text("\n".join(lines) + "\n")
print(json.dumps(summary, indent=2))
# the runs must train the same model the same way: same steps; the first loss (same weights, same batch,
# only the summation order differs) within 1e-3, every loss within 10 % (Lion's sign() lets last-bit
# differences grow into a diverging but equally good trajectory), the final loss within 5 %; bytes are reported
ok = len(steps) == len(cpu) == len(gpu) and rel[0] < 1e-3 and max(rel) < 0.10 and rel[-1] < 0.05
sys.exit(0 if ok else 1)
EOF
    [ -f "$OUT/compare_training.json" ] && sed 's/^/    /' "$OUT/compare_training.json" >>"$REPORT" \
        && echo "  (per-step table: compare_training.md)" >>"$REPORT"
fi

# ---- 5. GPU benchmarks ------------------------------------------------------------------------------------
if want 5; then
    if [ $BUILD_OK -eq 0 ]; then
        run bench_nvfp4_gpu "$T_BENCH" "$PY" benchmarks/bench_nvfp4_gpu.py --out-prefix "$OUT/bench_nvfp4_gpu"
        [ -f "$OUT/bench_nvfp4_gpu.md" ] && cat "$OUT/bench_nvfp4_gpu.md" >>"$REPORT"
    else
        note "- **bench_nvfp4_gpu**: skipped (no library)"
    fi
    # the MXFP8 decode needs no library of ours: Triton compiles it (the first call of each variant, ~1 s each)
    run bench_mxfp8_gpu "$T_BENCH_MXFP8" "$PY" benchmarks/bench_mxfp8_gpu.py --out-prefix "$OUT/bench_mxfp8_gpu"
    [ -f "$OUT/bench_mxfp8_gpu.md" ] && cat "$OUT/bench_mxfp8_gpu.md" >>"$REPORT"
    # 5c. the quantizer with one 1x16 block per thread beside the first table's two (NV_QUANT_NB): the library
    # built again with -DNV_QUANT_NB=1 (its own cache entry: the flags are part of the key), then the
    # bandwidth rows only; whichever is faster on the quantize rows sets NV_QUANT_NB (docs/benchmarks.md)
    if [ $BUILD_OK -eq 0 ]; then
        NB1=(env NVFP4_CUDA_NVCC_FLAGS=-DNV_QUANT_NB=1)
        run build_nb1 "$T_BUILD_NB1" "${NB1[@]}" "$PY" -m nvfp4_cuda build \
            && run bench_nvfp4_gpu_nb1 "$T_BENCH_NB1" "${NB1[@]}" "$PY" benchmarks/bench_nvfp4_gpu.py --no-gemm \
                --out-prefix "$OUT/bench_nvfp4_gpu_nb1"
        [ -f "$OUT/bench_nvfp4_gpu_nb1.md" ] && cat "$OUT/bench_nvfp4_gpu_nb1.md" >>"$REPORT"
    fi
fi

# ---- 6. training throughput: nvfp4 vs bf16 recipe, Minitron-4B shape --------------------------------------
if want 6; then
    if [ $BUILD_OK -eq 0 ]; then
        run bench_gpu_train "$T_TRAIN_BENCH" "$PY" benchmarks/bench_gpu_train.py --profile --out-json "$OUT/bench_gpu_train.json"
        sed -n '/^NemotronForCausalLM/,$p' "$OUT/bench_gpu_train.log" >>"$REPORT"
    else
        note "- **bench_gpu_train**: skipped (no library)"
    fi
fi

# ---- 7. MBXP generation throughput: dynamic vs static (compiled) KV cache, bf16 vs MXFP8 weights --------
# (prompts: .devrun/mbpp_release_v1.jsonl when carried, else synthetic ones of similar length)
if want 7; then
    run bench_generate "$T_GEN" "$PY" benchmarks/bench_generate.py --prompts 128 --new-tokens 128 --profile \
        --problems .devrun/mbpp_release_v1.jsonl --out-prefix "$OUT/bench_generate"
    [ -f "$OUT/bench_generate.md" ] && cat "$OUT/bench_generate.md" >>"$REPORT"
fi

# ---- 8. a sampled MBXP run on the GPU, end to end (generate, sandboxed execution, pass@k) -----------------
# of step 4's exported demo model, MXFP8-resident with the static compiled cache (needs the carried prompts)
if want 8; then
    if [ -f .devrun/mbpp_release_v1.jsonl ] && [ -f "$OUT/train_gpu/export/config.json" ]; then
        run mbxp_sampled "$T_MBXP" "$PY" -m ida_eval.mbxp --checkpoint "$OUT/train_gpu/export" \
            --problems .devrun/mbpp_release_v1.jsonl --limit 64 --samples-per-task 4 --temperature 0.8 --top-p 0.95 \
            --pass-at 1,4 \
            --batch-size 64 --max-new-tokens 128 --weights mxfp8 --cache static --out "$OUT/mbxp_sampled" --no-progress
        grep -E "^pass@|^generation" "$OUT/mbxp_sampled.log" | sed 's/^/  - /' >>"$REPORT"
    else
        note "- **mbxp_sampled**: skipped (no .devrun/mbpp_release_v1.jsonl or no exported demo model)"
    fi
fi

# ---- 7b. one sampling draw (top_p 0.95): a row's 256 candidates vs the whole row sorted, same tokens ---------
# (last: a few seconds that no other step should lose)
if want 7; then
    run bench_sampler "$T_SAMPLER" "$PY" benchmarks/bench_sampler.py --device cuda --vocab 32000 151936 256000
    sed -n '/^| vocab/,$p' "$OUT/bench_sampler.log" >>"$REPORT"
fi

# ---- 9. FSDP2 over NCCL, one rank: peak memory against ida_trainer.memory's count, a streamed save (2026-12-07)
if want 9; then
    run bench_fsdp_memory "$T_FSDP" "$PY" -m torch.distributed.run --nproc-per-node 1 benchmarks/bench_fsdp_memory.py
    grep -E "^(Qwen3-4B shape|count|measured|save)" "$OUT/bench_fsdp_memory.log" | sed 's/^/  - /' >>"$REPORT"
fi

note ""
note "Total: $(elapsed) s. $([ $FAILED -eq 0 ] && echo 'All steps passed.' || echo 'Some steps FAILED (see above).')"
echo "device_check: report in $REPORT"
exit $FAILED
