/* The native pack: every fixture model, and quantised conversions of one, packed and loaded back
 * give bitwise the same logits as the model they were packed from; drafters pack too; the
 * tokenizer rides along; and damaged packs (truncated, bad magic, parts out of range, overlapping
 * or misaligned, malformed manifest, unknown weight type, shape mismatch) fail with clear errors. */
#include <cjson/cJSON.h>
#include <sys/stat.h>

#include "formats/pack.h"
#include "g4.h"
#include "g4_tokenizer.h"
#include "model/model.h"
#include "model/pack.h"
#include "model/synth.h"
#include "model/writer.h"
#include "test_util.h"

static char tmp[512];

static const char *fixture_dir(const char *model, char *buf, size_t n) {
    char rel[256];
    snprintf(rel, sizeof rel, "gemma4/%s", model);
    return test_fixture_path(buf, n, rel);
}

static const char *sub(const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", tmp, name);
    return buf;
}

static g4_model *load(const char *path) {
    g4_model *m = NULL;
    g4_error err = {0};
    if (g4_model_load(path, NULL, &m, &err)) fail_msg("load %s: %s", path, err.message);
    return m;
}

static void pack(const char *in, const char *out, const char *tokenizer) {
    g4_error err = {0};
    g4_pack_options o = {.tokenizer = tokenizer};
    if (g4_pack_write(in, out, &o, NULL, &err)) fail_msg("pack %s -> %s: %s", in, out, err.message);
}

static void convert(const char *in, const char *out, const char *format, int group) {
    g4_model_writer w;
    g4_error err = {0};
    g4_writer_options o = {.group = group};
    if (g4_writer_open(format, out, &o, &w, &err) || g4_convert(in, &w, 2, &err))
        fail_msg("convert %s -> %s (%s): %s", in, out, format, err.message);
}

/* Teacher-forced logits [n][V] of a fixed token sequence, in two chunks (so the batched and the
 * one-token paths both run). */
static float *logits(g4_model *m, int n) {
    g4_session *s = NULL;
    g4_error err = {0};
    if (g4_session_create(m, &(g4_session_options){.n_ctx = 64, .n_threads = 2}, &s, &err))
        fail_msg("session: %s", err.message);
    int V = m->cfg.vocab;
    int32_t tok[64];
    for (int i = 0; i < n; i++) tok[i] = i ? (int32_t)((i * 7919 + 13) % V) : 2;
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    assert_non_null(lg);
    if (g4_session_forward(s, tok, n - 1, G4_LOGITS_ALL, lg, &err) ||
        g4_session_forward(s, tok + n - 1, 1, G4_LOGITS_ALL, lg + (size_t)V * (size_t)(n - 1), &err))
        fail_msg("forward: %s", err.message);
    g4_session_free(s);
    return lg;
}

/* The pack of `in` computes bitwise what `in` computes. */
static void expect_same_logits(const char *in, const char *packed) {
    g4_model *a = load(in), *b = load(packed);
    assert_int_equal(a->cfg.vocab, b->cfg.vocab);
    assert_int_equal(a->weight_bytes, b->weight_bytes);
    assert_true(a->embed_scale == b->embed_scale);
    int n = 20;
    float *la = logits(a, n), *lb = logits(b, n);
    size_t bytes = sizeof(float) * (size_t)a->cfg.vocab * (size_t)n;
    if (memcmp(la, lb, bytes)) fail_msg("%s: logits from the pack %s differ", in, packed);
    free(la);
    free(lb);
    g4_model_free(a);
    g4_model_free(b);
}

/* ---- round trips -------------------------------------------------------------------------------- */

