/* Tokenizer core: the lookup tables, BPE encoding and decoding. The file loaders live in
 * tokenizer_json.c and tokenizer_gguf.c and fill the tables through the tok_* builder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"
#include "util/error.h"

/* "▁" (U+2581), which stands for a space inside pieces. */
static const char SPACE_MARK[] = "\xE2\x96\x81";

/* ---- hashing ----------------------------------------------------------------------------- */

static uint32_t hash_str(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, s, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    return (uint32_t)h;
}

static size_t hash_pair(int32_t a, int32_t b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ h >> 29);
}

/* ---- building ---------------------------------------------------------------------------- */

g4_status tok_create(int32_t n_vocab, g4_tokenizer **out, const char *src, g4_error *err) {
    *out = NULL;
    if (n_vocab <= 0)
        return g4_fail(err, G4_ERR_FORMAT, "%s: the vocabulary is empty", src);
    g4_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", src);
    t->n_vocab = n_vocab;
    t->off = malloc((size_t)n_vocab * sizeof *t->off);
    t->len = calloc((size_t)n_vocab, sizeof *t->len);
    t->type = calloc((size_t)n_vocab, sizeof *t->type);
    t->bos = t->eos = t->pad = t->unk = t->space_id = -1;
    if (!t->off || !t->len || !t->type) {
        g4_tokenizer_free(t);
        return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory for %d tokens", src, n_vocab);
    }
    for (int32_t i = 0; i < n_vocab; i++) t->off[i] = TOK_NO_PIECE;
    *out = t;
    return G4_OK;
}

bool tok_has_piece(const g4_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->off[id] != TOK_NO_PIECE;
}

g4_status tok_set_piece(g4_tokenizer *t, int32_t id, const char *s, size_t len,
                        g4_token_type type, const char *src, g4_error *err) {
    if (id < 0 || id >= t->n_vocab)
        return g4_fail(err, G4_ERR_FORMAT, "%s: token id %d out of range [0, %d)", src, id,
                       t->n_vocab);
    if (t->off[id] != TOK_NO_PIECE)
        return g4_fail(err, G4_ERR_FORMAT, "%s: token id %d appears twice", src, id);
    if (len >= UINT32_MAX / 2 || t->arena_len + len + 1 >= UINT32_MAX)
        return g4_fail(err, G4_ERR_FORMAT, "%s: vocabulary strings exceed 4 GiB", src);
    if (t->arena_len + len + 1 > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 1 << 20;
        while (cap < t->arena_len + len + 1) cap *= 2;
        char *a = realloc(t->arena, cap);
        if (!a) return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory for the vocabulary", src);
        t->arena = a;
        t->arena_cap = cap;
    }
    if (len) memcpy(t->arena + t->arena_len, s, len);
    t->arena[t->arena_len + len] = 0;
    t->off[id] = (uint32_t)t->arena_len;
    t->len[id] = (uint32_t)len;
    t->type[id] = (uint8_t)type;
    t->arena_len += len + 1;
    return G4_OK;
}

bool tok_is_byte_piece(const char *s, size_t len, uint8_t *byte) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        v = v * 16 + d;
    }
    *byte = (uint8_t)v;
    return true;
}

static size_t table_size(size_t n) {
    size_t cap = 64;
    while (cap < n * 2) cap *= 2;
    return cap;
}

static const char *piece_of(const g4_tokenizer *t, int32_t id) { return t->arena + t->off[id]; }

int32_t tok_index_find(const g4_tokenizer *t, const tok_index *ix, const char *s, size_t len) {
    if (!ix->slots) return -1;
    uint32_t h = hash_str(s, len);
    for (size_t i = h & ix->mask;; i = (i + 1) & ix->mask) {
        const tok_slot *sl = &ix->slots[i];
        if (sl->id < 0) return -1;
        if (sl->hash == h && sl->len == len && (!len || !memcmp(t->arena + sl->off, s, len)))
            return sl->id;
    }
}

