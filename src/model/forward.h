/* The Gemma 4 forward pass over a block of M consecutive tokens, and the run state it needs.
 *
 * K/V of the block go to per-layer staging rows first; attention reads cached positions from the
 * cache and the block's own positions from staging, always in ascending position order, so a
 * position's result does not depend on the block size. g4_state_commit() then copies the first n
 * staged rows into the cache (all of them for prefill; the accepted ones after a verify block).
 * Sliding-window layers keep a ring of W rows, full layers a row per position. */
#ifndef G4_MODEL_FORWARD_H
#define G4_MODEL_FORWARD_H
#include "g4.h"
#include "model/model.h"
#include "util/threadpool.h"

typedef struct g4_rope_kind {
    int head_dim, pairs;
    float theta;
} g4_rope_kind;

/* Where a forward's time goes (g4 bench --profile): seconds accumulated per class while
 * g4_state.profile is set. */
enum { G4_PROF_MATMUL, G4_PROF_ATTN, G4_PROF_HEAD, G4_PROF_ACT, G4_PROF_OTHER, G4_PROF_N };

typedef struct g4_state {
    const g4_model *m;
    int n_ctx, max_batch, n_threads;
    int pos;                    /* committed positions */
    /* per layer; NULL for KV-shared layers */
    void **k_cache, **v_cache;  /* [cap][nKV·d] floats, or bf16 when kv_bf16; all in kv_mem */
    int kv_bf16;                /* K/V rows kept as bf16 (g4_session_options.kv_type): half the
                                   cache's memory and the bytes attention reads */
    void *kv_mem;               /* one anonymous mapping (huge pages where the kernel gives them) */
    size_t kv_mem_len;
    int *cache_cap;             /* ring length (sliding) or n_ctx (full) */
    float **k_stage, **v_stage; /* [max_batch][nKV·d] */
    uint16_t **k_stage16, **v_stage16; /* kv_bf16: the staged rows rounded to bf16, as cached (what
                                          attention reads, so staged and cached rows are the same) */
    int stage_pos, n_staged;    /* staging holds positions [stage_pos, stage_pos + n_staged) */
    int n_staged_last;          /* tokens in the last forward: after it, a[m·H] (m < this) holds
                                   the final-normed hidden of its m-th token */
    /* activations, [max_batch][...] */
    float *x, *a, *q, *kv, *att, *t, *ffn, *gate, *up, *ple, *ple_tmp;
    float *act_q;               /* QAT input fake-quantisation copy [max_batch][widest matmul input] */
    float *scores;              /* attention scratch per thread (forward.c, ATT_SCRATCH) */
    float *att_part;            /* attention chunk partials of blocks of <= ATT_SPLIT_M tokens */
    int att_max_chunks;         /* chunks of keys a query can see (n_ctx / ATT_CHUNK + 1) */
    int n_rope;                 /* distinct RoPE kinds */
    g4_rope_kind rope[8];
    int *layer_rope;            /* [L] index into rope */
    float *rope_cs;             /* [max_batch][n_rope][2][max_half] cos, sin */
    int max_half;
    /* MoE */
    float *router_p;            /* [max_batch][E] */
    int *top_e;                 /* [max_batch][top_k] */
    float *top_w;               /* [max_batch][top_k] */
    float *x2, *ex_in, *ex_gu, *ex_out, *ex_res; /* expert scratch */
    int *ex_tok;
    /* profiling: off unless `profile` is set */
    int profile;
    double prof[G4_PROF_N], prof_t;
    /* debugging */
    g4_dump_fn dump;
    void *dump_user;
    int *dump_pos, n_dump_pos;  /* n_dump_pos < 0: every position */
} g4_state;

g4_status g4_state_init(g4_state *s, const g4_model *m, int n_ctx, int max_batch, int n_threads, int kv_bf16,
                        g4_error *err);
void g4_state_free(g4_state *s);

/* Runs M <= max_batch tokens at positions pos, pos+1, ... into staging (does not commit).
 * logits: NULL, or [M][V] when all_logits, else [V] for the last token. */
g4_status g4_forward(g4_state *s, g4_threadpool *pool, const int32_t *tokens, int M, float *logits,
                     int all_logits, g4_error *err);
/* Makes the first n staged positions part of the cache; drops the rest. */
void g4_state_commit(g4_state *s, int n);
#endif
