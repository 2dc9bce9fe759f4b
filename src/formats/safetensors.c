#include "formats/safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"

static const struct {
    const char *name;
    size_t size;
} dtype_table[G4_DT_COUNT] = {
    [G4_DT_F32] = {"F32", 4},  [G4_DT_F16] = {"F16", 2},   [G4_DT_BF16] = {"BF16", 2},
    [G4_DT_F64] = {"F64", 8},  [G4_DT_I64] = {"I64", 8},   [G4_DT_I32] = {"I32", 4},
    [G4_DT_I16] = {"I16", 2},  [G4_DT_I8] = {"I8", 1},     [G4_DT_U64] = {"U64", 8},
    [G4_DT_U32] = {"U32", 4},  [G4_DT_U16] = {"U16", 2},   [G4_DT_U8] = {"U8", 1},
    [G4_DT_BOOL] = {"BOOL", 1}, [G4_DT_F8_E4M3] = {"F8_E4M3", 1}, [G4_DT_F8_E5M2] = {"F8_E5M2", 1},
};

const char *g4_dtype_name(g4_dtype t) { return t < G4_DT_COUNT ? dtype_table[t].name : "?"; }
size_t g4_dtype_size(g4_dtype t) { return t < G4_DT_COUNT ? dtype_table[t].size : 0; }

