/* The prefill GEMM as a kernel of its own (the matmul stages of a fast prefill: session.cu
 * pg_plan; measured and checked alone by tests/gpu/gpu_gemm): Y[m][r] = sum_k W[r][k] · x[m][k]
 * for a prompt's M tokens, with each input
 * row given as the prefill procedure's three bf16 terms x = h + mid + l (forward.cuh split_bf16,
 * fp_prep) and W bf16 rows or per-channel signed 4-bit rows (see g4c_pgemm_kernel).
 *
 * Why a kernel of its own: inside the persistent kernel a prefill matmul stage is an input phase,
 * a grid barrier, 64-token items and (for most shapes) a K split with a second barrier and a
 * reduction; traced on the H200 (E2B bf16, 64-token chunk) its gate/up stage streams 37.8 MB in
 * 81 µs (~0.46 TB/s, ~90 TFLOP/s of bf16 products) and a 256-token chunk runs at ~6.3k tok/s. Here
 * a block owns a 128-row × 128-token output tile over the whole K range: no barrier, no split, no
 * partials, a 3-deep cp.async pipeline of 64-column chunks, every weight byte meets 128 tokens.
 *
 * Exactness: each output is one accumulator, taking per 32-column k-step its two 16-column halves
 * in order and per half the products with h, mid and l in that order (the order of forward.cuh
 * fp_kstep), k-steps ascending. Which tile a token or a row falls in changes nothing, so a token's
 * outputs are the same bits for any M.
 *
 * pgemm_wg.cu is the same GEMM on Hopper's wgmma for the same weights (g4c_pgemm_wg_launch: the
 * same segments, reduction and epilogue - pgemm.cuh - with bits of its own). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/forward.cuh"
#include "cuda/internal.h"
#include "cuda/pgemm.cuh"

namespace {
constexpr int PG_BM = 128;                /* weight rows per block tile */
constexpr int PG_BN = 128;                /* tokens per block tile */
constexpr int PG_KC = 64;                 /* columns per staged chunk: two k-steps (the last may hold one) */
constexpr int PG_NBUF = 3;                /* chunks in the pipeline (H200, E2B shapes at 2048 tokens: 64 x 3
                                             26.0k tok/s of matmuls, 32 x 4 and 32 x 5 22.6k) */
constexpr int PG_LDS = PG_KC + 8;         /* staged row stride (bf16): 16 bytes of padding, ldmatrix conflict-free */
constexpr int PG_TERMS = G4C_FP_TERMS;
constexpr int PG_PR = PG_KC / 8;          /* 16-byte pieces per staged row */
constexpr int PG_WS = PG_BM * PG_LDS;     /* bf16 elements of a chunk's weights (4-bit rows: 128 x 48 bytes) */
constexpr int PG_LDQ = PG_KC / 2 + 16;    /* staged 4-bit row stride (bytes): rows g = 0..7 on distinct banks */
constexpr int PG_XS = PG_TERMS * PG_BN * PG_LDS;
constexpr int PG_BUF = PG_WS + PG_XS;
constexpr size_t PG_SMEM = sizeof(unsigned short) * PG_NBUF * PG_BUF;
#ifndef PG_TI_
#define PG_TI_ 4
#endif
/* 16-row tiles per warp (4: 8 warps of 64 rows x 32 tokens; 2: 16 warps; 1: 32 warps). H200, E2B
 * shapes at 2048 tokens: 26.1k / 24.7k / 21.0k tok/s of matmuls: more warps per scheduler do not
 * help (ncu at 4: tensor pipe ~32% busy, 6.1 cycles per issued instruction, mostly short waits on
 * the fragments just loaded) */
constexpr int PG_TI = PG_TI_;
constexpr int PG_WR = PG_BM / (16 * PG_TI); /* warps along the rows; 4 along the tokens (32 each) */
constexpr int PG_THREADS = 32 * 4 * PG_WR;
} // namespace

/* WT G4C_BF16: w bf16 row-major, row r at w + r·rb bytes. WT G4C_Q4: per-channel signed 4-bit rows
 * (program.h layout: codes LSB-first, element = s·(q − 8), one f32 scale per row at byte sc_off,
 * no bias): the A fragments are the exact bf16 integers q − 8, each output's sum runs over the
 * whole K range and is multiplied by the row's scale once at the end (s·Σ(q − 8)x). */
