/* GGUF reader: the file is memory-mapped (or borrowed from the caller) and parsed once; keys,
 * strings, arrays and tensor data are views into the mapping, never copies, so a vocabulary of
 * 262k strings costs one pass and no allocation per string.
 *
 * Every count, length and offset is checked against the file size during parsing, so once
 * g4_gguf_open/g4_gguf_parse succeeds every view it hands out lies inside the file.
 *
 * Layout (little-endian; versions 2 and 3 only, which differ only in what writers may put in
 * them): "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv × (string key, u32 type, value),
 * n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset), padding to
 * general.alignment (default 32), then the tensor data, each tensor at data_start + offset. */
#ifndef G4_FORMATS_GGUF_H
#define G4_FORMATS_GGUF_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "g4.h"

#define G4_GGUF_DEFAULT_ALIGNMENT 32
#define G4_GGUF_MAX_DIMS 4
/* Arrays of arrays are legal GGUF; deeper nesting than this is rejected, which bounds the
 * parser's recursion on hostile files. */
#define G4_GGUF_MAX_DEPTH 8

typedef enum g4_gguf_type {
    G4_GGUF_UINT8 = 0,
    G4_GGUF_INT8 = 1,
    G4_GGUF_UINT16 = 2,
    G4_GGUF_INT16 = 3,
    G4_GGUF_UINT32 = 4,
    G4_GGUF_INT32 = 5,
    G4_GGUF_FLOAT32 = 6,
    G4_GGUF_BOOL = 7,
    G4_GGUF_STRING = 8,
    G4_GGUF_ARRAY = 9,
    G4_GGUF_UINT64 = 10,
    G4_GGUF_INT64 = 11,
    G4_GGUF_FLOAT64 = 12,
    G4_GGUF_TYPE_COUNT
} g4_gguf_type;

/* Not NUL-terminated: a view into the file. Print with "%.*s", (int)s.len, s.data. */
typedef struct g4_gguf_str {
    const char *data;
    size_t len;
} g4_gguf_str;

/* n elements of type, stored back to back from data (size bytes in all). Fixed-size elements
 * are little-endian and possibly unaligned: read them with g4_gguf_array_int/_float. Strings and
 * nested arrays vary in size: walk them with g4_gguf_iter. */
typedef struct g4_gguf_array {
    g4_gguf_type type;
    uint64_t n;
    const uint8_t *data;
    size_t size;
} g4_gguf_array;

typedef struct g4_gguf_value {
    g4_gguf_type type;
    union {
        uint64_t u;      /* UINT8/16/32/64 */
        int64_t i;       /* INT8/16/32/64 */
        double f;        /* FLOAT32/64 */
        bool b;          /* BOOL */
        g4_gguf_str str; /* STRING */
        g4_gguf_array arr;
    };
} g4_gguf_value;

typedef struct g4_gguf_kv {
    g4_gguf_str key;
    g4_gguf_value value;
} g4_gguf_kv;

typedef struct g4_gguf_tensor {
    g4_gguf_str name;
    uint32_t n_dims;
    uint64_t ne[G4_GGUF_MAX_DIMS]; /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint32_t type;                 /* ggml type id (0 F32, 1 F16, 8 Q8_0, 30 BF16, ...) */
    uint64_t offset;               /* from the start of the data section */
    uint64_t size;                 /* bytes */
    const uint8_t *data;           /* inside the file */
} g4_gguf_tensor;

typedef struct g4_gguf g4_gguf;

/* Maps and parses path. */
g4_status g4_gguf_open(const char *path, g4_gguf **out, g4_error *err);
/* Parses a buffer the caller keeps alive until g4_gguf_close; name is used in messages. */
g4_status g4_gguf_parse(const void *data, size_t size, const char *name, g4_gguf **out,
                        g4_error *err);
void g4_gguf_close(g4_gguf *g);

uint32_t g4_gguf_version(const g4_gguf *g);
uint32_t g4_gguf_alignment(const g4_gguf *g);
/* Offset of the data section in the file (may equal the file size when there are no tensors). */
uint64_t g4_gguf_data_offset(const g4_gguf *g);
const char *g4_gguf_name(const g4_gguf *g);

size_t g4_gguf_n_kv(const g4_gguf *g);
const g4_gguf_kv *g4_gguf_kv_at(const g4_gguf *g, size_t i);
/* NULL when absent. */
const g4_gguf_kv *g4_gguf_find(const g4_gguf *g, const char *key);

/* Typed getters: G4_ERR_FORMAT naming the file and key when the key is missing or has another
 * type. Integer getters accept any integer type whose value fits. */
g4_status g4_gguf_get_uint(const g4_gguf *g, const char *key, uint64_t *out, g4_error *err);
g4_status g4_gguf_get_int(const g4_gguf *g, const char *key, int64_t *out, g4_error *err);
g4_status g4_gguf_get_float(const g4_gguf *g, const char *key, double *out, g4_error *err);
g4_status g4_gguf_get_bool(const g4_gguf *g, const char *key, bool *out, g4_error *err);
g4_status g4_gguf_get_str(const g4_gguf *g, const char *key, g4_gguf_str *out, g4_error *err);
/* elem_type -1 accepts any element type. */
g4_status g4_gguf_get_array(const g4_gguf *g, const char *key, int elem_type, g4_gguf_array *out,
                            g4_error *err);

/* Element i of an integer or bool array as int64 (UINT64 above INT64_MAX wraps; check the type
 * if that matters); of a float array as double. i must be < n and the type must match. */
int64_t g4_gguf_array_int(const g4_gguf_array *a, uint64_t i);
double g4_gguf_array_float(const g4_gguf_array *a, uint64_t i);
bool g4_gguf_type_is_int(g4_gguf_type t);

/* Sequential walk over any array, including strings and nested arrays. */
typedef struct g4_gguf_iter {
    g4_gguf_array arr;
    const uint8_t *p;
    uint64_t i;
} g4_gguf_iter;
void g4_gguf_iter_init(g4_gguf_iter *it, const g4_gguf_array *a);
/* Fills *v with the next element and returns true; false at the end. */
bool g4_gguf_iter_next(g4_gguf_iter *it, g4_gguf_value *v);

size_t g4_gguf_n_tensors(const g4_gguf *g);
const g4_gguf_tensor *g4_gguf_tensor_at(const g4_gguf *g, size_t i);
const g4_gguf_tensor *g4_gguf_find_tensor(const g4_gguf *g, const char *name);

const char *g4_gguf_type_name(g4_gguf_type t);
/* ggml tensor types: name ("f32", "q4_K", ...) or NULL when unknown; elements per block and bytes
 * per block (0 when unknown). */
const char *g4_ggml_type_name(uint32_t type);
uint32_t g4_ggml_block_size(uint32_t type);
uint32_t g4_ggml_type_size(uint32_t type);
#endif
