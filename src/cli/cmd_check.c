/* g4 check DIR: conformance against a folder in the fixture format (../shared/fixtures/README.md):
 * teacher-forced logits and hidden rows against the reference, then greedy agreement. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cpu/act.h"
#include "g4.h"

static void check_usage(FILE *f) {
    fprintf(f,
            "usage: g4 check DIR [options]\n"
            "  Loads the model in DIR, runs reference.json's tokens with teacher forcing and compares\n"
            "  logits, hidden rows (and per-layer inputs) with the recorded files, then greedy decoding.\n"
            "  Fails (exit 1) when a logit differs by more than 2e-3 or a greedy token differs where\n"
            "  the recorded top-2 margin exceeds 1e-3.\n"
            "options:\n"
            "  --threads N      worker threads (default: all CPUs)\n"
            "  --chunk N        tokens per forward step (default 64)\n"
            "  --device D       cpu (default) or cuda\n"
            "  --fast-prefill   GPU: the prompt with the tensor-core prefill (else the decode procedure)\n"
            "  --dump OUTDIR    write named intermediates as OUTDIR/<name>.f32, rows ordered\n"
            "                   [layer][position][values] as in the fixture's hidden.f32 (rows of\n"
            "                   narrower layers zero-padded to the widest), plus\n"
            "                   OUTDIR/hidden.f32 in exactly the fixture's row order\n"
            "  --dump-pos LIST  comma-separated positions to dump (default: all)\n");
}

/* ---- reading the fixture -------------------------------------------------------------------- */

static int read_f32(const char *dir, const char *name, size_t want, float **out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "g4 check: %s: %s\n", path, strerror(errno));
        return -1;
    }
    *out = malloc(want * sizeof(float) + 1);
    size_t got = *out ? fread(*out, sizeof(float), want, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != want || extra) {
        fprintf(stderr, "g4 check: %s: expected %zu float32 values, file size disagrees\n", path, want);
        free(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

static int json_ints(const cJSON *arr, int32_t **out, int *n, const char *what) {
    if (!cJSON_IsArray(arr)) {
        fprintf(stderr, "g4 check: reference.json: \"%s\" is missing or not an array\n", what);
        return -1;
    }
    *n = cJSON_GetArraySize(arr);
    *out = malloc(sizeof(int32_t) * (size_t)(*n ? *n : 1));
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e)) {
            fprintf(stderr, "g4 check: reference.json: \"%s\"[%d] is not a number\n", what, i);
            free(*out);
            *out = NULL;
            return -1;
        }
        (*out)[i] = (int32_t)e->valuedouble;
    }
    return 0;
}

/* ---- collecting intermediates ----------------------------------------------------------------- */

typedef struct {
    char name[32];
    int n;          /* values per row */
    int min_layer, max_layer;
    float *rows;    /* [layer - min_layer][pos index][n] */
} dump_buf;

typedef struct {
    int n_pos;
    int *pos;       /* positions wanted, ascending; NULL: 0..n_pos-1 */
    int n_layers;
    dump_buf bufs[32];
    int n_bufs;
    int failed;
} collector;

static int pos_index(const collector *c, int pos) {
    if (!c->pos) return pos < c->n_pos ? pos : -1;
    for (int i = 0; i < c->n_pos; i++)
        if (c->pos[i] == pos) return i;
    return -1;
}

static void collect(void *user, const char *name, int layer, int pos, const float *data, int n) {
    collector *c = user;
    int pi = pos_index(c, pos);
    if (pi < 0) return;
    dump_buf *b = NULL;
    for (int i = 0; i < c->n_bufs && !b; i++)
        if (!strcmp(c->bufs[i].name, name)) b = &c->bufs[i];
    if (!b) {
        if (c->n_bufs == 32) return;
        b = &c->bufs[c->n_bufs++];
        snprintf(b->name, sizeof b->name, "%s", name);
        b->n = n;
        b->min_layer = layer < 0 ? -1 : 0;
        b->max_layer = layer < 0 ? -1 : c->n_layers - 1;
        size_t rows = (size_t)(b->max_layer - b->min_layer + 1) * c->n_pos;
        b->rows = calloc(rows * (size_t)n, sizeof(float));
        if (!b->rows) c->failed = 1;
    }
    if (!b->rows) return;
    size_t rows = (size_t)(b->max_layer - b->min_layer + 1) * c->n_pos;
    if (n > b->n) { /* a wider layer (full attention's larger head dim): widen every row, zero-padded */
        float *wide = calloc(rows * (size_t)n, sizeof(float));
        if (!wide) {
            c->failed = 1;
            return;
        }
        for (size_t r = 0; r < rows; r++) memcpy(wide + r * n, b->rows + r * b->n, sizeof(float) * b->n);
        free(b->rows);
        b->rows = wide;
        b->n = n;
    }
    memcpy(b->rows + ((size_t)(layer - b->min_layer) * c->n_pos + pi) * b->n, data, sizeof(float) * n);
}

