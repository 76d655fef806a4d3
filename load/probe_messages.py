"""Probe: can a request reach the gate in fewer ext_proc messages? What Envoy does, measured.

A request costs the gate a headers message, a body message and a response-headers message
(and the body of an answer it captures); each message is a gRPC round trip through Python,
the largest part of the hop's cost. This probe runs the
shipped Envoy bootstrap with a recording ext_proc that routes like the gate (it sets
`x-gate-cluster` with `clear_route_cache` in its answer to the body) and tries the ways to
save a message:

- `request_header_mode: SKIP`, the headers the gate reads sent as `request_attributes` of the
  body message (Envoy sends attributes with the first message of a phase);
- the same with Envoy's buffer filter before the router, so the router waits for the body;
- a `mode_override` (response headers SKIP) in the answer to the body, where the gate first
  knows whether it needs the answer;
- the same override in the answer to the headers, the answer's body BUFFERED and its status
  sent as a `response_attributes` of that body: a captured answer in one message, if the
  gate could choose before the body and could still set the client's headers;
- a processing mode of its own (`ExtProcPerRoute`: the answer's headers skipped, its body
  BUFFERED) on the route the body's answer selects;
- the headers' answer held until the body has come (`send_body_without_waiting_for_header_response`,
  the body STREAMED), so that the override is chosen knowing the body.

    python -m load.probe_messages   (writes load/results/probe_messages.md)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc import envoy_config
from extproc.wire import Continue, continue_response

from .bench_gate import spawn, upstream_listener
from .stack import LOOPBACK, envoy_binary, envoy_command, exit_on_sigterm, free_port, wait_http

RESULTS = Path(__file__).parent / "results" / "probe_messages.md"
Mode = processing_mode_pb2.ProcessingMode
BUFFER = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer"
PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
ATTRIBUTES = ["request.method", "request.path", "request.headers['content-type']"]
MARK = "x-gate-cache"  # a header the processor sets on the client's answer in its last answer


@dataclass
class Way:
    name: str
    skip_headers: bool = False
    buffer_filter: bool = False
    override_in_body: bool = False  # the body's answer asks Envoy to skip the response headers
    override_in_headers: bool = False  # the headers' answer does
    hold_headers: bool = False  # the headers' answer waits for the body (which then streams)
    per_route: bool = False  # the route the body's answer selects has a processing mode of its own


@dataclass
class Recorder(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Answers like the gate's routing: the body's answer sets `x-gate-cluster: primary`."""

    way: Way
    seen: list[str] = field(default_factory=list)
    attributes: set[str] = field(default_factory=set)
    response_attributes: set[str] = field(default_factory=set)

    async def Process(  # noqa: N802 - the gRPC method name
        self, requests: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        chunks = 0  # body messages not answered yet (held with the headers' answer)
        async for request in requests:
            phase = request.WhichOneof("request")
            self.seen.append(phase)
            into = self.response_attributes if phase.startswith("response") else self.attributes
            for found in request.attributes.values():
                into.update(found.fields)
            if phase == "request_headers":
                if not self.way.hold_headers:
                    yield self.headers_answer(route=False)
            elif phase == "request_body" and self.way.hold_headers:
                chunks += 1
                if request.request_body.end_of_stream:
                    yield self.headers_answer(route=True)
                    for _ in range(chunks):
                        yield pb.ProcessingResponse(request_body=pb.BodyResponse())
            elif phase == "request_body":
                answer = pb.ProcessingResponse()
                answer.CopyFrom(continue_response(phase, Continue(set_headers={"x-gate-cluster": "primary"},
                                                                 clear_route=True)))
                if self.way.override_in_body:
                    answer.mode_override.CopyFrom(Mode(
                        request_header_mode=Mode.SEND, request_body_mode=Mode.BUFFERED,
                        response_header_mode=Mode.SKIP, response_body_mode=Mode.NONE))
                yield answer
            elif phase == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            else:  # the answer's body: where the gate, capturing it, would set its headers
                yield continue_response(phase, Continue(set_headers={MARK: "miss"}))

    def headers_answer(self, route: bool) -> pb.ProcessingResponse:
        cont = Continue(set_headers={"x-gate-cluster": "primary"}, clear_route=True) if route else Continue()
        answer = pb.ProcessingResponse()
        answer.CopyFrom(continue_response("request_headers", cont))
        if self.way.override_in_headers or self.way.hold_headers:
            # the request's body as configured; the answer's body in one message, with its
            # status as an attribute, and no message for the answer's headers
            body = Mode.STREAMED if self.way.hold_headers else Mode.BUFFERED
            answer.mode_override.CopyFrom(Mode(request_body_mode=body, response_header_mode=Mode.SKIP,
                                               response_body_mode=Mode.BUFFERED))
        return answer


def bootstrap(way: Way, gate: int, work: Path) -> tuple[dict[str, Any], int, int]:
    listen, admin, upstream = free_port(), free_port(), free_port()
    pools = {"primary": [(LOOPBACK, upstream)], "fallback": [(LOOPBACK, upstream)]}
    doc = envoy_config.bootstrap(listen=(LOOPBACK, listen), admin=(LOOPBACK, admin), gate=[(LOOPBACK, gate)],
                                 pools=pools)
    doc["static_resources"]["listeners"].append(upstream_listener(upstream))
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = hcm["http_filters"][0]["typed_config"]
    if way.skip_headers:
        ext_proc["processing_mode"]["request_header_mode"] = "SKIP"
        ext_proc["request_attributes"] = ATTRIBUTES
    if way.override_in_headers or way.hold_headers:
        ext_proc["response_attributes"] = ["response.code"]
    if way.hold_headers:
        ext_proc["processing_mode"]["request_body_mode"] = "STREAMED"
        ext_proc["send_body_without_waiting_for_header_response"] = True
    if way.per_route:
        routed = hcm["route_config"]["virtual_hosts"][0]["routes"][0]  # x-gate-cluster: primary
        mode = {"request_body_mode": "BUFFERED", "response_header_mode": "SKIP",
                "response_body_mode": "BUFFERED"}
        overrides = {"processing_mode": mode, "response_attributes": ["response.code"]}
        routed["typed_per_filter_config"] = {
            "envoy.filters.http.ext_proc": {"@type": PER_ROUTE, "overrides": overrides}}
    if way.buffer_filter:
        hcm["http_filters"].insert(-1, {"name": "envoy.filters.http.buffer",
                                        "typed_config": {"@type": BUFFER, "max_request_bytes": 1 << 20}})
    return doc, listen, admin


async def probe(way: Way, work: Path) -> dict[str, Any]:
    """One chat request through Envoy with `way`: what the processor saw and what came back."""
    recorder = Recorder(way)
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(recorder, server)
    gate = server.add_insecure_port(f"{LOOPBACK}:0")
    await server.start()
    doc, listen, admin = bootstrap(way, gate, work)
    envoy = spawn(envoy_command(doc, work / "envoy.yaml", "error"), work / "envoy.log")
    try:
        await asyncio.to_thread(wait_http, f"http://{LOOPBACK}:{admin}/ready", 30)
        async with httpx.AsyncClient(timeout=10) as client:
            body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}]}
            r = await client.post(f"http://{LOOPBACK}:{listen}/v1/chat/completions", json=body)
        await asyncio.sleep(0.2)
        code = r.json().get("error", {}).get("code") if r.status_code != 200 else None
        return {"status": r.status_code, "code": code, "seen": list(recorder.seen),
                "attributes": bool(recorder.attributes),
                "status_attribute": bool(recorder.response_attributes), "marked": MARK in r.headers}
    finally:
        os.killpg(envoy.pid, 15)
        envoy.wait(10)
        await server.stop(None)


