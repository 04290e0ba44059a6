"""Reading AI-READI OCT DICOM: the header (cheap, no pixels) and the volume (explicit decoder).

This is the only module that touches DICOM. Axis order is pydicom's (frames, rows, columns)
everywhere, and so is ``spacing_mm``: between frames (B-scans), between rows, between columns.
Spacing comes from the functional groups (``SharedFunctionalGroupsSequence`` ->
``PixelMeasuresSequence``; per-frame groups when a writer puts it there) and is never defaulted
to 1: a file without spacing says so. Decoder plugins are chosen per transfer syntax, not left
to pydicom, because the choice changes decode time several-fold (see ``DECODERS``).

Every failure is a ``DicomError`` whose message starts with the file's name and says why; one
that says nothing about the bytes (I/O error, no decoder installed for the syntax) is a
``DicomEnvironmentError``, so callers can retry it instead of remembering it.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
import pydicom
from pydicom.dataset import Dataset
from pydicom.errors import BytesLengthException, InvalidDicomError
from pydicom.pixels.decoders.base import get_decoder
from pydicom.pixels.utils import pixel_array
from pydicom.uid import (
    JPEG2000,
    UID,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGExtended12Bit,
    RLELossless,
)

from octstage.dataset.framing import cut_short, encapsulation_problem
from octstage.errors import DicomEnvironmentError, DicomError
from octstage.provenance import installed_version

OPT_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.5.4"  # Ophthalmic Tomography Image Storage

# Measured (shared field notes): pylibjpeg's RLE ~7x faster than pydicom's own; Pillow's JPEG ~3x
# faster than GDCM, which pydicom would pick first when installed. Other syntaxes: pydicom's pick.
DECODERS: dict[str, str] = {
    RLELossless: "pylibjpeg",
    JPEG2000Lossless: "pylibjpeg",
    JPEG2000: "pylibjpeg",
    JPEGBaseline8Bit: "pillow",
    JPEGExtended12Bit: "pillow",
}

# Every distribution that can decode pixels here (pydicom's own decoders and the plugins it may
# pick); a new version may decode the same bytes differently, so all go into the cache key.
DECODER_PACKAGES = (
    "pydicom",
    "pylibjpeg",
    "pylibjpeg-openjpeg",
    "pylibjpeg-rle",
    "pylibjpeg-libjpeg",
    "pillow",
    "python-gdcm",
    "pyjpegls",
)


def decoder_versions() -> dict[str, str]:
    """The installed version of each of ``DECODER_PACKAGES`` (``"absent"`` if not installed)."""
    return {name: installed_version(name) for name in DECODER_PACKAGES}


# What pydicom and its decoder plugins raise on damaged or unexpected input. pydicom's own two
# derive from Exception only: a value cut short (a file ending inside its header) raises
# BytesLengthException when the element is converted.
_READ_ERRORS = (
    InvalidDicomError,
    BytesLengthException,
    OSError,
    EOFError,
    ValueError,
    KeyError,
    AttributeError,
    TypeError,
    IndexError,
    RuntimeError,
    NotImplementedError,
    OverflowError,
    struct.error,
)
_PIXEL_TAGS = (b"\xe0\x7f\x10\x00", b"\x7f\xe0\x00\x10")  # (7FE0,0010), little / big endian

Source = str | os.PathLike[str] | BinaryIO


class HeaderProblem(StrEnum):
    """Why a readable header cannot become a cached 3D volume (``DicomHeader.problem``)."""

    NOT_OCT = "not_oct"  # another SOP class or modality
    UNSUPPORTED_PIXELS = "unsupported_pixels"  # not 8-bit single-sample MONOCHROME2
    NOT_A_VOLUME = "not_a_volume"  # fewer than 2 frames
    NO_PIXEL_DATA = "no_pixel_data"
    # uncompressed pixel data shorter than its header declares, or encapsulated pixel data
    # whose fragment items run past the end of the file
    TRUNCATED = "truncated"
    NO_SPACING = "no_spacing"
    IRREGULAR_GRID = "irregular_grid"  # spacing or orientation varies per frame (radial scans)


@dataclass(frozen=True)
class DicomHeader:
    """The attributes octstage uses, read without decoding pixels."""

    patient_id: str | None  # raw, as stored (ids.resolve strips the padding)
    laterality: str | None  # "L" / "R" (ImageLaterality, else Laterality)
    sop_instance_uid: str | None
    transfer_syntax: str  # UID string
    frames: int
    rows: int
    columns: int
    spacing_mm: tuple[float, float, float] | None  # between frames, rows, columns
    regular_grid: bool  # False when spacing or orientation varies across frames
    manufacturer: str | None
    model: str | None = None
    sop_class_uid: str = ""
    modality: str = ""
    samples_per_pixel: int = 1
    bits_allocated: int = 8
    photometric: str = ""
    pixel_data_bytes: int | None = None  # bytes after the Pixel Data element header; None: absent
    framing: str | None = None  # encapsulated pixel data: why its item framing is broken

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.frames, self.rows, self.columns)

    @property
    def transfer_syntax_name(self) -> str:
        return UID(self.transfer_syntax).name or self.transfer_syntax

    @property
    def decoder(self) -> str:
        """The decoder plugin ``read_volume`` uses ('' = pydicom's own choice / no decoding)."""
        return DECODERS.get(self.transfer_syntax, "")

    @property
    def expected_pixel_bytes(self) -> int:
        return (
            self.frames
            * self.rows
            * self.columns
            * self.samples_per_pixel
            * ((self.bits_allocated + 7) // 8)
        )

    def problem(self) -> tuple[HeaderProblem, str] | None:
        """The first reason this file cannot be a cached volume, with details; None if usable.

        Truncation shows here for uncompressed files (fewer bytes than declared) and for
        encapsulated ones (fragment items that run past the end of the file), so the header-only
        ``audit-ids`` and the decoding ``build-cache`` reject a cut file alike.
        """
        if self.sop_class_uid != OPT_SOP_CLASS or self.modality != "OPT":
            return HeaderProblem.NOT_OCT, (
                f"not ophthalmic tomography: SOP class {self.sop_class_uid or '?'}, "
                f"modality {self.modality or '?'}"
            )
        pixels = self._pixel_format()
        if pixels:
            return HeaderProblem.UNSUPPORTED_PIXELS, pixels
        if self.frames < 2:
            return HeaderProblem.NOT_A_VOLUME, f"{self.frames} frame(s), not a volume"
        if self.pixel_data_bytes is None:
            return HeaderProblem.NO_PIXEL_DATA, "no PixelData"
        native = not UID(self.transfer_syntax).is_compressed
        if native and self.pixel_data_bytes < self.expected_pixel_bytes:
            return HeaderProblem.TRUNCATED, self._truncated(self.pixel_data_bytes)
        if not native and self.framing is not None:
            return HeaderProblem.TRUNCATED, f"pixel data truncated: encapsulated: {self.framing}"
        if not self.regular_grid:
            return HeaderProblem.IRREGULAR_GRID, (
                "spacing or orientation varies per frame (e.g. a radial scan): not a 3D grid"
            )
        if self.spacing_mm is None:
            return HeaderProblem.NO_SPACING, "no pixel spacing / slice thickness in the header"
        return None

    def _pixel_format(self) -> str | None:
        if self.bits_allocated != 8:
            return f"unsupported BitsAllocated {self.bits_allocated}"
        if self.samples_per_pixel != 1:
            return f"unsupported SamplesPerPixel {self.samples_per_pixel}"
        if self.photometric != "MONOCHROME2":
            return f"unsupported PhotometricInterpretation {self.photometric or '(none)'}"
        return None

    def _truncated(self, found: int) -> str:
        return f"pixel data truncated: expected {self.expected_pixel_bytes} bytes, found {found}"


def read_header(source: Source, name: str) -> DicomHeader:
    """Read the header only (stops before Pixel Data, decodes nothing)."""
    with _opened(source, name) as fh:
        return _read_header(fh, name)


def read_volume(source: Source, name: str) -> tuple[DicomHeader, npt.NDArray[np.uint8]]:
    """Decode the whole volume, uint8 (frames, rows, columns), with the plugin for its syntax.

    Refuses what cannot be decoded into such an array (empty, not DICOM, no or truncated pixel
    data, not 8-bit MONOCHROME2, decoder failure, shape other than declared). Whether the file
    is a usable *grid* (spacing, radial scans, SOP class) is ``DicomHeader.problem``'s call.
    """
    with _opened(source, name) as fh:
        # The header first: a truncated encapsulated file makes pydicom's full read return an
        # *empty* dataset with only a warning, which would hide what the file is. (No warning
        # capture here: warnings.catch_warnings is process-global and callers use threads.)
        start = fh.tell()
        header = _read_header(fh, name)
        pixels = header._pixel_format()
        if header.pixel_data_bytes is None or pixels:
            raise DicomError(f"{name}: {pixels or 'no PixelData'}")
        fh.seek(start)
        try:
            ds = pydicom.dcmread(fh)
        except _READ_ERRORS as exc:
            raise _read_error(exc, name) from exc
    data = ds.get("PixelData")
    if data is None:  # the header showed the element, so the file ends inside it
        raise DicomError(f"{name}: pixel data truncated: the file ends inside the Pixel Data")
    if not UID(header.transfer_syntax).is_compressed and len(data) < header.expected_pixel_bytes:
        raise DicomError(f"{name}: {header._truncated(len(data))}")
    _require_decoder(header, name)
    try:
        arr = pixel_array(ds, decoding_plugin=header.decoder)
    except ImportError as exc:  # a plugin that is installed but broken: the machine, not the file
        raise DicomEnvironmentError(f"{name}: decoder unusable: {exc}") from exc
    except _READ_ERRORS as exc:
        raise DicomError(
            f"{name}: decode failed ({header.transfer_syntax_name}, "
            f"{header.decoder or 'pydicom'}): {_why(exc)}"
        ) from exc
    if arr.dtype != np.uint8 or arr.size != header.expected_pixel_bytes:
        raise DicomError(f"{name}: decoded {arr.dtype} {arr.shape}, header declares {header.shape}")
    return header, arr.reshape(header.shape)


def _read_header(fh: BinaryIO, name: str) -> DicomHeader:
    _refuse_empty(fh, name)
    try:
        ds = pydicom.dcmread(fh, stop_before_pixels=True)
        offset = fh.tell()
        tag = fh.read(4)
        end = fh.seek(0, io.SEEK_END)
    except _READ_ERRORS as exc:
        raise _read_error(exc, name) from exc
    pixel_bytes = None
    framing = None
    if tag in _PIXEL_TAGS:
        syntax = UID(_transfer_syntax(ds, name))
        start = offset + (8 if syntax.is_implicit_VR else 12)
        pixel_bytes = max(0, end - start)
        if syntax.is_compressed:
            try:
                framing = encapsulation_problem(fh, start, end, int(ds.get("NumberOfFrames") or 1))
            except OSError as exc:
                raise _read_error(exc, name) from exc
    else:
        cut = cut_short(ds, end)
        if cut is not None:  # not "no PixelData": the file never got that far
            raise DicomError(f"{name}: file truncated before its Pixel Data: {cut}")
    return _header(ds, name, pixel_bytes, framing)


def _header(ds: Dataset, name: str, pixel_bytes: int | None, framing: str | None) -> DicomHeader:
    ts = _transfer_syntax(ds, name)
    try:
        spacing, regular = _spacing(ds)
        lat = str(ds.get("ImageLaterality") or ds.get("Laterality") or "").strip().upper()
        pid = ds.get("PatientID")
        uid = ds.get("SOPInstanceUID")
        return DicomHeader(
            patient_id=None if pid is None else str(pid),
            laterality=lat if lat in ("L", "R") else None,
            sop_instance_uid=None if uid is None else str(uid),
            transfer_syntax=ts,
            frames=int(ds.get("NumberOfFrames") or 1),
            rows=int(ds.Rows),
            columns=int(ds.Columns),
            spacing_mm=spacing,
            regular_grid=regular,
            manufacturer=_text(ds, "Manufacturer"),
            model=_text(ds, "ManufacturerModelName"),
            sop_class_uid=str(ds.get("SOPClassUID") or ""),
            modality=str(ds.get("Modality") or ""),
            samples_per_pixel=int(ds.get("SamplesPerPixel") or 1),
            bits_allocated=int(ds.BitsAllocated),
            photometric=str(ds.get("PhotometricInterpretation") or ""),
            pixel_data_bytes=pixel_bytes,
            framing=framing,
        )
    except _READ_ERRORS as exc:
        raise DicomError(f"{name}: unusable image header: {_why(exc)}") from exc


def _transfer_syntax(ds: Dataset, name: str) -> str:
    ts = str(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", "") or "")
    if not ts:
        raise DicomError(f"{name}: no Transfer Syntax UID in the file meta information")
    return ts


def _text(ds: Dataset, keyword: str) -> str | None:
    value = ds.get(keyword)
    return str(value) if value not in (None, "") else None


def _spacing(ds: Dataset) -> tuple[tuple[float, float, float] | None, bool]:
    """(frames, rows, columns) spacing in mm, and whether the frames form one regular grid."""
    per_frame = _per_frame(ds, "PixelMeasuresSequence")
    shared = ds.get("SharedFunctionalGroupsSequence")
    shared_items = list((shared[0].get("PixelMeasuresSequence") or [])[:1]) if shared else []
    found = {_measure(m) for m in (per_frame or shared_items or [ds])}
    orientations = {_orientation(o) for o in _per_frame(ds, "PlaneOrientationSequence")}
    regular = len(found) == 1 and len(orientations) <= 1
    first = next(iter(found)) if len(found) == 1 else None
    if first is None or not all(v > 0 for v in first):
        return None, regular
    return first, regular


def _per_frame(ds: Dataset, sequence: str) -> list[Dataset]:
    """The first item of ``sequence`` from every per-frame group that has one."""
    return [
        frame[sequence][0]
        for frame in ds.get("PerFrameFunctionalGroupsSequence") or []
        if frame.get(sequence)
    ]


def _measure(item: Dataset) -> tuple[float, float, float] | None:
    pixel = item.get("PixelSpacing")
    between = item.get("SpacingBetweenSlices") or item.get("SliceThickness")
    if not pixel or len(pixel) != 2 or between is None:
        return None
    return (round(float(between), 6), round(float(pixel[0]), 6), round(float(pixel[1]), 6))


def _orientation(item: Dataset) -> tuple[float, ...]:
    return tuple(round(float(v), 4) for v in item.get("ImageOrientationPatient") or ())


@contextmanager
def _opened(source: Source, name: str) -> Iterator[BinaryIO]:
    """A binary reader for a path or an already open file (which is left open)."""
    if isinstance(source, str | os.PathLike):
        try:
            fh = open(source, "rb")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise DicomEnvironmentError(f"{name}: cannot open: {exc.strerror or exc}") from exc
        with fh:
            yield fh
    else:
        yield source


def _read_error(exc: BaseException, name: str) -> DicomError:
    """Reading a file (the bytes are on disk, parsing has not failed): an OSError is the disk's
    or the network's, not the file's (EOFError, a short file, is not an OSError)."""
    if isinstance(exc, OSError):
        return DicomEnvironmentError(f"{name}: I/O error: {exc.strerror or exc}")
    return DicomError(f"{name}: {_why(exc)}")


def _require_decoder(header: DicomHeader, name: str) -> None:
    """Refuse, as an environment failure, a syntax whose decoder (or chosen plugin) is missing
    here: decoding would fail for every file of that syntax on this machine only."""
    try:
        decoder = get_decoder(header.transfer_syntax)
    except NotImplementedError:
        return  # no decoder exists anywhere for this syntax: pixel_array says so, for good
    plugin = header.decoder
    if not decoder.is_available or (plugin and plugin not in decoder.available_plugins):
        missing = "; ".join(decoder.missing_dependencies) or f"plugin {plugin!r} not installed"
        raise DicomEnvironmentError(
            f"{name}: no decoder for {header.transfer_syntax_name} on this machine ({missing})"
        )


def _refuse_empty(fh: BinaryIO, name: str) -> None:
    start = fh.tell()
    if not fh.read(1):
        raise DicomError(f"{name}: empty file")
    fh.seek(start)


def _why(exc: BaseException) -> str:
    if isinstance(exc, InvalidDicomError):
        if "DICM" in str(exc):  # pydicom's text suggests force=True, which would not help here
            return "not a DICOM file (no 'DICM' prefix or file meta information)"
        return f"not a DICOM file ({exc})"
    if isinstance(exc, EOFError | struct.error):
        return f"file ends early: {exc}"
    if isinstance(exc, BytesLengthException):  # its advice (a pydicom config switch) is not ours
        detail = str(exc).split(" To replace this error", 1)[0]
        return f"an element's value has the wrong length (the file may end inside it): {detail}"
    return f"{type(exc).__name__}: {exc}"
