/* The Gemma 4 chat template (fixtures/chat/chat_template.jinja) in C.
 *
 * Each function below mirrors one part of the template, in its order, with Python/Jinja value
 * semantics supplied by chat_value.h (a NULL value is Jinja's Undefined). Where the template
 * would raise or print Python reprs of nonsense (a list where a string goes, a tool result with
 * no resolvable name), chat_check_message() rejects the input up front with a message naming
 * the field instead.
 */
#include <stdlib.h>
#include <string.h>

#include "text/chat_internal.h"
#include "util/error.h"

#define Q "<|\"|>" /* the format's string quote */

typedef struct rctx {
    chat_sb *b;
    g4_error *err;
} rctx;

static g4_status nomem(rctx *r) {
    return g4_fail(r->err, G4_ERR_NOMEM, "out of memory rendering the chat");
}

static const char *role_of(const chat_val *m) {
    const chat_val *r = chat_val_get(m, "role");
    return r && r->type == CV_STR ? r->s : "";
}

/* ---- shape checks ------------------------------------------------------------------------ */

static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};

static g4_status check_parts(const chat_val *content, size_t idx, g4_error *err) {
    for (size_t k = 0; k < content->n; k++) {
        const chat_val *part = content->items[k];
        if (part->type != CV_DICT)
            return g4_fail(err, G4_ERR_FORMAT, "messages[%zu].content[%zu] is not an object", idx,
                           k);
        const chat_val *text = chat_val_get(part, "text");
        if (chat_val_is_str(chat_val_get(part, "type"), "text") && (!text || text->type != CV_STR))
            return g4_fail(err, G4_ERR_FORMAT,
                           "messages[%zu].content[%zu]: a text part's \"text\" must be a string",
                           idx, k);
    }
    return G4_OK;
}

g4_status chat_check_message(const chat_val *m, size_t idx, int first, g4_error *err) {
    if (!m || m->type != CV_DICT)
        return g4_fail(err, G4_ERR_FORMAT, "messages[%zu] is not an object", idx);
    const chat_val *role = chat_val_get(m, "role");
    if (!role) return g4_fail(err, G4_ERR_FORMAT, "messages[%zu] has no \"role\"", idx);
    if (role->type != CV_STR)
        return g4_fail(err, G4_ERR_FORMAT, "messages[%zu].role is not a string", idx);
    size_t r = 0;
    while (r < 5 && strcmp(role->s, roles[r])) r++;
    if (r == 5)
        return g4_fail(err, G4_ERR_FORMAT,
                       "messages[%zu].role '%s' is not one of system, developer, user, assistant, "
                       "tool", idx, role->s);
    int is_tool = r == 4;

    const chat_val *content = chat_val_get(m, "content");
    if (first && r <= 1) {
        /* The template trims the leading system message's content as a string. */
        if (content && content->type != CV_STR)
            return g4_fail(err, G4_ERR_FORMAT,
                           "messages[%zu].content: a leading %s message's content must be a string",
                           idx, role->s);
    } else if (content) {
        switch (content->type) {
        case CV_STR:
        case CV_NONE: break;
        case CV_LIST: {
            g4_status st = check_parts(content, idx, err);
            if (st) return st;
            break;
        }
        case CV_INT:
        case CV_FLOAT:
        case CV_BOOL:
            if (is_tool) break; /* a tool result may be a bare value */
            /* fall through */
        default:
            return g4_fail(err, G4_ERR_FORMAT,
                           "messages[%zu].content must be a string or an array of content parts",
                           idx);
        }
    }
    static const char *const thinking_keys[] = {"reasoning", "reasoning_content"};
    for (int k = 0; k < 2; k++) {
        const chat_val *t = chat_val_get(m, thinking_keys[k]);
        if (t && t->type != CV_NONE && t->type != CV_STR)
            return g4_fail(err, G4_ERR_FORMAT, "messages[%zu].%s must be a string", idx,
                           thinking_keys[k]);
    }
    const chat_val *calls = chat_val_get(m, "tool_calls");
    if (chat_val_truthy(calls)) {
        if (calls->type != CV_LIST)
            return g4_fail(err, G4_ERR_FORMAT, "messages[%zu].tool_calls is not an array", idx);
        for (size_t k = 0; k < calls->n; k++) {
            const chat_val *fn = chat_val_get(calls->items[k], "function");
            if (!fn || fn->type != CV_DICT)
                return g4_fail(err, G4_ERR_FORMAT,
                               "messages[%zu].tool_calls[%zu] has no \"function\" object", idx, k);
            const chat_val *name = chat_val_get(fn, "name");
            if (!name || name->type != CV_STR)
                return g4_fail(err, G4_ERR_FORMAT,
                               "messages[%zu].tool_calls[%zu].function.name must be a string", idx,
                               k);
        }
    }
    const chat_val *resps = chat_val_get(m, "tool_responses");
    if (chat_val_truthy(resps)) {
        if (resps->type != CV_LIST)
            return g4_fail(err, G4_ERR_FORMAT, "messages[%zu].tool_responses is not an array", idx);
        for (size_t k = 0; k < resps->n; k++) {
            const chat_val *tr = resps->items[k];
            if (tr->type != CV_DICT)
                return g4_fail(err, G4_ERR_FORMAT,
                               "messages[%zu].tool_responses[%zu] is not an object", idx, k);
            const chat_val *name = chat_val_get(tr, "name");
            if (name && name->type != CV_STR)
                return g4_fail(err, G4_ERR_FORMAT,
                               "messages[%zu].tool_responses[%zu].name must be a string", idx, k);
        }
    }
    const chat_val *name = chat_val_get(m, "name");
    if (is_tool && name && name->type != CV_NONE && name->type != CV_STR)
        return g4_fail(err, G4_ERR_FORMAT, "messages[%zu].name must be a string", idx);
    return G4_OK;
}

