/* The weight source for Google's QAT checkpoints (quantization_config.quant_method "gemma", e.g.
 * google/gemma-4-E2B-it-qat-mobile-transformers).
 *
 * Layout, as HF transformers' integrations/gemma_quant.py defines it (QuantizedLinear,
 * QuantizedEmbedding):
 *  - a quantised linear X: X.weight holds per-output-channel symmetric codes — int2 (U8, four per
 *    byte from bit 0, stored value+2, [out, ceil(in/4)]), int4 (U8, low nibble first, value+8,
 *    [out, ceil(in/2)]) or int8 (I8 [out, in]); X.weight_scale F32 [out, 1]; w = q·scale;
 *    optional scalar X.input_activation_scale / X.output_activation_scale (static activation
 *    fake-quantisation, 0 = uncalibrated), carried to the forward in g4_mat.*_act_scale;
 *  - a quantised embedding X: X.embedding_quantized (same code layouts) and X.embedding_scale
 *    F32 [V, blocks], each row split into `blocks` equal runs with their own scale;
 *  - nothing records a matrix's bit width per tensor (the config's module_quant_configs are
 *    regular expressions), so the width is told from the stored row length against the logical
 *    width config.json implies for that matrix;
 *  - modules_to_not_convert (per_layer_model_projection in the E2B release) stay in float, as do
 *    norms and scalars; tensors under "model.language_model." or "model.", the separate LM head
 *    as top-level "lm_head.weight" (tie_word_embeddings false in the release). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/source.h"
#include "util/error.h"
#include "util/mapped_file.h"

typedef struct {
    g4_st_archive st;
    const char *prefix;
    const g4_config *cfg;
    const g4_drafter_config *dc; /* drafters: full names ("model.layers.0...", "pre_projection.weight") */
    g4_dtype model_dtype;   /* config.json "dtype": what dequantised embeddings are rounded to */
} qat_source;

static int is_float(g4_dtype t) { return t == G4_DT_F32 || t == G4_DT_F16 || t == G4_DT_BF16; }

/* The logical input width config.json implies for a matrix (relative name), or -1. */
static int64_t expected_cols(const g4_config *c, const char *name) {
    int H = c->hidden, L = c->n_layers, P = c->ple_width, i, n = 0;
    if (!strcmp(name, "embed_tokens.weight") || !strcmp(name, "per_layer_model_projection.weight") ||
        !strcmp(name, "lm_head.weight"))
        return H;
    if (!strcmp(name, "embed_tokens_per_layer.weight")) return (int64_t)L * P;
    if (sscanf(name, "layers.%d.%n", &i, &n) != 1 || !n || i < 0 || i >= L) return -1;
    const char *r = name + n;
    const g4_layer_config *lc = &c->layers[i];
    if (!strcmp(r, "self_attn.q_proj.weight") || !strcmp(r, "self_attn.k_proj.weight") ||
        !strcmp(r, "self_attn.v_proj.weight") || !strcmp(r, "mlp.gate_proj.weight") ||
        !strcmp(r, "mlp.up_proj.weight") || !strcmp(r, "per_layer_input_gate.weight") ||
        !strcmp(r, "router.proj.weight"))
        return H;
    if (!strcmp(r, "self_attn.o_proj.weight")) return (int64_t)c->n_heads * lc->head_dim;
    if (!strcmp(r, "mlp.down_proj.weight")) return lc->mlp_width;
    if (!strcmp(r, "per_layer_projection.weight")) return P;
    return -1;
}

/* The same for a drafter's full tensor names. */
static int64_t drafter_cols(const g4_drafter_config *d, const char *name) {
    if (!strcmp(name, "pre_projection.weight")) return 2 * (int64_t)d->backbone_hidden;
    if (!strcmp(name, "post_projection.weight") || !strcmp(name, "masked_embedding.centroids.weight") ||
        !strcmp(name, "model.embed_tokens.weight"))
        return d->text.hidden;
    return strncmp(name, "model.", 6) ? -1 : expected_cols(&d->text, name + 6);
}

static g4_status dense_ref(const g4_st_tensor *t, g4_tensor_ref *out, g4_error *err) {
    return g4_st_dense_ref(t, out, "F32, F16 or BF16", err);
}

/* A scalar float tensor (shape [] or [1]); absent → 0. */
static g4_status read_scalar(const qat_source *s, const char *name, float *out, g4_error *err) {
    *out = 0;
    const g4_st_tensor *t = g4_st_find(&s->st, name);
    if (!t) return G4_OK;
    if (!is_float(t->dtype) || g4_st_numel(t) != 1)
        return g4_fail(err, G4_ERR_TENSOR, "%s: '%s' must be one float (got %s with %lld elements)",
                       s->st.file_names[t->file], name, g4_dtype_name(t->dtype), (long long)g4_st_numel(t));
    g4_mat m = g4_mat_dense(t->dtype, 1, 1, t->data);
    g4_mat_row_f32(&m, 0, out);
    if (!(*out >= 0) || *out > 1e30f)
        return g4_fail(err, G4_ERR_TENSOR, "%s: activation scale '%s' = %g must be a finite non-negative number",
                       s->st.file_names[t->file], name, (double)*out);
    return G4_OK;
}

