/* A small pull scanner for JSON, used where cJSON does not fit:
 *  - tokenizer.json is ~16 MB of which we need two big members (model.vocab, model.merges);
 *    cJSON spends ~0.4 s building a node per string, the scanner reads them in place;
 *  - JSON strings may contain \u0000, which cJSON's NUL-terminated strings silently cut
 *    (corpus.jsonl has one), while text here is length-counted.
 * Strings come back as (pointer, length): pointing into the input when they hold no escapes,
 * else into the scanner's buffer, valid until the next string is read. Errors name the file (or
 * input), the line and column, and what was being read. */
#ifndef G4_TEXT_TOKENIZER_JSON_H
#define G4_TEXT_TOKENIZER_JSON_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "g4.h"

typedef struct g4_json {
    const char *begin, *p, *end;
    const char *name;
    size_t first_line; /* line number of the input's first line in messages (0 means 1) */
    g4_error *err;
    char *buf;
    size_t buf_len, buf_cap;
} g4_json;

void g4_json_init(g4_json *j, const char *data, size_t len, const char *name, g4_error *err);
void g4_json_free(g4_json *j);

/* Skips whitespace; true when the next byte is c (not consumed). */
bool g4_json_peek(g4_json *j, char c);
/* Skips whitespace; consumes c if it is next. */
bool g4_json_accept(g4_json *j, char c);
/* True when only whitespace is left. */
bool g4_json_at_end(g4_json *j);
g4_status g4_json_expect(g4_json *j, char c, const char *where);

g4_status g4_json_string(g4_json *j, const char **s, size_t *len, const char *where);
/* An integer without fraction or exponent, in [INT64_MIN, INT64_MAX]. */
g4_status g4_json_int(g4_json *j, int64_t *out, const char *where);
g4_status g4_json_bool(g4_json *j, bool *out, const char *where);
/* Skips (and checks) any value; nesting is limited to 256 levels. */
g4_status g4_json_skip(g4_json *j, const char *where);

/* Object / array walking: call after g4_json_expect(j, '{' / '['); *first starts true.
 * next_key reads `"key":` (or the closing brace, setting *done); next_elem positions at the
 * next element (or consumes the closing bracket, setting *done). */
g4_status g4_json_next_key(g4_json *j, bool *first, const char **key, size_t *len, bool *done,
                           const char *where);
g4_status g4_json_next_elem(g4_json *j, bool *first, bool *done, const char *where);

/* Reports an error at the current position: "<name>: line L, column C: <message>". */
g4_status g4_json_fail(g4_json *j, g4_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Appends s[0..len) to out as a JSON string literal (quotes included), escaping as Python's
 * json.dumps(ensure_ascii=False) does; each byte that is not part of valid UTF-8 becomes
 * \ufffd, since JSON text cannot carry it. Returns false when out of memory. */
bool g4_json_write_string(char **out, size_t *out_len, size_t *out_cap, const char *s,
                          size_t len);
#endif
