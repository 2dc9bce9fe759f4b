/* A session's insides, shared by the session API and generation. */
#ifndef G4_RUNTIME_SESSION_H
#define G4_RUNTIME_SESSION_H
#include "g4.h"
#include "model/drafter.h"
#include "model/forward.h"
#include "util/threadpool.h"

struct g4_cuda;

struct g4_session {
    g4_model *m;
    g4_threadpool *pool;
    g4_state st;          /* on CUDA sessions only the bookkeeping (pos, n_ctx, max_batch, dump) */
    struct g4_cuda *cuda; /* non-NULL: the CUDA backend holds the cache and runs the forward */
    int fast_prefill;     /* g4_session_options.fast_prefill */
};

/* The backend-neutral steps generation is made of. */

/* One forward of M <= max_batch tokens at the session's position into staging; logits [M][V]
 * when all_logits, else the last row's [V] (may be NULL). Nothing is committed. */
g4_status g4_session_step(g4_session *s, const int32_t *tokens, int M, float *logits, int all_logits,
                          g4_error *err);
/* GPU sessions: a forward of M tokens whose logits stay on the device; ids[m] receives the argmax
 * of row m (what argmax over g4_session_step's logits would give: the same values, the lowest
 * index on ties). commit: M must be 1 and the token enters the cache at once (as with
 * g4_session_forward); else the rows are staged as by g4_session_step. */
g4_status g4_session_step_ids(g4_session *s, const int32_t *tokens, int M, int commit, int32_t *ids, g4_error *err);
/* Keeps the first n staged positions of the last step (the rest leave no trace). */
g4_status g4_session_commit(g4_session *s, int n, g4_error *err);

/* Drafting against a session: the drafter's carried hidden and scratch on the session's device. */
typedef struct g4_drafting {
    g4_session *s;
    const g4_drafter *d;
    g4_draft_state ds;  /* CPU */
    float *hid, *carry; /* CPU: saved hidden, the round's carry [H] */
} g4_drafting;

g4_status g4_drafting_init(g4_drafting *dr, g4_session *s, const g4_drafter *d, g4_error *err);
void g4_drafting_free(g4_drafting *dr);
/* The next round starts from the final-normed hidden of row `row` of the last forward. */
g4_status g4_drafting_save(g4_drafting *dr, int row, g4_error *err);
/* One drafter step at query position qpos fed `tok`; begin: first step of a round (the carry
 * restarts from the saved hidden). logits [V] receives the drafter's logits. */
g4_status g4_drafting_step(g4_drafting *dr, int32_t tok, int qpos, int begin, float *logits, g4_error *err);
/* A round of k greedy steps (each fed the previous argmax; on the GPU one launch). first_logits
 * [V] and first_hidden [H] (may be NULL) receive the first step's logits and projected hidden. */
g4_status g4_drafting_greedy(g4_drafting *dr, int32_t tok, int qpos, int k, int32_t *drafts, float *first_logits,
                             float *first_hidden, g4_error *err);
#endif
