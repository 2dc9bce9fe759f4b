/* gpu_lean_decode: how fast could a batch-1 decode step be with a different kernel design?
 *
 * A standalone prototype (no engine code, random weights generated on the GPU) that runs the
 * stage sequence of a Gemma 4 decode token — per layer: q/k/v, attention over a K/V cache, o,
 * gate/up with GELU, down, the PLE gate and projection; the PLE model projection first, the LM
 * head with argmax last — as one persistent kernel per token, the token id staying on the GPU.
 * What differs from src/cuda/forward.cuh's decode kernel:
 *
 *   - every warp owns one contiguous byte range of each stage's weights (items = a row, or a row
 *     segment when a stage's rows are too few or too long, in segment-major order; gate/up rows
 *     interleaved so an item is a (gate, up) pair whose output is gelu(g)·u);
 *   - the weights reach shared memory by the bulk-copy unit (cp.async.bulk + an mbarrier per
 *     slot) into a per-warp ring of slots, and the warp may issue the copies of the *next*
 *     stages' weights before it waits at the grid barrier (weights do not depend on activations),
 *     so the barrier and the input build overlap the stream instead of preceding it;
 *   - a stage's input is built once per block from the previous stage's partial outputs (summed
 *     in segment order, residual + RMS norms where the model has them) into shared memory;
 *   - attention items are (query head, chunk of 16..128 keys, the fewest that still give about
 *     two items per block); the last block to finish a head's chunks merges their partial
 *     softmax sums in chunk order (no extra barrier).
 *
 * Modes (--modes, a comma list of bit sets): bit 0 = issue the next stages' copies before the
 * barrier; bit 1 = stream and multiply only (no barriers, inputs, attention: the streaming bound);
 * bit 2 = no weights (barriers, inputs and attention only: the synchronisation floor); bit 3 = no
 * inputs and no attention (with bit 2: the grid barriers alone); bits 4-5 = D > 0: an L2 prefetch of
 * each warp's share of stage si + D - 1 (at most L2PF_CAP bytes) is issued before stage si's
 * barrier, so DRAM streams while the barrier and the input build run (D = 1: the stage's own
 * weights, D = 2: the next stage's).
 * --trace prints block 0's time per stage class (barrier wait, input, work) and when warp 0's
 * first and last slots of a matmul stage landed.
 * --check runs one token of a truncated model (--layers) and compares every stage's output with a
 * double-precision host reference of the same operations.
 *
 * Build: nvcc -O3 -std=c++17 -arch=sm_90a -o gpu_lean_decode bench/gpu_lean_decode.cu
 */
#include "gpu_proto.cuh"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

enum { ST_MATVEC, ST_ATTN };
enum { IN_EMBED, IN_SUM, IN_RESNORM, IN_GELUMUL, IN_GELU };
enum { W_BF16, W_Q4 };
enum { M_PREFETCH = 1, M_STREAM_ONLY = 2, M_SYNC_ONLY = 4, M_NO_WORK = 8, M_L2_SHIFT = 4 };
enum { L2PF_CAP = 48 * 1024, TR = 5 };
enum { KCMAX = 128, ATT_SM = KCMAX + 8, MAXWARPS = 16 };

struct Stage {
    int kind, in_op;
    int K;             /* input length */
    int N, S, E, pair; /* output rows, K segments, elements per item, gate/up pair items (S = 1: the
                        * output is gelu(g)·u; else both partials, [S][N][2], for IN_GELU) */
    int ib, cpi;       /* item bytes, items per ring slot */
    int argmax;
    int wt;            /* W_BF16 / W_Q4 */
    const uint8_t *w;  /* items, segment-major */
    const float *sc;   /* Q4: a scale per weight row (pair: 2 per item) */
    float *out;        /* [S][N] partials */
    const float *src;  /* input partials [src_S][src_N] */
    int src_S, src_N;
    const float *mul;  /* IN_GELUMUL */
    const float *res_in;
    float *res_out;
    /* attention */
    int nq, nkv, D, nkeys, kc; /* kc: keys per chunk (16..KCMAX) */
    const float *kc_, *vc; /* [nkv][nkeys][D] */
    float *part;          /* [nq][nchunks][D + 2] */
    unsigned *cnt;        /* [nq] */
};

struct Ctl {
    unsigned count, gen;
    unsigned long long best;
    int tok, err;
    unsigned long long trace[TR * 1024]; /* per stage: start, input built, end, first and last slot landed */
};

__host__ __device__ static inline uint32_t hsh(uint64_t i) {
    i ^= i >> 33;
    i *= 0xff51afd7ed558ccdULL;
    i ^= i >> 33;
    i *= 0xc4ceb9fe1a85ec53ULL;
    i ^= i >> 33;
    return (uint32_t)i;
}
__host__ __device__ static inline float unif(uint64_t i) { return (float)(hsh(i) >> 8) * (1.0f / 8388608.0f) - 1.0f; }
__host__ __device__ static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
__host__ __device__ static inline float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
__host__ __device__ static inline float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}
/* the logical weight (row r, column k) of stage tag t: bf16-rounded uniform, or a 4-bit code */
__host__ __device__ static inline uint64_t wkey(uint64_t t, uint64_t r, uint64_t k, uint64_t K) { return (t << 44) + r * K + k; }

/* ---------------------------------------------------------------- device helpers */

__device__ static inline void mb_init(uint64_t *mb) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(mb)) : "memory");
}
__device__ static inline unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* waits are bounded (2 s, or at once after another wait timed out) so a bug cannot hang the
 * machine: the error flag is raised and the results are garbage */
__device__ static inline bool timed_out(unsigned long long t0, Ctl *ctl, int code) {
    if (*(volatile int *)&ctl->err || gtime() - t0 > 2000000000ull) {
        ctl->err = code;
        return true;
    }
    return false;
}
__device__ static inline bool mb_wait(uint64_t *mb, unsigned parity, Ctl *ctl) {
    const unsigned long long t0 = gtime();
    for (long n = 0;; n++) {
        uint32_t done;
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_u32(mb)), "r"(parity)
                     : "memory");
        if (done) return true;
        if ((n & 1023) == 1023 && timed_out(t0, ctl, 2)) return false;
    }
}
__device__ static inline unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ static inline void st_release(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ static void grid_sync(Ctl *ctl, unsigned &gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = gen;
        __threadfence();
        const unsigned old = atomicAdd(&ctl->count, 1u);
        if (old == gridDim.x - 1) {
            atomicExch(&ctl->count, 0u);
            __threadfence();
            st_release(&ctl->gen, g + 1);
        } else {
            const unsigned long long t0 = gtime();
            for (long n = 0; ld_acquire(&ctl->gen) == g; n++)
                if ((n & 1023) == 1023 && timed_out(t0, ctl, 1)) break;
        }
        gen = g + 1;
    }
    __syncthreads();
}

__device__ static inline float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ static inline float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* block sum in a fixed order: warps' sums, then warp 0 over them */
__device__ static float block_sum(float v, float *red) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    float t = l < nw ? red[l] : 0.0f;
    t = warp_sum(t);
    return t;
}

