"""Whether a file is whole, from its structure alone (``dataset.framing``): audit-ids (headers
only) and build-cache (decoding) give a cut file the same verdict, reading item headers only."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pydicom.data
import pytest
from pydicom.encaps import encapsulate, generate_frames
from pydicom.uid import (
    JPEG2000Lossless,
    RLELossless,
)

from octstage.dataset.dicom import HeaderProblem, read_header, read_volume
from octstage.dataset.synth_oct import render_retina
from octstage.errors import DicomEnvironmentError, DicomError
from tests.octstage.dicom_files import CUT, PYDICOM_FILES, write


@pytest.mark.filterwarnings("ignore:End of file reached:UserWarning")
@pytest.mark.parametrize("cut", [2000, 8, 1])
def test_an_rle_file_cut_inside_its_fragments_fails_the_header_as_the_decode(
    tmp_path: Path, cut: int
) -> None:
    """audit-ids reads headers only, build-cache decodes: both must reject a cut file (also
    one cut exactly before the sequence delimiter, at a fragment boundary)."""
    path = tmp_path / "x.dcm"
    write(path, RLELossless)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - cut])
    problem = read_header(path, "x.dcm").problem()
    assert problem is not None and problem[0] == HeaderProblem.TRUNCATED, problem
    assert problem[1].startswith("pixel data truncated: encapsulated: ")
    if cut > 8:  # pydicom still decodes a file that lost only (part of) its delimiter
        with pytest.raises(DicomError, match=r"x\.dcm: pixel data truncated"):
            read_volume(path, "x.dcm")


def test_whole_encapsulated_files_pass_the_framing_check(tmp_path: Path) -> None:
    """The delimiter at the end (one read), or, with an element after the Pixel Data, every item
    header walked to the delimiter."""
    path = tmp_path / "x.dcm"
    write(path, RLELossless)
    assert read_header(path, "x.dcm").problem() is None
    ds = pydicom.dcmread(path)
    ds.DataSetTrailingPadding = b"\x00" * 16  # (FFFC,FFFC): after the Pixel Data
    ds.save_as(path)
    assert read_header(path, "x.dcm").problem() is None
    read_volume(path, "x.dcm")


DELIMITER = b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"  # (FFFE,E0DD), length 0: the fragments' end


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "name",
    [
        "MR_small_RLE.dcm",  # trailing padding after the Pixel Data: the item walk
        "rtdose_rle.dcm",  # 15 frames, one fragment each
        "SC_rgb_rle_2frame.dcm",
        "JPEG2000-embedded-sequence-delimiter.dcm",  # delimiter bytes inside a fragment
        "SC_jpeg_no_color_transform.dcm",
    ],
)
def test_encapsulated_files_from_other_writers_are_whole_and_every_cut_is_seen(
    tmp_path: Path, name: str
) -> None:
    """Real files (pydicom's test data, other writers than ours): no false alarm on the whole
    file, and a cut inside the fragments, at a fragment boundary or inside the delimiter is
    seen from the header alone."""
    raw = (PYDICOM_FILES / name).read_bytes()
    assert read_header(io.BytesIO(raw), name).framing is None
    pixels = raw.index(b"\xe0\x7f\x10\x00")
    delimiter = raw.rindex(DELIMITER)
    for cut in (pixels + 20, (pixels + delimiter) // 2, delimiter, delimiter + 7):
        framing = read_header(io.BytesIO(raw[:cut]), name).framing
        assert framing is not None, cut


class CountingReader(io.RawIOBase):
    """A seekable file over bytes that counts what is read: what a remote reader would fetch."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self._data.readinto(buffer)
        self.bytes_read += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._data.seek(offset, whence)

    def tell(self) -> int:
        return self._data.tell()


class FailingReader(CountingReader):
    """Fails one read at ``at`` (a dropped connection mid-walk), then reads normally."""

    def __init__(self, data: bytes, at: int) -> None:
        super().__init__(data)
        self.at: int | None = at

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.at is not None and self.tell() == self.at:
            self.at = None
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().readinto(buffer)


@pytest.mark.parametrize("bot", [False, True])
def test_a_read_failing_during_the_item_walk_is_the_environments_fault(
    tmp_path: Path, bot: bool
) -> None:
    """pydicom's parse_fragments takes any failed read for the end of the items; a file that
    goes on past that point was not cut: an I/O error (retried), never a 'truncated' verdict.
    Without a Basic Offset Table the walk meets the failure at the third item; with one, at
    the last frame's item, where the walk starts."""
    path = tmp_path / "x.dcm"
    write(path, RLELossless)
    ds = pydicom.dcmread(path)
    frames = list(generate_frames(ds.PixelData, number_of_frames=int(ds.NumberOfFrames)))
    ds.PixelData = encapsulate(frames, has_bot=bot)
    ds.DataSetTrailingPadding = b"\x00" * 16  # no delimiter at the end: the walk
    ds.save_as(path)
    raw = path.read_bytes()
    table = raw.index(b"\xfe\xff\x00\xe0", raw.index(b"\xe0\x7f\x10\x00"))
    first = table + 8 + int.from_bytes(raw[table + 4 : table + 8], "little")
    if bot:
        at = first + int.from_bytes(raw[first - 4 : first], "little")  # the table's last entry
    else:
        at = first
        for _ in range(2):
            at = raw.index(b"\xfe\xff\x00\xe0", at + 8)
    assert raw[at : at + 4] == b"\xfe\xff\x00\xe0"
    failing = FailingReader(raw, at)
    with pytest.raises(DicomEnvironmentError, match=r"^x\.dcm: I/O error: "):
        read_header(failing, "x.dcm")
    assert failing.at is None  # the failure happened, inside the walk
    assert read_header(io.BytesIO(raw), "x.dcm").problem() is None


def test_the_framing_check_reads_item_headers_never_fragments(tmp_path: Path) -> None:
    """The header-only read stays header-sized: one 8-byte read of the delimiter when the file
    ends with it, else 8 bytes per item (plus the offset table), seeking over the fragments."""
    frames = 32
    path = tmp_path / "x.dcm"
    write(path, RLELossless, render_retina((frames, 128, 128), 0.1, "R", np.random.default_rng(0)))
    raw = path.read_bytes()
    fast = CountingReader(raw)
    assert read_header(fast, "x.dcm").problem() is None
    assert fast.bytes_read < 4096 < len(raw) // 100  # the header, not the pixels
    ds = pydicom.dcmread(path)
    ds.DataSetTrailingPadding = b"\x00" * 16
    ds.save_as(path)
    walked = CountingReader(path.read_bytes())
    assert read_header(walked, "x.dcm").problem() is None
    assert walked.bytes_read - fast.bytes_read <= 8 * (frames + 2) + 4 * frames + 64
    cut = CountingReader(raw[: len(raw) // 2])
    problem = read_header(cut, "x.dcm").problem()
    assert problem is not None and problem[0] == HeaderProblem.TRUNCATED
    assert cut.bytes_read < 4096


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydicom warns about the cut it meets
@pytest.mark.parametrize("ts", [RLELossless, JPEG2000Lossless])
def test_a_file_cut_anywhere_gets_the_same_verdict_from_its_header_and_its_decode(
    tmp_path: Path, ts: str
) -> None:
    """Every cut of the header (each byte up to the first fragment) and of the fragments
    (sampled): the header-only read either refuses the file with a DicomError, or names a
    problem, or passes it, and a passed file must then decode. Nothing else may escape: one
    exception type escaping ``read_header`` stops the whole ``audit-ids`` run."""
    path = tmp_path / "x.dcm"
    write(path, ts)
    raw = path.read_bytes()
    bot = raw.index(b"\xe0\x7f\x10\x00OB") + 12  # the Basic Offset Table item
    first_item = bot + 8 + int.from_bytes(raw[bot + 4 : bot + 8], "little")
    cuts = [*range(1, first_item + 16), *range(first_item + 16, len(raw), 97)]
    verdicts: set[str] = set()
    for n in cuts:
        cut = raw[:n]
        try:
            problem = read_header(io.BytesIO(cut), "x.dcm").problem()
        except DicomError as exc:
            assert str(exc).startswith("x.dcm: "), exc
            verdicts.add("refused")
            continue
        if problem is not None:
            verdicts.add(problem[0].value)
            continue
        read_volume(io.BytesIO(cut), "x.dcm")  # passed the header: must decode
        verdicts.add("whole")
    assert HeaderProblem.TRUNCATED.value in verdicts and "refused" in verdicts
    assert "whole" not in verdicts  # every cut drops at least the sequence delimiter


class ReadLog(io.BytesIO):
    """Records where each read starts and how many bytes it returns."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads: list[tuple[int, int]] = []

    def read(self, size: int | None = -1) -> bytes:
        at = self.tell()
        data = super().read(size)
        self.reads.append((at, len(data)))
        return data


@pytest.mark.parametrize("bot", [True, False])
@pytest.mark.parametrize("cut", [0, 300])
def test_with_an_offset_table_only_the_last_frames_items_are_read(
    tmp_path: Path, bot: bool, cut: int
) -> None:
    """A 40-frame RLE file with an element after its Pixel Data (so the one-read check of the
    trailing delimiter cannot decide), whole or cut inside its last fragment: the header read
    reads item headers only (8 bytes each), and with a filled Basic Offset Table only the last
    frame's, not all 40."""
    frames = 40
    path = tmp_path / "x.dcm"
    write(path, RLELossless, render_retina((frames, 64, 64), 0.1, "R", np.random.default_rng(1)))
    ds = pydicom.dcmread(path)
    fragments = list(generate_frames(ds.PixelData, number_of_frames=frames))
    ds.PixelData = encapsulate(fragments, has_bot=bot)
    ds.DataSetTrailingPadding = b"\x00" * 16  # (FFFC,FFFC), after the Pixel Data
    ds.save_as(path)
    raw = path.read_bytes()
    if cut:  # cut inside the last fragment: the file then ends inside it
        last = raw.rindex(b"\xfe\xff\x00\xe0")
        raw = raw[: last + 8 + cut]
    fh = ReadLog(raw)
    header = read_header(fh, "x.dcm")
    assert (header.problem() is None) == (cut == 0), header.problem()
    pixel = raw.index(b"\xe0\x7f\x10\x00OB") + 12
    first_fragment = pixel + 8 + (4 * frames if bot else 0)
    after = [(at, n) for at, n in fh.reads if at >= first_fragment]
    assert all(n <= 8 for _, n in after), after  # item headers, the trailing delimiter probe
    # pydicom reads an item's tag and length apart: two reads per item header
    assert len(after) <= (8 if bot else 2 * frames + 8), after


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_header_cut_reads_as_truncated_not_as_a_file_without_pixel_data(tmp_path: Path) -> None:
    """pydicom stops quietly where a file ends, even inside an element, so a file cut before
    its Pixel Data read as "no PixelData". Now a cut anywhere but exactly between two top-level
    elements (indistinguishable from a file that ends there) is refused as truncated, by the
    header read and the decode alike."""
    path = tmp_path / "x.dcm"
    write(path, RLELossless)
    raw = path.read_bytes()
    ds = pydicom.dcmread(io.BytesIO(raw), stop_before_pixels=True)
    elements = [ds.get_item(tag) for tag in sorted(ds.keys())]  # raw: positions, lengths
    boundaries = {e.value_tell + e.length for e in elements}
    pixel = raw.index(b"\xe0\x7f\x10\x00OB")
    no_pixels = 0
    # From the first element's value on (a cut inside the first element's own header leaves an
    # empty data set, with no position to compare: 8 bytes in a file of megabytes).
    for n in range(elements[0].value_tell, pixel):
        try:
            problem = read_header(io.BytesIO(raw[:n]), "x.dcm").problem()
        except DicomError as exc:
            if n not in boundaries:
                assert re.search(CUT, str(exc)), (n, exc)
                with pytest.raises(DicomError, match=CUT):
                    read_volume(io.BytesIO(raw[:n]), "x.dcm")
            continue
        assert n in boundaries, (n, problem)
        assert problem is not None and problem[0] == HeaderProblem.NO_PIXEL_DATA, (n, problem)
        no_pixels += 1
    assert no_pixels > 0  # the boundaries after Rows, Columns...: "no PixelData" stays


def test_an_offset_table_length_past_the_end_is_not_read(tmp_path: Path) -> None:
    """A cut file whose Basic Offset Table length is damaged into a gigabyte: refused from the
    8-byte item header, without asking the reader for the table (remote: a download)."""
    path = tmp_path / "x.dcm"
    write(path, RLELossless)
    raw = bytearray(path.read_bytes()[:-100])
    bot = raw.index(b"\xe0\x7f\x10\x00OB") + 12
    raw[bot + 4 : bot + 8] = (1 << 30).to_bytes(4, "little")
    fh = ReadLog(bytes(raw))
    problem = read_header(fh, "x.dcm").problem()
    assert problem is not None and problem[0] == HeaderProblem.TRUNCATED
    assert "Basic Offset Table" in problem[1]
    assert max(n for at, n in fh.reads if at >= bot) <= 8, fh.reads


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_offset_table_pointing_off_the_items_falls_back_to_the_whole_walk(
    tmp_path: Path,
) -> None:
    """Some writers fill the Basic Offset Table wrongly and decoders cope: a table whose last
    entry misses the last frame's item is not a verdict on the file, the walk starts over from
    the first item instead (and finds it whole)."""
    path = tmp_path / "x.dcm"
    write(path, RLELossless)
    ds = pydicom.dcmread(path)
    ds.DataSetTrailingPadding = b"\x00" * 16  # no delimiter at the end: the walk
    ds.save_as(path)
    raw = bytearray(path.read_bytes())
    table = raw.index(b"\xfe\xff\x00\xe0", raw.index(b"\xe0\x7f\x10\x00"))
    first = table + 8 + int.from_bytes(raw[table + 4 : table + 8], "little")
    last_entry = int.from_bytes(raw[first - 4 : first], "little")
    raw[first - 4 : first] = (last_entry + 2).to_bytes(4, "little")  # inside the item header
    assert read_header(io.BytesIO(bytes(raw)), "x.dcm").problem() is None
