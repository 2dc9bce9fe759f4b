/* AVX2 + FMA + F16C kernels: the canonical order of kernels_internal.h, bit for bit.
 *
 * The 16 float lanes are two ymm registers: lanes 0..7 (blocks 4j, 4j+1 of a group) and 8..15
 * (blocks 4j+2, 4j+3). Integer block dots use maddubs + madd (exact: every pair sum stays below
 * 2^15 because codes are either ≤ 7 bits unsigned or taken as signed values u − off with
 * |u − off| ≤ 128 against |xq| ≤ 127), so no offset correction is needed except for 8-bit
 * unsigned AFFINE codes. Widths 3, 5, 6, 7 of the bit-stream types decode through the scalar
 * unpacker (correct, slower); everything else decodes in registers. */
#include <immintrin.h>
#include <string.h>

#include "cpu/kernels_internal.h"
#include "cpu/quant.h"

#define T2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) T2

/* Software prefetch distance in each weight row (bytes), as in kernels_avx512.c. */
#define PF_DIST 4096

/* ---- float path ----------------------------------------------------------------------------- */

INLINE __m256 load_w8(g4_wtype t, const uint8_t *row, int i) {
    if (t == G4_W_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (t == G4_W_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float wconv1(g4_wtype t, const uint8_t *row, int i) {
    if (t == G4_W_F32) return ((const float *)row)[i];
    uint16_t h = ((const uint16_t *)row)[i];
    return t == G4_W_F16 ? g4_f16_to_f32(h) : g4_bf16_to_f32(h);
}

INLINE void float_tile(const g4_rows_args *a, int r, const int R, int m0, const int T, g4_wtype t) {
    int K = a->w->cols, i = 0;
    const float *x = a->x + (size_t)m0 * K;
    const uint8_t *row[2];
    __m256 acc[2][4][2];
#pragma GCC unroll 2
    for (int v = 0; v < R; v++) {
        row[v] = (const uint8_t *)a->w->data + (size_t)(r + v) * a->w->row_bytes;
#pragma GCC unroll 4
        for (int u = 0; u < T; u++) acc[v][u][0] = acc[v][u][1] = _mm256_setzero_ps();
    }
    for (; i + 16 <= K; i += 16) {
        __m256 w0[2], w1[2];
#pragma GCC unroll 2
        for (int v = 0; v < R; v++) {
            _mm_prefetch((const char *)row[v] + (t == G4_W_F32 ? 4 : 2) * (size_t)i + PF_DIST, _MM_HINT_T0);
            w0[v] = load_w8(t, row[v], i);
            w1[v] = load_w8(t, row[v], i + 8);
        }
#pragma GCC unroll 4
        for (int u = 0; u < T; u++) {
            __m256 x0 = _mm256_loadu_ps(x + (size_t)u * K + i), x1 = _mm256_loadu_ps(x + (size_t)u * K + i + 8);
#pragma GCC unroll 2
            for (int v = 0; v < R; v++) {
                acc[v][u][0] = _mm256_fmadd_ps(x0, w0[v], acc[v][u][0]);
                acc[v][u][1] = _mm256_fmadd_ps(x1, w1[v], acc[v][u][1]);
            }
        }
    }
    for (int v = 0; v < R; v++)
        for (int u = 0; u < T; u++) {
            float l[16];
            _mm256_storeu_ps(l, acc[v][u][0]);
            _mm256_storeu_ps(l + 8, acc[v][u][1]);
            for (int e = 0; i + e < K; e++) l[e] = fmaf(x[(size_t)u * K + i + e], wconv1(t, row[v], i + e), l[e]);
            a->y[(size_t)(m0 + u) * a->ldy + r + v] = g4_fold16(l);
        }
}

INLINE void float_rows(const g4_rows_args *a, int r0, int r1, g4_wtype t) {
    for (int r = r0; r < r1;) {
        if (a->M == 1 && r + 2 <= r1) {
            float_tile(a, r, 2, 0, 1, t);
            r += 2;
            continue;
        }
        int m0 = 0;
        for (; m0 + 4 <= a->M; m0 += 4) float_tile(a, r, 1, m0, 4, t);
        switch (a->M - m0) {
        case 3: float_tile(a, r, 1, m0, 3, t); break;
        case 2: float_tile(a, r, 1, m0, 2, t); break;
        case 1: float_tile(a, r, 1, m0, 1, t); break;
        default: break;
        }
        r++;
    }
}

T2 static void rows_f32(const g4_rows_args *a, int r0, int r1) { float_rows(a, r0, r1, G4_W_F32); }
T2 static void rows_f16(const g4_rows_args *a, int r0, int r1) { float_rows(a, r0, r1, G4_W_F16); }
T2 static void rows_bf16(const g4_rows_args *a, int r0, int r1) { float_rows(a, r0, r1, G4_W_BF16); }

T2 float g4_dot_f32_avx2(const float *a, const float *b, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    float l[16];
    _mm256_storeu_ps(l, a0);
    _mm256_storeu_ps(l + 8, a1);
    for (int e = 0; i + e < n; e++) l[e] = fmaf(a[i + e], b[i + e], l[e]);
    return g4_fold16(l);
}

/* ---- integer path --------------------------------------------------------------------------- */

/* One group of four blocks: h = 0 covers blocks 0, 1 and h = 1 blocks 2, 3; lo[h] holds
 * elements 0..15 of the two blocks (one per 128-bit half), hi[h] elements 16..31. Codes are
 * signed values (u − off) when `sgn`, else unsigned codes. */
typedef struct {
    __m256i lo[2], hi[2];
    __m256 sw[2], sw2[2], bw[2];
} wgrp2;

typedef struct {
    const uint8_t *row;
    int r;
    const g4_mat *w;
} urow2;

/* F16C converts every half exactly, as g4_f16_to_f32 does. */
INLINE float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

INLINE float scale_at(const void *p, g4_dtype dt, size_t i) {
    if (dt == G4_DT_F32) return ((const float *)p)[i];
    if (dt == G4_DT_F16) return h2f((const uint8_t *)p + 2 * i);
    return g4_bf16_to_f32(((const uint16_t *)p)[i]);
}

INLINE __m256i pair128(__m128i a, __m128i b) { return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1); }
INLINE __m256 pairf(float a, float b) { return _mm256_insertf128_ps(_mm256_set1_ps(a), _mm_set1_ps(b), 1); }

/* 16 bytes → the 5th bits of one Q5 block as 0x10 bytes: lo (elements 0..15), hi (16..31). */
INLINE void q5_bits(uint32_t qh, __m128i *lo, __m128i *hi) {
    const __m128i sel_lo = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    __m128i v = _mm_cvtsi32_si128((int)qh), s16 = _mm_set1_epi8(16);
    __m128i l = _mm_shuffle_epi8(v, sel_lo), h = _mm_shuffle_epi8(v, _mm_add_epi8(sel_lo, _mm_set1_epi8(2)));
    *lo = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(l, bit), bit), s16);
    *hi = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(h, bit), bit), s16);
}

