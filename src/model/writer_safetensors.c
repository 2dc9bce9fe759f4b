/* Hugging Face safetensors checkpoints (bf16 / f16 / f32) as a g4_model_writer, plus the
 * streaming-file and config.json helpers every checkpoint writer shares (writer_st.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu/kernels.h"
#include "model/writer.h"
#include "model/writer_st.h"
#include "util/error.h"

/* ---- the streaming file ------------------------------------------------------------------------ */

typedef struct {
    char *name;
    g4_dtype dtype;
    int ndim;
    int64_t shape[G4_MAX_DIMS];
    size_t bytes;     /* declared size */
    size_t written;   /* bytes already in the file */
    uint8_t *buf;     /* bytes received while the file was elsewhere */
    size_t buffered;
} wst_part;

struct g4_wst {
    g4_st_writer *st;
    char *path;
    wst_part *parts;
    int n, cap;
    int *order;       /* file position -> part */
    int cur;          /* file position being written */
    int began;
};

g4_status g4_wst_create(const char *path, g4_wst **out, g4_error *err) {
    *out = NULL;
    g4_wst *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    g4_status st = g4_st_writer_create(path, &w->st, err);
    if (st) {
        free(w->path);
        free(w);
        return st;
    }
    *out = w;
    return G4_OK;
}

g4_status g4_wst_declare(g4_wst *w, const char *name, g4_dtype dtype, int ndim, const int64_t *shape, int *part,
                         g4_error *err) {
    if (w->began) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' declared after data began", w->path, name);
    if (ndim < 0 || ndim > G4_MAX_DIMS || dtype >= G4_DT_COUNT)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': bad dtype or rank", w->path, name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        wst_part *p = realloc(w->parts, sizeof *p * (size_t)cap);
        if (!p) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        w->parts = p;
        w->cap = cap;
    }
    wst_part *p = &w->parts[w->n];
    memset(p, 0, sizeof *p);
    if (!(p->name = strdup(name))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    p->dtype = dtype;
    p->ndim = ndim;
    p->bytes = g4_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            free(p->name);
            return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': negative dimension", w->path, name);
        }
        p->shape[i] = shape[i];
        p->bytes *= (size_t)shape[i];
    }
    *part = w->n++;
    return G4_OK;
}

size_t g4_wst_part_bytes(const g4_wst *w, int part) { return w->parts[part].bytes; }

int g4_wst_find(const g4_wst *w, const char *name) {
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->parts[i].name, name)) return i;
    return -1;
}

g4_status g4_wst_declare_i64(g4_wst *w, const char *name, int64_t n, g4_error *err) {
    int part;
    return g4_wst_declare(w, name, G4_DT_I64, 1, &n, &part, err);
}

g4_status g4_wst_write_i64(g4_wst *w, const char *name, const int64_t *values, g4_error *err) {
    int part = g4_wst_find(w, name);
    if (part < 0 || w->parts[part].dtype != G4_DT_I64)
        return g4_fail(err, G4_ERR_ARG, "%s: integer tensor '%s' was not declared", w->path, name);
    return g4_wst_put(w, part, values, w->parts[part].bytes, err);
}

/* Moves small parts of 2 mod 4 bytes so that no part with 4-byte elements starts misaligned. */
static g4_status plan_order(g4_wst *w, g4_error *err) {
    w->order = malloc(sizeof(int) * (size_t)(w->n ? w->n : 1));
    int *pending = malloc(sizeof(int) * (size_t)(w->n ? w->n : 1));
    if (!w->order || !pending) {
        free(pending);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    int k = 0, np = 0, head = 0;
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const wst_part *p = &w->parts[i];
        size_t es = g4_dtype_size(p->dtype);
        if (es == 2 && p->bytes % 4 == 2 && p->bytes <= 65536) {
            if (off % 4 == 2) {
                w->order[k++] = i;
                off += p->bytes;
            } else {
                pending[np++] = i;
            }
            continue;
        }
        if (es >= 4 && off % 4 == 2 && head < np) {
            int q = pending[head++];
            w->order[k++] = q;
            off += w->parts[q].bytes;
        }
        w->order[k++] = i;
        off += p->bytes;
    }
    while (head < np) w->order[k++] = pending[head++];
    free(pending);
    return G4_OK;
}

