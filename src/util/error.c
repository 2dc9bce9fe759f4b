#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *g4_status_name(g4_status s) {
    switch (s) {
    case G4_OK: return "ok";
    case G4_ERR_IO: return "I/O error";
    case G4_ERR_FORMAT: return "malformed file";
    case G4_ERR_CONFIG: return "bad config";
    case G4_ERR_TENSOR: return "bad tensor";
    case G4_ERR_UNSUPPORTED: return "unsupported";
    case G4_ERR_NOMEM: return "out of memory";
    case G4_ERR_ARG: return "invalid argument";
    case G4_ERR_CONTEXT_FULL: return "context full";
    }
    return "unknown status";
}

g4_status g4_fail(g4_error *err, g4_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

g4_status g4_fail_prefix(g4_error *err, g4_status code, const char *fmt, ...) {
    if (err) {
        char old[sizeof err->message];
        memcpy(old, err->message, sizeof old);
        old[sizeof old - 1] = 0;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        size_t at = n < 0 ? 0 : (size_t)n;
        if (at + 2 < sizeof err->message) {
            memcpy(err->message + at, ": ", 2);
            at += 2;
            size_t room = sizeof err->message - 1 - at, len = strlen(old);
            if (len > room) len = room;
            memcpy(err->message + at, old, len);
            err->message[at + len] = 0;
        }
        err->code = code;
    }
    return code;
}
