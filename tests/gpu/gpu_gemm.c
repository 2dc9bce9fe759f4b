/* The fast prefill's kernels on their own, on a GPU: the prefill GEMM (src/cuda/pgemm.cu,
 * g4_cuda_pgemm; bf16 and per-channel 4-bit weights, each in both its variants, the mma.sync
 * kernel and the wgmma one of pgemm_wg.cu) and the prefill attention (src/cuda/pattn.cu,
 * g4_cuda_pattn; the tensor-core kernel, whole or in key partitions, and the SIMT one):
 *   check   random inputs of awkward shapes against a double-precision reference (within the f32
 *           accumulation bound), and M-invariance: the same tokens computed in blocks of other
 *           sizes, at other places in the token tiles, give the same bits (each variant against
 *           itself);
 *   bench   (--bench) every matmul shape of an E2B layer at M = 512 and 2048 tokens, per weight
 *           type and variant: time, bf16 product rate, and E2B's matmul time per prompt token
 *           summed over its 35 layers; then E2B's attention layers for such a chunk after 128
 *           tokens, per attention variant.
 * usage: gpu_gemm [--bench]          exit 1 when a check fails */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "g4.h"

#ifdef G4_HAVE_CUDA
#include "cuda/cuda.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static uint16_t bf16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* x [M][K] -> three bf16 planes [3][M][K], x = h + mid + l (each the bf16 of what is left) */
static void split_terms(const float *x, int M, int K, uint16_t *t) {
    const size_t n = (size_t)M * K;
    for (size_t i = 0; i < n; i++) {
        float r = x[i];
        for (int j = 0; j < 3; j++) {
            t[j * n + i] = bf16_rn(r);
            r = r - bf16_f(t[j * n + i]);
        }
    }
}

/* weights of a type: wt 2 bf16 rows; wt 4 per-channel signed 4-bit rows (codes, then an f32 scale),
 * with wf[r·K + k] the weight each element stands for */
typedef struct {
    uint8_t *rows;
    long long rb;
    int sc_off;
    float *wf;
} wmat;
static wmat make_weights(int wt, int N, int K) {
    wmat m = {0};
    m.wf = malloc(sizeof(float) * (size_t)N * K);
    if (wt == 2) {
        m.rb = 2LL * K;
        m.rows = malloc((size_t)N * m.rb);
        for (size_t i = 0; i < (size_t)N * K; i++) {
            const uint16_t h = bf16_rn((float)(urand() * 2 - 1) * 0.05f);
            memcpy(m.rows + 2 * i, &h, 2);
            m.wf[i] = bf16_f(h);
        }
    } else {
        m.sc_off = K / 2;
        m.rb = (K / 2 + 4 + 15) / 16 * 16;
        m.rows = calloc((size_t)N, (size_t)m.rb);
        for (int r = 0; r < N; r++) {
            uint8_t *row = m.rows + (size_t)r * m.rb;
            const float sc = (float)(0.001 + urand() * 0.02);
            memcpy(row + m.sc_off, &sc, 4);
            for (int k = 0; k < K; k++) {
                const int q = (int)(urand() * 16);
                row[k / 2] |= (uint8_t)(q << (4 * (k & 1)));
                m.wf[(size_t)r * K + k] = sc * (float)(q - 8);
            }
        }
    }
    return m;
}

/* the kernel a variant of g4_cuda_pgemm names */
static const char *variant_name(int wt, int variant) {
    if (wt == 2) return variant ? "bf16 wgmma" : "bf16 mma  ";
    return variant ? "q4   wgmma" : "q4   mma  ";
}

