"""``octtrain embed`` on several processes as a pod or a scheduler runs it, and stopped as they
stop it: a slow process, a process whose field read fails, a process that read another
manifest, a peer SIGKILLed, SIGTERM mid-part, a temporary part an earlier run left.

Each process is started as one host's (RANK, WORLD_SIZE, MASTER_ADDR/PORT set as torchrun sets
them; not torchrun itself, which SIGTERMs the survivors of a failed process before they can say
anything), gloo on CPU, with its fault put by ``embed_fault_cli.py`` and its own log. The
collectives' timeout is shortened to 12 s, so that a process left waiting for longer fails in
seconds, not the backend's 10 minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from octtrain.embed.export import read_groups
from tests.octtrain.embed_fixtures import ROOT, embed, embed_args, stopped_mid_part

WORKER = ROOT / "tests" / "octtrain" / "embed_fault_cli.py"
TIMEOUT_S = "12"


@pytest.fixture
def twin(embed_twin: SimpleNamespace) -> SimpleNamespace:
    """The session's twin, checkpoint and export (``embed_fixtures.py``)."""
    return embed_twin


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hosts(args: list[str], faults: dict[str, str], world: int = 2) -> list[tuple[int, str]]:
    """(exit code, log) of each of ``world`` processes running ``octtrain ARGS``."""
    port = str(_free_port())
    base = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    base |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(world)}
    base |= {"EMBED_TIMEOUT_S": TIMEOUT_S, **faults}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**base, "RANK": str(r), "LOCAL_RANK": "0"},
        )
        for r in range(world)
    ]
    out = []
    try:
        for p in procs:
            text = p.communicate(timeout=240)[0].decode(errors="replace")
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _copy(twin: SimpleNamespace, name: str) -> Path:
    out = twin.tmp / name
    shutil.copytree(twin.export, out)
    return out


def _hidden(out: Path) -> list[str]:
    return [p.name for p in [*out.iterdir(), *(out / "parts").iterdir()] if p.name[0] == "."]


def test_a_process_20x_slower_than_its_peer_finishes_without_a_timeout(
    twin: SimpleNamespace,
) -> None:
    """Process 1 takes 2 s a part (its peer ~0.1 s): its peer, done with its share long before,
    waits ~18 s for it in all; the processes agreeing after every batch, no single wait comes
    near the 12 s timeout."""
    out = twin.tmp / "slow"
    ran = hosts(embed_args(twin, out, "--json"), {"EMBED_SLOW_RANK": "1", "EMBED_SLOW_S": "2"})
    for code, text in ran:
        assert code == 0, text[-3000:]
    assert read_groups(out).equals(read_groups(twin.export))


def test_every_process_embeds_the_checkpoint_process_0_resolved(twin: SimpleNamespace) -> None:
    """The checkpoint folder is resolved (best, else latest) once, on process 0: a folder that
    training moves on cannot give two processes two checkpoints. Here process 1's own
    ``--checkpoint`` names nothing at all; it embeds process 0's file."""
    (twin.tmp / "checkpoints-0").symlink_to(twin.checkpoint, target_is_directory=True)
    out = twin.tmp / "resolved-once"
    args = embed_args(twin, out, "--limit", "40")
    args[args.index(str(twin.checkpoint))] = str(twin.tmp / "checkpoints-{rank}")
    ran = hosts(args, {})
    for code, text in ran:
        assert code == 0, text[-3000:]


def test_process_0_s_group_table_failing_after_minutes_stops_both_named(
    twin: SimpleNamespace,
) -> None:
    """Process 0 writes the group table alone, for 15 s (longer than the 12 s timeout), then a
    storage client's error: process 1 waits beside it agreeing every few seconds, and both end
    with its message (exit 2), no timeout, no traceback on process 1."""
    out = twin.tmp / "finish-fails"
    ran = hosts(embed_args(twin, out), {"EMBED_FINISH_RANK": "0", "EMBED_FINISH_S": "15"})
    for code, text in ran:
        assert code == 2, text[-3000:]
        assert "ConnectionResetError: gs://bucket/export/wells.parquet" in text, text[-3000:]
    assert "host 0 failed writing the per-group table" in ran[1][1]
    assert "Traceback" not in ran[1][1]


