"""The parameters of one benchmark run: one pydantic model shared by the CLI, the flow and deployments.

Secrets never go here (they would be stored as flow-run parameters): API keys come from
``OPENAI_API_KEY``/``AZURE_OPENAI_API_KEY`` and storage credentials from the standard ``AWS_*`` variables
or Prefect Secret blocks; ``storage_options`` holds only non-secret settings (endpoint, region...).
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import ConfigDict, Field, field_validator, model_validator

from recall_tasks.id_params import IdParams
from recall_tasks.secrets import looks_secret, redact

#: Parameters that only say how to wait for a ``--batch`` run's batches and what to do with failed lines: a batch
#: record does not keep them (``batch.record.stored_params``: the collecting command chooses them).
BATCH_CONTROL_FIELDS = frozenset(
    {"batch_wait", "poll_interval_s", "batch_timeout_s", "batch_fallback", "batch_collect_only"}
)

#: Parameters of Prefect's chunk cache, removed, with their former defaults: refused when set (``_removed_chunk_cache``)
REMOVED_FIELDS: dict[str, object] = {"chunk_cache_storage": None, "chunk_cache_days": 30.0}

#: The parameters in the run key (``steps._run_key``) besides the configuration the results are scored under (the
#: config hash's: metric, judge and its fingerprint, threshold, scale, strict mode, on_missing, output, the id
#: metrics' settings) and the dataset's fingerprint: where the run is recorded and under which series, what its rows
#: are made of (columns, contexts), what else it records (segments, canary, prices, which rows are refused or cut
#: for the context window) and where and how it is paid (the endpoint, the Batch API). An allowlist: every other
#: parameter says how the run is carried out (concurrency, chunking, rate limits, timeouts, retries, runner,
#: storage settings, the row cache), how far it may spend (the caps: the ledger carries its spend), what is decided
#: once it is judged (error rate, baseline, tolerance, exit gates), how a batch run waits or whether to wait for a
#: live attempt, so a rerun that changes only those resumes the run (docs/design.md, "Resume").
RUN_KEY_FIELDS = (
    "dataset_uri", "dataset_name", "output_uri", "format", "catalog", "namespace", "label", "index_version",
    "judge", "base_url", "context_window", "on_overlong", "columns", "retriever", "retrieval_uri", "context_from",
    "context_extractor", "segment_by", "canary", "prices", "batch",
)  # fmt: skip

#: One level of an Iceberg namespace (``--namespace team.recall`` has two): pyiceberg refuses an empty or blank
#: level; recall-bench also keeps to the characters every catalog (REST, SQL, Glue, Hive) accepts.
NAMESPACE_LEVEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


def namespace_problem(value: str) -> str | None:
    """Why ``value`` is not an Iceberg namespace recall-bench can use, or None: dot-separated levels, none empty."""
    levels = value.split(".")
    if any(not level for level in levels):
        return (
            "an Iceberg namespace is one or more names separated by single dots, none empty "
            "(no leading, trailing or double dot), e.g. recall_bench or team.recall"
        )
    bad = next((level for level in levels if not NAMESPACE_LEVEL.fullmatch(level)), None)
    if bad is not None:
        return f"level {bad!r} may hold only letters, digits, '_' and '-' (not first)"
    return None


class RunParams(IdParams):
    """Everything a run needs; every field is a CLI option and a deployment parameter."""

    # a refused value is never echoed (pydantic's ``input_value=...``): it may hold a credential
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    dataset_uri: str = Field(
        min_length=1, description="Parquet file, folder or glob: s3://, gs://, az://, file:// or a path"
    )
    output_uri: str = Field("recall-output", description="Where the results/ and runs/ tables live")
    metric: Literal["contextual_recall", "context_coverage", "retrieval_ids"] = Field(
        "contextual_recall", description="contextual_recall | context_coverage | retrieval_ids (id metrics only)"
    )
    judge: Literal["lexical", "openai"] = Field(
        "lexical", description="lexical (offline approximation, no key) | openai (any OpenAI-compatible endpoint)"
    )
    model: str = Field("gpt-4o-mini", description="Judge model (openai judge)")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint; default OPENAI_BASE_URL or OpenAI")
    threshold: float = Field(0.5, ge=0, description="Score at or above which a row passes")
    scale: float = Field(1.0, gt=0, description="Score of a fully supported row (scores run 0..scale)")
    strict_mode: bool = Field(False, description="Score is scale only if every sentence is supported, else 0")
    include_reason: bool = Field(True, description="Ask the judge for a reason per verdict and a row summary")
    on_missing: Literal["error", "zero", "skip"] = Field(
        "error", description="A row without expected output or contexts: error | zero | skip"
    )
    max_concurrency: int = Field(64, ge=1, le=4096, description="Judge requests in flight at once")
    requests_per_minute: int | None = Field(
        None,
        ge=1,
        description="The provider's requests-per-minute quota, one budget for every process and run "
        "that share a --rate-limit-key (through Prefect; without a Prefect API, per process)",
    )
    tokens_per_minute: int | None = Field(
        None,
        ge=1,
        description="The provider's tokens-per-minute quota (estimated before each call), shared like --rpm",
    )
    rate_limit_key: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="Name of the fleet-wide --rpm/--tpm budget (default: a hash of the endpoint URL and model); "
        "runs with the same key share one budget",
    )
    chunk_size: int = Field(500, ge=1, le=100_000, description="Rows per Prefect task (and per chunk-cache entry)")
    max_workers: int = Field(4, ge=1, le=64, description="Chunk tasks in flight")
    timeout_s: float = Field(60.0, gt=0, description="Seconds a judge call may take per attempt before it is retried")
    max_retries: int = Field(
        4, ge=0, le=20, description="Retries of a judge call on 429, 5xx, timeouts and connection errors"
    )
    context_window: int | None = Field(
        None,
        ge=1,
        description="The judge model's context window in tokens (prompt plus reply), checked before each request "
        "(default: the known window of OpenAI models, none for others)",
    )
    on_overlong: Literal["refuse", "truncate", "send"] = Field(
        "refuse",
        description="A request over the context window: refuse (the row's error, nothing sent) | truncate (the "
        "context cut from its end to fit, said in the row's flags) | send (the endpoint decides)",
    )
    label: str | None = Field(None, description="Free label, e.g. the index version")
    dataset_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="Name of the dataset's series (default: its normalised URI identifies it, its file or folder "
        "name labels it); needed when the location changes every night, e.g. dated folders",
    )
    index_version: str | None = Field(None, description="Version of the search index being scored (default: label)")
    segment_by: list[str] = Field(default_factory=list, description="Columns to aggregate by")
    columns: dict[str, str] = Field(default_factory=dict, description="role -> column name overrides")
    format: Literal["delta", "parquet", "iceberg"] = Field(
        "delta", description="Table format of the output: delta | parquet | iceberg"
    )
    catalog: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
        description="--format iceberg: the pyiceberg catalog to use, by name (.pyiceberg.yaml or "
        "PYICEBERG_CATALOG__<NAME>__*); default: an embedded SQLite catalog under the (local) output",
    )
    namespace: str | None = Field(
        None,
        max_length=128,
        description="--format iceberg: the catalog namespace of the tables (default: recall_bench, or the one "
        "the output records)",
    )
    storage_options: dict[str, str] = Field(default_factory=dict, description="Non-secret storage settings")
    cache: bool = Field(True, description="Use the row verdict cache (--no-cache: off)")
    refresh_cache: bool = Field(False, description="Re-judge everything, then refresh the caches")
    cache_uri: str | None = Field(None, description="Row verdict cache location; default <output>/cache")
    max_cost_usd: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Spend at most this much for the run (USD, finite, above 0): each attempt reserves its worst "
        "case (prompt bytes + completion limit at the price) before it is sent, the unused part comes back",
    )
    max_requests: int | None = Field(
        None, ge=1, description="Send at most this many judge requests for the run, retries and repairs included"
    )
    prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="USD per million input and output tokens of a model with no known price: MODEL=IN,OUT "
        "(repeatable; 0,0 for a free self-hosted model); costs and --max-cost-usd use it",
    )
    max_error_rate: float = Field(
        0.05, ge=0, le=1, description="Share of assessed rows in error above which the run is recorded as failed"
    )
    baseline: str | None = Field(
        "latest", description="Run to compare with: latest, a run id, label:<label>; None to skip the comparison"
    )
    tolerance: float = Field(0.02, ge=0, description="Mean drop that counts as a regression (with a CI below 0)")
    canary: str | None = Field(
        None,
        description="A small labelled set (the format of `recall-bench calibrate`) judged with every run: the run "
        "records its judge's agreement with the labels, and a comparison whose agreement moved beyond its interval "
        "is incomparable (judge drift), never regressed or improved",
    )
    fail_on_regression: bool = Field(
        False,
        description="Fail the flow run when the comparison says regressed (exit 3) or incomparable: judge drift or "
        "a changed configuration (exit 6)",
    )
    allow_incomparable: bool = Field(
        False, description="With --fail-on-regression: an incomparable comparison passes (exit 0)"
    )
    require_baseline: bool = Field(
        False,
        description="A completed run with no baseline to compare with (the first of its series, or every earlier "
        "run failed or budget-stopped) fails the flow run (exit 7): a nightly gate that a renamed or moved dataset "
        "cannot pass unnoticed",
    )
    retriever: str | None = Field(
        None, description="module:function filling retrieval_context from the questions at run time"
    )
    retrieval_uri: str | None = Field(
        None, description="Parquet of row_id + retrieval_context from a new index, joined to the dataset by row_id"
    )
    units: Literal["sentences", "claims"] = Field(
        "sentences",
        description="Units of the reference answer: sentences (split in code) | claims (atomic claims an LLM "
        "extracts once per distinct reference, cached; contextual_recall with --judge openai)",
    )
    extractor_model: str | None = Field(
        None, description="Model extracting the claims (--units claims); default --model"
    )
    context_from: str | None = Field(
        None,
        pattern=r"^tool-results(:[^,:]+(,[^,:]+)*)?$",
        description="Take the retrieval context from an agent trace (the messages column): tool-results "
        "(every tool result) or tool-results:NAME,... (those tools' results); rows without messages keep their "
        "retrieval_context",
    )
    context_extractor: str | None = Field(
        None,
        description="module:function(input, messages) -> list of context strings, for agent rows (rows with "
        "messages); other rows keep their retrieval_context",
    )
    task_runner: Literal["threads", "processes", "dask"] = Field(
        "threads",
        description="Where the chunk tasks run: threads (this process) | processes (a process pool on this "
        "machine) | dask (a LocalCluster, or the scheduler at --dask-address)",
    )
    workers: int | None = Field(
        None, ge=1, le=1024, description="Worker processes of --task-runner processes|dask (default: the cores)"
    )
    dask_address: str | None = Field(
        None, description="Address of an existing Dask scheduler for --task-runner dask; default a LocalCluster"
    )

    batch: bool = Field(
        False,
        description="Judge the rows the row cache cannot serve through the OpenAI Batch API (half price, results "
        "within 24 h): submit and exit with the run pending; the same command again collects and finishes the run",
    )
    batch_wait: bool = Field(False, description="With --batch: submit, then wait for the batches and finish the run")
    poll_interval_s: float = Field(60.0, gt=0, description="With --batch --wait: seconds between status checks")
    batch_timeout_s: float | None = Field(
        None, gt=0, description="With --batch --wait: stop waiting after this many seconds (the run stays pending)"
    )
    batch_fallback: Literal["error", "live"] = Field(
        "error",
        description="Failed, expired or cancelled batch lines: error (resubmitted once in a new batch, then row "
        "errors naming the batch and line) | live (judged with live calls, no resubmission)",
    )
    batch_collect_only: bool = Field(
        False,
        description="With --batch: only carry on with the batches already recorded for these parameters (check, "
        "resubmit their unanswered lines once, collect and finish the run); never a new record, nor a run without one",
    )
    wait_for_lock: bool = Field(
        False,
        description="When another attempt of the same run (the same command on the same data) is judging: wait "
        "until it ends or its lease expires, then resume its run if it did not commit (default: refused, exit 2)",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_chunk_cache(cls, value: object) -> object:
        """Prefect's chunk cache is gone (it loaded pickled records from storage a parameter named): a run that
        still sets its options is told so, never run as if they applied. Unset or blank, they are dropped."""
        if isinstance(value, dict) and any(name in value for name in REMOVED_FIELDS):
            value = dict(value)
            for name, default in REMOVED_FIELDS.items():
                given = value.pop(name, None)
                if given not in (None, "", "None", "null", default):
                    raise ValueError(
                        f"{name} was removed with Prefect's chunk cache: the row cache (--cache-uri, default "
                        "<output>/cache) serves a rerun; remove the parameter"
                    )
        return value

    @field_validator("storage_options")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if looks_secret(k)]
        if bad:
            raise ValueError(
                f"storage option(s) {', '.join(bad)} look secret: pass credentials through AWS_* environment "
                "variables or a Prefect Secret block, never as run parameters"
            )
        return value

    @field_validator("namespace")
    @classmethod
    def _iceberg_namespace(cls, value: str | None) -> str | None:
        """Checked before any judge call or write: pyiceberg refuses an empty level only when the tables are
        created, after every row was judged (and ``_warehouse.json`` recorded the name)."""
        if value is not None:
            problem = namespace_problem(value)
            if problem:
                raise ValueError(f"--namespace {value!r}: {problem}")
        return value

    @field_validator("base_url")
    @classmethod
    def _no_credentials_in_base_url(cls, value: str | None) -> str | None:
        """A user or password in the endpoint URL would be stored as a flow-run parameter: refused, not echoed."""
        if value is None:
            return value
        parts = urlsplit(value.strip())
        if "@" in parts.netloc:
            host = parts.hostname or "the host"
            raise ValueError(
                f"the judge endpoint URL holds a user name or password before {host}: remove it and pass the key "
                "through OPENAI_API_KEY (credentials in parameters are stored in Prefect's database)"
            )
        secret = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if looks_secret(k)]
        if secret:
            raise ValueError(
                f"the judge endpoint URL has a secret-looking query parameter ({', '.join(secret)}): remove it and "
                "pass the key through OPENAI_API_KEY"
            )
        return value

    @field_validator("rate_limit_key")
    @classmethod
    def _key_is_no_secret(cls, value: str | None) -> str | None:
        """The key names a Prefect limit anyone with UI access reads: an API key there is refused, never echoed."""
        if value and (value.startswith(("sk-", "sess-")) or redact(value) != value):  # redact: the live secrets
            raise ValueError("--rate-limit-key looks like an API key: name the budget, e.g. team-gpt4o")
        return value

    @field_validator("output_uri")
    @classmethod
    def _output_has_a_path(cls, value: str) -> str:
        stripped = value.strip()
        if not stripped or stripped.endswith("://"):
            raise ValueError(f"the output location {value!r} names no folder or bucket")
        return stripped

    @field_validator("dataset_uri", "output_uri", "retrieval_uri", "cache_uri", "canary", "qrels_uri", mode="after")
    @classmethod
    def _no_unrendered_template(cls, value: str | None) -> str | None:
        if value is not None and "{{" in value:
            raise ValueError(f"{value!r} is an unrendered template: set its variable before `prefect deploy`")
        return value

    @field_validator(
        "retrieval_uri",
        "retriever",
        "index_version",
        "label",
        "dataset_name",
        "base_url",
        "cache_uri",
        "extractor_model",
        "context_from",
        "context_extractor",
        "dask_address",
        "rate_limit_key",
        "canary",
        "qrels_uri",
        "id_pattern",
        mode="before",
    )
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        # event-templated deployment parameters render a missing optional field as "" or "None"
        return None if isinstance(value, str) and value.strip() in ("", "None", "null") else value

    @field_validator("prices", mode="before")
    @classmethod
    def _prices(cls, value: object) -> object:
        """``MODEL=IN,OUT`` strings (the CLI's ``--price``, a deployment's list) or a mapping; never negative."""
        if isinstance(value, list | tuple):
            parsed: dict[str, tuple[float, float]] = {}
            for item in value:
                model, sep, pair = str(item).partition("=")
                numbers = pair.split(",")
                try:
                    if not sep or not model.strip() or len(numbers) != 2:
                        raise ValueError
                    parsed[model.strip()] = (float(numbers[0]), float(numbers[1]))
                except ValueError:
                    raise ValueError(
                        f"--price {item!r}: expected MODEL=IN,OUT in USD per million tokens, e.g. my-model=0.15,0.6"
                    ) from None
            value = parsed
        if isinstance(value, dict):
            for model, pair in value.items():
                if any(float(p) < 0 for p in pair):
                    raise ValueError(f"--price {model}: a price cannot be negative")
        return value

    @model_validator(mode="after")
    def _threshold_within_scale(self) -> RunParams:
        if self.threshold > self.scale:
            raise ValueError(f"threshold {self.threshold} is above scale {self.scale}")
        return self

    @model_validator(mode="after")
    def _runner_options(self) -> RunParams:
        """Options a task runner cannot honour are refused, never silently weakened.

        ``--max-requests`` and ``--max-cost-usd`` hold for the whole run with every runner (processes/dask: counters
        in Prefect, ``fleet/budget.py``).
        """
        if self.task_runner == "threads":
            if self.workers is not None:
                raise ValueError("--workers applies to --task-runner processes or dask")
        else:
            if self.retriever:
                raise ValueError(
                    f"--retriever runs in the flow's process and cannot feed --task-runner {self.task_runner}: "
                    "write its results with --retrieval-uri, or use --task-runner threads"
                )
            if self.batch:
                raise ValueError(
                    f"--batch runs with --task-runner threads only (got {self.task_runner}): a batch run judges "
                    "nothing live to spread over workers, and its collected rows are served in the flow's process"
                )
        if self.batch_collect_only and not self.batch:
            raise ValueError("--collect-only applies to --batch runs")
        if self.dask_address and self.task_runner != "dask":
            raise ValueError("--dask-address needs --task-runner dask")
        return self
