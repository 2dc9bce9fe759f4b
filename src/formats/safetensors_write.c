#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"
#include "util/error.h"

struct g4_st_writer {
    FILE *f;
    char *path;
    cJSON *header;
    size_t declared, written; /* bytes */
    int began;
};

g4_status g4_st_writer_create(const char *path, g4_st_writer **out, g4_error *err) {
    *out = NULL;
    g4_st_writer *w = calloc(1, sizeof *w);
    if (!w) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    w->path = strdup(path);
    w->header = cJSON_CreateObject();
    w->f = fopen(path, "wb");
    if (!w->f || !w->path || !w->header) {
        g4_status st = w->f ? g4_fail(err, G4_ERR_NOMEM, "out of memory")
                            : g4_fail(err, G4_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        g4_st_writer_abort(w);
        return st;
    }
    cJSON *meta = cJSON_AddObjectToObject(w->header, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    *out = w;
    return G4_OK;
}

g4_status g4_st_writer_declare(g4_st_writer *w, const char *name, g4_dtype dtype, int ndim, const int64_t *shape,
                               g4_error *err) {
    if (w->began) return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' declared after data began", w->path, name);
    if (ndim < 0 || ndim > G4_MAX_DIMS || dtype >= G4_DT_COUNT)
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s': bad dtype or rank", w->path, name);
    if (cJSON_GetObjectItemCaseSensitive(w->header, name))
        return g4_fail(err, G4_ERR_ARG, "%s: tensor '%s' declared twice", w->path, name);
    size_t bytes = g4_dtype_size(dtype);
    cJSON *t = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *off = cJSON_CreateArray();
    cJSON_AddStringToObject(t, "dtype", g4_dtype_name(dtype));
    for (int i = 0; i < ndim; i++) {
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[i]));
        bytes *= (size_t)shape[i];
    }
    cJSON_AddItemToObject(t, "shape", sh);
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)w->declared));
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(w->declared + bytes)));
    cJSON_AddItemToObject(t, "data_offsets", off);
    cJSON_AddItemToObject(w->header, name, t);
    w->declared += bytes;
    return G4_OK;
}

g4_status g4_st_writer_begin_data(g4_st_writer *w, g4_error *err) {
    char *text = cJSON_PrintUnformatted(w->header);
    if (!text) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    size_t n = strlen(text), padded = (n + 7) & ~(size_t)7; /* keep tensor data 8-byte aligned */
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len, 1, 8, w->f) == 8 && fwrite(text, 1, n, w->f) == n;
    for (size_t i = n; ok && i < padded; i++) ok = fputc(' ', w->f) != EOF;
    free(text);
    w->began = 1;
    if (!ok) return g4_fail(err, G4_ERR_IO, "%s: write error", w->path);
    return G4_OK;
}

g4_status g4_st_writer_write(g4_st_writer *w, const void *data, size_t n, g4_error *err) {
    if (!w->began) return g4_fail(err, G4_ERR_ARG, "%s: data written before the header", w->path);
    if (w->written + n > w->declared)
        return g4_fail(err, G4_ERR_ARG, "%s: more data written than declared", w->path);
    if (n && fwrite(data, 1, n, w->f) != n) return g4_fail(err, G4_ERR_IO, "%s: write error: %s", w->path, strerror(errno));
    w->written += n;
    return G4_OK;
}

g4_status g4_st_writer_finish(g4_st_writer *w, g4_error *err) {
    g4_status st = G4_OK;
    if (!w->began) st = g4_st_writer_begin_data(w, err);
    if (!st && w->written != w->declared)
        st = g4_fail(err, G4_ERR_ARG, "%s: %zu of %zu declared bytes written", w->path, w->written, w->declared);
    if (fclose(w->f) != 0 && !st) st = g4_fail(err, G4_ERR_IO, "%s: write error on close", w->path);
    w->f = NULL;
    g4_st_writer_abort(w);
    return st;
}

void g4_st_writer_abort(g4_st_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    cJSON_Delete(w->header);
    free(w->path);
    free(w);
}
