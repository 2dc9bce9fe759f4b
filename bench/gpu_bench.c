/* GPU decode benchmark: synthesizes released-geometry bf16 models in memory (model/synth.h: the
 * same geometry and seeds as `g4 synth`, no files), uploads them once and times, with CUDA events:
 *   decode       chained single-launch decode steps (argmax on the device) at context 128 and
 *                4k: tokens/s and GB/s against the streaming-read bandwidth measured in this run
 *   verify       a block of k+1 tokens (k = 1..6) relative to one decode step
 *   breakdown    the same step with classes of stages skipped: attention, LM head, everything
 *                (what is left is the barriers and the launch)
 *   tune         (--tune LIST) decode at ctx 128 under other prefetch / row-split settings
 *   trace        (--trace LIST) one step with per-stage timestamps under modes (g4_cuda_set_mode) and
 *                skip masks: where the time of each kind of stage goes
 * usage: gpu_bench [--arch e2b,e4b] [--storage bf16|mlx-4|qat-int8|...] [--tokens N] [--layers N]
 *                  [--ctx 128,4096] [--tune pf,self,split;...] [--trace ev,local,skip,detail[,rep];...]
 *                  [--mode evict_first,op_local] [--mma MASK] [--staged LIST] [--no-breakdown] [--trace-m M]
 *                  [--trace-prefill] [--strace MODE[a][q][:M[:DETAIL[:AMARK]]],...]
 *   staged       (--staged 2,4,0) chained decode per staged-decode mode (g4_cuda_set_staged) on the same
 *                upload, at the first two contexts, its tokens compared with the first mode's; a mode
 *                may carry option letters (g4_cuda_set_staged_opts): 4a attention after the wait on the
 *                full-SM kernel, 4q quantised rows through the weight rings (4aq both), p / P
 *                one-token quantised tiles without / with loads a group ahead, e: also their first
 *                group (and verify blocks' of 2..4 tokens) issued before the wait for the stage
 *                before (g4_cuda_set_pipe 0 / 1 / 2)
 *   strace       (--strace LIST) one staged step of M tokens at ctx 128 per entry, with marks in every
 *                block (g4_cuda_staged_trace): handoffs, input tiles, work and tails per kind of stage,
 *                DETAIL stages listed one by one */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "g4.h"

#ifdef G4_HAVE_CUDA
#include "cuda/cuda.h"
#include "cuda/program.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/session.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* bytes of K/V one decode step at position pos reads (every layer reads its source's cache) */
static double kv_bytes(const g4_model *m, int pos) {
    const g4_config *c = &m->cfg;
    double b = 0;
    for (int i = 0; i < c->n_layers; i++) {
        const g4_layer_config *l = &c->layers[i];
        int keys = l->is_full ? pos + 1 : (pos + 1 < c->sliding_window ? pos + 1 : c->sliding_window);
        b += 2.0 * keys * l->n_kv_heads * l->head_dim * sizeof(float);
    }
    return b;
}

typedef struct {
    const char *storage, *tune, *ctx, *trace;
    int breakdown, trace_m; /* --trace-m: tokens per traced step (a verify block when > 1) */
    int trace_fast;         /* --trace-prefill: the traced step runs the prefill procedure */
    int evict_first, op_local; /* --mode: the kernel modes every measurement below runs under */
    int mma;                   /* --mma MASK: G4_CUDA_MMA for the session (-1: leave the environment) */
    const char *staged;        /* --staged LIST: decode at each context per staged-decode mode, tokens compared */
    const char *strace;        /* --strace LIST: staged traces, MODE[a][q][:M[:DETAIL[:AMARK]]] each */
} bench_opts;