/* ---------------------------------------------------------------- stage pieces */

/* Activations written by other blocks earlier in the same launch are read around L1 (which is not
 * coherent between SMs): ld.global.cg. Each thread sums the partials of U elements at a time, so
 * U loads per segment are in flight together instead of one L2 round trip after another. */
enum { U = 8 };
__device__ static inline void src_sum(const Stage &s, int k0, float v[U], int two, int off) {
    const int bd = blockDim.x;
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = 0.0f;
    for (int g = 0; g < s.src_S; g++) {
        const float *p = s.src + (size_t)g * s.src_N + off;
        float t[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u * bd;
            t[u] = k < s.K ? (two ? __ldcg(p + 2 * k) : __ldcg(p + k)) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) v[u] += t[u];
    }
}

/* the stage's input vector into xs[0..K) (block-wide) */
__device__ static void build_input(const Stage &s, float *xs, float *red, Ctl *ctl, const uint16_t *embed) {
    const int K = s.K, bd = blockDim.x;
    switch (s.in_op) {
    case IN_EMBED: {
        const int tok = ctl->tok;
        const float sc = sqrtf((float)K);
        for (int k = threadIdx.x; k < K; k += bd) {
            const float v = bf2f(embed[(size_t)tok * K + k]) * sc;
            xs[k] = v;
            if (blockIdx.x == 0 && s.res_out) s.res_out[k] = v;
        }
        break;
    }
    case IN_SUM:
    case IN_GELUMUL:
        for (int k0 = threadIdx.x; k0 < K; k0 += U * bd) {
            float v[U], mu[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = k0 + u * bd;
                mu[u] = s.in_op == IN_GELUMUL && k < K ? __ldcg(s.mul + k) : 1.0f;
            }
            src_sum(s, k0, v, 0, 0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = k0 + u * bd;
                if (k < K) xs[k] = s.in_op == IN_GELUMUL ? gelu(v[u]) * mu[u] : v[u];
            }
        }
        break;
    case IN_GELU:
        for (int k0 = threadIdx.x; k0 < K; k0 += U * bd) {
            float g[U], u_[U];
            src_sum(s, k0, g, 1, 0);
            src_sum(s, k0, u_, 1, 1);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = k0 + u * bd;
                if (k < K) xs[k] = gelu(g[u]) * u_[u];
            }
        }
        break;
    case IN_RESNORM: {
        /* r = res + rms(Σ src); x = rms(r) */
        float ss = 0.0f;
        for (int k0 = threadIdx.x; k0 < K; k0 += U * bd) {
            float v[U], r[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = k0 + u * bd;
                r[u] = k < K ? __ldcg(s.res_in + k) : 0.0f;
            }
            src_sum(s, k0, v, 0, 0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = k0 + u * bd;
                if (k < K) {
                    xs[k] = v[u];
                    xs[K + k] = r[u]; /* the residual beside the input (xs holds 2K floats) */
                    ss = fmaf(v[u], v[u], ss);
                }
            }
        }
        ss = block_sum(ss, red);
        const float a = rsqrtf(ss / K + 1e-6f);
        float s2 = 0.0f;
        for (int k = threadIdx.x; k < K; k += bd) {
            const float r = fmaf(xs[k], a, xs[K + k]);
            xs[k] = r;
            s2 = fmaf(r, r, s2);
            if (blockIdx.x == 0) s.res_out[k] = r;
        }
        s2 = block_sum(s2, red);
        const float b = rsqrtf(s2 / K + 1e-6f);
        for (int k = threadIdx.x; k < K; k += bd) xs[k] *= b;
        break;
    }
    default:
        break;
    }
    __syncthreads();
}

/* the warp's item range of a matvec stage */
__device__ static inline void warp_items(const Stage &s, int gw, int nw, int &i0, int &i1) {
    const long T = (long)s.S * s.N;
    i0 = (int)(T * gw / nw);
    i1 = (int)(T * (gw + 1) / nw);
}

/* an item's per-lane partial dot product(s) from a slot: the row's, or a pair's gate and up
 * (xp: the input at the item's segment) */
__device__ static inline float2 item_partial(int wt, int pair, int E, const uint8_t *p, const float *xp) {
    const int lane = threadIdx.x & 31;
    float r[2] = {0.0f, 0.0f};
#pragma unroll
    for (int q = 0; q < 2; q++) {
        if (q && !pair) break;
        float a0 = 0.0f, a1 = 0.0f;
        if (wt == W_BF16) {
            const uint4 *wp = (const uint4 *)(p + (size_t)q * E * 2);
#pragma unroll 4
            for (int c = lane; c < E / 8; c += 32) {
                const uint4 w = wp[c];
                const float4 x0 = *(const float4 *)(xp + 8 * c), x1 = *(const float4 *)(xp + 8 * c + 4);
                a0 = fmaf(__uint_as_float(w.x << 16), x0.x, a0);
                a1 = fmaf(__uint_as_float(w.x & 0xffff0000u), x0.y, a1);
                a0 = fmaf(__uint_as_float(w.y << 16), x0.z, a0);
                a1 = fmaf(__uint_as_float(w.y & 0xffff0000u), x0.w, a1);
                a0 = fmaf(__uint_as_float(w.z << 16), x1.x, a0);
                a1 = fmaf(__uint_as_float(w.z & 0xffff0000u), x1.y, a1);
                a0 = fmaf(__uint_as_float(w.w << 16), x1.z, a0);
                a1 = fmaf(__uint_as_float(w.w & 0xffff0000u), x1.w, a1);
            }
        } else {
            /* 16 codes (8 bytes) per piece: byte b holds elements 2b (low nibble), 2b+1 (high) */
            const uint2 *wp = (const uint2 *)(p + (size_t)q * E / 2);
#pragma unroll 4
            for (int c = lane; c < E / 16; c += 32) {
                const uint2 w = wp[c];
                const float *xc = xp + 16 * c;
                const unsigned ws[2] = {w.x, w.y};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const unsigned lo = ws[h] & 0x0F0F0F0Fu, hi = (ws[h] >> 4) & 0x0F0F0F0Fu;
                    const float4 xa = *(const float4 *)(xc + 8 * h), xb = *(const float4 *)(xc + 8 * h + 4);
                    const float z = 8388616.0f; /* 2^23 + 8 */
                    a0 = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7540u)) - z, xa.x, a0);
                    a1 = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7540u)) - z, xa.y, a1);
                    a0 = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7541u)) - z, xa.z, a0);
                    a1 = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7541u)) - z, xa.w, a1);
                    a0 = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7542u)) - z, xb.x, a0);
                    a1 = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7542u)) - z, xb.y, a1);
                    a0 = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7543u)) - z, xb.z, a0);
                    a1 = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7543u)) - z, xb.w, a1);
                }
            }
        }
        r[q] = a0 + a1;
    }
    return make_float2(r[0], r[1]);
}

/* two items' partials summed over the warp together (interleaved butterflies) */
__device__ static inline void warp_sum4(float4 &v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
        v.z += __shfl_xor_sync(0xffffffffu, v.z, o);
        v.w += __shfl_xor_sync(0xffffffffu, v.w, o);
    }
}

