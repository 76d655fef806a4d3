"""The antonym guard's fast reading agrees with its definition on any text."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.dedup.lexicon import ANTONYMS, _opposites_in, antonym_flip


def _has(text: str, term: str) -> bool:
    """The definition: an English term whole, between word boundaries; a Chinese one anywhere."""
    if term.isascii():
        return re.search(rf"\b{re.escape(term)}\b", text) is not None
    return term in text


def flip_by_definition(a: str, b: str) -> tuple[str, str] | None:
    for x, y in ANTONYMS:
        for p, q in ((x, y), (y, x)):
            if _has(a, p) and not _has(b, p) and _has(b, q) and not _has(a, q):
                return (p, q)
    return None


TERMS = [t for pair in ANTONYMS for t in pair]
PIECES = st.one_of(
    st.sampled_from(TERMS),
    st.sampled_from(["how", "do", "i", "my", "card", "the", "花呗", "怎么", "un", "s", "ed", "1", "_"]),
    st.text(alphabet="abcdefghij开关", max_size=4),
)
SEPARATORS = st.sampled_from([" ", "", "-", "'", ", ", "_", "?"])
TEXTS = st.lists(st.tuples(PIECES, SEPARATORS), max_size=8).map(
    lambda parts: "".join(p + s for p, s in parts)
)


@settings(max_examples=3000, deadline=None)
@given(TEXTS)
def test_a_text_holds_the_opposites_the_definition_finds(text: str) -> None:
    assert _opposites_in(text) == {t for t in TERMS if _has(text, t)}


@settings(max_examples=3000, deadline=None)
@given(TEXTS, TEXTS)
def test_the_flip_found_is_the_one_the_definition_finds(a: str, b: str) -> None:
    assert antonym_flip(a, b) == flip_by_definition(a, b)


def test_opposites_are_found_whole_words_only() -> None:
    assert antonym_flip("how do i enable dark mode", "how do i disable dark mode") is not None
    assert antonym_flip("how do i open an account", "how do i reopen an account") is None
    assert antonym_flip("怎么开通花呗", "怎么关闭花呗") is not None
