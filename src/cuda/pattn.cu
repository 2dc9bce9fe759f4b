/* A fast prefill's attention as a kernel of its own (session.cu pg_plan: the persistent kernel's
 * attention stage, as the last of its launch, norms and ropes the launch's queries and own K/V
 * rows only; this launch does the rest).
 *
 * Why: the persistent kernel's prompt attention (forward.cuh attn_items_tokens) gives every (token,
 * query head) pair a warp and every key a butterfly, so that each value gets the decode
 * procedure's operations; traced on the H200 (E2B bf16, 512-token chunk after 128 tokens) it took
 * 56 ms, a third of the chunk. Two kernels here (the first also in key partitions with a merge),
 * the same semantics (softmax(q·k) over the keys a query sees, no extra scale), each variant with
 * bits of its own:
 *
 * The tensor-core kernel (g4c_pattn_tc_kernel, kb = 0; the session's is kb = 1 below, which runs it
 * in key partitions - G4_CUDA_PATTN=0 selects this one). A block owns one KV head
 * and a tile of 16·WR query rows (tokens x the group's query heads: row r is token m0 + r / group,
 * head g·group + r % group; WR = 2, or 4 for 256-wide heads when the grid still fills the GPU)
 * and walks the keys in blocks of 16 at absolute positions, flash-style. NS = D / 128 warps share
 * each 16 rows, warp s owning the elements s·d/NS .. (s + 1)·d/NS - 1 of the head (128 at most: a
 * 16 x 128 slice of the outputs is 64 accumulators a lane): per key block each computes its
 * slice's partial scores with mma.sync m16n8k16 (the queries' A fragments in registers), the
 * partials are summed through shared memory (slice 0 first), every warp of the rows runs the same
 * online softmax on the same bits, and each adds its weights x values for its slice. A key block's
 * K and V rows are loaded (f32, ld.global into registers, issued a phase ahead: V during the
 * scores, the next K during the value sums) and stored split into shared memory; fragments come
 * by ldmatrix (.trans for V), rows padded 16 bytes (conflict-free). Shared memory: 2·16 keys x
 * (4D + 16) bytes, plus 1 KiB a warp for the partial scores when NS > 1 (D 128: 16.5 KiB, 256:
 * 36.5 KiB (40.5 at WR = 4), 512: 72.5 KiB); registers near 255 a thread (the queries' fragments
 * and the outputs are 64 each, a staged key block's share 32), no spills.
 *
 * Key partitions (kb = 1; the kernel's PART = TC_PART = 4, then g4c_pattn_merge_kernel): for short
 * chunks, where kb = 0's tiles do not fill the GPU (E2B, 512 tokens: 4096 query rows on one KV
 * head, 128 blocks of 32 rows), each row's key blocks are split by ABSOLUTE index: partition j
 * owns the 16-key blocks kb0 with kb0 / 16 = j mod 4. A block is (KV head, row tile, partition):
 * PART times the blocks at the same tile height (so 64-row tiles for heads 129..256 wide, d a
 * multiple of 64: half the staging per product of 32-row ones; kb = 0's shared memory), each walking its partition's blocks of the tile's key
 * range in increasing order with exactly kb = 0's per-block procedure (the same code: PART = 1
 * folds every partition term away, kb = 0's instructions are unchanged), and ends by writing each
 * live row's unnormalised (m_j, l_j, o_j) to scratch (m_j = -inf, l_j = 0, o_j = 0: the row saw
 * no key in the partition). The merge (a warp per row, lanes over d) takes the non-empty
 * partitions in the order j = 0..3: m = max m_j, w_j = expf(m_j - m), l = sum l_j·w_j, o = sum
 * o_j·w_j, att = o / l, stored through pa_store (and the next GEMM's terms) like kb = 0. Scratch:
 * M·nH·4·(d + 2) floats (g4c_pattn_scratch_floats): o_j at ((m·nH + h)·4 + j)·d, then (m_j, l_j)
 * at M·nH·4·d + 2((m·nH + h)·4 + j). Its own bits (another order of sums than kb = 0's), within
 * the same error bound.
 *
 * Precision (tensor cores): every f32 operand x is split into two fp16 terms, hi = f16(x), lo =
 * f16(x - hi) (x - hi is exact in f32), so x = hi + lo to within 2^-22 |x| (2^-25 absolute where lo
 * falls in fp16's subnormals). Scores accumulate per k-step of 16 elements Qhi·Khi, Qhi·Klo, Qlo·Khi
 * (Qlo·Klo, ~2^-22 relative, is dropped) into f32 accumulators: each product within ~3·2^-22 of
 * q_e·k_e. The weights p = expf(s - m) are f32, the row sums l are added in f32 from those values
 * (a lane's columns in ascending order, then the quad's butterfly, xor 1 then 2), and the value
 * sums take p split the same way: Phi·Vhi, Phi·Vlo, Plo·Vhi. Output o / l in f32. Assumes
 * |q|, |k|, |v| elements within fp16's range (65504; the inputs are normed, so far below it); an
 * element beyond it would give inf/NaN.
 *
 * The SIMT kernel (g4c_pattn_kernel; kb = 32, or 64 for 256-wide heads; also the tensor cores'
 * fallback when d is not a multiple of 16·NS): a tile of up to 32 query rows, keys in blocks of KB
 * at absolute positions, the block's K and V rows in shared memory (f32), a warp per 4 query rows;
 * scores in registers (lane l: keys l + 32u), an online softmax per row, the V sums with lane l
 * owning elements 4l .. 4l + 3 of every 128; every product and sum in f32.
 *
 * Exactness (chunk size), both kernels: a score is one fixed chain of sums over the head's
 * elements (SIMT: element order; tensor cores: per slice the k-steps in order, the three products
 * in order, then the slices in order; an mma's output element depends only on its own row of A and
 * column of B, not on where they sit in the tile); a row's running max, sum and outputs are
 * updated once per key block, in block order, from the same values whatever else the tile holds:
 * key blocks sit at absolute positions (so a key's place in the k dimension is fixed), a masked
 * key gives exactly 0, and a block in which a row sees no key leaves that row untouched (weights
 * 0, scale exactly 1: o·1 plus zero products is o; a warp none of whose rows sees the block skips
 * it, which is the same). So a token's attention is the same bits in any launch - any M, any tile
 * height, any place in the tile: a prompt's logits do not depend on the chunk size. kb = 1 the
 * same: the partitions are fixed by absolute key position and every row always has 4, so a row's
 * partial (m_j, l_j, o_j) is the per-block procedure over the blocks of index j mod 4 that meet
 * its keys, in order (the others leave it untouched, by the argument above; none: exactly the
 * empty state, which the merge skips), whatever the tile; and the merge is one fixed formula over
 * j = 0..3 of the row's own values. The sums run in another order than the decode procedure's
 * (rounding only). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/forward.cuh"
#include "cuda/pgemm.cuh"
#include "cuda/internal.h"

namespace {
constexpr int PA_THREADS = 256;
constexpr int PA_WARPS = PA_THREADS / 32;
constexpr int PA_NR = 4;                  /* query rows per warp */
constexpr int PA_ROWS = PA_WARPS * PA_NR; /* query rows per block */
template <int D, int KB> constexpr size_t pa_smem() {
    return sizeof(float) * ((size_t)PA_ROWS * D + (size_t)KB * (D + 4) + (size_t)KB * D);
}

