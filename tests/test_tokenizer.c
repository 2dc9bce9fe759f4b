/* Tokenizer conformance against the real Gemma 4 vocabulary in both file formats (the 46
 * llama.cpp vectors, the 4,219-line corpus, the special-token cases), round trips, invalid
 * UTF-8, streaming decoding, a 1 MB line, and broken or hand-made tokenizer files. */
#include "test_util.h"

#include <sys/stat.h>

#include "g4_tokenizer.h"
#include "text/tokenizer_internal.h"
#include "text/tokenizer_json.h"

enum { FMT_JSON, FMT_GGUF, N_FMT };
static const char *const fmt_name[N_FMT] = {"tokenizer.json", "gguf"};
static g4_tokenizer *toks[N_FMT];

static int setup(void **state) {
    (void)state;
    const char *files[N_FMT] = {"tokenizer/tokenizer.json", "tokenizer/ggml-vocab-gemma-4.gguf"};
    for (int f = 0; f < N_FMT; f++) {
        char path[1024];
        g4_error err = {0};
        /* through the sniffing loader, so both detections are exercised */
        if (g4_tokenizer_load(test_fixture_path(path, sizeof path, files[f]), &toks[f], &err)) {
            fprintf(stderr, "cannot load %s: %s\n", path, err.message);
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int f = 0; f < N_FMT; f++) g4_tokenizer_free(toks[f]);
    return 0;
}

static void encode(const g4_tokenizer *t, const char *s, size_t n, unsigned flags, g4_tokens *out) {
    g4_error err = {0};
    out->n = 0;
    if (g4_tokenizer_encode(t, s, n, flags, out, &err)) fail_msg("encode: %s", err.message);
}

static char *decode(const g4_tokenizer *t, const g4_tokens *tk, unsigned flags, size_t *len) {
    g4_error err = {0};
    char *s;
    if (g4_tokenizer_decode(t, tk->ids, tk->n, flags, &s, len, &err))
        fail_msg("decode: %s", err.message);
    return s;
}

static void expect_ids(const g4_tokens *got, const int32_t *want, size_t n, const char *what) {
    bool same = got->n == n;
    for (size_t i = 0; same && i < n; i++) same = got->ids[i] == want[i];
    if (same) return;
    char msg[2048];
    int at = snprintf(msg, sizeof msg, "%s\n  got :", what);
    for (size_t i = 0; i < got->n && at < 1900; i++)
        at += snprintf(msg + at, sizeof msg - (size_t)at, " %d", got->ids[i]);
    at += snprintf(msg + at, sizeof msg - (size_t)at, "\n  want:");
    for (size_t i = 0; i < n && at < 2000; i++)
        at += snprintf(msg + at, sizeof msg - (size_t)at, " %d", want[i]);
    fail_msg("%s", msg);
}

/* Streams tk through a detokenizer: the concatenated chunks must equal want, and when
 * want_valid every chunk must be valid UTF-8 on its own. */
static void check_stream(const g4_tokenizer *t, const g4_tokens *tk, const char *want,
                         size_t want_len, bool want_valid) {
    g4_error err = {0};
    g4_detokenizer *d;
    assert_int_equal(g4_detokenizer_create(t, 0, &d, &err), G4_OK);
    char *all = malloc(want_len + 1);
    size_t n = 0;
    for (size_t i = 0; i <= tk->n; i++) {
        const char *s;
        size_t len;
        if (i < tk->n) {
            if (g4_detokenizer_push(d, tk->ids[i], &s, &len, &err)) fail_msg("%s", err.message);
        } else {
            g4_detokenizer_flush(d, &s, &len);
        }
        if (n + len > want_len) fail_msg("stream longer than the text");
        memcpy(all + n, s, len);
        n += len;
        for (size_t k = 0; want_valid && k < len;) {
            size_t c = tok_utf8_len((const uint8_t *)s + k, len - k);
            if (!c) fail_msg("chunk %zu is not valid UTF-8", i);
            k += c;
        }
    }
    assert_int_equal(n, want_len);
    assert_memory_equal(all, want, n);
    free(all);
    g4_detokenizer_free(d);
}

/* ---- the llama.cpp vectors --------------------------------------------------------------- */

static void test_vectors(void **state) {
    (void)state;
    char path[1024];
    size_t in_len, out_len;
    char *in = test_read_file(test_fixture_path(path, sizeof path, "tokenizer/vectors.inp"), &in_len);
    char *out = test_read_file(test_fixture_path(path, sizeof path, "tokenizer/vectors.out"), &out_len);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    g4_tokens tk = {0};
    int32_t *want = malloc(out_len * sizeof *want);
    for (int f = 0; f < N_FMT; f++) {
        char *text = in, *line = out;
        int count = 0;
        for (;;) {
            char *end = strstr(text, sep);
            size_t tlen = end ? (size_t)(end - text) : strlen(text);
            char *nl = strchr(line, '\n');
            assert_non_null(nl);
            size_t n = 0;
            for (char *p = line; p < nl;) {
                want[n++] = (int32_t)strtol(p, &p, 10);
                while (p < nl && *p == ' ') p++;
            }
            encode(toks[f], text, tlen, G4_TOKENIZE_SPECIAL, &tk);
            char what[256];
            snprintf(what, sizeof what, "%s: vector %d \"%.*s\"", fmt_name[f], count,
                     tlen > 60 ? 60 : (int)tlen, text);
            expect_ids(&tk, want, n, what);
            size_t dlen;
            char *back = decode(toks[f], &tk, 0, &dlen);
            assert_int_equal(dlen, tlen);
            assert_memory_equal(back, text, tlen);
            free(back);
            count++;
            line = nl + 1;
            if (!end) break;
            text = end + strlen(sep);
        }
        assert_int_equal(count, 46);
        assert_true(line == out + out_len);
    }
    g4_tokens_free(&tk);
    free(want);
    free(in);
    free(out);
}

/* ---- jsonl fixtures ---------------------------------------------------------------------- */

typedef struct jl_case {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
} jl_case;

/* Reads {"text": ..., "ids": [...]} lines (the scanner, unlike cJSON, keeps \u0000). */
static jl_case *read_jsonl(const char *rel, size_t *count) {
    char path[1024];
    size_t len;
    char *data = test_read_file(test_fixture_path(path, sizeof path, rel), &len);
    size_t cap = 64, n = 0;
    jl_case *cases = malloc(cap * sizeof *cases);
    g4_error err = {0};
    for (char *line = data; line < data + len;) {
        char *nl = memchr(line, '\n', (size_t)(data + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(data + len - line);
        g4_json j;
        g4_json_init(&j, line, ll, rel, &err);
        j.first_line = n + 1;
        if (n == cap) cases = realloc(cases, (cap *= 2) * sizeof *cases);
        jl_case *c = &cases[n];
        memset(c, 0, sizeof *c);
        bool first = true, done, have_text = false, have_ids = false;
        const char *k;
        size_t kn;
        if (g4_json_expect(&j, '{', "line")) fail_msg("%s", err.message);
        while (!g4_json_next_key(&j, &first, &k, &kn, &done, "line") && !done) {
            if (kn == 4 && !memcmp(k, "text", 4)) {
                const char *s;
                if (g4_json_string(&j, &s, &c->len, "text")) fail_msg("%s", err.message);
                c->text = malloc(c->len + 1);
                memcpy(c->text, s, c->len);
                c->text[c->len] = 0;
                have_text = true;
            } else if (kn == 3 && !memcmp(k, "ids", 3)) {
                bool f2 = true, d2;
                c->ids = malloc(ll * sizeof *c->ids);
                if (g4_json_expect(&j, '[', "ids")) fail_msg("%s", err.message);
                while (!g4_json_next_elem(&j, &f2, &d2, "ids") && !d2) {
                    int64_t v;
                    if (g4_json_int(&j, &v, "ids")) fail_msg("%s", err.message);
                    c->ids[c->n++] = (int32_t)v;
                }
                have_ids = true;
            } else {
                fail_msg("%s line %zu: unexpected key", rel, n + 1);
            }
        }
        if (!have_text || !have_ids || !g4_json_at_end(&j))
            fail_msg("%s line %zu: not {\"text\", \"ids\"}: %s", rel, n + 1, err.message);
        g4_json_free(&j);
        n++;
        line += ll + 1;
    }
    free(data);
    *count = n;
    return cases;
}

static void free_cases(jl_case *c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(c[i].text);
        free(c[i].ids);
    }
    free(c);
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t c = tok_utf8_len((const uint8_t *)s + i, n - i);
        if (!c) return false;
        i += c;
    }
    return true;
}

static void test_corpus(void **state) {
    (void)state;
    size_t n;
    jl_case *cases = read_jsonl("tokenizer/corpus.jsonl", &n);
    assert_int_equal(n, 4219);
    g4_tokens tk = {0};
    for (int f = 0; f < N_FMT; f++) {
        for (size_t i = 0; i < n; i++) {
            char what[256];
            snprintf(what, sizeof what, "%s: corpus line %zu \"%.*s\"", fmt_name[f], i + 1,
                     cases[i].len > 60 ? 60 : (int)cases[i].len, cases[i].text);
            /* the corpus was made without special-token parsing in HF's sense of
             * add_special_tokens=False, which still splits added tokens: both flags agree */
            encode(toks[f], cases[i].text, cases[i].len, G4_TOKENIZE_SPECIAL, &tk);
            expect_ids(&tk, cases[i].ids, cases[i].n, what);
            size_t dlen;
            char *back = decode(toks[f], &tk, 0, &dlen);
            if (dlen != cases[i].len || memcmp(back, cases[i].text, dlen))
                fail_msg("%s: round trip differs", what);
            free(back);
            if (f == FMT_GGUF)
                check_stream(toks[f], &tk, cases[i].text, cases[i].len,
                             valid_utf8(cases[i].text, cases[i].len));
        }
    }
    g4_tokens_free(&tk);
    free_cases(cases, n);
}

static void test_special(void **state) {
    (void)state;
    size_t n;
    jl_case *cases = read_jsonl("tokenizer/special.jsonl", &n);
    assert_int_equal(n, 8);
    g4_tokens tk = {0};
    size_t n_control = 0;
    for (int f = 0; f < N_FMT; f++) {
        for (size_t i = 0; i < n; i++) {
            char what[256];
            snprintf(what, sizeof what, "%s: special.jsonl line %zu \"%s\"", fmt_name[f], i + 1,
                     cases[i].text);
            encode(toks[f], cases[i].text, cases[i].len, G4_TOKENIZE_SPECIAL, &tk);
            expect_ids(&tk, cases[i].ids, cases[i].n, what);
            size_t dlen;
            char *back = decode(toks[f], &tk, 0, &dlen);
            assert_int_equal(dlen, cases[i].len);
            assert_memory_equal(back, cases[i].text, dlen);
            free(back);
            /* Without the flag no control token can come out of text, while non-special added
             * tokens (<|channel> 100, <|tool_call> 48, <|"|> 52) still do. */
            bool has_control = false;
            for (size_t k = 0; k < cases[i].n; k++)
                has_control |= g4_tokenizer_token_type(toks[f], cases[i].ids[k]) == G4_TOKEN_CONTROL;
            n_control += has_control;
            encode(toks[f], cases[i].text, cases[i].len, 0, &tk);
            for (size_t k = 0; k < tk.n; k++)
                assert_int_not_equal(g4_tokenizer_token_type(toks[f], tk.ids[k]), G4_TOKEN_CONTROL);
            if (!has_control) expect_ids(&tk, cases[i].ids, cases[i].n, what);
            back = decode(toks[f], &tk, 0, &dlen);
            assert_int_equal(dlen, cases[i].len);
            assert_memory_equal(back, cases[i].text, dlen);
            free(back);
        }
    }
    assert_true(n_control >= 2 * 4); /* the file does exercise control tokens */
    const char *chan = "<|channel>thought\nhmm<channel|>answer";
    encode(toks[FMT_JSON], chan, strlen(chan), 0, &tk);
    assert_int_equal(tk.ids[0], 100);
    encode(toks[FMT_GGUF], "<bos>", 5, 0, &tk);
    assert_true(tk.n > 1);
    encode(toks[FMT_GGUF], "x", 1, G4_TOKENIZE_ADD_BOS, &tk);
    assert_int_equal(tk.n, 2);
    assert_int_equal(tk.ids[0], 2);
    /* skipping special tokens on decode */
    encode(toks[FMT_JSON], "<bos><|turn>user\nHi<turn|>", 26, G4_TOKENIZE_SPECIAL, &tk);
    size_t dlen;
    char *s = decode(toks[FMT_JSON], &tk, G4_DETOKENIZE_SKIP_SPECIAL, &dlen);
    assert_string_equal(s, "user\nHi");
    free(s);
    g4_tokens_free(&tk);
    free_cases(cases, n);
}

/* ---- lookups and the two formats side by side -------------------------------------------- */

static void test_lookups(void **state) {
    (void)state;
    for (int f = 0; f < N_FMT; f++) {
        const g4_tokenizer *t = toks[f];
        assert_int_equal(g4_tokenizer_n_vocab(t), 262144);
        assert_int_equal(g4_tokenizer_bos(t), 2);
        assert_int_equal(g4_tokenizer_eos(t), 1);
        assert_int_equal(g4_tokenizer_pad(t), 0);
        assert_int_equal(g4_tokenizer_unk(t), 3);
        size_t len;
        assert_string_equal(g4_tokenizer_piece(t, 2, &len), "<bos>");
        assert_int_equal(len, 5);
        assert_string_equal(g4_tokenizer_piece(t, 238 + 0x0A, NULL), "<0x0A>");
        assert_null(g4_tokenizer_piece(t, 262144, NULL));
        assert_null(g4_tokenizer_piece(t, -1, NULL));
        assert_int_equal(g4_tokenizer_find(t, "<bos>", 5), 2);
        assert_int_equal(g4_tokenizer_find(t, "\xE2\x96\x81", 3), 236743);
        assert_int_equal(g4_tokenizer_find(t, "no such piece", 13), -1);
        struct { const char *s; int32_t id; g4_token_type type; } sp[] = {
            {"<pad>", 0, G4_TOKEN_CONTROL},       {"<eos>", 1, G4_TOKEN_CONTROL},
            {"<bos>", 2, G4_TOKEN_CONTROL},       {"<unk>", 3, G4_TOKEN_CONTROL},
            {"<mask>", 4, G4_TOKEN_CONTROL},      {"<|tool>", 46, G4_TOKEN_CONTROL},
            {"<tool|>", 47, G4_TOKEN_CONTROL},    {"<|tool_call>", 48, G4_TOKEN_USER},
            {"<tool_call|>", 49, G4_TOKEN_USER},  {"<|tool_response>", 50, G4_TOKEN_USER},
            {"<tool_response|>", 51, G4_TOKEN_USER}, {"<|\"|>", 52, G4_TOKEN_USER},
            {"<|think|>", 98, G4_TOKEN_CONTROL},  {"<|channel>", 100, G4_TOKEN_USER},
            {"<channel|>", 101, G4_TOKEN_USER},   {"<|turn>", 105, G4_TOKEN_CONTROL},
            {"<turn|>", 106, G4_TOKEN_CONTROL},   {"<|image>", 255999, G4_TOKEN_CONTROL},
            {"<|audio>", 256000, G4_TOKEN_CONTROL}, {"<|image|>", 258880, G4_TOKEN_CONTROL},
            {"<|audio|>", 258881, G4_TOKEN_CONTROL}, {"<image|>", 258882, G4_TOKEN_CONTROL},
            {"<audio|>", 258883, G4_TOKEN_CONTROL}, {"<|video|>", 258884, G4_TOKEN_CONTROL},
        };
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
            assert_int_equal(g4_tokenizer_special_id(t, sp[i].s), sp[i].id);
            assert_int_equal(g4_tokenizer_token_type(t, sp[i].id), sp[i].type);
        }
        assert_int_equal(g4_tokenizer_special_id(t, "hello"), -1);
        assert_int_equal(g4_tokenizer_token_type(t, 238), G4_TOKEN_BYTE);
        assert_int_equal(g4_tokenizer_token_type(t, 493), G4_TOKEN_BYTE);
        assert_int_equal(g4_tokenizer_token_type(t, 494), G4_TOKEN_NORMAL);
    }
    /* Same strings for every id. The only type difference: tokenizer.json marks the 6,226
     * <unusedN> tokens special, the GGUF leaves them normal. */
    size_t unused = 0;
    for (int32_t id = 0; id < 262144; id++) {
        size_t la, lb;
        const char *a = g4_tokenizer_piece(toks[0], id, &la);
        const char *b = g4_tokenizer_piece(toks[1], id, &lb);
        if (la != lb || memcmp(a, b, la)) fail_msg("id %d: \"%s\" vs \"%s\"", id, a, b);
        g4_token_type ta = g4_tokenizer_token_type(toks[0], id);
        g4_token_type tb = g4_tokenizer_token_type(toks[1], id);
        if (ta != tb) {
            if (!(ta == G4_TOKEN_CONTROL && tb == G4_TOKEN_NORMAL && !strncmp(a, "<unused", 7)))
                fail_msg("id %d \"%s\": types %d vs %d", id, a, ta, tb);
            unused++;
        }
    }
    assert_int_equal(unused, 6227);
}