/* Adds id under its piece unless the piece is already there: the lowest id wins, which makes
 * lookups deterministic for vocabularies that repeat a string. */
static void index_add(const g4_tokenizer *t, tok_index *ix, int32_t id) {
    const char *s = piece_of(t, id);
    size_t len = t->len[id];
    uint32_t h = hash_str(s, len);
    for (size_t i = h & ix->mask;; i = (i + 1) & ix->mask) {
        tok_slot *sl = &ix->slots[i];
        if (sl->id < 0) {
            *sl = (tok_slot){h, t->off[id], t->len[id], id};
            ix->n++;
            return;
        }
        if (sl->hash == h && sl->len == len && !memcmp(t->arena + sl->off, s, len)) return;
    }
}

static g4_status index_alloc(tok_index *ix, size_t n, const char *src, g4_error *err) {
    size_t cap = table_size(n);
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots) return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", src);
    memset(ix->slots, 0xff, cap * sizeof *ix->slots);
    ix->mask = cap - 1;
    ix->n = 0;
    return G4_OK;
}

g4_status tok_index_vocab(g4_tokenizer *t, const char *src, g4_error *err) {
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->off[i] == TOK_NO_PIECE)
            return g4_fail(err, G4_ERR_FORMAT, "%s: token id %d has no string", src, i);
    g4_status st = index_alloc(&t->vocab, (size_t)t->n_vocab, src, err);
    if (st) return st;
    for (int32_t i = 0; i < t->n_vocab; i++) index_add(t, &t->vocab, i);
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        int32_t id = tok_index_find(t, &t->vocab, name, 6);
        /* only pieces typed as byte fallback stand in for bytes (HF's byte_fallback flag) */
        t->byte_id[i] = id >= 0 && t->type[id] == G4_TOKEN_BYTE ? id : -1;
    }
    t->space_id = tok_index_find(t, &t->vocab, SPACE_MARK, 3);
    for (int c = 0; c < 128; c++) {
        char ch = (char)c;
        t->ascii_id[c] = c == ' ' ? t->space_id : tok_index_find(t, &t->vocab, &ch, 1);
    }
    size_t cap = table_size(64);
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges) return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory for merges", src);
    for (size_t i = 0; i < cap; i++) t->merges[i].rank = -1;
    t->merge_mask = cap - 1;
    return G4_OK;
}

static const tok_merge *merge_find(const g4_tokenizer *t, int32_t a, int32_t b) {
    for (size_t i = hash_pair(a, b) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const tok_merge *m = &t->merges[i];
        if (m->rank < 0) return NULL;
        if (m->a == a && m->b == b) return m;
    }
}

static g4_status merge_grow(g4_tokenizer *t, size_t cap, const char *src, g4_error *err) {
    tok_merge *nm = malloc(cap * sizeof *nm);
    if (!nm) return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory for merges", src);
    for (size_t i = 0; i < cap; i++) nm[i].rank = -1;
    for (size_t i = 0; i <= t->merge_mask; i++) {
        tok_merge m = t->merges[i];
        if (m.rank < 0) continue;
        size_t j = hash_pair(m.a, m.b) & (cap - 1);
        while (nm[j].rank >= 0) j = (j + 1) & (cap - 1);
        nm[j] = m;
    }
    free(t->merges);
    t->merges = nm;
    t->merge_mask = cap - 1;
    return G4_OK;
}

g4_status tok_reserve_merges(g4_tokenizer *t, size_t n, const char *src, g4_error *err) {
    size_t cap = table_size(n + 1);
    return cap > t->merge_mask + 1 ? merge_grow(t, cap, src, err) : G4_OK;
}

static int shown(size_t len) { return len > 60 ? 60 : (int)len; }

