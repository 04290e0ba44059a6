"""Run the cloud doubles for the demo: ``python -m tests.doubles serve|upload-b2 ...``.

``serve --env-file FILE`` starts the B2 double and fake-gcs-server on free loopback ports,
creates the requested buckets, writes the variables every command needs to FILE (``export``
lines: source it with ``. FILE``) and runs until killed (SIGTERM/SIGINT), then removes FILE.

``upload-b2 FOLDER b2://bucket/prefix`` uploads a local folder into the B2 double with b2sdk
(run it with FILE sourced). With ``--s3-bucket`` ``serve`` also starts the S3 double (moto) and
writes the AWS variables; ``upload-s3 FOLDER s3://bucket/prefix`` uploads into it with boto3.
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


def serve(
    env_file: Path,
    b2_buckets: list[str],
    gcs_buckets: list[str],
    s3_buckets: list[str] | None = None,
) -> int:
    from tests.doubles.b2_server import B2Double
    from tests.doubles.gcs import GcsDouble
    from tests.doubles.s3 import S3Double

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    s3 = S3Double().start() if s3_buckets else None
    with B2Double() as b2, GcsDouble() as gcs:
        for name in s3_buckets or ():
            assert s3 is not None
            s3.create_bucket(name)
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
            **(s3.env() if s3 else {}),
        }
        _write_env(env_file, env)
        print(f"doubles ready: B2 {b2.endpoint}, GCS {gcs.url}; env in {env_file}", flush=True)
        try:
            stop.wait()
        finally:
            env_file.unlink(missing_ok=True)
            if s3:
                s3.stop()
    return 0


def upload_s3(folder: Path, url: str) -> int:
    """Every file under ``folder`` to ``s3://bucket/prefix`` (AWS_* from the env file)."""
    import boto3

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    for path in files:
        key = f"{prefix.strip('/')}/{path.relative_to(folder).as_posix()}".lstrip("/")
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return len(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the B2 and GCS doubles until killed")
    s.add_argument("--env-file", required=True, type=Path, help="where to write the variables")
    s.add_argument("--b2-bucket", action="append", default=[], help="B2 bucket to create")
    s.add_argument("--gcs-bucket", action="append", default=[], help="GCS bucket to create")
    s.add_argument("--s3-bucket", action="append", default=[], help="S3 bucket (starts moto)")
    u = sub.add_parser("upload-b2", help="upload a local folder into a B2 bucket (b2sdk)")
    u.add_argument("folder", type=Path)
    u.add_argument("url", help="b2://bucket/prefix or b2:bucket/prefix")
    u3 = sub.add_parser("upload-s3", help="upload a local folder into an S3 bucket (boto3)")
    u3.add_argument("folder", type=Path)
    u3.add_argument("url", help="s3://bucket/prefix")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(
            args.env_file,
            args.b2_bucket or ["aireadi"],
            args.gcs_bucket or ["octstage"],
            args.s3_bucket,
        )
    if args.command == "upload-s3":
        print(f"uploaded {upload_s3(args.folder, args.url)} files to {args.url}")
        return 0
    from tests.doubles.b2_upload import upload_folder

    count = upload_folder(args.folder, args.url)
    print(f"uploaded {count} files to {args.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
