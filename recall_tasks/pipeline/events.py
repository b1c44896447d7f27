"""Announce a freshly built search index to Prefect: the ``search.index.built`` event.

The ``index-built-recall`` deployment (``deployments/prefect.yaml``) has an event trigger on it: the Prefect
server renders the run's parameters from the event and starts a flow run on ``recall-pool``:

- resource ``{"prefect.resource.id": "search.index.<version>", "search.index.version": "<version>"}``
  -> ``index_version = <version>`` and ``label = index-<version>``;
- payload ``dataset_uri`` (required), ``retrieval_uri`` and ``output_uri`` (optional: the deployment's
  default output, ``$RECALL_OUTPUT_URI`` at deploy time, is used without it) and ``judge`` (optional,
  ``openai`` by default); other ``extra`` keys are carried along for people and automations reading the
  event, the flow ignores them.

Events are stored by the Prefect server and shown in its UI: never put credentials in the payload (keys
that look secret are refused).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import TYPE_CHECKING, Annotated, Any

import typer

from recall_tasks.secrets import looks_secret

if TYPE_CHECKING:
    from prefect.events import Event

EVENT_NAME = "search.index.built"
RESOURCE_PREFIX = "search.index."
VERSION_LABEL = "search.index.version"
PAYLOAD_FIELDS = ("dataset_uri", "retrieval_uri", "output_uri")
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:-]{0,127}$")


def index_resource(index_version: str) -> dict[str, str]:
    """The event's resource: ``search.index.<version>`` with the version also as a label."""
    if not _VERSION_RE.match(index_version or ""):
        raise ValueError(
            f"index version {index_version!r}: use 1-128 letters, digits or . _ + : - (starting with a letter or digit)"
        )
    return {"prefect.resource.id": f"{RESOURCE_PREFIX}{index_version}", VERSION_LABEL: index_version}


