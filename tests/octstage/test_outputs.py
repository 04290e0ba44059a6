"""The one rule for output folders (octstage/outputs.py; stage's part in
octstage/stage/destination.py): what each kind of folder may hold, what is refused, what is moved
aside, and reports replaced whole even on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from octstage.errors import ConfigError
from octstage.outputs import (
    check_cache_folder,
    claim_export_folder,
    claim_run_folder,
    replace_report,
)
from octstage.stage.destination import sweep_replaced


class Refused(Exception):
    pass


def _report(folder: Path, text: str) -> None:
    (folder / "metrics-test.json").write_text(text)
    (folder / "groups-test.md").write_text(text)


def _belongs(name: str) -> bool:
    return name in {"metrics-test.json", "groups-test.md"}


def test_a_report_replaces_the_earlier_one_whole_and_moves_it_aside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics-test.json").write_text("old")  # an older report: one file of it only
    (out / "notes.txt").write_text("mine")
    (out / "metrics-val.json").write_text("val")
    aside = replace_report(out, _belongs, lambda tmp: _report(tmp, "new"), Refused)
    assert aside is not None and aside.parent == out and aside.name.startswith("replaced-")
    assert (aside / "metrics-test.json").read_text() == "old"
    assert (out / "metrics-test.json").read_text() == "new"
    assert (out / "groups-test.md").read_text() == "new"
    assert (out / "notes.txt").read_text() == "mine" and (out / "metrics-val.json").exists()
    assert not list(out.glob(".report-*"))


def test_ctrl_c_while_writing_leaves_the_old_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _report(out, "old")

    def half(tmp: Path) -> None:
        (tmp / "metrics-test.json").write_text("new")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_report(out, _belongs, half, Refused)
    assert sorted(p.name for p in out.iterdir()) == ["groups-test.md", "metrics-test.json"]
    assert (out / "metrics-test.json").read_text() == "old"


def test_ctrl_c_during_the_swap_is_held_until_the_new_report_is_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _report(out, "old")
    interrupted: list[str] = []
    # A user's Ctrl-C: Python's own handler, whatever an earlier test left installed.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def belongs(name: str) -> bool:
        if not interrupted:  # the swap has begun: Ctrl-C now
            interrupted.append(name)
            os.kill(os.getpid(), signal.SIGINT)
        return _belongs(name)

    with pytest.raises(KeyboardInterrupt):
        replace_report(out, belongs, lambda tmp: _report(tmp, "new"), Refused)
    assert interrupted
    assert (out / "metrics-test.json").read_text() == "new"
    assert (out / "groups-test.md").read_text() == "new"
    (aside,) = out.glob("replaced-*")
    assert (aside / "groups-test.md").read_text() == "old"


def test_a_report_path_that_is_a_file_or_cannot_be_made_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    for bad, words in ((tmp_path / "f", "not a folder"), (tmp_path / "f" / "sub", "cannot")):
        with pytest.raises(Refused, match=words):
            replace_report(bad, _belongs, lambda tmp: None, Refused)
    assert (tmp_path / "f").read_text() == "x"


def test_a_folder_nobody_may_write_is_refused_before_any_work() -> None:
    """/proc/1 exists on every Linux machine and no one may write it, root included (root
    passes every permission bit, so a chmod'ed folder would prove nothing in CI)."""
    folder = Path("/proc/1")
    if not folder.is_dir() or os.access(folder, os.W_OK | os.X_OK):
        pytest.fail("this test needs a Linux /proc: /proc/1 must be a folder nobody may write")
    written: list[Path] = []
    with pytest.raises(Refused, match="is not writable"):
        replace_report(folder, _belongs, written.append, Refused)
    assert written == []  # refused up front: the report was never written


def _trained_run(run: Path, index: object | None) -> None:
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("x: 1\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "checkpoints" / "step_00000002.pt").write_bytes(b"weights")
    if index is not None:
        (run / "checkpoints" / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("index", [None, {"checkpoints": []}], ids=["index missing", "index empty"])
def test_resume_of_a_run_that_trained_without_an_index_is_refused(
    tmp_path: Path, index: object | None
) -> None:
    run = tmp_path / "run"
    _trained_run(run, index)
    with pytest.raises(Refused, match=r"index.json is missing or lists no checkpoint"):
        claim_run_folder(run, resume=True, overwrite=False, refuse=Refused)
    assert (run / "checkpoints" / "step_00000002.pt").read_bytes() == b"weights"


def test_resume_goes_on_with_an_index_or_a_run_that_never_trained(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _trained_run(run, {"checkpoints": [{"name": "step_00000002.pt", "step": 2}]})
    assert claim_run_folder(run, resume=True, overwrite=False, refuse=Refused) == run
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.yaml").write_text("x: 1\n")  # stopped before its first step
    assert claim_run_folder(fresh, resume=True, overwrite=False, refuse=Refused) == fresh
    # checkpoint.dir elsewhere: its index is the one that counts
    other = tmp_path / "ckpt"
    other.mkdir()
    with pytest.raises(Refused, match=str(other / "index.json")):
        claim_run_folder(run, True, False, Refused, checkpoints=str(other))


def test_overwrite_moves_the_run_aside(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _trained_run(run, None)
    with pytest.raises(Refused, match="already holds a run"):
        claim_run_folder(run, resume=False, overwrite=False, refuse=Refused)
    claim_run_folder(run, resume=False, overwrite=True, refuse=Refused)
    (aside,) = tmp_path.glob("run.replaced-*")
    assert (aside / "checkpoints" / "step_00000002.pt").read_bytes() == b"weights"
    assert run.is_dir() and not any(run.iterdir())


def _manifest(path: Path, kind: str, items: list[str]) -> None:
    key = "fields" if kind == "cellpainting" else "volumes"
    data = {"kind": kind, "header": {"dataset": "src"}, key: [{"zarr_path": p} for p in items]}
    path.write_text(json.dumps(data))


def test_a_build_over_another_cache_is_refused_naming_what_it_holds(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "volumes" / "1001" / "a.ome.zarr").mkdir(parents=True)
    _manifest(out / "manifest.json", "oct", ["volumes/1001/a.ome.zarr"])
    check_cache_folder(out, [out / "manifest.json"], "oct", Refused)  # this cache: rebuilt
    with pytest.raises(Refused, match=r"a oct cache of 'src' .1 items.; this build writes a cell"):
        check_cache_folder(out, [out / "manifest.json"], "cellpainting", Refused)
    elsewhere = tmp_path / "other.json"
    _manifest(elsewhere, "oct", [f"volumes/{n}/b.ome.zarr" for n in range(114)])
    with pytest.raises(Refused, match=r"another cache .oct, of 'src', 114 items, none of them in"):
        check_cache_folder(out, [elsewhere], "oct", Refused)
    (tmp_path / "junk.json").write_text("not json")
    with pytest.raises(Refused, match="not a readable manifest"):
        check_cache_folder(out, [tmp_path / "junk.json"], "oct", Refused)
    with pytest.raises(Refused, match=r"holds a oct cache .volumes/."):
        check_cache_folder(out, [], "cellpainting", Refused)


def test_a_run_folder_that_is_a_file_is_refused_as_such(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("mine")
    with pytest.raises(Refused, match="exists and is not a folder"):
        claim_run_folder(tmp_path / "run", resume=True, overwrite=False, refuse=Refused)
    assert (tmp_path / "run").read_text() == "mine"


def test_stage_replace_removes_only_what_the_replaced_cache_listed(tmp_path: Path) -> None:
    """``stage --replace`` removes the replaced cache's volumes the new one does not name, and
    stage's own temporaries; a symlinked volume goes as a link (what it points at is never
    walked); a user's file, folder or link that no manifest lists stays and is named."""
    dst, elsewhere = tmp_path / "dst", tmp_path / "elsewhere"
    kept = dst / "volumes" / "1001" / "a.ome.zarr"
    kept.mkdir(parents=True)
    (kept / "zarr.json").write_text("{}")
    (dst / "manifest.json").write_text("{}")
    (dst / "volumes" / "2002" / "b.ome.zarr").mkdir(parents=True)
    (dst / "volumes" / "2002" / "b.ome.zarr" / "old.bin").write_bytes(b"old")
    (dst / "volumes" / "2002" / ".stage-c.ome.zarr-0123abcd").mkdir()  # a killed fetch
    elsewhere.mkdir()
    (elsewhere / "yours.txt").write_text("mine")
    (dst / "volumes" / "3003").symlink_to(elsewhere, target_is_directory=True)
    (dst / "volumes" / "4004").symlink_to(elsewhere, target_is_directory=True)
    (dst / "export").mkdir()
    (dst / "export" / "part.parquet").write_bytes(b"x")
    (dst / "volumes" / "NOTES.md").write_text("mine")
    replaced = {"volumes/2002/b.ome.zarr", "volumes/3003", "old.items.parquet"}
    removed, found = sweep_replaced(dst, ["volumes/1001/a.ome.zarr"], replaced)
    assert removed == 2  # old.bin and the link 3003
    assert found == ["export/", "volumes/4004", "volumes/NOTES.md"]
    assert sorted(p.name for p in (dst / "volumes").iterdir()) == ["1001", "4004", "NOTES.md"]
    assert (kept / "zarr.json").read_text() == "{}" and (dst / "manifest.json").exists()
    assert (elsewhere / "yours.txt").read_text() == "mine"
    assert (dst / "export" / "part.parquet").read_bytes() == b"x"


def test_an_export_folder_without_its_plan_or_with_a_plan_that_is_no_object_is_refused(
    tmp_path: Path,
) -> None:
    """Files of an export with no plan saying whose they are, or a plan that is not a JSON
    object, are refused naming the folder or the plan, not taken as a new export or a crash."""
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "embed.json").write_text("{}")
    own = {"embed.json", "parts"}.__contains__
    with pytest.raises(ConfigError, match=r"holds export files but no embed-plan\.json"):
        claim_export_folder(folder, "embed-plan.json", own, {"items": 1}, ConfigError)
    (folder / "embed-plan.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"embed-plan\.json: not an export plan"):
        claim_export_folder(folder, "embed-plan.json", own, {"items": 1}, ConfigError)
