"""Screen: each user message's embedding through a small head, newest first; per tenant
`off`, `monitor` (forwarded, flagged in `x-gate-screen` and a metric) or `block` (400
`prompt_injection`, nothing forwarded). Earlier turns were screened when they were new: a
conversation pays one embedding per turn. The embedder down or past its time budget: a
`monitor` tenant is forwarded unscreened (counted); a `block` tenant gets a retryable 503,
since a protection that turns itself off under load would be no protection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import Screen as ScreenConfig
from ..errors import SHOULD_RETRY, error_reply
from ..exchange import EMBEDDED, Exchange, Reply
from ..metrics import Metrics
from ..request import screened_texts, token_array_count
from ..safety.screen import EMBEDDER
from ..safety.screener import Screener
from .base import Stage, payload_of

if TYPE_CHECKING:
    from ..cache.semantic import AsyncEmbedder
    from ..cache.setup import Matchers
    from ..config import Config
    from ..services import Services

SCREEN_HEADER = "x-gate-screen"


class Screen(Stage):
    name = "screen"
    fail_closed = False  # a screen that breaks is skipped and counted (block tenants: see above)
    store_down = "own verdicts only"  # verdicts shared through the store when it is up

    def __init__(
        self, config: ScreenConfig, screener: Screener | None, metrics: Metrics,
        matchers: Matchers | None = None,
    ) -> None:
        self.config = config
        self.screener = screener
        self.metrics = metrics
        self.matchers = matchers  # the semantic cache's: its embedder serves both when it is the same model

    @classmethod
    def build(cls, config: Config, services: Services) -> Screen:
        return cls(config.screen, services.screener, services.metrics, services.matchers)

    def _shared(self, ex: Exchange) -> AsyncEmbedder | None:
        m = self.matchers.for_request(ex.tenant, ex.route_path) if self.matchers is not None else None
        return m.embedder if m is not None and m.embedder.name == EMBEDDER else None

    def runs(self, hook: str) -> bool:
        return self.screener is not None and self.config.enabled

    def threshold(self, ex: Exchange) -> float:
        """Stricter for an elevated-risk key, then the tier's, then the configured or trained one."""
        assert self.screener is not None
        c = self.config
        if ex.risk == "elevated" and c.elevated_threshold is not None:
            return c.elevated_threshold
        tier = next((v for t, v in c.tier_thresholds.items() if t == ex.tier), None)
        return tier if tier is not None else self.screener.threshold

    def texts(self, payload: dict[str, Any]) -> list[str]:
        """The newest `max_messages` texts; the older ones this process has screened (their
        scores are in its memo); and, as one text, the older ones it has not. A conversation
        that grew turn by turn has none of the last (each text was the newest once), and a
        history written all at once cannot hide an injection further back than the cap."""
        assert self.screener is not None
        texts = [t for t in screened_texts(payload) if t.strip()]
        cap = self.config.max_messages
        known: list[str] = []
        unseen: list[str] = []
        for t in texts[cap:]:
            (known if self.screener.known(t) else unseen).append(t)
        return texts[:cap] + known + (["\n\n".join(reversed(unseen))] if unseen else [])

    def unchecked(self, ex: Exchange, mode: str, why: str) -> Reply | None:
        """A request the screen could not check: forwarded for `monitor` (counted `skipped`),
        refused for `block` (counted `why`), whose screen must not be off for want of a check."""
        if mode != "block":
            self.metrics.screen_verdicts.labels(mode, "skipped").inc()
            return None
        self.metrics.screen_verdicts.labels(mode, why).inc()
        if why == "unreadable":
            return error_reply(
                400,
                "This tenant's prompts are screened for prompt injection, and a prompt sent as token "
                f"ids cannot be screened: send it as text. Request id {ex.request_id}.",
                param="prompt",
                code="unscreenable_prompt",
                headers={SHOULD_RETRY: "false"},
                decision="screen_unreadable",
            )
        return error_reply(
            503,
            "The gate's prompt screen could not check this request in time, and this tenant "
            f"requires it. Retry shortly; request id {ex.request_id}.",
            type="service_unavailable",
            code="screen_unavailable",
            headers={"retry-after": "1"},
            decision="screen_unavailable",
        )

    async def on_request(self, ex: Exchange) -> Reply | None:
        mode = self.config.mode_for(ex.tenant, ex.route_path)
        payload = payload_of(ex)
        if mode == "off" or self.screener is None:
            return None
        if token_array_count(payload):  # token ids: unreadable without the model's own tokenizer
            return self.unchecked(ex, mode, "unreadable")
        threshold = self.threshold(ex)
        score = 0.0
        shared = self._shared(ex)
        for i, text in enumerate(self.texts(payload)):
            try:
                score, vector = await self.screener.score(text, shared)
            except Exception:  # the embedder is down, shed or late
                return self.unchecked(ex, mode, "unavailable")
            if i == 0 and vector is not None and shared is not None:
                ex.state[EMBEDDED] = (shared, text, vector)  # the cache's semantic lookup reuses it
            if score > threshold:
                break
        flagged = score > threshold
        self.metrics.screen_verdicts.labels(mode, "flagged" if flagged else "pass").inc()
        if not flagged:
            return None
        ex.state[self.name] = round(score, 4)
        if mode == "monitor":
            ex.client_headers[SCREEN_HEADER] = "flagged"
            return None
        ex.client_headers[SCREEN_HEADER] = "blocked"
        return error_reply(
            400,
            "The request was refused: the gate's screen judged the last message a prompt-injection "
            f"or jailbreak attempt. If this is a mistake, give the operator request id {ex.request_id}.",
            code="prompt_injection",
            headers={SHOULD_RETRY: "false"},
            decision="screen_block",
        )
