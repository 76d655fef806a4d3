"""The stage interface: every hook is optional and returns a Reply to answer now.

A stage is built one way, `build(config, services)`: its config section plus the
process's services. It keeps no per-request state of its own (that lives in
`Exchange.state`), and states its failure policy: a stage that guards the gate
(`fail_closed`) answers a JSON 500 when it fails unexpectedly; the others are skipped for
that request and the request goes on. Apart from that, each stage declares what it does while
the shared store (Redis) is down (`store_down`); `extproc.policy` turns both into the table
the README shows, and a test holds every stage of `app.STAGES` to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

from ..exchange import Exchange, Reply

if TYPE_CHECKING:
    from ..config import Config
    from ..services import Services


STORE_DOWN = ("not used", "skipped", "skipped, or 503 where configured", "local state only",
              "own verdicts only")


class MissingPayloadError(RuntimeError):
    """A stage that needs the validated request found none: a bug upstream of it, met by the
    stage's failure policy (a fail-closed stage answers 500) rather than waved through."""


def payload_of(ex: Exchange) -> dict[str, Any]:
    if ex.payload is None:
        raise MissingPayloadError(f"no validated payload on {ex.route_path}")
    return ex.payload


def closed_when_store_down(path: str, tier: str, paths: Sequence[str], tiers: Sequence[str]) -> bool:
    """Whether a limit answers 503 (instead of being skipped) while the store is down."""
    return tier in tiers or any(path.startswith(p) for p in paths)


class Stage:
    name = "stage"
    fail_closed = False  # on its own unexpected error: 500 (True), or skipped for the request
    store_down = "not used"  # one of STORE_DOWN: what it does while the shared store is down

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
