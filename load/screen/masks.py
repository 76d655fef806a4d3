"""Attacks written to slip past the screen, and the scores the gate gives texts.

The gate scores a text as written and, when `extproc.safety.unmask` reads it differently, as
unmasked too; the higher score counts (`Screener.score`). `as_screened` gives the same scores
for the evaluation; `MASKS` are the disguises the evaluation applies to attacks.
"""

from __future__ import annotations

import base64
import codecs
from collections.abc import Callable
from pathlib import Path

import numpy as np

from extproc.safety.screen import Head
from extproc.safety.unmask import reread

from .vectors import vectors

_FULLWIDTH = {c: c + 0xFEE0 for c in range(0x21, 0x7F)}
_LOOKALIKE = str.maketrans("aeopcxiyAEOPCXIHKMT", "аеорсхіуАЕОРСХІНКМТ")  # Cyrillic
_LEET = str.maketrans("aeiost", "431057")


def spread(text: str) -> str:
    """Every word's characters one space apart, words three apart (Han characters too)."""
    return "   ".join(" ".join(word) for word in text.split())


MASKS: dict[str, Callable[[str], str]] = {
    "fullwidth letters": lambda t: t.translate(_FULLWIDTH),
    "Cyrillic look-alikes": lambda t: t.translate(_LOOKALIKE),
    "letters spread out": spread,
    "leetspeak": lambda t: t.translate(_LEET),
    "base64": lambda t: base64.b64encode(t.encode()).decode(),
    "hex": lambda t: t.encode().hex(),
    "ROT13": lambda t: codecs.encode(t, "rot13"),
    "written backwards": lambda t: t[::-1],
}


def as_screened(head: Head, texts: list[str], x: np.ndarray, cache: Path) -> np.ndarray:
    """Each text's score as the gate reaches it (`x`: the texts' own vectors)."""
    scores = head.scores(x, texts if head.lex is not None else None)
    readings = [reread(t) for t in texts]
    masked = [i for i, r in enumerate(readings) if r is not None]
    if masked:
        plain = [r for r in readings if r is not None]
        again = head.scores(vectors(plain, cache), plain if head.lex is not None else None)
        scores[masked] = np.maximum(scores[masked], again)
    return scores


def table(head: Head, attacks: dict[str, list[str]], cache: Path) -> list[str]:
    """Markdown rows: each set of attacks under each mask, flagged at the head's threshold by
    the head alone (as written) and as the gate scores them."""
    rows = []
    for name, texts in attacks.items():
        for mask, disguise in {"none": lambda t: t, **MASKS}.items():
            shown = [disguise(t) for t in texts]
            x = vectors(shown, cache)
            alone = head.scores(x, shown if head.lex is not None else None)
            gate = as_screened(head, shown, x, cache)
            rows.append(f"| {name} ({len(texts)}) | {mask} | {(alone > head.threshold).mean():.1%} "
                        f"| {(gate > head.threshold).mean():.1%} |")
    return rows
