#!/usr/bin/env bash
# Every benchmark, one after the other; each prints its figures beside a baseline.
# Usage: scripts/bench.sh   (make bench calls it with the venv's bin on PATH)
# The finetune benchmark needs the demo's cache: run `make demo` first, or it is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" COLUMNS=${COLUMNS:-120}
mkdir -p bench-output
python bench/bench_build.py --out bench-output/build
python bench/audit_ids.py --workdir bench-output/audit
python bench/bench_loader.py --out bench-output/loader
python bench/bench_mirror.py --json bench-output/mirror.json
python bench/bench_model.py --out bench-output/model   # XLA rows need .venv-xla (make test-xla)
python bench/bench_probe.py --out bench-output/probe   # ~13 min on 2 cores
if [ -f demo-output/ssd/manifest.json ]; then
  python bench/bench_finetune.py --manifest demo-output/ssd/manifest.json \
    --init demo-output/runs/pretrain/checkpoints --out bench-output/finetune
else
  echo "bench_finetune: skipped, no demo-output/ssd/manifest.json (run make demo first)"
fi
python bench/bench_refusal.py
python bench/bench_cellpainting_loader.py
python bench/bench_dino_twin.py
python bench/bench_label_efficiency.py   # ~30 min on 2 cores
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  python bench/bench_dino_gpu.py --fsdp-steps 20   # ~8 min on an H100
  python bench/bench_dino_step.py --profile 3   # ~3 min on an H100
else
  echo "bench_dino_gpu, bench_dino_step: skipped, no CUDA device (DINOv2 ViT-S/8 on a GPU)"
fi
