/* The weight source for native packs (formats/pack.h). Opening maps the file, parses the manifest
 * and validates every tensor entry up front (fields, part bounds, alignment, sizes against the
 * g4_mat fields, g4_mat_validate, no overlaps); find() is then a binary search that hands out a
 * g4_mat pointing into the map. Nothing is converted or copied, so loading costs the manifest
 * parse plus page-table work. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/pack.h"
#include "formats/safetensors.h"
#include "model/source.h"
#include "util/error.h"

typedef struct {
    const char *name;   /* in the manifest */
    int is_int;
    g4_tensor_ref ref;  /* is_int: ref.mat.data = int32 values, ref.shape[0] elements */
} pack_tensor;

typedef struct {
    g4_pack pack;
    pack_tensor *t;     /* sorted by name */
    int n;
} pack_source;

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const pack_tensor *)a)->name, ((const pack_tensor *)b)->name);
}

static const pack_tensor *lookup(const pack_source *s, const char *name) {
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, s->t[mid].name);
        if (!c) return &s->t[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

static g4_status pack_find(void *ctx, const char *name, g4_tensor_ref *out, int *found, g4_error *err) {
    (void)err;
    pack_source *s = ctx;
    const pack_tensor *t = lookup(s, name);
    memset(out, 0, sizeof *out);
    *found = t && !t->is_int;
    if (!*found) {
        snprintf(out->name, sizeof out->name, "%s", name);
        return G4_OK;
    }
    *out = t->ref;
    return G4_OK;
}

static g4_status pack_find_i32(void *ctx, const char *name, int64_t n, int32_t *out, int *found, g4_error *err) {
    pack_source *s = ctx;
    const pack_tensor *t = lookup(s, name);
    *found = t && t->is_int;
    if (!*found) return G4_OK;
    if (t->ref.shape[0] != n)
        return g4_fail(err, G4_ERR_TENSOR, "%s: integer tensor '%s' has %lld elements; expected %lld", s->pack.path, name,
                       (long long)t->ref.shape[0], (long long)n);
    memcpy(out, t->ref.mat.data, sizeof(int32_t) * (size_t)n);
    return G4_OK;
}

static void pack_close(void *ctx) {
    pack_source *s = ctx;
    free(s->t);
    g4_pack_close(&s->pack);
    free(s);
}

/* ---- manifest fields ------------------------------------------------------------------------ */

typedef struct {
    g4_pack *p;
    const cJSON *o;
    const char *name;
    g4_error *err;
} entry;

static g4_status field_int(const entry *e, const char *key, int required, int64_t min, int64_t max, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e->o, key);
    if (!v) {
        if (required) return g4_fail(e->err, G4_ERR_FORMAT, "%s: tensor '%s': missing \"%s\"", e->p->path, e->name, key);
        *out = 0;
        return G4_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1e300;
    if (!cJSON_IsNumber(v) || d != (double)(int64_t)d || d < (double)min || d > (double)max)
        return g4_fail(e->err, G4_ERR_FORMAT, "%s: tensor '%s': \"%s\" must be an integer in [%lld, %lld]", e->p->path,
                       e->name, key, (long long)min, (long long)max);
    *out = (int64_t)d;
    return G4_OK;
}

static g4_status field_float(const entry *e, const char *key, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e->o, key);
    *out = 0;
    if (!v) return G4_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 3.4e38)
        return g4_fail(e->err, G4_ERR_FORMAT, "%s: tensor '%s': \"%s\" must be a finite non-negative number", e->p->path,
                       e->name, key);
    *out = (float)v->valuedouble;
    return G4_OK;
}

static g4_status field_dtype(const entry *e, const char *key, int required, g4_dtype *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e->o, key);
    if (!v && !required) {
        *out = G4_DT_F32;
        return G4_OK;
    }
    for (int i = 0; cJSON_IsString(v) && i < G4_DT_COUNT; i++)
        if (!strcmp(v->valuestring, g4_dtype_name((g4_dtype)i))) {
            *out = (g4_dtype)i;
            return G4_OK;
        }
    return g4_fail(e->err, G4_ERR_FORMAT, "%s: tensor '%s': \"%s\" %s%s%s is not a dtype g4 knows", e->p->path, e->name,
                   key, cJSON_IsString(v) ? "'" : "", cJSON_IsString(v) ? v->valuestring : "(missing or not a string)",
                   cJSON_IsString(v) ? "'" : "");
}

