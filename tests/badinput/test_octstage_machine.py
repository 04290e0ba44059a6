"""octstage when a file or the machine fails: an unreadable file is one exclusion with its
reason; a full disk names the path; Ctrl-C is one line and loses nothing; a worker losing
its scheduler prints no traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from octstage import manifest as mf
from tests.badinput.conftest import Ran, assert_clean, sigint_as_at_a_terminal, tiny_build

CLI = Callable[..., Ran]


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
        *tiny_build(source, labels, out),
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
        *tiny_build(root, root / "participants.tsv", out),
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
        *tiny_build(str(root), str(root / "participants.tsv"), str(out)),
    ]
    # A terminal's Ctrl-C reaches the whole process group: the driver and its dask workers.
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "1000"},
        preexec_fn=sigint_as_at_a_terminal,
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("records/*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the build ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # nothing of the group outlives the test
            os.killpg(proc.pid, signal.SIGKILL)
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
