"""The near-exact layer: ``canonical(text)`` maps spellings of one prompt to one string.

Safe by construction: it only removes differences that cannot change what is asked —
full/half width and compatibility forms (NFKC, but superscripts, subscripts and fractions are
kept: x² is not x2), case, runs of spaces inside a line, spaces between CJK characters,
sentence punctuation next to a space or the end (never the ``.`` of ``3.5``, the ``,`` of
``1,000``, the ``:`` of ``10:30``, an apostrophe, ``-``, ``%``, ``/``, ``#``), and quotes.
Question marks are kept (normalised), line breaks and leading indentation are kept (code).
"""

from __future__ import annotations

import re
import unicodedata

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


def canonical(text: str) -> str:
    text = _nfkc(text.translate(_INVISIBLE)).translate(_APOSTROPHES).translate(_QUOTES)
    text = _nfkc(text.casefold())
    lines = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = _QUESTION.sub("?", _SENTENCE_PUNCT.sub(" ", line))
        line = _INNER_SPACE.sub(" ", line).rstrip()
        line = _CJK_GAP.sub("", line)
        if line.strip():
            lines.append(line)
    if lines:  # leading indentation of the first line carries no structure
        lines[0] = lines[0].lstrip()
    return "\n".join(lines)