static int cmp_u64(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

/* One traced M=1 step at ctx 128 under a mode: per stage kind, the stage's span (start to the next
 * stage's start), the median and slowest block's work, the input tile (matmuls) and the wait at the
 * barrier; weight GB/s of the matmul kinds over their spans. */
static void trace_table(g4_session *s, const int32_t *prompt, int M, int ev, int local, int skip, int detail, int restore_ev,
                        int restore_local) {
    static const char *names[] = {"embed", "matmul", "heads", "attn", "ple", "moe_route", "expert",
                                  "moe_comb", "c_topk", "c_score", "c_fill"};
    enum { NK = 11 };
    g4_error err = {0};
    int grid = 0, n = 0;
    g4_cuda_describe(s->cuda, &grid, &n, NULL, NULL);
    unsigned long long *st = malloc(sizeof *st * (size_t)n * grid * 4), *tmp = malloc(sizeof *tmp * (size_t)grid),
                       *t2 = malloc(sizeof *t2 * (size_t)grid);
    int *kinds = malloc(sizeof(int) * (size_t)n);
    double *wb = malloc(sizeof(double) * (size_t)n);
    g4_cuda_set_mode(s->cuda, ev, local);
    g4_cuda_set_skip(s->cuda, skip);
    g4_session_reset(s);
    if (g4_session_forward(s, prompt, 128, G4_LOGITS_NONE, NULL, &err) ||
        g4_cuda_trace(s->cuda, 128, prompt + 128, M, st, kinds, wb, &err)) {
        fprintf(stderr, "trace: %s\n", err.message);
        goto done;
    }
    double cyc = 0, ns = 0; /* SM cycles per ns, from the blocks' own spans */
    for (size_t i = 0; i < (size_t)n * grid; i++) {
        cyc += (double)st[i * 4 + 3];
        ns += (double)(st[i * 4 + 1] - st[i * 4]);
    }
    const double cpn = ns > 0 ? cyc / ns : 1.0;
    double span[NK] = {0}, wmed[NK] = {0}, wmax[NK] = {0}, inp[NK] = {0}, wait[NK] = {0}, bytes[NK] = {0};
    int cnt[NK] = {0};
    const unsigned long long t_first = st[0];
    unsigned long long t_last = 0;
    for (int i = 0; i < n; i++) {
        const unsigned long long *r = st + (size_t)i * grid * 4;
        unsigned long long emax = 0;
        for (int b = 0; b < grid; b++) {
            tmp[b] = r[b * 4 + 3];
            if (r[b * 4 + 1] > emax) emax = r[b * 4 + 1];
        }
        qsort(tmp, (size_t)grid, sizeof *tmp, cmp_u64);
        for (int b = 0; b < grid; b++) t2[b] = r[b * 4 + 2];
        qsort(t2, (size_t)grid, sizeof *t2, cmp_u64);
        const unsigned long long in_sorted = t2[grid / 2], in_max = t2[grid - 1];
        const unsigned long long next = i + 1 < n ? st[(size_t)(i + 1) * grid * 4] : emax;
        const double sp = (double)(next - r[0]) / 1e3, md = tmp[grid / 2] / cpn / 1e3, mx = tmp[grid - 1] / cpn / 1e3;
        const double in = in_sorted / cpn / 1e3, wt = (double)(next > emax ? next - emax : 0) / 1e3;
        const int k = kinds[i] >= 0 && kinds[i] < NK ? kinds[i] : 0;
        span[k] += sp;
        wmed[k] += md;
        wmax[k] += mx;
        inp[k] += in;
        wait[k] += wt;
        bytes[k] += wb[i];
        cnt[k]++;
        if (next > t_last) t_last = next;
        if (i < detail)
            printf("      stage %3d %-9s span %7.1f us  work med %6.1f max %6.1f  input %5.1f (max %5.1f)  wait %5.1f  %6.2f MB %7.0f GB/s\n", i,
                   names[k], sp, md, mx, in, in_max / cpn / 1e3, wt, wb[i] / 1e6, sp > 0 ? wb[i] / (sp * 1e3) : 0.0);
    }
    printf("    trace M=%d ctx 128, evict_first=%d op_local=%d skip=%d: %.3f ms from the first stage's start to the last's end (SM clock %.2f GHz)\n",
           M, ev, local, skip, (double)(t_last - t_first) / 1e6, cpn);
    printf("      %-9s %4s %9s %9s %9s %9s %9s %9s %8s\n", "kind", "n", "total ms", "span us", "work med", "work max",
           "input", "wait", "GB/s");
    for (int k = 0; k < NK; k++)
        if (cnt[k])
            printf("      %-9s %4d %9.3f %9.2f %9.2f %9.2f %9.2f %9.2f %8.0f\n", names[k], cnt[k], span[k] / 1e3,
                   span[k] / cnt[k], wmed[k] / cnt[k], wmax[k] / cnt[k], inp[k] / cnt[k], wait[k] / cnt[k],
                   span[k] > 0 ? bytes[k] / (span[k] * 1e3) : 0.0);
done:
    g4_cuda_set_skip(s->cuda, 0);
    g4_cuda_set_mode(s->cuda, restore_ev, restore_local);
    free(st);
    free(tmp);
    free(t2);
    free(kinds);
    free(wb);
}

static double med_u64(unsigned long long *v, int n) {
    if (n < 1) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    return (double)v[n / 2];
}

/* One staged M-token step at ctx 128 (g4_cuda_staged_trace), as the decode or verify path runs it.
 * Per stage, from its blocks' marks: the handoff (the previous stage's last block end to this
 * stage's first wait return: what programmatic dependent launch costs on the critical path), the
 * head start (first block resident to first wait return), the skew of the waits (median minus
 * first), the input tile, the work after it and the tail (last block end minus median end), all
 * medians over blocks; the span is from the previous stage's last end to this one's. Totals per
 * kind of stage (matmuls by kernel: ring = mode 4's half-SM rings, half = mode 1/3's half-SM
 * kernel, full = one block per SM) and the whole step split into handoffs, input tiles, work and
 * tails. */
static void strace_table(g4_session *s, const int32_t *prompt, int M, int detail, int amark) {
    enum { NK = 9 };
    static const char *names[NK] = {"embed", "mm-full", "mm-half", "mm-ring", "attn", "attn-half", "head", "ple", "other"};
    g4_error err = {0};
    int grid = 0, n = 0;
    g4_cuda_describe(s->cuda, &grid, &n, NULL, NULL);
    const size_t per = (size_t)G4C_MAXB * 4;
    unsigned long long *st = malloc(sizeof *st * (size_t)n * per), *v = malloc(sizeof *v * G4C_MAXB);
    int *gr = malloc(sizeof(int) * (size_t)n), *kn = malloc(sizeof(int) * (size_t)n), *kinds = malloc(sizeof(int) * (size_t)n);
    double *wb = malloc(sizeof(double) * (size_t)n);
    if (!st || !v || !gr || !kn || !kinds || !wb) goto done;
    g4_session_reset(s);
    if (g4_session_forward(s, prompt, 128, G4_LOGITS_NONE, NULL, &err) ||
        g4_cuda_staged_trace(s->cuda, 128, prompt + 128, M, amark, st, gr, kn, kinds, wb, &err)) {
        printf("    staged trace: %s\n", err.message);
        goto done;
    }
    double t_span[NK] = {0}, t_hand[NK] = {0}, t_head[NK] = {0}, t_skew[NK] = {0}, t_in[NK] = {0}, t_work[NK] = {0},
           t_tail[NK] = {0}, t_bytes[NK] = {0};
    int cnt[NK] = {0};
    double prev_end = 0, first_end = 0, tot_hand = 0, tot_in = 0, tot_work = 0, tot_tail = 0, tot_skew = 0;
    for (int i = 0; i < n; i++) {
        const unsigned long long *r = st + (size_t)i * per;
        const int g = gr[i];
        double smin = 0, wmin = 0, emax = 0;
        int nin = 0;
        for (int b = 0; b < g; b++) {
            const double a = (double)r[b * 4], w = (double)r[b * 4 + 1], e = (double)r[b * 4 + 3];
            if (b == 0 || a < smin) smin = a;
            if (b == 0 || w < wmin) wmin = w;
            if (e > emax) emax = e;
            if (r[b * 4 + 2]) v[nin++] = r[b * 4 + 2] - r[b * 4 + 1];
        }
        const double in = med_u64(v, nin);
        for (int b = 0; b < g; b++) v[b] = r[b * 4 + 1];
        const double wmed = med_u64(v, g);
        for (int b = 0; b < g; b++) v[b] = r[b * 4 + 3];
        const double emed = med_u64(v, g);
        const double hand = i ? wmin - prev_end : 0, span = i ? emax - prev_end : 0, skew = wmed - wmin;
        const double work = emed - wmed - in, tail = emax - emed;
        int k = 8;
        if (kinds[i] == -1) k = 6;
        else if (kinds[i] == G4C_OP_EMBED) k = 0;
        else if (kinds[i] == G4C_OP_MATMUL) k = kn[i] == 3 ? 3 : kn[i] == 1 ? 2 : 1;
        else if (kinds[i] == G4C_OP_ATTN) k = kn[i] == 4 ? 5 : 4;
        else if (kinds[i] == G4C_OP_PLE) k = 7;
        if (i) {
            t_span[k] += span;
            t_hand[k] += hand;
            t_head[k] += wmin - smin;
            t_skew[k] += skew;
            t_in[k] += in;
            t_work[k] += work;
            t_tail[k] += tail;
            t_bytes[k] += wb[i];
            cnt[k]++;
            tot_hand += hand;
            tot_skew += skew;
            tot_in += in;
            tot_work += work;
            tot_tail += tail;
        } else
            first_end = emax;
        if (i < detail)
            printf("      stage %3d %-9s %3d blocks  span %6.1f us  handoff %5.1f  head start %5.1f  skew %4.1f  input %4.1f  work %6.1f  tail %4.1f  %6.2f MB\n",
                   i, names[k], g, span / 1e3, hand / 1e3, (wmin - smin) / 1e3, skew / 1e3, in / 1e3, work / 1e3, tail / 1e3, wb[i] / 1e6);
        prev_end = emax;
    }
    const double total = prev_end - first_end;
    printf("    staged trace M=%d ctx 128: %.3f ms from the first stage's end to the last's = handoffs %.3f + wait skew %.3f + "
           "input tiles %.3f + work %.3f + tails %.3f (medians over blocks)\n",
           M, total / 1e6, tot_hand / 1e6, tot_skew / 1e6, tot_in / 1e6, tot_work / 1e6, tot_tail / 1e6);
    printf("      %-9s %4s %9s %8s %8s %8s %8s %8s %8s %8s\n", "kind", "n", "total ms", "span us", "handoff", "head st",
           "skew", "input", "work", "tail");
    for (int k = 0; k < NK; k++)
        if (cnt[k])
            printf("      %-9s %4d %9.3f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f  %6.0f GB/s\n", names[k], cnt[k], t_span[k] / 1e6,
                   t_span[k] / cnt[k] / 1e3, t_hand[k] / cnt[k] / 1e3, t_head[k] / cnt[k] / 1e3, t_skew[k] / cnt[k] / 1e3,
                   t_in[k] / cnt[k] / 1e3, t_work[k] / cnt[k] / 1e3, t_tail[k] / cnt[k] / 1e3,
                   t_span[k] > 0 ? t_bytes[k] / t_span[k] : 0.0);
done:
    free(st);
    free(v);
    free(gr);
    free(kn);
    free(kinds);
    free(wb);
}

/* GPU seconds per forward of M tokens at position 128 (rows staged, all logits, nothing committed),
 * after 3 unmeasured ones: as a verify block runs */
static g4_status time_block(g4_session *s, const int32_t *toks, int M, double *secs, g4_error *err) {
    g4_status st = g4_cuda_time_forward(s->cuda, 128, toks, M, 3, secs, err);
    return st ? st : g4_cuda_time_forward(s->cuda, 128, toks, M, 20, secs, err);
}

static int bench_arch(const char *arch, int n_tok, int n_layers, double bw, const bench_opts *bo) {
    g4_error err = {0};
    g4_model *m = NULL;
    g4_synth_options so = {.seed = 1, .n_layers = n_layers, .keep_layout = 1}; /* the GPU uploads checkpoint layouts */
    double t0 = now();
    if (g4_model_synth(arch, &so, bo->storage, &m, &err)) {
        fprintf(stderr, "synth %s: %s\n", arch, err.message);
        return 1;
    }
    double t1 = now();
    const g4_config *c = &m->cfg;
    /* weight_bytes counts what a token streams: every matrix once (the tied embedding as the LM
     * head), not the gathered per-layer-input table */
    double stream = (double)m->weight_bytes;
    printf("\n%s (%s, %d layers, hidden %d): %.2f GB streamed per token; synthesized in %.1f s\n", arch, bo->storage,
           c->n_layers, c->hidden, stream / 1e9, t1 - t0);
    int ctxs[8], n_ctxs = 0, cmax = 128;
    {
        char cl[128];
        snprintf(cl, sizeof cl, "%s", bo->ctx);
        char *sv = NULL; /* strtok_r: main() is inside a strtok loop over the architectures */
        for (char *q = strtok_r(cl, ",", &sv); q && n_ctxs < 8; q = strtok_r(NULL, ",", &sv)) {
            ctxs[n_ctxs] = atoi(q);
            if (ctxs[n_ctxs] >= 16) cmax = ctxs[n_ctxs] > cmax ? ctxs[n_ctxs] : cmax, n_ctxs++;
        }
    }
    int ctx_max = cmax + n_tok + 64;
    if (ctx_max < 128 + bo->trace_m + 64) ctx_max = 128 + bo->trace_m + 64; /* the traced block follows a 128-token context */
    g4_session *s = NULL;
    if (bo->mma >= 0) { /* read when the CUDA session is created (its weights' layout follows it) */
        char v[16];
        snprintf(v, sizeof v, "%d", bo->mma);
        setenv("G4_CUDA_MMA", v, 1);
    }
    /* a traced block longer than 64 tokens (a prefill chunk) needs the room for it */
    g4_session_options opt = {.n_ctx = ctx_max, .max_batch = bo->trace_m > 64 ? bo->trace_m : 64, .device = G4_DEVICE_CUDA};
    if (g4_session_create(m, &opt, &s, &err)) {
        fprintf(stderr, "session: %s\n", err.message);
        g4_model_free(m);
        return 1;
    }
    g4_cuda_set_mode(s->cuda, bo->evict_first, bo->op_local);
    int grid = 0, n_ops = 0;
    size_t wb = 0, sb = 0;
    g4_cuda_describe(s->cuda, &grid, &n_ops, &wb, &sb);
    printf("  uploaded in %.1f s; persistent kernel: %d blocks x %d threads, %d stages per token; %.2f GB weights + %.2f GB cache/scratch on the GPU\n",
           now() - t1, grid, G4C_THREADS, n_ops, wb / 1e9, sb / 1e9);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(cmax + 256 + bo->trace_m)), *out = malloc(sizeof(int32_t) * (size_t)(n_tok + 8));
    uint32_t r = 7;
    for (int i = 0; i < cmax + 256 + bo->trace_m; i++) {
        r = r * 1664525u + 1013904223u;
        prompt[i] = i == 0 ? c->bos : 3 + (int32_t)((r >> 8) % 200000u);
    }
    float *lg = malloc(sizeof(float) * (size_t)c->vocab);
    printf("  %-6s %10s %10s %9s %9s %8s\n", "ctx", "prefill/s", "decode/s", "ms/token", "GB/s", "of peak");
    double step_ms[2] = {0, 0};
    for (int ci = 0; ci < n_ctxs; ci++) {
        int ctx = ctxs[ci];
        g4_session_reset(s);
        double p0 = now();
        if (g4_session_forward(s, prompt, ctx, G4_LOGITS_LAST, lg, &err)) {
            fprintf(stderr, "prefill: %s\n", err.message);
            break;
        }
        double p1 = now();
        int32_t t = 0;
        for (int i = 1; i < c->vocab; i++)
            if (lg[i] > lg[t]) t = i;
        double secs = 0;
        if (g4_cuda_decode_chain(s->cuda, ctx, t, 8, out, &secs, &err) || /* warm-up */
            g4_cuda_decode_chain(s->cuda, ctx, t, n_tok, out, &secs, &err)) {
            fprintf(stderr, "decode: %s\n", err.message);
            break;
        }
        double tps = n_tok / secs, bytes = stream + kv_bytes(m, ctx + n_tok / 2);
        if (ci < 2) step_ms[ci] = secs * 1e3 / n_tok;
        printf("  %-6d %10.0f %10.1f %9.3f %9.0f %7.1f%%\n", ctx, ctx / (p1 - p0), tps, secs * 1e3 / n_tok,
               bytes * tps / 1e9, 100.0 * bytes * tps / bw);
    }
    /* the staged decode's modes (g4_cuda_set_staged) on the same upload: tok/s per context, and the
     * chained tokens against the first mode's (the modes compute the same bits, so the same ids) */
    if (bo->staged && *bo->staged) {
        const int before = g4_cuda_set_staged(s->cuda, -1);
        int opt_a = 1, opt_q = 0;
        g4_cuda_get_staged_opts(s->cuda, &opt_a, &opt_q);
        int32_t *ref = malloc(sizeof(int32_t) * (size_t)n_tok * 2);
        /* a k = 3 verify block's logits (4 rows) per mode, compared bit for bit with the first mode's */
        const size_t vl = (size_t)4 * (size_t)c->vocab;
        float *vref = malloc(sizeof(float) * vl), *vcur = malloc(sizeof(float) * vl);
        char sl[64];
        snprintf(sl, sizeof sl, "%s", bo->staged);
        int first = 1;
        char *save = NULL;
        for (char *q = strtok_r(sl, ",", &save); q && ref; q = strtok_r(NULL, ",", &save)) {
            const int mode = atoi(q);
            if (g4_cuda_set_staged(s->cuda, mode) != mode) {
                printf("  staged=%d: not a mode\n", mode);
                continue;
            }
            /* suffixes: a = attention after the wait on the full-SM kernel, q = 4-bit and 8-bit rows through the rings */
            g4_cuda_set_staged_opts(s->cuda, strchr(q, 'a') ? 0 : opt_a, strchr(q, 'q') ? 1 : opt_q);
            /* p / P: one-token quantised tiles without / with their loads a group ahead */
            const int pipe = g4_cuda_set_pipe(s->cuda, strchr(q, 'p') ? 0 : strchr(q, 'P') ? 1 : strchr(q, 'e') ? 2 : -1);
            printf("  staged=%s:", q);
            for (int ci = 0; ci < n_ctxs && ci < 2; ci++) {
                const int ctx = ctxs[ci];
                double secs = 0;
                g4_session_reset(s);
                if (g4_session_forward(s, prompt, ctx, G4_LOGITS_NONE, NULL, &err) ||
                    g4_cuda_decode_chain(s->cuda, ctx, prompt[ctx], 8, out, &secs, &err) || /* warm-up (builds the graph) */
                    g4_cuda_decode_chain(s->cuda, ctx, prompt[ctx], n_tok, out, &secs, &err)) {
                    printf(" ctx %d: %s", ctx, err.message);
                    break;
                }
                const double tps = n_tok / secs, bytes = stream + kv_bytes(m, ctx + n_tok / 2);
                int same = -1;
                if (first) memcpy(ref + (size_t)ci * n_tok, out, sizeof(int32_t) * (size_t)n_tok);
                else same = !memcmp(ref + (size_t)ci * n_tok, out, sizeof(int32_t) * (size_t)n_tok);
                printf("  ctx %d %.1f tok/s %.3f ms %.0f GB/s %.1f%%%s", ctx, tps, secs * 1e3 / n_tok, bytes * tps / 1e9,
                       100.0 * bytes * tps / bw, same < 0 ? "" : same ? " (same tokens)" : " (TOKENS DIFFER)");
            }
            double one = 0, four = 0;
            g4_session_reset(s);
            if (vref && vcur && !g4_session_forward(s, prompt, 128, G4_LOGITS_NONE, NULL, &err) &&
                !time_block(s, prompt + 128, 1, &one, &err) && !time_block(s, prompt + 128, 4, &four, &err) &&
                !g4_cuda_forward(s->cuda, 128, prompt + 128, 4, 0, 1, first ? vref : vcur, 0, &err))
                printf("  | verify k=3 at ctx 128 %.3f ms = %.2fx its step%s", four * 1e3, four / one,
                       first ? "" : memcmp(vref, vcur, sizeof(float) * vl) ? " (LOGITS DIFFER)" : " (same logits)");
            printf("\n");
            g4_cuda_set_pipe(s->cuda, pipe);
            first = 0;
        }
        free(ref);
        free(vref);
        free(vcur);
        g4_cuda_set_staged(s->cuda, before);
        g4_cuda_set_staged_opts(s->cuda, opt_a, opt_q);
    }
    /* staged traces: MODE[a][q][:M[:DETAIL[:AMARK]]],... */
    if (bo->strace && *bo->strace) {
        const int before = g4_cuda_set_staged(s->cuda, -1);
        int opt_a = 1, opt_q = 0;
        g4_cuda_get_staged_opts(s->cuda, &opt_a, &opt_q);
        char sl[128];
        snprintf(sl, sizeof sl, "%s", bo->strace);
        char *save = NULL;
        for (char *q = strtok_r(sl, ",", &save); q; q = strtok_r(NULL, ",", &save)) {
            const int mode = atoi(q);
            int M = 1, detail = 0, amark = 0;
            const char *c1 = strchr(q, ':');
            if (c1) sscanf(c1 + 1, "%d:%d:%d", &M, &detail, &amark);
            if (M < 1 || M > 16 || g4_cuda_set_staged(s->cuda, mode) != mode) {
                printf("  strace %s: not a staged mode and block\n", q);
                continue;
            }
            const char *o = q;
            while (*o >= '0' && *o <= '9') o++;
            const size_t ol = (size_t)(c1 ? c1 - o : (long)strlen(o));
            g4_cuda_set_staged_opts(s->cuda, memchr(o, 'a', ol) ? 0 : opt_a, memchr(o, 'q', ol) ? 1 : opt_q);
            const int pipe = g4_cuda_set_pipe(s->cuda, memchr(o, 'p', ol) ? 0 : memchr(o, 'P', ol) ? 1 : memchr(o, 'e', ol) ? 2 : -1);
            if (amark)
                printf("  staged=%.*s, attention stages' input = item chain to point %d:\n", (int)(c1 ? c1 - q : (long)strlen(q)), q, amark);
            else
                printf("  staged=%.*s:\n", (int)(c1 ? c1 - q : (long)strlen(q)), q);
            strace_table(s, prompt, M, detail, amark);
            g4_cuda_set_staged_opts(s->cuda, opt_a, opt_q);
            g4_cuda_set_pipe(s->cuda, pipe);
        }
        g4_cuda_set_staged(s->cuda, before);
    }
    /* other tuning settings: decode at context 128 */
    if (bo->tune && *bo->tune) {
        char tl[256];
        snprintf(tl, sizeof tl, "%s", bo->tune);
        char *save = NULL;
        for (char *q = strtok_r(tl, ";", &save); q; q = strtok_r(NULL, ";", &save)) {
            int a = 1, b = 1, sc = 8, kb = 0;
            if (sscanf(q, "%d,%d,%d,%d", &a, &b, &sc, &kb) < 3) continue;
            double secs = 0;
            g4_session_reset(s);
            if (g4_cuda_set_tune(s->cuda, a, b, sc, kb, &err) || g4_session_forward(s, prompt, 128, G4_LOGITS_NONE, NULL, &err) ||
                g4_cuda_decode_chain(s->cuda, 128, prompt[128], 8, out, &secs, &err) ||
                g4_cuda_decode_chain(s->cuda, 128, prompt[128], n_tok, out, &secs, &err)) {
                fprintf(stderr, "tune %s: %s\n", q, err.message);
                break;
            }
            double tps = n_tok / secs, bytes = stream + kv_bytes(m, 128 + n_tok / 2);
            printf("  tune pf_items=%d pf_self=%d split_chunks=%-2d smem_kb=%-3d ctx 128: %8.1f tok/s %8.0f GB/s %5.1f%%\n", a, b, sc, kb, tps,
                   bytes * tps / 1e9, 100.0 * bytes * tps / bw);
        }
        g4_cuda_set_tune(s->cuda, 0, 0, 0, 0, &err); /* the defaults */
    }
    /* per-stage traces: "ev,local,skip[,detail];..." */
    if (bo->trace && *bo->trace) {
        char tl[256];
        snprintf(tl, sizeof tl, "%s", bo->trace);
        char *save = NULL;
        for (char *q = strtok_r(tl, ";", &save); q; q = strtok_r(NULL, ";", &save)) {
            int ev = 1, local = 1, skip = 0, detail = 0, rep = 0;
            if (sscanf(q, "%d,%d,%d,%d,%d", &ev, &local, &skip, &detail, &rep) < 2) continue;
            if (!bo->breakdown) { /* decode speed under this mode too */
                double secs = 0;
                g4_error e2 = {0};
                g4_cuda_set_mode(s->cuda, ev, local);
                g4_session_reset(s);
                if (!g4_session_forward(s, prompt, 128, G4_LOGITS_NONE, NULL, &e2) &&
                    !g4_cuda_decode_chain(s->cuda, 128, prompt[128], 8, out, &secs, &e2) &&
                    !g4_cuda_decode_chain(s->cuda, 128, prompt[128], n_tok, out, &secs, &e2))
                    printf("    mode evict_first=%d op_local=%d: decode ctx 128 %.1f tok/s\n", ev, local, n_tok / secs);
                g4_cuda_set_mode(s->cuda, bo->evict_first, bo->op_local);
            }
            g4_cuda_set_rep(s->cuda, rep);
            if (rep) printf("    (every stage run %d times, the last timed: warm code and small data)\n", rep + 1);
            g4_cuda_set_trace_prefill(s->cuda, bo->trace_fast);
            trace_table(s, prompt, bo->trace_m, ev, local, skip, detail, bo->evict_first, bo->op_local);
            g4_cuda_set_rep(s->cuda, 0);
            if (bo->trace_fast) { /* the trace above is the one-launch procedure; g4_cuda_prefill runs launches */
                double ms[3] = {0, 0, 0};
                int nl[3] = {0, 0, 0};
                g4_error e2 = {0};
                g4_session_reset(s);
                if (!g4_session_forward(s, prompt, 128, G4_LOGITS_NONE, NULL, &e2) &&
                    !g4_cuda_prefill_profile(s->cuda, 128, prompt + 128, bo->trace_m, ms, nl, &e2)) {
                    const double tot = ms[0] + ms[1] + ms[2];
                    printf("    fast prefill as launches, M=%d ctx 128: %.3f ms = persistent kernel %.3f ms (%d launches) + "
                           "prefill GEMM %.3f ms (%d stages) + attention %.3f ms (%d layers) = %.1f tok/s\n",
                           bo->trace_m, tot, ms[0], nl[0], ms[1], nl[1], ms[2], nl[2], bo->trace_m / (tot / 1e3));
                } else
                    printf("    fast prefill as launches: %s\n", e2.message);
                /* the same block's last logits, fast prefill against the decode procedure (a
                 * full-size check of the fast path's arithmetic: rounding only) */
                float *la = malloc(sizeof(float) * (size_t)c->vocab), *lb = malloc(sizeof(float) * (size_t)c->vocab);
                const int M = bo->trace_m;
                g4_error e3 = {0};
                if (la && lb && !g4_cuda_prefill(s->cuda, 128, prompt + 128, M, M - 1, 1, la, &e3) &&
                    !g4_cuda_forward(s->cuda, 128, prompt + 128, M, M - 1, 1, lb, 0, &e3)) {
                    double dmax = 0, amax = 0;
                    int ia = 0, ib = 0;
                    for (int i = 0; i < c->vocab; i++) {
                        double d = la[i] > lb[i] ? la[i] - lb[i] : lb[i] - la[i], a = lb[i] < 0 ? -lb[i] : lb[i];
                        dmax = d > dmax ? d : dmax;
                        amax = a > amax ? a : amax;
                        if (la[i] > la[ia]) ia = i;
                        if (lb[i] > lb[ib]) ib = i;
                    }
                    printf("    fast prefill vs decode procedure, token %d of %d: max |logit diff| %.3g (max |logit| %.3g), argmax %d / %d\n",
                           M, M, dmax, amax, ia, ib);
                } else if (e3.message[0])
                    printf("    fast prefill check: %s\n", e3.message);
                free(la);
                free(lb);
            }
        }
    }
    /* verify blocks and the breakdown at context 128 */
    g4_session_reset(s);
    if (!g4_session_forward(s, prompt, 128, G4_LOGITS_NONE, NULL, &err)) {
        double one = 0, t = 0;
        time_block(s, prompt + 128, 1, &one, &err);
        printf("  verify block (rows staged, all logits) at ctx 128: M=1 %.3f ms", one * 1e3);
        for (int k = 1; k <= 6; k++) {
            if (time_block(s, prompt + 128, k + 1, &t, &err)) break;
            printf(" | k=%d %.2fx", k, t / one);
        }
        printf("\n");
        if (!bo->breakdown) goto skip_breakdown;
        static const struct {
            const char *what;
            int mask;
        } parts[] = {{"attention stages", G4C_CLS_ATTN},
                     {"LM head stage", G4C_CLS_HEAD},
                     {"norm/rope/PLE/route stages", G4C_CLS_OTHER},
                     {"matmul stages", G4C_CLS_MATMUL},
                     {"everything but barriers", G4C_CLS_ATTN | G4C_CLS_HEAD | G4C_CLS_OTHER | G4C_CLS_MATMUL}};
        printf("  breakdown of one M=1 step at ctx 128 (%.3f ms): time saved by skipping\n", one * 1e3);
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            g4_cuda_set_skip(s->cuda, parts[i].mask);
            g4_cuda_time_forward(s->cuda, 128, prompt + 128, 1, 20, &t, &err);
            printf("    %-28s %.3f ms (%.0f%%)\n", parts[i].what, (one - t) * 1e3, 100 * (one - t) / one);
        }
        g4_cuda_set_skip(s->cuda, G4C_CLS_ATTN | G4C_CLS_HEAD | G4C_CLS_OTHER | G4C_CLS_MATMUL);
        g4_cuda_time_forward(s->cuda, 128, prompt + 128, 1, 20, &t, &err);
        printf("    left: %d barriers + launch = %.3f ms (%.2f us per barrier)\n", n_ops - 1, t * 1e3,
               t * 1e6 / (n_ops - 1));
        g4_cuda_set_skip(s->cuda, 0);
    skip_breakdown:
        printf("  weights-only floor at %.0f GB/s: %.3f ms/token\n", bw / 1e9, stream / bw * 1e3);
    }
    (void)step_ms;
    free(prompt);
    free(out);
    free(lg);
    g4_session_free(s);
    g4_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    const char *archs = "e2b,e4b";
    int n_tok = 128, n_layers = 0;
    bench_opts bo = {.storage = "bf16", .tune = NULL, .ctx = "128,4096", .trace = NULL, .breakdown = 1, .trace_m = 1,
                     .evict_first = 1, .op_local = 1, .mma = -1};
    setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut short by a time limit still shows how far it got */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--arch") && i + 1 < argc) archs = argv[++i];
        else if (!strcmp(argv[i], "--storage") && i + 1 < argc) bo.storage = argv[++i];
        else if (!strcmp(argv[i], "--tune") && i + 1 < argc) bo.tune = argv[++i];
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) bo.ctx = argv[++i];
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) bo.trace = argv[++i];
        else if (!strcmp(argv[i], "--no-breakdown")) bo.breakdown = 0;
        else if (!strcmp(argv[i], "--trace-m") && i + 1 < argc) {
            bo.trace_m = atoi(argv[++i]);
            if (bo.trace_m < 1 || bo.trace_m > 512) {
                fprintf(stderr, "gpu_bench: --trace-m takes 1 .. 512 tokens\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--trace-prefill")) bo.trace_fast = 1;
        else if (!strcmp(argv[i], "--strace") && i + 1 < argc) bo.strace = argv[++i];
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d,%d", &bo.evict_first, &bo.op_local) != 2) bo.evict_first = bo.op_local = 1;
        }
        else if (!strcmp(argv[i], "--mma") && i + 1 < argc) bo.mma = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--staged") && i + 1 < argc) bo.staged = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n_tok = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) n_layers = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gpu_bench [--arch e2b,e4b] [--storage S] [--tokens N] [--layers N] [--ctx LIST] "
                            "[--tune pf,self,split;...] [--trace ev,local,skip,detail;...] [--mode ev,local] [--mma MASK] [--staged 2,4,0] [--no-breakdown] [--trace-m M] [--trace-prefill] [--strace MODE[a][q][:M[:DETAIL[:AMARK]]],...]\n");
            return 2;
        }
    }
    char desc[256];
    g4_error err = {0};
    if (g4_cuda_probe(desc, sizeof desc, &err)) {
        printf("SKIP gpu_bench: %s\n", err.message);
        return 77;
    }
    double bw = 0;
    if (g4_cuda_bandwidth((size_t)4 << 30, &bw, &err)) {
        fprintf(stderr, "bandwidth: %s\n", err.message);
        return 1;
    }
    printf("device: %s; streaming read %.0f GB/s (4 GiB, best of 5)\n", desc, bw / 1e9);
    char list[256];
    snprintf(list, sizeof list, "%s", archs);
    int rc = 0;
    for (char *a = strtok(list, ","); a; a = strtok(NULL, ",")) rc |= bench_arch(a, n_tok, n_layers, bw, &bo);
    return rc;
}
#else
int main(void) {
    printf("SKIP gpu_bench: built without CUDA\n");
    return 77;
}
#endif
