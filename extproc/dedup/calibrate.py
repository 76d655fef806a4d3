"""Fit the verifier and choose operating points on labelled pairs; print precision with its bound.

``python -m extproc.dedup.calibrate FILE.tsv:binary [FILE2.tsv:score ...] [--embedder e5-small]``
fits on an operator's own pairs (``sentence1<TAB>sentence2<TAB>label``). Every file says how its
labels read: ``:binary`` (0 = different, 1 = same; anything else is refused) or ``:score``
(a 0-5 similarity, same when >= ``--cut``; a file holding only 0/1 is refused as a score file:
it is almost surely binary and every 1 would read as "different"). ``--rebuild-shipped`` rebuilds
``extproc/dedup/verifier.json`` from the shared paraphrase sets.

Every pair lands in one role by a hash of its text (never by file order): ``fit`` (the verifier
is fitted on it), ``select`` (the threshold is chosen on it: the loosest whose 95% Wilson lower
bound of precision reaches the target with at least ``min_hits`` hits) and ``test`` (reported).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from .align import alignment
from .canonical import canonical
from .decide import DEFAULT_MIN_HITS, CurvePoint, LanguagePoint, shipped_policy_file
from .guards import guard
from .lang import language
from .selfcheck import wilson_lower
from .states import StateStore, read_states
from .verifier import FEATURES, features, fit

TARGETS = (0.9, 0.95, 0.99)
KINDS = ("binary", "score")


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    same: bool
    source: str = ""
    role: str = ""  # fit | select | test

    @property
    def key(self) -> int:
        return int.from_bytes(hashlib.sha1(f"{self.a}\t{self.b}".encode()).digest()[:8], "big")


Roles = Callable[[int], str]


def split_roles(fit_share: int = 50, select_share: int = 25) -> Roles:
    """Role by ``key % 100``: below fit_share fit, then select_share select, the rest test."""

    def role(key: int) -> str:
        r = key % 100
        return "fit" if r < fit_share else "select" if r < fit_share + select_share else "test"

    return role


class LabelError(ValueError):
    """A label file that would be misread."""


def read_pairs(path: Path, kind: str, cut: float = 4.0, roles: Roles | None = None) -> list[Pair]:
    """Pairs of one file; ``kind`` is "binary" (0/1 only) or "score" (0-5, same when >= cut)."""
    if kind not in KINDS:
        raise LabelError(f"{path.name}: label kind must be one of {KINDS}, not {kind!r}")
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    bad = [i for i, r in enumerate(rows, 1) if len(r) < 3]
    if bad:
        raise LabelError(f"{path.name}: line {bad[0]} has no label column")
    try:
        labels = [float(r[2]) for r in rows]
    except ValueError as exc:
        raise LabelError(f"{path.name}: a label is not a number ({exc})") from exc
    if kind == "binary":
        odd = next((x for x in labels if x not in (0.0, 1.0)), None)
        if odd is not None:
            raise LabelError(
                f"{path.name}: binary labels must be 0 or 1, found {odd:g} (is it a :score file?)"
            )
        same = [x == 1.0 for x in labels]
    else:
        if not (min(labels, default=0.0) >= 0.0 and max(labels, default=5.0) <= 5.0):
            raise LabelError(f"{path.name}: scores must lie in 0-5")
        if labels and all(x in (0.0, 1.0) for x in labels):
            raise LabelError(f"{path.name}: only 0/1 labels in a :score file; read it as :binary")
        same = [x >= cut for x in labels]
    role = roles or split_roles()
    out = []
    for r, s in zip(rows, same, strict=True):
        p = Pair(r[0], r[1], s, path.name)
        out.append(replace(p, role=role(p.key)))
    return out


def parse_spec(spec: str) -> tuple[Path, str]:
    """``FILE:binary`` / ``FILE:score`` -> (path, kind); a bare FILE is refused."""
    path, _, kind = spec.rpartition(":")
    if not path or kind not in KINDS:
        raise LabelError(f"{spec}: say how its labels read, FILE:binary (0/1) or FILE:score (0-5 with --cut)")
    return Path(path), kind


def subsample(pairs: Sequence[Pair], n: int | None) -> list[Pair]:
    if n is None or len(pairs) <= n:
        return list(pairs)
    return sorted(pairs, key=lambda p: hashlib.sha1(p.a.encode() + p.b.encode()).digest())[:n]


def default_data_dir() -> Path:
    env = os.environ.get("LLM_GATE_PARAPHRASE_DATA")
    for candidate in ([Path(env)] if env else []) + [
        Path.cwd().parent / "shared/data/paraphrase",
        Path(__file__).resolve().parents[3] / "shared/data/paraphrase",
        Path("/work/shared/data/paraphrase"),
    ]:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("paraphrase data not found; set LLM_GATE_PARAPHRASE_DATA")


def cache_dir() -> Path:
    from extproc.embed.paths import default_model_dir

    return default_model_dir().parent / "eval-cache"


# ----------------------------------------------------------------------------- prepared pairs


@dataclass(frozen=True)
class Prepared:
    """Per pair: role, gold label, cosine, readable, guard verdict, near-exact, verifier features."""

    role: np.ndarray
    gold: np.ndarray
    cosine: np.ndarray
    readable: np.ndarray
    vetoed: np.ndarray
    near_exact: np.ndarray
    x: np.ndarray

    def only(self, mask: np.ndarray) -> Prepared:
        return Prepared(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


def pair_features(store: StateStore, a: str, b: str) -> tuple[float, np.ndarray]:
    cos = float(store.vector(a) @ store.vector(b))
    pa, sa = store.states(a)
    pb, sb = store.states(b)
    return cos, features(a, b, cos, alignment(pa, sa, pb, sb))


def prepare(embedder: object, pairs: Sequence[Pair], swaps: tuple[str, ...], cache: Path | None) -> Prepared:
    from extproc.embed.encoder import OnnxEmbedder

    assert isinstance(embedder, OnnxEmbedder)
    texts = sorted({t for p in pairs for t in (p.a, p.b)})
    readable_text = {t: embedder.can_read(t) for t in texts}
    readable = [readable_text[p.a] and readable_text[p.b] for p in pairs]
    cos, xs = [0.0] * len(pairs), [np.zeros(len(FEATURES))] * len(pairs)
    if any(readable):  # the model never reads a pair the gate would not embed
        store = read_states(
            embedder,
            sorted({t for p, r in zip(pairs, readable, strict=True) if r for t in (p.a, p.b)}),
            cache,
        )
        for i, p in enumerate(pairs):
            if readable[i]:
                cos[i], xs[i] = pair_features(store, p.a, p.b)
    return Prepared(
        role=np.array([p.role for p in pairs]),
        gold=np.array([p.same for p in pairs], dtype=bool),
        cosine=np.array(cos),
        readable=np.array(readable, dtype=bool),
        vetoed=np.array([guard(p.a, p.b, swaps) is not None for p in pairs], dtype=bool),
        near_exact=np.array([canonical(p.a) == canonical(p.b) for p in pairs], dtype=bool),
        x=np.array(xs).reshape(len(pairs), -1),
    )


# ----------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Counted:
    precision: float
    lower: float  # 95% Wilson lower bound of precision
    recall: float
    hits: int
    wrong: int


def count(pred: np.ndarray, gold: np.ndarray) -> Counted:
    hits = int(pred.sum())
    tp = int((pred & gold).sum())
    return Counted(
        tp / hits if hits else 1.0, wilson_lower(tp, hits), tp / max(int(gold.sum()), 1), hits, hits - tp
    )


def curve_point(threshold: float, sel: Counted, test: Counted) -> CurvePoint:
    """One point of a curve: what the threshold does on the select part and on the test part."""
    return CurvePoint(
        threshold,
        round(sel.precision, 4),
        round(sel.recall, 4),
        round(test.precision, 4),
        round(test.recall, 4),
        test.hits,
        lower=round(sel.lower, 4),
        hits=sel.hits,
        test_lower=round(test.lower, 4),
    )


def scores(d: Prepared, point: LanguagePoint) -> np.ndarray:
    """The verifier's score per pair; 0 where the semantic layer never asks it, 1 for near-exact."""
    cand = d.readable & ~d.vetoed & (d.cosine >= point.min_cosine)
    s = np.where(cand, point.verifier.score(d.x), 0.0) if len(d.x) else np.zeros(0)
    return np.where(d.near_exact, 1.0, s)


