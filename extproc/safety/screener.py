"""The screen's service: the embedder, the head, and the verdicts already reached.

Lives as long as the process's config. A text written to slip past the screen (look-alike
letters, leetspeak, base64, ...: `unmask.py`) is scored as written and as unmasked, and a long
one in pieces too (`pieces.py`), the highest score counting. A text screened once keeps its
score in a bounded memo keyed by the text's hash, so an exact repeat pays no embedding; with
a shared store the score is kept there too (`verdicts.py`), so no other gate process embeds
that text again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal, Protocol

import numpy as np

from ..cache.setup import ensure_model
from ..config import Screen as ScreenConfig
from ..embed import BatchingEmbedder, default_model_dir, shared_embedder
from ..tasks import all_or_none
from .pieces import MIDDLE_KEEP, pieces, strongest
from .screen import EMBEDDER, HEAD_FILE, MAX_TOKENS, Head, load_head
from .unmask import WINDOW, reread, unmasked, unread, window
from .verdicts import SharedVerdicts

Source = Literal["memo", "shared", "embedded"]  # where a score came from


def _key(text: str) -> bytes:
    """A text's key in the memo (and, in hex, in the shared verdicts)."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def readings(text: str, head: Head, middle_pieces: int = MIDDLE_KEEP) -> tuple[str | None, list[str]]:
    """The readings scored beside the text as written: its unmasked reading (None when it reads
    the same) and, when long, the pieces of what the screen reads of it, with the
    `middle_pieces` pieces of its unread middle (unmasked) that the head's n-grams weigh highest."""
    plain = reread(text)
    parts = pieces(window(text) if plain is None else plain)
    middle = unmasked(unread(text)) if middle_pieces else ""
    if middle:
        parts += strongest(pieces(middle) or [middle], head.lexical_logit, middle_pieces)
    return plain, parts


class Embedder(Protocol):
    name: str

    async def embed(self, text: str) -> np.ndarray: ...


class Screener:
    def __init__(self, config: ScreenConfig, embedder: BatchingEmbedder, head: Head) -> None:
        if head.embedder != embedder.name:
            raise ValueError(f"the screen's head was trained on {head.embedder!r}, not {embedder.name!r}")
        self.embedder = embedder
        self.head = head
        self.threshold = config.threshold if config.threshold is not None else head.threshold
        self.timeout_s = config.embed_timeout_ms / 1000
        self.memo_size = config.memo_size
        self.middle_pieces = config.middle_pieces
        self._memo: OrderedDict[bytes, float] = OrderedDict()
        self.shared: SharedVerdicts | None = None  # set when the gate shares a store
        self.on_score: Callable[[Source], None] = lambda source: None
        self.on_masked: Callable[[], None] = lambda: None
        self.on_pieces: Callable[[int], None] = lambda n: None

    @classmethod
    def build(cls, config: ScreenConfig, workers: int = 1) -> Screener:
        model_dir = config.model_dir or default_model_dir()
        ensure_model(EMBEDDER, model_dir, build_missing=True)
        inner = shared_embedder(EMBEDDER, model_dir, max_tokens=MAX_TOKENS)
        embedder = BatchingEmbedder(inner, workers=workers, timeout_s=config.embed_timeout_ms / 1000)
        return cls(config, embedder, load_head(config.head_file or HEAD_FILE))

    def known(self, text: str) -> bool:
        """Whether this process has screened the text (its memo; nothing is looked up)."""
        key = _key(text)
        if key in self._memo:
            self._memo.move_to_end(key)
            return True
        return False

    async def score(self, text: str, shared: Embedder | None = None) -> tuple[float, np.ndarray | None]:
        """(the text's score, its vector when it was embedded now: None for a known text).

        `shared`: another service's embedder of the same model (the semantic cache's), whose
        vector that service can then reuse instead of embedding the text again."""
        key = _key(text)
        known = self._memo.get(key)
        if known is not None:
            self._memo.move_to_end(key)
            self.on_score("memo")
            return known, None
        if self.shared is not None:
            known = await self.shared.get(key.hex())
            if known is not None:
                self._remember(key, known)
                self.on_score("shared")
                return known, None
        async with asyncio.timeout(self.timeout_s):
            if len(text) > WINDOW and self.middle_pieces:  # a middle to weigh: off the event loop
                plain, parts = await asyncio.to_thread(readings, text, self.head, self.middle_pieces)
            else:
                plain, parts = readings(text, self.head, self.middle_pieces)
            others = ([] if plain is None else [plain]) + parts
            vector = await (shared or self.embedder).embed(text)
            value = self.head.score(vector, text)
            if others:  # the highest score of every reading counts; one batch of embeddings
                vectors = await all_or_none(self.embedder.embed(t) for t in others)
                value = max(value, *(self.head.score(v, t) for v, t in zip(vectors, others, strict=True)))
        if plain is not None:
            self.on_masked()
        if parts:
            self.on_pieces(len(parts))
        self._remember(key, value)
        if self.shared is not None:
            self.shared.put(key.hex(), value)
        self.on_score("embedded")
        return value, vector

    def _remember(self, key: bytes, value: float) -> None:
        if self.memo_size:
            self._memo[key] = value
            if len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)

    async def aclose(self) -> None:
        await self.embedder.aclose()

