/* The staged decode's launch side (forward.cuh g4c_stage_kernel): its instantiations, their
 * launch shape per stage, and one stage's launch. */
#include "cuda/forward.cuh"

/* the weight masks a program can need, smallest first: [0, 4) for one token (only the one-token tile
 * compiled), [4, 8) for blocks of 2 .. G4C_WIDE_M - 1 tokens (verify blocks; every tile of the
 * persistent kernel's narrow instantiations). The tensor-core procedures and the wide kernels have
 * none. */
static constexpr unsigned g4c_stage_masks[G4C_N_STAGE] = {
    G4C_KM_DENSE | G4C_KM_M1, G4C_KM_DENSE | G4C_KM_Q4 | G4C_KM_M1, G4C_KM_DENSE | G4C_KM_Q8 | G4C_KM_M1,
    G4C_KM_DENSE | G4C_KM_Q4 | G4C_KM_Q8 | G4C_KM_M1, G4C_KM_DENSE, G4C_KM_DENSE | G4C_KM_Q4, G4C_KM_DENSE | G4C_KM_Q8,
    G4C_KM_DENSE | G4C_KM_Q4 | G4C_KM_Q8};
/* the two-blocks-per-SM matmul kernel exists for one token only; blocks of tokens take the one-block one */
template <unsigned TM> const void *g4c_stage_fn_mm1() {
    if constexpr ((TM & G4C_KM_M1) != 0) return g4c_stage_fn<TM, 1>();
    else return g4c_stage_fn<TM, 2>();
}
/* the ring kernel (mm_ring): one token, or a verify block's 2..4 tokens of bf16 rows */
template <unsigned TM> const void *g4c_stage_fn_ring() { return g4c_stage_fn<TM, 3>(); }
/* per instantiation: [0] every stage kind but matmuls (one block per SM: attention's 512-wide heads
 * need the registers and the shared memory), [1] matmul stages, two blocks per SM, [2] matmul
 * stages, one block per SM, [3] matmul stages through weight rings in shared memory
 * (one-token ones half an SM; verify blocks' bf16 ones a whole SM),
 * [4] attention stages whose items fit half an SM (128 registers) */
#define G4C_STAGE_ROW(i) \
    {g4c_stage_fn<g4c_stage_masks[i], 0>(), g4c_stage_fn_mm1<g4c_stage_masks[i]>(), g4c_stage_fn<g4c_stage_masks[i], 2>(), \
     g4c_stage_fn_ring<g4c_stage_masks[i]>(), g4c_stage_fn<g4c_stage_masks[i], 4>()}
static const void *const g4c_stage_fns[G4C_N_STAGE][5] = {G4C_STAGE_ROW(0), G4C_STAGE_ROW(1), G4C_STAGE_ROW(2),
                                                          G4C_STAGE_ROW(3), G4C_STAGE_ROW(4), G4C_STAGE_ROW(5),
                                                          G4C_STAGE_ROW(6), G4C_STAGE_ROW(7)};

int g4c_stage_inst(unsigned kmask, int M) {
    if ((kmask & (G4C_KM_MMA | G4C_KM_IQ)) || M < 1 || M >= G4C_WIDE_M) return -1;
    const int first = M == 1 ? 0 : G4C_N_STAGE / 2;
    for (int i = first; i < first + G4C_N_STAGE / 2; i++)
        if ((kmask & ~g4c_stage_masks[i] & ~(unsigned)G4C_KM_M1) == 0) return i;
    return -1;
}

cudaError_t g4c_stage_blocks(int inst, int mm, size_t smem_bytes, int *per_sm) {
    if (inst < 0 || inst >= G4C_N_STAGE || mm < 0 || mm > 4) return cudaErrorInvalidValue;
    const void *fn = g4c_stage_fns[inst][mm];
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
    if (e) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, fn, G4C_THREADS, smem_bytes);
}

/* a launch attribute: clusters of cl blocks along x */
static cudaLaunchAttribute cluster_dim(int cl) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = (unsigned)cl;
    at.val.clusterDim.y = 1;
    at.val.clusterDim.z = 1;
    return at;
}

/* clusters of more than 8 blocks are the non-portable sizes (H100: up to 16), allowed per kernel */
static cudaError_t cluster_attr(const void *fn, int cl) {
    return cl > 8 ? cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) : cudaSuccess;
}

cudaError_t g4c_stage_clusters(int inst, int mm, size_t smem_bytes, int cl, int *clusters) {
    *clusters = 0;
    if (inst < 0 || inst >= G4C_N_STAGE || mm < 0 || mm > 4 || cl < 2 || cl > 16) return cudaErrorInvalidValue;
    const void *fn = g4c_stage_fns[inst][mm];
    cudaError_t e = cluster_attr(fn, cl);
    if (e) return e;
    cudaLaunchAttribute at = cluster_dim(cl);
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3((unsigned)(cl * 64));
    c.blockDim = dim3(G4C_THREADS);
    c.dynamicSmemBytes = smem_bytes;
    c.attrs = &at;
    c.numAttrs = 1;
    return cudaOccupancyMaxActiveClusters(clusters, fn, &c);
}

cudaError_t g4c_stage_launch(int inst, int mm, const g4c_params *p, int s, int grid, size_t smem_bytes, int pdl, cudaStream_t stream) {
    if (inst < 0 || inst >= G4C_N_STAGE || mm < 0 || mm > 4) return cudaErrorInvalidValue;
    g4c_pdl_cfg x;
    g4c_pdl_config(&x, pdl, dim3(grid), dim3(G4C_THREADS), smem_bytes, stream);
    if (p->attn_cl > 1) { /* an attention stage in clusters (forward.cuh op_attn) */
        if (grid % p->attn_cl) return cudaErrorInvalidValue;
        x.at[1] = cluster_dim(p->attn_cl);
        x.c.numAttrs = 2;
    }
    void *args[] = {(void *)p, (void *)&s};
    return cudaLaunchKernelExC(&x.c, g4c_stage_fns[inst][mm], args);
}