def fit_language(
    d: Prepared, swaps: tuple[str, ...], floor_quantile: float = 0.02, folds: int = 5
) -> LanguagePoint:
    """Fit on the fit role's candidates; trace the curve on the select and test roles.

    Without select pairs the threshold is chosen on out-of-fold scores of the fit pairs
    (``folds``-fold cross-fitting: each pair scored by a verifier fitted without it), so every
    fit pair also counts toward the lower bound."""
    fit_rows = d.role == "fit"
    pos = d.cosine[fit_rows & d.gold & d.readable]
    min_cosine = float(np.floor(np.quantile(pos, floor_quantile) * 100) / 100) if len(pos) else 0.9
    cand = d.readable & ~d.vetoed & (d.cosine >= min_cosine)
    train = fit_rows & cand
    verifier = fit(d.x[train], d.gold[train].astype(np.float64))
    point = LanguagePoint(min_cosine, verifier, swaps=swaps)
    s = scores(d, point)
    sel, test = d.role == "select", d.role == "test"
    s_sel = s
    if not sel.any():
        sel, s_sel = fit_rows, s.copy()
        fold = np.arange(len(d.gold)) % folds
        for k in range(folds):
            v = fit(d.x[train & (fold != k)], d.gold[train & (fold != k)].astype(np.float64))
            rows = fit_rows & (fold == k)
            s_sel[rows] = scores(d.only(rows), LanguagePoint(min_cosine, v, swaps=swaps))
    curve: list[CurvePoint] = []
    for t in np.round(np.arange(0.30, 1.0, 0.005), 3):
        a, b = count(s_sel[sel] >= t, d.gold[sel]), count(s[test] >= t, d.gold[test])
        curve.append(curve_point(float(t), a, b))
    return replace(point, curve=tuple(curve))


