/* test_proto: the JSON-line codec: every op, every validation error, ids, encoders, client-side events and round trips. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

/* ------------------------------------------------------------------ helpers */

/* Parses line (NUL-terminated) and asserts success. */
static void parse_ok(const char *line, int admin, proto_req_t *r)
{
    char err[256] = "";
    json_t *id = NULL;
    int rc = proto_parse_request(line, strlen(line), admin, r, &id, err, sizeof err);
    cr_assert_eq(rc, 0, "parse failed (%d: %s) for %s", rc, err, line);
    cr_assert_null(id, "id_out is only set on failure");
}

static int is_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

/* Parses len bytes of line, asserts the error code and that the message
 * contains want; returns the id the parser read (caller decrefs). */
static json_t *parse_fail_n(const char *line, size_t len, int admin, proto_err_t code,
                            const char *want)
{
    proto_req_t r;
    char err[256] = "";
    json_t *id = (json_t *)1;
    int rc = proto_parse_request(line, len, admin, &r, &id, err, sizeof err);
    cr_assert_eq(rc, -(int)code, "expected %s, got %d (%s) for %.200s", proto_err_code(code), rc,
                 err, line);
    cr_assert(strstr(err, want), "message '%s' should mention '%s' (line %.200s)", err, want, line);
    cr_assert(is_zero(&r, sizeof r), "req must be left empty on failure");
    proto_req_free(&r);
    return id;
}

static json_t *parse_fail(const char *line, int admin, proto_err_t code, const char *want)
{
    return parse_fail_n(line, strlen(line), admin, code, want);
}

/* Asserts a bad_request naming want, on the inference socket, with whatever id. */
static void bad(const char *line, const char *want)
{
    json_decref(parse_fail(line, 0, PROTO_E_BAD_REQUEST, want));
}

/* Asserts a line is one line ending in '\n' and returns it reparsed (caller decrefs). */
static json_t *reparse_line(char *line)
{
    cr_assert_not_null(line);
    size_t n = strlen(line);
    cr_assert_gt(n, 1);
    cr_assert_eq(line[n - 1], '\n', "line must end in a newline");
    cr_assert_null(memchr(line, '\n', n - 1), "line must hold no other newline: %s", line);
    json_error_t je;
    json_t *j = json_loadb(line, n - 1, JSON_REJECT_DUPLICATES, &je);
    cr_assert_not_null(j, "encoder output does not reparse: %s (%s)", je.text, line);
    cr_assert(json_is_object(j));
    free(line);
    return j;
}

static const char *sget(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    cr_assert(json_is_string(v), "field '%s' should be a string", k);
    return json_string_value(v);
}

static json_int_t iget(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    cr_assert(json_is_integer(v), "field '%s' should be an integer", k);
    return json_integer_value(v);
}

static double rget(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    cr_assert(json_is_number(v), "field '%s' should be a number", k);
    return json_number_value(v);
}

static int str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Field-by-field equality of two parsed requests. */
static void assert_req_eq(const proto_req_t *a, const proto_req_t *b)
{
    cr_assert_eq(a->op, b->op);
    cr_assert((!a->id && !b->id) || json_equal(a->id, b->id), "id differs");
    cr_assert(str_eq(a->model, b->model));
    cr_assert(str_eq(a->prompt, b->prompt));
    cr_assert_eq(a->n_tokens, b->n_tokens);
    for (size_t i = 0; i < a->n_tokens; i++)
        cr_assert_eq(a->tokens[i], b->tokens[i]);
    cr_assert_eq(a->n_messages, b->n_messages);
    for (size_t i = 0; i < a->n_messages; i++) {
        cr_assert_str_eq(a->messages[i].role, b->messages[i].role);
        cr_assert_str_eq(a->messages[i].content, b->messages[i].content);
    }
    cr_assert(str_eq(a->text, b->text));
    cr_assert_eq(a->add_bos, b->add_bos);
    cr_assert(str_eq(a->target, b->target));
    cr_assert((!a->target_id && !b->target_id) || json_equal(a->target_id, b->target_id),
              "target differs");
    cr_assert_eq(a->has_max_tokens, b->has_max_tokens);
    cr_assert_eq(a->has_temperature, b->has_temperature);
    cr_assert_eq(a->has_top_p, b->has_top_p);
    cr_assert_eq(a->has_min_p, b->has_min_p);
    cr_assert_eq(a->has_repeat_penalty, b->has_repeat_penalty);
    cr_assert_eq(a->has_top_k, b->has_top_k);
    cr_assert_eq(a->has_seed, b->has_seed);
    cr_assert_eq(a->has_presence_penalty, b->has_presence_penalty);
    cr_assert_eq(a->has_frequency_penalty, b->has_frequency_penalty);
    cr_assert_eq(a->presence_penalty, b->presence_penalty);
    cr_assert_eq(a->frequency_penalty, b->frequency_penalty);
    cr_assert_eq(a->max_tokens, b->max_tokens);
    cr_assert_eq(a->temperature, b->temperature);
    cr_assert_eq(a->top_p, b->top_p);
    cr_assert_eq(a->min_p, b->min_p);
    cr_assert_eq(a->repeat_penalty, b->repeat_penalty);
    cr_assert_eq(a->top_k, b->top_k);
    cr_assert_eq(a->seed, b->seed);
    cr_assert_eq(a->n_stop, b->n_stop);
    for (size_t i = 0; i < a->n_stop; i++)
        cr_assert_str_eq(a->stop[i], b->stop[i]);
    cr_assert_eq(a->stream, b->stream);
    cr_assert_eq(a->logprobs, b->logprobs);
    cr_assert_eq(a->top_logprobs, b->top_logprobs);
    cr_assert_eq(a->n, b->n);
    cr_assert_eq(a->echo, b->echo);
    cr_assert(str_eq(a->suffix, b->suffix));
    cr_assert_eq(a->n_bias, b->n_bias);
    for (size_t i = 0; i < a->n_bias; i++) {
        cr_assert_eq(a->bias_ids[i], b->bias_ids[i]);
        cr_assert_eq(a->bias[i], b->bias[i]);
    }
}

/* Parses line, encodes the request, parses that, and compares. */
static void round_trip(const char *line, int admin)
{
    proto_req_t a, b;
    parse_ok(line, admin, &a);
    char *enc = proto_encode_request(&a);
    cr_assert_not_null(enc);
    size_t n = strlen(enc);
    cr_assert_eq(enc[n - 1], '\n');
    char err[256] = "";
    int rc = proto_parse_request(enc, n - 1, admin, &b, NULL, err, sizeof err);
    cr_assert_eq(rc, 0, "re-parse of %s failed: %s", enc, err);
    assert_req_eq(&a, &b);
    free(enc);
    proto_req_free(&a);
    proto_req_free(&b);
}

/* ------------------------------------------------------------------ every op parses */

Test(proto, generate_with_a_prompt_and_every_sampling_field_parses)
{
    proto_req_t r;
    parse_ok(
        "{\"op\":\"generate\",\"id\":\"r1\",\"model\":\"llama3-8b\",\"prompt\":\"Once upon a time\","
        "\"max_tokens\":64,\"temperature\":0,\"top_k\":40,\"top_p\":0.9,\"min_p\":0.05,"
        "\"repeat_penalty\":1.1,\"presence_penalty\":-0.5,\"frequency_penalty\":2,"
        "\"seed\":42,\"stop\":[\"\\n\",\"END\"],\"stream\":true}",
        0, &r);
    cr_assert_eq(r.op, PROTO_OP_GENERATE);
    cr_assert_str_eq(json_string_value(r.id), "r1");
    cr_assert_str_eq(r.model, "llama3-8b");
    cr_assert_str_eq(r.prompt, "Once upon a time");
    cr_assert_null(r.tokens);
    cr_assert(r.has_max_tokens && r.max_tokens == 64);
    cr_assert(r.has_temperature && r.temperature == 0.0f);
    cr_assert(r.has_top_k && r.top_k == 40);
    cr_assert(r.has_top_p && r.top_p == 0.9f);
    cr_assert(r.has_min_p && r.min_p == 0.05f);
    cr_assert(r.has_repeat_penalty && r.repeat_penalty == 1.1f);
    cr_assert(r.has_presence_penalty && r.presence_penalty == -0.5f);
    cr_assert(r.has_frequency_penalty && r.frequency_penalty == 2.0f);
    cr_assert(r.has_seed && r.seed == 42);
    cr_assert_eq(r.n_stop, 2);
    cr_assert_str_eq(r.stop[0], "\n");
    cr_assert_str_eq(r.stop[1], "END");
    cr_assert_eq(r.stream, 1);
    proto_req_free(&r);
    cr_assert(is_zero(&r, sizeof r), "proto_req_free zeroes the request");
}

