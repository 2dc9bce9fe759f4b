/* Loading and running the drafter. One step reads like §5 of the model doc.
 *
 * Loading goes through the same weight sources as the target: a folder's config.json says
 * whether the weights are plain safetensors, MLX affine or QAT (tensors asked for by their full
 * names), a pack file (or a folder holding only model.g4p) is mapped as it is; the token ordering
 * comes through the source's find_i32. The geometry check against the target runs before any
 * weight is bound. */
#include "model/drafter.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "formats/pack.h"
#include "formats/safetensors.h"
#include "util/error.h"
#include "util/mapped_file.h"

/* The drafter's layers read the target's last non-shared layer of the same attention kind, and
 * must see the same KV geometry there. */
static g4_status resolve_sources(g4_drafter *d, const g4_model *t, g4_error *err) {
    const g4_config *tc = &t->cfg, *dc = &d->cfg.text;
    if (d->cfg.backbone_hidden != tc->hidden)
        return g4_fail(err, G4_ERR_CONFIG, "%s: drafter expects a target with hidden size %d; this target has %d",
                       d->path, d->cfg.backbone_hidden, tc->hidden);
    if (dc->vocab != tc->vocab)
        return g4_fail(err, G4_ERR_CONFIG, "%s: drafter vocabulary %d differs from the target's %d", d->path,
                       dc->vocab, tc->vocab);
    if (dc->sliding_window != tc->sliding_window)
        return g4_fail(err, G4_ERR_CONFIG, "%s: drafter sliding window %d differs from the target's %d", d->path,
                       dc->sliding_window, tc->sliding_window);
    for (int i = 0; i < dc->n_layers; i++) {
        const g4_layer_config *l = &dc->layers[i];
        int src = -1;
        for (int j = tc->first_shared - 1; j >= 0 && src < 0; j--)
            if (tc->layers[j].is_full == l->is_full) src = j;
        if (src < 0)
            return g4_fail(err, G4_ERR_CONFIG, "%s: drafter layer %d needs a %s-attention layer in the target", d->path,
                           i, l->is_full ? "full" : "sliding");
        const g4_layer_config *s = &tc->layers[src];
        if (s->head_dim != l->head_dim || s->n_kv_heads != l->n_kv_heads || (dc->k_eq_v != tc->k_eq_v))
            return g4_fail(err, G4_ERR_CONFIG,
                           "%s: drafter layer %d (head dim %d, %d KV heads%s) does not match target layer %d "
                           "(head dim %d, %d KV heads%s): a drafter for another target?",
                           d->path, i, l->head_dim, l->n_kv_heads, dc->k_eq_v ? ", K=V" : "", src, s->head_dim,
                           s->n_kv_heads, tc->k_eq_v ? ", K=V" : "");
        d->target_layer[i] = src;
    }
    return G4_OK;
}

/* A GGUF file, or a folder holding model.gguf and no config.json. */
static int is_gguf_path(const char *path) {
    char buf[4096];
    struct stat sb;
    snprintf(buf, sizeof buf, "%s/config.json", path);
    int dir_gguf = stat(buf, &sb) != 0;
    snprintf(buf, sizeof buf, "%s/model.gguf", path);
    const char *cands[2] = {path, dir_gguf ? buf : NULL};
    for (int i = 0; i < 2; i++) {
        if (!cands[i] || stat(cands[i], &sb) || !S_ISREG(sb.st_mode)) continue;
        FILE *f = fopen(cands[i], "rb");
        char magic[4] = {0};
        int ok = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
        if (f) fclose(f);
        if (ok) return 1;
    }
    return 0;
}

int g4_is_drafter_path(const char *path) {
    char pack[4096];
    if (g4_pack_resolve(path, pack, sizeof pack)) {
        g4_pack p;
        if (g4_pack_open(&p, pack, NULL)) return 0;
        const char *k = g4_pack_string(&p, "kind");
        int d = k && !strcmp(k, "drafter");
        g4_pack_close(&p);
        return d;
    }
    char cpath[4096], *text = NULL;
    snprintf(cpath, sizeof cpath, "%s/config.json", path);
    if (g4_read_file(cpath, &text, NULL, NULL)) return 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    int d = cJSON_IsString(mt) && strstr(mt->valuestring, "_assistant") != NULL;
    cJSON_Delete(root);
    return d;
}

