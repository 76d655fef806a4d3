"""Evaluate the shipped head: `python -m load.screen.evaluate --repos DIR`
writes load/results/screen_eval.md.

Held out: Tensor Trust's attacks, a source no head ever trained on. In-source: the test split
of the training sources. Benign references: the test split of each benign source, drawn wider
than training's (`--reference-per-source`): the draw is one shuffle, training takes the train
split of its first `--per-source` texts, and a text's split is fixed by its hash, so no test
text was trained on; a 0.7% threshold over 528 texts is set by the fourth highest alone.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np

from extproc.safety.pieces import MIDDLE_KEEP
from extproc.safety.pieces import SIZE as PIECE
from extproc.safety.screen import HEAD_FILE, load_head
from extproc.safety.unmask import WINDOW, reread

from .data import HELD_OUT
from .fit import detection_at
from .masks import MASKS, as_screened, padding_table, table
from .train import arguments, dataset
from .vectors import embedder

OUT = Path(__file__).resolve().parents[1] / "results" / "screen_eval.md"
FPRS = (0.001, 0.007, 0.01, 0.05)
REFERENCE_PER_SOURCE = 10_000
BOOTSTRAP = 1000
PADDED = 150  # attacks drawn for the padding table


def interval(pos: np.ndarray, neg: np.ndarray, fpr: float, seed: int) -> tuple[float, float]:
    """95% bootstrap interval of the detection at `fpr`, both samples resampled: the
    threshold's own uncertainty (a few texts at the benign tail set it) counts too."""
    rng = np.random.default_rng(seed)
    runs = [detection_at(rng.choice(pos, len(pos)), rng.choice(neg, len(neg)), fpr)[0]
            for _ in range(BOOTSTRAP)]
    lo, hi = np.quantile(runs, (0.025, 0.975))
    return float(lo), float(hi)


