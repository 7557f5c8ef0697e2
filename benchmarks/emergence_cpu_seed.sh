#!/usr/bin/env bash
# One seed of the emergence recipe (MLM only) on a CPU, trained and tracked as
# benchmarks/emergence_seeds.sh's one_run does on a GPU, with the per-sequence held-out sums that
# the joint intervals need; its small files are copied into docs/emergence/events/<name>/, which
# docs/emergence.md's "One run tracked with event times" section reads. Resumable: run it again.
#
#   bash benchmarks/emergence_seeds.sh prepare          # once: shards, parses, EWT into .gpu-seeds/
#   bash benchmarks/emergence_cpu_seed.sh mlm-s0 0      # ~100 min train + ~4 min track on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-mlm-s0} seed=${2:-0}
work=${BERTJAX_SEEDS_WORK:-/tmp/bj-runs} prepared=${BERTJAX_SEEDS_PREPARED:-/tmp/bj-seeds} carry=.gpu-seeds
py=${PYTHON:-.venv/bin/python}
mkdir -p "$work"
if [[ ! -d $work/$name/checkpoints ]]; then
  rm -rf "${work:?}/$name" && mkdir -p "$work/$name" && cp -r "$prepared/mlm/heldout-T64" "$work/$name/"
fi
"$py" -m train.pretrain --config configs/pretrain/emergence.yaml --workdir "$work/$name" \
  data.max_documents=12000 model.dtype=float32 heldout.every=100 probe.every=200 \
  "checkpoint.steps=[1000,1250,1500,1750,2000,2250,2500,2750,3000,3250,3500,3750,4000,4250,4500,4750,5000]" \
  train.seed="$seed" "data_dir=$prepared/mlm/data-T64" "probe.task=conllu:$(realpath "$carry/en_ewt-ud-dev.conllu")"
"$py" -m analysis.track --run "$work/$name" --task mrpc,sst2,qnli --glue-dir "$carry/glue" --max-length 64 \
  --n 1000 --sas-n 1000 --bootstrap 1000 --batch-size 128 --sas "$carry/en_ewt-ud-dev.conllu" \
  --cache-dir "$carry/parses" --spacy-model "$carry/spacy-model" --scores-cache "$work/$name.cache" \
  --out "$work/$name/track" --overwrite
dest=docs/emergence/events/$name
rm -rf "$dest" && mkdir -p "$dest/track"
cp "$work/$name"/{config.yaml,metrics.jsonl,run.json} "$dest/"
cp -r "$work/$name/heldout-sequences" "$dest/"
for f in onset.csv curve_onsets.csv events.csv curve_events.csv lead_lag.csv lead_lag_replicates.npz \
  robustness.csv sas.csv sas_margin.csv run.json mrpc_onset.png; do
  cp "$work/$name/track/$f" "$dest/track/"
done
gzip -nc "$work/$name/track/track.csv" >"$dest/track/track.csv.gz"
du -sh "$dest"
