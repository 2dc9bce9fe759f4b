/* The native pack file: header, manifest and parts (see pack.h for the layout). */
#include "formats/pack.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

enum { MAX_MANIFEST = 256 << 20 };

static const uint32_t byte_order_mark = 0x01020304u;

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int has_magic(const char *path) {
    struct stat sb;
    if (stat(path, &sb) || !S_ISREG(sb.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    char magic[8] = {0};
    int ok = f && fread(magic, 1, 8, f) == 8 && !memcmp(magic, G4_PACK_MAGIC, 8);
    if (f) fclose(f);
    return ok;
}

int g4_pack_resolve(const char *path, char *file, size_t n) {
    if (!path) return 0;
    if (has_magic(path)) {
        snprintf(file, n, "%s", path);
        return 1;
    }
    struct stat sb;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/config.json", path);
    if (stat(buf, &sb) == 0) return 0;
    snprintf(buf, sizeof buf, "%s/%s", path, G4_PACK_FILE);
    if (!has_magic(buf)) return 0;
    snprintf(file, n, "%s", buf);
    return 1;
}

g4_status g4_pack_open(g4_pack *p, const char *path, g4_error *err) {
    memset(p, 0, sizeof *p);
    if (!(p->path = strdup(path))) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    g4_status st = g4_mapped_file_open(&p->map, path, err);
    if (st) {
        free(p->path);
        p->path = NULL;
        return st;
    }
    const uint8_t *h = p->map.data;
    size_t size = p->map.size;
    if (size < G4_PACK_HEADER_BYTES) {
        st = g4_fail(err, G4_ERR_FORMAT, "%s: truncated: %zu bytes, a pack header needs %d", path, size,
                     G4_PACK_HEADER_BYTES);
        goto fail;
    }
    if (memcmp(h, G4_PACK_MAGIC, 8)) {
        st = g4_fail(err, G4_ERR_FORMAT, "%s: not a g4 pack (bad magic)", path);
        goto fail;
    }
    uint32_t version = rd32(h + 8), order = rd32(h + 12);
    if (order != byte_order_mark) {
        st = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: written on a machine of the other byte order (mark 0x%08x)", path,
                     order);
        goto fail;
    }
    if (version != G4_PACK_VERSION) {
        st = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: pack version %u; this g4 reads version %d", path, version,
                     G4_PACK_VERSION);
        goto fail;
    }
    uint64_t mo = rd64(h + 16), ms = rd64(h + 24), dof = rd64(h + 32), ds = rd64(h + 40);
    if (mo != G4_PACK_HEADER_BYTES || ms == 0 || ms > MAX_MANIFEST || mo + ms > size) {
        st = g4_fail(err, G4_ERR_FORMAT, "%s: manifest [%llu, +%llu) does not lie in the file (%zu bytes) after the header",
                     path, (unsigned long long)mo, (unsigned long long)ms, size);
        goto fail;
    }
    if (dof % G4_PACK_PAGE || dof < mo + ms || dof > size || ds != size - dof) {
        st = g4_fail(err, G4_ERR_FORMAT,
                     "%s: data section [%llu, +%llu) does not match the file (%zu bytes; truncated or padded?)", path,
                     (unsigned long long)dof, (unsigned long long)ds, size);
        goto fail;
    }
    if (memchr(h + mo, 0, ms)) {
        st = g4_fail(err, G4_ERR_FORMAT, "%s: manifest contains a NUL byte", path);
        goto fail;
    }
    p->manifest = cJSON_ParseWithLength((const char *)h + mo, (size_t)ms);
    if (!p->manifest || !cJSON_IsObject(p->manifest)) {
        st = g4_fail(err, G4_ERR_FORMAT, "%s: manifest is %s", path, p->manifest ? "not a JSON object" : "not valid JSON");
        goto fail;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p->manifest, "g4_pack");
    if (!cJSON_IsNumber(v) || v->valuedouble != G4_PACK_VERSION) {
        st = g4_fail(err, G4_ERR_FORMAT, "%s: manifest field \"g4_pack\" must be %d", path, G4_PACK_VERSION);
        goto fail;
    }
    p->data = h + dof;
    p->data_size = ds;
    return G4_OK;
fail:
    g4_pack_close(p);
    return st;
}

