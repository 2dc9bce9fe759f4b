/* CPU kernels and quantisation formats: round trips, layouts, and the exactness contract
 * (SIMD == scalar bitwise, M invariance, thread invariance, row views). */
#include <float.h>
#include <math.h>

#include "cpu/kernels.h"
#include "cpu/act.h"
#include "cpu/kernels_internal.h"
#include "cpu/quant.h"
#include "test_util.h"
#include "util/bandwidth.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float frand(void) { return (float)(rnd() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }
/* Roughly Gaussian, with an occasional outlier as real weights and activations have. */
static float grand(void) {
    float s = frand() + frand() + frand();
    return (rnd() % 97 == 0) ? 6 * s : s;
}
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = grand();
}

/* A test matrix that owns its storage. */
typedef struct {
    g4_mat m;
    uint8_t *data, *scales, *biases;
    float *dense; /* the dequantised weights, [rows][cols] */
} tmat;

typedef struct {
    g4_wtype type;
    int bits, group; /* AFFINE / SYMM */
    g4_dtype sdt;    /* AFFINE / SYMM scale dtype */
} tcfg;

static void store_scale(uint8_t *p, g4_dtype dt, size_t i, float v) {
    if (dt == G4_DT_F32) ((float *)p)[i] = v;
    else if (dt == G4_DT_F16) ((uint16_t *)p)[i] = g4_f32_to_f16(v);
    else ((uint16_t *)p)[i] = g4_f32_to_bf16(v);
}

static tmat make_mat(tcfg c, int rows, int cols, const float *src) {
    tmat t = {0};
    t.m.type = c.type;
    t.m.rows = rows;
    t.m.cols = cols;
    t.m.bits = c.bits;
    size_t rb = g4_wtype_row_bytes(c.type, cols, c.bits);
    assert_true(rb > 0);
    t.m.row_bytes = rb;
    t.data = malloc(rb * rows + 64);
    assert_non_null(t.data);
    if (c.type == G4_W_AFFINE || c.type == G4_W_SYMM) {
        int G = c.group > 0 ? c.group : cols, ng = cols / G;
        size_t ss = g4_dtype_size(c.sdt);
        t.scales = malloc(ss * rows * ng + 8);
        t.biases = c.type == G4_W_AFFINE ? malloc(ss * rows * ng + 8) : NULL;
        float *sc = malloc(sizeof(float) * ng), *bi = malloc(sizeof(float) * ng);
        for (int r = 0; r < rows; r++) {
            const float *x = src + (size_t)r * cols;
            uint8_t *d = t.data + rb * r;
            if (c.type == G4_W_AFFINE) {
                g4_quantize_row_affine(x, cols, c.bits, G, (uint32_t *)d, sc, bi);
            } else {
                for (int g = 0; g < ng; g++)
                    sc[g] = g4_quantize_row_symm(x + (size_t)g * G, G, c.bits, d + (size_t)g * G * c.bits / 8);
            }
            for (int g = 0; g < ng; g++) {
                store_scale(t.scales, c.sdt, (size_t)r * ng + g, sc[g]);
                if (t.biases) store_scale(t.biases, c.sdt, (size_t)r * ng + g, bi[g]);
            }
        }
        free(sc);
        free(bi);
        t.m.group = c.type == G4_W_SYMM && c.group == 0 ? 0 : G;
        t.m.scales = t.scales;
        t.m.biases = t.biases;
        t.m.scale_dtype = c.sdt;
        t.m.scale_stride = (size_t)ng;
    } else {
        for (int r = 0; r < rows; r++) g4_quantize_row(c.type, src + (size_t)r * cols, cols, t.data + rb * r);
    }
    t.m.data = t.data;
    t.dense = malloc(sizeof(float) * rows * cols);
    for (int r = 0; r < rows; r++) g4_mat_row_f32(&t.m, r, t.dense + (size_t)r * cols);
    assert_int_equal(g4_mat_validate(&t.m, NULL), G4_OK);
    return t;
}

static void free_mat(tmat *t) {
    free(t->data);
    free(t->scales);
    free(t->biases);
    free(t->dense);
}

static const char *cfg_name(tcfg c, char *buf, size_t n) {
    if (c.type == G4_W_AFFINE || c.type == G4_W_SYMM)
        snprintf(buf, n, "%s bits %d group %d %s", g4_wtype_name(c.type), c.bits, c.group, g4_dtype_name(c.sdt));
    else
        snprintf(buf, n, "%s", g4_wtype_name(c.type));
    return buf;
}

/* Every configuration the tests cover. */
static int all_cfgs(tcfg *out) {
    int n = 0;
    for (g4_wtype t = G4_W_F32; t <= G4_W_Q6_K; t++) out[n++] = (tcfg){t, 0, 0, G4_DT_F32};
    static const g4_dtype sd[3] = {G4_DT_BF16, G4_DT_F16, G4_DT_F32};
    for (int bits = 2; bits <= 8; bits++)
        for (int g = 32; g <= 128; g *= 2) out[n++] = (tcfg){G4_W_AFFINE, bits, g, sd[(bits + g / 32) % 3]};
    for (int bits = 2; bits <= 8; bits *= 2) {
        out[n++] = (tcfg){G4_W_SYMM, bits, 0, G4_DT_F32};
        out[n++] = (tcfg){G4_W_SYMM, bits, 64, G4_DT_BF16}; /* blockwise (QAT embeddings) */
    }
    return n;
}

static int block_of(tcfg c) { return c.type == G4_W_Q4_K || c.type == G4_W_Q5_K || c.type == G4_W_Q6_K ? 256 : c.type <= G4_W_BF16 ? 1 : 32; }

/* ---- layouts on hand-made blocks ------------------------------------------------------------- */

