/* Weight quantisation formats: storage sizes, quantise (f32 → codes) for the format writers, and
 * dequantise (codes → f32) for gathers and tests.
 *
 * Layouts (verified against the ggml and MLX sources, and by the round trips in
 * tests/test_kernels.c); all multi-byte fields little-endian, f16 = IEEE half:
 *   Q8_0  34 B / 32: f16 d, int8 q[32];                            w = d·q
 *   Q4_0  18 B / 32: f16 d, u8 qs[16];   q_j = qs[j] & 15 (j < 16), q_{j+16} = qs[j] >> 4;  w = d·(q−8)
 *   Q4_1  20 B / 32: f16 d, f16 m, qs[16] as Q4_0;                 w = d·q + m
 *   Q5_0  22 B / 32: f16 d, u32 qh, qs[16]; bit j of qh is the 5th bit of element j;  w = d·(q−16)
 *   Q5_1  24 B / 32: f16 d, f16 m, u32 qh, qs[16];                 w = d·q + m
 *   Q4_K 144 B / 256: f16 d, f16 dmin, u8 scales[12], u8 qs[128]. Eight sub-blocks of 32 with 6-bit
 *        scale sc_s and min m_s: for s < 4 sc = scales[s] & 63, m = scales[s+4] & 63; for s ≥ 4
 *        sc = (scales[s+4] & 15) | (scales[s−4] >> 6) << 4, m = (scales[s+4] >> 4) | (scales[s] >> 6) << 4.
 *        Element l of sub-block 2c is qs[32c+l] & 15, of sub-block 2c+1 qs[32c+l] >> 4.
 *        w = d·sc·q − dmin·m
 *   Q5_K 176 B / 256: f16 d, f16 dmin, scales[12], u8 qh[32], qs[128]; as Q4_K plus bit s of qh[l]
 *        is the 5th bit of element l of sub-block s.
 *   Q6_K 210 B / 256: u8 ql[128], u8 qh[64], int8 scales[16], f16 d (last). For half h (128
 *        elements) and l < 32, with L = ql + 64h, H = qh + 32h: element 128h + l = (L[l] & 15) |
 *        (H[l] & 3) << 4, +32: (L[l+32] & 15) | (H[l] >> 2 & 3) << 4, +64: (L[l] >> 4) | (H[l] >> 4
 *        & 3) << 4, +96: (L[l+32] >> 4) | (H[l] >> 6) << 4.  w = d·scales[e/16]·(q−32)
 *   AFFINE (MLX): `bits`-bit codes as one LSB-first bit stream per row (element i occupies bits
 *        [i·bits, (i+1)·bits) of the row's bytes, little-endian), stored as uint32 words. For 3, 5
 *        and 6 bits MLX packs 8, 8 and 4 codes into 3, 5 and 3 bytes with exactly this bit order,
 *        so a row is still one continuous stream. w = scale[g]·q + bias[g], g = column / group.
 *   SYMM (Google QAT): signed codes with a per-row (or per-group) f32 scale: int8 plain; int4 two
 *        per byte, low nibble first, stored as value+8; int2 four per byte from bit 0, stored as
 *        value+2. Equivalently an LSB-first stream of (value + 2^(bits−1)) for 2 and 4 bits.
 *
 * The kernels' own layout (g4_mat.split, AFFINE / SYMM with 2, 4 or 8 bits), which the loaders
 * repack Q4_0, Q4_1, Q8_0 and 2/4/8-bit MLX and QAT matrices into when the CPU has AVX-512: the
 * canonical unsigned codes u (SYMM: value + 2^(bits−1), also for 8 bits) of each run of 16 blocks
 * (a super-group; the row's last one may hold n < 16 blocks) interleaved four elements at a time,
 * so that 32-bit lane l of a vector holds four codes of block l:
 *   8 bits: 8 chunks of 4n bytes; chunk s, byte 4l + t = u[block l][4s + t];
 *   4 bits: 4 chunks of 4n bytes; chunk c, byte 4l + t = u[block l][8c + t] | u[block l][8c + 4 + t] << 4;
 *   2 bits: 2 chunks of 4n bytes; chunk c, byte 4l + t = u[block l][16c + 4j + t] << 2j summed over j < 4.
 * A row stays cols·bits/8 bytes. Scales and biases stay separate arrays (per group, F32 / F16 /
 * BF16): a ggml block's f16 d (and Q4_1's m) become a group-32 F16 scale (bias) array. The split
 * layout has its own canonical order (kernels_internal.h: one float lane per block). */
#ifndef G4_CPU_QUANT_H
#define G4_CPU_QUANT_H
#include <stddef.h>
#include <stdint.h>

#include "cpu/kernels.h"

/* Columns per storage block: 1 for F32/F16/BF16, 32 for Q8_0..Q5_1, AFFINE and SYMM (the kernels
 * work on runs of 32), 256 for the K-quants. */
int g4_wtype_block_cols(g4_wtype t);
/* Bytes of one row's codes for `cols` columns (AFFINE and SYMM: the codes only, scales and biases
 * are separate arrays; `bits` is used only by those two). 0 when the combination is not valid:
 * cols not a positive multiple of the block size, bits out of range (AFFINE 2..8, SYMM 2, 4, 8). */
size_t g4_wtype_row_bytes(g4_wtype t, int cols, int bits);

/* Round half to even in the current (default) rounding mode, for every finite float. */
float g4_round_even(float v);