/* ---- invalid UTF-8, streaming, long lines ------------------------------------------------ */

static void test_invalid_utf8(void **state) {
    (void)state;
    struct { const char *s; size_t n; } bad[] = {
        {"\xff", 1},
        {"\x80", 1},             /* stray continuation */
        {"\xE2\x96", 2},         /* '▁' cut short */
        {"\xC0\xAF", 2},         /* overlong '/' */
        {"\xED\xA0\x80", 3},     /* a surrogate */
        {"\xF4\x90\x80\x80", 4}, /* past U+10FFFF */
        {"\xF0\x9F\xA6", 3},     /* an emoji cut short */
    };
    g4_tokens tk = {0};
    for (int f = 0; f < N_FMT; f++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            encode(toks[f], bad[i].s, bad[i].n, 0, &tk);
            assert_int_equal(tk.n, bad[i].n);
            for (size_t k = 0; k < bad[i].n; k++)
                assert_int_equal(tk.ids[k], 238 + (uint8_t)bad[i].s[k]);
            size_t dlen;
            char *back = decode(toks[f], &tk, 0, &dlen);
            assert_int_equal(dlen, bad[i].n);
            assert_memory_equal(back, bad[i].s, dlen);
            free(back);
        }
        /* the one byte sequence that does not come back: '▁' is the space mark */
        encode(toks[f], "a\xE2\x96\x81" "b", 5, 0, &tk);
        size_t mlen;
        char *mark = decode(toks[f], &tk, 0, &mlen);
        assert_string_equal(mark, "a b");
        free(mark);
        /* invalid bytes inside text: the valid parts tokenize as they would alone */
        const char *mixed = "hello\xff world";
        g4_tokens a = {0};
        encode(toks[f], mixed, strlen(mixed), 0, &tk);
        encode(toks[f], "hello", 5, 0, &a);
        assert_true(tk.n > a.n);
        assert_memory_equal(tk.ids, a.ids, a.n * sizeof *a.ids);
        assert_int_equal(tk.ids[a.n], 238 + 0xff);
        g4_tokens_free(&a);
        /* random bytes always round-trip, and streaming gives the same bytes */
        uint64_t x = 0x2545F4914F6CDD1Dull;
        char buf[96];
        for (int r = 0; r < 500; r++) {
            size_t n = (size_t)(r % 97);
            for (size_t k = 0; k < n; k++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                /* bias towards UTF-8 lead/continuation bytes and spaces */
                uint8_t b = (uint8_t)x;
                buf[k] = (char)(b < 64 ? 0x80 | (b & 0x3F) : b < 96 ? ' ' : b < 112 ? 0xE2 : b);
            }
            for (size_t k = 0; k + 3 <= n; k++) /* a literal '▁' would decode as a space */
                if (!memcmp(buf + k, "\xE2\x96\x81", 3)) buf[k] = 'x';
            encode(toks[f], buf, n, G4_TOKENIZE_SPECIAL, &tk);
            size_t dlen;
            char *back = decode(toks[f], &tk, 0, &dlen);
            assert_int_equal(dlen, n);
            assert_memory_equal(back, buf, n);
            free(back);
            check_stream(toks[f], &tk, buf, n, false);
        }
    }
    g4_tokens_free(&tk);
}

