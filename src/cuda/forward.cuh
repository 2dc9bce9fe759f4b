/* The persistent kernel's device code (see forward.cu for the launch side): one template,
 * g4c_kernel<mask>, instantiated once per storage mask, each in its own translation unit
 * (src/cuda/inst/kernel.cu, compiled once per mask: the instantiations build in parallel).
 *
 * The CUDA backend's kernels: one persistent kernel interprets a stage list (program.h) for any
 * number of tokens M. Every block is resident (cooperative launch, grid sized by the occupancy
 * calculator); stages are separated by a grid-wide barrier built from one atomic counter and a
 * generation word.
 *
 * Exactness: the arithmetic of one output element never depends on M, on the token tiling, on the
 * grid size or on which warp computes it (program.h says how each kind of element is reduced).
 * Built with -fmad=false: no multiply-add is fused unless written as fmaf, so two paths that
 * write the same expression give the same bits.
 *
 * Memory: weights are read with ld.global.nc (never written during a launch); activations written
 * by other blocks earlier in the same launch are read with ld.global.cg (L2), so a stale L1 line
 * can never be seen after a barrier. */
#ifndef G4_CUDA_FORWARD_CUH
#define G4_CUDA_FORWARD_CUH
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cuda/internal.h"

/* Independent fmaf chains per dot: with two warps per scheduler (255 registers per thread) most of
 * a stage's issue slots were lost to dependency waits (ncu on an E2B qat-int4 step: 9.1 cycles
 * per issued instruction, of which "wait" 1.75 and long scoreboard 2.8). Measured in one run on
 * the H200 (E2B decode tok/s, ctx 128, QACC/BACC 1/1 -> 4/2 -> 2/2): qat-int4 219 -> 243 -> 257,
 * mlx-4 164 -> 183 -> 192, qat-int8 210 -> 211 -> 210, bf16 260 -> 258 -> 257; E4B qat-int4 146
 * -> 169 -> 180, mlx-4 102 -> 114 -> 119, bf16 149 -> 146 -> 146. The whole kernel is one
 * register allocation, so a change in one path moves the others by a few percent. */
#ifndef G4C_QACC
#define G4C_QACC 2 /* partial sums per quantised chunk dot (1, 2 or 4) */
#endif
#ifndef G4C_BACC
#define G4C_BACC 2 /* fmaf chains per dense row and token (1 or 2) */
#endif
#ifndef G4C_U_Q4_M1
#define G4C_U_Q4_M1 4 /* 4-bit chunks per row a lane loads ahead at M = 1 */
#endif
#ifndef G4C_U_MT4
#define G4C_U_MT4 8 /* chunks per row a lane loads ahead in the 2..4-token tiles (Q4: half) */
#endif
/* A launch configuration with programmatic dependent launch on or off (pgemm.cuh pdl_launch, the
 * staged decode's stage.cu): c.attrs points into the same struct, so fill it in place. */
typedef struct g4c_pdl_cfg {
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t c;
} g4c_pdl_cfg;
static inline void g4c_pdl_config(g4c_pdl_cfg *x, int on, dim3 grid, dim3 block, size_t smem, cudaStream_t s) {
    x->at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    x->at[0].val.programmaticStreamSerializationAllowed = on ? 1 : 0;
    x->c = cudaLaunchConfig_t{};
    x->c.gridDim = grid;
    x->c.blockDim = block;
    x->c.dynamicSmemBytes = smem;
    x->c.stream = s;
    x->c.attrs = x->at;
    x->c.numAttrs = 1;
}

#define DEV static __device__ __forceinline__
#define DEVR static __device__ __noinline__ /* rare paths: out of line */
/* The stage functions: inlined into the kernel (default: no calls, so no callee-saved registers
 * stored to and reloaded from local memory around every stage, whose reloads went to L2 because
 * shared memory leaves L1 little room), or out of line with G4C_INLINE_ALL=0. */
#ifndef G4C_INLINE_ALL
#define G4C_INLINE_ALL 1
#endif
#if G4C_INLINE_ALL
#define DEVN static __device__ __forceinline__
#define DEVT __device__ __forceinline__
#else
#define DEVN static __device__ __noinline__
#define DEVT __device__ __noinline__
#endif

/* ---- loads ----------------------------------------------------------------------------------- */

/* weights: read once per launch, so they bypass L1 and, with an evict-first policy, leave L2 before
 * what is reused (the kernel's code, the stage list, activations, the cache, the stack) */
DEV uint4 ld_w16(const void *p, unsigned long long pol) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p), "l"(pol));
    return r;
}
DEV unsigned long long l2_policy(int evict_first) {
    unsigned long long pol;
    if (evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    else asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
DEV float lda(const float *p) { return __ldcg(p); }
DEV float4 lda4(const float *p) { return __ldcg(reinterpret_cast<const float4 *>(p)); }
DEV int ldi(const int *p) { return __ldcg(p); }
DEV float ldv(const float *p) { return __ldg(p); }

DEV float bf16f(unsigned h) { return __uint_as_float(h << 16); }
DEV float f16f(unsigned h) { return __half2float(__ushort_as_half((unsigned short)h)); }

/* L2 prefetch of a 16-byte aligned range (bytes a multiple of 16); asynchronous, no registers */
DEV void pf_l2(const void *p, long long bytes) {
    while (bytes > 0) {
        unsigned n = bytes > (1 << 20) ? (1u << 20) : (unsigned)bytes;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
        p = (const char *)p + n;
        bytes -= n;
    }
}

/* 16 bytes global -> shared without registers (cached in L2 only, like __ldcg); complete after
 * cp_wait() in the issuing thread, visible to the block after a __syncthreads */
DEV void cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}
DEV void cp4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}
DEV void cp_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* cp16 under the L2 policy pol; waiting until at most N of the thread's commit groups are pending */
DEV void cp16_pol(void *dst, const void *src, unsigned long long pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "l"(pol)
                 : "memory");
}
template <int N> DEV void cp_wait_n() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

DEV int px(int i) { return i + ((i >> 5) << 2); } /* padded input-tile index (program.h) */

/* scale or bias g of a quantised row */
DEV float q_param(const char *row, int off, int stype, int g) {
    if (stype == G4C_S_F32) return __ldg((const float *)(row + off) + g);
    unsigned h = __ldg((const unsigned short *)(row + off) + g);
    return stype == G4C_S_F16 ? f16f(h) : bf16f(h);
}

/* element (r, c) of a matrix as float (embedding gathers); out of line: code size is time here
 * (every stage's code is fetched again from L2 when the instruction cache has moved on) */
DEVR float mat_at(const g4c_mat &m, long long r, int c) {
    if (m.flags & G4C_QF_TILED) { /* bf16 in the tensor cores' tiles (program.h) */
        const char *e = (const char *)m.data + ((r >> 4) * (m.cols >> 5) + (c >> 5)) * 1024 + ((r >> 3) & 1) * 512 +
                        ((r & 7) * 4 + ((c & 31) >> 3)) * 16 + (c & 7) * 2;
        return bf16f(__ldg((const unsigned short *)e));
    }
    const char *row = (const char *)m.data + r * m.row_bytes;
    if (m.type == G4C_F32) return __ldg((const float *)row + c);
    if (m.type == G4C_F16 || m.type == G4C_BF16) {
        unsigned h = __ldg((const unsigned short *)row + c);
        return m.type == G4C_F16 ? f16f(h) : bf16f(h);
    }
    unsigned byte = __ldg((const unsigned char *)row + (m.type == G4C_Q8 ? c : c >> 1));
    float q;
    if (m.type == G4C_Q8) q = (m.flags & G4C_QF_SIGNED) ? (float)(int)(signed char)byte : (float)byte;
    else q = (float)(int)(((c & 1) ? byte >> 4 : byte & 15u)) - ((m.flags & G4C_QF_SIGNED) ? 8.0f : 0.0f);
    const int g = c / m.group;
    float v = q_param(row, m.sc_off, m.stype, g) * q;
    if (m.flags & G4C_QF_BIAS) v = v + q_param(row, m.bi_off, m.stype, g);
    return v;
}

DEV float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi); the CPU's g4_gelu_tanh, term for term */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* ---- reductions (fixed shapes: every lane/thread ends with the same bits) --------------------- */

DEV double warp_sum_d(double v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
DEV float warp_sum_f(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
DEV float warp_max_f(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* (value, index) with the larger value, the lower index on ties */
DEV bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

/* Sum over the block in double: warp butterflies, then every thread adds the warp sums in order. */
DEV double block_sum_d(double v, double *red) {
    v = warp_sum_d(v);
    __syncthreads(); /* red may still be read from the previous call */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < G4C_WARPS; w++) s += red[w];
    return s;
}

/* sum of squares of a float4 in double, in a fixed order */
DEV double sq4(const float4 &a) {
    return ((double)a.x * a.x + (double)a.y * a.y) + ((double)a.z * a.z + (double)a.w * a.w);
}

DEV float rms_inv(double ss, int n, float eps) { return (float)(1.0 / sqrt(ss / n + (double)eps)); }

/* ---- the grid barrier --------------------------------------------------------------------------- */

/* Barrier k of a launch on a grid of G blocks completes when the arrival counter reaches
 * base + (k+1)·G, base being its value when the launch began (a multiple of G: every launch adds
 * G per barrier; a block reading it late still rounds down to it, since barrier 0 cannot complete
 * without that block). One fire-and-forget release reduction per block, relaxed polling, one
 * acquire fence (measured on the H200: ~0.2 us less per barrier than __threadfence, atomicAdd,
 * __threadfence); no reset (the 64-bit counter never wraps in practice). While thread 0 waits, the other threads copy the next stage's
 * g4c_op (next not NULL) into shared memory (`into`), so its fields are read at shared-memory
 * latency instead of by a chain of dependent global loads. */
DEV void grid_sync(g4c_ctl *ctl, unsigned long long target, const g4c_op *next, g4c_op *into) {
    __syncthreads();
    if (threadIdx.x == 0) {
        /* arrival: a release reduction (cumulative: it publishes the writes the block's threads made
         * before the __syncthreads); polling relaxed, then one acquire fence */
        asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&ctl->bar) : "memory");
        volatile unsigned long long *b = &ctl->bar;
        while (*b < target) {
        }
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    } else if (next) {
        constexpr int W = (int)(sizeof(g4c_op) / 4);
        const int *src = reinterpret_cast<const int *>(next);
        int *dst = reinterpret_cast<int *>(into);
#pragma unroll 1
        for (int i = threadIdx.x - 1; i < W; i += G4C_THREADS - 1) dst[i] = __ldg(src + i);
    }
    __syncthreads();
}

DEV unsigned long long global_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* the staged trace (p.strace): point k of this block in stage op->idx, by thread 0 */
DEV void st_mark(const g4c_params &p, const g4c_op *op, int k, unsigned long long t) {
    if (p.strace && threadIdx.x == 0) p.strace[((size_t)op->idx * G4C_MAXB + blockIdx.x) * 4 + k] = t;
}
/* the block's cluster: a barrier of all its threads (arrivals released, the wait acquiring), and
 * the float at shared-memory address a (this block's) in the cluster's block of rank r. Both asm
 * volatile: a mapa the compiler may move (__cluster_map_shared_rank's) could be hoisted out of the
 * branch that only cluster launches take, and executed in a launch without clusters it would be an
 * illegal instruction (suspected in session 35's first build, which also had the ring fault) */
DEV void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
DEV float ld_cluster(unsigned a, int r) {
    unsigned ra;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(r));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
    return v;
}
/* a staged kernel waits for the previous stage (griddepcontrol.wait) and marks when it returned */
DEV void stage_wait(const g4c_params &p, const g4c_op *op) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (p.strace) st_mark(p, op, 1, global_ns());
}

/* ---- the dot product: two weight rows against mt input rows -------------------------------------- */

/* the partial sums of a chunk dot, pairwise: (p0 + p1) + (p2 + p3) */
template <int A> DEV float qsum(const float (&p)[A]) {
    if (A == 4) return (p[0] + p[1 % A]) + (p[2 % A] + p[3 % A]);
    if (A == 2) return p[0] + p[1 % A];
    return p[0];
}

template <int T> DEV void unpack(const uint4 &w, float *f);
template <> __device__ __forceinline__ void unpack<G4C_BF16>(const uint4 &w, float *f) {
    f[0] = __uint_as_float(w.x << 16); f[1] = __uint_as_float(w.x & 0xffff0000u);
    f[2] = __uint_as_float(w.y << 16); f[3] = __uint_as_float(w.y & 0xffff0000u);
    f[4] = __uint_as_float(w.z << 16); f[5] = __uint_as_float(w.z & 0xffff0000u);
    f[6] = __uint_as_float(w.w << 16); f[7] = __uint_as_float(w.w & 0xffff0000u);
}
template <> __device__ __forceinline__ void unpack<G4C_F16>(const uint4 &w, float *f) {
    f[0] = f16f(w.x & 0xffffu); f[1] = f16f(w.x >> 16);
    f[2] = f16f(w.y & 0xffffu); f[3] = f16f(w.y >> 16);
    f[4] = f16f(w.z & 0xffffu); f[5] = f16f(w.z >> 16);
    f[6] = f16f(w.w & 0xffffu); f[7] = f16f(w.w >> 16);
}
/* quantised chunks go through codes_q8 / codes_q4; these only complete the template */
template <> __device__ __forceinline__ void unpack<G4C_Q8>(const uint4 &, float *) {}
template <> __device__ __forceinline__ void unpack<G4C_Q4>(const uint4 &, float *) {}
template <> __device__ __forceinline__ void unpack<G4C_F32>(const uint4 &w, float *f) {
    f[0] = __uint_as_float(w.x); f[1] = __uint_as_float(w.y);
    f[2] = __uint_as_float(w.z); f[3] = __uint_as_float(w.w);
}

/* Quantised codes become exact floats as 2^23 + q (q in the low mantissa bits) minus 2^23 and the
 * zero point (signed codes) or the centre (affine codes, whose bias absorbs it). */
/* One 16-byte chunk of each of two rows (wa, wb; for quantised rows their chunk's scales sc and
 * biases bz) against MTT tokens' inputs xc (stride ldx): the chunk's fmaf chains into the dense
 * partials p0/p1 or, quantised, its exact code products scaled into a0/a1. dot2 and the staged
 * ring kernel (mm_tile_ring) both run every chunk through it, so their sums are the same operations
 * in the same order. */
template <int T, int MTT>
DEV void chunk_dot(const uint4 &wa, const uint4 &wb, float sc0, float sc1, float bz0, float bz1, const float *xc, int ldx,
                   int mt, bool sgn, bool bias, float (&p0)[MTT][G4C_BACC], float (&p1)[MTT][G4C_BACC], float (&a0)[MTT],
                   float (&a1)[MTT]) {
    constexpr int E = G4C_CHUNK_ELEMS(T);
    constexpr bool Q = T == G4C_Q8 || T == G4C_Q4;
    if (!Q) {
        float f0[E], f1[E];
        unpack<T>(wa, f0);
        unpack<T>(wb, f1);
#pragma unroll
        for (int e = 0; e < E; e += 4) {
#pragma unroll
            for (int m = 0; m < MTT; m++) {
                if (m < mt) {
                    const float4 v = *reinterpret_cast<const float4 *>(xc + (size_t)m * ldx + e);
                    constexpr int h = 1 % G4C_BACC; /* .z, .w into the second chain */
                    p0[m][0] = fmaf(f0[e], v.x, p0[m][0]);
                    p1[m][0] = fmaf(f1[e], v.x, p1[m][0]);
                    p0[m][0] = fmaf(f0[e + 1], v.y, p0[m][0]);
                    p1[m][0] = fmaf(f1[e + 1], v.y, p1[m][0]);
                    p0[m][h] = fmaf(f0[e + 2], v.z, p0[m][h]);
                    p1[m][h] = fmaf(f1[e + 2], v.z, p1[m][h]);
                    p0[m][h] = fmaf(f0[e + 3], v.w, p0[m][h]);
                    p1[m][h] = fmaf(f1[e + 3], v.w, p1[m][h]);
                }
            }
        }
    } else {
        /* per chunk: d = codes · x (float, exact codes), then acc += s·d (+ b·Σx) */
        /* codes as bytes: Q8 the words themselves (sign flipped once per word), Q4 the even
         * (low nibble) and odd (high nibble) elements of each word in two byte vectors; a
         * byte permute then builds 2^23 + q directly */
        const unsigned flip = T == G4C_Q8 && sgn ? 0x80808080u : 0u;
        const unsigned ww0[4] = {wa.x ^ flip, wa.y ^ flip, wa.z ^ flip, wa.w ^ flip};
        const unsigned ww1[4] = {wb.x ^ flip, wb.y ^ flip, wb.z ^ flip, wb.w ^ flip};
        /* d = codes · x in G4C_QACC interleaved partial sums (element e into partial e %
         * G4C_QACC, each an fmaf chain in element order), added pairwise at the end: short
         * dependency chains for the two warps a scheduler has */
        float d0[MTT][G4C_QACC], d1[MTT][G4C_QACC], sx[MTT];
#pragma unroll
        for (int m = 0; m < MTT; m++) {
            sx[m] = 0.0f;
#pragma unroll
            for (int a = 0; a < G4C_QACC; a++) d0[m][a] = d1[m][a] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < E; e += 4) {
            float f0[4], f1[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int el = e + i;
                unsigned b0, b1, sel;
                if (T == G4C_Q8) {
                    b0 = ww0[el >> 2];
                    b1 = ww1[el >> 2];
                    sel = el & 3;
                } else {
                    const int sh = (el & 1) * 4; /* odd elements: the high nibbles */
                    b0 = (ww0[el >> 3] >> sh) & 0x0F0F0F0Fu;
                    b1 = (ww1[el >> 3] >> sh) & 0x0F0F0F0Fu;
                    sel = (el & 7) >> 1;
                }
                /* signed and affine codes: 2^23 + q - (2^23 + 128 | 8); unsigned without a
                 * bias: 2^23 + q - 2^23 */
                const float z = T == G4C_Q8 ? (sgn || bias ? 8388736.0f : 8388608.0f) : (sgn || bias ? 8388616.0f : 8388608.0f);
                f0[i] = __uint_as_float(__byte_perm(b0, 0x4B000000u, 0x7540u + sel)) - z;
                f1[i] = __uint_as_float(__byte_perm(b1, 0x4B000000u, 0x7540u + sel)) - z;
            }
#pragma unroll
            for (int m = 0; m < MTT; m++) {
                if (m < mt) {
                    const float4 v = *reinterpret_cast<const float4 *>(xc + (size_t)m * ldx + e);
                    constexpr int A = G4C_QACC;
                    d0[m][(e + 0) % A] = fmaf(f0[0], v.x, d0[m][(e + 0) % A]);
                    d1[m][(e + 0) % A] = fmaf(f1[0], v.x, d1[m][(e + 0) % A]);
                    d0[m][(e + 1) % A] = fmaf(f0[1], v.y, d0[m][(e + 1) % A]);
                    d1[m][(e + 1) % A] = fmaf(f1[1], v.y, d1[m][(e + 1) % A]);
                    d0[m][(e + 2) % A] = fmaf(f0[2], v.z, d0[m][(e + 2) % A]);
                    d1[m][(e + 2) % A] = fmaf(f1[2], v.z, d1[m][(e + 2) % A]);
                    d0[m][(e + 3) % A] = fmaf(f0[3], v.w, d0[m][(e + 3) % A]);
                    d1[m][(e + 3) % A] = fmaf(f1[3], v.w, d1[m][(e + 3) % A]);
                    if (bias) sx[m] = ((sx[m] + v.x) + v.y) + (v.z + v.w);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < MTT; m++) {
            if (m < mt) {
                a0[m] = fmaf(sc0, qsum<G4C_QACC>(d0[m]), a0[m]);
                a1[m] = fmaf(sc1, qsum<G4C_QACC>(d1[m]), a1[m]);
                if (bias) {
                    a0[m] = fmaf(bz0, sx[m], a0[m]);
                    a1[m] = fmaf(bz1, sx[m], a1[m]);
                }
            }
        }
    }
}

/* ---- quantised rows against integer activations ------------------------------------------------ */

/* The procedure every matmul stage and MoE expert of 4- and 8-bit rows runs (any M: decode, verify,
 * exact prefill; the drafter's centroid head keeps chunk_dot's float codes). The stage's input
 * tile is built in integer form, one 32-column block at a time (qi_block; by load_input as it
 * builds the rows, or in place by qi_tile): with mx = max |x| over the block, X = rn(x·r),
 * r = (2^23 − 1)/mx (|X| < 2^23: every element to within mx·2^-24 of itself, the resolution of the
 * block's largest float), in three byte planes, X = d0 + 256·d1 + 65536·d2 (d0, d1 unsigned, d2
 * signed), and per block dx = mx/(2^23 − 1) and the float sums of x over columns 0..15, 16..31 and
 * all 32 (for the rows with an additive term). A chunk of codes is then three exact integer dot
 * products per row (dp4a: four codes a step, the codes as signed bytes: 16·(u − 8) for 4-bit rows,
 * u − 128 or q for 8-bit ones), joined in float as P2·65536 + (P0 + 256·P1), and
 * acc += P·(s·dx) (+ b'·Σx, b' the bias with the centring folded in as in chunk_dot). Per weight:
 * under one instruction against chunk_dot's three (byte permute, subtract, fmaf); the arithmetic of
 * a token depends only on its own row, so outputs are the same for any M and any place in the tile.
 *
 * Block b of tile row m (144 bytes: its 32 floats and 16 of padding) becomes: bytes 0..31 the d0
 * plane, 32..63 d1, 64..95 d2, 96..111 {dx, Σx[0..15], Σx[16..31], Σx[0..31]}; dx over 16 for 4-bit
 * rows (their codes carry the factor). 4-bit tiles keep a chunk's nibble order (plane word 2k: the
 * even columns 8k, 8k+2, 8k+4, 8k+6, the low nibbles of code word k; word 2k+1 the odd ones), 8-bit
 * tiles the columns' order. A block with a NaN or an infinity gets dx = NaN, so the outputs it meets
 * are NaN as with float rows; a block under 2^-100 is zero. */
DEV int dp4a_su(unsigned a, unsigned b, int c) { /* signed bytes of a times unsigned bytes of b */
    int d;
    asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
DEV int dp4a_ss(unsigned a, unsigned b, int c) { return __dp4a((int)a, (int)b, c); }

/* One block in integer form from its floats, lane q = lane & 7 of each group of eight holding columns
 * 4q..4q+3 (v; four blocks a warp), written into the block's 144 bytes at blk. Every lane of the
 * warp calls it (on: the group's block exists); nothing of the block is read here, so its floats
 * may be the source. */
template <int T>
DEV void qi_block(const float4 &v, unsigned char *blk, bool on) {
    const int lane = threadIdx.x & 31, q = lane & 7;
    const float xv[4] = {v.x, v.y, v.z, v.w};
    const float ax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    /* a NaN or an infinity anywhere in the block (fmaxf drops NaNs) */
    const unsigned bal = __ballot_sync(0xffffffffu, !(ax <= 3.4028234e38f) || v.x != v.x || v.y != v.y || v.z != v.z || v.w != v.w);
    const bool bad = ((bal >> (lane & 24)) & 0xffu) != 0;
    float mx = ax;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    /* the block's largest element maps to 2^23 − 1 (blocks under 2^-100: zero) */
    const bool zero = bad || !(mx >= 7.8886091e-31f);
    const float r = zero ? 0.0f : 8388607.0f / mx;
    unsigned d[3] = {0u, 0u, 0u}; /* the lane's four columns in each plane, a byte each */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int X = zero ? 0 : max(min(__float2int_rn(xv[i] * r), 8388607), -8388607);
#pragma unroll
        for (int j = 0; j < 3; j++) d[j] |= (unsigned)((X >> (8 * j)) & 255) << (8 * i);
    }
    float sx = (v.x + v.y) + (v.z + v.w); /* Σx over each half (lanes 0..3, 4..7 of the group) */
    sx += __shfl_xor_sync(0xffffffffu, sx, 1);
    sx += __shfl_xor_sync(0xffffffffu, sx, 2);
    const float so = __shfl_xor_sync(0xffffffffu, sx, 4);
    const float s_lo = q < 4 ? sx : so, s_hi = q < 4 ? so : sx;
    float dx = bad ? __int_as_float(0x7fc00000) : zero ? 0.0f : mx / 8388607.0f;
    if (T == G4C_Q4) { /* the codes carry 16; plane words in the nibbles' order (pairs of lanes) */
        dx *= 0.0625f;
#pragma unroll
        for (int j = 0; j < 3; j++) {
            const unsigned o = __shfl_xor_sync(0xffffffffu, d[j], 1);
            const unsigned lo = q & 1 ? o : d[j], hi = q & 1 ? d[j] : o;
            d[j] = __byte_perm(lo, hi, q & 1 ? 0x7531 : 0x6420);
        }
    }
    __syncwarp(); /* every lane has read its floats (qi_tile reads them from the block itself) */
    if (on) {
#pragma unroll
        for (int j = 0; j < 3; j++) *reinterpret_cast<unsigned *>(blk + 32 * j + 4 * q) = d[j];
        if (q == 0) *reinterpret_cast<float4 *>(blk + 96) = make_float4(dx, s_lo, s_hi, s_lo + s_hi);
    }
}
/* float4 c of a tile row v: its block's bytes (qi_block's blk) */
DEV unsigned char *qi_blk(float *v, int c) { return reinterpret_cast<unsigned char *>(v + 36 * (c >> 3)); }

/* rows 0..mt-1 of the float tile sm (row stride ldk floats, K a multiple of 32) into the integer
 * form, in place (tiles load_input did not build in that form); every thread of the block. xf(m, c,
 * x) gives the value of float4 c of row m from its float4 x in the tile (load_rows: the norm's last
 * multiply): elementwise, so the values are those of a float tile transformed first. */
struct qi_same {
    __device__ __forceinline__ float4 operator()(int, int, const float4 &x) const { return x; }
};
template <int T, class XF = qi_same>
DEVN void qi_tile(float *sm, int ldk, int K, int mt, XF xf = XF()) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K4 = K >> 2;
    __syncthreads(); /* the float tile is complete */
    /* two sets of four blocks a warp per step: independent chains of shuffles (each set's blocks are
     * its own, their floats read before either is written) */
#pragma unroll 1
    for (int i0 = 32 * warp; i0 < mt * K4; i0 += 64 * G4C_WARPS) {
        float4 x[2];
        float *v[2];
        int c[2];
        bool on[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int idx = i0 + u * 32 * G4C_WARPS + lane, m = idx / K4;
            on[u] = idx < mt * K4;
            c[u] = idx - m * K4;
            v[u] = sm + (size_t)(on[u] ? m : 0) * ldk;
            x[u] = on[u] ? xf(m, c[u], *reinterpret_cast<const float4 *>(v[u] + px(4 * c[u]))) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        qi_block<T>(x[0], qi_blk(v[0], c[0]), on[0]);
        if (i0 + 32 * G4C_WARPS < mt * K4) qi_block<T>(x[1], qi_blk(v[1], c[1]), on[1]); /* warp-uniform */
    }
    __syncthreads();
}
/* a tile row's float4s into shared memory as float (qt 0) or in integer form (qt: the rows' type),
 * thread tid holding float4 c (c < K4: on; every lane calls it for qt != 0) */
DEV void tile_put(float *v, int c, const float4 &x, bool on, int qt) {
    if (qt == G4C_Q4) qi_block<G4C_Q4>(x, qi_blk(v, c), on);
    else if (qt == G4C_Q8) qi_block<G4C_Q8>(x, qi_blk(v, c), on);
    else if (on) *reinterpret_cast<float4 *>(v + px(4 * c)) = x;
}

/* chunk_dot against an integer tile (x: row 0 of the tile, c: the chunk's index): the same
 * accumulators a0, a1 (quantised rows have no dense partials); badd: add bz·Σx (rows with a bias,
 * and unsigned codes without one, whose centring shift bz = z·s then carries) */
template <int T, int MTT>
DEV void chunk_dot_qi(const uint4 &wa, const uint4 &wb, float sc0, float sc1, float bz0, float bz1, const float *x, int c,
                      int ldx, int mt, bool sgn, bool badd, float (&a0)[MTT], float (&a1)[MTT]) {
    constexpr bool Q4 = T == G4C_Q4;
    constexpr int NW = Q4 ? 8 : 4; /* code words (and plane words) per chunk */
    const unsigned wa4[4] = {wa.x, wa.y, wa.z, wa.w}, wb4[4] = {wb.x, wb.y, wb.z, wb.w};
    unsigned ca[NW], cb[NW];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (Q4) { /* 16·(u − 8) as signed bytes: even columns (low nibbles), then odd */
            ca[2 * k] = ((wa4[k] << 4) & 0xF0F0F0F0u) ^ 0x80808080u;
            ca[2 * k + 1] = (wa4[k] & 0xF0F0F0F0u) ^ 0x80808080u;
            cb[2 * k] = ((wb4[k] << 4) & 0xF0F0F0F0u) ^ 0x80808080u;
            cb[2 * k + 1] = (wb4[k] & 0xF0F0F0F0u) ^ 0x80808080u;
        } else { /* signed codes as they are; others centred, u − 128 */
            const unsigned flip = sgn ? 0u : 0x80808080u;
            ca[k] = wa4[k] ^ flip;
            cb[k] = wb4[k] ^ flip;
        }
    }
    const char *blk = reinterpret_cast<const char *>(x) + (size_t)(Q4 ? c : c >> 1) * 144;
    const int half = Q4 ? 0 : (c & 1) * 16;
#pragma unroll
    for (int m = 0; m < MTT; m++) {
        if (m < mt) {
            const char *bm = blk + (size_t)m * ldx * 4;
            int pa[3], pb[3];
#pragma unroll
            for (int j = 0; j < 3; j++) {
                unsigned d[NW];
                const uint4 q0 = *reinterpret_cast<const uint4 *>(bm + 32 * j + half);
                d[0] = q0.x, d[1] = q0.y, d[2] = q0.z, d[3] = q0.w;
                if (Q4) {
                    const uint4 q1 = *reinterpret_cast<const uint4 *>(bm + 32 * j + 16);
                    d[NW - 4] = q1.x, d[NW - 3] = q1.y, d[NW - 2] = q1.z, d[NW - 1] = q1.w;
                }
                int sa = 0, sb = 0;
#pragma unroll
                for (int k = 0; k < NW; k++) {
                    sa = j < 2 ? dp4a_su(ca[k], d[k], sa) : dp4a_ss(ca[k], d[k], sa);
                    sb = j < 2 ? dp4a_su(cb[k], d[k], sb) : dp4a_ss(cb[k], d[k], sb);
                }
                pa[j] = sa;
                pb[j] = sb;
            }
            const float4 mq = *reinterpret_cast<const float4 *>(blk + (size_t)m * ldx * 4 + 96);
            const float va = fmaf((float)pa[2], 65536.0f, (float)(pa[0] + pa[1] * 256));
            const float vb = fmaf((float)pb[2], 65536.0f, (float)(pb[0] + pb[1] * 256));
            a0[m] = fmaf(va, sc0 * mq.x, a0[m]);
            a1[m] = fmaf(vb, sc1 * mq.x, a1[m]);
            if (badd) {
                const float xs = Q4 ? mq.w : half ? mq.z : mq.y;
                a0[m] = fmaf(bz0, xs, a0[m]);
                a1[m] = fmaf(bz1, xs, a1[m]);
            }
        }
    }
}

/* chunks per row a lane loads ahead (dot2's unroll U) for weight type T, tile MTT and the 5..8-token
 * tiles' unroll U8 (2: the lean one-token kernel) */
template <int T, int MTT, int U8> struct dot_u {
    static constexpr int U = MTT == 1 ? (U8 == 2 ? (T == G4C_Q4 ? G4C_U_Q4_M1 / 2 : 4) : T == G4C_Q4 ? G4C_U_Q4_M1 : 8)
                           : MTT <= 4 ? (T == G4C_Q4 ? G4C_U_MT4 / 2 : G4C_U_MT4)
                                      : (T == G4C_Q4 ? U8 / 2 : U8);
};

/* One load group of a lane: its chunks c0, c0 + step, ..., c0 + (U-1)·step (those below nch) of two
 * rows and, quantised, their scales and biases, in registers (mm_tile_pipe's; dot2 keeps its own
 * copy of these loops: built on these helpers it spilled, ptxas -v: 20 -> 928 bytes in the
 * one-token 4-bit stage kernel). */
template <int U> struct dot_grp {
    uint4 w0[U], w1[U];
    float s0[U], s1[U], b0[U], b1[U]; /* dense rows: unused */
};

/* A quantised stage's scale-group index of chunk c, c·E / group, as a shift where it can be (the
 * same for every part, so computed once a tile: q_group_shift): sh = log2(group) for power-of-two
 * groups, 31 where every part has one group a row (per-channel scales: the index is 0), -1 where
 * a part's group is neither (q_group_index divides). The index is the same integer either way; the
 * division it replaces was ~30 instructions a chunk, twice an item of E2B's 4-bit LM head (ncu). */
DEV int q_group_shift(const g4c_op *op, int nparts) {
    int sh = -2;
    for (int i = 0; i < nparts; i++) {
        const g4c_mat &w = op->part[i].w;
        const int s = w.group >= w.cols ? 31 : w.group > 0 && (w.group & (w.group - 1)) == 0 ? __ffs(w.group) - 1 : -1;
        sh = sh == -2 || sh == s ? s : -1;
    }
    return sh < 0 ? -1 : sh;
}
DEVR int q_group_div(int ce, int group) { return ce / group; }
DEV int q_group_index(int ce, int group, int gsh) { return gsh >= 0 ? ce >> gsh : q_group_div(ce, group); }

template <int T, int U, bool QI = false>
DEV void dot_load(dot_grp<U> &g, const char *w0, const char *w1, const g4c_mat &wm, int c0, int nch, int step, bool sgn,
                  bool bias, unsigned long long pol, int gsh) {
    constexpr int E = G4C_CHUNK_ELEMS(T);
    constexpr bool Q = T == G4C_Q8 || T == G4C_Q4;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + step * u;
        g.s0[u] = g.s1[u] = g.b0[u] = g.b1[u] = 0.0f;
        if (c < nch) {
            g.w0[u] = ld_w16(w0 + (size_t)c * 16, pol);
            g.w1[u] = ld_w16(w1 + (size_t)c * 16, pol);
            if (Q) {
                const int gi = q_group_index(c * E, wm.group, gsh);
                g.s0[u] = q_param(w0, wm.sc_off, wm.stype, gi);
                g.s1[u] = q_param(w1, wm.sc_off, wm.stype, gi);
                /* affine codes are centred (q - 8 / q - 128, exact) and the bias takes the shift:
                 * b' = b + z s, so s·d and b'·Σx do not cancel; signed codes with a bias (widened
                 * narrower codes, session.cu) are centred already */
                const float zc = sgn ? 0.0f : T == G4C_Q8 ? 128.0f : 8.0f;
                if (QI ? bias || !sgn : bias) { /* integer tiles: every unsigned code is centred */
                    g.b0[u] = fmaf(zc, g.s0[u], bias ? q_param(w0, wm.bi_off, wm.stype, gi) : 0.0f);
                    g.b1[u] = fmaf(zc, g.s1[u], bias ? q_param(w1, wm.bi_off, wm.stype, gi) : 0.0f);
                }
            }
        }
    }
}