static void test_fixtures_bitwise(void **state) {
    (void)state;
    static const char *const fx[] = {"e2b-mini", "e4b-mini", "moe-mini", "dense-mini", "unified-mini"};
    for (size_t i = 0; i < sizeof fx / sizeof *fx; i++) {
        char in[1024], out[1024], name[64];
        fixture_dir(fx[i], in, sizeof in);
        snprintf(name, sizeof name, "%s.g4p", fx[i]);
        pack(in, sub(name, out, sizeof out), NULL);
        expect_same_logits(in, out);
    }
    /* a folder holding model.g4p loads like the file; packing a pack gives the same model */
    char in[1024], dir[1024], again[1024], file[1100];
    fixture_dir("e2b-mini", in, sizeof in);
    pack(in, sub("e2b-dir", dir, sizeof dir), NULL);
    snprintf(file, sizeof file, "%s/model.g4p", dir);
    struct stat sb;
    assert_int_equal(stat(file, &sb), 0);
    expect_same_logits(in, dir);
    pack(dir, sub("e2b-again.g4p", again, sizeof again), NULL);
    expect_same_logits(in, again);
}

static void test_quantized_bitwise(void **state) {
    (void)state;
    static const struct {
        const char *fixture, *format;
        int group;
    } cases[] = {
        {"e2b-mini", "mlx-4", 32}, {"moe-mini", "mlx-8", 32},   {"e2b-mini", "gguf-q4_0", 0},
        {"dense-mini", "gguf-q8_0", 0}, {"e2b-mini", "qat", 0}, {"dense-mini", "mlx-3", 32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char in[1024], conv[1200], out[1024], name[128];
        fixture_dir(cases[i].fixture, in, sizeof in);
        snprintf(name, sizeof name, "%s-%s", cases[i].fixture, cases[i].format);
        convert(in, sub(name, conv, sizeof conv), cases[i].format, cases[i].group);
        if (!strncmp(cases[i].format, "gguf", 4)) { /* the GGUF writer writes DIR/model.gguf: pack the file */
            size_t n = strlen(conv);
            snprintf(conv + n, sizeof conv - n, "/model.gguf");
        }
        snprintf(name, sizeof name, "%s-%s.g4p", cases[i].fixture, cases[i].format);
        pack(conv, sub(name, out, sizeof out), NULL);
        expect_same_logits(conv, out);
    }
}

/* Writes n bytes over tensor `name` of DIR/model.safetensors. */
static void patch_tensor(const char *dir, const char *name, const void *data, size_t n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    uint8_t *b = test_read_file(path, &len);
    uint64_t hn;
    memcpy(&hn, b, 8);
    cJSON *h = cJSON_ParseWithLength((char *)b + 8, hn);
    cJSON *t = cJSON_GetObjectItem(h, name);
    if (!t) fail_msg("%s: no tensor '%s'", path, name);
    cJSON *off = cJSON_GetObjectItem(t, "data_offsets");
    size_t o0 = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, o1 = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    assert_int_equal(o1 - o0, n);
    FILE *f = fopen(path, "r+b");
    fseek(f, (long)(8 + hn + o0), SEEK_SET);
    fwrite(data, 1, n, f);
    fclose(f);
    cJSON_Delete(h);
    free(b);
}

static void test_qat_activation_scales(void **state) {
    (void)state;
    /* QAT's static activation scales travel in the manifest and still change the output */
    char in[1024], qd[1024], out[1024];
    fixture_dir("dense-mini", in, sizeof in);
    convert(in, sub("qat-act", qd, sizeof qd), "qat-int8", 0);
    float mod = 0.05f;
    patch_tensor(qd, "model.layers.1.self_attn.q_proj.input_activation_scale", &mod, 4);
    patch_tensor(qd, "model.layers.1.self_attn.o_proj.output_activation_scale", &mod, 4);
    pack(qd, sub("qat-act.g4p", out, sizeof out), NULL);
    g4_model *m = load(out);
    assert_true(m->layers[1].wq.in_act_scale == mod);
    assert_true(m->layers[1].wo.out_act_scale == mod);
    assert_true(m->layers[1].wk.in_act_scale == 0);
    g4_model_free(m);
    expect_same_logits(qd, out);
}

static void test_synth_mlx_e2b(void **state) {
    (void)state;
    /* full E2B width (vocab 262144, per-layer inputs) at MLX 4 bits, three layers */
    char json_dir[1024], out[1024];
    g4_error err = {0};
    char *json = NULL;
    assert_int_equal(g4_synth_config_json("e2b", 3, &json, &err), G4_OK);
    g4_model_writer w;
    assert_int_equal(g4_writer_open("mlx-4", sub("synth-e2b", json_dir, sizeof json_dir), NULL, &w, &err), G4_OK);
    g4_synth_options so = {.seed = 7, .n_layers = 3, .n_threads = 2};
    if (g4_synth_write(json, &so, &w, &err)) fail_msg("synth: %s", err.message);
    free(json);
    pack(json_dir, sub("synth-e2b.g4p", out, sizeof out), NULL);
    g4_model *a = load(json_dir), *b = load(out);
    float *la = logits(a, 4), *lb = logits(b, 4);
    assert_memory_equal(la, lb, sizeof(float) * (size_t)a->cfg.vocab * 4);
    free(la);
    free(lb);
    g4_model_free(a);
    g4_model_free(b);
}

static void test_tokenizer_carried(void **state) {
    (void)state;
    char in[1024], tokjson[1024], out[1024], dir[1024];
    fixture_dir("dense-mini", in, sizeof in);
    test_fixture_path(tokjson, sizeof tokjson, "tokenizer/tokenizer.json");
    pack(in, sub("with-tok.g4p", out, sizeof out), tokjson);
    g4_tokenizer *a = NULL, *b = NULL, *c = NULL;
    g4_error err = {0};
    if (g4_tokenizer_load(tokjson, &a, &err) || g4_tokenizer_load(out, &b, &err)) fail_msg("tokenizer: %s", err.message);
    /* a folder holding only model.g4p gives its tokenizer too */
    pack(out, sub("with-tok-dir", dir, sizeof dir), NULL);
    if (g4_tokenizer_load(dir, &c, &err)) fail_msg("tokenizer from folder: %s", err.message);
    const char *text = "Packs carry their tokenizer: <|turn>user\nhello wörld<turn|>";
    g4_tokens ta = {0}, tb = {0}, tc = {0};
    assert_int_equal(g4_tokenizer_encode(a, text, strlen(text), G4_TOKENIZE_SPECIAL, &ta, &err), G4_OK);
    assert_int_equal(g4_tokenizer_encode(b, text, strlen(text), G4_TOKENIZE_SPECIAL, &tb, &err), G4_OK);
    assert_int_equal(g4_tokenizer_encode(c, text, strlen(text), G4_TOKENIZE_SPECIAL, &tc, &err), G4_OK);
    assert_int_equal(ta.n, tb.n);
    assert_int_equal(ta.n, tc.n);
    assert_memory_equal(ta.ids, tb.ids, sizeof(int32_t) * ta.n);
    assert_memory_equal(ta.ids, tc.ids, sizeof(int32_t) * ta.n);
    g4_tokens_free(&ta);
    g4_tokens_free(&tb);
    g4_tokens_free(&tc);
    g4_tokenizer_free(a);
    g4_tokenizer_free(b);
    g4_tokenizer_free(c);
    /* a pack without one says so */
    char bare[1024];
    sub("dense-mini.g4p", bare, sizeof bare);
    pack(in, bare, NULL);
    assert_int_equal(g4_tokenizer_load(bare, &a, &err), G4_ERR_IO);
    assert_non_null(strstr(err.message, "no tokenizer.json"));
}

/* ---- drafters ----------------------------------------------------------------------------------- */

static void propose(const char *target, const char *drafter, int32_t *drafts, float *lg) {
    g4_model *m = load(target);
    g4_drafter *d = NULL;
    g4_session *s = NULL;
    g4_error err = {0};
    if (g4_drafter_load(drafter, m, &d, &err)) fail_msg("drafter %s: %s", drafter, err.message);
    if (g4_session_create(m, &(g4_session_options){.n_ctx = 64, .n_threads = 2}, &s, &err)) fail_msg("%s", err.message);
    int32_t seq[20];
    for (int i = 0; i < 20; i++) seq[i] = i ? (int32_t)((i * 131 + 7) % m->cfg.vocab) : 2;
    if (g4_session_forward(s, seq, 19, G4_LOGITS_NONE, NULL, &err) ||
        g4_drafter_propose(d, s, seq[19], 4, drafts, lg, NULL, &err))
        fail_msg("propose: %s", err.message);
    g4_session_free(s);
    g4_drafter_free(d);
    g4_model_free(m);
}

static void test_drafter_pack(void **state) {
    (void)state;
    static const char *const fx[] = {"e2b-mini", "dense-mini", "unified-mini"};
    for (size_t i = 0; i < sizeof fx / sizeof *fx; i++) {
        char target[1024], drafter[1100], out[1024], name[64];
        fixture_dir(fx[i], target, sizeof target);
        snprintf(drafter, sizeof drafter, "%s/assistant", target);
        snprintf(name, sizeof name, "%s-assistant.g4p", fx[i]);
        pack(drafter, sub(name, out, sizeof out), NULL);
        int32_t da[4], db[4];
        float *la = malloc(sizeof(float) * 512), *lb = malloc(sizeof(float) * 512);
        propose(target, drafter, da, la);
        propose(target, out, db, lb);
        assert_memory_equal(da, db, sizeof da);
        assert_memory_equal(la, lb, sizeof(float) * 512);
        free(la);
        free(lb);
        /* a drafter pack is not a model, and a model pack is not a drafter */
        g4_model *m = NULL;
        g4_error err = {0};
        assert_int_equal(g4_model_load(out, NULL, &m, &err), G4_ERR_ARG);
        assert_non_null(strstr(err.message, "holds a drafter, not a model"));
    }
    char target[1024], mp[1024];
    fixture_dir("dense-mini", target, sizeof target);
    pack(target, sub("dense-mini.g4p", mp, sizeof mp), NULL);
    g4_model *m = load(target);
    g4_drafter *d = NULL;
    g4_error err = {0};
    assert_int_equal(g4_drafter_load(mp, m, &d, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "holds a model, not a drafter"));
    /* a drafter pack for another target: the geometry check still runs */
    char other[1024];
    sub("e2b-mini-assistant.g4p", other, sizeof other);
    assert_int_equal(g4_drafter_load(other, m, &d, &err), G4_ERR_CONFIG);
    assert_non_null(strstr(err.message, "drafter"));
    g4_model_free(m);
}

/* ---- damaged packs -------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *bytes;
    size_t size;
    char *manifest;       /* NUL-terminated copy */
    const uint8_t *data;  /* into bytes */
    size_t data_size;
} pack_image;

