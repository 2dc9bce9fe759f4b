/* The weight source for MLX affine checkpoints (mlx-community conversions by mlx-vlm / mlx-lm).
 *
 * Layout (checked against mlx-vlm's gemma4 model, its quant_utils and MLX's CPU quantized
 * kernels):
 *  - tensors under "language_model.model." (mlx-vlm), "model." (mlx-lm text models) or the Hub's
 *    "model.language_model." (unconverted names are accepted too);
 *  - a quantised linear or embedding X has X.weight (U32 [.., out, in·bits/32]: `bits`-bit codes,
 *    one LSB-first bit stream per row, also for 3, 5 and 6 bits), X.scales and X.biases
 *    ([.., out, in/group], bf16/f16/f32), w = scale·q + bias; a module is quantised exactly when
 *    X.scales exists (modules whose width the group does not divide stay in float);
 *  - config.json "quantization" (mlx-vlm duplicates it as "quantization_config"):
 *    {"group_size", "bits", "mode": "affine", "<module path>": {"group_size", "bits"} | false},
 *    module paths as the converter saw them ("language_model.model.layers.0.router.proj"; any of
 *    the prefixes above is accepted). mlx-vlm quantises the MoE router at 8 bits, group 64;
 *  - MoE experts as mlx-vlm's SwitchGLU: X.experts.switch_glu.{gate,up,down}_proj.{weight,scales,
 *    biases} with a leading expert axis. The engine's experts.gate_up_proj [E, 2·I, H] (expert e's
 *    gate rows, then its up rows) is assembled from gate_proj and up_proj into memory owned here
 *    (a copy of the packed codes: the two are separate tensors in the file);
 *  - KV-shared layers carry no k/v projections (mlx-vlm drops them; the engine never reads them);
 *  - some mlx-lm versions store the per-layer-input table split by layer
 *    ("language_model.embed_tokens_per_layer.{i}.weight", [V, P] each, to stay under Metal's 4 GB
 *    buffer limit); those are interleaved back into one [V, L·P] table in memory owned here;
 *  - drafters (g4_source_open_quantized_drafter) keep their Hugging Face names
 *    ("pre_projection.weight", "model.layers.0.mlp.up_proj.weight", ...): looked up with no prefix,
 *    per-module overrides keyed by those names, the token ordering as an I64/I32 tensor. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"
#include "model/config.h"
#include "model/source.h"
#include "util/error.h"
#include "util/mapped_file.h"

typedef struct {
    g4_st_archive st;
    const char *prefix;
    char config_path[4096];
    cJSON *quant;        /* the quantization object (NULL: none) */
    int bits, group;     /* defaults */
    void **owned;
    int n_owned;
} mlx_source;

static const char *const prefixes[] = {"language_model.model.", "model.language_model.", "language_model.", "model.",
                                       ""};

static int valid_bits(int b) { return b >= 2 && b <= 8 && b != 7; }
static int valid_group(int g) { return g == 32 || g == 64 || g == 128; }

/* Reads {"group_size", "bits", "mode"} of a quantization object or override. */
static g4_status read_params(const char *path, const char *what, const cJSON *o, int *bits, int *group,
                             g4_error *err) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "bits");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "group_size");
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
    if (mode && !(cJSON_IsString(mode) && !strcmp(mode->valuestring, "affine")))
        return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: %s: quantization mode %s%s%s is not supported (only \"affine\")",
                       path, what, cJSON_IsString(mode) ? "\"" : "", cJSON_IsString(mode) ? mode->valuestring : "(not a string)",
                       cJSON_IsString(mode) ? "\"" : "");
    if (b && !cJSON_IsNumber(b)) return g4_fail(err, G4_ERR_CONFIG, "%s: %s: \"bits\" must be an integer", path, what);
    if (g && !cJSON_IsNumber(g))
        return g4_fail(err, G4_ERR_CONFIG, "%s: %s: \"group_size\" must be an integer", path, what);
    if (b) *bits = b->valuedouble == (int)b->valuedouble ? (int)b->valuedouble : -1;
    if (g) *group = g->valuedouble == (int)g->valuedouble ? (int)g->valuedouble : -1;
    if (!valid_bits(*bits))
        return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: %s: bits = %d is not supported (MLX affine: 2, 3, 4, 5, 6 or 8)",
                       path, what, *bits);
    if (!valid_group(*group))
        return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: %s: group_size = %d is not supported (MLX: 32, 64 or 128)", path,
                       what, *group);
    return G4_OK;
}