/* the group's chunks, in order, into the accumulators (chunk_dot) */
template <int T, int MTT, int U, bool QI = false>
DEV void dot_group(const dot_grp<U> &g, int c0, int nch, int step, const float *x, int ldx, int mt, bool sgn, bool bias,
                   float (&p0)[MTT][G4C_BACC], float (&p1)[MTT][G4C_BACC], float (&a0)[MTT], float (&a1)[MTT]) {
    constexpr int E = G4C_CHUNK_ELEMS(T);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + step * u;
        if (c >= nch) continue;
        if constexpr (QI) chunk_dot_qi<T, MTT>(g.w0[u], g.w1[u], g.s0[u], g.s1[u], g.b0[u], g.b1[u], x, c, ldx, mt, sgn, bias || !sgn, a0, a1);
        else chunk_dot<T, MTT>(g.w0[u], g.w1[u], g.s0[u], g.s1[u], g.b0[u], g.b1[u], x + px(c * E), ldx, mt, sgn, bias, p0, p1, a0, a1);
    }
}

template <int MTT> DEV void dot_zero(float (&p0)[MTT][G4C_BACC], float (&p1)[MTT][G4C_BACC], float (&a0)[MTT], float (&a1)[MTT]) {
#pragma unroll
    for (int m = 0; m < MTT; m++) {
        a0[m] = a1[m] = 0.0f;
#pragma unroll
        for (int a = 0; a < G4C_BACC; a++) p0[m][a] = p1[m][a] = 0.0f;
    }
}

/* the lane's sums (dense rows: their G4C_BACC chains pairwise), then the warp's xor butterfly */
template <int T, int MTT>
DEV void dot_finish(float (&p0)[MTT][G4C_BACC], float (&p1)[MTT][G4C_BACC], float (&a0)[MTT], float (&a1)[MTT],
                    float (&acc)[2][G4C_MT]) {
    constexpr bool Q = T == G4C_Q8 || T == G4C_Q4;
#pragma unroll
    for (int m = 0; m < MTT; m++) {
        if (!Q) {
            a0[m] = qsum<G4C_BACC>(p0[m]);
            a1[m] = qsum<G4C_BACC>(p1[m]);
        }
        acc[0][m] = warp_sum_f(a0[m]);
        acc[1][m] = warp_sum_f(a1[m]);
    }
}

/* acc[r][m] = w_r · x_m (r < 2) for team warp j of S. Lane l of warp j owns 16-byte chunks
 * 32j + l, 32j + l + 32S, ... in ascending order, one fmaf accumulator per (row, token); then the
 * xor butterfly (the caller adds the S warp sums in order). The unroll U only groups loads ahead
 * of their use; it never changes the sequence of operations on any accumulator (U8: the unroll of
 * 5..8-token tiles, chosen per kernel instantiation by mm_tile_t). x is a padded input tile (row
 * stride ldx). */
template <int T, int MTT, int U8 = 4, bool QI = false>
DEV void dot2(const char *w0, const char *w1, const g4c_mat &wm, int K, const float *x, int ldx, int mt, int j, int S,
              float (&acc)[2][G4C_MT], unsigned long long pol) {
    constexpr int E = G4C_CHUNK_ELEMS(T);
    constexpr bool Q = T == G4C_Q8 || T == G4C_Q4;
    constexpr int U = dot_u<T, MTT, U8>::U;
    const int lane = threadIdx.x & 31, nch = K / E, step = 32 * S;
    const bool sgn = Q && (wm.flags & G4C_QF_SIGNED), bias = Q && (wm.flags & G4C_QF_BIAS);
    float a0[MTT], a1[MTT];
    float p0[MTT][G4C_BACC], p1[MTT][G4C_BACC]; /* dense rows: G4C_BACC fmaf chains per row and token */
    dot_zero<MTT>(p0, p1, a0, a1);
#pragma unroll 1
    for (int c0 = 32 * j + lane; c0 < nch; c0 += step * U) {
        uint4 wv0[U], wv1[U];
        float s0[U] = {}, s1[U] = {}, b0[U] = {}, b1[U] = {}; /* dense rows: unused */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + step * u;
            if (c < nch) {
                wv0[u] = ld_w16(w0 + (size_t)c * 16, pol);
                wv1[u] = ld_w16(w1 + (size_t)c * 16, pol);
                if (Q) {
                    const int g = c * E / wm.group;
                    s0[u] = q_param(w0, wm.sc_off, wm.stype, g);
                    s1[u] = q_param(w1, wm.sc_off, wm.stype, g);
                    /* affine codes are centred (q - 8 / q - 128, exact) and the bias takes the
                     * shift: b' = b + z s, so s·d and b'·Σx do not cancel; signed codes with a
                     * bias (widened narrower codes, session.cu) are centred already */
                    const float zc = sgn ? 0.0f : T == G4C_Q8 ? 128.0f : 8.0f;
                    if (QI ? bias || !sgn : bias) { /* integer tiles: every unsigned code is centred */
                        b0[u] = fmaf(zc, s0[u], bias ? q_param(w0, wm.bi_off, wm.stype, g) : 0.0f);
                        b1[u] = fmaf(zc, s1[u], bias ? q_param(w1, wm.bi_off, wm.stype, g) : 0.0f);
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + step * u;
            if (c >= nch) continue;
            if constexpr (QI) chunk_dot_qi<T, MTT>(wv0[u], wv1[u], s0[u], s1[u], b0[u], b1[u], x, c, ldx, mt, sgn, bias || !sgn, a0, a1);
            else chunk_dot<T, MTT>(wv0[u], wv1[u], s0[u], s1[u], b0[u], b1[u], x + px(c * E), ldx, mt, sgn, bias, p0, p1, a0, a1);
        }
    }
    dot_finish<T, MTT>(p0, p1, a0, a1, acc);
}

/* ---- shared-memory layout of the tail (after the input tile) ---------------------------------- */

typedef struct {
    double *red;   /* [32] */
    float *bv;     /* [WARPS][MT] */
    int *bi;       /* [WARPS][MT] */
    float *mn;     /* [WARPS] */
    int *flag;     /* [4] */
    float *tp;     /* [2][WARPS][2][MT] team partials (double-buffered) */
    g4c_op *ops;   /* [2] the current and the next stage (p.op_local) */
} tail_t;

DEV tail_t tail_of(float *sm, const g4c_params &p) {
    tail_t t;
    t.red = (double *)(sm + p.smem_in_floats);
    t.bv = (float *)(t.red + 32);
    t.bi = (int *)(t.bv + G4C_WARPS * G4C_MT);
    t.mn = (float *)(t.bi + G4C_WARPS * G4C_MT);
    t.flag = (int *)(t.mn + G4C_WARPS);
    t.tp = (float *)(t.flag + 4);
    t.ops = (g4c_op *)((char *)t.red + 4096);
    return t;
}

/* ---- the input tile ------------------------------------------------------------------------------ */

/* Block sums in double of several rows, each exactly as block_sum_d sums one value: red_put (every
 * thread, row m) does the warp butterfly and keeps the warp's sum in red[warp][m]; after a
 * __syncthreads, red_get adds the warp sums in warp order. red: [WARPS][G4C_MT]. */
DEV void red_put(double v, int m, double *red) {
    v = warp_sum_d(v);
    if ((threadIdx.x & 31) == 0) red[(threadIdx.x >> 5) * G4C_MT + m] = v;
}
DEV double red_get(int m, const double *red) {
    double s = 0;
    for (int w = 0; w < G4C_WARPS; w++) s += red[w * G4C_MT + m];
    return s;
}

/* The input tile of mt > 1 rows (plain or normed) at once: every row's x (and residual addend t),
 * and the two norm weights, copied into shared memory together (t at sm + mt·ldk, then t_w and
 * norm_w; asynchronous copies, all in flight at once), then each reduction of all rows in one pass, every
 * operand read from shared memory (few live registers: this is inlined into a kernel at its
 * register limit). Per element and per row the arithmetic and the reduction order are load_input's
 * (thread tid owns the float4s tid + k·G4C_THREADS of every row), so the tile is bitwise the one
 * the row-at-a-time path builds. In kernels with 4- or 8-bit rows each pass is a loop over the
 * rows, not unrolled (RU): a stage kernel runs this code once per launch, so its length is
 * instruction fetches on the critical path (E2B qat-int4 verify k = 3 7.26 -> 7.17 ms on an H100);
 * dense-only kernels keep them unrolled (not re-measured). Each
 * row's inverse norm is computed once, by thread m, into shared memory (fs) - not as mt sequential
 * chains of the warp sums' addition and a double division and square root in every thread. The caller checks the fit
 * (load_rows_floats). red: two [WARPS][G4C_MT] double scratch arrays, then fs: 2·G4C_MT floats.
 * qt (a type in QM, the stage's 4- or 8-bit rows): normed rows are built in integer form by the
 * norm's last pass (qi_tile with that multiply; returns true); other rows are left as floats. */
DEV size_t load_rows_floats(const g4c_in &in, int K, int mt) { return g4c_rows_floats(in.kind == G4C_IN_NORM, K, mt); }
template <unsigned QM>
DEVN bool load_rows(const g4c_in &in, int K, int t0, int mt, int step, float *sm, double *red, const g4c_params &p,
                    bool writer, int qt) {
    const int tid = threadIdx.x, K4 = K / 4, ldk = G4C_TILE_LD(K);
    const bool norm = in.kind == G4C_IN_NORM;
    const bool has_t = norm && in.t, has_n = norm && in.norm != G4C_NORM_NONE;
    float *tst = sm + (size_t)mt * ldk, *tws = tst + (size_t)mt * K, *nws = tws + K;
    double *red1 = red, *red2 = red + G4C_WARPS * G4C_MT;
    float *fs = reinterpret_cast<float *>(red2 + G4C_WARPS * G4C_MT); /* [0, MT): 1/rms(t); [MT, 2MT): 1/rms(x) */
    /* every row's x, t rows, t_w, norm_w: all copies in flight at once (no registers held) */
#pragma unroll 1
    for (int f = tid; f < mt * K4; f += G4C_THREADS) {
        const int m = f / K4, c = f - m * K4;
        cp16(sm + (size_t)m * ldk + px(4 * c), in.x + (size_t)(t0 + m) * in.ldx + 4 * c);
        if (has_t) cp16(tst + (size_t)m * K + 4 * c, in.t + (size_t)(t0 + m) * K + 4 * c);
    }
#pragma unroll 1
    for (int c = tid; c < K4; c += G4C_THREADS) {
        if (has_t) cp16(tws + 4 * c, in.t_w + 4 * c);
        if (has_n) cp16(nws + 4 * c, in.norm_w + 4 * c);
    }
    cp_wait();
    __syncthreads();
    if (!norm) return false; /* plain rows: the caller converts them in place (qi_tile) */
    constexpr int N4 = G4C_IN_NPT / 4;
    /* rows as loops where the kernel has 4- or 8-bit rows (measured there), else unrolled */
    constexpr int RU = (QM & ((1u << G4C_Q4) | (1u << G4C_Q8))) != 0 ? 1 : G4C_MT;
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (has_t) { /* residual: v += rms_w(t_w)(t) */
#pragma unroll RU
        for (int m = 0; m < G4C_MT; m++) {
            if (m >= mt) break;
            double ss = 0;
#pragma unroll
            for (int k = 0; k < N4; k++) {
                const int c = tid + k * G4C_THREADS;
                ss += sq4(c < K4 ? *reinterpret_cast<const float4 *>(tst + (size_t)m * K + 4 * c) : z4);
            }
            red_put(ss, m, red1);
        }
        __syncthreads();
        if (tid < mt) fs[tid] = rms_inv(red_get(tid, red1), K, p.eps);
        __syncthreads();
    }
#pragma unroll RU
    for (int m = 0; m < G4C_MT; m++) {
        if (m >= mt) break;
        const float inv = has_t ? fs[m] : 0.0f;
        const int tm = t0 + m;
        double ss = 0;
#pragma unroll
        for (int k = 0; k < N4; k++) {
            const int c = tid + k * G4C_THREADS;
            float4 xv = c < K4 ? *reinterpret_cast<const float4 *>(sm + (size_t)m * ldk + px(4 * c)) : z4;
            if (has_t) {
                const float4 tv = c < K4 ? *reinterpret_cast<const float4 *>(tst + (size_t)m * K + 4 * c) : z4;
                const float4 tw = c < K4 ? *reinterpret_cast<const float4 *>(tws + 4 * c) : z4;
                xv.x = xv.x + tv.x * inv * tw.x;
                xv.y = xv.y + tv.y * inv * tw.y;
                xv.z = xv.z + tv.z * inv * tw.z;
                xv.w = xv.w + tv.w * inv * tw.w;
            }
            if (in.has_scalar) xv = make_float4(xv.x * in.scalar, xv.y * in.scalar, xv.z * in.scalar, xv.w * in.scalar);
            if (c < K4) {
                if (writer && in.x_out) reinterpret_cast<float4 *>(in.x_out + (size_t)tm * K)[c] = xv;
                if (writer && in.dbg) reinterpret_cast<float4 *>(in.dbg + (size_t)tm * K)[c] = xv;
                *reinterpret_cast<float4 *>(sm + (size_t)m * ldk + px(4 * c)) = xv;
            }
            ss += sq4(xv);
        }
        if (has_n) red_put(ss, m, red2);
    }
    if (has_n) {
        __syncthreads();
        if (tid < mt) fs[G4C_MT + tid] = rms_inv(red_get(tid, red2), K, p.eps);
        __syncthreads();
        const float f = in.norm == G4C_NORM_ROUTER ? in.norm_scale : 1.0f;
        if (qt) { /* the norm's last multiply as the integer form is built (qi_tile): the same values */
            auto xf = [&](int m, int c, const float4 &x) {
                const float iv = fs[G4C_MT + m];
                const float4 nw = *reinterpret_cast<const float4 *>(nws + 4 * c);
                const float4 xv = make_float4(x.x * iv * f * nw.x, x.y * iv * f * nw.y, x.z * iv * f * nw.z, x.w * iv * f * nw.w);
                if (writer && in.normed_out)
                    reinterpret_cast<float4 *>(in.normed_out + (size_t)(t0 + m) * K + (size_t)step * in.normed_step)[c] = xv;
                return xv;
            };
            if constexpr ((QM & (1u << G4C_Q4)) != 0)
                if (qt == G4C_Q4) qi_tile<G4C_Q4>(sm, ldk, K, mt, xf);
            if constexpr ((QM & (1u << G4C_Q8)) != 0)
                if (qt == G4C_Q8) qi_tile<G4C_Q8>(sm, ldk, K, mt, xf);
            return true;
        }
#pragma unroll RU
        for (int m = 0; m < G4C_MT; m++) {
            if (m >= mt) break;
            const float iv = fs[G4C_MT + m];
            const int tm = t0 + m;
#pragma unroll
            for (int k = 0; k < N4; k++) {
                const int c = tid + k * G4C_THREADS;
                if (c >= K4) continue;
                float4 xv = *reinterpret_cast<const float4 *>(sm + (size_t)m * ldk + px(4 * c));
                const float4 nw = *reinterpret_cast<const float4 *>(nws + 4 * c);
                xv = make_float4(xv.x * iv * f * nw.x, xv.y * iv * f * nw.y, xv.z * iv * f * nw.z, xv.w * iv * f * nw.w);
                if (writer && in.normed_out)
                    reinterpret_cast<float4 *>(in.normed_out + (size_t)tm * K + (size_t)step * in.normed_step)[c] = xv;
                *reinterpret_cast<float4 *>(sm + (size_t)m * ldk + px(4 * c)) = xv;
            }
        }
    }
    __syncthreads();
    return false;
}

/* Rows t0 .. t0+mt-1 of the stage's input into sm[m * K ...], transformed as the stage asks. Every
 * block computes the same values; block 0 also writes the ones the rest of the program needs.
 * Thread tid owns the float4s tid + k·G4C_THREADS of a row in registers (K a multiple of 4, at most
 * G4C_THREADS·G4C_IN_NPT): every global load of a row (x, the residual addend, both norm weights) is
 * issued before any is used, so a row costs one memory round trip and two block reductions; the
 * arithmetic per element is the same for any M. */
DEVN bool load_input(const g4c_in *inp, int K, int t0, int mt, int step, float *sm, double *red,
                     const g4c_params &p, bool writer, int qt) {
    const g4c_in &in = *inp;
    const int tid = threadIdx.x;
    for (int m = 0; m < mt; m++) {
        const int tm = t0 + m;
        float *v = sm + (size_t)m * G4C_TILE_LD(K);
        if (in.kind == G4C_IN_CONCAT) { /* drafter: [E_target[tok] * s, carried hidden] */
            const int H = K / 2;
            const int tok = step == 0 ? ldi(&p.ctl->dtok0) : ldi(&p.ctl->drafts[step - 1]);
#pragma unroll 1
            for (int i = tid; i < H; i += G4C_THREADS) {
                v[px(i)] = mat_at(in.emb, tok, i) * in.emb_scale;
                v[px(H + i)] = lda(in.hid + i);
            }
            continue;
        }
        const float *x = in.x + (size_t)tm * in.ldx;
        if (in.kind != G4C_IN_NORM) { /* plain rows: float4s, 4 independent loads per thread in flight */
            const int K4 = K / 4;
            if (qt) { /* integer form: warp-uniform steps (qi_block's shuffles), 2 loads in flight */
#pragma unroll 1
                for (int c0 = tid - (tid & 31); c0 < K4; c0 += 2 * G4C_THREADS) {
                    float4 a[2];
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int c = c0 + (tid & 31) + u * G4C_THREADS;
                        a[u] = c < K4 ? lda4(x + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    }
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int c = c0 + (tid & 31) + u * G4C_THREADS;
                        if (c0 + u * G4C_THREADS < K4) tile_put(v, c, a[u], c < K4, qt);
                    }
                }
                continue;
            }
#pragma unroll 1
            for (int c0 = tid; c0 < K4; c0 += 4 * G4C_THREADS) {
                float4 a[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (c0 + u * G4C_THREADS < K4) a[u] = lda4(x + 4 * (c0 + u * G4C_THREADS));
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (c0 + u * G4C_THREADS < K4) *reinterpret_cast<float4 *>(v + px(4 * (c0 + u * G4C_THREADS))) = a[u];
            }
            continue;
        }
        const float *t = in.t ? in.t + (size_t)tm * K : NULL;
        constexpr int N4 = G4C_IN_NPT / 4;
        const int K4 = K / 4;
        const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float4 xv[N4], tv[N4], tw[N4], nw[N4];
#pragma unroll
        for (int k = 0; k < N4; k++) {
            const int c = tid + k * G4C_THREADS;
            const bool ok = c < K4;
            xv[k] = ok ? lda4(x + 4 * c) : z4;
            tv[k] = ok && t ? lda4(t + 4 * c) : z4;
            tw[k] = ok && t ? __ldg(reinterpret_cast<const float4 *>(in.t_w) + c) : z4;
            nw[k] = ok && in.norm != G4C_NORM_NONE ? __ldg(reinterpret_cast<const float4 *>(in.norm_w) + c) : z4;
        }
        if (t) { /* residual: v += rms_w(t_w)(t) */
            double ss = 0;
#pragma unroll
            for (int k = 0; k < N4; k++) ss += sq4(tv[k]);
            const float inv = rms_inv(block_sum_d(ss, red), K, p.eps);
#pragma unroll
            for (int k = 0; k < N4; k++) {
                xv[k].x = xv[k].x + tv[k].x * inv * tw[k].x;
                xv[k].y = xv[k].y + tv[k].y * inv * tw[k].y;
                xv[k].z = xv[k].z + tv[k].z * inv * tw[k].z;
                xv[k].w = xv[k].w + tv[k].w * inv * tw[k].w;
            }
        }
        if (in.has_scalar) {
            const float sc = in.scalar;
#pragma unroll
            for (int k = 0; k < N4; k++) xv[k] = make_float4(xv[k].x * sc, xv[k].y * sc, xv[k].z * sc, xv[k].w * sc);
        }
        if (writer && (in.x_out || in.dbg))
#pragma unroll
            for (int k = 0; k < N4; k++) {
                const int c = tid + k * G4C_THREADS;
                if (c >= K4) continue;
                if (in.x_out) reinterpret_cast<float4 *>(in.x_out + (size_t)tm * K)[c] = xv[k];
                if (in.dbg) reinterpret_cast<float4 *>(in.dbg + (size_t)tm * K)[c] = xv[k];
            }
        if (in.norm != G4C_NORM_NONE) {
            double ss = 0;
#pragma unroll
            for (int k = 0; k < N4; k++) ss += sq4(xv[k]);
            const float inv = rms_inv(block_sum_d(ss, red), K, p.eps);
            const float f = in.norm == G4C_NORM_ROUTER ? in.norm_scale : 1.0f;
#pragma unroll
            for (int k = 0; k < N4; k++) /* router: v·inv·H^-1/2·w; rms: v·inv·1·w (the 1 is exact) */
                xv[k] = make_float4(xv[k].x * inv * f * nw[k].x, xv[k].y * inv * f * nw[k].y, xv[k].z * inv * f * nw[k].z,
                                    xv[k].w * inv * f * nw[k].w);
            if (writer && in.normed_out)
#pragma unroll
                for (int k = 0; k < N4; k++) {
                    const int c = tid + k * G4C_THREADS;
                    if (c < K4) reinterpret_cast<float4 *>(in.normed_out + (size_t)tm * K + (size_t)step * in.normed_step)[c] = xv[k];
                }
        }
#pragma unroll
        for (int k = 0; k < N4; k++) {
            const int c = tid + k * G4C_THREADS;
            if (qt) {
                if (k * G4C_THREADS < K4) tile_put(v, c, xv[k], c < K4, qt); /* warp-uniform */
            } else if (c < K4) {
                *reinterpret_cast<float4 *>(v + px(4 * c)) = xv[k];
            }
        }
    }
    __syncthreads();
    return qt != 0 && in.kind != G4C_IN_CONCAT;
}

/* ---- argmax / min across the grid: per-block partials, the last block to finish combines ------ */

/* Called by every block after it wrote its partials for tokens [m0, m1). kind 1: target tokens
 * (ctl->next, decode chain); 2: drafter step (ctl->drafts[step]); with_min: ctl->dmin too. */
DEVN void finish_argmax(const g4c_params &p, int m0, int m1, int kind, int step, int with_min, int *flag) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) flag[0] = atomicAdd(&p.ctl->done_count, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!flag[0]) return;
    __threadfence();
#pragma unroll 1
    for (int m = m0 + (int)threadIdx.x; m < m1; m += G4C_THREADS) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (unsigned b = 0; b < gridDim.x; b++) {
            float v = lda(p.amax_part + (size_t)b * G4C_MAXB + m);
            int i = ldi(p.amax_idx + (size_t)b * G4C_MAXB + m);
            if (better(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        if (bi == INT_MAX) bi = 0; /* every value NaN: keep the chain on a valid id */
        if (kind == 1) {
            p.ctl->next[m] = bi;
            if (p.chain && m == p.M - 1) {
                p.ctl->tokens[0] = bi;
                if (p.hist) p.hist[p.ctl->hist_n] = bi;
                p.ctl->hist_n += 1;
                p.ctl->pos += p.M;
            }
        } else {
            p.ctl->drafts[step] = bi;
        }
    }
    if (with_min && threadIdx.x == 0) {
        float mn = INFINITY;
        for (unsigned b = 0; b < gridDim.x; b++) mn = fminf(mn, lda(p.amin_part + b));
        p.ctl->dmin = mn;
    }
    if (threadIdx.x == 0) p.ctl->done_count = 0;
}

/* the warps' entries tl.bv/bi [warp][m] for tokens m < mt of a tile -> this block's partials at [t0 + m] */
DEV void block_argmax_combine(const g4c_params &p, const tail_t &tl, int t0, int mt) {
    __syncthreads();
    if ((int)threadIdx.x < mt) {
        int m = threadIdx.x;
        float v = -INFINITY;
        int i = INT_MAX;
        for (int w = 0; w < G4C_WARPS; w++)
            if (better(tl.bv[w * G4C_MT + m], tl.bi[w * G4C_MT + m], v, i)) {
                v = tl.bv[w * G4C_MT + m];
                i = tl.bi[w * G4C_MT + m];
            }
        p.amax_part[(size_t)blockIdx.x * G4C_MAXB + t0 + m] = v;
        p.amax_idx[(size_t)blockIdx.x * G4C_MAXB + t0 + m] = i;
    }
}
/* warps' (value, index) for tokens m < mt of a tile (lane 0's bv/bi) -> this block's partials */
template <bool TWO = false>
DEV void block_argmax_store(const g4c_params &p, const tail_t &tl, const float *bv, const int *bi, int t0, int mt) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if constexpr (TWO) {
        for (int m = 0; m < G4C_MT; m++) { /* lane 1's candidates (mm_item_out<MTT, true>) against lane 0's; every lane */
            float v = bv[m];
            int i = bi[m];
            const float ov = __shfl_down_sync(0xffffffffu, v, 1);
            const int oi = __shfl_down_sync(0xffffffffu, i, 1);
            if (better(ov, oi, v, i)) {
                v = ov;
                i = oi;
            }
            if (lane == 0) {
                tl.bv[warp * G4C_MT + m] = v;
                tl.bi[warp * G4C_MT + m] = i;
            }
        }
    } else if (lane == 0) {
        for (int m = 0; m < G4C_MT; m++) {
            tl.bv[warp * G4C_MT + m] = bv[m];
            tl.bi[warp * G4C_MT + m] = bi[m];
        }
    }
    block_argmax_combine(p, tl, t0, mt);
}

/* ---- ops ------------------------------------------------------------------------------------------ */

DEVN void op_embed(const g4c_op *op, const g4c_params &p) {
    const int H = op->table.cols, M = p.M;
    const size_t n = (size_t)M * H;
#pragma unroll 1
    for (size_t idx = (size_t)blockIdx.x * G4C_THREADS + threadIdx.x; idx < n; idx += (size_t)gridDim.x * G4C_THREADS) {
        int m = (int)(idx / H), i = (int)(idx % H);
        int tok = ldi(&p.ctl->tokens[m]);
        op->out[(size_t)m * op->out_ld + i] = mat_at(op->table, tok, i) * op->scale;
    }
}

/* A matmul stage's items: row pairs of each part (gate/up pairs: one row of each) */
typedef struct {
    int items[G4C_MAXPART], total, nparts, pair;
} mm_shape;

DEV mm_shape mm_shape_of(const g4c_op *op, const g4c_params &p) {
    mm_shape sh;
    sh.nparts = (op->lm && !p.want_logits) ? 0 : op->nparts;
    sh.pair = op->epi == G4C_EPI_GELU_PAIR;
    sh.total = 0;
    for (int i = 0; i < G4C_MAXPART; i++) sh.items[i] = 0;
    if (sh.pair) {
        if (sh.nparts) sh.total = sh.items[0] = op->part[0].w.rows;
    } else {
#pragma unroll
        for (int i = 0; i < G4C_MAXPART; i++) /* constant indices: the shape stays in registers */
            if (i < sh.nparts) {
                sh.items[i] = (op->part[i].w.rows + 1) / 2;
                sh.total += sh.items[i];
            }
    }
    return sh;
}

/* the rows of item it: part index, first row, whether a second row exists, row pointers */
DEV int mm_item(const g4c_op *op, const mm_shape &sh, int it, int *r0, int *has1, const char **w0, const char **w1) {
    int pi = 0, li = it;
#pragma unroll
    for (int q = 0; q + 1 < G4C_MAXPART; q++) /* constant indices: the shape stays in registers */
        if (pi == q && li >= sh.items[q]) {
            li -= sh.items[q];
            pi = q + 1;
        }
    const g4c_mat &w = op->part[pi].w;
    if (sh.pair) {
        *r0 = li;
        *has1 = 1;
        *w0 = (const char *)w.data + (size_t)li * w.row_bytes;
        *w1 = (const char *)op->part[1].w.data + (size_t)li * op->part[1].w.row_bytes;
    } else {
        *r0 = 2 * li;
        *has1 = *r0 + 1 < w.rows;
        *w0 = (const char *)w.data + (size_t)*r0 * w.row_bytes;
        *w1 = *has1 ? *w0 + w.row_bytes : *w0;
    }
    return pi;
}

DEVR void mm_prefetch_item(const g4c_op *op, const mm_shape sh, int it) {
    int r0, has1, pi;
    const char *w0, *w1;
    pi = mm_item(op, sh, it, &r0, &has1, &w0, &w1);
    const long long rb = op->part[pi].w.row_bytes;
    if (!sh.pair && has1) pf_l2(w0, 2 * rb);
    else {
        pf_l2(w0, rb);
        if (has1) pf_l2(w1, sh.pair ? op->part[1].w.row_bytes : rb);
    }
}

/* The first item of row team `team` (of tpb a block) in block blk of nblk: block-major (the
 * team's block's teams in a row), or with p.team_spread warp-major, so that the items of a short
 * stage or of a last partial round land one team a block across every block; team g takes items
 * g, g + nblk·tpb, ... either way. An item is computed whole by its team, so the outputs are the
 * same bits whichever team computes it. */
DEV int team_first(const g4c_params &p, int blk, int nblk, int tpb, int team) {
    return p.team_spread ? team * nblk + blk : blk * tpb + team;
}

/* The first p.pf_items items of every row team of the matmul stage op (this block's teams) into
 * L2: they stream in while the current stage and the barrier run. */
DEV void mm_prefetch_first(const g4c_op *op, const g4c_params &p, int only_warp) {
    if (p.pf_items <= 0 || op->kind != G4C_OP_MATMUL) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, S = op->split;
    if (op->mma_ks) return; /* tensor-core stages: no L2 lookahead */
    if (lane || warp % S || (only_warp >= 0 && warp != only_warp)) return;
    const mm_shape sh = mm_shape_of(op, p);
    const int tpb = G4C_WARPS / S, tg = team_first(p, blockIdx.x, gridDim.x, tpb, warp / S), nteams = gridDim.x * tpb;
    for (int k = 0, it = tg; k < p.pf_items && it < sh.total; k++, it += nteams) mm_prefetch_item(op, sh, it);
}

/* The epilogue of one output (row r, token tm) of a non-pair matmul part: softcap or the PLE gate,
 * then y (and the drafter's history copy y2); returns the stored value (argmax candidates). Both
 * matmul procedures (mm_tile, mm_tile_mma) store through it. */
DEV float mm_store(const g4c_op *op, const g4c_part *P0, int step, size_t tm, int r, float v) {
    if (op->epi == G4C_EPI_SOFTCAP) v = op->cap * tanhf(v / op->cap);
    else if (op->epi == G4C_EPI_PLE_GATE) v = gelu_tanh(v) * lda(op->ple + tm * op->ple_ld + r);
    P0->y[(size_t)step * P0->y_step + tm * P0->ldy + r] = v;
    if (P0->y2) P0->y2[(size_t)step * P0->y2_step + tm * P0->ldy + r] = v;
    return v;
}

/* the stage's argmax kind (the last part that tracks one; 0: none) */
DEV int mm_amax(const g4c_op *op, const mm_shape &sh) {
    int amax = 0;
    for (int i = 0; i < sh.nparts; i++)
        if (op->part[i].argmax) amax = op->part[i].argmax;
    return amax;
}
/* a warp's argmax candidates per token, before any row */
DEV void amax_reset(float (&bv)[G4C_MT], int (&bi)[G4C_MT]) {
#pragma unroll
    for (int m = 0; m < G4C_MT; m++) {
        bv[m] = -INFINITY;
        bi[m] = INT_MAX;
    }
}

/* One item's outputs (rows r0, r0 + 1 of part P0, or a gate/up pair's row r0) from the warps'
 * sums acc: a team of S > 1 warps adds its warp sums in warp order (team-partials buffer parity,
 * toggled), then the team's lead lane runs the epilogue and tracks the argmax candidates. */
template <int MTT, bool TWO = false>
DEV void mm_item_out(const g4c_op *op, const g4c_part *P0, const tail_t &tl, int step, int t0, int mt, int r0, int has1,
                     int pair, int S, int &parity, float (&acc)[2][G4C_MT], float (&bv)[G4C_MT], int (&bi)[G4C_MT]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, team = warp / S;
    const bool lead = warp % S == 0;
    if (S > 1) { /* the team's warp sums, added in warp order by warp 0 */
        float *tp = tl.tp + (size_t)parity * G4C_WARPS * 2 * G4C_MT;
        parity ^= 1;
        if (lane == 0)
#pragma unroll
            for (int m = 0; m < MTT; m++) {
                tp[(warp * 2 + 0) * G4C_MT + m] = acc[0][m];
                tp[(warp * 2 + 1) * G4C_MT + m] = acc[1][m];
            }
        asm volatile("bar.sync %0, %1;" ::"r"(1 + team), "r"(32 * S) : "memory");
        if (lead && lane == 0)
#pragma unroll
            for (int m = 0; m < MTT; m++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    float v = tp[(warp * 2 + rr) * G4C_MT + m];
                    for (int q = 1; q < S; q++) v = v + tp[((warp + q) * 2 + rr) * G4C_MT + m];
                    acc[rr][m] = v;
                }
        if constexpr (TWO)
#pragma unroll
            for (int m = 0; m < MTT; m++) { /* lane 1 too (below) */
                acc[0][m] = __shfl_sync(0xffffffffu, acc[0][m], 0);
                acc[1][m] = __shfl_sync(0xffffffffu, acc[1][m], 0);
            }
    }
    /* The epilogue. TWO (every matmul of the kernels with 4- or 8-bit rows: mm_tile_pipe, mm_tile,
     * mm_ring): lane rr of the lead warp stores row r0 + rr and tracks its argmax candidates, and
     * block_argmax_store<true> takes the better of lanes 0 and 1 (the order on (value, row) is
     * total, so which lane saw a row does not matter); a gate/up pair's one output: lane 0.
     * Otherwise (the dense-only kernels) lane 0 both rows. ncu, E2B qat-int4's LM head: ~640 warp
     * instructions a row pair, two rows' softcap on one lane ~110 of them. Measured on an H100
     * (README, session 40): two lanes everywhere made the one-token ring kernel's spill loads grow
     * 1,308 -> 2,360 bytes (ptxas -v) and E4B bf16 decode 3.5% slower; two lanes in mm_tile_pipe
     * alone changed the 4-bit kernels' register allocation so that E2B qat-int4 gained nothing
     * (414.1 against 427.6 tok/s with two lanes in all their matmuls). */
    if constexpr (TWO) {
        if (lead && lane < 2) {
            float *y = P0->y + (size_t)step * P0->y_step;
            const int ldy = P0->ldy, track = P0->argmax, rr = lane;
#pragma unroll
            for (int m = 0; m < MTT; m++) {
                const size_t tm = (size_t)(t0 + m);
                if (m < mt && pair && rr == 0) y[tm * ldy + r0] = gelu_tanh(acc[0][m]) * acc[1][m];
                if (m < mt && !pair && (rr == 0 || has1)) {
                    const int r = r0 + rr;
                    const float v = mm_store(op, P0, step, tm, r, rr ? acc[1][m] : acc[0][m]);
                    if (track && better(v, r, bv[m], bi[m])) {
                        bv[m] = v;
                        bi[m] = r;
                    }
                }
            }
        }
    } else if (lead && lane == 0) {
        float *y = P0->y + (size_t)step * P0->y_step;
        const int ldy = P0->ldy, track = P0->argmax;
#pragma unroll
        for (int m = 0; m < MTT; m++) {
            const size_t tm = (size_t)(t0 + m);
            if (m < mt && pair) y[tm * ldy + r0] = gelu_tanh(acc[0][m]) * acc[1][m];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                if (m < mt && !pair && (rr == 0 || has1)) {
                    const int r = r0 + rr;
                    const float v = mm_store(op, P0, step, tm, r, acc[rr][m]);
                    if (track && better(v, r, bv[m], bi[m])) {
                        bv[m] = v;
                        bi[m] = r;
                    }
                }
            }
        }
    }
}

