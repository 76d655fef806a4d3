"""``collapse_spaces(text)``: ``" ".join(text.split())`` without a string object per word.

The exact key and the repeated-prompt fingerprint both collapse whitespace, on the event loop.
``str.split`` builds one object per word: ~7 ms for a 512 KB prompt, every other stream
waiting. Here every character ``str.split`` counts as whitespace becomes a space (ASCII text:
one `translate` over its bytes; other text: one `replace` per kind present), and runs of
spaces shrink by halving: a few passes in C, ~1 ms for 512 KB of ASCII.
"""

from __future__ import annotations

# Every character for which str.isspace() holds (str.split's whitespace), the space last.
ASCII_SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "
WIDE_SPACES = (
    "\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_TO_SPACE = bytes.maketrans(ASCII_SPACES.encode(), b" " * len(ASCII_SPACES))
_NOT_SPACE = ASCII_SPACES[:-1] + WIDE_SPACES


def collapse_spaces(text: str) -> str:
    """The words of `text` (split at any Unicode whitespace) joined by single spaces."""
    if text.isascii():
        data = text.encode("ascii").translate(_TO_SPACE)
        while b"  " in data:
            data = data.replace(b"  ", b" ")
        return data.strip(b" ").decode("ascii")
    for ch in _NOT_SPACE:
        if ch in text:
            text = text.replace(ch, " ")
    while "  " in text:
        text = text.replace("  ", " ")
    return text.strip(" ")
