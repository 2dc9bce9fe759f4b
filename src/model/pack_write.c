/* g4_pack_write: load with the ordinary loader, record what the binder reads, write it out.
 *
 * Recording the binder's reads (source_record.c) rather than walking the model struct keeps the
 * writer independent of both the format it reads and the weight types the kernels have: whatever
 * g4_tensor_ref a source hands out — a view into a safetensors or GGUF map, MLX experts merged in
 * memory, a QAT matrix with activation scales — is stored as its g4_mat fields plus the bytes of
 * its data / scales / biases parts, and the pack source hands the same g4_mat back. */
#include "model/pack.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu/kernels_internal.h"
#include "cpu/quant.h"
#include "formats/pack.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/drafter.h"
#include "model/model.h"
#include "model/source.h"
#include "model/synth.h"
#include "model/writer_st.h"
#include "util/error.h"
#include "util/mapped_file.h"

/* Everything the forward derives from the config must come back from the packed text. */
static int config_equal(const g4_config *a, const g4_config *b) {
    if (strcmp(a->arch, b->arch) || a->n_layers != b->n_layers || a->hidden != b->hidden || a->n_heads != b->n_heads ||
        a->vocab != b->vocab || a->head_dim_sliding != b->head_dim_sliding || a->head_dim_full != b->head_dim_full ||
        a->sliding_window != b->sliding_window || a->n_kv_shared != b->n_kv_shared ||
        a->first_shared != b->first_shared || a->intermediate != b->intermediate || a->double_wide != b->double_wide ||
        a->ple_width != b->ple_width || a->ple_vocab != b->ple_vocab || a->moe != b->moe ||
        a->n_experts != b->n_experts || a->top_k_experts != b->top_k_experts || a->moe_width != b->moe_width ||
        a->k_eq_v != b->k_eq_v || a->max_positions != b->max_positions || a->bos != b->bos || a->eos != b->eos ||
        a->pad != b->pad || a->rms_eps != b->rms_eps || a->final_softcap != b->final_softcap)
        return 0;
    for (int i = 0; i < a->n_layers; i++) {
        const g4_layer_config *x = &a->layers[i], *y = &b->layers[i];
        if (x->is_full != y->is_full || x->head_dim != y->head_dim || x->n_kv_heads != y->n_kv_heads ||
            x->k_eq_v != y->k_eq_v || x->kv_source != y->kv_source || x->mlp_width != y->mlp_width ||
            x->rope_theta != y->rope_theta || x->rope_pairs != y->rope_pairs)
            return 0;
    }
    return 1;
}

/* The config text to pack for a model: the packed one, IN/config.json, or (GGUF) one written
 * from the parsed config; it must parse back to exactly the loaded config. */
static g4_status model_config_text(const char *in, const g4_model *m, char **out, g4_error *err) {
    *out = NULL;
    char pack[4096], path[4096];
    g4_status st;
    snprintf(path, sizeof path, "%s/config.json", in);
    struct stat sb;
    if (g4_pack_resolve(in, pack, sizeof pack)) {
        g4_pack p;
        if ((st = g4_pack_open(&p, pack, err))) return st;
        const char *c = g4_pack_string(&p, "config");
        *out = c ? strdup(c) : NULL;
        g4_pack_close(&p);
        if (!*out) return g4_fail(err, G4_ERR_FORMAT, "%s: no config text", pack);
    } else if (stat(path, &sb) == 0) {
        if ((st = g4_read_file(path, out, NULL, err))) return st;
    } else if ((st = g4_config_to_json(&m->cfg, out, err))) {
        return st;
    }
    g4_config back;
    if ((st = g4_config_parse(*out, "the config to pack", &back, err))) {
        free(*out);
        *out = NULL;
        return st;
    }
    int same = config_equal(&back, &m->cfg);
    g4_config_free(&back);
    if (!same) {
        free(*out);
        *out = NULL;
        return g4_fail(err, G4_ERR_UNSUPPORTED,
                       "%s: the model's configuration cannot be written as config.json text that parses back to "
                       "the same model", in);
    }
    return G4_OK;
}

/* tokenizer.json bytes to carry: the one asked for, IN's own, or the one IN's pack carries
 * (*data NULL when none). *owned is freed by the caller; *map, when set, closed by it. */
static g4_status tokenizer_bytes(const char *in, const g4_pack_options *o, char **owned, g4_pack *pk, int *pk_open,
                                 const void **data, size_t *size, g4_error *err) {
    *owned = NULL;
    *data = NULL;
    *size = 0;
    *pk_open = 0;
    char path[4096], pack[4096];
    struct stat sb;
    if (o && o->tokenizer) {
        g4_status st = g4_read_file(o->tokenizer, owned, size, err);
        *data = *owned;
        return st;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", in);
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        g4_status st = g4_read_file(path, owned, size, err);
        *data = *owned;
        return st;
    }
    if (g4_pack_resolve(in, pack, sizeof pack)) {
        g4_status st = g4_pack_open(pk, pack, err);
        if (st) return st;
        *pk_open = 1;
        const uint8_t *d;
        uint64_t n;
        int found = 0;
        if ((st = g4_pack_blob(pk, "tokenizer.json", &d, &n, &found, err))) return st;
        if (found) {
            *data = d;
            *size = (size_t)n;
        }
    }
    return G4_OK;
}

