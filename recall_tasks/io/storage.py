"""One place that turns a URI plus storage options into filesystems for s3fs/fsspec, pyarrow and deltalake.

Options come from the standard ``AWS_*`` environment variables and from ``--storage-option key=value``
pairs (explicit pairs win; an explicit empty value clears the environment's). Both deltalake /
object_store keys (``aws_access_key_id``, ``aws_endpoint_url``, ``aws_allow_http``...) and s3fs keys
(``key``, ``secret``, ``token``, ``client_kwargs``, ``config_kwargs``) are understood; any other key is
kept in :attr:`StorageConfig.extra` and passed through to deltalake and to non-S3 fsspec filesystems.

Concurrent Delta writers on S3: deltalake >= 1.0 commits ``_delta_log/N.json`` with a conditional PUT
(``If-None-Match: *``); a writer that loses the race gets ``412 Precondition Failed`` and retries at the
next version. AWS S3 and SeaweedFS (tested: 4.48) enforce it, so no lock and no
``AWS_S3_ALLOW_UNSAFE_RENAME`` are needed (that flag only affects the old rename-based commit, which
1.x no longer uses). :func:`delta_storage_options` pins ``AWS_CONDITIONAL_PUT=etag`` so a change of
library default cannot silently turn it off; ``AWS_CONDITIONAL_PUT=disabled`` makes every commit fail.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from recall_tasks.errors import ConfigError, DatasetError, RecallBenchError, StorageError, one_line
from recall_tasks.secrets import looks_secret, redact, register_secret
from recall_tasks.settings import Settings, settings

DEFAULT_REGION = "us-east-1"
S3_PROTOCOLS = frozenset({"s3", "s3a"})
_URI_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_CHECK_CREDENTIALS = "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or --storage-option"

_ALIASES: dict[str, str] = {  # lower-case option name -> StorageConfig field
    alias: field
    for field, aliases in {
        "access_key_id": "aws_access_key_id access_key_id key",
        "secret_access_key": "aws_secret_access_key secret_access_key secret",
        "session_token": "aws_session_token session_token token aws_token",
        "endpoint_url": "aws_endpoint_url aws_endpoint_url_s3 aws_endpoint endpoint_url endpoint",
        "region": "aws_region aws_default_region region region_name",
        "allow_http": "aws_allow_http allow_http",
        "connect_timeout": "connect_timeout",
        "read_timeout": "read_timeout timeout",
        "max_attempts": "max_attempts",
    }.items()
    for alias in aliases.split()
}
#: field -> the :class:`~recall_tasks.settings.Settings` field it defaults to (``AWS_*``, see settings.py)
_ENV: dict[str, str] = {
    "access_key_id": "aws_access_key_id",
    "secret_access_key": "aws_secret_access_key",
    "session_token": "aws_session_token",
    "endpoint_url": "aws_endpoint_url",
    "region": "aws_region",
    "allow_http": "aws_allow_http",
}


def _plain(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


class StorageConfig(BaseModel):
    """Resolved storage settings. Secret values are :class:`SecretStr`: repr, str and dumps hide them.

    ``connect_timeout``/``read_timeout`` (seconds) and ``max_attempts`` (1 = no retry) default to the
    client libraries' own values when unset.
    """

    model_config = ConfigDict(frozen=True)

    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    endpoint_url: str | None = None
    region: str | None = None
    allow_http: bool | None = None
    connect_timeout: float | None = Field(default=None, gt=0)
    read_timeout: float | None = Field(default=None, gt=0)
    max_attempts: int | None = Field(default=None, ge=1)
    extra: dict[str, SecretStr] = Field(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        for value in (self.access_key_id, self.secret_access_key, self.session_token):
            register_secret(_plain(value))
        for key, value in self.extra.items():
            if looks_secret(key):
                register_secret(value.get_secret_value())

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None
    ) -> StorageConfig:
        """Merge the ``AWS_*`` settings with explicit ``options``; explicit options win.

        ``env``: read these variables instead of the process environment's (tests).
        """
        environment = settings() if env is None else Settings.from_environ(env)
        values: dict[str, Any] = {}
        for field, setting in _ENV.items():
            found = getattr(environment, setting)
            if found is not None:
                values[field] = found.get_secret_value() if isinstance(found, SecretStr) else found
        extra: dict[str, str] = {}
        for raw_key, raw_value in (options or {}).items():
            for key, value in _flatten(raw_key, raw_value):
                target = _ALIASES.get(key.lower())
                if target is None:
                    extra[key] = str(value)
                else:
                    values[target] = None if value in ("", None) else value
        try:
            return cls.model_validate({**values, "extra": extra})
        except ValidationError as exc:  # never echo input values: they may be secrets
            bad = ", ".join(f"{'.'.join(map(str, e['loc']))} ({e['msg']})" for e in exc.errors())
            raise ConfigError(f"invalid storage option: {bad}") from None

    def secrets(self) -> list[str]:
        """The plain secret values, for :func:`recall_tasks.secrets.redact`'s ``extra``."""
        found = [_plain(v) for v in (self.access_key_id, self.secret_access_key, self.session_token)]
        found += [v.get_secret_value() for k, v in self.extra.items() if looks_secret(k)]
        return [v for v in found if v]

    def plain_extra(self) -> dict[str, str]:
        """The pass-through options, with their real values."""
        return {k: v.get_secret_value() for k, v in self.extra.items()}

    def s3fs_options(self) -> dict[str, Any]:
        """Keyword arguments for :class:`s3fs.S3FileSystem`."""
        kwargs: dict[str, Any] = {
            "key": _plain(self.access_key_id),
            "secret": _plain(self.secret_access_key),
            "token": _plain(self.session_token),
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": self.region or DEFAULT_REGION},
            "use_listings_cache": False,
            "skip_instance_cache": True,
        }
        config_kwargs: dict[str, Any] = {}
        if self.connect_timeout is not None:
            config_kwargs["connect_timeout"] = self.connect_timeout
        if self.read_timeout is not None:
            config_kwargs["read_timeout"] = self.read_timeout
        if self.max_attempts is not None:
            config_kwargs["retries"] = {"max_attempts": self.max_attempts}
        if config_kwargs:
            kwargs["config_kwargs"] = config_kwargs
        return kwargs


