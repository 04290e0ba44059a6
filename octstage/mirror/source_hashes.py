"""Source SHA1s that the source itself does not list (``octstage mirror --hash-missing``).

An object listed without a SHA1 (a B2 large file without ``large_file_sha1``, every S3 object)
is read once at the source and hashed here. The inventory records such a hash with the object's
listed version (``inventory.remembered_hashes`` reuses it while that holds), and a hash that no
copy matches is dropped again: the hashing read had nothing to check it against.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console

from octstage.errors import MirrorError, ObjectNotFoundError, StorageError
from octstage.mirror.inventory import INVENTORY_NAME, Inventory, forget_hashes, from_json, to_json
from octstage.progress import LineProgress, megabytes
from octstage.storage import ObjectInfo, Storage

log = logging.getLogger(__name__)
HASH_CHUNK = 8 << 20


def previous_inventory(dst: Storage) -> Inventory | None:
    """The inventory an earlier run saved at the destination (for the hashes it recorded)."""
    try:
        return from_json(dst.read_bytes(INVENTORY_NAME), f"{dst.url}/{INVENTORY_NAME}")
    except ObjectNotFoundError:
        return None
    except MirrorError as exc:  # damaged: its hashes are not trusted, the objects are re-hashed
        log.warning("%s; recorded source hashes ignored", exc)
        return None


def forget_unmatched_hashes(dst: Storage, inv: Inventory, corrupt: list[str]) -> list[str]:
    """Drop from the saved inventory each hashed SHA1 of ``corrupt`` (objects no copy matched,
    even re-copied); returns the names whose hash was dropped.

    The read that hashed it may have been the bad one (the source gave no checksum to check it
    against); kept, it would fail the object on every run. Dropped, the next run with
    ``--hash-missing`` hashes the object again.
    """
    kept, dropped = forget_hashes(inv, corrupt)
    if dropped:
        dst.write_bytes(INVENTORY_NAME, to_json(kept).encode())
        log.warning(
            "%d objects hashed at the source match no copy; their hashes are dropped and "
            "--hash-missing hashes them again next run",
            len(dropped),
        )
    return dropped


def hash_at_source(
    storage: Storage,
    objects: list[ObjectInfo],
    console: Console,
    transfers: int,
    every: float,
) -> tuple[dict[str, str], int]:
    """SHA1 of each object, streamed from the source: (name -> hex, bytes read). An object that
    cannot be read whole at its listed size gets no hash (the next run tries again)."""
    total = sum(o.size for o in objects)
    lines = LineProgress(console, "mirror hash-missing", every, megabytes)
    lock = threading.Lock()
    done, objects_done = [0], [0]

    def one(obj: ObjectInfo) -> tuple[str, str | None]:
        digest = hashlib.sha1(usedforsecurity=False)
        read = 0
        try:
            with storage.open(obj.name) as fh:
                while chunk := fh.read(HASH_CHUNK):
                    digest.update(chunk)
                    read += len(chunk)
                    with lock:
                        done[0] += len(chunk)
                        lines.update(done[0], total, f"{objects_done[0]}/{len(objects)} objects")
        except StorageError as exc:
            log.warning("cannot hash %s at the source: %s", obj.name, exc)
            return obj.name, None
        if read != obj.size:
            # open() reads the newest version by name: a rewrite since the listing (or a short
            # read) would record another version's hash under the listed size and version.
            log.warning(
                "cannot hash %s at the source: read %d bytes, the listing says %d "
                "(rewritten since listed?); left unverified, the next run hashes it again",
                obj.name, read, obj.size,
            )  # fmt: skip
            return obj.name, None
        with lock:
            objects_done[0] += 1
        return obj.name, digest.hexdigest()

    log.info("hashing %d objects (%d bytes) at the source (--hash-missing)", len(objects), total)
    with ThreadPoolExecutor(max_workers=max(1, min(transfers, 8))) as pool:
        found = {name: sha1 for name, sha1 in pool.map(one, objects) if sha1 is not None}
    lines.update(done[0], total, f"{len(found)}/{len(objects)} objects hashed", final=True)
    return found, done[0]
