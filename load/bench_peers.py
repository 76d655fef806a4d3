"""Peer benchmark: the gate against LiteLLM proxy, same upstream, same Redis, same load.

The gate runs as 2 processes behind Envoy; LiteLLM proxy as 2 uvicorn workers. Both answer
from a Redis cache and enforce per-key request limits, both call one `load/vllm_sim.py`
simulator set to answer at once (no model latency: the figures are the gateways' own
cost), and both share one `redis-server` this command starts on a free port. Semantic
caching is off in the gate (LiteLLM's Redis cache is exact).

LiteLLM is never a dependency of the gate: it is installed on first use into a virtualenv of
its own, `~/.cache/llm-gate/peers/litellm-VERSION` (`python -m venv`, then `pip install
'litellm[proxy]==VERSION'` at nice 10). LiteLLM's virtual keys need a database; without
one its proxy takes a `custom_auth` function, and the rate limits set on the key object that
function returns are enforced by LiteLLM's own limiter, counted in the same Redis. So each
key here has a requests-per-minute limit in LiteLLM and a requests-per-second bucket per
tenant (one tenant per key) in the gate.

Before timing, each gateway must show that a repeated request is a cache hit (and that the
simulator was not called for it) and that a key over its limit gets a 429. Then hits (one
fixed body) and misses (a new question every request), at `--connections` and at 1,
alternating the two gateways window by window, `--rounds` rounds, plus the simulator called
directly at 1 connection. CPU is utime + stime of every process in each gateway's process
trees (gate supervisor and workers + Envoy; LiteLLM's main process and workers), read from
/proc. Writes load/results/peers.md.

    python -m load.bench_peers [--duration 10] [--rounds 3] [--connections 16] [--litellm-version 1.108.7]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .bench_gate import parse_wrk
from .stack import LOOPBACK, Stack, exit_on_sigterm, free_port, held_signals, wait_port

LITELLM_VERSION = "1.108.7"
CACHE_DIR = Path.home() / ".cache" / "llm-gate" / "peers"
RESULTS = Path(__file__).parent / "results" / "peers.md"
MODEL = "llama-3-8b"
WORKERS = 2
# One key for the timed load (a limit far above what it sends: the limiter runs, never
# refuses), one with a limit of 2 requests a minute for the correctness check.
BENCH_KEY = "sk-peers-bench"
LIMITED_KEY = "sk-peers-limited"
BENCH_RPM = 6_000_000
LIMITED_RPM = 2
# The simulator answers at once: no time to first token, none between tokens.
SIM_ARGS = ["--base-ttft-ms", "0", "--itl-ms", "0", "--per-prompt-token-ms", "0", "--max-num-seqs", "1024"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# wrk: one fixed question (hits after the first) or a new question every request (misses),
# seeded per window so no window repeats another's questions.
WRK_SCRIPT = """
math.randomseed(%(seed)d)
counter = 0
local headers = {["Content-Type"] = "application/json"%(auth)s}
request = function()
  counter = counter + 1
  local q = %(question)s
  local body = '{"model":"%(model)s","max_tokens":16,"messages":[{"role":"user","content":"' .. q .. '"}]}'
  return wrk.format("POST", nil, headers, body)
