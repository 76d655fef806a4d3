"""`python -m load.bench_wake`: how much slower the same Python runs right after its thread slept.

At one connection the gate sleeps between requests and, on a semantic miss, while its embedding
thread runs the model; every step after the wake-up runs on a core that was idle. This measures
that state apart from the code: a fixed 2,000-step loop back to back and after sleeps of 0.1-20
ms, and the LSH band keys of one vector (the first step after an embedding) in a loop and right
after a model run. Writes load/results/bench_wake.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from extproc.cache.lsh import Lsh
from extproc.embed import load_embedder

RESULTS = Path(__file__).parent / "results" / "bench_wake.md"


def _loop_us() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(2000):
        total += i
    return (time.perf_counter() - started) * 1e6


def _median_us(run: Callable[[], object], before: Callable[[], object], times: int) -> float:
    took = []
    for _ in range(times):
        before()
        started = time.perf_counter()
        run()
        took.append((time.perf_counter() - started) * 1e6)
    return statistics.median(took)


def _nothing() -> None:
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load.bench_wake", description=__doc__.split("\n")[0])
    parser.add_argument("--times", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    lines = ["# The same Python after a sleep", "", f"`python -m load.bench_wake` (medians of {args.times}).",
             "", "| what | before it | median µs |", "|---|---|---:|"]
    lines.append(f"| 2,000-step loop | nothing | {_median_us(_loop_us, _nothing, args.times):.1f} |")
    for ms in (0.1, 1, 5, 20):
        nap = functools.partial(time.sleep, ms / 1000)
        lines.append(f"| 2,000-step loop | a {ms} ms sleep | {_median_us(_loop_us, nap, args.times):.1f} |")
    embedder = load_embedder("minilm")
    lsh = Lsh.create(embedder.dim, 8, 27, 0, None, "minilm")
    vector = np.random.default_rng(2).standard_normal(embedder.dim).astype(np.float32)
    with ThreadPoolExecutor(1) as thread:
        def embed() -> None:
            thread.submit(embedder.embed_sync, ["How do I reset the password of my account?"]).result()

        def keys() -> None:
            lsh.band_keys(vector)

        for before, name in ((_nothing, "nothing"), (embed, "an embedding in another thread")):
            us = _median_us(keys, before, args.times)
            lines.append(f"| LSH band keys of one vector | {name} | {us:.1f} |")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
