/* A read-only memory map of a whole file. Weights stay in the page cache; nothing is copied. */
#ifndef G4_UTIL_MAPPED_FILE_H
#define G4_UTIL_MAPPED_FILE_H
#include <stddef.h>
#include <stdint.h>
#include "g4.h"

typedef struct g4_mapped_file {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
} g4_mapped_file;

g4_status g4_mapped_file_open(g4_mapped_file *f, const char *path, g4_error *err);
void g4_mapped_file_close(g4_mapped_file *f);

/* Reads a whole (small) file into a NUL-terminated heap buffer. */
g4_status g4_read_file(const char *path, char **out, size_t *len, g4_error *err);
#endif
