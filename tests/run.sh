#!/usr/bin/env bash
# Runs every test program in BUILD/tests and every tests/cli/*.sh script; prints one line per
# test program and a closing "N passed, N failed" line; exits non-zero if anything failed.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
export G4_FIXTURES=${G4_FIXTURES:-$PWD/../shared/fixtures}
export G4_BIN=$PWD/$BUILD/g4
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
pass=0; fail=0; failed=()
log=$BUILD/test-logs; mkdir -p "$log"
run_one() {
  local name=$1; shift
  local start=$(date +%s%N)
  if "$@" >"$log/$name.log" 2>&1; then
    pass=$((pass+1)); printf 'PASS %-32s %6d ms\n' "$name" $(( ($(date +%s%N) - start) / 1000000 ))
  else
    fail=$((fail+1)); failed+=("$name"); printf 'FAIL %-32s (log: %s)\n' "$name" "$log/$name.log"
    tail -n 40 "$log/$name.log" | sed 's/^/     | /'
  fi
}
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  run_one "$(basename "$t")" "$t"
done
for s in tests/cli/*.sh; do
  [ -f "$s" ] || continue
  run_one "cli-$(basename "$s" .sh)" bash "$s"
done
echo "${pass} passed, ${fail} failed"
[ "$fail" -eq 0 ]
