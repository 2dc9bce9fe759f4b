/* Synthesis and conversion (synth.h). */
#include "model/synth.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/kernels.h"
#include "cpu/quant.h"
#include "model/drafter.h"
#include "model/model.h"
#include "util/error.h"
#include "util/mapped_file.h"
#include "util/threadpool.h"

/* ---- the tensor list -------------------------------------------------------------------------- */

typedef struct {
    g4_tensor_desc *t;
    int n, cap;
    int oom;
} tlist;

static void add(tlist *l, const char *name, int ndim, int64_t a, int64_t b, int64_t c, g4_tensor_role role, int fan_in) {
    if (l->oom) return;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        g4_tensor_desc *t = realloc(l->t, sizeof *t * (size_t)cap);
        if (!t) {
            l->oom = 1;
            return;
        }
        l->t = t;
        l->cap = cap;
    }
    g4_tensor_desc *d = &l->t[l->n++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->ndim = ndim;
    d->shape[0] = a;
    d->shape[1] = b;
    d->shape[2] = c;
    d->role = role;
    d->fan_in = fan_in;
}

g4_status g4_model_tensor_list(const g4_config *c, g4_tensor_desc **out, int *n, g4_error *err) {
    *out = NULL;
    *n = 0;
    tlist l = {0};
    int H = c->hidden, L = c->n_layers, P = c->ple_width, nH = c->n_heads;
    add(&l, "embed_tokens.weight", 2, c->vocab, H, 0, G4_TR_EMBED, H);
    if (P > 0) {
        add(&l, "embed_tokens_per_layer.weight", 2, c->ple_vocab, (int64_t)L * P, 0, G4_TR_PLE_EMBED, P);
        add(&l, "per_layer_model_projection.weight", 2, (int64_t)L * P, H, 0, G4_TR_MATRIX, H);
        add(&l, "per_layer_projection_norm.weight", 1, P, 0, 0, G4_TR_NORM, 0);
    }
    for (int i = 0; i < L; i++) {
        const g4_layer_config *lc = &c->layers[i];
        int d = lc->head_dim, nkv = lc->n_kv_heads * d, I = lc->mlp_width;
        char nm[96];
#define N(s) (snprintf(nm, sizeof nm, "layers.%d.%s", i, s), nm)
        add(&l, N("input_layernorm.weight"), 1, H, 0, 0, G4_TR_NORM, 0);
        add(&l, N("self_attn.q_proj.weight"), 2, (int64_t)nH * d, H, 0, G4_TR_MATRIX, H);
        add(&l, N("self_attn.q_norm.weight"), 1, d, 0, 0, G4_TR_NORM, 0);
        if (lc->kv_source == i) {
            add(&l, N("self_attn.k_proj.weight"), 2, nkv, H, 0, G4_TR_MATRIX, H);
            add(&l, N("self_attn.k_norm.weight"), 1, d, 0, 0, G4_TR_NORM, 0);
            if (!lc->k_eq_v) add(&l, N("self_attn.v_proj.weight"), 2, nkv, H, 0, G4_TR_MATRIX, H);
        }
        add(&l, N("self_attn.o_proj.weight"), 2, H, (int64_t)nH * d, 0, G4_TR_MATRIX, nH * d);
        add(&l, N("post_attention_layernorm.weight"), 1, H, 0, 0, G4_TR_NORM, 0);
        add(&l, N("pre_feedforward_layernorm.weight"), 1, H, 0, 0, G4_TR_NORM, 0);
        add(&l, N("mlp.gate_proj.weight"), 2, I, H, 0, G4_TR_MATRIX, H);
        add(&l, N("mlp.up_proj.weight"), 2, I, H, 0, G4_TR_MATRIX, H);
        add(&l, N("mlp.down_proj.weight"), 2, H, I, 0, G4_TR_MATRIX, I);
        add(&l, N("post_feedforward_layernorm.weight"), 1, H, 0, 0, G4_TR_NORM, 0);
        if (c->moe) {
            int E = c->n_experts, Im = c->moe_width;
            add(&l, N("router.proj.weight"), 2, E, H, 0, G4_TR_MATRIX, H);
            add(&l, N("router.scale"), 1, H, 0, 0, G4_TR_NORM, 0);
            add(&l, N("router.per_expert_scale"), 1, E, 0, 0, G4_TR_NORM, 0);
            add(&l, N("experts.gate_up_proj"), 3, E, 2 * (int64_t)Im, H, G4_TR_MATRIX, H);
            add(&l, N("experts.down_proj"), 3, E, H, Im, G4_TR_MATRIX, Im);
            add(&l, N("pre_feedforward_layernorm_2.weight"), 1, H, 0, 0, G4_TR_NORM, 0);
            add(&l, N("post_feedforward_layernorm_1.weight"), 1, H, 0, 0, G4_TR_NORM, 0);
            add(&l, N("post_feedforward_layernorm_2.weight"), 1, H, 0, 0, G4_TR_NORM, 0);
        }
        if (P > 0) {
            add(&l, N("per_layer_input_gate.weight"), 2, P, H, 0, G4_TR_MATRIX, H);
            add(&l, N("per_layer_projection.weight"), 2, H, P, 0, G4_TR_MATRIX, P);
            add(&l, N("post_per_layer_input_norm.weight"), 1, H, 0, 0, G4_TR_NORM, 0);
        }
        add(&l, N("layer_scalar"), 1, 1, 0, 0, G4_TR_SCALAR, 0);
#undef N
    }
    add(&l, "norm.weight", 1, H, 0, 0, G4_TR_NORM, 0);
    if (l.oom) {
        free(l.t);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    *out = l.t;
    *n = l.n;
    return G4_OK;
}

static int64_t desc_rows(const g4_tensor_desc *t) {
    int64_t r = 1;
    for (int i = 0; i < t->ndim - 1; i++) r *= t->shape[i];
    return r;
}

static int64_t desc_cols(const g4_tensor_desc *t) { return t->shape[t->ndim - 1]; }

/* ---- values ------------------------------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

void g4_synth_rows(const g4_tensor_desc *t, uint64_t seed, int64_t r0, int64_t n, float *out) {
    int64_t cols = desc_cols(t);
    float mean = 0, sigma;
    switch (t->role) {
    case G4_TR_EMBED: sigma = 2.0f / sqrtf((float)t->fan_in); break;
    case G4_TR_PLE_EMBED: sigma = 1.0f / sqrtf((float)t->fan_in); break;
    case G4_TR_MATRIX: sigma = 1.0f / sqrtf((float)t->fan_in); break;
    case G4_TR_NORM: mean = 1.0f; sigma = 0.1f; break;
    default: mean = 1.0f; sigma = 0.02f; break;
    }
    /* an approximately normal z: the centred sum of four 16-bit uniforms, scaled to unit variance */
    const float k = sigma * 1.7320508f / 65536.0f;
    uint64_t h = name_hash(t->name);
    for (int64_t r = 0; r < n; r++) {
        uint64_t s = mix64(seed ^ mix64(h + 0x9e3779b97f4a7c15ull * (uint64_t)(r0 + r + 1)));
        float *o = out + (size_t)r * (size_t)cols;
        for (int64_t c = 0; c < cols; c++) {
            s += 0x9e3779b97f4a7c15ull;
            uint64_t v = mix64(s);
            int64_t sum = (int64_t)(v & 0xffff) + (int64_t)(v >> 16 & 0xffff) + (int64_t)(v >> 32 & 0xffff) +
                          (int64_t)(v >> 48) + 2 - 131072;
            o[c] = mean + (float)sum * k;
        }
    }
}

