#include "util/bandwidth.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "util/error.h"
#include "util/threadpool.h"

typedef struct {
    const uint8_t *buf;
    size_t bytes;      /* a multiple of 4096 */
    int nchunks;
    int wide;          /* 2: AVX-512, 1: AVX2, 0: scalar */
    uint64_t sink[64]; /* one slot per thread (8 apart), so the loads cannot be dropped */
} bw_job;

__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        a = _mm512_or_si512(a, _mm512_load_si512(p + i));
        b = _mm512_or_si512(b, _mm512_load_si512(p + i + 64));
        c = _mm512_or_si512(c, _mm512_load_si512(p + i + 128));
        d = _mm512_or_si512(d, _mm512_load_si512(p + i + 192));
    }
    a = _mm512_or_si512(_mm512_or_si512(a, b), _mm512_or_si512(c, d));
    return (uint64_t)_mm512_reduce_or_epi64(a);
}

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 128) {
        a = _mm256_or_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_or_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_or_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_or_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d));
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
    uint64_t v = j->wide == 2 ? read_avx512(p, n) : j->wide == 1 ? read_avx2(p, n) : read_scalar(p, n);
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
    bytes = (bytes + (size_t)nchunks * 256 - 1) / ((size_t)nchunks * 256) * ((size_t)nchunks * 256);
    /* huge pages where the kernel has them, as the repacked weights the decode streams (with 4 KB
     * pages the same loop reads ~10% slower here: TLB misses, not DRAM) */
    uint8_t *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return g4_fail(err, G4_ERR_NOMEM, "bandwidth: cannot allocate %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
    madvise(buf, bytes, MADV_HUGEPAGE);
#endif
    memset(buf, 1, bytes); /* fault every page in before timing */
    g4_threadpool *pool;
    g4_status st = g4_threadpool_create(threads, &pool, err);
    if (st) {
        munmap(buf, bytes);
        return st;
    }
    __builtin_cpu_init();
    bw_job j = {buf, bytes, nchunks, __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0, {0}};
    double best = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = now_s();
        g4_parallel_for(pool, nchunks, 1, bw_range, &j);
        double dt = now_s() - t0;
        if (dt > 0 && bytes / dt > best) best = (double)bytes / dt;
    }
    g4_threadpool_free(pool);
    munmap(buf, bytes);
    *gbs = best * 1e-9;
    return j.sink[0] == 12345 ? G4_OK : G4_OK; /* sink read so the stores count as used */
}