template <int WT>
__global__ void __launch_bounds__(PG_THREADS, 1)
    g4c_pgemm_kernel(const unsigned short *__restrict__ x, size_t ts, int ldx, int M, const char *__restrict__ w, long long rb,
                     int sc_off, int N, int K, const g4c_pg_epi epi, float *__restrict__ part) {
    extern __shared__ __align__(16) unsigned short pg_sm[];
    pdl_enter();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, mi = lane >> 3, rr = lane & 7;
    /* token tiles fastest: the blocks running at once share a few row tiles' weights through L2 */
    const int n0 = blockIdx.x * PG_BN, r0 = blockIdx.y * PG_BM;
    const int wrow = (warp % PG_WR) * 16 * PG_TI, wtok = (warp / PG_WR) * 32;
    /* K segment blockIdx.z of gridDim.z (a function of N and K only: g4c_pgemm_segments) */
    int kb, ke;
    pg_segment(K, blockIdx.z, gridDim.z, &kb, &ke);
    const int nk = (ke - kb + 1) / 2; /* chunks */
    /* K split: the segment's partial sums, added in segment order by g4c_pgemm_reduce */
    float *const y = gridDim.z > 1 ? part + (size_t)blockIdx.z * M * N : NULL;
    auto stage = [&](int b, int kc) {
        unsigned short *ws = pg_sm + (size_t)b * PG_BUF, *xs = ws + PG_WS;
        const int k0 = 32 * kb + kc * PG_KC, lim = 32 * ke - k0; /* columns of the segment left */
        if constexpr (WT == G4C_Q4) { /* 32 code bytes per row and chunk */
            char *wq = reinterpret_cast<char *>(ws);
#pragma unroll
            for (int j = 0; j < PG_BM * 2 / PG_THREADS; j++) {
                const int f = tid + j * PG_THREADS, r = f >> 1, c = f & 1;
                if (32 * c >= lim) continue;
                cp16(wq + r * PG_LDQ + 16 * c, w + (size_t)min(r0 + r, N - 1) * rb + k0 / 2 + 16 * c);
            }
        } else {
#pragma unroll
            for (int j = 0; j < PG_BM * PG_PR / PG_THREADS; j++) {
                const int f = tid + j * PG_THREADS, r = f / PG_PR, c = f % PG_PR;
                if (8 * c >= lim) continue;
                cp16(ws + r * PG_LDS + 8 * c, w + (size_t)min(r0 + r, N - 1) * rb + 2 * (k0 + 8 * c));
            }
        }
#pragma unroll
        for (int j = 0; j < PG_TERMS * PG_BN * PG_PR / PG_THREADS; j++) {
            const int f = tid + j * PG_THREADS, term = f / (PG_BN * PG_PR), m = f / PG_PR % PG_BN, c = f % PG_PR;
            if (8 * c >= lim) continue;
            cp16(xs + (term * PG_BN + m) * PG_LDS + 8 * c, x + term * ts + (size_t)min(n0 + m, M - 1) * ldx + k0 + 8 * c);
        }
    };
#pragma unroll
    for (int b = 0; b < PG_NBUF - 1; b++) {
        if (b < nk) stage(b, b);
        cp_commit();
    }
    float c[PG_TI][4][4];
#pragma unroll
    for (int i = 0; i < PG_TI; i++)
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int e = 0; e < 4; e++) c[i][q][e] = 0.0f;
#pragma unroll 1
    for (int kc = 0; kc < nk; kc++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(PG_NBUF - 2) : "memory");
        __syncthreads(); /* chunk kc is in; every warp is done with chunk kc - 1's buffer */
        if (kc + PG_NBUF - 1 < nk) stage((kc + PG_NBUF - 1) % PG_NBUF, kc + PG_NBUF - 1);
        cp_commit();
        const unsigned short *ws = pg_sm + (size_t)(kc % PG_NBUF) * PG_BUF, *xs = ws + PG_WS;
        auto kstep = [&](int ks) {
            unsigned b[4][PG_TERMS][4];
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
                for (int term = 0; term < PG_TERMS; term++)
                    ldsm4(b[q][term], xs + (term * PG_BN + wtok + 8 * q + rr) * PG_LDS + 32 * ks + 8 * mi);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                unsigned a[PG_TI][4];
#pragma unroll
                for (int i = 0; i < PG_TI; i++) {
                    if constexpr (WT == G4C_Q4) { /* the half's 16 columns are 8 code bytes: 16hf + 2t (+1) byte t, + 8 byte t + 4 */
#pragma unroll
                        for (int h2 = 0; h2 < 2; h2++) {
                            const uint2 v = *reinterpret_cast<const uint2 *>(reinterpret_cast<const char *>(ws) +
                                                                            (wrow + 16 * i + g + 8 * h2) * PG_LDQ + 16 * ks + 8 * hf);
                            const unsigned u = __byte_perm(v.x, v.y, (unsigned)t | ((unsigned)(t + 4) << 4));
                            a[i][h2] = q4_pair(u, 0xC308C308u);
                            a[i][2 + h2] = q4_pair(u >> 8, 0xC308C308u);
                        }
                    } else
                        ldsm4(a[i], ws + (wrow + 16 * i + (mi & 1) * 8 + rr) * PG_LDS + 32 * ks + 16 * hf + (mi >> 1) * 8);
                }
#pragma unroll
                for (int term = 0; term < PG_TERMS; term++)
#pragma unroll
                    for (int q = 0; q < 4; q++)
#pragma unroll
                        for (int i = 0; i < PG_TI; i++)
                            mma_bf16(c[i][q], a[i][0], a[i][1], a[i][2], a[i][3], b[q][term][2 * hf], b[q][term][2 * hf + 1]);
            }
        };
        kstep(0);
        if (kb + 2 * kc + 1 < ke) kstep(1);
    }