/* mm_tile's items with the loads one group ahead (p.mm_pipe: one-token tiles of 4- and 8-bit rows
 * outside the lean kernel): a team's items are one sequence of load groups (dot2's, each item's in order), and
 * each group's loads go out before the group before it is computed, the next item's first group
 * before the current item's last. dot2 waits for an item's loads before it computes and only then
 * asks for the next item's: with 4-bit rows as wide as E2B's (1536 columns: one or two chunks a
 * lane), each item was one memory round trip with a few hundred bytes a warp in flight. Every
 * accumulator sees dot2's operations in dot2's order, so the outputs are bitwise dot2's. */
struct pipe_none {
    __device__ __forceinline__ void operator()() const {}
};
template <int T, int MTT, int U, bool EARLY = false, class PRE = pipe_none>
DEVT void mm_tile_pipe(const g4c_op *op, const g4c_params &p, int step, float *sm, int t0, int mt, int amax, int blk, int nblk,
                       PRE pre = PRE()) {
    constexpr int E = G4C_CHUNK_ELEMS(T);
    constexpr bool Q = T == G4C_Q8 || T == G4C_Q4;
    const tail_t tl = tail_of(sm, p);
    const mm_shape sh = mm_shape_of(op, p);
    const int pair = sh.pair, total = sh.total, S = op->split;
    const int K = op->part[0].w.cols, ldk = G4C_TILE_LD(K), nch = K / E, cstep = 32 * S;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tpb = G4C_WARPS / S, team = warp / S, cb = 32 * (warp % S) + lane;
    const int tg = team_first(p, blk, nblk, tpb, team), nteams = nblk * tpb;
    /* groups per item, the same for every lane of the warp (a lane past its last chunk loads and
     * adds nothing, as in dot2) */
    const int gw = 32 * (warp % S), ng = gw < nch ? (nch - gw + cstep * U - 1) / (cstep * U) : 1;
    const unsigned long long pol = l2_policy(p.evict_first);
    const int gsh = Q ? q_group_shift(op, sh.nparts) : 0;
    int parity = 0;
    float bv[G4C_MT];
    int bi[G4C_MT];
    amax_reset(bv, bi);
    float a0[MTT], a1[MTT], p0[MTT][G4C_BACC], p1[MTT][G4C_BACC];
    dot_zero<MTT>(p0, p1, a0, a1);
    dot_grp<U> ga = {}, gb = {};
    int it = tg, g = 0, r0 = 0, has1 = 0, pi = 0;
    const char *w0 = NULL, *w1 = NULL;
    auto flags = [&](int part, bool &sgn, bool &bias) {
        const g4c_mat &wm = op->part[part].w;
        sgn = Q && (wm.flags & G4C_QF_SIGNED);
        bias = Q && (wm.flags & G4C_QF_BIAS);
    };
    if (it < total) {
        bool sgn, bias;
        pi = mm_item(op, sh, it, &r0, &has1, &w0, &w1);
        flags(pi, sgn, bias);
        dot_load<T, U, Q>(ga, w0, w1, op->part[pi].w, cb, nch, cstep, sgn, bias, pol, gsh);
    }
    /* p.pf_self = D > 0: the team's lead lane asks L2 for its items D ahead (bulk prefetches, no
     * registers), the first D now - weights depend on no stage - and one more at each new item */
    const int pfd = p.pf_self;
    const bool pfl = pfd > 0 && lane == 0 && warp % S == 0;
    if (pfl)
        for (int k = 1; k <= pfd && tg + k * nteams < total; k++) mm_prefetch_item(op, sh, tg + k * nteams);
    if constexpr (EARLY) { /* mm_stage_early: the first group is in flight; now the stage before, then the tile */
        static_assert(MTT == 1 && Q, "early loads: one-token quantised tiles");
        stage_wait(p, op);
        if (!load_input(&op->in, K, t0, 1, step, sm, tl.red, p, blk == 0, T)) qi_tile<T>(sm, ldk, K, 1);
        if (p.strace) st_mark(p, op, 2, global_ns());
    }
    pre(); /* mm_stage_early_v: with the first group in flight, the wait for the stage before and the tile */
#pragma unroll 1
    while (it < total) {
        int nit = it, ngi = g + 1, nr0 = r0, nhas1 = has1, npi = pi;
        const char *nw0 = w0, *nw1 = w1;
        if (ngi == ng) {
            nit = it + nteams;
            ngi = 0;
            if (nit < total) npi = mm_item(op, sh, nit, &nr0, &nhas1, &nw0, &nw1);
            if (pfl && nit + pfd * nteams < total) mm_prefetch_item(op, sh, nit + pfd * nteams);
        }
        bool sgn, bias;
        if (nit < total) {
            flags(npi, sgn, bias);
            dot_load<T, U, Q>(gb, nw0, nw1, op->part[npi].w, cb + ngi * cstep * U, nch, cstep, sgn, bias, pol, gsh);
        }
        flags(pi, sgn, bias);
        dot_group<T, MTT, U, Q>(ga, cb + g * cstep * U, nch, cstep, sm, ldk, mt, sgn, bias, p0, p1, a0, a1);
        if (g + 1 == ng) {
            float acc[2][G4C_MT];
            dot_finish<T, MTT>(p0, p1, a0, a1, acc);
            mm_item_out<MTT, true>(op, &op->part[pi], tl, step, t0, mt, r0, has1, pair, S, parity, acc, bv, bi);
            dot_zero<MTT>(p0, p1, a0, a1);
        }
        ga = gb;
        it = nit;
        g = ngi;
        r0 = nr0;
        has1 = nhas1;
        pi = npi;
        w0 = nw0;
        w1 = nw1;
    }
    if (amax) block_argmax_store<true>(p, tl, bv, bi, t0, mt);
}

/* One input tile of a matmul stage: every row team's items, the team sums, the epilogue and this
 * block's argmax partials. One out-of-line instance per (weight type, token count), so each keeps
 * its accumulators in registers; the token count only decides how many accumulators exist, each
 * sees the same operations. The row teams are those of blocks blk of nblk sharing this tile (every
 * block, or the tile's group in the wide kernels: op_matmul). */
template <int T, int MTT, int U8, bool TWO = false>
DEVT void mm_tile(const g4c_op *op, const g4c_params &p, int step, float *sm, int t0, int mt, int amax, int blk, int nblk) {
    const tail_t tl = tail_of(sm, p);
    const mm_shape sh = mm_shape_of(op, p);
    const int pair = sh.pair, total = sh.total, S = op->split;
    const int K = op->part[0].w.cols, ldk = G4C_TILE_LD(K);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tpb = G4C_WARPS / S, team = warp / S, j = warp % S;
    const int tg = team_first(p, blk, nblk, tpb, team), nteams = nblk * tpb;
    const bool lead = j == 0, pf_self = p.pf_self != 0;
    if constexpr (MTT == 1 && U8 != 2 && (T == G4C_Q4 || T == G4C_Q8)) {
        /* p.mm_pipe: every such tile of the session, never some (session.cu: on by default, with
         * the staged decode's early first group). Measured on an H100: choosing per stage by the row's
         * width made E2B qat-int4 slower than either choice alone (341.9 tok/s against 359.0 all
         * dot2, 370.1 all pipelined): stages alternating between two code paths pay for fetching
         * both into the instruction cache, which ncu shows as the small stages' main stall */
        if (p.mm_pipe) { /* two groups of half dot2's unroll in flight: dot2's registers */
            mm_tile_pipe<T, MTT, dot_u<T, MTT, U8>::U / 2>(op, p, step, sm, t0, mt, amax, blk, nblk);
            return;
        }
    }
    const unsigned long long pol = l2_policy(p.evict_first);
    int parity = 0;
    float bv[G4C_MT];
    int bi[G4C_MT];
    amax_reset(bv, bi);
#pragma unroll 1
    for (int it = tg; it < total; it += nteams) {
        int r0, has1;
        const char *w0, *w1;
        const int pi = mm_item(op, sh, it, &r0, &has1, &w0, &w1);
        if (pf_self && lead && lane == 0 && it + nteams < total) mm_prefetch_item(op, sh, it + nteams);
        const g4c_part *P0 = &op->part[pi];
        float acc[2][G4C_MT];
        dot2<T, MTT, U8, T == G4C_Q8 || T == G4C_Q4>(w0, w1, P0->w, K, sm, ldk, mt, j, S, acc, pol); /* qi_tile's tile */
        mm_item_out<MTT, TWO>(op, P0, tl, step, t0, mt, r0, has1, pair, S, parity, acc, bv, bi);
    }
    if (amax) block_argmax_store<TWO>(p, tl, bv, bi, t0, mt);
}

/* the stage's tile in integer form where its rows are quantised (qi_tile) */
template <unsigned TM> DEV void qi_tile_t(int type, float *sm, int ldk, int K, int mt) {
    if constexpr ((TM & (1u << G4C_Q8)) != 0)
        if (type == G4C_Q8) qi_tile<G4C_Q8>(sm, ldk, K, mt);
    if constexpr ((TM & (1u << G4C_Q4)) != 0)
        if (type == G4C_Q4) qi_tile<G4C_Q4>(sm, ldk, K, mt);
}

/* a matmul stage's input tile of mt rows from token t0 (in integer form for qt, the stage's 4- or
 * 8-bit type; 0: floats); writer: block 0, which also stores what the rest of the program reads.
 * op_matmul keeps its own copy of this loop: calling this from it changed the one-token stage
 * kernels' code, and that build measured 6-9% slower one-token decode on an H100 (E2B qat-int4
 * 413.3 -> 390.5 tok/s, E4B 282.0 -> 256.9, same machine) */
template <unsigned TM>
DEV void mm_input(const g4c_op *op, const g4c_params &p, int step, float *sm, int t0, int mt, bool writer, int qt) {
    const tail_t tl = tail_of(sm, p);
    const int K = op->part[0].w.cols, ldk = G4C_TILE_LD(K);
    for (int m0 = 0; m0 < mt; m0 += G4C_MT) { /* load_rows' reductions hold G4C_MT rows */
        const int sub = min(G4C_MT, mt - m0);
        float *base = sm + (size_t)m0 * ldk;
        if ((TM & G4C_KM_M1) == 0 && sub > 1 && op->in.kind != G4C_IN_CONCAT &&
            (size_t)m0 * ldk + load_rows_floats(op->in, K, sub) <= (size_t)p.smem_in_floats) {
            if (!load_rows<TM>(op->in, K, t0 + m0, sub, step, base, (double *)tl.tp, p, writer, qt) && qt)
                qi_tile_t<TM>(qt, base, ldk, K, sub);
        } else if (!load_input(&op->in, K, t0 + m0, sub, step, base, tl.red, p, writer, qt) && qt) {
            qi_tile_t<TM>(qt, base, ldk, K, sub);
        }
    }
}

template <unsigned TM, int MTT>
DEV void mm_tile_t(int type, const g4c_op *op, const g4c_params &p, int step, float *sm, int t0, int mt, int amax, int blk,
                   int nblk) {
    /* chunks per row loaded ahead in 5..8-token tiles (4-bit rows: half): 8 in the wide kernels and
     * the dense-only ones, 4 where quantised code shares the register allocation. Measured on the
     * H200 (same run, 4 -> 8 everywhere): prefill E2B bf16 1547 -> 1615 tok/s, qat-int4 990 -> 1117,
     * E4B qat-int4 553 -> 650; verify k = 6 E2B bf16 3.20x -> 3.01x; but qat-int4 decode 281 -> 268
     * (E2B) and 192 -> 182 (E4B), so the quantised decode kernels keep 4. */
    constexpr int U8 = (TM & G4C_KM_LEAN) ? 2 : (TM & G4C_KM_WIDE) || !(TM & (G4C_KM_Q4 | G4C_KM_Q8)) ? 8 : 4;
    constexpr bool KQ = (TM & (G4C_KM_Q4 | G4C_KM_Q8)) != 0; /* mm_item_out's two-lane epilogue */
    switch (type) { /* types outside the instantiation's mask have no code here (session.cu kernel_mask) */
    case G4C_BF16: if constexpr ((TM & (1u << G4C_BF16)) != 0) mm_tile<G4C_BF16, MTT, U8, KQ>(op, p, step, sm, t0, mt, amax, blk, nblk); break;
    case G4C_F16: if constexpr ((TM & (1u << G4C_F16)) != 0) mm_tile<G4C_F16, MTT, U8, KQ>(op, p, step, sm, t0, mt, amax, blk, nblk); break;
    case G4C_Q8: if constexpr ((TM & (1u << G4C_Q8)) != 0) mm_tile<G4C_Q8, MTT, U8, KQ>(op, p, step, sm, t0, mt, amax, blk, nblk); break;
    case G4C_Q4: if constexpr ((TM & (1u << G4C_Q4)) != 0) mm_tile<G4C_Q4, MTT, U8, KQ>(op, p, step, sm, t0, mt, amax, blk, nblk); break;
    default: if constexpr ((TM & (1u << G4C_F32)) != 0) mm_tile<G4C_F32, MTT, U8, KQ>(op, p, step, sm, t0, mt, amax, blk, nblk); break;
    }
}

/* ---- 4-bit rows on the integer tensor cores ------------------------------------------------------ */

/* Another reduction procedure for 4-bit rows with one scale per row and no bias (QAT int4, per
 * channel; the CUDA-core dot2 being the other): chosen per stage (iq_stage), so every M runs the
 * same one. Each token's input row x is written once per stage as an exact integer vector with one
 * power-of-two scale: X = rn(x · 2^(29−E)), E = ilogb(max |x|), so |X| ≤ 2^30 and each element is
 * within 2^(E−30) of x (2^-30 of the row's largest element; three digits, 2^-22, measured up to
 * 2.7e-3 on the fixtures' logits against 2e-3 allowed); X = d0 + 2^8·d1 + 2^16·d2 + 2^24·d3 in
 * balanced signed bytes (iq_digits). The codes are read as signed bytes 16·(u − 8) (u the stored
 * nibble; one shift and one lop3 per 8 codes), and mma.m16n8k32.s8.s8.s32 computes Σ 16·q·d_j
 * for 16 rows and 8 columns at once, the columns being the four digit planes of two tokens: exact
 * integer sums over a warp's whole K range. Per column, acc = s·float(sum); per token and row,
 * y = 2^(E−33)·((acc_3·256 + acc_2)·65536 + (acc_1·256 + acc_0)). A token's digits meet only its
 * own columns of the product, so its outputs are the same for any M and any place in the tile.
 *
 * Opt-in (G4_CUDA_IMMA=1; the session then launches the instantiations with G4C_KM_IQ, so the
 * default ones keep their register allocation). Measured on the H200, 2026-12-01 (ctx 128, dot2 ->
 * this): E2B qat-int4 exact prefill 1160 -> 2559 tok/s, verify k = 1 / 3 / 6 1.93 / 2.70 / 4.66x ->
 * 1.44 / 2.04 / 2.93x of a step, but a decode step 288 -> 238 tok/s (E4B: 623 -> 1517, 199 -> 159).
 * The stage's work is no shorter than dot2's (E2B gate/up 19.9 µs for 9.6 MB), the digit planes add
 * 1–2 µs per stage to the input tile, and an L2 prefetch of each team's items changed nothing.
 * Tried: three digits (2^-22 of the row maximum) failed the 2e-3 check on dense-mini qat-int2 at
 * 2.7e-3; rows with a scale per 32 or 64 columns (Q4_0, MLX) need a float step per group and ran
 * slower still (mlx-4 decode 196 -> 128), so only per-channel rows take this procedure.
 *
 * Layout: an item is 16 rows of one part (gate/up pairs: 8 gate rows, then the same 8 up rows), and
 * a team of S warps (a function of K alone) splits its K/32 k-steps in S contiguous ranges; lane
 * 4g+t reads word t (8 codes) of each 16-byte chunk of rows g and g+8, and its digits' B fragment
 * for k-step c from the plane at c·128 + (j·4 + t)·8 bytes (digit j = g mod 4 of token g / 4). */
