/* test_constrain: the JSON-schema compiler (accepted and refused schemas with their pointers), the
 * byte automaton (valid documents accepted, invalid ones refused at the right byte), the schema
 * cache, and token masks over a real 32,000-token vocabulary. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/constrain.h"
#include "engine/gguf.h"
#include "testutil.h"

/* ------------------------------------------------------------------ helpers */

/* response_format json_schema around the schema text. */
static json_t *rf_schema(const char *schema)
{
    json_error_t je;
    json_t *s = json_loads(schema, JSON_DECODE_ANY, &je);
    cr_assert_not_null(s, "bad test schema: %s: %s", schema, je.text);
    return json_pack("{s:s, s:{s:s, s:o, s:b}}", "type", "json_schema", "json_schema", "name", "t",
                     "schema", s, "strict", 1);
}

static cons_schema_t *compile_ok(const char *schema)
{
    char err[512] = "";
    json_t *rf = rf_schema(schema);
    cons_schema_t *sc = cons_schema_compile(rf, NULL, err, sizeof err);
    json_decref(rf);
    cr_assert_not_null(sc, "refused %s: %s", schema, err);
    return sc;
}

/* Compiles schema expecting a refusal whose reason starts with want_prefix. */
static void compile_refused(const char *schema, int want_code, const char *want_prefix)
{
    char err[512] = "";
    int code = 0;
    json_t *rf = rf_schema(schema);
    cons_schema_t *sc = cons_schema_compile(rf, &code, err, sizeof err);
    json_decref(rf);
    cr_assert_null(sc, "accepted %s", schema);
    cr_assert_eq(code, want_code, "%s: code %d (%s)", schema, code, err);
    cr_assert(strncmp(err, want_prefix, strlen(want_prefix)) == 0, "%s: got '%s', want '%s...'",
              schema, err, want_prefix);
}

/* Whether the document text is accepted whole and complete under schema. */
static int doc_ok(cons_schema_t *sc, const char *doc)
{
    cons_t *c = cons_new(sc, tu_vocab_trie);
    int ok = cons_accept_bytes(c, doc, strlen(doc)) == 0 && cons_complete(c);
    cons_free(c);
    return ok;
}

/* The length of the longest prefix of doc the automaton takes (strlen(doc) when all). */
static size_t doc_prefix(cons_schema_t *sc, const char *doc)
{
    cons_t *c = cons_new(sc, tu_vocab_trie);
    size_t i = 0;
    while (doc[i] && cons_accept_bytes(c, doc + i, 1) == 0)
        i++;
    cons_free(c);
    return i;
}

/* ------------------------------------------------------------------ compiler */

Test(constrain, compiles_the_supported_keywords)
{
    static const char *const ok[] = {
        "{}",
        "true",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":1,"
        "\"maxLength\":5},\"b\":{\"type\":\"integer\"},\"c\":{\"type\":[\"number\",\"null\"]}},"
        "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\",1,null,{\"k\":[1]}]},\"minItems\":1,"
        "\"maxItems\":3}",
        "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"},{\"$ref\":\"#/$defs/n\"}],"
        "\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/n\"}}}}}",
        "{\"const\":\"fixed\",\"title\":\"t\",\"description\":\"d\"}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}",
        "{\"allOf\":[{\"type\":\"string\"}]}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        cons_schema_unref(compile_ok(ok[i]));
}

Test(constrain, refuses_what_it_cannot_enforce_naming_the_part)
{
    compile_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                    "\"pattern\":\"(?=x)\"}}}",
                    CONS_ERR_UNSUPPORTED, "/properties/a/pattern: pattern '(?=x)': lookarounds");
    compile_refused("{\"properties\":{\"w/x\":{\"type\":\"string\",\"format\":\"idn-email\"}}}",
                    CONS_ERR_UNSUPPORTED, "/properties/w~1x/format: format 'idn-email'");
    compile_refused("{\"pattern\":\"^x\"}", CONS_ERR_UNSUPPORTED, "/pattern: 'pattern' needs a");
    compile_refused("{\"type\":\"number\",\"minimum\":0}", CONS_ERR_UNSUPPORTED, "/minimum:");
    compile_refused("{\"anyOf\":[{\"type\":\"string\"},{\"enum\":[\"a\"]}]}", CONS_ERR_UNSUPPORTED,
                    "/anyOf: branch 1 can begin with '\"'");
    compile_refused("{\"$ref\":\"http://x/s.json\"}", CONS_ERR_UNSUPPORTED, "/$ref:");
    compile_refused("{\"type\":\"object\",\"properties\":{},\"required\":[\"z\"]}",
                    CONS_ERR_UNSUPPORTED, "/required/0:");
    compile_refused("{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", CONS_ERR_UNSUPPORTED,
                    "/: minLength 5 is above maxLength 2");
    compile_refused("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"minItems\":2,"
                    "\"uniqueItems\":true}}",
                    CONS_ERR_UNSUPPORTED, "/items/uniqueItems:");
    compile_refused("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", CONS_ERR_UNSUPPORTED,
                    "/allOf: allOf of several");
    compile_refused("{\"type\":\"strung\"}", CONS_ERR_FORMAT, "/type: unknown type 'strung'");
    compile_refused("{\"enum\":[1,2],\"type\":\"string\"}", CONS_ERR_UNSUPPORTED,
                    "/enum: no value");
    compile_refused("false", CONS_ERR_UNSUPPORTED, "/: the schema false");
}

