/* The Gemma 4 forward pass: a named step per line of the model doc (docs/gemma4-model.md §3).
 * Differences between sizes come from the config (layer types, head dims, sharing, MoE, PLE). */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/act.h"
#include "util/error.h"
#include "util/mapped_file.h"

/* Attention work split (attention_range): keys in chunks of ATT_CHUNK absolute positions, query
 * heads of one KV head in sub-groups of at most ATT_SUB (att_pick_sub); per-thread scratch: the
 * sub-group's scores of a chunk, its running output and one chunk's output. */
enum { ATT_CHUNK = 256, ATT_SUB = 8, ATT_SUB_PROMPT = 4, ATT_SPLIT_M = 4 };
#define ATT_TINY 0x1p-40f
#define ATT_SCRATCH(dmax) ((size_t)ATT_SUB * ATT_CHUNK + 2 * (size_t)ATT_SUB * (size_t)(dmax))
static inline int att_sub(int group, int most) {
    int sub = group;
    while (sub > most) sub = (sub + 1) / 2;
    return sub;
}
/* work items of a layer's attention for M tokens: (token, KV head, query-head sub-group) */
static inline int att_items(const g4_layer_config *l, int n_heads, int M, int sub) {
    const int group = n_heads / l->n_kv_heads;
    return M * l->n_kv_heads * ((group + sub - 1) / sub);
}

/* ---- run state ------------------------------------------------------------------------------ */

static void *zalloc(size_t n, int *fail) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) *fail = 1;
    return p;
}

/* bytes per cached K or V element */
static inline size_t kv_es(const g4_state *s) { return s->kv_bf16 ? sizeof(uint16_t) : sizeof(float); }

/* bytes of one layer's K (or V) cache of cap rows, rounded up to a cache line */
static size_t cache_bytes(const g4_layer_config *l, int cap, size_t es) {
    return ((size_t)l->n_kv_heads * l->head_dim * (size_t)cap * es + 63) & ~(size_t)63;
}

g4_status g4_state_init(g4_state *s, const g4_model *m, int n_ctx, int max_batch, int n_threads, int kv_bf16,
                        g4_error *err) {
    memset(s, 0, sizeof *s);
    s->kv_bf16 = kv_bf16 != 0;
    const size_t es = kv_es(s);
    const g4_config *c = &m->cfg;
    int L = c->n_layers, H = c->hidden, B = max_batch, fail = 0;
    s->m = m;
    s->n_ctx = n_ctx;
    s->max_batch = B;
    s->n_threads = n_threads;
    s->n_dump_pos = 0;
    int maxd = 0, maxkv = 0, maxI = c->moe ? 2 * c->moe_width : 0;
    for (int i = 0; i < L; i++) {
        const g4_layer_config *l = &c->layers[i];
        if (l->head_dim > maxd) maxd = l->head_dim;
        if (l->n_kv_heads * l->head_dim > maxkv) maxkv = l->n_kv_heads * l->head_dim;
        if (l->mlp_width > maxI) maxI = l->mlp_width;
    }
    size_t nq = (size_t)c->n_heads * maxd, f = sizeof(float);
    s->k_cache = zalloc(sizeof(void *) * L, &fail);
    s->v_cache = zalloc(sizeof(void *) * L, &fail);
    s->k_stage = zalloc(sizeof(float *) * L, &fail);
    s->v_stage = zalloc(sizeof(float *) * L, &fail);
    s->k_stage16 = zalloc(sizeof(uint16_t *) * L, &fail);
    s->v_stage16 = zalloc(sizeof(uint16_t *) * L, &fail);
    s->cache_cap = zalloc(sizeof(int) * L, &fail);
    s->layer_rope = zalloc(sizeof(int) * L, &fail);
    if (fail) goto oom;
    for (int i = 0; i < L; i++) {
        const g4_layer_config *l = &c->layers[i];
        /* RoPE kinds: a handful of (d, R, theta) triples shared by many layers */
        int r = 0;
        while (r < s->n_rope && !(s->rope[r].head_dim == l->head_dim && s->rope[r].pairs == l->rope_pairs &&
                                   s->rope[r].theta == l->rope_theta))
            r++;
        if (r == s->n_rope) {
            if (r == 8) {
                g4_state_free(s);
                return g4_fail(err, G4_ERR_UNSUPPORTED, "more than 8 distinct RoPE configurations");
            }
            s->rope[r] = (g4_rope_kind){l->head_dim, l->rope_pairs, l->rope_theta};
            s->n_rope++;
        }
        s->layer_rope[i] = r;
        if (l->head_dim / 2 > s->max_half) s->max_half = l->head_dim / 2;
        if (l->kv_source != i) continue;
        size_t row = (size_t)l->n_kv_heads * l->head_dim;
        int cap = l->is_full ? n_ctx : (c->sliding_window < n_ctx ? c->sliding_window : n_ctx);
        s->cache_cap[i] = cap;
        s->kv_mem_len += 2 * cache_bytes(l, cap, es);
        s->k_stage[i] = zalloc(row * B * f, &fail);
        s->v_stage[i] = zalloc(row * B * f, &fail);
        if (s->kv_bf16) {
            s->k_stage16[i] = zalloc(row * B * sizeof(uint16_t), &fail);
            s->v_stage16[i] = zalloc(row * B * sizeof(uint16_t), &fail);
        }
    }
    /* the caches in one huge-page mapping (g4_map_anon_huge): decode streams every visible K and
     * V row per token (2-core Zen 5 machine, E2B Q4_0 decode at context 4096, alternating runs:
     * attention 9.8 / 12.5 -> 8.9 / 8.2 ms per token against a calloc per layer) */
    if (!fail && s->kv_mem_len) {
        uint8_t *at = s->kv_mem = g4_map_anon_huge(s->kv_mem_len);
        if (!at) fail = 1;
        for (int i = 0; at && i < L; i++) {
            if (c->layers[i].kv_source != i) continue;
            const size_t bytes = cache_bytes(&c->layers[i], s->cache_cap[i], es);
            s->k_cache[i] = at;
            s->v_cache[i] = at + bytes;
            at += 2 * bytes;
        }
    }
    int P = c->ple_width;
    s->x = zalloc((size_t)B * H * f, &fail);
    s->a = zalloc((size_t)B * H * f, &fail);
    s->t = zalloc((size_t)B * H * f, &fail);
    s->ffn = zalloc((size_t)B * H * f, &fail);
    s->q = zalloc((size_t)B * nq * f, &fail);
    s->att = zalloc((size_t)B * nq * f, &fail);
    s->kv = zalloc((size_t)B * maxkv * f, &fail);
    s->gate = zalloc((size_t)B * maxI * f, &fail);
    s->up = zalloc((size_t)B * maxI * f, &fail);
    { /* QAT input activation fake-quantisation: one copy of the widest matmul input */
        int in = H > (int)nq ? H : (int)nq;
        if (maxI > in) in = maxI;
        if (c->ple_width > in) in = c->ple_width;
        s->act_q = zalloc((size_t)B * in * f, &fail);
    }
    s->scores = zalloc((size_t)n_threads * ATT_SCRATCH(2 * s->max_half) * f, &fail);
    s->att_max_chunks = n_ctx / ATT_CHUNK + 1;
    s->att_part = zalloc((size_t)(B < ATT_SPLIT_M ? B : ATT_SPLIT_M) * c->n_heads * s->att_max_chunks *
                             (2 * (size_t)s->max_half + 2) * f, &fail);
    s->rope_cs = zalloc((size_t)B * s->n_rope * 2 * s->max_half * f, &fail);
    if (P) {
        s->ple = zalloc((size_t)B * L * P * f, &fail);
        s->ple_tmp = zalloc((size_t)B * (L * P > H ? L * P : H) * f, &fail);
    }
    if (c->moe) {
        int E = c->n_experts, K = c->top_k_experts;
        s->router_p = zalloc((size_t)B * E * f, &fail);
        s->top_e = zalloc((size_t)B * K * sizeof(int), &fail);
        s->top_w = zalloc((size_t)B * K * f, &fail);
        s->x2 = zalloc((size_t)B * H * f, &fail);
        s->ex_in = zalloc((size_t)B * H * f, &fail);
        s->ex_gu = zalloc((size_t)(B > K ? B : K) * 2 * c->moe_width * f, &fail);
        s->ex_out = zalloc((size_t)B * H * f, &fail);
        s->ex_res = zalloc((size_t)B * K * H * f, &fail);
        s->ex_tok = zalloc((size_t)B * K * sizeof(int), &fail);
    }
    if (fail) goto oom;
    return G4_OK;
oom:
    g4_state_free(s);
    return g4_fail(err, G4_ERR_NOMEM, "out of memory allocating the KV cache and scratch for %d tokens",
                   n_ctx);
}

