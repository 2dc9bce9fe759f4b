/* g4 run / g4 chat end to end on a tiny fixture model, with a 512-token slice of the real Gemma 4
 * vocabulary as its tokenizer (the fixtures' vocabulary size), driven through pipes. */
#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "test_util.h"

static char dir[512], model[700];

/* Runs a shell command, capturing stdout (and stderr when err_out != NULL) and the exit status. */
static int run_cmd(const char *cmd, const char *stdin_text, char **out, char **err_out) {
    char full[8192], ofile[800], efile[800], ifile[800];
    snprintf(ofile, sizeof ofile, "%s/out.txt", dir);
    snprintf(efile, sizeof efile, "%s/err.txt", dir);
    snprintf(ifile, sizeof ifile, "%s/in.txt", dir);
    FILE *f = fopen(ifile, "wb");
    if (stdin_text) fputs(stdin_text, f);
    fclose(f);
    snprintf(full, sizeof full, "%s < '%s' > '%s' 2> '%s'", cmd, ifile, ofile, efile);
    int st = system(full);
    *out = test_read_file(ofile, NULL);
    char *e = test_read_file(efile, NULL);
    if (err_out) *err_out = e;
    else free(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *g4(void) {
    const char *b = getenv("G4_BIN");
    return b && *b ? b : "build/g4";
}

/* The first 512 ids of the real vocabulary, the merges among them, and their added tokens. */
static void write_small_tokenizer(const char *path) {
    char src[1024];
    char *text = test_read_file(test_fixture_path(src, sizeof src, "tokenizer/tokenizer.json"), NULL);
    cJSON *t = cJSON_Parse(text);
    free(text);
    assert_non_null(t);
    cJSON *m = cJSON_GetObjectItem(t, "model"), *vocab = cJSON_GetObjectItem(m, "vocab");
    cJSON *nv = cJSON_CreateObject();
    for (cJSON *e = vocab->child; e; e = e->next)
        if (e->valueint < 512) cJSON_AddNumberToObject(nv, e->string, e->valueint);
    cJSON *nm = cJSON_CreateArray();
    for (cJSON *e = cJSON_GetObjectItem(m, "merges")->child; e; e = e->next) {
        const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
        char joined[1024];
        snprintf(joined, sizeof joined, "%s%s", a, b);
        if (cJSON_GetObjectItemCaseSensitive(nv, a) && cJSON_GetObjectItemCaseSensitive(nv, b) &&
            cJSON_GetObjectItemCaseSensitive(nv, joined))
            cJSON_AddItemToArray(nm, cJSON_Duplicate(e, 1));
    }
    cJSON_ReplaceItemInObject(m, "vocab", nv);
    cJSON_ReplaceItemInObject(m, "merges", nm);
    cJSON *added = cJSON_GetObjectItem(t, "added_tokens"), *na = cJSON_CreateArray();
    for (cJSON *e = added->child; e; e = e->next)
        if (cJSON_GetObjectItem(e, "id")->valueint < 512) cJSON_AddItemToArray(na, cJSON_Duplicate(e, 1));
    cJSON_ReplaceItemInObject(t, "added_tokens", na);
    char *out = cJSON_PrintUnformatted(t);
    FILE *f = fopen(path, "wb");
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_Delete(t);
}

static int setup(void **state) {
    (void)state;
    test_tmpdir(dir, sizeof dir, "cli-run");
    snprintf(model, sizeof model, "%s/model", dir);
    mkdir(model, 0777);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char src[1024], rel[256], dst[1024];
        snprintf(rel, sizeof rel, "gemma4/e2b-mini/%s", files[i]);
        test_fixture_path(src, sizeof src, rel);
        snprintf(dst, sizeof dst, "%s/%s", model, files[i]);
        if (symlink(src[0] == '/' ? src : realpath(src, NULL), dst) != 0) return -1;
    }
    char tp[1024];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", model);
    write_small_tokenizer(tp);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%.900s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_run_ids_matches_reference(void **state) {
    (void)state;
    char cmd[2048], *out, *err;
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --ids -p '2 176 417 58 448 172 213 42 271 217 510 497' --max-tokens 48 --threads 1", g4(), model);
    assert_int_equal(run_cmd(cmd, NULL, &out, &err), 0);
    assert_string_equal(out, "280 377 68 352 104 104 104 104 104 104 104 104 104 322 322 322 322 322 322 322 322 322 322 322 "
                             "67 31 234 234 234 234 234 53 70 75 511 300 322 322 226 226 75 79 285 423 423 423 423 240\n");
    assert_non_null(strstr(err, "prefill: 12 tokens"));
    assert_non_null(strstr(err, "decode: 48 tokens"));
    free(out);
    free(err);
    /* with the drafter: the same tokens, and acceptance statistics on stderr */
    char adir[1024];
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --ids -p '2 176 417 58 448 172 213 42 271 217 510 497' --max-tokens 48 --draft '%s' --draft-k 3",
             g4(), model, test_fixture_path(adir, sizeof adir, "gemma4/e2b-mini/assistant"));
    assert_int_equal(run_cmd(cmd, NULL, &out, &err), 0);
    assert_non_null(strstr(out, "280 377 68 352 104"));
    assert_non_null(strstr(err, "draft: "));
    assert_non_null(strstr(err, "drafts accepted"));
    free(out);
    free(err);
}

static void test_run_text(void **state) {
    (void)state;
    char cmd[2048], *a, *b, *err;
    /* seeded sampling is reproducible; the chat format is applied; stats go to stderr */
    snprintf(cmd, sizeof cmd, "%s run -m '%s' -p 'Hello there' --temp 1.5 --top-k 50 --seed 7 --max-tokens 24", g4(), model);
    assert_int_equal(run_cmd(cmd, NULL, &a, &err), 0);
    assert_non_null(strstr(err, "prefill: "));
    free(err);
    assert_int_equal(run_cmd(cmd, NULL, &b, NULL), 0);
    assert_string_equal(a, b);
    assert_true(strlen(a) > 1);
    free(b);
    /* a stop string cuts the output before it */
    char *cut = strlen(a) > 6 ? a + strlen(a) / 2 : NULL;
    if (cut) {
        char stop[8] = {0};
        memcpy(stop, cut, 3);
        if (!strchr(stop, '\'') && !strchr(stop, '\n') && !strchr(stop, '\\')) {
            snprintf(cmd, sizeof cmd, "%s run -m '%s' -p 'Hello there' --temp 1.5 --top-k 50 --seed 7 --max-tokens 24 --stop '%s'",
                     g4(), model, stop);
            assert_int_equal(run_cmd(cmd, NULL, &b, NULL), 0);
            char *first = strstr(a, stop);
            assert_non_null(first);
            assert_int_equal(strlen(b), (size_t)(first - a) + 1); /* + the final newline */
            assert_memory_equal(a, b, (size_t)(first - a));
            free(b);
        }
    }
    free(a);
    /* the prompt from stdin, with invalid UTF-8 in it: handled, not a crash */
    snprintf(cmd, sizeof cmd, "%s run -m '%s' -p - --raw --max-tokens 4 -q", g4(), model);
    assert_int_equal(run_cmd(cmd, "caf\xc3 \xff\xfe bad bytes", &a, NULL), 0);
    free(a);
}

static void test_chat_over_stdin(void **state) {
    (void)state;
    char cmd[2048], *out, *err;
    snprintf(cmd, sizeof cmd, "%s chat -m '%s' --max-tokens 12 -q", g4(), model);
    assert_int_equal(run_cmd(cmd, "Hi!\nAnd again?\n/reset\nHi!\n/think on\nWhy?\n/quit\n", &out, &err), 0);
    /* answers are newline-terminated; after /reset the first exchange repeats exactly */
    char *reset = strstr(out, "[conversation reset]\n");
    assert_non_null(reset);
    char *first_end = strchr(out, '\n');
    size_t first_len = (size_t)(first_end - out) + 1;
    char *after = reset + strlen("[conversation reset]\n");
    assert_memory_equal(out, after, first_len);
    assert_non_null(strstr(out, "[thinking on]"));
    free(out);
    free(err);
}

static void test_bad_input(void **state) {
    (void)state;
    char cmd[2048], tok[1024], *out, *err;
    /* a tokenizer whose vocabulary does not match the model */
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --tokenizer '%s' -p hi", g4(), model,
             test_fixture_path(tok, sizeof tok, "tokenizer/tokenizer.json"));
    assert_int_equal(run_cmd(cmd, NULL, &out, &err), 1);
    assert_non_null(strstr(err, "do not belong together"));
    free(out);
    free(err);
    /* a missing tokenizer file, a corrupt one */
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --tokenizer /nonexistent/tok.json -p hi", g4(), model);
    assert_int_equal(run_cmd(cmd, NULL, &out, &err), 1);
    assert_non_null(strstr(err, "/nonexistent/tok.json"));
    free(out);
    free(err);
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    FILE *f = fopen(bad, "wb");
    fputs("{\"model\": {\"vocab\": [1, 2", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --tokenizer '%s' -p hi", g4(), model, bad);
    assert_int_equal(run_cmd(cmd, NULL, &out, &err), 1);
    assert_non_null(strstr(err, "bad.json"));
    free(out);
    free(err);
    /* bad options */
    snprintf(cmd, sizeof cmd, "%s run -m '%s' -p hi --temp hot", g4(), model);
    assert_int_equal(run_cmd(cmd, NULL, &out, &err), 2);
    assert_non_null(strstr(err, "--temp"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' -p hi --top-p 1.5", g4(), model);
    assert_int_equal(run_cmd(cmd, NULL, &out, &err), 1);
    assert_non_null(strstr(err, "top_p"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --ids -p '2 999'", g4(), model);
    assert_int_equal(run_cmd(cmd, NULL, &out, &err), 1);
    assert_non_null(strstr(err, "999"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s run --help", g4());
    assert_int_equal(run_cmd(cmd, NULL, &out, NULL), 0);
    assert_non_null(strstr(out, "--draft"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s chat --help", g4());
    assert_int_equal(run_cmd(cmd, NULL, &out, NULL), 0);
    assert_non_null(strstr(out, "/reset"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_ids_matches_reference),
        cmocka_unit_test(test_run_text),
        cmocka_unit_test(test_chat_over_stdin),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