/* Q4_0 .. Q5_1, Q8_0: block k of group j. */
INLINE void small_block(const uint8_t *row, int b, g4_wtype t, __m128i *lo, __m128i *hi, float *sw, float *bw) {
    if (t == G4_W_Q8_0) {
        const uint8_t *k = row + 34 * (size_t)b;
        *sw = h2f(k);
        *lo = _mm_loadu_si128((const __m128i *)(k + 2)); /* signed values as stored */
        *hi = _mm_loadu_si128((const __m128i *)(k + 18));
        return;
    }
    int q5 = t == G4_W_Q5_0 || t == G4_W_Q5_1, q1 = t == G4_W_Q4_1 || t == G4_W_Q5_1;
    const uint8_t *k = row + (size_t)b * (18 + 2 * q1 + 4 * q5);
    *sw = h2f(k);
    if (q1) *bw = h2f(k + 2);
    __m128i v = _mm_loadu_si128((const __m128i *)(k + 2 + 2 * q1 + 4 * q5)), F = _mm_set1_epi8(15);
    __m128i l = _mm_and_si128(v, F), h = _mm_and_si128(_mm_srli_epi16(v, 4), F);
    if (q5) {
        uint32_t qh;
        memcpy(&qh, k + 2 + 2 * q1, 4);
        __m128i bl, bh;
        q5_bits(qh, &bl, &bh);
        l = _mm_or_si128(l, bl);
        h = _mm_or_si128(h, bh);
    }
    if (!q1) { /* Q4_0 / Q5_0: to signed values */
        __m128i o = _mm_set1_epi8(q5 ? 16 : 8);
        l = _mm_sub_epi8(l, o);
        h = _mm_sub_epi8(h, o);
    }
    *lo = l;
    *hi = h;
}

