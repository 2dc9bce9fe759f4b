#!/usr/bin/env bash
# Installs everything g4 needs on a fresh Debian 12 machine, then builds it.
# Usage: bash scripts/setup.sh        (run as root, or with sudo available)
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential pkg-config libcjson-dev libcmocka-dev libedit-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

make -j"$(nproc)"
echo "setup: g4 built at build/g4"
