/* Drafters in every format the target loads from: the fixture drafters converted to MLX affine
 * (8 and 4 bits), Google QAT (int8 and the mixed recipe), bf16 and the native pack load through
 * the common source layer; the geometry check still refuses a drafter made for another target;
 * drafted greedy output stays bitwise the undrafted output whatever the drafter's precision; the
 * 8-bit drafters' draft tokens are compared with the fixture's reference drafts; and damaged or
 * unsupported drafters fail with clear errors. */
#include <cjson/cJSON.h>
#include <sys/stat.h>

#include "g4.h"
#include "model/model.h"
#include "model/pack.h"
#include "model/synth.h"
#include "model/writer.h"
#include "test_util.h"

static char tmp[512];
static const char *const with_drafter[] = {"e2b-mini", "dense-mini", "unified-mini"};

static const char *fixture_dir(const char *model, char *buf, size_t n) {
    char rel[256];
    snprintf(rel, sizeof rel, "gemma4/%s", model);
    return test_fixture_path(buf, n, rel);
}

/* tmp/<fixture>-<format>: the fixture's drafter converted (cached across tests). */
static const char *converted(const char *fixture, const char *format, char *out, size_t n) {
    snprintf(out, n, "%s/%s-%s", tmp, fixture, format);
    struct stat sb;
    if (stat(out, &sb) == 0) return out;
    char in[1024];
    fixture_dir(fixture, in, sizeof in);
    strncat(in, "/assistant", sizeof in - strlen(in) - 1);
    g4_model_writer w;
    g4_error err = {0};
    g4_writer_options o = {.group = !strncmp(format, "mlx", 3) ? 32 : 0};
    if (!strcmp(format, "pack")) {
        if (g4_pack_write(in, out, NULL, NULL, &err)) fail_msg("pack %s: %s", in, err.message);
        return out;
    }
    if (g4_writer_open(format, out, &o, &w, &err) || g4_convert(in, &w, 2, &err))
        fail_msg("convert %s -> %s: %s", in, format, err.message);
    return out;
}

static g4_model *load_target(const char *fixture) {
    char dir[1024];
    g4_model *m = NULL;
    g4_error err = {0};
    if (g4_model_load(fixture_dir(fixture, dir, sizeof dir), NULL, &m, &err)) fail_msg("%s: %s", dir, err.message);
    return m;
}

static g4_drafter *load_drafter(const char *path, const g4_model *m) {
    g4_drafter *d = NULL;
    g4_error err = {0};
    if (g4_drafter_load(path, m, &d, &err)) fail_msg("drafter %s: %s", path, err.message);
    return d;
}

/* ---- loading and reference drafts ----------------------------------------------------------------- */

/* Draft tokens of the drafter at path for the fixture's reference cases: *agree of *total. */
static void reference_drafts(const char *fixture, const char *path, int *agree, int *total) {
    char dir[1024], ref[1100];
    fixture_dir(fixture, dir, sizeof dir);
    snprintf(ref, sizeof ref, "%s/assistant/reference.json", dir);
    char *text = test_read_file(ref, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    int32_t seq[256];
    int ns = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "sequence")) if (ns < 256) seq[ns++] = (int32_t)e->valuedouble;
    g4_model *m = load_target(fixture);
    g4_drafter *d = load_drafter(path, m);
    g4_session *s = NULL;
    g4_error err = {0};
    if (g4_session_create(m, &(g4_session_options){.n_ctx = 256, .n_threads = 2}, &s, &err)) fail_msg("%s", err.message);
    *agree = *total = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        int p = (int)cJSON_GetObjectItem(c, "p")->valuedouble;
        int32_t want[16], got[16];
        int k = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(c, "draft_tokens")) if (k < 16) want[k++] = (int32_t)e->valuedouble;
        assert_true(p > 0 && p < ns);
        g4_session_reset(s);
        if (g4_session_forward(s, seq, p, G4_LOGITS_NONE, NULL, &err) ||
            g4_drafter_propose(d, s, seq[p], k, got, NULL, NULL, &err))
            fail_msg("%s: %s", path, err.message);
        for (int i = 0; i < k; i++) *agree += got[i] == want[i];
        *total += k;
    }
    g4_session_free(s);
    g4_drafter_free(d);
    g4_model_free(m);
    cJSON_Delete(root);
}