/* one checked shape with one kernel variant (0 mma.sync, 1 wgmma): returns the number of failures */
static int check_shape(int wt, int variant, int M, int N, int K) {
    float *x = malloc(sizeof(float) * (size_t)M * K), *y = malloc(sizeof(float) * (size_t)M * N);
    uint16_t *t = malloc(2 * 3 * (size_t)M * K);
    int fails = 0;
    wmat w = make_weights(wt, N, K);
    for (int m = 0; m < M; m++) { /* rows of different magnitudes, some outliers */
        const double mag = pow(2.0, (int)(urand() * 12) - 6);
        for (int k = 0; k < K; k++) x[(size_t)m * K + k] = (float)((urand() * 2 - 1) * mag * (urand() < 0.01 ? 30 : 1));
    }
    split_terms(x, M, K, t);
    g4_error err = {0};
    if (g4_cuda_pgemm(t, w.rows, wt, w.rb, w.sc_off, M, N, K, variant, y, 0, NULL, &err)) {
        printf("FAIL %s M %d N %d K %d: %s\n", variant_name(wt, variant), M, N, K, err.message);
        fails = 1;
        goto done;
    }
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int r = 0; r < N; r++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double p = (double)w.wf[(size_t)r * K + k] * x[(size_t)m * K + k];
                ref += p;
                mag += fabs(p);
            }
            const double e = fabs(y[(size_t)m * N + r] - ref), bound = (K + 8) * ldexp(1.0, -24) * mag + 1e-30;
            if (!(e <= bound)) {
                if (fails < 5)
                    printf("FAIL %s M %d N %d K %d: y[%d][%d] = %.9g, reference %.9g (bound %.3g)\n", variant_name(wt, variant), M,
                           N, K, m, r, y[(size_t)m * N + r], ref, bound);
                fails++;
            }
            if (mag > 0 && e / mag > worst) worst = e / mag;
        }
    /* M-invariance: blocks of 1, 7 and 45 tokens taken from several places give the same bits */
    const int sub[][2] = {{0, 1}, {M - 1, 1}, {0, 7}, {M / 2, 7}, {M > 45 ? M - 45 : 0, M > 45 ? 45 : M}};
    int same = 1;
    for (size_t s = 0; s < sizeof sub / sizeof sub[0]; s++) {
        const int m0 = sub[s][0], ms = sub[s][1] <= M - m0 ? sub[s][1] : M - m0;
        uint16_t *ts = malloc(2 * 3 * (size_t)ms * K);
        float *ys = malloc(sizeof(float) * (size_t)ms * N);
        for (int j = 0; j < 3; j++)
            memcpy(ts + (size_t)j * ms * K, t + (size_t)j * M * K + (size_t)m0 * K, 2 * (size_t)ms * K);
        if (g4_cuda_pgemm(ts, w.rows, wt, w.rb, w.sc_off, ms, N, K, variant, ys, 0, NULL, &err)) {
            printf("FAIL %s M %d N %d K %d (block of %d): %s\n", variant_name(wt, variant), M, N, K, ms, err.message);
            fails++;
        } else if (memcmp(ys, y + (size_t)m0 * N, sizeof(float) * (size_t)ms * N)) {
            printf("FAIL %s M %d N %d K %d: tokens %d..%d alone differ from the %d-token block\n", variant_name(wt, variant), M,
                   N, K, m0, m0 + ms - 1, M);
            fails++;
            same = 0;
        }
        free(ts);
        free(ys);
    }
    printf("%s %s M %4d N %5d K %5d: worst error %.2e of sum|w·x| (bound %.2e), sub-blocks %s\n", fails ? "FAIL" : "ok  ",
           variant_name(wt, variant), M, N, K, worst, (K + 8) * ldexp(1.0, -24), same ? "bitwise equal" : "DIFFER");
done:
    free(x);
    free(y);
    free(w.rows);
    free(w.wf);
    free(t);
    return fails;
}

/* E2B's matmuls per layer kind (model doc §1): {N, K, layers} */
static const struct {
    const char *name;
    int N, K, layers;
} e2b[] = {
    {"q/k/v sliding (layers 0-14)", 2560, 1536, 12},
    {"q sliding (KV-shared)", 2048, 1536, 16},
    {"q/k/v full (4, 9, 14)", 5120, 1536, 3},
    {"q full (KV-shared)", 4096, 1536, 4},
    {"o sliding", 1536, 2048, 28},
    {"o full", 1536, 4096, 7},
    {"gate/up 6144 (0-14)", 12288, 1536, 15},
    {"gate/up 12288 (15-34)", 24576, 1536, 20},
    {"down 6144", 1536, 6144, 15},
    {"down 12288", 1536, 12288, 20},
    {"PLE gate", 256, 1536, 35},
    {"PLE projection", 1536, 256, 35},
};

