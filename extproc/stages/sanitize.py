"""Sanitize: hidden characters leave the prompt before the cache key and the model see it.

Modes (`sanitize.mode`): `strip` (default) removes them and rewrites the body sent on;
`reject` answers 400 `hidden_characters`; `off` leaves the text alone. Each hidden
character is counted by kind; the text itself is never logged.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ..errors import error_reply
from ..exchange import Exchange, Reply
from ..metrics import Metrics
from ..request import text_slots
from ..safety.sanitize import has_candidates, sanitize
from .base import Stage, payload_of

if TYPE_CHECKING:
    from ..config import Config
    from ..services import Services


class Sanitize(Stage):
    name = "sanitize"
    fail_closed = True  # a prompt that could not be checked must not reach the model unchecked
    store_down = "not used"

    def __init__(self, mode: str, metrics: Metrics) -> None:
        self.mode = mode
        self.metrics = metrics

    @classmethod
    def build(cls, config: Config, services: Services) -> Sanitize:
        return cls(config.sanitize.mode, services.metrics)

    def runs(self, hook: str) -> bool:
        return self.mode != "off"

    async def on_request(self, ex: Exchange) -> Reply | None:
        payload = payload_of(ex)
        found: Counter[str] = Counter()
        first: str | None = None
        for container, key, path in text_slots(payload):
            text = container[key]
            if not has_candidates(text):
                continue
            clean, removed = sanitize(text)
            if not removed:
                continue
            found.update(removed)
            first = first or path
            if self.mode == "strip":
                container[key] = clean
        if not found:
            return None
        for kind, n in found.items():
            self.metrics.sanitized_chars.labels(kind).inc(n)
        if self.mode == "reject":
            self.metrics.sanitized_requests.labels("rejected").inc()
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(found.items()))
            return error_reply(
                400,
                f"The prompt contains hidden characters ({kinds}; first in {first}). Invisible, "
                "bidirectional and control characters are not accepted here: remove them and retry.",
                param=first,
                code="hidden_characters",
            )
        self.metrics.sanitized_requests.labels("stripped").inc()
        ex.payload_changed = True
        return None
