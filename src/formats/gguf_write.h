/* Writing GGUF files (version 3, little-endian), the layout gguf.h describes.
 *
 * g4_gguf_writer is the file format alone: key/values and tensor infos are collected in memory
 * (the header precedes the data, and even a 262k-token vocabulary is a few MB), then
 * g4_gguf_writer_begin_data writes the header and the tensors stream to disk one after another
 * in the order they were added, each padded to the alignment. Nothing is buffered per tensor.
 *
 * g4_gguf_model_writer_open wraps it as a g4_model_writer (model/writer.h): a Gemma 4 text model
 * arrives as config.json text plus float32 tensors under Hugging Face names, and leaves as the
 * GGUF llama.cpp's converter would write for architecture `gemma4` (names, metadata, the extra
 * rope_freqs tensor), with the big matrices in a chosen ggml type and the tokenizer metadata
 * copied from a vocabulary GGUF (or a minimal stand-in vocabulary; see the options). */
#ifndef G4_FORMATS_GGUF_WRITE_H
#define G4_FORMATS_GGUF_WRITE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/kernels.h"
#include "formats/gguf.h"
#include "g4.h"
#include "model/writer.h"

typedef struct g4_gguf_writer g4_gguf_writer;

g4_status g4_gguf_writer_create(const char *path, g4_gguf_writer **out, g4_error *err);

/* Key/values, written in the order added. A key added twice is an error. */
g4_status g4_gguf_writer_add_u32(g4_gguf_writer *w, const char *key, uint32_t v, g4_error *err);
g4_status g4_gguf_writer_add_i32(g4_gguf_writer *w, const char *key, int32_t v, g4_error *err);
g4_status g4_gguf_writer_add_f32(g4_gguf_writer *w, const char *key, float v, g4_error *err);
g4_status g4_gguf_writer_add_bool(g4_gguf_writer *w, const char *key, bool v, g4_error *err);
g4_status g4_gguf_writer_add_str(g4_gguf_writer *w, const char *key, const char *v, g4_error *err);
/* An array of n fixed-size elements of elem_type (UINT8 ... FLOAT64 except STRING and ARRAY),
 * given as the C type of that element (bool as one byte each). */
g4_status g4_gguf_writer_add_array(g4_gguf_writer *w, const char *key, g4_gguf_type elem_type,
                                   const void *values, size_t n, g4_error *err);
g4_status g4_gguf_writer_add_str_array(g4_gguf_writer *w, const char *key, const char *const *v,
                                       size_t n, g4_error *err);
/* A value taken from a parsed GGUF as it is (any type, nested arrays included). */
g4_status g4_gguf_writer_add_value(g4_gguf_writer *w, const char *key, const g4_gguf_value *v,
                                   g4_error *err);
/* The first n elements of a parsed array (n <= a->n). */
g4_status g4_gguf_writer_add_array_prefix(g4_gguf_writer *w, const char *key,
                                          const g4_gguf_array *a, uint64_t n, g4_error *err);

/* Declares a tensor: ne[0] is the contiguous dimension (GGUF order), type a ggml type id. */
g4_status g4_gguf_writer_add_tensor(g4_gguf_writer *w, const char *name, uint32_t n_dims,
                                    const uint64_t *ne, uint32_t ggml_type, g4_error *err);
/* Writes the header; after it only tensor data may follow. */
g4_status g4_gguf_writer_begin_data(g4_gguf_writer *w, g4_error *err);
/* Appends bytes of the tensors in declaration order; a tensor may arrive in any number of
 * pieces, and the padding after it is written once its last byte is in. */
g4_status g4_gguf_writer_write(g4_gguf_writer *w, const void *data, size_t n, g4_error *err);
/* Checks every declared byte arrived, closes the file and frees w whatever the outcome. */
g4_status g4_gguf_writer_finish(g4_gguf_writer *w, g4_error *err);
/* Frees w, leaving whatever was written. NULL is fine. */
void g4_gguf_writer_abort(g4_gguf_writer *w);

/* ---- Gemma 4 model writer ---------------------------------------------------------------- */

typedef struct g4_gguf_model_writer_options {
    /* Type of the weight matrices (2-D and 3-D tensors): F32, F16, BF16 or a ggml block type.
     * Vectors (norms, scales, layer scalars) and rope_freqs are always F32, as llama.cpp's
     * converter writes them. With a block type, a matrix whose rows do not divide into blocks
     * falls back as llama-quantize does (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, then F16), and
     * the MoE router stays F32. G4_W_COUNT: the checkpoint's own float type (config.json's
     * dtype), as the converter's --outtype auto. */
    g4_wtype type;
    /* A GGUF whose tokenizer.* keys are copied (e.g. the fixtures' ggml-vocab-gemma-4.gguf).
     * When it has more tokens than the model's vocabulary, the first vocab_size tokens are kept
     * with the merges among them. NULL: a minimal stand-in vocabulary (the Gemma 4 control
     * tokens, "\n" and the byte tokens at their real ids, placeholders elsewhere) so that
     * llama.cpp, which refuses a model without one, can load the file. */
    const char *vocab_path;
    const char *name; /* general.name (NULL: none) */
} g4_gguf_model_writer_options;

/* Opens path for writing; on success *out is a writer that owns everything until finish/abort. */
g4_status g4_gguf_model_writer_open(const char *path, const g4_gguf_model_writer_options *opts,
                                    g4_model_writer *out, g4_error *err);

/* The writer registry's entry (writer_registry.c) for formats "gguf" (automatic float type) and
 * "gguf-TYPE" (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k). `out` ending in
 * ".gguf" is the file; anything else is a directory that receives model.gguf. opts->vocab is
 * the vocabulary GGUF (NULL: the stand-in vocabulary). */
g4_status g4_writer_open_gguf(const char *format, const char *out, const g4_writer_options *opts,
                              g4_model_writer *w, g4_error *err);
#endif