static void put16(uint8_t *p, float v) {
    uint16_t h = g4_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static void test_layouts(void **state) {
    (void)state;
    float y[256];
    /* Q4_0: element j < 16 is the low nibble of byte j, element j+16 the high nibble; value q-8 */
    uint8_t b40[18] = {0};
    put16(b40, 0.5f);
    b40[2] = 0x1f; /* element 0 = 15-8 = 7, element 16 = 1-8 = -7 */
    b40[17] = 0x80; /* element 15 = 0-8, element 31 = 8-8 */
    g4_dequantize_row(G4_W_Q4_0, b40, 32, y);
    assert_true(y[0] == 3.5f && y[16] == -3.5f && y[15] == -4.0f && y[31] == 0.0f && y[1] == -4.0f);
    /* Q4_1: w = d·q + m */
    uint8_t b41[20] = {0};
    put16(b41, 2.0f);
    put16(b41 + 2, -1.0f);
    b41[4 + 3] = 0x52;
    g4_dequantize_row(G4_W_Q4_1, b41, 32, y);
    assert_true(y[3] == 3.0f && y[19] == 9.0f && y[0] == -1.0f);
    /* Q5_0: qh bit j is element j's 5th bit; value q-16 */
    uint8_t b50[22] = {0};
    put16(b50, 1.0f);
    b50[2] = 0x01;              /* element 0 */
    b50[5] = 0x80;              /* bit 31: element 31 */
    b50[6 + 0] = 0x03;          /* element 0 low nibble 3, element 16 high nibble 0 */
    b50[6 + 15] = 0xf0;         /* element 31 high nibble 15 */
    g4_dequantize_row(G4_W_Q5_0, b50, 32, y);
    assert_true(y[0] == 3.0f && y[16] == -16.0f && y[31] == 15.0f && y[15] == -16.0f);
    /* Q5_1 */
    uint8_t b51[24] = {0};
    put16(b51, 1.0f);
    put16(b51 + 2, 0.5f);
    b51[4 + 2] = 0x01; /* bit 16: element 16 */
    b51[8] = 0x20;     /* element 16 high nibble 2 → 18 */
    g4_dequantize_row(G4_W_Q5_1, b51, 32, y);
    assert_true(y[16] == 18.5f && y[0] == 0.5f);
    /* Q8_0 */
    uint8_t b80[34] = {0};
    put16(b80, 0.25f);
    b80[2 + 5] = (uint8_t)(int8_t)-100;
    g4_dequantize_row(G4_W_Q8_0, b80, 32, y);
    assert_true(y[5] == -25.0f && y[4] == 0.0f);
    /* Q4_K: sub-block 1's scale/min live in the low 6 bits of bytes 1 and 5, sub-block 6's in the
     * nibbles of byte 10 plus the top bits of bytes 2 and 6 */
    uint8_t bk[176] = {0};
    put16(bk, 1.0f);
    put16(bk + 2, 0.5f);
    bk[4 + 1] = 3;                 /* sc1 = 3 */
    bk[4 + 5] = 4;                 /* m1 = 4 */
    bk[4 + 10] = 0x21;             /* sc6 low = 1, m6 low = 2 */
    bk[4 + 2] = 0x40;              /* sc6 high bits = 1 → sc6 = 17 */
    bk[4 + 6] = 0x80;              /* m6 high bits = 2 → m6 = 34 */
    bk[16 + 0 * 32 + 7] = 0x90;    /* sub-block 1 (high nibble of chunk 0), element 7: q = 9 */
    bk[16 + 3 * 32 + 31] = 0x0b;   /* sub-block 6 (low nibble of chunk 3), element 31: q = 11 */
    g4_dequantize_row(G4_W_Q4_K, bk, 256, y);
    assert_true(y[32 + 7] == 3.0f * 9 - 0.5f * 4);
    assert_true(y[6 * 32 + 31] == 17.0f * 11 - 0.5f * 34);
    assert_true(y[6 * 32] == -0.5f * 34 && y[0] == 0.0f);
    /* Q5_K: bit s of qh[l] is element l of sub-block s's 5th bit; qs at byte 48 */
    memset(bk, 0, sizeof bk);
    put16(bk, 1.0f);
    bk[4 + 2] = 1;                 /* sc2 = 1, m2 = 0 */
    bk[16 + 5] = 0x04;             /* qh[5] bit 2 → sub-block 2 element 5 */
    bk[48 + 32 + 5] = 0x07;        /* sub-block 2 = low nibble of chunk 1 */
    g4_dequantize_row(G4_W_Q5_K, bk, 256, y);
    assert_true(y[64 + 5] == 23.0f && y[64 + 4] == 0.0f);
    /* Q6_K: element 128h + 64 + l = high nibble of ql[64h + l] | bits 4-5 of qh[32h + l] << 4; d last */
    uint8_t b6[210] = {0};
    put16(b6 + 208, 0.5f);
    for (int s = 0; s < 16; s++) b6[192 + s] = (uint8_t)(int8_t)(s == 12 ? -2 : 1);
    b6[64 + 3] = 0xa0;             /* ql[64 + 3] high nibble 10 → element 128 + 64 + 3 */
    b6[128 + 32 + 3] = 0x20;       /* qh bits 4-5 = 2 → q = 10 | 32 = 42 → 42-32 = 10 */
    g4_dequantize_row(G4_W_Q6_K, b6, 256, y);
    assert_true(y[128 + 64 + 3] == 0.5f * -2 * 10);
    assert_true(y[0] == 0.5f * 1 * -32);
}

/* MLX packs 3/5/6-bit codes as 8, 8, 4 codes per 3, 5, 3 bytes, each pack one little-endian
 * integer Σ q_k << (k·bits): pack that way by hand and check the stream reader and packer. */
static void test_stream_pack(void **state) {
    (void)state;
    for (int bits = 2; bits <= 8; bits++) {
        int per = bits == 3 || bits == 5 ? 8 : bits == 6 ? 4 : 8 / (bits >= 8 ? 8 : bits) * 1;
        int bytes_per = bits == 3 ? 3 : bits == 5 ? 5 : bits == 6 ? 3 : per * bits / 8;
        if (bits == 7) per = 8, bytes_per = 7;
        enum { N = 256 };
        uint8_t vals[N], mine[N], ref[N] = {0};
        for (int i = 0; i < N; i++) vals[i] = (uint8_t)(rnd() & ((1u << bits) - 1));
        for (int p = 0; p * per < N; p++) {
            uint64_t el = 0;
            for (int k = 0; k < per; k++) el |= (uint64_t)vals[p * per + k] << (k * bits);
            for (int b = 0; b < bytes_per; b++) ref[p * bytes_per + b] = (uint8_t)(el >> (8 * b));
        }
        g4_stream_pack(vals, N, bits, mine);
        assert_memory_equal(mine, ref, (size_t)N * bits / 8);
        for (int i = 0; i < N; i++) assert_int_equal(g4_stream_code(ref, i, bits), vals[i]);
    }
    /* MLX's 3-bit reader (extract_bits): w1 = (b0 & 0x38) >> 3, w2 = (b0 >> 6) | (b1 & 1) << 2 */
    uint8_t b3[3] = {0xd5, 0x3b, 0x9e};
    assert_int_equal(g4_stream_code(b3, 1, 3), (b3[0] & 0x38) >> 3);
    assert_int_equal(g4_stream_code(b3, 2, 3), ((b3[0] & 0xc0) >> 6) + ((b3[1] & 0x1) << 2));
    assert_int_equal(g4_stream_code(b3, 5, 3), ((b3[1] & 0x80) >> 7) + ((b3[2] & 0x3) << 1));
    /* 6-bit: w1 = (b0 >> 6) + (b1 & 15) << 2, w2 = (b1 >> 4) + (b2 & 3) << 4 */
    assert_int_equal(g4_stream_code(b3, 1, 6), ((b3[0] >> 6) & 3) + ((b3[1] & 0x0f) << 2));
    assert_int_equal(g4_stream_code(b3, 2, 6), ((b3[1] >> 4) & 15) + ((b3[2] & 0x03) << 4));
    /* 5-bit: w3 = (b1 >> 7) + (b2 & 15) << 1 */
    uint8_t b5[5] = {0x12, 0xf4, 0x5a, 0xc3, 0x7e};
    assert_int_equal(g4_stream_code(b5, 3, 5), ((b5[1] & 0x80) >> 7) + ((b5[2] & 0xf) << 1));
    assert_int_equal(g4_stream_code(b5, 6, 5), ((b5[3] & 0xc0) >> 6) + ((b5[4] & 0x7) << 2));
}

/* ---- round trips ----------------------------------------------------------------------------- */

/* Max |x - dequant(quant(x))| allowed for one block of x, from the format's step. */
static float rt_bound(tcfg c, const float *x, int n) {
    float mn = x[0], mx = x[0], amax = 0;
    for (int i = 0; i < n; i++) {
        mn = fminf(mn, x[i]);
        mx = fmaxf(mx, x[i]);
        amax = fmaxf(amax, fabsf(x[i]));
    }
    float range = mx - mn, tiny = 1e-6f + 2e-3f * amax; /* f16 / bf16 scale rounding */
    switch (c.type) {
    case G4_W_F32: return 0;
    case G4_W_F16: return amax * 0x1p-11f + 1e-7f;
    case G4_W_BF16: return amax * 0x1p-8f;
    case G4_W_Q8_0: return amax / 127 * 0.5f + tiny;
    case G4_W_Q4_0: return amax / 8 * 1.0f + tiny; /* the far end clips by one step */
    case G4_W_Q5_0: return amax / 16 * 1.0f + tiny;
    case G4_W_Q4_1: return range / 15 * 0.5f + tiny;
    case G4_W_Q5_1: return range / 31 * 0.5f + tiny;
    case G4_W_AFFINE: { /* MLX's exact edge rescales by up to one step */
        float step = range / ((1 << c.bits) - 1);
        return step * 1.01f + (c.sdt == G4_DT_BF16 ? 8e-3f : c.sdt == G4_DT_F16 ? 1e-3f : 1e-6f) * amax * (1 << c.bits) + 1e-6f;
    }
    case G4_W_SYMM: {
        float step = amax / ((1 << (c.bits - 1)) - 1);
        return step * 0.5f + (c.sdt == G4_DT_BF16 ? 8e-3f : 1e-6f) * amax * (1 << c.bits) + 1e-6f;
    }
    default: return INFINITY; /* K-quants: checked per super-block below */
    }
}

static void test_round_trip(void **state) {
    (void)state;
    tcfg cfgs[64];
    int nc = all_cfgs(cfgs);
    char name[96];
    for (int ci = 0; ci < nc; ci++) {
        tcfg c = cfgs[ci];
        int rows = 5, cols = 1024;
        float *x = malloc(sizeof(float) * rows * cols);
        fill(x, (size_t)rows * cols);
        for (int i = 0; i < 64; i++) x[cols + i] = 0; /* an all-zero stretch */
        tmat t = make_mat(c, rows, cols, x);
        int G = c.type == G4_W_AFFINE ? c.group : c.type == G4_W_SYMM ? (c.group ? c.group : cols) : block_of(c);
        double se = 0, sx = 0;
        for (int r = 0; r < rows; r++)
            for (int g0 = 0; g0 < cols; g0 += G) {
                const float *xb = x + (size_t)r * cols + g0;
                const float *yb = t.dense + (size_t)r * cols + g0;
                float bound = rt_bound(c, xb, G), maxerr = 0;
                if (c.type >= G4_W_Q4_K && c.type <= G4_W_Q6_K) {
                    /* worst sub-block step of the super-block, plus the 6/8-bit scale coding */
                    float worst = 0;
                    int sub = c.type == G4_W_Q6_K ? 16 : 32;
                    for (int s = 0; s < 256; s += sub) {
                        float mn = 0, mx = 0, am = 0;
                        for (int i = 0; i < sub; i++) {
                            mn = fminf(mn, xb[s + i]);
                            mx = fmaxf(mx, xb[s + i]);
                            am = fmaxf(am, fabsf(xb[s + i]));
                        }
                        float step = c.type == G4_W_Q6_K ? am / 32 : (mx - mn) / (c.type == G4_W_Q4_K ? 15 : 31);
                        worst = fmaxf(worst, step);
                    }
                    bound = worst * (c.type == G4_W_Q6_K ? 1.3f : 1.8f) + 1e-6f;
                }
                for (int i = 0; i < G; i++) {
                    float e = fabsf(xb[i] - yb[i]);
                    maxerr = fmaxf(maxerr, e);
                    se += (double)e * e;
                    sx += (double)xb[i] * xb[i];
                }
                if (!(maxerr <= bound))
                    fail_msg("%s: row %d group at %d: error %g over bound %g", cfg_name(c, name, sizeof name), r, g0,
                             maxerr, bound);
            }
        /* relative RMS error: a sanity check that the bound is not vacuous */
        double rel = sqrt(se / sx), lim;
        int bits = c.type == G4_W_AFFINE || c.type == G4_W_SYMM ? c.bits
                   : c.type == G4_W_Q8_0 ? 8 : c.type == G4_W_Q6_K ? 6
                   : c.type == G4_W_Q5_0 || c.type == G4_W_Q5_1 || c.type == G4_W_Q5_K ? 5
                   : c.type <= G4_W_BF16 ? 16 : 4;
        lim = c.type == G4_W_F32 ? 0 : c.type == G4_W_F16 ? 1e-3 : c.type == G4_W_BF16 ? 4e-3 : 4.0 / (1 << bits);
        if (c.type == G4_W_SYMM && c.group == 0) lim = fmin(1.0, 8.0 / (1 << c.bits)); /* one scale per 1024 outlier-laden values */ /* {-2..1}·amax: coarse by design */
        if (!(rel <= lim)) fail_msg("%s: relative RMS error %g over %g", cfg_name(c, name, sizeof name), rel, lim);
        free_mat(&t);
        free(x);
    }
}

/* ---- kernels --------------------------------------------------------------------------------- */

/* y = w·x for M tokens at one ISA level, through a pool of `threads`. */
static float *run(g4_isa isa, int threads, const g4_mat *w, const float *x, int M) {
    float *y = malloc(sizeof(float) * (size_t)M * w->rows + 4);
    g4_threadpool *pool = NULL;
    if (threads > 0) assert_int_equal(g4_threadpool_create(threads, &pool, NULL), G4_OK);
    g4_matmul_isa(isa, pool, w, x, M, y, w->rows);
    if (pool) g4_threadpool_free(pool);
    return y;
}

/* Accuracy against a double-precision dot of the dequantised weights. */
static void check_accuracy(tcfg c, const tmat *t, const float *x, int M, const float *y) {
    char name[96];
    int K = t->m.cols;
    for (int m = 0; m < M; m++)
        for (int r = 0; r < t->m.rows; r++) {
            double s = 0, sa = 0, qb = 0;
            for (int i = 0; i < K; i++) {
                double p = (double)x[(size_t)m * K + i] * t->dense[(size_t)r * K + i];
                s += p;
                sa += fabs(p);
            }
            /* the documented bound of the integer path: activations err by at most amax_b/254 */
            for (int b = 0; c.type > G4_W_BF16 && b < K / 32; b++) {
                double amax = 0, wsum = 0;
                g4_wblock wb;
                g4_wblock_get(&t->m, r, b, &wb);
                int off = g4_wtype_offset(&t->m);
                for (int i = 0; i < 32; i++) {
                    amax = fmax(amax, fabs(x[(size_t)m * K + 32 * b + i]));
                    wsum += fabs((double)(i < 16 || c.type != G4_W_Q6_K ? wb.sw : wb.sw_hi) * (wb.u[i] - off));
                }
                qb += amax / 254 * wsum;
            }
            double got = y[(size_t)m * t->m.rows + r];
            double tol = 1e-5 * sa + 1.01 * qb + 1e-30;
            if (!(fabs(got - s) <= tol))
                fail_msg("%s [%d x %d] m %d row %d: %.9g, exact %.9g (tol %g)", cfg_name(c, name, sizeof name),
                         t->m.rows, K, m, r, got, s, tol);
        }
}

static void test_matmul_exactness(void **state) {
    (void)state;
    tcfg cfgs[64];
    int nc = all_cfgs(cfgs);
    g4_isa best = g4_isa_best();
    char name[96];
    print_message("best ISA here: %s\n", g4_isa_name(best));
    static const int Ms[4] = {1, 3, 7, 64};
    for (int ci = 0; ci < nc; ci++) {
        tcfg c = cfgs[ci];
        int bc = c.type == G4_W_AFFINE ? c.group : c.type == G4_W_SYMM && c.group ? c.group : block_of(c);
        if (bc < 32 && c.type > G4_W_BF16) bc = 32;
        for (int shape = 0; shape < 3; shape++) {
            int rows = 1 + (int)(rnd() % 37);
            int nblk = shape == 0 ? 1 : shape == 1 ? 1 + (int)(rnd() % 9) : (bc >= 256 ? 6 : 40 + (int)(rnd() % 9));
            int cols = bc * nblk;
            if (c.type <= G4_W_BF16) cols = shape == 0 ? 1 + (int)(rnd() % 15) : shape == 1 ? 16 * (int)(1 + rnd() % 9) + (int)(rnd() % 16) : 1000 + (int)(rnd() % 50);
            float *wsrc = malloc(sizeof(float) * rows * cols);
            fill(wsrc, (size_t)rows * cols);
            tmat t = make_mat(c, rows, cols, wsrc);
            float *x = malloc(sizeof(float) * 64 * cols);
            fill(x, (size_t)64 * cols);
            for (int i = 0; i < cols && i < 32; i++) x[i] = 0; /* a zero block */
            float *ref = run(G4_ISA_SCALAR, 0, &t.m, x, 64);
            check_accuracy(c, &t, x, 64, ref);
            for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++)
                for (int mi = 0; mi < 4; mi++) {
                    int M = Ms[mi];
                    for (int m0 = 0; m0 + M <= 64; m0 += M == 64 ? 64 : 13) {
                        float *y = run((g4_isa)isa, 0, &t.m, x + (size_t)m0 * cols, M);
                        for (int m = 0; m < M; m++)
                            if (memcmp(y + (size_t)m * rows, ref + (size_t)(m0 + m) * rows, sizeof(float) * rows)) {
                                int r = 0;
                                while (y[(size_t)m * rows + r] == ref[(size_t)(m0 + m) * rows + r]) r++;
                                fail_msg("%s [%d x %d] %s M=%d token %d row %d: %.9g, scalar M=64 %.9g",
                                         cfg_name(c, name, sizeof name), rows, cols, g4_isa_name((g4_isa)isa), M,
                                         m0 + m, r, y[(size_t)m * rows + r], ref[(size_t)(m0 + m) * rows + r]);
                            }
                        free(y);
                    }
                }
            /* the kernels' split layout of the same matrix: the same dequantised rows; its own
             * canonical order, so the same bits at every ISA, M and token offset, and within the
             * documented bound of the exact dot */
            size_t rs = g4_mat_repack_size(&t.m);
            if (rs) {
                void *mem = NULL;
                assert_int_equal(posix_memalign(&mem, 64, rs), 0);
                tmat st = t;
                g4_mat_repack(&t.m, mem, &st.m);
                assert_int_equal(st.m.split, 1);
                assert_int_equal(g4_mat_validate(&st.m, NULL), G4_OK);
                float *row = malloc(sizeof(float) * cols);
                for (int r = 0; r < rows; r++) {
                    g4_mat_row_f32(&st.m, r, row);
                    if (memcmp(row, t.dense + (size_t)r * cols, sizeof(float) * cols))
                        fail_msg("%s split: row %d dequantises differently", cfg_name(c, name, sizeof name), r);
                }
                free(row);
                float *sref = run(G4_ISA_SCALAR, 0, &st.m, x, 64);
                check_accuracy(c, &st, x, 64, sref);
                for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++)
                    for (int mi = 0; mi < 4; mi++) {
                        int M = Ms[mi];
                        for (int m0 = 0; m0 + M <= 64; m0 += M == 64 ? 64 : 13) {
                            float *y = run((g4_isa)isa, 0, &st.m, x + (size_t)m0 * cols, M);
                            if (memcmp(y, sref + (size_t)m0 * rows, sizeof(float) * rows * M))
                                fail_msg("%s [%d x %d] split %s M=%d token %d differs from the scalar split",
                                         cfg_name(c, name, sizeof name), rows, cols, g4_isa_name((g4_isa)isa), M, m0);
                            free(y);
                        }
                    }
                free(sref);
                free(mem);
            }
            free(ref);
            free(x);
            free(wsrc);
            free_mat(&t);
        }
    }
}