Test(proto, generate_without_sampling_fields_leaves_every_has_flag_clear)
{
    proto_req_t r;
    parse_ok("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"\"}", 0, &r);
    cr_assert_null(r.id);
    cr_assert_str_eq(r.prompt, "");
    cr_assert(!r.has_max_tokens && !r.has_temperature && !r.has_top_p && !r.has_min_p &&
              !r.has_repeat_penalty && !r.has_top_k && !r.has_seed && !r.has_presence_penalty &&
              !r.has_frequency_penalty);
    cr_assert_eq(r.n_stop, 0);
    cr_assert_null(r.stop);
    cr_assert_eq(r.stream, 0);
    proto_req_free(&r);
}

Test(proto, generate_with_tokens_parses_the_ids)
{
    proto_req_t r;
    parse_ok(
        "{\"op\":\"generate\",\"id\":3,\"model\":\"m\",\"tokens\":[1,0,2147483647],\"stop\":\"x\"}",
        0, &r);
    cr_assert_null(r.prompt);
    cr_assert_eq(r.n_tokens, 3);
    cr_assert_eq(r.tokens[0], 1);
    cr_assert_eq(r.tokens[1], 0);
    cr_assert_eq(r.tokens[2], 2147483647);
    cr_assert_eq(r.n_stop, 1, "a single stop string becomes one entry");
    cr_assert_str_eq(r.stop[0], "x");
    cr_assert_eq(json_integer_value(r.id), 3);
    proto_req_free(&r);
}

Test(proto, chat_parses_messages_and_sampling)
{
    proto_req_t r;
    parse_ok(
        "{\"op\":\"chat\",\"id\":\"c1\",\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"content\":\"Hi\",\"role\":\"user\"},{\"role\":\"assistant\",\"content\":\"\"}],\"temperature\":0.5}",
        0, &r);
    cr_assert_eq(r.op, PROTO_OP_CHAT);
    cr_assert_eq(r.n_messages, 3);
    cr_assert_str_eq(r.messages[0].role, "system");
    cr_assert_str_eq(r.messages[0].content, "Be brief.");
    cr_assert_str_eq(r.messages[1].role, "user");
    cr_assert_str_eq(r.messages[1].content, "Hi");
    cr_assert_str_eq(r.messages[2].role, "assistant");
    cr_assert_str_eq(r.messages[2].content, "");
    cr_assert(r.has_temperature && r.temperature == 0.5f);
    proto_req_free(&r);
}

Test(proto, tokenize_parses_text_and_add_bos_defaults_to_true)
{
    proto_req_t r;
    parse_ok("{\"op\":\"tokenize\",\"id\":\"t1\",\"model\":\"m\",\"text\":\"Hello world\"}", 0, &r);
    cr_assert_eq(r.op, PROTO_OP_TOKENIZE);
    cr_assert_str_eq(r.text, "Hello world");
    cr_assert_eq(r.add_bos, 1);
    proto_req_free(&r);
    parse_ok("{\"op\":\"tokenize\",\"model\":\"m\",\"text\":\"\",\"add_bos\":false}", 0, &r);
    cr_assert_eq(r.add_bos, 0);
    cr_assert_str_eq(r.text, "");
    proto_req_free(&r);
}

Test(proto, models_parses_on_both_sockets)
{
    proto_req_t r;
    parse_ok("{\"op\":\"models\",\"id\":\"m1\"}", 0, &r);
    cr_assert_eq(r.op, PROTO_OP_MODELS);
    proto_req_free(&r);
    parse_ok("{\"op\":\"models\"}", 1, &r);
    cr_assert_eq(r.op, PROTO_OP_MODELS);
    proto_req_free(&r);
}

Test(proto, cancel_takes_a_string_or_integer_target)
{
    proto_req_t r;
    parse_ok("{\"op\":\"cancel\",\"id\":\"x1\",\"target\":\"r9\"}", 0, &r);
    cr_assert_eq(r.op, PROTO_OP_CANCEL);
    cr_assert_str_eq(r.target, "r9");
    cr_assert(json_is_string(r.target_id));
    proto_req_free(&r);
    parse_ok("{\"op\":\"cancel\",\"id\":\"x2\",\"target\":17}", 0, &r);
    cr_assert_str_eq(r.target, "17");
    cr_assert(json_is_integer(r.target_id) && json_integer_value(r.target_id) == 17);
    proto_req_free(&r);
}