static int bench(void) {
    const int Ms[] = {512, 2048};
    for (int wt = 2; wt <= 4; wt += 2)
    for (int variant = 0; variant <= 1; variant++) /* mma.sync and wgmma */
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int M = Ms[mi];
        double total_ms = 0, flops = 0;
        printf("\nE2B matmul shapes, %s weights, %s kernel (variant %d), at M = %d tokens (one launch each, mean of 20):\n",
               wt == 2 ? "bf16" : "per-channel 4-bit", variant ? "wgmma" : "mma.sync", variant, M);
        for (size_t i = 0; i < sizeof e2b / sizeof e2b[0]; i++) {
            const int N = e2b[i].N, K = e2b[i].K;
            uint16_t *t = malloc(2 * 3 * (size_t)M * K);
            wmat w = make_weights(wt, N, K);
            float *y = malloc(sizeof(float) * (size_t)M * N);
            for (size_t j = 0; j < 3 * (size_t)M * K; j++) t[j] = bf16_rn((float)(urand() - 0.5));
            double ms = 0;
            g4_error err = {0};
            if (g4_cuda_pgemm(t, w.rows, wt, w.rb, w.sc_off, M, N, K, variant, y, 20, &ms, &err)) {
                printf("bench: %s\n", err.message);
                return 1;
            }
            const double f = 2.0 * M * N * K;
            printf("  %-28s N %5d K %5d: %8.1f us  %6.1f TFLOP/s (x3 terms: %6.1f of bf16 products)\n", e2b[i].name, N, K, ms * 1e3,
                   f / (ms * 1e-3) / 1e12, 3 * f / (ms * 1e-3) / 1e12);
            total_ms += ms * e2b[i].layers;
            flops += f * e2b[i].layers;
            free(t);
            free(w.rows);
            free(w.wf);
            free(y);
        }
        printf("  E2B, all 35 layers' matmuls for %d tokens: %.2f ms = %.1f us per token -> %.0f tok/s (matmuls only), %.1f TFLOP/s\n", M,
               total_ms, total_ms * 1e3 / M, M / (total_ms * 1e-3), flops / (total_ms * 1e-3) / 1e12);
    }
    return 0;
}


/* ---- the prefill attention ---- */

typedef struct {
    int nH, nkv, d, is_full, window, pos0, M, kb; /* kb: the variant (g4_cuda_pattn: 0 tensor cores, 1 tensor cores in
                                                     4 key partitions and a merge, 32 or 64 SIMT) */
} attn_shape;

/* whether kb = 0 and kb = 1 get the tensor cores for heads d wide (pattn.cu g4c_pattn_launch's
 * rule: d a multiple of 16 up to 128, of 32 up to 256, of 64 up to 512; else the SIMT kernel) */
static int attn_tc(int d) { return d % 16 == 0 && (d <= 128 || (d <= 256 ? d % 32 == 0 : d <= 512 && d % 64 == 0)); }
static const char *attn_variant(int kb, int d) {
    if (kb == 1) return attn_tc(d) ? "tc, 4 key partitions" : "kb 1: SIMT fallback";
    return kb == 64 ? "SIMT, 64-key blocks" : kb ? "SIMT, 32-key blocks" : attn_tc(d) ? "tensor cores" : "kb 0: SIMT fallback";
}

/* positions 0 .. pos0 + M - 1: q of the block's tokens, k and v of every position; uniform in
 * [-1, 1] (scores of a 512-wide head spread over ~±20: a sharp softmax) */
static void attn_data(const attn_shape *a, float **q, float **k, float **v) {
    const size_t nq = (size_t)a->M * a->nH * a->d, nk = (size_t)(a->pos0 + a->M) * a->nkv * a->d;
    *q = malloc(sizeof(float) * nq);
    *k = malloc(sizeof(float) * nk);
    *v = malloc(sizeof(float) * nk);
    for (size_t i = 0; i < nq; i++) (*q)[i] = (float)(2 * urand() - 1);
    for (size_t i = 0; i < nk; i++) (*k)[i] = (float)(2 * urand() - 1);
    for (size_t i = 0; i < nk; i++) (*v)[i] = (float)(2 * urand() - 1);
}

