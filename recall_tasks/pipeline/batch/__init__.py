"""A run judged through the OpenAI Batch API (``--batch``): submit the row-cache misses, collect, then finish live.

The package: :mod:`.settle` (submit, wait, resubmit, collect), :mod:`.remote` (each remote step and the record
writes around it), :mod:`.record` (the record, one writer at a time by compare-and-swap, and what reads it without
a run), :mod:`.command` (what ``batch collect`` / ``cancel`` take from the command, never from the
record), :mod:`.finish` (the collected rows served to the live run), :mod:`.checks` (what ``--batch`` refuses).
The wire format and the calls are :mod:`recall_tasks.judges.batch` (the judge's layer). This ``__init__``
imports nothing: ``pipeline.steps`` imports :mod:`.checks` without pulling :mod:`.settle` (which
imports ``steps``) in.

- **Submit** (``settle.settle``, no record yet): every row the row cache cannot serve becomes a request line
  (``custom_id`` = its row-cache key, body = what the live judge would send), split at 50,000 lines / 200 MB,
  uploaded, and a batch created per part. The record ``<output>/_batches/<run key>.json`` is written before and
  after each remote step (:mod:`.remote`), by compare-and-swap (:mod:`.record`): the parts and their custom ids
  first, then ``uploading``, the file id, a claim, the batch id. A crash between the upload and the batch
  creation is resumed by the rerun from the recorded file id (or the upload found by its name, which carries the
  hash of its bytes), and the batch looked up by its metadata before another is created.
  The run is then **pending**: no commit, not in ``runs``, never a baseline; the flow returns a summary with the
  batch ids and the CLI tells to rerun the same command (the run key, hence the record, ignores the polling
  options).
- **Resubmit** (every batch ended, ``settle._resubmit``): the lines without a usable answer (failed or expired
  lines, the lines of a batch that ended failed, expired or cancelled without output, lines missing from a
  truncated output file) go ONCE into new batches, round 2 of the same record (``resubmitted`` is recorded with
  them, so a rerun never resubmits twice and a crash mid-submit is resumed). Not with ``--batch-fallback live``:
  those lines are judged live instead.
- **Collect** (every batch of every round ended): output lines are parsed by custom_id into the row cache, with
  tolerant parsing and one live repair call per unusable reply (``OpenAIJudge.finish_batch_reply``); an unknown
  custom_id is ignored with a warning. Lines still unanswered become row errors naming their last batch and line
  (and the first attempt's), or are judged live with ``--batch-fallback live``.
- **Collect only** (``batch_collect_only``: ``--collect-only``, ``recall-bench batch collect``, a deployment's
  collect schedule): a run whose parameters have no open record returns :data:`IDLE` and does nothing.
"""