static const dump_buf *find_buf(const collector *c, const char *name) {
    for (int i = 0; i < c->n_bufs; i++)
        if (!strcmp(c->bufs[i].name, name)) return &c->bufs[i];
    return NULL;
}

static void collector_free(collector *c) {
    for (int i = 0; i < c->n_bufs; i++) free(c->bufs[i].rows);
}

static int write_dump(const collector *c, const char *outdir) {
    mkdir(outdir, 0777);
    char path[4096];
    for (int i = 0; i < c->n_bufs; i++) {
        const dump_buf *b = &c->bufs[i];
        snprintf(path, sizeof path, "%s/%s.f32", outdir, b->name);
        FILE *f = fopen(path, "wb");
        size_t rows = (size_t)(b->max_layer - b->min_layer + 1) * c->n_pos;
        if (!f || fwrite(b->rows, sizeof(float) * b->n, rows, f) != rows) {
            fprintf(stderr, "g4 check: cannot write %s\n", path);
            if (f) fclose(f);
            return -1;
        }
        fclose(f);
        printf("dumped %s: [%d][%d][%d]\n", path, b->max_layer - b->min_layer + 1, c->n_pos, b->n);
    }
    /* the fixture's hidden.f32 order: embed, the stream after each layer, the final norm */
    const dump_buf *e = find_buf(c, "embed"), *lo = find_buf(c, "layer_out"), *fn = find_buf(c, "final_norm");
    if (e && lo && fn) {
        snprintf(path, sizeof path, "%s/hidden.f32", outdir);
        FILE *f = fopen(path, "wb");
        size_t per = (size_t)c->n_pos * e->n;
        int ok = f && fwrite(e->rows, sizeof(float), per, f) == per &&
                 fwrite(lo->rows, sizeof(float), per * c->n_layers, f) == per * c->n_layers &&
                 fwrite(fn->rows, sizeof(float), per, f) == per;
        if (f) fclose(f);
        if (!ok) {
            fprintf(stderr, "g4 check: cannot write %s\n", path);
            return -1;
        }
        printf("dumped %s: [%d][%d][%d]\n", path, c->n_layers + 2, c->n_pos, e->n);
    }
    return 0;
}

/* ---- the check ------------------------------------------------------------------------------ */

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

/* ---- the drafter (DIR/assistant) ----------------------------------------------------------- */

typedef struct {
    int32_t *tokens;
    float *logits;
    int n, cap, V;
} token_log;

static int log_token(void *user, int32_t tok, const float *logits, int n_vocab) {
    token_log *l = user;
    if (l->n < l->cap) {
        l->tokens[l->n] = tok;
        memcpy(l->logits + (size_t)l->n * n_vocab, logits, sizeof(float) * n_vocab);
        l->n++;
    }
    return 0;
}

