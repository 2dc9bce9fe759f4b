/* Safetensors checkpoints: one `model.safetensors`, or shards listed by
 * `model.safetensors.index.json`. Files are memory-mapped; tensors point into the maps.
 *
 * Every byte of the header is untrusted: the header length, the JSON, each dtype, shape and
 * offset pair is checked against the file before a tensor is handed out. */
#ifndef G4_FORMATS_SAFETENSORS_H
#define G4_FORMATS_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

#include "g4.h"
#include "util/mapped_file.h"

typedef enum g4_dtype {
    G4_DT_F32, G4_DT_F16, G4_DT_BF16, G4_DT_F64,
    G4_DT_I64, G4_DT_I32, G4_DT_I16, G4_DT_I8,
    G4_DT_U64, G4_DT_U32, G4_DT_U16, G4_DT_U8, G4_DT_BOOL,
    G4_DT_F8_E4M3, G4_DT_F8_E5M2,
    G4_DT_COUNT
} g4_dtype;

const char *g4_dtype_name(g4_dtype t);
size_t g4_dtype_size(g4_dtype t);

enum { G4_MAX_DIMS = 8 };

typedef struct g4_st_tensor {
    char *name;
    g4_dtype dtype;
    int ndim;
    int64_t shape[G4_MAX_DIMS];
    const void *data;  /* aligned to the element size (copied only in the rare unaligned case) */
    size_t nbytes;
    int file;          /* index into the archive's files */
} g4_st_tensor;

typedef struct g4_st_archive {
    char *dir;
    int n_files;
    char **file_names;       /* [n_files] paths */
    g4_mapped_file *files;   /* [n_files] */
    int n_tensors;
    g4_st_tensor *tensors;   /* sorted by name */
    void **owned;            /* aligned copies of misaligned tensors */
    int n_owned;
} g4_st_archive;

/* Opens DIR/model.safetensors.index.json when present, else DIR/model.safetensors; or a single
 * .safetensors file when path names one. */
g4_status g4_st_open(g4_st_archive *a, const char *path, g4_error *err);
/* Parses one already-mapped safetensors file and appends its tensors (used by g4_st_open; exposed
 * for tests of the header validation). */
g4_status g4_st_add_file(g4_st_archive *a, const char *path, g4_error *err);
void g4_st_close(g4_st_archive *a);
const g4_st_tensor *g4_st_find(const g4_st_archive *a, const char *name);
int64_t g4_st_numel(const g4_st_tensor *t);
#endif

/* ---- writing ------------------------------------------------------------------------------- */

/* A safetensors writer: declare every tensor first (the header precedes the data), then write
 * each tensor's bytes in declaration order, so large models stream to disk. */
typedef struct g4_st_writer g4_st_writer;

g4_status g4_st_writer_create(const char *path, g4_st_writer **out, g4_error *err);
g4_status g4_st_writer_declare(g4_st_writer *w, const char *name, g4_dtype dtype, int ndim,
                               const int64_t *shape, g4_error *err);
/* Writes the header; call once after the last declare. */
g4_status g4_st_writer_begin_data(g4_st_writer *w, g4_error *err);
/* Appends bytes of the current tensor; a tensor is complete once its full size was written. */
g4_status g4_st_writer_write(g4_st_writer *w, const void *data, size_t n, g4_error *err);
/* Checks every declared byte was written, closes the file, frees w (also on error). */
g4_status g4_st_writer_finish(g4_st_writer *w, g4_error *err);
/* Frees without finishing (the file is left incomplete). */
void g4_st_writer_abort(g4_st_writer *w);
