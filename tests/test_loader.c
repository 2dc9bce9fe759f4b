/* Loading: config forms, released geometries, sharded and f16/bf16 checkpoints, and every kind of
 * bad input ending in a clear error (run under ASan/UBSan in CI: no crash, no leak). */
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>

#include "cpu/kernels.h"
#include "formats/safetensors.h"
#include "g4.h"
#include "model/config.h"
#include "test_util.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

static char tmp[512];

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static char *fixture_file(const char *model, const char *file, size_t *len) {
    char rel[256], path[1024];
    snprintf(rel, sizeof rel, "gemma4/%s/%s", model, file);
    return test_read_file(test_fixture_path(path, sizeof path, rel), len);
}

/* A fresh copy of a fixture model in tmp/NAME; returns the directory. */
static const char *copy_model(const char *model, const char *name, char *dir, size_t n) {
    snprintf(dir, n, "%s/%s", tmp, name);
    mkdir(dir, 0777);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        size_t len;
        char *data = fixture_file(model, files[i], &len);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        write_file(path, data, len);
        free(data);
    }
    return dir;
}

/* Rewrites dir/model.safetensors with its header passed through mutate (data bytes unchanged). */
static void mutate_header(const char *dir, void (*mutate)(cJSON *)) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    uint8_t *b = test_read_file(path, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    cJSON *h = cJSON_ParseWithLength((char *)b + 8, n);
    assert_non_null(h);
    mutate(h);
    char *text = cJSON_PrintUnformatted(h);
    size_t tn = strlen(text);
    FILE *f = fopen(path, "wb");
    uint8_t hl[8];
    for (int i = 0; i < 8; i++) hl[i] = (uint8_t)((uint64_t)tn >> (8 * i));
    fwrite(hl, 1, 8, f);
    fwrite(text, 1, tn, f);
    fwrite(b + 8 + n, 1, len - 8 - n, f);
    fclose(f);
    free(text);
    cJSON_Delete(h);
    free(b);
}

static void edit_config(const char *dir, void (*mutate)(cJSON *)) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = test_read_file(path, NULL);
    cJSON *c = cJSON_Parse(text);
    free(text);
    mutate(cJSON_GetObjectItem(c, "text_config") ? cJSON_GetObjectItem(c, "text_config") : c);
    text = cJSON_Print(c);
    write_file(path, text, strlen(text));
    free(text);
    cJSON_Delete(c);
}

/* Loading must fail with `code`, and the message must contain every needle. */
static void expect_load_error(const char *dir, g4_status code, const char *needle1, const char *needle2) {
    g4_model *m = NULL;
    g4_error err = {0};
    g4_status st = g4_model_load(dir, NULL, &m, &err);
    if (st != code)
        fail_msg("%s: expected status %s, got %s: %s", dir, g4_status_name(code), g4_status_name(st), err.message);
    assert_null(m);
    if (needle1 && !strstr(err.message, needle1)) fail_msg("message lacks '%s': %s", needle1, err.message);
    if (needle2 && !strstr(err.message, needle2)) fail_msg("message lacks '%s': %s", needle2, err.message);
}

static float *all_logits(const char *dir, int n_tok) {
    g4_model *m = NULL;
    g4_session *s = NULL;
    g4_error err = {0};
    if (g4_model_load(dir, NULL, &m, &err)) fail_msg("%s", err.message);
    assert_int_equal(g4_session_create(m, &(g4_session_options){.n_ctx = 64, .n_threads = 1}, &s, &err), G4_OK);
    int32_t toks[64];
    for (int i = 0; i < n_tok; i++) toks[i] = (int32_t)((i * 37 + 2) % 512);
    float *lg = malloc(sizeof(float) * 512 * (size_t)n_tok);
    assert_int_equal(g4_session_forward(s, toks, n_tok, G4_LOGITS_ALL, lg, &err), G4_OK);
    g4_session_free(s);
    g4_model_free(m);
    return lg;
}

/* ---- configs ---------------------------------------------------------------------------------- */

