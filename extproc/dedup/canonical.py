"""The near-exact layer: ``canonical(text)`` maps spellings of one prompt to one string.

Safe by construction: it only removes differences that cannot change what is asked —
full/half width and compatibility forms (NFKC, but superscripts, subscripts and fractions are
kept: x² is not x2), case, runs of spaces inside a line, spaces between CJK characters,
sentence punctuation next to a space or the end (never the ``.`` of ``3.5``, the ``,`` of
``1,000``, the ``:`` of ``10:30``, an apostrophe, ``-``, ``%``, ``/``, ``#``), and quotes.
Question marks are kept (normalised), line breaks and leading indentation are kept (code).

Per language, still exact-safe: English contractions spelt out (what's -> what is, can't -> can
not); a greeting or "please" / 请问 that opens or closes a one-line prompt; and the final question
mark of a prompt that already asks (it starts with a question word, or carries 吗/呢/什么...) —
"it's raining?" stays apart from "it's raining".
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from .lexicon import expand_contractions

_KEEP_DECOMPOSITION = ("<super>", "<sub>", "<fraction>")
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))
_QUOTES = dict.fromkeys(map(ord, '"“”„‟«»「」『』〝〞﹁﹂﹃﹄《》〈〉'), " ")
_APOSTROPHES = dict.fromkeys(map(ord, "‘’‛′`"), "'")
_CJK_PUNCT = "。，、；：！…～·・"
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
# ASCII sentence punctuation followed by whitespace or the end of the text
_SENTENCE_PUNCT = re.compile(r"[.,;:!]+(?=\s|$)|[" + _CJK_PUNCT + r"]+")
_QUESTION = re.compile(r"\s*[?？]+")
_INNER_SPACE = re.compile(r"(?<=\S)[ \t\u3000]+")
_CJK_GAP = re.compile(f"(?<=[{_CJK}]) (?=[{_CJK}])")


def _nfkc(text: str) -> str:
    if all(ord(ch) < 0x80 for ch in text):
        return text
    out: list[str] = []
    run: list[str] = []
    for ch in text:
        if unicodedata.decomposition(ch).startswith(_KEEP_DECOMPOSITION):
            out.append(unicodedata.normalize("NFKC", "".join(run)))
            run = []
            out.append(ch)
        else:
            run.append(ch)
    out.append(unicodedata.normalize("NFKC", "".join(run)))
    return "".join(out)


_OPENER = re.compile(
    r"^(?:(?:(?:hi|hello|hey|dear|good (?:morning|afternoon|evening))(?: there| all| team)?|please|"
    r"excuse me|sorry to bother you)(?:[ ,]+|$)"
    r"|(?:请问(?:一下)?|你好|您好|麻烦问一下|麻烦问下|打扰一下|嗨|哈喽)[ ,]*)"
)
_CLOSER = re.compile(
    r"(?:(?:[ ,]+|^)(?:please|thanks|thank you|thanks a lot|thank you very much)"
    r"|[ ,]*(?:谢谢(?:你|您)?|多谢|拜托了))$"
)
_ASKS = re.compile(
    r"^(?:how|what|why|when|where|who|whom|whose|which|can|could|do|does|did|is|are|was|were|should|"
    r"would|will|may|might|have|has|shall)\b"
    r"|[吗呢么]$|什么|为什么|怎么|怎样|如何|多少|多久|哪|几|是否|能否|可否|可不可以|能不能|是不是|有没有|啥"
)


def _polite(line: str) -> str:
    while True:
        stripped = _CLOSER.sub("", _OPENER.sub("", line)).strip()
        if stripped == line or not stripped:
            return line
        line = stripped


def _final_question(line: str) -> str:
    if line.endswith("?") and _ASKS.search(line[:-1].rstrip()):
        return line[:-1].rstrip()
    return line


@lru_cache(maxsize=8192)  # the guards and features ask for one prompt's form many times
def canonical(text: str) -> str:
    """The near-exact form (see the module doc)."""
    base = _canonical(text)
    if "\n" in base:
        return base  # several lines: only the safe spelling layer
    line = expand_contractions(base)
    while True:
        shorter = _final_question(_polite(_final_question(line)))
        if shorter == line:
            return line
        line = shorter


def _without_sentence_punct(line: str) -> str:
    """Until none is left: dropping one mark can put another before a space or the end (".·")."""
    while (shorter := _SENTENCE_PUNCT.sub(" ", line)) != line:
        line = shorter
    return line


def _canonical(text: str) -> str:
    text = _nfkc(text.translate(_INVISIBLE)).translate(_APOSTROPHES).translate(_QUOTES)
    text = _nfkc(text.casefold())
    lines = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = _QUESTION.sub("?", _without_sentence_punct(line))
        line = _INNER_SPACE.sub(" ", line).rstrip()
        line = _CJK_GAP.sub("", line)
        if line.strip():
            lines.append(line)
    if lines:  # leading indentation of the first line carries no structure
        lines[0] = lines[0].lstrip()
    return "\n".join(lines)