static void read_image(const char *path, pack_image *im) {
    im->bytes = test_read_file(path, &im->size);
    uint64_t ms, dof;
    memcpy(&ms, im->bytes + 24, 8);
    memcpy(&dof, im->bytes + 32, 8);
    im->manifest = malloc(ms + 1);
    memcpy(im->manifest, im->bytes + 64, ms);
    im->manifest[ms] = 0;
    im->data = im->bytes + dof;
    im->data_size = im->size - dof;
}

static void free_image(pack_image *im) {
    free(im->bytes);
    free(im->manifest);
}

/* A pack file from a manifest text and a data section, laid out as the writer does. */
static void write_image(const char *path, const char *manifest, const uint8_t *data, size_t n) {
    uint64_t ms = strlen(manifest), dof = (64 + ms + 4095) / 4096 * 4096, ds = n, mo = 64;
    uint32_t ver = 1, order = 0x01020304u;
    uint8_t h[64] = {0};
    memcpy(h, "G4PACK\0\0", 8);
    memcpy(h + 8, &ver, 4);
    memcpy(h + 12, &order, 4);
    memcpy(h + 16, &mo, 8);
    memcpy(h + 24, &ms, 8);
    memcpy(h + 32, &dof, 8);
    memcpy(h + 40, &ds, 8);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(h, 1, 64, f);
    fwrite(manifest, 1, ms, f);
    for (uint64_t i = 64 + ms; i < dof; i++) fputc(0, f);
    fwrite(data, 1, n, f);
    fclose(f);
}

