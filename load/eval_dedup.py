"""Evaluate semantic dedup on held-out pairs: precision (with its 95% lower bound) and recall.

    python load/eval_dedup.py [--model-dir DIR] [--data DIR] [--out load/results/dedup_eval.md]

Uses the shipped calibration (extproc/dedup/verifier.json, rebuilt by
``python -m extproc.dedup.calibrate --rebuild-shipped``). English: fitted and thresholded on
STS-B train, reported on all of STS-B dev (score >= 4 = same). Chinese: ATEC split by a fixed
hash of the pair: 40% fit, 20% select, 40% held out and reported here. Then the project's own
should-miss / should-hit sets (tests/dedup/data) at the shipped defaults, and the decision's cost.
The pair judge's section (``load.eval_judge``) comes first: its report part, the own sets with
the judge on, and its cost per judged pair.
Embeddings and token states are cached next to the models (eval-cache/), so a rerun is quick.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from extproc.dedup.align import alignment
from extproc.dedup.calibrate import (
    SHIPPED,
    Counted,
    cache_dir,
    cos_grid_for,
    count,
    default_data_dir,
    format_rows,
    prepare,
    rows_for,
    scores,
    shipped_pairs,
)
from extproc.dedup.canonical import canonical
from extproc.dedup.decide import DEFAULT_TARGET, LanguagePoint, Policy, decide, load_policy
from extproc.dedup.states import StateStore, read_states
from extproc.embed import load_embedder
from extproc.embed.encoder import OnnxEmbedder

EMBEDDERS = ("e5-small", "minilm")
SETS = Path(__file__).resolve().parents[1] / "tests" / "dedup" / "data"
TEST_ROLE = {"en": "STS-B en dev (all 1,500 pairs)", "zh": "ATEC held-out 40% (by hash)"}


def read_set(name: str) -> list[tuple[str, str, str, str]]:
    rows = (SETS / name).read_text(encoding="utf-8").splitlines()
    return [(r[0], r[1], r[2], r[3]) for r in (line.split("\t") for line in rows)]


def fmt(c: Counted) -> str:
    return f"{c.precision:.3f} (LB {c.lower:.3f}), recall {c.recall:.3f}, {c.hits} hits / {c.wrong} wrong"


def held_out(name: str, emb: OnnxEmbedder, lang: str, point: LanguagePoint, data: Path) -> tuple[str, str]:
    """(per-set table, default-table row) on the test role."""
    d = prepare(emb, shipped_pairs(data, lang), point.swaps, cache_dir())
    test = d.role == "test"
    e = d.only(test)
    table = format_rows(
        f"{name} · {lang} · {TEST_ROLE[lang]}",
        rows_for(d, replace(point, threshold=None), cos_grid_for(name)),
        int(test.sum()),
        int(e.gold.sum()),
    )
    s = scores(e, point)
    curve = [
        "| verifier score >= | precision | 95% LB | recall | hits | wrong |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    best: tuple[float, Counted] | None = None
    for t in np.round(np.arange(0.5, 1.0, 0.025), 3):
        c = count(s >= t, e.gold)
        curve.append(
            f"| {t:.3f} | {c.precision:.3f} | {c.lower:.3f} | {c.recall:.3f} | {c.hits} | {c.wrong} |"
        )
        if c.lower >= DEFAULT_TARGET and (best is None or c.recall > best[1].recall):
            best = (float(t), c)
    chosen = point.at(DEFAULT_TARGET)
    cp = chosen.chosen()
    at_default = count(s >= chosen.threshold, e.gold) if chosen.threshold is not None else None
    best_sel = max((c for c in point.curve if c.hits >= 30), key=lambda c: (c.lower, c.recall), default=None)
    state = "**on**" if at_default is not None else "off"
    row = (
        f"| {name} | {lang} | {point.min_cosine:.2f} | "
        + (
            f"{cp.threshold:.3f}: {cp.precision:.3f} (LB {cp.lower:.3f}), {cp.hits} hits"
            if cp is not None
            else "none reached"
            + (
                f" (best: {best_sel.precision:.3f}, LB {best_sel.lower:.3f} on {best_sel.hits} hits)"
                if best_sel
                else ""
            )
        )
        + f" | {fmt(at_default) if at_default is not None else '—'} | "
        + (f"{best[0]:.3f}: {fmt(best[1])}" if best else "no point reaches LB 0.95")
        + f" | {state} |"
    )
    if lang == "zh":
        dup, non = e.cosine[e.gold], e.cosine[~e.gold]
        why = (
            f"\nWhy Chinese stays off: on these held-out ATEC pairs {name}'s cosine barely separates the "
            f"classes (median {np.median(dup):.3f} for duplicates, {np.median(non):.3f} for the rest); "
            "the token alignments see which words differ but not whether the difference matters in a "
            "customer-service question (花呗 vs 借呗 matter, 还不了 vs 不能还 do not), and ATEC's "
            "duplicates are loose rewrites. The best selection point stays far below a 0.95 lower bound, "
            "so the layer is off for zh by default; a pair classifier trained on such pairs is the next "
            "step.\n"
        )
        table += why
    text = table + "\nVerifier score curve on the same held-out pairs (reported, never used to choose):\n\n"
    return text + "\n".join(curve) + "\n", row


def own_sets(
    policies: dict[str, Policy], embs: dict[str, OnnxEmbedder], label: str, en_on: str = "minilm"
) -> str:
    """Should-miss served and should-hit caught, per language and kind, with real cosines/states."""
    lines = [
        f"#### {label}",
        "",
        "| set | lang | kind | pairs | judged same | reasons |",
        "|---|---|---|---:|---:|---|",
    ]
    for fname, want_same in (("should_miss.tsv", False), ("should_hit.tsv", True)):
        rows = read_set(fname)
        groups: dict[tuple[str, str], list[tuple[bool, str]]] = {}
        for lang, kind, a, b in rows:
            name = "e5-small" if lang == "zh" else en_on
            emb, policy = embs[name], policies[name]
            same, reason = _judge(emb, policy, a, b)
            groups.setdefault((lang, kind), []).append((same, reason))
        total = sum(len(v) for v in groups.values())
        judged = sum(s for v in groups.values() for s, _ in v)
        for (lang, kind), v in sorted(groups.items()):
            reasons = Counter(r for _, r in v).most_common(3)
            lines.append(
                f"| {fname.split('.')[0]} | {lang} | {kind} | {len(v)} | {sum(s for s, _ in v)} | "
                + ", ".join(f"{r} {n}" for r, n in reasons)
                + " |"
            )
        verdict = (
            f"**{judged} of {total} served**"
            if not want_same
            else f"**recall {judged / max(total, 1):.3f} ({judged} of {total})**"
        )
        lines.append(f"| {fname.split('.')[0]} | all | all | {total} | {judged} | {verdict} |")
    return "\n".join(lines) + "\n"


_STORES: dict[str, StateStore] = {}


def _judge(emb: OnnxEmbedder, policy: Policy, a: str, b: str) -> tuple[bool, str]:
    if not (emb.can_read(a) and emb.can_read(b)):
        d = decide(a, b, 0.0, Policy(policy.embedder))  # near-exact only: the gate skips the model
        return d.same, d.reason if d.same else "unreadable"
    store = _STORES.setdefault(emb.name, read_states(emb, [a, b], None))
    if a not in store.index or b not in store.index:
        store = _STORES[emb.name] = read_states(emb, [a, b], None)
    cos = float(store.vector(a) @ store.vector(b))
    pa, sa = store.states(a)
    pb, sb = store.states(b)
    d = decide(a, b, cos, policy, alignment(pa, sa, pb, sb))
    return d.same, d.reason


def warm_sets(embs: dict[str, OnnxEmbedder]) -> None:
    rows = read_set("should_miss.tsv") + read_set("should_hit.tsv")
    for name, emb in embs.items():
        texts = sorted({t for _, _, a, b in rows for t in (a, b) if emb.can_read(t)})
        _STORES[name] = read_states(emb, texts, None)


def decision_cost(emb: OnnxEmbedder, policy: Policy) -> str:
    """Per candidate, beside the embedding: alignment from token states + guards + features + score."""
    rows = read_set("should_miss.tsv") + read_set("should_hit.tsv")
    pairs = [
        (a, b) for _, _, a, b in rows if emb.can_read(a) and emb.can_read(b) and canonical(a) != canonical(b)
    ]
    store = _STORES[emb.name]
    forced = Policy(
        policy.embedder,
        policy.target,
        {k: replace(v, threshold=v.threshold or 0.99, min_cosine=0.0) for k, v in policy.languages.items()},
    )
    took = []
    for a, b in pairs * 3:
        cos = float(store.vector(a) @ store.vector(b))
        pa, sa = store.states(a)
        pb, sb = store.states(b)
        t0 = time.perf_counter()
        decide(a, b, cos, forced, alignment(pa, sa, pb, sb))
        took.append(time.perf_counter() - t0)
    ms = np.array(took) * 1000
    texts = sorted({t for p in pairs[:64] for t in p})
    t0 = time.perf_counter()
    for t in texts:
        emb.embed_with_states([t])
    per_text = (time.perf_counter() - t0) / len(texts) * 1000
    t0 = time.perf_counter()
    for t in texts:
        emb.embed_sync([t])
    per_embed = (time.perf_counter() - t0) / len(texts) * 1000
    return (
        f"| {emb.name} | {len(took)} | {np.percentile(ms, 50):.3f} | {np.percentile(ms, 99):.3f} | "
        f"{per_embed:.2f} | {per_text:.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dedup_eval.md")
    ap.add_argument("--judge-cache", type=Path, default=None, help="token-state cache of the judge's pairs")
    args = ap.parse_args(argv)
    data = args.data or default_data_dir()
    t0 = time.perf_counter()
    from load.eval_judge import report as judge_report

    judge_section = judge_report(args.model_dir, data, args.judge_cache)
    embs = {name: load_embedder(name, args.model_dir) for name in EMBEDDERS}
    shipped = {name: load_policy(name) for name in EMBEDDERS}
    tables: list[str] = []
    defaults = [
        "| embedder | language | cosine floor | shipped point (selection: precision, LB, hits) "
        "| at the shipped point, held out | best held-out point with LB >= 0.95 (reported only) "
        "| semantic by default |",
        "|---|---|---:|---|---|---|---|",
    ]
    for name in EMBEDDERS:
        full = load_policy(name, 0.0)
        for lang in SHIPPED:
            point = full.languages.get(lang)
            if point is None:
                defaults.append(f"| {name} | {lang} | — | — | — | — | off: {name} cannot read {lang} |")
                continue
            point = replace(point, threshold=shipped[name].languages[lang].threshold)
            table, row = held_out(name, embs[name], lang, point, data)
            tables.append(table)
            defaults.append(row)
    warm_sets(embs)
    looser = {name: load_policy(name, 0.8) for name in EMBEDDERS}
    sets = own_sets(shipped, embs, "At the shipped defaults, en on minilm (the gate's default embedder)")
    sets_e5 = own_sets(
        shipped, embs, "At the shipped defaults, en on e5-small (a profile choosing e5-small)", "e5-small"
    )
    sets_loose = own_sets(
        looser, embs, "For comparison: target 0.80 (not shipped), en on e5-small", "e5-small"
    )
    cost = [
        "| embedder | decisions timed | p50 ms | p99 ms | embed one text, ms "
        "| embed + token states one text, ms |",
        "|---|---:|---:|---:|---:|---:|",
    ] + [decision_cost(embs[n], looser[n]) for n in EMBEDDERS]
    parts = [
        "# Semantic dedup evaluation\n",
        "Generated by `python load/eval_dedup.py` from the shipped calibration "
        "(`python -m extproc.dedup.calibrate --rebuild-shipped`). Every precision comes with its 95% "
        "Wilson lower bound (LB). English: verifier fitted on 60% of STS-B train, threshold chosen on the "
        "other 40%, reported on all of STS-B dev (score >= 4.0 = same). Chinese: ATEC split by a hash of "
        "the pair, 40% fit / 20% select / 40% held out (reported). A language is on by default when its "
        "selection lower bound reaches 0.95 on at least 30 hits. Near-exact pairs count as hits in every "
        "row.\n",
        judge_section,
        "## Defaults (verifier, without the judge)\n",
        "\n".join(defaults) + "\n",
        "## The project's own pair sets (tests/dedup/data, real embeddings; zh always on e5-small)\n",
        sets,
        sets_e5,
        sets_loose,
        "## Decision cost per candidate beside the embedding (rough: 2 shared cores)\n",
        "Alignment (from token states) + guards + features + verifier score, per candidate pair that is not "
        "near-exact (the own sets' should-miss pairs and the should-hit pairs that reach the verifier). "
        "The last "
        "two columns are the model's cost per text, for scale: reading token states rides on the same "
        "forward pass as the embedding.\n",
        "\n".join(cost) + "\n",
        "## Held-out tables\n",
        *tables,
    ]
    text = "\n".join(parts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    print(f"({time.perf_counter() - t0:.0f}s; written to {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
