"""A client's streaming reader whose failures surface as StorageError (callers catch that).

The SDKs raise their own exceptions from ``read`` and ``seek`` (transport errors, expired
credentials, a vanished object); every backend wraps its reader in ``GuardedReader`` so a reader
fails the same way whatever store it reads from, naming the object and never a credential.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from octstage.errors import StorageError


class GuardedReader(io.RawIOBase):
    """``inner`` (a readable, seekable file of a client) with ``errors`` turned by ``fail``."""

    def __init__(
        self,
        inner: Any,
        errors: tuple[type[BaseException], ...],
        fail: Callable[[BaseException], StorageError],
    ) -> None:
        self._inner = inner
        self._errors = errors
        self._fail = fail

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _guard(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._errors as exc:
            raise self._fail(exc) from None

    def read(self, size: int | None = -1) -> bytes:
        return bytes(self._guard(self._inner.read, -1 if size is None else size))

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._guard(self._inner.seek, offset, whence))

    def tell(self) -> int:
        return int(self._inner.tell())

    def close(self) -> None:
        self._inner.close()
        super().close()