static void test_stream_holds_partial_chars(void **state) {
    (void)state;
    const g4_tokenizer *t = toks[FMT_GGUF];
    g4_error err = {0};
    g4_detokenizer *d;
    assert_int_equal(g4_detokenizer_create(t, 0, &d, &err), G4_OK);
    /* 🦙 is not in the vocabulary: it encodes as four byte tokens */
    int32_t llama[] = {238 + 0xF0, 238 + 0x9F, 238 + 0xA6, 238 + 0x99};
    const char *s;
    size_t n;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(g4_detokenizer_push(d, llama[i], &s, &n, &err), G4_OK);
        assert_int_equal(n, 0);
    }
    assert_int_equal(g4_detokenizer_push(d, llama[3], &s, &n, &err), G4_OK);
    assert_int_equal(n, 4);
    assert_memory_equal(s, "\xF0\x9F\xA6\x99", 4);
    /* a held prefix that the next token cannot continue is released as it is */
    assert_int_equal(g4_detokenizer_push(d, 238 + 0xE2, &s, &n, &err), G4_OK);
    assert_int_equal(n, 0);
    int32_t hello = g4_tokenizer_find(t, "Hello", 5);
    assert_true(hello >= 0);
    assert_int_equal(g4_detokenizer_push(d, hello, &s, &n, &err), G4_OK);
    assert_int_equal(n, 6);
    assert_memory_equal(s, "\xE2Hello", 6);
    /* ▁ becomes a space; an unfinished character comes out on flush */
    assert_int_equal(g4_detokenizer_push(d, 236743, &s, &n, &err), G4_OK);
    assert_int_equal(n, 1);
    assert_int_equal(s[0], ' ');
    assert_int_equal(g4_detokenizer_push(d, 238 + 0xE2, &s, &n, &err), G4_OK);
    assert_int_equal(g4_detokenizer_push(d, 238 + 0x96, &s, &n, &err), G4_OK);
    assert_int_equal(n, 0);
    g4_detokenizer_flush(d, &s, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(s, "\xE2\x96", 2);
    g4_detokenizer_flush(d, &s, &n);
    assert_int_equal(n, 0);
    /* an id out of range is an error that names it */
    assert_int_equal(g4_detokenizer_push(d, 262144, &s, &n, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "262144"));
    g4_detokenizer_free(d);
    assert_int_equal(g4_detokenizer_create(t, G4_DETOKENIZE_SKIP_SPECIAL, &d, &err), G4_OK);
    assert_int_equal(g4_detokenizer_push(d, 2, &s, &n, &err), G4_OK);
    assert_int_equal(n, 0);
    assert_int_equal(g4_detokenizer_push(d, 100, &s, &n, &err), G4_OK); /* not special */
    assert_int_equal(n, 10);
    g4_detokenizer_free(d);

    int32_t bad[] = {5, -1};
    char *text;
    size_t len;
    assert_int_equal(g4_tokenizer_decode(t, bad, 2, 0, &text, &len, &err), G4_ERR_ARG);
    assert_non_null(strstr(err.message, "position 1"));
    assert_null(text);
}