/* 1 vs 2 threads and a row view, on matrices big enough for the pool to split. */
static void test_threads_and_views(void **state) {
    (void)state;
    tcfg cfgs[64];
    int nc = all_cfgs(cfgs);
    char name[96];
    for (int ci = 0; ci < nc; ci++) {
        tcfg c = cfgs[ci];
        int rows = 203, cols = 512, M = 5;
        float *wsrc = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * M * cols);
        fill(wsrc, (size_t)rows * cols);
        fill(x, (size_t)M * cols);
        tmat t = make_mat(c, rows, cols, wsrc);
        float *y0 = run(g4_isa_best(), 0, &t.m, x, M);
        float *y1 = run(g4_isa_best(), 1, &t.m, x, M);
        float *y2 = run(g4_isa_best(), 2, &t.m, x, M);
        if (memcmp(y0, y1, sizeof(float) * M * rows) || memcmp(y0, y2, sizeof(float) * M * rows))
            fail_msg("%s: results depend on the thread count", cfg_name(c, name, sizeof name));
        int r0 = 37, n = 101;
        g4_mat v = g4_mat_rows(&t.m, r0, n);
        float *yv = run(g4_isa_best(), 2, &v, x, M);
        for (int m = 0; m < M; m++)
            if (memcmp(yv + (size_t)m * n, y0 + (size_t)m * rows + r0, sizeof(float) * n))
                fail_msg("%s: row view differs", cfg_name(c, name, sizeof name));
        float row[512];
        g4_mat_row_f32(&v, 3, row);
        assert_memory_equal(row, t.dense + (size_t)(r0 + 3) * cols, sizeof row);
        free(y0), free(y1), free(y2), free(yv), free(wsrc), free(x);
        free_mat(&t);
    }
}