static int check_attn(const attn_shape *a) {
    float *q, *k, *v;
    attn_data(a, &q, &k, &v);
    const int nH = a->nH, d = a->d, row = a->nkv * d, group = nH / a->nkv;
    const size_t nq = (size_t)a->M * nH * d;
    float *att = malloc(sizeof(float) * nq), *sub = malloc(sizeof(float) * nq);
    double *sc = malloc(sizeof(double) * (size_t)(a->pos0 + a->M));
    g4_error err = {0};
    int fails = 0;
    if (g4_cuda_pattn(q, k, v, a->pos0, a->M, nH, a->nkv, d, a->is_full, a->window, a->kb, att, 0, NULL, &err)) {
        printf("FAIL attention: %s\n", err.message);
        fails = 1;
        goto done;
    }
    double worst = 0;
    for (int m = 0; m < a->M; m++)
        for (int h = 0; h < nH; h++) {
            const int pq = a->pos0 + m, lo = a->is_full ? 0 : (pq - a->window + 1 > 0 ? pq - a->window + 1 : 0);
            const float *qr = q + ((size_t)m * nH + h) * d;
            double mx = -INFINITY, sum = 0;
            for (int j = lo; j <= pq; j++) {
                const float *kr = k + (size_t)j * row + (size_t)(h / group) * d;
                double s = 0;
                for (int e = 0; e < d; e++) s += (double)qr[e] * kr[e];
                sc[j] = s;
                mx = s > mx ? s : mx;
            }
            for (int j = lo; j <= pq; j++) sum += exp(sc[j] - mx);
            for (int e = 0; e < d; e++) {
                double o = 0;
                for (int j = lo; j <= pq; j++) o += exp(sc[j] - mx) / sum * v[(size_t)j * row + (size_t)(h / group) * d + e];
                const double err1 = fabs(o - att[((size_t)m * nH + h) * d + e]);
                if (!(err1 <= worst)) worst = err1; /* NaN sticks */
            }
        }
    /* the same tokens in blocks of 1 (the first 3), 7 and 64, each launch with the positions
     * before it served from the cache */
    for (size_t i = 0; i < nq; i++) sub[i] = NAN;
    const int blocks[] = {1, 1, 1, 7, 64};
    int at = 0, bi = 0;
    while (at < a->M && !fails) {
        int n = blocks[bi < 4 ? bi : 4];
        if (bi < 4) bi++;
        if (at + n > a->M) n = a->M - at;
        if (g4_cuda_pattn(q + (size_t)at * nH * d, k, v, a->pos0 + at, n, nH, a->nkv, d, a->is_full, a->window, a->kb,
                          sub + (size_t)at * nH * d, 0, NULL, &err)) {
            printf("FAIL attention blocks: %s\n", err.message);
            fails = 1;
        }
        at += n;
    }
    const int same = !fails && !memcmp(sub, att, sizeof(float) * nq);
    /* SIMT (all f32): within f32 rounding of the double reference: a score's error is at most
     * ~d·2^-24 (each |q·k| term <= 1), a weight's relative error that much, an output (|v| <= 1)
     * the same: 4x that.
     * Tensor cores (fp16 hi/lo splits, f32 accumulation): x = hi + lo + e with |e| <= 2^-22 |x|
     * (lo rounded to 11 bits of a term already <= 2^-11 |x|), or |e| <= 2^-25 where lo is an fp16
     * subnormal; with the dropped lo·lo product (<= 2^-22 |q_e k_e|) a product q_e·k_e is computed
     * within 3·2^-22 |q_e k_e| + 2^-24 (|q_e| + |k_e|) (the subnormal term rounded up, once per
     * element). This data is uniform in [-1, 1]: mean |q_e k_e| = 1/4, mean |q_e| + |k_e| = 1, so
     * summed over the head's d elements as if all of one sign, d·(3·2^-24 + 2^-24); the f32
     * accumulation adds at most ~d·2^-24 as in the SIMT bound: a score within 5·d·2^-24. An output
     * (|v| <= 1) moves by at most twice its scores' error (the weights are renormalised:
     * sum_j w_j (ds_j - sum_i w_i ds_i) v_j): 10·d·2^-24 = 6.0e-7·d. The weights' and values' own
     * splits (3·2^-22 relative on each product p·v, |o| <= 1) and the weight and sum roundings add
     * ~2e-6: bound 6e-7·d + 3e-6 (d 256: 1.6e-4, 512: 3.1e-4). Lo terms missing (q or k as plain
     * fp16: ~2^-12 relative per element) give output errors ~1e-3 at d 256 and 512: far outside.
     * kb = 1 (the same products in 4 key partitions, merged): the merge's weights expf(m_j - m) and
     * its sums add a few f32 roundings (~2^-22 relative of outputs <= 1): the same bound. */
    const int tc = (a->kb == 0 || a->kb == 1) && attn_tc(d);
    const double bound = tc ? 6e-7 * d + 3e-6 : 2.4e-7 * d + 1e-6;
    if (!(worst <= bound) || !same) fails = 1;
    printf("%s attention %2d heads / %2d KV, d %3d, %s, pos %3d + %3d tokens (%-20s): worst error %.2e (bound %.1e), blocks 1/7/64 %s\n",
           fails ? "FAIL" : "ok  ", nH, a->nkv, d, a->is_full ? "full   " : "sliding", a->pos0, a->M, attn_variant(a->kb, d), worst,
           bound, same ? "bitwise identical" : "DIFFER");
done:
    free(q);
    free(k);
    free(v);
    free(att);
    free(sub);
    free(sc);
    return fails;
}

