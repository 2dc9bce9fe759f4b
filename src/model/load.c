/* g4_model_load: recognise what the path holds, open the matching weight source, bind. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/pack.h"
#include "model/model.h"
#include "util/mapped_file.h"
#include "util/error.h"

/* Opens the weight source for a checkpoint directory whose config.json was parsed into cfg.
 * The quantised layouts announce themselves in config.json; plain HF checkpoints do not. */
static g4_status open_dir_source(g4_model *m, const char *dir, g4_error *err) {
    int handled = 0;
    g4_status st = g4_source_open_quantized(&m->src, dir, &m->cfg, &handled, err);
    if (st || handled) return st;
    return g4_source_open_safetensors(&m->src, dir, m->cfg.multimodal_layout, err);
}

/* A regular file that starts with the GGUF magic. */
static int is_gguf_file(const char *path) {
    struct stat sb;
    if (stat(path, &sb) || !S_ISREG(sb.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    int ok = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    return ok;
}

/* Memory the kernel could give us now (MemAvailable), or SIZE_MAX when unknown. */
static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return SIZE_MAX;
    char line[256];
    size_t kb = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %zu kB", &kb) == 1;
    fclose(f);
    return found ? kb * 1024 : SIZE_MAX;
}

g4_status g4_model_open_unbound(const char *path, g4_model **out, g4_error *err) {
    *out = NULL;
    if (!path) return g4_fail(err, G4_ERR_ARG, "no model path given");
    g4_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    /* a GGUF file, or a directory holding model.gguf and no config.json */
    char gguf[4096], pack[4096];
    struct stat sb;
    snprintf(gguf, sizeof gguf, "%s/config.json", path);
    int dir_gguf = stat(gguf, &sb) != 0;
    snprintf(gguf, sizeof gguf, "%s/model.gguf", path);
    g4_status st;
    if (g4_pack_resolve(path, pack, sizeof pack)) {
        /* a native pack, or a directory holding model.g4p and no config.json */
        char *json = NULL;
        st = g4_source_open_pack(&m->src, pack, "model", &json, err);
        if (!st) st = g4_config_parse(json, pack, &m->cfg, err);
        free(json);
    } else if (is_gguf_file(path) || (dir_gguf && is_gguf_file(gguf))) {
        st = g4_source_open_gguf(&m->src, is_gguf_file(path) ? path : gguf, &m->cfg, err);
    } else {
        st = g4_config_load(path, &m->cfg, err);
        if (!st) st = open_dir_source(m, path, err);
    }
    if (st) {
        g4_model_free(m);
        return st;
    }
    *out = m;
    return G4_OK;
}

g4_status g4_model_load(const char *path, const g4_model_options *opts, g4_model **out, g4_error *err) {
    g4_model *m;
    g4_status st = g4_model_open_unbound(path, &m, err);
    if (st) return st;
    st = g4_model_bind(m, err);
    /* the repacked copy must fit beside everything else: leave a fifth of what is free */
    if (!st && !(opts && opts->keep_layout)) {
        size_t avail = mem_available();
        st = g4_model_repack(m, avail == SIZE_MAX ? SIZE_MAX : avail / 5 * 4, err);
    }
    if (st) {
        g4_model_free(m);
        return st;
    }
    *out = m;
    return G4_OK;
}

void g4_model_free(g4_model *m) {
    if (!m) return;
    if (m->src.close) m->src.close(m->src.ctx);
    g4_config_free(&m->cfg);
    free(m->layers);
    free(m->arena);
    g4_unmap_anon(m->repacked, m->repacked_size);
    free(m->path);
    free(m);
}
