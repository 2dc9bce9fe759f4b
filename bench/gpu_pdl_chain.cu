/* gpu_pdl_chain: can a batch-1 decode token run as a chain of one kernel per stage, launched with
 * programmatic dependent launch (PDL) from a CUDA graph, and stream its weights near the memory
 * bandwidth?
 *
 * The persistent decode kernel (src/cuda/forward.cuh) and the lean prototype (gpu_lean_decode.cu)
 * separate dependent matmuls with grid barriers, and a stage's weights cannot usefully be fetched
 * before its barrier. Here every stage is its own kernel. With PDL a kernel's blocks start while
 * the previous kernel still runs (`griddepcontrol.launch_dependents` at its start), issue the
 * bulk copies (cp.async.bulk) of their first weights into a shared-memory ring, and only then wait
 * for the previous kernel's results (`griddepcontrol.wait`): the dependency wait overlaps the
 * weight stream, which is what the barrier designs could not do.
 *
 * The chain is a Gemma 4 decode token's stage sequence with the real shapes (per layer: q/k/v
 * (KV-shared layers: q only), an attention stand-in (reads q, writes the attention output; no
 * K/V), o, gate/up, down, the PLE gate and projection; then the LM head), bf16 weights, f32
 * activations; every matmul's input is the previous stage's output. No norms, GELU or softmax:
 * this measures streaming and dependencies only. Each block owns a contiguous band of rows, copied
 * by whole rows per ring slot; the warps of a row each take a fixed segment and the segments' sums
 * are added in a fixed order (deterministic).
 *
 * Modes (--modes, comma list): 0 = PDL, copies issued before the wait (the design); 1 = PDL,
 * copies issued after the wait; 2 = no PDL (each kernel starts after the previous one ends); 3 =
 * PDL without weights (the dependency chain alone). Prints ms per token, GB/s of weights and the
 * share of the read bandwidth measured by a plain read kernel in the same run.
 *
 * Build: nvcc -O3 -std=c++17 -arch=sm_90a -o gpu_pdl_chain bench/gpu_pdl_chain.cu
 */
#include "gpu_proto.cuh"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

enum { THREADS = 256, WARPS = THREADS / 32, SLOT_MAX = 24 * 1024, SMEM_MAX = 104 * 1024, MAX_SLOTS = 8, HDR = 8 * MAX_SLOTS + 4 * WARPS + 4 * MAX_SLOTS };
enum { MODE_PDL_EARLY = 0, MODE_PDL_LATE = 1, MODE_PLAIN = 2, MODE_NO_WEIGHTS = 3 };
/* a run: copies (mode above), PDL on/off, claimed chunks or fixed bands, blocks per SM, smem budget */
struct Run {
    int mode, pdl, dyn, per_sm, budget;
    const char *what;
    int xg; /* x read from global memory (L1), not staged in shared memory */
};
static const Run RUNS[] = {
    {MODE_PDL_EARLY, 1, 0, 1, 104 << 10, "PDL, copies before the wait, fixed bands", 0},
    {MODE_PDL_LATE, 1, 0, 1, 104 << 10, "PDL, copies after the wait, fixed bands", 0},
    {MODE_PLAIN, 0, 0, 1, 104 << 10, "no PDL, fixed bands", 0},
    {MODE_NO_WEIGHTS, 1, 0, 1, 104 << 10, "PDL, no weights (the dependency chain alone)", 0},
    {MODE_PDL_EARLY, 1, 1, 1, 104 << 10, "PDL, copies before the wait, claimed chunks", 0},
    {MODE_PLAIN, 0, 1, 1, 104 << 10, "no PDL, claimed chunks", 0},
    {MODE_PLAIN, 0, 1, 2, 104 << 10, "no PDL, claimed chunks, 2 blocks per SM", 0},
    {MODE_PDL_EARLY, 1, 1, 2, 52 << 10, "PDL, copies before the wait, claimed chunks, 2 blocks per SM of 52 KB", 0},
    {MODE_NO_WEIGHTS, 0, 0, 1, 104 << 10, "no PDL, no weights (the dependency chain alone)", 0},
    {MODE_PDL_EARLY, 1, 0, 2, 52 << 10, "PDL, copies before the wait, fixed bands, 2 blocks per SM of 52 KB", 0},
    {MODE_PDL_EARLY, 1, 1, 3, 36 << 10, "PDL, copies before the wait, claimed chunks, 3 blocks per SM of 36 KB", 0},
    {MODE_PDL_EARLY, 1, 1, 2, 52 << 10, "PDL, copies before the wait, claimed chunks, 2 blocks per SM of 52 KB, x from L1", 1},
    {MODE_PDL_EARLY, 1, 1, 4, 26 << 10, "PDL, copies before the wait, claimed chunks, 4 blocks per SM of 26 KB, x from L1", 1},
    {MODE_PDL_EARLY, 1, 0, 2, 52 << 10, "PDL, copies before the wait, fixed bands, 2 blocks per SM of 52 KB, x from L1", 1},
    {MODE_PDL_EARLY, 1, 0, 3, 36 << 10, "PDL, copies before the wait, fixed bands, 3 blocks per SM of 36 KB, x from L1", 1},
    {MODE_PDL_EARLY, 1, 0, 4, 26 << 10, "PDL, copies before the wait, fixed bands, 4 blocks per SM of 26 KB, x from L1", 1},
};
enum { NRUNS = sizeof RUNS / sizeof RUNS[0] };

