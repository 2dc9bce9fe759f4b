#!/usr/bin/env bash
# Decode on the GPU across builds and kernel switches, in one command: `bench/gpu_bench` (in-memory
# synthesized models, chained decode steps on the device) per ARCH:STORAGE cell, build and mode,
# printing decode tok/s at each context, the share of the read bandwidth measured in the same run,
# and the verify blocks' cost relative to one step. A mode is "base" (no switch) or ENV=VALUE (a
# switch read when the session is created, e.g. G4_CUDA_IMMA=1). Needs a GPU.
#   scripts/gpu_decode_ab.sh [BUILD[,BUILD...]] [ARCH:STORAGE ...]   (default build; e2b:bf16 e2b:qat-int4 e4b:bf16)
# Environment: G4_AB_MODES (default "base"), G4_AB_CTX (default "128,4096"), G4_AB_ARGS (extra
# gpu_bench arguments, e.g. --trace 1,1,0,16), OUT (a folder for the full outputs).
set -u
cd "$(dirname "$0")/.." || exit 1
builds=${1:-build}
[ $# -gt 0 ] && shift
cells=("$@")
[ ${#cells[@]} -eq 0 ] && cells=(e2b:bf16 e2b:qat-int4 e4b:bf16)
log=${OUT:-/tmp}/gpu_decode_ab.log
: >"$log"
printf '%-8s %-9s %-12s %-16s %s\n' arch storage build mode "decode tok/s (of bandwidth) per ctx | verify k=1..6 vs a step"
for cell in "${cells[@]}"; do
  arch=${cell%%:*}; st=${cell#*:}
  for B in ${builds//,/ }; do
    for mode in ${G4_AB_MODES:-base}; do
      case $mode in
        base) env=() ;;
        *=*) env=("$mode") ;;
        *) echo "gpu_decode_ab: unknown mode $mode (base or ENV=VALUE)" >&2; exit 2 ;;
      esac
      # shellcheck disable=SC2086
      out=$(env "${env[@]}" timeout 300 "$B/bench/gpu_bench" --arch "$arch" --storage "$st" --ctx "${G4_AB_CTX:-128,4096}" \
            --tokens 64 --no-breakdown ${G4_AB_ARGS:-} 2>&1); rc=$?
      printf '== %s %s %s %s (rc %d)\n%s\n' "$arch" "$st" "$B" "$mode" "$rc" "$out" >>"$log"
      if [ $rc -ne 0 ]; then
        printf '%-8s %-9s %-12s %-16s failed: %s\n' "$arch" "$st" "$(basename "$B")" "$mode" "$(tail -n 1 <<<"$out")"
        continue
      fi
      awk -v a="$arch" -v s="$st" -v b="$(basename "$B")" -v m="$mode" '
        $1 ~ /^[0-9]+$/ && NF == 6 && $6 ~ /%$/ { row = row sprintf(" %s: %s (%s)", $1, $3, $6) }
        /verify block/ { v = $0; sub(/.*\| k=1/, "k=1", v); gsub(/ \| /, " ", v) }
        END { printf "%-8s %-9s %-12s %-16s%s | %s\n", a, s, b, m, row, v }' <<<"$out"
    done
  done
done
echo "full outputs: $log"
