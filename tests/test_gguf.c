/* GGUF reader: the real vocabulary file, a hand-built file with every value type and some
 * tensors, and corrupt variants of both (truncations, lying lengths and counts, random
 * damage), which must give an error naming the problem and never a crash. */
#include "test_util.h"

#include "formats/gguf.h"

/* ---- a tiny GGUF writer ------------------------------------------------------------------ */

typedef struct wbuf {
    uint8_t *d;
    size_t n, cap;
} wbuf;

static void w_bytes(wbuf *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->d = realloc(w->d, w->cap);
        assert_non_null(w->d);
    }
    memcpy(w->d + w->n, p, n);
    w->n += n;
}
static void w_u8(wbuf *w, uint8_t v) { w_bytes(w, &v, 1); }
static void w_u16(wbuf *w, uint16_t v) { w_bytes(w, (uint8_t[]){(uint8_t)v, (uint8_t)(v >> 8)}, 2); }
static void w_u32(wbuf *w, uint32_t v) {
    for (int i = 0; i < 4; i++) w_u8(w, (uint8_t)(v >> 8 * i));
}
static void w_u64(wbuf *w, uint64_t v) {
    for (int i = 0; i < 8; i++) w_u8(w, (uint8_t)(v >> 8 * i));
}
static void w_f32(wbuf *w, float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    w_u32(w, b);
}
static void w_f64(wbuf *w, double f) {
    uint64_t b;
    memcpy(&b, &f, 8);
    w_u64(w, b);
}
static void w_str(wbuf *w, const char *s) {
    w_u64(w, strlen(s));
    w_bytes(w, s, strlen(s));
}
static void w_key(wbuf *w, const char *key, uint32_t type) {
    w_str(w, key);
    w_u32(w, type);
}
static void w_header(wbuf *w, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    w_bytes(w, "GGUF", 4);
    w_u32(w, version);
    w_u64(w, n_tensors);
    w_u64(w, n_kv);
}
static void w_tensor(wbuf *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                     uint64_t offset) {
    w_str(w, name);
    w_u32(w, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) w_u64(w, ne[i]);
    w_u32(w, type);
    w_u64(w, offset);
}
static void w_pad(wbuf *w, size_t align) {
    while (w->n % align) w_u8(w, 0);
}

/* Every value type, nested arrays, alignment 64 and three tensors; the file ends exactly where
 * the last tensor's data does, so every shorter prefix is truncated. */
static wbuf build_full(void) {
    wbuf w = {0};
    w_header(&w, 3, 3, 19);
    w_key(&w, "general.architecture", G4_GGUF_STRING);
    w_str(&w, "test");
    w_key(&w, "general.alignment", G4_GGUF_UINT32);
    w_u32(&w, 64);
    w_key(&w, "t.u8", G4_GGUF_UINT8);
    w_u8(&w, 200);
    w_key(&w, "t.i8", G4_GGUF_INT8);
    w_u8(&w, (uint8_t)-5);
    w_key(&w, "t.u16", G4_GGUF_UINT16);
    w_u16(&w, 60000);
    w_key(&w, "t.i16", G4_GGUF_INT16);
    w_u16(&w, (uint16_t)-30000);
    w_key(&w, "t.u32", G4_GGUF_UINT32);
    w_u32(&w, 4000000000u);
    w_key(&w, "t.i32", G4_GGUF_INT32);
    w_u32(&w, (uint32_t)-2000000000);
    w_key(&w, "t.f32", G4_GGUF_FLOAT32);
    w_f32(&w, 1.5f);
    w_key(&w, "t.bool", G4_GGUF_BOOL);
    w_u8(&w, 1);
    w_key(&w, "t.u64", G4_GGUF_UINT64);
    w_u64(&w, 1ull << 40);
    w_key(&w, "t.i64", G4_GGUF_INT64);
    w_u64(&w, (uint64_t)-(1ll << 40));
    w_key(&w, "t.f64", G4_GGUF_FLOAT64);
    w_f64(&w, 2.25);
    w_key(&w, "t.str", G4_GGUF_STRING);
    w_str(&w, "hello");
    w_key(&w, "t.arr_i32", G4_GGUF_ARRAY);
    w_u32(&w, G4_GGUF_INT32);
    w_u64(&w, 3);
    w_u32(&w, 1);
    w_u32(&w, (uint32_t)-2);
    w_u32(&w, 3);
    w_key(&w, "t.arr_str", G4_GGUF_ARRAY);
    w_u32(&w, G4_GGUF_STRING);
    w_u64(&w, 3);
    w_str(&w, "a");
    w_str(&w, "bc");
    w_str(&w, "");
    w_key(&w, "t.nested", G4_GGUF_ARRAY); /* [[1, 2], [3]] of uint8 */
    w_u32(&w, G4_GGUF_ARRAY);
    w_u64(&w, 2);
    w_u32(&w, G4_GGUF_UINT8);
    w_u64(&w, 2);
    w_u8(&w, 1);
    w_u8(&w, 2);
    w_u32(&w, G4_GGUF_UINT8);
    w_u64(&w, 1);
    w_u8(&w, 3);
    w_key(&w, "t.empty", G4_GGUF_ARRAY);
    w_u32(&w, G4_GGUF_STRING);
    w_u64(&w, 0);
    w_key(&w, "t.arr_f32", G4_GGUF_ARRAY);
    w_u32(&w, G4_GGUF_FLOAT32);
    w_u64(&w, 2);
    w_f32(&w, 0.5f);
    w_f32(&w, -4.0f);
    w_tensor(&w, "a", 2, (uint64_t[]){4, 2}, 0, 0);     /* f32: 32 bytes */
    w_tensor(&w, "b", 1, (uint64_t[]){64}, 8, 64);      /* q8_0: 2 blocks of 34 bytes */
    w_tensor(&w, "c", 3, (uint64_t[]){3, 1, 1}, 30, 192); /* bf16: 6 bytes */
    w_pad(&w, 64);
    size_t data = w.n;
    for (int i = 0; i < 198; i++) w_u8(&w, (uint8_t)i);
    assert_int_equal(w.n - data, 198);
    return w;
}

