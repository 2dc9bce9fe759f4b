#!/usr/bin/env bash
# The CUDA kernels' machine code, without a GPU: compiles translation units to cubins with the
# build's own flags (`make print-nvflags`) and lists, per kernel, its SASS size, a hash of its SASS,
# its registers and its stack and spills (ptxas -v). Two lists compared say which kernels a source
# change touched before any GPU time is spent: the staged decode's kernels are sensitive to their
# code's shape (README, session 31: a change to one helper made one-token decode 6-9% slower), so an
# edit meant to leave some kernels alone should be checked to leave their bytes alone. (The final
# code, with ptxas's register and spill counts; scripts/ptx_compare.py compares one instantiation's
# PTX and prints where two kernels differ.)
#   scripts/cuda_codegen.sh list [SRCDIR] > A.tsv    SRCDIR: a source tree (default: this one)
#   scripts/cuda_codegen.sh diff A.tsv B.tsv         kernels changed, added or gone; size and registers
# CODEGEN_TUS picks the translation units: "stage" (src/cuda/stage.cu, the staged decode's kernels;
# the default), "inst:I" (the persistent kernel's instantiation I, src/cuda/inst/kernel.cu
# -DG4C_INST=I), or any other path under SRCDIR. They compile in parallel (CODEGEN_JOBS, default
# the CPU count); stage.cu alone takes ~8 minutes on one core.
# TSV columns: unit, kernel (demangled), SASS bytes, SASS md5 (10 hex digits), registers, stack
# frame bytes, spill store bytes, spill load bytes.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)}

unit_list() { # SRCDIR UNIT WORK: one unit's kernels as TSV lines
  local src=$1 u=$2 w=$3 file defs=() tag
  case $u in
    stage) file=src/cuda/stage.cu ;;
    inst:*) file=src/cuda/inst/kernel.cu; defs=(-DG4C_INST="${u#inst:}") ;;
    *) file=$u ;;
  esac
  tag=$(printf '%s' "$u" | tr -c 'A-Za-z0-9_.-' _)
  # shellcheck disable=SC2086 # NVFLAGS is a word list
  (cd "$src" && "$nvcc" $flags "${defs[@]}" -cubin -Xptxas -v -o "$w/$tag.cubin" "$file") >"$w/$tag.log" 2>&1 ||
    { echo "cuda_codegen: $u did not compile:" >&2; tail -n 20 "$w/$tag.log" >&2; return 1; }
  unit_parse "$u" "$w/$tag"
}

unit_parse() { # UNIT BASE: BASE.cubin and BASE.log (ptxas -v) as TSV lines
  local u=$1 b=$2
  # ptxas -v: registers per entry function, stack and spills per function
  sed -e "s/.*Compiling entry function '\([^']*\)'.*/E \1/" -e 's/.*Function properties for \([^ ]*\).*/F \1/' \
    "$b.log" | awk '
    $1 == "E" { cur = $2; ent[cur] = 1 }
    $1 == "F" { fp = $2 }
    /bytes stack frame/ { st[fp] = $1; ss[fp] = $5; sl[fp] = $9 }
    /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") rg[cur] = $(i + 1) }
    END { for (k in ent) printf "%s\t%s\t%s\t%s\t%s\n", k, rg[k], st[k] + 0, ss[k] + 0, sl[k] + 0 }' |
    sort >"$b.res"
  readelf -SW "$b.cubin" 2>/dev/null |
    sed -n 's/^ *\[ *[0-9]*\] \.text\.\([^ ]*\) *[A-Z_]* *[0-9a-f]* [0-9a-f]* \([0-9a-f]*\) .*/\1 \2/p' | sort -u |
    while read -r k sz; do
      sz=$((16#$sz))
      h=$(readelf -x ".text.$k" "$b.cubin" 2>/dev/null | tail -n +3 | md5sum | cut -c1-10)
      r=$(awk -F'\t' -v k="$k" '$1 == k { print $2 "\t" $3 "\t" $4 "\t" $5 }' "$b.res")
      printf '%s\t%s\t%s\t%s\t%s\n' "$u" "$(echo "$k" | c++filt)" "$sz" "$h" "${r:-?	?	?	?}"
    done
}

case ${1:-} in
  list)
    src=$(cd "${2:-$here}" && pwd)
    flags=$(make -s -C "$here" --no-print-directory print-nvflags)
    [ -n "$flags" ] || { echo "cuda_codegen: no nvcc (make print-nvflags is empty)" >&2; exit 1; }
    w=$(mktemp -d)
    trap 'rm -rf "$w"' EXIT
    jobs=${CODEGEN_JOBS:-$(nproc)}
    pids=()
    for u in ${CODEGEN_TUS:-stage}; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
      unit_list "$src" "$u" "$w" >"$w/$(printf '%s' "$u" | tr -c 'A-Za-z0-9_.-' _).tsv" &
      pids+=($!)
    done
    fail=0
    for p in "${pids[@]}"; do wait "$p" || fail=1; done
    [ $fail = 0 ] || exit 1
    printf 'unit\tkernel\tbytes\tmd5\tregs\tstack\tspill_st\tspill_ld\n'
    cat "$w"/*.tsv ;;
  diff)
    a=${2:?first list}; b=${3:?second list}
    awk -F'\t' '
      FNR == 1 { f++; next }
      { k = $1 "\t" $2; if (f == 1) { A[k] = $0 } else { B[k] = $0 } }
      END {
        same = 0
        for (k in A) {
          if (!(k in B)) { split(A[k], x, "\t"); printf "gone     %s %s\n", x[1], x[2]; continue }
          split(A[k], x, "\t"); split(B[k], y, "\t")
          if (x[4] == y[4]) { same++; continue }
          printf "changed  %-10s %-55s bytes %8d -> %8d (%+d)  regs %s -> %s  spills %s/%s -> %s/%s\n", x[1], x[2], x[3], y[3], y[3] - x[3], x[5], y[5], x[7], x[8], y[7], y[8]
        }
        for (k in B) if (!(k in A)) { split(B[k], y, "\t"); printf "new      %s %s\n", y[1], y[2] }
        printf "%d kernels with the same bytes\n", same
      }' "$a" "$b" | sort ;;
  *) echo "usage: scripts/cuda_codegen.sh list [SRCDIR] > A.tsv | diff A.tsv B.tsv" >&2; exit 2 ;;
esac