end
"""
NOUNS = {"hit": "hits", "miss": "misses"}
UNIQUE = "'question ' .. counter .. ' of ' .. math.random(1e9)"
FIXED = "'What is the capital of France?'"

# LiteLLM's custom auth: the key -> its rpm limit; an unknown key is a 401.
AUTH_MODULE = '''
from fastapi import HTTPException, Request
from litellm.proxy._types import UserAPIKeyAuth

RPM = %r


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    if api_key not in RPM:
        raise HTTPException(status_code=401, detail="unknown key")
    return UserAPIKeyAuth(api_key=api_key, token=api_key, rpm_limit=RPM[api_key])
'''


def wrk_script(kind: str, key: str | None, seed: int | None = None) -> str:
    """The Lua for `kind` ("hit": the fixed question, "miss": a new one per request)."""
    return WRK_SCRIPT % {
        "seed": seed if seed is not None else random.SystemRandom().randrange(1, 2**31),
        "auth": f', ["Authorization"] = "Bearer {key}"' if key else "",
        "question": FIXED if kind == "hit" else UNIQUE,
        "model": MODEL,
    }


def gate_config() -> dict[str, Any]:
    """Every stage at its default except the semantic layer; the two keys, unknown keys refused;
    per-tenant buckets: the bench key's far above the load, the limited key's 2 at once and 2 a
    minute after."""
    return {
        "identity": {
            "api_keys": {
                BENCH_KEY: {"tenant": "bench", "tier": "premium"},
                LIMITED_KEY: {"tenant": "limited", "tier": "standard"},
            },
            "unknown_keys": "reject",
            "missing_keys": "reject",
        },
        "ratelimit": {
            "tiers": {
                "premium": {"tenant": {"rate": BENCH_RPM / 60, "burst": BENCH_RPM // 60}},
                "standard": {"tenant": {"rate": LIMITED_RPM / 60, "burst": LIMITED_RPM}},
            }
        },
        "cache": {"semantic": {"enabled": False}},
    }


def litellm_config(sim_url: str, redis_port: int) -> dict[str, Any]:
    """One model on the simulator; the exact cache in Redis; keys through `auth.py` (custom auth,
    no database), their limits counted by LiteLLM's limiter in the same Redis."""
    return {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}", "api_base": f"{sim_url}/v1", "api_key": "none"
                },
            }
        ],
        "litellm_settings": {
            "cache": True,
            "cache_params": {"type": "redis", "host": LOOPBACK, "port": redis_port},
        },
        "general_settings": {
            "master_key": f"sk-master-{uuid.uuid4().hex}", "custom_auth": "auth.user_api_key_auth"
        },
    }


# --- process trees, read from /proc -------------------------------------------------------


def _stat(proc: Path, pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, is [0])."""
    try:
        return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def tree_pids(roots: Iterable[int], proc: Path = Path("/proc")) -> list[int]:
    """The roots and every live descendant of them."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat(proc, int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [r for r in roots if (proc / str(r)).exists()]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.append(pid)
            todo += children.get(pid, [])
    return sorted(found)


def tree_cpu_seconds(roots: Iterable[int], proc: Path = Path("/proc")) -> float:
    """utime + stime of every live process in the trees, plus what their reaped children used
    (cutime + cstime): a worker that exits mid-window still counts."""
    ticks = 0
    for pid in tree_pids(roots, proc):
        fields = _stat(proc, pid)
        if fields is not None:
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / CLK_TCK


def tree_memory_mb(roots: Iterable[int], proc: Path = Path("/proc")) -> tuple[float, float]:
    """Resident memory summed over the trees (RSS; pages shared between processes count in each)
    and proportional (PSS: a shared page split between its users), MB."""
    rss = pss = 0
    for pid in tree_pids(roots, proc):
        fields = _stat(proc, pid)
        if fields is None:
            continue
        rss += int(fields[21]) * PAGE
        try:
            for line in (proc / str(pid) / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return rss / 2**20, pss / 2**20


def cpu_by_process(proc: Path = Path("/proc")) -> dict[int, tuple[str, int]]:
    """pid -> (name, utime + stime ticks) for every process (the machine's other load)."""
    out: dict[int, tuple[str, int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        try:  # the command line's first words say more than "python"
            words = (entry / "cmdline").read_bytes().split(b"\0")[:4]
            name = " ".join(Path(w.decode(errors="replace")).name if i == 0 else w.decode(errors="replace")
                            for i, w in enumerate(words) if w) or name
        except OSError:
            pass
        fields = text.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))
    return out


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent outside idle and iowait since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / CLK_TCK


def other_load(
    before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], ours: set[int], seconds: float
) -> list[tuple[str, float]]:
    """The other processes' share of one core during the run, by name, largest first."""
    shares: dict[str, float] = {}
    for pid, (name, ticks) in after.items():
        if pid in ours or pid not in before or name.startswith("wrk"):
            continue
        used = (ticks - before[pid][1]) / CLK_TCK / max(seconds, 1e-9)
        if used > 0:
            shares[name] = shares.get(name, 0.0) + used
    return sorted(shares.items(), key=lambda kv: -kv[1])


# --- installing what it needs ----------------------------------------------------------------


def run_child(cmd: Sequence[str], **kwargs: Any) -> None:
    """Run to completion in a process group of its own; stopped with its children if we are."""
    proc = subprocess.Popen(list(cmd), start_new_session=True, **kwargs)
    try:
        if proc.wait() != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        raise


