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
#include "engine/model.h"
#include "kernels/quant.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "base/util.h"

typedef struct gen_opts {
    const char *model;
    const char *prompt;
    const char *prompt_ids;
    const char *dump_logits;
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
          "      --dump-logits FILE  write the logits of every step, one line per step\n"
          "  -q, --quiet             no timing line on stderr\n",
          f);
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, gen_opts_t *o)
{
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
        O_SAMPLER = 512 /* + sampler_param_id_t */
    };
    static const struct option fixed[] = {
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
        {"help", no_argument, 0, 'h'},
    };
    enum {
        N_FIXED = sizeof fixed / sizeof fixed[0]
    };
    static char names[SAMPLER_PARAM_COUNT][32];
    struct option lo[N_FIXED + SAMPLER_PARAM_COUNT + 1];
    memcpy(lo, fixed, sizeof fixed);
    for (int i = 0; i < SAMPLER_PARAM_COUNT; i++) {
        gen_opt_name(sampler_param_descs[i].name, names[i], sizeof names[i]);
        lo[N_FIXED + i] = (struct option){names[i], required_argument, 0, O_SAMPLER + i};
    }
    lo[N_FIXED + SAMPLER_PARAM_COUNT] = (struct option){0, 0, 0, 0};
    memset(o, 0, sizeof *o);
    o->n_predict = 64;
    o->prefill_chunk = FWD_CHUNK_DEFAULT;
    o->isa = QUANT_ISA_AUTO;
    sampler_params_default(&o->sp);
    optind = 1;
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "m:p:n:s:t:c:qh", lo, NULL)) != -1) {
        if (c >= O_SAMPLER && c < O_SAMPLER + SAMPLER_PARAM_COUNT) {
            /* the sampler checks values (it takes a wider range than requests) */
            float f;
            switch (c - O_SAMPLER) {
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    case SAMPLER_PARAM_##name:                                                                     \
        if (SAMPLER_KIND_##kind == SAMPLER_KIND_I32 ? parse_long(optarg, INT32_MIN, INT32_MAX, &v) \
                                                    : parse_float(optarg, &f))                     \
            goto bad;                                                                              \
        o->sp.name = SAMPLER_KIND_##kind == SAMPLER_KIND_I32 ? (ctype)v : (ctype)f;                \
        break;
                SAMPLER_PARAMS(X)
#undef X
            }
            continue;
        }
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n':
            if (parse_long(optarg, 0, 1 << 24, &o->n_predict))
                goto bad;
            break;
        case 's': {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end)
                goto bad;
            o->sp.seed = s;
            o->seed_given = 1;
            break;
        }
        case 't':
            if (parse_long(optarg, 1, 256, &o->threads))
                goto bad;
            break;
        case 'c':
            if (parse_long(optarg, 1, 1 << 24, &o->n_ctx))
                goto bad;
            break;
        case O_RLN:
            if (parse_long(optarg, 0, 1 << 20, &v))
                goto bad;
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
                goto bad;
            break;
        case O_CHUNK:
            if (parse_long(optarg, 0, 1 << 24, &o->prefill_chunk))
                goto bad;
            break;
        case O_ISA:
            if (strcmp(optarg, "auto") == 0)
                o->isa = QUANT_ISA_AUTO;
            else if (strcmp(optarg, "avx2") == 0)
                o->isa = QUANT_ISA_AVX2;
            else if (strcmp(optarg, "avx512") == 0)
                o->isa = QUANT_ISA_AVX512;
            else if (strcmp(optarg, "vnni") == 0)
                o->isa = QUANT_ISA_AVX2_VNNI;
            else if (strcmp(optarg, "portable") == 0)
                o->isa = QUANT_ISA_PORTABLE;
            else
                goto bad;
            break;
        case 'q': o->quiet = 1; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
        continue;
    bad:
        fprintf(stderr, "gpuswapd generate: invalid value '%s' for option %s\n", optarg,
                argv[optind - 1]);
        return -1;
    }
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

