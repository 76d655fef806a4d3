"""Benchmark: Envoy alone vs Envoy + a no-op ext_proc vs Envoy + the gate, same run, same load.

The upstream is a second Envoy listener with a fixed JSON answer, so the figures show what
the ext_proc hop and the gate's stages cost, not a model server's speed. Needs `wrk`
(apt-get install wrk). Writes load/results/bench_gate.md. Every figure worth quoting is a
ratio within one run: against the no-op ext_proc, against the raw embedder's batched
throughput (measured in the same run, same threads), against the same load without big
prompts, and at one connection the milliseconds the gate adds to the no-op hop.

    python -m load.bench_gate [--duration 10] [--connections 16] [--only semantic] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc import envoy_config
from extproc.embed.batching import default_threads, default_workers

from .prose import lua_document
from .stack import LOOPBACK, envoy_command, exit_on_sigterm, free_port, free_ports, wait_http, wait_port

RESULTS = Path(__file__).parent / "results" / "bench_gate.md"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# As vLLM answers: a JSON completion always carries its usage (the gate counts only when one does not).
ANSWER = (
    '{"id":"x","object":"chat.completion","model":"llama-3-8b","choices":[{"index":0,'
    '"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":19,"completion_tokens":3,"total_tokens":22}}'
)
# wrk script: one fixed question, or a new question for every request (cache misses). Seeded
# per wrk run: unseeded, the measured run would repeat the warm-up's questions (exact hits).
WRK_SCRIPT = """
math.randomseed(%d)
counter = 0
request = function()
  counter = counter + 1
  local q = %s
  local body = '{"model":"llama-3-8b","max_tokens":16,"messages":[{"role":"user","content":"' .. q .. '"}]}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
