"""data.select and data.label: volumes and targets chosen from the manifest alone, clear errors
before training, and a regression on a clinical concept trained and evaluated (MAE, R^2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from octstage import manifest as mf
from octtrain.config.loader import load_config
from octtrain.config.sections import LabelConfig, SelectConfig
from octtrain.data.select import prepare, relabel, select
from octtrain.errors import ConfigError, DataError
from tests.octtrain.finetune_fixtures import finetune_config

HBA1C = 3004410
REGIONS = (("Macula", ""), ("Macula", "6 x 6"), ("Optic Disc", ""))
MODELS = {"heidelberg_spectralis": "Spectralis", "topcon_maestro2": "Maestro2",
          "topcon_triton": "Triton", "zeiss_cirrus": "Cirrus"}  # fmt: skip


def release_manifest(tiny: mf.Manifest) -> mf.Manifest:
    """The tiny cache's manifest as build-cache writes it from the release: model, region and
    scan size per volume, and HbA1c rising with the class (missing for every seventh)."""
    rng = np.random.default_rng(0)
    volumes = []
    for i, v in enumerate(tiny.volumes):
        region, size = REGIONS[i % 3]
        value = round(5.0 + 0.9 * v.label + float(rng.normal(0, 0.1)), 1)
        clinical = {} if i % 7 == 6 else {str(HBA1C): value}
        volumes.append(
            dataclasses.replace(
                v,
                device_model=MODELS[v.device],
                anatomic_region=region,
                scan_size=size,
                clinical=clinical,
            )
        )
    concept = mf.Concept(HBA1C, "hba1c", "%", "measurement", 40, {"777": 4})
    return dataclasses.replace(tiny, volumes=tuple(volumes), concepts=(concept,))


@pytest.fixture(scope="module")
def manifest(tiny_cache: tuple[Path, Path]) -> mf.Manifest:
    return release_manifest(mf.load(tiny_cache[0]))


def test_select_by_region_device_scan_size_and_eye(manifest: mf.Manifest) -> None:
    macula = select(manifest, SelectConfig(region=("Macula",)))
    assert {v.anatomic_region for v in macula.volumes} == {"Macula"}
    assert len(macula.volumes) == sum(1 for v in manifest.volumes if v.anatomic_region == "Macula")
    six = select(manifest, SelectConfig(region=("Macula, 6 x 6",)))
    assert {(v.anatomic_region, v.scan_size) for v in six.volumes} == {("Macula", "6 x 6")}
    assert six.volumes == select(manifest, SelectConfig(scan_size=("6 x 6",))).volumes
    by_model = select(manifest, SelectConfig(device=("Triton",), eye=("L",)))
    by_folder = select(manifest, SelectConfig(device=("topcon_triton",), eye=("L",)))
    assert by_model.volumes == by_folder.volumes
    assert by_model.volumes and {(v.device, v.laterality) for v in by_model.volumes} == {
        ("topcon_triton", "L")
    }


def test_a_value_no_volume_has_is_an_error_naming_it(manifest: mf.Manifest) -> None:
    with pytest.raises(DataError, match=r"data\.select\.region: 'Wide Field' matches no volume"):
        select(manifest, SelectConfig(region=("Wide Field",)))
    with pytest.raises(DataError, match=r"data\.select\.device: 'Eidon'.*Cirrus"):
        select(manifest, SelectConfig(device=("Eidon",)))
    old = dataclasses.replace(
        manifest,
        volumes=tuple(
            dataclasses.replace(v, anatomic_region="", scan_size="") for v in manifest.volumes
        ),
    )
    with pytest.raises(DataError, match="records no regions: rebuild the cache"):
        select(old, SelectConfig(region=("Macula",)))
    with pytest.raises(DataError, match=r"data\.label\.concept: 3004501 is not in the manifest"):
        relabel(manifest, LabelConfig(concept=3004501, task="regression"))
    with pytest.raises(ConfigError, match="eye entries"):
        SelectConfig(eye=("left",))
    with pytest.raises(ConfigError, match="bins are needed"):
        LabelConfig(concept=HBA1C)


def test_a_concept_as_named_bins(manifest: mf.Manifest) -> None:
    cfg = LabelConfig(concept=HBA1C, bins=(5.7, 6.5), names=("normal", "prediabetes", "diabetes"))
    labelled, info = prepare(manifest, SelectConfig(), cfg, ["train", "val"], "train")
    assert labelled.classes == ("normal", "prediabetes", "diabetes")
    for v in labelled.volumes:
        value = v.clinical[str(HBA1C)]
        assert v.label == (value >= 5.7) + (value >= 6.5)
        assert v.study_group == labelled.classes[v.label]
    missing = sum(1 for v in manifest.volumes if str(HBA1C) not in v.clinical)
    assert (info.dropped_no_value, info.kept) == (missing, len(manifest.volumes) - missing)


def test_an_empty_split_or_class_is_an_error_before_training(manifest: mf.Manifest) -> None:
    wide = LabelConfig(concept=HBA1C, bins=(100.0,), names=("all", "never"))
    with pytest.raises(DataError, match=r"class\(es\) \['never'\] have no volume in split"):
        prepare(manifest, SelectConfig(), wide, ["train", "val"], "train")
    # one eye of one device of one region leaves the val split (2 volumes a class) empty
    narrow = SelectConfig(device=("Cirrus",), region=("Optic Disc",), eye=("R",))
    with pytest.raises(DataError, match=r"split 'val' has no volume after data\.select"):
        prepare(manifest, narrow, LabelConfig(), ["train", "val"])


def test_regression_on_a_concept_trains_and_evaluate_reports_mae(
    manifest: mf.Manifest, tiny_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    from octtrain.eval.oct.evaluate import run_evaluate
    from octtrain.train.finetune import run_finetune

    path = tmp_path / "manifest.json"
    mf.write(manifest, path)
    cfg = finetune_config(
        path, tmp_path / "run", f"data.cache={tiny_cache[1]}", "init_encoder=random",
        "model.input_shape=[8,32,32]", "train.epochs=3", "data.select.region=[Macula]",
        f"data.label.concept={HBA1C}", "data.label.task=regression", "loss.class_weights=none",
    )  # fmt: skip
    result = run_finetune(cfg, None)
    assert result.best_checkpoint is not None and result.best_score is not None
    assert result.best_score < 0  # -MAE
    run_evaluate(result.best_checkpoint, str(path), split="test", cache=str(tiny_cache[1]),
                 out=str(tmp_path / "eval"))  # fmt: skip
    doc = json.loads((tmp_path / "eval" / "metrics-test.json").read_text())
    assert doc["task"] == "regression" and doc["concept"] == HBA1C
    test = [v for v in manifest.split("test") if v.anatomic_region == "Macula"]
    with_value = [v for v in test if str(HBA1C) in v.clinical]
    assert doc["volume"]["num_samples"] == len(with_value) > 0
    targets = [p["target"] for p in doc["predictions"]]
    assert targets == pytest.approx([v.clinical[str(HBA1C)] for v in with_value])
    errors = [abs(p["predicted"] - p["target"]) for p in doc["predictions"]]
    assert doc["volume"]["mae"] == pytest.approx(float(np.mean(errors)), rel=1e-6)
    assert set(doc["volume"]) >= {"mae", "rmse", "r2"}


def test_a_config_with_select_and_label_loads_from_yaml() -> None:
    from octtrain.config.finetune import FinetuneConfig

    repo = Path(__file__).resolve().parents[2]
    cfg = load_config(FinetuneConfig, repo / "configs" / "finetune" / "demo-hba1c.yaml", [])
    assert cfg.data.select.region == ("Macula",)
    assert (cfg.data.label.concept, cfg.data.label.task) == (HBA1C, "regression")
    over = load_config(FinetuneConfig, None, ["data.select.region=[Macula, Optic Disc]"])
    assert over.data.select.region == ("Macula", "Optic Disc")


def test_pretraining_takes_a_selection_but_refuses_a_label(tmp_path: Path) -> None:
    from octtrain.config.pretrain import PretrainConfig
    from octtrain.train.pretrain import run_pretrain

    cfg = load_config(PretrainConfig, None, [f"data.label.concept={HBA1C}",
                                             "data.label.task=regression"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"data\.label\.concept: pretraining learns without"):
        run_pretrain(cfg)
