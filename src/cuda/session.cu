/* The CUDA backend's host side: device probe, weight upload (once, in the kernels' layout), the
 * stage lists of the target model and of a drafter (program.h), launches, commit, drafting and
 * the decode chain the benchmark times.
 *
 * The target's stage list per layer (folds of the residual stream happen in the next stage's
 * input loader, so no stage exists only to add a residual):
 *   qkv      q (and k, v on layers with their own cache) from rms_w(attn_norm)(x)
 *   heads    q_norm + RoPE; k_norm + RoPE, weightless v norm -> staging (or the cache: direct)
 *   attn     chunks of keys -> att, or partials for queries with several chunks
 *   combine  partials -> att
 *   o_proj   att · Woᵀ -> t
 *   gate/up  x1 = x + rms_w(post_attn)(t);  gelu(g) ⊙ u of rms_w(pre_ffn)(x1) -> h
 *   down     h · Wdownᵀ -> f                                  (MoE: router, route, experts, combine)
 *   ple gate x2 = x1 + rms_w(post_ffn)(f);  gelu(x2 · Wgᵀ) ⊙ ple[l] -> pg   (PLE models)
 *   ple proj pg · Wpᵀ -> t
 * and the next layer's qkv loader folds (x2 + rms_w(post_ple)(t)) · layer_scalar (without PLE:
 * (x1 + rms_w(post_ffn)(f)) · layer_scalar). The LM head stage folds the last layer, applies the
 * final norm (kept as the drafter's hidden), the tied head, the softcap and the argmax. */
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "cpu/kernels.h"
#include "cpu/quant.h"
#include "model/drafter.h"
#include "model/model.h"
#include "util/error.h"
}
#include "cuda/cuda.h"
#include "cuda/internal.h"

g4_status g4_cuda_fail(g4_error *err, cudaError_t e, const char *what) {
    g4_status code = e == cudaErrorMemoryAllocation ? G4_ERR_NOMEM : G4_ERR_IO;
    return g4_fail(err, code, "CUDA: %s: %s", what, cudaGetErrorString(e));
}
#define CK(call, what)                                                                                                 \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) return g4_cuda_fail(err, e_, what);                                                     \
    } while (0)

/* ---- a bump allocator over one device allocation, run twice: sizes first, then addresses ---- */

typedef struct {
    char *base;
    size_t used;
    int dry;
} bump;

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static void *bump_take(bump *b, size_t bytes) {
    size_t off = b->used;
    b->used += align256(bytes ? bytes : 1);
    return b->dry ? NULL : b->base + off;
}
#define TAKE(b, T, n) ((T *)bump_take((b), sizeof(T) * (size_t)(n)))

/* ---- device weights ------------------------------------------------------------------------------ */

typedef struct {
    g4c_mat wq, wk, wv, wo, gate, up, down, router, ex_gu, ex_down, ple_gate, ple_proj;
    const float *attn_norm, *post_attn, *pre_ffn, *post_ffn, *q_norm, *k_norm, *router_scale, *expert_scale,
        *pre2, *post1, *post2, *post_ple;
    const double *rope_inv;
    float layer_scalar;
} dev_layer;

typedef struct {
    g4c_mat wq, wo, gate, up, down;
    const float *attn_norm, *post_attn, *pre_ffn, *post_ffn, *q_norm;
    const double *rope_inv;
    float layer_scalar;
} dev_dlayer;

typedef struct {
    float *kc, *vc, *kst, *vst;
    int cap, row;
} dev_kv;

/* one launch (or two) of a fast prefill's chunk (pg_build) */
typedef struct pg_entry {
    int stage;        /* >= 0: ops[stage]'s own launch (a matmul: the prefill GEMM; attention: pattn.cu);
                         < 0: the persistent kernel over pops[first, first + count) */
    int first, count;
    int prep;         /* 1: the stage's first phase as a small launch of its own first (pprep.cu) */
    int inb, outb;    /* the input-terms buffer the GEMM reads (0: fp_x, 1: fp_x2); the buffer its
                         epilogue (or the attention) also writes the next GEMM's terms to, -1: none */
} pg_entry;

struct g4_cuda {
    const g4_model *m;
    int dev, grid, smem_in, n_ctx, max_batch, max_chunks, skip, max_row, rep;
    int pf_items, pf_self, split_chunks; /* tuning (g4_cuda_set_tune) */
    int evict_first, op_local;           /* g4_cuda_set_mode */
    int mma_bf16;                        /* bf16 matmuls on the tensor cores (G4_CUDA_MMA at creation) */
    int imma;                            /* 4-bit stages on the integer tensor cores (G4_CUDA_IMMA) */
    int smem_need;                       /* floats of the widest input tile row */
    unsigned kmask;                      /* G4C_KM_* of every stage list uploaded (push_ops) */
    size_t smem;
    cudaStream_t stream;
    cudaEvent_t ev0, ev1;
    char *wmem, *amem;
    size_t wbytes, abytes;
    g4c_ctl *ctl, *h_ctl;
    float *amax_part, *amin_part;
    int *amax_idx, *hist;
    /* activations [max_batch][...] */
    float *x0, *xa, *xb, *q, *kraw, *vraw, *att, *t, *hb, *f, *ple, *pg, *logits, *hfinal, *part_buf, *dbg;
    float *router, *top_w, *x2, *exh, *exo;
    int *top_e, *att_cnt, *mma_cnt, *fp_cnt;
    float *mma_part, *fp_part, *qn;
    unsigned short *fp_x;
    float *fp_sx;
    int fp_ld;                           /* widest matmul input (the prefill procedure's activation rows) */
    int trace_fast;                      /* g4_cuda_trace runs the prefill procedure */
    std::vector<dev_kv> kv;
    std::vector<float *> rope_cs;        /* per layer: [n_ctx][pairs][2] cos, sin, shared by equal kinds */
    std::vector<int> rope_src;           /* per layer: the first layer with the same RoPE kind */
    g4c_kvlayer *d_kvl;
    int n_kvl;
    /* weights */
    g4c_mat embed, ple_embed, ple_proj;
    const float *final_norm, *ple_norm;
    std::vector<dev_layer> lw;
    std::vector<g4c_op> ops;
    g4c_op *d_ops;
    /* fast prefill as launches (pg_build): the persistent kernel over ranges of a copy of the
     * stage list, the prefill GEMM for the matmul stages it takes */
    int pg_on;                           /* G4_CUDA_PGEMM=0 at creation: off (the kernel's own fp_gemm) */
    int pg_wg;                           /* matmul stages on the wgmma GEMM (pgemm_wg.cu); G4_CUDA_WGMMA=0: mma.sync */
    int fp_warp;                         /* fast prefill's GEMM input terms a warp per token (G4_CUDA_FPWARP=0: a block) */
    int pa_kb;                           /* fast prefill's attention (pattn.cu): 1 tensor cores in 4 key partitions,
                                            G4_CUDA_PATTN=0: unpartitioned, 32 / 64: CUDA cores */
    std::vector<pg_entry> pg_plan;       /* the launches of a chunk, in order */
    std::vector<g4c_op> pops;
    g4c_op *d_pops;
    float *pg_part, *pg_up;              /* K segments' partial sums; a gate/up pair's up projection */
    float *pa_scratch;                   /* the key-partitioned prefill attention's partials (pattn.cu, kb 1) */
    size_t pa_scratch_n;
    unsigned short *fp_x2;               /* the second input-terms buffer (pg_entry.outb) */
    int pg_chain;                        /* pg_entry.outb in use (G4_CUDA_PGCHAIN=0: every GEMM's terms from a kernel launch) */
    int pg_prep;                         /* pg_entry.prep in use (G4_CUDA_PGPREP=0: a launch of the persistent kernel) */
    int pg_pdl;                          /* the prefill's own kernels with programmatic dependent launch (G4_CUDA_PDL=0: off) */
    int staged;                          /* blocks of fewer than G4C_WIDE_M tokens (decode steps, verify blocks) as one
                                            launch per stage (forward.cuh g4c_stage_kernel; use_staged): 4
                                            (default): one-token matmuls of dense rows held to half an SM, one
                                            block per SM (room for the next stage's), their weights through
                                            shared-memory rings whose first copies go out before the wait
                                            (forward.cuh mm_ring), the rest as in 2; G4_CUDA_STAGED=2: one
                                            block per SM; 1: one-token matmuls two blocks per SM; 3: one-token
                                            matmuls on 1's half-SM kernel, one block per SM; 0: the persistent
                                            kernel */
    int stage_pf;                        /* the staged kernels' L2 requests per row team before the wait (G4_CUDA_STAGE_PF, default 0) */
    int ring_q;                          /* mode 4 streams quantised rows through the rings too (G4_CUDA_RING_Q=1; default: mode 2's kernel) */
    int mm_pipe;                         /* one-token quantised tiles load a group ahead (forward.cuh mm_tile_pipe; 2, the
                                            default: the staged decode's first group before the wait;
                                            G4_CUDA_PIPE=1: without that, 0: off) */
    int attn_early;                      /* staged attention stages copy their earlier K/V rows before the wait and, where
                                            their items fit, run held to half an SM so that they can start beside the
                                            stage before (G4_CUDA_ATTN_EARLY=0: after the wait, on the full-SM kernel) */
    int attn_cl;                         /* staged attention stages on the half-SM kernel run in clusters of this many
                                            blocks where a head's chunks fit one (G4_CUDA_ATTN_CL: 8, the default, 16 or 0: off) */
    int attn_cl_full;                    /* and those on the full-SM kernel too (G4_CUDA_ATTN_CLF=1) */
    int attn_cl_verify;                  /* and in verify blocks too (G4_CUDA_ATTN_CLV=1; default: one-token steps only) */
    int ring_long;                       /* mode 4: one-token matmuls whose input tile leaves too little room for full
                                            rings take rings of fewer slots (G4_CUDA_RING_LONG=0: mode 2's kernel) */
    int ring_slots;                      /* > 0: every ring stage that way, at most this many slots (G4_CUDA_RING_SLOTS=4..8:
                                            for testing that path on models whose tiles all fit) */
    int ring_v;                          /* mode 4: verify blocks of 2..4 tokens stream bf16 rows through rings too
                                            (forward.cuh mm_ring at four tokens; G4_CUDA_RING_V=0: mode 2's kernel) */
    int team_spread;                     /* one-token ring stages number their row teams warp-major
                                            (g4c_params.team_spread; G4_CUDA_TEAM_SPREAD=0: off) */
    unsigned ops_gen;                    /* stage lists uploaded so far (push_ops): invalidates cached graphs */
    struct staged_slot {                 /* the staged decode's graphs (blocks of 1..G4C_WIDE_M-1 tokens), by their params */
        g4c_params p;
        unsigned gen;
        cudaGraphExec_t ge;
    } sg[8];
    unsigned sg_next;                    /* the slot a new graph replaces when none is free */
    /* drafter */
    const g4_drafter *dr;
    char *dwmem, *damem;
    std::vector<dev_dlayer> dlw;
    g4c_mat d_pre, d_post, d_emb, d_cent_w;
    const float *d_final_norm;
    std::vector<g4c_op> dops;
    g4c_op *d_dops;
    float *d_part, *d_hid, *d_hcarry, *d_hhist, *d_dlogits, *d_x, *d_xa, *d_xb, *d_q, *d_att, *d_t, *d_hb, *d_f, *d_y, *d_cent;
    int *d_cidx, *d_cflag, *d_order, *d_cluster, *d_att_cnt;
    float d_eps;
};

static g4_status upload(bump *b, const void *host, size_t bytes, const void **dev, g4_error *err) {
    void *d = bump_take(b, bytes);
    *dev = d;
    if (!b->dry && bytes) CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "uploading weights");
    return G4_OK;
}

/* RoPE inverse frequencies theta^(-2i/d), i < d/2, computed here exactly as the CPU forward does */
static g4_status up_rope(bump *b, int d, float theta, const double **out, g4_error *err) {
    std::vector<double> inv((size_t)(d / 2 > 0 ? d / 2 : 1));
    for (int i = 0; i < d / 2; i++) inv[(size_t)i] = pow((double)theta, -2.0 * i / d);
    return upload(b, inv.data(), sizeof(double) * inv.size(), (const void **)out, err);
}

static g4_status up_vec(bump *b, const float *v, int n, const float **out, g4_error *err) {
    if (!v) {
        *out = NULL;
        return G4_OK;
    }
    return upload(b, v, sizeof(float) * (size_t)n, (const void **)out, err);
}

/* One quantised row (src, in its source format) into the device layout of program.h. */
static void quant_row(const g4_mat *m, const g4c_mat *o, int r, unsigned char *dst) {
    const int K = m->cols, ng = K / o->group, sb = o->stype == G4C_S_F32 ? 4 : 2;
    const unsigned char *src = (const unsigned char *)m->data + (size_t)r * m->row_bytes;
    unsigned char *codes = dst, *sc = dst + o->sc_off, *bi = dst + o->bi_off;
    memset(dst, 0, (size_t)o->row_bytes);
    if (m->type == G4_W_Q8_0 || m->type == G4_W_Q4_0) {
        const int bs = m->type == G4_W_Q8_0 ? 34 : 18;
        for (int blk = 0; blk < K / 32; blk++) {
            const unsigned char *b = src + (size_t)blk * bs;
            memcpy(sc + 2 * blk, b, 2); /* f16 d */
            if (m->type == G4_W_Q8_0) memcpy(codes + 32 * blk, b + 2, 32);
            else
                for (int i = 0; i < 16; i++) { /* element i: qs[i] & 15 (i < 16), qs[i-16] >> 4 */
                    unsigned e0 = (2 * i < 16) ? b[2 + 2 * i] & 15 : b[2 + 2 * i - 16] >> 4;
                    unsigned e1 = (2 * i + 1 < 16) ? b[2 + 2 * i + 1] & 15 : b[2 + 2 * i + 1 - 16] >> 4;
                    codes[16 * blk + i] = (unsigned char)(e0 | e1 << 4);
                }
        }
        return;
    }
    /* AFFINE / SYMM: the codes are already an LSB-first stream; copy scales (and biases) */
    memcpy(codes, src, o->type == G4C_Q8 ? (size_t)K : (size_t)K / 2);
    const size_t es = m->scale_dtype == G4_DT_F32 ? 4 : 2;
    if (m->type == G4_W_SYMM && m->group == 0) { /* one scale for the row, kept as f32 */
        const unsigned char *p = (const unsigned char *)m->scales + (size_t)r * es * m->scale_stride;
        float v;
        if (es == 4) memcpy(&v, p, 4);
        else {
            unsigned short h;
            memcpy(&h, p, 2);
            v = m->scale_dtype == G4_DT_F16 ? g4_f16_to_f32(h) : g4_bf16_to_f32(h);
        }
        memcpy(sc, &v, 4);
        return;
    }
    memcpy(sc, (const unsigned char *)m->scales + (size_t)r * es * m->scale_stride, (size_t)ng * sb);
    if (o->flags & G4C_QF_BIAS)
        memcpy(bi, (const unsigned char *)m->biases + (size_t)r * es * m->scale_stride, (size_t)ng * sb);
}

/* Code widths the GPU has no kernels for (2/3/5/6/7-bit MLX and QAT codes, Q4_1, Q5_0, Q5_1 and
 * the K-quants) are widened at upload into its 4-bit (codes of up to 4 bits) or 8-bit containers
 * (cpu/quant.h g4_widen_row: signed codes around their centre, f32 scales and biases; the values
 * the CPU reads, up to one f32 rounding of an additive code's bias), flagged G4C_QF_SIGNED (and
 * G4C_QF_BIAS). Centring matters: 6-bit codes read as 8-bit ones centred at 128 make s·Σ(q−128)x
 * and b'·Σx cancel ~30x, which the fixtures' logits showed at 1e-2. More bytes than the source
 * (Q4_K: 6 bits per weight instead of 4.5), the same values. */
static void wide_row(const g4_mat *m, const g4_widen *wd, const g4c_mat *o, int r, unsigned char *dst,
                     std::vector<int8_t> &v) {
    memset(dst, 0, (size_t)o->row_bytes);
    g4_widen_row(m, wd, r, v.data(), (float *)(dst + o->sc_off), wd->bias ? (float *)(dst + o->bi_off) : NULL);
    for (int c = 0; c < m->cols; c++) {
        if (o->type == G4C_Q8) dst[c] = (unsigned char)v[(size_t)c];
        else dst[c >> 1] |= (unsigned char)((v[(size_t)c] + 8) << (4 * (c & 1)));
    }
}

