"""Deterministic vLLM (OpenAI-compatible) simulator for load, overload and fault tests.

Run: ``python -m load.vllm_sim --port 8001 --model llama-3-8b [--model other] ...``

Token rule: a "token" is a whitespace-separated word. prompt_tokens = number of words
in all message contents (chat) or in the prompt (completions; a list of ints counts one
per int), at least 1. The answer is ``[<model>] Answer to: <first 40 chars of the last
user message / prompt> <filler...>``; its natural length is ``max(8 + h % 25, header
words)`` with ``h`` a sha256 of (model, prompt), so same request -> same text. Completion
tokens = min(max_tokens (default 16), natural length) -> finish_reason "length" if cut,
else "stop"; ``ignore_eos: true`` generates exactly max_tokens.

Answer model: when the request carries ``x-sim-family: F`` (the load generator sets it
per paraphrase family), the answer depends on (model, F) only -- two paraphrases of one
family get the same text, two families different texts -- so a benchmark can judge
whether a cached answer was right: ``[<model>] Family <F> answer: <filler...>``.

Upstream key: with ``--api-key KEY`` (or ``VLLM_SIM_API_KEY``) the /v1 endpoints require
``authorization: Bearer KEY`` and answer an OpenAI-style 401 otherwise. Every header name
and every authorization / x-api-key value received is recorded (``/admin/state``:
``header_names``, ``credentials``) so a test can assert a client's key never got here.
``/admin/served`` gives each answered request's service time by its ``x-load-id`` header.

Latency: TTFT = base_ttft_ms + per_prompt_token_ms * prompt_tokens + extra_latency_ms
(faults.ttft_ms replaces base_ttft_ms); each later token waits
itl_ms * (1 + batch_slowdown * running), on a schedule: a wake-up that came late because
the host was busy shortens the next wait (by up to 50 ms) instead of delaying every later
token. Admission is FIFO: at most max_num_seqs running
and the KV cache (kv_cache_tokens) must hold prompt + max_tokens of every running request.
With ``--scheduling-policy priority`` the body's ``priority`` (lower first, default 0) orders
the waiting requests, and one that does not fit preempts a running request of a lower
priority (it waits again, then recomputes). Under "fcfs" a non-zero priority is a 400, as
in vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import dataclasses
import hashlib
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PCounter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_FILLER = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
           "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
           "sierra", "tango", "uniform", "victor", "whiskey", "xray"]
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 10.0)
_E2E_BUCKETS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)
_MAX_IDS = 500_000  # service times kept by x-load-id
_MAX_ARRIVALS = 10_000  # arrivals kept (for tests that look for requests around the gate)
_TUNABLE = ("base_ttft_ms", "per_prompt_token_ms", "itl_ms", "batch_slowdown", "max_num_seqs",
            "kv_cache_tokens")


@dataclass
class SimConfig:
    models: list[str] = field(default_factory=lambda: ["llama-3-8b"])
    base_ttft_ms: float = 20.0
    per_prompt_token_ms: float = 0.05
    itl_ms: float = 5.0
    batch_slowdown: float = 0.02
    max_num_seqs: int = 64
    kv_cache_tokens: int = 100_000
    default_max_tokens: int = 16
    scheduling_policy: str = "fcfs"  # or "priority": by the request's `priority`, preempting
    seed: int = 0
    name: str = ""  # if set, sent back as the `x-sim-name` response header
    api_key: str = ""  # if set, /v1 requires `authorization: Bearer <api_key>`


@dataclass
class Faults:
    extra_latency_ms: float = 0.0
    error_rate: float = 0.0
    error_status: int = 500
    hang: bool = False
    ttft_ms: float | None = None
    itl_ms: float | None = None
    health_status: int = 200


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class ClientGoneError(Exception):
    """The client disconnected while its request was pending."""


_ERR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 429: "RateLimitError",
              503: "ServiceUnavailableError"}


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    err = {"message": message, "type": _ERR_TYPES.get(status, "InternalServerError"),
           "param": param, "code": status}
    return web.Response(status=status, body=orjson.dumps({"error": err}),
                        content_type="application/json")


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json",
                        headers=headers)


@dataclass(eq=False)
@dataclass(eq=False)
class Run:
    """One request's place in the engine: running, or waiting on `fut` (first, or preempted)."""

    need: int
    model: str
    priority: int
    seq: int
    fut: asyncio.Future[None] | None = None
    running: bool = False
    preempted: int = 0  # times it was sent back to wait


