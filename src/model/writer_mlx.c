/* MLX affine checkpoints as a g4_model_writer, in the layout mlx-community's conversions have
 * (mlx-vlm): tensors under "language_model.model." with the multimodal config (or "model." with a
 * text-only config, as mlx-lm writes), every 2-D linear and embedding weight whose width the
 * group divides quantised to X.weight (U32 codes) + X.scales + X.biases (bf16), the MoE router at
 * 8 bits / group 64 (mlx-vlm's rule, recorded as a per-module override), experts as SwitchGLU
 * gate_proj / up_proj / down_proj, everything else bf16; config.json gains "quantization" and its
 * duplicate "quantization_config". Quantisation is g4_quantize_row_affine (MLX's own rule). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/quant.h"
#include "model/writer.h"
#include "model/writer_st.h"
#include "util/error.h"
#include "util/threadpool.h"

enum { K_FLOAT, K_AFFINE, K_GATE_UP };

typedef struct {
    char *name;
    int64_t rows, cols, done;
    int kind, bits, group;
    int part[6];      /* float: [0]; affine: codes, scales, biases; gate_up: gate's three, up's three */
    int64_t half;     /* gate_up: rows per expert half (I) */
} mlx_tensor;

typedef struct {
    char *dir;
    int bits, group, layout;
    char *config;
    const char *prefix;
    g4_wst *file;
    mlx_tensor *t;
    int n, cap, next;
    cJSON *quant;     /* the "quantization" object being built */
    uint16_t *conv;          /* one row narrowed to bf16 */
    size_t conv_cap;
    g4_threadpool *pool;     /* quantises the rows of a chunk in parallel */
    uint8_t *q;              /* a chunk's codes, then its scales and biases (bf16) */
    size_t q_cap;
    float *tmp;              /* [threads][2 · groups] */
    size_t tmp_cap;
} mlx_writer;

static g4_status mlx_set_config(void *ctx, const char *json, g4_error *err) {
    mlx_writer *w = ctx;
    free(w->config);
    if (!(w->config = strdup(json))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    int mm = w->layout ? w->layout == 2 : g4_writer_config_is_multimodal(json);
    w->prefix = g4_writer_config_is_drafter(json) ? "" : mm ? "language_model.model." : "model.";
    return G4_OK;
}

static g4_status mlx_declare_i64(void *ctx, const char *name, int64_t n, g4_error *err) {
    return g4_wst_declare_i64(((mlx_writer *)ctx)->file, name, n, err);
}

static g4_status mlx_write_i64(void *ctx, const char *name, const int64_t *v, g4_error *err) {
    return g4_wst_write_i64(((mlx_writer *)ctx)->file, name, v, err);
}

static g4_status grow(mlx_writer *w, g4_error *err) {
    if (w->n < w->cap) return G4_OK;
    int cap = w->cap ? 2 * w->cap : 64;
    mlx_tensor *t = realloc(w->t, sizeof *t * (size_t)cap);
    if (!t) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    w->t = t;
    w->cap = cap;
    return G4_OK;
}

/* Declares module's three parts (codes, scales, biases) with leading dims lead[0..nl). */
static g4_status declare_affine(mlx_writer *w, const char *module, const int64_t *lead, int nl, int64_t cols,
                                int bits, int group, int *parts, g4_error *err) {
    int64_t shape[G4_MAX_DIMS];
    char name[512];
    for (int i = 0; i < nl; i++) shape[i] = lead[i];
    shape[nl] = cols * bits / 32;
    snprintf(name, sizeof name, "%s%s.weight", w->prefix, module);
    g4_status st = g4_wst_declare(w->file, name, G4_DT_U32, nl + 1, shape, &parts[0], err);
    shape[nl] = cols / group;
    snprintf(name, sizeof name, "%s%s.scales", w->prefix, module);
    if (!st) st = g4_wst_declare(w->file, name, G4_DT_BF16, nl + 1, shape, &parts[1], err);
    snprintf(name, sizeof name, "%s%s.biases", w->prefix, module);
    if (!st) st = g4_wst_declare(w->file, name, G4_DT_BF16, nl + 1, shape, &parts[2], err);
    return st;
}

/* The per-module override mlx-vlm records (the router). */
static void add_override(mlx_writer *w, const char *module, int bits, int group) {
    char key[512];
    snprintf(key, sizeof key, "%s%s", w->prefix, module); /* the path the converter sees */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "group_size", group);
    cJSON_AddNumberToObject(o, "bits", bits);
    cJSON_AddStringToObject(o, "mode", "affine");
    cJSON_AddItemToObject(w->quant, key, o);
}

