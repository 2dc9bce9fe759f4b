/* g4 convert on a drafter: open it in whatever format it is stored (safetensors, MLX, QAT, pack),
 * bind through a recording source, then stream every tensor the binder read into the writer under
 * its full name (dequantised row by row), and the token ordering as I64. The writers keep drafter
 * names and config shape as given (writer_st.h: g4_writer_config_is_drafter). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/drafter.h"
#include "model/source.h"
#include "model/writer.h"
#include "util/error.h"

g4_status g4_convert_drafter(const char *in_path, const g4_model_writer *w, g4_error *err) {
    g4_drafter *d = NULL;
    char *json = NULL;
    float *buf = NULL;
    int64_t *ints = NULL;
    g4_writer_rows pending = {0};
    g4_weight_source rec;
    g4_status st = g4_drafter_open(in_path, &d, &json, err);
    if (!st && !(st = g4_source_open_recorder(&rec, &d->src, err))) d->src = rec;
    if (!st) st = g4_drafter_bind(d, err);
    int n = 0;
    const g4_recorded_tensor *t = st ? NULL : g4_source_recorded(&d->src, &n);
    if (!st) st = w->set_config(w->ctx, json, err);
    for (int i = 0; i < n && !st; i++) {
        if (!t[i].is_int) {
            st = w->declare(w->ctx, t[i].ref.name, t[i].ref.ndim, t[i].ref.shape, err);
        } else if (!w->declare_i64) {
            st = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: this output format cannot store the drafter's integer tensor '%s'",
                         in_path, t[i].ref.name);
        } else {
            st = w->declare_i64(w->ctx, t[i].ref.name, t[i].n, err);
        }
    }
    if (!st) st = w->begin(w->ctx, err);
    const size_t chunk = (size_t)1 << 22; /* floats per chunk */
    if (!st && !(buf = malloc(sizeof(float) * chunk))) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !st; i++) {
        if (t[i].is_int) continue;
        const g4_tensor_ref *r = &t[i].ref;
        int64_t rows = r->mat.rows, cols = r->mat.cols, per = (int64_t)chunk / (cols > 0 ? cols : 1);
        if (per < 1) {
            st = g4_fail(err, G4_ERR_UNSUPPORTED, "tensor '%s': rows of %lld columns are too wide", r->name, (long long)cols);
            break;
        }
        for (int64_t r0 = 0; r0 < rows && !st; r0 += per) {
            int64_t k = rows - r0 < per ? rows - r0 : per;
            for (int64_t j = 0; j < k; j++) g4_mat_row_f32(&r->mat, (int)(r0 + j), buf + (size_t)j * (size_t)cols);
            st = g4_writer_put_rows(w, &pending, r->name, r->ndim, r->shape, r0, k, buf, err);
        }
    }
    for (int i = 0; i < n && !st; i++) {
        if (!t[i].is_int) continue;
        int64_t *v = realloc(ints, sizeof(int64_t) * (size_t)(t[i].n > 0 ? t[i].n : 1));
        if (!v) {
            st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
            break;
        }
        ints = v;
        for (int64_t j = 0; j < t[i].n; j++) ints[j] = t[i].ints[j];
        st = w->write_i64(w->ctx, t[i].ref.name, ints, err);
    }
    g4_writer_rows_reset(&pending);
    if (st) w->abort(w->ctx);
    else st = w->finish(w->ctx, err);
    free(buf);
    free(ints);
    free(json);
    g4_drafter_free(d);
    return st;
}
