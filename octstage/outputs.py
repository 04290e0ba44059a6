"""One rule for every output folder: what it may already hold, what is refused, what is moved aside.

Every command that writes a folder asks this module first (the table is in
docs/output-folders.md): a training run folder (``claim_run_folder``), a cache that build-cache
writes (``check_cache_folder``), a report of evaluate, probe or profile (``replace_report``) and
a feature cache (``check_feature_cache``); a ``stage`` destination, octstage's alone, asks
``octstage.stage.destination``, which builds on the names here.
Nothing a user made is ever deleted: what a new output replaces is renamed aside
(``<name>.replaced-<timestamp>``), and a folder holding what the command cannot recognise as its
own is refused. A refusal is raised through the caller's own error class (``refuse``), so each
package keeps its own hierarchy and exit codes.

It lives in octstage, re-exported by ``octstage.manifest`` (the one module octtrain may import
from octstage), because the two packages share the folders: a cache is written by octstage and
read by octtrain, and both packages' commands write into the same kinds of folders. It imports
nothing but the standard library, ``octstage.errors`` and ``octstage.atomic`` (files written
whole, the Ctrl-C held back while a report is swapped in).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from octstage.atomic import ctrl_c_deferred

Refuse = Callable[[str], Exception]  # the caller's error class: ConfigError, MirrorError, ...

MANIFEST = "manifest.json"
# The columnar manifest's item table beside its header (octstage.manifest.columnar): part of a
# cache like the header, so a stage that stopped before the header still resumes into its folder.
ITEMS_SUFFIX = ".items.parquet"
VOLUMES = "volumes"
# What a cache of each kind keeps its arrays under (a cache of the other kind is refused).
DATA_FOLDERS = {"oct": "volumes", "cellpainting": "fields"}
RUN_MARKERS = ("config.yaml", "code_version", "metrics.jsonl", "checkpoints")  # what a run leaves
CHECKPOINT_INDEX = "index.json"


def _stamp() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def move_aside(path: Path) -> Path:
    """Rename ``path`` to ``<path>.replaced-<timestamp>`` (suffixed if taken); returns the name."""
    base = path.with_name(f"{path.name}.replaced-{_stamp()}")
    aside, n = base, 1
    while aside.exists():
        n += 1
        aside = base.with_name(f"{base.name}-{n}")
    path.rename(aside)
    return aside


# --- run folders -------------------------------------------------------------------------------


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds what an earlier run left there."""
    return any((path / marker).exists() for marker in RUN_MARKERS)


def cache_around(path: Path) -> Path | None:
    """The cache folder ``path`` lies inside (a parent holding a manifest and its arrays'
    folder), or None. A run, export or report written inside a cache would be among files that
    build-cache and ``stage --replace`` manage, so every such output is refused there."""
    for parent in Path(os.path.abspath(path)).parents:
        if (parent / MANIFEST).is_file() and any(
            (parent / sub).is_dir() for sub in DATA_FOLDERS.values()
        ):
            return parent
    return None


def refuse_inside_cache(path: Path, refuse: Refuse, what: str) -> None:
    """Refuse ``path`` as an output (``what`` names the option) when it lies inside a cache."""
    cache = cache_around(path)
    if cache is not None:
        raise refuse(
            f"{what} {path}: inside the cache folder {cache} (it holds {MANIFEST}); a cache holds "
            "only what octstage writes there: name a folder outside it"
        )


def holds_cache(path: Path) -> list[str]:
    """What in ``path`` belongs to a cache (its manifest, item table, array folders)."""
    names = [MANIFEST, *DATA_FOLDERS.values(), "packs"]
    found = [name for name in names if (path / name).exists()]
    return found + sorted(p.name for p in path.glob(f"*{ITEMS_SUFFIX}"))


