/* The weight source for Hugging Face safetensors checkpoints in bf16, f16 or f32. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"
#include "model/source.h"
#include "util/error.h"

typedef struct {
    g4_st_archive st;
    const char *prefix; /* "model." or "model.language_model." */
} st_source;

static g4_status st_find(void *ctx, const char *name, g4_tensor_ref *out, int *found, g4_error *err) {
    st_source *s = ctx;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s%s", s->prefix, name);
    const g4_st_tensor *t = g4_st_find(&s->st, out->name);
    *found = t != NULL;
    if (!t) return G4_OK;
    out->file = s->st.file_names[t->file];
    return g4_st_dense_ref(t, out, "F32, F16 or BF16", err);
}

g4_status g4_st_dense_ref(const g4_st_tensor *t, g4_tensor_ref *out, const char *expect, g4_error *err) {
    if (g4_wtype_of_dtype(t->dtype) == G4_W_COUNT)
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' has dtype %s; expected %s", out->file, out->name,
                       g4_dtype_name(t->dtype), expect);
    if (t->ndim < 1)
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' is a scalar; expected a vector or matrix", out->file,
                       out->name);
    out->ndim = t->ndim;
    int64_t rows = 1;
    for (int i = 0; i < t->ndim; i++) {
        out->shape[i] = t->shape[i];
        if (i < t->ndim - 1) rows *= t->shape[i];
    }
    int64_t cols = t->shape[t->ndim - 1];
    if (rows > (1 << 30) || cols > (1 << 30))
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' is too large", out->file, out->name);
    out->mat = g4_mat_dense(t->dtype, (int)rows, (int)cols, t->data);
    out->float_dtype = t->dtype;
    return G4_OK;
}

g4_status g4_st_find_i32(const g4_st_archive *a, const char *name, int64_t n, int32_t *out, int *found,
                         g4_error *err) {
    const g4_st_tensor *t = g4_st_find(a, name);
    *found = t != NULL;
    if (!t) return G4_OK;
    const char *file = a->file_names[t->file];
    if (t->ndim != 1 || t->shape[0] != n || (t->dtype != G4_DT_I64 && t->dtype != G4_DT_I32))
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' must be an integer (I64 or I32) vector [%lld]", file, name,
                       (long long)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = t->dtype == G4_DT_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
        if (v < INT32_MIN || v > INT32_MAX)
            return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s'[%lld] = %lld does not fit 32 bits", file, name,
                           (long long)i, (long long)v);
        out[i] = (int32_t)v;
    }
    return G4_OK;
}

static g4_status st_find_i32(void *ctx, const char *name, int64_t n, int32_t *out, int *found, g4_error *err) {
    st_source *s = ctx;
    char full[512];
    snprintf(full, sizeof full, "%s%s", s->prefix, name);
    return g4_st_find_i32(&s->st, full, n, out, found, err);
}

static void st_close(void *ctx) {
    st_source *s = ctx;
    g4_st_close(&s->st);
    free(s);
}

static g4_status open_source(g4_weight_source *src, const char *dir, st_source **out, g4_error *err) {
    memset(src, 0, sizeof *src);
    *out = NULL;
    st_source *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    g4_status st = g4_st_open(&s->st, dir, err);
    if (st) {
        free(s);
        return st;
    }
    s->prefix = "";
    src->ctx = s;
    src->path = s->st.dir;
    src->find = st_find;
    src->close = st_close;
    src->find_i32 = st_find_i32;
    *out = s;
    return G4_OK;
}

g4_status g4_source_open_safetensors_raw(g4_weight_source *src, const char *path, g4_error *err) {
    st_source *s;
    return open_source(src, path, &s, err);
}

const g4_st_archive *g4_source_safetensors_archive(const g4_weight_source *src) {
    return src->find == st_find ? &((const st_source *)src->ctx)->st : NULL;
}

g4_status g4_source_open_safetensors(g4_weight_source *src, const char *dir, int multimodal_layout, g4_error *err) {
    st_source *s;
    g4_status st = open_source(src, dir, &s, err);
    if (st) return st;
    /* The layout config.json implies, unless the file plainly says otherwise. */
    s->prefix = multimodal_layout ? "model.language_model." : "model.";
    if (!g4_st_find(&s->st, multimodal_layout ? "model.language_model.embed_tokens.weight" : "model.embed_tokens.weight")) {
        if (g4_st_find(&s->st, "model.language_model.embed_tokens.weight")) s->prefix = "model.language_model.";
        else if (g4_st_find(&s->st, "model.embed_tokens.weight")) s->prefix = "model.";
    }
    return G4_OK;
}