#pragma unroll
    for (int i = 0; i < PG_TI; i++)
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + wrow + 16 * i + g + (e >> 1) * 8, m = n0 + wtok + 8 * q + 2 * t + (e & 1);
                if (r >= N || m >= M) continue;
                float v = c[i][q][e];
                if (y) {
                    y[(size_t)m * N + r] = v;
                    continue;
                }
                /* per-channel scale: applied once, by the segments' sum (g4c_pgemm_reduce) when K is split */
                if constexpr (WT == G4C_Q4) v = __ldg(reinterpret_cast<const float *>(w + (size_t)r * rb + sc_off)) * v;
                pg_store(epi, m, r, v);
            }
}

/* output (m, r) = ((part_0 + part_1) + part_2) + ... in segment order (times row r's scale when sc
 * is not NULL), then the epilogue */
static __global__ void g4c_pgemm_reduce(const float *__restrict__ part, int S, int M, int N, const g4c_pg_epi epi,
                                 const char *__restrict__ sc, long long rb) {
    pdl_enter();
    const size_t n = (size_t)M * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = part[i];
        for (int s = 1; s < S; s++) v = v + part[(size_t)s * n + i];
        if (sc) v = __ldg(reinterpret_cast<const float *>(sc + (size_t)(i % N) * rb)) * v;
        pg_store(epi, (int)(i / N), (int)(i % N), v);
    }
}

/* K segments of a shape (never of M, so a token's outputs do not depend on the block): enough row
 * tiles x segments for about one wave of an H200's 132 SMs, each segment at least 16 k-steps. The
 * 132 is a constant on purpose, not the device's SM count: the split, and so the bits of every
 * output, must not depend on which GPU ran it. */
int g4c_pgemm_segments(int N, int K) {
    const int tiles = (N + PG_BM - 1) / PG_BM, nks = K / 32;
    int s = 132 / tiles;
    if (s > nks / 16) s = nks / 16;
    return s < 1 ? 1 : s;
}