g4_status tok_add_merge(g4_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                        char **scratch, size_t *scratch_cap, const char *src, g4_error *err) {
    size_t rank = t->n_merges;
    if (rank >= INT32_MAX) return g4_fail(err, G4_ERR_FORMAT, "%s: too many merges", src);
    int32_t ia = tok_index_find(t, &t->vocab, a, alen);
    int32_t ib = tok_index_find(t, &t->vocab, b, blen);
    if (ia < 0 || ib < 0)
        return g4_fail(err, G4_ERR_FORMAT, "%s: merge #%zu ('%.*s' '%.*s'): '%.*s' is not in the "
                       "vocabulary", src, rank, shown(alen), a, shown(blen), b,
                       ia < 0 ? shown(alen) : shown(blen), ia < 0 ? a : b);
    if (alen + blen + 1 > *scratch_cap) {
        size_t cap = (alen + blen) * 2 + 64;
        char *s = realloc(*scratch, cap);
        if (!s) return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", src);
        *scratch = s;
        *scratch_cap = cap;
    }
    memcpy(*scratch, a, alen);
    memcpy(*scratch + alen, b, blen);
    int32_t id = tok_index_find(t, &t->vocab, *scratch, alen + blen);
    if (id < 0)
        return g4_fail(err, G4_ERR_FORMAT, "%s: merge #%zu ('%.*s' '%.*s'): the result is not in "
                       "the vocabulary", src, rank, shown(alen), a, shown(blen), b);
    t->n_merges++;
    if ((t->n_merges + 1) * 2 > t->merge_mask + 1) {
        g4_status st = merge_grow(t, (t->merge_mask + 1) * 2, src, err);
        if (st) return st;
    }
    size_t i = hash_pair(ia, ib) & t->merge_mask;
    for (; t->merges[i].rank >= 0; i = (i + 1) & t->merge_mask)
        if (t->merges[i].a == ia && t->merges[i].b == ib)
            return G4_OK; /* a repeated pair keeps its first (best) rank */
    t->merges[i] = (tok_merge){ia, ib, (int32_t)rank, id};
    return G4_OK;
}

g4_status tok_add_merge_line(g4_tokenizer *t, const char *line, size_t len, char **scratch,
                             size_t *scratch_cap, const char *src, g4_error *err) {
    const char *sp = len > 1 ? memchr(line + 1, ' ', len - 1) : NULL;
    if (!sp)
        return g4_fail(err, G4_ERR_FORMAT, "%s: merge #%zu '%.*s' is not two tokens separated by "
                       "a space", src, t->n_merges, shown(len), line);
    size_t alen = (size_t)(sp - line);
    return tok_add_merge(t, line, alen, sp + 1, len - alen - 1, scratch, scratch_cap, src, err);
}

g4_status tok_finish(g4_tokenizer *t, const char *src, g4_error *err) {
    size_t n_added = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->type[i] == G4_TOKEN_CONTROL || t->type[i] == G4_TOKEN_USER) n_added++;
    g4_status st = index_alloc(&t->added, n_added, src, err);
    if (st) return st;
    uint8_t *seen = NULL;
    size_t max_len = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == G4_TOKEN_CONTROL || t->type[i] == G4_TOKEN_USER) && t->len[i] > max_len)
            max_len = t->len[i];
    if (n_added) {
        seen = calloc(max_len + 1, 1);
        if (!seen) return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", src);
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->type[i] != G4_TOKEN_CONTROL && t->type[i] != G4_TOKEN_USER) continue;
        if (!t->len[i]) continue; /* an empty added token would match everywhere */
        index_add(t, &t->added, i);
        t->added_first[(uint8_t)piece_of(t, i)[0]] = 1;
        if (!seen[t->len[i]]) {
            seen[t->len[i]] = 1;
            t->n_added_lens++;
        }
    }
    if (t->n_added_lens) {
        t->added_lens = malloc(t->n_added_lens * sizeof *t->added_lens);
        if (!t->added_lens) {
            free(seen);
            return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", src);
        }
        size_t k = 0;
        for (size_t l = max_len; l > 0; l--)
            if (seen[l]) t->added_lens[k++] = (uint32_t)l;
    }
    free(seen);
    const int32_t *ids[] = {&t->bos, &t->eos, &t->pad, &t->unk};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (*ids[i] >= t->n_vocab || *ids[i] < -1)
            return g4_fail(err, G4_ERR_FORMAT, "%s: special token id %d out of range [0, %d)", src,
                           *ids[i], t->n_vocab);
    return G4_OK;
}

