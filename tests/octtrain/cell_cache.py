"""A tiny Cell Painting cache for the trainer's tests: uint8 ``[C, Y, X]`` OME-Zarr-style fields
(the array at ``<zarr_path>/0``, chunked for crops) and their records, as octstage's manifest
lists them (common part: zarr_path, shape, split, label).

Each field holds a few round "cells": nuclei in channel 0 (DNA), a ring around each nucleus in
channel 1, cytoplasm in channel 2, dots in 3, and a faint background in 4. The label (the
perturbation) sets the nucleus radius, so a probe can tell them apart. Fields are laid out as
plates of 4 wells x 2 sites: wells A01 and A03 are controls (DMSO, small nuclei), A02 and A04
are treated ("cmpd1", large nuclei).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import zarr


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
    """``n`` fields under ``root/fields/<i>``, labels alternating; ``root/fields.json`` lists
    the records (for the torchrun worker)."""
    rng = np.random.default_rng(0)
    records = []
    for i in range(n):
        plate, well_index, site = i // 8, (i % 8) // 2, i % 2 + 1
        label = well_index % 2
        data = synth_field(rng, label, channels, size, radii, noise)
        path = f"fields/f{i:03d}"
        array = zarr.create_array(
            store=str(root / path / "0"),
            shape=data.shape,
            chunks=(channels, chunk, chunk),
            dtype="uint8",
            zarr_format=3,
        )
        array[...] = data
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
            )
        )
    (root / "fields.json").write_text(json.dumps([asdict(r) for r in records]))
    return records


def read_records(root: Path) -> list[CellField]:
    """The records ``write_cell_cache`` listed."""
    rows = json.loads((root / "fields.json").read_text())
    return [CellField(**{**r, "shape": tuple(r["shape"])}) for r in rows]
