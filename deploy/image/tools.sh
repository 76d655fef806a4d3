#!/usr/bin/env bash
# The tools `make image` and `make image-check` use: mmdebstrap (with Debian's archive keys)
# builds the root file system, umoci packs and unpacks the OCI image, bubblewrap runs it.
# Installs what is missing with apt-get when run as root on Debian or Ubuntu; otherwise says
# what to install.
set -euo pipefail
need=()
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
command -v umoci >/dev/null 2>&1 || need+=(umoci)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "The image build needs: ${need[*]}. Install them (Debian/Ubuntu: sudo apt-get install ${need[*]}) and rerun." >&2
  exit 1
fi
echo "installing ${need[*]} (apt-get)" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
