/* The two producers of g4_model_writer input: synthesis (full-size random-weight models of the
 * released geometries, for benchmarks and format tests) and conversion (any loadable checkpoint
 * into any writer, dequantising row by row).
 *
 * Synthetic weights are a deterministic function of (seed, tensor name, row): each row has its own
 * generator stream, so files written in any chunking, the in-memory source and any thread count
 * give bit-identical values. Scales follow an initializer (matrices N(0, 1/fan_in), norms and
 * layer scalars near 1, embeddings so that logits spread over several units). */
#ifndef G4_MODEL_SYNTH_H
#define G4_MODEL_SYNTH_H
#include <stdint.h>

#include "g4.h"
#include "model/config.h"
#include "model/source.h"
#include "model/writer.h"

/* What a tensor is, for initialisation. */
typedef enum g4_tensor_role {
    G4_TR_EMBED,      /* the token table (also the tied LM head) */
    G4_TR_PLE_EMBED,  /* the per-layer-input table */
    G4_TR_MATRIX,     /* a projection; experts' stacks too */
    G4_TR_NORM,       /* norm weights, router scales: near 1 */
    G4_TR_SCALAR,     /* layer_scalar */
} g4_tensor_role;

typedef struct g4_tensor_desc {
    char name[96];          /* relative to the text model, as the binder asks */
    int ndim;
    int64_t shape[3];
    g4_tensor_role role;
    int fan_in;
} g4_tensor_desc;

/* Every tensor a model of config c reads, in a canonical order (KV-shared layers' unused k/v are
 * left out). *out is malloc'd. */
g4_status g4_model_tensor_list(const g4_config *c, g4_tensor_desc **out, int *n, g4_error *err);

typedef struct g4_synth_options {
    uint64_t seed;
    int n_layers;   /* 0: the full depth; else truncate the stack to n layers (tests, CI) */
    int n_threads;  /* 0: all CPUs */
    int keep_layout; /* g4_model_synth: 1 = no repacking into the CPU kernels' layout (GPU sessions) */
} g4_synth_options;

/* config.json of a released size ("e2b", "e4b", "12b", "26b-a4b", "31b"), truncated to
 * n_layers when 0 < n_layers < depth (KV sharing scaled down, the last layer kept full). */
g4_status g4_synth_config_json(const char *arch, int n_layers, char **out, g4_error *err);

/* Rows [r0, r0 + n) of tensor t's synthetic values (row = last dimension). */
void g4_synth_rows(const g4_tensor_desc *t, uint64_t seed, int64_t r0, int64_t n, float *out);

/* Streams a random-weight model of config_json through w (set_config ... finish; on error the
 * writer is aborted). Either way w is consumed. */
g4_status g4_synth_write(const char *config_json, const g4_synth_options *o, const g4_model_writer *w,
                         g4_error *err);

/* A weight source generating each tensor into memory on first find(), stored as `storage`:
 * "bf16" (default when NULL), "f16", "f32", "mlx-N" (MLX affine, N bits, group 64, 8-bit
 * router: what the mlx writer stores), "qat-intN" (per-row int N, as the qat-intN writer), "qat"
 * (the qat writer's mixed 2/4/8-bit recipe, g4_qat_mixed_bits; the embedding stays tied).
 * config_json (may be NULL) gives the model's "dtype", which QAT storage reports as the float
 * dtype (the embedding multiplier's rounding), as source_qat.c does. cfg must outlive the source. */
g4_status g4_source_open_synth(g4_weight_source *src, const g4_config *cfg, const char *config_json,
                               const g4_synth_options *o, const char *storage, g4_error *err);
/* A model with synthetic weights, as g4_model_load would give for a file written by
 * g4_synth_write with the same seed and the matching format (arch: a released size name, or a
 * config.json text starting with '{'). */
g4_status g4_model_synth(const char *arch, const g4_synth_options *o, const char *storage, g4_model **out,
                         g4_error *err);

/* config.json (text-only form) describing a parsed config; heap string. */
g4_status g4_config_to_json(const g4_config *c, char **out, g4_error *err);

/* Converts the checkpoint at in_path (any format g4_model_load reads) into w; w is consumed. */
g4_status g4_convert(const char *in_path, const g4_model_writer *w, int n_threads, g4_error *err);
#endif
