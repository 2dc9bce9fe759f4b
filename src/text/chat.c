/* Conversations: built from JSON or message by message, rendered by chat_render.c.
 *
 * The programmatic calls build exactly the JSON-shaped values a JSON conversation would hold, so
 * both paths go through one renderer and cannot drift apart. */
#include <stdlib.h>
#include <string.h>

#include "text/chat_internal.h"
#include "util/error.h"

static const char *const role_names[] = {"system", "developer", "user", "assistant", "tool"};

static g4_status oom(g4_error *err) {
    return g4_fail(err, G4_ERR_NOMEM, "out of memory building the conversation");
}

g4_status g4_chat_new(g4_chat **out, g4_error *err) {
    if (!out) return g4_fail(err, G4_ERR_ARG, "g4_chat_new: out is NULL");
    g4_chat *c = calloc(1, sizeof *c);
    if (c) c->messages = chat_val_new(CV_LIST);
    if (!c || !c->messages) {
        free(c);
        return oom(err);
    }
    c->generation_prompt = 1;
    *out = c;
    return G4_OK;
}

void g4_chat_free(g4_chat *c) {
    if (!c) return;
    chat_val_free(c->messages);
    chat_val_free(c->tools);
    free(c);
}

/* A boolean option: absent or null keeps the default. */
static g4_status get_flag(const chat_val *v, const char *name, int *flag, g4_error *err) {
    if (!v || v->type == CV_NONE) return G4_OK;
    if (v->type != CV_BOOL) return g4_fail(err, G4_ERR_FORMAT, "%s must be true or false", name);
    *flag = v->b;
    return G4_OK;
}

g4_status g4_chat_from_json(const char *json, g4_chat **out, g4_error *err) {
    if (!out) return g4_fail(err, G4_ERR_ARG, "g4_chat_from_json: out is NULL");
    *out = NULL;
    chat_val *doc;
    g4_status st = chat_val_parse(json, "conversation", &doc, err);
    if (st) return st;
    g4_chat *c = NULL;
    if (doc->type != CV_DICT) {
        st = g4_fail(err, G4_ERR_FORMAT, "conversation: the JSON is not an object");
        goto done;
    }
    const chat_val *msgs = chat_val_get(doc, "messages");
    if (!msgs || msgs->type != CV_LIST) {
        st = g4_fail(err, G4_ERR_FORMAT, "conversation: \"messages\" is missing or not an array");
        goto done;
    }
    const chat_val *opts = chat_val_get(doc, "options");
    if (opts && opts->type != CV_DICT && opts->type != CV_NONE) {
        st = g4_fail(err, G4_ERR_FORMAT, "conversation: \"options\" is not an object");
        goto done;
    }
    static const char *const known[] = {"enable_thinking", "add_generation_prompt", "tools"};
    for (size_t i = 0; opts && i < opts->n; i++) {
        int k = 0;
        while (k < 3 && strcmp(opts->keys[i], known[k])) k++;
        if (k == 3) {
            st = g4_fail(err, G4_ERR_FORMAT,
                         "options.%s: unknown option (known: enable_thinking, "
                         "add_generation_prompt, tools)", opts->keys[i]);
            goto done;
        }
    }
    if ((st = g4_chat_new(&c, err))) goto done;
    /* Options given in both places: "options" wins, as the more specific. */
    const chat_val *tools = chat_val_get(opts, "tools");
    if (!tools) tools = chat_val_get(doc, "tools");
    if ((st = get_flag(chat_val_get(doc, "enable_thinking"), "enable_thinking", &c->thinking,
                       err)) ||
        (st = get_flag(chat_val_get(opts, "enable_thinking"), "options.enable_thinking",
                       &c->thinking, err)) ||
        (st = get_flag(chat_val_get(doc, "add_generation_prompt"), "add_generation_prompt",
                       &c->generation_prompt, err)) ||
        (st = get_flag(chat_val_get(opts, "add_generation_prompt"),
                       "options.add_generation_prompt", &c->generation_prompt, err)) ||
        (st = chat_check_tools(tools, err)))
        goto done;
    for (size_t i = 0; i < msgs->n; i++)
        if ((st = chat_check_message(msgs->items[i], i, i == 0, err))) goto done;
    chat_val_free(c->messages);
    c->messages = chat_val_clone(msgs);
    if (tools && tools->type != CV_NONE) {
        c->tools = chat_val_clone(tools);
        if (!c->tools) st = oom(err);
    }
    if (!c->messages) st = oom(err);
done:
    chat_val_free(doc);
    if (st) g4_chat_free(c);
    else *out = c;
    return st;
}