/* The quantisation of module `mod` (a path relative to the text model): *quantised = 0 when
 * config.json says `false` for it. */
static g4_status module_params(const mlx_source *s, const char *mod, int *quantised, int *bits, int *group,
                               g4_error *err) {
    *quantised = 1;
    *bits = s->bits;
    *group = s->group;
    for (const cJSON *e = s->quant ? s->quant->child : NULL; e; e = e->next) {
        const char *k = e->string;
        if (!k || !strcmp(k, "bits") || !strcmp(k, "group_size") || !strcmp(k, "mode")) continue;
        int hit = !strcmp(k, mod);
        for (size_t i = 0; !hit && i < sizeof prefixes / sizeof *prefixes; i++) {
            size_t n = strlen(prefixes[i]);
            hit = n && !strncmp(k, prefixes[i], n) && !strcmp(k + n, mod);
        }
        if (!hit) continue;
        if (cJSON_IsFalse(e)) {
            *quantised = 0;
            return G4_OK;
        }
        if (cJSON_IsTrue(e)) return G4_OK;
        if (!cJSON_IsObject(e))
            return g4_fail(err, G4_ERR_CONFIG, "%s: quantization[\"%s\"] must be an object or false", s->config_path, k);
        char what[320];
        snprintf(what, sizeof what, "quantization[\"%s\"]", k);
        return read_params(s->config_path, what, e, bits, group, err);
    }
    return G4_OK;
}

static const g4_st_tensor *find_t(const mlx_source *s, const char *rel, char *full, size_t n) {
    snprintf(full, n, "%.32s%.200s", s->prefix, rel);
    return g4_st_find(&s->st, full);
}

static int is_float(g4_dtype t) { return t == G4_DT_F32 || t == G4_DT_F16 || t == G4_DT_BF16; }

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
}

static g4_status dense_ref(const g4_st_tensor *t, g4_tensor_ref *out, g4_error *err) {
    return g4_st_dense_ref(t, out, "F32, F16 or BF16 (or U32 codes with scales and biases)", err);
}

