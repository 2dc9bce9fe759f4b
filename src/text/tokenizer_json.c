/* The JSON pull scanner and the tokenizer.json loader. */
#include "text/tokenizer_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"
#include "util/error.h"
#include "util/mapped_file.h"

/* ---- scanner ----------------------------------------------------------------------------- */

void g4_json_init(g4_json *j, const char *data, size_t len, const char *name, g4_error *err) {
    memset(j, 0, sizeof *j);
    j->begin = j->p = data ? data : "";
    j->end = j->begin + (data ? len : 0);
    j->name = name;
    j->err = err;
}

void g4_json_free(g4_json *j) {
    free(j->buf);
    j->buf = NULL;
    j->buf_cap = j->buf_len = 0;
}

g4_status g4_json_fail(g4_json *j, g4_status code, const char *fmt, ...) {
    size_t line = j->first_line ? j->first_line : 1, col = 1;
    for (const char *q = j->begin; q < j->p; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return g4_fail(j->err, code, "%s: line %zu, column %zu: %s", j->name, line, col, msg);
}

static void skip_ws(g4_json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

bool g4_json_peek(g4_json *j, char c) {
    skip_ws(j);
    return j->p < j->end && *j->p == c;
}

bool g4_json_accept(g4_json *j, char c) {
    if (!g4_json_peek(j, c)) return false;
    j->p++;
    return true;
}

bool g4_json_at_end(g4_json *j) {
    skip_ws(j);
    return j->p == j->end;
}

static g4_status unexpected(g4_json *j, const char *want, const char *where) {
    if (j->p >= j->end)
        return g4_json_fail(j, G4_ERR_FORMAT, "unexpected end of input, expected %s in %s", want,
                            where);
    unsigned char c = (unsigned char)*j->p;
    if (c >= 0x20 && c < 0x7f)
        return g4_json_fail(j, G4_ERR_FORMAT, "expected %s in %s, found '%c'", want, where, c);
    return g4_json_fail(j, G4_ERR_FORMAT, "expected %s in %s, found byte 0x%02X", want, where, c);
}

g4_status g4_json_expect(g4_json *j, char c, const char *where) {
    if (g4_json_accept(j, c)) return G4_OK;
    char want[4] = {'\'', c, '\'', 0};
    return unexpected(j, want, where);
}

static bool buf_put(g4_json *j, const char *s, size_t n) {
    if (!n) return true; /* memcpy with a NULL buffer is undefined even for 0 bytes */
    if (j->buf_len + n > j->buf_cap) {
        size_t cap = j->buf_cap ? j->buf_cap : 256;
        while (cap < j->buf_len + n) cap *= 2;
        char *b = realloc(j->buf, cap);
        if (!b) return false;
        j->buf = b;
        j->buf_cap = cap;
    }
    memcpy(j->buf + j->buf_len, s, n);
    j->buf_len += n;
    return true;
}

static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t utf8_put(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

g4_status g4_json_string(g4_json *j, const char **s, size_t *len, const char *where) {
    skip_ws(j);
    if (j->p >= j->end || *j->p != '"') return unexpected(j, "a string", where);
    const char *start = ++j->p, *q = start;
    /* fast path: most strings hold no escapes and are returned in place */
    while (q < j->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
    if (q < j->end && *q == '"') {
        *s = start;
        *len = (size_t)(q - start);
        j->p = q + 1;
        return G4_OK;
    }
    j->buf_len = 0;
    if (!buf_put(j, start, (size_t)(q - start)))
        return g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
    j->p = q;
    for (;;) {
        if (j->p >= j->end)
            return g4_json_fail(j, G4_ERR_FORMAT, "unterminated string in %s", where);
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            break;
        }
        if (c < 0x20)
            return g4_json_fail(j, G4_ERR_FORMAT, "raw control byte 0x%02X in a string in %s", c,
                                where);
        if (c != '\\') {
            const char *r = j->p;
            while (r < j->end && *r != '"' && *r != '\\' && (unsigned char)*r >= 0x20) r++;
            if (!buf_put(j, j->p, (size_t)(r - j->p)))
                return g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
            j->p = r;
            continue;
        }
        if (j->end - j->p < 2) return g4_json_fail(j, G4_ERR_FORMAT, "unterminated string in %s", where);
        char e = j->p[1], out[4];
        size_t n = 1;
        switch (e) {
        case '"': out[0] = '"'; break;
        case '\\': out[0] = '\\'; break;
        case '/': out[0] = '/'; break;
        case 'b': out[0] = '\b'; break;
        case 'f': out[0] = '\f'; break;
        case 'n': out[0] = '\n'; break;
        case 'r': out[0] = '\r'; break;
        case 't': out[0] = '\t'; break;
        case 'u': {
            int cp = j->end - j->p >= 6 ? hex4(j->p + 2) : -1;
            if (cp < 0) return g4_json_fail(j, G4_ERR_FORMAT, "bad \\u escape in %s", where);
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return g4_json_fail(j, G4_ERR_FORMAT, "lone low surrogate \\u%04X in %s", cp, where);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo = j->end - j->p >= 12 && j->p[6] == '\\' && j->p[7] == 'u' ? hex4(j->p + 8)
                                                                                   : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return g4_json_fail(j, G4_ERR_FORMAT, "lone high surrogate \\u%04X in %s", cp,
                                        where);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                j->p += 6;
            }
            n = utf8_put(out, (unsigned)cp);
            j->p += 4;
            break;
        }
        default:
            return g4_json_fail(j, G4_ERR_FORMAT, "bad escape '\\%c' in %s", e, where);
        }
        j->p += 2;
        if (!buf_put(j, out, n)) return g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
    }
    *s = j->buf ? j->buf : "";
    *len = j->buf_len;
    return G4_OK;
}

/* Scans a JSON number; *is_int tells whether it had neither fraction nor exponent. */
static g4_status scan_number(g4_json *j, bool *is_int, const char *where) {
    const char *q = j->p;
    if (q < j->end && *q == '-') q++;
    if (q >= j->end || *q < '0' || *q > '9') return unexpected(j, "a number", where);
    if (*q == '0') q++;
    else
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    *is_int = true;
    if (q < j->end && *q == '.') {
        *is_int = false;
        q++;
        if (q >= j->end || *q < '0' || *q > '9') {
            j->p = q;
            return g4_json_fail(j, G4_ERR_FORMAT, "bad number in %s", where);
        }
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        *is_int = false;
        q++;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (q >= j->end || *q < '0' || *q > '9') {
            j->p = q;
            return g4_json_fail(j, G4_ERR_FORMAT, "bad number in %s", where);
        }
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    j->p = q;
    return G4_OK;
}

g4_status g4_json_int(g4_json *j, int64_t *out, const char *where) {
    skip_ws(j);
    const char *start = j->p;
    bool is_int;
    g4_status st = scan_number(j, &is_int, where);
    if (st) return st;
    if (!is_int) {
        j->p = start;
        return g4_json_fail(j, G4_ERR_FORMAT, "expected an integer in %s", where);
    }
    const char *q = start;
    bool neg = *q == '-';
    if (neg) q++;
    uint64_t v = 0;
    for (; q < j->p; q++) {
        unsigned d = (unsigned)(*q - '0');
        if (v > (UINT64_MAX - d) / 10 || v * 10 + d > (uint64_t)INT64_MAX + neg) {
            j->p = start;
            return g4_json_fail(j, G4_ERR_FORMAT, "integer out of range in %s", where);
        }
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return G4_OK;
}

static bool accept_word(g4_json *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return false;
    j->p += n;
    return true;
}

g4_status g4_json_bool(g4_json *j, bool *out, const char *where) {
    skip_ws(j);
    if (accept_word(j, "true")) *out = true;
    else if (accept_word(j, "false")) *out = false;
    else return unexpected(j, "true or false", where);
    return G4_OK;
}

static g4_status skip_depth(g4_json *j, int depth, const char *where) {
    if (depth > 256) return g4_json_fail(j, G4_ERR_FORMAT, "nesting deeper than 256 in %s", where);
    skip_ws(j);
    if (j->p >= j->end) return unexpected(j, "a value", where);
    bool first = true, done = false, is_int;
    const char *s;
    size_t n;
    g4_status st;
    switch (*j->p) {
    case '"': return g4_json_string(j, &s, &n, where);
    case '{':
        j->p++;
        while (!(st = g4_json_next_key(j, &first, &s, &n, &done, where)) && !done)
            if ((st = skip_depth(j, depth + 1, where))) return st;
        return st;
    case '[':
        j->p++;
        while (!(st = g4_json_next_elem(j, &first, &done, where)) && !done)
            if ((st = skip_depth(j, depth + 1, where))) return st;
        return st;
    case 't': case 'f': case 'n':
        if (accept_word(j, "true") || accept_word(j, "false") || accept_word(j, "null"))
            return G4_OK;
        return unexpected(j, "a value", where);
    default: return scan_number(j, &is_int, where);
    }
}

g4_status g4_json_skip(g4_json *j, const char *where) { return skip_depth(j, 0, where); }

g4_status g4_json_next_key(g4_json *j, bool *first, const char **key, size_t *len, bool *done,
                           const char *where) {
    *done = false;
    if (g4_json_accept(j, '}')) {
        *done = true;
        return G4_OK;
    }
    if (!*first && !g4_json_accept(j, ',')) return unexpected(j, "',' or '}'", where);
    *first = false;
    g4_status st = g4_json_string(j, key, len, where);
    return st ? st : g4_json_expect(j, ':', where);
}

g4_status g4_json_next_elem(g4_json *j, bool *first, bool *done, const char *where) {
    *done = false;
    if (g4_json_accept(j, ']')) {
        *done = true;
        return G4_OK;
    }
    if (!*first && !g4_json_accept(j, ',')) return unexpected(j, "',' or ']'", where);
    *first = false;
    return G4_OK;
}

bool g4_json_write_string(char **out, size_t *out_len, size_t *out_cap, const char *s,
                          size_t len) {
    /* worst case: every byte becomes \ufffd (6 bytes) */
    size_t need = *out_len + len * 6 + 3;
    if (need > *out_cap) {
        size_t cap = *out_cap ? *out_cap : 256;
        while (cap < need) cap *= 2;
        char *b = realloc(*out, cap);
        if (!b) return false;
        *out = b;
        *out_cap = cap;
    }
    char *o = *out + *out_len;
    *o++ = '"';
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t n = tok_utf8_len((const uint8_t *)s + i, len - i);
            if (n) {
                memcpy(o, s + i, n);
                o += n;
                i += n;
            } else {
                memcpy(o, "\\ufffd", 6);
                o += 6;
                i++;
            }
            continue;
        }
        i++;
        switch (c) {
        case '"': *o++ = '\\'; *o++ = '"'; break;
        case '\\': *o++ = '\\'; *o++ = '\\'; break;
        case '\n': *o++ = '\\'; *o++ = 'n'; break;
        case '\r': *o++ = '\\'; *o++ = 'r'; break;
        case '\t': *o++ = '\\'; *o++ = 't'; break;
        case '\b': *o++ = '\\'; *o++ = 'b'; break;
        case '\f': *o++ = '\\'; *o++ = 'f'; break;
        default:
            if (c < 0x20) {
                snprintf(o, 7, "\\u%04x", c);
                o += 6;
            } else {
                *o++ = (char)c;
            }
        }
    }
    *o++ = '"';
    *o = 0;
    *out_len = (size_t)(o - *out);
    return true;
}

/* ---- tokenizer.json ---------------------------------------------------------------------- */

/* Where the members we need sit in the file: they are read after one pass has found them all,
 * because the vocabulary must be known before merges and added tokens can be resolved, and
 * JSON does not fix the order of members. */
typedef struct json_layout {
    const char *vocab, *merges, *added;
    bool byte_fallback;
    char unk[64];
} json_layout;

static bool key_is(const char *k, size_t n, const char *want) {
    return n == strlen(want) && !memcmp(k, want, n);
}

static g4_status read_model(g4_json *j, json_layout *lay) {
    g4_status st = g4_json_expect(j, '{', "model");
    bool first = true, done, have_type = false;
    const char *k, *s;
    size_t kn, sn;
    while (!st && !(st = g4_json_next_key(j, &first, &k, &kn, &done, "model")) && !done) {
        if (key_is(k, kn, "type")) {
            st = g4_json_string(j, &s, &sn, "model.type");
            if (!st && !key_is(s, sn, "BPE"))
                return g4_json_fail(j, G4_ERR_UNSUPPORTED, "model.type is \"%.*s\"; only BPE is "
                                    "supported", sn > 40 ? 40 : (int)sn, s);
            have_type = true;
        } else if (key_is(k, kn, "vocab")) {
            skip_ws(j);
            lay->vocab = j->p;
            st = g4_json_skip(j, "model.vocab");
        } else if (key_is(k, kn, "merges")) {
            skip_ws(j);
            lay->merges = j->p;
            st = g4_json_skip(j, "model.merges");
        } else if (key_is(k, kn, "byte_fallback")) {
            st = g4_json_bool(j, &lay->byte_fallback, "model.byte_fallback");
        } else if (key_is(k, kn, "ignore_merges")) {
            bool v;
            st = g4_json_bool(j, &v, "model.ignore_merges");
            if (!st && v)
                return g4_json_fail(j, G4_ERR_UNSUPPORTED, "model.ignore_merges is not supported");
        } else if (key_is(k, kn, "unk_token")) {
            if (g4_json_peek(j, '"')) {
                st = g4_json_string(j, &s, &sn, "model.unk_token");
                if (!st && sn < sizeof lay->unk) {
                    memcpy(lay->unk, s, sn);
                    lay->unk[sn] = 0;
                }
            } else {
                st = g4_json_skip(j, "model.unk_token");
            }
        } else if (key_is(k, kn, "continuing_subword_prefix") ||
                   key_is(k, kn, "end_of_word_suffix")) {
            bool is_null = g4_json_peek(j, 'n');
            st = g4_json_skip(j, "model");
            if (!st && !is_null)
                return g4_json_fail(j, G4_ERR_UNSUPPORTED, "model.%.*s is not supported",
                                    (int)kn, k);
        } else {
            st = g4_json_skip(j, "model");
        }
    }
    if (!st && !have_type)
        return g4_json_fail(j, G4_ERR_FORMAT, "model has no \"type\"");
    return st;
}

/* A vocabulary or added-token string: in the mapped file when it had no escapes (s != NULL),
 * else decoded into the side pool at pool_off (the scanner's buffer is reused by the next
 * string, and few pieces have escapes). */
typedef struct entry {
    int64_t id;
    const char *s;
    size_t pool_off, len;
    bool special;
} entry;

typedef struct entries {
    entry *e;
    size_t n, cap;
} entries;

static bool entries_push(entries *v, entry e) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        entry *ne = realloc(v->e, cap * sizeof *ne);
        if (!ne) return false;
        v->e = ne;
        v->cap = cap;
    }
    v->e[v->n++] = e;
    return true;
}