void g4_tokenizer_free(g4_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->type);
    free(t->vocab.slots);
    free(t->added.slots);
    free(t->merges);
    free(t->added_lens);
    free(t);
}

/* ---- lookups ----------------------------------------------------------------------------- */

int32_t g4_tokenizer_n_vocab(const g4_tokenizer *t) { return t->n_vocab; }
int32_t g4_tokenizer_bos(const g4_tokenizer *t) { return t->bos; }
int32_t g4_tokenizer_eos(const g4_tokenizer *t) { return t->eos; }
int32_t g4_tokenizer_pad(const g4_tokenizer *t) { return t->pad; }
int32_t g4_tokenizer_unk(const g4_tokenizer *t) { return t->unk; }

const char *g4_tokenizer_piece(const g4_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->len[id];
    return piece_of(t, id);
}

g4_token_type g4_tokenizer_token_type(const g4_tokenizer *t, int32_t id) {
    return id < 0 || id >= t->n_vocab ? G4_TOKEN_NORMAL : (g4_token_type)t->type[id];
}

int32_t g4_tokenizer_find(const g4_tokenizer *t, const char *piece, size_t len) {
    return tok_index_find(t, &t->vocab, piece, len);
}

int32_t g4_tokenizer_special_id(const g4_tokenizer *t, const char *text) {
    return tok_index_find(t, &t->added, text, strlen(text));
}

/* ---- encoding ---------------------------------------------------------------------------- */

void g4_tokens_free(g4_tokens *tokens) {
    free(tokens->ids);
    tokens->ids = NULL;
    tokens->n = tokens->cap = 0;
}

static bool tokens_reserve(g4_tokens *out, size_t extra) {
    if (out->n + extra <= out->cap) return true;
    size_t cap = out->cap ? out->cap : 64;
    while (cap < out->n + extra) cap *= 2;
    int32_t *ids = realloc(out->ids, cap * sizeof *ids);
    if (!ids) return false;
    out->ids = ids;
    out->cap = cap;
    return true;
}

/* Length of the well-formed UTF-8 sequence at s (Unicode table 3-7), or 0 when s[0] does not
 * start one: then that byte alone is treated as invalid. */
size_t tok_utf8_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

/* Per-call working memory for BPE over one run: symbols form a doubly linked list over their
 * initial positions; a merge keeps the left position, so the heap's (rank, left position) keys
 * order candidates exactly as HF's BinaryHeap does. */
typedef struct bpe {
    int32_t *sym, *prev, *next;
    uint64_t *heap;
    size_t cap, heap_n;
} bpe;

static bool bpe_reserve(bpe *w, size_t n) {
    if (n <= w->cap) return true;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < n) cap *= 2;
    int32_t *s = realloc(w->sym, cap * sizeof *s);
    if (s) w->sym = s;
    int32_t *p = realloc(w->prev, cap * sizeof *p);
    if (p) w->prev = p;
    int32_t *x = realloc(w->next, cap * sizeof *x);
    if (x) w->next = x;
    /* each merge pushes at most two candidates, on top of the initial n - 1 */
    uint64_t *h = realloc(w->heap, 3 * cap * sizeof *h);
    if (h) w->heap = h;
    if (!s || !p || !x || !h) return false;
    w->cap = cap;
    return true;
}

static void heap_push(bpe *w, uint64_t key) {
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (w->heap[parent] <= key) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = key;
}

static void heap_sift_down(uint64_t *h, size_t n, size_t i) {
    uint64_t key = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= key) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = key;
}

