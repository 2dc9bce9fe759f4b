#!/usr/bin/env bash
# Installs llama.cpp as node-llama-cpp ships it (prebuilt CPU binaries for linux-x64, no compiler
# run, no GPU packages) into .llama/ in the repository root (gitignored), for
# scripts/llama_compare.mjs and scripts/race.sh. Needs node >= 20 and npm (Debian: apt-get install
# nodejs npm).
# With --native it also builds llama-bench from the llama.cpp source the package bundles
# (llama/gitRelease.bundle), for this CPU (GGML_NATIVE: -march=native, AVX-512 where present),
# into DIR/llama.cpp/build-native/bin/llama-bench, for `scripts/race.sh --llama native`. That
# needs git, cmake and a C++ compiler (Debian: apt-get install git cmake g++) and ~10 minutes on
# 2 cores.
# Usage: bash scripts/install_llama.sh [--native] [DIR]     (DIR default: .llama; or set G4_LLAMA_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
native=0
if [ "${1:-}" = --native ]; then native=1; shift; fi
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
if [ "$native" -eq 1 ]; then
    for t in git cmake c++; do
        command -v "$t" >/dev/null || { echo "install_llama: $t not found (apt-get install git cmake g++)" >&2; exit 1; }
    done
    src=$dir/llama.cpp
    [ -f "$src/CMakeLists.txt" ] || git clone -q "$dir/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$src"
    cmake -S "$src" -B "$src/build-native" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
    cmake --build "$src/build-native" --target llama-bench -j"$(nproc)" >&2
    echo "install_llama: native llama-bench at $src/build-native/bin/llama-bench"
fi