Test(constrain, refuses_a_malformed_response_format)
{
    char err[256];
    int code = 0;
    json_t *rf = json_pack("{s:s}", "type", "json_schema");
    cr_assert_null(cons_schema_compile(rf, &code, err, sizeof err));
    cr_assert_eq(code, CONS_ERR_FORMAT);
    cr_assert(strstr(err, "json_schema.schema is missing"), "%s", err);
    json_decref(rf);
    rf = json_pack("{s:s}", "type", "text");
    cr_assert_null(cons_schema_compile(rf, &code, err, sizeof err));
    cr_assert_eq(code, CONS_ERR_FORMAT);
    json_decref(rf);
}

Test(constrain, caches_a_schema_by_its_text)
{
    cons_cache_t *c = cons_cache_new(2);
    char err[256];
    json_t *a = rf_schema("{\"type\":\"string\"}"), *b = rf_schema("{\"type\":\"integer\"}");
    json_t *a2 = rf_schema("{\"type\":\"string\"}"), *d = rf_schema("{\"type\":\"null\"}");
    cons_schema_t *s1 = cons_cache_get(c, a, NULL, err, sizeof err);
    cons_schema_t *s2 = cons_cache_get(c, a2, NULL, err, sizeof err);
    cr_assert_not_null(s1);
    cr_assert_eq(s1, s2, "the same text compiles once");
    cons_schema_t *s3 = cons_cache_get(c, b, NULL, err, sizeof err);
    cons_schema_t *s4 = cons_cache_get(c, d, NULL, err, sizeof err); /* drops the oldest (a) */
    uint64_t hits, misses;
    cons_cache_counts(c, &hits, &misses);
    cr_assert_eq(hits, 1);
    cr_assert_eq(misses, 3);
    cons_cache_free(c); /* entries in use live on */
    cr_assert_eq(cons_schema_ref(s1), s1);
    cons_schema_unref(s1);
    cons_schema_unref(s1);
    cons_schema_unref(s2);
    cons_schema_unref(s3);
    cons_schema_unref(s4);
    json_decref(a);
    json_decref(a2);
    json_decref(b);
    json_decref(d);
}

/* ------------------------------------------------------------------ automaton */

#define PERSON                                                                                     \
    "{\"type\":\"object\",\"properties\":{"                                                        \
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":4},"                              \
    "\"age\":{\"type\":\"integer\"},"                                                              \
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"ab\",true]},\"maxItems\":2},"       \
    "\"pet\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/pet\"}]}},"                       \
    "\"required\":[\"name\",\"age\"],"                                                             \
    "\"$defs\":{\"pet\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"cat\"},"        \
    "\"w\":{\"type\":\"number\"}},\"required\":[\"kind\"]}}}"

