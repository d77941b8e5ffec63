/* bench_constrain: cost of one constrained-decoding step (mask applied to the logits + advance),
 * walking a fixed document token by token over a vocabulary; prints µs per step (mean, p50, max).
 * Given a model (--model), also the engine's decode step at batch sizes on one thread, in the same
 * run, and the mask's share of a step: batch x mask / step. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/util.h"
#include "engine/constrain.h"
#include "engine/forward.h"
#include "engine/gguf.h"
#include "engine/kv.h"
#include "engine/model.h"

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
 * times; prints one line and sets *mean_us. */
static int run(const char *label, const tok_t *t, cons_vocab_t *v, const char *rf_text,
               const char *doc, int rounds, double *mean_us)
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
    /* SPM puts its space prefix on the first token ("▁{"), and no whitespace may come before the
     * document: then the document is the token "{" and the rest of it tokenized */
    int32_t ids[4096];
    char piece[64];
    int n = tok_encode(t, doc, strlen(doc), 0, 0, ids, 4096);
    if (n > 0 && tok_piece(t, ids[0], 0, piece, sizeof piece) > 0 && piece[0] == ' ') {
        for (ids[0] = 0; tok_piece(t, ids[0], 0, piece, sizeof piece) >= 0; ids[0]++)
            if (strcmp(piece, "{") == 0)
                break;
        n = 1 + tok_encode(t, doc + 1, strlen(doc + 1), 0, 0, ids + 1, 4095);
    }
    double *us = malloc((size_t)n * (size_t)rounds * sizeof *us);
    float *logits = malloc((size_t)cons_vocab_size(v) * sizeof *logits);
    size_t k = 0;
    int32_t allowed_sum = 0;
    for (int r = 0; r < rounds; r++) {
        cons_t *c = gr ? cons_new_grammar(gr, v) : cons_new(sc, v);
        for (int i = 0; i < n; i++) {
            for (int32_t j = 0; j < cons_vocab_size(v); j++)
                logits[j] = (float)(j & 7);
            double t0 = now_us();
            int32_t na = cons_mask_logits(c, logits); /* what the worker does per step */
            int ok = logits[ids[i]] == (float)(ids[i] & 7);
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
    *mean_us = sum / (double)k;
    free(us);
    free(logits);
    cons_schema_unref(sc);
    cons_grammar_unref(gr);
    return 0;
}

/* Every schema of a corpus file ({"schemas": [{"id", "schema"}]}) the compiler takes: a document
 * drawn over its masks (a fixed-seed walk over the allowed tokens, one-byte closers `"},]`
 * preferred 3 times in 4, at most 300 steps), timing the mask applied to the logits and the
 * advance per step. Prints the distribution of the schemas' mean µs/step and sets *median_us to
 * the median schema's. */
static int run_corpus(const char *path, const tok_t *t, cons_vocab_t *v, double *median_us)
{
    json_error_t je;
    json_t *all = json_load_file(path, 0, &je), *e;
    if (!all) {
        fprintf(stderr, "bench_constrain: %s: %s\n", path, je.text);
        return -1;
    }
    int32_t V = cons_vocab_size(v), closers[8], n_closers = 0;
    for (int32_t id = 0; id < V && n_closers < 8; id++) {
        char piece[8];
        if (tok_piece(t, id, 0, piece, sizeof piece) == 1 && strchr("\"},]", piece[0]))
            closers[n_closers++] = id;
    }
    float *logits = malloc((size_t)V * sizeof *logits);
    json_t *schemas = json_object_get(all, "schemas");
    double *means = malloc((json_array_size(schemas) + 1) * sizeof *means);
    size_t i, n = 0, refused = 0, steps = 0;
    uint64_t rng = 42;
    json_array_foreach (schemas, i, e) {
        char err[512];
        json_t *rf = json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name",
                               "c", "schema", json_object_get(e, "schema"));
        cons_schema_t *sc = rf ? cons_schema_compile(rf, NULL, err, sizeof err) : NULL;
        json_decref(rf);
        if (!sc) {
            refused++;
            continue;
        }
        cons_t *c = cons_new(sc, v);
        double sum = 0;
        int k = 0;
        for (; k < 300; k++) {
            for (int32_t j = 0; j < V; j++)
                logits[j] = 0;
            double t0 = now_us();
            int32_t na = cons_mask_logits(c, logits);
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int32_t pick = na ? (int32_t)((rng >> 33) % (uint64_t)na) : 0, id = -1;
            for (int32_t j = 0; (rng >> 20 & 3) && id < 0 && j < n_closers; j++)
                if (logits[closers[j]] == 0)
                    id = closers[j];
            for (int32_t j = 0; id < 0 && j < V; j++)
                if (logits[j] == 0 && pick-- == 0)
                    id = j;
            int done = na == 0 || cons_accept(c, id) != 0 || cons_complete(c);
            sum += now_us() - t0; /* the pick's scan included: an upper bound on the step */
            if (done)
                break;
        }
        cons_free(c);
        cons_schema_unref(sc);
        means[n++] = sum / (k + 1);
        steps += (size_t)k + 1;
    }
    qsort(means, n, sizeof *means, cmp_d);
    *median_us = n ? means[n / 2] : 0;
    printf("corpus %s: %zu schemas timed (%zu refused), %zu steps; mean us/step per schema: "
           "median %.1f, p90 %.1f, max %.1f\n",
           path, n, refused, steps, *median_us, n ? means[n * 9 / 10] : 0, n ? means[n - 1] : 0);
    free(means);
    free(logits);
    json_decref(all);
    return n ? 0 : -1;
}

