/* CPU kernels: a scalar reference plus AVX2 and AVX-512 versions chosen at run time by CPUID.
 *
 * Exactness: every output element is reduced by one procedure in an order fixed by the row's
 * length alone (16 interleaved fma lanes, then a fixed tree; for quantised weights exact integer
 * block dots against activations quantised per 32-block, then the same lanes — see
 * kernels_internal.h for the precise definition). The number of tokens M, the thread split and
 * the ISA level only decide *which* elements a call computes and how fast, never the bits. */
#ifndef G4_CPU_KERNELS_H
#define G4_CPU_KERNELS_H
#include <stdint.h>

#include "formats/safetensors.h"
#include "g4.h"
#include "util/threadpool.h"

/* How a weight matrix is stored. Dense types hold one element per column; the ggml block types
 * (GGUF) pack 32 or 256 columns per block; AFFINE is MLX's group-wise `w = scale·q + bias` with
 * `bits`-bit codes packed LSB-first into uint32 words; SYMM is the QAT checkpoints' per-row
 * symmetric `w = scale[row]·q` with signed int8 / int4 (value-8) / int2 (value-2) codes, or with
 * `group` > 0 one scale per `group` columns (the blockwise QAT embeddings). Exact byte layouts:
 * cpu/quant.h. Quantised types need cols to be a multiple of 32 (256 for the K-quants). */
typedef enum g4_wtype {
    G4_W_F32, G4_W_F16, G4_W_BF16,
    G4_W_Q8_0, G4_W_Q4_0, G4_W_Q4_1, G4_W_Q5_0, G4_W_Q5_1, G4_W_Q4_K, G4_W_Q5_K, G4_W_Q6_K,
    G4_W_AFFINE, G4_W_SYMM,
    G4_W_COUNT
} g4_wtype;

const char *g4_wtype_name(g4_wtype t);

/* A weight matrix [rows = out, cols = in]. Row r's storage starts at data + r·row_bytes. */
typedef struct g4_mat {
    g4_wtype type;
    int rows, cols;
    const void *data;
    size_t row_bytes;
    /* AFFINE and SYMM only */
    int bits, group;              /* columns per scale (SYMM: 0 or cols = one per row) */
    const void *scales, *biases;  /* AFFINE: [rows][cols/group]; SYMM: scales[rows] (group 0) or
                                     [rows][cols/group] */
    g4_dtype scale_dtype;         /* F32, F16 or BF16 */
    size_t scale_stride;          /* scale elements per row */
    int split;                    /* AFFINE / SYMM with 2, 4 or 8 bits only: codes in the kernels'
                                     block-split order instead of an LSB-first stream (quant.h) */
    /* QAT static activation fake-quantisation around this matrix's products (0: none):
     * v -> s == 0 ? v : clamp(round_even(v / s), -128, 127) * s on the input x before the product
     * and on the output y after it. Applied by the forward (model/forward.c), not by g4_matmul. */
    float in_act_scale, out_act_scale;
} g4_mat;

/* A dense matrix view of row-major data in dtype F32, F16 or BF16. */
g4_mat g4_mat_dense(g4_dtype dtype, int rows, int cols, const void *data);
/* The wtype of a dense dtype (F32, F16, BF16), or G4_W_COUNT for others. */
g4_wtype g4_wtype_of_dtype(g4_dtype t);
/* Bytes of storage the matrix streams per full pass (codes plus scales and biases). */
size_t g4_mat_bytes(const g4_mat *w);

/* G4_OK when w is a matrix the kernels can run: row size, block multiple, bits, group and
 * scales consistent (the sources call this on every tensor they hand out). */
g4_status g4_mat_validate(const g4_mat *w, g4_error *err);

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

/* Several matrix products in one parallel pass: the threads split all their rows together, and
 * the integer path prepares each distinct input once. Part i multiplies parts[i].x (NULL: the
 * shared x) [M][cols]. With an epilogue, parts come in pairs (2k, 2k+1) of equal row counts
 * (e.g. gate and up): a work item computes rows [r0, r1) of both, then calls epi(ctx, k, r0, r1).
 * Results are bitwise those of separate g4_matmul calls. */
enum { G4_MM_MAX_PARTS = 32 };
typedef struct g4_mm_part {
    const g4_mat *w;
    float *y;
    int ldy;
    const float *x;
} g4_mm_part;
typedef void (*g4_mm_epilogue)(void *ctx, int pair, int r0, int r1);
void g4_matmul_multi(g4_threadpool *pool, const g4_mm_part *parts, int n, const float *x, int M, g4_mm_epilogue epi,
                     void *epi_ctx);

/* out[c] = w[row][c] as float (embedding gathers, dequantising when needed). */
void g4_mat_row_f32(const g4_mat *w, int row, float *out);

/* y = rms(x) * w (w may be NULL for the weightless norm); n elements; in place allowed. */
void g4_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

float g4_gelu_tanh(float x);

/* Rotate-half RoPE over one head of dimension d at position pos: pairs (i, i + d/2) for i < R
 * rotate by pos * theta^(-2i/d); the rest pass through. */
void g4_rope(float *x, int d, int pos, float theta, int R);
#endif
