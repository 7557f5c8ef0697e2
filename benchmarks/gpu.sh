#!/usr/bin/env bash
# One GPU session: every accelerator row of BENCHMARKS.md and the GPU emergence run, each set in one
# device call (its stages' budgets sum to at most 9 minutes of the call's 10). Run from the
# repository root:
#
#   bash benchmarks/gpu.sh prepare             # here, once: needs spaCy and the package registry
#   bash benchmarks/gpu.sh run OUT [SET]       # there: the device machine, with .gpu carried
#
# SET `bench` (the default; issue 50's rows): 6a, bertjax's step beside the torch baseline (eager
# and torch.compile, bf16 autocast, SDPA, fused AdamW) in one process, then bertjax with rbg dropout
# masks, and with those and attention dropout 0 beside torch.compile; 6b, the 4-task analysis cold
# then warm, each with its stages' seconds; 8, the scoring stage on 1 device and on all. SET
# `emergence`: row 14, the `intervene` section's cost per step (base then mini, batch 32 × 128, the
# unsteered step beside prev+next and [CLS] suppressed), then the GPU emergence run and its track.
# `all`: both, one after the other (more than one call's 10 minutes at full size: run the sets in
# two calls there).
#
# `prepare` fills .gpu/ (git-ignored; a few tens of MiB, so that it travels with the working tree):
# the staged GLUE and vocabulary, the parses of every text analysed there (no spaCy there), the
# emergence run's prepared shards, and wheels of the pure-Python packages the device image lacks
# (omegaconf, tensorboardX). JAX, flax, optax and orbax are the image's: JAX's CUDA wheels are too
# large to carry, and flax 0.12.8, the pin, does not import under the image's JAX 0.11 (BENCHMARKS.md,
# 2026-11-23); env.json records the versions that ran.
# `run` writes under OUT: env.json, one JSONL per benchmark (6a train_step, 6b roles_overhead
# cold then warm, 8 scale, 14 intervene_cost), stages.jsonl (each stage's exit status and seconds,
# under a time budget that ends a stage, not the session), log.txt and emergence.tar.gz (the run's
# run.json, metrics and the track's tables).
#
# BERTJAX_GPU_TINY=1 runs both at tiny sizes on any device (tests/test_benchmarks.py dry-runs it
# on the CPU); BERTJAX_GPU_DIR (default .gpu) and BERTJAX_GPU_WORK (default /tmp/bertjax-gpu)
# move the carried folder and the work folder; EMERGENCE_STEPS (default 2000) sets the run's length;
# BERTJAX_GPU_CALL_S (default 540 at full size, none when tiny) is the call's limit for the stages
# (benchmarks/call_budget.sh).
set -euo pipefail
source "$(dirname "$0")/call_budget.sh"
mode=${1:?usage: bash benchmarks/gpu.sh prepare | run OUT}
carry=${BERTJAX_GPU_DIR:-.gpu}
# The emergence run's workdir has the same absolute path here and there: its held-out shards name
# the vocabulary by absolute path.
work=${BERTJAX_GPU_WORK:-/tmp/bertjax-gpu}
data=${BERTJAX_DATA:-../shared/data}
py=${PYTHON:-python3}
tiny=${BERTJAX_GPU_TINY:-}
steps=${EMERGENCE_STEPS:-2000}

if [[ -n $tiny ]]; then
  analysis_tasks=(mrpc:train) analysis_n=8 preset=tiny track=(--task mrpc --n 8)
  step_args=(--tiny --repeat 2) scale_args=(--task mrpc --n 8 --repeat 1) roles_repeat=1
  cost_args=(--preset tiny --batch-size 2 --seq-len 32 --repeat 2 --warmup 0)
  # One small book trains and another is held out, so that preparing takes seconds.
  emergence=(model.preset=tiny train.steps=3 train.global_batch_size=4 train.log_every=1 data.vocab_size=1000
    "data.corpora=[{name: alice, source: local, path: $data/gutenberg/carroll-alice.txt, kind: gutenberg}]"
    "heldout.corpora=[{name: blake, source: local, path: $data/gutenberg/blake-poems.txt, kind: gutenberg}]"
    heldout.sequences=8 heldout.batch_size=4 checkpoint.log_spaced=2)
  # Generous: a dry run checks the commands, not their speed, on CPUs that may be shared.
  budget=(6a=900 6a-rbg=900 6a-attn0=900 6b-cold=600 6b-warm=600 8=600 14=600 emergence=600 track=600)
  call_limit=${BERTJAX_GPU_CALL_S-}