g4_status chat_check_tools(const chat_val *tools, g4_error *err) {
    if (!tools || tools->type == CV_NONE) return G4_OK;
    if (tools->type != CV_LIST) return g4_fail(err, G4_ERR_FORMAT, "tools is not an array");
    for (size_t i = 0; i < tools->n; i++) {
        const chat_val *fn = chat_val_get(tools->items[i], "function");
        if (!fn || fn->type != CV_DICT)
            return g4_fail(err, G4_ERR_FORMAT, "tools[%zu] has no \"function\" object", i);
        const chat_val *name = chat_val_get(fn, "name");
        if (!name || name->type != CV_STR)
            return g4_fail(err, G4_ERR_FORMAT, "tools[%zu].function.name must be a string", i);
        const chat_val *props = chat_val_get(chat_val_get(fn, "parameters"), "properties");
        if (chat_val_truthy(props) && props->type != CV_DICT)
            return g4_fail(err, G4_ERR_FORMAT,
                           "tools[%zu].function.parameters.properties is not an object", i);
    }
    return G4_OK;
}

/* ---- template helpers -------------------------------------------------------------------- */

/* {{ v | upper }}: str(v).upper(), for ASCII letters (JSON schema type names are ASCII). */
static char *py_upper(const chat_val *v) {
    chat_sb t = {0};
    chat_py_str(&t, v);
    char *s;
    if (chat_sb_take(&t, &s, NULL, NULL)) return NULL;
    for (char *p = s; *p; p++)
        if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
    return s;
}

/* `for x in v` followed by {{ x }}: the items of v as strings (a list's elements, a dict's keys,
 * a string's characters; Undefined has none). Returns a CV_LIST of CV_STR in *out. */
