/* The loaded Gemma 4 model: config plus every weight the forward reads, bound by name and checked
 * for dtype and shape. Big matrices point into the memory-mapped checkpoint; norm vectors and
 * scalars (a few KB per layer) are converted to float once. */
#ifndef G4_MODEL_MODEL_H
#define G4_MODEL_MODEL_H
#include "cpu/kernels.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/source.h"

typedef struct g4_layer_weights {
    const float *attn_norm, *post_attn_norm;  /* [H] */
    const float *pre_ffn_norm, *post_ffn_norm; /* [H] */
    g4_mat wq;                  /* [nH·d, H] */
    g4_mat wk, wv;              /* [nKV·d, H]; unused on KV-shared layers; wv unused when K=V */
    g4_mat wo;                  /* [H, nH·d] */
    const float *q_norm, *k_norm; /* [d] */
    g4_mat gate, up, down;      /* [I, H], [I, H], [H, I] */
    /* MoE (26B-A4B) */
    g4_mat router;              /* [E, H] */
    const float *router_scale;  /* [H] */
    const float *expert_scale;  /* [E] */
    g4_mat experts_gate_up;     /* [E·2·I_moe, H]: expert e's gate rows then up rows */
    g4_mat experts_down;        /* [E·H, I_moe] */
    const float *pre_ffn_norm2, *post_ffn_norm1, *post_ffn_norm2; /* [H] */
    /* per-layer inputs (E2B, E4B) */
    g4_mat ple_gate;            /* [P, H] */
    g4_mat ple_proj;            /* [H, P] */
    const float *post_ple_norm; /* [H] */
    float layer_scalar;
} g4_layer_weights;

struct g4_model {
    g4_config cfg;
    g4_weight_source src;
    char *path;
    g4_mat embed;               /* [V, H], also the tied LM head */
    float embed_scale;          /* sqrt(H) rounded to embed's dtype */
    const float *final_norm;    /* [H] */
    g4_mat ple_embed;           /* [V_ple, L·P] */
    float ple_embed_scale;      /* sqrt(P) rounded to the table's dtype */
    g4_mat ple_model_proj;      /* [L·P, H] */
    const float *ple_proj_norm; /* [P] */
    g4_layer_weights *layers;   /* [L] */
    float *arena;               /* owns every converted vector above */
    size_t weight_bytes;
    void *repacked;             /* the matrices repacked into the kernels' layout (anonymous map) */
    size_t repacked_size;
};

/* Binding tensors from a source with shape checks; small vectors are converted to float into a
 * caller-provided arena (bump-allocated). */
typedef struct g4_binder {
    g4_weight_source *src;
    float *arena;
    size_t arena_used, arena_cap;
    size_t *bytes;              /* accumulates the bytes of bound matrices (may be NULL) */
    g4_error *err;
} g4_binder;

/* A matrix [rows, cols]; with experts > 0 a 3-D [experts, rows, cols] viewed as 2-D. ref may be NULL. */
g4_status g4_bind_mat(g4_binder *b, const char *name, int experts, int rows, int cols, g4_mat *out,
                      g4_tensor_ref *ref);
/* A vector of n floats converted into the arena. */
g4_status g4_bind_vec(g4_binder *b, const char *name, int n, const float **out);

/* g4_model_load without the binding: the config parsed and the weight source open (the pack
 * writer slips a recording source in between). Free with g4_model_free. */
g4_status g4_model_open_unbound(const char *path, struct g4_model **out, g4_error *err);

/* Binds and checks every weight of m->cfg from m->src (used by g4_model_load). */
g4_status g4_model_bind(struct g4_model *m, g4_error *err);
/* Repacks every streamed matrix that has a faster kernel layout (Q4_0, Q4_1, Q8_0, 4/8-bit MLX
 * and QAT; cpu/quant.h) into one anonymous mapping (huge pages where the kernel allows), so the
 * file's pages are no longer touched by decoding. The gathered PLE table stays mapped as it is.
 * Only on CPUs with AVX-512 (the split layout's loops), and not when the copy would exceed
 * max_bytes. The split layout has its own canonical reduction order (cpu/kernels_internal.h), so
 * logits differ from the file layout's by float rounding; each is exact in itself. */
g4_status g4_model_repack(struct g4_model *m, size_t max_bytes, g4_error *err);
#endif