def _flatten(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """Yield ``(key, value)``, unpacking s3fs ``client_kwargs``/``config_kwargs`` (dicts or JSON)."""
    if key.lower() not in ("client_kwargs", "config_kwargs"):
        yield key, value
        return
    try:
        nested = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        nested = None
    if not isinstance(nested, Mapping):
        raise ConfigError(f"storage option {key!r} must be a JSON object (a dict)")
    for k, v in nested.items():
        if k == "retries" and isinstance(v, Mapping):
            yield "max_attempts", v.get("max_attempts")
        else:
            yield str(k), v


def parse_storage_options(pairs: list[str]) -> dict[str, str]:
    """Parse ``--storage-option key=value`` pairs (value may contain ``=``; the last duplicate wins)."""
    out: dict[str, str] = {}
    for i, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            out[key.strip()] = value
            continue
        shown = f"<{len(pair)} chars hidden>"  # a malformed pair may be a pasted secret: never echo it
        why = "the key is empty" if sep else "there is no '='"
        raise ConfigError(f"invalid --storage-option #{i} {shown}: expected key=value ({why})")
    return out


def split_uri(uri: str) -> tuple[str, str]:
    """``(protocol, path without protocol)``; local paths and ``file://`` give ``("file", absolute path)``."""
    m = _URI_RE.match(uri)
    if m is None:
        return "file", os.path.abspath(os.path.expanduser(uri))
    protocol, rest = m.group(1).lower(), m.group(2)
    return (protocol, os.path.abspath(rest)) if protocol == "file" else (protocol, rest)


def is_local(store: str | fsspec.AbstractFileSystem) -> bool:
    """Whether ``store`` is this machine's disk (or one mounted on it): a plain path or a ``file://`` URI, or a
    local fsspec filesystem, where files can be renamed, locked and opened by path."""
    if isinstance(store, str):
        return split_uri(store)[0] == "file"
    return isinstance(store, LocalFileSystem)


def filesystem(uri: str, config: StorageConfig | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem serving ``uri`` and the path to give it (pyarrow accepts both as-is)."""
    config = config or StorageConfig.from_options()
    protocol, path = split_uri(uri)
    if protocol == "file":
        return LocalFileSystem(), path
    if protocol in S3_PROTOCOLS:
        import s3fs

        return s3fs.S3FileSystem(**config.s3fs_options()), path
    fs = fsspec.filesystem(protocol, **config.plain_extra())
    return fs, fs._strip_protocol(uri)


def delta_storage_options(uri: str, config: StorageConfig | None = None) -> dict[str, str] | None:
    """``storage_options`` for deltalake: ``None`` for local paths (see the module doc for S3 commits)."""
    if is_local(uri):
        return None
    config = config or StorageConfig.from_options()
    if split_uri(uri)[0] not in S3_PROTOCOLS:
        return config.plain_extra() or None
    plain = {
        "AWS_ACCESS_KEY_ID": _plain(config.access_key_id),
        "AWS_SECRET_ACCESS_KEY": _plain(config.secret_access_key),
        "AWS_SESSION_TOKEN": _plain(config.session_token),
        "AWS_ENDPOINT_URL": config.endpoint_url,
        "AWS_REGION": config.region or DEFAULT_REGION,
        "AWS_CONDITIONAL_PUT": "etag",
    }
    opts = {k: v for k, v in plain.items() if v}
    if config.allow_http or (config.allow_http is None and (config.endpoint_url or "").startswith("http://")):
        opts["AWS_ALLOW_HTTP"] = "true"
    if config.connect_timeout is not None:
        opts["connect_timeout"] = f"{round(config.connect_timeout * 1000)}ms"
    if config.read_timeout is not None:
        opts["timeout"] = f"{round(config.read_timeout * 1000)}ms"
    if config.max_attempts is not None:
        opts["max_retries"] = str(config.max_attempts - 1)
    return {**opts, **config.plain_extra()}


def join_uri(base: str, *parts: str) -> str:
    """Join path parts onto ``base`` keeping its protocol (``s3://b/x`` + ``r`` -> ``s3://b/x/r``)."""
    clean = [p.strip("/") for p in parts if p.strip("/")]
    if _URI_RE.match(base) is None:
        return os.path.abspath(os.path.join(os.path.expanduser(base), *clean))
    return "/".join([base.rstrip("/"), *clean])


_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "adl": "az"}


def normalize_uri(uri: str) -> str:
    """One spelling per location: scheme aliases folded (``s3a`` -> ``s3``), no doubled or trailing slashes,
    local paths absolute (``file://`` dropped, ``~`` expanded). Used to compare locations and as identity.
    """
    uri = uri.strip()
    match = _URI_RE.match(uri)
    if match is None or uri.lower().startswith("file://"):
        local = uri[len("file://") :] if uri.lower().startswith("file://") else uri
        return os.path.abspath(os.path.expanduser(local)) if local else local
    scheme, rest = uri.split("://", 1)
    scheme = _SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
    rest = re.sub("/{2,}", "/", rest).rstrip("/")
    return f"{scheme}://{rest}"


def location_of(uri: str) -> str:
    """The folder a glob reads from (the part before its first wildcard's folder), else the URI itself."""
    norm = normalize_uri(uri)
    cut = min((i for i, c in enumerate(norm) if c in "*?["), default=None)
    return norm if cut is None else norm[:cut].rsplit("/", 1)[0]


def overlap(a: str, b: str) -> str | None:
    """How location ``a`` relates to ``b``: "equal", "inside" (a within b), "contains", or None."""
    if a == b:
        return "equal"
    if a.startswith(b.rstrip("/") + "/"):
        return "inside"
    if b.startswith(a.rstrip("/") + "/"):
        return "contains"
    return None


_UNREACHABLE_TYPES = frozenset("ConnectionError ConnectTimeoutError ClientConnectorError gaierror".split())
_UNREACHABLE_RE = re.compile(
    "Could not connect to the endpoint|Connection refused|tcp connect error|dns error|NETWORK_CONNECTION"
    "|Name or service not known|Connect timeout|error sending request"
)
_ACCESS_RE = re.compile(
    "AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|403 Forbidden|ACCESS_DENIED"
    "|lacked the necessary privileges"
)
_STORAGE_MODULES = frozenset("botocore aiobotocore aiohttp s3fs fsspec deltalake _internal pyarrow".split())


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    return chain


def translate_storage_error(
    exc: BaseException, uri: str, *, config: StorageConfig | None = None, fs: Any = None
) -> StorageError:
    """Map a botocore/s3fs/fsspec/deltalake/OS error into a :class:`StorageError` with a clear, redacted
    message. Given the filesystem ``fs``, a missing S3 object is checked for a missing bucket."""
    chain = _chain(exc)
    text = " | ".join(_ANSI_RE.sub("", f"{type(e).__name__}: {e}") for e in chain)
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    detail = re.sub(r"\s*↳\s*|\s+", " ", _ANSI_RE.sub("", str(exc) or type(exc).__name__)).strip()
    detail = re.sub(r"<\?xml.*", "", detail)[:300]
    protocol, path = split_uri(uri)
    bucket = f"{protocol}://{path.split('/')[0]}"
    if names & _UNREACHABLE_TYPES or _UNREACHABLE_RE.search(text):
        found = re.search(r"https?://[^/\s\"']+", text)
        endpoint = found.group(0) if found else "(default AWS endpoint)"
        if config is not None and config.endpoint_url:
            endpoint = config.endpoint_url
        msg = f"cannot reach endpoint {endpoint}: {detail}"
    elif "PermissionError" in names or _ACCESS_RE.search(text):
        hint = {"file": "check file permissions"}.get(protocol, "check credentials or --storage-option")
        msg = f"access denied ({_CHECK_CREDENTIALS if protocol in S3_PROTOCOLS else hint}): {uri}: {detail}"
    elif "NoSuchBucket" in text or ("FileNotFoundError" in names and _bucket_missing(fs, protocol, path)):
        msg = f"bucket does not exist: {bucket} (while accessing {uri})"
    elif "FileNotFoundError" in names:
        msg = f"object not found: {uri}"
    elif names & {"TableNotFoundError", "NoSuchKey"} or "404 Not Found" in text:
        msg = f"object not found: {uri} ({detail})"
    else:
        msg = f"storage error on {uri}: {type(exc).__name__}: {detail}"
    return StorageError(redact(msg, config.secrets() if config else ()))


def read_error(
    exc: BaseException, uri: str, message: str, *, fs: Any = None, column: str | None = None, hint: str = ""
) -> RecallBenchError:
    """The error to raise when a read of ``uri`` failed with ``exc``: a missing or forbidden object is the
    storage's fault (:class:`StorageError`), anything else the file's (:class:`DatasetError`: ``message``, the
    cause on one line, then ``hint``)."""
    if isinstance(exc, FileNotFoundError | PermissionError):
        return translate_storage_error(exc, uri, fs=fs)
    return DatasetError(f"{message}: {one_line(exc)}{hint}", uri=uri, column=column)


def _bucket_missing(fs: Any, protocol: str, path: str) -> bool:
    if fs is None or protocol not in S3_PROTOCOLS:
        return False
    try:
        return not fs.exists(path.split("/")[0])
    except Exception:  # noqa: BLE001 - the check is best effort: keep the original "object not found"
        return False


@contextmanager
def storage_errors(uri: str, config: StorageConfig | None = None, fs: Any = None) -> Iterator[None]:
    """Re-raise storage-library and OS errors raised inside the block as :class:`StorageError`."""
    try:
        yield
    except RecallBenchError:
        raise
    except Exception as exc:
        if not isinstance(exc, OSError) and type(exc).__module__.split(".")[0] not in _STORAGE_MODULES:
            raise
        raise translate_storage_error(exc, uri, config=config, fs=fs) from exc
