/* The chat renderer's value model (see chat_value.h for why it exists). */
#include "text/chat_value.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* ---- string builder ---------------------------------------------------------------------- */

void chat_sb_put(chat_sb *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}

void chat_sb_puts(chat_sb *b, const char *s) { chat_sb_put(b, s, strlen(s)); }
void chat_sb_putc(chat_sb *b, char c) { chat_sb_put(b, &c, 1); }

void chat_sb_free(chat_sb *b) {
    free(b->buf);
    memset(b, 0, sizeof *b);
}

g4_status chat_sb_take(chat_sb *b, char **out, size_t *out_len, g4_error *err) {
    if (!b->oom && !b->buf) {
        b->buf = malloc(1);
        if (b->buf) b->buf[0] = 0;
        else b->oom = 1;
    }
    if (b->oom) {
        chat_sb_free(b);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory building chat text");
    }
    *out = b->buf;
    if (out_len) *out_len = b->len;
    memset(b, 0, sizeof *b);
    return G4_OK;
}

/* ---- values ------------------------------------------------------------------------------ */

chat_val *chat_val_new(chat_vtype type) {
    chat_val *v = calloc(1, sizeof *v);
    if (v) v->type = type;
    return v;
}

chat_val *chat_val_str(const char *s, size_t n) {
    chat_val *v = chat_val_new(CV_STR);
    if (!v) return NULL;
    v->s = malloc(n + 1);
    if (!v->s) {
        free(v);
        return NULL;
    }
    if (n) memcpy(v->s, s, n);
    v->s[n] = 0;
    v->len = n;
    return v;
}

chat_val *chat_val_strz(const char *s) { return s ? chat_val_str(s, strlen(s)) : NULL; }

void chat_val_free(chat_val *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        chat_val_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
    free(v);
}

static int grow(chat_val *c) {
    if (c->n < c->cap) return 0;
    size_t cap = c->cap ? c->cap * 2 : 4;
    chat_val **items = realloc(c->items, cap * sizeof *items);
    if (!items) return -1;
    c->items = items;
    if (c->type == CV_DICT) {
        char **keys = realloc(c->keys, cap * sizeof *keys);
        if (!keys) return -1;
        c->keys = keys;
    }
    c->cap = cap;
    return 0;
}

int chat_val_push(chat_val *list, chat_val *v) {
    if (!v || grow(list)) {
        chat_val_free(v);
        return -1;
    }
    list->items[list->n++] = v;
    return 0;
}

int chat_val_set(chat_val *d, const char *key, chat_val *v) {
    if (!v) return -1;
    for (size_t i = 0; i < d->n; i++)
        if (!strcmp(d->keys[i], key)) {
            chat_val_free(d->items[i]);
            d->items[i] = v;
            return 0;
        }
    char *k = strdup(key);
    if (!k || grow(d)) {
        free(k);
        chat_val_free(v);
        return -1;
    }
    d->keys[d->n] = k;
    d->items[d->n++] = v;
    return 0;
}

int chat_val_insert(chat_val *list, size_t i, chat_val *v) {
    if (i > list->n) {
        chat_val_free(v);
        return -1;
    }
    if (chat_val_push(list, v)) return -1;
    memmove(list->items + i + 1, list->items + i, (list->n - 1 - i) * sizeof *list->items);
    list->items[i] = v;
    return 0;
}

void chat_val_remove(chat_val *list, size_t i) {
    if (i >= list->n) return;
    chat_val_free(list->items[i]);
    if (list->keys) free(list->keys[i]);
    memmove(list->items + i, list->items + i + 1, (list->n - i - 1) * sizeof *list->items);
    if (list->keys)
        memmove(list->keys + i, list->keys + i + 1, (list->n - i - 1) * sizeof *list->keys);
    list->n--;
}

