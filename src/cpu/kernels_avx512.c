/* AVX-512 kernels (F, BW, VL, VNNI, VBMI): the canonical order of kernels_internal.h, bit for bit.
 *
 * Integer path: one weight group = four 32-blocks = 128 columns. Each type's unpacker turns a
 * group into two byte vectors of unsigned codes — `lo` (elements 0..15 of block k in 128-bit lane
 * k) and `hi` (elements 16..31) — plus 16-lane float factors (lane 4k+g: the block's scale, bias).
 * Then for each token: P = dpbusd(dpbusd(c0, lo, xlo), hi, xhi) gives exactly the canonical
 * integer P_lo + P_hi per lane (c0 = −off·Σxq undoes the code offset), converted and fma'd into
 * that token's 16 accumulator lanes. A group is unpacked once per row and token tile, so with M
 * tokens the weights are read from memory once and decoded ceil(M/4) times. */
#include <immintrin.h>
#include <string.h>

#include "cpu/kernels_internal.h"

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) T512

/* The 16-lane fold of kernels_internal.h (lane j += lane j + w for w = 8, 4, 2, 1) in registers:
 * the same additions in the same pairs, so the same bits as g4_fold16. */
INLINE float fold16v(__m512 a) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    return _mm_cvtss_f32(q);
}

/* Software prefetch distance in each weight row (bytes): with the core busy decoding, the
 * hardware prefetcher alone left DRAM streaming at ~35 % of the measured bandwidth at M = 1. */
#define PF_DIST 4096

/* The split loops at M = 1 walk SPLIT_STREAMS rows from far-apart parts of a thread's range in
 * lockstep (one row from each quarter), so each core keeps several independent DRAM streams in
 * flight while it decodes, and prefetch every stream's codes PF_SPLIT_M1 bytes ahead into L1 (and
 * the first PF_SPLIT_M1 bytes of each stream when a range starts; 0: no code prefetch); the loops
 * at M > 1 prefetch each row's codes PF_SPLIT bytes ahead. On the earlier 2-core Intel AVX-512
 * machine 2048 bytes won at M = 1 (262144 x 1536, 2 threads: Q4_0 30.0 -> 31.8 GB/s, Q8_0 31.4 ->
 * 33.1 against 4 adjacent rows with L2 prefetches 4 KB ahead). On the AMD Zen 5 machine, E2B
 * decode with the distance switched every 2 tokens inside one process (so the machine's drifting
 * bandwidth hits each alike; 100-150 tokens each, ctx 128, 2 threads), tok/s at 0 / 1024 / 2048:
 * Q4_0 30.6 / 31.4 / 30.3, 31.8 / 32.1 / 31.3, 31.9 / 31.9 / 30.6; Q8_0 15.7 / 16.7 / 16.8,
 * 12.9 / 14.7 / 14.8; QAT mixed 29.6 / 33.8 / 32.8, 30.1 / 33.3 / 33.4. (A matmul alone, each
 * variant called in turn on the same 800 MB of Q4_0 matrices, had favoured no prefetch at all:
 * 1536 x 6144 45.6 GB/s at 2048 against 56.3 at 0; inside the forward pass it loses.) Dropping
 * the M > 1 prefetch cost E2B Q4_0 prefill 8%. All three are build-time settings (e.g.
 * EXTRA_CFLAGS=-DPF_SPLIT_M1=2048) for A/B runs (scripts/cpu_ab.sh). SPLIT_BLOCK: bytes of codes
 * per row block at M > 1 (split_rows). */
#ifndef SPLIT_STREAMS
#define SPLIT_STREAMS 4
#endif
#ifndef PF_SPLIT
#define PF_SPLIT 2048
#endif
#ifndef PF_SPLIT_M1
#define PF_SPLIT_M1 1024
#endif
enum { SPLIT_BLOCK = 64 * 1024 };
#ifndef PF_SCALES
#define PF_SCALES 256
#endif

/* ---- float path ----------------------------------------------------------------------------- */

INLINE __m512 load_w16(g4_wtype t, const uint8_t *row, int i) {
    if (t == G4_W_F32) return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (t == G4_W_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE __m512 maskload_w16(g4_wtype t, const uint8_t *row, int i, __mmask16 k) {
    if (t == G4_W_F32) return _mm512_maskz_loadu_ps(k, (const float *)row + i);
    __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)row + i);
    if (t == G4_W_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* R rows × T tokens of the float path (R·T ≤ 16 accumulator chains). */
INLINE void float_tile(const g4_rows_args *a, int r, const int R, int m0, const int T, g4_wtype t) {
    int K = a->w->cols, i = 0;
    const float *x = a->x + (size_t)m0 * K;
    const uint8_t *row[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int v = 0; v < R; v++) {
        row[v] = (const uint8_t *)a->w->data + (size_t)(r + v) * a->w->row_bytes;
#pragma GCC unroll 4
        for (int u = 0; u < T; u++) acc[v][u] = _mm512_setzero_ps();
    }
    size_t es = t == G4_W_F32 ? 4 : 2;
    for (; i + 16 <= K; i += 16) {
        __m512 w[4];
#pragma GCC unroll 4
        for (int v = 0; v < R; v++) {
            _mm_prefetch((const char *)row[v] + es * i + PF_DIST, _MM_HINT_T1);
            w[v] = load_w16(t, row[v], i);
        }
#pragma GCC unroll 4
        for (int u = 0; u < T; u++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)u * K + i);
#pragma GCC unroll 4
            for (int v = 0; v < R; v++) acc[v][u] = _mm512_fmadd_ps(xv, w[v], acc[v][u]);
        }
    }
    if (i < K) { /* masked lanes keep their accumulator untouched, as the scalar loop does */
        __mmask16 k = (__mmask16)((1u << (K - i)) - 1);
#pragma GCC unroll 4
        for (int v = 0; v < R; v++) {
            __m512 w = maskload_w16(t, row[v], i, k);
#pragma GCC unroll 4
            for (int u = 0; u < T; u++)
                acc[v][u] = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(k, x + (size_t)u * K + i), w, acc[v][u], k);
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < R; v++)
#pragma GCC unroll 4
        for (int u = 0; u < T; u++) a->y[(size_t)(m0 + u) * a->ldy + r + v] = fold16v(acc[v][u]);
}

INLINE void float_rowset(const g4_rows_args *a, int r, const int R, g4_wtype t) {
    int m0 = 0;
    for (; m0 + 4 <= a->M; m0 += 4) float_tile(a, r, R, m0, 4, t);
    const int R2 = R < 2 ? R : 2; /* 2- and 3-token remainders: at most 2 rows per tile */
    switch (a->M - m0) {
    case 3:
        for (int rr = 0; rr < R; rr += R2) float_tile(a, r + rr, R2, m0, 3, t);
        break;
    case 2:
        for (int rr = 0; rr < R; rr += R2) float_tile(a, r + rr, R2, m0, 2, t);
        break;
    case 1: float_tile(a, r, R, m0, 1, t); break;
    default: break;
    }
}

INLINE void float_rows(const g4_rows_args *a, int r0, int r1, g4_wtype t) {
    /* 4 rows at a time for one token and for blocks of 4+ tokens (4 × 4 tiles: 8 loads per 16
     * multiply-adds; attention's scores are 4 or 8 heads against the keys), else 2 */
    int R = a->M == 1 || a->M >= 4 ? 4 : 2;
    for (int r = r0; r < r1;) {
        int n = r1 - r >= R ? R : 1;
        if (n == 4) float_rowset(a, r, 4, t);
        else if (n == 2) float_rowset(a, r, 2, t);
        else float_rowset(a, r, 1, t);
        r += n;
    }
}

