/* The chat renderer's value model: JSON as Python's json.loads sees it.
 *
 * The official chat template is a Jinja program run over Python objects, and its output depends
 * on distinctions that a plain JSON tree loses: 1 and 1.0 print differently ("1" vs "1.0"), big
 * integers print exactly, a duplicated key keeps its first position but its last value, and a
 * missing key (Jinja's Undefined) behaves differently from null (Python's None). So conversations
 * are converted from cJSON into these values, with each number's literal recovered from the
 * source text, and the renderer reproduces the template over them. A NULL chat_val pointer plays
 * Jinja's Undefined throughout.
 *
 * Internal to src/text/chat*.c. Nothing here prints or keeps global state.
 */
#ifndef G4_TEXT_CHAT_VALUE_H
#define G4_TEXT_CHAT_VALUE_H
#include <stddef.h>

#include "g4.h"

typedef enum chat_vtype {
    CV_NONE,  /* JSON null: Python None */
    CV_BOOL,
    CV_INT,   /* a JSON number without '.', 'e' or 'E': a Python int, kept as its literal */
    CV_FLOAT, /* any other JSON number: a Python float */
    CV_STR,
    CV_LIST,
    CV_DICT,  /* keys unique, in first-insertion order, as a Python dict */
} chat_vtype;

typedef struct chat_val {
    chat_vtype type;
    int b;                  /* CV_BOOL */
    double f;               /* CV_FLOAT */
    char *s;                /* CV_STR: the bytes (NUL-terminated); CV_INT: the decimal literal */
    size_t len;             /* length of s */
    struct chat_val **items; /* CV_LIST elements, CV_DICT values */
    char **keys;            /* CV_DICT keys */
    size_t n, cap;
} chat_val;

/* Growable byte buffer. Appends never fail outright: running out of memory sets oom, later
 * appends are dropped, and whoever finishes the buffer reports G4_ERR_NOMEM. This keeps the
 * renderer's many small appends free of error plumbing. */
typedef struct chat_sb {
    char *buf;
    size_t len, cap;
    int oom;
} chat_sb;

void chat_sb_put(chat_sb *b, const char *s, size_t n);
void chat_sb_puts(chat_sb *b, const char *s);
void chat_sb_putc(chat_sb *b, char c);
void chat_sb_free(chat_sb *b);
/* Hands the NUL-terminated contents to the caller (who frees them) and resets b. */
g4_status chat_sb_take(chat_sb *b, char **out, size_t *out_len, g4_error *err);

chat_val *chat_val_new(chat_vtype type);
chat_val *chat_val_str(const char *s, size_t n);
chat_val *chat_val_strz(const char *s); /* NULL s gives NULL */
void chat_val_free(chat_val *v);
chat_val *chat_val_clone(const chat_val *v);
/* Appends v to a list (taking ownership); returns 0, or -1 on out-of-memory (v is then freed). */
int chat_val_push(chat_val *list, chat_val *v);
/* Sets d[key] = v as a Python dict does (an existing key keeps its position); takes v. */
int chat_val_set(chat_val *d, const char *key, chat_val *v);
/* Inserts v at list[i] (taking ownership); returns 0, or -1 on out-of-memory (v is then freed). */
int chat_val_insert(chat_val *list, size_t i, chat_val *v);
/* Removes list[i], freeing it. */
void chat_val_remove(chat_val *list, size_t i);
/* d[key], or NULL (Undefined) when d is not a dict or lacks the key. */
const chat_val *chat_val_get(const chat_val *d, const char *key);
/* Python truthiness; NULL (Undefined) is false. */
int chat_val_truthy(const chat_val *v);
int chat_val_is_str(const chat_val *v, const char *s);

/* Parses JSON text (NUL-terminated) into a value, as Python's json.loads would. what names the
 * input in error messages. */
g4_status chat_val_parse(const char *json, const char *what, chat_val **out, g4_error *err);

/* Whether s[0..n) is a JSON number (RFC 8259 grammar); *is_float: it has a fraction or exponent. */
int chat_json_number(const char *s, size_t n, int *is_float);

/* Python's str(v) (Jinja's {{ v }}); NULL (Undefined) prints nothing. */
void chat_py_str(chat_sb *b, const chat_val *v);
/* Python's repr(float). out needs 32 bytes. */
void chat_py_float(double d, char *out);
/* Python's str.strip(): [*start, *end) is s without leading and trailing Unicode whitespace. */
void chat_py_strip(const char *s, size_t n, size_t *start, size_t *end);
/* Indices of d's items in the order of Jinja's dictsort (case-insensitive by key, stable).
 * Returns NULL on out-of-memory (or when d has no items: check d->n). Caller frees. */
size_t *chat_dictsort(const chat_val *d);
#endif