/* The engine's decode step (ms) for batch sequences on one thread: 16 steps after a 16-token
 * prompt each, best of 3. */
static double decode_step_ms(model_t *m, int batch)
{
    char err[512];
    be_params_t bp = {.kind = BE_KIND_CPU, .threads = 1};
    backend_t *be = be_open(&bp, err, sizeof err);
    if (!be) {
        fprintf(stderr, "bench_constrain: %s\n", err);
        return -1;
    }
    enum {
        NP = 16,
        ND = 16
    };
    fwd_t *f = fwd_new(be);
    kv_seq_t *kv[64];
    fwd_seq_t sq[64];
    int32_t prompt[NP], tok[64];
    float *logits = malloc((size_t)batch * m->hp.n_vocab * sizeof *logits);
    for (int i = 0; i < NP; i++)
        prompt[i] = (int32_t)(1 + (i * 7919) % (m->hp.n_vocab - 1));
    for (int b = 0; b < batch; b++)
        kv[b] = kv_seq_new(&m->hp, NP + ND, KV_TYPE_F16);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        for (int b = 0; b < batch; b++) {
            kv_seq_reset(kv[b]);
            sq[b] = (fwd_seq_t){kv[b], prompt, NP, logits + (size_t)b * m->hp.n_vocab, NULL};
        }
        if (fwd_run(f, &m->hp, &m->w, sq, (uint32_t)batch, NULL, err, sizeof err))
            goto fail;
        double t0 = util_now_s();
        for (int i = 0; i < ND; i++) {
            for (int b = 0; b < batch; b++) {
                tok[b] = (int32_t)(1 + ((i + b) * 104729) % (m->hp.n_vocab - 1));
                sq[b].tokens = &tok[b];
                sq[b].n_tokens = 1;
            }
            if (fwd_run(f, &m->hp, &m->w, sq, (uint32_t)batch, NULL, err, sizeof err))
                goto fail;
        }
        double t = (util_now_s() - t0) / ND;
        best = t < best ? t : best;
    }
    goto done;
fail:
    fprintf(stderr, "bench_constrain: %s\n", err);
    best = -1e-3;
done:
    for (int b = 0; b < batch; b++)
        kv_seq_free(kv[b]);
    free(logits);
    fwd_free(f);
    be_close(be);
    return best * 1e3;
}

/* usage: bench_constrain [VOCAB.gguf [ROUNDS]] | --model MODEL.gguf [ROUNDS [BATCH...]] */
int main(int argc, char **argv)
{
    int model_mode = argc > 2 && !strcmp(argv[1], "--model");
    const char *path = model_mode ? argv[2]
                       : argc > 1 ? argv[1]
                                  : "tests/data/ggml-vocab-llama-spm.gguf";
    int a = model_mode ? 3 : 2;
    int rounds = argc > a ? atoi(argv[a]) : 5;
    char err[512];
    model_t *m = NULL;
    tok_t *own = NULL;
    const tok_t *t;
    if (model_mode) {
        m = model_open(path, err, sizeof err);
        t = m ? m->tok : NULL;
    } else {
        gguf_t *g = gguf_open(path, err, sizeof err);
        t = own = g ? tok_open(g, err, sizeof err) : NULL;
        gguf_close(g);
    }
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
    double us_schema = 0, us_obj = 0, us_gram = 0, us_corpus = 0;
    const char *corpus = getenv("BENCH_CORPUS"); /* the corpus's median schema, when given */
    int rc = run("schema", t, v, person, person_doc, rounds, &us_schema) ||
             run("json_object", t, v, obj, obj_doc, rounds, &us_obj) ||
             run("grammar", t, v, json_gbnf, obj_doc, rounds, &us_gram) ||
             (corpus && *corpus && run_corpus(corpus, t, v, &us_corpus));
    for (int i = a + 1; model_mode && !rc && i < argc; i++) {
        int batch = atoi(argv[i]);
        if (batch < 1 || batch > 64) {
            fprintf(stderr, "bench_constrain: batch %s: 1..64\n", argv[i]);
            rc = 1;
            break;
        }
        double ms = decode_step_ms(m, batch);
        if (ms < 0) {
            rc = 1;
            break;
        }
        printf("decode batch %2d, 1 thread: %.2f ms/step; mask+advance share: schema %.2f%%, "
               "json_object %.2f%%, corpus median schema %.2f%%\n",
               batch, ms, 100.0 * batch * us_schema / 1e3 / ms, 100.0 * batch * us_obj / 1e3 / ms,
               100.0 * batch * us_corpus / 1e3 / ms);
    }
    cons_vocab_free(v);
    tok_close(own);
    model_close(m);
    return rc ? 1 : 0;
}
