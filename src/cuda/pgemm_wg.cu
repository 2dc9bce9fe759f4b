/* The prefill GEMM (pgemm.cu) on Hopper's warpgroup tensor-core instruction, wgmma.mma_async
 * (sm_90a), for bf16 weights: Y[m][r] = sum_k W[r][k] · x[m][k] with each input row given as the
 * three bf16 terms x = h + mid + l. A drop-in alternative to pgemm.cu's mma.sync kernel: the same
 * arguments, the same K segments (g4c_pgemm_segments), the same partial sums and reduction
 * (g4c_pgemm_reduce_launch) and the same epilogue (pgemm.cuh pg_store).
 *
 * Why: the mma.sync kernel is issue-bound (ncu: tensor pipe ~32% busy, mostly waits on the
 * fragments just loaded by ldmatrix). wgmma reads both operands straight from shared memory, one
 * instruction per 64 x 128 x 16 product of a warpgroup, and runs asynchronously while the warps
 * issue the next chunk's copies.
 *
 * Tile and pipeline: a block (256 threads, two warpgroups) owns 128 weight rows x 128 tokens over
 * its K segment; warpgroup g computes rows 64g..64g+63 against all 128 tokens (one m64n128k16
 * accumulator: 64 f32 registers a thread). K is staged in chunks of 64 columns (PGW_NBUF buffers
 * of 16 KB of weights + 3 x 16 KB of input terms) by cp.async from every thread. A warpgroup ends
 * a chunk with wgmma.wait_group PGW_WAIT: with 1 (default) the chunk's wgmma group stays in flight
 * while the warps wait for the next chunk's copies and issue its wgmma, so a buffer may be refilled
 * only after the chunk following its own has been waited for, and the copies run PGW_AHEAD =
 * PGW_NBUF - 1 - PGW_WAIT chunks ahead (3 buffers, the most that fit: 1 chunk ahead; PGW_WAIT 0:
 * 2 ahead, the tensor pipe drained at every chunk). Order of a chunk: every thread waits for its copies
 * of the chunk (cp.async.wait_group), makes them visible to the async proxy that wgmma reads
 * through (fence.proxy.async), then __syncthreads: the chunk is in for everyone, and every
 * warpgroup has passed its wgmma.wait_group of the iteration before, so the buffer of the chunk
 * PGW_WAIT + 1 back is no longer read by any wgmma and may be refilled.
 *
 * Shared-memory layout (PTX ISA, "Shared Memory Matrix Layout" and "Matrix Descriptor Format" of
 * wgmma.mma_async): both operands are K-major (imm-trans-a = imm-trans-b = 0: A = weights, M x K
 * with K contiguous in a weight row; B = input terms, K x N with K contiguous in a token's row),
 * so one layout serves both. The descriptor is 64 bits: bits 13-0 the start address, 29-16 the
 * leading dimension byte offset (LBO), 45-32 the stride dimension byte offset (SBO), each encoded
 * as (x & 0x3FFFF) >> 4; bits 51-49 the base offset; bits 63-62 the swizzle mode (0 none, 1 128B).
 *   PGW_SWIZZLE 1 (default), 128-byte swizzle: a staged row is its 64 columns = 128 bytes, rows
 *     one after another, so 8 rows form one 1024-byte swizzle atom (K-major 128B atom: 8 x 8
 *     16-byte elements); inside an atom, 16-byte piece q of row i is stored at piece q ^ i (the
 *     128B pattern: address bits 6-4 XOR bits 9-7). Every atom starts on a 1024-byte boundary
 *     (base offset 0). SBO = 1024, the distance between the atoms of consecutive groups of 8
 *     rows; LBO is unused for swizzled K-major layouts ("assumed 1"): encoded 1. The k16 piece p of
 *     the chunk (its bytes 32p..32p+31 of every row) starts 32p bytes into the atom: the hardware
 *     applies the XOR to the address it forms, so the start address just advances by 32 bytes.
 *   PGW_SWIZZLE 0, no swizzle: "core matrices" of 8 rows x 16 bytes (128 contiguous bytes, row i
 *     at +16i); core matrix (row group G, piece q) at (8G + q)·128. LBO = 128, the distance
 *     between the two K-adjacent core matrices of a k16 piece; SBO = 1024, the distance between
 *     row groups; piece p starts 256p bytes in.
 * A chunk's buffer: weights (128 rows) at 0, term t's 128 token rows at 16 KB·(1 + t); warpgroup
 * g's A at 8 KB·g. The dynamic shared memory is rounded up to a 1024-byte boundary in the kernel.
 *
 * Accumulator (PTX ISA, register fragments of wgmma .m64nNk16, f32 D): warp w of the warpgroup
 * holds rows 16w..16w+15; register i of lane (g = lane / 4, t = lane % 4) is row 16w + g + 8·(i/2
 * % 2), column 8·(i / 4) + 2t + i % 2 - rows are weight rows, columns tokens.
 *
 * Exactness: every output is one accumulator of one m64n128k16 instruction sequence: per chunk the
 * k16 pieces in ascending order, per piece the products with h, mid and l in that order (three
 * wgmma, accumulating), chunks ascending over the segment. Every instruction has the same shape
 * (N = 128 tokens, always; a partial token tile repeats token M - 1, a partial row tile row N - 1,
 * as the mma.sync kernel does), so a token's outputs do not depend on M or on where it falls in
 * the tiles; a segment whose last chunk holds one k-step ends with that chunk's two pieces, for
 * every token alike. The accumulators start at +0.0 and every wgmma accumulates (scale-d = 1). The
 * bits need not be those of the mma.sync kernel (other instructions, whose internal sum order may
 * differ), only those of this kernel for any M. */
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "cuda/internal.h"
#include "cuda/pgemm.cuh"

