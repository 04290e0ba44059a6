"""octstage with a bad label table: problems named by row, column and value; a table that can
give no label is refused; nothing already done is lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from octstage import manifest as mf
from octstage.dataset import labels as labels_mod
from tests.badinput.conftest import Ran, assert_clean, tiny_build

CLI = Callable[..., Ran]


# ---- the label table: problems by row, column and value; an unusable table is refused --------

HEADER = "participant_id\tclinical_site\tstudy_group\trecommended_split\n"

TABLE_REFUSED = [
    # (case, text, what the error names)
    ("no split column", "participant_id\tstudy_group\n1001\thealthy\n", "recommended_split"),
    ("header only", HEADER, "header only"),
    ("empty file", "", "no header"),
    (
        "no id column",
        "id\tstudy_group\trecommended_split\n1001\thealthy\ttrain\n",
        "participant_id",
    ),
]


@pytest.mark.parametrize(
    ("case", "text", "names"), TABLE_REFUSED, ids=[c[0] for c in TABLE_REFUSED]
)
def test_a_label_table_that_can_give_no_label_is_refused(
    octstage_cli: CLI, source: Path, tmp_path: Path, case: str, text: str, names: str
) -> None:
    (source / "participants.tsv").write_text(text)
    for command in (
        [
            "build-cache",
            "--source",
            source,
            "--out",
            tmp_path / "cache",
            "--shape",
            "8",
            "32",
            "32",
            "--workers",
            "1",
        ],
        ["audit-ids", "--oct", source],
    ):
        ran = octstage_cli(*command, "--labels", source / "participants.tsv")
        assert_clean(ran, 2, source / "participants.tsv", names)
    assert not (tmp_path / "cache" / "manifest.json").exists()


ROW_PROBLEMS = [
    # (row, what the problem names: column, value)
    ("1001\tUW\thealthy\tholdout", ["recommended_split", "'holdout'"]),
    ("1002\tUW\tdiabetic\ttrain", ["study_group", "'diabetic'"]),
    ("abc\tUW\thealthy\ttrain", ["participant_id", "'abc'"]),
    ("0412\tUW\thealthy\ttrain", ["participant_id", "'0412'"]),
]


def test_each_bad_row_is_named_by_row_column_and_value() -> None:
    text = HEADER + "".join(row + "\n" for row, _ in ROW_PROBLEMS)
    table = labels_mod.parse_label_table(text, "p.tsv")
    assert table.participants == {}
    assert [ref for ref, _ in table.problems] == [
        f"p.tsv:{n}" for n in range(2, 2 + len(ROW_PROBLEMS))
    ]
    for (_, why), (_, names) in zip(table.problems, ROW_PROBLEMS, strict=True):
        for name in names:
            assert name in why


def test_a_build_that_keeps_nothing_lists_every_bad_row_and_exits_2(
    octstage_cli: CLI, source: Path, tmp_path: Path
) -> None:
    labels = source / "participants.tsv"
    lines = labels.read_text().splitlines()
    split = lines[0].split("\t").index("recommended_split")
    bad = [lines[0]] + [
        "\t".join(c if i != split else "holdout" for i, c in enumerate(r.split("\t")))
        for r in lines[1:]
    ]
    labels.write_text("\n".join(bad) + "\n")
    out = tmp_path / "cache"
    ran = octstage_cli(
        *tiny_build(source, labels, out),
        "--json",
        tmp_path / "summary.json",
    )
    assert_clean(ran, 2, "nothing kept")
    for n in range(2, len(lines) + 1):
        assert f"{labels}:{n}: participant" in ran.text and "'holdout'" in ran.text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["label_problem_rows"]) == len(lines) - 1
    assert mf.load(out / "manifest.json").volumes == ()  # still written: it says what was left out


def test_a_participant_listed_twice_with_different_labels_is_left_out_naming_both_rows(
    octstage_cli: CLI, source: Path, tmp_path: Path
) -> None:
    labels = source / "participants.tsv"
    lines = labels.read_text().splitlines()
    cols = lines[0].split("\t")
    first = lines[1].split("\t")
    pid = first[0]
    other = list(first)
    other[cols.index("study_group")] = (
        "insulin_dependent"
        if first[cols.index("study_group")] != "insulin_dependent"
        else "healthy"
    )
    same = lines[2]  # an identical duplicate: kept, with a warning
    labels.write_text("\n".join([*lines, "\t".join(other), same]) + "\n")
    row_a, row_b, row_same = (
        f"{labels}:2",
        f"{labels}:{len(lines) + 1}",
        f"{labels}:{len(lines) + 2}",
    )

    audit = octstage_cli(
        "audit-ids", "--labels", labels, "--oct", source, "--json", tmp_path / "a.json"
    )
    assert_clean(audit, 0, row_a, row_b, pid)
    assert pid in json.loads((tmp_path / "a.json").read_text())["oct_without_label"]

    out = tmp_path / "cache"
    ran = octstage_cli(
        *tiny_build(source, labels, out),
    )
    assert_clean(ran, 1, row_a, row_b)
    m = mf.load(out / "manifest.json")
    assert pid not in {v.participant_id for v in m.volumes}
    reasons = [r.reason for r in m.rejected if f"/{pid}/" in r.source]
    assert reasons and all(row_a in r and row_b in r for r in reasons)
    same_pid = same.split("\t")[0]
    assert same_pid in {v.participant_id for v in m.volumes}  # the identical duplicate is kept
    assert row_same in ran.text and "kept" in ran.text
