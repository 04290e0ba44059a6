"""Run one ``octtrain`` command on XLA and report what torch_xla saw (the XLA tier's subprocess).

``python -m tests.xla.driver pretrain --config ... KEY=VALUE...`` runs ``octtrain.cli.main`` in
this process, then prints one line ``XLA-RESULT {json}``: the exit code and torch_xla's counters
for the whole process (graph compilations, graph-cache hits, executions). The caller sets the
environment (PJRT_DEVICE, CPU_NUM_DEVICES) before torch_xla starts its runtime.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch_xla.debug.metrics as met

from octtrain import cli

RESULT_PREFIX = "XLA-RESULT "


def xla_counters() -> dict[str, Any]:
    """Graphs compiled (and their total seconds), graph-cache hits and graph executions."""
    compiled = met.metric_data("CompileTime")
    # SPMD runs every graph through the replicated path, which has its own metric.
    executed = met.metric_data("ExecuteTime") or met.metric_data("ExecuteReplicatedTime")
    return {
        "compile_count": 0 if compiled is None else int(compiled[0]),
        "compile_time_s": 0.0 if compiled is None else compiled[1] / 1e9,
        "cache_hits": met.counter_value("CachedCompile") or 0,
        "execute_count": 0 if executed is None else int(executed[0]),
    }


def main(argv: list[str]) -> int:
    code = cli.main(argv)
    print(RESULT_PREFIX + json.dumps({"exit": code, **xla_counters()}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
