"""Closed-loop benchmark of self-calibration: does the gate learn which semantic candidates it
may serve, reach the precision target, and serve no more wrong answers than the target allows
while it learns?

    python load/bench_selfcal.py [--epochs 6] [--target 0.95] [--share 0.03] [--concurrency 8]
                                 [--no-prior] [--warm-share 0.25]

The real stack on loopback: Envoy, two gate processes, Redis, the simulator, the `minilm`
embedder (whose shipped operating point reaches no precision target in English, so without
self-calibration its semantic layer is off). Workload: the held-out English pairs of the
shared paraphrase data (STS-B dev, never used to fit or choose the verifier; score >= 4 =
the same question). Each pair's first prompt is sent, then its second, in a cache scope of the
pair's own (its `seed`), so the second prompt's only candidate is the first and the pair's
label says whether serving it is right. The simulator answers by family (`x-sim-family`: the
same family for a pair labelled the same, two families otherwise), so a served answer is
wrong exactly when its family is not the request's; the gate compares answers, never labels.
Pairs run `--concurrency` at a time. A bin whose shipped selection pairs (STS-B train,
disjoint from dev) prove the target starts with its prior (`--no-prior`: every bin from nothing).

One pass over the held-out pairs gives each bin a few dozen candidates, fewer than a 0.95
lower bound needs (73 agreeing checks at the least), so the pass runs `--epochs` times, each
in fresh scopes with fresh family ids, shuffled: the cache starts empty every epoch while
the bins' evidence carries over. A pair re-asked in a later epoch is checked again and counts
again: the bound is over checks, as in production, where a question recurs after its entry
expires. Writes load/results/selfcal.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from extproc.dedup.calibrate import default_data_dir, read_pairs, split_roles
from extproc.dedup.selfcheck import wilson_lower
from load.stack import Stack

RESULTS = Path(__file__).resolve().parent / "results"
CHAT = "/v1/chat/completions"
FAMILY = re.compile(r"Family (\S+) answer:")


def workload(data: Path, limit: int | None) -> list[tuple[str, str, bool]]:
    """(first prompt, second prompt, same question?) per held-out pair."""
    pairs = read_pairs(data / "stsb-en.dev.tsv", "score", 4.0, split_roles(0, 0))  # all held out
    return [(p.a, p.b, p.same) for p in pairs if p.role == "test"][:limit]


@dataclass
class Epoch:
    epoch: int
    requests: int = 0
    semantic_served: int = 0
    semantic_wrong: int = 0
    other_hits: int = 0  # exact and near-exact
    other_wrong: int = 0
    checks_seen: int = 0  # x-gate-cache: check
    candidates_served: float = 0.0  # from the gates' metrics
    candidates_checked: float = 0.0
    checks_agreed: float = 0.0
    checks_differed: float = 0.0
    serving_served: float = 0.0  # candidates of the bins serving at the epoch's end
    serving_checked: float = 0.0
    errors: int = 0
    seconds: float = 0.0
    bins: list[dict[str, Any]] = field(default_factory=list)


async def one(client: httpx.AsyncClient, text: str, family: str, scope: int, e: Epoch) -> None:
    body = {"model": "llama-3-8b", "seed": scope, "max_tokens": 64,
            "messages": [{"role": "user", "content": text}]}
    try:
        r = await client.post(CHAT, json=body, headers={"x-sim-family": family})
    except httpx.HTTPError:
        e.errors += 1
        return
    e.requests += 1
    if r.status_code != 200:
        e.errors += 1
        return
    got = FAMILY.search(str(r.json()["choices"][0]["message"]["content"]))
    wrong = got is None or got.group(1) != family
    cache, match = r.headers.get("x-gate-cache"), r.headers.get("x-gate-cache-match")
    if cache == "check":
        e.checks_seen += 1
    if cache == "hit" and match == "semantic":
        e.semantic_served += 1
        e.semantic_wrong += wrong
    elif cache in ("hit", "coalesced"):
        e.other_hits += 1
        e.other_wrong += wrong


def scrape(stack: Stack) -> dict[str, float]:
    totals: dict[str, float] = {}
    for port in stack.metrics_ports:
        for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
            for name, label in (("gate_cache_selfcheck_candidates_total", "action"),
                                ("gate_cache_selfcheck_checks_total", "outcome")):
                if line.startswith(name + "{"):
                    value, bin_ = re.search(rf'{label}="(\w+)"', line), re.search(r'bin="([\d.]+)"', line)
                    for key in (f"{name}:{value.group(1)}" if value else None,
                                f"{name}:{value.group(1)}:{bin_.group(1)}" if value and bin_ else None):
                        if key:
                            totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def bins(stack: Stack) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "extproc.cli", "dedup", "status", "--json", "--config",
                          str(stack.workdir / "gate.yaml")], capture_output=True, check=True, timeout=60)
    return list(json.loads(out.stdout))


async def run_epoch(stack: Stack, work: list[tuple[str, str, bool]], epoch: int, concurrency: int) -> Epoch:
    """Every pair in a cache scope of its own (its `seed`): the second prompt's one candidate is
    the first, and its label says whether serving it would be right."""
    e, queue = Epoch(epoch), asyncio.Queue[tuple[int, str, str, bool]]()
    order = list(enumerate(work))
    random.Random(epoch).shuffle(order)
    for i, (a, b, same) in order:
        queue.put_nowait((i, a, b, same))
    before, started = scrape(stack), time.monotonic()

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, a, b, same = queue.get_nowait()
            scope, family = epoch * 100_000 + i, f"e{epoch}p{i}"
            await one(client, a, family, scope, e)
            await one(client, b, family if same else family + "b", scope, e)

    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    await asyncio.sleep(1.0)  # the last comparisons land after their answers
    e.seconds = round(time.monotonic() - started, 1)
    after = scrape(stack)

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    e.candidates_served = delta("gate_cache_selfcheck_candidates_total:serve")
    e.candidates_checked = delta("gate_cache_selfcheck_candidates_total:check")
    e.checks_agreed = delta("gate_cache_selfcheck_checks_total:agreed")
    e.checks_differed = delta("gate_cache_selfcheck_checks_total:differed")
    e.bins = bins(stack)
    serving = {b["bin"] for b in e.bins if b["state"] == "serving" and b["tenant"] != "*"}
    e.serving_served = sum(delta(f"gate_cache_selfcheck_candidates_total:serve:{b}") for b in serving)
    e.serving_checked = sum(delta(f"gate_cache_selfcheck_candidates_total:check:{b}") for b in serving)
    return e


def report(epochs: list[Epoch], args: argparse.Namespace, pairs: int, command: str) -> str:
    t = args.target
    served = sum(e.semantic_served for e in epochs)
    wrong = sum(e.semantic_wrong for e in epochs)
    cands = sum(e.candidates_served + e.candidates_checked for e in epochs)
    checked = sum(e.candidates_checked for e in epochs)
    first = epochs[0]
    all_checks = first.checks_agreed + first.checks_differed
    last = epochs[-1]
    last_cands = last.candidates_served + last.candidates_checked
    right = served - wrong
    lines = [
        "# Self-calibration of the semantic cache: closed loop through the real stack",
        "",
        f"Command: `{command}`",
        "",
        f"Envoy, 2 gate processes, Redis, the simulator; embedder `minilm` (its shipped English operating "
        f"point reaches no target, so without self-calibration it serves no semantic hit). Workload: the "
        f"{pairs} held-out STS-B dev pairs (score >= 4 = same question), first prompt then second, "
        f"{args.concurrency} pairs at a time, every pair in a cache scope of its own; {args.epochs} "
        f"epochs (the pairs re-asked with fresh answer families; the bins' evidence carries over). "
        f"Self-check: target {t}, share {args.share}, min_checks {args.min_checks}, bins {args.bins}, "
        f"prior {not args.no_prior}, warm_share {args.warm_share}.",
        "",
        "## Result",
        "",
        f"- Precision of the semantic hits served: **{right}/{served} = "
        f"{right / served if served else 0:.4f}** (95% Wilson lower bound "
        f"{wilson_lower(right, served):.4f}); target {t}.",
        f"- Wrong answers served: **{wrong}**, where the target allows {(1 - t) * served:.1f} "
        f"((1 - {t}) x {served} hits served). Exact and near-exact hits: "
        f"{sum(e.other_hits for e in epochs)}, wrong {sum(e.other_wrong for e in epochs)}.",
        f"- Semantic candidates sent upstream to be checked: {checked:.0f} of {cands:.0f} "
        f"(**{checked / cands if cands else 0:.1%}**) over the whole run; "
        f"{last.candidates_checked:.0f} of {last_cands:.0f} "
        f"({last.candidates_checked / last_cands if last_cands else 0:.1%}) in the last epoch.",
        f"- Semantic hits served in the last epoch: **{last.semantic_served}** "
        f"({last.semantic_served / last.requests if last.requests else 0:.1%} of its {last.requests} "
        f"requests), {last.semantic_wrong} wrong.",
        f"- Reference from the same run: in epoch 1 every candidate was checked; had all been served, "
        f"their precision would have been {first.checks_agreed:.0f}/{all_checks:.0f} = "
        f"{first.checks_agreed / all_checks if all_checks else 0:.3f}.",
        "",
        "## Per epoch",
        "",
        "| epoch | requests | semantic hits | wrong | allowed by target | candidates | checked | "
        "checked share | checks agreed / differed | bins serving at its end | checked share in them | "
        "seconds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for e in epochs:
        c = e.candidates_served + e.candidates_checked
        in_bins = e.serving_served + e.serving_checked
        in_serving = f"{e.serving_checked / in_bins:.1%} of {in_bins:.0f}" if in_bins else "-"
        serving = ", ".join(f"{b['bin']}" for b in e.bins if b["state"] == "serving" and b["tenant"] != "*")
        lines.append(
            f"| {e.epoch} | {e.requests} | {e.semantic_served} | {e.semantic_wrong} | "
            f"{(1 - t) * e.semantic_served:.1f} | {c:.0f} | {e.candidates_checked:.0f} | "
            f"{e.candidates_checked / c if c else 0:.1%} | "
            f"{e.checks_agreed:.0f} / {e.checks_differed:.0f} | {serving or 'none'} | {in_serving} | "
            f"{e.seconds} |"
        )
    lines += ["", "## Bins at the end (`llm-gate dedup status`; tenant * is every tenant's prior)",
              "", "| tenant | language | bin | live checks | agreed | prior agreed / checks | precision | "
              "lower bound | state |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for b in epochs[-1].bins:
        lines.append(f"| {b['tenant']} | {b['language']} | {b['bin']} | {b['checks']} | {b['agreed']} | "
                     f"{b['prior_agreed']} / {b['prior_checks']} | {b['precision']:.3f} | "
                     f"{b['lower_bound']:.3f} | {b['state']} |")
    errors = sum(e.errors for e in epochs)
    lines += ["", f"Errors (non-200 or transport): {errors}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--share", type=float, default=0.03)
    p.add_argument("--min-checks", type=int, default=30)
    p.add_argument("--bins", type=float, nargs="+", default=[0.6, 0.8, 0.9])
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--no-prior", action="store_true", help="every bin starts from nothing")
    p.add_argument("--warm-share", type=float, default=0.25)
    p.add_argument("--limit", type=int, default=None, help="only the first N pairs (a quick look)")
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS / "selfcal.md")
    args = p.parse_args(argv)
    work = workload(args.data or default_data_dir(), args.limit)
    self_check = {"enabled": True, "share": args.share, "target": args.target, "min_checks": args.min_checks,
                  "bins": args.bins, "prior": not args.no_prior, "warm_share": args.warm_share}
    config = {
        "store": {"op_timeout_ms": 500},
        "cache": {"semantic": {"embedder": "minilm", "self_check": self_check}},
        "ratelimit": {"enabled": False},
        "admission": {"enabled": False},
    }
    sim = ["--base-ttft-ms", "2", "--itl-ms", "0.2"]
    epochs: list[Epoch] = []
    with Stack(gate_config=config, gate_workers=2, with_redis=True, sim_args=sim) as stack:
        for i in range(1, args.epochs + 1):
            e = asyncio.run(run_epoch(stack, work, i, args.concurrency))
            print(f"epoch {i}: {e.requests} requests, {e.semantic_served} semantic hits, "
                  f"{e.semantic_wrong} wrong, {e.candidates_checked:.0f} checked, {e.seconds}s", flush=True)
            epochs.append(e)
    command = "python load/bench_selfcal.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(epochs, args, len(work), command.strip())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    doc = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "epochs": [asdict(e) for e in epochs]}
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
