/* Streaming parser of a model turn: thinking, answer text and tool calls.
 *
 * Input is held only while it could still be the start of a marker (or of a UTF-8 sequence, so
 * that every text delta is whole characters); everything else is passed on at once. Which marker
 * is recognised depends only on the bytes, never on how they were split into chunks, so any
 * split gives the same result. Tool calls are buffered whole and converted from the format's
 * notation (bare keys, strings quoted by <|"|>) into JSON when <tool_call|> arrives.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "g4_chat.h"
#include "text/chat_value.h"
#include "util/error.h"

#define Q "<|\"|>"
#define QLEN 5
/* A channel name longer than this without a newline is taken for thinking text instead. */
#define MAX_CHANNEL_NAME 32
#define MAX_DEPTH 128

enum { M_CHANNEL_OPEN, M_CHANNEL_CLOSE, M_CALL_OPEN, M_CALL_CLOSE, M_TOOL_RESPONSE, M_TURN, M_EOS };
static const char *const marker_text[] = {"<|channel>", "<channel|>", "<|tool_call>",
                                          "<tool_call|>", "<|tool_response>", "<turn|>", "<eos>"};
#define N_MARKERS 7

typedef enum pstate { ST_TEXT, ST_THINK, ST_CALL, ST_DONE } pstate;

/* The markers each state reacts to; anything else is ordinary text there. */
static const unsigned state_markers[] = {
    [ST_TEXT] = 1u << M_CHANNEL_OPEN | 1u << M_CHANNEL_CLOSE | 1u << M_CALL_OPEN |
                1u << M_TOOL_RESPONSE | 1u << M_TURN | 1u << M_EOS,
    [ST_THINK] = 1u << M_CHANNEL_CLOSE | 1u << M_TURN | 1u << M_EOS,
    [ST_CALL] = 1u << M_CALL_CLOSE | 1u << M_TOOL_RESPONSE | 1u << M_TURN | 1u << M_EOS,
    [ST_DONE] = 0,
};

struct g4_chat_parser {
    g4_chat_event_fn fn;
    void *user;
    pstate state;
    g4_chat_stop stop;
    int finished;
    chat_sb pending;  /* input not yet classified */
    chat_sb thinking, content;
    chat_sb call;     /* the open tool call's body */
    chat_sb name;     /* the open channel's name line, until its newline */
    int name_done;
    g4_chat_tool_call *calls;
    size_t n_calls, cap_calls;
    int oom;
};

g4_status g4_chat_parser_new(g4_chat_event_fn fn, void *user, g4_chat_parser **out,
                             g4_error *err) {
    if (!out) return g4_fail(err, G4_ERR_ARG, "g4_chat_parser_new: out is NULL");
    g4_chat_parser *p = calloc(1, sizeof *p);
    if (!p) return g4_fail(err, G4_ERR_NOMEM, "out of memory creating the chat parser");
    p->fn = fn;
    p->user = user;
    *out = p;
    return G4_OK;
}

static void free_call(g4_chat_tool_call *c) {
    free(c->name);
    free(c->arguments);
    free(c->raw);
    free(c->error);
}

void g4_chat_parser_free(g4_chat_parser *p) {
    if (!p) return;
    chat_sb_free(&p->pending);
    chat_sb_free(&p->thinking);
    chat_sb_free(&p->content);
    chat_sb_free(&p->call);
    chat_sb_free(&p->name);
    for (size_t i = 0; i < p->n_calls; i++) free_call(&p->calls[i]);
    free(p->calls);
    free(p);
}

static void event_text(g4_chat_parser *p, g4_chat_event_type type, const char *s, size_t n) {
    if (!n) return;
    chat_sb_put(type == G4_CHAT_EV_THINKING ? &p->thinking : &p->content, s, n);
    if (p->fn) {
        g4_chat_event ev = {.type = type, .text = s, .len = n};
        p->fn(p->user, &ev);
    }
}

/* ---- tool call bodies -------------------------------------------------------------------- */

typedef struct cparse {
    const char *s;
    size_t n, i;
    chat_sb out; /* the JSON being written */
    char err[200];
} cparse;

static int cp_fail(cparse *c, const char *what) {
    if (!c->err[0]) snprintf(c->err, sizeof c->err, "%s at byte %zu of the call", what, c->i);
    return -1;
}

static void cp_ws(cparse *c) {
    while (c->i < c->n && strchr(" \t\r\n", c->s[c->i])) c->i++;
}

static int cp_at(const cparse *c, const char *lit, size_t len) {
    return c->n - c->i >= len && !memcmp(c->s + c->i, lit, len);
}