enum { IQ_SCRATCH = 2 * G4C_WARPS * 16 * G4C_MT + G4C_WARPS * G4C_MT + G4C_MT }; /* floats after the digits */

typedef struct {
    signed char *dg; /* [mt_cap][K/32][4][4][8] digit planes */
    float *part;     /* [2][WARPS][16][MT] team partials (double-buffered) */
    float *wmax;     /* [WARPS][MT] */
    int *ex;         /* [MT] E per token */
} iq_smem;

DEV int iq_cap(const g4c_params &p, int K) { return (p.smem_in_floats - IQ_SCRATCH) / (G4C_TILE_LD(K) + K); }

DEV bool iq_stage(const g4c_op *op, const g4c_params &p) {
    if (!p.imma || op->mma_ks || op->nparts < 1) return false;
    for (int i = 0; i < op->nparts; i++) {
        const g4c_mat &w = op->part[i].w;
        if (w.type != G4C_Q4 || (w.flags & G4C_QF_BIAS) || w.group != w.cols || w.cols != op->part[0].w.cols) return false;
    }
    return iq_cap(p, op->part[0].w.cols) >= 1;
}

DEV iq_smem iq_smem_of(float *sm, int ldk, int K, int mt_cap) {
    iq_smem s;
    s.dg = (signed char *)(sm + (size_t)mt_cap * ldk);
    s.part = (float *)(s.dg + (size_t)mt_cap * 4 * K);
    s.wmax = s.part + 2 * G4C_WARPS * 16 * G4C_MT;
    s.ex = (int *)(s.wmax + G4C_WARPS * G4C_MT);
    return s;
}

/* the digit planes of rows 0..mt-1 of the input tile (every thread; ends with a __syncthreads) */
DEVN void iq_digits(const float *sm, int ldk, int K, int mt, const iq_smem &s) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int m = 0; m < mt; m++) {
        float mx = 0.0f;
#pragma unroll 1
        for (int i = tid; i < K; i += G4C_THREADS) mx = fmaxf(mx, fabsf(sm[(size_t)m * ldk + px(i)]));
        mx = warp_max_f(mx);
        if (lane == 0) s.wmax[warp * G4C_MT + m] = mx;
    }
    __syncthreads();
    if (tid < mt) { /* a maximum: the same whatever the order */
        float mx = 0.0f;
        for (int w = 0; w < G4C_WARPS; w++) mx = fmaxf(mx, s.wmax[w * G4C_MT + tid]);
        s.ex[tid] = mx > 0.0f && mx <= 3.4028234e38f ? ilogbf(mx) : 0;
    }
    __syncthreads();
    const int nq = K / 8; /* (chunk, word) pairs per token */
#pragma unroll 1
    for (int idx = tid; idx < mt * nq; idx += G4C_THREADS) {
        const int m = idx / nq, r = idx - m * nq, c = r >> 2, t = r & 3;
        const float *x = sm + (size_t)m * ldk + px(32 * c + 8 * t);
        const float4 xa = *reinterpret_cast<const float4 *>(x), xb = *reinterpret_cast<const float4 *>(x + 4);
        const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        /* x · 2^(29−E) as two exact power-of-two products (each factor a normal float) */
        const int sh = 29 - s.ex[m], h1 = sh >> 1;
        const float f1 = __int_as_float((h1 + 127) << 23), f2 = __int_as_float((sh - h1 + 127) << 23);
        unsigned d[4][2] = {{0u, 0u}, {0u, 0u}, {0u, 0u}, {0u, 0u}};
#pragma unroll
        for (int e = 0; e < 8; e++) { /* even elements: the codes' low nibbles (b0), odd: high (b1) */
            int X = __float2int_rn((xv[e] * f1) * f2);
            const int h = e & 1, b = 8 * (e >> 1);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int dj = j < 3 ? (int)(signed char)(X & 0xff) : X; /* the last: |d3| <= 64 */
                d[j][h] |= (unsigned)(dj & 0xff) << b;
                X = (X - dj) >> 8;
            }
        }
        uint2 *dst = reinterpret_cast<uint2 *>(s.dg + (size_t)m * 4 * K + (size_t)c * 128) + t;
#pragma unroll
        for (int j = 0; j < 4; j++) dst[4 * j] = make_uint2(d[j][0], d[j][1]);
    }
    __syncthreads();
}

DEV void mma_s8(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* one 4-byte word of a weight row (L1 keeps the sector's other half for the next k-step) */
DEV unsigned ld_w4(const void *p, unsigned long long pol) {
    unsigned r;
    asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(r) : "l"(p), "l"(pol));
    return r;
}

/* a stage's item geometry: items per part, the team size and this warp's place */
typedef struct {
    int items[G4C_MAXPART], total, S, team, j, tg, nteams, ks_beg, ks_end;
} iq_geom;

DEV iq_geom iq_geom_of(const g4c_op *op, const g4c_params &p, int blk, int nblk) {
    iq_geom q;
    const int nparts = (op->lm && !p.want_logits) ? 0 : op->nparts, pair = op->epi == G4C_EPI_GELU_PAIR;
    q.total = 0;
#pragma unroll
    for (int i = 0; i < G4C_MAXPART; i++) {
        q.items[i] = i < nparts && (!pair || i == 0) ? (op->part[i].w.rows + (pair ? 7 : 15)) / (pair ? 8 : 16) : 0;
        q.total += q.items[i];
    }
    const int nks = op->part[0].w.cols / 32, warp = threadIdx.x >> 5;
    q.S = 1;
    while (q.S < G4C_WARPS && nks / (2 * q.S) >= 16) q.S *= 2;
    const int tpb = G4C_WARPS / q.S;
    q.team = warp / q.S;
    q.j = warp % q.S;
    q.tg = q.team * nblk + blk; /* consecutive items on different blocks */
    q.nteams = nblk * tpb;
    q.ks_beg = q.j * nks / q.S;
    q.ks_end = (q.j + 1) * nks / q.S;
    return q;
}

/* item it -> part (returned) and its index within the part */
DEV int iq_item(const iq_geom &q, int it, int *li) {
    int pi = 0;
    *li = it;
#pragma unroll
    for (int k = 0; k + 1 < G4C_MAXPART; k++)
        if (pi == k && *li >= q.items[k]) {
            *li -= q.items[k];
            pi = k + 1;
        }
    return pi;
}
/* The products of one input tile (tokens t0 .. t0+mt-1, digits built) for a stage iq_stage took. */
template <int MTT>
DEVT void mm_tile_iq(const g4c_op *op, const g4c_params &p, int step, float *sm, int t0, int mt, int amax, int blk, int nblk,
                     const iq_smem &s) {
    /* column groups; k-steps per batch (loads in flight: 2·U words per lane); accumulator chains */
    constexpr int CG = (MTT + 1) / 2, U = MTT > 4 ? 12 : 24, NA = CG == 1 ? 2 : 1;
    const tail_t tl = tail_of(sm, p);
    const iq_geom q = iq_geom_of(op, p, blk, nblk);
    const bool pair = op->epi == G4C_EPI_GELU_PAIR;
    const int K = op->part[0].w.cols, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool own = (t & 1) == 0; /* t = 0: token 2·cg of each column group, t = 2: token 2·cg + 1 */
    const int mo = t >> 1;
    const unsigned long long pol = l2_policy(p.evict_first);
    const signed char *bp[CG];
    bool bok[CG];
#pragma unroll
    for (int c = 0; c < CG; c++) {
        const int m = 2 * c + (g >> 2);
        bok[c] = m < mt;
        bp[c] = s.dg + (size_t)(bok[c] ? m : 0) * 4 * K + ((g & 3) * 4 + t) * 8;
    }
    float bv[CG];
    int bi[CG];
#pragma unroll
    for (int c = 0; c < CG; c++) {
        bv[c] = -INFINITY;
        bi[c] = INT_MAX;
    }
    int parity = 0;
#pragma unroll 1
    for (int it = q.tg; it < q.total; it += q.nteams) {
        int li;
        const int pi = iq_item(q, it, &li);
        const g4c_part *P0 = &op->part[pi];
        const g4c_mat &wa = P0->w, &wb = pair ? op->part[1].w : P0->w;
        const int ra = pair ? 8 * li + g : 16 * li + g, rb = pair ? ra : ra + 8;
        const bool va = ra < wa.rows, vb = rb < wb.rows;
        const char *pa = (const char *)wa.data + (size_t)(va ? ra : wa.rows - 1) * wa.row_bytes;
        const char *pb = (const char *)wb.data + (size_t)(vb ? rb : wb.rows - 1) * wb.row_bytes;
        /* the rows' scales first (read at the end), then every code of a batch, then the products
         * (integer sums are associative: NA independent accumulator chains, added exactly) */
        const float sa = q_param(pa, wa.sc_off, wa.stype, 0), sb = q_param(pb, wb.sc_off, wb.stype, 0);
        int c[NA][CG][4];
#pragma unroll
        for (int n = 0; n < NA; n++)
#pragma unroll
            for (int cg = 0; cg < CG; cg++)
#pragma unroll
                for (int i = 0; i < 4; i++) c[n][cg][i] = 0;
#pragma unroll 1
        for (int ks = q.ks_beg; ks < q.ks_end; ks += U) {
            unsigned xa[U], xb[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = ks + u;
                xa[u] = k < q.ks_end ? ld_w4(pa + (size_t)k * 16 + 4 * t, pol) : 0u;
                xb[u] = k < q.ks_end ? ld_w4(pb + (size_t)k * 16 + 4 * t, pol) : 0u;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = ks + u;
                if (k >= q.ks_end) break;
                /* bytes 16·(u − 8): a0/a1 the even codes (low nibbles) of rows g / g+8, a2/a3 the odd */
                const unsigned a0 = ((xa[u] << 4) & 0xF0F0F0F0u) ^ 0x80808080u, a2 = (xa[u] & 0xF0F0F0F0u) ^ 0x80808080u;
                const unsigned a1 = ((xb[u] << 4) & 0xF0F0F0F0u) ^ 0x80808080u, a3 = (xb[u] & 0xF0F0F0F0u) ^ 0x80808080u;
#pragma unroll
                for (int cg = 0; cg < CG; cg++) {
                    const uint2 b = bok[cg] ? *reinterpret_cast<const uint2 *>(bp[cg] + (size_t)k * 128) : make_uint2(0u, 0u);
                    mma_s8(c[u % NA][cg], a0, a1, a2, a3, b.x, b.y);
                }
            }
        }
        float acc[CG][4];
#pragma unroll
        for (int cg = 0; cg < CG; cg++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int v = c[0][cg][i];
#pragma unroll
                for (int n = 1; n < NA; n++) v += c[n][cg][i];
                acc[cg][i] = (i < 2 ? sa : sb) * (float)v;
            }
        /* digits -> values: token 2·cg (columns 0..3) at t = 0, token 2·cg + 1 (4..7) at t = 2; each
         * lane first joins its two columns, d1·256 + d0 (t even) or d3·256 + d2 (t odd) */
        float y[CG][2];
#pragma unroll
        for (int cg = 0; cg < CG; cg++) {
            const float la = acc[cg][1] * 256.0f + acc[cg][0], lb = acc[cg][3] * 256.0f + acc[cg][2];
            const float ha = __shfl_down_sync(0xffffffffu, la, 1), hb = __shfl_down_sync(0xffffffffu, lb, 1);
            /* this warp's part of the output (own lanes) */
            const int m = 2 * cg + mo, e = m < mt ? s.ex[m] - 33 : 0;
            y[cg][0] = scalbnf(ha * 65536.0f + la, e);
            y[cg][1] = scalbnf(hb * 65536.0f + lb, e);
        }
        if (q.S > 1) { /* the team's partials, added in warp order by its first warp */
            float *tp = s.part + (size_t)parity * G4C_WARPS * 16 * G4C_MT;
            parity ^= 1;
            if (own)
#pragma unroll
                for (int cg = 0; cg < CG; cg++) {
                    const int m = 2 * cg + mo;
                    if (m < MTT) {
                        tp[(warp * 16 + g) * G4C_MT + m] = y[cg][0];
                        tp[(warp * 16 + g + 8) * G4C_MT + m] = y[cg][1];
                    }
                }
            asm volatile("bar.sync %0, %1;" ::"r"(1 + q.team), "r"(32 * q.S) : "memory");
            if (q.j == 0 && own)
#pragma unroll
                for (int cg = 0; cg < CG; cg++) {
                    const int m = 2 * cg + mo;
                    if (m < MTT)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            float v = tp[(warp * 16 + g + 8 * h) * G4C_MT + m];
                            for (int w = 1; w < q.S; w++) v = v + tp[((warp + w) * 16 + g + 8 * h) * G4C_MT + m];
                            y[cg][h] = v;
                        }
                }
        }
        if (q.j == 0 && own) {
            float *yp = P0->y + (size_t)step * P0->y_step;
            const int track = P0->argmax;
#pragma unroll
            for (int cg = 0; cg < CG; cg++) {
                const int m = 2 * cg + mo;
                if (m >= MTT || m >= mt) continue;
                const size_t tm = (size_t)(t0 + m);
                const float ya = y[cg][0], yb = y[cg][1];
                if (pair) {
                    if (va) yp[tm * P0->ldy + ra] = gelu_tanh(ya) * yb;
                } else {
                    if (va) {
                        const float v = mm_store(op, P0, step, tm, ra, ya);
                        if (track && better(v, ra, bv[cg], bi[cg])) {
                            bv[cg] = v;
                            bi[cg] = ra;
                        }
                    }
                    if (vb) {
                        const float v = mm_store(op, P0, step, tm, rb, yb);
                        if (track && better(v, rb, bv[cg], bi[cg])) {
                            bv[cg] = v;
                            bi[cg] = rb;
                        }
                    }
                }
            }
        }
    }
    if (amax) { /* per column group: the lanes of one t, then the warp's entry per token */
#pragma unroll
        for (int cg = 0; cg < CG; cg++) {
            for (int o = 4; o < 32; o <<= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv[cg], o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi[cg], o);
                if (better(ov, oi, bv[cg], bi[cg])) {
                    bv[cg] = ov;
                    bi[cg] = oi;
                }
            }
            const int m = 2 * cg + mo;
            if ((lane == 0 || lane == 2) && m < G4C_MT) {
                tl.bv[warp * G4C_MT + m] = bv[cg];
                tl.bi[warp * G4C_MT + m] = bi[cg];
            }
        }
        block_argmax_combine(p, tl, t0, mt);
    }
}

/* ---- tensor-core matmul (bf16 weights) ---------------------------------------------------------- */

/* The other reduction procedure, for stages whose bf16 matrices the session uploaded in the tiled
 * layout (program.h G4C_QF_TILED; op->mma_ks > 0), used for every M. An item is a 16-row tile and
 * one of mma_ks K segments (>= 8 k-steps of 32 columns; a function of the shape), one warp each.
 * Per k-step and 8 tokens, six m16n8k16 products accumulate into the warp's f32 fragment in a fixed
 * order: the two 16-column slots, each against the input split exactly as x = h + m + l (three
 * bf16s: products exact, the split within 2^-26 |x|). Segments' fragments are added in segment
 * order by the tile's last warp to finish. Token n of a group is column n of the product, computed
 * by the same datapath whatever the other columns hold, so a token's outputs do not depend on M or
 * on its place in the tile (gpu_exact checks M = 1, 3, 7, 64 bitwise). */
DEV void mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* (a, b) -> three bf16 pairs, x = h + m + l to within 2^-26 |x| (h = bf16(x), m = bf16(x - h),
 * l = bf16(x - h - m); each difference is exact in f32): a in the low halves. Two terms (~2^-17)
 * measured 8x the f32 path's logit error on the fixtures. */
DEV unsigned bf16x2_rn(float a, float b) {
    unsigned h;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(b), "f"(a));
    return h;
}
DEV void split_bf16(float a, float b, unsigned &hi, unsigned &mid, unsigned &lo) {
    hi = bf16x2_rn(a, b);
    a = a - __uint_as_float(hi << 16);
    b = b - __uint_as_float(hi & 0xffff0000u);
    mid = bf16x2_rn(a, b);
    a = a - __uint_as_float(mid << 16);
    b = b - __uint_as_float(mid & 0xffff0000u);
    lo = bf16x2_rn(a, b);
}

/* UU k-steps from ks0 of one item: every weight load first (2·UU·NP 16-byte loads in flight per
 * lane), then per k-step and token group the input split and six products. Straight-line code:
 * with a guard or a loop the compiler cannot unroll, the loaded fragments go to local memory, each
 * spill store waits for its load, and the loads are no longer in flight together. */
template <int UU, int NG, int NP>
DEV void mma_ksteps(float (&c)[NG][NP][4], const char *const (&wr)[NP], int ks0, const float *sm, int ldk, int mt, int g,
                    int t, unsigned long long pol) {
    uint4 wa[UU][NP], wb[UU][NP];
#pragma unroll
    for (int u = 0; u < UU; u++)
#pragma unroll
        for (int f = 0; f < NP; f++) {
            wa[u][f] = ld_w16(wr[f] + (size_t)(ks0 + u) * 1024, pol);
            wb[u][f] = ld_w16(wr[f] + (size_t)(ks0 + u) * 1024 + 512, pol);
        }
#pragma unroll
    for (int u = 0; u < UU; u++) {
        const int ks = ks0 + u;
#pragma unroll
        for (int q = 0; q < NG; q++) {
            const int m = 8 * q + g;
            float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
            if (m < mt) {
                const float *xp = sm + (size_t)m * ldk + px(32 * ks + 8 * t);
                x0 = *reinterpret_cast<const float4 *>(xp);
                x1 = *reinterpret_cast<const float4 *>(xp + 4);
            }
            unsigned h[4], md[4], l[4];
            split_bf16(x0.x, x0.y, h[0], md[0], l[0]);
            split_bf16(x0.z, x0.w, h[1], md[1], l[1]);
            split_bf16(x1.x, x1.y, h[2], md[2], l[2]);
            split_bf16(x1.z, x1.w, h[3], md[3], l[3]);
#pragma unroll
            for (int f = 0; f < NP; f++) {
                const uint4 A = wa[u][f], B = wb[u][f];
                mma_bf16(c[q][f], A.x, B.x, A.y, B.y, h[0], h[1]);
                mma_bf16(c[q][f], A.x, B.x, A.y, B.y, md[0], md[1]);
                mma_bf16(c[q][f], A.x, B.x, A.y, B.y, l[0], l[1]);
                mma_bf16(c[q][f], A.z, B.z, A.w, B.w, h[2], h[3]);
                mma_bf16(c[q][f], A.z, B.z, A.w, B.w, md[2], md[3]);
                mma_bf16(c[q][f], A.z, B.z, A.w, B.w, l[2], l[3]);
            }
        }
    }
}
enum { MMA_U = 4 }; /* k-steps per batch of loads (8 measured the same on the H200) */

/* One input tile (tokens t0 .. t0+mt-1, mt <= 8·NG, the tile'th of the stage) of a tensor-core
 * stage. Items are (16-row tile, K segment) pairs, one warp each; a segment's fragments go to
 * p.mma_part and the last warp to finish a row tile (a counter per tile and row tile) adds the
 * segments in segment order and runs the epilogue. */
template <int NG, int NP>
DEVT void mm_tile_mma(const g4c_op *op, const g4c_params &p, int step, float *sm, int t0, int mt, int amax, int tile) {
    const mm_shape sh = mm_shape_of(op, p);
    const int pair = NP == 2, KS = op->mma_ks;
    const int K = op->part[0].w.cols, ldk = G4C_TILE_LD(K), nks = K / 32, seg = nks / KS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const unsigned long long pol = l2_policy(p.evict_first);
    int rtiles = 0;
    if (sh.nparts) {
        if (pair) rtiles = (op->part[0].w.rows + 15) / 16;
        else
            for (int i = 0; i < sh.nparts; i++) rtiles += (op->part[i].w.rows + 15) / 16;
    }
    const int total = rtiles * KS;
    float bv[NG][2];
    int bi[NG][2];
#pragma unroll
    for (int q = 0; q < NG; q++)
        for (int c = 0; c < 2; c++) {
            bv[q][c] = -INFINITY;
            bi[q][c] = INT_MAX;
        }
#pragma unroll 1
    for (int it = blockIdx.x + (int)gridDim.x * warp; it < total; it += (int)gridDim.x * G4C_WARPS) {
        const int rt = it / KS, sg = it - rt * KS;
        int pi = 0, li = rt;
        if (!pair)
            while (pi + 1 < sh.nparts && li >= (op->part[pi].w.rows + 15) / 16) li -= (op->part[pi++].w.rows + 15) / 16;
        const g4c_part *P0 = &op->part[pi];
        const int rows = P0->w.rows, r0 = 16 * li;
        const char *wr[NP]; /* the tile's k-step blocks (program.h G4C_QF_TILED): this lane's row g at +0, row g+8 at +512 */
#pragma unroll
        for (int f = 0; f < NP; f++)
            wr[f] = (const char *)op->part[f && pair ? 1 : pi].w.data + (size_t)li * nks * 1024 + 16 * lane;
        float c[NG][NP][4];
#pragma unroll
        for (int q = 0; q < NG; q++)
#pragma unroll
            for (int f = 0; f < NP; f++)
#pragma unroll
                for (int e = 0; e < 4; e++) c[q][f][e] = 0.0f;
        const int ks_beg = sg * seg, ks_end = ks_beg + seg;
        /* the segment's blocks are contiguous per matrix: into L2 ahead of the register loads below */
        constexpr int U = NP == 1 ? MMA_U : (MMA_U / 2 > 0 ? MMA_U / 2 : 1);
        if (lane == 0 && seg > U)
#pragma unroll
            for (int f = 0; f < NP; f++) pf_l2(wr[f] + (size_t)ks_beg * 1024, (long long)seg * 1024);
        int ks0 = ks_beg;
#pragma unroll 1
        for (; ks0 + U <= ks_end; ks0 += U) mma_ksteps<U, NG, NP>(c, wr, ks0, sm, ldk, mt, g, t, pol);
#pragma unroll 1
        for (; ks0 < ks_end; ks0++) mma_ksteps<1, NG, NP>(c, wr, ks0, sm, ldk, mt, g, t, pol);
        if (KS > 1) { /* this segment's fragments out; the row tile's last segment adds them all in order */
            /* segment s's value of fragment element e of part f, token group q: [rt][s][f][token][16 rows] */
            float *pb = p.mma_part + (size_t)rt * KS * 2 * 16 * p.mma_tokens;
            auto slot = [&](int s2, int q, int f, int e) {
                return pb + (((size_t)s2 * 2 + f) * p.mma_tokens + t0 + 8 * q + 2 * t + (e & 1)) * 16 + g + (e >> 1) * 8;
            };
#pragma unroll
            for (int q = 0; q < NG; q++)
#pragma unroll
                for (int f = 0; f < NP; f++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (8 * q + 2 * t + (e & 1) < mt) *slot(sg, q, f, e) = c[q][f][e];
            __threadfence();
            __syncwarp();
            int last = 0;
            if (lane == 0) {
                int *cnt = p.mma_cnt + (size_t)tile * G4C_MMA_MAXITEMS + rt;
                last = atomicAdd(cnt, 1) == KS - 1;
                if (last) *cnt = 0;
            }
            if (!__shfl_sync(0xffffffffu, last, 0)) continue;
            __threadfence();
            /* the segments in order; SC segments' values loaded ahead of their adds */
            constexpr int SC = 32 / (NG * NP * 4) > 0 ? 32 / (NG * NP * 4) : 1;
#pragma unroll 1
            for (int s0 = 0; s0 < KS; s0 += SC) {
                constexpr int V = NG * NP * 4; /* this lane's values per segment, i = (q·NP + f)·4 + e */
                float pv[SC * V];
#pragma unroll
                for (int i = 0; i < SC * V; i++) {
                    const int k = i / V, q = i % V / (NP * 4), f = i % (NP * 4) / 4, e = i % 4;
                    pv[i] = s0 + k < KS && 8 * q + 2 * t + (e & 1) < mt ? lda(slot(s0 + k, q, f, e)) : 0.0f;
                }
#pragma unroll
                for (int i = 0; i < SC * V; i++) {
                    const int k = i / V, q = i % V / (NP * 4), f = i % (NP * 4) / 4, e = i % 4;
                    if (s0 + k < KS) c[q][f][e] = s0 + k == 0 ? pv[i] : c[q][f][e] + pv[i];
                }
            }
        }
        /* epilogue: lane (g, t) holds rows r0+g, r0+g+8 of tokens 8q+2t, 8q+2t+1 */
        float *y = P0->y + (size_t)step * P0->y_step;
        const int ldy = P0->ldy, track = P0->argmax;
#pragma unroll
        for (int q = 0; q < NG; q++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = 2 * t + (e & 1), m = 8 * q + col, r = r0 + g + (e >> 1) * 8;
                if (m >= mt || r >= rows) continue;
                const size_t tm = (size_t)(t0 + m);
                if (pair) {
                    y[tm * ldy + r] = gelu_tanh(c[q][0][e]) * c[q][NP - 1][e];
                    continue;
                }
                const float val = mm_store(op, P0, step, tm, r, c[q][0][e]);
                if (track && better(val, r, bv[q][e & 1], bi[q][e & 1])) {
                    bv[q][e & 1] = val;
                    bi[q][e & 1] = r;
                }
            }
    }
    if (amax) { /* per warp: reduce over g (lane bits 2..4); per block: over warps (a total order: any order) */
        float *sv = sm + p.smem_in_floats - G4C_MMA_SCRATCH;
        int *si = reinterpret_cast<int *>(sv + G4C_WARPS * 32);
#pragma unroll
        for (int q = 0; q < NG; q++)
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                float v = bv[q][cc];
                int i = bi[q][cc];
                for (int o = 4; o < 32; o <<= 1) {
                    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
                    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
                    if (better(ov, oi, v, i)) {
                        v = ov;
                        i = oi;
                    }
                }
                if (g == 0) {
                    sv[warp * 32 + 8 * q + 2 * t + cc] = v;
                    si[warp * 32 + 8 * q + 2 * t + cc] = i;
                }
            }
        __syncthreads();
        if ((int)threadIdx.x < mt) {
            const int m = threadIdx.x;
            float v = -INFINITY;
            int i = INT_MAX;
            for (int w = 0; w < G4C_WARPS; w++)
                if (better(sv[w * 32 + m], si[w * 32 + m], v, i)) {
                    v = sv[w * 32 + m];
                    i = si[w * 32 + m];
                }
            p.amax_part[(size_t)blockIdx.x * G4C_MAXB + t0 + m] = v;
            p.amax_idx[(size_t)blockIdx.x * G4C_MAXB + t0 + m] = i;
        }
    }
    __syncthreads(); /* the argmax scratch may be part of the next tile */
}

/* ---- the prefill procedure: bf16 tensor cores over a prompt's tokens ----------------------------- */

/* Launches of a prompt's tokens (p.fast) run the matmul stages whose weights are bf16 rows (fp_ks >
 * 0) in two phases. First the stage's input rows, built with the other procedure's element
 * operations (residual, norms, the writes the program needs; fp_prep_warp: a warp per token, its
 * own order for the norms' sums - or load_input's, a block per token, where it does not take the
 * stage or G4_CUDA_FPWARP=0), go to p.fp_x as three bf16 terms (x = h + m + l, within 2^-26 |x|:
 * split_bf16); a grid barrier; then the
 * products. A block item is a band of 16-row tiles (two per warp: consecutive tiles of the stage's
 * parts, or a gate/up pair's two), a block of G4C_FP_TB tokens and one of op->fp_ks K segments;
 * the block copies the band's weights and its tokens' activation terms G4C_FP_KS k-steps at a time
 * into shared memory (asynchronous copies, G4C_FP_NBUF chunks in flight), the weights in the
 * layout of m16n8k16 A operands. Per 32 columns, 8 tokens and tile six products accumulate in a
 * fixed order (both 16-column halves against h, m and l). With one segment the block stores the
 * outputs; with more, each segment's fragments go to p.fp_part and, after another grid barrier,
 * every block adds a share of them in segment order and stores those. A token is one column of the
 * products, computed by the same datapath whatever the other columns hold, and the bands and
 * segments are functions of the stage's shape, so a token's outputs do not depend on how many
 * tokens the launch has or where it sits in them: a prompt's logits do not depend on the chunk
 * size. They differ from the decode procedure's by rounding (the order of the sums), within the
 * usual tolerance. */
