"""Run by torchrun in tests/octtrain/test_pod.py: one simulated host calling the reductions of
``runtime/hosts.py`` on values that differ per host; writes ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from octtrain.runtime import hosts
from octtrain.runtime.backend import make_backend


def main(out: str) -> None:
    backend = make_backend("cpu")
    try:
        r = backend.process_index
        rows = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * (r + 1)
        gathered = hosts.gather_step_rows(backend, rows)
        mean = hosts.mean_over_replicas(backend, torch.tensor(float(r + 1)))
        record = {"rank": r, "rows": gathered.tolist(), "mean": mean}
        Path(out, f"rank{r}.json").write_text(json.dumps(record))
    finally:
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1])
