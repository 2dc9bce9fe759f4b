#!/usr/bin/env bash
# Nsight Compute metrics for some launches of one staged kernel, on a GPU machine with ncu, using
# prebuilt binaries (scripts/gpu_prep.sh bins BUILD NAME; carry .gpu/NAME.tar.xz and .gpu/lib):
#   bash scripts/gpu_ncu.sh NAME STORAGE KERNEL_REGEX SKIP COUNT [ARCH]  > metrics.csv
# e.g. the one-token 4-bit stage kernel (mangled g4c_stage_kernel<279, 2>) on E2B qat-int4, from
# the first stage of the third decoded token: gpu_ncu.sh NAME qat-int4 _Z16g4c_stage_kernelILj279ELi2E 422 7
# Per launch: duration, DRAM bytes, warp instructions, issue activity, local-memory traffic and the
# average stall cycles per issued instruction by reason (CSV, one metric per line). With
# NCU_SOURCE=FILE, also the first of those launches' source counters (per SASS instruction: the
# instruction, executions and warp stall samples by reason) as CSV into FILE. NCU_CACHE: ncu's
# --cache-control (default none: caches as the chained decode leaves them; "all" flushes them before
# every replayed launch, ncu's own default, which inflates instruction-fetch stalls: README session 33).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?prebuilt name}; st=${2:?storage}; rx=${3:?kernel regex (mangled)}; skip=${4:?launches to skip}; n=${5:?launches}
arch=${6:-e2b}
[ -d .gpu/$name ] || tar xf .gpu/$name.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
m=gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg
m=$m,smsp__issue_active.avg.pct_of_peak_sustained_active
for r in no_instruction long_scoreboard barrier wait short_scoreboard math_pipe_throttle branch_resolving lg_throttle \
  mio_throttle membar sleeping selected not_selected dispatch_stall imc_miss drain misc tex_throttle; do
  m=$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
m=$m,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum
ncu --cache-control "${NCU_CACHE:-none}" --kernel-name-base mangled -k regex:"$rx" --launch-skip "$skip" --launch-count "$n" \
  --metrics "$m" --csv \
  --print-units base .gpu/$name/bench/gpu_bench --arch "$arch" --storage "$st" --ctx 128 --tokens 8 --no-breakdown 2>/dev/null |
  grep '^"'
if [ -n "${NCU_SOURCE:-}" ]; then
  rep=$(mktemp -d)/src
  ncu --cache-control "${NCU_CACHE:-none}" --kernel-name-base mangled -k regex:"$rx" --launch-skip "$skip" --launch-count 1 \
    --section SourceCounters \
    --section WarpStateStats -o "$rep" .gpu/$name/bench/gpu_bench --arch "$arch" --storage "$st" --ctx 128 --tokens 8 \
    --no-breakdown >/dev/null 2>&1
  ncu --import "$rep.ncu-rep" --page source --print-source sass --csv >"$NCU_SOURCE" 2>&1
  ncu --import "$rep.ncu-rep" --page details --csv 2>&1 | grep -i "warp state\|stall" | head -40
fi
