#!/usr/bin/env bash
# The per-stage-kernel decode prototype (bench/gpu_pdl_chain.cu) on a GPU machine, in one call:
# builds it with the machine's nvcc and times a decode token's stage chain per model and storage in
# the runs that matter (9, 13, 15: PDL with the copies before the dependency wait, 2 or 4 blocks per
# SM; 3: the dependency chain alone; 2: no PDL); with a prebuilt g4 (G4=path, e.g. from
# scripts/gpu_prep.sh bins) it first runs `g4 bench --device cuda` on the same geometry for the
# engine's own number from the same machine. Output: $OUT/pdl.txt (or stdout).
#   bash scripts/gpu_pdl.sh [ARCH:STORAGE[:RUNS] ...]      (default: e2b, e4b x bf16, q4; 31b bf16)
set -uo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=${OUT:-.}/pdl.txt
bin=${PDL_BIN:-/tmp/gpu_pdl_chain}
{
  echo "== build"
  "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o "$bin" bench/gpu_pdl_chain.cu || exit 1
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  fails=0
  if [ -n "${G4:-}" ]; then
    for a in e2b e4b; do
      for st in bf16 qat-int4; do
        echo "== the engine: g4 bench --synth $a --storage $st --device cuda"
        timeout 300 "$G4" bench --synth $a --storage $st --device cuda --ctx 128 --gen 64 --no-verify 2>&1 | tail -2 ||
          fails=$((fails + 1))
      done
    done
  fi
  runs=("$@")
  [ ${#runs[@]} -gt 0 ] || runs=(e2b:bf16 e2b:q4 e4b:bf16 e4b:q4 31b:bf16:13,15)
  for r in "${runs[@]}"; do
    IFS=: read -r a st modes <<<"$r"
    echo "== $r"
    timeout 300 "$bin" --arch "$a" --storage "$st" --modes "${modes:-9,13,15,3,2}" --reps "${PDL_REPS:-30}" ||
      fails=$((fails + 1))
  done
  echo "== failures: $fails"
} 2>&1 | tee "$out"
