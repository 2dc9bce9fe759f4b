/* Quantise / dequantise for every weight storage type. Scalar only: writers run these once per
 * tensor, and the matmul kernels never dequantise to floats (see kernels.c). */
#include "cpu/quant.h"

#include "cpu/kernels_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

static const struct { int cols, bytes; } block_info[G4_W_COUNT] = {
    [G4_W_F32] = {1, 4},     [G4_W_F16] = {1, 2},     [G4_W_BF16] = {1, 2},
    [G4_W_Q8_0] = {32, 34},  [G4_W_Q4_0] = {32, 18},  [G4_W_Q4_1] = {32, 20},
    [G4_W_Q5_0] = {32, 22},  [G4_W_Q5_1] = {32, 24},  [G4_W_Q4_K] = {256, 144},
    [G4_W_Q5_K] = {256, 176}, [G4_W_Q6_K] = {256, 210}, [G4_W_AFFINE] = {32, 0},
    [G4_W_SYMM] = {32, 0},
};

int g4_wtype_block_cols(g4_wtype t) { return t < G4_W_COUNT ? block_info[t].cols : 0; }

size_t g4_wtype_row_bytes(g4_wtype t, int cols, int bits) {
    if (t >= G4_W_COUNT || cols <= 0 || cols % block_info[t].cols) return 0;
    if (t == G4_W_AFFINE) return bits >= 2 && bits <= 8 ? (size_t)cols * bits / 8 : 0;
    if (t == G4_W_SYMM) return bits == 2 || bits == 4 || bits == 8 ? (size_t)cols * bits / 8 : 0;
    return (size_t)cols / block_info[t].cols * block_info[t].bytes;
}

float g4_round_even(float v) {
    /* Adding and removing 2^23 leaves an integer rounded to even; larger magnitudes (and NaN,
     * infinities) are integers already. */
    if (!(fabsf(v) < 8388608.0f)) return v;
    float big = v < 0 ? -8388608.0f : 8388608.0f;
    volatile float t = v + big; /* volatile: keep the two roundings apart */
    return t - big;
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static inline float h2f(const uint8_t *p) { return g4_f16_to_f32(rd16(p)); }

/* The value of largest magnitude, sign kept (the first one on ties), as ggml's Q4_0/Q5_0 use. */
static float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void minmax(const float *x, int n, float *mn, float *mx) {
    float a = FLT_MAX, b = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < a) a = x[j];
        if (x[j] > b) b = x[j];
    }
    *mn = a;
    *mx = b;
}

/* ---- 32-element blocks ---------------------------------------------------------------------- */

static void q8_0_block(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    wr16(b, g4_f32_to_f16(d));
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* Q4_0 / Q5_0: d = (value of largest magnitude) / −2^(bits−1); q = min(2^bits − 1, trunc(x/d + 2^(bits−1) + 0.5)). */
static void q_0_block(const float *x, uint8_t *b, int bits) {
    float half = (float)(1 << (bits - 1)), d = signed_absmax(x, 32) / -half, id = d ? 1.0f / d : 0.0f;
    int top = (1 << bits) - 1;
    uint8_t q[32];
    for (int j = 0; j < 32; j++) {
        int v = (int)(x[j] * id + (half + 0.5f));
        q[j] = (uint8_t)(v > top ? top : v < 0 ? 0 : v);
    }
    wr16(b, g4_f32_to_f16(d));
    uint8_t *qs = b + 2;
    if (bits == 5) {
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
        wr32(b + 2, qh);
        qs = b + 6;
    }
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
}

/* Q4_1 / Q5_1: d = (max − min)/(2^bits − 1), m = min, q = min(top, trunc((x − min)/d + 0.5)). */
static void q_1_block(const float *x, uint8_t *b, int bits) {
    float mn, mx;
    minmax(x, 32, &mn, &mx);
    int top = (1 << bits) - 1;
    float d = (mx - mn) / top, id = d ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int j = 0; j < 32; j++) {
        int v = (int)((x[j] - mn) * id + 0.5f);
        q[j] = (uint8_t)(v > top ? top : v < 0 ? 0 : v);
    }
    wr16(b, g4_f32_to_f16(d));
    wr16(b + 2, g4_f32_to_f16(mn));
    uint8_t *qs = b + 4;
    if (bits == 5) {
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
        wr32(b + 4, qh);
        qs = b + 8;
    }
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
}

