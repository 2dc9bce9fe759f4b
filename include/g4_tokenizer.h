/* g4 tokenizer: Gemma 4's BPE with byte fallback, loaded from a Hugging Face tokenizer.json or
 * from GGUF metadata; both give identical ids.
 *
 * Encoding, in order:
 *  1. Added tokens are cut out of the text whole, leftmost match first and the longest one at
 *     that position. Non-special added tokens (<|channel>, <|tool_call>, <|"|>, ...: HF
 *     "special": false, GGUF USER_DEFINED) are always cut out, as HF tokenizers and llama.cpp
 *     both do. Special ones (<bos>, <|turn>, <turn|>, <unused0>, ...: HF "special": true, GGUF
 *     CONTROL) only with G4_TOKENIZE_SPECIAL; without it they are ordinary text, so untrusted
 *     text cannot smuggle in control tokens.
 *  2. The rest is split into runs of '\n' and runs of everything else; each space becomes
 *     U+2581 '▁'; there is no other normalisation.
 *  3. Each run starts as one symbol per UTF-8 character (a character absent from the vocabulary
 *     becomes its bytes as <0xXX> tokens) and symbol pairs are merged lowest merge rank first,
 *     leftmost first among equal ranks (HF's order). O(n log n) in the run's length.
 *  Invalid UTF-8 is not an error: every byte that is not part of a well-formed UTF-8 sequence
 *  (stray continuation bytes, truncated sequences, overlong forms, surrogates, > U+10FFFF)
 *  becomes its own <0xXX> byte token, so decode(encode(x)) == x for any bytes x that do not
 *  contain '▁' itself (a literal U+2581 in the input is the space mark's token and decodes as a
 *  space, as in HF).
 *
 * Decoding maps '▁' back to a space and byte tokens back to their bytes, and writes the bytes
 * out exactly as the tokens give them (no U+FFFD substitution: a byte-exact round trip matters
 * more here than HF's lossy replacement; a caller that needs valid UTF-8 can substitute). Added
 * tokens decode to their text unless G4_DETOKENIZE_SKIP_SPECIAL drops the special ones.
 *
 * A g4_tokenizer is immutable after loading: any number of threads may use one at once. */
#ifndef G4_TOKENIZER_H
#define G4_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "g4.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct g4_tokenizer g4_tokenizer;

/* Sniffs the file: GGUF magic → GGUF metadata, '{' → tokenizer.json; a directory → its
 * tokenizer.json. */
g4_status g4_tokenizer_load(const char *path, g4_tokenizer **out, g4_error *err);
g4_status g4_tokenizer_load_json(const char *path, g4_tokenizer **out, g4_error *err);
g4_status g4_tokenizer_load_gguf(const char *path, g4_tokenizer **out, g4_error *err);
/* A model directory: loads DIR/tokenizer.json. */
g4_status g4_tokenizer_load_dir(const char *dir, g4_tokenizer **out, g4_error *err);
void g4_tokenizer_free(g4_tokenizer *t);

typedef enum g4_token_type {
    G4_TOKEN_NORMAL = 0,
    G4_TOKEN_CONTROL = 1, /* special added token: <bos>, <eos>, <|turn>, <turn|>, <unused0>... */
    G4_TOKEN_USER = 2,    /* non-special added token: <|channel>, <|tool_call>, <|"|>... */
    G4_TOKEN_BYTE = 3,    /* <0xXX> byte fallback */
} g4_token_type;

int32_t g4_tokenizer_n_vocab(const g4_tokenizer *t);
/* -1 when the tokenizer defines none. */
int32_t g4_tokenizer_bos(const g4_tokenizer *t);
int32_t g4_tokenizer_eos(const g4_tokenizer *t);
int32_t g4_tokenizer_pad(const g4_tokenizer *t);
int32_t g4_tokenizer_unk(const g4_tokenizer *t);

/* The vocabulary string of id ("▁the", "<0x0A>", "<|turn>"), NUL-terminated, owned by the
 * tokenizer; NULL when id is out of range. *len (optional) receives its length. */
const char *g4_tokenizer_piece(const g4_tokenizer *t, int32_t id, size_t *len);
/* G4_TOKEN_NORMAL for ids out of range. */
g4_token_type g4_tokenizer_token_type(const g4_tokenizer *t, int32_t id);
/* The id whose vocabulary string is exactly piece[0..len), or -1. */
int32_t g4_tokenizer_find(const g4_tokenizer *t, const char *piece, size_t len);
/* The id of the added token (special or not) spelled text, e.g. "<|turn>" → 105, or -1. */
int32_t g4_tokenizer_special_id(const g4_tokenizer *t, const char *text);

/* A growable list of ids. Zero-initialise; g4_tokenizer_encode appends to it. */
typedef struct g4_tokens {
    int32_t *ids;
    size_t n, cap;
} g4_tokens;
void g4_tokens_free(g4_tokens *tokens);

enum {
    G4_TOKENIZE_ADD_BOS = 1u << 0, /* start with <bos> */
    G4_TOKENIZE_SPECIAL = 1u << 1, /* cut special-token strings out of the text as their ids */
};

/* Appends the ids of text[0..len) to out (text may hold any bytes, NULs included). Fails only
 * when G4_TOKENIZE_ADD_BOS is asked of a tokenizer without <bos> (G4_ERR_ARG), for a run of
 * over 700 MB without a newline (G4_ERR_ARG), when a byte has neither a <0xXX> token nor <unk>
 * to fall back to (G4_ERR_UNSUPPORTED; never with the Gemma vocabulary), or out of memory.
 * On failure out holds the ids appended before the failing run. */
g4_status g4_tokenizer_encode(const g4_tokenizer *t, const char *text, size_t len,
                              unsigned flags, g4_tokens *out, g4_error *err);

enum {
    G4_DETOKENIZE_SKIP_SPECIAL = 1u << 0, /* drop G4_TOKEN_CONTROL tokens */
};

/* The bytes of n ids as a NUL-terminated heap string (free() it; *len excludes the NUL and the
 * text may contain NULs). G4_ERR_ARG naming the position for an id out of range. */
g4_status g4_tokenizer_decode(const g4_tokenizer *t, const int32_t *ids, size_t n,
                              unsigned flags, char **text, size_t *len, g4_error *err);

/* Streaming decoding for generation: one id in, the text that is complete so far out. Bytes of
 * a UTF-8 character split over several byte tokens are held back until the character is whole,
 * so every chunk of valid input is valid UTF-8; bytes that can no longer become a valid
 * character are released as they are. The concatenation of all chunks plus the final flush
 * equals g4_tokenizer_decode of the same ids. */
typedef struct g4_detokenizer g4_detokenizer;
g4_status g4_detokenizer_create(const g4_tokenizer *t, unsigned flags, g4_detokenizer **out,
                                g4_error *err);
/* *text and *len receive the newly complete bytes (possibly none), valid until the next call. */
g4_status g4_detokenizer_push(g4_detokenizer *d, int32_t id, const char **text, size_t *len,
                              g4_error *err);
/* Releases whatever is held back (an unfinished character) and starts a new stream. */
void g4_detokenizer_flush(g4_detokenizer *d, const char **text, size_t *len);
void g4_detokenizer_free(g4_detokenizer *d);

#ifdef __cplusplus
}
#endif
#endif
