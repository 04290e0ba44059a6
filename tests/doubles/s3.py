"""An S3 emulator on loopback: moto in server mode (real HTTP, real S3 wire protocol).

moto's ``ThreadedMotoServer`` serves from a daemon thread of the test process (it dies with it)
on a free port the kernel picks. Every client talks to it over HTTP: s3fs (the backend under
test) through ``AWS_ENDPOINT_URL`` and dummy keys, boto3 (the second client the storage suite
reads back through), and rclone's s3 backend (``provider=Other``, ``endpoint=...``).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

ACCESS_KEY_ID = "AKIAOCTSTAGETEST0001"
SECRET_ACCESS_KEY = "octstage-test-secret-access-key-do-not-log"
REGION = "us-east-1"


class S3Double:
    """One moto server on 127.0.0.1. A context manager."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Double:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server.start()
        self.port = int(self._server.get_host_and_port()[1])
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> S3Double:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The standard AWS variables pointing every AWS SDK (and octstage) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_ENDPOINT_URL": self.url,
            "AWS_REGION": REGION,
        }

    def rclone_remote(self, name: str = "s3") -> dict[str, str]:
        """``RCLONE_CONFIG_<NAME>_*`` variables for an rclone s3 remote on this server."""
        head = f"RCLONE_CONFIG_{name.upper()}_"
        return {
            f"{head}TYPE": "s3",
            f"{head}PROVIDER": "Other",
            f"{head}ACCESS_KEY_ID": ACCESS_KEY_ID,
            f"{head}SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            f"{head}ENDPOINT": self.url,
            f"{head}REGION": REGION,
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server: a second client, independent of s3fs."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            region_name=REGION,
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)
