/* CPU kernels: the scalar-order reference the rest of the engine is built on.
 *
 * Exactness: every output element is reduced by one call of one dot-product routine, in an order
 * fixed by the length alone (16 interleaved partial sums, then a fixed tree). The number of
 * tokens M and the thread split only decide *which* elements a call computes, never how, so
 * results are bitwise independent of both. */
#ifndef G4_CPU_KERNELS_H
#define G4_CPU_KERNELS_H
#include <stdint.h>

#include "formats/safetensors.h"
#include "util/threadpool.h"

/* A weight matrix [rows = out, cols = in], row-major, in its stored dtype (F32, F16 or BF16). */
typedef struct g4_mat {
    g4_dtype dtype;
    int rows, cols;
    const void *data;
} g4_mat;

/* Rows [r0, r0 + n) of w as a matrix of its own. */
g4_mat g4_mat_rows(const g4_mat *w, int r0, int n);

static inline float g4_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}
float g4_f16_to_f32(uint16_t h);
/* Round-to-nearest-even narrowing, for values that must match a dtype's precision. */
uint16_t g4_f32_to_bf16(float f);
uint16_t g4_f32_to_f16(float f);

/* Dot products in the engine's fixed reduction order. */
float g4_dot_f32(const float *a, const float *b, int n);
float g4_dot_bf16(const float *x, const uint16_t *w, int n);
float g4_dot_f16(const float *x, const uint16_t *w, int n);

/* y[m][r] = x[m] · w[r] for m < M, r < w->rows. x is [M][w->cols], y is [M][ldy]. Threads split
 * the rows of w. */
void g4_matmul(g4_threadpool *pool, const g4_mat *w, const float *x, int M, float *y, int ldy);

/* out[c] = w[row][c] as float (embedding gathers). */
void g4_mat_row_f32(const g4_mat *w, int row, float *out);

/* y = rms(x) * w (w may be NULL for the weightless norm); n elements; in place allowed. */
void g4_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

float g4_gelu_tanh(float x);

/* Rotate-half RoPE over one head of dimension d at position pos: pairs (i, i + d/2) for i < R
 * rotate by pos * theta^(-2i/d); the rest pass through. */
void g4_rope(float *x, int d, int pos, float theta, int R);
#endif
