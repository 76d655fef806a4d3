"""The breaker's state machine and routing choice: pure functions of state, stats and time.

CLOSED ──(P95 > open_p95_s or errors > max_error_rate, ≥ min_samples, held ≥ hold_s)──> OPEN
OPEN ──(held ≥ hold_s)──> HALF_OPEN
HALF_OPEN ──(probes: P95 > open_p95_s or errors > bound, ≥ probe_min_samples)──> OPEN
HALF_OPEN ──(probes: P95 ≤ close_p95_s and errors ≤ bound for recovery_s)──> CLOSED

The stats handed in cover only the time since the state was entered, so the samples that
opened the breaker never count against the probes. CLOSED and OPEN are each held at least
`hold_s`: the bulk of the traffic never swaps pools faster than that.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from ..config import Breaker as Limits
from .window import Stats


class Phase(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


GAUGE = {Phase.CLOSED: 0, Phase.HALF_OPEN: 1, Phase.OPEN: 2}


@dataclass(frozen=True)
class BreakerState:
    phase: Phase = Phase.CLOSED
    since: float = 0.0  # wall-clock time the phase was entered (shared across replicas)
    version: int = 0  # +1 per transition; the compare-and-set token in Redis
    reason: str = "start"
    healthy_since: float | None = None  # HALF_OPEN only; local to each process


@dataclass(frozen=True)
class Evaluate:
    """The pool's window since `state.since`, merged over every process that shares it."""

    stats: Stats


def _too_slow(stats: Stats, limits: Limits) -> str | None:
    if stats.p95_s is not None and stats.p95_s > limits.open_p95_s:
        return f"p95 {stats.p95_s:.3f}s > {limits.open_p95_s:g}s"
    if stats.error_rate > limits.max_error_rate:
        return f"error rate {stats.error_rate:.1%} > {limits.max_error_rate:.1%}"
    return None


def _healthy(stats: Stats, limits: Limits) -> bool:
    p95_ok = stats.p95_s is None or stats.p95_s <= limits.close_p95_s
    return p95_ok and stats.error_rate <= limits.max_error_rate


def _enter(state: BreakerState, phase: Phase, now: float, reason: str) -> BreakerState:
    return BreakerState(phase, now, state.version + 1, reason)


def next_state(state: BreakerState, event: Evaluate, now: float, limits: Limits) -> BreakerState:
    stats, held = event.stats, now - state.since
    if state.phase is Phase.CLOSED:
        if held < limits.hold_s or stats.samples < limits.min_samples:
            return state
        reason = _too_slow(stats, limits)
        return state if reason is None else _enter(state, Phase.OPEN, now, reason)
    if state.phase is Phase.OPEN:
        if held < limits.hold_s:
            return state
        return _enter(state, Phase.HALF_OPEN, now, f"held open {held:.1f}s; probing")
    if stats.samples < limits.probe_min_samples:
        return state
    reason = _too_slow(stats, limits)
    if reason is not None:
        return _enter(state, Phase.OPEN, now, f"probes failed: {reason}")
    if not _healthy(stats, limits):
        return replace(state, healthy_since=None)
    healthy_since = state.healthy_since if state.healthy_since is not None else now
    if now - healthy_since >= limits.recovery_s:
        p95 = "n/a" if stats.p95_s is None else f"{stats.p95_s:.3f}s"
        return _enter(
            state, Phase.CLOSED, now, f"p95 {p95} ≤ {limits.close_p95_s:g}s for {limits.recovery_s:g}s"
        )
    return state if healthy_since == state.healthy_since else replace(state, healthy_since=healthy_since)


def is_probe(state: BreakerState, draw: float, now: float, last_probe: float, limits: Limits) -> bool:
    """HALF_OPEN: send this request to the primary? `draw` is uniform in [0, 1)."""
    if draw < limits.probe_share:
        return True
    interval = limits.probe_interval_s
    if interval is None:
        return False
    return last_probe < state.since or now - last_probe >= interval


def use_primary(state: BreakerState, draw: float, now: float, last_probe: float, limits: Limits) -> bool:
    if state.phase is Phase.CLOSED:
        return True
    if state.phase is Phase.OPEN:
        return False
    return is_probe(state, draw, now, last_probe, limits)
