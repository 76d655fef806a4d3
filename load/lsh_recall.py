"""LSH recall against brute force at the operating point, on real embeddings.

For each embedder, language and precision target whose operating point is on: store the
first sentence of every pair of a paraphrase set (through `MemoryStore`, the same bucket and
ranking algorithm as the Redis script), query with the second, and compare two lookups:

- brute force: the stored vector with the highest cosine, if at or above the floor, through
  `decide` (guards + verifier);
- the cache: LSH buckets → at most `max_candidates` candidates (most shared bands first) →
  exact cosine → the best through `decide` — what `extproc.stages.cache` does.

recall = share of brute-force hits the cache also makes (the same stored answer). Also the
candidates a lookup fetches, the largest LSH bucket, and the Redis time of one candidates call
at that store size. Buckets keep at most `--band-cap` entries (the store's cap, the default);
`--template` wraps every sentence in one long prompt template, the skewed traffic on which the
cap bites (load/bench_candidates.py times it at 100,000 entries). `--center` hashes around the
measured vectors' own mean; `--center-file` around a centre `llm-gate lsh-center` made from
another sample, as an operator would: `--skip N --write-prompts FILE` writes that sample (the
pairs after the first N, as JSONL request bodies) and stops.

Run: ``python -m load.lsh_recall [--n 2000] [--target 0.8 --target 0.9] [--template] [--band-cap 64]``
Writes load/results/lsh_recall[_OPTIONS].json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from extproc.cache.center import CenterError, meta_path, read_center
from extproc.cache.redis_store import RedisStore
from extproc.cache.semantic import Matcher, floor
from extproc.cache.store import DEFAULT_BAND_CAP, MemoryStore, Put
from extproc.dedup.decide import Policy, load_policy
from load.stack import free_port, wait_port

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "paraphrase"
RESULTS = Path(__file__).resolve().parent / "results"
SETS = {"en": "stsb-en.train.tsv", "zh": "atec-zh.valid.tsv"}
TEMPLATE = {
    "en": "You are the support assistant of an online shop. Answer the customer's message below in a "
    "friendly tone, in at most three sentences, and do not make up order numbers.\n\nMessage: {}",
    "zh": "你是一家网上商店的客服助手。请用友好的语气、不超过三句话回答下面这位顾客的问题，"
    "不要编造订单号。\n\n问题：{}",
}


def pairs(name: str, n: int, data: Path = DATA) -> tuple[list[str], list[str]]:
    stored: dict[str, None] = {}
    queries: dict[str, None] = {}
    for line in (data / name).read_text(encoding="utf-8").splitlines():
        a, b, *_ = line.split("\t")
        if a != b and a not in stored and b not in queries:
            stored.setdefault(a)
            queries.setdefault(b)
        if len(stored) >= n:
            break
    return list(stored), list(queries)


class _Dim:
    def __init__(self, name: str, dim: int) -> None:
        self.name, self.dim = name, dim


async def compare(
    policy: Policy,
    lang: str,
    stored: list[str],
    queries: list[str],
    d: np.ndarray,
    q: np.ndarray,
    cap: int,
    band_cap: int = DEFAULT_BAND_CAP,
    center: np.ndarray | None = None,
) -> dict[str, Any]:
    matcher = Matcher.create(_Dim(policy.embedder, d.shape[1]), policy, max_candidates=cap, center=center)  # type: ignore[arg-type]
    assert matcher is not None
    store = MemoryStore()
    for i, v in enumerate(d):
        bands = tuple(matcher.lsh.band_keys(v))
        await store.put(
            Put(
                "bench",
                str(i),
                stored[i].encode(),
                3_600_000,
                len(d) + 1,
                "t",
                "m",
                v.tobytes(),
                bands,
                None,
                band_cap,
            )
        )
    uncapped = Counter(k for v in d for k in matcher.lsh.band_keys(v))
    low = policy.languages[lang].min_cosine
    brute_hits = cache_hits = agree = best_found = best_total = 0
    sizes: list[int] = []
    for j, v in enumerate(q):
        cosines = d @ v
        best = int(np.argmax(cosines))
        brute = (
            best
            if cosines[best] >= low and matcher.same(queries[j], stored[best], float(cosines[best])).same
            else None
        )
        cands = await store.candidates("bench", matcher.lsh.band_keys(v), cap)
        sizes.append(len(cands))
        if cosines[best] >= low:
            best_total += 1
            best_found += str(best) in {k for k, _ in cands}
        ranked = matcher.ranked(v, cands)
        mine = None
        if ranked:
            key, cos = ranked[0]
            mine = int(key) if matcher.same(queries[j], stored[int(key)], cos).same else None
        brute_hits += brute is not None
        cache_hits += mine is not None
        agree += brute is not None and mine == brute
    return {
        "floor": low,
        "lsh_floor": floor(policy),
        "rows": matcher.lsh.rows,
        "bands": matcher.lsh.bands,
        "queries": len(q),
        "stored": len(d),
        "brute_hits": brute_hits,
        "cache_hits": cache_hits,
        "recall": round(agree / brute_hits, 4) if brute_hits else None,
        "best_in_candidates": round(best_found / best_total, 4) if best_total else None,
        "candidates_mean": round(float(np.mean(sizes)), 1),
        "candidates_p99": int(np.percentile(sizes, 99)),
        "largest_bucket": max(uncapped.values()),
        "band_cap": band_cap,
    }


def redis_timing(
    d: np.ndarray, matcher: Matcher, cap: int, lookups: int = 200, band_cap: int = DEFAULT_BAND_CAP
) -> dict[str, float]:
    """p50/p99 of one candidates call on a real redis-server holding these vectors."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--save", "", "--dir", tmp], stdout=subprocess.DEVNULL
        )
        try:
            wait_port(port, 10, proc)
            url = f"redis://127.0.0.1:{port}/0"
            times = asyncio.run(_time_candidates(url, d, matcher, cap, lookups, band_cap))
        finally:
            proc.kill()
            proc.wait()
    return {
        "redis_p50_ms": round(1000 * float(np.median(times)), 2),
        "redis_p99_ms": round(1000 * float(np.percentile(times, 99)), 2),
    }


