#!/usr/bin/env bash
# g4 tokenize / g4 detokenize on the tokenizer fixtures, through both file formats: the corpus
# and special-token ids, round trips (JSONL and raw bytes), flags, and error exits.
set -euo pipefail
G4=${G4_BIN:?set G4_BIN to the g4 binary}
FIX=${G4_FIXTURES:?set G4_FIXTURES}/tokenizer
JSON=$FIX/tokenizer.json
GGUF=$FIX/ggml-vocab-gemma-4.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Runs a command that must fail with status $1 and print $2 (a fixed string) on stderr.
expect_fail() {
  local want_rc=$1 want_msg=$2; shift 2
  local rc=0
  "$@" > "$tmp/stdout" 2> "$tmp/stderr" || rc=$?
  [ "$rc" -eq "$want_rc" ] || fail "$* exited $rc, expected $want_rc: $(cat "$tmp/stderr")"
  grep -qF -- "$want_msg" "$tmp/stderr" || fail "$*: stderr lacks '$want_msg': $(cat "$tmp/stderr")"
}

# The fixtures' ids, written as the CLI writes them (Python's json.dumps spacing).
ids_of() { sed 's/.*"ids": \(\[.*\]\)}$/\1/' "$1"; }
ids_of "$FIX/corpus.jsonl" > "$tmp/corpus.ids"
ids_of "$FIX/special.jsonl" > "$tmp/special.ids"
[ "$(wc -l < "$tmp/corpus.ids")" -eq 4219 ] || fail "corpus.jsonl: expected 4219 lines"
# NULs, invalid UTF-8, no trailing newline; without '▁', which decodes as a space
head -c 65536 "$GGUF" | LC_ALL=C sed 's/\xe2\x96\x81/_/g' > "$tmp/binary"

for tok in "$JSON" "$GGUF"; do
  t=(--tokenizer "$tok")
  "$G4" tokenize "${t[@]}" --jsonl < "$FIX/corpus.jsonl" > "$tmp/out.ids"
  cmp -s "$tmp/out.ids" "$tmp/corpus.ids" || fail "corpus ids differ with $tok"
  "$G4" tokenize "${t[@]}" --jsonl --special < "$FIX/special.jsonl" > "$tmp/out.ids"
  cmp -s "$tmp/out.ids" "$tmp/special.ids" || fail "special.jsonl ids differ with $tok"

  # ids → JSON texts → ids; detokenize also reads the corpus's {"text", "ids"} objects
  "$G4" detokenize "${t[@]}" --jsonl < "$tmp/corpus.ids" > "$tmp/texts.jsonl"
  [ "$(wc -l < "$tmp/texts.jsonl")" -eq 4219 ] || fail "detokenize --jsonl line count"
  "$G4" tokenize "${t[@]}" --jsonl < "$tmp/texts.jsonl" | cmp -s - "$tmp/corpus.ids" \
    || fail "JSONL round trip with $tok"
  "$G4" detokenize "${t[@]}" --jsonl < "$FIX/corpus.jsonl" | cmp -s - "$tmp/texts.jsonl" \
    || fail "detokenize of corpus objects with $tok"

  # raw bytes round trip exactly, text and binary alike
  for f in "$FIX/vectors.inp" "$tmp/binary"; do
    "$G4" tokenize "${t[@]}" < "$f" | "$G4" detokenize "${t[@]}" | cmp -s - "$f" \
      || fail "raw round trip of $f with $tok"
  done
done

t=(--tokenizer "$GGUF")
[ "$(printf 'Hello world' | "$G4" tokenize "${t[@]}")" = "9259 1902" ] || fail "Hello world"
[ "$(printf 'Hello world' | "$G4" tokenize "${t[@]}" --bos)" = "2 9259 1902" ] || fail "--bos"
[ "$(printf 'Hello world\n' | "$G4" tokenize "${t[@]}")" = "9259 1902 107" ] || fail "newline"
[ "$(printf '' | "$G4" tokenize "${t[@]}")" = "" ] || fail "empty input"
# special-token strings are text unless --special; <|channel> (not special) always matches
[ "$(printf '<bos>' | "$G4" tokenize "${t[@]}" --special)" = "2" ] || fail "--special"
[ "$(printf '<bos>' | "$G4" tokenize "${t[@]}")" != "2" ] || fail "<bos> parsed without --special"
[ "$(printf '<|channel>' | "$G4" tokenize "${t[@]}")" = "100" ] || fail "<|channel>"
[ "$(echo '"<|turn>"' | "$G4" tokenize "${t[@]}" --jsonl --special --bos)" = "[2, 105]" ] \
  || fail "--jsonl --special --bos"
