"""SIGHUP reloads the config file in every gate worker without dropping open streams."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

import httpx

from load.stack import Stack

CHAT = "/v1/chat/completions"
SCENE_REQUIRED = {"validation": {"required_headers": [{"header": "x-business-scene", "path_prefix": CHAT}]}}


def chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": content}], **extra}


def reloads(metrics_port: int, result: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'gate_config_reloads_total{{result="{result}"}}'):
                return float(line.split()[-1])
    return 0.0


def wait_for(check: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_sighup_applies_a_new_config_and_refuses_a_broken_one() -> None:
    with Stack(gate_workers=2, sim_args=["--itl-ms", "50"]) as stack, httpx.Client(
        base_url=stack.url, timeout=30
    ) as client:
        assert client.post(CHAT, json=chat("before the reload")).status_code == 200
        streamed: list[str] = []

        def long_stream() -> None:
            body = chat("a long answer", stream=True, max_tokens=40, ignore_eos=True)
            with httpx.stream("POST", stack.url + CHAT, json=body, timeout=30) as r:
                streamed.append(f"{r.status_code} " + r.read().decode())

        reader = threading.Thread(target=long_stream)
        reader.start()
        time.sleep(0.3)  # the stream is open when the config changes

        stack.gate_config = SCENE_REQUIRED
        stack.write_gate_config()
        os.kill(stack.procs["gate"].pid, signal.SIGHUP)
        assert wait_for(lambda: all(reloads(p, "done") == 1 for p in stack.metrics_ports), 15)
        for i in range(6):  # both workers apply it
            r = client.post(CHAT, json=chat(f"after the reload {i}"))
            assert r.status_code == 400 and r.json()["error"]["param"] == "x-business-scene"
        ok = client.post(CHAT, json=chat("with a scene"), headers={"x-business-scene": "support"})
        assert ok.status_code == 200

        reader.join(30)
        assert streamed and streamed[0].startswith("200 ") and streamed[0].endswith("data: [DONE]\n\n")

        (stack.workdir / "gate.yaml").write_text("validation: {max_body_bytes: lots}\n")
        os.kill(stack.procs["gate"].pid, signal.SIGHUP)
        assert wait_for(lambda: all(reloads(p, "refused") == 1 for p in stack.metrics_ports), 15)
        assert client.post(CHAT, json=chat("still the reloaded config")).status_code == 400
        assert "max_body_bytes" in stack.log("gate")


def test_twenty_reloads_under_load_leave_the_redis_connections_where_they_were() -> None:
    """Each reload builds a new set of services (every Redis client included) and closes the
    old set once its streams are done: 18 more reloads under steady load leave CLIENT LIST
    where it was after the first two (a client left open per reload would add dozens), and no
    request fails. (The request path's pools may grow by a connection per concurrent request
    under load: jitter.)"""
    import redis

    with (
        Stack(gate_workers=2, with_redis=True) as stack,
        httpx.Client(base_url=stack.url, timeout=30) as client,
    ):
        assert stack.redis_port
        admin = redis.Redis(port=stack.redis_port)
        stop = threading.Event()
        statuses: list[int] = []

        def load() -> None:
            with httpx.Client(base_url=stack.url, timeout=30) as c:
                n = 0
                while not stop.is_set():
                    n += 1
                    statuses.append(c.post(CHAT, json=chat(f"reload load {n % 7}")).status_code)

        def reload(count: int) -> None:
            os.kill(stack.procs["gate"].pid, signal.SIGHUP)
            assert wait_for(lambda: all(reloads(p, "done") == count for p in stack.metrics_ports), 30)

        assert client.post(CHAT, json=chat("warm")).status_code == 200
        threads = [threading.Thread(target=load) for _ in range(3)]
        for t in threads:
            t.start()
        for i in range(2):
            reload(i + 1)
        time.sleep(1.5)  # the retired pipelines closed after their streams
        baseline = len(admin.client_list())
        for i in range(2, 20):
            reload(i + 1)
        # The retired pipelines close once their streams are done: the fewest clients seen
        # over 3 s, sampled while the load goes on.
        samples = []
        for _ in range(30):
            samples.append(len(admin.client_list()))
            time.sleep(0.1)
        final = min(samples)
        stop.set()
        for t in threads:
            t.join(30)
        admin.close()
    assert statuses and set(statuses) == {200}, set(statuses)
    # Each worker's request-path pool may open one more connection per concurrent request
    # than it held at the baseline (3 load threads: up to 2 more per worker, 4 in all);
    # a client left open per reload would add dozens.
    assert final <= baseline + 2 * (len(threads) - 1), (baseline, final)
