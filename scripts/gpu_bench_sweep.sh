#!/usr/bin/env bash
# The GPU benchmark table in one command: `g4 bench --device cuda` on in-memory synthesized models
# (same geometry and seeds as `g4 synth`), decode at context 128 and prefill of that context and of
# 512 tokens (llama.cpp's pp512), under the exact default and with --fast-prefill; one summary line
# per run. Needs a GPU; a full sweep takes ~4 min on an H200 (31B synthesizes for ~25 s).
#   scripts/gpu_bench_sweep.sh [G4] [ARCH:STORAGE ...]      (default G4 build/g4, the list below)
# Environment: G4_SWEEP_ARGS (extra g4 bench arguments), OUT (a folder for the full outputs).
set -u
cd "$(dirname "$0")/.." || exit 1
G4=${1:-build/g4}
[ $# -gt 0 ] && shift
cells=("$@")
[ ${#cells[@]} -eq 0 ] && cells=(e2b:bf16 e2b:qat-int4 e2b:mlx-4 e2b:qat-int8 e2b:mlx-8 e2b:qat e4b:bf16 e4b:qat-int4
                                  e4b:mlx-4 26b-a4b:mlx-4 31b:qat-int4)
log=${OUT:-/tmp}/gpu_bench_sweep.log
: >"$log"
printf '%-9s %-9s %-6s %12s %12s %10s %8s %8s %8s\n' arch storage mode "prefill/128" "pp512" "decode" "GB/tok" "GB/s" "of bw"
for cell in "${cells[@]}"; do
  arch=${cell%%:*}; st=${cell#*:}
  for mode in exact fast; do
    args=(bench --synth "$arch" --storage "$st" --device cuda --ctx 128 --prefill 512 --no-verify)
    [ "$mode" = fast ] && args+=(--fast-prefill)
    [ "$arch" = 31b ] && [ "$mode" = fast ] && args+=(--batch 512)
    # shellcheck disable=SC2206
    args+=(${G4_SWEEP_ARGS:-})
    out=$(timeout 300 "$G4" "${args[@]}" 2>&1); rc=$?
    printf '== %s %s %s (rc %d)\n%s\n' "$arch" "$st" "$mode" "$rc" "$out" >>"$log"
    if [ $rc -ne 0 ]; then
      why=$(grep -m 1 '^g4 bench:' <<<"$out" || tail -n 1 <<<"$out")
      printf '%-9s %-9s %-6s failed: %s\n' "$arch" "$st" "$mode" "$why"
      continue
    fi
    # the row of context 128 (prefill t/s, decode t/s, ms/token, GB/s, bw, of bw) and the pp512 line
    awk -v a="$arch" -v s="$st" -v m="$mode" '
      /GB streamed per token/ { for (i = 1; i < NF; i++) if ($(i + 1) == "GB") gb = $i }
      $1 == "128" && NF >= 7 { pre = $2; dec = $3; gbs = $5; of = $NF }
      /^prefill of 512 tokens/ { pp = $(NF - 3) }
      END { printf "%-9s %-9s %-6s %12s %12s %10s %8s %8s %8s\n", a, s, m, pre, pp, dec, gb, gbs, of }' <<<"$out"
  done
done
echo "full outputs: $log"