T512 static void rows_f32(const g4_rows_args *a, int r0, int r1) { float_rows(a, r0, r1, G4_W_F32); }
T512 static void rows_f16(const g4_rows_args *a, int r0, int r1) { float_rows(a, r0, r1, G4_W_F16); }
T512 static void rows_bf16(const g4_rows_args *a, int r0, int r1) { float_rows(a, r0, r1, G4_W_BF16); }

T512 float g4_dot_f32_avx512(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), acc, k);
    }
    float l[16];
    _mm512_storeu_ps(l, acc);
    return g4_fold16(l);
}

/* ---- integer path --------------------------------------------------------------------------- */

typedef struct {
    __m512i lo, hi;
    __m512 sw, sw2, bw;
} wgrp;

/* Per-call constants and per-row state of the unpackers. */
typedef struct {
    __m512i idx_a, idx_b, idx_c, idx_d, bitpat, ctrl, sh; /* meaning depends on the type */
    __m512i e4, e4p4, e2, e4x2, e4x2p1;                  /* lane 4k+g -> k, k+4, k/2, 2k, 2k+1 */
    int bits, gsize;
} uctx;

/* One row being decoded. */
typedef struct {
    const uint8_t *row;
    const float *sf, *bf; /* AFFINE / SYMM: the row's scales (biases) as float, one per group */
    float s_row, b_row;   /* ... or the single one of a row with one group */
} urow;

INLINE __m512 expand4(__m128 v, __m512i e4) { return _mm512_permutexvar_ps(e4, _mm512_castps128_ps512(v)); }

INLINE __m512 half4(const uint8_t *p, size_t stride, __m512i e4) {
    uint64_t h = 0;
    for (int k = 0; k < 4; k++) h |= (uint64_t)(p[stride * k] | p[stride * k + 1] << 8) << (16 * k);
    return expand4(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)), e4);
}

static const __m512i *vtab(uint8_t t[64]) { return (const __m512i *)t; }

/* idx_a: the 64 code bytes of a group's four blocks; idx_b: the 32 bytes of their 16 f16 `d`
 * words (d of block k repeated in lanes 4k..4k+3); idx_c: same for `m`; idx_d / bitpat: Q5's
 * high-bit bytes and the bit each element tests. */
T512 static void setup_q_small(uctx *c, int bb, int d_at, int m_at, int qh_at, int qs_at) {
    uint8_t a[64], b[64] = {0}, cc[64] = {0}, d[64], bp[64];
    for (int k = 0; k < 4; k++)
        for (int e = 0; e < 16; e++) {
            a[16 * k + e] = (uint8_t)(bb * k + qs_at + e);
            d[16 * k + e] = (uint8_t)(bb * k + qh_at + e / 8);
            bp[16 * k + e] = (uint8_t)(1u << (e % 8));
        }
    for (int w = 0; w < 16; w++) {
        int k = w / 4;
        b[2 * w] = (uint8_t)(bb * k + d_at);
        b[2 * w + 1] = (uint8_t)(bb * k + d_at + 1);
        cc[2 * w] = (uint8_t)(bb * k + m_at);
        cc[2 * w + 1] = (uint8_t)(bb * k + m_at + 1);
    }
    c->idx_a = _mm512_loadu_si512(vtab(a));
    c->idx_b = _mm512_loadu_si512(vtab(b));
    c->idx_c = _mm512_loadu_si512(vtab(cc));
    c->idx_d = _mm512_loadu_si512(vtab(d));
    c->bitpat = _mm512_loadu_si512(vtab(bp));
}

/* Q4_0, Q4_1, Q5_0, Q5_1: a group spans 4·bb ≤ 96 bytes; two permutes gather codes and scales. */
INLINE void unpack_q_small(const uctx *c, const urow *rw, int j, g4_wtype t, wgrp *o) {
    int q5 = t == G4_W_Q5_0 || t == G4_W_Q5_1, q1 = t == G4_W_Q4_1 || t == G4_W_Q5_1;
    int bb = 18 + 2 * q1 + 4 * q5;
    const uint8_t *p = rw->row + (size_t)j * 4 * bb;
    __m512i A = _mm512_loadu_si512(p);
    __m512i B = _mm512_maskz_loadu_epi8((__mmask64)((1ull << (4 * bb - 64)) - 1), p + 64);
    __m512i v = _mm512_permutex2var_epi8(A, c->idx_a, B), F = _mm512_set1_epi8(15);
    o->lo = _mm512_and_si512(v, F);
    o->hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), F);
    o->sw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(A, c->idx_b, B)));
    if (q1) o->bw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(A, c->idx_c, B)));
    if (q5) {
        /* element e of block k has its 5th bit in qh byte e/8 (lo) or 2 + e/8 (hi), bit e%8 */
        __m512i h = _mm512_permutex2var_epi8(A, c->idx_d, B), s16 = _mm512_set1_epi8(16);
        o->lo = _mm512_mask_add_epi8(o->lo, _mm512_test_epi8_mask(h, c->bitpat), o->lo, s16);
        h = _mm512_permutex2var_epi8(A, _mm512_add_epi8(c->idx_d, _mm512_set1_epi8(2)), B);
        o->hi = _mm512_mask_add_epi8(o->hi, _mm512_test_epi8_mask(h, c->bitpat), o->hi, s16);
    }
}

INLINE void unpack_q8_0(const uctx *c, const urow *rw, int j, wgrp *o) {
    const uint8_t *p = rw->row + (size_t)j * 4 * 34;
    __m512i lo = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 2)));
    __m512i hi = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 18)));
    /* the lane index must be an immediate, also at -O1 (sanitizer builds): no loop */
    lo = _mm512_inserti32x4(lo, _mm_loadu_si128((const __m128i *)(p + 34 + 2)), 1);
    hi = _mm512_inserti32x4(hi, _mm_loadu_si128((const __m128i *)(p + 34 + 18)), 1);
    lo = _mm512_inserti32x4(lo, _mm_loadu_si128((const __m128i *)(p + 68 + 2)), 2);
    hi = _mm512_inserti32x4(hi, _mm_loadu_si128((const __m128i *)(p + 68 + 18)), 2);
    lo = _mm512_inserti32x4(lo, _mm_loadu_si128((const __m128i *)(p + 102 + 2)), 3);
    hi = _mm512_inserti32x4(hi, _mm_loadu_si128((const __m128i *)(p + 102 + 18)), 3);
    __m512i s = _mm512_set1_epi8((char)0x80);
    o->lo = _mm512_xor_si512(lo, s);
    o->hi = _mm512_xor_si512(hi, s);
    o->sw = half4(p, 34, c->e4);
}

/* K-quants: per super-block the eight 6-bit (sc, m) pairs, decoded with 32-bit word tricks. */
INLINE void k_scales(const uint8_t *s, uint64_t *sc8, uint64_t *m8) {
    uint32_t a, b, cw;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&cw, s + 8, 4);
    uint32_t sc_lo = a & 0x3f3f3f3f, m_lo = b & 0x3f3f3f3f;
    uint32_t sc_hi = (cw & 0x0f0f0f0f) | ((a >> 6) & 0x03030303) << 4;
    uint32_t m_hi = ((cw >> 4) & 0x0f0f0f0f) | ((b >> 6) & 0x03030303) << 4;
    *sc8 = sc_lo | (uint64_t)sc_hi << 32;
    *m8 = m_lo | (uint64_t)m_hi << 32;
}

INLINE __m256 u8x8_to_ps(uint64_t v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v))); }

/* K-quants decode their scales once per super-block (two groups): s8/b8 hold the eight
 * sub-block factors (Q6_K: the eight int8 scales of one half ×d live in s8 per half). */
