/* Model load time: g4_model_load + g4_model_free of each path given, best and median of N runs
 * (page cache warm after the first). Prints numbers; asserts nothing.
 * usage: load_bench [-n N] PATH...   e.g. load_bench /tmp/e2b-mlx4 /tmp/e2b.g4p */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "g4.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int n = 5, first = 1;
    if (argc > 2 && !strcmp(argv[1], "-n")) {
        n = atoi(argv[2]);
        first = 3;
    }
    if (first >= argc || n < 1 || n > 1000) {
        fprintf(stderr, "usage: load_bench [-n N] PATH...\n");
        return 2;
    }
    double *t = malloc(sizeof(double) * (size_t)n);
    for (int a = first; a < argc; a++) {
        for (int i = 0; i < n; i++) {
            g4_model *m;
            g4_error err = {0};
            double t0 = now();
            if (g4_model_load(argv[a], NULL, &m, &err)) {
                fprintf(stderr, "%s: %s\n", argv[a], err.message);
                free(t);
                return 1;
            }
            t[i] = now() - t0;
            g4_model_free(m);
        }
        qsort(t, (size_t)n, sizeof *t, cmp);
        printf("%-40s load: best %8.2f ms, median %8.2f ms (%d runs)\n", argv[a], 1e3 * t[0], 1e3 * t[n / 2], n);
    }
    free(t);
    return 0;
}