typedef struct {
    const g4_tensor_desc *t;
    uint64_t seed;
    int64_t r0;
    float *buf;
} gen_job;

static void gen_range(void *ctx, int b, int e, int tid) {
    (void)tid;
    const gen_job *j = ctx;
    g4_synth_rows(j->t, j->seed, j->r0 + b, e - b, j->buf + (size_t)b * (size_t)desc_cols(j->t));
}

/* ---- configs ------------------------------------------------------------------------------------ */

g4_status g4_synth_config_json(const char *arch, int n_layers, char **out, g4_error *err) {
    *out = NULL;
    char *json = arch ? g4_released_config_json(arch) : NULL;
    if (!json)
        return g4_fail(err, G4_ERR_ARG, "unknown architecture '%s' (e2b, e4b, 12b, 26b-a4b, 31b)", arch ? arch : "");
    if (n_layers <= 0) {
        *out = json;
        return G4_OK;
    }
    cJSON *root = cJSON_Parse(json);
    free(json);
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    cJSON *nl = cJSON_GetObjectItemCaseSensitive(tc, "num_hidden_layers");
    cJSON *types = cJSON_GetObjectItemCaseSensitive(tc, "layer_types");
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(tc, "num_kv_shared_layers");
    if (!cJSON_IsNumber(nl) || !cJSON_IsArray(types)) {
        cJSON_Delete(root);
        return g4_fail(err, G4_ERR_CONFIG, "internal: released config of '%s' lacks its layer fields", arch);
    }
    int L = nl->valueint, shared = cJSON_IsNumber(sh) ? sh->valueint : 0;
    if (n_layers > L) {
        cJSON_Delete(root);
        return g4_fail(err, G4_ERR_ARG, "--layers %d exceeds the %d layers of %s", n_layers, L, arch);
    }
    /* the pattern's period: a non-shared prefix must hold both layer kinds */
    int period = 1;
    for (int i = 0; i < L; i++) {
        cJSON *e = cJSON_GetArrayItem(types, i);
        if (cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")) {
            period = i + 1;
            break;
        }
    }
    while (cJSON_GetArraySize(types) > n_layers) cJSON_DeleteItemFromArray(types, cJSON_GetArraySize(types) - 1);
    cJSON_ReplaceItemInArray(types, n_layers - 1, cJSON_CreateString("full_attention"));
    int new_shared = shared ? (int)((int64_t)n_layers * shared / L) : 0;
    if (new_shared > n_layers - period) new_shared = n_layers - period;
    if (new_shared < 0) new_shared = 0;
    cJSON_SetNumberValue(nl, n_layers);
    if (sh) cJSON_SetNumberValue(sh, new_shared);
    *out = cJSON_Print(root);
    cJSON_Delete(root);
    if (!*out) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    return G4_OK;
}

