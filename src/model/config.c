#include "model/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/mapped_file.h"

/* Limits that keep every size product far from overflow; released models are far inside. */
enum { MAX_LAYERS = 1024, MAX_HIDDEN = 1 << 16, MAX_HEADS = 1024, MAX_HEAD_DIM = 4096,
       MAX_VOCAB = 1 << 24, MAX_WIDTH = 1 << 20, MAX_EXPERTS = 4096 };

typedef struct {
    const cJSON *obj;
    const char *path;
    g4_error *err;
} reader;

/* Reads an integer field. Missing or null → def (or an error when def < -1 means required). */
static g4_status get_int(const reader *r, const char *key, long def, long lo, long hi, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < -1) return g4_fail(r->err, G4_ERR_CONFIG, "%s: missing required field \"%s\"", r->path, key);
        *out = (int)def;
        return G4_OK;
    }
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
        return G4_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return g4_fail(r->err, G4_ERR_CONFIG, "%s: field \"%s\" must be an integer", r->path, key);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return g4_fail(r->err, G4_ERR_CONFIG, "%s: field \"%s\" = %.0f is outside [%ld, %ld]", r->path,
                       key, v->valuedouble, lo, hi);
    *out = (int)v->valuedouble;
    return G4_OK;
}

static g4_status get_float(const reader *r, const char *key, double def, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = (float)def;
        return G4_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return g4_fail(r->err, G4_ERR_CONFIG, "%s: field \"%s\" must be a number", r->path, key);
    *out = (float)v->valuedouble;
    return G4_OK;
}

static int get_bool(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsTrue(v) || (cJSON_IsNumber(v) && v->valuedouble != 0);
}

/* rope_parameters.{sliding_attention,full_attention}: theta and partial_rotary_factor. */
static g4_status read_rope(const reader *r, const char *kind, double theta_def, double partial_def,
                           float *theta, float *partial) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(r->obj, "rope_parameters");
    const cJSON *k = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, kind) : NULL;
    reader sub = {k, r->path, r->err};
    *theta = (float)theta_def;
    *partial = (float)partial_def;
    if (!cJSON_IsObject(k)) return G4_OK;
    g4_status st = get_float(&sub, "rope_theta", theta_def, theta);
    if (!st) st = get_float(&sub, "partial_rotary_factor", partial_def, partial);
    if (st) return st;
    if (!(*theta > 0)) return g4_fail(r->err, G4_ERR_CONFIG, "%s: rope_theta for %s must be positive", r->path, kind);
    if (!(*partial > 0 && *partial <= 1))
        return g4_fail(r->err, G4_ERR_CONFIG, "%s: partial_rotary_factor for %s must be in (0, 1]", r->path, kind);
    return G4_OK;
}

/* drafter: every layer reads another model's K/V, so all layers may be "shared" and kv_source is
 * left at -1 for the caller to resolve against the target. */
