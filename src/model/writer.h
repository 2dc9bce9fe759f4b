/* Writing checkpoints. A writer receives a model's config.json text and then every tensor as
 * float32 values under its Hugging Face name relative to the text model ("embed_tokens.weight",
 * "layers.3.mlp.up_proj.weight", "layers.0.experts.down_proj"), and stores them in its format
 * (quantising as it goes). Tensors are declared first, then written in declaration order one at a
 * time, so a model far larger than memory streams to disk (g4 synth, g4 convert). */
#ifndef G4_MODEL_WRITER_H
#define G4_MODEL_WRITER_H
#include <stdint.h>

#include "g4.h"

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
} g4_model_writer;
#endif
