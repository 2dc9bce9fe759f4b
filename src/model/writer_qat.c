/* Google QAT checkpoints (quantization_config.quant_method "gemma") as a g4_model_writer, in the
 * layout HF transformers' gemma_quant.py loads (see source_qat.c for the tensor layouts):
 *  - linears: X.weight (int2/int4 U8, int8 I8), X.weight_scale F32 [out, 1], and scalar
 *    X.input_activation_scale / X.output_activation_scale written as 0 (uncalibrated: this writer
 *    has no activation statistics, and 0 makes the fake-quantisation a no-op);
 *  - embeddings: X.embedding_quantized + X.embedding_scale F32 [V, blocks]; the token table in one
 *    block per row, the per-layer table in one block per layer slice (P columns) when P is a
 *    multiple of 32;
 *  - a separate LM head "lm_head.weight" quantised per row from the token table (the release
 *    unties them: tie_word_embeddings false);
 *  - per_layer_model_projection, the MoE router and the experts stay float (the release's
 *    modules_to_not_convert; experts are parameters, not linears), as do matrices whose width is
 *    not a multiple of 32 (listed in modules_to_not_convert); norms and scalars float32 (the
 *    config keeps the model's "dtype": HF dequantises embeddings to it, and the engine rounds the
 *    embedding multiplier to it, as for the unquantised model).
 * Bit widths: "qat" is the E2B release's recipe generalised — attention int4; MLP int4, except on
 * the KV-shared (double-wide) layers of models that have them, int2; per-layer-input gate and
 * projection int8; token table and LM head int2; per-layer table int4. "qat-intN": N everywhere. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "model/config.h"
#include "model/writer.h"
#include "model/writer_st.h"
#include "util/error.h"
#include "util/threadpool.h"

enum { K_FLOAT, K_LIN, K_EMBED };

typedef struct {
    char *name;
    int64_t rows, cols, done;
    int kind, bits, blocks, head_bits;
    int part[8];   /* K_LIN: weight, scale, in_act, out_act; K_EMBED: codes, scales, then the LM
                      head's weight, scale, in_act, out_act when head_bits */
} qat_tensor;

typedef struct {
    char *dir;
    int uniform;            /* 0: the mixed recipe; else the bits of every quantised tensor */
    int layout;
    char *config;
    g4_config cfg;
    int have_cfg;
    int multimodal;
    const char *prefix;
    g4_wst *file;
    qat_tensor *t;
    int n, cap, next;
    cJSON *not_converted;   /* module names left in float */
    g4_threadpool *pool;    /* quantises the rows of a chunk in parallel */
    uint8_t *q;             /* a chunk's codes and scales */
    size_t q_cap;
} qat_writer;