DEV void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* four inputs of a token row (columns 4c .. 4c+3) -> its three bf16 term rows */
DEV void fp_terms4(const g4c_params &p, size_t ts, int m, int c, const float4 &v) {
    unsigned h0, m0, l0, h1, m1, l1;
    split_bf16(v.x, v.y, h0, m0, l0);
    split_bf16(v.z, v.w, h1, m1, l1);
    uint2 *d = reinterpret_cast<uint2 *>(p.fp_x + (size_t)m * p.fp_ld) + c;
    d[0] = make_uint2(h0, h1);
    d[ts / 4] = make_uint2(m0, m1);
    d[ts / 2] = make_uint2(l0, l1);
}

/* phase 1 with a warp per token (every warp of the grid a token at a time; a launch's tokens are
 * then one round instead of M / grid rounds of a block each): the same element operations as
 * load_input + split_bf16, the sums of squares in double over the lane's columns, then the xor
 * butterfly - a function of the token's row only, so still independent of the launch's tokens.
 * Plain rows go straight to the terms; normed rows (K · warps within the input tile) pass
 * through the warp's own shared row. Returns 0 when the stage is not one it takes. */
DEV int fp_prep_warp(const g4c_op *op, const g4c_params &p, int step, float *sm) {
    const g4c_in &in = op->in;
    const int K = op->part[0].w.cols, K4 = K / 4;
    if (in.kind == G4C_IN_CONCAT || (op->part[0].w.flags & G4C_QF_BIAS) ||
        (in.kind == G4C_IN_NORM && G4C_WARPS * K > p.smem_in_floats))
        return 0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t ts = (size_t)p.fp_tokens * p.fp_ld;
    float4 *v = reinterpret_cast<float4 *>(sm + (size_t)warp * K);
#pragma unroll 1
    for (int m = blockIdx.x * G4C_WARPS + warp; m < p.M; m += gridDim.x * G4C_WARPS) {
        const float4 *x = reinterpret_cast<const float4 *>(in.x + (size_t)m * in.ldx);
        if (in.kind != G4C_IN_NORM) {
#pragma unroll 4
            for (int c = lane; c < K4; c += 32) fp_terms4(p, ts, m, c, lda4(reinterpret_cast<const float *>(x + c)));
            continue;
        }
        const float4 *t = in.t ? reinterpret_cast<const float4 *>(in.t + (size_t)m * K) : NULL;
        float inv_t = 0.0f;
        if (t) {
            double ss = 0;
#pragma unroll 4
            for (int c = lane; c < K4; c += 32) ss += sq4(lda4(reinterpret_cast<const float *>(t + c)));
            inv_t = rms_inv(warp_sum_d(ss), K, p.eps);
        }
        double ss = 0;
#pragma unroll 4
        for (int c = lane; c < K4; c += 32) {
            float4 xv = lda4(reinterpret_cast<const float *>(x + c));
            if (t) {
                const float4 tv = lda4(reinterpret_cast<const float *>(t + c));
                const float4 tw = __ldg(reinterpret_cast<const float4 *>(in.t_w) + c);
                xv.x = xv.x + tv.x * inv_t * tw.x;
                xv.y = xv.y + tv.y * inv_t * tw.y;
                xv.z = xv.z + tv.z * inv_t * tw.z;
                xv.w = xv.w + tv.w * inv_t * tw.w;
            }
            if (in.has_scalar) xv = make_float4(xv.x * in.scalar, xv.y * in.scalar, xv.z * in.scalar, xv.w * in.scalar);
            if (in.x_out) reinterpret_cast<float4 *>(in.x_out + (size_t)m * K)[c] = xv;
            if (in.dbg) reinterpret_cast<float4 *>(in.dbg + (size_t)m * K)[c] = xv;
            ss += sq4(xv);
            v[c] = xv;
        }
        float inv = 1.0f;
        if (in.norm != G4C_NORM_NONE) inv = rms_inv(warp_sum_d(ss), K, p.eps);
        const float f = in.norm == G4C_NORM_ROUTER ? in.norm_scale : 1.0f;
        __syncwarp();
#pragma unroll 4
        for (int c = lane; c < K4; c += 32) {
            float4 xv = v[c];
            if (in.norm != G4C_NORM_NONE) {
                const float4 nw = __ldg(reinterpret_cast<const float4 *>(in.norm_w) + c);
                xv = make_float4(xv.x * inv * f * nw.x, xv.y * inv * f * nw.y, xv.z * inv * f * nw.z, xv.w * inv * f * nw.w);
                if (in.normed_out) reinterpret_cast<float4 *>(in.normed_out + (size_t)m * K + (size_t)step * in.normed_step)[c] = xv;
            }
            fp_terms4(p, ts, m, c, xv);
        }
        __syncwarp(); /* the next token reuses the row */
    }
    __syncthreads();
    return 1;
}

/* phase 1: token m's input row (one per block) -> p.fp_x as bf16 terms (fp_prep_warp where it
 * takes the stage) */
DEVN void fp_prep(const g4c_op *op, const g4c_params &p, int step, float *sm, double *red) {
    if (p.fp_warp && fp_prep_warp(op, p, step, sm)) return;
    const int K = op->part[0].w.cols;
    const size_t ts = (size_t)p.fp_tokens * p.fp_ld;
#pragma unroll 1
    for (int m = blockIdx.x; m < p.M; m += gridDim.x) {
        load_input(&op->in, K, m, 1, step, sm, red, p, true, 0);
        unsigned *h = reinterpret_cast<unsigned *>(p.fp_x + (size_t)m * p.fp_ld);
        unsigned *md = reinterpret_cast<unsigned *>(p.fp_x + ts + (size_t)m * p.fp_ld);
        unsigned *l = reinterpret_cast<unsigned *>(p.fp_x + 2 * ts + (size_t)m * p.fp_ld);
#pragma unroll 1
        for (int i = threadIdx.x; i < K / 2; i += G4C_THREADS) {
            unsigned a, b, c;
            split_bf16(sm[px(2 * i)], sm[px(2 * i + 1)], a, b, c);
            h[i] = a;
            md[i] = b;
            l[i] = c;
        }
        if (op->part[0].w.flags & G4C_QF_BIAS) /* affine codes: the sum of each k-step's 32 inputs */
#pragma unroll 1
            for (int ks = threadIdx.x; ks < K / 32; ks += G4C_THREADS) {
                float sx = 0.0f;
                for (int i = 0; i < 32; i++) sx = sx + sm[px(32 * ks + i)];
                p.fp_sx[(size_t)m * (p.fp_ld / 32) + ks] = sx;
            }
        __syncthreads(); /* the next row reuses sm */
    }
}

/* the 16-row tile ti of a stage (gate/up pairs: of part `half`) -> part index and the tile's first row */
DEV int fp_tile(const g4c_op *op, int nparts, bool pair, int half, int ti, int *r0) {
    int pi = pair ? half : 0, li = ti;
    if (!pair)
        while (pi + 1 < nparts && li >= (op->part[pi].w.rows + 15) / 16) li -= (op->part[pi++].w.rows + 15) / 16;
    *r0 = 16 * li;
    return pi;
}

/* A block item's shared-memory chunk (G4C_FP_KS k-steps): the band's 16 tiles' weight rows, then
 * the tokens' activation terms [term][token], every row G4C_FP_LDS bf16 long (16 bytes of padding:
 * the 8 rows an ldmatrix phase reads fall in distinct banks). Fragments are read with ldmatrix, so
 * they land in the registers of m16n8k16 operands as they are. G4C_FP_NBUF chunks in flight. */
enum {
    FP_WBYTES = 16 * 16 * G4C_FP_LDS * 2,                    /* 16 tiles' weight rows */
    FP_XBYTES = G4C_FP_TERMS * G4C_FP_TB * G4C_FP_LDS * 2,   /* activation terms */
    FP_BUF = FP_WBYTES + FP_XBYTES,
};
DEV void ldsm4(unsigned (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}

/* the band's smem tile T (0..15) -> part, the tile's first row, whether it exists */
DEV int fp_band_tile(const g4c_op *op, int nparts, bool pair, int rtiles, int band, int T, int *r0, bool *ok) {
    const int ti = pair ? band * 8 + (T & 7) : band * 16 + T;
    *ok = ti < rtiles;
    return fp_tile(op, nparts, pair, pair ? T >> 3 : 0, *ok ? ti : 0, r0);
}

/* Per item, the band's 16 tiles as shared-memory table entries (filled by threads 0..15): the
 * tile's first row, its row stride and the last row index that exists (relative) */
typedef struct {
    const char *base[16];
    long long rb[16];
    int last[16];
} fp_tiles_t;

/* chunk ks0 .. ks0+nk-1 (k-steps) of an item into buffer buf: weights of the band's 16 tiles and
 * the tokens' terms, asynchronous copies (the caller commits the group) */
DEV void fp_stage(const g4c_params &p, const fp_tiles_t &tt, char *buf, int t0, int mt, int ks0, int nk) {
    const int tid = threadIdx.x;
    unsigned short *ws = reinterpret_cast<unsigned short *>(buf);
    /* weights: 16 tiles x 16 rows x 4·G4C_FP_KS pieces of 16 bytes (nk < 0: the terms of -nk
     * k-steps only, quantised weights having been staged by fp_stage_q) */
    constexpr int PR = 4 * G4C_FP_KS;
    if (nk > 0) {
#pragma unroll
        for (int j = 0; j < 16 * 16 * PR / G4C_THREADS; j++) {
            const int f = tid + j * G4C_THREADS, T = f / (16 * PR), r = f / PR % 16, c = f % PR;
            if (c >= 4 * nk) continue;
            cp16(ws + ((size_t)T * 16 + r) * G4C_FP_LDS + 8 * c, tt.base[T] + (size_t)min(r, tt.last[T]) * tt.rb[T] + (size_t)(32 * ks0 + 8 * c) * 2);
        }
    } else {
        nk = -nk;
    }
    /* the terms of tokens t0 .. t0+mt-1 */
    unsigned short *xs = reinterpret_cast<unsigned short *>(buf + FP_WBYTES);
    const size_t ts = (size_t)p.fp_tokens * p.fp_ld;
#pragma unroll
    for (int term = 0; term < G4C_FP_TERMS; term++) {
        const unsigned short *src = p.fp_x + term * ts + (size_t)t0 * p.fp_ld + 32 * ks0;
        unsigned short *dst = xs + (size_t)term * G4C_FP_TB * G4C_FP_LDS;
#pragma unroll 1
        for (int f = tid; f < mt * PR; f += G4C_THREADS) {
            const int m = f / PR, c = f % PR;
            if (c < 4 * nk) cp16(dst + (size_t)m * G4C_FP_LDS + 8 * c, src + (size_t)m * p.fp_ld + 8 * c);
        }
    }
}

/* the B fragments (activation terms) of token groups q0..q0+QB-1 for k-step s of a staged chunk:
 * both k-step kinds (bf16 and quantised weights) read them alike */
template <int QB>
DEV void fp_load_b(unsigned (&b)[QB][G4C_FP_TERMS][4], const unsigned short *xs, int q0, int s, int mi, int rr) {
#pragma unroll
    for (int qq = 0; qq < QB; qq++)
#pragma unroll
        for (int term = 0; term < G4C_FP_TERMS; term++)
            ldsm4(b[qq][term], xs + ((size_t)term * G4C_FP_TB + 8 * (q0 + qq) + rr) * G4C_FP_LDS + 32 * s + 8 * mi);
}

/* one k-step (32 columns) of a staged chunk: this warp's tiles Ta, Tb against the token groups, four
 * groups' fragments at a time; per (tile, group) the products in a fixed order: both 16-column
 * halves, each against h, m and l (FULL: all G4C_FP_TB tokens, no guard) */
template <bool FULL>
DEV void fp_kstep(float (&c)[2][G4C_FP_TB / 8][4], const char *buf, int Ta, int Tb, int s, int mt, int lane) {
    const unsigned short *ws = reinterpret_cast<const unsigned short *>(buf);
    const unsigned short *xs = reinterpret_cast<const unsigned short *>(buf + FP_WBYTES);
    const int mi = lane >> 3, rr = lane & 7;
    unsigned a[2][2][4]; /* [tile][half] */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            ldsm4(a[i][hf], ws + ((size_t)(i ? Tb : Ta) * 16 + (mi & 1) * 8 + rr) * G4C_FP_LDS + 32 * s + 16 * hf + (mi >> 1) * 8);
    constexpr int QB = 4;
#pragma unroll
    for (int q0 = 0; q0 < G4C_FP_TB / 8; q0 += QB) {
        if (!FULL && 8 * q0 >= mt) break;
        unsigned b[QB][G4C_FP_TERMS][4];
        fp_load_b<QB>(b, xs, q0, s, mi, rr);
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
            for (int term = 0; term < G4C_FP_TERMS; term++)
#pragma unroll
                for (int qq = 0; qq < QB; qq++)
#pragma unroll
                    for (int i = 0; i < 2; i++)
                        if (FULL || 8 * (q0 + qq) < mt)
                            mma_bf16(c[i][q0 + qq], a[i][hf][0], a[i][hf][1], a[i][hf][2], a[i][hf][3], b[qq][term][2 * hf],
                                     b[qq][term][2 * hf + 1]);
    }
}

/* Quantised weights (Q4 / Q8 rows, program.h) in the prefill procedure: a chunk stages each row's
 * codes as they are, plus the 4-byte words holding its scale (and bias) for each k-step and, for
 * affine codes, the tokens' input sums per k-step (fp_prep). A fragments are built from the codes
 * as exact bf16 integers q - z; per k-step, 8 tokens and tile the six products go to a fresh
 * fragment that is then added as c += s·d (+ b·Σx): the decode procedure's per-chunk form, with
 * the same fixed order for every token. Layout of the weight region: */
template <int WT> struct fpq {
    static constexpr int CB = WT == G4C_Q4 ? 16 : 32;       /* code bytes per row and k-step */
    static constexpr int LD = CB * G4C_FP_KS + 16;          /* staged row stride (bytes) */
    static constexpr int SC = 256 * LD;                     /* scale words [row][k-step] */
    static constexpr int BI = SC + 256 * G4C_FP_KS * 4;     /* bias words */
    static constexpr int SX = BI + 256 * G4C_FP_KS * 4;     /* input sums [token][k-step] */
    static constexpr int END = SX + G4C_FP_TB * G4C_FP_KS * 4;
};
static_assert(fpq<G4C_Q8>::END <= FP_WBYTES && fpq<G4C_Q4>::END <= FP_WBYTES, "quantised chunk fits the weight region");

template <int WT>
DEV void fp_stage_q(const g4c_params &p, const fp_tiles_t &tt, const g4c_mat &wm, char *buf, int t0, int mt, int ks0, int nk) {
    using L = fpq<WT>;
    const int tid = threadIdx.x;
    constexpr int PR = L::CB * G4C_FP_KS / 16; /* 16-byte pieces per row */
    const int pv = nk * L::CB / 16;
#pragma unroll
    for (int j = 0; j < 256 * PR / G4C_THREADS; j++) {
        const int f = tid + j * G4C_THREADS, row = f / PR, c = f % PR, T = row >> 4, r = row & 15;
        if (c < pv) cp16(buf + row * L::LD + 16 * c, tt.base[T] + (size_t)min(r, tt.last[T]) * tt.rb[T] + (size_t)ks0 * L::CB + 16 * c);
    }
    const bool bias = (wm.flags & G4C_QF_BIAS) != 0;
    const int ss = wm.stype == G4C_S_F32 ? 4 : 2;
#pragma unroll
    for (int j = 0; j < 256 * G4C_FP_KS / G4C_THREADS; j++) {
        const int f = tid + j * G4C_THREADS, row = f / G4C_FP_KS, sk = f % G4C_FP_KS, T = row >> 4, r = row & 15;
        if (sk >= nk) continue;
        const char *rp = tt.base[T] + (size_t)min(r, tt.last[T]) * tt.rb[T];
        const int grp = 32 * (ks0 + sk) / wm.group;
        cp4(buf + L::SC + 4 * f, rp + ((wm.sc_off + grp * ss) & ~3));
        if (bias) cp4(buf + L::BI + 4 * f, rp + ((wm.bi_off + grp * ss) & ~3));
    }
    if (bias)
#pragma unroll 1
        for (int f = tid; f < mt * G4C_FP_KS; f += G4C_THREADS) {
            const int m = f / G4C_FP_KS, sk = f % G4C_FP_KS;
            if (sk < nk) cp4(buf + L::SX + 4 * f, p.fp_sx + (size_t)(t0 + m) * (p.fp_ld / 32) + ks0 + sk);
        }
}

/* a scale or bias from the staged aligned word holding the one at row byte offset off */
DEV float fpq_param(unsigned w, int off, int stype) {
    if (stype == G4C_S_F32) return __uint_as_float(w);
    const unsigned h = (off & 2) ? w >> 16 : w & 0xFFFFu;
    return stype == G4C_S_F16 ? f16f(h) : bf16f(h);
}
/* two 4-bit codes (byte: low nibble the even column) -> bf16x2 (q - z), exact */
DEV unsigned q4_pair(unsigned x, unsigned negz) {
    const unsigned v = (x & 0xFu) | ((x & 0xF0u) << 12) | 0x43004300u; /* 128 + q, exact in bf16 */
    unsigned d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(v), "r"(0x3F803F80u), "r"(negz));
    return d;
}
/* two 8-bit codes (the low two bytes of x) -> bf16x2 (q - z), exact (|q - z| <= 255); signed codes
 * are read as int8 (flipped, z = 128), affine ones centred (z = 128, their bias moved by 128 s) */
DEV unsigned q8_pair(unsigned x, bool sgn, bool centre) {
    const unsigned y = x ^ (sgn ? 0x8080u : 0u);
    const float z = sgn || centre ? 8388736.0f : 8388608.0f;
    return bf16x2_rn(__uint_as_float(__byte_perm(y, 0x4B000000u, 0x7540u)) - z,
                     __uint_as_float(__byte_perm(y, 0x4B000000u, 0x7541u)) - z);
}

/* one k-step (absolute index ks) of a staged quantised chunk; fragments as fp_kstep */
template <bool FULL, int WT>
DEV void fp_kstep_q(float (&c)[2][G4C_FP_TB / 8][4], const char *buf, int Ta, int Tb, int s, int ks, int mt, int lane,
                    const g4c_mat &wm) {
    using L = fpq<WT>;
    const unsigned short *xs = reinterpret_cast<const unsigned short *>(buf + FP_WBYTES);
    const int g = lane >> 2, t = lane & 3, mi = lane >> 3, rr = lane & 7;
    const bool sgn = (wm.flags & G4C_QF_SIGNED) != 0, bias = (wm.flags & G4C_QF_BIAS) != 0;
    const int grp = 32 * ks / wm.group, ss = wm.stype == G4C_S_F32 ? 4 : 2;
    const int so = wm.sc_off + grp * ss, bo = wm.bi_off + grp * ss;
    /* affine codes are centred (q - 8, q - 128) and their bias moved to b + z·s: s·Σ(q - z)x and
     * (b + z·s)·Σx cancel far less than s·Σqx and b·Σx (with q in 0..15 the two terms are ~8x the
     * result, and the tensor cores' f32 sums round each) */
    const unsigned negz = sgn || bias ? 0xC308C308u : 0xC300C300u; /* -(128 + z) in bf16, z = 8 or 0 */
    const float zc = sgn ? 0.0f : WT == G4C_Q4 ? 8.0f : 128.0f; /* signed codes with a bias: centred already */
    unsigned a[2][2][4]; /* [tile][half] */
    float sc[2][2], bs[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) {
            const int row = (i ? Tb : Ta) * 16 + g + 8 * h2;
            const char *rp = buf + row * L::LD + s * L::CB;
            if constexpr (WT == G4C_Q4) { /* columns 16hf + 2t (+1): byte t of words 2hf; + 8: of words 2hf + 1 */
                const uint4 w = *reinterpret_cast<const uint4 *>(rp);
                const unsigned sel = (unsigned)t | ((unsigned)(t + 4) << 4);
                const unsigned u0 = __byte_perm(w.x, w.y, sel), u1 = __byte_perm(w.z, w.w, sel);
                a[i][0][h2] = q4_pair(u0, negz);
                a[i][0][2 + h2] = q4_pair(u0 >> 8, negz);
                a[i][1][h2] = q4_pair(u1, negz);
                a[i][1][2 + h2] = q4_pair(u1 >> 8, negz);
            } else { /* columns 16hf + 2t (+1): half t & 1 of word 4hf + t/2; + 8: of word 4hf + 2 + t/2 */
                const unsigned *rw = reinterpret_cast<const unsigned *>(rp) + (t >> 1);
                const int sh = 16 * (t & 1);
#pragma unroll
                for (int hf = 0; hf < 2; hf++)
#pragma unroll
                    for (int k2 = 0; k2 < 2; k2++) a[i][hf][2 * k2 + h2] = q8_pair(rw[4 * hf + 2 * k2] >> sh, sgn, bias);
            }
            const unsigned *sw = reinterpret_cast<const unsigned *>(buf + L::SC) + row * G4C_FP_KS + s;
            sc[i][h2] = fpq_param(*sw, so, wm.stype);
            if (bias)
                bs[i][h2] = fmaf(zc, sc[i][h2], fpq_param(*reinterpret_cast<const unsigned *>(buf + L::BI + 4 * (row * G4C_FP_KS + s)), bo, wm.stype));
        }
    const float *sxs = reinterpret_cast<const float *>(buf + L::SX);
    constexpr int QB = 4;
#pragma unroll
    for (int q0 = 0; q0 < G4C_FP_TB / 8; q0 += QB) {
        if (!FULL && 8 * q0 >= mt) break;
        unsigned b[QB][G4C_FP_TERMS][4];
        fp_load_b<QB>(b, xs, q0, s, mi, rr);
        float d[2][QB][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int qq = 0; qq < QB; qq++)
#pragma unroll
                for (int e = 0; e < 4; e++) d[i][qq][e] = 0.0f;
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
            for (int term = 0; term < G4C_FP_TERMS; term++)
#pragma unroll
                for (int qq = 0; qq < QB; qq++)
#pragma unroll
                    for (int i = 0; i < 2; i++)
                        if (FULL || 8 * (q0 + qq) < mt)
                            mma_bf16(d[i][qq], a[i][hf][0], a[i][hf][1], a[i][hf][2], a[i][hf][3], b[qq][term][2 * hf],
                                     b[qq][term][2 * hf + 1]);
#pragma unroll
        for (int qq = 0; qq < QB; qq++)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (FULL || 8 * (q0 + qq) < mt) {
                        float &cv = c[i][q0 + qq][e];
                        cv = fmaf(sc[i][e >> 1], d[i][qq][e], cv);
                        if (bias) cv = fmaf(bs[i][e >> 1], sxs[(8 * (q0 + qq) + 2 * t + (e & 1)) * G4C_FP_KS + s], cv);
                    }
    }
}

/* the epilogue of token group q of this warp's two tiles (lane (g, t): rows r0+g, r0+g+8 of tokens
 * 8q+2t, 8q+2t+1); pairs: gelu(gate) · up */
DEV void fp_store(const g4c_op *op, int step, bool pair, const int (&pi)[2], const int (&r0)[2], const bool (&ok)[2], int t0, int mt,
                  int q, const float (&v)[2][4], int g, int t) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!ok[i] || (pair && i)) continue;
        const g4c_part *P = &op->part[pi[i]];
        const int rows = P->w.rows;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int m = 8 * q + 2 * t + (e & 1), r = r0[i] + g + (e >> 1) * 8;
            if (m >= mt || r >= rows) continue;
            const size_t tm = (size_t)(t0 + m);
            if (pair) P->y[(size_t)step * P->y_step + tm * P->ldy + r] = gelu_tanh(v[0][e]) * v[1][e];
            else mm_store(op, P, step, tm, r, v[i][e]);
        }
    }
}

/* phase 2: the products (and, with one K segment, the epilogue); phase 3 (K split): after a grid
 * barrier, every block adds segments' partials in segment order for its share of the outputs and
 * runs their epilogue (NP 2: gate/up pairs) */
template <int NP, int WT>
DEVN void fp_gemm(const g4c_op *op, const g4c_params &p, int step, float *sm, unsigned long long bar, int &extra) {
    constexpr bool pair = NP == 2;
    const g4c_mat &wm = op->part[0].w; /* quantised: every part has the same layout (session.cu fp_segments) */
    constexpr int NG = G4C_FP_TB / 8, PER_BAND = pair ? G4C_WARPS : 2 * G4C_WARPS;
    const mm_shape sh = mm_shape_of(op, p);
    if (!sh.total) return;
    const int K = op->part[0].w.cols, nks = K / 32, nch = (nks + G4C_FP_KS - 1) / G4C_FP_KS, KS = op->fp_ks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int rtiles = 0;
    for (int i = 0; i < (pair ? 1 : sh.nparts); i++) rtiles += (op->part[i].w.rows + 15) / 16;
    const int bands = (rtiles + PER_BAND - 1) / PER_BAND, tblocks = (p.M + G4C_FP_TB - 1) / G4C_FP_TB;
    const int total = bands * KS * tblocks;
    const int Ta = pair ? warp : 2 * warp, Tb = pair ? warp + 8 : 2 * warp + 1; /* this warp's tiles in the band */
    char *bufs = reinterpret_cast<char *>(sm);
    fp_tiles_t *tt = reinterpret_cast<fp_tiles_t *>(bufs + (size_t)G4C_FP_NBUF * FP_BUF);
#pragma unroll 1
    for (int it = blockIdx.x; it < total; it += gridDim.x) {
        /* token blocks fastest: blocks running at once share a band's weights through L2 */
        const int tb = it % tblocks, rest = it / tblocks, sg = rest % KS, band = rest / KS;
        const int t0 = tb * G4C_FP_TB, mt = min(G4C_FP_TB, p.M - t0);
        const int cb = sg * nch / KS, ce = (sg + 1) * nch / KS; /* this segment's chunks */
        const int ks_beg = cb * G4C_FP_KS, ks_end = min(ce * G4C_FP_KS, nks), n = ce - cb;
        int pi[2], r0[2];
        bool ok[2];
        pi[0] = fp_band_tile(op, sh.nparts, pair, rtiles, band, Ta, &r0[0], &ok[0]);
        pi[1] = fp_band_tile(op, sh.nparts, pair, rtiles, band, Tb, &r0[1], &ok[1]);
        float c[2][NG][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int q = 0; q < NG; q++)
#pragma unroll
                for (int e = 0; e < 4; e++) c[i][q][e] = 0.0f;
        __syncthreads(); /* the buffers and the tile table are free (the previous item's last reads) */
        if (threadIdx.x < 16) {
            int rr;
            bool okk;
            const g4c_mat &w = op->part[fp_band_tile(op, sh.nparts, pair, rtiles, band, threadIdx.x, &rr, &okk)].w;
            tt->base[threadIdx.x] = (const char *)w.data + (size_t)rr * w.row_bytes;
            tt->rb[threadIdx.x] = w.row_bytes;
            tt->last[threadIdx.x] = w.rows - 1 - rr;
        }
        __syncthreads();
        auto stage = [&](int b, int kc) { /* chunk kc of the item into buffer b */
            const int ks0 = ks_beg + kc * G4C_FP_KS, nk = min(G4C_FP_KS, ks_end - ks0);
            char *buf = bufs + (size_t)b * FP_BUF;
            if constexpr (WT == G4C_BF16) fp_stage(p, *tt, buf, t0, mt, ks0, nk);
            else {
                fp_stage_q<WT>(p, *tt, wm, buf, t0, mt, ks0, nk);
                fp_stage(p, *tt, buf, t0, mt, ks0, -nk); /* the terms only */
            }
        };
#pragma unroll
        for (int b = 0; b < G4C_FP_NBUF - 1; b++) {
            if (b < n) stage(b, b);
            cp_commit();
        }
#pragma unroll 1
        for (int k = 0; k < n; k++) {
            const int kn = k + G4C_FP_NBUF - 1;
            if (kn < n) stage(kn % G4C_FP_NBUF, kn);
            cp_commit();
            asm volatile("cp.async.wait_group %0;" ::"n"(G4C_FP_NBUF - 1) : "memory");
            __syncthreads();
            const char *buf = bufs + (size_t)(k % G4C_FP_NBUF) * FP_BUF;
            const int nk = min(G4C_FP_KS, ks_end - ks_beg - k * G4C_FP_KS);
            const int ksc = ks_beg + k * G4C_FP_KS;
            if (mt == G4C_FP_TB && nk == G4C_FP_KS) {
#pragma unroll
                for (int s = 0; s < G4C_FP_KS; s++) {
                    if constexpr (WT == G4C_BF16) fp_kstep<true>(c, buf, Ta, Tb, s, mt, lane);
                    else fp_kstep_q<true, WT>(c, buf, Ta, Tb, s, ksc + s, mt, lane, wm);
                }
            } else {
#pragma unroll 1
                for (int s = 0; s < nk; s++) {
                    if constexpr (WT == G4C_BF16) fp_kstep<false>(c, buf, Ta, Tb, s, mt, lane);
                    else fp_kstep_q<false, WT>(c, buf, Ta, Tb, s, ksc + s, mt, lane, wm);
                }
            }
            __syncthreads(); /* every warp is done with the buffer before it is staged again */
        }
        if (KS == 1) {
#pragma unroll
            for (int q = 0; q < NG; q++) {
                const float v[2][4] = {{c[0][q][0], c[0][q][1], c[0][q][2], c[0][q][3]}, {c[1][q][0], c[1][q][1], c[1][q][2], c[1][q][3]}};
                fp_store(op, step, pair, pi, r0, ok, t0, mt, q, v, g, t);
            }
        } else { /* this segment's fragments: [item][segment][warp][value][lane] */
            float *mine = p.fp_part + ((size_t)(band * tblocks + tb) * KS + sg) * G4C_FP_SLOT + (size_t)warp * 64 * 32 + lane;
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int q = 0; q < NG; q++)
#pragma unroll
                    for (int e = 0; e < 4; e++) mine[(size_t)((i * NG + q) * 4 + e) * 32] = c[i][q][e];
        }
    }
    if (KS == 1) return;
    grid_sync(p.ctl, bar, NULL, NULL);
    extra++;
    /* phase 3: a unit is (band, token block, warp slot, token group): 8 values per lane */
    const int units = bands * tblocks * G4C_WARPS * NG;
