/* Matmul kernels on E2B-like shapes: weight-streaming GB/s at M = 1 (decode) with 1 and 2
 * threads next to the machine's measured read bandwidth, and GFLOP/s at M = 64 (prefill).
 *
 * usage: matmul_bench [--quick | --hot] [--isa scalar|avx2|avx512] [--filter TYPE_SUBSTRING] [--mb N]
 *   --quick   smaller working set and fewer passes (a smoke run)
 *   --hot     only the cache-hot single-thread rate, one shape per type (seconds)
 *   --mb N    bytes of weights cycled through per M = 1 measurement (default 1200 MB ≈ one E2B
 *             4-bit token), so every matrix comes from DRAM, not the 260 MB L3.
 * The "hot" column is the single-thread rate on 256 rows that stay in L2, best of many calls:
 * what one core can decode when memory is not the limit (robust on a shared, loaded machine).
 * Two cores saturate DRAM only if hot ≥ about half the 2-thread bandwidth. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/kernels.h"
#include "cpu/kernels_internal.h"
#include "cpu/quant.h"
#include "util/bandwidth.h"

typedef struct {
    const char *name;
    g4_wtype type;
    int bits, group;
    g4_dtype sdt;
    int split; /* repacked into the kernels' layout, as loaders do (cpu/quant.h) */
} bcfg;