static g4_status iter_strs(rctx *r, const chat_val *v, const char *what, chat_val **out) {
    chat_val *list = chat_val_new(CV_LIST);
    if (!list) return nomem(r);
    if (v && (v->type == CV_LIST || v->type == CV_DICT)) {
        for (size_t i = 0; i < v->n; i++) {
            chat_sb t = {0};
            if (v->type == CV_LIST) chat_py_str(&t, v->items[i]);
            else chat_sb_puts(&t, v->keys[i]);
            char *s;
            size_t n;
            if (chat_sb_take(&t, &s, &n, NULL) || chat_val_push(list, chat_val_str(s, n))) {
                free(s);
                chat_val_free(list);
                return nomem(r);
            }
            free(s);
        }
    } else if (v && v->type == CV_STR) {
        for (size_t i = 0; i < v->len;) {
            size_t l = 1;
            unsigned char c = (unsigned char)v->s[i];
            if (c >= 0xC0) l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (i + l > v->len) l = v->len - i;
            if (chat_val_push(list, chat_val_str(v->s + i, l))) {
                chat_val_free(list);
                return nomem(r);
            }
            i += l;
        }
    } else if (v) {
        chat_val_free(list);
        return g4_fail(r->err, G4_ERR_FORMAT, "%s is not an array", what);
    }
    *out = list;
    return G4_OK;
}

/* [<|"|>a<|"|>,<|"|>b<|"|>] from the strings of v (the template's `required` lists). */
static g4_status put_quoted_list(rctx *r, const chat_val *v, const char *what, int upper) {
    chat_val *items = NULL;
    g4_status st = iter_strs(r, v, what, &items);
    if (st) return st;
    chat_sb_putc(r->b, '[');
    for (size_t i = 0; i < items->n; i++) {
        if (i) chat_sb_putc(r->b, ',');
        chat_sb_puts(r->b, Q);
        if (upper) {
            char *u = py_upper(items->items[i]);
            if (!u) {
                chat_val_free(items);
                return nomem(r);
            }
            chat_sb_puts(r->b, u);
            free(u);
        } else chat_sb_put(r->b, items->items[i]->s, items->items[i]->len);
        chat_sb_puts(r->b, Q);
    }
    chat_sb_putc(r->b, ']');
    chat_val_free(items);
    return G4_OK;
}

/* The template's format_argument macro. */
static g4_status fmt_arg(rctx *r, const chat_val *v, int escape_keys) {
    chat_sb *b = r->b;
    if (v && v->type == CV_STR) {
        chat_sb_puts(b, Q);
        chat_sb_put(b, v->s, v->len);
        chat_sb_puts(b, Q);
    } else if (v && v->type == CV_BOOL) {
        chat_sb_puts(b, v->b ? "true" : "false");
    } else if (v && v->type == CV_DICT) {
        size_t *ord = chat_dictsort(v);
        if (!ord && v->n) return nomem(r);
        chat_sb_putc(b, '{');
        for (size_t i = 0; i < v->n; i++) {
            if (i) chat_sb_putc(b, ',');
            if (escape_keys) chat_sb_puts(b, Q);
            chat_sb_puts(b, v->keys[ord[i]]);
            if (escape_keys) chat_sb_puts(b, Q);
            chat_sb_putc(b, ':');
            g4_status st = fmt_arg(r, v->items[ord[i]], escape_keys);
            if (st) {
                free(ord);
                return st;
            }
        }
        chat_sb_putc(b, '}');
        free(ord);
    } else if (!v || v->type == CV_LIST) { /* Jinja counts Undefined as an (empty) sequence */
        chat_sb_putc(b, '[');
        for (size_t i = 0; v && i < v->n; i++) {
            if (i) chat_sb_putc(b, ',');
            g4_status st = fmt_arg(r, v->items[i], escape_keys);
            if (st) return st;
        }
        chat_sb_putc(b, ']');
    } else {
        chat_py_str(b, v);
    }
    return G4_OK;
}

/* `key:value,...` of a dict in dictsort order, bare keys (tool call arguments and responses). */
static g4_status put_bare_items(rctx *r, const chat_val *d) {
    size_t *ord = chat_dictsort(d);
    if (!ord && d->n) return nomem(r);
    for (size_t i = 0; i < d->n; i++) {
        if (i) chat_sb_putc(r->b, ',');
        chat_sb_puts(r->b, d->keys[ord[i]]);
        chat_sb_putc(r->b, ':');
        g4_status st = fmt_arg(r, d->items[ord[i]], 0);
        if (st) {
            free(ord);
            return st;
        }
    }
    free(ord);
    return G4_OK;
}