def ensure_tools() -> None:
    """wrk and redis-server, installed with apt-get when missing and we are root."""
    need = [name for name in ("wrk", "redis-server") if shutil.which(name) is None]
    if not need:
        return
    packages = " ".join(need)  # the Debian packages have the commands' names
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit(f"this benchmark needs {packages}: apt-get install {packages}")
    print(f"installing {packages} (apt-get)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run_child(["apt-get", "update", "-qq"], env=env)
    run_child(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *need], env=env)


def ensure_litellm(version: str, cache_dir: Path) -> Path:
    """The `litellm` command of a virtualenv that holds `litellm[proxy]==version` and nothing
    of the gate's; made on first use (a half-made one is made again)."""
    venv = cache_dir / f"litellm-{version}"
    exe, stamp = venv / "bin" / "litellm", venv / ".installed"
    if stamp.exists() and exe.exists():
        print(f"LiteLLM {version}: {venv}", flush=True)
        return exe
    print(f"installing LiteLLM proxy {version} into {venv} (python -m venv, pip install, nice 10)",
          flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    run_child([base, "-m", "venv", str(venv)])
    pip = ["nice", "-n", "10", str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    run_child([*pip, f"litellm[proxy]=={version}"])
    stamp.write_text(f"litellm[proxy]=={version}\n")
    return exe


# --- the two gateways ------------------------------------------------------------------------


@dataclass
class Gateway:
    name: str
    url: str
    roots: list[int]  # pids whose trees are the gateway
    key: str | None = BENCH_KEY
    label: str = ""


def start_litellm(stack: Stack, exe: Path, workers: int) -> Gateway:
    """LiteLLM proxy on a free port, its files in the stack's folder, its process group stopped
    with the stack's."""
    work = stack.workdir / "litellm"
    work.mkdir()
    (work / "auth.py").write_text(AUTH_MODULE % {BENCH_KEY: BENCH_RPM, LIMITED_KEY: LIMITED_RPM})
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(litellm_config(stack.sim_url("primary"), stack.redis_port)))
    port = free_port()
    # uvicorn restarts a worker that has not answered its health check within 5 s, and on two
    # busy cores importing LiteLLM takes longer than that: the workers died in a loop.
    cmd = [str(exe), "--config", str(config), "--host", LOOPBACK, "--port", str(port),
           "--num_workers", str(workers), "--timeout_worker_healthcheck", "120"]
    # The model price list from the package, not fetched from the network at start.
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TMPDIR": str(work)}
    log = open(stack.workdir / "litellm.log", "wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work, env=env
    )
    stack.procs["litellm"] = proc  # stopped (its whole group) by stack.close()
    try:
        wait_port(port, 300, proc)
    except (TimeoutError, RuntimeError) as e:
        raise RuntimeError(f"LiteLLM did not start ({e}):\n{stack.log('litellm')[-3000:]}") from None
    url = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + 120
    while True:  # every worker up: liveliness answers on several connections in a row
        try:
            if all(_get(f"{url}/health/liveliness") == 200 for _ in range(8)):
                break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"LiteLLM did not start:\n{stack.log('litellm')[-3000:]}")
        time.sleep(0.5)
    return Gateway(f"LiteLLM {exe.parent.parent.name.split('-', 1)[1]}", url, [proc.pid],
                   label=f"LiteLLM proxy ({workers} workers)")


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as r:
        return int(r.status)