/* The model doc's table of released sizes. */
typedef struct {
    const char *name;
    int layers, hidden, heads, kv_sliding, kv_full, k_eq_v, window, period, mlp, mlp_wide_from, shared;
    int src_sliding, src_full, experts;
} released_row;

static const released_row table[] = {
    {"e2b", 35, 1536, 8, 1, 1, 0, 512, 5, 6144, 15, 20, 13, 14, 0},
    {"e4b", 42, 2560, 8, 2, 2, 0, 512, 6, 10240, -1, 18, 22, 23, 0},
    {"12b", 48, 3840, 16, 8, 1, 1, 1024, 6, 15360, -1, 0, -1, -1, 0},
    {"26b-a4b", 30, 2816, 16, 8, 2, 1, 1024, 6, 2112, -1, 0, -1, -1, 128},
    {"31b", 60, 5376, 32, 16, 4, 1, 1024, 6, 21504, -1, 0, -1, -1, 0},
};

static void test_released_geometry(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof table / sizeof *table; k++) {
        const released_row *r = &table[k];
        char *json = g4_released_config_json(r->name);
        assert_non_null(json);
        g4_config c;
        g4_error err = {0};
        if (g4_config_parse(json, r->name, &c, &err)) fail_msg("%s", err.message);
        free(json);
        assert_int_equal(c.n_layers, r->layers);
        assert_int_equal(c.hidden, r->hidden);
        assert_int_equal(c.n_heads, r->heads);
        assert_int_equal(c.sliding_window, r->window);
        assert_int_equal(c.n_kv_shared, r->shared);
        assert_int_equal(c.moe ? c.n_experts : 0, r->experts);
        assert_true(c.layers[r->layers - 1].is_full);
        for (int i = 0; i < c.n_layers; i++) {
            const g4_layer_config *l = &c.layers[i];
            int full = (i + 1) % r->period == 0;
            assert_int_equal(l->is_full, full);
            assert_int_equal(l->head_dim, full ? 512 : 256);
            assert_int_equal(l->n_kv_heads, full ? r->kv_full : r->kv_sliding);
            assert_int_equal(l->k_eq_v, full && r->k_eq_v);
            assert_int_equal(l->mlp_width, r->mlp * (r->mlp_wide_from >= 0 && i >= r->mlp_wide_from ? 2 : 1));
            int src = i < r->layers - r->shared ? i : full ? r->src_full : r->src_sliding;
            assert_int_equal(l->kv_source, src);
            assert_int_equal(l->rope_pairs, full ? 64 : 128);
        }
        if (r->experts) {
            assert_int_equal(c.top_k_experts, 8);
            assert_int_equal(c.moe_width, 704);
        }
        g4_config_free(&c);
    }
    assert_null(g4_released_config_json("7b"));
}

static void test_fixture_config_forms(void **state) {
    (void)state;
    g4_config c;
    g4_error err = {0};
    char path[1024];
    /* per_layer_config with zero-padded keys ("05", "11") */
    assert_int_equal(g4_config_load(test_fixture_path(path, sizeof path, "gemma4/dense-mini"), &c, &err), G4_OK);
    assert_int_equal(c.layers[5].head_dim, 32);
    assert_int_equal(c.layers[5].n_kv_heads, 1);
    assert_int_equal(c.layers[11].head_dim, 32);
    assert_int_equal(c.layers[4].head_dim, 16);
    assert_int_equal(c.layers[4].n_kv_heads, 2);
    assert_true(c.layers[11].k_eq_v);
    g4_config_free(&c);
    /* Hub multimodal layout, global_head_dim, KV sharing, double-wide MLP */
    assert_int_equal(g4_config_load(test_fixture_path(path, sizeof path, "gemma4/e2b-mini"), &c, &err), G4_OK);
    assert_true(c.multimodal_layout);
    assert_int_equal(c.first_shared, 5);
    const int src[10] = {0, 1, 2, 3, 4, 3, 3, 3, 3, 4};
    for (int i = 0; i < 10; i++) {
        assert_int_equal(c.layers[i].kv_source, src[i]);
        assert_int_equal(c.layers[i].mlp_width, i >= 5 ? 384 : 192);
    }
    assert_int_equal(c.layers[4].head_dim, 32);
    assert_int_equal(c.ple_width, 16);
    g4_config_free(&c);
    /* num_global_key_value_heads (honoured with attention_k_eq_v) */
    assert_int_equal(g4_config_load(test_fixture_path(path, sizeof path, "gemma4/moe-mini"), &c, &err), G4_OK);
    assert_int_equal(c.layers[5].n_kv_heads, 1);
    assert_int_equal(c.layers[0].n_kv_heads, 2);
    assert_int_equal(c.n_experts, 8);
    assert_int_equal(c.top_k_experts, 2);
    g4_config_free(&c);
    /* gemma4_unified_text */
    assert_int_equal(g4_config_load(test_fixture_path(path, sizeof path, "gemma4/unified-mini"), &c, &err), G4_OK);
    assert_string_equal(c.arch, "gemma4_unified");
    g4_config_free(&c);
}

