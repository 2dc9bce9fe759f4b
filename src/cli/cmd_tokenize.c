/* g4 tokenize / g4 detokenize: text on stdin to ids and back.
 *
 * Exit status: 0 done, 1 a tokenizer that cannot be loaded or input that cannot be read,
 * 2 bad command-line usage. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "g4_tokenizer.h"
#include "text/tokenizer_json.h"

static const char tokenize_usage[] =
    "usage: g4 tokenize (--tokenizer FILE | -m MODEL_DIR) [--jsonl] [--bos] [--special]\n"
    "\n"
    "Reads text on stdin and writes its token ids.\n"
    "\n"
    "  --tokenizer FILE  a tokenizer.json or a GGUF file (told apart by their first bytes)\n"
    "  -m MODEL_DIR      a model directory; its tokenizer.json is used\n"
    "  --jsonl           one text per input line, written as a JSON string or as an object with\n"
    "                    a \"text\" string; one JSON array of ids per output line\n"
    "  --bos             start every text with <bos>\n"
    "  --special         turn special-token strings (<bos>, <|turn>, <turn|>, ...) in the text\n"
    "                    into their ids. Off by default: then they are tokenized as plain text.\n"
    "                    Non-special added tokens (<|channel>, <|tool_call>, <|\"|>, ...) are\n"
    "                    always matched, as HF tokenizers and llama.cpp do.\n"
    "\n"
    "Without --jsonl all of stdin, a final newline included, is one text, and its ids are\n"
    "written on one line separated by spaces.\n";

static const char detokenize_usage[] =
    "usage: g4 detokenize (--tokenizer FILE | -m MODEL_DIR) [--jsonl] [--skip-special]\n"
    "\n"
    "Reads token ids on stdin and writes their text.\n"
    "\n"
    "  --tokenizer FILE  a tokenizer.json or a GGUF file\n"
    "  -m MODEL_DIR      a model directory; its tokenizer.json is used\n"
    "  --jsonl           one JSON array of ids (or an object with an \"ids\" array) per input\n"
    "                    line; one JSON string per output line, in which bytes that are not\n"
    "                    valid UTF-8 become \\ufffd\n"
    "  --skip-special    leave out special tokens (<bos>, <|turn>, ...)\n"
    "\n"
    "Without --jsonl the ids are separated by whitespace or commas and the text is written\n"
    "byte for byte as the tokens give it, with nothing added, as ids arrive.\n";

typedef struct tok_args {
    const char *tokenizer, *model_dir;
    bool jsonl, bos, special, skip_special;
} tok_args;

/* Returns 0 to go on, otherwise the exit status (after --help, 0 is returned through *done). */
static int parse_args(int argc, char **argv, bool detok, tok_args *a, bool *done) {
    const char *cmd = detok ? "detokenize" : "tokenize";
    const char *usage = detok ? detokenize_usage : tokenize_usage;
    *done = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(usage, stdout);
            *done = true;
            return 0;
        } else if (!strcmp(o, "--tokenizer") || !strcmp(o, "-m")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "g4 %s: %s needs a value\n", cmd, o);
                return 2;
            }
            if (o[1] == 'm') a->model_dir = argv[++i];
            else a->tokenizer = argv[++i];
        } else if (!strcmp(o, "--jsonl")) {
            a->jsonl = true;
        } else if (!detok && !strcmp(o, "--bos")) {
            a->bos = true;
        } else if (!detok && !strcmp(o, "--special")) {
            a->special = true;
        } else if (detok && !strcmp(o, "--skip-special")) {
            a->skip_special = true;
        } else {
            fprintf(stderr, "g4 %s: unknown option '%s'\n%s", cmd, o, usage);
            return 2;
        }
    }
    if (!a->tokenizer == !a->model_dir) {
        fprintf(stderr, "g4 %s: give exactly one of --tokenizer FILE and -m MODEL_DIR\n%s", cmd,
                usage);
        return 2;
    }
    return 0;
}

static g4_tokenizer *load(const tok_args *a, const char *cmd) {
    g4_error err = {0};
    g4_tokenizer *t = NULL;
    g4_status st = a->model_dir ? g4_tokenizer_load_dir(a->model_dir, &t, &err)
                                : g4_tokenizer_load(a->tokenizer, &t, &err);
    if (st) {
        fprintf(stderr, "g4 %s: %s\n", cmd, err.message);
        return NULL;
    }
    return t;
}

