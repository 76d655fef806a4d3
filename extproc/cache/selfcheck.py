"""Self-calibration's I/O shell: read a candidate's bin, decide serve or check, and once a
check's fresh answer is complete, compare it with the cached one and count the outcome.

The decisions are `extproc.dedup.selfcheck`; the counts live in a `BinStore` shared by every
replica, and each bin's prior comes from the matcher's shipped curve (the same on every
replica). Every store call goes through the store guard within the cache's budget: a bin
whose counts cannot be read is treated as learning (its candidate goes upstream), never as
serving, whatever its prior.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from ..config import CacheSelfCheck
from ..dedup.decide import Policy
from ..dedup.lang import language
from ..dedup.selfcheck import Counts, Verdict, action, agree, bin_of, prior, same_text, share_of, verdict
from ..metrics import Metrics
from ..redis_conn import StoreGuard
from ..tasks import Tasks
from .bins import BinStore
from .entry import Entry, chunks_text, json_text
from .semantic import AsyncEmbedder, Matcher

CHECK_HEADER_VALUE = "check"


@dataclass(frozen=True)
class Check:
    """A semantic candidate sent upstream to be compared: where its outcome is counted."""

    tenant: str
    language: str
    bin: str
    cached: str  # the cached candidate's answer text
    embedder: AsyncEmbedder
    token: str
    target: float = 0.95
    prior: Counts = field(default_factory=Counts)  # the bin's prior, added to its live counts


def open_policy(policy: Policy, floor: float) -> Policy:
    """Every calibrated language considered down to the bins' floor: live checks, not the static
    operating point, decide which scores serve."""
    langs = {lang: replace(point, threshold=floor) for lang, point in policy.languages.items()}
    return replace(policy, languages=langs)


def priors(policy: Policy, config: CacheSelfCheck, target: float) -> dict[str, dict[str, Counts]]:
    """Per language, the bins whose selection evidence (the policy's curve) proves ``target``,
    each with its just-enough prior; none at all with ``prior`` off."""
    if not config.prior:
        return {}
    return {
        lang: prior(
            [(c.threshold, c.hits, round(c.precision * c.hits)) for c in point.curve],
            config.bins, target, config.min_checks,
        )
        for lang, point in policy.languages.items()
    }


def answer_text(kind: str, body: str, events: tuple[tuple[float, str], ...]) -> str:
    """The answer's text in a stored (or captured) JSON body or SSE events."""
    try:
        if kind == "json":
            return json_text(orjson.loads(body))
        chunks = [orjson.loads(data) for _, data in events if data.startswith("{")]
        return chunks_text(chunks)
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return ""


class SelfCheck:
    def __init__(
        self, config: CacheSelfCheck, bins: BinStore, guard: StoreGuard, metrics: Metrics, tasks: Tasks,
        *, budget_s: float | None = None, draw: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.target = config.target  # None: the matcher's own precision target
        self.bins = bins
        self.guard = guard
        self.metrics = metrics
        self.tasks = tasks
        self.budget_s = budget_s
        self.draw = draw
        self._priors: dict[tuple[int, float], dict[str, dict[str, Counts]]] = {}  # by policy id, target

    async def judge(
        self, tenant: str, query: str, entry: Entry | None, score: float, matcher: Matcher
    ) -> Check | None:
        """None: serve the candidate. A Check: send the request upstream and compare (with
        nothing when the candidate is a request still in flight: `entry` None)."""
        lang, name, embedder = language(query), bin_of(score, self.config.bins), matcher.embedder
        if name is None:  # under the floor (the matcher's own threshold): never served
            return Check(tenant, lang, "", "", embedder, "")
        target = self.target if self.target is not None else matcher.policy.target
        start = self.prior_of(matcher.policy, target, lang, name)
        read = self.bins.counts(tenant, lang, name)
        live = await self.guard.run(read, None, "selfcheck_read", self.budget_s)
        v: Verdict = "learn"  # counts that cannot be read never serve, whatever the prior
        if live is not None:
            v = self._observe(tenant, lang, name, live + start, target)
        c = self.config
        act = action(v, share_of(live or Counts(), start, c.share, c.warm_share, c.min_checks), self.draw())
        self.metrics.selfcheck_candidates.labels(lang, name, act).inc()
        if act == "serve":
            return None
        cached = answer_text(entry.kind, entry.body, entry.events) if entry is not None else ""
        return Check(tenant, lang, name, cached, embedder, uuid.uuid4().hex, target, start)

    def prior_of(self, policy: Policy, target: float, lang: str, name: str) -> Counts:
        key = (id(policy), target)
        if key not in self._priors:
            self._priors[key] = priors(policy, self.config, target)
        return self._priors[key].get(lang, {}).get(name, Counts())

    def compare(self, check: Check, kind: str, body: str, events: tuple[tuple[float, str], ...]) -> None:
        """Off the response path: the client already has the fresh answer."""
        if check.bin and check.cached:
            self.tasks.spawn(self._compare(check, answer_text(kind, body, events)), "selfcheck_compare")

    async def _compare(self, check: Check, fresh: str) -> None:
        threshold = self.config.answer_similarity
        agreed = same_text(check.cached, fresh) or agree(await self._cosine(check, fresh), threshold)
        outcome = "agreed" if agreed else "differed"
        self.metrics.selfcheck_checks.labels(check.language, check.bin, outcome).inc()
        record = self.bins.record(check.tenant, check.language, check.bin, agreed, check.token)
        counts = await self.guard.run(record, None, "selfcheck_record", self.budget_s)
        if counts is not None:
            self._observe(check.tenant, check.language, check.bin, counts + check.prior, check.target)

    async def _cosine(self, check: Check, fresh: str) -> float | None:
        e = check.embedder
        if not fresh or not (e.can_read(check.cached) and e.can_read(fresh)):
            return None
        try:
            a, b = await e.embed(check.cached), await e.embed(fresh)
        except Exception:
            return None
        return float(np.dot(a, b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-9))

    def _observe(self, tenant: str, lang: str, name: str, counts: Counts, target: float) -> Verdict:
        """The bin's verdict on `counts`, published as its gauges."""
        v = verdict(counts, target, self.config.min_checks)
        self.metrics.selfcheck_lower.labels(tenant, lang, name).set(counts.lower)
        self.metrics.selfcheck_serving.labels(tenant, lang, name).set(1.0 if v == "serve" else 0.0)
        return v


def make_bins(redis: Any, prefix: str) -> BinStore:
    from .bins import MemoryBins, RedisBins

    return MemoryBins() if redis is None else RedisBins(redis, prefix)