Test(constrain, accepts_valid_documents, .init = tu_vocab_setup, .fini = tu_vocab_teardown)
{
    cons_schema_t *sc = compile_ok(PERSON);
    static const char *const good[] = {
        "{\"name\":\"Al\",\"age\":3}",
        "{ \"name\" : \"\xc3\xa9t\xc3\xa9\" , \"age\" : -0 }",
        "{\"name\":\"a\\\"b\",\"age\":12,\"tags\":[]}",
        "{\"name\":\"x\",\"age\":1,\"tags\":[\"ab\",true],\"pet\":null}",
        "{\"name\":\"x\",\"age\":1,\"pet\":{\"kind\":\"cat\",\"w\":-1.5e+2}}\n",
        "{\n  \"name\": \"\xe2\x82\xac\",\n  \"age\": 7\n}\n",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert(doc_ok(sc, good[i]), "refused: %s (at byte %zu)", good[i],
                  doc_prefix(sc, good[i]));
    cons_schema_unref(sc);
}

Test(constrain, rejects_invalid_documents_at_the_first_bad_byte, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    cons_schema_t *sc = compile_ok(PERSON);
    static const struct {
        const char *doc;
        size_t at; /* bytes taken before the refusal */
    } bad[] = {
        {"{\"age\":3}", 2},                                      /* name is required first */
        {"{\"name\":\"\",", 9},                                  /* minLength 1 */
        {"{\"name\":\"abcde\"", 13},                             /* maxLength 4 */
        {"{\"name\":\"a\",\"age\":1.5}", 19},                    /* integer */
        {"{\"name\":\"a\",\"age\":01}", 19},                     /* no leading zeros */
        {"{\"name\":\"a\",\"age\":1,\"tags\":[1]}", 28},         /* not in the enum */
        {"{\"name\":\"a\",\"age\":1,\"tags\":[true,\"a\",", 36}, /* maxItems 2 */
        {"{\"name\":\"a\",\"age\":1,\"x\":1}", 21},              /* no such property */
        {"{\"name\":\"a\",\"age\":1,\"pet\":{}}", 27},           /* kind is required */
        {"{\"name\":\"a\",\"age\":1}x", 20},                     /* nothing after the document */
        {"{\"name\":\"a\xff\"", 10},                             /* invalid UTF-8 */
        {"{\"name\":\"\xe0\x80\"", 10},                          /* overlong */
        {"{\"name\":\"a\nb\"", 10},                              /* raw control character */
        {"{\"name\":\"\\u0041\"", 10},                           /* \u escapes are not generated */
        {"{         \"name\"", 9},                               /* whitespace runs are bounded */
        {" {\"name\":\"a\"}", 0},                                /* none before the document */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert(!doc_ok(sc, bad[i].doc), "accepted: %s", bad[i].doc);
        cr_assert_eq(doc_prefix(sc, bad[i].doc), bad[i].at, "%s: refused at %zu, want %zu",
                     bad[i].doc, doc_prefix(sc, bad[i].doc), bad[i].at);
    }
    cons_schema_unref(sc);
}

Test(constrain, nullable_true_also_takes_null_as_the_zod_helper_writes_it, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    /* what openai's zodResponseFormat gives for z.string().nullable() and a nullable object */
    cons_schema_t *sc = compile_ok(
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"nullable\":true},"
        "\"o\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}},"
        "\"required\":[\"k\"],\"nullable\":true},\"e\":{\"enum\":[\"a\",null],\"nullable\":true},"
        "\"f\":{\"type\":\"integer\",\"nullable\":false}},\"required\":[\"s\",\"o\",\"e\",\"f\"]}");
    cr_assert(doc_ok(sc, "{\"s\":null,\"o\":null,\"e\":null,\"f\":1}"));
    cr_assert(doc_ok(sc, "{\"s\":\"x\",\"o\":{\"k\":2},\"e\":\"a\",\"f\":0}"));
    cr_assert(!doc_ok(sc, "{\"s\":null,\"o\":null,\"e\":null,\"f\":null}"));
    cons_schema_unref(sc);
    compile_refused("{\"type\":\"string\",\"nullable\":1}", CONS_ERR_FORMAT,
                    "/nullable: must be a boolean");
}

Test(constrain, json_object_takes_any_object_and_only_an_object, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    json_t *rf = json_pack("{s:s}", "type", "json_object");
    char err[256];
    cons_schema_t *sc = cons_schema_compile(rf, NULL, err, sizeof err);
    json_decref(rf);
    cr_assert_not_null(sc, "%s", err);
    cr_assert(doc_ok(sc, "{}"));
    cr_assert(doc_ok(sc, "{\"a\":[1,{\"b\":null},\"c\",-2.5e3,true],\"d\":{}}"));
    cr_assert(!doc_ok(sc, "[1]"));
    cr_assert(!doc_ok(sc, "\"s\""));
    cr_assert(!doc_ok(sc, "{\"a\":1"), "incomplete");
    cr_assert(!doc_ok(sc, "{\"a\":1,}"));
    cons_schema_unref(sc);
}

Test(constrain, numbers_end_only_where_json_lets_them, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    cons_schema_t *sc = compile_ok("{\"type\":\"number\"}");
    cr_assert(doc_ok(sc, "0"));
    cr_assert(doc_ok(sc, "-12.5E-3"));
    cr_assert(!doc_ok(sc, "-"));
    cr_assert(!doc_ok(sc, "1."));
    cr_assert(!doc_ok(sc, "1e"));
    cr_assert(!doc_ok(sc, "1234567890123456"), "at most 15 digits");
    cons_schema_unref(sc);
    sc = compile_ok("{\"enum\":[1,12]}");
    cr_assert(doc_ok(sc, "1"));
    cr_assert(doc_ok(sc, "12"));
    cr_assert(!doc_ok(sc, "123"));
    cons_schema_unref(sc);
}

/* ------------------------------------------------------------------ masks */

static int bit(const uint32_t *bits, int32_t id)
{
    return (int)(bits[id >> 5] >> (id & 31) & 1u);
}

/* The mask's count is its bits', and end-of-generation tokens follow completeness. */
static void check_mask_count(cons_t *c)
{
    int32_t n = 0, count = 0;
    const uint32_t *bits = cons_mask(c, &n);
    for (int32_t id = 0; id < cons_vocab_size(tu_vocab_trie); id++) {
        count += bit(bits, id);
        if (tok_is_eog(tu_vocab_tok, id))
            cr_assert_eq(bit(bits, id), cons_complete(c), "token %d", id);
    }
    cr_assert_eq(count, n);
}

/* Every token: allowed at prefix iff a fresh matcher at the same prefix takes its bytes. */
static void check_mask_exact(cons_schema_t *sc, const char *prefix)
{
    char piece[128];
    cons_t *c = cons_new(sc, tu_vocab_trie);
    cr_assert_eq(cons_accept_bytes(c, prefix, strlen(prefix)), 0, "prefix '%s'", prefix);
    check_mask_count(c);
    int32_t n;
    const uint32_t *bits = cons_mask(c, &n);
    cr_assert_gt(n, 0, "prefix '%s': a dead end", prefix);
    for (int32_t id = 0; id < cons_vocab_size(tu_vocab_trie); id++) {
        int len = tok_piece(tu_vocab_tok, id, 0, piece, sizeof piece);
        if (tok_is_eog(tu_vocab_tok, id) || len <= 0 || len > 64)
            continue;
        cons_t *d = cons_new(sc, tu_vocab_trie);
        cons_accept_bytes(d, prefix, strlen(prefix));
        int takes = cons_accept_bytes(d, piece, (size_t)len) == 0;
        cons_free(d);
        cr_assert_eq(bit(bits, id), takes, "prefix '%s', token %d '%s'", prefix, id, piece);
    }
    cons_free(c);
}

Test(constrain, masks_agree_with_the_automaton_on_a_real_vocabulary, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    cr_assert_eq(cons_vocab_size(tu_vocab_trie), 32000);
    cr_assert_gt(cons_vocab_nodes(tu_vocab_trie), 32000);
    cons_schema_t *sc = compile_ok(PERSON);
    static const char *const prefixes[] = {
        "", "{\"na", "{\"name\":\"ab", "{\"name\":\"x\",\"age\":4", "{\"name\":\"x\",\"age\":4}"};
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++)
        check_mask_exact(sc, prefixes[p]);
    cons_schema_unref(sc);
}

