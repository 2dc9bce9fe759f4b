/* g4 synth: a full-size random-weight model of a released geometry, written in any format; plus
 * the helpers g4 convert shares (tokenizer files, the quick load-and-forward check). */
#include <errno.h>
#include <math.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "g4.h"
#include "model/config.h"
#include "model/synth.h"
#include "model/writer.h"
#include "util/mapped_file.h"

static void synth_usage(FILE *f) {
    char formats[1024];
    g4_writer_formats_help(formats, sizeof formats);
    fprintf(f,
            "usage: g4 synth (--arch ARCH | --config FILE) --format FORMAT --out DIR [options]\n"
            "  Writes a model of a released geometry (e2b, e4b, 12b, 26b-a4b, 31b) with random weights,\n"
            "  deterministic from the seed, streaming tensor by tensor (memory stays small), and copies\n"
            "  the real tokenizer files into DIR. --config: the geometry of a config.json instead (any\n"
            "  Gemma 4 text config; e.g. widths that are multiples of the K-quants' 256-column blocks).\n"
            "formats:\n%s"
            "options:\n"
            "  --seed N             weight seed (default 0)\n"
            "  --layers N           keep only the first N layers (tests; KV sharing scaled down)\n"
            "  --bits B, --group G  quantisation of mlx / qat formats\n"
            "  --multimodal         multimodal tensor names (model.language_model.*); --text-only: model.*\n"
            "  --tokenizer-from DIR copy tokenizer files from DIR (default: $G4_FIXTURES/tokenizer, else\n"
            "                       ../shared/fixtures/tokenizer)\n"
            "  --threads N          worker threads (default: all CPUs)\n"
            "  --check              load the result and run a 4-token forward, printing logit statistics\n",
            formats);
}

static int copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb");
    if (!in) return -1;
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return -2;
    }
    char buf[1 << 16];
    size_t n;
    int ok = 1;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) ok = 0;
    if (ferror(in)) ok = 0;
    fclose(in);
    if (fclose(out) != 0) ok = 0;
    return ok ? 0 : -2;
}

int cli_copy_tokenizer(const char *from, const char *to, int quiet) {
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "chat_template.jinja", "generation_config.json"};
    int copied = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/%s", from, files[i]);
        snprintf(b, sizeof b, "%s/%s", to, files[i]);
        int r = copy_file(a, b);
        if (r == -2) {
            fprintf(stderr, "g4: cannot copy %s to %s: %s\n", a, b, strerror(errno));
            return -1;
        }
        if (!r) copied++;
    }
    if (!copied && !quiet) fprintf(stderr, "g4: note: no tokenizer files found in %s\n", from);
    /* a generation config the chat front end can read, when none was copied */
    char gpath[4096];
    snprintf(gpath, sizeof gpath, "%s/generation_config.json", to);
    struct stat sb;
    if (stat(gpath, &sb) != 0) {
        FILE *f = fopen(gpath, "w");
        if (f) {
            fputs("{\n  \"bos_token_id\": 2,\n  \"eos_token_id\": [1, 106],\n  \"pad_token_id\": 0\n}\n", f);
            fclose(f);
        }
    }
    return copied;
}

int cli_quick_check(const char *dir, int threads) {
    g4_error err = {0};
    g4_model *m = NULL;
    if (g4_model_load(dir, NULL, &m, &err)) {
        fprintf(stderr, "g4: check: %s\n", err.message);
        return -1;
    }
    g4_model_info info;
    g4_model_get_info(m, &info);
    g4_session_options so = {.n_ctx = 64, .n_threads = threads, .max_batch = 8};
    g4_session *s = NULL;
    int32_t toks[4] = {2, 818, 5279, 563};
    for (int i = 0; i < 4; i++) toks[i] %= info.vocab;
    float *logits = malloc(sizeof(float) * (size_t)info.vocab);
    int rc = -1;
    if (!logits || g4_session_create(m, &so, &s, &err) ||
        g4_session_forward(s, toks, 4, G4_LOGITS_LAST, logits, &err)) {
        fprintf(stderr, "g4: check: %s\n", logits ? err.message : "out of memory");
    } else {
        double sum = 0, sq = 0;
        float mn = logits[0], mx = logits[0];
        int top[5] = {0};
        int finite = 1;
        for (int i = 0; i < info.vocab; i++) {
            float v = logits[i];
            if (!isfinite(v)) finite = 0;
            sum += v;
            sq += (double)v * v;
            if (v < mn) mn = v;
            if (v > mx) mx = v;
        }
        for (int k = 0; k < 5; k++) {
            int best = -1;
            for (int i = 0; i < info.vocab; i++) {
                int taken = 0;
                for (int q = 0; q < k; q++) taken |= top[q] == i;
                if (!taken && (best < 0 || logits[i] > logits[best])) best = i;
            }
            top[k] = best;
        }
        double mean = sum / info.vocab, sd = sqrt(sq / info.vocab - mean * mean);
        printf("check %s: %d layers, hidden %d, %.2f GB of weights; last-token logits min %.3f max %.3f "
               "mean %.3f sd %.3f; top-5 %d %d %d %d %d\n",
               dir, info.n_layers, info.hidden, (double)info.weight_bytes / 1e9, mn, mx, mean, sd, top[0], top[1],
               top[2], top[3], top[4]);
        rc = finite && sd > 0.1 ? 0 : -1;
        if (rc) fprintf(stderr, "g4: check: logits are %s\n", finite ? "flat" : "not finite");
    }
    free(logits);
    g4_session_free(s);
    g4_model_free(m);
    return rc;
}

