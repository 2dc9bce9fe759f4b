/* The CUDA backend's model program: a list of stages that one persistent kernel interprets, the
 * same list for any number of tokens M (1 for decode, k+1 for a verify block, a prefill chunk).
 *
 * Every stage is executed by the whole grid, then a grid-wide barrier. A stage's work items split
 * *output elements only*; each output element is reduced by one fixed procedure whatever M is,
 * which block computes it, or how tokens are tiled (exactness contract, engineering.md §1):
 *   matmul   a team of S warps per pair of output rows, S fixed by the stage's shape (program
 *            field `split`, from K and the weight type only); lane l of team warp j owns the
 *            16-byte chunks 32j+l, 32j+l+32S, ... of the row in ascending order (dense: fmaf
 *            into two chains per token, elements 4i, 4i+1 and 4i+2, 4i+3, added at the end;
 *            quantised chunks: a float dot of codes per chunk in two interleaved fmaf chains
 *            added at the end, then acc = fmaf(scale, dot, acc) [+ fmaf(bias, sum x, ...)]),
 *            a fixed xor butterfly across the 32 lanes, then the S warp sums added in warp order;
 *   norms    sum of squares in double, block-strided then a fixed tree;
 *   attention keys split at absolute multiples of G4C_KCHUNK, chunk partials combined in chunk
 *            order; the split depends on the query position only.
 * Plain C structs so the host builder (session.cu) and the kernels (forward.cu) share them. */
#ifndef G4_CUDA_PROGRAM_H
#define G4_CUDA_PROGRAM_H
#include <stddef.h>
#include <stdint.h>

/* 256 threads: each thread may hold 255 registers, so the stage code (inlined into the kernel, see
 * G4C_INLINE_ALL in forward.cu) keeps its loads in flight without spilling; measured on the H200:
 * E2B bf16 decode 208 tok/s vs 132-140 with 512 threads (out-of-line or inlined stages) */
#ifndef G4C_NTHREADS
#define G4C_NTHREADS 256
#endif
enum {
    G4C_THREADS = G4C_NTHREADS, /* threads per block; one block per SM */
    G4C_WARPS = G4C_THREADS / 32,
    G4C_MT = 8,          /* tokens per matmul tile (register accumulators per warp) */
    G4C_KCHUNK = 32,     /* attention keys per work item */
    G4C_MAXPART = 4,     /* matrices sharing one matmul stage (q/k/v; post_proj + head) */
    G4C_MAXGROUP = 16,   /* query heads per KV head */
    G4C_MAXD = 512,      /* head dim */
    G4C_TAIL = 8192,     /* bytes of shared memory kept for reductions after the input tile */
    G4C_RING_WARP = 8192, /* the staged ring kernel (forward.cuh mm_ring): each warp's weight ring, after the tail */
    G4C_RING_SLOT_D = 1024, G4C_RING_R_D = 8, /* its slots (bytes) and their number: dense rows */
    G4C_RING_SLOT_Q = 1536, G4C_RING_R_Q = 5, /* 4- and 8-bit rows (their scale and bias words too) */
    G4C_IN_NPT = 6144 / G4C_THREADS, /* normed input rows: elements per thread (K <= 6144) */
    G4C_MMA_MT = 32,     /* tokens per input tile of a tensor-core stage (4 groups of 8) */
    G4C_MMA_MAXITEMS = 4096, /* tensor-core stages split K until this many (row tile, segment) items */
    G4C_MMA_SCRATCH = 2 * G4C_WARPS * 32, /* shared floats after a tensor-core stage's input tile: argmax
                                             (value, index) per warp and token */
    /* the prefill procedure (forward.cu fp_gemm): a block item is a band of 16-row tiles (two
     * per warp; gate/up pairs: one of each), a block of G4C_FP_TB tokens and one of fp_ks K
     * segments; weights and activations are staged G4C_FP_KS k-steps (32 columns each) at a time,
     * G4C_FP_NBUF chunks in flight */
    G4C_FP_TB = 64,        /* tokens per token block */
    G4C_FP_KS = 2,         /* k-steps per staged chunk */
    G4C_FP_NBUF = 3,
    G4C_FP_TERMS = 3,      /* bf16 terms per activation (x = h + m + l) */
    G4C_FP_TARGET = 128,   /* items per token block the K split aims at */
    G4C_FP_MAXBANDS = 4096,
    G4C_FP_LDS = 32 * G4C_FP_KS + 8, /* staged row stride (bf16): 16 bytes of padding keep ldmatrix conflict-free */
    G4C_FP_SLOT = G4C_WARPS * 64 * 32, /* floats of one item's segment partials */
};

