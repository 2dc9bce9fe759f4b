/* The engine API: model loading, sessions (one sequence's KV cache and scratch), and greedy
 * generation on top of the forward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/act.h"
#include "g4.h"
#ifdef G4_HAVE_CUDA
#include "cuda/cuda.h"
#endif
#include "model/forward.h"
#include "model/model.h"
#include "util/error.h"
#include "util/threadpool.h"
#include "runtime/session.h"

void g4_model_get_info(const g4_model *m, g4_model_info *info) {
    const g4_config *c = &m->cfg;
    memset(info, 0, sizeof *info);
    info->arch = c->arch;
    info->n_layers = c->n_layers;
    info->hidden = c->hidden;
    info->n_heads = c->n_heads;
    info->vocab = c->vocab;
    info->n_kv_shared = c->n_kv_shared;
    info->ple_width = c->ple_width;
    info->sliding_window = c->sliding_window;
    info->n_experts = c->moe ? c->n_experts : 0;
    info->top_k_experts = c->moe ? c->top_k_experts : 0;
    info->bos = c->bos;
    info->eos = c->eos;
    info->embed_scale = m->embed_scale;
    info->final_softcap = c->final_softcap;
    info->weight_bytes = m->weight_bytes;
}

g4_status g4_model_get_layer(const g4_model *m, int layer, g4_layer_info *info) {
    if (layer < 0 || layer >= m->cfg.n_layers) return G4_ERR_ARG;
    const g4_layer_config *l = &m->cfg.layers[layer];
    info->is_full = l->is_full;
    info->head_dim = l->head_dim;
    info->n_kv_heads = l->n_kv_heads;
    info->kv_source = l->kv_source;
    info->mlp_width = l->mlp_width;
    info->k_eq_v = l->k_eq_v;
    return G4_OK;
}


g4_status g4_device_probe(int device, char *desc, size_t desc_len, g4_error *err) {
    if (device == G4_DEVICE_CPU) {
        if (desc && desc_len) snprintf(desc, desc_len, "cpu");
        return G4_OK;
    }
    if (device != G4_DEVICE_CUDA) return g4_fail(err, G4_ERR_ARG, "unknown device %d", device);
#ifdef G4_HAVE_CUDA
    return g4_cuda_probe(desc, desc_len, err);
#else
    if (desc && desc_len) desc[0] = 0;
    return g4_fail(err, G4_ERR_UNSUPPORTED, "no CUDA device/driver: this g4 was built without CUDA");
#endif
}

g4_status g4_session_create(g4_model *m, const g4_session_options *opts, g4_session **out, g4_error *err) {
    *out = NULL;
    g4_session_options o = {0};
    if (opts) o = *opts;
    if (o.n_ctx < 0 || o.n_threads < 0 || o.max_batch < 0)
        return g4_fail(err, G4_ERR_ARG, "session options must not be negative");
    if (o.device != G4_DEVICE_CPU && o.device != G4_DEVICE_CUDA)
        return g4_fail(err, G4_ERR_ARG, "unknown device %d", o.device);
    if (o.kv_type != G4_KV_F32 && o.kv_type != G4_KV_BF16)
        return g4_fail(err, G4_ERR_ARG, "unknown KV cache type %d (G4_KV_F32 or G4_KV_BF16)", o.kv_type);
    if (o.kv_type == G4_KV_BF16 && o.device == G4_DEVICE_CUDA)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "a bf16 KV cache is not supported on the GPU yet (CPU sessions only)");
#ifndef G4_HAVE_CUDA
    if (o.device == G4_DEVICE_CUDA)
        return g4_fail(err, G4_ERR_UNSUPPORTED, "no CUDA device/driver: this g4 was built without CUDA (nvcc not found)");
#endif
    if (!o.n_ctx) o.n_ctx = 4096;
    if (o.n_ctx > m->cfg.max_positions) o.n_ctx = m->cfg.max_positions;
    if (!o.max_batch) /* the fast prefill's chunk (H200, pp512 E2B bf16, mma.sync GEMMs: 8.7k tok/s at 256, 11.4k at 512) */
        o.max_batch = o.device == G4_DEVICE_CUDA && o.fast_prefill ? 512 : 64;
    if (o.max_batch > o.n_ctx) o.max_batch = o.n_ctx;
    g4_session *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    s->m = m;
    s->fast_prefill = o.fast_prefill != 0;
    g4_status st = g4_threadpool_create(o.device == G4_DEVICE_CUDA ? 1 : o.n_threads, &s->pool, err);
