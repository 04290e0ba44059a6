"""Where a file named by a path or URL is read from: a bare name from the current folder, ``/name``
from the root, never the other way round (an empty folder opens the current one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from octstage.dataset.labels import read_label_table
from octstage.errors import LabelsError
from octstage.storage import split_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("participants.tsv", (".", "participants.tsv")),
        ("/participants.tsv", ("/", "participants.tsv")),
        ("/data/participants.tsv", ("/data", "participants.tsv")),
        ("gs://bucket/meta/participants.tsv", ("gs://bucket/meta", "participants.tsv")),
        ("meta/", (".", "meta")),
    ],
)
def test_split_url(url: str, expected: tuple[str, str]) -> None:
    assert split_url(url) == expected


def test_a_table_at_the_root_is_not_read_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"participants-{tmp_path.name}.tsv"  # nothing of that name at /
    (tmp_path / name).write_text(
        "participant_id\tstudy_group\trecommended_split\n1001\thealthy\ttrain\n"
    )
    monkeypatch.chdir(tmp_path)
    assert read_label_table(name)  # a bare name is the current folder's
    with pytest.raises(LabelsError, match=f"^/{name}: cannot read labels"):
        read_label_table(f"/{name}")