class Scheduler:
    """Admission bounded by max_num_seqs and KV-cache tokens: first come first served, or
    with scheduling_policy "priority" by (priority, arrival), where a request that does not
    fit preempts the worst-ranked running request of a lower priority (higher value), as
    vLLM's ``--scheduling-policy priority`` does; the preempted one waits again and
    recomputes its prompt and what it generated so far."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.running = 0
        self.kv_used = 0
        self.queue: list[Run] = []  # waiting, in the order they will run
        self.active: list[Run] = []
        self.preemptions = 0
        self._seq = 0
        self.running_by_model: Counter[str] = Counter()
        self.waiting_by_model: Counter[str] = Counter()

    def _rank(self, run: Run) -> tuple[int, int]:
        return (run.priority if self.cfg.scheduling_policy == "priority" else 0, run.seq)

    def _fits(self, need: int) -> bool:
        if self.running >= self.cfg.max_num_seqs:
            return False
        return self.running == 0 or self.kv_used + need <= self.cfg.kv_cache_tokens

    def _admit(self, run: Run) -> None:
        self.running += 1
        self.kv_used += run.need
        self.running_by_model[run.model] += 1
        self.active.append(run)
        run.running = True

    def _stop(self, run: Run) -> None:
        self.running -= 1
        self.kv_used -= run.need
        self.running_by_model[run.model] -= 1
        self.active.remove(run)
        run.running = False

    def _enqueue(self, run: Run) -> None:
        run.fut = asyncio.get_running_loop().create_future()
        bisect.insort(self.queue, run, key=self._rank)
        self.waiting_by_model[run.model] += 1

    async def acquire(self, need: int, model: str, priority: int = 0) -> Run:
        self._seq += 1
        run = Run(need, model, priority, self._seq)
        self._enqueue(run)
        self.schedule()
        await self.wait(run)
        return run

    async def wait(self, run: Run) -> None:
        """Until `run` runs (again); on cancellation it leaves the engine."""
        try:
            if run.fut is not None:
                await run.fut
        except BaseException:
            self.release(run)
            raise

    def preempted(self, run: Run) -> bool:
        return not run.running and run.fut is not None

    def release(self, run: Run) -> None:
        if run.running:
            self._stop(run)
        elif run in self.queue:
            self.queue.remove(run)
            self.waiting_by_model[run.model] -= 1
        self.schedule()

    def schedule(self) -> None:
        while self.queue:
            head = self.queue[0]
            if not self._fits(head.need) and not self._preempt_for(head):
                break
            self.queue.pop(0)
            self.waiting_by_model[head.model] -= 1
            if head.fut is not None and not head.fut.done():
                self._admit(head)
                head.fut.set_result(None)

    def _preempt_for(self, run: Run) -> bool:
        """Send the worst-ranked running request of a lower priority back to wait."""
        if self.cfg.scheduling_policy != "priority":
            return False
        lower = [r for r in self.active if r.priority > run.priority]
        if not lower:
            return False
        victim = max(lower, key=self._rank)
        self._stop(victim)
        victim.preempted += 1
        self.preemptions += 1
        self._enqueue(victim)
        return True


class _GaugeCollector(Collector):
    def __init__(self, sim: SimState) -> None:
        self.sim = sim

    def collect(self) -> Iterator[Metric]:
        s, models = self.sim.sched, self.sim.cfg.models
        usage = min(1.0, s.kv_used / max(1, self.sim.cfg.kv_cache_tokens))
        for name, help_, value in (
            ("vllm:num_requests_running", "Running requests", lambda m: s.running_by_model[m]),
            ("vllm:num_requests_waiting", "Waiting requests", lambda m: s.waiting_by_model[m]),
            ("vllm:kv_cache_usage_perc", "KV-cache usage (0..1)", lambda m: usage),
        ):
            g = GaugeMetricFamily(name, help_, labels=["model_name"])
            for m in models:
                g.add_metric([m], float(value(m)))
            yield g


class Metrics:
    def __init__(self, sim: SimState) -> None:
        self.registry = CollectorRegistry()
        r, lbl = self.registry, ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", lbl, registry=r,
                              buckets=_TTFT_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E latency", lbl, registry=r,
                             buckets=_E2E_BUCKETS)
        self.prompt = PCounter("vllm:prompt_tokens", "Prompt tokens", lbl, registry=r)
        self.gen = PCounter("vllm:generation_tokens", "Generated tokens", lbl, registry=r)
        self.success = PCounter("vllm:request_success", "Finished requests",
                                ["model_name", "finished_reason"], registry=r)
        r.register(_GaugeCollector(sim))


class SimState:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.sched = Scheduler(cfg)
        self.unhang = asyncio.Event()
        self.hung = 0  # live count of requests held by the `hang` fault
        self.reset()

    def reset(self) -> None:
        self.faults = Faults()
        self.unhang.set()
        self.rng = random.Random(self.cfg.seed)
        self.served = 0
        self.served_by_model: Counter[str] = Counter()
        self.received = self.errors = self.cancelled = 0
        self.last_request: dict[str, Any] = {}
        self.last_headers: dict[str, dict[str, str]] = {}
        self.header_names: Counter[str] = Counter()
        self.credentials: set[str] = set()
        self.unauthorized = 0
        self.by_family: Counter[str] = Counter()
        self.service_ms: dict[str, float] = {}  # by the x-load-id request header
        self.max_service_ms = 0.0
        self.metrics = Metrics(self)
        # Every request that reached this server, on any path: (method, path, routed by the
        # gate). A request without the gate's `x-gate-cluster` came around the gate.
        self.arrivals: list[tuple[str, str, bool]] = []

    def record_service(self, load_id: str, ms: float) -> None:
        self.max_service_ms = max(self.max_service_ms, ms)
        if load_id and len(self.service_ms) < _MAX_IDS:
            self.service_ms[load_id] = round(ms, 2)

    def record_headers(self, headers: dict[str, str]) -> None:
        self.header_names.update(headers.keys())
        for name in ("authorization", "x-api-key"):
            if name in headers:
                self.credentials.add(headers[name])

    def authorized(self, headers: dict[str, str]) -> bool:
        key = self.cfg.api_key
        return not key or headers.get("authorization", "") == f"Bearer {key}"

    def snapshot(self) -> dict[str, Any]:
        return {
            "served": self.served, "served_by_model": dict(self.served_by_model),
            "received": self.received, "errors": self.errors, "cancelled": self.cancelled,
            "running": self.sched.running, "waiting": len(self.sched.queue), "hung": self.hung,
            "preemptions": self.sched.preemptions,
            "kv_cache_used_tokens": self.sched.kv_used,
            "faults": dataclasses.asdict(self.faults),
            "config": {**dataclasses.asdict(self.cfg), "api_key": "set" if self.cfg.api_key else ""},
            "last_request": self.last_request, "last_headers": self.last_headers,
            "header_names": dict(self.header_names), "credentials": sorted(self.credentials),
            "unauthorized": self.unauthorized, "served_by_family": dict(self.by_family),
        }


STATE = web.AppKey("vllm_sim_state", SimState)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _answer(model: str, prompt: str, snippet: str, family: str = "") -> list[str]:
    if family:  # the same text for every paraphrase of one family
        h = int.from_bytes(hashlib.sha256(f"{model}\0family\0{family}".encode()).digest()[:8], "big")
        header = [f"[{model}]", "Family", family[:40], "answer:"]
        rng = random.Random(h)
        return header + [rng.choice(_FILLER) for _ in range(8 + h % 25)]
    h = int.from_bytes(hashlib.sha256(f"{model}\0{prompt}".encode()).digest()[:8], "big")
    header = [f"[{model}]", "Answer", "to:", *snippet[:40].split()]
    rng = random.Random(h)
    return header + [rng.choice(_FILLER) for _ in range(max(0, 8 + h % 25 - len(header)))]


def _gone(request: web.Request) -> bool:
    tr = request.transport
    return tr is None or tr.is_closing()


async def _sleep_ms(ms: float) -> None:
    if ms > 0:
        await asyncio.sleep(ms / 1000.0)


class _Clock:
    """The engine's step times, kept on a schedule: a wake-up that came late (the host's
    CPU was busy) shortens the next wait instead of delaying every later token, as a GPU's
    steps do not wait for the HTTP server's event loop."""

    def __init__(self) -> None:
        self.due = time.monotonic()

    async def after_ms(self, ms: float) -> None:
        self.due = max(self.due, time.monotonic() - 0.05) + ms / 1000  # at most 50 ms caught up
        await _sleep_ms((self.due - time.monotonic()) * 1000)


