"""Run by torchrun in test_pod.py: the ``octtrain`` CLI on one simulated host, ``{rank}`` in an
argument replaced by this process's rank (each host its own local files), exiting with its code."""

from __future__ import annotations

import os
import sys

from octtrain.cli import main

if __name__ == "__main__":
    rank = os.environ.get("RANK", "0")
    sys.exit(main([a.replace("{rank}", rank) for a in sys.argv[1:]]))
