"""`python -m load.report RUN`: report.md and PNG plots from a load generator's run folder.

Reads `requests.jsonl`, `metrics.jsonl` and `run.json` (see load/loadgen.py) and writes,
beside them: latency CDF by tier, requests vs upstream (simulator) calls over time with
the share saved by kind, queue length and sheds, breaker state, bypass share, exact
accounting, and the cost model: GPU-seconds saved = upstream calls saved × GPU-seconds per
call (by default the mean time the simulator took for the calls it served), money at
`--price-per-gpu-hour`.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

from .mix import LIMITED

matplotlib.use("Agg")
import matplotlib.pyplot as plt

TIERS = ("vip", "premium", "standard")
UPSTREAM = ("miss", "bypass")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def upstream_expected(row: dict[str, Any]) -> bool:
    """Whether this answer came from a model: a model server's answer or error (the
    simulator names itself in `x-sim-name`), or a 200 that the gate called a miss, a bypass,
    or gave no cache outcome (a request that skipped the cache stage). A refusal of the
    gate's own (a shed 503 after a miss) did not reach a model."""
    cache = row.get("cache", "")
    return bool(row.get("sim")) or (row.get("status") == 200 and (cache in UPSTREAM or not cache))


def sim_calls(before: dict[str, Any], after: dict[str, Any]) -> int:
    return sum(int(after.get(p, {}).get("received", 0)) - int(before.get(p, {}).get("received", 0))
               for p in after)


@dataclass
class Accounting:
    requests: int
    complete: int
    incomplete: list[str]
    expected_calls: int
    sim_calls: int

    @property
    def holds(self) -> bool:
        return not self.incomplete and self.expected_calls == self.sim_calls

    def line(self) -> str:
        return (f"{self.complete}/{self.requests} requests got exactly one complete answer; "
                f"simulator calls {self.sim_calls} vs misses + bypasses {self.expected_calls}: "
                f"{'holds' if self.holds else 'BROKEN'}")


def accounting(rows: list[dict[str, Any]], before: dict[str, Any], after: dict[str, Any]) -> Accounting:
    ids = Counter(r["id"] for r in rows)
    bad = [r["id"] for r in rows if not r.get("complete")] + [i for i, n in ids.items() if n > 1]
    return Accounting(len(rows), len(rows) - len(bad), bad,
                      sum(1 for r in rows if upstream_expected(r)), sim_calls(before, after))


def limited_bound(seconds: float) -> float:
    return 1.1 * (float(LIMITED["rate"]) * seconds + float(LIMITED["burst"]))


def series(metrics: list[dict[str, Any]], prefix: str) -> dict[str, list[float]]:
    """Per label set of a gate metric: its value at each scrape (0 where absent)."""
    keys = sorted({k for m in metrics for k in m["gate"] if k.startswith(prefix + "{")})
    return {k[len(prefix):]: [m["gate"].get(k, 0.0) for m in metrics] for k in keys}


def label_sum(metrics: list[dict[str, Any]], prefix: str, contains: str = "") -> list[float]:
    out = [0.0] * len(metrics)
    for k, vals in series(metrics, prefix).items():
        if contains in k:
            out = [a + b for a, b in zip(out, vals, strict=True)]
    return out


def label(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()


def save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_latency(rows: list[dict[str, Any]], path: Path) -> dict[str, dict[str, float]]:
    fig, ax = plt.subplots(figsize=(7, 4))
    table = {}
    for tier in TIERS:
        lat = sorted(r["latency_ms"] for r in rows if r["tier"] == tier and r.get("status") == 200)
        if not lat:
            continue
        table[tier] = {"n": len(lat), "p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99),
                       "max": lat[-1]}
        ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=tier)
    ax.set_xscale("log")
    label(ax, "latency (ms, log)", "share of 200 answers", "Latency CDF by tier")
    save(fig, path)
    return table


