/* g4 bench: prefill and decode speed at several context lengths, next to the memory bandwidth
 * measured in the same run, plus the cost of a verify block relative to one decode step.
 * A benchmark prints numbers; nothing here asserts on time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cpu/act.h"
#include "g4.h"
#include "model/synth.h"
#include "model/synth_drafter.h"
#include "runtime/session.h"
#ifdef G4_HAVE_CUDA
#include "cuda/cuda.h"
#endif
#include "util/bandwidth.h"
#include "util/error.h"

/* where the profiled forward calls' time went, per token (`n` tokens) */
static void print_profile(const g4_session *s, int n) {
    static const char *const cls[G4_PROF_N] = {"matmul", "attention", "lm head", "gelu/softcap", "other"};
    printf("%8s ", "");
    for (int k = 0; k < G4_PROF_N; k++) printf(" %s %.3f ms%s", cls[k], s->st.prof[k] / n * 1e3, k + 1 < G4_PROF_N ? "," : "\n");
}

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: g4 bench (-m MODEL | --synth ARCH) [options]\n"
            "  Prefill and decode tokens/s at each context length, with the GB/s streamed per token next\n"
            "  to the read bandwidth measured in the same run; then verify blocks of k+1 tokens against\n"
            "  one decode step.\n"
            "  -m, --model PATH     a model g4 can load\n"
            "  --synth ARCH         a random-weight model of a released size (e2b, e4b, 12b, 26b-a4b, 31b)\n"
            "                       generated in memory, as `g4 synth` would write it\n"
            "  --storage S          synthetic weights stored as bf16 (default), f16, f32, mlx-N, qat-intN, qat (mixed)\n"
            "  --layers N           truncate a synthetic stack to N layers\n"
            "  --ctx LIST           context lengths (default 128,1024,4096)\n"
            "  --gen N              decode tokens timed per context (default 32)\n"
            "  --threads N          worker threads (default: all CPUs)\n"
            "  --device D           cpu (default) or cuda\n"
            "  --fast-prefill       GPU: prefill on the tensor cores (logits within rounding of the exact\n"
            "                       default, chunk 512 unless --batch)\n"
            "  --no-verify          skip the verify-block table\n"
            "  --profile            after each decode row, where a token's time went (CPU)\n"
            "  --kv-type T          KV cache elements: f32 (default) or bf16 (CPU)\n"
            "  --batch N            most tokens per forward step: the prefill chunk (default 64; 512 with --fast-prefill)\n"
            "  --prefill N          also time one prefill of exactly N tokens from an empty context\n"
            "                       (llama.cpp's pp512 is --prefill 512)\n"
            "  --json               also print each result as one JSON object per line (lines start with '{')\n"
            "  --alpha LIST         speculative decoding with drafts right with probability alpha (e.g.\n"
            "                       0,0.5,0.7,0.9,1): the drafter runs, its proposals are replaced by the\n"
            "                       target's own future greedy tokens, corrupted with probability 1-alpha\n"
            "  --draft DIR          the drafter for --alpha (default: a random-weight one, written to /tmp)\n"
            "  --draft-k N          drafts per round for --alpha (default 4)\n");
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Bytes of K and V one decode token reads at context c (every layer, shared ones included). */
static double kv_bytes(const g4_model *m, int c) {
    g4_model_info info;
    g4_model_get_info(m, &info);
    double b = 0;
    for (int i = 0; i < info.n_layers; i++) {
        g4_layer_info l;
        g4_model_get_layer(m, i, &l);
        int keys = l.is_full ? c : (c < info.sliding_window ? c : info.sliding_window);
        b += 2.0 * keys * l.n_kv_heads * l.head_dim * sizeof(float);
    }
    return b;
}

typedef struct {
    int32_t *out;
    int n, cap;
} tok_log;

static int log_tok(void *user, int32_t tok, const float *logits, int n_vocab) {
    (void)logits;
    (void)n_vocab;
    tok_log *l = user;
    if (l->n < l->cap) l->out[l->n++] = tok;
    return 0;
}

/* Speculative decoding speed against draft acceptance alpha (drafts replaced by the target's own
 * future greedy tokens, corrupted with probability 1 - alpha; the drafter still runs). */
