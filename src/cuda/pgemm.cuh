/* Device pieces shared by the prefill GEMM's kernels (pgemm.cu: mma.sync, pgemm_wg.cu: wgmma), so
 * that both variants split K and finish each output exactly alike. */
#ifndef G4_CUDA_PGEMM_CUH
#define G4_CUDA_PGEMM_CUH
#include "cuda/forward.cuh"
#include "cuda/internal.h"

/* Programmatic dependent launch (Hopper) for the prefill's own kernels (GEMMs, attention, input
 * phases): a kernel first lets the next one on the stream start launching (its blocks become
 * resident as this one's leave) and then waits until the one before it has finished and its writes
 * are visible, before it reads anything. Every block of every such kernel waits first thing, so no
 * kernel completes before its predecessor and the stream's order of writes holds transitively;
 * what is hidden is the launch latency between dependent kernels. Launched without the attribute
 * (pdl_launch with on = 0, or the persistent kernel before or after), both are no-ops. */
DEV void pdl_enter() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
}
template <typename... P, typename... A>
static inline cudaError_t pdl_launch(int on, void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
    g4c_pdl_cfg x;
    g4c_pdl_config(&x, on, grid, block, smem, s);
    return cudaLaunchKernelEx(&x.c, k, args...);
}

/* one value's three bf16 terms at x[i], x[ts + i], x[2ts + i]: split_bf16's (the low halves hold v's) */
DEV void pg_terms(unsigned short *x, size_t ts, size_t i, float v) {
    unsigned h, md, l;
    split_bf16(v, v, h, md, l);
    x[i] = (unsigned short)h;
    x[ts + i] = (unsigned short)md;
    x[2 * ts + i] = (unsigned short)l;
}

/* One finished output (row r, token m; the row's scale already applied): the stage's epilogue,
 * the same operations as forward.cuh mm_store / fp_store (a PLE gate and a GELU pair's gate are
 * both gelu(v) times their aux row: the PLE input, or the pair's up projection) */
DEV void pg_store(const g4c_pg_epi &e, int m, int r, float v) {
    if (e.kind != G4C_PG_STORE) v = gelu_tanh(v) * e.aux[(size_t)m * e.ld_aux + r];
    e.y[(size_t)m * e.ldy + r] = v;
    if (e.y2) e.y2[(size_t)m * e.ldy + r] = v;
    if (e.xt) pg_terms(e.xt, e.xts, (size_t)m * e.xld + r, v);
}

/* The 32-column k-steps [*kb, *ke) of K segment z of S (S = g4c_pgemm_segments(N, K): a function of
 * the shape only, so which steps a segment sums never depends on M or on the block) */
DEV void pg_segment(int K, int z, int S, int *kb, int *ke) {
    const int nks = K / 32;
    *kb = (int)((long long)z * nks / S);
    *ke = (int)((long long)(z + 1) * nks / S);
}
#endif
