/* Token sampler: penalties -> temperature -> top-k -> top-p -> min-p -> draw (see g4_sample.h).
 *
 * Where the time goes. With a 262,144-entry vocabulary one scalar expf per logit costs about a
 * millisecond, and a full sort many more, so:
 *   - every pass over the vocabulary is a native-width vector loop (sampler_kernels.h, built for
 *     SSE2/generic, AVX2 and AVX-512 and picked at create time; all give the same bits);
 *   - e^x comes from our own polynomial (vectorisable, unlike libm's expf without fast-math);
 *   - top-k is one streaming pass against a k-entry heap, tested 64 logits at a time, so almost
 *     every logit costs one vector compare;
 *   - top-p never sorts: the pass that computes the weights also gathers the tokens within
 *     e^-12 of the top one, which usually hold the nucleus, and a mass-weighted quickselect
 *     settles the cut among them; when they do not (flat rows), ladder passes that measure the
 *     mass above several thresholds at once narrow the cut down to a small band first;
 *   - min-p alone is a logit threshold, so only tokens above it get an exp;
 *   - plain temperature sampling needs every weight; the draw then walks per-block sums first
 *     and one block of weights second, rather than a serial prefix sum over the vocabulary.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "g4_sample.h"
#include "runtime/sampler_internal.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#define GROUP 64                /* logits tested together before falling back to a scalar look */
#define BLOCK 256               /* weights per block sum in the full-vocabulary draw */
#define LADDER 8                /* thresholds per top-p search pass */
#define LADDER_CHUNK 4096       /* logits between flushes of the ladder's 32-bit lanes */
#define LADDER_SCALE 1048576.0f /* 2^20: ladder weights are counted in units of 2^-20 */
#define BAND_SMALL 1024     /* a top-p band this small is resolved by selection, not a new pass */
#define TOP_P_GATHER -12.0f /* top-p first tries the tokens within e^-12 of the top one ... */
#define TOP_P_CAP 8192      /* ... if there are at most this many */
#define MAX_HISTORY (1 << 24)
#define MAX_VOCAB (1 << 28)

/* A surviving token: its (penalised) logit ranks it, its weight e^((v - max) / T) is its
 * unnormalised probability. */
typedef struct cand {
    float v;
    int32_t idx;
    float w;
} cand;

/* Does a rank before b? Higher logit first, lower index among equal logits. */
static inline int ranks_before(const cand *a, const cand *b) {
    return a->v > b->v || (a->v == b->v && a->idx < b->idx);
}

