#!/usr/bin/env bash
# GGUF through the CLI: g4 convert to GGUF, g4 check on a fixture folder whose model is that GGUF
# (bf16: must pass as the safetensors model does), bad files, and — when llama.cpp is installed
# (scripts/install_llama.sh) — the same file through llama.cpp, with g4 check reporting the
# distance between the two engines.
set -euo pipefail
G4=${G4_BIN:?}; FX=${G4_FIXTURES:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A fixture folder (reference files linked) whose model is a GGUF: g4 check loads DIR/model.gguf.
fixture_with_gguf() { # model format dir
  "$G4" convert "$FX/gemma4/$1" "$3" --format "$2" >/dev/null || fail "convert $1 $2"
  for f in reference.json logits.f32 hidden.f32 ple.f32; do
    [ -e "$FX/gemma4/$1/$f" ] && ln -s "$FX/gemma4/$1/$f" "$3/"
  done
  [ -f "$3/model.gguf" ] || fail "$2: no model.gguf written"
  head -c 4 "$3/model.gguf" | grep -q GGUF || fail "$2: not a GGUF file"
}

for m in e2b-mini moe-mini unified-mini; do
  fixture_with_gguf "$m" gguf-bf16 "$tmp/$m"
  out=$("$G4" check "$tmp/$m" --threads 2) || fail "g4 check on the $m GGUF: $out"
  last=$(printf '%s\n' "$out" | tail -n 1)
  [[ $last == *": PASS"*"greedy 48/48"* ]] || fail "$m GGUF: $last"
  echo "gguf-bf16 $last"
done
# plain "gguf" keeps the checkpoint's float type (e4b-mini is float32): also a pass
fixture_with_gguf e4b-mini gguf "$tmp/e4b"
"$G4" check "$tmp/e4b" --threads 2 | tail -n 1 | grep -q ": PASS" || fail "e4b-mini f32 GGUF"
# a quantized GGUF loads and runs (its agreement is measured in tests/test_gguf_model.c)
fixture_with_gguf dense-mini gguf-q8_0 "$tmp/dense-q8"
out=$("$G4" check "$tmp/dense-q8" --threads 2 || true)
[[ $out == *"logits: max |error|"* ]] || fail "q8_0 GGUF did not run: $out"

# Bad files: a clear message naming the file, non-zero exit.
mkdir "$tmp/trunc"
for f in reference.json logits.f32; do ln -s "$FX/gemma4/moe-mini/$f" "$tmp/trunc/"; done
head -c 3000 "$tmp/moe-mini/model.gguf" > "$tmp/trunc/model.gguf"
set +e
out=$("$G4" check "$tmp/trunc" 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && [[ $out == *"$tmp/trunc/model.gguf"* ]] || fail "truncated GGUF: rc $rc: $out"
set +e
out=$("$G4" convert "$FX/gemma4/moe-mini" "$tmp/x" --format gguf-q3_x 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && [[ $out == *"gguf-q3_x"* ]] || fail "unknown GGUF type accepted: $out"

# llama.cpp on the same files, when installed
llama_dir=${G4_LLAMA_DIR:-$root/.llama}
if [ -d "$llama_dir/node_modules/node-llama-cpp" ] && command -v node >/dev/null; then
  for m in dense-mini e2b-mini; do
    for t in f32 q8_0; do
      d="$tmp/llama-$m-$t"
      fixture_with_gguf "$m" "gguf-$t" "$tmp/src-$m-$t"
      G4_LLAMA_DIR=$llama_dir node "$root/scripts/llama_compare.mjs" "$tmp/src-$m-$t/model.gguf" \
        --fixture "$FX/gemma4/$m" --out "$d" --threads 1 > "$d.json" || fail "llama_compare on $m $t"
      out=$("$G4" check "$d" --threads 2 || true)
      last=$(printf '%s\n' "$out" | tail -n 1)
      [[ $last == "check $d: "* ]] || fail "g4 check on llama.cpp's output for $m $t: $out"
      speed=$(node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
        console.log(`llama.cpp ${j.llama_cpp_release}: prefill ${j.prefill_tok_s.toFixed(0)} tok/s, decode ${j.decode_tok_s.toFixed(0)} tok/s`)' "$d.json")
      echo "g4 vs llama.cpp, $m $t: ${last#check $d: } ($speed)"
    done
  done
else
  echo "llama.cpp comparison skipped: node-llama-cpp not installed (bash scripts/install_llama.sh)"
fi
echo "gguf.sh: all good"