typedef struct pool {
    char *data;
    size_t len, cap;
} pool;

static bool in_input(const g4_json *j, const char *s) {
    return (uintptr_t)s >= (uintptr_t)j->begin && (uintptr_t)s < (uintptr_t)j->end;
}

/* Fills e->s or e->pool_off from a string just read. */
static g4_status keep_string(g4_json *j, pool *p, const char *s, size_t len, entry *e) {
    e->len = len;
    if (in_input(j, s)) {
        e->s = s;
        return G4_OK;
    }
    e->s = NULL;
    if (p->len + len + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 4096;
        while (cap < p->len + len) cap *= 2;
        char *d = realloc(p->data, cap);
        if (!d) return g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
        p->data = d;
        p->cap = cap;
    }
    memcpy(p->data + p->len, s, len);
    e->pool_off = p->len;
    p->len += len;
    return G4_OK;
}

static const char *entry_str(const pool *p, const entry *e) {
    return e->s ? e->s : p->data + e->pool_off;
}

static g4_status read_vocab(g4_json *j, entries *v, pool *p) {
    g4_status st = g4_json_expect(j, '{', "model.vocab");
    bool first = true, done;
    while (!st) {
        const char *k;
        size_t kn;
        entry e = {0};
        st = g4_json_next_key(j, &first, &k, &kn, &done, "model.vocab");
        if (st || done) break;
        st = keep_string(j, p, k, kn, &e);
        if (!st) st = g4_json_int(j, &e.id, "model.vocab");
        if (st) break;
        if (e.id < 0 || e.id >= INT32_MAX)
            return g4_json_fail(j, G4_ERR_FORMAT, "token id %lld out of range in model.vocab",
                                (long long)e.id);
        if (!entries_push(v, e)) return g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
    }
    return st;
}