/* Parses a private copy of exactly n bytes, so that AddressSanitizer sees any read past it. */
static g4_status parse_copy(const uint8_t *d, size_t n, g4_error *err) {
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n) memcpy(copy, d, n);
    g4_gguf *g = NULL;
    g4_status st = g4_gguf_parse(copy, n, "test.gguf", &g, err);
    if (st == G4_OK) {
        /* whatever parsed must point inside the buffer */
        for (size_t i = 0; i < g4_gguf_n_tensors(g); i++) {
            const g4_gguf_tensor *t = g4_gguf_tensor_at(g, i);
            assert_true(t->data >= copy && t->data + t->size <= copy + n);
        }
        for (size_t i = 0; i < g4_gguf_n_kv(g); i++) {
            const g4_gguf_kv *kv = g4_gguf_kv_at(g, i);
            assert_true((const uint8_t *)kv->key.data >= copy &&
                        (const uint8_t *)kv->key.data + kv->key.len <= copy + n);
            if (kv->value.type == G4_GGUF_ARRAY) {
                g4_gguf_iter it;
                g4_gguf_value v;
                g4_gguf_iter_init(&it, &kv->value.arr);
                uint64_t count = 0;
                while (g4_gguf_iter_next(&it, &v)) count++;
                assert_int_equal(count, kv->value.arr.n);
            }
        }
        g4_gguf_close(g);
    } else {
        assert_true(strlen(err->message) > 0);
    }
    free(copy);
    return st;
}