INLINE void kdec45(const uint8_t *p, __m256 *s8, __m256 *b8) {
    uint64_t sc8, m8;
    k_scales(p + 4, &sc8, &m8);
    __m256 d = _mm256_set1_ps(g4_f16_to_f32((uint16_t)(p[0] | p[1] << 8)));
    __m256 dm = _mm256_set1_ps(g4_f16_to_f32((uint16_t)(p[2] | p[3] << 8)));
    *s8 = _mm256_mul_ps(d, u8x8_to_ps(sc8));
    *b8 = _mm256_xor_ps(_mm256_mul_ps(dm, u8x8_to_ps(m8)), _mm256_set1_ps(-0.0f));
}

/* Q4_K / Q5_K codes of group j (super-block j/2, sub-blocks 4·(j%2) + k). */
INLINE void codes_qk45(const uctx *c, const uint8_t *p, int h, int q5, __m256 s8, __m256 b8, wgrp *o) {
    __m512i sel = h ? c->e4p4 : c->e4;
    o->sw = _mm512_permutexvar_ps(sel, _mm512_castps256_ps512(s8));
    o->bw = _mm512_permutexvar_ps(sel, _mm512_castps256_ps512(b8));
    const uint8_t *qs = p + (q5 ? 48 : 16) + 64 * h;
    __m512i G = _mm512_loadu_si512(qs), F = _mm512_set1_epi8(15);
    __m512i vlo = _mm512_shuffle_i64x2(G, G, _MM_SHUFFLE(2, 2, 0, 0));
    __m512i vhi = _mm512_shuffle_i64x2(G, G, _MM_SHUFFLE(3, 3, 1, 1));
    o->lo = _mm512_and_si512(_mm512_srlv_epi16(vlo, c->sh), F);
    o->hi = _mm512_and_si512(_mm512_srlv_epi16(vhi, c->sh), F);
    if (q5) {
        __m512i s16 = _mm512_set1_epi8(16), bp = h ? c->idx_b : c->idx_a;
        __m512i H = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + 16)));
        o->lo = _mm512_mask_add_epi8(o->lo, _mm512_test_epi8_mask(H, bp), o->lo, s16);
        H = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + 32)));
        o->hi = _mm512_mask_add_epi8(o->hi, _mm512_test_epi8_mask(H, bp), o->hi, s16);
    }
}

INLINE void kdec6(const uint8_t *p, __m256 *s8a, __m256 *s8b) {
    __m256 d = _mm256_set1_ps(g4_f16_to_f32((uint16_t)(p[208] | p[209] << 8)));
    __m128i sc = _mm_loadu_si128((const __m128i *)(p + 192));
    *s8a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    *s8b = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
}

/* Q6_K codes of group j = half h of super-block j/2 (x-blocks 4h + k); s8 = that half's scales. */
INLINE void codes_q6k(const uctx *c, const uint8_t *p, int h, __m256 s8, wgrp *o) {
    __m512i L = _mm512_loadu_si512(p + 64 * h), F = _mm512_set1_epi8(15), three = _mm512_set1_epi8(3);
    __m512i vlo = _mm512_shuffle_i64x2(L, L, _MM_SHUFFLE(2, 0, 2, 0));
    __m512i vhi = _mm512_shuffle_i64x2(L, L, _MM_SHUFFLE(3, 1, 3, 1));
    const uint8_t *qh = p + 128 + 32 * h;
    __m512i Hlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qh));
    __m512i Hhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(qh + 16)));
    /* sh: per-lane nibble shifts 0,0,4,4; ctrl: per-lane 2-bit shifts 0,2,4,6 */
    __m512i l4 = _mm512_and_si512(_mm512_srlv_epi16(vlo, c->sh), F);
    __m512i h4 = _mm512_and_si512(_mm512_srlv_epi16(vhi, c->sh), F);
    __m512i l2 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(Hlo, c->ctrl), three), 4);
    __m512i h2 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(Hhi, c->ctrl), three), 4);
    o->lo = _mm512_or_si512(l4, l2);
    o->hi = _mm512_or_si512(h4, h2);
    o->sw = _mm512_permutexvar_ps(c->e4x2, _mm512_castps256_ps512(s8));
    o->sw2 = _mm512_permutexvar_ps(c->e4x2p1, _mm512_castps256_ps512(s8));
}

/* AFFINE / SYMM: a group is 16·bits bytes of an LSB-first stream. Two byte permutes give every
 * output qword its own 8-byte window (8 codes), vpmultishiftqb moves each code to bit 0. */
T512 static void setup_stream(uctx *c, int bits) {
    uint8_t lo[64], hi[64], ctrl[64];
    for (int k = 0; k < 4; k++)
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 8; i++) {
                lo[16 * k + 8 * h + i] = (uint8_t)((4 * k + h) * bits + i);
                hi[16 * k + 8 * h + i] = (uint8_t)((4 * k + 2 + h) * bits + i);
                ctrl[16 * k + 8 * h + i] = (uint8_t)(i * bits);
            }
    c->idx_a = _mm512_loadu_si512(vtab(lo));
    c->idx_b = _mm512_loadu_si512(vtab(hi));
    c->ctrl = _mm512_loadu_si512(vtab(ctrl));
    c->bits = bits;
}

INLINE __m512 group_factor(const uctx *c, const float *f, float row_value, int j) {
    int G = c->gsize;
    if (G % 128 == 0) return _mm512_set1_ps(f ? f[(size_t)128 * j / G] : row_value);
    if (G == 32) return expand4(_mm_loadu_ps(f + 4 * j), c->e4);
    if (G == 64) return _mm512_permutexvar_ps(c->e2, _mm512_castps128_ps512(
                                                  _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(f + 2 * j)))));
    return expand4(_mm_setr_ps(f[(128 * j) / G], f[(128 * j + 32) / G], f[(128 * j + 64) / G], f[(128 * j + 96) / G]), c->e4);
}

INLINE void unpack_stream(const uctx *c, const urow *rw, int j, int symm, wgrp *o) {
    int bits = c->bits, nbytes = 16 * bits;
    const uint8_t *p = rw->row + (size_t)j * nbytes;
    __m512i A, B;
    if (nbytes >= 64) {
        A = _mm512_loadu_si512(p);
        B = nbytes == 128 ? _mm512_loadu_si512(p + 64)
            : nbytes > 64 ? _mm512_maskz_loadu_epi8((__mmask64)((1ull << (nbytes - 64)) - 1), p + 64)
                          : _mm512_setzero_si512();
    } else {
        A = _mm512_maskz_loadu_epi8((__mmask64)((1ull << nbytes) - 1), p);
        B = _mm512_setzero_si512();
    }
    __m512i lo = _mm512_multishift_epi64_epi8(c->ctrl, _mm512_permutex2var_epi8(A, c->idx_a, B));
    __m512i hi = _mm512_multishift_epi64_epi8(c->ctrl, _mm512_permutex2var_epi8(A, c->idx_b, B));
    if (bits == 8) {
        if (symm) {
            lo = _mm512_xor_si512(lo, _mm512_set1_epi8((char)0x80));
            hi = _mm512_xor_si512(hi, _mm512_set1_epi8((char)0x80));
        }
    } else {
        __m512i msk = _mm512_set1_epi8((char)((1 << bits) - 1));
        lo = _mm512_and_si512(lo, msk);
        hi = _mm512_and_si512(hi, msk);
    }
    o->lo = lo;
    o->hi = hi;
    o->sw = group_factor(c, rw->sf, rw->s_row, j);
    if (!symm) o->bw = group_factor(c, rw->bf, rw->b_row, j);
}

INLINE void unpack(const uctx *c, const urow *rw, int j, g4_wtype t, wgrp *o) {
    switch (t) {
    case G4_W_Q8_0: unpack_q8_0(c, rw, j, o); break;
    case G4_W_Q4_0: case G4_W_Q4_1: case G4_W_Q5_0: case G4_W_Q5_1: unpack_q_small(c, rw, j, t, o); break;
    case G4_W_AFFINE: unpack_stream(c, rw, j, 0, o); break;
    default: unpack_stream(c, rw, j, 1, o); break;
    }
}