/* Inside a string's body the mask is the plain tokens that fit plus a walk of the others: the
 * same set as a walk of every token, for unbounded strings, keys, bounds with little and much
 * room, and not taken after an escape or inside a character. */
Test(constrain, string_body_masks_agree_with_the_automaton, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown, .timeout = 60)
{
    char err[512] = "";
    json_t *rf = json_pack("{s:s}", "type", "json_object");
    cons_schema_t *any = cons_schema_compile(rf, NULL, err, sizeof err);
    json_decref(rf);
    cr_assert_not_null(any, "%s", err);
    static const char *const any_prefixes[] = {"{\"", "{\"k\":\"", "{\"k\":\"ab\\", "{\"k\":\"\xc3",
                                               "{\"k\":[\"x y"};
    for (size_t p = 0; p < sizeof any_prefixes / sizeof any_prefixes[0]; p++)
        check_mask_exact(any, any_prefixes[p]);
    cons_schema_unref(any);
    cons_schema_t *sc = compile_ok("{\"type\":\"string\",\"minLength\":2,\"maxLength\":20}");
    static const char *const prefixes[] = {"\"", "\"abcdefghijklmnop", "\"abcdefghijklmnopqrs",
                                           "\"abcdefghijklmnopqrst"};
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++)
        check_mask_exact(sc, prefixes[p]);
    cons_schema_unref(sc);
}

