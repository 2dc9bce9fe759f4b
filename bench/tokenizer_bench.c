/* Tokenizer timings: loading the 262k vocabulary from each format (next to what cJSON alone
 * needs to parse the same tokenizer.json, the approach the JSON loader avoids), encoding the
 * corpus and 1 MB lines without newlines, and decoding.
 *
 * usage: tokenizer_bench [FIXTURES_DIR]   (default $G4_FIXTURES, else ../shared/fixtures) */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "g4_tokenizer.h"
#include "text/tokenizer_json.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    *len = (size_t)n;
    return b;
}

typedef struct text {
    char *s;
    size_t n;
} text;

/* The "text" member of each corpus line. */
static text *corpus_texts(const char *path, size_t *count, size_t *bytes) {
    size_t len;
    char *data = slurp(path, &len);
    if (!data) return NULL;
    size_t cap = 8192, n = 0;
    text *t = malloc(cap * sizeof *t);
    *bytes = 0;
    for (char *line = data; line < data + len && t;) {
        char *nl = memchr(line, '\n', (size_t)(data + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(data + len - line);
        g4_json j;
        g4_error err;
        g4_json_init(&j, line, ll, path, &err);
        bool first = true, done;
        const char *k, *s;
        size_t kn, sn;
        if (g4_json_expect(&j, '{', "line")) break;
        while (!g4_json_next_key(&j, &first, &k, &kn, &done, "line") && !done) {
            if (kn == 4 && !memcmp(k, "text", 4) && !g4_json_string(&j, &s, &sn, "text")) {
                if (n == cap) t = realloc(t, (cap *= 2) * sizeof *t);
                t[n].s = malloc(sn + 1);
                memcpy(t[n].s, s, sn);
                t[n].n = sn;
                *bytes += sn;
                n++;
            } else if (g4_json_skip(&j, "line")) {
                break;
            }
        }
        g4_json_free(&j);
        line += ll + 1;
    }
    free(data);
    *count = n;
    return t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : getenv("G4_FIXTURES");
    if (!dir || !*dir) dir = "../shared/fixtures";
    char json_path[1024], gguf_path[1024], corpus_path[1024];
    snprintf(json_path, sizeof json_path, "%s/tokenizer/tokenizer.json", dir);
    snprintf(gguf_path, sizeof gguf_path, "%s/tokenizer/ggml-vocab-gemma-4.gguf", dir);
    snprintf(corpus_path, sizeof corpus_path, "%s/tokenizer/corpus.jsonl", dir);
    const char *paths[2] = {json_path, gguf_path};
    const char *names[2] = {"tokenizer.json", "GGUF"};
    enum { RUNS = 5 };

    printf("load (median of %d, file in the page cache)\n", RUNS);
    g4_tokenizer *toks[2] = {0};
    for (int f = 0; f < 2; f++) {
        double times[RUNS];
        for (int r = 0; r < RUNS; r++) {
            g4_error err = {0};
            g4_tokenizer *t;
            double t0 = now();
            if (g4_tokenizer_load(paths[f], &t, &err)) {
                fprintf(stderr, "tokenizer_bench: %s\n", err.message);
                return 1;
            }
            times[r] = now() - t0;
            if (r == RUNS - 1) toks[f] = t;
            else g4_tokenizer_free(t);
        }
        qsort(times, RUNS, sizeof times[0], cmp_double);
        printf("  %-16s %7.1f ms\n", names[f], times[RUNS / 2] * 1e3);
    }
    {
        size_t len;
        char *data = slurp(json_path, &len);
        double times[RUNS];
        for (int r = 0; data && r < RUNS; r++) {
            double t0 = now();
            cJSON *j = cJSON_ParseWithLength(data, len);
            times[r] = now() - t0;
            cJSON_Delete(j);
        }
        if (data) {
            qsort(times, RUNS, sizeof times[0], cmp_double);
            printf("  %-16s %7.1f ms   (cJSON_Parse of tokenizer.json alone, for comparison)\n",
                   "cJSON", times[RUNS / 2] * 1e3);
        }
        free(data);
    }

    size_t n_texts, corpus_bytes;
    text *texts = corpus_texts(corpus_path, &n_texts, &corpus_bytes);
    if (!texts) {
        fprintf(stderr, "tokenizer_bench: cannot read %s\n", corpus_path);
        return 1;
    }
    g4_tokens tk = {0};
    g4_error err = {0};
    printf("\nencode / decode (best of %d)\n", RUNS);
    for (int f = 0; f < 2; f++) {
        double best = 1e9, best_dec = 1e9;
        size_t n_ids = 0;
        for (int r = 0; r < RUNS; r++) {
            double t0 = now(), dec = 0;
            n_ids = 0;
            for (size_t i = 0; i < n_texts; i++) {
                tk.n = 0;
                g4_tokenizer_encode(toks[f], texts[i].s, texts[i].n, 0, &tk, &err);
                n_ids += tk.n;
                double d0 = now();
                char *s;
                size_t sl;
                g4_tokenizer_decode(toks[f], tk.ids, tk.n, 0, &s, &sl, &err);
                free(s);
                dec += now() - d0;
            }
            double total = now() - t0 - dec;
            if (total < best) best = total;
            if (dec < best_dec) best_dec = dec;
        }
        printf("  %-16s corpus (%zu lines, %.2f MB, %zu tokens): encode %6.1f MB/s %5.2f Mtok/s, "
               "decode %6.1f MB/s\n", names[f], n_texts, corpus_bytes / 1e6, n_ids,
               corpus_bytes / best / 1e6, n_ids / best / 1e6, corpus_bytes / best_dec / 1e6);
    }

    const size_t size = 1 << 20;
    char *line = malloc(size);
    const char *kinds[] = {"1 MB corpus line", "1 MB of 'a'", "1 MB of spaces"};
    for (int k = 0; k < 3; k++) {
        if (k == 0) {
            size_t at = 0;
            for (size_t i = 0; at < size; i = (i + 1) % n_texts)
                for (size_t c = 0; c <= texts[i].n && at < size; c++)
                    line[at++] = c == texts[i].n || texts[i].s[c] == '\n' ? ' ' : texts[i].s[c];
        } else {
            memset(line, k == 1 ? 'a' : ' ', size);
        }
        double best = 1e9;
        for (int r = 0; r < RUNS; r++) {
            tk.n = 0;
            double t0 = now();
            g4_tokenizer_encode(toks[1], line, size, 0, &tk, &err);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("  %-16s %-17s %8zu tokens in %6.1f ms: %6.1f MB/s\n", names[1], kinds[k], tk.n,
               best * 1e3, size / best / 1e6);
    }
    free(line);
    g4_tokens_free(&tk);
    for (size_t i = 0; i < n_texts; i++) free(texts[i].s);
    free(texts);
    for (int f = 0; f < 2; f++) g4_tokenizer_free(toks[f]);
    return 0;
}
