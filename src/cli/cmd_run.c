/* g4 run and g4 chat: text in, streamed answer out, with sampling, stop strings and optional
 * speculative decoding. Everything goes through the public API. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli/cli.h"
#include "g4.h"
#include "g4_chat.h"
#include "g4_sample.h"
#include "g4_tokenizer.h"

/* ---- options ------------------------------------------------------------------------------ */

enum { MAX_STOPS = 16 };

typedef struct {
    const char *model, *tokenizer, *prompt, *system, *draft;
    const char *stops[MAX_STOPS];
    int n_stops;
    int raw, ids, think, max_tokens, ctx, threads, draft_k, quiet, fast_prefill, kv_type;
    int device; /* -1: auto (CUDA when there is a usable GPU, else the CPU), or G4_DEVICE_* */
    g4_sampler_options so;
} run_opts;

static void run_usage(FILE *f, int chat) {
    fprintf(f,
            "usage: g4 %s -m MODEL %s[options]\n"
            "%s"
            "model and text:\n"
            "  -m, --model PATH      model folder (config.json + safetensors) or file\n"
            "  --tokenizer FILE      tokenizer.json or GGUF (default: the model folder's)\n"
            "%s"
            "  --system TEXT         system prompt\n"
            "  --think               thinking on (the model reasons in a thought channel first)\n"
            "sampling (default: greedy):\n"
            "  --temp T              temperature (0: greedy)\n"
            "  --top-k K  --top-p P  --min-p P\n"
            "  --repeat-penalty R  --presence-penalty P  --repeat-last-n N\n"
            "  --seed N              reproducible sampling\n"
            "generation:\n"
            "  --max-tokens N        most tokens per answer (default 512)\n"
            "  --stop TEXT           stop when the output contains TEXT (repeatable)\n"
            "  --ctx N               context length (default 4096)\n"
            "  --threads N           worker threads (default: all CPUs)\n"
            "  --kv-type T           KV cache elements: f32 (default) or bf16 (CPU: half the memory and\n"
            "                        the bytes attention reads; logits within the rounding of K and V)\n"
            "  --device D            cpu, cuda or auto (default: auto = the GPU when there is one)\n"
            "  --fast-prefill        GPU: the prompt on the tensor cores (~10x faster on E2B; logits within\n"
            "                        rounding of the default, which is bitwise one token at a time)\n"
            "  --draft DIR           speculative decoding with a Gemma 4 drafter (same output)\n"
            "  --draft-k N           most drafted tokens per round (default 4)\n"
            "  -q, --quiet           no statistics on stderr\n",
            chat ? "chat" : "run", chat ? "" : "-p PROMPT ",
            chat ? "  Interactive multi-turn chat. Commands: /reset, /system TEXT, /think on|off, /help, /quit.\n"
                   "  Ctrl-C stops the current answer; Ctrl-D leaves.\n"
                 : "  Streams the answer to PROMPT to stdout; statistics go to stderr.\n",
            chat ? "" : "  -p, --prompt TEXT     the prompt ('-' reads stdin)\n"
                        "  --raw                 plain completion: no chat format\n"
                        "  --ids                 the prompt is token ids; print generated ids (no tokenizer)\n");
}