void g4_pack_close(g4_pack *p) {
    cJSON_Delete(p->manifest);
    g4_mapped_file_close(&p->map);
    free(p->parts);
    free(p->path);
    memset(p, 0, sizeof *p);
}

const char *g4_pack_string(const g4_pack *p, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p->manifest, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A JSON number that is a whole number in [0, 2^53]. */
static int get_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

g4_status g4_pack_part(g4_pack *p, const cJSON *item, const char *owner, const char *part, int64_t want,
                       const uint8_t **ptr, uint64_t *size, g4_error *err) {
    uint64_t off, n;
    if (!cJSON_IsArray(item) || cJSON_GetArraySize(item) != 2 || !get_u64(cJSON_GetArrayItem(item, 0), &off) ||
        !get_u64(cJSON_GetArrayItem(item, 1), &n))
        return g4_fail(err, G4_ERR_FORMAT, "%s: '%s' %s: expected [offset, size] of whole numbers", p->path, owner, part);
    if (off > p->data_size || n > p->data_size - off)
        return g4_fail(err, G4_ERR_FORMAT, "%s: '%s' %s [%llu, +%llu) lies outside the data section (%llu bytes)",
                       p->path, owner, part, (unsigned long long)off, (unsigned long long)n,
                       (unsigned long long)p->data_size);
    if (off % G4_PACK_ALIGN)
        return g4_fail(err, G4_ERR_FORMAT, "%s: '%s' %s at offset %llu is not aligned to %d bytes", p->path, owner, part,
                       (unsigned long long)off, G4_PACK_ALIGN);
    if (want >= 0 && n != (uint64_t)want)
        return g4_fail(err, G4_ERR_FORMAT, "%s: '%s' %s has %llu bytes; its shape and type need %lld", p->path, owner,
                       part, (unsigned long long)n, (long long)want);
    if (n == 0) return g4_fail(err, G4_ERR_FORMAT, "%s: '%s' %s is empty", p->path, owner, part);
    if (p->n_parts == p->cap_parts) {
        int cap = p->cap_parts ? 2 * p->cap_parts : 256;
        g4_pack_part_rec *r = realloc(p->parts, sizeof *r * (size_t)cap);
        if (!r) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        p->parts = r;
        p->cap_parts = cap;
    }
    p->parts[p->n_parts++] = (g4_pack_part_rec){off, n, owner, part};
    *ptr = p->data + off;
    *size = n;
    return G4_OK;
}

static int cmp_part(const void *a, const void *b) {
    const g4_pack_part_rec *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

g4_status g4_pack_check_overlap(g4_pack *p, g4_error *err) {
    if (p->n_parts > 1) qsort(p->parts, (size_t)p->n_parts, sizeof *p->parts, cmp_part);
    for (int i = 1; i < p->n_parts; i++) {
        const g4_pack_part_rec *a = &p->parts[i - 1], *b = &p->parts[i];
        if (a->offset + a->size > b->offset)
            return g4_fail(err, G4_ERR_FORMAT, "%s: '%s' %s [%llu, +%llu) overlaps '%s' %s at %llu", p->path, a->owner,
                           a->part, (unsigned long long)a->offset, (unsigned long long)a->size, b->owner, b->part,
                           (unsigned long long)b->offset);
    }
    return G4_OK;
}

g4_status g4_pack_blob(g4_pack *p, const char *name, const uint8_t **data, uint64_t *size, int *found, g4_error *err) {
    *found = 0;
    const cJSON *blobs = cJSON_GetObjectItemCaseSensitive(p->manifest, "blobs");
    if (!blobs) return G4_OK;
    if (!cJSON_IsObject(blobs)) return g4_fail(err, G4_ERR_FORMAT, "%s: manifest \"blobs\" must be an object", p->path);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(blobs, name);
    if (!b) return G4_OK;
    g4_status st = g4_pack_part(p, b, b->string, "blob", -1, data, size, err);
    if (!st) *found = 1;
    return st;
}

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct {
    const void *src;
    uint64_t offset, size;
} wpart;

struct g4_pack_writer {
    char *path, *tmp;
    wpart *parts;
    int n, cap;
    uint64_t end;
};

g4_status g4_pack_writer_create(const char *path, g4_pack_writer **out, g4_error *err) {
    *out = NULL;
    g4_pack_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path) + 32;
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n))) {
        if (w) free(w->path);
        free(w);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    snprintf(w->tmp, n, "%s.tmp-%d", path, (int)getpid());
    *out = w;
    return G4_OK;
}

