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

/* A zero-filled, writable anonymous mapping of `bytes`, starting on a 2 MB boundary with huge
 * pages asked for (where the kernel gives them): for memory the decode streams every token (the
 * repacked weights, the KV cache, the bandwidth probe's buffer), where 4 KB pages cost a TLB walk
 * per page and stop the hardware prefetcher's streams at every page boundary. NULL when out of
 * memory; release with g4_unmap_anon(p, bytes). */
void *g4_map_anon_huge(size_t bytes);
void g4_unmap_anon(void *p, size_t bytes);

/* Reads a whole (small) file into a NUL-terminated heap buffer. */
g4_status g4_read_file(const char *path, char **out, size_t *len, g4_error *err);
#endif