static void expect_error(const wbuf *w, g4_status code, const char *needle) {
    g4_error err = {0};
    g4_status st = parse_copy(w->d, w->n, &err);
    if (st != code || !strstr(err.message, needle))
        fail_msg("expected status %d with \"%s\", got %d: %s", code, needle, st, err.message);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_fixture_vocab(void **state) {
    (void)state;
    char path[1024];
    test_fixture_path(path, sizeof path, "tokenizer/ggml-vocab-gemma-4.gguf");
    g4_error err = {0};
    g4_gguf *g;
    if (g4_gguf_open(path, &g, &err)) fail_msg("%s", err.message);
    assert_int_equal(g4_gguf_version(g), 3);
    assert_int_equal(g4_gguf_n_kv(g), 42);
    assert_int_equal(g4_gguf_n_tensors(g), 0);
    assert_int_equal(g4_gguf_alignment(g), 32);

    g4_gguf_str s;
    assert_int_equal(g4_gguf_get_str(g, "general.architecture", &s, &err), G4_OK);
    assert_int_equal(s.len, 6);
    assert_memory_equal(s.data, "gemma4", 6);

    g4_gguf_array tokens;
    assert_int_equal(g4_gguf_get_array(g, "tokenizer.ggml.tokens", G4_GGUF_STRING, &tokens, &err),
                     G4_OK);
    assert_int_equal(tokens.n, 262144);
    g4_gguf_iter it;
    g4_gguf_value v;
    g4_gguf_iter_init(&it, &tokens);
    uint64_t n = 0;
    while (g4_gguf_iter_next(&it, &v)) {
        if (n == 0) assert_true(v.str.len == 5 && !memcmp(v.str.data, "<pad>", 5));
        if (n == 2) assert_true(v.str.len == 5 && !memcmp(v.str.data, "<bos>", 5));
        if (n == 105) assert_true(v.str.len == 7 && !memcmp(v.str.data, "<|turn>", 7));
        if (n == 238) assert_true(v.str.len == 6 && !memcmp(v.str.data, "<0x00>", 6));
        n++;
    }
    assert_int_equal(n, 262144);

    g4_gguf_array types, merges;
    assert_int_equal(
        g4_gguf_get_array(g, "tokenizer.ggml.token_type", G4_GGUF_INT32, &types, &err), G4_OK);
    assert_int_equal(types.n, 262144);
    assert_int_equal(g4_gguf_array_int(&types, 2), 3);   /* control */
    assert_int_equal(g4_gguf_array_int(&types, 48), 4);  /* user defined */
    assert_int_equal(g4_gguf_array_int(&types, 238), 6); /* byte */
    assert_int_equal(g4_gguf_array_int(&types, 1000), 1);
    assert_int_equal(g4_gguf_get_array(g, "tokenizer.ggml.merges", G4_GGUF_STRING, &merges, &err),
                     G4_OK);
    assert_int_equal(merges.n, 514906);

    uint64_t u;
    assert_int_equal(g4_gguf_get_uint(g, "tokenizer.ggml.bos_token_id", &u, &err), G4_OK);
    assert_int_equal(u, 2);
    assert_int_equal(g4_gguf_get_uint(g, "gemma4.block_count", &u, &err), G4_OK);
    assert_int_equal(u, 30);
    double f;
    assert_int_equal(g4_gguf_get_float(g, "gemma4.rope.freq_base", &f, &err), G4_OK);
    assert_true(f == 1000000.0);
    assert_int_equal(g4_gguf_get_float(g, "gemma4.final_logit_softcapping", &f, &err), G4_OK);
    assert_true(f == 30.0);
    bool b;
    assert_int_equal(g4_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, &err), G4_OK);
    assert_true(b);
    g4_gguf_array pattern, kv_heads;
    assert_int_equal(g4_gguf_get_array(g, "gemma4.attention.sliding_window_pattern",
                                       G4_GGUF_BOOL, &pattern, &err), G4_OK);
    assert_int_equal(pattern.n, 30);
    assert_int_equal(g4_gguf_array_int(&pattern, 0), 1);
    assert_int_equal(g4_gguf_array_int(&pattern, 5), 0);
    assert_int_equal(g4_gguf_get_array(g, "gemma4.attention.head_count_kv", G4_GGUF_INT32,
                                       &kv_heads, &err), G4_OK);
    assert_int_equal(g4_gguf_array_int(&kv_heads, 5), 2);
    assert_int_equal(g4_gguf_get_str(g, "tokenizer.chat_template", &s, &err), G4_OK);
    assert_true(s.len > 1000);

    /* errors name the file and the key */
    assert_int_equal(g4_gguf_get_uint(g, "no.such.key", &u, &err), G4_ERR_FORMAT);
    assert_non_null(strstr(err.message, "no.such.key"));
    assert_non_null(strstr(err.message, "ggml-vocab-gemma-4.gguf"));
    assert_int_equal(g4_gguf_get_uint(g, "general.architecture", &u, &err), G4_ERR_FORMAT);
    assert_non_null(strstr(err.message, "is a string"));
    assert_int_equal(g4_gguf_get_array(g, "tokenizer.ggml.tokens", G4_GGUF_INT32, &tokens, &err),
                     G4_ERR_FORMAT);
    assert_non_null(strstr(err.message, "array of string"));
    assert_null(g4_gguf_find(g, "tokenizer"));
    assert_null(g4_gguf_find_tensor(g, "token_embd.weight"));
    g4_gguf_close(g);
}

