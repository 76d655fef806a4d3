"""Which head generalises beyond its sources: `python -m load.screen.sweep --repos DIR`
writes load/results/screen_loso.md.

Leave one source out: each fold takes one training source's injections out of training (all
its splits; the benign sources stay) and measures detection on them at 0.7% false positives
on the benign references (the test split of CLINC150, en, and of ATEC, zh) and at 0.5% on
the benign validation split (the rate the shipped threshold is set at). The candidates: the
MLP over the embedding alone, and with the n-gram model's logit added at several weights and
L2 strengths; each with the classes weighted equally, and within the benign class (or both
classes) each source weighted equally too. With `--reading`, the MLP may also read the max over the
text's token states, alone or beside the embedding (load/screen/vectors.py).
The rule, fixed before the folds were run: the candidate with the highest worst-fold
detection at 0.7% FP against either customer-service reference is shipped
(`load.screen.train`'s defaults); on a tie, the one listed first (fewer averaged MLPs).
One pick was not shipped, in the open: the token max alone (docs/safety.md), which won by
three texts of one 48-text fold and lost on most others.
The held-out source (Tensor Trust) plays no part in the choice; its columns show how far
each fold's head carries.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import numpy as np

from extproc.safety.screen import with_shape

from .data import HELD_OUT
from .fit import Lexical, average, by_source, detection_at, fit_lexical, fit_mlps
from .train import HIDDEN, LEX_BITS, STEPS, arguments, dataset
from .vectors import max_vectors

OUT = Path(__file__).resolve().parents[1] / "results" / "screen_loso.md"
FOLDS = ("itw", "templates", "deepset", "jbb", "promptmap", "llmguard", "xsafety", "hackaprompt", "jailbench",
         "pyrit", "pallms", "gandalf", "cyberseceval", "arcanum", "tasktracker")
L2S = (1e-4,)  # 1e-5 and 1e-3 had worse worst folds (67.7%, 73.0%) in a wider run
WEIGHTS = (2.0, 4.0, 6.0, 8.0, 12.0)
BALANCE: dict[str, tuple[int, ...]] = {  # sample weights: each class equal, and these classes' sources too
    "classes": (), "benign sources": (0,), "all sources": (0, 1)}
READINGS = {  # what the MLP reads of the model's last layer: its name, and its tag in a head's name
    "mean": ("embedding", ""),  # the sentence embedding, as the gate computes it
    "max": ("token max", " on token max"),  # the max over the token states (load/screen/vectors.py)
    "mean+max": ("embedding + token max", " + token max")}


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return np.asarray(np.log(p) - np.log1p(-p))


def main() -> None:
    p = arguments(__doc__ or "")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--balance", action="append", choices=tuple(BALANCE), help="only these (repeatable)")
    p.add_argument("--weight", action="append", type=float, help="only these n-gram weights (repeatable)")
    p.add_argument("--members", action="append", type=int,
                   help="MLPs averaged per head, seeds seed, seed + 1, ... (repeatable; default 1)")
    p.add_argument("--hidden", action="append", type=int,
                   help="the MLP's hidden units (repeatable; default 64)")
    p.add_argument("--steps", action="append", type=int,
                   help="the MLP's full-batch training steps (repeatable; default 600)")
    p.add_argument("--shape", action="append", choices=("with", "without"),
                   help="only heads with or without the shape features (repeatable; default both)")
    p.add_argument("--reading", action="append", choices=tuple(READINGS),
                   help="what the MLP reads of the model: the sentence embedding (the gate's), the max "
                        "over the token states, or both side by side (repeatable; default mean)")
    args = p.parse_args()
    balances = {k: v for k, v in BALANCE.items() if not args.balance or k in args.balance}
    weights = tuple(args.weight or WEIGHTS)
    members = tuple(args.members or (1,))
    hiddens = tuple(args.hidden or (HIDDEN,))
    steps = tuple(args.steps or (STEPS,))
    samples, x = dataset(args)
    texts = [s.text for s in samples]
    shapes = args.shape or ["without", "with"]
    inputs: dict[tuple[str, str], np.ndarray] = {}  # (what the MLP reads, its tag in a head's name)
    for r in args.reading or ["mean"]:
        xr = x if r == "mean" else max_vectors(texts, args.cache)  # cached on disk after the first
        xr = np.hstack([x, xr]) if r == "mean+max" else xr
        what, tag = READINGS[r]
        if "without" in shapes:
            inputs[(what, tag)] = xr
        if "with" in shapes:
            inputs[(f"{what} + shape", f"{tag} + shape")] = with_shape(xr, texts)
    src = np.array([s.source for s in samples])
    split = np.array([s.split for s in samples])
    y = np.array([s.label for s in samples], dtype=np.float64)
    lang = np.array([s.lang for s in samples])
    lex = Lexical(texts, LEX_BITS)
    clinc, atec = (src == "clinc") & (split == "test"), (src == "atec") & (split == "test")
    benign_val = (y == 0) & (split == "val")
    held = src == HELD_OUT
    hard_test = (src == "hard") & (split == "test")
    rows: list[str] = []
    worst: dict[str, float] = {}
    for left_out in (f for f in FOLDS if (src == f).any()):
        out = (src == left_out) & (y == 1)
        train = ~held & (split == "train") & ~out
        t0 = time.perf_counter()
        logits = {}
        for balance, labels in balances.items():
            sw = by_source(y[train], src[train], labels)
            z_lex = {}
            for l2 in L2S:
                w, b = fit_lexical(lex.subset(train), y[train], l2=l2, sw=sw)
                z_lex[l2] = lex.dot(w) + b  # what combine(mlp, (w, b), weight) scores, without hashing again
            for ((what, tag), xs), h, n in itertools.product(inputs.items(), hiddens, steps):
                mlps = fit_mlps(xs[train], y[train], args.seed, max(members), sw=sw, hidden=h, steps=n)
                for m in members:
                    z_mlp = logit(average(mlps[:m]).scores(xs))
                    mlp = f"MLP {h}" + (f" ({n} steps)" if args.steps else "")
                    mlp += f" × {m} seeds" if m > 1 else ""
                    logits[f"{mlp} ({what}); {balance} weighted"] = z_mlp
                    logits.update({
                        f"{mlp}{tag} + {k:g} × n-grams (L2 {l2:g}); {balance} weighted": z_mlp + k * z
                        for l2, z in z_lex.items() for k in weights})
        for name, s in logits.items():
            at_val, t_val = detection_at(s[out], s[benign_val], 0.005)
            det = [at_val,
                   detection_at(s[out], s[clinc], 0.007)[0], detection_at(s[out], s[atec], 0.007)[0],
                   detection_at(s[held], s[clinc], 0.007)[0], detection_at(s[held], s[atec], 0.007)[0]]
            worst[name] = min(worst.get(name, 1.0), det[1], det[2])
            # Each language against its own customer-service reference (the rule reads both above).
            own = [detection_at(s[out & (lang == lg)], s[ref], 0.007)[0] if (out & (lang == lg)).any()
                   else float("nan") for lg, ref in (("en", clinc), ("zh", atec))]
            cells = " | ".join("-" if d != d else f"{d:.1%}" for d in det + own)
            cells += f" | {int((s[hard_test] > t_val).sum())}"
            rows.append(f"| {left_out} ({int(out.sum())}) | {name} | {cells} |")
        print("\n".join(rows[-len(logits):]), f"\n({time.perf_counter() - t0:.0f} s)", flush=True)
    chosen = max(worst, key=lambda k: worst[k])
    grid = "".join(f" --balance '{b}'" for b in args.balance or ())
    grid += "".join(f" --weight {w:g}" for w in args.weight or ())
    grid += "".join(f" --members {m}" for m in args.members or ())
    grid += "".join(f" --hidden {h}" for h in args.hidden or ())
    grid += "".join(f" --steps {n}" for n in args.steps or ())
    grid += "".join(f" --shape {w}" for w in args.shape or ())
    grid += "".join(f" --reading {r}" for r in args.reading or ())
    grid += " --with-extra" if args.with_extra else ""
    grid += f" --out {os.path.relpath(args.out, OUT.parents[2])}" if args.out.resolve() != OUT else ""
    lines = [
        "# Injection screen: leave one source out",
        "",
        f"Command: `python -m load.screen.sweep --repos DIR{grid}` (seed {args.seed}, "
        f"{args.per_source} benign texts drawn per benign source; data: load/screen/data.py). "
        "Each row's head never saw the "
        "left-out source's injections; the benign sources are in every fold (train split). "
        "Detection is over the left-out source's injections (every split); the threshold is set at "
        "the false-positive rate of the column on that benign reference.",
        "",
        "| left out (injections) | head | @ 0.5% FP, benign val | @ 0.7% FP, CLINC150 (en) "
        "| @ 0.7% FP, ATEC (zh) | Tensor Trust @ 0.7% FP, CLINC150 | Tensor Trust @ 0.7% FP, ATEC "
        "| its en injections @ 0.7% FP, CLINC150 | its zh injections @ 0.7% FP, ATEC "
        f"| hard benign (test split, {int(hard_test.sum())}) flagged at the benign-val 0.5% threshold |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Worst fold at 0.7% FP against either customer-service reference:",
        "",
        "| head | worst fold |",
        "|---|---:|",
        *[f"| {name} | {w:.1%} |" for name, w in sorted(worst.items(), key=lambda kv: -kv[1])],
        "",
        f"Chosen (highest worst fold): {chosen}.",
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
