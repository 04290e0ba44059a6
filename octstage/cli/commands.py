"""What each ``octstage`` subcommand runs: its arguments checked against one another, then one
``run_*`` call of its step. The steps (and the heavy libraries they load) are imported inside
each function, so that a refused argument costs no dask, zarr or cloud SDK import.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console

from octstage.errors import ConfigError, OctstageError
from octstage.storage.locations import redact_url

console = Console(stderr=True)


# synth's options that only one kind reads, and their defaults (the parser leaves them None).
SYNTH_KIND_ONLY = {
    "oct": ("participants", "full_size"),
    "cellpainting": ("plates", "sites", "size", "compounds", "learned"),
}
SYNTH_DEFAULTS = {
    "participants": 60,
    "plates": 4,
    "sites": 3,
    "size": 128,
    "compounds": 0,
    "learned": False,
}


def synth(a: argparse.Namespace) -> int:
    refuse_other_kinds_options(a, SYNTH_KIND_ONLY)
    for name, default in SYNTH_DEFAULTS.items():
        if getattr(a, name) is None:
            setattr(a, name, default)
    if a.kind == "cellpainting":
        from octstage.cellpainting.synth import run_synth_cellpainting

        return run_synth_cellpainting(
            Path(a.out),
            a.plates,
            a.sites,
            a.size,
            a.seed,
            not a.no_traps,
            a.compounds,
            overwrite=a.overwrite,
            learned=a.learned,
        )
    from octstage.dataset.synth import run_synth

    return run_synth(
        Path(a.out),
        participants=a.participants,
        seed=a.seed,
        full_size=a.full_size,
        traps=not a.no_traps,
        overwrite=a.overwrite,
    )


def audit(a: argparse.Namespace) -> int:
    from octstage.audit.run import run_audit

    return run_audit(
        labels=a.labels,  # a path or a URL: not a Path, which would mangle gs://
        oct_root=a.oct,
        json_out=Path(a.json) if a.json else None,
        min_overlap=a.min_overlap,
        plot=Path(a.plot) if a.plot else None,
        progress_seconds=a.progress_seconds,
        select={
            "device": tuple(a.select_device or ()),
            "region": tuple(a.select_region or ()),
            "eye": tuple(a.select_eye or ()),
        },
    )


# build-cache options that only one kind reads: given with the other kind they would be
# ignored, so a run would silently do something else than asked (--progress-seconds is harmless).
_KIND_ONLY = {
    "oct": (
        "labels",
        "config",
        "shape",
        "inventory",
        "no_verify_sources",
        "from_tsv",
        "concept",
        "max_reject_share",
    ),
    "cellpainting": (
        "load_data",
        "metadata",
        "select_source",
        "select_batch",
        "select_plate",
        "select_type",
        "map_prefix",
        "anonymous",
        "pack",
        "allow_unlabelled",
        "processes",
    ),
}


def refuse_other_kinds_options(
    a: argparse.Namespace, kind_only: Mapping[str, tuple[str, ...]] = _KIND_ONLY
) -> None:
    for kind, names in kind_only.items():
        given = [n for n in names if kind != a.kind and getattr(a, n) not in (None, False)]
        if given:
            flags = ", ".join("--" + n.replace("_", "-") for n in given)
            raise OctstageError(f"{flags}: only for --kind {kind}, not --kind {a.kind}")


def build(a: argparse.Namespace) -> int:
    refuse_other_kinds_options(a)
    if a.kind == "cellpainting":
        if a.processes and a.scheduler:
            raise OctstageError(
                "--processes starts a local cluster, --scheduler uses yours: give one of them"
            )
        from octstage.cellpainting.build import Selection, run_build_cellpainting

        select = Selection(
            tuple(a.select_source or ()),
            tuple(a.select_batch or ()),
            tuple(a.select_plate or ()),
            tuple(a.select_type or ()),
        )
        return run_build_cellpainting(
            select=select,
            prefix_map=tuple(a.map_prefix or ()),
            anonymous=a.anonymous,
            source=a.source,
            out=a.out,  # a folder or a bucket URL: not a Path, which would mangle gs://
            load_data=tuple(a.load_data or ()),
            metadata=a.metadata,
            workers=a.workers,
            json_out=Path(a.json) if a.json else None,
            manifest_path=Path(a.manifest) if a.manifest else None,
            manifest_form=a.manifest_form,
            pack=a.pack or 1,
            allow_unlabelled=a.allow_unlabelled,
            scheduler=a.scheduler,
            processes=a.processes or 0,
            progress_seconds=a.progress_seconds,
        )
    if not a.labels:
        raise OctstageError("--labels (participants.tsv) is required for --kind oct")
    from octstage.config import load_build_config

    # Settings are checked before the step (dask, zarr, pydicom) is imported: a refusal is quick.
    config = load_build_config(a.config, shape=tuple(a.shape) if a.shape else None)
    if a.inventory is not None and a.no_verify_sources:
        raise OctstageError("--inventory and --no-verify-sources contradict each other")
    from octstage.cachebuild.run import run_build

    return run_build(
        source=a.source,
        labels=a.labels,  # a path or a URL: not a Path, which would mangle gs://
        out=a.out,  # a folder or a bucket URL: not a Path, which would mangle gs://
        manifest=Path(a.manifest) if a.manifest else None,
        config=config,
        workers=a.workers,
        scheduler=a.scheduler,
        inventory=a.inventory,
        json_out=Path(a.json) if a.json else None,
        max_reject_share=a.max_reject_share,
        verify_sources=not a.no_verify_sources,
        progress_seconds=a.progress_seconds,
        from_tsv=a.from_tsv,
        concepts=tuple(a.concept or ()),
        manifest_form=a.manifest_form,
    )


def verify(a: argparse.Namespace) -> int:
    for given in (a.manifest, a.cache or ""):
        if "://" in given:  # a path with "s3:/" in it would be read as a missing local file
            raise ConfigError(
                f"{redact_url(given)}: verify reads a cache in a local folder; stage it first "
                "(`octstage stage URL FOLDER` checks every item against the manifest as it "
                "copies), then run `octstage verify FOLDER/manifest.json`"
            )
    from octstage.cache.verify import run_verify

    return run_verify(
        Path(a.manifest),
        cache=Path(a.cache) if a.cache else None,
        json_out=a.json,
        progress_seconds=a.progress_seconds,
    )


def mirror(a: argparse.Namespace) -> int:
    from octstage.mirror.run import run_mirror

    return run_mirror(
        a.src,
        a.dst,
        dry_run=a.dry_run,
        prune=a.prune,
        max_delete=a.max_delete,
        transfers=a.transfers,
        checkers=a.checkers,
        json_out=Path(a.json) if a.json else None,
        progress_seconds=a.progress_seconds,
        hash_missing=a.hash_missing,
    )


def stage(a: argparse.Namespace) -> int:
    from octstage.stage import run_stage

    return run_stage(
        a.src,
        Path(a.dst),
        transfers=a.transfers,
        json_out=Path(a.json) if a.json else None,
        progress_seconds=a.progress_seconds,
        replace=a.replace,
    )
