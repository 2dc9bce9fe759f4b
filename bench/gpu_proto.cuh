/* Pieces shared by the standalone GPU decode prototypes (gpu_lean_decode.cu, gpu_pdl_chain.cu).
 * Their dot-product loops stay written out in each: moving gpu_pdl_chain's into shared inline
 * functions (the same operations) made its E4B bf16 token 18% slower on an H100 (4.44 -> 5.23 ms,
 * alternating runs in one call), so the loops' exact shape is part of what was measured. */
#ifndef G4_BENCH_GPU_PROTO_CUH
#define G4_BENCH_GPU_PROTO_CUH
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

__device__ static inline uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Orders the generic-proxy accesses of shared memory before it (this thread's; after a block
 * barrier, everyone's) before later bulk copies' writes: before refilling a slot that was read. */
__device__ static inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* One bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) into shared memory,
 * completing on the mbarrier mb. */
__device__ static inline void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *mb) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(mb)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(mb))
                 : "memory");
}

#endif
