"""What bad input gets from ``octtrain``: one line naming the file, key or value, a documented
exit code, no traceback, and nothing already done lost.

Each case runs the real command in a subprocess (so a traceback would show) on a small real
cache (``tests/octtrain/tiny_cache.py``). Add a case: a row in ``CASES`` (a damage to a fresh
copy of the cache, the command's arguments, the exit code and what the message must name).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from octtrain import cli, exitcodes
from octtrain.runtime.checkpoint import load_checkpoint
from octtrain.runtime.watchdog import STALL_EXIT_CODE
from tests.badinput.conftest import sigint_as_at_a_terminal
from tests.octstage.chunk_damage import flip_decodable
from tests.octtrain.tiny_cache import write_tiny_cache

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "configs" / "pretrain" / "tiny.yaml"
FINETUNE = ROOT / "configs" / "finetune" / "tiny.yaml"
DINO_TINY = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"
SHARD = "0/c/0/0/0"  # the one data object of a tiny volume (one shard covers it)
FAST = ["train.max_steps=2", "logging.log_every=1", "train.stall_timeout_s=60"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small cache (train/val/test 8/4/4 volumes) never damaged; tests copy it."""
    root = tmp_path_factory.mktemp("badinput-cache")
    write_tiny_cache(root, counts={"train": 2, "val": 1, "test": 1})
    return root / "cache"


@pytest.fixture
def cache(pristine: Path, tmp_path: Path) -> Path:
    """A private copy of the cache, free to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "cache"))


def octtrain(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "octtrain.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def train_shards(cache: Path) -> list[Path]:
    return sorted((cache / "volumes").glob(f"*/*.ome.zarr/{SHARD}"))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def corrupt_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100:140] = bytes(40)  # the shard index (its checksum) stays intact: blosc fails
    path.write_bytes(bytes(data))


def flip_in_shard(path: Path) -> None:
    flip_decodable(path.parents[3])  # the array's folder; blosc still decodes the chunk


def each_shard(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda cache: [damage(p) for p in train_shards(cache)] and None


def remove_volumes(cache: Path) -> None:
    for folder in (cache / "volumes").iterdir():
        shutil.rmtree(folder)


@dataclass(frozen=True)
class Case:
    name: str
    damage: Callable[[Path], None]
    extra: tuple[str, ...]  # more arguments to ``pretrain``
    code: int
    names: tuple[str, ...]  # regexes the one error line must match


DATA_CASES = [
    Case("shard missing", each_shard(os.remove), (), 4, (r"data object c/0/0/0 is missing",)),
    Case(
        "shard truncated, in a loader worker",
        each_shard(truncate),
        ("data.num_workers=2",),
        4,
        (r"does not decode",),
    ),
    Case("shard corrupt (blosc)", each_shard(corrupt_middle), (), 4, (r"does not decode",)),
    Case(
        "a chunk changed yet still decodable, in a loader worker",
        each_shard(flip_in_shard),
        ("data.num_workers=1",),
        4,
        (r"does not decode .*fails its crc32c checksum", r"octstage verify"),
    ),
    Case(
        "volume missing, in a loader worker",
        remove_volumes,
        ("data.num_workers=1",),
        4,
        (r"not in the cache",),
    ),
]


def assert_clean(proc: subprocess.CompletedProcess[str], code: int, *names: str) -> str:
    """Exit ``code``, no traceback, one ERROR line that matches every regex in ``names``."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out and "Caught " not in out, out[-3000:]
    errors = [line for line in out.splitlines() if " ERROR " in line or "error:" in line]
    assert len(errors) == 1, out[-3000:]
    for pattern in names:
        assert re.search(pattern, errors[0]), errors[0]
    return errors[0]


@pytest.mark.parametrize("case", DATA_CASES, ids=lambda c: c.name)
def test_damaged_cache_is_a_data_error_never_zeros(case: Case, cache: Path, tmp_path: Path) -> None:
    case.damage(cache)
    runs = tmp_path / "runs"
    proc = octtrain(
        "pretrain",
        "--config",
        PRETRAIN,
        "--manifest",
        cache / "manifest.json",
        f"train.output_dir={runs}",
        *FAST,
        *case.extra,
    )
    line = assert_clean(proc, case.code, *case.names, r"volume k\d+", str(cache / "volumes"))
    assert "octstage verify" in line
    assert not list(runs.glob("*/checkpoints/*.pt"))  # nothing trained on what is not there


