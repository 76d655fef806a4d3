"""Personal data in answer text: find it, redact it, and know how much of a stream's tail
could still become part of a match.

Kinds: payment card numbers (13-19 digits, Luhn-checked), Chinese resident ID numbers
(18 characters, ISO 7064 MOD 11-2 checksum), phone numbers (Chinese mobiles, North American
numbers, any number written with a leading `+`), e-mail addresses and IBANs (mod-97). A
redaction replaces the whole match with `[redacted:KIND]`.

`holdback(text)` is what a stream must keep back: the shortest tail of `text` such that
every match that more text could still create or change starts inside it. It is bounded by
the longest span a match can have, and is empty after text that cannot start one.

Both read the text as a person does, one character for one (`plain`): fullwidth letters,
digits and signs as ASCII (`１３８００１３８０００`, common in Chinese answers), every other
script's decimal digits as ASCII digits, and no-break, fixed-width and zero-width spaces as a
space; offsets stay those of the text, so what is redacted is the text's own characters.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

Span = tuple[int, int, str]  # start, end, kind

_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CN_ID_CHECK = "10X98765432"


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def cn_id_ok(value: str) -> bool:
    """18 characters: 17 digits and a check character (a digit or X), ISO 7064 MOD 11-2."""
    body, check = value[:17], value[17].upper()
    total = sum(int(c) * w for c, w in zip(body, _CN_ID_WEIGHTS, strict=True))
    return _CN_ID_CHECK[total % 11] == check


def iban_ok(value: str) -> bool:
    """ISO 13616: the country and check digits moved to the end, letters as numbers, mod 97 == 1."""
    moved = value[4:] + value[:4]
    if not 15 <= len(value) <= 34 or not moved.isalnum():
        return False
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


_Check = Callable[[str], "tuple[int, int] | None"]
_GROUP = re.compile(r"[0-9A-Za-z]+")


def _groups(match: str) -> list[tuple[int, int]]:
    """The spans of a match's groups (runs between separators)."""
    return [(m.start(), m.end()) for m in _GROUP.finditer(match)]


def _card(match: str) -> tuple[int, int] | None:
    """The longest run of whole groups with 13-19 digits that passes Luhn (a card may follow
    other digits: "order 12 4111 1111 1111 1111")."""
    groups = _groups(match)
    for i in range(len(groups)):
        for j in range(len(groups) - 1, i - 1, -1):
            start, end = groups[i][0], groups[j][1]
            digits = match[start:end].replace(" ", "").replace("-", "")
            if 13 <= len(digits) <= 19 and luhn_ok(digits):
                return start, end
    return None


def _cn_id(match: str) -> tuple[int, int] | None:
    return (0, len(match)) if cn_id_ok(match.replace(" ", "")) else None


def _phone(match: str) -> tuple[int, int] | None:
    digits = sum(c.isdigit() for c in match)
    return (0, len(match)) if 7 <= digits <= 15 else None


def _iban(match: str) -> tuple[int, int] | None:
    """The longest run of groups from the start that is an IBAN (a capitalised word may follow)."""
    groups = _groups(match)
    for j in range(len(groups) - 1, -1, -1):
        end = groups[j][1]
        if iban_ok(match[:end].replace(" ", "")):
            return 0, end
    return None


def _whole(match: str) -> tuple[int, int] | None:
    return 0, len(match)


@dataclass(frozen=True)
class Kind:
    name: str
    pattern: re.Pattern[str]
    valid: _Check  # the valid part of a candidate (start, end within it), or None
    # Every prefix of a match, at the end of the text (an over-approximation is safe).
    prefix: re.Pattern[str]
    max_span: int  # the longest a match can be, in characters


_NOT_ALNUM_BEFORE = r"(?<![0-9A-Za-z])"
_DIGIT_PREFIX = re.compile(r"(?:[+(]|[+(]?\d[\dXx ().-]*)\Z")

KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("card", re.compile(r"(?<![\d])\d(?:[ -]?\d){12,18}(?![\d])"), _card, _DIGIT_PREFIX, 37),
        Kind("cn_id", re.compile(_NOT_ALNUM_BEFORE + r"[1-9]\d{5} ?\d{8} ?\d{3}[\dXx](?![0-9A-Za-z])"),
             _cn_id, _DIGIT_PREFIX, 20),
        Kind(
            "phone",
            re.compile(
                r"(?<![\w+])(?:"
                r"(?:(?:\+|00)86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}"  # Chinese mobile
                r"|(?:\+1[ .-]?)?(?:\([2-9]\d\d\)|[2-9]\d\d)[ .-]?[2-9]\d\d[ .-]?\d{4}"  # North America
                r"|\+[1-9]\d{0,2}(?:[ .-]?\(?\d{1,5}\)?){2,6}"  # any number with its country code
                r")(?![\d])"
            ),
            _phone, _DIGIT_PREFIX, 32,
        ),
        Kind(
            "email",
            re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,3}"
                       r"\.[A-Za-z]{2,24}(?![\w-])"),
            _whole,
            re.compile(r"[A-Za-z0-9._%+-]{1,64}(?:@[A-Za-z0-9.-]{0,280})?\Z"),
            64 + 1 + 280,
        ),
        Kind(
            "iban",
            re.compile(_NOT_ALNUM_BEFORE + r"[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![0-9A-Za-z])"),
            _iban,
            re.compile(r"[A-Z](?:[A-Z](?:\d(?:\d(?: ?[A-Z0-9]){0,30})?)?)? ?\Z"),
            4 + 30 * 2 + 1,
        ),
    )
}
ALL_KINDS: tuple[str, ...] = tuple(KINDS)


def _plain_table() -> str:
    """Indexed by code point (str.translate leaves a character past its end as it is)."""
    table = [chr(cp) for cp in range(0x10000)]
    for cp in range(0x80, 0x10000):
        if unicodedata.category(chr(cp)) == "Nd":
            table[cp] = str(unicodedata.decimal(chr(cp)))
    for cp in range(0xFF01, 0xFF5F):  # fullwidth ASCII
        table[cp] = chr(cp - 0xFEE0)
    for cp in (0x00A0, *range(0x2000, 0x200E), 0x202F, 0x205F, 0x2060, 0x3000, 0xFEFF):
        table[cp] = " "
    return "".join(table)


_PLAIN = _plain_table()


def plain(text: str) -> str:
    """The text as the patterns read it: the same length, one character for one."""
    return text if text.isascii() else text.translate(_PLAIN)


def find(text: str, kinds: Collection[str] = ALL_KINDS) -> list[Span]:
    """Every valid match, overlaps merged (the first kind found names the merged span)."""
    text = plain(text)
    spans: list[Span] = []
    for name in kinds:
        kind = KINDS[name]
        for m in kind.pattern.finditer(text):
            part = kind.valid(m.group())
            if part is not None:
                spans.append((m.start() + part[0], m.start() + part[1], name))
    spans.sort()
    merged: list[Span] = []
    for start, end, name in spans:
        if merged and start < merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], end), last[2])
        else:
            merged.append((start, end, name))
    return merged


def label(kind: str) -> str:
    return f"[redacted:{kind}]"


def apply(text: str, spans: list[Span]) -> str:
    """`text` with each span replaced by its label (spans sorted, not overlapping)."""
    out: list[str] = []
    at = 0
    for start, end, kind in spans:
        out.append(text[at:start])
        out.append(label(kind))
        at = end
    out.append(text[at:])
    return "".join(out)


def redact(text: str, kinds: Collection[str] = ALL_KINDS) -> tuple[str, Counter[str]]:
    """The text with every match redacted, and how many of each kind."""
    spans = find(text, kinds)
    return apply(text, spans), Counter(kind for _, _, kind in spans)


def holdback(text: str, kinds: Collection[str] = ALL_KINDS) -> int:
    """How many characters at the end of `text` more text could still make part of a match."""
    longest = max(KINDS[k].max_span for k in kinds) if kinds else 0
    tail = plain(text[-longest:]) if longest else ""
    held = 0
    for name in kinds:
        kind = KINDS[name]
        m = kind.prefix.search(tail[-kind.max_span:])
        if m is not None:
            held = max(held, m.end() - m.start())
    return held