static uint64_t heap_pop(bpe *w) {
    uint64_t top = w->heap[0];
    w->heap[0] = w->heap[--w->heap_n];
    if (w->heap_n) heap_sift_down(w->heap, w->heap_n, 0);
    return top;
}

static uint64_t heap_key(int32_t rank, size_t pos) { return (uint64_t)rank << 32 | pos; }

/* Appends the initial symbols of one character (or invalid byte) of a run. */
static g4_status push_char(const g4_tokenizer *t, bpe *w, size_t *n, const uint8_t *s, size_t clen,
                           g4_error *err) {
    int32_t id = -1;
    if (clen == 1 && s[0] < 0x80) id = t->ascii_id[s[0]];
    else if (clen > 0) id = tok_index_find(t, &t->vocab, (const char *)s, clen);
    if (id >= 0) {
        w->sym[(*n)++] = id;
        return G4_OK;
    }
    /* Byte fallback. A space whose '▁' is missing falls back to the bytes of '▁'. */
    const uint8_t *b = s;
    size_t nb = clen ? clen : 1;
    if (clen == 1 && s[0] == ' ') {
        b = (const uint8_t *)SPACE_MARK;
        nb = 3;
    }
    for (size_t i = 0; i < nb; i++) {
        int32_t bid = t->byte_id[b[i]];
        if (bid < 0) bid = t->unk;
        if (bid < 0)
            return g4_fail(err, G4_ERR_UNSUPPORTED,
                           "tokenizer has no token for byte 0x%02X and no <unk>", b[i]);
        w->sym[(*n)++] = bid;
    }
    return G4_OK;
}

static g4_status bpe_run(const g4_tokenizer *t, bpe *w, const uint8_t *s, size_t len,
                         g4_tokens *out, g4_error *err) {
    if (len >= (size_t)INT32_MAX / 3)
        return g4_fail(err, G4_ERR_ARG, "a run of %zu bytes without a newline is too long to "
                       "tokenize (limit %d)", len, INT32_MAX / 3);
    /* A character of k bytes starts as at most k symbols, except a space in a vocabulary
     * without '▁', which falls back to the 3 bytes of '▁'. */
    if (!bpe_reserve(w, (t->space_id >= 0 ? len : len * 3) + 1))
        return g4_fail(err, G4_ERR_NOMEM, "out of memory tokenizing %zu bytes", len);
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t clen = tok_utf8_len(s + i, len - i);
        g4_status st = push_char(t, w, &n, s + i, clen, err);
        if (st) return st;
        i += clen ? clen : 1;
    }
    w->heap_n = 0;
    for (size_t i = 0; i < n; i++) {
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        if (i + 1 < n) {
            const tok_merge *m = merge_find(t, w->sym[i], w->sym[i + 1]);
            if (m) w->heap[w->heap_n++] = heap_key(m->rank, i);
        }
    }
    for (size_t i = w->heap_n / 2; i-- > 0;) heap_sift_down(w->heap, w->heap_n, i);
    while (w->heap_n) {
        uint64_t key = heap_pop(w);
        int32_t rank = (int32_t)(key >> 32);
        size_t pos = (size_t)(key & 0xffffffffu);
        /* Entries go stale when a neighbour merges first; the pair now at pos must still be the
         * one that was queued (its rank identifies it). */
        if (w->sym[pos] < 0 || w->next[pos] < 0) continue;
        int32_t nx = w->next[pos];
        const tok_merge *m = merge_find(t, w->sym[pos], w->sym[nx]);
        if (!m || m->rank != rank) continue;
        w->sym[pos] = m->id;
        w->sym[nx] = -1;
        w->next[pos] = w->next[nx];
        if (w->next[nx] >= 0) w->prev[w->next[nx]] = (int32_t)pos;
        if (w->prev[pos] >= 0) {
            int32_t pv = w->prev[pos];
            const tok_merge *l = merge_find(t, w->sym[pv], w->sym[pos]);
            if (l) heap_push(w, heap_key(l->rank, (size_t)pv));
        }
        if (w->next[pos] >= 0) {
            const tok_merge *r = merge_find(t, w->sym[pos], w->sym[w->next[pos]]);
            if (r) heap_push(w, heap_key(r->rank, pos));
        }
    }
    size_t count = 0;
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->next[i]) count++;
    if (!tokens_reserve(out, count))
        return g4_fail(err, G4_ERR_NOMEM, "out of memory for %zu token ids", out->n + count);
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->next[i]) out->ids[out->n++] = w->sym[i];
    return G4_OK;
}

