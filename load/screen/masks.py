"""Attacks written to slip past the screen, and the scores the gate gives texts.

The gate scores a text as written, as unmasked when `extproc.safety.unmask` reads it
differently, and in pieces when it is long (`extproc.safety.pieces`); the highest score counts
(`Screener.score`). `as_screened` gives the same scores
for the evaluation; `MASKS` are the disguises the evaluation applies to attacks.
"""

from __future__ import annotations

import base64
import codecs
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from extproc.safety.screen import Head
from extproc.safety.screener import readings

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


def as_screened(head: Head, texts: list[str], x: np.ndarray, cache: Path,
                in_pieces: bool = True) -> np.ndarray:
    """Each text's score as the gate reaches it (`x`: the texts' own vectors): the highest of
    the text as written, its unmasked reading and a long text's pieces (`Screener.score`;
    `in_pieces=False`: as the gate scored before it read long texts in pieces)."""
    scores = head.scores(x, texts)
    owner, others = [], []
    for i, text in enumerate(texts):
        plain, parts = readings(text, head)
        for reading in ([] if plain is None else [plain]) + (parts if in_pieces else []):
            owner.append(i)
            others.append(reading)
    if others:
        again = head.scores(vectors(others, cache), others)
        np.maximum.at(scores, np.array(owner), again)
    return scores


def table(head: Head, attacks: dict[str, list[str]], cache: Path) -> list[str]:
    """Markdown rows: each set of attacks under each mask, flagged at the head's threshold by
    the head alone (as written) and as the gate scores them."""
    rows = []
    for name, texts in attacks.items():
        for mask, disguise in {"none": lambda t: t, **MASKS}.items():
            shown = [disguise(t) for t in texts]
            x = vectors(shown, cache)
            alone = head.scores(x, shown)
            gate = as_screened(head, shown, x, cache)
            rows.append(f"| {name} ({len(texts)}) | {mask} | {(alone > head.threshold).mean():.1%} "
                        f"| {(gate > head.threshold).mean():.1%} |")
    return rows


PADDING = (300, 1000, 3000)  # characters of ordinary text around an attack
# Long ordinary texts alone: the longest is past the window, so its middle is read too.
BENIGN_LENGTHS = (1000, 3000, 10_000)


def _filler(pool: list[str], chars: int, rng: random.Random) -> str:
    out: list[str] = []
    while sum(len(t) + 1 for t in out) < chars:
        out.append(rng.choice(pool))
    return " ".join(out)


def padded(attacks: list[str], pool: list[str], seed: int) -> dict[str, list[str]]:
    """The attacks behind, before and between ordinary texts drawn from `pool`."""
    rng = random.Random(seed)
    out: dict[str, list[str]] = {}
    for n in PADDING:
        out[f"behind {n:,} characters"] = [_filler(pool, n, rng) + "\n\n" + t for t in attacks]
        out[f"before {n:,} characters"] = [t + "\n\n" + _filler(pool, n, rng) for t in attacks]
        out[f"between two of {n:,}"] = [_filler(pool, n, rng) + "\n\n" + t + "\n\n" + _filler(pool, n, rng)
                                        for t in attacks]
    return out


def padding_table(head: Head, attacks: dict[str, list[str]], benign: dict[str, list[str]], cache: Path,
                  seed: int) -> list[str]:
    """Markdown rows: attacks among ordinary questions, and long ordinary texts alone, flagged
    at the head's threshold read whole (as before) and as the gate reads them."""
    rng = random.Random(seed)
    pool = benign["customer-service questions"]
    rows = []

    def row(name: str, how: str, texts: list[str]) -> str:
        x = vectors(texts, cache)
        whole = as_screened(head, texts, x, cache, in_pieces=False)
        gate = as_screened(head, texts, x, cache)
        label = f"{name} ({len(texts)})" if name else ""
        return (f"| {label} | {how} | {(whole > head.threshold).mean():.1%} "
                f"| {(gate > head.threshold).mean():.1%} |")

    for name, texts in attacks.items():
        rows.append(row(name, "alone", texts))
        rows += [row("", how, shown) for how, shown in padded(texts, pool, seed).items()]
    for name, texts in benign.items():
        rows += [row(f"benign: {name}", f"{n:,} characters of them",
                     [_filler(texts, n, rng) for _ in range(200)]) for n in BENIGN_LENGTHS]
    return rows
