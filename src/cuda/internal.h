/* Between the CUDA backend's host code (session.cu) and its kernels (forward.cu,
 * forward.cuh). */
#ifndef G4_CUDA_INTERNAL_H
#define G4_CUDA_INTERNAL_H
#include <cuda_runtime.h>
#include <stddef.h>

#include "cuda/program.h"
extern "C" {
#include "util/error.h"
}

/* A CUDA error as the engine's: out of memory as G4_ERR_NOMEM, the rest as G4_ERR_IO, naming
 * what failed (session.cu). */
g4_status g4_cuda_fail(g4_error *err, cudaError_t e, const char *what);

/* One non-shared layer's cache for the commit kernel. */
typedef struct g4c_kvlayer {
    float *kst, *vst, *kc, *vc;
    int row, cap;
} g4c_kvlayer;

/* The persistent kernel's launch shape on this device: blocks per grid and dynamic shared bytes. */
cudaError_t g4c_kernel_shape(int device, int *grid, size_t *smem_bytes, int *smem_in_floats);
/* The persistent kernel's instantiations (forward.cuh g4c_kernel<mask>), smallest first: a launch
 * takes the first whose mask covers its stages (forward.cu g4c_launch). Each is compiled in its own
 * translation unit (src/cuda/inst/kernel.cu with -DG4C_INST=i), so they build in parallel. */
#define G4C_N_INST 13
#define G4C_INST_MASKS                                                                                    \
    {G4C_KM_DENSE, G4C_KM_DENSE | G4C_KM_MMA, G4C_KM_DENSE | G4C_KM_Q4, G4C_KM_DENSE | G4C_KM_Q8, G4C_KM_ALL, \
     G4C_KM_DENSE | G4C_KM_WIDE, G4C_KM_DENSE | G4C_KM_Q4 | G4C_KM_WIDE, G4C_KM_DENSE | G4C_KM_Q8 | G4C_KM_WIDE,   \
     G4C_KM_ALL | G4C_KM_WIDE, G4C_KM_DENSE | G4C_KM_Q4 | G4C_KM_IQ, G4C_KM_ALL | G4C_KM_IQ,                \
     G4C_KM_DENSE | G4C_KM_Q4 | G4C_KM_IQ | G4C_KM_WIDE, G4C_KM_ALL | G4C_KM_IQ | G4C_KM_WIDE}
/* The staged decode (forward.cuh g4c_stage_kernel, stage.cu): a program of M < G4C_WIDE_M tokens
 * (one-token steps, verify blocks) as one launch per stage. g4c_stage_inst: the instantiation for a
 * program's kernel mask and token count (-1: none takes it); mm: the kernel for matmul stages (1:
 * two blocks per SM, one-token instantiations only; 2: one; 3: weight rings, one token), the one
 * for attention stages held to half an SM (4) or the one for the others (0);
 * g4c_stage_blocks: its resident blocks per SM with smem_bytes of dynamic shared memory (and sets
 * that size as its maximum); g4c_stage_clusters: how many clusters of cl blocks of kernel mm can be
 * resident at once (0: none); g4c_stage_launch: stage s of p (p->smem_in_floats for this launch),
 * with programmatic dependent launch when pdl, in clusters of p->attn_cl blocks when that is > 1. */
#define G4C_N_STAGE 8
int g4c_stage_inst(unsigned kmask, int M);
cudaError_t g4c_stage_blocks(int inst, int mm, size_t smem_bytes, int *per_sm);
cudaError_t g4c_stage_clusters(int inst, int mm, size_t smem_bytes, int cl, int *clusters);
cudaError_t g4c_stage_launch(int inst, int mm, const g4c_params *p, int s, int grid, size_t smem_bytes, int pdl, cudaStream_t stream);
/* One launch of the program in p (cooperative: every block resident). */
cudaError_t g4c_launch(const g4c_params *p, int grid, size_t smem_bytes, cudaStream_t stream);
/* Copies staged rows [0, n) of every layer into its cache at positions stage_pos.. */
cudaError_t g4c_commit(const g4c_kvlayer *layers, int n_layers, int max_row, int stage_pos, int n,
                       cudaStream_t stream);
/* Device-to-device streaming read of n floats (bandwidth probe); sink receives a checksum. */
/* out[pos][i] = (cos, sin)(pos · inv[i]) in double, rounded to float, for pos < n_ctx, i < pairs */
cudaError_t g4c_rope_fill(const double *inv, int pairs, int n_ctx, float *out, cudaStream_t stream);
cudaError_t g4c_read_probe(const float4 *src, size_t n4, float *sink, int grid, cudaStream_t stream);

/* The prefill GEMM (pgemm.cu) as a matmul stage of a fast prefill: the epilogue applied to each
 * finished output (token m, row r) - the stage's own (forward.cuh mm_store, fp_store) */
