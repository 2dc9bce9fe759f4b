#include "cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels_internal.h"
#include "cpu/quant.h"
#include "util/error.h"

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

/* ---- dispatch -------------------------------------------------------------------------------- */

g4_isa g4_isa_best(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512vbmi"))
        return G4_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return G4_ISA_AVX2;
    return G4_ISA_SCALAR;
}

const char *g4_isa_name(g4_isa isa) {
    static const char *const n[G4_ISA_COUNT] = {"scalar", "avx2", "avx512"};
    return isa < G4_ISA_COUNT ? n[isa] : "?";
}

static g4_isa clamp_isa(g4_isa isa) {
    g4_isa best = g4_isa_best();
    return isa > best ? best : isa;
}

/* ---- the float path: 16 lanes of fma, then the fixed fold ------------------------------------ */

float g4_dot_f32_isa(g4_isa isa, const float *a, const float *b, int n) {
    switch (clamp_isa(isa)) {
    case G4_ISA_AVX512: return g4_dot_f32_avx512(a, b, n);
    case G4_ISA_AVX2: return g4_dot_f32_avx2(a, b, n);
    default: break;
    }
    float acc[16] = {0};
    for (int i = 0; i < n; i++) acc[i & 15] = fmaf(a[i], b[i], acc[i & 15]);
    return g4_fold16(acc);
}

float g4_dot_f32(const float *a, const float *b, int n) { return g4_dot_f32_isa(g4_isa_best(), a, b, n); }

float g4_dot_bf16(const float *x, const uint16_t *w, int n) {
    float acc[16] = {0};
    for (int i = 0; i < n; i++) acc[i & 15] = fmaf(x[i], g4_bf16_to_f32(w[i]), acc[i & 15]);
    return g4_fold16(acc);
}

float g4_dot_f16(const float *x, const uint16_t *w, int n) {
    float acc[16] = {0};
    for (int i = 0; i < n; i++) acc[i & 15] = fmaf(x[i], g4_f16_to_f32(w[i]), acc[i & 15]);
    return g4_fold16(acc);
}

/* ---- the integer path: activations ----------------------------------------------------------- */

/* Round half to even for |v| < 2^22: adding 1.5·2^23 leaves no fraction bits. */
static inline float rne_small(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* Step 1 of the canonical order for token m: xq, dx, c0/c1 (scalar reference; the AVX-512
 * version in kernels_avx512.c writes the same bytes). */
static void xprep_token_scalar(const g4_mat *w, const float *xr, const g4_xprep *xp, int m) {
    int off = g4_wtype_offset(w), split = w->type == G4_W_Q6_K;
    int8_t *q = xp->xq + (size_t)m * xp->ngrp * 128;
    size_t f = g4_xp_f(xp, m);
    for (int b = 0; b < xp->nb; b++) {
        const float *xb = xr + 32 * b;
        int j = b / 4, k = b % 4;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float id = amax > 0 ? 127.0f / amax : 0.0f, dx = amax / 127.0f;
        int8_t *lo = q + 128 * j + 16 * k, *hi = lo + 64;
        for (int e = 0; e < 16; e++) {
            lo[e] = (int8_t)rne_small(xb[e] * id);
            hi[e] = (int8_t)rne_small(xb[16 + e] * id);
        }
        for (int g = 0; g < 4; g++) {
            size_t l = f + 16 * j + 4 * k + g;
            int slo = 0, shi = 0;
            for (int t = 0; t < 4; t++) {
                slo += lo[4 * g + t];
                shi += hi[4 * g + t];
            }
            xp->dx[l] = dx;
            xp->c0[l] = split ? -off * slo : -off * (slo + shi);
            if (split) xp->c1[l] = -off * shi;
        }
    }
}

/* Split layout, step 1 (kernels_internal.h): the same quantisation, super-group order. */
void g4_xprep_token_split(const g4_mat *w, const float *xr, const g4_xprep *xp, int m) {
    int off = g4_wtype_offset(w), add = g4_wtype_additive(w->type);
    int8_t *q = (int8_t *)g4_xp_q(xp, m);
    size_t f = g4_xp_f(xp, m);
    memset(q, 0, (size_t)xp->nsg * 512);
    for (int b = 0; b < 16 * xp->nsg; b++) {
        size_t l = f + (size_t)b;
        if (b >= xp->nb) {
            xp->dx[l] = 0;
            xp->c0[l] = 0;
            if (add) xp->xs[l] = 0;
            continue;
        }
        const float *xb = xr + 32 * b;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            int8_t v = (int8_t)rne_small(xb[i] * id);
            q[g4_xp_split_at(b, i)] = v;
            sum += v;
        }
        xp->dx[l] = amax / 127.0f;
        xp->c0[l] = -off * sum;
        if (add) {
            float xs = xb[0];
            for (int i = 1; i < 32; i++) xs += xb[i];
            xp->xs[l] = xs;
        }
    }
}