static g4_status qat_set_config(void *ctx, const char *json, g4_error *err) {
    qat_writer *w = ctx;
    free(w->config);
    if (w->have_cfg) g4_config_free(&w->cfg);
    w->have_cfg = 0;
    if (!(w->config = strdup(json))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    if (g4_writer_config_is_drafter(json)) { /* names as given; the drafter's own stack decides bits */
        g4_drafter_config dc;
        g4_status st = g4_drafter_config_parse(json, "config given to the QAT writer", &dc, err);
        if (st) return st;
        w->cfg = dc.text;
        w->have_cfg = 1;
        w->prefix = "";
        return G4_OK;
    }
    g4_status st = g4_config_parse(json, "config given to the QAT writer", &w->cfg, err);
    if (st) return st;
    w->have_cfg = 1;
    w->multimodal = w->layout ? w->layout == 2 : g4_writer_config_is_multimodal(json);
    w->prefix = w->multimodal ? "model.language_model." : "model.";
    return G4_OK;
}

static g4_status qat_declare_i64(void *ctx, const char *name, int64_t n, g4_error *err) {
    return g4_wst_declare_i64(((qat_writer *)ctx)->file, name, n, err);
}

static g4_status qat_write_i64(void *ctx, const char *name, const int64_t *v, g4_error *err) {
    return g4_wst_write_i64(((qat_writer *)ctx)->file, name, v, err);
}

/* The mixed recipe's bits for a tensor (relative name), 0 to keep it float. */
int g4_qat_mixed_bits(const g4_config *cfg, const char *name) {
    if (!strcmp(name, "embed_tokens.weight")) return 2;
    if (!strcmp(name, "embed_tokens_per_layer.weight")) return 4;
    if (strstr(name, "router") || !strcmp(name, "per_layer_model_projection.weight")) return 0;
    int layer = -1;
    sscanf(name, "layers.%d.", &layer);
    if (strstr(name, ".self_attn.")) return 4;
    if (strstr(name, ".mlp.")) return cfg->n_kv_shared > 0 && layer >= cfg->first_shared ? 2 : 4;
    if (strstr(name, "per_layer_input_gate") || strstr(name, "per_layer_projection")) return 8;
    return 4;
}

/* A linear's bits (relative name), 0 to keep it float. */
static int linear_bits(const qat_writer *w, const char *name) {
    if (strstr(name, "router") || !strcmp(name, "per_layer_model_projection.weight")) return 0;
    return w->uniform ? w->uniform : g4_qat_mixed_bits(&w->cfg, name);
}

static g4_status declare_part(qat_writer *w, const char *pre, const char *base, const char *suffix, g4_dtype dt,
                              int ndim, const int64_t *shape, int *part, g4_error *err) {
    char full[512];
    snprintf(full, sizeof full, "%s%s%s", pre, base, suffix);
    return g4_wst_declare(w->file, full, dt, ndim, shape, part, err);
}

/* weight, weight_scale and the two activation scales of a linear named pre + base. */
static g4_status declare_linear(qat_writer *w, const char *pre, const char *base, int64_t rows, int64_t cols,
                                int bits, int *parts, g4_error *err) {
    int64_t sh[2] = {rows, cols * bits / 8}, ssh[2] = {rows, 1};
    g4_status st = declare_part(w, pre, base, ".weight", bits == 8 ? G4_DT_I8 : G4_DT_U8, 2, sh, &parts[0], err);
    if (!st) st = declare_part(w, pre, base, ".weight_scale", G4_DT_F32, 2, ssh, &parts[1], err);
    if (!st) st = declare_part(w, pre, base, ".input_activation_scale", G4_DT_F32, 0, NULL, &parts[2], err);
    if (!st) st = declare_part(w, pre, base, ".output_activation_scale", G4_DT_F32, 0, NULL, &parts[3], err);
    return st;
}

static g4_status qat_declare(void *ctx, const char *name, int ndim, const int64_t *shape, g4_error *err) {
    qat_writer *w = ctx;
    if (!w->have_cfg) return g4_fail(err, G4_ERR_ARG, "%s: tensors declared before the config", w->dir);
    if (ndim < 1) return g4_fail(err, G4_ERR_ARG, "tensor '%s': scalars are not written", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        qat_tensor *t = realloc(w->t, sizeof *t * (size_t)cap);
        if (!t) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        w->t = t;
        w->cap = cap;
    }
    qat_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->cols = shape[ndim - 1];
    t->rows = 1;
    for (int i = 0; i < ndim - 1; i++) t->rows *= shape[i];
    size_t n = strlen(name);
    char base[256];
    snprintf(base, sizeof base, "%.*s", n > 7 ? (int)(n - 7) : (int)n, name);
    int embed = !strcmp(name, "embed_tokens.weight"), ple = !strcmp(name, "embed_tokens_per_layer.weight");
    int is_lin = ndim == 2 && n > 7 && !strcmp(name + n - 7, ".weight");
    g4_status st;
    if (embed || ple) {
        t->bits = w->uniform ? w->uniform : g4_qat_mixed_bits(&w->cfg, name);
        int P = w->cfg.ple_width;
        t->blocks = ple && P % 32 == 0 && t->cols % P == 0 ? (int)(t->cols / P) : 1;
        if (t->cols % 32) goto as_float;
        t->kind = K_EMBED;
        int64_t sh[2] = {t->rows, t->cols * t->bits / 8}, ssh[2] = {t->rows, t->blocks};
        st = declare_part(w, w->prefix, base, ".embedding_quantized", t->bits == 8 ? G4_DT_I8 : G4_DT_U8, 2, sh,
                          &t->part[0], err);
        if (!st) st = declare_part(w, w->prefix, base, ".embedding_scale", G4_DT_F32, 2, ssh, &t->part[1], err);
        if (!st && embed) {
            t->head_bits = w->uniform ? w->uniform : 2;
            st = declare_linear(w, "", "lm_head", t->rows, t->cols, t->head_bits, &t->part[2], err);
        }
    } else if (is_lin && (t->bits = linear_bits(w, name)) > 0 && t->cols % 32 == 0) {
        t->kind = K_LIN;
        t->blocks = 1;
        st = declare_linear(w, w->prefix, base, t->rows, t->cols, t->bits, t->part, err);
    } else {
    as_float:
        t->kind = K_FLOAT;
        t->bits = 0;
        if (is_lin && !strstr(name, "router") && strcmp(name, "per_layer_model_projection.weight")) {
            char mod[512];
            snprintf(mod, sizeof mod, "%s%s", w->prefix, base);
            cJSON_AddItemToArray(w->not_converted, cJSON_CreateString(mod));
        }
        char full[512];
        snprintf(full, sizeof full, "%s%s", w->prefix, name);
        st = g4_wst_declare(w->file, full, G4_DT_F32, ndim, shape, &t->part[0], err);
    }
    if (st) return st;
    if (!(t->name = strdup(name))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    w->n++;
    return G4_OK;
}

static g4_status qat_begin(void *ctx, g4_error *err) {
    qat_writer *w = ctx;
    g4_status st = g4_wst_begin(w->file, err);
    const float zero = 0;
    /* the activation scales: uncalibrated */
    for (int i = 0; i < w->n && !st; i++) {
        const qat_tensor *t = &w->t[i];
        int base = t->kind == K_LIN ? 0 : t->kind == K_EMBED && t->head_bits ? 2 : -1;
        if (base < 0) continue;
        st = g4_wst_put(w->file, t->part[base + 2], &zero, sizeof zero, err);
        if (!st) st = g4_wst_put(w->file, t->part[base + 3], &zero, sizeof zero, err);
    }
    return st;
}

typedef struct {
    const qat_tensor *t;
    const float *x;
    size_t cb, hcb;         /* code bytes per row: the tensor's, the LM head's */
    uint8_t *codes, *hcodes;
    float *sc, *hsc;        /* [rows][blocks], [rows] */
} quant_job;

static void quant_range(void *ctx, int b, int e, int tid) {
    (void)tid;
    const quant_job *j = ctx;
    const qat_tensor *t = j->t;
    size_t cols = (size_t)t->cols, bs = cols / (size_t)t->blocks, bb = bs * (size_t)t->bits / 8;
    for (int r = b; r < e; r++) {
        const float *x = j->x + (size_t)r * cols;
        for (int k = 0; k < t->blocks; k++)
            j->sc[(size_t)r * (size_t)t->blocks + (size_t)k] =
                g4_quantize_row_symm(x + (size_t)k * bs, (int)bs, t->bits, j->codes + (size_t)r * j->cb + (size_t)k * bb);
        if (t->head_bits) j->hsc[r] = g4_quantize_row_symm(x, (int)cols, t->head_bits, j->hcodes + (size_t)r * j->hcb);
    }
}

static g4_status qat_write_rows(void *ctx, const char *name, int64_t row0, int64_t n_rows, const float *data,
                                g4_error *err) {
    qat_writer *w = ctx;
    if (w->next >= w->n || strcmp(w->t[w->next].name, name))
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' written out of declaration order (expected '%s')", w->dir,
                       name, w->next < w->n ? w->t[w->next].name : "nothing more");
    qat_tensor *t = &w->t[w->next];
    if (row0 != t->done || n_rows < 0 || row0 + n_rows > t->rows)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': rows [%lld, %lld) out of order", w->dir, name,
                       (long long)row0, (long long)(row0 + n_rows));
    g4_status st = G4_OK;
    size_t cols = (size_t)t->cols;
    if (t->kind == K_FLOAT) {
        st = g4_wst_put(w->file, t->part[0], data, sizeof(float) * cols * (size_t)n_rows, err);
    } else {
        /* K_LIN is one block per row and no head; parts: codes part[0], scales part[1] and, for
         * the token table's LM head, part[2] / part[3] */
        int64_t per = ((int64_t)1 << 20) / t->cols > 0 ? ((int64_t)1 << 20) / t->cols : 1;
        quant_job j = {t, NULL, cols * (size_t)t->bits / 8, cols * (size_t)t->head_bits / 8, NULL, NULL, NULL, NULL};
        for (int64_t r0 = 0; r0 < n_rows && !st; r0 += per) {
            int64_t n = n_rows - r0 < per ? n_rows - r0 : per;
            size_t need = (size_t)n * (j.cb + j.hcb + 4 * (size_t)t->blocks + 4);
            if (need > w->q_cap) {
                uint8_t *q = realloc(w->q, need);
                if (!q) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
                w->q = q;
                w->q_cap = need;
            }
            j.x = data + (size_t)r0 * cols;
            j.sc = (float *)w->q;
            j.hsc = j.sc + (size_t)n * (size_t)t->blocks;
            j.codes = (uint8_t *)(j.hsc + n);
            j.hcodes = j.codes + (size_t)n * j.cb;
            g4_parallel_for(w->pool, (int)n, 1, quant_range, &j);
            st = g4_wst_put(w->file, t->part[0], j.codes, (size_t)n * j.cb, err);
            if (!st) st = g4_wst_put(w->file, t->part[1], j.sc, sizeof(float) * (size_t)n * (size_t)t->blocks, err);
            if (!st && t->head_bits) st = g4_wst_put(w->file, t->part[2], j.hcodes, (size_t)n * j.hcb, err);
            if (!st && t->head_bits) st = g4_wst_put(w->file, t->part[3], j.hsc, sizeof(float) * (size_t)n, err);
        }
    }
    if (st) return st;
    t->done += n_rows;
    if (t->done == t->rows) w->next++;
    return G4_OK;
}

