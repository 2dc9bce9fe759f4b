#!/usr/bin/env bash
# g4 against llama.cpp on the same synthesized GGUF files: decode and prefill tokens/s and the ratio.
#
#   bash scripts/race.sh [--arch e2b,e4b,26b-a4b] [--types q4_0,q8_0] [--threads 2] [--gen 64]
#        [--ctx 128] [--prompt 512] [--reps 3] [--stat best|median] [--dir /tmp/g4-race]
#        [--layers N] [--g4 build/g4] [--kv f16] [--batch 512] [--llama node|native]
#        [--llama-bench PATH]
#
# For each arch x type it writes DIR/ARCH-TYPE (DIR/ARCH-TYPE-LN with --layers N) with
# `g4 synth --format gguf-TYPE` unless a model.gguf is already there, then runs, alternately and
# --reps times, llama.cpp (scripts/llama_bench.mjs: node-llama-cpp's prebuilt CPU build) and
# `g4 bench -m DIR --ctx C --gen N --threads T --no-verify --prefill P --json`. With --llama native
# llama.cpp is a llama-bench built for this CPU (scripts/install_llama.sh --native, or --llama-bench
# PATH): `llama-bench -p P -n 0` for the prefill and `-p 0 -n N -d C` for decode (N tokens after C
# in the cache; llama-bench's own token ids, one warm-up run each):
#   decode   --gen tokens one at a time after a prefill of --ctx tokens (greedy, LM head each step)
#   prefill  --prompt tokens from an empty context (llama.cpp's pp512 at the default 512; 0 skips)
# Both engines get the same token ids. Model load is not timed. Per cell the best (default) or the
# median of the repetitions is reported; the machine is shared and noisy, so the engines alternate.
# bytes/token is g4's figure (weights read per token: for MoE the active experts only, plus K/V),
# bw the read bandwidth g4 bench measures around its decode row (the mean of the probes before and after).
# Needs: node >= 18 and node-llama-cpp (bash scripts/install_llama.sh), a built g4 (make).
# Every raw measurement goes to DIR/race-TIMESTAMP.jsonl; the summary table ends the output.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

archs=e2b,e4b,26b-a4b types=q4_0,q8_0 threads=2 gen=64 ctx=128 prompt=512 reps=3 stat=best
dir=/tmp/g4-race layers=0 g4=${G4_BIN:-$root/build/g4} kv="" batch=512 llama=node lbench=""

die() { echo "race: $*" >&2; exit 1; }
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) usage 0 ;;
        --arch|--archs) archs=${2:?--arch needs a value}; shift 2 ;;
        --types|--type) types=${2:?--types needs a value}; shift 2 ;;
        --threads) threads=${2:?}; shift 2 ;;
        --gen) gen=${2:?}; shift 2 ;;
        --ctx) ctx=${2:?}; shift 2 ;;
        --prompt) prompt=${2:?}; shift 2 ;;
        --reps) reps=${2:?}; shift 2 ;;
        --stat) stat=${2:?}; shift 2 ;;
        --dir) dir=${2:?}; shift 2 ;;
        --layers) layers=${2:?}; shift 2 ;;
        --g4) g4=${2:?}; shift 2 ;;
        --kv) kv=${2:?}; shift 2 ;;
        --batch) batch=${2:?}; shift 2 ;;
        --llama) llama=${2:?--llama needs node or native}; shift 2 ;;
        --llama-bench) lbench=${2:?}; llama=native; shift 2 ;;
        *) echo "race: unknown option '$1'" >&2; usage 2 ;;
    esac
done
for v in threads gen ctx prompt reps layers batch; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "--$v: '${!v}' is not a non-negative integer"
done
[ "$threads" -ge 1 ] && [ "$gen" -ge 1 ] && [ "$ctx" -ge 1 ] && [ "$reps" -ge 1 ] ||
    die "--threads, --gen, --ctx and --reps must be at least 1"