def post(url: str, question: str, key: str | None) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": question}]}
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status), {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = {"raw": raw.decode(errors="replace")}
        return e.code, {k.lower(): v for k, v in e.headers.items()}, doc


def sim_served(stack: Stack) -> int:
    with urllib.request.urlopen(f"{stack.sim_url('primary')}/admin/state", timeout=5) as r:
        return int(json.loads(r.read())["served"])


def cache_report(gw: Gateway, headers: dict[str, str]) -> tuple[bool, str]:
    """Whether the answer came from the cache, and how the gateway says so."""
    if gw.name == "gate":
        value = headers.get("x-gate-cache", "-")
        return value == "hit", f"x-gate-cache: {value}"
    key = headers.get("x-litellm-cache-key")
    return key is not None, f"x-litellm-cache-key: {key[:16] + '…' if key else '(absent)'}"


def check(gw: Gateway, stack: Stack) -> list[str]:
    """A repeated request is a hit that never reaches the simulator; the limited key's third
    request within the minute is a 429; an unknown key is refused. Raises when one fails."""
    lines: list[str] = []
    question = f"Peer check {uuid.uuid4().hex[:8]}: what is the boiling point of water?"
    answers = []
    for attempt in ("first", "repeated"):
        served = sim_served(stack)
        status, headers, doc = post(gw.url, question, BENCH_KEY)
        calls = sim_served(stack) - served
        hit, how = cache_report(gw, headers)
        answers.append(doc.get("choices"))
        lines.append(f"- {attempt} request: {status}, {how}, simulator calls +{calls}")
        if status != 200 or hit != (attempt == "repeated") or calls != (0 if hit else 1):
            raise RuntimeError(f"{gw.name}: {attempt} request not as expected: {lines[-1]}")
        time.sleep(1.0)  # LiteLLM writes its cache after answering
    if answers[0] != answers[1]:
        raise RuntimeError(f"{gw.name}: the cached answer differs from the first")
    lines.append("- the repeated request's answer equals the first's")
    statuses, detail = [], ""
    for i in range(LIMITED_RPM + 2):
        status, headers, doc = post(gw.url, f"Limit check {uuid.uuid4().hex[:8]} number {i}", LIMITED_KEY)
        statuses.append(status)
        if status == 429 and not detail:
            message = str(doc.get("error", {}).get("message", doc))[:110]
            detail = f"; first 429: retry-after {headers.get('retry-after', '-')}, \"{message}\""
    lines.append(f"- key limited to {LIMITED_RPM} a minute, {len(statuses)} requests: {statuses}{detail}")
    if statuses != [200] * LIMITED_RPM + [429, 429]:
        raise RuntimeError(f"{gw.name}: limit not enforced: {statuses}")
    status, _, _ = post(gw.url, "Who am I?", "sk-peers-unknown")
    lines.append(f"- unknown key: {status}")
    if status != 401:
        raise RuntimeError(f"{gw.name}: an unknown key got {status}")
    return lines


# --- timing --------------------------------------------------------------------------------------


@dataclass
class Window:
    round: int
    target: str  # gate | litellm | sim
    kind: str  # hit | miss
    conns: int
    rps: float
    p50: float
    p99: float
    requests: int
    non2xx: int
    socket_errors: int
    cpu_s: float
    redis_cpu_s: float

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu_s / max(self.requests, 1)

    @property
    def redis_cpu_ms(self) -> float:
        return 1000 * self.redis_cpu_s / max(self.requests, 1)


def socket_errors(out: str) -> int:
    for line in out.splitlines():
        if line.strip().startswith("Socket errors:"):
            return sum(int(part.split()[-1]) for part in line.split(":", 1)[1].split(","))
    return 0


def window(
    url: str, key: str | None, kind: str, conns: int, duration: int, roots: list[int], redis_pid: int,
    script: Path,
) -> dict[str, float]:
    script.write_text(wrk_script(kind, key))
    # wrk's own time-out is 2 s: a busy machine's slow tail would count as socket errors.
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--timeout", "30s", "--latency", "-s",
           str(script), f"{url}/v1/chat/completions"]
    cpu0, redis0 = tree_cpu_seconds(roots), tree_cpu_seconds([redis_pid])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    cpu1, redis1 = tree_cpu_seconds(roots), tree_cpu_seconds([redis_pid])
    r = parse_wrk(out)
    return {**r, "socket_errors": socket_errors(out), "cpu_s": cpu1 - cpu0, "redis_cpu_s": redis1 - redis0}


