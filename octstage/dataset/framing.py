"""Whether a DICOM file is whole, judged from its structure alone (no pixel decoding).

``encapsulation_problem`` checks the item framing of compressed Pixel Data by reading item
headers only, and ``cut_short`` tells a file cut before its Pixel Data from one without any.
Both serve ``dicom.read_header``, so the header-only ``audit-ids`` and the decoding
``build-cache`` reject a cut file alike.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from pydicom.dataset import Dataset
from pydicom.encaps import parse_basic_offsets, parse_fragments

# Encapsulated Pixel Data is always little endian: items (FFFE,E000), then (FFFE,E0DD) length 0.
_ITEM = b"\xfe\xff\x00\xe0"
_DELIMITER = b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"


def cut_short(ds: Dataset, end: int) -> str | None:
    """Where a data set that ends without Pixel Data was cut, if it visibly was.

    pydicom stops quietly at the end of a file, even inside an element: its last element's
    declared value then runs past ``end``, or the few bytes left after it are too short to be
    an element. A cut exactly between elements (or inside an undefined-length sequence) looks
    like a file that ends there and stays "no PixelData". Reads nothing: the elements are still
    raw, with their positions and declared lengths. More bytes left over than an element
    header are something pydicom stopped before on purpose, not a cut.
    """
    if not ds:
        return None
    last = ds.get_item(max(ds.keys()))
    value_tell, length = getattr(last, "value_tell", None), getattr(last, "length", None)
    if value_tell is None or length is None or length == 0xFFFFFFFF:
        return None
    stop = value_tell + length
    if stop > end:
        return f"the file ends inside {last.tag} ({end - value_tell} of its {length} bytes)"
    if 0 < end - stop < 12:  # an element header takes 8 bytes, or 12 for OB/OW/SQ/UN...
        return f"{end - stop} byte(s) after {last.tag} are too few for another element"
    return None


def encapsulation_problem(fh: BinaryIO, start: int, end: int, frames: int) -> str | None:
    """Why the items of encapsulated Pixel Data starting at ``start`` are broken; None if whole.

    Reads item headers only, never fragment bytes. The common case costs one small read: the
    file ends with the sequence delimiter, which a file cut inside its fragments cannot (a
    file with elements after the Pixel Data takes the walk below instead). Otherwise pydicom's
    ``parse_fragments`` reads item headers (8 bytes each, seeking over the fragments), and the
    last fragment must end inside the file, before the delimiter. A filled Basic Offset Table
    names the last frame's first item, so only that frame's items are read, not every frame's
    (on a remote file each item header is a request); an empty table, or one that points at
    anything but an item (some writers' tables are wrong), means walking from the first item.
    """
    if end - start >= 8:
        fh.seek(end - 8)
        if fh.read(8) == _DELIMITER:
            return None
    fh.seek(start)
    head = fh.read(8)
    if len(head) == 8 and start + 8 + int.from_bytes(head[4:], "little") > end:
        # Checked before pydicom reads the table: a length cut or damaged into megabytes
        # would otherwise be read, on a remote file a download.
        return "the file ends inside the Basic Offset Table"
    fh.seek(start)
    try:
        table = parse_basic_offsets(fh)  # leaves fh at the first fragment's item
        first = fh.tell()
        walk = first + table[-1] if table else first
        if walk != first:
            fh.seek(walk)
            if fh.read(4) != _ITEM:
                walk = first
        fh.seek(walk)
        # It stops quietly where the file ends, so the end of its last item is checked below.
        count, offsets = parse_fragments(fh)
        stop = walk
        if offsets:
            fh.seek(offsets[-1] + 4)
            (length,) = struct.unpack("<L", fh.read(4))
            stop = offsets[-1] + 8 + length
            if stop > end:
                return (
                    f"a fragment declares {length} bytes at byte {offsets[-1] + 8}, "
                    f"the file ends at {end}"
                )
    except (ValueError, struct.error) as exc:
        return f"the fragment items are malformed: {exc}"
    fh.seek(stop)
    tail = fh.read(8)
    if len(tail) < 8:
        return f"the file ends after byte {stop}, without the sequence delimiter"
    if tail[:4] != _DELIMITER[:4]:
        # parse_fragments also stops quietly on a read that fails (a network hiccup): the file
        # goes on here, so that is the environment's fault, not a verdict on the bytes.
        raise OSError(f"reading the fragment items stopped at byte {stop} of {end}")
    if walk == first and count < frames:
        return f"{count} fragment(s) for {frames} frames"
    return None