T512 static void setup(uctx *c, const g4_mat *w) {
    memset(c, 0, sizeof *c);
    c->e4 = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2);
    c->e4p4 = _mm512_add_epi32(c->e4, _mm512_set1_epi32(4));
    c->e2 = _mm512_srli_epi32(c->e4, 1);
    c->e4x2 = _mm512_add_epi32(c->e4, c->e4);
    c->e4x2p1 = _mm512_add_epi32(c->e4x2, _mm512_set1_epi32(1));
    switch (w->type) {
    case G4_W_Q4_0: setup_q_small(c, 18, 0, 0, 0, 2); break;
    case G4_W_Q4_1: setup_q_small(c, 20, 0, 2, 0, 4); break;
    case G4_W_Q5_0: setup_q_small(c, 22, 0, 0, 2, 6); break;
    case G4_W_Q5_1: setup_q_small(c, 24, 0, 2, 4, 8); break;
    case G4_W_Q4_K: case G4_W_Q5_K: {
        uint8_t b0[64], b1[64];
        for (int i = 0; i < 64; i++) {
            b0[i] = (uint8_t)(1u << (i / 16));
            b1[i] = (uint8_t)(1u << (4 + i / 16));
        }
        c->idx_a = _mm512_loadu_si512(vtab(b0));
        c->idx_b = _mm512_loadu_si512(vtab(b1));
        c->sh = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0, 0x0004000400040004LL,
                                  0x0004000400040004LL);
        break;
    }
    case G4_W_Q6_K:
        c->sh = _mm512_setr_epi64(0, 0, 0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL,
                                  0x0004000400040004LL);
        c->ctrl = _mm512_setr_epi64(0, 0, 0x0002000200020002LL, 0x0002000200020002LL, 0x0004000400040004LL,
                                    0x0004000400040004LL, 0x0006000600060006LL, 0x0006000600060006LL);
        break;
    case G4_W_AFFINE: case G4_W_SYMM:
        setup_stream(c, w->bits);
        c->gsize = w->group > 0 ? w->group : w->cols;
        break;
    default: break;
    }
}

/* Largest row (in groups of scales) whose AFFINE/SYMM factors are converted on the stack. */
#define MAX_ROW_GROUPS 1024

/* n scale elements from index base as float: F32 in place, F16 / BF16 converted into buf. */
T512 static const float *conv_row(const void *src, g4_dtype dt, size_t base, int n, float *buf) {
    if (dt == G4_DT_F32) return (const float *)src + base;
    const uint16_t *h = (const uint16_t *)src + base;
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
        __m256i v = _mm256_maskz_loadu_epi16(k, h + i);
        __m512 f = dt == G4_DT_F16 ? _mm512_cvtph_ps(v) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
        _mm512_mask_storeu_ps(buf + i, k, f);
    }
    return buf;
}

/* Converts row r's scales (and biases) to float for group_factor. Returns 0 when the row must
 * take the scalar path (too many groups for the stack buffers). */
T512 static int row_factors(const uctx *c, urow *rw, const g4_mat *w, int r, float *sf, float *bf) {
    int G = c->gsize, ng = w->cols / G;
    size_t base = (size_t)r * w->scale_stride;
    if (G % 128 == 0 && ng == 1) {
        rw->sf = rw->bf = NULL;
        rw->s_row = g4_scale_at(w->scales, w->scale_dtype, base);
        rw->b_row = w->biases ? g4_scale_at(w->biases, w->scale_dtype, base) : 0;
        return 1;
    }
    if (ng > MAX_ROW_GROUPS) return 0;
    rw->sf = conv_row(w->scales, w->scale_dtype, base, ng, sf);
    rw->bf = w->biases ? conv_row(w->biases, w->scale_dtype, base, ng, bf) : NULL;
    return 1;
}

/* Bytes of one 128-column group for the types decoded a group at a time. */
INLINE size_t group_bytes(const uctx *c, g4_wtype t) {
    switch (t) {
    case G4_W_Q8_0: return 4 * 34;
    case G4_W_Q4_0: return 4 * 18;
    case G4_W_Q4_1: return 4 * 20;
    case G4_W_Q5_0: return 4 * 22;
    case G4_W_Q5_1: return 4 * 24;
    default: return (size_t)16 * c->bits;
    }
}

/* The per-token half of step 4 for one group j, R rows × T tokens. */
INLINE void group_acc(const g4_xprep *xp, int m0, int j, const wgrp *g, __m512 acc[4][4], const int R, const int T,
                      g4_wtype t) {
    int add = g4_wtype_additive(t), split = t == G4_W_Q6_K;
#pragma GCC unroll 4
    for (int u = 0; u < T; u++) {
        const int8_t *q = g4_xp_q(xp, m0 + u) + 128 * j;
        size_t f = g4_xp_f(xp, m0 + u) + 16 * j;
        __m512i xl = _mm512_loadu_si512(q), xh = _mm512_loadu_si512(q + 64);
        __m512i k0 = _mm512_loadu_si512(xp->c0 + f);
        __m512 d = _mm512_loadu_ps(xp->dx + f);
        if (split) {
            __m512i k1 = _mm512_loadu_si512(xp->c1 + f);
#pragma GCC unroll 4
            for (int v = 0; v < R; v++) {
                __m512i pl = _mm512_dpbusd_epi32(k0, g[v].lo, xl);
                __m512i ph = _mm512_dpbusd_epi32(k1, g[v].hi, xh);
                acc[v][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pl), _mm512_mul_ps(g[v].sw, d), acc[v][u]);
                acc[v][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ph), _mm512_mul_ps(g[v].sw2, d), acc[v][u]);
            }
        } else {
            __m512 xs = add ? _mm512_loadu_ps(xp->xs + f) : d;
#pragma GCC unroll 4
            for (int v = 0; v < R; v++) {
                __m512i pp = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(k0, g[v].lo, xl), g[v].hi, xh);
                acc[v][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pp), _mm512_mul_ps(g[v].sw, d), acc[v][u]);
                if (add) acc[v][u] = _mm512_fmadd_ps(xs, g[v].bw, acc[v][u]);
            }
        }
    }
}

/* R rows × T tokens: R·T independent accumulator chains, each weight group decoded once per
 * tile. */
INLINE void int_tile(const g4_rows_args *a, const uctx *c, const urow *rw, int r, const int R, int m0, const int T,
                     g4_wtype t) {
    const g4_xprep *xp = a->xp;
    int nfull = xp->nb / 4;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int u = 0; u < T; u++)
#pragma GCC unroll 4
        for (int v = 0; v < R; v++) acc[v][u] = _mm512_setzero_ps();
    if (t == G4_W_Q4_K || t == G4_W_Q5_K || t == G4_W_Q6_K) {
        /* super-blocks: scales once, then the two groups; cols % 256 == 0 so nfull is even */
        int q5 = t == G4_W_Q5_K, sbytes = t == G4_W_Q6_K ? 210 : q5 ? 176 : 144;
        for (int j = 0; j < nfull; j += 2) {
            __m256 s8[4][2], b8[4];
            const uint8_t *p[4];
#pragma GCC unroll 4
            for (int v = 0; v < R; v++) {
                p[v] = rw[v].row + (size_t)(j / 2) * sbytes;
                _mm_prefetch((const char *)p[v] + PF_DIST, _MM_HINT_T1);
                _mm_prefetch((const char *)p[v] + PF_DIST + 64, _MM_HINT_T1);
                _mm_prefetch((const char *)p[v] + PF_DIST + 128, _MM_HINT_T1);
                if (t == G4_W_Q6_K) kdec6(p[v], &s8[v][0], &s8[v][1]);
                else kdec45(p[v], &s8[v][0], &b8[v]);
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                wgrp g[4];
#pragma GCC unroll 4
                for (int v = 0; v < R; v++) {
                    if (t == G4_W_Q6_K) codes_q6k(c, p[v], h, s8[v][h], &g[v]);
                    else codes_qk45(c, p[v], h, q5, s8[v][0], b8[v], &g[v]);
                }
                group_acc(xp, m0, j + h, g, acc, R, T, t);
            }
        }
    } else {
        size_t gb = group_bytes(c, t);
        for (int j = 0; j < nfull; j++) {
            wgrp g[4];
#pragma GCC unroll 4
            for (int v = 0; v < R; v++) {
                /* stay PF_DIST bytes ahead of the decode in every row (past a row's end this is
                 * the next row's start: rows are contiguous); prefetches never fault */
                _mm_prefetch((const char *)rw[v].row + (size_t)j * gb + PF_DIST, _MM_HINT_T1);
                _mm_prefetch((const char *)rw[v].row + (size_t)j * gb + PF_DIST + 64, _MM_HINT_T1);
                unpack(c, &rw[v], j, t, &g[v]);
            }
            group_acc(xp, m0, j, g, acc, R, T, t);
        }
    }
    float l[4][4][16];
