"""participants.tsv parsing: ID column variants, class order, problems instead of crashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from octstage.dataset.labels import STUDY_GROUPS, parse_participants, read_participants
from octstage.dataset.synth import SynthInfo
from octstage.errors import LabelsError

HEADER = "participant_id\tclinical_site\tstudy_group\tage\trecommended_split\tretinal_oct\n"


def test_reads_the_synthetic_table(synth_info: SynthInfo) -> None:
    participants, problems = read_participants(str(synth_info.root / "participants.tsv"))
    assert problems == []
    assert list(participants) == list(synth_info.labelled)
    for pid, p in participants.items():
        assert p.label == synth_info.labels[pid] == STUDY_GROUPS.index(p.study_group)
        assert p.split == synth_info.splits[pid]
    flags = {pid: p.retinal_oct for pid, p in participants.items()}
    assert [pid for pid, f in flags.items() if f is False] == [
        synth_info.labelled[1],
        synth_info.labelled[6],
    ]


def test_person_id_column_crlf_and_bom_are_accepted() -> None:
    text = "\ufeffperson_id\tstudy_group\trecommended_split\r\n7111\tinsulin_dependent\tval\r\n"
    participants, problems = parse_participants(text, "v3.tsv")
    assert problems == []
    p = participants["7111"]
    assert (p.label, p.split, p.retinal_oct, p.clinical_site) == (3, "val", None, "")


def test_bad_rows_become_problems_not_crashes() -> None:
    rows = [
        "1001\tUW\thealthy\t50\ttrain\tTRUE",
        "4150\tUCSD\tunknown_group\t50\ttrain\tTRUE",
        "7111\tUAB\thealthy\t50\tholdout\tTRUE",
        "abc\tUW\thealthy\t50\ttrain\tTRUE",
        "1001\tUW\tinsulin_dependent\t50\ttest\tTRUE",
        "0412\tUW\thealthy\t50\ttrain\tTRUE",
        "4151\tUCSD\tinsulin_dependent\t61\tTEST\tfalse",
    ]
    participants, problems = parse_participants(HEADER + "\n".join(rows) + "\n", "p.tsv")
    assert sorted(participants) == ["4151"]  # 1001 is listed twice with different labels
    assert (participants["4151"].split, participants["4151"].retinal_oct) == ("test", False)
    assert [ref for ref, _ in problems] == ["p.tsv:3", "p.tsv:4", "p.tsv:5", "p.tsv:6", "p.tsv:7"]
    reasons = " | ".join(why for _, why in problems)
    for says in ("unknown_group", "'holdout'", "'abc'", "participant 1001 listed twice", "'0412'"):
        assert says in reasons


def test_a_table_without_id_or_group_column_is_refused() -> None:
    with pytest.raises(LabelsError, match="needs a participant_id"):
        parse_participants("id\tstudy_group\n1001\thealthy\n", "x.tsv")
    with pytest.raises(LabelsError, match=r"x\.tsv"):
        parse_participants("participant_id\tgroup\n1001\thealthy\n", "x.tsv")
    with pytest.raises(LabelsError):
        parse_participants("", "x.tsv")


def test_missing_file_is_a_labels_error(tmp_path: Path) -> None:
    with pytest.raises(LabelsError, match="cannot read labels"):
        read_participants(str(tmp_path / "participants.tsv"))
    (tmp_path / "latin1.tsv").write_bytes(
        HEADER.encode() + b"1001\tUW\thealthy\t\xe9\ttrain\tTRUE\n"
    )
    with pytest.raises(LabelsError, match="not UTF-8"):
        read_participants(str(tmp_path / "latin1.tsv"))
