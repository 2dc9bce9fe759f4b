#!/usr/bin/env bash
# CPU A/B: decode and prefill of one model across g4 builds, the builds run alternately (this
# machine's bandwidth moves by up to 2x within minutes, so only interleaved runs compare).
#
#   bash scripts/cpu_ab.sh MODEL BUILD[,BUILD...] [REPS]      (default 5 reps)
#   env: G4_AB_ARGS  extra `g4 bench` arguments (default: --ctx 128 --gen 32 --prefill 512)
#        G4_AB_THREADS  threads (default 2)
#
# MODEL is anything `g4 bench -m` loads; BUILD a build directory holding g4 (e.g. build). Per
# build it prints the median and the range over the reps of: decode tok/s, decode as a share of
# the bandwidth g4 bench measured around that row, and the prefill rows' tok/s.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
model=$1 builds=$2 reps=${3:-5}
args=${G4_AB_ARGS:---ctx 128 --gen 32 --prefill 512}
threads=${G4_AB_THREADS:-2}
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "cpu_ab: REPS must be a positive integer" >&2; exit 2; }
IFS=, read -r -a bs <<< "$builds"
for b in "${bs[@]}"; do [ -x "$b/g4" ] || { echo "cpu_ab: $b/g4 not found" >&2; exit 1; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
num() { grep -o "\"$1\": [0-9.e+-]*" | head -1 | sed 's/.*: //'; }
for r in $(seq "$reps"); do
    for i in "${!bs[@]}"; do
        # shellcheck disable=SC2086
        out=$("${bs[$i]}/g4" bench -m "$model" --threads "$threads" --no-verify --json $args 2>/dev/null | grep '^{')
        ctx=$(grep '"row": "context"' <<< "$out" | head -1)
        dec=$(num decode_tok_s <<< "$ctx") gbs=$(num gb_s <<< "$ctx") bw=$(num bw_gb_s <<< "$ctx")
        pre=$(grep '"row": "prefill"' <<< "$out" | num prefill_tok_s || true)
        share=$(awk -v g="$gbs" -v b="$bw" 'BEGIN { printf "%.1f", (b > 0 ? 100 * g / b : 0) }')
        echo "$dec $share ${pre:-0}" >> "$tmp/$i"
        echo "rep $r ${bs[$i]}: decode $dec tok/s ($share% of $bw GB/s), prefill ${pre:--} tok/s"
    done
done
echo
printf '%-24s %26s %22s %26s\n' build "decode tok/s med [range]" "of bw % med [range]" "prefill tok/s med [range]"
for i in "${!bs[@]}"; do
    line=""
    for col in 1 2 3; do
        line+=$(cut -d' ' -f$col "$tmp/$i" | sort -g | awk '{ v[NR] = $1 } END {
            m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%10.1f [%.1f-%.1f]", m, v[1], v[NR] }')
        line+="   "
    done
    printf '%-24s %s\n' "${bs[$i]}" "$line"
done