static g4_status up_quant(bump *b, const g4_mat *m, const char *what, g4c_mat *out, g4_error *err) {
    g4_widen wd;
    const int wide = g4_widen_of(m, &wd);
    const int bits = m->type == G4_W_Q8_0 ? 8 : m->type == G4_W_Q4_0 ? 4 : wide ? wd.bits : m->bits;
    if (m->cols % 32) return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: %s has %d columns", what, m->cols);
    out->type = bits == 8 ? G4C_Q8 : G4C_Q4;
    out->rows = m->rows;
    out->cols = m->cols;
    if (wide) {
        out->stype = G4C_S_F32;
        out->flags = G4C_QF_SIGNED | (wd.bias ? G4C_QF_BIAS : 0);
        out->group = wd.group;
    } else if (m->type == G4_W_Q8_0 || m->type == G4_W_Q4_0) {
        out->group = 32;
        out->flags = G4C_QF_SIGNED;
        out->stype = G4C_S_F16;
    } else if (m->type == G4_W_AFFINE) {
        out->group = m->group;
        out->flags = G4C_QF_BIAS;
    } else {
        out->group = m->group ? m->group : m->cols;
        out->flags = G4C_QF_SIGNED;
    }
    if (!wide && (m->type == G4_W_AFFINE || m->type == G4_W_SYMM)) {
        if (m->type == G4_W_SYMM && m->group == 0) out->stype = G4C_S_F32;
        else out->stype = m->scale_dtype == G4_DT_F32 ? G4C_S_F32 : m->scale_dtype == G4_DT_F16 ? G4C_S_F16 : G4C_S_BF16;
    }
    /* Q6_K's 16-column sub-blocks: the 8-bit kernels take a scale per 16-byte chunk (the prefill
     * procedure's tensor-core matmul needs groups of 32 and leaves such stages to the CUDA cores) */
    const int q6 = wide && m->type == G4_W_Q6_K;
    if ((!q6 && (out->group < 32 || out->group % 32)) || m->cols % out->group)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: %s has groups of %d columns", what, out->group);
    const int ng = m->cols / out->group, sb = out->stype == G4C_S_F32 ? 4 : 2;
    out->sc_off = m->cols * bits / 8;
    out->bi_off = out->sc_off + ng * sb;
    out->row_bytes = (out->bi_off + ((out->flags & G4C_QF_BIAS) ? ng * sb : 0) + 15) & ~15;
    const size_t total = (size_t)out->row_bytes * (size_t)m->rows;
    char *d = (char *)bump_take(b, total);
    out->data = d;
    if (b->dry) return G4_OK;
    const int slab = 4096;
    std::vector<unsigned char> buf((size_t)out->row_bytes * slab);
    std::vector<int8_t> codes(wide ? (size_t)m->cols : 0);
    for (int r0 = 0; r0 < m->rows; r0 += slab) {
        int n = m->rows - r0 < slab ? m->rows - r0 : slab;
        for (int r = 0; r < n; r++) {
            unsigned char *dst = buf.data() + (size_t)r * out->row_bytes;
            if (wide) wide_row(m, &wd, out, r0 + r, dst, codes);
            else quant_row(m, out, r0 + r, dst);
        }
        CK(cudaMemcpy(d + (size_t)r0 * out->row_bytes, buf.data(), (size_t)n * out->row_bytes, cudaMemcpyHostToDevice),
           "uploading weights");
    }
    return G4_OK;
}

/* a bf16 matrix in the tensor cores' tiled layout (program.h G4C_QF_TILED) */
static g4_status up_tiled(bump *b, const g4_mat *m, g4c_mat *out, g4_error *err) {
    const int K = m->cols, nks = K / 32, tiles = (m->rows + 15) / 16;
    const size_t tile_bytes = (size_t)nks * 1024;
    char *d = (char *)bump_take(b, tile_bytes * (size_t)tiles);
    out->data = d;
    out->flags |= G4C_QF_TILED;
    if (b->dry) return G4_OK;
    const int slab = 256; /* tiles per copy */
    std::vector<uint16_t> buf(tile_bytes / 2 * slab);
    for (int T0 = 0; T0 < tiles; T0 += slab) {
        const int n = tiles - T0 < slab ? tiles - T0 : slab;
        std::fill(buf.begin(), buf.end(), (uint16_t)0);
        for (int T = 0; T < n; T++)
            for (int rr = 0; rr < 16; rr++) {
                const long long r = 16LL * (T0 + T) + rr;
                if (r >= m->rows) break;
                const uint16_t *src = (const uint16_t *)((const char *)m->data + (size_t)r * m->row_bytes);
                const int g = rr % 8, half = rr / 8;
                for (int ks = 0; ks < nks; ks++) /* lane 4g+t's 8 columns 32ks+8t.. of this row */
                    for (int t = 0; t < 4; t++)
                        memcpy(&buf[((size_t)T * nks + ks) * 512 + half * 256 + (g * 4 + t) * 8], src + 32 * ks + 8 * t, 16);
            }
        CK(cudaMemcpy(d + (size_t)T0 * tile_bytes, buf.data(), (size_t)n * tile_bytes, cudaMemcpyHostToDevice), "uploading weights");
    }
    return G4_OK;
}

/* tile: a bf16 matrix that only matmul stages and mat_at read goes to the tiled layout when the
 * session runs bf16 on the tensor cores */
static g4_status up_mat(bump *b, const g4_mat *m, const char *what, g4c_mat *out, g4_error *err, int tile = 0) {
    if (m->split) /* the CPU kernels' own layout: models for the GPU are loaded with keep_layout */
        return g4_fail(err, G4_ERR_UNSUPPORTED,
                       "%s: weights were repacked for the CPU kernels (load the model with keep_layout = 1 for a GPU session)",
                       what);
    memset(out, 0, sizeof *out);
    if (!m->data || m->rows == 0) return G4_OK;
    if (m->in_act_scale != 0 || m->out_act_scale != 0)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: %s needs activation fake-quantisation (QAT)", what);
    if (m->type >= G4_W_Q8_0 && m->type <= G4_W_SYMM) return up_quant(b, m, what, out, err); /* every quantised type */
    int t = m->type == G4_W_F32 ? G4C_F32 : m->type == G4_W_F16 ? G4C_F16 : m->type == G4_W_BF16 ? G4C_BF16 : -1;
    if (t < 0)
        return g4_fail(err, G4_ERR_UNSUPPORTED,
                       "CUDA backend: %s is stored as %s; the GPU runs float, GGUF block-quantised, MLX affine and QAT "
                       "weights",
                       what, g4_wtype_name(m->type));
    int per = t == G4C_F32 ? 4 : 8;
    if (m->cols % per)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: %s has %d columns, not a multiple of %d", what, m->cols,
                       per);
    out->type = t;
    out->rows = m->rows;
    out->cols = m->cols;
    out->row_bytes = (long long)m->row_bytes;
    if (tile && t == G4C_BF16 && m->cols % 32 == 0) {
        out->row_bytes = 2LL * m->cols;
        return up_tiled(b, m, out, err);
    }
    return upload(b, m->data, m->row_bytes * (size_t)m->rows, &out->data, err);
}

static g4_status upload_model(g4_cuda *c, bump *b, g4_error *err) {
    const g4_model *m = c->m;
    const g4_config *cf = &m->cfg;
    int H = cf->hidden, L = cf->n_layers;
    g4_status st;
    char what[96];
    const int tile = c->mma_bf16;
    if ((st = up_mat(b, &m->embed, "embed_tokens", &c->embed, err, tile)) || (st = up_vec(b, m->final_norm, H, &c->final_norm, err)))
        return st;
    if (cf->ple_width) {
        if ((st = up_mat(b, &m->ple_embed, "embed_tokens_per_layer", &c->ple_embed, err)) ||
            (st = up_mat(b, &m->ple_model_proj, "per_layer_model_projection", &c->ple_proj, err, tile)) ||
            (st = up_vec(b, m->ple_proj_norm, cf->ple_width, &c->ple_norm, err)))
            return st;
    }
    c->lw.assign((size_t)L, dev_layer());
    for (int i = 0; i < L; i++) {
        const g4_layer_config *lc = &cf->layers[i];
        const g4_layer_weights *w = &m->layers[i];
        dev_layer *o = &c->lw[(size_t)i];
        memset(o, 0, sizeof *o);
        int own = lc->kv_source == i;
#define MAT(f, name) (snprintf(what, sizeof what, "layers.%d.%s", i, name), up_mat(b, &w->f, what, &o->f, err, tile))
        if ((st = MAT(wq, "q_proj")) || (st = MAT(wo, "o_proj")) || (st = MAT(gate, "gate_proj")) ||
            (st = MAT(up, "up_proj")) || (st = MAT(down, "down_proj")))
            return st;
        if (o->gate.type != o->up.type || o->gate.group != o->up.group || o->gate.flags != o->up.flags ||
            o->gate.stype != o->up.stype || o->gate.sc_off != o->up.sc_off)
            return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: layers.%d gate_proj and up_proj are stored differently",
                           i);
        if (own && ((st = MAT(wk, "k_proj")) || (!lc->k_eq_v && (st = MAT(wv, "v_proj"))))) return st;
        if (cf->moe && ((st = MAT(router, "router.proj")) || (st = up_mat(b, &w->experts_gate_up, "experts.gate_up_proj", &o->ex_gu, err)) ||
                        (st = up_mat(b, &w->experts_down, "experts.down_proj", &o->ex_down, err))))
            return st;
        if (cf->ple_width && ((st = MAT(ple_gate, "per_layer_input_gate")) || (st = MAT(ple_proj, "per_layer_projection"))))
            return st;
#undef MAT
        int d = lc->head_dim;
        if ((st = up_vec(b, w->attn_norm, H, &o->attn_norm, err)) || (st = up_vec(b, w->post_attn_norm, H, &o->post_attn, err)) ||
            (st = up_vec(b, w->pre_ffn_norm, H, &o->pre_ffn, err)) || (st = up_vec(b, w->post_ffn_norm, H, &o->post_ffn, err)) ||
            (st = up_vec(b, w->q_norm, d, &o->q_norm, err)) || (own && (st = up_vec(b, w->k_norm, d, &o->k_norm, err))) ||
            (st = up_rope(b, d, lc->rope_theta, &o->rope_inv, err)))
            return st;
        if (cf->moe && ((st = up_vec(b, w->router_scale, H, &o->router_scale, err)) ||
                        (st = up_vec(b, w->expert_scale, cf->n_experts, &o->expert_scale, err)) ||
                        (st = up_vec(b, w->pre_ffn_norm2, H, &o->pre2, err)) || (st = up_vec(b, w->post_ffn_norm1, H, &o->post1, err)) ||
                        (st = up_vec(b, w->post_ffn_norm2, H, &o->post2, err))))
            return st;
        if (cf->ple_width && (st = up_vec(b, w->post_ple_norm, H, &o->post_ple, err))) return st;
        o->layer_scalar = w->layer_scalar;
    }
    return G4_OK;
}

/* ---- activations and caches ------------------------------------------------------------------------ */

/* layers whose RoPE (head dim, theta, rotated pairs) is the same share a table */
static int same_rope(const g4_layer_config *a, const g4_layer_config *b) {
    return a->head_dim == b->head_dim && a->rope_theta == b->rope_theta && a->rope_pairs == b->rope_pairs;
}

static void layout_scratch(g4_cuda *c, bump *b) {
    const g4_config *cf = &c->m->cfg;
    int B = c->max_batch, H = cf->hidden, L = cf->n_layers, nH = cf->n_heads, V = cf->vocab, P = cf->ple_width;
    int maxd = 0, maxkv = 0, maxI = 0, maxnkv = 0, maxgroup = 0;
    for (int i = 0; i < L; i++) {
        const g4_layer_config *l = &cf->layers[i];
        maxd = l->head_dim > maxd ? l->head_dim : maxd;
        maxkv = l->n_kv_heads * l->head_dim > maxkv ? l->n_kv_heads * l->head_dim : maxkv;
        maxI = l->mlp_width > maxI ? l->mlp_width : maxI;
        maxnkv = l->n_kv_heads > maxnkv ? l->n_kv_heads : maxnkv;
        maxgroup = nH / l->n_kv_heads > maxgroup ? nH / l->n_kv_heads : maxgroup;
    }
    c->max_chunks = c->n_ctx / G4C_KCHUNK + 2;
    c->ctl = TAKE(b, g4c_ctl, 1);
    /* for grids of up to two blocks per SM (the staged decode's matmul kernels) */
    c->amax_part = TAKE(b, float, (size_t)2 * c->grid * G4C_MAXB);
    c->amax_idx = TAKE(b, int, (size_t)2 * c->grid * G4C_MAXB);
    c->amin_part = TAKE(b, float, 2 * c->grid);
    c->hist = TAKE(b, int, c->n_ctx + 1);
    c->x0 = TAKE(b, float, (size_t)B * H);
    c->xa = TAKE(b, float, (size_t)B * H);
    c->xb = TAKE(b, float, (size_t)B * H);
    c->t = TAKE(b, float, (size_t)B * H);
    c->f = TAKE(b, float, (size_t)B * H);
    c->hfinal = TAKE(b, float, (size_t)B * H);
    c->q = TAKE(b, float, (size_t)B * nH * maxd);
    c->att = TAKE(b, float, (size_t)B * nH * maxd);
    c->qn = TAKE(b, float, (size_t)B * nH * maxd);
    c->kraw = TAKE(b, float, (size_t)B * maxkv);
    c->vraw = TAKE(b, float, (size_t)B * maxkv);
    c->hb = TAKE(b, float, (size_t)B * maxI);
    c->logits = TAKE(b, float, (size_t)B * V);
    c->part_buf = TAKE(b, float, (size_t)B * maxnkv * c->max_chunks * maxgroup * (maxd + 2));
    c->att_cnt = TAKE(b, int, (size_t)B * nH);
    c->mma_part = c->mma_bf16 ? TAKE(b, float, (size_t)G4C_MMA_MAXITEMS * 2 * 16 * B) : NULL;
    c->mma_cnt = c->mma_bf16 ? TAKE(b, int, (size_t)G4C_MMA_MAXITEMS * B) : NULL;
    { /* the prefill procedure: input terms of every matmul width, segment partials (K split only
         where bands · segments <= G4C_FP_TARGET), counters per band and token block */
        int K = H > nH * maxd ? H : nH * maxd;
        K = maxI > K ? maxI : K;
        K = P > K ? P : K;
        c->fp_ld = (K + 7) & ~7;
        const int tbs = (B + G4C_FP_TB - 1) / G4C_FP_TB;
        c->fp_x = TAKE(b, unsigned short, (size_t)G4C_FP_TERMS * B * c->fp_ld);
        c->fp_x2 = c->pg_on ? TAKE(b, unsigned short, (size_t)G4C_FP_TERMS * B * c->fp_ld) : NULL;
        c->fp_sx = TAKE(b, float, (size_t)B * (c->fp_ld / 32 + 1));
        c->fp_part = TAKE(b, float, (size_t)G4C_FP_TARGET * tbs * G4C_FP_SLOT);
        c->fp_cnt = TAKE(b, int, (size_t)G4C_FP_MAXBANDS * tbs);
    }
    c->ple = P ? TAKE(b, float, (size_t)B * L * P) : NULL;
    c->pg = P ? TAKE(b, float, (size_t)B * P) : NULL;
    if (cf->moe) {
        int E = cf->n_experts, K = cf->top_k_experts, Im = cf->moe_width;
        c->router = TAKE(b, float, (size_t)B * E);
        c->top_e = TAKE(b, int, (size_t)B * K);
        c->top_w = TAKE(b, float, (size_t)B * K);
        c->x2 = TAKE(b, float, (size_t)B * H);
        c->exh = TAKE(b, float, (size_t)B * K * Im);
        c->exo = TAKE(b, float, (size_t)B * K * H);
    }
    c->kv.assign((size_t)L, dev_kv());
    c->max_row = 0;
    for (int i = 0; i < L; i++) {
        const g4_layer_config *l = &cf->layers[i];
        dev_kv *k = &c->kv[(size_t)i];
        memset(k, 0, sizeof *k);
        if (l->kv_source != i) continue;
        k->row = l->n_kv_heads * l->head_dim;
        k->cap = l->is_full ? c->n_ctx : (cf->sliding_window < c->n_ctx ? cf->sliding_window : c->n_ctx);
        k->kc = TAKE(b, float, (size_t)k->cap * k->row);
        k->vc = TAKE(b, float, (size_t)k->cap * k->row);
        k->kst = TAKE(b, float, (size_t)B * k->row);
        k->vst = TAKE(b, float, (size_t)B * k->row);
        c->max_row = k->row > c->max_row ? k->row : c->max_row;
    }
    c->d_kvl = TAKE(b, g4c_kvlayer, L);
    /* RoPE tables, one per kind (head dim, theta, rotated pairs), filled by g4c_rope_fill */
    c->rope_cs.assign((size_t)L, NULL);
    c->rope_src.assign((size_t)L, 0);
    for (int i = 0; i < L; i++) {
        const g4_layer_config *l = &cf->layers[i];
        int src = i;
        for (int j = 0; j < i && src == i; j++) {
            const g4_layer_config *o = &cf->layers[j];
            if (same_rope(o, l)) src = j;
        }
        c->rope_src[(size_t)i] = src;
        c->rope_cs[(size_t)i] = src == i ? TAKE(b, float, (size_t)c->n_ctx * 2 * (l->rope_pairs > 0 ? l->rope_pairs : 1))
                                         : c->rope_cs[(size_t)src];
    }
}