#ifdef G4_HAVE_CUDA
    if (!st && o.device == G4_DEVICE_CUDA) {
        st = g4_cuda_create(m, o.n_ctx, o.max_batch, &s->cuda, err);
        s->st.m = m;
        s->st.n_ctx = o.n_ctx;
        s->st.max_batch = o.max_batch;
        s->st.n_threads = 1;
    } else
#endif
        if (!st)
        st = g4_state_init(&s->st, m, o.n_ctx, o.max_batch, g4_threadpool_size(s->pool), o.kv_type == G4_KV_BF16, err);
    if (st) {
        g4_session_free(s);
        return st;
    }
    *out = s;
    return G4_OK;
}

void g4_session_free(g4_session *s) {
    if (!s) return;
#ifdef G4_HAVE_CUDA
    g4_cuda_free(s->cuda);
#endif
    g4_state_free(&s->st);
    g4_threadpool_free(s->pool);
    free(s);
}

void g4_session_reset(g4_session *s) {
    s->st.pos = 0;
    s->st.n_staged = 0;
}

int g4_session_pos(const g4_session *s) { return s->st.pos; }
int g4_session_ctx(const g4_session *s) { return s->st.n_ctx; }

#ifdef G4_HAVE_CUDA
/* The CPU forward's dump points that the CUDA backend keeps, for rows [lm_from, M) or all. */
static g4_status cuda_dump(g4_session *s, int M, int lm_from, g4_error *err) {
    g4_state *st = &s->st;
    const g4_config *c = &s->m->cfg;
    static const char *const names[] = {"embed", "ple", "layer_out", "final_norm", "logits"};
    float *buf = NULL;
    g4_status rc = G4_OK;
    for (int k = 0; k < 5 && !rc; k++) {
        int per_layer = k == 2, m0 = k >= 3 ? lm_from : 0;
        if (k == 1 && !c->ple_width) continue;
        for (int layer = per_layer ? 0 : -1; layer < (per_layer ? c->n_layers : 0) && !rc; layer++) {
            int len = 0;
            if ((rc = g4_cuda_read(s->cuda, names[k], layer, m0, M - m0, NULL, &len, err))) break;
            float *nb = realloc(buf, sizeof(float) * (size_t)len * (size_t)M);
            if (!nb) {
                rc = g4_fail(err, G4_ERR_NOMEM, "out of memory for dumps");
                break;
            }
            buf = nb;
            if ((rc = g4_cuda_read(s->cuda, names[k], layer, m0, M - m0, buf, &len, err))) break;
            for (int m = m0; m < M; m++) {
                int pos = st->pos + m, hit = st->n_dump_pos < 0;
                for (int i = 0; i < st->n_dump_pos && !hit; i++) hit = st->dump_pos[i] == pos;
                if (hit) st->dump(st->dump_user, names[k], layer, pos, buf + (size_t)(m - m0) * len, len);
            }
        }
    }
    free(buf);
    return rc;
}

/* A forward of n tokens on the GPU, max_batch at a time: a prompt (n > 1) runs the prefill procedure
 * in every chunk, however short, when fast_prefill is set (its logits do not depend on the chunk
 * size); otherwise every chunk runs the decode procedure, bitwise the same as one token at a time.
 * A single token goes straight into the cache. */