void g4_state_free(g4_state *s) {
    if (s->m && s->k_cache)
        for (int i = 0; i < s->m->cfg.n_layers; i++) {
            free(s->k_stage[i]);
            free(s->v_stage[i]);
            if (s->k_stage16) free(s->k_stage16[i]);
            if (s->v_stage16) free(s->v_stage16[i]);
        }
    g4_unmap_anon(s->kv_mem, s->kv_mem_len);
    free(s->k_cache); free(s->v_cache); free(s->k_stage); free(s->v_stage); free(s->k_stage16); free(s->v_stage16);
    free(s->cache_cap); free(s->layer_rope);
    free(s->x); free(s->a); free(s->t); free(s->ffn); free(s->q); free(s->att); free(s->kv);
    free(s->act_q);
    free(s->gate); free(s->up); free(s->scores); free(s->att_part); free(s->rope_cs); free(s->ple); free(s->ple_tmp);
    free(s->router_p); free(s->top_e); free(s->top_w); free(s->x2); free(s->ex_in); free(s->ex_gu);
    free(s->ex_out); free(s->ex_res); free(s->ex_tok);
    free(s->dump_pos);
    memset(s, 0, sizeof *s);
}

void g4_state_commit(g4_state *s, int n) {
    const g4_config *c = &s->m->cfg;
    if (n > s->n_staged) n = s->n_staged;
    for (int i = 0; i < c->n_layers; i++) {
        if (!s->k_cache[i]) continue;
        const size_t rb = (size_t)c->layers[i].n_kv_heads * c->layers[i].head_dim * kv_es(s);
        const uint8_t *ks = s->kv_bf16 ? (const uint8_t *)s->k_stage16[i] : (const uint8_t *)s->k_stage[i];
        const uint8_t *vs = s->kv_bf16 ? (const uint8_t *)s->v_stage16[i] : (const uint8_t *)s->v_stage[i];
        for (int r = 0; r < n; r++) {
            size_t slot = (size_t)((s->stage_pos + r) % s->cache_cap[i]);
            memcpy((uint8_t *)s->k_cache[i] + slot * rb, ks + (size_t)r * rb, rb);
            memcpy((uint8_t *)s->v_cache[i] + slot * rb, vs + (size_t)r * rb, rb);
        }
    }
    s->pos = s->stage_pos + n;
    s->n_staged = 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static void dump(const g4_state *s, const char *name, int layer, int m, const float *data, int n) {
    if (!s->dump) return;
    int pos = s->stage_pos + m;
    int hit = s->n_dump_pos < 0;
    for (int i = 0; i < s->n_dump_pos && !hit; i++) hit = s->dump_pos[i] == pos;
    if (hit) s->dump(s->dump_user, name, layer, pos, data, n);
}

static void dump_rows(const g4_state *s, const char *name, int layer, int M, const float *data, int n,
                      int ld) {
    if (!s->dump) return;
    for (int m = 0; m < M; m++) dump(s, name, layer, m, data + (size_t)m * ld, n);
}

/* K (v = 0) or V (v = 1) row of absolute position j for layer `src`, as attention reads it (floats,
 * or bf16 with kv_bf16): staged rows first, else the cache. */
static inline const void *kv_row(const g4_state *s, int v, int src, int j, size_t row) {
    const size_t rb = row * kv_es(s);
    if (j >= s->stage_pos) {
        const void *st = s->kv_bf16 ? (const void *)(v ? s->v_stage16 : s->k_stage16)[src]
                                    : (const void *)(v ? s->v_stage : s->k_stage)[src];
        return (const uint8_t *)st + (size_t)(j - s->stage_pos) * rb;
    }
    return (const uint8_t *)(v ? s->v_cache : s->k_cache)[src] + (size_t)(j % s->cache_cap[src]) * rb;
}

typedef struct {
    g4_state *s;
    int layer, src, M;
    g4_isa isa;
    int sub; /* query heads per item (att_pick_sub) */
} attn_job;

/* How many positions from k (at most up to p) lie in one contiguous run of rows: cached ones up
 * to the ring's wrap or the staged block, staged ones to the end. */
static inline int kv_run(const g4_state *s, int src, int k, int p) {
    if (k >= s->stage_pos) return p + 1 - k;
    int cap = s->cache_cap[src], slot = k % cap, end = s->stage_pos - 1 < p ? s->stage_pos - 1 : p;
    return end - k + 1 < cap - slot ? end - k + 1 : cap - slot;
}


/* One chunk of keys [kb, ke] (inside the chunk at c0) for query heads h0 .. h0+nh-1 of token m
 * (KV head g): the heads' scores as one small product (the chunk's K rows read once for all of
 * them), then per head a softmax within the chunk and the weighted sum of V into out[hh] (stride
 * ostride floats), with the chunk's max and sum in mx[hh], sum[hh]. Every (token, head) gets the
 * same operations for a chunk wherever this runs. */
static void att_chunk(const attn_job *j, float *sc, int m, int g, int h0, int nh, int kb, int ke, float *out,
                      size_t ostride, float *mx, float *sum) {
    g4_state *s = j->s;
    const g4_config *c = &s->m->cfg;
    const g4_layer_config *l = &c->layers[j->layer];
    const int d = l->head_dim, p = s->stage_pos + m, n = ke - kb + 1;
    const size_t row = (size_t)l->n_kv_heads * d, off = (size_t)g * d;
    const float *q0 = s->q + (size_t)m * c->n_heads * d + (size_t)h0 * d;
    /* scores over runs of keys contiguous in memory (cache ring up to its wrap, then the staged
     * rows): sc[h][k - kb] = q_h · K_k, the same 16-lane dot per key as g4_dot_f32 */
    for (int k = kb; k <= ke;) {
        int run = kv_run(s, j->src, k, p);
        if (run > ke - k + 1) run = ke - k + 1;
        g4_mat km = g4_mat_dense(s->kv_bf16 ? G4_DT_BF16 : G4_DT_F32, run, d, (const uint8_t *)kv_row(s, 0, j->src, k, row) + off * kv_es(s));
        km.row_bytes = row * kv_es(s);
        g4_matmul_isa(j->isa, NULL, &km, q0, nh, sc + (k - kb), ATT_CHUNK);
        k += run;
    }
    for (int hh = 0; hh < nh; hh++) {
        float *sh = sc + (size_t)hh * ATT_CHUNK;
        float mxh = -INFINITY;
        for (int k = 0; k < n; k++) mxh = sh[k] > mxh ? sh[k] : mxh;
        sum[hh] = g4_exp_sum_isa(j->isa, sh, mxh, sh, n);
        mx[hh] = mxh;
        /* weights below 2^-40 of the chunk's largest (exactly 1) are invisible in a float sum, but
         * their products with V would be subnormal, which costs the CPU a microcode assist per
         * operation (measured: attention 52 -> 12 ms per E2B token at context 4096): they become 0 */
        for (int k = 0; k < n; k++) sh[k] = sh[k] < ATT_TINY ? 0.0f : sh[k];
        memset(out + (size_t)hh * ostride, 0, sizeof(float) * d);
    }
    for (int k = kb; k <= ke;) { /* the weighted sums of V over the same runs, all heads per V row */
        int run = kv_run(s, j->src, k, p);
        if (run > ke - k + 1) run = ke - k + 1;
        if (s->kv_bf16)
            g4_avsum_heads_bf16_isa(j->isa, out, ostride, sc + (k - kb), ATT_CHUNK, nh,
                                    (const uint16_t *)kv_row(s, 1, j->src, k, row) + off, row, run, d);
        else
            g4_avsum_heads_isa(j->isa, out, ostride, sc + (k - kb), ATT_CHUNK, nh,
                               (const float *)kv_row(s, 1, j->src, k, row) + off, row, run, d);
        k += run;
    }
}

/* The running merge of a head's chunk partials, in chunk order: (mx_run, sum_run, a) absorbs the
 * chunk (mx, sum, o). */
static void att_merge(float *a, float *mx_run, float *sum_run, const float *o, float mx, float sum, int d) {
    const float mn = *mx_run > mx ? *mx_run : mx;
    float ea = g4_exp(*mx_run - mn), eb = g4_exp(mx - mn);
    ea = ea < ATT_TINY ? 0.0f : ea; /* likewise: no subnormal products in the merge */
    eb = eb < ATT_TINY ? 0.0f : eb;
    for (int i = 0; i < d; i++) a[i] = a[i] * ea + o[i] * eb;
    *sum_run = *sum_run * ea + sum * eb;
    *mx_run = mn;
}

/* The visible keys of token m: [lo, p], in chunks at absolute multiples of ATT_CHUNK from `first`. */
static inline void att_keys(const g4_state *s, const g4_layer_config *l, int m, int *lo, int *first, int *nch) {
    const int p = s->stage_pos + m, w = s->m->cfg.sliding_window;
    *lo = l->is_full ? 0 : (p - w + 1 > 0 ? p - w + 1 : 0);
    *first = *lo / ATT_CHUNK * ATT_CHUNK;
    *nch = p / ATT_CHUNK - *first / ATT_CHUNK + 1;
}

/* Attention, one item per (token, KV head, sub-group of at most ATT_SUB of its query heads): the
 * visible keys chunk by chunk in ascending order (att_chunk), each chunk merged into a running
 * (max, sum, output) as it comes (att_merge), then out = acc / sum. The chunking depends on the
 * position only, never on M or the thread count, so every (token, head) sees the same operations
 * (exactness contract). Scale 1.0 (q and k are RMS-normed). */
static void attention_range(void *ctx, int i0, int i1, int tid) {
    const attn_job *j = ctx;
    g4_state *s = j->s;
    const g4_config *c = &s->m->cfg;
    const g4_layer_config *l = &c->layers[j->layer];
    const int nH = c->n_heads, d = l->head_dim, nkv = l->n_kv_heads, group = nH / nkv;
    const int sub = j->sub, nsub = (group + sub - 1) / sub, dmax = 2 * s->max_half;
    const size_t nq = (size_t)nH * d;
    float *sc = s->scores + (size_t)tid * ATT_SCRATCH(dmax); /* [ATT_SUB][ATT_CHUNK] */
    float *acc = sc + ATT_SUB * ATT_CHUNK, *co = acc + (size_t)ATT_SUB * dmax; /* [ATT_SUB][dmax] each */
    for (int it = i0; it < i1; it++) {
        const int m = it / (nkv * nsub), g = it / nsub % nkv, h0 = g * group + it % nsub * sub;
        const int nh = group - it % nsub * sub < sub ? group - it % nsub * sub : sub, p = s->stage_pos + m;
        int lo, first, nch;
        att_keys(s, l, m, &lo, &first, &nch);
        float mx_run[ATT_SUB], sum_run[ATT_SUB], mx[ATT_SUB], sum[ATT_SUB];
        for (int c0 = first; c0 <= p; c0 += ATT_CHUNK) {
            const int kb = lo > c0 ? lo : c0, ke = p < c0 + ATT_CHUNK - 1 ? p : c0 + ATT_CHUNK - 1;
            const int head = c0 == first; /* the first chunk starts the running merge */
            att_chunk(j, sc, m, g, h0, nh, kb, ke, head ? acc : co, (size_t)dmax, head ? mx_run : mx, head ? sum_run : sum);
            if (!head)
                for (int hh = 0; hh < nh; hh++)
                    att_merge(acc + (size_t)hh * dmax, &mx_run[hh], &sum_run[hh], co + (size_t)hh * dmax, mx[hh], sum[hh], d);
        }
        for (int hh = 0; hh < nh; hh++) {
            float *out = s->att + (size_t)m * nq + (size_t)(h0 + hh) * d;
            const float *a = acc + (size_t)hh * dmax;
            for (int i = 0; i < d; i++) out[i] = a[i] / sum_run[hh];
        }
    }
}

/* Blocks of at most ATT_SPLIT_M tokens (decode, verify) have too few items above to keep the
 * threads busy at long contexts, and each item streams all its keys alone: there one item per
 * (token, KV head, chunk, sub-group of query heads) writes the chunk partials att_part[m][h][chunk]
 * = (max, sum, output) (a chunk's sub-groups are adjacent items, so the thread that claims both
 * reads its K/V rows from DRAM once); attention_merge_range then merges each head's partials in
 * chunk order. The same att_chunk and att_merge operations in the same order as
 * attention_range, so the same bits. */
static inline float *att_part_at(const g4_state *s, int m, int h, int ci) {
    return s->att_part + (((size_t)m * s->m->cfg.n_heads + (size_t)h) * (size_t)s->att_max_chunks + (size_t)ci) *
                             (2 * (size_t)s->max_half + 2);
}

static int att_split_items(const g4_state *s, const g4_layer_config *l, int M, int sub) {
    const int group = s->m->cfg.n_heads / l->n_kv_heads, nsub = (group + sub - 1) / sub;
    int items = 0, lo, first, nch;
    for (int m = 0; m < M; m++) {
        att_keys(s, l, m, &lo, &first, &nch);
        items += l->n_kv_heads * nch * nsub;
    }
    return items;
}

static void attention_split_range(void *ctx, int i0, int i1, int tid) {
    const attn_job *j = ctx;
    g4_state *s = j->s;
    const g4_config *c = &s->m->cfg;
    const g4_layer_config *l = &c->layers[j->layer];
    const int nkv = l->n_kv_heads, group = c->n_heads / nkv, sub = j->sub, nsub = (group + sub - 1) / sub;
    const int dmax = 2 * s->max_half;
    const size_t ostride = (size_t)s->att_max_chunks * ((size_t)dmax + 2); /* from head h to h + 1 */
    float *sc = s->scores + (size_t)tid * ATT_SCRATCH(dmax);
    for (int it = i0; it < i1; it++) {
        int m = 0, rest = it, lo = 0, first = 0, nch = 0;
        for (;; m++) { /* item -> (token, KV head, chunk, sub-group) */
            att_keys(s, l, m, &lo, &first, &nch);
            if (rest < nkv * nch * nsub) break;
            rest -= nkv * nch * nsub;
        }
        const int g = rest / (nch * nsub), ci = rest / nsub % nch, h0 = g * group + rest % nsub * sub;
        const int nh = (g + 1) * group - h0 < sub ? (g + 1) * group - h0 : sub;
        const int c0 = first + ci * ATT_CHUNK, p = s->stage_pos + m;
        const int kb = lo > c0 ? lo : c0, ke = p < c0 + ATT_CHUNK - 1 ? p : c0 + ATT_CHUNK - 1;
        float mx[ATT_SUB], sum[ATT_SUB], *part = att_part_at(s, m, h0, ci);
        att_chunk(j, sc, m, g, h0, nh, kb, ke, part + 2, ostride, mx, sum);
        for (int hh = 0; hh < nh; hh++) {
            part[hh * ostride] = mx[hh];
            part[hh * ostride + 1] = sum[hh];
        }
    }
}

/* Query heads per attention item. Decode and verify blocks (the chunk-split path): the whole
 * group where that leaves at least two items per thread (a chunk's K rows are then read once, the
 * scores being one product of up to ATT_SUB rows: E2B's 8 heads at 4096 keys, 7 full layers, one
 * thread: 3.4 -> 2.5 ms of scores; E2B Q4_0 decode at context 1024: attention 3.8 -> 3.1 ms per
 * token), else halves down to 4 so short contexts still spread over the threads. Prompts keep
 * sub-groups of at most 4: there 8 measured 6% slower (E2B Q4_0 prefill at context 4096, 99 ->
 * 93 tok/s, three alternating runs). Which heads share an item changes no operation on any value
 * (the products are M-invariant, the V sums per head the same), so this depends on the thread
 * count freely. */
static int att_pick_sub(const g4_state *s, const g4_layer_config *l, int M, int threads) {
    const int group = s->m->cfg.n_heads / l->n_kv_heads;
    if (M > ATT_SPLIT_M) return att_sub(group, ATT_SUB_PROMPT);
    int sub = att_sub(group, ATT_SUB);
    while (sub > ATT_SUB_PROMPT && att_split_items(s, l, M, sub) < 2 * threads) sub = (sub + 1) / 2;
    return sub;
}

static void attention_merge_range(void *ctx, int i0, int i1, int tid) {
    (void)tid;
    const attn_job *j = ctx;
    g4_state *s = j->s;
    const g4_config *c = &s->m->cfg;
    const g4_layer_config *l = &c->layers[j->layer];
    const int nH = c->n_heads, d = l->head_dim;
    for (int it = i0; it < i1; it++) {
        const int m = it / nH, h = it % nH;
        int lo, first, nch;
        att_keys(s, l, m, &lo, &first, &nch);
        const float *p0 = att_part_at(s, m, h, 0);
        float *a = s->att + ((size_t)m * nH + (size_t)h) * d, mx_run = p0[0], sum_run = p0[1];
        memcpy(a, p0 + 2, sizeof(float) * (size_t)d);
        for (int ci = 1; ci < nch; ci++) {
            const float *pc = att_part_at(s, m, h, ci);
            att_merge(a, &mx_run, &sum_run, pc + 2, pc[0], pc[1], d);
        }
        for (int i = 0; i < d; i++) a[i] = a[i] / sum_run;
    }
}

/* Profiling: the time since the last mark goes to class `cls`. */
static inline void prof_mark(g4_state *s, int cls) {
    if (!s->profile) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    if (cls >= 0) s->prof[cls] += t - s->prof_t;
    s->prof_t = t;
}

static void rope_apply(const g4_state *s, float *x, int m, int kind) {
    const g4_rope_kind *r = &s->rope[kind];
    const float *cs = s->rope_cs + ((size_t)m * s->n_rope + kind) * 2 * s->max_half;
    const float *cosv = cs, *sinv = cs + s->max_half;
    int half = r->head_dim / 2;
    for (int i = 0; i < r->pairs; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cosv[i] - b * sinv[i];
        x[i + half] = b * cosv[i] + a * sinv[i];
    }
}

/* g4_matmul plus the fake-quantisation a QAT matrix asks for around it (g4_mat.in_act_scale on its
 * input, out_act_scale on its output; 0 means none). */
static void matmul_q(g4_state *s, g4_threadpool *pool, const g4_mat *w, const float *x, int M, float *y, int ldy) {
    if (w->in_act_scale != 0) {
        g4_fake_quant(s->act_q, x, (size_t)M * (size_t)w->cols, w->in_act_scale);
        x = s->act_q;
    }
    prof_mark(s, G4_PROF_OTHER);
    g4_matmul(pool, w, x, M, y, ldy);
    prof_mark(s, G4_PROF_MATMUL);
    if (w->out_act_scale != 0)
        for (int m = 0; m < M; m++) g4_fake_quant(y + (size_t)m * ldy, y + (size_t)m * ldy, (size_t)w->rows, w->out_act_scale);
}

/* gelu_tanh(gate) ⊙ up, in place into gate */
static void gelu_mul(g4_state *s, float *gate, const float *up, size_t n) {
    prof_mark(s, G4_PROF_OTHER);
    g4_gelu_mul(gate, up, n);
    prof_mark(s, G4_PROF_ACT);
}

static int plain_mat(const g4_mat *w) { return w->in_act_scale == 0 && w->out_act_scale == 0; }

typedef struct {
    float *gate;
    const float *up;
    int M, I;
} gelu_epi_ctx;

/* gelu(gate) ⊙ up on rows [r0, r1) of every token, right after a work item computed them */
static void gelu_epi(void *ctx, int pair, int r0, int r1) {
    const gelu_epi_ctx *e = (const gelu_epi_ctx *)ctx + pair;
    for (int m = 0; m < e->M; m++) g4_gelu_mul(e->gate + (size_t)m * e->I + r0, e->up + (size_t)m * e->I + r0, (size_t)(r1 - r0));
}

/* Dense MLP of width I over rows of `in` (already normed) into out [M][H]. */
static void mlp(g4_state *s, g4_threadpool *pool, const g4_mat *gate, const g4_mat *up, const g4_mat *down,
                const float *in, int M, float *out) {
    int I = gate->rows, H = s->m->cfg.hidden;
    if (plain_mat(gate) && plain_mat(up)) { /* one pass: gate and up rows together, GELU fused */
        g4_mm_part parts[2] = {{gate, s->gate, I, NULL}, {up, s->up, I, NULL}};
        gelu_epi_ctx e = {s->gate, s->up, M, I};
        prof_mark(s, G4_PROF_OTHER);
        g4_matmul_multi(pool, parts, 2, in, M, gelu_epi, &e);
        prof_mark(s, G4_PROF_MATMUL);
    } else {
        matmul_q(s, pool, gate, in, M, s->gate, I);
        matmul_q(s, pool, up, in, M, s->up, I);
        gelu_mul(s, s->gate, s->up, (size_t)M * I);
    }
    matmul_q(s, pool, down, s->gate, M, out, H);
}

/* The MoE block's expert half: route each token to its top-k experts, run each expert once over
 * all tokens routed to it, and sum per token in rank order (so a token's result does not depend
 * on which other tokens share the block). Writes the un-normed expert sum into out [M][H]. */
static void moe_experts(g4_state *s, g4_threadpool *pool, const g4_layer_weights *w, const float *r, int M,
                        float *out) {
    const g4_config *c = &s->m->cfg;
    int H = c->hidden, E = c->n_experts, K = c->top_k_experts, Im = c->moe_width;
    /* router: z = rms(r) · H^-½ · scale; p = softmax(z · projᵀ) */
    float hs = 1.0f / sqrtf((float)H);
    for (int m = 0; m < M; m++) {
        float *z = s->a + (size_t)m * H;
        g4_rmsnorm(z, r + (size_t)m * H, NULL, H, c->rms_eps);
        for (int i = 0; i < H; i++) z[i] = z[i] * hs * w->router_scale[i];
    }
    matmul_q(s, pool, &w->router, s->a, M, s->router_p, E);
    for (int m = 0; m < M; m++) {
        float *p = s->router_p + (size_t)m * E, mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (int e = 0; e < E; e++) p[e] /= sum;
        int *top = s->top_e + (size_t)m * K;
        float *tw = s->top_w + (size_t)m * K, tsum = 0;
        for (int k = 0; k < K; k++) { /* selection: largest first, lower index on ties */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < k && !taken; q++) taken = top[q] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            top[k] = best;
            tsum += p[best];
        }
        for (int k = 0; k < K; k++) tw[k] = p[top[k]] / tsum * w->expert_scale[top[k]];
    }
    for (int m = 0; m < M; m++)
        g4_rmsnorm(s->x2 + (size_t)m * H, r + (size_t)m * H, w->pre_ffn_norm2, H, c->rms_eps);
    if (M == 1 && K <= G4_MM_MAX_PARTS / 2 && plain_mat(&w->experts_gate_up) && plain_mat(&w->experts_down)) {
        /* one token: every chosen expert's gate/up rows in one pass (GELU fused), then every
         * down projection in another, instead of two passes per expert */
        g4_mat gv[G4_MM_MAX_PARTS / 2], uv[G4_MM_MAX_PARTS / 2], dv[G4_MM_MAX_PARTS / 2];
        g4_mm_part parts[G4_MM_MAX_PARTS];
        gelu_epi_ctx ec[G4_MM_MAX_PARTS / 2];
        for (int k = 0; k < K; k++) {
            int e = s->top_e[k];
            float *g = s->ex_gu + (size_t)k * 2 * Im;
            gv[k] = g4_mat_rows(&w->experts_gate_up, e * 2 * Im, Im);
            uv[k] = g4_mat_rows(&w->experts_gate_up, e * 2 * Im + Im, Im);
            dv[k] = g4_mat_rows(&w->experts_down, e * H, H);
            parts[2 * k] = (g4_mm_part){&gv[k], g, Im, NULL};
            parts[2 * k + 1] = (g4_mm_part){&uv[k], g + Im, Im, NULL};
            ec[k] = (gelu_epi_ctx){g, g + Im, 1, Im};
        }
        prof_mark(s, G4_PROF_OTHER);
        g4_matmul_multi(pool, parts, 2 * K, s->x2, 1, gelu_epi, ec);
        for (int k = 0; k < K; k++) parts[k] = (g4_mm_part){&dv[k], s->ex_res + (size_t)k * H, H, s->ex_gu + (size_t)k * 2 * Im};
        g4_matmul_multi(pool, parts, K, NULL, 1, NULL, NULL);
        prof_mark(s, G4_PROF_MATMUL);
    } else { /* each expert once over the tokens routed to it */
        for (int e = 0; e < E; e++) {
            int n = 0;
            for (int t = 0; t < M * K; t++)
                if (s->top_e[t] == e) s->ex_tok[n++] = t;
            if (!n) continue;
            for (int i = 0; i < n; i++)
                memcpy(s->ex_in + (size_t)i * H, s->x2 + (size_t)(s->ex_tok[i] / K) * H, sizeof(float) * H);
            g4_mat gu = g4_mat_rows(&w->experts_gate_up, e * 2 * Im, 2 * Im);
            g4_mat dn = g4_mat_rows(&w->experts_down, e * H, H);
            matmul_q(s, pool, &gu, s->ex_in, n, s->ex_gu, 2 * Im);
            for (int i = 0; i < n; i++) {
                float *g = s->ex_gu + (size_t)i * 2 * Im;
                gelu_mul(s, g, g + Im, (size_t)Im);
                if (i) memmove(s->ex_gu + (size_t)i * Im, g, sizeof(float) * Im); /* pack to [n][Im] */
            }
            matmul_q(s, pool, &dn, s->ex_gu, n, s->ex_out, H);
            for (int i = 0; i < n; i++)
                memcpy(s->ex_res + (size_t)s->ex_tok[i] * H, s->ex_out + (size_t)i * H, sizeof(float) * H);
        }
    }
    for (int m = 0; m < M; m++) {
        float *o = out + (size_t)m * H;
        memset(o, 0, sizeof(float) * H);
        for (int k = 0; k < K; k++) {
            const float *res = s->ex_res + ((size_t)m * K + k) * H;
            float wk = s->top_w[(size_t)m * K + k];
            for (int i = 0; i < H; i++) o[i] += wk * res[i];
        }
    }
}

