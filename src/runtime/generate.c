/* Generation: plain decoding and lossless speculative decoding with the Gemma 4 drafter.
 *
 * Why speculation cannot change the output: a verify block [t, d1 … dk] is one forward of k+1
 * positions, and the forward's logits for a position are bitwise the same for any block size
 * (the exactness contract); the target's own choice at each position decides which drafts
 * survive, and only the K/V rows of surviving positions are committed (staged rows of rejected
 * positions are dropped, so a sliding-window ring never sees them). Greedy output is therefore
 * identical to plain decoding, logits included; with a sampler, speculative sampling (accept d
 * with probability min(1, p(d)/q(d)), else draw from max(0, p − q)) leaves the distribution
 * unchanged. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/act.h"
#include "g4.h"
#include "g4_sample.h"
#include "model/drafter.h"
#include "runtime/session.h"
#include "util/error.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A generator for the oracle benchmark mode (splitmix64). */
static uint64_t mix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Inverse-CDF draw from probs[n] with u in [0, 1). */
static int32_t draw(const float *probs, int n, double u) {
    double c = 0;
    int32_t last = 0;
    for (int i = 0; i < n; i++) {
        if (probs[i] <= 0) continue;
        c += probs[i];
        last = i;
        if (u < c) return i;
    }
    return last; /* rounding left u above the total */
}

typedef struct {
    g4_session *s;
    const g4_generate_options *o;
    g4_generate_stats *st;
    int V, done;
    g4_error *err;
} gen_ctx;

/* Emits one token: callback, sampler history, stop checks. Returns the g4_status of accepting. */
static g4_status emit(gen_ctx *g, int32_t tok, const float *logits) {
    const g4_generate_options *o = g->o;
    g->st->n_generated++;
    if (o->sampler) {
        g4_status st = g4_sampler_accept(o->sampler, tok, g->err);
        if (st) return st;
    }
    if (o->on_token && o->on_token(o->user, tok, o->no_logits ? NULL : logits, g->V)) g->done = 1;
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop_tokens[i] == tok) g->done = 1;
    if (g->st->n_generated >= o->max_new) g->done = 1;
    return G4_OK;
}

/* The target's choice from one row of logits. */
static g4_status choose(gen_ctx *g, const float *logits, int32_t *tok) {
    if (!g->o->sampler) {
        *tok = g4_argmax(logits, g->V);
        return G4_OK;
    }
    return g4_sampler_sample(g->o->sampler, logits, g->V, tok, g->err);
}

/* Greedy speculation's cost model: the expected tokens per second of a round of k drafts,
 * E(k) / (k·t_draft + t_step(k + 1)) with E(k) = (1 − α^(k+1)) / (1 − α) tokens per round when each
 * draft is right with probability α; times are running averages measured in this call, and a
 * block size not measured yet is extrapolated from the largest measured one below it (the growth
 * per token measured so far, 10% of a step before anything is). Greedy output does not depend on
 * k (lossless), so timing may steer it; with a sampler the draws would, so sampling keeps the
 * acceptance-only rule. */
static double round_rate(const double *t_step, double t_draft, double alpha, int k) {
    int m0 = 1;
    for (int m = 2; m <= k; m++)
        if (t_step[m] > 0) m0 = m;
    double slope = m0 > 1 ? (t_step[m0] - t_step[1]) / (m0 - 1) : 0.1 * t_step[1];
    double tv = t_step[k + 1] > 0 ? t_step[k + 1] : t_step[m0] + (k + 1 - m0) * (slope > 0 ? slope : 0);
    double e = alpha >= 1 ? k + 1 : (1 - pow(alpha, k + 1)) / (1 - alpha);
    return e / (k * t_draft + tv);
}

/* The k in 1..kmax with the best expected rate, or 0 (a plain step) when none beats plain steps
 * and `probe` is not set. */
static int best_k(const double *t_step, double t_draft, double alpha, int kmax, int probe) {
    double best = probe ? 0 : 1.0 / t_step[1];
    int bk = probe ? 1 : 0;
    for (int k = 1; k <= kmax; k++) {
        double r = round_rate(t_step, t_draft, alpha, k);
        if (r > best) {
            best = r;
            bk = k;
        }
    }
    return bk;
}

