"""The token-states cache keeps the most recently used texts within its byte budget."""

from __future__ import annotations

import numpy as np

from extproc.embed.token_states import TokenStates, TokenStatesCache


def states(rows: int, dim: int = 8) -> TokenStates:
    return TokenStates(tuple(f"p{i}" for i in range(rows)), np.ones((rows, dim), dtype=np.float32))


def test_the_least_recently_used_go_first_when_the_budget_is_spent() -> None:
    one = states(4).nbytes
    cache = TokenStatesCache(budget_bytes=3 * one)
    for text in ("a", "b", "c"):
        cache.put(text, states(4))
    assert cache.get("a") is not None  # "a" used again: "b" is now the oldest
    cache.put("d", states(4))
    assert "b" not in cache and all(t in cache for t in "acd")
    assert cache.bytes <= cache.budget_bytes and len(cache) == 3


def test_a_text_put_twice_is_counted_once_and_one_over_the_budget_is_not_kept() -> None:
    cache = TokenStatesCache(budget_bytes=states(4).nbytes * 2)
    cache.put("a", states(4))
    cache.put("a", states(4))
    assert cache.bytes == states(4).nbytes
    cache.put("huge", states(100))
    assert "huge" not in cache and "a" in cache
    assert cache.get("missing") is None and (cache.hits, cache.misses) == (0, 1)