cudaError_t g4c_pgemm_init(void) {
    cudaError_t e = cudaFuncSetAttribute(g4c_pgemm_kernel<G4C_BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PG_SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(g4c_pgemm_kernel<G4C_Q4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PG_SMEM);
    return e;
}

cudaError_t g4c_pgemm_launch(const unsigned short *x, size_t ts, int ldx, int M, const g4c_mat *w, const g4c_pg_epi *epi,
                             float *part, cudaStream_t stream) {
    const int N = w->rows, K = w->cols, S = g4c_pgemm_segments(N, K);
    const bool q4 = w->type == G4C_Q4;
    const dim3 grid((M + PG_BN - 1) / PG_BN, (N + PG_BM - 1) / PG_BM, S);
    const char *wd = (const char *)w->data;
    const cudaError_t e = pdl_launch(epi->pdl, q4 ? g4c_pgemm_kernel<G4C_Q4> : g4c_pgemm_kernel<G4C_BF16>, grid, dim3(PG_THREADS),
                                     PG_SMEM, stream, x, ts, ldx, M, wd, w->row_bytes, q4 ? w->sc_off : 0, N, K, *epi, part);
    if (e) return e;
    if (S > 1) return g4c_pgemm_reduce_launch(part, S, M, w, epi, stream);
    return cudaSuccess;
}

cudaError_t g4c_pgemm_reduce_launch(const float *part, int S, int M, const g4c_mat *w, const g4c_pg_epi *epi, cudaStream_t stream) {
    const int N = w->rows;
    const size_t n = ((size_t)M * N + 255) / 256;
    return pdl_launch(epi->pdl, g4c_pgemm_reduce, dim3((unsigned)(n < 4096 ? n : 4096)), dim3(256), 0, stream, part, S, M, N, *epi,
                      w->type == G4C_Q4 ? (const char *)w->data + w->sc_off : NULL, w->row_bytes);
}

extern "C" g4_status g4_cuda_pgemm(const uint16_t *terms, const void *w, int wtype, long long row_bytes, int sc_off, int M,
                                   int N, int K, int variant, float *y, int reps, double *ms, g4_error *err) {
    if (M < 1 || N < 1 || K < 32 || K % 32)
        return g4_fail(err, G4_ERR_ARG, "prefill GEMM: bad shape (M %d, N %d, K %d: K must be a positive multiple of %d)", M, N,
                       K, 32);
    const bool q4 = wtype == G4C_Q4;
    if (variant != 0 && variant != 1) return g4_fail(err, G4_ERR_ARG, "prefill GEMM: no variant %d (0 mma.sync, 1 wgmma)", variant);
    if ((wtype != G4C_BF16 && !q4) || row_bytes % 16 || row_bytes < (q4 ? K / 2 : 2LL * K) ||
        (q4 && (sc_off < K / 2 || sc_off % 4 || sc_off + 4 > row_bytes)))
        return g4_fail(err, G4_ERR_ARG, "prefill GEMM: unsupported weights (type %d, %lld bytes per row, scale at %d)", wtype,
                       row_bytes, sc_off);
    const size_t nx = (size_t)PG_TERMS * M * K, nw = (size_t)N * row_bytes, ny = (size_t)M * N;
    unsigned short *dx = NULL;
    char *dw = NULL;
    float *dy = NULL, *dp = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    g4_status st = G4_OK;
    cudaError_t e;
    const int S = g4c_pgemm_segments(N, K);
    g4c_mat wm;
    memset(&wm, 0, sizeof wm);
    wm.rows = N;
    wm.cols = K;
    wm.type = wtype;
    wm.row_bytes = row_bytes;
    wm.sc_off = sc_off;
    g4c_pg_epi ep;
    memset(&ep, 0, sizeof ep);
    ep.kind = G4C_PG_STORE;
    ep.ldy = N;
    auto launch = [&]() {
        return variant ? g4c_pgemm_wg_launch(dx, (size_t)M * K, K, M, &wm, &ep, dp, 0)
                       : g4c_pgemm_launch(dx, (size_t)M * K, K, M, &wm, &ep, dp, 0);
    };
#define PG_CK(call, what)                                                                                              \
    do {                                                                                                               \
        if ((e = (call)) != cudaSuccess) {                                                                             \
            st = g4_cuda_fail(err, e, what);                                                                                \
            goto done;                                                                                                 \
        }                                                                                                              \
    } while (0)
    PG_CK(cudaMalloc(&dx, nx * 2), "prefill GEMM inputs");
    PG_CK(cudaMalloc(&dw, nw), "prefill GEMM weights");
    PG_CK(cudaMalloc(&dy, ny * 4), "prefill GEMM outputs");
    wm.data = dw;
    ep.y = dy;
    if (S > 1) PG_CK(cudaMalloc(&dp, ny * 4 * S), "prefill GEMM partial sums");
    PG_CK(cudaMemcpy(dx, terms, nx * 2, cudaMemcpyHostToDevice), "copying the inputs");
    PG_CK(cudaMemcpy(dw, w, nw, cudaMemcpyHostToDevice), "copying the weights");
    PG_CK(cudaMemset(dy, 0xff, ny * 4), "clearing the outputs");
    PG_CK(variant ? g4c_pgemm_wg_init() : g4c_pgemm_init(), "prefill GEMM shared memory");
    PG_CK(launch(), "launching the prefill GEMM");
    PG_CK(cudaDeviceSynchronize(), "running the prefill GEMM");
    if (reps > 0) {
        PG_CK(cudaEventCreate(&ev[0]), "timing");
        PG_CK(cudaEventCreate(&ev[1]), "timing");
        PG_CK(cudaEventRecord(ev[0]), "timing");
        for (int r = 0; r < reps; r++) PG_CK(launch(), "launching the prefill GEMM");
        PG_CK(cudaEventRecord(ev[1]), "timing");
        PG_CK(cudaEventSynchronize(ev[1]), "running the prefill GEMM");
        float t = 0;
        PG_CK(cudaEventElapsedTime(&t, ev[0], ev[1]), "timing");
        if (ms) *ms = t / reps;
    }
    PG_CK(cudaMemcpy(y, dy, ny * 4, cudaMemcpyDeviceToHost), "copying the outputs");
#undef PG_CK
done:
    for (cudaEvent_t v : ev)
        if (v) cudaEventDestroy(v);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
    cudaFree(dp);
    return st;
}
