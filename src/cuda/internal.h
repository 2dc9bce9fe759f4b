/* Between the CUDA backend's host code (session.cu) and its kernels (forward.cu,
 * forward.cuh). */
#ifndef G4_CUDA_INTERNAL_H
#define G4_CUDA_INTERNAL_H
#include <cuda_runtime.h>

#include "cuda/program.h"

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
/* One launch of the program in p (cooperative: every block resident). */
cudaError_t g4c_launch(const g4c_params *p, int grid, size_t smem_bytes, cudaStream_t stream);
/* Copies staged rows [0, n) of every layer into its cache at positions stage_pos.. */
cudaError_t g4c_commit(const g4c_kvlayer *layers, int n_layers, int max_row, int stage_pos, int n,
                       cudaStream_t stream);
/* Device-to-device streaming read of n floats (bandwidth probe); sink receives a checksum. */
/* out[pos][i] = (cos, sin)(pos · inv[i]) in double, rounded to float, for pos < n_ctx, i < pairs */
cudaError_t g4c_rope_fill(const double *inv, int pairs, int n_ctx, float *out, cudaStream_t stream);
cudaError_t g4c_read_probe(const float4 *src, size_t n4, float *sink, int grid, cudaStream_t stream);
#endif
