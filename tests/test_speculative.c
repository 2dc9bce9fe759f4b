/* Speculative decoding is lossless: drafted greedy output equals plain greedy output, token for
 * token and logit for logit, across many sliding-window wraps; seeded speculative sampling leaves
 * the output distribution unchanged; bad drafters are refused with clear errors. */
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>

#include "g4.h"
#include "g4_sample.h"
#include "test_util.h"

static const char *drafter_models[] = {"e2b-mini", "dense-mini", "unified-mini"};

typedef struct {
    int32_t *tokens;
    float *logits;
    int n, cap, V;
} token_log;

static int log_token(void *user, int32_t tok, const float *logits, int n_vocab) {
    token_log *l = user;
    assert_true(l->n < l->cap);
    l->tokens[l->n] = tok;
    if (l->logits) memcpy(l->logits + (size_t)l->n * n_vocab, logits, sizeof(float) * n_vocab);
    l->n++;
    return 0;
}

/* no_logits: the callback gets NULL (tokens only) */
static int log_token_only(void *user, int32_t tok, const float *logits, int n_vocab) {
    (void)n_vocab;
    token_log *l = user;
    assert_null(logits);
    assert_true(l->n < l->cap);
    l->tokens[l->n++] = tok;
    return 0;
}

static void load(const char *name, g4_model **m, g4_drafter **d) {
    char rel[256], path[1024];
    g4_error err = {0};
    snprintf(rel, sizeof rel, "gemma4/%s", name);
    if (g4_model_load(test_fixture_path(path, sizeof path, rel), NULL, m, &err)) fail_msg("%s", err.message);
    snprintf(rel, sizeof rel, "gemma4/%s/assistant", name);
    if (d && g4_drafter_load(test_fixture_path(path, sizeof path, rel), *m, d, &err)) fail_msg("%s", err.message);
}

/* G4_TEST_SCALE (default 1) divides the generated length, for the sanitizer pass. */
static int scaled(int n) {
    const char *s = getenv("G4_TEST_SCALE");
    int k = s ? atoi(s) : 1;
    return k > 1 ? n / k : n;
}

static void run(g4_session *s, const int32_t *prompt, int n_prompt, const g4_generate_options *base, token_log *log,
                g4_generate_stats *stats) {
    g4_generate_options o = *base;
    o.on_token = log_token;
    o.user = log;
    log->n = 0;
    g4_error err = {0};
    g4_session_reset(s);
    if (g4_generate(s, prompt, n_prompt, &o, stats, &err)) fail_msg("%s", err.message);
}

static void release(token_log *a, token_log *b, g4_session *s, g4_drafter *d, g4_model *m) {
    free(a->tokens);
    free(a->logits);
    free(b->tokens);
    free(b->logits);
    g4_session_free(s);
    g4_drafter_free(d);
    g4_model_free(m);
}

/* One drafted generation (k drafts per round; mode 0 the drafter's own drafts, 1 / 2 oracle drafts
 * right with probability 0.6 / 0.95) against the plain one: the same tokens and logits. */
static g4_generate_stats drafted_equals_plain(g4_session *s, g4_drafter *d, const int32_t *prompt, int n_prompt, int k, int mode,
                                              uint64_t seed, const token_log *plain, token_log *spec, const char *what) {
    g4_generate_options od = {.max_new = plain->cap, .drafter = d, .draft_k = k, .draft_fixed = 1};
    if (mode) {
        od.oracle = plain->tokens;
        od.n_oracle = plain->n;
        od.oracle_alpha = mode == 1 ? 0.6 : 0.95;
        od.oracle_seed = seed;
    }
    g4_generate_stats gs;
    run(s, prompt, n_prompt, &od, spec, &gs);
    if (spec->n != plain->n || memcmp(spec->tokens, plain->tokens, sizeof(int32_t) * plain->n))
        fail_msg("%s k %d mode %d: tokens differ", what, k, mode);
    if (memcmp(spec->logits, plain->logits, sizeof(float) * (size_t)plain->n * plain->V))
        fail_msg("%s k %d mode %d: logits differ", what, k, mode);
    return gs;
}

