"""Benchmark: what a candidate's token states cost when this process did not embed it.

The dedup verifier aligns the query's token states with the candidate's. The query's come with
its embedding; a cached prompt this process embedded is still in the token-states cache; one
embedded by another gate process (or evicted) is embedded once more, through the same batching
queue. This replays the project's should-hit pairs (``tests/dedup/data``) on e5-small (English
on) both ways and reports the texts run through the model per lookup, the time of ``warm`` +
``same`` per lookup, and whether the decisions agree. Writes load/results/bench_states.md.

    python -m load.bench_states
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import statistics
import time
from pathlib import Path

from extproc.cache.semantic import Matcher
from extproc.dedup import load_policy
from extproc.dedup.canonical import canonical
from extproc.embed import BatchingEmbedder, load_embedder

DATA = Path(__file__).parent.parent / "tests" / "dedup" / "data" / "should_hit.tsv"
RESULTS = Path(__file__).parent / "results" / "bench_states.md"


def pairs() -> list[tuple[str, str]]:
    with DATA.open(encoding="utf-8") as f:
        rows = [r for r in csv.reader(f, delimiter="\t") if len(r) >= 4 and r[0] == "en"]
    return [(a, b) for _, _, a, b in rows if canonical(a) != canonical(b)]


async def replay(name: str, todo: list[tuple[str, str]], embedded_here: bool) -> dict[str, float]:
    inner = load_embedder(name)
    emb = BatchingEmbedder(inner, workers=1)
    m = Matcher.create(emb, load_policy(name))
    assert m is not None and m.tokens is not None
    cached = {c: inner.embed_sync([c])[0] for _, c in todo}  # the cached prompts' stored vectors
    if embedded_here:
        for c in cached:
            await emb.embed(c)  # this process answered them: their states are kept
    texts_before, took, verdicts = emb.stats.texts, [], []
    try:
        for query, candidate in todo:
            vector = await emb.embed(query)
            t0 = time.perf_counter()
            await m.warm([query, candidate])
            d = m.same(query, candidate, float(vector @ cached[candidate]))
            took.append((time.perf_counter() - t0) * 1000)
            verdicts.append((d.same, d.reason))
    finally:
        await emb.aclose()
    took.sort()
    return {
        "lookups": len(todo),
        "texts_per_lookup": (emb.stats.texts - texts_before) / len(todo),
        "reads": m.tokens.reads,
        "p50": statistics.median(took),
        "p99": took[int(0.99 * (len(took) - 1))],
        "hits": sum(1 for s, _ in verdicts if s),
        "verdicts": verdicts,  # type: ignore[dict-item]
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--embedder", default="e5-small")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    todo = pairs()
    here = asyncio.run(replay(args.embedder, todo, embedded_here=True))
    there = asyncio.run(replay(args.embedder, todo, embedded_here=False))
    same = here.pop("verdicts") == there.pop("verdicts")
    lines = [
        "# Token states for the verifier: a candidate embedded here vs elsewhere "
        f"({time.strftime('%Y-%m-%d')})",
        "",
        f"`python -m load.bench_states --embedder {args.embedder}`: the {len(todo)} English should-hit pairs "
        "of tests/dedup/data that are not near-exact, each as a query against its cached partner; one "
        "lookup at a time on 2 shared cores (times are rough).",
        "",
        "| cached prompt embedded | lookups | texts run per lookup | states reads | hits "
        "| warm + same p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in (("by this process", here), ("by another process", there)):
        lines.append(
            f"| {label} | {r['lookups']:.0f} | {r['texts_per_lookup']:.2f} | {r['reads']:.0f} "
            f"| {r['hits']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} |"
        )
    lines += ["", f"Decisions identical both ways: {'yes' if same else 'NO'}."]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
