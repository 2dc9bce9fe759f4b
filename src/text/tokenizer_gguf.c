/* The tokenizer from GGUF metadata (tokenizer.ggml.*), as llama.cpp's converter writes it. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"
#include "text/tokenizer_internal.h"
#include "util/error.h"

/* llama.cpp's token types */
enum {
    GGUF_TOKEN_NORMAL = 1,
    GGUF_TOKEN_UNKNOWN = 2,
    GGUF_TOKEN_CONTROL = 3,
    GGUF_TOKEN_USER_DEFINED = 4,
    GGUF_TOKEN_UNUSED = 5,
    GGUF_TOKEN_BYTE = 6,
};

static g4_status optional_id(const g4_gguf *g, const char *key, int32_t n_vocab, int32_t *out,
                             g4_error *err) {
    if (!g4_gguf_find(g, key)) return G4_OK;
    uint64_t v;
    g4_status st = g4_gguf_get_uint(g, key, &v, err);
    if (st) return st;
    if (v >= (uint64_t)n_vocab)
        return g4_fail(err, G4_ERR_FORMAT, "%s: %s = %" PRIu64 " is not below the vocabulary "
                       "size %d", g4_gguf_name(g), key, v, n_vocab);
    *out = (int32_t)v;
    return G4_OK;
}

static g4_status from_gguf(const g4_gguf *g, g4_tokenizer **out, g4_error *err) {
    const char *src = g4_gguf_name(g);
    g4_gguf_str model;
    g4_status st = g4_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (st) return st;
    /* "gemma4" is llama.cpp's name for this BPE-with-byte-fallback scheme; other names ("llama"
     * SentencePiece scores, "gpt2" byte-level BPE) tokenize differently. */
    if (model.len != 6 || memcmp(model.data, "gemma4", 6) != 0)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model is \"%.*s\"; only "
                       "\"gemma4\" is supported", src, model.len > 40 ? 40 : (int)model.len,
                       model.data);
    g4_gguf_array tokens, types = {0}, merges;
    st = g4_gguf_get_array(g, "tokenizer.ggml.tokens", G4_GGUF_STRING, &tokens, err);
    if (!st) st = g4_gguf_get_array(g, "tokenizer.ggml.merges", G4_GGUF_STRING, &merges, err);
    if (st) return st;
    if (tokens.n == 0 || tokens.n > INT32_MAX)
        return g4_fail(err, G4_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %" PRIu64 " entries",
                       src, tokens.n);
    bool have_types = g4_gguf_find(g, "tokenizer.ggml.token_type") != NULL;
    if (have_types) {
        st = g4_gguf_get_array(g, "tokenizer.ggml.token_type", -1, &types, err);
        if (st) return st;
        if (!g4_gguf_type_is_int(types.type) || types.n != tokens.n)
            return g4_fail(err, G4_ERR_FORMAT, "%s: tokenizer.ggml.token_type must be %" PRIu64
                           " integers, found %" PRIu64 " %s", src, tokens.n, types.n,
                           g4_gguf_type_name(types.type));
    }
    int32_t n = (int32_t)tokens.n;
    g4_tokenizer *t;
    st = tok_create(n, &t, src, err);
    if (st) return st;
    g4_gguf_iter it;
    g4_gguf_iter_init(&it, &tokens);
    g4_gguf_value v;
    for (int32_t i = 0; !st && g4_gguf_iter_next(&it, &v); i++) {
        int64_t gt = have_types ? g4_gguf_array_int(&types, (uint64_t)i) : GGUF_TOKEN_NORMAL;
        uint8_t byte;
        bool is_byte = tok_is_byte_piece(v.str.data, v.str.len, &byte);
        g4_token_type type;
        switch (gt) {
        case GGUF_TOKEN_NORMAL: case GGUF_TOKEN_UNUSED: type = G4_TOKEN_NORMAL; break;
        case GGUF_TOKEN_UNKNOWN: case GGUF_TOKEN_CONTROL: type = G4_TOKEN_CONTROL; break;
        case GGUF_TOKEN_USER_DEFINED: type = G4_TOKEN_USER; break;
        case GGUF_TOKEN_BYTE:
            if (!is_byte) {
                st = g4_fail(err, G4_ERR_FORMAT, "%s: token %d \"%.*s\" has type BYTE but is not "
                             "<0xXX>", src, i, v.str.len > 40 ? 40 : (int)v.str.len, v.str.data);
                continue;
            }
            type = G4_TOKEN_BYTE;
            break;
        default:
            st = g4_fail(err, G4_ERR_FORMAT, "%s: token %d has unknown type %" PRId64, src, i, gt);
            continue;
        }
        /* without a type table, <0xXX> pieces are the byte fallback as in tokenizer.json */
        if (!have_types && is_byte) type = G4_TOKEN_BYTE;
        st = tok_set_piece(t, i, v.str.data, v.str.len, type, src, err);
    }
    if (!st) st = tok_index_vocab(t, src, err);
    if (!st) st = tok_reserve_merges(t, (size_t)merges.n, src, err);
    char *scratch = NULL;
    size_t scratch_cap = 0;
    g4_gguf_iter_init(&it, &merges);
    while (!st && g4_gguf_iter_next(&it, &v))
        st = tok_add_merge_line(t, v.str.data, v.str.len, &scratch, &scratch_cap, src, err);
    free(scratch);
    if (!st) st = optional_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos, err);
    if (!st) st = optional_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos, err);
    if (!st) st = optional_id(g, "tokenizer.ggml.padding_token_id", n, &t->pad, err);
    if (!st) st = optional_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk, err);
    if (!st) st = tok_finish(t, src, err);
    if (st) {
        g4_tokenizer_free(t);
        return st;
    }
    *out = t;
    return G4_OK;
}

g4_status g4_tokenizer_load_gguf(const char *path, g4_tokenizer **out, g4_error *err) {
    *out = NULL;
    g4_gguf *g;
    g4_status st = g4_gguf_open(path, &g, err);
    if (st) return st;
    /* the pieces are copied into the tokenizer, so the file need not stay mapped */
    st = from_gguf(g, out, err);
    g4_gguf_close(g);
    return st;
}
