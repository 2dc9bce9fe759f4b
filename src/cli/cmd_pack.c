/* g4 pack IN OUT: the native pack (one mmap-able file, every tensor in the kernels' layout) of any
 * model or drafter g4 loads. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "g4.h"
#include "model/pack.h"

static void pack_usage(FILE *f) {
    fprintf(f,
            "usage: g4 pack IN OUT [--tokenizer FILE] [--keep-layout]\n"
            "  Writes the model (or drafter) at IN — a safetensors, MLX, QAT or GGUF checkpoint, a drafter\n"
            "  folder, or another pack — as a native pack: OUT when it ends in .g4p, else OUT/model.g4p.\n"
            "  The pack holds every tensor exactly as the CPU kernels read it, the config and the tokenizer,\n"
            "  and loads by mmap in milliseconds: g4 run -m OUT, g4 bench -m OUT, --draft OUT.\n"
            "options:\n"
            "  --tokenizer FILE   tokenizer.json to carry (default: IN/tokenizer.json, or the one IN's pack\n"
            "                     carries; without one, g4 run needs --tokenizer)\n"
            "  --keep-layout      keep IN's weight layout (default on AVX-512 CPUs: 4- and 8-bit matrices in\n"
            "                     the CPU kernels' split layout, mapped with no repacking; GPU sessions need\n"
            "                     --keep-layout packs)\n");
}

int cmd_pack(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    g4_pack_options o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pack_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--keep-layout")) {
            o.keep_layout = 1;
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            o.tokenizer = argv[++i];
        } else if (a[0] != '-' && !in) {
            in = a;
        } else if (a[0] != '-' && !out) {
            out = a;
        } else {
            fprintf(stderr, "g4 pack: unknown or incomplete option '%s'\n", a);
            pack_usage(stderr);
            return 2;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "g4 pack: IN and OUT are required\n");
        pack_usage(stderr);
        return 2;
    }
    g4_error err = {0};
    g4_pack_stats s;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (g4_pack_write(in, out, &o, &s, &err)) {
        fprintf(stderr, "g4 pack: %s\n", err.message);
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("pack %s -> %s: %s, %d tensors%s, %.3f GB in %.1f s\n", in, s.path, s.is_drafter ? "drafter" : "model",
           s.n_tensors + s.n_int_tensors, s.has_tokenizer ? " + tokenizer.json" : " (no tokenizer)", s.bytes / 1e9,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return 0;
}