static void test_config_defaults_and_extras(void **state) {
    (void)state;
    const char *json =
        "{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":12,\"hidden_size\":64,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":2,\"head_dim\":16,\"global_head_dim\":32,\"intermediate_size\":128,"
        "\"sliding_window\":8,\"some_future_field\":{\"x\":[1,2,3]},\"another\":null}";
    g4_config c;
    g4_error err = {0};
    assert_int_equal(g4_config_parse(json, "cfg", &c, &err), G4_OK);
    for (int i = 0; i < 12; i++) assert_int_equal(c.layers[i].is_full, (i + 1) % 6 == 0);
    assert_int_equal(c.layers[5].head_dim, 32);
    assert_int_equal(c.layers[5].n_kv_heads, 2); /* num_global_key_value_heads needs k_eq_v */
    g4_config_free(&c);
}

typedef struct {
    const char *json;
    g4_status code;
    const char *needle;
} bad_config;

static void test_impossible_configs(void **state) {
    (void)state;
#define BASE "\"model_type\":\"gemma4_text\",\"num_hidden_layers\":6,\"hidden_size\":64,\"head_dim\":16,\"intermediate_size\":128"
    const bad_config cases[] = {
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":3,\"sliding_window\":8}", G4_ERR_CONFIG, "not a multiple"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":0}", G4_ERR_CONFIG, "sliding_window"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8,\"num_kv_shared_layers\":6}", G4_ERR_CONFIG, "num_kv_shared_layers"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8,\"num_kv_shared_layers\":-1}", G4_ERR_CONFIG, "num_kv_shared_layers"},
        {"{" BASE ",\"num_attention_heads\":4,\"sliding_window\":8}", G4_ERR_CONFIG, "num_key_value_heads"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8,\"layer_types\":[\"full_attention\"]}", G4_ERR_CONFIG, "layer_types"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8,\"layer_types\":[1,2,3,4,5,6]}", G4_ERR_CONFIG, "layer_types[0]"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8,\"per_layer_config\":{\"x\":{}}}", G4_ERR_CONFIG, "per_layer_config"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8,\"per_layer_config\":{\"6\":{}}}", G4_ERR_CONFIG, "per_layer_config"},
        {"{" BASE ",\"num_attention_heads\":\"four\",\"num_key_value_heads\":2,\"sliding_window\":8}", G4_ERR_CONFIG, "num_attention_heads"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8,\"enable_moe_block\":true}", G4_ERR_CONFIG, "num_experts"},
        {"{" BASE ",\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8,\"enable_moe_block\":true,\"num_experts\":4,\"top_k_experts\":5,\"moe_intermediate_size\":8}", G4_ERR_CONFIG, "top_k_experts"},
        {"{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":6,\"hidden_size\":64,\"head_dim\":15,\"intermediate_size\":128,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"sliding_window\":8}", G4_ERR_CONFIG, "odd"},
        {"{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":0,\"hidden_size\":64}", G4_ERR_CONFIG, "num_hidden_layers"},
        {"{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":6,\"hidden_size\":1e12}", G4_ERR_CONFIG, "hidden_size"},
        {"{\"model_type\":\"llama\"}", G4_ERR_UNSUPPORTED, "llama"},
        {"{\"model_type\":\"gemma4_assistant\"}", G4_ERR_UNSUPPORTED, "drafter"},
        {"{}", G4_ERR_CONFIG, "model_type"},
        {"[1,2]", G4_ERR_CONFIG, "not a JSON object"},
        {"{\"model_type\": ", G4_ERR_CONFIG, "not a JSON object"},
    };
