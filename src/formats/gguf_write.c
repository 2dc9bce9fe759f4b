#include "formats/gguf_write.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cpu/quant.h"
#include "model/config.h"
#include "model/gguf_arch.h"
#include "model/writer_st.h"
#include "util/error.h"

/* ---- the file writer ------------------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const void *data, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

static void put_u64(buf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(buf *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}

typedef struct {
    char *name;
    uint32_t n_dims, type;
    uint64_t ne[G4_GGUF_MAX_DIMS];
    uint64_t offset, size;
} wtensor;

struct g4_gguf_writer {
    FILE *f;
    char *path;
    buf kv;           /* serialised key/values */
    uint64_t n_kv;
    char **keys;      /* for duplicate detection */
    wtensor *t;
    size_t n_t, cap_t;
    uint64_t data_size;
    int began;
    size_t cur;       /* tensor being written */
    uint64_t cur_written;
};

g4_status g4_gguf_writer_create(const char *path, g4_gguf_writer **out, g4_error *err) {
    *out = NULL;
    g4_gguf_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    if (!(w->f = fopen(path, "wb"))) {
        g4_status st = g4_fail(err, G4_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        g4_gguf_writer_abort(w);
        return st;
    }
    *out = w;
    return G4_OK;
}

static g4_status begin_kv(g4_gguf_writer *w, const char *key, g4_gguf_type type, g4_error *err) {
    if (w->began) return g4_fail(err, G4_ERR_ARG, "%s: key '%s' added after the data began", w->path, key);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return g4_fail(err, G4_ERR_ARG, "%s: key '%s' added twice", w->path, key);
    char **k = realloc(w->keys, sizeof *k * (size_t)(w->n_kv + 1));
    if (!k) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    w->keys = k;
    if (!(k[w->n_kv] = strdup(key))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    w->n_kv++;
    put_str(&w->kv, key, strlen(key));
    put_u32(&w->kv, (uint32_t)type);
    return G4_OK;
}

static g4_status end_kv(g4_gguf_writer *w, g4_error *err) {
    return w->kv.oom ? g4_fail(err, G4_ERR_NOMEM, "%s: out of memory for metadata", w->path) : G4_OK;
}

g4_status g4_gguf_writer_add_u32(g4_gguf_writer *w, const char *key, uint32_t v, g4_error *err) {
    g4_status st = begin_kv(w, key, G4_GGUF_UINT32, err);
    if (st) return st;
    put_u32(&w->kv, v);
    return end_kv(w, err);
}

g4_status g4_gguf_writer_add_i32(g4_gguf_writer *w, const char *key, int32_t v, g4_error *err) {
    g4_status st = begin_kv(w, key, G4_GGUF_INT32, err);
    if (st) return st;
    put_u32(&w->kv, (uint32_t)v);
    return end_kv(w, err);
}

g4_status g4_gguf_writer_add_f32(g4_gguf_writer *w, const char *key, float v, g4_error *err) {
    g4_status st = begin_kv(w, key, G4_GGUF_FLOAT32, err);
    if (st) return st;
    uint32_t bits;
    memcpy(&bits, &v, 4);
    put_u32(&w->kv, bits);
    return end_kv(w, err);
}

g4_status g4_gguf_writer_add_bool(g4_gguf_writer *w, const char *key, bool v, g4_error *err) {
    g4_status st = begin_kv(w, key, G4_GGUF_BOOL, err);
    if (st) return st;
    uint8_t b = v ? 1 : 0;
    put(&w->kv, &b, 1);
    return end_kv(w, err);
}

g4_status g4_gguf_writer_add_str(g4_gguf_writer *w, const char *key, const char *v, g4_error *err) {
    g4_status st = begin_kv(w, key, G4_GGUF_STRING, err);
    if (st) return st;
    put_str(&w->kv, v, strlen(v));
    return end_kv(w, err);
}

static size_t elem_size(g4_gguf_type t) {
    switch (t) {
    case G4_GGUF_UINT8: case G4_GGUF_INT8: case G4_GGUF_BOOL: return 1;
    case G4_GGUF_UINT16: case G4_GGUF_INT16: return 2;
    case G4_GGUF_UINT32: case G4_GGUF_INT32: case G4_GGUF_FLOAT32: return 4;
    case G4_GGUF_UINT64: case G4_GGUF_INT64: case G4_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

g4_status g4_gguf_writer_add_array(g4_gguf_writer *w, const char *key, g4_gguf_type elem_type, const void *values,
                                   size_t n, g4_error *err) {
    size_t es = elem_size(elem_type);
    if (!es) return g4_fail(err, G4_ERR_ARG, "%s: key '%s': not a fixed-size element type", w->path, key);
    g4_status st = begin_kv(w, key, G4_GGUF_ARRAY, err);
    if (st) return st;
    put_u32(&w->kv, (uint32_t)elem_type);
    put_u64(&w->kv, n);
    /* little-endian element by element (the host may be either) */
    const uint8_t *p = values;
    for (size_t i = 0; i < n; i++, p += es) {
        uint64_t v = 0;
        switch (es) {
        case 1: v = *p; break;
        case 2: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, p, 4); v = x; break; }
        default: memcpy(&v, p, 8); break;
        }
        uint8_t le[8];
        for (size_t j = 0; j < es; j++) le[j] = (uint8_t)(v >> (8 * j));
        put(&w->kv, le, es);
    }
    return end_kv(w, err);
}

g4_status g4_gguf_writer_add_str_array(g4_gguf_writer *w, const char *key, const char *const *v, size_t n,
                                       g4_error *err) {
    g4_status st = begin_kv(w, key, G4_GGUF_ARRAY, err);
    if (st) return st;
    put_u32(&w->kv, G4_GGUF_STRING);
    put_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++) put_str(&w->kv, v[i], strlen(v[i]));
    return end_kv(w, err);
}

/* A parsed value back in its serialised form (little-endian). Arrays were kept as their raw
 * bytes by the reader, so they copy as they are. */
static void put_value(buf *b, const g4_gguf_value *v) {
    size_t es = elem_size(v->type);
    if (es) {
        uint64_t x;
        if (v->type == G4_GGUF_BOOL) {
            x = v->b;
        } else if (v->type == G4_GGUF_FLOAT32) {
            float f = (float)v->f;
            uint32_t bits;
            memcpy(&bits, &f, 4);
            x = bits;
        } else if (v->type == G4_GGUF_FLOAT64) {
            memcpy(&x, &v->f, 8);
        } else if (v->type == G4_GGUF_INT8 || v->type == G4_GGUF_INT16 || v->type == G4_GGUF_INT32 ||
                   v->type == G4_GGUF_INT64) {
            x = (uint64_t)v->i;
        } else {
            x = v->u;
        }
        uint8_t le[8];
        for (size_t j = 0; j < es; j++) le[j] = (uint8_t)(x >> (8 * j));
        put(b, le, es);
    } else if (v->type == G4_GGUF_STRING) {
        put_str(b, v->str.data, v->str.len);
    } else if (v->type == G4_GGUF_ARRAY) {
        put_u32(b, (uint32_t)v->arr.type);
        put_u64(b, v->arr.n);
        put(b, v->arr.data, v->arr.size);
    }
}

g4_status g4_gguf_writer_add_value(g4_gguf_writer *w, const char *key, const g4_gguf_value *v, g4_error *err) {
    if (v->type >= G4_GGUF_TYPE_COUNT) return g4_fail(err, G4_ERR_ARG, "%s: key '%s': bad value type", w->path, key);
    g4_status st = begin_kv(w, key, v->type, err);
    if (st) return st;
    put_value(&w->kv, v);
    return end_kv(w, err);
}

g4_status g4_gguf_writer_add_array_prefix(g4_gguf_writer *w, const char *key, const g4_gguf_array *a, uint64_t n,
                                          g4_error *err) {
    if (n > a->n) return g4_fail(err, G4_ERR_ARG, "%s: key '%s': prefix longer than the array", w->path, key);
    g4_gguf_iter it;
    g4_gguf_value v;
    g4_gguf_iter_init(&it, a);
    for (uint64_t i = 0; i < n; i++)
        if (!g4_gguf_iter_next(&it, &v)) return g4_fail(err, G4_ERR_FORMAT, "%s: key '%s': malformed array", w->path, key);
    g4_status st = begin_kv(w, key, G4_GGUF_ARRAY, err);
    if (st) return st;
    put_u32(&w->kv, (uint32_t)a->type);
    put_u64(&w->kv, n);
    put(&w->kv, a->data, (size_t)(it.p - a->data));
    return end_kv(w, err);
}

g4_status g4_gguf_writer_add_tensor(g4_gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne,
                                    uint32_t ggml_type, g4_error *err) {
    if (w->began) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' added after the data began", w->path, name);
    uint32_t bs = g4_ggml_block_size(ggml_type), ts = g4_ggml_type_size(ggml_type);
    if (!bs) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': unknown ggml type %u", w->path, name, ggml_type);
    if (n_dims < 1 || n_dims > G4_GGUF_MAX_DIMS)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': %u dimensions", w->path, name, n_dims);
    if (ne[0] % bs)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': %" PRIu64 " columns are not a multiple of the %s block (%u)",
                       w->path, name, ne[0], g4_ggml_type_name(ggml_type), bs);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' added twice", w->path, name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *t = realloc(w->t, sizeof *t * cap);
        if (!t) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    t->n_dims = n_dims;
    t->type = ggml_type;
    uint64_t size = ne[0] / bs * ts;
    for (uint32_t d = 0; d < G4_GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        if (d) size *= t->ne[d];
    }
    t->size = size;
    t->offset = w->data_size;
    w->data_size += (size + G4_GGUF_DEFAULT_ALIGNMENT - 1) / G4_GGUF_DEFAULT_ALIGNMENT * G4_GGUF_DEFAULT_ALIGNMENT;
    w->n_t++;
    return G4_OK;
}