g4_status g4_config_to_json(const g4_config *c, char **out, g4_error *err) {
    *out = NULL;
    int L = c->n_layers;
    /* globals from the first layer of each kind; per_layer_config pins any layer that differs */
    int hd_s = c->head_dim_sliding, hd_f = c->head_dim_full, kv_s = -1, kv_f = -1;
    for (int i = 0; i < L; i++) {
        const g4_layer_config *l = &c->layers[i];
        if (!l->is_full && kv_s < 0) kv_s = l->n_kv_heads;
        if (l->is_full && kv_f < 0) kv_f = l->n_kv_heads;
    }
    if (kv_s < 0) kv_s = kv_f > 0 ? kv_f : 1;
    int unified = !strcmp(c->arch, "gemma4_unified");
    cJSON *r = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(r, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(unified ? "Gemma4UnifiedForCausalLM" : "Gemma4ForCausalLM"));
    cJSON_AddStringToObject(r, "model_type", unified ? "gemma4_unified_text" : "gemma4_text");
    cJSON_AddNumberToObject(r, "num_hidden_layers", L);
    cJSON_AddNumberToObject(r, "hidden_size", c->hidden);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(r, "num_key_value_heads", kv_s);
    int gkv = c->k_eq_v && kv_f > 0 ? kv_f : 0;
    if (gkv) cJSON_AddNumberToObject(r, "num_global_key_value_heads", gkv);
    cJSON_AddBoolToObject(r, "attention_k_eq_v", c->k_eq_v);
    cJSON_AddNumberToObject(r, "head_dim", hd_s);
    cJSON_AddNumberToObject(r, "global_head_dim", hd_f);
    cJSON_AddNumberToObject(r, "sliding_window", c->sliding_window);
    cJSON *types = cJSON_AddArrayToObject(r, "layer_types");
    for (int i = 0; i < L; i++)
        cJSON_AddItemToArray(types, cJSON_CreateString(c->layers[i].is_full ? "full_attention" : "sliding_attention"));
    cJSON *plc = cJSON_CreateObject();
    for (int i = 0; i < L; i++) {
        const g4_layer_config *l = &c->layers[i];
        int hd = l->is_full ? hd_f : hd_s, kv = l->is_full && gkv ? gkv : kv_s;
        if (l->head_dim == hd && l->n_kv_heads == kv) continue;
        char key[16];
        snprintf(key, sizeof key, "%d", i);
        cJSON *o = cJSON_AddObjectToObject(plc, key);
        cJSON_AddNumberToObject(o, "head_dim", l->head_dim);
        cJSON_AddNumberToObject(o, "num_key_value_heads", l->n_kv_heads);
    }
    if (plc->child) cJSON_AddItemToObject(r, "per_layer_config", plc);
    else cJSON_Delete(plc);
    cJSON_AddNumberToObject(r, "intermediate_size", c->intermediate);
    cJSON_AddBoolToObject(r, "use_double_wide_mlp", c->double_wide);
    cJSON_AddNumberToObject(r, "hidden_size_per_layer_input", c->ple_width);
    cJSON_AddNumberToObject(r, "vocab_size_per_layer_input", c->ple_width ? c->ple_vocab : c->vocab);
    cJSON_AddNumberToObject(r, "num_kv_shared_layers", c->n_kv_shared);
    cJSON_AddBoolToObject(r, "enable_moe_block", c->moe);
    if (c->moe) {
        cJSON_AddNumberToObject(r, "num_experts", c->n_experts);
        cJSON_AddNumberToObject(r, "top_k_experts", c->top_k_experts);
        cJSON_AddNumberToObject(r, "moe_intermediate_size", c->moe_width);
    }
    /* RoPE from the first layer of each kind: theta and R = factor · d / 2 */
    cJSON *rp = cJSON_AddObjectToObject(r, "rope_parameters");
    for (int full = 0; full < 2; full++) {
        const g4_layer_config *l = NULL;
        for (int i = 0; i < L && !l; i++)
            if (c->layers[i].is_full == full) l = &c->layers[i];
        cJSON *k = cJSON_AddObjectToObject(rp, full ? "full_attention" : "sliding_attention");
        cJSON_AddNumberToObject(k, "rope_theta", l ? l->rope_theta : (full ? 1e6 : 1e4));
        cJSON_AddNumberToObject(k, "partial_rotary_factor", l ? 2.0 * l->rope_pairs / l->head_dim : (full ? 0.25 : 1.0));
        cJSON_AddStringToObject(k, "rope_type", full ? "proportional" : "default");
    }
    cJSON_AddNumberToObject(r, "vocab_size", c->vocab);
    cJSON_AddNumberToObject(r, "max_position_embeddings", c->max_positions);
    if (c->final_softcap > 0) cJSON_AddNumberToObject(r, "final_logit_softcapping", c->final_softcap);
    else cJSON_AddNullToObject(r, "final_logit_softcapping");
    cJSON_AddNumberToObject(r, "rms_norm_eps", c->rms_eps);
    cJSON_AddNumberToObject(r, "bos_token_id", c->bos);
    cJSON_AddNumberToObject(r, "eos_token_id", c->eos);
    cJSON_AddNumberToObject(r, "pad_token_id", c->pad);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", 1);
    *out = cJSON_Print(r);
    cJSON_Delete(r);
    if (!*out) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    return G4_OK;
}