/* Plain text (no added tokens inside): runs of newlines and runs of other bytes. */
static g4_status encode_plain(const g4_tokenizer *t, bpe *w, const uint8_t *s, size_t len,
                              g4_tokens *out, g4_error *err) {
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        bool nl = s[i] == '\n';
        if (nl) {
            while (j < len && s[j] == '\n') j++;
        } else {
            const uint8_t *e = memchr(s + i, '\n', len - i);
            j = e ? (size_t)(e - s) : len;
        }
        g4_status st = bpe_run(t, w, s + i, j - i, out, err);
        if (st) return st;
        i = j;
    }
    return G4_OK;
}

g4_status g4_tokenizer_encode(const g4_tokenizer *t, const char *text, size_t len,
                              unsigned flags, g4_tokens *out, g4_error *err) {
    const uint8_t *s = (const uint8_t *)text;
    if (flags & G4_TOKENIZE_ADD_BOS) {
        if (t->bos < 0)
            return g4_fail(err, G4_ERR_ARG, "this tokenizer defines no <bos> token");
        if (!tokens_reserve(out, 1)) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        out->ids[out->n++] = t->bos;
    }
    bool special = flags & G4_TOKENIZE_SPECIAL;
    bpe w = {0};
    g4_status st = G4_OK;
    size_t start = 0;
    for (size_t i = 0; i < len && !st; i++) {
        if (!t->added_first[s[i]]) continue;
        int32_t id = -1;
        size_t mlen = 0;
        for (size_t k = 0; k < t->n_added_lens; k++) {
            size_t l = t->added_lens[k];
            if (l > len - i) continue;
            int32_t cand = tok_index_find(t, &t->added, text + i, l);
            if (cand >= 0 && (special || t->type[cand] == G4_TOKEN_USER)) {
                id = cand;
                mlen = l;
                break;
            }
        }
        if (id < 0) continue;
        st = encode_plain(t, &w, s + start, i - start, out, err);
        if (!st && !tokens_reserve(out, 1)) st = g4_fail(err, G4_ERR_NOMEM, "out of memory");
        if (!st) out->ids[out->n++] = id;
        start = i + mlen;
        i = start - 1;
    }
    if (!st) st = encode_plain(t, &w, s + start, len - start, out, err);
    free(w.sym);
    free(w.prev);
    free(w.next);
    free(w.heap);
    return st;
}

/* ---- decoding ---------------------------------------------------------------------------- */

typedef struct byte_buf {
    char *data;
    size_t len, cap;
} byte_buf;

static bool buf_reserve(byte_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return false;
    b->data = d;
    b->cap = cap;
    return true;
}

static g4_status bad_id(int32_t id, size_t pos, int32_t n_vocab, g4_error *err) {
    return g4_fail(err, G4_ERR_ARG, "token id %d at position %zu is out of range [0, %d)", id, pos,
                   n_vocab);
}

