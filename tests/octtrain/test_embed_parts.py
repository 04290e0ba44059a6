"""The export's pure pieces: the plan of parts and each process's share, streamed group means, the
tables' columns, the settings' refusals; and a part's check against its record."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from octtrain.config.embed import EmbedConfig
from octtrain.embed.aggregate import GroupMeans, group_counts
from octtrain.embed.parts import Part, PartWriter, check_part, mine, plan
from octtrain.embed.tables import feature_names, group_schema, item_schema
from octtrain.errors import ConfigError


@pytest.mark.parametrize("items", [1, 7, 8, 9, 100])
def test_every_item_is_in_one_part_and_every_part_with_one_process(items: int) -> None:
    parts = plan(items, 8)
    assert [i for p in parts for i in range(p.start, p.stop)] == list(range(items))
    for world in (1, 2, 3, 5):
        shares = [mine(parts, rank, world) for rank in range(world)]
        assert sorted(p.index for share in shares for p in share) == [p.index for p in parts]
    assert plan(items, 8) == parts  # the plan knows nothing of the processes


def test_group_means_hand_out_each_group_when_its_last_item_arrives() -> None:
    keys = ["a", "b", "a", "c", "b", "a"]
    x = np.arange(12, dtype=np.float64).reshape(6, 2)
    means = GroupMeans(group_counts(keys))
    first = list(means.add(keys[:3], x[:3], ["A", "B", "A2"]))
    assert first == []
    done = list(means.add(keys[3:], x[3:], ["C", "B2", "A3"]))
    assert [(k, c, n) for k, c, _, n in done] == [("c", "C", 1), ("b", "B", 2), ("a", "A", 3)]
    assert np.allclose(done[2][2], x[[0, 2, 5]].mean(axis=0))
    means.close()
    with pytest.raises(ValueError, match="does not list"):
        list(GroupMeans({"a": 1}).add(["z"], x[:1], [None]))
    partial = GroupMeans({"a": 2})
    list(partial.add(["a"], x[:1], [None]))
    with pytest.raises(ValueError, match="1 of 2 items"):
        partial.close()


def test_feature_columns_sort_as_numbered_and_tables_are_typed() -> None:
    names = feature_names("emb_", 12345)
    assert names[:2] == ["emb_00000", "emb_00001"] and sorted(names) == names
    schema = item_schema("cellpainting", "emb_", 3)
    assert schema.field("Metadata_Site").type == pa.int64()
    assert schema.field("emb_0002").type == pa.float32()
    assert group_schema("oct", "x", 2).names[:2] == ["Metadata_ParticipantId", "Metadata_Split"]


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"part_size": 0}, "--part-size"),
        ({"batch_size": 0}, "--batch-size"),
        ({"limit": 0}, "--limit"),
        ({"num_workers": -1}, "--num-workers"),
        ({"prefix": "Metadata_f"}, "--prefix"),
        ({"prefix": "9x"}, "--prefix"),
        ({"encoder": "student"}, "--encoder"),
    ],
)
def test_settings_that_cannot_run_are_refused_naming_the_flag(
    change: dict[str, object], flag: str
) -> None:
    with pytest.raises(ConfigError, match=flag):
        EmbedConfig(checkpoint="c", manifest="m", out="o", **change)  # type: ignore[arg-type]


def _write(folder: Path, part: Part) -> None:
    schema = pa.schema([("v", pa.int64())])
    writer = PartWriter(folder, part, schema)
    writer.write(pa.RecordBatch.from_arrays([pa.array(range(part.rows))], schema=schema))
    writer.finish()


def test_a_part_is_complete_only_with_its_record_rows_and_checksum(tmp_path: Path) -> None:
    part = Part(0, 0, 5)
    assert check_part(tmp_path, part) == (None, "not written")
    _write(tmp_path, part)
    record, why = check_part(tmp_path, part)
    assert record is not None and record.rows == 5 and why == ""
    assert check_part(tmp_path, Part(0, 0, 6))[1].endswith("describes other items")
    data = bytearray((tmp_path / part.name).read_bytes())
    data[10] ^= 1
    (tmp_path / part.name).write_bytes(bytes(data))
    assert "is damaged" in check_part(tmp_path, part)[1]


def test_a_part_with_other_rows_than_its_items_is_not_finished(tmp_path: Path) -> None:
    schema = pa.schema([("v", pa.int64())])
    writer = PartWriter(tmp_path, Part(0, 0, 5), schema)
    writer.write(pa.RecordBatch.from_arrays([pa.array(range(4))], schema=schema))
    with pytest.raises(ValueError, match="4 rows for 5 items"):
        writer.finish()
    writer.abort()
    assert check_part(tmp_path, Part(0, 0, 5)) == (None, "not written")
    assert not list((tmp_path / "parts").iterdir())


def test_a_second_ctrl_c_while_a_part_is_aborted_still_removes_its_temporary_file(
    tmp_path: Path,
) -> None:
    schema = pa.schema([("v", pa.int64())])
    writer = PartWriter(tmp_path, Part(0, 0, 5), schema)
    writer.write(pa.RecordBatch.from_arrays([pa.array(range(2000))], schema=schema))
    assert writer.tmp.exists()
    close = writer.writer.close

    def interrupted_close() -> None:
        close()
        raise KeyboardInterrupt  # the operator's second Ctrl-C, as the file closes

    writer.writer.close = interrupted_close  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        writer.abort()
    assert not list((tmp_path / "parts").iterdir())


def test_the_eta_reads_past_a_day() -> None:
    from octtrain.embed.summary import clock

    assert [clock(0), clock(59.9), clock(30 * 3600 + 61)] == ["0:00:00", "0:00:59", "30:01:01"]
    assert clock(float("inf")) == "n/a"
