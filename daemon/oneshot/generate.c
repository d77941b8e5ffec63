/* generate: the one-shot `gpuswapd generate` mode, for trying a model before it goes into a config. */
#include "generate.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/kv.h"
#include "engine/lora.h"
#include "engine/model.h"
#include "kernels/quant.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "base/num.h"
#include "base/util.h"

typedef struct gen_opts {
    const char *model;
    const char *prompt;
    const char *prompt_ids;
    const char *dump_logits;
    const char *lora; /* --lora: an adapter beside the model, or NULL */
    float lora_scale; /* --lora-scale (default 1) */
    long n_predict;
    long threads;
    long n_ctx;
    int no_bos, json, ignore_eos, special, quiet;
    quant_isa_t isa;
    quant_path_t path;
    kv_type_t kv_type;
    long prefill_chunk;
    sampler_params_t sp;
    int seed_given;
} gen_opts_t;

/* name with '-' for '_' (the option spelling of a sampler_params.h row). */
static void gen_opt_name(const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s", name);
    for (char *c = out; *c; c++)
        if (*c == '_')
            *c = '-';
}

static void usage(FILE *f)
{
    fputs("usage: gpuswapd generate --model FILE [--prompt TEXT | --prompt-ids 1,2,3] [options]\n"
          "  -m, --model FILE        GGUF model to run\n"
          "  -p, --prompt TEXT       prompt text (BOS added when the vocabulary wants it)\n"
          "      --prompt-ids LIST   prompt as comma-separated token ids (no BOS added)\n"
          "      --lora FILE         a LoRA adapter (GGUF) for the model, applied beside it\n"
          "      --lora-scale S      its scale (default 1; llama.cpp's --lora-scaled)\n"
          "  -n, --n-predict N       tokens to generate (default 64)\n",
          f);
    /* the sampling options, from sampler_params.h */
    for (int i = 0; i < SAMPLER_PARAM_COUNT; i++) {
        const sampler_param_desc_t *d = &sampler_param_descs[i];
        char opt[64], range[64];
        gen_opt_name(d->name, opt, sizeof opt);
        fprintf(f, "      --%-17s %s%s\n", opt, i == SAMPLER_PARAM_temperature ? " (--temp)" : "",
                d->help);
        fprintf(f, "                          in %s (default %s)\n",
                sampler_param_range_text(d, range, sizeof range), d->def_text);
    }
    fputs("      --repeat-last-n N   (default 64)\n"
          "  -s, --seed S            sampling seed (default: from the clock)\n"
          "  -t, --threads N         CPU threads (default: all cores)\n"
          "  -c, --ctx N             context size (default: the model's, at most 4096)\n"
          "      --no-bos            do not add BOS to the prompt\n"
          "      --ignore-eos        keep generating after an end-of-generation token\n"
          "      --special           print special tokens' text\n"
          "      --isa auto|avx512|vnni|avx2|portable  CPU kernels (default auto)\n"
          "      --exact             F32 activations for quantized weights (the reference\n"
          "                          path; default: activations quantized to 8 bits)\n"
          "      --kv-type f16|f32   KV cache element type (default f16)\n"
          "      --prefill-chunk N   tokens per pass over the layers (default 512; 0 = all)\n"
          "      --json              print one JSON object {prompt_ids, ids, text, timing}\n"
          "                          (and expert_reads for a mixture of experts)\n"
          "      --dump-logits FILE  write the logits of every step, one line per step\n"
          "  -q, --quiet             no timing line on stderr\n",
          f);
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    int64_t v;
    if (num_i64_in(s, lo, hi, &v))
        return -1;
    *out = (long)v;
    return 0;
}

static int parse_float(const char *s, float *out)
{
    double v;
    if (num_double(s, true, &v))
        return -1;
    *out = (float)v;
    return 0;
}

/* ------------------------------------------------------------------ arguments */

/* The long options' codes beyond the short ones. */
enum {
    O_RLN = 256,
    O_NOBOS,
    O_JSON,
    O_DUMP,
    O_IDS,
    O_IGNEOS,
    O_SPECIAL,
    O_ISA,
    O_EXACT,
    O_KVTYPE,
    O_CHUNK,
    O_LORA,
    O_LORA_SCALE,
    O_SAMPLER = 512 /* + sampler_param_id_t */
};