async def _wait_unhang(sim: SimState, request: web.Request) -> None:
    if not sim.faults.hang:
        return
    sim.hung += 1
    try:  # poll the socket too, in case the server runs without handler_cancellation
        while sim.faults.hang:
            if _gone(request):
                raise ClientGoneError
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await sim.unhang.wait()
    finally:
        sim.hung -= 1


async def _completion(request: web.Request, chat: bool) -> web.StreamResponse:
    sim = request.app[STATE]
    t0 = time.monotonic()
    raw = await request.read()
    sim.received += 1
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = raw.decode("utf-8", "replace")
    sim.last_request[request.path] = body
    seen = {k.lower(): v for k, v in request.headers.items()}
    sim.last_headers[request.path] = seen
    sim.record_headers(seen)
    family = seen.get("x-sim-family", "")
    try:
        if not sim.authorized(seen):
            sim.unauthorized += 1
            raise ApiError(401, "Incorrect API key provided.", "authorization")
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        model = body.get("model") or sim.cfg.models[0]
        if model not in sim.cfg.models:
            raise ApiError(404, f"The model `{model}` does not exist.", "model")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ApiError(400, "messages must be a non-empty list", "messages")
            texts = [_text_of(m.get("content")) for m in msgs if isinstance(m, dict)]
            users = [_text_of(m.get("content")) for m in msgs
                     if isinstance(m, dict) and m.get("role") == "user"]
            prompt, snippet = "\n".join(texts), (users or texts or [""])[-1]
            n_prompt = sum(len(t.split()) for t in texts)
        else:
            p = body.get("prompt", "")
            if isinstance(p, list) and all(isinstance(x, int) for x in p):
                prompt = snippet = " ".join(map(str, p))
                n_prompt = len(p)
            else:
                prompt = snippet = " ".join(map(str, p)) if isinstance(p, list) else str(p)
                n_prompt = len(prompt.split())
        n_prompt = max(1, n_prompt)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = sim.cfg.default_max_tokens if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, "max_tokens must be a positive integer", "max_tokens")
        priority = body.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ApiError(400, "priority must be an integer", "priority")
        if priority and sim.cfg.scheduling_policy != "priority":
            raise ApiError(400, "priority is only supported with the priority scheduling policy.", "priority")
        need = n_prompt + max_tokens
        if need > sim.cfg.kv_cache_tokens:
            raise ApiError(400, f"This model's maximum context length is "
                           f"{sim.cfg.kv_cache_tokens} tokens; requested {need}.", "max_tokens")
        await _wait_unhang(sim, request)
        if sim.faults.error_rate > 0 and sim.rng.random() < sim.faults.error_rate:
            sim.errors += 1
            raise ApiError(sim.faults.error_status, "injected fault")
    except ApiError as e:
        return error_response(e.status, e.message, e.param)
    except ClientGoneError:
        sim.cancelled += 1
        return web.Response(status=499)

    words = _answer(model, prompt, snippet, family)
    if body.get("ignore_eos"):
        while len(words) < max_tokens:
            words.append(_FILLER[len(words) % len(_FILLER)])
    tokens = words[:max_tokens]
    finish = "length" if len(words) > max_tokens or body.get("ignore_eos") else "stop"
    stream = bool(body.get("stream"))
    so = body.get("stream_options")
    include_usage = stream and isinstance(so, dict) and bool(so.get("include_usage"))
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"
    usage = {"prompt_tokens": n_prompt, "completion_tokens": len(tokens),
             "total_tokens": n_prompt + len(tokens)}
    headers = {"x-sim-name": sim.cfg.name} if sim.cfg.name else {}

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        c = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created,
             "model": model, "choices": choices, **extra}
        if include_usage and "usage" not in c:
            c["usage"] = None
        return b"data: " + orjson.dumps(c) + b"\n\n"

    resp: web.StreamResponse | None = None
    if stream:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", **headers})
        await resp.prepare(request)
    run = await sim.sched.acquire(need, model, priority)
    try:
        f = sim.faults
        ttft = (sim.cfg.base_ttft_ms if f.ttft_ms is None else f.ttft_ms)
        clock = _Clock()
        await clock.after_ms(ttft + sim.cfg.per_prompt_token_ms * n_prompt + f.extra_latency_ms)
        sim.metrics.ttft.labels(model).observe(time.monotonic() - t0)
        for i, tok in enumerate(tokens):
            if i:
                itl = sim.cfg.itl_ms if sim.faults.itl_ms is None else sim.faults.itl_ms
                await clock.after_ms(itl * (1 + sim.cfg.batch_slowdown * sim.sched.running))
            if sim.sched.preempted(run):  # wait again, then recompute the prompt and the i tokens
                await sim.sched.wait(run)
                clock = _Clock()
                await clock.after_ms(ttft + sim.cfg.per_prompt_token_ms * (n_prompt + i))
            if _gone(request):
                raise ClientGoneError
            if resp is not None:
                piece = tok if i == 0 else " " + tok
                if chat:
                    delta = {"content": piece}
                    if i == 0:
                        delta = {"role": "assistant", **delta}
                    ch: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": None}
                else:
                    ch = {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
                await resp.write(chunk([ch]))
    except ClientGoneError:
        sim.cancelled += 1
        return resp or web.Response(status=499)
    except (ConnectionError, asyncio.CancelledError):
        sim.cancelled += 1
        raise
    finally:
        sim.sched.release(run)

    text = " ".join(tokens)
    sim.served += 1
    sim.served_by_model[model] += 1
    if family:
        sim.by_family[family] += 1
    sim.record_service(seen.get("x-load-id", ""), (time.monotonic() - t0) * 1000)
    m = sim.metrics
    m.prompt.labels(model).inc(n_prompt)
    m.gen.labels(model).inc(len(tokens))
    m.success.labels(model, finish).inc()
    m.e2e.labels(model).observe(time.monotonic() - t0)
    if resp is not None:
        last: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if chat:
            last["delta"] = {}
        else:
            last["text"] = ""
        await resp.write(chunk([last]))
        if include_usage:
            await resp.write(chunk([], usage=usage))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    return _json({"id": rid, "object": obj, "created": created, "model": model,
                  "choices": [choice], "usage": usage}, 200, headers)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=False)