static void put_comma(rctx *r, int *add_comma) {
    if (*add_comma) chat_sb_putc(r->b, ',');
    else *add_comma = 1;
}

static g4_status fmt_params(rctx *r, const chat_val *props, int depth);

/* The `items:{...}` of an array property. */
static g4_status fmt_items(rctx *r, const chat_val *items, int depth) {
    size_t *ord = chat_dictsort(items);
    if (!ord) return nomem(r);
    g4_status st = G4_OK;
    int first = 1;
    chat_sb_puts(r->b, "items:{");
    for (size_t i = 0; i < items->n && !st; i++) {
        const char *key = items->keys[ord[i]];
        const chat_val *v = items->items[ord[i]];
        if (v->type == CV_NONE) continue;
        if (!first) chat_sb_putc(r->b, ',');
        first = 0;
        if (!strcmp(key, "properties")) {
            chat_sb_puts(r->b, "properties:{");
            if (v->type == CV_DICT) st = fmt_params(r, v, depth + 1);
            chat_sb_putc(r->b, '}');
        } else if (!strcmp(key, "required")) {
            chat_sb_puts(r->b, "required:");
            st = put_quoted_list(r, v, "items.required", 0);
        } else if (!strcmp(key, "type")) {
            chat_sb_puts(r->b, "type:");
            if (v->type == CV_STR) {
                char *u = py_upper(v);
                if (!u) st = nomem(r);
                else {
                    chat_sb_puts(r->b, Q);
                    chat_sb_puts(r->b, u);
                    chat_sb_puts(r->b, Q);
                    free(u);
                }
            } else st = put_quoted_list(r, v, "items.type", 1);
        } else {
            chat_sb_puts(r->b, key);
            chat_sb_putc(r->b, ':');
            st = fmt_arg(r, v, 1);
        }
    }
    chat_sb_putc(r->b, '}');
    free(ord);
    return st;
}

/* The template's format_parameters macro: one entry per property, keys sorted. */
static g4_status fmt_params(rctx *r, const chat_val *props, int depth) {
    static const char *const standard_keys[] = {"description", "type", "properties", "required",
                                                "nullable"};
    if (depth > 200) return g4_fail(r->err, G4_ERR_FORMAT, "tool parameters nest too deeply");
    size_t *ord = chat_dictsort(props);
    if (!ord && props->n) return nomem(r);
    g4_status st = G4_OK;
    int found_first = 0;
    for (size_t i = 0; i < props->n && !st; i++) {
        const char *key = props->keys[ord[i]];
        const chat_val *value = props->items[ord[i]];
        int standard = 0;
        for (int k = 0; k < 5; k++) standard |= !strcmp(key, standard_keys[k]);
        if (standard) continue;
        if (found_first) chat_sb_putc(r->b, ',');
        found_first = 1;
        chat_sb_puts(r->b, key);
        chat_sb_puts(r->b, ":{");
        int add_comma = 0;
        const chat_val *desc = chat_val_get(value, "description");
        if (chat_val_truthy(desc)) {
            chat_sb_puts(r->b, "description:" Q);
            chat_py_str(r->b, desc);
            chat_sb_puts(r->b, Q);
            add_comma = 1;
        }
        char *type = py_upper(chat_val_get(value, "type"));
        if (!type) {
            st = nomem(r);
            break;
        }
        if (!strcmp(type, "STRING")) {
            const chat_val *en = chat_val_get(value, "enum");
            if (chat_val_truthy(en)) {
                put_comma(r, &add_comma);
                chat_sb_puts(r->b, "enum:");
                st = fmt_arg(r, en, 1);
            }
        } else if (!strcmp(type, "ARRAY")) {
            const chat_val *items = chat_val_get(value, "items");
            if (items && items->type == CV_DICT && items->n) {
                put_comma(r, &add_comma);
                st = fmt_items(r, items, depth);
            }
        }
        if (!st && chat_val_truthy(chat_val_get(value, "nullable"))) {
            put_comma(r, &add_comma);
            chat_sb_puts(r->b, "nullable:true");
        }
        if (!st && !strcmp(type, "OBJECT")) {
            const chat_val *sub = chat_val_get(value, "properties");
            /* `is defined and is mapping`, else the property's own keys stand in as properties. */
            if (!(sub && sub->type == CV_DICT)) sub = value->type == CV_DICT ? value : NULL;
            if (sub) {
                put_comma(r, &add_comma);
                chat_sb_puts(r->b, "properties:{");
                st = fmt_params(r, sub, depth + 1);
                chat_sb_putc(r->b, '}');
            }
            const chat_val *req = chat_val_get(value, "required");
            if (!st && chat_val_truthy(req)) {
                put_comma(r, &add_comma);
                chat_sb_puts(r->b, "required:");
                st = put_quoted_list(r, req, "required", 0);
            }
        }
        put_comma(r, &add_comma);
        chat_sb_puts(r->b, "type:" Q);
        chat_sb_puts(r->b, type);
        chat_sb_puts(r->b, Q "}");
        free(type);
    }
    free(ord);
    return st;
}