def main() -> None:
    p = arguments(__doc__ or "")
    p.add_argument("--head", type=Path, default=HEAD_FILE)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--reference-per-source", type=int, default=REFERENCE_PER_SOURCE,
                   help="benign texts drawn per benign source for the references (test split)")
    args = p.parse_args()
    head = load_head(args.head)
    trained_on = args.per_source
    args.per_source = max(args.per_source, args.reference_per_source)
    samples, x = dataset(args)
    texts = [s.text for s in samples]
    scores = as_screened(head, texts, x, args.cache)  # as the gate scores them (masked texts unmasked)
    src = np.array([s.source for s in samples])
    split = np.array([s.split for s in samples])
    lang = np.array([s.lang for s in samples])
    label = np.array([s.label for s in samples])
    test = split == "test"
    held = src == HELD_OUT  # every split: never trained on
    in_source = (label == 1) & ~held & test
    ref = {
        "en customer service (CLINC150)": (src == "clinc") & test,
        "zh customer service (ATEC)": (src == "atec") & test,
        "all benign, en": (label == 0) & test & (lang == "en"),
        "all benign, zh": (label == 0) & test & (lang == "zh"),
    }
    lines = [
        "# Injection screen: evaluation",
        "",
        f"Head: `{head.kind}` on `{head.embedder}` vectors"
        + (f" and the text's hashed character n-grams ({1 << head.lex_bits:,} buckets)"
           if head.lex is not None else "")
        + f", shipped threshold {head.threshold:.4f}. Commands: `python -m load.screen.train --repos DIR` "
        f"then `python -m load.screen.evaluate --repos DIR` (seed {args.seed}; data: load/screen/data.py, "
        "each repository at its pinned commit). The head trained on the train split of the first "
        f"{trained_on:,} texts of each benign source's shuffled draw; the benign references are the "
        f"test split of its first {args.per_source:,} (a text's split is fixed by its hash: no test "
        "text was trained on). "
        "The head's kind was chosen out of source, without the held-out source "
        "(`python -m load.screen.sweep`, load/results/screen_loso_catalogues.md).",
        "",
        "## Detection at fixed false-positive rates",
        "",
        "The threshold is set on each benign reference (its test split) at the false-positive "
        "rate of the column; detection is the share of injection texts above it. The held-out "
        "source's attacks are English (the few counted as zh hold Han characters in a quoted phrase); "
        "Chinese injections come from XSafety's goal hijacks and JailBench's wrappers, in the "
        "in-source rows by language below, and out of source in load/results/screen_loso.md "
        "(the xsafety and jailbench folds).",
        "",
        "| injections | benign reference (n) | " + " | ".join(f"@ {f:.1%} FP" for f in FPRS) + " |",
        "|---|---|" + "---|" * len(FPRS),
    ]
    parts = [(f"held-out source: {HELD_OUT} (n={int(held.sum())})", held),
             (f"in-source test split (n={int(in_source.sum())})", in_source)]
    parts += [(f"in-source test split, {lg} injections (n={int((in_source & (lang == lg)).sum())})",
               in_source & (lang == lg)) for lg in ("en", "zh")]
    for name, mask in parts:
        for ref_name, ref_mask in ref.items():
            cells = [f"{detection_at(scores[mask], scores[ref_mask], f)[0]:.1%}" for f in FPRS]
            lines.append(f"| {name} | {ref_name} ({int(ref_mask.sum())}) | " + " | ".join(cells) + " |")
    clinc = ref["en customer service (CLINC150)"]
    det = detection_at(scores[held], scores[clinc], 0.007)[0]
    lo, hi = interval(scores[held], scores[clinc], 0.007, args.seed)
    lines += ["", f"Held out at 0.7% false positives on CLINC150: {det:.1%}, 95% interval {lo:.1%}-{hi:.1%} "
              f"({BOOTSTRAP:,} bootstrap resamples of both the held-out injections and the reference, so "
              "the threshold's own uncertainty counts)."]
    asked_test = (src == "instructions") & test
    at_07 = detection_at(scores[held], scores[clinc], 0.007)[1]
    lines += ["", "Operating points (`screen.threshold`, or per tier `tier_thresholds`): share flagged "
              "at each threshold.", "",
              "| threshold | held-out attacks | test-split instructions | CLINC150 test |",
              "|---:|---:|---:|---:|"]
    for t, name in ((at_07, " (0.7% on CLINC150)"), (0.9, ""), (0.99, ""), (head.threshold, " (shipped)")):
        cells = [f"{(scores[m] > t).mean():.1%}" for m in (held, asked_test, clinc)]
        lines.append(f"| {t:.4g}{name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## At the shipped threshold ({head.threshold:.4f})",
        "",
        "| source | label | language | texts | flagged |",
        "|---|---|---|---|---|",
    ]
    for source in sorted(set(src.tolist())):
        for lab in (1, 0):
            for lg in ("en", "zh"):
                part = held if source == HELD_OUT else test
                mask = (src == source) & (label == lab) & (lang == lg) & part
                if mask.sum():
                    kind = "injection" if lab == 1 else "benign"
                    flagged = float((scores[mask] > head.threshold).mean())
                    lines.append(f"| {source} | {kind} | {lg} | {int(mask.sum())} | {flagged:.1%} |")
    benign_test = [s.text for s in samples if s.label == 0 and s.split == "test"]
    reread_n = sum(reread(t) is not None for t in benign_test)
    attacks = {f"held-out {HELD_OUT}": [t for t, h in zip(texts, held, strict=True) if h],
               "in-source test split": [t for t, i in zip(texts, in_source, strict=True) if i]}
    lines += ["", "## Masked attacks", "",
              "The same attacks disguised (" + ", ".join(MASKS) + "; spreading out joins each word's "
              "characters with a space and the words with three; leetspeak writes a e i o s t as "
              "4 3 1 0 5 7; base64 and hex encode the whole attack), flagged at the shipped threshold "
              "by the head alone and as the gate scores them (`extproc/safety/unmask.py`: as written "
              "and as unmasked, the higher score):", "",
              "| attacks | mask | head alone | the gate |", "|---|---|---:|---:|",
              *table(head, attacks, args.cache), "",
              f"Benign test texts the unmasking reads differently (each pays a second embedding): "
              f"{reread_n} of {len(benign_test):,}."]
    rng = random.Random(args.seed)
    some = {f"held-out {HELD_OUT}, a draw": rng.sample(attacks[f"held-out {HELD_OUT}"], PADDED),
            "in-source test split, a draw": rng.sample(attacks["in-source test split"], PADDED)}
    ordinary = {name: [t for t, m in zip(texts, ref_mask, strict=True) if m] for name, ref_mask in (
        ("customer-service questions", ref["en customer service (CLINC150)"]),
        ("zh customer-service questions", ref["zh customer service (ATEC)"]),
        ("general sentences (STS-B en)", (src == "stsb-en") & test),
        ("people's instructions", src == "instructions"))}
    lines += ["", "## Attacks behind ordinary text", "",
              f"{PADDED} attacks of each kind alone, then behind, before and between ordinary customer-"
              "service questions (CLINC150 test split, drawn at random); and long texts made of "
              "ordinary ones alone (200 each). Flagged at the shipped threshold when the text is read "
              "whole (as the gate did before) and as the gate reads it now: whole, unmasked and, "
              f"beyond {PIECE} characters, in pieces of at most {PIECE} (`extproc/safety/pieces.py`), and "
              f"beyond {WINDOW:,} the {MIDDLE_KEEP} pieces of the middle that the n-grams weigh highest.", "",
              "| texts | how | read whole | the gate |", "|---|---|---:|---:|",
              *padding_table(head, some, ordinary, args.cache, args.seed)]
    hard = (src == "hard") & (label == 0)
    missed = [s.text for s, sc in zip(samples, scores, strict=True)
              if s.source == "hard" and sc > head.threshold]
    hard_test = [s.text for s, sc in zip(samples, scores, strict=True)
                 if s.source == "hard" and s.split == "test" and sc > head.threshold]
    lines += ["", f"Hard benign texts flagged at the shipped threshold: {len(missed)} of {int(hard.sum())} "
              f"(all splits; {len(hard_test)} of {int((hard & test).sum())} in the test split, "
              "never trained on)."]
    lines += [f"- {t}" + (" (test split)" if t in hard_test else "") for t in missed]
    asked = (src == "instructions") & (label == 0)
    flagged_test = [s.text for s, sc in zip(samples, scores, strict=True)
                    if s.source == "instructions" and s.split == "test" and sc > head.threshold]
    n_flagged = int((scores[asked] > head.threshold).sum())
    lines += ["", "People's instructions to a model (self-instruct's seed and user-oriented tasks) flagged "
              f"at the shipped threshold: {n_flagged} of {int(asked.sum())} "
              f"(all splits; {len(flagged_test)} of {int((asked & test).sum())} in the test split, never "
              "trained on)."]
    lines += [f"- {t[:120]!r}" for t in flagged_test]
    lines += ["", "Cost per screened text beyond the embedding (the unmasking, the n-grams of the whole "
              "text and the MLP on its vector; a masked text's second embedding not counted), one call "
              "at a time on this machine:", "",
              "| texts | calls | p50 | p99 |", "|---|---:|---:|---:|"]
    service = [i for i, s in enumerate(samples) if s.source in ("clinc", "atec") and s.split == "test"]
    every_test = [i for i, s in enumerate(samples) if s.split == "test" or s.source == HELD_OUT]
    longest = sorted(range(len(samples)), key=lambda i: len(samples[i].text))[-50:]
    for name, idx in (("customer-service questions (CLINC150, ATEC test)", service),
                      ("every test text and the held-out source", every_test),
                      ("the 50 longest texts", longest)):
        timings = []
        for _ in range(max(1, 5000 // len(idx))):
            for i in idx:
                t0 = time.perf_counter()
                reread(texts[i])
                head.score(x[i], texts[i])
                timings.append(time.perf_counter() - t0)
        lines.append(f"| {name} | {len(timings):,} | {np.median(timings) * 1e6:.1f} µs | "
                     f"{np.quantile(timings, 0.99) * 1e6:.1f} µs |")
    lines.append("")
    model = embedder(threads=1)
    questions = [s.text for s in samples if s.source in ("clinc", "atec")][:64]
    model.embed_sync(questions[:4])  # warm
    embed_ms = []
    for q in questions:
        t0 = time.perf_counter()
        model.embed_sync([q])
        embed_ms.append((time.perf_counter() - t0) * 1000)
    lines += [f"The embedding itself (e5-small, one thread, one customer-service question at a time): "
              f"p50 {np.median(embed_ms):.1f} ms over {len(embed_ms)} questions on this machine.", ""]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