__device__ static inline unsigned long long argkey(float v, int row) {
    unsigned u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned)(~(unsigned)row);
}

/* attention: items (query head h, chunk c of s.kc keys), so that short contexts still spread over
 * the grid (E2B has one KV head); the last block to finish one of a head's chunks merges the
 * head's partial softmax sums in chunk order (no extra barrier) */
__device__ static void attention(const Stage &s, const float *q, float *smf) {
    const int hq = s.nq / s.nkv, D = s.D, kc = s.kc, nc = (s.nkeys + kc - 1) / kc;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    float *sc = smf;          /* [kc] scores, then weights */
    float *ml = smf + KCMAX;  /* max, sum */
    int *flag = (int *)(ml + 2);
    const float scale = rsqrtf((float)D);
    for (int it = blockIdx.x; it < s.nq * nc; it += gridDim.x) {
        const int h = it / nc, c = it % nc, g = h / hq, j0 = c * kc, nj = min(kc, s.nkeys - j0);
        const float *kb = s.kc_ + ((size_t)g * s.nkeys + j0) * D, *vb = s.vc + ((size_t)g * s.nkeys + j0) * D;
        float qv[16];
#pragma unroll
        for (int e = 0; e < 16; e++) qv[e] = (e * 32 < D) ? q[(size_t)h * D + e * 32 + lane] : 0.0f;
        for (int j = warp; j < nj; j += nw) {
            const float *kr = kb + (size_t)j * D;
            float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
            for (int e = 0; e < 16; e += 2) {
                if (e * 32 < D) a0 = fmaf(qv[e], __ldg(kr + e * 32 + lane), a0);
                if ((e + 1) * 32 < D) a1 = fmaf(qv[e + 1], __ldg(kr + (e + 1) * 32 + lane), a1);
            }
            const float a = warp_sum(a0 + a1);
            if (lane == 0) sc[j] = a * scale;
        }
        __syncthreads();
        if (warp == 0) {
            float m = -INFINITY;
            for (int j = lane; j < nj; j += 32) m = fmaxf(m, sc[j]);
            m = warp_max(m);
            float l = 0.0f;
            for (int j = lane; j < nj; j += 32) {
                const float p = __expf(sc[j] - m);
                sc[j] = p;
                l += p;
            }
            l = warp_sum(l);
            if (lane == 0) {
                ml[0] = m;
                ml[1] = l;
            }
        }
        __syncthreads();
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float o0 = 0.0f, o1 = 0.0f;
            int j = 0;
            for (; j + 1 < nj; j += 2) {
                o0 = fmaf(sc[j], __ldg(vb + (size_t)j * D + d), o0);
                o1 = fmaf(sc[j + 1], __ldg(vb + (size_t)(j + 1) * D + d), o1);
            }
            if (j < nj) o0 = fmaf(sc[j], __ldg(vb + (size_t)j * D + d), o0);
            const float o = o0 + o1;
            if (nc == 1) {
                s.out[(size_t)h * D + d] = o / ml[1];
            } else {
                float *pp = s.part + ((size_t)h * nc + c) * (D + 2);
                pp[2 + d] = o;
                if (d == 0) {
                    pp[0] = ml[0];
                    pp[1] = ml[1];
                }
            }
        }
        if (nc > 1) {
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) *flag = atomicAdd(&s.cnt[h], 1u) == (unsigned)nc - 1;
            __syncthreads();
            if (*flag) {
                __threadfence();
                const float *ph = s.part + (size_t)h * nc * (D + 2);
                for (int d = threadIdx.x; d < D; d += blockDim.x) {
                    float m = -INFINITY;
                    for (int cc = 0; cc < nc; cc++) m = fmaxf(m, __ldcg(ph + (size_t)cc * (D + 2)));
                    float l = 0.0f, o = 0.0f;
#pragma unroll 4
                    for (int cc = 0; cc < nc; cc++) {
                        const float *pp = ph + (size_t)cc * (D + 2);
                        const float f = __expf(__ldcg(pp) - m);
                        l = fmaf(__ldcg(pp + 1), f, l);
                        o = fmaf(__ldcg(pp + 2 + d), f, o);
                    }
                    s.out[(size_t)h * D + d] = o / l;
                }
                if (threadIdx.x == 0) s.cnt[h] = 0;
            }
        }
        __syncthreads();
    }
}

/* ---------------------------------------------------------------- the kernel */

struct Cursor {
    int st;             /* stage of the next copy to issue (nst: none left) */
    int it, end;        /* its first item; the warp's item end in that stage */
    int ib, cpi;        /* that stage's item bytes and items per slot */
    const uint8_t *w;   /* and its weights */
};

__device__ static inline void cursor_seek(Cursor &c, const Stage *stages, int nst, int from, int gw, int nw, int mode) {
    for (c.st = from; c.st < nst; c.st++) {
        const Stage &s = stages[c.st];
        if (s.kind != ST_MATVEC || (mode & M_SYNC_ONLY)) continue;
        int i0, i1;
        warp_items(s, gw, nw, i0, i1);
        if (i1 > i0) {
            c.it = i0;
            c.end = i1;
            c.ib = s.ib;
            c.cpi = s.cpi;
            c.w = s.w;
            return;
        }
    }
}