/* The top-k heap keeps its worst-ranked entry at the root. */
static void heap_sift_down(cand *h, int n, int i) {
    for (;;) {
        int worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(&h[worst], &h[l])) worst = l;
        if (r < n && ranks_before(&h[worst], &h[r])) worst = r;
        if (worst == i) return;
        cand t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* One build of the vocabulary-wide loops (see sampler_kernels.h). */
typedef struct sampler_kernels {
    int width;
    float (*max_pass)(const float *x, int n, int *bad);
    int (*first_equal)(const float *x, int n, float m);
    int (*exp_pass)(const float *x, int n, float m, float inv_t, float *w, float *block_sum,
                    float lo, cand *c, int cap);
    void (*top_k_select)(const float *x, int n, int k, cand *c);
    int (*collect_by_logit)(const float *x, int n, float m, float inv_t, float lo, const float *w,
                            cand *c, double *mass);
    void (*ladder)(const float *x, const float *w, int n, float m, float inv_t, const float *lows,
                   int64_t *mass_q, int64_t *count);
} sampler_kernels;

/* The kernels take and return native vectors only inside always-inlined helpers, so GCC's
 * warning that such values have no stable ABI without AVX does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define KW 4
#define KSUFFIX _w4
#define KTARGET
#include "runtime/sampler_kernels.h"
#undef KW
#undef KSUFFIX
#undef KTARGET

#if defined(__x86_64__) && defined(__GNUC__)
#define SAMPLER_X86 1
#define KW 8
#define KSUFFIX _w8
#define KTARGET __attribute__((target("avx2")))
#include "runtime/sampler_kernels.h"
#undef KW
#undef KSUFFIX
#undef KTARGET

#define KW 16
#define KSUFFIX _w16
#define KTARGET __attribute__((target("avx512f")))
#include "runtime/sampler_kernels.h"
#undef KW
#undef KSUFFIX
#undef KTARGET
#endif

/* The kernels for a vector width (0: the widest this CPU runs); NULL when unavailable. */
static const sampler_kernels *pick_kernels(int width) {
#ifdef SAMPLER_X86
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
    if (width == 0) width = avx512 ? 16 : avx2 ? 8 : 4;
    if (width == 16) return avx512 ? &kernels_w16 : NULL;
    if (width == 8) return avx2 ? &kernels_w8 : NULL;
#else
    if (width == 0) width = 4;
#endif
    return width == 4 ? &kernels_w4 : NULL;
}

/* e^((x - m) * inv_t) for n values through the same code as the vocabulary-wide pass. */
static void weights_of(const float *x, int n, float m, float inv_t, float *y) {
    const vf_w4 mv = splat_w4(m), tv = splat_w4(inv_t);
    for (int i = 0; i < n; i += 16) {
        float in[16], out[16];
        const int k = n - i < 16 ? n - i : 16;
        for (int j = 0; j < 16; j++) in[j] = j < k ? x[i + j] : -INFINITY;
        weights16_w4(in, &mv, &tv, out);
        memcpy(y + i, out, (size_t)k * sizeof *y);
    }
}

void g4_sampler_exp_neg(const float *x, float *y, int n) { weights_of(x, n, 0.0f, 1.0f, y); }

/* ---- Generator: splitmix64 (a Weyl sequence through a 64-bit mixer; period 2^64). -------- */

static uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *state) { return (double)(rng_next(state) >> 11) * 0x1p-53; }

/* ---- Sampler state ----------------------------------------------------------------------- */

struct g4_sampler {
    g4_sampler_options opt;
    int n_vocab;
    float inv_t; /* 1 / temperature; 0 when decoding greedily */
    const sampler_kernels *k;
    uint64_t rng;
    int32_t *hist; /* ring of the last penalty_last_n accepted tokens */
    int n_hist, hist_pos;
    float *work;      /* [n_vocab] penalised copy of the caller's logits */
    float *w;         /* [n_vocab rounded up to 16] weights of the full-vocabulary path */
    float *block_sum; /* [n_vocab / BLOCK rounded up] sums of w per block */
    cand *cand;       /* [n_vocab] candidate set of the filtered paths */
};

g4_sampler_options g4_sampler_default_options(void) {
    g4_sampler_options o;
    memset(&o, 0, sizeof o);
    o.temperature = 1.0f;
    o.top_k = 0;
    o.top_p = 1.0f;
    o.min_p = 0.0f;
    o.repetition_penalty = 1.0f;
    o.presence_penalty = 0.0f;
    o.penalty_last_n = 64;
    o.seed = 0;
    return o;
}

static g4_status check_options(const g4_sampler_options *o, g4_error *err) {
    /* Written so that NaN fails every range test. */
    if (!(o->temperature >= 0.0f && isfinite(o->temperature)))
        return g4_fail(err, G4_ERR_ARG, "sampler: temperature must be a finite value >= 0 (got %g)",
                       (double)o->temperature);
    if (o->top_k < 0)
        return g4_fail(err, G4_ERR_ARG, "sampler: top_k must be >= 0 (got %d)", o->top_k);
    if (!(o->top_p > 0.0f && o->top_p <= 1.0f))
        return g4_fail(err, G4_ERR_ARG, "sampler: top_p must be in (0, 1] (got %g)",
                       (double)o->top_p);
    if (!(o->min_p >= 0.0f && o->min_p <= 1.0f))
        return g4_fail(err, G4_ERR_ARG, "sampler: min_p must be in [0, 1] (got %g)",
                       (double)o->min_p);
    if (!(o->repetition_penalty > 0.0f && isfinite(o->repetition_penalty)))
        return g4_fail(err, G4_ERR_ARG,
                       "sampler: repetition_penalty must be a finite value > 0 (got %g)",
                       (double)o->repetition_penalty);
    if (!isfinite(o->presence_penalty))
        return g4_fail(err, G4_ERR_ARG, "sampler: presence_penalty must be finite (got %g)",
                       (double)o->presence_penalty);
    if (o->penalty_last_n < 0 || o->penalty_last_n > MAX_HISTORY)
        return g4_fail(err, G4_ERR_ARG, "sampler: penalty_last_n must be in [0, %d] (got %d)",
                       MAX_HISTORY, o->penalty_last_n);
    return G4_OK;
}

