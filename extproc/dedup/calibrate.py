"""Fit the verifier and choose operating points on labelled pairs; print precision / recall.

``python -m extproc.dedup.calibrate FILE.tsv [--embedder e5-small] [--target 0.95] [--out F]``
fits on an operator's own pairs (``sentence1<TAB>sentence2<TAB>label``; labels 0/1, or scores
with ``--cut``). ``--rebuild-shipped`` rebuilds ``extproc/dedup/verifier.json`` from the
calibration sets in ``../shared/data/paraphrase``.

Every pair lands in one split by a hash of its text, so the split never depends on file order:
50% fit the verifier, 25% choose the threshold, 25% test it (the numbers reported).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .decide import CurvePoint, LanguagePoint, shipped_policy_file
from .guards import guard
from .lang import language
from .verifier import features, fit

SPLITS = ("fit", "select", "test")
TARGETS = (0.8, 0.9, 0.95, 0.99)
SWAPS = ("substitution", "insertion")


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    same: bool
    source: str = ""

    @property
    def key(self) -> int:
        return int.from_bytes(hashlib.sha1(f"{self.a}\t{self.b}".encode()).digest()[:8], "big")

    @property
    def split(self) -> str:
        r = self.key % 100
        return "fit" if r < 50 else "select" if r < 75 else "test"


def read_pairs(path: Path, cut: float = 4.0, source: str | None = None) -> list[Pair]:
    """Labels 0/1 as given; larger labels are similarity scores, same when >= ``cut``."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    scores = [float(r[2]) for r in rows if len(r) >= 3]
    binary = all(s in (0.0, 1.0) for s in scores)
    name = source or path.name
    return [Pair(r[0], r[1], float(r[2]) >= (1.0 if binary else cut), name) for r in rows if len(r) >= 3]


def subsample(pairs: Sequence[Pair], n: int | None) -> list[Pair]:
    if n is None or len(pairs) <= n:
        return list(pairs)
    return sorted(pairs, key=lambda p: hashlib.sha1(p.a.encode() + p.b.encode()).digest())[:n]


def default_data_dir() -> Path:
    env = os.environ.get("LLM_GATE_PARAPHRASE_DATA")
    for candidate in ([Path(env)] if env else []) + [
        Path.cwd().parent / "shared/data/paraphrase",
        Path(__file__).resolve().parents[3] / "shared/data/paraphrase",
    ]:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("paraphrase data not found; set LLM_GATE_PARAPHRASE_DATA")


# ----------------------------------------------------------------------------- embedding


@dataclass(frozen=True)
class Scored:
    """Pairs with their cosine and whether the embedder can read both sides."""

    pairs: list[Pair]
    cosine: np.ndarray
    readable: np.ndarray


def score_pairs(
    embedder: object, pairs: Sequence[Pair], cache: Path | None = None, batch: int = 64
) -> Scored:
    from extproc.embed.encoder import Embedder

    assert isinstance(embedder, Embedder)
    texts = sorted({t for p in pairs for t in (p.a, p.b)})
    vectors = _cached_vectors(embedder, texts, cache, batch)
    index = {t: i for i, t in enumerate(texts)}
    ia = np.array([index[p.a] for p in pairs])
    ib = np.array([index[p.b] for p in pairs])
    cos = (vectors[ia] * vectors[ib]).sum(axis=1).astype(np.float64)
    readable_text = {t: embedder.can_read(t) for t in texts}
    readable = np.array([readable_text[p.a] and readable_text[p.b] for p in pairs])
    return Scored(list(pairs), cos, readable)


def _cached_vectors(embedder: object, texts: list[str], cache: Path | None, batch: int) -> np.ndarray:
    from extproc.embed.encoder import Embedder

    assert isinstance(embedder, Embedder)
    store: dict[str, np.ndarray] = {}
    file = cache / f"{embedder.name}.npz" if cache else None
    if file is not None and file.exists():
        with np.load(file, allow_pickle=False) as z:
            store = dict(zip(z["texts"].tolist(), z["vectors"], strict=True))
    missing = [t for t in texts if t not in store]
    t0 = time.perf_counter()
    for i in range(0, len(missing), batch):
        chunk = missing[i : i + batch]
        for t, v in zip(chunk, embedder.embed_sync(chunk), strict=True):
            store[t] = v
    if missing:
        print(
            f"  embedded {len(missing)} texts with {embedder.name} in {time.perf_counter() - t0:.1f}s",
            file=sys.stderr,
        )
    if file is not None and missing:
        file.parent.mkdir(parents=True, exist_ok=True)
        keys = list(store)
        np.savez(file, texts=np.array(keys), vectors=np.stack([store[k] for k in keys]))
    return np.stack([store[t] for t in texts])


# ----------------------------------------------------------------------------- fitting