/* ---- streaming through a writer -------------------------------------------------------------- */

/* Declares every tensor, begins, and streams each through `fill` in row chunks. */
typedef g4_status (*fill_fn)(void *ctx, const g4_tensor_desc *t, int64_t r0, int64_t n, float *buf, g4_error *err);

static g4_status stream(const char *config_json, const g4_config *cfg, const g4_model_writer *w, fill_fn fill,
                        void *ctx, g4_error *err) {
    g4_tensor_desc *t = NULL;
    int n = 0;
    float *buf = NULL;
    g4_writer_rows pending = {0};
    g4_status st = g4_model_tensor_list(cfg, &t, &n, err);
    if (!st) st = w->set_config(w->ctx, config_json, err);
    for (int i = 0; i < n && !st; i++) st = w->declare(w->ctx, t[i].name, t[i].ndim, t[i].shape, err);
    if (!st) st = w->begin(w->ctx, err);
    const size_t chunk_floats = (size_t)1 << 22; /* 16 MB of float32 per chunk */
    if (!st && !(buf = malloc(sizeof(float) * chunk_floats))) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !st; i++) {
        int64_t rows = desc_rows(&t[i]), cols = desc_cols(&t[i]);
        int64_t per = (int64_t)chunk_floats / cols;
        if (per < 1) {
            st = g4_fail(err, G4_ERR_UNSUPPORTED, "tensor '%s': rows of %lld columns are too wide", t[i].name,
                         (long long)cols);
            break;
        }
        for (int64_t r0 = 0; r0 < rows && !st; r0 += per) {
            int64_t k = rows - r0 < per ? rows - r0 : per;
            st = fill(ctx, &t[i], r0, k, buf, err);
            if (!st) st = g4_writer_put_rows(w, &pending, t[i].name, t[i].ndim, t[i].shape, r0, k, buf, err);
        }
    }
    free(buf);
    free(t);
    g4_writer_rows_reset(&pending);
    if (st) w->abort(w->ctx);
    else st = w->finish(w->ctx, err);
    return st;
}