/* What an option's handler answers besides 0. */
enum {
    GEN_OPT_HELP = 1,     /* --help: usage printed on stdout */
    GEN_OPT_UNKNOWN = -1, /* an option getopt refused: usage printed on stderr */
    GEN_OPT_BAD = -2,     /* a bad value */
};

static const struct option gen_fixed_opts[] = {
    {"model", required_argument, 0, 'm'},
    {"prompt", required_argument, 0, 'p'},
    {"n-predict", required_argument, 0, 'n'},
    {"seed", required_argument, 0, 's'},
    {"threads", required_argument, 0, 't'},
    {"ctx", required_argument, 0, 'c'},
    {"temp", required_argument, 0, O_SAMPLER + SAMPLER_PARAM_temperature},
    {"repeat-last-n", required_argument, 0, O_RLN},
    {"no-bos", no_argument, 0, O_NOBOS},
    {"json", no_argument, 0, O_JSON},
    {"dump-logits", required_argument, 0, O_DUMP},
    {"prompt-ids", required_argument, 0, O_IDS},
    {"ignore-eos", no_argument, 0, O_IGNEOS},
    {"special", no_argument, 0, O_SPECIAL},
    {"isa", required_argument, 0, O_ISA},
    {"quiet", no_argument, 0, 'q'},
    {"exact", no_argument, 0, O_EXACT},
    {"kv-type", required_argument, 0, O_KVTYPE},
    {"prefill-chunk", required_argument, 0, O_CHUNK},
    {"lora", required_argument, 0, O_LORA},
    {"lora-scale", required_argument, 0, O_LORA_SCALE},
    {"help", no_argument, 0, 'h'},
};

enum {
    N_FIXED = sizeof gen_fixed_opts / sizeof gen_fixed_opts[0]
};

/* The getopt table: the fixed options, then one per sampler_params.h row. */
static void gen_opts_table(struct option lo[N_FIXED + SAMPLER_PARAM_COUNT + 1])
{
    static char names[SAMPLER_PARAM_COUNT][32];
    memcpy(lo, gen_fixed_opts, sizeof gen_fixed_opts);
    for (int i = 0; i < SAMPLER_PARAM_COUNT; i++) {
        gen_opt_name(sampler_param_descs[i].name, names[i], sizeof names[i]);
        lo[N_FIXED + i] = (struct option){names[i], required_argument, 0, O_SAMPLER + i};
    }
    lo[N_FIXED + SAMPLER_PARAM_COUNT] = (struct option){0, 0, 0, 0};
}

/* A sampling option's value (the sampler checks values: it takes a wider range than requests). */
static int gen_opt_sampler(gen_opts_t *o, int id)
{
    long v;
    float f;
    switch (id) {
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    case SAMPLER_PARAM_##name:                                                                     \
        if (SAMPLER_KIND_##kind == SAMPLER_KIND_I32 ? parse_long(optarg, INT32_MIN, INT32_MAX, &v) \
                                                    : parse_float(optarg, &f))                     \
            return GEN_OPT_BAD;                                                                    \
        o->sp.name = SAMPLER_KIND_##kind == SAMPLER_KIND_I32 ? (ctype)v : (ctype)f;                \
        break;
        SAMPLER_PARAMS(X)
#undef X
    }
    return 0;
}

static int gen_opt_seed(gen_opts_t *o)
{
    uint64_t s;
    if (num_u64(optarg, &s))
        return GEN_OPT_BAD;
    o->sp.seed = s;
    o->seed_given = 1;
    return 0;
}

static int gen_opt_isa(gen_opts_t *o)
{
    return quant_isa_parse(optarg, &o->isa) ? GEN_OPT_BAD : 0;
}