g4_status g4_drafter_open(const char *path, g4_drafter **out, char **config_json, g4_error *err) {
    *out = NULL;
    if (config_json) *config_json = NULL;
    if (!path) return g4_fail(err, G4_ERR_ARG, "drafter path is required");
    g4_drafter *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(path))) {
        free(d);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    char cpath[4096], pack[4096];
    char *text = NULL;
    g4_status st;
    int quantised = 0;
    if (g4_pack_resolve(path, pack, sizeof pack)) {
        st = g4_source_open_pack(&d->src, pack, "drafter", &text, err);
        snprintf(cpath, sizeof cpath, "%s", pack);
        if (!st) st = g4_drafter_config_parse(text, cpath, &d->cfg, err);
    } else if (is_gguf_path(path)) {
        /* the model doc names no GGUF layout for gemma4_assistant, and llama.cpp's converter
         * writes none that this engine could check against */
        st = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: GGUF drafters are not supported (no GGUF naming for Gemma 4 "
                     "assistant models is defined); use the safetensors, MLX, QAT or g4 pack form", path);
    } else {
        snprintf(cpath, sizeof cpath, "%s/config.json", path);
        st = g4_read_file(cpath, &text, NULL, err);
        if (!st) st = g4_drafter_config_parse(text, cpath, &d->cfg, err);
        if (!st) st = g4_source_open_quantized_drafter(&d->src, path, &d->cfg, &quantised, err);
        if (!st && !quantised) st = g4_source_open_safetensors_raw(&d->src, path, err);
    }
    const g4_config *c = &d->cfg.text;
    if (!st) {
        int L = c->n_layers, h = c->hidden;
        d->layers = calloc((size_t)L, sizeof *d->layers);
        d->target_layer = calloc((size_t)L, sizeof(int));
        d->arena_cap = (size_t)h + 16;
        for (int i = 0; i < L; i++) d->arena_cap += 4 * (size_t)h + (size_t)c->layers[i].head_dim + 4;
        d->arena = malloc(d->arena_cap * sizeof(float));
        if (!d->layers || !d->target_layer || !d->arena) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    if (st) {
        free(text);
        g4_drafter_free(d);
        return st;
    }
    if (config_json) *config_json = text;
    else free(text);
    *out = d;
    return G4_OK;
}

g4_status g4_drafter_bind(g4_drafter *d, g4_error *err) {
    const g4_config *c = &d->cfg.text;
    int L = c->n_layers, h = c->hidden, H = d->cfg.backbone_hidden, V = c->vocab;
    g4_binder b = {&d->src, d->arena, 0, d->arena_cap, NULL, err};
    g4_status st;
    if (!(st = g4_bind_mat(&b, "pre_projection.weight", 0, h, 2 * H, &d->pre_proj, NULL)) &&
        !(st = g4_bind_mat(&b, "post_projection.weight", 0, H, h, &d->post_proj, NULL)) &&
        !(st = g4_bind_mat(&b, "model.embed_tokens.weight", 0, V, h, &d->embed, NULL)))
        st = g4_bind_vec(&b, "model.norm.weight", h, &d->final_norm);
    for (int i = 0; i < L && !st; i++) {
        const g4_layer_config *lc = &c->layers[i];
        g4_drafter_layer *w = &d->layers[i];
        int nq = c->n_heads * lc->head_dim, I = lc->mlp_width;
        char n[128];
#define NAME(s) (snprintf(n, sizeof n, "model.layers.%d.%s", i, s), n)
        const float *scalar;
        if ((st = g4_bind_vec(&b, NAME("input_layernorm.weight"), h, &w->attn_norm)) ||
            (st = g4_bind_vec(&b, NAME("post_attention_layernorm.weight"), h, &w->post_attn_norm)) ||
            (st = g4_bind_vec(&b, NAME("pre_feedforward_layernorm.weight"), h, &w->pre_ffn_norm)) ||
            (st = g4_bind_vec(&b, NAME("post_feedforward_layernorm.weight"), h, &w->post_ffn_norm)) ||
            (st = g4_bind_mat(&b, NAME("self_attn.q_proj.weight"), 0, nq, h, &w->wq, NULL)) ||
            (st = g4_bind_vec(&b, NAME("self_attn.q_norm.weight"), lc->head_dim, &w->q_norm)) ||
            (st = g4_bind_mat(&b, NAME("self_attn.o_proj.weight"), 0, h, nq, &w->wo, NULL)) ||
            (st = g4_bind_mat(&b, NAME("mlp.gate_proj.weight"), 0, I, h, &w->gate, NULL)) ||
            (st = g4_bind_mat(&b, NAME("mlp.up_proj.weight"), 0, I, h, &w->up, NULL)) ||
            (st = g4_bind_mat(&b, NAME("mlp.down_proj.weight"), 0, h, I, &w->down, NULL)) ||
            (st = g4_bind_vec(&b, NAME("layer_scalar"), 1, &scalar)))
            break;
#undef NAME
        w->layer_scalar = scalar[0];
    }
    if (st || !d->cfg.ordered_embeddings) return st;
    int C = d->cfg.n_centroids, found = 0;
    if ((st = g4_bind_mat(&b, "masked_embedding.centroids.weight", 0, C, h, &d->centroids, NULL))) return st;
    if (!(d->token_order = malloc(sizeof(int32_t) * (size_t)V))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    if (d->src.find_i32 &&
        (st = d->src.find_i32(d->src.ctx, "masked_embedding.token_ordering", V, d->token_order, &found, err)))
        return st;
    if (!found)
        return g4_fail(err, G4_ERR_TENSOR, "%s: masked_embedding.token_ordering missing or not an integer [%d]", d->path,
                       V);
    /* every token id exactly once: the centroid head scores each token through its cluster */
    char *seen = calloc((size_t)V, 1);
    if (!seen) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < V; i++) {
        int32_t v = d->token_order[i];
        if (v < 0 || v >= V || seen[v])
            st = g4_fail(err, G4_ERR_TENSOR, "%s: masked_embedding.token_ordering is not a permutation of 0..%d", d->path,
                         V - 1);
        else
            seen[v] = 1;
    }
    free(seen);
    return st;
}

g4_status g4_drafter_load(const char *path, const g4_model *target, g4_drafter **out, g4_error *err) {
    *out = NULL;
    if (!path || !target) return g4_fail(err, G4_ERR_ARG, "drafter path and target are required");
    g4_drafter *d;
    g4_status st = g4_drafter_open(path, &d, NULL, err);
    if (st) return st;
    d->target = target;
    if (!(st = resolve_sources(d, target, err))) st = g4_drafter_bind(d, err);
    if (st) {
        g4_drafter_free(d);
        return st;
    }
    *out = d;
    return G4_OK;
}

void g4_drafter_free(g4_drafter *d) {
    if (!d) return;
    if (d->src.close) d->src.close(d->src.ctx);
    g4_config_free(&d->cfg.text);
    free(d->layers);
    free(d->target_layer);
    free(d->token_order);
    free(d->arena);
    free(d->path);
    free(d);
}

g4_status g4_draft_state_init(g4_draft_state *ds, const g4_drafter *d, int n_ctx, g4_error *err) {
    memset(ds, 0, sizeof *ds);
    const g4_config *c = &d->cfg.text;
    int h = c->hidden, H = d->target->cfg.hidden, maxd = 0, maxI = 0;
    for (int i = 0; i < c->n_layers; i++) {
        if (c->layers[i].head_dim > maxd) maxd = c->layers[i].head_dim;
        if (c->layers[i].mlp_width > maxI) maxI = c->layers[i].mlp_width;
    }
    ds->h = h;
    ds->H = H;
    ds->max_d = maxd;
    ds->n_ctx = n_ctx;
    size_t f = sizeof(float), nq = (size_t)c->n_heads * maxd;
    ds->x2 = calloc(2 * (size_t)H, f);
    ds->x = calloc((size_t)h, f);
    ds->a = calloc((size_t)h, f);
    ds->t = calloc((size_t)h, f);
    ds->y = calloc((size_t)h, f);
    ds->q = calloc(nq, f);
    ds->att = calloc(nq, f);
    ds->gate = calloc((size_t)maxI, f);
    ds->up = calloc((size_t)maxI, f);
    ds->scores = calloc((size_t)n_ctx, f);
    ds->rope_cs = calloc((size_t)maxd, f);
    ds->kv_row = calloc((size_t)maxd, f);
    int C = d->cfg.ordered_embeddings ? d->cfg.n_centroids : 1;
    ds->cent = calloc((size_t)C, f);
    ds->cent_idx = calloc((size_t)C, sizeof(int));
    ds->mark = calloc((size_t)c->vocab, 1);
    if (!ds->mark || !ds->x2 || !ds->x || !ds->a || !ds->t || !ds->y || !ds->q || !ds->att || !ds->gate || !ds->up || !ds->scores ||
        !ds->rope_cs || !ds->cent || !ds->cent_idx || !ds->kv_row) {
        g4_draft_state_free(ds);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory for drafter scratch");
    }
    return G4_OK;
}

void g4_draft_state_free(g4_draft_state *ds) {
    free(ds->x2); free(ds->x); free(ds->a); free(ds->t); free(ds->y); free(ds->q); free(ds->att);
    free(ds->gate); free(ds->up); free(ds->scores); free(ds->rope_cs); free(ds->kv_row); free(ds->cent); free(ds->cent_idx); free(ds->mark);
    memset(ds, 0, sizeof *ds);
}

/* d elements of a target cache from element `at`: in place for a float cache, widened into buf
 * for a bf16 one. */
static const float *cache_row(const g4_state *ts, const void *cache, size_t at, int d, float *buf) {
    if (!ts->kv_bf16) return (const float *)cache + at;
    const uint16_t *h = (const uint16_t *)cache + at;
    for (int e = 0; e < d; e++) buf[e] = g4_bf16_to_f32(h[e]);
    return buf;
}

/* Attention of one drafter head over the target's committed cache of layer `src`, keys lo..qpos. */
static void draft_attend(const g4_state *ts, int src, int kv_off, int d, const float *q, int lo, int qpos,
                         float *sc, float *out, float *wide) {
    const g4_layer_config *l = &ts->m->cfg.layers[src];
    size_t row = (size_t)l->n_kv_heads * l->head_dim;
    int cap = ts->cache_cap[src];
    float mx = -INFINITY, sum = 0;
    for (int k = lo; k <= qpos; k++) {
        float v = g4_dot_f32(q, cache_row(ts, ts->k_cache[src], (size_t)(k % cap) * row + kv_off, d, wide), d);
        sc[k - lo] = v;
        mx = v > mx ? v : mx;
    }
    for (int k = lo; k <= qpos; k++) sum += (sc[k - lo] = expf(sc[k - lo] - mx));
    memset(out, 0, sizeof(float) * (size_t)d);
    for (int k = lo; k <= qpos; k++) {
        float p = sc[k - lo] / sum;
        if (p < 0x1p-40f) continue; /* invisible in the sum; its products with V would be subnormal
                                       (a microcode assist each on the CPU), as in forward.c */
        const float *v = cache_row(ts, ts->v_cache[src], (size_t)(k % cap) * row + kv_off, d, wide);
        for (int e = 0; e < d; e++) out[e] += p * v[e];
    }
}

void g4_draft_step(const g4_drafter *d, g4_draft_state *ds, const g4_state *ts, g4_threadpool *pool, int32_t tok,
                   float *hid, int qpos, float *logits) {
    const g4_config *c = &d->cfg.text;
    const g4_model *tm = d->target;
    int h = c->hidden, H = tm->cfg.hidden, nH = c->n_heads, V = c->vocab;
    float eps = c->rms_eps;
    /* x = concat(E_target[tok] · s, ĥ) · pre_projectionᵀ */
    g4_mat_row_f32(&tm->embed, tok, ds->x2);
    for (int i = 0; i < H; i++) ds->x2[i] *= tm->embed_scale;
    memcpy(ds->x2 + H, hid, sizeof(float) * (size_t)H);
    g4_matmul(pool, &d->pre_proj, ds->x2, 1, ds->x, h);
    for (int li = 0; li < c->n_layers; li++) {
        const g4_layer_config *lc = &c->layers[li];
        const g4_drafter_layer *w = &d->layers[li];
        int dd = lc->head_dim, nq = nH * dd, src = d->target_layer[li];
        int group = nH / lc->n_kv_heads;
        g4_rmsnorm(ds->a, ds->x, w->attn_norm, h, eps);
        g4_matmul(pool, &w->wq, ds->a, 1, ds->q, nq);
        for (int hh = 0; hh < nH; hh++) {
            float *qh = ds->q + (size_t)hh * dd;
            g4_rmsnorm(qh, qh, w->q_norm, dd, eps);
            g4_rope(qh, dd, qpos, lc->rope_theta, lc->rope_pairs);
        }
        int lo = lc->is_full ? 0 : (qpos - tm->cfg.sliding_window + 1 > 0 ? qpos - tm->cfg.sliding_window + 1 : 0);
        for (int hh = 0; hh < nH; hh++)
            draft_attend(ts, src, (hh / group) * dd, dd, ds->q + (size_t)hh * dd, lo, qpos, ds->scores,
                         ds->att + (size_t)hh * dd, ds->kv_row);
        g4_matmul(pool, &w->wo, ds->att, 1, ds->t, h);
        g4_rmsnorm(ds->t, ds->t, w->post_attn_norm, h, eps);
        for (int i = 0; i < h; i++) ds->x[i] += ds->t[i];
        g4_rmsnorm(ds->a, ds->x, w->pre_ffn_norm, h, eps);
        int I = lc->mlp_width;
        g4_matmul(pool, &w->gate, ds->a, 1, ds->gate, I);
        g4_matmul(pool, &w->up, ds->a, 1, ds->up, I);
        for (int i = 0; i < I; i++) ds->gate[i] = g4_gelu_tanh(ds->gate[i]) * ds->up[i];
        g4_matmul(pool, &w->down, ds->gate, 1, ds->t, h);
        g4_rmsnorm(ds->t, ds->t, w->post_ffn_norm, h, eps);
        for (int i = 0; i < h; i++) ds->x[i] = (ds->x[i] + ds->t[i]) * w->layer_scalar;
    }
    g4_rmsnorm(ds->y, ds->x, d->final_norm, h, eps);
    g4_matmul(pool, &d->post_proj, ds->y, 1, hid, H);
    if (!d->cfg.ordered_embeddings) {
        g4_matmul(pool, &d->embed, ds->y, 1, logits, V);
        return;
    }
    /* centroid head: score the tokens of the top-k centroids; all others get min(scores) − 1 */
    int C = d->cfg.n_centroids, K = d->cfg.centroid_top_k, per = V / C;
    g4_matmul(pool, &d->centroids, ds->y, 1, ds->cent, C);
    for (int k = 0; k < K; k++) { /* selection, lower index on ties */
        int best = -1;
        for (int i = 0; i < C; i++)
            if (ds->cent[i] > -INFINITY && (best < 0 || ds->cent[i] > ds->cent[best])) best = i;
        ds->cent_idx[k] = best;
        ds->cent[best] = -INFINITY;
    }
    float mn = INFINITY;
    memset(ds->mark, 0, (size_t)V);
    for (int k = 0; k < K; k++)
        for (int j = 0; j < per; j++) {
            int t = d->token_order[(size_t)ds->cent_idx[k] * per + j];
            g4_mat row = g4_mat_rows(&d->embed, t, 1);
            g4_matmul(pool, &row, ds->y, 1, &logits[t], 1);
            mn = logits[t] < mn ? logits[t] : mn;
            ds->mark[t] = 1;
        }
    for (int i = 0; i < V; i++)
        if (!ds->mark[i]) logits[i] = mn - 1.0f;
}
