"""The process's traffic overrides and the version table each model is routed by.

Lives as long as the process (a config reload keeps it), so a new pipeline routes by the
same weights as the one it replaces. Three layers, the later winning: the configured
weights, the etcd overlay (`/models/{model}/version` and `/traffic`), and the state the
gates share in Redis (a rollout's step, or a weight set with `llm-gate versions`).
Only plain assignments happen here; the sources do their I/O elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .choose import Share, shares
from .rollout import RolloutState
from .settings import VersionedModel


@dataclass(frozen=True)
class Override:
    """One model's etcd keys: the stable version's name and the canary's share (percent)."""

    stable: str | None = None
    traffic: float | None = None


Published = Callable[[str, tuple[Share, ...]], None]


@dataclass
class Traffic:
    etcd: dict[str, Override] = field(default_factory=dict)
    shared: dict[str, RolloutState] = field(default_factory=dict)
    generation: int = 0
    # Called with every newly computed table (the metrics' per-version share gauges).
    published: Published | None = None
    _tables: dict[str, tuple[int, VersionedModel, tuple[Share, ...]]] = field(default_factory=dict)

    def set_etcd(self, overrides: dict[str, Override]) -> None:
        """Every model's etcd keys at once (the overlay is replaced whole, never merged)."""
        if overrides != self.etcd:
            self.etcd = dict(overrides)
            self.generation += 1

    def set_shared(self, model: str, state: RolloutState | None) -> None:
        if self.shared.get(model) != state:
            if state is None:
                self.shared.pop(model, None)
            else:
                self.shared[model] = state
            self.generation += 1

    def table(self, name: str, model: VersionedModel) -> tuple[Share, ...]:
        """The model's versions and shares now (recomputed only after a change)."""
        memo = self._tables.get(name)
        if memo is not None and memo[0] == self.generation and memo[1] is model:
            return memo[2]
        override = self.etcd.get(name, Override())
        weight = override.traffic
        state = self.shared.get(name)
        canary = model.canary
        if state is not None and canary is not None and state.canary == canary.name:
            weight = state.weight
        stable = override.stable if override.stable and model.named(override.stable) else None
        table = shares(model, stable, weight)
        self._tables[name] = (self.generation, model, table)
        if self.published is not None:
            self.published(name, table)
        return table
