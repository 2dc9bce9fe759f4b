/* Sampler and stop-string matcher: exact filter results on hand-computed distributions, a
 * double-precision sort-based reference on larger random vocabularies, chi-square frequency
 * checks, seeded reproducibility, and stop strings across every chunking of a text. */
#include <float.h>
#include <math.h>

#include "test_util.h"

#include "g4_sample.h"
#include "runtime/sampler_internal.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static g4_sampler *make_sampler(g4_sampler_options o, int n_vocab) {
    g4_sampler *s = NULL;
    g4_error err = {0};
    g4_status st = g4_sampler_create(&o, n_vocab, &s, &err);
    if (st != G4_OK) fail_msg("g4_sampler_create: %s", err.message);
    return s;
}

static g4_sampler_options opts_t(float t) {
    g4_sampler_options o = g4_sampler_default_options();
    o.temperature = t;
    return o;
}

static void get_probs(g4_sampler *s, const float *logits, int n, float *probs) {
    g4_error err = {0};
    if (g4_sampler_probs(s, logits, n, probs, &err) != G4_OK)
        fail_msg("g4_sampler_probs: %s", err.message);
}

static int32_t draw(g4_sampler *s, const float *logits, int n) {
    g4_error err = {0};
    int32_t tok = -1;
    if (g4_sampler_sample(s, logits, n, &tok, &err) != G4_OK)
        fail_msg("g4_sampler_sample: %s", err.message);
    return tok;
}

/* A test-local generator (independent of the sampler's) for building random logits. Each test
 * seeds it, so its data does not depend on which tests ran before. */
static uint64_t test_rng = 88172645463325252ull;
static void test_seed(uint64_t seed) {
    test_rng = 88172645463325252ull ^ (seed * 0x9e3779b97f4a7c15ull);
}
static double test_uniform(void) {
    test_rng ^= test_rng << 13;
    test_rng ^= test_rng >> 7;
    test_rng ^= test_rng << 17;
    return (double)(test_rng >> 11) * 0x1p-53;
}
static double test_normal(void) {
    double u = test_uniform(), v = test_uniform();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void assert_close(double got, double want, double tol, const char *what) {
    if (!(fabs(got - want) <= tol))
        fail_msg("%s: got %.9g, want %.9g (tolerance %g)", what, got, want, tol);
}

/* ---- options ----------------------------------------------------------------------------- */

static void expect_bad_option(g4_sampler_options o, const char *field) {
    g4_sampler *s = (g4_sampler *)0x1;
    g4_error err = {0};
    g4_status st = g4_sampler_create(&o, 100, &s, &err);
    assert_int_equal(st, G4_ERR_ARG);
    assert_int_equal(err.code, G4_ERR_ARG);
    assert_null(s);
    if (!strstr(err.message, field))
        fail_msg("message \"%s\" does not name %s", err.message, field);
}

static void test_option_validation(void **state) {
    (void)state;
    g4_sampler_options o;
#define BAD(field, value)                                                                          \
    o = g4_sampler_default_options();                                                              \
    o.field = value;                                                                               \
    expect_bad_option(o, #field)
    BAD(temperature, -0.5f);
    BAD(temperature, NAN);
    BAD(temperature, INFINITY);
    BAD(top_k, -1);
    BAD(top_p, 0.0f);
    BAD(top_p, -0.1f);
    BAD(top_p, 1.01f);
    BAD(top_p, NAN);
    BAD(min_p, -0.01f);
    BAD(min_p, 1.5f);
    BAD(min_p, NAN);
    BAD(repetition_penalty, 0.0f);
    BAD(repetition_penalty, -1.0f);
    BAD(repetition_penalty, INFINITY);
    BAD(presence_penalty, NAN);
    BAD(presence_penalty, -INFINITY);
    BAD(penalty_last_n, -1);
    BAD(penalty_last_n, (1 << 24) + 1);
#undef BAD
    /* The documented edges are accepted. */
    o = g4_sampler_default_options();
    o.temperature = 0.0f;
    o.top_p = 1.0f;
    o.min_p = 1.0f;
    o.presence_penalty = -2.0f;
    o.penalty_last_n = 0;
    g4_sampler_free(make_sampler(o, 10));

    g4_sampler *s = NULL;
    g4_error err = {0};
    o = g4_sampler_default_options();
    assert_int_equal(g4_sampler_create(&o, 0, &s, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "n_vocab"));
    assert_int_equal(g4_sampler_create(NULL, 10, &s, &err), G4_ERR_ARG);
}

static void test_bad_inputs(void **state) {
    (void)state;
    g4_sampler *s = make_sampler(opts_t(1.0f), 8);
    float l[8] = {0, 1, 2, 3, 4, 5, 6, 7}, probs[8];
    int32_t tok;
    g4_error err = {0};
    assert_int_equal(g4_sampler_sample(s, l, 7, &tok, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "n_vocab"));
    l[5] = NAN;
    assert_int_equal(g4_sampler_sample(s, l, 8, &tok, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "logit 5 is NaN"));
    l[5] = INFINITY;
    assert_int_equal(g4_sampler_probs(s, l, 8, probs, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "logit 5 is +inf"));
    for (int i = 0; i < 8; i++) l[i] = -INFINITY;
    assert_int_equal(g4_sampler_sample(s, l, 8, &tok, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "-inf"));
    /* -inf bans a token; the rest still works. */
    l[3] = 0.0f;
    l[6] = 0.0f;
    get_probs(s, l, 8, probs);
    for (int i = 0; i < 8; i++) assert_true(probs[i] == (i == 3 || i == 6 ? 0.5f : 0.0f));
    assert_int_equal(g4_sampler_accept(s, 8, &err), G4_ERR_ARG);
    assert_int_equal(g4_sampler_accept(s, -1, &err), G4_ERR_ARG);
    assert_int_equal(g4_sampler_accept(s, 7, &err), G4_OK);
    g4_sampler_free(s);
}

/* ---- greedy ------------------------------------------------------------------------------ */

static void test_greedy(void **state) {
    (void)state;
    enum { V = 37 }; /* two full vectors and a tail */
    float l[V], probs[V];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 7) - 3.0f;
    g4_sampler *s = make_sampler(opts_t(0.0f), V);

    l[20] = 9.0f;
    assert_int_equal(draw(s, l, V), 20);
    l[5] = 9.0f;
    l[33] = 9.0f;
    assert_int_equal(draw(s, l, V), 5); /* three-way tie: lowest index */
    l[0] = 9.0f;
    l[16] = 9.0f;
    assert_int_equal(draw(s, l, V), 0);
    for (int i = 0; i < V; i++) l[i] = -1.0f;
    l[36] = 0.0f; /* only in the scalar tail */
    assert_int_equal(draw(s, l, V), 36);
    l[17] = 0.0f;
    assert_int_equal(draw(s, l, V), 17);
    get_probs(s, l, V, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 17 ? 1.0f : 0.0f));
    /* Greedy never touches the generator. */
    double u = g4_sampler_uniform(s);
    g4_sampler_reset(s);
    assert_true(g4_sampler_uniform(s) == u);
    g4_sampler_free(s);
}

