#!/usr/bin/env bash
# The emergence recipe across seeds on one GPU, in one call of at most 9 minutes: 3 seeds of
# MLM-only and 2 of MLM + NSP (configs/pretrain/emergence.yaml, float32), each with the role and
# SAS probe on UD English-EWT dev gold trees every 200 steps, held-out evaluation every 100 steps,
# checkpoints log-spaced and every 250 steps over the drop (1000–5000); then each run tracked on
# MRPC, SST-2 and QNLI dev (up to 1000 examples each) with --sas on EWT dev, onset intervals from
# 1000 paired resamples, uncorrected and Holm-corrected over the series. docs/emergence.md reads
# the outputs (docs/emergence/seeds/).
#
#   bash benchmarks/emergence_seeds.sh prepare   # here: shards, parses, wheels into .gpu-seeds/
#   bash benchmarks/emergence_seeds.sh run OUT   # there: the device machine, with .gpu-seeds carried
#   BERTJAX_SEEDS_SET=pre-ln bash benchmarks/emergence_seeds.sh run OUT
#       # the same, 3 MLM-only seeds of pre-LN with sinusoidal position initialisation (preln-s0..2):
#       # the post-LN / pre-LN comparison across seeds (docs/emergence.md), in a call of its own
#   BERTJAX_SEEDS_SET=steering bash benchmarks/emergence_seeds.sh run OUT
#       # issue 49's real-text experiment, in a call of its own: MLM-only seeds 0 and 1 unsteered
#       # (plain-s0, plain-s1), with prev and next suppressed on every head (positional-s0, -s1) and
#       # with [CLS] suppressed (cls-s0, -s1); tracked from step 1000, on the loss's plateau (the rule
#       # fixed before the runs, docs/emergence.md), each tarball with its per-sequence held-out sums;
#       # BERTJAX_SEEDS_STEERING_SEEDS="0" runs one seed's three runs (a CPU's way: with _SERIAL and
#       # _BUDGET, about an hour a run on 2 idle cores); `python docs/emergence_steering.py real --from OUT` reads them
#   BERTJAX_SEEDS_SET=gpu-size bash benchmarks/emergence_seeds.sh prepare   # into .gpu-size/
#   BERTJAX_SEEDS_SET=gpu-size bash benchmarks/emergence_seeds.sh run OUT
#       # issue 48's GPU-size recipe (configs/pretrain/emergence-gpu.yaml: 8 layers × 8 heads,
#       # hidden 512, T = 128, batch 256, bf16 on a GPU), seed 0 for its 10000 steps, checkpoints
#       # log-spaced and every 500 steps, tracked as the seeds are at T = 128, the tarball with its
#       # per-sequence held-out sums and the lead/lag replicates (the joint intervals);
#       # BERTJAX_SEEDS_GPU_SEEDS="1" (or "0 1", side by side), _STEPS and _EVERY change them
#
# The recipe's stream is cut to its first 12,000 documents (7.1 M tokens, 4 to 5 passes in 8000 steps)
# so that both objectives' shards travel within the 64 MiB the device takes; the vocabulary is
# trained on that cut and shared by the NSP data. The held-out set is prepared once, with the MLM
# data (no NSP pairs), and every run of every set is scored on it (heldout.data_dir): the recipes
# compare on the same held-out sequences and masks; the NSP runs report only its MLM metrics.
#
# BERTJAX_SEEDS_TINY=1 runs everything at toy size on any device (a dry run of the commands;
# tests/test_benchmarks.py runs it, both sets).
# Without a GPU: BERTJAX_SEEDS_SERIAL=1 runs the seeds one after another (a CPU gains nothing from
# running them side by side, and the first seeds finish early), BERTJAX_SEEDS_BUDGET=SECONDS lifts
# the per-stage time limits, and a run whose workdir holds checkpoints resumes from them.
# BERTJAX_SEEDS_CALL_S (default 540; none when tiny or under _BUDGET) is the device call's limit
# for all the stages together (benchmarks/call_budget.sh): the last stages are cut to fit it.
set -euo pipefail
source "$(dirname "$0")/call_budget.sh"
mode=${1:?usage: bash benchmarks/emergence_seeds.sh prepare | run OUT}
set_name=${BERTJAX_SEEDS_SET:-}
[[ $set_name == gpu-size ]] && carry=${BERTJAX_SEEDS_DIR:-.gpu-size} || carry=${BERTJAX_SEEDS_DIR:-.gpu-seeds}
prepared=${BERTJAX_SEEDS_PREPARED:-/tmp/bj-seeds}
work=${BERTJAX_SEEDS_WORK:-/tmp/bj-runs}
data=${BERTJAX_DATA:-../shared/data}
py=${PYTHON:-python3}
config=configs/pretrain/emergence.yaml length=64 objectives=(mlm nsp)
[[ $set_name == gpu-size ]] && config=configs/pretrain/emergence-gpu.yaml length=128 objectives=(gpu)
ewt=$carry/en_ewt-ud-dev.conllu
if [[ -n ${BERTJAX_SEEDS_TINY:-} ]]; then
  data_args=(data.max_documents=60 data.vocab_size=1000 heldout.sequences=64 heldout.batch_size=32 train.global_batch_size=4)
  train_args=(model.preset=tiny model.max_position_embeddings=$length train.steps=6 train.global_batch_size=4
    heldout.every=2 probe.every=3 probe.n=8 checkpoint.log_spaced=3 "checkpoint.steps=[4]")
  track_args=(--n 8 --sas-n 8 --bootstrap 50 --batch-size 8)
  # Generous: a dry run checks the commands, not their speed, on CPUs that may be shared.
  mlm_seeds=(0) nsp_seeds=(0) budget_train=600 budget_track=600 budget_series=600