def index_built_payload(
    dataset_uri: str,
    *,
    retrieval_uri: str | None = None,
    output_uri: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The event's payload; optional fields are left out when not given (the trigger fills in defaults)."""
    if not dataset_uri or not dataset_uri.strip():
        raise ValueError("dataset_uri is required")
    payload: dict[str, Any] = {"dataset_uri": dataset_uri}
    if retrieval_uri:
        payload["retrieval_uri"] = retrieval_uri
    if output_uri:
        payload["output_uri"] = output_uri
    for key, value in (extra or {}).items():
        if key in PAYLOAD_FIELDS:
            raise ValueError(f"extra key {key!r}: pass it as its own argument")
        if looks_secret(key):
            raise ValueError(f"extra key {key!r} looks secret: events are stored in Prefect, never send credentials")
        payload[key] = value
    return payload


def _api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def build_index_built_event(
    index_version: str,
    dataset_uri: str,
    *,
    retrieval_uri: str | None = None,
    output_uri: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Event:
    """The ``search.index.built`` event, not sent."""
    from prefect.events import Event

    return Event(
        event=EVENT_NAME,
        resource=index_resource(index_version),
        payload=index_built_payload(dataset_uri, retrieval_uri=retrieval_uri, output_uri=output_uri, extra=extra),
    )


def emit_index_built(
    index_version: str,
    dataset_uri: str,
    *,
    retrieval_uri: str | None = None,
    output_uri: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Event | None:
    """Emit ``search.index.built`` through Prefect's background events worker (``prefect.events.emit_event``).

    Goes to the API of the current settings (``PREFECT_API_URL``); inside a flow run the event is also
    related to that run. Returns the event, or ``None`` when no API URL is configured (an ephemeral
    server would swallow it: nothing is sent then). Sending is asynchronous: it is flushed when the
    interpreter exits; :func:`send_index_built` sends at once and raises when the server is unreachable.
    """
    from prefect.events import emit_event

    resource = index_resource(index_version)
    payload = index_built_payload(dataset_uri, retrieval_uri=retrieval_uri, output_uri=output_uri, extra=extra)
    if _api_url() is None:
        return None
    return emit_event(event=EVENT_NAME, resource=resource, payload=payload)


def send_index_built(
    index_version: str,
    dataset_uri: str,
    *,
    retrieval_uri: str | None = None,
    output_uri: str | None = None,
    extra: dict[str, Any] | None = None,
    timeout: float = 30.0,
) -> Event:
    """Send ``search.index.built`` now and wait for it (what ``recall-bench emit-index-built`` does).

    Raises ``ValueError`` when ``PREFECT_API_URL`` is not set and the client's error when the server
    cannot be reached.
    """
    import asyncio

    from prefect.events.clients import get_events_client
    from prefect.utilities.asyncutils import run_coro_as_sync

    event = build_index_built_event(
        index_version, dataset_uri, retrieval_uri=retrieval_uri, output_uri=output_uri, extra=extra
    )
    if _api_url() is None:
        raise ValueError("PREFECT_API_URL is not set: point it at your Prefect server's API")

    async def send() -> None:
        async with get_events_client(reconnection_attempts=2) as client:
            await client.emit(event)

    async def bounded() -> None:
        await asyncio.wait_for(send(), timeout)

    run_coro_as_sync(bounded())
    return event


def prefect_event_emit_args(
    index_version: str,
    dataset_uri: str,
    *,
    retrieval_uri: str | None = None,
    output_uri: str | None = None,
    extra: dict[str, Any] | None = None,
) -> list[str]:
    """The same event as a ``prefect event emit`` command line (an argv list starting with ``prefect``)."""
    resource = index_resource(index_version)
    payload = index_built_payload(dataset_uri, retrieval_uri=retrieval_uri, output_uri=output_uri, extra=extra)
    return [
        "prefect",
        "event",
        "emit",
        EVENT_NAME,
        "--resource",
        json.dumps(resource, separators=(", ", ": ")),
        "--payload",
        json.dumps(payload, separators=(", ", ": ")),
    ]


PREFECT_EVENT_EMIT_EXAMPLE = shlex.join(
    prefect_event_emit_args(
        "2026-11-30",
        "s3://my-bucket/evals/golden.parquet",
        retrieval_uri="s3://my-bucket/index/2026-11-30/retrieval.parquet",
        output_uri="s3://my-bucket/recall",
    )
)
"""The equivalent of ``recall-bench emit-index-built`` with Prefect's own CLI (for the README and docs)."""


def _parse_extra(pairs: list[str]) -> dict[str, str]:
    extra: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--extra {pair!r}: expected key=value")
        extra[key.strip()] = value
    return extra


def register(app: typer.Typer) -> None:
    """Add the ``emit-index-built`` command to a Typer app (``recall-bench`` calls this)."""

    @app.command("emit-index-built")
    def emit_index_built_command(
        index_version: Annotated[str, typer.Option("--index-version", help="Version of the new index")],
        dataset: Annotated[str, typer.Option("--dataset", help="Evaluation dataset (Parquet URI) to score")],
        retrieval_uri: Annotated[
            str | None, typer.Option("--retrieval-uri", help="Parquet of row_id + retrieval_context from the index")
        ] = None,
        output: Annotated[
            str | None, typer.Option("--output", help="Where results/ and runs/ live (default: the deployment's)")
        ] = None,
        extra: Annotated[
            list[str] | None,
            typer.Option("--extra", help="key=value added to the payload, e.g. judge=lexical (repeatable)"),
        ] = None,
    ) -> None:
        """Announce a new search index (event search.index.built).

        The index-built-recall deployment then scores the new index.
        """
        try:
            event = send_index_built(
                index_version, dataset, retrieval_uri=retrieval_uri, output_uri=output, extra=_parse_extra(extra or [])
            )
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=2) from None
        except Exception as exc:  # noqa: BLE001 - connection errors of any kind: say so, exit non-zero
            typer.echo(f"error: could not send the event to {_api_url()}: {type(exc).__name__}: {exc}", err=True)
            raise typer.Exit(code=1) from None
        typer.echo(str(event.id))  # stdout: the id alone, for scripts; what to watch goes to stderr
        ready = trigger_readiness()
        for line in what_to_watch(
            index_version, dataset, output, event_id=str(event.id), api_url=_api_url(), ready=ready
        ):
            typer.echo(line, err=True)


#: The deployment whose trigger acts on the event (``deployments/prefect.yaml``), as ``flow/deployment``.
INDEX_DEPLOYMENT = "recall-benchmark/index-built-recall"


def trigger_readiness(deployment: str = INDEX_DEPLOYMENT) -> str | None:
    """What becomes of the event, as the server has it, in a sentence: the deployment missing, no worker of its
    pool online, or how many are; None when the server cannot tell (the event was sent all the same).

    Asked after sending, so a person is told the fact instead of a conditional they read as one: the message said
    "picked up by a worker of recall-pool (none running: it waits as Scheduled)" with a worker running.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import WorkerStatus
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            try:
                pool = client.read_deployment_by_name(deployment).work_pool_name
            except ObjectNotFound:
                return f"this server has no deployment {deployment}: the event starts no run until it is deployed"
            workers = client.read_workers_for_work_pool(pool) if pool else []
    except Exception:  # noqa: BLE001 - a hint only: the event is sent, whatever the server answers here
        return None
    online = sum(1 for w in workers if w.status == WorkerStatus.ONLINE)
    if online:
        return f"{_TRIGGERED}, which the {online} worker(s) of {pool} online pick up within seconds"
    return (
        f"{_TRIGGERED}; no worker of {pool} is online, so it waits as Scheduled until one starts "
        f"(prefect worker start --pool {pool})"
    )


_TRIGGERED = "the index-built-recall deployment's trigger starts a flow run for it"


def what_to_watch(
    index_version: str, dataset: str, output: str | None, *, event_id: str, api_url: str | None, ready: str | None
) -> list[str]:
    """What ``emit-index-built`` tells a person: where the event went, who runs what it triggers (``ready``, from
    :func:`trigger_readiness`) and how to see that run."""
    name = f"recall-{dataset.rstrip('/').split('/')[-1]}-index-{index_version}"  # the flow's flow_run_name
    ui = (api_url or "").removesuffix("/").removesuffix("/api")
    history = f"recall-bench history -o {output}" if output else "recall-bench history -o <the deployment's output>"
    lines = [
        f"sent {EVENT_NAME} (event {event_id}) to {api_url or 'the configured Prefect API'}",
        (ready or f"{_TRIGGERED}, picked up by a worker of its pool (while none is online, it waits as Scheduled)")
        + ". Watch it:",
        "  prefect flow-run ls --flow-name recall-benchmark --state-type RUNNING --state-type COMPLETED --limit 3",
        f"    # the run {name}, Running then Completed (before: Scheduled, waiting for a worker)",
    ]
    if ui.startswith("http"):
        lines.append(f"  {ui}/runs   # the UI; its Event Feed shows the event and the automation that acted on it")
    lines.append(f"  {history}   # its row once committed (label index-{index_version})")
    return lines
