"""Guardrail: personal data is redacted from the answers of the tenants listed in
`guardrail.tenants` (off for every other tenant), upstream answers and cache replays alike.

The stage puts a body filter on the exchange (`ex.body_filter`); the stream loop sends each
response chunk through it and on in its place, and cached answers replay through it. It fails
closed: an answer for a listed tenant that it cannot read (compressed, or neither JSON nor
SSE) or cannot check (its own error) is withheld, and the client gets a JSON 500 instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..cache.entry import content_kind
from ..config import Guardrail as GuardrailConfig
from ..exchange import Exchange, Reply
from ..metrics import Metrics
from ..safety.answer import AnswerFilter
from .base import Stage

if TYPE_CHECKING:
    from ..config import Config
    from ..services import Services

NAME = "guardrail"
REPLAYS = frozenset({"cache_hit", "coalesced"})  # answers the gate gives itself, from the cache


class UnreadableAnswerError(Exception):
    """An answer the redaction cannot read: it is withheld rather than sent unchecked."""


class Guardrail(Stage):
    name = NAME
    fail_closed = True  # an answer it could not check is withheld
    store_down = "not used"

    def __init__(self, config: GuardrailConfig, metrics: Metrics) -> None:
        self.tenants = frozenset(config.tenants)
        self.kinds = tuple(config.kinds)
        self.metrics = metrics

    @classmethod
    def build(cls, config: Config, services: Services) -> Guardrail:
        return cls(config.guardrail, services.metrics)

    def runs(self, hook: str) -> bool:
        return bool(self.tenants) and bool(self.kinds)

    async def on_headers(self, ex: Exchange) -> Reply | None:
        if ex.tenant in self.tenants:
            # A compressed answer could not be read: ask the model server for plain bytes.
            ex.upstream_remove.append("accept-encoding")
        return None

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        if ex.tenant not in self.tenants or not 200 <= status < 300:
            return
        source = "replay" if ex.decision in REPLAYS else "upstream"
        kind = content_kind(headers.get("content-type", ""))
        encoding = headers.get("content-encoding", "identity").lower()
        if kind is None or encoding != "identity":
            self.metrics.guardrail_answers.labels(source, "unreadable").inc()
            raise UnreadableAnswerError(f"{headers.get('content-type', 'no content-type')}, {encoding}")
        answer = AnswerFilter(kind, self.kinds)
        counter, answers = self.metrics.guardrail_redactions, self.metrics.guardrail_answers
        total = 0

        def feed(chunk: bytes, end: bool) -> bytes:
            nonlocal total
            out = answer.feed(chunk, end)
            for name, n in answer.counts.items():
                counter.labels(name).inc(n)
                total += n
            answer.counts.clear()
            if end:
                answers.labels(source, "redacted" if total else "clean").inc()
            return out

        ex.body_filter = feed
        ex.capture_body = True
