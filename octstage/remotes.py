"""Where data lives and how to reach it: rclone-style locations, remote settings, scrubbing.

A location is what the user types: ``b2:bucket/prefix`` or ``gcs:bucket/prefix`` (any rclone
remote), ``b2://bucket/prefix`` / ``gs://bucket/prefix``, or a local folder. The same remote
settings feed three clients: the rclone daemon (which reads them itself), b2sdk and
google-cloud-storage (which need them handed over). rclone remotes may be defined only by
environment variables (``RCLONE_CONFIG_<NAME>_<KEY>``), which ``rclone config dump`` does not
show, so those are read here first; the rclone config file is asked for only when the
environment does not define the remote.

``gs://`` and ``b2://`` use the rclone remote named by ``OCTSTAGE_GCS_REMOTE`` /
``OCTSTAGE_B2_REMOTE`` (default ``gcs`` / ``b2``) when it exists; otherwise Google's application
default credentials (or ``STORAGE_EMULATOR_HOST``) and ``B2_APPLICATION_KEY_ID`` /
``B2_APPLICATION_KEY`` (+ optional ``B2_ENDPOINT``).

Secrets never leave this module except to the clients: ``RemoteConfig`` hides option values in
its repr, locations with inline options (``:b2,key=...:``) are refused, and ``scrub`` removes
every known secret from any text (rclone output, exception messages) before it is shown.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from octstage.errors import MirrorError

Kind = Literal["local", "gcs", "b2"]
GCS_TYPES = ("google cloud storage", "gcs")
# Option names whose values are credentials in rclone's backends (and in our env fallbacks).
SENSITIVE = (
    "account",
    "key",
    "token",
    "client_id",
    "client_secret",
    "service_account_credentials",
    "password",
    "pass",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "sas_url",
)
_REMOTE_RE = re.compile(r"^([A-Za-z0-9_][\w.\- +@]*):(.*)$")
_ENV_SECRET_NAMES = ("B2_APPLICATION_KEY_ID", "B2_APPLICATION_KEY")


@dataclass(frozen=True)
class RemoteConfig:
    """One rclone remote's settings (lower-case option names). Values never appear in repr."""

    name: str
    type: str
    options: Mapping[str, str] = field(repr=False)

    def get(self, key: str, default: str = "") -> str:
        return self.options.get(key, default)

    def flag(self, key: str) -> bool:
        return self.get(key).strip().lower() in ("true", "1", "yes")

    def secrets(self) -> list[str]:
        return [v for k, v in self.options.items() if k in SENSITIVE and v]


@dataclass(frozen=True)
class Location:
    """A parsed location. ``rclone_fs`` is what rclone gets; ``url`` is safe to display."""

    spec: str
    kind: Kind
    rclone_fs: str
    bucket: str
    prefix: str  # for local locations: the absolute folder
    remote: RemoteConfig | None = None

    @property
    def url(self) -> str:
        if self.kind == "local":
            return self.prefix
        scheme = "gs" if self.kind == "gcs" else "b2"
        return f"{scheme}://{self.bucket}/{self.prefix}".rstrip("/")


def env_remote(name: str, env: Mapping[str, str]) -> RemoteConfig | None:
    """The remote ``name`` as defined by ``RCLONE_CONFIG_<NAME>_*`` variables, if it is."""
    head = f"RCLONE_CONFIG_{name.upper()}_"
    options = {k[len(head) :].lower(): v for k, v in env.items() if k.startswith(head)}
    rtype = options.pop("type", "")
    return RemoteConfig(name, rtype, options) if rtype else None


