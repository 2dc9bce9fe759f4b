/* A persistent pool of worker threads for data-parallel loops.
 *
 * The caller's thread takes part as worker 0. Work is split into contiguous ranges of output
 * items; the exactness contract relies on each item being computed by one thread with the same
 * code whatever the split, so nothing here ever splits a reduction. */
#ifndef G4_UTIL_THREADPOOL_H
#define G4_UTIL_THREADPOOL_H
#include "g4.h"

typedef struct g4_threadpool g4_threadpool;

/* fn computes items [begin, end) ; tid is 0..n_threads-1. */
typedef void (*g4_range_fn)(void *ctx, int begin, int end, int tid);

g4_status g4_threadpool_create(int n_threads, g4_threadpool **out, g4_error *err);
void g4_threadpool_free(g4_threadpool *p);
int g4_threadpool_size(const g4_threadpool *p);

/* Runs fn over [0, n) in contiguous ranges whose starts are multiples of `align` (>= 1), claimed
 * by the threads as they become free (a thread may get several), and returns when all are
 * done. */
void g4_parallel_for(g4_threadpool *p, int n, int align, g4_range_fn fn, void *ctx);
#endif
