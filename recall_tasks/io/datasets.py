"""Reading evaluation datasets: Parquet from any fsspec URI, validated before any judge call, streamed.

Decisions:
- Files are read one row group at a time (``ParquetFile.read_row_group`` with only the needed columns);
  the whole dataset is never in memory. Write datasets with row groups of ~10-100k rows.
- Column roles have default names covering deepeval, ragas and Mastra; ``--column role=name`` overrides.
- ``open_dataset`` checks every file's schema (and, when the data has a ``row_id`` column, that ids are
  unique, reading only that column) and raises one :class:`DatasetError` naming file, column, expected and
  found type. Nothing is judged or written before it returns.
- Row identity (how rows are paired across runs, e.g. by the regression comparison): the ``row_id`` column when
  the data has one; else a hash of what defines the test case, the question (``input``) and the reference
  answer (``expected_output``), with ``~2``, ``~3``... suffixes for exact duplicates in dataset order. It never
  depends on the retrieved contexts or the response: those are what change between index versions, and a row
  whose contexts changed must still pair with its earlier self. (Before ``ROW_IDENTITY`` v2 the hash included
  the contexts and the response; runs recorded with that identity are reported as incomparable, not paired.)
  ``content_hash`` (every judged field) stays the key of the verdict caches.

Bad inputs (each a :class:`DatasetError`, or a :class:`StorageError` for storage failures, raised by
``open_dataset`` before anything is judged or written; "row N" is the 0-based row index within the file):
- an empty URI, a URI without a path (``s3://``) or with an unknown protocol;
- a folder without ``.parquet``/``.pq`` files, a glob matching nothing (both named as such);
- a file that is not Parquet or is truncated; every file's schema must equal the first file's (same column
  names and types, pass-through columns included), so a mixed folder fails here, not halfway through a run;
- a required column missing or of the wrong type (``expected list<string>, found ...``);
- null, empty or duplicate ``row_id`` values (the duplicates are listed with their files and rows);
- a data page that cannot be decoded is found only when its row group is read, during the run (validation
  reads footers, not data): the run stops with a DatasetError naming the file, row group and rows, and
  nothing is committed (blocks judged before it are only kept for a resume);
- a dataset with zero rows in total: an empty export is almost always an upstream failure, and a run of
  zero rows would commit a run row without a score, so it is refused (``dataset has no rows``). Empty
  files next to non-empty ones are fine.

- duplicate column names in a file, also names that differ only in case (Delta names are case-insensitive);
- a pass-through column (copied to the results as it is) of a type the results table cannot hold, see below.

Pass-through columns are validated here, before any judge call, and stored with a type Delta Lake and its
readers handle (:func:`stored_type`); casts are lossless except where said:
- timestamps of any unit become microseconds (Delta stores microseconds; a ``timestamp[ns]`` column, what pandas
  writes, would otherwise create a table no reader of this project can open). Values that are not whole
  microseconds are TRUNCATED to the microsecond, never refused: a sub-microsecond part is noise for a benchmark's
  metadata column. A zoned timestamp is stored in UTC (the same instant; Delta refuses other zones);
- ``uint8``/``uint16``/``uint32`` become the next wider signed integer; ``uint64`` becomes ``decimal(20, 0)``
  (Delta has no unsigned types and values >= 2^63 do not fit a ``long``); ``float16`` becomes ``float32``;
  ``decimal256`` of precision <= 38 becomes ``decimal128``; ``date64`` becomes ``date32``; an all-null column
  becomes ``string``; dictionary-encoded columns (pandas categoricals) are stored as their values; string, binary
  and list flavours (large, view, fixed-size) become the plain ones; lists, structs and maps are checked item by
  item;
- refused: time-of-day (``time32``/``time64``), ``duration``, intervals, ``decimal256`` above precision 38,
  unions and extension types (Delta Lake has no such type): one DatasetError naming file, column and type.

Handled, not refused: null or blank values in a row (``expected_output`` null/empty/whitespace/no sentence,
an empty context list, context items that are all null or blank, a ``list<null>`` context column) make that
row "missing" and follow ``on_missing`` (error/zero/skip, counted in the run summary).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from recall_tasks.errors import DatasetError, StorageError
from recall_tasks.io.storage import StorageConfig, filesystem, normalize_uri, translate_storage_error

ROLES = ("input", "expected_output", "retrieval_context", "actual_output", "row_id", "messages")

DEFAULT_NAMES: dict[str, tuple[str, ...]] = {
    "input": ("input", "user_input", "question", "query"),
    "expected_output": ("expected_output", "reference", "ground_truth", "groundTruth", "expected_answer"),
    "retrieval_context": ("retrieval_context", "retrieved_contexts", "context", "contexts"),
    "actual_output": ("actual_output", "response", "output", "answer"),
    "row_id": ("row_id",),
    "messages": ("messages",),  # an agent trace; a role only with --context-from/--context-extractor (io/traces.py)
}

REQUIRED: dict[str, tuple[str, ...]] = {
    "contextual_recall": ("expected_output", "retrieval_context"),
    "context_coverage": ("actual_output", "retrieval_context"),
}

#: Recorded per run (``runs.row_identity``): how its rows got their ids, so comparisons pair like with like.
ROW_IDENTITY = "input+expected_output/v2"
ROW_ID_COLUMN_IDENTITY = "row_id column"

_LIST_TYPES = (pa.types.is_list, pa.types.is_large_list, pa.types.is_list_view, pa.types.is_fixed_size_list)


def _is_string(t: pa.DataType) -> bool:
    """Text: a string flavour, or dictionary-encoded strings (pandas categoricals; cast to string when read)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


