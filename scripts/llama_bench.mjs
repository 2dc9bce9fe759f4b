#!/usr/bin/env node
// Decode and prefill speed of llama.cpp (the CPU build node-llama-cpp ships; never compiles, no
// GPU) on one GGUF, measured the way `g4 bench` measures g4, for scripts/race.sh.
//
//   node scripts/llama_bench.mjs MODEL.gguf [--threads N] [--ctx N] [--gen N] [--prompt N]
//        [--batch N] [--kv f16|f32|q8_0] [--flash auto|on|off]
//
//   prefill  one evaluation of --prompt tokens (default 512) from an empty context, in batches of
//            --batch tokens (default 512, as llama-bench's pp512: one ubatch), tokens/s. 0 skips it.
//   decode   after a prefill of --ctx tokens (default 128), --gen (default 64) tokens generated one
//            at a time with greedy sampling (the LM head and the argmax run every step, as in
//            g4 bench); the clock starts when the prefill's token comes out. 0 skips it.
// The token ids are the ones g4 bench uses (the same generator and seed, BOS first), so both engines
// see the same sequence (and, for MoE, route to the same experts up to rounding). Model load and a
// 16-token warm-up (which pages the weights in) are not timed.
// stdout: one JSON line (versions, settings, load_s, prefill_tok_s, decode_tok_s); progress on stderr.
// node-llama-cpp is looked up in $G4_LLAMA_DIR (default: .llama in the repository root, where
// scripts/install_llama.sh installs it).
import {createRequire} from "node:module";
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const llamaDir = path.resolve(process.env.G4_LLAMA_DIR || path.join(here, "..", ".llama"));

function usage(msg) {
    if (msg) console.error(`llama_bench: ${msg}`);
    console.error("usage: node scripts/llama_bench.mjs MODEL.gguf [--threads N] [--ctx N] [--gen N] [--prompt N] " +
        "[--batch N] [--kv f16|f32|q8_0] [--flash auto|on|off]");
    process.exit(2);
}

const args = process.argv.slice(2);
if (args.length < 1 || args[0] === "--help" || args[0] === "-h") usage();
const opts = {model: path.resolve(args[0]), threads: 2, ctx: 128, gen: 64, prompt: 512, batch: 512, kv: null, flash: "auto"};
for (let i = 1; i < args.length; i++) {
    const a = args[i], v = args[i + 1];
    const need = () => { if (v === undefined) usage(`${a} needs a value`); i++; return v; };
    const int = (lo) => { const x = Number(need()); if (!Number.isInteger(x) || x < lo) usage(`${a}: expected an integer >= ${lo}`); return x; };
    if (a === "--threads") opts.threads = int(1);
    else if (a === "--ctx") opts.ctx = int(1);
    else if (a === "--gen") opts.gen = int(0);
    else if (a === "--prompt") opts.prompt = int(0);
    else if (a === "--batch") opts.batch = int(1);
    else if (a === "--kv") opts.kv = need().toUpperCase();
    else if (a === "--flash") {
        const f = need();
        if (!["auto", "on", "off"].includes(f)) usage("--flash takes auto, on or off");
        opts.flash = f === "auto" ? "auto" : f === "on";
    } else usage(`unknown option ${a}`);
}
let st;
try { st = fs.statSync(opts.model); } catch { usage(`${opts.model}: no such file`); }
if (st.isDirectory()) opts.model = path.join(opts.model, "model.gguf");
if (!fs.existsSync(opts.model)) usage(`${opts.model}: no such file`);

