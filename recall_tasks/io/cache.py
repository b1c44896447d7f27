"""Row-level verdict cache, content addressed, stored next to the results (``<output>/cache`` by default).

Key: ``row_cache_key`` = hash(metric task, judge config incl. model, prompt version and parameters, sentence
splitter version, question, sentences, context chunks in order). Value: the judge's parsed response (JSON).
Only parsed verdicts are cached; errors never are.

Layout: Parquet *segments* (``seg-<run>-<n>.parquet``, columns ``key``, ``response``), each holding the
entries of one flush, never one object per row. A run reads the ``key`` column of every segment once (an
index of 16 bytes per entry, ``io/key_index.py``: key -> segment and row group) and then reads verdict payloads
only from the row groups a chunk hits: a chunk of an unchanged dataset hits the one or two row groups written when that
chunk was first judged, not the whole cache. Entries are flushed every ``flush_rows`` rows so a crash loses
at most that much judging; at the end of a run the small segments it wrote are compacted into one file that
keeps each of them as its own row group (so lookups stay that narrow). Segments are written whole (local:
temp file + rename; object stores: one PUT), so a reader never sees a partial segment; two runs writing the
same entries at once only duplicate them, which lookups tolerate.

Every entry is also appended, as it is put, to a journal on this machine (``io/journal.py``): a SIGKILL loses
only the judge calls in flight; the next cache opened on the URI writes dead journals to its store, like a spill.

The local spill: a flush the cache's store refuses (object storage down mid-run, credentials expired) writes its
segment under :func:`spill_dir` instead (``<state dir>/spill/<hash of the cache URI>``, on the machine running the
run), so judging that was paid for is not lost; this process keeps finding those entries. The next cache opened
on the same URI (a rerun: the store must be reachable to open it) uploads the spilled segments to the store,
deletes them locally and reads them from there.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import threading
import uuid
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recall_tasks.io import journal
from recall_tasks.io.key_index import KeyIndex
from recall_tasks.io.storage import StorageConfig, filesystem, is_local, normalize_uri, translate_storage_error
from recall_tasks.judges.base import JudgeResponse
from recall_tasks.settings import state_dir

log = logging.getLogger(__name__)

SEGMENT_SCHEMA = pa.schema([("key", pa.string()), ("response", pa.string())])
ROW_GROUP_ROWS = 2048  # entries per row group: the unit a lookup reads


def write_atomically(fs: Any, path: str, table: pa.Table, row_group_size: int | None = None) -> None:
    """Write a Parquet file so that readers see all of it or nothing."""
    options: dict[str, Any] = {"filesystem": fs, "compression": "zstd", "row_group_size": row_group_size}
    if is_local(fs):
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        pq.write_table(table, tmp, **options)
        os.replace(tmp, path)
    else:
        pq.write_table(table, path, **options)


def spill_dir(uri: str) -> Path:
    """Where the segments of the cache at ``uri`` go while its store refuses them (see the module docstring)."""
    return state_dir() / "spill" / hashlib.sha256(normalize_uri(uri).encode()).hexdigest()[:16]


class SegmentCache:
    """Content-addressed string payloads in Parquet segments (the layout above); thread-safe.

    Subclasses say what a payload is (:meth:`_encode`, :meth:`_decode`): verdicts, claims.
    """

    #: a sub-folder of the cache holding another store's segments (the claims cache), left out of the index
    SUBSTORE = "claims"

    def __init__(self, uri: str, storage: StorageConfig, *, read: bool = True, flush_rows: int = 2000) -> None:
        self.uri = uri
        self.storage = storage
        self.read = read
        self.flush_rows = flush_rows
        self.fs, self.root = filesystem(uri, storage)
        self._lock = threading.Lock()
        self._index = KeyIndex()  # key -> (segment, row group)
        self._segments: list[str] = []
        self._pending: dict[str, str] = {}
        self._written: list[str] = []
        self._run = uuid.uuid4().hex[:12]
        self._counter = itertools.count()
        self.hits = 0
        self.misses = 0
        self.stored = 0  # entries this instance wrote (an interrupted run reports them)
        self.spill = spill_dir(uri)
        self.spilled = 0  # entries this instance wrote to the local spill (its store refused them)
        self._spilled: dict[str, str] = {}  # and their payloads: still found by this process
        self._journal = journal.Journal(self.spill, self._run)
        self.row_groups_read = 0
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            self._upload_spill()
            if read:
                self._load_index()
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, uri) from None

    def _upload_spill(self) -> None:
        """Segments an earlier run spilled, and journals no live process holds, go to the store, then leave."""
        if not self.spill.is_dir():
            return
        for path, entries in journal.recover(self.spill):
            if entries:
                table = pa.table({"key": list(entries), "response": list(entries.values())}, schema=SEGMENT_SCHEMA)
                write_atomically(self.fs, f"{self.root}/seg-{path.stem}.parquet", table, ROW_GROUP_ROWS)
                log.info("recovered %d row-cache entries from %s into %s", len(entries), path, self.uri)
            path.unlink(missing_ok=True)
        for local in sorted(self.spill.glob("seg-*.parquet")):
            try:
                table = pq.read_table(local)
            except Exception as exc:  # noqa: BLE001 - a half-written spill file (a crash while spilling)
                log.warning("skipping unreadable spilled cache segment %s: %s", local, exc)
                continue
            write_atomically(self.fs, f"{self.root}/{local.name}", table, row_group_size=ROW_GROUP_ROWS)
            local.unlink(missing_ok=True)  # another process uploading the same spill may have taken it
            log.info("uploaded %d spilled row-cache entries from %s to %s", table.num_rows, local, self.uri)

    def _load_index(self) -> None:
        sub = f"{self.root.rstrip('/')}/{self.SUBSTORE}/"
        files = sorted(p for p in self.fs.find(self.root) if p.endswith(".parquet") and not p.startswith(sub))
        for path in files:
            try:
                with self.fs.open(path, "rb") as fh:
                    parquet = pq.ParquetFile(fh)
                    sizes = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
                    keys = parquet.read(columns=["key"]).column(0).to_pylist()
            except Exception as exc:  # noqa: BLE001 - an unreadable segment is skipped, not fatal
                log.warning("skipping unreadable cache segment %s: %s", path, exc)
                continue
            seg = len(self._segments)
            self._segments.append(path)
            self._add(seg, keys, sizes)

    def _add(self, seg: int, keys: list[str], row_group_sizes: list[int]) -> None:
        self._index.add(keys, seg, row_group_sizes)

    @property
    def size(self) -> int:
        return len(self._index)

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        """Cached payloads for ``keys`` (those present), reading only the row groups that hold them."""
        if not self.read:
            return {}
        groups_by_segment: dict[int, set[int]] = defaultdict(set)
        with self._lock:
            pending = {k: v for k in keys if (v := self._pending.get(k, self._spilled.get(k))) is not None}
            rest = [k for k in keys if k not in pending]
            wanted = []
            for k, where in zip(rest, self._index.find(rest), strict=True):
                if where is not None:
                    wanted.append(k)
                    groups_by_segment[where[0]].add(where[1])
            paths = {seg: self._segments[seg] for seg in groups_by_segment}
        found: dict[str, Any] = {k: self._decode(v) for k, v in pending.items()}
        value_set = pa.array(wanted, pa.string())
        for seg, group_set in groups_by_segment.items():
            groups = sorted(group_set)
            try:
                with self.fs.open(paths[seg], "rb") as fh:
                    table = pq.ParquetFile(fh).read_row_groups(groups)
            except Exception as exc:  # noqa: BLE001 - a vanished segment means misses, not a failed run
                log.warning("cache segment %s unreadable (%s); re-judging its rows", paths[seg], exc)
                continue
            self.row_groups_read += len(groups)
            table = table.filter(pc.is_in(table.column("key"), value_set=value_set))
            for key, payload in zip(table.column("key").to_pylist(), table.column("response").to_pylist(), strict=True):
                found[key] = self._decode(payload)
        self.hits += len(found)
        self.misses += len(keys) - len(found)
        return found

    def put_many(self, entries: Mapping[str, Any], *, flush: bool = True) -> bool:
        """Add entries (in memory, cheap); returns whether ``flush_rows`` is reached, flushing unless told not to.

        The async scorer passes ``flush=False`` and flushes in a worker thread when asked: no file I/O on the loop.
        """
        with self._lock:
            encoded = {key: self._encode(response) for key, response in entries.items()}
            self._pending.update(encoded)
            self._journalled(encoded)
            ready = len(self._pending) >= self.flush_rows
        if ready and flush:
            self.flush()
        return ready

    def _journalled(self, entries: dict[str, str]) -> None:
        """Journal the entries (under the lock). A journal that cannot be written is logged, never fatal: the
        entries are still flushed at the chunk's end."""
        try:
            self._journal.append(entries)
        except OSError as exc:
            log.warning("row-cache journal in %s not written (%s): entries wait for the next flush", self.spill, exc)

    @staticmethod
    def _decode(payload: str) -> Any:
        return json.loads(payload)

    @staticmethod
    def _encode(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    def flush(self) -> None:
        """Write pending entries as one segment."""
        with self._lock:
            if not self._pending:
                return
            batch, self._pending = self._pending, {}
            covering = self._journal.rotate()
            path = f"{self.root}/seg-{self._run}-{next(self._counter):06d}.parquet"
        table = pa.table({"key": list(batch), "response": list(batch.values())}, schema=SEGMENT_SCHEMA)
        try:
            write_atomically(self.fs, path, table, row_group_size=ROW_GROUP_ROWS)
        except Exception as exc:  # noqa: BLE001
            error = translate_storage_error(exc, self.uri)
            try:
                self.spill.mkdir(parents=True, exist_ok=True)
                local = self.spill / path.rsplit("/", 1)[-1]
                tmp = local.with_name(f"{local.name}.tmp-{uuid.uuid4().hex[:8]}")
                pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP_ROWS)
                os.replace(tmp, local)
            except OSError:
                with self._lock:  # keep them for the next flush (and their journal, for a rerun)
                    self._pending = {**batch, **self._pending}
                if covering is not None:
                    covering.close()  # unlocked: the next cache opened on this URI recovers it
                raise error from None
            journal.drop(covering)
            with self._lock:
                self._spilled.update(batch)
                self.spilled += len(batch)
            log.warning("row cache not saved to %s (%s): %d entries kept in %s", self.uri, error, len(batch), local)
            return
        journal.drop(covering)
        with self._lock:
            seg = len(self._segments)
            self._segments.append(path)
            full, rest = divmod(len(batch), ROW_GROUP_ROWS)
            self._add(seg, list(batch), [ROW_GROUP_ROWS] * full + ([rest] if rest else []))
            self._written.append(path)
            self.stored += len(batch)

    def close(self) -> None:
        """Flush, then compact the segments this run wrote into one (streamed: one segment in memory at a time).

        The in-memory index (16 bytes per entry) is dropped: a closed cache answers no lookups.
        """
        try:
            self._compact()
        finally:
            with self._lock:
                self._index, self._segments, self.read = KeyIndex(), [], False
                kept = self._journal.rotate()
            if kept is not None:  # entries a failed flush kept stay in it, unlocked: a rerun recovers them
                kept.close()

    def _compact(self) -> None:
        self.flush()
        with self._lock:
            written, self._written = self._written, []
        if len(written) < 2:
            return
        merged = f"{self.root}/seg-{self._run}-all.parquet"
        tmp = f"{merged}.tmp-{uuid.uuid4().hex[:8]}" if is_local(self.fs) else merged
        try:
            with self.fs.open(tmp, "wb") as fh, pq.ParquetWriter(fh, SEGMENT_SCHEMA, compression="zstd") as writer:
                for path in written:  # one row group (or more) per segment: lookups stay as narrow as before
                    writer.write_table(pq.read_table(path, filesystem=self.fs), row_group_size=ROW_GROUP_ROWS)
            if tmp != merged:
                os.replace(tmp, merged)
            for p in written:
                self.fs.rm(p)
        except Exception as exc:  # noqa: BLE001 - compaction is an optimisation; the segments stay valid
            log.warning("cache compaction failed: %s", exc)