typedef struct {
    g4_threadpool *pool;
    uint64_t seed;
} synth_fill;

static g4_status synth_fill_fn(void *ctx, const g4_tensor_desc *t, int64_t r0, int64_t n, float *buf, g4_error *err) {
    (void)err;
    synth_fill *f = ctx;
    gen_job j = {t, f->seed, r0, buf};
    g4_parallel_for(f->pool, (int)n, 1, gen_range, &j);
    return G4_OK;
}

g4_status g4_synth_write(const char *config_json, const g4_synth_options *o, const g4_model_writer *w, g4_error *err) {
    g4_synth_options opt = {0};
    if (o) opt = *o;
    g4_config cfg;
    g4_status st = g4_config_parse(config_json, "synthetic config", &cfg, err);
    if (st) {
        w->abort(w->ctx);
        return st;
    }
    synth_fill f = {NULL, opt.seed};
    st = g4_threadpool_create(opt.n_threads, &f.pool, err);
    if (st) w->abort(w->ctx);
    else st = stream(config_json, &cfg, w, synth_fill_fn, &f, err);
    g4_threadpool_free(f.pool);
    g4_config_free(&cfg);
    return st;
}

/* ---- conversion -------------------------------------------------------------------------------- */

typedef struct {
    g4_model *m;
    g4_threadpool *pool;
    g4_tensor_ref ref;
    char name[96];
} conv_fill;

typedef struct {
    const g4_mat *mat;
    int64_t r0;
    float *buf;
} deq_job;

static void deq_range(void *ctx, int b, int e, int tid) {
    (void)tid;
    const deq_job *j = ctx;
    for (int r = b; r < e; r++) g4_mat_row_f32(j->mat, (int)(j->r0 + r), j->buf + (size_t)r * (size_t)j->mat->cols);
}

static g4_status conv_fill_fn(void *ctx, const g4_tensor_desc *t, int64_t r0, int64_t n, float *buf, g4_error *err) {
    conv_fill *f = ctx;
    if (strcmp(f->name, t->name)) {
        int found = 0;
        g4_status st = f->m->src.find(f->m->src.ctx, t->name, &f->ref, &found, err);
        if (st) return st;
        if (!found) return g4_fail(err, G4_ERR_TENSOR, "%s: missing tensor '%s'", f->m->path, t->name);
        int ok = f->ref.ndim == t->ndim;
        for (int i = 0; ok && i < t->ndim; i++) ok = f->ref.shape[i] == t->shape[i];
        if (!ok || f->ref.mat.rows != desc_rows(t) || f->ref.mat.cols != desc_cols(t))
            return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' does not have the shape config.json implies",
                           f->ref.file ? f->ref.file : f->m->path, f->ref.name);
        snprintf(f->name, sizeof f->name, "%s", t->name);
    }
    deq_job j = {&f->ref.mat, r0, buf};
    g4_parallel_for(f->pool, (int)n, 1, deq_range, &j);
    return G4_OK;
}