/* ---- the target's stage list ------------------------------------------------------------------- */

static g4c_op op_new(int kind, int cls) {
    g4c_op o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    o.cls = cls;
    return o;
}

static g4c_part part_of(const g4c_mat &w, float *y, int ldy) {
    g4c_part p;
    memset(&p, 0, sizeof p);
    p.w = w;
    p.y = y;
    p.ldy = ldy;
    return p;
}

/* residual stream bookkeeping: the current x buffer and the pending (t, norm, scalar) fold */
typedef struct {
    const float *cur;
    float *buf[2];
    int next;
    const float *t, *t_w;
    int has_scalar;
    float scalar;
} stream_t;

/* input spec folding the pending update into the stream (written to a fresh buffer) */
static g4c_in fold_in(stream_t *s, int H, int norm, const float *norm_w) {
    g4c_in in;
    memset(&in, 0, sizeof in);
    in.kind = G4C_IN_NORM;
    in.x = s->cur;
    in.ldx = H;
    in.t = s->t;
    in.t_w = s->t_w;
    in.has_scalar = s->has_scalar;
    in.scalar = s->scalar;
    in.norm = norm;
    in.norm_w = norm_w;
    if (s->t || s->has_scalar) {
        in.x_out = s->buf[s->next];
        s->cur = s->buf[s->next];
        s->next ^= 1;
    }
    s->t = s->t_w = NULL;
    s->has_scalar = 0;
    return in;
}

static g4c_in plain_in(const float *x, int ldx) {
    g4c_in in;
    memset(&in, 0, sizeof in);
    in.kind = G4C_IN_PLAIN;
    in.x = x;
    in.ldx = ldx;
    return in;
}

static void attn_ops(std::vector<g4c_op> &ops, const g4c_op &base) {
    g4c_op a = base;
    a.kind = G4C_OP_ATTN;
    a.cls = G4C_CLS_ATTN;
    ops.push_back(a);
}

static void build_target(g4_cuda *c) {
    const g4_model *m = c->m;
    const g4_config *cf = &m->cfg;
    const int H = cf->hidden, L = cf->n_layers, nH = cf->n_heads, P = cf->ple_width, V = cf->vocab, B = c->max_batch;
    std::vector<g4c_op> &ops = c->ops;
    ops.clear();
    g4c_op o = op_new(G4C_OP_EMBED, G4C_CLS_OTHER);
    o.table = c->embed;
    o.scale = m->embed_scale;
    o.out = c->x0;
    o.out_ld = H;
    ops.push_back(o);
    if (P) {
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = plain_in(c->x0, H);
        o.nparts = 1;
        o.part[0] = part_of(c->ple_proj, c->ple, L * P);
        ops.push_back(o);
        o = op_new(G4C_OP_PLE, G4C_CLS_OTHER);
        o.table = c->ple_embed;
        o.scale = 1.0f / sqrtf((float)H);
        o.scale2 = 1.0f / sqrtf(2.0f);
        o.scale3 = m->ple_embed_scale;
        o.vec = c->ple_norm;
        o.out = c->ple;
        o.out_ld = L * P;
        o.L = L;
        o.P = P;
        ops.push_back(o);
    }
    stream_t s;
    memset(&s, 0, sizeof s);
    s.cur = c->x0;
    s.buf[0] = c->xa;
    s.buf[1] = c->xb;
    for (int l = 0; l < L; l++) {
        const g4_layer_config *lc = &cf->layers[l];
        const dev_layer *w = &c->lw[(size_t)l];
        const int d = lc->head_dim, nkv = lc->n_kv_heads, own = lc->kv_source == l, I = lc->mlp_width;
        const dev_kv *kvo = &c->kv[(size_t)l], *kvs = &c->kv[(size_t)lc->kv_source];
        /* q, k, v */
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = fold_in(&s, H, G4C_NORM_RMS, w->attn_norm);
        if (c->dbg && l > 0) o.in.dbg = c->dbg + (size_t)(l - 1) * B * H;
        o.nparts = 1;
        o.part[0] = part_of(w->wq, c->q, nH * d);
        if (own) {
            o.part[o.nparts++] = part_of(w->wk, c->kraw, nkv * d);
            if (!lc->k_eq_v) o.part[o.nparts++] = part_of(w->wv, c->vraw, nkv * d);
        }
        ops.push_back(o);
        /* heads */
        g4c_op hd = op_new(G4C_OP_HEADS, G4C_CLS_OTHER);
        hd.n_heads = nH;
        hd.n_kv = nkv;
        hd.d = d;
        hd.pairs = lc->rope_pairs;
        hd.rope_inv = w->rope_inv;
        hd.rope_cs = c->rope_cs[(size_t)l];
        hd.qkv_own = own;
        hd.k_eq_v = lc->k_eq_v;
        hd.q = c->q;
        hd.kraw = c->kraw;
        hd.vraw = c->vraw;
        hd.q_norm = w->q_norm;
        hd.k_norm = w->k_norm;
        hd.kst = kvo->kst;
        hd.vst = kvo->vst;
        hd.kc = kvo->kc;
        hd.vc = kvo->vc;
        hd.cap_rows = kvo->cap;
#ifdef G4C_SEPARATE_HEADS
        ops.push_back(hd);
#endif
        /* attention over the source layer's cache (and, fused, the heads' norms and RoPE: one
         * stage and one grid barrier fewer per layer) */
        g4c_op at = op_new(G4C_OP_ATTN, G4C_CLS_ATTN);
#ifndef G4C_SEPARATE_HEADS
        at.heads = 1;
        at.pairs = hd.pairs;
        at.rope_inv = hd.rope_inv;
        at.rope_cs = hd.rope_cs;
        at.qkv_own = own;
        at.k_eq_v = hd.k_eq_v;
        at.kraw = hd.kraw;
        at.vraw = hd.vraw;
        at.q_norm = hd.q_norm;
        at.k_norm = hd.k_norm;
#endif
        at.n_heads = nH;
        at.n_kv = nkv;
        at.d = d;
        at.is_full = lc->is_full;
        at.window = cf->sliding_window;
        at.q = c->q;
        at.kst = kvs->kst;
        at.vst = kvs->vst;
        at.kc = kvs->kc;
        at.vc = kvs->vc;
        at.cap_rows = kvs->cap;
        at.att = c->att;
        at.part_buf = c->part_buf;
        at.att_cnt = c->att_cnt;
        at.max_chunks = c->max_chunks;
        attn_ops(ops, at);
        /* o_proj */
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = plain_in(c->att, nH * d);
        o.nparts = 1;
        o.part[0] = part_of(w->wo, c->t, H);
        ops.push_back(o);
        /* x1 = x + rms_w(post_attn)(t); gelu(g) ⊙ u */
        s.t = c->t;
        s.t_w = w->post_attn;
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = fold_in(&s, H, G4C_NORM_RMS, w->pre_ffn);
        o.epi = G4C_EPI_GELU_PAIR;
        o.nparts = 2;
        o.part[0] = part_of(w->gate, c->hb, I);
        o.part[1] = part_of(w->up, c->hb, I);
        ops.push_back(o);
        /* down */
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = plain_in(c->hb, I);
        o.nparts = 1;
        o.part[0] = part_of(w->down, c->f, H);
        ops.push_back(o);
        if (cf->moe) {
            const int E = cf->n_experts, K = cf->top_k_experts, Im = cf->moe_width;
            o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
            o.in = plain_in(s.cur, H);
            o.in.kind = G4C_IN_NORM;
            o.in.norm = G4C_NORM_ROUTER;
            o.in.norm_w = w->router_scale;
            o.in.norm_scale = 1.0f / sqrtf((float)H);
            o.nparts = 1;
            o.part[0] = part_of(w->router, c->router, E);
            ops.push_back(o);
            g4c_op r = op_new(G4C_OP_MOE_ROUTE, G4C_CLS_OTHER);
            r.E = E;
            r.topk = K;
            r.H = H;
            r.Im = Im;
            r.router_logits = c->router;
            r.expert_scale = w->expert_scale;
            r.pre2_w = w->pre2;
            r.top_e = c->top_e;
            r.top_w = c->top_w;
            r.x2 = c->x2;
            r.x1 = s.cur;
            ops.push_back(r);
            g4c_op e = r;
            e.kind = G4C_OP_EXPERT;
            e.cls = G4C_CLS_MATMUL;
            e.ex_pair = 1;
            e.ew = w->ex_gu;
            e.ex_in = c->x2;
            e.ex_out = c->exh;
            ops.push_back(e);
            e.ex_pair = 0;
            e.ew = w->ex_down;
            e.ex_in = c->exh;
            e.ex_out = c->exo;
            ops.push_back(e);
            g4c_op cb = r;
            cb.kind = G4C_OP_MOE_COMBINE;
            cb.f = c->f;
            cb.ex_res = c->exo;
            cb.post1_w = w->post1;
            cb.post2_w = w->post2;
            ops.push_back(cb);
        }
        s.t = c->f;
        s.t_w = w->post_ffn;
        if (P) {
            /* x2 = x1 + rms_w(post_ffn)(f); gelu(x2 · gateᵀ) ⊙ ple[l]; · projᵀ */
            o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
            o.in = fold_in(&s, H, G4C_NORM_NONE, NULL);
            o.epi = G4C_EPI_PLE_GATE;
            o.ple = c->ple + (size_t)l * P;
            o.ple_ld = L * P;
            o.nparts = 1;
            o.part[0] = part_of(w->ple_gate, c->pg, P);
            ops.push_back(o);
            o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
            o.in = plain_in(c->pg, P);
            o.nparts = 1;
            o.part[0] = part_of(w->ple_proj, c->t, H);
            ops.push_back(o);
            s.t = c->t;
            s.t_w = w->post_ple;
        }
        s.has_scalar = 1;
        s.scalar = w->layer_scalar;
    }
    /* final norm, tied head, softcap, argmax */
    o = op_new(G4C_OP_MATMUL, G4C_CLS_HEAD);
    o.lm = 1;
    o.in = fold_in(&s, H, G4C_NORM_RMS, c->final_norm);
    o.in.x_out = NULL;
    if (c->dbg) o.in.dbg = c->dbg + (size_t)(L - 1) * B * H;
    o.in.normed_out = c->hfinal;
    o.epi = cf->final_softcap > 0 ? G4C_EPI_SOFTCAP : G4C_EPI_STORE;
    o.cap = cf->final_softcap;
    o.nparts = 1;
    o.part[0] = part_of(c->embed, c->logits, V);
    o.part[0].argmax = 1;
    ops.push_back(o);
}

/* Row-team size of a matmul stage: enough warps per row pair that each lane streams at most
 * split_chunks 16-byte chunks of a row (0: 32 for dense rows, 8 for quantised ones). A function of
 * the stage's shape only (never of M or of the grid), so each output keeps one reduction order.
 * Measured on the H200 (gpu_bench --tune, decode at ctx 128, 8 -> 32): 31B bf16 36.9 -> 51.7 tok/s
 * (49% -> 69% of bandwidth), E4B bf16 162.2 -> 185.9, E2B bf16 286.9 -> 296.6: a lane with more
 * chunks keeps more loads in flight and its row needs no team sum; E4B qat-int4 192.2 -> 188.9,
 * E2B qat-int4 281.4 -> 283.2, so quantised rows keep 8. */
enum { G4C_SPLIT_DENSE = 32, G4C_SPLIT_QUANT = 8 };
static int split_of(const g4c_op &o, int split_chunks) {
    int S = 1;
    for (int i = 0; i < o.nparts; i++) {
        const g4c_mat &w = o.part[i].w;
        if (!w.data) continue;
        const int nch = w.cols / G4C_CHUNK_ELEMS(w.type);
        const int q = w.type == G4C_Q4 || w.type == G4C_Q8;
        const int sc = split_chunks > 0 ? split_chunks : q ? G4C_SPLIT_QUANT : G4C_SPLIT_DENSE;
        int s = 1;
        while (G4C_WARPS % (2 * s) == 0 && nch > 32 * s * sc) s *= 2; /* teams tile the block */
        S = s > S ? s : S;
    }
    return S;
}

/* K segments per 16-row tile of a stage that may run on the tensor cores (mm_tile_mma): the most
 * that keep >= 8 k-steps of 32 columns per segment, divide K evenly and make at most
 * G4C_MMA_MAXITEMS items (1 for stages with that many row tiles already, such as the LM head); 0
 * for shapes that procedure does not take. A function of the stage's shape only. */
static int mma_segments(const g4c_op &o) {
    const g4c_mat &w = o.part[0].w;
    if (o.kind != G4C_OP_MATMUL || w.type != G4C_BF16 || w.cols % 32) return 0;
    for (int i = 0; i < o.nparts; i++)
        if (!(o.part[i].w.flags & G4C_QF_TILED)) return 0;
    int rt = 0;
    for (int i = 0; i < (o.epi == G4C_EPI_GELU_PAIR ? 1 : o.nparts); i++) rt += (o.part[i].w.rows + 15) / 16;
    const int nks = w.cols / 32;
    int ks = 1;
    for (int d = 2; d <= nks / 8; d++)
        if (nks % d == 0 && (long long)rt * d <= G4C_MMA_MAXITEMS) ks = d;
    return ks;
}

/* K segments per band of a stage the prefill procedure takes (forward.cuh fp_gemm), 0 for the
 * others: bf16 row-major or quantised (Q4 / Q8, one layout for every part) matrices of one width K
 * (a multiple of 32), no argmax, no logits row range, no drafter input. Bands are 16 tiles of 16 rows (gate/up pairs: 8 of each); the segments
 * (whole chunks of G4C_FP_KS k-steps) bring a token block's items to about G4C_FP_TARGET. A
 * function of the stage's shape only. */
static int fp_segments(const g4c_op &o) {
    if (o.kind != G4C_OP_MATMUL || o.lm || o.in.kind == G4C_IN_CONCAT || o.nparts < 1) return 0;
    const int K = o.part[0].w.cols;
    if (K % 32) return 0;
    const g4c_mat &w0 = o.part[0].w;
    const bool quant = w0.type == G4C_Q4 || w0.type == G4C_Q8;
    if (quant && (w0.group % 32 || (w0.stype == G4C_S_F32 && (w0.sc_off % 4 || w0.bi_off % 4)))) return 0;
    for (int i = 0; i < o.nparts; i++) {
        const g4c_mat &w = o.part[i].w;
        if (!w.data || (w.type != G4C_BF16 && !quant) || (w.flags & G4C_QF_TILED) || w.cols != K || o.part[i].argmax ||
            w.row_bytes % 16 || (uintptr_t)w.data % 16)
            return 0;
        if (quant && (w.type != w0.type || w.group != w0.group || w.flags != w0.flags || w.stype != w0.stype ||
                      w.sc_off != w0.sc_off || w.bi_off != w0.bi_off))
            return 0; /* the staging reads one layout (forward.cuh fp_stage_q) */
    }
    const int pair = o.epi == G4C_EPI_GELU_PAIR;
    if (pair && (o.nparts != 2 || o.part[1].w.rows != o.part[0].w.rows)) return 0;
    long long rt = 0;
    for (int i = 0; i < (pair ? 1 : o.nparts); i++) rt += (o.part[i].w.rows + 15) / 16;
    const long long bands = (rt + (pair ? G4C_WARPS : 2 * G4C_WARPS) - 1) / (pair ? G4C_WARPS : 2 * G4C_WARPS);
    if (bands > G4C_FP_MAXBANDS) return 0;
    const int nch = (K / 32 + G4C_FP_KS - 1) / G4C_FP_KS;
    int ks = (int)(G4C_FP_TARGET / bands);
    if (ks > nch) ks = nch;
    return ks < 1 ? 1 : ks;
}

