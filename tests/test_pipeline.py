"""The pipeline's failure policy, its request for a longer Envoy deadline, and the access line."""

from __future__ import annotations

import asyncio
import io
import logging
import re

import orjson
import pytest

from extproc.access import BatchedLines, access_record, batch_access_lines
from extproc.config import Config, parse_config
from extproc.exchange import Exchange, Reply
from extproc.metrics import Metrics
from extproc.pipeline import Pipeline
from extproc.stages.base import Stage


class Broken(Stage):
    def __init__(self, name: str, fail_closed: bool) -> None:
        self.name = name
        self.fail_closed = fail_closed

    async def on_request(self, ex: Exchange) -> Reply | None:
        raise TypeError("a bug")


class Marks(Stage):
    name = "marks"

    async def on_request(self, ex: Exchange) -> Reply | None:
        ex.decision = "reached"
        return None


def ex() -> Exchange:
    return Exchange("POST", "/v1/chat/completions", {}, request_id="req-42")


@pytest.mark.parametrize("closed", [True, False])
async def test_a_failing_stage_answers_500_or_is_skipped_by_its_policy(closed: bool) -> None:
    metrics = Metrics()
    pipeline = Pipeline([Broken("ratelimit", closed), Marks()], Config(), metrics)
    e = ex()
    reply = await pipeline.on_request(e)
    failures = metrics.registry.get_sample_value(
        "gate_stage_errors_total", {"stage": "ratelimit", "hook": "request"}
    )
    assert failures == 1
    if closed:
        assert reply is not None and reply.status == 500 and e.decision != "reached"
        error = orjson.loads(reply.body)["error"]
        assert "req-42" in error["message"] and error["code"] == "gate_error"
    else:
        assert reply is None and e.decision == "reached"


@pytest.mark.parametrize(
    ("section", "priority", "expected"),
    [
        ("", "standard", None),  # 10 s queue + 10 s behind a leader + 5 s: within Envoy's 35 s
        ("admission: {deadline_ms: {vip: 300000}}", "vip", 240.0),  # capped at max_message_timeout
        ("admission: {deadline_ms: {standard: 20000}}", "standard", 45.0),
        ("server: {envoy_message_timeout_ms: 2000}", "standard", 25.0),
        ("admission: {enabled: false}\ncache: {enabled: false}", "standard", None),
    ],
)
def test_a_request_that_may_wait_longer_asks_envoy_for_more_time(
    section: str, priority: str, expected: float | None
) -> None:
    pipeline = Pipeline([], parse_config(section), Metrics())
    e = ex()
    e.priority = priority
    assert pipeline.longer_timeout_s(e) == expected


def test_the_access_line_names_the_request_but_never_its_key_or_prompt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    e = ex()
    e.payload = {"model": "m", "messages": [{"role": "user", "content": "my secret question"}]}
    e.key_id, e.tenant, e.status, e.waited_s = "ab12", "acme", 200, 0.25
    e.client_headers["x-gate-cache"] = "miss"
    e.client_headers["x-gate-screen"] = "flagged"
    record = access_record(e, busy_s=0.26, now=e.started + 1.0)
    assert record["request_id"] == "req-42" and record["cache"] == "miss" and record["screen"] == "flagged"
    assert record["queue_ms"] == 250.0 and record["gate_ms"] == pytest.approx(10.0)
    pipeline = Pipeline([], Config(), Metrics())
    with caplog.at_level(logging.INFO, logger="llm_gate.access"):
        e.headers["authorization"] = "Bearer sk-very-secret"
        pipeline.log_request(e, 0.26)
    [line] = [r.getMessage() for r in caplog.records if r.name == "llm_gate.access"]
    assert orjson.loads(line)["request_id"] == "req-42"
    assert "secret" not in line


async def test_access_lines_are_written_in_batches_and_none_is_lost() -> None:
    stream = io.StringIO()
    handler = BatchedLines(stream, "gate[3] INFO", flush_s=0.05, max_lines=4)
    logger = logging.getLogger("llm_gate.access.batch-test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        for i in range(3):
            logger.info('{"n":%d}', i)
        assert stream.getvalue() == ""  # held until the timer or a full batch
        await asyncio.sleep(0.15)
        lines = stream.getvalue().splitlines()
        assert [line.split(" gate[3] INFO ")[1] for line in lines] == ['{"n":0}', '{"n":1}', '{"n":2}']
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", lines[0].split(" gate[3]")[0])
        for i in range(3, 9):
            logger.info('{"n":%d}', i)
        assert len(stream.getvalue().splitlines()) == 7  # a full batch went at once
        handler.close()  # at exit: the rest
        assert len(stream.getvalue().splitlines()) == 9
    finally:
        logger.removeHandler(handler)


def test_the_process_batch_writes_access_lines_without_log_records() -> None:
    """A gate process's access lines go straight into its batch, stamped like its other lines."""
    stream = io.StringIO()
    access = logging.getLogger("llm_gate.access")
    batch_access_lines(stream, "gate[0] INFO")
    access.setLevel(logging.INFO)  # as a gate process sets its logs (`app.run_process`)
    try:
        e = ex()
        e.status = 200
        Pipeline([], Config(), Metrics()).log_request(e, 0.01)
        access.handlers[0].flush()  # (with no event loop running, it wrote at once)
        [line] = stream.getvalue().splitlines()
        stamp, text = line.split(" gate[0] INFO ")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", stamp)
        assert orjson.loads(text)["request_id"] == "req-42"
    finally:
        for handler in list(access.handlers):
            access.removeHandler(handler)
        access.propagate = True
        access.setLevel(logging.NOTSET)
