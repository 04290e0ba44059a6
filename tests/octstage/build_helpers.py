"""Helpers shared by the build-cache tests: the small config, one build call, the Built record."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octstage import manifest as mf
from octstage.cachebuild.run import run_build
from octstage.config import BuildConfig

SHAPE = (8, 32, 32)
CONFIG = BuildConfig(shape=SHAPE)
OCT = "retinal_oct/structural_oct"

# pydicom's own damaged or foreign test files, dropped into a labelled participant's folder.
PYDICOM_FILES = {
    "rtplan_truncated.dcm": r"^DICOM: ",
    "MR_truncated.dcm": r"^not oct: ",
    "no_meta.dcm": r"^DICOM: not a DICOM file",
    "badVR.dcm": r"^DICOM: unusable image header",
    "meta_missing_tsyntax.dcm": r"^DICOM: no Transfer Syntax UID",
    "CT_small.dcm": r"^not oct: ",
}


@dataclass(frozen=True)
class Built:
    src: Path
    cache: Path
    manifest_path: Path
    manifest: mf.Manifest
    summary: dict[str, Any]
    code: int
    planted: dict[str, str]  # pydicom file (relative name) -> expected reason pattern


def build(
    src: Path, cache: Path, config: BuildConfig = CONFIG, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    """One in-process build-cache run; returns the exit code and the --json summary."""
    summary_path = cache.parent / f"{cache.name}-summary.json"
    code = run_build(
        source=str(src),
        labels=str(src / "participants.tsv"),
        out=cache,
        manifest=cache / "manifest.json",
        config=config,
        workers=kwargs.pop("workers", 2),
        json_out=summary_path,
        **kwargs,
    )
    return code, json.loads(summary_path.read_text())


def copy_cache(built: Built, dest: Path) -> Path:
    shutil.copytree(built.cache, dest)
    return dest


def rejected(m: mf.Manifest) -> dict[str, str]:
    return {r.source: r.reason for r in m.rejected}
