"""The LSH centre: `llm-gate lsh-center` writes it, the config names it, the gate and
`check-config` refuse one that does not fit, and on template-like traffic it spreads the
entries over more buckets."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from extproc.cache.center import CenterError, meta_path, read_center, write_center
from extproc.cache.semantic import Matcher
from extproc.cache.setup import load_matcher, load_matchers
from extproc.cache.store import MemoryStore, Put
from extproc.cli import main
from extproc.config import CacheSemantic, SemanticProfile
from extproc.metrics import Metrics
from load.lsh_recall import TEMPLATE

SUBJECTS = ["my order", "the invoice", "a refund", "my password", "the delivery", "my account",
            "a gift card", "the warranty", "my subscription", "the return label"]
ASKS = ["How do I cancel", "Where can I find", "Can you help me change", "Why was I charged twice for",
        "When will I get", "Is it possible to transfer"]
# 60 prompts sharing one long template, the traffic whose vectors sit in a narrow cone.
TEMPLATED = [TEMPLATE["en"].format(f"{ask} {subject}?") for ask in ASKS for subject in SUBJECTS]


def centre(tmp_path: Path, values: object, embedder: str = "minilm", dim: int | None = None) -> Path:
    """A centre file as the command writes it, with the given values (any shape, any dtype)."""
    path = tmp_path / "center.npy"
    array = np.asarray(values)
    np.save(path, array)
    meta_path(path).write_text(json.dumps({"embedder": embedder, "dim": dim or int(array.size)}))
    return path


def gate_yaml(tmp_path: Path, **semantic: object) -> Path:
    cfg = {"cache": {"semantic": {k: str(v) if isinstance(v, Path) else v for k, v in semantic.items()}}}
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def unit(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return v / np.linalg.norm(v) * 0.8


def jsonl(path: Path, texts: list[str]) -> Path:
    bodies = [{"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": t}]} for t in texts]
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    return path


@pytest.mark.parametrize(
    ("values", "meta", "expected"),
    [
        (np.zeros((2, 384), np.float32), None, "shape (2, 384); a centre is one vector"),
        (np.array([0.1, np.nan, np.inf, 0.2], np.float32), None, "2 of its 4 values are not finite"),
        (np.arange(384, dtype=np.int64), None, "int64 values"),
        (np.full(384, 0.2, np.float32), None, "norm is 3.919"),
        (np.zeros(384, np.float32), {"embedder": "minilm", "dim": 768}, "holds 384 values; center.npy.json"),
        (np.zeros(384, np.float32), {"embedder": "e5-small", "dim": 384},
         "a centre of the 'e5-small' embedder cannot be used with the 'minilm' embedder"),
        (np.zeros(384, np.float32), {"embedding": "minilm"}, "must be a JSON object with 'embedder'"),
    ],
)
def test_check_config_names_what_is_wrong_with_a_centre(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], values: np.ndarray, meta: object, expected: str
) -> None:
    path = centre(tmp_path, values)
    if meta is not None:
        meta_path(path).write_text(json.dumps(meta))
    gate = gate_yaml(tmp_path, lsh_center_file=path)
    assert main(["check-config", str(gate)]) == 1
    out = capsys.readouterr().out
    assert f"{gate}: cache.semantic.lsh_center_file: {path}" in out and expected in out, out
    assert "1 problem(s)" in out


def test_check_config_refuses_a_missing_centre_its_description_or_a_non_npy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = gate_yaml(tmp_path, lsh_center_file=tmp_path / "nowhere.npy")
    assert main(["check-config", str(gate)]) == 1
    assert "nowhere.npy: cannot read it (No such file or directory)" in capsys.readouterr().out
    path = centre(tmp_path, unit(384))
    meta_path(path).unlink()
    assert main(["check-config", str(gate_yaml(tmp_path, lsh_center_file=path))]) == 1
    assert "center.npy.json: missing; it names the embedder" in capsys.readouterr().out
    path.write_text("0.1 0.2 0.3\n")
    assert main(["check-config", str(gate_yaml(tmp_path, lsh_center_file=path))]) == 1
    assert "not a .npy file" in capsys.readouterr().out
    write_center(path, unit(384), "minilm", 10)
    assert main(["check-config", str(gate_yaml(tmp_path, lsh_center_file=path))]) == 0
    assert "OK" in capsys.readouterr().out


def test_a_profile_keeps_the_centre_of_its_own_embedder_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "minilm.npy"
    write_center(mine, unit(384), "minilm", 10)
    cfg = CacheSemantic(lsh_center_file=mine, profiles=[
        SemanticProfile(tenant="a", target_precision=0.8), SemanticProfile(tenant="b", embedder="e5-small"),
    ])
    assert cfg.for_profile(cfg.profiles[0]).lsh_center_file == mine  # the same embedder: the same centre
    assert cfg.for_profile(cfg.profiles[1]).lsh_center_file is None  # never applied to e5-small
    # A profile's own centre must be one of its embedder's: the error names both.
    gate = tmp_path / "gate.yaml"
    gate.write_text(yaml.safe_dump({"cache": {"semantic": {
        "lsh_center_file": str(mine),
        "profiles": [{"tenant": "cn", "embedder": "e5-small", "lsh_center_file": str(mine)}],
    }}}))
    assert main(["check-config", str(gate)]) == 1
    out = capsys.readouterr().out
    assert "cache.semantic.profiles.0.lsh_center_file: " in out
    assert "a centre of the 'minilm' embedder cannot be used with the 'e5-small' embedder" in out
    assert "1 problem(s)" in out  # the default's own centre fits


def test_the_gate_refuses_at_start_a_centre_of_another_dimension(tmp_path: Path, model_dir: Path) -> None:
    path = centre(tmp_path, unit(64))  # says minilm, but holds 64 values: the model gives 384
    cfg = CacheSemantic(model_dir=model_dir, target_precision=0.8, lsh_center_file=path)
    with pytest.raises(CenterError, match="a 64-dimensional centre cannot be used with the 'minilm' "
                                          "embedder, whose vectors have 384 dimensions"):
        load_matcher(cfg, Metrics())
    meta_path(path).unlink()
    with pytest.raises(CenterError, match=r"center\.npy\.json: missing"):  # before any model loads
        load_matcher(cfg.model_copy(update={"model_dir": tmp_path / "no-models"}), Metrics())


def test_lsh_center_writes_the_mean_embedding_of_a_prompt_file(
    tmp_path: Path, model_dir: Path, minilm: object, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = gate_yaml(tmp_path, model_dir=model_dir)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TEMPLATED[:5]).replace("\n\n", " ") + "\n\n")
    out = tmp_path / "center.npy"
    assert main(["lsh-center", "--config", str(gate), "--prompts", str(prompts), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    vector = read_center(out, "minilm", 384)  # what the gate will accept
    assert vector.dtype == np.float32 and vector.shape == (384,)
    assert "mean of 5 prompts' 'minilm' embeddings (384 dims)" in printed
    assert f"norm {np.linalg.norm(vector):.4f}" in printed
    expected = minilm.embed_sync(prompts.read_text().split("\n")[:5]).mean(axis=0)  # type: ignore[attr-defined]
    assert np.allclose(vector, expected, atol=1e-6)


def test_lsh_center_reads_jsonl_request_bodies_and_refuses_nothing_to_embed(
    tmp_path: Path, model_dir: Path, minilm: object, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = gate_yaml(tmp_path, model_dir=model_dir)
    bodies = jsonl(tmp_path / "requests.jsonl", TEMPLATED[:3])  # multi-line prompts: one body a line
    with bodies.open("a") as f:  # the cache compares no text here: not used
        f.write(json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}) + "\n")
    out = tmp_path / "c.npy"
    assert main(["lsh-center", "--config", str(gate), "--prompts", str(bodies), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mean of 3 prompts'" in printed and "not used: 1 request(s)" in printed
    expected = minilm.embed_sync(TEMPLATED[:3]).mean(axis=0)  # type: ignore[attr-defined]
    assert np.allclose(read_center(out, "minilm"), expected, atol=1e-6)

    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    assert main(["lsh-center", "--config", str(gate), "--prompts", str(empty), "--out", str(out)]) == 1
    assert f"{empty}: no prompts to embed" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\nnot json\n')
    assert main(["lsh-center", "--config", str(gate), "--prompts", str(bad), "--out", str(out)]) == 1
    assert f"{bad}:2: not a JSON request body" in capsys.readouterr().err


async def test_a_configured_centre_spreads_template_traffic_over_more_buckets(
    tmp_path: Path, model_dir: Path
) -> None:
    """Fit on half the prompts, store the other half: through the gate's own matcher (the
    configured embedder) and store, as the cache stage does."""
    gate = gate_yaml(tmp_path, model_dir=model_dir)
    center = tmp_path / "center.npy"
    fit = jsonl(tmp_path / "fit.jsonl", TEMPLATED[::2])
    assert main(["lsh-center", "--config", str(gate), "--prompts", str(fit), "--out", str(center)]) == 0
    base = CacheSemantic(model_dir=model_dir, target_precision=0.8)
    plain = load_matchers(base, Metrics())
    centred = load_matchers(base.model_copy(update={"lsh_center_file": center}), Metrics())
    try:
        assert plain.default is not None and centred.default is not None
        assert plain.default.lsh.tag != centred.default.lsh.tag

        async def spread(m: Matcher) -> tuple[int, int, int]:
            store, buckets = MemoryStore(), Counter[str]()
            texts = TEMPLATED[1::2]
            for i, text in enumerate(texts):
                vector = await m.embedder.embed(text)
                bands = tuple(m.lsh.band_keys(vector))
                buckets.update(bands)
                await store.put(Put("s", str(i), b"a", 60_000, 100, "t", "m", vector.tobytes(), bands))
            found = 0
            for i, text in enumerate(texts):  # each stored prompt is still found, at cosine 1
                vector = await m.embedder.embed(text)
                ranked = m.ranked(vector, await store.candidates("s", m.lsh.band_keys(vector), 128))
                found += ranked[0][0] == str(i) and ranked[0][1] > 0.9999
            return len(buckets), max(buckets.values()), found

        (plain_keys, plain_top, plain_found) = await spread(plain.default)
        (centred_keys, centred_top, centred_found) = await spread(centred.default)
    finally:
        await plain.aclose()
        await centred.aclose()
    # Measured: 212 bucket names and a largest bucket of 28 of the 30 prompts; centred 429 and 8.
    assert centred_keys >= 1.5 * plain_keys, (plain_keys, centred_keys)
    assert centred_top * 2 <= plain_top, (plain_top, centred_top)
    assert plain_found == centred_found == 30