/* Codes over their full range (int8 −128 included, every 8-bit unsigned code) — values a
 * quantiser of ours never writes but a file may hold. */
static void test_full_range_codes(void **state) {
    (void)state;
    static const tcfg cs[] = {
        {G4_W_SYMM, 8, 0, G4_DT_F32}, {G4_W_AFFINE, 8, 64, G4_DT_BF16}, {G4_W_Q8_0, 0, 0, G4_DT_F32},
        {G4_W_SYMM, 4, 0, G4_DT_F32}, {G4_W_AFFINE, 7, 32, G4_DT_F16},
    };
    char name[96];
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        tcfg c = cs[ci];
        int rows = 9, cols = 576, M = 3; /* 18 blocks: a partial last group */
        float *wsrc = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * M * cols);
        fill(wsrc, (size_t)rows * cols);
        fill(x, (size_t)M * cols);
        tmat t = make_mat(c, rows, cols, wsrc);
        for (int r = 0; r < rows; r++)
            for (size_t i = 0; i < t.m.row_bytes; i++)
                if (c.type != G4_W_Q8_0 || i % 34 >= 2) t.data[r * t.m.row_bytes + i] = (uint8_t)rnd();
        float *ref = run(G4_ISA_SCALAR, 0, &t.m, x, M);
        for (int isa = G4_ISA_AVX2; isa <= (int)g4_isa_best(); isa++) {
            float *y = run((g4_isa)isa, 0, &t.m, x, M);
            if (memcmp(y, ref, sizeof(float) * M * rows))
                fail_msg("%s with random codes: %s differs from scalar", cfg_name(c, name, sizeof name), g4_isa_name((g4_isa)isa));
            free(y);
        }
        free(ref), free(wsrc), free(x);
        free_mat(&t);
    }
}