/* Option c other than a sampling one, its value in optarg: 0 or a GEN_OPT_* answer. */
static int gen_opt_apply(gen_opts_t *o, int c)
{
    long v;
    switch (c) {
    case 'm': o->model = optarg; break;
    case 'p': o->prompt = optarg; break;
    case 'n': return parse_long(optarg, 0, 1 << 24, &o->n_predict) ? GEN_OPT_BAD : 0;
    case 's': return gen_opt_seed(o);
    case 't': return parse_long(optarg, 1, 256, &o->threads) ? GEN_OPT_BAD : 0;
    case 'c': return parse_long(optarg, 1, 1 << 24, &o->n_ctx) ? GEN_OPT_BAD : 0;
    case O_RLN:
        if (parse_long(optarg, 0, 1 << 20, &v))
            return GEN_OPT_BAD;
        o->sp.repeat_last_n = (int32_t)v;
        break;
    case O_NOBOS: o->no_bos = 1; break;
    case O_JSON: o->json = 1; break;
    case O_DUMP: o->dump_logits = optarg; break;
    case O_IDS: o->prompt_ids = optarg; break;
    case O_IGNEOS: o->ignore_eos = 1; break;
    case O_SPECIAL: o->special = 1; break;
    case O_EXACT: o->path = QUANT_PATH_EXACT; break;
    case O_KVTYPE:
        if (strcmp(optarg, "f16") == 0)
            o->kv_type = KV_TYPE_F16;
        else if (strcmp(optarg, "f32") == 0)
            o->kv_type = KV_TYPE_F32;
        else
            return GEN_OPT_BAD;
        break;
    case O_CHUNK: return parse_long(optarg, 0, 1 << 24, &o->prefill_chunk) ? GEN_OPT_BAD : 0;
    case O_LORA: o->lora = optarg; break;
    case O_LORA_SCALE: return parse_float(optarg, &o->lora_scale) ? GEN_OPT_BAD : 0;
    case O_ISA: return gen_opt_isa(o);
    case 'q': o->quiet = 1; break;
    case 'h': usage(stdout); return GEN_OPT_HELP;
    default: usage(stderr); return GEN_OPT_UNKNOWN;
    }
    return 0;
}

/* What the options need together, once all are read: 0 or -1 (said on stderr). */
static int gen_opts_check(int argc, char **argv, gen_opts_t *o)
{
    if (optind < argc) {
        fprintf(stderr, "gpuswapd generate: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->model) {
        fprintf(stderr, "gpuswapd generate: --model FILE is required\n");
        usage(stderr);
        return -1;
    }
    if (o->prompt && o->prompt_ids) {
        fprintf(stderr, "gpuswapd generate: give --prompt or --prompt-ids, not both\n");
        return -1;
    }
    if (!o->seed_given)
        o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    return 0;
}

/* 0: run; 1: --help printed; -1: a usage error (said on stderr). */
static int parse_args(int argc, char **argv, gen_opts_t *o)
{
    struct option lo[N_FIXED + SAMPLER_PARAM_COUNT + 1];
    gen_opts_table(lo);
    memset(o, 0, sizeof *o);
    o->n_predict = 64;
    o->prefill_chunk = FWD_CHUNK_DEFAULT;
    o->lora_scale = 1.0f;
    o->isa = QUANT_ISA_AUTO;
    sampler_params_default(&o->sp);
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:p:n:s:t:c:qh", lo, NULL)) != -1) {
        int rc = c >= O_SAMPLER && c < O_SAMPLER + SAMPLER_PARAM_COUNT
                     ? gen_opt_sampler(o, c - O_SAMPLER)
                     : gen_opt_apply(o, c);
        if (rc == GEN_OPT_BAD) {
            fprintf(stderr, "gpuswapd generate: invalid value '%s' for option %s\n", optarg,
                    argv[optind - 1]);
            return -1;
        }
        if (rc)
            return rc;
    }
    return gen_opts_check(argc, argv, o);
}

/* Parses "1,2,3" into a malloc'ed array; -1 on a bad list. */
static int parse_ids(const char *s, int32_t n_vocab, int32_t **out, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return -1;
    for (const char *p = s; *p;) {
        char item[24];
        size_t len = strcspn(p, ",");
        int64_t v = -1;
        if (len < sizeof item) {
            memcpy(item, p, len);
            item[len] = 0;
        }
        if (len >= sizeof item || num_i64_in(item, 0, (int64_t)n_vocab - 1, &v)) {
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *nids = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!nids) {
                free(ids);
                return -1;
            }
            ids = nids;
        }
        ids[k++] = (int32_t)v;
        p += len + (p[len] == ',');
    }
    *out = ids;
    *n = k;
    return 0;
}

static int write_logits(FILE *f, const float *l, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        fprintf(f, i ? " %.9g" : "%.9g", (double)l[i]);
    return fputc('\n', f) == EOF ? -1 : 0;
}

/* ------------------------------------------------------------------ the run */