Test(constrain, end_of_text_only_once_the_document_is_complete, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    cons_schema_t *sc = compile_ok("{\"type\":\"integer\"}");
    cons_t *c = cons_new(sc, tu_vocab_trie);
    int32_t eos = tok_eos(tu_vocab_tok);
    cr_assert(!bit(cons_mask(c, NULL), eos));
    cr_assert_eq(cons_accept(c, eos), -1);
    cr_assert_eq(cons_accept_bytes(c, "42", 2), 0);
    cr_assert(bit(cons_mask(c, NULL), eos));
    float *logits = calloc(32000, sizeof *logits);
    int32_t n = cons_mask_logits(c, logits);
    int32_t finite = 0;
    for (int32_t i = 0; i < 32000; i++)
        finite += isfinite(logits[i]);
    cr_assert_eq(finite, n);
    cr_assert_eq(cons_accept(c, eos), 0);
    free(logits);
    cons_free(c);
    cons_schema_unref(sc);
}

/* Picks random allowed tokens until the document is complete: it always parses and fits. */
Test(constrain, random_walks_over_the_mask_end_in_valid_json, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown, .timeout = 60)
{
    cons_schema_t *sc = compile_ok(PERSON);
    uint64_t rng = 12345;
    int parsed = 0;
    for (int run = 0; run < 20; run++) {
        cons_t *c = cons_new(sc, tu_vocab_trie);
        char doc[4096];
        size_t len = 0;
        int done = 0;
        for (int step = 0; step < 400 && !done; step++) {
            int32_t n;
            const uint32_t *bits = cons_mask(c, &n);
            cr_assert_gt(n, 0, "dead end after '%.*s'", (int)len, doc);
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int32_t k = (int32_t)((rng >> 33) % (uint64_t)n), id = -1;
            /* prefer ending once complete, else the k-th allowed token */
            if (cons_complete(c) && bit(bits, tok_eos(tu_vocab_tok)))
                id = tok_eos(tu_vocab_tok);
            for (int32_t i = 0; id < 0 && i < cons_vocab_size(tu_vocab_trie); i++)
                if (bit(bits, i) && k-- == 0)
                    id = i;
            cr_assert_eq(cons_accept(c, id), 0);
            if (id == tok_eos(tu_vocab_tok)) {
                done = 1;
                break;
            }
            char piece[128];
            int pl = tok_piece(tu_vocab_tok, id, 0, piece, sizeof piece);
            cr_assert(len + (size_t)pl < sizeof doc);
            memcpy(doc + len, piece, (size_t)pl);
            len += (size_t)pl;
        }
        if (!done) {
            cons_free(c);
            continue; /* ran long: nothing to parse */
        }
        parsed++;
        json_error_t je;
        json_t *v = json_loadb(doc, len, 0, &je);
        cr_assert_not_null(v, "'%.*s': %s", (int)len, doc, je.text);
        const char *name = json_string_value(json_object_get(v, "name"));
        cr_assert(name && strlen(name) >= 1);
        cr_assert(json_is_integer(json_object_get(v, "age")));
        json_decref(v);
        cons_free(c);
    }
    cr_assert_gt(parsed, 10, "only %d of 20 walks ended", parsed);
    cons_schema_unref(sc);
}

/* ------------------------------------------------------------------ integer bounds */

/* Every integer text from -1500 to 1500 (and each prefix of it) is taken iff the bounds admit it
 * (a prefix: iff some admitted integer's text begins with it; "-0" is 0). */