static g4_status write_bytes(g4_gguf_writer *w, const void *p, size_t n, g4_error *err) {
    if (n && fwrite(p, 1, n, w->f) != n) return g4_fail(err, G4_ERR_IO, "%s: write error: %s", w->path, strerror(errno));
    return G4_OK;
}

static g4_status pad(g4_gguf_writer *w, uint64_t pos, g4_error *err) {
    static const uint8_t zeros[G4_GGUF_DEFAULT_ALIGNMENT];
    size_t n = (size_t)((G4_GGUF_DEFAULT_ALIGNMENT - pos % G4_GGUF_DEFAULT_ALIGNMENT) % G4_GGUF_DEFAULT_ALIGNMENT);
    return write_bytes(w, zeros, n, err);
}

g4_status g4_gguf_writer_begin_data(g4_gguf_writer *w, g4_error *err) {
    if (w->began) return g4_fail(err, G4_ERR_ARG, "%s: data already began", w->path);
    buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, w->n_t);
    put_u64(&h, w->n_kv);
    put(&h, w->kv.p, w->kv.n);
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put_str(&h, t->name, strlen(t->name));
        put_u32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(&h, t->ne[d]);
        put_u32(&h, t->type);
        put_u64(&h, t->offset);
    }
    g4_status st = h.oom ? g4_fail(err, G4_ERR_NOMEM, "%s: out of memory for the header", w->path)
                         : write_bytes(w, h.p, h.n, err);
    if (!st) st = pad(w, h.n, err);
    free(h.p);
    w->began = 1;
    w->cur = 0;
    w->cur_written = 0;
    return st;
}