static g4_status read_added(g4_json *j, entries *v, pool *p) {
    g4_status st = g4_json_expect(j, '[', "added_tokens");
    bool first = true, done;
    while (!st && !(st = g4_json_next_elem(j, &first, &done, "added_tokens")) && !done) {
        st = g4_json_expect(j, '{', "added_tokens");
        bool kfirst = true, kdone, have_id = false, have_content = false;
        const char *k, *s;
        size_t kn, sn;
        entry e = {0};
        while (!st && !(st = g4_json_next_key(j, &kfirst, &k, &kn, &kdone, "added_tokens")) &&
               !kdone) {
            if (key_is(k, kn, "id")) {
                st = g4_json_int(j, &e.id, "added_tokens id");
                have_id = true;
            } else if (key_is(k, kn, "content")) {
                st = g4_json_string(j, &s, &sn, "added_tokens content");
                if (!st) st = keep_string(j, p, s, sn, &e);
                have_content = true;
            } else if (key_is(k, kn, "special")) {
                st = g4_json_bool(j, &e.special, "added_tokens special");
            } else {
                st = g4_json_skip(j, "added_tokens");
            }
        }
        if (st) break;
        if (!have_id || !have_content)
            return g4_json_fail(j, G4_ERR_FORMAT, "an added_tokens entry lacks \"id\" or \"content\"");
        if (e.id < 0 || e.id >= INT32_MAX)
            return g4_json_fail(j, G4_ERR_FORMAT, "added token id %lld out of range",
                                (long long)e.id);
        if (!entries_push(v, e)) return g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
    }
    return st;
}

