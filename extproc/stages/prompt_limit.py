"""422 when the prompt has more tokens than the chosen pool accepts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..config import Routing
from ..errors import error_reply
from ..exchange import Exchange, Reply
from ..request import prompt_texts, token_array_count
from .base import Stage

if TYPE_CHECKING:
    from ..config import Config
    from ..services import Services


class Counter(Protocol):
    async def measure(self, texts: list[str], limit: int | None = None) -> int: ...


class PromptLimit(Stage):
    name = "prompt_limit"
    store_down = "not used"
    fail_closed = True

    def __init__(self, routing: Routing, default_limit: int, counter: Counter) -> None:
        self.routing = routing
        self.default_limit = default_limit
        self.counter = counter

    @classmethod
    def build(cls, config: Config, services: Services) -> PromptLimit:
        return cls(config.routing, config.validation.max_prompt_tokens, services.tokens)

    async def on_request(self, ex: Exchange) -> Reply | None:
        assert ex.payload is not None and ex.pool is not None
        limit = self.routing.pools[ex.pool].max_prompt_tokens or self.default_limit
        ex.prompt_tokens = await self.counter.measure(prompt_texts(ex.payload), limit)
        ex.prompt_tokens += token_array_count(ex.payload)
        if ex.prompt_tokens <= limit:
            return None
        return error_reply(
            422,
            f"This prompt has about {ex.prompt_tokens} tokens; the limit for pool '{ex.pool}' "
            f"is {limit}. Shorten the messages or split the request.",
            param="messages" if "messages" in ex.payload else "prompt",
            code="context_length_exceeded",
        )