static void json_string(chat_sb *b, const char *s, size_t n) {
    chat_sb_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        switch (ch) {
        case '"': chat_sb_puts(b, "\\\""); break;
        case '\\': chat_sb_puts(b, "\\\\"); break;
        case '\n': chat_sb_puts(b, "\\n"); break;
        case '\r': chat_sb_puts(b, "\\r"); break;
        case '\t': chat_sb_puts(b, "\\t"); break;
        case '\b': chat_sb_puts(b, "\\b"); break;
        case '\f': chat_sb_puts(b, "\\f"); break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
                chat_sb_puts(b, esc);
            } else chat_sb_putc(b, (char)ch);
        }
    }
    chat_sb_putc(b, '"');
}

/* <|"|>...<|"|>: the text between is taken verbatim. */
static int cp_string(cparse *c) {
    const char *end = memmem(c->s + c->i + QLEN, c->n - c->i - QLEN, Q, QLEN);
    if (!end) return cp_fail(c, "unterminated <|\"|> string"); /* at its opening quote */
    c->i += QLEN;
    json_string(&c->out, c->s + c->i, (size_t)(end - (c->s + c->i)));
    c->i = (size_t)(end - c->s) + QLEN;
    return 0;
}

static int cp_value(cparse *c, int depth);

/* An object key: bare (as the template writes tool call arguments) or <|"|>-quoted (as it
 * writes nested keys elsewhere). */
static int cp_key(cparse *c) {
    if (cp_at(c, Q, QLEN)) return cp_string(c);
    size_t a = c->i;
    while (c->i < c->n && !strchr(":,{}[]", c->s[c->i]) && !cp_at(c, Q, QLEN)) c->i++;
    size_t b = c->i;
    while (b > a && strchr(" \t\r\n", c->s[b - 1])) b--;
    if (b == a) return cp_fail(c, "expected a key");
    json_string(&c->out, c->s + a, b - a);
    return 0;
}

static int cp_container(cparse *c, int depth, int object) {
    char close = object ? '}' : ']';
    if (depth > MAX_DEPTH) return cp_fail(c, "arguments nest too deeply");
    chat_sb_putc(&c->out, c->s[c->i++]);
    cp_ws(c);
    if (c->i < c->n && c->s[c->i] == close) {
        chat_sb_putc(&c->out, c->s[c->i++]);
        return 0;
    }
    for (;;) {
        cp_ws(c);
        if (object) {
            if (cp_key(c)) return -1;
            cp_ws(c);
            if (c->i >= c->n || c->s[c->i] != ':') return cp_fail(c, "expected ':' after a key");
            chat_sb_putc(&c->out, ':');
            c->i++;
        }
        if (cp_value(c, depth + 1)) return -1;
        cp_ws(c);
        if (c->i >= c->n)
            return cp_fail(c, object ? "unterminated object" : "unterminated array");
        char ch = c->s[c->i];
        if (ch == close) {
            chat_sb_putc(&c->out, close);
            c->i++;
            return 0;
        }
        if (ch != ',') return cp_fail(c, object ? "expected ',' or '}'" : "expected ',' or ']'");
        chat_sb_putc(&c->out, ',');
        c->i++;
    }
}

