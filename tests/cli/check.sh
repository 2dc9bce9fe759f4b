#!/usr/bin/env bash
# g4 check on every fixture model, on a doctored fixture (must fail), on bad input, and --dump.
set -euo pipefail
G4=${G4_BIN:?}; FX=${G4_FIXTURES:?}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for m in e2b-mini e4b-mini moe-mini dense-mini unified-mini; do
  out=$("$G4" check "$FX/gemma4/$m" --threads 2) || fail "g4 check $m exited $?: $out"
  last=$(printf '%s\n' "$out" | tail -n 1)
  [[ $last == "check $FX/gemma4/$m: PASS"* ]] || fail "$m: last line: $last"
  [[ $last == *"greedy 48/48"* ]] || fail "$m: greedy: $last"
  echo "$last"
done

# Any folder in the fixture format: a copy whose recorded logits are wrong by 10 at one spot fails.
mkdir "$tmp/doctored"
for f in "$FX"/gemma4/dense-mini/*; do ln -s "$f" "$tmp/doctored/"; done
rm "$tmp/doctored/logits.f32"; cp "$FX/gemma4/dense-mini/logits.f32" "$tmp/doctored/logits.f32"
chmod u+w "$tmp/doctored/logits.f32"
printf '\x00\x00\x20\x41' | dd of="$tmp/doctored/logits.f32" bs=1 seek=400 conv=notrunc status=none
set +e
out=$("$G4" check "$tmp/doctored" 2>&1); rc=$?
set -e
[ $rc -eq 1 ] || fail "doctored fixture: exit $rc"
[[ $(printf '%s\n' "$out" | tail -n 1) == *": FAIL "* ]] || fail "doctored fixture: $out"

# Bad input: a clear message naming the file, non-zero exit.
set +e
out=$("$G4" check "$tmp/nope" 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && [[ $out == *"$tmp/nope/reference.json"* ]] || fail "missing folder: rc $rc: $out"
mkdir "$tmp/trunc"
for f in "$FX"/gemma4/moe-mini/*; do ln -s "$f" "$tmp/trunc/"; done
rm "$tmp/trunc/model.safetensors"; head -c 1000 "$FX/gemma4/moe-mini/model.safetensors" > "$tmp/trunc/model.safetensors"
set +e
out=$("$G4" check "$tmp/trunc" 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && [[ $out == *"model.safetensors"* && $out == *"past the end"* ]] || fail "truncated: rc $rc: $out"
set +e
"$G4" check "$FX/gemma4/moe-mini" --threads zero >/dev/null 2>&1; rc=$?
set -e
[ $rc -eq 2 ] || fail "bad --threads accepted"
"$G4" check --help | grep -q -- "--dump" || fail "--help"

# --dump writes the fixture's hidden.f32 layout ([L+2][positions][H]) and per-step files.
"$G4" check "$FX/gemma4/e2b-mini" --dump "$tmp/dump" --dump-pos 3,7 >/dev/null
[ "$(stat -c %s "$tmp/dump/hidden.f32")" -eq $(( 12 * 2 * 96 * 4 )) ] || fail "dump hidden size"
[ "$(stat -c %s "$tmp/dump/q.f32")" -eq $(( 10 * 2 * 4 * 32 * 4 )) ] || fail "dump q size"
"$G4" check "$FX/gemma4/e2b-mini" --dump "$tmp/dumpall" >/dev/null
cmp -s <(head -c $(( 64 * 96 * 4 )) "$tmp/dumpall/hidden.f32") <(head -c $(( 64 * 96 * 4 )) "$tmp/dumpall/embed.f32") || fail "dump embed rows"
echo "check.sh: all good"