__device__ static inline void mb_wait(uint64_t *mb, unsigned parity) {
    for (;;) {
        uint32_t done;
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_u32(mb)), "r"(parity)
                     : "memory");
        if (done) return;
    }
}

/* y[r] = W[r] · x over rows [0, N); W bf16 row-major [N][K]. Work comes in chunks of rps rows
 * (a power of two up to 32; rps rows' bytes: one ring slot), nslot slots. With cnt (a per-stage counter,
 * zeroed before the token) blocks claim chunks as they go (the first nslot before the dependency
 * wait), so blocks that share an SM share its work; without it each block owns a fixed band. */
template <bool Q4>
__global__ void __launch_bounds__(THREADS, 2)
    matvec(const uint8_t *__restrict__ W, const float *__restrict__ scl, const float *x, float *y, int N, int K, int rps,
           int nslot, int mode, int pdl, unsigned *cnt, int xg) {
    extern __shared__ __align__(128) uint8_t sm[];
    uint64_t *mb = (uint64_t *)sm;                  /* [MAX_SLOTS] */
    float *red = (float *)(sm + 8 * MAX_SLOTS);     /* [WARPS] */
    int *ids = (int *)(red + WARPS);                /* [MAX_SLOTS] the chunk in each slot */
    float *xs = (float *)(ids + MAX_SLOTS);         /* [K] */
    uint8_t *ring = (uint8_t *)(xs + (xg ? 0 : ((K + 31) / 32) * 32));
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int total = (N + rps - 1) / rps; /* chunks in the stage */
    int c0 = 0, c1 = total;                /* static bands: the block's chunks */
    if (!cnt) {
        c0 = (int)((long)total * blockIdx.x / gridDim.x);
        c1 = (int)((long)total * (blockIdx.x + 1) / gridDim.x);
    }
    const size_t rowb = Q4 ? (size_t)K / 2 : (size_t)K * 2, slotb = rowb * rps;
    const bool weights = mode != MODE_NO_WEIGHTS;
    if (tid < nslot) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(mb + tid)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    int next = c0; /* static: the next chunk to issue */
    /* thread 0: the next chunk of the block (or -1) into slot k, its copy issued */
    auto issue = [&](int k) {
        int c = -1;
        if (cnt) {
            c = (int)atomicAdd(cnt, 1u);
            if (c >= total) c = -1;
        } else if (next < c1) {
            c = next++;
        }
        ids[k] = c;
        if (c >= 0) {
            const int a = c * rps, n = min(rps, N - a);
            bulk_copy(ring + (size_t)k * slotb, W + (size_t)a * rowb, (unsigned)(n * rowb), mb + k);
        }
    };
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (weights && mode != MODE_PDL_LATE && tid == 0)
        for (int k = 0; k < nslot; k++) issue(k);
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (weights && mode == MODE_PDL_LATE && tid == 0)
        for (int k = 0; k < nslot; k++) issue(k);
    if (!xg)
        for (int i = tid; i < K; i += THREADS) xs[i] = __ldcg(x + i);
    __syncthreads();
    const float *xsrc = xg ? x : xs; /* after the dependency wait x is final: read-only loads are safe */
    if (!weights) {
        if (blockIdx.x == 0)
            for (int r = tid; r < N; r += THREADS) y[r] = xg ? __ldg(x + r % K) : xs[r % K];
        return;
    }
    /* rps < WARPS: wpr warps per row, each a fixed segment; rps >= WARPS: each warp whole rows
     * warp, warp + WARPS, ... of the chunk */
    const int wpr = rps >= WARPS ? 1 : WARPS / rps, rpw = rps > WARPS ? rps / WARPS : 1, seg = K / wpr;
    for (int it = 0;; it++) {
        const int k = it % nslot, c = ids[k];
        if (c < 0) break; /* slots are refilled in order, so the first empty one ends the stage */
        mb_wait(mb + k, (unsigned)(it / nslot) & 1);
        const int a = c * rps, n = min(rps, N - a);
        for (int j = 0; j < rpw; j++) {
            const int row = rps >= WARPS ? warp + j * WARPS : warp / wpr, part = rps >= WARPS ? 0 : warp % wpr;
            float acc0 = 0.0f, acc1 = 0.0f;
            if (row < n) {
                const uint4 *wp =
                    (const uint4 *)(ring + (size_t)k * slotb + (size_t)row * rowb + (size_t)part * seg * (Q4 ? 1 : 4) / 2);
                const float *xp = xsrc + (size_t)part * seg;
                auto ldx = [&](int e) { return xg ? __ldg((const float4 *)(xp + e)) : *(const float4 *)(xp + e); };
                if (Q4) {
                    /* 16 bytes (32 codes) per piece, pieces in groups of 32 (the last may be short,
                     * P pieces); in piece l of a group, word h holds the group's elements
                     * h·8P + 8l … + 7 (byte b: elements 2b, low nibble, and 2b + 1), so the lanes
                     * read x in consecutive 32-byte runs (no shared-memory bank conflicts) */
                    const int np = seg / 32;
                    for (int i = lane; i < np; i += 32) {
                        const uint4 w = wp[i];
                        const unsigned ws[4] = {w.x, w.y, w.z, w.w};
                        const int g = i / 32, P = min(32, np - 32 * g), base = 1024 * g + 8 * (i % 32);
#pragma unroll
                        for (int h = 0; h < 4; h++) {
                            const unsigned lo = ws[h] & 0x0F0F0F0Fu, hi = (ws[h] >> 4) & 0x0F0F0F0Fu;
                            const float4 xa = ldx(base + 8 * P * h), xb = ldx(base + 8 * P * h + 4);
                            const float z = 8388616.0f; /* 2^23 + 8: the code's float minus its centre */
                            acc0 = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7540u)) - z, xa.x, acc0);
                            acc1 = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7540u)) - z, xa.y, acc1);
                            acc0 = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7541u)) - z, xa.z, acc0);
                            acc1 = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7541u)) - z, xa.w, acc1);
                            acc0 = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7542u)) - z, xb.x, acc0);
                            acc1 = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7542u)) - z, xb.y, acc1);
                            acc0 = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7543u)) - z, xb.z, acc0);
                            acc1 = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7543u)) - z, xb.w, acc1);
                        }
                    }
                } else {
                    for (int i = lane; i < seg / 8; i += 32) {
                        const uint4 w = wp[i];
                        const float4 x0 = ldx(8 * i), x1 = ldx(8 * i + 4);
                        acc0 = fmaf(__uint_as_float(w.x << 16), x0.x, acc0);
                        acc1 = fmaf(__uint_as_float(w.x & 0xffff0000u), x0.y, acc1);
                        acc0 = fmaf(__uint_as_float(w.y << 16), x0.z, acc0);
                        acc1 = fmaf(__uint_as_float(w.y & 0xffff0000u), x0.w, acc1);
                        acc0 = fmaf(__uint_as_float(w.z << 16), x1.x, acc0);
                        acc1 = fmaf(__uint_as_float(w.z & 0xffff0000u), x1.y, acc1);
                        acc0 = fmaf(__uint_as_float(w.w << 16), x1.z, acc0);
                        acc1 = fmaf(__uint_as_float(w.w & 0xffff0000u), x1.w, acc1);
                    }
                }
            }
            float v = acc0 + acc1;
