"""The cancellation drill, small: clients that give up at random points wedge no question."""

from __future__ import annotations

import asyncio

from load.drill_cancel import drill
from load.stack import Stack


def test_cancelled_requests_leave_no_question_wedged_and_no_lease() -> None:
    with Stack(gate_workers=2, with_redis=True) as stack:
        result = asyncio.run(drill(stack, requests=240, questions=3, concurrency=24, seed=7))
    assert result.cancelled >= 200, result.early  # the drill really cancelled requests mid-way
    assert set(result.later_status) == {200}
    assert max(result.later_s) < 1.0, result.later_s
    assert result.leases_left == 0
