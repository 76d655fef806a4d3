"""Which version of a model serves a caller: pure functions of the config and the caller.

A caller's key (tenant, user, model) hashes to a point in [0, 1); the versions cover the
interval in order, canary first, each as wide as its share. The same caller therefore
always lands on the same version, and raising the canary's share only moves callers from
stable to canary, never back: nobody flips between versions inside a conversation while
a rollout steps up.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from .settings import VersionedModel


@dataclass(frozen=True)
class Share:
    name: str
    pool: str
    share: float  # of the model's callers, in [0, 1]; a table's shares sum to 1
    canary: bool = False


def caller_key(tenant: str, user: str | None, model: str) -> str:
    return f"{tenant}\x00{user or ''}\x00{model}"


def point(key: str) -> float:
    """A stable, uniform point in [0, 1) for `key` (the same in every process and replica)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def choose_version(versions: Sequence[Share], key: str) -> Share:
    """The version whose stretch of [0, 1) holds the caller's point."""
    at = point(key)
    edge = 0.0
    chosen = None
    for version in versions:
        if version.share <= 0:
            continue
        chosen = version
        edge += version.share
        if at < edge:
            return version
    if chosen is None:
        raise ValueError("no version has a share above 0")
    return chosen  # rounding left the point past the last edge


def shares(
    model: VersionedModel, stable: str | None = None, canary_weight: float | None = None
) -> tuple[Share, ...]:
    """The model's table, canary first.

    `stable`: the version that takes every non-canary caller (the others get none; naming
    the canary gives it everyone). `canary_weight`: the canary's share in percent, the
    other versions splitting the rest by their configured weights. Without either, the
    configured weights, relative to their sum.
    """
    canary = model.canary
    if stable is not None and canary is not None and stable == canary.name:
        canary_weight = 100.0
    others = [v for v in model.versions if not v.canary]
    if stable is not None and model.named(stable) is not None:
        base = {v.name: (1.0 if v.name == stable else 0.0) for v in others}
    else:
        base = {v.name: v.weight for v in others}
    if canary is None:
        total = sum(base.values())
        return tuple(Share(v.name, v.pool, base[v.name] / total) for v in others)
    if canary_weight is None:
        total = sum(base.values()) + canary.weight
        canary_share = canary.weight / total if total > 0 else 1.0
    else:
        canary_share = min(max(canary_weight, 0.0), 100.0) / 100.0
    rest = 1.0 - canary_share
    base_total = sum(base.values())
    if base_total <= 0:  # every other version at 0: they split the rest evenly
        base = {name: 1.0 for name in base}
        base_total = float(len(base))
    if not others:
        canary_share, rest = 1.0, 0.0
    table = [Share(canary.name, canary.pool, canary_share, canary=True)]
    table += [Share(v.name, v.pool, rest * base[v.name] / base_total) for v in others]
    return tuple(table)
