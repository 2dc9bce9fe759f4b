/* A random-weight drafter for a target model, for benchmarks: the geometry Gemma 4 drafters have
 * (4 layers, 3 sliding + 1 full, every layer reading the target's caches) with an assumed width
 * (released drafters' widths are not in our docs: hidden 256, MLP 2048, 4 query heads, and the
 * centroid head — 2048 centroids, top 32 — for targets with per-layer inputs, as E2B/E4B's
 * drafters have). Weights come from g4_synth_rows, deterministic in the seed. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/synth_drafter.h"
#include "util/error.h"

enum { DRAFT_HIDDEN = 256, DRAFT_MLP = 2048, DRAFT_HEADS = 4, DRAFT_CENTROIDS = 2048, DRAFT_TOPK = 32 };

static int last_layer_of_kind(const g4_config *c, int full) {
    for (int j = c->first_shared - 1; j >= 0; j--)
        if (c->layers[j].is_full == full) return j;
    return -1;
}

static char *drafter_config(const g4_config *t, int ordered) {
    const g4_layer_config *ls = &t->layers[last_layer_of_kind(t, 0)], *lf = &t->layers[last_layer_of_kind(t, 1)];
    cJSON *root = cJSON_CreateObject(), *tc = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model_type", "gemma4_assistant");
    cJSON_AddNumberToObject(root, "backbone_hidden_size", t->hidden);
    cJSON_AddBoolToObject(root, "use_ordered_embeddings", ordered);
    if (ordered) {
        cJSON_AddNumberToObject(root, "num_centroids", DRAFT_CENTROIDS);
        cJSON_AddNumberToObject(root, "centroid_intermediate_top_k", DRAFT_TOPK);
    }
    cJSON_AddItemToObject(root, "text_config", tc);
    cJSON_AddStringToObject(tc, "model_type", "gemma4_text");
    cJSON_AddNumberToObject(tc, "num_hidden_layers", 4);
    cJSON_AddNumberToObject(tc, "hidden_size", DRAFT_HIDDEN);
    cJSON_AddNumberToObject(tc, "intermediate_size", DRAFT_MLP);
    cJSON_AddNumberToObject(tc, "num_attention_heads", DRAFT_HEADS);
    cJSON_AddNumberToObject(tc, "num_key_value_heads", ls->n_kv_heads);
    cJSON_AddNumberToObject(tc, "head_dim", ls->head_dim);
    cJSON_AddBoolToObject(tc, "attention_k_eq_v", t->k_eq_v);
    cJSON *plc = cJSON_AddObjectToObject(tc, "per_layer_config"), *l3 = cJSON_AddObjectToObject(plc, "3");
    cJSON_AddNumberToObject(l3, "head_dim", lf->head_dim);
    cJSON_AddNumberToObject(l3, "num_key_value_heads", lf->n_kv_heads);
    cJSON *types = cJSON_AddArrayToObject(tc, "layer_types");
    for (int i = 0; i < 4; i++) cJSON_AddItemToArray(types, cJSON_CreateString(i == 3 ? "full_attention" : "sliding_attention"));
    cJSON_AddNumberToObject(tc, "sliding_window", t->sliding_window);
    cJSON_AddNumberToObject(tc, "vocab_size", t->vocab);
    cJSON_AddNumberToObject(tc, "num_kv_shared_layers", 4);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

g4_status g4_synth_drafter_write(const g4_model *target, const char *dir, uint64_t seed, g4_error *err) {
    const g4_config *t = &target->cfg;
    int ordered = t->ple_width > 0 && t->vocab % DRAFT_CENTROIDS == 0;
    int h = DRAFT_HIDDEN, H = t->hidden, V = t->vocab;
    if (last_layer_of_kind(t, 0) < 0 || last_layer_of_kind(t, 1) < 0)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "a drafter needs a target with both sliding and full layers");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg = drafter_config(t, ordered);
    FILE *f = fopen(path, "wb");
    if (!f || fputs(cfg, f) == EOF) {
        if (f) fclose(f);
        free(cfg);
        return g4_fail(err, G4_ERR_IO, "%s: cannot write", path);
    }
    fclose(f);
    free(cfg);
    /* tensor list: name, rows, cols, role */
    typedef struct {
        char name[96];
        int64_t rows, cols;
        g4_tensor_role role;
    } tdesc;
    tdesc td[64];
    int n = 0;