static void expect_error(const char *path, g4_status code, const char *needle1, const char *needle2) {
    g4_model *m = NULL;
    g4_error err = {0};
    g4_status st = g4_model_load(path, NULL, &m, &err);
    if (st != code || !strstr(err.message, needle1) || (needle2 && !strstr(err.message, needle2)))
        fail_msg("%s: expected %s with '%s'%s%s, got %s: %s", path, g4_status_name(code), needle1,
                 needle2 ? " and " : "", needle2 ? needle2 : "", g4_status_name(st), err.message);
    assert_null(m);
}

/* Rewrites the manifest through f (which edits the first tensor named `name`, or the root). */
static void mutated(const pack_image *im, const char *path, void (*f)(cJSON *root, cJSON *t, void *), void *arg,
                    const char *name) {
    cJSON *root = cJSON_Parse(im->manifest);
    assert_non_null(root);
    cJSON *t = NULL;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors")) {
        if (!strcmp(cJSON_GetObjectItem(t, "name")->valuestring, name)) break;
    }
    assert_non_null(t);
    f(root, t, arg);
    char *text = cJSON_PrintUnformatted(root);
    write_image(path, text, im->data, im->data_size);
    free(text);
    cJSON_Delete(root);
}

static void set_part_offset(cJSON *root, cJSON *t, void *arg) {
    (void)root;
    cJSON *part = cJSON_GetObjectItem(t, "data");
    cJSON_ReplaceItemInArray(part, 0, cJSON_CreateNumber(*(double *)arg));
}