chat_val *chat_val_clone(const chat_val *v) {
    if (!v) return NULL;
    chat_val *c = chat_val_new(v->type);
    if (!c) return NULL;
    c->b = v->b;
    c->f = v->f;
    if (v->s) {
        c->s = malloc(v->len + 1);
        if (!c->s) goto fail;
        memcpy(c->s, v->s, v->len + 1);
        c->len = v->len;
    }
    for (size_t i = 0; i < v->n; i++) {
        chat_val *item = chat_val_clone(v->items[i]);
        if (!item) goto fail;
        if (v->type == CV_DICT ? chat_val_set(c, v->keys[i], item) : chat_val_push(c, item))
            goto fail;
    }
    return c;
fail:
    chat_val_free(c);
    return NULL;
}

const chat_val *chat_val_get(const chat_val *d, const char *key) {
    if (!d || d->type != CV_DICT) return NULL;
    for (size_t i = 0; i < d->n; i++)
        if (!strcmp(d->keys[i], key)) return d->items[i];
    return NULL;
}

int chat_val_truthy(const chat_val *v) {
    if (!v) return 0;
    switch (v->type) {
    case CV_NONE: return 0;
    case CV_BOOL: return v->b;
    case CV_INT: return strcmp(v->s, "0") != 0;
    case CV_FLOAT: return v->f != 0.0;
    case CV_STR: return v->len > 0;
    case CV_LIST:
    case CV_DICT: return v->n > 0;
    }
    return 0;
}

int chat_val_is_str(const chat_val *v, const char *s) {
    return v && v->type == CV_STR && v->len == strlen(s) && !memcmp(v->s, s, v->len);
}

/* ---- JSON -> values ---------------------------------------------------------------------- */

/* cJSON keeps only a double per number, so the literal of each number is found again in the
 * source: numbers appear in the text in the same order as a pre-order walk of the parsed tree. */
typedef struct num_scan {
    const char *p;
} num_scan;

static int next_number(num_scan *sc, const char **lit, size_t *len) {
    const char *p = sc->p;
    for (; *p; p++) {
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1]) p++;
            if (!*p) break;
        } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
            const char *s = p;
            while (*p && strchr("0123456789+-.eE", *p)) p++;
            *lit = s;
            *len = (size_t)(p - s);
            sc->p = p;
            return 0;
        }
    }
    sc->p = p;
    return -1;
}

/* RFC 8259 number grammar; cJSON (via strtod) also takes forms like "007" that Python rejects. */
int chat_json_number(const char *s, size_t n, int *is_float) {
    size_t i = 0;
    *is_float = 0;
    if (i < n && s[i] == '-') i++;
    if (i >= n) return 0;
    if (s[i] == '0') i++;
    else if (s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else return 0;
    if (i < n && s[i] == '.') {
        *is_float = 1;
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        *is_float = 1;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    return i == n;
}

static g4_status convert(const cJSON *j, num_scan *sc, const char *what, chat_val **out,
                         g4_error *err) {
    chat_val *v = NULL;
    if (cJSON_IsNull(j)) v = chat_val_new(CV_NONE);
    else if (cJSON_IsBool(j)) {
        v = chat_val_new(CV_BOOL);
        if (v) v->b = cJSON_IsTrue(j);
    } else if (cJSON_IsNumber(j)) {
        const char *lit;
        size_t len;
        int is_float;
        if (next_number(sc, &lit, &len))
            return g4_fail(err, G4_ERR_FORMAT, "%s: lost track of a number literal", what);
        if (!chat_json_number(lit, len, &is_float))
            return g4_fail(err, G4_ERR_FORMAT, "%s: bad JSON number '%.*s'", what, (int)len, lit);
        if (is_float) {
            v = chat_val_new(CV_FLOAT);
            if (v) v->f = j->valuedouble;
        } else {
            /* Python prints ints canonically; the only non-canonical JSON int is -0. */
            if (len == 2 && lit[0] == '-' && lit[1] == '0') lit++, len--;
            v = chat_val_str(lit, len);
            if (v) v->type = CV_INT;
        }
    } else if (cJSON_IsString(j)) v = chat_val_strz(j->valuestring);
    else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        int obj = cJSON_IsObject(j);
        v = chat_val_new(obj ? CV_DICT : CV_LIST);
        if (!v) return g4_fail(err, G4_ERR_NOMEM, "out of memory reading %s", what);
        for (const cJSON *c = j->child; c; c = c->next) {
            chat_val *item;
            g4_status st = convert(c, sc, what, &item, err);
            if (st) {
                chat_val_free(v);
                return st;
            }
            if (obj ? chat_val_set(v, c->string, item) : chat_val_push(v, item)) {
                chat_val_free(v);
                return g4_fail(err, G4_ERR_NOMEM, "out of memory reading %s", what);
            }
        }
    } else return g4_fail(err, G4_ERR_FORMAT, "%s: unexpected JSON value", what);
    if (!v) return g4_fail(err, G4_ERR_NOMEM, "out of memory reading %s", what);
    *out = v;
    return G4_OK;
}

g4_status chat_val_parse(const char *json, const char *what, chat_val **out, g4_error *err) {
    *out = NULL;
    if (!json) return g4_fail(err, G4_ERR_ARG, "%s: no JSON text given", what);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(json, &end, 1);
    if (!j) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return g4_fail(err, G4_ERR_FORMAT, "%s: bad JSON near byte %zu", what, at);
    }
    num_scan sc = {json};
    g4_status st = convert(j, &sc, what, out, err);
    cJSON_Delete(j);
    return st;
}

