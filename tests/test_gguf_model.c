/* GGUF checkpoints: every fixture model written by g4's GGUF writer (F32, F16, BF16, Q8_0, Q4_0)
 * loads through the GGUF weight source and reproduces the safetensors model's logits; the
 * metadata the writer produces matches what llama.cpp's converter wrote for the released 26B-A4B
 * (the fixture vocabulary GGUF carries that metadata); and lying or incomplete files end in clear
 * errors (run under ASan/UBSan: no crash, no leak).
 *
 * Agreement, measured on the fixtures:
 *   - BF16 GGUF vs the bf16 safetensors model: bitwise (same values, same kernels, same embed
 *     scale through g4.source_dtype).
 *   - F32 and F16 GGUF: bitwise against the same model run from a GGUF holding the dequantized
 *     values in F32 (the "dequantize-then-float" reference) when the kernels compute the type
 *     exactly, which they do for the float types.
 *   - Block types: against the dequantize-then-float reference within the tolerance stated at
 *     QUANT_TOL below, and against the original model within the quantization error reported.
 * Set G4_GGUF_KEEP=DIR to keep the converted files (scripts/llama_compare.mjs reads them). */
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>

#include "cpu/kernels.h"
#include "cpu/quant.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "formats/safetensors.h"
#include "g4.h"
#include "g4_tokenizer.h"
#include "model/config.h"
#include "model/gguf_arch.h"
#include "test_util.h"

static char tmp[512];
static const char *models[] = {"e2b-mini", "e4b-mini", "moe-mini", "dense-mini", "unified-mini"};

/* ---- converting a fixture ------------------------------------------------------------------- */

/* Called with each tensor's floats before they reach the writer (may rewrite them). */
typedef void (*transform_fn)(void *user, const char *hf, float *data, int64_t rows, int64_t cols);

static int is_text_tensor(const char *name, const char **rel) {
    if (!strncmp(name, "model.language_model.", 21)) {
        *rel = name + 21;
        return 1;
    }
    if (!strncmp(name, "model.", 6) && strncmp(name, "model.vision", 12) && strncmp(name, "model.audio", 11) &&
        strncmp(name, "model.embed_vision", 18) && strncmp(name, "model.embed_audio", 17) &&
        strncmp(name, "model.language_model", 20)) {
        *rel = name + 6;
        return 1;
    }
    if (!strcmp(name, "lm_head.weight")) {
        *rel = name;
        return 1;
    }
    return 0;
}

static void to_f32(const g4_st_tensor *t, float *out) {
    int64_t n = g4_st_numel(t);
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == G4_DT_BF16) out[i] = g4_bf16_to_f32(((const uint16_t *)t->data)[i]);
        else if (t->dtype == G4_DT_F16) out[i] = g4_f16_to_f32(((const uint16_t *)t->data)[i]);
        else out[i] = ((const float *)t->data)[i];
    }
}

static void fixture_dir(const char *model, char *buf, size_t n) {
    char rel[256];
    snprintf(rel, sizeof rel, "gemma4/%s", model);
    test_fixture_path(buf, n, rel);
}

/* Feeds the fixture `model` through writer w (rows streamed in pieces of 7 to exercise
 * write_rows). Returns the writer's final status. */