static g4_status read_merges(g4_json *j, g4_tokenizer *t, const char *src) {
    g4_status st = g4_json_expect(j, '[', "model.merges");
    bool first = true, done;
    char *scratch = NULL, *left = NULL;
    size_t scratch_cap = 0, left_cap = 0;
    while (!st && !(st = g4_json_next_elem(j, &first, &done, "model.merges")) && !done) {
        const char *a, *b;
        size_t an, bn;
        if (g4_json_peek(j, '"')) {
            /* older files: "left right" */
            st = g4_json_string(j, &a, &an, "model.merges");
            if (!st) st = tok_add_merge_line(t, a, an, &scratch, &scratch_cap, src, j->err);
            continue;
        }
        st = g4_json_expect(j, '[', "model.merges (a string or a pair of strings)");
        if (!st) st = g4_json_string(j, &a, &an, "model.merges");
        if (st) break;
        if (!in_input(j, a)) {
            /* the second string would overwrite the scanner buffer holding the first */
            if (an > left_cap) {
                char *l = realloc(left, an * 2 + 16);
                if (!l) {
                    st = g4_json_fail(j, G4_ERR_NOMEM, "out of memory");
                    break;
                }
                left = l;
                left_cap = an * 2 + 16;
            }
            memcpy(left, a, an);
            a = left;
        }
        st = g4_json_expect(j, ',', "model.merges pair");
        if (!st) st = g4_json_string(j, &b, &bn, "model.merges");
        if (!st) st = g4_json_expect(j, ']', "model.merges pair");
        if (!st) st = tok_add_merge(t, a, an, b, bn, &scratch, &scratch_cap, src, j->err);
    }
    free(scratch);
    free(left);
    return st;
}

