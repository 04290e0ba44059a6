#!/usr/bin/env bash
# The Cell Painting half of the pipeline, staged as OCT is, through the S3 double, then trained:
#   synth --kind cellpainting (JUMP layout) -> upload to the S3 double -> build-cache from s3://
#   straight into a bucket -> stage to "local SSD" -> verify -> DINOv2 pretraining (tiny, CPU,
#   W&B offline) -> profile (copairs mAP beside random init, handcrafted and cp-measure features)
#   -> embed (per-field and per-well Parquet for pycytominer and copairs).
# Usage: scripts/demo-cellpainting.sh [OUT_DIR]   (make demo-cellpainting)
set -euo pipefail
OUT=${1:-demo-cellpainting}
rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export COLUMNS=${COLUMNS:-120}

step() { printf '\n\033[1;36m== %s\033[0m\n' "$*"; }

step "1/8 synthetic Cell Painting twin, laid out as the Cell Painting Gallery releases JUMP"
# Three plates of two sites (the 144 fields two plates of three gave): an Opera Phenix, a CV8000
# and source_3's Phenix, whose folders say "Measurement 1" with a space.
octstage synth --kind cellpainting "$OUT/twin" --plates 3 --sites 2 --size 128

step "2/8 start the S3 double (moto) on loopback and upload the twin"
python -m tests.doubles serve --env-file "$OUT/doubles.env" --s3-bucket cellpainting-gallery &
DOUBLES=$!
trap 'kill $DOUBLES 2>/dev/null || true; wait $DOUBLES 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do [ -f "$OUT/doubles.env" ] && break; sleep 0.5; done
# shellcheck disable=SC1091
. "$OUT/doubles.env"
python -m tests.doubles upload-s3 "$OUT/twin/cpg0016-jump" s3://cellpainting-gallery/cpg0016-jump
SRC=s3://cellpainting-gallery/cpg0016-jump

step "3/8 build-cache --kind cellpainting from S3 into the cache bucket, packed 64 fields an array (the planted truncated TIFF is rejected: exit 1)"
set +e
octstage build-cache --kind cellpainting --source "$SRC" --metadata "$OUT/twin/datasets/metadata" \
  --out s3://cellpainting-gallery/cache --manifest-form table --pack 64 --json "$OUT/build.json"
rc=$?
set -e
[ "$rc" -le 1 ] || { echo "build-cache exit $rc"; exit "$rc"; }

step "4/8 stage the cache from the bucket to local SSD (verified against the manifest)"
octstage stage s3://cellpainting-gallery/cache "$OUT/staged"

step "5/8 verify the staged copy"
octstage verify "$OUT/staged/manifest.json"

step "6/8 pretrain DINOv2 (DINO + iBOT + KoLeo, tiny ViT) on the staged fields (CPU; W&B offline)"
octtrain pretrain --config configs/pretrain/dino-tiny.yaml --manifest "$OUT/staged/manifest.json" \
  train.run_dir="$OUT/runs/dino" train.max_steps=200 checkpoint.every=100 data.batch_size=16 \
  schedule.warmup_steps=20 logging.log_every=50 \
  logging.wandb_mode=offline

# Do the teacher's targets carry the image? Per-crop entropy well below the batch's (and below
# log K) says each crop gets its own prototypes; equal ones would raise the run's alarm.
python - "$OUT/runs/dino/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if "train/teacher_entropy" in line]
last = rows[-1]
crop, batch, k = (last[f"train/teacher_{n}"] for n in ("entropy", "batch_entropy", "log_k"))
print(f"teacher at step {last['step']}: per-crop entropy {crop:.3f}, batch entropy {batch:.3f}, "
      f"log K {k:.3f}: gap {batch - crop:.3f} nats ({(batch - crop) / k:.0%} of log K)")
PY

step "7/8 profile the EMA teacher: well profiles, copairs mAP, beside the baselines"
octtrain profile --checkpoint "$OUT/runs/dino/checkpoints" --manifest "$OUT/staged/manifest.json" \
  --out "$OUT/profile"

step "8/8 export every field's embedding and the per-well means (Parquet, Metadata_ columns: what pycytominer and copairs read)"
octtrain embed --checkpoint "$OUT/runs/dino/checkpoints" --manifest "$OUT/staged/manifest.json" \
  --out "$OUT/embeddings"

step "done: outputs in $OUT"
printf '  %s\n' "build summary: build.json" "staged cache: staged/" \
  "training: runs/dino/metrics.jsonl, runs/dino/images/ (attention maps, feature PCA)" \
  "profiles: profile/profile.json" \
  "embeddings: embeddings/parts/part-*.parquet (one row per field), embeddings/wells.parquet (one per well), embeddings/embed.json (the header: files, rows, SHA-256)"