/* The template's format_function_declaration macro (the caller trims it). */
static g4_status fmt_declaration(rctx *r, const chat_val *tool) {
    const chat_val *fn = chat_val_get(tool, "function");
    chat_sb_puts(r->b, "declaration:");
    chat_py_str(r->b, chat_val_get(fn, "name"));
    chat_sb_puts(r->b, "{description:" Q);
    chat_py_str(r->b, chat_val_get(fn, "description"));
    chat_sb_puts(r->b, Q);
    const chat_val *params = chat_val_get(fn, "parameters");
    g4_status st = G4_OK;
    if (chat_val_truthy(params)) {
        chat_sb_puts(r->b, ",parameters:{");
        const chat_val *props = chat_val_get(params, "properties");
        if (chat_val_truthy(props)) {
            chat_sb_puts(r->b, "properties:{");
            st = fmt_params(r, props, 0);
            chat_sb_puts(r->b, "},");
        }
        const chat_val *req = chat_val_get(params, "required");
        if (!st && chat_val_truthy(req)) {
            chat_sb_puts(r->b, "required:");
            st = put_quoted_list(r, req, "parameters.required", 0);
            chat_sb_putc(r->b, ',');
        }
        const chat_val *type = chat_val_get(params, "type");
        if (!st && chat_val_truthy(type)) {
            char *u = py_upper(type);
            if (!u) return nomem(r);
            /* The template closes parameters:{ only here, so a schema without a type leaves it
             * open; reproduced as is. */
            chat_sb_puts(r->b, "type:" Q);
            chat_sb_puts(r->b, u);
            chat_sb_puts(r->b, Q "}");
            free(u);
        }
    }
    if (st) return st;
    for (size_t i = 0; fn && i < fn->n; i++) {
        if (strcmp(fn->keys[i], "response")) continue;
        const chat_val *resp = fn->items[i];
        chat_sb_puts(r->b, ",response:{");
        const chat_val *desc = chat_val_get(resp, "description");
        if (chat_val_truthy(desc)) {
            chat_sb_puts(r->b, "description:" Q);
            chat_py_str(r->b, desc);
            chat_sb_puts(r->b, Q ",");
        }
        char *u = py_upper(chat_val_get(resp, "type"));
        if (!u) return nomem(r);
        if (!strcmp(u, "OBJECT")) chat_sb_puts(r->b, "type:" Q "OBJECT" Q "}");
        free(u);
    }
    chat_sb_putc(r->b, '}');
    return G4_OK;
}

/* The template's strip_thinking macro: drop every `<|channel>...<channel|>` span, then trim. */
static void put_stripped_thinking(chat_sb *b, const char *s, size_t n) {
    static const char open[] = "<|channel>", close[] = "<channel|>";
    chat_sb t = {0};
    size_t at = 0;
    for (;;) {
        const char *end = memmem(s + at, n - at, close, sizeof close - 1);
        size_t part_end = end ? (size_t)(end - s) : n;
        const char *o = memmem(s + at, part_end - at, open, sizeof open - 1);
        chat_sb_put(&t, s + at, (o ? (size_t)(o - s) : part_end) - at);
        if (!end) break;
        at = part_end + sizeof close - 1;
    }
    if (t.oom) b->oom = 1;
    size_t a, z;
    chat_py_strip(t.buf ? t.buf : "", t.len, &a, &z);
    chat_sb_put(b, t.buf + a, z - a);
    chat_sb_free(&t);
}