#pragma GCC unroll 4
    for (int v = 0; v < R; v++)
#pragma GCC unroll 4
        for (int u = 0; u < T; u++) _mm512_storeu_ps(l[v][u], acc[v][u]);
    for (int v = 0; v < R; v++)
        for (int u = 0; u < T; u++) {
            for (int b = 4 * nfull; b < xp->nb; b++) { /* a last partial group: the scalar steps */
                g4_wblock wb;
                g4_wblock_get(a->w, r + v, b, &wb);
                g4_wblock_accumulate(a->w, &wb, xp, m0 + u, b, l[v][u]);
            }
            a->y[(size_t)(m0 + u) * a->ldy + r + v] = g4_fold16(l[v][u]);
        }
}

/* All tokens for rows [r, r + R): tiles of 4 tokens (2 rows) or 1 token (4 rows at M = 1). */
INLINE void int_rowset(const g4_rows_args *a, const uctx *c, const urow *rw, int r, const int R, g4_wtype t) {
    int m0 = 0;
    if (R == 2 || R == 1)
        for (; m0 + 4 <= a->M; m0 += 4) int_tile(a, c, rw, r, R, m0, 4, t);
    switch (a->M - m0) {
    case 3: int_tile(a, c, rw, r, R < 2 ? R : 2, m0, 3, t); break;
    case 2: int_tile(a, c, rw, r, R < 2 ? R : 2, m0, 2, t); break;
    case 1: int_tile(a, c, rw, r, R, m0, 1, t); break;
    default: break;
    }
}

INLINE void int_rows(const g4_rows_args *a, int r0, int r1, g4_wtype t) {
    const g4_mat *w = a->w;
    uctx c;
    setup(&c, w);
    int stream = t == G4_W_AFFINE || t == G4_W_SYMM;
    float sf[4][MAX_ROW_GROUPS], bf[4][MAX_ROW_GROUPS];
    int kq = t == G4_W_Q4_K || t == G4_W_Q5_K || t == G4_W_Q6_K;
    int R = a->M == 1 && !kq ? 4 : 2;
    for (int r = r0; r < r1;) {
        int n = r1 - r >= R ? R : 1;
        urow rw[4];
        int ok = 1;
        for (int v = 0; v < n; v++) {
            rw[v].row = (const uint8_t *)w->data + (size_t)(r + v) * w->row_bytes;
            if (stream) ok &= row_factors(&c, &rw[v], w, r + v, sf[v], bf[v]);
        }
        if (!ok) g4_rows_scalar(a, r, r + n);
        else if (n == 4) int_rowset(a, &c, rw, r, 4, t);
        else if (n == 2) int_rowset(a, &c, rw, r, 2, t);
        else int_rowset(a, &c, rw, r, 1, t);
        r += n;
    }
}

/* ---- the split layout (quant.h): dedicated loops ------------------------------------------------
 * Per super-group of 16 blocks and row: the code vectors k[0..7] (chunk s: four codes of each
 * block, 8-bit chunks as loaded, 4-bit chunks split into low / high nibbles, 2-bit chunks into
 * four code positions), then per token
 * eight dpbusd into one lane per block and the canonical float step once for all 16 blocks. */
typedef struct {
    const uint8_t *codes;
    const float *sf, *bf;          /* SM_BUF: the row's scales (biases) per block */
    const uint8_t *sraw, *braw;    /* the row's scale (bias) arrays as stored */
    float s_row, b_row;            /* SM_ROW */
    int row;                       /* the output row */
} srow;

/* Row r's scales (or biases) expanded to one float per block into out (nb floats), vectorised
 * for groups of 32..512 columns dividing 512; other groups one block at a time. */
T512 static const float *block_factors(const g4_mat *w, const void *src, size_t base, float *tmp, float *out) {
    int G = w->group > 0 ? w->group : w->cols, ng = w->cols / G, nb = w->cols / 32;
    const float *f = conv_row(src, w->scale_dtype, base, ng, tmp);
    if (G == 32) return f;
    if (G <= 512 && 512 % G == 0) {
        int per = G / 32; /* blocks per group: 2, 4, 8 or 16 */
        __m512i idx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        per == 2 ? 1 : per == 4 ? 2 : per == 8 ? 3 : 4);
        for (int g = 0; 16 * g < nb; g++) {
            int first = 16 * g / per, left = ng - first;
            __mmask16 k = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
            __m512 v = _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(k, f + first));
            int n = nb - 16 * g;
            _mm512_mask_storeu_ps(out + 16 * g, (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1), v);
        }
        return out;
    }
    for (int b = 0; b < nb; b++) out[b] = f[(size_t)32 * b / (size_t)G];
    return out;
}

/* Where a super-group's 16 block scales (biases) come from: a per-row float buffer (any group),
 * one value per row, or group-32 arrays read and converted in the loop (F16, BF16). */
enum { SM_BUF, SM_ROW, SM_F16, SM_BF16, SM_F16_64, SM_BF16_64 };

INLINE __m512 split_scales(const srow *rw, int bias, int g, __mmask16 lanes, const int sm) {
    if (sm == SM_F16_64 || sm == SM_BF16_64) { /* group 64: 8 values, each for two blocks */
        const __m512i e2 = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 1);
        __mmask16 k8 = (__mmask16)((1u << ((__builtin_popcount(lanes) + 1) / 2)) - 1);
        __m256i h = _mm256_maskz_loadu_epi16(k8, (const uint16_t *)(bias ? rw->braw : rw->sraw) + 8 * g);
        __m512 f = sm == SM_F16_64 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        return _mm512_maskz_permutexvar_ps(lanes, e2, f);
    }
    switch (sm) {
    case SM_ROW: return _mm512_set1_ps(bias ? rw->b_row : rw->s_row);
    case SM_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, (const uint16_t *)(bias ? rw->braw : rw->sraw) + 16 * g));
    case SM_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, (const uint16_t *)(bias ? rw->braw : rw->sraw) + 16 * g)), 16));
    default: return _mm512_maskz_loadu_ps(lanes, (bias ? rw->bf : rw->sf) + 16 * g);
    }
}

/* Prefetch a super-group's codes (64·bits bytes) pf bytes ahead (none at 0), and its scales
 * PF_SCALES ahead. */
INLINE void split_prefetch(const srow *rw, const uint8_t *p, int g, const int bits, const int add, const int sm, const int pf) {
#pragma GCC unroll 8
    for (int c = 0; pf > 0 && c < bits; c++) _mm_prefetch((const char *)p + pf + 64 * c, _MM_HINT_T0);
    if (PF_SCALES > 0 && (sm == SM_F16 || sm == SM_BF16)) _mm_prefetch((const char *)rw->sraw + 32 * (size_t)g + PF_SCALES, _MM_HINT_T0);
    if (PF_SCALES > 0 && (sm == SM_F16_64 || sm == SM_BF16_64)) {
        _mm_prefetch((const char *)rw->sraw + 16 * (size_t)g + PF_SCALES, _MM_HINT_T0);
        if (add) _mm_prefetch((const char *)rw->braw + 16 * (size_t)g + PF_SCALES, _MM_HINT_T0);
    }
}