static int penalties_on(const g4_sampler *s) {
    return s->opt.penalty_last_n > 0 &&
           (s->opt.repetition_penalty != 1.0f || s->opt.presence_penalty != 0.0f);
}

g4_status g4_sampler_create_width(const g4_sampler_options *opts, int n_vocab, int width,
                                  g4_sampler **out, g4_error *err) {
    if (!out) return g4_fail(err, G4_ERR_ARG, "sampler: out is NULL");
    *out = NULL;
    if (!opts) return g4_fail(err, G4_ERR_ARG, "sampler: options are NULL");
    if (n_vocab < 1 || n_vocab > MAX_VOCAB)
        return g4_fail(err, G4_ERR_ARG, "sampler: n_vocab must be in [1, %d] (got %d)", MAX_VOCAB,
                       n_vocab);
    g4_status st = check_options(opts, err);
    if (st != G4_OK) return st;
    const sampler_kernels *k = pick_kernels(width);
    if (!k)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "sampler: no %d-lane kernels on this CPU", width);

    g4_sampler *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, G4_ERR_NOMEM, "sampler: out of memory");
    s->opt = *opts;
    s->n_vocab = n_vocab;
    s->k = k;
    s->inv_t = opts->temperature > 0.0f ? 1.0f / opts->temperature : 0.0f;
    if (!isfinite(s->inv_t)) s->inv_t = 0.0f; /* T below ~3e-39: greedy, see the header */
    size_t padded = ((size_t)n_vocab + 15) / 16 * 16;
    size_t n_blocks = ((size_t)n_vocab + BLOCK - 1) / BLOCK;
    int ok = 1;
    if (s->inv_t > 0.0f) { /* greedy decoding needs none of the weight scratch */
        s->w = malloc(padded * sizeof *s->w);
        s->block_sum = malloc(n_blocks * sizeof *s->block_sum);
        s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
        ok = s->w && s->block_sum && s->cand;
    }
    if (penalties_on(s)) {
        s->work = malloc((size_t)n_vocab * sizeof *s->work);
        s->hist = malloc((size_t)opts->penalty_last_n * sizeof *s->hist);
        ok = ok && s->work && s->hist;
    }
    if (!ok) {
        g4_sampler_free(s);
        return g4_fail(err, G4_ERR_NOMEM, "sampler: out of memory for a %d-token vocabulary",
                       n_vocab);
    }
    g4_sampler_reset(s);
    *out = s;
    return G4_OK;
}

g4_status g4_sampler_create(const g4_sampler_options *opts, int n_vocab, g4_sampler **out,
                            g4_error *err) {
    return g4_sampler_create_width(opts, n_vocab, 0, out, err);
}

void g4_sampler_free(g4_sampler *s) {
    if (!s) return;
    free(s->hist);
    free(s->work);
    free(s->w);
    free(s->block_sum);
    free(s->cand);
    free(s);
}

void g4_sampler_reset(g4_sampler *s) {
    s->rng = s->opt.seed;
    s->n_hist = 0;
    s->hist_pos = 0;
}

g4_status g4_sampler_accept(g4_sampler *s, int32_t token, g4_error *err) {
    if (token < 0 || token >= s->n_vocab)
        return g4_fail(err, G4_ERR_ARG,
                       "sampler: accepted token %d is outside the vocabulary [0, %d)", (int)token,
                       s->n_vocab);
    if (!s->hist) return G4_OK;
    s->hist[s->hist_pos] = token;
    s->hist_pos = s->hist_pos + 1 == s->opt.penalty_last_n ? 0 : s->hist_pos + 1;
    if (s->n_hist < s->opt.penalty_last_n) s->n_hist++;
    return G4_OK;
}

