#!/usr/bin/env bash
# g4 synth and g4 convert: a full-width E2B (two layers, MLX 4-bit) written, loaded and run; every
# fixture converted to each writer format and run; bad arguments refused with a message.
# (Full-depth sizes are run by hand: see the report; one E2B bf16 is ~10 GB.)
set -euo pipefail
G4=${G4_BIN:?}; FX=${G4_FIXTURES:?}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# E2B geometry (vocab 262144, hidden 1536, per-layer inputs) truncated to 2 layers
out=$("$G4" synth --arch e2b --layers 2 --format mlx-4 --seed 3 --out "$tmp/e2b" \
      --tokenizer-from "$FX/tokenizer" --threads 2 --check) || fail "synth e2b: $out"
echo "$out"
[[ $out == *"synth e2b mlx-4 -> $tmp/e2b"* ]] || fail "synth summary: $out"
[[ $out == *"check $tmp/e2b: 2 layers, hidden 1536"* ]] || fail "synth check: $out"
cmp -s "$FX/tokenizer/tokenizer.json" "$tmp/e2b/tokenizer.json" || fail "tokenizer.json not copied"
grep -q '"quantization"' "$tmp/e2b/config.json" || fail "no quantization block in config.json"
grep -q '"language_model.model.layers.0.self_attn.q_proj.weight"' <(head -c 200000 "$tmp/e2b/model.safetensors") \
  || fail "mlx-vlm tensor names"

# a geometry from a config.json (tests/gpu/kq-mini.json: widths that are multiples of 256), written
# as K-quants: every matrix really is Q4_K (the narrow fixtures fall back to Q5_0 as llama.cpp does);
# the output folder's missing parents are created
out=$("$G4" synth --config tests/gpu/kq-mini.json --format gguf-q4_k --out "$tmp/new/kq" \
      --tokenizer-from "$FX/gemma4/dense-mini" --threads 2 --check) || fail "synth --config: $out"
[[ $out == *"check $tmp/new/kq: 4 layers, hidden 256"* ]] || fail "synth --config check: $out"
grep -q "blk.0.ffn_down.weight" "$tmp/new/kq/model.gguf" || fail "kq gguf tensor names"
set +e
out=$("$G4" synth --config tests/gpu/kq-mini.json --layers 2 --format f32 --out "$tmp/x" 2>&1); rc=$?
[ $rc -eq 2 ] && [[ $out == *"--layers"* ]] || fail "--config with --layers: rc $rc: $out"
echo '{"hidden_size": "wide"}' > "$tmp/bad.json"
out=$("$G4" synth --config "$tmp/bad.json" --format f32 --out "$tmp/x" 2>&1); rc=$?
[ $rc -eq 2 ] && [[ $out == *"$tmp/bad.json"* ]] || fail "bad config: rc $rc: $out"
set -e

# every fixture through every writer (tiny: seconds)
for m in e2b-mini moe-mini; do
  for f in bf16 f32 mlx-8 qat qat-int8; do
    extra=(); [[ $f == mlx-* ]] && extra=(--group 32)
    out=$("$G4" convert "$FX/gemma4/$m" "$tmp/$m-$f" --format "$f" "${extra[@]}" --threads 2 --check) \
      || fail "convert $m $f: $out"
    [[ $out == *"check $tmp/$m-$f:"* ]] || fail "convert $m $f: $out"
  done
done
echo "converted 2 fixtures to 5 formats"
# a converted model converts back (MLX -> f32) and the text-only layout is honoured
"$G4" convert "$tmp/moe-mini-mlx-8" "$tmp/back" --format f32 --text-only >/dev/null || fail "mlx back to f32"
grep -q '"Gemma4ForCausalLM"' "$tmp/back/config.json" || fail "text-only config"

# bad input
set +e
out=$("$G4" synth --arch e3b --format bf16 --out "$tmp/x" 2>&1); rc=$?
[ $rc -ne 0 ] && [[ $out == *"unknown architecture 'e3b'"* ]] || fail "bad arch: rc $rc: $out"
out=$("$G4" synth --arch e2b --format q3_k --out "$tmp/x" 2>&1); rc=$?
[ $rc -ne 0 ] && [[ $out == *"unknown output format 'q3_k'"* && $out == *"mlx"* ]] || fail "bad format: rc $rc: $out"
out=$("$G4" synth --arch e2b --format mlx --group 48 --out "$tmp/x" 2>&1); rc=$?
[ $rc -ne 0 ] && [[ $out == *"group size 48"* ]] || fail "bad group: rc $rc: $out"
out=$("$G4" synth --arch e2b --format bf16 2>&1); rc=$?
[ $rc -eq 2 ] || fail "missing --out accepted"
if ! command -v nvidia-smi >/dev/null; then # no GPU here: bench says so before it builds a model
  out=$("$G4" bench --synth e2b --device cuda 2>&1); rc=$?
  [ $rc -ne 0 ] && [[ $out == *"no CUDA device/driver"* && $out != *"model:"* ]] ||
    fail "bench --device cuda without a GPU: rc $rc: $out"
fi
out=$("$G4" convert "$tmp/nope" "$tmp/y" --format bf16 2>&1); rc=$?
[ $rc -ne 0 ] && [[ $out == *"$tmp/nope"* ]] || fail "convert of a missing dir: rc $rc: $out"
set -e
"$G4" synth --help | grep -q -- "--layers" || fail "synth --help"
"$G4" convert --help | grep -q "qat" || fail "convert --help"
echo "synth.sh: all good"