#define ADD(nm, r, c, role_) (snprintf(td[n].name, sizeof td[n].name, "%s", nm), td[n].rows = (r), td[n].cols = (c), td[n].role = (role_), n++)
    ADD("pre_projection.weight", h, 2 * H, G4_TR_MATRIX);
    ADD("post_projection.weight", H, h, G4_TR_MATRIX);
    ADD("model.embed_tokens.weight", V, h, G4_TR_EMBED);
    ADD("model.norm.weight", 1, h, G4_TR_NORM);
    if (ordered) ADD("masked_embedding.centroids.weight", DRAFT_CENTROIDS, h, G4_TR_MATRIX);
    const g4_layer_config *ls = &t->layers[last_layer_of_kind(t, 0)], *lf = &t->layers[last_layer_of_kind(t, 1)];
    for (int i = 0; i < 4; i++) {
        int d = i == 3 ? lf->head_dim : ls->head_dim, nq = DRAFT_HEADS * d;
        char nm[96];
#define L(s, r, c, role_) (snprintf(nm, sizeof nm, "model.layers.%d.%s", i, s), ADD(nm, r, c, role_))
        L("input_layernorm.weight", 1, h, G4_TR_NORM);
        L("post_attention_layernorm.weight", 1, h, G4_TR_NORM);
        L("pre_feedforward_layernorm.weight", 1, h, G4_TR_NORM);
        L("post_feedforward_layernorm.weight", 1, h, G4_TR_NORM);
        L("self_attn.q_proj.weight", nq, h, G4_TR_MATRIX);
        L("self_attn.q_norm.weight", 1, d, G4_TR_NORM);
        L("self_attn.o_proj.weight", h, nq, G4_TR_MATRIX);
        L("mlp.gate_proj.weight", DRAFT_MLP, h, G4_TR_MATRIX);
        L("mlp.up_proj.weight", DRAFT_MLP, h, G4_TR_MATRIX);
        L("mlp.down_proj.weight", h, DRAFT_MLP, G4_TR_MATRIX);
        L("layer_scalar", 1, 1, G4_TR_SCALAR);
#undef L
    }
#undef ADD
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    g4_st_writer *w;
    g4_status st = g4_st_writer_create(path, &w, err);
    if (st) return st;
    for (int i = 0; i < n && !st; i++) {
        int64_t shape[2] = {td[i].rows, td[i].cols};
        int vec = td[i].role == G4_TR_NORM || td[i].role == G4_TR_SCALAR;
        st = g4_st_writer_declare(w, td[i].name, G4_DT_BF16, vec ? 1 : 2, vec ? shape + 1 : shape, err);
    }
    int64_t vshape[1] = {V};
    if (!st && ordered) st = g4_st_writer_declare(w, "masked_embedding.token_ordering", G4_DT_I64, 1, vshape, err);
    if (!st) st = g4_st_writer_begin_data(w, err);
    size_t maxcols = (size_t)(2 * H > DRAFT_MLP ? 2 * H : DRAFT_MLP);
    float *row = malloc(sizeof(float) * maxcols);
    uint16_t *out = malloc(sizeof(uint16_t) * maxcols);
    if (!st && (!row || !out)) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !st; i++) {
        g4_tensor_desc desc = {0};
        snprintf(desc.name, sizeof desc.name, "drafter.%.80s", td[i].name);
        desc.ndim = 2;
        desc.shape[0] = td[i].rows;
        desc.shape[1] = td[i].cols;
        desc.role = td[i].role;
        desc.fan_in = (int)td[i].cols;
        for (int64_t r = 0; r < td[i].rows && !st; r++) {
            g4_synth_rows(&desc, seed, r, 1, row);
            for (int64_t c = 0; c < td[i].cols; c++) out[c] = g4_f32_to_bf16(row[c]);
            st = g4_st_writer_write(w, out, sizeof(uint16_t) * (size_t)td[i].cols, err);
        }
    }
    free(row);
    free(out);
    if (!st && ordered) { /* each centroid owns a contiguous run of ids: a fixed interleaving */
        int per = V / DRAFT_CENTROIDS;
        for (int64_t i = 0; i < V && !st; i++) {
            int64_t v = (i % per) * DRAFT_CENTROIDS + i / per;
            st = g4_st_writer_write(w, &v, sizeof v, err);
        }
    }
    if (st) {
        g4_st_writer_abort(w);
        return st;
    }
    return g4_st_writer_finish(w, err);
}
