#!/usr/bin/env bash
# The second demo run: fine-tune macula scans only on a clinical concept, HbA1c (OMOP 3004410),
# as a regression, from the pretraining run of `make demo`, then report the test split's MAE.
#   octtrain finetune (configs/finetune/demo-hba1c.yaml: data.select.region [Macula],
#   data.label concept 3004410, task regression) -> octtrain evaluate (MAE, RMSE, R^2)
# The cache `make demo` built carries each participant's HbA1c (build-cache --concept 3004410;
# missing codes 555/777/888/999 dropped and counted in the manifest's "concepts"); in the
# synthetic twin HbA1c rises with the ONL thickness the volumes show, so it is learnable.
# Usage: scripts/demo-hba1c.sh [OUT_DIR]   (the OUT_DIR of scripts/demo.sh; make demo-hba1c)
set -euo pipefail
OUT=${1:-demo-output}
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=${WANDB_MODE:-offline} WANDB_DIR="$OUT"
export COLUMNS=${COLUMNS:-120}
if [ ! -f "$OUT/ssd/manifest.json" ] || [ ! -d "$OUT/runs/pretrain/checkpoints" ]; then
  echo "demo-hba1c: run scripts/demo.sh $OUT (make demo) first" >&2
  exit 2
fi

step() { printf '\n\033[1;36m== %s\033[0m\n' "$*"; }

step "1/2 finetune macula-only on HbA1c (regression) from the demo pretraining run"
octtrain finetune --config configs/finetune/demo-hba1c.yaml --manifest "$OUT/ssd/manifest.json" \
  --init "$OUT/runs/pretrain/checkpoints" train.run_dir="$OUT/runs/finetune-hba1c"

step "2/2 evaluate on the test split: MAE, RMSE, R^2 (HbA1c, %)"
octtrain evaluate --checkpoint "$OUT/runs/finetune-hba1c/checkpoints" \
  --manifest "$OUT/ssd/manifest.json" --split test --out "$OUT/eval-hba1c"

step "done: test metrics in $OUT/eval-hba1c/metrics-test.json"