static void test_formats_load_and_draft(void **state) {
    (void)state;
    static const char *const formats[] = {"bf16", "mlx-8", "mlx-4", "qat-int8", "qat", "pack"};
    for (size_t f = 0; f < sizeof with_drafter / sizeof *with_drafter; f++) {
        for (size_t k = 0; k < sizeof formats / sizeof *formats; k++) {
            char path[1024];
            converted(with_drafter[f], formats[k], path, sizeof path);
            int agree, total;
            reference_drafts(with_drafter[f], path, &agree, &total);
            print_message("%-13s %-9s draft tokens %2d/%d agree with the fixture's reference\n", with_drafter[f],
                          formats[k], agree, total);
            assert_true(total > 0);
            /* bf16 and the pack hold the fixture's own values: every draft must agree. The fixture
             * drafters are random-weight with near-tied logits (top gaps ~0.1 on a range of ~15), so
             * quantisation flips some drafts: measured 16/16, 16/16, 9/9 at QAT int8 (per-row scales)
             * and 13/16, 16/16, 2/9 at MLX 8-bit (group 32, bf16 scales and biases). */
            if (!strcmp(formats[k], "bf16") || !strcmp(formats[k], "pack")) assert_int_equal(agree, total);
            if (!strcmp(formats[k], "qat-int8")) assert_true(4 * agree >= 3 * total);
            if (!strcmp(formats[k], "mlx-8")) assert_true(5 * agree >= total);
        }
        /* a pack of a quantised drafter proposes exactly what the quantised drafter proposes */
        char mlx[1024], packed[1100];
        converted(with_drafter[f], "mlx-4", mlx, sizeof mlx);
        snprintf(packed, sizeof packed, "%s.g4p", mlx);
        g4_error err = {0};
        if (g4_pack_write(mlx, packed, NULL, NULL, &err)) fail_msg("pack: %s", err.message);
        int a1, t1, a2, t2;
        reference_drafts(with_drafter[f], mlx, &a1, &t1);
        reference_drafts(with_drafter[f], packed, &a2, &t2);
        assert_int_equal(a1, a2);
        assert_int_equal(t1, t2);
    }
}

/* ---- exactness whatever the drafter's precision ------------------------------------------------------ */

typedef struct {
    int32_t tok[128];
    float *lg;
    int n, V;
} token_log;

static int log_token(void *user, int32_t t, const float *logits, int V) {
    token_log *l = user;
    if (l->n < 128) {
        l->tok[l->n] = t;
        memcpy(l->lg + (size_t)l->n * (size_t)V, logits, sizeof(float) * (size_t)V);
        l->n++;
    }
    return 0;
}

static void generate(g4_model *m, g4_drafter *d, int k, token_log *log) {
    g4_session *s = NULL;
    g4_error err = {0};
    if (g4_session_create(m, &(g4_session_options){.n_ctx = 256, .n_threads = 2}, &s, &err)) fail_msg("%s", err.message);
    int32_t prompt[6] = {2, 17, 301, 44, 9, 120};
    g4_generate_options o = {.max_new = 96, .drafter = d, .draft_k = k, .draft_fixed = 1, .on_token = log_token,
                             .user = log};
    if (g4_generate(s, prompt, 6, &o, NULL, &err)) fail_msg("generate: %s", err.message);
    g4_session_free(s);
}

static void test_drafted_equals_plain(void **state) {
    (void)state;
    static const char *const formats[] = {"mlx-4", "qat"};
    for (size_t f = 0; f < sizeof with_drafter / sizeof *with_drafter; f++) {
        g4_model *m = load_target(with_drafter[f]);
        int V = m->cfg.vocab;
        token_log plain = {.lg = malloc(sizeof(float) * 128 * (size_t)V), .V = V};
        generate(m, NULL, 0, &plain);
        assert_int_equal(plain.n, 96);
        for (size_t k = 0; k < sizeof formats / sizeof *formats; k++) {
            char path[1024];
            g4_drafter *d = load_drafter(converted(with_drafter[f], formats[k], path, sizeof path), m);
            for (int dk = 1; dk <= 4; dk += 3) {
                token_log drafted = {.lg = malloc(sizeof(float) * 128 * (size_t)V), .V = V};
                generate(m, d, dk, &drafted);
                assert_int_equal(drafted.n, plain.n);
                assert_memory_equal(drafted.tok, plain.tok, sizeof(int32_t) * (size_t)plain.n);
                assert_memory_equal(drafted.lg, plain.lg, sizeof(float) * (size_t)plain.n * (size_t)V);
                free(drafted.lg);
            }
            g4_drafter_free(d);
        }
        free(plain.lg);
        g4_model_free(m);
    }
}

