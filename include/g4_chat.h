/* g4 chat: the Gemma 4 chat format.
 *
 * Two halves:
 *  - a renderer that turns a conversation into the prompt text the official chat template
 *    (chat_template.jinja) produces, byte for byte, without a Jinja engine. A conversation comes
 *    either as JSON (the shape of fixtures/chat/cases.jsonl and of OpenAI-style requests) or is
 *    built message by message through g4_chat_*;
 *  - a streaming parser of what the model generates for its turn: thinking, answer text and tool
 *    calls (converted to real JSON), fed chunk by chunk as tokens are decoded.
 *
 * Every fallible call returns a g4_status and, given a g4_error, a message naming the message
 * index and field at fault. Strings returned through char ** are heap-allocated; free() them.
 */
#ifndef G4_CHAT_H
#define G4_CHAT_H

#include <stddef.h>

#include "g4.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Rendering --------------------------------------------------------------------------- */

/* Renders a conversation given as JSON:
 *   {"messages": [...], "tools": [...], "options": {"enable_thinking": bool,
 *    "add_generation_prompt": bool, "tools": [...]}}
 * tools, enable_thinking and add_generation_prompt may sit at the top level or in options
 * (options wins). Defaults: no tools, thinking off, add_generation_prompt on. Other top-level keys
 * are ignored; unknown keys in options are an error.
 * Messages: {"role": "system"|"developer"|"user"|"assistant"|"tool", "content": string or
 * [{"type": "text", "text": ...}, {"type": "image"|"audio"|"video"}, ...], "tool_calls":
 * [{"id"?, "function": {"name", "arguments": object or string}}], "reasoning" or
 * "reasoning_content": string, "name" / "tool_call_id" (tool messages), "tool_responses":
 * [{"name", "response"}] (legacy Gemma form)}.
 * The output equals what jinja2 renders from the official template, byte for byte, including its
 * quirks (Python number formatting, case-insensitive key order, a pre-formatted string of
 * arguments inserted verbatim). Where the template would fail or print a Python repr of a
 * misplaced value, this fails instead with G4_ERR_FORMAT and a message naming the field: no
 * messages, an unknown or missing role, a leading system message whose content is not a string,
 * other content that is neither a string, null nor an array of part objects, a text part without
 * a string "text", a tool message whose name cannot be resolved, malformed tool declarations.
 * *out receives the prompt text (NUL-terminated, caller frees); *out_len its length (may be
 * NULL). */
g4_status g4_chat_render_json(const char *json, char **out, size_t *out_len, g4_error *err);

/* A conversation built in code (what `g4 chat` keeps between turns). */
typedef struct g4_chat g4_chat;

typedef enum g4_chat_role {
    G4_ROLE_SYSTEM,
    G4_ROLE_DEVELOPER,
    G4_ROLE_USER,
    G4_ROLE_ASSISTANT,
    G4_ROLE_TOOL,
} g4_chat_role;

g4_status g4_chat_new(g4_chat **out, g4_error *err);
/* A conversation from the JSON described at g4_chat_render_json. */
g4_status g4_chat_from_json(const char *json, g4_chat **out, g4_error *err);
void g4_chat_free(g4_chat *c);

/* Sets the leading system message (inserting it, or replacing its content); NULL removes it. */
g4_status g4_chat_set_system(g4_chat *c, const char *text, g4_error *err);
/* Thinking on adds <|think|> to the system turn; off (the default) makes the generation prompt
 * end with the empty thought channel. */
void g4_chat_set_thinking(g4_chat *c, int on);
/* Whether the rendering ends with the opening of a model turn (default on). */
void g4_chat_set_generation_prompt(g4_chat *c, int on);
/* Tool declarations: a JSON array of {"type": "function", "function": {"name", "description",
 * "parameters": JSON schema}}. NULL removes them. */
g4_status g4_chat_set_tools_json(g4_chat *c, const char *tools_json, g4_error *err);

/* Appends a message with string content (for G4_ROLE_TOOL, prefer g4_chat_add_tool_response). */
g4_status g4_chat_add_message(g4_chat *c, g4_chat_role role, const char *content, g4_error *err);
/* Appends one message given as a JSON object (any shape g4_chat_render_json accepts). */
g4_status g4_chat_add_message_json(g4_chat *c, const char *message_json, g4_error *err);
/* Sets the reasoning (thinking) text of the last message, which must be an assistant message.
 * The template renders it only for assistant messages with tool calls after the last user turn. */
g4_status g4_chat_set_reasoning(g4_chat *c, const char *text, g4_error *err);
/* Adds a tool call to the last message, which must be an assistant message. arguments_json: a
 * JSON object (NULL: {}); id may be NULL. */
