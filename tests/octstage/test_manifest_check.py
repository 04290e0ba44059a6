"""The one check of a manifest (``octstage.manifest.check``), per kind, and how each consumer
differs only in which findings stop it (``FATAL``, ``refuse``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from octstage import manifest as mf
from tests.octstage.test_manifest import make_manifest, make_volume
from tests.octstage.test_manifest_cellpainting import make_cp_manifest, make_field


def _volumes() -> tuple[mf.Volume, ...]:
    return tuple(
        dataclasses.replace(
            make_volume(pid, split, label),
            cache_key=f"k{pid}",
            zarr_path=f"volumes/{pid}/k{pid}.ome.zarr",
        )
        for pid, split, label in (("1001", "train", 0), ("1002", "val", 1), ("1003", "test", 2))
    )


def _fields() -> tuple[mf.Field, ...]:
    last = dataclasses.replace(make_field("P2", "A01", split="val"), cache_key="kP2")
    return (make_field("P1", "A01"), make_field("P1", "B02"), last)


def _oct(change: Callable[[list[mf.Volume]], None]) -> mf.Manifest:
    volumes = list(_volumes())
    change(volumes)
    return make_manifest(tuple(volumes))


def _cp(change: Callable[[list[mf.Field]], None]) -> mf.Manifest:
    fields = list(_fields())
    change(fields)
    return make_cp_manifest(tuple(fields))


def _set(items: list, n: int, **values: object) -> None:  # type: ignore[type-arg]
    items[n] = dataclasses.replace(items[n], **values)


def test_clean_manifests_of_both_kinds_have_no_finding() -> None:
    assert mf.check(_oct(lambda v: None), "oct") == []
    assert mf.check(_cp(lambda f: None), "cellpainting") == []


OCT_CASES = {
    "volume listed twice": (lambda v: v.append(v[0]), "duplicate", "already listed"),
    "participant in two splits": (
        lambda v: v.append(
            dataclasses.replace(
                v[0], split="test", cache_key="k9", zarr_path="volumes/1001/k9", source_path="s9"
            )
        ),
        "split",
        "participant 1001: in 2 splits",
    ),
    "label outside the classes": (lambda v: _set(v, 1, label=7), "label", "outside the 4"),
    "label of another class": (lambda v: _set(v, 1, label=0), "label", "study_group says"),
    "shape of another volume": (lambda v: _set(v, 2, shape=(8, 64, 64)), "shape", "2 shapes"),
    "not uint8": (lambda v: _set(v, 2, dtype="uint16"), "shape", "uint16"),
    "path into another participant's folder": (
        lambda v: _set(v, 1, zarr_path="volumes/1003/k1002.ome.zarr"),
        "shared-source",
        "not under volumes/1002/",
    ),
    "source file listed twice": (
        lambda v: _set(v, 1, source_path=v[0].source_path),
        "duplicate",
        "source_path",
    ),
    "no volumes": (lambda v: v.clear(), "empty", "lists no volumes"),
}


@pytest.mark.parametrize("case", OCT_CASES, ids=list(OCT_CASES))
def test_each_oct_contradiction_is_a_named_finding(case: str) -> None:
    change, check, words = OCT_CASES[case]
    found = mf.check(_oct(change), "oct")
    assert check in {f.check for f in found}, found
    assert any(words in f.message for f in found if f.check == check), found


CP_CASES = {
    "field listed twice": (lambda f: f.append(f[0]), "duplicate", "already listed"),
    "plate in two splits": (lambda f: _set(f, 1, split="test"), "split", "plate P1: in 2 splits"),
    "two fields naming the same TIFFs": (
        lambda f: _set(f, 1, sources=f[0].sources),
        "shared-source",
        "is also fields[0]'s",
    ),
    "field in another plate's folder": (
        lambda f: _set(f, 2, zarr_path="fields/P1/kA011.ome.zarr", cache_key="x"),
        "shared-source",
        "not under fields/P2/",
    ),
    "label outside the classes": (lambda f: _set(f, 1, label=5), "label", "outside the 2"),
    "label of another class": (lambda f: _set(f, 1, label=0), "label", "perturbation says"),
    "channels and shape disagree": (
        lambda f: f.__setitem__(
            slice(None), [dataclasses.replace(x, shape=(3, 64, 64)) for x in f]
        ),
        "shape",
        "5 channels, shape [3, 64, 64]",
    ),
    "no fields": (lambda f: f.clear(), "empty", "lists no fields"),
}


@pytest.mark.parametrize("case", CP_CASES, ids=list(CP_CASES))
def test_each_cell_painting_contradiction_is_a_named_finding(case: str) -> None:
    change, check, words = CP_CASES[case]
    found = mf.check(_cp(change), "cellpainting")
    assert check in {f.check for f in found}, found
    assert any(words in f.message for f in found if f.check == check), found


def test_a_manifest_of_the_other_kind_names_both_kinds() -> None:
    (found,) = mf.check(_cp(lambda f: None), "oct")
    assert found.check == "kind"
    assert "expected a manifest of kind 'oct', found kind 'cellpainting' (3 fields)" in (
        found.message
    )


def test_consumers_differ_only_in_which_findings_stop_them() -> None:
    mislabelled = _oct(lambda v: _set(v, 1, label=0))
    warned: list[str] = []
    # pretrain reads no labels: a warning, and the manifest is used.
    rest = mf.refuse(mislabelled, "m.json", "pretrain", ValueError, "oct", warned.append)
    assert [f.check for f in rest] == ["label"] and "not fatal for pretrain" in warned[0]
    for consumer in ("verify", "stage", "finetune", "evaluate", "probe", "embed"):
        with pytest.raises(ValueError, match=f"m.json: {consumer} refuses this manifest: label"):
            mf.refuse(mislabelled, "m.json", consumer, ValueError, "oct")
    leaking = _cp(lambda f: _set(f, 1, split="test"))
    assert mf.refuse(leaking, "m.json", "profile", ValueError, "cellpainting") != []
    with pytest.raises(ValueError, match="split: plate P1"):
        mf.refuse(leaking, "m.json", "verify", ValueError, "cellpainting")
    # doctor applies the set of the job its config launches (pretrain or finetune)
    assert set(mf.FATAL) == {
        "verify", "stage", "pretrain", "finetune", "evaluate", "probe", "profile", "embed"
    }  # fmt: skip


# Findings that make every consumer's work wrong: it reads an item twice, an array of another
# shape, the other kind's data, or nothing at all.
EVERYONE_STOPS = {
    "duplicate": _oct(lambda v: v.append(v[0])),
    "shape": _oct(lambda v: _set(v, 2, shape=(8, 64, 64))),
    "empty": _oct(lambda v: v.clear()),
    "shared-source": _oct(lambda v: _set(v, 1, zarr_path="volumes/1003/k1002.ome.zarr")),
}


@pytest.mark.parametrize("check", EVERYONE_STOPS, ids=list(EVERYONE_STOPS))
@pytest.mark.parametrize("consumer", sorted(mf.FATAL))
def test_every_consumer_refuses_what_would_make_its_work_wrong(consumer: str, check: str) -> None:
    with pytest.raises(ValueError, match=f"{consumer} refuses this manifest: {check}"):
        mf.refuse(EVERYONE_STOPS[check], "m.json", consumer, ValueError, "oct")


@pytest.mark.parametrize("consumer", ["verify", "stage", "finetune", "evaluate", "probe"])
def test_a_participant_in_train_and_test_stops_whatever_scores_or_stores_splits(
    consumer: str,
) -> None:
    leaking = _oct(
        lambda v: v.append(
            dataclasses.replace(
                v[0], split="test", cache_key="k9", zarr_path="volumes/1001/k9", source_path="s9"
            )
        )
    )
    with pytest.raises(ValueError, match=f"{consumer} refuses this manifest: split"):
        mf.refuse(leaking, "m.json", consumer, ValueError, "oct")


def _as_table(m: mf.Manifest, folder: Path) -> mf.Manifest:
    """``m`` written in the columnar form and read back (its items an ItemTable)."""
    mf.write(m, folder / "manifest.json", form="table")
    loaded = mf.load(folder / "manifest.json")
    assert isinstance(loaded.items, mf.ItemTable)
    return loaded


EXTRA_CP_CASES = {
    "not uint8": lambda f: _set(f, 2, dtype="uint16"),
    "shape of another field": lambda f: _set(f, 2, shape=(5, 32, 64)),
    "a zero size": lambda f: _set(f, 0, shape=(5, 0, 64)),
    "a short path": lambda f: _set(f, 1, zarr_path="fields/x.ome.zarr"),
    "a perturbation outside the classes": lambda f: _set(f, 1, perturbation="JCP2022_9"),
    "fewer sources than channels": lambda f: _set(f, 1, sources=f[1].sources[:3]),
}


@pytest.mark.parametrize(
    "change",
    [c for c, _, _ in OCT_CASES.values()] + [lambda v: None],
    ids=[*OCT_CASES, "clean"],
)
def test_the_columnar_form_has_the_same_oct_findings(change, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m = _oct(change)
    assert mf.check(_as_table(m, tmp_path), "oct") == mf.check(m, "oct")


@pytest.mark.parametrize(
    "change",
    [c for c, _, _ in CP_CASES.values()] + list(EXTRA_CP_CASES.values()) + [lambda f: None],
    ids=[*CP_CASES, *EXTRA_CP_CASES, "clean"],
)
def test_the_columnar_form_has_the_same_cell_painting_findings(change, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m = _cp(change)
    found = mf.check(_as_table(m, tmp_path), "cellpainting")
    assert found == mf.check(m, "cellpainting")