#pragma unroll
            for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (rps >= WARPS) {
                if (lane == 0 && row < n) y[a + row] = Q4 ? v * __ldg(scl + a + row) : v;
            } else if (lane == 0) {
                red[warp] = v;
            }
        }
        __syncthreads(); /* every warp is done with the slot (and has its partial in red) */
        if (rps < WARPS && tid < n) {
            float s = 0.0f;
            for (int j = 0; j < wpr; j++) s += red[tid * wpr + j];
            y[a + tid] = Q4 ? s * __ldg(scl + a + tid) : s;
        }
        __syncthreads(); /* red and ids[k] are rewritten below */
        if (tid == 0) {
            fence_proxy_async();
            issue(k);
        }
        __syncthreads();
    }
}

/* Attention of one decode token over a K/V cache of `ctx` positions (f32, [nkv][ctx][D], D =
 * 256), the query heads' rows q[h·D ..] from the q/k/v stage. A block per (query head, chunk of kc
 * keys): warps take keys (a lane holds 8 of the D elements), the chunk's softmax partial (max,
 * sum, weighted V rows: a thread per element) goes to part[h][chunk]; the last block of a head to
 * finish (a counter per head, reset by that block) merges the head's chunks in chunk order into
 * out[h·D ..]. Before the dependency wait each block asks L2 for its chunk's K/V rows (they do not
 * depend on the previous stage). */