def test_run_dir_holding_a_run_is_refused_unless_resume_or_overwrite(
    pristine: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    base = ["pretrain", "--config", PRETRAIN, "--manifest", pristine / "manifest.json"]
    # The runs that succeed run in this process (seconds); the refusal in a subprocess.
    assert cli.main([*map(str, base), f"train.run_dir={run}", *FAST]) == 0
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    metrics = (run / "metrics.jsonl").read_bytes()

    again = octtrain(*base, f"train.run_dir={run}", *FAST)
    assert_clean(again, 2, re.escape(str(run)), "checkpoint.resume=auto", "train.overwrite=true")
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before
    assert (run / "metrics.jsonl").read_bytes() == metrics

    resume = [f"train.run_dir={run}", "checkpoint.resume=auto", "train.max_steps=3"]
    assert cli.main([*map(str, base), *resume]) == 0
    assert load_checkpoint(str(run / "checkpoints"))["step"] == 3  # continued, not restarted
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    metrics = (run / "metrics.jsonl").read_bytes()

    assert cli.main([*map(str, base), f"train.run_dir={run}", "train.overwrite=true", *FAST]) == 0
    (aside,) = tmp_path.glob("run.replaced-*")
    assert {p.name: p.read_bytes() for p in (aside / "checkpoints").iterdir()} == before
    assert (aside / "metrics.jsonl").read_bytes() == metrics


def test_checkpoint_dir_holding_another_runs_checkpoints_is_refused(
    pristine: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "ckpt"
    base = ["pretrain", "--config", PRETRAIN, "--manifest", pristine / "manifest.json"]
    assert (
        cli.main(
            [*map(str, base), f"train.run_dir={tmp_path / 'a'}", f"checkpoint.dir={shared}", *FAST]
        )
        == 0
    )
    before = {p.name: p.read_bytes() for p in shared.iterdir()}

    again = octtrain(*base, f"train.run_dir={tmp_path / 'b'}", f"checkpoint.dir={shared}", *FAST)
    assert_clean(again, 2, re.escape(str(shared)), "index.json", "checkpoint.resume=auto")
    assert {p.name: p.read_bytes() for p in shared.iterdir()} == before
    assert not (tmp_path / "b").exists()  # refused before any folder was made
    resume = [
        f"train.run_dir={tmp_path / 'a'}",
        f"checkpoint.dir={shared}",
        "checkpoint.resume=auto",
    ]
    assert cli.main([*map(str, base), *resume, "train.max_steps=3"]) == 0


def _text_file(tmp: Path) -> Path:
    (tmp / "notes.txt").write_text("not a checkpoint\n")
    return tmp / "notes.txt"


def _garbage_pt(tmp: Path) -> Path:
    # seeded: random bytes that trip the unpickler with an IndexError (torch 2.13), which
    # once reached the user as a traceback in about one run in nine
    rng = random.Random(7)
    (tmp / "step_00000001.pt").write_bytes(bytes(rng.getrandbits(8) for _ in range(2048)))
    return tmp / "step_00000001.pt"


def _folder_with_bad_index(tmp: Path) -> Path:
    (tmp / "ck").mkdir()
    (tmp / "ck" / "index.json").write_text("{}")
    return tmp / "ck"


@pytest.mark.parametrize(
    "make",
    [_text_file, _garbage_pt, lambda tmp: tmp / "missing.pt", _folder_with_bad_index],
    ids=["text file", "corrupt checkpoint", "missing file", "folder with a bad index.json"],
)
def test_bad_init_checkpoint_is_one_line(
    make: Callable[[Path], Path], pristine: Path, tmp_path: Path
) -> None:
    init = make(tmp_path)
    proc = octtrain(
        "finetune",
        "--config",
        FINETUNE,
        "--manifest",
        pristine / "manifest.json",
        f"train.output_dir={tmp_path / 'runs'}",
        "--init",
        init,
    )
    assert_clean(proc, 2, re.escape(str(init)))


def test_evaluate_out_naming_a_file_is_refused(pristine: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    out.write_text("{}")
    proc = octtrain(
        "evaluate", "--checkpoint", tmp_path / "x.pt", "--manifest", pristine / "manifest.json",
        "--out", out,
    )  # fmt: skip
    assert_clean(proc, 2, re.escape(str(out)), "not a folder")
    assert out.read_text() == "{}"


PROBE = (
    "import sys; from octtrain.cli import main; code = main(sys.argv[1:]); "
    "print('TORCH-IMPORTED' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(code)"
)


def refusal(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (
            ["pretrain", "--config", PRETRAIN, "train.max_stepz=1"],
            ("command line", "'train.max_stepz'"),
        ),
        (["pretrain", "--config", PRETRAIN, "optim.lr=fast"], ("command line", "lr", "'fast'")),
        (
            # Overrides before and after another option: the last one still reaches the config.
            [
                "finetune",
                "--config",
                FINETUNE,
                "data.batch_size=4",
                "--init",
                "x",
                "train.epochz=1",
            ],
            ("command line", "'train.epochz'"),
        ),
    ],
    ids=["unknown key", "bad value", "overrides among options"],
)
def test_config_refusal_blames_the_command_line_without_torch(
    args: list[str | Path], names: tuple[str, ...]
) -> None:
    proc = refusal(*args)
    assert_clean(proc, 2, *names)
    assert "NO-TORCH" in proc.stdout


@pytest.mark.parametrize("job", ["pretrain", "finetune", "dino"])
def test_a_batch_larger_than_the_split_is_refused_before_anything_is_built(
    job: str, pristine: Path, tmp_path: Path
) -> None:
    """Every job refuses a batch its training split cannot fill (the loader would repeat items
    to fill it), naming the value, the split and its size, before a model or a checkpoint."""
    from tests.octtrain.cell_cache import write_cell_cache

    manifest, what = pristine / "manifest.json", "volumes"
    config = {"pretrain": PRETRAIN, "finetune": FINETUNE, "dino": DINO_TINY}[job]
    extra = ["init_encoder=random"] if job == "finetune" else []
    if job == "dino":
        (tmp_path / "cells").mkdir()
        write_cell_cache(tmp_path / "cells")
        manifest, what = tmp_path / "cells" / "manifest.json", "fields"
    command = "finetune" if job == "finetune" else "pretrain"
    run = tmp_path / "run"
    proc = octtrain(
        command, "--config", config, "--manifest", manifest, f"train.run_dir={run}",
        "data.batch_size=1000", *extra,
    )  # fmt: skip
    assert_clean(proc, 2, "data.batch_size 1000", "split 'train' holds", what, "at most")
    assert not (run / "checkpoints").exists()


def test_a_key_written_into_a_checkpoint_url_is_refused_and_never_printed() -> None:
    secret = "GOOG1EXAMPLEKEY:s3cr3t-example-value"
    for key in ("checkpoint.dir", "checkpoint.resume"):
        proc = refusal("pretrain", "--config", PRETRAIN, f"{key}=gs://{secret}@bucket/ckpt")
        assert_clean(proc, 2, key.split(".")[1], re.escape("gs://***@bucket/ckpt"), "credentials")
        assert "s3cr3t" not in proc.stdout + proc.stderr and "NO-TORCH" in proc.stdout


def test_config_error_in_the_yaml_blames_the_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(PRETRAIN.read_text().replace("max_steps: 30", "max_stepz: 30"))
    proc = refusal("pretrain", "--config", bad, "train.seed=1")
    assert_clean(proc, 2, re.escape(str(bad)), "'train.max_stepz'")
    assert "NO-TORCH" in proc.stdout


def test_bad_flag_is_refused_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "pretrain", "--config", str(PRETRAIN), "--confg", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--confg" in proc.stderr and "TORCH-IMPORTED" not in proc.stdout


def test_ctrl_c_in_pretrain_exits_130_keeping_checkpoints(pristine: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    args = [
        sys.executable, "-m", "octtrain.cli", "pretrain", "--config", str(PRETRAIN),
        "--manifest", str(pristine / "manifest.json"), f"train.run_dir={run}",
        "train.max_steps=100000", "checkpoint.every=2", "data.num_workers=1",
    ]  # fmt: skip
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=sigint_as_at_a_terminal,
    )
    index = run / "checkpoints" / "index.json"
    deadline = time.monotonic() + 240
    while not index.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()  # a run that outlives the test would train on and load the next tests
    done = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
    assert_clean(done, 130, "interrupted")
    assert load_checkpoint(str(run / "checkpoints"))["step"] >= 2


def _epilog_codes(text: str) -> set[int]:
    section = text.split("exit codes:", 1)[1]
    return {int(m) for m in re.findall(r"^\s+(\d+)\s", section, flags=re.MULTILINE)}


def test_every_exit_code_used_is_listed_in_every_help() -> None:
    source = "".join(p.read_text() for p in sorted((ROOT / "octtrain" / "cli").glob("*.py")))
    table = {row.code for row in exitcodes.TABLE}
    constants = {cli.EXIT_OK, cli.EXIT_REFUSED, cli.EXIT_NONFINITE, cli.EXIT_DATA}
    constants |= {cli.EXIT_STALLED, cli.EXIT_INTERRUPTED, cli.EXIT_PEER_LOST, cli.EXIT_TERMINATED}
    assert cli.EXIT_STALLED == STALL_EXIT_CODE  # the watchdog exits by itself with this code
    literals = {int(n) for n in re.findall(r"(?:return|SystemExit\(|exit\()\s*(\d+)", source)}
    used = constants | literals | {2}  # 2: argparse's own refusal of a bad flag
    assert used == table  # every code the CLI can end with comes from the one table
    parser = cli.build_parser()
    helps = [parser.format_help()]
    sub = next(a for a in parser._actions if a.dest == "command")
    helps += [p.format_help() for p in sub.choices.values()]  # type: ignore[union-attr]
    for text in helps:
        assert _epilog_codes(text) == used, text


def test_an_item_table_changed_after_its_header_stops_doctor_and_every_consumer(
    pristine: Path, tmp_path: Path
) -> None:
    """One byte of the columnar manifest's item table changed (same size, the footer intact):
    rows could read as other splits, labels or shapes. The one check of a manifest hashes the
    table against its header, so ``doctor`` (and the trainer, ``embed``, ...) stop there."""
    from octstage import manifest as mf

    cache = Path(shutil.copytree(pristine, tmp_path / "cache"))
    header = cache / "table.json"
    mf.write(mf.load(cache / "manifest.json"), header, form="table")
    table = cache / "table.items.parquet"
    data = bytearray(table.read_bytes())
    data[len(data) // 3] ^= 0x01
    table.write_bytes(bytes(data))
    proc = octtrain("doctor", "--config", PRETRAIN, "--manifest", header)
    assert_clean(proc, 4, r"table\.items\.parquet", r"SHA-256", r"octstage stage")
    # verify names the table too, whether the changed bytes still decode (its SHA-256) or not.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000"}
    ran = subprocess.run(
        [sys.executable, "-m", "octstage.cli", "verify", str(header)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    out = ran.stdout + ran.stderr
    assert ran.returncode in (1, 2) and "Traceback" not in out, out[-3000:]
    assert "table.items.parquet" in out and ("SHA-256" in out or "does not decode" in out), out


def test_run_dir_holding_a_cache_is_refused_and_left_as_it_was(cache: Path, tmp_path: Path) -> None:
    before = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    proc = octtrain(
        "pretrain", "--config", PRETRAIN, "--manifest", cache / "manifest.json",
        f"train.run_dir={cache}", *FAST,
    )  # fmt: skip
    assert_clean(proc, 2, re.escape(str(cache)), r"holds a cache \(manifest\.json, volumes\)")
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == before
