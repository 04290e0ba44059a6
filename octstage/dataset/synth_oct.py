"""One synthetic OCT file: a speckled, layered retina volume and its DICOM writer.

The retina (rows are depth, top = vitreous): RNFL, GCL+IPL, INL, OPL, ONL, ellipsoid zone, RPE,
choroid, with a foveal pit that thins the inner layers at the centre, a slight tilt mirrored by
laterality, a smooth wobble and multiplicative speckle. Every depth is a *fraction of the number
of rows*, so a volume looks alike on every device once resized to a common shape.

The learnable class signal is the ONL (a dark band between the bright OPL and ellipsoid zone):
its thickness is ``onl_fraction`` of the depth, which the dataset plan draws as
``0.07 + 0.045 * label`` plus per-participant noise (see synth.py). Resized to 64 rows, adjacent
classes differ by ~3 rows against ~1.3 rows of noise: clearly learnable, not separable by eye alone.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import (
    UID,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    RLELossless,
)

from octstage.dataset.dicom import OPT_SOP_CLASS
from octstage.dataset.release import DEVICE_MODELS

# Device folder -> (Manufacturer, ManufacturerModelName), spelled as the release spells them.
MAKERS: dict[str, tuple[str, str]] = DEVICE_MODELS


@dataclass(frozen=True)
class Scan:
    """One scan protocol of one device: what the file name, header and manifest.tsv say."""

    protocol: str  # the file name's protocol tokens
    shape: tuple[int, int, int]  # real frames, rows, columns
    spacing_mm: tuple[float, float, float]  # real, between frames, rows, columns
    radial: bool = False  # radial B-scans: no regular grid (the irregular_grid trap)

    def small(self) -> tuple[int, int, int]:
        """About 1/8 of the real size, at most 11 frames (tests stay fast, files ~100 KB); at
        least 32 rows and columns, below which the JPEG 2000 encoder's 6 levels do not fit."""
        f, r, c = self.shape
        return (min(11, max(4, -(-f // 8))), max(32, r // 8), max(32, c // 8))


# (device, anatomic_region) -> scan. Real shapes from the release's documentation where it gives
# them (ai-readi.md); the other regions' shapes are the twin's plausible choice.
SCANS: dict[tuple[str, str], Scan] = {
    ("heidelberg_spectralis", "Macula"): Scan(
        "spectralis_ppol_mac_hr_oct", (61, 496, 768), (0.1203, 0.003872, 0.011337)
    ),
    ("heidelberg_spectralis", "Optic Disc"): Scan(
        "spectralis_onh_rc_hr_oct", (27, 496, 768), (0.0, 0.003872, 0.011337), radial=True
    ),
    ("topcon_maestro2", "Macula"): Scan(
        "maestro2_3d_macula_oct", (128, 885, 512), (0.046875, 0.0026, 0.011719)
    ),
    ("topcon_maestro2", "Macula, 6 x 6"): Scan(
        "maestro2_macula_6x6_oct", (60, 885, 360), (0.101695, 0.0026, 0.016713)
    ),
    ("topcon_maestro2", "Wide Field"): Scan(
        "maestro2_3d_wide_oct", (128, 885, 512), (0.070866, 0.0026, 0.023483)
    ),
    ("topcon_triton", "Macula, 12 x 12"): Scan(
        "triton_3d_wide_oct", (256, 992, 512), (0.047059, 0.0026, 0.023483)
    ),
    ("topcon_triton", "Macula, 6 x 6"): Scan(
        "triton_3d_macula_oct", (256, 992, 512), (0.023529, 0.0026, 0.011742)
    ),
    ("topcon_triton", "Optic Disc"): Scan(
        "triton_3d_disc_oct", (320, 992, 320), (0.018809, 0.0026, 0.018809)
    ),
    ("zeiss_cirrus", "Macula"): Scan(
        "cirrus_mac_oct_oct", (128, 1024, 512), (0.047244, 0.001955, 0.011742)
    ),
    ("zeiss_cirrus", "Macula, 6 x 6"): Scan(
        "cirrus_mac_6x6_oct", (200, 1024, 200), (0.030151, 0.001955, 0.030151)
    ),
    ("zeiss_cirrus", "Optic Disc"): Scan(
        "cirrus_onh_oct", (200, 1024, 200), (0.030151, 0.001955, 0.030151)
    ),
    ("zeiss_cirrus", "Optic Disc, 6 x 6"): Scan(
        "cirrus_onh_6x6_oct", (200, 1024, 200), (0.030151, 0.001955, 0.030151)
    ),
}
# Every participant's two eyes are scanned on their device's main region.
MAIN_REGION: dict[str, str] = {
    "heidelberg_spectralis": "Macula",
    "topcon_maestro2": "Macula",
    "topcon_triton": "Macula, 12 x 12",
    "zeiss_cirrus": "Macula",
}
# Encoders: pylibjpeg's RLE is ~10x faster than pydicom's own and gives the same bytes.
_ENCODERS: dict[str, str] = {RLELossless: "pylibjpeg", JPEG2000Lossless: "pylibjpeg"}
# Intensity of vitreous, each layer in order, and the sclera below the last boundary.
_LEVELS = np.array([8, 190, 120, 55, 130, 45, 215, 235, 95, 14], dtype=np.float32)
_SPECKLE = np.sort(np.random.default_rng(0).gamma(4.0, 0.25, 256)).astype(np.float32)
_NOISE = np.sort(np.random.default_rng(1).normal(0.0, 4.0, 256)).astype(np.float32)


def render_retina(
    shape: tuple[int, int, int],
    onl_fraction: float,
    laterality: str,
    rng: np.random.Generator,
) -> npt.NDArray[np.uint8]:
    """A (frames, rows, columns) uint8 retina whose ONL is ``onl_fraction`` of the depth."""
    frames, rows, cols = shape
    f = np.linspace(-1.0, 1.0, frames, dtype=np.float32)[:, None]
    c = np.linspace(-1.0, 1.0, cols, dtype=np.float32)[None, :]
    if laterality == "L":
        c = -c  # mirror image: the optic disc side flips with the eye
    pit = np.exp(-((f / 0.45) ** 2 + (c / 0.3) ** 2))  # (frames, cols), 1 at the fovea
    phase = rng.uniform(0, 2 * np.pi, size=3)
    wobble = 0.012 * np.sin(2.3 * np.pi * c + phase[0]) + 0.01 * np.sin(1.7 * np.pi * f + phase[1])
    top = 0.2 + 0.03 * c + 0.015 * f + 0.05 * pit + wobble
    inner = 1.0 - 0.7 * pit
    onl = onl_fraction * (1.0 + 0.05 * np.sin(np.pi * c + phase[2]))
    full = np.ones_like(pit)
    thickness = [
        0.03 * inner * (1.2 + 0.4 * c),  # RNFL, thicker towards the disc
        0.055 * inner,  # GCL + IPL
        0.03 * inner,  # INL
        0.02 * full,  # OPL
        onl * full,  # ONL: the class signal
        0.014 * full,  # ellipsoid zone
        0.024 * full,  # RPE
        0.11 * full,  # choroid
    ]
    bounds = top[None] + np.cumsum(np.stack(thickness), axis=0)  # (layers, frames, cols)
    bounds = np.concatenate([top[None], bounds])
    depth = (np.arange(rows, dtype=np.float32) + 0.5) / rows
    out = np.empty(shape, dtype=np.uint8)
    for i in range(frames):
        layer = (depth[None, :, None] >= bounds[:, i, None, :]).sum(axis=0)  # (rows, cols)
        img = cv2.GaussianBlur(_LEVELS[layer], (3, 3), 0.8)
        # Speckle ~ Gamma(4, 1/4) and noise ~ N(0, 4) via 256-entry quantile tables: ~10x
        # faster than sampling the distributions, which dominated full-size rendering.
        draws = rng.integers(0, 256, size=(2, *img.shape), dtype=np.uint8)
        img = img * _SPECKLE[draws[0]] + _NOISE[draws[1]]
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def write_oct_dicom(
    path: Path,
    volume: npt.NDArray[np.uint8],
    *,
    patient_id: str,
    laterality: str,
    transfer_syntax: str,
    spacing_mm: tuple[float, float, float],
    device: str,
    sop_instance_uid: str,
    per_frame_spacing: Sequence[tuple[float, float, float]] | None = None,
    pixel_data: bool = True,
) -> None:
    """Write one multi-frame Ophthalmic Tomography DICOM like the AI-READI ones.

    ``spacing_mm`` is (between frames, rows, columns), stored in the shared functional groups.
    ``per_frame_spacing`` (one per frame) instead writes spacing per frame with a rotating plane
    orientation, as a radial scan would. ``pixel_data=False`` leaves the Pixel Data out.
    """
    frames, rows, cols = volume.shape
    manufacturer, model = MAKERS.get(device, ("Unknown", device))
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = UID(OPT_SOP_CLASS)
    ds.file_meta.MediaStorageSOPInstanceUID = UID(sop_instance_uid)
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian  # compress() switches it
    ds.SOPClassUID = OPT_SOP_CLASS
    ds.SOPInstanceUID = sop_instance_uid
    ds.StudyInstanceUID = UID(f"{sop_instance_uid}.1")
    ds.SeriesInstanceUID = UID(f"{sop_instance_uid}.2")
    ds.Modality = "OPT"
    ds.PatientID = patient_id
    ds.PatientName = ""
    ds.PatientBirthDate = ""
    ds.PatientSex = ""
    ds.StudyDate = ds.ContentDate = "20230101"
    ds.Manufacturer = manufacturer
    ds.ManufacturerModelName = model
    ds.ImageLaterality = laterality
    ds.ImageType = ["ORIGINAL", "PRIMARY"]
    ds.SeriesNumber = ds.InstanceNumber = 1
    ds.NumberOfFrames = frames
    ds.Rows, ds.Columns = rows, cols
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelRepresentation = 0
    ds.BurnedInAnnotation = "NO"
    shared = Dataset()
    per_frame = []
    for i in range(frames):
        item = Dataset()
        content = Dataset()
        content.StackID = "1"
        content.InStackPositionNumber = i + 1
        item.FrameContentSequence = DicomSequence([content])
        if per_frame_spacing is not None:
            item.PixelMeasuresSequence = DicomSequence([_measures(per_frame_spacing[i])])
            angle = np.pi * i / frames
            orient = Dataset()
            orient.ImageOrientationPatient = [
                round(float(v), 6) for v in (np.cos(angle), np.sin(angle), 0.0, 0.0, 0.0, -1.0)
            ]
            item.PlaneOrientationSequence = DicomSequence([orient])
        per_frame.append(item)
    if per_frame_spacing is None:
        shared.PixelMeasuresSequence = DicomSequence([_measures(spacing_mm)])
    ds.SharedFunctionalGroupsSequence = DicomSequence([shared])
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(per_frame)
    if pixel_data:
        _set_pixels(ds, np.ascontiguousarray(volume, dtype=np.uint8), transfer_syntax)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def _measures(spacing: tuple[float, float, float]) -> Dataset:
    m = Dataset()
    m.SliceThickness = f"{spacing[0]:.6g}"
    m.PixelSpacing = [f"{spacing[1]:.6g}", f"{spacing[2]:.6g}"]
    return m


def _set_pixels(ds: Dataset, volume: npt.NDArray[np.uint8], transfer_syntax: str) -> None:
    if transfer_syntax == ExplicitVRLittleEndian:
        ds.PixelData = volume.tobytes()
    elif transfer_syntax == JPEGBaseline8Bit:
        # pydicom has no JPEG encoder: Pillow encodes each frame, pydicom encapsulates them.
        frames = []
        for frame in volume:
            buf = io.BytesIO()
            # a 2-d uint8 array is mode "L" already (the mode argument goes in Pillow 13)
            Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8)).save(
                buf, format="JPEG", quality=92
            )
            frames.append(buf.getvalue())
        ds.PixelData = encapsulate(frames)
        ds["PixelData"].VR = "OB"
        ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
        ds.LossyImageCompression = "01"
        ds.LossyImageCompressionMethod = "ISO_10918_1"
    elif transfer_syntax in _ENCODERS:
        ds.compress(
            transfer_syntax,
            volume,
            encoding_plugin=_ENCODERS[transfer_syntax],
            generate_instance_uid=False,
        )
    else:
        raise ValueError(f"synth cannot encode transfer syntax {transfer_syntax}")