__global__ void __launch_bounds__(512, 1)
    lean_kernel(const Stage *stages, int nst, Ctl *ctl, int mode, int nslot, int slot, int xmax, const uint16_t *embed, int trace) {
    extern __shared__ __align__(128) uint8_t sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    const int gw = blockIdx.x * wpb + warp, nw = gridDim.x * wpb;
    float *xs = (float *)sm;
    float *red = xs + (xmax + 31) / 32 * 32;         /* [32]; xs padded: the mbarriers 8-, the ring 16-byte aligned */
    float *att = red + 32;                           /* ATT_SM */
    uint64_t *mbs = (uint64_t *)(att + ATT_SM);
    uint8_t *ring = (uint8_t *)(mbs + MAXWARPS * 16);
    uint64_t *mb = mbs + warp * 16;
    uint8_t *myring = ring + (size_t)warp * nslot * slot;
    if (lane < nslot) mb_init(mb + lane);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    unsigned gen = 0;
    if (threadIdx.x == 0) gen = *(volatile unsigned *)&ctl->gen;

    Cursor cur;
    cursor_seek(cur, stages, nst, 0, gw, nw, mode);
    unsigned issued = 0, consumed = 0;
    unsigned long long best = 0;
    /* issue copies while slots are free; stage-limited unless prefetching across barriers */
    auto issue = [&](int limit_st) {
        while (cur.st < nst && cur.st <= limit_st && issued - consumed < (unsigned)nslot) {
            const int n = min(cur.cpi, cur.end - cur.it);
            const unsigned k = issued % nslot;
            __syncwarp();
            if (lane == 0) {
                fence_proxy_async();
                bulk_copy(myring + (size_t)k * slot, cur.w + (size_t)cur.it * cur.ib, (unsigned)(n * cur.ib), mb + k);
            }
            issued++;
            cur.it += n;
            if (cur.it >= cur.end) cursor_seek(cur, stages, nst, cur.st + 1, gw, nw, mode);
        }
    };

    const int l2d = (mode >> M_L2_SHIFT) & 3;
    for (int si = 0; si < nst; si++) {
        const Stage &s = stages[si];
        if (l2d && lane == 0 && !(mode & M_SYNC_ONLY) && si + l2d - 1 < nst) {
            const Stage &t = stages[si + l2d - 1];
            if (t.kind != ST_ATTN) {
                int i0, i1;
                warp_items(t, gw, nw, i0, i1);
                const unsigned long long b = (unsigned long long)(i1 - i0) * t.ib;
                const unsigned n = (unsigned)(b < L2PF_CAP ? b : L2PF_CAP) & ~15u;
                if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(t.w + (size_t)i0 * t.ib), "r"(n) : "memory");
            }
        }
        if (!(mode & M_STREAM_ONLY)) {
            if (si > 0) grid_sync(ctl, gen);
            if (trace && blockIdx.x == 0 && threadIdx.x == 0) ctl->trace[TR * si] = gtime();
            if (!(mode & M_NO_WORK)) build_input(s, xs, red, ctl, embed);
            if (trace && blockIdx.x == 0 && threadIdx.x == 0) ctl->trace[TR * si + 1] = gtime();
        }
        if (s.kind == ST_ATTN) {
            if (!(mode & (M_STREAM_ONLY | M_NO_WORK))) attention(s, xs, att);
        } else if (!(mode & M_SYNC_ONLY)) {
            /* the stage's fields in registers: the output stores below may not alias them */
            const int N = s.N, E = s.E, ib = s.ib, cpi = s.cpi, wt = s.wt, pair = s.pair, both = s.pair && s.S > 1,
                      am = s.argmax;
            const float *scl = s.sc;
            float *out = s.out;
            int i0, i1;
            warp_items(s, gw, nw, i0, i1);
            int row = i0 % N, seg = i0 / N; /* of the next item, advanced without divisions */
            auto next = [N](int &r, int &g) {
                if (++r == N) {
                    r = 0;
                    g++;
                }
            };
            for (int it = i0; it < i1; it += cpi) {
                issue((mode & M_PREFETCH) ? nst : si);
                const unsigned k = consumed % nslot;
                mb_wait(mb + k, (consumed / nslot) & 1, ctl);
                if (trace && blockIdx.x == 0 && threadIdx.x == 0) {
                    const unsigned long long t = gtime();
                    if (it == i0) ctl->trace[TR * si + 3] = t;
                    ctl->trace[TR * si + 4] = t;
                }
                const uint8_t *p = myring + (size_t)k * slot;
                const int n = min(cpi, i1 - it);
                /* 4-bit rows: the slot's scales, one per lane, loaded before the products so that
                 * their latency overlaps them (lane t: item t, or t / 2 and its half for pairs) */
                float sv = 1.0f;
                const int row0 = row;
                if (wt == W_Q4) {
                    const int t = pair ? lane >> 1 : lane;
                    if (t < n) {
                        const int rr = (row + t) % N;
                        sv = __ldg(scl + (pair ? 2 * rr + (lane & 1) : rr));
                    }
                }
                for (int j = 0; j < n; j += 2) {
                    /* two items at a time: independent chains, one interleaved reduction */
                    int row2 = row, seg2 = seg;
                    next(row2, seg2);
                    const float2 pa = item_partial(wt, pair, E, p + (size_t)j * ib, xs + (size_t)seg * E);
                    float2 pb = make_float2(0.0f, 0.0f);
                    if (j + 1 < n) pb = item_partial(wt, pair, E, p + (size_t)(j + 1) * ib, xs + (size_t)seg2 * E);
                    float4 r = make_float4(pa.x, pa.y, pb.x, pb.y);
                    warp_sum4(r);
                    if (wt == W_Q4) {
                        /* the scales of items j, j + 1 from the lanes that loaded them (or loaded now) */
                        const int f = pair ? 2 : 1;
                        float s4[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int t = j + (e >> 1), h = e & 1, src = f * t + h;
                            const float v = __shfl_sync(0xffffffffu, sv, src & 31);
                            s4[e] = (h && !pair) || t >= n ? 1.0f
                                    : src < 32 ? v
                                               : __ldg(scl + (pair ? 2 * ((row0 + t) % N) + h : (row0 + t) % N));
                        }
                        r.x *= s4[0];
                        r.y *= s4[1];
                        r.z *= s4[2];
                        r.w *= s4[3];
                    }
                    if (lane == 0) {
#pragma unroll
                        for (int q = 0; q < 2; q++) {
                            if (q && j + 1 >= n) break;
                            const int item = it + j + q;
                            const float g = q ? r.z : r.x, u = q ? r.w : r.y;
                            if (both) {
                                out[2 * item] = g;
                                out[2 * item + 1] = u;
                            } else {
                                const float v = pair ? gelu(g) * u : g;
                                out[item] = v;
                                if (am) {
                                    const unsigned long long key = argkey(v, item);
                                    best = key > best ? key : best;
                                }
                            }
                        }
                    }
                    row = row2;
                    seg = seg2;
                    if (j + 1 < n) next(row, seg);
                }
                consumed++;
            }
            if (am && lane == 0) atomicMax(&ctl->best, best);
            issue((mode & M_PREFETCH) ? nst : si);
        }
        if (trace && blockIdx.x == 0 && threadIdx.x == 0) ctl->trace[TR * si + 2] = gtime();
    }
    if (!(mode & M_STREAM_ONLY)) {
        grid_sync(ctl, gen);
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            const unsigned long long b = __ldcg(&ctl->best);
            ctl->tok = (int)(~(unsigned)(b & 0xffffffffu) % 4096u);
            ctl->best = 0;
        }
    }
}

/* ---------------------------------------------------------------- weight generation */

__global__ void gen_weights(uint8_t *w, float *sc, int wt, int N, int K, int S, int pair, uint64_t tag, float amp) {
    /* one thread per stored 16-byte piece */
    const int E = K / S, np = pair ? 2 : 1;
    const long per_item = (long)np * E * (wt == W_BF16 ? 2 : 1) / (wt == W_BF16 ? 1 : 2);
    const long total = (long)S * N * per_item / 16;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < total; t += (long)gridDim.x * blockDim.x) {
        const long byte = t * 16, item = byte / per_item, off = byte % per_item;
        const int row = (int)(item % N), seg = (int)(item / N);
        uint8_t out[16];
        if (wt == W_BF16) {
            for (int e = 0; e < 8; e++) {
                const long el = off / 2 + e;
                const int q = (int)(el / E), k = seg * E + (int)(el % E);
                const int r = pair ? 2 * row + q : row;
                const uint16_t b = f2bf(unif(wkey(tag, r, k, K)) * amp);
                out[2 * e] = (uint8_t)b;
                out[2 * e + 1] = (uint8_t)(b >> 8);
            }
        } else {
            for (int e = 0; e < 16; e++) {
                const long el0 = (off + e) * 2;
                uint8_t v = 0;
                for (int h = 0; h < 2; h++) {
                    const long el = el0 + h;
                    const int q = (int)(el / E), k = seg * E + (int)(el % E);
                    const int r = pair ? 2 * row + q : row;
                    v |= (uint8_t)((hsh(wkey(tag, r, k, K)) & 15u) << (4 * h));
                }
                out[e] = v;
            }
        }
        memcpy(w + byte, out, 16);
    }
    if (wt == W_Q4 && sc)
        for (long r = blockIdx.x * (long)blockDim.x + threadIdx.x; r < (long)np * N; r += (long)gridDim.x * blockDim.x)
            sc[r] = amp / 8.0f * (1.0f + 0.25f * unif(wkey(tag ^ 0xabc, r, 0, 1)));
}