static void test_every_type(void **state) {
    (void)state;
    wbuf w = build_full();
    g4_error err = {0};
    g4_gguf *g;
    if (g4_gguf_parse(w.d, w.n, "full.gguf", &g, &err)) fail_msg("%s", err.message);
    assert_int_equal(g4_gguf_n_kv(g), 19);
    assert_int_equal(g4_gguf_alignment(g), 64);
    uint64_t u;
    int64_t i;
    double f;
    bool b;
    g4_gguf_str s;
    assert_int_equal(g4_gguf_get_uint(g, "t.u8", &u, &err), 0);
    assert_int_equal(u, 200);
    assert_int_equal(g4_gguf_get_int(g, "t.i8", &i, &err), 0);
    assert_int_equal(i, -5);
    assert_int_equal(g4_gguf_get_uint(g, "t.u16", &u, &err), 0);
    assert_int_equal(u, 60000);
    assert_int_equal(g4_gguf_get_int(g, "t.i16", &i, &err), 0);
    assert_int_equal(i, -30000);
    assert_int_equal(g4_gguf_get_uint(g, "t.u32", &u, &err), 0);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(g4_gguf_get_int(g, "t.i32", &i, &err), 0);
    assert_int_equal(i, -2000000000);
    assert_int_equal(g4_gguf_get_uint(g, "t.u64", &u, &err), 0);
    assert_int_equal(u, 1ull << 40);
    assert_int_equal(g4_gguf_get_int(g, "t.i64", &i, &err), 0);
    assert_true(i == -(1ll << 40));
    assert_int_equal(g4_gguf_get_uint(g, "t.i64", &u, &err), G4_ERR_FORMAT); /* negative */
    assert_int_equal(g4_gguf_get_float(g, "t.f32", &f, &err), 0);
    assert_true(f == 1.5);
    assert_int_equal(g4_gguf_get_float(g, "t.f64", &f, &err), 0);
    assert_true(f == 2.25);
    assert_int_equal(g4_gguf_get_bool(g, "t.bool", &b, &err), 0);
    assert_true(b);
    assert_int_equal(g4_gguf_get_str(g, "t.str", &s, &err), 0);
    assert_true(s.len == 5 && !memcmp(s.data, "hello", 5));

    g4_gguf_array a;
    assert_int_equal(g4_gguf_get_array(g, "t.arr_i32", G4_GGUF_INT32, &a, &err), 0);
    assert_int_equal(a.n, 3);
    assert_int_equal(g4_gguf_array_int(&a, 1), -2);
    assert_int_equal(g4_gguf_get_array(g, "t.arr_f32", G4_GGUF_FLOAT32, &a, &err), 0);
    assert_true(g4_gguf_array_float(&a, 1) == -4.0);

    assert_int_equal(g4_gguf_get_array(g, "t.arr_str", G4_GGUF_STRING, &a, &err), 0);
    g4_gguf_iter it;
    g4_gguf_value v;
    const char *want[] = {"a", "bc", ""};
    g4_gguf_iter_init(&it, &a);
    for (int k = 0; k < 3; k++) {
        assert_true(g4_gguf_iter_next(&it, &v));
        assert_int_equal(v.str.len, strlen(want[k]));
        assert_memory_equal(v.str.data, want[k], v.str.len);
    }
    assert_false(g4_gguf_iter_next(&it, &v));

    assert_int_equal(g4_gguf_get_array(g, "t.nested", G4_GGUF_ARRAY, &a, &err), 0);
    assert_int_equal(a.n, 2);
    g4_gguf_iter_init(&it, &a);
    assert_true(g4_gguf_iter_next(&it, &v));
    assert_int_equal(v.arr.type, G4_GGUF_UINT8);
    assert_int_equal(v.arr.n, 2);
    assert_int_equal(g4_gguf_array_int(&v.arr, 1), 2);
    assert_true(g4_gguf_iter_next(&it, &v));
    assert_int_equal(v.arr.n, 1);
    assert_int_equal(g4_gguf_array_int(&v.arr, 0), 3);
    assert_false(g4_gguf_iter_next(&it, &v));
    assert_int_equal(g4_gguf_get_array(g, "t.empty", -1, &a, &err), 0);
    assert_int_equal(a.n, 0);

    assert_int_equal(g4_gguf_n_tensors(g), 3);
    uint64_t data = g4_gguf_data_offset(g);
    assert_int_equal(data % 64, 0);
    const g4_gguf_tensor *t = g4_gguf_find_tensor(g, "a");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 4);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->size, 32);
    assert_ptr_equal(t->data, w.d + data);
    t = g4_gguf_find_tensor(g, "b");
    assert_non_null(t);
    assert_int_equal(t->size, 68);
    assert_ptr_equal(t->data, w.d + data + 64);
    assert_int_equal(t->data[0], 64); /* the byte pattern written at data + 64 */
    t = g4_gguf_find_tensor(g, "c");
    assert_non_null(t);
    assert_int_equal(t->size, 6);
    assert_ptr_equal(t->data + t->size, w.d + w.n);
    assert_null(g4_gguf_find_tensor(g, "d"));
    assert_string_equal(g4_ggml_type_name(12), "q4_K");
    assert_int_equal(g4_ggml_type_size(12), 144);
    assert_null(g4_ggml_type_name(4));
    g4_gguf_close(g);
    free(w.d);
}