/* ---- each stage on a known distribution --------------------------------------------------- */

static void test_temperature(void **state) {
    (void)state;
    const float l[5] = {1.0f, 2.0f, 3.0f, 0.5f, -1.0f};
    const float temps[3] = {1.0f, 0.5f, 2.0f};
    for (int t = 0; t < 3; t++) {
        g4_sampler *s = make_sampler(opts_t(temps[t]), 5);
        float probs[5];
        get_probs(s, l, 5, probs);
        double z = 0.0, want[5];
        for (int i = 0; i < 5; i++) z += want[i] = exp(l[i] / temps[t]);
        for (int i = 0; i < 5; i++) assert_close(probs[i], want[i] / z, 1e-6, "softmax(l / T)");
        g4_sampler_free(s);
    }
    /* T = 0.5 by hand for the top two of {1, 2, 3}: e^6 / (e^2 + e^4 + e^6 + ...). */
    g4_sampler *s = make_sampler(opts_t(0.5f), 3);
    float probs[3];
    const float l3[3] = {1.0f, 2.0f, 3.0f};
    get_probs(s, l3, 3, probs);
    assert_close(probs[2], 0.8668133, 1e-6, "T=0.5 top");
    assert_close(probs[1], 0.1173104, 1e-6, "T=0.5 second");
    assert_close(probs[0], 0.0158762, 1e-6, "T=0.5 third");
    g4_sampler_free(s);
}

static void test_top_k(void **state) {
    (void)state;
    const float l[4] = {1.0f, 3.0f, 2.0f, 0.0f};
    g4_sampler_options o = opts_t(1.0f);
    o.top_k = 2;
    g4_sampler *s = make_sampler(o, 4);
    float probs[4];
    get_probs(s, l, 4, probs);
    /* e^3 / (e^3 + e^2) = 1 / (1 + e^-1) */
    assert_close(probs[1], 0.7310586, 1e-6, "top-k 2: best");
    assert_close(probs[2], 0.2689414, 1e-6, "top-k 2: second");
    assert_true(probs[0] == 0.0f && probs[3] == 0.0f);
    g4_sampler_free(s);

    /* Ties at the cut go to the lower index. */
    const float tied[6] = {2.0f, 5.0f, 1.0f, 5.0f, 5.0f, 5.0f};
    o.top_k = 2;
    s = make_sampler(o, 6);
    float p6[6];
    get_probs(s, tied, 6, p6);
    for (int i = 0; i < 6; i++) assert_true(p6[i] == (i == 1 || i == 3 ? 0.5f : 0.0f));
    g4_sampler_free(s);

    /* k >= vocabulary size is off. */
    o.top_k = 4;
    s = make_sampler(o, 4);
    get_probs(s, l, 4, probs);
    for (int i = 0; i < 4; i++) assert_true(probs[i] > 0.0f);
    g4_sampler_free(s);
}

/* p = {0.5, 0.3, 0.15, 0.05} placed out of index order so ranking is by value. */
static const int P4_ORDER[4] = {1, 3, 0, 2}; /* index of the 1st, 2nd, 3rd, 4th most likely */
static void p4_logits(float l[4]) {
    const double p[4] = {0.5, 0.3, 0.15, 0.05};
    for (int r = 0; r < 4; r++) l[P4_ORDER[r]] = (float)(log(p[r]) + 2.0); /* shift is harmless */
}

static void expect_p4(g4_sampler_options o, const double want_by_rank[4], const char *what) {
    float l[4], probs[4];
    p4_logits(l);
    g4_sampler *s = make_sampler(o, 4);
    get_probs(s, l, 4, probs);
    for (int r = 0; r < 4; r++) {
        if (want_by_rank[r] == 0.0 && probs[P4_ORDER[r]] != 0.0f)
            fail_msg("%s: rank %d should be filtered, has %g", what, r, (double)probs[P4_ORDER[r]]);
        assert_close(probs[P4_ORDER[r]], want_by_rank[r], 2e-6, what);
    }
    g4_sampler_free(s);
}