/* One generate run: what its phases share, freed by gen_run_free. */
typedef struct gen_run {
    gen_opts_t o;
    char err[512];
    model_t *m;
    lora_t *lora; /* --lora, or NULL */
    backend_t *be;
    fwd_t *fw;
    kv_seq_t *kv;
    sampler_t *smp;
    int32_t *prompt; /* (n_prompt) */
    size_t n_prompt;
    uint32_t n_ctx;
    int32_t *out_ids; /* (n_predict + 1) the generated ids */
    long n_gen;       /* ids generated */
    const char *finish;
    float *logits, *scratch; /* (n_vocab) */
    FILE *dump;              /* --dump-logits, or NULL */
    char *text;              /* --json: the generated text, NUL-terminated (text_len) */
    size_t text_len, text_cap;
    double t_load, t_prompt, t_gen; /* ms */
} gen_run_t;

static int gen_oom(void)
{
    fprintf(stderr, "gpuswapd generate: out of memory\n");
    return -1;
}

/* The prompt's ids: --prompt-ids, or --prompt tokenized. 0 or -1 (said on stderr). */
static int gen_prompt(gen_run_t *g)
{
    const model_t *m = g->m;
    if (g->o.prompt_ids) {
        if (parse_ids(g->o.prompt_ids, (int32_t)m->hp.n_vocab, &g->prompt, &g->n_prompt) ||
            !g->n_prompt) {
            fprintf(stderr, "gpuswapd generate: --prompt-ids: need comma-separated ids below %u\n",
                    m->hp.n_vocab);
            return -1;
        }
        return 0;
    }
    const char *p = g->o.prompt ? g->o.prompt : "";
    int add_bos = tok_add_bos(m->tok) && !g->o.no_bos;
    size_t cap = strlen(p) + 8;
    g->prompt = malloc(cap * sizeof *g->prompt);
    if (!g->prompt)
        return gen_oom();
    int n = tok_encode(m->tok, p, strlen(p), add_bos, 1, g->prompt, cap);
    if (n < 0) {
        fprintf(stderr, "gpuswapd generate: cannot tokenize the prompt (error %d)\n", n);
        return -1;
    }
    g->n_prompt = (size_t)n;
    if (g->n_prompt == 0) {
        fprintf(stderr, "gpuswapd generate: the prompt is empty and the model has no BOS\n");
        return -1;
    }
    return 0;
}

/* The context, the CPU backend, the forward pass, the KV cache, the sampler (fed the prompt),
 * the buffers and the dump file. 0 or -1 (said on stderr). */
