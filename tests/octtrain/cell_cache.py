"""A tiny Cell Painting cache for the trainer's tests: uint8 ``[C, Y, X]`` OME-Zarr fields as
``build-cache`` writes them (``octstage.cellpainting.fieldstore``: the array at
``<zarr_path>/0``, chunked for crops, one shard) and their records, as octstage's manifest lists
them (common part: zarr_path, shape, split, label).

Each field holds a few round "cells": nuclei in channel 0 (DNA), a ring around each nucleus in
channel 1, cytoplasm in channel 2, dots in 3, and a faint background in 4. The label (the
perturbation) sets the nucleus radius, so a probe can tell them apart. Fields are laid out as
plates of 4 wells x 2 sites: wells A01 and A03 are controls (DMSO, small nuclei), A02 and A04
are treated ("cmpd1", large nuclei).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from octstage import manifest
from octstage.cellpainting.fieldstore import write_field


@dataclass(frozen=True)
class CellField:
    """The common part of a manifest field that the dataset reads."""

    zarr_path: str
    shape: tuple[int, int, int]
    split: str
    label: int | None
    # The typed part (Cell Painting): where the field was imaged and what was done to it.
    plate: str = "P0"
    well: str = "A01"
    site: int = 1
    perturbation: str = "DMSO"
    is_control: bool = True
    # What build-cache measures of the stored array (the trainer standardises with it).
    intensity: manifest.Intensity | None = None


@dataclass(frozen=True)
class WellField:
    """The part of a field that well profiles group by (what ``scores.profile_scores`` reads)."""

    plate: str
    well: str
    perturbation: str
    is_control: bool


def synth_field(
    rng: np.random.Generator,
    label: int,
    channels: int,
    size: int,
    radii: tuple[float, float] = (3.0, 6.0),
    noise: float = 0.05,
) -> np.ndarray:
    """One uint8 field ``[channels, size, size]`` with cells whose nucleus radius is the
    label's (``radii[label]``) and Gaussian noise of sd ``noise``."""
    yy, xx = np.mgrid[:size, :size]
    out = np.zeros((channels, size, size), dtype=np.float64)
    radius = radii[label]
    for _ in range(max(2, size // 16)):
        cy, cx = rng.uniform(8, size - 8, 2)
        d = np.hypot(yy - cy, xx - cx)
        out[0] += d < radius
        if channels > 1:
            out[1] += (d >= radius) & (d < radius + 2)
        if channels > 2:
            out[2] += (d < radius + 6) * 0.5
        if channels > 3:
            out[3] += rng.random((size, size)) * (d < radius + 6) > 0.8
    if channels > 4:
        out[4] += 0.1
    out += rng.normal(0, noise, out.shape)
    return (np.clip(out, 0, 1) * 255).astype(np.uint8)


def write_cell_cache(
    root: Path,
    n: int = 16,
    channels: int = 5,
    size: int = 64,
    chunk: int = 32,
    splits: tuple[str, ...] = ("train", "train", "train", "val"),
    radii: tuple[float, float] = (3.0, 6.0),
    noise: float = 0.05,
) -> list[CellField]:
    """``n`` fields under ``root/fields/<i>`` and ``root/manifest.json`` listing them."""
    rng = np.random.default_rng(0)
    records = []
    checksums = []
    for i in range(n):
        plate, well_index, site = i // 8, (i % 8) // 2, i % 2 + 1
        label = well_index % 2
        data = synth_field(rng, label, channels, size, radii, noise)
        path = f"fields/P{plate}/f{i:03d}.ome.zarr"  # the layout build-cache writes
        # Written as build-cache writes a field (sharded, blosc): the trainer reads that layout.
        write_field(root, path, data, manifest.CELLPAINTING_CHANNELS[:channels], {}, chunk=chunk)
        checksums.append("sha256:" + hashlib.sha256(data.tobytes()).hexdigest())
        records.append(
            CellField(
                path,
                (channels, size, size),
                splits[i % len(splits)],
                label,
                plate=f"P{plate}",
                well=f"A0{well_index + 1}",
                site=site,
                perturbation="cmpd1" if label else "DMSO",
                is_control=not label,
                intensity=manifest.Intensity.of(data, channels_first=True),
            )
        )
    write_manifest(root, records, checksums)
    return records


def write_manifest(root: Path, records: list[CellField], checksums: list[str]) -> Path:
    """``root/manifest.json``: a real Cell Painting manifest (octstage.manifest) of the fields."""
    channels = manifest.CELLPAINTING_CHANNELS
    fields = tuple(
        manifest.Field(
            item_id=f"source_0/{r.plate}/{r.well}/{r.site}",
            split=r.split,
            label=r.label,
            zarr_path=r.zarr_path,
            shape=(r.shape[0], r.shape[1], r.shape[2]),
            dtype="uint8",
            checksum=checksum,
            cache_key=Path(r.zarr_path).name,
            sources=tuple(
                manifest.ChannelSource(
                    c, f"images/{r.plate}/{r.well}-{r.site}-{c}.tiff", "0" * 40, 1
                )
                for c in channels[: r.shape[0]]
            ),
            source="source_0",
            batch="B1",
            plate=r.plate,
            well=r.well,
            site=r.site,
            channels=channels[: r.shape[0]],
            perturbation=r.perturbation,
            perturbation_type="negcon" if r.is_control else "compound",
            is_control=r.is_control,
            normalization=tuple(manifest.Normalization(1.0, 99.8, 0.0, 1.0) for _ in channels),
            intensity=r.intensity,
        )
        for r, checksum in zip(records, checksums, strict=True)
    )
    header = manifest.Header(
        dataset="cell-cache",
        created="2026-11-23T00:00:00Z",
        code_version="test",
        cache_version=manifest.CACHE_VERSION,
        config_hash="test",
        config={},
        counts=manifest.count_summary(fields, rejected=0),
    )
    m = manifest.Manifest(header, ("DMSO", "cmpd1"), (), (), kind="cellpainting", fields=fields)
    path = root / "manifest.json"
    manifest.write(m, path)
    return path
