/* Where weights come from. The binder (weights.c) asks for each tensor by its Hugging Face name
 * relative to the text model ("embed_tokens.weight", "layers.3.mlp.up_proj.weight",
 * "layers.0.experts.down_proj") and gets a matrix view in the kernels' terms; a source hides its
 * file format's naming and layout (safetensors' prefixes, MLX's weight/scales/biases triplets, QAT
 * scales, GGUF's blk.N names and block types). */
#ifndef G4_MODEL_SOURCE_H
#define G4_MODEL_SOURCE_H
#include "cpu/kernels.h"
#include "g4.h"

typedef struct g4_tensor_ref {
    const char *file;                 /* for error messages */
    char name[256];                   /* the name in the file */
    int ndim;
    int64_t shape[G4_MAX_DIMS];       /* logical shape, as the unquantised tensor */
    g4_mat mat;                       /* rows = product of all dims but the last */
    g4_dtype float_dtype;             /* the dtype the values were trained/stored in (for the
                                         dtype-rounded embedding scale) */
} g4_tensor_ref;

typedef struct g4_weight_source {
    void *ctx;
    const char *path;                 /* what was opened */
    /* *found = 0 (and G4_OK) when the tensor is absent; an error for one present but unusable. */
    g4_status (*find)(void *ctx, const char *name, g4_tensor_ref *out, int *found, g4_error *err);
    void (*close)(void *ctx);
    /* Optional (NULL: the format holds no integer tensors): an integer vector of exactly n
     * elements (index tables such as the drafter's token ordering) as int32 into out; *found = 0
     * when absent. Values are not range-checked here. */
    g4_status (*find_i32)(void *ctx, const char *name, int64_t n, int32_t *out, int *found, g4_error *err);
} g4_weight_source;

/* Hugging Face safetensors (bf16 / f16 / f32): DIR/model.safetensors or a sharded index. */
g4_status g4_source_open_safetensors(g4_weight_source *src, const char *dir, int multimodal_layout,
                                     g4_error *err);

struct g4_config;
/* MLX affine checkpoints (source_mlx.c): config.json "quantization", U32 codes + scales + biases. */
g4_status g4_source_open_mlx(g4_weight_source *src, const char *dir, g4_error *err);
/* Google QAT checkpoints (source_qat.c, quantization_config.quant_method "gemma"): int2/int4/int8
 * codes with per-row scales, blockwise embeddings, static activation scales (g4_mat.*_act_scale).
 * cfg (the parsed config.json) gives each matrix's logical width; it must outlive the source. */
g4_status g4_source_open_qat(g4_weight_source *src, const char *dir, const struct g4_config *cfg,
                             g4_error *err);
/* Opens the MLX or QAT source when DIR/config.json announces one (*handled = 1); *handled = 0 for
 * plain checkpoints; an error for a quant_method this engine does not read. */
g4_status g4_source_open_quantized(g4_weight_source *src, const char *dir, const struct g4_config *cfg,
                                   int *handled, g4_error *err);
/* A llama.cpp GGUF of architecture `gemma4` (source_gguf.c): the file is memory-mapped and its
 * metadata fills *cfg, validated as config.json would be. */
g4_status g4_source_open_gguf(g4_weight_source *src, const char *path, struct g4_config *cfg,
                              g4_error *err);
/* The same with tensors looked up by their full names (drafters mix "model.layers.*" with
 * top-level "pre_projection.weight"). */
g4_status g4_source_open_safetensors_raw(g4_weight_source *src, const char *path, g4_error *err);
/* find_i32 for safetensors-based sources: tensor `name` of archive a, I64 or I32 [n]. */
struct g4_st_archive;
struct g4_st_tensor;
/* out (its name and file set) as the float tensor t of a safetensors archive: shape and a dense
 * matrix over t's data; `expect` names the accepted dtypes in the error */
g4_status g4_st_dense_ref(const struct g4_st_tensor *t, g4_tensor_ref *out, const char *expect, g4_error *err);
g4_status g4_st_find_i32(const struct g4_st_archive *a, const char *name, int64_t n, int32_t *out, int *found,
                         g4_error *err);

struct g4_drafter_config;
/* A drafter directory whose config.json announces MLX affine or QAT quantisation: the MLX / QAT
 * source with tensors looked up by their full names (*handled = 1); *handled = 0 otherwise. */
g4_status g4_source_open_quantized_drafter(g4_weight_source *src, const char *dir,
                                           const struct g4_drafter_config *dc, int *handled, g4_error *err);
g4_status g4_source_open_qat_drafter(g4_weight_source *src, const char *dir, const struct g4_drafter_config *dc,
                                     g4_error *err);

/* The native pack (source_pack.c, formats/pack.h): the file at path (a pack file, see
 * g4_pack_resolve) mapped and every tensor of its manifest validated; tensors point into the map.
 * kind: "model" or "drafter" (a pack of the other kind is refused). *config_json receives the
 * packed config.json text (heap; the caller frees). */
g4_status g4_source_open_pack(g4_weight_source *src, const char *path, const char *kind, char **config_json,
                              g4_error *err);

/* A source that forwards to `inner` (whose ownership it takes) and records every tensor found,
 * float or integer, in the order asked: what the pack writer and drafter conversion walk after a
 * bind. Recorded references stay valid until the source is closed. */
typedef struct g4_recorded_tensor {
    g4_tensor_ref ref;      /* ref.name: the name asked for (not the file's) */
    int is_int;             /* an integer vector: ints[n] */
    int64_t n;
    int32_t *ints;
} g4_recorded_tensor;
g4_status g4_source_open_recorder(g4_weight_source *src, const g4_weight_source *inner, g4_error *err);
/* The tensors recorded so far (NULL, 0 when src is not a recorder). */
const g4_recorded_tensor *g4_source_recorded(const g4_weight_source *src, int *n);

/* The archive behind a safetensors source (for non-float tensors such as index tables); NULL for
 * other sources. */
struct g4_st_archive;
const struct g4_st_archive *g4_source_safetensors_archive(const g4_weight_source *src);
#endif
