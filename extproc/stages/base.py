"""The stage interface: every hook is optional and returns a Reply to answer now.

A stage is built one way, `build(config, services)`: its config section plus the
process's services. It keeps no per-request state of its own (that lives in
`Exchange.state`), and states its failure policy: a stage that guards the gate
(`fail_closed`) answers a JSON 500 when it fails unexpectedly; the others are skipped for
that request and the request goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from ..exchange import Exchange, Reply

if TYPE_CHECKING:
    from ..config import Config
    from ..services import Services


class Stage:
    name = "stage"
    fail_closed = False

    @classmethod
    def build(cls, config: Config, services: Services) -> Self:
        raise TypeError(f"{cls.__name__} does not say how it is built")

    def runs(self, hook: str) -> bool:
        """Whether `hook` (e.g. "on_request") can do anything under this stage's config. The
        pipeline never calls, nor times, one that cannot; a config change builds a new pipeline."""
        return True

    async def on_headers(self, ex: Exchange) -> Reply | None:
        """Request headers are in; the body is not."""
        return None

    async def on_request(self, ex: Exchange) -> Reply | None:
        """The whole request is in (`ex.body`, and `ex.payload` after validation)."""
        return None

    async def on_response(self, ex: Exchange, status: int, headers: dict[str, str]) -> None:
        """Upstream response headers arrived (or the gate answered itself).

        Set `ex.capture_body = True` here to see the response body chunk by chunk.
        """
        return None

    async def on_response_body(self, ex: Exchange, chunk: bytes, end: bool) -> None:
        """A chunk of the upstream response body (only when some stage asked for it)."""
        return None

    async def on_done(self, ex: Exchange) -> None:
        """The exchange ended, however it ended: release what the stage holds."""
        return None
