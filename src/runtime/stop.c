/* Stop strings over a streamed text (see g4_stop_matcher in g4_sample.h).
 *
 * Invariant between calls: buf[held .. len) is the only text not yet given to the caller, and it
 * is exactly the longest tail that is a proper prefix of some stop string, widened backwards
 * to the start of an incomplete UTF-8 character at the end. Everything before it was emitted
 * and cannot be part of a future match: had some earlier byte started a match that is still
 * open, the tail from that byte would be a longer proper prefix of a stop string and would have
 * been held. So a match that completes in the next chunk starts inside buf[held ..), and the
 * outcome does not depend on the chunking.
 *
 * Searching pending + chunk with memmem for each stop string costs O(stops * (held + chunk))
 * per call; stop strings are few and short, so nothing smarter is needed.
 */
#include <stdlib.h>
#include <string.h>

#include "g4_sample.h"
#include "util/error.h"

struct g4_stop_matcher {
    int n_stops;
    char **stops;
    size_t *stop_len;
    char *buf;
    size_t cap, len;
    size_t held; /* buf[0 .. held) was returned by the last call */
    int stopped;
    int stop_index;
};

/* Length of the UTF-8 sequence a lead byte starts; 0 for a continuation or invalid byte. */
static int utf8_seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) return 3;
    if (c >= 0xf0 && c <= 0xf4) return 4;
    return 0;
}

/* Strict validation (no overlong forms, surrogates or code points above U+10FFFF), for the
 * stop strings the caller hands us. */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int l = utf8_seq_len(s[i]);
        if (l == 0 || i + (size_t)l > n) return 0;
        for (int j = 1; j < l; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        if (l == 3 && s[i] == 0xe0 && s[i + 1] < 0xa0) return 0;  /* overlong */
        if (l == 3 && s[i] == 0xed && s[i + 1] >= 0xa0) return 0; /* surrogate */
        if (l == 4 && s[i] == 0xf0 && s[i + 1] < 0x90) return 0;  /* overlong */
        if (l == 4 && s[i] == 0xf4 && s[i + 1] >= 0x90) return 0; /* above U+10FFFF */
        i += (size_t)l;
    }
    return 1;
}

/* Where an incomplete UTF-8 character at the end of s[0..n) starts (n when there is none). Only
 * a lead byte followed by fewer continuation bytes than it announces counts; invalid bytes are
 * passed through rather than held forever. */
static size_t utf8_complete_end(const unsigned char *s, size_t n) {
    size_t lo = n > 3 ? n - 3 : 0;
    for (size_t i = n; i > lo; i--) {
        unsigned char c = s[i - 1];
        if ((c & 0xc0) == 0x80) continue; /* continuation: keep looking for its lead */
        int l = utf8_seq_len(c);
        return l > 1 && (i - 1) + (size_t)l > n ? i - 1 : n;
    }
    return n;
}

g4_status g4_stop_matcher_create(const char *const *stops, int n_stops, g4_stop_matcher **out,
                                 g4_error *err) {
    if (!out) return g4_fail(err, G4_ERR_ARG, "stop matcher: out is NULL");
    *out = NULL;
    if (n_stops < 0 || (n_stops > 0 && !stops))
        return g4_fail(err, G4_ERR_ARG, "stop matcher: bad stop list (%d strings)", n_stops);
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0])
            return g4_fail(err, G4_ERR_ARG, "stop matcher: stop string %d is empty", i);
        if (!utf8_valid((const unsigned char *)stops[i], strlen(stops[i])))
            return g4_fail(err, G4_ERR_ARG, "stop matcher: stop string %d is not valid UTF-8", i);
    }
    g4_stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(err, G4_ERR_NOMEM, "stop matcher: out of memory");
    m->n_stops = n_stops;
    m->stops = calloc(n_stops > 0 ? (size_t)n_stops : 1, sizeof *m->stops);
    m->stop_len = calloc(n_stops > 0 ? (size_t)n_stops : 1, sizeof *m->stop_len);
    int ok = m->stops && m->stop_len;
    size_t max_len = 0;
    for (int i = 0; ok && i < n_stops; i++) {
        m->stop_len[i] = strlen(stops[i]);
        m->stops[i] = malloc(m->stop_len[i]);
        ok = m->stops[i] != NULL;
        if (ok) memcpy(m->stops[i], stops[i], m->stop_len[i]);
        if (m->stop_len[i] > max_len) max_len = m->stop_len[i];
    }
    /* Room for the longest possible hold plus a typical token's bytes, so feeding a token at a
     * time does not allocate. */
    m->cap = max_len + 256;
    m->buf = ok ? malloc(m->cap) : NULL;
    if (!m->buf) {
        g4_stop_matcher_free(m);
        return g4_fail(err, G4_ERR_NOMEM, "stop matcher: out of memory");
    }
    g4_stop_matcher_reset(m);
    *out = m;
    return G4_OK;
}