double g4_sampler_uniform(g4_sampler *s) { return rng_uniform(&s->rng); }

/* out already holds a copy of logits. Each penalised value is computed from the caller's
 * original logit, so a token occurring many times in the window is penalised exactly once. */
static void penalize_history(const g4_sampler *s, const float *logits, float *out) {
    const float rep = s->opt.repetition_penalty, pres = s->opt.presence_penalty;
    for (int i = 0; i < s->n_hist; i++) {
        int32_t t = s->hist[i];
        float l = logits[t];
        if (rep != 1.0f) l = l > 0.0f ? l / rep : l * rep;
        out[t] = l - pres;
    }
}

g4_status g4_sampler_apply_penalties(const g4_sampler *s, const float *logits, int n_vocab,
                                     float *out, g4_error *err) {
    if (n_vocab != s->n_vocab)
        return g4_fail(err, G4_ERR_ARG, "sampler: n_vocab %d differs from the sampler's %d",
                       n_vocab, s->n_vocab);
    if (out == logits)
        return g4_fail(err, G4_ERR_ARG, "sampler: penalties need out separate from logits");
    memcpy(out, logits, (size_t)n_vocab * sizeof *out);
    if (penalties_on(s)) penalize_history(s, logits, out);
    return G4_OK;
}

/* Sets c[i].w for n candidates. */
static void cand_weights(cand *c, int n, float m, float inv_t) {
    for (int i = 0; i < n; i += 16) {
        float v[16], w[16];
        const int k = n - i < 16 ? n - i : 16;
        for (int j = 0; j < k; j++) v[j] = c[i + j].v;
        weights_of(v, k, m, inv_t, w);
        for (int j = 0; j < k; j++) c[i + j].w = w[j];
    }
}

/* ---- Top-p without sorting --------------------------------------------------------------- */

static inline void cand_swap(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

static void insertion_sort(cand *c, int n) {
    for (int i = 1; i < n; i++) {
        cand t = c[i];
        int j = i;
        for (; j > 0 && ranks_before(&t, &c[j - 1]); j--) c[j] = c[j - 1];
        c[j] = t;
    }
}

/* Reorders c[0..n) so that c[0..r) is the smallest best-ranked prefix whose weight reaches
 * target, and returns r. Quickselect on rank that keeps score of the mass above the pivot:
 * expected linear time, and only the final few elements are ever sorted. If rounding keeps the
 * whole set short of target, everything stays. */
static int mass_select(cand *c, int n, double target) {
    int lo = 0, hi = n;
    double acc = 0.0; /* weight of c[0..lo), all ranked before c[lo..hi) */
    while (hi - lo > 16) {
        /* Median of three by rank, moved to hi - 1. */
        int a = lo, b = lo + (hi - lo) / 2, d = hi - 1;
        if (ranks_before(&c[b], &c[a])) cand_swap(&c[a], &c[b]);
        if (ranks_before(&c[d], &c[b])) cand_swap(&c[b], &c[d]);
        if (ranks_before(&c[b], &c[a])) cand_swap(&c[a], &c[b]);
        cand_swap(&c[b], &c[hi - 1]);
        const cand pivot = c[hi - 1];
        int p = lo;
        double above = 0.0;
        for (int j = lo; j < hi - 1; j++)
            if (ranks_before(&c[j], &pivot)) {
                above += c[j].w;
                cand_swap(&c[p++], &c[j]);
            }
        cand_swap(&c[p], &c[hi - 1]);
        if (acc + above >= target) {
            hi = p;
        } else if (acc + above + c[p].w >= target) {
            return p + 1;
        } else {
            acc += above + c[p].w;
            lo = p + 1;
        }
    }
    insertion_sort(c + lo, hi - lo);
    for (int j = lo; j < hi; j++) {
        acc += c[j].w;
        if (acc >= target) return j + 1;
    }
    return hi;
}

/* Keeps the candidates whose weight is >= min_p (the top token's weight is exactly 1). */
static int min_p_filter(cand *c, int n, float min_p) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (c[i].w >= min_p) c[k++] = c[i];
    return k;
}