/* splits and the next-matmul links (the L2 prefetch lookahead) of a stage list */
static void finish_ops(const g4_cuda *c, std::vector<g4c_op> &ops) {
    /* the kernels run one weight type per matmul stage: split stages whose parts differ (mixed
     * quantisation recipes); each copy reads the same input, so the fold is recomputed alike */
    for (size_t i = 0; i < ops.size(); i++) {
        g4c_op &o = ops[i];
        if (o.kind != G4C_OP_MATMUL || o.epi == G4C_EPI_GELU_PAIR || o.nparts < 2) continue;
        int k = 1;
        while (k < o.nparts && o.part[k].w.type == o.part[0].w.type) k++;
        if (k == o.nparts) continue;
        g4c_op rest = o;
        rest.nparts = o.nparts - k;
        for (int q = 0; q < rest.nparts; q++) rest.part[q] = o.part[k + q];
        o.nparts = k;
        ops.insert(ops.begin() + (long)i + 1, rest);
    }
    int next = -1;
    for (int i = (int)ops.size() - 1; i >= 0; i--) {
        g4c_op &o = ops[(size_t)i];
        o.split = o.kind == G4C_OP_MATMUL ? split_of(o, c->split_chunks) : 1;
        o.mma_ks = mma_segments(o);
        o.fp_ks = fp_segments(o);
        o.pf_next = next;
        if (o.kind == G4C_OP_MATMUL) next = i;
    }
}

/* The weight types (and the tensor-core procedure) the target's and the drafter's stages use: the
 * launch takes the smallest kernel instantiation that has code for all of them (kept in c->kmask
 * whenever a stage list is uploaded; never narrowed when a drafter is released). */
static unsigned kernel_mask(const g4_cuda *c) {
    unsigned m = 0;
    for (const std::vector<g4c_op> *list : {&c->ops, &c->dops})
        for (const g4c_op &o : *list) {
            if (o.kind == G4C_OP_MATMUL) {
                for (int i = 0; i < o.nparts; i++) {
                    const g4c_mat &w = o.part[i].w;
                    if (!w.data) continue;
                    m |= 1u << w.type;
                    /* per-channel 4-bit rows without a bias: the integer tensor cores when asked */
                    if (c->imma && w.type == G4C_Q4 && !(w.flags & G4C_QF_BIAS) && w.group == w.cols) m |= G4C_KM_IQ;
                }
                if (o.mma_ks) m |= G4C_KM_MMA;
            } else if (o.kind == G4C_OP_EXPERT) {
                m |= 1u << o.ew.type;
            }
        }
    return m;
}

/* Uploads a stage list (the target's or the drafter's) and refreshes the kernel mask. */
static g4_status push_ops(g4_cuda *c, std::vector<g4c_op> &ops, g4c_op **dev, g4_error *err) {
    if (*dev) cudaFree(*dev);
    *dev = NULL;
    for (size_t i = 0; i < ops.size(); i++) ops[i].idx = (int)i;
    CK(cudaMalloc((void **)dev, sizeof(g4c_op) * ops.size()), "allocating the stage list");
    CK(cudaMemcpy(*dev, ops.data(), sizeof(g4c_op) * ops.size(), cudaMemcpyHostToDevice), "uploading the stage list");
    c->kmask |= kernel_mask(c);
    c->ops_gen++;
    return G4_OK;
}

/* ---- fast prefill as a sequence of launches -------------------------------------------------------- */

/* a matrix the prefill GEMM reads: bf16 row-major, or per-channel signed 4-bit rows with one f32
 * scale and no bias (QAT int4) */
static int pg_mat_ok(const g4c_mat &w) {
    if (!w.data || (w.flags & G4C_QF_TILED) || w.row_bytes % 16 || (uintptr_t)w.data % 16) return 0;
    if (w.type == G4C_BF16) return 1;
    return w.type == G4C_Q4 && (w.flags & G4C_QF_SIGNED) && !(w.flags & G4C_QF_BIAS) && w.group == w.cols &&
           w.stype == G4C_S_F32 && w.sc_off % 4 == 0;
}

/* a stage of a fast prefill the prefill GEMM takes: one the kernel's prefill procedure takes
 * (fp_ks > 0: no argmax, no logits range, whole k-steps) whose matrices it reads and whose
 * epilogue it has */
static int pg_stage(const g4c_op &o) {
    if (o.kind != G4C_OP_MATMUL || o.fp_ks <= 0 || o.nparts < 1) return 0;
    if (o.epi != G4C_EPI_STORE && o.epi != G4C_EPI_PLE_GATE && o.epi != G4C_EPI_GELU_PAIR) return 0;
    for (int i = 0; i < o.nparts; i++)
        if (!pg_mat_ok(o.part[i].w) || o.part[i].argmax) return 0;
    return 1;
}

/* The fast prefill's launches from the target's stage list: each run of stages up to one with a
 * launch of its own (a matmul the prefill GEMM takes; an attention stage pattn.cu takes) is a
 * launch of the persistent kernel (its own copy of those stages, the L2 prefetch links kept within
 * it) whose last stage runs its first phase only (prep_only: a matmul's input terms; attention's
 * norms and ropes of the queries and own K/V rows); then that stage's own launches; the stages
 * after the last such stage are a final launch. Where the run is that stage alone, its first
 * phase is a small launch instead (pprep.cu, the same device code), or none at all when the
 * stage's input is the previous launch's output as it is (that launch writes the terms). Per output the arithmetic of either kernel does
 * not depend on the launch's token count, so a prompt's logits still do not depend on the chunk
 * size. */
static g4_status pg_build(g4_cuda *c, g4_error *err) {
    c->pg_plan.clear();
    c->pops.clear();
    cudaFree(c->d_pops);
    cudaFree(c->pg_part);
    cudaFree(c->pg_up);
    cudaFree(c->pa_scratch);
    c->d_pops = NULL;
    c->pg_part = c->pg_up = c->pa_scratch = NULL;
    c->pa_scratch_n = 0;
    if (!c->pg_on) return G4_OK;
    const std::vector<g4c_op> &ops = c->ops;
    const int n = (int)ops.size(), B = c->max_batch;
    size_t need_part = 0, need_up = 0;
    auto range = [&](int b, int e, int prep) { /* stages [b, e) */
        if (e <= b) return;
        pg_entry r = {-1, (int)c->pops.size(), e - b, 0, 0, -1};
        c->pg_plan.push_back(r);
        for (int j = b; j < e; j++) {
            g4c_op o = ops[(size_t)j];
            o.pf_next = o.pf_next > j && o.pf_next < e ? o.pf_next - b : -1;
            o.prep_only = prep && j == e - 1;
            c->pops.push_back(o);
        }
    };
    int a = 0;
    for (int i = 0; i < n; i++) {
        const g4c_op &o = ops[(size_t)i];
        const int attn = o.kind == G4C_OP_ATTN && g4c_pattn_ok(&o);
        if (!attn && !pg_stage(o)) continue;
        pg_entry en = {i, 0, 0, 0, 0, -1};
        /* a GEMM whose input is the previous launch's output as it is (o_proj after attention,
         * down after the gate/up pair, the PLE projection after its gate): that launch writes the
         * terms (into the buffer the previous GEMM does not read), no launch of the kernel between */
        pg_entry *pv = c->pg_plan.empty() ? NULL : &c->pg_plan.back();
        int chained = 0;
        if (!attn && a == i && pv && pv->stage == i - 1 && o.in.kind == G4C_IN_PLAIN && !o.in.dbg && c->fp_x2 && c->pg_chain) {
            const g4c_op &po = ops[(size_t)i - 1];
            const int pv_attn = po.kind == G4C_OP_ATTN;
            const float *y = pv_attn ? po.att : po.nparts == 1 || po.epi == G4C_EPI_GELU_PAIR ? po.part[0].y : NULL;
            const int ldy = pv_attn ? po.n_heads * po.d : po.part[0].ldy;
            if (y && y == o.in.x && ldy == o.in.ldx) {
                en.inb = pv->outb = pv_attn ? 1 : 1 - pv->inb;
                chained = 1;
            }
        }
        /* nothing else since the previous launch: the stage's first phase alone, a small launch */
        if (!chained && a == i && c->pg_prep && (attn ? g4c_pprep_attn_ok(&o) : g4c_pprep_ok(&o))) en.prep = 1;
        if (!chained && !en.prep) range(a, i + 1, 1);
        c->pg_plan.push_back(en);
        a = i + 1;
        if (attn) {
            const size_t ns = c->pa_kb == 1 ? g4c_pattn_scratch_floats(&o, B) : 0;
            if (ns > c->pa_scratch_n) c->pa_scratch_n = ns;
            continue;
        }
        for (int k = 0; k < o.nparts; k++) {
            const g4c_mat &w = o.part[k].w;
            const int S = g4c_pgemm_segments(w.rows, w.cols);
            if (S > 1 && (size_t)S * w.rows * B > need_part) need_part = (size_t)S * w.rows * B;
        }
        if (o.epi == G4C_EPI_GELU_PAIR && (size_t)o.part[1].w.rows * B > need_up) need_up = (size_t)o.part[1].w.rows * B;
    }
    if (!a) { /* no stage for it: the kernel's own procedure */
        c->pg_plan.clear();
        c->pops.clear();
        return G4_OK;
    }
    range(a, n, 0);
    CK(cudaMalloc((void **)&c->d_pops, sizeof(g4c_op) * c->pops.size()), "allocating the prefill stage lists");
    CK(cudaMemcpy(c->d_pops, c->pops.data(), sizeof(g4c_op) * c->pops.size(), cudaMemcpyHostToDevice),
       "uploading the prefill stage lists");
    if (need_part) CK(cudaMalloc((void **)&c->pg_part, sizeof(float) * need_part), "allocating the prefill GEMM's partial sums");
    if (need_up) CK(cudaMalloc((void **)&c->pg_up, sizeof(float) * need_up), "allocating the prefill GEMM's pair buffer");
    if (c->pa_scratch_n)
        CK(cudaMalloc((void **)&c->pa_scratch, sizeof(float) * c->pa_scratch_n), "allocating the prefill attention's partials");
    return G4_OK;
}

/* ---- probe, create, free ------------------------------------------------------------------------ */

extern "C" g4_status g4_cuda_probe(char *desc, size_t desc_len, g4_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return g4_fail(err, G4_ERR_UNSUPPORTED, "no CUDA device/driver: %s", cudaGetErrorString(e));
    }
    if (n == 0) return g4_fail(err, G4_ERR_UNSUPPORTED, "no CUDA device/driver: no device found");
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "no CUDA device/driver: %s", cudaGetErrorString(e));
    if (prop.major != 9 || prop.minor != 0)
        return g4_fail(err, G4_ERR_UNSUPPORTED,
                       "no CUDA device/driver: %s is compute capability %d.%d; this build has kernels for sm_90a only",
                       prop.name, prop.major, prop.minor);
    if (desc && desc_len)
        snprintf(desc, desc_len, "%s (%d SMs, %.0f GiB)", prop.name, prop.multiProcessorCount,
                 (double)prop.totalGlobalMem / (1u << 30));
    return G4_OK;
}

static g4_status alloc_scratch(g4_cuda *c, g4_error *err) {
    bump b = {NULL, 0, 1};
    layout_scratch(c, &b);
    c->abytes = b.used;
    CK(cudaMalloc((void **)&c->amem, c->abytes), "allocating the KV cache and scratch");
    CK(cudaMemset(c->amem, 0, c->abytes), "clearing scratch");
    b = (bump){c->amem, 0, 0};
    layout_scratch(c, &b);
    std::vector<g4c_kvlayer> kvl;
    for (size_t i = 0; i < c->kv.size(); i++)
        if (c->kv[i].kc) {
            g4c_kvlayer k = {c->kv[i].kst, c->kv[i].vst, c->kv[i].kc, c->kv[i].vc, c->kv[i].row, c->kv[i].cap};
            kvl.push_back(k);
        }
    c->n_kvl = (int)kvl.size();
    if (c->n_kvl)
        CK(cudaMemcpy(c->d_kvl, kvl.data(), sizeof(g4c_kvlayer) * kvl.size(), cudaMemcpyHostToDevice), "uploading the cache table");
    for (size_t i = 0; i < c->rope_cs.size(); i++)
        if (c->rope_src[i] == (int)i && c->m->cfg.layers[i].rope_pairs > 0)
            CK(g4c_rope_fill(c->lw[i].rope_inv, c->m->cfg.layers[i].rope_pairs, c->n_ctx, c->rope_cs[i], c->stream),
               "filling the RoPE table");
    CK(cudaStreamSynchronize(c->stream), "filling the RoPE table");
    return G4_OK;
}

/* shared-memory floats of one decode attention item (forward.cuh op_attn): a query head, the
 * chunk's scores and statistics, its K and V rows */
static int attn_item_floats(int d) { return d + G4C_KCHUNK + 4 + 2 * G4C_KCHUNK * d; }

/* a switch that is on unless the environment sets it to 0 */
static int env_on(const char *name) {
    const char *v = getenv(name);
    return !(v && atoi(v) == 0);
}