INLINE void unpack_small(const urow2 *rw, int j, g4_wtype t, wgrp2 *o) {
    __m128i lo[4], hi[4];
    float sw[4], bw[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) small_block(rw->row, 4 * j + k, t, &lo[k], &hi[k], &sw[k], &bw[k]);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        o->lo[h] = pair128(lo[2 * h], lo[2 * h + 1]);
        o->hi[h] = pair128(hi[2 * h], hi[2 * h + 1]);
        o->sw[h] = pairf(sw[2 * h], sw[2 * h + 1]);
        o->bw[h] = pairf(bw[2 * h], bw[2 * h + 1]);
    }
}

/* K-quants: blocks 4j..4j+3 of the row (x-blocks of 32 = sub-blocks of Q4_K / Q5_K). */
INLINE void unpack_k45(const urow2 *rw, int j, int q5, wgrp2 *o) {
    const uint8_t *p = rw->row + (size_t)(j / 2) * (q5 ? 176 : 144);
    float d = h2f(p), dmin = h2f(p + 2), sw[4], bw[4];
    __m128i lo[4], hi[4], F = _mm_set1_epi8(15);
    /* the eight 6-bit (sc, m) pairs with 32-bit word operations */
    uint32_t wa, wb, wc;
    memcpy(&wa, p + 4, 4);
    memcpy(&wb, p + 8, 4);
    memcpy(&wc, p + 12, 4);
    uint32_t scw = (j & 1) ? (wc & 0x0f0f0f0f) | ((wa >> 6) & 0x03030303) << 4 : wa & 0x3f3f3f3f;
    uint32_t mw = (j & 1) ? ((wc >> 4) & 0x0f0f0f0f) | ((wb >> 6) & 0x03030303) << 4 : wb & 0x3f3f3f3f;
    for (int k = 0; k < 4; k++) {
        int s = 4 * (j & 1) + k;
        sw[k] = d * (float)((scw >> 8 * k) & 0xff);
        bw[k] = -(dmin * (float)((mw >> 8 * k) & 0xff));
        const uint8_t *qs = p + (q5 ? 48 : 16) + 32 * (s / 2);
        __m128i a = _mm_loadu_si128((const __m128i *)qs), b = _mm_loadu_si128((const __m128i *)(qs + 16));
        if (s & 1) {
            a = _mm_srli_epi16(a, 4);
            b = _mm_srli_epi16(b, 4);
        }
        lo[k] = _mm_and_si128(a, F);
        hi[k] = _mm_and_si128(b, F);
        if (q5) {
            __m128i bit = _mm_set1_epi8((char)(1 << s)), s16 = _mm_set1_epi8(16);
            __m128i ha = _mm_loadu_si128((const __m128i *)(p + 16)), hb = _mm_loadu_si128((const __m128i *)(p + 32));
            lo[k] = _mm_or_si128(lo[k], _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(ha, bit), bit), s16));
            hi[k] = _mm_or_si128(hi[k], _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(hb, bit), bit), s16));
        }
    }
    for (int h = 0; h < 2; h++) {
        o->lo[h] = pair128(lo[2 * h], lo[2 * h + 1]);
        o->hi[h] = pair128(hi[2 * h], hi[2 * h + 1]);
        o->sw[h] = pairf(sw[2 * h], sw[2 * h + 1]);
        o->bw[h] = pairf(bw[2 * h], bw[2 * h + 1]);
    }
}