static void put_trimmed(chat_sb *b, const char *s, size_t n) {
    size_t a, z;
    chat_py_strip(s, n, &a, &z);
    chat_sb_put(b, s + a, z - a);
}

/* The template's format_tool_response_block macro. */
static g4_status fmt_tool_response(rctx *r, const char *name, const chat_val *resp) {
    chat_sb_puts(r->b, "<|tool_response>response:");
    chat_sb_puts(r->b, name);
    chat_sb_putc(r->b, '{');
    g4_status st;
    if (resp && resp->type == CV_DICT) st = put_bare_items(r, resp);
    else {
        chat_sb_puts(r->b, "value:");
        st = fmt_arg(r, resp, 0);
    }
    chat_sb_puts(r->b, "}<tool_response|>");
    return st;
}

/* Python ==, for matching tool_call_id against tool call ids (NULL and None both mean absent). */
static int py_eq(const chat_val *a, const chat_val *b) {
    int an = !a || a->type == CV_NONE, bn = !b || b->type == CV_NONE;
    if (an || bn) return an && bn;
    int anum = a->type == CV_INT || a->type == CV_FLOAT || a->type == CV_BOOL;
    int bnum = b->type == CV_INT || b->type == CV_FLOAT || b->type == CV_BOOL;
    if (anum && bnum) {
        if (a->type == CV_INT && b->type == CV_INT) return !strcmp(a->s, b->s);
        double x = a->type == CV_INT ? strtod(a->s, NULL) : a->type == CV_BOOL ? a->b : a->f;
        double y = b->type == CV_INT ? strtod(b->s, NULL) : b->type == CV_BOOL ? b->b : b->f;
        return x == y;
    }
    if (a->type != b->type) return 0;
    if (a->type == CV_STR) return a->len == b->len && !memcmp(a->s, b->s, a->len);
    if (a->n != b->n) return 0;
    for (size_t i = 0; i < a->n; i++) {
        const chat_val *bi = a->type == CV_DICT ? chat_val_get(b, a->keys[i]) : b->items[i];
        if (!bi || !py_eq(a->items[i], bi)) return 0;
    }
    return 1;
}

/* ---- the template's main body ------------------------------------------------------------ */

/* ns.prev_message_type: what the last rendered piece was; decides how a turn ends and whether
 * the generation prompt is added. */
typedef enum prev_type {
    PREV_NONE, PREV_THINK, PREV_TOOL, PREV_TOOL_CALL, PREV_TOOL_RESPONSE, PREV_MEDIA
} prev_type;

/* The tool messages right after an assistant message with tool calls, rendered as responses. */
static g4_status render_following_tools(rctx *r, const chat_val *msgs, size_t i,
                                        const chat_val *calls, int *flag, prev_type *prev) {
    static const chat_val none = {.type = CV_NONE};
    for (size_t k = i + 1; k < msgs->n && !strcmp(role_of(msgs->items[k]), "tool"); k++) {
        const chat_val *follow = msgs->items[k];
        const chat_val *name = chat_val_get(follow, "name");
        const chat_val *id = chat_val_get(follow, "tool_call_id");
        for (size_t c = 0; c < calls->n; c++)
            if (py_eq(chat_val_get(calls->items[c], "id"), id))
                name = chat_val_get(chat_val_get(calls->items[c], "function"), "name");
        if (!name || name->type != CV_STR)
            return g4_fail(r->err, G4_ERR_FORMAT,
                           "messages[%zu]: a tool message needs a \"name\" or a \"tool_call_id\" "
                           "matching a call of messages[%zu]", k, i);
        const chat_val *body = chat_val_get(follow, "content");
        g4_status st;
        if (body && body->type == CV_LIST) {
            /* Content parts: the text parts joined. */
            chat_sb t = {0};
            for (size_t p = 0; p < body->n; p++)
                if (chat_val_is_str(chat_val_get(body->items[p], "type"), "text")) {
                    const chat_val *text = chat_val_get(body->items[p], "text");
                    chat_sb_put(&t, text->s, text->len);
                }
            chat_val *joined = t.oom ? NULL : chat_val_str(t.buf ? t.buf : "", t.len);
            chat_sb_free(&t);
            if (!joined) return nomem(r);
            st = fmt_tool_response(r, name->s, joined);
            chat_val_free(joined);
        } else st = fmt_tool_response(r, name->s, body ? body : &none);
        if (st) return st;
        *flag = 1;
        *prev = PREV_TOOL_RESPONSE;
    }
    return G4_OK;
}

