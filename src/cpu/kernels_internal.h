/* Internals shared by the scalar reference (kernels.c) and the SIMD kernels (kernels_avx2.c,
 * kernels_avx512.c). Not part of the engine API; tests include it to force an ISA level.
 *
 * THE CANONICAL ORDER. Every output element y[m][r] is produced by one of two procedures whose
 * arithmetic depends only on the row's contents and length, never on M, the thread split or the
 * ISA level; the AVX2 and AVX-512 code reproduce the scalar code below bit for bit.
 *
 * Float path (F32, F16, BF16 weights; also g4_dot_*): 16 float lanes, lane j = 0..15 takes the
 * elements i ≡ j (mod 16) in increasing i as acc_j = fma(x_i, w_i, acc_j) (w converted exactly to
 * f32), starting from +0. Then fold: for w = 8, 4, 2, 1: acc_j += acc_{j+w} (j < w); y = acc_0.
 *
 * Integer path (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, AFFINE, SYMM):
 *  1. Each activation row is quantised once per call, block b of 32 elements at a time:
 *     amax = max|x_i|, dx_b = amax / 127, xq_i = round_half_even(x_i · (127 / amax)) (0 when
 *     amax = 0). For the types with an additive term (Q4_1, Q5_1, Q4_K, Q5_K, AFFINE) also the
 *     float sums XS[b][g] = x_{4g} + x_{4g+1} + x_{4g+2} + x_{4g+3} + x_{16+4g} + … + x_{16+4g+3}
 *     (left to right, block-relative indices), g = 0..3.
 *  2. Weights are integer codes u (unsigned) with an offset `off` (value = u − off) per type, and
 *     per 32-block float factors: sw (scale) and, for the additive types, bw; Q6_K has separate
 *     scales sw_lo / sw_hi for the block's two 16-element sub-blocks.
 *  3. Lane group g of block b covers elements {4g..4g+3} ("lo") and {16+4g..16+4g+3} ("hi"):
 *     P_lo = Σ_lo (u − off)·xq, P_hi = Σ_hi (u − off)·xq — exact integers.
 *  4. Float lane ℓ = 4·(b mod 4) + g accumulates, blocks in increasing order:
 *        Q6_K:      acc_ℓ = fma((float)P_lo, sw_lo·dx_b, acc_ℓ); acc_ℓ = fma((float)P_hi, sw_hi·dx_b, acc_ℓ)
 *        others:    acc_ℓ = fma((float)(P_lo + P_hi), sw·dx_b, acc_ℓ)
 *        additive:  then acc_ℓ = fma(XS[b][g], bw, acc_ℓ)
 *     where sw·dx_b is one float multiply. Then the same 16-lane fold as the float path.
 *  Per-type factors (f16 fields converted exactly): Q8_0 u = q + 128, off 128, sw = d; Q4_0 off 8,
 *  sw = d; Q5_0 off 16, sw = d; Q4_1 / Q5_1 off 0, sw = d, bw = m; Q4_K / Q5_K off 0,
 *  sw = d·(float)sc, bw = −(dmin·(float)m); Q6_K off 32, sw_lo/hi = d·(float)scales[s];
 *  AFFINE off 0, sw = scale, bw = bias (scale/bias of the group holding the block, converted from
 *  their dtype); SYMM off 2^(bits−1) (int8: u = q + 128), sw = the scale of the row or group.
 *
 * Split layout (g4_mat.split, the kernels' own layout of 2-, 4- and 8-bit AFFINE / SYMM matrices,
 * cpu/quant.h): step 1 as above but with one c0 and one float pair per block, c0_b = −off·Σ xq
 * over the block's 32 elements and XS_b = the block's 32 elements summed left to right; then
 * float lane ℓ = b mod 16 accumulates, blocks in increasing order,
 *        acc_ℓ = fma((float)P_b, sw·dx_b, acc_ℓ),  P_b = c0_b + Σ u·xq (exact);
 *        additive: then acc_ℓ = fma(XS_b, bw, acc_ℓ)
 * and the same fold. One float multiply-add per block instead of four: the loops feed whole
 * 16-block super-groups to each instruction.
 *
 * Tolerance this adds against a dequantise-then-float dot: each activation errs by at most
 * dx_b/2 = amax_b/254, and only the scaled-code part of a weight sees it (the additive terms
 * use exact float sums of x), so |y − y_exact| ≤ Σ_b (amax_b/254)·Σ_{i∈b} |sw·(u_i − off)| plus
 * float rounding (tests/test_kernels.c checks exactly this bound) — for typical rows about
 * 0.1–0.4 % of Σ|x·w|, the same
 * order as llama.cpp's Q8 activation path. The additive terms use exact float sums of x. */
#ifndef G4_CPU_KERNELS_INTERNAL_H
#define G4_CPU_KERNELS_INTERNAL_H
#include <math.h>
#include <stdint.h>

#include "cpu/kernels.h"

typedef enum g4_isa { G4_ISA_SCALAR, G4_ISA_AVX2, G4_ISA_AVX512, G4_ISA_COUNT } g4_isa;

/* The best level this CPU runs: AVX-512 needs F, BW, VL, VNNI and VBMI (Ice Lake, Sapphire
 * Rapids, Zen 4 and later); AVX2 needs AVX2, FMA and F16C. */
g4_isa g4_isa_best(void);
const char *g4_isa_name(g4_isa isa);

/* The public kernels at a chosen level (clamped to what the CPU supports). */
void g4_matmul_isa(g4_isa isa, g4_threadpool *pool, const g4_mat *w, const float *x, int M, float *y,
                   int ldy);