static void ema(double *avg, double x) { *avg = *avg > 0 ? 0.75 * *avg + 0.25 * x : x; }

g4_status g4_generate(g4_session *s, const int32_t *prompt, int n_prompt, const g4_generate_options *o,
                      g4_generate_stats *stats, g4_error *err) {
    g4_generate_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!o || n_prompt < 1 || !prompt) return g4_fail(err, G4_ERR_ARG, "generation needs options and a prompt of at least one token");
    if (o->max_new < 0) return g4_fail(err, G4_ERR_ARG, "max_new must not be negative");
    if (o->draft_k < 0 || o->draft_k > G4_MAX_DRAFT)
        return g4_fail(err, G4_ERR_ARG, "draft_k %d outside 1..%d", o->draft_k, G4_MAX_DRAFT);
    if (o->drafter && o->drafter->target != s->m)
        return g4_fail(err, G4_ERR_ARG, "the drafter was loaded for another model");
    g4_state *ts = &s->st;
    const g4_config *c = &s->m->cfg;
    int V = c->vocab;
    int kmax = o->draft_k ? o->draft_k : 4;
    if (kmax > ts->max_batch - 1) kmax = ts->max_batch - 1;
    int spec = o->drafter && kmax >= 1;
    /* one allocation per call: verify logits, drafter logits/probabilities */
    size_t rows = spec ? (size_t)kmax + 1 : 1;
    float *logits = malloc(sizeof(float) * rows * V);
    float *dlogits = spec ? malloc(sizeof(float) * V) : NULL;
    float *qprobs = spec && o->sampler ? malloc(sizeof(float) * (size_t)kmax * V) : NULL;
    float *pprobs = spec && o->sampler ? malloc(sizeof(float) * V) : NULL;
    g4_drafting dr = {0};
    g4_status st = G4_OK;
    if (!logits || (spec && !dlogits) || (spec && o->sampler && (!qprobs || !pprobs)))
        st = g4_fail(err, G4_ERR_NOMEM, "out of memory for generation buffers");
    if (!st && spec) st = g4_drafting_init(&dr, s, o->drafter, err);
    gen_ctx g = {s, o, stats, V, 0, err};
    /* greedy on a GPU session without logits for the caller: the device's argmax ids only */
    const int dev = s->cuda && !o->sampler && o->no_logits && !ts->dump;

    double t0 = now_seconds();
    stats->n_prompt = n_prompt;
    if (!st) st = g4_session_forward(s, prompt, n_prompt, G4_LOGITS_LAST, logits, err);
    /* the final-normed hidden of the last prompt position (the drafter's first input) */
    if (!st && spec) st = g4_drafting_save(&dr, ts->n_staged_last - 1, err);
    double t1 = now_seconds();
    stats->prefill_seconds = t1 - t0;
    int32_t t = 0;
    if (!st && o->max_new > 0) {
        st = choose(&g, logits, &t);
        if (!st) st = emit(&g, t, logits);
    } else {
        g.done = 1;
    }
    int k_cur = kmax, skip = 0;
    double acc_ema = 1.0;
    /* greedy adaptive k: step times per block size, draft step time, decayed acceptance counts */
    const int costed = spec && !o->draft_fixed && !o->sampler;
    double t_step[G4_MAX_DRAFT + 2] = {0}, t_draft = 0, n_acc = 0, n_cmp = 0;
    int plain_run = 0;
    uint64_t orng = o->oracle_seed;
    int32_t drafts[G4_MAX_DRAFT];
    while (!st && !g.done) {
        int p = ts->pos; /* t = seq[p] is emitted but not yet in the cache */
        int room = ts->n_ctx - p - 1, remaining = o->max_new - stats->n_generated;
        int k = spec && !skip ? k_cur : 0;
        if (costed) { /* the first step is plain (its time is the yardstick); then the best k by
                         the cost model, 0 where drafting does not pay, and after 32 plain steps
                         one round drafts anyway, to keep α and the times current */
            k = t_step[1] > 0 ? best_k(t_step, t_draft, (n_acc + 1) / (n_cmp + 2), kmax, plain_run >= 32) : 0;
            plain_run = k ? 0 : plain_run + 1;
        }
        if (k > remaining - 1) k = remaining - 1;
        if (k > room) k = room;
        if (k < 0) k = 0;
        if (p >= ts->n_ctx) {
            st = g4_fail(err, G4_ERR_CONTEXT_FULL, "context full: %d tokens fill the context length %d", p, ts->n_ctx);
            break;
        }
        if (skip) skip--;
        if (k == 0) { /* plain step (dev: the token chosen on the device, committed at once) */
            double s0 = now_seconds();
            int32_t id = 0;
            st = dev ? g4_session_step_ids(s, &t, 1, 1, &id, err) : g4_session_step(s, &t, 1, logits, 1, err);
            if (costed) ema(&t_step[1], now_seconds() - s0);
            if (!st && !dev) st = g4_session_commit(s, 1, err);
            if (!st && spec) st = g4_drafting_save(&dr, 0, err);
            if (st) break;
            if (dev) t = id;
            else st = choose(&g, logits, &t);
            if (!st) st = emit(&g, t, logits); /* emit passes NULL under no_logits */
            continue;
        }
        /* draft k tokens, each step feeding the previous proposal and the carried hidden */
        double d0 = now_seconds();
        int32_t in = t;
        if (!o->sampler) /* greedy: k chained steps (one launch on the GPU) */
            st = g4_drafting_greedy(&dr, t, p - 1, k, drafts, NULL, NULL, err);
        for (int i = 0; i < k && !st && o->sampler; i++) {
            st = g4_drafting_step(&dr, in, p - 1, i == 0, dlogits, err);
            if (st) break;
            float *q = qprobs + (size_t)i * V;
            st = g4_sampler_probs(o->sampler, dlogits, V, q, err);
            if (!st) drafts[i] = draw(q, V, g4_sampler_uniform(o->sampler));
            in = drafts[i];
        }
        for (int i = 0; i < k && !st && o->oracle; i++) {
            /* benchmark: each proposal replaced by one right with probability alpha, after the
             * drafter ran (fed its own proposals it costs what it costs fed these) */
            int idx = stats->n_generated + i;
            int32_t truth = idx < o->n_oracle ? o->oracle[idx] : drafts[i];
            double u = (double)(mix64(&orng) >> 11) * 0x1.0p-53;
            drafts[i] = u < o->oracle_alpha ? truth : (truth + 1) % V;
        }
        double d1 = now_seconds();
        stats->draft_seconds += d1 - d0;
        if (costed) ema(&t_draft, (d1 - d0) / k);
        if (st) break;
        /* verify [t, d1 … dk] in one forward */
        int32_t block[G4_MAX_DRAFT + 1];
        block[0] = t;
        memcpy(block + 1, drafts, sizeof(int32_t) * (size_t)k);
        int32_t ids[G4_MAX_DRAFT + 1];
        st = dev ? g4_session_step_ids(s, block, k + 1, 0, ids, err) : g4_session_step(s, block, k + 1, logits, 1, err);
        if (costed) ema(&t_step[k + 1], now_seconds() - d1);
        if (st) break;
        stats->rounds++;
        stats->drafted += k;
        int n = 0, fed = 1; /* accepted drafts; rows whose tokens the cache must keep */
        int32_t next = 0;
        for (int i = 0; i < k && !st; i++) {
            const float *row = logits + (size_t)i * V; /* not filled (and not read) when dev */
            stats->drafted_at[i]++;
            int accept;
            if (o->sampler) {
                st = g4_sampler_probs(o->sampler, row, V, pprobs, err);
                if (st) break;
                const float *q = qprobs + (size_t)i * V;
                double u = g4_sampler_uniform(o->sampler);
                accept = u * q[drafts[i]] < pprobs[drafts[i]];
                if (!accept) { /* residual distribution max(0, p − q) */
                    double z = 0;
                    for (int v = 0; v < V; v++) z += (pprobs[v] = pprobs[v] > q[v] ? pprobs[v] - q[v] : 0);
                    if (z > 0)
                        for (int v = 0; v < V; v++) pprobs[v] = (float)(pprobs[v] / z);
                    else
                        st = g4_sampler_probs(o->sampler, row, V, pprobs, err);
                    next = draw(pprobs, V, g4_sampler_uniform(o->sampler));
                }
            } else {
                next = dev ? ids[i] : g4_argmax(row, V);
                accept = next == drafts[i];
            }
            if (st) break;
            if (!accept) break;
            n++;
            stats->accepted_at[i]++;
            st = emit(&g, drafts[i], row);
            if (g.done) break;
            fed++;
        }
        if (st) break;
        stats->accepted += n;
        if (g.done) { /* a stop inside the drafts: keep the rows before the last emitted token */
            st = g4_session_commit(s, fed, err);
            break;
        }
        const float *row = logits + (size_t)n * V;
        if (n == k) { /* every draft accepted: the bonus token */
            if (dev) next = ids[k];
            else st = choose(&g, row, &next);
        }
        if (st) break;
        st = g4_session_commit(s, n + 1, err);
        if (!st) st = g4_drafting_save(&dr, n, err);
        if (st) break;
        t = next;
        st = emit(&g, t, row);
        if (costed) { /* α for the cost model; drafts compared: the accepted ones and the first rejected one */
            n_acc = 0.9 * n_acc + n;
            n_cmp = 0.9 * n_cmp + (n < k ? n + 1 : n);
        } else if (!o->draft_fixed) {
            /* sampling: grow k after a clean sweep, shrink it to what was accepted; pause drafting
             * while acceptance is too low to pay for the drafter */
            k_cur = n == k ? (k_cur < kmax ? k_cur + 1 : kmax) : (n + 1 < kmax ? n + 1 : kmax);
            acc_ema = 0.8 * acc_ema + 0.2 * ((double)n / k);
            if (acc_ema < 0.15) {
                skip = 16;
                acc_ema = 0.5;
                k_cur = 1;
            }
        }
    }
    stats->decode_seconds = now_seconds() - t1;
    if (spec) g4_drafting_free(&dr);
    free(logits);
    free(dlogits);
    free(qprobs);
    free(pprobs);
    return st;
}

