"""The load generator's traffic mix on a dry run, and the fuzz bodies (pure, nothing sent)."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from extproc.tokens import TokenCounter
from load import fuzz, loadgen
from load.mix import INVALID_KINDS, PARAPHRASE_DIR, Mix


def test_dry_run_has_the_seeds_proportions(capsys: pytest.CaptureFixture[str]) -> None:
    assert loadgen.main(["--dry-run", "--requests", "20000", "--seed", "3"]) == 0
    shares = json.loads(capsys.readouterr().out)
    assert shares["invalid"]["invalid"] == pytest.approx(0.10, abs=0.015)
    assert shares["size"] == pytest.approx({"short": 0.7, "medium": 0.2, "long": 0.1}, abs=0.02)
    assert shares["tier"] == pytest.approx({"vip": 0.1, "premium": 0.2, "standard": 0.7}, abs=0.02)
    assert shares["variant"] == pytest.approx({"exact": 0.6, "near": 0.2, "paraphrase": 0.2}, abs=0.02)
    assert set(shares["invalid_kinds"]) == {f"invalid:{k}" for k in INVALID_KINDS}
    assert min(shares["lang"].values()) > 0.3  # both Chinese and English
    assert shares["stream"]["True"] == pytest.approx(0.3, abs=0.02)
    assert 0.02 < shares["urgent"]["True"] < 0.08
    # Zipf: the same bodies come back (exact repeats) and many families are asked.
    assert shares["repeats"]["repeated_bodies"] > 0.4 and shares["repeats"]["families"] > 500


def test_sizes_are_counted_in_the_gates_tokens() -> None:
    counter, mix, rng = TokenCounter(), Mix(invalid_share=0.0), random.Random(2)
    seen = set()
    for _ in range(400):
        d = mix.draw(rng)
        tokens = counter.count([orjson.loads(d.body)["messages"][0]["content"]])
        bounds = {"short": (1, 512), "medium": (400, 4096), "long": (4096, 16_384)}[d.size]
        assert bounds[0] <= tokens < bounds[1], (d.size, tokens)
        seen.add(d.size)
    assert seen == {"short", "medium", "long"}


def test_paraphrase_families_come_from_the_shared_pairs_when_present() -> None:
    mix = Mix()
    ids = [f.id for f in mix.families]
    assert any("-t" in i for i in ids)  # generated templates, always
    if PARAPHRASE_DIR.exists():
        assert sum(1 for i in ids if "-d" in i) > 100
    assert all(len(f.variants) >= 2 for f in mix.families)


def test_every_invalid_kind_is_invalid() -> None:
    mix, rng = Mix(invalid_share=1.0), random.Random(4)
    for _ in range(200):
        d = mix.draw(rng)
        assert d.invalid and d.family == "-"
        if d.kind == "invalid:bad_json":
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(d.body)


def test_fuzz_bodies_reach_every_corner() -> None:
    rng = random.Random(5)
    bodies = [fuzz.body(rng) for _ in range(3000)]
    not_json = deep = nul = huge = 0
    for b in bodies:
        try:
            orjson.loads(b)
        except orjson.JSONDecodeError:
            not_json += 1
        deep += b.count(b"[[") + b.count(b'{"a":{"a":') > 100
        nul += b"\\u0000" in b
        huge += len(b) > 100_000
    assert not_json > 30 and deep > 5 and nul > 30 and huge > 30
    assert len(set(bodies)) > 2700