@dataclass
class Run:
    windows: list[Window] = field(default_factory=list)
    memory: dict[str, tuple[float, float]] = field(default_factory=dict)  # target -> (RSS, PSS) MB, max
    checks: dict[str, list[str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    load: list[str] = field(default_factory=list)

    def of(self, target: str, kind: str, conns: int) -> list[Window]:
        return [w for w in self.windows if (w.target, w.kind, w.conns) == (target, kind, conns)]


def median_range(values: Sequence[float], fmt: str) -> str:
    """The median, and the range over the rounds when there is more than one."""
    med = fmt.format(statistics.median(values))
    if len(values) < 2:
        return med
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return med if low == high else f"{med} ({low}–{high})"


def added_p50(run: Run, target: str, kind: str) -> list[float]:
    """Per round: the target's p50 at 1 connection minus the simulator's, same kind, same round."""
    sims = {w.round: w.p50 for w in run.of("sim", kind, 1)}
    return [w.p50 - sims[w.round] for w in run.of(target, kind, 1) if w.round in sims]


def summary_rows(run: Run, conns: int) -> list[tuple[str, list[float], list[float], str]]:
    """(measure, gate values, LiteLLM values, number format) for the summary table."""
    rows: list[tuple[str, list[float], list[float], str]] = []
    for kind, noun in NOUNS.items():
        rows.append((f"{noun}: req/s at {conns} connections",
                     [w.rps for w in run.of("gate", kind, conns)],
                     [w.rps for w in run.of("litellm", kind, conns)], "{:.0f}"))
    for kind in ("hit", "miss"):
        rows.append((f"CPU ms per {kind} (whole gateway, {conns} connections)",
                     [w.cpu_ms for w in run.of("gate", kind, conns)],
                     [w.cpu_ms for w in run.of("litellm", kind, conns)], "{:.1f}"))
    for kind in ("hit", "miss"):
        rows.append((f"cores the gateway used, {NOUNS[kind]} at {conns} connections",
                     [w.rps * w.cpu_ms / 1000 for w in run.of("gate", kind, conns)],
                     [w.rps * w.cpu_ms / 1000 for w in run.of("litellm", kind, conns)], "{:.2f}"))
    for kind in ("hit", "miss"):
        rows.append((f"added p50 ms at 1 connection, {kind} (over the simulator direct)",
                     added_p50(run, "gate", kind), added_p50(run, "litellm", kind), "{:+.1f}"))
    for kind in ("hit", "miss"):
        rows.append((f"Redis CPU ms per {kind} ({conns} connections)",
                     [w.redis_cpu_ms for w in run.of("gate", kind, conns)],
                     [w.redis_cpu_ms for w in run.of("litellm", kind, conns)], "{:.2f}"))
    if "gate" in run.memory and "litellm" in run.memory:
        rows.append(("resident memory MB (RSS summed over the processes)",
                     [run.memory["gate"][0]], [run.memory["litellm"][0]], "{:,.0f}"))
        rows.append(("proportional memory MB (PSS: shared pages split)",
                     [run.memory["gate"][1]], [run.memory["litellm"][1]], "{:,.0f}"))
    return rows


def report(run: Run, args: argparse.Namespace, command: str) -> str:
    gate_label, peer_label = run.labels.get("gate", "gate"), run.labels.get("litellm", "LiteLLM")
    conns = args.connections
    lines = [
        "# Peer benchmark: the gate against LiteLLM proxy "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`{command}`: {gate_label} against {peer_label}, the same `load/vllm_sim.py` simulator "
        "answering at once (no model latency), the same `redis-server` (started on a free port), "
        f"the same wrk load (one thread; a {MODEL} chat body with `max_tokens` 16). Hits: one fixed "
        "body, identical for both; misses: a new question every request. Windows of "
        f"{args.duration} s, the two gateways alternating window by window (the order flips each "
        f"round), {args.rounds} rounds; figures are medians over the rounds, the range in brackets. "
        "CPU: utime + stime of each gateway's whole process trees (/proc/PID/stat) over the window, "
        "per request: the gate's 2 processes plus Envoy against LiteLLM's main process and its "
        "workers; Redis's CPU is its own row. Added p50: a gateway's p50 at one connection minus "
        "the simulator's p50 called directly, same round, same kind of request. Memory: the "
        "largest of the samples taken after each window. With every core busy, req/s follows the "
        "share of the CPU each gateway gets (the kernel shares it by thread, and the gate with "
        "Envoy runs more threads than LiteLLM's two workers; the cores each used are a row of "
        "their own): CPU per request and memory are the steadier comparison.",
        "",
        f"| measure | {gate_label} | {peer_label} | LiteLLM / gate |",
        "|---|---:|---:|---:|",
    ]
    for measure, gate, peer, fmt in summary_rows(run, conns):
        if not gate or not peer:
            continue
        ratio = statistics.median(peer) / statistics.median(gate) if statistics.median(gate) else float("nan")
        lines.append(f"| {measure} | {median_range(gate, fmt)} | {median_range(peer, fmt)} | {ratio:.2f} |")
    lines += ["", "## Configured as closely as the two allow", ""]
    lines += [
        "| | gate | LiteLLM proxy |",
        "|---|---|---|",
        f"| processes | `llm-gate serve`, {WORKERS} workers, behind Envoy (2 threads) | "
        f"`litellm --num_workers {WORKERS}` (uvicorn) |",
        "| cache | exact and near-exact answer cache in Redis; semantic layer off | `cache: true`, "
        "`cache_params: {type: redis}` (exact, keyed on the request's parameters) |",
        f"| per-key limit | `identity.api_keys` (one tenant per key), `ratelimit.tiers`: the bench key "
        f"{BENCH_RPM // 60:,}/s burst {BENCH_RPM // 60:,}, the limited key {LIMITED_RPM}/min burst "
        f"{LIMITED_RPM}; GCRA buckets in Redis | no database, so no virtual keys: `general_settings."
        f"custom_auth` returns each key's `UserAPIKeyAuth(rpm_limit=…)`: {BENCH_RPM:,}/min and "
        f"{LIMITED_RPM}/min, enforced by LiteLLM's own limiter, counted in Redis |",
        "| unknown key | 401 (`unknown_keys: reject`) | 401 (the custom auth raises) |",
        "| other stages | every other stage at its default (validation, sanitizer, routing, prompt "
        "limit, breaker, coalescing, token budget, admission) | its defaults; model price list "
        "from the package (`LITELLM_LOCAL_MODEL_COST_MAP`) |",
        "| logs | Envoy's and the gate's access lines to files | uvicorn's access lines to a file |",
        "",
        "## Correctness first",
        "",
    ]
    for target, label in (("gate", gate_label), ("litellm", peer_label)):
        lines += [f"{label}:", "", *run.checks.get(target, []), ""]
    lines += [
        "## Every window",
        "",
        "| round | load | target | req/s | p50 ms | p99 ms | CPU ms/req | Redis CPU ms/req | non-2xx "
        "| socket errors |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in run.windows:
        name = {"sim": "simulator direct"}.get(w.target, run.labels.get(w.target, w.target))
        cpu = "-" if w.target == "sim" else f"{w.cpu_ms:.2f}"
        lines.append(
            f"| {w.round + 1} | {NOUNS[w.kind]}, {w.conns} conn{'s' if w.conns > 1 else ''} | {name} | "
            f"{w.rps:.0f} | {w.p50:.2f} | {w.p99:.2f} | {cpu} | {w.redis_cpu_ms:.2f} | {w.non2xx} | "
            f"{w.socket_errors} |"
        )
    lines += ["", "## Machine load", "", *run.load]
    return "\n".join(lines) + "\n"


def timed(run: Run, gateways: dict[str, Gateway], stack: Stack, args: argparse.Namespace) -> None:
    redis_pid = stack.procs["redis"].pid
    script = stack.workdir / "load.lua"
    sim = Gateway("sim", stack.sim_url("primary"), [], key=None)
    order = list(gateways)
    for rnd in range(args.rounds):
        for conns in (args.connections, 1):
            for kind in ("hit", "miss"):
                targets = ["sim"] if conns == 1 else []
                targets += order if rnd % 2 == 0 else order[::-1]
                for target in targets:
                    gw = sim if target == "sim" else gateways[target]
                    r = window(gw.url, gw.key, kind, conns, args.duration, gw.roots, redis_pid, script)
                    w = Window(rnd, target, kind, conns, r["rps"], r["p50"], r["p99"], int(r["requests"]),
                               int(r["errors"]), int(r["socket_errors"]), r["cpu_s"], r["redis_cpu_s"])
                    run.windows.append(w)
                    if target != "sim":
                        rss, pss = tree_memory_mb(gw.roots)
                        old = run.memory.get(target, (0.0, 0.0))
                        run.memory[target] = (max(old[0], rss), max(old[1], pss))
                    print(
                        f"round {rnd + 1} {kind:4s} c{conns:<3d} {target:8s} {w.rps:7.0f} req/s  "
                        f"p50 {w.p50:7.2f} ms  p99 {w.p99:7.2f} ms  CPU {w.cpu_ms:6.2f} ms/req  "
                        f"non-2xx {w.non2xx}  socket errors {w.socket_errors}",
                        flush=True,
                    )
                    if w.non2xx:  # a gateway that answers errors is fast, and its figures say nothing
                        log = stack.log(target)[-3000:]
                        raise RuntimeError(f"{target}: {w.non2xx} answers not 2xx:\n{log}")


def stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to the process group, SIGKILL to whatever of it is left after `grace` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        proc.poll()
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # a worker that outlived its parent, too
    proc.wait(5)


def close(stack: Stack) -> None:
    """LiteLLM (its workers may outlive their parent) and then the rest, signals held off."""
    with held_signals():
        peer = stack.procs.pop("litellm", None)
        if peer is not None:
            stop_group(peer, grace=5)
        stack.close()


def warm_up(gw: Gateway, stack: Stack, args: argparse.Namespace) -> None:
    """A few seconds of misses and the fixed question once: lazy imports, pools and the first
    hit's entry are in place before anything is timed."""
    script = stack.workdir / "warm.lua"
    for kind in ("miss", "hit"):
        script.write_text(wrk_script(kind, gw.key))
        url = f"{gw.url}/v1/chat/completions"
        cmd = ["wrk", "-t1", f"-c{args.connections}", "-d3s", "--timeout", "30s", "-s", str(script), url]
        subprocess.run(cmd, capture_output=True, check=True, timeout=60)
    time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()  # a time-out or Ctrl-C unwinds: every process it started stops, its folder goes
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per timed window")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--litellm-version", default=LITELLM_VERSION)
    parser.add_argument(
        "--cache-dir", type=Path, default=CACHE_DIR, help="where LiteLLM's virtualenv is kept"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    command = "python -m load.bench_peers" + "".join(
        f" --{k.replace('_', '-')} {getattr(args, k)}"
        for k in ("duration", "rounds", "connections", "litellm_version")
        if getattr(args, k) != parser.get_default(k)
    )
    ensure_tools()
    exe = ensure_litellm(args.litellm_version, args.cache_dir)
    run = Run()
    load0 = os.getloadavg()
    print("starting Redis, the simulator, the gate (2 processes) and Envoy", flush=True)
    stack = Stack(gate_workers=WORKERS, with_redis=True, gate_config=gate_config(), sim_args=SIM_ARGS)
    try:
        stack.start()
        gate = Gateway("gate", stack.url, [stack.procs["gate"].pid, stack.procs["envoy"].pid],
                       label=f"gate ({WORKERS} processes + Envoy)")
        print(f"starting LiteLLM proxy ({WORKERS} workers)", flush=True)
        peer = start_litellm(stack, exe, WORKERS)
        peer.name = "litellm"
        gateways = {"gate": gate, "litellm": peer}
        run.labels = {k: g.label for k, g in gateways.items()}
        for target, gw in gateways.items():
            run.checks[target] = check(gw, stack)
            print(f"{gw.label}:\n" + "\n".join(run.checks[target]), flush=True)
        for gw in gateways.values():
            warm_up(gw, stack, args)
        ours = set(tree_pids([p.pid for p in stack.procs.values()] + [os.getpid()]))
        procs0, busy0, t0 = cpu_by_process(), machine_busy_seconds(), time.monotonic()
        timed(run, gateways, stack, args)
        seconds = time.monotonic() - t0
        busy = (machine_busy_seconds() - busy0) / seconds
        others = other_load(procs0, cpu_by_process(), ours, seconds)
    finally:
        close(stack)
    load1 = os.getloadavg()
    heavy = ", ".join(f"{name} {share:.2f}" for name, share in others[:4] if share >= 0.02)
    heavy = heavy or "none over 0.02"
    run.load = [
        f"{os.cpu_count()} cores, shared: wrk, Envoy, both gateways, Redis and the simulator run on "
        f"the same cores, and so does whatever else the machine is doing. Load average "
        f"{load0[0]:.2f} before the run, {load1[0]:.2f} after; during the timed windows the "
        f"machine was busy {busy:.2f} cores on average, of which other processes (not this "
        f"benchmark's, not wrk) took, in cores: {heavy}. The gateway not being timed sits idle "
        "beside the one that is."
    ]
    text = report(run, args, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n" + text + f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
