/* Tests of the chat format: the renderer against the official template's output, the
 * programmatic conversation API against the JSON path, and the streaming parser of model turns. */
#include <cjson/cJSON.h>

#include "g4_chat.h"
#include "test_util.h"

/* ---- rendering: fixtures/chat/cases.jsonl ------------------------------------------------ */

/* Calls fn on each case of cases.jsonl (the line's text and its parsed JSON); returns the count. */
static int for_each_case(void (*fn)(const char *line, const cJSON *c, void *ctx), void *ctx) {
    char path[1024];
    char *text = test_read_file(test_fixture_path(path, sizeof path, "chat/cases.jsonl"), NULL);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!*line) continue;
        cJSON *c = cJSON_Parse(line);
        assert_non_null(c);
        fn(line, c, ctx);
        cJSON_Delete(c);
        n++;
    }
    free(text);
    return n;
}

typedef struct case_tally {
    int pass, fail;
} case_tally;

static const char *case_name(const cJSON *c) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
    return cJSON_IsString(name) ? name->valuestring : "?";
}

/* Reports where got and want first differ. */
static void report_diff(const char *name, const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    print_message("case %s differs at byte %zu:\n  got:  ...%.80s\n  want: ...%.80s\n", name, i,
                  got + i, want + i);
}

static void check_case(const char *line, const cJSON *c, void *ctx) {
    case_tally *t = ctx;
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "rendered");
    assert_true(cJSON_IsString(want));
    char *got = NULL;
    size_t len = 0;
    g4_error err = {0};
    g4_status st = g4_chat_render_json(line, &got, &len, &err);
    if (st != G4_OK) {
        print_message("case %s: %s\n", case_name(c), err.message);
        t->fail++;
        return;
    }
    assert_int_equal(len, strlen(got));
    if (strcmp(got, want->valuestring)) {
        report_diff(case_name(c), got, want->valuestring);
        t->fail++;
    } else
        t->pass++;
    free(got);
}

static void test_cases_byte_identical(void **state) {
    (void)state;
    case_tally t = {0};
    int n = for_each_case(check_case, &t);
    print_message("chat cases: %d of %d byte-identical\n", t.pass, n);
    assert_true(n > 0);
    assert_int_equal(t.fail, 0);
    assert_int_equal(t.pass, n);
}

/* Builds the case's conversation through the programmatic API, as `g4 chat` would. */
static g4_chat *build_with_api(const cJSON *c) {
    g4_chat *chat;
    g4_error err = {0};
    assert_int_equal(g4_chat_new(&chat, &err), G4_OK);
    const cJSON *opts = cJSON_GetObjectItemCaseSensitive(c, "options");
    const cJSON *thinking = cJSON_GetObjectItemCaseSensitive(opts, "enable_thinking");
    const cJSON *gen = cJSON_GetObjectItemCaseSensitive(opts, "add_generation_prompt");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(opts, "tools");
    if (thinking) g4_chat_set_thinking(chat, cJSON_IsTrue(thinking));
    if (gen) g4_chat_set_generation_prompt(chat, cJSON_IsTrue(gen));
    if (tools) {
        char *s = cJSON_PrintUnformatted(tools);
        assert_int_equal(g4_chat_set_tools_json(chat, s, &err), G4_OK);
        free(s);
    }
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(c, "messages")) {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const char *text = cJSON_IsString(content) ? content->valuestring : NULL;
        if (!strcmp(role, "system") && i == 0) {
            assert_int_equal(g4_chat_set_system(chat, text, &err), G4_OK);
        } else if (!strcmp(role, "user")) {
            assert_int_equal(g4_chat_add_message(chat, G4_ROLE_USER, text, &err), G4_OK);
        } else if (!strcmp(role, "assistant")) {
            assert_int_equal(g4_chat_add_message(chat, G4_ROLE_ASSISTANT, text, &err), G4_OK);
            const cJSON *tc;
            cJSON_ArrayForEach(tc, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
                char *args =
                    cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
                assert_int_equal(
                    g4_chat_add_tool_call(chat,
                                          cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring,
                                          args, cJSON_IsString(id) ? id->valuestring : NULL, &err),
                    G4_OK);
                free(args);
            }
        } else if (!strcmp(role, "tool")) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
            assert_int_equal(
                g4_chat_add_tool_response(chat, cJSON_IsString(name) ? name->valuestring : NULL,
                                          text, cJSON_IsString(id) ? id->valuestring : NULL, &err),
                G4_OK);
        } else
            fail_msg("case %s: role %s not handled by the test", case_name(c), role);
        i++;
    }
    return chat;
}

static void check_api_case(const char *line, const cJSON *c, void *ctx) {
    int *n = ctx;
    char *want, *got;
    g4_error err = {0};
    assert_int_equal(g4_chat_render_json(line, &want, NULL, &err), G4_OK);
    g4_chat *chat = build_with_api(c);
    assert_int_equal(g4_chat_render(chat, &got, NULL, &err), G4_OK);
    if (strcmp(got, want)) report_diff(case_name(c), got, want);
    assert_string_equal(got, want);
    free(got);
    free(want);
    g4_chat_free(chat);
    (*n)++;
}

static void test_api_equals_json(void **state) {
    (void)state;
    int n = 0;
    for_each_case(check_api_case, &n);
    assert_true(n > 0);
}

/* ---- rendering: more goldens --------------------------------------------------------------- */

/* Conversations reaching the template's less common branches, with the text jinja2 3.1.6
 * rendered for them from fixtures/chat/chat_template.jinja (trim_blocks and lstrip_blocks on,
 * bos_token "<bos>", add_generation_prompt defaulting to true). */
