"""docker-compose.yml and the Dockerfile against the no-Docker stack: Debian's docker-compose
resolves the file (no engine needed), and its images, commands, ports and files agree with
load/stack.py, the gate's config and the Envoy file `llm-gate envoy-config` writes, which the
real Envoy validates."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from extproc import cli, envoy_config
from extproc.checks import cross_check
from extproc.config import load_config
from load.stack import Stack, envoy_binary

REPO = Path(__file__).resolve().parents[2]
GATE_SERVICES = ("envoy", "gate-1", "gate-2", "scheduler", "primary", "fallback")


def resolved() -> dict[str, Any]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is missing: apt-get install docker-compose (.ci/run does)"
    out = subprocess.run([binary, "-f", str(REPO / "docker-compose.yml"), "config"], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = yaml.safe_load(out.stdout)
    return doc


def ip(service: dict[str, Any]) -> str:
    return str(service["networks"]["llm"]["ipv4_address"])


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """target → host path (docker-compose 1.x prints volumes as SOURCE:TARGET[:MODE])."""
    out = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            out[volume["target"]] = Path(volume["source"])
        else:
            source, target = volume.split(":")[:2]
            out[target] = Path(source)
    return out


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_compose_resolves_and_runs_every_part_from_the_one_image() -> None:
    services = resolved()["services"]
    assert set(services) == {*GATE_SERVICES, "redis", "prometheus", "grafana"}
    for name in GATE_SERVICES:
        assert services[name]["image"] == "llm-gate:local", name
        assert Path(services[name]["build"]["context"]) == REPO
    for name in ("gate-1", "gate-2", "scheduler", "primary", "fallback"):
        args, _ = cli.parser().parse_known_args(services[name]["command"])
        assert args.command in ("serve", "scheduler", "sim"), name


def test_compose_simulates_the_stacks_pools_and_the_gate_config_fits_envoy() -> None:
    services = resolved()["services"]
    config = load_config(REPO / "deploy/compose/gate.yaml")
    assert cross_check(config) == []
    sims = {}
    for pool in ("primary", "fallback"):
        cmd = services[pool]["command"]
        assert cmd[0] == "sim" and flag(cmd, "--name") == pool
        sims[pool] = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--model"]
    assert sims == Stack().pool_models
    assert set(sims) == {p.cluster for p in config.routing.pools.values()}
    sched = services["scheduler"]["command"]
    scheduler_address = f"{ip(services['scheduler'])}:{flag(sched, '--port')}"
    assert config.admission.pools["primary"].scheduler == scheduler_address
    assert config.store.redis_url == f"redis://{ip(services['redis'])}:6379/0"
    for gate in ("gate-1", "gate-2"):
        assert services[gate]["healthcheck"]["test"][-1] == f"127.0.0.1:{config.server.port}"


def test_compose_envoy_is_what_envoy_config_writes_and_real_envoy_accepts_it(tmp_path: Path) -> None:
    services = resolved()["services"]
    config = load_config(REPO / "deploy/compose/gate.yaml")
    script = services["envoy"]["command"][0]
    generate, _, run = script.partition("&&")
    args = shlex.split(generate)
    assert args[:2] == ["llm-gate", "envoy-config"]
    gates = [args[i + 1] for i, a in enumerate(args) if a == "--gate"]
    assert gates == [f"{ip(services[g])}:{config.server.port}" for g in ("gate-1", "gate-2")]
    pools = dict(args[i + 1].split("=") for i, a in enumerate(args) if a == "--pool")
    assert pools == {p: f"{ip(services[p])}:{flag(services[p]['command'], '--port')}" for p in pools}
    listen = flag(args, "--listen")
    assert services["envoy"]["ports"][0]["target"] == int(listen.rpartition(":")[2])
    out = tmp_path / "envoy.yaml"
    args[args.index("--out") + 1] = str(out)
    assert cli.main(args[1:]) == 0
    # The same Envoy flags as the stack, and the real Envoy validates the file.
    run_args = shlex.split(run)
    assert run_args[:3] == ["exec", "envoy", "-c"]
    stack_cmd = load_stack_envoy_flags(tmp_path)
    for option in ("--concurrency", "--disable-hot-restart"):
        assert option in run_args and option in stack_cmd
    assert flag(run_args, "--concurrency") == flag(stack_cmd, "--concurrency")
    check = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(out), "--use-dynamic-base-id"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    doc = yaml.safe_load(out.read_text())
    assert {c["name"] for c in doc["static_resources"]["clusters"]} == {envoy_config.GATE_CLUSTER, *pools}


def load_stack_envoy_flags(tmp: Path) -> list[str]:
    from load.stack import envoy_command

    return envoy_command({}, tmp / "stack-envoy.yaml", "warn")


def test_prometheus_and_grafana_get_the_shipped_files() -> None:
    services = resolved()["services"]
    config = load_config(REPO / "deploy/compose/gate.yaml")
    for name, service in services.items():
        for source in mounts(service).values():
            assert source.exists(), (name, source)
    prom_files = mounts(services["prometheus"])
    assert prom_files["/etc/prometheus/alerts.yaml"] == REPO / "deploy/alerts.yaml"
    prom = yaml.safe_load(prom_files["/etc/prometheus/prometheus.yml"].read_text())
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in prom["scrape_configs"]}
    gates = [f"{ip(services[g])}:{config.server.metrics_port}" for g in ("gate-1", "gate-2")]
    assert jobs["llm-gate"] == gates
    assert jobs["llm-gate-scheduler"] == [
        f"{ip(services['scheduler'])}:{flag(services['scheduler']['command'], '--metrics-port')}"
    ]
    assert jobs["envoy"] == [f"{ip(services['envoy'])}:9901"]
    grafana = mounts(services["grafana"])
    assert (grafana["/var/lib/grafana/dashboards"] / "llm-gate.json").exists()
    provider = yaml.safe_load((grafana["/etc/grafana/provisioning"] / "dashboards/llm-gate.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_the_dockerfile_is_multi_stage_non_root_with_models_and_a_grpc_health_check() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = {line.split()[-1]: line for line in text.splitlines() if line.startswith("FROM ")}
    assert list(stages) == ["build", "build-demo", "base", "demo", "runtime"]  # runtime: the default
    # The runtime image: pinned dependencies, no demo extra (no Envoy, no simulator's client).
    runtime = text.split(stages["runtime"])[1]
    assert runtime.strip() == "COPY --from=build /opt/llm-gate /opt/llm-gate"
    build = text.split(stages["build"])[1].split(stages["build-demo"])[0]
    assert "-c deploy/image/requirements.lock" in build and "[demo]" not in build
    assert "[demo]" in text.split(stages["build-demo"])[1].split(stages["base"])[0]
    assert resolved()["services"]["gate-1"]["build"]["target"] == "demo"
    assert "-slim" in text and "\nUSER 10001" in text
    assert "llm-gate build-models" in text and "LLM_GATE_MODEL_DIR" in text
    assert "HEALTHCHECK" in text and "extproc.healthcheck" in text
    kept = {line.rstrip("/") for line in (REPO / ".dockerignore").read_text().split()}
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (REPO / source).exists() and f"!{source.rstrip('/')}" in kept, source