static void check_int_bounds(const char *schema, long lo, long hi)
{
    cons_schema_t *sc = compile_ok(schema);
    char doc[32], wrapped[48], other[32];
    for (long v = -1500; v <= 1500; v++) {
        snprintf(doc, sizeof doc, "%ld", v);
        cr_assert_eq(doc_ok(sc, doc), v >= lo && v <= hi, "%s: %s", schema, doc);
        for (size_t k = 1; k < strlen(doc); k++) {
            int viable = 0;
            for (long w = lo; w <= hi && !viable; w++) {
                snprintf(other, sizeof other, "%ld", w);
                viable = strncmp(other, doc, k) == 0;
            }
            viable |= k == 1 && doc[0] == '-' && lo <= 0 && hi >= 0; /* "-0" */
            cr_assert_eq(doc_prefix(sc, doc) >= k, viable, "%s: prefix %.*s of %s", schema, (int)k,
                         doc, doc);
        }
    }
    cr_assert_eq(doc_ok(sc, "-0"), lo <= 0 && hi >= 0, "%s: -0", schema);
    cons_schema_unref(sc);
    /* inside an object the integer ends at the next byte: the same bound */
    char obj[512];
    snprintf(obj, sizeof obj,
             "{\"type\":\"object\",\"properties\":{\"n\":%s},\"required\":[\"n\"]}", schema);
    sc = compile_ok(obj);
    snprintf(wrapped, sizeof wrapped, "{\"n\":%ld}", hi);
    cr_assert(doc_ok(sc, wrapped), "%s", wrapped);
    snprintf(wrapped, sizeof wrapped, "{\"n\":%ld}", hi + 1);
    cr_assert(!doc_ok(sc, wrapped), "%s", wrapped);
    snprintf(wrapped, sizeof wrapped, "{\"n\":%ld }", lo - 1);
    cr_assert(!doc_ok(sc, wrapped), "%s", wrapped);
    cons_schema_unref(sc);
}

Test(constrain, integer_bounds_admit_exactly_their_integers, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown, .timeout = 60)
{
    check_int_bounds("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}", -5, 120);
    check_int_bounds("{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}", 1, 9);
    check_int_bounds("{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,"
                     "\"maximum\":900,\"exclusiveMaximum\":false}",
                     1, 900); /* draft 4 */
    check_int_bounds("{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":33.9}", 2, 33);
    check_int_bounds("{\"type\":[\"integer\",\"null\"],\"minimum\":-1200,\"maximum\":-1000}", -1200,
                     -1000);
    check_int_bounds("{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}", 0, 0);
    cons_schema_t *sc = compile_ok("{\"type\":\"integer\",\"minimum\":900}");
    cr_assert(doc_ok(sc, "999999999999999") && !doc_ok(sc, "899") && doc_prefix(sc, "-") == 0);
    cons_schema_unref(sc);
    /* a mask at a bounded integer's prefix: exactly the tokens the automaton takes */
    sc = compile_ok("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\","
                    "\"minimum\":10,\"maximum\":250}}}");
    static const char *const prefixes[] = {"{\"n\":", "{\"n\":2", "{\"n\":25", "{\"n\":1"};
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++)
        check_mask_exact(sc, prefixes[p]);
    cons_schema_unref(sc);
}

Test(constrain, numeric_bounds_it_cannot_enforce_are_refused)
{
    compile_refused("{\"type\":\"number\",\"maximum\":1}", CONS_ERR_UNSUPPORTED,
                    "/maximum: 'maximum' is supported on integers");
    compile_refused("{\"minimum\":1}", CONS_ERR_UNSUPPORTED, "/minimum: 'minimum' needs");
    compile_refused("{\"type\":\"integer\",\"enum\":[1,5],\"maximum\":3}", CONS_ERR_UNSUPPORTED,
                    "/maximum:");
    compile_refused("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4.5}", CONS_ERR_UNSUPPORTED,
                    "/: no integer within the bounds");
    compile_refused("{\"type\":\"integer\",\"exclusiveMinimum\":true}", CONS_ERR_FORMAT,
                    "/exclusiveMinimum: true needs 'minimum'");
    compile_refused("{\"type\":\"integer\",\"maximum\":\"3\"}", CONS_ERR_FORMAT,
                    "/maximum: must be a number");
}

Test(constrain, keywords_outside_json_schema_are_ignored_and_its_others_refused)
{
    cons_schema_unref(compile_ok("{\"type\":\"object\",\"self\":{\"vendor\":\"v\",\"name\":\"n\"},"
                                 "\"properties\":{\"a\":{\"type\":\"string\","
                                 "\"x-kubernetes-patch-strategy\":\"merge\",\"_format\":\"uri\"}},"
                                 "\"id\":\"http://example.com/s#\"}"));
    compile_refused(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"$id\":\"a\",\"type\":\"string\"}}}",
        CONS_ERR_UNSUPPORTED, "/properties/a/$id: '$id' below the root");
    compile_refused("{\"type\":\"object\",\"maxProperties\":1}", CONS_ERR_UNSUPPORTED,
                    "/maxProperties: keyword 'maxProperties' is not supported");
    compile_refused("{\"type\":\"string\",\"if\":{}}", CONS_ERR_UNSUPPORTED, "/if:");
}

