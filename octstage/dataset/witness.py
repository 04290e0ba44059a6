"""The fourth witness: does ``retinal_oct/manifest.tsv``'s row agree with the file it lists?

Folder, file-name prefix and PatientID already agree on a verified file (``ids.resolve``); the
release's own index must then agree with them, and with the header, on participant, eye, device
(the model's folder, and the header's model where it gives one), anatomic region (one the device
has) and frames x height x width. aireadi-loader trusts that row alone, so a row that disagrees
would hand its users the wrong participant's or eye's volume: here it excludes the file, with
the line and both values in the reason. audit-ids asks it with the header's values, build-cache
with the record of the volume it built. Pure: no I/O.
"""

from __future__ import annotations

from octstage.dataset.release import DEVICE_REGIONS, TSV_NAME, TsvRow

PARTICIPANT = "tsv_participant_disagrees"
LATERALITY = "tsv_laterality_disagrees"
DEVICE = "tsv_device_disagrees"
REGION = "tsv_region_unknown"
SHAPE = "tsv_shape_disagrees"
KINDS = (PARTICIPANT, LATERALITY, DEVICE, REGION, SHAPE)


def check_row(
    row: TsvRow,
    *,
    device: str,
    participant_id: str,
    laterality: str | None,
    shape: tuple[int, int, int],
    header_model: str | None = None,
) -> tuple[str, str] | None:
    """``(kind, reason)`` for the first disagreement between the row and the file, else None.

    ``device`` is the file's structural_oct/ folder; ``participant_id`` the one its folder, name
    and PatientID agree on; ``laterality`` and ``shape`` (frames, rows, columns) the header's."""
    ref = f"{TSV_NAME}:{row.line}"
    if row.participant_id != participant_id:
        return PARTICIPANT, (
            f"{ref} names participant {row.participant_id!r}; folder, file name and PatientID "
            f"say {participant_id!r}"
        )
    eye = laterality
    if row.laterality != eye:
        return LATERALITY, f"{ref} says eye {row.laterality!r}; the file's header says {eye!r}"
    # Two device checks, each the only one to see its case: the row's model against the folder
    # (build-cache has no header model), then the header's model against both (a file in the
    # folder and row of one device whose header names another).
    if row.device != device:
        return DEVICE, (
            f"{ref} says {row.manufacturer} {row.model!r}; the file lies under {device}/"
        )
    if header_model and row.model.lower() not in header_model.lower():
        return DEVICE, f"{ref} says model {row.model!r}; the header says {header_model!r}"
    regions = DEVICE_REGIONS.get(device, ())
    if row.anatomic_region not in regions:
        return REGION, (
            f"{ref}: anatomic_region {row.anatomic_region!r} is not one the {row.model} has "
            f"({', '.join(regions)})"
        )
    if row.shape != shape:
        return SHAPE, (
            f"{ref} says {'x'.join(map(str, row.shape))} (frames x height x width); the header "
            f"says {'x'.join(map(str, shape))}"
        )
    return None