#pragma unroll 1
    for (int u = blockIdx.x * G4C_WARPS + warp; u < units; u += gridDim.x * G4C_WARPS) {
        const int q = u % NG, w = u / NG % G4C_WARPS, bt = u / (NG * G4C_WARPS), band = bt / tblocks, tb = bt % tblocks;
        const int t0 = tb * G4C_FP_TB, mt = min(G4C_FP_TB, p.M - t0);
        if (8 * q >= mt) continue;
        const int ta = pair ? w : 2 * w, tbb = pair ? w + 8 : 2 * w + 1;
        int pi[2], r0[2];
        bool ok[2];
        pi[0] = fp_band_tile(op, sh.nparts, pair, rtiles, band, ta, &r0[0], &ok[0]);
        pi[1] = fp_band_tile(op, sh.nparts, pair, rtiles, band, tbb, &r0[1], &ok[1]);
        const float *src = p.fp_part + (size_t)bt * KS * G4C_FP_SLOT + (size_t)w * 64 * 32 + lane;
        float v[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll 1
        for (int s0 = 0; s0 < KS; s0 += 8) {
            float x[8][2][4];
#pragma unroll
            for (int k = 0; k < 8; k++)
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        x[k][i][e] = s0 + k < KS ? lda(src + (size_t)(s0 + k) * G4C_FP_SLOT + (size_t)((i * NG + q) * 4 + e) * 32) : 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++)
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (s0 + k < KS) v[i][e] = s0 + k == 0 ? x[k][i][e] : v[i][e] + x[k][i][e];
        }
        fp_store(op, step, pair, pi, r0, ok, t0, mt, q, v, g, t);
    }
}

/* a matmul stage: its parts share one weight type (the host splits stages where they differ) */
template <unsigned TM>
DEVT void op_matmul(const g4c_op *op, const g4c_params &p, int step, float *sm, unsigned long long bar, int &extra) {
    const tail_t tl = tail_of(sm, p);
    if constexpr ((TM & G4C_KM_WIDE) != 0) {
        if (p.fast && op->fp_ks > 0) { /* the prefill procedure: input terms, a grid barrier, the products */
            fp_prep(op, p, step, sm, tl.red);
            if (op->prep_only) return; /* the last stage of this launch: pgemm.cu takes the products */
            grid_sync(p.ctl, bar, NULL, NULL);
            extra++;
            const int wt = op->part[0].w.type;
            const bool pr = op->epi == G4C_EPI_GELU_PAIR;
            if (wt == G4C_BF16) {
                if (pr) fp_gemm<2, G4C_BF16>(op, p, step, sm, bar + gridDim.x, extra);
                else fp_gemm<1, G4C_BF16>(op, p, step, sm, bar + gridDim.x, extra);
            } else if (wt == G4C_Q4) {
                if constexpr ((TM & G4C_KM_Q4) != 0) {
                    if (pr) fp_gemm<2, G4C_Q4>(op, p, step, sm, bar + gridDim.x, extra);
                    else fp_gemm<1, G4C_Q4>(op, p, step, sm, bar + gridDim.x, extra);
                }
            } else if constexpr ((TM & G4C_KM_Q8) != 0) {
                if (pr) fp_gemm<2, G4C_Q8>(op, p, step, sm, bar + gridDim.x, extra);
                else fp_gemm<1, G4C_Q8>(op, p, step, sm, bar + gridDim.x, extra);
            }
            return;
        }
    } else {
        (void)bar;
        (void)extra;
    }
    const int M = p.M, m_begin = op->lm ? p.lm_from : 0;
    const mm_shape sh = mm_shape_of(op, p);
    const int K = op->part[0].w.cols, ldk = G4C_TILE_LD(K), type = op->part[0].w.type;
    const int amax = mm_amax(op, sh);
    const bool mma = (TM & G4C_KM_MMA) && op->mma_ks > 0;
    bool iq = false;
    if constexpr ((TM & G4C_KM_IQ) != 0) iq = iq_stage(op, p);
    int mt_cap = iq ? iq_cap(p, K) : (p.smem_in_floats - (mma ? G4C_MMA_SCRATCH : 0)) / ldk;
    if (mt_cap > (mma ? G4C_MMA_MT : G4C_MT)) mt_cap = mma ? G4C_MMA_MT : G4C_MT;
    const int warp = threadIdx.x >> 5, ntiles = (M - m_begin + mt_cap - 1) / mt_cap;
    /* The wide kernels give each token tile of a stage its own group of blocks (the last group
     * takes the remainder), so a block builds one input tile instead of every one; the rows'
     * arithmetic does not depend on which block or team computes them. Not for tensor-core stages
     * (their segment counters assume every block) or argmax stages (every block's partials). */
    int blk = blockIdx.x, nblk = gridDim.x, ti0 = 0, tstep = 1;
    if constexpr ((TM & G4C_KM_WIDE) != 0) {
        if (!mma && !amax && ntiles > 1 && (int)gridDim.x >= ntiles) {
            const int gb = gridDim.x / ntiles;
            ti0 = min((int)blockIdx.x / gb, ntiles - 1);
            blk = blockIdx.x - ti0 * gb;
            nblk = ti0 == ntiles - 1 ? gridDim.x - ti0 * gb : gb;
            tstep = ntiles;
        }
    }
    const iq_smem iqs = iq_smem_of(sm, ldk, K, mt_cap);
    /* 4- and 8-bit rows take the tile in integer form (qi_block), built with it where load_input builds it */
    int qt = 0;
    if (sh.total && !mma && !iq) {
        if constexpr ((TM & (1u << G4C_Q8)) != 0) qt = type == G4C_Q8 ? G4C_Q8 : qt;
        if constexpr ((TM & (1u << G4C_Q4)) != 0) qt = type == G4C_Q4 ? G4C_Q4 : qt;
    }
    for (int t0 = m_begin + ti0 * mt_cap; t0 < M; t0 += tstep * mt_cap) {
        const int mt = min(mt_cap, M - t0);
        const long long ci = p.trace ? clock64() : 0;
        for (int m0 = 0; m0 < mt; m0 += G4C_MT) { /* load_rows' reductions hold G4C_MT rows */
            const int sub = min(G4C_MT, mt - m0);
            float *base = sm + (size_t)m0 * ldk;
            if ((TM & G4C_KM_M1) == 0 && sub > 1 && op->in.kind != G4C_IN_CONCAT &&
                (size_t)m0 * ldk + load_rows_floats(op->in, K, sub) <= (size_t)p.smem_in_floats) {
                if (!load_rows<TM>(op->in, K, t0 + m0, sub, step, base, (double *)tl.tp, p, blk == 0, qt) && qt)
                    qi_tile_t<TM>(qt, base, ldk, K, sub);
            } else if (!load_input(&op->in, K, t0 + m0, sub, step, base, tl.red, p, blk == 0, qt) && qt) {
                qi_tile_t<TM>(qt, base, ldk, K, sub);
            }
        }
        if (iq && sh.total) iq_digits(sm, ldk, K, mt, iqs);
        if (p.trace && threadIdx.x == 0) tl.flag[2] += (int)(clock64() - ci);
        if (p.strace && t0 == m_begin + ti0 * mt_cap) st_mark(p, op, 2, global_ns());
        if constexpr ((TM & G4C_KM_MMA) != 0) {
            if (sh.total && mma) {
                const int tile = (t0 - m_begin) / mt_cap;
                if (sh.pair) { /* 8 tokens per product: one group, or up to G4C_MMA_MT / 8 */
                    if (mt <= 8) mm_tile_mma<1, 2>(op, p, step, sm, t0, mt, amax, tile);
                    else mm_tile_mma<G4C_MMA_MT / 8, 2>(op, p, step, sm, t0, mt, amax, tile);
                } else {
                    if (mt <= 8) mm_tile_mma<1, 1>(op, p, step, sm, t0, mt, amax, tile);
                    else mm_tile_mma<G4C_MMA_MT / 8, 1>(op, p, step, sm, t0, mt, amax, tile);
                }
            }
        }
        if constexpr ((TM & G4C_KM_IQ) != 0) {
            if (sh.total && iq) {
                if (mt == 1) mm_tile_iq<1>(op, p, step, sm, t0, mt, amax, blk, nblk, iqs);
                else if (mt <= 4) mm_tile_iq<4>(op, p, step, sm, t0, mt, amax, blk, nblk, iqs);
                else mm_tile_iq<G4C_MT>(op, p, step, sm, t0, mt, amax, blk, nblk, iqs);
            }
        }
        if (sh.total && !mma && !iq) {
            if constexpr ((TM & G4C_KM_M1) != 0) mm_tile_t<TM, 1>(type, op, p, step, sm, t0, 1, amax, blk, nblk);
            else if (mt == 1) mm_tile_t<TM, 1>(type, op, p, step, sm, t0, mt, amax, blk, nblk);
            else if (mt <= 4) mm_tile_t<TM, 4>(type, op, p, step, sm, t0, mt, amax, blk, nblk);
            else mm_tile_t<TM, G4C_MT>(type, op, p, step, sm, t0, mt, amax, blk, nblk);
        }
        if (t0 + tstep * mt_cap >= M && op->pf_next >= 0) mm_prefetch_first(p.ops + op->pf_next, p, warp);
        __syncthreads();
    }
    if (amax) finish_argmax(p, m_begin, M, amax, step, 0, tl.flag);
}

/* (cos, sin) of pos · inv[i] when the session has no table for this kind (out of line: rare) */
DEVR float2 rope_angle(const double *inv_f, int i, int pos) {
    const double ang = (double)pos * __ldg(inv_f + i);
    return make_float2((float)cos(ang), (float)sin(ang));
}

/* One warp: y = rms_w(w)(x) over d (w NULL: weightless), then RoPE at pos when rope, with (cos, sin)
 * from the session's table cs[pos][i] (or computed from inv_f). x may be y. Every global load is
 * issued before the first is used, and the code is short: a stage that runs once per layer pays for
 * fetching its instructions. */
DEVN void warp_norm_rope(const float *x, float *y, const float *w, int d, int rope, int R, const double *inv_f,
                         const float *cs, int pos, float eps, float *buf) {
    const int lane = threadIdx.x & 31, half = d / 2, d4 = d / 4;
    constexpr int N4 = G4C_MAXD / 128, NP = G4C_MAXD / 64;
    float4 r[N4], wv[N4];
    float2 cv[NP];
#pragma unroll
    for (int k = 0; k < N4; k++) {
        const int c = lane + 32 * k;
        r[k] = c < d4 ? lda4(x + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        wv[k] = w && c < d4 ? __ldg(reinterpret_cast<const float4 *>(w) + c) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    }
#pragma unroll
    for (int k = 0; k < NP; k++) {
        const int i = lane + 32 * k;
        cv[k] = rope && cs && i < R && i < half ? __ldg(reinterpret_cast<const float2 *>(cs) + (size_t)pos * R + i)
                                                : make_float2(1.0f, 0.0f);
    }
    double ss = 0;
#pragma unroll
    for (int k = 0; k < N4; k++)
        ss += sq4(r[k]);
    const float inv = rms_inv(warp_sum_d(ss), d, eps);
#pragma unroll
    for (int k = 0; k < N4; k++) {
        const int c = lane + 32 * k;
        if (c < d4)
            reinterpret_cast<float4 *>(buf)[c] =
                make_float4(r[k].x * inv * wv[k].x, r[k].y * inv * wv[k].y, r[k].z * inv * wv[k].z, r[k].w * inv * wv[k].w);
    }
    __syncwarp();
    if (rope) {
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int i = lane + 32 * k;
            if (i >= half) continue;
            const float a = buf[i], b = buf[i + half];
            if (i < R) {
                const float2 t = cs ? cv[k] : rope_angle(inv_f, i, pos);
                y[i] = a * t.x - b * t.y;
                y[i + half] = b * t.x + a * t.y;
            } else {
                y[i] = a;
                y[i + half] = b;
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < N4; k++) {
            const int c = lane + 32 * k;
            if (c < d4) reinterpret_cast<float4 *>(y)[c] = reinterpret_cast<const float4 *>(buf)[c];
        }
    }
    __syncwarp();
}

/* Where token m's (position pq) normed K and V rows of KV head h go: the cache slot in direct mode,
 * else the staging rows the commit copies */
DEV void kv_dest(const g4c_op *op, const g4c_params &p, int m, int pq, int h, float **kd, float **vd) {
    const size_t row = (size_t)op->n_kv * op->d;
    const size_t at = (p.direct ? (size_t)(pq % op->cap_rows) : (size_t)m) * row + (size_t)h * op->d;
    *kd = (p.direct ? op->kc : op->kst) + at;
    *vd = (p.direct ? op->vc : op->vst) + at;
}

DEVN void op_heads(const g4c_op *op, const g4c_params &p, int pos0, float *sm) {
    const int nH = op->n_heads, nkv = op->n_kv, d = op->d, own = op->qkv_own;
    const int Mq = op->drafter ? 1 : p.M, per = nH + (own ? 2 * nkv : 0), row = nkv * d;
    const int warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * G4C_WARPS + warp, nw = gridDim.x * G4C_WARPS;
    float *buf = sm + warp * G4C_MAXD;
#pragma unroll 1
    for (int it = gw; it < Mq * per; it += nw) {
        const int m = it / per, j = it % per, pq = op->drafter ? p.qpos : pos0 + m;
        if (j < nH) {
            float *q = op->q + (size_t)m * nH * d + (size_t)j * d;
            warp_norm_rope(q, q, op->q_norm, d, 1, op->pairs, op->rope_inv, op->rope_cs, pq, p.eps, buf);
            continue;
        }
        const int h = (j - nH) % nkv, is_v = j - nH >= nkv;
        const float *kr = op->kraw + (size_t)m * row + (size_t)h * d;
        const float *vr = op->k_eq_v ? kr : op->vraw + (size_t)m * row + (size_t)h * d;
        float *kd, *vd;
        kv_dest(op, p, m, pq, h, &kd, &vd);
        if (is_v) warp_norm_rope(vr, vd, NULL, d, 0, 0, NULL, NULL, 0, p.eps, buf); /* v: the raw k on K=V layers */
        else warp_norm_rope(kr, kd, op->k_norm, d, 1, op->pairs, op->rope_inv, op->rope_cs, pq, p.eps, buf);
    }
}

/* the chunk range of query position pq */
DEV void attn_range(const g4c_op *op, int pq, int *lo, int *c_first, int *nch) {
    int l = op->is_full ? 0 : max(0, pq - op->window + 1);
    *lo = l;
    *c_first = l / G4C_KCHUNK;
    *nch = pq / G4C_KCHUNK - l / G4C_KCHUNK + 1;
}

DEV const float *kv_row(const float *stage, const float *cache, int cap, int stage_from, int j, int row) {
    return j >= stage_from ? stage + (size_t)(j - stage_from) * row : cache + (size_t)(j % cap) * row;
}

/* One query head whose keys span nch > 1 chunks: its partials (base, chunk stride `stride`)
 * combined in chunk order into att (d elements), a thread per element. */
DEV void attn_combine(const float *base, size_t stride, int nch, int d, float *att) {
#pragma unroll 1
    for (int e = threadIdx.x; e < d; e += G4C_THREADS) {
        float mx = -INFINITY;
#pragma unroll 8
        for (int ci = 0; ci < nch; ci++) mx = fmaxf(mx, lda(base + ci * stride));
        float s = 0.0f, o = 0.0f;
#pragma unroll 1
        for (int c0 = 0; c0 < nch; c0 += 8) { /* loads first, then the sums in chunk order */
            float cm[8], cs[8], ca[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float *pc = base + (size_t)(c0 + u) * stride;
                cm[u] = c0 + u < nch ? lda(pc) : 0.0f;
                cs[u] = c0 + u < nch ? lda(pc + 1) : 0.0f;
                ca[u] = c0 + u < nch ? lda(pc + 2 + e) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                if (c0 + u < nch) {
                    float w = expf(cm[u] - mx);
                    s = s + cs[u] * w;
                    o = o + ca[u] * w;
                }
            }
        }
        att[e] = o / s;
    }
}

/* The prefill kernels' attention (WIDE). First (when the stage norms and ropes itself, op->heads)
 * every query head and every own K/V row of the launch is normed and roped once, a warp each
 * (warp_norm_rope, as the decode kernels' items do it): queries into p.qn, K/V rows into staging
 * where op_heads would store them; a grid barrier. Then one item per (KV head, tokens, key chunk),
 * the tokens as many as fill the block's warps with (token, query head) pairs: the chunk's K/V
 * rows are copied into shared memory once and each warp runs a pair from start to end without
 * block barriers: the scores (a warp per key, lanes over float4s of the head, the butterfly), the
 * softmax (lane j holds key j), the V sums (lane l owns elements l, l+32, ... in key order), the
 * output or the chunk partial, and, as the last of the pair's chunks to finish, the combine in
 * chunk order. Every value gets the operations the decode kernels' items give it (op_attn), in
 * the same order, so a token's attention is bitwise the same in either kind of kernel. */
DEV void attn_tokens_range(const g4c_op *op, int pos0, int M, int m0, int tq, int *c_lo, int *c_hi) {
    int lo, cf, nch;
    attn_range(op, pos0 + m0, &lo, &cf, &nch);
    *c_lo = cf;
    attn_range(op, pos0 + min(M, m0 + tq) - 1, &lo, &cf, &nch);
    *c_hi = cf + nch - 1;
}
/* the launch's queries (into p.qn) and own K/V rows (where op_heads would store them), normed and
 * roped once, a warp each: the first phase of attn_items_tokens, and pprep.cu's launch of it */
DEV void attn_prep_rows(const g4c_op *op, const g4c_params &p, int pos0, float *sm) {
    const int nH = op->n_heads, nkv = op->n_kv, d = op->d, row = nkv * d, warp = threadIdx.x >> 5;
    const int per = nH + (op->qkv_own ? 2 * nkv : 0);
    float *buf = sm + (size_t)warp * G4C_MAXD;
#pragma unroll 1
    for (int u = blockIdx.x * G4C_WARPS + warp; u < p.M * per; u += gridDim.x * G4C_WARPS) {
        const int m = u / per, r = u - m * per, pq = pos0 + m;
        if (r < nH) {
            const size_t at = (size_t)m * nH * d + (size_t)r * d;
            warp_norm_rope(op->q + at, p.qn + at, op->q_norm, d, 1, op->pairs, op->rope_inv, op->rope_cs, pq, p.eps, buf);
        } else {
            const int g = (r - nH) >> 1;
            float *kd, *vd;
            kv_dest(op, p, m, pq, g, &kd, &vd);
            const float *kr = op->kraw + (size_t)m * row + (size_t)g * d;
            if (((r - nH) & 1) == 0)
                warp_norm_rope(kr, kd, op->k_norm, d, 1, op->pairs, op->rope_inv, op->rope_cs, pq, p.eps, buf);
            else
                warp_norm_rope(op->k_eq_v ? kr : op->vraw + (size_t)m * row + (size_t)g * d, vd, NULL, d, 0, 0, NULL, NULL, 0,
                               p.eps, buf);
        }
    }
}

DEVN void attn_items_tokens(const g4c_op *op, const g4c_params &p, int pos0, float *sm, unsigned long long bar, int &extra) {
    const int nH = op->n_heads, nkv = op->n_kv, d = op->d, group = nH / nkv, row = nkv * d, cap = op->cap_rows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x, d4 = d / 4;
    const bool pre = op->heads != 0;
    if (pre) { /* the launch's queries and own K/V rows, normed and roped once */
        attn_prep_rows(op, p, pos0, sm);
        if (op->prep_only) return; /* the last stage of this launch: pattn.cu takes the items */
        grid_sync(p.ctl, bar, NULL, NULL);
        extra++;
    }
    if (op->prep_only) return;
    const int stage_from = (p.direct || !op->kst) ? INT_MAX : pos0;
    const float *qsrc0 = pre ? p.qn : op->q;
    const int tq = max(1, G4C_WARPS / group), ntg = (p.M + tq - 1) / tq;
    int per_g = 0; /* items per KV head: each token group's chunks */
    for (int tg = 0; tg < ntg; tg++) {
        int a, b;
        attn_tokens_range(op, pos0, p.M, tg * tq, tq, &a, &b);
        per_g += b - a + 1;
    }
    const int total = nkv * per_g;
    float *ks = sm, *vsm = ks + (size_t)G4C_KCHUNK * d, *qw = vsm + (size_t)G4C_KCHUNK * d + (size_t)warp * d;
#pragma unroll 1
    for (int it = blockIdx.x; it < total; it += gridDim.x) {
        const int g = it / per_g;
        int rest = it - g * per_g, tg = 0, c = 0;
        for (;; tg++) {
            int a, b;
            attn_tokens_range(op, pos0, p.M, tg * tq, tq, &a, &b);
            if (rest <= b - a) {
                c = a + rest;
                break;
            }
            rest -= b - a + 1;
        }
        const int m0 = tg * tq, m1 = min(p.M, m0 + tq);
        int lo0, cf0, nch0;
        attn_range(op, pos0 + m0, &lo0, &cf0, &nch0);
        const int K0 = max(lo0, c * G4C_KCHUNK), K1 = min(pos0 + m1 - 1, c * G4C_KCHUNK + G4C_KCHUNK - 1), n = K1 - K0 + 1;
        { /* the chunk's rows K0..K1 (cache, or this launch's staging), all copies in flight at once */
            const int rpp = G4C_THREADS / d4, c4 = tid % d4, j0 = tid / d4;
            const size_t off = (size_t)g * d + 4 * c4;
#pragma unroll 1
            for (int j = j0 < rpp ? j0 : n; j < n; j += rpp) {
                cp16(ks + ((size_t)j * d4 + c4) * 4, kv_row(op->kst, op->kc, cap, stage_from, K0 + j, row) + off);
                cp16(vsm + ((size_t)j * d4 + c4) * 4, kv_row(op->vst, op->vc, cap, stage_from, K0 + j, row) + off);
            }
            cp_wait();
        }
        __syncthreads();
#pragma unroll 1
        for (int pr = warp; pr < (m1 - m0) * group; pr += G4C_WARPS) {
            const int m = m0 + pr / group, hh = pr % group, pq = pos0 + m;
            int lo, cf, nch;
            attn_range(op, pq, &lo, &cf, &nch);
            const int k0 = max(lo, c * G4C_KCHUNK), k1 = min(pq, c * G4C_KCHUNK + G4C_KCHUNK - 1);
            if (k0 > k1) continue; /* this token does not see the chunk */
            const int nk = k1 - k0 + 1, jb = k0 - K0, ci = c - cf;
            const float *qsrc = qsrc0 + (size_t)m * nH * d + (size_t)(g * group + hh) * d;
            for (int c4 = lane; c4 < d4; c4 += 32) reinterpret_cast<float4 *>(qw)[c4] = lda4(qsrc + 4 * c4);
            __syncwarp();
            float sj = -INFINITY; /* lane j: key k0 + j's score; AK keys at a time (independent chains) */
            constexpr int AK = 8;
#pragma unroll 1
            for (int j0 = 0; j0 < nk; j0 += AK) {
                float a[AK];
#pragma unroll
                for (int u = 0; u < AK; u++) a[u] = 0.0f;
#pragma unroll 1
                for (int c4 = lane; c4 < d4; c4 += 32) {
                    const float4 q = *reinterpret_cast<const float4 *>(qw + 4 * c4);
#pragma unroll
                    for (int u = 0; u < AK; u++) {
                        if (j0 + u >= nk) continue;
                        const float4 kv = *reinterpret_cast<const float4 *>(ks + (size_t)(jb + j0 + u) * d + 4 * c4);
                        a[u] = fmaf(q.x, kv.x, a[u]);
                        a[u] = fmaf(q.y, kv.y, a[u]);
                        a[u] = fmaf(q.z, kv.z, a[u]);
                        a[u] = fmaf(q.w, kv.w, a[u]);
                    }
                }
#pragma unroll
                for (int u = 0; u < AK; u++) {
                    const float v = warp_sum_f(a[u]);
                    if (lane == j0 + u) sj = v;
                }
            }
            float mx = lane < nk ? fmaxf(-INFINITY, sj) : -INFINITY;
            mx = warp_max_f(mx);
            const float e = lane < nk ? expf(sj - mx) : 0.0f;
            float s = lane < nk ? 0.0f + e : 0.0f;
            s = warp_sum_f(s);
            float *att = op->att + (size_t)m * nH * d + (size_t)(g * group + hh) * d;
            float *part = op->part_buf + (((size_t)m * nkv + g) * op->max_chunks + ci) * group * (d + 2) + (size_t)hh * (d + 2);
            /* V sums: lane l's elements l + 32i, each a chain in key order */
            constexpr int NE = G4C_MAXD / 32;
            float o[NE];
#pragma unroll
            for (int i = 0; i < NE; i++) o[i] = 0.0f;
#pragma unroll 1
            for (int j = 0; j < nk; j++) {
                const float w = __shfl_sync(0xffffffffu, e, j);
                const float *vr = vsm + (size_t)(jb + j) * d;
#pragma unroll
                for (int i = 0; i < NE; i++)
                    if (lane + 32 * i < d) o[i] = fmaf(w, vr[lane + 32 * i], o[i]);
            }
#pragma unroll
            for (int i = 0; i < NE; i++) {
                const int el = lane + 32 * i;
                if (el >= d) continue;
                if (nch == 1) att[el] = o[i] / s;
                else part[2 + el] = o[i];
            }
            if (nch > 1) { /* the last of the pair's chunks to finish combines them in chunk order */
                if (lane == 0) {
                    part[0] = mx;
                    part[1] = s;
                }
                __threadfence();
                __syncwarp();
                int last = 0;
                int *cnt = op->att_cnt + (size_t)m * nH + (size_t)g * group + hh;
                if (lane == 0) last = atomicAdd(cnt, 1) == nch - 1;
                last = __shfl_sync(0xffffffffu, last, 0);
                if (last) {
                    __threadfence();
                    const size_t stride = (size_t)group * (d + 2);
                    const float *base = part - (size_t)ci * stride;
                    float cmx = -INFINITY; /* the max over the chunks (exact in any order) */
#pragma unroll 1
                    for (int q0 = 0; q0 < nch; q0 += 32)
                        if (q0 + lane < nch) cmx = fmaxf(cmx, lda(base + (size_t)(q0 + lane) * stride));
                    cmx = warp_max_f(cmx);
                    float ss = 0.0f; /* then the sums in chunk order, 8 chunks' loads at a time */
#pragma unroll
                    for (int i = 0; i < NE; i++) o[i] = 0.0f;
#pragma unroll 1
                    for (int q0 = 0; q0 < nch; q0 += 8) {
                        float w[8], cs[8];
#pragma unroll
                        for (int u = 0; u < 8; u++) {
                            const bool ok = q0 + u < nch;
                            w[u] = ok ? lda(base + (size_t)(q0 + u) * stride) : 0.0f;
                            cs[u] = ok ? lda(base + (size_t)(q0 + u) * stride + 1) : 0.0f;
                        }
#pragma unroll
                        for (int i0 = 0; i0 < NE; i0 += 8) {
                            if (32 * i0 >= d) break;
                            float ca[8][8];
#pragma unroll
                            for (int u = 0; u < 8; u++)
#pragma unroll
                                for (int i = 0; i < 8; i++)
                                    ca[u][i] = q0 + u < nch && lane + 32 * (i0 + i) < d
                                                   ? lda(base + (size_t)(q0 + u) * stride + 2 + lane + 32 * (i0 + i))
                                                   : 0.0f;
                            if (i0 == 0)
#pragma unroll
                                for (int u = 0; u < 8; u++) {
                                    if (q0 + u >= nch) continue;
                                    w[u] = expf(w[u] - cmx);
                                    ss = ss + cs[u] * w[u];
                                }
#pragma unroll
                            for (int u = 0; u < 8; u++)
#pragma unroll
                                for (int i = 0; i < 8; i++)
                                    if (q0 + u < nch) o[i0 + i] = o[i0 + i] + ca[u][i] * w[u];
                        }
                    }
#pragma unroll
                    for (int i = 0; i < NE; i++)
                        if (lane + 32 * i < d) att[lane + 32 * i] = o[i] / ss;
                    if (lane == 0) *cnt = 0; /* ready for the next layer */
                }
            }
            __syncwarp(); /* qw is the next pair's */
        }
        __syncthreads(); /* the staged rows are the next item's */
    }
}

/* Attention (the decode kernels; the wide kernels take attn_items_tokens): one work item per
 * (token, KV head, key chunk, query head of the group), so a short context still spreads over many
 * blocks. The item's query, K and V rows go to shared memory first
 * (every load issued before the first is used); scores are a warp per key (lanes over float4s of the
 * head, then the butterfly), the softmax a warp, the V sums a thread per element in key order. */
/* Staged decode (pre): the kernel has not yet waited for the previous stage (griddepcontrol.wait).
 * K/V rows of positions before pos0 were written by earlier launches (graphs run one after
 * another; pos0 itself changes only in a graph's last stage), so the block's first item copies
 * those rows before it waits and everything else after; every block waits exactly once. */
template <bool WIDE>
DEVN void op_attn(const g4c_op *op, const g4c_params &p, int pos0, float *sm, unsigned long long bar, int &extra,
                  bool pre = false) {
    if constexpr (WIDE) {
        if (!op->drafter && op->n_heads > op->n_kv) {
            attn_items_tokens(op, p, pos0, sm, bar, extra);
            return;
        }
    } else {
        (void)bar;
        (void)extra;
    }
    const int nH = op->n_heads, nkv = op->n_kv, d = op->d, group = nH / nkv, row = nkv * d, cap = op->cap_rows;
    const int Mq = op->drafter ? 1 : p.M;
    const int stage_from = (op->drafter || p.direct || !op->kst) ? INT_MAX : pos0;
    /* fused heads: the block's own rows (positions from raw_from) come from kraw / vraw */
    const int raw_from = op->heads && op->qkv_own ? pos0 : INT_MAX;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    int total = 0, nch_max = 0;
    for (int m = 0; m < Mq; m++) {
        int lo, cf, nch;
        attn_range(op, op->drafter ? p.qpos : pos0 + m, &lo, &cf, &nch);
        total += nkv * nch * group;
        nch_max = max(nch_max, nch);
    }
    /* launched in clusters of CL blocks (p.attn_cl, kernel 4) and every head's chunks fit one: a
     * cluster per (token, query head), its block of rank r on chunk r, the partials left in each
     * block's shared memory and combined by rank 0 through the cluster's (attn_combine's operations
     * in its order), so no fence, no counter and no global partials. The same bits. */
    const int CL = p.attn_cl;
    const bool cl = !WIDE && CL > 1 && !op->drafter && nch_max <= CL;
    const int units = cl ? Mq * nH : total, u_first = cl ? (int)blockIdx.x / CL : (int)blockIdx.x;
    const int u_step = cl ? (int)gridDim.x / CL : (int)gridDim.x, crank = cl ? (int)blockIdx.x % CL : 0;
    float *qs = sm, *sc = sm + d, *stat = sc + G4C_KCHUNK; /* stat: max, sum */
    float *ks = stat + 4; /* the chunk's K rows [n][d], then its V rows [n][d] */
    const tail_t tl = tail_of(sm, p);
#pragma unroll 1
    for (int it = u_first; it < units; it += u_step) {
        int m = 0, rest = it, lo = 0, cf = 0, nch = 0, pq = 0, g = 0, ci = 0, hh = 0;
        if (cl) {
            m = it / nH;
            pq = pos0 + m;
            attn_range(op, pq, &lo, &cf, &nch);
            g = it % nH / group;
            hh = it % group;
            ci = crank;
            if (ci >= nch) { /* a rank past the head's last chunk: only the cluster's barriers */
                if (nch > 1) {
                    cluster_sync();
                    cluster_sync();
                }
                continue;
            }
        } else {
            for (;; m++) {
                pq = op->drafter ? p.qpos : pos0 + m;
                attn_range(op, pq, &lo, &cf, &nch);
                if (rest < nkv * nch * group) break;
                rest -= nkv * nch * group;
            }
            g = rest / (nch * group);
            ci = rest / group % nch;
            hh = rest % group;
        }
        const int c = cf + ci;
        const int k0 = max(lo, c * G4C_KCHUNK), k1 = min(pq, c * G4C_KCHUNK + G4C_KCHUNK - 1), n = k1 - k0 + 1;
        const float *qsrc = op->q + (size_t)m * nH * d + (size_t)(g * group + hh) * d;
        float *vsm = ks + (size_t)n * d;
        const int d4 = d / 4, rpp = G4C_THREADS / d4, c4 = tid % d4, j0 = tid / d4;
        const int nc = min(n, raw_from - k0);                     /* rows copied; the rest are computed below */
        const int npre = pre ? max(0, min(nc, pos0 - k0)) : 0; /* of them, copied before the wait */
        /* rows [j_lo, j_hi) of the chunk's K and V into shared memory, a float4 per thread and row */
        auto copy_rows = [&](int j_lo, int j_hi) {
            const size_t off = (size_t)g * d + 4 * c4;
#pragma unroll 1
            for (int j = j0 < rpp ? j_lo + j0 : j_hi; j < j_hi; j += rpp) { /* every copy in flight at once */
                cp16(ks + ((size_t)j * d4 + c4) * 4, kv_row(op->kst, op->kc, cap, stage_from, k0 + j, row) + off);
                cp16(vsm + ((size_t)j * d4 + c4) * 4, kv_row(op->vst, op->vc, cap, stage_from, k0 + j, row) + off);
            }
        };
        if (pre) { /* the first item: the earlier positions' K/V rows, then the wait */
            copy_rows(0, npre);
            stage_wait(p, op);
        }
        const long long tstart = p.trace ? clock64() : 0;
        {
            copy_rows(npre, nc);
            if (tid < d4 && !op->heads) cp16(qs + 4 * tid, qsrc + 4 * tid);
            if (op->heads) { /* op_heads' arithmetic (warp_norm_rope), into shared memory: the query,
                                then K and V of each own row, a warp per vector */
                const int nv = 1 + 2 * max(0, n - max(nc, 0));
#pragma unroll 1
                for (int v = warp; v < nv; v += G4C_WARPS) {
                    if (v == 0) {
                        warp_norm_rope(qsrc, qs, op->q_norm, d, 1, op->pairs, op->rope_inv, op->rope_cs, pq, p.eps, qs);
                        continue;
                    }
                    const int j = max(nc, 0) + (v - 1) / 2, mj = k0 + j - pos0;
                    const float *kr = op->kraw + (size_t)mj * row + (size_t)g * d;
                    if ((v - 1) % 2 == 0)
                        warp_norm_rope(kr, ks + (size_t)j * d, op->k_norm, d, 1, op->pairs, op->rope_inv, op->rope_cs, k0 + j, p.eps,
                                       ks + (size_t)j * d);
                    else /* v: the raw k on K=V layers */
                        warp_norm_rope(op->k_eq_v ? kr : op->vraw + (size_t)mj * row + (size_t)g * d, vsm + (size_t)j * d, NULL, d, 0,
                                       0, NULL, NULL, 0, p.eps, vsm + (size_t)j * d);
                }
            }
            cp_wait();
        }
        __syncthreads();
        if (p.trace && tid == 0) tl.flag[2] += (int)(clock64() - tstart); /* trace: the staging's cycles */
        /* the staged trace's point 2 in an attention stage: where the item's chain has got to (p.amark) */
        auto amark = [&](int k) {
            if (p.strace && p.amark == k) st_mark(p, op, 2, global_ns());
        };
        amark(1);
        if (op->heads && op->qkv_own && hh == 0 && k1 == pq) { /* this token's K/V row, as op_heads stores it */
            float *kd, *vd;
            kv_dest(op, p, m, pq, g, &kd, &vd);
#pragma unroll 1
            for (int e = tid; e < d; e += G4C_THREADS) {
                kd[e] = ks[(size_t)(n - 1) * d + e];
                vd[e] = vsm[(size_t)(n - 1) * d + e];
            }
        }
#pragma unroll 1
        for (int j = warp; j < n; j += G4C_WARPS) {
            const float *kr = ks + (size_t)j * d;
            float a = 0.0f;
#pragma unroll 1
            for (int c4 = lane; c4 < d / 4; c4 += 32) {
                const float4 kv = *reinterpret_cast<const float4 *>(kr + 4 * c4);
                const float4 q = *reinterpret_cast<const float4 *>(qs + 4 * c4);
                a = fmaf(q.x, kv.x, a);
                a = fmaf(q.y, kv.y, a);
                a = fmaf(q.z, kv.z, a);
                a = fmaf(q.w, kv.w, a);
            }
            a = warp_sum_f(a);
            if (lane == 0) sc[j] = a;
        }
        __syncthreads();
        if (warp == 0) {
            float mx = -INFINITY;
#pragma unroll 1
            for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sc[j]);
            mx = warp_max_f(mx);
            float s = 0.0f;
#pragma unroll 1
            for (int j = lane; j < n; j += 32) {
                float e = expf(sc[j] - mx);
                sc[j] = e;
                s += e;
            }
            s = warp_sum_f(s);
            if (lane == 0) {
                stat[0] = mx;
                stat[1] = s;
            }
        }
        __syncthreads();
        amark(2);
        float *part = op->part_buf + (((size_t)m * nkv + g) * op->max_chunks + ci) * group * (d + 2) + (size_t)hh * (d + 2);
#pragma unroll 1
        for (int e = tid; e < d; e += G4C_THREADS) {
            float o = 0.0f;
#pragma unroll 4
            for (int j = 0; j < n; j++) o = fmaf(sc[j], vsm[(size_t)j * d + e], o); /* in key order */
            if (nch == 1) op->att[(size_t)m * nH * d + (size_t)(g * group + hh) * d + e] = o / stat[1];
            else if (cl) qs[e] = o; /* the query is used: qs holds the partial (and stat its statistics) */
            else part[2 + e] = o;
        }
        if (p.strace && p.amark == 3) {
            __syncthreads();
            amark(3);
        }
        if (nch > 1 && cl) { /* rank 0 combines the cluster's partials in chunk order */
            cluster_sync();
            amark(4);
            if (crank == 0) {
                float *att = op->att + (size_t)m * nH * d + (size_t)(g * group + hh) * d;
                /* each rank's partial through distributed shared memory, a batch of 8 loads issued
                 * before the first is used (attn_combine's shape; one after another it took 1.3 µs) */
                const unsigned own = (unsigned)__cvta_generic_to_shared(qs);
#pragma unroll 1
                for (int e = tid; e < d; e += G4C_THREADS) { /* attn_combine's operations, in chunk order */
                    float mx = -INFINITY;
#pragma unroll 1
                    for (int c0 = 0; c0 < nch; c0 += 8) {
                        float cm[8];
#pragma unroll
                        for (int u = 0; u < 8; u++) cm[u] = c0 + u < nch ? ld_cluster(own + 4u * (d + G4C_KCHUNK), c0 + u) : -INFINITY;
#pragma unroll
                        for (int u = 0; u < 8; u++)
                            if (c0 + u < nch) mx = fmaxf(mx, cm[u]);
                    }
                    float s = 0.0f, o = 0.0f;
#pragma unroll 1
                    for (int c0 = 0; c0 < nch; c0 += 8) {
                        float cm[8], cs[8], ca[8];
#pragma unroll
                        for (int u = 0; u < 8; u++) {
                            const bool in = c0 + u < nch;
                            cm[u] = in ? ld_cluster(own + 4u * (d + G4C_KCHUNK), c0 + u) : 0.0f;
                            cs[u] = in ? ld_cluster(own + 4u * (d + G4C_KCHUNK + 1), c0 + u) : 0.0f;
                            ca[u] = in ? ld_cluster(own + 4u * e, c0 + u) : 0.0f;
                        }
#pragma unroll
                        for (int u = 0; u < 8; u++) {
                            if (c0 + u < nch) {
                                const float w = expf(cm[u] - mx);
                                s = s + cs[u] * w;
                                o = o + ca[u] * w;
                            }
                        }
                    }
                    att[e] = o / s;
                }
                if (p.strace && p.amark == 5) {
                    __syncthreads();
                    amark(5);
                }
            }
            cluster_sync(); /* every block's partial read before its shared memory is reused */
        } else if (nch > 1) { /* the last of the head's chunks to finish combines them (no separate stage) */
            if (tid == 0) {
                part[0] = stat[0];
                part[1] = stat[1];
            }
            __threadfence();
            __syncthreads();
            int *cnt = op->att_cnt + (size_t)m * nH + (size_t)g * group + hh;
            if (tid == 0) tl.flag[1] = atomicAdd(cnt, 1) == nch - 1;
            __syncthreads();
            amark(4);
            if (tl.flag[1]) {
                __threadfence();
                const size_t stride = (size_t)group * (d + 2);
                attn_combine(part - (size_t)ci * stride, stride, nch, d, op->att + (size_t)m * nH * d + (size_t)(g * group + hh) * d);
                if (tid == 0) *cnt = 0; /* ready for the next layer */
                if (p.strace && p.amark == 5) {
                    __syncthreads();
                    amark(5);
                }
            }
        }
        __syncthreads();
        pre = false;
    }
    if (pre) stage_wait(p, op); /* a block without items */
}

