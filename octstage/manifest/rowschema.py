"""The JSON Schema's item rules on an item table's typed columns, a batch of rows at a time.

``verify`` checked every row of a columnar manifest with jsonschema (~0.6 ms a row: twelve
minutes at a million fields). ``suspects`` evaluates the same schema definition (a field's or
a volume's, with its ``$ref``s) on Arrow arrays at once: types against the columns' Arrow types,
``enum``/``const``, ``pattern`` (RE2), lengths, bounds, ``items`` through list offsets,
``uniqueItems``, struct members, ``required`` and ``if``/``then``/``else``/``not`` over the
row's object. A row is a suspect when any rule refuses it; jsonschema then checks the suspects
alone, which words each finding. A keyword this does not know is a ValueError: a schema change
must be taught here before it can pass unchecked.

The rows are the JSON form's item dicts as ``columnar.json_row`` makes them: a null
``intensity`` or ``pack_index`` is absent (``ABSENT``), a null ``clinical`` an empty object
(``EMPTY``), any other null a null value (refused unless its type allows null).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from octstage.manifest.columnar import plain_type

ABSENT = frozenset({"intensity", "pack_index"})
EMPTY = frozenset({"clinical"})
Mask = npt.NDArray[np.bool_]
# Keywords that state nothing about a value.
_NOTES = frozenset({"description", "$comment", "title", "examples", "default"})
_TYPES = {
    "string": pa.types.is_string,
    "integer": pa.types.is_integer,
    "number": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    "boolean": pa.types.is_boolean,
    "array": pa.types.is_list,
    "object": lambda t: pa.types.is_struct(t) or pa.types.is_map(t),
}
_BOUNDS = {
    "minimum": pc.less,
    "maximum": pc.greater,
    "exclusiveMinimum": pc.less_equal,
    "exclusiveMaximum": pc.greater_equal,
}


def suspects(batch: pa.RecordBatch, schema: dict[str, Any], defs: dict[str, Any]) -> Mask:
    """Which rows of ``batch`` (an item table's columns) ``schema`` may refuse: every row it
    refuses, and perhaps a few it takes (where RE2 and Python's ``re`` differ)."""
    columns = [_plain(c) for c in batch.columns]
    rows = pa.StructArray.from_arrays(columns, names=batch.schema.names) if columns else None
    if rows is None:
        return np.zeros(batch.num_rows, dtype=bool)
    return _Rules(defs).bad(rows, schema, ABSENT, EMPTY)


def _plain(column: pa.Array) -> pa.Array:
    return column.cast(plain_type(column.type)) if pa.types.is_dictionary(column.type) else column


def _mask(values: pa.Array | pa.ChunkedArray, default: bool) -> Mask:
    """A boolean Arrow array as numpy, nulls ``default``."""
    return np.asarray(pc.fill_null(values, default).to_numpy(zero_copy_only=False), dtype=bool)


@dataclass(frozen=True)
class _Site:
    """Where a keyword is evaluated: the array, the (sub)schema it is in, and which members'
    nulls of a struct array mean no key (``absent``) or ``{}`` (``empty``)."""

    array: pa.Array
    schema: dict[str, Any]
    absent: Collection[str]
    empty: Collection[str]


class _Rules:
    """One schema's ``$defs``, and the evaluation of a (sub)schema on an array."""

    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            ref = str(schema["$ref"])
            if not ref.startswith("#/$defs/") or len(schema) > 1:
                raise ValueError(f"schema reference {ref!r} beside other keywords: not checked")
            schema = self.defs[ref.removeprefix("#/$defs/")]
        return schema

    def bad(
        self,
        array: pa.Array,
        schema: dict[str, Any],
        absent: Collection[str] = (),
        empty: Collection[str] = (),
    ) -> Mask:
        """Rows of ``array`` that ``schema`` refuses (null rows: refused unless the type allows
        null). ``absent``/``empty``: members of a struct whose null is no key / ``{}``."""
        schema = self.resolve(schema)
        nulls = _mask(array.is_null(), False)
        types = schema.get("type")
        allowed = [types] if isinstance(types, str) else list(types or ())
        bad = nulls & bool(allowed) & ("null" not in allowed)
        if not (~nulls).any():
            return bad
        for key, rule in schema.items():
            if key in _NOTES or key == "type":
                continue
            found = self._keyword(_Site(array, schema, absent, empty), key, rule)
            bad |= found & ~nulls
        value_types = [t for t in allowed if t != "null"]
        if value_types and not any(_TYPES[t](array.type) for t in value_types):
            bad |= ~nulls
        return bad

    def _keyword(self, site: _Site, key: str, rule: Any) -> Mask:
        array, t = site.array, site.array.type
        if key in ("enum", "const"):
            options = rule if key == "enum" else [rule]
            kinds = [o for o in options if _same_kind(o, t)]
            if not kinds:
                return np.ones(len(array), dtype=bool)
            return ~_mask(pc.is_in(array, value_set=pa.array(kinds, t)), True)
        if key == "pattern":
            if not _text(t):
                return _none(array)
            return ~_mask(pc.match_substring_regex(array, rule), True)
        if key in ("minLength", "maxLength"):
            if not _text(t):
                return _none(array)
            compare = pc.less if key == "minLength" else pc.greater
            return _mask(compare(pc.utf8_length(array), rule), False)
        if key in _BOUNDS:
            if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
                return _none(array)
            return _mask(_BOUNDS[key](array, rule), False)
        if key in ("minItems", "maxItems"):
            if not pa.types.is_list(t):
                return _none(array)
            compare = pc.less if key == "minItems" else pc.greater
            return _mask(compare(pc.list_value_length(array), rule), False)
        if key == "items":
            return self._items(array, rule) if pa.types.is_list(t) else _none(array)
        if key == "uniqueItems":
            return _repeats(array) if rule and pa.types.is_list(t) else _none(array)
        if key in ("properties", "required", "additionalProperties"):
            return self._object(site, key, rule)
        if key in ("if", "then", "else"):
            return self._condition(site, key)
        if key == "not":
            return ~self.bad(array, rule, site.absent, site.empty)
        raise ValueError(f"schema keyword {key!r} is not checked on columns: teach rowschema")

    def _items(self, array: pa.Array, rule: dict[str, Any]) -> Mask:
        """A list's rows with an element ``rule`` refuses."""
        values = pc.list_flatten(array)
        parents = np.asarray(pc.list_parent_indices(array).to_numpy(), dtype=np.int64)
        bad = np.zeros(len(array), dtype=bool)
        bad[parents[self.bad(values, rule)]] = True
        return bad

    def _object(self, site: _Site, key: str, rule: Any) -> Mask:
        array, t, absent = site.array, site.array.type, site.absent
        if pa.types.is_map(t):  # keys are strings by type; only additionalProperties applies
            if key != "additionalProperties" or rule is True:
                return _none(array)
            if rule is False:
                return _mask(pc.greater(pc.list_value_length(array), 0), False)
            pairs = array.cast(pa.list_(pa.struct([t.key_field, t.item_field])))
            value = pc.struct_field(pairs.values, t.item_field.name)
            values = pa.ListArray.from_arrays(pairs.offsets, value, mask=pairs.is_null())
            return self._items(values, rule)
        if not pa.types.is_struct(t):
            return _none(array)
        names = [t.field(i).name for i in range(t.num_fields)]
        bad = np.zeros(len(array), dtype=bool)
        if key == "required":
            for name in rule:
                if name not in names:
                    return np.ones(len(array), dtype=bool)
                if name in absent:
                    bad |= _mask(pc.struct_field(array, name).is_null(), False)
            return bad
        properties = site.schema.get("properties", {})
        if key == "additionalProperties":
            extra = [n for n in names if n not in properties]
            if rule is False and extra:  # no absent member left out: the row dict has them
                for name in extra:
                    present = pc.struct_field(array, name).is_valid()
                    bad |= _mask(present, True) if name in absent else True
                return bad
            if isinstance(rule, dict):
                for name in extra:
                    bad |= self._member(site, name, rule)
            return bad
        for name, sub in rule.items():
            if name in names:
                bad |= self._member(site, name, sub)
        return bad

    def _member(self, site: _Site, name: str, sub: dict[str, Any]) -> Mask:
        """Rows whose member ``name`` ``sub`` refuses (an absent or empty-object null is none)."""
        value = pc.struct_field(site.array, name)
        bad = self.bad(value, sub)
        if name in site.absent or name in site.empty:
            bad &= ~_mask(value.is_null(), False)
        return bad

    def _condition(self, site: _Site, key: str) -> Mask:
        """``if``/``then``/``else``, evaluated once (at ``if``; ``then``/``else`` are none)."""
        if key != "if":
            return _none(site.array)
        array, schema, nulls = site.array, site.schema, (site.absent, site.empty)
        holds = ~self.bad(array, schema["if"], *nulls)
        bad = np.zeros(len(array), dtype=bool)
        if "then" in schema:
            bad |= holds & self.bad(array, schema["then"], *nulls)
        if "else" in schema:
            bad |= ~holds & self.bad(array, schema["else"], *nulls)
        return bad


def _none(array: pa.Array) -> Mask:
    return np.zeros(len(array), dtype=bool)


def _text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _same_kind(value: Any, t: pa.DataType) -> bool:
    """Whether an ``enum``/``const`` option can equal a value of Arrow type ``t``."""
    if isinstance(value, bool):
        return bool(pa.types.is_boolean(t))
    if isinstance(value, int | float):
        return bool(pa.types.is_integer(t) or pa.types.is_floating(t))
    return _text(t) if isinstance(value, str) else False


def _repeats(array: pa.Array) -> Mask:
    """Lists with an element twice (``uniqueItems``), by (row, value) counts."""
    parents = pc.list_parent_indices(array)
    pairs = pa.table({"row": parents, "value": pc.list_flatten(array)})
    counted = pairs.group_by(["row", "value"]).aggregate([("row", "count")])
    rows = counted.filter(pc.greater(counted["row_count"], 1))["row"]
    bad = np.zeros(len(array), dtype=bool)
    bad[np.asarray(rows.to_numpy(), dtype=np.int64)] = True
    return bad
