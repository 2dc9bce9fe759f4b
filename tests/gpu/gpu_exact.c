/* GPU exactness tests (run by scripts/gpu_suite.sh on a machine with a GPU, never by `make test`).
 *
 * For each fixture folder given on the command line:
 *   batch invariance  teacher-forced logits of N tokens, computed in blocks of 1, 3, 7 and 64
 *                     tokens on the GPU with fast_prefill (tensor cores), must be bitwise
 *                     identical; by default (the decode procedure) in blocks of 64 they must be
 *                     bitwise those of feeding the tokens one at a time; both within tolerance of
 *                     the CPU and of each other
 *   lossless drafting greedy generation of G tokens with the drafter (k = 1..6) must equal plain
 *                     greedy generation on the GPU, tokens and logits bitwise (fixtures with an
 *                     assistant/ folder); G spans many sliding-window wraps
 *   decode chain      the single-launch decode chain (argmax on the device, next id kept there,
 *                     K/V written straight into the cache) must produce the same tokens
 * Prints one line per check and a summary; exits 1 on any failure, 77 when there is no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "g4.h"

#ifdef G4_HAVE_CUDA
#include "cuda/cuda.h"
#include "runtime/session.h"

static int n_fail, n_pass;
static double tol = 2e-3; /* GPU vs CPU logits (--tol: quantised models, whose CPU path quantises activations) */

static void report(int ok, const char *fixture, const char *what, const char *detail) {
    printf("%s %-14s %-34s %s\n", ok ? "PASS" : "FAIL", fixture, what, detail);
    if (ok) n_pass++;
    else n_fail++;
    fflush(stdout);
}

static g4_session *open_session_x(g4_model *m, int device, int n_ctx, int max_batch, int fast) {
    g4_error err = {0};
    g4_session *s = NULL;
    g4_session_options so = {.n_ctx = n_ctx, .max_batch = max_batch, .device = device, .fast_prefill = fast};
    if (g4_session_create(m, &so, &s, &err)) {
        fprintf(stderr, "session (%s, batch %d): %s\n", device ? "cuda" : "cpu", max_batch, err.message);
        return NULL;
    }
    return s;
}
static g4_session *open_session(g4_model *m, int device, int n_ctx, int max_batch) {
    return open_session_x(m, device, n_ctx, max_batch, 0);
}

/* logits of tokens[0..n) teacher-forced, in blocks of max_batch (fast: fast_prefill) */
static float *forced_logits(g4_model *m, int device, int max_batch, const int32_t *tokens, int n, int V, int fast) {
    g4_session *s = open_session_x(m, device, n + 8, max_batch, fast);
    if (!s) return NULL;
    float *lg = malloc(sizeof(float) * (size_t)n * V);
    for (size_t i = 0; i < (size_t)n * V; i++) lg[i] = NAN; /* poison: an unwritten row fails */
    g4_error err = {0};
    if (g4_session_forward(s, tokens, n, G4_LOGITS_ALL, lg, &err)) {
        fprintf(stderr, "forward: %s\n", err.message);
        free(lg);
        lg = NULL;
    }
    g4_session_free(s);
    return lg;
}

typedef struct {
    int32_t *tok;
    float *lg;
    int n, cap, V;
} tlog;

static int on_token(void *user, int32_t t, const float *logits, int V) {
    tlog *l = user;
    if (l->n < l->cap) {
        l->tok[l->n] = t;
        if (l->lg) memcpy(l->lg + (size_t)l->n * V, logits, sizeof(float) * V);
        l->n++;
    }
    return 0;
}

/* out->lg NULL: tokens only (no_logits, so a GPU session chooses them on the device) */
static int generate(g4_session *s, const int32_t *prompt, int np, int n, g4_drafter *d, int k, tlog *out,
                    g4_generate_stats *gs) {
    g4_error err = {0};
    out->n = 0;
    g4_generate_options o = {.max_new = n, .on_token = on_token, .user = out, .drafter = d, .draft_k = k, .draft_fixed = 1,
                             .no_logits = out->lg == NULL};
    g4_session_reset(s);
    if (g4_generate(s, prompt, np, &o, gs, &err)) {
        fprintf(stderr, "generate: %s\n", err.message);
        return -1;
    }
    return 0;
}

/* dir, or "QDIR=REFDIR": the GPU runs QDIR (quantised) and the CPU comparisons run REFDIR, the same
 * weights dequantised to f32 with float activations (the GPU's quantised rows meet activations as
 * 24-bit integers per 32-column block, the resolution of the block's largest float; the CPU's
 * quantised path quantises activations to int8, which on random-weight fixtures moves logits by
 * several units) */
