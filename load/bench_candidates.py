"""The candidates call on skewed traffic: 100,000 entries in one scope, template-like prompts.

Prompts that follow a template ("Summarise this ticket: ...", "Translate to French: ...")
embed close together, so most of a scope lands in the same few LSH buckets. This fills one
scope of a real redis-server through `RedisStore.put` with such vectors and times
`RedisStore.candidates` for queries drawn from the same traffic, once with the buckets capped
(`band_cap`, the default) and once uncapped (the previous behaviour), and reports:

- the largest bucket (members) and the members one call reads at most;
- the call's time in Redis (SLOWLOG at threshold 0: the server's own time of each script run)
  and at the client (round trip with the vectors it returns), p50 / p99 / max.

The vectors are synthetic so 100,000 of them take seconds: `templates` unit centres in the
embedder's dimension with Zipf popularity (the first template is about a fifth of the
traffic), each entry its template's centre plus noise (cosine about 0.9 within a template),
hashed with the LSH the gate uses for MiniLM at its default operating point (5 rows x 27
bands).

Run: ``python -m load.bench_candidates [--n 100000] [--lookups 2000] [--uncapped-lookups 100]``
Writes load/results/bench_candidates.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from extproc.cache.lsh import Lsh
from extproc.cache.redis_store import RedisStore, scope_prefix
from extproc.cache.store import DEFAULT_BAND_CAP, Put
from load.stack import RedisServer

RESULTS = Path(__file__).resolve().parent / "results"
SCOPE = "bench"
UNCAPPED = 1_000_000_000


def template_vectors(n: int, dim: int, templates: int, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((templates, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = 1.0 / np.arange(1, templates + 1)
    which = rng.choice(templates, size=n, p=weights / weights.sum())
    out = centres[which] + rng.standard_normal((n, dim)).astype(np.float32) * (noise / np.sqrt(dim))
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    vectors: np.ndarray = out.astype(np.float32)
    return vectors


async def fill(
    store: RedisStore, vectors: np.ndarray, keys: list[list[str]], cap: int, batch: int = 16
) -> None:
    for start in range(0, len(vectors), batch):
        await asyncio.gather(
            *(
                store.put(
                    Put(
                        SCOPE,
                        f"k{i}",
                        b"x" * 64,
                        3_600_000,
                        len(vectors) + 1,
                        "t",
                        "m",
                        vectors[i].tobytes(),
                        tuple(keys[i]),
                        None,
                        cap,
                    )
                )
                for i in range(start, min(start + batch, len(vectors)))
            )
        )


async def largest_bucket(client: aioredis.Redis) -> int:
    biggest = 0
    async for name in client.scan_iter(
        match=scope_prefix(SCOPE).replace("{", "\\{").replace("}", "\\}") + "q:*", count=1000
    ):
        biggest = max(biggest, int(await client.zcard(name)))
    return biggest


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(float(np.percentile(values, 50)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
        "max": round(float(np.max(values)), 3),
    }


async def run_one(
    url: str, vectors: np.ndarray, queries: np.ndarray, lsh: Lsh, cap: int, limit: int
) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    await client.flushall()
    store = RedisStore(client)
    keys = [lsh.band_keys(v) for v in vectors]
    started = time.perf_counter()
    await fill(store, vectors, keys, cap)
    fill_s = time.perf_counter() - started
    biggest = await largest_bucket(client)
    await store.candidates(SCOPE, lsh.band_keys(queries[0]), limit)  # load the script
    await client.config_set("slowlog-log-slower-than", 0)
    await client.config_set("slowlog-max-len", len(queries) + 100)
    await client.slowlog_reset()
    at_client, returned = [], []
    for q in queries:
        t0 = time.perf_counter()
        found = await store.candidates(SCOPE, lsh.band_keys(q), limit)
        at_client.append(1000 * (time.perf_counter() - t0))
        returned.append(len(found))
    log = await client.slowlog_get(len(queries) + 100)
    in_redis = [entry["duration"] / 1000 for entry in log if b"EVALSHA" in _command(entry).upper()]
    await client.config_set("slowlog-log-slower-than", 10_000)
    await client.aclose()
    return {
        "band_cap": None if cap == UNCAPPED else cap,
        "entries": len(vectors),
        "fill_s": round(fill_s, 1),
        "largest_bucket": biggest,
        "max_members_read": lsh.bands * biggest,
        "returned_mean": round(float(np.mean(returned)), 1),
        "lookups": len(queries),
        "redis_ms": _ms(in_redis),
        "client_ms": _ms(at_client),
    }


def _command(entry: dict[str, Any]) -> bytes:
    command = entry.get("command", b"")
    return command if isinstance(command, bytes) else str(command).encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m load.bench_candidates", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--n", type=int, default=100_000, help="entries in the scope")
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--uncapped-lookups", type=int, default=100, help="uncapped calls are slow")
    parser.add_argument("--templates", type=int, default=50)
    parser.add_argument("--noise", type=float, default=0.33, help="per-entry noise (0.33: cosine ~0.9)")
    parser.add_argument("--cap", type=int, default=DEFAULT_BAND_CAP, help="band_cap to measure")
    parser.add_argument("--limit", type=int, default=128, help="cache.semantic.max_candidates")
    parser.add_argument("--no-uncapped", action="store_true", help="skip the uncapped comparison")
    args = parser.parse_args(argv)
    dim, rows, bands = 384, 5, 27
    vectors = template_vectors(args.n, dim, args.templates, args.noise, seed=1)
    # Queries from the same traffic: the same centres (same seed), entries not stored.
    queries = template_vectors(args.n + args.lookups, dim, args.templates, args.noise, seed=1)[args.n :]
    lsh = Lsh.create(dim, rows, bands, seed=0, name="minilm")
    bucket_sizes = Counter(k for v in vectors[:20_000] for k in lsh.band_keys(v))
    print(f"largest bucket among the first 20,000 uncapped: {max(bucket_sizes.values())}", flush=True)
    server = RedisServer().start()
    rows_out: list[dict[str, Any]] = []
    try:
        for cap in [args.cap] + ([] if args.no_uncapped else [UNCAPPED]):
            asked = queries if cap != UNCAPPED else queries[: args.uncapped_lookups]
            row = asyncio.run(run_one(server.url, vectors, asked, lsh, cap, args.limit))
            print(json.dumps(row), flush=True)
            rows_out.append(row)
    finally:
        server.kill()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_candidates.json").write_text(json.dumps(rows_out, indent=1))
    head = [
        "band_cap",
        "lookups",
        "entries",
        "largest_bucket",
        "max_members_read",
        "returned_mean",
        "redis p50/p99/max ms",
        "client p50/p99/max ms",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows_out:
        cells = [
            r["band_cap"] or "none",
            r["lookups"],
            r["entries"],
            r["largest_bucket"],
            r["max_members_read"],
            r["returned_mean"],
            "/".join(str(r["redis_ms"][k]) for k in ("p50", "p99", "max")),
            "/".join(str(r["client_ms"][k]) for k in ("p50", "p99", "max")),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    text = (
        f"Candidates call, one scope of {args.n} template-like entries ({args.templates} templates, Zipf), "
        f"LSH {rows}x{bands}, max_candidates {args.limit} "
        f"(`python -m load.bench_candidates --n {args.n} --lookups {args.lookups}`). Shared 2-core machine: "
        "timings are rough.\n\n" + "\n".join(lines) + "\n"
    )
    (RESULTS / "bench_candidates.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