static g4_status parse_text_config(const cJSON *tc, const char *path, int drafter, g4_config *c,
                                   g4_error *err) {
    reader r = {tc, path, err};
    g4_status st;
    int sliding_kv, head_dim, global_head_dim, global_kv;
    if ((st = get_int(&r, "num_hidden_layers", -2, 1, MAX_LAYERS, &c->n_layers)) ||
        (st = get_int(&r, "hidden_size", -2, 1, MAX_HIDDEN, &c->hidden)) ||
        (st = get_int(&r, "num_attention_heads", -2, 1, MAX_HEADS, &c->n_heads)) ||
        (st = get_int(&r, "num_key_value_heads", -2, 1, MAX_HEADS, &sliding_kv)) ||
        (st = get_int(&r, "head_dim", -2, 1, MAX_HEAD_DIM, &head_dim)) ||
        (st = get_int(&r, "global_head_dim", head_dim, 1, MAX_HEAD_DIM, &global_head_dim)) ||
        (st = get_int(&r, "num_global_key_value_heads", 0, 0, MAX_HEADS, &global_kv)) ||
        (st = get_int(&r, "vocab_size", 262144, 1, MAX_VOCAB, &c->vocab)) ||
        (st = get_int(&r, "sliding_window", -2, -MAX_VOCAB, 1 << 30, &c->sliding_window)) ||
        (st = get_int(&r, "num_kv_shared_layers", 0, -MAX_LAYERS, MAX_LAYERS, &c->n_kv_shared)) ||
        (st = get_int(&r, "intermediate_size", -2, 1, MAX_WIDTH, &c->intermediate)) ||
        (st = get_int(&r, "hidden_size_per_layer_input", 0, 0, MAX_WIDTH, &c->ple_width)) ||
        (st = get_int(&r, "vocab_size_per_layer_input", c->vocab, 0, MAX_VOCAB, &c->ple_vocab)) ||
        (st = get_int(&r, "max_position_embeddings", 131072, 1, 1 << 30, &c->max_positions)) ||
        (st = get_int(&r, "bos_token_id", 2, 0, MAX_VOCAB, &c->bos)) ||
        (st = get_int(&r, "pad_token_id", 0, 0, MAX_VOCAB, &c->pad)) ||
        (st = get_float(&r, "rms_norm_eps", 1e-6, &c->rms_eps)) ||
        (st = get_float(&r, "final_logit_softcapping", 0, &c->final_softcap)))
        return st;
    /* eos_token_id may be a list; the first entry is the model's end of sequence. */
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(tc, "eos_token_id");
    if (cJSON_IsArray(eos)) eos = eos->child;
    c->eos = cJSON_IsNumber(eos) ? eos->valueint : 1;
    c->double_wide = get_bool(tc, "use_double_wide_mlp");
    c->k_eq_v = get_bool(tc, "attention_k_eq_v");
    c->moe = get_bool(tc, "enable_moe_block");
    c->head_dim_sliding = head_dim;
    c->head_dim_full = global_head_dim;
    if (c->sliding_window <= 0)
        return g4_fail(err, G4_ERR_CONFIG, "%s: sliding_window must be positive (got %d)", path, c->sliding_window);
    if (drafter) c->n_kv_shared = c->n_layers;
    else if (c->n_kv_shared < 0 || c->n_kv_shared >= c->n_layers)
        return g4_fail(err, G4_ERR_CONFIG,
                       "%s: num_kv_shared_layers = %d must be in [0, num_hidden_layers = %d)", path,
                       c->n_kv_shared, c->n_layers);
    if (c->rms_eps <= 0) return g4_fail(err, G4_ERR_CONFIG, "%s: rms_norm_eps must be positive", path);
    if (c->final_softcap < 0) return g4_fail(err, G4_ERR_CONFIG, "%s: final_logit_softcapping must not be negative", path);
    if (c->moe) {
        if ((st = get_int(&r, "num_experts", -2, 1, MAX_EXPERTS, &c->n_experts)) ||
            (st = get_int(&r, "top_k_experts", -2, 1, MAX_EXPERTS, &c->top_k_experts)) ||
            (st = get_int(&r, "moe_intermediate_size", -2, 1, MAX_WIDTH, &c->moe_width)))
            return st;
        if (c->top_k_experts > c->n_experts)
            return g4_fail(err, G4_ERR_CONFIG, "%s: top_k_experts = %d exceeds num_experts = %d", path,
                           c->top_k_experts, c->n_experts);
    }
    if (c->ple_width > 0 && c->ple_vocab <= 0)
        return g4_fail(err, G4_ERR_CONFIG, "%s: vocab_size_per_layer_input must be positive", path);

    int L = c->n_layers;
    c->layers = calloc((size_t)L, sizeof *c->layers);
    if (!c->layers) return g4_fail(err, G4_ERR_NOMEM, "out of memory");

    /* layer types */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(tc, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != L)
            return g4_fail(err, G4_ERR_CONFIG, "%s: layer_types must list exactly %d layer types", path, L);
        int i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")) c->layers[i].is_full = 1;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention")) c->layers[i].is_full = 0;
            else
                return g4_fail(err, G4_ERR_CONFIG, "%s: layer_types[%d] is not \"sliding_attention\" or \"full_attention\"",
                               path, i);
        }
    } else {
        /* The default pattern: every 6th layer full, and the last layer always full. */
        for (int i = 0; i < L; i++) c->layers[i].is_full = (i + 1) % 6 == 0 || i == L - 1;
    }

    float th_s, th_f, pr_s, pr_f;
    if ((st = read_rope(&r, "sliding_attention", 10000.0, 1.0, &th_s, &pr_s)) ||
        (st = read_rope(&r, "full_attention", 1000000.0, 0.25, &th_f, &pr_f)))
        return st;

    for (int i = 0; i < L; i++) {
        g4_layer_config *l = &c->layers[i];
        l->head_dim = l->is_full ? global_head_dim : head_dim;
        l->n_kv_heads = (l->is_full && c->k_eq_v && global_kv > 0) ? global_kv : sliding_kv;
        l->k_eq_v = l->is_full && c->k_eq_v;
    }
    /* per_layer_config: {"<index, maybe zero-padded>": {"head_dim": .., "num_key_value_heads": ..}} */
    const cJSON *plc = cJSON_GetObjectItemCaseSensitive(tc, "per_layer_config");
    if (cJSON_IsObject(plc)) {
        for (const cJSON *e = plc->child; e; e = e->next) {
            char *end;
            long idx = strtol(e->string, &end, 10);
            if (!*e->string || *end || idx < 0 || idx >= L || !cJSON_IsObject(e))
                return g4_fail(err, G4_ERR_CONFIG, "%s: per_layer_config key \"%s\" is not a layer index in [0, %d)",
                               path, e->string, L);
            reader lr = {e, path, err};
            g4_layer_config *l = &c->layers[idx];
            if ((st = get_int(&lr, "head_dim", l->head_dim, 1, MAX_HEAD_DIM, &l->head_dim)) ||
                (st = get_int(&lr, "num_key_value_heads", l->n_kv_heads, 1, MAX_HEADS, &l->n_kv_heads)))
                return st;
        }
    }

    c->first_shared = L - c->n_kv_shared;
    for (int i = 0; i < L; i++) {
        g4_layer_config *l = &c->layers[i];
        if (l->head_dim % 2)
            return g4_fail(err, G4_ERR_CONFIG, "%s: layer %d: head_dim %d is odd (RoPE rotates pairs)", path, i, l->head_dim);
        if (c->n_heads % l->n_kv_heads)
            return g4_fail(err, G4_ERR_CONFIG,
                           "%s: layer %d: num_attention_heads = %d is not a multiple of its %d KV heads",
                           path, i, c->n_heads, l->n_kv_heads);
        l->rope_theta = l->is_full ? th_f : th_s;
        l->rope_pairs = (int)((l->is_full ? pr_f : pr_s) * (float)l->head_dim / 2.0f);
        l->mlp_width = c->intermediate * ((c->double_wide && i >= c->first_shared) ? 2 : 1);
        l->kv_source = i;
        if (drafter) {
            l->kv_source = -1;
        } else if (i >= c->first_shared) {
            l->kv_source = -1;
            for (int j = c->first_shared - 1; j >= 0; j--)
                if (c->layers[j].is_full == l->is_full) {
                    l->kv_source = j;
                    break;
                }
            if (l->kv_source < 0)
                return g4_fail(err, G4_ERR_CONFIG,
                               "%s: layer %d is KV-shared but no earlier non-shared %s layer exists", path,
                               i, l->is_full ? "full-attention" : "sliding");
            const g4_layer_config *s = &c->layers[l->kv_source];
            if (s->head_dim != l->head_dim || s->n_kv_heads != l->n_kv_heads)
                return g4_fail(err, G4_ERR_CONFIG,
                               "%s: layer %d shares the K/V of layer %d but their head geometry differs",
                               path, i, l->kv_source);
        }
    }
    return G4_OK;
}

