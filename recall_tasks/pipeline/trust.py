"""What a person who may create flow runs, but not run code on the worker, can make a worker do (docs/security.md).

A deployment's flow run takes its parameters from whoever starts it: the Prefect UI's "custom run", ``prefect
deployment run --param``, an event payload rendered into a trigger's parameters. The worker holds the provider key
and the storage credentials, so such a parameter is data: it may choose the dataset, the output and the options
that change results, but it never names code to run, an endpoint that receives credentials, or storage the worker
was not set up to use, unless the worker's own environment allows it:

- ``RECALL_BENCH_ALLOW_CALLABLES``: ``module:function`` names a flow run may give as ``retriever`` or
  ``context_extractor`` (``module:*`` for every function of a module). Default: none.
- ``RECALL_BENCH_ALLOW_ENDPOINTS``: URL prefixes a flow run may give as ``base_url``, a storage ``endpoint_url``
  or ``dask_address``. The worker's own ``OPENAI_BASE_URL`` and ``AWS_ENDPOINT_URL`` are always allowed (they
  are its configuration, and what an unset parameter means anyway). Default: none more.
- ``RECALL_BENCH_ALLOW_STORAGE``: the storage prefixes every location parameter (dataset, output, row cache,
  retrieval results, canary, qrels) must be under. Default: any bucket of ``s3``/``s3a``/``gs``/``gcs``/``az``/
  ``abfs``/``abfss``, and local paths under the worker's working folder (the checkout the deployments' pull step
  enters). Never by default: ``http(s)``, ``memory`` and other fsspec protocols, local paths elsewhere.
- ``storage_options`` in a flow run: region and timeouts; an ``endpoint_url`` only when allowed as above; other
  pass-through options (they reach the filesystem library as keyword arguments) only from the worker's
  environment.

Runs started from the command line or from Python (``recall-bench run``, ``evaluate()``) are the worker's own
user and keep every option: :func:`check_flow_run` is called for flow runs of a deployment only. Every refusal
is a :class:`~recall_tasks.errors.ConfigError` raised before the dataset is read or anything is written, naming
the parameter and the variable that would allow it; a refused endpoint is named by its host only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.io.storage import split_uri
from recall_tasks.settings import settings

#: Object storage schemes a flow run may name when ``RECALL_BENCH_ALLOW_STORAGE`` is unset (any bucket).
OBJECT_STORAGE = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")

#: Location parameters, checked against the allowed storage.
LOCATION_FIELDS = ("dataset_uri", "output_uri", "cache_uri", "retrieval_uri", "canary", "qrels_uri")

#: ``storage_options`` a flow run may set without the worker's leave (they change no destination).
SAFE_STORAGE_OPTIONS = frozenset(
    {"region", "aws_region", "aws_default_region", "region_name", "connect_timeout", "read_timeout", "timeout",
     "max_attempts"}
)  # fmt: skip
ENDPOINT_OPTIONS = frozenset({"aws_endpoint_url", "aws_endpoint_url_s3", "aws_endpoint", "endpoint_url", "endpoint"})

SECURITY_DOC = "docs/security.md"


@dataclass(frozen=True)
class WorkerPolicy:
    """What the worker allows a flow run to name (the module docstring); :meth:`from_environment` reads it."""

    callables: frozenset[str]
    endpoints: tuple[str, ...]
    storage: tuple[str, ...]

    @classmethod
    def from_environment(cls, cwd: str | None = None) -> WorkerPolicy:
        env = settings()
        endpoints = [_normal_url(u) for u in _items(env.allow_endpoints)]
        endpoints += [_normal_url(u) for u in (env.openai_base_url, env.aws_endpoint_url) if u]
        storage = _items(env.allow_storage) or [f"{s}://" for s in OBJECT_STORAGE] + [cwd or os.getcwd()]
        return cls(frozenset(_items(env.allow_callables)), tuple(endpoints), tuple(storage))

    def allows_callable(self, spec: str) -> bool:
        module, _, _ = spec.partition(":")
        return spec in self.callables or f"{module}:*" in self.callables

    def allows_endpoint(self, url: str) -> bool:
        normal = _normal_url(url)
        return any(_under(normal, prefix) for prefix in self.endpoints)

    def allows_storage(self, uri: str) -> bool:
        protocol, path = split_uri(uri)
        for prefix in self.storage:
            allowed_protocol, allowed = split_uri(prefix)
            if allowed_protocol != protocol:
                continue
            if protocol == "file":
                if _within(os.path.realpath(path), os.path.realpath(allowed)):
                    return True
            elif not allowed or _under(path.lstrip("/"), allowed.lstrip("/")):
                return True
        return False


def _items(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _normal_url(url: str) -> str:
    parts = urlsplit(url.strip())
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path}".rstrip("/")


def _under(value: str, prefix: str) -> bool:
    """``value`` is ``prefix`` or below it at a ``/`` boundary (``s3://a/b`` does not admit ``s3://a/bc``)."""
    prefix = prefix.rstrip("/")
    return value.rstrip("/") == prefix or value.startswith(prefix + "/")


def _within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # another drive
        return False


def _host(url: str) -> str:
    return urlsplit(url.strip()).hostname or "the given host"


def check_flow_run(params: RunParams, policy: WorkerPolicy | None = None) -> None:
    """Refuse a deployment flow run's parameters that reach past what the worker allows (module docstring)."""
    policy = policy or WorkerPolicy.from_environment()
    for name in ("retriever", "context_extractor"):
        spec = getattr(params, name)
        if spec and not policy.allows_callable(spec):
            raise ConfigError(
                f"flow-run parameter {name} names code to run on the worker ({spec}): refused for deployment runs "
                f"unless the worker lists it in RECALL_BENCH_ALLOW_CALLABLES ({SECURITY_DOC})"
            )
    for name, url in (("base_url", params.base_url), ("dask_address", params.dask_address)):
        if url and not policy.allows_endpoint(url):
            raise ConfigError(
                f"flow-run parameter {name} names an endpoint the worker does not allow ({_host(url)}): the worker "
                f"sends its credentials or work there; allow it with RECALL_BENCH_ALLOW_ENDPOINTS ({SECURITY_DOC})"
            )
    check_storage_options(params.storage_options, policy)
    for name in LOCATION_FIELDS:
        uri = getattr(params, name, None)
        if uri:
            check_location(name, uri, policy)


def check_location(name: str, uri: str, policy: WorkerPolicy) -> None:
    if not policy.allows_storage(uri):
        protocol, _ = split_uri(uri)
        where = "a local path outside the allowed folders" if protocol == "file" else f"{protocol}:// storage"
        raise ConfigError(
            f"flow-run parameter {name} names {where}, which the worker does not allow for deployment runs "
            f"(allowed: {', '.join(policy.storage)}); allow it with RECALL_BENCH_ALLOW_STORAGE ({SECURITY_DOC})"
        )


def check_storage_options(options: Mapping[str, str], policy: WorkerPolicy) -> None:
    for key, value in options.items():
        lowered = key.lower()
        if lowered in ENDPOINT_OPTIONS:
            if value and not policy.allows_endpoint(str(value)):
                raise ConfigError(
                    f"flow-run storage option {key} names an endpoint the worker does not allow "
                    f"({_host(str(value))}): the storage credentials would be used there; allow it with "
                    f"RECALL_BENCH_ALLOW_ENDPOINTS ({SECURITY_DOC})"
                )
        elif lowered not in SAFE_STORAGE_OPTIONS:
            raise ConfigError(
                f"flow-run storage option {key} is refused for deployment runs: only region, timeouts and an allowed "
                f"endpoint_url may come from a flow run; set the others in the worker's environment ({SECURITY_DOC})"
            )