#undef BASE
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        g4_config c;
        g4_error err = {0};
        g4_status st = g4_config_parse(cases[i].json, "x/config.json", &c, &err);
        if (st != cases[i].code) fail_msg("case %zu: status %s: %s", i, g4_status_name(st), err.message);
        if (!strstr(err.message, cases[i].needle) || !strstr(err.message, "x/config.json"))
            fail_msg("case %zu: message lacks '%s': %s", i, cases[i].needle, err.message);
    }
}

/* ---- bad checkpoints ---------------------------------------------------------------------------- */

static void test_truncated_safetensors(void **state) {
    (void)state;
    char dir[600], path[1024];
    copy_model("dense-mini", "trunc", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    char *full = fixture_file("dense-mini", "model.safetensors", &len);
    const size_t cuts[] = {0, 5, 8, 100, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        write_file(path, full, cuts[i]);
        expect_load_error(dir, G4_ERR_FORMAT, "model.safetensors", NULL);
    }
    free(full);
}

static void test_header_length_past_end(void **state) {
    (void)state;
    char dir[600], path[1024];
    copy_model("dense-mini", "hlen", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    uint8_t *b = (uint8_t *)fixture_file("dense-mini", "model.safetensors", &len);
    uint64_t lie = (uint64_t)len; /* one header's worth past the end */
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(lie >> (8 * i));
    write_file(path, b, len);
    expect_load_error(dir, G4_ERR_FORMAT, "header length", "model.safetensors");
    memset(b, 0xff, 8);
    write_file(path, b, len);
    expect_load_error(dir, G4_ERR_FORMAT, "header length", NULL);
    free(b);
}

static const char *victim = "model.layers.0.mlp.up_proj.weight";

static void offsets_outside(cJSON *h) {
    cJSON *o = cJSON_GetObjectItem(cJSON_GetObjectItem(h, victim), "data_offsets");
    cJSON_ReplaceItemInArray(o, 0, cJSON_CreateNumber(1e9));
    cJSON_ReplaceItemInArray(o, 1, cJSON_CreateNumber(1e9 + 16384));
}
static void offsets_overlap(cJSON *h) {
    cJSON *a = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "model.layers.0.mlp.gate_proj.weight"), "data_offsets");
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(h, victim), "data_offsets", cJSON_Duplicate(a, 1));
}
static void offsets_inverted(cJSON *h) {
    cJSON *o = cJSON_GetObjectItem(cJSON_GetObjectItem(h, victim), "data_offsets");
    cJSON_ReplaceItemInArray(o, 0, cJSON_CreateNumber(500));
    cJSON_ReplaceItemInArray(o, 1, cJSON_CreateNumber(100));
}
static void shape_transposed(cJSON *h) {
    cJSON *s = cJSON_GetObjectItem(cJSON_GetObjectItem(h, victim), "shape"); /* [128, 64] -> [64, 128] */
    cJSON_ReplaceItemInArray(s, 0, cJSON_CreateNumber(64));
    cJSON_ReplaceItemInArray(s, 1, cJSON_CreateNumber(128));
}
static void shape_bytes_mismatch(cJSON *h) {
    cJSON *s = cJSON_GetObjectItem(cJSON_GetObjectItem(h, victim), "shape");
    cJSON_ReplaceItemInArray(s, 0, cJSON_CreateNumber(129));
}
static void shape_huge(cJSON *h) {
    cJSON *s = cJSON_GetObjectItem(cJSON_GetObjectItem(h, victim), "shape");
    cJSON_ReplaceItemInArray(s, 0, cJSON_CreateNumber(4e18));
    cJSON_ReplaceItemInArray(s, 1, cJSON_CreateNumber(4e18));
}
static void tensor_missing(cJSON *h) { cJSON_DeleteItemFromObject(h, victim); }
static void dtype_unknown(cJSON *h) {
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(h, victim), "dtype", cJSON_CreateString("Q7_K"));
}
static void dtype_wrong(cJSON *h) {
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(h, victim), "dtype", cJSON_CreateString("I16"));
}
static void entry_not_object(cJSON *h) { cJSON_ReplaceItemInObject(h, victim, cJSON_CreateNumber(3)); }

