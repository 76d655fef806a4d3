"""Train the injection screen's head: `python -m load.screen.train --repos DIR`.

Sources A, B (in-the-wild jailbreaks, jailbreak/injection templates) and the benign sets,
train split only; the held-out source (Tensor Trust) is never read here. Both heads are
fitted with the same seed; the one with the higher detection at the target false-positive
rate on the validation split is kept, and its threshold set there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from extproc.safety.screen import HEAD_FILE, Head

from .data import HELD_OUT, Sample, benign, injections
from .fit import detection_at, fit_logistic, fit_mlp, threshold_at
from .vectors import vectors

PARAPHRASE = Path(__file__).resolve().parents[3] / "shared" / "data" / "paraphrase"
CACHE = Path.home() / ".cache" / "llm-gate" / "screen" / "vectors.npz"


def arguments(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--repos", type=Path, required=True, help="REPOS/<owner>/<name>: git clones (data.py)")
    p.add_argument("--paraphrase", type=Path, default=PARAPHRASE)
    p.add_argument("--per-source", type=int, default=2500, help="benign texts drawn per benign source")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--cache", type=Path, default=CACHE)
    return p


def dataset(args: argparse.Namespace) -> tuple[list[Sample], np.ndarray]:
    samples = injections(args.repos) + benign(args.repos, args.paraphrase, args.per_source, args.seed)
    return samples, vectors([s.text for s in samples], args.cache)


def main() -> None:
    p = arguments(__doc__ or "")
    p.add_argument("--target-fpr", type=float, default=0.005, help="on benign validation texts")
    p.add_argument("--out", type=Path, default=HEAD_FILE)
    args = p.parse_args()
    samples, x = dataset(args)
    usable = np.array([s.source != HELD_OUT for s in samples])
    split = np.array([s.split for s in samples])
    y = np.array([s.label for s in samples], dtype=np.float64)
    train, val = usable & (split == "train"), usable & (split == "val")
    print(f"train: {int(y[train].sum())} injections, {int((1 - y[train]).sum())} benign; "
          f"val: {int(y[val].sum())} / {int((1 - y[val]).sum())}")
    best: tuple[float, Head] | None = None
    for head in (fit_logistic(x[train], y[train], args.seed), fit_mlp(x[train], y[train], args.seed)):
        s = head.scores(x[val])
        det, _ = detection_at(s[y[val] == 1], s[y[val] == 0], args.target_fpr)
        print(f"{head.kind}: validation detection {det:.3f} at {args.target_fpr:.2%} false positives")
        if best is None or det > best[0]:
            best = (det, head)
    assert best is not None
    head = best[1]
    s = head.scores(x[val])
    chosen = Head(head.kind, head.w1, head.b1, head.w2, head.b2,
                  threshold_at(s[y[val] == 0], args.target_fpr), head.embedder)
    chosen.save(args.out)
    print(f"kept {chosen.kind}, threshold {chosen.threshold:.4f} -> {args.out}")


if __name__ == "__main__":
    main()