/* Codes w of logical width `in` (or -1: unknown) with scales sc [rows, blocks]. */
static g4_status symm_ref(const qat_source *s, const g4_st_tensor *w, const char *sname, const g4_st_tensor *sc,
                          int64_t in, g4_tensor_ref *out, g4_error *err) {
    const char *file = s->st.file_names[w->file];
    if (w->ndim != 2)
        return g4_fail(err, G4_ERR_TENSOR, "%s: quantized tensor '%s' must be 2-D (has %d dimensions)", file, out->name,
                       w->ndim);
    int64_t rows = w->shape[0], packed = w->shape[1];
    int bits;
    if (w->dtype == G4_DT_I8) {
        if (in < 0) in = packed;
        if (packed != in)
            return g4_fail(err, G4_ERR_TENSOR, "%s: int8 tensor '%s' has %lld columns; config.json implies %lld",
                           file, out->name, (long long)packed, (long long)in);
        bits = 8;
    } else if (w->dtype == G4_DT_U8) {
        if (in < 0)
            return g4_fail(err, G4_ERR_TENSOR, "%s: cannot tell the bit width of '%s' (U8 [%lld, %lld]): its logical "
                           "width is unknown", file, out->name, (long long)rows, (long long)packed);
        if (packed == (in + 1) / 2) bits = 4;
        else if (packed == (in + 3) / 4) bits = 2;
        else if (packed == in)
            return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' stores one byte per column as U8; QAT int8 codes are "
                           "signed (I8)", file, out->name);
        else
            return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s': packing width %lld bytes per row fits neither int4 "
                           "(%lld) nor int2 (%lld) codes of the %lld columns config.json implies", file, out->name,
                           (long long)packed, (long long)((in + 1) / 2), (long long)((in + 3) / 4), (long long)in);
    } else {
        return g4_fail(err, G4_ERR_TENSOR, "%s: quantized tensor '%s' has dtype %s; expected U8 or I8 codes", file,
                       out->name, g4_dtype_name(w->dtype));
    }
    if (!sc) return g4_fail(err, G4_ERR_TENSOR, "%s: quantized tensor '%s' has no scales '%s'", file, out->name, sname);
    int64_t blocks = sc->ndim == 2 ? sc->shape[1] : 1;
    int ok = is_float(sc->dtype) && ((sc->ndim == 2 && sc->shape[0] == rows) || (sc->ndim == 1 && sc->shape[0] == rows));
    if (!ok || blocks < 1 || in % blocks)
        return g4_fail(err, G4_ERR_TENSOR, "%s: scales '%s' (%s, %d-D) do not fit '%s' [%lld rows x %lld columns]: "
                       "expected float [%lld, 1] or [%lld, blocks dividing %lld]", s->st.file_names[sc->file], sname,
                       g4_dtype_name(sc->dtype), sc->ndim, out->name, (long long)rows, (long long)in, (long long)rows,
                       (long long)rows, (long long)in);
    int64_t group = in / blocks;
    if (!g4_wtype_row_bytes(G4_W_SYMM, (int)(in < (1 << 30) ? in : 0), bits) ||
        group % g4_wtype_block_cols(G4_W_SYMM))
        return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: tensor '%s': %lld columns in runs of %lld per scale; this engine "
                       "needs multiples of %d", file, out->name, (long long)in, (long long)group,
                       g4_wtype_block_cols(G4_W_SYMM));
    if (rows > (1 << 30))
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' is too large", file, out->name);
    out->ndim = 2;
    out->shape[0] = rows;
    out->shape[1] = in;
    g4_mat m = {0};
    m.type = G4_W_SYMM;
    m.rows = (int)rows;
    m.cols = (int)in;
    m.data = w->data;
    m.row_bytes = (size_t)packed;
    m.bits = bits;
    m.group = (int)group;
    m.scales = sc->data;
    m.scale_dtype = sc->dtype;
    m.scale_stride = (size_t)blocks;
    out->mat = m;
    out->float_dtype = s->model_dtype;
    if (g4_mat_validate(&m, err)) return g4_fail_prefix(err, G4_ERR_TENSOR, "%s: tensor '%s'", file, out->name);
    return G4_OK;
}

