/* Shared between the chat renderer (chat_render.c) and the conversation API (chat.c). */
#ifndef G4_TEXT_CHAT_INTERNAL_H
#define G4_TEXT_CHAT_INTERNAL_H
#include "g4_chat.h"
#include "text/chat_value.h"

struct g4_chat {
    chat_val *messages; /* CV_LIST of message dicts, in the JSON shape */
    chat_val *tools;    /* CV_LIST of tool dicts, or NULL */
    int thinking;
    int generation_prompt;
};

/* Checks one message's shape: what the renderer needs present and typed. idx is its index in
 * the conversation (for messages), first says whether it opens the conversation (a leading
 * system message's content must be a string). */
g4_status chat_check_message(const chat_val *m, size_t idx, int first, g4_error *err);
/* Checks the tool declarations (a list of {"function": {"name": string, ...}}). */
g4_status chat_check_tools(const chat_val *tools, g4_error *err);

/* The official template over a conversation. tools may be NULL. */
g4_status chat_render(const chat_val *messages, const chat_val *tools, int thinking,
                      int generation_prompt, char **out, size_t *out_len, g4_error *err);
#endif
