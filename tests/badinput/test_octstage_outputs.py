"""octstage with bad outputs: a path that is a link, a fifo, a device or a folder is written
where it points, or refused naming it.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from octstage import manifest as mf
from tests.badinput.conftest import Ran, assert_clean

CLI = Callable[..., Ran]


# ---- outputs go where the path points: a link stays a link, a pipe stays a pipe -------------


def _read_fifo(path: Path, got: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(path, "rb") as fh:
            got.append(fh.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def test_a_symlinked_output_writes_its_target_and_stays_a_link(tmp_path: Path) -> None:
    target = tmp_path / "real" / "report.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "report.json"
    link.symlink_to(target)
    mf.atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "later.json"
    dangling.symlink_to(tmp_path / "real" / "later.json")  # target not there yet
    mf.atomic_write_text(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "real" / "later.json").read_text() == "made"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["later.json", "report.json"]


def test_a_fifo_output_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    mf.atomic_write_bytes(fifo, b"through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the pipe, no regular file in its place
    assert os.listdir(tmp_path) == ["pipe"]  # no temporary left beside it


def test_a_device_output_is_written_in_place() -> None:
    mf.atomic_write_text(Path("/dev/null"), "discarded")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_directory_output_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        mf.atomic_write_text(tmp_path, "x")


def test_audit_json_through_a_link_to_a_fifo_reaches_the_reader(
    octstage_cli: CLI, tiny_source: object, tmp_path: Path
) -> None:
    root = tiny_source.root  # type: ignore[attr-defined]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "report.json"
    link.symlink_to(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    ran = octstage_cli(
        "audit-ids", "--labels", root / "participants.tsv", "--oct", root, "--json", link
    )
    reader.join(10)
    assert_clean(ran, 0)
    assert json.loads(got[0])["labels"] == str(root / "participants.tsv")
    assert link.is_symlink() and stat.S_ISFIFO(os.stat(link).st_mode)
