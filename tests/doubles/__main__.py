"""Run the cloud doubles for the demo: ``python -m tests.doubles serve|upload-b2 ...``.

``serve --env-file FILE`` starts the B2 double and fake-gcs-server on free loopback ports,
creates the requested buckets, writes the variables every command needs to FILE (``export``
lines: source it with ``. FILE``) and runs until killed (SIGTERM/SIGINT), then removes FILE.

``upload-b2 FOLDER b2://bucket/prefix`` uploads a local folder into the B2 double with b2sdk
(run it with FILE sourced).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import threading
from pathlib import Path


def _write_env(path: Path, env: dict[str, str]) -> None:
    lines = [f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.writelines(lines)
    os.chmod(tmp, 0o600)  # it holds the (test) keys
    os.replace(tmp, path)  # readers never see half a file: wait for it to exist, then source


def serve(env_file: Path, b2_buckets: list[str], gcs_buckets: list[str]) -> int:
    from tests.doubles.b2_server import B2Double
    from tests.doubles.gcs import GcsDouble

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with B2Double() as b2, GcsDouble() as gcs:
        for name in b2_buckets:
            b2.create_bucket(name)
        for name in gcs_buckets:
            gcs.create_bucket(name)
        env = {
            "RCLONE_CONFIG": "/dev/null",  # only the remotes below, never the user's config
            **b2.rclone_env("b2"),
            **gcs.env("gcs"),
            "B2_APPLICATION_KEY_ID": b2.key_id,
            "B2_APPLICATION_KEY": b2.key,
            "B2_ENDPOINT": b2.endpoint,
        }
        _write_env(env_file, env)
        print(f"doubles ready: B2 {b2.endpoint}, GCS {gcs.url}; env in {env_file}", flush=True)
        try:
            stop.wait()
        finally:
            env_file.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the B2 and GCS doubles until killed")
    s.add_argument("--env-file", required=True, type=Path, help="where to write the variables")
    s.add_argument("--b2-bucket", action="append", default=[], help="B2 bucket to create")
    s.add_argument("--gcs-bucket", action="append", default=[], help="GCS bucket to create")
    u = sub.add_parser("upload-b2", help="upload a local folder into a B2 bucket (b2sdk)")
    u.add_argument("folder", type=Path)
    u.add_argument("url", help="b2://bucket/prefix or b2:bucket/prefix")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args.env_file, args.b2_bucket or ["aireadi"], args.gcs_bucket or ["octstage"])
    from tests.doubles.b2_upload import upload_folder

    count = upload_folder(args.folder, args.url)
    print(f"uploaded {count} files to {args.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