/* Q6_K group j = half h of super-block j/2: x-block k has low nibbles from ql (+32 for odd k,
 * high nibble for k ≥ 2) and 2 bits from qh at shift 2k. Signed values (u − 32). */
INLINE void unpack_q6k(const urow2 *rw, int j, wgrp2 *o) {
    const uint8_t *p = rw->row + (size_t)(j / 2) * 210;
    int h = j & 1;
    const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
    __m128i F = _mm_set1_epi8(15), three = _mm_set1_epi8(3), o32 = _mm_set1_epi8(32);
    __m128i H0 = _mm_loadu_si128((const __m128i *)qh), H1 = _mm_loadu_si128((const __m128i *)(qh + 16));
    __m128i lo[4], hi[4];
    for (int k = 0; k < 4; k++) {
        __m128i a = _mm_loadu_si128((const __m128i *)(ql + (k & 1) * 32)), b = _mm_loadu_si128((const __m128i *)(ql + (k & 1) * 32 + 16));
        if (k >= 2) {
            a = _mm_srli_epi16(a, 4);
            b = _mm_srli_epi16(b, 4);
        }
        __m128i sh = _mm_cvtsi32_si128(2 * k);
        __m128i ha = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(H0, sh), three), 4);
        __m128i hb = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(H1, sh), three), 4);
        lo[k] = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(a, F), ha), o32);
        hi[k] = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(b, F), hb), o32);
    }
    float d = h2f(p + 208);
    const int8_t *sc = (const int8_t *)(p + 192 + 8 * h);
    for (int q = 0; q < 2; q++) {
        o->lo[q] = pair128(lo[2 * q], lo[2 * q + 1]);
        o->hi[q] = pair128(hi[2 * q], hi[2 * q + 1]);
        o->sw[q] = pairf(d * (float)sc[4 * q], d * (float)sc[4 * q + 2]);
        o->sw2[q] = pairf(d * (float)sc[4 * q + 1], d * (float)sc[4 * q + 3]);
    }
}

/* AFFINE / SYMM: 2-, 4- and 8-bit streams in registers, other widths through g4_wblock_get.
 * SYMM codes become signed values; AFFINE codes stay unsigned (8-bit ones are re-centred by the
 * dot, see int_dot). */
INLINE void stream_block(const urow2 *rw, int b, int bits, int symm, __m128i *lo, __m128i *hi) {
    const uint8_t *p = rw->row + (size_t)b * 4 * bits;
    __m128i l, h;
    if (bits == 8) {
        l = _mm_loadu_si128((const __m128i *)p);
        h = _mm_loadu_si128((const __m128i *)(p + 16));
        if (!symm) { /* unsigned codes as signed values u − 128 */
            l = _mm_xor_si128(l, _mm_set1_epi8((char)0x80));
            h = _mm_xor_si128(h, _mm_set1_epi8((char)0x80));
        }
    } else if (bits == 4) {
        __m128i v = _mm_loadu_si128((const __m128i *)p), F = _mm_set1_epi8(15);
        __m128i ev = _mm_and_si128(v, F), od = _mm_and_si128(_mm_srli_epi16(v, 4), F);
        l = _mm_unpacklo_epi8(ev, od);
        h = _mm_unpackhi_epi8(ev, od);
    } else if (bits == 2) {
        __m128i v = _mm_loadl_epi64((const __m128i *)p), three = _mm_set1_epi8(3);
        __m128i t0 = _mm_and_si128(v, three), t1 = _mm_and_si128(_mm_srli_epi16(v, 2), three);
        __m128i t2 = _mm_and_si128(_mm_srli_epi16(v, 4), three), t3 = _mm_and_si128(_mm_srli_epi16(v, 6), three);
        __m128i a = _mm_unpacklo_epi8(t0, t1), c = _mm_unpacklo_epi8(t2, t3);
        l = _mm_unpacklo_epi16(a, c);
        h = _mm_unpackhi_epi16(a, c);
    } else { /* 3, 5, 6, 7 bits (AFFINE only): element by element from the stream */
        uint8_t u[32];
        for (int i = 0; i < 32; i++) u[i] = (uint8_t)g4_stream_code(p, i, bits);
        l = _mm_loadu_si128((const __m128i *)u);
        h = _mm_loadu_si128((const __m128i *)(u + 16));
    }
    if (symm && bits != 8) {
        __m128i o = _mm_set1_epi8((char)(1 << (bits - 1)));
        l = _mm_sub_epi8(l, o);
        h = _mm_sub_epi8(h, o);
    }
    *lo = l;
    *hi = h;
}