static void test_lossless_greedy(void **state) {
    (void)state;
    const int n_gen = scaled(512), n_prompts = 20;
    for (size_t mi = 0; mi < sizeof drafter_models / sizeof *drafter_models; mi++) {
        g4_model *m;
        g4_drafter *d;
        load(drafter_models[mi], &m, &d);
        g4_session *s = NULL;
        g4_error err = {0};
        assert_int_equal(g4_session_create(m, &(g4_session_options){.n_ctx = 640, .n_threads = 1}, &s, &err), G4_OK);
        int V = 512;
        token_log plain = {malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
        token_log spec = {malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
        long accepted = 0, drafted = 0;
        uint64_t rng = 12345 + mi;
        for (int pi = 0; pi < n_prompts; pi++) {
            int32_t prompt[64];
            int n_prompt = 1 + pi * 3; /* 1 .. 58 tokens */
            prompt[0] = 2;
            for (int i = 1; i < n_prompt; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                prompt[i] = (int32_t)(5 + (rng >> 33) % 500);
            }
            g4_generate_options o = {.max_new = n_gen};
            run(s, prompt, n_prompt, &o, &plain, NULL);
            assert_int_equal(plain.n, n_gen);
            /* every k, with the real drafter or with oracle drafts (right with probability alpha) so
             * that acceptance, partial commits and window wraps inside a verify block all happen */
            for (int k = 1; k <= 6; k++) {
                int mode = (pi + k) % 3;
                    char what[96];
                    snprintf(what, sizeof what, "%s prompt %d", drafter_models[mi], pi);
                    g4_generate_stats gs =
                        drafted_equals_plain(s, d, prompt, n_prompt, k, mode, (uint64_t)(pi * 7 + k), &plain, &spec, what);
                    accepted += gs.accepted;
                    drafted += gs.drafted;
                    if (mode == 2) assert_true(gs.accepted > gs.drafted / 2);
                }
        }
        /* adaptive k and a stop token inside drafts */
        g4_generate_options od = {.max_new = n_gen, .drafter = d, .draft_k = 6, .oracle = plain.tokens,
                                  .n_oracle = plain.n, .oracle_alpha = 0.8};
        int32_t prompt1[1] = {2};
        g4_generate_options o = {.max_new = n_gen};
        run(s, prompt1, 1, &o, &plain, NULL);
        od.oracle = plain.tokens;
        run(s, prompt1, 1, &od, &spec, NULL);
        assert_memory_equal(spec.tokens, plain.tokens, sizeof(int32_t) * plain.n);
        int32_t stop = plain.tokens[n_gen / 3];
        int first = 0;
        while (plain.tokens[first] != stop) first++;
        od.stop_tokens = o.stop_tokens = &stop;
        od.n_stop = o.n_stop = 1;
        run(s, prompt1, 1, &od, &spec, NULL);
        int pos_spec = g4_session_pos(s);
        assert_int_equal(spec.n, first + 1);
        run(s, prompt1, 1, &o, &plain, NULL);
        assert_int_equal(plain.n, first + 1);
        assert_int_equal(g4_session_pos(s), pos_spec); /* the cache holds the same tokens */
        printf("%s: %ld of %ld drafts accepted over all runs\n", drafter_models[mi], accepted, drafted);
        release(&plain, &spec, s, d, m);
    }
}

/* With the bf16 KV cache (the drafter then reads the target's bf16 rows too): drafted == plain,
 * tokens and logits, across window wraps, every k, oracle drafts accepted and rejected. */
static void test_lossless_bf16_kv(void **state) {
    (void)state;
    const int n_gen = scaled(300), V = 512;
    for (size_t mi = 0; mi < 2; mi++) {
        g4_model *m;
        g4_drafter *d;
        load(drafter_models[mi], &m, &d);
        g4_session *s = NULL;
        g4_error err = {0};
        assert_int_equal(g4_session_create(m, &(g4_session_options){.n_ctx = 400, .n_threads = 2, .kv_type = G4_KV_BF16}, &s, &err),
                         G4_OK);
        token_log plain = {malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
        token_log spec = {malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
        int32_t prompt[20];
        prompt[0] = 2;
        for (int i = 1; i < 20; i++) prompt[i] = 5 + (i * 37) % 500;
        g4_generate_options o = {.max_new = n_gen};
        run(s, prompt, 20, &o, &plain, NULL);
        assert_int_equal(plain.n, n_gen);
        long accepted = 0;
        for (int k = 1; k <= 5; k++)
            for (int mode = 0; mode < 3; mode++) {
                char what[96];
                snprintf(what, sizeof what, "%s bf16 KV", drafter_models[mi]);
                accepted += drafted_equals_plain(s, d, prompt, 20, k, mode, (uint64_t)(k * 3 + mode), &plain, &spec, what).accepted;
            }
        assert_true(accepted > 0);
        release(&plain, &spec, s, d, m);
    }
}

/* Two-sample chi-square homogeneity statistic over the bins where both samples together have at
 * least 10 draws (the rest pooled into one bin); returns the statistic and degrees of freedom. */
static double chi2_two_sample(const int *a, const int *b, int bins, int na, int nb, int *dof) {
    double stat = 0, ra = 0, rb = 0;
    int used = 0;
    for (int i = 0; i <= bins; i++) {
        double x, y;
        if (i < bins) {
            if (a[i] + b[i] < 10) {
                ra += a[i];
                rb += b[i];
                continue;
            }
            x = a[i];
            y = b[i];
        } else {
            if (ra + rb == 0) break;
            x = ra;
            y = rb;
        }
        double tot = x + y, ea = tot * na / (na + nb), eb = tot * nb / (na + nb);
        stat += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
        used++;
    }
    *dof = used - 1;
    return stat;
}

/* Upper-tail critical value of chi-square at significance 0.001 (Wilson-Hilferty). */
static double chi2_critical_001(int dof) {
    double z = 3.090232, k = dof;
    double t = 1 - 2 / (9 * k) + z * sqrt(2 / (9 * k));
    return k * t * t * t;
}

static void test_speculative_sampling_distribution(void **state) {
    (void)state;
    g4_model *m;
    g4_drafter *d;
    load("e2b-mini", &m, &d);
    g4_session *s = NULL;
    g4_error err = {0};
    assert_int_equal(g4_session_create(m, &(g4_session_options){.n_ctx = 64, .n_threads = 1}, &s, &err), G4_OK);
    const int V = 512, n_gen = 4, runs = scaled(3000);
    int *plain_hist = calloc((size_t)n_gen * V, sizeof(int)), *spec_hist = calloc((size_t)n_gen * V, sizeof(int));
    int32_t prompt[5] = {2, 176, 417, 58, 448};
    int32_t toks[8];
    token_log log = {toks, NULL, 0, 8, V};
    long drafted = 0, accepted = 0;
    for (int mode = 0; mode < 2; mode++)
        for (int r = 0; r < runs; r++) {
            g4_sampler_options so = g4_sampler_default_options();
            so.temperature = 4.0f; /* the tiny models' logits are decisive: spread them out */
            so.top_k = 40;
            so.seed = (uint64_t)r * 2 + (uint64_t)mode * 1000003;
            g4_sampler *smp;
            assert_int_equal(g4_sampler_create(&so, V, &smp, &err), G4_OK);
            g4_generate_options o = {.max_new = n_gen, .sampler = smp};
            if (mode) {
                o.drafter = d;
                o.draft_k = 3;
                o.draft_fixed = 1;
            }
            g4_generate_stats gs;
            run(s, prompt, 5, &o, &log, &gs);
            assert_int_equal(log.n, n_gen);
            for (int i = 0; i < n_gen; i++) (mode ? spec_hist : plain_hist)[i * V + toks[i]]++;
            drafted += gs.drafted;
            accepted += gs.accepted;
            g4_sampler_free(smp);
        }
    assert_true(accepted > 0 && accepted < drafted); /* both acceptance and rejection were exercised */
    for (int i = 0; i < n_gen; i++) {
        int dof;
        double stat = chi2_two_sample(plain_hist + i * V, spec_hist + i * V, V, runs, runs, &dof);
        double crit = chi2_critical_001(dof > 0 ? dof : 1);
        printf("token %d: chi2 %.1f, dof %d, critical (p = 0.001) %.1f\n", i, stat, dof, crit);
        if (dof > 0 && stat > crit) fail_msg("token %d: drafted distribution differs (chi2 %.1f > %.1f)", i, stat, crit);
    }
    printf("speculative sampling: %ld of %ld drafts accepted\n", accepted, drafted);
    free(plain_hist);
    free(spec_hist);
    g4_session_free(s);
    g4_drafter_free(d);
    g4_model_free(m);
}

/* g4_generate_options.no_logits: the same tokens, plain and drafted, and no logits to the callback */
static void test_no_logits(void **state) {
    (void)state;
    const int n_gen = 64;
    g4_model *m;
    g4_drafter *d;
    load("e2b-mini", &m, &d);
    g4_session *s = NULL;
    g4_error err = {0};
    assert_int_equal(g4_session_create(m, &(g4_session_options){.n_ctx = 128, .n_threads = 1}, &s, &err), G4_OK);
    const int32_t prompt[4] = {2, 17, 99, 300};
    token_log plain = {malloc(sizeof(int32_t) * n_gen), NULL, 0, n_gen, 0};
    token_log ids = {malloc(sizeof(int32_t) * n_gen), NULL, 0, n_gen, 0};
    run(s, prompt, 4, &(g4_generate_options){.max_new = n_gen}, &plain, NULL);
    for (int k = 0; k <= 4; k++) {
        g4_generate_options o = {.max_new = n_gen, .drafter = k ? d : NULL, .draft_k = k, .draft_fixed = 1,
                                 .on_token = log_token_only, .user = &ids, .no_logits = 1};
        ids.n = 0;
        g4_session_reset(s);
        assert_int_equal(g4_generate(s, prompt, 4, &o, NULL, &err), G4_OK);
        assert_int_equal(ids.n, plain.n);
        assert_memory_equal(ids.tokens, plain.tokens, sizeof(int32_t) * (size_t)plain.n);
    }
    free(plain.tokens);
    free(ids.tokens);
    g4_session_free(s);
    g4_drafter_free(d);
    g4_model_free(m);
}

static void test_bad_drafters(void **state) {
    (void)state;
    g4_model *e2b, *dense;
    load("e2b-mini", &e2b, NULL);
    load("dense-mini", &dense, NULL);
    char path[1024];
    g4_drafter *d = NULL;
    g4_error err = {0};
    /* a drafter for another target */
    assert_int_equal(g4_drafter_load(test_fixture_path(path, sizeof path, "gemma4/e2b-mini/assistant"), dense, &d, &err),
                     G4_ERR_CONFIG);
    assert_null(d);
    assert_non_null(strstr(err.message, "hidden size"));
    /* a target model directory is not a drafter */
    assert_int_equal(g4_drafter_load(test_fixture_path(path, sizeof path, "gemma4/e2b-mini"), e2b, &d, &err),
                     G4_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "not a Gemma 4 drafter"));
    /* a truncated drafter file */
    char tmp[512], file[1024], cmd[4096];
    test_tmpdir(tmp, sizeof tmp, "drafter");
    snprintf(cmd, sizeof cmd, "cp '%s/gemma4/e2b-mini/assistant/config.json' '%.400s/' && head -c 5000 '%s/gemma4/e2b-mini/assistant/model.safetensors' > '%.400s/model.safetensors'",
             test_fixtures_dir(), tmp, test_fixtures_dir(), tmp);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(g4_drafter_load(tmp, e2b, &d, &err), G4_ERR_FORMAT);
    snprintf(file, sizeof file, "%.400s/model.safetensors", tmp);
    assert_non_null(strstr(err.message, file));
    /* the wrong model at generation time */
    assert_int_equal(g4_drafter_load(test_fixture_path(path, sizeof path, "gemma4/dense-mini/assistant"), dense, &d, &err), G4_OK);
    g4_session *s;
    assert_int_equal(g4_session_create(e2b, &(g4_session_options){.n_ctx = 32}, &s, &err), G4_OK);
    int32_t p[1] = {2};
    g4_generate_options o = {.max_new = 4, .drafter = d};
    assert_int_equal(g4_generate(s, p, 1, &o, NULL, &err), G4_ERR_ARG);
    g4_session_free(s);
    g4_drafter_free(d);
    snprintf(cmd, sizeof cmd, "rm -rf '%.900s'", tmp);
    assert_int_equal(system(cmd), 0);
    g4_model_free(e2b);
    g4_model_free(dense);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_drafters),
        cmocka_unit_test(test_no_logits),
        cmocka_unit_test(test_lossless_greedy),
        cmocka_unit_test(test_lossless_bf16_kv),
        cmocka_unit_test(test_speculative_sampling_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
