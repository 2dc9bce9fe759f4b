#!/usr/bin/env bash
# The lean decode prototype (bench/gpu_lean_decode.cu) on a GPU machine, in one call: builds it with
# the machine's nvcc, checks it against its host reference (one token of a 2-layer model per
# storage), then times the decode token per model, storage, context and mode; with a prebuilt g4
# (G4=path, e.g. from scripts/gpu_prep.sh bins) it also runs `g4 bench --device cuda` on the same
# geometry for the engine's own number from the same machine. Output: $OUT/lean.txt (or stdout).
#   bash scripts/gpu_lean.sh [ARCH:STORAGE:CTX[:MODES[:ARGS]] ...]
# default: E2B bf16/q4 at ctx 128 and 4096 in every mode, E4B, 31B, then E2B with 16 warps and with
# larger slots (ARGS: prototype options, commas for spaces)
set -uo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=${OUT:-.}/lean.txt
bin=${LEAN_BIN:-/tmp/gpu_lean_decode}
{
  echo "== build"
  "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o "$bin" bench/gpu_lean_decode.cu || exit 1
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  echo "== check (one token, 2 layers, every stage against the host reference)"
  fails=0
  for a in e2b e4b; do
    timeout 300 "$bin" --arch $a --storage bf16,q4 --check --layers 2 || fails=$((fails + 1))
  done
  echo "== timing (modes: 0 copies after the barrier, 1 prefetched across barriers, 2 stream only, 4 no weights)"
  runs=("$@")
  [ ${#runs[@]} -gt 0 ] || runs=(e2b:bf16,q4:128,4096:0,1,2,4,12 e4b:bf16,q4:128:1,2,4 31b:bf16:128:1,2:--warps,4
                                  e2b:bf16,q4:128:1,2:--warps,16 e2b:bf16:128:1,2:--slot,6144 e2b:bf16,q4:128:1,2:--slot,12288,--warps,4)
  for r in "${runs[@]}"; do
    IFS=: read -r a st ctx modes args <<<"$r"
    echo "== $r"
    # shellcheck disable=SC2086
    timeout 300 "$bin" --arch "$a" --storage "$st" --ctx "$ctx" --tokens ${LEAN_TOKENS:-64} --modes "${modes:-0,1,2,4}" --trace ${args//,/ } ||
      fails=$((fails + 1))
  done
  if [ -n "${G4:-}" ]; then
    echo "== the engine on the same machine (g4 bench --device cuda)"
    for st in ${G4_STORAGES:-bf16 qat-int4}; do
      timeout 300 "$G4" bench --synth e2b --storage $st --device cuda --ctx 128 --gen 64 --no-verify 2>&1 | tail -4
    done
  fi
  echo "== failures: $fails"
} 2>&1 | tee "$out"
