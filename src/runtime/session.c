/* The engine API: model loading, sessions (one sequence's KV cache and scratch), and greedy
 * generation on top of the forward. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "g4.h"
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


g4_status g4_session_create(g4_model *m, const g4_session_options *opts, g4_session **out, g4_error *err) {
    *out = NULL;
    g4_session_options o = {0};
    if (opts) o = *opts;
    if (o.n_ctx < 0 || o.n_threads < 0 || o.max_batch < 0)
        return g4_fail(err, G4_ERR_ARG, "session options must not be negative");
    if (!o.n_ctx) o.n_ctx = 4096;
    if (o.n_ctx > m->cfg.max_positions) o.n_ctx = m->cfg.max_positions;
    if (!o.max_batch) o.max_batch = 64;
    if (o.max_batch > o.n_ctx) o.max_batch = o.n_ctx;
    g4_session *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, G4_ERR_NOMEM, "out of memory");
    s->m = m;
    g4_status st = g4_threadpool_create(o.n_threads, &s->pool, err);
    if (!st) st = g4_state_init(&s->st, m, o.n_ctx, o.max_batch, g4_threadpool_size(s->pool), err);
    if (st) {
        g4_session_free(s);
        return st;
    }
    *out = s;
    return G4_OK;
}

void g4_session_free(g4_session *s) {
    if (!s) return;
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

g4_status g4_session_forward(g4_session *s, const int32_t *tokens, int n, g4_logits_mode mode, float *logits,
                             g4_error *err) {
    if (n <= 0 || !tokens) return g4_fail(err, G4_ERR_ARG, "forward needs at least one token");
    if (mode != G4_LOGITS_NONE && !logits) return g4_fail(err, G4_ERR_ARG, "logits buffer is NULL");
    if (s->st.pos + n > s->st.n_ctx)
        return g4_fail(err, G4_ERR_CONTEXT_FULL,
                       "context full: %d tokens in the cache + %d new exceed the context length %d",
                       s->st.pos, n, s->st.n_ctx);
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

g4_status g4_session_set_dump(g4_session *s, g4_dump_fn fn, void *user, const int *positions, int n_positions) {
    g4_state *st = &s->st;
    free(st->dump_pos);
    st->dump_pos = NULL;
    st->n_dump_pos = 0;
    st->dump = fn;
    st->dump_user = user;
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
