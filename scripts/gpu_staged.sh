#!/usr/bin/env bash
# The staged decode (one launch per stage, chained by programmatic dependent launch; forward.cuh
# g4c_stage_kernel) against the persistent kernel, on a GPU machine in one call, with prebuilt
# binaries (scripts/gpu_prep.sh bins BUILD NAME; carry .gpu/NAME.tar.xz, .gpu/lib and either
# .gpu/data.tar.xz from `scripts/gpu_prep.sh data` or .gpu/fixtures.tar.xz, made by
# `tar -C ../shared/fixtures -cJf .gpu/fixtures.tar.xz gemma4`):
#   1. exactness: tests/gpu/gpu_exact on the five fixtures (600 tokens) in each mode (STAGED_MODES,
#      default "4 2 0"): every check must pass in every mode (blocks of 1-7 tokens run staged,
#      longer prompts the persistent kernel); with STAGED_QUANT=1 (needs data.tar.xz) also the
#      quantised fixtures against their dequantised f32 references (scripts/gpu_prep.sh refs),
#      under each setting of STAGED_QUANT_ENVS (default "G4_CUDA_RING_Q=0 G4_CUDA_RING_Q=1");
#   2. speed: bench/gpu_bench decode at ctx 128 and 4096 per model, then per mode on the same
#      upload (--staged STAGED_BENCH, default the modes above; 0: the persistent kernel, 1: staged
#      with matmuls two blocks per SM, 2: staged, one block per SM; 3: one-token matmuls on mode 1's
#      half-SM kernel, one block per SM; 4: one-token matmuls through shared-memory weight rings,
#      half an SM, one block per SM; suffixes: a attention after the wait on the full-SM kernel, q
#      quantised rows through the rings), the chained tokens and a k = 3 verify block's logits
#      compared with the first mode's; STAGED_PF="0 2 8" adds E4B bf16 runs of mode STAGED_PF_MODE
#      (default 3) under those G4_CUDA_STAGE_PF values (L2 requests per row team before the wait);
#   3. STAGED_TRACE="ARCH:STORAGE:M ...": the persistent kernel's per-stage trace of an M-token step;
#   4. STAGED_STRACE="ARCH:STORAGE:LIST ..." (LIST as gpu_bench --strace: MODE[a][q][/M[/DETAIL[/AMARK]]];
#      ';' between entries): the staged decode's traces, handoffs, input tiles, work and tails
#      (the last STAGED_STRACE_LINES lines of each, default 80: DETAIL prints a line per stage).
#   5. STAGED_TUNE="LIST" (gpu_bench --tune: pf,self,split[,smem_kb];...): decode at ctx 128
#      of every model above under each setting, on the same upload.
# STAGED_EXACT_ENVS="VAR=V ..." runs gpu_exact on the five fixtures once more per setting (mode 4
# or the first of STAGED_MODES), and the quantised suite too with STAGED_QUANT=1.
#   bash scripts/gpu_staged.sh NAME [ARCH:STORAGE[:CTX[:BENCHMODES]] ...]   (output: $STAGED_OUT, else $OUT/staged.txt or ./staged.txt)
set -uo pipefail
cd "$(dirname "$0")/.."
name=${1:?prebuilt name (.gpu/NAME.tar.xz)}
shift
out=${STAGED_OUT:-${OUT:-.}/staged.txt}
[ -d .gpu/$name ] || tar xf .gpu/$name.tar.xz
if [ ! -d .gpu/fixtures ]; then
  if [ -f .gpu/data.tar.xz ]; then tar xf .gpu/data.tar.xz
  else mkdir -p .gpu/fixtures && tar -C .gpu/fixtures -xf .gpu/fixtures.tar.xz; fi