/* clang-format off: data tables keep one entry per line */
static const struct {
    const char *name, *json, *rendered;
} goldens[] = {
    {"numbers_and_duplicate_keys",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1.0,\"b\":1,\"c\":-0,\"d\":1E5,\"e\":12345678901234567890123,\"f\":1e400,\"g\":-0.0,\"h\":2.50,\"a\":7}}}]}]}",
     "<bos><|turn>user\nx<turn|>\n<|turn>model\n<|tool_call>call:f{a:7,b:1,c:0,d:100000.0,e:12345678901234567890123,f:inf,g:-0.0,h:2.5}<tool_call|><|tool_response>"},
    {"schema_odd_values",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"tools\":[{\"function\":{\"name\":\"f\",\"description\":[\"a\",\"it's\", \"q\\\"x\", \"\\u00a0\\u3000\\n\\u0001\303\251\"],\"parameters\":{\"type\":\"object\",\"properties\":{\"p\":{\"type\":[\"string\",\"null\"],\"description\":3.5},\"q\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[1,2.0,null,true]}},\"r\":{\"type\":\"object\",\"required\":\"ab\"},\"s\":{\"type\":\"object\",\"properties\":null,\"description\":\"d\",\"zz\":{\"type\":\"string\"}}},\"required\":\"xy\"}}}]}}",
     "<bos><|turn>system\n<|tool>declaration:f{description:<|\"|>['a', \"it's\", 'q\"x', '\\xa0\\u3000\\n\\x01\303\251']<|\"|>,parameters:{properties:{p:{description:<|\"|>3.5<|\"|>,type:<|\"|>['STRING', 'NULL']<|\"|>},q:{items:{enum:[1,2.0,None,true],type:<|\"|>STRING<|\"|>},type:<|\"|>ARRAY<|\"|>},r:{properties:{},required:[<|\"|>a<|\"|>,<|\"|>b<|\"|>],type:<|\"|>OBJECT<|\"|>},s:{description:<|\"|>d<|\"|>,properties:{zz:{type:<|\"|>STRING<|\"|>}},type:<|\"|>OBJECT<|\"|>}},required:[<|\"|>x<|\"|>,<|\"|>y<|\"|>],type:<|\"|>OBJECT<|\"|>}}<tool|><turn|>\n<|turn>user\nx<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"},
    {"declaration_without_type_and_response", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"tools\":[{\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"a\":{\"type\":\"string\"}}}}},{\"function\":{\"name\":\"g\",\"response\":{\"type\":\"object\",\"description\":\"r\"}}},{\"function\":{\"name\":\"h\",\"parameters\":{\"type\":\"object\"},\"response\":null}}]}}", "<bos><|turn>system\n<|tool>declaration:f{description:<|\"|><|\"|>,parameters:{properties:{a:{type:<|\"|>STRING<|\"|>}},}<tool|><|tool>declaration:g{description:<|\"|><|\"|>,response:{description:<|\"|>r<|\"|>,type:<|\"|>OBJECT<|\"|>}}<tool|><|tool>declaration:h{description:<|\"|><|\"|>,parameters:{type:<|\"|>OBJECT<|\"|>},response:{}<tool|><turn|>\n<|turn>user\nx<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"},
    {"legacy_tool_responses",
     "{\"messages\":[{\"role\":\"system\",\"content\":\"  s  \"},{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_responses\":[{\"name\":\"f\"},{\"response\":\"s\"},{\"name\":\"g\",\"response\":{\"B\":1,\"a\":[1,{\"x\":null}]}}]}]}",
     "<bos><|turn>system\ns<turn|>\n<|turn>user\nx<turn|>\n<|turn>model\n<|tool_response>response:f{value:[]}<tool_response|><|tool_response>response:unknown{value:<|\"|>s<|\"|>}<tool_response|><|tool_response>response:g{a:[1,{x:None}],B:1}<tool_response|>"},
    {"model_parts_and_call_without_response",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\" a<|channel>t<channel|>b \"},{\"type\":\"image\"}],\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]}]}",
     "<bos><|turn>user\nx<turn|>\n<|turn>model\n<|tool_call>call:f{}<tool_call|>ab<|image|><turn|>\n<|turn>model\n<|channel>thought\n<channel|>"},
    {"assistant_continuation",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},{\"role\":\"tool\",\"name\":\"t\",\"content\":\"r\"},{\"role\":\"assistant\",\"content\":\"c\"}]}",
     "<bos><|turn>user\nx<turn|>\n<|turn>model\na<turn|>\nb<turn|>\nc<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"},
    {"developer_roles",
     "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\" e \"}]},{\"role\":\"user\"}]}",
     "<bos><|turn>system\nd<turn|>\n<|turn>developer\ne<turn|>\n<|turn>user\n<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"},
    {"tool_call_id_matching", "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"reasoning\":\"\",\"reasoning_content\":\"rc\",\"tool_calls\":[{\"id\":1,\"function\":{\"name\":\"f\",\"arguments\":\"raw\"}}]},{\"role\":\"tool\",\"tool_call_id\":1.0,\"content\":null},{\"role\":\"tool\",\"tool_call_id\":true,\"name\":\"n\",\"content\":[]}]}", "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|channel>thought\nrc\n<channel|><|tool_call>call:f{raw}<tool_call|><|tool_response>response:f{value:None}<tool_response|><|tool_response>response:f{value:<|\"|><|\"|>}<tool_response|>"},
    {"nested_schema_thinking_system",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Be helpful.\\n\"}, {\"role\": \"user\", \"content\": \"Plan a trip\"}], \"options\": {\"enable_thinking\": true, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"book\", \"description\": \"Book things\", \"parameters\": {\"type\": \"object\", \"required\": [\"who\", \"legs\"], \"properties\": {\"who\": {\"type\": \"string\", \"description\": \"Traveller\"}, \"legs\": {\"type\": \"array\", \"description\": \"Flights\", \"items\": {\"type\": \"object\", \"required\": [\"from\"], \"properties\": {\"from\": {\"type\": \"string\"}, \"to\": {\"type\": \"string\", \"nullable\": true}, \"Class\": {\"type\": \"string\", \"enum\": [\"eco\", \"biz\"]}}}}, \"budget\": {\"type\": \"number\", \"nullable\": true}, \"prefs\": {\"type\": \"object\", \"properties\": {\"seat\": {\"type\": \"string\"}, \"meals\": {\"type\": \"array\", \"items\": {\"type\": [\"string\", \"null\"]}}}, \"required\": [\"seat\"]}, \"flex\": {\"type\": \"boolean\"}, \"count\": {\"type\": \"integer\", \"description\": \"How many\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"noop\", \"description\": \"Nothing\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}]}}", "<bos><|turn>system\n<|think|>\nBe helpful.<|tool>declaration:book{description:<|\"|>Book things<|\"|>,parameters:{properties:{budget:{nullable:true,type:<|\"|>NUMBER<|\"|>},count:{description:<|\"|>How many<|\"|>,type:<|\"|>INTEGER<|\"|>},flex:{type:<|\"|>BOOLEAN<|\"|>},legs:{description:<|\"|>Flights<|\"|>,items:{properties:{Class:{enum:[<|\"|>eco<|\"|>,<|\"|>biz<|\"|>],type:<|\"|>STRING<|\"|>},from:{type:<|\"|>STRING<|\"|>},to:{nullable:true,type:<|\"|>STRING<|\"|>}},required:[<|\"|>from<|\"|>],type:<|\"|>OBJECT<|\"|>},type:<|\"|>ARRAY<|\"|>},prefs:{properties:{meals:{items:{type:[<|\"|>STRING<|\"|>,<|\"|>NULL<|\"|>]},type:<|\"|>ARRAY<|\"|>},seat:{type:<|\"|>STRING<|\"|>}},required:[<|\"|>seat<|\"|>],type:<|\"|>OBJECT<|\"|>},who:{description:<|\"|>Traveller<|\"|>,type:<|\"|>STRING<|\"|>}},required:[<|\"|>who<|\"|>,<|\"|>legs<|\"|>],type:<|\"|>OBJECT<|\"|>}}<tool|><|tool>declaration:noop{description:<|\"|>Nothing<|\"|>,parameters:{type:<|\"|>OBJECT<|\"|>}}<tool|><turn|>\n<|turn>user\nPlan a trip<turn|>\n<|turn>model\n"},
    {"tool_loop_with_reasoning", "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris and Rome?\"}, {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"Two cities, two calls.\", \"tool_calls\": [{\"id\": \"a\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2, \"hourly\": false}}}, {\"id\": \"b\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"units\": [\"C\", \"F\"], \"opts\": {\"Z\": 1.25, \"a\": null}}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"b\", \"content\": \"sunny\"}, {\"role\": \"tool\", \"tool_call_id\": \"a\", \"content\": [{\"type\": \"text\", \"text\": \"rain \"}, {\"type\": \"text\", \"text\": \"later\"}]}, {\"role\": \"assistant\", \"content\": \"Paris: rain; Rome: sunny.\"}, {\"role\": \"user\", \"content\": \"Thanks\"}], \"options\": {\"enable_thinking\": true}}", "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nWeather in Paris and Rome?<turn|>\n<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2,hourly:false}<tool_call|><|tool_call>call:get_weather{city:<|\"|>Rome<|\"|>,opts:{a:None,Z:1.25},units:[<|\"|>C<|\"|>,<|\"|>F<|\"|>]}<tool_call|><|tool_response>response:get_weather{value:<|\"|>sunny<|\"|>}<tool_response|><|tool_response>response:get_weather{value:<|\"|>rain later<|\"|>}<tool_response|>Paris: rain; Rome: sunny.<turn|>\n<|turn>user\nThanks<turn|>\n<|turn>model\n"},
    {"tool_results_then_generation",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"reasoning\": \"call it\", \"tool_calls\": [{\"function\": {\"name\": \"now\", \"arguments\": {}}}]}, {\"role\": \"tool\", \"name\": \"now\", \"content\": 12.5}], \"options\": {}}",
     "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\ncall it\n<channel|><|tool_call>call:now{}<tool_call|><|tool_response>response:now{value:12.5}<tool_response|>"},
    {"media_parts",
     "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}, {\"type\": \"text\", \"text\": \"  What is this?  \"}, {\"type\": \"audio\"}, {\"type\": \"video\"}, {\"type\": \"image_url\"}]}], \"options\": {\"add_generation_prompt\": true}}",
     "<bos><|turn>user\n<|image|>What is this?<|audio|><|video|><turn|>\n<|turn>model\n<|channel>thought\n<channel|>"},
    {"media_last_no_prompt",
     "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"see\"}, {\"type\": \"image\"}]}], \"options\": {\"add_generation_prompt\": false}}",
     "<bos><|turn>user\nsee<|image|><turn|>\n"},
    {"unicode_whitespace_trim", "{\"messages\": [{\"role\": \"user\", \"content\": \"\343\200\200\302\240 text \342\200\250\\u001c\"}, {\"role\": \"assistant\", \"content\": \"\\n<|channel>thought\\nhmm<channel|>\343\200\200 ok \\n\"}], \"options\": {\"add_generation_prompt\": false}}",
     "<bos><|turn>user\ntext<turn|>\n<|turn>model\nok<turn|>\n"},
};
/* clang-format on */

