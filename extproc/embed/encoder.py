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
    return sum(1 for ch in text if ch.isalpha() and script_of(ch) not in scripts)


@dataclass(frozen=True)
class ReadPolicy:
    """What counts as readable: scripts (None: any), unknown-token share, token budget."""

    scripts: frozenset[str] | None = None
    max_unknown_fraction: float = 0.0
    max_tokens: int = 256


class OnnxEmbedder:
    """A sentence encoder in ONNX. Thread-safe: ``session.run`` may be called concurrently."""

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
    ) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(model_file), so, providers=["CPUExecutionProvider"])
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
        self.model_file = model_file
        self._token_reader: TokenReader | None = None
        self.dim = (
            int(out.shape[-1]) if isinstance(out.shape[-1], int) else int(self.embed_sync(["x"]).shape[1])
        )

    def encode(self, text: str) -> Encoded:
        return self.tokenizer.encode(self.prefix + text)

    def can_read(self, text: str) -> bool:
        if not text.strip():
            return False
        if self.read.scripts is not None and letters_outside(text, self.read.scripts):
            return False
        enc = self.tokenizer.encode(self.prefix + text, truncate=False)
        if len(enc.ids) > self.read.max_tokens:
            return False  # truncation would hide the tail: two prompts could differ only there
        return enc.unknown <= self.read.max_unknown_fraction * max(enc.content, 1)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        """L2-normalised float32 rows, one per text; each row independent of its batch."""
        encoded = [self.encode(t).ids for t in texts]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for chunk in plan_batches([len(e) for e in encoded], self.max_batch):
            out[chunk] = self._run([encoded[i] for i in chunk])
        return out

    def token_reader(self) -> TokenReader:
        """Embeddings plus token states from one forward pass (a second session, built on first use)."""
        if self._token_reader is None:
            self._token_reader = TokenReader(self, self.model_file)
        return self._token_reader

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

    def _run(self, batch: list[list[int]]) -> np.ndarray:
        feed, mask = self.feed(batch)
        y = np.asarray(self._session.run([self._output], feed)[0], dtype=np.float32)
        if y.ndim == 3:
            y = pool(y, mask, self.pooling)
        norm = np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
        out: np.ndarray = (y / norm).astype(np.float32)
        return out


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


@dataclass(frozen=True)
class TokenStates:
    """One text's last-layer token vectors (L2-normalised rows), specials and prefix dropped,
    with the pieces they stand for (``▁how`` / ``##ing`` as the tokenizer spells them)."""

    pieces: tuple[str, ...]
    vectors: np.ndarray  # float32 [len(pieces), dim]


def hidden_output(model: object) -> str:
    """The name of the tensor the graph mean-pools: the last LayerNormalization output that a
    ``Mul`` by the (unsqueezed) attention mask consumes."""
    graph = model.graph  # type: ignore[attr-defined]
    produced_by = {out: node for node in graph.node for out in node.output}
    for node in reversed(list(graph.node)):
        if node.op_type != "Mul" or not node.input:
            continue
        src = produced_by.get(node.input[0])
        if src is not None and src.op_type == "LayerNormalization":
            return str(node.input[0])
    raise ValueError("no pooled hidden state found in the graph")


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


class TokenReader:
    """The same ONNX graph with its pre-pooling hidden state exposed as a second output.

    ``read(texts)`` returns the sentence embeddings (identical to ``OnnxEmbedder.embed_sync``)
    and every text's token states from the same forward pass: alignment features for the
    dedup verifier cost no extra model run. ``embed`` itself stays on its own session.
    """

    def __init__(self, embedder: OnnxEmbedder, model_file: Path) -> None:
        import onnx
        import onnxruntime as ort

        model = onnx.load(str(model_file))
        self.hidden = hidden_output(model)
        dim = embedder.dim
        model.graph.output.append(
            onnx.helper.make_tensor_value_info(self.hidden, onnx.TensorProto.FLOAT, ["batch", "seq", dim])
        )
        so = ort.SessionOptions()
        so.intra_op_num_threads = embedder.threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        self._emb = embedder
        self._prefix = _prefix_pieces(embedder)

    def read(self, texts: list[str]) -> tuple[np.ndarray, list[TokenStates]]:
        emb = self._emb
        encoded = [emb.encode(t).ids for t in texts]
        vectors = np.empty((len(texts), emb.dim), dtype=np.float32)
        states: list[TokenStates | None] = [None] * len(texts)
        for chunk in plan_batches([len(e) for e in encoded], emb.max_batch):
            batch = [encoded[i] for i in chunk]
            feed, _ = emb.feed(batch)
            pooled, hidden = self._session.run([emb._output, self.hidden], feed)
            y = np.asarray(pooled, dtype=np.float32)
            vectors[chunk] = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
            h = np.asarray(hidden, dtype=np.float32)
            for row, i in enumerate(chunk):
                seq = batch[row]
                lo, hi = 1 + self._prefix, len(seq) - 1  # drop [bos]/[CLS], prefix, [eos]/[SEP]
                tok = h[row, lo:hi]
                tok = tok / np.maximum(np.linalg.norm(tok, axis=1, keepdims=True), 1e-12)
                states[i] = TokenStates(
                    tuple(_piece_texts(emb.tokenizer, seq[lo:hi])), tok.astype(np.float32)
                )
        return vectors, [s for s in states if s is not None]
