"""A loopback HTTP front for b2sdk's own B2 simulator (``RawSimulator``): the server's lifecycle.

The real rclone binary (b2 backend, ``endpoint=http://127.0.0.1:PORT``) and the real b2sdk HTTP
client (realm = the same URL) talk to it as they would to Backblaze. The simulator keeps the
state and enforces B2's rules (auth tokens, SHA1 of uploads and parts, large-file assembly); the
handler (b2_handler.py) only translates HTTP to simulator calls, plus what the simulator lacks:

- ``b2_list_file_names`` with ``delimiter`` (rclone lists folder by folder without
  ``--fast-list``), served from a sorted name index so 25k objects list quickly;
- widened counters (the stock simulator stops after ~5k uploads and 200 upload URLs);
- realistic part sizes (the stock 200-byte part makes every b2sdk upload a large file);
- fault injection: HTTP 5xx/429 answers, same-size corrupted downloads, slow downloads, and
  objects stored without any SHA1 (``put(..., sha1=False)``);
- counters of calls per operation and of downloaded bytes, and every auth token it issued (so
  tests can check no credential leaks into what octstage writes).

Not a general B2 server: one account, one key, no key management, no encryption, no file lock.
"""

from __future__ import annotations

import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from tests.doubles.b2_handler import _Handler
from tests.doubles.b2_handler import _parse_range as _parse_range  # re-exported for its tests
from tests.doubles.b2_state import API_URL, B2State, Fault, MiB, Stats

__all__ = ["API_URL", "B2Double", "Fault", "MiB", "Stats"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client closed its keep-alive connection (or was killed): not an error
        super().handle_error(request, client_address)


class B2Double(B2State):
    """The state plus its loopback HTTP server. Use as a context manager."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> B2Double:
        handler = type("Handler", (_Handler,), {"double": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # stop() waits for one poll
            name="b2-double",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> B2Double:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "B2Double not started"
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rclone_env(self, remote: str = "B2") -> dict[str, str]:
        """Environment defining an rclone b2 remote (and b2sdk credentials) for this double."""
        name = remote.upper()
        return {
            f"RCLONE_CONFIG_{name}_TYPE": "b2",
            f"RCLONE_CONFIG_{name}_ACCOUNT": self.key_id,
            f"RCLONE_CONFIG_{name}_KEY": self.key,
            f"RCLONE_CONFIG_{name}_ENDPOINT": self.endpoint,
        }