else
  data_args=(data.max_documents=12000)
  train_args=(model.dtype=float32 heldout.every=100 probe.every=200
    "checkpoint.steps=[1000,1250,1500,1750,2000,2250,2500,2750,3000,3250,3500,3750,4000,4250,4500,4750,5000]")
  track_args=(--n 1000 --sas-n 1000 --bootstrap 1000 --batch-size 128)
  mlm_seeds=(0 1 2) nsp_seeds=(0 1) budget_train=280 budget_track=190
fi
# The second track pass (tests and figures from the cache) takes well under a minute on a GPU, more on a CPU.
budget_series=${budget_series:-60}
call_limit=${BERTJAX_SEEDS_CALL_S-540}
[[ -z ${BERTJAX_SEEDS_TINY:-} ]] || call_limit=${BERTJAX_SEEDS_CALL_S-}
if [[ -n ${BERTJAX_SEEDS_BUDGET:-} ]]; then
  budget_train=$BERTJAX_SEEDS_BUDGET budget_track=$BERTJAX_SEEDS_BUDGET budget_series=$BERTJAX_SEEDS_BUDGET
  call_limit=${BERTJAX_SEEDS_CALL_S-}
fi
if [[ $set_name == pre-ln ]]; then
  train_args+=(model.layer_norm_position=pre model.position_embedding_init=sinusoidal) nsp_seeds=() mlm_name=preln
elif [[ $set_name == steering ]]; then
  nsp_seeds=() mlm_name=plain steering=(positional cls)
  # The events' window starts on the plateau, after the first (unigram) descent.
  if [[ -n ${BERTJAX_SEEDS_TINY:-} ]]; then window_from=4; else mlm_seeds=(0 1) window_from=1000; fi
  # A CPU runs the set a seed at a time (BERTJAX_SEEDS_STEERING_SEEDS=0, then 1): serially, a seed's
  # three runs finish before the next seed starts.
  [[ -z ${BERTJAX_SEEDS_STEERING_SEEDS:-} ]] || read -ra mlm_seeds <<<"$BERTJAX_SEEDS_STEERING_SEEDS"
