"""octstage with bad flags and settings: refused in the parser or before the heavy imports,
naming the flag, key or value.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from octstage.dataset.synth import SynthInfo
from tests.badinput.conftest import Ran, assert_clean

CLI = Callable[..., Ran]


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
    (["synth", "out", "--participants", "8"], ["got 8", "at least 16", "--no-traps"]),
    (["verify", "m.json", "--progress-seconds", "nan"], ["--progress-seconds", "nan"]),
]


@pytest.mark.parametrize(
    ("args", "names"),
    OTHER_BAD_FLAGS,
    ids=[" ".join(a[0][:1] + a[0][-2:]) for a in OTHER_BAD_FLAGS],
)
def test_every_command_refuses_bad_numbers_in_the_parser(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], names: list[str]
) -> None:
    from octstage.cli import main

    code = main(args)
    err = " ".join(capsys.readouterr().err.split())  # rich's line wrapping undone
    assert code == 2 and "Traceback" not in err
    for name in names:
        assert name in err


def test_a_bad_progress_environment_variable_is_refused_before_the_step(
    octstage_cli: CLI, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OCTSTAGE_PROGRESS_SECONDS", "often")
    ran = octstage_cli("verify", tmp_path / "manifest.json")
    assert_clean(ran, 2, "$OCTSTAGE_PROGRESS_SECONDS", "'often'")


# ---- a key written into a URL: refused, and never printed -------------------------------------

KEY_ID, KEY = "AKIAEXAMPLEKEYID", "wJalrXUtnFEMIexampleSECRET"
KEYED = f"{KEY_ID}:{KEY}@bucket"


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["stage", f"s3://{KEYED}/cache", "{tmp}/ssd"], "s3://***@bucket/cache"),
        (["stage", f"gs://{KEYED}/cache", "{tmp}/ssd"], "gs://***@bucket/cache"),
        (["mirror", f"b2://{KEYED}/raw", "gs://mirror/raw"], "b2://***@bucket/raw"),
        (["mirror", "b2://raw/x", f"gs://{KEYED}/raw"], "gs://***@bucket/raw"),
        (["verify", f"s3://{KEYED}/cache/manifest.json"], "s3://***@bucket/cache/manifest.json"),
        (
            [
                *("build-cache", "--source", f"s3://{KEYED}/src"),
                *("--labels", "{labels}", "--out", "{tmp}/cache"),
            ],
            "s3://***@bucket/src",
        ),
    ],
    ids=["stage s3", "stage gs", "mirror source", "mirror destination", "verify", "build-cache"],
)
def test_a_key_written_into_a_url_is_refused_and_never_printed(
    octstage_cli: CLI, tiny_source: SynthInfo, tmp_path: Path, args: list[str], shown: str
) -> None:
    labels = tiny_source.root / "participants.tsv"
    ran = octstage_cli(*(a.format(tmp=tmp_path, labels=labels) for a in args))
    assert_clean(ran, 2, shown)
    assert KEY not in ran.out + ran.err and KEY_ID not in ran.out + ran.err
    assert not any(tmp_path.iterdir())  # nothing written