static g4_status cuda_forward(g4_session *s, const int32_t *tokens, int n, g4_logits_mode mode, float *logits,
                              g4_error *err) {
    g4_state *st = &s->st;
    size_t V = (size_t)s->m->cfg.vocab;
    const int prefill = n > 1 && s->fast_prefill;
    for (int done = 0; done < n;) {
        int M = n - done < st->max_batch ? n - done : st->max_batch;
        int last = done + M == n, want = mode == G4_LOGITS_ALL || (mode == G4_LOGITS_LAST && last);
        int lm_from = mode == G4_LOGITS_ALL ? 0 : M - 1, direct = M == 1 && !prefill;
        float *lg = mode == G4_LOGITS_ALL ? logits + (size_t)done * V : want ? logits : NULL;
        g4_status rc = prefill ? g4_cuda_prefill(s->cuda, st->pos, tokens + done, M, lm_from, want, lg, err)
                               : g4_cuda_forward(s->cuda, st->pos, tokens + done, M, lm_from, want, lg, direct, err);
        if (!rc && st->dump) rc = cuda_dump(s, M, lm_from, err);
        if (!rc && !direct) rc = g4_cuda_commit(s->cuda, st->pos, M, err);
        if (rc) return rc;
        st->stage_pos = st->pos;
        st->n_staged_last = M;
        st->n_staged = 0;
        st->pos += M;
        done += M;
    }
    return G4_OK;
}
#endif

g4_status g4_session_forward(g4_session *s, const int32_t *tokens, int n, g4_logits_mode mode, float *logits,
                             g4_error *err) {
    if (n <= 0 || !tokens) return g4_fail(err, G4_ERR_ARG, "forward needs at least one token");
    if (mode != G4_LOGITS_NONE && !logits) return g4_fail(err, G4_ERR_ARG, "logits buffer is NULL");
    if (s->st.pos + n > s->st.n_ctx)
        return g4_fail(err, G4_ERR_CONTEXT_FULL,
                       "context full: %d tokens in the cache + %d new exceed the context length %d",
                       s->st.pos, n, s->st.n_ctx);
    const g4_config *c = &s->m->cfg;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab || (c->ple_width && tokens[i] >= c->ple_vocab))
            return g4_fail(err, G4_ERR_ARG, "token id %d at index %d is outside the vocabulary (%d)", tokens[i], i,
                           c->vocab);
#ifdef G4_HAVE_CUDA
    if (s->cuda) return cuda_forward(s, tokens, n, mode, logits, err);
#endif
    size_t V = (size_t)s->m->cfg.vocab;
    for (int done = 0; done < n;) {
        int M = n - done < s->st.max_batch ? n - done : s->st.max_batch;
        int last = done + M == n;
        float *lg = NULL;
        if (mode == G4_LOGITS_ALL) lg = logits + (size_t)done * V;
        else if (mode == G4_LOGITS_LAST && last) lg = logits;
        g4_status st = g4_forward(&s->st, s->pool, tokens + done, M, lg, mode == G4_LOGITS_ALL, err);
        if (st) return st;
        g4_state_commit(&s->st, M);
        done += M;
    }
    return G4_OK;
}

#ifdef G4_HAVE_CUDA
/* a step's block on a GPU session: size, room, token ids */
static g4_status check_step(const g4_session *s, const int32_t *tokens, int M, g4_error *err) {
    const g4_state *st = &s->st;
    const g4_config *c = &s->m->cfg;
    if (M <= 0 || M > st->max_batch)
        return g4_fail(err, G4_ERR_ARG, "forward of %d tokens (1..%d allowed per step)", M, st->max_batch);
    if (st->pos + M > st->n_ctx)
        return g4_fail(err, G4_ERR_CONTEXT_FULL, "context full: %d tokens in the cache + %d new exceed the context length %d",
                       st->pos, M, st->n_ctx);
    for (int m = 0; m < M; m++)
        if (tokens[m] < 0 || tokens[m] >= c->vocab || (c->ple_width && tokens[m] >= c->ple_vocab))
            return g4_fail(err, G4_ERR_ARG, "token id %d at index %d is outside the vocabulary (%d)", tokens[m], m,
                           c->vocab);
    return G4_OK;
}
#endif

