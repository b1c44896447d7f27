"""Apache Iceberg result tables through a pyiceberg catalog (``--format iceberg``).

Decisions:

* **The catalog** is any pyiceberg catalog, configured the pyiceberg way (``.pyiceberg.yaml``,
  ``PYICEBERG_CATALOG__<NAME>__*``) and chosen by name (``--catalog NAME``). Without a name, an embedded SQL
  catalog on SQLite lives at ``<output>/_iceberg_catalog.db`` and its tables at ``<output>/<table>`` (nothing to
  run; a local ``--output`` only, since SQLite needs a local file). The tables ``results``, ``runs`` and
  ``comparisons`` live in one namespace (default :data:`DEFAULT_NAMESPACE`).
* **Where they are** is recorded in ``<output>/_warehouse.json`` (format, catalog name, namespace: never a
  credential), so a later command given the same ``--output`` finds them without ``--catalog``.
* **Credentials** come from the catalog's own configuration, or, for the S3 file I/O, from the project's storage
  settings (``AWS_*`` variables, ``--storage-option``) filled in where the catalog configuration has none. They
  are registered with the redactor and never written to a table, a snapshot property or the marker.
* **One commit per run and table**: a run's batches are appended inside one transaction (one catalog commit),
  each snapshot carrying :data:`COMMIT_PROPERTY`. Before appending, the table's snapshots are searched for the
  commit id: a rerun after a crash between the ``results`` and ``runs`` commits appends nothing twice. A commit
  that loses a race (``CommitFailedException``) is retried on the fresh table, the id checked again first.
  pyiceberg's own retry (which would re-apply the append without that check) is off for the tables it creates
  (``commit.retry.num-retries=0``). Once ``recall-bench maintain`` has expired snapshots (the table property
  :data:`EXPIRED_PROPERTY`), an id not found in the remaining snapshots is also looked for as rows (the run id, a
  scan pruned by the files' column bounds).
* **Reading**: the current snapshot's data files become one pyarrow dataset (lazy, column projection and filters
  pushed down) with the table's schema in plain Arrow types (``string``, not ``large_string``), so every reader
  (DuckDB ``query``, ``history``, reports, the baseline) sees the same types as from Delta.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from recall_tasks.errors import ConfigError, StorageError
from recall_tasks.io.storage import StorageConfig, split_uri
from recall_tasks.io.tables import retry_commits, row_groups
from recall_tasks.secrets import looks_secret, register_secret

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "recall_bench"
MARKER = "_warehouse.json"
CATALOG_DB = "_iceberg_catalog.db"
COMMIT_PROPERTY = "recall-bench.commit-id"
#: table property set by ``maintain`` once it expired snapshots: the commit-id check then also scans for the key
EXPIRED_PROPERTY = "recall-bench.snapshots-expired"
#: appends retried after another writer's commit landed first
COMMIT_ATTEMPTS = 6


def _plain_type(t: pa.DataType) -> pa.DataType:
    """pyiceberg reads strings, binaries and lists as their ``large_`` variants: the contract uses the plain ones."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t) or pa.types.is_list_view(t):
        return pa.list_(_plain_type(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(_plain_type(t.key_type), _plain_type(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain_type(f.type), f.nullable) for f in t])
    return t


def iceberg_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type a stored column reads back as from Iceberg (no 8- or 16-bit integers: ``int``)."""
    if pa.types.is_integer(t) and t.bit_width < 32:
        return pa.int32()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(iceberg_type(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(iceberg_type(t.key_type), iceberg_type(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, iceberg_type(f.type), f.nullable) for f in t])
    return _plain_type(t)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with plain Arrow types and no field-id metadata."""
    return pa.schema([pa.field(f.name, _plain_type(f.type), f.nullable) for f in schema])


@dataclass(frozen=True)
class Location:
    """Which catalog and namespace hold an output's tables (what ``_warehouse.json`` records)."""

    catalog: str | None = None
    namespace: str = DEFAULT_NAMESPACE

    def describe(self) -> str:
        return f"catalog {self.catalog or '(embedded SQLite)'}, namespace {self.namespace}"


def read_marker(fs: Any, root: str) -> Location | None:
    """The location recorded in the output at ``root`` (of ``fs``), or None when it holds no Iceberg tables.

    A marker that is not what :func:`write_marker` writes (not JSON, a namespace pyiceberg refuses: what runs
    before the namespace check wrote) is a :class:`ConfigError` naming the file, on every command.
    """
    from recall_tasks.config import namespace_problem

    path = f"{root.rstrip('/')}/{MARKER}"
    try:  # one GET (an ``exists`` first would be one more request)
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    catalog = data.get("catalog") if isinstance(data, dict) else None
    namespace = (data.get("namespace") or DEFAULT_NAMESPACE) if isinstance(data, dict) else None
    problem: str | None = None
    if not isinstance(namespace, str) or not (catalog is None or isinstance(catalog, str)):
        problem = "it is not the JSON object recall-bench writes"
    elif (bad := namespace_problem(namespace)) is not None:
        problem = f"its namespace {namespace!r} is not valid: {bad}"
    if problem is not None or not isinstance(namespace, str):
        raise ConfigError(
            f"{path}: {problem}; it records where the output's Iceberg tables are: fix it, or delete it if the "
            "output holds no Iceberg table"
        )
    return Location(catalog=catalog, namespace=namespace)


def write_marker(fs: Any, root: str, where: Location) -> None:
    data = {"format": "iceberg", "catalog": where.catalog, "namespace": where.namespace}
    fs.pipe_file(f"{root.rstrip('/')}/{MARKER}", json.dumps(data).encode())


def resolve_location(fs: Any, root: str, output_uri: str, catalog: str | None, namespace: str | None) -> Location:
    """Where the output's tables are: what ``_warehouse.json`` records, else what the command asks for.

    A command asking for another catalog or namespace than the recorded one is refused: one output, one place.
    """
    recorded = read_marker(fs, root)
    wanted = Location(catalog, namespace or DEFAULT_NAMESPACE)
    if recorded is None:
        if catalog is None and split_uri(output_uri)[0] != "file":
            raise ConfigError(
                f"--format iceberg on {output_uri} needs --catalog NAME (a catalog configured in .pyiceberg.yaml "
                "or PYICEBERG_CATALOG__<NAME>__*): the embedded SQLite catalog needs a local --output"
            )
        return wanted
    other_catalog = catalog is not None and catalog != recorded.catalog
    if other_catalog or (namespace is not None and namespace != recorded.namespace):
        raise ConfigError(
            f"{output_uri} holds the Iceberg tables of {recorded.describe()}, not {wanted.describe()}: "
            "drop --catalog/--namespace or write to another --output"
        )
    return recorded


def _storage_properties(storage: StorageConfig) -> dict[str, str]:
    """pyiceberg's S3 FileIO properties from the project's storage settings (defaults under the catalog's own)."""
    plain = {
        "s3.endpoint": storage.endpoint_url,
        "s3.region": storage.region,
        "s3.access-key-id": storage.access_key_id.get_secret_value() if storage.access_key_id else None,
        "s3.secret-access-key": storage.secret_access_key.get_secret_value() if storage.secret_access_key else None,
        "s3.session-token": storage.session_token.get_secret_value() if storage.session_token else None,
    }
    props = {k: v for k, v in plain.items() if v}
    if storage.endpoint_url:
        props["s3.force-virtual-addressing"] = "false"
    return props


def load_catalog(output_uri: str, storage: StorageConfig, where: Location) -> Any:
    """The pyiceberg catalog of ``where``: a named one from pyiceberg's configuration, or the embedded one."""
    from pyiceberg.catalog import load_catalog as pyiceberg_load
    from pyiceberg.utils.config import Config

    if where.catalog is None:  # resolve_location refused a non-local output without a catalog
        from urllib.parse import quote

        root = split_uri(output_uri)[1]
        # the database's path percent-encoded: SQLAlchemy decodes the URL (``%20`` was a space, ``?`` began a query)
        uri = f"sqlite:///{quote(f'{root}/{CATALOG_DB}')}"
        return pyiceberg_load("recall_bench", type="sql", uri=uri, warehouse=f"file://{root}")
    config = Config().get_catalog_config(where.catalog)  # read now: pyiceberg's own copy is read at import
    if not config:
        raise ConfigError(
            f"--catalog {where.catalog}: no such pyiceberg catalog (configure it in .pyiceberg.yaml or with "
            f"PYICEBERG_CATALOG__{where.catalog.upper()}__URI and friends)"
        )
    props = {**_storage_properties(storage), **{str(k): str(v) for k, v in config.items()}}
    for key, value in props.items():
        if looks_secret(key) or key.endswith(("credential", "token")):
            register_secret(value)
    return pyiceberg_load(where.catalog, **props)


#: pyiceberg's errors of a catalog that refused the caller (HTTP 401/403, an expired token, a failed OAuth)
_REFUSALS = frozenset({"UnauthorizedError", "ForbiddenError", "AuthorizationExpiredError", "OAuthError"})


def catalog_error(exc: BaseException, catalog: str | None) -> StorageError:
    """``exc`` of the REST catalog ``catalog`` as one line naming it and its URI (the configured one)."""
    from pyiceberg.utils.config import Config

    from recall_tasks.secrets import redact

    uri = (Config().get_catalog_config(catalog) or {}).get("uri") if catalog else None
    where = f"the Iceberg catalog {catalog} ({uri or 'no uri configured'})"
    detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    if type(exc).__name__ in _REFUSALS:
        name = f"PYICEBERG_CATALOG__{(catalog or '').upper()}__"
        msg = (
            f"{where} rejected the credentials ({detail}): check the catalog's own settings in .pyiceberg.yaml or "
            f"{name}* (credential, token, rest.sigv4-enabled with its signing name and region) and, for SigV4, "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    else:
        msg = f"{where} answered with an error: {detail}"
    return StorageError(redact(msg))


def _created_schema(schema: pa.Schema, partition_by: list[str]) -> tuple[Any, Any]:
    """The Iceberg schema of a new table (fresh field ids) and its identity partition spec."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import assign_fresh_schema_ids
    from pyiceberg.transforms import IdentityTransform

    iceberg_schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
    fields = [
        PartitionField(source_id=iceberg_schema.find_field(name).field_id, field_id=1000 + i,
                       transform=IdentityTransform(), name=name)
        for i, name in enumerate(partition_by)
    ]  # fmt: skip
    return iceberg_schema, PartitionSpec(*fields)


def _committed(table: Any, commit_id: str, key: tuple[str, str] | None) -> bool:
    """Whether a snapshot carries ``commit_id``; after snapshot expiry (``maintain``), whether rows with ``key``
    (column, value) exist: a scan the files' column bounds prune to the files that may hold the value."""
    if any(s.summary is not None and s.summary.get(COMMIT_PROPERTY) == commit_id for s in table.snapshots()):
        return True
    if key is None or EXPIRED_PROPERTY not in table.properties or key[0] not in table.schema().column_names:
        return False
    from pyiceberg.expressions import EqualTo

    scan = table.scan(row_filter=EqualTo(term=key[0], value=key[1]), selected_fields=(key[0],), limit=1)
    return bool(scan.to_arrow().num_rows)


@dataclass
class IcebergTables:
    """The three tables of one output in one catalog namespace."""

    output_uri: str
    storage: StorageConfig
    where: Location
    fs: Any
    root: str
    _catalog: Any = field(default=None, repr=False)

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = load_catalog(self.output_uri, self.storage, self.where)
        return self._catalog

    def identifier(self, name: str) -> str:
        return f"{self.where.namespace}.{name}"

    def table(self, name: str) -> Any | None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        if self.where.catalog is None and self._catalog is None and not self.fs.exists(self._embedded_db()):
            return None  # no table yet: reading must not create the catalog's database
        try:
            with self.catalog_calls():
                return self.catalog.load_table(self.identifier(name))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    @contextlib.contextmanager
    def catalog_calls(self) -> Iterator[None]:
        """A REST catalog's refusal as one :class:`StorageError` naming the catalog and its URI (pyiceberg's own
        ``UnauthorizedError`` read as a storage error on the output's bucket, which accepted the credentials)."""
        from pyiceberg.exceptions import RESTError

        try:
            yield
        except RESTError as exc:
            raise catalog_error(exc, self.where.catalog) from None

    def _embedded_db(self) -> str:
        return f"{self.root.rstrip('/')}/{CATALOG_DB}"

    def _create(self, name: str, schema: pa.Schema, partition_by: list[str]) -> Any:
        from recall_tasks.io.storage import join_uri

        self.fs.makedirs(self.root, exist_ok=True)
        if read_marker(self.fs, self.root) is None:
            write_marker(self.fs, self.root, self.where)
        iceberg_schema, spec = _created_schema(schema, partition_by)
        # the embedded catalog's tables at their plain path: a ``file://`` URL's ``?`` or ``#`` would end it
        location = join_uri(self.root, name) if self.where.catalog is None else None
        with self.catalog_calls():
            self.catalog.create_namespace_if_not_exists(self.where.namespace)
            return self._create_table(name, iceberg_schema, spec, location)

    def _create_table(self, name: str, iceberg_schema: Any, spec: Any, location: str | None) -> Any:
        return self.catalog.create_table_if_not_exists(
            self.identifier(name), iceberg_schema, location=location, partition_spec=spec,
            properties={
                "write.parquet.compression-codec": "zstd", "commit.retry.num-retries": "0",
                # metadata.json files: the last 100 kept, older ones deleted at commit (a year of nights stays small)
                "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "100",
            },
        )  # fmt: skip

    def append(
        self,
        name: str,
        data: Callable[[], pa.RecordBatchReader | pa.Table],
        commit_id: str,
        partition_by: list[str] | None = None,
        key: tuple[str, str] | None = None,
    ) -> None:
        """Append ``data()`` in ONE catalog commit unless a snapshot already carries ``commit_id``.

        New columns are added to the table schema in the same commit (union by name). A commit conflict (another
        run committed first) is retried on the fresh table, after checking that the commit id is still absent.
        """
        from pyiceberg.exceptions import CommitFailedException

        table = self.table(name)

        def attempt(n: int) -> None:
            nonlocal table
            if n:
                table = self.table(name)  # the fresh table after a conflict
            rows = data()
            if table is None:
                table = self._create(name, rows.schema, partition_by or [])
            if _committed(table, commit_id, key):
                if n:
                    log.info("%s was committed by a concurrent writer; not appended again", commit_id)
                return
            with self.catalog_calls(), table.transaction() as tx:
                known = {f.name for f in table.schema().fields}
                if any(f.name not in known for f in rows.schema):
                    with tx.update_schema() as update:
                        update.union_by_name(rows.schema)
                # rows in tables of BATCH_ROWS handed to one ``append`` each (bounds commit memory)
                groups = [rows] if isinstance(rows, pa.Table) else row_groups(rows, rows.schema)
                for group in groups:
                    tx.append(group, snapshot_properties={COMMIT_PROPERTY: commit_id})

        retry_commits(commit_id, attempt, attempts=COMMIT_ATTEMPTS, conflicts=(CommitFailedException,), logger=log)

    def dataset(self, name: str) -> pads.Dataset | None:
        """The current snapshot of table ``name`` as a pyarrow dataset, or None if there is no such table."""
        from pyiceberg.io.pyarrow import PyArrowFileIO, schema_to_pyarrow

        table = self.table(name)
        if table is None:
            return None
        schema = plain_schema(schema_to_pyarrow(table.schema(), include_field_ids=False))
        tasks = list(table.scan().plan_files())
        if not tasks:
            return pads.dataset(schema.empty_table())
        if not isinstance(table.io, PyArrowFileIO) or any(t.delete_files for t in tasks):
            return pads.dataset(table.scan().to_arrow().cast(schema))  # row deletes: let pyiceberg apply them
        locations = [PyArrowFileIO.parse_location(t.file.file_path) for t in tasks]
        fs = table.io.fs_by_scheme(locations[0][0], locations[0][1])
        return pads.dataset([path for _, _, path in locations], schema=schema, filesystem=fs, format="parquet")
