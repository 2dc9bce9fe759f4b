/* The Gemma 4 MTP drafter ("assistant", docs/gemma4-model.md §5): a 4-layer stack with no K/V of
 * its own that reads the target's caches and proposes the target's next tokens. */
#ifndef G4_MODEL_DRAFTER_H
#define G4_MODEL_DRAFTER_H
#include "model/config.h"
#include "model/forward.h"
#include "model/model.h"

typedef struct g4_drafter_layer {
    const float *attn_norm, *post_attn_norm, *pre_ffn_norm, *post_ffn_norm; /* [h] */
    g4_mat wq, wo;                 /* [nH·d, h], [h, nH·d] */
    const float *q_norm;           /* [d] */
    g4_mat gate, up, down;
    float layer_scalar;
} g4_drafter_layer;

struct g4_drafter {
    g4_drafter_config cfg;
    g4_weight_source src;
    char *path;
    const g4_model *target;
    g4_mat pre_proj;               /* [h, 2H] */
    g4_mat post_proj;              /* [H, h] */
    g4_mat embed;                  /* [V, h]: the drafter's LM head */
    g4_mat centroids;              /* [C, h] (ordered embeddings only) */
    int32_t *token_order;          /* [V]: viewed as [C][V/C] */
    const float *final_norm;       /* [h] */
    g4_drafter_layer *layers;
    int *target_layer;             /* [layers]: the target layer whose cache each layer reads */
    float *arena;
    size_t arena_cap;
};

/* Whether path holds a drafter: a drafter pack, or a folder whose config.json has model_type
 * gemma4_assistant / gemma4_unified_assistant. */
int g4_is_drafter_path(const char *path);
/* Writes the drafter at in_path (any format g4_drafter_open reads) into w, dequantising row by
 * row, integer tables as I64 (convert_drafter.c). w is consumed. */
struct g4_model_writer;
g4_status g4_convert_drafter(const char *in_path, const struct g4_model_writer *w, g4_error *err);

/* The first half of g4_drafter_load, with no target: the config (DIR/config.json, or the one a
 * pack carries) parsed and the weight source open in whatever format the path holds
 * (safetensors, MLX affine, QAT, native pack). *config_json (may be NULL) receives the config
 * text. The pack writer and drafter conversion then bind through a recording source. */
g4_status g4_drafter_open(const char *path, struct g4_drafter **out, char **config_json, g4_error *err);
/* Binds every weight from d->src; the target's hidden size is taken from the config
 * (backbone_hidden_size, which g4_drafter_load has checked against the target). */
g4_status g4_drafter_bind(struct g4_drafter *d, g4_error *err);

/* Per-session scratch for drafting (allocated once). */
typedef struct g4_draft_state {
    int h, H;
    float *x2, *x, *a, *q, *att, *t, *gate, *up, *y, *scores, *cent, *rope_cs;
    float *kv_row;  /* [max_d]: a row of a bf16 target cache, widened */
    int *cent_idx;
    unsigned char *mark;           /* [V] tokens the centroid head scored */
    int max_d, n_ctx;
} g4_draft_state;

g4_status g4_draft_state_init(g4_draft_state *ds, const struct g4_drafter *d, int n_ctx, g4_error *err);
void g4_draft_state_free(g4_draft_state *ds);

/* One drafting step at query position qpos (the target has committed 0..qpos): input token `tok`
 * and the target-space hidden `hid` [H]; writes the next hidden into hid (in place) and the
 * drafter's logits [V] into logits (no softcap). */
void g4_draft_step(const struct g4_drafter *d, g4_draft_state *ds, const g4_state *target_state,
                   g4_threadpool *pool, int32_t tok, float *hid, int qpos, float *logits);
#endif
