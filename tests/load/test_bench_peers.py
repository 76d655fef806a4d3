"""The peer benchmark's pure parts: process-tree accounting from /proc, the configurations it
gives each gateway, the load scripts, and the result table. Nothing here installs or starts
LiteLLM."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from extproc.config import parse_config
from load import bench_peers as bp


def fake_proc(root: Path, procs: dict[int, tuple[int, list[int], int, int]]) -> Path:
    """/proc with pid -> (ppid, [utime, stime, cutime, cstime] in ticks, rss pages, pss kB)."""
    for pid, (ppid, cpu, rss, pss) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        # fields after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        # utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss
        after = ["S", str(ppid), *["0"] * 9, *map(str, cpu), "20", "0", "1", "0", "0", "0", str(rss)]
        (d / "stat").write_text(f"{pid} (a name) with) {' '.join(after)}\n")
        (d / "smaps_rollup").write_text(f"Rss: {rss * 4} kB\nPss: {pss} kB\n")
    (root / "self").mkdir()
    return root


def test_tree_accounting_sums_every_descendant_and_nothing_else(tmp_path: Path) -> None:
    tck = bp.CLK_TCK
    proc = fake_proc(
        tmp_path,
        {
            10: (1, [tck, tck, 0, 0], 100, 400),  # a gateway's root
            11: (10, [2 * tck, 0, tck, 0], 200, 800),  # its worker, which reaped a child
            12: (11, [0, tck, 0, 0], 300, 1200),  # a worker's child
            20: (1, [50 * tck, 0, 0, 0], 999, 9999),  # something else on the machine
        },
    )
    assert bp.tree_pids([10], proc) == [10, 11, 12]
    assert bp.tree_pids([10, 20, 99], proc) == [10, 11, 12, 20]  # a root gone is skipped
    assert bp.tree_cpu_seconds([10], proc) == 2 + 3 + 1
    rss, pss = bp.tree_memory_mb([10], proc)
    assert rss == 600 * bp.PAGE / 2**20
    assert pss == 2400 / 1024


def test_other_load_leaves_out_ours_and_wrk() -> None:
    tck = bp.CLK_TCK
    before = {1: ("python -m train", 0), 2: ("envoy", 0), 3: ("wrk -t1", 0), 4: ("sshd", 0)}
    after = {1: ("python -m train", 10 * tck), 2: ("envoy", 10 * tck), 3: ("wrk -t1", 10 * tck),
             4: ("sshd", 0), 5: ("new", 10 * tck)}
    assert bp.other_load(before, after, ours={2}, seconds=20) == [("python -m train", 0.5)]


def test_both_configurations_are_what_the_two_take() -> None:
    config = parse_config(yaml.safe_dump(bp.gate_config()))
    assert config.cache.semantic.enabled is False
    assert config.identity.api_keys[bp.BENCH_KEY].tenant != config.identity.api_keys[bp.LIMITED_KEY].tenant
    limited = config.ratelimit.tiers["standard"].tenant
    assert limited is not None and limited.burst == bp.LIMITED_RPM and limited.rate * 60 == bp.LIMITED_RPM
    peer = bp.litellm_config("http://127.0.0.1:9", 6400)
    assert peer["litellm_settings"]["cache_params"] == {"type": "redis", "host": "127.0.0.1", "port": 6400}
    assert peer["model_list"][0]["litellm_params"]["api_base"] == "http://127.0.0.1:9/v1"
    compile(bp.AUTH_MODULE % {bp.BENCH_KEY: bp.BENCH_RPM}, "auth.py", "exec")


def test_hits_are_one_body_and_misses_a_new_one_with_the_key() -> None:
    hit, miss = bp.wrk_script("hit", bp.BENCH_KEY, seed=1), bp.wrk_script("miss", None, seed=1)
    assert bp.FIXED in hit and f"Bearer {bp.BENCH_KEY}" in hit
    assert bp.UNIQUE in miss and "Authorization" not in miss
    assert bp.wrk_script("miss", None) != bp.wrk_script("miss", None)  # a fresh seed per window


def window(rnd: int, target: str, kind: str, conns: int, rps: float, p50: float, cpu_ms: float) -> bp.Window:
    return bp.Window(rnd, target, kind, conns, rps, p50, 2 * p50, 1000, 0, 0, cpu_ms, 0.1)


def test_the_table_gives_medians_ranges_ratios_and_added_latency() -> None:
    run = bp.Run(labels={"gate": "gate (2 processes + Envoy)", "litellm": "LiteLLM proxy (2 workers)"})
    for rnd, (g, p) in enumerate([(480, 120), (500, 150), (490, 140)]):
        run.windows += [window(rnd, "gate", "hit", 16, g, 30, 3.0)]
        run.windows += [window(rnd, "litellm", "hit", 16, p, 100, 12)]
        run.windows += [window(rnd, "gate", "miss", 16, 250, 60, 5)]
        run.windows += [window(rnd, "litellm", "miss", 16, 78, 200, 15)]
        for kind, base in (("hit", 0.2), ("miss", 0.3)):
            run.windows += [window(rnd, "sim", kind, 1, 4000, base, 0)]
            run.windows += [window(rnd, "gate", kind, 1, 200, base + 5 + rnd, 4)]
            run.windows += [window(rnd, "litellm", kind, 1, 60, base + 15, 13)]
    run.memory = {"gate": (335.0, 250.0), "litellm": (1013.0, 900.0)}
    args = argparse.Namespace(connections=16, duration=10, rounds=3)
    text = bp.report(run, args, "python -m load.bench_peers")
    assert "| hits: req/s at 16 connections | 490 (480–500) | 140 (120–150) | 0.29 |" in text
    assert "| CPU ms per hit (whole gateway, 16 connections) | 3.0 | 12.0 | 4.00 |" in text
    cores = "| cores the gateway used, hits at 16 connections |"
    assert f"{cores} 1.47 (1.44–1.50) | 1.68 (1.44–1.80) | 1.14 |" in text
    added = "| added p50 ms at 1 connection, hit (over the simulator direct) |"
    assert f"{added} +6.0 (+5.0–+7.0) | +15.0 | 2.50 |" in text
    assert "| resident memory MB (RSS summed over the processes) | 335 | 1,013 | 3.02 |" in text
    assert text.count("| simulator direct |") == 6


def test_the_benchmark_module_never_imports_litellm() -> None:
    assert "litellm" not in sys.modules