g4_status g4_chat_add_tool_call(g4_chat *c, const char *name, const char *arguments_json,
                                const char *id, g4_error *err);
/* Appends a tool message carrying a function's result (content is sent as a string, verbatim).
 * name and tool_call_id may each be NULL but not both. */
g4_status g4_chat_add_tool_response(g4_chat *c, const char *name, const char *content,
                                    const char *tool_call_id, g4_error *err);

/* Messages so far, the system message included. */
size_t g4_chat_count(const g4_chat *c);
/* Drops every message after the first n (to undo or regenerate a turn). */
void g4_chat_truncate(g4_chat *c, size_t n);

/* Renders the conversation as the official template does. */
g4_status g4_chat_render(const g4_chat *c, char **out, size_t *out_len, g4_error *err);

/* ---- Parsing model output ---------------------------------------------------------------- */

/* A model turn looks like
 *   [<|channel>thought\n THINKING <channel|>] ANSWER [<|tool_call>call:NAME{ARGS}<tool_call|>]...
 * ending with <turn|> (turn over) or <|tool_response> (the model waits for tool results). The
 * parser splits it while it streams in: text is passed on as soon as it cannot be the start of a
 * marker (or of a UTF-8 character, so deltas are whole characters); a tool call is passed on once
 * complete. <tool_call|>, <turn|>, <eos> and <|tool_response> end a call even inside a <|"|>
 * string: they are single special tokens, which a model does not emit as string content. A stray
 * <channel|> in the answer is dropped. The result never depends on how the input was chunked. */
typedef struct g4_chat_parser g4_chat_parser;

typedef struct g4_chat_tool_call {
    char *name;      /* NULL if the call is too malformed to have one */
    char *arguments; /* the arguments as a JSON object's text; NULL when error is set */
    char *raw;       /* the text between <|tool_call> and <tool_call|>, as generated */
    char *error;     /* NULL, or what is wrong with the call's text */
} g4_chat_tool_call;

typedef enum g4_chat_stop {
    G4_CHAT_STOP_NONE = 0,      /* no end marker yet (or the stream ended without one) */
    G4_CHAT_STOP_TURN,          /* <turn|>: the model's turn is over */
    G4_CHAT_STOP_TOOL_RESPONSE, /* <|tool_response>: the model waits for tool results */
    G4_CHAT_STOP_EOS,           /* <eos> */
} g4_chat_stop;

typedef enum g4_chat_event_type {
    G4_CHAT_EV_THINKING, /* text/len: more thinking text */
    G4_CHAT_EV_CONTENT,  /* text/len: more answer text */
    G4_CHAT_EV_TOOL_CALL,/* tool_call: a complete (possibly malformed: check error) call */
    G4_CHAT_EV_DONE,     /* stop: an end marker was seen; later input is ignored */
} g4_chat_event_type;

typedef struct g4_chat_event {
    g4_chat_event_type type;
    const char *text; /* not NUL-terminated; valid during the callback only */
    size_t len;
    const g4_chat_tool_call *tool_call;
    g4_chat_stop stop;
} g4_chat_event;

typedef void (*g4_chat_event_fn)(void *user, const g4_chat_event *ev);

/* fn may be NULL: the parser still collects everything for the accessors below. */
g4_status g4_chat_parser_new(g4_chat_event_fn fn, void *user, g4_chat_parser **out,
                             g4_error *err);
void g4_chat_parser_free(g4_chat_parser *p);
/* Feeds generated text (any split, even inside a marker or a UTF-8 sequence). Malformed tool
 * calls do not fail the call (they are flagged on the tool call); only G4_ERR_NOMEM does. */
g4_status g4_chat_parser_feed(g4_chat_parser *p, const char *text, size_t len, g4_error *err);
/* The stream is over: text held back as a possible marker start is released as text, and a tool
 * call still open is reported as malformed. */
g4_status g4_chat_parser_finish(g4_chat_parser *p, g4_error *err);
/* Whether an end marker was seen (generation can stop). */
g4_chat_stop g4_chat_parser_stop(const g4_chat_parser *p);

/* Everything so far. Strings are NUL-terminated, owned by the parser, valid until the next feed.
 * The thinking text excludes the channel name line ("thought\n"); neither it nor the answer is
 * trimmed. */
const char *g4_chat_parser_thinking(const g4_chat_parser *p, size_t *len);
const char *g4_chat_parser_content(const g4_chat_parser *p, size_t *len);
size_t g4_chat_parser_n_tool_calls(const g4_chat_parser *p);
const g4_chat_tool_call *g4_chat_parser_tool_call(const g4_chat_parser *p, size_t i);

#ifdef __cplusplus
}
#endif
#endif
