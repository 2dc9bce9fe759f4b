/* Choosing a loader: by what a file starts with, or a model directory's tokenizer.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/pack.h"
#include "g4_tokenizer.h"
#include "text/tokenizer_internal.h"
#include "util/error.h"

/* The tokenizer.json a native pack carries. */
static g4_status load_pack(const char *file, g4_tokenizer **out, g4_error *err) {
    g4_pack p;
    g4_status st = g4_pack_open(&p, file, err);
    if (st) return st;
    const uint8_t *data;
    uint64_t size;
    int found = 0;
    st = g4_pack_blob(&p, "tokenizer.json", &data, &size, &found, err);
    if (!st && !found) st = g4_fail(err, G4_ERR_IO, "%s: this pack carries no tokenizer.json; pass one explicitly", file);
    if (!st) {
        char name[4200];
        snprintf(name, sizeof name, "%s:tokenizer.json", file);
        st = g4_tokenizer_load_json_mem((const char *)data, (size_t)size, name, out, err);
    }
    g4_pack_close(&p);
    return st;
}

g4_status g4_tokenizer_load_dir(const char *dir, g4_tokenizer **out, g4_error *err) {
    *out = NULL;
    char pack[4096];
    if (g4_pack_resolve(dir, pack, sizeof pack)) return load_pack(pack, out, err);
    size_t n = strlen(dir) + sizeof "/tokenizer.json";
    char *path = malloc(n);
    if (!path) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    snprintf(path, n, "%s/tokenizer.json", dir);
    struct stat sb;
    g4_status st;
    if (stat(path, &sb) != 0)
        st = g4_fail(err, G4_ERR_IO, "%s: no tokenizer.json in this model directory", dir);
    else
        st = g4_tokenizer_load_json(path, out, err);
    free(path);
    return st;
}

g4_status g4_tokenizer_load(const char *path, g4_tokenizer **out, g4_error *err) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return g4_fail(err, G4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return g4_tokenizer_load_dir(path, out, err);
    FILE *f = fopen(path, "rb");
    if (!f) return g4_fail(err, G4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    /* enough to get past leading whitespace before a JSON object */
    unsigned char head[256];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    if (n >= 4 && !memcmp(head, "GGUF", 4)) return g4_tokenizer_load_gguf(path, out, err);
    if (n >= 8 && !memcmp(head, G4_PACK_MAGIC, 8)) return load_pack(path, out, err);
    size_t i = 0;
    while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\r' || head[i] == '\n')) i++;
    if (i < n && head[i] == '{') return g4_tokenizer_load_json(path, out, err);
    return g4_fail(err, G4_ERR_FORMAT, "%s: neither a GGUF file nor a tokenizer.json", path);
}
