#!/usr/bin/env bash
# Prepares what a GPU machine without the project's build packages needs for scripts/gpu_suite.sh
# (the lent H200 image has nvcc but no libcjson/libedit headers, ../shared does not travel, and a
# call carries at most 64 MiB):
#   scripts/gpu_prep.sh bins BUILD NAME   .gpu/NAME.tar.xz: BUILD's g4, tests/gpu/gpu_exact, gpu_gemm and
#                                         bench/gpu_bench (debug info stripped) as .gpu/NAME/...;
#                                         .gpu/lib/: the shared libraries they need beyond the image's
#   scripts/gpu_prep.sh data [G4]         .gpu/data.tar.xz: the fixtures (.gpu/fixtures/gemma4/) and
#                                         each converted by `g4 convert` to bf16 safetensors, GGUF Q4_0/Q8_0/Q4_1/Q5_0/
#                                         Q5_1/Q4_K/Q5_K/Q6_K, MLX 3/4/6/8-bit and QAT int2/int4/int8
#                                         (.gpu/qfix/FIXTURE-FORMAT; G4_QFORMATS overrides the list),
#                                         and a 256-wide model as real Q4_K/Q5_K/Q6_K (.gpu/kq)
#   scripts/gpu_prep.sh refs [G4]         on the GPU machine: .gpu/qref/, each of .gpu/qfix dequantised
#                                         to f32 (the suite's quantised-weights reference)
# On the GPU machine (carry .gpu/data.tar.xz, .gpu/NAME.tar.xz, .gpu/lib):
#   tar xf .gpu/data.tar.xz && tar xf .gpu/NAME.tar.xz && export LD_LIBRARY_PATH=$PWD/.gpu/lib &&
#   bash scripts/gpu_prep.sh refs .gpu/NAME/g4 &&
#   G4_PREBUILT=1 G4_FIXTURES=.gpu/fixtures bash scripts/gpu_suite.sh .gpu/NAME
set -euo pipefail
cd "$(dirname "$0")/.."
G=.gpu
mode=${1:-}
case $mode in
  bins)
    BUILD=${2:?build folder}; NAME=${3:?name}
    mkdir -p "$G/$NAME/tests/gpu" "$G/$NAME/bench" "$G/lib"
    for b in g4 tests/gpu/gpu_exact tests/gpu/gpu_gemm bench/gpu_bench; do
      [ -x "$BUILD/$b" ] || { echo "gpu_prep: $BUILD/$b is missing (make BUILD=$BUILD $BUILD/$b)" >&2; exit 1; }
      strip --strip-debug -o "$G/$NAME/$b" "$BUILD/$b"
    done
    for l in libcjson.so.1 libedit.so.2 libbsd.so.0 libmd.so.0 libtinfo.so.6; do
      p=$(ldconfig -p | awk -v l="$l" '$1 == l && !p { p = $NF } END { if (p) print p }')
      if [ -n "$p" ]; then cp -L "$p" "$G/lib/$l"; else echo "gpu_prep: $l not found"; fi
    done
    tar -C "$G/.." -cJf "$G/$NAME.tar.xz" ".gpu/$NAME"
    ls -la "$G/$NAME.tar.xz" ;;
  data)
    G4=${2:-build/g4}
    rm -rf "$G/fixtures" "$G/qfix"
    mkdir -p "$G/fixtures" "$G/qfix"
    cp -r ../shared/fixtures/gemma4 "$G/fixtures/"
    for d in "$G"/fixtures/gemma4/*/; do
      d=${d%/}; f=$(basename "$d")
      for fmt in ${G4_QFORMATS:-st-bf16 gguf-q4_0 gguf-q8_0 mlx-4 mlx-8 qat-int4 qat-int8 gguf-q4_1 gguf-q5_0 gguf-q5_1 gguf-q4_k gguf-q5_k gguf-q6_k mlx-3 mlx-6 qat-int2}; do
        case $fmt in
          mlx-*) args=(--format mlx --bits "${fmt#mlx-}" --group 32) ;;
          st-bf16) args=(--format bf16) ;; # bf16 safetensors: the prefill GEMM's bf16 path on real fixtures
          *) args=(--format "$fmt") ;;
        esac
        "$G4" convert "$d" "$G/qfix/$f-$fmt" "${args[@]}" --threads 2 >/dev/null 2>&1 ||
          { echo "gpu_prep: $f as $fmt: not converted (skipped)"; rm -rf "$G/qfix/$f-$fmt"; }
      done
    done
    # the fixtures are narrower than the K-quants' 256-column blocks (converted "K-quant" files hold
    # Q5_0/Q5_1/Q8_0, as llama.cpp falls back): a 256-wide model (tests/gpu/kq-mini.json) as real
    # Q4_K/Q5_K/Q6_K, its bf16 original beside it for the tokenizer
    rm -rf "$G/kq"
    "$G4" synth --config tests/gpu/kq-mini.json --format bf16 --out "$G/kq/kq-mini" \
        --tokenizer-from "$G/fixtures/gemma4/dense-mini" --threads 2 >/dev/null
    for fmt in gguf-q4_k gguf-q5_k gguf-q6_k; do
      "$G4" convert "$G/kq/kq-mini" "$G/qfix/kq-mini-$fmt" --format "$fmt" --threads 2 >/dev/null
    done
    tar -C "$G/.." -cJf "$G/data.tar.xz" .gpu/fixtures .gpu/qfix .gpu/kq
    ls -la "$G/data.tar.xz" ;;
  refs)
    G4=${2:-build/g4}
    mkdir -p "$G/qref"
    for q in "$G"/qfix/*/; do
      q=${q%/}; n=$(basename "$q")
      t="$G/fixtures/gemma4/${n%-*-*}"; [ -d "$t" ] || t="$G/kq/${n%-*-*}"
      { "$G4" convert "$q" "$G/qref/$n" --format f32 --threads 1 --tokenizer-from "$t" >/dev/null 2>&1 ||
          echo "gpu_prep: $n: no f32 reference"; } &
    done
    wait ;;
  *) echo "usage: scripts/gpu_prep.sh bins BUILD NAME | data [G4] | refs [G4]" >&2; exit 2 ;;
esac
