from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from extproc.dedup import canonical
from extproc.dedup.guards import negations

SAME = [
    ("Hello,  World!", "hello world"),
    ("ＨＥＬＬＯ　ｗｏｒｌｄ！", "hello world"),
    ("花呗 怎么 还款？", "花呗怎么还款?"),
    ("怎么开通花呗。", "怎么开通花呗"),
    ("“quoted” text", '"quoted" text'),
    ("It’s raining.", "it's raining"),
    ("  leading and trailing  \n\n", "leading and trailing"),
]
DIFFERENT = [
    ("Is it 3.5?", "Is it 35?"),
    ("x² + 1", "x2 + 1"),
    ("1,000 yuan", "1000 yuan"),  # kept apart: a miss, never a wrong merge
    ("-5 degrees", "5 degrees"),
    ("5% off", "5 off"),
    ("1/2 cup", "12 cup"),
    ("C# tutorial", "C tutorial"),
    ("it's raining?", "it's raining"),
    ("we'll go", "well go"),
    ("for x in y:\n    a\n    b", "for x in y:\n    a\nb"),
    ("10:30 meeting", "1030 meeting"),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_same(a: str, b: str) -> None:
    assert canonical(a) == canonical(b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different(a: str, b: str) -> None:
    assert canonical(a) != canonical(b)


text = st.text(st.characters(exclude_categories=["Cs"]), max_size=80)
words = st.lists(
    st.sampled_from(["how", "do", "I", "3.5", "100", "花呗", "不", "not", "?", "！", "，", "ok.", "x²"]),
    max_size=10,
)


@given(text)
@example(".·")  # dropping the CJK mark put the full stop at the end
def test_idempotent(t: str) -> None:
    assert canonical(canonical(t)) == canonical(t)


@given(text)
def test_keeps_every_digit(t: str) -> None:
    def digits(s: str) -> list[str]:
        return re.findall(r"\d", unicodedata.normalize("NFKC", s))

    assert digits(canonical(t)) == digits(t) or any(
        unicodedata.decomposition(c).startswith(("<super>", "<sub>", "<fraction>")) for c in t
    )


@given(words, st.sampled_from([" ", "  ", "\t", "\u3000"]))
def test_spacing_and_case_do_not_matter(ws: list[str], sep: str) -> None:
    a = " ".join(ws)
    assert canonical(sep.join(ws).upper()) == canonical(a.upper())


@given(words)
def test_keeps_negation(ws: list[str]) -> None:
    t = " ".join(ws)
    assert negations(canonical(t)) == negations(t)