static g4_status feed(const char *model, g4_model_writer *w, transform_fn xf, void *user, g4_error *err) {
    char dir[1024], path[1100];
    fixture_dir(model, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *config = test_read_file(path, NULL);
    g4_st_archive a;
    assert_int_equal(g4_st_open(&a, dir, err), G4_OK);
    g4_status st = w->set_config(w->ctx, config, err);
    free(config);
    const char *rel;
    for (int i = 0; i < a.n_tensors && !st; i++)
        if (is_text_tensor(a.tensors[i].name, &rel))
            st = w->declare(w->ctx, rel, a.tensors[i].ndim, a.tensors[i].shape, err);
    if (!st) st = w->begin(w->ctx, err);
    for (int i = 0; i < a.n_tensors && !st; i++) {
        const g4_st_tensor *t = &a.tensors[i];
        if (!is_text_tensor(t->name, &rel)) continue;
        int64_t cols = t->shape[t->ndim - 1], rows = g4_st_numel(t) / cols;
        float *f = malloc(sizeof(float) * (size_t)g4_st_numel(t));
        to_f32(t, f);
        if (xf) xf(user, rel, f, rows, cols);
        for (int64_t r = 0; r < rows && !st; r += 7) {
            int64_t n = rows - r < 7 ? rows - r : 7;
            st = w->write_rows(w->ctx, rel, r, n, f + (size_t)r * (size_t)cols, err);
        }
        free(f);
    }
    g4_st_close(&a);
    if (st) {
        w->abort(w->ctx);
        return st;
    }
    return w->finish(w->ctx, err);
}

static void convert(const char *model, g4_wtype type, const char *vocab, const char *out, transform_fn xf, void *user) {
    g4_model_writer w;
    g4_error err = {0};
    g4_gguf_model_writer_options o = {.type = type, .vocab_path = vocab, .name = model};
    if (g4_gguf_model_writer_open(out, &o, &w, &err)) fail_msg("%s", err.message);
    if (feed(model, &w, xf, user, &err)) fail_msg("%s: %s", model, err.message);
}

/* Replaces each tensor's values with what a GGUF stores for it, dequantized. */
static void dequantized_from(void *user, const char *hf, float *data, int64_t rows, int64_t cols) {
    const g4_gguf *g = user;
    char name[128];
    if (g4_gguf_name_of_hf(hf, name, sizeof name)) return; /* lm_head: not stored */
    const g4_gguf_tensor *t = g4_gguf_find_tensor(g, name);
    if (!t) fail_msg("%s missing in the GGUF", name);
    g4_wtype wt = g4_wtype_of_ggml(t->type);
    size_t rb = g4_wtype_row_bytes(wt, (int)cols, 0);
    assert_int_equal(rb * (size_t)rows, t->size);
    for (int64_t r = 0; r < rows; r++) g4_dequantize_row(wt, t->data + (size_t)r * rb, (int)cols, data + (size_t)r * cols);
}

/* ---- running ------------------------------------------------------------------------------ */

typedef struct {
    int32_t *tokens;
    int n;
} ref_tokens;

static ref_tokens reference_tokens(const char *model) {
    char rel[256], path[1024];
    snprintf(rel, sizeof rel, "gemma4/%s/reference.json", model);
    char *text = test_read_file(test_fixture_path(path, sizeof path, rel), NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *a = cJSON_GetObjectItem(j, "tokens");
    ref_tokens r = {malloc(sizeof(int32_t) * 64), 0};
    for (const cJSON *e = a->child; e && r.n < 64; e = e->next) r.tokens[r.n++] = (int32_t)e->valueint;
    cJSON_Delete(j);
    return r;
}

static float *logits_of(const char *path, const ref_tokens *r, int *vocab) {
    g4_model *m = NULL;
    g4_session *s = NULL;
    g4_error err = {0};
    if (g4_model_load(path, NULL, &m, &err)) fail_msg("%s", err.message);
    g4_model_info info;
    g4_model_get_info(m, &info);
    *vocab = info.vocab;
    assert_int_equal(g4_session_create(m, &(g4_session_options){.n_ctx = 64, .n_threads = 2}, &s, &err), G4_OK);
    float *lg = malloc(sizeof(float) * (size_t)r->n * info.vocab);
    if (g4_session_forward(s, r->tokens, r->n, G4_LOGITS_ALL, lg, &err)) fail_msg("%s", err.message);
    g4_session_free(s);
    g4_model_free(m);
    return lg;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* Same model geometry whichever way it was loaded. */
static void assert_same_geometry(const char *a, const char *b) {
    g4_model *ma = NULL, *mb = NULL;
    g4_error err = {0};
    if (g4_model_load(a, NULL, &ma, &err) || g4_model_load(b, NULL, &mb, &err)) fail_msg("%s", err.message);
    g4_model_info ia, ib;
    g4_model_get_info(ma, &ia);
    g4_model_get_info(mb, &ib);
    assert_int_equal(ia.n_layers, ib.n_layers);
    assert_int_equal(ia.hidden, ib.hidden);
    assert_int_equal(ia.n_heads, ib.n_heads);
    assert_int_equal(ia.vocab, ib.vocab);
    assert_int_equal(ia.n_kv_shared, ib.n_kv_shared);
    assert_int_equal(ia.ple_width, ib.ple_width);
    assert_int_equal(ia.sliding_window, ib.sliding_window);
    assert_int_equal(ia.n_experts, ib.n_experts);
    assert_int_equal(ia.top_k_experts, ib.top_k_experts);
    assert_int_equal(ia.bos, ib.bos);
    assert_int_equal(ia.eos, ib.eos);
    assert_true(ia.embed_scale == ib.embed_scale);
    assert_true(ia.final_softcap == ib.final_softcap);
    for (int i = 0; i < ia.n_layers; i++) {
        g4_layer_info la, lb;
        assert_int_equal(g4_model_get_layer(ma, i, &la), G4_OK);
        assert_int_equal(g4_model_get_layer(mb, i, &lb), G4_OK);
        assert_int_equal(la.is_full, lb.is_full);
        assert_int_equal(la.head_dim, lb.head_dim);
        assert_int_equal(la.n_kv_heads, lb.n_kv_heads);
        assert_int_equal(la.kv_source, lb.kv_source);
        assert_int_equal(la.mlp_width, lb.mlp_width);
        assert_int_equal(la.k_eq_v, lb.k_eq_v);
    }
    g4_model_free(ma);
    g4_model_free(mb);
}

static const char *out_path(char *buf, size_t n, const char *model, const char *type) {
    const char *keep = getenv("G4_GGUF_KEEP");
    if (keep && *keep) {
        mkdir(keep, 0777);
        snprintf(buf, n, "%s/%s-%s.gguf", keep, model, type);
    } else {
        snprintf(buf, n, "%s/%s-%s.gguf", tmp, model, type);
    }
    return buf;
}

/* Whether the CPU kernels compute a block type (the quantized kernels land separately): a small
 * matmul against the dot product of the dequantized weights. */
static int kernels_compute(g4_wtype t) {
    enum { ROWS = 4, COLS = 256 };
    float w[ROWS * COLS], x[COLS], deq[COLS], y[ROWS];
    for (int i = 0; i < ROWS * COLS; i++) w[i] = sinf((float)i * 0.37f);
    for (int i = 0; i < COLS; i++) x[i] = cosf((float)i * 0.11f);
    size_t rb = g4_wtype_row_bytes(t, COLS, 0);
    /* room for a kernel that (wrongly) reads the rows as floats */
    uint8_t *q = calloc(1, rb * ROWS + sizeof w);
    for (int r = 0; r < ROWS; r++) g4_quantize_row(t, w + r * COLS, COLS, q + r * rb);
    g4_mat m = {.type = t, .rows = ROWS, .cols = COLS, .data = q, .row_bytes = rb};
    g4_matmul(NULL, &m, x, 1, y, ROWS);
    int ok = 1;
    for (int r = 0; r < ROWS; r++) {
        g4_dequantize_row(t, q + r * rb, COLS, deq);
        double ref = 0;
        for (int c = 0; c < COLS; c++) ref += (double)deq[c] * x[c];
        if (!(fabs(ref - y[r]) < 0.05 * (1 + fabs(ref)))) ok = 0;
    }
    g4_mat_row_f32(&m, 1, deq);
    float deq2[COLS];
    g4_dequantize_row(t, q + rb, COLS, deq2);
    if (memcmp(deq, deq2, sizeof deq)) ok = 0;
    free(q);
    return ok;
}

/* ---- fixtures through GGUF ------------------------------------------------------------------- */

/* How close a block-type GGUF must come to the same model with its dequantized weights in F32.
 * The quantized kernels differ from a float dot product only in quantizing each activation row to
 * 8 bits per 32-element block (amax/127 steps, kernels_internal.h). That is the same relative
 * rounding as Q8_0 applies to the weights, so the unit of error is measured in the same run: the
 * RMS logit change that Q8_0 weight rounding alone causes (dequantized-Q8_0 model vs the original).
 * Activation rounding must stay within QUANT_UNITS of it. (Max differences are printed but not
 * bounded: these small random models amplify any perturbation over 64 positions, so the maximum
 * grows with chaos, not with kernel error.) */
#define QUANT_UNITS 2.0

typedef struct {
    const char *name;
    g4_wtype type;
} type_case;

static double rms_diff(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s / (double)n);
}

static int argmax_agree(const float *a, const float *b, int n, int V) {
    int agree = 0;
    for (int p = 0; p < n; p++) {
        int x = 0, y = 0;
        for (int v = 1; v < V; v++) {
            if (a[(size_t)p * V + v] > a[(size_t)p * V + x]) x = v;
            if (b[(size_t)p * V + v] > b[(size_t)p * V + y]) y = v;
        }
        agree += x == y;
    }
    return agree;
}

static void test_fixtures_roundtrip(void **state) {
    (void)state;
    /* q8_0 first among the block types: its weight rounding is the unit for the others */
    const type_case types[] = {{"f32", G4_W_F32}, {"f16", G4_W_F16}, {"bf16", G4_W_BF16}, {"q8_0", G4_W_Q8_0},
                               {"q4_0", G4_W_Q4_0}};
    int quant_ok[2] = {kernels_compute(G4_W_Q8_0), kernels_compute(G4_W_Q4_0)};
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        const char *model = models[mi];
        char dir[1024];
        fixture_dir(model, dir, sizeof dir);
        ref_tokens r = reference_tokens(model);
        int V, V2;
        float *ref = logits_of(dir, &r, &V);
        size_t n = (size_t)r.n * (size_t)V;
        int bf16_fixture = strcmp(model, "e4b-mini") != 0;
        double unit = 0;
        for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
            const type_case *tc = &types[ti];
            int block = ti >= 3;
            if (block && !quant_ok[ti - 3]) {
                printf("  %s %s: SKIPPED: the CPU kernels do not compute %s yet\n", model, tc->name, tc->name);
                continue;
            }
            char path[1024], dpath[1024], dname[64];
            out_path(path, sizeof path, model, tc->name);
            convert(model, tc->type, NULL, path, NULL, NULL);
            assert_same_geometry(dir, path);
            float *lg = logits_of(path, &r, &V2);
            assert_int_equal(V, V2);
            /* the dequantize-then-float reference: the values the GGUF stores, as F32 */
            g4_gguf *g = NULL;
            g4_error err = {0};
            assert_int_equal(g4_gguf_open(path, &g, &err), G4_OK);
            snprintf(dname, sizeof dname, "%s-deq", tc->name);
            out_path(dpath, sizeof dpath, model, dname);
            convert(model, G4_W_F32, NULL, dpath, dequantized_from, g);
            g4_gguf_close(g);
            float *deq = logits_of(dpath, &r, &V2);
            int same_deq = !memcmp(lg, deq, n * sizeof(float)), same_ref = !memcmp(lg, ref, n * sizeof(float));
            double k_rms = rms_diff(lg, deq, n), w_rms = rms_diff(deq, ref, n);
            if (tc->type == G4_W_Q8_0) unit = w_rms;
            printf("  %-12s %-5s kernel vs dequantized-f32: %s (rms %.3g, max %.3g, argmax %d/%d); weights vs "
                   "safetensors: rms %.3g; total: %s (max %.3g, argmax %d/%d)\n",
                   model, tc->name, same_deq ? "bitwise" : "differs", k_rms, max_diff(lg, deq, n),
                   argmax_agree(lg, deq, r.n, V), r.n, w_rms, same_ref ? "bitwise" : "differs", max_diff(lg, ref, n),
                   argmax_agree(lg, ref, r.n, V), r.n);
            if (!block) {
                if (!same_deq) fail_msg("%s %s: not bitwise equal to its dequantized-f32 reference", model, tc->name);
                /* float32 fixture written as f32, or bf16-exact fixture as f32/bf16: same values */
                if ((tc->type == G4_W_F32 || (tc->type == G4_W_BF16 && bf16_fixture)) && !same_ref)
                    fail_msg("%s %s: not bitwise equal to the safetensors model (max |diff| %g)", model, tc->name,
                             max_diff(lg, ref, n));
            } else {
                assert_true(unit > 0);
                if (!(k_rms <= QUANT_UNITS * unit))
                    fail_msg("%s %s: rms logit difference %g to its dequantized-f32 reference exceeds %g x the Q8_0 "
                             "weight-rounding unit %g", model, tc->name, k_rms, QUANT_UNITS, unit);
            }
            free(lg);
            free(deq);
            if (!getenv("G4_GGUF_KEEP")) remove(dpath);
        }
        free(ref);
        free(r.tokens);
    }
}