static g4_status qat_write(void *ctx, const char *name, const float *data, g4_error *err) {
    qat_writer *w = ctx;
    int64_t rows = w->next < w->n ? w->t[w->next].rows : 0;
    return qat_write_rows(ctx, name, 0, rows, data, err);
}

static void qat_free(qat_writer *w) {
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    free(w->q);
    g4_threadpool_free(w->pool);
    cJSON_Delete(w->not_converted);
    if (w->have_cfg) g4_config_free(&w->cfg);
    free(w->config);
    free(w->dir);
    free(w);
}

static void add_rule(cJSON *mqc, const char *pattern, int bits) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "num_bits", bits);
    cJSON_AddItemToObject(mqc, pattern, o);
}

/* quantization_config as HF's GemmaQuantizer reads it; patterns are searched (re.search) in
 * module names, the first listed match wins. */
static cJSON *quant_config(const qat_writer *w) {
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "quant_method", "gemma");
    cJSON_AddNumberToObject(q, "num_bits", w->uniform ? w->uniform : 4);
    cJSON_AddBoolToObject(q, "quantize_embeddings", 1);
    cJSON *nc = cJSON_AddArrayToObject(q, "modules_to_not_convert");
    cJSON_AddItemToArray(nc, cJSON_CreateString("per_layer_model_projection"));
    cJSON_AddItemToArray(nc, cJSON_CreateString("router"));
    cJSON_AddItemToArray(nc, cJSON_CreateString("vision_tower"));
    cJSON_AddItemToArray(nc, cJSON_CreateString("audio_tower"));
    cJSON_AddItemToArray(nc, cJSON_CreateString("embed_vision"));
    cJSON_AddItemToArray(nc, cJSON_CreateString("embed_audio"));
    for (const cJSON *e = w->not_converted->child; e; e = e->next) cJSON_AddItemToArray(nc, cJSON_Duplicate(e, 0));
    cJSON *mqc = cJSON_AddObjectToObject(q, "module_quant_configs");
    if (w->uniform) return q;
    add_rule(mqc, "^lm_head$", 2);
    add_rule(mqc, "(^|\\.)embed_tokens$", 2);
    add_rule(mqc, "(^|\\.)embed_tokens_per_layer$", 4);
    if (w->cfg.n_kv_shared > 0 && w->cfg.first_shared > 0) {
        char pat[8192];
        size_t used = (size_t)snprintf(pat, sizeof pat, "layers\\.(");
        for (int i = 0; i < w->cfg.first_shared && used < sizeof pat - 32; i++)
            used += (size_t)snprintf(pat + used, sizeof pat - used, "%s%d", i ? "|" : "", i);
        snprintf(pat + used, sizeof pat - used, ")\\.mlp\\.");
        add_rule(mqc, pat, 4);
        add_rule(mqc, "layers\\.\\d+\\.mlp\\.", 2);
    } else {
        add_rule(mqc, "layers\\.\\d+\\.mlp\\.", 4);
    }
    add_rule(mqc, "layers\\.\\d+\\.per_layer_input_gate$", 8);
    add_rule(mqc, "layers\\.\\d+\\.per_layer_projection$", 8);
    add_rule(mqc, "layers\\.\\d+\\.self_attn\\.", 4);
    return q;
}