/* Widening for 4/8-bit-only kernels (the CUDA upload): every type that needs it gives signed codes
 * in its container's range whose sc·v + bi are the CPU's values (exact without a bias; within one
 * f32 rounding of the moved bias with one), and the types a device reads as they are need none. */
static void test_widen(void **state) {
    (void)state;
    tcfg cs[96];
    int n = all_cfgs(cs), widened = 0;
    char name[96];
    for (int ci = 0; ci < n; ci++) {
        tcfg c = cs[ci];
        const int rows = 5, cols = 512;
        float *src = malloc(sizeof(float) * rows * cols);
        fill(src, (size_t)rows * cols);
        tmat t = make_mat(c, rows, cols, src);
        g4_widen wd;
        const int need = g4_widen_of(&t.m, &wd);
        const int native = c.type <= G4_W_Q4_0 || ((c.type == G4_W_AFFINE || c.type == G4_W_SYMM) && (c.bits == 4 || c.bits == 8));
        if (need == native) fail_msg("%s: g4_widen_of says %d", cfg_name(c, name, sizeof name), need);
        if (need) {
            widened++;
            assert_true(wd.bits == 4 || wd.bits == 8);
            assert_int_equal(cols % wd.group, 0);
            int8_t *v = malloc((size_t)cols);
            float *sc = malloc(sizeof(float) * cols), *bi = malloc(sizeof(float) * cols);
            const int lo = wd.bits == 4 ? -8 : -128, hi = wd.bits == 4 ? 7 : 127;
            for (int r = 0; r < rows; r++) {
                g4_widen_row(&t.m, &wd, r, v, sc, wd.bias ? bi : NULL);
                for (int i = 0; i < cols; i++) {
                    if (v[i] < lo || v[i] > hi) fail_msg("%s: code %d outside %d bits", cfg_name(c, name, sizeof name), v[i], wd.bits);
                    const float s = sc[i / wd.group], b = wd.bias ? bi[i / wd.group] : 0.0f;
                    const float got = wd.bias ? fmaf(s, (float)v[i], b) : s * (float)v[i], want = t.dense[(size_t)r * cols + i];
                    /* the bias moved by up to 128 steps: roundings of magnitude |s|·(|v| + 128) */
                    const float tol = wd.bias ? 4 * FLT_EPSILON * (fabsf(s) * (float)(abs(v[i]) + 128) + fabsf(b) + fabsf(want)) : 0.0f;
                    if (!(fabsf(got - want) <= tol))
                        fail_msg("%s: row %d col %d widened %g, CPU value %g", cfg_name(c, name, sizeof name), r, i, got, want);
                }
            }
            free(v), free(sc), free(bi);
        }
        free(src);
        free_mat(&t);
    }
    assert_int_equal(widened, 6 + 15 + 2); /* 6 GGUF types, MLX 2/3/5/6/7 x 3 groups, QAT 2-bit x 2 */
}

