/* The native pack (`model.g4p`): one file holding a model (or a drafter) exactly as the CPU
 * kernels consume it, memory-mapped at load with nothing converted or copied.
 *
 * Layout (integers and tensor bytes in the writer's byte order, little-endian on every machine
 * g4 targets; the byte-order field lets a reader of the other order refuse the file instead of
 * misreading it):
 *
 *   0   char  magic[8]       "G4PACK\0\0"
 *   8   u32   version        1
 *   12  u32   byte_order     0x01020304 as the writer's CPU stores it
 *   16  u64   manifest_offset  64
 *   24  u64   manifest_size    bytes of UTF-8 JSON (no terminator)
 *   32  u64   data_offset      a multiple of 4096, at or after the manifest's end
 *   40  u64   data_size        data_offset + data_size is the file size (a truncated file fails)
 *   48  u64   reserved[2]      0
 *   64  manifest, zero padding up to data_offset, then the data section.
 *
 * The manifest (a JSON object):
 *   "g4_pack": 1, "kind": "model" | "drafter", "source": the path it was packed from (info only),
 *   "config": the config.json text the engine parses (the original file's text when there was one),
 *   "blobs": {"tokenizer.json": [offset, size], ...}  files carried along,
 *   "int_tensors": [{"name", "dtype": "I32", "shape": [n], "data": [offset, size]}]  index tables
 *       such as the drafter's token ordering,
 *   "tensors": [{"name", "shape": [..], "float_dtype", "wtype", "rows", "cols", "row_bytes",
 *       "bits", "group", "scale_dtype", "scale_stride", "in_act_scale", "out_act_scale",
 *       "data": [offset, size], "scales": [offset, size], "biases": [offset, size]}]
 *       one entry per tensor the binder reads, in the fields of struct g4_mat (cpu/kernels.h;
 *       byte layouts per wtype in cpu/quant.h); "scales"/"biases" only where the matrix has them.
 * Offsets are relative to data_offset. Every part starts on a 64-byte boundary (4096 for parts of
 * 64 KiB and more, so large tables start on a page), parts never overlap, and each part's size is
 * what its g4_mat fields imply (data: rows·row_bytes; scales and biases: rows·scale_stride·size of
 * scale_dtype). Names are the binder's (relative to the text model for targets, full names for
 * drafters); wtypes and dtypes by their g4 names (g4_wtype_name, g4_dtype_name), so a weight type
 * added to the kernels is carried without changing this format. */
#ifndef G4_FORMATS_PACK_H
#define G4_FORMATS_PACK_H
#include <stddef.h>
#include <stdint.h>

#include "g4.h"
#include "util/mapped_file.h"

enum { G4_PACK_VERSION = 1, G4_PACK_HEADER_BYTES = 64, G4_PACK_ALIGN = 64, G4_PACK_PAGE = 4096 };
#define G4_PACK_MAGIC "G4PACK\0\0"
#define G4_PACK_FILE "model.g4p"

struct cJSON;

typedef struct g4_pack_part_rec {
    uint64_t offset, size;
    const char *owner; /* tensor or blob name (in the manifest) for overlap messages */
    const char *part;  /* "data", "scales", "biases" */
} g4_pack_part_rec;

typedef struct g4_pack {
    char *path;
    g4_mapped_file map;
    struct cJSON *manifest;
    const uint8_t *data;        /* the data section */
    uint64_t data_size;
    g4_pack_part_rec *parts;    /* every part handed out so far (for the overlap check) */
    int n_parts, cap_parts;
} g4_pack;

/* 1 when path is a pack file, or a folder holding model.g4p and no config.json; the file's path
 * goes to file. */
int g4_pack_resolve(const char *path, char *file, size_t n);

/* Maps the file and checks the header and the manifest's JSON. */
g4_status g4_pack_open(g4_pack *p, const char *path, g4_error *err);
void g4_pack_close(g4_pack *p);

/* The manifest's string field key (NULL when absent or not a string). */
const char *g4_pack_string(const g4_pack *p, const char *key);
/* A part [offset, size] (item): checked to lie inside the data section, aligned to 64 bytes and,
 * when want >= 0, to be want bytes long; recorded for g4_pack_check_overlap. owner/part name it in
 * messages and must live as long as p. */
g4_status g4_pack_part(g4_pack *p, const struct cJSON *item, const char *owner, const char *part, int64_t want,
                       const uint8_t **ptr, uint64_t *size, g4_error *err);
/* Fails when two recorded parts overlap. */
g4_status g4_pack_check_overlap(g4_pack *p, g4_error *err);
/* A blob by name ("tokenizer.json"): *found = 0 when the pack has none. */
g4_status g4_pack_blob(g4_pack *p, const char *name, const uint8_t **data, uint64_t *size, int *found,
                       g4_error *err);

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct g4_pack_writer g4_pack_writer;

g4_status g4_pack_writer_create(const char *path, g4_pack_writer **out, g4_error *err);
/* Places n bytes (copied from src when the file is written, so src must stay valid until
 * g4_pack_writer_finish) and returns their offset in the data section. */
g4_status g4_pack_writer_add(g4_pack_writer *w, const void *src, uint64_t n, uint64_t *offset, g4_error *err);
/* Writes header, manifest and every part to a temporary file next to path, then renames it into
 * place; frees w (also on error, leaving no file behind). */
g4_status g4_pack_writer_finish(g4_pack_writer *w, const char *manifest_json, g4_error *err);
void g4_pack_writer_abort(g4_pack_writer *w);
#endif