static void test_lying_headers(void **state) {
    (void)state;
    const struct {
        void (*mutate)(cJSON *);
        g4_status code;
        const char *n1, *n2;
    } cases[] = {
        {offsets_outside, G4_ERR_FORMAT, "outside", victim},
        {offsets_overlap, G4_ERR_FORMAT, "overlap", "model.safetensors"},
        {offsets_inverted, G4_ERR_FORMAT, "data_offsets", victim},
        {shape_transposed, G4_ERR_TENSOR, "shape [64, 128]", "implies [128, 64]"},
        {shape_bytes_mismatch, G4_ERR_FORMAT, "do not match", victim},
        {shape_huge, G4_ERR_FORMAT, "impossibly large", victim},
        {tensor_missing, G4_ERR_TENSOR, "missing tensor", victim},
        {dtype_unknown, G4_ERR_FORMAT, "unknown dtype 'Q7_K'", victim},
        {dtype_wrong, G4_ERR_TENSOR, "dtype I16", victim},
        {entry_not_object, G4_ERR_FORMAT, victim, "dtype"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[600], name[32];
        snprintf(name, sizeof name, "lie%zu", i);
        copy_model("dense-mini", name, dir, sizeof dir);
        mutate_header(dir, cases[i].mutate);
        expect_load_error(dir, cases[i].code, cases[i].n1, cases[i].n2);
    }
}

static void header_garbage(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char text[] = "\x10\0\0\0\0\0\0\0{\"a\": [1, 2, }  ";
    write_file(path, text, sizeof text - 1);
}

static void config_set_heads(cJSON *c) { cJSON_ReplaceItemInObject(c, "num_key_value_heads", cJSON_CreateNumber(3)); }
static void config_window0(cJSON *c) { cJSON_ReplaceItemInObject(c, "sliding_window", cJSON_CreateNumber(0)); }
static void config_shared_all(cJSON *c) { cJSON_ReplaceItemInObject(c, "num_kv_shared_layers", cJSON_CreateNumber(10)); }
static void config_hidden(cJSON *c) { cJSON_ReplaceItemInObject(c, "hidden_size", cJSON_CreateNumber(80)); }
static void config_extra(cJSON *c) { cJSON_AddItemToObject(c, "unknown_future_knob", cJSON_CreateString("x")); }

static void test_bad_configs_on_disk(void **state) {
    (void)state;
    char dir[600], path[1024];
    copy_model("e2b-mini", "cfg-missing", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    expect_load_error(dir, G4_ERR_IO, "config.json", "cannot open");
    copy_model("e2b-mini", "cfg-malformed", dir, sizeof dir);
    write_file(path, "{\"text_config\": {", 17);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, "{\"text_config\": {", 17);
    expect_load_error(dir, G4_ERR_CONFIG, "config.json", "JSON");
    copy_model("e2b-mini", "cfg-heads", dir, sizeof dir);
    edit_config(dir, config_set_heads);
    expect_load_error(dir, G4_ERR_CONFIG, "config.json", "not a multiple");
    copy_model("e2b-mini", "cfg-window", dir, sizeof dir);
    edit_config(dir, config_window0);
    expect_load_error(dir, G4_ERR_CONFIG, "config.json", "sliding_window");
    copy_model("e2b-mini", "cfg-shared", dir, sizeof dir);
    edit_config(dir, config_shared_all);
    expect_load_error(dir, G4_ERR_CONFIG, "config.json", "num_kv_shared_layers");
    /* a config that disagrees with the tensors: the shape check names the tensor */
    copy_model("e2b-mini", "cfg-hidden", dir, sizeof dir);
    edit_config(dir, config_hidden);
    expect_load_error(dir, G4_ERR_TENSOR, "model.safetensors", "implies [512, 80]");
    /* unknown extra fields are ignored */
    copy_model("e2b-mini", "cfg-extra", dir, sizeof dir);
    edit_config(dir, config_extra);
    g4_model *m = NULL;
    g4_error err = {0};
    assert_int_equal(g4_model_load(dir, NULL, &m, &err), G4_OK);
    g4_model_free(m);
    /* no weights at all; garbage header */
    copy_model("e2b-mini", "no-weights", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    expect_load_error(dir, G4_ERR_IO, "model.safetensors", NULL);
    header_garbage(dir);
    expect_load_error(dir, G4_ERR_FORMAT, "not a JSON object", "model.safetensors");
    expect_load_error("/nonexistent/model", G4_ERR_IO, "/nonexistent/model", NULL);
}

/* ---- sharded and f16/bf16 checkpoints ----------------------------------------------------------- */

/* Writes the tensors of `src` into dir as shards, tensor i going to shard i % n_shards, converting
 * float tensors to `dtype` (F32 keeps them, or rounds-trips them through F16 when round_f16). */
static void write_shards(const char *src, const char *dir, int n_shards, g4_dtype dtype, int round_f16,
                         const char *index_extra) {
    g4_st_archive a;
    g4_error err = {0};
    if (g4_st_open(&a, src, &err)) fail_msg("%s", err.message);
    cJSON *index = cJSON_CreateObject(), *map = cJSON_AddObjectToObject(index, "weight_map");
    for (int s = 0; s < n_shards; s++) {
        char path[1024], fname[64];
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        g4_st_writer *w;
        assert_int_equal(g4_st_writer_create(path, &w, &err), G4_OK);
        for (int i = s; i < a.n_tensors; i += n_shards) {
            const g4_st_tensor *t = &a.tensors[i];
            g4_dtype dt = t->dtype == G4_DT_F32 || t->dtype == G4_DT_BF16 ? dtype : t->dtype;
            assert_int_equal(g4_st_writer_declare(w, t->name, dt, t->ndim, t->shape, &err), G4_OK);
            cJSON_AddStringToObject(map, t->name, fname);
        }
        assert_int_equal(g4_st_writer_begin_data(w, &err), G4_OK);
        for (int i = s; i < a.n_tensors; i += n_shards) {
            const g4_st_tensor *t = &a.tensors[i];
            if (t->dtype != G4_DT_F32 && t->dtype != G4_DT_BF16) {
                assert_int_equal(g4_st_writer_write(w, t->data, t->nbytes, &err), G4_OK);
                continue;
            }
            int64_t n = g4_st_numel(t);
            size_t esz = g4_dtype_size(dtype);
            uint8_t *buf = malloc((size_t)n * esz + 1);
            for (int64_t k = 0; k < n; k++) {
                float v = t->dtype == G4_DT_F32 ? ((const float *)t->data)[k] : g4_bf16_to_f32(((const uint16_t *)t->data)[k]);
                if (round_f16) v = g4_f16_to_f32(g4_f32_to_f16(v));
                if (dtype == G4_DT_F32) memcpy(buf + k * 4, &v, 4);
                else {
                    uint16_t h = dtype == G4_DT_F16 ? g4_f32_to_f16(v) : g4_f32_to_bf16(v);
                    memcpy(buf + k * 2, &h, 2);
                }
            }
            assert_int_equal(g4_st_writer_write(w, buf, (size_t)n * esz, &err), G4_OK);
            free(buf);
        }
        assert_int_equal(g4_st_writer_finish(w, &err), G4_OK);
    }
    if (n_shards > 1) {
        if (index_extra) cJSON_AddStringToObject(map, index_extra, "model-00009-of-00009.safetensors");
        char path[1024];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        char *text = cJSON_Print(index);
        write_file(path, text, strlen(text));
        free(text);
    }
    cJSON_Delete(index);
    g4_st_close(&a);
}

static void test_sharded_and_dtypes(void **state) {
    (void)state;
    char src[1024], dir[600], path[1024];
    test_fixture_path(src, sizeof src, "gemma4/e4b-mini");
    float *ref = all_logits(src, 20);
    /* sharded, same bytes: bitwise equal */
    copy_model("e4b-mini", "sharded", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    write_shards(src, dir, 3, G4_DT_F32, 0, NULL);
    float *lg = all_logits(dir, 20);
    assert_memory_equal(lg, ref, sizeof(float) * 512 * 20);
    free(lg);
    /* an index naming a shard that does not exist */
    copy_model("e4b-mini", "sharded-bad", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    write_shards(src, dir, 2, G4_DT_F32, 0, "model.extra.weight");
    expect_load_error(dir, G4_ERR_IO, "model-00009-of-00009.safetensors", NULL);
    /* f16 storage computes exactly what f32 storage of the same (f16-representable) values does */
    copy_model("e4b-mini", "f16", dir, sizeof dir);
    write_shards(src, dir, 1, G4_DT_F16, 1, NULL);
    float *f16 = all_logits(dir, 20);
    copy_model("e4b-mini", "f32r", dir, sizeof dir);
    write_shards(src, dir, 1, G4_DT_F32, 1, NULL);
    float *f32r = all_logits(dir, 20);
    assert_memory_equal(f16, f32r, sizeof(float) * 512 * 20);
    /* and f16 rounding of the weights moves logits only a little */
    double worst = 0;
    for (int i = 0; i < 512 * 20; i++) worst = fabs(f16[i] - ref[i]) > worst ? fabs(f16[i] - ref[i]) : worst;
    assert_true(worst > 0 && worst < 0.05);
    free(f16);
    free(f32r);
    /* the fixture's f32 weights are bf16-exact, so bf16 storage must give the very same bits */
    copy_model("e4b-mini", "bf16", dir, sizeof dir);
    write_shards(src, dir, 1, G4_DT_BF16, 0, NULL);
    float *bf = all_logits(dir, 20);
    assert_memory_equal(bf, ref, sizeof(float) * 512 * 20);
    free(bf);
    free(ref);
}

static void test_half_conversions(void **state) {
    (void)state;
    /* every f16 bit pattern survives f16 -> f32 -> f16 (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = g4_f16_to_f32((uint16_t)h);
        if (isnan(f)) assert_true(isnan(g4_f16_to_f32(g4_f32_to_f16(f))));
        else assert_int_equal(g4_f32_to_f16(f), h);
    }
    assert_true(g4_f16_to_f32(0x3c00) == 1.0f);
    assert_true(g4_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    assert_true(g4_bf16_to_f32(g4_f32_to_bf16(9.797958971f)) == 9.8125f); /* sqrt(96) rounds as the reference */
    assert_true(g4_bf16_to_f32(g4_f32_to_bf16(sqrtf(1536))) == 39.25f);
    assert_true(g4_bf16_to_f32(g4_f32_to_bf16(sqrtf(2560))) == 50.5f);
    assert_true(g4_bf16_to_f32(g4_f32_to_bf16(sqrtf(5376))) == 73.5f);
}

static int setup(void **state) {
    (void)state;
    test_tmpdir(tmp, sizeof tmp, "loader");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%.900s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_released_geometry),
        cmocka_unit_test(test_fixture_config_forms),
        cmocka_unit_test(test_config_defaults_and_extras),
        cmocka_unit_test(test_impossible_configs),
        cmocka_unit_test(test_truncated_safetensors),
        cmocka_unit_test(test_header_length_past_end),
        cmocka_unit_test(test_lying_headers),
        cmocka_unit_test(test_bad_configs_on_disk),
        cmocka_unit_test(test_sharded_and_dtypes),
        cmocka_unit_test(test_half_conversions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