else
  analysis_tasks=(qnli,qqp:dev mrpc,sst2:train) analysis_n=1000 preset=base track=(--task mrpc,sst2 --n 200)
  step_args=(--preset base --dtype bfloat16 --batch-size 256 --repeat 20)
  scale_args=(--repeat 3) roles_repeat=3
  cost_args=(--preset base,mini --batch-size 32 --seq-len 128 --repeat 10)
  # The recipe's first 12,000 documents of the mixed stream (weights keep both corpora in
  # proportion): ~10 M tokens, whose shards (~25 MiB) travel within the 64 MiB the device takes.
  emergence=(train.steps="$steps" data.max_documents=12000)
  # Seconds per stage, 540 for `bench` (6a: bertjax's ~40 s compile, torch.compile's, 3 × 22 steps;
  # 6b: a cold first run took 48 s, a warm one 5.4 s) and 370 for `emergence` (14: six steps
  # compiled, three of base at ~40 s each as in 6a; it rides with the emergence run because
  # `bench` has no time left): a minute of each call's 10 is left for the set-up, a stage's
  # 15 s of grace after its budget, and the transfers; should a stage overrun, call_budget.sh cuts the
  # later ones to what is left.
  budget=(6a=200 6b-cold=90 6b-warm=40 6a-rbg=60 6a-attn0=100 8=50 14=200 emergence=110 track=60)
  call_limit=${BERTJAX_GPU_CALL_S-540}
fi
emergence_config=(--config configs/pretrain/emergence-gpu.yaml --workdir "$work/emergence-gpu" "${emergence[@]}")
# The parses there: a spaCy model directory holding only meta.json names the cache's keys, and a
# cache holding every text never loads spaCy.
parse_args=(--cache-dir "$carry/parses" --spacy-model "$carry/spacy-model")

prepare() {
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  rm -rf "$carry" "$work/emergence-gpu"
  mkdir -p "$carry/spacy-model" "$work"
  cp -r "$data/glue" "$carry/glue"
  cp "$data/vocab/bert-base-uncased-vocab.txt" "$carry/vocab.txt"
  "$py" -c 'import json, sys; from sieves.parse import _installed_meta; print(json.dumps(_installed_meta(None)[1]))' \
    >"$carry/spacy-model/meta.json"
  # Row 6b's texts, as JSON (roles_overhead --parses); the track's, into the parse cache.
  "$py" -m benchmarks.roles_overhead --glue-dir "$carry/glue" --tasks "${analysis_tasks[@]}" --n "$analysis_n" \
    --random-preset tiny --vocab "$carry/vocab.txt" --export-parses "$carry/parses.json"
  task=${track[1]}
  "$py" -m benchmarks.roles_overhead --glue-dir "$carry/glue" --tasks "$task:dev" --n "${track[3]}" \
    --random-preset tiny --vocab "$carry/vocab.txt" --cache-dir "$carry/parses" --export-parses "$work/track-parses.json"
  "$py" -m train.pretrain "${emergence_config[@]}" --prepare-only
  cp -r "$work/emergence-gpu" "$carry/emergence-gpu"
  if [[ -z $tiny ]]; then
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$carry/wheels" \
      omegaconf==2.4.0 tensorboardX==2.6.5
  fi
  du -sh "$carry"
}