struct pa_args {
    const float *q;          /* [m][nH·d] normed, roped */
    const float *kst, *vst;  /* this launch's rows: position pos0 + i at row i (NULL: all in the cache) */
    const float *kc, *vc;    /* the cache: position j at row j % cap */
    float *att;              /* [m][nH·d] */
    int nH, nkv, d, group, tq, is_full, window, cap, pos0, M;
    unsigned short *xt;      /* not NULL: att also as the next GEMM's three bf16 input terms (pgemm.cuh
                                pg_terms), term t of token m at xt + t·xts + m·xld */
    size_t xts;
    int xld;
    int pdl;                 /* programmatic dependent launch (pgemm.cuh pdl_launch) */
    float *part;             /* kb = 1: the partitions' partial sums (g4c_pattn_tc_kernel's PART > 1) */
};

/* att[off + i] = v[i] (i < n), and their input terms when the launch writes them */
template <int N> __device__ __forceinline__ void pa_store(const pa_args &a, size_t off, const float (&v)[N]) {
    float *out = a.att + off;
    if (N == 4) *reinterpret_cast<float4 *>(out) = make_float4(v[0], v[1 % N], v[2 % N], v[3 % N]);
    else if (N == 2) *reinterpret_cast<float2 *>(out) = make_float2(v[0], v[1 % N]);
    else
        for (int i = 0; i < N; i++) out[i] = v[i];
    if (a.xt) {
        const size_t row = (size_t)a.nH * a.d, m = off / row, at = m * a.xld + (off - m * row);
        for (int i = 0; i < N; i++) pg_terms(a.xt, a.xts, at + i, v[i]);
    }
}
} // namespace

/* D: the widest head the instantiation takes (d <= D, d % 4 == 0); KB keys per block (32 or 64);
 * MINB blocks per SM (2: 128 registers, and the shared memory of two) */
template <int D, int KB, int MINB>
__global__ void __launch_bounds__(PA_THREADS, MINB) g4c_pattn_kernel(const pa_args a) {
    pdl_enter();
    constexpr int NU = KB / 32, NG = D / 128, LK = D + 4;
    extern __shared__ __align__(16) float pa_sm[];
    float *qs = pa_sm, *ks = qs + (size_t)PA_ROWS * D, *vs = ks + (size_t)KB * LK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int d = a.d, d4 = d / 4, g = blockIdx.y, row = a.nkv * d, m0 = blockIdx.x * a.tq;
    const int m1 = min(a.M, m0 + a.tq), rows = (m1 - m0) * a.group;
    /* the tile's queries (rows past the tile: zeros) */
    for (int f = tid; f < PA_ROWS * d4; f += PA_THREADS) {
        const int r = f / d4, c4 = f - r * d4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < rows) {
            const int m = m0 + r / a.group, h = g * a.group + r % a.group;
            v = lda4(a.q + ((size_t)m * a.nH + h) * d + 4 * c4);
        }
        *reinterpret_cast<float4 *>(qs + (size_t)r * D + 4 * c4) = v;
    }
    /* this warp's rows: position, first key */
    int pq[PA_NR], lo[PA_NR];
    bool live[PA_NR];
#pragma unroll
    for (int i = 0; i < PA_NR; i++) {
        const int r = warp * PA_NR + i;
        live[i] = r < rows;
        pq[i] = live[i] ? a.pos0 + m0 + r / a.group : -1;
        lo[i] = a.is_full ? 0 : max(0, pq[i] - a.window + 1);
    }
    const int pq_first = a.pos0 + m0, pq_last = a.pos0 + m1 - 1;
    const int lo_min = a.is_full ? 0 : max(0, pq_first - a.window + 1);
    const int stage_from = a.kst ? a.pos0 : INT_MAX;
    float mrun[PA_NR], lrun[PA_NR], o[PA_NR][NG][4];
