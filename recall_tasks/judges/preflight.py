"""Before spending: one cheap request (list models) tells whether the judge endpoint can be used at all.

Decisions:
- ``GET /models`` costs nothing on every OpenAI-compatible server we know (OpenAI, Azure, vLLM, Ollama,
  LiteLLM) and needs the same credentials as chat completions, so it catches the failures that would
  otherwise error every row of a run: connection refused, DNS failure, TLS error, no answer in time, a
  rejected key (401) or denied access (403). Each stops the run with :class:`JudgeConfigError` before any
  judge call or write.
- An endpoint without that route (404, 405) or one that fails it with another status gets a "could not
  verify" note and the run goes on: the chat-completions route may still work, and the run's own error
  handling (retries, the error-rate rule) takes over from there.
- No retries and a short timeout (at most 10 s): this is a probe, not a judge call.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import openai

from recall_tasks.errors import JudgeConfigError
from recall_tasks.secrets import redact

PROBE_TIMEOUT_S = 10.0


def endpoint_name(base_url: str | None, azure: bool = False) -> str:
    """Scheme, host and path of an endpoint, never its credentials."""
    if not base_url:
        return "Azure OpenAI" if azure else "https://api.openai.com/v1"
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else redact(base_url)


def connection_cause(exc: BaseException, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """What an ``APIConnectionError`` really was (the judge's own reading of the exception chain)."""
    from recall_tasks.judges._openai_reply import describe_failure

    return describe_failure(exc, timeout_s)[0]


def check_endpoint(
    *,
    model: str,
    base_url: str | None,
    api_key: str,
    azure: dict[str, str] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> str | None:
    """Probe the endpoint; raise :class:`JudgeConfigError` when it cannot serve, return a note when unsure.

    Returns None when the endpoint answered the probe.
    """
    where = endpoint_name(azure.get("azure_endpoint") if azure else base_url, azure=bool(azure))
    timeout = min(timeout_s, PROBE_TIMEOUT_S)
    key = api_key or "no-key"
    client: openai.OpenAI
    if azure:
        client = openai.AzureOpenAI(
            azure_endpoint=azure["azure_endpoint"], api_version=azure["api_version"], api_key=key,
            max_retries=0, timeout=timeout,
        )  # fmt: skip
    else:
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout)
    hint = "set OPENAI_API_KEY" if not azure else "set AZURE_OPENAI_API_KEY"
    try:
        with client:
            client.models.list()
    except openai.AuthenticationError:
        what = "needs an API key" if not api_key else "rejected the API key"
        raise JudgeConfigError(f"{where} {what} (401): {hint}", model=model, status=401) from None
    except openai.PermissionDeniedError:
        raise JudgeConfigError(
            f"{where} denied access (403): check the key's project and permissions", model=model, status=403
        ) from None
    except openai.APITimeoutError:
        raise JudgeConfigError(
            f"{where} did not answer within {timeout:g} s (probe before judging): check --base-url "
            "and that the server is up",
            model=model,
        ) from None
    except openai.APIConnectionError as exc:
        raise JudgeConfigError(
            f"cannot reach the judge at {where}: {connection_cause(exc, timeout)}; check --base-url / OPENAI_BASE_URL",
            model=model,
        ) from None
    except openai.APIStatusError as exc:
        return (
            f"could not verify the judge endpoint {where}: listing models answered HTTP {exc.status_code}; "
            "judging goes on"
        )
    return None