async def models(request: web.Request) -> web.Response:
    sim = request.app[STATE]
    seen = {k.lower(): v for k, v in request.headers.items()}
    sim.record_headers(seen)
    if not sim.authorized(seen):
        sim.unauthorized += 1
        return error_response(401, "Incorrect API key provided.", "authorization")
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "vllm", "root": m,
             "parent": None, "max_model_len": sim.cfg.kv_cache_tokens} for m in sim.cfg.models]
    return _json({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=request.app[STATE].faults.health_status)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def admin_state(request: web.Request) -> web.Response:
    return _json(request.app[STATE].snapshot())


async def admin_served(request: web.Request) -> web.Response:
    """Service time (ms, receipt to last token) of each answered request by its x-load-id."""
    sim = request.app[STATE]
    return _json({"max_ms": round(sim.max_service_ms, 2), "by_id": sim.service_ms})


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        raise ApiError(400, "invalid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object")
    return body


def _apply(target: Any, body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for k, v in body.items():
        if k not in allowed:
            raise ApiError(400, f"unknown field {k!r}", k)
        cur = getattr(target, k)
        ok = (v is None and k in ("ttft_ms", "itl_ms")) or (
            isinstance(v, bool) if isinstance(cur, bool) or k == "hang"
            else isinstance(v, int | float) and not isinstance(v, bool))
        if not ok:
            raise ApiError(400, f"bad value for {k!r}", k)
    for k, v in body.items():
        setattr(target, k, int(v) if k in ("error_status", "health_status", "max_num_seqs",
                                           "kv_cache_tokens") else v)


async def admin_faults(request: web.Request) -> web.Response:
    sim = request.app[STATE]
    try:
        _apply(sim.faults, await _json_body(request),
               tuple(f.name for f in dataclasses.fields(Faults)))
    except ApiError as e:
        return error_response(e.status, e.message, e.param)
    if sim.faults.hang:
        sim.unhang.clear()
    else:
        sim.unhang.set()
    return _json(dataclasses.asdict(sim.faults))


async def admin_config(request: web.Request) -> web.Response:
    sim = request.app[STATE]
    try:
        _apply(sim.cfg, await _json_body(request), _TUNABLE)
    except ApiError as e:
        return error_response(e.status, e.message, e.param)
    sim.sched.schedule()
    return _json(dataclasses.asdict(sim.cfg))


async def admin_reset(request: web.Request) -> web.Response:
    request.app[STATE].reset()
    return _json(request.app[STATE].snapshot())


async def admin_arrivals(request: web.Request) -> web.Response:
    arrivals = request.app[STATE].arrivals
    return _json({"arrivals": [{"method": m, "path": p, "gated": g} for m, p, g in arrivals]})


@web.middleware
async def _record_arrival(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path != "/admin/arrivals":
        arrivals = request.app[STATE].arrivals
        if len(arrivals) < _MAX_ARRIVALS:
            arrivals.append((request.method, request.raw_path, "x-gate-cluster" in request.headers))
    response: web.StreamResponse = await handler(request)
    return response


async def _name_every_response(request: web.Request, response: web.StreamResponse) -> None:
    """Errors too carry `x-sim-name`: a client can tell a model server's answer from the gate's."""
    name = request.app[STATE].cfg.name
    if name and request.path.startswith("/v1/"):
        response.headers["x-sim-name"] = name


def create_app(config: SimConfig | None = None) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_record_arrival])
    cfg = dataclasses.replace(config or SimConfig())
    cfg.models = list(cfg.models)
    app[STATE] = SimState(cfg)
    app.on_response_prepare.append(_name_every_response)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/state", admin_state)
    app.router.add_get("/admin/arrivals", admin_arrivals)
    app.router.add_get("/admin/served", admin_served)
    app.router.add_post("/admin/faults", admin_faults)
    app.router.add_post("/admin/config", admin_config)
    app.router.add_post("/admin/reset", admin_reset)
    return app


@dataclass
class SimServer:
    app: web.Application
    runner: web.AppRunner
    port: int
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def state(self) -> SimState:
        return self.app[STATE]

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_sim(config: SimConfig | None = None, host: str = "127.0.0.1",
                    port: int = 0) -> SimServer:
    """Start a simulator in the running loop (port 0 = pick a free port)."""
    app = create_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=4096).start()
    return SimServer(app, runner, int(runner.addresses[0][1]), host)


