#!/usr/bin/env bash
# The whole pipeline on the embedded synthetic dataset, through local doubles of B2 and GCS:
#   synth -> upload to the B2 double -> octstage mirror b2: -> GCS double -> audit-ids (from GCS)
#   -> build-cache (from GCS) -> mirror the cache to GCS -> stage to "local SSD" -> verify
#   -> octtrain pretrain -> finetune -> evaluate (test metrics table) -> embed (Parquet tables).
# The cache carries each participant's HbA1c (OMOP concept 3004410, from clinical_data/), so
# scripts/demo-hba1c.sh can then fine-tune macula-only on it (regression) from the same run.
# Usage: scripts/demo.sh [OUT_DIR]   (make demo calls it with the venv's bin on PATH)
set -euo pipefail
OUT=${1:-demo-output}
rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=${WANDB_MODE:-offline} WANDB_DIR="$OUT"
# Rich draws tables to the terminal width; a pipe or CI log has none, so give it room.
export COLUMNS=${COLUMNS:-120}

step() { printf '\n\033[1;36m== %s\033[0m\n' "$*"; }

step "1/13 synthetic AI-READI-like dataset"
octstage synth "$OUT/dataset" --participants 60 --seed 0

step "2/13 start the B2 and GCS doubles on loopback"
python -m tests.doubles serve --env-file "$OUT/doubles.env" \
  --b2-bucket aireadi --gcs-bucket mirror --gcs-bucket cache &
DOUBLES=$!
trap 'kill $DOUBLES 2>/dev/null || true; wait $DOUBLES 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do [ -f "$OUT/doubles.env" ] && break; sleep 0.5; done
# shellcheck disable=SC1091
. "$OUT/doubles.env"

step "3/13 upload the dataset into the B2 double"
python -m tests.doubles upload-b2 "$OUT/dataset" b2://aireadi/v3

step "4/13 mirror B2 -> GCS (rclone copy, SHA1 verified at the destination)"
octstage mirror b2:aireadi/v3 gs://mirror/v3 --transfers 8 --json "$OUT/mirror.json"
step "    again: an unchanged source transfers 0 bytes"
octstage mirror b2:aireadi/v3 gs://mirror/v3 --transfers 8 --json "$OUT/mirror-again.json"

step "5/13 audit participant IDs (labels vs OCT, checked against retinal_oct/manifest.tsv) from GCS"
octstage audit-ids --labels gs://mirror/v3/participants.tsv --oct gs://mirror/v3 \
  --json "$OUT/audit.json" --plot "$OUT/audit.png" --min-overlap 0.5

step "6/13 build the Zarr cache from GCS (dask, 2 workers; HbA1c copied); rejected files expected"
octstage build-cache --source gs://mirror/v3 --labels gs://mirror/v3/participants.tsv \
  --out "$OUT/cache" --manifest "$OUT/cache/manifest.json" --config configs/stage/demo.yaml --workers 2 \
  --concept 3004410 --manifest-form table --json "$OUT/build.json" || [ $? -eq 1 ]

step "7/13 publish the cache to GCS"
octstage mirror "$OUT/cache" gs://cache/demo --transfers 8 --json "$OUT/publish.json"

step "8/13 stage the cache to local SSD (verified against the manifest)"
octstage stage gs://cache/demo "$OUT/ssd" --json "$OUT/stage.json"

step "9/13 verify the staged cache"
octstage verify "$OUT/ssd/manifest.json"

step "10/13 pretrain a small 3D V-JEPA on the staged cache (CPU; W&B offline)"
octtrain pretrain --config configs/pretrain/demo.yaml --manifest "$OUT/ssd/manifest.json" \
  train.run_dir="$OUT/runs/pretrain"

step "11/13 finetune the EMA encoder for the 4 study groups"
octtrain finetune --config configs/finetune/demo.yaml --manifest "$OUT/ssd/manifest.json" \
  --init "$OUT/runs/pretrain/checkpoints" train.run_dir="$OUT/runs/finetune"

step "12/13 evaluate on the test split"
octtrain evaluate --checkpoint "$OUT/runs/finetune/checkpoints" \
  --manifest "$OUT/ssd/manifest.json" --split test --out "$OUT/eval"

step "13/13 export the EMA encoder's embedding of every volume and participant (Parquet)"
octtrain embed --checkpoint "$OUT/runs/pretrain/checkpoints" --manifest "$OUT/ssd/manifest.json" \
  --out "$OUT/embeddings"

step "done: outputs in $OUT"
printf '  %s\n' "audit: audit.json audit.png" "cache QC sheet: cache/qc.png" \
  "metrics: runs/*/metrics.jsonl" "test metrics: eval/metrics-test.json eval/confusion-test.png" \
  "embeddings: embeddings/parts/part-*.parquet (one row per volume), embeddings/participants.parquet, embeddings/embed.json"
