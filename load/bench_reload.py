"""What a config reload costs the requests in flight: `python -m load.bench_reload`.

Builds the demo config's pipeline, then builds the next one off the event loop as a SIGHUP
does (`build_started`) while a 1 ms ticker on the loop records every pause, with the
process's loaded models shared (as a reload does) and with them loaded again (`cold`, as
before models were shared). Writes load/results/bench_reload.md.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from extproc.app import build_pipeline, build_started
from extproc.config import Config
from extproc.embed import loader
from extproc.metrics import Metrics

from .demo import DEMO_CONFIG

RESULTS = Path(__file__).parent / "results" / "bench_reload.md"


async def reload_once(config: Config, metrics: Metrics, cold: bool) -> tuple[float, float]:
    """(seconds to build and start the next pipeline, the longest pause of the event loop)."""
    if cold:
        loader._shared.clear()
    pauses: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            pauses.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    started = time.perf_counter()
    pipeline = await build_started(config, metrics)
    took = time.perf_counter() - started
    done.set()
    await ticker
    assert pipeline is not None
    await pipeline.aclose()
    return took, max(pauses, default=0.0)


async def main(rounds: int) -> list[str]:
    config = Config.model_validate(DEMO_CONFIG)
    metrics = Metrics()
    running = build_pipeline(config, metrics)
    await running.start()
    rows = []
    try:
        for r in range(rounds):
            for cold in (True, False):
                took, pause = await reload_once(config, metrics, cold)
                name = "models loaded again" if cold else "models shared"
                print(f"round {r + 1}: {name:20s} build {took:.2f} s, "
                      f"longest loop pause {pause * 1e3:.0f} ms")
                rows.append(f"| {r + 1} | {name} | {took:.2f} | {pause * 1e3:.0f} |")
    finally:
        await running.aclose()
    return rows


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = asyncio.run(main(args.rounds))
    args.out.write_text(
        f"# A config reload's pause ({time.strftime('%Y-%m-%d')})\n\n"
        f"`python -m load.bench_reload --rounds {args.rounds}`: the demo config (e5-small semantic "
        "layer) rebuilt beside a running pipeline as a SIGHUP does; a 1 ms ticker on the event loop "
        "measures its longest pause meanwhile.\n\n"
        "| round | models | build and start, s | longest pause, ms |\n|---:|---|---:|---:|\n"
        + "\n".join(rows) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