static void xprep_token(g4_isa isa, const g4_mat *w, const float *x, const g4_xprep *xp, int m) {
    const float *xr = x + (size_t)m * w->cols;
    if (w->split) {
        if (isa == G4_ISA_AVX512) g4_xprep_token_split_avx512(w, xr, xp, m);
        else g4_xprep_token_split(w, xr, xp, m);
        return;
    }
    int8_t *q = xp->xq + (size_t)m * xp->ngrp * 128;
    size_t f = g4_xp_f(xp, m);
    if (xp->nb % 4) { /* zero the missing blocks of a last partial group */
        size_t j = (size_t)xp->ngrp - 1;
        memset(q + 128 * j, 0, 128);
        memset(xp->dx + f + 16 * j, 0, sizeof(float) * 16);
        memset(xp->c0 + f + 16 * j, 0, sizeof(int32_t) * 16);
        if (xp->c1) memset(xp->c1 + f + 16 * j, 0, sizeof(int32_t) * 16);
        if (xp->xs) memset(xp->xs + f + 16 * j, 0, sizeof(float) * 16);
    }
    if (isa == G4_ISA_AVX512) g4_xprep_token_avx512(w, xr, xp, m);
    else if (isa == G4_ISA_AVX2) g4_xprep_token_avx2(w, xr, xp, m);
    else xprep_token_scalar(w, xr, xp, m);
    if (xp->xs) /* the additive types' exact sums, left to right over the lane group */
        for (int b = 0; b < xp->nb; b++)
            for (int g = 0; g < 4; g++) {
                const float *xb = xr + 32 * b;
                float sum = xb[4 * g];
                for (int t = 1; t < 4; t++) sum += xb[4 * g + t];
                for (int t = 0; t < 4; t++) sum += xb[16 + 4 * g + t];
                xp->xs[f + 16 * (b / 4) + 4 * (b % 4) + g] = sum;
            }
}

static size_t xprep_bytes(const g4_mat *w, int M) {
    size_t ngrp = ((size_t)w->cols / 32 + 3) / 4, nq = (size_t)M * ngrp * 128, nf = (size_t)M * ngrp * 16;
    if (w->split) {
        size_t nsg = ((size_t)w->cols / 32 + 15) / 16;
        nq = (size_t)M * nsg * 512;
        nf = (size_t)M * nsg * 16;
    }
    return nq + nf * 4 * (2 + g4_wtype_additive(w->type) + (w->type == G4_W_Q6_K)) + 64;
}

