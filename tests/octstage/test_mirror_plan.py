"""``octstage mirror``'s pure parts, without I/O: plan, deletion guard, inventory, locations.

Also the rclone arguments, remotes from the environment or the config file, and scrubbing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from octstage.errors import MirrorError
from octstage.mirror.inventory import (
    Entry,
    Inventory,
    check_deletions,
    from_json,
    inventory_from_listing,
    plan_mirror,
    to_json,
)
from octstage.mirror.rclone import copy_config, copy_filter
from octstage.mirror.run import run_mirror
from octstage.storage import ObjectInfo
from octstage.storage.locations import known_secrets, parse_location, scrub


def inv(*entries: tuple[str, int, str | None]) -> Inventory:
    return Inventory("b2://b/p", "2026-01-01T00:00:00+00:00", tuple(Entry(*e) for e in entries))


def test_plan_sorts_every_object_into_one_bucket() -> None:
    source = inv(
        ("new", 1, "a" * 40),
        ("resized", 2, "b" * 40),
        ("unverified-copy", 3, "c" * 40),
        ("verified", 4, "d" * 40),
        ("changed", 5, "e" * 40),
        ("no-sha1", 6, None),
    )
    held = [
        ObjectInfo("resized", 3),
        ObjectInfo("unverified-copy", 3),
        ObjectInfo("verified", 4, "d" * 40),
        ObjectInfo("changed", 5, "f" * 40),
        ObjectInfo("no-sha1", 6),
        ObjectInfo("stale", 1),
        ObjectInfo("_octstage/inventory.json", 9),
    ]
    plan = plan_mirror(source, held, prune=True)
    assert [e.name for e in plan.copy] == ["new", "resized", "changed"]  # inventory order
    assert [e.name for e in plan.verify] == ["unverified-copy"]
    assert [e.name for e in plan.unverifiable] == ["no-sha1"]
    assert [e.name for e in plan.in_sync] == ["verified"]
    assert plan.extra == plan.delete == ("stale",)
    assert plan_mirror(source, held, prune=False).delete == ()
    assert plan.counts()["copy_bytes"] == 1 + 2 + 5


def test_deletion_guard() -> None:
    plan = plan_mirror(inv(("a", 1, None)), [ObjectInfo(f"x{i}", 1) for i in range(3)], True)
    check_deletions(plan, source_objects=1, max_delete=3)
    with pytest.raises(MirrorError, match="more than --max-delete 2"):
        check_deletions(plan, source_objects=1, max_delete=2)
    with pytest.raises(MirrorError, match="lists no objects"):
        check_deletions(plan, source_objects=0, max_delete=100)
    check_deletions(plan_mirror(inv(), [], True), source_objects=0, max_delete=0)


def test_inventory_round_trips_and_excludes_its_own_folder() -> None:
    listing = [
        ObjectInfo("b", 2, "A" * 40),
        ObjectInfo("a/ü x", 1, None),
        ObjectInfo("_octstage/inventory.json", 5, None),
    ]
    made = inventory_from_listing(listing, "b2://b/p", "2026-01-01T00:00:00+00:00")
    assert [e.name for e in made.objects] == ["a/ü x", "b"]
    assert made.objects[1].sha1 == "a" * 40
    assert from_json(to_json(made), "x") == made
    with pytest.raises(MirrorError, match="format"):
        from_json(json.dumps({"format": "other"}), "x")
    with pytest.raises(MirrorError, match="not an octstage inventory"):
        from_json("[1, 2]", "x")


def test_rclone_arguments() -> None:
    config = copy_config(32, 64)
    assert config["Transfers"] == 32 and config["Checkers"] == 64 and config["UseListR"] is True
    assert "IgnoreTimes" not in config and copy_config(1, 1, ignore_times=True)["IgnoreTimes"]
    assert copy_config(4, 4, fast_list=False)["UseListR"] is False
    assert copy_filter() == {"ExcludeRule": ["_octstage/**"]}
    with pytest.raises(MirrorError):
        copy_config(0, 4)


def test_locations_from_environment_only_remotes() -> None:
    env = {
        "RCLONE_CONFIG": "/dev/null",
        "RCLONE_CONFIG_B2_TYPE": "b2",
        "RCLONE_CONFIG_B2_ACCOUNT": "kid-secret-1",
        "RCLONE_CONFIG_B2_KEY": "key-secret-2",
        "RCLONE_CONFIG_MYGCS_TYPE": "google cloud storage",
        "RCLONE_CONFIG_MYGCS_ANONYMOUS": "true",
        "OCTSTAGE_GCS_REMOTE": "mygcs",
    }
    b2 = parse_location("b2:bucket/v3/", env)
    assert (b2.kind, b2.bucket, b2.prefix, b2.rclone_fs, b2.url) == (
        "b2", "bucket", "v3", "b2:bucket/v3", "b2://bucket/v3",
    )  # fmt: skip
    assert "secret" not in repr(b2)
    gs = parse_location("gs://mirror/aireadi", env)
    assert (gs.kind, gs.rclone_fs) == ("gcs", "mygcs:mirror/aireadi")
    b2url = parse_location("b2://bucket", env)
    assert b2url.rclone_fs == "b2:bucket"
    local = parse_location("./some/folder", env)
    assert local.kind == "local" and Path(local.prefix).is_absolute()
    with pytest.raises(MirrorError, match="not configured"):
        parse_location("nosuch:bucket/x", env)
    with pytest.raises(MirrorError, match="on-the-fly"):
        parse_location(":b2,account=a,key=b:bucket", env)
    secrets = known_secrets([b2, gs], env)
    assert {"kid-secret-1", "key-secret-2"} <= set(secrets)
    assert scrub("auth kid-secret-1:key-secret-2 failed", secrets) == "auth ***:*** failed"


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("gs://b/x", "gs://b/x/y"),
        ("gs://b", "gs://b/m"),
        ("/tmp/a/b", "/tmp/a"),
        ("b2:s/v", "gs://b/v"),
    ],
)
def test_overlapping_or_unsupported_locations_are_refused(
    src: str, dst: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RCLONE_CONFIG", "/dev/null")
    monkeypatch.setenv("RCLONE_CONFIG_B2_TYPE", "b2")
    monkeypatch.setenv("RCLONE_CONFIG_GCS_TYPE", "google cloud storage")
    if src.startswith("b2:"):
        src, dst = dst, src  # a B2 destination
    with pytest.raises(MirrorError, match=r"overlap|destination must be"):
        run_mirror(src, dst)


def test_remotes_from_the_rclone_config_file(tmp_path: Path) -> None:
    """A remote only in the config file (read with ``rclone config dump``), never echoed."""
    conf = tmp_path / "rclone.conf"
    conf.write_text("[archive]\ntype = b2\naccount = file-kid-123\nkey = file-key-456\n")
    env = {"RCLONE_CONFIG": str(conf), "PATH": os.environ.get("PATH", "")}
    loc = parse_location("archive:bucket/v3", env)
    assert (loc.kind, loc.rclone_fs, loc.url) == ("b2", "archive:bucket/v3", "b2://bucket/v3")
    assert loc.remote is not None and loc.remote.get("key") == "file-key-456"
    assert "file-key-456" not in repr(loc)
    assert {"file-kid-123", "file-key-456"} <= set(known_secrets([loc], env))