g4_status g4_gguf_writer_write(g4_gguf_writer *w, const void *data, size_t n, g4_error *err) {
    if (!w->began) return g4_fail(err, G4_ERR_ARG, "%s: tensor data written before the header", w->path);
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_t) return g4_fail(err, G4_ERR_ARG, "%s: more tensor data written than declared", w->path);
        wtensor *t = &w->t[w->cur];
        uint64_t left = t->size - w->cur_written;
        size_t k = n < left ? n : (size_t)left;
        g4_status st = write_bytes(w, p, k, err);
        if (st) return st;
        p += k;
        n -= k;
        w->cur_written += k;
        if (w->cur_written == t->size) {
            if ((st = pad(w, t->size, err))) return st;
            w->cur++;
            w->cur_written = 0;
        }
    }
    return G4_OK;
}

g4_status g4_gguf_writer_finish(g4_gguf_writer *w, g4_error *err) {
    g4_status st = G4_OK;
    if (!w->began) st = g4_gguf_writer_begin_data(w, err);
    /* zero-size tensors complete without data */
    while (!st && w->cur < w->n_t && w->t[w->cur].size == 0) w->cur++;
    if (!st && w->cur < w->n_t)
        st = g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' and %zu after it were not written", w->path, w->t[w->cur].name,
                     w->n_t - w->cur - 1);
    if (fclose(w->f) != 0 && !st) st = g4_fail(err, G4_ERR_IO, "%s: write error on close", w->path);
    w->f = NULL;
    g4_gguf_writer_abort(w);
    return st;
}

void g4_gguf_writer_abort(g4_gguf_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->kv.p);
    free(w->path);
    free(w);
}

/* ---- the Gemma 4 model writer --------------------------------------------------------------- */

typedef struct {
    char *hf;          /* NULL: accepted and dropped (lm_head.weight) */
    int64_t rows, cols;
    g4_wtype type;
} mtensor;

typedef struct {
    g4_gguf_writer *w;
    char *path, *vocab_path, *name;
    g4_wtype type;
    char *config_json;
    g4_config cfg;
    int have_cfg;
    char dtype[16];
    mtensor *t;
    size_t n_t, cap_t;
    size_t next;       /* declared tensor written next */
    int64_t next_row;  /* rows of it already written */
    int began;
    int rope_R, d_full, any_full;
    uint8_t *row;      /* one converted row */
    size_t row_cap;
} gguf_mw;

/* LlamaFileType for general.file_type (gguf-py constants.py). */
static uint32_t file_type_of(g4_wtype t) {
    switch (t) {
    case G4_W_F32: return 0;
    case G4_W_F16: return 1;
    case G4_W_Q4_0: return 2;
    case G4_W_Q4_1: return 3;
    case G4_W_Q8_0: return 7;
    case G4_W_Q5_0: return 8;
    case G4_W_Q5_1: return 9;
    case G4_W_Q4_K: return 15; /* MOSTLY_Q4_K_M */
    case G4_W_Q5_K: return 17; /* MOSTLY_Q5_K_M */
    case G4_W_Q6_K: return 18;
    case G4_W_BF16: return 32;
    default: return 0;
    }
}

static int is_float_type(g4_wtype t) { return t == G4_W_F32 || t == G4_W_F16 || t == G4_W_BF16; }

/* The type a matrix with `cols` columns gets (llama-quantize's fallbacks for odd widths). */
static g4_wtype matrix_type(g4_wtype want, int64_t cols) {
    if (is_float_type(want)) return want;
    int bs = g4_wtype_block_cols(want);
    if (cols % bs == 0) return want;
    g4_wtype fb = want == G4_W_Q4_K ? G4_W_Q5_0 : want == G4_W_Q5_K ? G4_W_Q5_1 : want == G4_W_Q6_K ? G4_W_Q8_0 : G4_W_F16;
    if (!is_float_type(fb) && cols % g4_wtype_block_cols(fb)) fb = G4_W_F16;
    return fb;
}

