"""Sentence embeddings for the semantic dedup layer (ONNX Runtime, no PyTorch at run time)."""

from .batching import BatchingEmbedder, BatchReport, BatchStats, EmbedShedError
from .encoder import Embedder, OnnxEmbedder, ReadPolicy
from .loader import load_embedder, shared_embedder
from .paths import default_model_dir

__all__ = [
    "BatchReport",
    "BatchStats",
    "BatchingEmbedder",
    "EmbedShedError",
    "Embedder",
    "OnnxEmbedder",
    "ReadPolicy",
    "default_model_dir",
    "load_embedder",
    "shared_embedder",
]