static int cp_value(cparse *c, int depth) {
    cp_ws(c);
    if (c->i >= c->n) return cp_fail(c, "expected a value");
    if (cp_at(c, Q, QLEN)) return cp_string(c);
    char ch = c->s[c->i];
    if (ch == '{' || ch == '[') return cp_container(c, depth, ch == '{');
    /* A bare scalar: a number, or a boolean / null as JSON or Python writes it. */
    size_t a = c->i;
    while (c->i < c->n && !strchr(",}] \t\r\n", c->s[c->i]) && !cp_at(c, Q, QLEN)) c->i++;
    const char *tok = c->s + a;
    size_t len = c->i - a;
    static const char *const words[] = {"true", "false", "null", "True", "False", "None"};
    for (int w = 0; w < 6; w++)
        if (len == strlen(words[w]) && !memcmp(tok, words[w], len)) {
            chat_sb_puts(&c->out, words[w % 3]);
            return 0;
        }
    int is_float;
    if (len && chat_json_number(tok, len, &is_float)) {
        chat_sb_put(&c->out, tok, len);
        return 0;
    }
    c->i = a;
    char what[96];
    snprintf(what, sizeof what, "unquoted value '%.*s'", len > 40 ? 40 : (int)len, tok);
    return cp_fail(c, what);
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* Fills call from the text between <|tool_call> and <tool_call|>: call:NAME{ARGS}. */
static void parse_call(const char *s, size_t n, int terminated, g4_chat_tool_call *call) {
    cparse c = {.s = s, .n = n};
    char *name = NULL;
    cp_ws(&c);
    if (!cp_at(&c, "call:", 5)) cp_fail(&c, "expected 'call:'");
    else {
        c.i += 5;
        size_t a = c.i;
        while (c.i < n && s[c.i] != '{' && !strchr(" \t\r\n<>[]}(),:", s[c.i])) c.i++;
        if (c.i == a) cp_fail(&c, "expected a function name after 'call:'");
        else {
            name = dup_n(s + a, c.i - a);
            if (!name) c.out.oom = 1;
            if (c.i >= n || s[c.i] != '{') cp_fail(&c, "expected '{' after the function name");
            else if (!cp_container(&c, 0, 1)) {
                cp_ws(&c);
                if (c.i < n) cp_fail(&c, "unexpected text after the arguments");
            }
        }
    }
    if (!terminated && !c.err[0]) snprintf(c.err, sizeof c.err, "no <tool_call|> before the end");
    else if (!terminated) {
        size_t l = strlen(c.err);
        snprintf(c.err + l, sizeof c.err - l, " (and no <tool_call|> before the end)");
    }
    call->name = name;
    call->raw = dup_n(s, n);
    if (c.out.oom) {
        /* neither arguments nor error: finish_call reports out-of-memory */
    } else if (c.err[0]) {
        char msg[320];
        snprintf(msg, sizeof msg, "tool call%s%s: %s", name ? " " : "", name ? name : "", c.err);
        call->error = strdup(msg);
    } else {
        call->arguments = c.out.buf;
        c.out.buf = NULL;
    }
    chat_sb_free(&c.out);
}

static void finish_call(g4_chat_parser *p, int terminated) {
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        g4_chat_tool_call *calls = realloc(p->calls, cap * sizeof *calls);
        if (!calls) {
            p->oom = 1;
            return;
        }
        p->calls = calls;
        p->cap_calls = cap;
    }
    g4_chat_tool_call *call = &p->calls[p->n_calls];
    memset(call, 0, sizeof *call);
    parse_call(p->call.buf ? p->call.buf : "", p->call.len, terminated, call);
    if (!call->raw || (!call->error && !call->arguments)) {
        free_call(call);
        p->oom = 1;
        return;
    }
    p->n_calls++;
    p->call.len = 0;
    if (p->fn) {
        g4_chat_event ev = {.type = G4_CHAT_EV_TOOL_CALL, .tool_call = call};
        p->fn(p->user, &ev);
    }
}

/* ---- the stream -------------------------------------------------------------------------- */

static void set_done(g4_chat_parser *p, g4_chat_stop stop) {
    p->state = ST_DONE;
    p->stop = stop;
    if (p->fn) {
        g4_chat_event ev = {.type = G4_CHAT_EV_DONE, .stop = stop};
        p->fn(p->user, &ev);
    }
}

/* Text that is no marker, in the current state. */
static void emit(g4_chat_parser *p, const char *s, size_t n) {
    if (!n) return;
    if (p->state == ST_TEXT) event_text(p, G4_CHAT_EV_CONTENT, s, n);
    else if (p->state == ST_CALL) chat_sb_put(&p->call, s, n);
    else if (p->state == ST_THINK) {
        /* The channel opens with its name line ("thought\n"), which is not thinking text. */
        size_t i = 0;
        while (!p->name_done && i < n) {
            if (s[i] == '\n') p->name_done = 1;
            else chat_sb_putc(&p->name, s[i]);
            i++;
            /* Deltas are whole characters: only give up on the name between two. */
            int boundary = i == n || ((unsigned char)s[i] & 0xC0) != 0x80;
            if (!p->name_done && p->name.len > MAX_CHANNEL_NAME && boundary) {
                p->name_done = 1;
                event_text(p, G4_CHAT_EV_THINKING, p->name.buf, p->name.len);
            }
        }
        event_text(p, G4_CHAT_EV_THINKING, s + i, n - i);
    }
}