def precision_recall(pred: np.ndarray, gold: np.ndarray) -> tuple[float, float, int]:
    hits = int(pred.sum())
    tp = int((pred & gold).sum())
    return (tp / hits if hits else 1.0), (tp / max(int(gold.sum()), 1)), hits


@dataclass(frozen=True)
class Prepared:
    """Per pair: split, gold label, cosine, readable, guard verdict, verifier features."""

    split: np.ndarray
    gold: np.ndarray
    cosine: np.ndarray
    readable: np.ndarray
    vetoed: np.ndarray
    near_exact: np.ndarray
    x: np.ndarray


def prepare(scored: Scored, swaps: tuple[str, ...] = SWAPS) -> Prepared:
    from .canonical import canonical

    ps = scored.pairs
    return Prepared(
        split=np.array([p.split for p in ps]),
        gold=np.array([p.same for p in ps]),
        cosine=scored.cosine,
        readable=scored.readable,
        vetoed=np.array([guard(p.a, p.b, swaps) is not None for p in ps]),
        near_exact=np.array([canonical(p.a) == canonical(p.b) for p in ps]),
        x=np.array([features(p.a, p.b, c) for p, c in zip(ps, scored.cosine, strict=True)]).reshape(
            len(ps), -1
        ),
    )


def fit_language(d: Prepared, floor_quantile: float = 0.02) -> LanguagePoint:
    """Fit on the fit split's candidates; trace the curve on the select and test splits."""
    fit_rows = d.split == "fit"
    pos = d.cosine[fit_rows & d.gold & d.readable]
    min_cosine = float(np.floor(np.quantile(pos, floor_quantile) * 100) / 100) if len(pos) else 0.9
    cand = d.readable & ~d.vetoed & (d.cosine >= min_cosine)
    train = fit_rows & cand
    verifier = fit(d.x[train], d.gold[train].astype(np.float64))
    score = np.where(cand, verifier.score(d.x), 0.0)
    score = np.where(d.near_exact, 1.0, score)
    curve: list[CurvePoint] = []
    sel, test = d.split == "select", d.split == "test"
    for t in np.round(np.arange(0.30, 1.0, 0.01), 2):
        p, r, _ = precision_recall(score[sel] >= t, d.gold[sel])
        tp, tr, th = precision_recall(score[test] >= t, d.gold[test])
        curve.append(CurvePoint(float(t), round(p, 4), round(r, 4), round(tp, 4), round(tr, 4), th))
    return LanguagePoint(min_cosine, verifier, tuple(curve), swaps=SWAPS)


def language_point_json(point: LanguagePoint) -> dict[str, object]:
    return {
        "min_cosine": point.min_cosine,
        "swaps": list(point.swaps),
        "verifier": point.verifier.to_json(),
        "curve": [asdict(c) for c in point.curve],
    }


# ----------------------------------------------------------------------------- report


def rows_for(
    d: Prepared, point: LanguagePoint, cos_grid: Iterable[float], split: str = "test"
) -> list[tuple[str, str, float, float, int]]:
    """(method, operating point, precision, recall, hits) on one split."""
    m = d.split == split
    gold = d.gold[m]
    out: list[tuple[str, str, float, float, int]] = []
    ok = d.readable[m]
    for t in cos_grid:
        base = (ok & (d.cosine[m] >= t)) | d.near_exact[m]
        out.append(("cosine", f"cos>={t:.2f}", *precision_recall(base, gold)))
        out.append(
            (
                "cosine+guards",
                f"cos>={t:.2f}",
                *precision_recall(base & (~d.vetoed[m] | d.near_exact[m]), gold),
            )
        )
    for target in TARGETS:
        chosen = point.at(target)
        if chosen.threshold is None:
            out.append(("cosine+guards+verifier", f"target {target:.2f}: none reached", float("nan"), 0.0, 0))
            continue
        cand = ok & ~d.vetoed[m] & (d.cosine[m] >= point.min_cosine)
        score = np.where(cand, point.verifier.score(d.x[m]), 0.0)
        pred = (score >= chosen.threshold) | d.near_exact[m]
        out.append(
            (
                "cosine+guards+verifier",
                f"target {target:.2f}: score>={chosen.threshold:.2f}",
                *precision_recall(pred, gold),
            )
        )
    return out


def format_rows(title: str, rows: list[tuple[str, str, float, float, int]], n: int, positives: int) -> str:
    lines = [
        f"#### {title} — {n} held-out pairs, {positives} same",
        "",
        "| method | operating point | precision | recall | hits |",
        "|---|---|---:|---:|---:|",
    ]
    for method, op, p, r, h in rows:
        ptxt = "—" if np.isnan(p) else f"{p:.3f}"
        lines.append(f"| {method} | {op} | {ptxt} | {r:.3f} | {h} |")
    return "\n".join(lines) + "\n"