g4_status g4_config_parse(const char *json, const char *path, g4_config *c, g4_error *err) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g4_fail(err, G4_ERR_CONFIG, "%s: not a JSON object", path);
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    g4_status st = G4_OK;
    if (cJSON_IsObject(tc)) {
        c->multimodal_layout = 1;
        const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
        if (!*type && cJSON_IsString(tmt)) type = tmt->valuestring;
    } else {
        tc = root;
    }
    if (!strcmp(type, "gemma4") || !strcmp(type, "gemma4_text"))
        snprintf(c->arch, sizeof c->arch, "gemma4");
    else if (!strcmp(type, "gemma4_unified") || !strcmp(type, "gemma4_unified_text"))
        snprintf(c->arch, sizeof c->arch, "gemma4_unified");
    else if (strstr(type, "assistant"))
        st = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: model_type \"%s\" is a drafter, not a target model", path, type);
    else if (!*type)
        st = g4_fail(err, G4_ERR_CONFIG, "%s: missing \"model_type\"", path);
    else
        st = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not a Gemma 4 model", path, type);
    if (!st) st = parse_text_config(tc, path, 0, c, err);
    cJSON_Delete(root);
    if (st) g4_config_free(c);
    return st;
}

g4_status g4_config_load(const char *dir, g4_config *c, g4_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    memset(c, 0, sizeof *c);
    g4_status st = g4_read_file(path, &text, NULL, err);
    if (st) return st;
    st = g4_config_parse(text, path, c, err);
    free(text);
    return st;
}