extern "C" g4_status g4_cuda_create(const g4_model *m, int n_ctx, int max_batch, g4_cuda **out, g4_error *err) {
    *out = NULL;
    g4_status st = g4_cuda_probe(NULL, 0, err);
    if (st) return st;
    if (max_batch < 1 || max_batch > G4C_MAXB)
        return g4_fail(err, G4_ERR_ARG, "CUDA backend: max_batch %d outside 1..%d", max_batch, G4C_MAXB);
    const g4_config *cf = &m->cfg;
    for (int i = 0; i < cf->n_layers; i++) {
        const g4_layer_config *l = &cf->layers[i];
        if (l->head_dim > G4C_MAXD || l->head_dim % 4 || cf->n_heads % l->n_kv_heads || cf->n_heads / l->n_kv_heads > G4C_MAXGROUP)
            return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: layer %d's heads (d %d, %d query / %d KV) are not supported",
                           i, l->head_dim, cf->n_heads, l->n_kv_heads);
    }
    for (int i = 0; i < cf->n_layers; i++)
        if (cf->layers[i].mlp_width % 4)
            return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: layer %d's MLP width %d is not a multiple of 4", i,
                           cf->layers[i].mlp_width);
    if (cf->hidden % 4 || cf->ple_width % 4 || (cf->moe && cf->moe_width % 4))
        return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: hidden, PLE and expert widths must be multiples of 4");
    if (cf->ple_width > 512 || (cf->moe && cf->top_k_experts > 64))
        return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: PLE width or top-k experts too large");
    g4_cuda *c = new (std::nothrow) g4_cuda();
    if (!c) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    c->m = m;
    c->n_ctx = n_ctx;
    c->max_batch = max_batch;
    c->pf_items = 0;
    /* each row team's items D ahead into L2 (G4_CUDA_PF_SELF=D; pipelined tiles: D items, dot2's: the
     * next one; 0, the default: none) */
    {
        const char *ps = getenv("G4_CUDA_PF_SELF");
        c->pf_self = ps && atoi(ps) > 0 && atoi(ps) <= 16 ? atoi(ps) : 0;
    }
    c->split_chunks = 0; /* split_of's defaults */
    c->evict_first = 1;
    c->op_local = 1;
    {
        /* weight types whose matmuls run on the tensor cores (bit 1 << G4C_<type>; only bf16, 4, so
         * far), fixed at creation: the upload's layout follows it. Off by default: at M = 1 the
         * CUDA-core procedure is faster today (E2B bf16 262 vs 185 tok/s); verify blocks and prefill
         * gain. Another reduction procedure: compare logits only within one setting. */
        const char *e = getenv("G4_CUDA_MMA");
        c->mma_bf16 = e && ((atoi(e) >> G4C_BF16) & 1);
        /* per-channel 4-bit rows on the integer tensor cores (forward.cuh mm_tile_iq): off by
         * default (decode at M = 1 is slower than dot2 today; see there), G4_CUDA_IMMA=1 turns it
         * on. Another reduction procedure: compare logits only within one setting. */
        const char *ie = getenv("G4_CUDA_IMMA");
        c->imma = ie && atoi(ie) != 0;
        /* fast prefill: matmul stages as launches of the prefill GEMM (pgemm.cu), unless
         * G4_CUDA_PGEMM=0 (the persistent kernel's own fp_gemm; another reduction order) */
        c->pg_on = env_on("G4_CUDA_PGEMM");
        /* and its parts, each on unless set to 0 (for measuring one against its absence): wgmma
         * GEMMs, input terms a warp per token, programmatic dependent launch, input phases as
         * launches of their own, terms written by the launch before; the attention's kernel */
        c->pg_wg = env_on("G4_CUDA_WGMMA");
        c->fp_warp = env_on("G4_CUDA_FPWARP");
        c->pg_pdl = env_on("G4_CUDA_PDL");
        c->pg_prep = env_on("G4_CUDA_PGPREP");
        c->pg_chain = env_on("G4_CUDA_PGCHAIN");
        const char *se = getenv("G4_CUDA_STAGED"), *sp = getenv("G4_CUDA_STAGE_PF");
        c->staged = se && *se && atoi(se) >= 0 && atoi(se) <= 4 ? atoi(se) : 4;
        c->stage_pf = sp ? atoi(sp) : 0;
        const char *rq = getenv("G4_CUDA_RING_Q");
        c->ring_q = rq && atoi(rq) == 1;
        c->attn_early = env_on("G4_CUDA_ATTN_EARLY");
        /* attention stages on the half-SM kernel in clusters of 8 (G4_CUDA_ATTN_CL=16: of 16; 0: off).
         * Measured on an H100 (same upload, off -> 8 -> off -> 8, ctx 128): E2B qat-int4 410.6 -> 418.2
         * -> 410.4 -> 417.9 tok/s, E2B bf16 367.5 -> 373.4, E4B bf16 206.1 -> 207.7; 16 was slower
         * (406.2 against 408.1), the blocks' start waiting for whole clusters (README) */
        const char *ac = getenv("G4_CUDA_ATTN_CL");
        c->attn_cl = !ac ? 8 : atoi(ac) == 8 || atoi(ac) == 16 ? atoi(ac) : 0;
        const char *af = getenv("G4_CUDA_ATTN_CLF");
        c->attn_cl_full = af && atoi(af) == 1;
        /* verify blocks' attention without clusters by default: with them k = 3 was ~2% slower (H100,
         * E2B qat-int4 2.52x -> 2.63x a step); G4_CUDA_ATTN_CLV=1 clusters them too */
        const char *av = getenv("G4_CUDA_ATTN_CLV");
        c->attn_cl_verify = av && atoi(av) == 1;
        c->ring_long = env_on("G4_CUDA_RING_LONG");
        const char *rs = getenv("G4_CUDA_RING_SLOTS");
        c->ring_slots = rs && atoi(rs) >= 4 && atoi(rs) <= G4C_RING_R_D ? atoi(rs) : 0;
        c->ring_v = env_on("G4_CUDA_RING_V");
        c->team_spread = env_on("G4_CUDA_TEAM_SPREAD");
        /* one-token quantised tiles with their loads a group ahead (forward.cuh mm_tile_pipe), in
         * the staged decode with the first group issued before the wait for the stage before
         * (mm_stage_early): G4_CUDA_PIPE=2, the default. Measured on an H100 (same upload, default
         * of session 30 -> 2): E2B qat-int4 340.3 -> 415.2 tok/s, qat-int8 261.0 -> 346.5, mlx-4
         * 234.4 -> 275.9, mixed 2/4/8-bit 322.1 -> 367.8; E4B qat-int4 248.2 -> 283.9 (1, pipelined
         * without the early group: 220.5); verify blocks of 2..4 tokens likewise (E2B qat-int4
         * k = 3: 7.17 -> 6.03 ms, E4B 10.31 -> 8.54). 1: pipelined only; 0: off (dot2) */
        const char *pe = getenv("G4_CUDA_PIPE");
        const int pv = pe && *pe ? atoi(pe) : 2;
        c->mm_pipe = pv == 1 || pv == 2 ? pv : 0;
        const char *pa = getenv("G4_CUDA_PATTN");
        c->pa_kb = pa && (atoi(pa) == 0 || atoi(pa) == 32 || atoi(pa) == 64) ? atoi(pa) : 1;
    }
    {
        cudaError_t e = g4c_kernel_shape(0, &c->grid, &c->smem, &c->smem_in);
        if (e) {
            st = g4_cuda_fail(err, e, "sizing the persistent kernel");
            goto fail;
        }
        if ((e = g4c_pgemm_init()) || (e = g4c_pgemm_wg_init()) || (e = g4c_pattn_init()) || (e = g4c_pprep_init())) {
            st = g4_cuda_fail(err, e, "sizing the prefill kernels");
            goto fail;
        }
    }
    {
        /* every stage's input row must fit the shared-memory tile */
        int need = G4C_TILE_LD(cf->hidden);
        for (int i = 0; i < cf->n_layers; i++) {
            int nq = G4C_TILE_LD(cf->n_heads * cf->layers[i].head_dim), I = G4C_TILE_LD(cf->layers[i].mlp_width);
            need = nq > need ? nq : need;
            need = I > need ? I : need;
        }
        if (cf->moe && cf->top_k_experts * G4C_TILE_LD(cf->moe_width) > need) need = cf->top_k_experts * G4C_TILE_LD(cf->moe_width);
        for (int i = 0; i < cf->n_layers; i++) { /* attention: a query head, its scores, a key chunk's K and V rows */
            const int d = cf->layers[i].head_dim, a = attn_item_floats(d);
            const int aw = (2 * G4C_KCHUNK + G4C_WARPS) * d; /* the wide kernels': a chunk's rows and a query per warp */
            need = a > need ? a : need;
            need = aw > need ? aw : need;
        }
        if (cf->hidden > G4C_THREADS * G4C_IN_NPT) {
            st = g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: hidden size %d exceeds %d", cf->hidden, G4C_THREADS * G4C_IN_NPT);
            goto fail;
        }
        need += G4C_MMA_SCRATCH; /* tensor-core stages keep argmax scratch after the tile */
        /* the prefill procedure's staging buffers: 16 tiles' weights and the activation terms per chunk */
        const int fp = (G4C_FP_NBUF * (16 * 16 * G4C_FP_LDS * 2 + G4C_FP_TERMS * G4C_FP_TB * G4C_FP_LDS * 2) + 512) / 4; /* + the tile table */
        need = fp > need ? fp : need;
        c->smem_need = need;
        if (need > c->smem_in) {
            st = g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: an input row of %d floats exceeds shared memory (%d)", need,
                         c->smem_in);
            goto fail;
        }
    }
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) {
        st = g4_cuda_fail(err, cudaGetLastError(), "creating a stream");
        goto fail;
    }
    if (cudaEventCreate(&c->ev0) || cudaEventCreate(&c->ev1)) {
        st = g4_cuda_fail(err, cudaGetLastError(), "creating events");
        goto fail;
    }
    if (cudaMallocHost((void **)&c->h_ctl, sizeof(g4c_ctl))) {
        st = g4_cuda_fail(err, cudaGetLastError(), "allocating pinned memory");
        goto fail;
    }
    memset(c->h_ctl, 0, sizeof(g4c_ctl));
    {
        bump b = {NULL, 0, 1};
        if ((st = upload_model(c, &b, err))) goto fail;
        c->wbytes = b.used;
        if (cudaMalloc((void **)&c->wmem, c->wbytes)) {
            st = g4_cuda_fail(err, cudaGetLastError(), "allocating device memory for the weights");
            goto fail;
        }
        b = (bump){c->wmem, 0, 0};
        if ((st = upload_model(c, &b, err))) goto fail;
    }
    if ((st = alloc_scratch(c, err))) goto fail;
    build_target(c);
    finish_ops(c, c->ops);
    for (const g4c_op &o : c->ops) /* a tiled matrix is readable by mm_tile_mma and mat_at only */
        for (int i = 0; o.kind == G4C_OP_MATMUL && !o.mma_ks && i < o.nparts; i++)
            if (o.part[i].w.flags & G4C_QF_TILED) {
                st = g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: a matmul stage mixes tiled and row-major matrices");
                goto fail;
            }
    if ((st = push_ops(c, c->ops, &c->d_ops, err))) goto fail;
    if ((st = pg_build(c, err))) goto fail;
    *out = c;
    return G4_OK;
fail:
    g4_cuda_free(c);
    return st;
}

static void drafter_release(g4_cuda *c) {
    cudaFree(c->dwmem);
    cudaFree(c->damem);
    cudaFree(c->d_dops);
    c->dwmem = c->damem = NULL;
    c->d_dops = NULL;
    c->dr = NULL;
    c->dops.clear();
    c->dlw.clear();
}

/* the staged decode's cached graphs, dropped once the stream is idle (they hold launches made
 * for the settings they were built with) */
static void staged_drop(g4_cuda *c) {
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (auto &g : c->sg) {
        if (g.ge) cudaGraphExecDestroy(g.ge);
        g.ge = NULL;
    }
}

extern "C" void g4_cuda_free(g4_cuda *c) {
    if (!c) return;
    staged_drop(c);
    drafter_release(c);
    cudaFree(c->wmem);
    cudaFree(c->amem);
    cudaFree(c->d_ops);
    cudaFree(c->d_pops);
    cudaFree(c->pg_part);
    cudaFree(c->pg_up);
    cudaFree(c->pa_scratch);
    cudaFree(c->dbg);
    if (c->h_ctl) cudaFreeHost(c->h_ctl);
    if (c->ev0) cudaEventDestroy(c->ev0);
    if (c->ev1) cudaEventDestroy(c->ev1);
    if (c->stream) cudaStreamDestroy(c->stream);
    cudaGetLastError();
    delete c;
}

/* ---- forward, commit, reads ---------------------------------------------------------------------- */

static g4c_params base_params(const g4_cuda *c) {
    g4c_params p;
    memset(&p, 0, sizeof p);
    p.kmask = c->kmask;
    p.ops = c->d_ops;
    p.n_ops = (int)c->ops.size();
    p.n_steps = 1;
    p.ctl = c->ctl;
    p.amax_part = c->amax_part;
    p.amax_idx = c->amax_idx;
    p.amin_part = c->amin_part;
    p.smem_in_floats = c->smem_in;
    p.pf_items = c->pf_items;
    p.pf_self = c->pf_self;
    p.imma = c->imma;
    p.eps = c->m->cfg.rms_eps;
    p.skip = c->skip;
    p.rep = c->rep;
    p.evict_first = c->evict_first;
    p.op_local = c->op_local;
    p.mma_part = c->mma_part;
    p.mma_cnt = c->mma_cnt;
    p.mma_tokens = c->max_batch;
    p.fp_ld = c->fp_ld;
    p.fp_tokens = c->max_batch;
    p.fp_x = c->fp_x;
    p.fp_sx = c->fp_sx;
    p.fp_warp = c->fp_warp;
    p.fp_part = c->fp_part;
    p.fp_cnt = c->fp_cnt;
    p.qn = c->qn;
    p.mm_pipe = c->mm_pipe;
    p.team_spread = 0; /* staged_graph: per stage */
    return p;
}

static g4_status set_tokens(g4_cuda *c, int pos, const int32_t *tokens, int M, g4_error *err) {
    c->h_ctl->pos = pos;
    memcpy(c->h_ctl->tokens, tokens, sizeof(int32_t) * (size_t)M);
    CK(cudaMemcpyAsync(c->ctl, c->h_ctl, offsetof(g4c_ctl, tokens) + sizeof(int) * (size_t)M, cudaMemcpyHostToDevice,
                       c->stream),
       "copying tokens");
    return G4_OK;
}

/* The staged decode: a program's stages as one CUDA graph of launches (forward.cuh
 * g4c_stage_kernel), each chained to the one before by programmatic dependent launch. One-token
 * matmul stages in modes 1, 3 and 4 get a kernel held to half an SM (128 registers, half the shared
 * memory): mode 1 launches two blocks per SM, modes 3 and 4 one, so that the next stage's blocks can
 * be resident beside a running stage and start during it (mode 3: L2 requests, G4_CUDA_STAGE_PF;
 * mode 4: the first copies into its weight rings, whose room comes out of the input tile's). A
 * matmul stage whose input tile does not fit that half, and every other stage, gets the persistent
 * kernel's shared memory. The params p are baked into the graph. */
