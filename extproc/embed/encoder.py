"""The synchronous embedders: one ONNX Runtime session, a tokenizer, pooling, L2 norm.

``can_read`` is the gate in front of the semantic layer: text the model cannot see well
(letters of a script outside the model's, unknown tokens, more tokens than it reads) must never
be compared by meaning, because what the model does not see cannot make two prompts differ.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from .token_states import TokenStates, hidden_output, layer_input, split_states
from .tokenize import E5Pieces, Encoded, HFTokenizer


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    def can_read(self, text: str) -> bool: ...

    def embed_sync(self, texts: list[str]) -> np.ndarray: ...


def script_of(ch: str) -> str:
    """Coarse script of a letter: Latin, Han, Kana, Hangul, Cyrillic, Greek, ... (first word of its name)."""
    o = ord(ch)
    if o < 0x250 or 0x1E00 <= o <= 0x1EFF or 0xFF21 <= o <= 0xFF5A:
        return "Latin"
    if 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F or 0xF900 <= o <= 0xFAFF:
        return "Han"
    name = unicodedata.name(ch, "")
    word = name.split(" ", 1)[0]
    return {"CJK": "Han", "HIRAGANA": "Kana", "KATAKANA": "Kana"}.get(word, word.title())


def letters_outside(text: str, scripts: frozenset[str]) -> int:
    if "Latin" in scripts and text.isascii():  # every ASCII letter is Latin: no walk of the text
        return 0
    return sum(1 for ch in text if ch.isalpha() and script_of(ch) not in scripts)


@dataclass(frozen=True)
class ReadPolicy:
    """What counts as readable: scripts (None: any), unknown-token share, token budget."""

    scripts: frozenset[str] | None = None
    max_unknown_fraction: float = 0.0
    max_tokens: int = 256


_READ_IDS_KEPT = 256


class OnnxEmbedder:
    """A sentence encoder in ONNX. Thread-safe: ``session.run`` may be called concurrently.

    One session serves both the sentence vectors and, when the graph has a mean-pooled hidden
    state (every built model does), the token states behind them: ``embed_with_states`` asks
    the same forward pass for both outputs, so the verifier's alignment features cost no
    second model run.
    """

    def __init__(
        self,
        name: str,
        model_file: Path,
        tokenizer: E5Pieces | HFTokenizer,
        *,
        prefix: str = "",
        pooling: str = "mean",
        read: ReadPolicy = ReadPolicy(),
        threads: int = 1,
        max_batch: int = 64,
        lower_layers: int = 0,
    ) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        graph, self._hidden, self._lower = _with_hidden_output(model_file, lower_layers)
        self._lower_layers = lower_layers if self._lower else 0
        self._session = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        out = self._session.get_outputs()[0]
        self._output = out.name
        self.name = name
        self.tokenizer = tokenizer
        self.prefix = prefix
        self.pooling = pooling
        self.read = read
        self.max_batch = max_batch
        self.threads = threads
        # The ids `can_read` found for a text it passed, for the embedding that usually follows
        # (a readable text is never truncated, so they are the ids `encode` would give).
        self._read_ids: dict[str, list[int]] = {}
        self.model_file = model_file
        self._skip = 1 + _prefix_pieces(self)  # [bos]/[CLS] and the prefix's pieces
        self.dim = (
            int(out.shape[-1]) if isinstance(out.shape[-1], int) else int(self.embed_sync(["x"]).shape[1])
        )

    @property
    def reads_states(self) -> bool:
        """Whether ``embed_with_states`` can give token states (a graph with a pooled hidden state)."""
        return self._hidden is not None

    @property
    def reads_lower(self) -> bool:
        """Whether token states carry ``lower``: the input of the top layers (``lower_layers``)."""
        return self._lower is not None

    def encode(self, text: str) -> Encoded:
        return self.tokenizer.encode(self.prefix + text)

    def _ids(self, text: str) -> list[int]:
        ids: list[int] | None = self._read_ids.pop(text, None)
        return self.encode(text).ids if ids is None else ids

    def can_read(self, text: str) -> bool:
        if not text.strip():
            return False
        if self.read.scripts is not None and letters_outside(text, self.read.scripts):
            return False
        enc = self.tokenizer.encode(self.prefix + text, truncate=False)
        if len(enc.ids) > self.read.max_tokens:
            return False  # truncation would hide the tail: two prompts could differ only there
        if enc.unknown > self.read.max_unknown_fraction * max(enc.content, 1):
            return False
        if len(self._read_ids) >= _READ_IDS_KEPT:  # texts read and never embedded
            self._read_ids.clear()
        self._read_ids[text] = enc.ids
        return True

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        """L2-normalised float32 rows, one per text; each row independent of its batch."""
        return self._embed(texts, False)[0]

    def embed_with_states(self, texts: list[str]) -> tuple[np.ndarray, list[TokenStates]]:
        """``embed_sync``'s rows and every text's token states, from the same forward pass."""
        if self._hidden is None:
            raise ValueError(f"{self.name}: the graph has no pooled hidden state to read token states from")
        vectors, states = self._embed(texts, True)
        return vectors, [s for s in states if s is not None]

    def _embed(self, texts: list[str], with_states: bool) -> tuple[np.ndarray, list[TokenStates | None]]:
        encoded = [self._ids(t) for t in texts]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        states: list[TokenStates | None] = [None] * len(texts)
        for chunk in plan_batches([len(e) for e in encoded], self.max_batch):
            batch = [encoded[i] for i in chunk]
            out[chunk], hidden, lower = self._run(batch, with_states)
            if hidden is not None:
                split = split_states(hidden, batch, self._skip, self._spell, lower)
                for i, st in zip(chunk, split, strict=True):
                    states[i] = st
        return out, states

    def feed(self, batch: list[list[int]]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The model's inputs for a batch of token ids, padded, and the attention mask."""
        width = max(len(ids) for ids in batch)
        ids = np.full((len(batch), width), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        return feed, mask

    def _run(
        self, batch: list[list[int]], with_states: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        feed, mask = self.feed(batch)
        names = [self._output, self._hidden] if with_states and self._hidden else [self._output]
        if with_states and self._hidden and self._lower:
            names.append(self._lower)
        got = self._session.run(names, feed)
        y = np.asarray(got[0], dtype=np.float32)
        if y.ndim == 3:
            y = pool(y, mask, self.pooling)
        norm = np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
        out: np.ndarray = (y / norm).astype(np.float32)
        return out, (got[1] if len(got) > 1 else None), (got[2] if len(got) > 2 else None)

    def _spell(self, ids: Sequence[int]) -> list[str]:
        return _piece_texts(self.tokenizer, ids)


def pool(hidden: np.ndarray, mask: np.ndarray, how: str) -> np.ndarray:
    if how == "cls":
        cls: np.ndarray = hidden[:, 0]
        return cls
    m = mask[..., None].astype(np.float32)
    mean: np.ndarray = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)
    return mean


def plan_batches(lengths: Sequence[int], max_batch: int, max_waste: float = 0.3) -> list[list[int]]:
    """Split indices into runs of similar length so padding stays under ``max_waste`` of a batch.

    Results do not depend on the split (rows are independent); only the cost does.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i in order:
        width = lengths[i]  # sorted ascending: the newest is the widest
        if cur and (len(cur) >= max_batch or (len(cur) + 1) * width * (1 - max_waste) > total + width):
            batches.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += width
    if cur:
        batches.append(cur)
    return batches


# ----------------------------------------------------------------------------- token states


def _with_hidden_output(
    model_file: Path, lower_layers: int = 0
) -> tuple[str | bytes, str | None, str | None]:
    """The graph to run, with its mean-pooled hidden state as a second output when it has one
    (else the file as it is, and None), and with ``lower_layers`` > 0 the input of its top that
    many layers as a third (the cross judge's)."""
    import onnx

    model = onnx.load(str(model_file))
    try:
        hidden = hidden_output(model)
    except ValueError:
        return str(model_file), None, None
    if hidden not in {o.name for o in model.graph.output}:
        model.graph.output.append(
            onnx.helper.make_tensor_value_info(hidden, onnx.TensorProto.FLOAT, ["batch", "seq", "hidden"])
        )
    lower = layer_input(model, lower_layers) if lower_layers else None
    if lower is not None:
        # No declared shape: with one, ONNX Runtime optimises the graph differently and the
        # embeddings move in their last bits; without, they stay bit for bit what they were.
        model.graph.output.append(onnx.helper.make_tensor_value_info(lower, onnx.TensorProto.FLOAT, None))
    return model.SerializeToString(), hidden, lower


def _piece_texts(tokenizer: E5Pieces | HFTokenizer, ids: Sequence[int]) -> list[str]:
    if isinstance(tokenizer, E5Pieces):
        sp = tokenizer._sp
        return [str(sp.id_to_piece(int(i))) for i in ids]
    tok = tokenizer._tok
    return [str(tok.id_to_token(int(i)) or "") for i in ids]


def _prefix_pieces(embedder: OnnxEmbedder) -> int:
    """How many pieces after [bos]/[CLS] spell the model's prefix ("query: " for e5)."""
    if not embedder.prefix:
        return 0
    a, b = embedder.encode("apple").ids, embedder.encode("zebra").ids
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return max(common - 1, 0)