[ "$(echo '""' | "$G4" tokenize "${t[@]}" --jsonl)" = "[]" ] || fail "empty JSON string"

[ "$(echo '9259 1902' | "$G4" detokenize "${t[@]}")" = "Hello world" ] || fail "detokenize"
[ "$(echo '2, 9259,1902 106' | "$G4" detokenize "${t[@]}")" = "<bos>Hello world<turn|>" ] \
  || fail "detokenize with commas and special tokens"
[ "$(echo '2 9259 1902 106' | "$G4" detokenize "${t[@]}" --skip-special)" = "Hello world" ] \
  || fail "--skip-special"
# a character split over byte tokens comes out whole; a lone lead byte becomes \ufffd in JSON
[ "$(echo '478 397 404 391' | "$G4" detokenize "${t[@]}")" = "🦙" ] || fail "byte tokens"
[ "$(echo '[478, 9259]' | "$G4" detokenize "${t[@]}" --jsonl)" = '"\ufffdHello"' ] \
  || fail "invalid UTF-8 in --jsonl output"

# -m MODEL_DIR reads the directory's tokenizer.json
mkdir "$tmp/model"
ln -s "$JSON" "$tmp/model/tokenizer.json"
[ "$(printf 'Hello world' | "$G4" tokenize -m "$tmp/model")" = "9259 1902" ] || fail "-m"

"$G4" tokenize --help | grep -qF "usage: g4 tokenize" || fail "tokenize --help"
"$G4" detokenize --help | grep -qF "usage: g4 detokenize" || fail "detokenize --help"
"$G4" --help | grep -qF "tokenize" || fail "g4 --help lists tokenize"

# errors
expect_fail 2 "exactly one of --tokenizer FILE and -m MODEL_DIR" "$G4" tokenize
expect_fail 2 "exactly one of" "$G4" detokenize --tokenizer "$GGUF" -m "$tmp/model"
expect_fail 2 "unknown option '--frobnicate'" "$G4" tokenize --frobnicate
expect_fail 2 "--tokenizer needs a value" "$G4" tokenize --tokenizer
expect_fail 1 "$tmp/missing.json: cannot open" "$G4" tokenize --tokenizer "$tmp/missing.json"
expect_fail 1 "no tokenizer.json in this model directory" "$G4" tokenize -m "$tmp"
head -c 100000 "$JSON" > "$tmp/cut.json"
expect_fail 1 "cut.json: line" "$G4" tokenize --tokenizer "$tmp/cut.json" < /dev/null
head -c 1000000 "$GGUF" > "$tmp/cut.gguf"
expect_fail 1 "cut.gguf: key 'tokenizer.ggml.tokens': truncated" "$G4" detokenize --tokenizer "$tmp/cut.gguf" < /dev/null
echo "plain words" > "$tmp/words.txt"
expect_fail 1 "neither a GGUF file nor a tokenizer.json" "$G4" tokenize --tokenizer "$tmp/words.txt"
expect_fail 1 'stdin: line 1, column 12: the object has no "text" member' \
  "$G4" tokenize "${t[@]}" --jsonl <<< '{"nope": 1}'
expect_fail 1 "stdin: line 2, column 1: expected a JSON string" \
  "$G4" tokenize "${t[@]}" --jsonl < <(printf '"fine"\nnot json\n')
expect_fail 1 "more than one JSON value on the line" \
  "$G4" tokenize "${t[@]}" --jsonl <<< '"a" "b"'
expect_fail 1 "'abc' is not a token id" "$G4" detokenize "${t[@]}" <<< '12 abc'
expect_fail 1 "token id 999999 at position 1 is out of range [0, 262144)" \
  "$G4" detokenize "${t[@]}" <<< '12 999999'
expect_fail 1 "stdin: line 2: token id -1 at position 0 is out of range" \
  "$G4" detokenize "${t[@]}" --jsonl < <(printf '[1]\n[-1]\n')
expect_fail 1 "expected an integer" "$G4" detokenize "${t[@]}" --jsonl <<< '[1.5]'
echo "tokenize.sh: all checks passed"
