"""The embedded AI-READI twin: the release's file set, tables and spellings, with traps planted.

Written as the release is (``aireadi-loader``, the AI-READI team's own loader, reads it
unmodified): ``participants.tsv`` + ``participants.json``; ``retinal_oct/manifest.tsv`` with the
release's columns and spellings (``release.py``: manufacturer ``Heidelberg`` / ``Topcon`` /
``Zeiss``, model ``Spectralis`` / ``Maestro2`` / ``Triton`` / ``Cirrus``, anatomic region with its
scan size, ``OCT``, ``R`` / ``L``, ``filepath`` from ``/``); the OCT DICOMs under
``retinal_oct/structural_oct/<device>/<pid>/``; and ``clinical_data/`` OMOP tables with real
concept ids and AI-READI's missing-value codes (``synth_clinical.py``).

Same seed, same bytes. Participant ``i`` (0-based, in participants.tsv order) has site ``"147"[i
% 3]``, study group ``i % 4``, device ``(i + i // 4) % 4`` and the split of its block of four
(``i // 4``), so site, class and device are independent, about 70/15/15 of each class is
train/val/test, and every split holds every device (a per-device evaluation has test volumes).
Everyone has both eyes on their device's main region (Spectralis, Maestro2 and Cirrus
``Macula``, Triton ``Macula, 12 x 12``); every fifth (``i % 5 == 4``) has a right eye on a
second device too, on that device's other regular-grid regions in turn (``Macula, 6 x 6``,
``Wide Field``, ``Optic Disc``, ...; Spectralis has none: its optic-disc scans are radial). Each
file's transfer syntax is drawn at random from uncompressed, RLE, JPEG baseline (lossy, Pillow)
and JPEG 2000 lossless, independently of class. Small volumes are ~1/8 of the real sizes
(Spectralis 8x62x96, at most 11 frames, each file under ~100 KB); ``full_size`` writes the real
ones (Spectralis 61x496x768, Maestro2 128x885x512, Triton 256x992x512, Cirrus 128x1024x512;
``synth_oct.SCANS``).

Signal: the ONL thickness is ``0.07 + 0.045 * label`` of the depth plus N(0, 0.02) per
participant and N(0, 0.004) per eye (synth_oct.py), the same on every device and region; the
participant's HbA1c rises with it (synth_clinical.py), so both study group and HbA1c are
learnable from the volumes.

The real world's mess, planted deterministically (``traps=True``, needs >= 16 participants;
``SynthInfo`` lists what the audit and the build must find). ``manifest.tsv`` describes every
file where it lies, with its true participant and eye, as the release's index would; so the
traps below are the mirror's and the headers' faults, which the other witnesses catch:
- IDs from all three sites; every SOP Instance UID (and so every file name) carries a random
  participant's ID as a dotted segment (``...498.0.1651.3.17``): the incident's regex took those.
- participants 1 and 6: ``retinal_oct`` FALSE and no OCT; participant 3: TRUE but no folder.
- two more participants (the next two IDs) have OCT on disk but are in neither participants.tsv
  nor manifest.tsv (``SynthInfo.unlisted``): files from another release version or a stray
  upload in the mirror. The release itself cannot have them: its manifest.tsv and
  participants.tsv come from the same export, and aireadi-loader (KeyError on the split lookup)
  would fail on any participant its manifest lists but participants.tsv lacks.
- 2: both eyes in a folder ``<pid>_old`` (folder_not_id).
- 5: right eye's PatientID is participant 13's (patient_id_disagrees).
- 7: both eyes with a blank PatientID (patient_id_missing): the participant is lost.
- 9: left eye misfiled in participant 10's folder (folder_filename_disagree).
- 12: left eye named ``oct_export_<protocol>_l_<uid>.dcm`` (filename_not_id).
- 14: left eye's PatientID ``AIREADI-<pid>`` (patient_id_not_id).
- 11: right eye an empty file, left eye an HTML error page saved as .dcm (unreadable): lost.
- 8: left eye uncompressed and truncated (the pixel data is shorter than declared), right eye
  RLE cut inside its fragments (the item framing runs past the end of the file): lost.
- 4: a third file without Pixel Data (no_pixel_data).
- Spectralis participants with ``i % 16 == 0``: an extra radial ``Optic Disc`` scan whose
  spacing and orientation vary per frame (irregular_grid).
- clinical values that are AI-READI missing codes (555, 777, 888, 999) instead of numbers.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydicom.uid import (
    PYDICOM_ROOT_UID,
    UID,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    RLELossless,
)
from rich.console import Console
from rich.table import Table

from octstage.dataset.ids import DEVICES, SITES
from octstage.dataset.labels import STUDY_GROUPS
from octstage.dataset.release import DEVICE_MODELS, DEVICE_REGIONS, TSV_NAME
from octstage.dataset.synth_clinical import (
    CLINICAL_DIR,
    write_clinical,
    write_participants_json,
)
from octstage.dataset.synth_oct import MAIN_REGION, SCANS, render_retina, write_oct_dicom
from octstage.errors import ConfigError
from octstage.twins import MARKER as TWIN_MARKER
from octstage.twins import claim_twin

__all__ = ["SynthInfo", "generate", "run_synth", "write_oct_dicom"]

MARKER = TWIN_MARKER  # marks a folder synth made (and may therefore clear: ``twins``)
TRANSFER_SYNTAXES = (ExplicitVRLittleEndian, RLELossless, JPEGBaseline8Bit, JPEG2000Lossless)
OCT_DIR = "retinal_oct/structural_oct"
MIN_PARTICIPANTS_WITH_TRAPS = 16
_SPLIT_CYCLE = ("train",) * 3 + ("val",) + ("train",) * 2 + ("test",)  # 5/7 : 1/7 : 1/7
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SynthInfo:
    """What was written, and what the audit and the build must make of it."""

    root: Path
    labelled: tuple[str, ...]  # participants.tsv IDs, in order
    labels: dict[str, int]  # participant -> study group index
    splits: dict[str, str]  # participant -> recommended split
    labelled_without_oct: tuple[str, ...]
    unlabelled_with_oct: tuple[str, ...]
    verified: tuple[str, ...]  # labelled participants with >= 1 file the audit accepts
    files: tuple[str, ...]  # every .dcm written, relative to root
    excluded: dict[str, str]  # file -> the reason kind the audit must give
    transfer_syntaxes: dict[str, str] = field(default_factory=dict)  # file -> syntax UID
    regions: dict[str, str] = field(default_factory=dict)  # file -> anatomic_region
    unlisted: tuple[str, ...] = ()  # files on disk that retinal_oct/manifest.tsv does not list
    hba1c: dict[str, float] = field(default_factory=dict)  # participant -> HbA1c (not missing)


@dataclass
class _File:
    pid: str  # whose eye this is
    device: str
    laterality: str
    region: str = ""  # anatomic_region; defaults to the device's main region
    folder: str = ""  # defaults to pid
    name_id: str = ""  # the file name's first token; defaults to pid
    header_id: str | None = None  # PatientID; defaults to pid
    radial: bool = False
    kind: str = "ok"  # ok | truncated | truncated_compressed | no_pixels | empty | not_dicom
    excluded: str = ""  # expected audit reason


def generate(
    out: Path,
    participants: int = 60,
    seed: int = 0,
    full_size: bool = False,
    traps: bool = True,
    overwrite: bool = False,
) -> SynthInfo:
    """Write the dataset into ``out`` (new, empty, or made by synth before: then replaced, when
    of other parameters only with ``overwrite``: ``twins``)."""
    if participants < 1:
        raise ConfigError(f"synth needs at least 1 participant (got {participants})")
    if traps and participants < MIN_PARTICIPANTS_WITH_TRAPS:
        raise ConfigError(
            f"synth with its planted traps needs at least {MIN_PARTICIPANTS_WITH_TRAPS} "
            f"participants (got {participants}): the traps use participants 1..14; pass "
            f"--no-traps for a clean dataset of {participants}, or --participants "
            f"{MIN_PARTICIPANTS_WITH_TRAPS} or more"
        )
    _prepare(
        out,
        f"kind=oct seed={seed} participants={participants} full_size={full_size} traps={traps}\n",
        overwrite,
    )
    rng = np.random.default_rng([seed, 0])
    ids = _participant_ids(participants + 2, rng)
    labelled, extra = ids[:participants], ids[participants:]
    files = _plan(labelled, extra, traps)
    without = tuple(labelled[i] for i in (1, 3, 6)) if traps else ()
    onl = {
        pid: 0.07 + 0.045 * (i % 4) + rng.normal(0.0, 0.02)
        for i, pid in enumerate(labelled + extra)
    }
    _write_participants(
        out, labelled, without_flag=set(labelled[i] for i in (1, 6)) if traps else set(), rng=rng
    )
    written: list[str] = []
    excluded: dict[str, str] = {}
    syntaxes: dict[str, str] = {}
    manifest_rows: list[list[str]] = []
    regions: dict[str, str] = {}
    unlisted: list[str] = []
    for n, f in enumerate(files):
        file_rng = np.random.default_rng([seed, 1, n])
        ts = TRANSFER_SYNTAXES[int(file_rng.integers(len(TRANSFER_SYNTAXES)))]
        if f.kind == "truncated":
            ts = ExplicitVRLittleEndian
        elif f.kind == "truncated_compressed":
            ts = RLELossless
        scan = SCANS[(f.device, f.region or MAIN_REGION[f.device])]
        protocol, real, spacing = scan.protocol, scan.shape, scan.spacing_mm
        shape = real if full_size else scan.small()
        scale = [r / s for r, s in zip(real, shape, strict=True)]
        mm = (spacing[0] * scale[0], spacing[1] * scale[1], spacing[2] * scale[2])
        other = ids[int(file_rng.integers(len(ids)))]
        uid = f"{PYDICOM_ROOT_UID}{seed}.{other}.{n % 7 + 1}.{n + 10}"
        name_id = f.name_id or f.pid
        fname = f"{name_id}_{protocol}_{f.laterality.lower()}_{uid}.dcm"
        rel = f"{OCT_DIR}/{f.device}/{f.folder or f.pid}/{fname}"
        path = out / rel
        if f.kind in ("empty", "not_dicom"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(
                b"" if f.kind == "empty" else b"<html><body>403 Forbidden</body></html>\n"
            )
        else:
            eye = onl[f.pid] + file_rng.normal(0.0, 0.004)
            volume = render_retina(shape, eye, f.laterality, file_rng)
            per_frame = None
            if f.radial:  # radial B-scans: spacing drifts frame to frame
                per_frame = [(mm[1] * 10, mm[1], mm[2] * (1 + 0.02 * i)) for i in range(shape[0])]
            write_oct_dicom(
                path,
                volume,
                patient_id=f.pid if f.header_id is None else f.header_id,
                laterality=f.laterality,
                transfer_syntax=ts,
                spacing_mm=mm,
                device=f.device,
                sop_instance_uid=uid,
                per_frame_spacing=per_frame,
                pixel_data=f.kind != "no_pixels",
            )
            if f.kind.startswith("truncated"):
                data = path.read_bytes()
                path.write_bytes(data[: len(data) - max(64, len(data) // 3)])
        written.append(rel)
        syntaxes[rel] = str(ts)
        if f.excluded:
            excluded[rel] = f.excluded
        regions[rel] = f.region or MAIN_REGION[f.device]
        if f.pid in extra:  # not in the release: see the module doc
            unlisted.append(rel)
        else:
            manifest_rows.append(_manifest_row(f, rel, uid, shape, mm))
    _write_manifest(out, manifest_rows)
    hba1c = write_clinical(out, labelled, {p: i % 4 for i, p in enumerate(labelled)}, onl, seed)
    write_participants_json(out, STUDY_GROUPS)
    ok_files = {f.pid for f, rel in zip(files, written, strict=True) if rel not in excluded}
    return SynthInfo(
        root=out,
        labelled=tuple(labelled),
        labels={pid: i % 4 for i, pid in enumerate(labelled)},
        splits={pid: _split(i) for i, pid in enumerate(labelled)},
        labelled_without_oct=without,
        unlabelled_with_oct=tuple(extra),
        verified=tuple(p for p in labelled if p in ok_files),
        files=tuple(written),
        excluded=excluded,
        transfer_syntaxes=syntaxes,
        regions=regions,
        unlisted=tuple(unlisted),
        hba1c=hba1c,
    )


def _plan(labelled: list[str], extra: list[str], traps: bool) -> list[_File]:
    """Every file to write, with the traps applied to the participants the docstring names."""
    files: list[_File] = []
    for i, pid in enumerate(labelled + extra):
        device = DEVICES[(i + i // 4) % 4]
        if traps and i in (1, 3, 6):
            continue
        eyes = [_File(pid, device, "R"), _File(pid, device, "L")]
        if i % 5 == 4:  # a second device, on one of its other regular-grid regions in turn
            second = DEVICES[(i + i // 4 + 1) % 4]
            others = [
                r
                for r in DEVICE_REGIONS[second]
                if r != MAIN_REGION[second] and not SCANS[(second, r)].radial
            ]
            region = others[(i // 5) % len(others)] if others else ""
            eyes.append(_File(pid, second, "R", region=region))
        if traps and device == "heidelberg_spectralis" and i % 16 == 0:
            eyes.append(
                _File(pid, device, "R", region="Optic Disc", radial=True, excluded="irregular_grid")
            )
        files.extend(eyes)
        if not traps:
            continue
        right, left = eyes[0], eyes[1]
        if i == 2:
            for eye in (right, left):
                eye.folder, eye.excluded = f"{pid}_old", "folder_not_id"
        elif i == 4:
            files.append(_File(pid, device, "L", kind="no_pixels", excluded="no_pixel_data"))
        elif i == 5:
            right.header_id, right.excluded = labelled[13], "patient_id_disagrees"
        elif i == 7:
            for eye in (right, left):
                eye.header_id, eye.excluded = "", "patient_id_missing"
        elif i == 8:
            left.kind, left.excluded = "truncated", "truncated"
            right.kind, right.excluded = "truncated_compressed", "truncated"
        elif i == 9:
            left.folder, left.excluded = labelled[10], "folder_filename_disagree"
        elif i == 11:
            right.kind, left.kind = "empty", "not_dicom"
            right.excluded = left.excluded = "unreadable"
        elif i == 12:
            left.name_id, left.excluded = "oct_export", "filename_not_id"
        elif i == 14:
            left.header_id, left.excluded = f"AIREADI-{pid}", "patient_id_not_id"
    return files


def _participant_ids(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct IDs, sites interleaved 1, 4, 7, ascending within a site."""
    per_site = {
        s: sorted(rng.choice(np.arange(1, 1000), size=(n + 2) // 3, replace=False)) for s in "147"
    }
    return [f"{'147'[i % 3]}{int(per_site['147'[i % 3]][i // 3]):03d}" for i in range(n)]


def _split(i: int) -> str:
    return _SPLIT_CYCLE[(i // 4) % len(_SPLIT_CYCLE)]


def _write_participants(
    out: Path, labelled: list[str], without_flag: set[str], rng: np.random.Generator
) -> None:
    header = [
        "participant_id", "clinical_site", "study_group", "age", "study_visit_date",
        "recommended_split", "retinal_oct", "retinal_octa", "retinal_photography", "cardiac_ecg",
    ]  # fmt: skip
    lines = ["\t".join(header)]
    for i, pid in enumerate(labelled):
        day = int(rng.integers(0, 700))
        date = np.datetime64("2023-07-01") + np.timedelta64(day, "D")
        flags = ["FALSE" if pid in without_flag else "TRUE"] + [
            "TRUE" if rng.random() < 0.9 else "FALSE" for _ in range(3)
        ]
        row = [pid, SITES[pid[0]], STUDY_GROUPS[i % 4], str(int(rng.integers(40, 86))), str(date)]
        lines.append("\t".join([*row, _split(i), *flags]))
    (out / "participants.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _manifest_row(
    f: _File, rel: str, uid: str, shape: tuple[int, int, int], mm: tuple[float, ...]
) -> list[str]:
    maker, model = DEVICE_MODELS[f.device]
    region = f.region or MAIN_REGION[f.device]
    return [
        f.pid, maker, model, region, "OCT", f.laterality, str(shape[1]), str(shape[2]),
        str(shape[0]), f"{mm[1]:.6g}, {mm[2]:.6g}", f"{mm[0]:.6g}", uid, f"/{rel}", "", "",
    ]  # fmt: skip


def _write_manifest(out: Path, rows: list[list[str]]) -> None:
    header = [
        "participant_id", "manufacturer", "manufacturers_model_name", "anatomic_region",
        "imaging", "laterality", "height", "width", "number_of_frames", "pixel_spacing",
        "slice_thickness", "sop_instance_uid", "filepath", "reference_instance_uid",
        "reference_filepath",
    ]  # fmt: skip
    text = "\n".join("\t".join(r) for r in [header, *rows]) + "\n"
    (out / "retinal_oct").mkdir(parents=True, exist_ok=True)
    (out / TSV_NAME).write_text(text, encoding="utf-8")


def _prepare(out: Path, marker: str, overwrite: bool) -> None:
    """Create ``out``; clear it only when synth made it (never someone else's folder, nor a
    Cell Painting twin; a twin of other parameters only with ``overwrite``: ``twins``)."""

    def clear() -> None:
        shutil.rmtree(out / "retinal_oct", ignore_errors=True)
        shutil.rmtree(out / CLINICAL_DIR, ignore_errors=True)
        (out / "participants.tsv").unlink(missing_ok=True)
        (out / "participants.json").unlink(missing_ok=True)

    claim_twin(out, marker, overwrite, clear)


def split_sizes(participants: int) -> dict[str, int]:
    """How many of ``participants`` each recommended split gets (``_split``)."""
    sizes = dict.fromkeys(("train", "val", "test"), 0)
    for i in range(participants):
        sizes[_split(i)] += 1
    return sizes


def fewest_for_every_split() -> int:
    """The fewest participants that give every split at least one (25: the first test block of
    four starts at participant 24)."""
    firsts = {s: next(i for i in range(4 * len(_SPLIT_CYCLE)) if _split(i) == s) for s in SPLITS}
    return 1 + max(firsts.values())


def split_warning(participants: int) -> str:
    """A warning when a split is empty ("" when every split has participants)."""
    sizes = split_sizes(participants)
    empty = [s for s in SPLITS if not sizes[s]]
    if not empty:
        return ""
    said = ", ".join(f"{s} {n}" for s, n in sizes.items())
    return (
        f"{participants} participants give no {' and no '.join(empty)} split ({said}): "
        f"nothing can be validated or evaluated on the missing split; --participants "
        f"{fewest_for_every_split()} or more gives every split"
    )


def run_synth(
    out: Path,
    participants: int,
    seed: int,
    full_size: bool,
    traps: bool = True,
    overwrite: bool = False,
) -> int:
    """CLI: write the dataset and print what it holds (and a warning when a split is empty)."""
    console = Console(stderr=True)
    with console.status(f"writing {participants} participants into {out}"):
        info = generate(out, participants, seed, full_size, traps, overwrite)
    table = Table(title=f"octstage synth: {out}")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("labelled participants", str(len(info.labelled)))
    table.add_row("  with OCT the audit accepts", str(len(info.verified)))
    table.add_row("  without OCT", str(len(info.labelled_without_oct)))
    table.add_row("OCT without label", str(len(info.unlabelled_with_oct)))
    table.add_row("DICOM files", str(len(info.files)))
    table.add_row("  not listed in retinal_oct/manifest.tsv", str(len(info.unlisted)))
    for ts, n in sorted(Counter(info.transfer_syntaxes.values()).items()):
        table.add_row(f"  {UID(ts).name}", str(n))
    for reason, n in sorted(Counter(info.excluded.values()).items()):
        table.add_row(f"  planted: {reason}", str(n))
    console.print(table)
    warning = split_warning(participants)
    if warning:
        console.print(f"[yellow]octstage synth: {warning}", highlight=False)
    return 0
