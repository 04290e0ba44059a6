"""Flash attention under SPMD on XLA:CPU (flash_probe.py, its own process, 2 devices): the flash
call gets the batch-axis partition spec and the global mesh when the batch divides the mesh, the
unsharded call otherwise; ``auto`` picks flash only on a TPU with Pallas, and says why."""

from __future__ import annotations

import pytest

from tests.xla.conftest import XlaRun, run_xla

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> XlaRun:
    cache = tmp_path_factory.mktemp("xla-cache")
    return run_xla("flash_probe", [str(cache)], devices=2, run_dir=None)


def test_auto_says_why_it_is_not_flash_on_xla_cpu(probe: XlaRun) -> None:
    kernel, why = probe.result["real_choice"]
    assert kernel == "blocked" and "not a TPU" in why
    assert probe.result["tpu_choice"] == ["flash", "auto on a TPU with Pallas"]


def test_a_batch_the_mesh_divides_gets_the_partition_spec_and_global_mesh(probe: XlaRun) -> None:
    assert probe.result["spmd"]
    sharded, single = probe.result["direct"]
    assert sharded["batch"] == 4 and sharded["spec"] == ["data", None, None, None]
    assert sharded["global_mesh"] and sharded["mesh_round_trip"]
    assert single == {"batch": 1, "spec": None, "global_mesh": False, "mesh_round_trip": False}


def test_every_attention_of_the_student_is_sharded(probe: XlaRun) -> None:
    calls = probe.result["student"]
    assert len(calls) == 3  # tiny: 2 encoder blocks, 1 predictor block
    assert all(c["spec"] == ["data", None, None, None] and c["global_mesh"] for c in calls)
    assert probe.result["student_grads"] > 0


def test_block_sizes_copy_is_torch_xla_s(probe: XlaRun) -> None:
    assert probe.result["blocks_match"]


def test_compiled_programs_persist_in_the_cache_dir(probe: XlaRun) -> None:
    assert probe.result["cached_files"] > 0  # train.xla_cache_dir: a restart reuses them