/* Chunk c of a super-group's codes (n blocks: chunk stride 4n bytes). */
INLINE __m512i split_chunk(const uint8_t *p, int c, int n, __mmask64 bytes) {
    return n == 16 ? _mm512_loadu_si512(p + 64 * c) : _mm512_maskz_loadu_epi8(bytes, p + 4 * (size_t)n * c);
}

/* The canonical float step of one (row, token) and super-group: acc += float(P)·(s·dx) (+ xs·b),
 * lanes of missing blocks untouched (as the scalar loop leaves them). */
INLINE __m512 split_step(__m512 acc, __m512i P, __m512 sw, __m512 bw, const g4_xprep *xp, size_t f, int n, __mmask16 lanes,
                         const int add) {
    __m512 d = _mm512_loadu_ps(xp->dx + f);
    if (n == 16) {
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(P), _mm512_mul_ps(sw, d), acc);
        if (add) acc = _mm512_fmadd_ps(_mm512_loadu_ps(xp->xs + f), bw, acc);
    } else {
        acc = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(P), _mm512_mul_ps(sw, d), acc, lanes);
        if (add) acc = _mm512_mask3_fmadd_ps(_mm512_loadu_ps(xp->xs + f), bw, acc, lanes);
    }
    return acc;
}

/* One token, R rows (M = 1). The integer sums of a (row, super-group) are taken in two (4-bit,
 * 8-bit) or four (2-bit) chains of dpbusd, walked chunk by chunk with the R rows interleaved, so
 * 2R (4R) independent chains are in flight in program order: on the AMD Zen 5 core the per-row
 * order (one row's chains, then the next row's) left the dpbusd unit waiting on its latency.
 * 4-bit: the second chain takes the high nibbles as 16·code (andnot, no shift), so it holds
 * exactly 16 times its share and one arithmetic shift restores it; 2-bit: chain j holds 4^j times
 * its share. All integer and exact: the sum is the same in any order. */
INLINE void split_tile_rows(const g4_rows_args *a, const srow *rw, const int R, const int bits, const int add, const int sm) {
    const g4_xprep *xp = a->xp;
    const int nb = xp->nb, nsg = xp->nsg;
    const __m512i F = _mm512_set1_epi8(15);
    enum { CH = 4 };
    __m512 acc[4];
#pragma GCC unroll 4
    for (int v = 0; v < R; v++) acc[v] = _mm512_setzero_ps();
    const int8_t *q0 = g4_xp_q(xp, 0);
    for (int g = 0; g < nsg; g++) {
        const int n = nb - 16 * g < 16 ? nb - 16 * g : 16;
        const __mmask16 lanes = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
        const __mmask64 bytes = n == 16 ? ~0ull : (1ull << (4 * n)) - 1;
        const int8_t *q = q0 + 512 * (size_t)g;
        const size_t f = 16 * (size_t)g;
        const uint8_t *p[4];
        __m512i P[4][CH];
#pragma GCC unroll 4
        for (int v = 0; v < R; v++) {
            p[v] = rw[v].codes + (size_t)g * 64 * bits;
            split_prefetch(&rw[v], p[v], g, bits, add, sm, PF_SPLIT_M1);
            P[v][0] = _mm512_loadu_si512(xp->c0 + f);
#pragma GCC unroll 4
            for (int j = 1; j < CH; j++) P[v][j] = _mm512_setzero_si512();
        }
        if (bits == 2) {
#pragma GCC unroll 2
            for (int c = 0; c < 2; c++)
#pragma GCC unroll 4
                for (int v = 0; v < R; v++) {
                    __m512i A = split_chunk(p[v], c, n, bytes);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        P[v][j] = _mm512_dpbusd_epi32(P[v][j], _mm512_and_si512(A, _mm512_set1_epi8((char)(3 << (2 * j)))),
                                                      _mm512_loadu_si512(q + 64 * (4 * c + j)));
                }
        } else if (bits == 8) {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
#pragma GCC unroll 4
                for (int v = 0; v < R; v++) {
                    P[v][0] = _mm512_dpbusd_epi32(P[v][0], split_chunk(p[v], c, n, bytes), _mm512_loadu_si512(q + 64 * c));
                    P[v][1] = _mm512_dpbusd_epi32(P[v][1], split_chunk(p[v], c + 4, n, bytes), _mm512_loadu_si512(q + 64 * (c + 4)));
                }
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
#pragma GCC unroll 4
                for (int v = 0; v < R; v++) {
                    __m512i A = split_chunk(p[v], c, n, bytes);
                    P[v][0] = _mm512_dpbusd_epi32(P[v][0], _mm512_and_si512(A, F), _mm512_loadu_si512(q + 64 * (2 * c)));
                    P[v][1] = _mm512_dpbusd_epi32(P[v][1], _mm512_andnot_si512(F, A), _mm512_loadu_si512(q + 64 * (2 * c + 1)));
                }
        }
#pragma GCC unroll 4
        for (int v = 0; v < R; v++) {
            __m512i S;
            if (bits == 2)
                S = _mm512_add_epi32(_mm512_add_epi32(P[v][0], _mm512_srai_epi32(P[v][1], 2)),
                                     _mm512_add_epi32(_mm512_srai_epi32(P[v][2], 4), _mm512_srai_epi32(P[v][3], 6)));
            else S = _mm512_add_epi32(P[v][0], bits == 4 ? _mm512_srai_epi32(P[v][1], 4) : P[v][1]);
            __m512 sw = split_scales(&rw[v], 0, g, lanes, sm);
            __m512 bw = add ? split_scales(&rw[v], 1, g, lanes, sm) : sw;
            acc[v] = split_step(acc[v], S, sw, bw, xp, f, n, lanes, add);
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < R; v++) a->y[rw[v].row] = fold16v(acc[v]);
}

/* One row, T tokens (m0 .. m0+T-1). The row's codes are unpacked once per super-group into their
 * plain values (0..2^bits − 1, eight vectors), then each token's sum is one chain of eight dpbusd,
 * the T chains interleaved chunk by chunk (T independent chains in flight in program order). */
INLINE void split_tile_toks(const g4_rows_args *a, const srow *rw, int m0, const int T, const int bits, const int add,
                            const int sm) {
    const g4_xprep *xp = a->xp;
    const int nb = xp->nb, nsg = xp->nsg;
    const __m512i F = _mm512_set1_epi8(15), T3 = _mm512_set1_epi8(3);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int u = 0; u < T; u++) acc[u] = _mm512_setzero_ps();
    const size_t qstride = (size_t)nsg * 512, fstride = (size_t)nsg * 16;
    const int8_t *q0 = g4_xp_q(xp, m0);
    const size_t f0 = g4_xp_f(xp, m0);
    for (int g = 0; g < nsg; g++) {
        const int n = nb - 16 * g < 16 ? nb - 16 * g : 16;
        const __mmask16 lanes = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
        const __mmask64 bytes = n == 16 ? ~0ull : (1ull << (4 * n)) - 1;
        const uint8_t *p = rw->codes + (size_t)g * 64 * bits;
        split_prefetch(rw, p, g, bits, add, sm, PF_SPLIT);
        __m512i k[8];
        if (bits == 2) {
#pragma GCC unroll 2
            for (int c = 0; c < 2; c++) {
                __m512i A = split_chunk(p, c, n, bytes);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) k[4 * c + j] = _mm512_and_si512(_mm512_srli_epi16(A, 2 * j), T3);
            }
        } else if (bits == 8) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) k[c] = split_chunk(p, c, n, bytes);
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512i A = split_chunk(p, c, n, bytes);
                k[2 * c] = _mm512_and_si512(A, F);
                k[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(A, 4), F);
            }
        }
        __m512 sw = split_scales(rw, 0, g, lanes, sm);
        __m512 bw = add ? split_scales(rw, 1, g, lanes, sm) : sw;
        __m512i P[8];