static void dq_32(g4_wtype t, const uint8_t *b, float *y) {
    switch (t) {
    case G4_W_Q8_0: {
        float d = h2f(b);
        for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
        break;
    }
    case G4_W_Q4_0: {
        float d = h2f(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 15) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        break;
    }
    case G4_W_Q4_1: {
        float d = h2f(b), m = h2f(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 15) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        break;
    }
    case G4_W_Q5_0: {
        float d = h2f(b);
        uint32_t qh = rd32(b + 2);
        for (int j = 0; j < 16; j++) {
            int lo = (b[6 + j] & 15) | (int)((qh >> j) & 1) << 4;
            int hi = (b[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
        break;
    }
    case G4_W_Q5_1: {
        float d = h2f(b), m = h2f(b + 2);
        uint32_t qh = rd32(b + 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b[8 + j] & 15) | (int)((qh >> j) & 1) << 4;
            int hi = (b[8 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)lo + m;
            y[j + 16] = d * (float)hi + m;
        }
        break;
    }
    default:
        break;
    }
}

/* ---- K-quants ------------------------------------------------------------------------------- */

void g4_k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

static void k_set_scale_min(uint8_t *s, int j, int sc, int m) {
    if (j < 4) {
        s[j] = (uint8_t)((s[j] & 0xc0) | sc);
        s[j + 4] = (uint8_t)((s[j + 4] & 0xc0) | m);
    } else {
        s[j + 4] = (uint8_t)((sc & 15) | (m & 15) << 4);
        s[j - 4] = (uint8_t)((s[j - 4] & 63) | (sc >> 4) << 6);
        s[j] = (uint8_t)((s[j] & 63) | (m >> 4) << 6);
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_K / Q5_K: per sub-block of 32 the range [min(0, min), max] over 2^bits − 1 steps; the eight
 * scales and mins are then coded in 6 bits against the super-block's largest (d, dmin). */
static void qk_45_block(const float *x, uint8_t *b, int bits) {
    int top = (1 << bits) - 1;
    float scale[8], mins[8], maxs = 0, maxm = 0;
    for (int s = 0; s < 8; s++) {
        float mn, mx;
        minmax(x + 32 * s, 32, &mn, &mx);
        if (mn > 0) mn = 0;
        if (mx < mn) mx = mn;
        scale[s] = (mx - mn) / top;
        mins[s] = -mn;
        maxs = fmaxf(maxs, scale[s]);
        maxm = fmaxf(maxm, mins[s]);
    }
    uint16_t hd = g4_f32_to_f16(maxs / 63), hm = g4_f32_to_f16(maxm / 63);
    float d = g4_f16_to_f32(hd), dmin = g4_f16_to_f32(hm);
    uint8_t *sc_bytes = b + 4, q[256];
    memset(sc_bytes, 0, 12);
    for (int s = 0; s < 8; s++) {
        int sc = d > 0 ? clampi((int)g4_round_even(scale[s] / d), 0, 63) : 0;
        int m = dmin > 0 ? clampi((int)g4_round_even(mins[s] / dmin), 0, 63) : 0;
        k_set_scale_min(sc_bytes, s, sc, m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            q[32 * s + l] = (uint8_t)(ds > 0 ? clampi((int)g4_round_even((x[32 * s + l] + dm) / ds), 0, top) : 0);
    }
    wr16(b, hd);
    wr16(b + 2, hm);
    uint8_t *qs = b + 16;
    if (bits == 5) {
        uint8_t *qh = b + 16;
        memset(qh, 0, 32);
        for (int s = 0; s < 8; s++)
            for (int l = 0; l < 32; l++) qh[l] |= (uint8_t)((q[32 * s + l] >> 4) << s);
        qs = b + 48;
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (uint8_t)((q[64 * c + l] & 15) | (q[64 * c + 32 + l] & 15) << 4);
}

static void dqk_45_block(const uint8_t *b, float *y, int bits) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scb = b + 4, *qh = b + 16, *qs = b + (bits == 5 ? 48 : 16);
    for (int s = 0; s < 8; s++) {
        int sc, m;
        g4_k_scale_min(scb, s, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15;
            if (bits == 5) q |= ((qh[l] >> s) & 1) << 4;
            y[32 * s + l] = ds * (float)q - dm;
        }
    }
}

/* Q6_K element e of a super-block, as the unsigned 6-bit code. */
static inline int q6k_code(const uint8_t *b, int e) {
    int h = e / 128, r = e % 128, l = r % 32, quarter = r / 32;
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    int lo = (quarter & 1) ? ql[l + 32] : ql[l];
    lo = quarter >= 2 ? lo >> 4 : lo & 15;
    return lo | ((qh[l] >> (2 * quarter)) & 3) << 4;
}

/* Q6_K: per sub-block of 16 a scale = (value of largest magnitude)/−32, coded as int8 against the
 * super-block's largest scale magnitude d·127. */
static void qk_6_block(const float *x, uint8_t *b) {
    float scale[16], amax = 0;
    for (int s = 0; s < 16; s++) {
        scale[s] = signed_absmax(x + 16 * s, 16) / -32.0f;
        amax = fmaxf(amax, fabsf(scale[s]));
    }
    uint16_t hd = g4_f32_to_f16(amax / 127);
    float d = g4_f16_to_f32(hd);
    memset(b, 0, 210);
    int8_t *scs = (int8_t *)(b + 192);
    for (int s = 0; s < 16; s++) {
        int sc = d > 0 ? clampi((int)g4_round_even(scale[s] / d), -128, 127) : 0;
        scs[s] = (int8_t)sc;
        float ds = d * (float)sc;
        for (int j = 0; j < 16; j++) {
            int e = 16 * s + j;
            int q = ds != 0 ? clampi((int)g4_round_even(x[e] / ds), -32, 31) + 32 : 32;
            int h = e / 128, r = e % 128, l = r % 32, quarter = r / 32;
            uint8_t *ql = b + 64 * h + ((quarter & 1) ? 32 : 0), *qh = b + 128 + 32 * h;
            ql[l] |= (uint8_t)((q & 15) << (quarter >= 2 ? 4 : 0));
            qh[l] |= (uint8_t)((q >> 4) << (2 * quarter));
        }
    }
    wr16(b + 208, hd);
}

static void dqk_6_block(const uint8_t *b, float *y) {
    float d = h2f(b + 208);
    const int8_t *scs = (const int8_t *)(b + 192);
    for (int e = 0; e < 256; e++) y[e] = d * (float)scs[e / 16] * (float)(q6k_code(b, e) - 32);
}

/* ---- the row entry points ------------------------------------------------------------------- */

void g4_quantize_row(g4_wtype t, const float *x, int n, void *dst) {
    uint8_t *o = dst;
    int bc = g4_wtype_block_cols(t), bb = t < G4_W_COUNT ? block_info[t].bytes : 0;
    for (int i = 0; i + bc <= n && bc > 0; i += bc, o += bb) {
        switch (t) {
        case G4_W_F32: memcpy(o, x + i, 4); break;
        case G4_W_F16: wr16(o, g4_f32_to_f16(x[i])); break;
        case G4_W_BF16: wr16(o, g4_f32_to_bf16(x[i])); break;
        case G4_W_Q8_0: q8_0_block(x + i, o); break;
        case G4_W_Q4_0: q_0_block(x + i, o, 4); break;
        case G4_W_Q5_0: q_0_block(x + i, o, 5); break;
        case G4_W_Q4_1: q_1_block(x + i, o, 4); break;
        case G4_W_Q5_1: q_1_block(x + i, o, 5); break;
        case G4_W_Q4_K: qk_45_block(x + i, o, 4); break;
        case G4_W_Q5_K: qk_45_block(x + i, o, 5); break;
        case G4_W_Q6_K: qk_6_block(x + i, o); break;
        default: return;
        }
    }
}

void g4_dequantize_row(g4_wtype t, const void *src, int n, float *out) {
    const uint8_t *p = src;
    int bc = g4_wtype_block_cols(t), bb = t < G4_W_COUNT ? block_info[t].bytes : 0;
    for (int i = 0; i + bc <= n && bc > 0; i += bc, p += bb) {
        switch (t) {
        case G4_W_F32: memcpy(out + i, p, 4); break;
        case G4_W_F16: out[i] = g4_f16_to_f32(rd16(p)); break;
        case G4_W_BF16: out[i] = g4_bf16_to_f32(rd16(p)); break;
        case G4_W_Q4_K: dqk_45_block(p, out + i, 4); break;
        case G4_W_Q5_K: dqk_45_block(p, out + i, 5); break;
        case G4_W_Q6_K: dqk_6_block(p, out + i); break;
        case G4_W_AFFINE: case G4_W_SYMM: case G4_W_COUNT: return;
        default: dq_32(t, p, out + i); break;
        }
    }
}

void g4_stream_pack(const uint8_t *vals, long n, int bits, uint8_t *stream) {
    memset(stream, 0, (size_t)((n * bits + 7) / 8));
    for (long i = 0; i < n; i++) {
        long bit = i * bits;
        unsigned v = (unsigned)(vals[i] & ((1u << bits) - 1)) << (bit & 7);
        stream[bit >> 3] |= (uint8_t)v;
        if ((bit & 7) + bits > 8) stream[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
    }
}

void g4_quantize_row_affine(const float *x, int n, int bits, int group, uint32_t *codes, float *scales,
                            float *biases) {
    float n_bins = (float)((1 << bits) - 1);
    uint8_t q[128];
    uint8_t *stream = (uint8_t *)codes;
    memset(stream, 0, (size_t)n * bits / 8);
    for (int g = 0; g * group < n; g++) {
        const float *w = x + (size_t)g * group;
        float mn, mx;
        minmax(w, group, &mn, &mx);
        int neg_edge = fabsf(mn) > fabsf(mx);
        float scale = fmaxf((mx - mn) / n_bins, 1e-7f);
        if (!neg_edge) scale = -scale;
        float edge = neg_edge ? mn : mx, q0 = rintf(edge / scale), bias = 0;
        if (q0 != 0) {
            scale = edge / q0;
            bias = edge;
        }
        for (int j = 0; j < group; j++) {
            float v = rintf((w[j] - bias) / scale);
            q[j] = (uint8_t)(v < 0 ? 0 : v > n_bins ? n_bins : v);
        }
        /* group·bits is a multiple of 8, so each group starts on a byte */
        g4_stream_pack(q, group, bits, stream + (size_t)g * group * bits / 8);
        scales[g] = scale;
        biases[g] = bias;
    }
}

void g4_dequantize_row_affine(const uint32_t *codes, int n, int bits, int group, const float *scales,
                              const float *biases, float *out) {
    const uint8_t *stream = (const uint8_t *)codes;
    for (int i = 0; i < n; i++)
        out[i] = scales[i / group] * (float)g4_stream_code(stream, i, bits) + biases[i / group];
}

float g4_quantize_row_symm(const float *x, int n, int bits, uint8_t *codes) {
    int hi = (1 << (bits - 1)) - 1, lo = -(1 << (bits - 1));
    float amax = 0;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float scale = amax / (float)hi;
    memset(codes, 0, (size_t)n * bits / 8);
    for (int i = 0; i < n; i++) {
        int q = scale > 0 ? clampi((int)rintf(x[i] / scale), lo, hi) : 0;
        unsigned u = bits == 8 ? (uint8_t)(int8_t)q : (unsigned)(q - lo);
        long bit = (long)i * bits;
        codes[bit >> 3] |= (uint8_t)(u << (bit & 7));
    }
    return scale;
}

void g4_dequantize_row_symm(const uint8_t *codes, int n, int bits, float scale, float *out) {
    int off = 1 << (bits - 1);
    for (int i = 0; i < n; i++) {
        int q = bits == 8 ? (int8_t)codes[i] : (int)g4_stream_code(codes, i, bits) - off;
        out[i] = scale * (float)q;
    }
}

/* ---- the kernels' layout (g4_mat.split) ------------------------------------------------------ */

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Whether w can be repacked, and the bits of its codes. */
static int repack_bits(const g4_mat *w) {
    if (w->split) return 0;
    switch (w->type) {
    case G4_W_Q4_0: case G4_W_Q4_1: return 4;
    case G4_W_Q8_0: return 8;
    case G4_W_AFFINE: case G4_W_SYMM: return w->bits == 2 || w->bits == 4 || w->bits == 8 ? w->bits : 0;
    default: return 0;
    }
}

size_t g4_mat_repack_size(const g4_mat *w) {
    int bits = repack_bits(w);
    if (!bits || w->cols % 32) return 0;
    size_t rows = (size_t)w->rows, nb = (size_t)w->cols / 32;
    size_t n = up64(rows * (size_t)w->cols * (size_t)bits / 8);
    if (w->type == G4_W_Q4_0 || w->type == G4_W_Q8_0) n += up64(rows * nb * 2);
    if (w->type == G4_W_Q4_1) n += 2 * up64(rows * nb * 2);
    return n;
}

/* Block b's four-byte slot in chunk 0 of its super-group (quant.h); chunk c is 4n bytes further
 * per step, n = the blocks in that super-group. */
static size_t split_slot(int nb, int bits, int b, size_t *chunk_stride) {
    int g = b / 16, n = nb - 16 * g < 16 ? nb - 16 * g : 16;
    *chunk_stride = 4 * (size_t)n;
    return (size_t)g * 64 * (size_t)bits + 4 * (size_t)(b % 16);
}

/* Block codes u into their slots (dst: the block's slot in chunk 0, cs: the chunk stride): chunk
 * c, byte t holds steps s = c·per .. c·per + per − 1 (elements 4s + t), step j at bit j·bits
 * (per = 8 / bits codes to a byte). */
static inline __attribute__((always_inline)) void split_put(uint8_t *dst, size_t cs, const uint8_t *u, const int bits) {
    const int per = 8 / bits;
    for (int c = 0; c < bits; c++)
        for (int t = 0; t < 4; t++) {
            unsigned v = 0;
            for (int j = 0; j < per; j++) v |= (unsigned)u[4 * (c * per + j) + t] << (j * bits);
            dst[(size_t)c * cs + (size_t)t] = (uint8_t)v;
        }
}

void g4_mat_repack(const g4_mat *w, void *mem, g4_mat *out) {
    int bits = repack_bits(w);
    int nb = w->cols / 32;
    size_t rows = (size_t)w->rows, rb = (size_t)w->cols * (size_t)bits / 8;
    uint8_t *codes = mem;
    g4_mat o = *w;
    o.split = 1;
    o.bits = bits;
    o.row_bytes = rb;
    o.data = codes;
    int ggml = w->type == G4_W_Q4_0 || w->type == G4_W_Q8_0 || w->type == G4_W_Q4_1;
    uint16_t *sc = NULL, *bi = NULL;
    if (ggml) {
        sc = (uint16_t *)(codes + up64(rows * rb));
        if (w->type == G4_W_Q4_1) bi = (uint16_t *)((uint8_t *)sc + up64(rows * (size_t)nb * 2));
        o.type = w->type == G4_W_Q4_1 ? G4_W_AFFINE : G4_W_SYMM;
        o.group = 32;
        o.scales = sc;
        o.biases = bi;
        o.scale_dtype = G4_DT_F16;
        o.scale_stride = (size_t)nb;
    }
    int flip = w->type == G4_W_SYMM && bits == 8; /* stored signed; the layout holds u = q + 128 */
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *p = (const uint8_t *)w->data + r * w->row_bytes;
        uint8_t *dst = codes + r * rb;
        for (int b = 0; b < nb; b++) {
            uint8_t u[32];
            if (w->type == G4_W_Q8_0) {
                const uint8_t *blk = p + (size_t)b * 34;
                sc[r * (size_t)nb + (size_t)b] = rd16(blk);
                for (int i = 0; i < 32; i++) u[i] = (uint8_t)(blk[2 + i] ^ 0x80);
            } else if (ggml) {
                int bb = w->type == G4_W_Q4_1 ? 20 : 18;
                const uint8_t *blk = p + (size_t)b * (size_t)bb;
                sc[r * (size_t)nb + (size_t)b] = rd16(blk);
                if (bi) bi[r * (size_t)nb + (size_t)b] = rd16(blk + 2);
                for (int e = 0; e < 16; e++) {
                    u[e] = blk[bb - 16 + e] & 15;
                    u[16 + e] = blk[bb - 16 + e] >> 4;
                }
            } else { /* an LSB-first stream of `bits`-bit codes: code i at bit i·bits */
                for (int i = 0; i < 32; i++)
                    u[i] = (uint8_t)((p[4 * bits * b + i * bits / 8] >> (i * bits % 8) & ((1 << bits) - 1)) ^ (flip ? 0x80 : 0));
            }
            size_t cs, at = split_slot(nb, bits, b, &cs);
            switch (bits) { /* constant widths: the loops unroll (repacking is load time) */
            case 8: split_put(dst + at, cs, u, 8); break;
            case 4: split_put(dst + at, cs, u, 4); break;
            default: split_put(dst + at, cs, u, 2); break;
            }
        }
    }
    *out = o;
}

void g4_split_block(const g4_mat *w, int r, int b, uint8_t u[32]) {
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    size_t cs, at = split_slot(w->cols / 32, w->bits, b, &cs);
    const int bits = w->bits, per = 8 / bits;
    for (int i = 0; i < 32; i++) {
        const int s = i / 4;
        u[i] = (uint8_t)(p[at + (size_t)(s / per) * cs + (size_t)(i % 4)] >> (s % per * bits) & ((1 << bits) - 1));
    }
}

/* ---- widening for 4/8-bit-only kernels ------------------------------------------------------- */

int g4_widen_of(const g4_mat *w, g4_widen *o) {
    int bits;
    switch (w->type) {
    case G4_W_Q4_1: case G4_W_Q4_K: bits = 4; break;
    case G4_W_Q5_0: case G4_W_Q5_1: case G4_W_Q5_K: bits = 5; break;
    case G4_W_Q6_K: bits = 6; break;
    case G4_W_AFFINE: case G4_W_SYMM: bits = w->bits == 4 || w->bits == 8 || w->split ? 0 : w->bits; break;
    default: bits = 0; break;
    }
    if (!bits) return 0;
    o->bits = bits <= 4 ? 4 : 8;
    o->bias = g4_wtype_additive(w->type);
    o->centre = o->bias ? 1 << (bits - 1) : g4_wtype_offset(w); /* additive codes: their own width's midpoint */
    if (w->type == G4_W_AFFINE || w->type == G4_W_SYMM) o->group = w->group > 0 ? w->group : w->cols;
    else o->group = w->type == G4_W_Q6_K ? 16 : 32;
    return 1;
}

void g4_widen_row(const g4_mat *w, const g4_widen *o, int r, int8_t *v, float *sc, float *bi) {
    const int off = o->centre;
    for (int b = 0; b < w->cols / 32; b++) {
        g4_wblock wb;
        g4_wblock_get(w, r, b, &wb);
        for (int i = 0; i < 32; i++) v[32 * b + i] = (int8_t)((int)wb.u[i] - off);
        if (w->type == G4_W_Q6_K) {
            sc[2 * b] = wb.sw;
            sc[2 * b + 1] = wb.sw_hi;
        } else {
            const int g = 32 * b / o->group;
            sc[g] = wb.sw;
            if (o->bias) bi[g] = fmaf((float)off, wb.sw, wb.bw);
        }
    }
}
