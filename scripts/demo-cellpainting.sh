#!/usr/bin/env bash
# The Cell Painting half of the pipeline, staged as OCT is, through the S3 double:
#   synth --kind cellpainting (JUMP layout) -> upload to the S3 double -> build-cache from s3://
#   -> verify -> mirror the cache to a bucket -> stage to "local SSD" -> verify.
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

step "1/6 synthetic Cell Painting twin in the JUMP layout"
octstage synth --kind cellpainting "$OUT/source_0" --plates 2 --sites 3 --size 128

step "2/6 start the S3 double (moto) on loopback and upload the twin"
python -m tests.doubles serve --env-file "$OUT/doubles.env" --s3-bucket cellpainting-gallery &
DOUBLES=$!
trap 'kill $DOUBLES 2>/dev/null || true; wait $DOUBLES 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do [ -f "$OUT/doubles.env" ] && break; sleep 0.5; done
# shellcheck disable=SC1091
. "$OUT/doubles.env"
python -m tests.doubles upload-s3 "$OUT/source_0" s3://cellpainting-gallery/cpg0016-jump/source_0
SRC=s3://cellpainting-gallery/cpg0016-jump/source_0

step "3/6 build-cache --kind cellpainting from S3 (the planted truncated TIFF is rejected: exit 1)"
set +e
octstage build-cache --kind cellpainting --source "$SRC" --metadata metadata/perturbations.csv \
  --out "$OUT/cache" --json "$OUT/build.json"
rc=$?
set -e
[ "$rc" -le 1 ] || { echo "build-cache exit $rc"; exit "$rc"; }

step "4/6 verify the cache"
octstage verify "$OUT/cache/manifest.json"

step "5/6 upload the cache to a bucket and stage it to local SSD"
python -m tests.doubles upload-s3 "$OUT/cache" s3://cellpainting-gallery/cache
octstage stage s3://cellpainting-gallery/cache "$OUT/staged"

step "6/6 verify the staged copy"
octstage verify "$OUT/staged/manifest.json"
