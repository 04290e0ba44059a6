"""The exported tables' columns: what the field's own tools read (pure: items in, Arrow out).

Every table has ``Metadata_``-prefixed columns beside float32 feature columns named a prefix
plus a zero-padded index (``emb_0000``, ``emb_0001``, ...): the layout of the Cell Painting
Gallery's ``workspace_dl`` profiles, which pycytominer (``features=``/``meta_features=``) and
copairs read as they are.

* Cell Painting, one row per field (``FIELD_COLUMNS``): source, batch, plate, well, site, the
  perturbation's JCP2022 id and its type (``negcon`` for the DMSO wells), the split, the
  manifest's item id and cache key. Per well (``WELL_KEYS`` + ``WELL_CARRIED``): the mean of its
  fields (pycytominer's ``aggregate(operation="mean")``) and how many there were.
* OCT, one row per volume (``VOLUME_COLUMNS``): participant, device and its model, laterality,
  region, split, study group and its label index, the cached array's path and key. Per
  participant: the mean of their volumes, with the split and study group (one per participant
  in AI-READI) and the count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

# output column -> (manifest attribute, Arrow type), per kind, in table order
FIELD_COLUMNS: dict[str, tuple[str, pa.DataType]] = {
    "Metadata_Source": ("source", pa.string()),
    "Metadata_Batch": ("batch", pa.string()),
    "Metadata_Plate": ("plate", pa.string()),
    "Metadata_Well": ("well", pa.string()),
    "Metadata_Site": ("site", pa.int64()),
    "Metadata_JCP2022": ("perturbation", pa.string()),
    "Metadata_pert_type": ("perturbation_type", pa.string()),
    "Metadata_Split": ("split", pa.string()),
    "Metadata_ItemId": ("item_id", pa.string()),
    "Metadata_CacheKey": ("cache_key", pa.string()),
}
VOLUME_COLUMNS: dict[str, tuple[str, pa.DataType]] = {
    "Metadata_ParticipantId": ("participant_id", pa.string()),
    "Metadata_Device": ("device", pa.string()),
    "Metadata_DeviceModel": ("device_model", pa.string()),
    "Metadata_Laterality": ("laterality", pa.string()),
    "Metadata_Region": ("anatomic_region", pa.string()),
    "Metadata_Split": ("split", pa.string()),
    "Metadata_StudyGroup": ("study_group", pa.string()),
    "Metadata_Label": ("label", pa.int64()),
    "Metadata_ZarrPath": ("zarr_path", pa.string()),
    "Metadata_CacheKey": ("cache_key", pa.string()),
}
ITEM_COLUMNS = {"cellpainting": FIELD_COLUMNS, "oct": VOLUME_COLUMNS}
# The per-group tables: the key columns, the columns carried from a group's first item, the
# count column and the file name.
WELL_KEYS = ("Metadata_Source", "Metadata_Batch", "Metadata_Plate", "Metadata_Well")
WELL_CARRIED = ("Metadata_JCP2022", "Metadata_pert_type", "Metadata_Split")
PARTICIPANT_KEYS = ("Metadata_ParticipantId",)
PARTICIPANT_CARRIED = ("Metadata_Split", "Metadata_StudyGroup", "Metadata_Label")
GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str, str]] = {
    "cellpainting": (WELL_KEYS, WELL_CARRIED, "Metadata_Fields", "wells.parquet"),
    "oct": (PARTICIPANT_KEYS, PARTICIPANT_CARRIED, "Metadata_Volumes", "participants.parquet"),
}
ITEM_TABLES = {"cellpainting": "fields", "oct": "volumes"}  # what a part's rows are


def feature_names(prefix: str, dim: int) -> list[str]:
    """``prefix`` + a zero-padded index, for ``dim`` features (sorted as numbered)."""
    width = max(4, len(str(dim - 1)))
    return [f"{prefix}{i:0{width}d}" for i in range(dim)]


def item_schema(kind: str, prefix: str, dim: int) -> pa.Schema:
    """The per-item table's schema: metadata columns, then float32 features."""
    fields = [pa.field(name, t) for name, (_, t) in ITEM_COLUMNS[kind].items()]
    fields += [pa.field(name, pa.float32()) for name in feature_names(prefix, dim)]
    return pa.schema(fields)


def group_schema(kind: str, prefix: str, dim: int) -> pa.Schema:
    """The per-well (per-participant) table's schema."""
    keys, carried, count, _ = GROUPS[kind]
    columns = ITEM_COLUMNS[kind]
    fields = [pa.field(name, columns[name][1]) for name in (*keys, *carried)]
    fields.append(pa.field(count, pa.int64()))
    fields += [pa.field(name, pa.float32()) for name in feature_names(prefix, dim)]
    return pa.schema(fields)


def metadata_columns(items: Sequence[Any], kind: str) -> dict[str, pa.Array]:
    """The metadata columns of ``items`` (a manifest's items or a view of them): of the
    columnar manifest's item table read as columns (no item built), else from the items."""
    out: dict[str, pa.Array] = {}
    column_array = getattr(items, "column_array", None)
    for name, (attr, arrow_type) in ITEM_COLUMNS[kind].items():
        if column_array is not None:
            out[name] = column_array(attr).combine_chunks().cast(arrow_type)
        else:
            out[name] = pa.array([getattr(item, attr) for item in items], arrow_type)
    return out


def item_batch(
    kind: str, schema: pa.Schema, meta: dict[str, pa.Array], x: np.ndarray
) -> pa.RecordBatch:
    """A batch of the per-item table: ``meta`` (``metadata_columns`` of its rows) and the
    features ``x`` ``[rows, dim]``."""
    features = np.ascontiguousarray(x, dtype=np.float32)
    arrays = [meta[name] for name in ITEM_COLUMNS[kind]]
    arrays += [pa.array(features[:, j]) for j in range(features.shape[1])]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
