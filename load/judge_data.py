"""The pair judge's labelled pairs, split by pair hash, with everything the judge reads.

English: STS-B train split by a hash of the pair (50% fit / 20% select / 30% report) plus all
of STS-B dev (report); score >= 4 = same. Chinese: ATEC split the same way. STS-B's Chinese
translation is left out: its pairs are translations of the English report pairs.
Token states come from the e5-small embedder the gate runs, cached on disk (``read_states``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from extproc.dedup.align import alignment
from extproc.dedup.calibrate import Pair, read_pairs, split_roles
from extproc.dedup.canonical import canonical
from extproc.dedup.guards import guard, swapped
from extproc.dedup.judge import MAX_TOKENS, judge_features
from extproc.dedup.states import StateStore, read_states

ROLES = (50, 20)  # fit %, select %; the rest is the report part
SOURCES = {
    "en": (("stsb-en.train.tsv", "score", True), ("stsb-en.dev.tsv", "score", False)),
    "zh": (("atec-zh.valid.tsv", "binary", True),),
}


def report_only(_key: int) -> str:
    return "test"


def soft_targets(data: Path, lang: str) -> dict[tuple[str, str], float]:
    """Training targets beyond same/different: an STS-B score read as (score - 2.5) / 2.5, so a
    5.0 pair counts more than a 4.0 one and a 3.8 less than neither (binary files: 0 or 1)."""
    out: dict[tuple[str, str], float] = {}
    for name, kind, _ in SOURCES[lang]:
        for line in (data / name).read_text(encoding="utf-8").splitlines():
            r = line.split("\t")
            if len(r) >= 3:
                v = float(r[2])
                out[(r[0], r[1])] = min(max((v - 2.5) / 2.5, 0.0), 1.0) if kind == "score" else v
    return out


def judge_pairs(data: Path, lang: str) -> list[Pair]:
    out: list[Pair] = []
    for name, kind, split in SOURCES[lang]:
        out += read_pairs(data / name, kind, 4.0, split_roles(*ROLES) if split else report_only)
    return out


@dataclass
class JudgeSet:
    """Pairs of one language with the judge's inputs; token states stay in ``store``."""

    lang: str
    pairs: list[Pair]
    role: np.ndarray
    gold: np.ndarray
    readable: np.ndarray
    near_exact: np.ndarray
    hard: np.ndarray  # a guard's hard veto (negation, numbers, dates, amounts, ids, names, ...)
    swap: np.ndarray  # "substitution" | "insertion" | "" (small edits that swap content words)
    cosine: np.ndarray
    x: np.ndarray  # judge_features, float32 [n, F]
    store: StateStore
    target: np.ndarray  # the training target per pair (soft_targets; gold where none)

    def vetoed(self, swaps: tuple[str, ...]) -> np.ndarray:
        return self.hard | np.isin(self.swap, list(swaps))

    def states(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.pairs[i]
        return self.store.states(p.a)[1][:MAX_TOKENS], self.store.states(p.b)[1][:MAX_TOKENS]


def prepare_set(
    embedder: object,
    pairs: Sequence[Pair],
    lang: str,
    cache: Path | None,
    targets: dict[tuple[str, str], float] | None = None,
) -> JudgeSet:
    from extproc.embed.encoder import OnnxEmbedder

    assert isinstance(embedder, OnnxEmbedder)
    readable_text = {t: embedder.can_read(t) for p in pairs for t in (p.a, p.b)}
    readable = np.array([readable_text[p.a] and readable_text[p.b] for p in pairs], dtype=bool)
    texts = sorted({t for p, r in zip(pairs, readable, strict=True) if r for t in (p.a, p.b)})
    store = read_states(embedder, texts, cache)
    n = len(pairs)
    cos = np.zeros(n)
    xs: list[np.ndarray] = []
    for i, p in enumerate(pairs):
        if not readable[i]:
            xs.append(np.zeros(0, np.float32))
            continue
        cos[i] = float(store.vector(p.a) @ store.vector(p.b))
        pa, sa = store.states(p.a)
        pb, sb = store.states(p.b)
        xs.append(judge_features(p.a, p.b, cos[i], alignment(pa, sa, pb, sb)))
    width = max(len(x) for x in xs)
    x = np.stack([v if len(v) else np.zeros(width, np.float32) for v in xs])
    return JudgeSet(
        lang,
        list(pairs),
        np.array([p.role for p in pairs]),
        np.array([p.same for p in pairs], dtype=bool),
        readable,
        np.array([canonical(p.a) == canonical(p.b) for p in pairs], dtype=bool),
        np.array([guard(p.a, p.b, ()) is not None for p in pairs], dtype=bool),
        np.array([swapped(p.a, p.b) or "" for p in pairs]),
        cos,
        x,
        store,
        np.array([(targets or {}).get((p.a, p.b), float(p.same)) for p in pairs], np.float32),
    )


def served(
    s: JudgeSet, scores: np.ndarray, min_cosine: float, threshold: float, swaps: tuple[str, ...]
) -> np.ndarray:
    """Which pairs the gate serves: near-exact, or readable, past the floor and the guards
    (``swaps``: the small-edit swaps that veto too), and judged at or above the threshold."""
    cand = s.readable & ~s.vetoed(swaps) & (s.cosine >= min_cosine)
    out: np.ndarray = s.near_exact | (cand & (scores >= threshold))
    return out