# stage NAME CMD...: CMD under NAME's time budget, its stdout appended to OUT/NAME's JSONL file;
# a stage that fails or runs out of time is recorded and the session goes on.
stage() {
  local name=$1 seconds start rc=0 target
  shift
  for entry in "${budget[@]}"; do [[ ${entry%%=*} == "$name" ]] && seconds=${entry#*=}; done
  seconds=$(call_budget "$seconds" 15)
  # The benchmarks print JSON lines; the emergence run and the track print progress and tables.
  target=$out/${name%%-*}.jsonl
  [[ $name == [0-9]* ]] || target=/dev/stderr
  echo "== $name (${seconds} s at most): $*" >&2
  start=$EPOCHREALTIME
  timeout --signal=TERM --kill-after=15 "$seconds" "$@" >>"$target" || rc=$?
  awk -v name="$name" -v rc="$rc" -v s="$(awk "BEGIN {print $EPOCHREALTIME - $start}")" -v b="$seconds" \
    'BEGIN {printf "{\"stage\": \"%s\", \"rc\": %d, \"seconds\": %.1f, \"budget_s\": %d}\n", name, rc, s, b}' |
    tee -a "$out/stages.jsonl" >&2
  [[ $rc == 0 ]] || failed=1
}

run() {
  out=${1:?usage: bash benchmarks/gpu.sh run OUT [bench|emergence|all]}
  set=${2:-bench}
  [[ $set == @(bench|emergence|all) ]] || { echo "error: unknown set $set (bench, emergence or all)" >&2; exit 2; }
  call_start "$call_limit"
  mkdir -p "$out" "$work"
  exec 2> >(tee -a "$out/log.txt" >&2)
  failed=0
  if compgen -G "$carry/wheels/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
      "$carry"/wheels/*.whl >&2
    export PYTHONPATH=$work/site
  fi
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  "$py" - "$out/env.json" <<'EOF'
import importlib.metadata as m, json, sys, jax
names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "torch", "numpy")
env = {"devices": [str(d) for d in jax.devices()], "versions": {n: m.version(n) for n in names}}
open(sys.argv[1], "w").write(json.dumps(env) + "\n")
print(json.dumps(env), file=sys.stderr)
EOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv >&2
  vocab=$carry/vocab.txt glue=$carry/glue
  [[ $set == emergence ]] || bench
  [[ $set == bench ]] || emergence_run
  return "$failed"
}

bench() {
  # 6a: BERT-base T = 128 bf16 pre-training steps (MFU), and the same step in HF's PyTorch as its
  # users run it, eager and compiled, timed interleaved: the rows are ratios to it.
  # Ordered by worth, the issue's targets first, should a stage overrun.
  stage 6a "$py" -m benchmarks.train_step "${step_args[@]}" --backends bertjax,torch,torch-compile
  # 6b: the 4-task analysis twice, in fresh processes sharing a fresh compilation cache: the first's
  # first_run_s is a cold process's, the second's a new process's with the programs on disk.
  roles=("$py" -m benchmarks.roles_overhead --random-preset "$preset" --vocab "$vocab" --glue-dir "$glue"
    --tasks "${analysis_tasks[@]}" --n "$analysis_n" --parses "$carry/parses.json")
  rm -rf "$work/xla-cache"
  JAX_COMPILATION_CACHE_DIR=$work/xla-cache stage 6b-cold "${roles[@]}" --repeat "$roles_repeat"
  JAX_COMPILATION_CACHE_DIR=$work/xla-cache stage 6b-warm "${roles[@]}" --repeat 1
  # Issue 50 item 1, what each change buys: the dropout masks from rbg (train.dropout_rng), then
  # also attention dropout 0 (the emergence recipes'; jax.nn.dot_product_attention) beside
  # torch.compile at the same recipe.
  stage 6a-rbg "$py" -m benchmarks.train_step "${step_args[@]}" --backends bertjax --dropout-rng rbg
  stage 6a-attn0 "$py" -m benchmarks.train_step "${step_args[@]}" --backends bertjax,torch-compile --dropout-rng rbg \
    --attention-dropout 0
  # 8: the scoring stage on 1 device and on all (positional roles: no parser needed).
  stage 8 "$py" -m benchmarks.scale --random-preset "$preset" --vocab "$vocab" --glue-dir "$glue" \
    --roles local,prev,next,block,cls,sep,delimiter "${scale_args[@]}"
}

emergence_run() {
  # 14: the unsteered pre-training step beside the steered ones, interleaved (bf16: model.dtype auto).
  stage 14 "$py" -m benchmarks.intervene_cost "${cost_args[@]}"
  # The emergence run on the shards prepared here (a stage out of time saves a checkpoint and
  # stops, on SIGTERM), then its roles over the checkpoints it saved.
  rm -rf "$work/emergence-gpu" "$work/track"
  cp -r "$carry/emergence-gpu" "$work/emergence-gpu"
  stage emergence "$py" -m train.pretrain "${emergence_config[@]}"
  stage track "$py" -m analysis.track --run "$work/emergence-gpu" "${track[@]}" --glue-dir "$glue" \
    "${parse_args[@]}" --out "$work/track"
  tar czf "$out/emergence.tar.gz" -C "$work" --exclude=checkpoints --exclude='data-T*' --exclude='heldout-T*' \
    --exclude='*.npz' emergence-gpu $([[ -d $work/track ]] && echo track)
}

case $mode in
  prepare) prepare ;;
  run) run "${2:-}" "${3:-}" ;;
  *) echo "error: unknown mode $mode (prepare or run)" >&2; exit 2 ;;
esac