static g4_status staged_graph(g4_cuda *c, const g4c_params &p0, cudaGraphExec_t *exec, g4_error *err, int *grids = NULL,
                              int *kerns = NULL) {
    const int inst = g4c_stage_inst(c->kmask, p0.M);
    if (inst < 0) return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA staged decode: no kernel for this block's weight types and size");
    int dev = 0, sms = 0, per_sm_smem = 0;
    CK(cudaGetDevice(&dev), "querying the device");
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "querying the device");
    CK(cudaDeviceGetAttribute(&per_sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev), "querying the device");
    const bool half = p0.M == 1 && c->staged != 2, ring = p0.M == 1 && c->staged == 4;
    const int mmk = ring ? 3 : half ? 1 : 2;
    const size_t ring_bytes = ring ? (size_t)G4C_WARPS * G4C_RING_WARP : 0;
    const size_t half_smem = ((size_t)per_sm_smem / 2 - 1024) & ~(size_t)1023; /* a kernel held to half an SM */
    size_t mm_smem = half ? half_smem : c->smem;
    if (!ring && mm_smem > c->smem) mm_smem = c->smem;
    const int mm_in = (int)((mm_smem - G4C_TAIL - ring_bytes) / sizeof(float)) & ~3;
    const int full_in = (int)((c->smem - G4C_TAIL) / sizeof(float)) & ~3;
    int nb_mm = 0, nb_other = 0, nb_full = 1;
    CK(g4c_stage_blocks(inst, mmk, mm_smem, &nb_mm), "sizing the staged decode");
    CK(g4c_stage_blocks(inst, 0, c->smem, &nb_other), "sizing the staged decode");
    if (ring) CK(g4c_stage_blocks(inst, 2, c->smem, &nb_full), "sizing the staged decode");
    /* verify blocks of 2..4 tokens in mode 4: their bf16 matmul stages through rings too, a whole SM
     * each (255 registers: at the one-token kernel's 128 the four tokens' accumulators spilled, ptxas
     * -v 6,952 bytes of spill loads, and k = 3 cost 2.63x a step against 2.24x without rings; E4B bf16,
     * H100), with as many slots (4, 6 or 8) as the rows' input tile (load_rows' room) leaves */
    const bool vring = p0.M > 1 && p0.M <= 4 && c->staged == 4 && c->ring_v;
    int nb_vring = 0;
    if (vring) CK(g4c_stage_blocks(inst, 3, c->smem, &nb_vring), "sizing the staged decode");
    if (vring && nb_vring < 1) return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA staged decode: the verify ring kernel does not fit an SM");
    if (nb_mm < 1 || nb_other < 1 || nb_full < 1 || nb_mm > 2)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA staged decode: kernels do not fit an SM");
    /* attention stages on the half-SM kernel (kernel 4): shared memory for op_attn's item (the query,
     * the chunk's scores and statistics, its K and V rows) and the tail; the widest head that fits */
    int attn_d = 0, nb_attn = 0;
    if (c->attn_early)
        for (int d = G4C_MAXD; d >= 4 && !attn_d; d -= 4)
            if (4 * (size_t)attn_item_floats(d) + G4C_TAIL <= half_smem) attn_d = d;
    const int attn_in = (attn_item_floats(attn_d) + 3) & ~3;
    const size_t attn_smem = ((size_t)attn_in * sizeof(float) + G4C_TAIL + 1023) & ~(size_t)1023;
    if (attn_d) CK(g4c_stage_blocks(inst, 4, attn_smem, &nb_attn), "sizing the staged decode");
    if (nb_attn > 2) nb_attn = 2;
    /* attention stages in clusters (c->attn_cl; kernel 4, and kernel 0 with c->attn_cl_full): the grid a
     * whole number of them, as many as are resident at once; 0 where the device takes none */
    auto cl_grid = [&](int kern, size_t smem, int blocks) {
        int ncl = 0;
        const int want = blocks / c->attn_cl;
        const bool ok = g4c_stage_clusters(inst, kern, smem, c->attn_cl, &ncl) == cudaSuccess && ncl > 0 && want > 0;
        (void)cudaGetLastError(); /* a size the device does not take: no clusters */
        return ok ? (ncl < want ? ncl : want) * c->attn_cl : 0;
    };
    const bool acl = c->attn_cl > 1 && (p0.M == 1 || c->attn_cl_verify);
    const int attn_grid = nb_attn > 0 && acl ? cl_grid(4, attn_smem, sms * (p0.M == 1 ? 1 : nb_attn)) : 0;
    const int attn_grid0 = acl && c->attn_cl_full ? cl_grid(0, c->smem, sms * nb_other) : 0;
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "capturing the staged decode");
    cudaError_t e = cudaSuccess;
    for (int s = 0; s < p0.n_ops && !e; s++) {
        const g4c_op &o = c->ops[(size_t)s];
        g4c_params p = p0;
        const bool mmo = o.kind == G4C_OP_MATMUL, q = mmo && (o.part[0].w.type == G4C_Q4 || o.part[0].w.type == G4C_Q8);
        /* mode 4: a matmul stage the rings do not take - quantised rows unless G4_CUDA_RING_Q=1
         * (measured slower, README), or an input tile too wide for rings of 4 slots beside it in their
         * half SM (31B's 21,504-wide down projection) - runs as in mode 2 */
        const int K = mmo ? o.part[0].w.cols : 0;
        const bool ringable = ring && mmo && !(q && !c->ring_q);
        bool mm = mmo && !(ring && q && !c->ring_q) && G4C_TILE_LD(K) <= mm_in;
        /* an input tile too wide for full rings beside it (E4B's 10,240-wide down projection, E2B's
         * 12,288): rings of fewer slots (at least 4) after a tile of its own size */
        int in_f = mm_in, slots = 0;
        if (ringable && ((!mm && c->ring_long) || c->ring_slots)) {
            const int f = (G4C_TILE_LD(K) + 3) & ~3;
            const size_t slot = q ? G4C_RING_SLOT_Q : G4C_RING_SLOT_D, rmax = q ? G4C_RING_R_Q : G4C_RING_R_D;
            const size_t used = (size_t)f * sizeof(float) + G4C_TAIL;
            const size_t r = used < mm_smem ? (mm_smem - used) / ((size_t)G4C_WARPS * slot) : 0;
            if (r >= 4) {
                mm = true;
                in_f = f;
                slots = (int)(r < rmax ? r : rmax);
                if (c->ring_slots && slots > c->ring_slots) slots = c->ring_slots;
            }
        }
        size_t v_smem = 0; /* > 0: a verify ring stage, its kernel's shared memory */
        if (vring && mmo && o.part[0].w.type == G4C_BF16) {
            const int mt = p0.M - (o.lm ? p0.lm_from : 0);
            const size_t f = (g4c_rows_floats(o.in.kind == G4C_IN_NORM, K, mt) + 3) & ~(size_t)3; /* load_rows' room */
            const size_t used = f * sizeof(float) + G4C_TAIL, per_slot = (size_t)G4C_WARPS * G4C_RING_SLOT_D;
            const size_t r = used < (size_t)c->smem ? ((size_t)c->smem - used) / per_slot : 0;
            if (r >= 4) {
                v_smem = (size_t)c->smem;
                in_f = (int)f;
                slots = r >= G4C_RING_R_D ? G4C_RING_R_D : r >= 6 ? 6 : 4; /* mm_ring_slots' counts at four tokens */
            }
        }
        const bool full = mmo && ring && !mm && G4C_TILE_LD(K) <= full_in;
        /* attention: the earlier K/V rows before the wait (every staged mode), on the half-SM kernel
         * where its items fit (heads up to attn_d wide: E2B's and E4B's 256-wide sliding layers) */
        const bool at = o.kind == G4C_OP_ATTN && c->attn_early, ah = at && nb_attn > 0 && o.d <= attn_d;
        p.attn_pre = at ? 1 : 0;
        p.smem_in_floats = mm || v_smem ? in_f : full ? full_in : ah ? attn_in : c->smem_in;
        p.ring_slots = slots;
        p.stage_pf = c->stage_pf;
        /* one-token attention: one block per SM, so that every block starts beside the stage before
         * and the next stage's ring blocks can start beside it; verify blocks' more items: two */
        const int per_sm = v_smem ? 1 : mm ? (c->staged >= 3 ? 1 : nb_mm) : full ? nb_full : ah ? (p0.M == 1 ? 1 : nb_attn) : nb_other;
        const int kern = v_smem ? 3 : mm ? mmk : full ? 2 : ah ? 4 : 0;
        /* row teams warp-major on the one-token ring stages (half an SM: the next stage's blocks start
         * beside them either way), block-major elsewhere: on whole-SM stages a block left without
         * items ends at once and gives the next stage's block its SM early. H100, same upload:
         * everywhere, E4B bf16 220.6 -> 224.3 tok/s, E2B bf16 393.8 -> 397.5, E2B qat-int4 416.7 -> 387.8 */
        p.team_spread = c->team_spread && kern == 3 && p0.M == 1;
        const int cgrid = ah ? attn_grid : at && kern == 0 ? attn_grid0 : 0;
        p.attn_cl = cgrid ? c->attn_cl : 0;
        const int grid = cgrid ? cgrid : sms * per_sm;
        if (grids) grids[s] = grid;
        if (kerns) kerns[s] = kern;
        e = g4c_stage_launch(inst, kern, &p, s, grid, v_smem ? v_smem : mm ? mm_smem : ah ? attn_smem : c->smem, s > 0, c->stream);
    }
    cudaError_t e2 = cudaStreamEndCapture(c->stream, &g);
    if (!e) e = e2;
    if (!e) e = cudaGraphInstantiate(exec, g, 0);
    if (g) cudaGraphDestroy(g);
    CK(e, "building the staged decode's graph");
    return G4_OK;
}

/* a one-token launch of the staged decode from the graph cache (built on first use of these params
 * with this stage list) */
static g4_status staged_get(g4_cuda *c, const g4c_params &p, cudaGraphExec_t *ge, g4_error *err) {
    g4_cuda::staged_slot *hit = NULL;
    for (auto &g : c->sg)
        if (g.ge && g.gen == c->ops_gen && !memcmp(&g.p, &p, sizeof p)) hit = &g;
    if (!hit) {
        hit = NULL;
        for (auto &g : c->sg) /* a free slot, else one of another stage list, else the next in turn */
            if (!g.ge || g.gen != c->ops_gen) {
                hit = &g;
                break;
            }
        if (!hit) hit = &c->sg[c->sg_next++ % (sizeof c->sg / sizeof c->sg[0])];
        if (hit->ge) cudaGraphExecDestroy(hit->ge);
        hit->ge = NULL;
        g4_status st = staged_graph(c, p, &hit->ge, err);
        if (st) return st;
        memcpy(&hit->p, &p, sizeof p); /* bytes, padding included, as the lookup compares them */
        hit->gen = c->ops_gen;
    }
    *ge = hit->ge;
    return G4_OK;
}

static g4_status staged_launch(g4_cuda *c, const g4c_params &p, g4_error *err) {
    cudaGraphExec_t ge = NULL;
    g4_status st = staged_get(c, p, &ge, err);
    if (st) return st;
    CK(cudaGraphLaunch(ge, c->stream), "launching a staged decode step");
    return G4_OK;
}

/* Whether a block of M tokens runs staged: on (c->staged), a staged kernel for the stages' weight
 * types and M, and neither the prefill procedure nor a trace (the persistent kernel's). */
static bool use_staged(const g4_cuda *c, const g4c_params &p) {
    return c->staged && !p.fast && !p.trace && p.n_steps == 1 && g4c_stage_inst(c->kmask, p.M) >= 0;
}

/* the forward's launch, queued on the session's stream */
static g4_status launch_forward(g4_cuda *c, int pos, const int32_t *tokens, int M, int lm_from, int want_logits, int direct,
                                g4_error *err, int fast = 0) {
    if (M < 1 || M > c->max_batch || lm_from < 0 || lm_from >= M || (direct && M != 1) || pos < 0 || pos + M > c->n_ctx)
        return g4_fail(err, G4_ERR_ARG, "CUDA forward: bad block (pos %d, M %d, lm_from %d)", pos, M, lm_from);
    g4_status st = set_tokens(c, pos, tokens, M, err);
    if (st) return st;
    g4c_params p = base_params(c);
    p.M = M;
    p.lm_from = lm_from;
    p.want_logits = want_logits;
    p.direct = direct;
    p.fast = fast;
    if (use_staged(c, p)) return staged_launch(c, p, err);
    CK(g4c_launch(&p, c->grid, c->smem, c->stream), "launching the forward");
    return G4_OK;
}

/* after a forward's launches: the logits of rows [lm_from, M) to the host when asked, then wait */
static g4_status copy_logits_sync(g4_cuda *c, int M, int lm_from, int want_logits, float *logits, const char *what,
                                  g4_error *err) {
    const size_t V = (size_t)c->m->cfg.vocab;
    if (logits && want_logits)
        CK(cudaMemcpyAsync(logits, c->logits + (size_t)lm_from * V, sizeof(float) * (size_t)(M - lm_from) * V,
                           cudaMemcpyDeviceToHost, c->stream),
           "copying logits");
    CK(cudaStreamSynchronize(c->stream), what);
    return G4_OK;
}

static g4_status forward_copy(g4_cuda *c, int pos, const int32_t *tokens, int M, int lm_from, int want_logits, float *logits,
                              int direct, int fast, g4_error *err) {
    g4_status st = launch_forward(c, pos, tokens, M, lm_from, want_logits, direct, err, fast);
    return st ? st : copy_logits_sync(c, M, lm_from, want_logits, logits, "running the forward", err);
}

extern "C" g4_status g4_cuda_forward(g4_cuda *c, int pos, const int32_t *tokens, int M, int lm_from, int want_logits,
                                     float *logits, int direct, g4_error *err) {
    return forward_copy(c, pos, tokens, M, lm_from, want_logits, logits, direct, 0, err);
}

/* one matrix of a prefill GEMM stage (bf16 or per-channel 4-bit rows, pg_mat_ok): on the wgmma
 * kernel, or with G4_CUDA_WGMMA=0 on the mma.sync one; input terms at x */
static cudaError_t pg_gemm(g4_cuda *c, const unsigned short *x, size_t ts, int M, const g4c_mat *w, const g4c_pg_epi *e) {
    if (c->pg_wg) return g4c_pgemm_wg_launch(x, ts, c->fp_ld, M, w, e, c->pg_part, c->stream);
    return g4c_pgemm_launch(x, ts, c->fp_ld, M, w, e, c->pg_part, c->stream);
}

/* a fast prefill as pg_build planned it, queued on the session's stream */
static g4_status launch_prefill_pg(g4_cuda *c, int pos, const int32_t *tokens, int M, int lm_from, int want_logits,
                                   g4_error *err, cudaEvent_t *ev = NULL) {
    if (M < 1 || M > c->max_batch || lm_from < 0 || lm_from >= M || pos < 0 || pos + M > c->n_ctx)
        return g4_fail(err, G4_ERR_ARG, "CUDA prefill: bad block (pos %d, M %d, lm_from %d)", pos, M, lm_from);
    g4_status st = set_tokens(c, pos, tokens, M, err);
    if (st) return st;
    const size_t ts = (size_t)c->max_batch * c->fp_ld;
    int k = 0; /* events recorded */
    for (size_t j = 0; j < c->pg_plan.size(); j++) {
        const pg_entry &en = c->pg_plan[j];
        if (ev) CK(cudaEventRecord(ev[k++], c->stream), "timing the prefill");
        if (en.stage < 0) {
            g4c_params p = base_params(c);
            p.ops = c->d_pops + en.first;
            p.n_ops = en.count;
            p.M = M;
            p.lm_from = lm_from;
            p.want_logits = want_logits;
            p.fast = 1;
            CK(g4c_launch(&p, c->grid, c->smem, c->stream), "launching the prefill");
            continue;
        }
        const int i = en.stage;
        const g4c_op &o = c->ops[(size_t)i];
        if (en.prep) {
            g4c_params p = base_params(c);
            p.M = M;
            p.fast = 1;
            CK(o.kind == G4C_OP_ATTN ? g4c_pprep_attn_launch(c->d_ops + i, &o, &p, pos, c->stream, c->pg_pdl)
                                     : g4c_pprep_launch(c->d_ops + i, &o, &p, c->stream, c->pg_pdl),
               "launching a prefill input phase");
            if (ev) CK(cudaEventRecord(ev[k++], c->stream), "timing the prefill");
        }
        unsigned short *const bufs[2] = {c->fp_x, c->fp_x2};
        const unsigned short *xin = bufs[en.inb];
        unsigned short *xt = en.outb >= 0 ? bufs[en.outb] : NULL;
        if (o.kind == G4C_OP_ATTN) {
            CK(g4c_pattn_launch(&o, o.heads ? c->qn : o.q, pos, M, c->stream, c->pa_kb, xt, ts, c->fp_ld, c->pg_pdl,
                                c->pa_scratch, c->pa_scratch_n),
               "launching the prefill attention");
            continue;
        }
        g4c_pg_epi e;
        memset(&e, 0, sizeof e);
        e.pdl = c->pg_pdl;
        if (o.epi == G4C_EPI_GELU_PAIR) { /* up into the pair buffer, then gate: gelu(gate) · up */
            e.kind = G4C_PG_STORE;
            e.y = c->pg_up;
            e.ldy = o.part[1].w.rows;
            CK(pg_gemm(c, xin, ts, M, &o.part[1].w, &e), "launching the prefill GEMM");
            e.kind = G4C_PG_GELU_PAIR;
            e.aux = c->pg_up;
            e.ld_aux = o.part[1].w.rows;
            e.y = o.part[0].y;
            e.ldy = o.part[0].ldy;
            e.y2 = o.part[0].y2;
            e.xt = xt;
            e.xts = ts;
            e.xld = c->fp_ld;
            CK(pg_gemm(c, xin, ts, M, &o.part[0].w, &e), "launching the prefill GEMM");
            continue;
        }
        for (int pi = 0; pi < o.nparts; pi++) {
            e.kind = o.epi == G4C_EPI_PLE_GATE ? G4C_PG_PLE_GATE : G4C_PG_STORE;
            e.y = o.part[pi].y;
            e.ldy = o.part[pi].ldy;
            e.y2 = o.part[pi].y2;
            e.aux = o.ple;
            e.ld_aux = o.ple_ld;
            if (o.nparts == 1) {
                e.xt = xt;
                e.xts = ts;
                e.xld = c->fp_ld;
            }
            CK(pg_gemm(c, xin, ts, M, &o.part[pi].w, &e), "launching the prefill GEMM");
        }
    }
    if (ev) CK(cudaEventRecord(ev[k], c->stream), "timing the prefill");
    return G4_OK;
}

extern "C" g4_status g4_cuda_prefill_profile(g4_cuda *c, int pos, const int32_t *tokens, int M, double ms[3], int n_launch[3],
                                             g4_error *err) {
    for (int k = 0; k < 3; k++) {
        ms[k] = 0;
        n_launch[k] = 0;
    }
    if (c->pg_plan.empty()) return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA prefill profile: this session's prefill is one launch");
    std::vector<int> cls; /* per timed launch: 0 the persistent kernel or an input phase, 1 GEMM, 2 attention */
    for (const pg_entry &en : c->pg_plan) {
        if (en.stage >= 0 && en.prep) cls.push_back(0);
        cls.push_back(en.stage < 0 ? 0 : c->ops[(size_t)en.stage].kind == G4C_OP_ATTN ? 2 : 1);
    }
    const size_t n = cls.size() + 1;
    std::vector<cudaEvent_t> ev(n, NULL);
    g4_status st = G4_OK;
    for (size_t i = 0; i < n && !st; i++)
        if (cudaEventCreate(&ev[i])) st = g4_cuda_fail(err, cudaGetLastError(), "creating events");
    for (int r = 0; r < 2 && !st; r++) /* warm, then timed */
        if (!(st = launch_prefill_pg(c, pos, tokens, M, M - 1, 1, err, ev.data())) && cudaStreamSynchronize(c->stream))
            st = g4_cuda_fail(err, cudaGetLastError(), "running the prefill");
    for (size_t j = 0; j + 1 < n && !st; j++) {
        float t = 0;
        cudaEventElapsedTime(&t, ev[j], ev[j + 1]);
        const int k = cls[j];
        ms[k] += t;
        n_launch[k]++;
    }
    for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
    return st;
}