def language_point_json(point: LanguagePoint) -> dict[str, object]:
    return {
        "min_cosine": point.min_cosine,
        "swaps": list(point.swaps),
        "verifier": point.verifier.to_json(),
        "curve": [asdict(c) for c in point.curve],
    }


# ----------------------------------------------------------------------------- report


Row = tuple[str, str, Counted]


def rows_for(d: Prepared, point: LanguagePoint, cos_grid: Sequence[float], role: str = "test") -> list[Row]:
    """(method, operating point, counts) on one role's pairs."""
    m = d.role == role
    e = d.only(m)
    out: list[Row] = []
    for t in cos_grid:
        base = (e.readable & (e.cosine >= t)) | e.near_exact
        out.append(("cosine", f"cos>={t:.2f}", count(base, e.gold)))
        out.append(("cosine+guards", f"cos>={t:.2f}", count(base & (~e.vetoed | e.near_exact), e.gold)))
    s = scores(e, point)
    for target in TARGETS:
        chosen = point.at(target)
        if chosen.threshold is None:
            out.append(("guards+verifier", f"target {target:.2f}: none reached", count(e.near_exact, e.gold)))
            continue
        out.append(
            (
                "guards+verifier",
                f"target {target:.2f}: score>={chosen.threshold:.3f}",
                count(s >= chosen.threshold, e.gold),
            )
        )
    return out


