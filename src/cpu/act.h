/* Element-wise kernels of the forward (GELU, softcap, softmax exponentials, axpy), vectorised
 * for AVX-512 / AVX2 with the same bits as the scalar code at every ISA level: each lane runs
 * the scalar function's exact sequence of IEEE single-precision operations.
 *
 * e^x is the engine's own (libm's expf is not vectorisable without fast-math, and would differ
 * between code paths): x clamped to [-87, 88], x = n·ln2 + r with a Cody-Waite split of ln2,
 * e^r by its degree-7 Taylor polynomial (|r| <= ln2/2: truncation under 6e-9), times 2^n built in
 * the exponent bits (as two factors, so n = 127 does not overflow). Relative error about 2 ulp.
 * GELU (tanh form) is evaluated through the identity 0.5·(1 + tanh(z)) = 1 / (1 + e^(-2z)):
 * gelu(x) = x / (1 + e^(-2z)), z = sqrt(2/pi)·(x + 0.044715·x³). Softcap c·tanh(x/c) uses
 * tanh(a) = 1 - 2 / (1 + e^(2a)) on a = |x/c| and restores the sign. */
#ifndef G4_CPU_ACT_H
#define G4_CPU_ACT_H
#include <stddef.h>
#include <math.h>
#include <stdint.h>

#include "cpu/kernels_internal.h"

#define G4_EXP_LO (-87.0f)
#define G4_EXP_HI 88.0f
#define G4_GELU_K 0.7978845608028654f /* sqrt(2/pi) */

static inline float g4_exp(float x) {
    union { float f; int32_t i; } t, m = {.f = 12582912.0f}, a, b;
    x = x < G4_EXP_HI ? x : G4_EXP_HI;
    x = x > G4_EXP_LO ? x : G4_EXP_LO;
    t.f = x * 1.44269504088896341f + m.f;
    float n = t.f - m.f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t ni = t.i - m.i, h = ni >> 1;
    a.i = (h + 127) << 23;
    b.i = (ni - h + 127) << 23;
    return p * a.f * b.f;
}

static inline float g4_softcap1(float x, float cap) {
    float y = x / cap, a = y < 0 ? -y : y;
    float t = 1.0f - 2.0f / (1.0f + g4_exp(2.0f * a));
    return cap * (y < 0 || (y == 0 && 1.0f / y < 0) ? -t : t);
}

/* QAT static activation fake-quantisation: v -> clamp(round_half_even(v / s), -128, 127) · s
 * (NaN stays NaN; -0.0 and small negatives keep their sign, as nearbyintf does). */
static inline float g4_fake_quant1(float v, float sc) {
    float q = nearbyintf(v / sc);
    return (q < -128.0f ? -128.0f : q > 127.0f ? 127.0f : q) * sc;
}

/* g[i] = gelu_tanh(g[i]) · u[i] */
void g4_gelu_mul(float *g, const float *u, size_t n);
/* y[i] = g4_fake_quant1(x[i], sc) (y may be x) */
void g4_fake_quant(float *y, const float *x, size_t n, float sc);
/* x[i] = cap · tanh(x[i] / cap) */
void g4_softcap(float *x, size_t n, float cap);
/* y[i] = e^(x[i] - m) for i < n; returns Σ y in the fixed 16-partial order (element i into
 * partial i % 16, then the 16-lane fold of kernels_internal.h). */
float g4_exp_sum(const float *x, float m, float *y, int n);
/* y[i] = fma(a, x[i], y[i]) (one rounding) */
void g4_axpy(float *y, float a, const float *x, int n);

/* y[e] = fma(p[k], v[k·stride + e], y[e]), k = 0..nk-1 in order: bitwise nk calls of g4_axpy. */
void g4_avsum(float *y, const float *p, const float *v, size_t stride, int nk, int d);

/* The index of the largest of x[0..n), the lowest on ties (NaNs never win, except at x[0]: then
 * 0), as the scalar loop `if (x[i] > x[b]) b = i` gives it; 0 for n < 1. Greedy decoding's pick. */
int g4_argmax(const float *x, int n);

/* The same at a chosen ISA level, which the CPU must support (at most g4_isa_best()). */
void g4_gelu_mul_isa(g4_isa isa, float *g, const float *u, size_t n);
void g4_softcap_isa(g4_isa isa, float *x, size_t n, float cap);
int g4_argmax_isa(g4_isa isa, const float *x, int n);
void g4_fake_quant_isa(g4_isa isa, float *y, const float *x, size_t n, float sc);
float g4_exp_sum_isa(g4_isa isa, const float *x, float m, float *y, int n);
void g4_axpy_isa(g4_isa isa, float *y, float a, const float *x, int n);
void g4_avsum_isa(g4_isa isa, float *y, const float *p, const float *v, size_t stride, int nk, int d);
/* g4_avsum for nh heads over the same V rows (head h: y + h·ystride, p + h·pstride), bitwise nh
 * calls of it; each V row is read once per run of 4 heads */
void g4_avsum_heads_isa(g4_isa isa, float *y, size_t ystride, const float *p, size_t pstride, int nh, const float *v,
                        size_t stride, int nk, int d);
/* the same with bf16 V rows: bitwise g4_avsum_heads_isa on the rows widened to float */
void g4_avsum_heads_bf16_isa(g4_isa isa, float *y, size_t ystride, const float *p, size_t pstride, int nh,
                             const uint16_t *v, size_t stride, int nk, int d);
#endif