/* A quantised module: `mod` relative, w its U32 codes. */
static g4_status affine_ref(mlx_source *s, const char *mod, const g4_st_tensor *w, g4_tensor_ref *out,
                            g4_error *err) {
    const char *file = s->st.file_names[w->file];
    char sname[320], bname[320], rel[300];
    int quantised, bits, group;
    g4_status st = module_params(s, mod, &quantised, &bits, &group, err);
    if (st) return st;
    snprintf(rel, sizeof rel, "%s.scales", mod);
    const g4_st_tensor *sc = find_t(s, rel, sname, sizeof sname);
    snprintf(rel, sizeof rel, "%s.biases", mod);
    const g4_st_tensor *bi = find_t(s, rel, bname, sizeof bname);
    if (!s->quant)
        return g4_fail(err, G4_ERR_CONFIG, "%s: tensor '%s' holds packed U32 codes but config.json has no "
                       "\"quantization\" block giving bits and group_size", file, out->name);
    if (!quantised)
        return g4_fail(err, G4_ERR_CONFIG, "%s: config.json marks module '%s' as not quantized, but '%s' holds "
                       "packed U32 codes", s->config_path, mod, out->name);
    if (!sc) return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' holds packed U32 codes but its scales '%s' are "
                            "missing", file, out->name, sname);
    if (!bi) return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' holds packed U32 codes but its biases '%s' are "
                            "missing", file, out->name, bname);
    if (w->ndim < 2)
        return g4_fail(err, G4_ERR_TENSOR, "%s: packed tensor '%s' must have at least 2 dimensions", file, out->name);
    int64_t words = w->shape[w->ndim - 1];
    if ((words * 32) % bits)
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s': packing width %lld uint32 words per row is not a whole "
                       "number of %d-bit codes", file, out->name, (long long)words, bits);
    int64_t in = words * 32 / bits;
    if (in % group)
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s': %lld columns (%lld words of %d-bit codes) are not a "
                       "multiple of group_size %d", file, out->name, (long long)in, (long long)words, bits, group);
    if (!is_float(sc->dtype))
        return g4_fail(err, G4_ERR_TENSOR, "%s: scales '%s' have dtype %s; expected BF16, F16 or F32", file, sname,
                       g4_dtype_name(sc->dtype));
    int64_t want[G4_MAX_DIMS];
    for (int i = 0; i < w->ndim; i++) want[i] = w->shape[i];
    want[w->ndim - 1] = in / group;
    int ok = sc->ndim == w->ndim;
    for (int i = 0; ok && i < w->ndim; i++) ok = sc->shape[i] == want[i];
    if (!ok) {
        char got[128], exp[128];
        shape_str(sc->shape, sc->ndim, got, sizeof got);
        shape_str(want, w->ndim, exp, sizeof exp);
        /* name the likely cause when the scales imply another width */
        int64_t implied = sc->ndim == w->ndim ? sc->shape[sc->ndim - 1] * group : 0;
        return g4_fail(err, G4_ERR_TENSOR, "%s: scales '%s' have shape [%s]; %d-bit codes of '%s' with group_size %d "
                       "imply [%s]%s%lld columns, the codes %lld)", file, sname, got, bits, out->name, group, exp,
                       implied ? " (the scales imply " : " (", (long long)implied, (long long)in);
    }
    ok = bi->dtype == sc->dtype && bi->ndim == sc->ndim;
    for (int i = 0; ok && i < sc->ndim; i++) ok = bi->shape[i] == sc->shape[i];
    if (!ok) {
        char got[128], exp[128];
        shape_str(bi->shape, bi->ndim, got, sizeof got);
        shape_str(sc->shape, sc->ndim, exp, sizeof exp);
        return g4_fail(err, G4_ERR_TENSOR, "%s: biases '%s' (%s [%s]) do not match their scales (%s [%s])", file, bname,
                       g4_dtype_name(bi->dtype), got, g4_dtype_name(sc->dtype), exp);
    }
    int64_t rows = 1;
    for (int i = 0; i < w->ndim - 1; i++) rows *= w->shape[i];
    if (rows > (1 << 30) || in > (1 << 30))
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' is too large", file, out->name);
    out->ndim = w->ndim;
    for (int i = 0; i < w->ndim; i++) out->shape[i] = w->shape[i];
    out->shape[w->ndim - 1] = in;
    g4_mat m = {0};
    m.type = G4_W_AFFINE;
    m.rows = (int)rows;
    m.cols = (int)in;
    m.data = w->data;
    m.row_bytes = (size_t)words * 4;
    m.bits = bits;
    m.group = group;
    m.scales = sc->data;
    m.biases = bi->data;
    m.scale_dtype = sc->dtype;
    m.scale_stride = (size_t)(in / group);
    out->mat = m;
    out->float_dtype = sc->dtype;
    if (g4_mat_validate(&m, err)) return g4_fail_prefix(err, G4_ERR_TENSOR, "%s: tensor '%s'", file, out->name);
    return G4_OK;
}

