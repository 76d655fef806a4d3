"""The in-process store's LSH bands and candidates against their definition, on random puts."""

from __future__ import annotations

import asyncio
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.cache.store import MemoryStore, Put

S = "scope"


class Definition:
    """Each band: add the key, forget the expired, keep the `cap` that expire last (ties: the
    greater key stays). Candidates: live keys by the number of the query's bands they share,
    then by key."""

    def __init__(self) -> None:
        self.bands: dict[str, dict[str, float]] = {}
        self.expiry: dict[str, float] = {}
        self.where: dict[str, tuple[str, ...]] = {}

    def put(self, key: str, bands: tuple[str, ...], expiry: float, cap: int, now: float) -> None:
        for band in self.where.pop(key, ()):
            self.bands.get(band, {}).pop(key, None)
        self.expiry[key], self.where[key] = expiry, bands
        for band in bands:
            members = self.bands.setdefault(band, {})
            members[key] = expiry
            for old in [k for k, exp in members.items() if exp <= now]:
                del members[old]
            for old in sorted(members, key=lambda k: (members[k], k))[: max(len(members) - cap, 0)]:
                del members[old]

    def candidates(self, bands: list[str], limit: int, now: float) -> list[str]:
        votes = Counter(k for b in bands for k, exp in self.bands.get(b, {}).items() if exp > now)
        return sorted(votes, key=lambda k: (-votes[k], k))[:limit]


OPS = st.lists(
    st.tuples(
        st.integers(0, 40),  # key
        st.sets(st.integers(0, 11), min_size=1, max_size=4),  # bands
        st.integers(1, 30),  # ttl, s
        st.integers(1, 12),  # band cap
        st.floats(0, 3),  # seconds since the last put
        st.sets(st.integers(0, 11), min_size=1, max_size=5),  # a query's bands
        st.integers(1, 10),  # its candidate limit
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_bands_and_candidates_follow_their_definition(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    now = [0.0]
    store, model = MemoryStore(clock=lambda: now[0]), Definition()

    async def run() -> None:
        for key, bands, ttl, cap, pause, query, limit in ops:
            now[0] += pause
            names = tuple(f"b{b}" for b in sorted(bands))
            await store.put(Put(S, f"k{key}", b"e", ttl * 1000, 1000, "t", "m", b"v", names, band_cap=cap))
            model.put(f"k{key}", names, now[0] + ttl, cap, now[0])
            asked = [f"b{b}" for b in sorted(query)]
            found = await store.candidates(S, asked, limit)
            assert [k for k, _ in found] == model.candidates(asked, limit, now[0])

    asyncio.run(run())
