"""How the screen reads a long text: in pieces, as well as whole.

The head reads a text's first `MAX_TOKENS` tokens with the embedding and averages its n-grams
over the whole text, so an instruction behind a few hundred characters of ordinary questions
scores as the questions do: held-out attacks were flagged 67% alone, 21% behind 300
characters of customer-service questions and 0% behind 1,000 (`load/results/screen_eval.md`,
"Attacks behind ordinary text"). A text longer than `SIZE` characters is therefore also read in pieces of at
most `SIZE`, cut where sentences and lines end (a longer sentence at a space, Chinese at `SIZE`),
and scored as the highest of its readings: one embedding more per piece, all of a text's
pieces in one batch.

A text longer than the screen's window (`unmask.WINDOW`: its first and last halves) has a
middle no embedding of the window reads. Its pieces are weighed first by the head's cheap part
alone (the n-grams: ~30 µs a piece, no embedding), and the few whose wording scores highest
(`screen.middle_pieces`, `MIDDLE_KEEP` by default) are embedded and scored like the others: an
instruction 3,000 characters from both ends is read for that many embeddings more, however
long the text.

`PIECES` names this reading in the shared verdicts' keys, as `unmask.READING` does (with the
number of middle pieces read).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable

SIZE = 200
MIDDLE_KEEP = 4
PIECES = f"p{SIZE}"
_END = re.compile(r"(?<=[.!?;。！？；\n])\s+|(?<=[。！？；])")


def _cut(sentence: str, size: int) -> list[str]:
    """A sentence longer than `size` in parts of at most `size`, at spaces where it has them."""
    parts = []
    while len(sentence) > size:
        at = sentence.rfind(" ", size // 2, size + 1)
        at = at if at > 0 else size
        parts.append(sentence[:at].strip())
        sentence = sentence[at:].strip()
    return [*parts, sentence] if sentence else parts


def pieces(text: str, size: int = SIZE) -> list[str]:
    """The text's pieces: whole sentences packed up to `size` characters ([] for a text of at
    most `size`: it is read whole)."""
    if len(text) <= size:
        return []
    out: list[str] = []
    current = ""
    for sentence in _END.split(text):
        for part in _cut(sentence.strip(), size):
            if current and len(current) + 1 + len(part) > size:
                out.append(current)
                current = part
            else:
                current = f"{current} {part}" if current else part
    return [*out, current] if current else out


def strongest(parts: list[str], weigh: Callable[[str], float], keep: int = MIDDLE_KEEP) -> list[str]:
    """The `keep` pieces that `weigh` scores highest (the first ones among equals)."""
    if len(parts) <= keep:
        return parts
    best = heapq.nlargest(keep, range(len(parts)), key=lambda i: (weigh(parts[i]), -i))
    return [parts[i] for i in sorted(best)]