g4_status g4_session_step_ids(g4_session *s, const int32_t *tokens, int M, int commit, int32_t *ids, g4_error *err) {
#ifdef G4_HAVE_CUDA
    if (s->cuda) {
        g4_state *st = &s->st;
        if (commit && M != 1) return g4_fail(err, G4_ERR_ARG, "a committed step takes one token, not %d", M);
        g4_status rc = check_step(s, tokens, M, err);
        if (!rc) rc = g4_cuda_forward_ids(s->cuda, st->pos, tokens, M, commit, ids, err);
        if (rc) return rc;
        st->stage_pos = st->pos;
        st->n_staged_last = M;
        st->n_staged = commit ? 0 : M;
        if (commit) st->pos += M;
        return G4_OK;
    }
#else
    (void)s;
    (void)tokens;
    (void)M;
    (void)commit;
    (void)ids;
#endif
    return g4_fail(err, G4_ERR_ARG, "token ids without logits need a GPU session");
}

g4_status g4_session_step(g4_session *s, const int32_t *tokens, int M, float *logits, int all_logits, g4_error *err) {
    g4_state *st = &s->st;
#ifdef G4_HAVE_CUDA
    if (s->cuda) {
        g4_status ck = check_step(s, tokens, M, err);
        if (ck) return ck;
        int lm_from = all_logits ? 0 : M - 1;
        g4_status rc = g4_cuda_forward(s->cuda, st->pos, tokens, M, lm_from, logits != NULL, logits, 0, err);
        if (rc) return rc;
        st->stage_pos = st->pos;
        st->n_staged = M;
        st->n_staged_last = M;
        return G4_OK;
    }
#endif
    return g4_forward(st, s->pool, tokens, M, logits, all_logits, err);
}

g4_status g4_session_commit(g4_session *s, int n, g4_error *err) {
    g4_state *st = &s->st;
#ifdef G4_HAVE_CUDA
    if (s->cuda) {
        if (n > st->n_staged) n = st->n_staged;
        g4_status rc = n > 0 ? g4_cuda_commit(s->cuda, st->stage_pos, n, err) : G4_OK;
        st->pos = st->stage_pos + n;
        st->n_staged = 0;
        return rc;
    }
#endif
    (void)err;
    g4_state_commit(st, n);
    return G4_OK;
}

/* ---- drafting ------------------------------------------------------------------------------ */

g4_status g4_drafting_init(g4_drafting *dr, g4_session *s, const g4_drafter *d, g4_error *err) {
    memset(dr, 0, sizeof *dr);
    dr->s = s;
    dr->d = d;
    if (d->target != s->m) return g4_fail(err, G4_ERR_ARG, "the drafter was loaded for another model");
#ifdef G4_HAVE_CUDA
    if (s->cuda) return g4_cuda_draft_attach(s->cuda, d, err);
#endif
    int H = s->m->cfg.hidden;
    dr->hid = malloc(sizeof(float) * (size_t)H);
    dr->carry = malloc(sizeof(float) * (size_t)H);
    if (!dr->hid || !dr->carry) {
        g4_drafting_free(dr);
        return g4_fail(err, G4_ERR_NOMEM, "out of memory for drafting");
    }
    g4_status st = g4_draft_state_init(&dr->ds, d, s->st.n_ctx, err);
    if (st) {
        free(dr->hid);
        free(dr->carry);
        dr->hid = dr->carry = NULL;
    }
    return st;
}