static void test_top_p(void **state) {
    (void)state;
    g4_sampler_options o = opts_t(1.0f);
    o.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8: two tokens */
    expect_p4(o, (const double[4]){0.625, 0.375, 0, 0}, "top-p 0.7");
    o.top_p = 0.9f; /* 0.8 < 0.9 <= 0.95 */
    expect_p4(o, (const double[4]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, "top-p 0.9");
    o.top_p = 0.4f;
    expect_p4(o, (const double[4]){1, 0, 0, 0}, "top-p 0.4");
    o.top_p = 1.0f;
    expect_p4(o, (const double[4]){0.5, 0.3, 0.15, 0.05}, "top-p 1 (off)");
    o.top_p = 0.82f; /* 0.8 < 0.82: three tokens without top-k ... */
    expect_p4(o, (const double[4]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, "top-p 0.82");
    o.top_k = 3; /* ... but after top-k renormalises, 0.8 / 0.95 = 0.842 reaches 0.82 */
    expect_p4(o, (const double[4]){0.625, 0.375, 0, 0}, "top-k 3 then top-p 0.82");
    /* Temperature comes before top-p: at T = 2 the weights are sqrt(p) (0.707, 0.548, 0.387,
     * 0.224 of 1.866), the top two hold 0.673 < 0.7, so 0.7 now needs a third token. */
    o = opts_t(2.0f);
    o.top_p = 0.7f;
    const double sq[4] = {sqrt(0.5), sqrt(0.3), sqrt(0.15), sqrt(0.05)};
    const double z3 = sq[0] + sq[1] + sq[2];
    expect_p4(o, (const double[4]){sq[0] / z3, sq[1] / z3, sq[2] / z3, 0}, "T 2 then top-p 0.7");
}

static void test_min_p(void **state) {
    (void)state;
    g4_sampler_options o = opts_t(1.0f);
    o.min_p = 0.2f; /* keep p >= 0.1 */
    expect_p4(o, (const double[4]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, "min-p 0.2");
    o.min_p = 0.5f; /* keep p >= 0.25 */
    expect_p4(o, (const double[4]){0.625, 0.375, 0, 0}, "min-p 0.5");
    o.min_p = 1.0f;
    expect_p4(o, (const double[4]){1, 0, 0, 0}, "min-p 1");
    /* After temperature 2 the weights relative to the top are sqrt(p / 0.5): 0.316 for the
     * last token, so min-p 0.25 keeps everything. */
    o = opts_t(2.0f);
    o.min_p = 0.25f;
    const double sq[4] = {sqrt(0.5), sqrt(0.3), sqrt(0.15), sqrt(0.05)};
    const double z = sq[0] + sq[1] + sq[2] + sq[3];
    expect_p4(o, (const double[4]){sq[0] / z, sq[1] / z, sq[2] / z, sq[3] / z}, "T 2, min-p 0.25");
    /* Both orders of top-p and min-p: the stricter wins. */
    o = opts_t(1.0f);
    o.top_p = 0.7f;
    o.min_p = 0.2f;
    expect_p4(o, (const double[4]){0.625, 0.375, 0, 0}, "top-p 0.7 + min-p 0.2");
    o.top_p = 0.9f;
    o.min_p = 0.5f;
    expect_p4(o, (const double[4]){0.625, 0.375, 0, 0}, "top-p 0.9 + min-p 0.5");
    o.top_k = 3;
    o.top_p = 0.99f;
    o.min_p = 0.05f;
    expect_p4(o, (const double[4]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0},
              "k 3 + p .99 + min .05");
}

static void test_penalties(void **state) {
    (void)state;
    enum { V = 6 };
    const float l[V] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f, 0.0f};
    float out[V];
    g4_error err = {0};
    g4_sampler_options o = opts_t(1.0f);
    o.repetition_penalty = 2.0f;
    o.presence_penalty = 0.5f;
    o.penalty_last_n = 3;
    g4_sampler *s = make_sampler(o, V);

    assert_int_equal(g4_sampler_apply_penalties(s, l, V, out, &err), G4_OK);
    assert_memory_equal(out, l, sizeof l); /* empty history */

    assert_int_equal(g4_sampler_accept(s, 0, &err), G4_OK);
    assert_int_equal(g4_sampler_accept(s, 1, &err), G4_OK);
    assert_int_equal(g4_sampler_accept(s, 1, &err), G4_OK); /* a repeat is penalised once */
    assert_int_equal(g4_sampler_apply_penalties(s, l, V, out, &err), G4_OK);
    const float want1[V] = {2.0f / 2 - 0.5f, -2.0f * 2 - 0.5f, 1.0f, 0.5f, 3.0f, 0.0f};
    for (int i = 0; i < V; i++) assert_true(out[i] == want1[i]);

    /* The window holds the last 3: {1, 1, 5}; token 0 falls out. 0 * 2 stays 0. */
    assert_int_equal(g4_sampler_accept(s, 5, &err), G4_OK);
    assert_int_equal(g4_sampler_apply_penalties(s, l, V, out, &err), G4_OK);
    const float want2[V] = {2.0f, -4.5f, 1.0f, 0.5f, 3.0f, -0.5f};
    for (int i = 0; i < V; i++) assert_true(out[i] == want2[i]);

    /* The sampled distribution is softmax of the penalised logits. */
    float probs[V];
    get_probs(s, l, V, probs);
    double z = 0.0;
    for (int i = 0; i < V; i++) z += exp(want2[i]);
    for (int i = 0; i < V; i++) assert_close(probs[i], exp(want2[i]) / z, 1e-6, "penalised p");

    g4_sampler_reset(s);
    assert_int_equal(g4_sampler_apply_penalties(s, l, V, out, &err), G4_OK);
    assert_memory_equal(out, l, sizeof l);
    g4_sampler_free(s);

    /* Each penalty alone. */
    o.presence_penalty = 0.0f;
    s = make_sampler(o, V);
    assert_int_equal(g4_sampler_accept(s, 4, &err), G4_OK);
    assert_int_equal(g4_sampler_accept(s, 1, &err), G4_OK);
    assert_int_equal(g4_sampler_apply_penalties(s, l, V, out, &err), G4_OK);
    assert_true(out[4] == 1.5f && out[1] == -4.0f && out[0] == 2.0f);
    g4_sampler_free(s);
    o.repetition_penalty = 1.0f;
    o.presence_penalty = -1.25f; /* negative encourages */
    s = make_sampler(o, V);
    assert_int_equal(g4_sampler_accept(s, 2, &err), G4_OK);
    assert_int_equal(g4_sampler_apply_penalties(s, l, V, out, &err), G4_OK);
    assert_true(out[2] == 2.25f && out[3] == 0.5f);
    g4_sampler_free(s);

    /* Penalties steer greedy decoding. */
    o = opts_t(0.0f);
    o.repetition_penalty = 1.5f;
    s = make_sampler(o, 2);
    const float close[2] = {3.0f, 2.5f};
    assert_int_equal(draw(s, close, 2), 0);
    assert_int_equal(g4_sampler_accept(s, 0, &err), G4_OK);
    assert_int_equal(draw(s, close, 2), 1); /* 3 / 1.5 = 2 < 2.5 */
    g4_sampler_free(s);
}

/* ---- the caller's logits stay untouched ------------------------------------------------- */

static void test_logits_untouched(void **state) {
    (void)state;
    test_seed(1);
    enum { V = 1000 };
    float l[V], copy[V], probs[V];
    for (int i = 0; i < V; i++) l[i] = (float)(3.0 * test_normal());
    memcpy(copy, l, sizeof l);
    g4_sampler_options o = opts_t(0.8f);
    o.repetition_penalty = 1.3f;
    o.presence_penalty = 0.4f;
    const int top_ks[2] = {0, 20};
    for (int k = 0; k < 2; k++) {
        o.top_k = top_ks[k];
        o.top_p = k ? 0.9f : 1.0f;
        g4_sampler *s = make_sampler(o, V);
        for (int i = 0; i < 50; i++) {
            int32_t t = draw(s, l, V);
            assert_int_equal(g4_sampler_accept(s, t, NULL), G4_OK);
        }
        get_probs(s, l, V, probs);
        assert_memory_equal(l, copy, sizeof l);
        g4_sampler_free(s);
    }
}

/* ---- reproducibility ---------------------------------------------------------------------- */

static void sample_sequence(g4_sampler_options o, const float *l, int n, int32_t *out, int count) {
    g4_sampler *s = make_sampler(o, n);
    for (int i = 0; i < count; i++) {
        out[i] = draw(s, l, n);
        assert_int_equal(g4_sampler_accept(s, out[i], NULL), G4_OK);
    }
    g4_sampler_free(s);
}

static void test_seed_reproducible(void **state) {
    (void)state;
    test_seed(2);
    enum { V = 2000, N = 400 };
    static float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(2.0 * test_normal());
    g4_sampler_options configs[3] = {opts_t(1.0f), opts_t(0.9f), opts_t(1.2f)};
    configs[1].top_k = 40;
    configs[1].top_p = 0.95f;
    configs[2].min_p = 0.02f;
    configs[2].repetition_penalty = 1.1f;
    for (int c = 0; c < 3; c++) {
        static int32_t a[N], b[N], d[N];
        configs[c].seed = 1234;
        sample_sequence(configs[c], l, V, a, N);
        sample_sequence(configs[c], l, V, b, N);
        assert_memory_equal(a, b, sizeof a);
        configs[c].seed = 1235;
        sample_sequence(configs[c], l, V, d, N);
        int differ = 0;
        for (int i = 0; i < N; i++) differ += a[i] != d[i];
        if (differ < N / 4)
            fail_msg("config %d: seeds 1234 and 1235 agree on %d of %d", c, N - differ, N);
    }
    /* Reset replays the sequence. */
    g4_sampler_options o = opts_t(1.0f);
    o.seed = 99;
    g4_sampler *s = make_sampler(o, V);
    int32_t first[20];
    for (int i = 0; i < 20; i++) first[i] = draw(s, l, V);
    g4_sampler_reset(s);
    for (int i = 0; i < 20; i++) assert_int_equal(draw(s, l, V), first[i]);
    g4_sampler_free(s);
}

/* ---- frequencies -------------------------------------------------------------------------- */

/* Chi-square critical values at significance 0.001 by degrees of freedom (1..10). The draws are
 * seeded, so each test is deterministic; the bound says a correct sampler passes with
 * probability 0.999 over seeds. */
static const double CHI2_CRIT_001[11] = {0,      10.828, 13.816, 16.266, 18.467, 20.515,
                                         22.458, 24.322, 26.124, 27.877, 29.588};

/* Draws `draws` tokens and checks bin frequencies (bin_of maps a token to its bin) against
 * expected bin probabilities. */
static void chi_square_check(g4_sampler *s, const float *l, int n, int draws, int n_bins,
                             const double *expect, int (*bin_of)(int), const char *what) {
    long counts[16] = {0};
    for (int i = 0; i < draws; i++) {
        int32_t t = draw(s, l, n);
        int b = bin_of(t);
        if (expect[b] == 0.0) fail_msg("%s: drew token %d from an empty bin", what, (int)t);
        counts[b]++;
    }
    double chi2 = 0.0;
    int df = -1;
    for (int b = 0; b < n_bins; b++) {
        if (expect[b] == 0.0) continue;
        double e = expect[b] * draws;
        chi2 += (counts[b] - e) * (counts[b] - e) / e;
        df++;
    }
    print_message("%s: chi2 = %.3f with %d degrees of freedom (critical %.3f at 0.001)\n", what,
                  chi2, df, CHI2_CRIT_001[df]);
    if (!(chi2 < CHI2_CRIT_001[df]))
        fail_msg("%s: chi2 %.3f exceeds %.3f", what, chi2, CHI2_CRIT_001[df]);
}

static int bin_identity(int t) { return t; }

/* V = 1000: four heavy tokens get their own bins, the rest is binned by quarter. */
static int bin_v1000(int t) {
    switch (t) {
    case 7: return 0;
    case 700: return 1;
    case 500: return 2;
    case 999: return 3;
    default: return 4 + t / 250;
    }
}

static void test_frequencies(void **state) {
    (void)state;
    test_seed(3);
    /* Plain temperature 1 on a 6-token distribution. */
    const double p6[6] = {0.3, 0.25, 0.2, 0.15, 0.07, 0.03};
    float l6[6];
    for (int i = 0; i < 6; i++) l6[i] = (float)(log(p6[i]) + 1.7);
    g4_sampler_options o = opts_t(1.0f);
    o.seed = 7;
    g4_sampler *s = make_sampler(o, 6);
    chi_square_check(s, l6, 6, 100000, 6, p6, bin_identity, "T=1, 6 tokens");
    g4_sampler_free(s);

    /* Temperature 0.7 then top-k 4: p^(1/0.7) over the top four, renormalised. */
    o = opts_t(0.7f);
    o.top_k = 4;
    o.seed = 8;
    double e6[6] = {0}, z = 0.0;
    for (int i = 0; i < 4; i++) z += e6[i] = pow(p6[i], 1.0 / 0.7);
    for (int i = 0; i < 4; i++) e6[i] /= z;
    s = make_sampler(o, 6);
    chi_square_check(s, l6, 6, 100000, 6, e6, bin_identity, "T=0.7, top-k 4");
    g4_sampler_free(s);

    /* The full-vocabulary path (block sums, then one block) on V = 1000 (four blocks). */
    enum { V = 1000, DRAWS = 30000 };
    static float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(-3.0 * test_uniform());
    l[7] = 7.0f;
    l[700] = 6.5f;
    l[500] = 5.0f;
    l[999] = 6.0f;
    double ev[8] = {0}, zv = 0.0;
    for (int i = 0; i < V; i++) {
        double w = exp((double)l[i]);
        ev[bin_v1000(i)] += w;
        zv += w;
    }
    for (int b = 0; b < 8; b++) ev[b] /= zv;
    o = opts_t(1.0f);
    o.seed = 9;
    s = make_sampler(o, V);
    chi_square_check(s, l, V, DRAWS, 8, ev, bin_v1000, "T=1, V=1000");
    g4_sampler_free(s);

    /* Top-p 0.75 on the same logits: the heavy tokens (e^7, e^6.5, e^6, e^5) hold about 0.87
     * of the mass; the top two hold 0.66, the top three 0.81, so the nucleus is three tokens. */
    const double heavy[4] = {exp(7.0), exp(6.5), exp(6.0), exp(5.0)};
    double acc = 0.0, target = 0.75 * zv, ep[8] = {0};
    const int heavy_bin[4] = {0, 1, 3, 2};
    int kept = 0;
    for (int i = 0; i < 4 && acc < target; i++, kept++) acc += heavy[i];
    assert_int_equal(kept, 3);
    for (int i = 0; i < kept; i++) ep[heavy_bin[i]] = heavy[i] / acc;
    o.top_p = 0.75f;
    o.seed = 10;
    s = make_sampler(o, V);
    chi_square_check(s, l, V, DRAWS, 8, ep, bin_v1000, "top-p 0.75, V=1000");
    g4_sampler_free(s);
}

/* ---- against a sort-based double-precision reference ------------------------------------ */

static const float *ref_logits;
static int cmp_rank(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (ref_logits[i] != ref_logits[j]) return ref_logits[i] > ref_logits[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

/* The pipeline as the header describes it, written the obvious way. Returns the nucleus margin:
 * how far the kept prefix's cumulative mass is from the top-p target in relative terms (a tiny
 * margin means rounding may legitimately move the cut by one token); cut[0..1] get the last
 * token kept by top-p and the first one dropped. */
static double ref_probs(const float *l, int n, const g4_sampler_options *o, double *out, int *order,
                        int *cut) {
    for (int i = 0; i < n; i++) order[i] = i;
    ref_logits = l;
    qsort(order, (size_t)n, sizeof *order, cmp_rank);
    const double m = l[order[0]];
    for (int i = 0; i < n; i++) out[i] = 0.0;
    int keep = o->top_k > 0 && o->top_k < n ? o->top_k : n;
    double margin = INFINITY;
    if (o->top_p < 1.0f) {
        double mass = 0.0, acc = 0.0;
        for (int j = 0; j < keep; j++) mass += exp((l[order[j]] - m) / o->temperature);
        const double target = (double)o->top_p * mass;
        for (int j = 0; j < keep; j++) {
            double w = exp((l[order[j]] - m) / o->temperature);
            double before = acc;
            acc += w;
            if (acc >= target) {
                margin = fmin(acc - target, target - before) / target;
                keep = j + 1;
                cut[0] = order[j];
                cut[1] = j + 1 < n ? order[j + 1] : -1;
                break;
            }
        }
    }
    if (o->min_p > 0.0f) {
        int k = 0;
        while (k < keep && exp((l[order[k]] - m) / o->temperature) >= (double)o->min_p) k++;
        keep = k;
    }
    double z = 0.0;
    for (int j = 0; j < keep; j++) z += out[order[j]] = exp((l[order[j]] - m) / o->temperature);
    for (int j = 0; j < keep; j++) out[order[j]] /= z;
    return margin;
}

/* boundary_slack: the data puts the top-p cut within rounding of a token's mass (a wall of tiny
 * tied weights), so the two tokens either side of the cut may go either way. */
static void compare_with_reference_slack(const float *l, int n, g4_sampler_options o,
                                         const char *what, int boundary_slack) {
    float *probs = malloc((size_t)n * sizeof *probs);
    double *want = malloc((size_t)n * sizeof *want);
    int *order = malloc((size_t)n * sizeof *order);
    assert_true(probs && want && order);
    g4_sampler *s = make_sampler(o, n);
    get_probs(s, l, n, probs);
    int cut[2] = {-1, -1};
    double margin = ref_probs(l, n, &o, want, order, cut);
    int kept = 0, want_kept = 0;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        kept += probs[i] > 0.0f;
        want_kept += want[i] > 0.0;
        sum += probs[i];
        if (boundary_slack && (i == cut[0] || i == cut[1])) continue;
        if ((probs[i] > 0.0f) != (want[i] > 0.0))
            fail_msg("%s: token %d kept=%d, reference kept=%d (margin %g)", what, i,
                     probs[i] > 0.0f, want[i] > 0.0, margin);
        if (!(fabs(probs[i] - want[i]) <= 1e-6 + 1e-5 * want[i]))
            fail_msg("%s: token %d p=%.9g, reference %.9g", what, i, (double)probs[i], want[i]);
    }
    assert_close(sum, 1.0, 1e-4, what);
    if (margin < 1e-6 && !boundary_slack)
        fail_msg("%s: test data too close to the top-p cut (margin %g)", what, margin);
    if (abs(kept - want_kept) > (boundary_slack ? 1 : 0))
        fail_msg("%s: kept %d tokens, reference %d", what, kept, want_kept);
    /* Every draw lands on a kept token. */
    for (int i = 0; i < (n > 10000 ? 30 : 100); i++) {
        int32_t t = draw(s, l, n);
        if (!(probs[t] > 0.0f)) fail_msg("%s: drew filtered token %d", what, (int)t);
    }
    print_message("%s: %d tokens kept\n", what, kept);
    g4_sampler_free(s);
    free(probs);
    free(want);
    free(order);
}

static void compare_with_reference(const float *l, int n, g4_sampler_options o, const char *what) {
    compare_with_reference_slack(l, n, o, what, 0);
}

static void test_reference(void **state) {
    (void)state;
    test_seed(4);
    enum { V = 5000 }; /* not a multiple of 16, 64 or 256: every tail path runs */
    static float peaky[V], flat[V], one_top[V], tiny[5];
    for (int i = 0; i < V; i++) peaky[i] = (float)(3.0 * test_normal());
    for (int i = 0; i < V; i++) flat[i] = (float)(0.01 * test_uniform());
    for (int i = 0; i < V; i++) one_top[i] = 0.0f; /* a wall of ties behind one token */
    one_top[123] = 10.0f;
    for (int i = 0; i < 5; i++) tiny[i] = (float)test_normal();

    struct {
        float t, top_p, min_p;
        int top_k;
    } cfg[] = {
        {1.0f, 1.0f, 0.0f, 0},     {0.7f, 1.0f, 0.0f, 50},    {1.0f, 0.9f, 0.0f, 0},
        {1.3f, 0.5f, 0.01f, 0},    {1.0f, 0.95f, 0.05f, 200}, {1.0f, 1.0f, 0.1f, 0},
        {0.5f, 0.99f, 0.0f, 0},    {2.0f, 0.95f, 0.0f, 0},    {1.0f, 1.0f, 0.0f, 1},
        {1.0f, 1.0f, 0.02f, 1000}, {1.5f, 0.8f, 0.0f, 4999},
    };
    char what[160];
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        g4_sampler_options o = opts_t(cfg[c].t);
        o.top_p = cfg[c].top_p;
        o.min_p = cfg[c].min_p;
        o.top_k = cfg[c].top_k;
        o.seed = c;
        snprintf(what, sizeof what, "T %.2f k %d p %.2f min %.2f", (double)o.temperature, o.top_k,
                 (double)o.top_p, (double)o.min_p);
        char w2[200];
        snprintf(w2, sizeof w2, "peaky, %s", what);
        compare_with_reference(peaky, V, o, w2);
        snprintf(w2, sizeof w2, "flat, %s", what);
        compare_with_reference(flat, V, o, w2);
        if (o.top_k < 5) {
            snprintf(w2, sizeof w2, "5 tokens, %s", what);
            compare_with_reference(tiny, 5, o, w2);
        }
    }
    /* Top-p that needs tokens far below the top and cuts inside a run of ties, which go by
     * index: e^10 holds 0.815 of the mass. */
    g4_sampler_options o = opts_t(1.0f);
    o.top_p = 0.9f;
    compare_with_reference(one_top, V, o, "one top token, ties, top-p 0.9");
    o.top_p = 0.86f;
    compare_with_reference(one_top, V, o, "one top token, ties, top-p 0.86");
}

/* Vocabularies large enough that the nucleus is not among the first few thousand gathered
 * tokens, so top-p goes through the ladder search. */
static void test_reference_large(void **state) {
    (void)state;
    test_seed(7);
    enum { V = 20011 };
    static float flat[V], one_top[V], wide[V];
    for (int i = 0; i < V; i++) flat[i] = (float)(0.01 * test_uniform());
    for (int i = 0; i < V; i++) one_top[i] = 0.0f;
    one_top[4321] = 10.0f; /* holds 1 / (1 + 20010 e^-10) = 0.524 */
    for (int i = 0; i < V; i++) wide[i] = (float)(4.0 * test_normal());
    g4_sampler_options o = opts_t(1.0f);
    const float ps[3] = {0.3f, 0.9f, 0.97f};
    for (int p = 0; p < 3; p++) {
        o.top_p = ps[p];
        char what[100];
        snprintf(what, sizeof what, "V %d flat, top-p %.2f", V, (double)ps[p]);
        compare_with_reference(flat, V, o, what);
        snprintf(what, sizeof what, "V %d one top, ties, top-p %.2f", V, (double)ps[p]);
        compare_with_reference(one_top, V, o, what);
        snprintf(what, sizeof what, "V %d normal(0, 4), T 1.7, top-p %.2f", V, (double)ps[p]);
        o.temperature = 1.7f;
        compare_with_reference(wide, V, o, what);
        o.temperature = 1.0f;
    }
    /* The nucleus needs tokens whose weights (e^-14) are below the ladder's resolution, so
     * its estimate falls short everywhere and the exact fallback has to find them. */
    static float faint[V];
    for (int i = 0; i < V; i++) faint[i] = -14.0f;
    faint[77] = 0.0f;
    o.top_p = 0.99f;
    compare_with_reference_slack(faint, V, o, "V 20011 one top, faint tail, top-p 0.99", 1);
    /* A min-p too small to bound the gathering: applied after the ladder's nucleus. */
    o.top_p = 0.9f;
    o.temperature = 2.5f;
    o.min_p = 2e-6f;
    compare_with_reference(wide, V, o, "V 20011 normal(0, 4), T 2.5, top-p 0.9, min-p 2e-6");
}

/* Every vector width gives the same bits: probabilities and drawn tokens. */
static void test_widths_agree(void **state) {
    (void)state;
    test_seed(6);
    enum { V = 20011 };
    static float peaky[V], flat[V], probs_ref[V], probs[V];
    for (int i = 0; i < V; i++) peaky[i] = (float)(30.0 * tanh(5.0 * test_normal() / 30.0));
    for (int i = 0; i < V; i++) flat[i] = (float)(0.5 * test_normal());
    peaky[V - 1] = 40.0f; /* the maximum in the scalar tail */
    const int widths[3] = {4, 8, 16};
    struct {
        float t, top_p, min_p, rep;
        int top_k;
    } cfg[] = {
        {0.0f, 1.0f, 0.0f, 1.3f, 0},  {1.0f, 1.0f, 0.0f, 1.0f, 0},   {0.8f, 0.95f, 0.0f, 1.0f, 0},
        {1.0f, 1.0f, 0.05f, 1.0f, 0}, {1.0f, 0.9f, 0.02f, 1.2f, 40}, {1.5f, 0.99f, 0.0f, 1.0f, 0},
    };
    int tested = 0;
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++)
        for (int d = 0; d < 2; d++) {
            const float *l = d ? flat : peaky;
            int32_t seq_ref[64];
            for (int wi = 0; wi < 3; wi++) {
                g4_sampler_options o = opts_t(cfg[c].t);
                o.top_p = cfg[c].top_p;
                o.min_p = cfg[c].min_p;
                o.top_k = cfg[c].top_k;
                o.repetition_penalty = cfg[c].rep;
                o.seed = 5;
                g4_sampler *s = NULL;
                g4_error err = {0};
                g4_status st = g4_sampler_create_width(&o, V, widths[wi], &s, &err);
                if (st == G4_ERR_UNSUPPORTED) continue;
                assert_int_equal(st, G4_OK);
                for (int i = 0; i < 5; i++)
                    assert_int_equal(g4_sampler_accept(s, i * 17, NULL), G4_OK);
                get_probs(s, l, V, wi == 0 ? probs_ref : probs);
                int32_t seq[64];
                for (int i = 0; i < 64; i++) {
                    seq[i] = draw(s, l, V);
                    assert_int_equal(g4_sampler_accept(s, seq[i], NULL), G4_OK);
                }
                if (wi == 0) {
                    memcpy(seq_ref, seq, sizeof seq);
                } else {
                    if (memcmp(probs, probs_ref, sizeof probs) != 0)
                        fail_msg("config %zu data %d: width %d probabilities differ from width 4",
                                 c, d, widths[wi]);
                    assert_memory_equal(seq, seq_ref, sizeof seq);
                    tested++;
                }
                g4_sampler_free(s);
            }
        }
    print_message("widths compared with the generic one: %d runs\n", tested);
}

/* ---- the vector exp ----------------------------------------------------------------------- */

static void test_exp(void **state) {
    (void)state;
    enum { N = 100003 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = -87.0f * (float)i / (N - 1);
    g4_sampler_exp_neg(x, y, N);
    double worst = 0.0;
    for (int i = 0; i < N; i++) {
        double want = exp((double)x[i]);
        double rel = fabs(y[i] - want) / want;
        if (rel > worst) worst = rel;
    }
    print_message("exp: worst relative error %.3g over [-87, 0]\n", worst);
    assert_true(worst < 3e-7); /* about 2.5 ulp */
    const float specials[5] = {0.0f, -0.0f, -INFINITY, -88.0f, -1000.0f};
    float out[5];
    g4_sampler_exp_neg(specials, out, 5);
    assert_true(out[0] == 1.0f && out[1] == 1.0f);
    assert_true(out[2] == 0.0f && out[3] == 0.0f && out[4] == 0.0f);
    /* Any position in a vector gives the same bits. */
    float one;
    for (int i = 0; i < 40; i++) {
        g4_sampler_exp_neg(&x[i * 997], &one, 1);
        assert_true(one == y[i * 997]);
    }
}

/* ---- stop strings ------------------------------------------------------------------------ */

static int utf8_ok(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80             ? 1
                   : (c & 0xe0) == 0xc0 ? 2
                   : (c & 0xf0) == 0xe0 ? 3
                   : (c & 0xf8) == 0xf0 ? 4
                                        : 0;
        if (!l || i + l > n) return 0;
        for (size_t j = 1; j < l; j++)
            if (((unsigned char)s[i + j] & 0xc0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

typedef struct stream_out {
    char text[16384];
    size_t len;
    int stopped, stop_index;
} stream_out;

/* Feeds text cut at the given points, then flushes; checks each piece is whole UTF-8 when the
 * input is. */
static void run_stream(g4_stop_matcher *m, const char *text, size_t n, const size_t *cuts,
                       int n_cuts, int check_utf8, stream_out *out) {
    g4_stop_matcher_reset(m);
    out->len = 0;
    size_t at = 0;
    g4_stop_result r;
    for (int c = 0; c <= n_cuts; c++) {
        size_t end = c < n_cuts ? cuts[c] : n;
        g4_error err = {0};
        if (g4_stop_matcher_feed(m, text + at, end - at, &r, &err) != G4_OK)
            fail_msg("feed: %s", err.message);
        if (check_utf8 && !utf8_ok(r.text, r.len)) fail_msg("emitted a split UTF-8 character");
        assert_true(out->len + r.len <= sizeof out->text);
        memcpy(out->text + out->len, r.text, r.len);
        out->len += r.len;
        at = end;
    }
    g4_stop_matcher_flush(m, &r);
    memcpy(out->text + out->len, r.text, r.len);
    out->len += r.len;
    out->stopped = r.stopped;
    out->stop_index = r.stop_index;
}

static void expect_stream(const char *const *stops, int n_stops, const char *text, const char *want,
                          int want_index) {
    g4_stop_matcher *m = NULL;
    g4_error err = {0};
    if (g4_stop_matcher_create(stops, n_stops, &m, &err) != G4_OK)
        fail_msg("create: %s", err.message);
    const size_t n = strlen(text), wl = strlen(want);
    const int valid = utf8_ok(text, n);
    static stream_out out;
    size_t cuts[4096] = {0};
#define CHECK(desc)                                                                                \
    do {                                                                                           \
        if (out.len != wl || memcmp(out.text, want, wl) != 0 ||                                    \
            out.stopped != (want_index >= 0) || out.stop_index != want_index)                      \
            fail_msg("\"%s\" %s: got \"%.*s\" stopped=%d index=%d, want \"%s\" index=%d", text,    \
                     desc, (int)out.len, out.text, out.stopped, out.stop_index, want, want_index); \
    } while (0)
    run_stream(m, text, n, cuts, 0, valid, &out);
    CHECK("in one chunk");
    for (size_t i = 0; i <= n; i++) {
        cuts[0] = i;
        run_stream(m, text, n, cuts, 1, valid, &out);
        CHECK("in two chunks");
        for (size_t j = i; j <= n; j++) {
            cuts[1] = j;
            run_stream(m, text, n, cuts, 2, valid, &out);
            CHECK("in three chunks");
        }
    }
    assert_true(n <= 4096);
    for (size_t i = 0; i < n; i++) cuts[i] = i + 1;
    run_stream(m, text, n, cuts, (int)n, valid, &out);
    CHECK("byte by byte");
#undef CHECK
    g4_stop_matcher_free(m);
}

static void test_stop_strings(void **state) {
    (void)state;
    const char *end[] = {"<end>"};
    expect_stream(end, 1, "Hello world<end>tail", "Hello world", 0);
    expect_stream(end, 1, "<end>abc", "", 0);
    expect_stream(end, 1, "abc<en", "abc<en", -1); /* an unfinished prefix is released */
    expect_stream(end, 1, "a<en<end", "a<en<end", -1);
    expect_stream(end, 1, "<<end<end>>", "<<end", 0);
    const char *multi[] = {"STOP", "界!"};
    expect_stream(multi, 2, "Grüße, 世界! more STOP", "Grüße, 世", 1);
    expect_stream(multi, 2, "Grüße, 世界 more STOP. 界!", "Grüße, 世界 more ", 0);
    const char *emoji[] = {"🙂"};
    expect_stream(emoji, 1, "a🙂b", "a", 0);
    expect_stream(emoji, 1, "naïve café 🙃 – done", "naïve café 🙃 – done", -1);
    const char *overlap[] = {"abcd", "bc"};
    expect_stream(overlap, 2, "xabcdy", "xa", 1); /* "bc" completes first */
    const char *same_end[] = {"bc", "abc"};
    expect_stream(same_end, 2, "xxabc", "xx", 1); /* equal ends: the longer one */
    const char *self[] = {"aab"};
    expect_stream(self, 1, "aaab", "a", 0);
    expect_stream(self, 1, "aaaa", "aaaa", -1);
    expect_stream(NULL, 0, "no stops: ünïcödé", "no stops: ünïcödé", -1);
    /* Bytes that are not UTF-8 pass through; a truncated character waits for flush. */
    expect_stream(end, 1,
                  "a\x80"
                  "b<end>",
                  "a\x80"
                  "b",
                  0);
    expect_stream(end, 1, "ab\xe2\x82", "ab\xe2\x82", -1);
}

static void test_stop_details(void **state) {
    (void)state;
    const char *stops[] = {"</s>", "€"};
    g4_stop_matcher *m = NULL;
    g4_error err = {0};
    assert_int_equal(g4_stop_matcher_create(stops, 2, &m, &err), G4_OK);
    g4_stop_result r;
    /* Half a euro sign is held; the other half completes a stop string. */
    assert_int_equal(g4_stop_matcher_feed(m, "5 \xe2\x82", 4, &r, &err), G4_OK);
    assert_int_equal(r.len, 2);
    assert_memory_equal(r.text, "5 ", 2);
    assert_int_equal(g4_stop_matcher_feed(m, "\xac and more", 10, &r, &err), G4_OK);
    assert_int_equal(r.len, 0);
    assert_true(r.stopped && r.stop_index == 1);
    assert_int_equal(g4_stop_matcher_feed(m, "later", 5, &r, &err), G4_OK);
    assert_true(r.len == 0 && r.stopped);
    g4_stop_matcher_flush(m, &r);
    assert_true(r.len == 0 && r.stopped);

    /* Half a non-stop character is held, then released whole. */
    g4_stop_matcher_reset(m);
    assert_int_equal(g4_stop_matcher_feed(m, "\xc3", 1, &r, &err), G4_OK);
    assert_true(r.len == 0 && !r.stopped && r.stop_index == -1);
    assert_int_equal(g4_stop_matcher_feed(m, "\xa9<", 2, &r, &err), G4_OK);
    assert_int_equal(r.len, 2);
    assert_memory_equal(r.text, "\xc3\xa9", 2);
    assert_int_equal(g4_stop_matcher_feed(m, "/x", 2, &r, &err), G4_OK);
    assert_int_equal(r.len, 3);
    assert_memory_equal(r.text, "</x", 3);

    /* A chunk far larger than the initial buffer. */
    g4_stop_matcher_reset(m);
    static char big[20000];
    memset(big, 'z', sizeof big);
    memcpy(big + 15000, "</s>", 4);
    assert_int_equal(g4_stop_matcher_feed(m, big, sizeof big, &r, &err), G4_OK);
    assert_true(r.stopped && r.len == 15000 && r.stop_index == 0);
    g4_stop_matcher_free(m);

    const char *empty[] = {"ok", ""};
    assert_int_equal(g4_stop_matcher_create(empty, 2, &m, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "stop string 1 is empty"));
    const char *bad[] = {"\xff\xfe"};
    assert_int_equal(g4_stop_matcher_create(bad, 1, &m, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "stop string 0 is not valid UTF-8"));
    const char *overlong[] = {"\xc0\xaf"};
    assert_int_equal(g4_stop_matcher_create(overlong, 1, &m, &err), G4_ERR_ARG);
    assert_int_equal(g4_stop_matcher_create(NULL, 1, &m, &err), G4_ERR_ARG);
    assert_null(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_option_validation),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logits_untouched),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_reference_large),
        cmocka_unit_test(test_widths_agree),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_stop_details),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
