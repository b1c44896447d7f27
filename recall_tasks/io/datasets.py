"""Reading evaluation datasets: Parquet from any fsspec URI, validated before any judge call, streamed.

JSON lines and CSV files are read too, converted to Parquet in memory first (``io/textfiles.py``), and go through
the same checks.

Decisions:
- Files are read one row group at a time (``ParquetFile.read_row_group`` with only the needed columns);
  the whole dataset is never in memory. Write datasets with row groups of ~10-100k rows.
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
- a JSON lines or CSV file whose text is not UTF-8 (named by line, row and column: ``io/textfiles.py``);
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
- a pass-through column (copied to the results as it is) of a type the results table cannot hold
  (``io/columns.stored_type`` says which types are stored how, and which are refused).

Handled, not refused: null or blank values in a row (``expected_output`` null/empty/whitespace/no sentence,
an empty context list, context items that are all null or blank, a ``list<null>`` context column) make that
row "missing" and follow ``on_missing`` (error/zero/skip, counted in the run summary).

The columns (roles, overrides, types) are checked by ``io/columns.py``; the rows are read by ``io/blocks.py``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from recall_tasks.errors import DatasetError, StorageError
from recall_tasks.io.columns import (
    DEFAULT_NAMES,
    REQUIRED,
    check_same_schema,
    check_unique_names,
    passthrough_types,
    resolve_columns,
    text_columns,
)
from recall_tasks.io.storage import (
    StorageConfig,
    filesystem,
    is_local,
    normalize_uri,
    read_error,
    translate_storage_error,
)
from recall_tasks.io.textfiles import EXPECTED, TEXT_SUFFIXES, open_parquet

#: Recorded per run (``runs.row_identity``): how its rows got their ids, so comparisons pair like with like.
ROW_IDENTITY = "input+expected_output/v2"
ROW_ID_COLUMN_IDENTITY = "row_id column"


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
    json_columns: tuple[str, ...] = ()  # CSV columns decoded from JSON text (io/textfiles.py)
    text_columns: tuple[str, ...] = ()  # CSV columns read as text, not type-inferred (io/columns.text_columns)

    @property
    def row_identity(self) -> str:
        """How this dataset's rows are identified across runs (see the module docstring)."""
        return ROW_ID_COLUMN_IDENTITY if self.has_row_id else ROW_IDENTITY


def dataset_name(uri: str) -> str:
    """A short name for partitioning: the file or folder name without extension."""
    tail = uri.rstrip("/").split("/")[-1] or "dataset"
    for ext in (".parquet", ".pq", *TEXT_SUFFIXES):
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
                "with _ or . are ignored; give a JSON lines or CSV file by its path or a glob)"
            )
        else:
            what = "the folder is empty"
        raise DatasetError(f"no Parquet files found: {what}", uri=uri)
    return found


def _not_found(fs: Any, path: str, uri: str) -> str:
    """``dataset not found: <uri>``, saying so when the bucket itself is missing (object stores)."""
    bucket = path.split("/", 1)[0]
    if not is_local(fs) and bucket:
        protocol = uri.partition("://")[0].lower()
        try:
            if not fs.exists(bucket):
                return f"dataset not found: {uri} (bucket {protocol}://{bucket} does not exist)"
        except Exception:  # noqa: BLE001 - best effort: keep the plain message
            pass
    return f"dataset not found: {uri}"


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
    json_columns = (overrides or {}).get("retrieval_context")
    json_cols = (json_columns,) if json_columns else DEFAULT_NAMES["retrieval_context"]
    text_cols = text_columns(overrides or {})
    files: list[DatasetFile] = []
    columns: dict[str, str] | None = None
    schema0: pa.Schema | None = None
    for p in paths:
        file_uri = p if is_local(fs) else proto + p
        try:
            with fs.open(p, "rb") as fh:
                meta = open_parquet(fs, p, file_uri, fh, json_cols, text_cols).metadata
                schema = meta.schema.to_arrow_schema()
            info = fs.info(p)
        except DatasetError:
            raise
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            raise read_error(exc, file_uri, "not a readable Parquet file", fs=fs, hint=f"; {EXPECTED}") from None
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, file_uri, fs=fs) from None
        check_unique_names(schema, file_uri)
        file_columns = resolve_columns(schema, overrides or {}, metric, file_uri, context_supplied or traces, traces)
        if schema0 is not None:
            check_same_schema(schema0, files[0].uri, schema, file_uri, file_columns.values())
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
    types = passthrough_types(schema0, passthrough, files[0].uri)
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
        json_columns=json_cols,
        text_columns=text_cols,
    )
    if ds.has_row_id:
        _check_unique_ids(ds)
    return ds