def format_rows(title: str, rows: list[Row], n: int, positives: int) -> str:
    lines = [
        f"#### {title} — {n} pairs, {positives} same",
        "",
        "| method | operating point | precision | 95% lower bound | recall | hits | wrong |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for method, op, c in rows:
        lines.append(
            f"| {method} | {op} | {c.precision:.3f} | {c.lower:.3f} | {c.recall:.3f} | {c.hits} | {c.wrong} |"
        )
    return "\n".join(lines) + "\n"


def cos_grid_for(embedder: str) -> tuple[float, ...]:
    return (0.85, 0.90, 0.93, 0.95, 0.97) if embedder == "e5-small" else (0.70, 0.80, 0.85, 0.90, 0.95)


# ----------------------------------------------------------------------------- shipped calibration


@dataclass(frozen=True)
class Source:
    file: str
    kind: str
    roles: tuple[int, int]  # fit share, select share (percent of key % 100); the rest is test
    limit: int | None = None  # a deterministic subsample (by hash) of at most this many pairs


# en: fit on STS-B train, threshold on its cross-fitted scores, test on all of STS-B dev;
# zh: ATEC split by hash
SHIPPED: dict[str, tuple[Source, ...]] = {
    "en": (Source("stsb-en.train.tsv", "score", (100, 0)), Source("stsb-en.dev.tsv", "score", (0, 0))),
    "zh": (Source("atec-zh.valid.tsv", "binary", (40, 20), 10_000),),
}
SWAPS: dict[str, tuple[str, ...]] = {"en": ("substitution",), "zh": ("substitution", "insertion")}


def shipped_pairs(data: Path, lang: str) -> list[Pair]:
    return [
        p
        for s in SHIPPED[lang]
        for p in subsample(read_pairs(data / s.file, s.kind, 4.0, split_roles(*s.roles)), s.limit)
    ]


def rebuild_shipped(
    model_dir: Path | None, data: Path, out: Path, embedders: Sequence[str]
) -> dict[str, object]:
    from extproc.embed import load_embedder

    result: dict[str, dict[str, object]] = {}
    for name in embedders:
        emb = load_embedder(name, model_dir)
        result[name] = {}
        for lang in SHIPPED:
            d = prepare(emb, shipped_pairs(data, lang), SWAPS[lang], cache_dir())
            if not d.readable.any():
                continue  # the embedder cannot read this language: semantic path never taken
            result[name][lang] = language_point_json(fit_language(d, SWAPS[lang]))
    doc: dict[str, object] = {
        "about": "rebuilt by `python -m extproc.dedup.calibrate --rebuild-shipped`; see README",
        "data": {
            lang: [
                f"{s.file} ({s.kind}; <= {s.limit or 'all'} pairs; fit/select/test % = "
                f"{s.roles[0]}/{s.roles[1]}/{100 - sum(s.roles)})"
                for s in srcs
            ]
            for lang, srcs in SHIPPED.items()
        },
        "min_hits": DEFAULT_MIN_HITS,
        "embedders": result,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llm-gate calibrate", description="fit the dedup verifier and report")
    ap.add_argument("files", nargs="*", help="labelled pairs: FILE.tsv:binary or FILE.tsv:score")
    ap.add_argument("--embedder", default="e5-small", help="embedder to calibrate (minilm | e5-small)")
    ap.add_argument("--model-dir", type=Path, default=None, help="built models (default: the model dir)")
    ap.add_argument("--target", type=float, default=0.95, help="on the 95%% lower bound of precision")
    ap.add_argument("--min-hits", type=int, default=DEFAULT_MIN_HITS, help="fewest hits a point rests on")
    ap.add_argument("--cut", type=float, default=4.0, help="score >= cut means same (:score files)")
    ap.add_argument("--limit", type=int, default=None, help="use at most N pairs per file (deterministic)")
    ap.add_argument("--out", type=Path, default=None, help="write the fitted policy JSON here")
    ap.add_argument("--rebuild-shipped", action="store_true", help="rebuild extproc/dedup/verifier.json")
    ap.add_argument("--data", type=Path, default=None, help="paraphrase data dir (with --rebuild-shipped)")
    args = ap.parse_args(argv)

    if args.rebuild_shipped:
        target = args.out or shipped_policy_file()
        rebuild_shipped(args.model_dir, args.data or default_data_dir(), target, ("e5-small", "minilm"))
        print(f"wrote {target}")
        return 0
    if not args.files:
        ap.error("at least one FILE.tsv:binary or FILE.tsv:score is required (or --rebuild-shipped)")
    try:
        specs = [parse_spec(s) for s in args.files]
        pairs = [p for path, kind in specs for p in subsample(read_pairs(path, kind, args.cut), args.limit)]
    except LabelError as exc:
        print(f"refused: {exc}")
        return 2

    from extproc.embed import load_embedder

    emb = load_embedder(args.embedder, args.model_dir)
    by_lang: dict[str, list[Pair]] = {}
    for p in pairs:
        by_lang.setdefault(language(p.a), []).append(p)
    doc: dict[str, object] = {}
    for lang, lp in sorted(by_lang.items()):
        swaps = SWAPS.get(lang, ("substitution", "insertion"))
        d = prepare(emb, lp, swaps, None)
        n_fit_pos = int((d.gold & (d.role == "fit") & d.readable).sum())
        if n_fit_pos < 20:
            print(f"[{lang}] {len(lp)} pairs, {n_fit_pos} readable same pairs to fit: too few, skipped\n")
            continue
        point = fit_language(d, swaps)
        test = d.role == "test"
        title = f"{', '.join(str(p) for p, _ in specs)} [{lang}] with {args.embedder}, test role"
        print(
            format_rows(
                title,
                rows_for(d, point, cos_grid_for(args.embedder)),
                int(test.sum()),
                int(d.gold[test].sum()),
            )
        )
        chosen = point.at(args.target, args.min_hits)
        cp = chosen.chosen()
        verdict = (
            f"threshold {cp.threshold:.3f} (select: precision {cp.precision:.3f}, "
            f"lower bound {cp.lower:.3f}, "
            f"{cp.hits} hits; test: precision {cp.test_precision:.3f}, lower bound {cp.test_lower:.3f}, "
            f"recall {cp.test_recall:.3f})"
            if cp is not None
            else "none reached: semantic off"
        )
        print(
            f"[{lang}] target precision {args.target} (lower bound, >= {args.min_hits} hits): {verdict}; "
            f"cosine floor {point.min_cosine:.2f}\n"
        )
        doc[lang] = language_point_json(point)
    if args.out:
        args.out.write_text(
            json.dumps({"embedders": {args.embedder: doc}}, indent=1) + "\n", encoding="utf-8"
        )
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
