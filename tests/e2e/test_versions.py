"""Versions through real Envoy: two gate workers, a simulator per version."""

from __future__ import annotations

import asyncio
import time

import httpx

from extproc.versions.choose import caller_key, choose_version, shares
from extproc.versions.settings import VersionedModel
from load.canary import CHAT, MODEL, drive, summarize, versions_config, versions_stack


def test_weighted_sticky_versions_and_the_trusted_canary_header() -> None:
    config = versions_config(weight=15)
    with versions_stack(config) as stack:
        answers = asyncio.run(drive(stack.url, callers=1000, requests=3000))
        s = summarize(answers)
        assert s["failed"] == 0 and s["callers"] == 1000
        assert s["callers_on_two_versions"] == 0 and s["served_elsewhere"] == 0
        assert abs(s["canary_share"] - 0.15) <= 0.015
        # Every caller got exactly the version the pure choice names for it.
        table = shares(VersionedModel.model_validate(config["routing"]["versions"][MODEL]))
        for a in answers[:500]:
            assert a.version == choose_version(table, caller_key("anonymous", a.user, MODEL)).name

        body = {"model": MODEL, "messages": [{"role": "user", "content": "canary please"}]}
        with httpx.Client(base_url=stack.url, timeout=20) as client:
            for i in range(20):
                tester = client.post(CHAT, json=body, headers={
                    "authorization": "Bearer sk-tester", "x-canary": "true", "x-user-id": f"t{i}"})
                assert tester.status_code == 200
                assert (tester.headers["x-gate-version"], tester.headers["x-sim-name"]) == ("v2", "canary")
            other = [
                client.post(CHAT, json=body, headers={
                    "authorization": "Bearer sk-user", "x-canary": "true", "x-user-id": f"u{i}"})
                for i in range(40)
            ]
            expected = [choose_version(table, caller_key("acme", f"u{i}", MODEL)).name for i in range(40)]
            assert [r.headers["x-gate-version"] for r in other] == expected  # the header changed nothing
            assert "v1" in expected
        deadline = time.monotonic() + 2  # access lines are written in batches, every 0.1 s
        while '"version":"v2"' not in stack.log("gate") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert '"version":"v2"' in stack.log("gate")  # the access line names the version
