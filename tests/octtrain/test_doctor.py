"""``octtrain doctor`` on one process, and the comparison it makes between hosts (the 2-host
runs are in test_pod.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from octtrain.cli import main
from octtrain.train.doctor import AGREED, disagreements

TINY = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "tiny.yaml"


def test_doctor_describes_this_host(
    tiny_cache: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--config", str(TINY), "--manifest", str(tiny_cache[0])]) == 0
    host, verdict = capsys.readouterr().out.splitlines()
    assert host.startswith("host 0 (") and "attention sdpa (auto on cpu)" in host
    assert re.search(r"cache (\d+)/\1 volumes sha256:", host)  # every volume's files present
    assert verdict == "doctor: every host agrees"


def test_a_refused_flash_length_shows_in_the_attention_field(
    tiny_cache: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["doctor", "--config", str(TINY), "--manifest", str(tiny_cache[0])]
    assert main([*args, "model.attention=flash"]) == 0  # every host refuses alike: they agree
    assert "attention refused: model.attention 'flash' needs" in capsys.readouterr().out


def test_disagreements_name_the_field_and_the_hosts() -> None:
    base = {k: "x" for k in AGREED}
    views = [{**base, "host": "0 (a)"}, {**base, "host": "1 (b)", "cache": "y"}]
    assert disagreements(views) == ["cache differs from host 0's on host(s) 1 (b)"]
    assert disagreements(views[:1]) == []


# ---- a cache that cannot train, and the configs a run launches with ---------------------------

DINO = TINY.parent / "dino-tiny.yaml"
FINETUNE = TINY.parents[1] / "finetune" / "tiny.yaml"


def _doctor(
    caplog: pytest.LogCaptureFixture, manifest: Path, config: Path = TINY, *extra: str
) -> tuple[int, str]:
    caplog.clear()
    code = main(["doctor", "--config", str(config), "--manifest", str(manifest), *extra])
    return code, caplog.text


def test_doctor_fails_on_a_cache_that_cannot_train(
    tiny_cache: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import dataclasses
    import shutil

    from octstage import manifest as mf

    cache = Path(shutil.copytree(tiny_cache[1], tmp_path / "cache"))
    empty = tmp_path / "empty" / "manifest.json"
    empty.parent.mkdir()
    mf.write(dataclasses.replace(mf.load(cache / "manifest.json"), volumes=()), empty)
    code, text = _doctor(caplog, empty)
    assert code == 4 and "empty: lists no volumes" in text and str(empty) in text
    for shard in cache.glob("volumes/*/*.ome.zarr/0/c"):
        shutil.rmtree(shard)  # every chunk deleted, the folders and metadata still there
    code, text = _doctor(caplog, cache / "manifest.json")
    assert code == 4 and "48 without data objects" in text and "octstage verify" in text


def test_doctor_refuses_a_manifest_of_the_other_kind_and_reads_dino_and_finetune_configs(
    tiny_cache: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.octtrain.cell_cache import write_cell_cache

    write_cell_cache(tmp_path, n=8)
    cells = tmp_path / "manifest.json"
    code, text = _doctor(caplog, cells)  # the V-JEPA config on Cell Painting fields
    assert code == 4 and "expected a manifest of kind 'oct', found kind 'cellpainting'" in text
    code, text = _doctor(caplog, tiny_cache[0], DINO)
    assert code == 4 and "expected a manifest of kind 'cellpainting', found kind 'oct'" in text
    assert _doctor(caplog, cells, DINO)[0] == 0
    assert _doctor(caplog, tiny_cache[0], FINETUNE)[0] == 0