g4_status g4_pack_writer_add(g4_pack_writer *w, const void *src, uint64_t n, uint64_t *offset, g4_error *err) {
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 256;
        wpart *p = realloc(w->parts, sizeof *p * (size_t)cap);
        if (!p) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        w->parts = p;
        w->cap = cap;
    }
    /* large parts start on a page, so a table's first row is page-aligned like a fresh mapping */
    uint64_t align = n >= 65536 ? G4_PACK_PAGE : G4_PACK_ALIGN;
    uint64_t off = (w->end + align - 1) / align * align;
    w->parts[w->n++] = (wpart){src, off, n};
    w->end = off + n;
    *offset = off;
    return G4_OK;
}

static void writer_free(g4_pack_writer *w) {
    free(w->parts);
    free(w->path);
    free(w->tmp);
    free(w);
}

void g4_pack_writer_abort(g4_pack_writer *w) {
    if (w) writer_free(w);
}

static int put_zeros(FILE *f, uint64_t n) {
    static const uint8_t zeros[4096];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (fwrite(zeros, 1, k, f) != k) return -1;
        n -= k;
    }
    return 0;
}

g4_status g4_pack_writer_finish(g4_pack_writer *w, const char *manifest, g4_error *err) {
    uint64_t ms = strlen(manifest);
    uint64_t dof = (G4_PACK_HEADER_BYTES + ms + G4_PACK_PAGE - 1) / G4_PACK_PAGE * G4_PACK_PAGE;
    /* the data section ends on a 64-byte boundary so that a truncated copy is always noticed */
    uint64_t ds = (w->end + G4_PACK_ALIGN - 1) / G4_PACK_ALIGN * G4_PACK_ALIGN;
    uint8_t h[G4_PACK_HEADER_BYTES] = {0};
    uint32_t version = G4_PACK_VERSION;
    uint64_t mo = G4_PACK_HEADER_BYTES;
    memcpy(h, G4_PACK_MAGIC, 8);
    memcpy(h + 8, &version, 4);
    memcpy(h + 12, &byte_order_mark, 4);
    memcpy(h + 16, &mo, 8);
    memcpy(h + 24, &ms, 8);
    memcpy(h + 32, &dof, 8);
    memcpy(h + 40, &ds, 8);
    g4_status st = G4_OK;
    FILE *f = fopen(w->tmp, "wb");
    if (!f) {
        st = g4_fail(err, G4_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
        writer_free(w);
        return st;
    }
    int bad = fwrite(h, 1, sizeof h, f) != sizeof h || fwrite(manifest, 1, (size_t)ms, f) != ms ||
              put_zeros(f, dof - G4_PACK_HEADER_BYTES - ms);
    uint64_t at = 0;
    for (int i = 0; i < w->n && !bad; i++) {
        const wpart *p = &w->parts[i];
        bad = put_zeros(f, p->offset - at) || fwrite(p->src, 1, (size_t)p->size, f) != p->size;
        at = p->offset + p->size;
    }
    if (!bad) bad = put_zeros(f, ds - at);
    if (fclose(f) != 0) bad = 1;
    if (bad) st = g4_fail(err, G4_ERR_IO, "%s: write error: %s", w->tmp, strerror(errno));
    if (!st && rename(w->tmp, w->path) != 0)
        st = g4_fail(err, G4_ERR_IO, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
    if (st) unlink(w->tmp);
    writer_free(w);
    return st;
}