static g4_status qat_find(void *ctx, const char *name, g4_tensor_ref *out, int *found, g4_error *err) {
    qat_source *s = ctx;
    memset(out, 0, sizeof *out);
    *found = 0;
    int head = !strcmp(name, "lm_head.weight");
    const char *pre = head ? "" : s->prefix;
    size_t n = strlen(name);
    char sname[320];
    int64_t in = s->dc ? drafter_cols(s->dc, name) : expected_cols(s->cfg, name);
    /* embeddings: X.embedding_quantized + X.embedding_scale */
    if (!strcmp(name, "embed_tokens.weight") || !strcmp(name, "embed_tokens_per_layer.weight") ||
        (s->dc && !strcmp(name, "model.embed_tokens.weight"))) {
        snprintf(out->name, sizeof out->name, "%s%.*sembedding_quantized", pre, (int)(n - 6), name);
        const g4_st_tensor *w = g4_st_find(&s->st, out->name);
        if (w) {
            *found = 1;
            out->file = s->st.file_names[w->file];
            snprintf(sname, sizeof sname, "%s%.*sembedding_scale", pre, (int)(n - 6), name);
            return symm_ref(s, w, sname, g4_st_find(&s->st, sname), in, out, err);
        }
    }
    snprintf(out->name, sizeof out->name, "%s%s", pre, name);
    const g4_st_tensor *t = g4_st_find(&s->st, out->name);
    if (!t) return G4_OK;
    *found = 1;
    out->file = s->st.file_names[t->file];
    if (is_float(t->dtype) || n < 7 || strcmp(name + n - 7, ".weight")) return dense_ref(t, out, err);
    /* a quantised linear */
    char base[300];
    snprintf(base, sizeof base, "%s%.*s", pre, (int)(n - 7), name);
    snprintf(sname, sizeof sname, "%s.weight_scale", base);
    g4_status st = symm_ref(s, t, sname, g4_st_find(&s->st, sname), in, out, err);
    if (st) return st;
    if (out->mat.scale_stride != 1)
        return g4_fail(err, G4_ERR_TENSOR, "%s: '%s' must be [%d, 1]: linear layers have one scale per output channel",
                       out->file, sname, out->mat.rows);
    char an[340];
    snprintf(an, sizeof an, "%s.input_activation_scale", base);
    if ((st = read_scalar(s, an, &out->mat.in_act_scale, err))) return st;
    snprintf(an, sizeof an, "%s.output_activation_scale", base);
    return read_scalar(s, an, &out->mat.out_act_scale, err);
}

static g4_status qat_find_i32(void *ctx, const char *name, int64_t n, int32_t *out, int *found, g4_error *err) {
    qat_source *s = ctx;
    char full[512];
    snprintf(full, sizeof full, "%s%s", s->prefix, name);
    return g4_st_find_i32(&s->st, full, n, out, found, err);
}

static void qat_close(void *ctx) {
    qat_source *s = ctx;
    g4_st_close(&s->st);
    free(s);
}

/* config.json "dtype" (or "torch_dtype"), in text_config or at the top. */
static g4_dtype config_dtype(const char *dir) {
    char path[4096], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (g4_read_file(path, &text, NULL, NULL)) return G4_DT_F32;
    cJSON *root = cJSON_Parse(text);
    free(text);
    g4_dtype dt = G4_DT_F32;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const char *keys[] = {"dtype", "torch_dtype"};
    const cJSON *objs[] = {cJSON_IsObject(tc) ? tc : NULL, root};
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < 2 && objs[o]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(objs[o], keys[k]);
            if (!cJSON_IsString(v)) continue;
            dt = !strcmp(v->valuestring, "bfloat16") ? G4_DT_BF16 : !strcmp(v->valuestring, "float16") ? G4_DT_F16 : G4_DT_F32;
            cJSON_Delete(root);
            return dt;
        }
    cJSON_Delete(root);
    return dt;
}

g4_status g4_source_open_qat(g4_weight_source *src, const char *dir, const g4_config *cfg, g4_error *err) {
    memset(src, 0, sizeof *src);
    qat_source *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    g4_status st = g4_st_open(&s->st, dir, err);
    if (st) {
        free(s);
        return st;
    }
    s->cfg = cfg;
    s->model_dtype = config_dtype(dir);
    /* the prefix the text model's tensors carry ("embed_tokens.*" or "layers.*" after it) */
    s->prefix = "model.";
    const char *pre[] = {"model.language_model.", "model."};
    int hit = 0;
    for (int i = 0; i < 2 && !hit; i++)
        for (int k = 0; k < s->st.n_tensors; k++) {
            const char *n = s->st.tensors[k].name;
            size_t pl = strlen(pre[i]);
            if (!strncmp(n, pre[i], pl) && (!strncmp(n + pl, "embed_tokens.", 13) || !strncmp(n + pl, "layers.", 7))) {
                s->prefix = pre[i];
                hit = 1;
                break;
            }
        }
    src->ctx = s;
    src->path = s->st.dir;
    src->find = qat_find;
    src->close = qat_close;
    src->find_i32 = qat_find_i32;
    return G4_OK;
}

g4_status g4_source_open_qat_drafter(g4_weight_source *src, const char *dir, const g4_drafter_config *dc,
                                     g4_error *err) {
    g4_status st = g4_source_open_qat(src, dir, &dc->text, err);
    if (st) return st;
    qat_source *s = src->ctx;
    s->dc = dc;
    s->prefix = "";
    return G4_OK;
}