static void copy_part_from_first(cJSON *root, cJSON *t, void *arg) {
    (void)arg;
    cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tensors"), 0);
    cJSON *d = cJSON_GetObjectItem(first, "data");
    double off = cJSON_GetArrayItem(d, 0)->valuedouble;
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(t, "data"), 0, cJSON_CreateNumber(off));
}

static void set_string_field(cJSON *root, cJSON *t, void *arg) {
    (void)root;
    const char *const *kv = arg;
    cJSON_ReplaceItemInObject(t, kv[0], cJSON_CreateString(kv[1]));
}

static void bump_shape(cJSON *root, cJSON *t, void *arg) {
    (void)root;
    (void)arg;
    cJSON *sh = cJSON_GetObjectItem(t, "shape");
    double v = cJSON_GetArrayItem(sh, 0)->valuedouble;
    cJSON_ReplaceItemInArray(sh, 0, cJSON_CreateNumber(v + 1));
}

static void drop_root_key(cJSON *root, cJSON *t, void *arg) {
    (void)t;
    cJSON_DeleteItemFromObject(root, (const char *)arg);
}

static void test_damaged(void **state) {
    (void)state;
    char in[1024], good[1024], bad[1024];
    fixture_dir("moe-mini", in, sizeof in);
    pack(in, sub("moe-good.g4p", good, sizeof good), NULL);
    sub("moe-bad.g4p", bad, sizeof bad);
    pack_image im;
    read_image(good, &im);
    const char *t0 = "embed_tokens.weight", *mid = "layers.1.mlp.down_proj.weight";

    /* truncated: at every cut the header, manifest or data bounds notice */
    size_t cuts[] = {0, 10, 63, 64 + strlen(im.manifest) / 2, im.size - im.data_size + 100, im.size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        FILE *f = fopen(bad, "wb");
        fwrite(im.bytes, 1, cuts[i], f);
        fclose(f);
        g4_model *m = NULL;
        g4_error err = {0};
        g4_status st = g4_model_load(bad, NULL, &m, &err);
        if (cuts[i] < 8) { /* too short to carry the magic: not recognised as a pack at all */
            assert_int_not_equal(st, G4_OK);
            continue;
        }
        if (st != G4_ERR_FORMAT) fail_msg("cut at %zu: %s", cuts[i], err.message);
        assert_true(strstr(err.message, "truncated") || strstr(err.message, "does not") || strstr(err.message, "outside"));
    }
    /* bad magic (on a file the loader is pointed at explicitly through the pack reader) */
    {
        uint8_t *c = malloc(im.size);
        memcpy(c, im.bytes, im.size);
        c[3] ^= 0xff;
        FILE *f = fopen(bad, "wb");
        fwrite(c, 1, im.size, f);
        fclose(f);
        g4_pack p;
        g4_error err = {0};
        assert_int_equal(g4_pack_open(&p, bad, &err), G4_ERR_FORMAT);
        assert_non_null(strstr(err.message, "bad magic"));
        /* other byte order, other version */
        memcpy(c, im.bytes, im.size);
        uint32_t swapped = 0x04030201u, v2 = 2;
        memcpy(c + 12, &swapped, 4);
        f = fopen(bad, "wb");
        fwrite(c, 1, im.size, f);
        fclose(f);
        expect_error(bad, G4_ERR_UNSUPPORTED, "byte order", NULL);
        memcpy(c, im.bytes, im.size);
        memcpy(c + 8, &v2, 4);
        f = fopen(bad, "wb");
        fwrite(c, 1, im.size, f);
        fclose(f);
        expect_error(bad, G4_ERR_UNSUPPORTED, "version 2", NULL);
        free(c);
    }
    /* malformed manifest JSON */
    {
        char *m = strdup(im.manifest);
        m[strlen(m) / 2] = 0;
        write_image(bad, m, im.data, im.data_size);
        expect_error(bad, G4_ERR_FORMAT, "not valid JSON", NULL);
        free(m);
        write_image(bad, "[1, 2]", im.data, im.data_size);
        expect_error(bad, G4_ERR_FORMAT, "not a JSON object", NULL);
    }
    /* the untouched image loads (the helpers themselves are sound) */
    write_image(bad, im.manifest, im.data, im.data_size);
    g4_model_free(load(bad));

    double far = (double)im.data_size + 4096, odd = 64 + 8;
    mutated(&im, bad, set_part_offset, &far, mid);
    expect_error(bad, G4_ERR_FORMAT, "outside the data section", mid);
    mutated(&im, bad, set_part_offset, &odd, mid);
    expect_error(bad, G4_ERR_FORMAT, "not aligned", mid);
    mutated(&im, bad, copy_part_from_first, NULL, mid);
    expect_error(bad, G4_ERR_FORMAT, "overlaps", NULL);
    const char *unknown[2] = {"wtype", "q9_9"};
    mutated(&im, bad, set_string_field, unknown, mid);
    expect_error(bad, G4_ERR_UNSUPPORTED, "weight type 'q9_9'", mid);
    const char *dtype[2] = {"float_dtype", "F99"};
    mutated(&im, bad, set_string_field, dtype, t0);
    expect_error(bad, G4_ERR_FORMAT, "F99", t0);
    mutated(&im, bad, bump_shape, NULL, mid);
    expect_error(bad, G4_ERR_FORMAT, "shape implies", mid);
    mutated(&im, bad, drop_root_key, "config", mid);
    expect_error(bad, G4_ERR_FORMAT, "no \"config\"", NULL);
    mutated(&im, bad, drop_root_key, "tensors", mid);
    expect_error(bad, G4_ERR_FORMAT, "\"tensors\" must be an array", NULL);
    free_image(&im);
}

int main(void) {
    test_tmpdir(tmp, sizeof tmp, "pack");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_bitwise),
        cmocka_unit_test(test_quantized_bitwise),
        cmocka_unit_test(test_qat_activation_scales),
        cmocka_unit_test(test_synth_mlx_e2b),
        cmocka_unit_test(test_tokenizer_carried),
        cmocka_unit_test(test_drafter_pack),
        cmocka_unit_test(test_damaged),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) return 1;
    }
    return rc;
}
