"""The pair judge: a small trained network that reads both prompts' token states.

It decides the candidates that clear the cosine floor and the guards (the guards keep their
veto where a difference is exact by nature: numbers, amounts, dates, ids, negation). The
embedder's forward pass already gives each prompt's last-layer token states (the same ones the
verifier's alignment features use); the judge aligns every token of one prompt softly with the
other's, compares each with its aligned partner, pools both directions and adds the verifier's
explainable pair features. Trained by ``python -m load.train_judge`` (seeded) on held-apart
parts of the paraphrase sets; shipped as ``judge.onnx`` (weights, well under a megabyte) and
``judge.json`` (per language: cosine floor and the measured curve the threshold is read from).
Runs in ONNX Runtime on one thread: a pair costs well under a millisecond beside the embedding.
"""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .decide import DEFAULT_MIN_HITS, DEFAULT_TARGET, CurvePoint, LanguagePoint, Policy, load_policy
from .lang import language
from .verifier import features

MAX_TOKENS = 64  # token states per prompt the judge reads (the first ones); training used the same
JUDGE_EMBEDDER = "e5-small"  # the embedder whose token states the shipped judge was trained on


def judge_features(a: str, b: str, cosine: float, align: np.ndarray) -> np.ndarray:
    """The judge's scalar inputs: the verifier's pair features and a Chinese flag."""
    x = features(a, b, cosine, align)
    return np.append(x, float(language(a) == "zh")).astype(np.float32)


def clip_states(states: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(states[:MAX_TOKENS], dtype=np.float32)


def session(model_file: Path, threads: int = 1) -> Any:
    """An ONNX Runtime session on the CPU with `threads` intra-op threads."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(model_file), so, providers=["CPUExecutionProvider"])


class Judge:
    """One ONNX Runtime session over ``judge.onnx``: ``score(states_a, states_b, x)``."""

    def __init__(self, model_file: Path, threads: int = 1) -> None:
        self.session = session(model_file, threads)
        self.model_file = model_file

    def score(self, states_a: np.ndarray, states_b: np.ndarray, x: np.ndarray) -> float:
        """Probability that the two prompts ask the same question (rows of states L2-normalised)."""
        if not len(states_a) or not len(states_b):
            return 0.0
        out = self.session.run(
            None,
            {
                "a": clip_states(states_a)[None],
                "b": clip_states(states_b)[None],
                "x": np.asarray(x, dtype=np.float32)[None],
            },
        )
        return float(np.asarray(out[0]).reshape(-1)[0])


def shipped_judge_dir() -> Path:
    return Path(str(resources.files("extproc.dedup")))


def load_judge(path: Path | None = None, threads: int = 1) -> Judge:
    return Judge((path or shipped_judge_dir()) / "judge.onnx", threads)


def judge_policy(
    embedder: str,
    target: float = DEFAULT_TARGET,
    path: Path | None = None,
    min_hits: int = DEFAULT_MIN_HITS,
) -> Policy:
    """The semantic policy with the judge deciding: per language the judge's cosine floor, and
    the loosest judge threshold whose selection precision has a 95% lower bound at or above
    ``target`` on at least ``min_hits`` hits. ``ValueError`` when the judge was trained on
    another embedder's token states (they would mean nothing to it)."""
    doc = json.loads(((path or shipped_judge_dir()) / "judge.json").read_text(encoding="utf-8"))
    if doc["embedder"] != embedder:
        raise ValueError(f"the pair judge reads {doc['embedder']} token states, not {embedder}'s")
    base = load_policy(embedder, 0.0)  # the verifier's points: kept only for their swaps/defaults
    langs: dict[str, LanguagePoint] = {}
    for lang, d in doc["languages"].items():
        curve = tuple(CurvePoint(**p) for p in d["curve"])
        old = base.languages.get(lang)
        if old is None:
            continue
        point = replace(
            old, min_cosine=float(d["min_cosine"]), curve=curve, swaps=tuple(d["swaps"]), threshold=None
        )
        langs[lang] = point.at(target, min_hits)
    return Policy(embedder, target, langs, scorer="judge")