static void test_truncated_everywhere(void **state) {
    (void)state;
    wbuf w = build_full();
    g4_error err;
    assert_int_equal(parse_copy(w.d, w.n, &err), G4_OK);
    for (size_t n = 0; n < w.n; n++) {
        memset(&err, 0, sizeof err);
        g4_status st = parse_copy(w.d, n, &err);
        if (st != G4_ERR_FORMAT) fail_msg("prefix of %zu bytes: status %d (%s)", n, st, err.message);
    }
    free(w.d);
}

static void test_fixture_truncated(void **state) {
    (void)state;
    char path[1024];
    size_t size;
    uint8_t *d = test_read_file(test_fixture_path(path, sizeof path,
                                                  "tokenizer/ggml-vocab-gemma-4.gguf"), &size);
    /* The last key/value ends at the end of the file, so every prefix is truncated. Positions
     * are spread over the header, the 262k token strings, the merges and the template. */
    uint64_t x = 88172645463325252ull;
    for (int k = 0; k < 80; k++) {
        size_t n;
        if (k < 40) n = (size_t)k * 7;
        else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            n = (size_t)(x % size);
        }
        g4_error err = {0};
        g4_gguf *g = NULL;
        g4_status st = g4_gguf_parse(d, n, "vocab.gguf", &g, &err);
        if (st != G4_ERR_FORMAT) fail_msg("prefix of %zu bytes: status %d (%s)", n, st, err.message);
        assert_null(g);
        if (n > 24) assert_non_null(strstr(err.message, "vocab.gguf"));
    }
    free(d);
}

