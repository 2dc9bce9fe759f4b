/* Sampler cost per token over Gemma 4's 262,144-entry vocabulary.
 *
 * Logits are drawn as N(0, sigma) and soft-capped at 30 like Gemma's final logits. sigma 6.5
 * puts the largest of 262,144 near 30, the scale of real rows: a handful of tokens hold most of
 * the mass. sigma 4 is a less certain step (at T 0.8 the top-p 0.95 nucleus is about a thousand
 * tokens). sigma 1 is a flat worst case: the nucleus then spans most of the vocabulary. Four
 * different rows rotate so that no single row sits in the caches and branch predictors.
 *
 * Next to the sampler times the program prints the cost of one plain read pass over a row
 * (summing 1 MiB of floats) measured in the same run, the floor for anything that must look at
 * every logit.
 *
 * usage: sampler_bench [iterations per mode, default 300]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "g4_sample.h"
#include "runtime/sampler_internal.h"

enum { V = 262144, ROWS = 4 };

static uint64_t rng_state = 0x853c49e6748fea9bull;
static double uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) * 0x1p-53;
}
static double normal(void) {
    return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

/* Median and mean microseconds per g4_sampler_sample call, with the kernels of `width` lanes
 * (0: the widest this CPU runs). A width the CPU lacks is skipped. */
static int bench_width(const char *name, g4_sampler_options o, int width, float **rows, int iters,
                       double *times) {
    g4_sampler *s = NULL;
    g4_error err = {0};
    g4_status st = g4_sampler_create_width(&o, V, width, &s, &err);
    if (st == G4_ERR_UNSUPPORTED) return 0;
    if (st != G4_OK) {
        fprintf(stderr, "%s: %s\n", name, err.message);
        return 1;
    }
    /* A full penalty window, as after a while of decoding (spread-out tokens; not from the
     * logits' generator, so every mode sees the same rows). */
    for (int i = 0; i < o.penalty_last_n; i++)
        g4_sampler_accept(s, (int32_t)(((int64_t)i * 104729) % V), NULL);
    int32_t tok = 0;
    for (int i = 0; i < 20; i++) g4_sampler_sample(s, rows[i % ROWS], V, &tok, NULL);
    double sum = 0.0;
    long tok_sum = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        if (g4_sampler_sample(s, rows[i % ROWS], V, &tok, &err) != G4_OK) {
            fprintf(stderr, "%s: %s\n", name, err.message);
            g4_sampler_free(s);
            return 1;
        }
        times[i] = now_us() - t0;
        sum += times[i];
        tok_sum += tok;
    }
    printf("  %-34s %9.1f %9.1f   (token checksum %ld)\n", name, median(times, iters), sum / iters,
           tok_sum);
    g4_sampler_free(s);
    return 0;
}

static int bench_mode(const char *name, g4_sampler_options o, float **rows, int iters,
                      double *times) {
    return bench_width(name, o, 0, rows, iters, times);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 300;
    if (iters < 1) iters = 1;
    double *times = malloc((size_t)iters * sizeof *times);
    float *rows[ROWS];
    for (int r = 0; r < ROWS; r++) rows[r] = malloc(V * sizeof(float));
    if (!times) return 1;
    for (int r = 0; r < ROWS; r++)
        if (!rows[r]) return 1;

    volatile float sink = 0.0f;
    const double sigmas[3] = {6.5, 4.0, 1.0};
    const char *shape[3] = {"N(0, 6.5): realistic scale", "N(0, 4): uncertain step",
                            "N(0, 1): flat worst case"};
    printf("sampler_bench: V = %d, %d iterations per mode, microseconds per sample\n", V, iters);
    for (int d = 0; d < 3; d++) {
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < V; i++)
                rows[r][i] = (float)(30.0 * tanh(sigmas[d] * normal() / 30.0));
        if (d == 0) {
            /* The floor: one read pass over a row. */
            double read_times[200];
            for (int i = 0; i < 200; i++) {
                const float *x = rows[i % ROWS];
                double t0 = now_us();
                float acc[16] = {0};
                for (int j = 0; j < V; j += 16)
                    for (int k = 0; k < 16; k++) acc[k] += x[j + k];
                for (int k = 0; k < 16; k++) sink += acc[k];
                read_times[i] = now_us() - t0;
            }
            printf("one read pass over a row (1 MiB): %.1f us median\n", median(read_times, 200));
        }
        printf("\nlogits %s\n  %-34s %9s %9s\n", shape[d], "mode", "median", "mean");
        g4_sampler_options o = g4_sampler_default_options();
        o.seed = 1;
        int bad = 0;
        o.temperature = 0.0f;
        bad |= bench_mode("greedy", o, rows, iters, times);
        o.temperature = 0.8f;
        bad |= bench_mode("temperature 0.8", o, rows, iters, times);
        o.top_k = 40;
        bad |= bench_mode("top-k 40", o, rows, iters, times);
        o.top_k = 0;
        o.top_p = 0.95f;
        bad |= bench_mode("top-p 0.95", o, rows, iters, times);
        o.top_p = 1.0f;
        o.min_p = 0.05f;
        bad |= bench_mode("min-p 0.05", o, rows, iters, times);
        o = g4_sampler_default_options();
        o.seed = 1;
        o.temperature = 1.0f;
        o.top_k = 64;
        o.top_p = 0.95f;
        o.min_p = 0.05f;
        o.repetition_penalty = 1.1f;
        o.presence_penalty = 0.2f;
        o.penalty_last_n = 64;
        bad |= bench_mode("all: pen+T 1+k 64+p .95+min .05", o, rows, iters, times);
        o.top_k = 0;
        bad |= bench_mode("all but top-k", o, rows, iters, times);
        if (d == 0) {
            /* The same work on each vector width this CPU runs (same bits, different speed). */
            o = g4_sampler_default_options();
            o.temperature = 0.8f;
            bad |= bench_width("temperature 0.8, 4 lanes (SSE2)", o, 4, rows, iters, times);
            bad |= bench_width("temperature 0.8, 8 lanes (AVX2)", o, 8, rows, iters, times);
            bad |= bench_width("temperature 0.8, 16 lanes (AVX-512)", o, 16, rows, iters, times);
        }
        if (bad) return 1;
    }
    printf("\n(sink %g)\n", (double)sink);
    for (int r = 0; r < ROWS; r++) free(rows[r]);
    free(times);
    return 0;
}