g4_status g4_convert(const char *in_path, const g4_model_writer *w, int n_threads, g4_error *err) {
    if (g4_is_drafter_path(in_path)) return g4_convert_drafter(in_path, w, err);
    conv_fill f = {0};
    char *json = NULL;
    g4_status st = g4_model_load(in_path, NULL, &f.m, err);
    if (!st) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", in_path);
        if (g4_read_file(path, &json, NULL, NULL)) st = g4_config_to_json(&f.m->cfg, &json, err);
    }
    if (!st) st = g4_threadpool_create(n_threads, &f.pool, err);
    if (st) {
        w->abort(w->ctx);
    } else {
        st = stream(json, &f.m->cfg, w, conv_fill_fn, &f, err);
    }
    free(json);
    g4_threadpool_free(f.pool);
    g4_model_free(f.m);
    return st;
}

/* ---- in memory ------------------------------------------------------------------------------------ */

typedef struct {
    const g4_config *cfg;
    g4_synth_options o;
    g4_dtype model_dtype; /* config.json "dtype" (QAT storage reports it, as source_qat.c does) */
    int store;           /* S_* */
    int bits;
    g4_threadpool *pool;
    g4_tensor_desc *t;
    int n;
    void **mem;          /* [n] generated storage (NULL until found) */
    g4_tensor_ref *refs; /* [n] */
} mem_source;

enum { S_F32, S_F16, S_BF16, S_MLX, S_QAT };

typedef struct {
    const mem_source *s;
    const g4_tensor_desc *t;
    const g4_tensor_ref *ref;
    float *scratch;      /* [threads][2·cols] */
} mem_job;

static void mem_range(void *ctx, int b, int e, int tid) {
    const mem_job *j = ctx;
    const g4_mat *m = &j->ref->mat;
    int64_t cols = desc_cols(j->t);
    float *row = j->scratch + (size_t)tid * 2 * (size_t)cols, *sb = row + cols;
    for (int r = b; r < e; r++) {
        g4_synth_rows(j->t, j->s->o.seed, r, 1, row);
        uint8_t *dst = (uint8_t *)m->data + (size_t)r * m->row_bytes;
        if (m->type == G4_W_F32) {
            memcpy(dst, row, sizeof(float) * (size_t)cols);
        } else if (m->type == G4_W_BF16) {
            for (int64_t c = 0; c < cols; c++) ((uint16_t *)dst)[c] = g4_f32_to_bf16(row[c]);
        } else if (m->type == G4_W_F16) {
            for (int64_t c = 0; c < cols; c++) ((uint16_t *)dst)[c] = g4_f32_to_f16(row[c]);
        } else if (m->type == G4_W_AFFINE) {
            int ng = (int)(cols / m->group);
            g4_quantize_row_affine(row, (int)cols, m->bits, m->group, (uint32_t *)dst, sb, sb + ng);
            uint16_t *sc = (uint16_t *)m->scales + (size_t)r * m->scale_stride;
            uint16_t *bi = (uint16_t *)m->biases + (size_t)r * m->scale_stride;
            for (int g = 0; g < ng; g++) {
                sc[g] = g4_f32_to_bf16(sb[g]);
                bi[g] = g4_f32_to_bf16(sb[ng + g]);
            }
        } else { /* SYMM */
            int64_t gs = m->group;
            for (size_t g = 0; g < m->scale_stride; g++)
                ((float *)m->scales)[(size_t)r * m->scale_stride + g] =
                    g4_quantize_row_symm(row + g * (size_t)gs, (int)gs, m->bits, dst + g * (size_t)gs * (size_t)m->bits / 8);
        }
    }
}