static int gen_setup(gen_run_t *g)
{
    model_t *m = g->m;
    const gen_opts_t *o = &g->o;
    g->n_ctx =
        o->n_ctx ? (uint32_t)o->n_ctx : (m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    if (g->n_prompt + (size_t)o->n_predict > g->n_ctx) {
        fprintf(stderr,
                "gpuswapd generate: %zu prompt + %ld new tokens exceed the context of %u "
                "(use --ctx or a smaller -n)\n",
                g->n_prompt, o->n_predict, g->n_ctx);
        return -1;
    }
    model_set_context(m, g->n_ctx);
    be_params_t bp = {.kind = BE_KIND_CPU, .threads = (int)o->threads};
    g->be = be_open(&bp, g->err, sizeof g->err);
    if (!g->be) {
        fprintf(stderr, "gpuswapd generate: %s\n", g->err);
        return -1;
    }
    if (model_feats_check(&m->hp, g->be->model_feats, g->be->name, g->err, sizeof g->err)) {
        fprintf(stderr, "gpuswapd generate: %s\n", g->err);
        return -1;
    }
    g->fw = fwd_new(g->be);
    if (g->fw)
        fwd_set_chunk(g->fw, (uint32_t)o->prefill_chunk);
    g->kv = kv_seq_new(&m->hp, g->n_ctx, o->kv_type);
    g->smp = sampler_new(&o->sp, (int32_t)m->hp.n_vocab, g->err, sizeof g->err);
    g->logits = malloc(m->hp.n_vocab * sizeof(float));
    g->scratch = malloc(m->hp.n_vocab * sizeof(float));
    g->out_ids = malloc(((size_t)o->n_predict + 1) * sizeof *g->out_ids);
    if (!g->smp) {
        fprintf(stderr, "gpuswapd generate: %s\n", g->err);
        return -1;
    }
    if (!g->fw || !g->kv || !g->logits || !g->scratch || !g->out_ids)
        return gen_oom();
    if (o->dump_logits && !(g->dump = fopen(o->dump_logits, "w"))) {
        fprintf(stderr, "gpuswapd generate: %s: %s\n", o->dump_logits, strerror(errno));
        return -1;
    }
    for (size_t i = 0; i < g->n_prompt; i++)
        sampler_accept(g->smp, g->prompt[i]);
    return 0;
}

/* A piece of generated text: printed at once, or kept for --json. 0 or -1 (out of memory). */
static int gen_emit(gen_run_t *g, const char *piece, size_t np)
{
    if (!g->o.json) {
        fwrite(piece, 1, np, stdout);
        fflush(stdout);
        return 0;
    }
    if (g->text_len + np + 1 > g->text_cap) {
        size_t nc = (g->text_cap + np + 1) * 2;
        char *nt = realloc(g->text, nc);
        if (!nt)
            return gen_oom();
        g->text = nt;
        g->text_cap = nc;
    }
    memcpy(g->text + g->text_len, piece, np);
    g->text_len += np;
    g->text[g->text_len] = 0;
    return 0;
}

/* Samples up to n_predict tokens after the prompt's logits, emitting their text (ts) and
 * running a pass for each but the last. 0 or -1 (said on stderr). */
static int gen_sample_loop(gen_run_t *g, fwd_seq_t *sq, tok_stream_t *ts)
{
    model_t *m = g->m;
    char piece[512];
    g->finish = "length";
    for (g->n_gen = 0; g->n_gen < g->o.n_predict; g->n_gen++) {
        if (g->dump && write_logits(g->dump, g->logits, m->hp.n_vocab)) {
            fprintf(stderr, "gpuswapd generate: writing %s failed\n", g->o.dump_logits);
            return -1;
        }
        memcpy(g->scratch, g->logits, m->hp.n_vocab * sizeof(float));
        int32_t id = sampler_sample(g->smp, g->scratch);
        g->out_ids[g->n_gen] = id;
        int eog = tok_is_eog(m->tok, id);
        int np = tok_stream_feed(ts, id, piece, sizeof piece);
        if (np > 0 && gen_emit(g, piece, (size_t)np))
            return -1;
        if (eog && !g->o.ignore_eos) {
            g->n_gen++;
            g->finish = "eos";
            break;
        }
        if (g->n_gen + 1 == g->o.n_predict)
            continue; /* no need to compute logits nobody reads */
        sq->tokens = &g->out_ids[g->n_gen];
        sq->n_tokens = 1;
        if (fwd_run(g->fw, &m->hp, &m->w, sq, 1, NULL, g->err, sizeof g->err)) {
            fprintf(stderr, "gpuswapd generate: %s\n", g->err);
            return -1;
        }
    }
    return 0;
}

/* The prompt's pass, then the tokens, timed; the decoder's last bytes flushed. 0 or -1. */
static int gen_decode(gen_run_t *g)
{
    model_t *m = g->m;
    tok_stream_t ts;
    tok_stream_init(&ts, m->tok, g->o.special);
    char piece[512];
    fwd_seq_t sq = {.kv = g->kv,
                    .tokens = g->prompt,
                    .n_tokens = (uint32_t)g->n_prompt,
                    .logits = g->logits,
                    .lora = g->lora ? &g->lora->w : NULL};
    double t1 = util_now_ms();
    if (fwd_run(g->fw, &m->hp, &m->w, &sq, 1, NULL, g->err, sizeof g->err)) {
        fprintf(stderr, "gpuswapd generate: %s\n", g->err);
        return -1;
    }
    g->t_prompt = util_now_ms() - t1;
    double t2 = util_now_ms();
    if (gen_sample_loop(g, &sq, &ts))
        return -1;
    int np = tok_stream_flush(&ts, piece, sizeof piece);
    g->t_gen = util_now_ms() - t2;
    if (np > 0 && !g->o.json)
        fwrite(piece, 1, (size_t)np, stdout);
    if (g->o.json && np > 0) {
        char *nt = realloc(g->text, g->text_len + (size_t)np + 1);
        if (!nt)
            return gen_oom();
        g->text = nt;
        memcpy(g->text + g->text_len, piece, (size_t)np);
        g->text_len += (size_t)np;
        g->text[g->text_len] = 0;
    }
    return 0;
}

/* --json: one object {prompt_ids, ids, text, finish_reason, timing} (and expert_reads for a
 * mixture of experts). 0 or -1 (out of memory). */
static int gen_print_json(const gen_run_t *g)
{
    json_t *jp = json_array(), *jids = json_array();
    for (size_t i = 0; i < g->n_prompt; i++)
        json_array_append_new(jp, json_integer(g->prompt[i]));
    for (long i = 0; i < g->n_gen; i++)
        json_array_append_new(jids, json_integer(g->out_ids[i]));
    json_t *root =
        json_pack("{s:o, s:O, s:s%, s:s, s:{s:f, s:f, s:f}}", "prompt_ids", jp, "ids", jids, "text",
                  g->text ? g->text : "", g->text_len, "finish_reason", g->finish, "timing",
                  "load_ms", g->t_load, "prompt_ms", g->t_prompt, "gen_ms", g->t_gen);
    json_decref(jids);
    if (!root)
        return gen_oom();
    /* a mixture of experts: expert matrices read over the run (each selected expert once a pass) */
    if (g->fw && fwd_experts_used(g->fw) &&
        json_object_set_new(root, "expert_reads",
                            json_integer((json_int_t)fwd_expert_reads(g->fw)))) {
        json_decref(root);
        return gen_oom();
    }
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!s)
        return gen_oom();
    puts(s);
    free(s);
    return 0;
}