static g4_status build(g4_json *j, const json_layout *lay, g4_tokenizer **out, const char *src,
                       g4_error *err) {
    entries vocab = {0}, added = {0};
    pool p = {0};
    g4_tokenizer *t = NULL;
    g4_status st = G4_OK;
    j->p = lay->vocab;
    st = read_vocab(j, &vocab, &p);
    if (!st && lay->added) {
        j->p = lay->added;
        st = read_added(j, &added, &p);
    }
    int64_t max_id = -1;
    for (size_t i = 0; !st && i < vocab.n; i++)
        if (vocab.e[i].id > max_id) max_id = vocab.e[i].id;
    for (size_t i = 0; !st && i < added.n; i++)
        if (added.e[i].id > max_id) max_id = added.e[i].id;
    if (!st && max_id < 0) st = g4_fail(err, G4_ERR_FORMAT, "%s: the vocabulary is empty", src);
    /* No id may be left without a string, so ids beyond the number of entries are a lie; this
     * also bounds the tables allocated below. */
    if (!st && (uint64_t)max_id >= vocab.n + added.n)
        st = g4_fail(err, G4_ERR_FORMAT, "%s: token id %lld but only %zu vocabulary entries",
                     src, (long long)max_id, vocab.n + added.n);
    if (!st) st = tok_create((int32_t)(max_id + 1), &t, src, err);
    for (size_t i = 0; !st && i < vocab.n; i++) {
        const entry *e = &vocab.e[i];
        const char *s = entry_str(&p, e);
        uint8_t byte;
        g4_token_type type = lay->byte_fallback && tok_is_byte_piece(s, e->len, &byte)
                                 ? G4_TOKEN_BYTE
                                 : G4_TOKEN_NORMAL;
        st = tok_set_piece(t, (int32_t)e->id, s, e->len, type, src, err);
    }
    for (size_t i = 0; !st && i < added.n; i++) {
        const entry *e = &added.e[i];
        const char *s = entry_str(&p, e);
        int32_t id = (int32_t)e->id;
        g4_token_type type = e->special ? G4_TOKEN_CONTROL : G4_TOKEN_USER;
        if (!tok_has_piece(t, id)) {
            st = tok_set_piece(t, id, s, e->len, type, src, err);
        } else if (t->len[id] != e->len || memcmp(t->arena + t->off[id], s, e->len)) {
            st = g4_fail(err, G4_ERR_FORMAT, "%s: added token %d \"%.*s\" differs from the "
                         "model.vocab entry \"%s\"", src, id, e->len > 60 ? 60 : (int)e->len, s,
                         t->arena + t->off[id]);
        } else {
            t->type[id] = (uint8_t)type;
        }
    }
    free(vocab.e);
    free(added.e);
    free(p.data);
    if (!st) st = tok_index_vocab(t, src, err);
    if (!st) st = tok_reserve_merges(t, 1, src, err);
    if (!st && lay->merges) {
        j->p = lay->merges;
        st = read_merges(j, t, src);
    }
    if (!st) {
        t->bos = g4_tokenizer_find(t, "<bos>", 5);
        t->eos = g4_tokenizer_find(t, "<eos>", 5);
        t->pad = g4_tokenizer_find(t, "<pad>", 5);
        t->unk = g4_tokenizer_find(t, lay->unk[0] ? lay->unk : "<unk>",
                                   strlen(lay->unk[0] ? lay->unk : "<unk>"));
        st = tok_finish(t, src, err);
    }
    if (st) {
        g4_tokenizer_free(t);
        return st;
    }
    *out = t;
    return G4_OK;
}

