"""Upload a local folder into a B2 bucket with b2sdk (for the demo and end-to-end tests).

Credentials come from the environment exactly as octstage reads them (an rclone ``b2`` remote
from ``RCLONE_CONFIG_B2_*``, else ``B2_APPLICATION_KEY_ID``/``B2_APPLICATION_KEY``), so the
same env file drives the upload, rclone and octstage.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from octstage.storage.b2 import B2Storage
from octstage.storage.locations import parse_location


def upload_folder(folder: Path, url: str, workers: int = 8) -> int:
    """Upload every file under ``folder`` to ``url`` (``b2://bucket/prefix`` or ``b2:...``);
    returns the number of files. b2sdk records each file's SHA1 (``large_file_sha1`` too)."""
    storage = B2Storage.from_location(parse_location(url))
    bucket = storage._bucket
    files = sorted(p for p in folder.rglob("*") if p.is_file())

    def one(path: Path) -> None:
        rel = path.relative_to(folder).as_posix()
        name = f"{storage.prefix}/{rel}" if storage.prefix else rel
        bucket.upload_local_file(str(path), name)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, files))
    return len(files)


__all__ = ["upload_folder"]