static void test_dot_f32(void **state) {
    (void)state;
    float a[300], b[300];
    fill(a, 300);
    fill(b, 300);
    for (int n = 0; n <= 300; n += 1 + n / 7) {
        float ref = g4_dot_f32_isa(G4_ISA_SCALAR, a, b, n);
        double exact = 0;
        for (int i = 0; i < n; i++) exact += (double)a[i] * b[i];
        assert_true(fabs(ref - exact) <= 1e-5 * (1 + fabs(exact)) * (1 + n / 16.0));
        for (int isa = G4_ISA_AVX2; isa <= (int)g4_isa_best(); isa++) {
            float v = g4_dot_f32_isa((g4_isa)isa, a, b, n);
            if (memcmp(&v, &ref, sizeof v)) fail_msg("dot_f32 n=%d %s: %.9g vs %.9g", n, g4_isa_name((g4_isa)isa), v, ref);
        }
        assert_true(g4_dot_f32(a, b, n) == ref);
    }
    /* dot_bf16 / dot_f16 follow the same order */
    uint16_t wb[300], wh[300];
    float bb[300], bh[300];
    for (int i = 0; i < 300; i++) {
        wb[i] = g4_f32_to_bf16(b[i]);
        wh[i] = g4_f32_to_f16(b[i]);
        bb[i] = g4_bf16_to_f32(wb[i]);
        bh[i] = g4_f16_to_f32(wh[i]);
    }
    assert_true(g4_dot_bf16(a, wb, 300) == g4_dot_f32_isa(G4_ISA_SCALAR, a, bb, 300));
    assert_true(g4_dot_f16(a, wh, 300) == g4_dot_f32_isa(G4_ISA_SCALAR, a, bh, 300));
}

