"""Rebuild ``recall_tasks/data/tokens.txt``, the word table of ``recall_tasks/judges/tokens.py``, and check the
estimator against real tokenizers.

Needs ``tiktoken`` and the two BPE files (``cl100k_base.tiktoken``, ``o200k_base.tiktoken``: tiktoken downloads
them, or a package that bundles them), none of which recall-bench ships or installs::

    python -m benchmarks.token_table --cl100k PATH --o200k PATH            # writes the table
    python -m benchmarks.token_table --cl100k PATH --o200k PATH --check    # the estimator against both

The table: the ``WORDS`` most frequent words (ASCII letters, lower case, capitalised or all capitals; by their
rank in cl100k_base, a proxy for frequency) that are a token in either vocabulary, each with the most tokens
either tokenizer gives it after a space, alone, and after one punctuation or control character. A word is kept
for a form only when that count is below its bytes (what the estimator counts without the table); the prefixed
form is checked for every prefix the estimator treats alike. ``--check`` compares the estimate with both
tokenizers on random text of every script and on the repository's docs and prompts, and prints the worst ratios.
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import string
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "recall_tasks" / "data" / "tokens.txt"
WORDS = 20_000
#: the characters that may stand before a word in its piece (not a letter, digit, CR or LF), ASCII only
PREFIXES = [chr(c) for c in range(128) if not chr(c).isalnum() and chr(c) not in "\r\n "]

O200K_PAT = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
])  # fmt: skip
CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)


def encodings(cl100k: str, o200k: str) -> list[Any]:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    return [
        tiktoken.Encoding("cl100k_base", pat_str=CL100K_PAT, mergeable_ranks=load_tiktoken_bpe(cl100k),
                          special_tokens={}),
        tiktoken.Encoding("o200k_base", pat_str=O200K_PAT, mergeable_ranks=load_tiktoken_bpe(o200k),
                          special_tokens={}),
    ]  # fmt: skip


def most(encs: list[Any], texts: list[str]) -> list[int]:
    """The most tokens either tokenizer gives each text."""
    counts = [[len(t) for t in enc.encode_ordinary_batch(texts)] for enc in encs]
    return [max(c) for c in zip(*counts, strict=True)]


def build(encs: list[Any]) -> str:
    ranks: dict[str, int] = {}
    for enc in encs:
        for token, rank in enc._mergeable_ranks.items():
            try:
                text = token.decode("ascii")
            except UnicodeDecodeError:
                continue
            word = text[1:] if text.startswith(" ") else text
            if re.fullmatch(r"[A-Z]?[a-z]+|[A-Z]+", word):
                ranks[word] = min(ranks.get(word, 1 << 30), rank)
    words = sorted(ranks, key=ranks.__getitem__)[:WORDS]
    spaced = most(encs, [" " + w for w in words])
    alone = most(encs, words)
    prefixed = [0] * len(words)
    for p in PREFIXES:
        prefixed = [max(a, b) for a, b in zip(prefixed, most(encs, [p + w for w in words]), strict=True)]
    groups: dict[str, list[str]] = {}
    for word, *counts in zip(words, spaced, alone, prefixed, strict=True):
        sizes = (len(word) + 1, len(word), len(word) + 1)
        key = "".join(str(n) if n < size and n < 10 else "0" for n, size in zip(counts, sizes, strict=True))
        if key != "000":
            groups.setdefault(key, []).append(word)
    runs = ["".join(t) for n in (2, 3) for t in itertools.product(string.punctuation, repeat=n)]
    for key, texts in (("q", runs), ("r", [" " + r for r in runs])):
        groups[key] = [r for r, n in zip(runs, most(encs, texts), strict=True) if n == 1]
    lines = [
        "# The word table of recall_tasks/judges/tokens.py: benchmarks/token_table.py made it from cl100k_base and",
        "# o200k_base. A line is a key and words. The key's digits are the most tokens either tokenizer gives the",
        "# word after a space, alone and after one punctuation or control character (0: its bytes, no fewer).",
        "# q and r: runs of two or three punctuation characters of one token in both, alone and after a space.",
    ]
    lines += [f"{key} {' '.join(sorted(groups[key]))}" for key in sorted(groups)]
    return "\n".join(lines) + "\n"


def _random_texts(rng: random.Random) -> dict[str, list[str]]:
    from recall_tasks.judges import tokens

    table = list(tokens._table().get("s", {}))

    def span(a: int, b: int) -> str:
        return "".join(chr(c) for c in range(a, b))

    pools = {
        "ascii": string.printable, "letters": string.ascii_letters, "lower": string.ascii_lowercase,
        "hex": "0123456789abcdef", "base64": string.ascii_letters + string.digits + "+/=", "digits": string.digits,
        "punct": string.punctuation + " \n\t", "cjk": span(0x4E00, 0x9FFF), "hangul": span(0xAC00, 0xD7A4),
        "kana": span(0x3041, 0x30FF), "cyrillic": span(0x400, 0x4FF), "arabic": span(0x600, 0x6FF),
        "devanagari": span(0x900, 0x97F), "thai": span(0xE00, 0xE7F),
        "emoji": span(0x1F300, 0x1FAFF) + "\u200d\ufe0f\U0001f3fb\U0001f3ff", "marks": "aeiou" + span(0x300, 0x36F),
        "numbers": "0123456789\u00b2\u00b3\u00bd\u2160\u2167\u0660\u0669\uff10\uff19\u09e6",
        "mixed": string.ascii_letters + string.digits + " .,'\"()-_\n\t" + "中文字東京都한국어ёжщ😀é\u0301",
    }  # fmt: skip
    out: dict[str, list[str]] = {}
    for name, pool in pools.items():
        out[name] = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(3000)]
    glue = [" ", "  ", "\n", "\n\n", ". ", ", ", '"', "'", "(", ")", "-", "_", "/", ":", "`", "'s ", "\t", "1", "42 "]
    out["words"] = [
        "".join(rng.choice(table) + rng.choice(glue) for _ in range(rng.randint(1, 12))) for _ in range(5000)
    ]
    out["cased words"] = [
        "".join(rng.choice([str.upper, str.lower, str.title])(rng.choice(table)) + rng.choice(glue)
                for _ in range(rng.randint(1, 12)))
        for _ in range(5000)
    ]  # fmt: skip
    return out


def check(encs: list[Any]) -> int:
    from recall_tasks.judges import tokens

    rng = random.Random(57)
    groups = _random_texts(rng)
    docs = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))] + [(ROOT / "README.md").read_text()]
    docs += [p.read_text() for p in sorted((ROOT / "recall_tasks" / "prompts").glob("*.txt"))]
    groups["repository docs and prompts"] = docs
    under = 0
    for name, texts in groups.items():
        real = most(encs, texts)
        est = [tokens.count(t) for t in texts]
        bad = [(t, e, r) for t, e, r in zip(texts, est, real, strict=True) if e < r]
        under += len(bad)
        ratio = sum(est) / max(sum(real), 1)
        print(f"{name:28} {len(texts):5} texts: estimate {sum(est):>9,} / real {sum(real):>9,} = {ratio:5.2f}x"
              f"; under the real count: {len(bad)}")  # fmt: skip
        for t, e, r in bad[:5]:
            print(f"    {t!r}: estimate {e}, real {r}")
    return under


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cl100k", required=True, help="cl100k_base.tiktoken")
    parser.add_argument("--o200k", required=True, help="o200k_base.tiktoken")
    parser.add_argument("--check", action="store_true", help="compare the estimator with both tokenizers")
    args = parser.parse_args()
    encs = encodings(args.cl100k, args.o200k)
    if args.check:
        raise SystemExit(1 if check(encs) else 0)
    TABLE.write_text(build(encs))
    print(f"wrote {TABLE} ({TABLE.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
