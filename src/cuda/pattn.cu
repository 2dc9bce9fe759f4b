/* A fast prefill's attention as a kernel of its own (session.cu pg_plan: the persistent kernel's
 * attention stage, as the last of its launch, norms and ropes the launch's queries and own K/V
 * rows only; this launch does the rest).
 *
 * Why: the persistent kernel's prompt attention (forward.cuh attn_items_tokens) gives every (token,
 * query head) pair a warp and every key a butterfly, so that each value gets the decode
 * procedure's operations; traced on the H200 (E2B bf16, 512-token chunk after 128 tokens) it took
 * 56 ms, a third of the chunk. Here a block owns one KV head and a tile of up to 32 query rows
 * (tokens x the group's query heads) and walks the keys in blocks of KB (32; 64 is a second
 * instantiation for 256-wide heads) at absolute positions, flash-style: the block's K and V rows
 * in shared memory, a warp per 4 query rows; scores in registers (lane l: keys l + 32u), an
 * online softmax per row, the V sums with lane l owning elements 4l .. 4l + 3 of every 128.
 *
 * Exactness (chunk size): a score is one chain over the head's elements in order; a row's running
 * max, sum and outputs are updated once per key block, in block order, from the same values
 * whatever else the tile holds: key blocks sit at absolute positions, a masked key gives exactly 0,
 * and a block in which a row sees no key leaves that row untouched. So a token's attention is the
 * same bits in any launch: a prompt's logits do not depend on the chunk size. The sums run in
 * another order than the decode procedure's (rounding only). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/forward.cuh"
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
};
} // namespace

/* D: the widest head the instantiation takes (d <= D, d % 4 == 0); KB keys per block (32 or 64);
 * MINB blocks per SM (2: 128 registers, and the shared memory of two) */
template <int D, int KB, int MINB>
__global__ void __launch_bounds__(PA_THREADS, MINB) g4c_pattn_kernel(const pa_args a) {
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
        float *out = a.att + ((size_t)m * a.nH + h) * d;
#pragma unroll
        for (int gi = 0; gi < NG; gi++) {
            const int c4 = lane + 32 * gi;
            if (c4 >= d4) continue;
            *reinterpret_cast<float4 *>(out + 4 * c4) =
                make_float4(o[i][gi][0] / lrun[i], o[i][gi][1] / lrun[i], o[i][gi][2] / lrun[i], o[i][gi][3] / lrun[i]);
        }
    }
}

/* the instantiations: heads up to 128 and 256 wide in blocks of 32 keys, two blocks per SM; 256 in
 * blocks of 64 (kb = 64: one block per SM); 512 in blocks of 32 */
template <int D, int KB, int MINB> static cudaError_t pa_attr() {
    return cudaFuncSetAttribute(g4c_pattn_kernel<D, KB, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pa_smem<D, KB>());
}
cudaError_t g4c_pattn_init(void) {
    cudaError_t e = pa_attr<128, 32, 2>();
    if (!e) e = pa_attr<256, 32, 2>();
    if (!e) e = pa_attr<256, 64, 1>();
    if (!e) e = pa_attr<512, 32, 1>();
    return e;
}

int g4c_pattn_ok(const g4c_op *op) {
    if (op->kind != G4C_OP_ATTN || op->drafter || op->n_heads <= op->n_kv || op->n_kv < 1 || op->n_heads % op->n_kv) return 0;
    const int group = op->n_heads / op->n_kv;
    return group <= PA_ROWS && op->d >= 4 && op->d % 4 == 0 && op->d <= 512 && op->cap_rows > 0;
}

cudaError_t g4c_pattn_launch(const g4c_op *op, const float *q, int pos0, int M, cudaStream_t stream, int kb) {
    pa_args a;
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
    const dim3 grid((M + a.tq - 1) / a.tq, a.nkv);
    if (a.d <= 128) g4c_pattn_kernel<128, 32, 2><<<grid, PA_THREADS, pa_smem<128, 32>(), stream>>>(a);
    else if (a.d <= 256 && kb == 64) g4c_pattn_kernel<256, 64, 1><<<grid, PA_THREADS, pa_smem<256, 64>(), stream>>>(a);
    else if (a.d <= 256) g4c_pattn_kernel<256, 32, 2><<<grid, PA_THREADS, pa_smem<256, 32>(), stream>>>(a);
    else g4c_pattn_kernel<512, 32, 1><<<grid, PA_THREADS, pa_smem<512, 32>(), stream>>>(a);
    return cudaGetLastError();
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
    float *dq = NULL, *dkc = NULL, *dvc = NULL, *dks = NULL, *dvs = NULL, *da = NULL;
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
    if (!e) e = g4c_pattn_launch(&op, dq, pos0, M, 0, kb);
    if (!e) e = cudaDeviceSynchronize();
    if (!e && reps > 0) {
        e = cudaEventCreate(&ev[0]);
        if (!e) e = cudaEventCreate(&ev[1]);
        if (!e) e = cudaEventRecord(ev[0]);
        for (int r = 0; !e && r < reps; r++) e = g4c_pattn_launch(&op, dq, pos0, M, 0, kb);
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
    free(hk);
    free(hv);
    return st;
}
