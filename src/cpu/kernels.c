#include "cpu/kernels.h"

#include <math.h>
#include <string.h>

static const char *const wtype_names[G4_W_COUNT] = {
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "affine", "symmetric",
};

const char *g4_wtype_name(g4_wtype t) { return t < G4_W_COUNT ? wtype_names[t] : "?"; }

g4_wtype g4_wtype_of_dtype(g4_dtype t) {
    return t == G4_DT_F32 ? G4_W_F32 : t == G4_DT_F16 ? G4_W_F16 : t == G4_DT_BF16 ? G4_W_BF16 : G4_W_COUNT;
}

g4_mat g4_mat_dense(g4_dtype dtype, int rows, int cols, const void *data) {
    g4_mat m = {0};
    m.type = g4_wtype_of_dtype(dtype);
    m.rows = rows;
    m.cols = cols;
    m.data = data;
    m.row_bytes = (size_t)cols * g4_dtype_size(dtype);
    return m;
}

size_t g4_mat_bytes(const g4_mat *w) {
    size_t n = w->row_bytes * (size_t)w->rows;
    if (w->scales) n += (size_t)w->rows * w->scale_stride * g4_dtype_size(w->scale_dtype) * (w->biases ? 2 : 1);
    return n;
}

g4_mat g4_mat_rows(const g4_mat *w, int r0, int n) {
    g4_mat m = *w;
    m.rows = n;
    m.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    size_t so = (size_t)r0 * w->scale_stride * g4_dtype_size(w->scale_dtype);
    if (w->scales) m.scales = (const uint8_t *)w->scales + so;
    if (w->biases) m.biases = (const uint8_t *)w->biases + so;
    return m;
}

float g4_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (!man) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    union { uint32_t u; float f; } v = {u};
    return v.f;
}

uint16_t g4_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffff) > 0x7f800000) return (uint16_t)(v.u >> 16 | 0x40); /* quiet NaN */
    return (uint16_t)((v.u + 0x7fff + ((v.u >> 16) & 1)) >> 16);
}

uint16_t g4_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffff;
    if (a > 0x7f800000) return (uint16_t)(sign | 0x7e00);
    if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds to infinity */
    if (a < 0x38800000) {                                   /* subnormal or zero in f16 */
        float m = fabsf(f) * 16777216.0f;                    /* 2^24: units of the f16 ulp */
        return (uint16_t)(sign | (uint32_t)nearbyintf(m));
    }
    uint32_t r = a + 0xfff + ((a >> 13) & 1);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* The fixed reduction: lane j sums elements i with i % 16 == j in increasing i; the 16 lanes are
 * then folded 8+8, 4+4, 2+2, 1+1. SIMD versions must reproduce exactly this order. */
#define LANES 16
static inline float fold(float acc[LANES]) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

float g4_dot_f32(const float *a, const float *b, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i + j < n; j++) acc[j] += a[i + j] * b[i + j];
    return fold(acc);
}

float g4_dot_bf16(const float *x, const uint16_t *w, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * g4_bf16_to_f32(w[i + j]);
    for (int j = 0; i + j < n; j++) acc[j] += x[i + j] * g4_bf16_to_f32(w[i + j]);
    return fold(acc);
}

float g4_dot_f16(const float *x, const uint16_t *w, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * g4_f16_to_f32(w[i + j]);
    for (int j = 0; i + j < n; j++) acc[j] += x[i + j] * g4_f16_to_f32(w[i + j]);
    return fold(acc);
}

typedef struct {
    const g4_mat *w;
    const float *x;
    int M, ldy;
    float *y;
} matmul_job;

static void matmul_range(void *ctx, int r0, int r1, int tid) {
    (void)tid;
    const matmul_job *j = ctx;
    const g4_mat *w = j->w;
    int K = w->cols;
    /* rows outer, tokens inner: a weight row is read from memory once per call whatever M is */
    for (int r = r0; r < r1; r++) {
        switch (w->type) {
        case G4_W_BF16: {
            const uint16_t *row = (const uint16_t *)((const uint8_t *)w->data + (size_t)r * w->row_bytes);
            for (int m = 0; m < j->M; m++) j->y[(size_t)m * j->ldy + r] = g4_dot_bf16(j->x + (size_t)m * K, row, K);
            break;
        }
        case G4_W_F16: {
            const uint16_t *row = (const uint16_t *)((const uint8_t *)w->data + (size_t)r * w->row_bytes);
            for (int m = 0; m < j->M; m++) j->y[(size_t)m * j->ldy + r] = g4_dot_f16(j->x + (size_t)m * K, row, K);
            break;
        }
        default: {
            const float *row = (const float *)((const uint8_t *)w->data + (size_t)r * w->row_bytes);
            for (int m = 0; m < j->M; m++) j->y[(size_t)m * j->ldy + r] = g4_dot_f32(j->x + (size_t)m * K, row, K);
            break;
        }
        }
    }
}

void g4_matmul(g4_threadpool *pool, const g4_mat *w, const float *x, int M, float *y, int ldy) {
    matmul_job j = {w, x, M, ldy, y};
    /* Small matrices are not worth waking the workers for. */
    if ((long)w->rows * w->cols * (M < 4 ? M : 4) < 32768)
        matmul_range(&j, 0, w->rows, 0);
    else
        g4_parallel_for(pool, w->rows, 16, matmul_range, &j);
}

void g4_mat_row_f32(const g4_mat *w, int row, float *out) {
    const uint8_t *p = (const uint8_t *)w->data + (size_t)row * w->row_bytes;
    switch (w->type) {
    case G4_W_BF16:
        for (int c = 0; c < w->cols; c++) out[c] = g4_bf16_to_f32(((const uint16_t *)p)[c]);
        break;
    case G4_W_F16:
        for (int c = 0; c < w->cols; c++) out[c] = g4_f16_to_f32(((const uint16_t *)p)[c]);
        break;
    default:
        memcpy(out, p, sizeof(float) * (size_t)w->cols);
        break;
    }
}

void g4_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    if (w)
        for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
    else
        for (int i = 0; i < n; i++) y[i] = x[i] * inv;
}

float g4_gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

void g4_rope(float *x, int d, int pos, float theta, int R) {
    int half = d / 2;
    for (int i = 0; i < R && i < half; i++) {
        double inv = pow((double)theta, -2.0 * i / d);
        double ang = (double)pos * inv;
        float c = (float)cos(ang), s = (float)sin(ang);
        float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}
