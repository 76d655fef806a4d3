"""collapse_spaces is str.split + join, character for character, for any text."""

from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.textform import ASCII_SPACES, WIDE_SPACES, collapse_spaces

SPACES = ASCII_SPACES + WIDE_SPACES
# Text dense in whitespace of every kind, next to ASCII, accented, CJK, emoji and lone surrogates.
DENSE = st.text(alphabet=st.sampled_from([*SPACES, "a", "Z", "é", "ß", "中", "😀", "\ud800", "-"]))


def test_the_lists_hold_exactly_the_whitespace_str_split_knows() -> None:
    every = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    assert set(SPACES) == every
    assert len(SPACES) == len(every)


@settings(max_examples=500)
@given(st.one_of(st.text(), DENSE))
def test_collapse_is_split_and_join(text: str) -> None:
    assert collapse_spaces(text) == " ".join(text.split())


def test_a_big_prompt_collapses_the_same() -> None:
    ascii_doc = "Line one\tof\r\n  the doc\x1c\x1f  " * 20_000
    mixed = ascii_doc + "caf\u00e9\u3000\u3000中文\u2028 end\xa0"
    long_run = "a" + " " * 100_000 + "b\n" + "\t" * 70_000
    for text in (ascii_doc, mixed, long_run, " " * 1000, ""):
        assert collapse_spaces(text) == " ".join(text.split())