enum { AD = 256, KCMAX = 256 };
__global__ void __launch_bounds__(THREADS)
    attention(const float *q, const float *Kc, const float *Vc, float *part, unsigned *cnt, float *out, int nq, int nkv, int ctx,
              int kc, int pdl) {
    __shared__ float sc[KCMAX], qs[AD];
    __shared__ bool last;
    const int nch = (ctx + kc - 1) / kc, h = blockIdx.x / nch, ch = blockIdx.x % nch, g = h / (nq / nkv);
    const int k0 = ch * kc, k1 = min(ctx, k0 + kc), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const float *Kh = Kc + (size_t)g * ctx * AD, *Vh = Vc + (size_t)g * ctx * AD;
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (size_t o = (size_t)tid * 128; o < (size_t)(k1 - k0) * AD * 4; o += (size_t)THREADS * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)(Kh + (size_t)k0 * AD) + o));
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)(Vh + (size_t)k0 * AD) + o));
    }
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    qs[tid] = __ldcg(q + (size_t)h * AD + tid); /* THREADS == AD */
    __syncthreads();
    for (int k = k0 + warp; k < k1; k += WARPS) {
        const float4 *kr = (const float4 *)(Kh + (size_t)k * AD) + 2 * lane;
        const float4 a = __ldg(kr), b = __ldg(kr + 1);
        const float *qq = qs + 8 * lane;
        float v = a.x * qq[0] + a.y * qq[1] + a.z * qq[2] + a.w * qq[3] + b.x * qq[4] + b.y * qq[5] + b.z * qq[6] + b.w * qq[7];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sc[k - k0] = v * 0.0625f; /* 1/sqrt(D) */
    }
    __syncthreads();
    float m = -INFINITY;
    for (int k = 0; k < k1 - k0; k++) m = fmaxf(m, sc[k]);
    float l = 0.0f, acc = 0.0f;
    for (int k = 0; k < k1 - k0; k++) {
        const float p = __expf(sc[k] - m);
        l += p;
        acc = fmaf(p, __ldg(Vh + (size_t)(k0 + k) * AD + tid), acc);
    }
    float *pp = part + ((size_t)h * nch + ch) * (AD + 2);
    pp[2 + tid] = acc;
    if (tid == 0) {
        pp[0] = m;
        pp[1] = l;
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(cnt + h, 1u) == (unsigned)nch - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float M = -INFINITY, Ls = 0.0f, A = 0.0f;
    for (int c = 0; c < nch; c++) {
        const float *pc = part + ((size_t)h * nch + c) * (AD + 2);
        const float mc = __ldcg(pc), lc = __ldcg(pc + 1), oc = __ldcg(pc + 2 + tid), mn = fmaxf(M, mc);
        const float ea = __expf(M - mn), eb = __expf(mc - mn);
        Ls = Ls * ea + lc * eb;
        A = A * ea + oc * eb;
        M = mn;
    }
    out[(size_t)h * AD + tid] = A / Ls;
    if (tid == 0) cnt[h] = 0;
}

__global__ void fill_bf16(uint16_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ seed;
        h ^= h >> 15;
        h *= 0x2c1b3c6dU;
        h ^= h >> 12;
        const float f = ((float)(h & 0xffff) / 65536.0f - 0.5f) * 0.05f;
        p[i] = (uint16_t)(__float_as_uint(f) >> 16);
    }
}