__global__ void gen_floats(float *p, long n, uint64_t tag) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) p[i] = unif((tag << 40) + i);
}
__global__ void gen_bf16(uint16_t *p, long n, uint64_t tag) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) p[i] = f2bf(unif((tag << 40) + i));
}
__global__ void read_bw(const uint4 *p, long n, unsigned *sink) {
    uint4 a = make_uint4(0, 0, 0, 0);
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        a.x ^= v.x;
        a.y ^= v.y;
        a.z ^= v.z;
        a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x12345678u) *sink = 1;
}

/* ---------------------------------------------------------------- model → stages (host) */

struct Arch {
    const char *name;
    int L, H, nq, kv_s, kv_f, mlp, mlp2, mlp2_from, P, shared_from, win, period;
    bool keqv;
};
static const Arch ARCHS[] = {
    {"e2b", 35, 1536, 8, 1, 1, 6144, 12288, 15, 256, 15, 512, 5, false},
    {"e4b", 42, 2560, 8, 2, 2, 10240, 10240, 42, 256, 24, 512, 6, false},
    {"31b", 60, 5376, 32, 16, 4, 21504, 21504, 60, 0, 60, 1024, 6, true},
};

struct Model {
    std::vector<Stage> st;
    std::vector<uint64_t> tags;
    std::vector<float> amps;
    std::vector<void *> allocs;
    uint16_t *embed;
    double wbytes;
    int xmax;
};

static void *dalloc(Model &m, size_t bytes) {
    void *p;
    CK(cudaMalloc(&p, bytes));
    m.allocs.push_back(p);
    return p;
}

/* segments: fewest with items ≤ a slot and ≥ ~4 items per warp, elements a multiple of 256 */
static int pick_segments(int N, int K, int pair, int wt, int slot, int nwarps) {
    int S = 1;
    auto ib = [&](int s) { return (long)(pair ? 2 : 1) * (K / s) * (wt == W_BF16 ? 2 : 1) / (wt == W_BF16 ? 1 : 2); };
    while (K % (2 * S) == 0 && (K / (2 * S)) % 32 == 0 && K / (2 * S) >= 256 && (ib(S) > slot || (long)S * N < 4L * nwarps)) S *= 2;
    if (ib(S) > slot) {
        fprintf(stderr, "an item of %d x %d does not fit a %d-byte slot\n", N, K, slot);
        exit(1);
    }
    return S;
}

static Stage matvec(Model &m, int N, int K, int pair, int wt, int slot, int nwarps, int in_op, uint64_t tag) {
    Stage s;
    memset(&s, 0, sizeof s);
    s.kind = ST_MATVEC;
    s.in_op = in_op;
    s.K = K;
    s.N = N;
    s.pair = pair;
    s.wt = wt;
    s.S = pick_segments(N, K, pair, wt, slot, nwarps);
    s.E = K / s.S;
    s.ib = (int)((long)(pair ? 2 : 1) * s.E * (wt == W_BF16 ? 2 : 1) / (wt == W_BF16 ? 1 : 2));
    s.cpi = slot / s.ib;
    const size_t wb = (size_t)s.ib * s.S * N;
    uint8_t *w = (uint8_t *)dalloc(m, wb);
    float *sc = wt == W_Q4 ? (float *)dalloc(m, sizeof(float) * (pair ? 2 : 1) * N) : NULL;
    const float amp = sqrtf(3.0f / K);
    gen_weights<<<1024, 256>>>(w, sc, wt, N, K, s.S, pair, tag, amp);
    CK(cudaGetLastError());
    s.w = w;
    s.sc = sc;
    s.out = (float *)dalloc(m, sizeof(float) * s.S * N * (pair ? 2 : 1));
    m.wbytes += (double)wb + (sc ? 4.0 * (pair ? 2 : 1) * N : 0.0);
    m.tags.push_back(tag);
    m.amps.push_back(amp);
    return s;
}

static void link(Stage &s, const Stage &from) {
    s.src = from.out;
    s.src_S = from.kind == ST_MATVEC ? from.S : 1;
    s.src_N = from.kind == ST_MATVEC ? from.N * (from.pair && from.S > 1 ? 2 : 1) : from.nq * from.D;
    if (from.pair && from.S > 1) s.in_op = IN_GELU;
}