/* weight element types on the device. Dense rows are the checkpoint's; quantised rows are
 * rearranged at upload into one layout for every source format (GGUF Q8_0/Q4_0, MLX affine 4/8,
 * QAT int4/int8; the other GGUF block types and 2/3/5/6/7-bit codes widened into it, session.cu
 * wide_row): [codes][scales][biases], padded to 16 bytes. Codes are an LSB-first stream of
 * 8-bit (Q8) or 4-bit (Q4) values, element i of the row at bits [i·b, (i+1)·b); w = s·(q − z) + b
 * with z = 128 / 8 for signed codes (Q8 read as int8; with G4C_QF_BIAS too: signed codes plus a
 * bias), 0 for unsigned ones; one scale (and bias) per `group` columns (group ≥ 32, or 16 for Q8
 * rows widened from Q6_K), stored as f32, f16 or bf16. */
enum { G4C_F32 = 0, G4C_F16 = 1, G4C_BF16 = 2, G4C_Q8 = 3, G4C_Q4 = 4 };
enum { G4C_QF_SIGNED = 1, G4C_QF_BIAS = 2, G4C_QF_TILED = 4 }; /* g4c_mat.flags */
/* G4C_QF_TILED (bf16, cols a multiple of 32): the tensor cores' layout (forward.cu mm_tile_mma).
 * Rows are padded with zeros to a multiple of 16; tile T (rows 16T..16T+15) and k-step s (columns
 * 32s..32s+31) form the 1 KB block at ((T·cols/32) + s)·1024 bytes: first row 16T+g, then row
 * 16T+g+8, each as 32 lanes' 16 bytes, lane 4g+t holding columns 32s+8t..32s+8t+7 - so a warp's
 * two 512-byte loads are contiguous and land in mma.m16n8k16's A fragments. row_bytes stays
 * 2·cols (the row-major size, for byte counts). */
enum { G4C_S_F32 = 0, G4C_S_F16 = 1, G4C_S_BF16 = 2 }; /* g4c_mat.stype */
/* What a kernel instantiation can run (g4c_params.kmask): bit 1 << G4C_<type> for each weight type
 * its matmul and expert stages read, G4C_KM_MMA for the tensor-core procedure. The kernel is one
 * register allocation, so code for paths a model never takes costs the ones it does: the session
 * launches the smallest instantiation that covers its stages (forward.cu g4c_launch).
 * G4C_KM_WIDE marks the instantiations for launches of G4C_WIDE_M or more tokens (prefill
 * chunks): their matmul stages give each token tile its own group of blocks (forward.cu
 * op_matmul) - with the same arithmetic per output, so a token's values do not depend on which
 * kind of kernel ran it - while the others stay exactly the decode kernels they were. */
