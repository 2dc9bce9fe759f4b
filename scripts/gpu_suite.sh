#!/usr/bin/env bash
# The GPU test suite in one command (one `device` call): builds g4 with CUDA, runs
# `g4 check --device cuda` on every fixture, the GPU exactness tests (tests/gpu/) and the decode
# benchmark (bench/gpu_bench.c), and prints a summary. Exit status: non-zero if a check failed.
#
#   scripts/gpu_suite.sh [BUILD_DIR]        (default build-gpu)
# Environment: G4_FIXTURES (folder holding gemma4/<fixture>/; default ../shared/fixtures, then
# .gpu/fixtures), G4_PREBUILT=1 (use BUILD_DIR as it is), G4_BENCH_ARGS (extra gpu_bench
# arguments, e.g. "--arch e2b"), G4_SKIP_BENCH=1, OUT (a folder for the full log).
#
# The lent H200 image has nvcc but not libcjson/libedit headers, and ../shared does not travel, so
# there the binaries are built on the workstation and carried with the fixtures and shared libs:
#   .gpu/build/{g4,tests/gpu/gpu_exact,bench/gpu_bench}  (copies of build-cuda/...)
#   .gpu/fixtures/gemma4/   .gpu/lib/{libcjson.so.1,libedit.so.2,libbsd.so.0,libmd.so.0,libtinfo.so.6}
#   device call: LD_LIBRARY_PATH=$PWD/.gpu/lib G4_PREBUILT=1 G4_FIXTURES=.gpu/fixtures \
#                bash scripts/gpu_suite.sh .gpu/build            (carry: [".gpu"], ~90 s)
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
LOG=${OUT:-/tmp}/gpu_suite.log
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
run() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

FIX=${G4_FIXTURES:-}
if [ -z "$FIX" ]; then
  for f in ../shared/fixtures .gpu/fixtures; do [ -d "$f/gemma4" ] && { FIX=$f; break; }; done
fi
say "== gpu suite: $(date -u +%Y-%m-%dT%H:%MZ), fixtures ${FIX:-none}"
command -v nvidia-smi >/dev/null && run nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader

if [ "${G4_PREBUILT:-0}" != 1 ]; then
  say "== build ($BUILD)"
  t0=$(date +%s)
  if ! run make -j"$(nproc)" BUILD="$BUILD" "$BUILD/g4" "$BUILD/tests/gpu/gpu_exact" "$BUILD/tests/gpu/gpu_gemm" "$BUILD/bench/gpu_bench" >/dev/null; then
    say "BUILD FAILED"; exit 1
  fi
  say "built in $(( $(date +%s) - t0 )) s"
fi

declare -a summary=()
fail=0
# the fast prefill's kernels on their own (the GEMMs of src/cuda/pgemm.cu and pgemm_wg.cu, the
# attention of pattn.cu): against a double reference, bitwise the same for any number of tokens;
# then their speed on E2B's shapes
if [ -x "$BUILD/tests/gpu/gpu_gemm" ]; then
  say "== prefill kernels (gpu_gemm)"
  if timeout 120 "$BUILD/tests/gpu/gpu_gemm" >"$LOG.gemm" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
  tee -a "$LOG" <"$LOG.gemm"
  summary+=("$r gpu_gemm: $(tail -n 1 "$LOG.gemm")")
  [ "${G4_SKIP_BENCH:-0}" = 1 ] || run timeout 300 "$BUILD/tests/gpu/gpu_gemm" --bench