/* ---- metadata against llama.cpp's converter --------------------------------------------------- */

/* The fixture vocabulary GGUF was written by llama.cpp's converter from the released 26B-A4B and
 * carries its gemma4.* metadata; g4's writer, given the same config, must write the same values. */
static void test_metadata_matches_converter(void **state) {
    (void)state;
    char vpath[1024], out[1024];
    test_fixture_path(vpath, sizeof vpath, "tokenizer/ggml-vocab-gemma-4.gguf");
    snprintf(out, sizeof out, "%s/meta-26b.gguf", tmp);
    char *json = g4_released_config_json("26b-a4b");
    assert_non_null(json);
    g4_model_writer w;
    g4_error err = {0};
    g4_gguf_model_writer_options o = {.type = G4_W_BF16, .vocab_path = vpath};
    assert_int_equal(g4_gguf_model_writer_open(out, &o, &w, &err), G4_OK);
    if (w.set_config(w.ctx, json, &err) || w.begin(w.ctx, &err) || w.finish(w.ctx, &err)) fail_msg("%s", err.message);
    free(json);
    g4_gguf *mine = NULL, *conv = NULL;
    assert_int_equal(g4_gguf_open(out, &mine, &err), G4_OK);
    assert_int_equal(g4_gguf_open(vpath, &conv, &err), G4_OK);
    int compared = 0;
    for (size_t i = 0; i < g4_gguf_n_kv(conv); i++) {
        const g4_gguf_kv *kv = g4_gguf_kv_at(conv, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.data);
        if (strncmp(key, "gemma4.", 7) && strncmp(key, "tokenizer.", 10)) continue;
        const g4_gguf_kv *mk = g4_gguf_find(mine, key);
        if (!mk) fail_msg("key %s missing in g4's file", key);
        const g4_gguf_value *a = &kv->value, *b = &mk->value;
        if (a->type == G4_GGUF_ARRAY) {
            assert_int_equal(b->type, G4_GGUF_ARRAY);
            assert_int_equal(a->arr.n, b->arr.n);
            if (a->arr.size != b->arr.size || memcmp(a->arr.data, b->arr.data, a->arr.size)) {
                /* the same integers may be stored with another integer type */
                assert_true(g4_gguf_type_is_int(a->arr.type) && g4_gguf_type_is_int(b->arr.type));
                for (uint64_t j = 0; j < a->arr.n; j++)
                    assert_int_equal(g4_gguf_array_int(&a->arr, j), g4_gguf_array_int(&b->arr, j));
            }
        } else if (a->type == G4_GGUF_STRING) {
            assert_int_equal(b->type, G4_GGUF_STRING);
            assert_int_equal(a->str.len, b->str.len);
            assert_memory_equal(a->str.data, b->str.data, a->str.len);
        } else if (a->type == G4_GGUF_FLOAT32 || a->type == G4_GGUF_FLOAT64) {
            assert_true(b->type == G4_GGUF_FLOAT32 || b->type == G4_GGUF_FLOAT64);
            if ((float)a->f != (float)b->f) fail_msg("%s: converter %g, g4 %g", key, a->f, b->f);
        } else {
            /* integers and bools, compared as values whatever their width */
            assert_true(b->type != G4_GGUF_STRING && b->type != G4_GGUF_ARRAY);
            int64_t x = a->type == G4_GGUF_BOOL ? a->b : g4_gguf_type_is_int(a->type) && (a->type % 2) ? a->i : (int64_t)a->u;
            int64_t y = b->type == G4_GGUF_BOOL ? b->b : g4_gguf_type_is_int(b->type) && (b->type % 2) ? b->i : (int64_t)b->u;
            if (x != y) fail_msg("%s: converter %lld, g4 %lld", key, (long long)x, (long long)y);
        }
        compared++;
    }
    printf("  %d gemma4.* and tokenizer.* keys identical to the converter's\n", compared);
    assert_true(compared >= 30); /* 24 gemma4.* and 12 tokenizer.* keys in that file */
    /* the extra rope_freqs: 64 of 256 pairs rotate (partial_rotary_factor 0.25 at head dim 512) */
    const g4_gguf_tensor *rf = g4_gguf_find_tensor(mine, "rope_freqs.weight");
    assert_non_null(rf);
    assert_int_equal(rf->ne[0], 256);
    float f[256];
    memcpy(f, rf->data, sizeof f);
    for (int i = 0; i < 256; i++) assert_true(f[i] == (i < 64 ? 1.0f : 1e30f));
    g4_gguf_close(mine);
    g4_gguf_close(conv);
}

