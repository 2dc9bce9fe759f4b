/* A fast prefill's input phases as small launches of their own (session.cu pg_build): when nothing
 * but a stage's first phase stands between two launches of the prefill GEMM or attention, that
 * phase runs here instead of in a launch of the persistent kernel (a cooperative launch of the
 * whole kernel cost ~30 us on the H200 for a few microseconds of work). The device code is the
 * persistent kernel's own (forward.cuh fp_prep_warp: a warp per token builds a matmul's input
 * terms; attn_prep_rows: a warp per query head or own K/V row norms and ropes it), so the values
 * are the same bits whichever kernel ran them. */
#include <cuda_runtime.h>

#include "cuda/forward.cuh"
#include "cuda/internal.h"
#include "cuda/pgemm.cuh"

namespace {
/* a matmul's input terms: shared memory of a warp's row per warp (normed inputs), none for plain ones */
size_t pprep_smem(const g4c_op *op) {
    return op->in.kind == G4C_IN_NORM ? sizeof(float) * G4C_WARPS * (size_t)op->part[0].w.cols : 0;
}
constexpr size_t PPREP_MAX_SMEM = 200 * 1024;
} // namespace

__global__ void __launch_bounds__(G4C_THREADS) g4c_pprep_kernel(const g4c_op *op, const __grid_constant__ g4c_params p) {
    extern __shared__ __align__(16) float pp_sm[];
    pdl_enter();
    fp_prep_warp(op, p, 0, pp_sm);
}

__global__ void __launch_bounds__(G4C_THREADS) g4c_pprep_attn_kernel(const g4c_op *op, const __grid_constant__ g4c_params p,
                                                                     int pos0) {
    extern __shared__ __align__(16) float pp_sm[];
    pdl_enter();
    attn_prep_rows(op, p, pos0, pp_sm);
}

cudaError_t g4c_pprep_init(void) {
    cudaError_t e = cudaFuncSetAttribute(g4c_pprep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PPREP_MAX_SMEM);
    if (!e) e = cudaFuncSetAttribute(g4c_pprep_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)(sizeof(float) * G4C_WARPS * G4C_MAXD));
    return e;
}

int g4c_pprep_ok(const g4c_op *op) {
    return op->kind == G4C_OP_MATMUL && op->fp_ks > 0 && op->in.kind != G4C_IN_CONCAT && !(op->part[0].w.flags & G4C_QF_BIAS) &&
           pprep_smem(op) <= PPREP_MAX_SMEM;
}

int g4c_pprep_attn_ok(const g4c_op *op) { return op->kind == G4C_OP_ATTN && op->heads && !op->drafter; }

cudaError_t g4c_pprep_launch(const g4c_op *d_op, const g4c_op *op, const g4c_params *p, cudaStream_t stream, int pdl) {
    g4c_params q = *p;
    const size_t smem = pprep_smem(op);
    q.smem_in_floats = (int)(smem / sizeof(float)); /* plain rows need none (fp_prep_warp checks normed ones only) */
    return pdl_launch(pdl, g4c_pprep_kernel, dim3((q.M + G4C_WARPS - 1) / G4C_WARPS), dim3(G4C_THREADS), smem, stream, d_op, q);
}

cudaError_t g4c_pprep_attn_launch(const g4c_op *d_op, const g4c_op *op, const g4c_params *p, int pos0, cudaStream_t stream,
                                  int pdl) {
    const int per = op->n_heads + (op->qkv_own ? 2 * op->n_kv : 0);
    const long long items = (long long)p->M * per;
    return pdl_launch(pdl, g4c_pprep_attn_kernel, dim3((unsigned)((items + G4C_WARPS - 1) / G4C_WARPS)), dim3(G4C_THREADS),
                      sizeof(float) * G4C_WARPS * G4C_MAXD, stream, d_op, *p, pos0);
}
