/* The staged decode's launch side (forward.cuh g4c_stage_kernel): its instantiations, their
 * launch shape per stage, and one stage's launch. */
#include "cuda/forward.cuh"

/* the weight masks a one-token program can need, smallest first (the tensor-core procedures and
 * the wide kernels are not for single tokens) */
static constexpr unsigned g4c_stage_masks[G4C_N_STAGE] = {
    G4C_KM_DENSE | G4C_KM_M1, G4C_KM_DENSE | G4C_KM_Q4 | G4C_KM_M1, G4C_KM_DENSE | G4C_KM_Q8 | G4C_KM_M1,
    G4C_KM_DENSE | G4C_KM_Q4 | G4C_KM_Q8 | G4C_KM_M1};
/* per instantiation: [0] every stage kind but matmuls (one block per SM: attention's 512-wide heads
 * need the registers and the shared memory), [1] matmul stages, two blocks per SM, [2] matmul
 * stages, one block per SM */
#define G4C_STAGE_PAIR(i) \
    {g4c_stage_fn<g4c_stage_masks[i], 0>(), g4c_stage_fn<g4c_stage_masks[i], 1>(), g4c_stage_fn<g4c_stage_masks[i], 2>()}
static const void *const g4c_stage_fns[G4C_N_STAGE][3] = {G4C_STAGE_PAIR(0), G4C_STAGE_PAIR(1), G4C_STAGE_PAIR(2),
                                                          G4C_STAGE_PAIR(3)};

int g4c_stage_inst(unsigned kmask) {
    if (kmask & (G4C_KM_MMA | G4C_KM_IQ)) return -1;
    for (int i = 0; i < G4C_N_STAGE; i++)
        if ((kmask & ~g4c_stage_masks[i] & ~(unsigned)G4C_KM_M1) == 0) return i;
    return -1;
}

cudaError_t g4c_stage_blocks(int inst, int mm, size_t smem_bytes, int *per_sm) {
    if (inst < 0 || inst >= G4C_N_STAGE || mm < 0 || mm > 2) return cudaErrorInvalidValue;
    const void *fn = g4c_stage_fns[inst][mm];
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
    if (e) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, fn, G4C_THREADS, smem_bytes);
}

cudaError_t g4c_stage_launch(int inst, int mm, const g4c_params *p, int s, int grid, size_t smem_bytes, int pdl, cudaStream_t stream) {
    if (inst < 0 || inst >= G4C_N_STAGE || mm < 0 || mm > 2) return cudaErrorInvalidValue;
    g4c_pdl_cfg x;
    g4c_pdl_config(&x, pdl, dim3(grid), dim3(G4C_THREADS), smem_bytes, stream);
    void *args[] = {(void *)p, (void *)&s};
    return cudaLaunchKernelExC(&x.c, g4c_stage_fns[inst][mm], args);
}
