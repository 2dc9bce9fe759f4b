/* A recording weight source: binds go through it unchanged, and afterwards it lists exactly the
 * tensors the binder read, with the references the format's source handed out. The pack writer
 * stores those references' bytes as they are, so a pack holds what the engine computed with,
 * whatever the input format was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/source.h"
#include "util/error.h"

typedef struct {
    g4_weight_source inner;
    g4_recorded_tensor *t;
    int n, cap;
} recorder;

static g4_recorded_tensor *add(recorder *r, const char *name, g4_error *err) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->t[i].ref.name, name)) return &r->t[i];
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 128;
        g4_recorded_tensor *t = realloc(r->t, sizeof *t * (size_t)cap);
        if (!t) {
            g4_fail(err, G4_ERR_NOMEM, "out of memory");
            return NULL;
        }
        r->t = t;
        r->cap = cap;
    }
    g4_recorded_tensor *t = &r->t[r->n++];
    memset(t, 0, sizeof *t);
    return t;
}

static g4_status rec_find(void *ctx, const char *name, g4_tensor_ref *out, int *found, g4_error *err) {
    recorder *r = ctx;
    g4_status st = r->inner.find(r->inner.ctx, name, out, found, err);
    if (st || !*found) return st;
    if (strlen(name) >= sizeof out->name)
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor name '%.64s...' too long", r->inner.path, name);
    g4_recorded_tensor *t = add(r, name, err);
    if (!t) return G4_ERR_NOMEM;
    free(t->ints);
    memset(t, 0, sizeof *t);
    t->ref = *out;
    snprintf(t->ref.name, sizeof t->ref.name, "%s", name);
    return G4_OK;
}

static g4_status rec_find_i32(void *ctx, const char *name, int64_t n, int32_t *out, int *found, g4_error *err) {
    recorder *r = ctx;
    *found = 0;
    if (!r->inner.find_i32) return G4_OK;
    g4_status st = r->inner.find_i32(r->inner.ctx, name, n, out, found, err);
    if (st || !*found) return st;
    if (strlen(name) >= sizeof r->t[0].ref.name)
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor name '%.64s...' too long", r->inner.path, name);
    int32_t *copy = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!copy) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    g4_recorded_tensor *t = add(r, name, err);
    if (!t) {
        free(copy);
        return G4_ERR_NOMEM;
    }
    free(t->ints);
    memset(t, 0, sizeof *t);
    memcpy(copy, out, sizeof(int32_t) * (size_t)n);
    snprintf(t->ref.name, sizeof t->ref.name, "%s", name);
    t->ref.file = r->inner.path;
    t->ref.ndim = 1;
    t->ref.shape[0] = n;
    t->is_int = 1;
    t->n = n;
    t->ints = copy;
    return G4_OK;
}

static void rec_close(void *ctx) {
    recorder *r = ctx;
    if (r->inner.close) r->inner.close(r->inner.ctx);
    for (int i = 0; i < r->n; i++) free(r->t[i].ints);
    free(r->t);
    free(r);
}

g4_status g4_source_open_recorder(g4_weight_source *src, const g4_weight_source *inner, g4_error *err) {
    recorder *r = calloc(1, sizeof *r);
    if (!r) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    r->inner = *inner;
    memset(src, 0, sizeof *src);
    src->ctx = r;
    src->path = inner->path;
    src->find = rec_find;
    src->close = rec_close;
    src->find_i32 = rec_find_i32;
    return G4_OK;
}

const g4_recorded_tensor *g4_source_recorded(const g4_weight_source *src, int *n) {
    *n = 0;
    if (src->find != rec_find) return NULL;
    const recorder *r = src->ctx;
    *n = r->n;
    return r->t;
}
