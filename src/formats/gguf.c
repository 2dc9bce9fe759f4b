#include "formats/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/mapped_file.h"

struct g4_gguf {
    g4_mapped_file map; /* empty when the caller lent the buffer */
    const uint8_t *data;
    size_t size;
    char *name;
    uint32_t version, alignment;
    uint64_t data_offset;
    g4_gguf_kv *kvs;
    size_t n_kv;
    g4_gguf_tensor *tensors;
    size_t n_tensors;
    /* Open-addressing indexes of (position + 1); 0 marks an empty slot. Models carry a few
     * hundred to a few thousand tensors, looked up by name one at a time while binding. */
    uint32_t *kv_index, *tensor_index;
    size_t kv_mask, tensor_mask;
};

/* ---- ggml tensor types ------------------------------------------------------------------ */

typedef struct ggml_type_info {
    const char *name;
    uint32_t block, size;
} ggml_type_info;

/* Bytes per block as the block structs in ggml-common.h lay them out; ids 4, 5, 31-33 and
 * 36-38 were removed from the format and stay unknown. */
static const ggml_type_info ggml_types[] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},         [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},      [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},      [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},   [12] = {"q4_K", 256, 144},   [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},   [15] = {"q8_K", 256, 292},   [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},  [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110},  [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},         [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},        [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},   [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},   [39] = {"mxfp4", 32, 17},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *g4_ggml_type_name(uint32_t type) {
    return type < N_GGML_TYPES ? ggml_types[type].name : NULL;
}
uint32_t g4_ggml_block_size(uint32_t type) {
    return type < N_GGML_TYPES ? ggml_types[type].block : 0;
}
uint32_t g4_ggml_type_size(uint32_t type) {
    return type < N_GGML_TYPES ? ggml_types[type].size : 0;
}

static const char *const value_type_names[G4_GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};

const char *g4_gguf_type_name(g4_gguf_type t) {
    return (unsigned)t < G4_GGUF_TYPE_COUNT ? value_type_names[t] : "unknown";
}