void g4_config_free(g4_config *c) {
    free(c->layers);
    c->layers = NULL;
}

/* ---- released sizes ------------------------------------------------------------------------ */

typedef struct {
    const char *name, *model_type;
    int layers, hidden, heads, kv, global_kv, k_eq_v, window, period, inter, double_wide, ple, shared;
    int experts, top_k, moe_inter, max_pos;
} released;

static const released released_sizes[] = {
    {"e2b", "gemma4", 35, 1536, 8, 1, 0, 0, 512, 5, 6144, 1, 256, 20, 0, 0, 0, 131072},
    {"e4b", "gemma4", 42, 2560, 8, 2, 0, 0, 512, 6, 10240, 0, 256, 18, 0, 0, 0, 131072},
    {"12b", "gemma4_unified", 48, 3840, 16, 8, 1, 1, 1024, 6, 15360, 0, 0, 0, 0, 0, 0, 262144},
    {"26b-a4b", "gemma4", 30, 2816, 16, 8, 2, 1, 1024, 6, 2112, 0, 0, 0, 128, 8, 704, 262144},
    {"31b", "gemma4", 60, 5376, 32, 16, 4, 1, 1024, 6, 21504, 0, 0, 0, 0, 0, 0, 262144},
};

char *g4_released_config_json(const char *arch) {
    const released *r = NULL;
    for (size_t i = 0; i < sizeof released_sizes / sizeof *released_sizes; i++)
        if (!strcmp(arch, released_sizes[i].name)) r = &released_sizes[i];
    if (!r) return NULL;
    int unified = !strcmp(r->model_type, "gemma4_unified");
    cJSON *root = cJSON_CreateObject(), *tc = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(unified ? "Gemma4UnifiedForConditionalGeneration"
                                                           : "Gemma4ForConditionalGeneration"));
    cJSON_AddStringToObject(root, "model_type", r->model_type);
    cJSON_AddItemToObject(root, "text_config", tc);
    cJSON_AddStringToObject(tc, "model_type", unified ? "gemma4_unified_text" : "gemma4_text");
    cJSON_AddStringToObject(tc, "dtype", "bfloat16");
    cJSON_AddNumberToObject(tc, "num_hidden_layers", r->layers);
    cJSON_AddNumberToObject(tc, "hidden_size", r->hidden);
    cJSON_AddNumberToObject(tc, "num_attention_heads", r->heads);
    cJSON_AddNumberToObject(tc, "num_key_value_heads", r->kv);
    if (r->global_kv) cJSON_AddNumberToObject(tc, "num_global_key_value_heads", r->global_kv);
    cJSON_AddBoolToObject(tc, "attention_k_eq_v", r->k_eq_v);
    cJSON_AddNumberToObject(tc, "head_dim", 256);
    cJSON_AddNumberToObject(tc, "global_head_dim", 512);
    cJSON_AddNumberToObject(tc, "sliding_window", r->window);
    cJSON *types = cJSON_AddArrayToObject(tc, "layer_types");
    for (int i = 0; i < r->layers; i++)
        cJSON_AddItemToArray(types, cJSON_CreateString((i + 1) % r->period ? "sliding_attention" : "full_attention"));
    cJSON_AddNumberToObject(tc, "intermediate_size", r->inter);
    cJSON_AddBoolToObject(tc, "use_double_wide_mlp", r->double_wide);
    cJSON_AddNumberToObject(tc, "hidden_size_per_layer_input", r->ple);
    cJSON_AddNumberToObject(tc, "vocab_size_per_layer_input", 262144);
    cJSON_AddNumberToObject(tc, "num_kv_shared_layers", r->shared);
    cJSON_AddBoolToObject(tc, "enable_moe_block", r->experts > 0);
    if (r->experts) {
        cJSON_AddNumberToObject(tc, "num_experts", r->experts);
        cJSON_AddNumberToObject(tc, "top_k_experts", r->top_k);
        cJSON_AddNumberToObject(tc, "moe_intermediate_size", r->moe_inter);
    }
    cJSON *rp = cJSON_AddObjectToObject(tc, "rope_parameters");
    cJSON *rf = cJSON_AddObjectToObject(rp, "full_attention");
    cJSON_AddNumberToObject(rf, "partial_rotary_factor", 0.25);
    cJSON_AddNumberToObject(rf, "rope_theta", 1000000.0);
    cJSON_AddStringToObject(rf, "rope_type", "proportional");
    cJSON *rs = cJSON_AddObjectToObject(rp, "sliding_attention");
    cJSON_AddNumberToObject(rs, "rope_theta", 10000.0);
    cJSON_AddStringToObject(rs, "rope_type", "default");
    cJSON_AddNumberToObject(tc, "vocab_size", 262144);
    cJSON_AddNumberToObject(tc, "max_position_embeddings", r->max_pos);
    cJSON_AddNumberToObject(tc, "final_logit_softcapping", 30.0);
    cJSON_AddNumberToObject(tc, "rms_norm_eps", 1e-6);
    cJSON_AddNumberToObject(tc, "bos_token_id", 2);
    cJSON_AddNumberToObject(tc, "eos_token_id", 1);
    cJSON_AddNumberToObject(tc, "pad_token_id", 0);
    cJSON_AddBoolToObject(tc, "tie_word_embeddings", 1);
    cJSON_AddStringToObject(tc, "hidden_activation", "gelu_pytorch_tanh");
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    return out;
}

