"""The XLA backend on real torch_xla (XLA:CPU): topology, SPMD input sharding, reductions, bf16."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.xla.conftest import XlaRun, run_xla

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module", params=[1, 2], ids=["one-device", "spmd-2"])
def probe(request: pytest.FixtureRequest, xla_cache: tuple[Path, Path]) -> tuple[int, XlaRun]:
    devices: int = request.param
    return devices, run_xla("backend_probe", [str(xla_cache[0])], devices, run_dir=None)


def test_topology_counts_devices_as_replicas_and_processes_as_hosts(
    probe: tuple[int, XlaRun],
) -> None:
    devices, run = probe
    r = run.result
    assert r["kind"] == "xla" and r["device"].startswith("xla")
    assert r["spmd"] == (devices > 1)
    # Under SPMD one process drives every device: replicas = devices, hosts = 1.
    assert r["world_size"] == devices
    assert (r["process_index"], r["process_count"], r["rank"], r["is_main"]) == (0, 1, 0, True)


def test_batches_are_sharded_along_the_batch_dimension_under_spmd(
    probe: tuple[int, XlaRun],
) -> None:
    devices, run = probe
    r = run.result
    assert r["shapes"]["image"] == [8, 1, 8, 32, 32]  # the global batch, whatever the devices
    if devices == 1:
        assert set(r["shardings"].values()) == {""}  # plain device data, no SPMD annotation
    else:
        # Every tensor of the batch, whatever its rank, split over the 2 devices along dim 0.
        assert r["shardings"]["image"] == "{devices=[2,1,1,1,1]0,1}"
        assert r["shardings"]["label"] == "{devices=[2]0,1}"
        assert r["shardings"]["index"] == "{devices=[2]0,1}"
    # Non-tensor fields pass through untouched, in the loader's order.
    assert r["participant_ids"] == r["host_participant_ids"]
    assert len(r["participant_ids"]) == 8


def test_a_sum_over_a_sharded_batch_counts_every_sample_once(probe: tuple[int, XlaRun]) -> None:
    _, run = probe
    r = run.result
    assert r["index_sum"] == r["host_index_sum"]  # integers: exact
    assert r["image_sum"] == pytest.approx(r["host_image_sum"], rel=1e-9)


def test_bf16_precision_autocasts_matmuls(probe: tuple[int, XlaRun]) -> None:
    _, run = probe
    assert run.result["autocast_dtype"] == "torch.bfloat16"
    assert run.result["compile_count"] >= 1  # the probe's graphs were compiled and counted