int64_t g4_st_numel(const g4_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Header cap: real checkpoints have headers of a few hundred KB; 100 MB means a lying length. */
enum { MAX_HEADER = 100 << 20 };

static int parse_dtype(const char *s, g4_dtype *out) {
    for (int i = 0; i < G4_DT_COUNT; i++)
        if (!strcmp(s, dtype_table[i].name)) {
            *out = (g4_dtype)i;
            return 1;
        }
    return 0;
}

typedef struct {
    size_t begin, end;
    const char *name;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int tensor_cmp(const void *a, const void *b) {
    return strcmp(((const g4_st_tensor *)a)->name, ((const g4_st_tensor *)b)->name);
}

g4_status g4_st_add_file(g4_st_archive *a, const char *path, g4_error *err) {
    g4_mapped_file mf;
    g4_status st = g4_mapped_file_open(&mf, path, err);
    if (st) return st;
    /* Register the file first so close() releases it whatever happens below. */
    g4_mapped_file *nf = realloc(a->files, sizeof *nf * (size_t)(a->n_files + 1));
    char **nn = nf ? realloc(a->file_names, sizeof *nn * (size_t)(a->n_files + 1)) : NULL;
    if (nf) a->files = nf;
    if (nn) a->file_names = nn;
    char *pathcopy = nn ? strdup(path) : NULL;
    if (!pathcopy) {
        g4_mapped_file_close(&mf);
        return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", path);
    }
    int fi = a->n_files++;
    a->files[fi] = mf;
    a->file_names[fi] = pathcopy;

    if (mf.size < 8)
        return g4_fail(err, G4_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length",
                       path, mf.size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | mf.data[i];
    if (hlen > mf.size - 8)
        return g4_fail(err, G4_ERR_FORMAT,
                       "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                       (unsigned long long)hlen, mf.size);
    if (hlen > MAX_HEADER)
        return g4_fail(err, G4_ERR_FORMAT, "%s: header length %llu is implausibly large", path,
                       (unsigned long long)hlen);
    const uint8_t *base = mf.data + 8 + hlen;
    size_t data_size = mf.size - 8 - (size_t)hlen;
    cJSON *root = cJSON_ParseWithLength((const char *)mf.data + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g4_fail(err, G4_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    int count = 0;
    for (cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__")) count++;
    g4_st_tensor *nt = realloc(a->tensors, sizeof *nt * (size_t)(a->n_tensors + count));
    span *spans = malloc(sizeof *spans * (size_t)(count ? count : 1));
    if (!nt || !spans) {
        if (nt) a->tensors = nt;
        free(spans);
        cJSON_Delete(root);
        return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", path);
    }
    a->tensors = nt;
    int ns = 0;
    st = G4_OK;
    for (cJSON *e = root->child; e && !st; e = e->next) {
        const char *name = e->string;
        if (!strcmp(name, "__metadata__")) continue;
        cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        g4_st_tensor t = {0};
        t.file = fi;
        if (!cJSON_IsObject(e) || !cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo) ||
            cJSON_GetArraySize(jo) != 2) {
            st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s': entry needs dtype, shape and two data_offsets",
                         path, name);
            break;
        }
        if (!parse_dtype(jd->valuestring, &t.dtype)) {
            st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", path, name,
                         jd->valuestring);
            break;
        }
        t.ndim = cJSON_GetArraySize(js);
        if (t.ndim > G4_MAX_DIMS) {
            st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s': %d dimensions (at most %d)", path, name,
                         t.ndim, G4_MAX_DIMS);
            break;
        }
        /* numel * element size must not overflow: cap every product at 2^62 */
        unsigned __int128 bytes = g4_dtype_size(t.dtype);
        int d = 0;
        for (cJSON *x = js->child; x; x = x->next, d++) {
            double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
            if (v < 0 || v != (double)(int64_t)v || v > 4e18) {
                st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s': dimension %d is not a non-negative integer",
                             path, name, d);
                break;
            }
            t.shape[d] = (int64_t)v;
            bytes *= (uint64_t)t.shape[d];
            if (bytes > ((unsigned __int128)1 << 62)) {
                st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s': shape is impossibly large", path, name);
                break;
            }
        }
        if (st) break;
        double o0 = cJSON_IsNumber(jo->child) ? jo->child->valuedouble : -1;
        double o1 = cJSON_IsNumber(jo->child->next) ? jo->child->next->valuedouble : -1;
        if (o0 < 0 || o1 < o0 || o0 != (double)(uint64_t)o0 || o1 != (double)(uint64_t)o1) {
            st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s': invalid data_offsets", path, name);
            break;
        }
        if (o1 > (double)data_size) {
            st = g4_fail(err, G4_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%.0f, %.0f] lie outside the file's %zu data bytes",
                         path, name, o0, o1, data_size);
            break;
        }
        size_t b0 = (size_t)o0, b1 = (size_t)o1;
        if ((unsigned __int128)(b1 - b0) != bytes) {
            st = g4_fail(err, G4_ERR_FORMAT,
                         "%s: tensor '%s': %zu data bytes do not match dtype %s and its shape (%llu bytes)",
                         path, name, b1 - b0, jd->valuestring, (unsigned long long)bytes);
            break;
        }
        if (g4_st_find(a, name)) {
            st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' appears twice", path, name);
            break;
        }
        t.nbytes = b1 - b0;
        t.data = base + b0;
        size_t esz = g4_dtype_size(t.dtype);
        if (((uintptr_t)t.data % esz) != 0 && t.nbytes) {
            /* Unpadded headers can leave data misaligned; kernels need aligned elements. */
            void *copy = aligned_alloc(64, (t.nbytes + 63) & ~(size_t)63);
            void **no = realloc(a->owned, sizeof *no * (size_t)(a->n_owned + 1));
            if (no) a->owned = no;
            if (!copy || !no) {
                free(copy);
                st = g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            memcpy(copy, t.data, t.nbytes);
            a->owned[a->n_owned++] = copy;
            t.data = copy;
        }
        t.name = strdup(name);
        if (!t.name) {
            st = g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        spans[ns].begin = b0;
        spans[ns].end = b1;
        spans[ns].name = t.name;
        ns++;
        a->tensors[a->n_tensors++] = t;
        /* keep sorted for g4_st_find (insertion; headers list tensors mostly sorted already) */
        for (int i = a->n_tensors - 1; i > 0 && tensor_cmp(&a->tensors[i - 1], &a->tensors[i]) > 0; i--) {
            g4_st_tensor tmp = a->tensors[i];
            a->tensors[i] = a->tensors[i - 1];
            a->tensors[i - 1] = tmp;
        }
    }
    if (!st) {
        qsort(spans, (size_t)ns, sizeof *spans, span_cmp);
        for (int i = 1; i < ns; i++)
            if (spans[i].begin < spans[i - 1].end) {
                st = g4_fail(err, G4_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the file", path,
                             spans[i - 1].name, spans[i].name);
                break;
            }
    }
    free(spans);
    cJSON_Delete(root);
    return st;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static g4_status open_index(g4_st_archive *a, const char *dir, const char *index, g4_error *err) {
    char *text;
    g4_status st = g4_read_file(index, &text, NULL, err);
    if (st) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return g4_fail(err, G4_ERR_FORMAT, "%s: not JSON with a \"weight_map\" object", index);
    }
    /* Open each distinct shard once, in the order first named. */
    for (cJSON *e = map->child; e && !st; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..")) {
            st = g4_fail(err, G4_ERR_FORMAT, "%s: weight_map entry '%s' is not a plain file name",
                         index, e->string);
            break;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
        int seen = 0;
        for (int i = 0; i < a->n_files && !seen; i++) seen = !strcmp(a->file_names[i], path);
        if (!seen) st = g4_st_add_file(a, path, err);
    }
    /* Every tensor the index names must be in the shard it names. */
    for (cJSON *e = map->child; e && !st; e = e->next) {
        const g4_st_tensor *t = g4_st_find(a, e->string);
        const char *fn = t ? strrchr(a->file_names[t->file], '/') : NULL;
        if (!t || strcmp(fn + 1, e->valuestring))
            st = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' is not in shard %s", index, e->string,
                         e->valuestring);
    }
    cJSON_Delete(root);
    return st;
}

g4_status g4_st_open(g4_st_archive *a, const char *path, g4_error *err) {
    memset(a, 0, sizeof *a);
    g4_status st;
    a->dir = strdup(path);
    if (!a->dir) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    if (is_dir(path)) {
        char index[4096], single[4096];
        snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
        snprintf(single, sizeof single, "%s/model.safetensors", path);
        struct stat sb;
        if (stat(index, &sb) == 0)
            st = open_index(a, path, index, err);
        else if (stat(single, &sb) == 0)
            st = g4_st_add_file(a, single, err);
        else
            st = g4_fail(err, G4_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json",
                         path);
    } else {
        st = g4_st_add_file(a, path, err);
    }
    if (st) g4_st_close(a);
    return st;
}

void g4_st_close(g4_st_archive *a) {
    for (int i = 0; i < a->n_tensors; i++) free(a->tensors[i].name);
    free(a->tensors);
    for (int i = 0; i < a->n_files; i++) {
        g4_mapped_file_close(&a->files[i]);
        free(a->file_names[i]);
    }
    free(a->files);
    free(a->file_names);
    for (int i = 0; i < a->n_owned; i++) free(a->owned[i]);
    free(a->owned);
    free(a->dir);
    memset(a, 0, sizeof *a);
}

const g4_st_tensor *g4_st_find(const g4_st_archive *a, const char *name) {
    int lo = 0, hi = a->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(a->tensors[mid].name, name);
        if (!c) return &a->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}
