#include "util/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

/* Workers spin briefly on a generation counter (a decode step issues hundreds of small loops per
 * token, so a futex wake-up per loop would cost more than the loop), then sleep on a condition
 * variable. */
enum { SPIN_ITERS = 20000, YIELD_AFTER = 2000 };

/* The fields every thread touches per job sit on cache lines by who writes them: the job and its
 * generation (the caller, once per job), the ticket counter (every piece claimed), the pending
 * count (each worker once per job), so that a claim or an arrival does not pull the line the
 * others are polling away from them. */
#define G4_LINE 64
struct g4_threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int sleepers; /* workers waiting on cv (a job is broadcast only when there are some) */
    atomic_int stop;
    /* the current job, and its generation (bumped for each job) */
    _Alignas(G4_LINE) g4_range_fn fn;
    void *ctx;
    int count, align;
    atomic_uint gen;
    _Alignas(G4_LINE) atomic_int next; /* the next unclaimed ticket of the current job (run_share) */
    _Alignas(G4_LINE) atomic_int pending; /* workers (excluding the caller) still running the current job
                                               (the member alignments round sizeof up to whole lines) */
};

typedef struct {
    g4_threadpool *p;
    int tid;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Threads claim pieces of `align`-sized units through a shared ticket counter. The first p->n
 * tickets are big pieces, BIG_16THS sixteenths of a thread's fair share each, so every thread
 * starts one long contiguous stream; the rest of the units go in small pieces (1/SMALL_DIV of a
 * fair share), claimed by whichever thread is free, so a thread slowed down by anything else on
 * the machine does not hold the others up for long. Each piece restarts a kernel's row streams
 * (and the hardware prefetchers behind them), which is what the earlier uniform pieces of 1/8 of
 * a share cost. Q4_0 matrices at M = 1 on 2 threads, the piece sizes alternated in one process
 * (30 rounds each, median GB/s; uniform 1/8 -> big 14/16 + small 1/16 -> big 15/16 + small 1/32):
 * 2048 x 1536 50.4 -> 61.7 -> 64.6, 12288 x 1536 68.0 -> 72.1 -> 73.4, 1536 x 6144 63.4 -> 69.5
 * -> 70.6 (and the worst round improved too: 32.2 -> 60.4, 34.5 -> 68.6, 34.2 -> 64.4). */
enum { BIG_16THS = 15, SMALL_DIV = 32 };

static void run_share(g4_threadpool *p, int tid) {
    int n = p->count, a = p->align, nt = p->n;
    int units = (n + a - 1) / a;
    int big = (int)((long)units * BIG_16THS / (16L * nt)), small = units / (SMALL_DIV * nt);
    if (small < 1) small = 1;
    for (;;) { /* ticket k < nt: big piece k (empty when big is 0); then small pieces after them */
        int k = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        long u0 = k < nt ? (long)k * big : (long)big * nt + (long)(k - nt) * small;
        long u1 = u0 + (k < nt ? big : small);
        if (u0 >= units) break;
        if (u1 > units) u1 = units;
        long end = u1 * a < n ? u1 * a : n;
        if (u1 > u0) p->fn(p->ctx, (int)(u0 * a), (int)end, tid);
    }
}

static void *worker_main(void *argp) {
    worker_arg *arg = argp;
    g4_threadpool *p = arg->p;
    int tid = arg->tid;
    free(arg);
    unsigned seen = 0; /* the generation at creation: a job posted before this thread ran is not missed */
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) {
                if (spins < YIELD_AFTER) cpu_relax();
                else sched_yield(); /* someone else may need this core (an oversubscribed machine) */
                continue;
            }
            /* announce the sleep before the last look at gen: a caller that bumps gen after
             * that look sees sleepers > 0 and broadcasts (both sequentially consistent) */
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        run_share(p, tid);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

g4_status g4_threadpool_create(int n_threads, g4_threadpool **out, g4_error *err) {
    *out = NULL;
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 256) return g4_fail(err, G4_ERR_ARG, "thread count %d is above 256", n_threads);
    g4_threadpool *p = aligned_alloc(G4_LINE, sizeof *p); /* a multiple of G4_LINE (its alignment) */
    if (!p) return g4_fail(err, G4_ERR_NOMEM, "out of memory creating thread pool");
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        g4_threadpool_free(p);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory creating thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a) {
            a->p = p;
            a->tid = i;
        }
        if (!a || pthread_create(&p->threads[i], NULL, worker_main, a) != 0) {
            free(a);
            p->n = i; /* only threads 1..i-1 exist */
            g4_threadpool_free(p);
            return g4_fail(err, G4_ERR_NOMEM, "cannot start worker thread %d", i);
        }
    }
    *out = p;
    return G4_OK;
}

void g4_threadpool_free(g4_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->threads)
        for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int g4_threadpool_size(const g4_threadpool *p) { return p->n; }

void g4_parallel_for(g4_threadpool *p, int n, int align, g4_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (align < 1) align = 1;
    if (p->n == 1 || n <= align) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->count = n;
    p->align = align;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) { /* spinning workers see gen; sleeping ones need the signal */
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_share(p, 0);
    /* wait for the workers' last chunks: spin briefly, then yield, so that a worker descheduled
     * by other load on the machine gets this core back instead of watching us spin */
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < YIELD_AFTER) cpu_relax();
        else sched_yield();
    }
}
