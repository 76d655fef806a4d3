"""Progressive delivery as a pure function: `next_rollout(state, canary, stable, now, cfg)`.

The canary's weight steps through `cfg.steps`, each held `hold_s`, and goes on only while,
over the same window of the current step, the canary's error rate and P95 stay within the
configured margins of the stable version's. A canary found worse goes to 0 at once
(`rolled_back`), and stays there until an operator starts it again. Reaching the last
step ends the rollout (`done`). `manual` is a weight an operator set: nothing steps it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..breaker.window import Stats
from .settings import Rollout, RolloutPhase


@dataclass(frozen=True)
class RolloutState:
    canary: str  # the version it is about: a state for another canary is stale
    phase: RolloutPhase
    weight: float  # the canary's share in force, percent
    step: int  # index into steps while rolling
    since: float  # wall-clock start of this step (the compared window starts here)
    version: int  # bumped by every change; writes are compare-and-set on it
    reason: str = ""


def begin(canary: str, cfg: Rollout, now: float, version: int = 0) -> RolloutState:
    return RolloutState(canary, "rolling", cfg.steps[0], 0, now, version, f"step 1 of {len(cfg.steps)}")


def worse(canary: Stats, stable: Stats, cfg: Rollout) -> str | None:
    """Why the canary is worse than stable over the same window; None while it is not (or
    while it has too few calls to say)."""
    if canary.samples < cfg.min_samples:
        return None
    if canary.error_rate > stable.error_rate + cfg.max_error_rate_increase:
        return f"error rate {canary.error_rate:.1%} vs stable {stable.error_rate:.1%}"
    if canary.p95_s is not None and stable.p95_s is not None and stable.samples >= cfg.min_samples:
        limit = stable.p95_s * cfg.max_p95_ratio + cfg.p95_slack_s
        if canary.p95_s > limit:
            return f"P95 {canary.p95_s:.3f}s vs stable {stable.p95_s:.3f}s (limit {limit:.3f}s)"
    return None


def next_rollout(state: RolloutState, canary: Stats, stable: Stats, now: float, cfg: Rollout) -> RolloutState:
    """The state after one look at the window; the same object when nothing changes."""
    if state.phase != "rolling":
        return state
    why = worse(canary, stable, cfg)
    if why is not None:
        return replace(state, phase="rolled_back", weight=0.0, since=now, version=state.version + 1,
                       reason=f"rolled back at {state.weight:g}%: {why}")
    if now - state.since < cfg.hold_s or canary.samples < cfg.min_samples:
        return state
    step = min(state.step + 1, len(cfg.steps) - 1)
    last = step == len(cfg.steps) - 1
    return replace(
        state,
        phase="done" if last else "rolling",
        weight=cfg.steps[step],
        step=step,
        since=now,
        version=state.version + 1,
        reason=f"step {step + 1} of {len(cfg.steps)}" + (": rollout complete" if last else ""),
    )
