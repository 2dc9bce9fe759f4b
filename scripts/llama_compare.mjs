#!/usr/bin/env node
// Runs a GGUF through llama.cpp, the build node-llama-cpp ships (CPU only, never compiles), so that
// g4 and llama.cpp can be compared on the same file.
//
//   node scripts/llama_compare.mjs MODEL.gguf [--fixture DIR | --tokens 2,17,...] [--out DIR]
//        [--greedy-prompt N] [--greedy N] [--threads N] [--kv f16|f32]
//
// What it computes with llama.cpp:
//   logits          after every token, teacher-forced (llama.cpp's output, softcap included)
//   greedy_tokens   greedy decoding from the first N tokens (argmax of llama.cpp's logits, step by
//                   step), with greedy_top2_margin, the gap between the best two logits per step
//   prefill_tok_s   one prefill of all tokens; decode_tok_s: node-llama-cpp's own greedy loop
// --out DIR writes these in the fixture format (reference.json + logits.f32, as
// ../shared/fixtures/README.md describes) next to a link DIR/model.gguf, so that
// `g4 check DIR` runs g4 on the same file and reports its distance to llama.cpp.
// stdout gets one JSON line: versions, timings, greedy tokens (and the logits without --out).
// --fixture DIR takes tokens and greedy prompt/length from DIR/reference.json.
// --kv: llama.cpp's KV cache type (its default f16 rounds K and V).
// node-llama-cpp is looked up in $G4_LLAMA_DIR (default: .llama in the repository root, where
// scripts/install_llama.sh installs it).
import {createRequire} from "node:module";
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const llamaDir = path.resolve(process.env.G4_LLAMA_DIR || path.join(here, "..", ".llama"));

function usage(msg) {
    if (msg) console.error(`llama_compare: ${msg}`);
    console.error("usage: node scripts/llama_compare.mjs MODEL.gguf [--fixture DIR | --tokens 2,17,...] [--out DIR] " +
        "[--greedy-prompt N] [--greedy N] [--threads N] [--kv f16|f32]");
    process.exit(2);
}

const args = process.argv.slice(2);
if (args.length < 1 || args[0] === "--help" || args[0] === "-h") usage();
const opts = {model: path.resolve(args[0]), tokens: null, greedyPrompt: 12, greedy: 48, threads: 2, kv: "F16", out: null};
for (let i = 1; i < args.length; i++) {
    const a = args[i], v = args[i + 1];
    const need = () => { if (v === undefined) usage(`${a} needs a value`); i++; return v; };
    if (a === "--tokens") opts.tokens = need().split(",").map(Number);
    else if (a === "--fixture") {
        const ref = JSON.parse(fs.readFileSync(path.join(need(), "reference.json"), "utf8"));
        opts.tokens = ref.tokens;
        if (ref.greedy_prompt) opts.greedyPrompt = ref.greedy_prompt.length;
        if (ref.greedy_tokens) opts.greedy = ref.greedy_tokens.length;
    }
    else if (a === "--greedy-prompt") opts.greedyPrompt = Number(need());
    else if (a === "--greedy") opts.greedy = Number(need());
    else if (a === "--threads") opts.threads = Number(need());
    else if (a === "--kv") opts.kv = need().toUpperCase();
    else if (a === "--out") opts.out = path.resolve(need());
    else usage(`unknown option ${a}`);
}
if (!opts.tokens) opts.tokens = Array.from({length: 64}, (_, i) => i === 0 ? 2 : (i * 37 + 2) % 512);
if (opts.tokens.some((t) => !Number.isInteger(t) || t < 0)) usage("token ids must be non-negative integers");
if (!(opts.greedyPrompt >= 1 && opts.greedyPrompt <= opts.tokens.length)) usage("--greedy-prompt out of range");
if (!(opts.greedy >= 1)) usage("--greedy must be positive");
if (!fs.existsSync(opts.model)) usage(`${opts.model}: no such file`);

const require = createRequire(path.join(llamaDir, "package.json"));
let nlc, pkgDir;
try {
    const entry = require.resolve("node-llama-cpp");
    nlc = await import(entry);
    pkgDir = entry.slice(0, entry.lastIndexOf(`${path.sep}node-llama-cpp${path.sep}`) + "/node-llama-cpp".length);
} catch (e) {
    console.error(`llama_compare: node-llama-cpp not found under ${llamaDir} (run scripts/install_llama.sh): ${e.message}`);
    process.exit(3);
}
const readJson = (p) => { try { return JSON.parse(fs.readFileSync(p, "utf8")); } catch { return {}; } };
const out = {
    node_llama_cpp: readJson(path.join(pkgDir, "package.json")).version,
    llama_cpp_release: readJson(path.join(pkgDir, "llama", "llama.cpp.info.json")).tag,
    model: opts.model, kv_cache: opts.kv, threads: opts.threads,
};