static g4_status render_message(rctx *r, const chat_val *msgs, size_t first, size_t i,
                                long last_user, prev_type *prev) {
    const chat_val *m = msgs->items[i];
    const char *role = role_of(m);
    int is_model = !strcmp(role, "assistant");
    *prev = PREV_NONE;

    /* An assistant message right after another (tool messages aside) continues its turn. */
    const char *prev_role = NULL;
    for (size_t j = i; j-- > first;)
        if (strcmp(role_of(msgs->items[j]), "tool")) {
            prev_role = role_of(msgs->items[j]);
            break;
        }
    if (!(is_model && prev_role && !strcmp(prev_role, "assistant"))) {
        chat_sb_puts(r->b, "<|turn>");
        chat_sb_puts(r->b, is_model ? "model" : role);
        chat_sb_putc(r->b, '\n');
    }

    const chat_val *calls = chat_val_get(m, "tool_calls");
    const chat_val *thinking = chat_val_get(m, "reasoning");
    if (!chat_val_truthy(thinking)) thinking = chat_val_get(m, "reasoning_content");
    if (chat_val_truthy(thinking) && (long)(i - first) > last_user && chat_val_truthy(calls)) {
        chat_sb_puts(r->b, "<|channel>thought\n");
        chat_sb_put(r->b, thinking->s, thinking->len);
        chat_sb_puts(r->b, "\n<channel|>");
    }

    if (chat_val_truthy(calls)) {
        for (size_t c = 0; c < calls->n; c++) {
            const chat_val *fn = chat_val_get(calls->items[c], "function");
            const chat_val *args = chat_val_get(fn, "arguments");
            chat_sb_puts(r->b, "<|tool_call>call:");
            chat_py_str(r->b, chat_val_get(fn, "name"));
            chat_sb_putc(r->b, '{');
            if (args && args->type == CV_DICT) {
                g4_status st = put_bare_items(r, args);
                if (st) return st;
            } else if (args && args->type == CV_STR) {
                chat_sb_put(r->b, args->s, args->len); /* pre-formatted arguments go in verbatim */
            }
            chat_sb_puts(r->b, "}<tool_call|>");
        }
        *prev = PREV_TOOL_CALL;
    }

    int responded = 0;
    const chat_val *resps = chat_val_get(m, "tool_responses");
    if (chat_val_truthy(resps)) {
        /* Legacy Gemma form: results embedded in the assistant message. */
        for (size_t k = 0; k < resps->n; k++) {
            const chat_val *name = chat_val_get(resps->items[k], "name");
            g4_status st = fmt_tool_response(r, name ? name->s : "unknown",
                                             chat_val_get(resps->items[k], "response"));
            if (st) return st;
            responded = 1;
            *prev = PREV_TOOL_RESPONSE;
        }
    } else if (chat_val_truthy(calls)) {
        g4_status st = render_following_tools(r, msgs, i, calls, &responded, prev);
        if (st) return st;
    }

    const chat_val *content = chat_val_get(m, "content");
    if (content && content->type == CV_STR) {
        if (is_model) put_stripped_thinking(r->b, content->s, content->len);
        else put_trimmed(r->b, content->s, content->len);
    } else if (content && content->type == CV_LIST) {
        for (size_t k = 0; k < content->n; k++) {
            const chat_val *item = content->items[k];
            const chat_val *type = chat_val_get(item, "type");
            if (chat_val_is_str(type, "text")) {
                const chat_val *text = chat_val_get(item, "text");
                if (is_model) put_stripped_thinking(r->b, text->s, text->len);
                else put_trimmed(r->b, text->s, text->len);
            } else if (chat_val_is_str(type, "image")) {
                chat_sb_puts(r->b, "<|image|>");
                *prev = PREV_MEDIA;
            } else if (chat_val_is_str(type, "audio")) {
                chat_sb_puts(r->b, "<|audio|>");
                *prev = PREV_MEDIA;
            } else if (chat_val_is_str(type, "video")) {
                chat_sb_puts(r->b, "<|video|>");
                *prev = PREV_MEDIA;
            }
        }
    }

    if (*prev == PREV_TOOL_CALL && !responded) chat_sb_puts(r->b, "<|tool_response>");
    else if (!(responded && !chat_val_truthy(content))) chat_sb_puts(r->b, "<turn|>\n");
    return G4_OK;
}