static void test_long_line(void **state) {
    (void)state;
    size_t n_cases;
    jl_case *cases = read_jsonl("tokenizer/corpus.jsonl", &n_cases);
    const size_t size = 1 << 20;
    char *line = malloc(size);
    size_t at = 0;
    for (size_t i = 0; at < size; i = (i + 1) % n_cases) {
        for (size_t k = 0; k < cases[i].len && at < size; k++)
            line[at++] = cases[i].text[k] == '\n' ? ' ' : cases[i].text[k];
        if (at < size) line[at++] = ' ';
    }
    g4_tokens tk = {0}, parts = {0}, one = {0};
    for (int f = 0; f < N_FMT; f++) {
        encode(toks[f], line, size, 0, &tk);
        assert_true(tk.n > size / 16);
        size_t dlen;
        char *back = decode(toks[f], &tk, 0, &dlen);
        assert_int_equal(dlen, size);
        assert_memory_equal(back, line, size);
        free(back);
    }
    /* one character repeated: the most equal-rank merges at once */
    memset(line, 'a', size);
    encode(toks[FMT_GGUF], line, size, 0, &tk);
    size_t dlen;
    char *back = decode(toks[FMT_GGUF], &tk, 0, &dlen);
    assert_int_equal(dlen, size);
    assert_memory_equal(back, line, size);
    free(back);
    /* runs are split only at newlines: text with newlines encodes as its pieces do alone */
    const char *text = "first line\n\nsecond  line \nthird";
    const char *pieces[] = {"first line", "\n\n", "second  line ", "\n", "third"};
    for (size_t i = 0; i < 5; i++) {
        encode(toks[FMT_JSON], pieces[i], strlen(pieces[i]), 0, &one);
        for (size_t k = 0; k < one.n; k++) {
            if (parts.n == parts.cap) {
                parts.cap = parts.cap ? parts.cap * 2 : 64;
                parts.ids = realloc(parts.ids, parts.cap * sizeof *parts.ids);
            }
            parts.ids[parts.n++] = one.ids[k];
        }
    }
    encode(toks[FMT_JSON], text, strlen(text), 0, &tk);
    expect_ids(&tk, parts.ids, parts.n, "newline split");
    g4_tokens_free(&tk);
    g4_tokens_free(&parts);
    g4_tokens_free(&one);
    free(line);
    free_cases(cases, n_cases);
}

