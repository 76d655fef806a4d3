"""What reading a long text in pieces costs: `python -m load.screen.cost --repos DIR` writes
load/results/screen_pieces_cost.md.

Texts made of CLINC150 questions (seeded draw) at several lengths, embedded with the screen's
embedder on one thread: the text read whole (its first `MAX_TOKENS` tokens) against its pieces
in one batch, as `Screener.score` sends them (`readings`: past the window, the middle's
strongest pieces too), and the time `readings` itself takes (the unmasking, the cutting and,
for a middle, weighing its pieces by their n-grams; a text past the window does this in a
worker thread, off the event loop). Medians of `--runs` texts per length.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from extproc.safety.pieces import MIDDLE_KEEP, SIZE
from extproc.safety.screen import load_head
from extproc.safety.screener import readings

from .data import _show
from .vectors import embedder

OUT = Path(__file__).resolve().parents[1] / "results" / "screen_pieces_cost.md"
LENGTHS = (200, 500, 1000, 2000, 4000, 8000, 16_000, 64_000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repos", type=Path, required=True, help="REPOS/<owner>/<name>: git clones (data.py)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    clinc = json.loads(_show(args.repos, "clinc/oos-eval", "data/data_full.json"))
    questions = [t + "?" for t, _ in clinc["test"]]
    rng = random.Random(args.seed)
    model, head = embedder(threads=1), load_head()
    model.embed_sync(["warm up"])

    def text(chars: int) -> str:
        out: list[str] = []
        while sum(len(t) + 1 for t in out) < chars:
            out.append(rng.choice(questions))
        return " ".join(out)[:chars]

    lines = ["# The screen's pieces: cost", "",
             f"`python -m load.screen.cost --repos DIR` (seed {args.seed}): texts of CLINC150 questions, "
             f"one embedding thread, medians of {args.runs} texts. A text over {SIZE} characters is read "
             f"whole and in pieces of at most {SIZE} (`extproc/safety/pieces.py`), all in one batch; past "
             f"the window, the {MIDDLE_KEEP} pieces of its middle that the n-grams weigh highest too. "
             "Choosing: the time the readings take to find (unmasking, cutting, weighing).", "",
             "| characters | pieces | read whole | its pieces | pieces / whole | choosing |",
             "|---:|---:|---:|---:|---:|---:|"]
    for chars in LENGTHS:
        whole, parts, count, choosing = [], [], [], []
        for _ in range(args.runs):
            t = text(chars)
            c0 = time.perf_counter()
            _, ps = readings(t, head)
            choosing.append((time.perf_counter() - c0) * 1000)
            t0 = time.perf_counter()
            model.embed_sync([t])
            t1 = time.perf_counter()
            if ps:
                model.embed_sync(ps)
            t2 = time.perf_counter()
            whole.append((t1 - t0) * 1000)
            parts.append((t2 - t1) * 1000)
            count.append(len(ps))
        w, q = float(np.median(whole)), float(np.median(parts))
        lines.append(f"| {chars:,} | {int(np.median(count))} | {w:.1f} ms | {q:.1f} ms | {q / w:.1f} "
                     f"| {float(np.median(choosing)):.1f} ms |")
        print(lines[-1], flush=True)
    lines.append("")
    args.out.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