fi
if [ -n "$FIX" ]; then
  say "== g4 check --device cuda"
  for d in "$FIX"/gemma4/*/; do
    d=${d%/}
    if timeout "${G4_CHECK_TIMEOUT:-120}" "$BUILD/g4" check "$d" --device cuda >"$LOG.check" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
    cat "$LOG.check" | tee -a "$LOG"
    summary+=("$r check --device cuda $(basename "$d"): $(grep '^check ' "$LOG.check" | sed 's/^check [^ ]* //')")
  done
  say "== GPU exactness tests"
  if timeout "${G4_EXACT_TIMEOUT:-300}" "$BUILD/tests/gpu/gpu_exact" --tokens "${G4_GEN_TOKENS:-600}" "$FIX"/gemma4/*/ >"$LOG.exact" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
  cat "$LOG.exact" >>"$LOG"
  summary+=("$r gpu_exact: $(tail -n 1 "$LOG.exact")")
  # the tensor-core procedure for bf16 matmuls (G4_CUDA_MMA=4: tiled weights, mm_tile_mma): the
  # same checks, its own bits
  say "== GPU exactness tests, bf16 on the tensor cores (G4_CUDA_MMA=4)"
  if G4_CUDA_MMA=4 timeout "${G4_EXACT_TIMEOUT:-300}" "$BUILD/tests/gpu/gpu_exact" --tokens "${G4_GEN_TOKENS:-600}" "$FIX"/gemma4/*/ >"$LOG.mma" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
  cat "$LOG.mma" >>"$LOG"
  summary+=("$r gpu_exact (tensor cores): $(tail -n 1 "$LOG.mma")")
  # the persistent kernel for every block (G4_CUDA_STAGED=0; by default decode steps and verify
  # blocks run staged, one launch per stage: forward.cuh g4c_stage_kernel), and the staged decode
  # without the weight rings (G4_CUDA_STAGED=2): the same checks
  for sm in 0 2; do
    say "== GPU exactness tests, G4_CUDA_STAGED=$sm"
    if G4_CUDA_STAGED=$sm timeout "${G4_EXACT_TIMEOUT:-300}" "$BUILD/tests/gpu/gpu_exact" --tokens "${G4_GEN_TOKENS:-600}" "$FIX"/gemma4/*/ >"$LOG.staged$sm" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
    cat "$LOG.staged$sm" >>"$LOG"
    summary+=("$r gpu_exact (G4_CUDA_STAGED=$sm): $(tail -n 1 "$LOG.staged$sm")")
  done
fi
# quantised weights (GGUF Q4_0/Q8_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K, MLX 3/4/6/8-bit, QAT
# int2/int4/int8; scripts/gpu_prep.sh data): fixtures converted with
# `g4 convert`, each compared with the same weights dequantised to f32 on the CPU (float
# activations there; the GPU's 4/8-bit rows meet activations held as 24-bit integers per 32-column
# block, the resolution of the block's largest float; the CPU's own quantised path quantises
# activations to int8, far coarser): batch
# invariance of both procedures, each within 2e-3 of the reference, greedy decode chains.
QFIX=${G4_QFIX:-.gpu/qfix}; QREF=${G4_QREF:-.gpu/qref}
if [ -d "$QFIX" ] && [ -d "$QREF" ]; then
  say "== GPU quantised weights vs CPU (dequantised f32)"
  pairs=()
  for d in "$QFIX"/*/; do d=${d%/}; pairs+=("$d=$QREF/$(basename "$d")"); done
  if timeout "${G4_EXACT_TIMEOUT:-300}" "$BUILD/tests/gpu/gpu_exact" --tokens 64 "${pairs[@]}" >"$LOG.quant" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
  cat "$LOG.quant" | tee -a "$LOG" >/dev/null
  grep -v '^PASS' "$LOG.quant"
  summary+=("$r quantised weights: $(tail -n 1 "$LOG.quant")")
  # the same with per-channel 4-bit rows on the integer tensor cores (G4_CUDA_IMMA=1, opt-in)
  say "== GPU quantised weights vs CPU, integer tensor cores (G4_CUDA_IMMA=1)"
  if G4_CUDA_IMMA=1 timeout "${G4_EXACT_TIMEOUT:-300}" "$BUILD/tests/gpu/gpu_exact" --tokens 64 "${pairs[@]}" >"$LOG.iq" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
  cat "$LOG.iq" | tee -a "$LOG" >/dev/null
  grep '^FAIL' "$LOG.iq"
  summary+=("$r quantised weights (integer tensor cores): $(tail -n 1 "$LOG.iq")")
fi
if [ "${G4_SKIP_BENCH:-0}" != 1 ]; then
  say "== benchmark"
  if run timeout "${G4_BENCH_TIMEOUT:-400}" "$BUILD/bench/gpu_bench" ${G4_BENCH_ARGS:-}; then r=PASS; else r=FAIL; fail=1; fi
  summary+=("$r gpu_bench")
fi
say "== summary"
for l in "${summary[@]}"; do say "$l"; done
exit $fail