/* ---- drafters ------------------------------------------------------------------------------- */

g4_status g4_drafter_config_parse(const char *json, const char *path, g4_drafter_config *d, g4_error *err) {
    memset(d, 0, sizeof *d);
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g4_fail(err, G4_ERR_CONFIG, "%s: not a JSON object", path);
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    g4_status st = G4_OK;
    if (strcmp(type, "gemma4_assistant") && strcmp(type, "gemma4_unified_assistant"))
        st = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not a Gemma 4 drafter (gemma4_assistant)", path, type);
    else if (!cJSON_IsObject(tc))
        st = g4_fail(err, G4_ERR_CONFIG, "%s: missing \"text_config\"", path);
    reader r = {root, path, err};
    if (!st) st = get_int(&r, "backbone_hidden_size", -2, 1, MAX_HIDDEN, &d->backbone_hidden);
    d->ordered_embeddings = get_bool(root, "use_ordered_embeddings");
    if (!st && d->ordered_embeddings) {
        st = get_int(&r, "num_centroids", -2, 1, MAX_VOCAB, &d->n_centroids);
        if (!st) st = get_int(&r, "centroid_intermediate_top_k", -2, 1, MAX_VOCAB, &d->centroid_top_k);
    }
    if (!st && d->ordered_embeddings && d->centroid_top_k > d->n_centroids)
        st = g4_fail(err, G4_ERR_CONFIG, "%s: centroid_intermediate_top_k exceeds num_centroids", path);
    if (!st) {
        snprintf(d->text.arch, sizeof d->text.arch, "%s", type);
        st = parse_text_config(tc, path, 1, &d->text, err);
    }
    if (!st && d->ordered_embeddings && d->text.vocab % d->n_centroids)
        st = g4_fail(err, G4_ERR_CONFIG, "%s: vocab_size %d is not a multiple of num_centroids %d", path,
                     d->text.vocab, d->n_centroids);
    cJSON_Delete(root);
    if (st) g4_config_free(&d->text);
    return st;
}
