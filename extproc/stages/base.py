"""The stage interface: every hook is optional and returns a Reply to answer now."""

from __future__ import annotations

from ..exchange import Exchange, Reply


class Stage:
    name = "stage"

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

    async def aclose(self) -> None:
        """The pipeline is retired (a config reload): stop background work, close clients."""
        return None