static Model build(const Arch &a, int wt, int ctx, int layers, int slot, int nwarps, int nblocks) {
    Model m;
    m.wbytes = 0;
    m.xmax = 0;
    const int H = a.H, V = 262144;
    m.embed = (uint16_t *)dalloc(m, sizeof(uint16_t) * 4096 * (size_t)H);
    gen_bf16<<<1024, 256>>>(m.embed, 4096L * H, 77);
    float *res[2] = {(float *)dalloc(m, 4 * (size_t)H), (float *)dalloc(m, 4 * (size_t)H)};
    int rc = 0;
    uint64_t tag = 1;
    const float *kv_src_k[2] = {NULL, NULL}, *kv_src_v[2] = {NULL, NULL};
    int ple_idx = -1;
    if (a.P) {
        Stage s = matvec(m, a.L * a.P, H, 0, wt, slot, nwarps, IN_EMBED, tag++);
        if (s.S != 1) {
            fprintf(stderr, "the PLE model projection must not be split\n");
            exit(1);
        }
        m.st.push_back(s);
        ple_idx = 0;
    }
    const int L = layers > 0 && layers < a.L ? layers : a.L;
    for (int l = 0; l < L; l++) {
        const bool full = l % a.period == a.period - 1 || l == a.L - 1;
        const int D = full ? 512 : 256, nkv = full ? a.kv_f : a.kv_s;
        const bool shared = l >= a.shared_from;
        const int qrows = a.nq * D, kvrows = shared ? 0 : nkv * D * (full && a.keqv ? 1 : 2);
        /* q/k/v */
        Stage qkv = matvec(m, qrows + kvrows, H, 0, wt, slot, nwarps, l == 0 ? IN_EMBED : IN_RESNORM, tag++);
        if (qkv.in_op == IN_EMBED) {
            qkv.res_out = res[rc];
        } else {
            link(qkv, m.st.back());
            qkv.res_in = res[rc];
            qkv.res_out = res[rc ^ 1];
            rc ^= 1;
        }
        m.st.push_back(qkv);
        /* attention over a random cache (shared layers read their source's) */
        Stage at;
        memset(&at, 0, sizeof at);
        at.kind = ST_ATTN;
        at.in_op = IN_SUM;
        at.K = qrows;
        link(at, m.st.back());
        at.nq = a.nq;
        at.nkv = nkv;
        at.D = D;
        at.nkeys = full ? ctx : (ctx < a.win ? ctx : a.win);
        if (!shared || !kv_src_k[full]) {
            const size_t n = (size_t)nkv * at.nkeys * D;
            float *k = (float *)dalloc(m, 4 * n), *v = (float *)dalloc(m, 4 * n);
            gen_floats<<<1024, 256>>>(k, (long)n, 1000 + 2 * l);
            gen_floats<<<1024, 256>>>(v, (long)n, 1001 + 2 * l);
            kv_src_k[full] = k;
            kv_src_v[full] = v;
        }
        at.kc_ = kv_src_k[full];
        at.vc = kv_src_v[full];
        /* chunks: the fewest (16..KCMAX keys) that still give about two items per block */
        at.kc = 16;
        while (at.kc < KCMAX && (long)a.nq * ((at.nkeys + at.kc - 1) / at.kc) > 2L * nblocks) at.kc *= 2;
        const int nc = (at.nkeys + at.kc - 1) / at.kc;
        at.part = (float *)dalloc(m, 4 * (size_t)a.nq * nc * (D + 2));
        at.cnt = (unsigned *)dalloc(m, 4 * (size_t)a.nq);
        CK(cudaMemset(at.cnt, 0, 4 * (size_t)a.nq));
        at.out = (float *)dalloc(m, 4 * (size_t)qrows);
        m.st.push_back(at);
        m.tags.push_back(0);
        m.amps.push_back(0);
        /* o */
        Stage o = matvec(m, H, qrows, 0, wt, slot, nwarps, IN_SUM, tag++);
        link(o, m.st.back());
        m.st.push_back(o);
        /* gate/up pairs, down */
        const int I = l >= a.mlp2_from ? a.mlp2 : a.mlp;
        Stage gu = matvec(m, I, H, 1, wt, slot, nwarps, IN_RESNORM, tag++);
        link(gu, m.st.back());
        gu.res_in = res[rc];
        gu.res_out = res[rc ^ 1];
        rc ^= 1;
        m.st.push_back(gu);
        Stage dn = matvec(m, H, I, 0, wt, slot, nwarps, IN_SUM, tag++);
        link(dn, m.st.back());
        m.st.push_back(dn);
        if (a.P) {
            Stage pg = matvec(m, a.P, H, 0, wt, slot, nwarps, IN_RESNORM, tag++);
            link(pg, m.st.back());
            pg.res_in = res[rc];
            pg.res_out = res[rc ^ 1];
            rc ^= 1;
            m.st.push_back(pg);
            Stage pp = matvec(m, H, a.P, 0, wt, slot, nwarps, IN_GELUMUL, tag++);
            link(pp, m.st.back());
            pp.mul = m.st[ple_idx].out + (size_t)l * a.P;
            m.st.push_back(pp);
        }
    }
    Stage head = matvec(m, V, H, 0, wt, slot, nwarps, IN_RESNORM, tag++);
    link(head, m.st.back());
    head.res_in = res[rc];
    head.res_out = res[rc ^ 1];
    head.argmax = 1;
    if (head.S != 1) {
        fprintf(stderr, "the LM head must not be split\n");
        exit(1);
    }
    m.st.push_back(head);
    for (auto &s : m.st) {
        const int need = s.in_op == IN_RESNORM ? 2 * s.K : s.K; /* the residual beside the input */
        m.xmax = need > m.xmax ? need : m.xmax;
    }
    CK(cudaDeviceSynchronize());
    return m;
}

/* ---------------------------------------------------------------- host reference (--check) */

static double href_w(const Stage &s, uint64_t tag, float amp, const std::vector<float> &scs, int r, int k) {
    if (s.wt == W_BF16) return bf2f(f2bf(unif(wkey(tag, r, k, s.K)) * amp));
    return ((double)(hsh(wkey(tag, r, k, s.K)) & 15u) - 8.0) * scs[r];
}