async def _time_candidates(
    url: str, d: np.ndarray, matcher: Matcher, cap: int, lookups: int, band_cap: int
) -> list[float]:
    client = aioredis.Redis.from_url(url)
    store = RedisStore(client)
    for i, v in enumerate(d):
        bands = tuple(matcher.lsh.band_keys(v))
        await store.put(
            Put("bench", str(i), b"x", 3_600_000, len(d) + 1, "t", "m", v.tobytes(), bands, None, band_cap)
        )
    times = []
    for v in d[:lookups]:
        t0 = time.perf_counter()
        await store.candidates("bench", matcher.lsh.band_keys(v), cap)
        times.append(time.perf_counter() - t0)
    await client.aclose()
    return times


def sample(file: str, lang: str, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(stored, queries): the pairs after the first `--skip`, in the template with `--template`."""
    stored, queries = pairs(file, args.skip + args.n, args.data)
    stored, queries = stored[args.skip :], queries[args.skip :]
    if args.template:
        return [TEMPLATE[lang].format(t) for t in stored], [TEMPLATE[lang].format(t) for t in queries]
    return stored, queries


def write_prompts(args: argparse.Namespace) -> int:
    """Both sides of the sample, one chat request body a line: `llm-gate lsh-center --prompts`."""
    lines = []
    for lang, file in SETS.items():
        if not args.lang or lang in args.lang:
            stored, queries = sample(file, lang, args)
            lines += [json.dumps({"messages": [{"role": "user", "content": t}]}) for t in stored + queries]
    args.write_prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{args.write_prompts}: {len(lines)} prompts")
    return 0


def _provenance(path: Path) -> str:
    """Where a centre file came from, as its description says (`llm-gate lsh-center`)."""
    meta = json.loads(meta_path(path).read_text(encoding="utf-8"))
    return (
        f"Hashed around `{path}`: the mean of {meta.get('prompts')} prompts' {meta.get('embedder')} "
        f"embeddings from `{meta.get('source')}` (norm {meta.get('norm')}).\n\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load.lsh_recall", description=__doc__.split("\n")[0])
    parser.add_argument("--embedder", action="append", help="minilm, e5-small (default both)")
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--target", type=float, action="append", help="precision targets (default 0.8, 0.9)")
    parser.add_argument("--cap", type=int, default=128, help="cache.semantic.max_candidates")
    parser.add_argument("--band-cap", type=int, default=DEFAULT_BAND_CAP, help="entries an LSH bucket keeps")
    parser.add_argument("--template", action="store_true", help="wrap every sentence in one prompt template")
    parser.add_argument("--lang", action="append", help="en, zh (default both)")
    centre = parser.add_mutually_exclusive_group()
    centre.add_argument("--center", action="store_true", help="hash around the stored vectors' mean")
    centre.add_argument(
        "--center-file", type=Path, help="hash around this centre (`llm-gate lsh-center`, another sample)"
    )
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N pairs (another sample)")
    parser.add_argument(
        "--write-prompts", type=Path, help="write the sample's prompts as JSONL request bodies, and stop"
    )
    parser.add_argument("--data", type=Path, default=DATA, help="the paraphrase sets' folder")
    args = parser.parse_args(argv)
    if args.write_prompts:
        return write_prompts(args)
    from extproc.embed import load_embedder

    rows: list[dict[str, Any]] = []
    for name in args.embedder or ["minilm", "e5-small"]:
        embedder = load_embedder(name, args.model_dir)
        for lang, file in SETS.items():
            if args.lang and lang not in args.lang:
                continue
            policies = {t: load_policy(name, t) for t in args.target or [0.8, 0.9]}
            if not any(p.enabled(lang) for p in policies.values()):
                rows.append(
                    {"embedder": name, "lang": lang, "target": "-", "note": "semantic off at every target"}
                )
                continue
            stored, queries = sample(file, lang, args)
            d, q = embedder.embed_sync(stored), embedder.embed_sync(queries)
            center = d.mean(axis=0) if args.center else None
            if args.center_file:
                try:
                    center = read_center(args.center_file, name, d.shape[1])
                except CenterError as exc:
                    parser.error(str(exc))
            for target, policy in policies.items():
                if not policy.enabled(lang):
                    rows.append({"embedder": name, "lang": lang, "target": target, "note": "semantic off"})
                    continue
                row = {
                    "embedder": name,
                    "lang": lang,
                    "target": target,
                    "prompts": ("template" if args.template else "plain")
                    + (", centred" if args.center else "")
                    + (f", centred on {args.center_file.name}" if args.center_file else ""),
                    **asyncio.run(
                        compare(policy, lang, stored, queries, d, q, args.cap, args.band_cap, center)
                    ),
                }
                dim: Any = _Dim(name, d.shape[1])  # all Matcher.create reads of an embedder
                matcher = Matcher.create(dim, policy, max_candidates=args.cap, center=center)
                assert matcher is not None
                row.update(redis_timing(d, matcher, args.cap, band_cap=args.band_cap))
                rows.append(row)
                print(json.dumps(row), flush=True)
    RESULTS.mkdir(exist_ok=True)
    flags = "".join(f" --embedder {e}" for e in args.embedder or []) + "".join(
        f" --lang {x}" for x in args.lang or []
    )
    flags += "".join(f" --target {t}" for t in args.target or [])
    flags += (" --template" if args.template else "") + (" --center" if args.center else "")
    flags += f" --band-cap {args.band_cap}" if args.band_cap != DEFAULT_BAND_CAP else ""
    flags += f" --skip {args.skip}" if args.skip else ""
    named = flags + (f" --center-file {args.center_file.stem}" if args.center_file else "")
    flags += f" --center-file {args.center_file}" if args.center_file else ""
    name = "lsh_recall" + named.replace(" --", "_").replace(" ", "-")
    (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=1))
    head = [
        "embedder",
        "lang",
        "target",
        "prompts",
        "floor",
        "rows",
        "bands",
        "stored",
        "brute_hits",
        "cache_hits",
        "recall",
        "best_in_candidates",
        "candidates_mean",
        "candidates_p99",
        "largest_bucket",
        "band_cap",
        "redis_p50_ms",
        "redis_p99_ms",
        "note",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(row.get(h, "")) for h in head) + " |" for row in rows]
    text = (
        f"LSH recall vs brute force at the operating point (`python -m load.lsh_recall --n {args.n}{flags}`),"
        f" max_candidates {args.cap}, buckets capped at {args.band_cap} entries.\n\n"
        + (_provenance(args.center_file) if args.center_file else "")
        + "\n".join(lines)
        + "\n"
    )
    (RESULTS / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