static g4_status field_shape(const entry *e, g4_tensor_ref *ref) {
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e->o, "shape");
    int nd = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : -1;
    if (nd < 1 || nd > G4_MAX_DIMS)
        return g4_fail(e->err, G4_ERR_FORMAT, "%s: tensor '%s': \"shape\" must list 1 to %d dimensions", e->p->path,
                       e->name, G4_MAX_DIMS);
    ref->ndim = nd;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        double v = cJSON_IsNumber(d) ? d->valuedouble : -1;
        if (!(v >= 1) || v > (double)(1 << 30) || v != (double)(int64_t)v)
            return g4_fail(e->err, G4_ERR_FORMAT, "%s: tensor '%s': shape dimension %d is not an integer in [1, 2^30]",
                           e->p->path, e->name, i);
        ref->shape[i] = (int64_t)v;
    }
    return G4_OK;
}

static g4_status field_wtype(const entry *e, g4_wtype *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e->o, "wtype");
    for (int i = 0; cJSON_IsString(v) && i < G4_W_COUNT; i++)
        if (!strcmp(v->valuestring, g4_wtype_name((g4_wtype)i))) {
            *out = (g4_wtype)i;
            return G4_OK;
        }
    char known[512] = "";
    size_t used = 0;
    for (int i = 0; i < G4_W_COUNT && used < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", g4_wtype_name((g4_wtype)i));
    return g4_fail(e->err, G4_ERR_UNSUPPORTED, "%s: tensor '%s' has weight type %s%.64s%s, which this g4 does not know (%s)",
                   e->p->path, e->name, cJSON_IsString(v) ? "'" : "", cJSON_IsString(v) ? v->valuestring : "(none)",
                   cJSON_IsString(v) ? "'" : "", known);
}

/* One "tensors" entry into a g4_tensor_ref pointing into the map. */
static g4_status read_tensor(g4_pack *p, const cJSON *o, pack_tensor *t, g4_error *err) {
    entry e = {p, o, t->name, err};
    g4_tensor_ref *ref = &t->ref;
    g4_mat *m = &ref->mat;
    int64_t rows, cols, row_bytes, bits, group, stride;
    g4_status st;
    if ((st = field_shape(&e, ref)) || (st = field_wtype(&e, &m->type)) ||
        (st = field_int(&e, "rows", 1, 1, 1 << 30, &rows)) || (st = field_int(&e, "cols", 1, 1, 1 << 30, &cols)) ||
        (st = field_int(&e, "row_bytes", 1, 1, (int64_t)1 << 32, &row_bytes)) ||
        (st = field_int(&e, "bits", 0, 0, 64, &bits)) || (st = field_int(&e, "group", 0, 0, 1 << 30, &group)) ||
        (st = field_int(&e, "scale_stride", 0, 0, 1 << 24, &stride)) ||
        (st = field_dtype(&e, "scale_dtype", 0, &m->scale_dtype)) ||
        (st = field_dtype(&e, "float_dtype", 1, &ref->float_dtype)) ||
        (st = field_float(&e, "in_act_scale", &m->in_act_scale)) ||
        (st = field_float(&e, "out_act_scale", &m->out_act_scale)))
        return st;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(o, "layout");
    if (lay) {
        if (!cJSON_IsString(lay) || strcmp(lay->valuestring, "split"))
            return g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s': unknown layout (only \"split\" is known)", p->path, t->name);
        m->split = 1;
    }
    int64_t srows = 1;
    for (int i = 0; i < ref->ndim - 1; i++) srows *= ref->shape[i];
    if (srows != rows || ref->shape[ref->ndim - 1] != cols)
        return g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s': shape implies %lld rows of %lld columns, the entry says [%lld, %lld]",
                       p->path, t->name, (long long)srows, (long long)ref->shape[ref->ndim - 1], (long long)rows,
                       (long long)cols);
    m->rows = (int)rows;
    m->cols = (int)cols;
    m->row_bytes = (size_t)row_bytes;
    m->bits = (int)bits;
    m->group = (int)group;
    m->scale_stride = (size_t)stride;
    const uint8_t *ptr;
    uint64_t n;
    if ((st = g4_pack_part(p, cJSON_GetObjectItemCaseSensitive(o, "data"), t->name, "data", rows * row_bytes, &ptr, &n, err)))
        return st;
    m->data = ptr;
    int64_t sbytes = rows * stride * (int64_t)g4_dtype_size(m->scale_dtype);
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(o, "scales"), *bi = cJSON_GetObjectItemCaseSensitive(o, "biases");
    if (sc) {
        if ((st = g4_pack_part(p, sc, t->name, "scales", sbytes, &ptr, &n, err))) return st;
        m->scales = ptr;
    }
    if (bi) {
        if (!sc) return g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' has biases but no scales", p->path, t->name);
        if ((st = g4_pack_part(p, bi, t->name, "biases", sbytes, &ptr, &n, err))) return st;
        m->biases = ptr;
    }
    if (g4_mat_validate(m, err)) return g4_fail_prefix(err, G4_ERR_TENSOR, "%s: tensor '%s'", p->path, t->name);
    ref->file = p->path;
    snprintf(ref->name, sizeof ref->name, "%s", t->name);
    return G4_OK;
}

