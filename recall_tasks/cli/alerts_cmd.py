"""``recall-bench alerts install|list|remove``: the automations of ``deployments/alerts.yaml`` on a Prefect server.

``install`` creates each automation of the file (or updates the one of the same name in place: installing twice
leaves one), its ``send-notification`` actions pointing at a notification block:

- ``--webhook-url URL`` saves a new block (``--block-name``, default ``recall-bench-alerts``, overwritten when it
  exists): a ``SlackWebhook`` for ``hooks.slack.com``, a ``MicrosoftTeamsWebhook`` for Teams/Power Automate hosts,
  otherwise a ``CustomWebhookNotificationBlock`` posting ``{"subject", "text", "source"}`` as JSON (``--kind``
  chooses). The URL is a secret field of the block (Slack/Teams: ``SecretStr``; custom: the block's ``secrets``,
  its ``url`` being the placeholder ``{{webhook_url}}``): Prefect stores it encrypted and never shows it; this
  command prints, logs and puts it nowhere else (its errors are redacted with it).
- ``--block TYPE/NAME`` (or ``NAME`` when one notification block has it) uses a block you already have
  (``slack-webhook/my-team``, ``sendgrid-email/ops``, ``ms-teams-webhook/...``): any block that can notify.

``--dataset PATTERN`` limits an automation to the datasets matching the pattern (its trigger then matches the
events' ``recall.dataset`` resource label) and, unless ``--name`` is given, suffixes the automation's name with
the pattern, so one team's route never replaces another's. The server is ``PREFECT_API_URL``, else the local one
that runs use (``cli/server.py``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
import yaml

from recall_tasks.cli.common import _fail, console
from recall_tasks.errors import ConfigError
from recall_tasks.secrets import redact, register_secret

alerts_app = typer.Typer(no_args_is_help=True, help="Alerts when recall drops (Prefect automations).")

DEFAULT_BLOCK = "recall-bench-alerts"
BLOCK_PLACEHOLDER = "{{ block_document_id }}"
_REPO_FILE = Path(__file__).resolve().parents[2] / "deployments" / "alerts.yaml"
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def definitions_file(path: Path | None) -> Path:
    """``--file``, else ``deployments/alerts.yaml`` of the current directory, else the one of this checkout."""
    for candidate in [path] if path else [Path("deployments/alerts.yaml"), _REPO_FILE]:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"no alerts definition at {path or 'deployments/alerts.yaml'}: pass --file")


def load_definitions(path: Path) -> list[dict[str, Any]]:
    """The automations of an alerts file (``automations:``, a list of Prefect automation definitions)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read it as YAML: {exc}") from None
    found = data.get("automations") if isinstance(data, dict) else None
    if not isinstance(found, list) or not found or not all(isinstance(a, dict) and a.get("name") for a in found):
        raise ConfigError(f"{path}: expected 'automations:', a list of automations each with a name")
    return found


def webhook_kind(url: str) -> str:
    """``slack``, ``teams`` or ``custom`` from the URL's host."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "hooks.slack.com":
        return "slack"
    if host.endswith((".webhook.office.com", ".logic.azure.com", ".powerplatform.com")):
        return "teams"
    return "custom"


def save_webhook_block(url: str, kind: str, name: str) -> Any:
    """Save the block for ``--webhook-url`` (overwriting one of the same name); returns its document id."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock, MicrosoftTeamsWebhook, SlackWebhook

    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ConfigError("--webhook-url: expected an http(s) URL")
    chosen = webhook_kind(url) if kind == "auto" else kind
    block: Any
    if chosen == "slack":
        block = SlackWebhook(url=url)
    elif chosen == "teams":
        block = MicrosoftTeamsWebhook(url=url)
    else:
        block = CustomWebhookNotificationBlock(
            name="recall-bench",
            url="{{webhook_url}}",
            json_data={"subject": "{{subject}}", "text": "{{body}}", "source": "recall-bench"},
            secrets={"webhook_url": url},
        )
    return block.save(name, overwrite=True)


def _notifying(document: Any) -> bool:
    return "notify" in (document.block_schema.capabilities if document.block_schema else [])


