"""Context precision from the recall verdicts: which retrieved chunks support at least one sentence.

No extra judge call: the recall judge already names, per supported sentence, the chunks that support it
(``chunk_ids``, 1-based positions in the retrieved order). A chunk is *relevant* when it supports at least one
sentence. Per row:

- ``context_precision``: rank-weighted precision, deepeval's formula: the mean, over the positions ``k`` of the
  relevant chunks, of precision@k (relevant chunks among the first ``k`` / ``k``); 0 when no chunk is relevant.
  A retriever that puts the supporting chunks first scores 1.0.
- ``chunks_used`` (relevant chunks) out of ``context_count`` (retrieved), and ``first_relevant_rank`` (null when
  none is relevant).

How it differs from deepeval's ContextualPrecision: deepeval asks an LLM, per chunk, whether the chunk is
"useful to arrive at the expected output" (one more call per row, n verdicts). Here relevance is evidence of
attribution: a chunk counts only if the judge cited it for a sentence of the reference. They disagree when a
chunk is on topic but supports no sentence (deepeval may call it relevant, here it is not), and when the judge
cites one chunk of several that say the same thing (the others count as not relevant here). Unsupported
sentences cite no chunk, so a row whose context supports nothing has precision 0 and no first relevant rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkUse:
    """The context-precision figures of one row."""

    context_precision: float
    chunks_used: int
    first_relevant_rank: int | None


def chunk_use(supported_chunk_ids: Iterable[Sequence[int]], context_count: int) -> ChunkUse:
    """Figures from the ``chunk_ids`` of the SUPPORTED sentences (ids outside 1..context_count are ignored)."""
    relevant = sorted({i for ids in supported_chunk_ids for i in ids if 1 <= i <= context_count})
    if not relevant:
        return ChunkUse(0.0, 0, None)
    # the j-th relevant chunk (1-based j) at position k contributes precision@k = j / k
    precision = sum(j / k for j, k in enumerate(relevant, 1)) / len(relevant)
    return ChunkUse(precision, len(relevant), relevant[0])