/* ------------------------------------------------------------------ patterns and formats */

Test(constrain, strings_follow_their_pattern_or_format, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown, .timeout = 60)
{
    cons_schema_t *sc = compile_ok("{\"type\":\"object\",\"properties\":{"
                                   "\"id\":{\"type\":\"string\",\"pattern\":\"^[a-z]+-[0-9]{2}$\"},"
                                   "\"nl\":{\"type\":\"string\",\"pattern\":\"^a\\\\n\"},"
                                   "\"any\":{\"type\":\"string\",\"pattern\":\"x\"},"
                                   "\"day\":{\"type\":\"string\",\"format\":\"date\"}},"
                                   "\"required\":[\"id\"]}");
    cr_assert(doc_ok(sc, "{\"id\":\"ab-12\"}"));
    cr_assert(!doc_ok(sc, "{\"id\":\"ab-1\"}") && !doc_ok(sc, "{\"id\":\"Ab-12\"}"));
    cr_assert_eq(doc_prefix(sc, "{\"id\":\"ab-123\"}"), strlen("{\"id\":\"ab-12"));
    cr_assert(doc_ok(sc, "{\"id\":\"q-00\",\"nl\":\"a\\nb\"}"), "an escape is its character");
    cr_assert_eq(doc_prefix(sc, "{\"id\":\"ab\\n"), strlen("{\"id\":\"ab"),
                 "no backslash where the pattern takes no escaped character");
    cr_assert(!doc_ok(sc, "{\"id\":\"q-00\",\"nl\":\"a\\tb\"}"));
    cr_assert(doc_ok(sc, "{\"id\":\"q-00\",\"any\":\"\xc3\xa9x\xc3\xa9\"}"), "unanchored: around");
    cr_assert(!doc_ok(sc, "{\"id\":\"q-00\",\"any\":\"yy\"}"));
    cr_assert(doc_ok(sc, "{\"id\":\"q-00\",\"day\":\"2024-02-28\"}"));
    cr_assert(!doc_ok(sc, "{\"id\":\"q-00\",\"day\":\"2024-02-30\"}"));
    static const char *const prefixes[] = {"{\"id\":\"", "{\"id\":\"ab", "{\"id\":\"ab-1",
                                           "{\"id\":\"q-00\",\"any\":\"y",
                                           "{\"id\":\"q-00\",\"day\":\"2024-0"};
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++)
        check_mask_exact(sc, prefixes[p]);
    cons_schema_unref(sc);
}

/* Random walks over the masks of strings with patterns and formats never reach a dead end (a
 * token the mask allowed always leaves some token allowed) and end in JSON. */
Test(constrain, random_walks_through_patterns_and_formats_never_dead_end, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown, .timeout = 60)
{
    cons_schema_t *sc = compile_ok(
        "{\"type\":\"object\",\"properties\":{"
        "\"mail\":{\"type\":\"string\",\"format\":\"email\"},"
        "\"at\":{\"type\":\"string\",\"format\":\"date-time\"},"
        "\"web\":{\"type\":\"string\",\"format\":\"uri\"},"
        "\"b64\":{\"type\":\"string\",\"pattern\":\"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|"
        "[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$\"},"
        "\"ver\":{\"type\":\"string\",\"pattern\":\"^[0-9]+-[0-9]+-[0-9]+$\",\"maxLength\":12},"
        "\"n\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":7}},"
        "\"required\":[\"mail\",\"at\",\"web\",\"b64\",\"ver\",\"n\"]}");
    uint64_t rng = 777;
    int ended = 0;
    int32_t closers[16],
        n_closers = 0; /* one-byte tokens that end a part: preferred 3 times in 4 */
    for (int32_t id = 0; id < cons_vocab_size(tu_vocab_trie) && n_closers < 16; id++) {
        char piece[8];
        if (tok_piece(tu_vocab_tok, id, 0, piece, sizeof piece) == 1 && strchr("\"},=]", piece[0]))
            closers[n_closers++] = id;
    }
    for (int run = 0; run < 12; run++) {
        cons_t *c = cons_new(sc, tu_vocab_trie);
        char doc[8192];
        size_t len = 0;
        for (int step = 0; step < 800; step++) {
            int32_t n;
            const uint32_t *bits = cons_mask(c, &n);
            cr_assert_gt(n, 0, "run %d: a dead end after '%.*s'", run, (int)len, doc);
            if (cons_complete(c)) {
                ended++;
                break;
            }
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int32_t k = (int32_t)((rng >> 33) % (uint64_t)n), id = -1;
            for (int32_t i = 0; (rng >> 20 & 3) && id < 0 && i < n_closers; i++)
                if (bit(bits, closers[i]))
                    id = closers[i];
            for (int32_t i = 0; id < 0 && i < cons_vocab_size(tu_vocab_trie); i++)
                if (bit(bits, i) && k-- == 0)
                    id = i;
            cr_assert_eq(cons_accept(c, id), 0);
            char piece[128];
            int pl = tok_piece(tu_vocab_tok, id, 0, piece, sizeof piece);
            if (pl > 0 && len + (size_t)pl < sizeof doc) {
                memcpy(doc + len, piece, (size_t)pl);
                len += (size_t)pl;
            }
        }
        cons_free(c);
    }
    cr_assert_gt(ended, 3, "only %d of 12 walks completed a document", ended);
    cons_schema_unref(sc);
}

