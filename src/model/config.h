/* Gemma 4 text-model configuration as read from config.json, with every derived per-layer fact
 * (attention kind, head dim, KV heads, KV source, MLP width) resolved once at load. */
#ifndef G4_MODEL_CONFIG_H
#define G4_MODEL_CONFIG_H
#include "g4.h"

typedef struct g4_layer_config {
    int is_full;     /* full attention (else sliding window) */
    int head_dim;    /* d */
    int n_kv_heads;
    int k_eq_v;      /* V is the raw K projection (full layers with attention_k_eq_v) */
    int kv_source;   /* layer whose K/V this layer reads; == own index when not shared */
    int mlp_width;   /* dense MLP intermediate width */
    float rope_theta;
    int rope_pairs;  /* R: pairs (i, i + d/2) with i < R rotate; the rest pass through */
} g4_layer_config;

typedef struct g4_config {
    char arch[32];          /* "gemma4" | "gemma4_unified" */
    int multimodal_layout;  /* tensors under model.language_model. */
    int n_layers, hidden, n_heads, vocab;
    int head_dim_sliding, head_dim_full;
    int sliding_window;
    int n_kv_shared, first_shared;  /* layers [first_shared, n_layers) read another layer's K/V */
    int intermediate, double_wide;
    int ple_width, ple_vocab;       /* 0 when the model has no per-layer inputs */
    int moe, n_experts, top_k_experts, moe_width;
    int k_eq_v;
    int max_positions;
    int bos, eos, pad;
    float rms_eps;
    float final_softcap;            /* 0: none */
    g4_layer_config *layers;        /* [n_layers] */
} g4_config;

/* Parses config.json text. `path` names the file in error messages. */
g4_status g4_config_parse(const char *json, const char *path, g4_config *out, g4_error *err);
/* Reads and parses DIR/config.json. */
g4_status g4_config_load(const char *dir, g4_config *out, g4_error *err);
void g4_config_free(g4_config *c);

/* A drafter ("assistant"): a small Gemma 4 stack whose layers all read the target's K/V. */
typedef struct g4_drafter_config {
    g4_config text;             /* layers' kv_source is -1: resolved against the target */
    int backbone_hidden;        /* the target's hidden size H */
    int ordered_embeddings;     /* centroid LM head (E2B/E4B drafters) */
    int n_centroids, centroid_top_k;
} g4_drafter_config;

g4_status g4_drafter_config_parse(const char *json, const char *path, g4_drafter_config *out,
                                  g4_error *err);

/* The `config.json` of a released size (e2b, e4b, 12b, 26b-a4b, 31b) in the Hub's multimodal
 * shape, as a heap string the caller frees; NULL for an unknown name. Used by tests and by the
 * model synthesiser. */
char *g4_released_config_json(const char *arch);
#endif
