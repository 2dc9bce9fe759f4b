#!/usr/bin/env bash
# Installs everything g4 needs on a fresh Debian 12 machine, then builds it.
# Usage: bash scripts/setup.sh [--bench-tools]      (run as root, or with sudo available)
#   --bench-tools  also the packages of the llama.cpp race, which g4 itself never needs:
#                  nodejs npm (scripts/install_llama.sh, race.sh) and git cmake g++
#                  (scripts/install_llama.sh --native)
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential pkg-config libcjson-dev libcmocka-dev libedit-dev)
case "${1:-}" in
  "") ;;
  --bench-tools) # by command: a Node.js from elsewhere (e.g. NodeSource, which bundles npm) is fine
    for t in node:nodejs npm:npm git:git cmake:cmake g++:g++; do
      command -v "${t%%:*}" >/dev/null || pkgs+=("${t#*:}")
    done ;;
  *) echo "setup: unknown option '$1' (usage: bash scripts/setup.sh [--bench-tools])" >&2; exit 2 ;;
esac
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
