/* g4: an inference engine for Google's Gemma 4 models.
 *
 * The public API. Handles are opaque; every fallible call returns a g4_status and, when given a
 * g4_error, leaves a message there that names the file, tensor or field at fault. The library
 * prints nothing and keeps no global mutable state: two models and any number of sessions may
 * live in one process.
 *
 * Exactness contract: for one model and backend, the logits of a position are bitwise identical
 * however the work was scheduled (one token at a time, in chunks of any size, with any number of
 * threads).
 */
#ifndef G4_H
#define G4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum g4_status {
    G4_OK = 0,
    G4_ERR_IO,           /* a file could not be opened, read or mapped */
    G4_ERR_FORMAT,       /* a file's bytes are malformed (truncated, lying header, bad JSON) */
    G4_ERR_CONFIG,       /* config.json is missing a field or describes an impossible model */
    G4_ERR_TENSOR,       /* a needed tensor is missing or has the wrong dtype or shape */
    G4_ERR_UNSUPPORTED,  /* well-formed but not something this engine runs */
    G4_ERR_NOMEM,
    G4_ERR_ARG,          /* the caller passed an invalid argument */
    G4_ERR_CONTEXT_FULL, /* the session's context length would be exceeded */
} g4_status;

/* Where a failed call explains itself. Callers may pass NULL when they only want the status. */
typedef struct g4_error {
    g4_status code;
    char message[1024];
} g4_error;

const char *g4_status_name(g4_status s);

/* ---- Models ------------------------------------------------------------------------------ */

typedef struct g4_model g4_model;

typedef struct g4_model_options {
    /* 0 (default): on CPUs with AVX-512, quantised matrices with a faster CPU layout (Q4_0, Q4_1,
     * Q8_0, 4/8-bit MLX and QAT) are repacked into it at load (a copy in memory; the same values,
     * summed in that layout's own fixed order).
     * 1: every matrix stays in the file's layout, memory-mapped (e.g. for a GPU session). */
    int keep_layout;
} g4_model_options;

/* path: a Hugging Face checkpoint directory (config.json + model.safetensors or a sharded
 * model.safetensors.index.json; MLX affine and QAT folders too), a GGUF file, or a native pack
 * (model.g4p, or a folder holding it). Weights are memory-mapped, never copied wholesale. */
g4_status g4_model_load(const char *path, const g4_model_options *opts, g4_model **out,
                        g4_error *err);
void g4_model_free(g4_model *m);

typedef struct g4_model_info {
    const char *arch;        /* "gemma4" or "gemma4_unified" */
    int n_layers, hidden, n_heads, vocab;
    int n_kv_shared;         /* KV-shared layers at the end of the stack */
    int ple_width;           /* per-layer-input width P (0: none) */
    int sliding_window;
    int n_experts, top_k_experts; /* 0 when the model has no MoE block */
    int bos, eos;
    float embed_scale;       /* sqrt(H) rounded to the embedding table's dtype */
    float final_softcap;     /* 0: none */
    size_t weight_bytes;     /* bytes of tensors the forward reads */
} g4_model_info;

void g4_model_get_info(const g4_model *m, g4_model_info *info);

/* Per-layer geometry as derived from config.json (layer types, head dims, KV sharing, MLP). */
typedef struct g4_layer_info {
    int is_full;       /* 1: full attention, 0: sliding window */
    int head_dim;
    int n_kv_heads;
    int kv_source;     /* layer whose cache this layer reads (itself when not shared) */
    int mlp_width;     /* dense MLP intermediate width */
    int k_eq_v;        /* V is the raw K projection */
} g4_layer_info;

g4_status g4_model_get_layer(const g4_model *m, int layer, g4_layer_info *info);

/* ---- Sessions: one sequence, its KV cache and scratch ---------------------------------- */

typedef struct g4_session g4_session;

enum { G4_DEVICE_CPU = 0, G4_DEVICE_CUDA = 1 };

