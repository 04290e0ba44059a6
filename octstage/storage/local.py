"""Local-folder backend: atomic writes by rename, names checked against escaping the root."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from octstage.errors import ObjectNotFoundError, StorageError
from octstage.manifest import atomic_write_bytes
from octstage.storage.base import ObjectInfo, check_name


class LocalStorage:
    """Objects are files under ``root``; metadata is not kept (local files need no source SHA1)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, name: str) -> Path:
        return self.root / check_name(name)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if not self.root.is_dir():
            return
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            # Hidden temporaries (".tmp-*", ".name.*.tmp") are half-written by definition.
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for fname in filenames:
                if fname.startswith("."):
                    continue
                path = Path(dirpath) / fname
                name = path.relative_to(self.root).as_posix()
                if name.startswith(prefix):
                    found.append(_listed(path, name))
        yield from sorted(found, key=lambda o: o.name)

    def stat(self, name: str) -> ObjectInfo:
        path = self._path(name)
        try:
            return ObjectInfo(name=name, size=path.stat().st_size)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{path}: no such object") from exc

    def open(self, name: str, chunk_size: int | None = None) -> BinaryIO:
        path = self._path(name)
        try:
            irregular = not stat.S_ISREG(path.stat().st_mode) and not path.is_dir()
        except OSError:
            irregular = False  # absent or unreadable: open names it
        if irregular:  # opening a FIFO blocks until a writer comes: refused, named
            raise StorageError(f"{path}: not a regular file (a FIFO or device): not read")
        try:
            return open(path, "rb")
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{path}: no such object") from exc
        except OSError as exc:  # a symlink loop, no permission, a folder: named, not a crash
            raise StorageError(f"{path}: cannot read: {exc.strerror or exc}") from exc

    def read_bytes(self, name: str) -> bytes:
        try:
            with self.open(name) as fh:
                return fh.read()
        except OSError as exc:  # a folder, no permission, EIO: not "missing"
            raise StorageError(f"{self._path(name)}: cannot read: {exc.strerror or exc}") from exc

    def write_bytes(
        self, name: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        atomic_write_bytes(self._path(name), data)

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)


def _listed(path: Path, name: str) -> ObjectInfo:
    """The listing entry of one file; one that cannot be stat'ed carries its ``problem``."""
    try:
        return ObjectInfo(name=name, size=path.stat().st_size)
    except FileNotFoundError:
        try:
            target = os.readlink(path)
        except OSError:
            target = None
        if target is None:  # gone since os.walk saw it: a later run may find it again
            return ObjectInfo(name, 0, problem="vanished while listing", transient=True)
        return ObjectInfo(
            name, 0, problem=f"dangling symlink: its target {target!r} is missing", transient=True
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return ObjectInfo(name, 0, problem="symlink loop: the link never reaches a file")
        return ObjectInfo(name, 0, problem=f"cannot stat: {exc.strerror or exc}", transient=True)