def _indexed_checkpoints(folder: Path) -> int:
    """How many checkpoints ``folder/index.json`` lists (0: no index, unreadable or empty)."""
    try:
        data = json.loads((folder / CHECKPOINT_INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    entries = data.get("checkpoints") if isinstance(data, dict) else None
    return len(entries) if isinstance(entries, list) else 0


def _trained(path: Path, checkpoints: Path) -> list[str]:
    """What says a run trained in the run folder ``path`` (checkpoints, a logged step)."""
    found = sorted(p.name for p in checkpoints.glob("step_*.pt"))[:3]
    if _logged_a_step(path / "metrics.jsonl"):
        found.append("metrics.jsonl")
    return found


def _never_trained(path: Path, ckpts: Path, checkpoints: str | None) -> bool:
    """Whether the run in ``path`` stopped before its first step (nothing to resume or lose)."""
    local = "://" not in str(checkpoints)
    return local and not _trained(path, ckpts) and not _indexed_checkpoints(ckpts)


def _logged_a_step(metrics: Path) -> bool:
    """Whether ``metrics`` logs a training step. A run that failed before its first step logs
    only events (its summary): it trained nothing, so resume=auto may start afresh there.
    A run that trained logs a step in its first lines, so this reads little of a long file."""
    try:
        with metrics.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    return True  # not ours to judge: a run may have written it
                if not isinstance(row, dict) or "step" in row:
                    return True
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return False


def claim_run_folder(
    path: Path,
    resume: bool,
    overwrite: bool,
    refuse: Refuse,
    checkpoints: str | None = None,
) -> Path:
    """The explicit run folder ``path``, made. A folder holding a run is refused unless the run
    resumes (and then only when the index of its checkpoints, ``checkpoints`` or else
    ``path/checkpoints``, lists one to resume from, or it never trained: restarting at step 1
    would overwrite its checkpoints and append to its metrics) or ``overwrite`` asks for a new
    run there (the old one is moved aside first). A run that stopped before its first step
    (its metrics log only its summary) never trained; the refusal says so. A ``checkpoints``
    URL is not looked into."""
    if resume and overwrite:
        raise refuse("train.overwrite=true and checkpoint.resume contradict each other: choose one")
    if path.exists() and not path.is_dir():
        raise refuse(f"train.run_dir {str(path)!r}: exists and is not a folder")
    refuse_inside_cache(path, refuse, "train.run_dir")
    cache = holds_cache(path) if path.is_dir() else []
    if cache:
        raise refuse(
            f"train.run_dir {str(path)!r}: holds a cache ({', '.join(cache)}); a run would write "
            "its checkpoints, config.yaml and metrics.jsonl among the cache's files: name a "
            "folder of its own"
        )
    if path.is_dir() and holds_run(path):
        ckpts = path / "checkpoints" if checkpoints is None else Path(checkpoints)
        if resume:
            trained = [] if "://" in str(checkpoints) else _trained(path, ckpts)
            if trained and not _indexed_checkpoints(ckpts):
                raise refuse(
                    f"train.run_dir {str(path)!r} holds a run that trained ({', '.join(trained)})"
                    f" but {ckpts / CHECKPOINT_INDEX} is missing or lists no checkpoint: "
                    "checkpoint.resume=auto would start again at step 1 over it; resume from a "
                    "file with checkpoint.resume=<step_*.pt>, or start a new run there with "
                    "train.overwrite=true (the old run is moved aside)"
                )
        elif not overwrite and _never_trained(path, ckpts, checkpoints):
            # Still refused: another run may be starting there now (a second launch).
            raise refuse(
                f"train.run_dir {str(path)!r} already holds a run that never trained (no "
                "checkpoint, no logged step: it stopped before its first step); run again there "
                "with checkpoint.resume=auto (it starts afresh, as there is nothing to resume), or "
                "with train.overwrite=true to move it aside first"
            )
        elif not overwrite:
            raise refuse(
                f"train.run_dir {str(path)!r} already holds a run; continue it with "
                "checkpoint.resume=auto, or start a new run there with train.overwrite=true "
                "(the old run is moved to <run_dir>.replaced-<timestamp>)"
            )
        else:
            move_aside(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise refuse(f"train.run_dir {str(path)!r}: cannot create: {exc.strerror}") from None
    return path


# --- caches (build-cache) ----------------------------------------------------------------------


def _identity(manifest: Path) -> tuple[str, str, list[str], int] | None:
    """(kind, dataset, zarr paths, item count) of the manifest file, or None when it is not a
    readable one. The columnar form's header lists no item (they are in its table; the count is
    in its counts)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        kind = str(data.get("kind", "oct"))
        items = data.get("fields" if kind == "cellpainting" else "volumes", [])
        paths = [str(i["zarr_path"]) for i in items]
        counts = data["header"].get("counts", {})
        count = len(paths) or int(counts.get("fields" if kind == "cellpainting" else "volumes", 0))
        return kind, str(data["header"]["dataset"]), paths, count
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _same_dataset(a: str, b: str) -> bool:
    """Whether two ``dataset`` values name one source: URLs as written (a trailing ``/`` aside),
    local folders by their real path (``src``, ``./src`` and ``/data/src`` are one folder)."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def check_cache_folder(
    folder: Path | None,
    manifests: Iterable[Path],
    kind: str,
    refuse: Refuse,
    dataset: str | None = None,
) -> None:
    """Refuse to build a ``kind`` cache where another cache lives. A manifest file the build
    would write (``manifests``) is this cache's when it is of ``kind``, was built from this
    build's source ``dataset`` (when given) and lists no item or at least one item that is in
    the local cache ``folder`` (a rebuild brings it up to date in place, as build-cache always
    did); it is another cache's when it is of the other kind, of another dataset (a cache
    staged or built there from elsewhere: its items are all present, yet this build would
    replace its manifest), is no manifest at all, or none of its items is in ``folder``. A
    ``folder`` holding the other kind's arrays is refused too."""
    for path in manifests:
        if not path.exists():
            continue
        if path.is_dir():
            raise refuse(f"{path}: is a folder, not a manifest file to write")
        found = _identity(path)
        if found is None:
            raise refuse(
                f"{path}: exists and is not a readable manifest; build-cache would replace it: "
                "move it away or name another file"
            )
        old_kind, old_dataset, items, count = found
        if old_kind != kind:
            raise refuse(
                f"{path}: holds the manifest of a {old_kind} cache of {old_dataset!r} "
                f"({count} items); this build writes a {kind} cache: choose another "
                "--out / --manifest"
            )
        if dataset is not None and not _same_dataset(old_dataset, dataset):
            raise refuse(
                f"{path}: holds the manifest of another cache ({kind}, of {old_dataset!r}, "
                f"{count} items); this build reads {dataset!r} and would replace it: choose "
                f"another --out / --manifest (if {dataset!r} is that dataset moved, move "
                f"{path.name} and any {path.stem}{ITEMS_SUFFIX} aside first: the arrays are "
                "kept and reused by their keys)"
            )
        if folder is not None and items and not any((folder / p).exists() for p in items):
            raise refuse(
                f"{path}: holds the manifest of another cache ({kind}, of {old_dataset!r}, "
                f"{count} items, none of them in {folder}); building here would replace "
                "it: choose another --out / --manifest"
            )
    if folder is None or not folder.is_dir():
        return
    for other, sub in DATA_FOLDERS.items():
        if other != kind and (folder / sub).is_dir() and any((folder / sub).iterdir()):
            raise refuse(
                f"{folder}: holds a {other} cache ({sub}/), this build writes a {kind} cache; "
                "choose an empty folder"
            )


# --- reports and feature caches ----------------------------------------------------------------


def check_output_folder(folder: Path, refuse: Refuse, what: str = "--out") -> None:
    """``folder`` exists (made if absent) and can be written into; else refused, naming it."""
    if folder.exists() and not folder.is_dir():
        raise refuse(f"{what} {folder}: exists and is not a folder; name a folder to write into")
    refuse_inside_cache(folder, refuse, what)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise refuse(f"{what} {folder}: cannot create the folder: {exc.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise refuse(f"{what} {folder}: the folder is not writable")


def replace_report(
    folder: Path,
    belongs: Callable[[str], bool],
    write: Callable[[Path], Any],
    refuse: Refuse,
    what: str = "--out",
) -> Path | None:
    """Write a report into ``folder`` whole or not at all; returns where the earlier report went.

    ``write(tmp)`` writes the new report's files into a temporary folder inside ``folder`` (the
    same disk, so renames are atomic); if it fails or is interrupted the temporary goes (it
    holds only this run's partial files) and ``folder`` is untouched. Then, with Ctrl-C held
    back, every entry of ``folder`` that ``belongs`` to an earlier report of the same kind is
    moved into ``folder/replaced-<timestamp>/`` (never deleted) and the new files take their
    places. Other files (a run's checkpoints, another split's report) stay where they are.
    """
    check_output_folder(folder, refuse, what)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".report-", dir=folder))
    except OSError as exc:
        raise refuse(f"{what} {folder}: cannot write into the folder: {exc.strerror}") from None
    try:
        write(tmp)
        with ctrl_c_deferred():
            old = sorted(p for p in folder.iterdir() if p != tmp and belongs(p.name))
            aside = None
            if old:
                aside = folder / f"replaced-{_stamp()}"
                n = 1
                while aside.exists():
                    n += 1
                    aside = folder / f"replaced-{_stamp()}-{n}"
                aside.mkdir()
                for p in old:
                    p.rename(aside / p.name)
            for p in sorted(tmp.iterdir()):
                p.rename(folder / p.name)
            tmp.rmdir()
        return aside
    except OSError as exc:
        raise refuse(f"{what} {folder}: cannot write the report: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # only this run's partial files


def check_feature_cache(folder: Path, refuse: Refuse, what: str = "--feature-cache") -> None:
    """A feature cache is a folder this command may write into; its files are written one by one,
    each atomically, and named by their key, so an earlier cache's files are reused or ignored."""
    check_output_folder(folder, refuse, what)


# --- exports -----------------------------------------------------------------------------------


def claim_export_folder(
    folder: Path,
    plan_name: str,
    own: Callable[[str], bool],
    identity: dict[str, Any],
    refuse: Refuse,
    what: str = "--out",
) -> dict[str, Any] | None:
    """An export folder (``octtrain embed``) may be new, empty, or hold an earlier export of the
    same ``identity`` (its plan file ``plan_name`` records it): then the earlier plan is
    returned and the export resumes, reusing its finished parts. A folder holding another
    export, or anything that is not an export's (``own`` says which names are), is refused,
    naming what differs or what was found and the way out; nothing in it is touched."""
    check_output_folder(folder, refuse, what)
    entries = sorted(p.name for p in folder.iterdir())
    foreign = [name for name in entries if name != plan_name and not own(name)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise refuse(
            f"{what} {folder}: holds what is not an embedding export ({shown}); name an empty "
            "or new folder, or the folder of an earlier export of the same checkpoint and "
            "manifest to resume it"
        )
    plan_path = folder / plan_name
    if not plan_path.exists():
        if entries:
            raise refuse(
                f"{what} {folder}: holds export files but no {plan_name} saying whose they are; "
                "name an empty or new folder (or move this one away)"
            )
        return None
    try:
        earlier: Any = json.loads(plan_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise refuse(f"{plan_path}: unreadable ({exc}); name an empty or new {what}") from None
    if not isinstance(earlier, dict):
        raise refuse(f"{plan_path}: not an export plan; name an empty or new {what}")
    differ = {k: (earlier.get(k), v) for k, v in identity.items() if earlier.get(k) != v}
    if differ:
        said = "; ".join(f"{k}: {old!r} there, {new!r} now" for k, (old, new) in differ.items())
        raise refuse(
            f"{what} {folder}: holds the export of another run ({said}); name another "
            f"{what}, or move this one away to export again there"
        )
    return dict(earlier)
