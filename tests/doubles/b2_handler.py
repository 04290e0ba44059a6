"""The B2 double's HTTP request handler: routing, the B2 API calls, uploads and ranged downloads.

Each request is translated into a call on b2sdk's simulator (or on ``B2State``), with the
double's faults, counters and corruptions applied; ``b2_server.py`` serves it on loopback.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import time
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, unquote_plus, urlsplit

from b2sdk._internal.exception import (
    B2Error,
    FileNotPresent,
    InvalidAuthToken,
    NonExistentBucket,
    Unauthorized,
    UnsatisfiableRange,
)
from b2sdk._internal.raw_api import ALL_CAPABILITIES
from b2sdk._internal.raw_simulator import FileSimulator, RawSimulator
from b2sdk.v2 import SSE_NONE

from tests.doubles.b2_state import API_URL, MiB

if TYPE_CHECKING:
    from tests.doubles.b2_server import B2Double


def _add_v1_size(result: Any) -> None:
    """B2 API v1 (which rclone uses after authorizing) names the length ``size``."""
    if isinstance(result, dict):
        for entry in [result, *(result.get("files") or [])]:
            if isinstance(entry, dict) and "contentLength" in entry:
                entry["size"] = entry["contentLength"]


def _error(status: int) -> tuple[str, str]:
    codes = {
        400: "bad_request",
        401: "unauthorized",
        404: "not_found",
        416: "range_not_satisfiable",
        429: "too_many_requests",
        500: "internal_error",
        503: "service_unavailable",
    }
    return codes.get(status, "error"), f"injected or simulated error {status}"


class _Handler(BaseHTTPRequestHandler):
    double: B2Double
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, keep-alive clients stall 40 ms
    # on every response waiting for a delayed ACK.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr log."""

    # -- plumbing ------------------------------------------------------------------------------
    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, default=sorted).encode()  # bucket options are a set
        self.send_response(status)
        self.send_header("Content-Type", "application/json;charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":  # a body after HEAD would corrupt the keep-alive stream
            self.wfile.write(data)

    def _send_error(self, status: int, code: str | None = None, message: str = "") -> None:
        default_code, default_message = _error(status)
        headers = {"Retry-After": "0"} if status in (429, 503) else {}  # retry at once
        body = {
            "status": status,
            "code": code or default_code,
            "message": message or default_message,
        }
        self._send_json(status, body, headers)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except (InvalidAuthToken, Unauthorized, AssertionError):
            self._send_error(401, "bad_auth_token", "invalid authorization")
        except (FileNotPresent, NonExistentBucket, KeyError) as exc:
            self._send_error(404, "not_found", str(exc))
        except UnsatisfiableRange:
            self._send_error(416)
        except B2Error as exc:
            self._send_error(400, "bad_request", str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (rclone killed mid-transfer): nothing to answer
        except Exception:  # noqa: BLE001 - a bug in the double must answer 500, not hang
            traceback.print_exc()
            self._send_error(500, "internal_error", "double failed; see its stderr")

    def do_GET(self) -> None:
        self._guard(lambda: self._route(head=False))

    def do_HEAD(self) -> None:
        self._guard(lambda: self._route(head=True))

    def do_POST(self) -> None:
        self._guard(self._post)

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        if url.path.endswith("/b2_authorize_account"):
            self._body()
            self._authorize(url.path.split("/")[2])
        elif url.path.startswith("/file/"):
            self._download_by_name(url.path[len("/file/") :], head)
        elif url.path.endswith("/b2_download_file_by_id"):
            self._download_by_id(parse_qs(url.query)["fileId"][0], head)
        else:
            self._send_error(404)

    def _post(self) -> None:
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if parts[0] == "upload":
            self._upload(parts[1])
        elif parts[0] == "upload_part":
            self._upload_part(parts[1])
        elif len(parts) == 3 and parts[0] == "b2api":
            if parts[2] == "b2_authorize_account":
                self._body()
                self._authorize(parts[1])
            else:
                self._api(parts[2])
        else:
            self._send_error(404)

    def _token(self) -> str:
        token = self.headers.get("Authorization", "")
        if token not in self.double.sim.auth_token_to_key:
            raise InvalidAuthToken("invalid token", "bad_auth_token")
        return token

    # -- API -----------------------------------------------------------------------------------
    def _authorize(self, version: str) -> None:
        d = self.double
        d.stats.calls["b2_authorize_account"] += 1
        if self._maybe_fault("b2_authorize_account"):
            return
        auth = self.headers.get("Authorization", "")
        try:
            key_id, key = base64.b64decode(auth.split(" ", 1)[1]).decode().split(":", 1)
        except (IndexError, ValueError):
            self._send_error(401, "bad_auth_token", "missing basic auth")
            return
        with d.lock:
            result = d.sim.authorize_account(API_URL, key_id, key)
            token = str(result["authorizationToken"])
            d.issued_tokens.append(token)
        urls = {
            "apiUrl": d.endpoint,
            "downloadUrl": d.endpoint,
            "s3ApiUrl": d.endpoint,
            "recommendedPartSize": d.recommended_part_size,
            "absoluteMinimumPartSize": d.minimum_part_size,
        }
        allowed = {"capabilities": ALL_CAPABILITIES, "namePrefix": None}
        if version in ("v1", "v2"):
            body = {
                "accountId": d.account_id,
                "authorizationToken": token,
                **urls,
                "minimumPartSize": d.minimum_part_size,
                "allowed": {**allowed, "bucketId": None, "bucketName": None},
            }
        else:
            # v3 flattens the key's restrictions into storageApi; v4 nests them in "allowed".
            if version == "v3":
                storage = {**urls, **allowed, "bucketId": None, "bucketName": None}
            else:
                storage = {**urls, "allowed": {**allowed, "buckets": None}}
            body = {
                "accountId": d.account_id,
                "authorizationToken": token,
                "apiInfo": {"storageApi": storage, "groupsApi": {}},
            }
        self._send_json(200, body)

    def _maybe_fault(self, op: str, name: str | None = None) -> bool:
        fault = self.double.take_fault(op, name)
        if fault is None:
            return False
        self._send_error(fault.status)
        return True

    def _api(self, op: str) -> None:
        d = self.double
        body = self._body()
        d.stats.calls[op] += 1
        if self._maybe_fault(op):
            return
        token = self._token()
        params: dict[str, Any] = json.loads(body or b"{}")
        sim = d.sim
        with d.lock:
            result = self._call(op, params, token, sim)
            if not op.startswith(("b2_list", "b2_get")):
                d._indexes.clear()
        _add_v1_size(result)
        if result is None:
            self._send_error(400, "bad_request", f"unsupported operation {op}")
        else:
            self._send_json(200, result)

    def _call(self, op: str, p: dict[str, Any], token: str, sim: RawSimulator) -> Any:
        d = self.double
        if op == "b2_list_buckets":
            return sim.list_buckets(
                API_URL, token, p["accountId"], p.get("bucketId"), p.get("bucketName")
            )
        if op == "b2_create_bucket":
            result = sim.create_bucket(
                API_URL, token, p["accountId"], p["bucketName"], p["bucketType"]
            )
            sim.bucket_name_to_bucket[p["bucketName"]].default_server_side_encryption = SSE_NONE
            return result
        if op == "b2_list_file_names":
            d._index(d._bucket_name(p["bucketId"]))  # raises for an unknown bucket
            sim._assert_account_auth(
                API_URL, token, d.account_id, "listFiles", bucket_id=p["bucketId"]
            )
            return d.list_file_names(
                p["bucketId"],
                p.get("startFileName"),
                min(int(p.get("maxFileCount") or 100), 10000),
                p.get("prefix") or "",
                p.get("delimiter"),
            )
        if op == "b2_list_file_versions":
            return sim.list_file_versions(
                API_URL,
                token,
                p["bucketId"],
                p.get("startFileName"),
                p.get("startFileId"),
                min(int(p.get("maxFileCount") or 100), 10000),
                p.get("prefix"),
            )
        if op == "b2_get_file_info":
            return sim.get_file_info_by_id(API_URL, token, p["fileId"])
        if op == "b2_get_upload_url":
            result = dict(sim.get_upload_url(API_URL, token, p["bucketId"]))
            return self._local_upload_url(result, "upload")
        if op == "b2_start_large_file":
            return sim.start_large_file(
                API_URL,
                token,
                p["bucketId"],
                p["fileName"],
                p.get("contentType", "b2/x-auto"),
                p.get("fileInfo") or {},
            )
        if op == "b2_get_upload_part_url":
            result = dict(sim.get_upload_part_url(API_URL, token, p["fileId"]))
            return self._local_upload_url(result, "upload_part")
        if op == "b2_finish_large_file":
            return sim.finish_large_file(API_URL, token, p["fileId"], p["partSha1Array"])
        if op == "b2_cancel_large_file":
            return sim.cancel_large_file(API_URL, token, p["fileId"])
        if op == "b2_list_parts":
            return sim.list_parts(
                API_URL, token, p["fileId"], p.get("startPartNumber"), p.get("maxPartCount")
            )
        if op == "b2_list_unfinished_large_files":
            return sim.list_unfinished_large_files(
                API_URL,
                token,
                p["bucketId"],
                p.get("startFileId"),
                p.get("maxFileCount"),
                p.get("namePrefix"),
            )
        if op == "b2_delete_file_version":
            return sim.delete_file_version(API_URL, token, p["fileId"], p["fileName"])
        if op == "b2_hide_file":
            return sim.hide_file(API_URL, token, p["bucketId"], p["fileName"])
        return None

    def _local_upload_url(self, result: dict[str, Any], kind: str) -> dict[str, Any]:
        d = self.double
        key = secrets.token_hex(8)
        d._upload_urls[key] = str(result["uploadUrl"])
        result["uploadUrl"] = f"{d.endpoint}/{kind}/{key}"
        return result

    # -- uploads ---------------------------------------------------------------------------------
    def _file_info(self) -> dict[str, str]:
        prefix = "x-bz-info-"
        return {
            k[len(prefix) :].lower(): unquote_plus(v)
            for k, v in self.headers.items()
            if k.lower().startswith(prefix)
        }

    def _upload(self, key: str) -> None:
        d = self.double
        data = self._body()
        d.stats.calls["b2_upload_file"] += 1
        if self._maybe_fault("upload"):
            return
        with d.lock:
            sim_url = d._upload_urls[key]
            result = d.sim.upload_file(
                sim_url,
                self.headers.get("Authorization", ""),
                unquote_plus(self.headers["X-Bz-File-Name"]),
                len(data),
                self.headers.get("Content-Type", "b2/x-auto"),
                self.headers["X-Bz-Content-Sha1"],
                self._file_info(),
                io.BytesIO(data),
            )
            d._indexes.clear()
        self._send_json(200, result)

    def _upload_part(self, key: str) -> None:
        d = self.double
        data = self._body()
        d.stats.calls["b2_upload_part"] += 1
        if self._maybe_fault("upload"):
            return
        with d.lock:
            result = d.sim.upload_part(
                d._upload_urls[key],
                self.headers.get("Authorization", ""),
                int(self.headers["X-Bz-Part-Number"]),
                len(data),
                self.headers["X-Bz-Content-Sha1"],
                io.BytesIO(data),
            )
        self._send_json(200, result)

    # -- downloads -------------------------------------------------------------------------------
    def _download_by_name(self, raw_path: str, head: bool) -> None:
        bucket, _, raw_name = raw_path.partition("/")
        name = unquote_plus(raw_name)
        d = self.double
        d.stats.calls["download"] += 1
        if self._maybe_fault("download", name):
            return
        self._token_or_query()
        with d.lock:
            sim = d._index(unquote_plus(bucket)).files.get(name)
        if sim is None:
            raise FileNotPresent(file_id_or_name=name)
        self._serve(sim, head)

    def _download_by_id(self, file_id: str, head: bool) -> None:
        d = self.double
        d.stats.calls["download"] += 1
        self._token_or_query()
        with d.lock:
            bucket = d.sim._get_bucket_by_id(d.sim.file_id_to_bucket_id[file_id])
            sim = bucket.file_id_to_file[file_id]
        if self._maybe_fault("download", sim.name):
            return
        self._serve(sim, head)

    def _token_or_query(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        token = self.headers.get("Authorization") or (query.get("Authorization") or [""])[0]
        if token not in self.double.sim.auth_token_to_key:
            raise InvalidAuthToken("invalid token", "bad_auth_token")

    def _serve(self, sim: FileSimulator, head: bool) -> None:
        d = self.double
        data: bytes = sim.data_bytes
        size = len(data)
        start, end = 0, size - 1
        byte_range = _parse_range(self.headers.get("Range"), size)
        if byte_range == "invalid":
            self._send_error(416)
            return
        if isinstance(byte_range, tuple):
            start, end = byte_range
        with d.lock:
            corrupt = not head and d.corrupt[sim.name] > 0
            if corrupt:
                d.corrupt[sim.name] -= 1
                d.stats.corrupted_served += 1
        body = data[start : end + 1] if size else b""
        if corrupt and body:
            mid = len(body) // 2
            body = body[:mid] + bytes([body[mid] ^ 0xFF]) + body[mid + 1 :]
        headers = sim.as_download_headers(range_=(start, end) if byte_range else None)
        headers["content-length"] = str(len(body))
        headers["x-bz-file-name"] = quote(sim.name.encode())
        self.send_response(206 if byte_range else 200)
        for key, value in headers.items():
            if value is not None:
                self.send_header(key, str(value))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if head:
            return
        if d.download_delay:
            time.sleep(d.download_delay)
        for chunk in _chunks(body, 1 * MiB):
            self.wfile.write(chunk)
        with d.lock:
            d.stats.downloaded_bytes += len(body)


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` -> inclusive (start, end); None: whole."""
    if not header or not header.startswith("bytes="):
        return None
    spec = header[len("bytes=") :].split(",")[0].strip()
    first, _, last = spec.partition("-")
    if first == "":
        n = int(last)
        start, end = max(size - n, 0), size - 1
    else:
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        return "invalid" if size else None
    return start, end