#pragma unroll
    for (int i = 0; i < PA_NR; i++) {
        mrun[i] = -INFINITY;
        lrun[i] = 0.0f;
#pragma unroll
        for (int gi = 0; gi < NG; gi++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[i][gi][e] = 0.0f;
    }
#pragma unroll 1
    for (int kb0 = lo_min / KB * KB; kb0 <= pq_last; kb0 += KB) {
        __syncthreads(); /* the previous block's rows are done with (and the queries are in) */
        /* keys kb0 .. kb0 + KB - 1: rows the tile sees, zeros elsewhere (never uninitialised memory) */
        for (int f = tid; f < KB * d4; f += PA_THREADS) {
            const int j = f / d4, c4 = f - j * d4, kp = kb0 + j;
            float *kd = ks + (size_t)j * LK + 4 * c4, *vd = vs + (size_t)j * D + 4 * c4;
            if (kp >= lo_min && kp <= pq_last) {
                const size_t off = (size_t)g * d + 4 * c4;
                const float *kr = kp >= stage_from ? a.kst + (size_t)(kp - stage_from) * row : a.kc + (size_t)(kp % a.cap) * row;
                const float *vr = kp >= stage_from ? a.vst + (size_t)(kp - stage_from) * row : a.vc + (size_t)(kp % a.cap) * row;
                cp16(kd, kr + off);
                cp16(vd, vr + off);
            } else {
                *reinterpret_cast<float4 *>(kd) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                *reinterpret_cast<float4 *>(vd) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        cp_wait();
        __syncthreads();
        /* scores: row i, key kb0 + lane + 32u, one chain over the head in element order */
        float s[PA_NR][NU];
#pragma unroll
        for (int i = 0; i < PA_NR; i++)
#pragma unroll
            for (int u = 0; u < NU; u++) s[i][u] = 0.0f;
        const float *qw = qs + (size_t)warp * PA_NR * D;
#pragma unroll 4
        for (int c4 = 0; c4 < d4; c4++) {
            float4 kk[NU];
#pragma unroll
            for (int u = 0; u < NU; u++) kk[u] = *reinterpret_cast<const float4 *>(ks + (size_t)(lane + 32 * u) * LK + 4 * c4);
#pragma unroll
            for (int i = 0; i < PA_NR; i++) {
                const float4 qq = *reinterpret_cast<const float4 *>(qw + (size_t)i * D + 4 * c4);
#pragma unroll
                for (int u = 0; u < NU; u++) {
                    s[i][u] = fmaf(qq.x, kk[u].x, s[i][u]);
                    s[i][u] = fmaf(qq.y, kk[u].y, s[i][u]);
                    s[i][u] = fmaf(qq.z, kk[u].z, s[i][u]);
                    s[i][u] = fmaf(qq.w, kk[u].w, s[i][u]);
                }
            }
        }
        /* the online softmax, a row at a time; p[i][u]: key lane + 32u's weight (0: masked) */
        float p[PA_NR][NU], scale[PA_NR];
#pragma unroll
        for (int i = 0; i < PA_NR; i++) {
            float bm = -INFINITY;
#pragma unroll
            for (int u = 0; u < NU; u++) {
                const int kp = kb0 + lane + 32 * u;
                if (kp < lo[i] || kp > pq[i]) s[i][u] = -INFINITY;
                bm = fmaxf(bm, s[i][u]);
            }
            bm = warp_max_f(bm);
            scale[i] = 1.0f;
            if (bm == -INFINITY) { /* no key of this block for the row: nothing changes */
#pragma unroll
                for (int u = 0; u < NU; u++) p[i][u] = 0.0f;
                continue;
            }
            const float mn = fmaxf(mrun[i], bm);
            scale[i] = expf(mrun[i] - mn); /* 0 on the row's first block (its sums are 0) */
            mrun[i] = mn;
            float ps = 0.0f;
#pragma unroll
            for (int u = 0; u < NU; u++) {
                p[i][u] = s[i][u] == -INFINITY ? 0.0f : expf(s[i][u] - mn);
                ps = ps + p[i][u];
            }
            ps = warp_sum_f(ps);
            lrun[i] = lrun[i] * scale[i] + ps;
        }
        /* the V sums, keys in order */
#pragma unroll
        for (int i = 0; i < PA_NR; i++)
#pragma unroll
            for (int gi = 0; gi < NG; gi++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[i][gi][e] = o[i][gi][e] * scale[i];
#pragma unroll
        for (int u = 0; u < NU; u++) {
#pragma unroll 4
            for (int jj = 0; jj < 32; jj++) {
                const int j = 32 * u + jj;
                float w[PA_NR];
#pragma unroll
                for (int i = 0; i < PA_NR; i++) w[i] = __shfl_sync(0xffffffffu, p[i][u], jj);
#pragma unroll
                for (int gi = 0; gi < NG; gi++) {
                    const int c4 = lane + 32 * gi;
                    if (c4 >= d4) continue;
                    const float4 v = *reinterpret_cast<const float4 *>(vs + (size_t)j * D + 4 * c4);
#pragma unroll
                    for (int i = 0; i < PA_NR; i++) {
                        o[i][gi][0] = fmaf(w[i], v.x, o[i][gi][0]);
                        o[i][gi][1] = fmaf(w[i], v.y, o[i][gi][1]);
                        o[i][gi][2] = fmaf(w[i], v.z, o[i][gi][2]);
                        o[i][gi][3] = fmaf(w[i], v.w, o[i][gi][3]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PA_NR; i++) {
        if (!live[i]) continue;
        const int r = warp * PA_NR + i, m = m0 + r / a.group, h = g * a.group + r % a.group;
        const size_t off = ((size_t)m * a.nH + h) * d;
#pragma unroll
        for (int gi = 0; gi < NG; gi++) {
            const int c4 = lane + 32 * gi;
            if (c4 >= d4) continue;
            const float v[4] = {o[i][gi][0] / lrun[i], o[i][gi][1] / lrun[i], o[i][gi][2] / lrun[i], o[i][gi][3] / lrun[i]};
            pa_store(a, off + 4 * c4, v);
        }
    }
}

/* ---- the tensor-core kernel ------------------------------------------------------------------- */

namespace {
constexpr int TC_KB = 16;  /* keys per block (absolute positions kb0 = 16i) */
constexpr int TC_PART = 4; /* kb = 1: key partitions (key block i in partition i % TC_PART) */
/* warps sharing a tile's 16 rows, each owning d / NS of the head's elements (128 at most) */
template <int D> __host__ __device__ constexpr int tc_ns() { return D > 128 ? D / 128 : 1; }
template <int D, int WR> __host__ __device__ constexpr int tc_threads() { return 32 * tc_ns<D>() * WR; }
/* K and V blocks (hi row then lo row, 2d + 8 halves per key), then the score exchange (NS > 1) */
template <int D> __host__ __device__ constexpr size_t tc_kv_bytes() { return (size_t)2 * TC_KB * (2 * D + 8) * sizeof(unsigned short); }
template <int D, int WR> constexpr size_t tc_smem() {
    return tc_kv_bytes<D>() + (tc_ns<D>() > 1 ? (size_t)tc_threads<D, WR>() / 32 * 16 * TC_KB * sizeof(float) : 0);
}

/* (a, b) -> f16x2, a in the low half, each rounded to nearest */
DEV unsigned tc_h2(float a, float b) {
    unsigned h;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(b), "f"(a));
    return h;
}
/* x = hi + lo + e: hi = f16(x), lo = f16(x - hi) (x - hi exact in f32), |e| <= 2^-22 |x| + 2^-25 */
DEV void tc_split(float a, float b, unsigned &hi, unsigned &lo) {
    hi = tc_h2(a, b);
    float ha, hb;
    asm("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}" : "=f"(ha), "=f"(hb) : "r"(hi));
    lo = tc_h2(a - ha, b - hb);
}
/* c += A·B, m16n8k16, f16 operands, f32 accumulators (PTX ISA fragments: a0 rows g, cols 2t..2t+1;
 * a1 rows g + 8; a2 rows g, cols 2t + 8..; a3 rows g + 8, cols 2t + 8..; b0 k 2t..2t+1, b1 k
 * 2t + 8.., column g; c0, c1 row g, columns 2t, 2t + 1; c2, c3 row g + 8) */
DEV void tc_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* four 8x8 b16 matrices, transposed: lane l gets rows 2(l%4), 2(l%4) + 1 of column l/4 */
DEV void tc_ldsm4t(unsigned (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
/* named barrier 1 + wr of the N threads of the warps sharing rows (immediate ids: ptxas reserves
 * all 16 for a register id) */
template <int N> DEV void tc_bar(int wr) {
    switch (wr) {
    case 0: asm volatile("bar.sync 1, %0;" ::"n"(N) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;" ::"n"(N) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;" ::"n"(N) : "memory"); break;
    default: asm volatile("bar.sync 4, %0;" ::"n"(N) : "memory"); break;
    }
}
} // namespace

/* D: the widest head (NS = D / 128 warps per 16 rows, each a slice of ds = d / NS elements: d a
 * multiple of 16·NS, d <= D); WR: warps along the rows (a tile of 16·WR rows); PART: key
 * partitions (1: kb = 0, the whole softmax, att written; TC_PART: kb = 1, block x = PART·tile +
 * partition, walks the key blocks of index = partition mod PART and writes its rows' partial sums
 * to a.part for g4c_pattn_merge_kernel). PART = 1 folds every partition term away: kb = 0's code. */
template <int D, int WR, int PART>
__global__ void __launch_bounds__(tc_threads<D, WR>(), 256 / tc_threads<D, WR>()) g4c_pattn_tc_kernel(const pa_args a) {
    pdl_enter();
    constexpr int NS = tc_ns<D>(), T = tc_threads<D, WR>(), KB = TC_KB;
    constexpr int KSM = D / NS / 16; /* k-steps of a slice, at most */
    constexpr int NDM = D / NS / 8;  /* 8-column output tiles of a slice, at most */
    constexpr int TPK = T / KB;      /* staging: threads per key row */
    constexpr int NCM = D / 4 / TPK; /* staging: 16-byte pieces per thread and row, at most */
    static_assert(T % KB == 0 && (D / 4) % TPK == 0 && KSM <= 8 && NDM <= 16 && WR <= 4, "tile layout");
    extern __shared__ __align__(16) unsigned char tc_sm[];
    const int d = a.d, ldh = 2 * d + 8; /* a key's row: d hi halves, d lo halves, 16 bytes of padding */
    unsigned short *ksm = reinterpret_cast<unsigned short *>(tc_sm), *vsm = ksm + KB * ldh;
    float4 *xb = reinterpret_cast<float4 *>(tc_sm + tc_kv_bytes<D>()); /* [warp][2][32]: partial scores */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, mi = lane >> 3, rr = lane & 7;
    const int wr = warp / NS, sl = warp % NS; /* the warp's 16 rows, its slice of the head */
    const int ds = d / NS, nks = ds / 16, nd = ds / 8, sb = sl * ds;
    const int gk = blockIdx.y, row = a.nkv * d, group = a.group;
    /* the tiles with the most keys (the last tokens) first (PART > 1: a tile's partitions together) */
    const int part = blockIdx.x % PART, m0 = (gridDim.x / PART - 1 - blockIdx.x / PART) * a.tq, m1 = min(a.M, m0 + a.tq),
              rows = (m1 - m0) * group;
    const int pq_last = a.pos0 + m1 - 1;
    const int lo_min = a.is_full ? 0 : max(0, a.pos0 + m0 - a.window + 1);
    const int stage_from = a.kst ? a.pos0 : INT_MAX;
    /* this thread's rows: g and g + 8 of the warp's 16 (rows past the tile: no key, no output) */
    int pq[2], lo[2];
    const float *qp[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = 16 * wr + g + 8 * i;
        qp[i] = NULL;
        pq[i] = -1;
        lo[i] = 0;
        if (r < rows) {
            const int m = m0 + r / group, h = gk * group + r % group;
            qp[i] = a.q + ((size_t)m * a.nH + h) * d + sb;
            pq[i] = a.pos0 + m;
            lo[i] = a.is_full ? 0 : max(0, pq[i] - a.window + 1);
        }
    }
    /* the keys any of the warp's rows sees: wlo .. whi (a block outside them changes none of its rows) */
    const int rw0 = 16 * wr, rw1 = min(rows, rw0 + 16);
    const bool wlive = rw0 < rows;
    const int whi = wlive ? a.pos0 + m0 + (rw1 - 1) / group : -1;
    const int wlo = a.is_full || !wlive ? 0 : max(0, a.pos0 + m0 + rw0 / group - a.window + 1);
    /* the queries' A fragments, split: hi and lo, k-step ks = elements sb + 16ks .. sb + 16ks + 15 */
    unsigned qh[KSM][4], ql[KSM][4];
#pragma unroll
    for (int ks = 0; ks < KSM; ks++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = j & 1, c = 16 * ks + 8 * (j >> 1) + 2 * t;
            float2 v = make_float2(0.0f, 0.0f);
            if (ks < nks && qp[i]) v = __ldcg(reinterpret_cast<const float2 *>(qp[i] + c));
            tc_split(v.x, v.y, qh[ks][j], ql[ks][j]);
        }
    /* staging: thread tid loads key row sj's 16-byte pieces sc, sc + TPK, ... of this KV head (f32;
     * keys outside lo_min .. pq_last: zeros, never uninitialised memory) and stores them split */
    const int sj = tid / TPK, sc = tid % TPK, nc = d / 4 / TPK;
    auto load = [&](float4(&r)[NCM], const float *st, const float *cache, int kb0) {
        const int kp = kb0 + sj;
        const float *src = NULL;
        if (kp >= lo_min && kp <= pq_last)
            src = (kp >= stage_from ? st + (size_t)(kp - stage_from) * row : cache + (size_t)(kp % a.cap) * row) + (size_t)gk * d +
                  4 * sc;
#pragma unroll
        for (int i = 0; i < NCM; i++) r[i] = src && i < nc ? lda4(src + 4 * TPK * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    };
    auto store = [&](unsigned short *buf, const float4(&r)[NCM]) {
        unsigned short *p = buf + sj * ldh + 4 * sc;
#pragma unroll
        for (int i = 0; i < NCM; i++) {
            if (i >= nc) break;
            uint2 h, l;
            tc_split(r[i].x, r[i].y, h.x, l.x);
            tc_split(r[i].z, r[i].w, h.y, l.y);
            *reinterpret_cast<uint2 *>(p + 4 * TPK * i) = h;
            *reinterpret_cast<uint2 *>(p + d + 4 * TPK * i) = l;
        }
    };
    float o[NDM][4], mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};
#pragma unroll
    for (int jd = 0; jd < NDM; jd++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[jd][e] = 0.0f;
    float4 kr[NCM], vr[NCM];
    /* the first key block of the partition at or after lo_min's (PART = 1: lo_min's), then every
     * PART-th (beyond pq_last: no block, the rows' sums stay empty) */
    const int kfirst = (lo_min / KB + (PART - lo_min / KB % PART + part) % PART) * KB;
    load(kr, a.kst, a.kc, kfirst);
    store(ksm, kr);
    __syncthreads();
#pragma unroll 1
    for (int kb0 = kfirst; kb0 <= pq_last; kb0 += KB * PART) {
        const bool more = kb0 + KB * PART <= pq_last;
        load(vr, a.vst, a.vc, kb0); /* in flight during the scores */
        /* warp-uniform (and the same for the NS warps of the rows) */
        const bool act = wlive && kb0 <= whi && kb0 + KB - 1 >= wlo;
        unsigned ph[4] = {0u, 0u, 0u, 0u}, pl[4] = {0u, 0u, 0u, 0u};
        if (act) {
            /* scores of the slice: keys 8jn + (column), per k-step Qhi·Khi, Qhi·Klo, Qlo·Khi */
            float s[2][4];
#pragma unroll
            for (int jn = 0; jn < 2; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[jn][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSM; ks++) {
                if (ks >= nks) break;
#pragma unroll
                for (int jn = 0; jn < 2; jn++) {
                    unsigned b[4]; /* Khi (k 0-7, 8-15), Klo (k 0-7, 8-15) of keys 8jn .. 8jn + 7 */
                    ldsm4(b, ksm + (8 * jn + rr) * ldh + sb + 16 * ks + (mi & 1) * 8 + (mi >> 1) * d);
                    tc_mma(s[jn], qh[ks], b[0], b[1]);
                    tc_mma(s[jn], qh[ks], b[2], b[3]);
                    tc_mma(s[jn], ql[ks], b[0], b[1]);
                }
            }
            if constexpr (NS > 1) { /* the head's scores: the slices' partial sums, slice 0 first */
                float4 *xw = xb + (size_t)warp * 64;
                xw[lane] = make_float4(s[0][0], s[0][1], s[0][2], s[0][3]);
                xw[32 + lane] = make_float4(s[1][0], s[1][1], s[1][2], s[1][3]);
                tc_bar<32 * NS>(wr);
#pragma unroll
                for (int u = 0; u < NS; u++) {
                    const float4 *xu = xb + (size_t)(wr * NS + u) * 64;
#pragma unroll
                    for (int jn = 0; jn < 2; jn++) {
                        const float4 v = xu[32 * jn + lane];
                        if (u == 0) {
                            s[jn][0] = v.x;
                            s[jn][1] = v.y;
                            s[jn][2] = v.z;
                            s[jn][3] = v.w;
                        } else {
                            s[jn][0] = s[jn][0] + v.x;
                            s[jn][1] = s[jn][1] + v.y;
                            s[jn][2] = s[jn][2] + v.z;
                            s[jn][3] = s[jn][3] + v.w;
                        }
                    }
                }
            }
            /* the online softmax of rows g (i = 0: c0, c1) and g + 8 (i = 1: c2, c3); element
             * (jn, 2i + e) is key kb0 + 8jn + 2t + e */
            float p[2][4], scl[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                bool vis[2][2];
                float bm = -INFINITY;
#pragma unroll
                for (int jn = 0; jn < 2; jn++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int kp = kb0 + 8 * jn + 2 * t + e;
                        vis[jn][e] = kp >= lo[i] && kp <= pq[i];
                        if (vis[jn][e]) bm = fmaxf(bm, s[jn][2 * i + e]);
                    }
                bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, 1));
                bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, 2));
                /* no key of this block for the row: weights 0, scale exactly 1, nothing changes */
                const bool any = bm != -INFINITY;
                const float mn = any ? fmaxf(mrun[i], bm) : mrun[i];
                scl[i] = any ? expf(mrun[i] - mn) : 1.0f; /* 0 on the row's first block (its sums are 0) */
                float ps = 0.0f;                           /* the lane's columns in ascending order */
#pragma unroll
                for (int jn = 0; jn < 2; jn++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        p[jn][2 * i + e] = vis[jn][e] ? expf(s[jn][2 * i + e] - mn) : 0.0f;
                        ps = ps + p[jn][2 * i + e];
                    }
                ps = ps + __shfl_xor_sync(0xffffffffu, ps, 1);
                ps = ps + __shfl_xor_sync(0xffffffffu, ps, 2);
                if (any) lrun[i] = lrun[i] * scl[i] + ps;
                mrun[i] = mn;
            }
            /* the weights as the A fragment of keys 0..15: two adjacent n8 score tiles */
            tc_split(p[0][0], p[0][1], ph[0], pl[0]);
            tc_split(p[0][2], p[0][3], ph[1], pl[1]);
            tc_split(p[1][0], p[1][1], ph[2], pl[2]);
            tc_split(p[1][2], p[1][3], ph[3], pl[3]);
            if (__any_sync(0xffffffffu, scl[0] != 1.0f || scl[1] != 1.0f)) /* (x 1 is exact: skipping it changes nothing) */
#pragma unroll
                for (int jd = 0; jd < NDM; jd++) {
                    o[jd][0] = o[jd][0] * scl[0];
                    o[jd][1] = o[jd][1] * scl[0];
                    o[jd][2] = o[jd][2] * scl[1];
                    o[jd][3] = o[jd][3] * scl[1];
                }
        }
        store(vsm, vr); /* every warp is done with the previous block's values (the barrier ending it) */
        if (more) load(kr, a.kst, a.kc, kb0 + KB * PART); /* in flight during the value sums */
        __syncthreads(); /* the values are in; every warp is done with the keys */
        if (act) /* the value sums of the slice, per 8 columns Phi·Vhi, Phi·Vlo, Plo·Vhi */
#pragma unroll
            for (int jd = 0; jd < NDM; jd++) {
                if (jd >= nd) break;
                unsigned b[4]; /* Vhi (keys 0-7, 8-15), Vlo (keys 0-7, 8-15) of columns sb + 8jd .. + 7 */
                tc_ldsm4t(b, vsm + ((mi & 1) * 8 + rr) * ldh + sb + 8 * jd + (mi >> 1) * d);
                tc_mma(o[jd], ph, b[0], b[1]);
                tc_mma(o[jd], ph, b[2], b[3]);
                tc_mma(o[jd], pl, b[0], b[1]);
            }
        if (more) store(ksm, kr);
        __syncthreads(); /* the next keys are in; every warp is done with the values */
    }
    if constexpr (PART == 1) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (!qp[i]) continue;
            const size_t off = (size_t)(qp[i] - a.q);
#pragma unroll
            for (int jd = 0; jd < NDM; jd++) {
                if (jd >= nd) break;
                const float v[2] = {o[jd][2 * i] / lrun[i], o[jd][2 * i + 1] / lrun[i]};
                pa_store(a, off + 8 * jd + 2 * t, v);
            }
        }
    } else { /* the unnormalised partial sums, whether or not the row saw a key here (m -inf, l 0, o 0) */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (!qp[i]) continue;
            const size_t pr = (size_t)((qp[i] - sb - a.q) / d) * PART + part; /* (token·nH + head)·PART + partition */
            float *po = a.part + pr * d + sb;
#pragma unroll
            for (int jd = 0; jd < NDM; jd++) {
                if (jd >= nd) break;
                *reinterpret_cast<float2 *>(po + 8 * jd + 2 * t) = make_float2(o[jd][2 * i], o[jd][2 * i + 1]);
            }
            if (sl == 0 && t == 0) *reinterpret_cast<float2 *>(a.part + (size_t)a.M * a.nH * PART * d + 2 * pr) = make_float2(mrun[i], lrun[i]);
        }
    }
}

/* kb = 1's second launch: a warp per row (token m, head h), lanes over its elements (d a multiple
 * of 16): the TC_PART partitions' partial sums (m_j, l_j, o_j) merged in partition order, the
 * empty ones (m_j = -inf: no key of the row in the partition) skipped: m = max m_j, w_j =
 * expf(m_j - m), l = sum l_j·w_j, o = sum o_j·w_j, att = o / l; written through pa_store */
__global__ void __launch_bounds__(256) g4c_pattn_merge_kernel(const pa_args a) {
    pdl_enter();
    constexpr int P = TC_PART;
    const int lane = threadIdx.x & 31, d = a.d;
    const long long r = (long long)blockIdx.x * 8 + (threadIdx.x >> 5); /* token·nH + head */
    if (r >= (long long)a.M * a.nH) return;
    const float4 *ml = reinterpret_cast<const float4 *>(a.part + (size_t)a.M * a.nH * P * d + (size_t)r * 2 * P);
    const float4 ml0 = __ldcg(ml), ml1 = __ldcg(ml + 1);
    const float mj[P] = {ml0.x, ml0.z, ml1.x, ml1.z}, lj[P] = {ml0.y, ml0.w, ml1.y, ml1.w};
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < P; j++)
        if (mj[j] != -INFINITY) m = fmaxf(m, mj[j]);
    float w[P], l = 0.0f;
#pragma unroll
    for (int j = 0; j < P; j++) {
        w[j] = mj[j] != -INFINITY ? expf(mj[j] - m) : 0.0f;
        if (mj[j] != -INFINITY) l = l + lj[j] * w[j];
    }
    const float *po = a.part + (size_t)r * P * d;
    for (int c4 = lane; c4 < d / 4; c4 += 32) {
        float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < P; j++) {
            if (mj[j] == -INFINITY) continue;
            const float4 x = __ldcg(reinterpret_cast<const float4 *>(po + (size_t)j * d + 4 * c4));
            o[0] = o[0] + x.x * w[j];
            o[1] = o[1] + x.y * w[j];
            o[2] = o[2] + x.z * w[j];
            o[3] = o[3] + x.w * w[j];
        }
        const float v[4] = {o[0] / l, o[1] / l, o[2] / l, o[3] / l};
        pa_store(a, (size_t)r * d + 4 * c4, v);
    }
}

/* the SIMT instantiations: heads up to 128 and 256 wide in blocks of 32 keys, two blocks per SM;
 * 256 in blocks of 64 (kb = 64: one block per SM); 512 in blocks of 32 */
template <int D, int KB, int MINB> static cudaError_t pa_attr() {
    return cudaFuncSetAttribute(g4c_pattn_kernel<D, KB, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pa_smem<D, KB>());
}
template <int D, int WR, int PART> static cudaError_t tc_attr() {
    return cudaFuncSetAttribute(g4c_pattn_tc_kernel<D, WR, PART>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)tc_smem<D, WR>());
}
cudaError_t g4c_pattn_init(void) {
    cudaError_t e = pa_attr<128, 32, 2>();
    if (!e) e = pa_attr<256, 32, 2>();
    if (!e) e = pa_attr<256, 64, 1>();
    if (!e) e = pa_attr<512, 32, 1>();
    if (!e) e = tc_attr<128, 2, 1>();
    if (!e) e = tc_attr<256, 2, 1>();
    if (!e) e = tc_attr<256, 4, 1>();
    if (!e) e = tc_attr<512, 2, 1>();
    if (!e) e = tc_attr<128, 2, TC_PART>();
    if (!e) e = tc_attr<256, 2, TC_PART>();
    if (!e) e = tc_attr<256, 4, TC_PART>();
    if (!e) e = tc_attr<512, 2, TC_PART>();
    return e;
}

int g4c_pattn_ok(const g4c_op *op) {
    if (op->kind != G4C_OP_ATTN || op->drafter || op->n_heads <= op->n_kv || op->n_kv < 1 || op->n_heads % op->n_kv) return 0;
    const int group = op->n_heads / op->n_kv;
    return group <= PA_ROWS && op->d >= 4 && op->d % 4 == 0 && op->d <= 512 && op->cap_rows > 0;
}

size_t g4c_pattn_scratch_floats(const g4c_op *op, int max_M) {
    return max_M > 0 ? (size_t)max_M * op->n_heads * TC_PART * (op->d + 2) : 0;
}

/* PART > 1: the partitions' launch, then the merge's */
template <int D, int WR, int PART> static cudaError_t tc_launch(pa_args a, cudaStream_t stream) {
    a.tq = 16 * WR / a.group;
    const dim3 grid((a.M + a.tq - 1) / a.tq * PART, a.nkv);
    cudaError_t e = pdl_launch(a.pdl, g4c_pattn_tc_kernel<D, WR, PART>, grid, dim3(tc_threads<D, WR>()), tc_smem<D, WR>(), stream, a);
    if constexpr (PART > 1)
        if (!e)
            e = pdl_launch(a.pdl, g4c_pattn_merge_kernel, dim3((unsigned)(((long long)a.M * a.nH + 7) / 8)), dim3(256), 0, stream, a);
    return e;
}

cudaError_t g4c_pattn_launch(const g4c_op *op, const float *q, int pos0, int M, cudaStream_t stream, int kb, unsigned short *xt,
                             size_t xts, int xld, int pdl, float *scratch, size_t scratch_floats) {
    pa_args a;
    a.pdl = pdl;
    a.part = NULL;
    a.xt = xt;
    a.xts = xts;
    a.xld = xld;
    a.q = q;
    a.kst = op->kst;
    a.vst = op->vst;
    a.kc = op->kc;
    a.vc = op->vc;
    a.att = op->att;
    a.nH = op->n_heads;
    a.nkv = op->n_kv;
    a.d = op->d;
    a.group = op->n_heads / op->n_kv;
    a.tq = PA_ROWS / a.group;
    a.is_full = op->is_full;
    a.window = op->window;
    a.cap = op->cap_rows;
    a.pos0 = pos0;
    a.M = M;
    /* the tensor cores: which instantiation is a function of d alone (its bits: the slices, so the
     * order of a score's sums); the tile height is free (a row's bits do not depend on it): 64 rows
     * (half the staging and L2 traffic per product) when that still gives a wave of an H200's 132 SMs */
    if (kb == 0 && a.d % 16 == 0 && a.group <= 32) {
        if (a.d <= 128) return tc_launch<128, 2, 1>(a, stream);
        if (a.d <= 256 && a.d % 32 == 0) {
            const int tq4 = 64 / a.group;
            if (a.d % 64 == 0 && (long long)((M + tq4 - 1) / tq4) * a.nkv >= 132) return tc_launch<256, 4, 1>(a, stream);
            return tc_launch<256, 2, 1>(a, stream);
        }
        if (a.d > 256 && a.d % 64 == 0) return tc_launch<512, 2, 1>(a, stream);
    }
    /* kb = 1, the key partitions: kb = 0's shapes (the same slices), by d alone: 64-row tiles for
     * heads 129..256 wide when d is a multiple of 64 (the staging's 16 threads a key row), else
     * 32 (128-wide: the fixtures' sizes only; 512-wide: 255 registers at 256 threads already); d
     * the tensor cores do not take falls back as kb = 0 does (no scratch used) */
    if (kb == 1 && a.d % 16 == 0 && a.group <= 32 &&
        (a.d <= 128 || (a.d <= 256 ? a.d % 32 == 0 : a.d % 64 == 0))) {
        if (!scratch || scratch_floats < g4c_pattn_scratch_floats(op, M) || ((uintptr_t)scratch & 15)) return cudaErrorInvalidValue;
        a.part = scratch;
        if (a.d <= 128) return tc_launch<128, 2, TC_PART>(a, stream);
        if (a.d <= 256) return a.d % 64 == 0 ? tc_launch<256, 4, TC_PART>(a, stream) : tc_launch<256, 2, TC_PART>(a, stream);
        return tc_launch<512, 2, TC_PART>(a, stream);
    }
    const dim3 grid((M + a.tq - 1) / a.tq, a.nkv);
    if (a.d <= 128) return pdl_launch(a.pdl, g4c_pattn_kernel<128, 32, 2>, grid, dim3(PA_THREADS), pa_smem<128, 32>(), stream, a);
    if (a.d <= 256 && kb == 64) return pdl_launch(a.pdl, g4c_pattn_kernel<256, 64, 1>, grid, dim3(PA_THREADS), pa_smem<256, 64>(), stream, a);
    if (a.d <= 256) return pdl_launch(a.pdl, g4c_pattn_kernel<256, 32, 2>, grid, dim3(PA_THREADS), pa_smem<256, 32>(), stream, a);
    return pdl_launch(a.pdl, g4c_pattn_kernel<512, 32, 1>, grid, dim3(PA_THREADS), pa_smem<512, 32>(), stream, a);
}

/* the kernel alone on host arrays (tests/gpu/gpu_gemm): positions < pos0 from a cache of
 * max(window, 1) rows (sliding) or pos0 rows (full), as a session keeps them, the block's own rows
 * staged */
extern "C" g4_status g4_cuda_pattn(const float *q, const float *k, const float *v, int pos0, int M, int nH, int nkv, int d,
                                   int is_full, int window, int kb, float *att, int reps, double *ms, g4_error *err) {
    if (M < 1 || pos0 < 0 || nkv < 1 || nH <= nkv || nH % nkv || nH / nkv > PA_ROWS || d < 4 || d % 4 || d > 512 ||
        (!is_full && window < 1))
        return g4_fail(err, G4_ERR_ARG, "prefill attention: unsupported shape (M %d, %d heads, %d KV heads, d %d, window %d)", M,
                       nH, nkv, d, window);
    if (kb != 0 && kb != 1 && kb != 32 && kb != 64)
        return g4_fail(err, G4_ERR_ARG,
                       "prefill attention: no variant kb = %d (0 tensor cores, 1 tensor cores in key partitions, 32 or 64 SIMT)", kb);
    const int row = nkv * d, cap = is_full ? (pos0 > 0 ? pos0 : 1) : window;
    g4c_op op;
    memset(&op, 0, sizeof op);
    op.kind = G4C_OP_ATTN;
    op.n_heads = nH;
    op.n_kv = nkv;
    op.d = d;
    op.is_full = is_full;
    op.window = window;
    op.cap_rows = cap;
    float *dq = NULL, *dkc = NULL, *dvc = NULL, *dks = NULL, *dvs = NULL, *da = NULL, *dp = NULL;
    const size_t np = kb == 1 ? g4c_pattn_scratch_floats(&op, M) : 0; /* kb = 1's partial sums */
    float *hk = (float *)calloc((size_t)cap * row, sizeof(float)), *hv = (float *)calloc((size_t)cap * row, sizeof(float));
    cudaEvent_t ev[2] = {NULL, NULL};
    g4_status st = G4_OK;
    cudaError_t e = hk && hv ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int j = pos0 - cap > 0 ? pos0 - cap : 0; !e && j < pos0; j++) {
        memcpy(hk + (size_t)(j % cap) * row, k + (size_t)j * row, sizeof(float) * row);
        memcpy(hv + (size_t)(j % cap) * row, v + (size_t)j * row, sizeof(float) * row);
    }
    const size_t nq = (size_t)M * nH * d, nc = (size_t)cap * row, ns = (size_t)M * row;
    if (!e) e = cudaMalloc((void **)&dq, nq * 4);
    if (!e) e = cudaMalloc((void **)&da, nq * 4);
    if (!e) e = cudaMalloc((void **)&dkc, nc * 4);
    if (!e) e = cudaMalloc((void **)&dvc, nc * 4);
    if (!e) e = cudaMalloc((void **)&dks, ns * 4);
    if (!e) e = cudaMalloc((void **)&dvs, ns * 4);
    if (!e && np) e = cudaMalloc((void **)&dp, np * 4);
    if (!e && np) e = cudaMemset(dp, 0xff, np * 4); /* NaN: a partial sum never written shows */
    if (!e) e = cudaMemcpy(dq, q, nq * 4, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dkc, hk, nc * 4, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dvc, hv, nc * 4, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dks, k + (size_t)pos0 * row, ns * 4, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dvs, v + (size_t)pos0 * row, ns * 4, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemset(da, 0xff, nq * 4);
    op.kc = dkc;
    op.vc = dvc;
    op.kst = dks;
    op.vst = dvs;
    op.att = da;
    if (!e) e = g4c_pattn_init();
    if (!e) e = g4c_pattn_launch(&op, dq, pos0, M, 0, kb, NULL, 0, 0, 0, dp, np);
    if (!e) e = cudaDeviceSynchronize();
    if (!e && reps > 0) {
        e = cudaEventCreate(&ev[0]);
        if (!e) e = cudaEventCreate(&ev[1]);
        if (!e) e = cudaEventRecord(ev[0]);
        for (int r = 0; !e && r < reps; r++) e = g4c_pattn_launch(&op, dq, pos0, M, 0, kb, NULL, 0, 0, 0, dp, np);
        if (!e) e = cudaEventRecord(ev[1]);
        if (!e) e = cudaEventSynchronize(ev[1]);
        float t = 0;
        if (!e) e = cudaEventElapsedTime(&t, ev[0], ev[1]);
        if (!e && ms) *ms = t / reps;
    }
    if (!e) e = cudaMemcpy(att, da, nq * 4, cudaMemcpyDeviceToHost);
    if (e) st = g4_cuda_fail(err, e, "prefill attention test");
    for (cudaEvent_t x : ev)
        if (x) cudaEventDestroy(x);
    cudaFree(dq);
    cudaFree(da);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dks);
    cudaFree(dvs);
    cudaFree(dp);
    free(hk);
    free(hv);
    return st;
}
