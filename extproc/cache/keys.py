"""Cache scope and keys: pure functions of the request.

The scope holds everything that may change the answer except the last user message:
tenant (unless shared), path, model, every sampling parameter, system prompt, tool
schema, every earlier turn and the model version (unless the model's versions share
answers). Only the last user message is compared, first as text
(normalised), then by meaning. Fields that change only the framing of the answer
(`stream`, `stream_options`, `user`) stay out of the scope, so a streaming caller can be
answered from a non-streaming one.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..request import split_last
from ..textform import collapse_spaces

# Framing-only fields: they change how the answer is delivered, never what it says.
FRAMING_FIELDS = frozenset({"stream", "stream_options", "user", "metadata", "store"})
# Above this many characters the exact key uses `normalise` instead of the richer canonical
# form it is given: that one runs regular expressions line by line (~0.3 ms per KB), and a
# prompt of hundreds of KB would hold the event loop while every other stream waits.
CANON_MAX_CHARS = 16_384


def normalise(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed: the exact-key form of a message.

    Linear and in C, with no object per word: ASCII text is already NFKC, and
    `collapse_spaces` knows the same whitespace as the regular expression `\\s`.
    """
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    return collapse_spaces(text.casefold())


def digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


@dataclass(frozen=True)
class Question:
    """The comparable part of a request: its scope and the last user message."""

    scope: str  # hex digest of everything else
    text: str | None  # the last user message; None when the request has none to compare
    model: str
    tenant: str  # the scope's tenant ("*" when shared)


def question(
    payload: dict[str, Any], path: str, tenant: str, shared: bool, version: str | None = None
) -> Question:
    """`version`: the model version answering (None: unversioned, or versions share answers)."""
    earlier, text = split_last(payload)
    rest = {k: v for k, v in payload.items() if k not in FRAMING_FIELDS and k not in ("messages", "prompt")}
    scope_tenant = "*" if shared else tenant
    parts = [
        scope_tenant.encode(),
        path.encode(),
        orjson.dumps(rest, option=orjson.OPT_SORT_KEYS),
        orjson.dumps(earlier, option=orjson.OPT_SORT_KEYS),
        b"" if text is None else b"text",
    ]
    if version is not None:  # an unversioned model keeps the keys it always had
        parts.append(b"version:" + version.encode())
    scope = digest(*parts)
    return Question(scope=scope, text=text, model=str(payload.get("model", "")), tenant=scope_tenant)


def exact_key(q: Question, canon: Callable[[str], str] = normalise) -> str:
    """Scope + the normalised last message (with no text to compare, the scope holds it all)."""
    if q.text is None:
        return digest(q.scope.encode(), b"none")
    form = canon(q.text) if len(q.text) <= CANON_MAX_CHARS else normalise(q.text)
    return digest(q.scope.encode(), form.encode())
