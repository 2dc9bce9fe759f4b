/* The prefill GEMM kernel on its own (src/cuda/pgemm.cu, g4_cuda_pgemm), on a GPU:
 *   check   random inputs of awkward shapes against a double-precision reference (within the f32
 *           accumulation bound), and M-invariance: the same tokens computed in blocks of other
 *           sizes, at other places in the token tiles, give the same bits;
 *   bench   (--bench) every matmul shape of an E2B layer at M = 512 and 2048 tokens: time, bf16
 *           product rate, and E2B's matmul time per prompt token summed over its 35 layers.
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

/* one checked shape: returns the number of failures */
static int check_shape(int wt, int M, int N, int K) {
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
    if (g4_cuda_pgemm(t, w.rows, wt, w.rb, w.sc_off, M, N, K, y, 0, NULL, &err)) {
        printf("FAIL M %d N %d K %d: %s\n", M, N, K, err.message);
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
                if (fails < 5) printf("FAIL M %d N %d K %d: y[%d][%d] = %.9g, reference %.9g (bound %.3g)\n", M, N, K, m, r, y[(size_t)m * N + r], ref, bound);
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
        if (g4_cuda_pgemm(ts, w.rows, wt, w.rb, w.sc_off, ms, N, K, ys, 0, NULL, &err)) {
            printf("FAIL M %d N %d K %d (block of %d): %s\n", M, N, K, ms, err.message);
            fails++;
        } else if (memcmp(ys, y + (size_t)m0 * N, sizeof(float) * (size_t)ms * N)) {
            printf("FAIL M %d N %d K %d: tokens %d..%d alone differ from the %d-token block\n", M, N, K, m0, m0 + ms - 1, M);
            fails++;
            same = 0;
        }
        free(ts);
        free(ys);
    }
    printf("%s %s M %4d N %5d K %5d: worst error %.2e of sum|w·x| (bound %.2e), sub-blocks %s\n", fails ? "FAIL" : "ok  ",
           wt == 2 ? "bf16" : "q4  ", M, N, K, worst, (K + 8) * ldexp(1.0, -24), same ? "bitwise equal" : "DIFFER");
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
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int M = Ms[mi];
        double total_ms = 0, flops = 0;
        printf("\nE2B matmul shapes, %s weights, at M = %d tokens (one launch each, mean of 20):\n",
               wt == 2 ? "bf16" : "per-channel 4-bit", M);
        for (size_t i = 0; i < sizeof e2b / sizeof e2b[0]; i++) {
            const int N = e2b[i].N, K = e2b[i].K;
            uint16_t *t = malloc(2 * 3 * (size_t)M * K);
            wmat w = make_weights(wt, N, K);
            float *y = malloc(sizeof(float) * (size_t)M * N);
            for (size_t j = 0; j < 3 * (size_t)M * K; j++) t[j] = bf16_rn((float)(urand() - 0.5));
            double ms = 0;
            g4_error err = {0};
            if (g4_cuda_pgemm(t, w.rows, wt, w.rb, w.sc_off, M, N, K, y, 20, &ms, &err)) {
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

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
    const int shapes[][3] = {{1, 16, 32}, {3, 200, 96}, {130, 130, 64}, {300, 257, 1536}, {257, 1536, 2048}, {64, 24576, 256}, {70, 256, 1056}};
    int fails = 0;
    for (int wt = 2; wt <= 4; wt += 2)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) fails += check_shape(wt, shapes[i][0], shapes[i][1], shapes[i][2]);
    uint16_t z = 0;
    float yz;
    g4_error err = {0};
    if (g4_cuda_pgemm(&z, &z, 2, 96, 0, 1, 1, 48, &yz, 0, NULL, &err) != G4_ERR_ARG) {
        printf("FAIL: K = 48 was not refused\n");
        fails++;
    } else
        printf("ok   K = 48 refused: %s\n", err.message);
    if (g4_cuda_pgemm(&z, &z, 4, 32, 8, 1, 1, 64, &yz, 0, NULL, &err) != G4_ERR_ARG) {
        printf("FAIL: a 4-bit scale inside the codes was not refused\n");
        fails++;
    } else
        printf("ok   scale offset inside the codes refused: %s\n", err.message);
    printf("gpu_gemm: %s (%d failures)\n", fails ? "FAIL" : "all passed", fails);
    return fails ? 1 : 0;
}
#else
int main(void) {
    printf("gpu_gemm: built without CUDA\n");
    return 0;
}
#endif