/* Before selecting a nucleus among n gathered candidates, drops those that cannot be in it:
 * one pass bins them by (x - m) / T in steps of 2 and keeps the bins above the one where the
 * mass first reaches target (a best-ranked prefix, since the bin never rises as x falls). */
static int prune_candidates(cand *c, int n, float m, float inv_t, double target) {
    enum { BINS = 8 };
    if (n <= 512) return n;
    double bin_mass[BINS] = {0};
    for (int i = 0; i < n; i++) {
        const int b = (int)(-((c[i].v - m) * inv_t) * 0.5f);
        bin_mass[b < BINS - 1 ? b : BINS - 1] += c[i].w;
    }
    double acc = 0.0;
    int last = 0;
    for (; last < BINS - 1; last++) {
        acc += bin_mass[last];
        if (acc >= target) break;
    }
    if (last == BINS - 1) return n;
    int k = 0;
    for (int i = 0; i < n; i++)
        if ((int)(-((c[i].v - m) * inv_t) * 0.5f) <= last) c[k++] = c[i];
    return k;
}

/* Top-p over the whole vocabulary, given every weight in s->w: puts the nucleus in c and
 * returns its size. Rather than sort, it narrows down where the cut falls: a ladder pass
 * measures the mass above LADDER thresholds of (x - max) / T, the band between the two
 * thresholds that straddle the target is split into LADDER finer steps and measured again, up
 * to three times or until the band holds at most BAND_SMALL tokens. Then the tokens above the
 * band's floor are gathered; those above its ceiling are in for sure, and the band is settled
 * by mass_select. The ladder's integer masses are truncated, so they only steer: if its
 * estimate was off, the exact masses of the gathered tokens decide. */
static int nucleus(g4_sampler *s, const float *x, float m, float inv_t, double target, cand *c) {
    static const float first[LADDER] = {-0.5f, -1.0f, -2.0f, -4.0f, -8.0f, -16.0f, -32.0f, -64.0f};
    float lows[LADDER];
    memcpy(lows, first, sizeof lows);
    int64_t mass_q[LADDER], count[LADDER], count_hi = 0;
    const double target_q = target * LADDER_SCALE;
    float lo = -87.0f, hi = INFINITY; /* the cut lies among tokens with lo <= (x - m) / T < hi */
    for (int round = 0; round < 3; round++) {
        s->k->ladder(x, s->w, s->n_vocab, m, inv_t, lows, mass_q, count);
        int j = 0;
        while (j < LADDER && (double)mass_q[j] < target_q) j++;
        if (j == LADDER) { /* only with many tiny weights truncated away: take everything */
            lo = -87.0f;
            hi = lows[LADDER - 1];
            break;
        }
        lo = lows[j];
        if (j > 0) {
            hi = lows[j - 1];
            count_hi = count[j - 1];
        }
        if (count[j] - count_hi <= BAND_SMALL) break;
        const float top = hi == INFINITY ? 0.0f : hi;
        for (int k = 0; k < LADDER - 1; k++)
            lows[k] = top - (top - lo) * (float)(k + 1) / (float)LADDER;
        lows[LADDER - 1] = lo;
    }
    double mass;
    const int n = s->k->collect_by_logit(x, s->n_vocab, m, inv_t, lo, s->w, c, &mass);
    /* Tokens at or above hi first (deterministic, not stable, order). */
    int n_sure = 0;
    double sure = 0.0;
    for (int i = 0; i < n; i++)
        if ((c[i].v - m) * inv_t >= hi) {
            sure += c[i].w;
            cand_swap(&c[n_sure++], &c[i]);
        }
    if (sure >= target) return mass_select(c, n, target);
    return n_sure + mass_select(c + n_sure, n - n_sure, target - sure);
}

