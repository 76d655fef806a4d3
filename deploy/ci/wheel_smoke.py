"""The package as an operator installs it: build the wheel, install it into an empty venv,
`llm-gate --version`, `llm-gate serve --config config.example.yaml`, wait for grpc.health.v1
SERVING, send one chat completion through a real Envoy to a simulated vLLM, then
`llm-gate build-models` into an empty model directory (no torch installed on the way).

Run from the checkout with the dev venv: `python deploy/ci/wheel_smoke.py` (`make package-check`).
The simulator and Envoy come from the dev venv; everything of the gate from the fresh one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from load.stack import LOOPBACK, Stack, free_port  # noqa: E402


def step(text: str) -> None:
    print(f"[wheel-smoke] {text}", flush=True)


def run(*args: str | Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, env=env)
    return out.stdout


def wait_serving(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"{LOOPBACK}:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the gate exited with {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    raise TimeoutError(f"the gate was not SERVING after {timeout:.0f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, help="keep the venv, models and logs here (default: a temp dir)")
    ap.add_argument("--start-timeout", type=float, default=600, help="seconds the first start may take")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="llm-gate-wheel-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    dist, src = work / "dist", work / "src"
    step(f"building the wheel into {dist} from the checkout's files")
    listed = run("git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    shutil.rmtree(src, ignore_errors=True)
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, src, env=env)
    (wheel,) = dist.glob("llm_gate-*.whl")

    venv = work / "venv"
    step(f"installing {wheel.name} into an empty venv {venv}")
    run(sys.executable, "-m", "venv", "--clear", venv, env=env)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, env=env)
    gate = venv / "bin" / "llm-gate"
    shown = run(gate, "--version", env=env).strip()
    step(f"`llm-gate --version`: {shown}")
    if not shown.startswith("llm-gate "):
        raise SystemExit(f"unexpected --version output: {shown!r}")

    env["LLM_GATE_MODEL_DIR"] = str(work / "models")  # empty: built on first start
    port, metrics = free_port(), free_port()
    (work / "stack").mkdir(exist_ok=True)
    stack = Stack(workdir=work / "stack", external_gate=True, gate_ports=[port])
    log = open(work / "gate.log", "wb")
    proc = None
    try:
        stack.start()
        step(f"serving config.example.yaml on {port}")
        proc = subprocess.Popen(
            [gate, "serve", "--config", ROOT / "config.example.yaml", "--port", str(port),
             "--metrics-port", str(metrics)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True,
        )
        wait_serving(port, proc, args.start_timeout)
        step(f"SERVING after {time.monotonic() - t0:.0f}s in all")
        body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "Hello from a wheel"}],
                "max_tokens": 8}
        req = urllib.request.Request(
            f"{stack.url}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
            headers={"content-type": "application/json", "x-business-scene": "ci-smoke"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
            headers = {k.lower(): v for k, v in r.headers.items()}
        gated = sorted(k for k in headers if k.startswith("x-gate-"))
        step(f"through Envoy: {r.status}, model {answer.get('model')}, gate headers {gated}")
        if r.status != 200 or not answer.get("choices") or not gated:
            raise SystemExit("the request was not answered through the gate")
        with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics}/metrics", timeout=5) as m:
            if b"gate_requests_total" not in m.read():
                raise SystemExit("the gate's /metrics has no gate_requests_total")
        step("`llm-gate build-models` into the empty model directory (MiniLM fetched without torch)")
        t1 = time.monotonic()
        step(run(gate, "build-models", env=env).strip().replace("\n", "; "))
        built = sorted(p.parent.name for p in (work / "models").glob("*/embedder.json"))
        step(f"built {built} in {time.monotonic() - t1:.0f}s")
        if built != ["e5-small", "minilm"]:
            raise SystemExit("build-models did not build both embedding models")
        if "torch" in run(venv / "bin" / "python", "-m", "pip", "list", env=env):
            raise SystemExit("torch was installed into the gate's venv")
    except BaseException:
        log.flush()
        sys.stderr.write((work / "gate.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        stack.close()
    step(f"OK in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