INLINE void unpack_stream(const urow2 *rw, int j, int symm, wgrp2 *o) {
    const g4_mat *w = rw->w;
    int G = w->group > 0 ? w->group : w->cols;
    size_t base = (size_t)rw->r * w->scale_stride;
    __m128i lo[4], hi[4];
    float sw[4], bw[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; k++) {
        int b = 4 * j + k;
        stream_block(rw, b, w->bits, symm, &lo[k], &hi[k]);
        size_t gi = base + (size_t)32 * b / (size_t)G;
        sw[k] = scale_at(w->scales, w->scale_dtype, gi);
        if (!symm) bw[k] = scale_at(w->biases, w->scale_dtype, gi);
    }
    for (int h = 0; h < 2; h++) {
        o->lo[h] = pair128(lo[2 * h], lo[2 * h + 1]);
        o->hi[h] = pair128(hi[2 * h], hi[2 * h + 1]);
        o->sw[h] = pairf(sw[2 * h], sw[2 * h + 1]);
        o->bw[h] = pairf(bw[2 * h], bw[2 * h + 1]);
    }
}

INLINE void unpack2(const urow2 *rw, int j, g4_wtype t, wgrp2 *o) {
    switch (t) {
    case G4_W_Q4_K: unpack_k45(rw, j, 0, o); break;
    case G4_W_Q5_K: unpack_k45(rw, j, 1, o); break;
    case G4_W_Q6_K: unpack_q6k(rw, j, o); break;
    case G4_W_AFFINE: unpack_stream(rw, j, 0, o); break;
    case G4_W_SYMM: unpack_stream(rw, j, 1, o); break;
    default: unpack_small(rw, j, t, o); break;
    }
}

/* Whether the unpacked codes are signed values (u − off) rather than unsigned codes. */
static inline int codes_signed(const g4_mat *w) {
    switch (w->type) {
    case G4_W_Q8_0: case G4_W_Q4_0: case G4_W_Q5_0: case G4_W_Q6_K: case G4_W_SYMM: return 1;
    case G4_W_AFFINE: return w->bits == 8;
    default: return 0;
    }
}

/* Σ over each 4 consecutive bytes of codes·x, as 8 int32 lanes (exact). */
INLINE __m256i dot4(__m256i c, __m256i x, int sgn) {
    const __m256i one16 = _mm256_set1_epi16(1);
    if (sgn) return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(c), _mm256_sign_epi8(x, c)), one16);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), one16);
}