def _dump_config(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Remotes from the rclone config file (``rclone config dump``); {} when none or no rclone."""
    from octstage.rclone import rclone_binary

    try:
        binary = rclone_binary()
    except MirrorError:
        return {}
    try:
        out = subprocess.run(
            # Never prompt (an encrypted config without RCLONE_CONFIG_PASS just yields nothing).
            [binary, "config", "dump", "--ask-password=false"],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0:
        return {}
    try:
        data = json.loads(out.stdout or "{}")
    except json.JSONDecodeError:
        return {}
    return {str(k): {str(a): str(b) for a, b in v.items()} for k, v in data.items()}


def find_remote(name: str, env: Mapping[str, str] | None = None) -> RemoteConfig | None:
    """The remote called ``name``: from the environment first, else from rclone's config."""
    env = os.environ if env is None else env
    found = env_remote(name, env)
    if found is not None:
        return found
    conf = _dump_config(env).get(name)
    if not conf or not conf.get("type"):
        return None
    options = {k.lower(): v for k, v in conf.items() if k != "type"}
    return RemoteConfig(name, conf["type"], options)


def _split_bucket(rest: str, spec: str) -> tuple[str, str]:
    rest = rest.strip("/")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise MirrorError(f"{spec!r}: no bucket given (expected REMOTE:bucket/prefix)")
    return bucket, prefix.strip("/")


def parse_location(spec: str, env: Mapping[str, str] | None = None) -> Location:
    """Parse a location; MirrorError for an unknown remote or inline credentials."""
    env = os.environ if env is None else env
    if spec.startswith(":"):
        raise MirrorError(
            "on-the-fly remotes (':backend,option=...:') are refused: they put settings, often "
            "secrets, on the command line; define a remote with RCLONE_CONFIG_<NAME>_* instead"
        )
    schemes: tuple[tuple[str, Kind, tuple[str, ...]], ...] = (
        ("gs://", "gcs", GCS_TYPES),
        ("b2://", "b2", ("b2",)),
    )
    for scheme, kind, types in schemes:
        if spec.startswith(scheme):
            bucket, prefix = _split_bucket(spec[len(scheme) :], spec)
            var = f"OCTSTAGE_{kind.upper()}_REMOTE"
            name = env.get(var) or kind
            remote = find_remote(name, env)
            if remote is None and env.get(var):
                raise MirrorError(f"{var}={name!r} names no configured rclone remote")
            if remote is not None and remote.type not in types:
                remote = None  # a same-named remote of another type: not for this scheme
            root = f"{remote.name}:" if remote else f":{kind}:"
            fs = f"{root}{bucket}/{prefix}".rstrip("/")
            return Location(spec, kind, fs, bucket, prefix, remote)
    if spec.startswith("file://"):
        spec = spec[len("file://") :]
    match = _REMOTE_RE.match(spec)
    if match and not spec.startswith(("/", ".")):
        name, rest = match.groups()
        remote = find_remote(name, env)
        if remote is None:
            raise MirrorError(
                f"rclone remote {name!r} is not configured: set RCLONE_CONFIG_{name.upper()}_TYPE "
                "(and its options) or add it with `rclone config`"
            )
        kind = _kind_of(remote)
        if kind == "local":
            folder = str(Path(rest).resolve())
            return Location(spec, "local", folder, "", folder, remote)
        bucket, prefix = _split_bucket(rest, spec)
        fs = f"{name}:{bucket}/{prefix}".rstrip("/")
        return Location(spec, kind, fs, bucket, prefix, remote)
    folder = str(Path(spec).expanduser().resolve())
    return Location(spec, "local", folder, "", folder, None)


def _kind_of(remote: RemoteConfig) -> Kind:
    if remote.type == "b2":
        return "b2"
    if remote.type in GCS_TYPES:
        return "gcs"
    if remote.type == "local":
        return "local"
    raise MirrorError(
        f"remote {remote.name!r} is of type {remote.type!r}; octstage mirrors b2, google cloud "
        "storage and local folders (it needs the SDK of both ends for its checks)"
    )


@dataclass(frozen=True)
class B2Credentials:
    key_id: str = field(repr=False)
    key: str = field(repr=False)
    realm: str  # "production" or the endpoint URL


def b2_credentials(loc: Location | None, env: Mapping[str, str] | None = None) -> B2Credentials:
    """Key pair and realm for b2sdk, from the location's remote or the B2_* variables."""
    env = os.environ if env is None else env
    remote = loc.remote if loc is not None else None
    if remote is None:
        remote = find_remote(env.get("OCTSTAGE_B2_REMOTE") or "b2", env)
        if remote is not None and remote.type != "b2":
            remote = None
    if remote is not None:
        key_id, key, endpoint = remote.get("account"), remote.get("key"), remote.get("endpoint")
    else:
        key_id = env.get("B2_APPLICATION_KEY_ID", "")
        key = env.get("B2_APPLICATION_KEY", "")
        endpoint = env.get("B2_ENDPOINT", "")
    if not key_id or not key:
        raise MirrorError(
            "no B2 credentials: define an rclone b2 remote (RCLONE_CONFIG_B2_ACCOUNT/KEY) or set "
            "B2_APPLICATION_KEY_ID and B2_APPLICATION_KEY"
        )
    return B2Credentials(key_id, key, endpoint.rstrip("/") or "production")


def rclone_env(
    locations: Iterable[Location], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for the rclone daemon: ours, plus settings for ``:b2:``/``:gcs:`` roots.

    Credentials go to rclone through its environment (never its command line).
    """
    env = dict(os.environ if env is None else env)
    for loc in locations:
        if loc.remote is not None or loc.kind == "local":
            continue
        if loc.kind == "b2":
            creds = b2_credentials(None, env)
            env["RCLONE_B2_ACCOUNT"] = creds.key_id
            env["RCLONE_B2_KEY"] = creds.key
            if creds.realm != "production":
                env["RCLONE_B2_ENDPOINT"] = creds.realm
        else:
            env.setdefault("RCLONE_GCS_ENV_AUTH", "true")
    return env


def known_secrets(locations: Iterable[Location], env: Mapping[str, str] | None = None) -> list[str]:
    """Every credential string that could reach an output: remote options and B2_* keys."""
    env = os.environ if env is None else env
    found = [env.get(name, "") for name in _ENV_SECRET_NAMES]
    for loc in locations:
        if loc.remote is not None:
            found.extend(loc.remote.secrets())
    for key, value in env.items():
        if key.startswith("RCLONE_") and any(key.endswith(f"_{s.upper()}") for s in SENSITIVE):
            found.append(value)
    return sorted({s for s in found if len(s) >= 4}, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``***`` (longest first, so none leaks partly)."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text