typedef struct g4_session_options {
    int n_ctx;      /* context length in tokens (0: 4096, capped by the model's maximum) */
    int n_threads;  /* worker threads (0: all online CPUs) */
    int max_batch;  /* most tokens one forward step computes at once (0: 64; 512 with fast_prefill) */
    int device;     /* G4_DEVICE_CPU (0) or G4_DEVICE_CUDA: the weights are uploaded to the GPU
                       and every forward runs there; creating the session fails with
                       G4_ERR_UNSUPPORTED ("no CUDA device/driver: ...") where there is none */
    int fast_prefill;  /* GPU sessions: 0 (default) runs prompts with the decode procedure, so a
                          position's logits are bitwise the same in any chunk as alone (the
                          exactness contract); 1 with the prefill procedure (bf16 tensor cores,
                          ~3.7x faster on E2B bf16), whose logits do not depend on the chunk size
                          but differ from the decode procedure's by rounding */
    int kv_type;       /* G4_KV_F32 (0, default) or G4_KV_BF16: K/V rows rounded to bf16 as they
                          are cached (CPU sessions): half the cache's memory and the bytes attention
                          reads; the exactness contract holds within the setting, but the logits
                          differ from the f32 cache's by the rounding of K and V */
} g4_session_options;

enum { G4_KV_F32 = 0, G4_KV_BF16 = 1 };

g4_status g4_session_create(g4_model *m, const g4_session_options *opts, g4_session **out,
                            g4_error *err);
/* G4_OK when sessions can run on `device` here (CUDA: a GPU and driver are present and the
 * library was built with CUDA); otherwise G4_ERR_UNSUPPORTED saying why. desc (may be NULL)
 * receives a one-line description of the device. Load models for a GPU session with
 * g4_model_options.keep_layout = 1. */
g4_status g4_device_probe(int device, char *desc, size_t desc_len, g4_error *err);
void g4_session_free(g4_session *s);
/* Forget every token: the next forward starts at position 0. */
void g4_session_reset(g4_session *s);
/* Tokens in the cache so far (the position of the next token). */
int g4_session_pos(const g4_session *s);
int g4_session_ctx(const g4_session *s);

typedef enum g4_logits_mode {
    G4_LOGITS_NONE = 0, /* only fill the cache */
    G4_LOGITS_LAST = 1, /* logits[vocab] of the last token */
    G4_LOGITS_ALL = 2,  /* logits[n][vocab], one row per token */
} g4_logits_mode;

/* Appends n tokens at the current position and runs the forward over them (internally in steps of
 * at most max_batch tokens; the result does not depend on that split). */
g4_status g4_session_forward(g4_session *s, const int32_t *tokens, int n, g4_logits_mode mode,
                             float *logits, g4_error *err);

/* ---- Drafters (speculative decoding) ----------------------------------------------------- */

typedef struct g4_drafter g4_drafter;

/* Loads a Gemma 4 "assistant" drafter (gemma4_assistant / gemma4_unified_assistant; a folder in
 * safetensors, MLX affine or QAT form, or a native pack) for target,
 * checking that its geometry matches the target's (hidden size, KV heads, head dims, window,
 * K=V). The target must outlive the drafter. */
g4_status g4_drafter_load(const char *path, const g4_model *target, g4_drafter **out,
                          g4_error *err);
void g4_drafter_free(g4_drafter *d);

/* Greedy drafting without verification (for conformance checks): after the session's last
 * forward ended at position pos-1, proposes n_steps tokens following `token` (the target's token
 * at pos). first_logits [vocab] and first_hidden [target hidden] (either may be NULL) receive the
 * first step's drafter logits and projected hidden. */
g4_status g4_drafter_propose(g4_drafter *d, g4_session *s, int32_t token, int n_steps,
                             int32_t *drafts, float *first_logits, float *first_hidden,
                             g4_error *err);

