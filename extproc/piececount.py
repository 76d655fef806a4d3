"""Counting a long text by its space-separated pieces, each distinct piece tokenized once.

For a tokenizer whose normalizer works character by character and whose pre-tokenizer splits
at whitespace and drops it (BERT's WordPiece, the default), a text's count is the sum of the
counts of its pieces between spaces. A long document repeats its words: counting each
distinct piece once, and remembering the counts of pieces seen before, costs about a third
of the CPU of tokenizing the whole text (512 KB of `load/prose.py`: ~35 against ~120 ms).
The sum is the count the tokenizer gives for the whole text, exactly; a tokenizer for which
that cannot be shown from its tokenizer.json (byte-level BPE keeps spaces inside its
tokens) is counted whole.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from itertools import accumulate, compress, repeat
from operator import mul, not_
from typing import Any

from tokenizers import Tokenizer

# Normalizers that map each character on its own (a space stays a space, nothing joins across it).
CHARACTER_WISE = frozenset({"BertNormalizer", "Lowercase", "NFD", "NFKD", "NFC", "NFKC", "StripAccents"})
# Pre-tokenizers that split at every whitespace and keep none of it in a token.
WHITESPACE_SPLIT = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
PIECES_MAX = 131_072  # remembered piece counts per process (about 20 MB), then forgotten at once
PIECE_MAX_CHARS = 64  # a longer piece (a URL, a blob) rarely comes again: not remembered


def _normalizer_steps(spec: dict[str, Any]) -> list[dict[str, Any]]:
    normalizer = spec.get("normalizer")
    if normalizer is None:
        return []
    if normalizer.get("type") == "Sequence":
        return list(normalizer.get("normalizers", []))
    return [normalizer]


def splits_at_spaces(spec: dict[str, Any]) -> bool:
    """Whether a tokenizer (its tokenizer.json, parsed) counts a text as the sum of its pieces
    between spaces."""
    if any(step.get("type") not in CHARACTER_WISE for step in _normalizer_steps(spec)):
        return False
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") not in WHITESPACE_SPLIT:
        return False
    # An added token with whitespace in it, or one that takes the spaces around it, spans pieces.
    return all(
        not any(c.isspace() for c in t.get("content", "")) and not t.get("lstrip") and not t.get("rstrip")
        for t in spec.get("added_tokens", [])
    )


def plain_words_lowered(spec: dict[str, Any]) -> bool | None:
    """How a tokenizer that `splits_at_spaces` treats a plain word (ASCII letters and digits):
    its normalizer can only lowercase one (True if a step does), its pre-tokenizer leaves one
    whole, so the model's own `tokenize` of it gives the whole pipeline's count (~1.3 against
    ~6 µs a call). None where an added token could match inside such a word."""
    added = [t.get("content", "") for t in spec.get("added_tokens", [])]
    if any(content.isascii() and content.isalnum() for content in added):
        return None
    kinds = [(step.get("type"), step.get("lowercase", True)) for step in _normalizer_steps(spec)]
    return any(kind == "Lowercase" or (kind == "BertNormalizer" and lowercase) for kind, lowercase in kinds)


class PieceCounts:
    """Token counts of pieces, remembered across texts. `lowered`: `plain_words_lowered`'s
    answer for the tokenizer (None: every new piece goes through the whole pipeline)."""

    def __init__(self, size: int = PIECES_MAX, lowered: bool | None = None) -> None:
        self.size = size
        self.lowered = lowered
        self._counts: dict[str, int] = {}

    def _count_new(self, tok: Tokenizer, piece: str) -> int:
        if not piece:
            return 0
        if self.lowered is not None and piece.isascii() and piece.isalnum():
            return len(tok.model.tokenize(piece.lower() if self.lowered else piece))
        return len(tok.encode(piece, add_special_tokens=False).ids)

    def count_short(self, tok: Tokenizer, text: str) -> int:
        """A short text's count, piece by piece: a question is mostly words seen before, so
        it costs dictionary look-ups and one small call per new piece (~6 against ~26 µs for
        a 10-word question with one new word; ~1 µs with none)."""
        counts, total = self._counts, 0
        for piece in text.split(" "):
            n = counts.get(piece)
            if n is None:
                n = self._count_new(tok, piece)
                if len(piece) <= PIECE_MAX_CHARS:
                    if len(counts) >= self.size:
                        counts.clear()
                    counts[piece] = n
            total += n
        return total

    def count(self, tok: Tokenizer, text: str) -> int:
        """`text`'s token count: the known pieces from memory, the new ones tokenized together."""
        pieces = Counter(text.split(" "))
        pieces.pop("", None)
        counts = self._counts
        # map() and compress() run in C: a long document has tens of thousands of distinct pieces.
        # 0: a piece not seen before (or one of no token, which is then tokenized again).
        known = list(map(counts.get, pieces, repeat(0)))
        total: int = sum(map(mul, known, pieces.values()))
        new = list(compress(pieces, map(not_, known)))
        if not new:
            return total
        # One call for all the new pieces, joined by spaces (a batch call: it runs without the
        # GIL); each token is the new piece its offset falls in.
        starts = [0, *accumulate(len(p) + 1 for p in new[:-1])]
        per_piece = [0] * len(new)
        (encoding,) = tok.encode_batch([" ".join(new)], add_special_tokens=False)
        for start, _ in encoding.offsets:
            per_piece[bisect_right(starts, start) - 1] += 1
        if len(counts) + len(new) > self.size:
            counts.clear()
        for piece, n in zip(new, per_piece, strict=True):
            total += n * pieces[piece]
            if len(piece) <= PIECE_MAX_CHARS:
                counts[piece] = n
        return total