class RowVerdictCache(SegmentCache):
    """Content-addressed verdicts (``JudgeResponse``); implements ``scoring.RowCache``.

    :attr:`claims` is the claims cache of the same output (a :class:`ClaimCache` in ``<cache>/claims``, opened on
    first use); :meth:`flush` and :meth:`close` flush and compact it too.
    """

    def __init__(self, uri: str, storage: StorageConfig, *, read: bool = True, flush_rows: int = 2000) -> None:
        super().__init__(uri, storage, read=read, flush_rows=flush_rows)
        self._claims: ClaimCache | None = None
        #: ``<run id>/<attempt>`` of the run writing (set by its plan): each entry it puts records it as ``paid_by``
        self.attempt: str | None = None
        self._owed_taken: set[str] = set()

    def get_many(self, keys: list[str]) -> dict[str, JudgeResponse]:
        return super().get_many(keys)

    def put_many(self, entries: Mapping[str, JudgeResponse], *, flush: bool = True) -> bool:
        if self.attempt is not None:
            entries = {k: v.model_copy(update={"paid_by": self.attempt}) for k, v in entries.items()}
        return super().put_many(entries, flush=flush)

    def owed(self, key: str, response: JudgeResponse) -> bool:
        """Whether a hit was paid for by an earlier attempt of this same run (interrupted, crashed, a worker died:
        it committed nothing), the first time this process sees the key: the run then records its requests, tokens
        and cost as its own (the row is not ``cached``), so what the interrupted attempt paid is in the runs table.

        A run id is reused only by the attempts of one unfinished run, so an entry of another run never counts.
        Calls in flight when the attempt stopped left no entry: those are not counted. With worker processes, a
        duplicate row may be counted by two workers.
        """
        if self.attempt is None or response.paid_by is None or response.paid_by == self.attempt:
            return False
        if response.paid_by.split("/", 1)[0] != self.attempt.split("/", 1)[0]:
            return False
        with self._lock:
            if key in self._owed_taken:
                return False
            self._owed_taken.add(key)
        return True

    @staticmethod
    def _decode(payload: str) -> Any:
        return JudgeResponse.model_validate_json(payload)

    @staticmethod
    def _encode(value: Any) -> str:
        if value.paid_by is None:
            return str(value.model_dump_json())
        return json.dumps({**value.model_dump(mode="json"), "paid_by": value.paid_by}, ensure_ascii=False)

    @property
    def claims(self) -> ClaimCache:
        """The output's claims cache, next to the verdicts (``<cache>/claims``), opened on first use."""
        with self._lock:
            if self._claims is None:
                self._claims = ClaimCache(f"{self.uri.rstrip('/')}/{self.SUBSTORE}", self.storage, read=self.read)
            return self._claims

    def flush(self) -> None:
        """Write pending entries as one segment (and the claims cache's, if open)."""
        if self._claims is not None:
            self._claims.flush()
        super().flush()

    def close(self) -> None:
        if self._claims is not None:
            self._claims.close()
        super().close()


class ClaimCache(SegmentCache):
    """Extracted claims by ``metrics.claims.claims_key`` (extractor model, prompt version, reference), no expiry.

    The same segment storage as the verdicts (same layout, flushes, compaction); the payload is the JSON of
    ``{"claims": [...] | null, "flags": [...]}`` (null: the extraction was unusable and the row fell back to
    sentences). Implements ``metrics.claims.ClaimStore``.
    """

    SUBSTORE = "\x00none"  # nothing below it

    def get_many(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        return super().get_many(keys)

    def put_many(self, entries: Mapping[str, dict[str, Any]], *, flush: bool = True) -> bool:
        return super().put_many(entries, flush=flush)