static cJSON *part_json(uint64_t off, uint64_t n) {
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateNumber((double)off));
    cJSON_AddItemToArray(a, cJSON_CreateNumber((double)n));
    return a;
}

/* One recorded tensor into the manifest entry list, its parts into the writer. */
static g4_status add_tensor_mat(g4_pack_writer *w, const g4_recorded_tensor *t, const g4_mat *m, cJSON *o,
                                g4_error *err);

/* Buffers the writer reads at finish time (repacked matrices), freed after it. */
typedef struct {
    void **p;
    int n, cap;
} owned_bufs;

static int own(owned_bufs *o, void *p) {
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 64;
        void **q = realloc(o->p, sizeof *q * (size_t)cap);
        if (!q) return 0;
        o->p = q;
        o->cap = cap;
    }
    o->p[o->n++] = p;
    return 1;
}

static g4_status add_tensor(g4_pack_writer *w, const g4_recorded_tensor *t, cJSON *tensors, cJSON *ints,
                            int keep_layout, owned_bufs *bufs, g4_error *err) {
    const g4_tensor_ref *r = &t->ref;
    cJSON *o = cJSON_CreateObject();
    if (!o) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    cJSON_AddStringToObject(o, "name", r->name);
    cJSON *sh = cJSON_AddArrayToObject(o, "shape");
    for (int i = 0; i < r->ndim; i++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)r->shape[i]));
    uint64_t off;
    g4_status st;
    if (t->is_int) {
        cJSON_AddItemToArray(ints, o);
        cJSON_AddStringToObject(o, "dtype", g4_dtype_name(G4_DT_I32));
        if ((st = g4_pack_writer_add(w, t->ints, 4 * (uint64_t)t->n, &off, err))) return st;
        cJSON_AddItemToObject(o, "data", part_json(off, 4 * (uint64_t)t->n));
        return G4_OK;
    }
    cJSON_AddItemToArray(tensors, o);
    const g4_mat *m = &r->mat;
    if ((st = g4_mat_validate(m, err))) return g4_fail_prefix(err, st, "%s: tensor '%s'", r->file, r->name);
    size_t rs = keep_layout ? 0 : g4_mat_repack_size(m);
    if (rs) { /* the CPU kernels' split layout, as g4_model_repack makes it at load */
        void *mem = NULL;
        if (posix_memalign(&mem, 64, rs)) return g4_fail(err, G4_ERR_NOMEM, "out of memory repacking '%s'", r->name);
        if (!own(bufs, mem)) {
            free(mem);
            return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        }
        g4_mat sm;
        g4_mat_repack(m, mem, &sm); /* the writer reads it at finish */
        return add_tensor_mat(w, t, &sm, o, err);
    }
    return add_tensor_mat(w, t, m, o, err);
}

static g4_status add_tensor_mat(g4_pack_writer *w, const g4_recorded_tensor *t, const g4_mat *m, cJSON *o,
                                g4_error *err) {
    const g4_tensor_ref *r = &t->ref;
    uint64_t off;
    g4_status st;
    cJSON_AddStringToObject(o, "float_dtype", g4_dtype_name(r->float_dtype));
    cJSON_AddStringToObject(o, "wtype", g4_wtype_name(m->type));
    cJSON_AddNumberToObject(o, "rows", m->rows);
    cJSON_AddNumberToObject(o, "cols", m->cols);
    cJSON_AddNumberToObject(o, "row_bytes", (double)m->row_bytes);
    if (m->bits) cJSON_AddNumberToObject(o, "bits", m->bits);
    if (m->group) cJSON_AddNumberToObject(o, "group", m->group);
    if (m->in_act_scale != 0) cJSON_AddNumberToObject(o, "in_act_scale", m->in_act_scale);
    if (m->out_act_scale != 0) cJSON_AddNumberToObject(o, "out_act_scale", m->out_act_scale);
    if (m->split) cJSON_AddStringToObject(o, "layout", "split");
    uint64_t n = (uint64_t)m->rows * m->row_bytes;
    if ((st = g4_pack_writer_add(w, m->data, n, &off, err))) return st;
    cJSON_AddItemToObject(o, "data", part_json(off, n));
    if (m->scales) {
        cJSON_AddStringToObject(o, "scale_dtype", g4_dtype_name(m->scale_dtype));
        cJSON_AddNumberToObject(o, "scale_stride", (double)m->scale_stride);
        n = (uint64_t)m->rows * m->scale_stride * g4_dtype_size(m->scale_dtype);
        if ((st = g4_pack_writer_add(w, m->scales, n, &off, err))) return st;
        cJSON_AddItemToObject(o, "scales", part_json(off, n));
        if (m->biases) {
            if ((st = g4_pack_writer_add(w, m->biases, n, &off, err))) return st;
            cJSON_AddItemToObject(o, "biases", part_json(off, n));
        }
    }
    return G4_OK;
}

