#!/usr/bin/env bash
# The accelerator rows of BENCHMARKS.md on one GPU: BERT-base T = 128 bf16 pre-training steps (MFU),
# the step's kernel-level profile, and the 4-task analysis. Run from the repository root:
#   bash benchmarks/gpu.sh OUT_DIR GLUE_DIR VOCAB PARSES
# PARSES: a JSON from `python -m benchmarks.roles_overhead ... --export-parses` (lets a machine
# without spaCy analyse exactly the parses made elsewhere). JSON lines land in OUT_DIR/*.jsonl and
# the profiler trace under OUT_DIR/trace (read it with `python -m benchmarks.trace_kernels`).
set -euo pipefail
out=$1 glue=$2 vocab=$3 parses=$4
py=${PYTHON:-python3}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.csv"
"$py" -m benchmarks.train_step --preset base --backends bertjax --dtype bfloat16 --batch-size 256 \
  --repeat 20 | tee -a "$out/train_step.jsonl"
"$py" -m benchmarks.step_profile --preset base --batch-size 256 --parts forward,step --repeat 20 \
  --trace "$out/trace" | tee -a "$out/step_profile.jsonl"
roles() {
  "$py" -m benchmarks.roles_overhead --random-preset base --vocab "$vocab" --glue-dir "$glue" \
    --tasks qnli,qqp:dev mrpc,sst2:train --parses "$parses" "$@" | tee -a "$out/roles_overhead.jsonl"
}
# Twice, in fresh processes sharing a fresh compilation cache: the second's first_run_s is a new
# process's analysis with the compiled programs on disk.
JAX_COMPILATION_CACHE_DIR="$out/xla-cache" roles --repeat 3
JAX_COMPILATION_CACHE_DIR="$out/xla-cache" roles --repeat 1
# Once more on an empty cache with XLA's GEMM autotuning off: the analysis's forward passes take
# well under a second in all, so autotuning them may cost more than it saves (first_run_stages_s
# shows the scoring stage, where compilation lands, beside the warm forward time).
JAX_COMPILATION_CACHE_DIR="$out/xla-cache-untuned" XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" roles --repeat 1
# Row 8: the scoring stage on 1 device and on all of them (positional roles: no parser needed).
"$py" -m benchmarks.scale --random-preset base --vocab "$vocab" --glue-dir "$glue" \
  --roles local,prev,next,block,cls,sep,delimiter --repeat 3 | tee -a "$out/scale.jsonl"