g4_status g4_chat_render_json(const char *json, char **out, size_t *out_len, g4_error *err) {
    if (!out) return g4_fail(err, G4_ERR_ARG, "g4_chat_render_json: out is NULL");
    *out = NULL;
    g4_chat *c;
    g4_status st = g4_chat_from_json(json, &c, err);
    if (st) return st;
    st = g4_chat_render(c, out, out_len, err);
    g4_chat_free(c);
    return st;
}

void g4_chat_set_thinking(g4_chat *c, int on) { c->thinking = on != 0; }
void g4_chat_set_generation_prompt(g4_chat *c, int on) { c->generation_prompt = on != 0; }

g4_status g4_chat_set_tools_json(g4_chat *c, const char *tools_json, g4_error *err) {
    chat_val *tools = NULL;
    if (tools_json) {
        g4_status st = chat_val_parse(tools_json, "tools", &tools, err);
        if (st) return st;
        if ((st = chat_check_tools(tools, err))) {
            chat_val_free(tools);
            return st;
        }
    }
    chat_val_free(c->tools);
    c->tools = tools;
    return G4_OK;
}

static chat_val *new_message(const char *role, const char *content) {
    chat_val *m = chat_val_new(CV_DICT);
    if (!m) return NULL;
    if (chat_val_set(m, "role", chat_val_strz(role)) ||
        (content && chat_val_set(m, "content", chat_val_strz(content)))) {
        chat_val_free(m);
        return NULL;
    }
    return m;
}

static int is_role(const chat_val *m, const char *role) {
    return chat_val_is_str(chat_val_get(m, "role"), role);
}

g4_status g4_chat_set_system(g4_chat *c, const char *text, g4_error *err) {
    chat_val *msgs = c->messages;
    int has = msgs->n && is_role(msgs->items[0], "system");
    if (!text) {
        if (has) chat_val_remove(msgs, 0);
        return G4_OK;
    }
    if (has) return chat_val_set(msgs->items[0], "content", chat_val_strz(text)) ? oom(err) : G4_OK;
    return chat_val_insert(msgs, 0, new_message("system", text)) ? oom(err) : G4_OK;
}

g4_status g4_chat_add_message(g4_chat *c, g4_chat_role role, const char *content, g4_error *err) {
    if ((unsigned)role > G4_ROLE_TOOL)
        return g4_fail(err, G4_ERR_ARG, "g4_chat_add_message: unknown role %d", (int)role);
    chat_val *m = new_message(role_names[role], content);
    if (!m) return oom(err);
    return chat_val_push(c->messages, m) ? oom(err) : G4_OK;
}

g4_status g4_chat_add_message_json(g4_chat *c, const char *message_json, g4_error *err) {
    chat_val *m;
    g4_status st = chat_val_parse(message_json, "message", &m, err);
    if (st) return st;
    size_t idx = c->messages->n;
    if ((st = chat_check_message(m, idx, idx == 0, err))) {
        chat_val_free(m);
        return st;
    }
    return chat_val_push(c->messages, m) ? oom(err) : G4_OK;
}

static g4_status last_assistant(g4_chat *c, const char *what, chat_val **out, g4_error *err) {
    chat_val *msgs = c->messages;
    if (!msgs->n || !is_role(msgs->items[msgs->n - 1], "assistant"))
        return g4_fail(err, G4_ERR_ARG, "%s: the last message is not an assistant message", what);
    *out = msgs->items[msgs->n - 1];
    return G4_OK;
}