/* Lays the arrays out in mem (xprep_bytes(w, M) bytes). */
static void xprep_layout(const g4_mat *w, int M, void *mem, g4_xprep *xp) {
    xp->nb = w->cols / 32;
    xp->ngrp = (xp->nb + 3) / 4;
    xp->sg = w->split;
    xp->nsg = (xp->nb + 15) / 16;
    size_t nf = (size_t)M * (xp->sg ? (size_t)xp->nsg : (size_t)xp->ngrp) * 16;
    int add = g4_wtype_additive(w->type), split = w->type == G4_W_Q6_K;
    uint8_t *p = (uint8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    xp->dx = (float *)p;
    xp->c0 = (int32_t *)(p + nf * 4);
    xp->xs = add ? (float *)(p + nf * 8) : NULL;
    xp->c1 = split ? (int32_t *)(p + nf * (8 + 4 * add)) : NULL;
    xp->xq = (int8_t *)(p + nf * 4 * (2 + add + split));
}

typedef struct {
    g4_isa isa;
    const g4_mat *w;
    const float *x;
    const g4_xprep *xp;
} xprep_job;

static void xprep_range(void *ctx, int m0, int m1, int tid) {
    (void)tid;
    const xprep_job *j = ctx;
    for (int m = m0; m < m1; m++) xprep_token(j->isa, j->w, j->x, j->xp, m);
}

/* ---- the integer path: weights, scalar ------------------------------------------------------- */

float g4_scale_at(const void *p, g4_dtype dt, size_t i) {
    switch (dt) {
    case G4_DT_F16: return g4_f16_to_f32(((const uint16_t *)p)[i]);
    case G4_DT_BF16: return g4_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline float h2f(const uint8_t *p) { return g4_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void g4_wblock_get(const g4_mat *w, int r, int b, g4_wblock *o) {
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    o->sw_hi = o->bw = 0;
    switch (w->type) {
    case G4_W_Q8_0: {
        const uint8_t *k = p + 34 * (size_t)b;
        o->sw = h2f(k);
        for (int i = 0; i < 32; i++) o->u[i] = k[2 + i] ^ 0x80;
        break;
    }
    case G4_W_Q4_0: case G4_W_Q4_1: case G4_W_Q5_0: case G4_W_Q5_1: {
        int q5 = w->type == G4_W_Q5_0 || w->type == G4_W_Q5_1, q1 = w->type == G4_W_Q4_1 || w->type == G4_W_Q5_1;
        const uint8_t *k = p + (size_t)b * (18 + 2 * q1 + 4 * q5);
        o->sw = h2f(k);
        if (q1) o->bw = h2f(k + 2);
        uint32_t qh = q5 ? rd32(k + 2 + 2 * q1) : 0;
        const uint8_t *qs = k + 2 + 2 * q1 + 4 * q5;
        for (int j = 0; j < 16; j++) {
            o->u[j] = (uint8_t)((qs[j] & 15) | ((qh >> j) & 1) << 4);
            o->u[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        }
        break;
    }
    case G4_W_Q4_K: case G4_W_Q5_K: {
        int q5 = w->type == G4_W_Q5_K, s = b % 8, sc, mn;
        const uint8_t *k = p + (size_t)(b / 8) * (q5 ? 176 : 144);
        const uint8_t *qh = k + 16, *qs = k + (q5 ? 48 : 16);
        g4_k_scale_min(k + 4, s, &sc, &mn);
        o->sw = h2f(k) * (float)sc;
        o->bw = -(h2f(k + 2) * (float)mn);
        for (int l = 0; l < 32; l++) {
            int u = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15;
            if (q5) u |= ((qh[l] >> s) & 1) << 4;
            o->u[l] = (uint8_t)u;
        }
        break;
    }
    case G4_W_Q6_K: {
        const uint8_t *k = p + (size_t)(b / 8) * 210;
        int xb = b % 8, h = xb / 4, quarter = xb % 4;
        const uint8_t *ql = k + 64 * h + ((quarter & 1) ? 32 : 0), *qh = k + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            int lo = quarter >= 2 ? ql[l] >> 4 : ql[l] & 15;
            o->u[l] = (uint8_t)(lo | ((qh[l] >> (2 * quarter)) & 3) << 4);
        }
        float d = h2f(k + 208);
        o->sw = d * (float)(int8_t)k[192 + 2 * xb];
        o->sw_hi = d * (float)(int8_t)k[192 + 2 * xb + 1];
        break;
    }
    case G4_W_AFFINE: case G4_W_SYMM: {
        int bits = w->bits;
        if (w->split) {
            g4_split_block(w, r, b, o->u);
        } else {
            for (int i = 0; i < 32; i++) {
                unsigned c = g4_stream_code(p, 32L * b + i, bits);
                o->u[i] = (uint8_t)(w->type == G4_W_SYMM && bits == 8 ? c ^ 0x80 : c);
            }
        }
        size_t g = w->group > 0 ? (size_t)32 * b / (size_t)w->group : 0, si = (size_t)r * w->scale_stride + g;
        o->sw = g4_scale_at(w->scales, w->scale_dtype, si);
        if (w->type == G4_W_AFFINE) o->bw = g4_scale_at(w->biases, w->scale_dtype, si);
        break;
    }
    default:
        memset(o, 0, sizeof *o);
        break;
    }
}

void g4_wblock_accumulate(const g4_mat *w, const g4_wblock *wb, const g4_xprep *xp, int m, int b,
                          float acc[16]) {
    int j = b / 4, k = b % 4, off = g4_wtype_offset(w);
    const int8_t *lo = g4_xp_q(xp, m) + 128 * j + 16 * k, *hi = lo + 64;
    size_t f = g4_xp_f(xp, m) + 16 * j + 4 * k;
    float dx = xp->dx[f];
    for (int g = 0; g < 4; g++) {
        int plo = 0, phi = 0;
        for (int t = 0; t < 4; t++) {
            plo += (wb->u[4 * g + t] - off) * lo[4 * g + t];
            phi += (wb->u[16 + 4 * g + t] - off) * hi[4 * g + t];
        }
        float *a = &acc[4 * k + g];
        if (w->type == G4_W_Q6_K) {
            *a = fmaf((float)plo, wb->sw * dx, *a);
            *a = fmaf((float)phi, wb->sw_hi * dx, *a);
        } else {
            *a = fmaf((float)(plo + phi), wb->sw * dx, *a);
            if (xp->xs) *a = fmaf(xp->xs[f + g], wb->bw, *a);
        }
    }
}

/* ---- scalar rows ----------------------------------------------------------------------------- */

static inline float wconv(const g4_mat *w, const uint8_t *row, int i) {
    switch (w->type) {
    case G4_W_BF16: return g4_bf16_to_f32(((const uint16_t *)row)[i]);
    case G4_W_F16: return g4_f16_to_f32(((const uint16_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

#define SCALAR_TILE 8
/* Split layout: the canonical order of kernels_internal.h, element by element. */
void g4_rows_split_scalar(const g4_rows_args *a, int r0, int r1) {
    const g4_mat *w = a->w;
    const g4_xprep *xp = a->xp;
    int add = g4_wtype_additive(w->type);
    for (int r = r0; r < r1; r++)
        for (int m = 0; m < a->M; m++) {
            float acc[16] = {0};
            const int8_t *q = g4_xp_q(xp, m);
            size_t f = g4_xp_f(xp, m);
            for (int b = 0; b < xp->nb; b++) {
                g4_wblock wb;
                g4_wblock_get(w, r, b, &wb);
                int P = xp->c0[f + (size_t)b];
                for (int i = 0; i < 32; i++) P += wb.u[i] * q[g4_xp_split_at(b, i)];
                acc[b % 16] = fmaf((float)P, wb.sw * xp->dx[f + (size_t)b], acc[b % 16]);
                if (add) acc[b % 16] = fmaf(xp->xs[f + (size_t)b], wb.bw, acc[b % 16]);
            }
            a->y[(size_t)m * a->ldy + r] = g4_fold16(acc);
        }
}

void g4_rows_scalar(const g4_rows_args *a, int r0, int r1) {
    const g4_mat *w = a->w;
    int K = w->cols;
    if (w->split) {
        g4_rows_split_scalar(a, r0, r1);
        return;
    }
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int m0 = 0; m0 < a->M; m0 += SCALAR_TILE) {
            int T = a->M - m0 < SCALAR_TILE ? a->M - m0 : SCALAR_TILE;
            float acc[SCALAR_TILE][16];
            memset(acc, 0, sizeof acc);
            if (g4_wtype_is_int(w->type)) {
                for (int b = 0; b < K / 32; b++) {
                    g4_wblock wb;
                    g4_wblock_get(w, r, b, &wb);
                    for (int t = 0; t < T; t++) g4_wblock_accumulate(w, &wb, a->xp, m0 + t, b, acc[t]);
                }
            } else {
                for (int i = 0; i < K; i++) {
                    float wv = wconv(w, row, i);
                    for (int t = 0; t < T; t++)
                        acc[t][i & 15] = fmaf(a->x[(size_t)(m0 + t) * K + i], wv, acc[t][i & 15]);
                }
            }
            for (int t = 0; t < T; t++) a->y[(size_t)(m0 + t) * a->ldy + r] = g4_fold16(acc[t]);
        }
    }
}

/* ---- g4_matmul ------------------------------------------------------------------------------- */

typedef void (*rows_fn)(const g4_rows_args *a, int r0, int r1);
typedef struct {
    rows_fn fn;
    const g4_rows_args *a;
} rows_job;

static void rows_job_range(void *ctx, int r0, int r1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    j->fn(j->a, r0, r1);
}

/* Tokens per pass of the integer path: bounds the prepared-activation buffer (~2.5 bytes per
 * token and column) while still reusing each weight block across many tokens. */
#define PREP_CHUNK 64

void g4_matmul_isa(g4_isa isa, g4_threadpool *pool, const g4_mat *w, const float *x, int M, float *y,
                   int ldy) {
    isa = clamp_isa(isa);
    rows_fn fn = isa == G4_ISA_AVX512 ? g4_rows_avx512 : isa == G4_ISA_AVX2 ? g4_rows_avx2 : g4_rows_scalar;
    int serial = !pool || (long)w->rows * w->cols * (M < 4 ? M : 4) < 32768;
    if (!g4_wtype_is_int(w->type)) {
        g4_rows_args a = {w, x, NULL, M, ldy, y};
        rows_job j = {fn, &a};
        if (serial) fn(&a, 0, w->rows);
        else g4_parallel_for(pool, w->rows, 16, rows_job_range, &j);
        return;
    }
    /* decode-sized calls prepare their activations on the stack: no allocation per call */
    _Alignas(64) uint8_t stack_buf[48 << 10];
    for (int m0 = 0; m0 < M; m0 += PREP_CHUNK) {
        int n = M - m0 < PREP_CHUNK ? M - m0 : PREP_CHUNK;
        g4_xprep xp;
        size_t need = xprep_bytes(w, n);
        void *mem = need <= sizeof stack_buf ? NULL : malloc(need);
        if (!mem && need > sizeof stack_buf) { /* out of memory: fail loudly rather than silently wrong */
            for (int m = m0; m < M; m++)
                for (int r = 0; r < w->rows; r++) y[(size_t)m * ldy + r] = NAN;
            return;
        }
        xprep_layout(w, n, mem ? mem : stack_buf, &xp);
        xprep_job pj = {isa, w, x + (size_t)m0 * w->cols, &xp};
        if (serial || n < 4) xprep_range(&pj, 0, n, 0);
        else g4_parallel_for(pool, n, 1, xprep_range, &pj);
        g4_rows_args a = {w, NULL, &xp, n, ldy, y + (size_t)m0 * ldy};
        rows_job j = {fn, &a};
        if (serial) fn(&a, 0, w->rows);
        else g4_parallel_for(pool, w->rows, 16, rows_job_range, &j);
        free(mem);
    }
}

/* ---- several matrices in one pass ------------------------------------------------------------ */

/* Whether one prepared input serves both matrices. */
static int prep_compatible(const g4_mat *a, const g4_mat *b) {
    if (a->cols != b->cols || g4_wtype_is_int(a->type) != g4_wtype_is_int(b->type)) return 0;
    if (!g4_wtype_is_int(a->type)) return 1;
    return a->split == b->split && g4_wtype_offset(a) == g4_wtype_offset(b) && g4_wtype_additive(a->type) == g4_wtype_additive(b->type) &&
           (a->type == G4_W_Q6_K) == (b->type == G4_W_Q6_K);
}

enum { MULTI_UNIT = 16 };

typedef struct {
    rows_fn fn;
    g4_rows_args args[G4_MM_MAX_PARTS];
    int n, npair, ustart[G4_MM_MAX_PARTS + 1]; /* item i (a part, or a pair) owns units [ustart[i], ustart[i+1]) */
    g4_mm_epilogue epi;
    void *epi_ctx;
} multi_job;

static void multi_range(void *ctx, int u0, int u1, int tid) {
    (void)tid;
    const multi_job *j = ctx;
    int items = j->epi ? j->n / 2 : j->n;
    for (int i = 0; i < items; i++) {
        int a = u0 > j->ustart[i] ? u0 : j->ustart[i], b = u1 < j->ustart[i + 1] ? u1 : j->ustart[i + 1];
        if (a >= b) continue;
        const g4_rows_args *g = &j->args[j->epi ? 2 * i : i];
        int rows = g->w->rows, r0 = (a - j->ustart[i]) * MULTI_UNIT, r1 = (b - j->ustart[i]) * MULTI_UNIT;
        if (r1 > rows) r1 = rows;
        j->fn(g, r0, r1);
        if (j->epi) { /* the pair's second matrix on the same rows, then the epilogue over them */
            j->fn(g + 1, r0, r1);
            j->epi(j->epi_ctx, i, r0, r1);
        }
    }
}

static void multi_serial(g4_threadpool *pool, const g4_mm_part *parts, int n, const float *x, int M, g4_mm_epilogue epi,
                         void *epi_ctx) {
    for (int i = 0; i < n; i++) {
        g4_matmul(pool, parts[i].w, parts[i].x ? parts[i].x : x, M, parts[i].y, parts[i].ldy);
        if (epi && i % 2) epi(epi_ctx, i / 2, 0, parts[i].w->rows);
    }
}

void g4_matmul_multi(g4_threadpool *pool, const g4_mm_part *parts, int n, const float *x, int M, g4_mm_epilogue epi,
                     void *epi_ctx) {
    int ok = n >= 1 && n <= G4_MM_MAX_PARTS && M <= PREP_CHUNK && (!epi || n % 2 == 0);
    for (int i = 1; i < n && ok; i++) ok = prep_compatible(parts[0].w, parts[i].w);
    for (int i = 0; epi && ok && i < n; i += 2) ok = parts[i].w->rows == parts[i + 1].w->rows;
    if (!ok) {
        multi_serial(pool, parts, n, x, M, epi, epi_ctx);
        return;
    }
    g4_isa isa = g4_isa_best();
    const g4_mat *w0 = parts[0].w;
    multi_job j = {.fn = isa == G4_ISA_AVX512 ? g4_rows_avx512 : isa == G4_ISA_AVX2 ? g4_rows_avx2 : g4_rows_scalar,
                   .n = n, .epi = epi, .epi_ctx = epi_ctx};
    /* one prepared input per distinct input pointer */
    const float *in[G4_MM_MAX_PARTS];
    int prep_of[G4_MM_MAX_PARTS], nprep = 0;
    for (int i = 0; i < n; i++) {
        const float *xi = parts[i].x ? parts[i].x : x;
        int k = 0;
        while (k < nprep && in[k] != xi) k++;
        if (k == nprep) in[nprep++] = xi;
        prep_of[i] = k;
    }
    int is_int = g4_wtype_is_int(w0->type);
    _Alignas(64) uint8_t stack_buf[48 << 10];
    void *mem = NULL;
    g4_xprep xp[G4_MM_MAX_PARTS];
    if (is_int) {
        size_t each = (xprep_bytes(w0, M) + 63) & ~(size_t)63, need = each * (size_t)nprep;
        if (need > sizeof stack_buf && !(mem = malloc(need))) {
            multi_serial(pool, parts, n, x, M, epi, epi_ctx);
            return;
        }
        uint8_t *base = mem ? mem : stack_buf;
        for (int k = 0; k < nprep; k++) {
            xprep_layout(w0, M, base + each * (size_t)k, &xp[k]);
            xprep_job pj = {isa, w0, in[k], &xp[k]};
            if (!pool || M < 4) xprep_range(&pj, 0, M, 0);
            else g4_parallel_for(pool, M, 1, xprep_range, &pj);
        }
    }
    long work = 0;
    int items = epi ? n / 2 : n;
    for (int i = 0; i < n; i++) {
        j.args[i] = (g4_rows_args){parts[i].w, is_int ? NULL : in[prep_of[i]], is_int ? &xp[prep_of[i]] : NULL, M,
                                   parts[i].ldy, parts[i].y};
        work += (long)parts[i].w->rows * parts[i].w->cols;
    }
    j.ustart[0] = 0;
    for (int i = 0; i < items; i++) j.ustart[i + 1] = j.ustart[i] + (parts[epi ? 2 * i : i].w->rows + MULTI_UNIT - 1) / MULTI_UNIT;
    if (!pool || work * (M < 4 ? M : 4) < 32768) multi_range(&j, 0, j.ustart[items], 0);
    else g4_parallel_for(pool, j.ustart[items], 1, multi_range, &j);
    free(mem);
}

void g4_matmul(g4_threadpool *pool, const g4_mat *w, const float *x, int M, float *y, int ldy) {
    g4_matmul_isa(g4_isa_best(), pool, w, x, M, y, ldy);
}

void g4_mat_row_f32(const g4_mat *w, int row, float *out) {
    const uint8_t *p = (const uint8_t *)w->data + (size_t)row * w->row_bytes;
    switch (w->type) {
    case G4_W_AFFINE: case G4_W_SYMM: {
        int off = w->type == G4_W_SYMM ? 1 << (w->bits - 1) : 0;
        if (w->split) {
            for (int b = 0; b < w->cols / 32; b++) {
                g4_wblock wb;
                g4_wblock_get(w, row, b, &wb);
                for (int i = 0; i < 32; i++)
                    out[32 * b + i] = w->type == G4_W_SYMM ? wb.sw * (float)(wb.u[i] - off) : wb.sw * (float)wb.u[i] + wb.bw;
            }
            break;
        }
        for (int c = 0; c < w->cols; c++) {
            size_t g = w->group > 0 ? (size_t)c / (size_t)w->group : 0, si = (size_t)row * w->scale_stride + g;
            int q = (int)g4_stream_code(p, c, w->bits);
            if (w->type == G4_W_SYMM)
                out[c] = g4_scale_at(w->scales, w->scale_dtype, si) * (float)(w->bits == 8 ? (int8_t)q : q - off);
            else
                out[c] = g4_scale_at(w->scales, w->scale_dtype, si) * (float)q +
                         g4_scale_at(w->biases, w->scale_dtype, si);
        }
        break;
    }
    default:
        g4_dequantize_row(w->type, p, w->cols, out);
        break;
    }
}

g4_status g4_mat_validate(const g4_mat *w, g4_error *err) {
    if (w->type >= G4_W_COUNT) return g4_fail(err, G4_ERR_TENSOR, "unknown weight type %d", (int)w->type);
    const char *tn = g4_wtype_name(w->type);
    if (w->split && w->type != G4_W_AFFINE && w->type != G4_W_SYMM)
        return g4_fail(err, G4_ERR_TENSOR, "%s: only affine and symmetric matrices have a split layout", tn);
    if (w->rows <= 0 || w->cols <= 0) return g4_fail(err, G4_ERR_TENSOR, "%s matrix with shape [%d, %d]", tn, w->rows, w->cols);
    size_t need = g4_wtype_row_bytes(w->type, w->cols, w->bits);
    if (!need)
        return g4_fail(err, G4_ERR_TENSOR, "%s: %d columns (bits %d) is not a valid row (multiple of %d needed)",
                       tn, w->cols, w->bits, g4_wtype_block_cols(w->type));
    if (w->row_bytes < need) return g4_fail(err, G4_ERR_TENSOR, "%s: row of %zu bytes, %zu needed", tn, w->row_bytes, need);
    if (!w->data) return g4_fail(err, G4_ERR_TENSOR, "%s: no data", tn);
    if (w->type == G4_W_AFFINE || w->type == G4_W_SYMM) {
        int gs = w->group > 0 ? w->group : w->cols;
        if (gs % 32 || w->cols % gs)
            return g4_fail(err, G4_ERR_TENSOR, "%s: group %d must be a multiple of 32 dividing %d columns", tn, w->group, w->cols);
        if (!w->scales || (w->type == G4_W_AFFINE && !w->biases))
            return g4_fail(err, G4_ERR_TENSOR, "%s: scales%s missing", tn, w->type == G4_W_AFFINE ? " or biases" : "");
        if (w->scale_dtype != G4_DT_F32 && w->scale_dtype != G4_DT_F16 && w->scale_dtype != G4_DT_BF16)
            return g4_fail(err, G4_ERR_TENSOR, "%s: scales must be F32, F16 or BF16", tn);
        if (w->split && w->bits != 2 && w->bits != 4 && w->bits != 8)
            return g4_fail(err, G4_ERR_TENSOR, "%s: the split layout holds 2-, 4- or 8-bit codes, not %d", tn, w->bits);
        if (w->scale_stride < (size_t)(w->cols / gs))
            return g4_fail(err, G4_ERR_TENSOR, "%s: scale stride %zu below %d groups", tn, w->scale_stride, w->cols / gs);
    }
    return G4_OK;
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
