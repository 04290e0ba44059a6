"""``octtrain embed`` of a DINO checkpoint on a Cell Painting twin: the tables the field's tools
read unchanged (pycytominer and copairs, really installed), agreement with ``octtrain profile``,
resuming after Ctrl-C or a damaged part, more processes on resume, and the refusals.

One twin, one 20-step DINO run and one export are shared by the session
(``embed_fixtures.py``); each test copies the export before it changes anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from octstage import manifest as mf
from octtrain.cli import main as octtrain
from octtrain.data.cellpainting import CellPaintingDataset
from octtrain.embed.encode import VERSIONS, embed_fields, field_tiles, field_views
from octtrain.embed.encoders import checkpoint_encoder
from octtrain.embed.export import read_groups, read_header, read_items
from octtrain.eval.cellpainting.profile_run import profile_scores
from octtrain.eval.cellpainting.recipe import RecipeConfig, rank_inverse_normal
from octtrain.runtime.checkpoint import load_checkpoint, resolve_checkpoint
from tests.octtrain.embed_fixtures import ROOT, embed, embed_args, stopped_mid_part


@pytest.fixture
def twin(embed_twin: SimpleNamespace) -> SimpleNamespace:
    """The session's twin, checkpoint and export (``tests/octtrain/embed_fixtures.py``)."""
    return embed_twin


def summary_of(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out = capsys.readouterr().out
    loaded: dict[str, Any] = json.loads(out[out.index("{") :])
    return loaded


def features(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if not c.startswith("Metadata_")]


def test_the_export_is_complete_named_in_its_header_and_typed(twin: SimpleNamespace) -> None:
    header = read_header(twin.export)  # every part and table checked against it
    fields = read_items(twin.export).to_pandas()
    wells = read_groups(twin.export).to_pandas()
    assert header["items"] == len(fields) == 144 and len(header["parts"]) == 18
    assert header["checkpoint"]["step"] == 20 and header["checkpoint"]["encoder"] == "teacher"
    assert header["checkpoint"]["sha256"].startswith("sha256:")
    assert header["identity"]["precision"] == "fp32"  # bf16 on CUDA: never one export of both
    assert header["manifest"]["kind"] == "cellpainting" and header["groups"]["rows"] == 48
    names = set(fields.columns)
    assert {
        "Metadata_Source",
        "Metadata_Batch",
        "Metadata_Plate",
        "Metadata_Well",
        "Metadata_Site",
        "Metadata_JCP2022",
        "Metadata_pert_type",
    } <= names
    feats = features(fields)
    assert feats[0] == "emb_0000" and len(feats) == header["features"]["dim"]
    assert {str(fields[f].dtype) for f in feats} == {"float32"}
    listed = mf.load(twin.manifest)
    assert fields["Metadata_ItemId"].tolist() == [f.item_id for f in listed.fields]
    assert wells["Metadata_Fields"].tolist() == [3] * 48
    assert "negcon" in set(wells["Metadata_pert_type"])


def test_an_exported_row_is_the_definition_s_embedding_of_the_field_s_cells(
    twin: SimpleNamespace,
) -> None:
    # The export embeds each field's nucleus-centred views (``field_views``), as ``profile`` does.
    url = resolve_checkpoint(str(twin.checkpoint))
    encoder = checkpoint_encoder(load_checkpoint(url), url, "teacher")
    assert encoder.crops is not None
    listed = mf.load(twin.manifest)
    fields = CellPaintingDataset(listed.fields[:2], twin.manifest.parent, encoder.crops, 1)
    reads = [fields.open(i).read() for i in range(2)]
    views = [torch.from_numpy(field_views(f, encoder.tile)) for f in reads]
    grids = [field_tiles(f, encoder.tile) for f in reads]
    assert all(
        v.shape != g.shape or not np.array_equal(v, g) for v, g in zip(views, grids, strict=True)
    )
    expected = embed_fields(encoder.module.eval(), views, torch.device("cpu"))
    table = read_items(twin.export).to_pandas()
    np.testing.assert_allclose(table[features(table)].to_numpy()[:2], expected, atol=1e-4)


def test_pycytominer_and_copairs_read_the_export_unchanged(twin: SimpleNamespace) -> None:
    from copairs.map import average_precision, mean_average_precision
    from copairs.matching import assign_reference_index
    from pycytominer import aggregate, feature_select, normalize

    fields = read_items(twin.export).to_pandas()
    wells = read_groups(twin.export).to_pandas()
    feats = features(wells)
    meta = [c for c in wells.columns if c.startswith("Metadata_")]
    # pycytominer's aggregate of the per-field table is the per-well table
    agg = aggregate(
        fields, strata=["Metadata_Plate", "Metadata_Well"], features=feats, operation="mean"
    )
    both = agg.merge(wells, on=["Metadata_Plate", "Metadata_Well"], suffixes=("_agg", ""))
    assert len(both) == 48
    diff = both[[f"{f}_agg" for f in feats]].to_numpy() - both[feats].to_numpy()
    assert np.abs(diff).max() < 1e-5
    # JUMP's deep-learning recipe: MAD robustize against DMSO per plate, then feature selection
    plates = [
        normalize(
            g,
            features=feats,
            meta_features=meta,
            method="mad_robustize",
            samples="Metadata_pert_type == 'negcon'",
        )
        for _, g in wells.groupby("Metadata_Plate")
    ]
    normalized = pd.concat(plates, ignore_index=True)
    selected = feature_select(
        normalized,
        features=feats,
        operation=["variance_threshold", "correlation_threshold", "drop_na_columns"],
    )
    kept = [c for c in selected.columns if c in feats]
    assert 0 < len(kept) <= len(feats)
    # copairs' activity recipe: same-plate DMSO negatives, a null of 10,000
    selected = assign_reference_index(
        selected.reset_index(drop=True), "Metadata_pert_type == 'negcon'"
    )
    ap = average_precision(
        selected[[c for c in selected.columns if c.startswith("Metadata_")]],
        selected[kept].to_numpy(),
        pos_sameby=["Metadata_JCP2022", "Metadata_Reference_Index"],
        pos_diffby=[],
        neg_sameby=["Metadata_Plate"],
        neg_diffby=["Metadata_JCP2022", "Metadata_Reference_Index"],
        progress_bar=False,
    )
    ap = ap[ap["Metadata_pert_type"] != "negcon"]
    maps = mean_average_precision(
        ap, sameby=["Metadata_JCP2022"], null_size=10000, threshold=0.05, seed=0, progress_bar=False
    )
    assert (
        len(maps) == wells.loc[wells.Metadata_pert_type != "negcon", "Metadata_JCP2022"].nunique()
    )
    assert maps["mean_average_precision"].between(0, 1).all()


def _held_out(twin: SimpleNamespace, report: dict[str, Any]) -> pd.DataFrame:
    fields = read_items(twin.export).to_pandas()
    keep = fields["Metadata_Plate"].isin(report["plates"]) & (fields["Metadata_JCP2022"] != "")
    return fields[keep].reset_index(drop=True)


def _records(rows: pd.DataFrame) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(
            plate=r.Metadata_Plate,
            well=r.Metadata_Well,
            perturbation=r.Metadata_JCP2022,
            is_control=r.Metadata_pert_type == "negcon",
        )
        for r in rows.itertuples()
    ]