static int finish_output(const char *cmd) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "g4 %s: cannot write the output: %s\n", cmd, strerror(errno));
        return 1;
    }
    return 0;
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    if (buf && ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Reads one JSONL line: a value that starts with `open` (read by fn), or an object whose `field`
 * member is such a value (other members are skipped, so corpus-style {"text", "ids"} lines work
 * for both commands). */
typedef g4_status (*value_fn)(g4_json *j, void *ctx);

static g4_status read_line_value(g4_json *j, const char *field, char open, value_fn fn,
                                 void *ctx) {
    g4_status st;
    if (g4_json_peek(j, open)) {
        st = fn(j, ctx);
    } else if (g4_json_accept(j, '{')) {
        bool first = true, done, found = false;
        const char *k;
        size_t kn;
        while (!(st = g4_json_next_key(j, &first, &k, &kn, &done, "the line")) && !done) {
            if (kn == strlen(field) && !memcmp(k, field, kn)) {
                st = fn(j, ctx);
                found = true;
            } else {
                st = g4_json_skip(j, "the line");
            }
            if (st) return st;
        }
        if (!st && !found)
            return g4_json_fail(j, G4_ERR_FORMAT, "the object has no \"%s\" member", field);
    } else {
        return g4_json_fail(j, G4_ERR_FORMAT, "expected %s or an object with \"%s\"",
                            open == '"' ? "a JSON string" : "a JSON array of ids", field);
    }
    if (!st && !g4_json_at_end(j))
        st = g4_json_fail(j, G4_ERR_FORMAT, "more than one JSON value on the line");
    return st;
}

typedef struct text_buf {
    char *data;
    size_t len, cap;
} text_buf;

static g4_status read_text(g4_json *j, void *ctx) {
    text_buf *t = ctx;
    const char *s;
    size_t n;
    g4_status st = g4_json_string(j, &s, &n, "the text");
    if (st) return st;
    if (n + 1 > t->cap) {
        char *d = realloc(t->data, n + 1);
        if (!d) return g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
        t->data = d;
        t->cap = n + 1;
    }
    memcpy(t->data, s, n);
    t->len = n;
    return G4_OK;
}

static g4_status read_ids(g4_json *j, void *ctx) {
    g4_tokens *ids = ctx;
    g4_status st = g4_json_expect(j, '[', "the ids");
    bool first = true, done;
    while (!st && !(st = g4_json_next_elem(j, &first, &done, "the ids")) && !done) {
        int64_t v;
        st = g4_json_int(j, &v, "the ids");
        if (st) return st;
        if (v < INT32_MIN || v > INT32_MAX)
            return g4_json_fail(j, G4_ERR_FORMAT, "%lld is not a token id", (long long)v);
        if (ids->n == ids->cap) {
            size_t cap = ids->cap ? ids->cap * 2 : 256;
            int32_t *p = realloc(ids->ids, cap * sizeof *p);
            if (!p) return g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
            ids->ids = p;
            ids->cap = cap;
        }
        ids->ids[ids->n++] = (int32_t)v;
    }
    return st;
}

static void print_ids(const g4_tokens *tk, bool json) {
    if (json) putchar('[');
    for (size_t i = 0; i < tk->n; i++) printf(i ? json ? ", %d" : " %d" : "%d", tk->ids[i]);
    puts(json ? "]" : "");
}

int cmd_tokenize(int argc, char **argv) {
    tok_args a = {0};
    bool done;
    int rc = parse_args(argc, argv, false, &a, &done);
    if (rc || done) return rc;
    g4_tokenizer *t = load(&a, "tokenize");
    if (!t) return 1;
    unsigned flags = (a.bos ? G4_TOKENIZE_ADD_BOS : 0) | (a.special ? G4_TOKENIZE_SPECIAL : 0);
    g4_tokens tk = {0};
    g4_error err = {0};
    if (!a.jsonl) {
        size_t len;
        char *text = read_all(stdin, &len);
        if (!text) {
            fprintf(stderr, "g4 tokenize: cannot read stdin\n");
            rc = 1;
        } else if (g4_tokenizer_encode(t, text, len, flags, &tk, &err)) {
            fprintf(stderr, "g4 tokenize: %s\n", err.message);
            rc = 1;
        } else {
            print_ids(&tk, false);
        }
        free(text);
    } else {
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        text_buf text = {0};
        for (size_t lineno = 1; !rc && (n = getline(&line, &cap, stdin)) >= 0; lineno++) {
            g4_json j;
            g4_json_init(&j, line, (size_t)n, "stdin", &err);
            j.first_line = lineno;
            tk.n = 0;
            if (read_line_value(&j, "text", '"', read_text, &text)) {
                fprintf(stderr, "g4 tokenize: %s\n", err.message);
                rc = 1;
            } else if (g4_tokenizer_encode(t, text.data, text.len, flags, &tk, &err)) {
                fprintf(stderr, "g4 tokenize: stdin: line %zu: %s\n", lineno, err.message);
                rc = 1;
            } else {
                print_ids(&tk, true);
            }
            g4_json_free(&j);
        }
        free(line);
        free(text.data);
    }
    g4_tokens_free(&tk);
    g4_tokenizer_free(t);
    return rc ? rc : finish_output("tokenize");
}

/* Raw mode: ids separated by whitespace or commas, decoded as they arrive. */
static int detokenize_stream(const g4_tokenizer *t, unsigned flags) {
    g4_error err = {0};
    g4_detokenizer *d;
    if (g4_detokenizer_create(t, flags, &d, &err)) {
        fprintf(stderr, "g4 detokenize: %s\n", err.message);
        return 1;
    }
    char word[32];
    size_t wl = 0;
    int rc = 0, c;
    do {
        c = getchar();
        bool sep = c == EOF || c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == ',';
        if (!sep) {
            if (wl + 1 < sizeof word) word[wl] = (char)c;
            wl++;
            continue;
        }
        if (!wl) continue;
        word[wl < sizeof word ? wl : sizeof word - 1] = 0;
        char *end;
        errno = 0;
        long v = strtol(word, &end, 10);
        if (wl >= sizeof word || *end || errno || v < INT32_MIN || v > INT32_MAX) {
            fprintf(stderr, "g4 detokenize: '%s%s' is not a token id\n", word,
                    wl >= sizeof word ? "..." : "");
            rc = 1;
            break;
        }
        wl = 0;
        const char *out;
        size_t n;
        if (g4_detokenizer_push(d, (int32_t)v, &out, &n, &err)) {
            fprintf(stderr, "g4 detokenize: %s\n", err.message);
            rc = 1;
            break;
        }
        fwrite(out, 1, n, stdout);
    } while (c != EOF);
    const char *out;
    size_t n;
    g4_detokenizer_flush(d, &out, &n);
    fwrite(out, 1, n, stdout);
    g4_detokenizer_free(d);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    tok_args a = {0};
    bool done;
    int rc = parse_args(argc, argv, true, &a, &done);
    if (rc || done) return rc;
    g4_tokenizer *t = load(&a, "detokenize");
    if (!t) return 1;
    unsigned flags = a.skip_special ? G4_DETOKENIZE_SKIP_SPECIAL : 0;
    if (!a.jsonl) {
        rc = detokenize_stream(t, flags);
    } else {
        char *line = NULL, *json = NULL;
        size_t cap = 0, json_cap = 0;
        ssize_t n;
        g4_tokens ids = {0};
        g4_error err = {0};
        for (size_t lineno = 1; !rc && (n = getline(&line, &cap, stdin)) >= 0; lineno++) {
            g4_json j;
            g4_json_init(&j, line, (size_t)n, "stdin", &err);
            j.first_line = lineno;
            ids.n = 0;
            char *text = NULL;
            size_t len = 0, json_len = 0;
            if (read_line_value(&j, "ids", '[', read_ids, &ids)) {
                fprintf(stderr, "g4 detokenize: %s\n", err.message);
                rc = 1;
            } else if (g4_tokenizer_decode(t, ids.ids, ids.n, flags, &text, &len, &err)) {
                fprintf(stderr, "g4 detokenize: stdin: line %zu: %s\n", lineno, err.message);
                rc = 1;
            } else if (!g4_json_write_string(&json, &json_len, &json_cap, text, len)) {
                fprintf(stderr, "g4 detokenize: out of memory\n");
                rc = 1;
            } else {
                fwrite(json, 1, json_len, stdout);
                putchar('\n');
            }
            free(text);
            g4_json_free(&j);
        }
        free(line);
        free(json);
        g4_tokens_free(&ids);
    }
    g4_tokenizer_free(t);
    int out_rc = finish_output("detokenize");
    return rc ? rc : out_rc;
}