static const bcfg cfgs[] = {
    {"F32", G4_W_F32, 0, 0, G4_DT_F32, 0},
    {"F16", G4_W_F16, 0, 0, G4_DT_F32, 0},
    {"BF16", G4_W_BF16, 0, 0, G4_DT_F32, 0},
    {"Q8_0", G4_W_Q8_0, 0, 0, G4_DT_F32, 0},
    {"Q4_0", G4_W_Q4_0, 0, 0, G4_DT_F32, 0},
    {"Q4_1", G4_W_Q4_1, 0, 0, G4_DT_F32, 0},
    {"Q5_0", G4_W_Q5_0, 0, 0, G4_DT_F32, 0},
    {"Q5_1", G4_W_Q5_1, 0, 0, G4_DT_F32, 0},
    {"Q4_K", G4_W_Q4_K, 0, 0, G4_DT_F32, 0},
    {"Q5_K", G4_W_Q5_K, 0, 0, G4_DT_F32, 0},
    {"Q6_K", G4_W_Q6_K, 0, 0, G4_DT_F32, 0},
    {"MLX4g64", G4_W_AFFINE, 4, 64, G4_DT_BF16, 0},
    {"MLX8g64", G4_W_AFFINE, 8, 64, G4_DT_BF16, 0},
    {"MLX3g64", G4_W_AFFINE, 3, 64, G4_DT_BF16, 0},
    {"MLX6g64", G4_W_AFFINE, 6, 64, G4_DT_BF16, 0},
    {"MLX2g32", G4_W_AFFINE, 2, 32, G4_DT_BF16, 0},
    {"QAT8", G4_W_SYMM, 8, 0, G4_DT_F32, 0},
    {"QAT4", G4_W_SYMM, 4, 0, G4_DT_F32, 0},
    {"QAT2", G4_W_SYMM, 2, 0, G4_DT_F32, 0},
    {"Q8_0 split", G4_W_Q8_0, 0, 0, G4_DT_F32, 1},
    {"Q4_0 split", G4_W_Q4_0, 0, 0, G4_DT_F32, 1},
    {"Q4_1 split", G4_W_Q4_1, 0, 0, G4_DT_F32, 1},
    {"MLX4g64 split", G4_W_AFFINE, 4, 64, G4_DT_BF16, 1},
    {"MLX8g64 split", G4_W_AFFINE, 8, 64, G4_DT_BF16, 1},
    {"QAT4 split", G4_W_SYMM, 4, 0, G4_DT_F32, 1},
    {"QAT8 split", G4_W_SYMM, 8, 0, G4_DT_F32, 1},
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* One matrix: the first 64 rows quantised from random values, the rest copies of them (content
 * does not change the speed; quantising 400M values would take longer than the benchmark). */
typedef struct {
    g4_mat m;
    void *data, *scales, *biases;
} bmat;

static int make(const bcfg *c, int rows, int cols, bmat *o) {
    memset(o, 0, sizeof *o);
    size_t rb = g4_wtype_row_bytes(c->type, cols, c->bits);
    o->data = aligned_alloc(64, (rb * rows + 63) / 64 * 64);
    if (!o->data) return -1;
    g4_mat *m = &o->m;
    m->type = c->type;
    m->rows = rows;
    m->cols = cols;
    m->row_bytes = rb;
    m->data = o->data;
    m->bits = c->bits;
    float *x = malloc(sizeof(float) * cols);
    unsigned seed = 1;
    int proto = rows < 64 ? rows : 64, G = 0, ng = 0;
    if (c->type == G4_W_AFFINE || c->type == G4_W_SYMM) {
        G = c->group ? c->group : cols;
        ng = cols / G;
        o->scales = malloc(sizeof(float) * (size_t)rows * ng);
        o->biases = malloc(sizeof(float) * (size_t)rows * ng);
        m->group = c->group;
        m->scales = o->scales;
        m->biases = c->type == G4_W_AFFINE ? o->biases : NULL;
        m->scale_dtype = G4_DT_F32;
        m->scale_stride = (size_t)ng;
    }
    float *sc = malloc(sizeof(float) * (ng + 1)), *bi = malloc(sizeof(float) * (ng + 1));
    for (int r = 0; r < proto; r++) {
        for (int i = 0; i < cols; i++) x[i] = frand(&seed);
        uint8_t *d = (uint8_t *)o->data + rb * r;
        if (c->type == G4_W_AFFINE) g4_quantize_row_affine(x, cols, c->bits, G, (uint32_t *)d, sc, bi);
        else if (c->type == G4_W_SYMM) sc[0] = g4_quantize_row_symm(x, cols, c->bits, d);
        else g4_quantize_row(c->type, x, cols, d);
        if (ng) {
            memcpy((float *)o->scales + (size_t)r * ng, sc, sizeof(float) * ng);
            memcpy((float *)o->biases + (size_t)r * ng, bi, sizeof(float) * ng);
        }
    }
    for (int r = proto; r < rows; r++) {
        memcpy((uint8_t *)o->data + rb * r, (uint8_t *)o->data + rb * (r % proto), rb);
        if (ng) {
            memcpy((float *)o->scales + (size_t)r * ng, (float *)o->scales + (size_t)(r % proto) * ng, sizeof(float) * ng);
            memcpy((float *)o->biases + (size_t)r * ng, (float *)o->biases + (size_t)(r % proto) * ng, sizeof(float) * ng);
        }
    }
    free(sc);
    free(bi);
    free(x);
    if (c->split) {
        size_t n = (g4_mat_repack_size(m) + 63) / 64 * 64;
        void *mem = n ? aligned_alloc(64, n) : NULL;
        if (!mem) return -1;
        g4_mat_repack(m, mem, m);
        free(o->data);
        o->data = mem;
    }
    return 0;
}

static void unmake(bmat *o) {
    free(o->data);
    free(o->scales);
    free(o->biases);
}

int main(int argc, char **argv) {
    int quick = 0, hot_only = 0;
    double mb = 1200;
    const char *filter = NULL;
    g4_isa isa = g4_isa_best();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1, mb = 300;
        else if (!strcmp(argv[i], "--hot")) hot_only = 1, quick = 1, mb = 0;
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *v = argv[++i];
            isa = !strcmp(v, "scalar") ? G4_ISA_SCALAR : !strcmp(v, "avx2") ? G4_ISA_AVX2 : G4_ISA_AVX512;
        } else {
            fprintf(stderr, "usage: %s [--quick | --hot] [--isa scalar|avx2|avx512] [--filter TYPE] [--mb N]\n", argv[0]);
            return 2;
        }
    }
    int passes = quick ? 2 : 5;
    double bw[3] = {0};
    for (int t = 1; t <= 2 && !hot_only; t++) {
        g4_error err;
        if (g4_measure_read_bandwidth(t, (size_t)(quick ? 512 : 1024) << 20, passes + 2, &bw[t], &err)) {
            fprintf(stderr, "bandwidth: %s\n", err.message);
            return 1;
        }
    }
    printf("kernels: %s (best here: %s)\n", g4_isa_name(isa), g4_isa_name(g4_isa_best()));
    if (!hot_only) printf("memory read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (2 threads)\n", bw[1], bw[2]);
    printf("\n");
    printf("%-8s %-14s %9s | %14s %14s | %8s | %10s %10s\n", "type", "shape", "MB", "M=1 1T GB/s", "M=1 2T GB/s",
           "hot 1T", "M=64 1T", "M=64 2T");
    printf("%-8s %-14s %9s | %14s %14s | %8s | %10s %10s\n", "", "(rows x cols)", "", "(% of bw)", "(% of bw)", "GB/s",
           "GFLOP/s", "GFLOP/s");
    static const int shapes[][2] = {{2048, 1536}, {6144, 1536}, {1536, 6144}, {262144, 1536}};
    g4_threadpool *pools[3] = {NULL};
    for (int t = 1; t <= 2; t++)
        if (g4_threadpool_create(t, &pools[t], NULL)) return 1;
    float *x = malloc(sizeof(float) * 64 * 6144), *y = malloc(sizeof(float) * 64 * 262144);
    unsigned seed = 7;
    for (int i = 0; i < 64 * 6144; i++) x[i] = frand(&seed);
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        const bcfg *c = &cfgs[ci];
        if (filter && !strstr(c->name, filter)) continue;
        for (int si = 0; si < 4; si++) {
            int rows = shapes[si][0], cols = shapes[si][1];
            if ((quick && si == 3) || (hot_only && si != 1)) continue;
            bmat proto;
            if (make(c, rows, cols, &proto)) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            size_t bytes = g4_mat_bytes(&proto.m);
            /* enough copies that one sweep streams `mb` MB from DRAM */
            int ncopy = hot_only ? 1 : (int)ceil(mb * 1e6 / (double)bytes);
            if (ncopy < 1) ncopy = 1;
            bmat *cp = calloc((size_t)ncopy, sizeof *cp);
            cp[0] = proto;
            int ok = 1;
            for (int k = 1; k < ncopy && ok; k++) {
                cp[k] = proto;
                cp[k].data = aligned_alloc(64, (bytes + 63) / 64 * 64);
                cp[k].scales = cp[k].biases = NULL;
                if (!cp[k].data) {
                    ncopy = k;
                    break;
                }
                /* every copy has its own codes, scales and biases, one block after the other, so
                 * all of `bytes` comes from DRAM (shared scales would stay in cache) */
                size_t cb = proto.m.row_bytes * rows, sb = proto.m.scales ? (bytes - cb) / (proto.m.biases ? 2 : 1) : 0;
                uint8_t *blk = cp[k].data;
                memcpy(blk, proto.m.data, cb);
                cp[k].m.data = blk;
                if (proto.m.scales) {
                    memcpy(blk + cb, proto.m.scales, sb);
                    cp[k].m.scales = blk + cb;
                }
                if (proto.m.biases) {
                    memcpy(blk + cb + sb, proto.m.biases, sb);
                    cp[k].m.biases = blk + cb + sb;
                }
            }
            double gbs[3] = {0}, gfl[3] = {0};
            for (int t = 1; t <= 2 && !hot_only; t++) {
                double best = 1e30;
                for (int p = 0; p < passes; p++) {
                    double t0 = now_s();
                    for (int k = 0; k < ncopy; k++) g4_matmul_isa(isa, pools[t], &cp[k].m, x, 1, y, rows);
                    double dt = now_s() - t0;
                    if (dt < best) best = dt;
                }
                gbs[t] = (double)bytes * ncopy / best * 1e-9;
                if (si < 3) {
                    double b64 = 1e30;
                    for (int p = 0; p < (quick ? 1 : 3); p++) {
                        double t0 = now_s();
                        g4_matmul_isa(isa, pools[t], &proto.m, x, 64, y, rows);
                        double dt = now_s() - t0;
                        if (dt < b64) b64 = dt;
                    }
                    gfl[t] = 2.0 * rows * cols * 64 / b64 * 1e-9;
                }
            }
            double hot = 0;
            if (si < 3) {
                g4_mat v = g4_mat_rows(&proto.m, 0, 256);
                double b1 = 1e30;
                for (int p = 0; p < (quick ? 30 : 200); p++) {
                    double t0 = now_s();
                    g4_matmul_isa(isa, NULL, &v, x, 1, y, 256);
                    double dt = now_s() - t0;
                    if (dt < b1) b1 = dt;
                }
                hot = (double)g4_mat_bytes(&v) / b1 * 1e-9;
            }
            char shape[32];
            snprintf(shape, sizeof shape, "%dx%d", rows, cols);
            if (hot_only) {
                printf("%-8s %-14s %9.1f | %14s %14s | %8.1f |\n", c->name, shape, bytes / 1e6, "-", "-", hot);
                for (int k = 1; k < ncopy; k++) free(cp[k].data);
                free(cp);
                unmake(&proto);
                continue;
            }
            printf("%-8s %-14s %9.1f | %6.1f (%3.0f%%) %6.1f (%3.0f%%) | %8.1f |", c->name, shape, bytes / 1e6, gbs[1],
                   100 * gbs[1] / bw[1], gbs[2], 100 * gbs[2] / bw[2], hot);
            if (si < 3) printf(" %10.1f %10.1f\n", gfl[1], gfl[2]);
            else printf(" %10s %10s\n", "-", "-");
            fflush(stdout);
            for (int k = 1; k < ncopy; k++) free(cp[k].data);
            free(cp);
            unmake(&proto);
        }
    }
    for (int t = 1; t <= 2; t++) g4_threadpool_free(pools[t]);
    free(x);
    free(y);
    return 0;
}