g4_status chat_render(const chat_val *msgs, const chat_val *tools, int thinking,
                      int generation_prompt, char **out, size_t *out_len, g4_error *err) {
    *out = NULL;
    if (!msgs || msgs->type != CV_LIST)
        return g4_fail(err, G4_ERR_FORMAT, "messages is not an array");
    /* The template reads messages[0] unconditionally. */
    if (!msgs->n) return g4_fail(err, G4_ERR_FORMAT, "the conversation has no messages");
    for (size_t i = 0; i < msgs->n; i++) {
        g4_status st = chat_check_message(msgs->items[i], i, i == 0, err);
        if (st) return st;
    }
    g4_status st = chat_check_tools(tools, err);
    if (st) return st;

    chat_sb b = {0};
    rctx r = {&b, err};
    prev_type prev = PREV_NONE;
    chat_sb_puts(&b, "<bos>");

    size_t first = 0;
    const char *role0 = msgs->n ? role_of(msgs->items[0]) : "";
    int leading_system = !strcmp(role0, "system") || !strcmp(role0, "developer");
    int has_tools = chat_val_truthy(tools);
    if (thinking || has_tools || leading_system) {
        chat_sb_puts(&b, "<|turn>system\n");
        if (thinking) {
            chat_sb_puts(&b, "<|think|>\n");
            prev = PREV_THINK;
        }
        if (leading_system) {
            const chat_val *c = chat_val_get(msgs->items[0], "content");
            if (c) put_trimmed(&b, c->s, c->len);
            first = 1;
        }
        for (size_t t = 0; has_tools && t < tools->n && !st; t++) {
            chat_sb decl = {0};
            rctx dr = {&decl, err};
            st = fmt_declaration(&dr, tools->items[t]);
            if (decl.oom) b.oom = 1;
            chat_sb_puts(&b, "<|tool>");
            put_trimmed(&b, decl.buf ? decl.buf : "", decl.len);
            chat_sb_puts(&b, "<tool|>");
            chat_sb_free(&decl);
            prev = PREV_TOOL;
        }
        chat_sb_puts(&b, "<turn|>\n");
    }

    /* The reasoning guard looks for the last user message among the loop's messages. */
    long last_user = -1;
    for (size_t i = first; i < msgs->n; i++)
        if (!strcmp(role_of(msgs->items[i]), "user")) last_user = (long)(i - first);

    for (size_t i = first; i < msgs->n && !st; i++)
        if (strcmp(role_of(msgs->items[i]), "tool"))
            st = render_message(&r, msgs, first, i, last_user, &prev);
    if (st) {
        chat_sb_free(&b);
        return st;
    }

    if (generation_prompt && prev != PREV_TOOL_RESPONSE && prev != PREV_TOOL_CALL) {
        chat_sb_puts(&b, "<|turn>model\n");
        if (!thinking) chat_sb_puts(&b, "<|channel>thought\n<channel|>");
    }
    return chat_sb_take(&b, out, out_len, err);
}
