"""The schema's types of a manifest, checked as it loads, before anything compares or reads it.

A hand-edited value of the wrong type (a label written ``"2"``, a split ``5``, a ``zarr_path``
null) used to reach the checks, which compared it with an ``int`` and failed with Python's own
words in every consumer; a key given twice in a JSON object silently kept its last value. Here
the manifest is held against ``octstage/manifest.schema.json`` itself (the one source of the
types): of the JSON form every value's JSON type (an integer is an ``int``, never ``1.0``), every
required key, every key the schema does not know, and every key an object gives twice
(``parse``, through ``object_pairs_hook``); of the columnar form, the nulls of the item table
where the schema allows none (``table_problems``; its columns' Arrow types are checked against
``columnar.ARROW_SCHEMAS`` as it opens). Only types and keys: patterns, bounds and the rest of
the schema are ``verify``'s, and contradictions between items are ``checks``'.

Each problem is one line naming the item (``volumes[3] (zarr_path '...')``, ``fields[0]
(item_id '...')``, ``table row 3``), the key, the value and what the schema expects;
``refusal`` words the error of the first few and the count.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from octstage.errors import ManifestError, ManifestTypeError
from octstage.manifest.columnar import ARROW_SCHEMAS
from octstage.manifest.model import SCHEMA_PATH
from octstage.manifest.rowschema import ABSENT, EMPTY

SHOWN = 5  # problems an error names; the rest are counted
# Python's types of each JSON type (``type(v) in``: a bool is no integer, 1.0 no integer).
_PYTHON: dict[str, tuple[type, ...]] = {
    "null": (type(None),),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "array": (list,),
    "object": (dict,),
}
_WORDS = {
    "null": "null",
    "boolean": "true or false",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "an object",
}
_PLURAL = {
    "null": "nulls",
    "boolean": "booleans",
    "integer": "integers",
    "number": "numbers",
    "string": "strings",
    "array": "lists",
    "object": "objects",
}
# What names an item of each list to a user, in order of preference.
_NAMES = {"volumes": ("zarr_path", "cache_key"), "fields": ("item_id", "zarr_path")}


class Doubled(dict[str, Any]):
    """A JSON object that gave a key more than once (``doubled``: each such key's values, in
    order); as a dict it holds the last, as ``json.loads`` would."""

    doubled: dict[str, list[Any]]


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    out = Doubled(d)
    values: dict[str, list[Any]] = {}
    for key, value in pairs:
        values.setdefault(key, []).append(value)
    out.doubled = {k: v for k, v in values.items() if len(v) > 1}
    return out


def parse(text: str | bytes, source: str) -> Any:
    """A manifest's JSON text as Python values, an object that gives a key twice a ``Doubled``
    (``problems`` names it); text that is no JSON is a ManifestError naming ``source``."""
    try:
        return json.loads(text, object_pairs_hook=_object)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{source}: not valid JSON: {exc}") from None


@dataclass
class Rule:
    """What the schema says of one value's type: its JSON types (none: any), the choices it
    names (``enum``/``const``, for the message), and of a list its items, of an object its keys."""

    types: tuple[str, ...] = ()
    choices: tuple[Any, ...] = ()
    items: Rule | None = None
    keys: dict[str, Rule] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    extra: Rule | bool = True  # additionalProperties: any (True), none (False), or of a rule
    python: tuple[type, ...] = ()

    def expected(self) -> str:
        """The rule in words: "a string: one of 'train', 'val', 'test'", "a list of integers"."""
        words = " or ".join(_WORDS[t] for t in self.types) or "any value"
        if self.items is not None and self.items.types and "array" in self.types:
            words += " of " + " or ".join(_PLURAL[t] for t in self.items.types)
        if self.choices:
            words += ": one of " + ", ".join(repr(c) for c in self.choices)
        return words


def _compile(schema: dict[str, Any], defs: dict[str, Any]) -> Rule:
    while "$ref" in schema:
        schema = defs[str(schema["$ref"]).removeprefix("#/$defs/")]
    types = schema.get("type", ())
    choices = tuple(schema["enum"]) if "enum" in schema else ()
    choices = (schema["const"],) if "const" in schema else choices
    if isinstance(types, str):
        types = (types,)
    if not types and choices:  # an enum's type is its values'
        types = tuple(dict.fromkeys(_json_type(c) for c in choices))
    if not types and ("properties" in schema or "required" in schema):
        types = ("object",)
    rule = Rule(types=tuple(types), choices=choices)
    rule.python = tuple(t for name in rule.types for t in _PYTHON[name])
    if "object" in rule.types:
        rule.python += (Doubled,)
    if isinstance(schema.get("items"), dict):
        rule.items = _compile(schema["items"], defs)
    rule.keys = {k: _compile(v, defs) for k, v in schema.get("properties", {}).items()}
    rule.required = tuple(schema.get("required", ()))
    extra = schema.get("additionalProperties", True)
    rule.extra = _compile(extra, defs) if isinstance(extra, dict) else bool(extra)
    return rule


@functools.cache
def _rules() -> tuple[Rule, dict[str, Any]]:
    """The whole manifest's rule and the schema (read once)."""
    schema = json.loads(Path(SCHEMA_PATH).read_text(encoding="utf-8"))
    return _compile(schema, schema["$defs"]), schema


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "string", "array", "object", "number"):
        if type(value) in _PYTHON[name] or (name == "object" and isinstance(value, dict)):
            return name
    return type(value).__name__