static g4_status mw_set_config(void *ctx, const char *config_json, g4_error *err) {
    gguf_mw *m = ctx;
    if (m->began || m->have_cfg) return g4_fail(err, G4_ERR_ARG, "%s: config set twice or after the data began", m->path);
    g4_status st = g4_config_parse(config_json, "config.json", &m->cfg, err);
    if (st) return st;
    m->have_cfg = 1;
    if (!(m->config_json = strdup(config_json))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    const g4_config *c = &m->cfg;
    /* what GGUF metadata can express: one head dim per attention kind, full sliding rotation,
     * one rotated-pair count on full layers */
    int d_swa = -1, R = -1;
    for (int i = 0; i < c->n_layers; i++) {
        const g4_layer_config *l = &c->layers[i];
        if (l->is_full) {
            if ((m->d_full >= 0 && m->any_full && l->head_dim != m->d_full) || (R >= 0 && l->rope_pairs != R))
                return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: full-attention layers differ in head dim or RoPE; GGUF has one "
                               "value for all", m->path);
            m->d_full = l->head_dim;
            R = l->rope_pairs;
            m->any_full = 1;
        } else {
            if (d_swa >= 0 && l->head_dim != d_swa)
                return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: sliding layers differ in head dim; GGUF has one value", m->path);
            d_swa = l->head_dim;
            if (l->rope_pairs != l->head_dim / 2)
                return g4_fail(err, G4_ERR_UNSUPPORTED,
                               "%s: sliding layers rotate %d of %d pairs; llama.cpp's gemma4 rotates them all", m->path,
                               l->rope_pairs, l->head_dim / 2);
        }
    }
    m->rope_R = R;
    /* config.json's dtype, for the embedding scale (see source_gguf.c) */
    snprintf(m->dtype, sizeof m->dtype, "bfloat16");
    cJSON *root = cJSON_Parse(config_json);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const cJSON *dt = NULL;
    if (cJSON_IsObject(tc)) dt = cJSON_GetObjectItemCaseSensitive(tc, "dtype");
    if (!cJSON_IsString(dt)) dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (!cJSON_IsString(dt)) dt = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    if (cJSON_IsString(dt) && (!strcmp(dt->valuestring, "float32") || !strcmp(dt->valuestring, "float16")))
        snprintf(m->dtype, sizeof m->dtype, "%s", dt->valuestring);
    cJSON_Delete(root);
    /* automatic type: the checkpoint's own float type, as the converter's --outtype auto */
    if (m->type == G4_W_COUNT)
        m->type = !strcmp(m->dtype, "float32") ? G4_W_F32 : !strcmp(m->dtype, "float16") ? G4_W_F16 : G4_W_BF16;
    return G4_OK;
}