/* A module's weight, quantised or float. */
static g4_status module_ref(mlx_source *s, const char *mod, g4_tensor_ref *out, int *found, g4_error *err) {
    char rel[300];
    snprintf(rel, sizeof rel, "%s.weight", mod);
    const g4_st_tensor *w = find_t(s, rel, out->name, sizeof out->name);
    *found = w != NULL;
    if (!w) return G4_OK;
    out->file = s->st.file_names[w->file];
    if (w->dtype == G4_DT_U32) return affine_ref(s, mod, w, out, err);
    char sname[320];
    snprintf(rel, sizeof rel, "%s.scales", mod);
    if (find_t(s, rel, sname, sizeof sname))
        return g4_fail(err, G4_ERR_TENSOR, "%s: tensor '%s' has scales '%s' but dtype %s; MLX codes are U32", out->file,
                       out->name, sname, g4_dtype_name(w->dtype));
    return dense_ref(w, out, err);
}

static g4_status keep(mlx_source *s, void *p, g4_error *err) {
    void **o = realloc(s->owned, sizeof *o * (size_t)(s->n_owned + 1));
    if (!o) {
        free(p);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    s->owned = o;
    s->owned[s->n_owned++] = p;
    return G4_OK;
}

/* experts.gate_up_proj from switch_glu.gate_proj and up_proj: per expert, gate rows then up rows. */
static g4_status merged_gate_up(mlx_source *s, const char *layer, g4_tensor_ref *out, int *found, g4_error *err) {
    char gm[300], um[300];
    snprintf(gm, sizeof gm, "%.200s.experts.switch_glu.gate_proj", layer);
    snprintf(um, sizeof um, "%.200s.experts.switch_glu.up_proj", layer);
    g4_tensor_ref g, u;
    memset(&g, 0, sizeof g);
    memset(&u, 0, sizeof u);
    int fg, fu;
    g4_status st = module_ref(s, gm, &g, &fg, err);
    if (st) return st;
    if (!fg) {
        *found = 0;
        return G4_OK;
    }
    if ((st = module_ref(s, um, &u, &fu, err))) return st;
    if (!fu) {
        snprintf(out->name, sizeof out->name, "%s", u.name);
        *found = 0;
        return G4_OK;
    }
    *found = 1;
    snprintf(out->name, sizeof out->name, "%s", g.name);
    out->file = g.file;
    if (g.ndim != 3 || u.ndim != 3 || memcmp(g.shape, u.shape, sizeof g.shape) || g.mat.type != u.mat.type ||
        g.mat.bits != u.mat.bits || g.mat.group != u.mat.group || g.mat.scale_dtype != u.mat.scale_dtype)
        return g4_fail(err, G4_ERR_TENSOR, "%s: expert tensors '%s' and '%s' differ in shape or quantization", g.file,
                       g.name, u.name);
    int64_t E = g.shape[0], I = g.shape[1];
    size_t rb = g.mat.row_bytes, per = (size_t)I * rb;
    size_t ss = g.mat.scales ? g.mat.scale_stride * g4_dtype_size(g.mat.scale_dtype) * (size_t)I : 0;
    /* one block: codes, then scales, then biases, each [E][2][I][...] */
    uint8_t *codes = malloc((per + 2 * ss) * 2 * (size_t)E);
    if (!codes) return g4_fail(err, G4_ERR_NOMEM, "out of memory assembling '%s'", g.name);
    uint8_t *sc = codes + per * 2 * (size_t)E, *bi = sc + ss * 2 * (size_t)E;
    for (int64_t e = 0; e < E; e++) {
        memcpy(codes + (size_t)(2 * e) * per, (const uint8_t *)g.mat.data + (size_t)e * per, per);
        memcpy(codes + (size_t)(2 * e + 1) * per, (const uint8_t *)u.mat.data + (size_t)e * per, per);
        if (ss) {
            memcpy(sc + (size_t)(2 * e) * ss, (const uint8_t *)g.mat.scales + (size_t)e * ss, ss);
            memcpy(sc + (size_t)(2 * e + 1) * ss, (const uint8_t *)u.mat.scales + (size_t)e * ss, ss);
            memcpy(bi + (size_t)(2 * e) * ss, (const uint8_t *)g.mat.biases + (size_t)e * ss, ss);
            memcpy(bi + (size_t)(2 * e + 1) * ss, (const uint8_t *)u.mat.biases + (size_t)e * ss, ss);
        }
    }
    if ((st = keep(s, codes, err))) return st;
    *out = g;
    snprintf(out->name, sizeof out->name, "%s", g.name);
    out->shape[1] = 2 * I;
    out->mat.rows = (int)(E * 2 * I);
    out->mat.data = codes;
    if (ss) {
        out->mat.scales = sc;
        out->mat.biases = bi;
    }
    return G4_OK;
}

/* embed_tokens_per_layer.weight from per-layer tables embed_tokens_per_layer.{i}: row t of the
 * result is row t of table 0, then of table 1, ... (codes, scales and biases alike). */
static g4_status merged_ple(mlx_source *s, g4_tensor_ref *out, int *found, g4_error *err) {
    g4_tensor_ref *t = NULL;
    int n = 0;
    g4_status st = G4_OK;
    for (;; n++) {
        char mod[64];
        snprintf(mod, sizeof mod, "embed_tokens_per_layer.%d", n);
        g4_tensor_ref *nt = realloc(t, sizeof *t * (size_t)(n + 1));
        if (!nt) {
            st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
            break;
        }
        t = nt;
        memset(&t[n], 0, sizeof t[n]);
        int f = 0;
        if ((st = module_ref(s, mod, &t[n], &f, err)) || !f) break;
        const g4_tensor_ref *a = &t[0], *b = &t[n];
        if (b->ndim != 2 || b->shape[0] != a->shape[0] || b->shape[1] != a->shape[1] || b->mat.type != a->mat.type ||
            b->mat.bits != a->mat.bits || b->mat.group != a->mat.group || b->mat.scale_dtype != a->mat.scale_dtype) {
            st = g4_fail(err, G4_ERR_TENSOR, "%s: per-layer table '%s' differs from '%s' in shape or quantization", b->file,
                         b->name, a->name);
            break;
        }
    }
    *found = !st && n > 0;
    if (st || !n) {
        free(t);
        return st;
    }
    const g4_mat *m0 = &t[0].mat;
    size_t V = (size_t)m0->rows, rb = m0->row_bytes;
    size_t ss = m0->scales ? m0->scale_stride * g4_dtype_size(m0->scale_dtype) : 0;
    uint8_t *mem = malloc((rb + 2 * ss) * (size_t)n * V);
    if (!mem) {
        free(t);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory assembling the per-layer-input table (%d layers)", n);
    }
    uint8_t *sc = mem + rb * (size_t)n * V, *bi = sc + ss * (size_t)n * V;
    for (size_t r = 0; r < V; r++)
        for (int i = 0; i < n; i++) {
            const g4_mat *m = &t[i].mat;
            memcpy(mem + (r * (size_t)n + (size_t)i) * rb, (const uint8_t *)m->data + r * rb, rb);
            if (ss) {
                memcpy(sc + (r * (size_t)n + (size_t)i) * ss, (const uint8_t *)m->scales + r * ss, ss);
                memcpy(bi + (r * (size_t)n + (size_t)i) * ss, (const uint8_t *)m->biases + r * ss, ss);
            }
        }
    if ((st = keep(s, mem, err))) {
        free(t);
        return st;
    }
    *out = t[0];
    out->shape[1] = t[0].shape[1] * n;
    out->mat.cols = m0->cols * n;
    out->mat.row_bytes = rb * (size_t)n;
    out->mat.data = mem;
    if (ss) {
        out->mat.scales = sc;
        out->mat.biases = bi;
        out->mat.scale_stride = m0->scale_stride * (size_t)n;
    }
    free(t);
    return G4_OK;
}

static g4_status mlx_find(void *ctx, const char *name, g4_tensor_ref *out, int *found, g4_error *err) {
    mlx_source *s = ctx;
    memset(out, 0, sizeof *out);
    *found = 0;
    size_t n = strlen(name);
    char mod[256];
    /* experts: the HF names first (unconverted files), then mlx-vlm's SwitchGLU */
    const char *gu = ".experts.gate_up_proj", *dn = ".experts.down_proj";
    if (n > strlen(gu) && !strcmp(name + n - strlen(gu), gu)) {
        const g4_st_tensor *t = find_t(s, name, out->name, sizeof out->name);
        if (t) {
            *found = 1;
            out->file = s->st.file_names[t->file];
            return dense_ref(t, out, err);
        }
        snprintf(mod, sizeof mod, "%.*s", (int)(n - strlen(gu)), name);
        return merged_gate_up(s, mod, out, found, err);
    }
    if (n > strlen(dn) && !strcmp(name + n - strlen(dn), dn)) {
        const g4_st_tensor *t = find_t(s, name, out->name, sizeof out->name);
        if (t) {
            *found = 1;
            out->file = s->st.file_names[t->file];
            return dense_ref(t, out, err);
        }
        snprintf(mod, sizeof mod, "%.*s.experts.switch_glu.down_proj", (int)(n - strlen(dn)), name);
        return module_ref(s, mod, out, found, err);
    }
    if (n > 7 && !strcmp(name + n - 7, ".weight")) {
        snprintf(mod, sizeof mod, "%.*s", (int)(n - 7), name);
        g4_status st = module_ref(s, mod, out, found, err);
        if (!st && !*found && !strcmp(name, "embed_tokens_per_layer.weight")) return merged_ple(s, out, found, err);
        return st;
    }
    const g4_st_tensor *t = find_t(s, name, out->name, sizeof out->name);
    if (!t) return G4_OK;
    *found = 1;
    out->file = s->st.file_names[t->file];
    return dense_ref(t, out, err);
}

static g4_status mlx_find_i32(void *ctx, const char *name, int64_t n, int32_t *out, int *found, g4_error *err) {
    mlx_source *s = ctx;
    char full[512];
    snprintf(full, sizeof full, "%s%s", s->prefix, name);
    return g4_st_find_i32(&s->st, full, n, out, found, err);
}

static void mlx_close(void *ctx) {
    mlx_source *s = ctx;
    for (int i = 0; i < s->n_owned; i++) free(s->owned[i]);
    free(s->owned);
    cJSON_Delete(s->quant);
    g4_st_close(&s->st);
    free(s);
}

/* raw: tensors are asked for by their full names (drafters), so no prefix is looked for */
static g4_status open_mlx(g4_weight_source *src, const char *dir, int raw, g4_error *err) {
    memset(src, 0, sizeof *src);
    mlx_source *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    snprintf(s->config_path, sizeof s->config_path, "%s/config.json", dir);
    char *text = NULL;
    g4_status st = g4_read_file(s->config_path, &text, NULL, err);
    cJSON *root = st ? NULL : cJSON_Parse(text);
    free(text);
    if (!st && !root) st = g4_fail(err, G4_ERR_CONFIG, "%s: not valid JSON", s->config_path);
    if (!st) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
        if (!cJSON_IsObject(q)) q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
        if (cJSON_IsObject(q)) {
            s->quant = cJSON_Duplicate(q, 1);
            if (!cJSON_GetObjectItemCaseSensitive(q, "bits") || !cJSON_GetObjectItemCaseSensitive(q, "group_size"))
                st = g4_fail(err, G4_ERR_CONFIG, "%s: \"quantization\" needs \"bits\" and \"group_size\"", s->config_path);
            else
                st = read_params(s->config_path, "quantization", q, &s->bits, &s->group, err);
        }
    }
    cJSON_Delete(root);
    if (!st) st = g4_st_open(&s->st, dir, err);
    else memset(&s->st, 0, sizeof s->st);
    if (st) {
        cJSON_Delete(s->quant);
        if (s->st.dir) g4_st_close(&s->st);
        free(s);
        return st;
    }
    /* the prefix the text model's tensors carry ("embed_tokens.*" or "layers.*" after it) */
    s->prefix = "";
    for (size_t i = 0; !raw && i < sizeof prefixes / sizeof *prefixes && !*s->prefix; i++)
        for (int k = 0; k < s->st.n_tensors; k++) {
            const char *n = s->st.tensors[k].name;
            size_t pl = strlen(prefixes[i]);
            if (!strncmp(n, prefixes[i], pl) && (!strncmp(n + pl, "embed_tokens.", 13) || !strncmp(n + pl, "layers.", 7))) {
                s->prefix = prefixes[i];
                break;
            }
        }
    src->ctx = s;
    src->path = s->st.dir;
    src->find = mlx_find;
    src->close = mlx_close;
    src->find_i32 = mlx_find_i32;
    return G4_OK;
}