static int parse_float(const char *opt, const char *val, float *out) {
    char *end;
    if (!val) {
        fprintf(stderr, "g4: %s needs a value\n", opt);
        return -1;
    }
    errno = 0;
    double v = strtod(val, &end);
    if (!*val || *end || errno) {
        fprintf(stderr, "g4: %s: '%s' is not a number\n", opt, val);
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* Returns 0 ok, 1 help printed, 2 usage error. */
static int parse_run_opts(int argc, char **argv, int chat, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->so = g4_sampler_default_options();
    o->so.temperature = 0;
    o->max_tokens = 512;
    o->ctx = 4096;
#ifdef G4_HAVE_CUDA
    o->device = -1;
#endif
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, bad = 0, iv;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            run_usage(stdout, chat);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer = v;
        else if (!chat && (!strcmp(a, "-p") || !strcmp(a, "--prompt"))) o->prompt = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--draft")) o->draft = v;
        else if (!strcmp(a, "--stop")) {
            if (o->n_stops == MAX_STOPS || !v || !*v) bad = 1;
            else o->stops[o->n_stops++] = v;
        } else if (!strcmp(a, "--temp")) bad = parse_float(a, v, &o->so.temperature);
        else if (!strcmp(a, "--top-p")) bad = parse_float(a, v, &o->so.top_p);
        else if (!strcmp(a, "--min-p")) bad = parse_float(a, v, &o->so.min_p);
        else if (!strcmp(a, "--repeat-penalty")) bad = parse_float(a, v, &o->so.repetition_penalty);
        else if (!strcmp(a, "--presence-penalty")) bad = parse_float(a, v, &o->so.presence_penalty);
        else if (!strcmp(a, "--top-k")) bad = cli_parse_int(a, v, 0, 1 << 30, &o->so.top_k);
        else if (!strcmp(a, "--repeat-last-n")) bad = cli_parse_int(a, v, 0, 1 << 24, &o->so.penalty_last_n);
        else if (!strcmp(a, "--seed")) {
            bad = cli_parse_int(a, v, 0, 0x7fffffff, &iv);
            o->so.seed = (uint64_t)iv;
        } else if (!strcmp(a, "--max-tokens")) bad = cli_parse_int(a, v, 0, 1 << 24, &o->max_tokens);
        else if (!strcmp(a, "--ctx")) bad = cli_parse_int(a, v, 16, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--threads")) bad = cli_parse_int(a, v, 1, 256, &o->threads);
        else if (!strcmp(a, "--draft-k")) bad = cli_parse_int(a, v, 1, G4_MAX_DRAFT, &o->draft_k);
        else if (!strcmp(a, "--kv-type")) bad = cli_parse_kv_type(a, v, &o->kv_type);
        else if (!strcmp(a, "--device")) {
            if (v && !strcmp(v, "cpu")) o->device = G4_DEVICE_CPU;
            else if (v && !strcmp(v, "cuda")) o->device = G4_DEVICE_CUDA;
            else if (v && !strcmp(v, "auto")) o->device = -1;
            else if (v) {
                fprintf(stderr, "g4: --device: '%s' is not cpu, cuda or auto\n", v);
                bad = 1;
            }
        }
        else {
            used = 0;
            if (!chat && !strcmp(a, "--raw")) o->raw = 1;
            else if (!chat && !strcmp(a, "--ids")) o->ids = 1;
            else if (!strcmp(a, "--think")) o->think = 1;
            else if (!strcmp(a, "--fast-prefill")) o->fast_prefill = 1;
            else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
            else {
                fprintf(stderr, "g4 %s: unknown option '%s' (see --help)\n", chat ? "chat" : "run", a);
                return 2;
            }
        }
        if (used && !v) {
            fprintf(stderr, "g4: %s needs a value\n", a);
            return 2;
        }
        if (bad) {
            if (!strcmp(a, "--stop")) fprintf(stderr, "g4: --stop needs a non-empty text (at most %d)\n", MAX_STOPS);
            return 2;
        }
        i += used;
    }
    if (!o->model) {
        fprintf(stderr, "g4 %s: -m MODEL is required (see --help)\n", chat ? "chat" : "run");
        return 2;
    }
    if (!chat && !o->prompt) {
        fprintf(stderr, "g4 run: -p PROMPT is required (see --help)\n");
        return 2;
    }
    return 0;
}

/* ---- the engine pieces a run needs ---------------------------------------------------------- */

typedef struct {
    g4_model *model;
    g4_session *sess;
    g4_tokenizer *tok;
    g4_sampler *sampler;
    g4_drafter *drafter;
    g4_stop_matcher *stops;
    g4_detokenizer *detok;
    int32_t stop_ids[4];
    int n_stop_ids;
    int vocab;
} engine;

static void engine_free(engine *e) {
    g4_detokenizer_free(e->detok);
    g4_stop_matcher_free(e->stops);
    g4_drafter_free(e->drafter);
    g4_sampler_free(e->sampler);
    g4_tokenizer_free(e->tok);
    g4_session_free(e->sess);
    g4_model_free(e->model);
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int engine_open(engine *e, const run_opts *o, int need_tokenizer) {
    memset(e, 0, sizeof *e);
    g4_error err = {0};
    double t0 = seconds();
    if (!o->quiet) fprintf(stderr, "loading %s ...\n", o->model);
    /* a GPU session takes the weights in the file's layout; the CPU's own layout is a copy */
    g4_model_options mo = {.keep_layout = o->device != G4_DEVICE_CPU && g4_device_probe(G4_DEVICE_CUDA, NULL, 0, NULL) == G4_OK};
    if (g4_model_load(o->model, &mo, &e->model, &err)) goto fail;
    g4_model_info info;
    g4_model_get_info(e->model, &info);
    e->vocab = info.vocab;
    if (!o->quiet)
        fprintf(stderr, "loaded %s: %d layers, hidden %d, %.2f GB of weights, in %.2f s\n", info.arch, info.n_layers,
                info.hidden, info.weight_bytes / 1e9, seconds() - t0);
    g4_session_options so = {.n_ctx = o->ctx, .n_threads = o->threads, .device = o->device < 0 ? G4_DEVICE_CUDA : o->device,
                             .fast_prefill = o->fast_prefill, .kv_type = o->kv_type};
    if (g4_session_create(e->model, &so, &e->sess, &err)) {
        /* auto: no usable GPU (or weights it cannot run yet) -> say so once, use the CPU */
        if (o->device >= 0 || err.code != G4_ERR_UNSUPPORTED) goto fail;
        fprintf(stderr, "g4: %s; using the CPU\n", err.message);
        so.device = G4_DEVICE_CPU;
        if (g4_session_create(e->model, &so, &e->sess, &err)) goto fail;
    }
    if (need_tokenizer) {
        struct stat sb;
        const char *tp = o->tokenizer ? o->tokenizer : o->model;
        if (!o->tokenizer && stat(o->model, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            char path[4096];
            snprintf(path, sizeof path, "%s/tokenizer.json", o->model);
            int have = stat(path, &sb) == 0;
            snprintf(path, sizeof path, "%s/model.g4p", o->model); /* a pack carries its own */
            if (!have && stat(path, &sb) != 0) {
                fprintf(stderr, "g4: %s has no tokenizer.json; pass --tokenizer FILE\n", o->model);
                return -1;
            }
        }
        if (g4_tokenizer_load(tp, &e->tok, &err)) goto fail;
        if (g4_tokenizer_n_vocab(e->tok) != info.vocab) {
            fprintf(stderr, "g4: the tokenizer %s has %d tokens but the model's vocabulary is %d: they do not belong together\n",
                    tp, g4_tokenizer_n_vocab(e->tok), info.vocab);
            return -1;
        }
        if (g4_detokenizer_create(e->tok, 0, &e->detok, &err)) goto fail;
        int32_t turn_end = g4_tokenizer_special_id(e->tok, "<turn|>");
        e->stop_ids[e->n_stop_ids++] = info.eos;
        if (turn_end >= 0 && !o->raw) e->stop_ids[e->n_stop_ids++] = turn_end;
    } else {
        e->stop_ids[e->n_stop_ids++] = info.eos;
    }
    if (g4_sampler_create(&o->so, info.vocab, &e->sampler, &err)) goto fail;
    if (g4_stop_matcher_create(o->stops, o->n_stops, &e->stops, &err)) goto fail;
    if (o->draft && g4_drafter_load(o->draft, e->model, &e->drafter, &err)) goto fail;
    return 0;
fail:
    fprintf(stderr, "g4: %s\n", err.message);
    return -1;
}

/* ---- generation with streaming output ------------------------------------------------------- */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

typedef struct {
    engine *e;
    int ids;
    int stopped_by_string;
    g4_chat_parser *parser;  /* chat: splits thinking from the answer */
    int32_t *out;            /* generated ids */
    int n_out, cap;
    int io_error;
} stream_ctx;

static void print_event(void *user, const g4_chat_event *ev) {
    (void)user;
    if (ev->type == G4_CHAT_EV_THINKING) {
        fprintf(stderr, "%.*s", (int)ev->len, ev->text); /* thoughts go to stderr, dimmed by the terminal */
    } else if (ev->type == G4_CHAT_EV_CONTENT) {
        fwrite(ev->text, 1, ev->len, stdout);
    } else if (ev->type == G4_CHAT_EV_TOOL_CALL) {
        const g4_chat_tool_call *c = ev->tool_call;
        printf("\n[tool call %s %s]\n", c->name ? c->name : "?", c->arguments ? c->arguments : c->raw);
    }
    fflush(stdout);
}

static int on_token(void *user, int32_t tok, const float *logits, int n_vocab) {
    (void)logits;
    (void)n_vocab;
    stream_ctx *c = user;
    if (c->n_out < c->cap) c->out[c->n_out++] = tok;
    if (c->ids) {
        printf("%s%d", c->n_out > 1 ? " " : "", tok);
        fflush(stdout);
        return interrupted;
    }
    for (int i = 0; i < c->e->n_stop_ids; i++)
        if (tok == c->e->stop_ids[i]) return 1; /* end markers are not printed */
    const char *text;
    size_t len;
    g4_error err;
    if (g4_detokenizer_push(c->e->detok, tok, &text, &len, &err)) return 1;
    g4_stop_result r;
    if (g4_stop_matcher_feed(c->e->stops, text, len, &r, &err)) return 1;
    if (r.len) {
        if (c->parser) g4_chat_parser_feed(c->parser, r.text, r.len, &err);
        else if (fwrite(r.text, 1, r.len, stdout) != r.len) c->io_error = 1;
        fflush(stdout);
    }
    if (r.stopped) c->stopped_by_string = 1;
    return r.stopped || interrupted || c->io_error;
}

static void print_stats(const g4_generate_stats *st, int drafting) {
    fprintf(stderr, "\nprefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s)\n", st->n_prompt,
            st->prefill_seconds, st->prefill_seconds > 0 ? st->n_prompt / st->prefill_seconds : 0, st->n_generated,
            st->decode_seconds, st->decode_seconds > 0 ? (st->n_generated - 1) / st->decode_seconds : 0);
    if (drafting && st->rounds) {
        fprintf(stderr, "draft: %d rounds, %d of %d drafts accepted (%.0f%%), %.2f tokens per round; by position:",
                st->rounds, st->accepted, st->drafted, st->drafted ? 100.0 * st->accepted / st->drafted : 0,
                (double)(st->accepted + st->rounds) / st->rounds);
        for (int i = 0; i < G4_MAX_DRAFT && st->drafted_at[i]; i++)
            fprintf(stderr, " %d/%d", st->accepted_at[i], st->drafted_at[i]);
        fprintf(stderr, "; drafter time %.3f s\n", st->draft_seconds);
    }
}

/* Generates after `prompt`; the ids generated go to c->out. */
static int generate(engine *e, const run_opts *o, const int32_t *prompt, int n_prompt, stream_ctx *c) {
    g4_error err = {0};
    g4_generate_options go = {
        .max_new = o->max_tokens,
        .stop_tokens = e->stop_ids,
        .n_stop = e->n_stop_ids,
        .sampler = o->so.temperature > 0 ? e->sampler : NULL,
        .drafter = e->drafter,
        .draft_k = o->draft_k,
        .on_token = on_token,
        .user = c,
        .no_logits = 1, /* on_token prints the token only */
    };
    if (o->so.temperature == 0 && (o->so.repetition_penalty != 1 || o->so.presence_penalty != 0))
        go.sampler = e->sampler; /* greedy with penalties goes through the sampler */
    g4_generate_stats st;
    interrupted = 0;
    g4_status s = g4_generate(e->sess, prompt, n_prompt, &go, &st, &err);
    if (!c->ids) {
        const char *text;
        size_t len;
        g4_stop_result r;
        g4_detokenizer_flush(e->detok, &text, &len);
        if (!c->stopped_by_string && len) g4_stop_matcher_feed(e->stops, text, len, &r, &err);
        if (!c->stopped_by_string) {
            g4_stop_matcher_flush(e->stops, &r);
            if (r.len) {
                if (c->parser) g4_chat_parser_feed(c->parser, r.text, r.len, &err);
                else fwrite(r.text, 1, r.len, stdout);
            }
        }
        g4_stop_matcher_reset(e->stops);
    }
    if (c->parser) g4_chat_parser_finish(c->parser, &err);
    printf("\n");
    fflush(stdout);
    if (interrupted) fprintf(stderr, "[interrupted]\n");
    if (!o->quiet) print_stats(&st, e->drafter != NULL);
    if (s) {
        fprintf(stderr, "g4: %s\n", err.message);
        return -1;
    }
    return 0;
}

static int parse_ids(const char *text, int vocab, int32_t **ids, int *n) {
    int cap = 16;
    *ids = malloc(sizeof(int32_t) * cap);
    *n = 0;
    const char *p = text;
    while (*ids) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= vocab) {
            fprintf(stderr, "g4: --ids: '%.20s' is not a token id in [0, %d)\n", p, vocab);
            return -1;
        }
        if (*n == cap) {
            int32_t *g = realloc(*ids, sizeof(int32_t) * (cap *= 2));
            if (!g) return -1;
            *ids = g;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    if (!*n) fprintf(stderr, "g4: --ids: no token ids in the prompt\n");
    return *n ? 0 : -1;
}

static char *read_stdin(void) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, stdin);
        if (n < cap - 1) break;
        char *g = realloc(buf, cap *= 2);
        if (!g) free(buf);
        buf = g;
    }
    if (buf) buf[n] = 0;
    return buf;
}

static int tokenize(engine *e, const char *text, unsigned flags, g4_tokens *out) {
    g4_error err = {0};
    if (g4_tokenizer_encode(e->tok, text, strlen(text), flags, out, &err)) {
        fprintf(stderr, "g4: %s\n", err.message);
        return -1;
    }
    return 0;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int r = parse_run_opts(argc, argv, 0, &o);
    if (r) return r == 1 ? 0 : 2;
    char *stdin_text = NULL;
    const char *prompt = o.prompt;
    if (!strcmp(prompt, "-") && !(prompt = stdin_text = read_stdin())) return 1;
    engine e;
    int rc = 1;
    g4_tokens toks = {0};
    int32_t *ids = NULL, *out = NULL;
    int n_ids = 0;
    char *rendered = NULL;
    g4_chat *chat = NULL;
    g4_chat_parser *parser = NULL;
    if (engine_open(&e, &o, !o.ids)) goto done;
    g4_error err = {0};
    if (o.ids) {
        if (parse_ids(prompt, e.vocab, &ids, &n_ids)) goto done;
    } else if (o.raw) {
        if (tokenize(&e, prompt, G4_TOKENIZE_ADD_BOS, &toks)) goto done;
    } else {
        if (g4_chat_new(&chat, &err) || (o.system && g4_chat_set_system(chat, o.system, &err)) ||
            g4_chat_add_message(chat, G4_ROLE_USER, prompt, &err) ||
            g4_chat_parser_new(print_event, NULL, &parser, &err)) {
            fprintf(stderr, "g4: %s\n", err.message);
            goto done;
        }
        g4_chat_set_thinking(chat, o.think);
        g4_chat_set_generation_prompt(chat, 1);
        if (g4_chat_render(chat, &rendered, NULL, &err)) {
            fprintf(stderr, "g4: %s\n", err.message);
            goto done;
        }
        if (tokenize(&e, rendered, G4_TOKENIZE_SPECIAL, &toks)) goto done;
    }
    out = malloc(sizeof(int32_t) * (size_t)(o.max_tokens + 1));
    stream_ctx c = {&e, o.ids, 0, parser, out, 0, o.max_tokens + 1, 0};
    signal(SIGINT, on_sigint);
    rc = generate(&e, &o, o.ids ? ids : toks.ids, o.ids ? n_ids : (int)toks.n, &c) ? 1 : 0;
done:
    g4_chat_parser_free(parser);
    g4_chat_free(chat);
    free(rendered);
    g4_tokens_free(&toks);
    free(ids);
    free(out);
    free(stdin_text);
    engine_free(&e);
    return rc;
}

/* ---- chat ------------------------------------------------------------------------------------ */

/* The cache holds `hist`; a new rendering that extends it only needs its suffix prefilled. */
typedef struct {
    int32_t *ids;
    int n, cap;
} id_list;

static int id_list_append(id_list *l, const int32_t *ids, int n) {
    if (l->n + n > l->cap) {
        int cap = (l->n + n) * 2;
        int32_t *g = realloc(l->ids, sizeof(int32_t) * cap);
        if (!g) return -1;
        l->ids = g;
        l->cap = cap;
    }
    memcpy(l->ids + l->n, ids, sizeof(int32_t) * n);
    l->n += n;
    return 0;
}

static char *read_line(int tty) {
    if (tty) return readline("> ");
    size_t cap = 0;
    char *line = NULL;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (n && line[n - 1] == '\n') line[n - 1] = 0;
    return line;
}

int cmd_chat(int argc, char **argv) {
    run_opts o;
    int r = parse_run_opts(argc, argv, 1, &o);
    if (r) return r == 1 ? 0 : 2;
    engine e;
    if (engine_open(&e, &o, 1)) {
        engine_free(&e);
        return 1;
    }
    g4_error err = {0};
    g4_chat *chat = NULL;
    id_list hist = {0};
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(o.max_tokens + 1));
    int tty = isatty(0) && isatty(1), rc = 0, think = o.think;
    char *system = o.system ? strdup(o.system) : NULL;
    if (g4_chat_new(&chat, &err) || (o.system && g4_chat_set_system(chat, o.system, &err))) {
        fprintf(stderr, "g4: %s\n", err.message);
        rc = 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C interrupts generation, not the process */
    sigaction(SIGINT, &sa, NULL);
    if (tty && !rc) fprintf(stderr, "g4 chat: /help for commands, Ctrl-D to leave\n");
    char *line;
    while (!rc && (line = read_line(tty))) {
        if (tty && *line) add_history(line);
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) {
            free(line);
            break;
        } else if (!strcmp(line, "/help")) {
            printf("/reset  forget the conversation\n/system TEXT  set the system prompt (resets)\n"
                   "/think on|off  thinking\n/quit  leave\n");
        } else if (!strcmp(line, "/reset") || !strncmp(line, "/system ", 8)) {
            /* /reset keeps the current system prompt; /system replaces it */
            g4_chat_truncate(chat, 0);
            if (line[1] == 's') {
                free(system);
                system = strdup(line + 8);
            }
            if (system && g4_chat_set_system(chat, system, &err)) fprintf(stderr, "g4: %s\n", err.message);
            g4_session_reset(e.sess);
            hist.n = 0;
            printf("[conversation reset]\n");
        } else if (!strcmp(line, "/think on") || !strcmp(line, "/think off")) {
            think = line[8] == 'n';
            printf("[thinking %s]\n", think ? "on" : "off");
        } else if (line[0] == '/') {
            printf("unknown command %s (/help)\n", line);
        } else if (*line) {
            char *rendered = NULL;
            g4_tokens toks = {0};
            g4_chat_parser *parser = NULL;
            g4_chat_set_thinking(chat, think);
            g4_chat_set_generation_prompt(chat, 1);
            if (g4_chat_add_message(chat, G4_ROLE_USER, line, &err) || g4_chat_render(chat, &rendered, NULL, &err) ||
                g4_chat_parser_new(print_event, NULL, &parser, &err)) {
                fprintf(stderr, "g4: %s\n", err.message);
                rc = 1;
            } else if (!tokenize(&e, rendered, G4_TOKENIZE_SPECIAL, &toks)) {
                /* reuse the cache when it holds a prefix of the new prompt; else start over */
                int common = 0;
                while (common < hist.n && common < (int)toks.n && hist.ids[common] == toks.ids[common]) common++;
                if (common < hist.n || common == (int)toks.n) {
                    g4_session_reset(e.sess);
                    hist.n = common = 0;
                }
                if (g4_session_pos(e.sess) + (int)toks.n - common + o.max_tokens > g4_session_ctx(e.sess)) {
                    fprintf(stderr, "[context full: conversation reset]\n");
                    g4_session_reset(e.sess);
                    hist.n = common = 0;
                }
                stream_ctx c = {&e, 0, 0, parser, out, 0, o.max_tokens + 1, 0};
                if (generate(&e, &o, toks.ids + common, (int)toks.n - common, &c)) {
                    g4_session_reset(e.sess);
                    hist.n = 0;
                } else {
                    /* the cache now holds the prompt and every generated token but the last */
                    if (id_list_append(&hist, toks.ids + common, (int)toks.n - common) ||
                        id_list_append(&hist, out, c.n_out > 0 ? c.n_out - 1 : 0))
                        rc = 1;
                    size_t len;
                    const char *answer = g4_chat_parser_content(parser, &len);
                    if (g4_chat_add_message(chat, G4_ROLE_ASSISTANT, answer, &err)) fprintf(stderr, "g4: %s\n", err.message);
                }
            }
            g4_chat_parser_free(parser);
            g4_tokens_free(&toks);
            free(rendered);
        }
        free(line);
        fflush(stdout);
    }
    free(hist.ids);
    free(out);
    free(system);
    g4_chat_free(chat);
    engine_free(&e);
    return rc;
}
