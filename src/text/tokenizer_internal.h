/* The tokenizer's tables and the builder the two file loaders share. Not part of the API. */
#ifndef G4_TEXT_TOKENIZER_INTERNAL_H
#define G4_TEXT_TOKENIZER_INTERNAL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "g4_tokenizer.h"

/* Pieces live back to back in one arena, each NUL-terminated; pieces are addressed by offset so
 * the arena may grow while loading. */
#define TOK_NO_PIECE UINT32_MAX

/* Open-addressing string → id index over the arena; id -1 = empty. The slot repeats the
 * piece's arena offset and length so that a probe touches the slot and the piece's bytes only:
 * loading resolves ~1.5M merge strings and is bound by cache misses. */
typedef struct tok_slot {
    uint32_t hash, off, len;
    int32_t id;
} tok_slot;

typedef struct tok_index {
    tok_slot *slots;
    size_t mask, n;
} tok_index;

/* (left id, right id) → (rank, merged id); rank -1 = empty. */
typedef struct tok_merge {
    int32_t a, b, rank, id;
} tok_merge;

struct g4_tokenizer {
    int32_t n_vocab;
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *off, *len; /* [n_vocab] */
    uint8_t *type;       /* [n_vocab] g4_token_type */

    tok_index vocab; /* every piece */
    tok_index added; /* CONTROL and USER pieces, matched whole in the text */

    tok_merge *merges;
    size_t merge_mask, n_merges;

    int32_t byte_id[256];  /* <0xXX> → id, -1 if absent */
    int32_t ascii_id[128]; /* one-byte characters, -1 if absent; ' ' maps to '▁' */
    int32_t space_id;      /* "▁" */
    /* Added-token matching tries only these lengths (descending) and only at bytes that start
     * some added token, so ordinary text costs one table probe per byte. */
    uint8_t added_first[256];
    uint32_t *added_lens;
    size_t n_added_lens;

    int32_t bos, eos, pad, unk;
};

/* tokenizer.json text already in memory (size bytes, no terminator needed); path names it in errors. */
g4_status g4_tokenizer_load_json_mem(const char *data, size_t size, const char *path, g4_tokenizer **out,
                                     g4_error *err);

/* Loader steps, in order: tok_create, tok_set_piece for every id, tok_index_vocab,
 * tok_add_merge for every merge (rank = call order), tok_finish. src names the file in errors. */
g4_status tok_create(int32_t n_vocab, g4_tokenizer **out, const char *src, g4_error *err);
/* Stores the piece of id (which must not have one yet). */
g4_status tok_set_piece(g4_tokenizer *t, int32_t id, const char *s, size_t len,
                        g4_token_type type, const char *src, g4_error *err);
bool tok_has_piece(const g4_tokenizer *t, int32_t id);
/* Checks every id got a piece, builds the lookup tables. */
g4_status tok_index_vocab(g4_tokenizer *t, const char *src, g4_error *err);
/* Sizes the merge table for n merges up front (optional: it grows as needed). */
g4_status tok_reserve_merges(g4_tokenizer *t, size_t n, const char *src, g4_error *err);
/* scratch/scratch_cap: a caller-owned buffer reused across calls (free it afterwards). */
g4_status tok_add_merge(g4_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                        char **scratch, size_t *scratch_cap, const char *src, g4_error *err);
/* "a b" → a, b split at the first space after the first byte (a token may begin with a space
 * but, in this vocabulary, never contains one after its first byte). */
g4_status tok_add_merge_line(g4_tokenizer *t, const char *line, size_t len, char **scratch,
                             size_t *scratch_cap, const char *src, g4_error *err);
g4_status tok_finish(g4_tokenizer *t, const char *src, g4_error *err);

int32_t tok_index_find(const g4_tokenizer *t, const tok_index *ix, const char *s, size_t len);

/* Length of the well-formed UTF-8 sequence at s[0..n) (n >= 1), or 0 when s[0] does not start
 * one (stray continuation, truncated, overlong, surrogate, beyond U+10FFFF). */
size_t tok_utf8_len(const uint8_t *s, size_t n);

/* True when s[0..len) is "<0xXX>" with upper-case hex; *byte receives the value. */
bool tok_is_byte_piece(const char *s, size_t len, uint8_t *byte);
#endif
