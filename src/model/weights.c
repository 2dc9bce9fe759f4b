#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "cpu/kernels_internal.h"
#include "cpu/quant.h"
#include "model/model.h"
#include "util/mapped_file.h"
#include "util/error.h"

typedef g4_binder binder;

static g4_status find(binder *b, const char *name, g4_tensor_ref *out) {
    int found = 0;
    g4_status st = b->src->find(b->src->ctx, name, out, &found, b->err);
    if (st) return st;
    if (!found)
        return g4_fail(b->err, G4_ERR_TENSOR, "%s: missing tensor '%s'", b->src->path, out->name[0] ? out->name : name);
    return G4_OK;
}

static g4_status shape_error(binder *b, const g4_tensor_ref *t, const char *want) {
    char got[128] = "", *p = got;
    for (int i = 0; i < t->ndim; i++)
        p += snprintf(p, (size_t)(got + sizeof got - p), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    return g4_fail(b->err, G4_ERR_TENSOR, "%s: tensor '%s' has shape [%s]; config.json implies [%s]", t->file,
                   t->name, got, want);
}

/* A matrix [rows, cols]; with `experts` > 0 a 3-D [experts, rows, cols] viewed as 2-D. */
g4_status g4_bind_mat(binder *b, const char *name, int experts, int rows, int cols, g4_mat *out,
                           g4_tensor_ref *ref) {
    g4_tensor_ref t;
    g4_status st = find(b, name, &t);
    if (st) return st;
    int ok = experts ? (t.ndim == 3 && t.shape[0] == experts && t.shape[1] == rows && t.shape[2] == cols)
                     : (t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols);
    if (!ok) {
        char want[96];
        if (experts) snprintf(want, sizeof want, "%d, %d, %d", experts, rows, cols);
        else snprintf(want, sizeof want, "%d, %d", rows, cols);
        return shape_error(b, &t, want);
    }
    *out = t.mat;
    if (ref) *ref = t;
    if (b->bytes) *b->bytes += g4_mat_bytes(&t.mat);
    return G4_OK;
}

static g4_status bind_mat(binder *b, const char *name, int rows, int cols, g4_mat *out) {
    return g4_bind_mat(b, name, 0, rows, cols, out, NULL);
}

/* A vector of n floats converted into the arena. */
g4_status g4_bind_vec(binder *b, const char *name, int n, const float **out) {
    g4_tensor_ref t;
    g4_status st = find(b, name, &t);
    if (st) return st;
    if (t.ndim != 1 || t.shape[0] != n) {
        char want[32];
        snprintf(want, sizeof want, "%d", n);
        return shape_error(b, &t, want);
    }
    if (b->arena_used + (size_t)n > b->arena_cap)
        return g4_fail(b->err, G4_ERR_TENSOR, "%s: internal: vector arena too small", t.file);
    float *dst = b->arena + b->arena_used;
    g4_mat_row_f32(&t.mat, 0, dst);
    b->arena_used += (size_t)n;
    *out = dst;
    return G4_OK;
}

static float round_to_dtype(float v, g4_dtype t) {
    if (t == G4_DT_BF16) return g4_bf16_to_f32(g4_f32_to_bf16(v));
    if (t == G4_DT_F16) return g4_f16_to_f32(g4_f32_to_f16(v));
    return v;
}

g4_status g4_model_bind(g4_model *m, g4_error *err) {
    const g4_config *c = &m->cfg;
    int H = c->hidden, L = c->n_layers, P = c->ple_width;
    /* Count the vector floats: 4 norms per layer + q/k norms + MoE/PLE extras + globals. */
    size_t cap = (size_t)H + (size_t)P + 16;
    for (int i = 0; i < L; i++) {
        cap += 8 * (size_t)H + 2 * (size_t)c->layers[i].head_dim + (size_t)c->n_experts + 16;
    }
    m->arena = malloc(cap * sizeof(float));
    if (!m->arena) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    binder b = {&m->src, m->arena, 0, cap, &m->weight_bytes, err};
    m->layers = calloc((size_t)L, sizeof *m->layers);
    if (!m->layers) return g4_fail(err, G4_ERR_NOMEM, "out of memory");

    g4_status st;
    g4_tensor_ref ref;
    if ((st = g4_bind_mat(&b, "embed_tokens.weight", 0, c->vocab, H, &m->embed, &ref)) ||
        (st = g4_bind_vec(&b, "norm.weight", H, &m->final_norm)))
        return st;
    m->embed_scale = round_to_dtype(sqrtf((float)H), ref.float_dtype);
    if (P > 0) {
        if ((st = g4_bind_mat(&b, "embed_tokens_per_layer.weight", 0, c->ple_vocab, L * P, &m->ple_embed, &ref)) ||
            (st = bind_mat(&b, "per_layer_model_projection.weight", L * P, H, &m->ple_model_proj)) ||
            (st = g4_bind_vec(&b, "per_layer_projection_norm.weight", P, &m->ple_proj_norm)))
            return st;
        /* the PLE table is gathered one row per token, not streamed */
        m->weight_bytes -= g4_mat_bytes(&m->ple_embed);
        m->ple_embed_scale = round_to_dtype(sqrtf((float)P), ref.float_dtype);
    }
    for (int i = 0; i < L && !st; i++) {
        const g4_layer_config *lc = &c->layers[i];
        g4_layer_weights *w = &m->layers[i];
        int d = lc->head_dim, nq = c->n_heads * d, nkv = lc->n_kv_heads * d, I = lc->mlp_width;
        char n[128];
#define NAME(s) (snprintf(n, sizeof n, "layers.%d.%s", i, s), n)
        if ((st = g4_bind_vec(&b, NAME("input_layernorm.weight"), H, &w->attn_norm)) ||
            (st = g4_bind_vec(&b, NAME("post_attention_layernorm.weight"), H, &w->post_attn_norm)) ||
            (st = g4_bind_vec(&b, NAME("pre_feedforward_layernorm.weight"), H, &w->pre_ffn_norm)) ||
            (st = g4_bind_vec(&b, NAME("post_feedforward_layernorm.weight"), H, &w->post_ffn_norm)) ||
            (st = bind_mat(&b, NAME("self_attn.q_proj.weight"), nq, H, &w->wq)) ||
            (st = g4_bind_vec(&b, NAME("self_attn.q_norm.weight"), d, &w->q_norm)) ||
            (st = bind_mat(&b, NAME("self_attn.o_proj.weight"), H, nq, &w->wo)) ||
            (st = bind_mat(&b, NAME("mlp.gate_proj.weight"), I, H, &w->gate)) ||
            (st = bind_mat(&b, NAME("mlp.up_proj.weight"), I, H, &w->up)) ||
            (st = bind_mat(&b, NAME("mlp.down_proj.weight"), H, I, &w->down)))
            break;
        if (lc->kv_source == i) { /* shared layers' k/v weights, if present, are never read */
            if ((st = bind_mat(&b, NAME("self_attn.k_proj.weight"), nkv, H, &w->wk)) ||
                (st = g4_bind_vec(&b, NAME("self_attn.k_norm.weight"), d, &w->k_norm)))
                break;
            if (!lc->k_eq_v && (st = bind_mat(&b, NAME("self_attn.v_proj.weight"), nkv, H, &w->wv))) break;
        }
        if (c->moe) {
            int E = c->n_experts, Im = c->moe_width;
            if ((st = bind_mat(&b, NAME("router.proj.weight"), E, H, &w->router)) ||
                (st = g4_bind_vec(&b, NAME("router.scale"), H, &w->router_scale)) ||
                (st = g4_bind_vec(&b, NAME("router.per_expert_scale"), E, &w->expert_scale)) ||
                (st = g4_bind_mat(&b, NAME("experts.gate_up_proj"), E, 2 * Im, H, &w->experts_gate_up, NULL)) ||
                (st = g4_bind_mat(&b, NAME("experts.down_proj"), E, H, Im, &w->experts_down, NULL)) ||
                (st = g4_bind_vec(&b, NAME("pre_feedforward_layernorm_2.weight"), H, &w->pre_ffn_norm2)) ||
                (st = g4_bind_vec(&b, NAME("post_feedforward_layernorm_1.weight"), H, &w->post_ffn_norm1)) ||
                (st = g4_bind_vec(&b, NAME("post_feedforward_layernorm_2.weight"), H, &w->post_ffn_norm2)))
                break;
            /* a token streams only its top-k experts */
            m->weight_bytes -= (g4_mat_bytes(&w->experts_gate_up) + g4_mat_bytes(&w->experts_down)) / E *
                               (size_t)(E - c->top_k_experts);
        }
        if (P > 0) {
            if ((st = bind_mat(&b, NAME("per_layer_input_gate.weight"), P, H, &w->ple_gate)) ||
                (st = bind_mat(&b, NAME("per_layer_projection.weight"), H, P, &w->ple_proj)) ||
                (st = g4_bind_vec(&b, NAME("post_per_layer_input_norm.weight"), H, &w->post_ple_norm)))
                break;
        }
        const float *scalar;
        if ((st = g4_bind_vec(&b, NAME("layer_scalar"), 1, &scalar))) break;
        w->layer_scalar = scalar[0];
#undef NAME
    }
    return st;
}

/* The matrices a decode step streams (the PLE table is gathered, not streamed). */
static int streamed_mats(g4_model *m, g4_mat **out) {
    int n = 0;
    out[n++] = &m->embed;
    if (m->cfg.ple_width) out[n++] = &m->ple_model_proj;
    for (int i = 0; i < m->cfg.n_layers; i++) {
        g4_layer_weights *w = &m->layers[i];
        g4_mat *all[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->gate, &w->up, &w->down, &w->router,
                         &w->experts_gate_up, &w->experts_down, &w->ple_gate, &w->ple_proj};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
            if (all[k]->data) out[n++] = all[k];
    }
    return n;
}

g4_status g4_model_repack(g4_model *m, size_t max_bytes, g4_error *err) {
    if (g4_isa_best() != G4_ISA_AVX512) return G4_OK; /* the split loops are AVX-512 ones */
    int cap = 2 + 12 * m->cfg.n_layers;
    g4_mat **mats = malloc(sizeof *mats * (size_t)cap);
    if (!mats) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    int n = streamed_mats(m, mats);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += g4_mat_repack_size(mats[i]);
    if (!total || total > max_bytes) {
        free(mats);
        return G4_OK;
    }
    void *mem = g4_map_anon_huge(total);
    if (!mem) {
        free(mats);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory repacking %.2f GB of weights", total / 1e9);
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t sz = g4_mat_repack_size(mats[i]);
        if (!sz) continue;
        g4_mat_repack(mats[i], (uint8_t *)mem + at, mats[i]);
        at += sz;
    }
    free(mats);
    m->repacked = mem;
    m->repacked_size = total;
    return G4_OK;
}