/* The storage the matching writer would use for tensor t. */
static void mem_layout(const mem_source *s, const g4_tensor_desc *t, int *type, int *bits, int *group, int *blocks) {
    int64_t cols = desc_cols(t);
    size_t n = strlen(t->name);
    int mat = (t->ndim == 2 && n > 7 && !strcmp(t->name + n - 7, ".weight")) || t->ndim == 3;
    *bits = 0;
    *group = 0;
    *blocks = 1;
    if (s->store == S_MLX && mat) {
        int b = s->bits, g = 64;
        if (strstr(t->name, "router")) b = 8;
        if (cols % g == 0) {
            *type = G4_W_AFFINE;
            *bits = b;
            *group = g;
            return;
        }
    }
    const int qbits = s->store != S_QAT ? 0 : s->bits ? s->bits : g4_qat_mixed_bits(s->cfg, t->name); /* bits 0: "qat" */
    if (s->store == S_QAT && mat && t->ndim == 2 && cols % 32 == 0 && !strstr(t->name, "router") &&
        strcmp(t->name, "per_layer_model_projection.weight") && qbits) {
        *type = G4_W_SYMM;
        *bits = qbits;
        int P = s->cfg->ple_width;
        if (t->role == G4_TR_PLE_EMBED && P % 32 == 0 && cols % P == 0) *blocks = (int)(cols / P);
        *group = (int)(cols / *blocks);
        return;
    }
    *type = s->store == S_F32 || s->store == S_QAT ? G4_W_F32 : s->store == S_F16 ? G4_W_F16 : G4_W_BF16;
}

static g4_status mem_find(void *ctx, const char *name, g4_tensor_ref *out, int *found, g4_error *err) {
    mem_source *s = ctx;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    *found = 0;
    int i = 0;
    while (i < s->n && strcmp(s->t[i].name, name)) i++;
    if (i == s->n) return G4_OK;
    *found = 1;
    if (s->mem[i]) {
        *out = s->refs[i];
        return G4_OK;
    }
    const g4_tensor_desc *t = &s->t[i];
    int type, bits, group, blocks;
    mem_layout(s, t, &type, &bits, &group, &blocks);
    int64_t rows = desc_rows(t), cols = desc_cols(t);
    g4_mat m = {0};
    m.type = (g4_wtype)type;
    m.rows = (int)rows;
    m.cols = (int)cols;
    m.bits = bits;
    m.group = group;
    size_t scale_bytes = 0;
    if (type == G4_W_AFFINE) {
        m.row_bytes = (size_t)cols * (size_t)bits / 8;
        m.scale_dtype = G4_DT_BF16;
        m.scale_stride = (size_t)(cols / group);
        scale_bytes = 2 * m.scale_stride * 2;
    } else if (type == G4_W_SYMM) {
        m.row_bytes = (size_t)cols * (size_t)bits / 8;
        m.scale_dtype = G4_DT_F32;
        m.scale_stride = (size_t)blocks;
        scale_bytes = 4 * (size_t)blocks;
    } else {
        m.row_bytes = (size_t)cols * (type == G4_W_F32 ? 4 : 2);
    }
    size_t total = (m.row_bytes + scale_bytes) * (size_t)rows;
    uint8_t *mem = malloc(total ? total : 1);
    float *scratch = malloc(sizeof(float) * 2 * (size_t)cols * (size_t)g4_threadpool_size(s->pool));
    if (!mem || !scratch) {
        free(mem);
        free(scratch);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory generating synthetic tensor '%s' (%zu bytes)", name, total);
    }
    m.data = mem;
    if (type == G4_W_AFFINE) {
        m.scales = mem + m.row_bytes * (size_t)rows;
        m.biases = (uint8_t *)m.scales + m.scale_stride * 2 * (size_t)rows;
    } else if (type == G4_W_SYMM) {
        m.scales = mem + m.row_bytes * (size_t)rows;
    }
    out->file = "synthetic";
    out->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) out->shape[d] = t->shape[d];
    out->mat = m;
    out->float_dtype = s->store == S_QAT ? s->model_dtype
                       : s->store == S_F32 ? G4_DT_F32 : s->store == S_F16 ? G4_DT_F16 : G4_DT_BF16;
    mem_job j = {s, t, out, scratch};
    g4_parallel_for(s->pool, (int)rows, 1, mem_range, &j);
    free(scratch);
    s->mem[i] = mem;
    s->refs[i] = *out;
    return G4_OK;
}

static void mem_close(void *ctx) {
    mem_source *s = ctx;
    for (int i = 0; i < s->n; i++) free(s->mem[i]);
    free(s->mem);
    free(s->refs);
    free(s->t);
    g4_threadpool_free(s->pool);
    free(s);
}