extern "C" g4_status g4_cuda_prefill(g4_cuda *c, int pos, const int32_t *tokens, int M, int lm_from, int want_logits,
                                     float *logits, g4_error *err) {
    if (c->pg_plan.empty()) return forward_copy(c, pos, tokens, M, lm_from, want_logits, logits, 0, 1, err);
    g4_status st = launch_prefill_pg(c, pos, tokens, M, lm_from, want_logits, err);
    return st ? st : copy_logits_sync(c, M, lm_from, want_logits, logits, "running the prefill", err);
}

extern "C" g4_status g4_cuda_commit(g4_cuda *c, int stage_pos, int n, g4_error *err) {
    CK(g4c_commit(c->d_kvl, c->n_kvl, c->max_row, stage_pos, n, c->stream), "committing the cache");
    return G4_OK;
}

extern "C" g4_status g4_cuda_forward_ids(g4_cuda *c, int pos, const int32_t *tokens, int M, int direct, int32_t *ids,
                                         g4_error *err) {
    g4_status st = launch_forward(c, pos, tokens, M, 0, 1, direct, err);
    if (st) return st;
    CK(cudaMemcpyAsync(c->h_ctl->next, c->ctl->next, sizeof(int) * (size_t)M, cudaMemcpyDeviceToHost, c->stream),
       "copying token ids");
    CK(cudaStreamSynchronize(c->stream), "running the forward");
    memcpy(ids, c->h_ctl->next, sizeof(int32_t) * (size_t)M);
    return G4_OK;
}

extern "C" g4_status g4_cuda_set_debug(g4_cuda *c, int on, g4_error *err) {
    if (!!on == (c->dbg != NULL)) return G4_OK;
    CK(cudaStreamSynchronize(c->stream), "synchronising");
    cudaFree(c->dbg);
    c->dbg = NULL;
    if (on) {
        const g4_config *cf = &c->m->cfg;
        size_t n = (size_t)cf->n_layers * c->max_batch * cf->hidden;
        CK(cudaMalloc((void **)&c->dbg, sizeof(float) * n), "allocating the dump buffer");
        CK(cudaMemset(c->dbg, 0, sizeof(float) * n), "clearing the dump buffer");
    }
    build_target(c);
    finish_ops(c, c->ops);
    g4_status st = push_ops(c, c->ops, &c->d_ops, err);
    return st ? st : pg_build(c, err);
}

extern "C" g4_status g4_cuda_read(g4_cuda *c, const char *name, int layer, int m0, int n, float *out, int *row_len,
                                  g4_error *err) {
    const g4_config *cf = &c->m->cfg;
    const float *src = NULL;
    int len = cf->hidden;
    if (!strcmp(name, "embed")) src = c->x0;
    else if (!strcmp(name, "final_norm")) src = c->hfinal;
    else if (!strcmp(name, "ple") && c->ple) {
        src = c->ple;
        len = cf->n_layers * cf->ple_width;
    } else if (!strcmp(name, "logits")) {
        src = c->logits;
        len = cf->vocab;
    } else if (!strcmp(name, "layer_out") && c->dbg && layer >= 0 && layer < cf->n_layers)
        src = c->dbg + (size_t)layer * c->max_batch * cf->hidden;
    if (!src) return g4_fail(err, G4_ERR_ARG, "CUDA backend: no intermediate '%s' for layer %d", name, layer);
    if (row_len) *row_len = len;
    if (out) {
        CK(cudaMemcpyAsync(out, src + (size_t)m0 * len, sizeof(float) * (size_t)n * len, cudaMemcpyDeviceToHost, c->stream),
           "reading an intermediate");
        CK(cudaStreamSynchronize(c->stream), "reading an intermediate");
    }
    return G4_OK;
}

/* ---- the drafter --------------------------------------------------------------------------------- */

static g4_status upload_drafter(g4_cuda *c, const g4_drafter *d, bump *b, g4_error *err) {
    const g4_config *dc = &d->cfg.text;
    int h = dc->hidden, L = dc->n_layers;
    g4_status st;
    char what[96];
    if ((st = up_mat(b, &d->pre_proj, "drafter pre_projection", &c->d_pre, err)) ||
        (st = up_mat(b, &d->post_proj, "drafter post_projection", &c->d_post, err)) ||
        (st = up_mat(b, &d->embed, "drafter embed_tokens", &c->d_emb, err)) ||
        (st = up_vec(b, d->final_norm, h, &c->d_final_norm, err)))
        return st;
    if (d->cfg.ordered_embeddings && (st = up_mat(b, &d->centroids, "drafter centroids", &c->d_cent_w, err))) return st;
    c->dlw.assign((size_t)L, dev_dlayer());
    for (int i = 0; i < L; i++) {
        const g4_drafter_layer *w = &d->layers[i];
        dev_dlayer *o = &c->dlw[(size_t)i];
#define MAT(f, name) (snprintf(what, sizeof what, "drafter layers.%d.%s", i, name), up_mat(b, &w->f, what, &o->f, err))
        if ((st = MAT(wq, "q_proj")) || (st = MAT(wo, "o_proj")) || (st = MAT(gate, "gate_proj")) || (st = MAT(up, "up_proj")) ||
            (st = MAT(down, "down_proj")))
            return st;
#undef MAT
        if ((st = up_vec(b, w->attn_norm, h, &o->attn_norm, err)) || (st = up_vec(b, w->post_attn_norm, h, &o->post_attn, err)) ||
            (st = up_vec(b, w->pre_ffn_norm, h, &o->pre_ffn, err)) || (st = up_vec(b, w->post_ffn_norm, h, &o->post_ffn, err)) ||
            (st = up_vec(b, w->q_norm, dc->layers[i].head_dim, &o->q_norm, err)) ||
            (st = up_rope(b, dc->layers[i].head_dim, dc->layers[i].rope_theta, &o->rope_inv, err)))
            return st;
        o->layer_scalar = w->layer_scalar;
    }
    return G4_OK;
}

static void layout_drafter(g4_cuda *c, const g4_drafter *d, bump *b) {
    const g4_config *dc = &d->cfg.text;
    int h = dc->hidden, H = c->m->cfg.hidden, V = dc->vocab, maxd = 0, maxI = 0, maxkv = 0, maxgroup = 0;
    for (int i = 0; i < dc->n_layers; i++) {
        const g4_layer_config *tl = &c->m->cfg.layers[d->target_layer[i]];
        maxd = dc->layers[i].head_dim > maxd ? dc->layers[i].head_dim : maxd;
        maxI = dc->layers[i].mlp_width > maxI ? dc->layers[i].mlp_width : maxI;
        maxkv = tl->n_kv_heads > maxkv ? tl->n_kv_heads : maxkv;
        maxgroup = dc->n_heads / tl->n_kv_heads > maxgroup ? dc->n_heads / tl->n_kv_heads : maxgroup;
    }
    c->d_part = TAKE(b, float, (size_t)maxkv * c->max_chunks * maxgroup * (maxd + 2));
    c->d_att_cnt = TAKE(b, int, dc->n_heads);
    c->d_hid = TAKE(b, float, H);
    c->d_hcarry = TAKE(b, float, H);
    c->d_hhist = TAKE(b, float, (size_t)G4C_MAXSTEPS * H);
    c->d_dlogits = TAKE(b, float, (size_t)G4C_MAXSTEPS * V);
    c->d_x = TAKE(b, float, h);
    c->d_xa = TAKE(b, float, h);
    c->d_xb = TAKE(b, float, h);
    c->d_q = TAKE(b, float, (size_t)dc->n_heads * maxd);
    c->d_att = TAKE(b, float, (size_t)dc->n_heads * maxd);
    c->d_t = TAKE(b, float, h);
    c->d_hb = TAKE(b, float, maxI);
    c->d_f = TAKE(b, float, h);
    c->d_y = TAKE(b, float, h);
    int C = d->cfg.ordered_embeddings ? d->cfg.n_centroids : 1;
    c->d_cent = TAKE(b, float, C);
    c->d_cidx = TAKE(b, int, d->cfg.ordered_embeddings ? d->cfg.centroid_top_k : 1);
    c->d_cflag = TAKE(b, int, C);
    c->d_order = TAKE(b, int, d->cfg.ordered_embeddings ? V : 1);
    c->d_cluster = TAKE(b, int, d->cfg.ordered_embeddings ? V : 1);
}

static void build_drafter(g4_cuda *c, const g4_drafter *d) {
    const g4_config *dc = &d->cfg.text, *tc = &c->m->cfg;
    const int h = dc->hidden, H = tc->hidden, nH = dc->n_heads, V = dc->vocab;
    std::vector<g4c_op> &ops = c->dops;
    ops.clear();
    g4c_op o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
    o.in.kind = G4C_IN_CONCAT;
    o.in.emb = c->embed;
    o.in.emb_scale = c->m->embed_scale;
    o.in.hid = c->d_hcarry;
    o.nparts = 1;
    o.part[0] = part_of(c->d_pre, c->d_x, h);
    ops.push_back(o);
    stream_t s;
    memset(&s, 0, sizeof s);
    s.cur = c->d_x;
    s.buf[0] = c->d_xa;
    s.buf[1] = c->d_xb;
    for (int l = 0; l < dc->n_layers; l++) {
        const g4_layer_config *lc = &dc->layers[l];
        const dev_dlayer *w = &c->dlw[(size_t)l];
        const int src = d->target_layer[l], dd = lc->head_dim, I = lc->mlp_width;
        const dev_kv *kv = &c->kv[(size_t)src];
        const g4_layer_config *tl = &tc->layers[src];
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = fold_in(&s, h, G4C_NORM_RMS, w->attn_norm);
        o.nparts = 1;
        o.part[0] = part_of(w->wq, c->d_q, nH * dd);
        ops.push_back(o);
        g4c_op hd = op_new(G4C_OP_HEADS, G4C_CLS_OTHER);
        hd.drafter = 1;
        hd.n_heads = nH;
        hd.n_kv = tl->n_kv_heads;
        hd.d = dd;
        hd.pairs = lc->rope_pairs;
        hd.rope_inv = w->rope_inv;
        for (int t = 0; t < tc->n_layers && !hd.rope_cs; t++)
            if (same_rope(&tc->layers[t], lc))
                hd.rope_cs = c->rope_cs[(size_t)t];
        hd.q = c->d_q;
        hd.q_norm = w->q_norm;
        ops.push_back(hd);
        g4c_op at = op_new(G4C_OP_ATTN, G4C_CLS_ATTN);
        at.drafter = 1;
        at.n_heads = nH;
        at.n_kv = tl->n_kv_heads;
        at.d = dd;
        at.is_full = tl->is_full;
        at.window = tc->sliding_window;
        at.q = c->d_q;
        at.kc = kv->kc;
        at.vc = kv->vc;
        at.cap_rows = kv->cap;
        at.att = c->d_att;
        at.part_buf = c->d_part;
        at.att_cnt = c->d_att_cnt;
        at.max_chunks = c->max_chunks;
        attn_ops(ops, at);
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = plain_in(c->d_att, nH * dd);
        o.nparts = 1;
        o.part[0] = part_of(w->wo, c->d_t, h);
        ops.push_back(o);
        s.t = c->d_t;
        s.t_w = w->post_attn;
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = fold_in(&s, h, G4C_NORM_RMS, w->pre_ffn);
        o.epi = G4C_EPI_GELU_PAIR;
        o.nparts = 2;
        o.part[0] = part_of(w->gate, c->d_hb, I);
        o.part[1] = part_of(w->up, c->d_hb, I);
        ops.push_back(o);
        o = op_new(G4C_OP_MATMUL, G4C_CLS_MATMUL);
        o.in = plain_in(c->d_hb, I);
        o.nparts = 1;
        o.part[0] = part_of(w->down, c->d_f, h);
        ops.push_back(o);
        s.t = c->d_f;
        s.t_w = w->post_ffn;
        s.has_scalar = 1;
        s.scalar = w->layer_scalar;
    }
    /* y = rms_w(norm)(x); the carried hidden y · postᵀ; the head */
    o = op_new(G4C_OP_MATMUL, G4C_CLS_HEAD);
    o.in = fold_in(&s, h, G4C_NORM_RMS, c->d_final_norm);
    o.in.x_out = NULL;
    o.in.normed_out = c->d_y;
    o.nparts = 2;
    o.part[0] = part_of(c->d_post, c->d_hcarry, H);
    o.part[0].y2 = c->d_hhist;
    o.part[0].y2_step = H;
    if (d->cfg.ordered_embeddings) {
        o.part[1] = part_of(c->d_cent_w, c->d_cent, d->cfg.n_centroids);
        ops.push_back(o);
        g4c_op k = op_new(G4C_OP_CENT_TOPK, G4C_CLS_HEAD);
        k.C = d->cfg.n_centroids;
        k.topk = d->cfg.centroid_top_k;
        k.per = V / d->cfg.n_centroids;
        k.V = V;
        k.cent = c->d_cent;
        k.cidx = c->d_cidx;
        k.cflag = c->d_cflag;
        k.order = c->d_order;
        k.cluster_of = c->d_cluster;
        k.y = c->d_y;
        k.emb_d = c->d_emb;
        k.logits = c->d_dlogits;
        ops.push_back(k);
        k.kind = G4C_OP_CENT_SCORE;
        ops.push_back(k);
        k.kind = G4C_OP_CENT_FILL;
        ops.push_back(k);
    } else {
        o.part[1] = part_of(c->d_emb, c->d_dlogits, V);
        o.part[1].y_step = V;
        o.part[1].argmax = 2;
        ops.push_back(o);
    }
}

extern "C" g4_status g4_cuda_draft_attach(g4_cuda *c, const g4_drafter *d, g4_error *err) {
    if (c->dr == d) return G4_OK;
    drafter_release(c);
    if (d->target != c->m) return g4_fail(err, G4_ERR_ARG, "the drafter was loaded for another model");
    const g4_config *dc = &d->cfg.text;
    if (d->cfg.ordered_embeddings && (d->cfg.n_centroids <= 0 || dc->vocab % d->cfg.n_centroids ||
                                       d->cfg.n_centroids > c->smem_in))
        return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: drafter centroid head with %d centroids is not supported",
                       d->cfg.n_centroids);
    if (G4C_TILE_LD(2 * c->m->cfg.hidden) > c->smem_in) return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: drafter input too wide");
    if (dc->hidden > G4C_THREADS * G4C_IN_NPT)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: drafter hidden size %d exceeds %d", dc->hidden, G4C_THREADS * G4C_IN_NPT);
    for (int i = 0; i < dc->n_layers; i++) /* the drafter's own rows must fit the shared-memory tile too */
        if (G4C_TILE_LD(dc->layers[i].mlp_width) > c->smem_in || G4C_TILE_LD(dc->n_heads * dc->layers[i].head_dim) > c->smem_in ||
            G4C_TILE_LD(dc->hidden) > c->smem_in)
            return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: drafter layer %d has an input row wider than shared memory", i);
    for (int i = 0; i < dc->n_layers; i++) { /* the drafter's attention over the target's cache */
        const g4_layer_config *tl = &c->m->cfg.layers[d->target_layer[i]];
        const int dd = dc->layers[i].head_dim, g = dc->n_heads / (tl->n_kv_heads > 0 ? tl->n_kv_heads : 1);
        if (g < 1 || attn_item_floats(dd) > c->smem_in)
            return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA backend: drafter layer %d's attention exceeds shared memory", i);
    }
    bump b = {NULL, 0, 1};
    g4_status st = upload_drafter(c, d, &b, err);
    if (st) return st;
    CK(cudaMalloc((void **)&c->dwmem, b.used), "allocating drafter weights");
    b = (bump){c->dwmem, 0, 0};
    if ((st = upload_drafter(c, d, &b, err))) {
        drafter_release(c);
        return st;
    }
    b = (bump){NULL, 0, 1};
    layout_drafter(c, d, &b);
    CK(cudaMalloc((void **)&c->damem, b.used), "allocating drafter scratch");
    CK(cudaMemset(c->damem, 0, b.used), "clearing drafter scratch");
    b = (bump){c->damem, 0, 0};
    layout_drafter(c, d, &b);
    if (d->cfg.ordered_embeddings) {
        int V = dc->vocab, per = V / d->cfg.n_centroids;
        std::vector<int> cluster((size_t)V);
        for (int i = 0; i < V; i++) cluster[(size_t)d->token_order[i]] = i / per;
        CK(cudaMemcpy(c->d_order, d->token_order, sizeof(int) * (size_t)V, cudaMemcpyHostToDevice), "uploading token order");
        CK(cudaMemcpy(c->d_cluster, cluster.data(), sizeof(int) * (size_t)V, cudaMemcpyHostToDevice), "uploading clusters");
    }
    build_drafter(c, d);
    finish_ops(c, c->dops);
    if ((st = push_ops(c, c->dops, &c->d_dops, err))) {
        drafter_release(c);
        return st;
    }
    c->d_eps = dc->rms_eps;
    c->dr = d;
    return G4_OK;
}