g4_status g4_chat_set_reasoning(g4_chat *c, const char *text, g4_error *err) {
    chat_val *m;
    g4_status st = last_assistant(c, "g4_chat_set_reasoning", &m, err);
    if (st) return st;
    chat_val *v = text ? chat_val_strz(text) : chat_val_new(CV_NONE);
    return chat_val_set(m, "reasoning", v) ? oom(err) : G4_OK;
}

g4_status g4_chat_add_tool_call(g4_chat *c, const char *name, const char *arguments_json,
                                const char *id, g4_error *err) {
    chat_val *m;
    g4_status st = last_assistant(c, "g4_chat_add_tool_call", &m, err);
    if (st) return st;
    if (!name) return g4_fail(err, G4_ERR_ARG, "g4_chat_add_tool_call: no function name");
    chat_val *args;
    if ((st = chat_val_parse(arguments_json ? arguments_json : "{}", "tool call arguments", &args,
                             err)))
        return st;
    if (args->type != CV_DICT) {
        chat_val_free(args);
        return g4_fail(err, G4_ERR_FORMAT, "tool call arguments: not a JSON object");
    }
    /* Each chat_val_set consumes its value even when it fails, so build inside-out. */
    chat_val *fn = chat_val_new(CV_DICT);
    if (!fn) {
        chat_val_free(args);
        return oom(err);
    }
    if (chat_val_set(fn, "arguments", args) || chat_val_set(fn, "name", chat_val_strz(name))) {
        chat_val_free(fn);
        return oom(err);
    }
    chat_val *call = chat_val_new(CV_DICT);
    if (!call) {
        chat_val_free(fn);
        return oom(err);
    }
    if (chat_val_set(call, "function", fn) ||
        chat_val_set(call, "type", chat_val_strz("function")) ||
        (id && chat_val_set(call, "id", chat_val_strz(id)))) {
        chat_val_free(call);
        return oom(err);
    }
    const chat_val *calls = chat_val_get(m, "tool_calls");
    if (!calls || calls->type != CV_LIST) {
        if (chat_val_set(m, "tool_calls", chat_val_new(CV_LIST))) {
            chat_val_free(call);
            return oom(err);
        }
        calls = chat_val_get(m, "tool_calls");
    }
    return chat_val_push((chat_val *)calls, call) ? oom(err) : G4_OK;
}

g4_status g4_chat_add_tool_response(g4_chat *c, const char *name, const char *content,
                                    const char *tool_call_id, g4_error *err) {
    if (!name && !tool_call_id)
        return g4_fail(err, G4_ERR_ARG,
                       "g4_chat_add_tool_response: needs a name or a tool_call_id");
    if (!content) return g4_fail(err, G4_ERR_ARG, "g4_chat_add_tool_response: no content");
    chat_val *m = new_message("tool", NULL);
    if (!m || (name && chat_val_set(m, "name", chat_val_strz(name))) ||
        (tool_call_id && chat_val_set(m, "tool_call_id", chat_val_strz(tool_call_id))) ||
        chat_val_set(m, "content", chat_val_strz(content))) {
        chat_val_free(m);
        return oom(err);
    }
    return chat_val_push(c->messages, m) ? oom(err) : G4_OK;
}

size_t g4_chat_count(const g4_chat *c) { return c->messages->n; }

void g4_chat_truncate(g4_chat *c, size_t n) {
    while (c->messages->n > n) chat_val_remove(c->messages, c->messages->n - 1);
}

g4_status g4_chat_render(const g4_chat *c, char **out, size_t *out_len, g4_error *err) {
    if (!c || !out) return g4_fail(err, G4_ERR_ARG, "g4_chat_render: NULL argument");
    return chat_render(c->messages, c->tools, c->thinking, c->generation_prompt, out, out_len, err);
}