static void on_marker(g4_chat_parser *p, int m) {
    switch (m) {
    case M_CHANNEL_OPEN:
        p->state = ST_THINK;
        p->name_done = 0;
        p->name.len = 0;
        break;
    case M_CHANNEL_CLOSE:
        /* Ends a thought; a stray one in the answer is a control token, dropped. */
        p->state = ST_TEXT;
        break;
    case M_CALL_OPEN:
        p->state = ST_CALL;
        p->call.len = 0;
        break;
    case M_CALL_CLOSE:
        finish_call(p, 1);
        p->state = ST_TEXT;
        break;
    default:
        if (p->state == ST_CALL) finish_call(p, 0);
        set_done(p, m == M_TURN ? G4_CHAT_STOP_TURN
                    : m == M_EOS ? G4_CHAT_STOP_EOS
                                 : G4_CHAT_STOP_TOOL_RESPONSE);
    }
}

/* Bytes at the end of s[0..n) that open a UTF-8 sequence not yet complete. */
static size_t utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = c >= 0xF0 && c < 0xF8   ? 4
                      : c >= 0xE0 && c < 0xF0 ? 3
                      : c >= 0xC0 && c < 0xE0 ? 2
                                              : 1;
        return need > k ? k : 0;
    }
    return 0;
}

/* Classifies as much pending input as can be; with final, all of it. */
static void process(g4_chat_parser *p, int final) {
    size_t at = 0;
    const char *buf = p->pending.buf;
    size_t len = p->pending.len;
    while (p->state != ST_DONE && at < len) {
        const char *s = buf + at;
        size_t n = len - at, i = 0, hold = n;
        int found = -1;
        const char *lt;
        while (found < 0 && hold == n && (lt = memchr(s + i, '<', n - i))) {
            size_t pos = (size_t)(lt - s), rem = n - pos;
            int partial = 0;
            for (int m = 0; m < N_MARKERS; m++) {
                if (!(state_markers[p->state] >> m & 1)) continue;
                size_t ml = strlen(marker_text[m]);
                if (rem >= ml && !memcmp(lt, marker_text[m], ml)) {
                    found = m;
                    break;
                }
                if (rem < ml && !memcmp(lt, marker_text[m], rem)) partial = 1;
            }
            if (found >= 0) {
                emit(p, s, pos);
                at += pos + strlen(marker_text[found]);
                on_marker(p, found);
            } else if (partial && !final) hold = pos;
            else i = pos + 1;
        }
        if (found >= 0) continue;
        size_t take = hold;
        if (!final && hold == n && p->state != ST_CALL) take -= utf8_incomplete_tail(s, n);
        emit(p, s, take);
        at += take;
        break;
    }
    if (p->state == ST_DONE) at = len; /* after the end marker, input is ignored */
    if (at < len) memmove(p->pending.buf, buf + at, len - at);
    p->pending.len = len - at;
}

static g4_status check_oom(g4_chat_parser *p, g4_error *err) {
    if (p->oom || p->pending.oom || p->thinking.oom || p->content.oom || p->call.oom ||
        p->name.oom)
        return g4_fail(err, G4_ERR_NOMEM, "out of memory parsing model output");
    return G4_OK;
}

g4_status g4_chat_parser_feed(g4_chat_parser *p, const char *text, size_t len, g4_error *err) {
    if (!p || (!text && len)) return g4_fail(err, G4_ERR_ARG, "g4_chat_parser_feed: NULL argument");
    if (p->state == ST_DONE || p->finished || !len) return G4_OK;
    chat_sb_put(&p->pending, text, len);
    process(p, 0);
    return check_oom(p, err);
}

g4_status g4_chat_parser_finish(g4_chat_parser *p, g4_error *err) {
    if (!p) return g4_fail(err, G4_ERR_ARG, "g4_chat_parser_finish: NULL parser");
    if (p->finished) return G4_OK;
    p->finished = 1;
    if (p->pending.len) process(p, 1);
    if (p->state != ST_DONE) {
        if (p->state == ST_CALL) finish_call(p, 0);
        set_done(p, G4_CHAT_STOP_NONE);
    }
    return check_oom(p, err);
}

g4_chat_stop g4_chat_parser_stop(const g4_chat_parser *p) { return p->stop; }

const char *g4_chat_parser_thinking(const g4_chat_parser *p, size_t *len) {
    if (len) *len = p->thinking.len;
    return p->thinking.buf ? p->thinking.buf : "";
}

const char *g4_chat_parser_content(const g4_chat_parser *p, size_t *len) {
    if (len) *len = p->content.len;
    return p->content.buf ? p->content.buf : "";
}

size_t g4_chat_parser_n_tool_calls(const g4_chat_parser *p) { return p->n_calls; }

const g4_chat_tool_call *g4_chat_parser_tool_call(const g4_chat_parser *p, size_t i) {
    return i < p->n_calls ? &p->calls[i] : NULL;
}