enum {
    G4C_KM_DENSE = (1 << G4C_F32) | (1 << G4C_F16) | (1 << G4C_BF16),
    G4C_KM_Q8 = 1 << G4C_Q8,
    G4C_KM_Q4 = 1 << G4C_Q4,
    G4C_KM_MMA = 1 << 5,
    G4C_KM_ALL = G4C_KM_DENSE | G4C_KM_Q8 | G4C_KM_Q4 | G4C_KM_MMA,
    G4C_KM_WIDE = 1 << 6,
    G4C_KM_IQ = 1 << 7, /* the integer tensor-core procedure for 4-bit rows (forward.cuh mm_tile_iq;
                           only in the instantiations that carry it, so the others keep their
                           register allocation) */
    G4C_WIDE_M = 8,
    G4C_KM_M1 = 1 << 8, /* the staged decode's kernels (forward.cuh g4c_stage_kernel): launches of one
                           token only, so a matmul stage instantiates only its one-token tile and the
                           kernel needs fewer registers than the persistent one */
    G4C_KM_LEAN = 1 << 9, /* with G4C_KM_M1: the staged matmul kernels held to 128 registers (two
                             blocks per SM) load half as many chunks ahead per lane at M = 1 (the
                             SM then has twice the warps; no operation on any value changes) */
};

typedef struct g4c_mat {
    const void *data;     /* device; row r at data + r * row_bytes */
    long long row_bytes;
    int rows, cols;
    int type;             /* G4C_F32 / F16 / BF16 / Q8 / Q4 */
    int group;            /* quantised: columns per scale */
    int flags, stype;     /* quantised: G4C_QF_*, scale dtype */
    int sc_off, bi_off;   /* quantised: byte offsets of the scales and biases within a row */
} g4c_mat;

/* elements per 16-byte chunk of a row */
#define G4C_CHUNK_ELEMS(t) ((t) == G4C_F32 ? 4 : (t) == G4C_Q8 ? 16 : (t) == G4C_Q4 ? 32 : 8)
/* Input tiles in shared memory are padded by 4 floats after every 32 (element i at
 * i + 4·(i / 32)), so a warp's float4 reads of its lanes' chunks hit distinct banks for every
 * chunk width; a tile row of K elements takes G4C_TILE_LD(K) floats. */
#define G4C_TILE_LD(K) ((K) + (((K) + 31) >> 5) * 4)
/* Shared-memory floats of a tile of mt input rows of K as forward.cuh load_rows builds it: the
 * rows and, for normed inputs (norm), the residual rows and both norm weights beside them. The
 * kernels and session.cu's sizing of the verify rings both read it. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline size_t g4c_rows_floats(int norm, int K, int mt) {
    return (size_t)mt * G4C_TILE_LD(K) + (norm ? (size_t)mt * K + 2 * (size_t)K : 0);
}

/* op kinds */
enum {
    G4C_OP_EMBED,        /* x0[m] = E[tok_m] * scale */
    G4C_OP_MATMUL,       /* rows of up to G4C_MAXPART matrices over one staged input */
    G4C_OP_HEADS,        /* q_norm + rope; k_norm + rope, weightless v norm -> staging / cache */
    G4C_OP_ATTN,         /* softmax(q K^T) V over one chunk of visible keys; the last chunk of a
                            query head to finish combines the head's chunk partials */
    G4C_OP_PLE,          /* per-layer inputs from the projection and the gathered table row */
    G4C_OP_MOE_ROUTE,    /* router softmax, top-k, weights; x2 = rms_w(pre_ffn_2)(x1) */
    G4C_OP_EXPERT,       /* top-k expert matmuls (gate/up pairs or down) */
    G4C_OP_MOE_COMBINE,  /* f = rms_w(post1)(dense) + rms_w(post2)(sum_k w_k expert_k) */
    G4C_OP_CENT_TOPK,    /* drafter centroid head: top-k clusters */
    G4C_OP_CENT_SCORE,   /* drafter centroid head: score the chosen clusters' tokens, argmax */
    G4C_OP_CENT_FILL,    /* drafter centroid head: every other token gets min - 1 */
};

/* classes for the timing breakdown (bit mask of classes to skip) */
enum { G4C_CLS_MATMUL = 1, G4C_CLS_ATTN = 2, G4C_CLS_HEAD = 4, G4C_CLS_OTHER = 8 };