def test_profile_s_map_is_recomputed_from_the_export(twin: SimpleNamespace) -> None:
    """The same embedding function: ``profile``'s numbers come back from the exported rows
    exactly; pycytominer's steps (JUMP's DL recipe, no sphering) land within 0.05 of the
    project's recipe unsphered (measured 0.006 and 0.002 on this twin: pycytominer's correlation
    filter keeps other features, 51 against 46)."""
    out = twin.tmp / "profile"
    assert (
        octtrain(
            [
                "profile",
                "--checkpoint",
                str(twin.checkpoint),
                "--manifest",
                str(twin.manifest),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "profile.json").read_text())
    rows = _held_out(twin, report)
    feats = features(rows)
    x = rows[feats].to_numpy(np.float64)
    again = profile_scores(x, _records(rows), resamples=report["resamples"])
    for key in ("activity_map", "distinctiveness_map", "activity_map_low", "features_kept"):
        assert again.metrics[key] == pytest.approx(report["encoders"]["dino"][key], abs=1e-9), key
    ours = profile_scores(x, _records(rows), resamples=10, recipe=RecipeConfig(sphere=False))
    theirs = _pycytominer_maps(rows, feats)
    for kind in ("activity", "distinctiveness"):
        assert abs(theirs[kind] - ours.metrics[f"{kind}_map"]) < 0.05, (kind, theirs, ours)


def _pycytominer_maps(rows: pd.DataFrame, feats: list[str]) -> dict[str, float]:
    """JUMP's DL recipe with pycytominer (per plate MAD robustize to DMSO, rank inverse normal,
    feature selection) and the project's two copairs questions on the well means."""
    from copairs.map import average_precision, mean_average_precision
    from pycytominer import aggregate, feature_select, normalize

    meta = ["Metadata_Plate", "Metadata_Well", "Metadata_JCP2022", "Metadata_pert_type"]
    wells = aggregate(rows, strata=meta, features=feats, operation="mean")
    plates = [
        normalize(
            g,
            features=feats,
            meta_features=meta,
            method="mad_robustize",
            samples="Metadata_pert_type == 'negcon'",
            mad_robustize_epsilon=1e-6,
        )
        for _, g in wells.groupby("Metadata_Plate")
    ]
    z = pd.concat(plates, ignore_index=True)
    z[feats] = rank_inverse_normal(z[feats].to_numpy(np.float64))
    z = feature_select(z, features=feats, operation=["variance_threshold", "correlation_threshold"])
    kept = [c for c in z.columns if c in feats]
    table = pd.DataFrame(
        {
            "perturbation": z.Metadata_JCP2022,
            "plate": z.Metadata_Plate,
            "is_control": z.Metadata_pert_type == "negcon",
        }
    )
    x = z[kept].to_numpy(np.float64)
    out = {}
    for kind, rows_of, diffby in (
        ("activity", np.ones(len(z), bool), ["is_control"]),
        ("distinctiveness", ~table["is_control"].to_numpy(), ["perturbation"]),
    ):
        ap = average_precision(
            table[rows_of].reset_index(drop=True),
            x[rows_of],
            pos_sameby=["perturbation"],
            pos_diffby=[],
            neg_sameby=[],
            neg_diffby=diffby,
            progress_bar=False,
        )
        ap = ap[~ap["is_control"]].dropna(subset=["average_precision"])
        maps = mean_average_precision(
            ap, sameby=["perturbation"], null_size=1000, threshold=0.05, seed=0, progress_bar=False
        )
        out[kind] = float(maps["mean_average_precision"].mean())
    return out


def copy_export(twin: SimpleNamespace, name: str) -> Path:
    out = twin.tmp / name
    shutil.copytree(twin.export, out)
    return out


def test_a_finished_export_re_run_embeds_nothing_and_a_damaged_part_is_embedded_again(
    twin: SimpleNamespace, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out = copy_export(twin, "rerun")
    capsys.readouterr()
    assert embed(twin, out, "--json") == 0
    assert summary_of(capsys)["items_embedded"] == 0
    part = out / "parts" / "part-00003.parquet"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    part.write_bytes(bytes(data))
    assert embed(twin, out, "--json") == 0
    summary = summary_of(capsys)
    assert (summary["parts_embedded"], summary["items_embedded"]) == (1, 8)
    assert "part-00003.parquet is damaged" in caplog.text
    assert read_groups(out).equals(read_groups(twin.export))


def test_ctrl_c_keeps_the_finished_parts_and_the_re_run_embeds_only_the_rest(
    twin: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    out = twin.tmp / "interrupted"
    code, text = stopped_mid_part(twin, out, lambda proc: os.killpg(proc.pid, signal.SIGINT))
    assert code == 130, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "interrupted; every finished part stays" in text, text[-3000:]
    kept = len(list((out / "parts").glob("part-*.json")))
    assert 2 <= kept < 18 and not (out / "embed.json").exists()
    assert not [p for p in (out / "parts").iterdir() if p.name.startswith(".")]  # no half part
    capsys.readouterr()
    assert embed(twin, out, "--json") == 0
    summary = summary_of(capsys)
    assert summary["parts_embedded"] == 18 - kept and summary["parts_kept"] == kept
    assert read_groups(out).equals(read_groups(twin.export))


def test_a_resume_on_more_processes_embeds_the_missing_parts_only(twin: SimpleNamespace) -> None:
    """The parts do not depend on the number of processes: an export started on one process
    (and stopped: parts 10-17 missing) is finished by two, with the same tables."""
    out = copy_export(twin, "two")
    (out / "embed.json").unlink()
    for i in range(10, 18):
        (out / "parts" / f"part-{i:05d}.json").unlink()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "tests" / "octtrain" / "rank_cli.py"),
        *embed_args(twin, out, "--json"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "started on 1 process(es), now on 2" in proc.stderr
    text = proc.stdout
    summary = json.loads(text[text.index("{") : text.rindex("}") + 1])
    assert summary["parts_embedded"] == 8 and summary["parts_kept"] == 10
    assert read_groups(out).equals(read_groups(twin.export))


def test_an_out_holding_another_export_or_other_files_is_refused_untouched(
    twin: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    out = copy_export(twin, "other")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert embed(twin, out, "--limit", "50") == 2
    assert "holds the export of another run (limit: None there, 50 now" in caplog.text
    assert embed(twin, out, "--prefix", "dino_") == 2
    # An export begun under an earlier embedding definition (the version before, or none in the
    # plan): its parts have other features, so it is not resumed.
    now = VERSIONS["cellpainting"]
    plan = json.loads((out / "embed-plan.json").read_text())
    for earlier in (now - 1, None):
        plan["embedding_version"] = earlier
        (out / "embed-plan.json").write_text(json.dumps(plan))
        before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
        assert embed(twin, out) == 2
        assert f"(embedding_version: {earlier} there, {now} now)" in caplog.text
    cache_like = twin.tmp / "cache-like"
    cache_like.mkdir()
    (cache_like / "manifest.json").write_text("{}")
    assert embed(twin, cache_like) == 2
    assert "holds what is not an embedding export (manifest.json)" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def _manifest_with(twin: SimpleNamespace, name: str, **changes: Any) -> Path:
    original = mf.load(twin.manifest)
    fields = tuple(dataclasses.replace(f, **changes) for f in original.fields)
    path = twin.manifest.parent / name
    mf.write(dataclasses.replace(original, fields=fields), path)
    return path


def test_a_manifest_of_other_stains_or_of_the_other_kind_is_refused(
    twin: SimpleNamespace,
    tiny_cache: tuple[Path, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    channels = mf.load(twin.manifest).fields[0].channels
    swapped = _manifest_with(
        twin, "swapped.json", channels=(channels[1], channels[0], *channels[2:])
    )
    ns = SimpleNamespace(**{**vars(twin), "manifest": swapped})
    assert embed(ns, twin.tmp / "swapped") == 4
    assert "the checkpoint trained on" in caplog.text and not (twin.tmp / "swapped").exists()
    oct_twin = SimpleNamespace(**{**vars(twin), "manifest": tiny_cache[0]})
    assert embed(oct_twin, twin.tmp / "oct") == 4
    assert "lists oct items" in caplog.text and "embeds cellpainting items" in caplog.text


def test_a_run_folder_is_not_an_export(
    twin: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    assert embed(twin, twin.checkpoint.parent) == 2
    assert "holds what is not an embedding export" in caplog.text
    assert pq.read_metadata(twin.export / "wells.parquet").num_rows == 48


def test_a_checkpoint_with_non_finite_weights_exports_nothing(
    twin: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    url = resolve_checkpoint(str(twin.checkpoint))
    state = load_checkpoint(url)
    state["teacher"]["backbone.cls_token"] = torch.full_like(
        state["teacher"]["backbone.cls_token"], float("nan")
    )
    bad = twin.tmp / "nan" / "step_00000001.pt"
    bad.parent.mkdir()
    torch.save(state, bad)
    ns = SimpleNamespace(**{**vars(twin), "checkpoint": bad})
    assert embed(ns, twin.tmp / "nan-out") == 4
    assert "a non-finite embedding" in caplog.text
    assert not list((twin.tmp / "nan-out" / "parts").glob("*.parquet"))


def test_device_auto_embeds_on_cpu_where_pjrt_device_is_set(
    twin: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TPU host's environment names PJRT_DEVICE for training; ``embed`` runs on CPU or CUDA
    only, so ``--device auto`` there must not pick XLA (a refusal, or a TPU held by an export)."""
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    out = copy_export(twin, "auto-device")
    capsys.readouterr()
    args = embed_args(twin, out, "--json")
    args[args.index("--device") + 1] = "auto"
    assert octtrain(args) == 0
    assert summary_of(capsys)["items_embedded"] == 0  # the CPU export it finds is complete


def test_bf16_autocast_gives_float32_rows_near_the_fp32_ones(twin: SimpleNamespace) -> None:
    """On CUDA the export's forward runs under bf16 autocast (the identity says which); its rows
    come out float32 and within bf16's rounding of fp32's. Checked here with CPU autocast."""
    from octtrain.embed.run import embed_batch
    from octtrain.runtime.torch_backend import TorchBackend

    url = resolve_checkpoint(str(twin.checkpoint))
    encoder = checkpoint_encoder(load_checkpoint(url), url, "teacher")
    assert encoder.crops is not None
    fields = mf.load(twin.manifest).fields[:2]
    data = CellPaintingDataset(fields, twin.manifest.parent, encoder.crops, 1)
    encoder.module.eval()
    tiles = [torch.from_numpy(field_views(data.open(i).read(), encoder.tile)) for i in range(2)]
    rows = {
        p: embed_batch(encoder, {"tiles": tiles}, TorchBackend("cpu", p)) for p in ("fp32", "bf16")
    }
    assert rows["bf16"].dtype == np.float32
    assert not np.array_equal(rows["bf16"], rows["fp32"])  # autocast did run
    np.testing.assert_allclose(rows["bf16"], rows["fp32"], rtol=0.1, atol=0.05)


def test_a_bug_in_a_one_process_export_keeps_its_class_and_traceback(
    twin: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no peer to tell, a bug is not dressed as a refusal (exit 2): it keeps its class,
    for its traceback to be reported; the part in progress still leaves no file."""
    from octtrain.embed import run

    def bug(*args: Any) -> Any:
        raise ZeroDivisionError("a bug in the forward")

    monkeypatch.setattr(run, "embed_batch", bug)
    out = twin.tmp / "bug"
    with pytest.raises(ZeroDivisionError, match="a bug in the forward"):
        embed(twin, out)
    assert not [p for p in (out / "parts").glob(".*")] if (out / "parts").exists() else True