/* Advances past complete parts, flushing parts that were received ahead of their turn. */
static g4_status settle(g4_wst *w, g4_error *err) {
    while (w->cur < w->n) {
        wst_part *p = &w->parts[w->order[w->cur]];
        if (p->buffered) {
            g4_status st = g4_st_writer_write(w->st, p->buf, p->buffered, err);
            if (st) return st;
            p->written += p->buffered;
            p->buffered = 0;
            free(p->buf);
            p->buf = NULL;
        }
        if (p->written < p->bytes) break;
        w->cur++;
    }
    return G4_OK;
}

g4_status g4_wst_begin(g4_wst *w, g4_error *err) {
    g4_status st = plan_order(w, err);
    for (int k = 0; k < w->n && !st; k++) {
        const wst_part *p = &w->parts[w->order[k]];
        st = g4_st_writer_declare(w->st, p->name, p->dtype, p->ndim, p->shape, err);
    }
    if (!st) st = g4_st_writer_begin_data(w->st, err);
    w->began = 1;
    if (!st) st = settle(w, err);
    return st;
}

g4_status g4_wst_put(g4_wst *w, int part, const void *data, size_t n, g4_error *err) {
    if (!w->began) return g4_fail(err, G4_ERR_ARG, "%s: data before the header", w->path);
    wst_part *p = &w->parts[part];
    if (p->written + p->buffered + n > p->bytes)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': more data than its %zu declared bytes", w->path, p->name,
                       p->bytes);
    if (!n) return G4_OK;
    if (w->cur < w->n && w->order[w->cur] == part && !p->buffered) {
        g4_status st = g4_st_writer_write(w->st, data, n, err);
        if (st) return st;
        p->written += n;
        return p->written == p->bytes ? settle(w, err) : G4_OK;
    }
    if (!p->buf && !(p->buf = malloc(p->bytes)))
        return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory holding tensor '%s' (%zu bytes)", w->path, p->name,
                       p->bytes);
    memcpy(p->buf + p->buffered, data, n);
    p->buffered += n;
    return G4_OK;
}

static void free_parts(g4_wst *w) {
    for (int i = 0; i < w->n; i++) {
        free(w->parts[i].name);
        free(w->parts[i].buf);
    }
    free(w->parts);
    free(w->order);
    free(w->path);
    free(w);
}

g4_status g4_wst_finish(g4_wst *w, g4_error *err) {
    g4_status st = G4_OK;
    if (!w->began) st = g4_wst_begin(w, err);
    for (int i = 0; i < w->n && !st; i++) {
        const wst_part *p = &w->parts[i];
        if (p->written != p->bytes)
            st = g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': %zu of %zu bytes written", w->path, p->name,
                         p->written + p->buffered, p->bytes);
    }
    if (st) {
        g4_st_writer_abort(w->st);
    } else {
        st = g4_st_writer_finish(w->st, err);
    }
    free_parts(w);
    return st;
}

void g4_wst_abort(g4_wst *w) {
    if (!w) return;
    g4_st_writer_abort(w->st);
    free_parts(w);
}

/* ---- files and config.json ------------------------------------------------------------------- */

