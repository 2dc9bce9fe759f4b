/* The prefill GEMM (pgemm.cu) on Hopper's warpgroup tensor-core instruction, wgmma.mma_async
 * (sm_90a), for bf16 weights and for per-channel signed 4-bit rows (G4C_Q4, below): Y[m][r] =
 * sum_k W[r][k] · x[m][k] with each input row given as the three bf16 terms x = h + mid + l. A
 * drop-in alternative to pgemm.cu's mma.sync kernel: the same arguments, the same K segments
 * (g4c_pgemm_segments), the same partial sums and reduction (g4c_pgemm_reduce_launch) and the same
 * epilogue (pgemm.cuh pg_store).
 *
 * Why: the mma.sync kernel is issue-bound (ncu: tensor pipe ~32% busy, mostly waits on the
 * fragments just loaded by ldmatrix). wgmma reads both operands straight from shared memory, one
 * instruction per 64 x 128 x 16 product of a warpgroup, and runs asynchronously while the warps
 * issue the next chunk's copies.
 *
 * Tile and pipeline: a block (256 threads, two warpgroups) owns 128 weight rows x 128 tokens over
 * its K segment; warpgroup g computes rows 64g..64g+63 against all 128 tokens (one m64n128k16
 * accumulator: 64 f32 registers a thread). K is staged in chunks of 64 columns (NBUF buffers of
 * the chunk's weights - bf16: 16 KB, 4-bit: 6 KB - + 3 x 16 KB of input terms; NBUF = PGW_NBUF for
 * bf16, PGW_NBUF_Q4 for 4-bit rows) by cp.async from every thread. A warpgroup ends a chunk with
 * wgmma.wait_group PGW_WAIT: with 1 (default) the chunk's wgmma group stays in flight while the
 * warps wait for the next chunk's copies and issue its wgmma, so a buffer may be refilled only
 * after the chunk following its own has been waited for, and the copies run AHEAD = NBUF - 1 -
 * PGW_WAIT chunks ahead (bf16, 3 buffers, the most that fit: 1 chunk ahead; 4-bit rows, 4
 * buffers: 2 ahead; PGW_WAIT 0: one more, the tensor pipe drained at every chunk). Order of a
 * chunk: every thread waits for its copies of the chunk (cp.async.wait_group), makes them visible
 * to the async proxy that wgmma reads through (fence.proxy.async), then __syncthreads: the chunk
 * is in for everyone, and every warpgroup has passed its wgmma.wait_group of the iteration before,
 * so the buffer of the chunk PGW_WAIT + 1 back is no longer read by any wgmma and may be refilled.
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
 * A chunk's buffer: weights (128 rows) at 0, term t's 128 token rows at WS + 16 KB·t (WS, the
 * weights' bytes, a multiple of 1024); bf16: warpgroup g's A at 8 KB·g. The dynamic shared memory
 * is rounded up to a 1024-byte boundary in the kernel.
 *
 * Accumulator (PTX ISA, register fragments of wgmma .m64nNk16, f32 D): warp w of the warpgroup
 * holds rows 16w..16w+15; register i of lane (g = lane / 4, t = lane % 4) is row 16w + g + 8·(i/2
 * % 2), column 8·(i / 4) + 2t + i % 2 - rows are weight rows, columns tokens.
 *
 * 4-bit rows (WT G4C_Q4; program.h layout: codes LSB-first, two a byte, element = s·(q − 8), one
 * f32 scale per row at byte sc_off, no bias, one group per row): A comes from registers, B (the
 * terms) from shared memory as for bf16. A chunk's codes are 32 bytes a row, staged as plain rows
 * PGW_QLD = 48 bytes apart (16 bytes of padding: the 8 rows a warp reads at once fall on distinct
 * banks). Each thread builds the A fragments of the chunk's k16 pieces from them, the exact bf16
 * integers q − 8 (forward.cuh q4_pair, as pgemm.cu does), in the layout of the PTX ISA, "Register
 * Fragments" of wgmma .m64nNk16, "Multiplicand A in registers" (.bf16: "four .f16x2 registers,
 * with each register containing two .f16/.bf16 elements from matrix A", a0..a7; Figure "WGMMA
 * .m64nNk16 register fragment layout for matrix A"): warp w of the warpgroup holds rows
 * 16w..16w+15 of the warpgroup's 64, in the layout of mma.m16n8k16's A fragment: lane (g, t)
 * holds a0, a1 = row g, columns 2t, 2t+1; a2, a3 = row g + 8, the same columns; a4..a7 the same
 * rows, columns + 8. Register j of a piece is {a(2j), a(2j+1)}: row g + 8·(j % 2), columns
 * 2t + 8·(j / 2) (+1), which are code byte t (j < 2) or t + 4 (j >= 2) of the piece's 8 bytes of
 * that row. The output's sum runs over the whole segment unscaled; the row's scale multiplies it
 * once at the end: in the epilogue with one segment, else in g4c_pgemm_reduce after the segments'
 * sum (s·Σ(q − 8)x, as pgemm.cu).
 *   Register rules (PTX ISA, wgmma.fence): "wgmma.fence instruction establishes an ordering
 * between prior accesses to any warpgroup registers and subsequent accesses to the same registers
 * by a wgmma.mma_async instruction. Only the accumulator register and the input registers
 * containing the fragments of matrix A require this ordering." It must be issued "between a
 * register access by a thread in the warpgroup and any wgmma.mma_async instruction that accesses
 * the same registers"; and (wgmma.mma_async / wgmma.wait_group) the A registers of a wgmma may not
 * be accessed, so not rewritten, before a wgmma.wait_group shows the group holding it complete.
 * Here: a chunk builds all its fragments (a separate register set per k16 piece: 16 registers a
 * full chunk), ties them to an empty volatile asm so that no part of the building moves past the
 * wgmma.fence that follows, then issues the chunk's 12 wgmma (h, mid, l per piece) and commits
 * them as one group. With PGW_WAIT 1 that group is still in flight while the next chunk builds its
 * fragments, so the chunk loop holds two chunks: consecutive chunks' fragments are different PTX
 * registers, and a chunk's registers are defined again two chunks later, after the wait_group 1
 * that ended the chunk in between has completed the group reading them (with one chunk a loop
 * iteration, the same PTX registers would be written while the previous chunk's wgmma still read
 * them). Mapping them to physical registers that stay untouched while in flight is then ptxas's
 * part; the build must show no "(C7515) ... wgmma.mma_async instructions are serialized" note.
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
#ifndef PGW_NBUF_Q4
#define PGW_NBUF_Q4 4 /* 4-bit rows: smaller buffers, one more fits */
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
constexpr int PGW_QLD = PGW_KC / 2 + 16;              /* bytes from one staged row of 4-bit codes to the next */
constexpr int PGW_XT = PGW_BN * PGW_ROWB;             /* bytes of a chunk's term (16 KB) */
constexpr int PGW_PSTEP = PGW_SWIZZLE ? 32 : 256;     /* bytes from one k16 piece to the next */
/* descriptor bits above the start address: LBO, SBO (encoded >> 4) and the swizzle mode */
constexpr uint64_t PGW_DESC = ((uint64_t)((PGW_SWIZZLE ? 16 : 128) >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
                              ((uint64_t)(PGW_SWIZZLE ? 1 : 0) << 62);
static_assert(PGW_THREADS == 2 * 128 && PGW_BM == 2 * 64, "two warpgroups of 64 rows");
static_assert(PGW_THREADS == 2 * PGW_BM, "4-bit rows: one 16-byte copy of codes per thread and chunk");

/* the buffers of a weight type: WS bytes of a chunk's weights, STAGE of a buffer, NBUF buffers */
template <int WT> struct pgw_cfg {
    static constexpr bool q4 = WT == G4C_Q4;
    static constexpr int WS = q4 ? PGW_BM * PGW_QLD : PGW_BM * PGW_ROWB; /* 6 KB / 16 KB */
    static constexpr int STAGE = WS + G4C_FP_TERMS * PGW_XT;
    static constexpr int NBUF = q4 ? PGW_NBUF_Q4 : PGW_NBUF;
    static constexpr int AHEAD = NBUF - 1 - PGW_WAIT; /* chunks the copies run ahead */
    static constexpr size_t SMEM = (size_t)NBUF * STAGE + 1024; /* + rounding to 1024 bytes */
    static_assert(WT == G4C_BF16 || WT == G4C_Q4, "bf16 or 4-bit rows");
    static_assert(AHEAD >= 1, "the pipeline needs NBUF >= PGW_WAIT + 2");
    static_assert(SMEM <= 227 * 1024, "more shared memory than a block can have");
    static_assert(WS % 1024 == 0 && STAGE % 1024 == 0, "operands on 1024-byte boundaries");
};
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
/* the wgmma's accumulator operands %0..%63, set up to read the scale-d operand into p */
#define PGW_MMA(sd)                                                                                                    \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %" sd ", 0;\n"                                                                   \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "                                                           \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                  \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "

/* d += A·B for the warpgroup: A 64 x 16 bf16 (K-major, descriptor a), B 16 x 128 bf16 (K-major,
 * descriptor b), f32 accumulators; scale-d = 1 (accumulate), scales of A and B +1, no transpose */
DEV void pgw_mma(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile(PGW_MMA("66") "%64, %65, p, 1, 1, 0, 0;\n}\n" : PGW_D64 : "l"(a), "l"(b), "r"(1) : "memory");
}
/* the same with A from registers: the thread's fragment a of the 64 x 16 piece (layout above; no
 * transpose of A in this form, none of B) */
DEV void pgw_mma(float (&d)[64], const unsigned (&a)[4], uint64_t b) {
    asm volatile(PGW_MMA("69") "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : PGW_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1)
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

/* 4-bit rows: the A fragments of a chunk's first NP k16 pieces (layout above) from its staged
 * codes; q: the thread's row g (row g + 8 is 8 rows on), t = lane % 4. Piece p's 16 columns are
 * the row's code bytes 8p..8p+7: words 2p and 2p + 1, whose bytes t are the thread's columns 2t,
 * 2t+1 and 2t+8, 2t+9. Every fragment ends as an operand of an empty volatile asm, issued before
 * the wgmma.fence of the chunk (volatile asm keeps its order), so none is written after it. */
template <int NP> DEV void pgw_q4_frags(const unsigned char *q, int t, unsigned (&a)[NP][4]) {
    const unsigned sel = (unsigned)t | ((unsigned)(t + 4) << 4);
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++)
#pragma unroll
        for (int c = 0; c < NP / 2; c++) { /* 16 bytes: pieces 2c and 2c + 1 */
            const uint4 v = *reinterpret_cast<const uint4 *>(q + h2 * 8 * PGW_QLD + 16 * c);
            const unsigned u0 = __byte_perm(v.x, v.y, sel), u1 = __byte_perm(v.z, v.w, sel);
            a[2 * c][h2] = q4_pair(u0, 0xC308C308u); /* -(128 + 8) in bf16: q - 8 */
            a[2 * c][2 + h2] = q4_pair(u0 >> 8, 0xC308C308u);
            a[2 * c + 1][h2] = q4_pair(u1, 0xC308C308u);
            a[2 * c + 1][2 + h2] = q4_pair(u1 >> 8, 0xC308C308u);
        }
#pragma unroll
    for (int p = 0; p < NP; p++) asm volatile("" : "+r"(a[p][0]), "+r"(a[p][1]), "+r"(a[p][2]), "+r"(a[p][3]));
}

/* WT G4C_BF16: w bf16 row-major, row r at w + r·rb bytes (sc_off unused). WT G4C_Q4: per-channel
 * signed 4-bit rows, the f32 scale at byte sc_off of a row (see above). */
template <int WT>
__global__ void __launch_bounds__(PGW_THREADS, 1)
    g4c_pgemm_wg_kernel(const unsigned short *__restrict__ x, size_t ts, int ldx, int M, const char *__restrict__ w, long long rb,
                        int sc_off, int N, int K, const g4c_pg_epi epi, float *__restrict__ part) {
    using C = pgw_cfg<WT>;
    extern __shared__ __align__(1024) unsigned char pgw_sm[];
    pdl_enter();
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
        unsigned char *const ws = sm + (size_t)b * C::STAGE, *const xs = ws + C::WS;
        const int k0 = 32 * kb + kc * PGW_KC, lim = 32 * ke - k0; /* columns of the segment left */
        if constexpr (C::q4) { /* 32 code bytes a row: the thread copies half tid % 2 of row tid / 2 */
            const int r = tid >> 1, c = tid & 1;
            if (32 * c < lim) cp16(ws + r * PGW_QLD + 16 * c, w + (size_t)min(r0 + r, N - 1) * rb + k0 / 2 + 16 * c);
        } else {
#pragma unroll
            for (int j = 0; j < PGW_BM * 8 / PGW_THREADS; j++) {
                int r, q;
                pgw_piece(tid + j * PGW_THREADS, r, q);
                if (8 * q >= lim) continue;
                cp16(ws + pgw_off(r, q), w + (size_t)min(r0 + r, N - 1) * rb + 2 * (k0 + 8 * q));
            }
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
    for (int b = 0; b < C::AHEAD; b++) {
        if (b < nk) stage(b, b);
        cp_commit();
    }
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    /* 4-bit rows: the zeros become the values of an asm here, before any branch, so that the
     * compiler does not materialise them anew on each path into the chunk loop or past it (ptxas
     * then saw accumulators defined by other instructions on a path joining one with a wgmma group
     * in flight, and serialized the wgmma) */
    if constexpr (C::q4) asm volatile("" : PGW_D64 : : "memory");
    /* the thread's first A row within the block tile (4-bit rows: its fragments' row g) */
    const int arow = 64 * wg + 16 * (warp & 3) + (lane >> 2);
    /* chunk kc; FULL: both of its k-steps (every chunk but a segment's last when it has an odd number
     * of k-steps: that one runs alone after the loop, so no branch separates a chunk's wgmma) */
    auto chunk = [&](int kc, auto full) {
        constexpr int np = decltype(full)::value ? 4 : 2; /* k16 pieces */
        asm volatile("cp.async.wait_group %0;" ::"n"(C::AHEAD - 1) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads(); /* chunk kc is in; no wgmma reads chunk kc - 1 - PGW_WAIT's buffer any more */
        if (kc + C::AHEAD < nk) stage((kc + C::AHEAD) % C::NBUF, kc + C::AHEAD);
        cp_commit();
        const int b = kc % C::NBUF;
        const uint32_t buf = sbase + (uint32_t)(b * C::STAGE);
        const uint64_t da = pgw_desc(buf + (uint32_t)wg * (64 * PGW_ROWB)); /* bf16: the warpgroup's A */
        const uint64_t db = pgw_desc(buf + C::WS);
        /* descriptor + (bytes >> 4) moves the start address: no carry out of its 14 bits, the
         * addresses being below 256 KB */
        constexpr uint64_t dp = PGW_PSTEP >> 4, dt = PGW_XT >> 4;
        if constexpr (C::q4) {
            unsigned a[np][4];
            pgw_q4_frags<np>(sm + (size_t)b * C::STAGE + arow * PGW_QLD, lane & 3, a);
            pgw_fence(d);
#pragma unroll
            for (int p = 0; p < np; p++)
#pragma unroll
                for (int term = 0; term < G4C_FP_TERMS; term++) pgw_mma(d, a[p], db + term * dt + p * dp);
        } else {
            pgw_fence(d);
#pragma unroll
            for (int p = 0; p < np; p++)
#pragma unroll
                for (int term = 0; term < G4C_FP_TERMS; term++) pgw_mma(d, da + p * dp, db + term * dt + p * dp);
        }
        pgw_commit();
        pgw_wait<PGW_WAIT>(d);
    };
    /* the full chunks, U per iteration (4-bit rows: 2, so that consecutive chunks' A fragments are
     * distinct registers, see above), then those left, then the half chunk if any */
    constexpr int U = C::q4 ? 2 : 1;
    const int nfull = (ke - kb) / 2;
    int kc = 0;
#pragma unroll 1
    for (; kc + U <= nfull; kc += U)
#pragma unroll
        for (int u = 0; u < U; u++) chunk(kc + u, std::true_type());
#pragma unroll
    for (int u = 1; u < U; u++)
        if (kc < nfull) chunk(kc++, std::true_type());
    if (kc < nk) chunk(kc, std::false_type());
    pgw_wait<0>(d);
    const int rw = r0 + arow, mw = n0 + 2 * (lane & 3);
    float sc[2] = {1.0f, 1.0f}; /* 4-bit rows: the scales of rows rw and rw + 8 */
    if constexpr (C::q4) {
        if (!y) {
#pragma unroll
            for (int h = 0; h < 2; h++)
                if (rw + 8 * h < N) sc[h] = __ldg(reinterpret_cast<const float *>(w + (size_t)(rw + 8 * h) * rb + sc_off));
        }
    }
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int r = rw + 8 * ((i >> 1) & 1), m = mw + 8 * (i >> 2) + (i & 1);
        if (r >= N || m >= M) continue;
        if (y) y[(size_t)m * N + r] = d[i];
        else if constexpr (C::q4) pg_store(epi, m, r, sc[(i >> 1) & 1] * d[i]); /* s·Σ(q − 8)x, once */
        else pg_store(epi, m, r, d[i]);
    }
}

template <int WT> static cudaError_t pgw_init() {
    return cudaFuncSetAttribute(g4c_pgemm_wg_kernel<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pgw_cfg<WT>::SMEM);
}
cudaError_t g4c_pgemm_wg_init(void) {
    const cudaError_t e = pgw_init<G4C_BF16>();
    return e == cudaSuccess ? pgw_init<G4C_Q4>() : e;
}

cudaError_t g4c_pgemm_wg_launch(const unsigned short *x, size_t ts, int ldx, int M, const g4c_mat *w, const g4c_pg_epi *epi,
                                float *part, cudaStream_t stream) {
    if (w->type != G4C_BF16 && w->type != G4C_Q4) return cudaErrorInvalidValue;
    const int N = w->rows, K = w->cols, S = g4c_pgemm_segments(N, K);
    const dim3 grid((M + PGW_BN - 1) / PGW_BN, (N + PGW_BM - 1) / PGW_BM, S);
    auto run = [&](auto kernel, size_t smem, int sc_off) {
        return pdl_launch(epi->pdl, kernel, grid, dim3(PGW_THREADS), smem, stream, x, ts, ldx, M, (const char *)w->data, w->row_bytes,
                          sc_off, N, K, *epi, part);
    };
    const cudaError_t e = w->type == G4C_Q4 ? run(g4c_pgemm_wg_kernel<G4C_Q4>, pgw_cfg<G4C_Q4>::SMEM, w->sc_off)
                                            : run(g4c_pgemm_wg_kernel<G4C_BF16>, pgw_cfg<G4C_BF16>::SMEM, 0);
    if (e) return e;
    if (S > 1) return g4c_pgemm_reduce_launch(part, S, M, w, epi, stream);
    return cudaSuccess;
}