enum { G4C_PG_STORE, G4C_PG_PLE_GATE, G4C_PG_GELU_PAIR };
typedef struct g4c_pg_epi {
    int kind;
    float *y;          /* y[m * ldy + r] */
    int ldy;
    float *y2;         /* optional second copy, same layout */
    const float *aux;  /* PLE_GATE: the gate's multiplier; GELU_PAIR: the up projection (this launch
                          is the gate's): y = gelu(v) · aux[m * ld_aux + r] */
    int ld_aux;
    unsigned short *xt; /* not NULL: the next GEMM's input terms too - split_bf16 of the stored value
                           at xt + t·xts + m·xld + r (t = 0, 1, 2), as the persistent kernel's
                           fp_prep would write them for a plain input (session.cu pg_build) */
    size_t xts;
    int xld;
    int pdl;            /* launch with programmatic dependent launch (pgemm.cuh pdl_launch) */
} g4c_pg_epi;
/* Sets the kernels' shared-memory size (once per process and device, before launches). */
cudaError_t g4c_pgemm_init(void);
/* K segments of an N x K matrix (a function of the shape only); > 1: the launch needs
 * part of segments x M x N floats. */
int g4c_pgemm_segments(int N, int K);
/* y = W x for M tokens whose inputs are the three bf16 terms at x (term t of token m at
 * x + t·ts + m·ldx); W bf16 row-major or per-channel signed 4-bit rows with one f32 scale (no
 * bias); queued on stream. */
cudaError_t g4c_pgemm_launch(const unsigned short *x, size_t ts, int ldx, int M, const g4c_mat *w, const g4c_pg_epi *epi,
                             float *part, cudaStream_t stream);
/* The second half of a launch split into S > 1 segments: each output the sum of part[0..S) in
 * segment order (times the row's scale for 4-bit rows), then the epilogue (pgemm.cu). */
cudaError_t g4c_pgemm_reduce_launch(const float *part, int S, int M, const g4c_mat *w, const g4c_pg_epi *epi, cudaStream_t stream);
/* g4c_pgemm_launch on Hopper's wgmma (pgemm_wg.cu), for the same weights - bf16 or per-channel
 * signed 4-bit rows (cudaErrorInvalidValue for other types): the same arguments, segments, partial
 * sums and epilogue; its own bits (not those of the mma.sync kernel), the same for any M.
 * g4c_pgemm_wg_init: its shared-memory sizes (once per process and device, before launches). */
cudaError_t g4c_pgemm_wg_init(void);
cudaError_t g4c_pgemm_wg_launch(const unsigned short *x, size_t ts, int ldx, int M, const g4c_mat *w, const g4c_pg_epi *epi,
                                float *part, cudaStream_t stream);

/* A fast prefill's attention (pattn.cu) for a stage of the wide kernels' layout whose queries (q:
 * p.qn or op->q) and own K/V rows are in place: op->att for tokens pos0 .. pos0 + M - 1. */
cudaError_t g4c_pattn_init(void);
int g4c_pattn_ok(const g4c_op *op); /* the stage is one it takes */
/* A fast prefill's input phases as launches of their own (pprep.cu): a matmul stage's input terms
 * (g4c_pprep_ok: one fp_prep_warp takes) and an attention stage's norms and ropes of its queries
 * and own K/V rows (g4c_pprep_attn_ok), for p->M tokens at pos0; d_op: the stage on the device,
 * op: the same on the host. g4c_pprep_init: the kernels' shared-memory sizes (once per process
 * and device, before launches). */
cudaError_t g4c_pprep_init(void);
int g4c_pprep_ok(const g4c_op *op);
int g4c_pprep_attn_ok(const g4c_op *op);
cudaError_t g4c_pprep_launch(const g4c_op *d_op, const g4c_op *op, const g4c_params *p, cudaStream_t stream, int pdl);
cudaError_t g4c_pprep_attn_launch(const g4c_op *d_op, const g4c_op *op, const g4c_params *p, int pos0, cudaStream_t stream, int pdl);
/* kb: the variant: 0 the tensor-core kernel (the SIMT one with 32-key blocks where it
 * cannot take the head width: d not a multiple of 16, 32 or 64 for heads up to 128, 256, 512), 1
 * the tensor-core kernel with each row's keys in 4 partitions by absolute key block (more blocks
 * for short chunks), then a merge launch (its own bits, also independent of the chunk size; the
 * same fallback as 0), 32 the SIMT kernel in 32-key blocks, 64 the SIMT kernel in 64-key blocks
 * for heads 129..256 wide */
/* xt (not NULL): the outputs also as the next GEMM's input terms (pgemm.cuh pg_terms; term t of
 * token m at xt + t·xts + m·xld); pdl: programmatic dependent launch (pgemm.cuh pdl_launch);
 * scratch: kb = 1's partial sums, device memory of scratch_floats floats, 16-byte aligned, at
 * least g4c_pattn_scratch_floats(op, M) (else cudaErrorInvalidValue where kb = 1 uses it); free
 * for other use once the launch's work is done (it holds nothing between launches) */
cudaError_t g4c_pattn_launch(const g4c_op *op, const float *q, int pos0, int M, cudaStream_t stream, int kb = 0,
                             unsigned short *xt = NULL, size_t xts = 0, int xld = 0, int pdl = 0, float *scratch = NULL,
                             size_t scratch_floats = 0);
/* kb = 1's scratch for launches of up to max_M tokens of the stage: max_M·n_heads·4·(d + 2) floats */
size_t g4c_pattn_scratch_floats(const g4c_op *op, int max_M);
#endif