INLINE void int_tile(const g4_rows_args *a, const urow2 *rw, int r, const int R, int m0, const int T, g4_wtype t,
                     int sgn, int recentre) {
    const g4_xprep *xp = a->xp;
    int nfull = xp->nb / 4, add = g4_wtype_additive(t), split = t == G4_W_Q6_K;
    size_t gbytes = a->w->row_bytes * 4 / (size_t)xp->nb; /* bytes of one 4-block group */
    __m256 acc[2][4][2];
#pragma GCC unroll 2
    for (int v = 0; v < R; v++)
#pragma GCC unroll 4
        for (int u = 0; u < T; u++) acc[v][u][0] = acc[v][u][1] = _mm256_setzero_ps();
    const __m256i ones8 = _mm256_set1_epi8(1);
    for (int j = 0; j < nfull; j++) {
        wgrp2 g[2];
#pragma GCC unroll 2
        for (int v = 0; v < R; v++) {
            /* a group is row_bytes·128/cols bytes; two lines cover it for every type but Q8_0 */
            const char *pf = (const char *)rw[v].row + (size_t)j * gbytes + PF_DIST;
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);
            if (gbytes > 128) _mm_prefetch(pf + 128, _MM_HINT_T0);
            unpack2(&rw[v], j, t, &g[v]);
        }
#pragma GCC unroll 4
        for (int u = 0; u < T; u++) {
            const int8_t *q = g4_xp_q(xp, m0 + u) + 128 * j;
            size_t f = g4_xp_f(xp, m0 + u) + 16 * j;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i xl = _mm256_loadu_si256((const __m256i *)(q + 32 * h));
                __m256i xh = _mm256_loadu_si256((const __m256i *)(q + 64 + 32 * h));
                __m256 d = _mm256_loadu_ps(xp->dx + f + 8 * h);
                __m256i L = _mm256_setzero_si256();
                if (recentre) /* 8-bit unsigned codes taken as u − 128: add back 128·Σxq */
                    L = _mm256_slli_epi32(_mm256_add_epi32(dot4(ones8, xl, 0), dot4(ones8, xh, 0)), 7);
#pragma GCC unroll 2
                for (int v = 0; v < R; v++) {
                    __m256i pl = dot4(g[v].lo[h], xl, sgn), ph = dot4(g[v].hi[h], xh, sgn);
                    __m256 *ac = &acc[v][u][h];
                    if (split) {
                        *ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pl), _mm256_mul_ps(g[v].sw[h], d), *ac);
                        *ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ph), _mm256_mul_ps(g[v].sw2[h], d), *ac);
                    } else {
                        __m256i pp = _mm256_add_epi32(_mm256_add_epi32(pl, ph), L);
                        *ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pp), _mm256_mul_ps(g[v].sw[h], d), *ac);
                        if (add) *ac = _mm256_fmadd_ps(_mm256_loadu_ps(xp->xs + f + 8 * h), g[v].bw[h], *ac);
                    }
                }
            }
        }
    }
    for (int v = 0; v < R; v++)
        for (int u = 0; u < T; u++) {
            float l[16];
            _mm256_storeu_ps(l, acc[v][u][0]);
            _mm256_storeu_ps(l + 8, acc[v][u][1]);
            for (int b = 4 * nfull; b < xp->nb; b++) {
                g4_wblock wb;
                g4_wblock_get(a->w, r + v, b, &wb);
                g4_wblock_accumulate(a->w, &wb, xp, m0 + u, b, l);
            }
            a->y[(size_t)(m0 + u) * a->ldy + r + v] = g4_fold16(l);
        }
}

INLINE void int_rows(const g4_rows_args *a, int r0, int r1, g4_wtype t) {
    const g4_mat *w = a->w;
    int sgn = codes_signed(w), recentre = t == G4_W_AFFINE && w->bits == 8;
    for (int r = r0; r < r1;) {
        urow2 rw[2];
        int n = a->M == 1 && r + 2 <= r1 ? 2 : 1;
        for (int v = 0; v < n; v++) {
            rw[v].row = (const uint8_t *)w->data + (size_t)(r + v) * w->row_bytes;
            rw[v].r = r + v;
            rw[v].w = w;
        }
        if (n == 2) {
            int_tile(a, rw, r, 2, 0, 1, t, sgn, recentre);
        } else {
            int m0 = 0;
            for (; m0 + 4 <= a->M; m0 += 4) int_tile(a, rw, r, 1, m0, 4, t, sgn, recentre);
            switch (a->M - m0) {
            case 3: int_tile(a, rw, r, 1, m0, 3, t, sgn, recentre); break;
            case 2: int_tile(a, rw, r, 1, m0, 2, t, sgn, recentre); break;
            case 1: int_tile(a, rw, r, 1, m0, 1, t, sgn, recentre); break;
            default: break;
            }
        }
        r += n;
    }
}

#define INT_ROWS(name, T_) \
    T2 static void name(const g4_rows_args *a, int r0, int r1) { int_rows(a, r0, r1, T_); }