/* ---- hand-made and broken files ---------------------------------------------------------- */

static char tmp[256];

static const char *write_tmp(const char *name, const void *data, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
    return path;
}

static g4_status load_text(const char *name, const char *json, g4_tokenizer **t, g4_error *err) {
    return g4_tokenizer_load(write_tmp(name, json, strlen(json)), t, err);
}

/* A toy vocabulary to pin down the merge order: lowest rank first, leftmost among equals. */
#define TOY_VOCAB                                                                               \
    "\"<pad>\": 0, \"<bos>\": 1, \"a\": 2, \"aa\": 3, \"aaa\": 4, \"b\": 5, \"ab\": 6, "       \
    "\"\\u2581\": 7, \"\\u2581a\": 8, \"<0x61>\": 9, \"<0xFF>\": 10, \"x\\\"y\": 11, "          \
    "\"<0x0A>\": 12, \"\\n\": 13"

static void check_toy(const g4_tokenizer *t) {
    g4_tokens tk = {0};
    encode(t, "aaa", 3, 0, &tk);
    expect_ids(&tk, (int32_t[]){4}, 1, "aaa");
    encode(t, "aaaa", 4, 0, &tk); /* a a | a a first, then (aa, aa) has no merge */
    expect_ids(&tk, (int32_t[]){3, 3}, 2, "aaaa");
    encode(t, "aab", 3, 0, &tk); /* (a,b) has rank 2, below (aa,a); a a merges first */
    expect_ids(&tk, (int32_t[]){3, 5}, 2, "aab");
    encode(t, " a", 2, 0, &tk);
    expect_ids(&tk, (int32_t[]){8}, 1, " a");
    encode(t, "\xff" "c\n", 3, 0, &tk); /* invalid byte → <0xFF>; '\n' is in the vocabulary */
    expect_ids(&tk, (int32_t[]){10, 14, 13}, 3, "\\xffc\\n");
    g4_tokens_free(&tk);
}