/* OUT as a file path: OUT itself when it ends in .g4p, else OUT/model.g4p (folder created). */
static g4_status out_file(const char *out, char *file, size_t n, g4_error *err) {
    size_t len = strlen(out);
    if (len > 4 && !strcmp(out + len - 4, ".g4p")) {
        snprintf(file, n, "%s", out);
        return G4_OK;
    }
    g4_status st = g4_writer_mkdir(out, err);
    if (!st) snprintf(file, n, "%s/%s", out, G4_PACK_FILE);
    return st;
}

g4_status g4_pack_write(const char *in, const char *out, const g4_pack_options *opts, g4_pack_stats *stats,
                        g4_error *err) {
    g4_pack_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!in || !out) return g4_fail(err, G4_ERR_ARG, "pack: input and output paths are required");
    g4_model *m = NULL;
    g4_drafter *d = NULL;
    g4_weight_source *src = NULL;
    char *config = NULL, *tok_owned = NULL, *manifest_text = NULL;
    owned_bufs bufs = {0};
    g4_pack tok_pack;
    int tok_pack_open = 0;
    const void *tok = NULL;
    size_t tok_size = 0;
    g4_pack_writer *w = NULL;
    cJSON *man = NULL;
    g4_weight_source rec;
    stats->is_drafter = g4_is_drafter_path(in);
    g4_status st;
    /* open, slip the recorder in front of the format's source, bind */
    if (stats->is_drafter) {
        st = g4_drafter_open(in, &d, &config, err);
        if (!st) src = &d->src;
    } else {
        st = g4_model_open_unbound(in, &m, err);
        if (!st) src = &m->src;
    }
    if (!st && !(st = g4_source_open_recorder(&rec, src, err))) *src = rec;
    if (!st) st = stats->is_drafter ? g4_drafter_bind(d, err) : g4_model_bind(m, err);
    if (!st && !stats->is_drafter) st = model_config_text(in, m, &config, err);
    if (!st) st = tokenizer_bytes(in, opts, &tok_owned, &tok_pack, &tok_pack_open, &tok, &tok_size, err);
    if (!st) st = out_file(out, stats->path, sizeof stats->path, err);
    if (!st) st = g4_pack_writer_create(stats->path, &w, err);
    if (!st) {
        man = cJSON_CreateObject();
        cJSON_AddNumberToObject(man, "g4_pack", G4_PACK_VERSION);
        cJSON_AddStringToObject(man, "kind", stats->is_drafter ? "drafter" : "model");
        cJSON_AddStringToObject(man, "source", in);
        cJSON_AddStringToObject(man, "config", config);
        cJSON *blobs = cJSON_AddObjectToObject(man, "blobs");
        cJSON *tensors = cJSON_AddArrayToObject(man, "tensors");
        cJSON *ints = cJSON_AddArrayToObject(man, "int_tensors");
        uint64_t off;
        if (tok && tok_size && !(st = g4_pack_writer_add(w, tok, tok_size, &off, err))) {
            cJSON_AddItemToObject(blobs, "tokenizer.json", part_json(off, tok_size));
            stats->has_tokenizer = 1;
        }
        int n = 0;
        const g4_recorded_tensor *t = g4_source_recorded(src, &n);
        for (int i = 0; i < n && !st; i++) {
            /* models get the layout g4_model_load repacks into here (drafters are never repacked) */
            int keep = (opts && opts->keep_layout) || stats->is_drafter || g4_isa_best() != G4_ISA_AVX512;
            st = add_tensor(w, &t[i], tensors, ints, keep, &bufs, err);
            if (t[i].is_int) stats->n_int_tensors++;
            else stats->n_tensors++;
        }
        if (!st && !(manifest_text = cJSON_PrintUnformatted(man))) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    if (!st) {
        st = g4_pack_writer_finish(w, manifest_text, err);
        w = NULL;
        struct stat sb;
        if (!st && stat(stats->path, &sb) == 0) stats->bytes = (size_t)sb.st_size;
    }
    g4_pack_writer_abort(w);
    for (int i = 0; i < bufs.n; i++) free(bufs.p[i]);
    free(bufs.p);
    cJSON_Delete(man);
    free(manifest_text);
    free(config);
    free(tok_owned);
    if (tok_pack_open) g4_pack_close(&tok_pack);
    g4_model_free(m);
    g4_drafter_free(d);
    return st;
}