@pytest.mark.parametrize(
    ("fault", "code", "message"),
    [
        ("EMBED_FAIL_RANK", 4, "field 0 of rank 1: cannot read its pack"),
        # not an octtrain error: rank 1's traceback is logged there, and both still agree
        ("EMBED_BUG_RANK", 2, "RuntimeError: DataLoader worker of rank 1 is killed by signal"),
    ],
)
def test_a_field_read_failing_on_one_process_stops_every_process_with_its_message(
    twin: SimpleNamespace, fault: str, code: int, message: str
) -> None:
    """Process 1 cannot read its first field while process 0 is slow (2 s a part): both exit
    with the failure's code at the next batch, each log with its message, no timeout."""
    out = twin.tmp / f"unreadable-{code}"
    faults = {fault: "1", "EMBED_SLOW_RANK": "0", "EMBED_SLOW_S": "2"}
    ran = hosts(embed_args(twin, out), faults)
    for code_, text in ran:
        assert code_ == code, text[-3000:]
        assert message in text, text[-3000:]
        assert code == 2 or "Traceback" not in text, text[-3000:]
    assert "host 1 failed embedding its parts" in ran[0][1]
    assert "Traceback" not in ran[0][1]


def test_a_process_that_read_another_manifest_is_refused_at_setup_both_named(
    twin: SimpleNamespace,
) -> None:
    """Process 1's manifest lists the same fields in other bytes (a copy re-indented): both
    processes refuse before anything is embedded, each naming both SHA-256s."""
    folder = twin.manifest.parent
    text = twin.manifest.read_text(encoding="utf-8")
    (folder / "m-0.json").write_text(text, encoding="utf-8")
    (folder / "m-1.json").write_text(json.dumps(json.loads(text), indent=1), encoding="utf-8")
    out = twin.tmp / "two-manifests"
    args = embed_args(twin, out)
    args[args.index(str(twin.manifest))] = str(folder / "m-{rank}.json")
    ran = hosts(args, {})
    from octtrain.embed.parts import sha256_file

    shas = [sha256_file(folder / f"m-{r}.json") for r in (0, 1)]
    for code, log in ran:
        assert code == 2, log[-3000:]
        assert all(sha in log for sha in shas), log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    assert not list((out / "parts").glob("part-*")) if (out / "parts").exists() else True


def test_a_peer_sigkilled_mid_export_ends_the_survivor_named_not_a_traceback(
    twin: SimpleNamespace,
) -> None:
    out = twin.tmp / "peer-killed"
    ran = hosts(embed_args(twin, out), {"EMBED_KILL_RANK": "1", "EMBED_KILL_PART": "2"})
    assert ran[1][0] == -signal.SIGKILL
    code, text = ran[0]
    assert code == 6, text[-3000:]
    assert "lost contact with the process at 127.0.0.1:" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_sigterm_mid_part_keeps_the_finished_parts_and_leaves_no_half_part(
    twin: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM (what torchrun, Slurm and Kubernetes send) as a part is written: exit 143 named,
    the finished parts kept, no temporary file; the resume's tables equal an uninterrupted
    export's."""
    out = twin.tmp / "terminated"
    code, text = stopped_mid_part(twin, out, lambda proc: proc.send_signal(signal.SIGTERM))
    assert code == 143, text[-3000:]
    assert "stopped by SIGTERM" in text and "Traceback" not in text, text[-3000:]
    assert 2 <= len(list((out / "parts").glob("part-*.json"))) < 18
    assert not _hidden(out)
    assert embed(twin, out) == 0
    assert read_groups(out).equals(read_groups(twin.export))


def test_a_resume_removes_the_temporary_files_an_earlier_run_left(
    twin: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGKILL (or a power cut) leaves a part's and the group table's temporary files: the
    resume removes them and finishes the export."""
    out = _copy(twin, "stale")
    (out / "embed.json").unlink()
    (out / "parts" / "part-00003.json").unlink()
    (out / "parts" / ".part-00003.parquet.99999.tmp").write_bytes(b"half a part")
    (out / ".wells.parquet.99999.tmp").write_bytes(b"half a table")
    assert embed(twin, out) == 0
    assert not _hidden(out)
    assert ".part-00003.parquet.99999.tmp: a temporary file an earlier run left" in caplog.text
    assert read_groups(out).equals(read_groups(twin.export))