class _Unstorable(ValueError):
    """A pass-through type the results table cannot hold; the message says why and what to do."""


def stored_type(t: pa.DataType) -> pa.DataType:
    """The type a pass-through column is stored with (see the module docstring); raises ``_Unstorable``."""
    if pa.types.is_dictionary(t):
        return stored_type(t.value_type)
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)  # Delta stores instants in UTC, refuses other zones
    if pa.types.is_time(t):
        raise _Unstorable("Delta Lake has no time-of-day type: cast it to string (or drop it) before the run")
    if pa.types.is_duration(t) or pa.types.is_interval(t):
        raise _Unstorable("Delta Lake has no duration type: cast it to int64 (e.g. microseconds) or string")
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(t.bit_width) or pa.decimal128(20, 0)
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise _Unstorable(f"Delta Lake decimals hold at most 38 digits, this one {t.precision}")
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_null(t) or _is_string(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if any(f(t) for f in _LIST_TYPES):
        return pa.list_(stored_type(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(stored_type(t.key_type), stored_type(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, stored_type(f.type)) for f in t])
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_binary(t):
        return t
    if pa.types.is_date32(t):
        return t
    raise _Unstorable("Delta Lake has no such type: cast it to a string or number column (or drop it)")


def _is_string_list(t: pa.DataType) -> bool:
    return any(f(t) for f in _LIST_TYPES) and (_is_string(t.value_type) or pa.types.is_null(t.value_type))


def parse_column_overrides(pairs: list[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``["input=question_text", ...]`` -> ``{"input": "question_text"}``, roles checked."""
    if not pairs:
        return {}
    items = pairs.items() if isinstance(pairs, Mapping) else [p.split("=", 1) if "=" in p else (p, "") for p in pairs]
    out: dict[str, str] = {}
    for role, name in items:
        role = role.strip()
        if role not in ROLES:
            raise DatasetError(f"--column {role}={name}: unknown role {role!r}; roles are {', '.join(ROLES)}")
        if not name:
            raise DatasetError(f"--column {role}: expected role=column_name")
        out[role] = name.strip()
    return out


@dataclass
class DatasetFile:
    """One Parquet file of a dataset and what was learnt from its footer."""

    path: str
    uri: str
    num_rows: int
    num_row_groups: int
    fingerprint: str


@dataclass
class Dataset:
    """A validated dataset: its files, the resolved column for each role, and pass-through columns."""

    uri: str
    name: str
    files: list[DatasetFile]
    columns: dict[str, str]
    passthrough: list[str]
    fs: Any
    num_rows: int
    fingerprint: str
    has_row_id: bool = False
    passthrough_types: dict[str, pa.DataType] = field(default_factory=dict)
    identity: str = ""  # what makes runs one series: the normalised URI, or "name:<--dataset-name>"

    @property
    def row_identity(self) -> str:
        """How this dataset's rows are identified across runs (see the module docstring)."""
        return ROW_ID_COLUMN_IDENTITY if self.has_row_id else ROW_IDENTITY


@dataclass
class RowBlock:
    """A slice of rows, already mapped to roles, with stable row ids and content hashes."""

    source: str
    first_row: int  # 0-based index of the block's first row within its file
    row_ids: list[str]
    content_hashes: list[str]
    table: pa.Table  # role columns under role names + pass-through columns


def dataset_name(uri: str) -> str:
    """A short name for partitioning: the file or folder name without extension."""
    tail = uri.rstrip("/").split("/")[-1] or "dataset"
    for ext in (".parquet", ".pq"):
        if tail.endswith(ext):
            tail = tail[: -len(ext)]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in tail.replace("*", "all")) or "dataset"


_GLOB_CHARS = "*?["


def _open_filesystem(uri: str, storage: StorageConfig) -> tuple[Any, str]:
    """The filesystem and path of ``uri``; an empty, path-less or unknown-protocol URI is a DatasetError."""
    if not uri or not uri.strip():
        raise DatasetError("the dataset URI is empty: give a Parquet file, folder or glob (a path or s3://...)")
    protocol, sep, rest = uri.partition("://")
    if sep and not rest.strip("/ "):
        raise DatasetError(f"the dataset URI {uri!r} has no path after {protocol}://: give bucket/key or a path")
    try:
        return filesystem(uri, storage)
    except (ValueError, ImportError, OSError) as exc:
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__  # hdfs: 1 line
        if isinstance(exc, ValueError) and "Protocol not known" in text:
            text = f"unknown protocol {protocol + '://'!r}; use a path, file://, s3://, gs:// or az://"
        raise DatasetError(f"cannot open the dataset's storage: {text}", uri=uri) from None


def _list_files(fs: Any, path: str, uri: str) -> list[str]:
    is_glob = any(ch in path for ch in _GLOB_CHARS)
    try:
        if is_glob:
            matched = sorted(fs.glob(path))
            found = [p for p in matched if not fs.isdir(p)]
        elif fs.isdir(path):
            matched = sorted(fs.find(path))
            found = [
                p
                for p in matched
                if p.endswith((".parquet", ".pq"))
                and not any(part.startswith(("_", ".")) for part in p[len(path) :].split("/"))
            ]
        elif fs.exists(path):
            matched = found = [path]
        else:
            raise StorageError(_not_found(fs, path, uri))
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - every storage failure becomes one clear message
        raise translate_storage_error(exc, uri, fs=fs) from None
    if not found:
        if is_glob:
            what = "the glob matched no files" if not matched else f"the glob matched only folders ({len(matched)})"
        elif matched:
            what = (
                f"the folder has no .parquet/.pq files ({len(matched)} other file(s); names starting "
                "with _ or . are ignored)"
            )
        else:
            what = "the folder is empty"
        raise DatasetError(f"no Parquet files found: {what}", uri=uri)
    return found


def _not_found(fs: Any, path: str, uri: str) -> str:
    """``dataset not found: <uri>``, saying so when the bucket itself is missing (object stores)."""
    protocol = uri.partition("://")[0].lower() if "://" in uri else "file"
    bucket = path.split("/", 1)[0]
    if protocol not in ("file", "local") and bucket:
        try:
            if not fs.exists(bucket):
                return f"dataset not found: {uri} (bucket {protocol}://{bucket} does not exist)"
        except Exception:  # noqa: BLE001 - best effort: keep the plain message
            pass
    return f"dataset not found: {uri}"


def type_name(t: pa.DataType) -> str:
    """A type as users read it: ``list<string>`` (pyarrow and Delta name list items differently)."""
    return str(t).replace("item: ", "").replace("element: ", "")


def _check_same_schema(schema0: pa.Schema, uri0: str, schema: pa.Schema, uri: str, role_columns: Iterable[str]) -> None:
    """Every file must have the first file's columns with the same types.

    Role columns may differ in string flavour (``string``/``large_string``, ``list``/``large_list``): they are
    cast when read. Pass-through columns must match exactly: they are copied to the results as they are.
    """
    names0, names = set(schema0.names), set(schema.names)
    missing = [n for n in schema0.names if n not in names]
    if missing:
        raise DatasetError(
            f"schema differs from the first file {uri0}: column(s) {', '.join(map(repr, missing))} missing",
            uri=uri,
            column=missing[0],
        )
    extra = [n for n in schema.names if n not in names0]
    if extra:
        raise DatasetError(
            f"schema differs from the first file {uri0}: extra column(s) {', '.join(map(repr, extra))}",
            uri=uri,
            column=extra[0],
        )
    roles = set(role_columns)
    for name in schema0.names:
        t0, t = schema0.field(name).type, schema.field(name).type
        if t0 == t:
            continue
        if name in roles and ((_is_string(t0) and _is_string(t)) or (_is_string_list(t0) and _is_string_list(t))):
            continue
        raise DatasetError(
            f"schema differs from the first file {uri0}: expected {type_name(t0)}, found {type_name(t)}",
            uri=uri,
            column=name,
        )


def _resolve_columns(
    schema: pa.Schema,
    overrides: Mapping[str, str],
    metric: str,
    uri: str,
    context_supplied: bool = False,
    traces: bool = False,
) -> dict[str, str]:
    names = set(schema.names)
    columns: dict[str, str] = {}
    for role in ROLES:
        if role == "messages" and not traces:
            continue  # without a trace option a messages column is an ordinary pass-through column
        if role in overrides:
            if overrides[role] not in names:
                raise DatasetError(
                    f"column {overrides[role]!r} given for {role} is not in the file; it has {', '.join(schema.names)}",
                    uri=uri,
                    column=overrides[role],
                )
            columns[role] = overrides[role]
            continue
        for candidate in DEFAULT_NAMES[role]:
            if candidate in names:
                columns[role] = candidate
                break
    for role in REQUIRED[metric]:
        if role == "retrieval_context" and context_supplied:
            continue
        if role not in columns:
            raise DatasetError(
                f"no {role} column for {metric}: expected one of {', '.join(DEFAULT_NAMES[role])} or "
                f"--column {role}=NAME; the file has {', '.join(schema.names)}",
                uri=uri,
                column=role,
            )
    if traces and "messages" not in columns:
        raise DatasetError(
            f"no messages column for --context-from/--context-extractor: expected messages or --column "
            f"messages=NAME; the file has {', '.join(schema.names)}",
            uri=uri, column="messages",
        )  # fmt: skip
    for role, col in columns.items():
        t = schema.field(col).type
        if role == "messages":
            if not (_is_string(t) or (any(f(t) for f in _LIST_TYPES) and pa.types.is_struct(t.value_type))):
                raise DatasetError(
                    f"messages: expected list<struct> (chat messages) or string (their JSON), found {type_name(t)}",
                    uri=uri, column=col,
                )  # fmt: skip
        elif role == "retrieval_context":
            if not _is_string_list(t):
                raise DatasetError(f"{role}: expected list<string>, found {type_name(t)}", uri=uri, column=col)
        elif role == "row_id":
            if not (_is_string(t) or pa.types.is_integer(t)):
                raise DatasetError(f"row_id: expected string or integer, found {type_name(t)}", uri=uri, column=col)
        elif not (_is_string(t) or pa.types.is_null(t)):
            raise DatasetError(f"{role}: expected string, found {type_name(t)}", uri=uri, column=col)
    return columns


def open_dataset(
    uri: str,
    storage: StorageConfig,
    metric: str = "contextual_recall",
    overrides: Mapping[str, str] | None = None,
    context_supplied: bool = False,
    traces: bool = False,
) -> Dataset:
    """List and validate every file of the dataset; raise one clear error, or return the dataset.

    ``context_supplied``: contexts come from a retriever or retrieval results, so the dataset needs none.
    ``traces``: contexts come from the ``messages`` column (agent traces, ``io/traces.py``), which is then required.

    Reads only footers (and the ``row_id`` column when there is one). See the module docstring for what is
    refused and what is handled per row.
    """
    if metric not in REQUIRED:
        raise DatasetError(f"unknown metric {metric!r}; choose {', '.join(REQUIRED)}")
    fs, path = _open_filesystem(uri, storage)
    paths = _list_files(fs, path, uri)
    proto = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    files: list[DatasetFile] = []
    columns: dict[str, str] | None = None
    schema0: pa.Schema | None = None
    for p in paths:
        file_uri = proto + p if proto and proto != "file://" else p
        try:
            with fs.open(p, "rb") as fh:
                meta = pq.ParquetFile(fh).metadata
                schema = meta.schema.to_arrow_schema()
            info = fs.info(p)
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            if isinstance(exc, FileNotFoundError | PermissionError):
                raise translate_storage_error(exc, file_uri, fs=fs) from None
            raise DatasetError(f"not a readable Parquet file: {_one_line(exc)}", uri=file_uri) from None
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, file_uri, fs=fs) from None
        _check_unique_names(schema, file_uri)
        file_columns = _resolve_columns(schema, overrides or {}, metric, file_uri, context_supplied or traces, traces)
        if schema0 is not None:
            _check_same_schema(schema0, files[0].uri, schema, file_uri, file_columns.values())
        if columns is None:
            columns, schema0 = file_columns, schema
        elif file_columns != columns:
            raise DatasetError(f"columns differ from the first file's ({columns} vs {file_columns})", uri=file_uri)
        stamp = f"{p}|{info.get('size')}|{info.get('ETag') or info.get('mtime') or ''}|{meta.num_rows}"
        files.append(
            DatasetFile(
                path=p,
                uri=file_uri,
                num_rows=meta.num_rows,
                num_row_groups=meta.num_row_groups,
                fingerprint=hashlib.sha256(stamp.encode()).hexdigest()[:16],
            )
        )
    assert columns is not None and schema0 is not None
    num_rows = sum(f.num_rows for f in files)
    if num_rows == 0:
        where = files[0].uri if len(files) == 1 else f"{uri} ({len(files)} files)"
        raise DatasetError(f"dataset has no rows: {where} holds 0 rows; check the export that wrote it", uri=uri)
    role_cols = set(columns.values())
    passthrough = [n for n in schema0.names if n not in role_cols]
    types = _passthrough_types(schema0, passthrough, files[0].uri)
    ds = Dataset(
        uri=uri,
        name=dataset_name(uri),
        identity=normalize_uri(uri),
        files=files,
        columns=columns,
        passthrough=passthrough,
        fs=fs,
        num_rows=num_rows,
        fingerprint=hashlib.sha256("".join(f.fingerprint for f in files).encode()).hexdigest()[:16],
        has_row_id="row_id" in columns,
        passthrough_types=types,
    )
    if ds.has_row_id:
        _check_unique_ids(ds)
    return ds


def _check_unique_names(schema: pa.Schema, uri: str) -> None:
    """Every column name once, also ignoring case (Delta Lake and most SQL engines do)."""
    seen: dict[str, str] = {}
    for name in schema.names:
        other = seen.get(name.lower())
        if other is not None:
            what = (
                f"column {name!r} appears twice"
                if other == name
                else f"columns {other!r} and {name!r} differ only in case"
            )
            raise DatasetError(f"duplicate column names: {what}; give every column a unique name", uri=uri, column=name)
        seen[name.lower()] = name


def _passthrough_types(schema: pa.Schema, passthrough: list[str], uri: str) -> dict[str, pa.DataType]:
    """The stored type of each pass-through column, or one DatasetError naming file, column and found type.

    Also refuses names that would collide in the results table: a name of a result column (compared ignoring
    case) is stored as ``data_<name>``, which must not be another pass-through column.
    """
    from recall_tasks.io.schemas import passthrough_name

    types: dict[str, pa.DataType] = {}
    stored: dict[str, str] = {}
    for name in passthrough:
        t = schema.field(name).type
        try:
            types[name] = stored_type(t)
        except _Unstorable as why:
            raise DatasetError(
                f"pass-through column of type {type_name(t)} cannot be stored in the results table: {why}",
                uri=uri, column=name,
            ) from None  # fmt: skip
        target = passthrough_name(name)
        other = stored.get(target.lower())
        if other is not None:
            raise DatasetError(
                f"pass-through columns {other!r} and {name!r} would both be stored as {target!r} (result column "
                "names are compared ignoring case, a colliding one becomes data_<name>); rename one",
                uri=uri, column=name,
            )  # fmt: skip
        stored[target.lower()] = name
    return types


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (pyarrow's span several), clipped."""
    text = " ".join(str(exc).split())
    return text[:300] if text else type(exc).__name__


def _check_unique_ids(ds: Dataset) -> None:
    col = ds.columns["row_id"]
    seen: dict[str, tuple[str, int]] = {}
    dups: list[str] = []
    for f in ds.files:
        try:
            with ds.fs.open(f.path, "rb") as fh:
                pf = pq.ParquetFile(fh)
                offset = 0
                for g in range(pf.num_row_groups):
                    values = pf.read_row_group(g, columns=[col]).column(0).to_pylist()
                    for i, v in enumerate(values):
                        if v is None or str(v) == "":
                            raise DatasetError(
                                f"row_id is {'null' if v is None else 'empty'}: every row needs an id",
                                uri=f.uri,
                                row=offset + i,
                                column=col,
                            )
                        key = str(v)
                        if key in seen:
                            first_uri, first_row = seen[key]
                            where = "" if first_uri == f.uri else f" of {first_uri}"
                            dups.append(f"{key!r} (rows {first_row}{where} and {offset + i} of {f.uri})")
                        else:
                            seen[key] = (f.uri, offset + i)
                    offset += len(values)
        except DatasetError:
            raise
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            if isinstance(exc, FileNotFoundError | PermissionError):
                raise translate_storage_error(exc, f.uri, fs=ds.fs) from None
            raise DatasetError(f"row_id cannot be read: {_one_line(exc)}", uri=f.uri, column=col) from None
    if dups:
        shown = "; ".join(dups[:5]) + (f"; and {len(dups) - 5} more" if len(dups) > 5 else "")
        raise DatasetError(f"row_id must be unique; {len(dups)} duplicate(s): {shown}", uri=ds.uri, column=col)


def content_hash(values: tuple[Any, ...]) -> str:
    """Stable hash of a row's judged content (question, expected, context, answer).

    Each value is tagged (``\0N`` null, ``\0S`` string, ``\0L`` list then ``\0I`` per item) so that no two
    different rows give the same byte stream; the stream is built as one string and hashed in one call.
    """
    parts: list[str] = []
    for v in values:
        if v is None:
            parts.append("\x00N")
        elif isinstance(v, list):
            parts.append("\x00L")
            for item in v:
                parts.append("\x00I")
                parts.append(item if type(item) is str else str(item))
        else:
            parts.append("\x00S")
            parts.append(v if type(v) is str else str(v))
    return hashlib.blake2b("".join(parts).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def identity_hash(question: str | None, expected: str | None) -> str:
    """A row's id without a ``row_id`` column: question and reference answer only (``ROW_IDENTITY``)."""
    return content_hash(("\x00identity/v2", question, expected))


def read_contexts(ds: Dataset, refs: list[tuple[str, int, str | None]]) -> dict[tuple[str, int], list[str]]:
    """The retrieval context of a few rows, by (file URI, 0-based row in the file), for reports.

    A row is returned only when its content still hashes to the ``content_hash`` the run recorded: the
    dataset file may have been rewritten since (a re-index), and showing today's chunks beside last week's
    verdicts would mislead. Contexts supplied at run time (retriever, retrieval results) never match.
    """
    by_file: dict[str, list[tuple[int, str | None]]] = {}
    for uri, row, digest in refs:
        by_file.setdefault(uri, []).append((row, digest))
    files = {f.uri: f for f in ds.files}
    out: dict[tuple[str, int], list[str]] = {}
    read_cols = list(dict.fromkeys(ds.columns.values()))
    roles_only = replace(ds, passthrough=[])
    for uri, wanted in by_file.items():
        f = files.get(uri)
        if f is None:
            continue
        with ds.fs.open(f.path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            starts = [0]
            for g in range(pf.num_row_groups):
                starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
            by_group: dict[int, list[tuple[int, str | None]]] = {}
            for row, digest in wanted:
                if 0 <= row < starts[-1]:
                    by_group.setdefault(bisect.bisect_right(starts, row) - 1, []).append((row, digest))
            for group, members in by_group.items():  # each needed row group read once
                table = pf.read_row_group(group, columns=read_cols)
                for row, digest in members:
                    block = _block(roles_only, uri, row, table.slice(row - starts[group], 1), ds.columns, {})
                    if block.content_hashes[0] == digest:
                        out[(uri, row)] = [c or "" for c in block.table.column("retrieval_context")[0].as_py() or []]
    return out


def iter_blocks(ds: Dataset, block_rows: int) -> Iterator[RowBlock]:
    """Stream the dataset as blocks of at most ``block_rows`` rows, one row group in memory at a time."""
    if block_rows < 1:
        raise DatasetError(f"chunk size must be at least 1, got {block_rows}")
    role_cols = {role: col for role, col in ds.columns.items()}
    read_cols = list(dict.fromkeys([*role_cols.values(), *ds.passthrough]))
    seen: dict[str, int] = {}
    for f in ds.files:
        try:
            fh = ds.fs.open(f.path, "rb")
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, f.uri) from None
        with fh:
            pf = pq.ParquetFile(fh)
            offset = 0
            for g in range(pf.num_row_groups):
                try:
                    group = pf.read_row_group(g, columns=read_cols)
                except (pa.ArrowInvalid, OSError) as exc:
                    if isinstance(exc, FileNotFoundError | PermissionError):
                        raise translate_storage_error(exc, f.uri, fs=ds.fs) from None
                    rows = pf.metadata.row_group(g).num_rows
                    raise DatasetError(
                        f"row group {g} (rows {offset}-{offset + rows - 1}) cannot be read: {_one_line(exc)}",
                        uri=f.uri,
                    ) from None
                for start in range(0, group.num_rows, block_rows):
                    part = group.slice(start, block_rows)
                    yield _block(ds, f.uri, offset + start, part, role_cols, seen)
                offset += group.num_rows


def _block(
    ds: Dataset, uri: str, first_row: int, part: pa.Table, role_cols: dict[str, str], seen: dict[str, int]
) -> RowBlock:
    arrays: dict[str, pa.Array | pa.ChunkedArray] = {}
    for role in ("input", "expected_output", "retrieval_context", "actual_output"):
        col = role_cols.get(role)
        typ = pa.list_(pa.string()) if role == "retrieval_context" else pa.string()
        if col is None:
            arrays[role] = pa.nulls(part.num_rows, typ)
        else:
            arrays[role] = part.column(col).cast(typ)
    if "messages" in role_cols:  # as stored: list<struct> or JSON text (read by io/traces.py)
        arrays["messages"] = part.column(role_cols["messages"])
    content = list(
        zip(
            *(arrays[r].to_pylist() for r in ("input", "expected_output", "retrieval_context", "actual_output")),
            strict=True,
        )
    )
    hashes = [content_hash(row) for row in content]
    if ds.has_row_id:
        row_ids = [str(v) for v in part.column(role_cols["row_id"]).to_pylist()]
    else:
        row_ids = []
        for question, expected, _, _ in content:
            h = identity_hash(question, expected)
            n = seen.get(h, 0) + 1
            seen[h] = n
            row_ids.append(h if n == 1 else f"{h}~{n}")
    for name in ds.passthrough:
        if name not in arrays:
            column = part.column(name)
            target = ds.passthrough_types.get(name, column.type)
            # safe=False: timestamps are truncated to microseconds; every other cast is lossless (stored_type)
            arrays[name] = column if column.type == target else column.cast(target, safe=False)
    return RowBlock(source=uri, first_row=first_row, row_ids=row_ids, content_hashes=hashes, table=pa.table(arrays))


def read_block(ds: Dataset, source: str, first_row: int, rows: int, seen: Mapping[str, int] | None = None) -> RowBlock:
    """Re-read the one block :func:`iter_blocks` yielded at ``(source, first_row)`` with ``rows`` rows.

    ``seen``: for each identity hash of the block that occurred earlier in the dataset, how many times (what
    :func:`iter_blocks`' running count held before the block), so duplicate rows get the same ``~N`` ids.
    A block never spans row groups, so one row group is read. Used by worker processes (``pipeline/workers.py``).
    """
    f = next((f for f in ds.files if f.uri == source), None)
    if f is None:
        raise DatasetError(f"no file {source} in the dataset any more: it changed during the run", uri=ds.uri)
    read_cols = list(dict.fromkeys([*ds.columns.values(), *ds.passthrough]))
    try:
        fh = ds.fs.open(f.path, "rb")
    except Exception as exc:  # noqa: BLE001
        raise translate_storage_error(exc, f.uri) from None
    with fh:
        pf = pq.ParquetFile(fh)
        starts = [0]
        for g in range(pf.num_row_groups):
            starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
        if not 0 <= first_row < starts[-1]:
            raise DatasetError(f"row {first_row} is past the file's {starts[-1]} rows: it changed", uri=f.uri)
        g = bisect.bisect_right(starts, first_row) - 1
        try:
            group = pf.read_row_group(g, columns=read_cols)
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(exc, FileNotFoundError | PermissionError):
                raise translate_storage_error(exc, f.uri, fs=ds.fs) from None
            raise DatasetError(f"row group {g} cannot be read: {_one_line(exc)}", uri=f.uri) from None
    part = group.slice(first_row - starts[g], rows)
    return _block(ds, f.uri, first_row, part, dict(ds.columns), dict(seen or {}))
