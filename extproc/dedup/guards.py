"""Guards: cheap pure checks that veto a semantic match a cosine cannot see.

Each guard takes two prompts and says whether they differ in something that changes the
answer: a negation, a number or amount, a date, an id, a named entity, or one content word
swapped for another in otherwise identical text. A guard may refuse a true paraphrase (a miss
costs a model call); it must not let a different question through.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache

from .canonical import canonical
from .lexicon import AUXILIARIES, SYNONYMS, antonym_flip, expand_contractions, zh_synonyms

# --------------------------------------------------------------------------- negation

_EN_NEG = re.compile(
    r"\b(?:not|no|never|none|nobody|nothing|nowhere|neither|nor|without|cannot|"
    r"can't|won't|don't|doesn't|didn't|isn't|aren't|wasn't|weren't|shouldn't|wouldn't|"
    r"couldn't|mustn't|hasn't|haven't|hadn't|unable|fail|fails|failed)\b|n't\b"
)
# A-not-A questions (能不能, 是不是, 有没有) ask, they do not negate; fixed words are not negations.
_ZH_ANOTA = re.compile(r"([\u4e00-\u9fff])[不没]\1")
_ZH_FIXED = re.compile(
    r"不过|不错|不同|不少|不断|不仅|不管|不久|差不多|不了解|对不起|了不起|不知道|要不|不然"
)
_ZH_NEG = re.compile(r"没有|没|不|无法|无|未|别|非|莫|勿|否")
_ZH_TAG_QUESTION = re.compile(r"(?:没有|没|不|否)(?=\s*(?:[吗呢啊呀?？,，。.!！]|$))")


def negations(text: str) -> int:
    t = canonical(text)
    zh = _ZH_TAG_QUESTION.sub("", _ZH_FIXED.sub("", _ZH_ANOTA.sub("", t)))
    return len(_EN_NEG.findall(t)) + len(_ZH_NEG.findall(zh))


# --------------------------------------------------------------------------- numbers

_EN_NUMS: dict[str, float] = {
    w: i
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}
_EN_NUMS |= {
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    "hundred": 100,
    "thousand": 1000,
    "million": 10**6,
    "billion": 10**9,
    "dozen": 12,
    "half": 0.5,
    "twice": 2,
    "double": 2,
    "triple": 3,
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "once": 1,
}
_ZH_DIGIT = {
    "零": 0,
    "〇": 0,
    "一": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
}
_ZH_UNIT = {"十": 10, "百": 100, "千": 1000, "万": 10**4, "亿": 10**8}
_ARABIC = re.compile(r"\d+(?:[.,:/]\d+)*")
_ZH_NUM = re.compile(r"[零〇一二两三四五六七八九十百千万亿]+")
_ZH_NOT_NUMBER = re.compile(
    r"一下|一些|一点|一起|一直|一般|一定|一样|统一|唯一|万一|一旦|一共|一边|之一|十分|千万"
)
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def _zh_value(s: str) -> float:
    total, section, digit = 0, 0, 0
    for ch in s:
        if ch in _ZH_DIGIT:
            digit = (
                digit * 10 + _ZH_DIGIT[ch]
                if digit and len(s) > 1 and all(c in _ZH_DIGIT for c in s)
                else _ZH_DIGIT[ch]
            )
        else:
            unit = _ZH_UNIT[ch]
            if unit >= 10**4:
                total += (section + digit) * unit
                section = 0
            else:
                section += (digit or 1) * unit
            digit = 0
    return float(total + section + digit)


def numbers(text: str) -> Counter[str]:
    """Numbers in the text as written (3.10 is not 3.1: versions), thousands separators dropped;
    Chinese numerals and English number words as their integer value. One in words is not
    counted ("一个人", "one of"): it is the article, not a quantity; a digit 1 is ("number 1")."""
    t = canonical(text)
    words: Counter[str] = Counter()
    for m in _ZH_NUM.finditer(_ZH_NOT_NUMBER.sub(" ", t)):
        words[_value_text(_zh_value(m.group()))] += 1
    for w in _WORD.findall(t):
        if w in _EN_NUMS:
            words[_value_text(_EN_NUMS[w])] += 1
    del words["1"]
    found: Counter[str] = Counter()
    for m in _ARABIC.finditer(t):
        raw = m.group()
        if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", raw):
            raw = raw.replace(",", "")
        found[raw] += 1
    return found + words


def _value_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# --------------------------------------------------------------------------- dates, amounts, ids

_DATE_WORDS = re.compile(
    r"\b(?:january|february|april|june|july|august|september|october|november|december|"
    r"jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec|monday|tuesday|wednesday|thursday|friday|"
    r"saturday|sunday|today|tomorrow|yesterday|tonight|weekend|morning|afternoon|evening|midnight|noon|"
    r"(?:last|next|this|coming|past|previous)\s+(?:week|month|year|quarter|weekend|night|time))\b"
    r"|(?<=\d)\s*(?:am|pm)\b"
    r"|今天|明天|昨天|后天|前天|今年|明年|去年|前年|本周|这周|上周|下周|本月|这个月|上个月|下个月|"
    r"周[一二三四五六日天末]|星期[一二三四五六日天]|礼拜[一二三四五六日天]|早上|上午|中午|下午|晚上|凌晨|"
    r"[0-9一二三四五六七八九十两几]+\s*(?:年|个月|月|日|号|天|周|小时|分钟)"
)
_CURRENCY = re.compile(
    r"[$¥€£₹₩₽]|\b(?:usd|eur|gbp|cny|rmb|jpy|dollars?|euros?|pounds?|yuan|yen|cents?|percent)\b"
    r"|%|元|块|角|毛|分钱|美元|欧元|英镑|日元|人民币|港币"
)
_ID = re.compile(r"(?:[#№]\s*\w+)|\b(?=[a-z0-9_-]*\d)(?=[a-z0-9_-]*[a-z])[a-z0-9_-]{3,}\b|\d{5,}")


def dates(text: str) -> Counter[str]:
    return Counter(_DATE_WORDS.findall(canonical(text)))


def amounts(text: str) -> Counter[str]:
    return Counter(_CURRENCY.findall(canonical(text)))


def ids(text: str) -> set[str]:
    return {m.group().replace(" ", "") for m in _ID.finditer(canonical(text))}


# --------------------------------------------------------------------------- entities

_URLISH = re.compile(r"https?://\S+|www\.\S+|[\w.+-]+@[\w-]+\.[\w.]+|@\w+|(?:/[\w.-]+){2,}")
_QUOTED = re.compile(r"[\"“「『']([^\"”」』']{1,40})[\"”」』']")
_CAPITAL = re.compile(r"(?<![.!?。！？]\s)(?<!^)\b([A-Z][\w-]*(?:\s+[A-Z][\w-]*)*)")
_CODEISH = re.compile(r"\b\w+_\w+\b|\b[a-z]+[A-Z]\w*\b|\b\w+\(\)")
_LATIN_IN_CJK = re.compile(r"[A-Za-z][\w.+-]*")
_HAN = re.compile(r"[\u4e00-\u9fff]")


def entities(text: str) -> set[str]:
    """Names the text commits to: URLs, emails, handles, quoted spans, capitalised names, code names."""
    found = {m.group() for m in _URLISH.finditer(text)}
    found |= {m.group(1) for m in _QUOTED.finditer(text)}
    found |= {m.group() for m in _CODEISH.finditer(text)}
    body = text.lstrip()
    found |= {
        m.group(1) for m in _CAPITAL.finditer(body) if m.group(1) not in ("I", "I'm", "I've", "I'll", "I'd")
    }
    if _HAN.search(text):
        found |= {m.group() for m in _LATIN_IN_CJK.finditer(text)}
    return {canonical(e) for e in found if e.strip()}


def _missing(names: frozenset[str], other: str) -> bool:
    hay = canonical(other)
    return any(n not in hay for n in names)


# --------------------------------------------------------------------------- substitutions

_EN_FUNCTION = frozenset(
    [
        "a",
        "an",
        "the",
        "my",
        "your",
        "his",
        "her",
        "its",
        "our",
        "their",
        "me",
        "i",
        "you",
        "we",
        "they",
        "it",
        "this",
        "that",
        "these",
        "those",
        "to",
        "of",
        "for",
        "in",
        "on",
        "at",
        "by",
        "with",
        "from",
        "please",
        "tell",
        "about",
        "hi",
        "hello",
        "thanks",
        "thank",
        "hey",
        "some",
        "any",
        "just",
        "really",
        "very",
        "so",
        "and",
        "or",
        "but",
        "if",
        "then",
        "there",
        "here",
        "what's",
        "how's",
        "it's",
        "i'm",
    ]
)
_EN_FUNCTION = (
    _EN_FUNCTION
    | AUXILIARIES
    | {"how", "what", "can", "could", "would", "should", "will", "us", "let", "know"}
)
_ZH_FUNCTION = frozenset("的了吗呢吧啊呀嘛么哦啦哈我你您怎如何样咋啥请问下呐嗯个这那能会要可以是在有")
_NUMERIC = re.compile(r"\d+|[零〇一二两三四五六七八九十百千万亿]")
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af]")


@lru_cache(maxsize=4096)
def _spelt_out(text: str) -> str:
    """Canonical, contractions spelt out: the form the token and antonym readings start from."""
    return expand_contractions(canonical(text))


@lru_cache(maxsize=4096)  # a query meets each of its candidates, a stored prompt many queries
def tokens(text: str) -> tuple[str, ...]:
    """Words (crudely stemmed: plays/played/playing -> play) for alphabetic text, single
    characters for CJK (the unit a swap happens in)."""
    text = zh_synonyms(_spelt_out(text))
    return tuple(SYNONYMS.get(w, w) if w.isascii() else w for w in (_stem(t) for t in _TOKEN.findall(text)))


def _stem(word: str) -> str:
    if not word.isascii() or len(word) <= 4 or word.isdigit():
        return word
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: -len(suffix)]
    return word


def _content(seg: Sequence[str]) -> list[str]:
    """Tokens that carry content; numbers are left to the number guard."""
    return [t for t in seg if t not in _EN_FUNCTION and t not in _ZH_FUNCTION and not _NUMERIC.fullmatch(t)]


def swapped(a: str, b: str, min_shared: float = 0.7, max_edit: int = 4) -> str | None:
    """'substitution' when otherwise identical texts swap content words (开通/关闭, France/Germany),
    'insertion' when one adds a little content the other lacks (refund / partial refund).
    Rewrites (more than ``max_edit`` tokens changed on a side and less than ``min_shared`` of
    the longer text in common, or any longer edit) are left to the verifier."""
    ta, tb = tokens(a), tokens(b)
    if not ta or not tb:
        return None
    sm = SequenceMatcher(None, ta, tb, autojunk=False)
    shared = sum(size for _, _, size in sm.get_matching_blocks())
    changed = max(len(ta), len(tb)) - shared
    if changed > max(max_edit, (1 - min_shared) * max(len(ta), len(tb))):
        return None
    verdict = None
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        if i2 - i1 > max_edit or j2 - j1 > max_edit:
            return None
        ca, cb = _content(ta[i1:i2]), _content(tb[j1:j2])
        if ca and cb:
            return "substitution"
        if ca or cb:
            verdict = "insertion"
    return verdict


# --------------------------------------------------------------------------- all guards


@dataclass(frozen=True)
class Reading:
    """What the guards read from one prompt, once: a query meets each of its candidates, a
    stored prompt many queries. Counts as sorted (value, count) pairs, names as sets."""

    negations: int
    numbers: tuple[tuple[str, int], ...]
    dates: tuple[tuple[str, int], ...]
    amounts: tuple[tuple[str, int], ...]
    ids: frozenset[str]
    entities: frozenset[str]
    entity_words: frozenset[str]
    directions: frozenset[tuple[str, str]]


@lru_cache(maxsize=4096)
def reading(text: str) -> Reading:
    names = frozenset(entities(text))
    return Reading(
        negations(text),
        tuple(sorted(numbers(text).items())),
        tuple(sorted(dates(text).items())),
        tuple(sorted(amounts(text).items())),
        frozenset(ids(text)),
        names,
        frozenset(w for e in names for w in e.split()),
        frozenset(directions(text)),
    )


def read_ahead(text: str) -> None:
    """Read a prompt for the guards before its pairs are decided (e.g. while it is embedded)."""
    reading(text)
    tokens(text)


def _negation(a: str, b: str) -> bool:
    return reading(a).negations != reading(b).negations


def _numbers(a: str, b: str) -> bool:
    return reading(a).numbers != reading(b).numbers


def _dates(a: str, b: str) -> bool:
    return reading(a).dates != reading(b).dates


def _amounts(a: str, b: str) -> bool:
    return reading(a).amounts != reading(b).amounts


def _ids(a: str, b: str) -> bool:
    return reading(a).ids != reading(b).ids


def _entities(a: str, b: str) -> bool:
    return _missing(reading(a).entities, b) or _missing(reading(b).entities, a)


def _antonyms(a: str, b: str) -> bool:
    return antonym_flip(_spelt_out(a), _spelt_out(b)) is not None


_EN_DIRECTION = re.compile(
    r"\bfrom\s+(?:the\s+|my\s+|a\s+)?(\S+)\s+(?:\S+\s+)?(?:to|into)\s+(?:the\s+|my\s+|a\s+)?(\S+)"
)
_ZH_DIRECTION = re.compile(r"从(\S{1,6}?)(?:转到|转入|转|到|至)(\S{1,6})")


def directions(text: str) -> set[tuple[str, str]]:
    """(source, destination) of "from X to Y" / 从X到Y: swapping them asks the opposite."""
    t = canonical(text)
    return {(m.group(1), m.group(2)) for m in _EN_DIRECTION.finditer(t)} | {
        (m.group(1), m.group(2)) for m in _ZH_DIRECTION.finditer(t)
    }


def _direction(a: str, b: str) -> bool:
    da, db = reading(a).directions, reading(b).directions
    return any(y.startswith(x2) and y2.startswith(x) for x, y in da for x2, y2 in db if (x, y) != (x2, y2))


GUARDS: dict[str, Callable[[str, str], bool]] = {
    "negation": _negation,
    "number": _numbers,
    "date": _dates,
    "amount": _amounts,
    "id": _ids,
    "entity": _entities,
    "antonym": _antonyms,
    "direction": _direction,
}


def _one_sided(x: tuple[tuple[str, int], ...], y: tuple[tuple[str, int], ...]) -> bool:
    """Only one side mentions any: an added detail, not a replaced one."""
    return not x or not y


def _replaced_entities(a: str, b: str) -> bool:
    """Both prompts name something the other does not: a name swapped, not one added."""
    ca, cb = canonical(a), canonical(b)
    return any(w not in cb for w in reading(a).entity_words) and any(
        w not in ca for w in reading(b).entity_words
    )


# A difference a guard sees is a hard veto when the prompts are otherwise the same (a small edit:
# the dangerous case, where the cosine cannot tell) or when a value is replaced by another. In a
# rewrite, a detail that only one side mentions (a name, a number, a date) is a scored feature.
SOFTENABLE = ("number", "date", "entity")


def guard(
    a: str,
    b: str,
    swaps: tuple[str, ...] = ("substitution", "insertion"),
    only: tuple[str, ...] | None = None,
) -> str | None:
    """The first guard that refuses the pair, or None when all pass. ``only``: the guards that
    may veto (None: all of them); the others are left to whatever scores the pair."""
    return guard_verdict(a, b, swaps, only)[0]


def guard_verdict(
    a: str,
    b: str,
    swaps: tuple[str, ...] = ("substitution", "insertion"),
    only: tuple[str, ...] | None = None,
) -> tuple[str | None, int]:
    """(the hard veto or None, how many differences were left to the verifier as features)."""
    small = swapped(a, b)
    soft = 0
    for name, check in GUARDS.items():
        if (only is not None and name not in only) or not check(a, b):
            continue
        if name in SOFTENABLE and small is None and _soft(name, a, b):
            soft += 1
            continue
        return name, soft
    return (small if small in swaps else None), soft


def _soft(name: str, a: str, b: str) -> bool:
    if name == "number":
        return _one_sided(reading(a).numbers, reading(b).numbers)
    if name == "date":
        return _one_sided(reading(a).dates, reading(b).dates)
    return not _replaced_entities(a, b)