"""
UNIQUE = "'question ' .. counter .. ' of ' .. math.random(1e9)"
FIXED = "'What is 2+2?'"
# A prompt of about 512 KB of prose (`prose.py`), new every time (a cache miss), next to the
# small requests; about 106k tokens with the default tokenizer.
BIG_CHARS = 512 * 1024
BIG_PROMPT_TOKENS = 200_000
# Each big-prompt connection waits this long after an answer before its next prompt: a paced
# rate (about 2 per second over the 2 connections) that the no-op and the gate both keep, so
# their ratios compare the same mix; unpaced, the no-op passed 117 big prompts a second and
# the gate 3.
BIG_GAP_MS = 1000
# A conversation of ~512 KB that goes on: 32 turns of ~16 KB resent with each new question,
# as a chat client does (the earlier turns are the same texts every time).
CONVERSATION_SCRIPT = """
math.randomseed(%d)
local turn = string.rep('lorem ipsum dolor sit amet ', 600)
local parts = {}
for i = 1, 32 do
  local role = (i %% 2 == 1) and 'user' or 'assistant'
  parts[#parts + 1] = '{"role":"' .. role .. '","content":"' .. i .. ' ' .. turn .. '"}'
end
local history = table.concat(parts, ',')
request = function()
  local q = string.format('And question %%09d?', math.random(1e9))
  local body = '{"model":"llama-3-8b","max_tokens":16,"messages":[' .. history
    .. ',{"role":"user","content":"' .. q .. '"}]}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
"""
ONLY_VALIDATE_AND_ROUTE = {
    "ratelimit": {"enabled": False},
    "breaker": {"enabled": False},
    "cache": {"enabled": False},
    "admission": {"enabled": False},
}
SEMANTIC_OFF = {"cache": {"semantic": {"enabled": False}}}
# Every stage on, semantic off, and a pool that takes 200k-token prompts (so big ones are served).
BIG_OK = {
    "cache": {"semantic": {"enabled": False}},
    "validation": {"max_prompt_tokens": BIG_PROMPT_TOKENS},
}
EMBEDDERS = ("minilm", "e5-small")
SCREEN_MONITOR = {"screen": {"mode": "monitor"}}  # every request's user message through the screen
SKIP_REASONS = ("embed_shed", "embed_error")


def wrk_script(question: str) -> str:
    return WRK_SCRIPT % (random.SystemRandom().randrange(1, 2**31), question)


def semantic(embedder: str) -> dict[str, Any]:
    """Semantic layer on at an operating point (precision 0.8) that switches English on for both
    embedders: at the shipped 0.95 they compare nothing in English, and nothing would be embedded."""
    return {"cache": {"semantic": {"enabled": True, "embedder": embedder, "target_precision": 0.8}}}


@dataclass
class Variant:
    name: str
    ext_proc: str = "gate"  # none | noop | noop-port | minimal | gate
    workers: int = 1
    config: dict[str, Any] = field(default_factory=dict)
    unique: bool = True  # a new question per request
    connections: int | None = None  # None: --connections
    big: bool = False  # rounds of small requests alone, then with ~512 KB prompts on 2 more connections
    big_prompts: bool = True  # False: the second window of each round is alone too (the noise floor)
    conversation: bool = False  # the big requests are a conversation that goes on, not new prompts
    embedder: str | None = None  # compare with this embedder's raw batched throughput
    group: str = "overhead"


NOOP = "no-op ext_proc (Python grpc.aio)"
# The same on the server the gate answers on (`extproc/port.py`): the floor of the gate's own transport.
NOOP_PORT = "no-op ext_proc (the gate's port)"
# The least any Python gate does (read the headers, parse the body, route): what is left of the
# no-op's rate for the gate's own checks, limits, metrics and access line.
MINIMAL = "minimal Python gate (parse the body, route)"
VARIANTS = [
    Variant("Envoy alone", ext_proc="none"),
    Variant(NOOP, ext_proc="noop"),
    Variant(NOOP_PORT, ext_proc="noop-port"),
    Variant(MINIMAL, ext_proc="minimal"),
    Variant("gate: identity, validation, routing", config=ONLY_VALIDATE_AND_ROUTE),
    Variant("gate: every stage, cache misses, semantic off", config=SEMANTIC_OFF),
    Variant("gate: every stage, cache hits", config={}, unique=False),
    # The injection screen in monitor mode beside the same two runs without it.
    Variant("gate: every stage, cache misses, semantic off, screen monitor",
            config={**SEMANTIC_OFF, **SCREEN_MONITOR}, group="screen"),
    Variant("gate: every stage, cache hits, screen monitor", config=SCREEN_MONITOR, unique=False,
            group="screen"),
    # With the semantic cache on the screen's model, the two share one embedding per miss.
    Variant("gate: every stage, misses, semantic e5-small + screen monitor",
            config={**semantic("e5-small"), **SCREEN_MONITOR}, embedder="e5-small", group="screen"),
    Variant("gate: validation + routing, 2 workers", workers=2, config=ONLY_VALIDATE_AND_ROUTE),
    *(
        Variant(f"gate: every stage, misses, semantic {e}", config=semantic(e), embedder=e, group="semantic")
        for e in EMBEDDERS
    ),
    Variant(
        "gate: every stage, misses, semantic minilm, 2 workers",
        workers=2,
        config=semantic("minilm"),
        embedder="minilm",
        group="semantic",
    ),
    *(
        Variant(
            f"gate: every stage, misses, semantic {e}, 64 connections",
            config=semantic(e),
            embedder=e,
            connections=64,
            group="semantic64",
        )
        for e in EMBEDDERS
    ),
    Variant("small requests, 512 KB prompts in the mix", config=BIG_OK, big=True, group="big"),
    # The same rounds through the no-op ext_proc: what the big bodies cost Envoy, the gRPC hop
    # and the machine, with none of the gate's work.
    Variant(f"{NOOP}: small requests, 512 KB prompts in the mix", ext_proc="noop", big=True, group="big"),
    Variant("small requests, 512 KB conversations going on in the mix", config=BIG_OK, big=True,
            conversation=True, group="big"),
    Variant(
        "small requests, nothing in the mix (noise floor)",
        config=BIG_OK,
        big=True,
        big_prompts=False,
        group="big",
    ),
    Variant(
        "small requests, 512 KB prompts over the limit (422)", config=SEMANTIC_OFF, big=True, group="big"
    ),
    Variant(f"c1: {NOOP}", ext_proc="noop", connections=1, group="c1"),
    Variant(f"c1: {NOOP_PORT}", ext_proc="noop-port", connections=1, group="c1"),
    Variant(
        "c1: gate, identity, validation, routing", config=ONLY_VALIDATE_AND_ROUTE, connections=1, group="c1"
    ),
    Variant(
        "c1: gate, every stage, cache misses, semantic off", config=SEMANTIC_OFF, connections=1, group="c1"
    ),
    Variant("c1: gate, every stage, cache hits", config={}, unique=False, connections=1, group="c1"),
    # One new question at a time: the gate's own time (gate_ms) against its one embedding.
    *(
        Variant(f"c1: gate, every stage, misses, semantic {e}", config=semantic(e), embedder=e,
                connections=1, group="c1")
        for e in EMBEDDERS
    ),
]


def upstream_listener(port: int) -> dict[str, Any]:
    route = {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": ANSWER}}}
    hcm = {
        "@type": envoy_config.HCM,
        "stat_prefix": "upstream",
        "route_config": {
            "virtual_hosts": [{"name": "u", "domains": ["*"], "routes": [route]}],
            "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}],
        },
        "http_filters": [
            {"name": "envoy.filters.http.router", "typed_config": {"@type": envoy_config.ROUTER}}
        ],
    }
    filters = [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]
    return {
        "name": "upstream",
        "address": {"socket_address": {"address": LOOPBACK, "port_value": port}},
        "filter_chains": [{"filters": filters}],
    }


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in the process group."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def thread_cpu_seconds(pgid: int, prefix: str) -> float:
    """utime + stime of the threads named ``prefix...`` in every live process of the group."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            tasks = os.listdir(f"/proc/{entry}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                if not Path(f"/proc/{entry}/task/{task}/comm").read_text().startswith(prefix):
                    continue
                fields = Path(f"/proc/{entry}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def parse_wrk(out: str) -> dict[str, float]:
    """wrk --latency's summary; every pattern anchored to its own line (a stdev column may end in 50%)."""

    def find(pattern: str) -> str:
        match = re.search(pattern, out, re.MULTILINE)
        if match is None:
            raise ValueError(f"wrk output without {pattern!r}:\n{out}")
        return match.group(1)

    def ms(text: str) -> float:
        value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    non2xx = re.search(r"^\s*Non-2xx or 3xx responses: (\d+)\s*$", out, re.MULTILINE)
    return {
        "rps": float(find(r"^Requests/sec:\s+([\d.]+)\s*$")),
        "p50": ms(find(r"^\s+50%\s+([\d.]+(?:us|ms|s))\s*$")),
        "p99": ms(find(r"^\s+99%\s+([\d.]+(?:us|ms|s))\s*$")),
        "requests": int(find(r"^\s+(\d+) requests in ")),
        "errors": int(non2xx.group(1)) if non2xx else 0,
    }


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


def embedding_counts(metrics_ports: list[int]) -> dict[str, float]:
    """Texts embedded, embeddings shed, and semantic lookups skipped by reason, summed over the
    gate's workers."""
    from .bench_admission import scrape

    counts = {"embedded": 0.0, "batches": 0.0, "shed": 0.0, "embed_s": 0.0, "own_s": 0.0, "requests": 0.0,
              **dict.fromkeys(SKIP_REASONS, 0.0)}
    for port in metrics_ports:
        counts["embedded"] += scrape(port, "gate_embed_batch_size_sum")
        counts["batches"] += scrape(port, "gate_embed_batch_size_count")
        counts["embed_s"] += scrape(port, "gate_embed_seconds_sum")
        counts["own_s"] += scrape(port, "gate_own_latency_seconds_sum")
        counts["requests"] += scrape(port, "gate_own_latency_seconds_count")
        counts["shed"] += scrape(port, "gate_embed_shed_total")
        for reason in SKIP_REASONS:
            counts[reason] += scrape(port, "gate_cache_semantic_skips_total", f'reason="{reason}"')
    return counts


def start_ext_proc(
    variant: Variant, work: Path
) -> tuple[subprocess.Popen[bytes] | None, list[int], list[int]]:
    """The ext_proc process, its gRPC ports, and (for the gate) its workers' metrics ports."""
    if variant.ext_proc == "none":
        return None, [], []
    first = free_ports(variant.workers)
    metrics_first = free_ports(variant.workers) if variant.ext_proc == "gate" else 0
    if variant.ext_proc in ("noop", "noop-port", "minimal"):
        args = [sys.executable, "-m", "load.noop_extproc", "--port", str(first)]
        args += ["--route"] if variant.ext_proc == "minimal" else []
        args += ["--gate-port"] if variant.ext_proc == "noop-port" else []
    else:
        config = work / "gate.yaml"
        config.write_text(yaml.safe_dump(variant.config))
        args = [
            sys.executable,
            "-m",
            "extproc.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            str(first),
            "--workers",
            str(variant.workers),
            "--metrics-port",
            str(metrics_first),
        ]
    proc = spawn(args, work / "ext_proc.log")
    ports = [first + i for i in range(variant.workers)]
    for port in ports:
        wait_port(port, 60, proc)
    return proc, ports, [metrics_first + i for i in range(variant.workers)] if metrics_first else []


def run_variant(variant: Variant, work: Path, args: argparse.Namespace) -> dict[str, float]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        proc, gate_ports, metrics_ports = start_ext_proc(variant, work)
        procs += [proc] if proc else []
        listen, admin, upstream = free_port(), free_port(), free_port()
        doc = envoy_config.bootstrap(
            listen=(LOOPBACK, listen),
            admin=(LOOPBACK, admin),
            gate=[(LOOPBACK, p) for p in gate_ports],
            pools={"primary": [(LOOPBACK, upstream)], "fallback": [(LOOPBACK, upstream)]},
            require_gate_route=not variant.ext_proc.startswith("noop"),  # a no-op routes nothing
        )
        doc["static_resources"]["listeners"].append(upstream_listener(upstream))
        h2 = envoy_config.gate_cluster([])["typed_extension_protocol_options"]
        for cluster in doc["static_resources"]["clusters"]:
            # h2c to the fixed upstream: one multiplexed connection, not one per request
            # (HTTP/1.1 here left tens of thousands of loopback ports in TIME_WAIT)
            if cluster["name"] != envoy_config.GATE_CLUSTER:
                cluster["typed_extension_protocol_options"] = h2
        procs.append(spawn(envoy_command(doc, work / "envoy.yaml", "error"), work / "envoy.log"))
        wait_http(f"http://{LOOPBACK}:{admin}/ready", 30)
        script = work / "post.lua"
        script.write_text(wrk_script(UNIQUE if variant.unique else FIXED))
        url = f"http://{LOOPBACK}:{listen}/v1/chat/completions"
        connections = variant.connections or args.connections
        wrk = ["wrk", "-t1", f"-c{connections}", "-s", str(script), "--latency"]
        subprocess.run([*wrk, "-d2s", url], capture_output=True, check=True)  # warm-up
        script.write_text(wrk_script(UNIQUE if variant.unique else FIXED))  # new questions
        if variant.big:
            rounds = big_rounds(wrk, url, proc, work, args, variant.big_prompts, variant.conversation)
            return checked(rounds, work)
        cpu_before = group_cpu_seconds(proc.pid) if proc else 0.0
        envoy_before = group_cpu_seconds(procs[-1].pid)
        counted = bool(metrics_ports) and (variant.embedder is not None or variant.group == "c1")
        before = embedding_counts(metrics_ports) if counted else {}
        embed_cpu_before = thread_cpu_seconds(proc.pid, "embed-") if proc and variant.embedder else 0.0
        spy = profile(proc, variant, args) if proc and args.profile else None
        spy = perf_record(proc, variant, args) if proc and args.perf else spy
        result = checked(small_load(wrk, url, args.duration), work)
        if spy is not None:
            spy.wait(30)
        cpu = (group_cpu_seconds(proc.pid) - cpu_before) if proc else 0.0
        result["cpu_ms_per_req"] = 1000 * cpu / max(result["requests"], 1)
        envoy_cpu = group_cpu_seconds(procs[-1].pid) - envoy_before
        result["envoy_cpu_ms_per_req"] = 1000 * envoy_cpu / max(result["requests"], 1)
        if counted:
            after = embedding_counts(metrics_ports)
            answered = max(after["requests"] - before["requests"], 1)
            result["gate_ms"] = 1000 * (after["own_s"] - before["own_s"]) / answered
        if variant.embedder:
            result["embedded_per_s"] = (after["embedded"] - before["embedded"]) / args.duration
            result["embed_shed"] = after["shed"] - before["shed"]
            embed_cpu = thread_cpu_seconds(proc.pid, "embed-") - embed_cpu_before if proc else 0.0
            texts = after["embedded"] - before["embedded"]
            result["embed_cpu_ms_per_text"] = 1000 * embed_cpu / max(texts, 1)
            batches = max(after["batches"] - before["batches"], 1)
            result["mean_batch"] = texts / batches
            result["embed_ms"] = 1000 * (after["embed_s"] - before["embed_s"]) / batches
            for reason in SKIP_REASONS:
                result[f"skip_{reason}"] = after[reason] - before[reason]
        return result
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 15)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def checked(result: dict[str, float], work: Path) -> dict[str, float]:
    """The figures, unless small requests were refused: a gate that answers 5xx is fast, and
    its figures say nothing (the logs say why)."""
    errors = result["errors"] + result.get("alone_errors", 0)
    if errors:
        logs = "".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(work.glob("*.log")))
        raise RuntimeError(f"{errors:.0f} small requests were not answered 2xx:\n{logs}")
    return result


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def profile(
    proc: subprocess.Popen[bytes], variant: Variant, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    """py-spy on the ext_proc (and its workers) for the measured run: collapsed stacks, one per
    line, in `--profile`'s folder (`python -m load.profile_summary FILE` says where the time goes).
    Sampling costs CPU on the same cores: figures from a profiled run are not quoted."""
    args.profile.mkdir(parents=True, exist_ok=True)
    out = args.profile / f"{slug(variant.name)}.txt"
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    cmd = [spy, "record", "--format", "raw", "--rate", "250", "--subprocesses", "--nonblocking",
           "--duration", str(args.duration), "--pid", str(proc.pid), "--output", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_record(
    proc: subprocess.Popen[bytes], variant: Variant, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    """Linux perf on the ext_proc for the measured run (`perf record -g`), native code and the
    kernel included: where the hop's CPU goes by library (`perf report --sort dso`), which
    py-spy's Python stacks cannot show. Run `perf report -i DIR/NAME.data --sort dso` after."""
    args.perf.mkdir(parents=True, exist_ok=True)
    out = args.perf / f"{slug(variant.name)}.data"
    cmd = ["perf", "record", "-F", "499", "-g", "-p", str(proc.pid), "-o", str(out), "--",
           "sleep", str(args.duration)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def small_load(wrk: list[str], url: str, duration: int) -> dict[str, float]:
    out = subprocess.run([*wrk, f"-d{duration}s", url], capture_output=True, text=True, check=True)
    return parse_wrk(out.stdout)


def big_rounds(
    wrk: list[str],
    url: str,
    proc: subprocess.Popen[bytes] | None,
    work: Path,
    args: argparse.Namespace,
    big_prompts: bool = True,
    conversation: bool = False,
) -> dict[str, float]:
    """`--rounds` pairs on one stack: small requests alone, then the same with ~512 KB prompts
    on 2 more connections. Alternating keeps the machine's other load (it is shared) out of the
    ratio as far as can be: each pair's two windows are seconds apart. The figures are the
    medians over the rounds; each round's ratio is kept too. Without `big_prompts` the second
    window has nothing more either: how far the ratio moves on this machine with no cause."""
    big_script, small_script = work / "big.lua", Path(wrk[wrk.index("-s") + 1])

    def new_scripts() -> None:
        """Fresh seeds for every window: a window that repeated an earlier one's questions
        would be answered from the cache, and its ratio would compare hits with misses."""
        seed = random.SystemRandom().randrange(1, 2**31)
        prompt = lua_document(BIG_CHARS) + wrk_script("document()")
        script = CONVERSATION_SCRIPT % seed if conversation else prompt
        big_script.write_text(script + f"delay = function() return {BIG_GAP_MS} end\n")
        small_script.write_text(wrk_script(UNIQUE))

    new_scripts()
    big_cmd = ["wrk", "-t1", "-c2", "-s", str(big_script), "--latency", f"-d{args.duration}s", url]
    if not big_prompts:  # the same rounds, with an idle second client
        big_cmd = ["sh", "-c", "sleep 1; echo"]
    # warm-up: the gate's first big prompt starts its background process
    subprocess.run(["wrk", "-t1", "-c1", "-s", str(big_script), "-d3s", url], capture_output=True, check=True)
    alone: list[dict[str, float]] = []
    mixed: list[dict[str, float]] = []
    cpu = {"alone": 0.0, "mixed": 0.0}
    for _ in range(args.rounds):
        new_scripts()
        cpu_before = group_cpu_seconds(proc.pid) if proc else 0.0
        alone.append(small_load(wrk, url, args.duration))
        cpu_between = group_cpu_seconds(proc.pid) if proc else 0.0
        new_scripts()
        big = subprocess.Popen(big_cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        r = small_load(wrk, url, args.duration)
        cpu["alone"] += cpu_between - cpu_before
        cpu["mixed"] += (group_cpu_seconds(proc.pid) if proc else 0.0) - cpu_between
        big_out, _ = big.communicate(timeout=args.duration + 30)
        b = parse_wrk(big_out) if big_prompts else {"requests": 0, "p50": 0, "errors": 0}
        r["big_requests"], r["big_p50"], r["big_errors"] = b["requests"], b["p50"], b["errors"]
        mixed.append(r)
    result = {k: statistics.median(r[k] for r in mixed) for k in mixed[0]}
    result["cpu_ms_per_req"] = 1000 * cpu["mixed"] / max(sum(r["requests"] for r in mixed), 1)
    for k in ("rps", "p50", "p99", "requests", "errors"):
        result[f"alone_{k}"] = statistics.median(r[k] for r in alone)
    result["alone_cpu_ms_per_req"] = 1000 * cpu["alone"] / max(sum(r["requests"] for r in alone), 1)
    for i, (a, m) in enumerate(zip(alone, mixed, strict=True)):
        result[f"round{i}_ratio"] = m["p99"] / a["p99"]
    return result


def raw_embedder_rate(name: str, seconds: float, processes: int = 1) -> tuple[float, float]:
    """Texts per second of the bare embedder, batches of 32 on as many threads as the gate uses,
    and its CPU milliseconds per text."""
    import threading

    from extproc.embed import load_embedder

    workers = default_workers()
    emb = load_embedder(name, threads=default_threads(processes=processes, workers=workers))
    emb.embed_sync(["warm up", "a somewhat longer sentence to warm up the model"])
    done = [0] * workers
    end = time.perf_counter() + seconds

    def work(slot: int) -> None:
        n = 0
        while time.perf_counter() < end:
            emb.embed_sync([f"question {slot}-{n}-{i} of {i * 7919}" for i in range(32)])
            n += 1
            done[slot] += 32

    started, cpu = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    texts = sum(done)
    return texts / (time.perf_counter() - started), 1000 * (time.process_time() - cpu) / max(texts, 1)


def report(rows: list[tuple[Variant, dict[str, float]]], args: argparse.Namespace) -> str:
    by_name = {v.name: r for v, r in rows}
    noop = by_name.get(NOOP)
    lines = [
        f"# Gate overhead ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores shared by wrk, Envoy, gate)",
        "",
        f"`python -m load.bench_gate --duration {args.duration} --connections {args.connections}`: wrk, one "
        "thread, POST /v1/chat/completions with a small chat body; the upstream is a fixed Envoy "
        "direct_response; Envoy with 2 worker threads. Ratios are within this one run.",
        "",
        "| variant | conns | req/s | vs no-op ext_proc | p50 ms | p99 ms | ext_proc CPU ms/req "
        "| Envoy CPU ms/req | non-2xx |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v, r in rows:
        if v.group == "c1":
            continue
        if v.big:
            vs = f"{r['alone_rps'] / noop['rps']:.2f}" if noop else "-"
            lines.append(
                f"| {v.name.split(',')[0]} (rounds between) | {v.connections or args.connections} | "
                f"{r['alone_rps']:.0f} | {vs} | {r['alone_p50']:.2f} | {r['alone_p99']:.2f} | "
                f"{r['alone_cpu_ms_per_req']:.3f} | - | {r['alone_errors']:.0f} |"
            )
        vs = f"{r['rps'] / noop['rps']:.2f}" if noop else "-"
        lines.append(
            f"| {v.name} | {v.connections or args.connections} | {r['rps']:.0f} | {vs} | {r['p50']:.2f} | "
            f"{r['p99']:.2f} | {r['cpu_ms_per_req']:.3f} | {r.get('envoy_cpu_ms_per_req', 0):.3f} | "
            f"{r['errors']:.0f} |"
        )
    semantic = [(v, r) for v, r in rows if v.embedder and r.get("raw") and v.group != "c1"]
    if semantic:
        lines += [
            "",
            "Semantic-on misses against the raw embedder's batched throughput (same threads; the raw "
            "rate is the mean of runs just before and just after each variant). CPU per text: the "
            "gate's embedding threads (model run, token states) against the raw embedder's. Embeddings "
            "that could not arrive in time are shed and counted, and so are the lookups that lost "
            "their embedding, by reason:",
            "",
            "| variant | conns | gate req/s | texts embedded/s | raw texts/s | embedded/raw | mean batch "
            "| CPU ms/text gate | raw | shed | skipped: embed_shed | skipped: embed_error |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for v, r in semantic:
            rate, done, conns = r["raw"], r.get("embedded_per_s", 0.0), v.connections or args.connections
            lines.append(
                f"| {v.name} | {conns} | {r['rps']:.0f} | {done:.0f} | {rate:.0f} | {done / rate:.2f} "
                f"| {r.get('mean_batch', 0):.1f} "
                f"| {r.get('embed_cpu_ms_per_text', 0):.2f} | {r['raw_cpu_ms_per_text']:.2f} "
                f"| {r.get('embed_shed', 0):.0f} | {r.get('skip_embed_shed', 0):.0f} "
                f"| {r.get('skip_embed_error', 0):.0f} |"
            )
        one = by_name.get("gate: every stage, misses, semantic minilm")
        two = by_name.get("gate: every stage, misses, semantic minilm, 2 workers")
        if one and two and one.get("embedded_per_s"):
            lines += [
                "",
                "2 gate workers vs 1 on the semantic (minilm) miss path: "
                f"{two['rps'] / one['rps']:.2f}x req/s, "
                f"{two.get('embedded_per_s', 0) / one['embedded_per_s']:.2f}x texts embedded",
            ]
    for v, r in rows:
        if not v.big:
            continue
        rounds = ", ".join(f"{r[k]:.2f}x" for k in sorted(r) if k.startswith("round"))
        mix = (
            f"~512 KB prompts on 2 more connections ({r['big_requests']:.0f} of them per round, "
            f"p50 {r['big_p50']:.0f} ms, non-2xx {r['big_errors']:.0f})"
            if v.big_prompts
            else "nothing more (a second window alone)"
        )
        lines += [
            "",
            f"{v.name}: small-request p99 {r['p99']:.2f} ms with {mix} vs {r['alone_p99']:.2f} ms without: "
            f"{r['p99'] / r['alone_p99']:.2f}x (p50 {r['p50'] / r['alone_p50']:.2f}x, "
            f"req/s {r['rps'] / r['alone_rps']:.2f}x); medians of {args.rounds} rounds, each round's "
            f"p99 ratio: {rounds}.",
        ]
    c1 = [(v, r) for v, r in rows if v.group == "c1"]
    if c1:
        base = by_name.get(f"c1: {NOOP}")
        lines += ["", "At one connection: the latency the gate adds to the no-op ext_proc hop, and how much "
                  "of it is the gate's own work (`gate_ms`, the mean time its answers to Envoy's messages "
                  "took, as the access line has it); the rest is the hop's messages themselves.", ""]
        lines += ["| variant | p50 ms | p99 ms | added p50 ms | gate_ms | rest ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        for v, r in c1:
            added, own = (r["p50"] - base["p50"] if base else None), r.get("gate_ms")
            cells = [f"{added:+.2f}" if added is not None else "-", f"{own:.2f}" if own is not None else "-",
                     f"{added - own:+.2f}" if added is not None and own is not None else "-"]
            lines.append(f"| {v.name} | {r['p50']:.2f} | {r['p99']:.2f} | {' | '.join(cells)} |")
        semantic_c1 = [(v, r) for v, r in c1 if v.embedder]
        if semantic_c1:
            lines += ["", "A semantic miss at one connection: the gate's own time per request (`gate_ms`, "
                      "as the access line has it: `gate_own_latency_seconds`) against the model run of its "
                      "one embedding (`gate_embed_seconds`, a batch of one), means over the window.", "",
                      "| variant | gate_ms | embedding ms | gate_ms − embedding | mean batch |",
                      "|---|---:|---:|---:|---:|"]
            for v, r in semantic_c1:
                lines.append(f"| {v.name} | {r['gate_ms']:.2f} | {r['embed_ms']:.2f} | "
                             f"{r['gate_ms'] - r['embed_ms']:+.2f} | {r['mean_batch']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()  # a time-out or Ctrl-C unwinds: every Envoy and gate it started stops
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alone / with big prompts pairs of the 'big' variants"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only variants whose name or group contains this (repeatable); the no-op and the "
        "minimal gate always run",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--profile", type=Path, help="py-spy each ext_proc into this folder (needs py-spy)")
    parser.add_argument("--perf", type=Path, help="Linux perf on each ext_proc into this folder (needs perf)")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is needed: apt-get install wrk", file=sys.stderr)
        return 2
    chosen = [
        v
        for v in VARIANTS
        if not args.only or v.name in (NOOP, MINIMAL) or any(o in v.name or o == v.group for o in args.only)
    ]
    rows: list[tuple[Variant, dict[str, float]]] = []
    for variant in chosen:
        raws: list[tuple[float, float]] = []
        if variant.embedder and variant.group != "c1":  # around its variant: the machine's load drifts
            raws.append(raw_embedder_rate(variant.embedder, min(args.duration, 5)))
        with tempfile.TemporaryDirectory(prefix="llm-gate-bench-") as tmp:
            r = run_variant(variant, Path(tmp), args)
        if raws and variant.embedder:
            raws.append(raw_embedder_rate(variant.embedder, min(args.duration, 5)))
            r["raw"] = sum(rate for rate, _ in raws) / len(raws)
            r["raw_cpu_ms_per_text"] = sum(ms for _, ms in raws) / len(raws)
            print(
                f"raw embedder {variant.embedder}: "
                + ", ".join(f"{rate:.0f}" for rate, _ in raws)
                + " texts/s (before, after)",
                flush=True,
            )
        rows.append((variant, r))
        print(
            f"{variant.name:55s} {r['rps']:7.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  "
            f"ext_proc CPU {r['cpu_ms_per_req']:.3f} ms/req  "
            f"Envoy CPU {r.get('envoy_cpu_ms_per_req', 0):.3f} ms/req  non-2xx {r['errors']:.0f}",
            flush=True,
        )
    text = report(rows, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n" + text + f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