void g4_stop_matcher_free(g4_stop_matcher *m) {
    if (!m) return;
    for (int i = 0; m->stops && i < m->n_stops; i++) free(m->stops[i]);
    free(m->stops);
    free(m->stop_len);
    free(m->buf);
    free(m);
}

void g4_stop_matcher_reset(g4_stop_matcher *m) {
    m->len = 0;
    m->held = 0;
    m->stopped = 0;
    m->stop_index = -1;
}

g4_status g4_stop_matcher_feed(g4_stop_matcher *m, const char *text, size_t len,
                               g4_stop_result *res, g4_error *err) {
    if (!res) return g4_fail(err, G4_ERR_ARG, "stop matcher: result is NULL");
    if (!text && len > 0) return g4_fail(err, G4_ERR_ARG, "stop matcher: text is NULL");
    /* The previous result pointed at buf[0 .. held); it is consumed now. */
    memmove(m->buf, m->buf + m->held, m->len - m->held);
    m->len -= m->held;
    m->held = 0;
    *res = (g4_stop_result){m->buf, 0, m->stopped, m->stop_index};
    if (m->stopped) return G4_OK;

    if (len > m->cap - m->len) {
        size_t cap = m->cap;
        while (len > cap - m->len) {
            if (cap > ((size_t)-1) / 2)
                return g4_fail(err, G4_ERR_NOMEM, "stop matcher: chunk too large");
            cap *= 2;
        }
        char *nb = realloc(m->buf, cap);
        if (!nb)
            return g4_fail(err, G4_ERR_NOMEM, "stop matcher: out of memory for %zu bytes", cap);
        m->buf = nb;
        m->cap = cap;
        res->text = m->buf;
    }
    if (len) memcpy(m->buf + m->len, text, len);
    m->len += len;

    /* The earliest-completing match; at equal ends the one that starts first. */
    size_t best_end = (size_t)-1, best_start = 0;
    int best = -1;
    for (int k = 0; k < m->n_stops; k++) {
        const char *p = memmem(m->buf, m->len, m->stops[k], m->stop_len[k]);
        if (!p) continue;
        size_t start = (size_t)(p - m->buf), end = start + m->stop_len[k];
        if (end < best_end || (end == best_end && start < best_start)) {
            best_end = end;
            best_start = start;
            best = k;
        }
    }
    if (best >= 0) {
        m->stopped = 1;
        m->stop_index = best;
        res->len = best_start;
        res->stopped = 1;
        res->stop_index = best;
        m->held = m->len; /* nothing after the stop is ever emitted */
        return G4_OK;
    }

    /* Hold the longest tail that a stop string starts with. */
    size_t hold = 0;
    for (int k = 0; k < m->n_stops; k++) {
        size_t l = m->stop_len[k] - 1 < m->len ? m->stop_len[k] - 1 : m->len;
        for (; l > hold; l--)
            if (memcmp(m->buf + m->len - l, m->stops[k], l) == 0) {
                hold = l;
                break;
            }
    }
    size_t emit = utf8_complete_end((const unsigned char *)m->buf, m->len - hold);
    res->len = emit;
    m->held = emit;
    return G4_OK;
}

void g4_stop_matcher_flush(g4_stop_matcher *m, g4_stop_result *res) {
    memmove(m->buf, m->buf + m->held, m->len - m->held);
    m->len -= m->held;
    *res = (g4_stop_result){m->buf, m->stopped ? 0 : m->len, m->stopped, m->stop_index};
    m->held = m->len;
}