static void test_toy_json(void **state) {
    (void)state;
    g4_error err = {0};
    g4_tokenizer *t;
    /* merges as strings */
    const char *s1 = "{\"added_tokens\": [{\"id\": 1, \"content\": \"<bos>\", \"special\": true}],"
                     " \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {" TOY_VOCAB
                     ", \"c\": 14, \"<0x63>\": 15}, \"merges\": [\"a a\", \"aa a\", \"a b\", "
                     "\"\\u2581 a\"]}}";
    if (load_text("toy1.json", s1, &t, &err)) fail_msg("%s", err.message);
    check_toy(t);
    g4_tokens tk = {0};
    encode(t, "<bos>a", 6, G4_TOKENIZE_SPECIAL, &tk);
    expect_ids(&tk, (int32_t[]){1, 2}, 2, "<bos>a");
    assert_string_equal(g4_tokenizer_piece(t, 11, NULL), "x\"y");
    assert_int_equal(g4_tokenizer_find(t, "x\"y", 3), 11);
    /* no token, no byte token and no <unk>: an error, not a guess */
    assert_int_equal(g4_tokenizer_encode(t, "az", 2, 0, &tk, &err), G4_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "byte 0x7A"));
    g4_tokens_free(&tk);
    g4_tokenizer_free(t);
    /* merges as pairs, members in another order, whitespace */
    const char *s2 = "\n{ \"model\" : { \"merges\" : [ [\"a\", \"a\"], [\"aa\", \"a\"], [\"a\", \"b\"],"
                     " [\"\\u2581\", \"a\"] ], \"vocab\": {" TOY_VOCAB ", \"c\": 14, \"<0x63>\": 15},"
                     " \"type\": \"BPE\", \"byte_fallback\": true },\n \"added_tokens\": [] }\n";
    if (load_text("toy2.json", s2, &t, &err)) fail_msg("%s", err.message);
    check_toy(t);
    assert_int_equal(g4_tokenizer_bos(t), 1);
    g4_tokenizer_free(t);
}