static void test_lies(void **state) {
    (void)state;
    wbuf w = {0};

    w_bytes(&w, "GGUX", 4);
    w_u32(&w, 3);
    w_u64(&w, 0);
    w_u64(&w, 0);
    expect_error(&w, G4_ERR_FORMAT, "bad magic");
    w.n = 0;
    w_header(&w, 1, 0, 0);
    expect_error(&w, G4_ERR_UNSUPPORTED, "version 1");
    w.n = 0;
    w_header(&w, 9, 0, 0);
    expect_error(&w, G4_ERR_UNSUPPORTED, "version 9");
    w.n = 0;
    w_header(&w, 0x03000000u, 0, 0);
    expect_error(&w, G4_ERR_UNSUPPORTED, "big-endian");

    w.n = 0; /* the smallest valid file */
    w_header(&w, 2, 0, 0);
    g4_error err = {0};
    assert_int_equal(parse_copy(w.d, w.n, &err), G4_OK);

    w.n = 0;
    w_header(&w, 3, 0, 1ull << 62);
    expect_error(&w, G4_ERR_FORMAT, "key/value count");
    w.n = 0;
    w_header(&w, 3, 1ull << 62, 0);
    expect_error(&w, G4_ERR_FORMAT, "tensor count");

    w.n = 0; /* key length past the end */
    w_header(&w, 3, 0, 1);
    w_u64(&w, UINT64_MAX);
    w_bytes(&w, "abcdefgh", 8);
    expect_error(&w, G4_ERR_FORMAT, "string length");

    w.n = 0;
    w_header(&w, 3, 0, 1);
    w_key(&w, "k", 13);
    w_u64(&w, 0);
    expect_error(&w, G4_ERR_FORMAT, "unknown value type 13");

    w.n = 0;
    w_header(&w, 3, 0, 1);
    w_key(&w, "k", G4_GGUF_ARRAY);
    w_u32(&w, 99);
    w_u64(&w, 0);
    expect_error(&w, G4_ERR_FORMAT, "unknown array element type 99");

    w.n = 0; /* an array count no file could hold */
    w_header(&w, 3, 0, 1);
    w_key(&w, "k", G4_GGUF_ARRAY);
    w_u32(&w, G4_GGUF_UINT64);
    w_u64(&w, 1ull << 61);
    w_u64(&w, 7);
    expect_error(&w, G4_ERR_FORMAT, "array of 2305843009213693952 uint64");

    w.n = 0; /* a string array that promises more strings than it has */
    w_header(&w, 3, 0, 1);
    w_key(&w, "k", G4_GGUF_ARRAY);
    w_u32(&w, G4_GGUF_STRING);
    w_u64(&w, 3);
    w_str(&w, "only-this");
    w_str(&w, "and-that");
    expect_error(&w, G4_ERR_FORMAT, "truncated");

    w.n = 0; /* a string inside an array whose length runs past the end */
    w_header(&w, 3, 0, 1);
    w_key(&w, "k", G4_GGUF_ARRAY);
    w_u32(&w, G4_GGUF_STRING);
    w_u64(&w, 1);
    w_u64(&w, 1000);
    w_bytes(&w, "short", 5);
    expect_error(&w, G4_ERR_FORMAT, "string length 1000");

    w.n = 0; /* arrays nested 10 deep */
    w_header(&w, 3, 0, 1);
    w_key(&w, "k", G4_GGUF_ARRAY);
    for (int d = 0; d < 10; d++) {
        w_u32(&w, G4_GGUF_ARRAY);
        w_u64(&w, 1);
    }
    w_u32(&w, G4_GGUF_UINT8);
    w_u64(&w, 0);
    expect_error(&w, G4_ERR_FORMAT, "nested deeper");

    w.n = 0;
    w_header(&w, 3, 0, 1);
    w_key(&w, "k", G4_GGUF_BOOL);
    w_u8(&w, 2);
    expect_error(&w, G4_ERR_FORMAT, "bool byte 2");

    w.n = 0;
    w_header(&w, 3, 0, 2);
    w_key(&w, "same", G4_GGUF_UINT8);
    w_u8(&w, 1);
    w_key(&w, "same", G4_GGUF_UINT8);
    w_u8(&w, 2);
    expect_error(&w, G4_ERR_FORMAT, "duplicate key 'same'");

    uint32_t bad_align[] = {0, 3, 48};
    for (int k = 0; k < 3; k++) {
        w.n = 0;
        w_header(&w, 3, 0, 1);
        w_key(&w, "general.alignment", G4_GGUF_UINT32);
        w_u32(&w, bad_align[k]);
        expect_error(&w, G4_ERR_FORMAT, "general.alignment");
    }
    w.n = 0;
    w_header(&w, 3, 0, 1);
    w_key(&w, "general.alignment", G4_GGUF_STRING);
    w_str(&w, "32");
    expect_error(&w, G4_ERR_FORMAT, "general.alignment");

    /* tensors: each case is one tensor info and enough data for a 4-element f32 */
    struct {
        uint32_t n_dims;
        uint64_t ne[5];
        uint32_t type;
        uint64_t offset;
        g4_status code;
        const char *msg;
    } cases[] = {
        {5, {1, 1, 1, 1, 1}, 0, 0, G4_ERR_FORMAT, "5 dimensions"},
        {1, {4}, 4, 0, G4_ERR_UNSUPPORTED, "unknown ggml type 4"},
        {1, {4}, 1000, 0, G4_ERR_UNSUPPORTED, "unknown ggml type 1000"},
        {1, {33}, 8, 0, G4_ERR_FORMAT, "block size"},
        {1, {4}, 0, 8, G4_ERR_FORMAT, "not a multiple of the alignment"},
        {1, {4}, 0, 32, G4_ERR_FORMAT, "outside the file"},
        {1, {5}, 0, 0, G4_ERR_FORMAT, "outside the file"},
        {1, {4}, 0, UINT64_MAX - 31, G4_ERR_FORMAT, "outside the file"},
        {2, {1ull << 40, 1ull << 40}, 0, 0, G4_ERR_FORMAT, "overflows"},
        {1, {1ull << 63}, 0, 0, G4_ERR_FORMAT, "dimension 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        w.n = 0;
        w_header(&w, 3, 1, 0);
        w_tensor(&w, "weight", cases[k].n_dims, cases[k].ne, cases[k].type, cases[k].offset);
        w_pad(&w, 32);
        for (int b = 0; b < 16; b++) w_u8(&w, 0);
        expect_error(&w, cases[k].code, cases[k].msg);
    }
    w.n = 0;
    w_header(&w, 3, 2, 0);
    w_tensor(&w, "twice", 1, (uint64_t[]){4}, 0, 0);
    w_tensor(&w, "twice", 1, (uint64_t[]){4}, 0, 32);
    w_pad(&w, 32);
    for (int b = 0; b < 48; b++) w_u8(&w, 0);
    expect_error(&w, G4_ERR_FORMAT, "duplicate tensor name 'twice'");
    w.n = 0; /* tensor infos whose data section would start past the end */
    w_header(&w, 3, 1, 0);
    w_tensor(&w, "x", 1, (uint64_t[]){0}, 0, 0);
    w_u8(&w, 0);
    expect_error(&w, G4_ERR_FORMAT, "data section");
    free(w.d);
}

/* Random damage to the hand-built file: every outcome must be a clean error or a parse whose
 * views stay inside the buffer (parse_copy checks). */
static void test_random_damage(void **state) {
    (void)state;
    wbuf w = build_full();
    uint8_t *d = malloc(w.n);
    assert_non_null(d);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int ok = 0;
    for (int k = 0; k < 4000; k++) {
        memcpy(d, w.d, w.n);
        int flips = 1 + k % 4;
        for (int f = 0; f < flips; f++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t at = (size_t)(x % w.n);
            /* some damage is a random byte, some a large value dropped into a length field */
            if (k % 3 == 0 && at + 8 <= w.n) {
                uint64_t big = x >> (x & 31);
                memcpy(d + at, &big, 8);
            } else {
                d[at] = (uint8_t)(x >> 40);
            }
        }
        g4_error err = {0};
        if (parse_copy(d, w.n, &err) == G4_OK) ok++;
    }
    /* some damage lands in tensor data or values and is harmless; most is caught */
    assert_true(ok > 0 && ok < 4000);
    free(d);
    free(w.d);
}

static void test_open_file(void **state) {
    (void)state;
    char dir[256], path[1024];
    test_tmpdir(dir, sizeof dir, "gguf");
    snprintf(path, sizeof path, "%s/full.gguf", dir);
    wbuf w = build_full();
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(w.d, 1, w.n, f), w.n);
    fclose(f);
    g4_error err = {0};
    g4_gguf *g;
    if (g4_gguf_open(path, &g, &err)) fail_msg("%s", err.message);
    assert_int_equal(g4_gguf_n_tensors(g), 3);
    assert_string_equal(g4_gguf_name(g), path);
    g4_gguf_close(g);

    f = fopen(path, "wb"); /* truncated on disk */
    assert_non_null(f);
    assert_int_equal(fwrite(w.d, 1, w.n - 1, f), w.n - 1);
    fclose(f);
    assert_int_equal(g4_gguf_open(path, &g, &err), G4_ERR_FORMAT);
    assert_non_null(strstr(err.message, path));
    assert_null(g);

    snprintf(path, sizeof path, "%s/missing.gguf", dir);
    assert_int_equal(g4_gguf_open(path, &g, &err), G4_ERR_IO);
    assert_non_null(strstr(err.message, "missing.gguf"));
    assert_int_equal(g4_gguf_open(dir, &g, &err), G4_ERR_IO);
    free(w.d);
    test_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_vocab),     cmocka_unit_test(test_every_type),
        cmocka_unit_test(test_truncated_everywhere), cmocka_unit_test(test_fixture_truncated),
        cmocka_unit_test(test_lies),              cmocka_unit_test(test_random_damage),
        cmocka_unit_test(test_open_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