/* per-layer inputs: ple[m][l] = (rms_w(norm)(raw[m][l] * hs) + E_ple[tok][l] * tscale) * r2, in place */
DEVN void op_ple(const g4c_op *op, const g4c_params &p) {
    const int L = op->L, P = op->P, M = p.M;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gw = blockIdx.x * G4C_WARPS + warp, nw = gridDim.x * G4C_WARPS;
#pragma unroll 1
    for (int it = gw; it < M * L; it += nw) {
        const int m = it / L, l = it % L, tok = ldi(&p.ctl->tokens[m]);
        float *pl = op->out + (size_t)m * op->out_ld + (size_t)l * P;
        float a[16];
        double ss = 0;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            int i = lane + 32 * k;
            a[k] = 0.0f;
            if (i < P) {
                a[k] = lda(pl + i) * op->scale;
                ss += (double)a[k] * a[k];
            }
        }
        float inv = rms_inv(warp_sum_d(ss), P, p.eps);
#pragma unroll
        for (int k = 0; k < 16; k++) {
            int i = lane + 32 * k;
            if (i < P) {
                float y = a[k] * inv * ldv(op->vec + i);
                pl[i] = (y + mat_at(op->table, tok, l * P + i) * op->scale3) * op->scale2;
            }
        }
    }
}

/* MoE router (a thread per token: E and top-k are small) and the experts' input x2 */
DEVR void op_moe_route(const g4c_op *op, const g4c_params &p, float *sm) {
    const tail_t tl = tail_of(sm, p);
    const int E = op->E, K = op->topk, H = op->H, M = p.M, tid = threadIdx.x;
#pragma unroll 1
    for (int m = blockIdx.x; m < M; m += gridDim.x) {
        if (tid == 0) {
            float *pr = sm;
            float mx = -INFINITY, sum = 0.0f;
            for (int e = 0; e < E; e++) {
                pr[e] = lda(op->router_logits + (size_t)m * E + e);
                mx = pr[e] > mx ? pr[e] : mx;
            }
            for (int e = 0; e < E; e++) sum += (pr[e] = expf(pr[e] - mx));
            for (int e = 0; e < E; e++) pr[e] /= sum;
            int *top = op->top_e + (size_t)m * K;
            float *tw = op->top_w + (size_t)m * K, tsum = 0.0f;
            int chosen[64];
            for (int k = 0; k < K; k++) {
                int best = -1;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int q = 0; q < k && !taken; q++) taken = chosen[q] == e;
                    if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
                }
                chosen[k] = best;
                tsum += pr[best];
            }
            for (int k = 0; k < K; k++) {
                top[k] = chosen[k];
                tw[k] = pr[chosen[k]] / tsum * ldv(op->expert_scale + chosen[k]);
            }
        }
        const float *x1 = op->x1 + (size_t)m * H;
        double ss = 0;
#pragma unroll 1
        for (int i = tid; i < H; i += G4C_THREADS) {
            double a = lda(x1 + i);
            ss += a * a;
        }
        float inv = rms_inv(block_sum_d(ss, tl.red), H, p.eps);
#pragma unroll 1
        for (int i = tid; i < H; i += G4C_THREADS) op->x2[(size_t)m * H + i] = lda(x1 + i) * inv * ldv(op->pre2_w + i);
        __syncthreads();
    }
}

/* The top-k experts of every token: gate/up pairs over x2 (ex_pair) or down over their output. */
template <int T>
DEVT void expert_tile(const g4c_op *op, float *sm, int t0, int mt, int ldk, int evict_first) {
    const unsigned long long pol = l2_policy(evict_first);
    const int K = op->topk, Im = op->Im, H = op->H, pair = op->ex_pair;
    const int rpt = pair ? 1 : K, kin = pair ? H : Im;
    const int per_k = pair ? Im : (H + 1) / 2, per_tok = K * per_k;
    const g4c_mat &w = op->ew;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gw = blockIdx.x * G4C_WARPS + warp, nw = gridDim.x * G4C_WARPS;
#pragma unroll 1
    for (int it = gw; it < mt * per_tok; it += nw) {
        const int m = it / per_tok, rest = it % per_tok, k = rest / per_k, li = rest % per_k;
        const int e = ldi(op->top_e + (size_t)(t0 + m) * K + k);
        const float *x = sm + ((size_t)m * rpt + (pair ? 0 : k)) * ldk;
        const char *w0, *w1;
        int r0 = li, has1 = 1;
        if (pair) {
            w0 = (const char *)w.data + ((size_t)e * 2 * Im + li) * w.row_bytes;
            w1 = (const char *)w.data + ((size_t)e * 2 * Im + Im + li) * w.row_bytes;
        } else {
            r0 = 2 * li;
            has1 = r0 + 1 < H;
            w0 = (const char *)w.data + ((size_t)e * H + r0) * w.row_bytes;
            w1 = has1 ? w0 + w.row_bytes : w0;
        }
        float acc[2][G4C_MT];
        dot2<T, 1, 4, T == G4C_Q8 || T == G4C_Q4>(w0, w1, w, kin, x, ldk, 1, 0, 1, acc, pol); /* qi_tile's rows */
        if (lane == 0) {
            const size_t mk = (size_t)(t0 + m) * K + k;
            if (pair) {
                op->ex_out[mk * Im + li] = gelu_tanh(acc[0][0]) * acc[1][0];
            } else {
                op->ex_out[mk * H + r0] = acc[0][0];
                if (has1) op->ex_out[mk * H + r0 + 1] = acc[1][0];
            }
        }
    }
}

template <unsigned TM>
DEVT void op_expert(const g4c_op *op, const g4c_params &p, float *sm) {
    const int K = op->topk, Im = op->Im, H = op->H, M = p.M, pair = op->ex_pair;
    const int kin = pair ? H : Im, rpt = pair ? 1 : K;
    const int ldk = G4C_TILE_LD(kin);
    int mt_cap = p.smem_in_floats / (ldk * rpt);
    if (mt_cap > G4C_MT) mt_cap = G4C_MT;
    for (int t0 = 0; t0 < M; t0 += mt_cap) {
        const int mt = min(mt_cap, M - t0);
        const float *src = op->ex_in + (size_t)t0 * rpt * kin;
        for (int r = 0; r < mt * rpt; r++)
#pragma unroll 1
            for (int i = threadIdx.x; i < kin; i += G4C_THREADS) sm[(size_t)r * ldk + px(i)] = lda(src + (size_t)r * kin + i);
        qi_tile_t<TM>(op->ew.type, sm, ldk, kin, mt * rpt);
        __syncthreads();
        switch (op->ew.type) {
        case G4C_BF16: if constexpr ((TM & (1u << G4C_BF16)) != 0) expert_tile<G4C_BF16>(op, sm, t0, mt, ldk, p.evict_first); break;
        case G4C_F16: if constexpr ((TM & (1u << G4C_F16)) != 0) expert_tile<G4C_F16>(op, sm, t0, mt, ldk, p.evict_first); break;
        case G4C_Q8: if constexpr ((TM & (1u << G4C_Q8)) != 0) expert_tile<G4C_Q8>(op, sm, t0, mt, ldk, p.evict_first); break;
        case G4C_Q4: if constexpr ((TM & (1u << G4C_Q4)) != 0) expert_tile<G4C_Q4>(op, sm, t0, mt, ldk, p.evict_first); break;
        default: if constexpr ((TM & (1u << G4C_F32)) != 0) expert_tile<G4C_F32>(op, sm, t0, mt, ldk, p.evict_first); break;
        }
        __syncthreads();
    }
}

/* f = rms_w(post1)(dense) + rms_w(post2)(sum_k w_k expert_k), the sum in rank order */
DEVR void op_moe_combine(const g4c_op *op, const g4c_params &p, float *sm) {
    const tail_t tl = tail_of(sm, p);
    const int K = op->topk, H = op->H, M = p.M, tid = threadIdx.x;
    float *dn = sm, *o = sm + H;
#pragma unroll 1
    for (int m = blockIdx.x; m < M; m += gridDim.x) {
        float *f = op->f + (size_t)m * H;
        double ss = 0;
#pragma unroll 1
        for (int i = tid; i < H; i += G4C_THREADS) {
            dn[i] = lda(f + i);
            ss += (double)dn[i] * dn[i];
        }
        float inv = rms_inv(block_sum_d(ss, tl.red), H, p.eps);
#pragma unroll 1
        for (int i = tid; i < H; i += G4C_THREADS) dn[i] = dn[i] * inv * ldv(op->post1_w + i);
        ss = 0;
#pragma unroll 1
        for (int i = tid; i < H; i += G4C_THREADS) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc = acc + lda(op->top_w + (size_t)m * K + k) * lda(op->ex_res + ((size_t)m * K + k) * H + i);
            o[i] = acc;
            ss += (double)acc * acc;
        }
        inv = rms_inv(block_sum_d(ss, tl.red), H, p.eps);
#pragma unroll 1
        for (int i = tid; i < H; i += G4C_THREADS) f[i] = dn[i] + o[i] * inv * ldv(op->post2_w + i);
        __syncthreads();
    }
}

/* drafter centroid head, step 1: the top-k clusters (block 0; lower index on ties) */
DEVR void op_cent_topk(const g4c_op *op, const g4c_params &p, float *sm) {
    if (blockIdx.x != 0) return;
    const tail_t tl = tail_of(sm, p);
    const int C = op->C, K = op->topk, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    float *cv = sm;
#pragma unroll 1
    for (int i = tid; i < C; i += G4C_THREADS) {
        cv[i] = lda(op->cent + i);
        op->cflag[i] = 0;
    }
    __syncthreads();
    for (int k = 0; k < K; k++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
#pragma unroll 1
        for (int i = tid; i < C; i += G4C_THREADS)
            if (cv[i] > -INFINITY && better(cv[i], i, bv, bi)) {
                bv = cv[i];
                bi = i;
            }
        for (int o = 16; o; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(v2, i2, bv, bi)) {
                bv = v2;
                bi = i2;
            }
        }
        if (lane == 0) {
            tl.bv[warp] = bv;
            tl.bi[warp] = bi;
        }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < G4C_WARPS; w++)
                if (better(tl.bv[w], tl.bi[w], bv, bi)) {
                    bv = tl.bv[w];
                    bi = tl.bi[w];
                }
            if (bi == INT_MAX) bi = 0;
            op->cidx[k] = bi;
            op->cflag[bi] = 1;
            cv[bi] = -INFINITY;
        }
        __syncthreads();
    }
}

/* one token, any weight type (the drafter's centroid head: off the decode path) */
DEVR void dot2_one(const g4c_mat &w, const char *w0, const char *w1, int K, const float *x, int ldx, float (&acc)[2][G4C_MT]) {
    const unsigned long long pol = l2_policy(0); /* the drafter's embedding rows: gathered, may repeat */
    switch (w.type) {
    case G4C_BF16: dot2<G4C_BF16, 1>(w0, w1, w, K, x, ldx, 1, 0, 1, acc, pol); break;
    case G4C_F16: dot2<G4C_F16, 1>(w0, w1, w, K, x, ldx, 1, 0, 1, acc, pol); break;
    case G4C_Q8: dot2<G4C_Q8, 1>(w0, w1, w, K, x, ldx, 1, 0, 1, acc, pol); break;
    case G4C_Q4: dot2<G4C_Q4, 1>(w0, w1, w, K, x, ldx, 1, 0, 1, acc, pol); break;
    default: dot2<G4C_F32, 1>(w0, w1, w, K, x, ldx, 1, 0, 1, acc, pol); break;
    }
}

/* step 2: score the chosen clusters' tokens against y; min and argmax over them */
DEVR void op_cent_score(const g4c_op *op, const g4c_params &p, int step, float *sm) {
    const tail_t tl = tail_of(sm, p);
    const int h = op->emb_d.cols, per = op->per, n = op->topk * per, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int gw = blockIdx.x * G4C_WARPS + warp, nw = gridDim.x * G4C_WARPS;
    float *logits = op->logits + (size_t)step * op->V;
#pragma unroll 1
    for (int i = tid; i < h; i += G4C_THREADS) sm[px(i)] = lda(op->y + i);
    __syncthreads();
    float bv[G4C_MT], mn = INFINITY;
    int bi[G4C_MT];
#pragma unroll
    for (int m = 0; m < G4C_MT; m++) {
        bv[m] = -INFINITY;
        bi[m] = INT_MAX;
    }
#pragma unroll 1
    for (int it = gw; it < (n + 1) / 2; it += nw) {
        const int j0 = 2 * it, j1 = j0 + 1, has1 = j1 < n;
        const int t0 = __ldg(op->order + (size_t)ldi(op->cidx + j0 / per) * per + j0 % per);
        const int t1 = has1 ? __ldg(op->order + (size_t)ldi(op->cidx + j1 / per) * per + j1 % per) : t0;
        const char *w0 = (const char *)op->emb_d.data + (size_t)t0 * op->emb_d.row_bytes;
        const char *w1 = (const char *)op->emb_d.data + (size_t)t1 * op->emb_d.row_bytes;
        float acc[2][G4C_MT];
        dot2_one(op->emb_d, w0, w1, h, sm, G4C_TILE_LD(h), acc);
        if (lane == 0) {
            logits[t0] = acc[0][0];
            mn = fminf(mn, acc[0][0]);
            if (better(acc[0][0], t0, bv[0], bi[0])) {
                bv[0] = acc[0][0];
                bi[0] = t0;
            }
            if (has1) {
                logits[t1] = acc[1][0];
                mn = fminf(mn, acc[1][0]);
                if (better(acc[1][0], t1, bv[0], bi[0])) {
                    bv[0] = acc[1][0];
                    bi[0] = t1;
                }
            }
        }
    }
    if (lane == 0) tl.mn[warp] = mn;
    block_argmax_store(p, tl, bv, bi, 0, 1);
    if (tid == 0) {
        float m2 = INFINITY;
        for (int w = 0; w < G4C_WARPS; w++) m2 = fminf(m2, tl.mn[w]);
        p.amin_part[blockIdx.x] = m2;
    }
    finish_argmax(p, 0, 1, 2, step, 1, tl.flag);
}

/* step 3 (only when the logits are wanted): every unscored token gets min - 1 */
DEVR void op_cent_fill(const g4c_op *op, const g4c_params &p, int step) {
    if (!p.want_logits) return;
    const float fill = lda(&p.ctl->dmin) - 1.0f;
    float *logits = op->logits + (size_t)step * op->V;
#pragma unroll 1
    for (int t = blockIdx.x * G4C_THREADS + threadIdx.x; t < op->V; t += gridDim.x * G4C_THREADS)
        if (!ldi(op->cflag + __ldg(op->cluster_of + t))) logits[t] = fill;
}

/* ---- the kernel ------------------------------------------------------------------------------------ */

static_assert(256 + 2 * 4 * G4C_WARPS * G4C_MT + 4 * G4C_WARPS + 16 + 4 * 4 * G4C_WARPS * G4C_MT <= 4096,
              "reduction scratch overlaps the stage copies");
static_assert((256 + 2 * 4 * G4C_WARPS * G4C_MT + 4 * G4C_WARPS + 16) % 8 == 0 && 2 * 8 * G4C_WARPS * G4C_MT <= 4 * 4 * G4C_WARPS * G4C_MT,
              "load_rows' double sums do not fit the team-partials scratch");
static_assert(256 + 2 * 4 * G4C_WARPS * G4C_MT + 4 * G4C_WARPS + 16 + 2 * 8 * G4C_WARPS * G4C_MT + 2 * 4 * G4C_MT <= 4096,
              "load_rows' inverse norms overlap the stage copies");