void g4_drafting_free(g4_drafting *dr) {
    if (dr->hid) g4_draft_state_free(&dr->ds);
    free(dr->hid);
    free(dr->carry);
    memset(dr, 0, sizeof *dr);
}

g4_status g4_drafting_save(g4_drafting *dr, int row, g4_error *err) {
#ifdef G4_HAVE_CUDA
    if (dr->s->cuda) return g4_cuda_save_hidden(dr->s->cuda, row, err);
#endif
    (void)err;
    int H = dr->s->m->cfg.hidden;
    memcpy(dr->hid, dr->s->st.a + (size_t)row * H, sizeof(float) * (size_t)H);
    return G4_OK;
}

g4_status g4_drafting_step(g4_drafting *dr, int32_t tok, int qpos, int begin, float *logits, g4_error *err) {
#ifdef G4_HAVE_CUDA
    if (dr->s->cuda) {
        int32_t one;
        return g4_cuda_draft(dr->s->cuda, tok, qpos, 1, begin, &one, logits, NULL, err);
    }
#endif
    (void)err;
    if (begin) memcpy(dr->carry, dr->hid, sizeof(float) * (size_t)dr->s->m->cfg.hidden);
    g4_draft_step(dr->d, &dr->ds, &dr->s->st, dr->s->pool, tok, dr->carry, qpos, logits);
    return G4_OK;
}

g4_status g4_drafting_greedy(g4_drafting *dr, int32_t tok, int qpos, int k, int32_t *drafts, float *first_logits,
                             float *first_hidden, g4_error *err) {
    if (k <= 0) return G4_OK;
#ifdef G4_HAVE_CUDA
    if (dr->s->cuda) {
        g4_cuda *c = dr->s->cuda;
        if (!first_logits && !first_hidden) return g4_cuda_draft(c, tok, qpos, k, 1, drafts, NULL, NULL, err);
        g4_status rc = g4_cuda_draft(c, tok, qpos, 1, 1, drafts, first_logits, first_hidden, err);
        if (!rc && k > 1) rc = g4_cuda_draft(c, drafts[0], qpos, k - 1, 0, drafts + 1, NULL, NULL, err);
        return rc;
    }
#endif
    int V = dr->s->m->cfg.vocab, H = dr->s->m->cfg.hidden;
    float *lg = malloc(sizeof(float) * (size_t)V);
    if (!lg) return g4_fail(err, G4_ERR_NOMEM, "out of memory for drafting");
    for (int i = 0; i < k; i++) {
        g4_drafting_step(dr, tok, qpos, i == 0, lg, err);
        if (i == 0 && first_logits) memcpy(first_logits, lg, sizeof(float) * (size_t)V);
        if (i == 0 && first_hidden) memcpy(first_hidden, dr->carry, sizeof(float) * (size_t)H);
        drafts[i] = tok = g4_argmax(lg, V);
    }
    free(lg);
    return G4_OK;
}

g4_status g4_session_set_dump(g4_session *s, g4_dump_fn fn, void *user, const int *positions, int n_positions) {
    g4_state *st = &s->st;
    free(st->dump_pos);
    st->dump_pos = NULL;
    st->n_dump_pos = 0;
    st->dump = fn;
    st->dump_user = user;
#ifdef G4_HAVE_CUDA
    if (s->cuda && g4_cuda_set_debug(s->cuda, fn != NULL, NULL)) {
        st->dump = NULL;
        return G4_ERR_NOMEM;
    }
#endif
    if (!fn) return G4_OK;
    if (!positions || n_positions < 0) {
        st->n_dump_pos = -1;
        return G4_OK;
    }
    st->dump_pos = malloc(sizeof(int) * (size_t)(n_positions ? n_positions : 1));
    if (!st->dump_pos) return G4_ERR_NOMEM;
    memcpy(st->dump_pos, positions, sizeof(int) * (size_t)n_positions);
    st->n_dump_pos = n_positions;
    return G4_OK;
}