def plot_traffic(rows: list[dict[str, Any]], metrics: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    if rows:
        end = int(max(r["t"] for r in rows)) + 1
        per_s, by_up, by_bypass = [0] * end, [0] * end, [0] * end
        for r in rows:
            i = int(r["t"])
            per_s[i] += 1
            by_bypass[i] += r.get("cache") == "bypass"
        if metrics:
            ts = [m["t"] for m in metrics]
            calls = [sum(int(s.get("received", 0)) for s in m["sims"].values()) for m in metrics]
            rate = [0.0] + [(calls[i] - calls[i - 1]) / max(1e-6, ts[i] - ts[i - 1])
                            for i in range(1, len(ts))]
            ax.plot(ts, rate, label="upstream (simulator) calls/s")
        else:
            for r in rows:
                by_up[int(r["t"])] += upstream_expected(r)
            ax.plot(range(end), by_up, label="upstream calls/s (from headers)")
        ax.plot(range(end), per_s, label="client requests/s")
        ax.plot(range(end), by_bypass, label="bypass answers/s", linestyle=":")
    label(ax, "s", "per second", "Requests vs upstream calls")
    save(fig, path)


def plot_gate(metrics: list[dict[str, Any]], path: Path) -> None:
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    ts = [m["t"] for m in metrics]
    if metrics:
        a1.plot(ts, label_sum(metrics, "gate_queue_length"), label="queue length (all pools)")
        sheds = label_sum(metrics, "gate_queue_sheds_total")
        a1.plot(ts, sheds, label="sheds (cumulative)")
        for pool, vals in series(metrics, "gate_breaker_state").items():
            a2.step(ts, vals, where="post", label=f"breaker {pool}")
        a2.plot(ts, [m.get("workers_up", 0) for m in metrics], linestyle=":", label="gate workers up")
    a1.set_title("Admission queue and sheds")
    a1.legend()
    a1.grid(alpha=0.3)
    a2.set_title("Breaker state (0 closed, 1 half-open, 2 open)")
    a2.set_xlabel("s")
    a2.legend()
    a2.grid(alpha=0.3)
    save(fig, path)


def build(run_dir: Path, price_per_gpu_hour: float = 2.5, gpu_seconds_per_call: float | None = None) -> str:
    rows = read_jsonl(run_dir / "requests.jsonl")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    meta = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    acc = accounting(rows, meta.get("sims_before", {}), meta.get("sims_after", {}))
    lat = plot_latency(rows, run_dir / "latency_cdf.png")
    plot_traffic(rows, metrics, run_dir / "traffic.png")
    plot_gate(metrics, run_dir / "queue_breaker.png")

    status = Counter(r.get("status") for r in rows)
    valid = [r for r in rows if not r["kind"].startswith("invalid")]
    answered = [r for r in valid if r.get("status") == 200]
    cache = Counter(r.get("cache") or "-" for r in answered)
    saved_kind = Counter(r.get("match") or "exact" for r in answered if r.get("cache") == "hit")
    saved_kind["coalesced"] = cache["coalesced"]
    saved = sum(saved_kind.values())
    bypass_share = cache["bypass"] / max(1, len(answered))
    up_lat = [r["latency_ms"] / 1000 for r in rows if r.get("cache") == "miss" and r.get("status") == 200]
    gpu_s = gpu_seconds_per_call if gpu_seconds_per_call is not None else (
        sum(up_lat) / len(up_lat) if up_lat else 0.0)
    wrong = [r for r in answered if r.get("cache") in ("hit", "coalesced") and r.get("answer_family")
             and r["answer_family"] != r["family"]]
    invalid_ok = [r for r in rows if r["kind"].startswith("invalid") and r.get("status") == 200]
    limited = [r for r in rows if r.get("limited")]
    seconds = float(meta.get("seconds") or (max((r["t"] for r in rows), default=0.0)))
    last_gate: dict[str, float] = metrics[-1]["gate"] if metrics else {}
    stage_err = {k: v for k, v in last_gate.items() if k.startswith("gate_stage_errors_total")}
    slow = sum(1 for r in rows if r.get("latency_ms", 0) > 5000)

    md = [f"# Load run `{run_dir.name}`", ""]
    opts = meta.get("options", {})
    mode = f"closed loop, {opts.get('concurrency')} concurrent" if opts.get("concurrency") else (
        f"open loop, {opts.get('rate')}/s Poisson + bursts of {opts.get('burst_size')} "
        f"every {opts.get('burst_every')} s")
    md += [f"{len(rows)} requests in {seconds:.0f} s ({mode}); statuses: "
           + ", ".join(f"{k} × {v}" for k, v in sorted(status.items(), key=lambda x: str(x[0]))), ""]
    md += ["## Headline", "",
           f"- Upstream (GPU) calls saved: **{saved}** of {len(answered)} valid answers "
           f"({saved / max(1, len(answered)):.1%})",
           f"- VIP p99 {lat.get('vip', {}).get('p99', math.nan):.0f} ms vs standard p99 "
           f"{lat.get('standard', {}).get('p99', math.nan):.0f} ms",
           f"- Bypass share: **{bypass_share:.1%}** of valid answers",
           f"- Accounting: {acc.line()}",
           f"- Cached answers of another family (wrong answers): {len(wrong)}",
           f"- Invalid bodies answered 200: {len(invalid_ok)}; requests slower than 5 s: {slow}", ""]
    md += ["## Latency by tier (200 answers)", "", "| tier | n | p50 ms | p95 ms | p99 ms | max ms |",
           "|---|---|---|---|---|---|"]
    md += [f"| {t} | {v['n']} | {v['p50']:.0f} | {v['p95']:.0f} | {v['p99']:.0f} | {v['max']:.0f} |"
           for t, v in lat.items()]
    md += ["", "![latency CDF](latency_cdf.png)", ""]
    md += ["## Requests vs upstream calls", "",
           "| outcome | answers |", "|---|---|", *[f"| {k} | {v} |" for k, v in cache.most_common()], "",
           "Saved by kind: " + ", ".join(f"{k} {v} ({v / max(1, len(answered)):.1%})"
                                        for k, v in sorted(saved_kind.items())), "",
           "The gate's own counters at the end (all workers): "
           + (", ".join(f"{k.split('{')[0].removeprefix('gate_')}{{{k.split('{')[1]} {v:.0f}"
                        for k, v in sorted(last_gate.items())
                        if k.startswith(("gate_cache_requests_total", "gate_cache_hits_total"))) or "-"), "",
           "![traffic](traffic.png)", ""]
    md += ["## Queue, sheds, breaker", "", "![queue and breaker](queue_breaker.png)", ""]
    md += ["## Bypass share", "",
           f"{cache['bypass']} of {len(answered)} valid answers ({bypass_share:.1%}) were `x-gate-cache: "
           "bypass` (the cache was skipped: rules or a store call that failed).", ""]
    md += ["## Cost model", "",
           f"GPU-seconds per upstream call: {gpu_s:.3f} "
           f"({'given' if gpu_seconds_per_call is not None else 'mean latency of misses'}); "
           f"price ${price_per_gpu_hour:.2f} per GPU-hour.", "",
           f"- Saved: {saved} calls = {saved * gpu_s:.1f} GPU-s = "
           f"${saved * gpu_s * price_per_gpu_hour / 3600:.4f}",
           f"- Per million requests of this mix: "
           f"${saved / max(1, len(rows)) * 1e6 * gpu_s * price_per_gpu_hour / 3600:,.0f} saved", ""]
    md += ["## Safety", "",
           f"- Rate-limited user ({LIMITED['rate']}/s, burst {LIMITED['burst']}): "
           f"{sum(1 for r in limited if r.get('status') == 200)} admitted of {len(limited)} in "
           f"{seconds:.0f} s (bound 1.1 × (rate × s + burst) = {limited_bound(seconds):.0f})",
           f"- Gate stage errors: {sum(stage_err.values()):.0f} "
           + (", ".join(f"{k[len('gate_stage_errors_total'):]} {v:.0f}" for k, v in stage_err.items())),
           f"- Incomplete or duplicate: {acc.incomplete[:10]}",
           "- Wrong answers (asked family → answer's family, match kind): "
           + (", ".join(f"{r['family']} → {r['answer_family']} ({r.get('match') or r.get('cache')})"
                        for r in wrong[:10]) or "none"), ""]
    text = "\n".join(md)
    (run_dir / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.report", description=__doc__)
    p.add_argument("run", type=Path, help="a folder written by python -m load.loadgen")
    p.add_argument("--price-per-gpu-hour", type=float, default=2.5)
    p.add_argument("--gpu-seconds-per-call", type=float, default=None)
    a = p.parse_args(argv)
    text = build(a.run, a.price_per_gpu_hour, a.gpu_seconds_per_call)
    print("\n".join(text.splitlines()[:12]))
    print(f"-> {a.run / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

