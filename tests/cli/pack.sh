#!/usr/bin/env bash
# g4 pack: a fixture model and its drafter packed, then run from the pack alone (model, drafter,
# tokenizer) with output identical to the original folder's; a converted quantised drafter used
# through --draft; bad arguments and inputs refused with a message.
set -euo pipefail
G4=${G4_BIN:?}; FX=${G4_FIXTURES:?}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$("$G4" pack --help) || fail "pack --help"
[[ $out == *"usage: g4 pack IN OUT"* ]] || fail "help: $out"
"$G4" --help | grep -q '^  pack ' || fail "pack not in the command list"

m=$FX/gemma4/e2b-mini
out=$("$G4" pack "$m" "$tmp/e2b.g4p" --tokenizer "$FX/tokenizer/tokenizer.json") || fail "pack: $out"
[[ $out == *"model, 160 tensors + tokenizer.json"* ]] || fail "pack summary: $out"
out=$("$G4" pack "$m/assistant" "$tmp/draft") || fail "pack drafter: $out"
[[ $out == *"$tmp/draft/model.g4p: drafter"* ]] || fail "drafter pack summary: $out"

# the same ids from the folder and from the pack, with and without the (packed) drafter
ids="2 17 301 44 9"
want=$("$G4" run -m "$m" --ids -p "$ids" --max-tokens 24 -q 2>/dev/null) || fail "run folder"
got=$("$G4" run -m "$tmp/e2b.g4p" --ids -p "$ids" --max-tokens 24 -q 2>/dev/null) || fail "run pack"
[ "$want" == "$got" ] || fail "pack output '$got' differs from folder output '$want'"
got=$("$G4" run -m "$tmp/e2b.g4p" --ids -p "$ids" --max-tokens 24 -q --draft "$tmp/draft" 2>/dev/null) \
  || fail "run pack with drafter pack"
[ "$want" == "$got" ] || fail "drafted output '$got' differs from '$want'"
"$G4" convert "$m/assistant" "$tmp/draft-mlx4" --format mlx-4 --group 32 >/dev/null || fail "convert drafter"
got=$("$G4" run -m "$m" --ids -p "$ids" --max-tokens 24 -q --draft "$tmp/draft-mlx4" 2>/dev/null) \
  || fail "run with an MLX 4-bit drafter"
[ "$want" == "$got" ] || fail "mlx-4 drafted output '$got' differs from '$want'"
# the tokenizer comes from the pack (vocabulary 262144 against the fixture's 512: refused by name)
out=$("$G4" run -m "$tmp/e2b.g4p" -p "hi" --max-tokens 2 2>&1) && fail "vocabulary mismatch accepted"
[[ $out == *"262144 tokens but the model's vocabulary is 512"* ]] || fail "tokenizer from pack: $out"

set +e
out=$("$G4" pack "$m" 2>&1); rc=$?
[ $rc -eq 2 ] && [[ $out == *"IN and OUT are required"* ]] || fail "missing OUT: rc $rc: $out"
out=$("$G4" pack "$tmp/nope" "$tmp/x.g4p" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ $out == *"$tmp/nope"* ]] || fail "missing input: rc $rc: $out"
head -c 5000 "$tmp/e2b.g4p" > "$tmp/cut.g4p"
out=$("$G4" run -m "$tmp/cut.g4p" --ids -p "2" --max-tokens 1 2>&1); rc=$?
[ $rc -ne 0 ] && [[ $out == *"cut.g4p"* ]] || fail "truncated pack: rc $rc: $out"
echo "pack: ok"