static void test_more_goldens(void **state) {
    (void)state;
    int fails = 0;
    for (size_t i = 0; i < sizeof goldens / sizeof goldens[0]; i++) {
        char *got = NULL;
        g4_error err = {0};
        if (g4_chat_render_json(goldens[i].json, &got, NULL, &err) != G4_OK) {
            print_message("golden %s: %s\n", goldens[i].name, err.message);
            fails++;
            continue;
        }
        if (strcmp(got, goldens[i].rendered)) {
            report_diff(goldens[i].name, got, goldens[i].rendered);
            fails++;
        }
        free(got);
    }
    assert_int_equal(fails, 0);
}

/* ---- the programmatic API ------------------------------------------------------------------ */

static char *render(g4_chat *c) {
    char *s = NULL;
    g4_error err = {0};
    if (g4_chat_render(c, &s, NULL, &err) != G4_OK) fail_msg("render: %s", err.message);
    return s;
}

static void test_api_multi_turn(void **state) {
    (void)state;
    g4_chat *c;
    g4_error err = {0};
    assert_int_equal(g4_chat_new(&c, &err), G4_OK);
    assert_int_equal(g4_chat_set_system(c, "You are terse.", &err), G4_OK);
    assert_int_equal(g4_chat_add_message(c, G4_ROLE_USER, "Hi", &err), G4_OK);
    char *s = render(c);
    assert_string_equal(s, "<bos><|turn>system\nYou are terse.<turn|>\n<|turn>user\nHi<turn|>\n"
                           "<|turn>model\n<|channel>thought\n<channel|>");
    free(s);

    /* Replacing and then removing the system prompt; thinking on. */
    assert_int_equal(g4_chat_set_system(c, "  Be kind. ", &err), G4_OK);
    assert_int_equal(
        g4_chat_add_message(c, G4_ROLE_ASSISTANT, "<|channel>thought\nhm<channel|>Hello!", &err),
        G4_OK);
    assert_int_equal(g4_chat_add_message(c, G4_ROLE_USER, "Again", &err), G4_OK);
    assert_int_equal(g4_chat_count(c), 4);
    g4_chat_set_thinking(c, 1);
    s = render(c);
    assert_string_equal(s,
                        "<bos><|turn>system\n<|think|>\nBe kind.<turn|>\n<|turn>user\nHi<turn|>\n"
                        "<|turn>model\nHello!<turn|>\n<|turn>user\nAgain<turn|>\n<|turn>model\n");
    free(s);
    assert_int_equal(g4_chat_set_system(c, NULL, &err), G4_OK);
    g4_chat_set_thinking(c, 0);
    g4_chat_truncate(c, 1);
    g4_chat_set_generation_prompt(c, 0);
    s = render(c);
    assert_string_equal(s, "<bos><|turn>user\nHi<turn|>\n");
    free(s);

    /* A tool round trip, reasoning included (shown because it follows the last user turn). */
    g4_chat_set_generation_prompt(c, 1);
    assert_int_equal(g4_chat_add_message(c, G4_ROLE_ASSISTANT, NULL, &err), G4_OK);
    assert_int_equal(g4_chat_set_reasoning(c, "Need the time.", &err), G4_OK);
    assert_int_equal(
        g4_chat_add_tool_call(c, "clock", "{\"tz\":\"UTC\",\"fmt\":[1,2.5]}", "t1", &err), G4_OK);
    s = render(c);
    assert_string_equal(
        s, "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\nNeed the time.\n"
           "<channel|><|tool_call>call:clock{fmt:[1,2.5],tz:<|\"|>UTC<|\"|>}<tool_call|>"
           "<|tool_response>");
    free(s);
    assert_int_equal(g4_chat_add_tool_response(c, NULL, "12:00", "t1", &err), G4_OK);
    s = render(c);
    assert_non_null(
        strstr(s, "<|tool_response>response:clock{value:<|\"|>12:00<|\"|>}<tool_response|>"));
    assert_int_equal(strstr(s, "<tool_response|>")[16], 0); /* the model turn stays open */
    free(s);
    assert_int_equal(
        g4_chat_add_message_json(c, "{\"role\":\"assistant\",\"content\":\"It is noon.\"}", &err),
        G4_OK);
    s = render(c);
    assert_non_null(strstr(
        s, "<tool_response|>It is noon.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"));
    free(s);
    g4_chat_free(c);
}