/* Bytes of one fixed-size value; 0 for strings and arrays. */
static size_t fixed_size(g4_gguf_type t) {
    switch (t) {
    case G4_GGUF_UINT8: case G4_GGUF_INT8: case G4_GGUF_BOOL: return 1;
    case G4_GGUF_UINT16: case G4_GGUF_INT16: return 2;
    case G4_GGUF_UINT32: case G4_GGUF_INT32: case G4_GGUF_FLOAT32: return 4;
    case G4_GGUF_UINT64: case G4_GGUF_INT64: case G4_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

bool g4_gguf_type_is_int(g4_gguf_type t) {
    return t == G4_GGUF_UINT8 || t == G4_GGUF_INT8 || t == G4_GGUF_UINT16 ||
           t == G4_GGUF_INT16 || t == G4_GGUF_UINT32 || t == G4_GGUF_INT32 ||
           t == G4_GGUF_UINT64 || t == G4_GGUF_INT64 || t == G4_GGUF_BOOL;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* Decodes one fixed-size scalar at p (enough bytes guaranteed by the caller). */
static void decode_fixed(g4_gguf_type t, const uint8_t *p, g4_gguf_value *v) {
    v->type = t;
    switch (t) {
    case G4_GGUF_UINT8: v->u = p[0]; break;
    case G4_GGUF_INT8: v->i = (int8_t)p[0]; break;
    case G4_GGUF_UINT16: v->u = rd16(p); break;
    case G4_GGUF_INT16: v->i = (int16_t)rd16(p); break;
    case G4_GGUF_UINT32: v->u = rd32(p); break;
    case G4_GGUF_INT32: v->i = (int32_t)rd32(p); break;
    case G4_GGUF_UINT64: v->u = rd64(p); break;
    case G4_GGUF_INT64: v->i = (int64_t)rd64(p); break;
    case G4_GGUF_BOOL: v->b = p[0] != 0; break;
    case G4_GGUF_FLOAT32: {
        uint32_t bits = rd32(p);
        float f;
        memcpy(&f, &bits, sizeof f);
        v->f = f;
        break;
    }
    case G4_GGUF_FLOAT64: {
        uint64_t bits = rd64(p);
        memcpy(&v->f, &bits, sizeof v->f);
        break;
    }
    default: break;
    }
}

/* ---- parsing ----------------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *d;
    size_t size, pos;
    const char *name;
    g4_error *err;
} reader;

static g4_status truncated(reader *r, const char *what, const char *ctx) {
    return g4_fail(r->err, G4_ERR_FORMAT,
                   "%s: truncated: %s%s%s at offset %zu runs past the end of the file (%zu bytes)",
                   r->name, ctx ? ctx : "", ctx ? ": " : "", what, r->pos, r->size);
}

static g4_status read_u32(reader *r, uint32_t *out, const char *what, const char *ctx) {
    if (r->size - r->pos < 4) return truncated(r, what, ctx);
    *out = rd32(r->d + r->pos);
    r->pos += 4;
    return G4_OK;
}

static g4_status read_u64(reader *r, uint64_t *out, const char *what, const char *ctx) {
    if (r->size - r->pos < 8) return truncated(r, what, ctx);
    *out = rd64(r->d + r->pos);
    r->pos += 8;
    return G4_OK;
}

static g4_status read_str(reader *r, g4_gguf_str *s, const char *what, const char *ctx) {
    uint64_t len = 0;
    g4_status st = read_u64(r, &len, what, ctx);
    if (st) return st;
    if (len > r->size - r->pos)
        return g4_fail(r->err, G4_ERR_FORMAT,
                       "%s: %s%s%s: string length %" PRIu64 " at offset %zu runs past the end of "
                       "the file (%zu bytes)",
                       r->name, ctx ? ctx : "", ctx ? ": " : "", what, len, r->pos - 8, r->size);
    s->data = (const char *)r->d + r->pos;
    s->len = (size_t)len;
    r->pos += (size_t)len;
    return G4_OK;
}

static g4_status read_value(reader *r, g4_gguf_type type, int depth, g4_gguf_value *v,
                            const char *ctx) {
    v->type = type;
    size_t fs = fixed_size(type);
    if (fs) {
        if (r->size - r->pos < fs) return truncated(r, g4_gguf_type_name(type), ctx);
        if (type == G4_GGUF_BOOL && r->d[r->pos] > 1)
            return g4_fail(r->err, G4_ERR_FORMAT, "%s: %s: bool byte %u at offset %zu is not 0 or 1",
                           r->name, ctx, r->d[r->pos], r->pos);
        decode_fixed(type, r->d + r->pos, v);
        r->pos += fs;
        return G4_OK;
    }
    if (type == G4_GGUF_STRING) return read_str(r, &v->str, "string", ctx);
    if (type != G4_GGUF_ARRAY)
        return g4_fail(r->err, G4_ERR_FORMAT, "%s: %s: unknown value type %u at offset %zu",
                       r->name, ctx, (unsigned)type, r->pos - 4);
    if (depth >= G4_GGUF_MAX_DEPTH)
        return g4_fail(r->err, G4_ERR_FORMAT, "%s: %s: arrays nested deeper than %d levels",
                       r->name, ctx, G4_GGUF_MAX_DEPTH);
    uint32_t et = 0;
    uint64_t n = 0;
    g4_status st = read_u32(r, &et, "array element type", ctx);
    if (!st) st = read_u64(r, &n, "array length", ctx);
    if (st) return st;
    if (et >= G4_GGUF_TYPE_COUNT)
        return g4_fail(r->err, G4_ERR_FORMAT, "%s: %s: unknown array element type %u at offset %zu",
                       r->name, ctx, et, r->pos - 12);
    size_t start = r->pos, left = r->size - r->pos;
    size_t es = fixed_size((g4_gguf_type)et);
    /* Every element takes at least min_bytes, so a count the remaining bytes cannot hold is a lie
     * and is rejected before any loop runs over it. */
    size_t min_bytes = es ? es : et == G4_GGUF_STRING ? 8 : 12;
    if (n > left / min_bytes)
        return g4_fail(r->err, G4_ERR_FORMAT,
                       "%s: %s: truncated or corrupt: array of %" PRIu64 " %s elements at offset %zu "
                       "needs at least %" PRIu64
                       " bytes but only %zu remain",
                       r->name, ctx, n, g4_gguf_type_name((g4_gguf_type)et), start - 12,
                       n > UINT64_MAX / min_bytes ? UINT64_MAX : n * min_bytes, left);
    if (es) {
        if (et == G4_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (r->d[start + i] > 1)
                    return g4_fail(r->err, G4_ERR_FORMAT,
                                   "%s: %s: bool byte %u at offset %zu is not 0 or 1", r->name, ctx,
                                   r->d[start + i], (size_t)(start + i));
        r->pos += (size_t)n * es;
    } else if (et == G4_GGUF_STRING) {
        for (uint64_t i = 0; i < n; i++) {
            g4_gguf_str s;
            st = read_str(r, &s, "array string", ctx);
            if (st) return st;
        }
    } else {
        /* An element of an array of arrays is itself (element type, n, data), untagged. */
        for (uint64_t i = 0; i < n; i++) {
            g4_gguf_value tmp;
            st = read_value(r, G4_GGUF_ARRAY, depth + 1, &tmp, ctx);
            if (st) return st;
        }
    }
    v->arr.type = (g4_gguf_type)et;
    v->arr.n = n;
    v->arr.data = r->d + start;
    v->arr.size = r->pos - start;
    return G4_OK;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static size_t index_capacity(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    return cap;
}

/* Inserts position i (name s) into an index; returns the position already holding s, or -1. */
static long index_insert(uint32_t *tab, size_t mask, const g4_gguf_str *names, size_t stride,
                         size_t i, g4_gguf_str s) {
    size_t h = (size_t)hash_bytes(s.data, s.len) & mask;
    for (;; h = (h + 1) & mask) {
        if (!tab[h]) {
            tab[h] = (uint32_t)i + 1;
            return -1;
        }
        const g4_gguf_str *o =
            (const g4_gguf_str *)((const char *)names + stride * (tab[h] - 1));
        if (o->len == s.len && !memcmp(o->data, s.data, s.len)) return (long)tab[h] - 1;
    }
}

static long index_find(const uint32_t *tab, size_t mask, const g4_gguf_str *names, size_t stride,
                       const char *key) {
    if (!tab) return -1;
    size_t len = strlen(key);
    size_t h = (size_t)hash_bytes(key, len) & mask;
    for (;; h = (h + 1) & mask) {
        if (!tab[h]) return -1;
        const g4_gguf_str *o =
            (const g4_gguf_str *)((const char *)names + stride * (tab[h] - 1));
        if (o->len == len && !memcmp(o->data, key, len)) return (long)tab[h] - 1;
    }
}

/* Keys and names quoted in messages are cut short: they come from the file and may be huge. */
static int shown(size_t len) { return len > 120 ? 120 : (int)len; }

static g4_status parse_tensor(reader *r, size_t idx, g4_gguf_tensor *t) {
    char ctx[64];
    snprintf(ctx, sizeof ctx, "tensor #%zu", idx);
    g4_status st = read_str(r, &t->name, "name", ctx);
    if (st) return st;
    snprintf(ctx, sizeof ctx, "tensor '%.*s'", shown(t->name.len) > 40 ? 40 : shown(t->name.len),
             t->name.data);
    st = read_u32(r, &t->n_dims, "n_dims", ctx);
    if (st) return st;
    if (t->n_dims > G4_GGUF_MAX_DIMS)
        return g4_fail(r->err, G4_ERR_FORMAT, "%s: %s: %u dimensions (at most %d)", r->name, ctx,
                       t->n_dims, G4_GGUF_MAX_DIMS);
    for (int d = 0; d < G4_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        st = read_u64(r, &t->ne[d], "dimension", ctx);
        if (st) return st;
        if (t->ne[d] > (uint64_t)INT64_MAX)
            return g4_fail(r->err, G4_ERR_FORMAT, "%s: %s: dimension %u is %" PRIu64, r->name, ctx,
                           d, t->ne[d]);
    }
    st = read_u32(r, &t->type, "type", ctx);
    if (!st) st = read_u64(r, &t->offset, "data offset", ctx);
    return st;
}

/* Checks a tensor's type, shape and data range once the data section's start is known. */
static g4_status check_tensor(const reader *r, const g4_gguf *g, g4_gguf_tensor *t) {
    int nl = shown(t->name.len);
    uint32_t bs = g4_ggml_block_size(t->type), ts = g4_ggml_type_size(t->type);
    if (!bs)
        return g4_fail(r->err, G4_ERR_UNSUPPORTED, "%s: tensor '%.*s': unknown ggml type %u",
                       r->name, nl, t->name.data, t->type);
    if (t->ne[0] % bs)
        return g4_fail(r->err, G4_ERR_FORMAT,
                       "%s: tensor '%.*s': first dimension %" PRIu64
                       " is not a multiple of the %s block size %u",
                       r->name, nl, t->name.data, t->ne[0], g4_ggml_type_name(t->type), bs);
    uint64_t bytes = t->ne[0] / bs;
    bool overflow = bytes > UINT64_MAX / ts;
    bytes *= ts;
    for (int d = 1; d < G4_GGUF_MAX_DIMS && !overflow; d++) {
        if (t->ne[d] && bytes > UINT64_MAX / t->ne[d]) overflow = true;
        bytes *= t->ne[d];
    }
    if (overflow)
        return g4_fail(r->err, G4_ERR_FORMAT, "%s: tensor '%.*s': shape overflows 64 bits",
                       r->name, nl, t->name.data);
    if (t->offset % g->alignment)
        return g4_fail(r->err, G4_ERR_FORMAT,
                       "%s: tensor '%.*s': data offset %" PRIu64 " is not a multiple of the "
                       "alignment %u",
                       r->name, nl, t->name.data, t->offset, g->alignment);
    uint64_t room = g->data_offset <= r->size ? r->size - g->data_offset : 0;
    if (t->offset > room || bytes > room - t->offset)
        return g4_fail(r->err, G4_ERR_FORMAT,
                       "%s: tensor '%.*s': data [%" PRIu64 ", +%" PRIu64 ") past the data section "
                       "start %" PRIu64 " lies outside the file (%zu bytes)",
                       r->name, nl, t->name.data, t->offset, bytes, g->data_offset, r->size);
    t->size = bytes;
    t->data = r->d + g->data_offset + t->offset;
    return G4_OK;
}

static g4_status parse(g4_gguf *g, g4_error *err) {
    reader r = {g->data, g->size, 0, g->name, err};
    if (g->size < 4 || memcmp(g->data, "GGUF", 4) != 0)
        return g4_fail(err, G4_ERR_FORMAT, "%s: not a GGUF file (bad magic)", g->name);
    r.pos = 4;
    g4_status st = read_u32(&r, &g->version, "version", NULL);
    if (st) return st;
    if (g->version == 1)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (only 2 and 3)",
                       g->name);
    if ((g->version & 0xffff) == 0 && (g->version == 0x02000000u || g->version == 0x03000000u))
        return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: big-endian GGUF files are not supported",
                       g->name);
    if (g->version != 2 && g->version != 3)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: unknown GGUF version %u (only 2 and 3)",
                       g->name, g->version);
    uint64_t n_tensors, n_kv;
    st = read_u64(&r, &n_tensors, "tensor count", NULL);
    if (!st) st = read_u64(&r, &n_kv, "key/value count", NULL);
    if (st) return st;
    /* A key/value takes at least 13 bytes (key length, type, one value byte) and a tensor info
     * at least 24: larger counts cannot be true, and checking first bounds the allocations. */
    size_t left = g->size - r.pos;
    if (n_kv > left / 13)
        return g4_fail(err, G4_ERR_FORMAT, "%s: truncated or corrupt: key/value count %" PRIu64 " cannot fit in the %zu "
                       "bytes after the header", g->name, n_kv, left);
    if (n_tensors > left / 24)
        return g4_fail(err, G4_ERR_FORMAT, "%s: truncated or corrupt: tensor count %" PRIu64 " cannot fit in the %zu "
                       "bytes after the header", g->name, n_tensors, left);
    if (n_kv) {
        g->kvs = calloc((size_t)n_kv, sizeof *g->kvs);
        g->kv_mask = index_capacity((size_t)n_kv) - 1;
        g->kv_index = calloc(g->kv_mask + 1, sizeof *g->kv_index);
        if (!g->kvs || !g->kv_index)
            return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory for %" PRIu64 " keys", g->name,
                           n_kv);
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        g4_gguf_kv *kv = &g->kvs[i];
        char ctx[200];
        snprintf(ctx, sizeof ctx, "key #%" PRIu64, i);
        uint32_t type;
        st = read_str(&r, &kv->key, "key", ctx);
        if (st) return st;
        snprintf(ctx, sizeof ctx, "key '%.*s'", shown(kv->key.len), kv->key.data);
        st = read_u32(&r, &type, "value type", ctx);
        if (!st) st = read_value(&r, (g4_gguf_type)type, 0, &kv->value, ctx);
        if (st) return st;
        if (index_insert(g->kv_index, g->kv_mask, &g->kvs[0].key, sizeof *g->kvs, (size_t)i,
                         kv->key) >= 0)
            return g4_fail(err, G4_ERR_FORMAT, "%s: duplicate %s", g->name, ctx);
        g->n_kv = (size_t)i + 1;
    }

    g->alignment = G4_GGUF_DEFAULT_ALIGNMENT;
    const g4_gguf_kv *al = g4_gguf_find(g, "general.alignment");
    if (al) {
        uint64_t a = al->value.type == G4_GGUF_UINT32 || al->value.type == G4_GGUF_UINT64 ||
                             al->value.type == G4_GGUF_UINT16 || al->value.type == G4_GGUF_UINT8
                         ? al->value.u
                         : 0;
        if (!a || a > (1u << 30) || (a & (a - 1)))
            return g4_fail(err, G4_ERR_FORMAT,
                           "%s: general.alignment must be an unsigned power of two, got a %s",
                           g->name, g4_gguf_type_name(al->value.type));
        g->alignment = (uint32_t)a;
    }

    if (n_tensors) {
        g->tensors = calloc((size_t)n_tensors, sizeof *g->tensors);
        g->tensor_mask = index_capacity((size_t)n_tensors) - 1;
        g->tensor_index = calloc(g->tensor_mask + 1, sizeof *g->tensor_index);
        if (!g->tensors || !g->tensor_index)
            return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory for %" PRIu64 " tensors", g->name,
                           n_tensors);
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        g4_gguf_tensor *t = &g->tensors[i];
        st = parse_tensor(&r, (size_t)i, t);
        if (st) return st;
        if (index_insert(g->tensor_index, g->tensor_mask, &g->tensors[0].name, sizeof *g->tensors,
                         (size_t)i, t->name) >= 0)
            return g4_fail(err, G4_ERR_FORMAT, "%s: duplicate tensor name '%.*s'", g->name,
                           shown(t->name.len), t->name.data);
        g->n_tensors = (size_t)i + 1;
    }
    g->data_offset = r.pos + (g->alignment - r.pos % g->alignment) % g->alignment;
    if (n_tensors && g->data_offset > g->size)
        return g4_fail(err, G4_ERR_FORMAT,
                       "%s: truncated: the data section would start at %" PRIu64
                       ", past the end of the file (%zu bytes)",
                       g->name, g->data_offset, g->size);
    for (size_t i = 0; i < g->n_tensors; i++) {
        st = check_tensor(&r, g, &g->tensors[i]);
        if (st) return st;
    }
    return G4_OK;
}