Test(proto, every_admin_op_parses_on_the_admin_socket)
{
    static const struct {
        const char *line;
        proto_op_t op;
        const char *model;
        int stream;
    } cases[] = {
        {"{\"op\":\"stats\",\"id\":1}", PROTO_OP_STATS, NULL, 0},
        {"{\"op\":\"load\",\"id\":\"l1\",\"model\":\"qwen2-7b\",\"stream\":true}", PROTO_OP_LOAD,
         "qwen2-7b", 1},
        {"{\"op\":\"load\",\"model\":\"qwen2-7b\"}", PROTO_OP_LOAD, "qwen2-7b", 0},
        {"{\"op\":\"evict\",\"id\":\"e1\",\"model\":\"llama3-8b\"}", PROTO_OP_EVICT, "llama3-8b",
         0},
        {"{\"op\":\"pin\",\"id\":\"p1\",\"model\":\"a\"}", PROTO_OP_PIN, "a", 0},
        {"{\"op\":\"unpin\",\"id\":\"p2\",\"model\":\"a\"}", PROTO_OP_UNPIN, "a", 0},
        {"{\"op\":\"reload\",\"id\":\"h1\"}", PROTO_OP_RELOAD, NULL, 0},
        {"{\"op\":\"drain\",\"id\":\"d1\"}", PROTO_OP_DRAIN, NULL, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proto_req_t r;
        parse_ok(cases[i].line, 1, &r);
        cr_assert_eq(r.op, cases[i].op, "%s", cases[i].line);
        cr_assert(str_eq(r.model, cases[i].model), "%s", cases[i].line);
        cr_assert_eq(r.stream, cases[i].stream, "%s", cases[i].line);
        proto_req_free(&r);
    }
}

Test(proto, admin_ops_are_refused_on_the_inference_socket_and_vice_versa)
{
    json_t *id =
        parse_fail("{\"op\":\"stats\",\"id\":\"s\"}", 0, PROTO_E_BAD_REQUEST, "admin socket");
    cr_assert_str_eq(json_string_value(id), "s");
    json_decref(id);
    json_decref(
        parse_fail("{\"op\":\"evict\",\"model\":\"m\"}", 0, PROTO_E_BAD_REQUEST, "'evict'"));
    json_decref(parse_fail("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"x\"}", 1,
                           PROTO_E_BAD_REQUEST, "'generate'"));
    json_decref(
        parse_fail("{\"op\":\"cancel\",\"target\":\"x\"}", 1, PROTO_E_BAD_REQUEST, "'cancel'"));
}

Test(proto, a_trailing_carriage_return_is_accepted)
{
    proto_req_t r;
    parse_ok("{\"op\":\"models\",\"id\":1}\r", 0, &r);
    proto_req_free(&r);
}

/* ------------------------------------------------------------------ validation */

Test(proto, missing_or_unknown_op_is_bad_request)
{
    bad("{\"id\":1}", "missing field 'op'");
    bad("{\"op\":3}", "'op'");
    bad("{\"op\":\"generat\"}", "unknown op 'generat'");
}

Test(proto, an_unknown_field_is_named_with_a_suggestion)
{
    json_t *id = parse_fail(
        "{\"op\":\"generate\",\"id\":7,\"model\":\"m\",\"prompt\":\"hi\",\"max_token\":5}", 0,
        PROTO_E_BAD_REQUEST, "unknown field 'max_token' (did you mean 'max_tokens'?)");
    cr_assert_eq(json_integer_value(id), 7);
    json_decref(id);
    bad("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"hi\",\"zzzzzzzz\":5}",
        "unknown field 'zzzzzzzz'");
}

Test(proto, a_field_the_op_does_not_take_is_bad_request)
{
    bad("{\"op\":\"tokenize\",\"model\":\"m\",\"text\":\"a\",\"stop\":\"x\"}",
        "field 'stop' is not valid for op 'tokenize'");
    bad("{\"op\":\"models\",\"model\":\"m\"}", "field 'model' is not valid for op 'models'");
    bad("{\"op\":\"chat\",\"model\":\"m\",\"prompt\":\"x\",\"messages\":[]}", "'prompt'");
    json_decref(
        parse_fail("{\"op\":\"stats\",\"stream\":true}", 1, PROTO_E_BAD_REQUEST, "'stream'"));
}

Test(proto, wrong_types_are_bad_request_naming_the_field)
{
    const char *pre = "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",";
    static const struct {
        const char *tail, *want;
    } cases[] = {
        {"\"max_tokens\":\"64\"}", "field 'max_tokens' must be an integer (got string)"},
        {"\"max_tokens\":64.0}", "field 'max_tokens' must be an integer (got number)"},
        {"\"top_k\":true}", "field 'top_k' must be an integer"},
        {"\"seed\":1.5}", "field 'seed' must be an integer"},
        {"\"temperature\":\"hot\"}", "field 'temperature' must be a number (got string)"},
        {"\"top_p\":null}", "field 'top_p' must be a number (got null)"},
        {"\"min_p\":[]}", "field 'min_p' must be a number"},
        {"\"repeat_penalty\":{}}", "field 'repeat_penalty' must be a number"},
        {"\"stream\":1}", "field 'stream' must be true or false (got integer)"},
        {"\"stop\":5}", "field 'stop' must be a string or an array of strings"},
        {"\"stop\":[\"a\",5]}", "field 'stop[1]' must be a string"},
        {"\"temperature\":1e39}", "field 'temperature' is out of range"},
    };
    char line[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(line, sizeof line, "%s%s", pre, cases[i].tail);
        bad(line, cases[i].want);
    }
    bad("{\"op\":\"generate\",\"model\":5,\"prompt\":\"p\"}",
        "field 'model' must be a string (got integer)");
    bad("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":[1]}",
        "field 'prompt' must be a string (got array)");
    bad("{\"op\":\"generate\",\"model\":\"m\",\"tokens\":\"1 2\"}",
        "field 'tokens' must be an array");
    bad("{\"op\":\"generate\",\"model\":\"m\",\"tokens\":[1,\"2\"]}",
        "field 'tokens[1]' must be an integer");
    bad("{\"op\":\"tokenize\",\"model\":\"m\",\"text\":\"a\",\"add_bos\":\"yes\"}",
        "field 'add_bos' must be true or false");
    bad("{\"op\":\"tokenize\",\"model\":\"m\",\"text\":7}", "field 'text' must be a string");
    bad("{\"op\":\"chat\",\"model\":\"m\",\"messages\":{}}",
        "field 'messages' must be an array (got object)");
    bad("{\"op\":\"cancel\",\"target\":1.5}",
        "field 'target' must be a string or an integer (got number)");
    json_decref(parse_fail("{\"op\":\"load\",\"model\":\"m\",\"stream\":\"yes\"}", 1,
                           PROTO_E_BAD_REQUEST, "field 'stream'"));
}

Test(proto, generate_needs_exactly_one_of_prompt_and_tokens)
{
    bad("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"a\",\"tokens\":[1]}",
        "either 'prompt' or 'tokens'");
    bad("{\"op\":\"generate\",\"model\":\"m\"}", "missing field 'prompt' (or 'tokens')");
}

Test(proto, required_fields_are_named_when_missing)
{
    bad("{\"op\":\"generate\",\"prompt\":\"a\"}", "missing field 'model'");
    bad("{\"op\":\"chat\",\"model\":\"m\"}", "missing field 'messages'");
    bad("{\"op\":\"tokenize\",\"model\":\"m\"}", "missing field 'text'");
    bad("{\"op\":\"tokenize\",\"text\":\"a\"}", "missing field 'model'");
    bad("{\"op\":\"cancel\",\"id\":1}", "missing field 'target'");
    bad("{\"op\":\"generate\",\"model\":\"\",\"prompt\":\"a\"}", "field 'model' must not be empty");
    static const char *const admin_ops[] = {"load", "evict", "pin", "unpin"};
    char line[128];
    for (size_t i = 0; i < 4; i++) {
        snprintf(line, sizeof line, "{\"op\":\"%s\",\"id\":1}", admin_ops[i]);
        json_decref(parse_fail(line, 1, PROTO_E_BAD_REQUEST, "missing field 'model'"));
    }
}

Test(proto, sampling_values_out_of_range_are_bad_request)
{
    const char *pre = "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",";
    static const struct {
        const char *tail, *want;
    } cases[] = {
        {"\"temperature\":-0.1}", "field 'temperature' must be in [0, 100] (got -0.1)"},
        {"\"temperature\":100.5}", "field 'temperature' must be in [0, 100]"},
        {"\"presence_penalty\":2.5}", "field 'presence_penalty' must be in [-2, 2] (got 2.5)"},
        {"\"frequency_penalty\":-2.01}", "field 'frequency_penalty' must be in [-2, 2]"},
        {"\"presence_penalty\":\"x\"}", "field 'presence_penalty' must be a number"},
        {"\"top_p\":0}", "field 'top_p' must be in (0, 1]"},
        {"\"top_p\":1.5}", "field 'top_p' must be in (0, 1] (got 1.5)"},
        {"\"top_p\":-1}", "field 'top_p'"},
        {"\"min_p\":1.01}", "field 'min_p' must be in [0, 1]"},
        {"\"min_p\":-0.5}", "field 'min_p'"},
        {"\"repeat_penalty\":0}", "field 'repeat_penalty' must be in (0, 100]"},
        {"\"max_tokens\":-1}", "field 'max_tokens' must be in 0 .. 2147483647 (got -1)"},
        {"\"max_tokens\":2147483648}", "field 'max_tokens'"},
        {"\"top_k\":-1}", "field 'top_k'"},
        {"\"top_k\":1000001}", "field 'top_k' must be in 0 .. 1000000"},
        {"\"seed\":-1}", "field 'seed'"},
    };
    char line[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(line, sizeof line, "%s%s", pre, cases[i].tail);
        bad(line, cases[i].want);
    }
}

Test(proto, boundary_sampling_values_are_accepted)
{
    proto_req_t r;
    parse_ok(
        "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"top_p\":1,\"min_p\":0,\"max_tokens\":0,"
        "\"top_k\":0,\"seed\":9223372036854775807,\"temperature\":100}",
        0, &r);
    cr_assert_eq(r.top_p, 1.0f);
    cr_assert_eq(r.min_p, 0.0f);
    cr_assert_eq(r.max_tokens, 0);
    cr_assert_eq(r.seed, 9223372036854775807ull);
    proto_req_free(&r);
}

Test(proto, bad_token_ids_are_named_by_index)
{
    bad("{\"op\":\"generate\",\"model\":\"m\",\"tokens\":[5,-3]}",
        "field 'tokens[1]' must be a token id in 0 .. 2147483647 (got -3)");
    bad("{\"op\":\"generate\",\"model\":\"m\",\"tokens\":[2147483648]}", "field 'tokens[0]'");
    bad("{\"op\":\"generate\",\"model\":\"m\",\"tokens\":[]}", "field 'tokens' must not be empty");
}

