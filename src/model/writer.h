/* Writing checkpoints. A writer receives a model's config.json text and then every tensor as
 * float32 values under its Hugging Face name relative to the text model ("embed_tokens.weight",
 * "layers.3.mlp.up_proj.weight", "layers.0.experts.down_proj"), and stores them in its format
 * (quantising as it goes). Tensors are declared first, then written in declaration order one at a
 * time, so a model far larger than memory streams to disk (g4 synth, g4 convert). */
#ifndef G4_MODEL_WRITER_H
#define G4_MODEL_WRITER_H
#include <stddef.h>
#include <stdint.h>

#include "g4.h"
#include "model/config.h"

typedef struct g4_model_writer {
    void *ctx;
    /* config_json: the text-model config as a full config.json document */
    g4_status (*set_config)(void *ctx, const char *config_json, g4_error *err);
    g4_status (*declare)(void *ctx, const char *name, int ndim, const int64_t *shape, g4_error *err);
    g4_status (*begin)(void *ctx, g4_error *err);
    /* data: numel(shape) floats of the tensor declared next */
    g4_status (*write)(void *ctx, const char *name, const float *data, g4_error *err);
    /* finish frees the writer whatever the outcome; abort frees it leaving partial output */
    g4_status (*finish)(void *ctx, g4_error *err);
    void (*abort)(void *ctx);
    /* Optional (NULL: only whole tensors through write): rows [row0, row0 + n_rows) of the tensor
     * declared next, a row being the last dimension (rows = product of the other dims). A tensor's
     * rows arrive in order and it is complete after its last row, so tables larger than memory
     * (E2B's 262144 x 8960 per-layer embedding) stream in chunks. */
    g4_status (*write_rows)(void *ctx, const char *name, int64_t row0, int64_t n_rows, const float *data,
                            g4_error *err);
    /* Optional (NULL: the format cannot hold them): an integer vector of n elements stored as I64
     * under `name` as given (the drafter's masked_embedding.token_ordering). Declared before
     * begin, written once, after the float tensors. */
    g4_status (*declare_i64)(void *ctx, const char *name, int64_t n, g4_error *err);
    g4_status (*write_i64)(void *ctx, const char *name, const int64_t *values, g4_error *err);
} g4_model_writer;

/* ---- the writer registry (writer_registry.c) ------------------------------------------------ */

typedef struct g4_writer_options {
    int bits, group;   /* quantised formats: 0 = the format's default */
    int layout;        /* 0: the format's usual layout; 1: text-only (model.*); 2: multimodal
                          (model.language_model.* / language_model.model.*) */
    const char *vocab; /* GGUF formats: a vocabulary GGUF whose tokenizer.* keys are copied
                          (NULL: a minimal stand-in vocabulary) */
} g4_writer_options;

/* Opens a writer for FORMAT into directory out_dir (created when missing): "bf16", "f16", "f32"
 * (Hugging Face safetensors), "mlx" / "mlx-N" (MLX affine, N bits), "qat" / "qat-intN" (Google
 * QAT), and the formats other files register ("gguf-..."). opts may be NULL. */
g4_status g4_writer_open(const char *format, const char *out_dir, const g4_writer_options *opts,
                         g4_model_writer *out, g4_error *err);
/* The "qat" writer's mixed recipe (writer_qat.c): the bits of tensor `name` (relative, as
 * "layers.3.mlp.up_proj.weight" or "embed_tokens.weight"), 0 to keep it float. */
int g4_qat_mixed_bits(const g4_config *cfg, const char *name);
/* One line per registered format family, for --help texts, into buf. */
void g4_writer_formats_help(char *buf, size_t n);
/* Feeds rows of the tensor declared next through write_rows, or, for writers without it,
 * gathers the whole tensor (rows must then cover it exactly once, in order; *pending keeps the
 * partial tensor between calls and is freed when it completes or by g4_writer_rows_reset). */
typedef struct g4_writer_rows {
    float *buf;
    int64_t rows, cols, filled;
} g4_writer_rows;
g4_status g4_writer_put_rows(const g4_model_writer *w, g4_writer_rows *pending, const char *name,
                             int ndim, const int64_t *shape, int64_t row0, int64_t n_rows,
                             const float *data, g4_error *err);
void g4_writer_rows_reset(g4_writer_rows *pending);
#endif