static g4_status finish(g4_gguf *g, g4_gguf **out, g4_error *err) {
    g4_status st = parse(g, err);
    if (st) {
        g4_gguf_close(g);
        return st;
    }
    *out = g;
    return G4_OK;
}

static g4_gguf *alloc_gguf(const char *name, g4_error *err) {
    g4_gguf *g = calloc(1, sizeof *g);
    if (g) g->name = strdup(name ? name : "<buffer>");
    if (!g || !g->name) {
        free(g);
        g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", name ? name : "<buffer>");
        return NULL;
    }
    return g;
}

g4_status g4_gguf_parse(const void *data, size_t size, const char *name, g4_gguf **out,
                        g4_error *err) {
    *out = NULL;
    g4_gguf *g = alloc_gguf(name, err);
    if (!g) return G4_ERR_NOMEM;
    g->data = data;
    g->size = data ? size : 0;
    return finish(g, out, err);
}

g4_status g4_gguf_open(const char *path, g4_gguf **out, g4_error *err) {
    *out = NULL;
    g4_gguf *g = alloc_gguf(path, err);
    if (!g) return G4_ERR_NOMEM;
    g4_status st = g4_mapped_file_open(&g->map, path, err);
    if (st) {
        g4_gguf_close(g);
        return st;
    }
    g->data = g->map.data;
    g->size = g->map.size;
    return finish(g, out, err);
}