/* config.json "dtype" / "torch_dtype" (text_config first); F32 when absent, as HF defaults. */
static g4_dtype json_dtype(const char *json) {
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const cJSON *objs[2] = {cJSON_IsObject(tc) ? tc : NULL, root};
    g4_dtype dt = G4_DT_F32;
    int found = 0;
    for (int o = 0; o < 2 && !found; o++)
        for (int k = 0; k < 2 && objs[o] && !found; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(objs[o], k ? "torch_dtype" : "dtype");
            if (!cJSON_IsString(v)) continue;
            found = 1;
            dt = !strcmp(v->valuestring, "bfloat16") ? G4_DT_BF16 : !strcmp(v->valuestring, "float16") ? G4_DT_F16 : G4_DT_F32;
        }
    cJSON_Delete(root);
    return dt;
}

g4_status g4_source_open_synth(g4_weight_source *src, const g4_config *cfg, const char *config_json,
                               const g4_synth_options *o, const char *storage, g4_error *err) {
    memset(src, 0, sizeof *src);
    mem_source *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    s->cfg = cfg;
    s->model_dtype = json_dtype(config_json);
    if (o) s->o = *o;
    const char *st_name = storage ? storage : "bf16";
    char *end = NULL;
    if (!strcmp(st_name, "bf16")) s->store = S_BF16;
    else if (!strcmp(st_name, "f16")) s->store = S_F16;
    else if (!strcmp(st_name, "f32")) s->store = S_F32;
    else if (!strncmp(st_name, "mlx-", 4) && (s->bits = (int)strtol(st_name + 4, &end, 10), *end == 0) &&
             s->bits >= 2 && s->bits <= 8 && s->bits != 7)
        s->store = S_MLX;
    else if (!strncmp(st_name, "qat-int", 7) && (s->bits = (int)strtol(st_name + 7, &end, 10), *end == 0) &&
             (s->bits == 2 || s->bits == 4 || s->bits == 8))
        s->store = S_QAT;
    else if (!strcmp(st_name, "qat")) /* the mixed 2/4/8-bit recipe of the qat writer (bits 0) */
        s->store = S_QAT;
    else {
        free(s);
        return g4_fail(err, G4_ERR_ARG, "unknown synthetic storage '%s' (bf16, f16, f32, mlx-N, qat, qat-intN)", st_name);
    }
    g4_status st = g4_model_tensor_list(cfg, &s->t, &s->n, err);
    if (!st) st = g4_threadpool_create(s->o.n_threads, &s->pool, err);
    if (!st && (!(s->mem = calloc((size_t)s->n, sizeof *s->mem)) || !(s->refs = calloc((size_t)s->n, sizeof *s->refs))))
        st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    if (st) {
        mem_close(s);
        return st;
    }
    src->ctx = s;
    src->path = "synthetic";
    src->find = mem_find;
    src->close = mem_close;
    return G4_OK;
}

g4_status g4_model_synth(const char *arch, const g4_synth_options *o, const char *storage, g4_model **out,
                         g4_error *err) {
    *out = NULL;
    char *json = NULL;
    g4_status st;
    if (arch && arch[0] == '{') {
        if (!(json = strdup(arch))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        st = G4_OK;
    } else {
        st = g4_synth_config_json(arch, o ? o->n_layers : 0, &json, err);
    }
    if (st) return st;
    g4_model *m = calloc(1, sizeof *m);
    char path[128];
    snprintf(path, sizeof path, "synthetic:%s", arch && arch[0] != '{' ? arch : "config");
    if (!m || !(m->path = strdup(path))) {
        free(m);
        free(json);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    st = g4_config_parse(json, path, &m->cfg, err);
    if (!st) st = g4_source_open_synth(&m->src, &m->cfg, json, o, storage, err);
    free(json);
    if (!st) st = g4_model_bind(m, err);
    if (!st && !(o && o->keep_layout)) { /* in memory the original stays too: repack only while both fit comfortably */
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        size_t ram = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
        st = g4_model_repack(m, ram / 3, err);
    }
    if (st) {
        g4_model_free(m);
        return st;
    }
    *out = m;
    return G4_OK;
}
