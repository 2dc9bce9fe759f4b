#!/usr/bin/env bash
# Installs llama.cpp as node-llama-cpp ships it (prebuilt CPU binaries for linux-x64, no compiler
# run, no GPU packages) into .llama/ in the repository root (gitignored), for
# scripts/llama_compare.mjs. Needs node >= 20 and npm (Debian: apt-get install nodejs npm).
# Usage: bash scripts/install_llama.sh [DIR]     (DIR default: .llama; or set G4_LLAMA_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${G4_LLAMA_DIR:-.llama}}
version=${NODE_LLAMA_CPP_VERSION:-3.22.1}   # bundles llama.cpp release v0.5.0 with gemma4 support
command -v npm >/dev/null || { echo "install_llama: npm not found (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$dir"
[ -f "$dir/package.json" ] || printf '{"name": "g4-llama", "private": true}\n' > "$dir/package.json"
# --omit=optional skips the GPU builds (CUDA, Vulkan) and other platforms; the linux-x64 CPU
# binaries are asked for by name. --ignore-scripts: the postinstall would only offer to build.
npm install --prefix "$dir" --no-audit --no-fund --omit=optional --ignore-scripts \
    "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >&2
node -e '
  const p = require("path"), d = process.argv[1];
  const pkg = require(p.resolve(d, "node_modules/node-llama-cpp/package.json"));
  const info = require(p.resolve(d, "node_modules/node-llama-cpp/llama/llama.cpp.info.json"));
  console.log(`install_llama: node-llama-cpp ${pkg.version}, llama.cpp ${info.tag} in ${d}`);
' "$dir"
