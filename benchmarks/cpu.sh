#!/usr/bin/env bash
# The CPU rows of BENCHMARKS.md, one after another on an otherwise idle machine. From the repository
# root, with the test extra installed (torch, all-MiniLM-L6-v2, spaCy's model):
#   bash benchmarks/cpu.sh OUT_DIR [DATA_DIR]      # DATA_DIR: the staged data (default ../shared/data)
# Every JSON line lands in OUT_DIR/<benchmark>.jsonl; progress goes to OUT_DIR/<benchmark>.log.
set -euo pipefail
out=$1 data=${2:-../shared/data}
mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
bench() { local name=$1; shift; "$py" -m "benchmarks.$name" "$@" >>"$out/$name.jsonl" 2>>"$out/$name.log"; }
bench sieve_kernel --repeat 10
bench input_pipeline --data "$data"
bench roles_memory --glue-dir "$data/glue"
bench roles_overhead --glue-dir "$data/glue" --repeat 3
bench roles_overhead --glue-dir "$data/glue" --repeat 3 --no-figures
bench track_cache --glue-dir "$data/glue" --vocab "$data/vocab/bert-base-uncased-vocab.txt" --repeat 3
bench cli_start --repeat 5
bench attention_norms --glue-dir "$data/glue" --repeat 3
bench scale --glue-dir "$data/glue" --repeat 5
bench train_step --repeat 5
bench train_step --repeat 5 --reuse-freed-memory
bench roles_overhead --random-preset base --vocab "$data/vocab/bert-base-uncased-vocab.txt" --glue-dir "$data/glue" --repeat 1
