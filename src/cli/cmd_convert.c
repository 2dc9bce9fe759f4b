/* g4 convert IN OUT --format FORMAT: any checkpoint g4 loads into any writer, dequantising row by
 * row (streaming: one chunk of rows in memory at a time). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "g4.h"
#include "model/synth.h"
#include "model/writer.h"

static void convert_usage(FILE *f) {
    char formats[1024];
    g4_writer_formats_help(formats, sizeof formats);
    fprintf(f,
            "usage: g4 convert IN OUT --format FORMAT [options]\n"
            "  Converts the model at IN (safetensors, MLX, QAT, GGUF or a pack) into FORMAT in directory OUT.\n"
            "  A drafter folder (gemma4_assistant) converts too, keeping its names and config (not to GGUF).\n"
            "  Quantised inputs are dequantised to float32 row by row, then re-encoded.\n"
            "formats:\n%s"
            "options:\n"
            "  --bits B, --group G  quantisation of mlx / qat formats\n"
            "  --multimodal         multimodal tensor names; --text-only: model.*\n"
            "  --tokenizer-from DIR copy tokenizer files from DIR (default: IN when it is a directory)\n"
            "  --vocab FILE.gguf    gguf formats: copy tokenizer.* from this vocabulary GGUF (default: a\n"
            "                       stand-in vocabulary that only lets llama.cpp load the file)\n"
            "  --threads N          worker threads (default: all CPUs)\n"
            "  --check              load the result and run a 4-token forward, printing logit statistics\n",
            formats);
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *format = NULL, *tok_from = NULL;
    g4_writer_options wo = {0};
    int threads = 0, check = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_writer_option(argc, argv, &i, &wo, &threads, &tok_from);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            convert_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--format") && i + 1 < argc) {
            format = argv[++i];
        } else if (!strcmp(a, "--check")) {
            check = 1;
        } else if (a[0] != '-' && !in) {
            in = a;
        } else if (a[0] != '-' && !out) {
            out = a;
        } else {
            fprintf(stderr, "g4 convert: unknown or incomplete option '%s'\n", a);
            convert_usage(stderr);
            return 2;
        }
    }
    if (!in || !out || !format) {
        fprintf(stderr, "g4 convert: IN, OUT and --format are required\n");
        convert_usage(stderr);
        return 2;
    }
    g4_error err = {0};
    g4_model_writer w;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (g4_writer_open(format, out, &wo, &w, &err) || g4_convert(in, &w, threads, &err)) {
        fprintf(stderr, "g4 convert: %s\n", err.message);
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (cli_copy_tokenizer(tok_from ? tok_from : in, out, !tok_from) < 0) return 1;
    printf("convert %s -> %s (%s): %.2f GB in %.1f s\n", in, out, format, cli_dir_bytes(out) / 1e9,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    if (check && cli_quick_check(out, threads)) return 1;
    return 0;
}