#pragma GCC unroll 8
        for (int u = 0; u < T; u++) P[u] = _mm512_loadu_si512(xp->c0 + f0 + (size_t)u * fstride + 16 * (size_t)g);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++)
#pragma GCC unroll 8
            for (int u = 0; u < T; u++)
                P[u] = _mm512_dpbusd_epi32(P[u], k[s], _mm512_loadu_si512(q0 + (size_t)u * qstride + 512 * (size_t)g + 64 * s));
#pragma GCC unroll 8
        for (int u = 0; u < T; u++)
            acc[u] = split_step(acc[u], P[u], sw, bw, xp, f0 + (size_t)u * fstride + 16 * (size_t)g, n, lanes, add);
    }
#pragma GCC unroll 8
    for (int u = 0; u < T; u++) a->y[(size_t)(m0 + u) * a->ldy + rw->row] = fold16v(acc[u]);
}

/* One row, T = 1..8 tokens from m0 (T a run-time value, each case its own unrolled loop). */
INLINE void split_toks(const g4_rows_args *a, const srow *rw, int m0, int T, const int bits, const int add, const int sm) {
    switch (T) {
    case 8: split_tile_toks(a, rw, m0, 8, bits, add, sm); break;
    case 7: split_tile_toks(a, rw, m0, 7, bits, add, sm); break;
    case 6: split_tile_toks(a, rw, m0, 6, bits, add, sm); break;
    case 5: split_tile_toks(a, rw, m0, 5, bits, add, sm); break;
    case 4: split_tile_toks(a, rw, m0, 4, bits, add, sm); break;
    case 3: split_tile_toks(a, rw, m0, 3, bits, add, sm); break;
    case 2: split_tile_toks(a, rw, m0, 2, bits, add, sm); break;
    case 1: split_tile_toks(a, rw, m0, 1, bits, add, sm); break;
    default: break;
    }
}

/* Blocks per row whose factors are expanded on the stack (beyond: the scalar rows). */
#define MAX_ROW_BLOCKS 2048

/* Row r's pointers (and SM_ROW / SM_BUF factors) for the split loops; ss: the scale element's
 * size, looked up once per call of split_rows (an out-of-line call per row cost ~1% of decode). */
INLINE void split_row_setup(const g4_mat *w, int r, srow *rw, float *tmp, float *sf, float *bf, size_t ss, const int add,
                            const int sm) {
    size_t base = (size_t)r * w->scale_stride;
    rw->row = r;
    rw->codes = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    rw->sraw = (const uint8_t *)w->scales + base * ss;
    rw->braw = add ? (const uint8_t *)w->biases + base * ss : NULL;
    if (sm == SM_ROW) {
        rw->s_row = g4_scale_at(w->scales, w->scale_dtype, base);
        rw->b_row = add ? g4_scale_at(w->biases, w->scale_dtype, base) : 0;
    } else if (sm == SM_BUF) {
        rw->sf = block_factors(w, w->scales, base, tmp, sf);
        if (rw->sf == tmp) { /* keep the converted row apart from the next one */
            memcpy(sf, tmp, sizeof(float) * (size_t)(w->cols / 32));
            rw->sf = sf;
        }
        rw->bf = add ? block_factors(w, w->biases, base, tmp, bf) : NULL;
        if (add && rw->bf == tmp) {
            memcpy(bf, tmp, sizeof(float) * (size_t)(w->cols / 32));
            rw->bf = bf;
        }
    }
}

/* Bytes at the start of a new M = 1 stream (n bytes long) prefetched when a range starts:
 * PF_SPLIT_M1, none at 0. */
INLINE size_t split_head(size_t n) { return PF_SPLIT_M1 <= 0 ? 0 : n > (size_t)PF_SPLIT_M1 ? (size_t)PF_SPLIT_M1 : n; }

INLINE void split_rows(const g4_rows_args *a, int r0, int r1, const int bits, const int add, const int sm) {
    const g4_mat *w = a->w;
    float tmp[MAX_ROW_BLOCKS], sf[4][MAX_ROW_BLOCKS], bf[4][MAX_ROW_BLOCKS];
    const int S = SPLIT_STREAMS, q = (r1 - r0) / S;
    const size_t ss = g4_dtype_size(w->scale_dtype);
    if (a->M > 1) {
        /* Several tokens: blocks of rows (about SPLIT_BLOCK bytes of codes, so they stay in L2),
         * and per block one tile of T tokens at a time over all its rows, so the tile's quantised
         * activations (T·cols bytes) stay in L1 while the block's rows pass; each row's codes are
         * unpacked once per tile. A row is set up again for every tile: free for the scale kinds
         * read in the loop, a conversion of cols/32 factors for SM_BUF (about 1% of the tile's
         * work at 1536 columns). */
        const int T = w->cols <= 2048 ? 8 : 4;
        int RB = (int)(SPLIT_BLOCK / (w->row_bytes ? w->row_bytes : 1));
        if (RB < 1) RB = 1;
        for (int rb = r0; rb < r1; rb += RB) {
            const int re = r1 - rb < RB ? r1 : rb + RB;
            for (int m0 = 0; m0 < a->M; m0 += T)
                for (int r = rb; r < re; r++) {
                    srow rw;
                    split_row_setup(w, r, &rw, tmp, sf[0], bf[0], ss, add, sm);
                    split_toks(a, &rw, m0, a->M - m0 < T ? a->M - m0 : T, bits, add, sm);
                }
        }
        return;
    }
    if (q > 0) {
        /* one token: S row streams, far apart, walked in lockstep (row r0 + s·q + i in lane s);
         * the rest (< S rows) below */
        for (int st = 0; st < S; st++) {
            const char *p0 = (const char *)w->data + (size_t)(r0 + st * q) * w->row_bytes;
            size_t n = (size_t)q * w->row_bytes;
            for (size_t o = 0; o < split_head(n); o += 64) _mm_prefetch(p0 + o, _MM_HINT_T0);
        }
        for (int i = 0; i < q; i++) {
            srow rw[SPLIT_STREAMS];
            for (int v = 0; v < S; v++) split_row_setup(w, r0 + v * q + i, &rw[v], tmp, sf[v], bf[v], ss, add, sm);
            split_tile_rows(a, rw, SPLIT_STREAMS, bits, add, sm);
        }
        r0 += S * q;
    } else { /* the loop prefetches PF_SPLIT_M1 ahead: start the first PF_SPLIT_M1 bytes of this range now */
        const char *p0 = (const char *)w->data + (size_t)r0 * w->row_bytes;
        size_t n = (size_t)(r1 - r0) * w->row_bytes;
        for (size_t o = 0; o < split_head(n); o += 64) _mm_prefetch(p0 + o, _MM_HINT_T0);
    }
    for (int r = r0; r < r1;) {
        int n = r1 - r >= 4 ? 4 : r1 - r >= 2 ? 2 : 1;
        srow rw[4];
        for (int v = 0; v < n; v++) split_row_setup(w, r + v, &rw[v], tmp, sf[v], bf[v], ss, add, sm);
        if (n == 4) split_tile_rows(a, rw, 4, bits, add, sm);
        else if (n == 2) split_tile_rows(a, rw, 2, bits, add, sm);
        else split_tile_rows(a, rw, 1, bits, add, sm);
        r += n;
    }
}