def cos_grid_for(embedder: str) -> tuple[float, ...]:
    return (0.80, 0.85, 0.90, 0.93, 0.95, 0.97) if embedder == "e5-small" else (0.70, 0.80, 0.85, 0.90, 0.95)


# ----------------------------------------------------------------------------- entry points


SHIPPED_SETS: dict[str, tuple[tuple[str, int | None], ...]] = {
    "zh": (("atec-zh.valid.tsv", 6000), ("stsb-zh.train.tsv", 1500), ("stsb-zh.valid.tsv", 1458)),
    "en": (("stsb-en.train.tsv", 2500), ("stsb-en.dev.tsv", 1500)),
}


def shipped_pairs(data: Path) -> dict[str, list[Pair]]:
    out: dict[str, list[Pair]] = {}
    for lang, files in SHIPPED_SETS.items():
        out[lang] = [p for name, n in files for p in subsample(read_pairs(data / name), n)]
    return out


def cache_dir() -> Path:
    from extproc.embed.paths import default_model_dir

    return default_model_dir().parent / "eval-cache"


def rebuild_shipped(
    model_dir: Path | None, data: Path, out: Path, embedders: Sequence[str]
) -> dict[str, object]:
    from extproc.embed import load_embedder

    result: dict[str, dict[str, object]] = {}
    for name in embedders:
        emb = load_embedder(name, model_dir)
        result[name] = {}
        for lang, pairs in shipped_pairs(data).items():
            d = prepare(score_pairs(emb, pairs, cache_dir()))
            if not d.readable.any():
                continue  # the embedder cannot read this language: semantic path never taken
            result[name][lang] = language_point_json(fit_language(d))
    doc: dict[str, object] = {
        "about": "rebuilt by `python -m extproc.dedup.calibrate --rebuild-shipped`; see README",
        "data": {lang: [f"{n} (<= {k} pairs)" for n, k in files] for lang, files in SHIPPED_SETS.items()},
        "embedders": result,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="llm-gate calibrate", description="fit the dedup verifier and print precision/recall"
    )
    ap.add_argument("file", nargs="?", type=Path, help="labelled pairs: sentence1<TAB>sentence2<TAB>label")
    ap.add_argument("--embedder", default="e5-small", help="embedder to calibrate (minilm | e5-small)")
    ap.add_argument("--model-dir", type=Path, default=None, help="built models (default: the model dir)")
    ap.add_argument("--target", type=float, default=0.95, help="held-out precision a language must reach")
    ap.add_argument("--cut", type=float, default=4.0, help="score >= cut means same (non-binary labels)")
    ap.add_argument("--limit", type=int, default=None, help="use at most N pairs (deterministic subsample)")
    ap.add_argument("--out", type=Path, default=None, help="write the fitted policy JSON here")
    ap.add_argument("--rebuild-shipped", action="store_true", help="rebuild extproc/dedup/verifier.json")
    ap.add_argument("--data", type=Path, default=None, help="calibration data dir (with --rebuild-shipped)")
    args = ap.parse_args(argv)

    if args.rebuild_shipped:
        rebuild_shipped(
            args.model_dir,
            args.data or default_data_dir(),
            args.out or shipped_policy_file(),
            ("e5-small", "minilm"),
        )
        print(f"wrote {args.out or shipped_policy_file()}")
        return 0
    if args.file is None:
        ap.error("a labelled FILE.tsv is required (or --rebuild-shipped)")

    from extproc.embed import load_embedder

    pairs = subsample(read_pairs(args.file, args.cut), args.limit)
    emb = load_embedder(args.embedder, args.model_dir)
    by_lang: dict[str, list[Pair]] = {}
    for p in pairs:
        by_lang.setdefault(language(p.a), []).append(p)
    doc: dict[str, object] = {}
    for lang, lp in sorted(by_lang.items()):
        d = prepare(score_pairs(emb, lp))
        n_fit_pos = int((d.gold & (d.split == "fit") & d.readable).sum())
        if n_fit_pos < 20:
            print(f"[{lang}] {len(lp)} pairs, {n_fit_pos} readable same pairs to fit: too few, skipped\n")
            continue
        point = fit_language(d)
        test = d.split == "test"
        print(
            format_rows(
                f"{args.file.name} [{lang}] with {args.embedder}",
                rows_for(d, point, cos_grid_for(args.embedder)),
                int(test.sum()),
                int(d.gold[test].sum()),
            )
        )
        chosen = point.at(args.target)
        verdict = (
            f"threshold {chosen.threshold:.2f}"
            if chosen.threshold is not None
            else "none reached: semantic off"
        )
        print(f"[{lang}] target precision {args.target}: {verdict}; cosine floor {point.min_cosine:.2f}\n")
        doc[lang] = language_point_json(point)
    if args.out:
        args.out.write_text(
            json.dumps({"embedders": {args.embedder: doc}}, indent=1) + "\n", encoding="utf-8"
        )
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