static g4_status mw_declare(void *ctx, const char *name, int ndim, const int64_t *shape, g4_error *err) {
    gguf_mw *m = ctx;
    if (m->began) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' declared after the data began", m->path, name);
    if (!m->have_cfg) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' declared before the config", m->path, name);
    if (ndim < 1 || ndim > 3) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' has %d dimensions", m->path, name, ndim);
    char gname[128];
    int drop = !strcmp(name, "lm_head.weight");
    if (!drop && g4_gguf_name_of_hf(name, gname, sizeof gname))
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' has no name in llama.cpp's gemma4 architecture", m->path, name);
    if (m->n_t == m->cap_t) {
        size_t cap = m->cap_t ? 2 * m->cap_t : 128;
        mtensor *t = realloc(m->t, sizeof *t * cap);
        if (!t) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        m->t = t;
        m->cap_t = cap;
    }
    mtensor *t = &m->t[m->n_t];
    memset(t, 0, sizeof *t);
    t->rows = 1;
    for (int i = 0; i < ndim - 1; i++) {
        if (shape[i] <= 0) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' has an empty dimension", m->path, name);
        t->rows *= shape[i];
    }
    t->cols = shape[ndim - 1];
    if (t->cols <= 0 || t->cols > (1 << 30) || t->rows > (1ll << 40))
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' is empty or too large", m->path, name);
    m->n_t++;
    if (drop) return G4_OK;
    if (!(t->hf = strdup(name))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    int router = strstr(name, "router.proj") != NULL;
    t->type = ndim == 1 ? G4_W_F32 : (router && !is_float_type(m->type)) ? G4_W_F32 : matrix_type(m->type, t->cols);
    uint64_t ne[3];
    for (int i = 0; i < ndim; i++) ne[i] = (uint64_t)shape[ndim - 1 - i];
    return g4_gguf_writer_add_tensor(m->w, gname, (uint32_t)ndim, ne, (uint32_t)g4_ggml_of_wtype(t->type), err);
}

/* ---- tokenizer metadata ---- */

/* Minimal open-addressing set of strings (token texts) for filtering merges. */
typedef struct {
    const g4_gguf_str *keys;
    size_t mask;
} strset;

static uint64_t hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int strset_has(const strset *s, const char *p, size_t n) {
    for (size_t i = hash_str(p, n) & s->mask;; i = (i + 1) & s->mask) {
        if (!s->keys[i].data) return 0;
        if (s->keys[i].len == n && !memcmp(s->keys[i].data, p, n)) return 1;
    }
}

static g4_status copy_vocab(gguf_mw *m, g4_error *err) {
    g4_gguf *v = NULL;
    g4_status st = g4_gguf_open(m->vocab_path, &v, err);
    if (st) return st;
    int64_t V = m->cfg.vocab;
    g4_gguf_array toks;
    const char *file = g4_gguf_name(v);
    if (!g4_gguf_find(v, "tokenizer.ggml.tokens")) {
        g4_gguf_close(v);
        return g4_fail(err, G4_ERR_FORMAT, "%s: no tokenizer.ggml.tokens: not a vocabulary", file);
    }
    if ((st = g4_gguf_get_array(v, "tokenizer.ggml.tokens", G4_GGUF_STRING, &toks, err))) {
        g4_gguf_close(v);
        return st;
    }
    if (toks.n < (uint64_t)V) {
        g4_gguf_close(v);
        return g4_fail(err, G4_ERR_ARG, "%s: %" PRIu64 " tokens, fewer than the model's vocabulary of %lld", file, toks.n,
                       (long long)V);
    }
    int truncate = toks.n > (uint64_t)V;
    strset set = {0};
    g4_gguf_str *slots = NULL;
    if (truncate) {
        size_t cap = 16;
        while (cap < 2 * (size_t)V) cap *= 2;
        slots = calloc(cap, sizeof *slots);
        if (!slots) {
            g4_gguf_close(v);
            return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        }
        set.keys = slots;
        set.mask = cap - 1;
        g4_gguf_iter it;
        g4_gguf_value e;
        g4_gguf_iter_init(&it, &toks);
        for (int64_t i = 0; i < V && g4_gguf_iter_next(&it, &e); i++) {
            size_t j = hash_str(e.str.data, e.str.len) & set.mask;
            while (slots[j].data && !(slots[j].len == e.str.len && !memcmp(slots[j].data, e.str.data, e.str.len)))
                j = (j + 1) & set.mask;
            if (!slots[j].data) slots[j] = e.str;
        }
    }
    for (size_t i = 0; i < g4_gguf_n_kv(v) && !st; i++) {
        const g4_gguf_kv *kv = g4_gguf_kv_at(v, i);
        char key[256];
        if (kv->key.len < 10 || memcmp(kv->key.data, "tokenizer.", 10) || kv->key.len >= sizeof key) continue;
        memcpy(key, kv->key.data, kv->key.len);
        key[kv->key.len] = 0;
        const g4_gguf_value *val = &kv->value;
        if (!truncate) {
            st = g4_gguf_writer_add_value(m->w, key, val, err);
        } else if (val->type == G4_GGUF_ARRAY && val->arr.n == toks.n) {
            /* per-token arrays: tokens, scores, token_type */
            st = g4_gguf_writer_add_array_prefix(m->w, key, &val->arr, (uint64_t)V, err);
        } else if (!strcmp(key, "tokenizer.ggml.merges") && val->type == G4_GGUF_ARRAY && val->arr.type == G4_GGUF_STRING) {
            /* the merges among the kept tokens, in their original order (= rank order) */
            size_t n = 0, cap = 0;
            char **keep = NULL;
            g4_gguf_iter it;
            g4_gguf_value e;
            g4_gguf_iter_init(&it, &val->arr);
            while (!st && g4_gguf_iter_next(&it, &e)) {
                const char *sp = e.str.len > 1 ? memchr(e.str.data + 1, ' ', e.str.len - 1) : NULL;
                if (!sp) continue;
                size_t a = (size_t)(sp - e.str.data), b = e.str.len - a - 1;
                if (!strset_has(&set, e.str.data, a) || !strset_has(&set, sp + 1, b)) continue;
                char joined[1024];
                if (a + b >= sizeof joined) continue;
                memcpy(joined, e.str.data, a);
                memcpy(joined + a, sp + 1, b);
                if (!strset_has(&set, joined, a + b)) continue;
                if (n == cap) {
                    cap = cap ? 2 * cap : 256;
                    char **k = realloc(keep, sizeof *k * cap);
                    if (!k) {
                        st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
                        break;
                    }
                    keep = k;
                }
                if (!(keep[n] = strndup(e.str.data, e.str.len))) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
                else n++;
            }
            if (!st) st = g4_gguf_writer_add_str_array(m->w, key, (const char *const *)keep, n, err);
            for (size_t j = 0; j < n; j++) free(keep[j]);
            free(keep);
        } else if (g4_gguf_type_is_int(val->type) && strstr(key, "_token_id")) {
            /* special ids outside the kept vocabulary are dropped */
            uint64_t id;
            if (!g4_gguf_get_uint(v, key, &id, NULL) && id < (uint64_t)V) st = g4_gguf_writer_add_value(m->w, key, val, err);
        } else {
            st = g4_gguf_writer_add_value(m->w, key, val, err);
        }
    }
    free(slots);
    g4_gguf_close(v);
    return st;
}

/* A stand-in vocabulary shaped like Gemma 4's at the low ids. */
static g4_status synth_vocab(gguf_mw *m, g4_error *err) {
    int V = m->cfg.vocab;
    static const char *const control[] = {"<pad>", "<eos>", "<bos>", "<unk>", "<mask>"};
    char **toks = calloc((size_t)V, sizeof *toks);
    float *scores = calloc((size_t)V, sizeof *scores);
    int32_t *types = calloc((size_t)V, sizeof *types);
    g4_status st = G4_OK;
    if (!toks || !scores || !types) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    for (int i = 0; i < V && !st; i++) {
        char b[32];
        types[i] = 1; /* normal */
        if (i < 5) {
            snprintf(b, sizeof b, "%s", control[i]);
            types[i] = 3;
        } else if (i == 107) {
            snprintf(b, sizeof b, "\n");
        } else if (i >= 238 && i < 494) {
            snprintf(b, sizeof b, "<0x%02X>", i - 238);
            types[i] = 6; /* byte */
        } else {
            snprintf(b, sizeof b, "<unused_g4_%d>", i);
        }
        if (!(toks[i] = strdup(b))) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    if (!st) st = g4_gguf_writer_add_str(m->w, "tokenizer.ggml.model", "gemma4", err);
    if (!st) st = g4_gguf_writer_add_str_array(m->w, "tokenizer.ggml.tokens", (const char *const *)toks, (size_t)V, err);
    if (!st) st = g4_gguf_writer_add_array(m->w, "tokenizer.ggml.scores", G4_GGUF_FLOAT32, scores, (size_t)V, err);
    if (!st) st = g4_gguf_writer_add_array(m->w, "tokenizer.ggml.token_type", G4_GGUF_INT32, types, (size_t)V, err);
    if (!st) st = g4_gguf_writer_add_str_array(m->w, "tokenizer.ggml.merges", NULL, 0, err);
    const struct { const char *k; int id; } ids[] = {{"tokenizer.ggml.bos_token_id", m->cfg.bos},
                                                     {"tokenizer.ggml.eos_token_id", m->cfg.eos},
                                                     {"tokenizer.ggml.unknown_token_id", 3},
                                                     {"tokenizer.ggml.padding_token_id", m->cfg.pad}};
    for (size_t i = 0; i < sizeof ids / sizeof *ids && !st; i++)
        if (ids[i].id >= 0 && ids[i].id < V) st = g4_gguf_writer_add_u32(m->w, ids[i].k, (uint32_t)ids[i].id, err);
    if (!st) st = g4_gguf_writer_add_bool(m->w, "tokenizer.ggml.add_space_prefix", false, err);
    if (!st) st = g4_gguf_writer_add_bool(m->w, "tokenizer.ggml.add_bos_token", true, err);
    for (int i = 0; toks && i < V; i++) free(toks[i]);
    free(toks);
    free(scores);
    free(types);
    return st;
}

static g4_status add_metadata(gguf_mw *m, g4_error *err) {
    const g4_config *c = &m->cfg;
    g4_gguf_writer *w = m->w;
    int L = c->n_layers, d_swa = 0, kv_uniform = 1, ff_uniform = 1;
    for (int i = 0; i < L; i++) {
        if (!c->layers[i].is_full) d_swa = c->layers[i].head_dim;
        kv_uniform &= c->layers[i].n_kv_heads == c->layers[0].n_kv_heads;
        ff_uniform &= c->layers[i].mlp_width == c->layers[0].mlp_width;
    }
    if (!d_swa) d_swa = m->d_full;
    int d_full = m->any_full ? m->d_full : d_swa;
    int32_t *arr = calloc((size_t)L, sizeof *arr);
    uint8_t *pat = calloc((size_t)L, 1);
    if (!arr || !pat) {
        free(arr);
        free(pat);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    float th_full = 1e6f, th_swa = 1e4f;
    for (int i = 0; i < L; i++) {
        pat[i] = !c->layers[i].is_full;
        if (c->layers[i].is_full) th_full = c->layers[i].rope_theta;
        else th_swa = c->layers[i].rope_theta;
    }
    g4_status st = g4_gguf_writer_add_str(w, "general.architecture", "gemma4", err);
    if (!st) st = g4_gguf_writer_add_str(w, "general.type", "model", err);
    if (!st && m->name) st = g4_gguf_writer_add_str(w, "general.name", m->name, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "general.file_type", file_type_of(m->type), err);
    if (!st) st = g4_gguf_writer_add_u32(w, "general.quantization_version", 2, err);
    if (!st) st = g4_gguf_writer_add_str(w, "g4.source_dtype", m->dtype, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.block_count", (uint32_t)L, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.context_length", (uint32_t)c->max_positions, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.embedding_length", (uint32_t)c->hidden, err);
    if (!st) {
        if (ff_uniform) st = g4_gguf_writer_add_u32(w, "gemma4.feed_forward_length", (uint32_t)c->layers[0].mlp_width, err);
        else {
            for (int i = 0; i < L; i++) arr[i] = c->layers[i].mlp_width;
            st = g4_gguf_writer_add_array(w, "gemma4.feed_forward_length", G4_GGUF_INT32, arr, (size_t)L, err);
        }
    }
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.attention.head_count", (uint32_t)c->n_heads, err);
    if (!st) {
        if (kv_uniform) st = g4_gguf_writer_add_u32(w, "gemma4.attention.head_count_kv", (uint32_t)c->layers[0].n_kv_heads, err);
        else {
            for (int i = 0; i < L; i++) arr[i] = c->layers[i].n_kv_heads;
            st = g4_gguf_writer_add_array(w, "gemma4.attention.head_count_kv", G4_GGUF_INT32, arr, (size_t)L, err);
        }
    }
    if (!st) st = g4_gguf_writer_add_f32(w, "gemma4.rope.freq_base", th_full, err);
    if (!st) st = g4_gguf_writer_add_f32(w, "gemma4.rope.freq_base_swa", th_swa, err);
    if (!st) st = g4_gguf_writer_add_f32(w, "gemma4.attention.layer_norm_rms_epsilon", c->rms_eps, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.attention.key_length", (uint32_t)d_full, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.attention.value_length", (uint32_t)d_full, err);
    if (!st && c->final_softcap > 0) st = g4_gguf_writer_add_f32(w, "gemma4.final_logit_softcapping", c->final_softcap, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.attention.sliding_window", (uint32_t)c->sliding_window, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.attention.shared_kv_layers", (uint32_t)c->n_kv_shared, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.embedding_length_per_layer_input", (uint32_t)c->ple_width, err);
    if (!st) st = g4_gguf_writer_add_array(w, "gemma4.attention.sliding_window_pattern", G4_GGUF_BOOL, pat, (size_t)L, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.attention.key_length_swa", (uint32_t)d_swa, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.attention.value_length_swa", (uint32_t)d_swa, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.rope.dimension_count", (uint32_t)d_full, err);
    if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.rope.dimension_count_swa", (uint32_t)d_swa, err);
    if (!st && c->moe) {
        st = g4_gguf_writer_add_u32(w, "gemma4.expert_count", (uint32_t)c->n_experts, err);
        if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.expert_used_count", (uint32_t)c->top_k_experts, err);
        if (!st) st = g4_gguf_writer_add_u32(w, "gemma4.expert_feed_forward_length", (uint32_t)c->moe_width, err);
    }
    free(arr);
    free(pat);
    if (!st) st = m->vocab_path ? copy_vocab(m, err) : synth_vocab(m, err);
    return st;
}

static g4_status mw_begin(void *ctx, g4_error *err) {
    gguf_mw *m = ctx;
    if (m->began) return g4_fail(err, G4_ERR_ARG, "%s: begin called twice", m->path);
    if (!m->have_cfg) return g4_fail(err, G4_ERR_ARG, "%s: begin before the config", m->path);
    g4_status st = add_metadata(m, err);
    /* rope_freqs: declared last so the declared tensors keep their order; written by finish */
    if (!st && m->any_full) {
        uint64_t ne = (uint64_t)m->d_full / 2;
        st = g4_gguf_writer_add_tensor(m->w, "rope_freqs.weight", 1, &ne, G4_GGML_F32, err);
    }
    if (!st) st = g4_gguf_writer_begin_data(m->w, err);
    m->began = 1;
    m->next = 0;
    m->next_row = 0;
    return st;
}

/* Converts and appends rows of the next tensor. */
static g4_status mw_write_rows(void *ctx, const char *name, int64_t row0, int64_t n_rows, const float *data,
                               g4_error *err) {
    gguf_mw *m = ctx;
    if (!m->began) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' written before begin", m->path, name);
    if (m->next >= m->n_t) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' written but all were written", m->path, name);
    mtensor *t = &m->t[m->next];
    if (t->hf && strcmp(t->hf, name))
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' written where '%s' was declared next", m->path, name, t->hf);
    if (row0 != m->next_row || n_rows < 0 || row0 + n_rows > t->rows)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': rows [%lld, %lld) out of order", m->path, name, (long long)row0,
                       (long long)(row0 + n_rows));
    g4_status st = G4_OK;
    if (t->hf) {
        size_t rb = g4_wtype_row_bytes(t->type, (int)t->cols, 0);
        if (!rb) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': no %s row of %lld columns", m->path, name,
                                g4_wtype_name(t->type), (long long)t->cols);
        if (rb > m->row_cap) {
            uint8_t *p = realloc(m->row, rb);
            if (!p) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
            m->row = p;
            m->row_cap = rb;
        }
        for (int64_t r = 0; r < n_rows && !st; r++) {
            const float *x = data + (size_t)r * (size_t)t->cols;
            for (int64_t j = 0; j < t->cols; j++)
                if (!isfinite(x[j]))
                    return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' row %lld holds a non-finite value", m->path, name,
                                   (long long)(row0 + r));
            g4_quantize_row(t->type, x, (int)t->cols, m->row);
            st = g4_gguf_writer_write(m->w, m->row, rb, err);
        }
    }
    if (st) return st;
    m->next_row += n_rows;
    if (m->next_row == t->rows) {
        m->next++;
        m->next_row = 0;
    }
    return G4_OK;
}

static g4_status mw_write(void *ctx, const char *name, const float *data, g4_error *err) {
    gguf_mw *m = ctx;
    if (m->began && m->next < m->n_t && m->next_row == 0)
        return mw_write_rows(ctx, name, 0, m->t[m->next].rows, data, err);
    return mw_write_rows(ctx, name, 0, 0, data, err); /* reports what is wrong */
}

static void mw_free(gguf_mw *m) {
    g4_gguf_writer_abort(m->w);
    if (m->have_cfg) g4_config_free(&m->cfg);
    for (size_t i = 0; i < m->n_t; i++) free(m->t[i].hf);
    free(m->t);
    free(m->row);
    free(m->config_json);
    free(m->path);
    free(m->vocab_path);
    free(m->name);
    free(m);
}

static g4_status mw_finish(void *ctx, g4_error *err) {
    gguf_mw *m = ctx;
    g4_status st = G4_OK;
    if (!m->began) st = g4_fail(err, G4_ERR_ARG, "%s: finished before begin", m->path);
    else if (m->next < m->n_t)
        st = g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' and %zu after it were not written", m->path,
                     m->t[m->next].hf ? m->t[m->next].hf : "lm_head.weight", m->n_t - m->next - 1);
    if (!st && m->any_full) {
        /* [1]·R + [1e30]·(d/2 − R): rotate the first R pairs, leave the rest (converter's form) */
        int half = m->d_full / 2;
        float *f = malloc(sizeof(float) * (size_t)half);
        if (!f) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
        for (int i = 0; f && i < half; i++) f[i] = i < m->rope_R ? 1.0f : 1e30f;
        if (!st) st = g4_gguf_writer_write(m->w, f, sizeof(float) * (size_t)half, err);
        free(f);
    }
    if (!st) {
        st = g4_gguf_writer_finish(m->w, err);
        m->w = NULL;
    }
    mw_free(m);
    return st;
}

static void mw_abort(void *ctx) { mw_free(ctx); }

g4_status g4_gguf_model_writer_open(const char *path, const g4_gguf_model_writer_options *opts, g4_model_writer *out,
                                    g4_error *err) {
    memset(out, 0, sizeof *out);
    g4_wtype type = opts ? opts->type : G4_W_COUNT;
    if (type != G4_W_COUNT && g4_ggml_of_wtype(type) < 0)
        return g4_fail(err, G4_ERR_ARG, "%s: type %s has no ggml equivalent", path, g4_wtype_name(type));
    gguf_mw *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    m->type = type;
    m->d_full = -1;
    if (!(m->path = strdup(path)) || (opts && opts->vocab_path && !(m->vocab_path = strdup(opts->vocab_path))) ||
        (opts && opts->name && !(m->name = strdup(opts->name)))) {
        mw_free(m);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    g4_status st = g4_gguf_writer_create(path, &m->w, err);
    if (st) {
        mw_free(m);
        return st;
    }
    out->ctx = m;
    out->set_config = mw_set_config;
    out->declare = mw_declare;
    out->begin = mw_begin;
    out->write = mw_write;
    out->write_rows = mw_write_rows;
    out->finish = mw_finish;
    out->abort = mw_abort;
    return G4_OK;
}

/* ---- the registry entry --------------------------------------------------------------------- */

static const struct {
    const char *suffix;
    g4_wtype type;
} gguf_types[] = {
    {"f32", G4_W_F32},   {"f16", G4_W_F16},   {"bf16", G4_W_BF16}, {"q8_0", G4_W_Q8_0}, {"q4_0", G4_W_Q4_0},
    {"q4_1", G4_W_Q4_1}, {"q5_0", G4_W_Q5_0}, {"q5_1", G4_W_Q5_1}, {"q4_k", G4_W_Q4_K}, {"q5_k", G4_W_Q5_K},
    {"q6_k", G4_W_Q6_K},
};

g4_status g4_writer_open_gguf(const char *format, const char *out, const g4_writer_options *opts,
                              g4_model_writer *w, g4_error *err) {
    const char *suffix = !strcmp(format, "gguf") ? "auto" : format + 5;
    g4_gguf_model_writer_options o = {.type = G4_W_AFFINE, .vocab_path = opts ? opts->vocab : NULL};
    if (!strcmp(suffix, "auto")) o.type = G4_W_COUNT;
    for (size_t i = 0; i < sizeof gguf_types / sizeof *gguf_types; i++)
        if (!strcasecmp(suffix, gguf_types[i].suffix)) o.type = gguf_types[i].type;
    if (o.type == G4_W_AFFINE)
        return g4_fail(err, G4_ERR_ARG, "unknown GGUF type in format '%s' (gguf-f32, -f16, -bf16, -q8_0, -q4_0, -q4_1, "
                       "-q5_0, -q5_1, -q4_k, -q5_k, -q6_k)", format);
    /* OUT.gguf is the file itself; anything else is a directory that receives model.gguf */
    size_t n = strlen(out);
    char path[4096];
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) {
        snprintf(path, sizeof path, "%s", out);
    } else {
        g4_status st = g4_writer_mkdir(out, err); /* with any missing parents, as the other writers */
        if (st) return st;
        if (snprintf(path, sizeof path, "%s/model.gguf", out) >= (int)sizeof path)
            return g4_fail(err, G4_ERR_ARG, "%s: path too long", out);
    }
    return g4_gguf_model_writer_open(path, &o, w, err);
}