__global__ void read_bw(const uint4 *p, size_t n, unsigned *sink) {
    unsigned a = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        a ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (a == 0x12345678u) *sink = a;
}

struct Stage {
    bool attn; /* attention: N = query heads, K = KV heads, woff = the layer's cache index */
    int N, K;
    size_t woff, soff; /* byte offset of W in the weights buffer; Q4: row offset of its scales */
    int in, out; /* activation buffer indices */
};

struct Arch {
    const char *name;
    int layers, hidden, q, kv, inter, inter_wide, wide_from, shared_from, ple;
};
static const Arch ARCHS[] = {
    {"e2b", 35, 1536, 2048, 256, 6144, 12288, 15, 15, 256},
    {"e4b", 42, 2560, 2048, 512, 10240, 10240, 42, 24, 256},
    {"31b", 60, 5376, 8192, 4096, 21504, 21504, 60, 60, 0},
};

int main(int argc, char **argv) {
    const char *arch = "e4b", *modes = "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15";
    int reps = 20, layers = -1, q4 = 0, ctx = 128;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--arch") && i + 1 < argc) arch = argv[++i];
        else if (!strcmp(argv[i], "--modes") && i + 1 < argc) modes = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--storage") && i + 1 < argc) q4 = !strcmp(argv[++i], "q4");
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--arch e2b|e4b|31b] [--storage bf16|q4] [--ctx N] [--modes RUN,...] [--reps N] [--layers N]\n", argv[0]);
            return 2;
        }
    }
    const Arch *A = NULL;
    for (const Arch &a : ARCHS)
        if (!strcmp(a.name, arch)) A = &a;
    if (!A) {
        fprintf(stderr, "unknown arch %s\n", arch);
        return 2;
    }
    const int L = layers > 0 ? layers : A->layers, V = 262144, H = A->hidden;
    /* the stage list; activation buffers: 0 = the hidden state, 1 = q/k/v, 2 = attention out,
     * 3 = gate/up, 4 = PLE gate */
    std::vector<Stage> st;
    size_t wtot = 0, stot = 0; /* weight bytes, scale rows */
    auto mm = [&](int N, int K, int in, int out) {
        st.push_back({false, N, K, wtot, stot, in, out});
        wtot += (size_t)N * K * (q4 ? 1 : 4) / 2;
        stot += (size_t)N;
    };
    for (int l = 0; l < L; l++) {
        const int I = l >= A->wide_from ? A->inter_wide : A->inter;
        mm(A->q + (l >= A->shared_from ? 0 : 2 * A->kv), H, 0, 1);
        st.push_back({true, A->q / AD, A->kv / AD, (size_t)(l >= A->shared_from ? A->shared_from - 1 : l), 0, 1, 2});
        mm(H, A->q, 2, 0);
        mm(2 * I, H, 0, 3);
        mm(H, I, 3, 0);
        if (A->ple) {
            mm(A->ple, H, 0, 4);
            mm(H, A->ple, 4, 0);
        }
    }
    mm(V, H, 0, 5); /* LM head into buffer 5 */
    const size_t wbytes = wtot;
    int dev = 0, nsm = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("%s, %d SMs; %s, %d layers: %zu stages, %.3f GB of %s weights per token\n", prop.name, nsm, A->name, L, st.size(),
           wbytes / 1e9, q4 ? "4-bit (a scale per row)" : "bf16");
    uint8_t *W;
    float *S;
    CK(cudaMalloc(&W, wbytes));
    CK(cudaMalloc(&S, stot * sizeof(float)));
    fill_bf16<<<4 * nsm, 256>>>((uint16_t *)W, wbytes / 2, 12345u); /* Q4: any bytes are codes */
    {
        std::vector<float> hs(stot);
        for (size_t i = 0; i < stot; i++) hs[i] = 0.002f + 0.001f * (float)(i % 7);
        CK(cudaMemcpy(S, hs.data(), stot * sizeof(float), cudaMemcpyHostToDevice));
    }
    float *act[6];
    const size_t amax = (size_t)V;
    for (int i = 0; i < 6; i++) {
        CK(cudaMalloc(&act[i], amax * sizeof(float)));
        std::vector<float> h(amax);
        for (size_t k = 0; k < amax; k++) h[k] = (float)((k * 37) % 101) / 101.0f - 0.5f;
        CK(cudaMemcpy(act[i], h.data(), amax * sizeof(float), cudaMemcpyHostToDevice));
    }
    /* K/V caches: one per layer with its own K/V (KV-shared layers read the last such layer's) */
    const int nkvl = std::min(L, A->shared_from), nkvh = A->kv / AD, nqh = A->q / AD;
    int kc = 16;
    while (kc < KCMAX && (long)nqh * ((ctx + 2 * kc - 1) / (2 * kc)) >= 2L * nsm) kc *= 2; /* ~2 blocks per SM or more */
    const int nch = (ctx + kc - 1) / kc;
    const size_t kvf = (size_t)nkvh * ctx * AD;
    float *KV, *apart;
    unsigned *acnt;
    CK(cudaMalloc(&KV, 2 * kvf * nkvl * sizeof(float)));
    fill_bf16<<<4 * nsm, 256>>>((uint16_t *)KV, 2 * kvf * nkvl * 2, 777u); /* pairs of small bf16 bit patterns: finite floats */
    CK(cudaMalloc(&apart, (size_t)nqh * nch * (AD + 2) * sizeof(float)));
    CK(cudaMalloc(&acnt, nqh * sizeof(unsigned)));
    CK(cudaMemset(acnt, 0, nqh * sizeof(unsigned)));
    printf("attention: context %d, %d query / %d KV heads of %d, chunks of %d keys; K/V caches %.3f GB read per token\n", ctx,
           nqh, nkvh, AD, kc, 2.0 * kvf * 4 * L / 1e9);
    CK(cudaFuncSetAttribute(matvec<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX + HDR));
    CK(cudaFuncSetAttribute(matvec<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX + HDR));
    unsigned *sink;
    CK(cudaMalloc(&sink, 4));
    CK(cudaDeviceSynchronize());

    /* the read bandwidth: a plain streaming read of the weights, best of 5 */
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(e0));
        read_bw<<<4 * nsm, 512>>>((const uint4 *)W, wbytes / 16, sink);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = fminf(best, ms);
    }
    const double bw = wbytes / (best * 1e-3) / 1e12;
    printf("read bandwidth: %.2f TB/s (%.3f ms for the token's weights)\n", bw, best);

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned *cnts;
    CK(cudaMalloc(&cnts, st.size() * sizeof(unsigned)));
    char mbuf[64];
    snprintf(mbuf, sizeof mbuf, "%s", modes);
    for (char *tok = strtok(mbuf, ","); tok; tok = strtok(NULL, ",")) {
        const int ri = atoi(tok);
        if (ri < 0 || ri >= NRUNS) continue;
        const Run R = RUNS[ri];
        cudaGraph_t g;
        int lm_rps = 1; /* the LM head's rows per slot (its code layout depends on it) */
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        if (R.dyn) CK(cudaMemsetAsync(cnts, 0, st.size() * sizeof(unsigned), s));
        for (size_t si = 0; si < st.size(); si++) {
            const Stage &x = st[si];
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = R.pdl;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            cfg.stream = s;
            cfg.gridDim = dim3(nsm * R.per_sm);
            cfg.blockDim = dim3(THREADS);
            if (x.attn) {
                cfg.gridDim = dim3(x.N * nch);
                const float *Kl = KV + 2 * kvf * x.woff;
                CK(cudaLaunchKernelEx(&cfg, attention, (const float *)act[x.in], Kl, Kl + kvf, apart, acnt, act[x.out], x.N, x.K, ctx, kc,
                                      R.pdl));
                continue;
            }
            const size_t rowb = (size_t)x.K * (q4 ? 1 : 4) / 2;
            int rps = 32; /* rows per slot: a power of two, the slot at most SLOT_MAX */
            while (rps > 1 && rps * rowb > SLOT_MAX) rps /= 2;
            if (si + 1 == st.size()) lm_rps = rps;
            const size_t slotb = rps * rowb, xb = R.xg ? 0 : ((x.K + 31) / 32) * 32 * 4;
            int nslot = (size_t)R.budget > xb ? (int)(((size_t)R.budget - xb) / slotb) : 0;
            if (nslot > MAX_SLOTS) nslot = MAX_SLOTS;
            if (nslot < 2) nslot = 2; /* over budget: still fits the SM alone */
            cfg.dynamicSmemBytes = HDR + xb + (size_t)nslot * slotb;
            CK(cudaLaunchKernelEx(&cfg, q4 ? matvec<true> : matvec<false>, (const uint8_t *)(W + x.woff), (const float *)(S + x.soff),
                                  (const float *)act[x.in], act[x.out], x.N, x.K, rps, nslot, R.mode, R.pdl,
                                  R.dyn ? cnts + si : (unsigned *)NULL, R.xg));
        }
        CK(cudaStreamEndCapture(s, &g));
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, s)); /* warm-up */
        CK(cudaStreamSynchronize(s));
        if (R.mode != MODE_NO_WEIGHTS) { /* a check: the LM head's first rows against the host */
            const Stage &x = st.back();
            const size_t rowb = (size_t)x.K * (q4 ? 1 : 4) / 2;
            std::vector<uint8_t> hw(8 * rowb);
            std::vector<float> hx(x.K), hy(8), hs(8);
            CK(cudaMemcpy(hx.data(), act[x.in], x.K * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hw.data(), W + x.woff, hw.size(), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hs.data(), S + x.soff, 8 * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hy.data(), act[x.out], 8 * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (int r = 0; r < 8; r++) {
                double ref = 0, mag = 0;
                for (int k = 0; k < x.K; k++) {
                    float w;
                    if (q4) { /* the kernel's layout (matvec): segment, group, word, piece, nibble */
                        const int seg = x.K / (lm_rps >= WARPS ? 1 : WARPS / lm_rps), part = k / seg, e = k % seg;
                        const int g = e / 1024, P = std::min(32, seg / 32 - 32 * g), in = e % 1024;
                        const int h = in / (8 * P), l = in % (8 * P) / 8, jj = in % 8;
                        const uint8_t b = hw[r * rowb + (size_t)part * seg / 2 + (size_t)(32 * g + l) * 16 + 4 * h + jj / 2];
                        w = (float)((jj & 1 ? b >> 4 : b & 15) - 8) * hs[r];
                    } else {
                        uint32_t u = (uint32_t)(hw[r * rowb + 2 * k] | hw[r * rowb + 2 * k + 1] << 8) << 16;
                        memcpy(&w, &u, 4);
                    }
                    ref += (double)w * hx[k];
                    mag += fabs((double)w * hx[k]);
                }
                worst = fmax(worst, fabs(ref - hy[r]) / (mag > 0 ? mag : 1));
            }
            if (worst > 1e-5) printf("check FAILED: LM head rows vs double host reference: worst error %.2e of sum |w x|\n", worst);
            /* the last layer's attention, query head 0, against a double host reference */
            const size_t li = st[st.size() - 7 + (A->ple ? 0 : 2)].woff; /* the last attention stage's cache */
            std::vector<float> hq(AD), hk(kvf), hv(kvf), ho(AD);
            CK(cudaMemcpy(hq.data(), act[1], AD * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hk.data(), KV + 2 * kvf * li, kvf * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hv.data(), KV + 2 * kvf * li + kvf, kvf * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(ho.data(), act[2], AD * 4, cudaMemcpyDeviceToHost));
            std::vector<double> sc(ctx);
            double mx = -1e300, den = 0, aw = 0;
            for (int k = 0; k < ctx; k++) {
                double d = 0;
                for (int e = 0; e < AD; e++) d += (double)hq[e] * hk[(size_t)k * AD + e];
                sc[k] = d / 16.0;
                mx = std::max(mx, sc[k]);
            }
            for (int k = 0; k < ctx; k++) den += exp(sc[k] - mx);
            for (int e = 0; e < AD; e++) {
                double o = 0;
                for (int k = 0; k < ctx; k++) o += exp(sc[k] - mx) / den * hv[(size_t)k * AD + e];
                aw = std::max(aw, fabs(o - ho[e]));
            }
            if (aw > 1e-4) printf("check FAILED: attention head 0 vs double host reference: worst error %.2e\n", aw);
            else if (worst <= 1e-5) printf("checks pass (LM head rows %.1e of sum |w x|, attention head 0 %.1e)\n", worst, aw);
        }
        CK(cudaEventRecord(e0, s));
        for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        printf("run %d (%s): %.3f ms per token = %.1f tok/s, %.0f GB/s = %.0f%% of the read bandwidth, %.2f us per stage\n", ri,
               R.what, ms, 1e3 / ms, wbytes / (ms * 1e-3) / 1e9, 100.0 * wbytes / (ms * 1e-3) / 1e12 / bw, 1e3 * ms / st.size());
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    CK(cudaGetLastError());
    return 0;
}
