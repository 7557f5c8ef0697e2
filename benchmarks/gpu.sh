#!/usr/bin/env bash
# The accelerator rows of BENCHMARKS.md: BERT-base T = 128 bf16 pre-training steps (MFU) and the
# 4-task analysis, on one GPU. Run from the repository root:
#   bash benchmarks/gpu.sh OUT_DIR GLUE_DIR VOCAB PARSES
# PARSES: a JSON from `python -m benchmarks.roles_overhead ... --export-parses` (lets a machine
# without spaCy analyse exactly the parses made elsewhere); every line lands in OUT_DIR/*.jsonl.
set -euo pipefail
out=$1 glue=$2 vocab=$3 parses=$4
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.csv"
for batch in 128 256 512; do
  python3 -m benchmarks.train_step --preset base --backends bertjax --dtype bfloat16 \
    --batch-size "$batch" --repeat 20 | tee -a "$out/train_step.jsonl"
done
python3 -m benchmarks.roles_overhead --random-preset base --vocab "$vocab" --glue-dir "$glue" \
  --tasks qnli,qqp:dev mrpc,sst2:train --parses "$parses" --repeat 3 | tee -a "$out/roles_overhead.jsonl"