static int check(Model &m, const Arch &a, int dev_tok) {
    /* the device's outputs of every stage after one token from tok 0 */
    const int nst = (int)m.st.size();
    std::vector<std::vector<double>> ref(nst);
    std::vector<double> res;
    int tok = 0;
    double worst = 0;
    int bad = 0;
    for (int si = 0; si < nst; si++) {
        const Stage &s = m.st[si];
        /* input */
        std::vector<double> x(s.K);
        auto srcv = [&](int k) {
            for (int j = si - 1; j >= 0; j--)
                if (m.st[j].out == s.src) return ref[j][k];
            return 0.0;
        };
        if (s.in_op == IN_EMBED) {
            std::vector<uint16_t> e(s.K);
            CK(cudaMemcpy(e.data(), m.embed + (size_t)tok * s.K, 2 * s.K, cudaMemcpyDeviceToHost));
            for (int k = 0; k < s.K; k++) x[k] = bf2f(e[k]) * sqrt((double)s.K);
            res = x;
        } else if (s.in_op == IN_SUM) {
            for (int k = 0; k < s.K; k++) x[k] = srcv(k);
        } else if (s.in_op == IN_GELU) {
            for (int k = 0; k < s.K; k++) x[k] = gelu((float)srcv(2 * k)) * srcv(2 * k + 1);
        } else if (s.in_op == IN_GELUMUL) {
            int pj = -1;
            for (int j = 0; j < si; j++)
                if (s.mul >= m.st[j].out && s.mul < m.st[j].out + m.st[j].N) pj = j;
            const long off = s.mul - m.st[pj].out;
            for (int k = 0; k < s.K; k++) x[k] = gelu((float)srcv(k)) * ref[pj][off + k];
        } else if (s.in_op == IN_RESNORM) {
            double ss = 0;
            for (int k = 0; k < s.K; k++) ss += srcv(k) * srcv(k);
            const double aa = 1.0 / sqrt(ss / s.K + 1e-6);
            double s2 = 0;
            for (int k = 0; k < s.K; k++) {
                res[k] += srcv(k) * aa;
                s2 += res[k] * res[k];
            }
            const double b = 1.0 / sqrt(s2 / s.K + 1e-6);
            for (int k = 0; k < s.K; k++) x[k] = res[k] * b;
        }
        /* output */
        if (s.kind == ST_ATTN) {
            const int hq = s.nq / s.nkv, D = s.D;
            ref[si].assign((size_t)s.nq * D, 0.0);
            std::vector<float> kc((size_t)s.nkv * s.nkeys * D), vc(kc.size());
            CK(cudaMemcpy(kc.data(), s.kc_, 4 * kc.size(), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(vc.data(), s.vc, 4 * vc.size(), cudaMemcpyDeviceToHost));
            for (int h = 0; h < s.nq; h++) {
                const int g = h / hq;
                std::vector<double> sc(s.nkeys);
                double mx = -1e300, l = 0;
                for (int j = 0; j < s.nkeys; j++) {
                    double d = 0;
                    for (int e = 0; e < D; e++) d += x[(size_t)h * D + e] * kc[((size_t)g * s.nkeys + j) * D + e];
                    sc[j] = d / sqrt((double)D);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j < s.nkeys; j++) l += (sc[j] = exp(sc[j] - mx));
                for (int e = 0; e < D; e++) {
                    double o = 0;
                    for (int j = 0; j < s.nkeys; j++) o += sc[j] * vc[((size_t)g * s.nkeys + j) * D + e];
                    ref[si][(size_t)h * D + e] = o / l;
                }
            }
        } else {
            const uint64_t tag = m.tags[si];
            const float amp = m.amps[si];
            const int nr = (s.pair ? 2 : 1) * s.N;
            std::vector<float> scs(nr, 0.0f);
            if (s.wt == W_Q4) CK(cudaMemcpy(scs.data(), s.sc, 4 * (size_t)nr, cudaMemcpyDeviceToHost));
            const bool both = s.pair && s.S > 1;
            ref[si].assign((size_t)s.N * (both ? 2 : 1), 0.0);
            for (int r = 0; r < s.N; r++) {
                if (s.pair) {
                    double g = 0, u = 0;
                    for (int k = 0; k < s.K; k++) {
                        g += href_w(s, tag, amp, scs, 2 * r, k) * x[k];
                        u += href_w(s, tag, amp, scs, 2 * r + 1, k) * x[k];
                    }
                    if (both) {
                        ref[si][2 * r] = g;
                        ref[si][2 * r + 1] = u;
                    } else {
                        ref[si][r] = gelu((float)g) * u;
                    }
                } else {
                    double d = 0;
                    for (int k = 0; k < s.K; k++) d += href_w(s, tag, amp, scs, r, k) * x[k];
                    ref[si][r] = d;
                }
            }
        }
        /* compare with the device */
        const int S = s.kind == ST_MATVEC ? s.S : 1, N = s.kind == ST_MATVEC ? s.N * (s.pair && s.S > 1 ? 2 : 1) : s.nq * s.D;
        std::vector<float> dv((size_t)S * N);
        CK(cudaMemcpy(dv.data(), s.out, 4 * dv.size(), cudaMemcpyDeviceToHost));
        double mx = 0, err = 0;
        for (int r = 0; r < N; r++) {
            double d = 0;
            for (int g = 0; g < S; g++) d += dv[(size_t)g * N + r];
            err = fmax(err, fabs(d - ref[si][r]));
            mx = fmax(mx, fabs(ref[si][r]));
        }
        const double rel = err / (mx > 0 ? mx : 1);
        worst = fmax(worst, rel);
        if (rel > 2e-3) {
            bad++;
            printf("  stage %d (%s, N %d K %d S %d): max error %.3g of max |value| %.3g\n", si, s.kind == ST_ATTN ? "attention" : "matvec", N,
                   s.K, S, err, mx);
        }
        /* continue from the device's values so that errors do not compound */
        for (int r = 0; r < N; r++) {
            double d = 0;
            for (int g = 0; g < S; g++) d += dv[(size_t)g * N + r];
            ref[si][r] = d;
        }
    }
    /* the argmax */
    const Stage &h = m.st.back();
    int bi = 0;
    for (int r = 1; r < h.N; r++)
        if (ref[nst - 1][r] > ref[nst - 1][bi]) bi = r;
    printf("check %s: %d stages, worst relative error %.3g, %d above 2e-3; host argmax %d (%% 4096: %d), device %d\n", a.name, nst,
           worst, bad, bi, bi % 4096, dev_tok);
    return bad + (bi % 4096 != dev_tok);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    const char *archs = "e2b", *storages = "bf16,q4", *modes = "0,1,2,4";
    int ctxs[4] = {128, 0, 0, 0}, nctx = 1, tokens = 64, warps = 8, slot = 0, layers = 0, docheck = 0, trace = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--arch") && i + 1 < argc) archs = argv[++i];
        else if (!strcmp(argv[i], "--storage") && i + 1 < argc) storages = argv[++i];
        else if (!strcmp(argv[i], "--modes") && i + 1 < argc) modes = argv[++i];
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) {
            nctx = 0;
            for (char *p = strtok(argv[++i], ","); p && nctx < 4; p = strtok(NULL, ",")) ctxs[nctx++] = atoi(p);
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warps") && i + 1 < argc) warps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--slot") && i + 1 < argc) slot = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check")) docheck = 1;
        else if (!strcmp(argv[i], "--trace")) trace = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--arch e2b,e4b,31b] [--storage bf16,q4] [--modes 0,1,2,4] [--ctx 128,4096] [--tokens N]\n"
                    "          [--warps 8|16] [--slot BYTES] [--layers N] [--check] [--trace]\n",
                    argv[0]);
            return 2;
        }
    }
    if (warps < 1 || warps > MAXWARPS) return fprintf(stderr, "--warps: 1..%d\n", MAXWARPS), 2;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int G = prop.multiProcessorCount;
    /* the machine's read bandwidth, measured now */
    double bw = 0;
    {
        const long n = (4L << 30) / 16;
        uint4 *buf;
        unsigned *sink;
        CK(cudaMalloc(&buf, n * 16));
        CK(cudaMalloc(&sink, 4));
        CK(cudaMemset(buf, 1, n * 16));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int r = 0; r < 6; r++) {
            CK(cudaEventRecord(e0));
            read_bw<<<G * 8, 512>>>(buf, n, sink);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r) bw = fmax(bw, n * 16.0 / (ms * 1e-3) / 1e9);
        }
        CK(cudaFree(buf));
        CK(cudaFree(sink));
    }
    printf("%s, %d SMs; read bandwidth %.0f GB/s\n", prop.name, G, bw);
    Ctl *ctl;
    CK(cudaMalloc(&ctl, sizeof(Ctl)));
    char abuf[256], sbuf[256], mbuf[256];
    snprintf(abuf, sizeof abuf, "%s", archs);
    int fails = 0;
    for (char *ap = strtok(abuf, ","); ap; ap = strtok(NULL, ",")) {
        const Arch *a = NULL;
        for (const Arch &x : ARCHS)
            if (!strcmp(x.name, ap)) a = &x;
        if (!a) return fprintf(stderr, "unknown arch %s\n", ap), 2;
        snprintf(sbuf, sizeof sbuf, "%s", storages);
        std::vector<int> wts;
        for (char *sp = sbuf; *sp;) {
            char *e = strchr(sp, ',');
            if (e) *e = 0;
            wts.push_back(!strcmp(sp, "q4") ? W_Q4 : W_BF16);
            if (!e) break;
            sp = e + 1;
        }
        for (int wt : wts)
            for (int ci = 0; ci < nctx; ci++) {
                const int ctx = ctxs[ci];
                /* shared memory: the input vector, scratch, mbarriers, the rings */
                int xmax_guess = a->mlp2 > a->nq * 512 ? a->mlp2 : a->nq * 512;
                const int fixed = 4 * ((xmax_guess + 31) / 32 * 32) + 4 * 32 + 4 * ATT_SM + 8 * MAXWARPS * 16;
                const int ring = (int)prop.sharedMemPerBlockOptin - fixed - 1024;
                /* slots hold at least one LM head row (the head is never split: its argmax) */
                int sl = slot ? slot : 5120;
                if (sl < (wt == W_Q4 ? a->H / 2 : 2 * a->H)) sl = wt == W_Q4 ? a->H / 2 : 2 * a->H;
                int nslot = ring / (warps * sl);
                if (nslot > 16) nslot = 16;
                if (nslot < 2) return fprintf(stderr, "slots of %d bytes do not fit twice per warp\n", sl), 2;
                Model m = build(*a, wt, ctx, docheck && !layers ? 2 : layers, sl, G * warps, G);
                if (m.xmax > xmax_guess) return fprintf(stderr, "input of %d exceeds %d\n", m.xmax, xmax_guess), 2;
                const size_t smem = (size_t)fixed + (size_t)warps * nslot * sl;
                CK(cudaFuncSetAttribute(lean_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                Stage *dst;
                const int nst = (int)m.st.size();
                CK(cudaMalloc(&dst, sizeof(Stage) * nst));
                CK(cudaMemcpy(dst, m.st.data(), sizeof(Stage) * nst, cudaMemcpyHostToDevice));
                int nmat = 0, natt = 0;
                for (auto &s : m.st) (s.kind == ST_MATVEC ? nmat : natt)++;
                printf("\n%s %s ctx %d: %d stages (%d matvec, %d attention), %.3f GB of weights per token; %d warps x %d slots x %d B\n",
                       a->name, wt == W_Q4 ? "q4 (per-row scale)" : "bf16", ctx, nst, nmat, natt, m.wbytes / 1e9, warps, nslot, sl);
                snprintf(mbuf, sizeof mbuf, "%s", modes);
                std::vector<int> ml;
                for (char *p = mbuf; *p;) {
                    char *e = strchr(p, ',');
                    if (e) *e = 0;
                    ml.push_back(atoi(p));
                    if (!e) break;
                    p = e + 1;
                }
                if (docheck) ml.assign(1, 1);
                for (int mode : ml) {
                    CK(cudaMemset(ctl, 0, sizeof(Ctl)));
                    const uint16_t *emb = m.embed;
                    int mm = mode, nsl = nslot, sll = sl, xm = m.xmax, tr = 0;
                    void *args[] = {&dst, (void *)&nst, &ctl, &mm, &nsl, &sll, &xm, (void *)&emb, &tr};
                    auto launch = [&]() {
                        CK(cudaLaunchCooperativeKernel((void *)lean_kernel, dim3(G), dim3(32 * warps), args, smem, 0));
                    };
                    if (docheck) {
                        launch();
                        CK(cudaDeviceSynchronize());
                        Ctl c;
                        CK(cudaMemcpy(&c, ctl, sizeof c, cudaMemcpyDeviceToHost));
                        if (c.err) printf("kernel error flag %d\n", c.err), fails++;
                        fails += check(m, *a, c.tok) != 0;
                        continue;
                    }
                    for (int w = 0; w < 3; w++) launch();
                    CK(cudaDeviceSynchronize());
                    cudaEvent_t e0, e1;
                    CK(cudaEventCreate(&e0));
                    CK(cudaEventCreate(&e1));
                    CK(cudaEventRecord(e0));
                    for (int t = 0; t < tokens; t++) launch();
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    Ctl c;
                    CK(cudaMemcpy(&c, ctl, sizeof c, cudaMemcpyDeviceToHost));
                    const double per = ms / tokens;
                    printf("  mode %d (%s%s%s%s%s): %8.1f tok/s  %7.3f ms/token  %6.0f GB/s  %3.0f%% of %.0f%s\n", mode,
                           mode & M_PREFETCH ? "prefetch across barriers" : "copies after the barrier",
                           mode & M_STREAM_ONLY ? ", stream only" : "", mode & M_SYNC_ONLY ? ", no weights" : "",
                           mode & M_NO_WORK ? ", no inputs or attention" : "",
                           mode >> M_L2_SHIFT == 1 ? ", L2 prefetch of the stage's weights before its barrier"
                           : mode >> M_L2_SHIFT == 2 ? ", L2 prefetch of the next stage's weights"
                           : mode >> M_L2_SHIFT == 3 ? ", L2 prefetch two stages ahead" : "",
                           1e3 / per,
                           per, m.wbytes / 1e9 / (per * 1e-3), 100.0 * m.wbytes / 1e9 / (per * 1e-3) / bw, bw,
                           c.err ? "  (ERROR FLAG)" : "");
                    if (c.err) fails++;
                    if (trace && !(mode & M_STREAM_ONLY)) {
                        tr = 1;
                        launch();
                        CK(cudaDeviceSynchronize());
                        CK(cudaMemcpy(&c, ctl, sizeof c, cudaMemcpyDeviceToHost));
                        tr = 0;
                        /* per stage class: barrier wait (previous stage end -> start), input, work */
                        double wait[3] = {0}, in[3] = {0}, work[3] = {0}, first[3] = {0}, last[3] = {0};
                        int cnt[3] = {0}, cw[3] = {0};
                        for (int si = 0; si < nst && si < 1024; si++) {
                            const Stage &s = m.st[si];
                            const int cl = s.kind == ST_ATTN ? 0 : s.N >= 262144 ? 2 : 1;
                            const unsigned long long *t = c.trace + TR * si;
                            if (si) wait[cl] += (t[0] - t[-TR + 2]) * 1e-3;
                            in[cl] += (t[1] - t[0]) * 1e-3;
                            work[cl] += (t[2] - t[1]) * 1e-3;
                            cnt[cl]++;
                            if (t[3] && !(mode & M_SYNC_ONLY)) {
                                /* warp 0's slots: the first landed (after the input), the last, the end */
                                first[cl] += ((long long)t[3] - (long long)t[1]) * 1e-3;
                                last[cl] += ((long long)t[4] - (long long)t[3]) * 1e-3;
                                cw[cl]++;
                            }
                        }
                        const char *nm[3] = {"attention", "matvec", "LM head"};
                        for (int cl = 0; cl < 3; cl++)
                            if (cnt[cl])
                                printf("    block 0, %-9s x%3d: barrier wait %6.2f us, input %5.2f us, work %6.2f us per stage\n", nm[cl],
                                       cnt[cl], wait[cl] / cnt[cl], in[cl] / cnt[cl], work[cl] / cnt[cl]);
                        for (int cl = 1; cl < 3; cl++)
                            if (cw[cl])
                                printf("    block 0 warp 0, %-9s x%3d: first slot landed %6.2f us after the input, last %6.2f us "
                                       "after the first\n", nm[cl], cw[cl], first[cl] / cw[cl], last[cl] / cw[cl]);
                        printf("    block 0 token span %.1f us\n", (c.trace[TR * (nst - 1) + 2] - c.trace[0]) * 1e-3);
                    }
                }
                CK(cudaFree(dst));
                for (void *p : m.allocs) CK(cudaFree(p));
            }
    }
    return fails ? 1 : 0;
}
