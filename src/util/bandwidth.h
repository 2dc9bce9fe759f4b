/* Memory read bandwidth, measured the way the kernels stream weights: each of N threads reads its
 * own contiguous slices of a huge-page buffer much larger than the last-level cache with the
 * widest vector loads the CPU has, once as one sequential stream per slice and once as four
 * streams prefetched ahead (what the split matmul loops do); the better pattern counts. Benchmarks print it next to their own GB/s (docs/engineering.md §4). */
#ifndef G4_UTIL_BANDWIDTH_H
#define G4_UTIL_BANDWIDTH_H
#include <stddef.h>

#include "g4.h"

/* Reads a freshly allocated buffer of `bytes` (rounded to 4 KiB; use ≥ 4× the last-level cache)
 * `passes` times per pattern with `threads` threads and stores the best pass in GB/s (10^9 bytes/s). */
g4_status g4_measure_read_bandwidth(int threads, size_t bytes, int passes, double *gbs, g4_error *err);
#endif