typedef struct {
    float *logits;
    int n;
    float cap;
} softcap_job;

static void softcap_range(void *ctx, int i0, int i1, int tid) {
    (void)tid;
    const softcap_job *j = ctx;
    g4_softcap(j->logits + i0, (size_t)(i1 - i0), j->cap);
}

/* ---- the forward ---------------------------------------------------------------------------- */

/* ---- per-token steps of a block ---------------------------------------------------------------
 * The norms, RoPE, residual adds and PLE set-up between the matmuls touch each token's rows only,
 * so a block's tokens are spread over the threads; every token's arithmetic is the one-token
 * arithmetic (exactness contract). One token runs inline. */
enum { TOK_EMBED, TOK_PLE, TOK_ATTN_IN, TOK_HEADS, TOK_ATTN_OUT, TOK_MOE_SUM, TOK_FFN_OUT, TOK_PLE_GATE, TOK_PLE_OUT, TOK_FINAL };

typedef struct {
    g4_state *s;
    const int32_t *tokens;
    int phase, li;
} tok_job;

static void tok_range(void *ctx, int m0, int m1, int tid) {
    (void)tid;
    const tok_job *j = ctx;
    g4_state *s = j->s;
    const g4_model *md = s->m;
    const g4_config *c = &md->cfg;
    const int H = c->hidden, L = c->n_layers, nH = c->n_heads, P = c->ple_width, LP = L * P;
    const g4_layer_config *lc = j->li >= 0 ? &c->layers[j->li] : NULL;
    const g4_layer_weights *w = j->li >= 0 ? &md->layers[j->li] : NULL;
    for (int m = m0; m < m1; m++) {
        float *xm = s->x + (size_t)m * H, *am = s->a + (size_t)m * H, *tm = s->t + (size_t)m * H;
        switch (j->phase) {
        case TOK_EMBED: { /* RoPE angles (inv_freq[i] = theta^(-2i/d) over the full d); x0 = E[token]·s */
            for (int r = 0; r < s->n_rope; r++) {
                float *cs = s->rope_cs + ((size_t)m * s->n_rope + r) * 2 * s->max_half;
                for (int i = 0; i < s->rope[r].pairs; i++) {
                    double ang = (double)(s->stage_pos + m) * pow((double)s->rope[r].theta, -2.0 * i / s->rope[r].head_dim);
                    cs[i] = (float)cos(ang);
                    cs[s->max_half + i] = (float)sin(ang);
                }
            }
            g4_mat_row_f32(&md->embed, j->tokens[m], xm);
            for (int i = 0; i < H; i++) xm[i] *= md->embed_scale;
            break;
        }
        case TOK_PLE: { /* ple[l] = (rms_w(norm)(proj[l] · H^-½) + E_ple[token][l] · √P) · 2^-½ */
            float hs = 1.0f / sqrtf((float)H), r2 = 1.0f / sqrtf(2.0f);
            float *pm = s->ple + (size_t)m * LP, *tok = s->ple_tmp + (size_t)m * LP;
            g4_mat_row_f32(&md->ple_embed, j->tokens[m], tok);
            for (int l = 0; l < L; l++) {
                float *pl = pm + (size_t)l * P;
                for (int i = 0; i < P; i++) pl[i] *= hs;
                g4_rmsnorm(pl, pl, md->ple_proj_norm, P, c->rms_eps);
                for (int i = 0; i < P; i++) pl[i] = (pl[i] + tok[l * P + i] * md->ple_embed_scale) * r2;
            }
            break;
        }
        case TOK_ATTN_IN: g4_rmsnorm(am, xm, w->attn_norm, H, c->rms_eps); break;
        case TOK_HEADS: { /* q_norm + RoPE; for layers with their own KV: k_norm + RoPE, v_norm */
            const int d = lc->head_dim, nq = nH * d, nkv = lc->n_kv_heads * d, rk = s->layer_rope[j->li];
            for (int h = 0; h < nH; h++) {
                float *qh = s->q + (size_t)m * nq + (size_t)h * d;
                g4_rmsnorm(qh, qh, w->q_norm, d, c->rms_eps);
                rope_apply(s, qh, m, rk);
            }
            if (lc->kv_source != j->li) break;
            float *ks = s->k_stage[j->li] + (size_t)m * nkv, *vs = s->v_stage[j->li] + (size_t)m * nkv;
            if (lc->k_eq_v) memcpy(vs, ks, sizeof(float) * (size_t)nkv); /* raw k, before k_norm/rope */
            for (int h = 0; h < lc->n_kv_heads; h++) {
                float *kh = ks + (size_t)h * d, *vh = vs + (size_t)h * d;
                g4_rmsnorm(kh, kh, w->k_norm, d, c->rms_eps);
                rope_apply(s, kh, m, rk);
                g4_rmsnorm(vh, vh, NULL, d, c->rms_eps);
            }
            if (s->kv_bf16) { /* the rows as the cache keeps them */
                uint16_t *kb = s->k_stage16[j->li] + (size_t)m * nkv, *vb = s->v_stage16[j->li] + (size_t)m * nkv;
                for (int i = 0; i < nkv; i++) {
                    kb[i] = g4_f32_to_bf16(ks[i]);
                    vb[i] = g4_f32_to_bf16(vs[i]);
                }
            }
            break;
        }
        case TOK_ATTN_OUT: /* x += rms_w(post_attn)(t); a = rms_w(pre_ffn)(x) */
            g4_rmsnorm(tm, tm, w->post_attn_norm, H, c->rms_eps);
            for (int i = 0; i < H; i++) xm[i] += tm[i];
            g4_rmsnorm(am, xm, w->pre_ffn_norm, H, c->rms_eps);
            break;
        case TOK_MOE_SUM: { /* f = rms_w(post_ffn1)(f) + rms_w(post_ffn2)(e), e in t */
            float *f = s->ffn + (size_t)m * H;
            g4_rmsnorm(f, f, w->post_ffn_norm1, H, c->rms_eps);
            g4_rmsnorm(tm, tm, w->post_ffn_norm2, H, c->rms_eps);
            for (int i = 0; i < H; i++) f[i] += tm[i];
            break;
        }
        case TOK_FFN_OUT: { /* x += rms_w(post_ffn)(f) */
            float *f = s->ffn + (size_t)m * H;
            g4_rmsnorm(f, f, w->post_ffn_norm, H, c->rms_eps);
            for (int i = 0; i < H; i++) xm[i] += f[i];
            break;
        }
        case TOK_PLE_GATE: /* gelu(g) ⊙ ple[l] */
            g4_gelu_mul(s->ple_tmp + (size_t)m * P, s->ple + ((size_t)m * L + j->li) * P, (size_t)P);
            break;
        case TOK_PLE_OUT: /* x += rms_w(post_ple)(t) when the model has PLE; x *= layer_scalar */
            if (P) {
                g4_rmsnorm(tm, tm, w->post_ple_norm, H, c->rms_eps);
                for (int i = 0; i < H; i++) xm[i] += tm[i];
            }
            for (int i = 0; i < H; i++) xm[i] *= w->layer_scalar;
            break;
        case TOK_FINAL: g4_rmsnorm(am, xm, md->final_norm, H, c->rms_eps); break;
        default: break;
        }
    }
}