/* ---- The pipeline ------------------------------------------------------------------------ */

/* The whole vocabulary's weight after exp_pass, summed in block order. */
static double block_total(const g4_sampler *s) {
    double total = 0.0;
    for (int b = 0; b < (s->n_vocab + BLOCK - 1) / BLOCK; b++) total += s->block_sum[b];
    return total;
}

enum { PICK_GREEDY, PICK_FULL, PICK_CAND };

/* What the filters left: one token (greedy), every weight in s->w (full), or s->cand[0..n). */
typedef struct picked {
    int mode;
    int token;    /* PICK_GREEDY */
    int n;        /* PICK_CAND */
    double total; /* PICK_FULL, PICK_CAND: summed weight */
} picked;

static g4_status run_filters(g4_sampler *s, const float *logits, int n_vocab, picked *out,
                             g4_error *err) {
    if (!logits) return g4_fail(err, G4_ERR_ARG, "sampler: logits are NULL");
    if (n_vocab != s->n_vocab)
        return g4_fail(err, G4_ERR_ARG, "sampler: n_vocab %d differs from the sampler's %d",
                       n_vocab, s->n_vocab);
    const int n = n_vocab;
    const float *x = logits;
    if (penalties_on(s) && s->n_hist > 0) {
        memcpy(s->work, logits, (size_t)n * sizeof *s->work);
        penalize_history(s, logits, s->work);
        x = s->work;
    }
    int bad = 0;
    const float m = s->k->max_pass(x, n, &bad);
    if (bad) {
        for (int i = 0; i < n; i++)
            if (x[i] != x[i] || x[i] == INFINITY)
                return g4_fail(err, G4_ERR_ARG, "sampler: logit %d is %s", i,
                               x[i] != x[i] ? "NaN" : "+inf");
    }
    if (m == -INFINITY) return g4_fail(err, G4_ERR_ARG, "sampler: every logit is -inf");

    if (s->inv_t == 0.0f) {
        out->mode = PICK_GREEDY;
        out->token = s->k->first_equal(x, n, m);
        return G4_OK;
    }
    const float inv_t = s->inv_t, top_p = s->opt.top_p, min_p = s->opt.min_p;
    const int top_k = s->opt.top_k > 0 && s->opt.top_k < n ? s->opt.top_k : 0;
    cand *c = s->cand;

    if (top_k) {
        s->k->top_k_select(x, n, top_k, c);
        cand_weights(c, top_k, m, inv_t);
        int k = top_k;
        if (top_p < 1.0f) {
            double mass = 0.0;
            for (int i = 0; i < k; i++) mass += c[i].w;
            k = mass_select(c, k, (double)top_p * mass);
        }
        if (min_p > 0.0f) k = min_p_filter(c, k, min_p);
        out->n = k;
    } else if (top_p < 1.0f) {
        /* The nucleus target is a share of the whole vocabulary's mass, so every weight is
         * needed once; the pass that computes them also gathers the tokens near the top, which
         * usually hold the nucleus. Only when they do not is the ladder search needed. */
        const float min_p_lo = min_p > 0.0f ? logf(min_p) - 1e-3f : -INFINITY;
        if (min_p_lo >= TOP_P_GATHER) {
            /* min-p's set is all gathered. Both filters keep a best-ranked prefix, so the
             * result is the shorter: the nucleus within it if it holds enough mass, else all. */
            int k = s->k->exp_pass(x, n, m, inv_t, s->w, s->block_sum, min_p_lo, c, n);
            k = min_p_filter(c, k, min_p);
            const double target = (double)top_p * block_total(s);
            double mass = 0.0;
            for (int i = 0; i < k; i++) mass += c[i].w;
            out->n = mass >= target ? mass_select(c, k, target) : k;
        } else {
            int k = s->k->exp_pass(x, n, m, inv_t, s->w, s->block_sum, TOP_P_GATHER, c, TOP_P_CAP);
            const double target = (double)top_p * block_total(s);
            double mass = 0.0;
            for (int i = 0; i < k; i++) mass += c[i].w;
            if (k >= 0 && mass >= target)
                k = mass_select(c, prune_candidates(c, k, m, inv_t, target), target);
            else
                k = nucleus(s, x, m, inv_t, target, c);
            out->n = min_p > 0.0f ? min_p_filter(c, k, min_p) : k;
        }
    } else if (min_p > 0.0f) {
        /* Only tokens near the top can pass, so gather them by logit (with a little slack for
         * rounding in exp) and compute just their weights. */
        double unused;
        int k = s->k->collect_by_logit(x, n, m, inv_t, logf(min_p) - 1e-3f, NULL, c, &unused);
        cand_weights(c, k, m, inv_t);
        out->n = min_p_filter(c, k, min_p);
    } else {
        s->k->exp_pass(x, n, m, inv_t, s->w, s->block_sum, 0.0f, NULL, 0);
        out->mode = PICK_FULL;
        out->total = block_total(s);
        return G4_OK;
    }
    double total = 0.0;
    for (int i = 0; i < out->n; i++) total += c[i].w;
    out->mode = PICK_CAND;
    out->total = total;
    return G4_OK;
}