extern "C" g4_status g4_cuda_save_hidden(g4_cuda *c, int row, g4_error *err) {
    const int H = c->m->cfg.hidden;
    if (!c->dr) return g4_fail(err, G4_ERR_ARG, "CUDA backend: no drafter attached");
    CK(cudaMemcpyAsync(c->d_hid, c->hfinal + (size_t)row * H, sizeof(float) * (size_t)H, cudaMemcpyDeviceToDevice, c->stream),
       "saving the hidden state");
    return G4_OK;
}

extern "C" g4_status g4_cuda_draft(g4_cuda *c, int32_t tok, int qpos, int n_steps, int begin, int32_t *drafts,
                                   float *logits, float *hidden0, g4_error *err) {
    if (!c->dr) return g4_fail(err, G4_ERR_ARG, "CUDA backend: no drafter attached");
    if (n_steps < 1 || n_steps > G4C_MAXSTEPS || qpos < 0 || qpos >= c->n_ctx)
        return g4_fail(err, G4_ERR_ARG, "CUDA backend: %d draft steps at position %d", n_steps, qpos);
    const int H = c->m->cfg.hidden, V = c->dr->cfg.text.vocab;
    if (begin)
        CK(cudaMemcpyAsync(c->d_hcarry, c->d_hid, sizeof(float) * (size_t)H, cudaMemcpyDeviceToDevice, c->stream),
           "starting a draft round");
    c->h_ctl->dtok0 = tok;
    CK(cudaMemcpyAsync(&c->ctl->dtok0, &c->h_ctl->dtok0, sizeof(int), cudaMemcpyHostToDevice, c->stream), "copying the token");
    g4c_params p = base_params(c);
    p.ops = c->d_dops;
    p.n_ops = (int)c->dops.size();
    p.M = 1;
    p.want_logits = logits != NULL;
    p.qpos = qpos;
    p.n_steps = n_steps;
    p.eps = c->d_eps;
    CK(g4c_launch(&p, c->grid, c->smem, c->stream), "launching the drafter");
    CK(cudaMemcpyAsync(c->h_ctl->drafts, c->ctl->drafts, sizeof(int) * (size_t)n_steps, cudaMemcpyDeviceToHost, c->stream),
       "copying drafts");
    if (logits)
        CK(cudaMemcpyAsync(logits, c->d_dlogits, sizeof(float) * (size_t)n_steps * V, cudaMemcpyDeviceToHost, c->stream),
           "copying drafter logits");
    if (hidden0)
        CK(cudaMemcpyAsync(hidden0, c->d_hhist, sizeof(float) * (size_t)H, cudaMemcpyDeviceToHost, c->stream),
           "copying the drafter hidden");
    CK(cudaStreamSynchronize(c->stream), "running the drafter");
    memcpy(drafts, c->h_ctl->drafts, sizeof(int32_t) * (size_t)n_steps);
    return G4_OK;
}

/* ---- benchmarking --------------------------------------------------------------------------------- */

extern "C" g4_status g4_cuda_decode_chain(g4_cuda *c, int pos, int32_t tok, int n, int32_t *out, double *seconds,
                                          g4_error *err) {
    if (n < 1 || pos < 0 || pos + n > c->n_ctx) return g4_fail(err, G4_ERR_ARG, "decode chain of %d tokens at %d", n, pos);
    g4_status st = set_tokens(c, pos, &tok, 1, err);
    if (st) return st;
    c->h_ctl->hist_n = 0;
    CK(cudaMemcpyAsync(&c->ctl->hist_n, &c->h_ctl->hist_n, sizeof(int), cudaMemcpyHostToDevice, c->stream), "chain setup");
    g4c_params p = base_params(c);
    p.M = 1;
    p.want_logits = 1;
    p.direct = 1;
    p.chain = 1;
    p.hist = c->hist;
    cudaGraphExec_t ge = NULL;
    if (use_staged(c, p) && (st = staged_get(c, p, &ge, err))) return st;
    CK(cudaEventRecord(c->ev0, c->stream), "recording an event");
    for (int i = 0; i < n; i++)
        CK(ge ? cudaGraphLaunch(ge, c->stream) : g4c_launch(&p, c->grid, c->smem, c->stream), "launching a decode step");
    CK(cudaEventRecord(c->ev1, c->stream), "recording an event");
    CK(cudaEventSynchronize(c->ev1), "running the decode chain");
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, c->ev0, c->ev1), "timing");
    *seconds = ms * 1e-3;
    if (out) CK(cudaMemcpy(out, c->hist, sizeof(int) * (size_t)n, cudaMemcpyDeviceToHost), "copying tokens");
    return G4_OK;
}

extern "C" g4_status g4_cuda_time_forward(g4_cuda *c, int pos, const int32_t *tokens, int M, int reps, double *seconds,
                                          g4_error *err) {
    if (M < 1 || M > c->max_batch || pos + M > c->n_ctx || reps < 1) return g4_fail(err, G4_ERR_ARG, "bad timed forward");
    g4_status st = set_tokens(c, pos, tokens, M, err);
    if (st) return st;
    g4c_params p = base_params(c);
    p.M = M;
    p.want_logits = 1;
    cudaGraphExec_t ge = NULL; /* as launch_forward runs it */
    if (use_staged(c, p) && (st = staged_get(c, p, &ge, err))) return st;
    CK(cudaEventRecord(c->ev0, c->stream), "recording an event");
    for (int i = 0; i < reps; i++)
        CK(ge ? cudaGraphLaunch(ge, c->stream) : g4c_launch(&p, c->grid, c->smem, c->stream), "launching a forward");
    CK(cudaEventRecord(c->ev1, c->stream), "recording an event");
    CK(cudaEventSynchronize(c->ev1), "running forwards");
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, c->ev0, c->ev1), "timing");
    *seconds = ms * 1e-3 / reps;
    return G4_OK;
}

extern "C" int g4_cuda_set_staged(g4_cuda *c, int mode) {
    if (mode < 0 || mode > 4 || mode == c->staged) return c->staged;
    staged_drop(c);
    c->staged = mode;
    return mode;
}

extern "C" void g4_cuda_set_staged_opts(g4_cuda *c, int attn_early, int ring_q) {
    const int a = attn_early < 0 ? c->attn_early : attn_early != 0, q = ring_q < 0 ? c->ring_q : ring_q != 0;
    if (a == c->attn_early && q == c->ring_q) return;
    staged_drop(c);
    c->attn_early = a;
    c->ring_q = q;
}

extern "C" int g4_cuda_set_pipe(g4_cuda *c, int on) {
    const int was = c->mm_pipe;
    if (on >= 0) c->mm_pipe = on > 2 ? 2 : on;
    return was;
}

extern "C" void g4_cuda_get_staged_opts(const g4_cuda *c, int *attn_early, int *ring_q) {
    *attn_early = c->attn_early;
    *ring_q = c->ring_q;
}

extern "C" void g4_cuda_set_skip(g4_cuda *c, int mask) { c->skip = mask; }
extern "C" void g4_cuda_set_trace_prefill(g4_cuda *c, int on) { c->trace_fast = on != 0; }
extern "C" void g4_cuda_set_rep(g4_cuda *c, int rep) { c->rep = rep < 0 ? 0 : rep; }

extern "C" void g4_cuda_set_mode(g4_cuda *c, int evict_first, int op_local) {
    c->evict_first = !!evict_first;
    c->op_local = !!op_local;
}

/* weight bytes a stage streams once (matmuls; experts: the top-k experts' rows) */
static double stage_weight_bytes(const g4c_op &o, int want_logits) {
    double b = 0;
    if (o.kind == G4C_OP_MATMUL && (!o.lm || want_logits))
        for (int i = 0; i < o.nparts; i++) b += (double)o.part[i].w.rows * (double)o.part[i].w.row_bytes;
    if (o.kind == G4C_OP_EXPERT) b = (double)o.topk * (o.ex_pair ? 2.0 * o.Im : (double)o.H) * (double)o.ew.row_bytes;
    return b;
}

extern "C" g4_status g4_cuda_trace(g4_cuda *c, int pos, const int32_t *tokens, int M, unsigned long long *stamps,
                                   int *kinds, double *wbytes, g4_error *err) {
    if (M < 1 || M > c->max_batch || pos < 0 || pos + M > c->n_ctx) return g4_fail(err, G4_ERR_ARG, "bad traced forward");
    const size_t n = c->ops.size() * (size_t)c->grid * 4;
    unsigned long long *d = NULL;
    CK(cudaMalloc((void **)&d, n * sizeof *d), "allocating the trace");
    g4_status st = set_tokens(c, pos, tokens, M, err);
    g4c_params p = base_params(c);
    p.M = M;
    p.want_logits = 1;
    p.trace = d;
    p.fast = c->trace_fast;
    cudaError_t e = cudaSuccess;
    for (int r = 0; r < 2 && !st && !e; r++) e = g4c_launch(&p, c->grid, c->smem, c->stream); /* warm, then traced */
    if (!st && !e) e = cudaMemcpyAsync(stamps, d, n * sizeof *d, cudaMemcpyDeviceToHost, c->stream);
    if (!st && !e) e = cudaStreamSynchronize(c->stream);
    cudaFree(d);
    if (st) return st;
    if (e) return g4_cuda_fail(err, e, "running a traced forward");
    for (size_t i = 0; i < c->ops.size(); i++) {
        if (kinds) kinds[i] = c->ops[i].kind;
        if (wbytes) wbytes[i] = stage_weight_bytes(c->ops[i], 1);
    }
    return G4_OK;
}

extern "C" g4_status g4_cuda_staged_trace(g4_cuda *c, int pos, const int32_t *tokens, int M, int amark,
                                          unsigned long long *stamps, int *grid, int *kern, int *kinds, double *wbytes,
                                          g4_error *err) {
    if (M < 1 || M > c->max_batch || pos < 0 || pos + M > c->n_ctx || amark < 0 || amark > 5)
        return g4_fail(err, G4_ERR_ARG, "bad traced forward");
    g4c_params p = base_params(c);
    p.M = M;
    p.amark = amark;
    p.want_logits = 1;
    if (!use_staged(c, p)) return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA staged trace: this block does not run staged");
    const size_t n = c->ops.size() * (size_t)G4C_MAXB * 4;
    std::vector<int> gr(c->ops.size()), kn(c->ops.size());
    unsigned long long *d = NULL;
    cudaGraphExec_t ge = NULL;
    CK(cudaMalloc((void **)&d, n * sizeof *d), "allocating the trace");
    p.strace = d;
    g4_status st = set_tokens(c, pos, tokens, M, err);
    if (!st) st = staged_graph(c, p, &ge, err, gr.data(), kn.data());
    for (size_t i = 0; !st && i < gr.size(); i++) /* the marks' room: G4C_MAXB blocks a stage */
        if (gr[i] > G4C_MAXB) st = g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA staged trace: stage %zu has %d blocks (at most %d)", i, gr[i], (int)G4C_MAXB);
    cudaError_t e = cudaSuccess;
    for (int r = 0; r < 2 && !st && !e; r++) { /* warm, then traced: no marks left from the warm run (a stage's
                                                   blocks need not take the same items twice) */
        e = cudaMemsetAsync(d, 0, n * sizeof *d, c->stream);
        if (!e) e = cudaGraphLaunch(ge, c->stream);
    }
    if (!st && !e) e = cudaMemcpyAsync(stamps, d, n * sizeof *d, cudaMemcpyDeviceToHost, c->stream);
    if (!st && !e) e = cudaStreamSynchronize(c->stream);
    if (ge) cudaGraphExecDestroy(ge);
    cudaFree(d);
    if (st) return st;
    if (e) return g4_cuda_fail(err, e, "running a traced staged forward");
    for (size_t i = 0; i < c->ops.size(); i++) {
        if (grid) grid[i] = gr[i];
        if (kern) kern[i] = kn[i];
        if (kinds) kinds[i] = c->ops[i].lm ? -1 : c->ops[i].kind;
        if (wbytes) wbytes[i] = stage_weight_bytes(c->ops[i], 1);
    }
    return G4_OK;
}

extern "C" g4_status g4_cuda_set_tune(g4_cuda *c, int pf_items, int pf_self, int split_chunks, int smem_kb,
                                      g4_error *err) {
    CK(cudaStreamSynchronize(c->stream), "synchronising");
    if (smem_kb > 0) { /* less shared memory leaves more L1 for the stack (callee-saved registers) */
        int grid = 0, smem_in = 0;
        size_t smem = 0;
        CK(g4c_kernel_shape(c->dev, &grid, &smem, &smem_in), "sizing the persistent kernel");
        size_t want = (size_t)smem_kb * 1024;
        if (want < smem) {
            smem_in = (int)((want - G4C_TAIL) / sizeof(float)) & ~3;
            smem = want;
        }
        if (smem_in < c->smem_need) return g4_fail(err, G4_ERR_ARG, "CUDA backend: %d KB of shared memory is too little", smem_kb);
        c->smem = smem;
        c->smem_in = smem_in;
    }
    c->pf_items = pf_items < 0 ? 0 : pf_items;
    c->pf_self = pf_self < 0 ? 0 : pf_self; /* pipelined tiles: items ahead; dot2's tiles: the next (any > 0) */
    c->split_chunks = split_chunks < 0 ? 0 : split_chunks;
    build_target(c);
    finish_ops(c, c->ops);
    g4_status st = push_ops(c, c->ops, &c->d_ops, err);
    if (st || !c->dr) return st;
    build_drafter(c, c->dr);
    finish_ops(c, c->dops);
    return push_ops(c, c->dops, &c->d_dops, err);
}

extern "C" g4_status g4_cuda_bandwidth(size_t bytes, double *bytes_per_s, g4_error *err) {
    float4 *buf = NULL;
    float *sink = NULL;
    cudaStream_t s;
    cudaEvent_t a, b;
    size_t n4 = bytes / sizeof(float4);
    CK(cudaMalloc((void **)&buf, n4 * sizeof(float4)), "allocating the probe buffer");
    CK(cudaMalloc((void **)&sink, sizeof(float)), "allocating the probe sink");
    CK(cudaMemset(buf, 0, n4 * sizeof(float4)), "clearing the probe buffer");
    CK(cudaStreamCreate(&s), "creating a stream");
    CK(cudaEventCreate(&a), "creating an event");
    CK(cudaEventCreate(&b), "creating an event");
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "reading the SM count");
    CK(g4c_read_probe(buf, n4, sink, sms * 4, s), "probe warm-up");
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(a, s), "recording an event");
        CK(g4c_read_probe(buf, n4, sink, sms * 4, s), "probe");
        CK(cudaEventRecord(b, s), "recording an event");
        CK(cudaEventSynchronize(b), "probe");
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b), "timing");
        best = ms < best ? ms : best;
    }
    *bytes_per_s = (double)(n4 * sizeof(float4)) / (best * 1e-3);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    cudaFree(buf);
    cudaFree(sink);
    return G4_OK;
}

extern "C" void g4_cuda_describe(const g4_cuda *c, int *grid, int *n_ops, size_t *weight_bytes, size_t *scratch_bytes) {
    if (grid) *grid = c->grid;
    if (n_ops) *n_ops = (int)c->ops.size();
    if (weight_bytes) *weight_bytes = c->wbytes;
    if (scratch_bytes) *scratch_bytes = c->abytes;
}
