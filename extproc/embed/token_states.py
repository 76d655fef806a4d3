"""Token states: a text's last-layer token vectors, read off the same forward pass as its
sentence embedding, and the per-process cache that keeps them for the dedup verifier.

The verifier's alignment features compare two prompts token by token. The query's states come
with its embedding (one model run gives both); a cached prompt's states are still here when
this process embedded it, as long as the byte budget keeps it. Nothing else is stored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

ENTRY_OVERHEAD = 256  # bytes counted per entry beyond its vectors (pieces, key, bookkeeping)


@dataclass(frozen=True)
class TokenStates:
    """One text's last-layer token vectors (L2-normalised rows), specials and prefix dropped,
    with the pieces they stand for (``▁how`` / ``##ing`` as the tokenizer spells them)."""

    pieces: tuple[str, ...]
    vectors: np.ndarray  # float32 [len(pieces), dim]
    # The states the embedder's top layers read ([bos], prefix, the first pieces, [eos]; see
    # ``keep_rows``), when the embedder was asked for them (the cross judge reads these).
    lower: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        extra = int(self.lower.nbytes) if self.lower is not None else 0
        return int(self.vectors.nbytes) + extra + ENTRY_OVERHEAD + sum(len(p) for p in self.pieces)


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


def layer_input(model: object, top: int) -> str:
    """The name of the hidden state the graph's top ``top`` transformer layers read: the output
    of the LayerNormalization that ends the layer below them (a built BERT graph has one after
    the embeddings and two per layer)."""
    graph = model.graph  # type: ignore[attr-defined]
    norms = [n for n in graph.node if n.op_type == "LayerNormalization"]
    layers = (len(norms) - 1) // 2
    if len(norms) != 1 + 2 * layers or not 1 <= top <= layers:
        raise ValueError(f"cannot find the input of the top {top} layers ({len(norms)} layer norms)")
    return str(norms[-(2 * top + 1)].output[0])


LOWER_TOKENS = 64  # content pieces per text whose lower states are kept (the judges read as many)


def keep_rows(n: int, skip: int, tokens: int = LOWER_TOKENS) -> list[int]:
    """Positions of a text's ``n`` ids whose lower states are kept: [bos], the prefix's pieces,
    the first ``tokens`` content pieces, and [eos]."""
    return [*range(min(skip + tokens, n - 1)), n - 1]


def split_states(
    hidden: np.ndarray,
    batch: Sequence[Sequence[int]],
    skip: int,
    spell: Callable[[Sequence[int]], list[str]],
    lower: np.ndarray | None = None,
) -> list[TokenStates]:
    """Each row's token states from a batch's hidden output [batch, width, dim]: the first
    ``skip`` positions ([bos]/[CLS] and the model's prefix) and the last ([eos]/[SEP]) dropped.
    ``lower``: the same batch's states below the top layers, kept as they are (``keep_rows``)."""
    h = np.asarray(hidden, dtype=np.float32)
    out: list[TokenStates] = []
    for row, seq in enumerate(batch):
        lo, hi = skip, len(seq) - 1
        tok = h[row, lo:hi]
        tok = tok / np.maximum(np.linalg.norm(tok, axis=1, keepdims=True), 1e-12)
        low = None
        if lower is not None:
            low = np.ascontiguousarray(lower[row, keep_rows(len(seq), skip)], dtype=np.float32)
        out.append(TokenStates(tuple(spell(seq[lo:hi])), tok.astype(np.float32), low))
    return out


class TokenStatesCache:
    """Token states per text, least recently used out beyond ``budget_bytes``.

    Filled by the batching embedder as it embeds (the query of every semantic lookup) and read
    by the matcher; one event loop touches it, so it takes no lock.
    """

    def __init__(self, budget_bytes: int = 64 << 20) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self._lru: OrderedDict[str, TokenStates] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.reads = 0  # texts run through the model again only for their states

    def __contains__(self, text: object) -> bool:
        return text in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def get(self, text: str) -> TokenStates | None:
        hit = self._lru.get(text)
        if hit is None:
            self.misses += 1
            return None
        self.hits += 1
        self._lru.move_to_end(text)
        return hit

    def put(self, text: str, states: TokenStates) -> None:
        old = self._lru.pop(text, None)
        if old is not None:
            self.bytes -= old.nbytes
        if states.nbytes > self.budget_bytes:
            return
        self._lru[text] = states
        self.bytes += states.nbytes
        while self.bytes > self.budget_bytes:
            _, gone = self._lru.popitem(last=False)
            self.bytes -= gone.nbytes