case $stat in best|median) ;; *) die "--stat takes best or median" ;; esac
case $llama in node|native) ;; *) die "--llama takes node or native" ;; esac

# --- prerequisites, each with the command that fixes it
command -v node >/dev/null || die "node not found (Debian: apt-get install nodejs npm; node >= 18)"
nodemajor=$(node -p 'process.versions.node.split(".")[0]')
[ "$nodemajor" -ge 18 ] || die "node $(node --version) is too old (the race needs >= 18)"
llamadir=${G4_LLAMA_DIR:-$root/.llama}
if [ "$llama" = native ]; then
    lbench=${lbench:-$llamadir/llama.cpp/build-native/bin/llama-bench}
    [ -x "$lbench" ] || die "no llama-bench at $lbench (run: bash scripts/install_llama.sh --native, or pass --llama-bench PATH)"
    [ -z "$kv" ] || die "--kv is for --llama node"
else
    [ "$nodemajor" -ge 20 ] || die "node $(node --version) is too old for node-llama-cpp (>= 20; or use --llama native)"
    [ -f "$llamadir/node_modules/node-llama-cpp/package.json" ] ||
        die "node-llama-cpp is not installed in $llamadir (run: bash scripts/install_llama.sh)"
fi
[ -x "$g4" ] || die "$g4 not found or not executable (run: make, or pass --g4 PATH / set G4_BIN)"
"$g4" bench --help 2>/dev/null | grep -q -- '--json' ||
    die "$g4 bench has no --json (a g4 older than scripts/race.sh: rebuild it)"
mkdir -p "$dir" || die "cannot create $dir"

log=$dir/race-$(date +%Y%m%d-%H%M%S).jsonl
: > "$log"
lname="node-llama-cpp in $llamadir"
[ "$llama" = native ] && lname="native $lbench"
echo "race: g4 $g4, llama.cpp: $lname; $threads threads, decode $gen tokens at" \
     "context $ctx, prefill $prompt tokens, $reps reps ($stat); raw results in $log"

# both engines spin-wait between operations at some point: with other work on the cores, a thread
# that is descheduled stalls the others, and llama.cpp's decode (hundreds of barriers per token)
# suffers most. Say so rather than print misleading ratios.
read -r load1 _ < /proc/loadavg 2>/dev/null || load1=0
ncpu=$(nproc 2>/dev/null || echo 1)
if awk -v l="$load1" -v c="$ncpu" -v t="$threads" 'BEGIN { exit !(l + t > c + 0.5) }'; then
    echo "race: WARNING: load average $load1 on $ncpu CPUs before starting: the machine is busy, the" \
         "engines will be descheduled mid-token and the ratios are unreliable (llama.cpp's decode most)" >&2
fi

mem_avail_kb() { awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || echo 0; }

# native llama-bench: prefill (-p P from an empty cache) and decode (-n N after -d C) as two runs,
# folded into llama_bench.mjs's record
llama_native() {
    local f=$1 pp="" tg
    local common=(-m "$f" -t "$threads" -b "$batch" -ub "$batch" -r 1 -o jsonl)
    if [ "$prompt" -gt 0 ]; then
        pp=$("$lbench" "${common[@]}" -p "$prompt" -n 0 2>"$dir/llama.err") || return 1
    fi
    tg=$("$lbench" "${common[@]}" -p 0 -n "$gen" -d "$ctx" 2>>"$dir/llama.err") || return 1
    printf '%s\n%s\n' "$pp" "$tg" | node -e '
        const rows = require("fs").readFileSync(0, "utf8").split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
        const o = {engine: "llama.cpp", node_llama_cpp: "native llama-bench", threads: +process.argv[1]};
        for (const r of rows) {
            o.llama_cpp_release = r.build_commit;
            o.batch_size = r.n_batch;
            o.flash_attention = r.flash_attn;
            if (r.n_gen > 0) o.decode_tok_s = r.avg_ts;
            else if (r.n_prompt > 0) o.prefill_tok_s = r.avg_ts;
        }
        console.log(JSON.stringify(o));' "$threads"
}