/* The answer's end (the JSON object, or a newline) and the timing line on stderr. */
static int gen_report(const gen_run_t *g)
{
    const model_t *m = g->m;
    const gen_opts_t *o = &g->o;
    if (o->json) {
        if (gen_print_json(g))
            return -1;
    } else {
        putchar('\n');
    }
    if (!o->quiet)
        fprintf(stderr,
                "gpuswapd generate: %s %s, %u threads, %s kernels; prompt %zu tokens in %.1f ms "
                "(%.1f tok/s); generated %ld tokens in %.1f ms (%.1f tok/s)\n",
                model_arch_name(m->hp.arch), gguf_ttype_name(m->wtype),
                o->threads ? (int)o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN),
                quant_isa_name(quant_isa_get()), g->n_prompt, g->t_prompt,
                g->t_prompt > 0 ? g->n_prompt * 1e3 / g->t_prompt : 0.0, g->n_gen, g->t_gen,
                g->t_gen > 0 ? g->n_gen * 1e3 / g->t_gen : 0.0);
    return 0;
}

/* Frees what the run holds; closes the dump file, which turns a success into a failure
 * (status 1) when that fails. Returns the status. */
static int gen_run_free(gen_run_t *g, int status)
{
    if (g->dump && fclose(g->dump) != 0 && status == 0) {
        fprintf(stderr, "gpuswapd generate: writing %s failed\n", g->o.dump_logits);
        status = 1;
    }
    free(g->text);
    free(g->prompt);
    free(g->out_ids);
    free(g->logits);
    free(g->scratch);
    sampler_free(g->smp);
    kv_seq_free(g->kv);
    fwd_free(g->fw);
    be_close(g->be);
    lora_close(g->lora);
    model_close(g->m);
    return status;
}

int gen_main(int argc, char **argv)
{
    gen_run_t g = {0};
    int rc = parse_args(argc, argv, &g.o);
    if (rc)
        return rc > 0 ? 0 : 2;
    const char *env_isa = getenv("GPUSWAPD_ISA");
    if (g.o.isa != QUANT_ISA_AUTO || !env_isa || !*env_isa) /* else the daemon's main set it */
        quant_isa_set(g.o.isa);
    quant_path_set(g.o.path);

    double t0 = util_now_ms();
    g.m = model_open(g.o.model, g.err, sizeof g.err);
    if (!g.m) {
        fprintf(stderr, "gpuswapd generate: %s\n", g.err);
        return gen_run_free(&g, 1);
    }
    if (g.o.lora &&
        !(g.lora = lora_open(g.o.lora, g.m, g.o.lora_scale, NULL, g.err, sizeof g.err))) {
        fprintf(stderr, "gpuswapd generate: %s\n", g.err);
        return gen_run_free(&g, 1);
    }
    g.t_load = util_now_ms() - t0;
    if (gen_prompt(&g) || gen_setup(&g) || gen_decode(&g) || gen_report(&g))
        return gen_run_free(&g, 1);
    return gen_run_free(&g, 0);
}
