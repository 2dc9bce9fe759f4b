#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "g4.h"

/* One line per subcommand; keep in alphabetical order. */
static const cli_command commands[] = {
    {"bench", "prefill/decode speed and GB/s against measured memory bandwidth", cmd_bench},
    {"chat", "interactive multi-turn chat", cmd_chat},
    {"check", "conformance against a folder in the fixture format", cmd_check},
    {"convert", "convert a checkpoint into another format (safetensors, MLX, QAT, ...)", cmd_convert},
    {"detokenize", "token ids on stdin to text", cmd_detokenize},
    {"pack", "write the native pack: one mmap-able file in the kernels' layout", cmd_pack},
    {"run", "answer one prompt, streamed to stdout", cmd_run},
    {"synth", "write a random-weight model of a released size in any format", cmd_synth},
    {"tokenize", "text on stdin to token ids", cmd_tokenize},
};

int cli_parse_int(const char *opt, const char *val, int min, int max, int *out) {
    if (!val) {
        fprintf(stderr, "g4: %s needs a value\n", opt);
        return -1;
    }
    char *end;
    long v = strtol(val, &end, 10);
    if (*val == 0 || *end != 0 || v < min || v > max) {
        fprintf(stderr, "g4: %s: '%s' is not an integer in [%d, %d]\n", opt, val, min, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_parse_kv_type(const char *opt, const char *val, int *out) {
    if (val && !strcmp(val, "f32")) *out = G4_KV_F32;
    else if (val && !strcmp(val, "bf16")) *out = G4_KV_BF16;
    else {
        fprintf(stderr, "g4: %s: '%s' is not f32 or bf16\n", opt, val ? val : "");
        return -1;
    }
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: g4 <command> [options]   (g4 <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "g4: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