/* Parses the options both synth and convert take; returns 1 when argv[*i] was one of them, -1 on
 * a bad value, 0 otherwise. */
int cli_writer_option(int argc, char **argv, int *i, g4_writer_options *wo, int *threads, const char **tok_from) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--bits")) {
        (*i)++;
        return cli_parse_int(a, v, 2, 8, &wo->bits) ? -1 : 1;
    }
    if (!strcmp(a, "--group")) {
        (*i)++;
        return cli_parse_int(a, v, 1, 1024, &wo->group) ? -1 : 1;
    }
    if (!strcmp(a, "--threads")) {
        (*i)++;
        return cli_parse_int(a, v, 1, 256, threads) ? -1 : 1;
    }
    if (!strcmp(a, "--tokenizer-from")) {
        (*i)++;
        if (!v) {
            fprintf(stderr, "g4: --tokenizer-from needs a value\n");
            return -1;
        }
        *tok_from = v;
        return 1;
    }
    if (!strcmp(a, "--vocab")) { /* GGUF formats: tokenizer.* copied from this vocabulary GGUF */
        (*i)++;
        if (!v) {
            fprintf(stderr, "g4: --vocab needs a GGUF file\n");
            return -1;
        }
        wo->vocab = v;
        return 1;
    }
    if (!strcmp(a, "--multimodal")) {
        wo->layout = 2;
        return 1;
    }
    if (!strcmp(a, "--text-only")) {
        wo->layout = 1;
        return 1;
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes of the regular files directly in dir (a model folder: weights, config, tokenizer). */
double cli_dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    double total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[4096];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!stat(p, &sb) && S_ISREG(sb.st_mode)) total += (double)sb.st_size;
    }
    closedir(d);
    return total;
}

int cmd_synth(int argc, char **argv) {
    const char *arch = NULL, *config = NULL, *format = NULL, *out = NULL, *tok_from = NULL;
    g4_writer_options wo = {0};
    g4_synth_options so = {0};
    int threads = 0, check = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = cli_writer_option(argc, argv, &i, &wo, &threads, &tok_from);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            synth_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--arch") && v) {
            arch = argv[++i];
        } else if (!strcmp(a, "--config") && v) {
            config = argv[++i];
        } else if (!strcmp(a, "--format") && v) {
            format = argv[++i];
        } else if (!strcmp(a, "--out") && v) {
            out = argv[++i];
        } else if (!strcmp(a, "--seed") && v) {
            char *end;
            errno = 0;
            unsigned long long sd = strtoull(v, &end, 0);
            if (!*v || *end || errno) {
                fprintf(stderr, "g4 synth: --seed: '%s' is not a number\n", v);
                return 2;
            }
            so.seed = sd;
            i++;
        } else if (!strcmp(a, "--layers")) {
            if (cli_parse_int(a, v, 1, 1024, &so.n_layers)) return 2;
            i++;
        } else if (!strcmp(a, "--check")) {
            check = 1;
        } else {
            fprintf(stderr, "g4 synth: unknown or incomplete option '%s'\n", a);
            synth_usage(stderr);
            return 2;
        }
    }
    if (!arch == !config || !format || !out) {
        fprintf(stderr, "g4 synth: one of --arch and --config, --format and --out are required\n");
        synth_usage(stderr);
        return 2;
    }
    if (config && so.n_layers) {
        fprintf(stderr, "g4 synth: --layers truncates a released geometry (--arch); write the layers into the config instead\n");
        return 2;
    }
    so.n_threads = threads;
    g4_error err = {0};
    char *json = NULL;
    if (config) {
        size_t len;
        if (g4_read_file(config, &json, &len, &err)) {
            fprintf(stderr, "g4 synth: %s\n", err.message);
            return 2;
        }
        g4_config cfg;
        if (g4_config_parse(json, config, &cfg, &err)) { /* names the file and the field at fault */
            fprintf(stderr, "g4 synth: %s\n", err.message);
            free(json);
            return 2;
        }
        g4_config_free(&cfg);
        arch = config;
    } else if (g4_synth_config_json(arch, so.n_layers, &json, &err)) {
        fprintf(stderr, "g4 synth: %s\n", err.message);
        return 2;
    }
    g4_model_writer w;
    double t0 = now_s();
    if (g4_writer_open(format, out, &wo, &w, &err) || g4_synth_write(json, &so, &w, &err)) {
        fprintf(stderr, "g4 synth: %s\n", err.message);
        free(json);
        return 1;
    }
    free(json);
    double t1 = now_s();
    char fx[4096];
    int fixtures = !tok_from;
    if (fixtures) {
        const char *env = getenv("G4_FIXTURES");
        snprintf(fx, sizeof fx, "%s/tokenizer", env && *env ? env : "../shared/fixtures");
        tok_from = fx;
    }
    if (cli_copy_tokenizer(tok_from, out, 0) < 0) return 1;
    if (fixtures) { /* the fixtures keep the official chat template beside the tokenizer */
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/../chat/chat_template.jinja", tok_from);
        snprintf(b, sizeof b, "%s/chat_template.jinja", out);
        if (copy_file(a, b) == -2) fprintf(stderr, "g4 synth: cannot write %s\n", b);
    }
    printf("synth %s %s -> %s: %.2f GB in %.1f s (seed %llu%s)\n", arch, format, out, cli_dir_bytes(out) / 1e9,
           t1 - t0, (unsigned long long)so.seed, so.n_layers ? ", truncated" : "");
    if (check && cli_quick_check(out, threads)) return 1;
    return 0;
}
