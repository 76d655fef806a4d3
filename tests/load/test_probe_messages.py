"""Why a request reaches the gate in three messages: the ways to save one fail on the shipped Envoy.
A new Envoy that lets one through fails this test, and the saving is worth taking then."""

from __future__ import annotations

from pathlib import Path

from load import probe_messages


def test_only_the_shipped_way_routes_on_the_gates_answer(tmp_path: Path) -> None:
    out = tmp_path / "probe.md"
    assert probe_messages.main(["--out", str(out)]) == 0
    lines = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    rows = {line.split(" | ")[0].strip("| "): line for line in lines}
    assert "| 200 " in rows["shipped: headers, then the body"]
    assert "routed by the processor" in rows["shipped: headers, then the body"]
    skipped = rows["headers skipped, sent as the body's attributes"]
    assert "not_routed" in skipped and "before the body reached the processor" in skipped
    buffered = rows["headers skipped, buffer filter before the router"]
    assert "not_routed" in buffered and "not applied" in buffered and "| yes |" in buffered
    assert "ignored" in rows["response headers skipped by the body's answer"]
    # The one way to a captured answer in one message costs what the gate cannot give up.
    early = rows["response headers skipped by the headers' answer"]
    assert "| 200 " in early and "request_headers, request_body, response_body |" in early
    assert "never reaches the client" in early
    assert "ignored" in rows["a processing mode of its own on the route the body's answer selects"]
    held = rows["headers' answer held until the body came"]
    assert "| 200 " in held and "override was ignored" in held and held.count("request_body") >= 1
