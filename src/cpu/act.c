#include "cpu/act.h"

#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu/kernels.h"

float g4_gelu_tanh(float x) {
    float z = G4_GELU_K * (x + 0.044715f * x * x * x);
    return x / (1.0f + g4_exp(-2.0f * z));
}

#define KW 4
#define KSUFFIX _w4
#define KTARGET
#include "cpu/act_kernels.h"
#undef KW
#undef KSUFFIX
#undef KTARGET

#if defined(__x86_64__)
#define KW 8
#define KSUFFIX _w8
#define KTARGET __attribute__((target("avx2,fma")))
#include "cpu/act_kernels.h"
#undef KW
#undef KSUFFIX
#undef KTARGET

#define KW 16
#define KSUFFIX _w16
#define KTARGET __attribute__((target("avx512f,avx512dq,fma")))
#include "cpu/act_kernels.h"
#undef KW
#undef KSUFFIX
#undef KTARGET
#define ACT_PICK(isa, name) ((isa) >= G4_ISA_AVX512 ? name##_w16 : (isa) == G4_ISA_AVX2 ? name##_w8 : name##_w4)
#else
#define ACT_PICK(isa, name) name##_w4
#endif

void g4_gelu_mul_isa(g4_isa isa, float *g, const float *u, size_t n) { ACT_PICK(isa, gelu_mul)(g, u, n); }
void g4_softcap_isa(g4_isa isa, float *x, size_t n, float cap) { ACT_PICK(isa, softcap)(x, n, cap); }
int g4_argmax_isa(g4_isa isa, const float *x, int n) { return ACT_PICK(isa, argmax)(x, n); }
void g4_fake_quant_isa(g4_isa isa, float *y, const float *x, size_t n, float sc) { ACT_PICK(isa, fake_quant)(y, x, n, sc); }
float g4_exp_sum_isa(g4_isa isa, const float *x, float m, float *y, int n) {
    return ACT_PICK(isa, exp_sum)(x, m, y, n);
}
void g4_axpy_isa(g4_isa isa, float *y, float a, const float *x, int n) { ACT_PICK(isa, axpy)(y, a, x, n); }

void g4_avsum_isa(g4_isa isa, float *y, const float *p, const float *v, size_t stride, int nk, int d) {
    ACT_PICK(isa, avsum)(y, p, v, stride, nk, d);
}
void g4_avsum_heads_isa(g4_isa isa, float *y, size_t ystride, const float *p, size_t pstride, int nh, const float *v,
                        size_t stride, int nk, int d) {
    ACT_PICK(isa, avsum_heads)(y, ystride, p, pstride, nh, v, stride, nk, d);
}
void g4_avsum_heads_bf16_isa(g4_isa isa, float *y, size_t ystride, const float *p, size_t pstride, int nh,
                             const uint16_t *v, size_t stride, int nk, int d) {
    ACT_PICK(isa, avsum_heads_bf16)(y, ystride, p, pstride, nh, v, stride, nk, d);
}
void g4_avsum(float *y, const float *p, const float *v, size_t stride, int nk, int d) {
    g4_avsum_isa(g4_isa_best(), y, p, v, stride, nk, d);
}
void g4_gelu_mul(float *g, const float *u, size_t n) { g4_gelu_mul_isa(g4_isa_best(), g, u, n); }
void g4_softcap(float *x, size_t n, float cap) { g4_softcap_isa(g4_isa_best(), x, n, cap); }
int g4_argmax(const float *x, int n) { return g4_argmax_isa(g4_isa_best(), x, n); }
void g4_fake_quant(float *y, const float *x, size_t n, float sc) { g4_fake_quant_isa(g4_isa_best(), y, x, n, sc); }
float g4_exp_sum(const float *x, float m, float *y, int n) { return g4_exp_sum_isa(g4_isa_best(), x, m, y, n); }
void g4_axpy(float *y, float a, const float *x, int n) { g4_axpy_isa(g4_isa_best(), y, a, x, n); }
