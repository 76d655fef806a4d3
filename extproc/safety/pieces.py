"""How the screen reads a long text: in pieces, as well as whole.

The head reads a text's first `MAX_TOKENS` tokens with the embedding and averages its n-grams
over the whole text, so an instruction behind a few hundred characters of ordinary questions
scores as the questions do: held-out attacks were flagged 67% alone, 21% behind 300
characters of customer-service questions and 0% behind 1,000 (`load/results/screen_eval.md`,
"Attacks behind ordinary text"). A text longer than `SIZE` characters is therefore also read in pieces of at
most `SIZE`, cut where sentences and lines end (a longer sentence at a space, Chinese at `SIZE`),
and scored as the highest of its readings: one embedding more per piece, all of a text's
pieces in one batch.

`PIECES` names this reading in the shared verdicts' keys, as `unmask.READING` does.
"""

from __future__ import annotations

import re

SIZE = 200
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