/* how a matmul's input rows reach shared memory */
enum {
    G4C_IN_PLAIN,   /* rows of x as they are */
    G4C_IN_NORM,    /* v = x (+ rms_w(t_w)(t)) (* scalar); optional writes; then a norm */
    G4C_IN_CONCAT,  /* drafter: [E_target[tok] * emb_scale, hid] */
};
enum { G4C_NORM_NONE, G4C_NORM_RMS, G4C_NORM_ROUTER };

enum { G4C_EPI_STORE, G4C_EPI_SOFTCAP, G4C_EPI_GELU_PAIR, G4C_EPI_PLE_GATE };

typedef struct g4c_part {
    g4c_mat w;
    float *y;             /* y[m * ldy + r] (+ step * y_step) */
    int ldy, y_step;
    float *y2;            /* optional second copy (drafter hidden history) */
    int y2_step;
    int argmax;           /* 1: argmax per token -> ctl->next (and the decode chain);
                             2: drafter argmax -> ctl->drafts[step] */
} g4c_part;

typedef struct g4c_in {
    int kind, norm;
    const float *x;       /* [m][ldx] */
    int ldx;
    const float *t, *t_w; /* residual addend and its norm weight (t NULL: none) */
    int has_scalar;
    float scalar;
    float *x_out;         /* block 0 writes v (the updated residual stream) [m][H] */
    float *dbg;           /* block 0 also writes v here when not NULL */
    const float *norm_w;
    float norm_scale;     /* G4C_NORM_ROUTER: H^-1/2 */
    float *normed_out;    /* block 0 writes the normed rows here when not NULL */
    int normed_step;      /* floats per draft step */
    /* G4C_IN_CONCAT */
    g4c_mat emb;
    float emb_scale;
    const float *hid;
} g4c_in;

typedef struct g4c_op {
    int kind, cls;
    int lm;               /* tokens [lm_from, M) only; no rows when the launch wants no logits */
    int split;            /* matmul: warps per row team (a power of two dividing the block's warps; from the shape only) */
    int mma_ks;           /* > 0: the stage runs on the tensor cores (mm_tile_mma; its matrices are
                             G4C_QF_TILED) in this many K segments per 16-row tile (shape only:
                             session.cu mma_segments); 0: the CUDA-core procedure */
    int pf_next;          /* index of the next matmul stage (its first rows are prefetched into
                             L2 while this stage and the barrier run), -1: none */
    /* matmul */
    g4c_in in;
    int nparts;
    g4c_part part[G4C_MAXPART];
    int epi;
    float cap;
    const float *ple;     /* G4C_EPI_PLE_GATE multiplier: ple[m * ple_ld + r] */
    int ple_ld;
    /* embed / ple */
    g4c_mat table;
    float scale, scale2, scale3;
    float *out;
    int out_ld;
    const float *src;
    const float *vec;     /* norm weights (PLE projection norm) */
    int L, P;
    /* heads + attention */
    int n_heads, n_kv, d, is_full, window, pairs, qkv_own, k_eq_v, cap_rows;
    int drafter;          /* query position is params.qpos; every key comes from the cache */
    int heads;            /* attention: also op_heads' work (no HEADS stage before it): each item
                             norms + ropes its query and the block's own K/V rows from q / kraw /
                             vraw itself, and the item of (token, KV head, query 0) whose chunk
                             holds the token's position stores that K/V row (staging or cache) */
    const double *rope_inv; /* [d / 2] theta^(-2i/d), computed by the host as the CPU does */
    const float *rope_cs;   /* [n_ctx][pairs][2] cos, sin of pos·rope_inv[i]; NULL: computed in place */
    float *q;             /* [m][n_heads * d] */
    const float *kraw, *vraw;  /* [m][n_kv * d] */
    const float *q_norm, *k_norm;
    float *kst, *vst;     /* staging [max_batch][n_kv * d] */
    float *kc, *vc;       /* cache [cap_rows][n_kv * d] */
    float *att;           /* [m][n_heads * d] */
    float *part_buf;      /* attention chunk partials [m][n_kv][max_chunks][group][2 + d] */
    int *att_cnt;         /* [m][n_heads] chunks finished (back to 0 once combined) */
    int max_chunks;
    /* MoE */
    int E, topk, Im, H;
    const float *router_logits;
    const float *expert_scale, *pre2_w, *post1_w, *post2_w;
    int *top_e;
    float *top_w;
    float *x2;            /* [m][H] */
    const float *x1;
    int ex_pair;          /* 1: gate/up pairs over x2; 0: down over the pairs' output */
    g4c_mat ew;
    const float *ex_in;
    float *ex_out;
    const float *ex_res;
    float *f;
    /* centroid head */
    int C, per, V;
    const float *cent;
    int *cidx;
    int *cflag;           /* [C] 1: cluster chosen this step */
    const int *order, *cluster_of;
    const float *y;
    g4c_mat emb_d;
    float *logits;        /* + step * V */
    int fp_ks;            /* matmul: > 0 when the prefill procedure takes the stage (bf16 row-major
                             or Q4 / Q8 weights, K a multiple of 32, no argmax): its K segments per band
                             (session.cu fp_segments, shape only) */
    int idx;              /* its index in the uploaded stage list (push_ops): the staged trace's row */
    int prep_only;        /* the last stage of a fast prefill's launch (session.cu pg_plan): a
                             matmul with fp_ks > 0 runs only its input phase (the terms in p.fp_x;
                             the products are the prefill GEMM's launch that follows), an
                             attention stage of the wide kernels only its queries' and own K/V
                             rows' norms and ropes (the items are pattn.cu's launch) */
} g4c_op;