/* A union's branches of literal sets are one set (oneOf drops the values of two branches); a
 * "type" beside a union applies to each branch; uniqueItems holds at most one item; minProperties
 * and dependencies make properties required. */
Test(constrain, unions_of_literals_types_beside_unions_and_object_counts, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    cons_schema_t *sc =
        compile_ok("{\"anyOf\":[{\"enum\":[\"git\"]},{\"const\":\"hg\"},{\"type\":\"integer\"}]}");
    cr_assert(doc_ok(sc, "\"git\"") && doc_ok(sc, "\"hg\"") && doc_ok(sc, "7") &&
              !doc_ok(sc, "\"svn\""));
    cons_schema_unref(sc);
    sc = compile_ok("{\"oneOf\":[{\"enum\":[\"a\",\"b\"]},{\"enum\":[\"b\",\"c\"]}]}");
    cr_assert(doc_ok(sc, "\"a\"") && doc_ok(sc, "\"c\"") && !doc_ok(sc, "\"b\""), "b is in both");
    cons_schema_unref(sc);
    sc = compile_ok("{\"type\":\"string\",\"oneOf\":[{\"const\":\"auto\"},{\"const\":\"lf\"}]}");
    cr_assert(doc_ok(sc, "\"lf\"") && doc_ok(sc, "\"auto\"") && !doc_ok(sc, "\"cr\""));
    cons_schema_unref(sc);
    compile_refused("{\"type\":\"string\",\"oneOf\":[{\"const\":\"lf\"},{\"const\":3}]}",
                    CONS_ERR_UNSUPPORTED, "/oneOf/1/const: no value"); /* the type applies */
    compile_refused("{\"type\":\"string\",\"anyOf\":[{\"type\":\"integer\"}]}",
                    CONS_ERR_UNSUPPORTED, "/anyOf/0/type: a type other than");
    sc = compile_ok("{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}");
    cr_assert(doc_ok(sc, "[]") && doc_ok(sc, "[\"x\"]") && !doc_ok(sc, "[\"x\",\"y\"]"));
    cons_schema_unref(sc);
    compile_refused("{\"type\":\"array\",\"minItems\":2,\"uniqueItems\":true}",
                    CONS_ERR_UNSUPPORTED, "/uniqueItems: unique items beside minItems above 1");
    sc = compile_ok(
        "{\"type\":\"object\",\"minProperties\":1,\"properties\":{\"a\":{\"type\":\"integer\"},"
        "\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"integer\"}},"
        "\"dependencies\":{\"c\":[\"b\"]}}");
    cr_assert(!doc_ok(sc, "{}") && !doc_ok(sc, "{\"a\":1,\"c\":3}") &&
              doc_ok(sc, "{\"a\":1,\"b\":2,\"c\":3}") && doc_ok(sc, "{\"a\":1,\"b\":2}"));
    cons_schema_unref(sc);
    compile_refused("{\"type\":\"object\",\"minProperties\":1}", CONS_ERR_UNSUPPORTED,
                    "/minProperties: 1 properties");
    compile_refused("{\"type\":\"object\",\"properties\":{\"a\":{}},\"dependencies\":{\"a\":{}}}",
                    CONS_ERR_UNSUPPORTED, "/dependencies/a: schema dependencies");
    compile_refused(
        "{\"type\":\"object\",\"properties\":{\"a\":{}},\"dependentRequired\":{\"a\":[\"z\"]}}",
        CONS_ERR_UNSUPPORTED, "/dependentRequired/a: a dependency on a property");
}
