"""DICOM reading: headers, spacing, every encoding, and a DicomError for every damaged file."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pydicom.data
import pytest
from pydicom.uid import (
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    RLELossless,
)

from octstage.dataset.dicom import HeaderProblem, read_header, read_volume
from octstage.dataset.synth import SynthInfo
from octstage.errors import DicomError
from tests.octstage.dicom_files import PYDICOM_FILES, SPACING, UID_, write


@pytest.mark.parametrize(
    ("ts", "decoder", "lossless"),
    [
        (ExplicitVRLittleEndian, "", True),
        (RLELossless, "pylibjpeg", True),
        (JPEG2000Lossless, "pylibjpeg", True),
        (JPEGBaseline8Bit, "pillow", False),
    ],
)
def test_every_encoding_decodes_with_the_chosen_plugin(
    tmp_path: Path, ts: str, decoder: str, lossless: bool
) -> None:
    path = tmp_path / "x.dcm"
    source = write(path, ts)
    header, arr = read_volume(path, "x.dcm")
    assert (header.transfer_syntax, header.decoder) == (ts, decoder)
    assert arr.dtype == np.uint8 and arr.shape == source.shape == header.shape
    if lossless:
        np.testing.assert_array_equal(arr, source)
    else:  # JPEG baseline is lossy: close, not equal
        assert 0 < np.abs(arr.astype(int) - source).mean() < 6
    # A stream (how remote objects arrive) gives the same answer as a path.
    h2, arr2 = read_volume(io.BytesIO(path.read_bytes()), "x.dcm")
    assert h2 == header
    np.testing.assert_array_equal(arr2, arr)


def test_header_fields_and_spacing_from_the_functional_groups(tmp_path: Path) -> None:
    path = tmp_path / "x.dcm"
    write(path, RLELossless, laterality="L", patient_id="7111")
    h = read_header(path, "x.dcm")
    assert (h.patient_id, h.laterality, h.sop_instance_uid) == ("7111", "L", UID_)
    assert (h.frames, h.rows, h.columns) == (6, 40, 48)
    assert h.spacing_mm == SPACING and h.regular_grid
    assert (h.manufacturer, h.model, h.modality) == ("Topcon", "Maestro2", "OPT")
    assert h.problem() is None


def test_a_radial_scan_is_not_a_regular_grid(tmp_path: Path) -> None:
    path = tmp_path / "onh.dcm"
    per_frame = [(0.04, 0.0039, 0.0113 * (1 + 0.02 * i)) for i in range(6)]
    write(path, ExplicitVRLittleEndian, per_frame_spacing=per_frame)
    h = read_header(path, "onh.dcm")
    assert not h.regular_grid and h.spacing_mm is None
    problem = h.problem()
    assert problem is not None and problem[0] is HeaderProblem.IRREGULAR_GRID


def test_a_file_without_spacing_says_so(tmp_path: Path) -> None:
    path = tmp_path / "x.dcm"
    write(path, ExplicitVRLittleEndian)
    ds = pydicom.dcmread(path)
    del ds.SharedFunctionalGroupsSequence
    ds.save_as(path)
    h = read_header(path, "x.dcm")
    assert h.spacing_mm is None
    assert h.problem() == (
        HeaderProblem.NO_SPACING,
        "no pixel spacing / slice thickness in the header",
    )


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda raw: b"", "empty file"),
        (lambda raw: b"<html>403 Forbidden</html>", "not a DICOM file"),
        (lambda raw: raw[: len(raw) - 500], "pixel data truncated: expected 11520 bytes, found"),
        (lambda raw: raw[:200], "x.dcm: "),
    ],
)
def test_each_damage_raises_dicom_error_naming_file_and_reason(
    tmp_path: Path, damage: object, says: str
) -> None:
    path = tmp_path / "x.dcm"
    write(path, ExplicitVRLittleEndian)
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(DicomError, match=r"^x\.dcm: ") as err:
        read_volume(path, "x.dcm")
    assert says in str(err.value)


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydicom warns about the cut
def test_a_file_cut_anywhere_in_its_header_is_a_dicom_error_or_a_header_problem(
    tmp_path: Path,
) -> None:
    """Cut inside an element's value (e.g. Rows keeps 1 of its 2 bytes) pydicom raises its own
    BytesLengthException, which is no OSError/ValueError: it must still become a DicomError, or
    audit-ids (which reports DicomErrors per file) stops on the first such file."""
    path = tmp_path / "x.dcm"
    write(path, RLELossless)
    raw = path.read_bytes()
    pixel_tag = raw.index(b"\xe0\x7f\x10\x00")
    outcomes: set[str] = set()
    for cut in range(1, pixel_tag + 64):
        try:
            problem = read_header(io.BytesIO(raw[:cut]), "x.dcm").problem()
            outcomes.add(problem[0] if problem else "usable")
        except DicomError as exc:
            assert str(exc).startswith("x.dcm: ") and "pydicom.config" not in str(exc), exc
            outcomes.add("DicomError")
    assert "usable" not in outcomes
    assert {"DicomError", HeaderProblem.TRUNCATED} <= outcomes


def test_missing_pixel_data_and_16_bit_pixels_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.dcm"
    write(path, ExplicitVRLittleEndian, pixel_data=False)
    assert read_header(path, "x.dcm").problem() == (HeaderProblem.NO_PIXEL_DATA, "no PixelData")
    with pytest.raises(DicomError, match=r"x\.dcm: no PixelData"):
        read_volume(path, "x.dcm")
    write(path, ExplicitVRLittleEndian)
    ds = pydicom.dcmread(path)
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelData = np.zeros((6, 40, 48), np.uint16).tobytes()
    ds.save_as(path)
    with pytest.raises(DicomError, match=r"x\.dcm: unsupported BitsAllocated 16"):
        read_volume(path, "x.dcm")


def test_a_missing_path_is_a_dicom_error(tmp_path: Path) -> None:
    with pytest.raises(DicomError, match=r"gone\.dcm: cannot open"):
        read_header(tmp_path / "gone.dcm", "gone.dcm")


@pytest.mark.filterwarnings("ignore:End of file reached:UserWarning")
def test_synthetic_traps_fail_as_planted(synth_info: SynthInfo) -> None:
    expect = {
        "unreadable": "",
        "truncated": "pixel data truncated",
        "no_pixel_data": "no PixelData",
    }
    checked = 0
    for rel, kind in synth_info.excluded.items():
        if kind in expect:
            with pytest.raises(DicomError) as err:
                read_volume(synth_info.root / rel, rel)
            assert str(err.value).startswith(f"{rel}: ")
            assert expect.get(kind, "pixel data truncated") in str(err.value)
            checked += 1
    assert checked == 5


@pytest.mark.filterwarnings("ignore::UserWarning")  # broken on purpose: pydicom says so
@pytest.mark.parametrize("name", sorted(p.name for p in PYDICOM_FILES.glob("*.dcm")))
def test_pydicom_bundled_files_give_a_result_or_a_dicom_error(name: str) -> None:
    """Broken, odd and foreign files: never an exception other than DicomError."""
    path = PYDICOM_FILES / name
    for read in (read_header, read_volume):
        try:
            read(path, name)
        except DicomError as exc:
            assert str(exc).startswith(f"{name}: ")
