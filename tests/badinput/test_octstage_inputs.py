"""octstage with bad input: every case ends in a clear error naming the file, key or value, with
a documented exit code, no traceback, and nothing already done lost.

Table-driven where the cases share a shape: add a row to extend a class of bad input.
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
from octstage.dataset import labels as labels_mod
from tests.badinput.conftest import Ran

CLI = Callable[..., Ran]


def assert_clean(ran: Ran, code: int, *names: str | Path) -> None:
    """The exit code, no traceback, and every name in the message."""
    assert ran.code == code, ran.text
    assert "Traceback" not in ran.out + ran.err
    for name in names:
        assert str(name) in ran.text, (name, ran.text)


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
        "build-cache",
        "--source",
        source,
        "--labels",
        labels,
        "--out",
        out,
        "--shape",
        "8",
        "32",
        "32",
        "--workers",
        "1",
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
        "build-cache",
        "--source",
        source,
        "--labels",
        labels,
        "--out",
        out,
        "--shape",
        "8",
        "32",
        "32",
        "--workers",
        "1",
    )
    assert_clean(ran, 1, row_a, row_b)
    m = mf.load(out / "manifest.json")
    assert pid not in {v.participant_id for v in m.volumes}
    reasons = [r.reason for r in m.rejected if f"/{pid}/" in r.source]
    assert reasons and all(row_a in r and row_b in r for r in reasons)
    same_pid = same.split("\t")[0]
    assert same_pid in {v.participant_id for v in m.volumes}  # the identical duplicate is kept
    assert row_same in ran.text and "kept" in ran.text


# ---- stage: a folder holding another cache is refused, or replaced only when asked ------------


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two different tiny caches: A (8 volumes) and B (4 volumes, other bytes, same names)."""
    from tests.octtrain.tiny_cache import write_tiny_cache

    base = tmp_path_factory.mktemp("caches")
    _, a = write_tiny_cache(base / "a", shape=(8, 32, 32), counts={"train": 1, "val": 1})
    _, b = write_tiny_cache(base / "b", shape=(8, 32, 32), counts={"train": 1}, seed=1)
    return a, b


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_stage_refuses_a_folder_holding_another_cache_unless_replace(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two_caches
    dst = tmp_path / "ssd"
    assert octstage_cli("stage", a, dst).code == 0
    before = {n: (dst / n).read_bytes() for n in _files(dst)}
    (dst / "notes.txt").write_text("left by hand")

    ran = octstage_cli("stage", b, dst)
    assert_clean(ran, 2, dst, "holds another cache", "--replace")
    before["notes.txt"] = b"left by hand"
    assert {n: (dst / n).read_bytes() for n in _files(dst)} == before  # untouched

    ran = octstage_cli("stage", b, dst, "--replace", "--json", tmp_path / "r.json")
    assert_clean(ran, 0)
    assert _files(dst) == _files(b)  # A's other volumes and the stray file are gone
    assert (dst / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    assert json.loads((tmp_path / "r.json").read_text())["removed"] > 0
    assert octstage_cli("verify", dst / "manifest.json").code == 0

    again = octstage_cli("stage", b, dst, "--json", tmp_path / "r2.json")  # idempotent
    assert_clean(again, 0)
    report = json.loads((tmp_path / "r2.json").read_text())
    assert report["present"] == report["volumes"] == 4 and report["downloaded"] == 0


def test_stage_never_writes_into_a_folder_that_holds_no_cache(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    dst = tmp_path / "home"
    dst.mkdir()
    (dst / "thesis.tex").write_text("mine")
    for extra in ([], ["--replace"]):
        ran = octstage_cli("stage", two_caches[0], dst, *extra)
        assert_clean(ran, 2, dst, "holds no cache manifest", "thesis.tex")
        assert _files(dst) == {"thesis.tex"}


# ---- verify: missing told from changed; a manifest that contradicts itself -------------------


def _drop_data(cache: Path, vol: dict[str, object]) -> None:
    for shard in (cache / str(vol["zarr_path"]) / "0" / "c").rglob("*"):
        if shard.is_file():
            shard.unlink()


def _flip_data(cache: Path, vol: dict[str, object]) -> None:
    shard = next(p for p in (cache / str(vol["zarr_path"]) / "0" / "c").rglob("*") if p.is_file())
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def _drop_volume(cache: Path, vol: dict[str, object]) -> None:
    import shutil

    shutil.rmtree(cache / str(vol["zarr_path"]))


DAMAGE = [
    # (case, damage, the line verify prints)
    ("data objects deleted", _drop_data, "missing {zarr_path}: data object(s) 0/c/0/0/0 gone"),
    ("shard bytes changed", _flip_data, "changed {zarr_path}: "),
    ("volume folder deleted", _drop_volume, "missing {zarr_path}: not in the cache"),
]


@pytest.fixture
def small_cache(tmp_path: Path) -> Path:
    from tests.octtrain.tiny_cache import write_tiny_cache

    return write_tiny_cache(tmp_path, shape=(8, 32, 32), counts={"train": 1, "val": 1})[1]


@pytest.mark.parametrize(("case", "damage", "line"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_verify_tells_missing_data_from_changed_data(
    octstage_cli: CLI, small_cache: Path, case: str, damage: Callable[..., None], line: str
) -> None:
    vol = json.loads((small_cache / "manifest.json").read_text())["volumes"][3]
    damage(small_cache, vol)
    ran = octstage_cli("verify", small_cache / "manifest.json")
    assert_clean(ran, 1, line.format(**vol))
    kind = line.split()[0]
    report = json.loads(octstage_cli("verify", small_cache / "manifest.json", "--json").out)
    assert report[kind] and not report["changed" if kind == "missing" else "missing"]


def _duplicate(doc: dict[str, list[dict[str, object]]]) -> None:
    doc["volumes"].append(dict(doc["volumes"][0]))


def _two_splits(doc: dict[str, list[dict[str, object]]]) -> None:
    twin = dict(doc["volumes"][0])
    twin.update(split="val", zarr_path=str(twin["zarr_path"]).replace(".ome", "b.ome"))
    twin.update(source_path="other.dcm", cache_key="other")
    doc["volumes"].append(twin)


def _label_out_of_range(doc: dict[str, list[dict[str, object]]]) -> None:
    doc["volumes"][1]["label"] = 7


def _label_of_another_class(doc: dict[str, list[dict[str, object]]]) -> None:
    doc["volumes"][1]["label"] = (int(str(doc["volumes"][1]["label"])) + 1) % 4


CONTRADICTIONS = [
    ("a volume listed twice", _duplicate, "already listed at volumes[0]"),
    ("a participant in two splits", _two_splits, "in 2 splits: train, val"),
    ("a label outside the classes", _label_out_of_range, "label 7 outside the 4 classes"),
    ("a label naming another class", _label_of_another_class, "study_group says"),
]


@pytest.mark.parametrize(
    ("case", "edit", "says"), CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS]
)
def test_verify_refuses_a_manifest_that_contradicts_itself(
    octstage_cli: CLI, small_cache: Path, case: str, edit: Callable[..., None], says: str
) -> None:
    path = small_cache / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    ran = octstage_cli("verify", path)
    assert_clean(ran, 1, f"manifest {path}: ", says)


# ---- bad flags and settings: refused before the heavy imports, naming the flag or key ---------

HEAVY = ("dask", "distributed", "zarr", "pydicom", "google.cloud.storage", "boto3", "b2sdk")
_PROBE = """
import json, sys
from octstage.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = [m for m in {heavy!r} if m in sys.modules]
sys.stdout.write("\\n" + json.dumps({{"code": code, "heavy": heavy}}) + "\\n")
"""

BAD_FLAGS = [
    # (case, arguments after the command's required ones, config YAML or None, names)
    ("negative workers", ["--workers", "-2"], None, ["--workers", "-2"]),
    ("share above 1", ["--max-reject-share", "1.5"], None, ["--max-reject-share", "1.5"]),
    ("zero in --shape", ["--shape", "8", "0", "32"], None, ["--shape", "got 0"]),
    ("negative progress", ["--progress-seconds", "-1"], None, ["--progress-seconds", "-1"]),
    ("shape: 16", [], "shape: 16\n", ["bad.yaml", "shape", "got 16"]),
    ("shape with a word", [], 'shape: [16, 64, "x"]\n', ["bad.yaml", "shape", "'x'"]),
    ("unknown key", [], "shapes: [1, 2, 3]\n", ["bad.yaml", "shapes"]),
    ("quoted level", [], 'clevel: "3"\n', ["bad.yaml", "clevel", "'3'"]),
    (
        "contradicting flags",
        ["--inventory", "x.json", "--no-verify-sources"],
        None,
        ["--inventory", "--no-verify-sources"],
    ),
]


@pytest.mark.parametrize(
    ("case", "extra", "yaml", "names"), BAD_FLAGS, ids=[c[0] for c in BAD_FLAGS]
)
def test_build_cache_refuses_bad_flags_and_settings_before_heavy_imports(
    tmp_path: Path, case: str, extra: list[str], yaml: str | None, names: list[str]
) -> None:
    import subprocess
    import sys

    args = [
        "build-cache",
        "--source",
        str(tmp_path),
        "--labels",
        str(tmp_path / "p.tsv"),
        "--out",
        str(tmp_path / "cache"),
        *extra,
    ]
    if yaml is not None:
        (tmp_path / "bad.yaml").write_text(yaml)
        args += ["--config", str(tmp_path / "bad.yaml")]
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "1000"},
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    ran = Ran(int(result["code"]), proc.stdout, proc.stderr)
    assert_clean(ran, 2, *names)
    assert result["heavy"] == []  # refused before dask, zarr, pydicom or a cloud SDK was imported
    assert not (tmp_path / "cache").exists()


OTHER_BAD_FLAGS = [
    (["stage", "src", "dst", "--transfers", "0"], ["--transfers", "got 0"]),
    (["mirror", "a", "b", "--checkers", "-1"], ["--checkers", "-1"]),
    (["audit-ids", "--labels", "p.tsv", "--oct", ".", "--min-overlap", "2"], ["--min-overlap"]),
    (["synth", "out", "--participants", "0"], ["--participants", "got 0"]),
    (["verify", "m.json", "--progress-seconds", "nan"], ["--progress-seconds", "nan"]),
]


@pytest.mark.parametrize(("args", "names"), OTHER_BAD_FLAGS, ids=[a[0][0] for a in OTHER_BAD_FLAGS])
def test_every_command_refuses_bad_numbers_in_the_parser(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], names: list[str]
) -> None:
    from octstage.cli import main

    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for name in names:
        assert name in err


def test_a_bad_progress_environment_variable_is_refused_before_the_step(
    octstage_cli: CLI, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OCTSTAGE_PROGRESS_SECONDS", "often")
    ran = octstage_cli("verify", tmp_path / "manifest.json")
    assert_clean(ran, 2, "$OCTSTAGE_PROGRESS_SECONDS", "'often'")


# ---- one unreadable file is one exclusion with its reason, never the end of the run -----------


def _plant_links(source: Path) -> dict[str, str]:
    """A dangling .dcm symlink and a symlink loop, each named like a real scan of a labelled
    participant; returns {relative name: what its exclusion must say}."""
    real = sorted((source / "retinal_oct").rglob("*.dcm"))[0]
    folder, stem = real.parent, real.name.rsplit(".", 2)[0]
    dangling = folder / f"{stem}.901.dcm"
    dangling.symlink_to(source / "elsewhere" / "gone.dcm")
    loop = folder / f"{stem}.902.dcm"
    loop.symlink_to(loop.name)
    return {
        dangling.relative_to(source).as_posix(): "dangling symlink",
        loop.relative_to(source).as_posix(): "symlink loop",
    }


def test_a_dangling_symlink_and_a_loop_are_per_file_exclusions(
    octstage_cli: CLI, source: Path, tmp_path: Path
) -> None:
    planted = _plant_links(source)
    labels = source / "participants.tsv"
    audit = octstage_cli(
        "audit-ids", "--labels", labels, "--oct", source, "--json", tmp_path / "a.json"
    )
    assert_clean(audit, 0, "dangling symlink")
    excluded = {
        e["file"]: e["reason"] for e in json.loads((tmp_path / "a.json").read_text())["excluded"]
    }
    for name, says in planted.items():
        assert says in excluded[name]

    out = tmp_path / "cache"
    ran = octstage_cli(
        "build-cache",
        "--source",
        source,
        "--labels",
        labels,
        "--out",
        out,
        "--shape",
        "8",
        "32",
        "32",
        "--workers",
        "1",
    )
    assert_clean(ran, 3)  # the dangling link may resolve on a retry: environmental
    m = mf.load(out / "manifest.json")
    assert len(m.volumes) == 8  # every readable scan is still built
    reasons = {r.source: r.reason for r in m.rejected}
    (dangling, _), (loop, _) = planted.items()
    assert reasons[dangling].startswith("environment: unreadable: dangling symlink")
    assert reasons[loop].startswith("unreadable: symlink loop")


# ---- the machine: a full disk names the path; Ctrl-C is one line and loses nothing ----------


def test_a_full_disk_in_build_cache_names_the_path_and_exits_3(
    octstage_cli: CLI, tiny_source: object, tmp_path: Path
) -> None:
    root = tiny_source.root  # type: ignore[attr-defined]
    out = tmp_path / "cache"
    # /dev/full answers every write with ENOSPC: a real full-disk error from the kernel.
    ran = octstage_cli(
        "build-cache",
        "--source",
        root,
        "--labels",
        root / "participants.tsv",
        "--out",
        out,
        "--shape",
        "8",
        "32",
        "32",
        "--workers",
        "1",
        "--json",
        "/dev/full",
    )
    assert_clean(ran, 3, "/dev/full: No space left on device")
    assert len(list(out.glob("records/*"))) == 8  # the finished volumes are kept
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_ctrl_c_in_build_cache_is_one_line_keeps_finished_volumes_and_frees_the_lock(
    tiny_source: object, tmp_path: Path
) -> None:
    import fcntl
    import signal
    import subprocess
    import sys
    import time

    root = tiny_source.root  # type: ignore[attr-defined]
    out = tmp_path / "cache"
    argv = [
        sys.executable,
        "-m",
        "octstage.cli",
        "build-cache",
        "--source",
        str(root),
        "--labels",
        str(root / "participants.tsv"),
        "--out",
        str(out),
        "--shape",
        "8",
        "32",
        "32",
        "--workers",
        "1",
    ]
    # A terminal's Ctrl-C reaches the whole process group: the driver and its dask workers.
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "1000"},
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("records/*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the build ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    ran = Ran(proc.returncode, stdout, stderr)
    assert_clean(ran, 130, "interrupted", "run the same command again")
    assert "KeyboardInterrupt" not in stdout + stderr
    kept = len(list(out.glob("records/*")))
    assert kept >= 1 and not (out / "manifest.json").exists()
    assert not list(out.glob("volumes/*/.tmp-*"))  # no half-written volume left behind
    with open(out / ".build.lock", "w") as lock:  # released: a second build may start
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    from tests.octstage.build_helpers import build

    code, summary = build(root, out, workers=1)
    assert code == 1 and summary["volumes"] == 8 and summary["reused"] >= kept


_HEARTBEAT = """
import logging
from octstage.cachebuild.cluster import dask_client

def heartbeat_lost() -> None:  # what a worker logs when the scheduler closes under a heartbeat
    try:
        raise OSError("Stream is closed")
    except OSError:
        logging.getLogger("distributed.worker").exception(
            "Failed to communicate with scheduler during heartbeat."
        )

with dask_client(1, None) as (dd, client):
    client.run(heartbeat_lost)
print("done")
"""


def test_a_worker_losing_its_scheduler_at_shutdown_prints_no_traceback() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _HEARTBEAT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert "Traceback" not in proc.stderr and "heartbeat" not in proc.stderr
