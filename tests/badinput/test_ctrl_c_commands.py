"""Ctrl-C in ``octtrain doctor``, ``octtrain profile`` and ``octstage stage``/``verify``/``mirror``/
``audit-ids``, sent to the process group as a terminal sends it: exit 130, one line, no
traceback, nothing half-written.

The moment is made certain, not guessed: the first open of a file the command reads (the first
one, or for stage and verify a volume's shard, read in a worker thread) waits on a named pipe
outside the command's folders (``slow_open.py``: a slow disk or bucket), and the Ctrl-C is sent
once it waits there. The pipe is closed a moment later, as the slow read would end, so nothing
can hang on it."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from tests.badinput.conftest import start_as_at_a_terminal

ROOT = Path(__file__).resolve().parents[2]


def _interrupted_while_reading(module: str, args: list[str], slow: Path) -> tuple[int, str]:
    """Run ``MODULE ARGS``; Ctrl-C its group while its first open of ``slow`` (made empty when
    absent) waits."""
    slow.touch()
    gates = Path(tempfile.mkdtemp(prefix="slow-open-"))
    try:
        return _interrupt(module, args, slow, gates / "gate")
    finally:
        shutil.rmtree(gates)


def _interrupt(module: str, args: list[str], slow: Path, pipe: Path) -> tuple[int, str]:
    os.mkfifo(pipe)
    proc = start_as_at_a_terminal(module, args, ROOT, slow_open=(slow, pipe))
    writer, started = -1, time.monotonic()
    try:
        while writer < 0 and proc.poll() is None and time.monotonic() - started < 120:
            try:  # opens only once the command has the pipe open for reading
                writer = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO, exc
                time.sleep(0.02)
        assert writer >= 0 and proc.poll() is None, "the command never read the pipe"
        time.sleep(0.2)  # from open() to the read that waits
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(1.0)
        os.close(writer)  # the slow read ends (empty), whoever was waiting on it
        writer = -1
        out, _ = proc.communicate(timeout=60)  # a hang fails here
    finally:
        if writer >= 0:
            os.close(writer)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out.decode(errors="replace")


def _assert_interrupted(code: int, out: str) -> None:
    assert code == 130, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if "interrupted" in line]
    assert len(lines) == 1, out[-3000:]


def test_ctrl_c_in_octtrain_doctor(tmp_path: Path) -> None:
    manifest = tmp_path / "cache" / "manifest.json"
    manifest.parent.mkdir()
    code, out = _interrupted_while_reading(
        "octtrain.cli", ["doctor", "--manifest", str(manifest)], manifest
    )
    _assert_interrupted(code, out)


def test_ctrl_c_in_octtrain_profile_leaves_no_report(tmp_path: Path) -> None:
    manifest = tmp_path / "cache" / "manifest.json"
    manifest.parent.mkdir()
    out_dir = tmp_path / "out"
    args = ["profile", "--checkpoint", str(tmp_path / "step_1.pt"), "--manifest", str(manifest)]
    code, out = _interrupted_while_reading(
        "octtrain.cli", [*args, "--out", str(out_dir), "--device", "cpu"], manifest
    )
    _assert_interrupted(code, out)
    assert not out_dir.exists() or not list(out_dir.iterdir())


@pytest.mark.parametrize("command", ["verify", "stage"])
def test_ctrl_c_in_octstage_verify_and_stage_leaves_no_manifest(
    tmp_path: Path, command: str
) -> None:
    src = tmp_path / "cache"
    src.mkdir()
    dst = tmp_path / "staged"
    args = (
        [command, str(src / "manifest.json")]
        if command == "verify"
        else [command, str(src), str(dst)]
    )
    code, out = _interrupted_while_reading("octstage.cli", args, src / "manifest.json")
    _assert_interrupted(code, out)
    assert not (dst / "manifest.json").exists()
    assert not dst.exists() or not list(dst.glob("**/.tmp-*"))


def test_ctrl_c_in_octstage_audit_ids(tmp_path: Path) -> None:
    labels = tmp_path / "participants.tsv"
    oct_dir = tmp_path / "retinal_oct"
    oct_dir.mkdir()
    report = tmp_path / "audit.json"
    args = ["audit-ids", "--labels", str(labels), "--oct", str(oct_dir), "--json", str(report)]
    code, out = _interrupted_while_reading("octstage.cli", args, labels)
    _assert_interrupted(code, out)
    assert not report.exists()


@pytest.mark.parametrize("command", ["stage", "verify"])
def test_ctrl_c_in_stage_and_verify_while_a_volume_is_read(tmp_path: Path, command: str) -> None:
    # The middle of the work: the second volume's shard waits, in a worker thread.
    from octstage import manifest as mf
    from tests.octtrain.tiny_cache import write_tiny_cache

    manifest, src = write_tiny_cache(tmp_path, counts={"train": 1, "val": 1, "test": 1})
    volume = mf.load(manifest).volumes[1]
    (shard,) = (p for p in (src / volume.zarr_path / "0" / "c").rglob("*") if p.is_file())
    dst = tmp_path / "staged"
    args = [command, str(src), str(dst), "--transfers", "1"]
    if command == "verify":
        args = [command, str(manifest)]
    code, out = _interrupted_while_reading("octstage.cli", args, shard)
    _assert_interrupted(code, out)
    assert not (dst / "manifest.json").exists()
    assert not dst.exists() or not list(dst.rglob(".stage-*"))  # no half-fetched volume
    assert not (dst / volume.zarr_path).exists()  # the one cut short is not kept


def test_ctrl_c_in_octstage_mirror_leaves_no_report(tmp_path: Path) -> None:
    """Interrupted while it hashes the source (a slow read of one object): nothing copied is
    claimed, no report is written."""
    src, dst = tmp_path / "src" / "v3", tmp_path / "dst"
    src.mkdir(parents=True)
    (src / "a.dcm").write_bytes(b"x" * 1000)
    report = tmp_path / "report.json"
    args = ["mirror", str(src), str(dst), "--hash-missing", "--json", str(report)]
    code, out = _interrupted_while_reading("octstage.cli", args, src / "b.dcm")
    _assert_interrupted(code, out)
    assert not report.exists()