static_assert(4096 + 2 * sizeof(g4c_op) <= G4C_TAIL, "two stage copies do not fit the shared tail");
static_assert(sizeof(fp_tiles_t) <= 512, "the prefill procedure's tile table exceeds the room session.cu keeps for it");

template <unsigned TM>
__global__ void __launch_bounds__(G4C_THREADS, 1) g4c_kernel(const __grid_constant__ g4c_params p) {
    extern __shared__ __align__(16) float sm[];
    const tail_t tl = tail_of(sm, p);
    const int pos0 = ldi(&p.ctl->pos);
    /* the barrier counter at the start of this launch (see grid_sync); thread 0 alone waits on it */
    const unsigned long long bar0 = threadIdx.x == 0 ? __ldcg(&p.ctl->bar) / gridDim.x * gridDim.x : 0;
    const bool local = p.op_local != 0, tr = p.trace != NULL && threadIdx.x == 0;
    unsigned long long *trace = tr ? p.trace + (size_t)blockIdx.x * 4 : NULL;
    const size_t tstride = (size_t)gridDim.x * 4;
    if (local) { /* stage 0's copy */
#pragma unroll 1
        for (int i = threadIdx.x; i < (int)(sizeof(g4c_op) / 4); i += G4C_THREADS)
            reinterpret_cast<int *>(tl.ops)[i] = __ldg(reinterpret_cast<const int *>(p.ops) + i);
        __syncthreads();
    }
    int k = 0;     /* stages run so far in this launch */
    int extra = 0; /* grid barriers within stages so far (the wide kernels' prefill procedure) */
    constexpr bool wide = (TM & G4C_KM_WIDE) != 0;
    for (int step = 0; step < p.n_steps; step++) {
        for (int s = 0; s < p.n_ops; s++, k++) {
            const g4c_op *op = local ? tl.ops + (k & 1) : p.ops + s;
            long long c0 = 0;
            if (op->kind != G4C_OP_MATMUL && op->pf_next >= 0) mm_prefetch_first(p.ops + op->pf_next, p, -1);
#pragma unroll 1
            for (int r = 0; r <= p.rep; r++) {
                if (r) __syncthreads();
                if (tr) {
                    trace[0] = global_ns();
                    c0 = clock64();
                    tl.flag[2] = 0;
                }
                if (p.skip & op->cls) continue;
                switch (op->kind) {
                case G4C_OP_EMBED: op_embed(op, p); break;
                case G4C_OP_MATMUL:
                    op_matmul<TM>(op, p, step, sm, wide ? bar0 + (unsigned long long)(k + 1 + extra) * gridDim.x : 0ull, extra);
                    break;
                case G4C_OP_HEADS: op_heads(op, p, pos0, sm); break;
                case G4C_OP_ATTN:
                    op_attn<wide>(op, p, pos0, sm, wide ? bar0 + (unsigned long long)(k + 1 + extra) * gridDim.x : 0ull, extra);
                    break;
                case G4C_OP_PLE: op_ple(op, p); break;
                case G4C_OP_MOE_ROUTE: op_moe_route(op, p, sm); break;
                case G4C_OP_EXPERT: op_expert<TM>(op, p, sm); break;
                case G4C_OP_MOE_COMBINE: op_moe_combine(op, p, sm); break;
                case G4C_OP_CENT_TOPK: op_cent_topk(op, p, sm); break;
                case G4C_OP_CENT_SCORE: op_cent_score(op, p, step, sm); break;
                case G4C_OP_CENT_FILL: op_cent_fill(op, p, step); break;
                default: break;
                }
            }
            if (p.trace) { /* the whole block waits (a barrier inside `if (tr)` would hang: only thread 0 reaches it) */
                __syncthreads();
                if (tr) {
                    trace[1] = global_ns();
                    trace[2] = (unsigned long long)tl.flag[2];
                    trace[3] = (unsigned long long)(clock64() - c0);
                    trace += tstride;
                }
            }
            const bool more = s + 1 < p.n_ops || step + 1 < p.n_steps;
            if (more)
                grid_sync(p.ctl, bar0 + (unsigned long long)(k + 1 + (wide ? extra : 0)) * gridDim.x,
                          local ? p.ops + (s + 1 < p.n_ops ? s + 1 : 0) : NULL,
                          tl.ops + ((k + 1) & 1));
        }
    }
}

/* the instantiation's kernel as a host pointer for the launch table (forward.cu) */
template <unsigned TM> const void *g4c_kernel_fn() { return (const void *)g4c_kernel<TM>; }

/* ---- the staged decode's ring matmul (one token) ---------------------------------------------- */

/* A warp's ring: R slots, each one chunk of both rows per lane ([row][lane] 16 bytes: conflict-free
 * reads) and, for quantised rows, the chunk's scale and bias words ([s0, s1, b0, b1][lane]). */
template <int T> struct ring_of {
    static constexpr bool Q = T == G4C_Q8 || T == G4C_Q4;
    static constexpr int R = Q ? G4C_RING_R_Q : G4C_RING_R_D, SLOT = Q ? G4C_RING_SLOT_Q : G4C_RING_SLOT_D;
};
static_assert(G4C_RING_R_D * G4C_RING_SLOT_D <= G4C_RING_WARP && G4C_RING_R_Q * G4C_RING_SLOT_Q <= G4C_RING_WARP,
              "a ring exceeds its room");

/* the 4-byte word holding a row's scale or bias g (rows and their parameter blocks are 4-aligned,
 * so the word lies within the row), and that parameter from the word */
DEV const void *ring_pword(const char *row, int off, int stype, int g) {
    const char *a = row + off + (stype == G4C_S_F32 ? 4 * g : 2 * g);
    return (const void *)((uintptr_t)a & ~(uintptr_t)3);
}
DEV float ring_param(unsigned word, const char *row, int off, int stype, int g) {
    if (stype == G4C_S_F32) return __uint_as_float(word);
    const unsigned h = ((uintptr_t)(row + off + 2 * g) & 2) ? word >> 16 : word & 0xFFFFu;
    return stype == G4C_S_F16 ? f16f(h) : bf16f(h);
}

/* a lane's next chunk to copy: item it (it >= total: none left), chunk c of its rows w0, w1 */
typedef struct {
    int it, c, pi;
    const char *w0, *w1;
} ring_cur;

DEV void ring_seek(const g4c_op *op, const mm_shape &sh, int total, ring_cur &rc, int it, int cf, int nch) {
    rc.it = cf < nch ? it : total; /* a lane past the rows' last chunk copies nothing */
    if (rc.it < total) {
        int r0, has1;
        rc.pi = mm_item(op, sh, it, &r0, &has1, &rc.w0, &rc.w1);
        rc.c = cf;
    }
}

/* copy the lane's next chunk (if any) into slot sl as one commit group (empty when none is left:
 * the count of groups per slot stays the same for every lane) */
template <int T>
DEV void ring_issue(const g4c_op *op, const mm_shape &sh, int total, ring_cur &rc, char *sl, int cf, int step, int nch, int nteams,
                    unsigned long long pol) {
    const int lane = threadIdx.x & 31;
    if (rc.it < total) {
        cp16_pol(sl + lane * 16, rc.w0 + (size_t)rc.c * 16, pol);
        cp16_pol(sl + 512 + lane * 16, rc.w1 + (size_t)rc.c * 16, pol);
        if constexpr (ring_of<T>::Q) {
            const g4c_mat &wm = op->part[rc.pi].w;
            const int g = rc.c * G4C_CHUNK_ELEMS(T) / wm.group;
            cp4(sl + 1024 + lane * 4, ring_pword(rc.w0, wm.sc_off, wm.stype, g));
            cp4(sl + 1152 + lane * 4, ring_pword(rc.w1, wm.sc_off, wm.stype, g));
            if (wm.flags & G4C_QF_BIAS) {
                cp4(sl + 1280 + lane * 4, ring_pword(rc.w0, wm.bi_off, wm.stype, g));
                cp4(sl + 1408 + lane * 4, ring_pword(rc.w1, wm.bi_off, wm.stype, g));
            }
        }
        rc.c += step;
        if (rc.c >= nch) ring_seek(op, sh, total, rc, rc.it + nteams, cf, nch);
    }
    cp_commit();
}

/* A one-token matmul stage of the staged decode (mode 4: dense rows; quantised ones with
 * G4_CUDA_RING_Q=1, slower as measured) with its weights streamed through
 * shared memory: each lane copies its own chunks (cp.async) into its warp's ring of R slots, R
 * ahead of their use, and takes them two at a time. The first R go out before
 * griddepcontrol.wait - weights depend on no stage - so a stage's first bytes are in flight while
 * the previous stage still runs (its kernel holds half an SM, this one the other half), and no
 * register holds a load in flight. Per chunk the
 * arithmetic is dot2's (chunk_dot), in the same order; items, team sums, the epilogue and the
 * argmax are mm_tile's and op_matmul's, so the outputs are bitwise those of every other mode.
 * MTT 4: a verify block's 2..4 tokens of dense rows (mm_input's tile; the kernel then takes a whole
 * SM, session.cu), each token's operations those of a one-token step. */
template <int T, int R, int MTT = 1, bool TWO = false>
DEVT void mm_ring(const g4c_op *op, const g4c_params &p, float *sm) {
    typedef ring_of<T> RC;
    constexpr int E = G4C_CHUNK_ELEMS(T);
    constexpr bool Q = RC::Q;
    /* R slots a ring (a constant: cp.async's wait and commit stay unconditional): the type's, or
     * fewer beside an input tile too wide for them (session.cu; mm_ring_slots) */
    static_assert(R >= 4 && R <= RC::R, "ring slots");
    static_assert(MTT == 1 || (MTT <= 4 && !Q), "verify rings: dense rows, up to four tokens");
    /* the warps' rings R slots apart: a constant (spaced by a run-time value, every ring of this
     * kernel faulted with an illegal instruction on an H100 - session 36's bisection - whichever
     * slot count ran) */
    constexpr size_t rstride = (size_t)R * RC::SLOT;
    const tail_t tl = tail_of(sm, p);
    const int M = p.M, m_begin = op->lm ? p.lm_from : 0, mt = MTT == 1 ? 1 : M - m_begin;
    const mm_shape sh = mm_shape_of(op, p);
    const int total = m_begin < M ? sh.total : 0, S = op->split;
    const int K = op->part[0].w.cols, ldk = G4C_TILE_LD(K), nch = K / E;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tpb = G4C_WARPS / S;
    const int tg = team_first(p, blockIdx.x, gridDim.x, tpb, warp / S), nteams = gridDim.x * tpb, step = 32 * S,
              cf = 32 * (warp % S) + lane;
    const unsigned long long pol = l2_policy(p.evict_first);
    char *ring = (char *)(sm + p.smem_in_floats) + G4C_TAIL + (size_t)warp * rstride;
    ring_cur rc;
    ring_seek(op, sh, total, rc, tg, cf, nch);
#pragma unroll
    for (int k = 0; k < R; k++) ring_issue<T>(op, sh, total, rc, ring + k * RC::SLOT, cf, step, nch, nteams, pol);
    stage_wait(p, op);
    const int amax = mm_amax(op, sh);
    if (m_begin < M) {
        /* the input row as every one-token stage builds it. Its register-held row spills at this
         * kernel's 128 registers (ptxas -v: 384 bytes for bf16 rows, 780 for 4-bit ones), but
         * building it through shared memory instead (load_rows, no spills) measured slower on an
         * H100: E2B bf16 351.1 -> 343.2 tok/s against mode 2, E4B 201.4 -> 194.2 (README) */
        if constexpr (MTT == 1) {
            if (!load_input(&op->in, K, m_begin, 1, 0, sm, tl.red, p, blockIdx.x == 0, Q ? T : 0) && Q) qi_tile<T>(sm, ldk, K, 1);
        } else { /* a verify block's rows as op_matmul builds them (load_rows where they fit: the same bits) */
            mm_input<G4C_KM_DENSE>(op, p, 0, sm, m_begin, mt, blockIdx.x == 0, 0);
        }
        if (p.strace) st_mark(p, op, 2, global_ns());
        int parity = 0, slot = 0;
        float bv[G4C_MT];
        int bi[G4C_MT];
        amax_reset(bv, bi);
#pragma unroll 1
        for (int it = tg; it < total; it += nteams) {
            int r0, has1;
            const char *w0, *w1;
            const int pi = mm_item(op, sh, it, &r0, &has1, &w0, &w1);
            const g4c_part *P0 = &op->part[pi];
            const g4c_mat &wm = P0->w;
            const bool sgn = Q && (wm.flags & G4C_QF_SIGNED), bias = Q && (wm.flags & G4C_QF_BIAS);
            float a0[MTT], a1[MTT], p0[MTT][G4C_BACC], p1[MTT][G4C_BACC];
            dot_zero<MTT>(p0, p1, a0, a1);
            /* two chunks per wait (the oldest two of the R groups in flight are complete after
             * wait_group R - 2): their shared-memory reads overlap and their code products are
             * independent work for the scheduler; the arithmetic is chunk by chunk, in order */
#pragma unroll 1
            for (int c = cf; c < nch; c += 2 * step) {
                const bool two = c + step < nch;
                cp_wait_n<R - 2>();
                uint4 wa[2], wb[2];
                float sc0[2] = {}, sc1[2] = {}, bz0[2] = {}, bz1[2] = {};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (h && !two) break;
                    const int si = slot + h < R ? slot + h : slot + h - R;
                    const char *sl = ring + si * RC::SLOT;
                    wa[h] = *reinterpret_cast<const uint4 *>(sl + lane * 16);
                    wb[h] = *reinterpret_cast<const uint4 *>(sl + 512 + lane * 16);
                    if constexpr (Q) {
                        const int g = (c + h * step) * E / wm.group;
                        const unsigned *sw = reinterpret_cast<const unsigned *>(sl + 1024);
                        sc0[h] = ring_param(sw[lane], w0, wm.sc_off, wm.stype, g);
                        sc1[h] = ring_param(sw[32 + lane], w1, wm.sc_off, wm.stype, g);
                        const float zc = sgn ? 0.0f : T == G4C_Q8 ? 128.0f : 8.0f; /* as dot2 (integer tile) */
                        if (bias || !sgn) {
                            bz0[h] = fmaf(zc, sc0[h], bias ? ring_param(sw[64 + lane], w0, wm.bi_off, wm.stype, g) : 0.0f);
                            bz1[h] = fmaf(zc, sc1[h], bias ? ring_param(sw[96 + lane], w1, wm.bi_off, wm.stype, g) : 0.0f);
                        }
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (h && !two) break;
                    if constexpr (Q)
                        chunk_dot_qi<T, MTT>(wa[h], wb[h], sc0[h], sc1[h], bz0[h], bz1[h], sm, c + h * step, ldk, mt, sgn, bias || !sgn, a0, a1);
                    else
                        chunk_dot<T, MTT>(wa[h], wb[h], sc0[h], sc1[h], bz0[h], bz1[h], sm + px((c + h * step) * E), ldk, mt, sgn, bias,
                                          p0, p1, a0, a1);
                }
                /* the slots are free once their values have been used: the lane's next chunks, R ahead */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (h && !two) break;
                    ring_issue<T>(op, sh, total, rc, ring + slot * RC::SLOT, cf, step, nch, nteams, pol);
                    slot = slot + 1 == R ? 0 : slot + 1;
                }
            }
            float acc[2][G4C_MT];
            dot_finish<T, MTT>(p0, p1, a0, a1, acc);
            mm_item_out<MTT, TWO>(op, P0, tl, 0, m_begin, mt, r0, has1, sh.pair, S, parity, acc, bv, bi);
        }
        if (amax) block_argmax_store<TWO>(p, tl, bv, bi, m_begin, mt);
        __syncthreads();
    }
    if (amax) finish_argmax(p, m_begin, M, amax, 0, 0, tl.flag);
}

/* mm_ring at the stage's slot count (p.ring_slots; 0: the type's). Verify blocks (MTT 4: 2..4 tokens,
 * dense rows) take 8, 6 or 4 slots, p.ring_slots rounded down (session.cu sizes them so) */
template <int T, int MTT = 1, bool TWO = false> DEVT void mm_ring_slots(const g4c_op *op, const g4c_params &p, float *sm) {
    constexpr int RM = ring_of<T>::R;
    const int r = p.ring_slots > 0 && p.ring_slots < RM ? p.ring_slots : RM;
    if constexpr (MTT > 1) {
        if (r == RM) return mm_ring<T, RM, MTT, TWO>(op, p, sm);
        if (r >= 6) return mm_ring<T, 6, MTT, TWO>(op, p, sm);
        return mm_ring<T, 4, MTT, TWO>(op, p, sm);
    } else {
        if constexpr (RM > 5) {
            if (r == 7) return mm_ring<T, 7, 1, TWO>(op, p, sm);
            if (r == 6) return mm_ring<T, 6, 1, TWO>(op, p, sm);
            if (r == 5) return mm_ring<T, 5, 1, TWO>(op, p, sm);
        }
        if (r == 4) return mm_ring<T, 4, 1, TWO>(op, p, sm);
        mm_ring<T, RM, 1, TWO>(op, p, sm);
    }
}

/* ---- the staged decode: one kernel per stage, chained by programmatic dependent launch ---------- */

/* A one-token stage of 4- or 8-bit rows with its first load group in flight before the wait
 * (p.mm_pipe == 2, which also gives verify blocks mm_stage_early_v; stage_run, kernel 2): weights depend on no stage, so each warp's first chunks of
 * its first item travel while the stage before finishes, its input tile is built and quantised
 * (qi_block), instead of after. Otherwise it is op_matmul's one-token tile through mm_tile_pipe:
 * the same input, operations and order, so the same bits. */
template <unsigned TM, int T>
DEVT void mm_stage_early(const g4c_op *op, const g4c_params &p, float *sm) {
    constexpr int U8 = (TM & G4C_KM_LEAN) ? 2 : (TM & (G4C_KM_Q4 | G4C_KM_Q8)) ? 4 : 8; /* mm_tile_t's */
    const tail_t tl = tail_of(sm, p);
    const mm_shape sh = mm_shape_of(op, p);
    const int amax = mm_amax(op, sh), m_begin = op->lm ? p.lm_from : 0;
    mm_tile_pipe<T, 1, dot_u<T, 1, U8>::U / 2, true>(op, p, 0, sm, m_begin, 1, amax, blockIdx.x, gridDim.x);
    if (op->pf_next >= 0) mm_prefetch_first(p.ops + op->pf_next, p, threadIdx.x >> 5);
    __syncthreads();
    if (amax) finish_argmax(p, m_begin, p.M, amax, 0, 0, tl.flag);
}

/* mm_stage_early for a verify block of 2..4 tokens (p.mm_pipe == 2; kernel 2 of the blocks'
 * instantiations): op_matmul's one tile of mt rows (mm_input: load_rows and the integer form)
 * built after the wait with the first group in flight, then mm_tile_pipe at four tokens, whose
 * operations and order are dot2's: the same bits. */
template <unsigned TM, int T>
DEVT void mm_stage_early_v(const g4c_op *op, const g4c_params &p, float *sm) {
    const tail_t tl = tail_of(sm, p);
    const mm_shape sh = mm_shape_of(op, p);
    const int amax = mm_amax(op, sh), m_begin = op->lm ? p.lm_from : 0, mt = p.M - m_begin;
    auto pre = [&]() {
        stage_wait(p, op);
        mm_input<TM>(op, p, 0, sm, m_begin, mt, blockIdx.x == 0, T);
        if (p.strace) st_mark(p, op, 2, global_ns());
    };
    mm_tile_pipe<T, 4, dot_u<T, 4, 4>::U / 2, false>(op, p, 0, sm, m_begin, mt, amax, blockIdx.x, gridDim.x, pre);
    if (op->pf_next >= 0) mm_prefetch_first(p.ops + op->pf_next, p, threadIdx.x >> 5);
    __syncthreads();
    if (amax) finish_argmax(p, m_begin, p.M, amax, 0, 0, tl.flag);
}

/* one stage's work in its staged kernel (below), from the shared-memory copy op of its description */
template <unsigned TM, int MM>
__device__ __forceinline__ void stage_run(const g4c_op *op, const g4c_params &p, float *sm) {
    constexpr bool KQ = (TM & (G4C_KM_Q4 | G4C_KM_Q8)) != 0; /* mm_item_out's two-lane epilogue */
    if constexpr (MM == 3 && (TM & G4C_KM_M1) == 0) { /* verify blocks' rings: bf16 rows (session.cu sends no other) */
        if (op->kind == G4C_OP_MATMUL && !(p.skip & op->cls) && op->part[0].w.type == G4C_BF16) {
            if constexpr ((TM & (1u << G4C_BF16)) != 0) mm_ring_slots<G4C_BF16, 4, KQ>(op, p, sm);
            return;
        }
        stage_wait(p, op);
        return;
    }
    if constexpr (MM == 3) { /* the ring kernel waits inside mm_ring, after its first copies */
        if (op->kind == G4C_OP_MATMUL && !(p.skip & op->cls)) {
            switch (op->part[0].w.type) { /* types outside the instantiation's mask never reach it */
            case G4C_BF16: if constexpr ((TM & (1u << G4C_BF16)) != 0) mm_ring_slots<G4C_BF16, 1, KQ>(op, p, sm); return;
            case G4C_F16: if constexpr ((TM & (1u << G4C_F16)) != 0) mm_ring_slots<G4C_F16, 1, KQ>(op, p, sm); return;
            case G4C_Q8: if constexpr ((TM & (1u << G4C_Q8)) != 0) mm_ring_slots<G4C_Q8, 1, KQ>(op, p, sm); return;
            case G4C_Q4: if constexpr ((TM & (1u << G4C_Q4)) != 0) mm_ring_slots<G4C_Q4, 1, KQ>(op, p, sm); return;
            default: if constexpr ((TM & (1u << G4C_F32)) != 0) mm_ring_slots<G4C_F32, 1, KQ>(op, p, sm); return;
            }
        }
        stage_wait(p, op);
        return;
    }
    /* attention with p.attn_pre waits inside op_attn, after its first item's earlier K/V rows; kernel
     * 4 (attention stages whose items fit half an SM: session.cu staged_graph) runs nothing else */
    if constexpr (MM == 0 || MM == 4) {
        if (op->kind == G4C_OP_ATTN && (p.attn_pre || MM == 4) && !(p.skip & op->cls)) {
            if (!p.attn_pre) stage_wait(p, op);
            int extra = 0;
            op_attn<false>(op, p, ldi(&p.ctl->pos), sm, 0ull, extra, p.attn_pre != 0);
            return;
        }
    }
    if constexpr (MM == 4) {
        stage_wait(p, op);
        return;
    }
    constexpr bool QR = (TM & ((1u << G4C_Q4) | (1u << G4C_Q8))) != 0; /* the instantiation has 4- or 8-bit rows */
    if constexpr (MM == 2 && QR && (TM & G4C_KM_M1) != 0) { /* one token, 4- or 8-bit rows: loads before the wait */
        if (p.mm_pipe == 2 && !p.trace && op->kind == G4C_OP_MATMUL && !(p.skip & op->cls) && (op->lm ? p.lm_from : 0) < p.M &&
            mm_shape_of(op, p).total > 0) {
            const int wt = op->part[0].w.type;
            if constexpr ((TM & (1u << G4C_Q4)) != 0)
                if (wt == G4C_Q4) {
                    mm_stage_early<TM, G4C_Q4>(op, p, sm);
                    return;
                }
            if constexpr ((TM & (1u << G4C_Q8)) != 0)
                if (wt == G4C_Q8) {
                    mm_stage_early<TM, G4C_Q8>(op, p, sm);
                    return;
                }
        }
    }
    if constexpr (MM == 2 && QR && (TM & G4C_KM_M1) == 0) { /* verify blocks of 2..4 tokens likewise */
        const int mt = p.M - (op->lm ? p.lm_from : 0);
        if (p.mm_pipe == 2 && !p.trace && op->kind == G4C_OP_MATMUL && !(p.skip & op->cls) && mt >= 2 && mt <= 4 &&
            mt * G4C_TILE_LD(op->part[0].w.cols) <= p.smem_in_floats && mm_shape_of(op, p).total > 0) {
            const int wt = op->part[0].w.type; /* op_matmul's one tile, mm_tile_t's four-token instance */
            if constexpr ((TM & (1u << G4C_Q4)) != 0)
                if (wt == G4C_Q4) {
                    mm_stage_early_v<TM, G4C_Q4>(op, p, sm);
                    return;
                }
            if constexpr ((TM & (1u << G4C_Q8)) != 0)
                if (wt == G4C_Q8) {
                    mm_stage_early_v<TM, G4C_Q8>(op, p, sm);
                    return;
                }
        }
    }
    if (p.stage_pf > 0 && op->kind == G4C_OP_MATMUL && !(p.skip & op->cls)) {
        const int warp = threadIdx.x >> 5, S = op->split;
        if ((threadIdx.x & 31) == 0 && warp % S == 0) {
            const mm_shape sh = mm_shape_of(op, p);
            const int tpb = G4C_WARPS / S, nteams = gridDim.x * tpb;
#pragma unroll 1
            for (int k = 0, it = team_first(p, blockIdx.x, gridDim.x, tpb, warp / S); k < p.stage_pf && it < sh.total; k++, it += nteams)
                mm_prefetch_item(op, sh, it);
        }
    }
    stage_wait(p, op);
    if (p.skip & op->cls) return;
    const int pos0 = ldi(&p.ctl->pos);
    int extra = 0;
    if constexpr (MM) {
        if (op->kind == G4C_OP_MATMUL) op_matmul<MM == 1 ? (TM | G4C_KM_LEAN) : TM>(op, p, 0, sm, 0ull, extra);
        return;
    }
    switch (op->kind) {
    case G4C_OP_EMBED: op_embed(op, p); break;
    case G4C_OP_MATMUL: op_matmul<TM>(op, p, 0, sm, 0ull, extra); break;
    case G4C_OP_HEADS: op_heads(op, p, pos0, sm); break;
    case G4C_OP_ATTN: op_attn<false>(op, p, pos0, sm, 0ull, extra); break;
    case G4C_OP_PLE: op_ple(op, p); break;
    case G4C_OP_MOE_ROUTE: op_moe_route(op, p, sm); break;
    case G4C_OP_EXPERT: op_expert<TM>(op, p, sm); break;
    case G4C_OP_MOE_COMBINE: op_moe_combine(op, p, sm); break;
    default: break;
    }
}

/* Stage s of a program of fewer than G4C_WIDE_M tokens (TM with G4C_KM_M1: one token, only its tile
 * compiled), as a launch of its own (MM 0: any stage but matmuls, one block per SM; MM 1: matmul
 * stages of one token, two blocks per SM (128 registers, fewer loads ahead: G4C_KM_LEAN); MM 2:
 * matmul stages, one block per SM; MM 3: one-token matmul stages through shared-memory weight
 * rings (mm_ring), half an SM each, one block per SM; without G4C_KM_M1, a verify block's bf16
 * matmul stages through rings at four tokens, a whole SM and 255 registers): the same stage
 * code as the persistent kernel, so the same values bit for bit; what replaces the grid barrier is
 * the launch boundary. Each kernel first lets the next one start launching (its blocks become
 * resident wherever this one's leave room), copies its stage description into shared memory and,
 * with p.stage_pf > 0, asks L2 for its first weight rows - all of
 * which depend on nothing the previous stage writes - and only then waits until the previous
 * kernel has finished and its writes are visible. Waiting is transitive (no kernel completes before
 * its own wait returns), so the stream's order of writes holds across the whole chain. */
template <unsigned TM, int MM>
__global__ void __launch_bounds__(G4C_THREADS, MM == 1 || MM == 4 || (MM == 3 && (TM & G4C_KM_M1) != 0) ? 2 : 1) g4c_stage_kernel(const __grid_constant__ g4c_params p, int s) {
    extern __shared__ __align__(16) float sm[];
    static_assert((TM & (G4C_KM_WIDE | G4C_KM_MMA | G4C_KM_IQ)) == 0, "a staged kernel runs the narrow kernels' stages");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const tail_t tl = tail_of(sm, p);
    {
        const int *src = reinterpret_cast<const int *>(p.ops + s);
        int *dst = reinterpret_cast<int *>(tl.ops);
#pragma unroll 1
        for (int i = threadIdx.x; i < (int)(sizeof(g4c_op) / 4); i += G4C_THREADS) dst[i] = __ldg(src + i);
    }
    __syncthreads();
    const g4c_op *op = tl.ops;
    if (p.strace) st_mark(p, op, 0, global_ns()); /* resident, its description copied */
    stage_run<TM, MM>(op, p, sm);
    if (p.strace) { /* the block's end: after its last thread */
        __syncthreads();
        st_mark(p, op, 3, global_ns());
    }
}
template <unsigned TM, int MM> const void *g4c_stage_fn() { return (const void *)g4c_stage_kernel<TM, MM>; }
#endif