/* Appends the bytes id stands for. */
static g4_status append_token(const g4_tokenizer *t, int32_t id, unsigned flags, byte_buf *b,
                              g4_error *err) {
    const char *p = piece_of(t, id);
    size_t len = t->len[id];
    uint8_t byte;
    switch ((g4_token_type)t->type[id]) {
    case G4_TOKEN_BYTE:
        if (!buf_reserve(b, 1)) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        if (tok_is_byte_piece(p, len, &byte)) {
            b->data[b->len++] = (char)byte;
            return G4_OK;
        }
        break;
    case G4_TOKEN_CONTROL:
        if (flags & G4_DETOKENIZE_SKIP_SPECIAL) return G4_OK;
        break;
    case G4_TOKEN_USER: break;
    case G4_TOKEN_NORMAL: {
        if (!buf_reserve(b, len)) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
        char *o = b->data + b->len;
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && !memcmp(p + i, SPACE_MARK, 3)) {
                *o++ = ' ';
                i += 3;
            } else {
                *o++ = p[i++];
            }
        }
        b->len = (size_t)(o - b->data);
        return G4_OK;
    }
    }
    if (!buf_reserve(b, len)) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    memcpy(b->data + b->len, p, len);
    b->len += len;
    return G4_OK;
}

g4_status g4_tokenizer_decode(const g4_tokenizer *t, const int32_t *ids, size_t n,
                              unsigned flags, char **text, size_t *len, g4_error *err) {
    *text = NULL;
    if (len) *len = 0;
    byte_buf b = {0};
    if (!buf_reserve(&b, 0)) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        g4_status st = ids[i] < 0 || ids[i] >= t->n_vocab ? bad_id(ids[i], i, t->n_vocab, err)
                                                          : append_token(t, ids[i], flags, &b, err);
        if (st) {
            free(b.data);
            return st;
        }
    }
    b.data[b.len] = 0;
    *text = b.data;
    if (len) *len = b.len;
    return G4_OK;
}

struct g4_detokenizer {
    const g4_tokenizer *t;
    unsigned flags;
    byte_buf buf;
    char held[4];
    size_t n_held;
    size_t n_pushed;
};

g4_status g4_detokenizer_create(const g4_tokenizer *t, unsigned flags, g4_detokenizer **out,
                                g4_error *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    (*out)->t = t;
    (*out)->flags = flags;
    return G4_OK;
}

void g4_detokenizer_free(g4_detokenizer *d) {
    if (!d) return;
    free(d->buf.data);
    free(d);
}

/* Bytes at the end of s that begin a UTF-8 character and could still be completed by what
 * follows; everything before them is final. */
static size_t incomplete_tail(const uint8_t *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        uint8_t c = s[n - k];
        if (c >= 0x80 && c <= 0xBF) continue; /* a continuation: look further back */
        size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                    : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (need <= k) return 0;
        if (k >= 2) {
            /* the second byte's range depends on the lead (no overlongs, surrogates or
             * code points past U+10FFFF), as in utf8_len */
            uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
            uint8_t hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            if (s[n - k + 1] < lo || s[n - k + 1] > hi) return 0;
        }
        return k;
    }
    return 0;
}

g4_status g4_detokenizer_push(g4_detokenizer *d, int32_t id, const char **text, size_t *len,
                              g4_error *err) {
    *text = "";
    *len = 0;
    if (id < 0 || id >= d->t->n_vocab) return bad_id(id, d->n_pushed, d->t->n_vocab, err);
    d->n_pushed++;
    d->buf.len = 0;
    if (!buf_reserve(&d->buf, d->n_held)) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    memcpy(d->buf.data, d->held, d->n_held);
    d->buf.len = d->n_held;
    g4_status st = append_token(d->t, id, d->flags, &d->buf, err);
    if (st) return st;
    size_t keep = incomplete_tail((const uint8_t *)d->buf.data, d->buf.len);
    d->n_held = keep;
    memcpy(d->held, d->buf.data + d->buf.len - keep, keep);
    *text = d->buf.data;
    *len = d->buf.len - keep;
    return G4_OK;
}

void g4_detokenizer_flush(g4_detokenizer *d, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (d->n_held) {
        /* copied into the output buffer (which push sized for them) so that the pointer stays
         * valid until the next call, as push's does */
        memcpy(d->buf.data, d->held, d->n_held);
        *text = d->buf.data;
        *len = d->n_held;
    }
    d->n_held = 0;
    d->n_pushed = 0;
}