static g4_status mlx_declare(void *ctx, const char *name, int ndim, const int64_t *shape, g4_error *err) {
    mlx_writer *w = ctx;
    if (!w->prefix) return g4_fail(err, G4_ERR_ARG, "%s: tensors declared before the config", w->dir);
    if (ndim < 1) return g4_fail(err, G4_ERR_ARG, "tensor '%s': scalars are not written", name);
    g4_status st = grow(w, err);
    if (st) return st;
    mlx_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->cols = shape[ndim - 1];
    t->rows = 1;
    for (int i = 0; i < ndim - 1; i++) t->rows *= shape[i];
    size_t n = strlen(name);
    char module[256];
    const char *gu = ".experts.gate_up_proj", *dn = ".experts.down_proj";
    int is_gu = n > strlen(gu) && !strcmp(name + n - strlen(gu), gu) && ndim == 3 && shape[1] % 2 == 0;
    int is_dn = n > strlen(dn) && !strcmp(name + n - strlen(dn), dn) && ndim == 3;
    int is_lin = ndim == 2 && n > 7 && !strcmp(name + n - 7, ".weight");
    int bits = w->bits, group = w->group;
    if (is_lin) snprintf(module, sizeof module, "%.*s", (int)(n - 7), name);
    if (is_lin && strstr(module, "router")) {
        bits = 8;
        group = 64;
    }
    if ((is_gu || is_dn || is_lin) && t->cols % group == 0) {
        t->bits = bits;
        t->group = group;
        if (is_gu) {
            t->kind = K_GATE_UP;
            t->half = shape[1] / 2;
            int64_t lead[2] = {shape[0], t->half};
            snprintf(module, sizeof module, "%.*s.experts.switch_glu.gate_proj", (int)(n - strlen(gu)), name);
            st = declare_affine(w, module, lead, 2, t->cols, bits, group, &t->part[0], err);
            snprintf(module, sizeof module, "%.*s.experts.switch_glu.up_proj", (int)(n - strlen(gu)), name);
            if (!st) st = declare_affine(w, module, lead, 2, t->cols, bits, group, &t->part[3], err);
        } else {
            t->kind = K_AFFINE;
            if (is_dn) snprintf(module, sizeof module, "%.*s.experts.switch_glu.down_proj", (int)(n - strlen(dn)), name);
            st = declare_affine(w, module, shape, ndim - 1, t->cols, bits, group, &t->part[0], err);
            if (!st && (bits != w->bits || group != w->group)) add_override(w, module, bits, group);
        }
    } else {
        t->kind = K_FLOAT;
        char full[512];
        if (is_gu) { /* float experts keep mlx-vlm's split too */
            t->kind = K_GATE_UP;
            t->bits = 0;
            t->half = shape[1] / 2;
            int64_t sh[3] = {shape[0], t->half, shape[2]};
            snprintf(full, sizeof full, "%s%.*s.experts.switch_glu.gate_proj.weight", w->prefix, (int)(n - strlen(gu)),
                     name);
            st = g4_wst_declare(w->file, full, G4_DT_BF16, 3, sh, &t->part[0], err);
            snprintf(full, sizeof full, "%s%.*s.experts.switch_glu.up_proj.weight", w->prefix, (int)(n - strlen(gu)),
                     name);
            if (!st) st = g4_wst_declare(w->file, full, G4_DT_BF16, 3, sh, &t->part[3], err);
        } else {
            if (is_dn)
                snprintf(full, sizeof full, "%s%.*s.experts.switch_glu.down_proj.weight", w->prefix,
                         (int)(n - strlen(dn)), name);
            else
                snprintf(full, sizeof full, "%s%s", w->prefix, name);
            st = g4_wst_declare(w->file, full, G4_DT_BF16, ndim, shape, &t->part[0], err);
        }
    }
    if (st) return st;
    if (!(t->name = strdup(name))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    w->n++;
    return G4_OK;
}

static g4_status mlx_begin(void *ctx, g4_error *err) {
    mlx_writer *w = ctx;
    return g4_wst_begin(w->file, err);
}

static g4_status grow_buf(void **p, size_t *cap, size_t need, g4_error *err) {
    if (need <= *cap) return G4_OK;
    void *n = realloc(*p, need);
    if (!n) return g4_fail(err, G4_ERR_NOMEM, "out of memory (%zu bytes)", need);
    *p = n;
    *cap = need;
    return G4_OK;
}

static g4_status put_bf16(mlx_writer *w, int part, const float *x, int64_t n, g4_error *err) {
    g4_status st = grow_buf((void **)&w->conv, &w->conv_cap, sizeof(uint16_t) * (size_t)n, err);
    if (st) return st;
    for (int64_t i = 0; i < n; i++) w->conv[i] = g4_f32_to_bf16(x[i]);
    return g4_wst_put(w->file, part, w->conv, sizeof(uint16_t) * (size_t)n, err);
}

typedef struct {
    const mlx_writer *w;
    const mlx_tensor *t;
    const float *x;
    size_t cb, ng;           /* code bytes and groups per row */
    uint8_t *codes;
    uint16_t *sc, *bi;
} quant_job;

static void quant_range(void *ctx, int b, int e, int tid) {
    const quant_job *j = ctx;
    const mlx_tensor *t = j->t;
    float *s = j->w->tmp + (size_t)tid * 2 * j->ng, *bs = s + j->ng;
    for (int r = b; r < e; r++) {
        g4_quantize_row_affine(j->x + (size_t)r * (size_t)t->cols, (int)t->cols, t->bits, t->group,
                               (uint32_t *)(j->codes + (size_t)r * j->cb), s, bs);
        for (size_t g = 0; g < j->ng; g++) {
            j->sc[(size_t)r * j->ng + g] = g4_f32_to_bf16(s[g]);
            j->bi[(size_t)r * j->ng + g] = g4_f32_to_bf16(bs[g]);
        }
    }
}

/* Quantises n rows (in parallel) and appends each to its parts: the module's three, or for the
 * experts' gate_up input the gate's or the up's by the row's place in its expert. */
static g4_status put_quantised(mlx_writer *w, const mlx_tensor *t, int64_t row0, int64_t n, const float *x,
                               g4_error *err) {
    size_t cb = (size_t)t->cols * (size_t)t->bits / 8, ng = (size_t)(t->cols / t->group);
    g4_status st = grow_buf((void **)&w->q, &w->q_cap, (size_t)n * (cb + 4 * ng), err);
    if (!st)
        st = grow_buf((void **)&w->tmp, &w->tmp_cap, sizeof(float) * 2 * ng * (size_t)g4_threadpool_size(w->pool), err);
    if (st) return st;
    quant_job j = {w, t, x, cb, ng, w->q, NULL, NULL};
    j.sc = (uint16_t *)(w->q + (size_t)n * cb);
    j.bi = j.sc + (size_t)n * ng;
    g4_parallel_for(w->pool, (int)n, 1, quant_range, &j);
    for (int64_t r = 0; r < n && !st; r++) {
        const int *parts = t->part;
        if (t->kind == K_GATE_UP && (row0 + r) % (2 * t->half) >= t->half) parts = &t->part[3];
        st = g4_wst_put(w->file, parts[0], j.codes + (size_t)r * cb, cb, err);
        if (!st) st = g4_wst_put(w->file, parts[1], j.sc + (size_t)r * ng, 2 * ng, err);
        if (!st) st = g4_wst_put(w->file, parts[2], j.bi + (size_t)r * ng, 2 * ng, err);
    }
    return st;
}

static g4_status mlx_write_rows(void *ctx, const char *name, int64_t row0, int64_t n_rows, const float *data,
                                g4_error *err) {
    mlx_writer *w = ctx;
    if (w->next >= w->n || strcmp(w->t[w->next].name, name))
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' written out of declaration order (expected '%s')", w->dir,
                       name, w->next < w->n ? w->t[w->next].name : "nothing more");
    mlx_tensor *t = &w->t[w->next];
    if (row0 != t->done || n_rows < 0 || row0 + n_rows > t->rows)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': rows [%lld, %lld) out of order", w->dir, name,
                       (long long)row0, (long long)(row0 + n_rows));
    g4_status st = G4_OK;
    if (!t->bits) {
        for (int64_t r = 0; r < n_rows && !st; r++) {
            const int *parts = t->part;
            if (t->kind == K_GATE_UP && (row0 + r) % (2 * t->half) >= t->half) parts = &t->part[3];
            st = put_bf16(w, parts[0], data + (size_t)r * (size_t)t->cols, t->cols, err);
        }
    } else {
        /* in chunks of about a million values, whatever the caller passes */
        int64_t per = ((int64_t)1 << 20) / t->cols > 0 ? ((int64_t)1 << 20) / t->cols : 1;
        for (int64_t r = 0; r < n_rows && !st; r += per) {
            int64_t k = n_rows - r < per ? n_rows - r : per;
            st = put_quantised(w, t, row0 + r, k, data + (size_t)r * (size_t)t->cols, err);
        }
    }
    if (st) return st;
    t->done += n_rows;
    if (t->done == t->rows) w->next++;
    return G4_OK;
}

