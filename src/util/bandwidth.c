#include "util/bandwidth.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"
#include "util/mapped_file.h"
#include "util/threadpool.h"

typedef struct {
    const uint8_t *buf;
    size_t bytes;      /* a multiple of nchunks · 1024 */
    int nchunks;
    int wide;          /* 2: AVX-512, 1: AVX2, 0: scalar */
    int streams;       /* 1: one sequential stream per claimed range; 4: four, prefetched */
    uint64_t sink[64]; /* one slot per thread (8 apart), so the loads cannot be dropped */
} bw_job;

/* Which read pattern reaches the most bandwidth depends on the machine. On the 2-core AVX-512
 * machine these were measured with 2 pinned threads on a 1.5 GB huge-page buffer (GB/s):
 *   1 stream per thread, no prefetch                        32.2
 *   2 / 4 / 8 interleaved streams, no prefetch              33.6 / 33.4 / 33.6
 *   1 stream, prefetcht0 or t1 1-4 KB ahead                 34.5-34.8 (prefetchnta: 16-24)
 *   4 streams, prefetcht0 1 KB ahead                        35.4-36.0
 *   ... with two vpdpbusd per 64 B loaded                   34.7-35.0
 *   interleaved 64 KB chunks instead of halves              0.5-2 less
 * so the probe times both the plain sequential read and four streams prefetched 1 KB ahead (the
 * pattern the split matmul loops use) and reports the better. */
enum { BW_PF = 1024 };

#define BW_STREAMS(name, isa, vec, load, or_, zero, step)                                         \
    __attribute__((target(isa))) static vec name(const uint8_t *p, size_t n, int streams, vec acc) {  \
        if (streams == 4) {                                                                         \
            size_t q = n / 4;                                                                       \
            vec a = acc, b = zero, c = zero, d = zero;                                              \
            for (size_t i = 0; i < q; i += 256) {                                                   \
                const uint8_t *s0 = p + i, *s1 = p + q + i, *s2 = p + 2 * q + i, *s3 = p + 3 * q + i; \
                for (int k = 0; k < 256; k += 64) {                                                 \
                    _mm_prefetch((const char *)s0 + BW_PF + k, _MM_HINT_T0);                        \
                    _mm_prefetch((const char *)s1 + BW_PF + k, _MM_HINT_T0);                        \
                    _mm_prefetch((const char *)s2 + BW_PF + k, _MM_HINT_T0);                        \
                    _mm_prefetch((const char *)s3 + BW_PF + k, _MM_HINT_T0);                        \
                }                                                                                   \
                for (int k = 0; k < 256; k += step) {                                               \
                    a = or_(a, load(s0 + k));                                                       \
                    b = or_(b, load(s1 + k));                                                       \
                    c = or_(c, load(s2 + k));                                                       \
                    d = or_(d, load(s3 + k));                                                       \
                }                                                                                   \
            }                                                                                       \
            return or_(or_(a, b), or_(c, d));                                                       \
        }                                                                                           \
        vec a = acc, b = zero, c = zero, d = zero;                                                  \
        for (size_t i = 0; i < n; i += 4 * step) {                                                  \
            a = or_(a, load(p + i));                                                                \
            b = or_(b, load(p + i + step));                                                         \
            c = or_(c, load(p + i + 2 * step));                                                     \
            d = or_(d, load(p + i + 3 * step));                                                     \
        }                                                                                           \
        return or_(or_(a, b), or_(c, d));                                                           \
    }

#define LOAD512(p) _mm512_load_si512(p)
#define LOAD256(p) _mm256_load_si256((const __m256i *)(p))
BW_STREAMS(read_avx512_v, "avx512f", __m512i, LOAD512, _mm512_or_si512, _mm512_setzero_si512(), 64)
BW_STREAMS(read_avx2_v, "avx2", __m256i, LOAD256, _mm256_or_si256, _mm256_setzero_si256(), 32)

__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n, int streams) {
    return (uint64_t)_mm512_reduce_or_epi64(read_avx512_v(p, n, streams, _mm512_setzero_si512()));
}

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n, int streams) {
    __m256i a = read_avx2_v(p, n, streams, _mm256_setzero_si256());
    return (uint64_t)_mm256_extract_epi64(a, 0) | (uint64_t)_mm256_extract_epi64(a, 3);
}

static uint64_t read_scalar(const uint8_t *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        s |= v;
    }
    return s;
}

static void bw_range(void *ctx, int c0, int c1, int tid) {
    bw_job *j = ctx;
    size_t per = j->bytes / (size_t)j->nchunks;
    const uint8_t *p = j->buf + per * (size_t)c0;
    size_t n = per * (size_t)(c1 - c0);
    uint64_t v = j->wide == 2 ? read_avx512(p, n, j->streams) : j->wide == 1 ? read_avx2(p, n, j->streams) : read_scalar(p, n);
    j->sink[(8 * tid) % 64] |= v;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

g4_status g4_measure_read_bandwidth(int threads, size_t bytes, int passes, double *gbs, g4_error *err) {
    if (threads < 1 || passes < 1 || bytes < 4096)
        return g4_fail(err, G4_ERR_ARG, "bandwidth: need threads >= 1, passes >= 1, bytes >= 4096");
    int nchunks = 4096;
    bytes = (bytes + (size_t)nchunks * 1024 - 1) / ((size_t)nchunks * 1024) * ((size_t)nchunks * 1024);
    /* huge pages where the kernel has them, as the repacked weights the decode streams (with 4 KB
     * pages the same loop reads ~10% slower here: TLB misses, not DRAM) */
    uint8_t *buf = g4_map_anon_huge(bytes);
    if (!buf) return g4_fail(err, G4_ERR_NOMEM, "bandwidth: cannot allocate %zu bytes", bytes);
    memset(buf, 1, bytes); /* fault every page in before timing */
    g4_threadpool *pool;
    g4_status st = g4_threadpool_create(threads, &pool, err);
    if (st) {
        g4_unmap_anon(buf, bytes);
        return st;
    }
    __builtin_cpu_init();
    bw_job j = {buf, bytes, nchunks, __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0, 1, {0}};
    double best = 0;
    for (int p = 0; p < 2 * passes; p++) { /* each pattern `passes` times, alternately */
        j.streams = j.wide && p % 2 ? 4 : 1;
        double t0 = now_s();
        g4_parallel_for(pool, nchunks, 1, bw_range, &j);
        double dt = now_s() - t0;
        if (dt > 0 && bytes / dt > best) best = (double)bytes / dt;
    }
    g4_threadpool_free(pool);
    g4_unmap_anon(buf, bytes);
    *gbs = best * 1e-9;
    return j.sink[0] == 12345 ? G4_OK : G4_OK; /* sink read so the stores count as used */
}