/* Draft tokens and first-step logits of every case, then drafted greedy generation == plain. */
static int check_assistant(const char *dir, g4_model *model, g4_session *sess, const int32_t *gprompt, int n_gp,
                           int n_gen, int V, int H, int *ok) {
    char adir[4096], path[4200];
    snprintf(adir, sizeof adir, "%s/assistant", dir);
    snprintf(path, sizeof path, "%s/config.json", adir);
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    g4_error err = {0};
    g4_drafter *d = NULL;
    cJSON *ref = NULL;
    int32_t *seq = NULL, *want = NULL;
    float *lg = NULL, *want_lg = NULL, *hid = NULL, *want_hid = NULL;
    token_log plain = {0}, drafted = {0};
    int rc = -1;
    if (g4_drafter_load(adir, model, &d, &err)) {
        fprintf(stderr, "g4 check: %s\n", err.message);
        goto out;
    }
    snprintf(path, sizeof path, "%s/reference.json", adir);
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long len = 0;
    if (f && !fseek(f, 0, SEEK_END) && (len = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) && (text = malloc((size_t)len + 1)) &&
        fread(text, 1, (size_t)len, f) == (size_t)len) {
        text[len] = 0;
        ref = cJSON_Parse(text);
    }
    if (f) fclose(f);
    free(text);
    int n_seq = 0;
    const cJSON *cases = ref ? cJSON_GetObjectItem(ref, "cases") : NULL, *nds = ref ? cJSON_GetObjectItem(ref, "num_draft_steps") : NULL;
    if (!cJSON_IsArray(cases) || !cJSON_IsNumber(nds) || nds->valueint < 1 || nds->valueint > 64 ||
        json_ints(cJSON_GetObjectItem(ref, "sequence"), &seq, &n_seq, "sequence")) {
        fprintf(stderr, "g4 check: %s: needs \"sequence\", \"num_draft_steps\" and \"cases\"\n", path);
        goto out;
    }
    int steps = nds->valueint, agree = 0, total = 0, ncase = 0;
    double worst_lg = 0, worst_h = 0;
    lg = malloc(sizeof(float) * V);
    hid = malloc(sizeof(float) * H);
    int32_t drafts[64];
    for (const cJSON *cs = cases->child; cs; cs = cs->next, ncase++) {
        const cJSON *jp = cJSON_GetObjectItem(cs, "p"), *lf = cJSON_GetObjectItem(cs, "step1_logits_file"),
                    *hf = cJSON_GetObjectItem(cs, "step1_projected_hidden_file");
        int n_want = 0;
        free(want);
        want = NULL;
        if (!cJSON_IsNumber(jp) || jp->valueint < 1 || jp->valueint >= n_seq || !cJSON_IsString(lf) ||
            json_ints(cJSON_GetObjectItem(cs, "draft_tokens"), &want, &n_want, "draft_tokens") || n_want > steps) {
            fprintf(stderr, "g4 check: %s: case %d is malformed\n", path, ncase);
            goto out;
        }
        int p = jp->valueint;
        free(want_lg);
        free(want_hid);
        want_hid = NULL;
        if (read_f32(adir, lf->valuestring, (size_t)V, &want_lg)) goto out;
        if (cJSON_IsString(hf) && read_f32(adir, hf->valuestring, (size_t)H, &want_hid)) goto out;
        g4_session_reset(sess);
        if (g4_session_forward(sess, seq, p, G4_LOGITS_NONE, NULL, &err) ||
            g4_drafter_propose(d, sess, seq[p], n_want, drafts, lg, hid, &err)) {
            fprintf(stderr, "g4 check: %s\n", err.message);
            goto out;
        }
        for (int i = 0; i < n_want; i++) agree += drafts[i] == want[i];
        total += n_want;
        double e = max_abs_diff(lg, want_lg, (size_t)V);
        worst_lg = e > worst_lg ? e : worst_lg;
        if (want_hid) {
            double r = max_abs_diff(hid, want_hid, (size_t)H) / (max_abs(want_hid, (size_t)H) + 1e-9);
            worst_h = r > worst_h ? r : worst_h;
        }
    }
    printf("  drafter: %d cases, draft tokens %d/%d, step-1 logits max |error| %.2e, projected hidden rel. error %.1e\n",
           ncase, agree, total, worst_lg, worst_h);
    if (agree != total || !(worst_lg <= 2e-3)) *ok = 0;
    /* drafted greedy == plain greedy, tokens and logits bitwise, for k = 1..6 */
    plain = (token_log){malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
    drafted = (token_log){malloc(sizeof(int32_t) * n_gen), malloc(sizeof(float) * (size_t)n_gen * V), 0, n_gen, V};
    g4_generate_options o = {.max_new = n_gen, .on_token = log_token, .user = &plain};
    g4_session_reset(sess);
    if (g4_generate(sess, gprompt, n_gp, &o, NULL, &err)) {
        fprintf(stderr, "g4 check: %s\n", err.message);
        goto out;
    }
    int same_all = 1, acc = 0, drf = 0;
    for (int k = 1; k <= 6; k++) {
        drafted.n = 0;
        g4_generate_options od = {.max_new = n_gen, .on_token = log_token, .user = &drafted, .drafter = d, .draft_k = k,
                                  .draft_fixed = 1};
        g4_generate_stats gs;
        g4_session_reset(sess);
        if (g4_generate(sess, gprompt, n_gp, &od, &gs, &err)) {
            fprintf(stderr, "g4 check: %s\n", err.message);
            goto out;
        }
        int same = drafted.n == plain.n && !memcmp(drafted.tokens, plain.tokens, sizeof(int32_t) * plain.n) &&
                   !memcmp(drafted.logits, plain.logits, sizeof(float) * (size_t)plain.n * V);
        if (!same) printf("  drafted generation with k = %d differs from plain greedy\n", k);
        same_all &= same;
        acc += gs.accepted;
        drf += gs.drafted;
    }
    printf("  drafted greedy (k = 1..6, %d tokens each): %s; %d of %d drafts accepted\n", n_gen,
           same_all ? "identical to plain greedy, tokens and logits bitwise" : "DIFFERS", acc, drf);
    if (!same_all) *ok = 0;
    rc = 1;
out:
    g4_drafter_free(d);
    cJSON_Delete(ref);
    free(seq);
    free(want);
    free(lg);
    free(want_lg);
    free(hid);
    free(want_hid);
    free(plain.tokens);
    free(plain.logits);
    free(drafted.tokens);
    free(drafted.logits);
    return rc;
}

int cmd_check(int argc, char **argv) {
    const char *dir = NULL, *dump_dir = NULL, *dump_pos = NULL;
    int threads = 0, chunk = 64, device = G4_DEVICE_CPU, fast_prefill = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            check_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int(a, i + 1 < argc ? argv[++i] : NULL, 1, 256, &threads)) return 2;
        } else if (!strcmp(a, "--chunk")) {
            if (cli_parse_int(a, i + 1 < argc ? argv[++i] : NULL, 1, 1 << 20, &chunk)) return 2;
        } else if (!strcmp(a, "--device")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "cpu")) device = G4_DEVICE_CPU;
            else if (!strcmp(v, "cuda")) device = G4_DEVICE_CUDA;
            else {
                fprintf(stderr, "g4 check: --device: '%s' is not cpu or cuda\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--fast-prefill")) {
            fast_prefill = 1;
        } else if (!strcmp(a, "--dump")) {
            dump_dir = i + 1 < argc ? argv[++i] : NULL;
        } else if (!strcmp(a, "--dump-pos")) {
            dump_pos = i + 1 < argc ? argv[++i] : NULL;
        } else if (a[0] == '-') {
            fprintf(stderr, "g4 check: unknown option '%s'\n", a);
            check_usage(stderr);
            return 2;
        } else if (!dir) {
            dir = a;
        } else {
            fprintf(stderr, "g4 check: more than one folder given\n");
            return 2;
        }
    }
    if (!dir) {
        check_usage(stderr);
        return 2;
    }
    int rc = 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    FILE *rf = fopen(path, "rb");
    if (!rf) {
        fprintf(stderr, "g4 check: %s: %s\n", path, strerror(errno));
        return 1;
    }
    fseek(rf, 0, SEEK_END);
    long rlen = ftell(rf);
    fseek(rf, 0, SEEK_SET);
    char *rtext = malloc((size_t)rlen + 1);
    size_t rgot = rtext ? fread(rtext, 1, (size_t)rlen, rf) : 0;
    fclose(rf);
    if (!rtext || rgot != (size_t)rlen) {
        fprintf(stderr, "g4 check: %s: read error\n", path);
        free(rtext);
        return 1;
    }
    rtext[rlen] = 0;
    cJSON *ref = cJSON_Parse(rtext);
    free(rtext);
    if (!cJSON_IsObject(ref)) {
        fprintf(stderr, "g4 check: %s: not a JSON object\n", path);
        cJSON_Delete(ref);
        return 1;
    }

    g4_model *model = NULL;
    g4_session *sess = NULL;
    g4_error err = {0};
    int32_t *tokens = NULL, *gprompt = NULL, *gtokens = NULL;
    int n_tok = 0, n_gp = 0, n_gt = 0;
    float *want_logits = NULL, *logits = NULL, *want_hidden = NULL, *want_ple = NULL;
    collector col = {0};
    int *dpos = NULL;

    if (json_ints(cJSON_GetObjectItem(ref, "tokens"), &tokens, &n_tok, "tokens") ||
        json_ints(cJSON_GetObjectItem(ref, "greedy_prompt"), &gprompt, &n_gp, "greedy_prompt") ||
        json_ints(cJSON_GetObjectItem(ref, "greedy_tokens"), &gtokens, &n_gt, "greedy_tokens"))
        goto done;
    if (n_tok == 0 || n_gp == 0) {
        fprintf(stderr, "g4 check: reference.json: empty token lists\n");
        goto done;
    }
    const cJSON *margins = cJSON_GetObjectItem(ref, "greedy_top2_margin");
    if (!cJSON_IsArray(margins) || cJSON_GetArraySize(margins) < n_gt) {
        fprintf(stderr, "g4 check: reference.json: greedy_top2_margin missing or shorter than greedy_tokens\n");
        goto done;
    }

    g4_model_options mo = {.keep_layout = device == G4_DEVICE_CUDA};
    if (g4_model_load(dir, &mo, &model, &err)) {
        fprintf(stderr, "g4 check: %s\n", err.message);
        goto done;
    }
    g4_model_info info;
    g4_model_get_info(model, &info);
    int V = info.vocab, H = info.hidden, L = info.n_layers, P = info.ple_width;
    g4_session_options so = {.n_ctx = n_tok > n_gp + n_gt ? n_tok : n_gp + n_gt, .n_threads = threads, .max_batch = chunk,
                             .device = device, .fast_prefill = fast_prefill};
    if (g4_session_create(model, &so, &sess, &err)) {
        fprintf(stderr, "g4 check: %s\n", err.message);
        goto done;
    }
    const cJSON *lf = cJSON_GetObjectItem(ref, "logits_file"), *hf = cJSON_GetObjectItem(ref, "hidden_file");
    const cJSON *pf = cJSON_GetObjectItem(ref, "ple_file");
    if (read_f32(dir, cJSON_IsString(lf) ? lf->valuestring : "logits.f32", (size_t)n_tok * V, &want_logits)) goto done;
    if (cJSON_IsString(hf) && read_f32(dir, hf->valuestring, (size_t)(L + 2) * n_tok * H, &want_hidden)) goto done;
    if (cJSON_IsString(pf) && P && read_f32(dir, pf->valuestring, (size_t)n_tok * L * P, &want_ple)) goto done;

    printf("model %s: %s, %d layers, hidden %d, vocab %d, embed scale %g, device %s\n", dir, info.arch, L, H, V,
           (double)info.embed_scale, device == G4_DEVICE_CUDA ? "cuda" : "cpu");
    const cJSON *esu = cJSON_GetObjectItem(ref, "embed_scale_used");
    int ok = 1;
    if (cJSON_IsNumber(esu) && (float)esu->valuedouble != info.embed_scale) {
        printf("  embed scale %g differs from the reference's %g\n", (double)info.embed_scale, esu->valuedouble);
        ok = 0;
    }

    /* teacher forcing over every reference token, collecting intermediates */
    col.n_layers = L;
    col.n_pos = n_tok;
    if (dump_dir && dump_pos) {
        int cap = 1;
        for (const char *p = dump_pos; *p; p++) cap += *p == ',';
        dpos = malloc(sizeof(int) * (size_t)cap);
        int n = 0;
        char *end;
        for (const char *p = dump_pos; *p; p = *end ? end + 1 : end) {
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= n_tok || (*end && *end != ',')) {
                fprintf(stderr, "g4 check: --dump-pos: '%s' is not a list of positions in [0, %d)\n", dump_pos, n_tok);
                goto done;
            }
            dpos[n++] = (int)v;
        }
        col.pos = dpos;
        col.n_pos = n;
    }
    g4_session_set_dump(sess, collect, &col, col.pos, col.pos ? col.n_pos : -1);
    logits = malloc(sizeof(float) * (size_t)n_tok * V);
    if (!logits) {
        fprintf(stderr, "g4 check: out of memory\n");
        goto done;
    }
    if (g4_session_forward(sess, tokens, n_tok, G4_LOGITS_ALL, logits, &err)) {
        fprintf(stderr, "g4 check: %s\n", err.message);
        goto done;
    }
    g4_session_set_dump(sess, NULL, NULL, NULL, 0);
    if (col.failed) {
        fprintf(stderr, "g4 check: out of memory collecting intermediates\n");
        goto done;
    }
    double lerr = max_abs_diff(logits, want_logits, (size_t)n_tok * V);
    printf("  logits: max |error| %.2e over %d positions (limit 2e-3)\n", lerr, n_tok);
    if (!(lerr <= 2e-3)) ok = 0;
    double worst_row = 0;
    if (want_hidden && !col.pos) {
        const dump_buf *e = find_buf(&col, "embed"), *lo = find_buf(&col, "layer_out"), *fn = find_buf(&col, "final_norm");
        printf("  hidden rows, relative error (embed, layers 0..%d, final norm):\n   ", L - 1);
        for (int r = 0; r < L + 2; r++) {
            const float *mine = r == 0 ? e->rows : r == L + 1 ? fn->rows : lo->rows + (size_t)(r - 1) * n_tok * H;
            const float *want = want_hidden + (size_t)r * n_tok * H;
            double rel = max_abs_diff(mine, want, (size_t)n_tok * H) / (max_abs(want, (size_t)n_tok * H) + 1e-9);
            worst_row = rel > worst_row ? rel : worst_row;
            printf(" %.0e", rel);
        }
        printf("\n");
    }
    if (want_ple && !col.pos) {
        const dump_buf *pb = find_buf(&col, "ple");
        double rel = max_abs_diff(pb->rows, want_ple, (size_t)n_tok * L * P) / (max_abs(want_ple, (size_t)n_tok * L * P) + 1e-9);
        printf("  per-layer inputs: relative error %.1e\n", rel);
        worst_row = rel > worst_row ? rel : worst_row;
    }
    if (dump_dir && write_dump(&col, dump_dir)) goto done;

    /* greedy, teacher-forced on the recorded tokens so one near-tie cannot cascade */
    g4_session_reset(sess);
    int agree = 0, bad = 0;
    float *lg = logits;
    if (g4_session_forward(sess, gprompt, n_gp, G4_LOGITS_LAST, lg, &err)) {
        fprintf(stderr, "g4 check: %s\n", err.message);
        goto done;
    }
    for (int k = 0; k < n_gt; k++) {
        int t = g4_argmax(lg, V);
        double margin = cJSON_GetArrayItem(margins, k)->valuedouble;
        if (t == gtokens[k]) agree++;
        else {
            printf("  greedy step %d: got %d, reference %d (recorded margin %.2e)%s\n", k, t, gtokens[k], margin,
                   margin > 1e-3 ? " FAIL" : " (near tie, allowed)");
            if (margin > 1e-3) bad++;
        }
        if (k + 1 < n_gt && g4_session_forward(sess, &gtokens[k], 1, G4_LOGITS_LAST, lg, &err)) {
            fprintf(stderr, "g4 check: %s\n", err.message);
            goto done;
        }
    }
    /* and free-running through the library's greedy generator */
    g4_session_reset(sess);
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)(n_gt ? n_gt : 1));
    int n_gen = 0, free_agree = 0;
    if (!gen || g4_generate_greedy(sess, gprompt, n_gp, n_gt, NULL, 0, gen, &n_gen, &err)) {
        fprintf(stderr, "g4 check: %s\n", gen ? err.message : "out of memory");
        free(gen);
        goto done;
    }
    while (free_agree < n_gen && gen[free_agree] == gtokens[free_agree]) free_agree++;
    free(gen);
    printf("  greedy: %d/%d teacher-forced steps agree; free-running generation matches the first %d/%d\n", agree,
           n_gt, free_agree, n_gt);
    if (bad) ok = 0;
    int drafter_checked = check_assistant(dir, model, sess, gprompt, n_gp, n_gt, V, H, &ok);
    if (drafter_checked < 0) goto done;
    printf("check %s: %s  logits %.2e  hidden %.1e  greedy %d/%d%s\n", dir, ok ? "PASS" : "FAIL", lerr, worst_row, agree,
           n_gt, drafter_checked ? "  drafter checked" : "");
    rc = ok ? 0 : 1;
done:
    collector_free(&col);
    free(dpos);
    free(tokens);
    free(gprompt);
    free(gtokens);
    free(want_logits);
    free(want_hidden);
    free(want_ple);
    free(logits);
    g4_session_free(sess);
    g4_model_free(model);
    cJSON_Delete(ref);
    return rc;
}
