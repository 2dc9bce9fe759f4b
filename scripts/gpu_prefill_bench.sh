#!/usr/bin/env bash
# Fast prefill on the GPU in one command: `g4 bench --fast-prefill` on in-memory synthesized models
# at several chunk sizes and prompt lengths, with the prefill GEMM and attention kernels (the
# default, "split"), with bf16 GEMMs on mma.sync instead of wgmma ("mma": G4_CUDA_WGMMA=0) and
# without the split ("persistent": G4_CUDA_PGEMM=0, the persistent kernel's own procedure), with
# the attention on CUDA cores ("simt-attn": G4_CUDA_PATTN=32) or on the tensor cores without the
# four key partitions ("attn-whole": G4_CUDA_PATTN=0), with the GEMMs' input terms built a
# block per token ("block-prep": G4_CUDA_FPWARP=0), with every GEMM's input terms from a launch of
# the persistent kernel ("nochain": G4_CUDA_PGCHAIN=0), with the input phases in launches of the
# persistent kernel instead of their own ("noprep": G4_CUDA_PGPREP=0), without programmatic
# dependent launch ("nopdl": G4_CUDA_PDL=0), then a traced
# E2B chunk split into the persistent kernel's, the GEMM's and the attention's launches with the
# chunk's last logits against the decode procedure. One summary line per run. Needs a GPU.
#   scripts/gpu_prefill_bench.sh [BUILD] [ARCH:STORAGE ...]   (default build, e2b:bf16 e2b:qat-int4 e4b:bf16)
# Environment: G4_PF_BATCH (chunk sizes, default "128 256 512"), G4_PF_PROMPT (pp lengths, default
# "512 2048"), G4_PF_MODES (default "split persistent"; also "mma", "simt-attn", "attn-whole", "block-prep",
# "nochain", "noprep", "nopdl"), OUT (a folder for the full outputs).
set -u
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}
[ $# -gt 0 ] && shift
cells=("$@")
[ ${#cells[@]} -eq 0 ] && cells=(e2b:bf16 e2b:qat-int4 e4b:bf16)
log=${OUT:-/tmp}/gpu_prefill_bench.log
: >"$log"
printf '%-8s %-9s %-9s %6s %12s %12s\n' arch storage kernels batch "prefill/128" "pp(N) t/s"
for cell in "${cells[@]}"; do
  arch=${cell%%:*}; st=${cell#*:}
  for pp in ${G4_PF_PROMPT:-512 2048}; do
    for batch in ${G4_PF_BATCH:-128 256 512}; do
      for mode in ${G4_PF_MODES:-split persistent}; do
        case $mode in
          persistent) env=(G4_CUDA_PGEMM=0) ;; mma) env=(G4_CUDA_WGMMA=0) ;;
          simt-attn) env=(G4_CUDA_PATTN=32) ;; attn-whole) env=(G4_CUDA_PATTN=0) ;; block-prep) env=(G4_CUDA_FPWARP=0) ;; nochain) env=(G4_CUDA_PGCHAIN=0) ;;
          noprep) env=(G4_CUDA_PGPREP=0) ;; nopdl) env=(G4_CUDA_PDL=0) ;;
          *) env=() ;;
        esac
        out=$(env "${env[@]}" timeout 300 "$B/g4" bench --synth "$arch" --storage "$st" --device cuda --ctx 128 --gen 8 \
              --prefill "$pp" --fast-prefill --batch "$batch" --no-verify 2>&1); rc=$?
        printf '== %s %s %s batch %s pp%s (rc %d)\n%s\n' "$arch" "$st" "$mode" "$batch" "$pp" "$rc" "$out" >>"$log"
        if [ $rc -ne 0 ]; then
          printf '%-8s %-9s %-9s %6s failed: %s\n' "$arch" "$st" "$mode" "$batch" "$(grep -m 1 '^g4 bench:' <<<"$out" || tail -n 1 <<<"$out")"
          continue
        fi
        awk -v a="$arch" -v s="$st" -v m="$mode" -v b="$batch" -v n="$pp" '
          $1 == "128" && NF >= 7 { pre = $2 }
          /^prefill of [0-9]+ tokens/ { pp = $(NF - 3) }
          END { printf "%-8s %-9s %-9s %6s %12s %12s (pp%s)\n", a, s, m, b, pre, pp, n }' <<<"$out"
      done
    done
  done
done
if [ -x "$B/bench/gpu_bench" ]; then
  for M in ${G4_PF_TRACE_M:-256 512}; do
    echo "== traced E2B bf16 chunk of $M tokens after 128 (gpu_bench --trace-prefill)" | tee -a "$log"
    timeout 300 "$B/bench/gpu_bench" --arch e2b --ctx 128 --tokens 16 --no-breakdown --trace-m "$M" --trace-prefill \
      --trace "1,1,0,0" 2>&1 | tee -a "$log" | grep -E "fast prefill|total|attn|matmul " 
  done
fi
echo "full outputs: $log"