g4_status g4_source_open_mlx(g4_weight_source *src, const char *dir, g4_error *err) {
    return open_mlx(src, dir, 0, err);
}

/* ---- which source a checkpoint directory needs ---------------------------------------------- */

enum { Q_NONE, Q_MLX, Q_QAT };

/* What config.json announces: MLX's "quantization", QAT's quant_method "gemma", or nothing. */
static g4_status quant_kind(const char *dir, int *kind, g4_error *err) {
    *kind = Q_NONE;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    g4_status st = g4_read_file(path, &text, NULL, err);
    if (st) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return g4_fail(err, G4_ERR_CONFIG, "%s: not valid JSON", path);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!qc && cJSON_IsObject(tc)) qc = cJSON_GetObjectItemCaseSensitive(tc, "quantization_config");
    const cJSON *method = cJSON_IsObject(qc) ? cJSON_GetObjectItemCaseSensitive(qc, "quant_method") : NULL;
    int mlx = cJSON_IsObject(q) || (cJSON_IsObject(qc) && !method && cJSON_GetObjectItemCaseSensitive(qc, "bits"));
    int qat = cJSON_IsString(method) && !strcmp(method->valuestring, "gemma");
    if (!mlx && !qat && method)
        st = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: quantization_config.quant_method %s%s%s is not supported (this "
                     "engine reads MLX affine, Google QAT \"gemma\" and GGUF checkpoints)", path,
                     cJSON_IsString(method) ? "\"" : "", cJSON_IsString(method) ? method->valuestring : "(not a string)",
                     cJSON_IsString(method) ? "\"" : "");
    cJSON_Delete(root);
    *kind = mlx ? Q_MLX : qat ? Q_QAT : Q_NONE;
    return st;
}

g4_status g4_source_open_quantized(g4_weight_source *src, const char *dir, const g4_config *cfg, int *handled,
                                   g4_error *err) {
    int kind;
    g4_status st = quant_kind(dir, &kind, err);
    *handled = !st && kind != Q_NONE;
    if (st || !*handled) return st;
    return kind == Q_MLX ? g4_source_open_mlx(src, dir, err) : g4_source_open_qat(src, dir, cfg, err);
}

g4_status g4_source_open_quantized_drafter(g4_weight_source *src, const char *dir, const g4_drafter_config *dc,
                                           int *handled, g4_error *err) {
    int kind;
    g4_status st = quant_kind(dir, &kind, err);
    *handled = !st && kind != Q_NONE;
    if (st || !*handled) return st;
    return kind == Q_MLX ? open_mlx(src, dir, 1, err) : g4_source_open_qat_drafter(src, dir, dc, err);
}