def existing_block(client: Any, spec: str) -> Any:
    """The id of the notification block ``TYPE/NAME`` (or ``NAME`` when one notification block has that name)."""
    slug, sep, name = spec.rpartition("/")
    if (sep and not slug) or not name:
        raise ConfigError(f"--block {spec!r}: expected NAME or TYPE/NAME, e.g. slack-webhook/my-team")
    from prefect.exceptions import ObjectNotFound

    if sep:
        try:
            found = [client.read_block_document_by_name(name, slug, include_secrets=False)]
        except ObjectNotFound:
            found = []
    else:
        found, offset = [], 0
        while page := client.read_block_documents(offset=offset, limit=200, include_secrets=False):
            found += [d for d in page if d.name == name and _notifying(d)]
            offset += len(page)
    if not found:
        raise ConfigError(f"--block {spec!r}: no such notification block on this Prefect server (`prefect block ls`)")
    if len(found) > 1:
        types = ", ".join(f"{d.block_type.slug if d.block_type else '?'}/{name}" for d in found)
        raise ConfigError(f"--block {spec!r}: several notification blocks have that name ({types}): give TYPE/NAME")
    if not _notifying(found[0]):
        raise ConfigError(f"--block {spec!r} cannot send notifications")
    return found[0].id


def automation_for(definition: dict[str, Any], block_id: Any, dataset: str | None, name: str | None) -> Any:
    """The automation of one definition, its notification actions pointing at ``block_id``."""
    from prefect.events.schemas.automations import AutomationCore

    spec = {**definition, "actions": [dict(a) for a in definition.get("actions") or []]}
    for action in spec["actions"]:
        if action.get("type") == "send-notification" and action.get("block_document_id") in (BLOCK_PLACEHOLDER, None):
            action["block_document_id"] = str(block_id)
    if dataset:
        match = {**(spec["trigger"].get("match") or {}), "recall.dataset": dataset}
        spec["trigger"] = {**spec["trigger"], "match": match}
    if name:
        spec["name"] = name
    elif dataset:
        spec["name"] = f"{spec['name']}-{dataset}"
    try:
        return AutomationCore.model_validate(spec)
    except ValueError as exc:
        raise ConfigError(f"automation {spec['name']!r}: {exc}") from None


def install_automation(client: Any, automation: Any) -> tuple[str, Any]:
    """Create ``automation`` or update the one of the same name (the others of that name are removed)."""
    same = client.read_automations_by_name(automation.name)
    if not same:
        return "created", client.create_automation(automation)
    keep, *extra = same
    client.update_automation(keep.id, automation)
    for duplicate in extra:
        client.delete_automation(duplicate.id)
    return "updated", keep.id


def ours(automation: Any) -> bool:
    """Whether an automation listens to recall-bench's alert events."""
    from recall_tasks.reports.alerts import ALERT_EVENTS  # numpy and the regression analysis: not at CLI start

    expect = set(getattr(automation.trigger, "expect", ()) or ())
    return bool(expect & set(ALERT_EVENTS.values())) or automation.name.startswith("recall-bench")


def describe(client: Any, automation: Any) -> str:
    """One automation in a few lines: name, id, state, trigger, and the blocks its notifications go through."""
    trigger = automation.trigger
    lines = [f"{automation.name}  {automation.id}  {'enabled' if automation.enabled else 'paused'}"]
    lines.append(f"  on {', '.join(sorted(getattr(trigger, 'expect', ()) or ()))}")
    match = getattr(trigger, "match", None)
    if match is not None:
        lines.append(f"  where {match.model_dump() if hasattr(match, 'model_dump') else match}")
    for action in automation.actions:
        block_id = getattr(action, "block_document_id", None)
        if block_id is None:
            lines.append(f"  then {action.type}")
            continue
        try:
            doc = client.read_block_document(block_id, include_secrets=False)
            block = f"{doc.block_type.slug if doc.block_type else '?'}/{doc.name}"
        except Exception:  # noqa: BLE001 - a deleted block: say so, never fail the listing
            block = f"missing block {block_id}"
        lines.append(f"  then {action.type} via {block}: subject {action.subject!r}, body {action.body!r}")
    return "\n".join(lines)