static g4_status qat_finish(void *ctx, g4_error *err) {
    qat_writer *w = ctx;
    g4_status st = G4_OK;
    if (!w->config) st = g4_fail(err, G4_ERR_ARG, "%s: no config given to the writer", w->dir);
    if (!st && w->next != w->n)
        st = g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' was declared but not written", w->dir, w->t[w->next].name);
    if (st) g4_wst_abort(w->file);
    else st = g4_wst_finish(w->file, err);
    if (!st) {
        cJSON *extra = cJSON_CreateObject();
        cJSON_AddItemToObject(extra, "quantization_config", quant_config(w));
        cJSON_AddBoolToObject(extra, "tie_word_embeddings", 0);
        char *cfg;
        st = g4_writer_config_json(w->config, w->multimodal, extra, &cfg, err);
        cJSON_Delete(extra);
        if (!st) {
            cJSON *c = cJSON_Parse(cfg);
            cJSON *tc = cJSON_GetObjectItemCaseSensitive(c, "text_config");
            if (cJSON_IsObject(tc)) { /* the text model is untied too */
                cJSON_DeleteItemFromObjectCaseSensitive(tc, "tie_word_embeddings");
                cJSON_AddBoolToObject(tc, "tie_word_embeddings", 0);
                free(cfg);
                cfg = cJSON_Print(c);
            }
            cJSON_Delete(c);
            st = cfg ? g4_writer_write_text(w->dir, "config.json", cfg, err) : g4_fail(err, G4_ERR_NOMEM, "out of memory");
        }
        free(cfg);
    }
    qat_free(w);
    return st;
}