static void test_validate(void **state) {
    (void)state;
    uint8_t buf[64] = {0};
    float sc[4] = {1, 1, 1, 1};
    g4_mat m = {0};
    m.type = G4_W_Q4_K;
    m.rows = 1;
    m.cols = 128; /* not a multiple of 256 */
    m.data = buf;
    m.row_bytes = 144;
    g4_error err;
    assert_int_equal(g4_mat_validate(&m, &err), G4_ERR_TENSOR);
    m.type = G4_W_AFFINE;
    m.bits = 4;
    m.group = 48;
    m.row_bytes = 64;
    m.scales = m.biases = sc;
    m.scale_dtype = G4_DT_F32;
    m.scale_stride = 4;
    assert_int_equal(g4_mat_validate(&m, &err), G4_ERR_TENSOR);
    m.group = 32;
    assert_int_equal(g4_mat_validate(&m, &err), G4_OK);
    m.bits = 9;
    assert_int_equal(g4_mat_validate(&m, &err), G4_ERR_TENSOR);
    assert_int_equal(g4_wtype_row_bytes(G4_W_SYMM, 64, 3), 0);
    assert_int_equal(g4_wtype_row_bytes(G4_W_AFFINE, 64, 3), 24);
    assert_int_equal(g4_wtype_row_bytes(G4_W_Q6_K, 512, 0), 420);
    assert_int_equal(g4_wtype_row_bytes(G4_W_Q5_1, 64, 0), 48);
}

static void test_bandwidth(void **state) {
    (void)state;
    g4_error err;
    double gbs = 0;
    /* small and quick: this only checks the function runs and reports something plausible */
    assert_int_equal(g4_measure_read_bandwidth(1, (size_t)16 << 20, 2, &gbs, &err), G4_OK);
    assert_true(gbs > 0.1 && gbs < 10000);
}


static int argmax_ref(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy's pick at every ISA level: the scalar loop's index on random rows of awkward lengths,
 * with ties (the lowest index wins), NaNs (never win, except at x[0]), signed zeros and
 * infinities, the maximum in the vector part, in the tail and at the ends. */
static void test_argmax(void **state) {
    (void)state;
    enum { N = 262144 + 37 };
    float *x = malloc(sizeof(float) * N);
    assert_non_null(x);
    g4_isa best = g4_isa_best();
    const int lens[] = {0, 1, 2, 3, 15, 16, 17, 31, 33, 100, 1000, 4099, N};
    for (int trial = 0; trial < 12; trial++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int n = lens[li];
            for (int i = 0; i < n; i++) {
                /* trials 0-3: few distinct values (many ties); then continuous values */
                x[i] = trial < 4 ? (float)(int)(grand() * 2.0f) : grand() * 10.0f;
            }
            if (n > 0) {
                switch (trial % 6) {
                case 1: x[0] = NAN; break;                                       /* NaN first: 0 */
                case 2: for (int i = 0; i < n; i += 3) x[i] = NAN; break;        /* NaNs never win */
                case 3: x[n - 1] = INFINITY; if (n > 2) x[n / 2] = INFINITY; break;
                case 4: for (int i = 0; i < n; i++) x[i] = i % 2 ? 0.0f : -0.0f; break; /* signed zeros tie */
                case 5: for (int i = 0; i < n; i++) x[i] = -INFINITY; if (n > 5) x[n - 3] = -1e30f; break;
                default: break;
                }
            }
            const int want = argmax_ref(x, n);
            for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++) {
                const int got = g4_argmax_isa((g4_isa)isa, x, n);
                if (got != want) fail_msg("argmax isa %d, n %d, trial %d: %d, want %d", isa, n, trial, got, want);
            }
            assert_int_equal(g4_argmax(x, n), want);
        }
    free(x);
}

/* The element-wise kernels: every ISA level gives the scalar bits, and the values stay close to
 * libm's (the forward's tolerance against the reference rests on this). */