static g4_status mlx_write(void *ctx, const char *name, const float *data, g4_error *err) {
    mlx_writer *w = ctx;
    int64_t rows = w->next < w->n ? w->t[w->next].rows : 0;
    return mlx_write_rows(ctx, name, 0, rows, data, err);
}

static void mlx_free(mlx_writer *w) {
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    free(w->conv);
    free(w->q);
    free(w->tmp);
    g4_threadpool_free(w->pool);
    cJSON_Delete(w->quant);
    free(w->config);
    free(w->dir);
    free(w);
}

static g4_status mlx_finish(void *ctx, g4_error *err) {
    mlx_writer *w = ctx;
    g4_status st = G4_OK;
    if (!w->config) st = g4_fail(err, G4_ERR_ARG, "%s: no config given to the writer", w->dir);
    if (!st && w->next != w->n)
        st = g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' was declared but not written", w->dir, w->t[w->next].name);
    if (st) g4_wst_abort(w->file);
    else st = g4_wst_finish(w->file, err);
    if (!st) {
        cJSON *extra = cJSON_CreateObject();
        cJSON_AddItemToObject(extra, "quantization", cJSON_Duplicate(w->quant, 1));
        cJSON_AddItemToObject(extra, "quantization_config", cJSON_Duplicate(w->quant, 1));
        char *cfg;
        st = g4_writer_config_json(w->config, !strcmp(w->prefix, "language_model.model."), extra, &cfg, err);
        cJSON_Delete(extra);
        if (!st) st = g4_writer_write_text(w->dir, "config.json", cfg, err);
        free(cfg);
    }
    mlx_free(w);
    return st;
}

