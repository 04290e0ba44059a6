"""The manifest: the one contract between octstage and octtrain.

A manifest (schema in ``octstage/manifest.schema.json``, shipped with the package) lists every
cached item with its labels, provenance and a checksum of the stored array, plus every rejected
source file with its reason. It has two forms that ``load`` tells apart and reads alike (see
docs/manifest.md): **JSON** (schema version 1), one file listing every item; **columnar**
(version 2, ``write(..., form="table")``), a JSON header naming a Parquet item table beside it,
whose items load as an ``ItemTable`` (a lazy sequence over the columns; ``ItemTable.common()`` is
what a trainer keeps). Either is written last and atomically (the table before its header);
readers check the schema and cache versions before trusting anything. This module imports neither
torch nor any cloud SDK.

Two kinds of data share the one schema (``Manifest.kind``):

- ``"oct"`` (the default; a manifest without ``kind`` is one): ``Manifest.volumes`` lists
  ``Volume`` items, uint8 ``[frames, rows, columns]`` OCT volumes of AI-READI.
- ``"cellpainting"``: ``Manifest.fields`` lists ``Field`` items, uint8 ``[C, Y, X]`` Cell Painting
  fields of view (JUMP layout); ``volumes`` is empty.

Every item has the common part: an id (``participant_id`` + source for a volume, ``item_id`` for
a field), ``split``, ``label`` (an index into ``Manifest.classes``; a field's may be None),
``zarr_path`` (OME-Zarr group; the array is ``array_path`` = ``f"{zarr_path}/0"``), ``shape``,
``dtype``, ``checksum`` (``"sha256:<hex>"`` of the array's values in C order), ``cache_key`` and
its source files with their hashes; the rest is typed per kind. ``Manifest.items`` gives the
common part of either kind (what ``verify`` and ``stage`` need).

The package, by concern: ``model`` (the items, header and constants), ``checks`` (the one check
of a manifest and which findings stop which consumer), ``tablechecks`` (the rows of an item table
the checks must see, found in Arrow), ``repeats`` (values an item table lists twice, found by
hashing its strings in numpy), ``serial`` (both forms, load and write), ``itemtypes`` (the
schema's types and keys, held as a manifest loads, before any check), ``columnar`` (the
item table's schemas, writer and column reader), ``itemtable`` (the items over its columns),
``spool`` (a build's fields on disk until the manifest is written).
Import from ``octstage.manifest``: octtrain imports nothing else of octstage.
"""

from __future__ import annotations

# Files written whole (octstage/atomic.py) and, at the end, the one rule for output folders
# (octstage/outputs.py), for octtrain too: this module is the only one of octstage that octtrain
# imports.
from octstage.atomic import atomic_write_bytes as atomic_write_bytes
from octstage.atomic import atomic_write_text as atomic_write_text
from octstage.atomic import ctrl_c_deferred as ctrl_c_deferred
from octstage.errors import ManifestError as ManifestError  # octtrain catches it from here
from octstage.manifest.checks import CHECKS as CHECKS
from octstage.manifest.checks import FATAL as FATAL
from octstage.manifest.checks import Finding as Finding
from octstage.manifest.checks import check as check
from octstage.manifest.checks import consistency_problems as consistency_problems
from octstage.manifest.checks import refuse as refuse
from octstage.manifest.columnar import file_sha256 as file_sha256
from octstage.manifest.columnar import table_digest_problem as table_digest_problem
from octstage.manifest.itemtable import CommonRecord as CommonRecord
from octstage.manifest.itemtable import CommonRows as CommonRows
from octstage.manifest.itemtable import ItemTable as ItemTable
from octstage.manifest.model import CACHE_VERSION as CACHE_VERSION
from octstage.manifest.model import CELLPAINTING_CHANNELS as CELLPAINTING_CHANNELS
from octstage.manifest.model import FORMS as FORMS
from octstage.manifest.model import KINDS as KINDS
from octstage.manifest.model import PERTURBATION_TYPES as PERTURBATION_TYPES
from octstage.manifest.model import SCHEMA_PATH as SCHEMA_PATH
from octstage.manifest.model import SCHEMA_VERSION as SCHEMA_VERSION
from octstage.manifest.model import TABLE_SCHEMA_VERSION as TABLE_SCHEMA_VERSION
from octstage.manifest.model import ChannelSource as ChannelSource
from octstage.manifest.model import Concept as Concept
from octstage.manifest.model import Field as Field
from octstage.manifest.model import FieldTally as FieldTally
from octstage.manifest.model import Header as Header
from octstage.manifest.model import Intensity as Intensity
from octstage.manifest.model import Item as Item
from octstage.manifest.model import Manifest as Manifest
from octstage.manifest.model import Normalization as Normalization
from octstage.manifest.model import Rejected as Rejected
from octstage.manifest.model import Volume as Volume
from octstage.manifest.model import count_summary as count_summary
from octstage.manifest.model import field_counts as field_counts
from octstage.manifest.serial import Rows as Rows
from octstage.manifest.serial import field_row as field_row
from octstage.manifest.serial import from_dict as from_dict
from octstage.manifest.serial import header_bytes as header_bytes
from octstage.manifest.serial import item_rows as item_rows
from octstage.manifest.serial import load as load
from octstage.manifest.serial import table_file_name as table_file_name
from octstage.manifest.serial import to_dict as to_dict
from octstage.manifest.serial import to_header as to_header
from octstage.manifest.serial import write as write
from octstage.manifest.spool import FieldSpool as FieldSpool
from octstage.manifest.spool import PlateSpool as PlateSpool
from octstage.outputs import check_feature_cache as check_feature_cache
from octstage.outputs import check_output_folder as check_output_folder
from octstage.outputs import claim_export_folder as claim_export_folder
from octstage.outputs import claim_run_folder as claim_run_folder
from octstage.outputs import move_aside as move_aside
from octstage.outputs import refuse_inside_cache as refuse_inside_cache
from octstage.outputs import replace_report as replace_report