/* Parses "1,2,3" into a malloc'ed array; -1 on a bad list. */
static int parse_ids(const char *s, int32_t n_vocab, int32_t **out, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v >= n_vocab || (*end && *end != ',')) {
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
        p = *end ? end + 1 : end;
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

int gen_main(int argc, char **argv)
{
    gen_opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc > 0 ? 0 : 2;
    quant_isa_set(o.isa);
    quant_path_set(o.path);

    char err[512];
    int status = 1;
    model_t *m = NULL;
    backend_t *be = NULL;
    fwd_t *fw = NULL;
    kv_seq_t *kv = NULL;
    sampler_t *smp = NULL;
    int32_t *prompt = NULL, *out_ids = NULL;
    float *logits = NULL, *scratch = NULL;
    FILE *dump = NULL;
    json_t *jids = NULL;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;

    double t0 = util_now_ms();
    m = model_open(o.model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "gpuswapd generate: %s\n", err);
        goto done;
    }
    double t_load = util_now_ms() - t0;
    size_t n_prompt = 0;
    if (o.prompt_ids) {
        if (parse_ids(o.prompt_ids, (int32_t)m->hp.n_vocab, &prompt, &n_prompt) || !n_prompt) {
            fprintf(stderr, "gpuswapd generate: --prompt-ids: need comma-separated ids below %u\n",
                    m->hp.n_vocab);
            goto done;
        }
    } else {
        const char *p = o.prompt ? o.prompt : "";
        int add_bos = tok_add_bos(m->tok) && !o.no_bos;
        size_t cap = strlen(p) + 8;
        prompt = malloc(cap * sizeof *prompt);
        if (!prompt)
            goto oom;
        int n = tok_encode(m->tok, p, strlen(p), add_bos, 1, prompt, cap);
        if (n < 0) {
            fprintf(stderr, "gpuswapd generate: cannot tokenize the prompt (error %d)\n", n);
            goto done;
        }
        n_prompt = (size_t)n;
        if (n_prompt == 0) {
            fprintf(stderr, "gpuswapd generate: the prompt is empty and the model has no BOS\n");
            goto done;
        }
    }
    uint32_t n_ctx =
        o.n_ctx ? (uint32_t)o.n_ctx : (m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    if (n_prompt + (size_t)o.n_predict > n_ctx) {
        fprintf(stderr,
                "gpuswapd generate: %zu prompt + %ld new tokens exceed the context of %u "
                "(use --ctx or a smaller -n)\n",
                n_prompt, o.n_predict, n_ctx);
        goto done;
    }
    model_set_context(m, n_ctx);
    be_params_t bp = {.kind = BE_KIND_CPU, .threads = (int)o.threads};
    be = be_open(&bp, err, sizeof err);
    if (!be) {
        fprintf(stderr, "gpuswapd generate: %s\n", err);
        goto done;
    }
    if (model_feats_check(&m->hp, be->model_feats, be->name, err, sizeof err)) {
        fprintf(stderr, "gpuswapd generate: %s\n", err);
        goto done;
    }
    fw = fwd_new(be);
    if (fw)
        fwd_set_chunk(fw, (uint32_t)o.prefill_chunk);
    kv = kv_seq_new(&m->hp, n_ctx, o.kv_type);
    smp = sampler_new(&o.sp, (int32_t)m->hp.n_vocab, err, sizeof err);
    logits = malloc(m->hp.n_vocab * sizeof(float));
    scratch = malloc(m->hp.n_vocab * sizeof(float));
    out_ids = malloc(((size_t)o.n_predict + 1) * sizeof *out_ids);
    if (!smp) {
        fprintf(stderr, "gpuswapd generate: %s\n", err);
        goto done;
    }
    if (!fw || !kv || !logits || !scratch || !out_ids)
        goto oom;
    if (o.dump_logits && !(dump = fopen(o.dump_logits, "w"))) {
        fprintf(stderr, "gpuswapd generate: %s: %s\n", o.dump_logits, strerror(errno));
        goto done;
    }
    for (size_t i = 0; i < n_prompt; i++)
        sampler_accept(smp, prompt[i]);

    tok_stream_t ts;
    tok_stream_init(&ts, m->tok, o.special);
    char piece[512];
    fwd_seq_t sq = {.kv = kv, .tokens = prompt, .n_tokens = (uint32_t)n_prompt, .logits = logits};
    double t1 = util_now_ms();
    if (fwd_run(fw, &m->hp, &m->w, &sq, 1, NULL, err, sizeof err)) {
        fprintf(stderr, "gpuswapd generate: %s\n", err);
        goto done;
    }
    double t_prompt = util_now_ms() - t1, t2 = util_now_ms();
    long n_gen = 0;
    const char *finish = "length";
    for (; n_gen < o.n_predict; n_gen++) {
        if (dump && write_logits(dump, logits, m->hp.n_vocab)) {
            fprintf(stderr, "gpuswapd generate: writing %s failed\n", o.dump_logits);
            goto done;
        }
        memcpy(scratch, logits, m->hp.n_vocab * sizeof(float));
        int32_t id = sampler_sample(smp, scratch);
        out_ids[n_gen] = id;
        int eog = tok_is_eog(m->tok, id);
        int np = tok_stream_feed(&ts, id, piece, sizeof piece);
        if (np > 0) {
            if (o.json) {
                if (text_len + (size_t)np + 1 > text_cap) {
                    size_t nc = (text_cap + (size_t)np + 1) * 2;
                    char *nt = realloc(text, nc);
                    if (!nt)
                        goto oom;
                    text = nt;
                    text_cap = nc;
                }
                memcpy(text + text_len, piece, (size_t)np);
                text_len += (size_t)np;
                text[text_len] = 0;
            } else {
                fwrite(piece, 1, (size_t)np, stdout);
                fflush(stdout);
            }
        }
        if (eog && !o.ignore_eos) {
            n_gen++;
            finish = "eos";
            break;
        }
        if (n_gen + 1 == o.n_predict)
            continue; /* no need to compute logits nobody reads */
        sq.tokens = &out_ids[n_gen];
        sq.n_tokens = 1;
        if (fwd_run(fw, &m->hp, &m->w, &sq, 1, NULL, err, sizeof err)) {
            fprintf(stderr, "gpuswapd generate: %s\n", err);
            goto done;
        }
    }
    int np = tok_stream_flush(&ts, piece, sizeof piece);
    double t_gen = util_now_ms() - t2;
    if (np > 0 && !o.json)
        fwrite(piece, 1, (size_t)np, stdout);
    if (o.json) {
        if (np > 0) {
            char *nt = realloc(text, text_len + (size_t)np + 1);
            if (!nt)
                goto oom;
            text = nt;
            memcpy(text + text_len, piece, (size_t)np);
            text_len += (size_t)np;
            text[text_len] = 0;
        }
        json_t *jp = json_array();
        jids = json_array();
        for (size_t i = 0; i < n_prompt; i++)
            json_array_append_new(jp, json_integer(prompt[i]));
        for (long i = 0; i < n_gen; i++)
            json_array_append_new(jids, json_integer(out_ids[i]));
        json_t *root =
            json_pack("{s:o, s:O, s:s%, s:s, s:{s:f, s:f, s:f}}", "prompt_ids", jp, "ids", jids,
                      "text", text ? text : "", text_len, "finish_reason", finish, "timing",
                      "load_ms", t_load, "prompt_ms", t_prompt, "gen_ms", t_gen);
        if (!root)
            goto oom;
        char *s = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        if (!s)
            goto oom;
        puts(s);
        free(s);
    } else {
        putchar('\n');
    }
    if (!o.quiet)
        fprintf(stderr,
                "gpuswapd generate: %s %s, %u threads, %s kernels; prompt %zu tokens in %.1f ms "
                "(%.1f tok/s); generated %ld tokens in %.1f ms (%.1f tok/s)\n",
                model_arch_name(m->hp.arch), gguf_ttype_name(m->wtype),
                o.threads ? (int)o.threads : (int)sysconf(_SC_NPROCESSORS_ONLN),
                quant_isa_name(quant_isa_get()), n_prompt, t_prompt,
                t_prompt > 0 ? n_prompt * 1e3 / t_prompt : 0.0, n_gen, t_gen,
                t_gen > 0 ? n_gen * 1e3 / t_gen : 0.0);
    status = 0;
    goto done;
oom:
    fprintf(stderr, "gpuswapd generate: out of memory\n");
done:
    if (dump && fclose(dump) != 0 && status == 0) {
        fprintf(stderr, "gpuswapd generate: writing %s failed\n", o.dump_logits);
        status = 1;
    }
    json_decref(jids);
    free(text);
    free(prompt);
    free(out_ids);
    free(logits);
    free(scratch);
    sampler_free(smp);
    kv_seq_free(kv);
    fwd_free(fw);
    be_close(be);
    model_close(m);
    return status;
}