Test(proto, a_tokens_array_above_one_million_entries_is_refused, .timeout = 20)
{
    const char *pre = "{\"op\":\"generate\",\"id\":\"big\",\"model\":\"m\",\"tokens\":[";
    size_t n = PROTO_MAX_TOKENS + 1;
    size_t cap = strlen(pre) + 2 * n + 8;
    char *line = malloc(cap);
    cr_assert_not_null(line);
    size_t o = (size_t)sprintf(line, "%s", pre);
    for (size_t i = 0; i < n; i++) {
        line[o++] = '7';
        line[o++] = ',';
    }
    line[o - 1] = ']';
    line[o++] = '}';
    line[o] = '\0';
    json_t *id = parse_fail_n(line, o, 0, PROTO_E_BAD_REQUEST,
                              "field 'tokens' has 1000001 entries (max 1000000)");
    cr_assert_str_eq(json_string_value(id), "big");
    json_decref(id);

    /* exactly the limit is fine */
    line[o - 4] = ']';
    line[o - 3] = '}';
    proto_req_t r;
    char err[256];
    cr_assert_eq(proto_parse_request(line, o - 2, 0, &r, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_tokens, PROTO_MAX_TOKENS);
    proto_req_free(&r);
    free(line);
}

Test(proto, malformed_messages_are_named_by_index)
{
    const char *pre = "{\"op\":\"chat\",\"model\":\"m\",\"messages\":";
    static const struct {
        const char *tail, *want;
    } cases[] = {
        {"[]}", "field 'messages' must not be empty"},
        {"[\"hi\"]}", "field 'messages[0]' must be an object (got string)"},
        {"[{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"b\"}]}",
         "missing field 'messages[1].role'"},
        {"[{\"role\":\"user\"}]}", "missing field 'messages[0].content'"},
        {"[{\"role\":\"robot\",\"content\":\"a\"}]}",
         "field 'messages[0].role' must be system, user, assistant or tool (got 'robot')"},
        {"[{\"role\":\"tool\",\"tool_calls\":[]}]}", "'messages[0].tool_calls' is for assistant"},
        {"[{\"role\":1,\"content\":\"a\"}]}", "field 'messages[0].role' must be a string"},
        {"[{\"role\":\"user\",\"content\":null}]}",
         "field 'messages[0].content' must be a string (got null)"},
        {"[{\"role\":\"user\",\"content\":\"a\",\"name\":\"bob\"}]}",
         "unknown field 'name' in 'messages[0]'"},
    };
    char line[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(line, sizeof line, "%s%s", pre, cases[i].tail);
        bad(line, cases[i].want);
    }
}

Test(proto, stop_lists_are_limited_in_count_and_length)
{
    char line[2048];
    int o = snprintf(line, sizeof line,
                     "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"stop\":[");
    for (int i = 0; i < PROTO_MAX_STOP + 1; i++)
        o += snprintf(line + o, sizeof line - (size_t)o, "%s\"s%d\"", i ? "," : "", i);
    snprintf(line + o, sizeof line - (size_t)o, "]}");
    bad(line, "field 'stop' has 17 entries (max 16)");

    bad("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"a\",\"\"]}",
        "field 'stop[1]' must not be empty");
    bad("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"stop\":\"\"}",
        "field 'stop' must not be empty");

    char longstop[PROTO_MAX_STOP_BYTES + 2];
    memset(longstop, 'x', sizeof longstop - 1);
    longstop[sizeof longstop - 1] = '\0';
    snprintf(line, sizeof line,
             "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"%s\"]}", longstop);
    bad(line, "field 'stop[0]' is longer than 256 bytes");

    /* exactly 16 entries of 256 bytes are fine; so is an empty list */
    o = snprintf(line, sizeof line,
                 "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"stop\":[");
    for (int i = 0; i < PROTO_MAX_STOP; i++)
        o += snprintf(line + o, sizeof line - (size_t)o, "%s\"s%d\"", i ? "," : "", i);
    snprintf(line + o, sizeof line - (size_t)o, "]}");
    proto_req_t r;
    parse_ok(line, 0, &r);
    cr_assert_eq(r.n_stop, PROTO_MAX_STOP);
    proto_req_free(&r);
    parse_ok("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"stop\":[]}", 0, &r);
    cr_assert_eq(r.n_stop, 0);
    proto_req_free(&r);
}

Test(proto, ids_of_other_types_are_bad_request_without_an_id)
{
    static const char *const ids[] = {"null", "1.5", "true", "[1]", "{\"a\":1}"};
    char line[128];
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        snprintf(line, sizeof line, "{\"op\":\"models\",\"id\":%s}", ids[i]);
        json_t *id =
            parse_fail(line, 0, PROTO_E_BAD_REQUEST, "field 'id' must be a string or an integer");
        cr_assert_null(id, "an invalid id is not echoed (%s)", ids[i]);
    }
    char longid[PROTO_MAX_ID_BYTES + 2];
    memset(longid, 'i', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    snprintf(line, sizeof line, "{\"op\":\"models\",\"id\":\"%.*s\"}", 100, longid);
    proto_req_t r;
    parse_ok(line, 0, &r);
    proto_req_free(&r);
    char big[512];
    snprintf(big, sizeof big, "{\"op\":\"models\",\"id\":\"%s\"}", longid);
    cr_assert_null(parse_fail(big, 0, PROTO_E_BAD_REQUEST, "field 'id' is longer than 256 bytes"));
}

Test(proto, errors_after_the_id_is_read_are_tagged_with_it)
{
    json_t *id =
        parse_fail("{\"op\":\"nope\",\"id\":\"late\"}", 0, PROTO_E_BAD_REQUEST, "unknown op");
    cr_assert_str_eq(json_string_value(id), "late", "the id is read even when it comes after op");
    json_decref(id);
    id = parse_fail(
        "{\"id\":-12,\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"temperature\":-1}", 0,
        PROTO_E_BAD_REQUEST, "temperature");
    cr_assert(json_is_integer(id) && json_integer_value(id) == -12);
    json_decref(id);
}

Test(proto, malformed_json_is_bad_json_with_a_null_id)
{
    static const char *const lines[] = {
        "{\"op\":\"generate\",\"id\":\"r3\",\"model\":",
        "{\"op\":\"models\",\"id\":\"x\"",
        "not json",
        "{\"op\":\"models\"} {\"op\":\"models\"}",
        "{'op':'models'}",
        "{\"op\":\"models\",}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        cr_assert_null(parse_fail(lines[i], 0, PROTO_E_BAD_JSON, "invalid JSON"), "%s", lines[i]);
    cr_assert_null(parse_fail("", 0, PROTO_E_BAD_JSON, "empty line"));
    cr_assert_null(parse_fail("  \r", 0, PROTO_E_BAD_JSON, "empty line"));
}

Test(proto, duplicate_keys_are_bad_json)
{
    cr_assert_null(
        parse_fail("{\"op\":\"models\",\"op\":\"stats\"}", 0, PROTO_E_BAD_JSON, "duplicate"));
}

Test(proto, valid_json_that_is_not_an_object_is_bad_request)
{
    static const char *const lines[] = {"[1,2,3]", "42", "\"generate\"", "null", "true"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        cr_assert_null(
            parse_fail(lines[i], 0, PROTO_E_BAD_REQUEST, "a request must be a JSON object"), "%s",
            lines[i]);
}

Test(proto, embedded_nuls_are_refused)
{
    cr_assert_null(parse_fail("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"a\\u0000b\"}", 0,
                              PROTO_E_BAD_JSON, "invalid JSON"));
    cr_assert_null(
        parse_fail("{\"op\":\"models\",\"id\":\"a\\u0000\"}", 0, PROTO_E_BAD_JSON, "invalid JSON"));
    static const char raw[] = "{\"op\":\"models\",\"id\":\"a\0b\"}";
    cr_assert_null(parse_fail_n(raw, sizeof raw - 1, 0, PROTO_E_BAD_JSON, "invalid JSON"));
    static const char after[] = "{\"op\":\"models\"}\0garbage";
    cr_assert_null(parse_fail_n(after, sizeof after - 1, 0, PROTO_E_BAD_JSON, "invalid JSON"));
}

Test(proto, a_nul_in_a_nested_string_is_bad_json)
{
    cr_assert_null(parse_fail("{\"op\":\"generate\",\"id\":1,\"model\":\"m\",\"prompt\":\"x\","
                              "\"stop\":[\"a\",\"b\\u0000\"]}",
                              0, PROTO_E_BAD_JSON, "\\u0000 in field 'stop'"));
    cr_assert_null(parse_fail("{\"op\":\"chat\",\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                              "\"content\":\"\\u0000\"}]}",
                              0, PROTO_E_BAD_JSON, "invalid JSON"));
}

Test(proto, an_auth_key_holding_a_nul_is_kept_whole_with_its_length)
{
    static const char line[] = "{\"op\":\"auth\",\"id\":\"k1\",\"key\":\"gsk_a\\u0000junk\"}";
    proto_req_t r;
    char err[256] = "";
    json_t *id = NULL;
    cr_assert_eq(proto_parse_request(line, strlen(line), 0, &r, &id, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(r.op, PROTO_OP_AUTH);
    cr_assert_str_eq(json_string_value(r.id), "k1");
    cr_assert_eq(r.key_len, 10);
    cr_assert(memcmp(r.key, "gsk_a\0junk", 10) == 0);
    /* re-encoded, the NUL stays in the key */
    char *enc = proto_encode_request(&r);
    cr_assert_not_null(enc);
    cr_assert(strstr(enc, "\"key\":\"gsk_a\\u0000junk\""), "%s", enc);
    proto_req_t again;
    cr_assert_eq(proto_parse_request(enc, strlen(enc) - 1, 0, &again, NULL, err, sizeof err), 0);
    cr_assert_eq(again.key_len, 10);
    cr_assert(memcmp(again.key, r.key, 10) == 0);
    free(enc);
    proto_req_free(&again);
    proto_req_free(&r);
}

Test(proto, a_key_field_on_another_op_is_bad_request_with_the_id_nul_or_not)
{
    json_t *id = parse_fail("{\"op\":\"models\",\"id\":7,\"key\":\"a\\u0000\"}", 0,
                            PROTO_E_BAD_REQUEST, "field 'key' is not valid for op 'models'");
    cr_assert(json_is_integer(id) && json_integer_value(id) == 7);
    json_decref(id);
}

Test(proto, invalid_utf8_is_refused)
{
    static const char *const lines[] = {
        "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"\xff\"}",
        "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"\xc0\xaf\"}",     /* overlong '/' */
        "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"\xed\xa0\x80\"}", /* surrogate */
        "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"\xe2\x82\"}",     /* truncated */
        "{\"op\":\"models\",\"\xfe\":1}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        cr_assert_null(parse_fail(lines[i], 0, PROTO_E_BAD_JSON, "invalid JSON"), "case %zu", i);
    proto_req_t r;
    parse_ok(
        "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}",
        0, &r);
    cr_assert_str_eq(r.prompt, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    proto_req_free(&r);
}

Test(proto, deeply_nested_input_is_refused_before_parsing)
{
    size_t depth = 100000;
    size_t cap = 2 * depth + 64;
    char *line = malloc(cap);
    cr_assert_not_null(line);
    size_t o = (size_t)sprintf(line, "{\"op\":\"models\",\"x\":");
    for (size_t i = 0; i < depth; i++)
        line[o++] = '[';
    for (size_t i = 0; i < depth; i++)
        line[o++] = ']';
    line[o++] = '}';
    cr_assert_null(parse_fail_n(line, o, 0, PROTO_E_BAD_REQUEST, "nested deeper than 32"));
    /* unbalanced: only openers */
    cr_assert_null(parse_fail_n(line, 20 + depth, 0, PROTO_E_BAD_REQUEST, "nested deeper"));
    free(line);
    /* brackets inside strings do not count */
    char s[256];
    int n = snprintf(s, sizeof s, "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"");
    for (int i = 0; i < 100; i++)
        s[n++] = '[';
    snprintf(s + n, sizeof s - (size_t)n, "\\\"{\"}");
    proto_req_t r;
    parse_ok(s, 0, &r);
    cr_assert_eq(strlen(r.prompt), 102);
    proto_req_free(&r);
}

Test(proto, parse_accepts_null_err_and_id_out)
{
    proto_req_t r;
    cr_assert_eq(proto_parse_request("{\"op\":\"nope\",\"id\":1}", 20, 0, &r, NULL, NULL, 0),
                 -PROTO_E_BAD_REQUEST);
    cr_assert_eq(proto_parse_request("{", 1, 0, &r, NULL, NULL, 0), -PROTO_E_BAD_JSON);
    proto_req_free(NULL);
}

/* ------------------------------------------------------------------ ids and round trips */

Test(proto, string_and_integer_ids_round_trip_into_answers)
{
    static const char *const lines[] = {
        "{\"op\":\"models\",\"id\":\"r-\\u00e9\\\"1\"}",
        "{\"op\":\"models\",\"id\":9007199254740993}",
        "{\"op\":\"models\",\"id\":-5}",
        "{\"op\":\"models\",\"id\":\"\"}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        proto_req_t r;
        parse_ok(lines[i], 0, &r);
        json_t *root = json_loads(lines[i], 0, NULL);
        cr_assert(json_equal(r.id, json_object_get(root, "id")), "parsed id differs (%s)",
                  lines[i]);
        json_decref(root);
        char *toks[] = {
            proto_encode_token(r.id, "x", 1, -1, NULL),
            proto_encode_done(r.id, "x", "stop", 1, 1, 0, NULL, NULL),
            proto_encode_error(r.id, PROTO_E_INTERNAL, "boom", 0),
            proto_encode_ok(r.id, NULL),
            proto_encode_progress(r.id, "m", 1, 2),
        };
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            json_t *j = reparse_line(toks[k]);
            cr_assert(json_equal(json_object_get(j, "id"), r.id),
                      "id not echoed verbatim (%s, encoder %zu)", lines[i], k);
            cr_assert_eq(json_typeof(json_object_get(j, "id")), json_typeof(r.id));
            json_decref(j);
        }
        proto_req_free(&r);
    }
}

Test(proto, a_missing_id_is_answered_with_null)
{
    json_t *j = reparse_line(proto_encode_error(NULL, PROTO_E_BAD_JSON, "x", 0));
    cr_assert(json_is_null(json_object_get(j, "id")));
    json_decref(j);
    j = reparse_line(proto_encode_ok(NULL, NULL));
    cr_assert(json_is_null(json_object_get(j, "id")));
    json_decref(j);
}

Test(proto, encode_request_round_trips_every_op)
{
    round_trip(
        "{\"op\":\"generate\",\"id\":\"r1\",\"model\":\"llama3-8b\",\"prompt\":\"Once\\nupon \\u00e9\","
        "\"max_tokens\":64,\"temperature\":0.7,\"top_k\":40,\"top_p\":0.95,\"min_p\":0.05,"
        "\"repeat_penalty\":1.1,\"seed\":9223372036854775807,\"stop\":[\"\\n\",\"END\"],\"stream\":true}",
        0);
    round_trip(
        "{\"op\":\"chat\",\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
        "\"presence_penalty\":-1.5,\"frequency_penalty\":0.25}",
        0);
    round_trip(
        "{\"op\":\"generate\",\"id\":2,\"model\":\"m\",\"tokens\":[785,3974,0],\"temperature\":0.123456789}",
        0);
    round_trip("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"p\",\"deadline_ms\":1500,"
               "\"class\":\"batch\"}",
               0);
    round_trip(
        "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"\",\"stop\":\"x\",\"temperature\":3e-7}",
        0);
    round_trip(
        "{\"op\":\"chat\",\"id\":\"c\",\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"content\":\"\"}],\"top_p\":1}",
        0);
    round_trip(
        "{\"op\":\"tokenize\",\"id\":\"t\",\"model\":\"m\",\"text\":\"Hello\",\"add_bos\":false}",
        0);
    round_trip("{\"op\":\"tokenize\",\"model\":\"m\",\"text\":\"\"}", 0);
    round_trip("{\"op\":\"models\",\"id\":\"m1\"}", 0);
    round_trip("{\"op\":\"cancel\",\"id\":\"x\",\"target\":\"r9\"}", 0);
    round_trip("{\"op\":\"cancel\",\"id\":\"y\",\"target\":17}", 0);
    round_trip("{\"op\":\"stats\",\"id\":1}", 1);
    round_trip("{\"op\":\"models\"}", 1);
    round_trip("{\"op\":\"load\",\"id\":\"l\",\"model\":\"q\",\"stream\":true}", 1);
    round_trip("{\"op\":\"evict\",\"id\":\"e\",\"model\":\"q\"}", 1);
    round_trip("{\"op\":\"pin\",\"model\":\"q\"}", 1);
    round_trip("{\"op\":\"unpin\",\"model\":\"q\"}", 1);
    round_trip("{\"op\":\"reload\"}", 1);
    round_trip("{\"op\":\"drain\",\"id\":\"d\"}", 1);
}

Test(proto, encode_request_builds_a_request_from_scratch)
{
    proto_req_t r = {0};
    r.op = PROTO_OP_GENERATE;
    r.model = "m";
    r.prompt = "hi";
    r.has_temperature = 1;
    r.temperature = 0.7f;
    r.has_max_tokens = 1;
    r.max_tokens = 8;
    json_t *j = reparse_line(proto_encode_request(&r));
    cr_assert_str_eq(sget(j, "op"), "generate");
    cr_assert_null(json_object_get(j, "id"), "no id given, none written");
    cr_assert_eq(rget(j, "temperature"), 0.7, "floats are written in their shortest form");
    cr_assert_eq(iget(j, "max_tokens"), 8);
    cr_assert_null(json_object_get(j, "top_p"), "absent sampling fields are not written");
    cr_assert_null(json_object_get(j, "stream"));
    json_decref(j);
    r.op = 0;
    cr_assert_null(proto_encode_request(&r), "invalid op");
    r.op = PROTO_OP_GENERATE;
    r.has_seed = 1;
    r.seed = UINT64_MAX;
    cr_assert_null(proto_encode_request(&r), "seed above 2^63-1 cannot be sent");
}

/* ------------------------------------------------------------------ encoders */

Test(proto, token_events_are_one_line_with_the_right_fields)
{
    json_t *id = json_string("r1");
    json_t *j = reparse_line(proto_encode_token(id, " there\nwas", 727, -1, NULL));
    cr_assert_str_eq(sget(j, "id"), "r1");
    cr_assert_str_eq(sget(j, "event"), "token");
    cr_assert_str_eq(sget(j, "text"), " there\nwas");
    cr_assert_eq(iget(j, "token"), 727);
    cr_assert_eq(json_object_size(j), 4);
    json_decref(j);
    /* with the daemon's timestamp, to the microsecond */
    j = reparse_line(proto_encode_token(id, "a", 1, 12.3456789, NULL));
    cr_assert_float_eq(json_real_value(json_object_get(j, "ts")), 12.345679, 1e-9);
    cr_assert_eq(json_object_size(j), 5);
    json_decref(j);
    json_decref(id);
}

Test(proto, done_events_carry_usage_and_timing)
{
    json_t *id = json_integer(12);
    proto_timing_t t = {
        .queue_ms = 0.4, .swap_ms = 212.0, .ttft_ms = 231.51234, .total_ms = 910.2, .swapped = 1};
    char *line = proto_encode_done(id, " there was ...", "length", 5, 64, 0, &t, NULL);
    cr_assert_not_null(line);
    cr_assert(strstr(line, "\"queue_ms\":0.4,"), "times are written short: %s", line);
    cr_assert(strstr(line, "\"swap_ms\":212.0,"), "%s", line);
    json_t *j = reparse_line(line);
    cr_assert_eq(iget(j, "id"), 12);
    cr_assert_str_eq(sget(j, "event"), "done");
    cr_assert_str_eq(sget(j, "text"), " there was ...");
    cr_assert_str_eq(sget(j, "finish_reason"), "length");
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(iget(u, "prompt_tokens"), 5);
    cr_assert_eq(iget(u, "completion_tokens"), 64);
    json_t *tm = json_object_get(j, "timing");
    cr_assert_eq(rget(tm, "queue_ms"), 0.4);
    cr_assert_eq(rget(tm, "swap_ms"), 212.0);
    cr_assert_eq(rget(tm, "ttft_ms"), 231.512, "rounded to 3 decimals");
    cr_assert_eq(rget(tm, "total_ms"), 910.2);
    cr_assert(json_is_true(json_object_get(tm, "swapped")));
    json_decref(j);

    t.queue_ms = NAN;
    t.swapped = 0;
    j = reparse_line(proto_encode_done(id, "", "cancelled", 0, 0, 0, &t, NULL));
    tm = json_object_get(j, "timing");
    cr_assert_eq(rget(tm, "queue_ms"), 0.0, "a non-finite time is written as 0");
    cr_assert(json_is_false(json_object_get(tm, "swapped")));
    json_decref(j);

    j = reparse_line(proto_encode_done(id, "x", "eos", 1, 2, 0, NULL, NULL));
    cr_assert_null(json_object_get(j, "timing"), "no timing given, none written");
    cr_assert_not_null(json_object_get(j, "usage"));
    json_decref(j);
    json_decref(id);
}

Test(proto, error_lines_carry_event_ok_and_the_code)
{
    json_t *id = json_string("r2");
    json_t *j = reparse_line(
        proto_encode_error(id, PROTO_E_UNKNOWN_MODEL, "no model 'llama4' (configured: a, b)", 0));
    cr_assert_str_eq(sget(j, "id"), "r2");
    cr_assert_str_eq(sget(j, "event"), "error");
    cr_assert(json_is_false(json_object_get(j, "ok")));
    json_t *e = json_object_get(j, "error");
    cr_assert_str_eq(sget(e, "code"), "unknown_model");
    cr_assert_str_eq(sget(e, "message"), "no model 'llama4' (configured: a, b)");
    json_decref(j);
    j = reparse_line(proto_encode_error(id, PROTO_E_OVERLOADED, NULL, 0));
    cr_assert_str_eq(sget(json_object_get(j, "error"), "message"), "overloaded",
                     "NULL message uses the code");
    json_decref(j);
    j = reparse_line(proto_encode_error(id, (proto_err_t)999, "x", 0));
    cr_assert_str_eq(sget(json_object_get(j, "error"), "code"), "internal",
                     "an unknown code encodes as internal");
    cr_assert_null(json_object_get(json_object_get(j, "error"), "retry_after_ms"));
    json_decref(j);
    j = reparse_line(proto_encode_error(id, PROTO_E_OVERLOADED, "late", 1250));
    e = json_object_get(j, "error");
    cr_assert_str_eq(sget(e, "code"), "overloaded");
    cr_assert_eq(json_integer_value(json_object_get(e, "retry_after_ms")), 1250);
    json_decref(j);
    json_decref(id);
}

Test(proto, deadline_ms_is_a_whole_number_of_ms_from_1_to_a_day)
{
    proto_req_t r;
    char err[256];
    const char *ok = "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"x\",\"deadline_ms\":2000}";
    cr_assert_eq(proto_parse_request(ok, strlen(ok), 0, &r, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.deadline_ms, 2000);
    proto_req_free(&r);
    static const char *const bad[] = {"0", "-5", "86400001", "1.5", "\"100\"", "null"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[256];
        snprintf(line, sizeof line,
                 "{\"op\":\"chat\",\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],\"deadline_ms\":%s}",
                 bad[i]);
        int rc = proto_parse_request(line, strlen(line), 0, &r, NULL, err, sizeof err);
        cr_assert_eq(rc, -PROTO_E_BAD_REQUEST, "%s", bad[i]);
        cr_assert(strstr(err, "deadline_ms"), "%s: %s", bad[i], err);
    }
    const char *cls = "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"x\",\"class\":\"batch\"}";
    cr_assert_eq(proto_parse_request(cls, strlen(cls), 0, &r, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.batch, 1);
    proto_req_free(&r);
    const char *bad_cls =
        "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"x\",\"class\":\"bulk\"}";
    cr_assert_eq(proto_parse_request(bad_cls, strlen(bad_cls), 0, &r, NULL, err, sizeof err),
                 -PROTO_E_BAD_REQUEST);
    cr_assert(strstr(err, "'class'"), "%s", err);
    const char *tok = "{\"op\":\"tokenize\",\"model\":\"m\",\"text\":\"x\",\"deadline_ms\":5}";
    cr_assert_eq(proto_parse_request(tok, strlen(tok), 0, &r, NULL, err, sizeof err),
                 -PROTO_E_BAD_REQUEST, "tokenize takes no deadline");
}

Test(proto, ok_answers_merge_the_body)
{
    json_t *id = json_string("t1");
    json_t *body = json_pack("{s:[i,i,i],s:s,s:i}", "tokens", 1, 2, 3, "id", "forged", "ok", 0);
    json_t *j = reparse_line(proto_encode_ok(id, body));
    cr_assert_str_eq(sget(j, "id"), "t1", "the body cannot override the id");
    cr_assert(json_is_true(json_object_get(j, "ok")), "the body cannot override ok");
    cr_assert_eq(json_array_size(json_object_get(j, "tokens")), 3);
    cr_assert_eq(json_object_size(j), 3);
    json_decref(j);
    j = reparse_line(proto_encode_ok(id, NULL));
    cr_assert_eq(json_object_size(j), 2);
    json_decref(j);
    cr_assert_null(proto_encode_ok(id, json_integer(3)),
                   "a non-object body is refused (and released)");
    json_decref(id);
}

Test(proto, progress_events_carry_bytes_and_total)
{
    json_t *id = json_string("l1");
    json_t *j = reparse_line(proto_encode_progress(id, "qwen2-7b", 4194304000ull, 15231233024ull));
    cr_assert_str_eq(sget(j, "event"), "progress");
    cr_assert_str_eq(sget(j, "model"), "qwen2-7b");
    cr_assert_eq(iget(j, "bytes"), 4194304000ll);
    cr_assert_eq(iget(j, "total"), 15231233024ll);
    json_decref(j);
    json_decref(id);
}

Test(proto, invalid_utf8_text_is_encoded_with_replacement_characters)
{
    json_t *j = reparse_line(proto_encode_token(NULL,
                                                "a\xe2\x82"
                                                "b\xff",
                                                5, -1, NULL));
    cr_assert_str_eq(sget(j, "text"), "a\xef\xbf\xbd\xef\xbf\xbd"
                                      "b\xef\xbf\xbd");
    json_decref(j);
    j = reparse_line(
        proto_encode_done(NULL, "\xc0\xaf ok \xe2\x82\xac", "stop", 0, 0, 0, NULL, NULL));
    cr_assert_str_eq(sget(j, "text"), "\xef\xbf\xbd\xef\xbf\xbd ok \xe2\x82\xac");
    json_decref(j);
    j = reparse_line(proto_encode_token(NULL, NULL, 0, -1, NULL));
    cr_assert_str_eq(sget(j, "text"), "", "NULL text encodes as empty");
    json_decref(j);
}

Test(proto, error_code_strings_are_exactly_the_documented_ones)
{
    static const struct {
        proto_err_t e;
        const char *s;
    } codes[] = {
        {PROTO_E_BAD_JSON, "bad_json"},           {PROTO_E_BAD_REQUEST, "bad_request"},
        {PROTO_E_UNKNOWN_MODEL, "unknown_model"}, {PROTO_E_TOO_LARGE, "too_large"},
        {PROTO_E_OVERLOADED, "overloaded"},       {PROTO_E_CONTEXT_OVERFLOW, "context_overflow"},
        {PROTO_E_CANCELLED, "cancelled"},         {PROTO_E_SHUTTING_DOWN, "shutting_down"},
        {PROTO_E_INTERNAL, "internal"},           {PROTO_E_FORBIDDEN, "forbidden"},
        {PROTO_E_UNAUTHORIZED, "unauthorized"},   {PROTO_E_RATE_LIMITED, "rate_limited"},
    };
    cr_assert_eq(sizeof codes / sizeof codes[0], PROTO_E_COUNT - 1, "every code is listed");
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        cr_assert_str_eq(proto_err_code(codes[i].e), codes[i].s);
        cr_assert_eq(proto_err_from_code(codes[i].s), codes[i].e);
    }
    cr_assert_str_eq(proto_err_code(0), "internal");
    cr_assert_str_eq(proto_err_code(PROTO_E_COUNT), "internal");
    cr_assert_eq(proto_err_from_code("nope"), 0);
    cr_assert_eq(proto_err_from_code(NULL), 0);
}

Test(proto, op_names_match_the_wire)
{
    static const char *const names[] = {NULL,     "generate", "chat",  "tokenize", "models",
                                        "cancel", "stats",    "load",  "evict",    "pin",
                                        "unpin",  "reload",   "drain", "fault",    "auth"};
    for (int op = 1; op <= PROTO_OP_AUTH; op++)
        cr_assert_str_eq(proto_op_name((proto_op_t)op), names[op]);
    cr_assert_null(proto_op_name(0));
    cr_assert_null(proto_op_name(PROTO_OP_AUTH + 1));
}

Test(proto, fault_op_is_admin_only_and_typed)
{
    proto_req_t r;
    char err[256];
    const char *ok =
        "{\"op\":\"fault\",\"id\":1,\"fault\":\"copy_slow\",\"count\":3,\"delay_ms\":250}";
    cr_assert_eq(proto_parse_request(ok, strlen(ok), 1, &r, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.op, PROTO_OP_FAULT);
    cr_assert_eq(r.fault, 2);
    cr_assert_eq(r.fault_count, 3);
    cr_assert_eq(r.fault_delay_ms, 250);
    char *line = proto_encode_request(&r);
    cr_assert_not_null(line);
    proto_req_t r2;
    cr_assert_eq(proto_parse_request(line, strlen(line) - 1, 1, &r2, NULL, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(r2.fault, 2);
    cr_assert_eq(r2.fault_count, 3);
    free(line);
    proto_req_free(&r2);
    proto_req_free(&r);
    cr_assert_eq(proto_parse_request(ok, strlen(ok), 0, &r, NULL, err, sizeof err),
                 -PROTO_E_BAD_REQUEST);
    cr_assert(strstr(err, "admin"), "%s", err);
    static const char *const bad[] = {
        "{\"op\":\"fault\"}",
        "{\"op\":\"fault\",\"fault\":\"melt\"}",
        "{\"op\":\"fault\",\"fault\":1}",
        "{\"op\":\"fault\",\"fault\":\"copy_fail\",\"count\":0}",
        "{\"op\":\"fault\",\"fault\":\"copy_fail\",\"delay_ms\":-1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(proto_parse_request(bad[i], strlen(bad[i]), 1, &r, NULL, err, sizeof err),
                     -PROTO_E_BAD_REQUEST, "%s", bad[i]);
}

Test(proto, fault_stall_is_the_kind_after_the_backends_and_takes_a_delay)
{
    proto_req_t r;
    char err[256];
    const char *ok = "{\"op\":\"fault\",\"id\":1,\"fault\":\"stall\",\"delay_ms\":300}";
    cr_assert_eq(proto_parse_request(ok, strlen(ok), 1, &r, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.fault, PROTO_FAULT_STALL);
    cr_assert_str_eq(proto_fault_name(r.fault), "stall");
    cr_assert_eq(r.fault_delay_ms, 300);
    cr_assert_eq(r.fault_count, 0, "count not given: one pass");
    proto_req_free(&r);
    cr_assert_null(proto_fault_name(PROTO_FAULT_STALL + 1));
}

/* ------------------------------------------------------------------ client-side events */

static void event_ok(char *line, int kind, proto_event_t *ev)
{
    cr_assert_not_null(line);
    char err[256] = "";
    int rc = proto_parse_event(line, strlen(line) - 1, ev, err, sizeof err);
    cr_assert_eq(rc, 0, "%s: %s", line, err);
    cr_assert_eq(ev->kind, kind, "%s", line);
    free(line);
}

Test(proto, the_client_parses_every_event_the_server_encodes)
{
    json_t *id = json_string("r1");
    proto_event_t ev;
    proto_timing_t t = {1, 2, 3, 4, 1};

    event_ok(proto_encode_token(id, " a", 9, -1, NULL), PROTO_EV_TOKEN, &ev);
    cr_assert(json_equal(ev.id, id));
    cr_assert_eq(json_integer_value(json_object_get(ev.root, "token")), 9);
    proto_event_free(&ev);
    cr_assert(is_zero(&ev, sizeof ev));

    event_ok(proto_encode_done(id, "all", "stop", 1, 2, 0, &t, NULL), PROTO_EV_DONE, &ev);
    cr_assert_str_eq(json_string_value(json_object_get(ev.root, "finish_reason")), "stop");
    proto_event_free(&ev);

    event_ok(proto_encode_error(id, PROTO_E_CONTEXT_OVERFLOW, "too long", 0), PROTO_EV_ERROR, &ev);
    cr_assert_eq(proto_err_from_code(
                     json_string_value(json_object_get(json_object_get(ev.root, "error"), "code"))),
                 PROTO_E_CONTEXT_OVERFLOW);
    proto_event_free(&ev);

    event_ok(proto_encode_ok(id, json_pack("{s:b}", "found", 1)), PROTO_EV_OK, &ev);
    cr_assert(json_is_true(json_object_get(ev.root, "found")));
    proto_event_free(&ev);

    event_ok(proto_encode_progress(id, "m", 1, 2), PROTO_EV_PROGRESS, &ev);
    proto_event_free(&ev);

    event_ok(proto_encode_error(NULL, PROTO_E_BAD_JSON, "x", 0), PROTO_EV_ERROR, &ev);
    cr_assert_null(ev.id, "a null id is reported as NULL");
    proto_event_free(&ev);
    json_decref(id);
    proto_event_free(NULL);
}

Test(proto, the_client_reads_an_ok_false_line_as_an_error)
{
    proto_event_t ev;
    const char *line =
        "{\"id\":1,\"ok\":false,\"error\":{\"code\":\"forbidden\",\"message\":\"no\"}}";
    cr_assert_eq(proto_parse_event(line, strlen(line), &ev, NULL, 0), 0);
    cr_assert_eq(ev.kind, PROTO_EV_ERROR);
    proto_event_free(&ev);
    line = "{\"id\":1,\"event\":\"token\",\"text\":\"a\",\"token\":1,\"future_field\":[1]}";
    cr_assert_eq(proto_parse_event(line, strlen(line), &ev, NULL, 0), 0,
                 "unknown fields are ignored");
    proto_event_free(&ev);
}

Test(proto, the_client_refuses_malformed_events)
{
    static const struct {
        const char *line;
        proto_err_t code;
        const char *want;
    } cases[] = {
        {"{\"id\":1,\"event\":", PROTO_E_BAD_JSON, "invalid JSON"},
        {"", PROTO_E_BAD_JSON, "empty line"},
        {"[1]", PROTO_E_BAD_REQUEST, "JSON object"},
        {"{\"id\":1}", PROTO_E_BAD_REQUEST, "neither 'event' nor 'ok'"},
        {"{\"id\":1,\"event\":\"tok\"}", PROTO_E_BAD_REQUEST, "unknown event 'tok'"},
        {"{\"id\":1,\"event\":7}", PROTO_E_BAD_REQUEST, "'event'"},
        {"{\"id\":1,\"event\":\"token\",\"token\":1}", PROTO_E_BAD_REQUEST, "'text'"},
        {"{\"id\":1,\"event\":\"token\",\"text\":\"a\"}", PROTO_E_BAD_REQUEST, "'token'"},
        {"{\"id\":1,\"event\":\"done\",\"text\":\"a\"}", PROTO_E_BAD_REQUEST, "'finish_reason'"},
        {"{\"id\":1,\"event\":\"error\",\"error\":{}}", PROTO_E_BAD_REQUEST, "'error.code'"},
        {"{\"id\":1,\"event\":\"progress\",\"bytes\":1}", PROTO_E_BAD_REQUEST, "'total'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proto_event_t ev;
        char err[256] = "";
        int rc = proto_parse_event(cases[i].line, strlen(cases[i].line), &ev, err, sizeof err);
        cr_assert_eq(rc, -(int)cases[i].code, "%s -> %d (%s)", cases[i].line, rc, err);
        cr_assert(strstr(err, cases[i].want), "'%s' should mention %s", err, cases[i].want);
        cr_assert(is_zero(&ev, sizeof ev));
    }
}

/* ------------------------------------------------------------------ logprobs, logit_bias, n, echo */

Test(proto, logprobs_logit_bias_n_and_echo_parse_and_round_trip)
{
    const char *line = "{\"op\":\"generate\",\"id\":1,\"model\":\"m\",\"prompt\":\"x\","
                       "\"logprobs\":true,\"top_logprobs\":20,\"n\":16,"
                       "\"logit_bias\":{\"7\":-100,\"300\":2.5}}";
    proto_req_t r;
    parse_ok(line, 0, &r);
    cr_assert_eq(r.logprobs, 1);
    cr_assert_eq(r.top_logprobs, 20);
    cr_assert_eq(r.n, 16);
    cr_assert_eq(r.n_bias, 2);
    cr_assert_eq(r.bias_ids[0], 7);
    cr_assert_eq(r.bias[0], -100.0f);
    cr_assert_eq(r.bias_ids[1], 300);
    cr_assert_eq(r.bias[1], 2.5f);
    proto_req_free(&r);
    round_trip(line, 0);
    round_trip("{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"x\",\"echo\":true,\"n\":2,"
               "\"suffix\":\"y\"}",
               0);
    round_trip(
        "{\"op\":\"chat\",\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
        "\"logprobs\":true,\"logit_bias\":{\"0\":1}}",
        0);
}

Test(proto, bad_logprobs_logit_bias_n_and_echo_are_named)
{
#define GEN "{\"op\":\"generate\",\"model\":\"m\",\"prompt\":\"x\","
    bad(GEN "\"top_logprobs\":21,\"logprobs\":true}", "top_logprobs");
    bad(GEN "\"top_logprobs\":2}", "needs 'logprobs'");
    bad(GEN "\"logprobs\":1}", "logprobs");
    bad(GEN "\"n\":0}", "'n'");
    bad(GEN "\"n\":17}", "'n'");
    bad(GEN "\"logit_bias\":[1]}", "logit_bias");
    bad(GEN "\"logit_bias\":{\"-1\":1}}", "not a token id");
    bad(GEN "\"logit_bias\":{\"1x\":1}}", "not a token id");
    bad(GEN "\"logit_bias\":{\"99999999999\":1}}", "not a token id");
    bad(GEN "\"logit_bias\":{\"1\":100.5}}", "-100 .. 100");
    bad(GEN "\"logit_bias\":{\"1\":\"a\"}}", "-100 .. 100");
    bad(GEN "\"echo\":true,\"logprobs\":true}", "'echo' and 'logprobs'");
    bad("{\"op\":\"chat\",\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
        "\"echo\":true}",
        "echo");
    bad("{\"op\":\"chat\",\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
        "\"suffix\":\"y\"}",
        "suffix");
    bad(GEN "\"suffix\":3}", "suffix");
#undef GEN
}

Test(proto, token_and_done_lines_carry_index_left_and_logprobs)
{
    json_t *e = proto_logprob_new(5, "a\xff", 2, -0.5);
    cr_assert_not_null(e);
    proto_choice_t c = {.index = 1, .n = 3, .left = 2, .logprobs = e};
    json_t *j = reparse_line(proto_encode_token(NULL, "a", 5, -1, &c));
    cr_assert_eq(iget(j, "index"), 1);
    cr_assert_null(json_object_get(j, "left"), "left is the done line's");
    const json_t *lp = json_object_get(j, "logprobs");
    cr_assert_eq(json_integer_value(json_object_get(lp, "token")), 5);
    cr_assert_str_eq(json_string_value(json_object_get(lp, "text")), "a\xef\xbf\xbd");
    cr_assert_eq(json_array_size(json_object_get(lp, "bytes")), 2);
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(lp, "bytes"), 1)), 255);
    cr_assert_float_eq(json_real_value(json_object_get(lp, "logprob")), -0.5, 1e-12);
    json_decref(j);
    j = reparse_line(proto_encode_done(NULL, "a", "stop", 1, 2, 0, NULL, &c));
    cr_assert_eq(iget(j, "index"), 1);
    cr_assert_eq(iget(j, "left"), 2);
    json_decref(j);
    c.n = 1; /* one choice: no index, no left */
    c.logprobs = NULL;
    j = reparse_line(proto_encode_done(NULL, "a", "stop", 1, 2, 0, NULL, &c));
    cr_assert_null(json_object_get(j, "index"));
    cr_assert_null(json_object_get(j, "left"));
    cr_assert_null(json_object_get(j, "logprobs"));
    json_decref(j);
    json_decref(e);
}