/* ---- Python printing --------------------------------------------------------------------- */

void chat_py_float(double d, char *out) {
    if (isnan(d)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(d)) {
        strcpy(out, d < 0 ? "-inf" : "inf");
        return;
    }
    if (d == 0) {
        strcpy(out, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    /* Shortest digits that read back as d (Python's repr), found by widening %.*e. */
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    const char *p = tmp;
    char *o = out;
    if (*p == '-') *o++ = *p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (e >= -4 && e < 16) {
        int decpt = e + 1;
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) *o++ = digits[i];
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            for (int i = 0; i < nd; i++) {
                if (i == decpt) *o++ = '.';
                *o++ = digits[i];
            }
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = digits[i];
        }
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* Decodes one UTF-8 sequence at s (n bytes available); invalid bytes decode as themselves with
 * length 1 so that nothing is lost. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0];
    size_t need = c >= 0xF0 && c < 0xF8   ? 3
                  : c >= 0xE0 && c < 0xF0 ? 2
                  : c >= 0xC0 && c < 0xE0 ? 1
                                          : 0;
    *len = 1;
    if (!need || need >= n) return c;
    uint32_t cp = c & (0x3Fu >> need);
    for (size_t i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) return c;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    *len = need + 1;
    return cp;
}

/* Python's str.isspace(). */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

void chat_py_strip(const char *s, size_t n, size_t *start, size_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n;
    while (a < n) {
        size_t l;
        uint32_t c = utf8_next(u + a, n - a, &l);
        if (!py_space(c)) break;
        a += l;
    }
    while (b > a) {
        /* Back up to the start of the last sequence. */
        size_t k = b - 1;
        while (k > a && b - k < 4 && (u[k] & 0xC0) == 0x80) k--;
        size_t l;
        uint32_t c = utf8_next(u + k, b - k, &l);
        if (k + l != b) { /* not one well-formed sequence: the last byte stands alone */
            k = b - 1;
            c = u[k];
        }
        if (!py_space(c)) break;
        b = k;
    }
    *start = a;
    *end = b;
}

/* Characters Python's repr() escapes beyond ASCII controls: separators, format characters and
 * private use (str.isprintable() is false). Unassigned code points are not tabulated. */