static void expect_load_error(const char *name, const char *json, g4_status code,
                              const char *needle) {
    g4_error err = {0};
    g4_tokenizer *t = NULL;
    g4_status st = load_text(name, json, &t, &err);
    if (st != code || !strstr(err.message, needle) || !strstr(err.message, name))
        fail_msg("%s: expected %d with \"%s\", got %d: %s", name, code, needle, st, err.message);
    assert_null(t);
}

static void test_bad_json(void **state) {
    (void)state;
    expect_load_error("e1.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
                      G4_ERR_UNSUPPORTED, "only BPE");
    expect_load_error("e2.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2},"
                      " \"merges\": []}}", G4_ERR_FORMAT, "token id 2 but only 2");
    expect_load_error("e3.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1},"
                      " \"merges\": [\"a c\"]}}", G4_ERR_FORMAT, "'c' is not in the vocabulary");
    expect_load_error("e4.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1},"
                      " \"merges\": [[\"a\", \"b\"]]}}", G4_ERR_FORMAT, "the result is not in");
    expect_load_error("e5.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0},"
                      " \"merges\": []}}", G4_ERR_FORMAT, "token id 0 appears twice");
    expect_load_error("e6.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\ud800\": 0}}}",
                      G4_ERR_FORMAT, "lone high surrogate");
    expect_load_error("e7.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\q\": 0}}}",
                      G4_ERR_FORMAT, "bad escape");
    expect_load_error("e8.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0.5}}}",
                      G4_ERR_FORMAT, "expected an integer");
    expect_load_error("e9.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}} x",
                      G4_ERR_FORMAT, "trailing");
    expect_load_error("e10.json", "{\"model\": {\"type\": \"BPE\"}}", G4_ERR_FORMAT,
                      "no model.vocab");
    expect_load_error("e11.json", "{\"added_tokens\": [{\"id\": 0, \"content\": \"b\"}], \"model\":"
                      " {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", G4_ERR_FORMAT, "differs");
    expect_load_error("e12.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}}}",
                      G4_ERR_FORMAT, "line 1, column");
    expect_load_error("e13.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0},"
                      " \"merges\": [\"ab\"]}}", G4_ERR_FORMAT, "not two tokens");
    expect_load_error("e14.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}",
                      G4_ERR_FORMAT, "out of range");
    expect_load_error("e15.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}",
                      G4_ERR_FORMAT, "empty");
    char nested[200] = "{\"a\": ";
    for (int i = 0; i < 60; i++) strcat(nested, "[");
    for (int i = 0; i < 60; i++) strcat(nested, "]");
    strcat(nested, "}");
    expect_load_error("e16.json", nested, G4_ERR_FORMAT, "no model.vocab");
    char deep[700];
    memset(deep, '[', sizeof deep);
    memcpy(deep, "{\"a\": ", 6);
    deep[sizeof deep - 1] = 0;
    expect_load_error("e17.json", deep, G4_ERR_FORMAT, "nesting deeper");
    expect_load_error("e18.txt", "plain text", G4_ERR_FORMAT, "neither");
    expect_load_error("e19.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0},"
                      " \"ignore_merges\": true}}", G4_ERR_UNSUPPORTED, "ignore_merges");
    expect_load_error("e20.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\r\": 0}}}",
                      G4_ERR_FORMAT, "raw control byte");
}