/* device-side control block: what the host sets before a launch and the kernel's results */
enum { G4C_MAXB = 512, G4C_MAXSTEPS = 16 };
typedef struct g4c_ctl {
    int pos;              /* position of token 0 */
    int tokens[G4C_MAXB]; /* input ids */
    int next[G4C_MAXB];   /* argmax of each token's logits (softcapped) */
    int drafts[G4C_MAXSTEPS];
    int dtok0;            /* the drafter's first input token */
    float dmin;           /* centroid head: min of the scored logits */
    int hist_n;           /* chained decode: tokens appended to hist */
    int done_count;       /* last-block-done counter for argmax/min combines */
    int pad_;
    unsigned long long bar; /* grid barrier: arrivals so far (monotonic across launches) */
} g4c_ctl;

/* launch parameters */
typedef struct g4c_params {
    const g4c_op *ops;
    int n_ops;
    unsigned kmask;       /* G4C_KM_* the stages need (session.cu kernel_mask) */
    int M, lm_from, want_logits;
    int direct;           /* M == 1: K/V straight into the cache */
    int qpos;             /* drafter: query position */
    int n_steps;          /* drafter: chained steps */
    int chain;            /* decode chain: tokens[0] = next[0], pos += 1, hist[hist_n++] = token */
    int *hist;
    int skip;             /* G4C_CLS_* mask of op classes to skip (timing breakdown) */
    int rep;              /* instrumentation: every stage runs rep+1 times (g4_cuda_set_rep) */
    g4c_ctl *ctl;
    float *amax_part;     /* [grid][G4C_MAXB] value */
    int *amax_idx;        /* [grid][G4C_MAXB] index */
    float *amin_part;     /* [grid] */
    int smem_in_floats;   /* shared floats for the input tile */
    int pf_items;         /* row teams' items of the next matmul prefetched ahead (0: off) */
    int pf_self;          /* > 0: each team asks L2 for its items ahead within a stage (pipelined tiles:
                             this many; dot2's: the next) */
    float eps;            /* RMSNorm epsilon */
    int evict_first;      /* 1: weight loads are marked first to leave L2 (they are read once per
                             launch; code, stage list, activations and the stack stay resident) */
    float *mma_part;      /* tensor-core stages' segment partials [item][2][mma_tokens][16] */
    int *mma_cnt;         /* [token tile][G4C_MMA_MAXITEMS] segments finished (back to 0 once added) */
    int mma_tokens;       /* tokens the partials hold (the session's max batch) */
    int op_local;         /* 1: each stage's g4c_op is read from a shared-memory copy, fetched
                             while the previous barrier completes */
    unsigned long long *trace; /* not NULL: per stage and block, [start ns, end ns, input-tile
                                  cycles, work cycles] (benchmark instrumentation) */
    /* the prefill procedure (launches of a prompt's tokens, forward.cu fp_gemm) */
    int fast;             /* 1: stages with fp_ks > 0 run it (a wide kernel for any M) */
    int fp_ld, fp_tokens; /* fp_x row length (elements) and rows per term */
    unsigned short *fp_x; /* [G4C_FP_TERMS][fp_tokens][fp_ld] the stage's input rows as bf16 terms */
    float *fp_sx;         /* [fp_tokens][fp_ld / 32] affine-quantised stages: input sums per 32 columns */
    int fp_warp;          /* 1: the input terms are built a warp per token (forward.cuh fp_prep_warp;
                             G4_CUDA_FPWARP=0 at creation: a block per token) */
    float *fp_part;       /* K segments' partials [item][segment][G4C_FP_SLOT] */
    int *fp_cnt;          /* [band · token blocks] segments finished (back to 0 once added) */
    float *qn;            /* [max_batch][n_heads · max d] the wide kernels' normed, roped queries */
    int imma;             /* 1: per-channel 4-bit stages run on the integer tensor cores
                             (forward.cuh mm_tile_iq; G4_CUDA_IMMA=1 at creation) */
    int stage_pf;         /* the staged decode: row-team items of its own matmul stage each block asks
                             into L2 before it waits for the previous stage (0: none) */
    unsigned long long *strace; /* not NULL: the staged decode's trace, per stage (g4c_op.idx) and block
                                   (G4C_MAXB per stage) [start, wait returned, input built, end] in
                                   global-timer ns, 0 where a stage has no such point (benchmark
                                   instrumentation: session.cu g4_cuda_staged_trace) */
    int mm_pipe;          /* 1: matmul tiles of up to 4 tokens load each group of chunks before the group
                             before it is computed (forward.cuh mm_tile_pipe; G4_CUDA_PIPE=0: off); 2:
                             also, in the staged decode's one-token stages, the first group before the
                             wait for the stage before (mm_stage_early; verify blocks of 2..4 tokens:
                             mm_stage_early_v) */
    int attn_pre;         /* the staged decode: an attention stage copies its first item's K/V rows of
                             earlier positions before it waits for the previous stage (forward.cuh op_attn) */
    int attn_cl;          /* > 1: this attention stage runs in clusters of attn_cl blocks, a cluster per
                             (token, query head) where its chunks fit one (forward.cuh op_attn) */
    int ring_slots;       /* the staged ring kernel (mm_ring): slots per warp where fewer than its type's
                             (G4C_RING_R_*) fit beside a wide input tile; 0: the type's; rings lie R slots apart */
    int team_spread;      /* 1: a matmul stage's row teams are numbered warp-major (team t of block b is
                             t·blocks + b), so that a stage with fewer items than teams, or a last
                             partial round, spreads over every block instead of filling the first blocks
                             (forward.cuh team_first; G4_CUDA_TEAM_SPREAD); 0: block-major. Items are
                             whole rows either way: the same outputs bit for bit */
    int amark;            /* the staged trace (strace): the point of an attention item's chain marked as
                             its point 2 (forward.cuh op_attn: 1 rows and query staged, 2 softmax, 3 V
                             sums, 4 chunk counter, 5 combine; 0: none) */
} g4c_params;
#endif