const require = createRequire(path.join(llamaDir, "package.json"));
let nlc, pkgDir;
try {
    const entry = require.resolve("node-llama-cpp");
    nlc = await import(entry);
    pkgDir = entry.slice(0, entry.lastIndexOf(`${path.sep}node-llama-cpp${path.sep}`) + "/node-llama-cpp".length);
} catch (e) {
    console.error(`llama_bench: node-llama-cpp not found under ${llamaDir} (run: bash scripts/install_llama.sh): ${e.message}`);
    process.exit(3);
}
const readJson = (p) => { try { return JSON.parse(fs.readFileSync(p, "utf8")); } catch { return {}; } };
const now = () => Number(process.hrtime.bigint()) / 1e9;
const out = {
    engine: "llama.cpp",
    node_llama_cpp: readJson(path.join(pkgDir, "package.json")).version,
    llama_cpp_release: readJson(path.join(pkgDir, "llama", "llama.cpp.info.json")).tag,
    model: opts.model, threads: opts.threads, ctx: opts.ctx, gen: opts.gen, prompt: opts.prompt, batch: opts.batch,
};

const llama = await nlc.getLlama({gpu: false, build: "never", logLevel: nlc.LlamaLogLevel.error, maxThreads: opts.threads});
let model;
let t = now();
try {
    model = await llama.loadModel({modelPath: opts.model, gpuLayers: 0});
} catch (e) {
    console.error(`llama_bench: llama.cpp cannot load ${opts.model}: ${e.message}`);
    process.exit(1);
}
out.load_s = now() - t;

// the token ids of g4 bench (src/cli/cmd_bench.c): a 64-bit LCG from 42, ids in [3, vocab), BOS first
const vocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length || 262144;
const nTok = Math.max(opts.prompt, opts.ctx, 16);
const toks = [];
{
    const M = (1n << 64n) - 1n;
    let r = 42n;
    for (let i = 0; i < nTok; i++) {
        r = (r * 6364136223846793005n + 1442695040888963407n) & M;
        toks.push(3 + Number((r >> 33n) % BigInt(vocab - 3)));
    }
    toks[0] = model.tokens.bos ?? 2;
}

const ctxSize = Math.max(opts.prompt, opts.ctx + opts.gen) + 16;
const ctxOpts = {
    contextSize: ctxSize, batchSize: Math.min(opts.batch, ctxSize), threads: opts.threads, sequences: 1,
    flashAttention: opts.flash,
};
if (opts.kv) Object.assign(ctxOpts, {experimentalKvCacheKeyType: opts.kv, experimentalKvCacheValueType: opts.kv});
const context = await model.createContext(ctxOpts);
const seq = context.getSequence();
out.context_size = context.contextSize;
out.batch_size = context.batchSize;
out.flash_attention = context.flashAttention;

// warm-up: pages every weight in (mmap) and lets the thread pool start
await seq.evaluateWithoutGeneratingNewTokens(toks.slice(0, 16));
await seq.clearHistory();

if (opts.prompt > 0) {
    t = now();
    await seq.evaluateWithoutGeneratingNewTokens(toks.slice(0, opts.prompt));
    const s = now() - t;
    out.prefill_tok_s = opts.prompt / s;
    console.error(`llama_bench: prefill ${opts.prompt} tokens in ${s.toFixed(2)} s = ${out.prefill_tok_s.toFixed(1)} tok/s`);
    await seq.clearHistory();
}

if (opts.gen > 0) {
    // prefill ctx - 1 tokens, then the last prompt token through the generator: its first output
    // closes the prefill (as g4 bench's prefill does), each further one is one decode step
    if (opts.ctx > 1) await seq.evaluateWithoutGeneratingNewTokens(toks.slice(0, opts.ctx - 1));
    let n = -1, t0 = 0;
    for await (const tok of seq.evaluate([toks[opts.ctx - 1]], {temperature: 0, yieldEogToken: true})) {
        void tok;
        if (n < 0) t0 = now();
        n++;
        if (n >= opts.gen) break;
    }
    const s = now() - t0;
    out.decode_tokens = n;
    out.decode_tok_s = n > 0 ? n / s : null;
    console.error(`llama_bench: decode ${n} tokens at context ${opts.ctx} in ${s.toFixed(2)} s = ${(out.decode_tok_s ?? 0).toFixed(2)} tok/s`);
}
await context.dispose();
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(out) + "\n");
