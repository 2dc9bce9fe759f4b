/* Device pieces shared by the prefill GEMM's kernels (pgemm.cu: mma.sync, pgemm_wg.cu: wgmma), so
 * that both variants split K and finish each output exactly alike. */
#ifndef G4_CUDA_PGEMM_CUH
#define G4_CUDA_PGEMM_CUH
#include "cuda/forward.cuh"
#include "cuda/internal.h"

/* One finished output (row r, token m; the row's scale already applied): the stage's epilogue,
 * the same operations as forward.cuh mm_store / fp_store (a PLE gate and a GELU pair's gate are
 * both gelu(v) times their aux row: the PLE input, or the pair's up projection) */
DEV void pg_store(const g4c_pg_epi &e, int m, int r, float v) {
    if (e.kind != G4C_PG_STORE) v = gelu_tanh(v) * e.aux[(size_t)m * e.ld_aux + r];
    e.y[(size_t)m * e.ldy + r] = v;
    if (e.y2) e.y2[(size_t)m * e.ldy + r] = v;
}

/* The 32-column k-steps [*kb, *ke) of K segment z of S (S = g4c_pgemm_segments(N, K): a function of
 * the shape only, so which steps a segment sums never depends on M or on the block) */
DEV void pg_segment(int K, int z, int S, int *kb, int *ke) {
    const int nks = K / 32;
    *kb = (int)((long long)z * nks / S);
    *ke = (int)((long long)(z + 1) * nks / S);
}
#endif
