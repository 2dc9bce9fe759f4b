/* Errors are values: a status plus a message naming what is wrong, written into a caller-owned
 * g4_error. Nothing here prints. */
#ifndef G4_UTIL_ERROR_H
#define G4_UTIL_ERROR_H
#include "g4.h"

/* Sets err (when not NULL) and returns code, so callers can `return g4_fail(err, ...)`. */
g4_status g4_fail(g4_error *err, g4_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " to an error already set (for adding the file or tensor name). */
g4_status g4_fail_prefix(g4_error *err, g4_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#endif