g4_status g4_writer_mkdir(const char *dir, g4_error *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return g4_fail(err, G4_ERR_ARG, "%s: path too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(path, 0777) != 0 && errno != EEXIST)
                return g4_fail(err, G4_ERR_IO, "%s: cannot create directory: %s", path, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return g4_fail(err, G4_ERR_IO, "%s: not a directory", dir);
    return G4_OK;
}

g4_status g4_writer_write_text(const char *dir, const char *name, const char *text, g4_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return g4_fail(err, G4_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    if (fclose(f) != 0) ok = 0;
    if (!ok) return g4_fail(err, G4_ERR_IO, "%s: write error", path);
    return G4_OK;
}

int g4_writer_config_is_drafter(const char *json) {
    cJSON *root = cJSON_Parse(json);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    int d = cJSON_IsString(mt) && strstr(mt->valuestring, "_assistant") != NULL;
    cJSON_Delete(root);
    return d;
}

int g4_writer_config_is_multimodal(const char *json) {
    cJSON *root = cJSON_Parse(json);
    int mm = root && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "text_config"));
    cJSON_Delete(root);
    return mm;
}

static void set_string(cJSON *obj, const char *key, const char *val) {
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddStringToObject(obj, key, val);
}

g4_status g4_writer_config_json(const char *json, int multimodal, const cJSON *extra, char **out, g4_error *err) {
    *out = NULL;
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g4_fail(err, G4_ERR_CONFIG, "config.json given to the writer is not a JSON object");
    }
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const cJSON *top_mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(top_mt) && strstr(top_mt->valuestring, "_assistant")) {
        /* a drafter keeps its own shape (text_config, backbone_hidden_size, ...) */
        cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization");
        cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
        for (const cJSON *e = extra ? extra->child : NULL; e; e = e->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(root, e->string);
            cJSON_AddItemToObject(root, e->string, cJSON_Duplicate(e, 1));
        }
        *out = cJSON_Print(root);
        cJSON_Delete(root);
        return *out ? G4_OK : g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    int was_mm = cJSON_IsObject(tc);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(was_mm ? tc : root, "model_type");
    if (!cJSON_IsString(mt)) mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    int unified = cJSON_IsString(mt) && strstr(mt->valuestring, "unified") != NULL;
    cJSON *res;
    if (multimodal) {
        if (was_mm) {
            res = cJSON_Duplicate(root, 1);
        } else {
            res = cJSON_CreateObject();
            cJSON *a = cJSON_AddArrayToObject(res, "architectures");
            cJSON_AddItemToArray(a, cJSON_CreateString(unified ? "Gemma4UnifiedForConditionalGeneration"
                                                                : "Gemma4ForConditionalGeneration"));
            cJSON_AddStringToObject(res, "model_type", unified ? "gemma4_unified" : "gemma4");
            cJSON *t = cJSON_Duplicate(root, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(t, "architectures");
            cJSON_AddItemToObject(res, "text_config", t);
            cJSON *vc = cJSON_AddObjectToObject(res, "vision_config");
            cJSON_AddStringToObject(vc, "model_type", "gemma4_vision");
            cJSON_AddBoolToObject(res, "tie_word_embeddings", 1);
        }
        cJSON *t = cJSON_GetObjectItemCaseSensitive(res, "text_config");
        set_string(t, "model_type", unified ? "gemma4_unified_text" : "gemma4_text");
    } else {
        res = cJSON_Duplicate(was_mm ? tc : root, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(res, "architectures");
        cJSON *a = cJSON_CreateArray();
        cJSON_AddItemToArray(a, cJSON_CreateString(unified ? "Gemma4UnifiedForCausalLM" : "Gemma4ForCausalLM"));
        cJSON_AddItemToObject(res, "architectures", a);
        set_string(res, "model_type", unified ? "gemma4_unified_text" : "gemma4_text");
    }
    cJSON_Delete(root);
    if (!res) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(res, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(res, "quantization_config");
    /* the writers store no separate LM head (the QAT writer says otherwise through `extra`) */
    cJSON *tcr = cJSON_GetObjectItemCaseSensitive(res, "text_config");
    cJSON_DeleteItemFromObjectCaseSensitive(res, "tie_word_embeddings");
    cJSON_AddBoolToObject(res, "tie_word_embeddings", 1);
    if (cJSON_IsObject(tcr)) {
        cJSON_DeleteItemFromObjectCaseSensitive(tcr, "tie_word_embeddings");
        cJSON_AddBoolToObject(tcr, "tie_word_embeddings", 1);
    }
    for (const cJSON *e = extra ? extra->child : NULL; e; e = e->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(res, e->string);
        cJSON_AddItemToObject(res, e->string, cJSON_Duplicate(e, 1));
    }
    *out = cJSON_Print(res);
    cJSON_Delete(res);
    if (!*out) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    return G4_OK;
}

/* ---- the Hugging Face writer ------------------------------------------------------------------ */

typedef struct {
    char *dir;
    g4_dtype dtype;
    int layout;          /* 0 default (text-only), 1 text-only, 2 multimodal */
    int drafter;         /* names as given */
    char *config;        /* as given */
    g4_wst *file;
    /* declared tensors, in order */
    struct hf_tensor {
        char *name;
        int part;
        int64_t rows, cols, done;
    } *t;
    int n, cap, next;
    void *conv;          /* one row in the output dtype */
    size_t conv_cap;
} hf_writer;

static const char *dtype_json_name(g4_dtype t) {
    return t == G4_DT_BF16 ? "bfloat16" : t == G4_DT_F16 ? "float16" : "float32";
}

/* Text-only Gemma4ForCausalLM unless the multimodal layout was asked for. */
static int hf_multimodal(const hf_writer *w) { return w->layout == 2; }

static g4_status hf_set_config(void *ctx, const char *json, g4_error *err) {
    hf_writer *w = ctx;
    free(w->config);
    if (!(w->config = strdup(json))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    w->drafter = g4_writer_config_is_drafter(json);
    return G4_OK;
}

static g4_status hf_declare_i64(void *ctx, const char *name, int64_t n, g4_error *err) {
    return g4_wst_declare_i64(((hf_writer *)ctx)->file, name, n, err);
}

static g4_status hf_write_i64(void *ctx, const char *name, const int64_t *v, g4_error *err) {
    return g4_wst_write_i64(((hf_writer *)ctx)->file, name, v, err);
}

static g4_status hf_declare(void *ctx, const char *name, int ndim, const int64_t *shape, g4_error *err) {
    hf_writer *w = ctx;
    if (ndim < 1) return g4_fail(err, G4_ERR_ARG, "tensor '%s': scalars are not written", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        struct hf_tensor *t = realloc(w->t, sizeof *t * (size_t)cap);
        if (!t) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        w->t = t;
        w->cap = cap;
    }
    struct hf_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    char full[512];
    snprintf(full, sizeof full, "%s%s", w->drafter ? "" : hf_multimodal(w) ? "model.language_model." : "model.", name);
    g4_status st = g4_wst_declare(w->file, full, w->dtype, ndim, shape, &t->part, err);
    if (st) return st;
    if (!(t->name = strdup(name))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    t->cols = shape[ndim - 1];
    t->rows = 1;
    for (int i = 0; i < ndim - 1; i++) t->rows *= shape[i];
    w->n++;
    return G4_OK;
}

static g4_status hf_begin(void *ctx, g4_error *err) {
    hf_writer *w = ctx;
    return g4_wst_begin(w->file, err);
}

/* Converts n floats to dtype into out. */
static void convert_floats(g4_dtype dt, const float *in, size_t n, void *out) {
    if (dt == G4_DT_F32) {
        memcpy(out, in, n * sizeof(float));
    } else if (dt == G4_DT_BF16) {
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = g4_f32_to_bf16(in[i]);
    } else {
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = g4_f32_to_f16(in[i]);
    }
}

static g4_status hf_write_rows(void *ctx, const char *name, int64_t row0, int64_t n_rows, const float *data,
                               g4_error *err) {
    hf_writer *w = ctx;
    if (w->next >= w->n || strcmp(w->t[w->next].name, name))
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' written out of declaration order (expected '%s')", w->dir,
                       name, w->next < w->n ? w->t[w->next].name : "nothing more");
    struct hf_tensor *t = &w->t[w->next];
    if (row0 != t->done || n_rows < 0 || row0 + n_rows > t->rows)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': rows [%lld, %lld) out of order", w->dir, name,
                       (long long)row0, (long long)(row0 + n_rows));
    size_t es = g4_dtype_size(w->dtype), chunk = 1 << 20; /* floats per conversion */
    size_t total = (size_t)n_rows * (size_t)t->cols;
    if (w->conv_cap < chunk * es) {
        void *c = realloc(w->conv, chunk * es);
        if (!c) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        w->conv = c;
        w->conv_cap = chunk * es;
    }
    for (size_t i = 0; i < total; i += chunk) {
        size_t k = total - i < chunk ? total - i : chunk;
        convert_floats(w->dtype, data + i, k, w->conv);
        g4_status st = g4_wst_put(w->file, t->part, w->conv, k * es, err);
        if (st) return st;
    }
    t->done += n_rows;
    if (t->done == t->rows) w->next++;
    return G4_OK;
}

static g4_status hf_write(void *ctx, const char *name, const float *data, g4_error *err) {
    hf_writer *w = ctx;
    int64_t rows = w->next < w->n ? w->t[w->next].rows : 0;
    return hf_write_rows(ctx, name, 0, rows, data, err);
}

static void hf_free(hf_writer *w) {
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    free(w->conv);
    free(w->config);
    free(w->dir);
    free(w);
}

static g4_status hf_finish(void *ctx, g4_error *err) {
    hf_writer *w = ctx;
    g4_status st = G4_OK;
    if (!w->config) st = g4_fail(err, G4_ERR_ARG, "%s: no config given to the writer", w->dir);
    if (!st && w->next != w->n)
        st = g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' was declared but not written", w->dir, w->t[w->next].name);
    if (st) {
        g4_wst_abort(w->file);
    } else {
        st = g4_wst_finish(w->file, err);
    }
    if (!st) {
        cJSON *extra = cJSON_CreateObject();
        cJSON_AddStringToObject(extra, "dtype", dtype_json_name(w->dtype));
        char *cfg;
        st = g4_writer_config_json(w->config, hf_multimodal(w), extra, &cfg, err);
        cJSON_Delete(extra);
        if (!st) {
            /* the text model's dtype too, where the config has a text_config */
            cJSON *c = cJSON_Parse(cfg);
            cJSON *tc = cJSON_GetObjectItemCaseSensitive(c, "text_config");
            if (cJSON_IsObject(tc)) {
                set_string(tc, "dtype", dtype_json_name(w->dtype));
                free(cfg);
                cfg = cJSON_Print(c);
            }
            cJSON_Delete(c);
            st = cfg ? g4_writer_write_text(w->dir, "config.json", cfg, err)
                     : g4_fail(err, G4_ERR_NOMEM, "out of memory");
            free(cfg);
        }
    }
    hf_free(w);
    return st;
}

static void hf_abort(void *ctx) {
    hf_writer *w = ctx;
    g4_wst_abort(w->file);
    hf_free(w);
}

g4_status g4_writer_open_safetensors(const char *format, const char *out_dir, const g4_writer_options *opts,
                                     g4_model_writer *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    g4_dtype dt;
    const char *f = !strncmp(format, "safetensors-", 12) ? format + 12 : format;
    if (!strcmp(f, "bf16")) dt = G4_DT_BF16;
    else if (!strcmp(f, "f16")) dt = G4_DT_F16;
    else if (!strcmp(f, "f32")) dt = G4_DT_F32;
    else return g4_fail(err, G4_ERR_ARG, "unknown safetensors format '%s' (bf16, f16 or f32)", format);
    if (opts && (opts->bits || opts->group))
        return g4_fail(err, G4_ERR_ARG, "format '%s' takes no --bits/--group", format);
    g4_status st = g4_writer_mkdir(out_dir, err);
    if (st) return st;
    hf_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(out_dir))) {
        free(w);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    w->dtype = dt;
    w->layout = opts ? opts->layout : 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if ((st = g4_wst_create(path, &w->file, err))) {
        hf_free(w);
        return st;
    }
    out->ctx = w;
    out->set_config = hf_set_config;
    out->declare = hf_declare;
    out->begin = hf_begin;
    out->write = hf_write;
    out->write_rows = hf_write_rows;
    out->declare_i64 = hf_declare_i64;
    out->write_i64 = hf_write_i64;
    out->finish = hf_finish;
    out->abort = hf_abort;
    return G4_OK;
}
