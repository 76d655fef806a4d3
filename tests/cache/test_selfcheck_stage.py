"""Self-calibration in the cache stage: a learning bin sends its candidates upstream and
compares answers, serves once its bound reaches the target, and stops when a check finds a
wrong answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError

from extproc.cache.bins import MemoryBins
from extproc.cache.selfcheck import SelfCheck
from extproc.cache.store import MemoryStore
from extproc.config import CacheSelfCheck
from extproc.dedup.decide import CurvePoint, Decision, Policy
from extproc.dedup.selfcheck import Counts
from extproc.stages.cache import Cache
from extproc.tasks import Tasks

from .helpers import cache_stage, chat, config, matcher, send


def loose(query: str, candidate: str, cosine: float, policy: Policy) -> Decision:
    """Every candidate above the floor is "the same question" with verifier score 0.85."""
    return Decision(cosine >= 0.6, "semantic", 0.85)


@dataclass
class FamilyModel:
    """The model's answer depends on the prompt's topic (its 4th word) only."""

    calls: int = 0
    topics: list[str] = field(default_factory=list)

    async def __call__(self, payload: dict[str, Any]) -> tuple[int, dict[str, str], list[bytes]]:
        self.calls += 1
        topic = payload["messages"][-1]["content"].split()[3]
        self.topics.append(topic)
        doc = {"id": "x", "object": "chat.completion", "created": 1, "model": payload["model"],
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": f"All about the {topic} policy."}}]}
        return 200, {"content-type": "application/json"}, [orjson.dumps(doc)]


@dataclass
class Draws:
    value: float = 0.9  # above the share: a serving bin serves

    def __call__(self) -> float:
        return self.value


def shipped_evidence(at_06: tuple[int, int], at_08: tuple[int, int]) -> tuple[CurvePoint, ...]:
    """A selection curve: (pairs, of them the same question) scored at or above 0.6 and 0.8."""
    return tuple(
        CurvePoint(threshold=t, precision=ok / n, recall=0.0, test_precision=0.0, test_recall=0.0,
                   test_hits=0, hits=n)
        for t, (n, ok) in ((0.6, at_06), (0.8, at_08))
    )


def stage_with_selfcheck(
    draws: Draws, bins: MemoryBins | None = None, curve: tuple[CurvePoint, ...] = (), target: float = 0.5
) -> tuple[Cache, SelfCheck, MemoryBins]:
    m = matcher()
    m.decide = loose
    m.policy.languages["en"] = replace(m.policy.languages["en"], curve=curve)
    stage = cache_stage(config(), MemoryStore(), m)
    share, warm = (0.1, 0.5) if curve else (0.5, 0.0)
    sc_cfg = CacheSelfCheck(enabled=True, share=share, warm_share=warm, target=target, min_checks=3,
                            bins=[0.6, 0.8])
    bins = bins or MemoryBins()
    b = stage.b
    b.selfcheck = SelfCheck(sc_cfg, bins, b.guard, b.metrics, Tasks(b.metrics), draw=draws)
    return stage, b.selfcheck, bins


def ask(topic: str, colour: str) -> dict[str, Any]:
    return chat(f"please explain the {topic} policy for {colour} orders")


async def settled(sc: SelfCheck) -> None:
    """The comparisons run after the client has its answer: wait for them."""
    for _ in range(1000):
        if not len(sc.tasks):
            return
        await asyncio.sleep(0.001)
    raise AssertionError("a comparison never finished")


async def test_a_learning_bin_checks_upstream_then_serves_once_its_bound_reaches_the_target() -> None:
    draws = Draws()
    stage, sc, bins = stage_with_selfcheck(draws)
    model = FamilyModel()
    first = await send(stage, ask("refund", "red"), model)
    assert (first.cache, first.upstream) == ("miss", True)
    for colour in ("blue", "green", "gray", "pink"):  # 4 of 4 agreeing: lower bound 0.51 >= 0.5
        r = await send(stage, ask("refund", colour), model)
        assert (r.cache, r.upstream) == ("check", True), colour  # the client gets the fresh answer
        assert r.text() == "All about the refund policy."
        await settled(sc)
    assert (await bins.counts("acme", "en", "0.80")).checks == 4
    served = await send(stage, ask("refund", "white"), model)
    assert (served.cache, served.upstream, served.headers["x-gate-cache-match"]) == ("hit", False, "semantic")
    assert served.text() == "All about the refund policy."
    assert model.calls == 5
    assert stage.b.metrics.selfcheck_checks.labels("en", "0.80", "agreed")._value.get() == 4
    assert stage.b.metrics.selfcheck_serving.labels("acme", "en", "0.80")._value.get() == 1
    assert stage.b.metrics.cache_requests.labels("check")._value.get() == 4


async def test_a_serving_bin_whose_check_finds_a_wrong_answer_stops_serving_at_once() -> None:
    draws = Draws()
    stage, sc, bins = stage_with_selfcheck(draws)
    model = FamilyModel()
    for colour in ("red", "blue", "green", "gray", "pink"):
        await send(stage, ask("refund", colour), model)
        await settled(sc)
    wrong = await send(stage, ask("shipping", "red"), model)  # another question, same bin: served wrong
    assert (wrong.cache, wrong.text()) == ("hit", "All about the refund policy.")
    draws.value = 0.1  # under the share: this candidate is checked
    caught = await send(stage, ask("shipping", "blue"), model)
    assert (caught.cache, caught.text()) == ("check", "All about the shipping policy.")
    await settled(sc)
    assert await bins.counts("acme", "en", "0.80") == Counts(5, 4)  # lower bound 0.38: under 0.5
    draws.value = 0.9  # a serving bin would serve now; this one learns again
    after = await send(stage, ask("refund", "white"), model)
    assert (after.cache, after.upstream) == ("check", True)
    again = await send(stage, ask("shipping", "red"), model)  # the wrong answer is not repeated either
    assert (again.cache, again.text()) == ("check", "All about the shipping policy.")
    assert stage.b.metrics.selfcheck_serving.labels("acme", "en", "0.80")._value.get() == 0


async def test_candidates_of_other_tenants_learn_in_their_own_bins() -> None:
    stage, sc, _ = stage_with_selfcheck(Draws())
    model = FamilyModel()
    for colour in ("red", "blue", "green", "gray", "pink"):
        await send(stage, ask("refund", colour), model)
        await settled(sc)
    await send(stage, ask("refund", "red"), model, tenant="globex")
    other = await send(stage, ask("refund", "white"), model, tenant="globex")
    assert (other.cache, other.upstream) == ("check", True)


async def test_near_exact_repeats_are_served_without_a_check() -> None:
    stage, _, _ = stage_with_selfcheck(Draws())
    model = FamilyModel()
    await send(stage, ask("refund", "red"), model)
    near = await send(stage, chat("Please explain the refund policy for red orders !"), model)
    assert (near.cache, near.headers["x-gate-cache-match"], near.upstream) == ("hit", "near", False)



async def test_a_bin_whose_shipped_evidence_meets_the_target_serves_from_its_first_candidate() -> None:
    """20 of 20 shipped pairs in the 0.80 bin prove the target (0.5); the bin starts with just
    enough of them (4 of 4, bound 0.51), serves at once, and checks `warm_share` (0.5) of its
    candidates, not `share` (0.1), until it has 3 live checks of its own."""
    draws = Draws(0.9)
    stage, sc, bins = stage_with_selfcheck(draws, curve=shipped_evidence((40, 30), (20, 20)))
    model = FamilyModel()
    await send(stage, ask("refund", "red"), model)
    served = await send(stage, ask("refund", "blue"), model)
    assert (served.cache, served.upstream) == ("hit", False)
    assert stage.b.metrics.selfcheck_serving.labels("acme", "en", "0.80")._value.get() == 1
    draws.value = 0.3  # under warm_share, over share
    for colour in ("green", "gray", "pink"):
        checked = await send(stage, ask("refund", colour), model)
        assert (checked.cache, checked.upstream) == ("check", True), colour
        await settled(sc)
    assert await bins.counts("acme", "en", "0.80") == Counts(3, 3)  # only live checks are stored
    after = await send(stage, ask("refund", "white"), model)  # 3 live checks: `share` from now on
    assert (after.cache, after.upstream) == ("hit", False)


async def test_one_wrong_live_check_pulls_a_bin_serving_on_its_prior_under_the_target() -> None:
    draws = Draws(0.9)
    stage, sc, _ = stage_with_selfcheck(draws, curve=shipped_evidence((40, 30), (20, 20)), target=0.7)
    model = FamilyModel()
    await send(stage, ask("refund", "red"), model)
    assert (await send(stage, ask("refund", "blue"), model)).cache == "hit"  # prior 9 of 9: bound 0.70
    draws.value = 0.1
    caught = await send(stage, ask("shipping", "red"), model)  # another question, checked
    assert (caught.cache, caught.text()) == ("check", "All about the shipping policy.")
    await settled(sc)
    draws.value = 0.9  # 9 of 10 (bound 0.60): learning again
    after = await send(stage, ask("refund", "white"), model)
    assert (after.cache, after.upstream) == ("check", True)
    assert stage.b.metrics.selfcheck_serving.labels("acme", "en", "0.80")._value.get() == 0


class UnreadableBins(MemoryBins):
    async def counts(self, tenant: str, language: str, bin: str) -> Counts:
        raise RedisConnectionError("store down")


async def test_counts_that_cannot_be_read_never_serve_whatever_the_prior() -> None:
    stage, _, _ = stage_with_selfcheck(
        Draws(0.9), bins=UnreadableBins(), curve=shipped_evidence((40, 30), (20, 20))
    )
    model = FamilyModel()
    await send(stage, ask("refund", "red"), model)
    r = await send(stage, ask("refund", "blue"), model)
    assert (r.cache, r.upstream) == ("check", True)