static void expect_api_error(g4_status st, g4_status want, const g4_error *err,
                             const char *needle) {
    assert_int_equal(st, want);
    if (!strstr(err->message, needle)) fail_msg("error '%s' lacks '%s'", err->message, needle);
}

static void test_api_errors(void **state) {
    (void)state;
    g4_chat *c;
    g4_error err = {0};
    assert_int_equal(g4_chat_new(&c, &err), G4_OK);
    char *s = NULL;
    expect_api_error(g4_chat_render(c, &s, NULL, &err), G4_ERR_FORMAT, &err, "no messages");
    assert_null(s);
    expect_api_error(g4_chat_add_tool_call(c, "f", "{}", NULL, &err), G4_ERR_ARG, &err,
                     "not an assistant message");
    expect_api_error(g4_chat_set_reasoning(c, "x", &err), G4_ERR_ARG, &err,
                     "not an assistant message");
    assert_int_equal(g4_chat_add_message(c, G4_ROLE_ASSISTANT, "", &err), G4_OK);
    expect_api_error(g4_chat_add_tool_call(c, "f", "[1]", NULL, &err), G4_ERR_FORMAT, &err,
                     "not a JSON object");
    expect_api_error(g4_chat_add_tool_call(c, "f", "{\"a\":", NULL, &err), G4_ERR_FORMAT, &err,
                     "bad JSON");
    expect_api_error(g4_chat_add_tool_response(c, NULL, "x", NULL, &err), G4_ERR_ARG, &err,
                     "name or a tool_call_id");
    expect_api_error(g4_chat_add_message(c, (g4_chat_role)42, "x", &err), G4_ERR_ARG, &err,
                     "unknown role");
    expect_api_error(g4_chat_add_message_json(c, "{\"role\":\"robot\",\"content\":\"x\"}", &err),
                     G4_ERR_FORMAT, &err, "messages[1].role 'robot'");
    expect_api_error(g4_chat_add_message_json(c, "{\"role\":\"user\",\"content\":7}", &err),
                     G4_ERR_FORMAT, &err, "messages[1].content must be a string or an array");
    expect_api_error(g4_chat_set_tools_json(c, "{\"function\":{}}", &err), G4_ERR_FORMAT, &err,
                     "tools is not an array");
    expect_api_error(g4_chat_set_tools_json(c, "[{\"function\":{\"description\":\"d\"}}]", &err),
                     G4_ERR_FORMAT, &err, "tools[0].function.name");
    assert_int_equal(g4_chat_count(c), 1);
    g4_chat_free(c);
}