static void test_act(void **state) {
    (void)state;
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N),
          *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        x[i] = grand() * (i % 7 == 0 ? 40.0f : 3.0f);
        u[i] = grand();
    }
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 200.0f, x[3] = -200.0f, x[4] = 1e-30f;
    g4_isa best = g4_isa_best();
    /* gelu ⊙ up */
    memcpy(ref, x, sizeof(float) * N);
    g4_gelu_mul_isa(G4_ISA_SCALAR, ref, u, N);
    for (int i = 0; i < N; i++) {
        double z = 0.7978845608028654 * (x[i] + 0.044715 * (double)x[i] * x[i] * x[i]);
        double g = x[i] / (1 + exp(-2 * z)); /* = 0.5·x·(1 + tanh z), without tanh's cancellation */
        /* a few ulp, plus the float rounding of z magnified by e^(-2z) where gelu is tiny */
        double tol = (5e-7 + 2.4e-7 * fabs(2 * z)) * fabs(g * u[i]) + 1e-30; /* e^x is clamped at x = 88 */
        if (!(fabs(ref[i] - g * u[i]) <= tol)) fail_msg("gelu(%.9g) * %.9g = %.9g, want %.9g", x[i], u[i], ref[i], g * u[i]);
    }
    for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++)
        for (int n = 0; n <= 40; n += 13) {
            memcpy(y, x, sizeof(float) * N);
            g4_gelu_mul_isa((g4_isa)isa, y + n, u + n, (size_t)(N - n));
            assert_memory_equal(y + n, ref + n, sizeof(float) * (N - n));
        }
    /* softcap */
    memcpy(ref, x, sizeof(float) * N);
    g4_softcap_isa(G4_ISA_SCALAR, ref, N, 30.0f);
    for (int i = 0; i < N; i++) assert_true(fabs(ref[i] - 30.0 * tanh(x[i] / 30.0)) <= 4e-6);
    for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++) {
        memcpy(y, x, sizeof(float) * N);
        g4_softcap_isa((g4_isa)isa, y, N, 30.0f);
        assert_memory_equal(y, ref, sizeof(float) * N);
    }
    /* QAT activation fake-quantisation: ties to even, clamps, signed zeros, NaN, every ISA bitwise */
    {
        const float sc = 0.0371f;
        float *v = malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++) {
            switch (i % 6) {
            case 0: v[i] = ((float)(i % 300) - 150.0f + 0.5f) * sc; break; /* ties (up to float rounding) */
            case 1: v[i] = -0.3f * sc * (float)(i % 3); break;             /* small negatives, -0.0 */
            case 2: v[i] = x[i] * 40.0f; break;                            /* beyond the clamps */
            default: v[i] = x[i]; break;
            }
        }
        v[5] = NAN, v[11] = -NAN, v[17] = INFINITY, v[23] = -INFINITY, v[29] = 1e30f, v[35] = -1e30f;
        for (int i = 0; i < N; i++) ref[i] = g4_fake_quant1(v[i], sc);
        for (int i = 0; i < N; i++)
            if (!isnan(v[i])) {
                double q = nearbyint((double)(v[i] / sc));
                q = q < -128 ? -128 : q > 127 ? 127 : q;
                assert_true(ref[i] == (float)(q * sc));
            }
        for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++)
            for (int n = 0; n <= 40; n += 13) {
                g4_fake_quant_isa((g4_isa)isa, y + n, v + n, (size_t)(N - n), sc);
                assert_memory_equal(y + n, ref + n, sizeof(float) * (N - n));
                memcpy(y, v, sizeof(float) * N); /* in place */
                g4_fake_quant_isa((g4_isa)isa, y, y, N, sc);
                assert_memory_equal(y, ref, sizeof(float) * N);
            }
        free(v);
    }
    /* e^(x - m) and its sum, axpy */
    float m = 0;
    for (int i = 0; i < N; i++) m = x[i] > m ? x[i] : m;
    float sref = g4_exp_sum_isa(G4_ISA_SCALAR, x, m, ref, N);
    double sd = 0;
    for (int i = 0; i < N; i++) {
        double e = exp((double)x[i] - m);
        assert_true(fabs(ref[i] - e) <= 4e-7 * e + 1e-37);
        sd += e;
    }
    assert_true(fabs(sref - sd) <= 1e-5 * sd);
    for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++)
        for (int n = 1; n < 40; n += 7) {
            float sv = g4_exp_sum_isa((g4_isa)isa, x, m, y, n);
            float sr = g4_exp_sum_isa(G4_ISA_SCALAR, x, m, ref, n);
            assert_memory_equal(y, ref, sizeof(float) * n);
            assert_memory_equal(&sv, &sr, sizeof sv);
        }
    for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++) {
        memcpy(y, u, sizeof(float) * N);
        memcpy(ref, u, sizeof(float) * N);
        g4_axpy_isa((g4_isa)isa, y, 0.37f, x, N);
        for (int i = 0; i < N; i++) ref[i] = fmaf(0.37f, x[i], ref[i]);
        assert_memory_equal(y, ref, sizeof(float) * N);
    }
    /* the weighted sum of V rows: bitwise a run of axpy calls */
    for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++)
        for (int d = 1; d < 700; d += d < 200 ? 37 : 131) { /* up to 2 blocks of 256 and tails */
            int nk = 1 + d % 5;
            memset(y, 0, sizeof(float) * d);
            memset(ref, 0, sizeof(float) * d);
            g4_avsum_isa((g4_isa)isa, y, u, x, (size_t)d + 3, nk, d);
            for (int k = 0; k < nk; k++) g4_axpy_isa(G4_ISA_SCALAR, ref, u[k], x + (size_t)k * (d + 3), d);
            assert_memory_equal(y, ref, sizeof(float) * d);
        }
    /* several heads over the same V rows (runs of 4 and what is left): bitwise one avsum per head;
     * with bf16 V rows (the bf16 KV cache) bitwise the float version on the widened rows */
    uint16_t *vb = malloc(sizeof(uint16_t) * N);
    float *vf = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) vf[i] = g4_bf16_to_f32(vb[i] = g4_f32_to_bf16(x[i]));
    for (int isa = G4_ISA_SCALAR; isa <= (int)best; isa++)
        for (int nh = 1; nh <= 9; nh++)
            for (int d = 1; d < 300; d += d < 100 ? 29 : 97)
                for (int bf = 0; bf < 2; bf++) {
                    int nk = 1 + (d + nh) % 5;
                    size_t ys = (size_t)d + 5;
                    memset(y, 0, sizeof(float) * ys * 9);
                    memset(ref, 0, sizeof(float) * ys * 9);
                    if (bf) {
                        g4_avsum_heads_bf16_isa((g4_isa)isa, y, ys, u, 7, nh, vb, (size_t)d + 3, nk, d);
                        g4_avsum_heads_isa(G4_ISA_SCALAR, ref, ys, u, 7, nh, vf, (size_t)d + 3, nk, d);
                    } else {
                        g4_avsum_heads_isa((g4_isa)isa, y, ys, u, 7, nh, x, (size_t)d + 3, nk, d);
                        for (int h = 0; h < nh; h++)
                            g4_avsum_isa(G4_ISA_SCALAR, ref + h * ys, u + 7 * h, x, (size_t)d + 3, nk, d);
                    }
                    assert_memory_equal(y, ref, sizeof(float) * ys * 9);
                }
    free(vb);
    free(vf);
    free(x);
    free(u);
    free(ref);
    free(y);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_stream_pack),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_dot_f32),
        cmocka_unit_test(test_matmul_exactness),
        cmocka_unit_test(test_threads_and_views),
        cmocka_unit_test(test_full_range_codes),
        cmocka_unit_test(test_widen),
        cmocka_unit_test(test_bandwidth),
        cmocka_unit_test(test_act),
        cmocka_unit_test(test_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