#ifndef PGW_SWIZZLE
#define PGW_SWIZZLE 1
#endif
#ifndef PGW_NBUF
#define PGW_NBUF 3
#endif
#ifndef PGW_WAIT
#define PGW_WAIT 1 /* wgmma groups a warpgroup leaves in flight at the end of a chunk (0 or 1) */
#endif

namespace {
constexpr int PGW_BM = 128;                           /* weight rows per block (two warpgroups of 64) */
constexpr int PGW_BN = 128;                           /* tokens per block: the wgmma N, fixed */
constexpr int PGW_KC = 64;                            /* columns per staged chunk: 128 bytes a row */
constexpr int PGW_THREADS = 256;
constexpr int PGW_ROWB = PGW_KC * 2;                  /* bytes of a staged row */
constexpr int PGW_WS = PGW_BM * PGW_ROWB;             /* bytes of a chunk's weights (16 KB) */
constexpr int PGW_XT = PGW_BN * PGW_ROWB;             /* bytes of a chunk's term (16 KB) */
constexpr int PGW_STAGE = PGW_WS + G4C_FP_TERMS * PGW_XT; /* 64 KB */
constexpr int PGW_AHEAD = PGW_NBUF - 1 - PGW_WAIT;    /* chunks the copies run ahead */
constexpr size_t PGW_SMEM = (size_t)PGW_NBUF * PGW_STAGE + 1024; /* + rounding to 1024 bytes */
constexpr int PGW_PSTEP = PGW_SWIZZLE ? 32 : 256;     /* bytes from one k16 piece to the next */
/* descriptor bits above the start address: LBO, SBO (encoded >> 4) and the swizzle mode */
constexpr uint64_t PGW_DESC = ((uint64_t)((PGW_SWIZZLE ? 16 : 128) >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
                              ((uint64_t)(PGW_SWIZZLE ? 1 : 0) << 62);
static_assert(PGW_AHEAD >= 1, "the pipeline needs PGW_NBUF >= PGW_WAIT + 2");
static_assert(PGW_SMEM <= 227 * 1024, "more shared memory than a block can have");
static_assert(PGW_THREADS == 2 * 128 && PGW_BM == 2 * 64, "two warpgroups of 64 rows");
} // namespace

/* byte offset of 16-byte piece q (0..7) of staged row r in an operand's area (see the layout above) */
DEV int pgw_off(int r, int q) {
    if (PGW_SWIZZLE) return r * PGW_ROWB + ((q ^ (r & 7)) << 4);
    return ((r >> 3) * 8 + q) * 128 + ((r & 7) << 4);
}
/* the row and piece copied by the thread's f-th 16-byte copy of an operand: 8 consecutive copies
 * fill one 128-byte line of shared memory (a swizzled row, or a core matrix), so a warp's 16-byte
 * stores fall on distinct banks */
DEV void pgw_piece(int f, int &r, int &q) {
    if (PGW_SWIZZLE) {
        r = f >> 3;
        q = f & 7;
    } else {
        r = ((f >> 6) << 3) | (f & 7);
        q = (f >> 3) & 7;
    }
}

DEV uint64_t pgw_desc(uint32_t saddr) { return PGW_DESC | (uint64_t)((saddr & 0x3FFFFu) >> 4); }

#define PGW_D8(i)                                                                                                      \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define PGW_D64 PGW_D8(0), PGW_D8(8), PGW_D8(16), PGW_D8(24), PGW_D8(32), PGW_D8(40), PGW_D8(48), PGW_D8(56)

/* d += A·B for the warpgroup: A 64 x 16 bf16 (K-major, descriptor a), B 16 x 128 bf16 (K-major,
 * descriptor b), f32 accumulators; scale-d = 1 (accumulate), scales of A and B +1, no transpose */
DEV void pgw_mma(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : PGW_D64
                 : "l"(a), "l"(b), "r"(1)
                 : "memory");
}
/* orders the warpgroup's register and shared-memory accesses before the wgmma that follow */
DEV void pgw_fence(float (&d)[64]) { asm volatile("wgmma.fence.sync.aligned;" : PGW_D64 : : "memory"); }
DEV void pgw_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/* waits until at most N of the warpgroup's committed wgmma groups are pending; the accumulators
 * are operands so that no read of them is moved above the wait */
template <int N> DEV void pgw_wait(float (&d)[64]) {
    asm volatile("wgmma.wait_group.sync.aligned %64;" : PGW_D64 : "n"(N) : "memory");
}

__global__ void __launch_bounds__(PGW_THREADS, 1)
    g4c_pgemm_wg_kernel(const unsigned short *__restrict__ x, size_t ts, int ldx, int M, const char *__restrict__ w, long long rb,
                        int N, int K, const g4c_pg_epi epi, float *__restrict__ part) {
    extern __shared__ __align__(1024) unsigned char pgw_sm[];
    unsigned char *const sm = pgw_sm + ((1024u - ((unsigned)__cvta_generic_to_shared(pgw_sm) & 1023u)) & 1023u);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    /* token tiles fastest: the blocks running at once share a few row tiles' weights through L2 */
    const int n0 = blockIdx.x * PGW_BN, r0 = blockIdx.y * PGW_BM;
    int kb, ke;
    pg_segment(K, blockIdx.z, gridDim.z, &kb, &ke);
    const int nk = (ke - kb + 1) / 2; /* chunks (the last may hold one 32-column k-step) */
    float *const y = gridDim.z > 1 ? part + (size_t)blockIdx.z * M * N : NULL;
    auto stage = [&](int b, int kc) {
        unsigned char *const ws = sm + (size_t)b * PGW_STAGE, *const xs = ws + PGW_WS;
        const int k0 = 32 * kb + kc * PGW_KC, lim = 32 * ke - k0; /* columns of the segment left */
#pragma unroll
        for (int j = 0; j < PGW_BM * 8 / PGW_THREADS; j++) {
            int r, q;
            pgw_piece(tid + j * PGW_THREADS, r, q);
            if (8 * q >= lim) continue;
            cp16(ws + pgw_off(r, q), w + (size_t)min(r0 + r, N - 1) * rb + 2 * (k0 + 8 * q));
        }
#pragma unroll
        for (int j = 0; j < PGW_BN * 8 / PGW_THREADS; j++) {
            int m, q;
            pgw_piece(tid + j * PGW_THREADS, m, q);
            if (8 * q >= lim) continue;
            const unsigned short *src = x + (size_t)min(n0 + m, M - 1) * ldx + k0 + 8 * q;
#pragma unroll
            for (int term = 0; term < G4C_FP_TERMS; term++) cp16(xs + term * PGW_XT + pgw_off(m, q), src + term * ts);
        }
    };
#pragma unroll
    for (int b = 0; b < PGW_AHEAD; b++) {
        if (b < nk) stage(b, b);
        cp_commit();
    }
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    /* chunk kc; FULL: both of its k-steps (every chunk but a segment's last when it has an odd number
     * of k-steps: that one runs alone after the loop, so no branch separates a chunk's wgmma) */
    auto chunk = [&](int kc, auto full) {
        asm volatile("cp.async.wait_group %0;" ::"n"(PGW_AHEAD - 1) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads(); /* chunk kc is in; no wgmma reads chunk kc - 1 - PGW_WAIT's buffer any more */
        if (kc + PGW_AHEAD < nk) stage((kc + PGW_AHEAD) % PGW_NBUF, kc + PGW_AHEAD);
        cp_commit();
        const uint32_t buf = sbase + (uint32_t)((kc % PGW_NBUF) * PGW_STAGE);
        const uint64_t da = pgw_desc(buf + (uint32_t)wg * (64 * PGW_ROWB));
        const uint64_t db = pgw_desc(buf + PGW_WS);
        /* descriptor + (bytes >> 4) moves the start address: no carry out of its 14 bits, the
         * addresses being below 256 KB */
        constexpr uint64_t dp = PGW_PSTEP >> 4, dt = PGW_XT >> 4;
        pgw_fence(d);
#pragma unroll
        for (int p = 0; p < (decltype(full)::value ? 4 : 2); p++)
#pragma unroll
            for (int term = 0; term < G4C_FP_TERMS; term++) pgw_mma(d, da + p * dp, db + term * dt + p * dp);
        pgw_commit();
        pgw_wait<PGW_WAIT>(d);
    };
    const int nfull = (ke - kb) / 2;
#pragma unroll 1
    for (int kc = 0; kc < nfull; kc++) chunk(kc, std::true_type());
    if (nfull < nk) chunk(nfull, std::false_type());
    pgw_wait<0>(d);
    const int rw = r0 + 64 * wg + 16 * (warp & 3) + (lane >> 2), mw = n0 + 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int r = rw + 8 * ((i >> 1) & 1), m = mw + 8 * (i >> 2) + (i & 1);
        if (r >= N || m >= M) continue;
        if (y) y[(size_t)m * N + r] = d[i];
        else pg_store(epi, m, r, d[i]);
    }
}

cudaError_t g4c_pgemm_wg_init(void) {
    return cudaFuncSetAttribute(g4c_pgemm_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PGW_SMEM);
}

cudaError_t g4c_pgemm_wg_launch(const unsigned short *x, size_t ts, int ldx, int M, const g4c_mat *w, const g4c_pg_epi *epi,
                                float *part, cudaStream_t stream) {
    if (w->type != G4C_BF16) return cudaErrorInvalidValue;
    const int N = w->rows, K = w->cols, S = g4c_pgemm_segments(N, K);
    const dim3 grid((M + PGW_BN - 1) / PGW_BN, (N + PGW_BM - 1) / PGW_BM, S);
    g4c_pgemm_wg_kernel<<<grid, PGW_THREADS, PGW_SMEM, stream>>>(x, ts, ldx, M, (const char *)w->data, w->row_bytes, N, K, *epi,
                                                                 part);
    if (S > 1) return g4c_pgemm_reduce_launch(part, S, M, w, epi, stream);
    return cudaGetLastError();
}
