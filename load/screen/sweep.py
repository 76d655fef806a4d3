"""Which head generalises beyond its sources: `python -m load.screen.sweep --repos DIR`.

Each fold leaves one training source's injections out of training and measures detection on
them at 0.5% false positives on the benign validation split. The held-out source is never
read here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from extproc.safety.screen import Head

from .data import HELD_OUT
from .fit import detection_at, fit_logistic, fit_mlp
from .train import arguments, dataset

Fit = Callable[[np.ndarray, np.ndarray, int], Head]
HEADS: dict[str, Fit] = {
    "logistic, L2 1e-4": lambda x, y, seed: fit_logistic(x, y, seed),
    "logistic, L2 1e-2": lambda x, y, seed: fit_logistic(x, y, seed, l2=1e-2),
    "MLP 64, L2 1e-4": lambda x, y, seed: fit_mlp(x, y, seed),
    "MLP 64, L2 1e-2": lambda x, y, seed: fit_mlp(x, y, seed, l2=1e-2),
}


def main() -> None:
    args = arguments(__doc__ or "").parse_args()
    samples, x = dataset(args)
    src = np.array([s.source for s in samples])
    split = np.array([s.split for s in samples])
    y = np.array([s.label for s in samples], dtype=np.float64)
    benign_val = (y == 0) & (split == "val")
    print("| left out | head | detection at 0.5% FP |\n|---|---|---|")
    for left_out in ("deepset", "templates"):
        out = (src == left_out) & (y == 1)
        train = (src != HELD_OUT) & (split == "train") & ~out
        for name, fit in HEADS.items():
            scores = fit(x[train], y[train], args.seed).scores(x)
            det, _ = detection_at(scores[out], scores[benign_val], 0.005)
            print(f"| {left_out} | {name} | {det:.1%} |", flush=True)


if __name__ == "__main__":
    main()