@alerts_app.command("install")
def install(
    webhook_url: Annotated[
        str | None, typer.Option("--webhook-url", help="Save a notification block for this URL (kept secret)")
    ] = None,
    block: Annotated[str | None, typer.Option("--block", help="Notification block: NAME or TYPE/NAME")] = None,
    kind: Annotated[str, typer.Option("--kind", help="auto (from the URL's host) | slack | teams | custom")] = "auto",
    block_name: Annotated[
        str, typer.Option("--block-name", help="Name of the block --webhook-url saves")
    ] = DEFAULT_BLOCK,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="Only datasets matching this pattern (e.g. 'golden*')")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Automation name (one definition in the file)")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Alerts definition (deployments/alerts.yaml)")] = None,
) -> None:
    """Create or update the alert automations (idempotent).

    They send through a notification block: a new one for --webhook-url, or --block TYPE/NAME.
    """
    secret = [webhook_url] if webhook_url else []
    register_secret(webhook_url)
    with _one_line_errors(secret):
        if (webhook_url is None) == (block is None):
            raise ConfigError("give one of --webhook-url URL or --block NAME")
        if kind not in ("auto", "slack", "teams", "custom"):
            raise ConfigError(f"--kind {kind!r}: expected auto, slack, teams or custom")
        if not _SLUG.match(block_name):
            raise ConfigError(f"--block-name {block_name!r}: lowercase letters, digits and dashes")
        definitions = load_definitions(definitions_file(file))
        if name and len(definitions) > 1:
            raise ConfigError("--name: the file holds several automations")
        if dataset is not None and not dataset.strip():  # before: '' silently updated the every-dataset automation
            raise ConfigError(
                f"--dataset {dataset!r}: an empty pattern; omit --dataset for the automation on every dataset"
            )
        if name is not None and not name.strip():
            raise ConfigError(f"--name {name!r}: an automation needs a name; omit --name for the file's")
        with _client() as client:
            if webhook_url is not None:
                block_id = save_webhook_block(webhook_url, kind, block_name)
                via = f"block {block_name} (new {webhook_kind(webhook_url) if kind == 'auto' else kind} webhook)"
            else:
                block_id = existing_block(client, block or "")
                via = f"block {block}"
            for definition in definitions:
                automation = automation_for(definition, block_id, dataset, name)
                verb, automation_id = install_automation(client, automation)
                _say(f"{verb} automation {automation.name} ({automation_id}) via {via}")
                _say(describe(client, client.read_automation(automation_id)))


def _say(line: str) -> None:
    """Print ``line`` as is: automation, block and dataset names are the user's text, never Rich markup."""
    console.print(line, soft_wrap=True, markup=False, highlight=False)


@contextlib.contextmanager
def _one_line_errors(secret: list[str] | None = None) -> Iterator[None]:
    """Any error of an ``alerts`` command (a Prefect API that cannot be reached included) as one ``error:`` line,
    exit 2, redacted (``secret``: the webhook URL too)."""
    try:
        yield
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - one line, never the URL
        _fail(RuntimeError(redact(f"{type(exc).__name__}: {exc}" if not isinstance(exc, ConfigError) else str(exc),
                                  secret or [])))  # fmt: skip


@alerts_app.command("list")
def list_alerts() -> None:
    """The alert automations and the blocks they send through."""
    with _one_line_errors(), _client() as client:
        found = [a for a in client.read_automations() if ours(a)]
        for automation in found:
            _say(describe(client, automation))
    if not found:
        _say("no recall-bench alert automation on this server (recall-bench alerts install)")


@alerts_app.command("remove")
def remove(
    names: Annotated[list[str] | None, typer.Argument(help="Automation names (default: those of the file)")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Alerts definition (deployments/alerts.yaml)")] = None,
) -> None:
    """Delete alert automations by name; blocks stay.

    `prefect block delete` removes a block.
    """
    with _one_line_errors():
        wanted = names or [d["name"] for d in load_definitions(definitions_file(file))]
        with _client() as client:
            for name in wanted:
                same = client.read_automations_by_name(name)
                for automation in same:
                    client.delete_automation(automation.id)
                _say(f"removed automation {name}" if same else f"no automation named {name}")


def _client() -> Any:
    """A sync Prefect client on the server runs use (``PREFECT_API_URL``, else the local server)."""
    from recall_tasks.cli.runtime import _prefect_api

    @contextlib.contextmanager
    def opened() -> Any:
        with _prefect_api():
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                yield client

    return opened()