/* ---- rendering: malformed conversations ---------------------------------------------------- */

static void test_render_errors(void **state) {
    (void)state;
    static const struct {
        const char *json;
        const char *needle;
    } bad[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}", "bad JSON"},
        {"[1,2]", "not an object"},
        {"{\"options\":{}}", "\"messages\" is missing"},
        {"{\"messages\":[]}", "no messages"},
        {"{\"messages\":[\"hi\"]}", "messages[0] is not an object"},
        {"{\"messages\":[{\"content\":\"x\"}]}", "messages[0] has no \"role\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"robot\",\"content\":\"y\"}]}",
         "messages[1].role 'robot' is not one of"},
        {"{\"messages\":[{\"role\":3,\"content\":\"x\"}]}", "messages[0].role is not a string"},
        {"{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"s\"}]}]}",
         "messages[0].content: a leading system message's content must be a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":{\"text\":\"x\"}}]}",
         "messages[0].content must be a string or an array of content parts"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":true}]}",
         "messages[0].content must be a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
         "messages[0].content[0]: a text part's \"text\" must be a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}",
         "messages[0].content[0] is not an object"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":{}}}]}]}",
         "messages[0].tool_calls[0].function.name must be a string"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{\"a\":1}}]}",
         "messages[0].tool_calls is not an array"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"reasoning\":[1]}]}",
         "messages[0].reasoning must be a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":"
         "[{\"id\":\"a\",\"function\":{\"name\":\"f\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"r\"}]}",
         "messages[2]: a tool message needs a \"name\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"enable_thinking\":\"yes\"}}",
         "options.enable_thinking must be true or false"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"thinking\":true}}",
         "options.thinking: unknown option"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\"}]}",
         "tools[0] has no \"function\" object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"function\":{\"name\":\"f\","
         "\"parameters\":{\"properties\":[1]}}}]}",
         "tools[0].function.parameters.properties is not an object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"function\":{\"name\":\"f\","
         "\"parameters\":{\"type\":\"object\",\"required\":5}}}]}",
         "parameters.required is not an array"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":007}]}", "bad JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = (char *)1;
        g4_error err = {0};
        g4_status st = g4_chat_render_json(bad[i].json, &out, NULL, &err);
        if (st == G4_OK) fail_msg("accepted: %s", bad[i].json);
        assert_int_equal(st, G4_ERR_FORMAT);
        assert_null(out);
        if (!strstr(err.message, bad[i].needle))
            fail_msg("for %s\n  error '%s' lacks '%s'", bad[i].json, err.message, bad[i].needle);
    }
    char *out;
    assert_int_equal(g4_chat_render_json(NULL, &out, NULL, NULL), G4_ERR_ARG);
}

/* ---- the output parser --------------------------------------------------------------------- */

/* Everything a parse produced, flattened for comparison; also what the events said. */
typedef struct parse_result {
    char *thinking, *content, *calls; /* calls: one line per call: name|arguments|error */
    g4_chat_stop stop;
    char ev_thinking[4096], ev_content[4096];
    size_t ev_tl, ev_cl;
    int ev_calls, ev_done, bad_utf8_delta;
} parse_result;

static int utf8_whole(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

static void on_event(void *user, const g4_chat_event *ev) {
    parse_result *r = user;
    switch (ev->type) {
    case G4_CHAT_EV_THINKING:
    case G4_CHAT_EV_CONTENT: {
        assert_true(ev->len > 0);
        if (!utf8_whole(ev->text, ev->len)) r->bad_utf8_delta = 1;
        char *dst = ev->type == G4_CHAT_EV_THINKING ? r->ev_thinking : r->ev_content;
        size_t *l = ev->type == G4_CHAT_EV_THINKING ? &r->ev_tl : &r->ev_cl;
        assert_true(*l + ev->len < sizeof r->ev_thinking);
        memcpy(dst + *l, ev->text, ev->len);
        *l += ev->len;
        dst[*l] = 0;
        break;
    }
    case G4_CHAT_EV_TOOL_CALL: r->ev_calls++; break;
    case G4_CHAT_EV_DONE: r->ev_done++; break;
    }
}

static char *dupstr(const char *s) {
    char *d = malloc(strlen(s) + 1);
    assert_non_null(d);
    strcpy(d, s);
    return d;
}

/* Parses text fed in the given chunk sizes (cuts: ascending split offsets, n_cuts of them). */
static void parse_split(const char *text, size_t len, const size_t *cuts, int n_cuts,
                        parse_result *r) {
    memset(r, 0, sizeof *r);
    g4_chat_parser *p;
    g4_error err = {0};
    assert_int_equal(g4_chat_parser_new(on_event, r, &p, &err), G4_OK);
    size_t at = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        assert_int_equal(g4_chat_parser_feed(p, text + at, end - at, &err), G4_OK);
        at = end;
    }
    assert_int_equal(g4_chat_parser_finish(p, &err), G4_OK);
    r->thinking = dupstr(g4_chat_parser_thinking(p, NULL));
    r->content = dupstr(g4_chat_parser_content(p, NULL));
    r->stop = g4_chat_parser_stop(p);
    size_t cap = 16;
    for (size_t i = 0; i < g4_chat_parser_n_tool_calls(p); i++) {
        const g4_chat_tool_call *c = g4_chat_parser_tool_call(p, i);
        cap += strlen(c->raw) + (c->name ? strlen(c->name) : 0) +
               (c->arguments ? strlen(c->arguments) : 0) + (c->error ? strlen(c->error) : 0) + 8;
    }
    r->calls = calloc(1, cap);
    for (size_t i = 0; i < g4_chat_parser_n_tool_calls(p); i++) {
        const g4_chat_tool_call *c = g4_chat_parser_tool_call(p, i);
        assert_true((c->arguments == NULL) != (c->error == NULL));
        sprintf(r->calls + strlen(r->calls), "%s|%s|%s\n", c->name ? c->name : "-",
                c->arguments ? c->arguments : "-", c->error ? c->error : "-");
    }
    assert_null(g4_chat_parser_tool_call(p, g4_chat_parser_n_tool_calls(p)));
    /* The events tell the same story as the accessors. */
    assert_string_equal(r->ev_thinking, r->thinking);
    assert_string_equal(r->ev_content, r->content);
    assert_int_equal(r->ev_calls, (int)g4_chat_parser_n_tool_calls(p));
    assert_int_equal(r->ev_done, 1);
    g4_chat_parser_free(p);
}

static void free_result(parse_result *r) {
    free(r->thinking);
    free(r->content);
    free(r->calls);
}

static void assert_same(const parse_result *a, const parse_result *b, const char *how) {
    if (strcmp(a->thinking, b->thinking) || strcmp(a->content, b->content) ||
        strcmp(a->calls, b->calls) || a->stop != b->stop)
        fail_msg(
            "%s: results differ\n  thinking '%s' vs '%s'\n  content '%s' vs '%s'\n  calls '%s' vs '%s'",
            how, a->thinking, b->thinking, a->content, b->content, a->calls, b->calls);
}

/* Parses text whole, at every single split point, at every pair of split points (short texts),
 * and byte by byte; all must agree, and with utf8 (valid input) every delta must be whole
 * characters. Returns the whole-text result. */
static void parse_all_ways(const char *text, int utf8, parse_result *whole) {
    size_t len = strlen(text);
    parse_split(text, len, NULL, 0, whole);
    if (utf8) assert_false(whole->bad_utf8_delta);
    char how[64];
    for (size_t k = 0; k <= len; k++) {
        parse_result r;
        parse_split(text, len, &k, 1, &r);
        snprintf(how, sizeof how, "split at %zu", k);
        assert_same(whole, &r, how);
        if (utf8 && r.bad_utf8_delta) fail_msg("%s: a delta splits a character", how);
        free_result(&r);
        if (len <= 80)
            for (size_t k2 = k; k2 <= len; k2++) {
                size_t cuts[2] = {k, k2};
                parse_split(text, len, cuts, 2, &r);
                snprintf(how, sizeof how, "split at %zu and %zu", k, k2);
                assert_same(whole, &r, how);
                if (utf8 && r.bad_utf8_delta) fail_msg("%s: a delta splits a character", how);
                free_result(&r);
            }
    }
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    for (size_t k = 0; k < len; k++) cuts[k] = k + 1;
    parse_result r;
    parse_split(text, len, cuts, len ? (int)len - 1 : 0, &r);
    assert_same(whole, &r, "byte by byte");
    if (utf8) assert_false(r.bad_utf8_delta);
    free_result(&r);
    free(cuts);
}

/* clang-format off: data tables keep one entry per line */
static const struct parse_case {
    const char *name, *text, *thinking, *content, *calls;
    g4_chat_stop stop;
    int valid_utf8;
} parse_cases[] = {
    {"plain answer", "Hello there!<turn|>", "", "Hello there!", "", G4_CHAT_STOP_TURN, 1},
    {"thinking then answer",
     "<|channel>thought\nLet me think.\n17*23 = 391\n<channel|>The answer is 391.<turn|>",
     "Let me think.\n17*23 = 391\n", "The answer is 391.", "", G4_CHAT_STOP_TURN, 1},
    {"empty thought channel", "<|channel>thought\n<channel|>Answer<turn|>", "", "Answer", "",
     G4_CHAT_STOP_TURN, 1},
    {"tool call",
     "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|><|tool_response>", "", "",
     "get_weather|{\"city\":\"Paris\"}|-\n", G4_CHAT_STOP_TOOL_RESPONSE, 1},
    {"nested arguments",
     "<|channel>thought\nTwo calls.<channel|>Checking.<|tool_call>call:book{legs:[{from:<|\"|>CDG<|\"|>,to:<|\"|>FCO"
     "<|\"|>}],n:2,ratio:-1.5e-3,ok:true,no:false,none:None,nil:null,big:12345678901234567890,"
     "<|\"|>quoted key<|\"|>:{},text:<|\"|>say \"hi\"\\ \n\t{x:1}, <b> <turn <|\"|>,list:[],e:[[1],[2.0]]}"
     "<tool_call|><|tool_call>call:ping{}<tool_call|><|tool_response>trailing ignored",
     "Two calls.", "Checking.",
     "book|{\"legs\":[{\"from\":\"CDG\",\"to\":\"FCO\"}],\"n\":2,\"ratio\":-1.5e-3,\"ok\":true,\"no\":false,"
     "\"none\":null,\"nil\":null,\"big\":12345678901234567890,\"quoted key\":{},\"text\":\"say \\\"hi\\\"\\\\ "
     "\\n\\t{x:1}, <b> <turn \",\"list\":[],\"e\":[[1],[2.0]]}|-\nping|{}|-\n",
     G4_CHAT_STOP_TOOL_RESPONSE, 1},
    {"whitespace in arguments", "<|tool_call>call:f{ a : 1 , b :[ 1 , 2 ] }<tool_call|><turn|>", "",
     "", "f|{\"a\":1,\"b\":[1,2]}|-\n", G4_CHAT_STOP_TURN, 1},
    {"angle brackets in text", "a < b, <b>bold</b> <|not a marker|> <turn> <tool_call|> x<", "",
     "a < b, <b>bold</b> <|not a marker|> <turn> <tool_call|> x<", "", G4_CHAT_STOP_NONE, 1},
    {"marker prefix at the end", "answer <turn", "", "answer <turn", "", G4_CHAT_STOP_NONE, 1},
    {"unicode", "<|channel>thought\n日本語?<channel|>Übersetzt: 🦙 ok<turn|>", "日本語?",
     "Übersetzt: 🦙 ok", "", G4_CHAT_STOP_TURN, 1},
    {"stray channel close and text after the end", "Hi<channel|> there<turn|>ignored<|tool_call>x",
     "", "Hi there", "", G4_CHAT_STOP_TURN, 1},
    {"eos", "Done.<eos>", "", "Done.", "", G4_CHAT_STOP_EOS, 1},
    {"thinking cut off", "<|channel>thought\nhmm <chan", "hmm <chan", "", "", G4_CHAT_STOP_NONE, 1},
    {"runaway channel name", "<|channel>\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\nrest<channel|>",
     "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\nrest", "", "", G4_CHAT_STOP_NONE, 1},
    {"channel name without newline", "<|channel>thought<channel|>x<turn|>", "", "x", "",
     G4_CHAT_STOP_TURN, 1},
    {"two thought blocks", "<|channel>thought\na<channel|>b<|channel>thought\nc<channel|>d", "ac",
     "bd", "", G4_CHAT_STOP_NONE, 1},
    {"invalid utf-8 passes through", "x\xff\xc3(\xe6\x97<turn|>", "", "x\xff\xc3(\xe6\x97", "",
     G4_CHAT_STOP_TURN, 0},
    /* Malformed calls: flagged, never fatal; the stream goes on. */
    {"unquoted string", "<|tool_call>call:f{city:Paris}<tool_call|>after<turn|>", "", "after",
     "f|-|tool call f: unquoted value 'Paris' at byte 12 of the call\n", G4_CHAT_STOP_TURN, 1},
    {"unterminated string", "<|tool_call>call:f{a:<|\"|>x}<tool_call|><turn|>", "", "",
     "f|-|tool call f: unterminated <|\"|> string at byte 9 of the call\n", G4_CHAT_STOP_TURN, 1},
    {"no call prefix", "<|tool_call>get{}<tool_call|>", "", "",
     "-|-|tool call: expected 'call:' at byte 0 of the call\n", G4_CHAT_STOP_NONE, 1},
    {"no name", "<|tool_call>call:{}<tool_call|>", "", "",
     "-|-|tool call: expected a function name after 'call:' at byte 5 of the call\n",
     G4_CHAT_STOP_NONE, 1},
    {"no arguments", "<|tool_call>call:f<tool_call|>", "", "",
     "f|-|tool call f: expected '{' after the function name at byte 6 of the call\n",
     G4_CHAT_STOP_NONE, 1},
    {"trailing text", "<|tool_call>call:f{a:1}}<tool_call|>", "", "",
     "f|-|tool call f: unexpected text after the arguments at byte 11 of the call\n",
     G4_CHAT_STOP_NONE, 1},
    {"missing colon", "<|tool_call>call:f{a 1}<tool_call|>", "", "",
     "f|-|tool call f: expected ':' after a key at byte 10 of the call\n", G4_CHAT_STOP_NONE, 1},
    {"missing comma", "<|tool_call>call:f{a:[1 2]}<tool_call|>", "", "",
     "f|-|tool call f: expected ',' or ']' at byte 12 of the call\n", G4_CHAT_STOP_NONE, 1},
    {"bad number", "<|tool_call>call:f{a:01}<tool_call|>", "", "",
     "f|-|tool call f: unquoted value '01' at byte 9 of the call\n", G4_CHAT_STOP_NONE, 1},
    {"cut off by the turn end", "<|tool_call>call:f{a:1<turn|>", "", "",
     "f|-|tool call f: unterminated object at byte 10 of the call (and no <tool_call|> before the end)\n",
     G4_CHAT_STOP_TURN, 1},
    {"cut off by the stream end", "<|tool_call>call:f{a:1}", "", "",
     "f|-|tool call f: no <tool_call|> before the end\n", G4_CHAT_STOP_NONE, 1},
};
/* clang-format on */

static void test_parser_cases(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof parse_cases / sizeof parse_cases[0]; i++) {
        const struct parse_case *pc = &parse_cases[i];
        parse_result r;
        parse_all_ways(pc->text, pc->valid_utf8, &r);
        if (strcmp(r.thinking, pc->thinking) || strcmp(r.content, pc->content) ||
            strcmp(r.calls, pc->calls) || r.stop != pc->stop)
            fail_msg("parse case '%s':\n  thinking '%s'\n  content '%s'\n  calls '%s'\n  stop %d",
                     pc->name, r.thinking, r.content, r.calls, (int)r.stop);
        /* Arguments are real JSON. */
        for (char *line = r.calls; *line;) {
            char *bar = strchr(line, '|'), *bar2 = strchr(bar + 1, '|'), *nl = strchr(bar2, '\n');
            if (bar2[1] == '-' && bar2[2] == '\n') {
                *bar2 = 0;
                cJSON *j = cJSON_Parse(bar + 1);
                if (!j) fail_msg("parse case '%s': arguments are not JSON: %s", pc->name, bar + 1);
                cJSON_Delete(j);
                *bar2 = '|';
            }
            line = nl + 1;
        }
        free_result(&r);
    }
}

/* Text is passed on as soon as it cannot start a marker, and only whole characters. */
static void test_parser_streams_promptly(void **state) {
    (void)state;
    parse_result r = {0};
    g4_chat_parser *p;
    g4_error err = {0};
    assert_int_equal(g4_chat_parser_new(on_event, &r, &p, &err), G4_OK);
    assert_int_equal(g4_chat_parser_feed(p, "Hello", 5, &err), G4_OK);
    assert_string_equal(r.ev_content, "Hello");
    assert_int_equal(g4_chat_parser_feed(p, " <tu", 4, &err), G4_OK);
    assert_string_equal(r.ev_content, "Hello "); /* "<tu" may begin <turn|> */
    assert_int_equal(g4_chat_parser_feed(p, "be> \xe6\x97", 6, &err), G4_OK);
    assert_string_equal(r.ev_content, "Hello <tube> "); /* half a character held */
    assert_int_equal(g4_chat_parser_feed(p, "\xa5<|tool_call>call:f{", 20, &err), G4_OK);
    assert_string_equal(r.ev_content, "Hello <tube> \xe6\x97\xa5");
    assert_int_equal(r.ev_calls, 0);
    assert_int_equal(g4_chat_parser_feed(p, "}<tool_call|>", 13, &err), G4_OK);
    assert_int_equal(r.ev_calls, 1); /* reported as soon as it closes */
    assert_int_equal(g4_chat_parser_stop(p), G4_CHAT_STOP_NONE);
    assert_int_equal(g4_chat_parser_feed(p, "<|tool_response>", 16, &err), G4_OK);
    assert_int_equal(g4_chat_parser_stop(p), G4_CHAT_STOP_TOOL_RESPONSE);
    assert_int_equal(r.ev_done, 1);
    assert_int_equal(g4_chat_parser_feed(p, "more", 4, &err), G4_OK); /* ignored after the end */
    assert_int_equal(g4_chat_parser_finish(p, &err), G4_OK);
    assert_int_equal(r.ev_done, 1);
    assert_string_equal(g4_chat_parser_content(p, NULL), "Hello <tube> \xe6\x97\xa5");
    assert_int_equal(g4_chat_parser_feed(NULL, "x", 1, &err), G4_ERR_ARG);
    g4_chat_parser_free(p);
}

/* Random text made of marker pieces and ordinary bytes: whatever it is, the parser must not
 * crash and must give the same result for any chunking. */
static void test_parser_garbage(void **state) {
    (void)state;
    static const char *const pieces[] = {"<|channel>",
                                         "thought\n",
                                         "<channel|>",
                                         "<|tool_call>",
                                         "call:",
                                         "f",
                                         "{",
                                         "}",
                                         "[",
                                         "]",
                                         ":",
                                         ",",
                                         "<|\"|>",
                                         "<tool_call|>",
                                         "<|tool_response>",
                                         "<turn|>",
                                         "<eos>",
                                         "<",
                                         "|",
                                         ">",
                                         "a",
                                         " ",
                                         "1",
                                         "-",
                                         "\xc3\xa9",
                                         "\xe6",
                                         "None",
                                         "<|",
                                         "<tool"};
    uint32_t seed = 12345;
    for (int iter = 0; iter < 300; iter++) {
        char text[200] = "";
        int n = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 24;
        for (int k = 0; k < n; k++) {
            seed = seed * 1103515245u + 12345u;
            const char *piece = pieces[(seed >> 16) % (sizeof pieces / sizeof pieces[0])];
            if (strlen(text) + strlen(piece) < sizeof text) strcat(text, piece);
        }
        parse_result r;
        parse_all_ways(text, 0, &r);
        free_result(&r);
    }
}

/* Parsed tool calls go back into the conversation and render as the model wrote them. */
static void test_parse_then_render(void **state) {
    (void)state;
    const char *out = "Let me look.<|tool_call>call:search{limit:5,query:<|\"|>llamas<|\"|>,"
                      "filters:{lang:[<|\"|>en<|\"|>],safe:true}}<tool_call|><|tool_response>";
    g4_chat_parser *p;
    g4_error err = {0};
    assert_int_equal(g4_chat_parser_new(NULL, NULL, &p, &err), G4_OK);
    assert_int_equal(g4_chat_parser_feed(p, out, strlen(out), &err), G4_OK);
    assert_int_equal(g4_chat_parser_stop(p), G4_CHAT_STOP_TOOL_RESPONSE);
    assert_int_equal(g4_chat_parser_n_tool_calls(p), 1);
    const g4_chat_tool_call *call = g4_chat_parser_tool_call(p, 0);
    assert_string_equal(call->name, "search");

    g4_chat *c;
    assert_int_equal(g4_chat_new(&c, &err), G4_OK);
    assert_int_equal(g4_chat_add_message(c, G4_ROLE_USER, "Find llamas", &err), G4_OK);
    assert_int_equal(
        g4_chat_add_message(c, G4_ROLE_ASSISTANT, g4_chat_parser_content(p, NULL), &err), G4_OK);
    assert_int_equal(g4_chat_add_tool_call(c, call->name, call->arguments, NULL, &err), G4_OK);
    char *s = render(c);
    /* The template writes keys sorted and content after the calls. */
    assert_string_equal(
        s, "<bos><|turn>user\nFind llamas<turn|>\n<|turn>model\n<|tool_call>call:search{"
           "filters:{lang:[<|\"|>en<|\"|>],safe:true},limit:5,query:<|\"|>llamas<|\"|>}"
           "<tool_call|>Let me look.<|tool_response>");
    free(s);
    g4_chat_free(c);
    g4_chat_parser_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_byte_identical), cmocka_unit_test(test_api_equals_json),
        cmocka_unit_test(test_more_goldens),         cmocka_unit_test(test_api_multi_turn),
        cmocka_unit_test(test_api_errors),           cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_parser_cases),         cmocka_unit_test(test_parser_streams_promptly),
        cmocka_unit_test(test_parser_garbage),       cmocka_unit_test(test_parse_then_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
