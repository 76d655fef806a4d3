"""A request driver that calls the cache stage's hooks in the order the server does,
a scripted upstream, and a tiny deterministic bag-of-words embedder (unit tests only)."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import redis.asyncio as aioredis

from extproc.cache.backing import Backing
from extproc.cache.hot import HotEntries
from extproc.cache.keeper import PUT_TASK, Keeper
from extproc.cache.lease import Leases
from extproc.cache.lookup import Finder
from extproc.cache.lsh import Lsh
from extproc.cache.semantic import Matcher
from extproc.cache.setup import Matchers, Profile
from extproc.cache.store import Store
from extproc.config import Cache as CacheConfig
from extproc.config import CacheCoalesce
from extproc.config import Store as StoreConfig
from extproc.dedup.decide import Decision, LanguagePoint, Policy
from extproc.exchange import Exchange
from extproc.metrics import Metrics
from extproc.redis_conn import StoreGuard
from extproc.stages.cache import Cache
from extproc.tasks import Tasks

CHAT = "/v1/chat/completions"


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": text}], **extra}


class WordEmbedder:
    """Sum of one random direction per word: shared words → high cosine. ASCII only."""

    name, dim = "words", 64

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def can_read(self, text: str) -> bool:
        return text.isascii() and bool(text.strip())

    async def embed(self, text: str, meanwhile: Callable[[], object] | None = None) -> np.ndarray:
        self.calls += 1
        if self.fail:
            raise RuntimeError("embedder broke")
        if meanwhile is not None:
            meanwhile()
        v = np.zeros(self.dim, dtype=np.float32)
        for word in re.findall(r"\w+", text.lower()):
            seed = int(hashlib.sha256(word.encode()).hexdigest()[:8], 16)
            v += np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
        return (v / max(float(np.linalg.norm(v)), 1e-9)).astype(np.float32)


def cosine_decide(query: str, candidate: str, cosine: float, policy: Policy) -> Decision:
    return Decision(cosine >= 0.88, "semantic" if cosine >= 0.88 else "cosine", cosine)


def matcher(embedder: WordEmbedder | None = None) -> Matcher:
    point = LanguagePoint(min_cosine=0.6, verifier=None, threshold=0.5)  # type: ignore[arg-type]
    policy = Policy("words", languages={"en": point})
    return Matcher(
        embedder or WordEmbedder(), policy, Lsh.create(64, 4, 12, seed=1, name="words"), decide=cosine_decide
    )


def config(**extra: Any) -> CacheConfig:
    coalesce = CacheCoalesce(
        max_wait_s=extra.pop("max_wait_s", 3.0), lease_s=extra.pop("lease_s", 2.0), poll_ms=2, poll_max_ms=20
    )
    return CacheConfig(coalesce=coalesce, **extra)


@dataclass
class Upstream:
    """The model: answers after `delay`; the first `fail` calls get 500; `hang` never finishes."""

    delay: float = 0.0
    fail: int = 0
    status: int = 200
    tool_call: bool = False
    calls: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, payload: dict[str, Any]) -> tuple[int, dict[str, str], list[bytes]]:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.calls <= self.fail or self.status >= 400:
            return 500, {"content-type": "application/json"}, [b'{"error": {"message": "boom"}}']
        text = f"Answer {self.calls} to: {payload['messages'][-1]['content']}"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "stop"
        if self.tool_call:
            message, finish = (
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                "tool_calls",
            )
        if not payload.get("stream"):
            doc = {
                "id": "chatcmpl-up",
                "object": "chat.completion",
                "created": 1,
                "model": payload["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            }
            body = orjson.dumps(doc)
            return 200, {"content-type": "application/json"}, [body[:10], body[10:]]
        head = {
            "id": "chatcmpl-up",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": payload["model"],
        }
        frames = [
            {
                **head,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": w + " "}, "finish_reason": None}
                ],
            }
            for w in text.split()
        ]
        frames.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        raw = b"".join(b"data: " + orjson.dumps(f) + b"\n\n" for f in frames) + b"data: [DONE]\n\n"
        return 200, {"content-type": "text/event-stream"}, [raw[i : i + 37] for i in range(0, len(raw), 37)]


@dataclass
class Result:
    status: int
    headers: dict[str, str]
    body: bytes
    upstream: bool

    @property
    def cache(self) -> str | None:
        return self.headers.get("x-gate-cache")

    def text(self) -> str:
        if self.headers.get("content-type", "").startswith("text/event-stream"):
            chunks = [orjson.loads(f[6:]) for f in self.body.split(b"\n\n") if f.startswith(b"data: {")]
            return "".join(
                (c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c["choices"]
            ).strip()
        return str(orjson.loads(self.body)["choices"][0]["message"]["content"]).strip()


async def send(
    stage: Cache,
    payload: dict[str, Any],
    upstream: Upstream,
    headers: dict[str, str] | None = None,
    tenant: str = "acme",
    cancel_upstream: bool = False,
) -> Result:
    """One exchange, hook by hook, as server.py runs them (on_done always)."""
    ex = Exchange(
        "POST", CHAT, {"content-type": "application/json", **(headers or {})}, payload=payload, tenant=tenant
    )
    try:
        reply = await stage.on_request(ex)
        if reply is not None:
            out = {**reply.headers, **ex.client_headers}
            await stage.on_response(ex, reply.status, out)
            return Result(reply.status, out, reply.body, False)
        status, head, chunks = await upstream(payload)
        await stage.on_response(ex, status, head)
        if ex.capture_body:
            for chunk in chunks[:1] if cancel_upstream else chunks:
                await stage.on_response_body(ex, chunk, False)
            if not cancel_upstream:
                await stage.on_response_body(ex, b"", True)
        return Result(status, {**head, **ex.client_headers}, b"".join(chunks), True)
    finally:
        await stage.on_done(ex)
        # Until its answer is in the store: through the port, a client's next request comes a
        # round trip after the store call was sent.
        if stage.b.tasks is not None:
            await stage.b.tasks.wait(5.0, PUT_TASK)


def cache_stage(
    cfg: CacheConfig, store: Store, m: Matcher | None, *, profiles: Sequence[Profile] = (),
    client: aioredis.Redis | None = None, op_timeout_s: float = 0.5, hot: HotEntries | None = None,
) -> Cache:
    """The cache stage as `Cache.build` makes it, over the given store and matchers."""
    metrics = Metrics()
    tasks = Tasks(metrics)
    guard = StoreGuard(client, StoreConfig(op_timeout_ms=op_timeout_s * 1000), metrics, tasks)
    leases = Leases(store, guard, cfg.coalesce, metrics, tasks)
    backing = Backing(cfg, store, guard, leases, metrics, hot=hot, tasks=tasks)
    keeper = Keeper(backing)
    finder = Finder(backing, keeper, Matchers(m, list(profiles)), lambda ex: cfg.coalesce.max_wait_s)
    return Cache(backing, finder, keeper)