g4_status g4_drafter_propose(g4_drafter *d, g4_session *s, int32_t token, int n_steps, int32_t *drafts,
                             float *first_logits, float *first_hidden, g4_error *err) {
    g4_state *ts = &s->st;
    const g4_config *c = &s->m->cfg;
    if (d->target != s->m) return g4_fail(err, G4_ERR_ARG, "the drafter was loaded for another model");
    if (ts->pos < 1 || ts->n_staged_last < 1 || token < 0 || token >= c->vocab || n_steps < 0)
        return g4_fail(err, G4_ERR_ARG, "drafting needs a session that has run a forward, a valid token and steps >= 0");
    g4_drafting dr;
    g4_status st = g4_drafting_init(&dr, s, d, err);
    if (!st) st = g4_drafting_save(&dr, ts->n_staged_last - 1, err);
    if (!st) st = g4_drafting_greedy(&dr, token, ts->pos - 1, n_steps, drafts, first_logits, first_hidden, err);
    g4_drafting_free(&dr);
    return st;
}

typedef struct {
    int32_t *out;
    int n;
} collect_ctx;

static int collect_token(void *user, int32_t tok, const float *logits, int n_vocab) {
    (void)logits;
    (void)n_vocab;
    collect_ctx *c = user;
    c->out[c->n++] = tok;
    return 0;
}

g4_status g4_generate_greedy(g4_session *s, const int32_t *prompt, int n_prompt, int max_new, const int32_t *stop,
                             int n_stop, int32_t *out, int *n_out, g4_error *err) {
    collect_ctx c = {out, 0};
    g4_generate_options o = {.max_new = max_new, .stop_tokens = stop, .n_stop = n_stop, .on_token = collect_token, .user = &c,
                             .no_logits = 1};
    g4_status st = g4_generate(s, prompt, n_prompt, &o, NULL, err);
    *n_out = c.n;
    return st;
}