static void check_fixture(const char *arg, int n_gen) {
    char name[1024], detail[2048], dirbuf[1024];
    snprintf(dirbuf, sizeof dirbuf, "%s", arg);
    char *refdir = strchr(dirbuf, '=');
    if (refdir) *refdir++ = 0;
    const char *dir = dirbuf;
    snprintf(name, sizeof name, "%s", dir);
    size_t nl = strlen(name);
    while (nl > 1 && name[nl - 1] == '/') name[--nl] = 0;
    if (strrchr(name, '/')) memmove(name, strrchr(name, '/') + 1, strlen(strrchr(name, '/')));
    g4_error err = {0};
    g4_model *m = NULL;
    if (g4_model_load(dir, &(g4_model_options){.keep_layout = 1}, &m, &err)) { /* the GPU uploads checkpoint layouts */
        snprintf(detail, sizeof detail, "%s", err.message);
        report(0, name, "load", detail);
        return;
    }
    g4_model *mref = NULL;
    if (refdir && g4_model_load(refdir, NULL, &mref, &err)) {
        report(0, name, "load reference", err.message);
        g4_model_free(m);
        return;
    }
    if (mref) { /* sqrt(H) and sqrt(P) are rounded to the checkpoint's float dtype (bf16 for the
                   quantised files, f32 for their dequantised copy): the reference takes the
                   quantised model's, or the two would differ by up to 0.5 logits from that alone */
        mref->embed_scale = m->embed_scale;
        mref->ple_embed_scale = m->ple_embed_scale;
    }
    g4_model *mc = mref ? mref : m; /* what the CPU runs */
    g4_model_info info;
    g4_model_get_info(m, &info);
    const int V = info.vocab, N = 200;
    int32_t tokens[200];
    uint32_t r = 12345;
    tokens[0] = info.bos;
    for (int i = 1; i < N; i++) {
        r = r * 1664525u + 1013904223u;
        tokens[i] = 3 + (int32_t)((r >> 8) % (uint32_t)(V - 3));
    }
    /* batch invariance */
    float *l64 = forced_logits(m, G4_DEVICE_CUDA, 64, tokens, N, V, 1);
    float *l1 = forced_logits(m, G4_DEVICE_CUDA, 1, tokens, N, V, 1);
    float *l3 = forced_logits(m, G4_DEVICE_CUDA, 3, tokens, N, V, 1);
    float *l7 = forced_logits(m, G4_DEVICE_CUDA, 7, tokens, N, V, 1);
    float *x64 = forced_logits(m, G4_DEVICE_CUDA, 64, tokens, N, V, 0);
    float *x1 = forced_logits(m, G4_DEVICE_CUDA, 1, tokens, N, V, 0);
    float *lc = forced_logits(mc, G4_DEVICE_CPU, 64, tokens, N, V, 0);
    float *lq = mref ? forced_logits(m, G4_DEVICE_CPU, 64, tokens, N, V, 0) : NULL;
    if (!l64 || !l1 || !l3 || !l7 || !x64 || !x1 || !lc) {
        report(0, name, "forced logits", "a forward failed");
    } else {
        size_t nb = sizeof(float) * (size_t)N * V;
        int same = !memcmp(l1, l64, nb) && !memcmp(l3, l64, nb) && !memcmp(l7, l64, nb);
        size_t diff = 0;
        for (size_t i = 0; i < (size_t)N * V; i++)
            diff += memcmp(&l1[i], &l64[i], 4) != 0 || memcmp(&l3[i], &l64[i], 4) != 0 || memcmp(&l7[i], &l64[i], 4) != 0;
        snprintf(detail, sizeof detail, "prefill procedure, M = 1, 3, 7, 64 over %d positions: %s (%zu values differ)", N,
                 same ? "bitwise identical" : "DIFFER", diff);
        report(same, name, "batch invariance (GPU prefill)", detail);
        same = !memcmp(x1, x64, nb);
        diff = 0;
        for (size_t i = 0; i < (size_t)N * V; i++) diff += memcmp(&x1[i], &x64[i], 4) != 0;
        snprintf(detail, sizeof detail, "exact prefill M = 64 vs one token at a time, %d positions: %s (%zu values differ)", N,
                 same ? "bitwise identical" : "DIFFER", diff);
        report(same, name, "batch invariance (GPU exact)", detail);
        double ss = 0;
        for (size_t i = 0; i < (size_t)N * V; i++) ss += (double)lc[i] * lc[i];
        const float *const sides[2] = {l64, x64};
        for (int k = 0; k < 2; k++) {
            double e = 0;
            int nan = 0;
            for (size_t i = 0; i < (size_t)N * V; i++) {
                double d = fabs((double)sides[k][i] - lc[i]);
                if (isnan(d)) nan = 1;
                else if (d > e) e = d;
            }
            snprintf(detail, sizeof detail, "%s: max |GPU - CPU| %.2e over %d positions (logit rms %.2f, tol %.1e)%s",
                     k ? "exact prefill" : "prefill", e, N, sqrt(ss / ((double)N * V)), tol, nan ? " (NaN!)" : "");
            report(!nan && e <= tol, name, mref ? "GPU vs CPU (dequantised f32) logits" : "GPU vs CPU logits", detail);
        }
        double e = 0;
        for (size_t i = 0; i < (size_t)N * V; i++) e = fmax(e, fabs((double)l64[i] - x64[i]));
        snprintf(detail, sizeof detail, "max |prefill - exact prefill| %.2e over %d positions (tol %.1e)", e, N, tol);
        report(e <= tol, name, "GPU prefill vs decode procedure", detail);
        if (lq) { /* the CPU's own quantised path (int8 activations) against the float one, and the GPU */
            double eq = 0, eg = 0;
            for (size_t i = 0; i < (size_t)N * V; i++) {
                eq = fmax(eq, fabs((double)lq[i] - lc[i]));
                eg = fmax(eg, fabs((double)lq[i] - l64[i]));
            }
            snprintf(detail, sizeof detail, "CPU int8-activation path vs float activations: max %.2e; GPU vs it: max %.2e", eq,
                     eg);
            printf("info %-14s %-34s %s\n", name, "quantised activations (CPU)", detail);
        }
    }
    free(lq);
    free(x64);
    free(x1);
    free(l64);
    free(l1);
    free(l3);
    free(l7);
    free(lc);

    /* greedy generation: plain, drafted, decode chain */
    const int np = 8;
    int32_t prompt[8];
    memcpy(prompt, tokens, sizeof prompt);
    g4_session *s = open_session(m, G4_DEVICE_CUDA, np + n_gen + 8, 64);
    g4_session *sc = open_session(mc, G4_DEVICE_CPU, np + n_gen + 8, 64);
    tlog plain = {malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
    tlog cpu = {malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
    tlog drafted = {malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
    if (!s || !sc || generate(s, prompt, np, n_gen, NULL, 0, &plain, NULL) || generate(sc, prompt, np, n_gen, NULL, 0, &cpu, NULL)) {
        report(0, name, "greedy generation", "failed");
        goto out;
    }
    {
        int agree = 0;
        while (agree < n_gen && plain.tok[agree] == cpu.tok[agree]) agree++;
        snprintf(detail, sizeof detail, "GPU and CPU greedy agree on the first %d of %d tokens", agree, n_gen);
        printf("info %-14s %-34s %s\n", name, "greedy GPU vs CPU", detail);
    }
    {
        /* decode chain from the same prefill */
        g4_session_reset(s);
        float *lg = malloc(sizeof(float) * V);
        int32_t *chain = malloc(sizeof(int32_t) * n_gen);
        double secs = 0;
        int ok = !g4_session_forward(s, prompt, np, G4_LOGITS_LAST, lg, &err);
        int32_t t0 = 0;
        for (int i = 1; i < V; i++)
            if (lg[i] > lg[t0]) t0 = i;
        ok = ok && t0 == plain.tok[0] && !g4_cuda_decode_chain(s->cuda, np, t0, n_gen - 1, chain, &secs, &err);
        int same = ok && !memcmp(chain, plain.tok + 1, sizeof(int32_t) * (n_gen - 1));
        int first_diff = 0;
        while (ok && first_diff < n_gen - 1 && chain[first_diff] == plain.tok[first_diff + 1]) first_diff++;
        snprintf(detail, sizeof detail, "%d tokens, one launch each: %s (%.1f us/token)%s%s", n_gen - 1,
                 same ? "same tokens as plain greedy" : "DIFFER", secs * 1e6 / (n_gen - 1), ok ? "" : " error: ",
                 ok ? "" : err.message);
        if (ok && !same) {
            size_t l = strlen(detail);
            snprintf(detail + l, sizeof detail - l, " (first difference at %d)", first_diff);
        }
        report(same, name, "decode chain == plain greedy", detail);
        free(lg);
        free(chain);
    }
    { /* token ids chosen on the device (no logits copied back) against the host's argmax */
        tlog ids = {malloc(sizeof(int32_t) * n_gen), NULL, 0, n_gen, V};
        int ok = ids.tok && !generate(s, prompt, np, n_gen, NULL, 0, &ids, NULL);
        int same = ok && ids.n == plain.n && !memcmp(ids.tok, plain.tok, sizeof(int32_t) * plain.n);
        snprintf(detail, sizeof detail, "%d tokens: %s", n_gen, same ? "same tokens as plain greedy" : "DIFFER");
        report(same, name, "ids-only greedy == plain greedy", detail);
        free(ids.tok);
    }
    {
        char adir[1100];
        struct stat sb;
        snprintf(adir, sizeof adir, "%s/assistant/config.json", dir);
        if (stat(adir, &sb) == 0) {
            snprintf(adir, sizeof adir, "%s/assistant", dir);
            g4_drafter *d = NULL;
            if (g4_drafter_load(adir, m, &d, &err)) {
                report(0, name, "drafter load", err.message);
                goto out;
            }
            int all_same = 1, acc = 0, drf = 0;
            for (int k = 1; k <= 6; k++) {
                g4_generate_stats gs;
                if (generate(s, prompt, np, n_gen, d, k, &drafted, &gs)) {
                    all_same = 0;
                    break;
                }
                int same = drafted.n == plain.n && !memcmp(drafted.tok, plain.tok, sizeof(int32_t) * plain.n) &&
                           !memcmp(drafted.lg, plain.lg, sizeof(float) * (size_t)plain.n * V);
                if (!same) {
                    int fd = 0;
                    while (fd < drafted.n && fd < plain.n && drafted.tok[fd] == plain.tok[fd]) fd++;
                    printf("     k = %d: differs (first token difference at %d of %d)\n", k, fd, plain.n);
                }
                all_same &= same;
                acc += gs.accepted;
                drf += gs.drafted;
                /* the same round structure with the verify rows' ids chosen on the device */
                tlog ids = {malloc(sizeof(int32_t) * n_gen), NULL, 0, n_gen, V};
                int ok = ids.tok && !generate(s, prompt, np, n_gen, d, k, &ids, NULL);
                int same_ids = ok && ids.n == plain.n && !memcmp(ids.tok, plain.tok, sizeof(int32_t) * plain.n);
                if (!same_ids) printf("     k = %d: ids-only drafted generation differs\n", k);
                all_same &= same_ids;
                free(ids.tok);
            }
            snprintf(detail, sizeof detail, "k = 1..6, %d tokens each: %s; %d of %d drafts accepted", n_gen,
                     all_same ? "tokens and logits bitwise identical (ids-only too)" : "DIFFER", acc, drf);
            report(all_same, name, "drafted == plain greedy (GPU)", detail);
            /* the GPU drafter's first-step proposals against the CPU drafter's */
            int32_t dg[4], dc[4];
            float *lgg = malloc(sizeof(float) * V), *lgc = malloc(sizeof(float) * V);
            g4_session_reset(s);
            g4_session_reset(sc);
            int ok = !g4_session_forward(s, tokens, 40, G4_LOGITS_NONE, NULL, &err) &&
                     !g4_drafter_propose(d, s, tokens[40], 4, dg, lgg, NULL, &err) &&
                     !g4_session_forward(sc, tokens, 40, G4_LOGITS_NONE, NULL, &err) &&
                     !g4_drafter_propose(d, sc, tokens[40], 4, dc, lgc, NULL, &err);
            double e = 0;
            for (int i = 0; ok && i < V; i++) e = fmax(e, fabs((double)lgg[i] - lgc[i]));
            snprintf(detail, sizeof detail, "4 drafts %s; step-1 logits max |GPU - CPU| %.2e%s%s",
                     ok && !memcmp(dg, dc, sizeof dg) ? "equal" : "DIFFER", e, ok ? "" : " error: ", ok ? "" : err.message);
            report(ok && !memcmp(dg, dc, sizeof dg) && e <= tol, name, "GPU drafter vs CPU drafter", detail);
            free(lgg);
            free(lgc);
            g4_drafter_free(d);
        }
    }
out:
    free(plain.tok);
    free(plain.lg);
    free(cpu.tok);
    free(cpu.lg);
    free(drafted.tok);
    free(drafted.lg);
    g4_session_free(s);
    g4_session_free(sc);
    g4_model_free(m);
    g4_model_free(mref);
}

int main(int argc, char **argv) {
    char desc[256];
    g4_error err = {0};
    if (g4_cuda_probe(desc, sizeof desc, &err)) {
        printf("SKIP %s\n", err.message);
        return 77;
    }
    printf("device: %s\n", desc);
    int n_gen = 600;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            n_gen = atoi(argv[++i]);
            continue;
        }
        if (!strcmp(argv[i], "--tol") && i + 1 < argc) {
            tol = atof(argv[++i]);
            continue;
        }
        check_fixture(argv[i], n_gen);
    }
    printf("gpu_exact: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
#else
int main(void) {
    printf("SKIP gpu_exact: built without CUDA\n");
    return 77;
}
#endif