/* A 512-token model given the real vocabulary keeps its first 512 tokens and the merges among
 * them; without one it gets the stand-in vocabulary. Both load back as the same model. */
static void test_vocab(void **state) {
    (void)state;
    char vpath[1024], a[1024], b[1024];
    test_fixture_path(vpath, sizeof vpath, "tokenizer/ggml-vocab-gemma-4.gguf");
    snprintf(a, sizeof a, "%s/vocab-real.gguf", tmp);
    snprintf(b, sizeof b, "%s/vocab-synth.gguf", tmp);
    convert("dense-mini", G4_W_BF16, vpath, a, NULL, NULL);
    convert("dense-mini", G4_W_BF16, NULL, b, NULL, NULL);
    g4_gguf *g = NULL, *v = NULL;
    g4_error err = {0};
    assert_int_equal(g4_gguf_open(a, &g, &err), G4_OK);
    assert_int_equal(g4_gguf_open(vpath, &v, &err), G4_OK);
    g4_gguf_array t1, t2, merges, types;
    assert_int_equal(g4_gguf_get_array(g, "tokenizer.ggml.tokens", G4_GGUF_STRING, &t1, &err), G4_OK);
    assert_int_equal(g4_gguf_get_array(v, "tokenizer.ggml.tokens", G4_GGUF_STRING, &t2, &err), G4_OK);
    assert_int_equal(t1.n, 512);
    assert_memory_equal(t1.data, t2.data, t1.size); /* the same first 512 strings */
    assert_int_equal(g4_gguf_get_array(g, "tokenizer.ggml.token_type", -1, &types, &err), G4_OK);
    assert_int_equal(types.n, 512);
    assert_int_equal(g4_gguf_get_array(g, "tokenizer.ggml.merges", G4_GGUF_STRING, &merges, &err), G4_OK);
    assert_int_equal(merges.n, 872); /* counted independently from the vocabulary file */
    g4_gguf_str tmpl;
    assert_int_equal(g4_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &err), G4_OK);
    assert_true(tmpl.len > 1000);
    uint64_t bos;
    assert_int_equal(g4_gguf_get_uint(g, "tokenizer.ggml.bos_token_id", &bos, &err), G4_OK);
    assert_int_equal(bos, 2);
    g4_gguf_close(g);
    g4_gguf_close(v);
    assert_int_equal(g4_gguf_open(b, &g, &err), G4_OK);
    assert_int_equal(g4_gguf_get_array(g, "tokenizer.ggml.tokens", G4_GGUF_STRING, &t1, &err), G4_OK);
    assert_int_equal(t1.n, 512);
    g4_gguf_str model;
    assert_int_equal(g4_gguf_get_str(g, "tokenizer.ggml.model", &model, &err), G4_OK);
    assert_int_equal(model.len, 6);
    g4_gguf_close(g);
    assert_same_geometry(a, b);
    /* g4's own tokenizer reads both: the kept merges join "\n\n" (id 108); letters outside the
     * first 512 tokens fall back to byte tokens (<0x69> = 238 + 0x69) */
    const char *paths[2] = {a, b};
    const int32_t want[2][4] = {{108, 343, 348, 107}, {107, 107, 343, 348}};
    const char *texts[2] = {"\n\nin\n", "\n\nin"};
    for (int k = 0; k < 2; k++) {
        g4_tokenizer *tk = NULL;
        if (g4_tokenizer_load_gguf(paths[k], &tk, &err)) fail_msg("%s", err.message);
        assert_int_equal(g4_tokenizer_n_vocab(tk), 512);
        assert_int_equal(g4_tokenizer_bos(tk), 2);
        g4_tokens ids = {0};
        assert_int_equal(g4_tokenizer_encode(tk, texts[k], strlen(texts[k]), 0, &ids, &err), G4_OK);
        assert_int_equal(ids.n, 4);
        for (int i = 0; i < 4; i++) assert_int_equal(ids.ids[i], want[k][i]);
        g4_tokens_free(&ids);
        g4_tokenizer_free(tk);
    }
}