def _shown(value: Any) -> str:
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _value(value: Any) -> str:
    """A value with its JSON type: "the string '2'", "the number 1.0", "null"."""
    kind = _json_type(value)
    if kind == "null":
        return "null"
    words = {"boolean": "the boolean", "array": "the list", "object": "the object"}
    return f"{words.get(kind, 'the ' + kind)} {_shown(value)}"


def problems(data: Any) -> list[str]:
    """Every value of ``data`` (a manifest's JSON form, or the columnar form's header) whose
    type the schema refuses, every key missing, unknown or given twice: one line each."""
    root, _ = _rules()
    found: list[str] = []
    if not isinstance(data, dict):
        return [f"the manifest is {_value(data)}, expected an object"]
    lists = [k for k in ("volumes", "fields") if type(data.get(k)) is list]
    for key in lists:
        rule = root.keys[key].items or Rule()
        for n, item in enumerate(data[key]):
            _check(item, rule, _item_name(key, n, item), "", found)
    # The rest of the document: the items' lists as empty, their items checked above.
    whole = Doubled({k: [] if k in lists else v for k, v in data.items()})
    whole.doubled = getattr(data, "doubled", {})
    _check(whole, root, "", "", found)
    return found


def _item_name(key: str, n: int, item: Any) -> str:
    where = f"{key}[{n}]"
    if isinstance(item, dict):
        for name in _NAMES[key]:
            if isinstance(item.get(name), str):
                return f"{where} ({name} {item[name]!r})"
    return where


def _check(value: Any, rule: Rule, item: str, path: str, found: list[str]) -> None:
    """``value``'s problems against ``rule`` appended to ``found``: ``item`` names the item
    (empty at the top of the manifest), ``path`` the key inside it ("normalization.p_low")."""
    at = f"{item}: " if item and path else item
    if rule.python and type(value) not in rule.python:
        found.append(
            f"{at}{path or ('' if item else 'the manifest')} is {_value(value)}, "
            f"expected {rule.expected()}"
        )
        return
    if type(value) is list:
        for n, element in enumerate(value):
            _check(element, rule.items or Rule(), item, f"{path}[{n}]", found)
        return
    if not isinstance(value, dict):
        return
    at = f"{item}: " if item else ""
    inside = f"{path}." if path else ""
    for key, values in getattr(value, "doubled", {}).items():
        shown = ", then ".join(_shown(v) for v in values)
        found.append(
            f"{at}key {inside + key!r} is given {len(values)} times ({shown}): JSON keeps only "
            "the last; give it once"
        )
    for key in rule.required:
        if key not in value:
            sub = rule.keys.get(key)
            wanted = f", expected {sub.expected()}" if sub is not None else ""
            found.append(f"{at}no key {inside + key!r}: the schema requires it{wanted}")
    for key, element in value.items():
        sub = rule.keys.get(key)
        if sub is None and rule.extra is False:
            found.append(
                f"{at}unknown key {inside + key!r} (value {_shown(element)}): the schema has "
                "no such key here (a typo?)"
            )
            continue
        if sub is None:
            sub = rule.extra if isinstance(rule.extra, Rule) else Rule()
        _check(element, sub, item, inside + key, found)


