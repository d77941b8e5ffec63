/* bench_constrain: cost of one constrained-decoding step (mask + advance) over a 32,000-token
 * vocabulary, walking a fixed document token by token; prints µs per step (mean, p50, max). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/constrain.h"
#include "engine/gguf.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Walks doc's tokens under rf (or a grammar when rf_text does not start with '{') `rounds`
 * times; prints one line. */
static int run(const char *label, tok_t *t, cons_vocab_t *v, const char *rf_text, const char *doc,
               int rounds)
{
    char err[512];
    json_t *rf = rf_text[0] == '{' ? json_loads(rf_text, 0, NULL) : NULL;
    cons_schema_t *sc = rf ? cons_schema_compile(rf, NULL, err, sizeof err) : NULL;
    cons_grammar_t *gr = rf ? NULL : cons_grammar_compile(rf_text, NULL, err, sizeof err);
    json_decref(rf);
    if (!sc && !gr) {
        fprintf(stderr, "%s: %s\n", label, rf ? err : "bad response_format");
        return -1;
    }
    int32_t ids[4096];
    int n = tok_encode(t, doc, strlen(doc), 0, 0, ids, 4096);
    double *us = malloc((size_t)n * (size_t)rounds * sizeof *us);
    size_t k = 0;
    int32_t allowed_sum = 0;
    for (int r = 0; r < rounds; r++) {
        cons_t *c = gr ? cons_new_grammar(gr, v) : cons_new(sc, v);
        for (int i = 0; i < n; i++) {
            int32_t na;
            double t0 = now_us();
            const uint32_t *bits = cons_mask(c, &na);
            int ok = bits[ids[i] >> 5] >> (ids[i] & 31) & 1u;
            int acc = cons_accept(c, ids[i]);
            us[k++] = now_us() - t0;
            allowed_sum += na;
            if (!ok || acc) {
                fprintf(stderr, "%s: token %d (%d) refused\n", label, i, ids[i]);
                return -1;
            }
        }
        cons_free(c);
    }
    double sum = 0;
    for (size_t i = 0; i < k; i++)
        sum += us[i];
    qsort(us, k, sizeof *us, cmp_d);
    printf("%-12s steps %4d  mask+advance us/step: mean %7.1f  p50 %7.1f  p90 %7.1f  max %7.1f  "
           "allowed/step %d\n",
           label, n, sum / (double)k, us[k / 2], us[k * 9 / 10], us[k - 1],
           (int)(allowed_sum / (int32_t)k));
    free(us);
    cons_schema_unref(sc);
    cons_grammar_unref(gr);
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/data/ggml-vocab-llama-spm.gguf";
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    char err[512];
    gguf_t *g = gguf_open(path, err, sizeof err);
    tok_t *t = g ? tok_open(g, err, sizeof err) : NULL;
    gguf_close(g);
    if (!t) {
        fprintf(stderr, "bench_constrain: %s: %s\n", path, err);
        return 1;
    }
    double t0 = now_us();
    cons_vocab_t *v = cons_vocab_new(t, err, sizeof err);
    if (!v) {
        fprintf(stderr, "bench_constrain: %s\n", err);
        return 1;
    }
    printf("vocabulary %d tokens, trie %zu nodes, built in %.1f ms\n", cons_vocab_size(v),
           cons_vocab_nodes(v), (now_us() - t0) / 1e3);
    static const char *person =
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":{\"type\":\"object\","
        "\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
        "\"email\":{\"type\":[\"string\",\"null\"]},\"tags\":{\"type\":\"array\",\"items\":"
        "{\"type\":\"string\"},\"maxItems\":8},\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]}},"
        "\"required\":[\"name\",\"age\",\"email\",\"tags\",\"role\"],"
        "\"additionalProperties\":false}}}";
    static const char *person_doc =
        "{\"name\": \"Ada Lovelace, countess of Lovelace\", \"age\": 36, \"email\": null, "
        "\"tags\": [\"mathematics\", \"analytical engine\", \"poetical science\"], "
        "\"role\": \"admin\"}";
    static const char *obj = "{\"type\":\"json_object\"}";
    static const char *obj_doc =
        "{\"city\": \"Paris\", \"population\": 2102650, \"districts\": [1, 2, 3, 4], \"mayor\": "
        "{\"name\": \"Anne Hidalgo\", \"since\": 2014}, \"capital\": true, \"motto\": \"Fluctuat "
        "nec mergitur\"}";
    static const char *json_gbnf = /* any JSON object, as a grammar */
        "root   ::= ws object ws\n"
        "value  ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
        "object ::= \"{\" ws (member (\",\" ws member)*)? \"}\"\n"
        "member ::= string \":\" ws value ws\n"
        "array  ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n"
        "string ::= \"\\\"\" ([^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt])* \"\\\"\"\n"
        "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,14}) (\".\" [0-9]{1,15})?\n"
        "ws     ::= [ \\t\\n]{0,8}\n";
    int rc = run("schema", t, v, person, person_doc, rounds) ||
             run("json_object", t, v, obj, obj_doc, rounds) ||
             run("grammar", t, v, json_gbnf, obj_doc, rounds);
    cons_vocab_free(v);
    tok_close(t);
    return rc ? 1 : 0;
}