static int bench_attn(void) {
    const int Ms[] = {512, 2048};
    /* the variants: the tensor cores (the session's), the tensor cores in 4 key partitions (kb 1:
     * both launches, the partitions' and the merge's) and the SIMT kernel in 32-key blocks, each
     * over E2B's 28 sliding layers (256-wide heads, window 512) and 7 full ones (512-wide); the SIMT
     * kernel's 64-key blocks for the sliding layers only, for comparison (no total) */
    const int kbs[4] = {0, 1, 32, 64};
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int M = Ms[mi];
        printf("\nE2B attention for %d tokens after 128 (one launch each, mean of 10):\n", M);
        for (int vi = 0; vi < 4; vi++) {
            const int kb = kbs[vi];
            const attn_shape kinds[2] = {{8, 1, 256, 0, 512, 128, M, kb}, {8, 1, 512, 1, 0, 128, M, kb}};
            const int layers[2] = {28, 7}, nk = kb == 64 ? 1 : 2;
            double total = 0, flops = 0;
            for (int i = 0; i < nk; i++) {
                float *q, *k, *v;
                attn_data(&kinds[i], &q, &k, &v);
                float *att = malloc(sizeof(float) * (size_t)M * 8 * kinds[i].d);
                double ms = 0, f = 0;
                g4_error err = {0};
                if (g4_cuda_pattn(q, k, v, 128, M, 8, 1, kinds[i].d, kinds[i].is_full, kinds[i].window, kb, att, 10, &ms, &err)) {
                    printf("bench: %s\n", err.message);
                    return 1;
                }
                for (int m = 0; m < M; m++) {
                    const int pq = 128 + m, keys = kinds[i].is_full || pq < kinds[i].window ? pq + 1 : kinds[i].window;
                    f += 4.0 * kinds[i].d * 8 * keys;
                }
                printf("  %-20s %-8s d %3d: %8.1f us  %6.1f TFLOP/s of scores and sums\n", attn_variant(kb, kinds[i].d),
                       kinds[i].is_full ? "full" : "sliding", kinds[i].d, ms * 1e3, f / (ms * 1e-3) / 1e12);
                total += ms * layers[i];
                flops += f * layers[i];
                free(q);
                free(k);
                free(v);
                free(att);
            }
            if (nk == 2)
                printf("  %-20s E2B, all 35 layers' attention for %d tokens: %.2f ms = %.1f us per token, %.1f TFLOP/s\n",
                       attn_variant(kb, 256), M, total, total * 1e3 / M, flops / (total * 1e-3) / 1e12);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench() || bench_attn();
    /* {M, N, K}; K segments and chunks (64 columns; the wgmma kernel takes 4-bit rows' full chunks
     * two at a time): K 32 one half chunk; 96 one full chunk and a half; 224 three full and a half;
     * 192 three full; 1056 two segments of 8 full (the second and a half); 1216 two segments of 9
     * full and a half */
    const int shapes[][3] = {{1, 16, 32},     {3, 200, 96},     {130, 130, 64}, {300, 257, 1536}, {257, 1536, 2048},
                             {64, 24576, 256}, {70, 256, 1056}, {45, 300, 224}, {129, 70, 192},   {33, 300, 1216}};
    int fails = 0;
    for (int wt = 2; wt <= 4; wt += 2)
        for (int variant = 0; variant <= 1; variant++) /* mma.sync and wgmma */
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
                fails += check_shape(wt, variant, shapes[i][0], shapes[i][1], shapes[i][2]);
    uint16_t z = 0;
    float yz;
    g4_error err = {0};
    if (g4_cuda_pgemm(&z, &z, 2, 96, 0, 1, 1, 48, 0, &yz, 0, NULL, &err) != G4_ERR_ARG) {
        printf("FAIL: K = 48 was not refused\n");
        fails++;
    } else
        printf("ok   K = 48 refused: %s\n", err.message);
    for (int variant = 0; variant <= 1; variant++) {
        if (g4_cuda_pgemm(&z, &z, 4, 32, 8, 1, 1, 64, variant, &yz, 0, NULL, &err) != G4_ERR_ARG) {
            printf("FAIL: a 4-bit scale inside the codes was not refused (variant %d)\n", variant);
            fails++;
        } else
            printf("ok   scale offset inside the codes refused (variant %d): %s\n", variant, err.message);
    }
    if (g4_cuda_pgemm(&z, &z, 4, 48, 32, 1, 1, 64, 2, &yz, 0, NULL, &err) != G4_ERR_ARG) {
        printf("FAIL: variant 2 was not refused\n");
        fails++;
    } else
        printf("ok   variant 2 refused: %s\n", err.message);
    /* kb 0: each shape for three variants, the tensor cores (kb 0), the tensor cores in key
     * partitions (kb 1; where d is not one the tensor cores take, the same SIMT fallback as kb 0)
     * and the SIMT kernel (kb 32) */
    const attn_shape as[] = {
        {8, 1, 256, 0, 512, 130, 300, 0},   /* E2B sliding */
        {8, 1, 256, 0, 512, 130, 300, 64},  /* the same in the SIMT kernel's 64-key blocks */
        {8, 1, 512, 1, 0, 130, 300, 0},     /* E2B full */
        {8, 2, 256, 0, 64, 100, 200, 0},    /* E4B-like heads, a window the block overruns (ring cache) */
        {32, 16, 256, 0, 100, 37, 150, 0},  /* 31B sliding heads, a window not a multiple of the key block */
        {32, 16, 256, 0, 100, 37, 600, 0},  /* the same over 600 tokens: 64-row tiles (the blocks: 32) */
        {32, 4, 512, 1, 0, 60, 100, 0},     /* 31B full heads: 512 wide, 8 per KV head, 4 KV heads */
        {4, 2, 16, 0, 8, 0, 70, 0},         /* the fixtures' heads, from position 0 */
        {16, 1, 128, 1, 0, 5, 33, 0},       /* 16 query heads per KV head */
        {6, 2, 48, 0, 24, 5, 45, 0},        /* 3 heads per KV head (a tile of 30 rows), 48 wide: 3 k-steps */
        {8, 4, 160, 1, 0, 17, 40, 0},       /* 160 wide: two slices of 80 */
        {4, 1, 36, 1, 0, 3, 40, 0},         /* 36 wide: no tensor-core instantiation (kb 0 falls back) */
        {32, 1, 256, 0, 40, 3, 50, 0},      /* 32 heads per KV head: 64-row tiles at any M (2 tokens) */
        {32, 1, 512, 1, 0, 9, 20, 0},       /* the same 512 wide: 32-row tiles (1 token) */
    };
    for (size_t i = 0; i < sizeof as / sizeof as[0]; i++) {
        attn_shape s = as[i];
        if (s.kb) {
            fails += check_attn(&s);
            continue;
        }
        fails += check_attn(&s);
        s.kb = 1;
        fails += check_attn(&s);
        s.kb = 32;
        fails += check_attn(&s);
    }
    {
        float z8[8] = {0}, a8[8]; /* 1 token, 2 heads of 4 on one KV head */
        if (g4_cuda_pattn(z8, z8, z8, 0, 1, 2, 1, 4, 1, 0, 16, a8, 0, NULL, &err) != G4_ERR_ARG) {
            printf("FAIL: attention variant kb = 16 was not refused\n");
            fails++;
        } else
            printf("ok   attention kb = 16 refused: %s\n", err.message);
    }
    printf("gpu_gemm: %s (%d failures)\n", fails ? "FAIL" : "all passed", fails);
    return fails ? 1 : 0;
}
#else
int main(void) {
    printf("gpu_gemm: built without CUDA\n");
    return 0;
}
#endif