float g4_dot_f32_isa(g4_isa isa, const float *a, const float *b, int n);

/* ---- the integer path's prepared activations ---------------------------------------------- */

/* Per token: nb = cols/32 blocks in ngrp = ceil(nb/4) groups of four. Group j holds, for its
 * blocks k = 0..3 (block 4j+k), the quantised elements as xq[128j + 16k + e] = xq of element e
 * (e < 16) and xq[128j + 64 + 16k + e] = element 16 + e; float lanes ℓ = 4k + g at [16j + ℓ]:
 * dx (dx of block 4j+k), xs (XS[4j+k][g]), and the integer corrections c0/c1: for Q6_K
 * c0 = −off·Σ_lo xq and c1 = −off·Σ_hi xq, for other types c0 = −off·(Σ_lo + Σ_hi) xq. Missing
 * blocks of a last partial group are zero. */
typedef struct g4_xprep {
    int nb, ngrp;
    /* split layout (sg = 1): per token nsg = ceil(nb/16) super-groups of 512 quantised bytes,
     * step s (0..7) of super-group g at xq[512g + 64s + 4l + t] = element 4s + t of block
     * 16g + l (zero for missing blocks); dx, c0, xs one lane per block: [16g + l] */
    int sg, nsg;
    int8_t *xq;       /* [M][ngrp·128] */
    float *dx, *xs;   /* [M][ngrp·16]; xs NULL unless the type has an additive term */
    int32_t *c0, *c1; /* [M][ngrp·16]; c1 only for Q6_K */
} g4_xprep;

static inline int g4_wtype_is_int(g4_wtype t) { return t >= G4_W_Q8_0 && t <= G4_W_SYMM; }
static inline int g4_wtype_additive(g4_wtype t) {
    return t == G4_W_Q4_1 || t == G4_W_Q5_1 || t == G4_W_Q4_K || t == G4_W_Q5_K || t == G4_W_AFFINE;
}
static inline int g4_wtype_offset(const g4_mat *w) {
    switch (w->type) {
    case G4_W_Q8_0: return 128;
    case G4_W_Q4_0: return 8;
    case G4_W_Q5_0: return 16;
    case G4_W_Q6_K: return 32;
    case G4_W_SYMM: return 1 << (w->bits - 1);
    default: return 0;
    }
}

/* One 32-block of a weight row in canonical terms. */
typedef struct g4_wblock {
    uint8_t u[32];
    float sw, sw_hi, bw; /* sw_hi: Q6_K's second sub-block (sw is then sw_lo) */
} g4_wblock;

/* Unpacks block b of row r of w. */
void g4_wblock_get(const g4_mat *w, int r, int b, g4_wblock *o);
/* Adds block b (canonical step 4) of token m's prepared activations into acc[16]. */
void g4_wblock_accumulate(const g4_mat *w, const g4_wblock *wb, const g4_xprep *xp, int m, int b,
                          float acc[16]);
/* The 16-lane fold. */
static inline float g4_fold16(float acc[16]) {
    for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* Scale (or bias) element i of a scale array in dtype dt, as float. */
float g4_scale_at(const void *p, g4_dtype dt, size_t i);
/* Q4_K / Q5_K 6-bit scale and min of sub-block j from the 12 packed bytes. */
void g4_k_scale_min(const uint8_t *s, int j, int *sc, int *m);

/* Pointers into the prepared arrays of token m. */
static inline const int8_t *g4_xp_q(const g4_xprep *xp, int m) {
    return xp->xq + (size_t)m * (xp->sg ? (size_t)xp->nsg * 512 : (size_t)xp->ngrp * 128);
}
static inline size_t g4_xp_f(const g4_xprep *xp, int m) { return (size_t)m * (xp->sg ? (size_t)xp->nsg * 16 : (size_t)xp->ngrp * 16); }
/* Split layout: where element i of block b sits in a token's quantised bytes. */
static inline size_t g4_xp_split_at(int b, int i) { return 512 * (size_t)(b / 16) + 64 * (size_t)(i / 4) + 4 * (size_t)(b % 16) + (size_t)(i % 4); }
/* Split layout: step 1 for token m (scalar; the AVX-512 version writes the same bytes). */
void g4_xprep_token_split(const g4_mat *w, const float *xr, const g4_xprep *xp, int m);
void g4_xprep_token_split_avx512(const g4_mat *w, const float *xr, const g4_xprep *xp, int m);


/* ---- per-ISA row kernels: rows [r0, r1) of w for all M tokens ------------------------------ */
typedef struct g4_rows_args {
    const g4_mat *w;
    const float *x;        /* float path: [M][cols] */
    const g4_xprep *xp;    /* integer path */
    int M, ldy;
    float *y;
} g4_rows_args;

void g4_rows_scalar(const g4_rows_args *a, int r0, int r1);
/* Split layout: the scalar rows (the reference of the canonical order above). */
void g4_rows_split_scalar(const g4_rows_args *a, int r0, int r1);
void g4_rows_avx2(const g4_rows_args *a, int r0, int r1);
void g4_rows_avx512(const g4_rows_args *a, int r0, int r1);
float g4_dot_f32_avx2(const float *a, const float *b, int n);
/* Step 1 (xq, dx, c0, c1; not xs) for token m whose activations are xr. */
void g4_xprep_token_avx512(const g4_mat *w, const float *xr, const g4_xprep *xp, int m);
void g4_xprep_token_avx2(const g4_mat *w, const float *xr, const g4_xprep *xp, int m);
float g4_dot_f32_avx512(const float *a, const float *b, int n);
#endif