def main(argv: list[str] | None = None) -> None:
    d = SimConfig()
    p = argparse.ArgumentParser(prog="llm-gate sim", description="vLLM simulator")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--model", action="append", dest="models", help="served model (repeatable)")
    p.add_argument("--name", default="", help="instance name sent as x-sim-name header")
    helps = {
        "base_ttft_ms": "time to first token with an empty batch",
        "per_prompt_token_ms": "extra time to first token per prompt token",
        "itl_ms": "time between output tokens",
        "batch_slowdown": "each running sequence slows every step by this fraction",
        "max_num_seqs": "sequences running at once (more wait, as in vLLM)",
        "kv_cache_tokens": "KV-cache size in tokens (reported in /metrics)",
        "default_max_tokens": "output tokens when a request sets no max_tokens",
        "scheduling_policy": "fcfs, or priority: by the body's priority, preempting lower ones",
        "seed": "random seed of the generated text",
    }
    for f in dataclasses.fields(SimConfig):
        if f.name not in ("models", "name"):
            p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(d, f.name)),
                           default=getattr(d, f.name), help=f"{helps.get(f.name, f.name)} (%(default)s)")
    a = vars(p.parse_args(argv))
    host, port = a.pop("host"), a.pop("port")
    cfg = SimConfig(**{**a, "models": a["models"] or d.models})
    cfg.api_key = cfg.api_key or os.environ.get("VLLM_SIM_API_KEY", "")
    web.run_app(create_app(cfg), host=host, port=port, handler_cancellation=True, backlog=4096,
                access_log=None, print=None)


if __name__ == "__main__":
    main()