elif [[ $set_name == gpu-size ]]; then
  # The recipe's 10000 steps, one seed a call (two medium runs side by side ran ~19 steps/s each on
  # an H200: 10000 steps of two would fill a call without their tracks). The 2026-11-28 runs:
  # BERTJAX_SEEDS_GPU_SEEDS="0 1" BERTJAX_SEEDS_GPU_STEPS=3000 BERTJAX_SEEDS_GPU_EVERY=250, track 170 s.
  read -ra mlm_seeds <<<"${BERTJAX_SEEDS_GPU_SEEDS:-0}"
  nsp_seeds=() mlm_name=gpu keep_sums=1
  steps=${BERTJAX_SEEDS_GPU_STEPS:-10000} every=${BERTJAX_SEEDS_GPU_EVERY:-500}
  [[ -n ${BERTJAX_SEEDS_TINY:-} ]] || train_args=(heldout.every=100 probe.every=200 probe.max_length=128
    train.steps="$steps" "checkpoint.steps=[$(seq -s, "$every" "$every" "$steps")]")
  budget_train=${BERTJAX_SEEDS_BUDGET:-330} budget_track=${BERTJAX_SEEDS_BUDGET:-220}
elif [[ -n $set_name ]]; then
  echo "error: BERTJAX_SEEDS_SET must be pre-ln, steering, gpu-size or unset, got $set_name" >&2; exit 2
else
  mlm_name=mlm
fi
declare -A interventions=([positional]="[{role: prev, mode: suppress}, {role: next, mode: suppress}]"
                          [cls]="[{role: cls, mode: suppress}]")
nsp_args=(data.pair_task=nsp data.train_vocab=false "data.vocab_file=$prepared/mlm/data-T64/vocab.txt")
heldout_args=("heldout.corpora=[]" "heldout.data_dir=$prepared/${objectives[0]}/heldout-T$length")
parse_args=(--cache-dir "$carry/parses" --spacy-model "$carry/spacy-model")

