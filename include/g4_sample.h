/* g4 sampling: turning one row of logits into a token, and cutting the decoded text stream at
 * user stop strings.
 *
 * Sampler pipeline, always in this order (each stage sees the previous stage's output):
 *
 *   1. penalties    for every distinct token among the last penalty_last_n accepted tokens:
 *                   repetition (CTRL-style): l > 0 ? l / r : l * r, then presence: l - p.
 *                   A token is penalised once however often it occurs in the window.
 *   2. temperature  l / T (computed as (l - max) * (1/T)); T = 0 selects greedy decoding, which
 *                   skips stages 3-6: argmax of the penalised logits, lowest index wins ties.
 *   3. top-k        keep the k highest logits.
 *   4. top-p        keep the smallest set of highest-probability tokens whose probability,
 *                   renormalised over what top-k left, reaches top_p.
 *   5. min-p        keep tokens whose probability is at least min_p times the most likely
 *                   token's (that ratio does not change with renormalisation).
 *   6. sample       draw from what is left, renormalised.
 *
 * Ranking ties (top-k, top-p) are broken by lower token index. Randomness comes from the
 * sampler's own 64-bit generator seeded by options.seed, so a seed reproduces its tokens on every
 * machine; nothing is global, so any number of samplers may live in one process.
 */
#ifndef G4_SAMPLE_H
#define G4_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "g4.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Sampler ----------------------------------------------------------------------------- */

typedef struct g4_sampler_options {
    float temperature;        /* >= 0; 0: greedy. Temperatures so small that 1/T overflows
                                 (below about 3e-39) also decode greedily. */
    int top_k;                /* >= 0; 0 (or >= vocabulary size): off */
    float top_p;              /* in (0, 1]; 1: off */
    float min_p;              /* in [0, 1]; 0: off */
    float repetition_penalty; /* > 0; 1: off. > 1 discourages repeats. */
    float presence_penalty;   /* finite; 0: off. > 0 discourages repeats. */
    int penalty_last_n;       /* in [0, 1 << 24]: accepted tokens the penalties look back over;
                                 0: penalties off */
    uint64_t seed;
} g4_sampler_options;

/* Every filter and penalty off, temperature 1, penalty_last_n 64, seed 0. Start from this rather
 * than from a zeroed struct (top_p = 0 and repetition_penalty = 0 are invalid). */
g4_sampler_options g4_sampler_default_options(void);

/* One sampler per sequence; it is not safe to use one sampler from two threads at once. */
typedef struct g4_sampler g4_sampler;

/* Validates opts (G4_ERR_ARG naming the field) and allocates every scratch buffer for n_vocab
 * up front, so sampling never allocates. */
g4_status g4_sampler_create(const g4_sampler_options *opts, int n_vocab, g4_sampler **out,
                            g4_error *err);
void g4_sampler_free(g4_sampler *s);

/* Forgets the penalty history and restarts the generator from the seed: after a reset the
 * sampler repeats the tokens it gave after create. */
void g4_sampler_reset(g4_sampler *s);

/* Records a token in the penalty history (call it for each token actually appended to the
 * sequence, sampled or forced). Tokens outside [0, n_vocab) are G4_ERR_ARG. */
g4_status g4_sampler_accept(g4_sampler *s, int32_t token, g4_error *err);

/* Draws one token from logits[n_vocab] (n_vocab must equal the create-time size). The caller's
 * logits are never written. NaN or +inf logits are G4_ERR_ARG; -inf is allowed (a banned token)
 * as long as one logit is finite. Consumes one draw of the generator unless greedy. */
g4_status g4_sampler_sample(g4_sampler *s, const float *logits, int n_vocab, int32_t *out_token,
                            g4_error *err);

/* Writes the distribution g4_sampler_sample draws from, after every stage, to probs[n_vocab]:
 * zero for filtered-out tokens, renormalised elsewhere (greedy: one-hot). Does not touch the
 * generator. For tests and for speculative sampling's accept/reject step. */
g4_status g4_sampler_probs(g4_sampler *s, const float *logits, int n_vocab, float *probs,
                           g4_error *err);

/* Stage 1 alone: out[n_vocab] = logits with the current history's penalties applied (out must
 * not overlap logits). */
g4_status g4_sampler_apply_penalties(const g4_sampler *s, const float *logits, int n_vocab,
                                     float *out, g4_error *err);

/* The next uniform double in [0, 1) from the sampler's generator (53 random bits), for callers
 * such as speculative sampling that need randomness from the same seeded stream. */
double g4_sampler_uniform(g4_sampler *s);

/* ---- Stop strings ------------------------------------------------------------------------ */

/* Decoded text arrives in arbitrary chunks (a token's bytes, possibly half a UTF-8 character).
 * The matcher says how much of it may be shown now: it holds back any tail that could still
 * become a stop string, and any incomplete UTF-8 character at the end. A stop string counts as
 * hit as soon as it is complete; when several complete at the same byte the longest (earliest
 * starting) wins. Text before the hit is emitted; the stop string and everything after are not.
 * The result does not depend on how the text was split into chunks. */
typedef struct g4_stop_matcher g4_stop_matcher;

typedef struct g4_stop_result {
    const char *text; /* bytes safe to emit now; owned by the matcher, valid until its next call */
    size_t len;
    int stopped;    /* 1 once a stop string has been hit (text is what preceded it) */
    int stop_index; /* the stop string hit, -1 while none */
} g4_stop_result;

/* stops[n_stops]: non-empty, valid UTF-8 strings (copied). n_stops may be 0. */
g4_status g4_stop_matcher_create(const char *const *stops, int n_stops, g4_stop_matcher **out,
                                 g4_error *err);
void g4_stop_matcher_free(g4_stop_matcher *m);
/* Starts a new stream: drops held-back text and the stopped state. */
void g4_stop_matcher_reset(g4_stop_matcher *m);

/* Feeds the next len bytes of the stream. After a stop, further feeds emit nothing. */
g4_status g4_stop_matcher_feed(g4_stop_matcher *m, const char *text, size_t len,
                               g4_stop_result *res, g4_error *err);

/* End of stream without a stop: emits everything still held back (including a truncated UTF-8
 * character, which can no longer be completed). */
void g4_stop_matcher_flush(g4_stop_matcher *m, g4_stop_result *res);

#ifdef __cplusplus
}
#endif
#endif