def refusal(source: str, found: Sequence[str], what: str = "malformed manifest") -> str:
    """The error's words: the file, the first ``SHOWN`` problems one a line, the count, and
    what to do."""
    lines = "".join(f"\n  {line}" for line in found[:SHOWN])
    more = f"\n  ... and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return (
        f"{source}: {what}: {len(found)} value(s) of the wrong type or key(s) missing, unknown "
        f"or given twice (nothing was compared or read):{lines}{more}\n"
        "  mend them (the types are octstage/manifest.schema.json's, see docs/manifest.md) or "
        "rebuild the cache"
    )


def refuse_types(data: Any, source: str) -> None:
    """ManifestTypeError naming ``source`` and ``data``'s problems, if it has any."""
    found = problems(data)
    if found:
        raise ManifestTypeError(refusal(source, found), found)


# ---- the columnar form: nulls where the schema allows none ---------------------------------


def nullable(kind: str) -> frozenset[str]:
    """The item table's columns that may hold nulls: those whose type allows null, and those a
    null of which the JSON form writes as no key or an empty object (``columnar.json_row``)."""
    _, schema = _rules()
    item = schema["$defs"]["field" if kind == "cellpainting" else "volume"]["properties"]
    allowed = {k for k, v in item.items() if "null" in _as_tuple(v.get("type", ()))}
    return frozenset(allowed | ABSENT | EMPTY)


def _as_tuple(types: Any) -> tuple[str, ...]:
    return (types,) if isinstance(types, str) else tuple(types)


def table_problems(source: Path | bytes, kind: str, name: str, table: str) -> list[str]:
    """Every null of an item table (file name ``table``) where the schema allows none: from the
    footer's counts (no column read when it says none), then the columns that may have one read
    to name the rows (``name``: the column naming an item). One line each."""
    reader = pq.ParquetFile(pa.BufferReader(source) if isinstance(source, bytes) else source)
    free = nullable(kind)
    maybe: dict[str, bool] = {}  # column -> nested (read to tell an empty list from a null)
    meta = reader.metadata
    for group in range(meta.num_row_groups):
        chunks = meta.row_group(group)
        for i in range(chunks.num_columns):
            chunk = chunks.column(i)
            path = chunk.path_in_schema
            top = path.split(".")[0]
            stats = chunk.statistics
            nulls = stats.null_count if stats is not None and stats.has_null_count else None
            nested = "." in path
            if nulls == 0 or (top in free and not nested):
                continue
            maybe[top] = maybe.get(top, False) or nested
    found: list[str] = []
    if not maybe:
        return found
    names: list[Any] | None = None
    types = ARROW_SCHEMAS[kind]
    for column in types.names:
        if column not in maybe:
            continue
        values = reader.read(columns=[column]).column(0).combine_chunks()
        bad = _null_rows(values, column in free)
        if not bad.any():
            continue
        if names is None:
            names = reader.read(columns=[name]).column(0).to_pylist()
        expected = types.field(column).type
        for n in np.flatnonzero(bad):
            row = int(n)
            what = "is null" if values[row].as_py() is None else "holds a null"
            item = f" ({name} {names[row]!r})" if isinstance(names[row], str) else ""
            found.append(f"{table} row {row}{item}: {column} {what}, expected {expected}")
    return found


def _null_rows(array: pa.Array, free: bool) -> np.ndarray:
    """Rows of ``array`` with a null the schema refuses: the row itself (unless ``free``), or a
    struct's member, a list's element or a map's value anywhere inside it."""
    valid = np.asarray(pc.fill_null(array.is_valid(), False).to_numpy(zero_copy_only=False))
    bad = np.zeros(len(array), dtype=bool) if free else ~valid
    t = array.type
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            bad |= valid & _null_rows(pc.struct_field(array, [i]), False)
    elif pa.types.is_map(t):  # as the list of key-value pairs it is (keys are never null)
        bad |= _null_rows(array.cast(pa.list_(pa.struct([t.key_field, t.item_field]))), True)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        parents = np.asarray(pc.list_parent_indices(array).to_numpy(), dtype=np.int64)
        bad[parents[_null_rows(pc.list_flatten(array), False)]] = True
    return bad