static int py_unprintable(uint32_t c) {
    return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || (c >= 0x600 && c <= 0x605) ||
           c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x1680 || c == 0x180E ||
           (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
           (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000 ||
           (c >= 0xD800 && c <= 0xF8FF) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) ||
           c == 0x110BD || (c >= 0x1D173 && c <= 0x1D17A) || c == 0xE0001 ||
           (c >= 0xE0020 && c <= 0xE007F) || c >= 0xF0000;
}

static void py_repr_str(chat_sb *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    chat_sb_putc(b, q);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t c = utf8_next(u + i, n - i, &l);
        char esc[16];
        if (c == '\\' || c == (uint32_t)q) {
            esc[0] = '\\';
            esc[1] = (char)c;
            chat_sb_put(b, esc, 2);
        } else if (c == '\n') chat_sb_puts(b, "\\n");
        else if (c == '\r') chat_sb_puts(b, "\\r");
        else if (c == '\t') chat_sb_puts(b, "\\t");
        else if (py_unprintable(c)) {
            if (c < 0x100) snprintf(esc, sizeof esc, "\\x%02x", c);
            else if (c < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", c);
            else snprintf(esc, sizeof esc, "\\U%08x", c);
            chat_sb_puts(b, esc);
        } else chat_sb_put(b, s + i, l);
        i += l;
    }
    chat_sb_putc(b, q);
}

static void py_repr(chat_sb *b, const chat_val *v);

static void py_str_impl(chat_sb *b, const chat_val *v, int repr) {
    if (!v) return;
    char num[32];
    switch (v->type) {
    case CV_NONE: chat_sb_puts(b, "None"); break;
    case CV_BOOL: chat_sb_puts(b, v->b ? "True" : "False"); break;
    case CV_INT: chat_sb_put(b, v->s, v->len); break;
    case CV_FLOAT:
        chat_py_float(v->f, num);
        chat_sb_puts(b, num);
        break;
    case CV_STR:
        if (repr) py_repr_str(b, v->s, v->len);
        else chat_sb_put(b, v->s, v->len);
        break;
    case CV_LIST:
        chat_sb_putc(b, '[');
        for (size_t i = 0; i < v->n; i++) {
            if (i) chat_sb_puts(b, ", ");
            py_repr(b, v->items[i]);
        }
        chat_sb_putc(b, ']');
        break;
    case CV_DICT:
        chat_sb_putc(b, '{');
        for (size_t i = 0; i < v->n; i++) {
            if (i) chat_sb_puts(b, ", ");
            py_repr_str(b, v->keys[i], strlen(v->keys[i]));
            chat_sb_puts(b, ": ");
            py_repr(b, v->items[i]);
        }
        chat_sb_putc(b, '}');
        break;
    }
}

static void py_repr(chat_sb *b, const chat_val *v) { py_str_impl(b, v, 1); }
void chat_py_str(chat_sb *b, const chat_val *v) { py_str_impl(b, v, 0); }

/* ---- dictsort ---------------------------------------------------------------------------- */

/* str.lower() for the scripts whose capitals are laid out as a fixed offset (ASCII, Latin-1,
 * Greek, Cyrillic); other capitals sort as themselves. */
static uint32_t py_lower(uint32_t c) {
    if ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7) ||
        (c >= 0x391 && c <= 0x3AB && c != 0x3A2) || (c >= 0x410 && c <= 0x42F))
        return c + 0x20;
    if (c >= 0x400 && c <= 0x40F) return c + 0x50;
    return c;
}

static int lower_cmp(const char *a, const char *b) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t nx = strlen(a), ny = strlen(b), i = 0, j = 0;
    while (i < nx && j < ny) {
        size_t lx, ly;
        uint32_t cx = py_lower(utf8_next(x + i, nx - i, &lx));
        uint32_t cy = py_lower(utf8_next(y + j, ny - j, &ly));
        if (cx != cy) return cx < cy ? -1 : 1;
        i += lx;
        j += ly;
    }
    return (i < nx) - (j < ny);
}

typedef struct sort_item {
    const char *key;
    size_t idx;
} sort_item;

static int sort_cmp(const void *pa, const void *pb) {
    const sort_item *a = pa, *b = pb;
    int c = lower_cmp(a->key, b->key);
    if (c) return c;
    return a->idx < b->idx ? -1 : a->idx > b->idx; /* Python's sort is stable */
}

size_t *chat_dictsort(const chat_val *d) {
    if (!d->n) return NULL;
    sort_item *items = malloc(d->n * sizeof *items);
    size_t *order = malloc(d->n * sizeof *order);
    if (!items || !order) {
        free(items);
        free(order);
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++) items[i] = (sort_item){d->keys[i], i};
    qsort(items, d->n, sizeof *items, sort_cmp);
    for (size_t i = 0; i < d->n; i++) order[i] = items[i].idx;
    free(items);
    return order;
}
