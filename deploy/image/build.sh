#!/usr/bin/env bash
# The gate's runtime image without a container engine or daemon: a Debian bookworm root file
# system from Debian packages (mmdebstrap), the gate's wheel and its pinned dependencies
# (requirements.lock) in /opt/llm-gate, the embedding models built in, packed as an OCI image
# layout by umoci. The same content as the Dockerfile's `runtime` target: non-root (10001),
# no demo extra (no Envoy, no simulator).
#
#   deploy/image/build.sh [--out DIR] [--arch amd64|arm64] [--tag TAG]
#
# Writes DIR/oci (an OCI layout, image DIR/oci:TAG), default build/image and the package
# version. Then e.g. `skopeo copy oci:build/image/oci:0.1.0 docker://REGISTRY/llm-gate:0.1.0`,
# or `python deploy/image/check.py` to start it and wait for SERVING.
# Needs: mmdebstrap, umoci, and the dev venv's python (pip, and `llm-gate build-models` for the
# models, arch-independent ONNX files). mmdebstrap runs as root (--mode=root) or, without
# root, in a user namespace (--mode=unshare). Network: Debian's mirror and the package index.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

OUT=build/image
ARCH=$(dpkg --print-architecture)
PYTHON=${PYTHON:-.venv/bin/python}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
TAG=$VERSION
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    *) echo "usage: $0 [--out DIR] [--arch amd64|arm64] [--tag TAG]" >&2; exit 2 ;;
  esac
done
case "$ARCH" in
  amd64) MACHINE=x86_64 ;;
  arm64) MACHINE=aarch64 ;;
  *) echo "unsupported arch $ARCH" >&2; exit 2 ;;
esac
[ -x "$PYTHON" ] || PYTHON=python3
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
say() { echo "[image] $*" >&2; }
# Builds of one commit get the same timestamps in the file system and the image config.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH

rm -rf "$OUT/dist" "$OUT/wheels" "$OUT/oci" "$OUT/rootfs.tar"
mkdir -p "$OUT/dist" "$OUT/wheels"

say "wheel of llm-gate $VERSION"
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/dist" "$ROOT" 2>/dev/null \
  || "$PYTHON" -m pip wheel -q --no-deps -w "$OUT/dist" "$ROOT"

say "pinned dependencies for cp311 on linux/$ARCH"
# Binary wheels only, for the image's Python (Debian's 3.11) and glibc (2.36), whatever the host.
platforms=()
for minor in $(seq 5 36); do platforms+=(--platform "manylinux_2_${minor}_${MACHINE}"); done
platforms+=(--platform "manylinux2014_${MACHINE}" --platform "linux_${MACHINE}")
[ "$MACHINE" = x86_64 ] && platforms+=(--platform manylinux1_x86_64 --platform manylinux2010_x86_64)
grep -v '^#' deploy/image/requirements.lock > "$OUT/wheels/requirements.txt"
"$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
  "${platforms[@]}" -r "$OUT/wheels/requirements.txt" -d "$OUT/wheels"
cp "$OUT"/dist/llm_gate-*.whl "$OUT/wheels/"
WHEEL=$(basename "$OUT"/dist/llm_gate-*.whl)

MODELS=${MODELS:-$OUT/models}
if [ ! -d "$MODELS/e5-small" ] || [ ! -d "$MODELS/minilm" ]; then
  say "embedding models into $MODELS"
  LLM_GATE_MODEL_DIR=$MODELS "$PYTHON" -m extproc.cli build-models
fi

say "root file system: Debian $SUITE ($ARCH) + /opt/llm-gate"
mode=root
[ "$(id -u)" -eq 0 ] || mode=unshare
# essential: Debian's Essential:yes set (no apt) plus what the gate needs at run time.
# The hooks copy from the host and run the image's own python3 in the chroot (a foreign --arch
# needs qemu-user-static; the release workflow builds each arch on its own runner).
nice -n 10 mmdebstrap --quiet --mode="$mode" --variant=essential --architectures="$ARCH" \
  --include=python3,python3-venv,ca-certificates,libgomp1,libstdc++6,tzdata \
  --customize-hook='mkdir -p "$1/opt/llm-gate/models" "$1/etc/llm-gate" "$1/tmp/wheels"' \
  --customize-hook="cp -r $OUT/wheels/. \"\$1/tmp/wheels/\"" \
  --customize-hook='chroot "$1" python3 -m venv /opt/llm-gate' \
  --customize-hook="chroot \"\$1\" /opt/llm-gate/bin/python -m pip install -q --no-index --no-cache-dir \
      --find-links /tmp/wheels -c /tmp/wheels/requirements.txt /tmp/wheels/$WHEEL" \
  --customize-hook="cp -r $MODELS/. \"\$1/opt/llm-gate/models/\"" \
  --customize-hook="cp $ROOT/config.example.yaml \"\$1/etc/llm-gate/config.yaml\"" \
  --customize-hook='echo "gate:x:10001:10001:LLM Gate:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd" && \
      echo "gate:x:10001:" >> "$1/etc/group" && \
      chmod -R a+rX "$1/opt/llm-gate" "$1/etc/llm-gate"' \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* \
      "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* "$1"/var/log/* && \
      find "$1/opt/llm-gate" -name __pycache__ -prune -exec rm -rf {} +' \
  "$SUITE" "$OUT/rootfs.tar" "$MIRROR"

say "OCI image $OUT/oci:$TAG"
umoci init --layout "$OUT/oci"
umoci new --image "$OUT/oci:$TAG"
umoci raw add-layer --image "$OUT/oci:$TAG" "$OUT/rootfs.tar"
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
umoci config --image "$OUT/oci:$TAG" --architecture "$ARCH" --os linux --created "$created" \
  --config.user 10001:10001 --config.workingdir /tmp \
  --config.env PATH=/opt/llm-gate/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env LLM_GATE_MODEL_DIR=/opt/llm-gate/models \
  --config.env PYTHONUNBUFFERED=1 --config.env PYTHONDONTWRITEBYTECODE=1 \
  --config.entrypoint llm-gate \
  --config.cmd serve --config.cmd --config --config.cmd /etc/llm-gate/config.yaml \
  --config.cmd --host --config.cmd 0.0.0.0 \
  --config.exposedports 50051/tcp --config.exposedports 9464/tcp \
  --config.label "org.opencontainers.image.title=llm-gate" \
  --config.label "org.opencontainers.image.version=$VERSION" \
  --config.label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
umoci gc --layout "$OUT/oci"
rm -f "$OUT/rootfs.tar"
say "done: $(du -sh "$OUT/oci" | cut -f1) in $OUT/oci"