static void mlx_abort(void *ctx) {
    mlx_writer *w = ctx;
    g4_wst_abort(w->file);
    mlx_free(w);
}

g4_status g4_writer_open_mlx(const char *format, const char *out_dir, const g4_writer_options *opts,
                             g4_model_writer *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    int bits = 4, group = 64;
    if (!strncmp(format, "mlx-", 4)) {
        char *end;
        long b = strtol(format + 4, &end, 10);
        if (*end || end == format + 4)
            return g4_fail(err, G4_ERR_ARG, "format '%s': expected mlx-N with N the bits (2..8)", format);
        bits = (int)b;
        if (opts && opts->bits && opts->bits != bits)
            return g4_fail(err, G4_ERR_ARG, "format '%s' contradicts --bits %d", format, opts->bits);
    } else if (strcmp(format, "mlx")) {
        return g4_fail(err, G4_ERR_ARG, "unknown MLX format '%s'", format);
    }
    if (opts && opts->bits) bits = opts->bits;
    if (opts && opts->group) group = opts->group;
    if (bits < 2 || bits > 8 || bits == 7)
        return g4_fail(err, G4_ERR_ARG, "MLX affine: %d bits is not supported (2, 3, 4, 5, 6 or 8)", bits);
    if (group != 32 && group != 64 && group != 128)
        return g4_fail(err, G4_ERR_ARG, "MLX affine: group size %d is not supported (32, 64 or 128)", group);
    g4_status st = g4_writer_mkdir(out_dir, err);
    if (st) return st;
    mlx_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(out_dir)) || !(w->quant = cJSON_CreateObject())) {
        if (w) free(w->dir);
        free(w);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    w->bits = bits;
    w->group = group;
    w->layout = opts ? opts->layout : 0;
    cJSON_AddNumberToObject(w->quant, "group_size", group);
    cJSON_AddNumberToObject(w->quant, "bits", bits);
    cJSON_AddStringToObject(w->quant, "mode", "affine");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if ((st = g4_threadpool_create(0, &w->pool, err)) || (st = g4_wst_create(path, &w->file, err))) {
        mlx_free(w);
        return st;
    }
    out->ctx = w;
    out->set_config = mlx_set_config;
    out->declare = mlx_declare;
    out->begin = mlx_begin;
    out->write = mlx_write;
    out->write_rows = mlx_write_rows;
    out->declare_i64 = mlx_declare_i64;
    out->write_i64 = mlx_write_i64;
    out->finish = mlx_finish;
    out->abort = mlx_abort;
    return G4_OK;
}