fi
export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=.gpu/$name
modes=${STAGED_MODES:-4 2 0}
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  fails=0
  exact() { # gpu_exact on the five fixtures under the settings given (VAR=V ...)
    echo "== gpu_exact, $*"
    env "$@" timeout 400 $B/tests/gpu/gpu_exact --tokens "${STAGED_EXACT_TOKENS:-600}" .gpu/fixtures/gemma4/*/ >/tmp/exact.txt 2>&1 ||
      fails=$((fails + 1))
    grep -E "^FAIL|decode chain|drafted|gpu_exact:" /tmp/exact.txt | cut -c1-220
  }
  for m in $modes; do exact G4_CUDA_STAGED=$m; done
  for xe in ${STAGED_EXACT_ENVS:-}; do exact G4_CUDA_STAGED=${modes%% *} "$xe"; done
  if [ "${STAGED_QUANT:-0}" = 1 ] && [ -d .gpu/qfix ]; then
    [ -d .gpu/qref ] || bash scripts/gpu_prep.sh refs $B/g4
    pairs=()
    for d in .gpu/qfix/*/; do d=${d%/}; pairs+=("$d=.gpu/qref/$(basename "$d")"); done
    qi=0
    for qe in ${STAGED_QUANT_ENVS:-G4_CUDA_RING_Q=0 G4_CUDA_RING_Q=1} ${STAGED_EXACT_ENVS:-}; do
      qi=$((qi + 1))
      echo "== quantised fixtures vs dequantised f32, $qe"
      env "$qe" timeout 400 $B/tests/gpu/gpu_exact --tokens 64 "${pairs[@]}" >/tmp/quant_$qi.txt 2>&1 || fails=$((fails + 1))
      grep -E "^FAIL" /tmp/quant_$qi.txt | head -20 | cut -c1-220
      tail -n 1 /tmp/quant_$qi.txt
    done
  fi
  runs=("$@")
  [ ${#runs[@]} -gt 0 ] || runs=(e2b:bf16 e4b:bf16 e2b:qat-int4 e4b:qat-int4)
  for r in "${runs[@]}"; do
    IFS=: read -r a st ctx bm <<<"$r"
    echo "== $a $st"
    timeout 300 $B/bench/gpu_bench --arch "$a" --storage "$st" --ctx "${ctx:-128,4096}" --tokens "${STAGED_TOKENS:-128}" \
      --no-breakdown --staged "${bm:-${STAGED_BENCH:-$(echo $modes | tr ' ' ,)}}" 2>&1 | grep -v "^ *k=" || fails=$((fails + 1))
  done
  if [ -n "${STAGED_TUNE:-}" ]; then
    for r in "${runs[@]}"; do
      IFS=: read -r a st _ <<<"$r"
      echo "== tune $a $st: $STAGED_TUNE"
      timeout 300 $B/bench/gpu_bench --arch "$a" --storage "$st" --ctx 128 --tokens "${STAGED_TOKENS:-128}" --no-breakdown \
        --tune "$STAGED_TUNE" 2>&1 | grep -E "device:|tune|error" || fails=$((fails + 1))
    done
  fi
  for pf in ${STAGED_PF:-}; do # the L2 requests before the wait (G4_CUDA_STAGE_PF), E4B bf16 at ctx 128
    echo "== e4b bf16 staged=${STAGED_PF_MODE:-3} stage_pf=$pf"
    G4_CUDA_STAGED=${STAGED_PF_MODE:-3} G4_CUDA_STAGE_PF=$pf timeout 300 $B/bench/gpu_bench --arch e4b --storage bf16 --ctx 128 \
      --tokens "${STAGED_TOKENS:-128}" --no-breakdown 2>&1 | grep -E "^ +128 " || fails=$((fails + 1))
  done
  for t in ${STAGED_TRACE:-}; do
    IFS=: read -r a st tm <<<"$t"
    echo "== trace $a $st M=${tm:-1}"
    timeout 300 $B/bench/gpu_bench --arch "$a" --storage "$st" --ctx 128 --tokens 16 --no-breakdown --trace 1,1,0,0 \
      --trace-m "${tm:-1}" 2>&1 | grep -v "^ *k=" | tail -n 40 || fails=$((fails + 1))
  done
  for t in ${STAGED_STRACE:-}; do
    IFS=: read -r a st lst <<<"$t"
    echo "== staged trace $a $st $lst"
    timeout 300 $B/bench/gpu_bench --arch "$a" --storage "$st" --ctx 128 --tokens 16 --no-breakdown \
      --strace "$(echo "${lst:-4}" | tr '/;' ':,')" 2>&1 | grep -v "^ *k=" | tail -n "${STAGED_STRACE_LINES:-80}" || fails=$((fails + 1))
  done
  echo "== failures: $fails"
} 2>&1 | tee "$out"