WAYS = [
    Way("shipped: headers, then the body"),
    Way("headers skipped, sent as the body's attributes", skip_headers=True),
    Way("headers skipped, buffer filter before the router", skip_headers=True, buffer_filter=True),
    Way("response headers skipped by the body's answer", override_in_body=True),
    Way("response headers skipped by the headers' answer", override_in_headers=True),
    Way("headers' answer held until the body came", hold_headers=True),
    Way("a processing mode of its own on the route the body's answer selects", per_route=True),
]


def verdict(way: Way, result: dict[str, Any]) -> str:
    seen = result["seen"]
    if way.override_in_body:
        ignored = "response_headers" in seen
        return "ignored: Envoy takes a mode_override only in answers to headers" if ignored else "honoured"
    if way.per_route:
        if "response_headers" in seen:
            return "ignored: Envoy reads a route's processing mode before the body's answer selects it"
        return "honoured"
    if way.hold_headers:
        if "response_headers" in seen:
            return (f"routed, but the override was ignored: the body came in {seen.count('request_body')} "
                    "messages and the answer's headers in one more")
        return "honoured"
    if way.override_in_headers:
        if "response_headers" in seen or not result["status_attribute"]:
            return "ignored"
        dropped = "" if result["marked"] else ", but a header set in its answer never reaches the client"
        return ("the answer came in one message with its status" + dropped
                + "; the choice is made before the body says whether the answer streams")
    if result["status"] == 200:
        return "routed by the processor"
    if "request_body" not in seen:
        return "routed on the headers before the body reached the processor"
    return "body seen, but the route header set in its answer was not applied"


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    said = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True).stdout
    found = re.search(r"/(\d+\.\d+\.\d+)/", said)  # "envoy version: <commit>/1.40.0/Clean/RELEASE/..."
    version = found.group(1) if found else "?"
    rows = []
    with tempfile.TemporaryDirectory(prefix="llm-gate-probe-") as tmp:
        for way in WAYS:
            result = asyncio.run(probe(way, Path(tmp)))
            seen = ", ".join(result["seen"]) or "nothing"
            rows.append(f"| {way.name} | {result['status']} {result['code'] or ''} | {seen} | "
                        f"{'yes' if result['attributes'] else 'no'} | {verdict(way, result)} |")
            print(rows[-1], flush=True)
    args.out.write_text(
        f"# Fewer ext_proc messages per request: what Envoy {version} does "
        f"({time.strftime('%Y-%m-%d')})\n\n`python -m load.probe_messages`: "
        "one chat request per way, through the shipped bootstrap with a processor that routes "
        "as the gate does (`x-gate-cluster` and `clear_route_cache` in its answer to the body, or in "
        "its answer to the headers where that answer waits for the body). The processor's answer to "
        "the answer's body, where it gets one, sets a header for the client (`x-gate-cache`), as the "
        "gate's capture would.\n\n"
        "| way | status | messages the processor saw | request attributes | verdict |\n"
        "|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n"
    )
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