/* ---- bad input ------------------------------------------------------------------------------ */

static uint8_t *good;     /* a valid dense-mini BF16 GGUF */
static size_t good_len;

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Position of a length-prefixed string in the file (its 8-byte length). */
static size_t find_str(const uint8_t *b, size_t n, const char *s) {
    size_t len = strlen(s);
    for (size_t i = 0; i + 8 + len <= n; i++) {
        uint64_t l = 0;
        for (int k = 7; k >= 0; k--) l = l << 8 | b[i + k];
        if (l == len && !memcmp(b + i + 8, s, len)) return i;
    }
    fail_msg("'%s' not found", s);
    return 0;
}

static void expect_error(const char *path, g4_status code, const char *n1, const char *n2) {
    g4_model *m = NULL;
    g4_error err = {0};
    g4_status st = g4_model_load(path, NULL, &m, &err);
    if (st != code)
        fail_msg("%s: expected %s, got %s: %s", path, g4_status_name(code), g4_status_name(st), err.message);
    assert_null(m);
    if (!strstr(err.message, path)) fail_msg("message does not name the file: %s", err.message);
    if (n1 && !strstr(err.message, n1)) fail_msg("message lacks '%s': %s", n1, err.message);
    if (n2 && !strstr(err.message, n2)) fail_msg("message lacks '%s': %s", n2, err.message);
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A copy of the good file with one edit, written to tmp/NAME.gguf. */
static const char *variant(const char *name, void (*edit)(uint8_t *b, size_t *n), char *path, size_t pn) {
    uint8_t *b = malloc(good_len);
    memcpy(b, good, good_len);
    size_t n = good_len;
    edit(b, &n);
    snprintf(path, pn, "%s/%s.gguf", tmp, name);
    write_file(path, b, n);
    free(b);
    return path;
}

/* tensor info of `name`: n_dims at +8+len, ne from +12+len */
static uint8_t *info_of(uint8_t *b, size_t n, const char *name) { return b + find_str(b, n, name) + 8 + strlen(name); }

static void e_count_huge(uint8_t *b, size_t *n) { (void)n; put64(b + 8, 1ull << 40); }
static void e_count_less(uint8_t *b, size_t *n) {
    uint64_t c = 0;
    for (int k = 7; k >= 0; k--) c = c << 8 | b[8 + k];
    put64(b + 8, c - 1);
    (void)n;
}
static void e_count_more(uint8_t *b, size_t *n) {
    uint64_t c = 0;
    for (int k = 7; k >= 0; k--) c = c << 8 | b[8 + k];
    put64(b + 8, c + 1);
    (void)n;
}
static void e_offset_past(uint8_t *b, size_t *n) {
    uint8_t *p = info_of(b, *n, "blk.3.attn_q.weight");
    put64(p + 4 + 2 * 8 + 4, (uint64_t)*n); /* offset field */
}
static void e_offset_misaligned(uint8_t *b, size_t *n) {
    uint8_t *p = info_of(b, *n, "blk.3.attn_q.weight");
    uint64_t off = 0;
    for (int k = 7; k >= 0; k--) off = off << 8 | p[4 + 16 + 4 + k];
    put64(p + 4 + 16 + 4, off + 2);
}
static void e_missing(uint8_t *b, size_t *n) {
    uint8_t *p = info_of(b, *n, "blk.2.ffn_up.weight");
    p[-8] = 'X'; /* "blk.2.ffn_uX.weight" */
}
static void e_transposed(uint8_t *b, size_t *n) {
    uint8_t *p = info_of(b, *n, "blk.1.ffn_down.weight"); /* [I=128 cols, H=64 rows] → swapped */
    uint8_t t[8];
    memcpy(t, p + 4, 8);
    memcpy(p + 4, p + 12, 8);
    memcpy(p + 12, t, 8);
}
static void e_unknown_type(uint8_t *b, size_t *n) { put32(info_of(b, *n, "blk.0.attn_q.weight") + 4 + 16, 99); }
static void e_unsupported_type(uint8_t *b, size_t *n) {
    put32(info_of(b, *n, "output_norm.weight") + 4 + 8, 26); /* i32: same 4 bytes per element */
}
static void e_arch(uint8_t *b, size_t *n) {
    size_t k = find_str(b, *n, "general.architecture");
    b[k + 8 + 20 + 4 + 8 + 4] = 'x'; /* value "gemma4" → "gemmx4" */
}
static void e_key(uint8_t *b, size_t *n) { b[find_str(b, *n, "gemma4.block_count") + 8 + 8] = 'X'; }
static void e_truncated(uint8_t *b, size_t *n) {
    (void)b;
    *n = *n / 2;
}
static void e_rope(uint8_t *b, size_t *n) {
    /* rope_freqs is the last tensor, 16 floats (head dim 32): the file's last 64 bytes. Its last
     * entry (1e30, pass through) becomes 0.5. */
    float h = 0.5f;
    memcpy(b + *n - 4, &h, 4);
}
static void e_kv_mixed(uint8_t *b, size_t *n) {
    /* dense-mini has K = V on its full layers 5 and 11: renaming layer 4's attn_v to layer 5's
     * leaves one full layer with a V projection and one without */
    uint8_t *p = info_of(b, *n, "blk.4.attn_v.weight");
    p[-19 + 4] = '5';
}

static void test_bad_input(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/good.gguf", tmp);
    convert("dense-mini", G4_W_BF16, NULL, path, NULL, NULL);
    good = test_read_file(path, &good_len);
    g4_model *m = NULL;
    g4_error err = {0};
    assert_int_equal(g4_model_load(path, NULL, &m, &err), G4_OK);
    g4_model_free(m);

    expect_error(variant("count-huge", e_count_huge, path, sizeof path), G4_ERR_FORMAT, "tensor count", NULL);
    /* one tensor fewer: the last info (rope_freqs) is read as padding; GGUF has no checksum, so the
     * lie surfaces as that tensor missing */
    expect_error(variant("count-less", e_count_less, path, sizeof path), G4_ERR_TENSOR, "missing tensor", "rope_freqs");
    /* one more: the padding after the infos reads as a nameless scalar at offset 0 */
    expect_error(variant("count-more", e_count_more, path, sizeof path), G4_ERR_FORMAT, "back to back", NULL);
    expect_error(variant("offset-past", e_offset_past, path, sizeof path), G4_ERR_FORMAT, "blk.3.attn_q.weight",
                 "outside the file");
    expect_error(variant("offset-misaligned", e_offset_misaligned, path, sizeof path), G4_ERR_FORMAT,
                 "blk.3.attn_q.weight", "alignment");
    expect_error(variant("missing", e_missing, path, sizeof path), G4_ERR_TENSOR, "missing tensor", "blk.2.ffn_up.weight");
    expect_error(variant("transposed", e_transposed, path, sizeof path), G4_ERR_TENSOR, "blk.1.ffn_down.weight", "shape");
    expect_error(variant("unknown-type", e_unknown_type, path, sizeof path), G4_ERR_UNSUPPORTED, "unknown ggml type 99",
                 "blk.0.attn_q.weight");
    expect_error(variant("unsupported-type", e_unsupported_type, path, sizeof path), G4_ERR_UNSUPPORTED, "i32",
                 "output_norm.weight");
    expect_error(variant("arch", e_arch, path, sizeof path), G4_ERR_UNSUPPORTED, "gemmx4", "not Gemma 4");
    expect_error(variant("key", e_key, path, sizeof path), G4_ERR_FORMAT, "missing metadata key", "gemma4.block_count");
    expect_error(variant("truncated", e_truncated, path, sizeof path), G4_ERR_FORMAT, NULL, NULL);
    expect_error(variant("rope", e_rope, path, sizeof path), G4_ERR_UNSUPPORTED, "rope_freqs", NULL);
    expect_error(variant("kv-mixed", e_kv_mixed, path, sizeof path), G4_ERR_UNSUPPORTED, "attn_v", NULL);
    free(good);
}

/* The writer refuses what it cannot write, naming the tensor. */
static void test_writer_errors(void **state) {
    (void)state;
    char path[1024], cpath[1100], dir[1024];
    snprintf(path, sizeof path, "%s/w.gguf", tmp);
    fixture_dir("moe-mini", dir, sizeof dir);
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    char *config = test_read_file(cpath, NULL);
    g4_model_writer w;
    g4_error err = {0};
    g4_gguf_model_writer_options o = {.type = G4_W_Q8_0};
    int64_t shape[2] = {64, 64}, vec[1] = {64};

    assert_int_equal(g4_gguf_model_writer_open(path, &o, &w, &err), G4_OK);
    assert_int_equal(w.set_config(w.ctx, config, &err), G4_OK);
    assert_int_equal(w.declare(w.ctx, "layers.0.self_attn.bogus.weight", 2, shape, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "layers.0.self_attn.bogus.weight"));
    assert_int_equal(w.declare(w.ctx, "norm.weight", 1, vec, &err), G4_OK);
    assert_int_equal(w.declare(w.ctx, "layers.0.self_attn.q_proj.weight", 2, shape, &err), G4_OK);
    assert_int_equal(w.begin(w.ctx, &err), G4_OK);
    float data[64 * 64] = {0};
    assert_int_equal(w.write(w.ctx, "layers.0.self_attn.q_proj.weight", data, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "norm.weight"));
    data[3] = NAN;
    assert_int_equal(w.write(w.ctx, "norm.weight", data, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "non-finite"));
    data[3] = 0;
    assert_int_equal(w.write(w.ctx, "norm.weight", data, &err), G4_OK);
    assert_int_equal(w.finish(w.ctx, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "q_proj"));

    /* a config GGUF cannot express */
    assert_int_equal(g4_gguf_model_writer_open(path, &o, &w, &err), G4_OK);
    assert_int_equal(w.set_config(w.ctx, "{\"model_type\": \"gemma4_text\"}", &err), G4_ERR_CONFIG);
    w.abort(w.ctx);
    /* the registry knows the GGUF formats */
    g4_writer_options wo = {0};
    assert_int_equal(g4_writer_open("gguf-q9_9", tmp, &wo, &w, &err), G4_ERR_ARG);
    assert_int_equal(g4_writer_open("gguf-q8_0", path, &wo, &w, &err), G4_OK);
    w.abort(w.ctx);
    free(config);
}

static void test_names(void **state) {
    (void)state;
    char n[128];
    const char *cases[][2] = {
        {"embed_tokens.weight", "token_embd.weight"},
        {"layers.12.self_attn.q_norm.weight", "blk.12.attn_q_norm.weight"},
        {"layers.0.experts.gate_up_proj", "blk.0.ffn_gate_up_exps.weight"},
        {"layers.3.router.per_expert_scale", "blk.3.ffn_down_exps.scale"},
        {"layers.7.layer_scalar", "blk.7.layer_output_scale.weight"},
        {"layers.1.pre_feedforward_layernorm.weight", "blk.1.ffn_norm.weight"},
        {"embed_tokens_per_layer.weight", "per_layer_token_embd.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(g4_gguf_name_of_hf(cases[i][0], n, sizeof n), 0);
        assert_string_equal(n, cases[i][1]);
    }
    assert_int_equal(g4_gguf_name_of_hf("lm_head.weight", n, sizeof n), -1);
    assert_int_equal(g4_gguf_name_of_hf("layers.x.mlp.up_proj.weight", n, sizeof n), -1);
    assert_int_equal(g4_gguf_name_of_hf("layers.1.mlp.sideways.weight", n, sizeof n), -1);
    assert_int_equal(g4_wtype_of_ggml(8), G4_W_Q8_0);
    assert_int_equal(g4_wtype_of_ggml(10), G4_W_COUNT); /* q2_K: no kernel */
    assert_int_equal(g4_ggml_of_wtype(G4_W_BF16), 30);
}

int main(void) {
    test_tmpdir(tmp, sizeof tmp, "gguf-model");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_metadata_matches_converter),
        cmocka_unit_test(test_vocab),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_fixtures_roundtrip),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) rc = rc ? rc : 1;
    return rc;
}