/* ---- bad drafters ------------------------------------------------------------------------------------ */

static void copy_file(const char *from, const char *to, size_t keep) {
    size_t n;
    char *data = test_read_file(from, &n);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    fwrite(data, 1, keep < n ? keep : n, f);
    fclose(f);
    free(data);
}

static void expect_drafter_error(const char *path, const g4_model *m, g4_status code, const char *needle) {
    g4_drafter *d = NULL;
    g4_error err = {0};
    g4_status st = g4_drafter_load(path, m, &d, &err);
    if (st != code || !strstr(err.message, needle))
        fail_msg("%s: expected %s with '%s', got %s: %s", path, g4_status_name(code), needle, g4_status_name(st),
                 err.message);
    assert_null(d);
}

static void test_bad_drafters(void **state) {
    (void)state;
    g4_model *e2b = load_target("e2b-mini"), *dense = load_target("dense-mini");
    char mlx[1024], bad[1024], from[1100], to[1100];
    converted("e2b-mini", "mlx-4", mlx, sizeof mlx);
    /* made for another target: the geometry check names it */
    expect_drafter_error(mlx, dense, G4_ERR_CONFIG, "drafter");
    char qat[1024];
    expect_drafter_error(converted("dense-mini", "qat-int8", qat, sizeof qat), e2b, G4_ERR_CONFIG, "drafter");
    /* truncated quantised drafter */
    snprintf(bad, sizeof bad, "%s/bad-mlx", tmp);
    mkdir(bad, 0777);
    snprintf(from, sizeof from, "%s/config.json", mlx);
    snprintf(to, sizeof to, "%s/config.json", bad);
    copy_file(from, to, (size_t)-1);
    snprintf(from, sizeof from, "%s/model.safetensors", mlx);
    snprintf(to, sizeof to, "%s/model.safetensors", bad);
    struct stat sb;
    assert_int_equal(stat(from, &sb), 0);
    copy_file(from, to, (size_t)sb.st_size - 100);
    expect_drafter_error(bad, e2b, G4_ERR_FORMAT, "model.safetensors");
    /* quantised codes whose config lost its quantization block */
    copy_file(from, to, (size_t)-1);
    snprintf(from, sizeof from, "%s/config.json", mlx);
    char *text = test_read_file(from, NULL);
    cJSON *c = cJSON_Parse(text);
    free(text);
    cJSON_DeleteItemFromObject(c, "quantization");
    cJSON_DeleteItemFromObject(c, "quantization_config");
    text = cJSON_Print(c);
    snprintf(to, sizeof to, "%s/config.json", bad);
    FILE *f = fopen(to, "wb");
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(c);
    expect_drafter_error(bad, e2b, G4_ERR_TENSOR, "U32");
    /* truncated drafter pack */
    char pk[1024];
    converted("e2b-mini", "pack", pk, sizeof pk);
    snprintf(from, sizeof from, "%s/model.g4p", pk);
    snprintf(to, sizeof to, "%s/bad.g4p", tmp);
    assert_int_equal(stat(from, &sb), 0);
    copy_file(from, to, (size_t)sb.st_size - 64);
    expect_drafter_error(to, e2b, G4_ERR_FORMAT, "bad.g4p");
    /* GGUF drafters: no naming is defined; the writer refuses them and the loader says so */
    snprintf(to, sizeof to, "%s/fake.gguf", tmp);
    f = fopen(to, "wb");
    fputs("GGUF\3\0\0\0", f);
    fclose(f);
    expect_drafter_error(to, e2b, G4_ERR_UNSUPPORTED, "GGUF drafters are not supported");
    g4_model_writer w;
    g4_error err = {0};
    char in[1100], out[1100];
    fixture_dir("dense-mini", in, sizeof in);
    strncat(in, "/assistant", sizeof in - strlen(in) - 1);
    snprintf(out, sizeof out, "%s/gguf-drafter", tmp);
    assert_int_equal(g4_writer_open("gguf-q8_0", out, NULL, &w, &err), G4_OK);
    assert_int_not_equal(g4_convert(in, &w, 1, &err), G4_OK);
    assert_non_null(strstr(err.message, "drafter"));
    g4_model_free(e2b);
    g4_model_free(dense);
}

int main(void) {
    test_tmpdir(tmp, sizeof tmp, "drafter-formats");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_load_and_draft),
        cmocka_unit_test(test_drafted_equals_plain),
        cmocka_unit_test(test_bad_drafters),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) return 1;
    }
    return rc;
}