/* Inverse-CDF draw in the candidates' (deterministic) order. The top token always survives
 * with weight 1, so total > 0; a draw that rounding carries past the end takes the last
 * positive weight. */
static int draw_cand(const cand *c, int n, double total, double u) {
    const double r = u * total;
    double acc = 0.0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].w;
        if (c[i].w > 0.0f) last = i;
        if (r < acc) return c[i].idx;
    }
    return c[last].idx;
}

/* Inverse-CDF draw over the whole vocabulary: find the block, then the token inside it. */
static int draw_full(const g4_sampler *s, double total, double u) {
    const int n = s->n_vocab, n_blocks = (n + BLOCK - 1) / BLOCK;
    const double r = u * total;
    double acc = 0.0;
    int b = 0, last_b = 0;
    for (; b < n_blocks; b++) {
        if (s->block_sum[b] > 0.0f) last_b = b;
        if (r < acc + s->block_sum[b]) break;
        acc += s->block_sum[b];
    }
    if (b == n_blocks) b = last_b;
    const int start = b * BLOCK, end = start + BLOCK < n ? start + BLOCK : n;
    int last = start;
    for (int i = start; i < end; i++) {
        acc += s->w[i];
        if (s->w[i] > 0.0f) last = i;
        if (r < acc) return i;
    }
    return last;
}

g4_status g4_sampler_sample(g4_sampler *s, const float *logits, int n_vocab, int32_t *out_token,
                            g4_error *err) {
    if (!out_token) return g4_fail(err, G4_ERR_ARG, "sampler: out_token is NULL");
    picked p;
    g4_status st = run_filters(s, logits, n_vocab, &p, err);
    if (st != G4_OK) return st;
    switch (p.mode) {
    case PICK_GREEDY: *out_token = p.token; break;
    case PICK_FULL: *out_token = draw_full(s, p.total, rng_uniform(&s->rng)); break;
    default: *out_token = draw_cand(s->cand, p.n, p.total, rng_uniform(&s->rng)); break;
    }
    return G4_OK;
}

g4_status g4_sampler_probs(g4_sampler *s, const float *logits, int n_vocab, float *probs,
                           g4_error *err) {
    if (!probs) return g4_fail(err, G4_ERR_ARG, "sampler: probs is NULL");
    picked p;
    g4_status st = run_filters(s, logits, n_vocab, &p, err);
    if (st != G4_OK) return st;
    if (p.mode == PICK_FULL) {
        const double inv = 1.0 / p.total;
        for (int i = 0; i < n_vocab; i++) probs[i] = (float)(s->w[i] * inv);
        return G4_OK;
    }
    memset(probs, 0, (size_t)n_vocab * sizeof *probs);
    if (p.mode == PICK_GREEDY) {
        probs[p.token] = 1.0f;
    } else {
        const double inv = 1.0 / p.total;
        for (int i = 0; i < p.n; i++) probs[s->cand[i].idx] = (float)(s->cand[i].w * inv);
    }
    return G4_OK;
}