/* One per-token step over the block's M tokens (profiled as `other`, or `cls`). */
static void tok_step(g4_state *s, g4_threadpool *pool, int M, int phase, int li, const int32_t *tokens, int cls) {
    tok_job j = {s, tokens, phase, li};
    prof_mark(s, G4_PROF_OTHER);
    g4_parallel_for(pool, M, 1, tok_range, &j);
    prof_mark(s, cls);
}

g4_status g4_forward(g4_state *s, g4_threadpool *pool, const int32_t *tokens, int M, float *logits,
                     int all_logits, g4_error *err) {
    const g4_model *md = s->m;
    const g4_config *c = &md->cfg;
    int H = c->hidden, L = c->n_layers, nH = c->n_heads, P = c->ple_width;
    if (M <= 0 || M > s->max_batch)
        return g4_fail(err, G4_ERR_ARG, "forward of %d tokens (1..%d allowed per step)", M, s->max_batch);
    if (s->pos + M > s->n_ctx)
        return g4_fail(err, G4_ERR_CONTEXT_FULL,
                       "context full: %d tokens in the cache + %d new exceed the context length %d",
                       s->pos, M, s->n_ctx);
    for (int m = 0; m < M; m++)
        if (tokens[m] < 0 || tokens[m] >= c->vocab || (P && tokens[m] >= c->ple_vocab))
            return g4_fail(err, G4_ERR_ARG, "token id %d at index %d is outside the vocabulary (%d)",
                           tokens[m], m, c->vocab);
    s->stage_pos = s->pos;
    s->n_staged = M;
    s->n_staged_last = M;
    prof_mark(s, -1);

    /* RoPE angles and the embedding x0 = E[token] · s (s rounded to the table's dtype) */
    float *x = s->x;
    tok_step(s, pool, M, TOK_EMBED, -1, tokens, G4_PROF_OTHER);
    dump_rows(s, "embed", -1, M, x, H, H);

    /* per-layer inputs: ple[l] = (rms_w(norm)((x0 · projᵀ)[l] · H^-½) + E_ple[token][l] · √P) · 2^-½ */
    if (P) {
        int LP = L * P;
        matmul_q(s, pool, &md->ple_model_proj, x, M, s->ple, LP);
        tok_step(s, pool, M, TOK_PLE, -1, tokens, G4_PROF_OTHER);
        dump_rows(s, "ple", -1, M, s->ple, LP, LP);
    }

    for (int li = 0; li < L; li++) {
        const g4_layer_config *lc = &c->layers[li];
        const g4_layer_weights *w = &md->layers[li];
        int d = lc->head_dim, nq = nH * d, nkv = lc->n_kv_heads * d, src = lc->kv_source;

        /* input_layernorm; q, and k/v for this block into staging (KV-shared layers read their
         * source's), in one pass over the three matrices when nothing is fake-quantised around them */
        tok_step(s, pool, M, TOK_ATTN_IN, li, tokens, G4_PROF_OTHER);
        dump_rows(s, "attn_norm", li, M, s->a, H, H);
        int own_kv = src == li, fused = plain_mat(&w->wq) && (!own_kv || (plain_mat(&w->wk) && (lc->k_eq_v || plain_mat(&w->wv))));
        if (fused) {
            g4_mm_part parts[3] = {{&w->wq, s->q, nq, NULL}};
            int np = 1;
            if (own_kv) {
                parts[np++] = (g4_mm_part){&w->wk, s->k_stage[li], nkv, NULL};
                if (!lc->k_eq_v) parts[np++] = (g4_mm_part){&w->wv, s->v_stage[li], nkv, NULL};
            }
            prof_mark(s, G4_PROF_OTHER);
            g4_matmul_multi(pool, parts, np, s->a, M, NULL, NULL);
            prof_mark(s, G4_PROF_MATMUL);
        } else {
            matmul_q(s, pool, &w->wq, s->a, M, s->q, nq);
            if (own_kv) {
                matmul_q(s, pool, &w->wk, s->a, M, s->k_stage[li], nkv);
                if (!lc->k_eq_v) matmul_q(s, pool, &w->wv, s->a, M, s->v_stage[li], nkv);
            }
        }
        /* q_norm, RoPE; k_norm, RoPE, v_norm (V = raw K on K=V layers) */
        tok_step(s, pool, M, TOK_HEADS, li, tokens, G4_PROF_OTHER);
        dump_rows(s, "q", li, M, s->q, nq, nq);
        if (own_kv) {
            dump_rows(s, "k", li, M, s->k_stage[li], nkv, nkv);
            dump_rows(s, "v", li, M, s->v_stage[li], nkv, nkv);
        }

        /* attention, o_proj, post_attention_layernorm, residual; pre_feedforward_layernorm */
        attn_job aj = {s, li, src, M, g4_isa_best(), 0};
        aj.sub = att_pick_sub(s, lc, M, pool ? g4_threadpool_size(pool) : 1);
        prof_mark(s, G4_PROF_OTHER);
        if (M <= ATT_SPLIT_M) { /* chunk partials in parallel, then the ordered merge per head */
            g4_parallel_for(pool, att_split_items(s, lc, M, aj.sub), 1, attention_split_range, &aj);
            g4_parallel_for(pool, M * nH, 1, attention_merge_range, &aj);
        } else {
            g4_parallel_for(pool, att_items(lc, nH, M, aj.sub), 1, attention_range, &aj);
        }
        prof_mark(s, G4_PROF_ATTN);
        dump_rows(s, "attn_out", li, M, s->att, nq, nq);
        matmul_q(s, pool, &w->wo, s->att, M, s->t, H);
        tok_step(s, pool, M, TOK_ATTN_OUT, li, tokens, G4_PROF_OTHER);
        dump_rows(s, "attn_post", li, M, x, H, H);

        /* feed-forward: dense MLP, plus the expert half on MoE layers */
        mlp(s, pool, &w->gate, &w->up, &w->down, s->a, M, s->ffn);
        if (c->moe) {
            moe_experts(s, pool, w, x, M, s->t);
            tok_step(s, pool, M, TOK_MOE_SUM, li, tokens, G4_PROF_OTHER);
        }
        dump_rows(s, "mlp_out", li, M, s->ffn, H, H);
        tok_step(s, pool, M, TOK_FFN_OUT, li, tokens, G4_PROF_OTHER);
        dump_rows(s, "ffn_post", li, M, x, H, H);

        /* per-layer input: h += rms_w(norm)((gelu(h · gateᵀ) ⊙ ple[l]) · projᵀ); h *= layer_scalar */
        if (P) {
            matmul_q(s, pool, &w->ple_gate, x, M, s->ple_tmp, P);
            tok_step(s, pool, M, TOK_PLE_GATE, li, tokens, G4_PROF_ACT);
            matmul_q(s, pool, &w->ple_proj, s->ple_tmp, M, s->t, H);
        }
        tok_step(s, pool, M, TOK_PLE_OUT, li, tokens, G4_PROF_OTHER);
        dump_rows(s, "layer_out", li, M, x, H, H);
    }

    /* final norm, tied LM head (unscaled table), softcap */
    tok_step(s, pool, M, TOK_FINAL, -1, tokens, G4_PROF_OTHER);
    dump_rows(s, "final_norm", -1, M, s->a, H, H);
    if (logits) {
        int first = all_logits ? 0 : M - 1, n = M - first, V = c->vocab;
        prof_mark(s, G4_PROF_OTHER);
        g4_matmul(pool, &md->embed, s->a + (size_t)first * H, n, logits, V);
        prof_mark(s, G4_PROF_HEAD);
        if (c->final_softcap > 0) {
            softcap_job sj = {logits, n * V, c->final_softcap};
            g4_parallel_for(pool, n * V, 1024, softcap_range, &sj);
        }
        prof_mark(s, G4_PROF_ACT);
        for (int i = 0; i < n; i++) dump(s, "logits", -1, first + i, logits + (size_t)i * V, V);
    }
    prof_mark(s, G4_PROF_OTHER);
    return G4_OK;
}