static g4_status read_int_tensor(g4_pack *p, const cJSON *o, pack_tensor *t, g4_error *err) {
    entry e = {p, o, t->name, err};
    g4_dtype dt;
    g4_status st = field_shape(&e, &t->ref);
    if (!st) st = field_dtype(&e, "dtype", 1, &dt);
    if (st) return st;
    if (dt != G4_DT_I32 || t->ref.ndim != 1)
        return g4_fail(err, G4_ERR_FORMAT, "%s: integer tensor '%s' must be a 1-D I32 vector", p->path, t->name);
    const uint8_t *ptr;
    uint64_t n;
    if ((st = g4_pack_part(p, cJSON_GetObjectItemCaseSensitive(o, "data"), t->name, "data", 4 * t->ref.shape[0], &ptr, &n,
                           err)))
        return st;
    t->is_int = 1;
    t->ref.mat.data = ptr;
    t->ref.file = p->path;
    snprintf(t->ref.name, sizeof t->ref.name, "%s", t->name);
    return G4_OK;
}

static g4_status read_list(pack_source *s, const char *key, int is_int, g4_error *err) {
    g4_pack *p = &s->pack;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p->manifest, key);
    if (!list && is_int) return G4_OK;
    if (!cJSON_IsArray(list)) return g4_fail(err, G4_ERR_FORMAT, "%s: manifest \"%s\" must be an array", p->path, key);
    for (const cJSON *o = list->child; o; o = o->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
        if (!cJSON_IsObject(o) || !cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) >= 256)
            return g4_fail(err, G4_ERR_FORMAT, "%s: manifest \"%s\" entry #%d has no valid \"name\"", p->path, key, s->n);
        pack_tensor *t = &s->t[s->n];
        memset(t, 0, sizeof *t);
        t->name = nm->valuestring;
        g4_status st = is_int ? read_int_tensor(p, o, t, err) : read_tensor(p, o, t, err);
        if (st) return st;
        s->n++;
    }
    return G4_OK;
}

g4_status g4_source_open_pack(g4_weight_source *src, const char *path, const char *kind, char **config_json,
                              g4_error *err) {
    memset(src, 0, sizeof *src);
    *config_json = NULL;
    pack_source *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    g4_status st = g4_pack_open(&s->pack, path, err);
    if (st) {
        free(s);
        return st;
    }
    g4_pack *p = &s->pack;
    const char *k = g4_pack_string(p, "kind"), *cfg = g4_pack_string(p, "config");
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(p->manifest, "tensors");
    const cJSON *il = cJSON_GetObjectItemCaseSensitive(p->manifest, "int_tensors");
    int cap = (cJSON_IsArray(tl) ? cJSON_GetArraySize(tl) : 0) + (cJSON_IsArray(il) ? cJSON_GetArraySize(il) : 0);
    if (!k || (strcmp(k, "model") && strcmp(k, "drafter")))
        st = g4_fail(err, G4_ERR_FORMAT, "%s: manifest \"kind\" must be \"model\" or \"drafter\"", path);
    else if (strcmp(k, kind))
        st = g4_fail(err, G4_ERR_ARG, "%s: this pack holds a %s, not a %s", path, k, kind);
    else if (!cfg)
        st = g4_fail(err, G4_ERR_FORMAT, "%s: manifest has no \"config\" text", path);
    else if (!(s->t = calloc((size_t)(cap ? cap : 1), sizeof *s->t)) || !(*config_json = strdup(cfg)))
        st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    if (!st) st = read_list(s, "tensors", 0, err);
    if (!st) st = read_list(s, "int_tensors", 1, err);
    if (!st) {
        /* blobs take part in the overlap check too */
        const cJSON *blobs = cJSON_GetObjectItemCaseSensitive(p->manifest, "blobs");
        for (const cJSON *b = cJSON_IsObject(blobs) ? blobs->child : NULL; b && !st; b = b->next) {
            const uint8_t *d;
            uint64_t n;
            st = g4_pack_part(p, b, b->string, "blob", -1, &d, &n, err);
        }
    }
    if (!st) st = g4_pack_check_overlap(p, err);
    if (!st && s->n > 1) {
        qsort(s->t, (size_t)s->n, sizeof *s->t, cmp_tensor);
        for (int i = 1; i < s->n && !st; i++)
            if (!strcmp(s->t[i - 1].name, s->t[i].name))
                st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' is listed twice", path, s->t[i].name);
    }
    if (st) {
        free(*config_json);
        *config_json = NULL;
        pack_close(s);
        return st;
    }
    src->ctx = s;
    src->path = s->pack.path;
    src->find = pack_find;
    src->close = pack_close;
    src->find_i32 = pack_find_i32;
    return G4_OK;
}