IFS=, read -r -a arch_list <<< "$archs"
IFS=, read -r -a type_list <<< "$types"
for arch in "${arch_list[@]}"; do
    for type in "${type_list[@]}"; do
        name=$arch-$type
        [ "$layers" -gt 0 ] && name=$name-L$layers
        mdir=$dir/$name
        if [ ! -s "$mdir/model.gguf" ]; then
            synth=(synth --arch "$arch" --format "gguf-$type" --out "$mdir.tmp" --threads "$threads")
            [ "$layers" -gt 0 ] && synth+=(--layers "$layers")
            echo "race: synthesizing $mdir (g4 ${synth[*]})"
            rm -rf "$mdir.tmp"
            # from the repository root, where g4 finds the tokenizer files it copies in
            (cd "$root" && "$g4" "${synth[@]}") || die "g4 synth failed for $arch $type (see above)"
            rm -rf "$mdir" && mv "$mdir.tmp" "$mdir"
        else
            echo "race: reusing $mdir/model.gguf"
        fi
        size_kb=$(( $(stat -c %s "$mdir/model.gguf") / 1024 ))
        avail_kb=$(mem_avail_kb)
        if [ "$avail_kb" -gt 0 ] && [ "$size_kb" -gt "$avail_kb" ]; then
            echo "race: WARNING: $mdir/model.gguf ($((size_kb / 1048576)) GiB) is larger than the available" \
                 "memory ($((avail_kb / 1048576)) GiB): both engines will page from disk and the numbers mean little" >&2
        fi
        for ((r = 1; r <= reps; r++)); do
            largs=("$mdir/model.gguf" --threads "$threads" --ctx "$ctx" --gen "$gen" --prompt "$prompt" --batch "$batch")
            [ -n "$kv" ] && largs+=(--kv "$kv")
            if [ "$llama" = native ]; then
                lout=$(llama_native "$mdir/model.gguf") || die "llama-bench failed on $mdir/model.gguf (see $dir/llama.err)"
            elif ! lout=$(node "$root/scripts/llama_bench.mjs" "${largs[@]}" 2>"$dir/llama.err"); then
                cat "$dir/llama.err" >&2
                die "llama.cpp failed on $mdir/model.gguf (see above)"
            fi
            node -e 'const o = JSON.parse(process.argv[1]);
                console.log(JSON.stringify({arch: process.argv[2], type: process.argv[3], rep: +process.argv[4], ...o}));' \
                "$lout" "$arch" "$type" "$r" >> "$log"
            gargs=(bench -m "$mdir" --ctx "$ctx" --gen "$gen" --threads "$threads" --no-verify --json)
            [ "$prompt" -gt 0 ] && gargs+=(--prefill "$prompt")
            if ! gout=$("$g4" "${gargs[@]}" 2>&1); then
                echo "$gout" >&2
                die "g4 bench failed on $mdir (see above)"
            fi
            # the JSON lines of g4 bench, folded into one record
            printf '%s\n' "$gout" | grep '^{' | node -e '
                const rows = require("fs").readFileSync(0, "utf8").trim().split("\n").map((l) => JSON.parse(l));
                const o = {arch: process.argv[1], type: process.argv[2], rep: +process.argv[3], engine: "g4"};
                for (const x of rows) {
                    if (x.row === "model") Object.assign(o, {weight_bytes: x.weight_bytes, bw_gb_s: x.bw_gb_s, layers: x.layers});
                    if (x.row === "context") Object.assign(o, {decode_tok_s: x.decode_tok_s, bytes_per_token: x.bytes_per_token, ctx: x.ctx, bw_gb_s: x.bw_gb_s});
                    if (x.row === "prefill") o.prefill_tok_s = x.prefill_tok_s;
                }
                console.log(JSON.stringify(o));' "$arch" "$type" "$r" >> "$log"
            tail -n 2 "$log" | node -e '
                const [l, g] = require("fs").readFileSync(0, "utf8").trim().split("\n").map((x) => JSON.parse(x));
                const f = (x, d) => x == null ? "-" : x.toFixed(d);
                console.log(`race: ${g.arch} ${g.type} rep ${g.rep}: decode llama ${f(l.decode_tok_s, 2)} g4 ${f(g.decode_tok_s, 2)} tok/s;` +
                    ` prefill llama ${f(l.prefill_tok_s, 1)} g4 ${f(g.prefill_tok_s, 1)} tok/s`);'
        done
    done