static void test_truncated_json(void **state) {
    (void)state;
    char path[1024];
    size_t size;
    char *data = test_read_file(test_fixture_path(path, sizeof path, "tokenizer/tokenizer.json"),
                                &size);
    size_t cuts[] = {0, 1, 17, 1000, 300000, 2000000, 9000000, 15000000, size - 2, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        g4_error err = {0};
        g4_tokenizer *t = NULL;
        const char *p = write_tmp("cut.json", data, cuts[i]);
        g4_status st = g4_tokenizer_load_json(p, &t, &err);
        if (st != G4_ERR_FORMAT || !strstr(err.message, "cut.json"))
            fail_msg("cut at %zu: %d %s", cuts[i], st, err.message);
        assert_null(t);
    }
    /* a separator removed in the middle of the vocabulary: `"x": 123, "y"` → `"x": 123  "y"` */
    char *vocab = strstr(data, "\"vocab\"");
    assert_non_null(vocab);
    char *sep = vocab + 5000;
    while (!(sep[-1] >= '0' && sep[-1] <= '9' && sep[0] == ',' && sep[1] == ' ' && sep[2] == '"'))
        sep++;
    *sep = ' ';
    g4_error err = {0};
    g4_tokenizer *t = NULL;
    assert_int_equal(g4_tokenizer_load_json(write_tmp("damaged.json", data, size), &t, &err),
                     G4_ERR_FORMAT);
    assert_non_null(strstr(err.message, "line"));
    free(data);
}

static void test_load_paths(void **state) {
    (void)state;
    g4_error err = {0};
    g4_tokenizer *t = NULL;
    char path[600], target[1024];
    snprintf(path, sizeof path, "%s/missing.json", tmp);
    assert_int_equal(g4_tokenizer_load(path, &t, &err), G4_ERR_IO);
    assert_non_null(strstr(err.message, "missing.json"));
    assert_int_equal(g4_tokenizer_load_gguf(path, &t, &err), G4_ERR_IO);
    assert_int_equal(g4_tokenizer_load_json(path, &t, &err), G4_ERR_IO);
    /* a model directory: without and then with tokenizer.json (a link to the fixture) */
    snprintf(path, sizeof path, "%s/model", tmp);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(g4_tokenizer_load_dir(path, &t, &err), G4_ERR_IO);
    assert_non_null(strstr(err.message, "no tokenizer.json"));
    assert_int_equal(g4_tokenizer_load(path, &t, &err), G4_ERR_IO);
    char link[700];
    snprintf(link, sizeof link, "%s/tokenizer.json", path);
    test_fixture_path(target, sizeof target, "tokenizer/tokenizer.json");
    char abs_target[4096];
    assert_non_null(realpath(target, abs_target));
    assert_int_equal(symlink(abs_target, link), 0);
    if (g4_tokenizer_load_dir(path, &t, &err)) fail_msg("%s", err.message);
    assert_int_equal(g4_tokenizer_n_vocab(t), 262144);
    g4_tokenizer_free(t);
    /* a GGUF that is not a tokenizer */
    const uint8_t gguf[24] = {'G', 'G', 'U', 'F', 3};
    assert_int_equal(g4_tokenizer_load(write_tmp("empty.gguf", gguf, sizeof gguf), &t, &err),
                     G4_ERR_FORMAT);
    assert_non_null(strstr(err.message, "tokenizer.ggml.model"));
    /* a GGUF tokenizer of another kind */
    uint8_t llama[24 + 8 + 20 + 4 + 8 + 5] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0,
                                              0, 0, 0, 0, 1};
    size_t at = 24;
    llama[at] = 20;
    memcpy(llama + at + 8, "tokenizer.ggml.model", 20);
    at += 28;
    llama[at] = 8; /* string */
    llama[at + 4] = 5;
    memcpy(llama + at + 12, "llama", 5);
    assert_int_equal(g4_tokenizer_load(write_tmp("llama.gguf", llama, sizeof llama), &t, &err),
                     G4_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "\"llama\""));
}

int main(void) {
    test_tmpdir(tmp, sizeof tmp, "tokenizer");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_special),
        cmocka_unit_test(test_lookups),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_stream_holds_partial_chars),
        cmocka_unit_test(test_long_line),
        cmocka_unit_test(test_toy_json),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_truncated_json),
        cmocka_unit_test(test_load_paths),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) rc = 1;
    return rc;
}
