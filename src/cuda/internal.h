/* Between the CUDA backend's host code (session.cu) and its kernels (forward.cu). */
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