void g4_gguf_close(g4_gguf *g) {
    if (!g) return;
    g4_mapped_file_close(&g->map);
    free(g->kvs);
    free(g->kv_index);
    free(g->tensors);
    free(g->tensor_index);
    free(g->name);
    free(g);
}

uint32_t g4_gguf_version(const g4_gguf *g) { return g->version; }
uint32_t g4_gguf_alignment(const g4_gguf *g) { return g->alignment; }
uint64_t g4_gguf_data_offset(const g4_gguf *g) { return g->data_offset; }
const char *g4_gguf_name(const g4_gguf *g) { return g->name; }
size_t g4_gguf_n_kv(const g4_gguf *g) { return g->n_kv; }
const g4_gguf_kv *g4_gguf_kv_at(const g4_gguf *g, size_t i) {
    return i < g->n_kv ? &g->kvs[i] : NULL;
}
size_t g4_gguf_n_tensors(const g4_gguf *g) { return g->n_tensors; }
const g4_gguf_tensor *g4_gguf_tensor_at(const g4_gguf *g, size_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const g4_gguf_kv *g4_gguf_find(const g4_gguf *g, const char *key) {
    if (!g->n_kv) return NULL;
    long i = index_find(g->kv_index, g->kv_mask, &g->kvs[0].key, sizeof *g->kvs, key);
    return i < 0 ? NULL : &g->kvs[i];
}

const g4_gguf_tensor *g4_gguf_find_tensor(const g4_gguf *g, const char *name) {
    if (!g->n_tensors) return NULL;
    long i = index_find(g->tensor_index, g->tensor_mask, &g->tensors[0].name, sizeof *g->tensors,
                        name);
    return i < 0 ? NULL : &g->tensors[i];
}

/* ---- typed access ------------------------------------------------------------------------ */

static g4_status lookup(const g4_gguf *g, const char *key, const g4_gguf_kv **kv, g4_error *err) {
    *kv = g4_gguf_find(g, key);
    if (!*kv) return g4_fail(err, G4_ERR_FORMAT, "%s: missing key '%s'", g->name, key);
    return G4_OK;
}

static g4_status wrong_type(const g4_gguf *g, const char *key, const g4_gguf_kv *kv,
                            const char *want, g4_error *err) {
    return g4_fail(err, G4_ERR_FORMAT, "%s: key '%s' is a %s, expected %s", g->name, key,
                   g4_gguf_type_name(kv->value.type), want);
}

static bool is_unsigned(g4_gguf_type t) {
    return t == G4_GGUF_UINT8 || t == G4_GGUF_UINT16 || t == G4_GGUF_UINT32 ||
           t == G4_GGUF_UINT64;
}
static bool is_signed(g4_gguf_type t) {
    return t == G4_GGUF_INT8 || t == G4_GGUF_INT16 || t == G4_GGUF_INT32 || t == G4_GGUF_INT64;
}

g4_status g4_gguf_get_uint(const g4_gguf *g, const char *key, uint64_t *out, g4_error *err) {
    const g4_gguf_kv *kv;
    g4_status st = lookup(g, key, &kv, err);
    if (st) return st;
    if (is_unsigned(kv->value.type)) {
        *out = kv->value.u;
        return G4_OK;
    }
    if (is_signed(kv->value.type)) {
        if (kv->value.i < 0)
            return g4_fail(err, G4_ERR_FORMAT, "%s: key '%s' is negative (%" PRId64 ")", g->name,
                           key, kv->value.i);
        *out = (uint64_t)kv->value.i;
        return G4_OK;
    }
    return wrong_type(g, key, kv, "an integer", err);
}

g4_status g4_gguf_get_int(const g4_gguf *g, const char *key, int64_t *out, g4_error *err) {
    const g4_gguf_kv *kv;
    g4_status st = lookup(g, key, &kv, err);
    if (st) return st;
    if (is_signed(kv->value.type)) {
        *out = kv->value.i;
        return G4_OK;
    }
    if (is_unsigned(kv->value.type)) {
        if (kv->value.u > (uint64_t)INT64_MAX)
            return g4_fail(err, G4_ERR_FORMAT, "%s: key '%s' is too large (%" PRIu64 ")", g->name,
                           key, kv->value.u);
        *out = (int64_t)kv->value.u;
        return G4_OK;
    }
    return wrong_type(g, key, kv, "an integer", err);
}

g4_status g4_gguf_get_float(const g4_gguf *g, const char *key, double *out, g4_error *err) {
    const g4_gguf_kv *kv;
    g4_status st = lookup(g, key, &kv, err);
    if (st) return st;
    if (kv->value.type != G4_GGUF_FLOAT32 && kv->value.type != G4_GGUF_FLOAT64)
        return wrong_type(g, key, kv, "a float", err);
    *out = kv->value.f;
    return G4_OK;
}

g4_status g4_gguf_get_bool(const g4_gguf *g, const char *key, bool *out, g4_error *err) {
    const g4_gguf_kv *kv;
    g4_status st = lookup(g, key, &kv, err);
    if (st) return st;
    if (kv->value.type != G4_GGUF_BOOL) return wrong_type(g, key, kv, "a bool", err);
    *out = kv->value.b;
    return G4_OK;
}

g4_status g4_gguf_get_str(const g4_gguf *g, const char *key, g4_gguf_str *out, g4_error *err) {
    const g4_gguf_kv *kv;
    g4_status st = lookup(g, key, &kv, err);
    if (st) return st;
    if (kv->value.type != G4_GGUF_STRING) return wrong_type(g, key, kv, "a string", err);
    *out = kv->value.str;
    return G4_OK;
}

g4_status g4_gguf_get_array(const g4_gguf *g, const char *key, int elem_type, g4_gguf_array *out,
                            g4_error *err) {
    const g4_gguf_kv *kv;
    g4_status st = lookup(g, key, &kv, err);
    if (st) return st;
    if (kv->value.type != G4_GGUF_ARRAY) return wrong_type(g, key, kv, "an array", err);
    if (elem_type >= 0 && kv->value.arr.type != (g4_gguf_type)elem_type)
        return g4_fail(err, G4_ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s", g->name,
                       key, g4_gguf_type_name(kv->value.arr.type),
                       g4_gguf_type_name((g4_gguf_type)elem_type));
    *out = kv->value.arr;
    return G4_OK;
}

int64_t g4_gguf_array_int(const g4_gguf_array *a, uint64_t i) {
    size_t es = fixed_size(a->type);
    if (!es || i >= a->n) return 0;
    g4_gguf_value v;
    decode_fixed(a->type, a->data + i * es, &v);
    if (a->type == G4_GGUF_BOOL) return v.b;
    return is_signed(a->type) ? v.i : (int64_t)v.u;
}

double g4_gguf_array_float(const g4_gguf_array *a, uint64_t i) {
    if ((a->type != G4_GGUF_FLOAT32 && a->type != G4_GGUF_FLOAT64) || i >= a->n) return 0;
    g4_gguf_value v;
    decode_fixed(a->type, a->data + i * fixed_size(a->type), &v);
    return v.f;
}

void g4_gguf_iter_init(g4_gguf_iter *it, const g4_gguf_array *a) {
    it->arr = *a;
    it->p = a->data;
    it->i = 0;
}

/* The array was validated when the file was parsed; the checks here only keep a hand-made
 * g4_gguf_array from walking out of its own bytes. */
bool g4_gguf_iter_next(g4_gguf_iter *it, g4_gguf_value *v) {
    if (it->i >= it->arr.n) return false;
    const uint8_t *end = it->arr.data + it->arr.size;
    size_t left = (size_t)(end - it->p);
    size_t es = fixed_size(it->arr.type);
    if (es) {
        if (left < es) return false;
        decode_fixed(it->arr.type, it->p, v);
        it->p += es;
    } else if (it->arr.type == G4_GGUF_STRING) {
        if (left < 8) return false;
        uint64_t len = rd64(it->p);
        if (len > left - 8) return false;
        v->type = G4_GGUF_STRING;
        v->str.data = (const char *)it->p + 8;
        v->str.len = (size_t)len;
        it->p += 8 + len;
    } else if (it->arr.type == G4_GGUF_ARRAY) {
        reader r = {it->p, left, 0, "", NULL};
        if (read_value(&r, G4_GGUF_ARRAY, 1, v, "")) return false;
        it->p += r.pos;
    } else {
        return false;
    }
    it->i++;
    return true;
}