g4_status g4_tokenizer_load_json_mem(const char *data, size_t size, const char *path, g4_tokenizer **out,
                                     g4_error *err) {
    *out = NULL;
    g4_status st;
    g4_json j;
    g4_json_init(&j, data, size, path, err);
    json_layout lay = {0};
    st = g4_json_expect(&j, '{', "the top level");
    bool first = true, done;
    const char *k;
    size_t kn;
    while (!st && !(st = g4_json_next_key(&j, &first, &k, &kn, &done, "the top level")) && !done) {
        if (key_is(k, kn, "model")) {
            st = read_model(&j, &lay);
        } else if (key_is(k, kn, "added_tokens")) {
            skip_ws(&j);
            lay.added = j.p;
            st = g4_json_skip(&j, "added_tokens");
        } else {
            st = g4_json_skip(&j, "the top level");
        }
    }
    if (!st && !g4_json_at_end(&j))
        st = g4_json_fail(&j, G4_ERR_FORMAT, "trailing bytes after the top-level object");
    if (!st && !lay.vocab)
        st = g4_fail(err, G4_ERR_FORMAT, "%s: no model.vocab: not a BPE tokenizer.json", path);
    if (!st) st = build(&j, &lay, out, path, err);
    g4_json_free(&j);
    return st;
}

g4_status g4_tokenizer_load_json(const char *path, g4_tokenizer **out, g4_error *err) {
    *out = NULL;
    g4_mapped_file f;
    g4_status st = g4_mapped_file_open(&f, path, err);
    if (st) return st;
    st = g4_tokenizer_load_json_mem((const char *)f.data, f.size, path, out, err);
    g4_mapped_file_close(&f);
    return st;
}