/* ---- Generation -------------------------------------------------------------------------- */

struct g4_sampler; /* include/g4_sample.h */

enum { G4_MAX_DRAFT = 16 };

typedef struct g4_generate_options {
    int max_new;                 /* tokens to generate at most */
    const int32_t *stop_tokens;  /* generation ends after emitting one of these (may be NULL) */
    int n_stop;
    struct g4_sampler *sampler;  /* NULL: greedy (argmax, lowest index on ties) */
    g4_drafter *drafter;         /* NULL: no speculation */
    int draft_k;                 /* most drafts per round, 1..G4_MAX_DRAFT (0: 4) */
    int draft_fixed;             /* 1: always draft draft_k; else greedy picks k per round (0 = a plain
                                    step) from measured step/verify/draft times and acceptance, and
                                    sampling adapts k to recent acceptance */
    /* Called for every emitted token with the logits it was chosen from; a non-zero return ends
     * generation after this token. May be NULL. */
    int (*on_token)(void *user, int32_t token, const float *logits, int n_vocab);
    void *user;
    /* 1: on_token receives logits = NULL. Greedy generation on a GPU session then keeps the logits
     * on the device and copies back only the chosen token ids (the same tokens); no effect with a
     * sampler, whose draws need the logits. */
    int no_logits;
    /* Benchmark mode: each drafted token is replaced by oracle[i] (i: index of the generated
     * token it proposes) with probability oracle_alpha, else by a wrong token; the drafter still
     * runs, so draft, verify and commit costs are real. NULL: off. */
    const int32_t *oracle;
    int n_oracle;
    double oracle_alpha;
    uint64_t oracle_seed;
} g4_generate_options;

typedef struct g4_generate_stats {
    int n_prompt, n_generated;
    double prefill_seconds, decode_seconds;
    int rounds;                       /* speculative rounds */
    int drafted, accepted;            /* draft tokens proposed / accepted */
    int drafted_at[G4_MAX_DRAFT];     /* per draft position: proposed */
    int accepted_at[G4_MAX_DRAFT];    /* per draft position: accepted */
    double draft_seconds;             /* time spent in the drafter */
} g4_generate_stats;

/* Prefills prompt (n_prompt >= 1) after what the session already holds, then generates. The last
 * emitted token is not fed to the model: to continue the sequence, start the next prompt with it.
 * With a drafter, greedy output is identical to drafter-free output, token for token and logit
 * for logit; with a sampler, the output distribution is unchanged (speculative sampling). */
g4_status g4_generate(g4_session *s, const int32_t *prompt, int n_prompt,
                      const g4_generate_options *opts, g4_generate_stats *stats, g4_error *err);

/* Greedy decoding: prefill the prompt, then append up to max_new argmax tokens to out, stopping
 * after a token listed in stop (may be NULL). *n_out receives the count. */
g4_status g4_generate_greedy(g4_session *s, const int32_t *prompt, int n_prompt, int max_new,
                             const int32_t *stop, int n_stop, int32_t *out, int *n_out,
                             g4_error *err);

/* ---- Debugging: named intermediates ------------------------------------------------------ */

/* Called during forward for each named intermediate of each chosen position:
 * name   "embed", "ple", "attn_norm", "q", "k", "v", "attn_out", "attn_post", "mlp_out",
 *        "ffn_post", "layer_out" (the residual stream after the layer), "final_norm", "logits";
 * layer  the layer index (-1 for whole-model steps); pos the absolute position;
 * data   n floats, valid only during the call. */
typedef void (*g4_dump_fn)(void *user, const char *name, int layer, int pos, const float *data,
                           int n);

/* positions: absolute positions to dump (NULL with n_positions = -1: every position).
 * Pass fn = NULL to turn dumping off. */
g4_status g4_session_set_dump(g4_session *s, g4_dump_fn fn, void *user, const int *positions,
                              int n_positions);

#ifdef __cplusplus
}
#endif
#endif