static void qat_abort(void *ctx) {
    qat_writer *w = ctx;
    g4_wst_abort(w->file);
    qat_free(w);
}

g4_status g4_writer_open_qat(const char *format, const char *out_dir, const g4_writer_options *opts,
                             g4_model_writer *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    int uniform = 0;
    if (!strcmp(format, "qat-int2")) uniform = 2;
    else if (!strcmp(format, "qat-int4")) uniform = 4;
    else if (!strcmp(format, "qat-int8")) uniform = 8;
    else if (strcmp(format, "qat"))
        return g4_fail(err, G4_ERR_ARG, "unknown QAT format '%s' (qat, qat-int2, qat-int4, qat-int8)", format);
    if (opts && opts->group) return g4_fail(err, G4_ERR_ARG, "QAT has no --group (scales are per row)");
    if (opts && opts->bits) {
        if (opts->bits != 2 && opts->bits != 4 && opts->bits != 8)
            return g4_fail(err, G4_ERR_ARG, "QAT: %d bits is not supported (2, 4 or 8)", opts->bits);
        if (uniform && uniform != opts->bits)
            return g4_fail(err, G4_ERR_ARG, "format '%s' contradicts --bits %d", format, opts->bits);
        uniform = opts->bits;
    }
    g4_status st = g4_writer_mkdir(out_dir, err);
    if (st) return st;
    qat_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(out_dir)) || !(w->not_converted = cJSON_CreateArray())) {
        if (w) free(w->dir);
        free(w);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    w->uniform = uniform;
    w->layout = opts ? opts->layout : 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if ((st = g4_threadpool_create(0, &w->pool, err)) || (st = g4_wst_create(path, &w->file, err))) {
        qat_free(w);
        return st;
    }
    out->ctx = w;
    out->set_config = qat_set_config;
    out->declare = qat_declare;
    out->begin = qat_begin;
    out->write = qat_write;
    out->write_rows = qat_write_rows;
    out->declare_i64 = qat_declare_i64;
    out->write_i64 = qat_write_i64;
    out->finish = qat_finish;
    out->abort = qat_abort;
    return G4_OK;
}