prepare() {
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  rm -rf "$carry"
  mkdir -p "$carry/spacy-model" "$carry/glue" "$prepared"
  for task in MRPC SST-2 QNLI; do mkdir -p "$carry/glue/$task" && cp "$data/glue/$task/dev.tsv" "$carry/glue/$task/"; done
  cp "$data/ud_english_ewt/en_ewt-ud-dev.conllu" "$ewt"
  "$py" -c 'import json; from sieves.parse import _installed_meta; print(json.dumps(_installed_meta(None)[1]))' \
    >"$carry/spacy-model/meta.json"
  # The tracks' texts into the parse cache (no spaCy there).
  "$py" -m benchmarks.roles_overhead --glue-dir "$carry/glue" --tasks mrpc,sst2,qnli:dev --n "${track_args[1]}" \
    --random-preset tiny --vocab "$data/vocab/bert-base-uncased-vocab.txt" --cache-dir "$prepared/parses" \
    --export-parses "$prepared/parses.json"
  cp -r "$prepared/parses" "$carry/parses"
  [[ -d $prepared/${objectives[0]}/data-T$length ]] || "$py" -m train.pretrain --config "$config" \
    --workdir "$prepared/${objectives[0]}" --prepare-only "${data_args[@]}"
  if [[ ${objectives[*]} == *nsp* && ! -d $prepared/nsp/data-T64 ]]; then
    "$py" -m train.pretrain --config "$config" --workdir "$prepared/nsp" \
      --prepare-only "${data_args[@]}" "${nsp_args[@]}" "heldout.corpora=[]"
  fi
  for objective in "${objectives[@]}"; do cp -r "$prepared/$objective" "$carry/$objective"; done
  rm -rf "$carry"/*/.*.lock
  [[ -n ${BERTJAX_SEEDS_TINY:-} ]] || "$py" -m pip download -q --no-deps --only-binary=:all: -d "$carry/wheels" --python-version 3.12 \
    --platform manylinux2014_x86_64 omegaconf==2.4.0 tensorboardX==2.6.5 conllu==6.0.0
  du -sh "$carry"
}

# Each run: pretrain (resumable; a stage out of time saves a checkpoint on SIGTERM), then track.
one_run() {
  local name=$1 objective=$2 seed=$3 condition=${4:-} extra=() steps=()
  [[ $objective == nsp ]] && extra=("${nsp_args[@]}")
  [[ -n $condition ]] && extra+=("intervene=${interventions[$condition]}")
  # The shards and the one held-out set stay where they were prepared (data_dir, heldout.data_dir).
  [[ -d $work/$name/checkpoints ]] || rm -rf "$work/$name"
  timeout --signal=TERM --kill-after=20 "$(call_budget "$budget_train" 20)" "$py" -m train.pretrain --config "$config" \
    --workdir "$work/$name" "${data_args[@]}" "${extra[@]}" "${train_args[@]}" "${heldout_args[@]}" train.seed="$seed" \
    "data_dir=$prepared/$objective/data-T$length" \
    "probe.task=conllu:$(realpath "$ewt")" >"$work/$name.train.log" 2>&1 || echo "$name: pretrain exit $?" >>"$work/$name.train.log"
  if [[ -n ${window_from:-} && -d $work/$name/checkpoints ]]; then
    steps=(--steps "$(ls "$work/$name/checkpoints" | grep -E '^[0-9]+$' | sort -n | awk -v from="$window_from" \
      '$1 >= from' | paste -sd,)")
  fi
  for scope in none series; do
    local correction=() out=track
    [[ $scope == series ]] && correction=(--correction holm --correction-scope series) out=track-holm-series
    # The second pass reads every step from the cache: tests and figures only.
    timeout --signal=TERM --kill-after=20 "$(call_budget "$([[ $scope == none ]] && echo "$budget_track" || echo "$budget_series")" 20)" \
      "$py" -m analysis.track --run "$work/$name" \
      --task mrpc,sst2,qnli --glue-dir "$carry/glue" --max-length "$length" "${track_args[@]}" "${steps[@]+"${steps[@]}"}" --sas "$ewt" \
      "${parse_args[@]}" "${correction[@]}" --scores-cache "$work/$name.cache" --out "$work/$name/$out" \
      >"$work/$name.$out.log" 2>&1 || echo "$name: $out exit $?" >>"$work/$name.$out.log"
  done
}

run() {
  out=${1:?usage: bash benchmarks/emergence_seeds.sh run OUT}
  call_start "$call_limit"
  mkdir -p "$out" "$work" "$prepared"
  if compgen -G "$carry/wheels/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
      "$carry"/wheels/*.whl
    export PYTHONPATH=$work/site
  fi
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  # Five processes share the GPU: none may take most of its memory up front.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
  for objective in "${objectives[@]}"; do rm -rf "${prepared:?}/$objective" && cp -r "$carry/$objective" "$prepared/"; done
  "$py" - "$out/env.json" <<'EOF'
import importlib.metadata as m, json, sys, jax
names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "numpy")
env = {"devices": [str(d) for d in jax.devices()], "versions": {n: m.version(n) for n in names}}
open(sys.argv[1], "w").write(json.dumps(env) + "\n")
EOF
  local pids=() names=() runs=()
  for seed in "${mlm_seeds[@]}"; do runs+=("$mlm_name-s$seed ${objectives[0]} $seed"); done
  for seed in "${nsp_seeds[@]+"${nsp_seeds[@]}"}"; do runs+=("nsp-s$seed nsp $seed"); done
  for condition in "${steering[@]+"${steering[@]}"}"; do
    for seed in "${mlm_seeds[@]}"; do runs+=("$condition-s$seed mlm $seed $condition"); done
  done
  for spec in "${runs[@]}"; do
    set -- $spec
    names+=("$1")
    if [[ -n ${BERTJAX_SEEDS_SERIAL:-} ]]; then one_run "$@"; else one_run "$@" & pids+=($!); fi
  done
  for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid" || true; done
  for name in "${names[@]}"; do
    # The steering and gpu-size sets keep the per-sequence held-out sums and the lead/lag replicates:
    # their comparisons pair held-out sequences, and their joint intervals regenerate from them.
    tar czf "$out/$name.tar.gz" -C "$work" --exclude=checkpoints --exclude='data-T*' \
      $([[ -n ${steering+x}${keep_sums:-} ]] || echo "--exclude=*.npz") --exclude=tokenizer --exclude=tensorboard "$name" \
      $(cd "$work" && echo "$name".*.log)
  done
  tail -n 3 "$work"/*.log
}

case $mode in
  prepare) prepare ;;
  run) run "${2:-}" ;;
  *) echo "error: unknown mode $mode (prepare or run)" >&2; exit 2 ;;
esac