def _check_unique_ids(ds: Dataset) -> None:
    """Every ``row_id`` present, non-empty and unique; a duplicate is named with its first occurrence.

    Two passes over the id column, a batch at a time. The first checks each id and keeps only its 64-bit hash
    (Python's ``hash`` of the id as text: one process, so one seed), 8 bytes a row; sorted, equal hashes are the
    only candidates. Only when there are some, the second pass keeps those ids' first rows and compares the ids
    themselves (two distinct ids with one hash are not reported). A dict of every id to its row held ~200 bytes a
    row while the check ran: +200 MiB for a 1,000,000-row dataset (issue 42, item 3).
    """
    col = ds.columns["row_id"]
    hashes = array("q")
    for uri, offset, values in _id_batches(ds, col):
        for i, v in enumerate(values):
            if v is None or str(v) == "":
                raise DatasetError(
                    f"row_id is {'null' if v is None else 'empty'}: every row needs an id",
                    uri=uri,
                    row=offset + i,
                    column=col,
                )
        hashes.extend(_id_hash(str(v)) for v in values)
    if len(hashes) < 2:
        return
    ordered = np.sort(np.frombuffer(hashes, dtype=np.int64))
    del hashes
    candidates = set(np.unique(ordered[1:][ordered[1:] == ordered[:-1]]).tolist())
    del ordered
    if not candidates:
        return
    seen: dict[str, tuple[str, int]] = {}
    dups: list[str] = []
    for uri, offset, values in _id_batches(ds, col):
        for i, v in enumerate(values):
            key = str(v)
            if _id_hash(key) not in candidates:
                continue
            if key in seen:
                first_uri, first_row = seen[key]
                where = "" if first_uri == uri else f" of {first_uri}"
                dups.append(f"{key!r} (rows {first_row}{where} and {offset + i} of {uri})")
            else:
                seen[key] = (uri, offset + i)
    if dups:
        shown = "; ".join(dups[:5]) + (f"; and {len(dups) - 5} more" if len(dups) > 5 else "")
        raise DatasetError(f"row_id must be unique; {len(dups)} duplicate(s): {shown}", uri=ds.uri, column=col)


_ID_BATCH_ROWS = 65_536
_id_hash = hash  # an id's 64-bit hash (tests replace it to force collisions)


def _id_batches(ds: Dataset, col: str) -> Iterator[tuple[str, int, list[Any]]]:
    """``(file URI, first row of the batch in its file, ids)`` for every batch of the ``row_id`` column."""
    for f in ds.files:
        try:
            with ds.fs.open(f.path, "rb") as fh:
                pf = open_parquet(ds.fs, f.path, f.uri, fh, ds.json_columns, ds.text_columns)
                offset = 0
                for batch in pf.iter_batches(batch_size=_ID_BATCH_ROWS, columns=[col]):
                    values = batch.column(0).to_pylist()
                    yield f.uri, offset, values
                    offset += len(values)
        except DatasetError:
            raise
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            raise read_error(exc, f.uri, "row_id cannot be read", fs=ds.fs, column=col) from None