#define SPLIT_FN(bits, add, sm) \
    T512 static void split_##bits##_##add##_##sm(const g4_rows_args *a, int r0, int r1) { split_rows(a, r0, r1, bits, add, sm); }
#define SPLIT_FNS(bits, add) SPLIT_FN(bits, add, SM_BUF) SPLIT_FN(bits, add, SM_ROW) SPLIT_FN(bits, add, SM_F16) \
    SPLIT_FN(bits, add, SM_BF16) SPLIT_FN(bits, add, SM_F16_64) SPLIT_FN(bits, add, SM_BF16_64)
SPLIT_FNS(2, 0)
SPLIT_FNS(2, 1)
SPLIT_FNS(4, 0)
SPLIT_FNS(4, 1)
SPLIT_FNS(8, 0)
SPLIT_FNS(8, 1)

T512 static void rows_split(const g4_rows_args *a, int r0, int r1) {
#define SPLIT_ROW(bits, add)                                                                                  \
    {split_##bits##_##add##_SM_BUF, split_##bits##_##add##_SM_ROW, split_##bits##_##add##_SM_F16, split_##bits##_##add##_SM_BF16, \
     split_##bits##_##add##_SM_F16_64, split_##bits##_##add##_SM_BF16_64}
    static void (*const fns[3][2][6])(const g4_rows_args *, int, int) = {
        {SPLIT_ROW(2, 0), SPLIT_ROW(2, 1)},
        {SPLIT_ROW(4, 0), SPLIT_ROW(4, 1)},
        {SPLIT_ROW(8, 0), SPLIT_ROW(8, 1)},
    };
#undef SPLIT_ROW
    const g4_mat *w = a->w;
    int G = w->group > 0 ? w->group : w->cols;
    if (w->cols / 32 > MAX_ROW_BLOCKS) {
        g4_rows_split_scalar(a, r0, r1);
        return;
    }
    int sm = G == w->cols ? SM_ROW
           : G == 32 && w->scale_dtype == G4_DT_F16 ? SM_F16
           : G == 32 && w->scale_dtype == G4_DT_BF16 ? SM_BF16
           : G == 64 && w->scale_dtype == G4_DT_F16  ? SM_F16_64
           : G == 64 && w->scale_dtype == G4_DT_BF16 ? SM_BF16_64
                                                      : SM_BUF;
    fns[w->bits == 8 ? 2 : w->bits == 4][w->type == G4_W_AFFINE][sm](a, r0, r1);
}

#define INT_ROWS(name, T_) \
    T512 static void name(const g4_rows_args *a, int r0, int r1) { int_rows(a, r0, r1, T_); }
INT_ROWS(rows_q8_0, G4_W_Q8_0)
INT_ROWS(rows_q4_0, G4_W_Q4_0)
INT_ROWS(rows_q4_1, G4_W_Q4_1)
INT_ROWS(rows_q5_0, G4_W_Q5_0)
INT_ROWS(rows_q5_1, G4_W_Q5_1)
INT_ROWS(rows_q4_k, G4_W_Q4_K)
INT_ROWS(rows_q5_k, G4_W_Q5_K)
INT_ROWS(rows_q6_k, G4_W_Q6_K)
T512 static void rows_affine(const g4_rows_args *a, int r0, int r1) {
    if (a->w->split) rows_split(a, r0, r1);
    else int_rows(a, r0, r1, G4_W_AFFINE);
}
T512 static void rows_symm(const g4_rows_args *a, int r0, int r1) {
    if (a->w->split) rows_split(a, r0, r1);
    else int_rows(a, r0, r1, G4_W_SYMM);
}

void g4_rows_avx512(const g4_rows_args *a, int r0, int r1) {
    static void (*const fns[G4_W_COUNT])(const g4_rows_args *, int, int) = {
        rows_f32, rows_f16, rows_bf16, rows_q8_0, rows_q4_0, rows_q4_1, rows_q5_0,
        rows_q5_1, rows_q4_k, rows_q5_k, rows_q6_k, rows_affine, rows_symm,
    };
    if (a->w->type < G4_W_COUNT) fns[a->w->type](a, r0, r1);
}

/* ---- activations: step 1 of the canonical order ---------------------------------------------- */

T512 void g4_xprep_token_avx512(const g4_mat *w, const float *xr, const g4_xprep *xp, int m) {
    int off = g4_wtype_offset(w), split = w->type == G4_W_Q6_K;
    int8_t *q = xp->xq + (size_t)m * xp->ngrp * 128;
    size_t f = g4_xp_f(xp, m);
    __m512i ones = _mm512_set1_epi8(1), noff = _mm512_set1_epi32(-off);
    __m512i e4 = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2);
    for (int j = 0; j < xp->ngrp; j++) {
        float dxs[4] = {0, 0, 0, 0};
        int8_t *qg = q + 128 * j;
        for (int k = 0; k < 4 && 4 * j + k < xp->nb; k++) {
            const float *xb = xr + 32 * (4 * j + k);
            __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            float id = amax > 0 ? 127.0f / amax : 0.0f;
            dxs[k] = amax / 127.0f;
            __m512 vid = _mm512_set1_ps(id);
            /* cvtps2dq rounds half to even (the default MXCSR mode), as the scalar reference does */
            _mm_storeu_si128((__m128i *)(qg + 16 * k), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vid))));
            _mm_storeu_si128((__m128i *)(qg + 64 + 16 * k), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vid))));
        }
        _mm512_storeu_ps(xp->dx + f + 16 * j, _mm512_permutexvar_ps(e4, _mm512_castps128_ps512(_mm_loadu_ps(dxs))));
        __m512i llo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(qg));
        __m512i lhi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(qg + 64));
        if (split) {
            _mm512_storeu_si512(xp->c0 + f + 16 * j, _mm512_mullo_epi32(llo, noff));
            _mm512_storeu_si512(xp->c1 + f + 16 * j, _mm512_mullo_epi32(lhi, noff));
        } else {
            _mm512_storeu_si512(xp->c0 + f + 16 * j, _mm512_mullo_epi32(_mm512_add_epi32(llo, lhi), noff));
        }
    }
}

/* Split layout, step 1: the scalar g4_xprep_token_split's bytes, a block at a time. */
T512 void g4_xprep_token_split_avx512(const g4_mat *w, const float *xr, const g4_xprep *xp, int m) {
    int off = g4_wtype_offset(w), add = g4_wtype_additive(w->type);
    int8_t *q = (int8_t *)g4_xp_q(xp, m);
    size_t f = g4_xp_f(xp, m);
    for (int g = 0; g < xp->nsg; g++) {
        _mm512_storeu_si512(q + 512 * g + 0, _mm512_setzero_si512());
        for (int c = 1; c < 8; c++) _mm512_storeu_si512(q + 512 * g + 64 * c, _mm512_setzero_si512());
        _mm512_storeu_ps(xp->dx + f + 16 * g, _mm512_setzero_ps());
        _mm512_storeu_si512(xp->c0 + f + 16 * g, _mm512_setzero_si512());
        if (add) _mm512_storeu_ps(xp->xs + f + 16 * g, _mm512_setzero_ps());
    }
    for (int b = 0; b < xp->nb; b++) {
        const float *xb = xr + 32 * b;
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        __m512 vid = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
        uint32_t d[8];
        _mm_storeu_si128((__m128i *)d, _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(d + 4), _mm512_cvtepi32_epi8(i1));
        int8_t *dst = q + g4_xp_split_at(b, 0);
        for (int s = 0; s < 8; s++) memcpy(dst + 64 * s, &d[s], 4);
        xp->dx[f + (size_t)b] = amax / 127.0f;
        xp->c0[f + (size_t)b] = -off * _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        if (add) {
            float xs = xb[0];
            for (int i = 1; i < 32; i++) xs += xb[i];
            xp->xs[f + (size_t)b] = xs;
        }
    }
}