INT_ROWS(rows_q8_0, G4_W_Q8_0)
INT_ROWS(rows_q4_0, G4_W_Q4_0)
INT_ROWS(rows_q4_1, G4_W_Q4_1)
INT_ROWS(rows_q5_0, G4_W_Q5_0)
INT_ROWS(rows_q5_1, G4_W_Q5_1)
INT_ROWS(rows_q4_k, G4_W_Q4_K)
INT_ROWS(rows_q5_k, G4_W_Q5_K)
INT_ROWS(rows_q6_k, G4_W_Q6_K)
INT_ROWS(rows_affine, G4_W_AFFINE)
INT_ROWS(rows_symm, G4_W_SYMM)

void g4_rows_avx2(const g4_rows_args *a, int r0, int r1) {
    static void (*const fns[G4_W_COUNT])(const g4_rows_args *, int, int) = {
        rows_f32, rows_f16, rows_bf16, rows_q8_0, rows_q4_0, rows_q4_1, rows_q5_0,
        rows_q5_1, rows_q4_k, rows_q5_k, rows_q6_k, rows_affine, rows_symm,
    };
    if (a->w->split) g4_rows_split_scalar(a, r0, r1); /* the split layout is repacked for AVX-512 only */
    else if (a->w->type < G4_W_COUNT) fns[a->w->type](a, r0, r1);
}

/* ---- activations: step 1 of the canonical order ---------------------------------------------- */

T2 void g4_xprep_token_avx2(const g4_mat *w, const float *xr, const g4_xprep *xp, int m) {
    int off = g4_wtype_offset(w), split = w->type == G4_W_Q6_K;
    int8_t *q = xp->xq + (size_t)m * xp->ngrp * 128;
    size_t f = g4_xp_f(xp, m);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i ones8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1), noff = _mm256_set1_epi32(-off);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int j = 0; j < xp->ngrp; j++) {
        float dxs[4] = {0, 0, 0, 0};
        int8_t *qg = q + 128 * j;
        for (int k = 0; k < 4 && 4 * j + k < xp->nb; k++) {
            const float *xb = xr + 32 * (4 * j + k);
            __m256 v[4], mx;
            for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(xb + 8 * i);
            mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absm), _mm256_and_ps(v[1], absm)),
                               _mm256_max_ps(_mm256_and_ps(v[2], absm), _mm256_and_ps(v[3], absm)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            float id = amax > 0 ? 127.0f / amax : 0.0f;
            dxs[k] = amax / 127.0f;
            __m256 vid = _mm256_set1_ps(id);
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], vid));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], vid));
            /* packs work per 128-bit lane: restore element order with one dword permute */
            __m256i p16a = _mm256_packs_epi32(i0, i1), p16b = _mm256_packs_epi32(i2, i3);
            __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), perm);
            _mm_storeu_si128((__m128i *)(qg + 16 * k), _mm256_castsi256_si128(p8));
            _mm_storeu_si128((__m128i *)(qg + 64 + 16 * k), _mm256_extracti128_si256(p8, 1));
        }
        for (int h = 0; h < 2; h++) {
            __m256i xl = _mm256_loadu_si256((const __m256i *)(qg + 32 * h));
            __m256i xh = _mm256_loadu_si256((const __m256i *)(qg + 64 + 32 * h));
            __m256i llo = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xl), one16);
            __m256i lhi = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xh), one16);
            _mm256_storeu_ps(xp->dx + f + 16 * j + 8 * h, _mm256_insertf128_ps(_mm256_set1_ps(dxs[2 * h]), _mm_set1_ps(dxs[2 * h + 1]), 1));
            if (split) {
                _mm256_storeu_si256((__m256i *)(xp->c0 + f + 16 * j + 8 * h), _mm256_mullo_epi32(llo, noff));
                _mm256_storeu_si256((__m256i *)(xp->c1 + f + 16 * j + 8 * h), _mm256_mullo_epi32(lhi, noff));
            } else {
                _mm256_storeu_si256((__m256i *)(xp->c0 + f + 16 * j + 8 * h), _mm256_mullo_epi32(_mm256_add_epi32(llo, lhi), noff));
            }
        }
    }
}