/* Dense and ggml types: n (a multiple of g4_wtype_block_cols) floats to g4_wtype_row_bytes(t, n, 0)
 * bytes at dst. Scale choices follow ggml's reference quantisers for Q8_0 / Q4_0 / Q4_1 / Q5_0 /
 * Q5_1 (max-magnitude or min/max per block); the K-quants use a plain min/max (Q4_K, Q5_K) or
 * max-magnitude (Q6_K) rule per sub-block without ggml's iterative refinement. AFFINE and SYMM are
 * not handled here (they need separate scale arrays). */
void g4_quantize_row(g4_wtype t, const float *x, int n, void *dst);
/* The inverse for the same types: n floats from one row of blocks. */
void g4_dequantize_row(g4_wtype t, const void *src, int n, float *out);

/* MLX affine quantisation of n values (n a multiple of group; group 32, 64 or 128; bits 2..8),
 * MLX's own rule per group (mlx/backend/cpu/quantized.cpp): with n_bins = 2^bits − 1 and the
 * endpoint of larger magnitude `edge`, scale = ±max((max − min)/n_bins, 1e-7) signed so that the
 * codes grow away from `edge`; q0 = rint(edge/scale); when q0 ≠ 0, scale = edge/q0 and bias = edge
 * (so that endpoint is exact), else bias = 0; codes = clamp(rint((x − bias)/scale), 0, n_bins).
 * codes: n·bits/32 words (the stream described above), scales/biases: n/group floats (the
 * writer narrows them to its scale dtype, as MLX does). */
void g4_quantize_row_affine(const float *x, int n, int bits, int group, uint32_t *codes, float *scales,
                            float *biases);
/* scales/biases: n/group floats. */
void g4_dequantize_row_affine(const uint32_t *codes, int n, int bits, int group, const float *scales,
                              const float *biases, float *out);

/* Symmetric quantisation of n values (n·bits a multiple of 8) to bits 2, 4 or 8:
 * scale = max|x| / (2^(bits−1) − 1), q = clamp(rint(x/scale), −2^(bits−1), 2^(bits−1) − 1), packed as above into n·bits/8 bytes. Returns the scale (0 for an all-zero row,
 * with all codes 0). For the blockwise QAT embeddings call it once per block. */
float g4_quantize_row_symm(const float *x, int n, int bits, uint8_t *codes);
void g4_dequantize_row_symm(const uint8_t *codes, int n, int bits, float scale, float *out);

/* Bytes the kernel layout of w needs (codes, then the scale and bias arrays it must create,
 * each 64-byte aligned), or 0 when w is used as it is (dense, K-quants, Q5, 2/3/5/6/7 bits,
 * already split). */
size_t g4_mat_repack_size(const g4_mat *w);
/* Writes w in the kernel layout into mem (g4_mat_repack_size(w) bytes, 64-byte aligned; scales
 * of AFFINE/SYMM inputs are referenced, not copied) and describes it in *out. */
void g4_mat_repack(const g4_mat *w, void *mem, g4_mat *out);

/* Widening for a device whose kernels read 4- and 8-bit codes only (the CUDA upload): the row as
 * signed codes v around their centre (4-bit containers: -8 <= v <= 7; 8-bit: -128 <= v <= 127)
 * with an f32 scale (and, for additive codes, bias) per `group` columns: value = sc·v (+ bi).
 * Codes with an offset keep their scales exactly (v = u - offset); additive codes (MLX affine,
 * Q4_1, Q5_1, Q4_K, Q5_K) become v = u - 2^(bits-1) with bi = bw + 2^(bits-1)·sw, one f32
 * rounding. Centred codes keep a device's s·Σv·x and bi·Σx from cancelling. */
typedef struct g4_widen {
    int bits;  /* container: 4 or 8 */
    int group; /* columns per scale: 32 (16 for Q6_K's sub-blocks) for GGUF blocks, the source's
                  group (cols when per row) for MLX / QAT */
    int bias;  /* additive codes: bi is written */
    int centre; /* subtracted from the source's codes u: its offset, or 2^(bits-1) for additive codes */
} g4_widen;
/* 1 and *o filled when w's codes are not 4- or 8-bit ones a device reads as they are (Q4_1, Q5_0,
 * Q5_1, the K-quants, AFFINE / SYMM of 2, 3, 5, 6 or 7 bits), else 0. Not for split matrices. */
int g4_widen_of(const g4_mat *w, g4_widen *o);
/* Row r: v[cols], sc[cols / group], bi[cols / group] (bias only). */
void g4_widen_row(const g4_mat *w, const g4_widen *o, int r, int8_t *v, float *sc, float *bi);

/* The 32 codes u of block b of row r of a split matrix. */
void g4_split_block(const g4_mat *w, int r, int b, uint8_t u[32]);

/* Code i (0-based) of an LSB-first bit stream of `bits`-bit codes (1..8). */
static inline unsigned g4_stream_code(const uint8_t *stream, long i, int bits) {
    long bit = i * bits;
    const uint8_t *p = stream + (bit >> 3);
    unsigned v = p[0] | (unsigned)(((bit & 7) + bits > 8) ? p[1] : 0) << 8;
    return (v >> (bit & 7)) & ((1u << bits) - 1);
}
/* Packs n codes (each < 2^bits) as an LSB-first stream into ceil(n·bits/8) bytes (zeroing the
 * stream first). */
void g4_stream_pack(const uint8_t *vals, long n, int bits, uint8_t *stream);
#endif
