/* Internal helpers shared by the checkpoint writers (safetensors, MLX, QAT): a streaming
 * safetensors file whose parts may be filled in any interleaving, and config.json rewriting.
 *
 * A part is one tensor of the output file. Writers declare every part, then append each part's
 * bytes in order (parts may interleave: an MLX weight's codes stream while its scales and biases
 * accumulate). Bytes of the part the file is at go straight to disk; other parts wait in memory
 * until their turn, so only out-of-order data (scales, biases, small vectors) is ever held.
 * At begin the file order is the declaration order except that small parts of 2 mod 4 bytes
 * (a bf16 layer_scalar) are moved so that every 4-byte tensor (uint32 codes, f32) stays aligned
 * in the mapped file. */
#ifndef G4_MODEL_WRITER_ST_H
#define G4_MODEL_WRITER_ST_H
#include <stddef.h>
#include <stdint.h>

#include "formats/safetensors.h"
#include "g4.h"

typedef struct g4_wst g4_wst;

g4_status g4_wst_create(const char *path, g4_wst **out, g4_error *err);
/* Returns the part's index in *part. */
g4_status g4_wst_declare(g4_wst *w, const char *name, g4_dtype dtype, int ndim, const int64_t *shape,
                         int *part, g4_error *err);
g4_status g4_wst_begin(g4_wst *w, g4_error *err);
/* Appends n bytes to a part. */
g4_status g4_wst_put(g4_wst *w, int part, const void *data, size_t n, g4_error *err);
size_t g4_wst_part_bytes(const g4_wst *w, int part);
/* The part declared under name, or -1. */
int g4_wst_find(const g4_wst *w, const char *name);
/* declare_i64 / write_i64 of the g4_model_writer interface for writers built on a g4_wst. */
g4_status g4_wst_declare_i64(g4_wst *w, const char *name, int64_t n, g4_error *err);
g4_status g4_wst_write_i64(g4_wst *w, const char *name, const int64_t *values, g4_error *err);
/* Checks every part is complete, closes and frees (also on error). */
g4_status g4_wst_finish(g4_wst *w, g4_error *err);
void g4_wst_abort(g4_wst *w);

/* mkdir -p */
g4_status g4_writer_mkdir(const char *dir, g4_error *err);
/* Writes text to dir/name. */
g4_status g4_writer_write_text(const char *dir, const char *name, const char *text, g4_error *err);

/* config.json rewriting. `json` is any Gemma 4 config.json (multimodal or text-only); the result
 * (heap string) is the same model in the requested shape: text-only (flat fields,
 * Gemma4ForCausalLM, model_type gemma4_text / gemma4_unified_text) or multimodal (text_config,
 * Gemma4ForConditionalGeneration). Quantisation keys are dropped; `extra` (may be NULL) is a JSON
 * object whose members are added at the top level. */
struct cJSON;
g4_status g4_writer_config_json(const char *json, int multimodal, const struct cJSON *extra, char **out,
                                g4_error *err);
/* Whether a config.json text is a drafter's (model_type gemma4_assistant / gemma4_unified_assistant):
 * writers then keep every tensor name as given (drafters mix "model.layers.*" with top-level
 * "pre_projection.weight") and g4_writer_config_json keeps the config's shape. */
int g4_writer_config_is_drafter(const char *json);
/* Whether a config.json text describes the multimodal layout (has text_config). */
int g4_writer_config_is_multimodal(const char *json);

/* The writers in this directory (registered in writer_registry.c). */
struct g4_model_writer;
struct g4_writer_options;
g4_status g4_writer_open_safetensors(const char *format, const char *out_dir, const struct g4_writer_options *opts,
                                     struct g4_model_writer *out, g4_error *err);
g4_status g4_writer_open_mlx(const char *format, const char *out_dir, const struct g4_writer_options *opts,
                             struct g4_model_writer *out, g4_error *err);
g4_status g4_writer_open_qat(const char *format, const char *out_dir, const struct g4_writer_options *opts,
                             struct g4_model_writer *out, g4_error *err);
#endif