const llama = await nlc.getLlama({gpu: false, build: "never", logLevel: nlc.LlamaLogLevel.error, maxThreads: opts.threads});
let model;
try {
    model = await llama.loadModel({modelPath: opts.model, gpuLayers: 0});
} catch (e) {
    console.error(`llama_compare: llama.cpp cannot load ${opts.model}: ${e.message}`);
    process.exit(1);
}
const n = opts.tokens.length;
const ctxSize = Math.max(n, opts.greedyPrompt + opts.greedy) + 8;

async function newSequence() {
    const context = await model.createContext({
        contextSize: ctxSize, batchSize: Math.max(64, n), threads: opts.threads, sequences: 1,
        experimentalKvCacheKeyType: opts.kv, experimentalKvCacheValueType: opts.kv,
    });
    return {context, seq: context.getSequence()};
}

// one logits row per evaluated token that asked for it
let V = 0;
function rows(results) {
    const raw = results.filter((r) => r && r.next && r.next.logits).map((r) => r.next.logits);
    for (const m of raw) for (const t of m.keys()) V = Math.max(V, t + 1);
    return raw;
}
function dense(m) {
    const row = new Float32Array(V).fill(NaN);
    for (const [t, l] of m) row[t] = l;
    return row;
}
const wantLogits = {generateNext: {logits: true}};

// teacher-forced logits
let logits;
{
    const {context, seq} = await newSequence();
    logits = rows(await seq.controlledEvaluate(opts.tokens.map((t) => [t, wantLogits]))).map(dense);
    await context.dispose();
}
out.tokens = opts.tokens;
out.vocab = V;

// greedy from llama.cpp's logits, step by step, with the top-2 margins
{
    const {context, seq} = await newSequence();
    const prompt = opts.tokens.slice(0, opts.greedyPrompt);
    let row = rows(await seq.controlledEvaluate(prompt.map((t, i) => i === prompt.length - 1 ? [t, wantLogits] : t)))[0];
    const toks = [], margins = [];
    for (let k = 0; k < opts.greedy; k++) {
        const d = dense(row);
        let best = 0, second = -1;
        for (let v = 1; v < V; v++) {
            if (d[v] > d[best]) { second = best; best = v; }
            else if (second < 0 || d[v] > d[second]) second = v;
        }
        toks.push(best);
        margins.push(d[best] - d[second]);
        if (k + 1 < opts.greedy) row = rows(await seq.controlledEvaluate([[best, wantLogits]]))[0];
    }
    out.greedy_prompt = prompt;
    out.greedy_tokens = toks;
    out.greedy_top2_margin = margins;
    await context.dispose();
}

// throughput: a prefill of every token, then node-llama-cpp's own greedy loop
{
    const {context, seq} = await newSequence();
    const t0 = process.hrtime.bigint();
    await seq.evaluateWithoutGeneratingNewTokens(opts.tokens);
    out.prefill_tok_s = n / (Number(process.hrtime.bigint() - t0) / 1e9);
    await context.dispose();
}
{
    const {context, seq} = await newSequence();
    const gen = [];
    let t0 = null;
    for await (const tok of seq.evaluate(out.greedy_prompt, {temperature: 0, yieldEogToken: true})) {
        if (t0 === null) t0 = process.hrtime.bigint(); // the first token closes the prefill
        gen.push(tok);
        if (gen.length >= opts.greedy) break;
    }
    out.decode_tok_s = gen.length > 1 ? (gen.length - 1) / (Number(process.hrtime.bigint() - t0) / 1e9) : null;
    out.sampler_greedy_agrees = gen.every((t, i) => t === out.greedy_tokens[i]);
    await context.dispose();
}
await model.dispose();
await llama.dispose();

if (opts.out) {
    fs.mkdirSync(opts.out, {recursive: true});
    const buf = Buffer.alloc(4 * n * V);
    logits.forEach((r, p) => r.forEach((x, v) => buf.writeFloatLE(x, 4 * (p * V + v))));
    fs.writeFileSync(path.join(opts.out, "logits.f32"), buf);
    fs.writeFileSync(path.join(opts.out, "reference.json"), JSON.stringify({
        source: `llama.cpp ${out.llama_cpp_release} via node-llama-cpp ${out.node_llama_cpp}, CPU, KV cache ${opts.kv}`,
        model: opts.model, tokens: opts.tokens, logits_file: "logits.f32", logits_shape: [n, V],
        greedy_prompt: out.greedy_prompt, greedy_tokens: out.greedy_tokens, greedy_top2_margin: out.greedy_top2_margin,
    }, null, 1));
    const link = path.join(opts.out, "model.gguf");
    try { fs.unlinkSync(link); } catch { /* none yet */ }
    fs.symlinkSync(opts.model, link);
    out.out = opts.out;
} else {
    out.logits = logits.map((r) => Array.from(r));
}
process.stdout.write(JSON.stringify(out) + "\n");