static g4_status alpha_table(g4_model *m, g4_session *s, const int32_t *prompt, int ctx, int gen, int k,
                             const char *list, const char *draft_dir, g4_error *err) {
    char tmpl[] = "/tmp/g4-drafter-XXXXXX";
    const char *dir = draft_dir;
    g4_status st = G4_OK;
    if (!dir) {
        if (!mkdtemp(tmpl)) return g4_fail(err, G4_ERR_IO, "cannot create a temporary folder for the drafter");
        dir = tmpl;
        st = g4_synth_drafter_write(m, dir, 7, err);
    }
    g4_drafter *d = NULL;
    if (!st) st = g4_drafter_load(dir, m, &d, err);
    int32_t *oracle = malloc(sizeof(int32_t) * (size_t)gen);
    if (!st && !oracle) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    tok_log lg = {oracle, 0, gen};
    g4_generate_stats ps;
    if (!st) {
        g4_generate_options o = {.max_new = gen, .on_token = log_tok, .user = &lg, .no_logits = 1};
        g4_session_reset(s);
        st = g4_generate(s, prompt, ctx, &o, &ps, err);
    }
    if (!st) {
        double plain = (ps.n_generated - 1) / ps.decode_seconds;
        printf("\nspeculative decoding, acceptance-controlled (context %d, %d tokens, k = %d%s):\n", ctx, gen, k,
               draft_dir ? "" : ", random-weight drafter");
        printf("%8s %10s %9s %12s %14s   %s\n", "alpha", "tok/s", "speedup", "tokens/round", "drafter ms/step",
               "adaptive k: tok/s, speedup, drafts/token");
        printf("%8s %10.2f %8.2fx %12s %14s\n", "off", plain, 1.0, "1", "-");
        for (const char *p = list; *p && !st;) {
            char *end;
            double a = strtod(p, &end);
            if (end == p || a < 0 || a > 1) {
                st = g4_fail(err, G4_ERR_ARG, "--alpha: '%s' is not a list of probabilities", list);
                break;
            }
            p = *end == ',' ? end + 1 : end;
            tok_log sl = {NULL, 0, 0};
            g4_generate_options o = {.max_new = gen, .drafter = d, .draft_k = k, .draft_fixed = 1, .oracle = oracle,
                                     .n_oracle = lg.n, .oracle_alpha = a, .oracle_seed = 99, .on_token = log_tok, .user = &sl,
                                     .no_logits = 1};
            g4_generate_stats gs;
            g4_session_reset(s);
            st = g4_generate(s, prompt, ctx, &o, &gs, err);
            if (st) break;
            double tps = (gs.n_generated - 1) / gs.decode_seconds;
            /* the same with k chosen per round by generation's cost model (the default) */
            g4_generate_stats as;
            o.draft_fixed = 0;
            sl.n = 0;
            g4_session_reset(s);
            st = g4_generate(s, prompt, ctx, &o, &as, err);
            if (st) break;
            double atps = (as.n_generated - 1) / as.decode_seconds;
            printf("%8.2f %10.2f %8.2fx %12.2f %14.3f   %10.2f %7.2fx %6.2f\n", a, tps, tps / plain,
                   gs.rounds ? (double)(gs.accepted + gs.rounds) / gs.rounds : 0,
                   gs.drafted ? gs.draft_seconds * 1e3 / gs.drafted : 0, atps, atps / plain,
                   as.n_generated > 1 ? (double)as.drafted / (as.n_generated - 1) : 0);
            fflush(stdout);
        }
    }
    free(oracle);
    g4_drafter_free(d);
    if (!draft_dir) {
        char path[128];
        snprintf(path, sizeof path, "%s/config.json", tmpl);
        remove(path);
        snprintf(path, sizeof path, "%s/model.safetensors", tmpl);
        remove(path);
        rmdir(tmpl);
    }
    return st;
}

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL, *synth = NULL, *storage = NULL, *ctx_list = "128,1024,4096";
    int threads = 0, gen = 32, layers = 0, verify = 1, draft_k = 4, profile = 0;
    const char *alpha_list = NULL, *draft_dir = NULL;
    int json = 0, prefill = 0, device = G4_DEVICE_CPU, batch = 0, fast_prefill = 0, kv_type = G4_KV_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bench_usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) model_path = argv[++i];
        else if (!strcmp(a, "--synth") && v) synth = argv[++i];
        else if (!strcmp(a, "--storage") && v) storage = argv[++i];
        else if (!strcmp(a, "--ctx") && v) ctx_list = argv[++i];
        else if (!strcmp(a, "--threads")) {
            if (cli_parse_int(a, v, 1, 256, &threads)) return 2;
            i++;
        } else if (!strcmp(a, "--gen")) {
            if (cli_parse_int(a, v, 1, 1 << 20, &gen)) return 2;
            i++;
        } else if (!strcmp(a, "--layers")) {
            if (cli_parse_int(a, v, 1, 1024, &layers)) return 2;
            i++;
        } else if (!strcmp(a, "--draft-k")) {
            if (cli_parse_int(a, v, 1, G4_MAX_DRAFT, &draft_k)) return 2;
            i++;
        } else if (!strcmp(a, "--alpha") && v) alpha_list = argv[++i];
        else if (!strcmp(a, "--draft") && v) draft_dir = argv[++i];
        else if (!strcmp(a, "--no-verify")) verify = 0;
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--fast-prefill")) fast_prefill = 1;
        else if (!strcmp(a, "--kv-type")) {
            if (cli_parse_kv_type(a, v, &kv_type)) return 2;
            i++;
        }
        else if (!strcmp(a, "--device") && v) {
            const char *d = argv[++i];
            if (!strcmp(d, "cpu")) device = G4_DEVICE_CPU;
            else if (!strcmp(d, "cuda")) device = G4_DEVICE_CUDA;
            else {
                fprintf(stderr, "g4 bench: --device: '%s' is not cpu or cuda\n", d);
                return 2;
            }
        }
        else if (!strcmp(a, "--batch")) {
            if (cli_parse_int(a, v, 1, 512, &batch)) return 2;
            i++;
        } else if (!strcmp(a, "--prefill")) {
            if (cli_parse_int(a, v, 1, 1 << 20, &prefill)) return 2;
            i++;
        }
        else {
            fprintf(stderr, "g4 bench: unknown option or missing value: '%s'\n", a);
            bench_usage(stderr);
            return 2;
        }
    }
    if (!model_path == !synth) {
        fprintf(stderr, "g4 bench: give exactly one of -m MODEL and --synth ARCH\n");
        return 2;
    }
    int ctxs[16], n_ctx = 0, max_ctx = 0;
    for (const char *p = ctx_list; *p && n_ctx < 16;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 20) || (*end && *end != ',')) {
            fprintf(stderr, "g4 bench: --ctx: '%s' is not a list of context lengths\n", ctx_list);
            return 2;
        }
        ctxs[n_ctx++] = (int)v;
        max_ctx = v > max_ctx ? (int)v : max_ctx;
        p = *end ? end + 1 : end;
    }
    if (prefill > max_ctx) max_ctx = prefill;
    g4_error err = {0};
    g4_model *m = NULL;
    g4_session *s = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    int rc = 1;
    double t0 = now();
    /* no device, no point building a model for it (31B takes half a minute to synthesize) */
    if (device == G4_DEVICE_CUDA && g4_device_probe(G4_DEVICE_CUDA, NULL, 0, &err)) goto fail;
    if (synth) {
        g4_synth_options so = {.seed = 1, .n_layers = layers, .n_threads = threads, .keep_layout = device == G4_DEVICE_CUDA};
        if (g4_model_synth(synth, &so, storage, &m, &err)) goto fail;
    } else if (g4_model_load(model_path, &(g4_model_options){.keep_layout = device == G4_DEVICE_CUDA}, &m, &err)) {
        goto fail;
    }
    g4_model_info info;
    g4_model_get_info(m, &info);
    printf("model: %s%s (%s, %d layers, hidden %d), %.3f GB streamed per token, ready in %.1f s\n",
           synth ? "synthetic " : "", synth ? synth : model_path, storage ? storage : synth ? "bf16" : info.arch,
           info.n_layers, info.hidden, info.weight_bytes / 1e9, now() - t0);
    g4_session_options o = {.n_ctx = max_ctx + gen + 16, .n_threads = threads, .max_batch = batch, .device = device,
                            .fast_prefill = fast_prefill, .kv_type = kv_type};
    if (g4_session_create(m, &o, &s, &err)) goto fail;
    int nt = threads;
    if (!nt) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nt = c > 0 ? (int)c : 1;
    }
    double bw = 0;
    if (device == G4_DEVICE_CUDA) {
#ifdef G4_HAVE_CUDA
        if (g4_cuda_bandwidth((size_t)4 << 30, &bw, &err)) goto fail;
        bw /= 1e9;
        printf("GPU memory read bandwidth (measured now): %.0f GB/s\n\n", bw);
#endif
    } else {
        if (g4_measure_read_bandwidth(nt, (size_t)1 << 30, 5, &bw, &err)) goto fail;
        printf("memory read bandwidth (%d threads, measured now): %.1f GB/s\n\n", nt, bw);
    }
    if (json)
        printf("{\"row\": \"model\", \"layers\": %d, \"weight_bytes\": %zu, \"threads\": %d, \"bw_gb_s\": %.3f}\n",
               info.n_layers, info.weight_bytes, nt, bw);
    logits = malloc(sizeof(float) * info.vocab);
    toks = malloc(sizeof(int32_t) * (size_t)(max_ctx + 64));
    if (!logits || !toks) goto fail;
    uint64_t r = 42;
    for (int i = 0; i < max_ctx + 64; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(3 + (r >> 33) % (uint64_t)(info.vocab - 3));
    }
    toks[0] = info.bos;
    /* the CPU's bandwidth drifts within a run (2 cores: 32-64 GB/s between probes here), so each
     * row is also probed right after its decode and set against the mean of the probes around it */
    const int bracket = device != G4_DEVICE_CUDA;
    printf("%8s %12s %12s %12s %10s %10s %8s\n", "context", "prefill t/s", "decode t/s", "ms/token", "GB/s",
           bracket ? "bw around" : "bw", "of bw");
    for (int ci = 0; ci < n_ctx; ci++) {
        int c = ctxs[ci];
        g4_session_reset(s);
        double a = now();
        if (g4_session_forward(s, toks, c, G4_LOGITS_LAST, logits, &err)) goto fail;
        double pre = now() - a;
        int32_t t = g4_argmax(logits, info.vocab);
        s->st.profile = profile && !s->cuda;
        memset(s->st.prof, 0, sizeof s->st.prof);
        a = now();
        for (int i = 0; i < gen; i++) { /* as greedy generation steps: on a GPU only the id comes back */
            if (s->cuda) {
                if (g4_session_step_ids(s, &t, 1, 1, &t, &err)) goto fail;
                continue;
            }
            if (g4_session_forward(s, &t, 1, G4_LOGITS_LAST, logits, &err)) goto fail;
            t = g4_argmax(logits, info.vocab);
        }
        double dec = (now() - a) / gen;
        double bytes = (double)info.weight_bytes + kv_bytes(m, c + gen / 2), rbw = bw;
        if (bracket) {
            double after;
            if (g4_measure_read_bandwidth(nt, (size_t)1 << 30, 5, &after, &err)) goto fail;
            rbw = (bw + after) / 2;
            bw = after;
        }
        printf("%8d %12.1f %12.2f %12.2f %10.1f %10.1f %7.0f%%\n", c, c / pre, 1 / dec, dec * 1e3, bytes / dec / 1e9,
               rbw, 100 * bytes / dec / 1e9 / rbw);
        if (json)
            printf("{\"row\": \"context\", \"ctx\": %d, \"gen\": %d, \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.4f, "
                   "\"bytes_per_token\": %.0f, \"gb_s\": %.3f, \"bw_gb_s\": %.3f}\n",
                   c, gen, c / pre, 1 / dec, bytes, bytes / dec / 1e9, rbw);
        if (s->st.profile) {
            print_profile(s, gen);
            s->st.profile = 0;
        }
        fflush(stdout);
    }
    if (prefill) {
        /* one prefill of exactly `prefill` tokens from an empty context, as llama-bench's ppN */
        g4_session_reset(s);
        s->st.profile = profile && !s->cuda;
        memset(s->st.prof, 0, sizeof s->st.prof);
        double a = now();
        if (g4_session_forward(s, toks, prefill, G4_LOGITS_LAST, logits, &err)) goto fail;
        double pre = now() - a;
        printf("\nprefill of %d tokens from an empty context: %.1f tok/s (%.2f s)\n", prefill, prefill / pre, pre);
        if (s->st.profile) { /* per prompt token */
            print_profile(s, prefill);
            s->st.profile = 0;
        }
        if (json) printf("{\"row\": \"prefill\", \"tokens\": %d, \"prefill_tok_s\": %.3f}\n", prefill, prefill / pre);
        fflush(stdout);
    }
    if (verify) {
        /* the cost of scoring k drafts plus the current token in one block, vs one step */
        /* a short context: each repetition rewinds by re-prefilling it, and weight streaming, not
         * attention, is what a verify block adds */
        int vctx = ctxs[0] < 16 ? ctxs[0] : 16;
        printf("\nverify block (k drafts + 1) vs one decode step, context %d:\n", vctx);
        g4_session_reset(s);
        if (g4_session_forward(s, toks, vctx, G4_LOGITS_NONE, NULL, &err)) goto fail;
        float *lg = malloc(sizeof(float) * (size_t)info.vocab * 7);
        double single = 0;
        for (int k = 0; k <= 6 && lg; k++) {
            int reps = 4;
            /* time the blocks alone */
            double tb = 0;
            for (int rep = 0; rep < reps; rep++) { /* a block as speculative decoding runs it: staged, then dropped */
                double b = now();
                if (g4_session_step(s, toks + 1, k + 1, lg, 1, &err)) {
                    free(lg);
                    goto fail;
                }
                tb += now() - b;
                if (g4_session_commit(s, 0, &err)) {
                    free(lg);
                    goto fail;
                }
            }
            tb /= reps;
            if (k == 0) single = tb;
            printf("  k = %d: %8.2f ms  (%.2fx one step)\n", k, tb * 1e3, tb / single);
        }
        free(lg);
    }
    if (alpha_list && alpha_table(m, s, toks, ctxs[0], gen, draft_k, alpha_list, draft_dir, &err)) goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "g4 bench: %s\n", err.message);
done:
    free(logits);
    free(toks);
    g4_session_free(s);
    g4_model_free(m);
    return rc;
}