done

# --- summary: best or median per engine and cell
node - "$log" "$stat" "$threads" "$gen" "$ctx" "$prompt" <<'EOF'
const fs = require("fs");
const [log, stat, threads, gen, ctx, prompt] = process.argv.slice(2);
const recs = fs.readFileSync(log, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l));
const pick = (xs) => {
    xs = xs.filter((x) => typeof x === "number" && isFinite(x)).sort((a, b) => a - b);
    if (!xs.length) return null;
    if (stat === "best") return xs[xs.length - 1];
    const m = xs.length >> 1;
    return xs.length % 2 ? xs[m] : (xs[m - 1] + xs[m]) / 2;
};
const cells = [];
for (const r of recs) if (!cells.some((c) => c.arch === r.arch && c.type === r.type)) cells.push({arch: r.arch, type: r.type});
const f = (x, d) => x == null ? "-" : x.toFixed(d);
const ratio = (a, b) => a == null || b == null ? "-" : (a / b).toFixed(2) + "x";
const lines = [];
const head = ["arch", "type", "GB/token", "bw GB/s", "llama dec", "g4 dec", "g4/llama", "llama pp", "g4 pp", "g4/llama"];
lines.push(head);
for (const c of cells) {
    const l = recs.filter((r) => r.arch === c.arch && r.type === c.type && r.engine === "llama.cpp");
    const g = recs.filter((r) => r.arch === c.arch && r.type === c.type && r.engine === "g4");
    const ld = pick(l.map((r) => r.decode_tok_s)), gd = pick(g.map((r) => r.decode_tok_s));
    const lp = pick(l.map((r) => r.prefill_tok_s)), gp = pick(g.map((r) => r.prefill_tok_s));
    const bytes = g.length ? g[0].bytes_per_token : null, bw = pick(g.map((r) => r.bw_gb_s));
    const name = c.arch + (g.length && g[0].layers ? ` (${g[0].layers} layers)` : "");
    lines.push([name, c.type, f(bytes && bytes / 1e9, 3), f(bw, 1), f(ld, 2), f(gd, 2), ratio(gd, ld), f(lp, 1), f(gp, 1), ratio(gp, lp)]);
}
const w = head.map((_, i) => Math.max(...lines.map((r) => r[i].length)));
console.log(`\nsummary (${stat} of ${Math.max(...recs.map((r) => r.rep))} reps, ${threads} threads; decode: ${gen} tokens at context ${ctx}, tok/s;` +
    ` prefill: ${prompt} tokens from empty, tok/s; GB/token: g4's weights + K/V read per decode token):`);
for (const [i, r] of lines.entries()) {
    console.log(r.map((x, j) => j < 2 ? x.padEnd(w[j]) : x.padStart(w[j])).join("  "));
    if (i === 0) console.log(w.map((n) => "-".repeat(n)).join("  "));
}
const l0 = recs.find((r) => r.engine === "llama.cpp");
if (l0) console.log(`llama.cpp ${l0.llama_cpp_release} (${l0.node_llama_cpp === "native llama-bench" ? "" : "node-llama-cpp "}${l0.node_llama_cpp}), CPU, batch ${l0.batch_size},` +
    ` flash attention ${l0.flash_attention}; g4 decode GB/s = GB/token x g4 dec`);
EOF
