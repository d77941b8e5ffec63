/* mkmodel: writes random-weight Llama-family GGUF models (llama, qwen2, qwen3, gemma2, gemma3, phi3) of any shape and weight type, with a working tokenizer. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "ggufw.h"
#include "kernels/quant.h"

/* ---------------------------------------------------------------- options */

typedef enum mk_tok {
    MK_TOK_DEFAULT = 0,
    MK_TOK_SPM,
    MK_TOK_GPT2,
} mk_tok_t;

typedef struct mk_opts {
    const char *out;
    const char *arch;         /* "llama", "qwen2" or "qwen3": the tensors written */
    const char *arch_name;    /* general.architecture and key prefix (default arch) */
    const char *chat_tmpl;    /* --chat-template: a file whose text is tokenizer.chat_template */
    uint32_t head_dim;        /* attention.key_length/value_length; 0 = dim/heads, not written */
    int rope_freqs;           /* llama3 RoPE: write rope_freqs.weight */
    int rope_factors;         /* phi3: write rope_factors_short/long.weight */
    const char *rope_scaling; /* "TYPE[:FACTOR]" for rope.scaling.type/.factor; NULL = none */
    const char *extra_tensor; /* a 3-D F32 [dim, ff, 2] tensor of this name (strictness tests) */
    const char *extra_u32[8]; /* "KEY=VALUE": more u32 metadata keys (n_extra_u32) */
    int n_extra_u32;
    float attn_softcap, final_softcap; /* gemma2 soft-caps (default 50, 30) */
    float rope_attn_factor;            /* rope.scaling.attn_factor; 0 = not written */
    uint32_t rope_orig_ctx; /* rope.scaling.original_context_length; 0 = not written (64 with
                               rope_factors) */
    uint32_t window;        /* gemma2 sliding window (default 4096) */
    uint32_t wtype;         /* gguf_ttype_t of the 2-D weights */
    uint32_t wtype_more;    /* a recipe's type for output, attn_v and ffn_down (0: wtype) */
    uint32_t ftype;         /* general.file_type (llama.cpp's llama_ftype) */
    const char *wtype_name;
    uint32_t dim, layers, heads, kv_heads, ff, vocab, ctx;
    float rope_base;
    float eps;
    uint64_t seed;
    mk_tok_t tok;
    int tied;         /* omit output.weight */
    uint32_t version; /* GGUF version, 2 or 3 */
    uint32_t threads; /* weight generation threads; 0 = every online CPU */
} mk_opts_t;

static void mk_usage(FILE *f)
{
    fprintf(f,
            "usage: mkmodel --out FILE [options]\n"
            "  --arch A                  llama, qwen2, qwen3, gemma2, gemma3 or phi3\n"
            "                            (default llama; gemma is always tied)\n"
            "  --rope-factors            phi3: rope_factors_short/long.weight (Phi-3 128k-like,\n"
            "                            original context 64)\n"
            "  --softcap A,F             gemma2 attention and final-logit soft-caps (50,30)\n"
            "  --window N                gemma/phi3 sliding window (default 4096)\n"
            "  --head-dim N              per-head width when not dim/heads (writes\n"
            "                            attention.key_length and value_length)\n"
            "  --rope-freqs              llama: a rope_freqs.weight of Llama 3.1 RoPE factors\n"
            "                            (factor 8, low 1, high 4, original context 256)\n"
            "  --rope-scaling T[:F]      write rope.scaling.type T (and .factor F)\n"
            "  --rope-attn-factor F      write rope.scaling.attn_factor F\n"
            "  --rope-orig-ctx N         write rope.scaling.original_context_length N\n"
            "  --arch-name NAME          declare this general.architecture (key prefix)\n"
            "  --extra-tensor NAME       add an F32 [dim, ff, 2] tensor NAME\n"
            "  --extra-u32 KEY=V         add a u32 metadata key (up to 8 times)\n"
            "  --type T                  2-D weight type (default f32): f32, f16, bf16, q8_0,\n"
            "                            q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k,\n"
            "                            iq4_nl, iq4_xs, or a recipe q3_k_m, q4_k_m, q5_k_m\n"
            "                            (output and some attn_v/ffn_down in a wider type)\n"
            "  --dim N --layers N --heads N --kv-heads N --ff N --vocab N\n"
            "                            shape (default 64, 2, 4, heads, 128, 512)\n"
            "  --ctx N                   context length (default 2048)\n"
            "  --rope-base F             RoPE frequency base (default 10000)\n"
            "  --eps F                   RMSNorm epsilon (default 1e-5)\n"
            "  --seed N                  PRNG seed (default 1)\n"
            "  --tokenizer spm|gpt2      (default gpt2 for qwen2/qwen3, spm otherwise)\n"
            "  --tied                    tie the output head to token_embd\n"
            "  --chat-template FILE      tokenizer.chat_template from FILE (default: a built-in\n"
            "                            chatml for qwen, Llama 2 otherwise)\n"
            "  --version 2|3             GGUF version (default 3)\n"
            "  --threads N               threads generating weights (default: all CPUs;\n"
            "                            the file is the same for any N)\n");
}

/* --type names: every type the engine computes with, by its GGUF name in
 * lower case, and the _K_M recipes (as llama.cpp's llama-quantize mixes
 * them: output and the attn_v/ffn_down of some layers one step wider). */
static const struct {
    const char *name;
    uint32_t base, more, ftype;
} mk_recipes[] = {
    {"q3_k_m", GGUF_T_Q3_K, GGUF_T_Q5_K, 12},
    {"q4_k_m", GGUF_T_Q4_K, GGUF_T_Q6_K, 15},
    {"q5_k_m", GGUF_T_Q5_K, GGUF_T_Q6_K, 17},
};

static int mk_parse_type(const char *s, mk_opts_t *o)
{
    static const struct {
        uint32_t type, ftype;
    } ftypes[] = {{GGUF_T_F32, 0},     {GGUF_T_F16, 1},     {GGUF_T_Q4_0, 2},  {GGUF_T_Q4_1, 3},
                  {GGUF_T_Q8_0, 7},    {GGUF_T_Q5_0, 8},    {GGUF_T_Q5_1, 9},  {GGUF_T_Q2_K, 10},
                  {GGUF_T_Q3_K, 11},   {GGUF_T_Q4_K, 14},   {GGUF_T_Q5_K, 16}, {GGUF_T_Q6_K, 18},
                  {GGUF_T_IQ4_NL, 25}, {GGUF_T_IQ4_XS, 30}, {GGUF_T_BF16, 32}};
    o->wtype_more = 0;
    for (size_t i = 0; i < sizeof mk_recipes / sizeof mk_recipes[0]; i++)
        if (!strcmp(s, mk_recipes[i].name)) {
            o->wtype = mk_recipes[i].base;
            o->wtype_more = mk_recipes[i].more;
            o->ftype = mk_recipes[i].ftype;
            return 0;
        }
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (!strcasecmp(s, gguf_ttype_name(ftypes[i].type)) &&
            quant_type_supported(ftypes[i].type)) {
            o->wtype = ftypes[i].type;
            o->ftype = ftypes[i].ftype;
            return 0;
        }
    return -1;
}

/* The type of one 2-D tensor: a recipe gives output.weight, and attn_v /
 * ffn_down in the first and last eighth of the layers and every third
 * between, its wider type. */
static uint32_t mk_tensor_type(const mk_opts_t *o, const char *name)
{
    if (!o->wtype_more)
        return o->wtype;
    if (!strcmp(name, "output.weight"))
        return o->wtype_more;
    unsigned l;
    char what[32];
    if (sscanf(name, "blk.%u.%31[^.]", &l, what) == 2 &&
        (!strcmp(what, "attn_v") || !strcmp(what, "ffn_down"))) {
        unsigned n = o->layers, e = n / 8;
        if (l < e || l >= n - e || (l - e) % 3 == 2)
            return o->wtype_more;
    }
    return o->wtype;
}

static int mk_parse_u32(const char *s, uint32_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || s[0] == '-' || v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int mk_parse_f32(const char *s, float *out)
{
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !isfinite(v))
        return -1;
    *out = (float)v;
    return 0;
}

/* Returns 0, 1 for --help, -1 on a bad option (message printed). */
static int mk_opts_parse(int argc, char **argv, mk_opts_t *o)
{
    enum {
        O_OUT = 1,
        O_ARCH,
        O_TYPE,
        O_DIM,
        O_LAYERS,
        O_HEADS,
        O_KV,
        O_FF,
        O_VOCAB,
        O_CTX,
        O_ROPE,
        O_EPS,
        O_SEED,
        O_TOK,
        O_TIED,
        O_VERSION,
        O_THREADS,
        O_HELP,
        O_HEAD_DIM,
        O_ROPE_FREQS,
        O_ROPE_SCALING,
        O_ARCH_NAME,
        O_EXTRA_TENSOR,
        O_EXTRA_U32,
        O_SOFTCAP,
        O_WINDOW,
        O_ROPE_FACTORS,
        O_ROPE_ATTN,
        O_ROPE_ORIG,
        O_CHAT_TMPL
    };
    static const struct option longopts[] = {
        {"out", required_argument, NULL, O_OUT},
        {"arch", required_argument, NULL, O_ARCH},
        {"type", required_argument, NULL, O_TYPE},
        {"dim", required_argument, NULL, O_DIM},
        {"layers", required_argument, NULL, O_LAYERS},
        {"heads", required_argument, NULL, O_HEADS},
        {"kv-heads", required_argument, NULL, O_KV},
        {"ff", required_argument, NULL, O_FF},
        {"vocab", required_argument, NULL, O_VOCAB},
        {"ctx", required_argument, NULL, O_CTX},
        {"rope-base", required_argument, NULL, O_ROPE},
        {"eps", required_argument, NULL, O_EPS},
        {"seed", required_argument, NULL, O_SEED},
        {"tokenizer", required_argument, NULL, O_TOK},
        {"tied", no_argument, NULL, O_TIED},
        {"version", required_argument, NULL, O_VERSION},
        {"threads", required_argument, NULL, O_THREADS},
        {"help", no_argument, NULL, O_HELP},
        {"head-dim", required_argument, NULL, O_HEAD_DIM},
        {"rope-freqs", no_argument, NULL, O_ROPE_FREQS},
        {"rope-scaling", required_argument, NULL, O_ROPE_SCALING},
        {"arch-name", required_argument, NULL, O_ARCH_NAME},
        {"extra-tensor", required_argument, NULL, O_EXTRA_TENSOR},
        {"extra-u32", required_argument, NULL, O_EXTRA_U32},
        {"softcap", required_argument, NULL, O_SOFTCAP},
        {"window", required_argument, NULL, O_WINDOW},
        {"rope-factors", no_argument, NULL, O_ROPE_FACTORS},
        {"rope-attn-factor", required_argument, NULL, O_ROPE_ATTN},
        {"rope-orig-ctx", required_argument, NULL, O_ROPE_ORIG},
        {"chat-template", required_argument, NULL, O_CHAT_TMPL},
        {NULL, 0, NULL, 0},
    };
    *o = (mk_opts_t){
        .arch = "llama",
        .wtype = GGUF_T_F32,
        .wtype_name = "f32",
        .dim = 64,
        .layers = 2,
        .heads = 4,
        .kv_heads = 0,
        .ff = 128,
        .vocab = 512,
        .ctx = 2048,
        .rope_base = 10000.0f,
        .eps = 1e-5f,
        .seed = 1,
        .version = 3,
        .attn_softcap = 50.0f,
        .final_softcap = 30.0f,
        .window = 4096,
    };
    int c, li = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, &li)) != -1) {
        int bad = 0;
        uint32_t *u = NULL;
        switch (c) {
        case O_OUT: o->out = optarg; break;
        case O_ARCH:
            if (strcmp(optarg, "llama") && strcmp(optarg, "qwen2") && strcmp(optarg, "qwen3") &&
                strcmp(optarg, "gemma2") && strcmp(optarg, "gemma3") && strcmp(optarg, "phi3"))
                bad = 1;
            o->arch = optarg;
            break;
        case O_TYPE:
            o->wtype_name = optarg;
            bad = mk_parse_type(optarg, o) != 0;
            break;
        case O_DIM: u = &o->dim; break;
        case O_LAYERS: u = &o->layers; break;
        case O_HEADS: u = &o->heads; break;
        case O_KV: u = &o->kv_heads; break;
        case O_FF: u = &o->ff; break;
        case O_VOCAB: u = &o->vocab; break;
        case O_CTX: u = &o->ctx; break;
        case O_VERSION: u = &o->version; break;
        case O_THREADS: u = &o->threads; break;
        case O_ROPE: bad = mk_parse_f32(optarg, &o->rope_base) < 0 || o->rope_base <= 0; break;
        case O_EPS: bad = mk_parse_f32(optarg, &o->eps) < 0 || o->eps <= 0; break;
        case O_SEED: {
            char *end;
            o->seed = strtoull(optarg, &end, 0);
            bad = !*optarg || *end;
            break;
        }
        case O_TOK:
            if (!strcmp(optarg, "spm"))
                o->tok = MK_TOK_SPM;
            else if (!strcmp(optarg, "gpt2"))
                o->tok = MK_TOK_GPT2;
            else
                bad = 1;
            break;
        case O_TIED: o->tied = 1; break;
        case O_HEAD_DIM: u = &o->head_dim; break;
        case O_ROPE_FREQS: o->rope_freqs = 1; break;
        case O_ROPE_SCALING: o->rope_scaling = optarg; break;
        case O_ARCH_NAME: o->arch_name = optarg; break;
        case O_CHAT_TMPL: o->chat_tmpl = optarg; break;
        case O_EXTRA_TENSOR: o->extra_tensor = optarg; break;
        case O_EXTRA_U32:
            bad = !strchr(optarg, '=') || o->n_extra_u32 == 8;
            if (!bad)
                o->extra_u32[o->n_extra_u32++] = optarg;
            break;
        case O_WINDOW: u = &o->window; break;
        case O_ROPE_ORIG: u = &o->rope_orig_ctx; break;
        case O_ROPE_FACTORS: o->rope_factors = 1; break;
        case O_ROPE_ATTN: bad = mk_parse_f32(optarg, &o->rope_attn_factor) < 0; break;
        case O_SOFTCAP: {
            char *end;
            o->attn_softcap = strtof(optarg, &end);
            bad = *end != ',';
            if (!bad)
                o->final_softcap = strtof(end + 1, &end);
            bad = bad || *end || o->attn_softcap < 0 || o->final_softcap < 0;
            break;
        }
        case O_HELP: mk_usage(stdout); return 1;
        default:
            fprintf(stderr, "mkmodel: unknown option or missing value: %s\n", argv[optind - 1]);
            mk_usage(stderr);
            return -1;
        }
        if (u)
            bad = mk_parse_u32(optarg, u) < 0;
        if (bad) {
            fprintf(stderr, "mkmodel: bad value \"%s\" for --%s\n", optarg, longopts[li].name);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "mkmodel: unexpected argument \"%s\"\n", argv[optind]);
        return -1;
    }
    if (o->kv_heads == 0)
        o->kv_heads = o->heads;
    if (o->threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = n > 0 ? (uint32_t)n : 1;
    }
    if (o->threads > 256)
        o->threads = 256;
    if (o->tok == MK_TOK_DEFAULT)
        o->tok = strncmp(o->arch, "qwen", 4) ? MK_TOK_SPM : MK_TOK_GPT2;
    if (!strncmp(o->arch, "gemma", 5))
        o->tied = 1; /* llama.cpp reads gemma2's output from token_embd (gemma3's too, here) */
    if (!o->arch_name)
        o->arch_name = o->arch;

    const char *why = NULL;
    if (!o->out)
        why = "--out is required";
    else if (o->dim == 0 || o->layers == 0 || o->heads == 0 || o->ff == 0 || o->ctx == 0)
        why = "--dim, --layers, --heads, --ff and --ctx must be positive";
    else if (!o->head_dim && o->dim % o->heads)
        why = "--dim must be a multiple of --heads (or give --head-dim)";
    else if ((o->head_dim ? o->head_dim : o->dim / o->heads) % 2)
        why = "head dim must be even for RoPE";
    else if (o->rope_freqs && strcmp(o->arch, "llama"))
        why = "--rope-freqs is for --arch llama";
    else if (o->rope_factors && strcmp(o->arch, "phi3"))
        why = "--rope-factors is for --arch phi3";
    else if (o->kv_heads > o->heads || o->heads % o->kv_heads)
        why = "--heads must be a multiple of --kv-heads";
    else if (o->vocab < 300 || o->vocab > (1u << 20))
        why = "--vocab must be in 300..1048576";
    else if (o->version != 2 && o->version != 3)
        why = "--version must be 2 or 3";
    else if (!quant_row_bytes(o->wtype, o->dim) || !quant_row_bytes(o->wtype, o->ff) ||
             (o->wtype_more &&
              (!quant_row_bytes(o->wtype_more, o->dim) || !quant_row_bytes(o->wtype_more, o->ff))))
        why =
            "--dim and --ff must be whole blocks of the weight type (32 values; 256 for K and IQ4_XS)";
    else if (!quant_row_bytes(o->wtype, o->heads * (o->head_dim ? o->head_dim : o->dim / o->heads)))
        why = "--heads x --head-dim must be whole blocks of the weight type";
    if (why) {
        fprintf(stderr, "mkmodel: %s\n", why);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- random weights */

#define MK_GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64: value k of a stream comes from state s0 + (k + 1) * MK_GAMMA,
 * so any position of a stream can be reached without generating the rest. */
static uint64_t mk_splitmix64(uint64_t *s)
{
    uint64_t z = (*s += MK_GAMMA);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Per-tensor stream: the same seed and name always give the same values. */
static uint64_t mk_stream(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    mk_splitmix64(&s);
    return s;
}

/* n values uniform in [center - half, center + half). */
static void mk_fill(uint64_t *s, float *x, size_t n, float center, float half)
{
    for (size_t i = 0; i < n; i++) {
        float u = (float)(mk_splitmix64(s) >> 40) * (1.0f / 16777216.0f); /* [0,1) */
        x[i] = center + half * (2.0f * u - 1.0f);
    }
}

/* A 1-D F32 tensor. */
static int mk_vec(ggufw_t *w, const mk_opts_t *o, const char *name, uint32_t n, float center,
                  float half)
{
    float *x = malloc((size_t)n * sizeof *x);
    if (!x)
        return -1;
    uint64_t s = mk_stream(o->seed, name);
    mk_fill(&s, x, n, center, half);
    uint64_t ne[1] = {n};
    int rc = ggufw_tensor(w, name, GGUF_T_F32, 1, ne, x, (size_t)n * sizeof *x);
    free(x);
    return rc;
}

/* A 2-D weight's recipe, kept by the writer until the file is written.
 * Speed: the 8B-shaped BF16 file of gpu-check (dim 4096, 32 layers, 32/8
 * heads, ff 14336, vocab 128256: 16.06 GB) took 58 s on the 2-core
 * development VM (15 s user, 46 s system: the kernel writing the page cache
 * back, 1 GB/s here), with 1 GB resident; one thread took 22 s for a 3 GB
 * file before the weights were generated in parallel and streamed. */
typedef struct mk_mat_arg {
    uint64_t s0;          /* its stream's state before the first value */
    uint32_t type;        /* gguf_ttype_t */
    uint32_t n_in, n_out; /* n_out rows of n_in */
    float half;           /* values uniform in +-half */
    uint32_t threads;
} mk_mat_arg_t;

typedef struct mk_mat_job {
    const mk_mat_arg_t *a;
    uint8_t *dst; /* the weight's first row */
    size_t row_bytes;
    uint32_t r0, r1; /* rows [r0, r1) */
    int rc;
} mk_mat_job_t;

/* Rows [r0, r1) of a weight: the stream jumps to row r0 (r0 * n_in values
 * in), so the values are those one thread would produce. */
static void *mk_mat_rows(void *p)
{
    mk_mat_job_t *j = p;
    const mk_mat_arg_t *a = j->a;
    float *row = NULL;
    if (a->type != GGUF_T_F32 && !(row = malloc((size_t)a->n_in * sizeof *row))) {
        j->rc = -1;
        return NULL;
    }
    uint64_t s = a->s0 + (uint64_t)j->r0 * a->n_in * MK_GAMMA;
    for (uint32_t r = j->r0; r < j->r1; r++) {
        uint8_t *dst = j->dst + (size_t)r * j->row_bytes;
        if (a->type == GGUF_T_F32) {
            mk_fill(&s, (float *)(void *)dst, a->n_in, 0.0f, a->half);
        } else {
            mk_fill(&s, row, a->n_in, 0.0f, a->half);
            quant_row_from_f32(a->type, row, dst, a->n_in);
        }
    }
    free(row);
    j->rc = 0;
    return NULL;
}

/* ggufw_fill_fn of a weight: its rows split between a->threads threads. */
static int mk_mat_fill(const void *arg, uint8_t *dst, size_t nbytes)
{
    const mk_mat_arg_t *a = arg;
    size_t row_bytes = nbytes / a->n_out;
    uint32_t nt = a->threads < a->n_out ? a->threads : a->n_out;
    if (nt < 1)
        nt = 1;
    mk_mat_job_t *jobs = calloc(nt, sizeof *jobs);
    pthread_t *tid = calloc(nt, sizeof *tid);
    int *started = calloc(nt, sizeof *started);
    int rc = jobs && tid && started ? 0 : -1;
    for (uint32_t k = 0; rc == 0 && k < nt; k++) {
        jobs[k] = (mk_mat_job_t){a,
                                 dst,
                                 row_bytes,
                                 (uint32_t)((uint64_t)a->n_out * k / nt),
                                 (uint32_t)((uint64_t)a->n_out * (k + 1) / nt),
                                 -1};
        if (k > 0)
            started[k] = pthread_create(&tid[k], NULL, mk_mat_rows, &jobs[k]) == 0;
    }
    if (rc == 0)
        mk_mat_rows(&jobs[0]);
    for (uint32_t k = 1; rc == 0 && k < nt; k++) {
        if (started[k])
            pthread_join(tid[k], NULL);
        else
            mk_mat_rows(&jobs[k]); /* no thread: do its rows here */
    }
    for (uint32_t k = 0; rc == 0 && k < nt; k++)
        if (jobs[k].rc)
            rc = -1;
    free(jobs);
    free(tid);
    free(started);
    return rc;
}

/* A 2-D weight of GGUF shape [n_in, n_out] (n_out rows of n_in), values
 * uniform in +-gain*sqrt(3/n_in) (variance gain^2/n_in), stored as type.
 * Generated only when the file is written (mk_mat_fill), one weight at a
 * time, so memory holds one weight however large the model. */
static int mk_mat(ggufw_t *w, const mk_opts_t *o, const char *name, uint32_t type, uint32_t n_in,
                  uint32_t n_out, float gain, uint64_t *n_params)
{
    if (type == o->wtype)
        type = mk_tensor_type(o, name);
    size_t row_bytes =
        type == GGUF_T_F32 ? (size_t)n_in * sizeof(float) : quant_row_bytes(type, n_in);
    if (row_bytes == 0 || n_out == 0)
        return -1;
    mk_mat_arg_t a = {mk_stream(o->seed, name),         type,      n_in, n_out,
                      gain * sqrtf(3.0f / (float)n_in), o->threads};
    uint64_t ne[2] = {n_in, n_out};
    int rc = ggufw_tensor_lazy(w, name, type, 2, ne, row_bytes * n_out, mk_mat_fill, &a, sizeof a);
    *n_params += (uint64_t)n_in * n_out;
    return rc;
}

/* ---------------------------------------------------------------- vocabulary */

/* Token types, numbered as llama.cpp's llama_token_type. */
enum {
    MK_TT_NORMAL = 1,
    MK_TT_UNKNOWN = 2,
    MK_TT_CONTROL = 3,
    MK_TT_BYTE = 6
};

typedef struct mk_vocab {
    char **text;    /* n token strings (owned) */
    float *scores;  /* n (SPM only meaningful) */
    int32_t *types; /* n */
    char **merges;  /* n_merges "left right" strings (owned), GPT-2 only */
    size_t n, cap;  /* tokens used / allocated (cap = target vocab size) */
    size_t n_merges;
    uint32_t *hash;        /* open-addressing table of token index + 1; 0 = empty */
    size_t hash_cap;       /* power of two */
    uint32_t byte_cp[256]; /* GPT-2: code point of each byte's base character */
    int gpt2;
} mk_vocab_t;

static uint64_t mk_hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static long mk_vocab_find(const mk_vocab_t *v, const char *s)
{
    size_t m = v->hash_cap - 1;
    for (size_t i = mk_hash_str(s) & m;; i = (i + 1) & m) {
        uint32_t e = v->hash[i];
        if (e == 0)
            return -1;
        if (!strcmp(v->text[e - 1], s))
            return (long)e - 1;
    }
}

static void mk_vocab_free(mk_vocab_t *v)
{
    for (size_t i = 0; i < v->n; i++)
        free(v->text[i]);
    for (size_t i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->text);
    free(v->scores);
    free(v->types);
    free(v->merges);
    free(v->hash);
}

static int mk_vocab_init(mk_vocab_t *v, size_t cap, int gpt2)
{
    memset(v, 0, sizeof *v);
    v->cap = cap;
    v->gpt2 = gpt2;
    v->hash_cap = 1;
    while (v->hash_cap < cap * 2)
        v->hash_cap *= 2;
    v->text = calloc(cap, sizeof *v->text);
    v->scores = calloc(cap, sizeof *v->scores);
    v->types = calloc(cap, sizeof *v->types);
    v->merges = calloc(cap, sizeof *v->merges);
    v->hash = calloc(v->hash_cap, sizeof *v->hash);
    if (!v->text || !v->scores || !v->types || !v->merges || !v->hash) {
        mk_vocab_free(v);
        return -1;
    }
    return 0;
}

/* Appends a token (no duplicate check). -1 when full or out of memory. */
static int mk_vocab_push(mk_vocab_t *v, const char *s, int32_t type, float score)
{
    if (v->n >= v->cap)
        return -1;
    char *t = strdup(s);
    if (!t)
        return -1;
    size_t m = v->hash_cap - 1;
    size_t i = mk_hash_str(s) & m;
    while (v->hash[i])
        i = (i + 1) & m;
    v->hash[i] = (uint32_t)(v->n + 1);
    v->text[v->n] = t;
    v->types[v->n] = type;
    v->scores[v->n] = score;
    v->n++;
    return 0;
}

static size_t mk_utf8_put(char *dst, uint32_t cp)
{
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    dst[0] = (char)(0xc0 | (cp >> 6)); /* cp < 0x800 here */
    dst[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* Byte length of the last UTF-8 character of s (len > 0). */
static size_t mk_utf8_last(const char *s, size_t len)
{
    size_t i = len - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xc0) == 0x80)
        i--;
    return len - i;
}

/* Adds piece s (and first, recursively, its prefix without the last
 * character and that last character) unless present, so that every piece is
 * reachable by merging two shorter ones: s = prefix + last char. For GPT-2
 * this records the merge "prefix last". SPM pieces get decreasing scores.
 * Returns 0 (also when the vocab filled up meanwhile), -1 on no memory. */
static int mk_vocab_add(mk_vocab_t *v, const char *s, size_t reserve)
{
    if (v->n + reserve >= v->cap || mk_vocab_find(v, s) >= 0)
        return 0;
    size_t len = strlen(s);
    size_t last = mk_utf8_last(s, len);
    if (last < len) {
        char pre[256], tail[8];
        if (len >= sizeof pre || last >= sizeof tail)
            return 0;
        memcpy(pre, s, len - last);
        pre[len - last] = 0;
        memcpy(tail, s + len - last, last);
        tail[last] = 0;
        if (mk_vocab_add(v, pre, reserve) < 0 || mk_vocab_add(v, tail, reserve) < 0)
            return -1;
        if (v->n + reserve >= v->cap || mk_vocab_find(v, pre) < 0 || mk_vocab_find(v, tail) < 0)
            return 0;
        if (v->gpt2) {
            char *m = malloc(len + 2);
            if (!m)
                return -1;
            memcpy(m, pre, len - last);
            m[len - last] = ' ';
            memcpy(m + len - last + 1, tail, last + 1);
            v->merges[v->n_merges++] = m;
        }
    } else if (v->gpt2)
        return 0; /* every GPT-2 token but the 256 bases comes from a merge */
    return mk_vocab_push(v, s, MK_TT_NORMAL, -(float)(v->n));
}

/* Adds text in the vocab's alphabet: for SPM ' ' becomes the word-start
 * marker (texts with control characters are skipped: SPM spells those with
 * byte tokens); for GPT-2 every byte becomes its byte-level character. */
static int mk_vocab_add_text(mk_vocab_t *v, const char *text, size_t reserve)
{
    char buf[256];
    size_t j = 0;
    for (const char *p = text; *p; p++) {
        uint8_t b = (uint8_t)*p;
        if (j + 4 >= sizeof buf)
            return 0;
        if (v->gpt2) {
            j += mk_utf8_put(buf + j, v->byte_cp[b]);
        } else if (b == ' ') {
            memcpy(buf + j, "\xe2\x96\x81", 3);
            j += 3;
        } else if (b < 0x20) {
            return 0;
        } else {
            buf[j++] = (char)b;
        }
    }
    buf[j] = 0;
    return mk_vocab_add(v, buf, reserve);
}

/* Letters in English frequency order; systematic pieces use this order. */
static const char mk_letters[] = "etaoinshrdlucmwfgypbvkjxqz";

static const char *const mk_seed_pieces[] = {
    " ",     " t",     " a",      " s",    " w",    " h",    " o",     " b",    " m",    " i",
    " c",    " f",     " d",      " l",    " p",    " the",  " a",     " and",  " to",   " of",
    " was",  " in",    " he",     " she",  " it",   " that", " is",    " on",   " for",  " with",
    " his",  " her",   " they",   " you",  " said", " had",  " one",   " day",  " time", " once",
    " upon", " there", " little", " girl", " boy",  " big",  " happy", " play", " saw",  " mom",
    " dog",  " cat",   " friend", " went", " park", " not",  " but",   " so",   "th",    "he",
    "in",    "er",     "an",      "re",    "on",    "at",    "en",     "nd",    "ed",    "es",
    "or",    "ing",    "ion",     "ll",    "ly",    "ou",    "st",     "ar",    "al",    "it",
    "is",    "le",     "ve",      "se",    "ch",    "sh",    "ck",     ".",     ",",     "!",
    "?",     "'",      "\"",      "-",     ":",     ";",     "(",      ")",     "0",     "1",
    "2",     "3",      "4",       "5",     "6",     "7",     "8",      "9",     "\n",    " The",
    " Once", " One",   " He",     " She",  " They", " It",   " Lily",  " Tom",  " Ben",  " Sue",
    "A",     "B",      "C",       "D",     "E",     "F",     "G",      "H",     "I",     "J",
    "K",     "L",      "M",       "N",     "O",     "P",     "Q",      "R",     "S",     "T",
    "U",     "V",      "W",       "X",     "Y",     "Z",
};

/* Fills the normal pieces: the seed list, then every letter string of
 * length 1, 2, 3, ... with and without the word-start marker, until the vocab
 * has cap - reserve tokens. */
static int mk_vocab_fill(mk_vocab_t *v, size_t reserve)
{
    for (size_t i = 0; i < sizeof mk_seed_pieces / sizeof mk_seed_pieces[0]; i++)
        if (mk_vocab_add_text(v, mk_seed_pieces[i], reserve) < 0)
            return -1;
    size_t nl = sizeof mk_letters - 1;
    for (size_t len = 1; v->n + reserve < v->cap && len < 32; len++) {
        size_t idx[32] = {0};
        for (;;) {
            char s[40];
            s[0] = ' ';
            for (size_t k = 0; k < len; k++)
                s[1 + k] = mk_letters[idx[k]];
            s[1 + len] = 0;
            if (mk_vocab_add_text(v, s + 1, reserve) < 0 || mk_vocab_add_text(v, s, reserve) < 0)
                return -1;
            if (v->n + reserve >= v->cap)
                return 0;
            size_t k = len;
            while (k > 0 && ++idx[k - 1] == nl)
                idx[--k] = 0;
            if (k == 0)
                break;
        }
    }
    return 0;
}

/* SentencePiece vocab: <unk>, <s>, </s>, 256 byte tokens, pieces. */
/* SentencePiece vocab: <unk> <s> </s>, the 256 byte tokens, pieces, and a
 * last control token `last` unless NULL (Phi-3's <|endoftext|>, which
 * llama.cpp looks up in a model it names phi3). */
static int mk_vocab_spm(mk_vocab_t *v, size_t n, const char *last)
{
    if (mk_vocab_init(v, n, 0) < 0)
        return -1;
    int rc = mk_vocab_push(v, "<unk>", MK_TT_UNKNOWN, 0.0f);
    rc |= mk_vocab_push(v, "<s>", MK_TT_CONTROL, 0.0f);
    rc |= mk_vocab_push(v, "</s>", MK_TT_CONTROL, 0.0f);
    for (int b = 0; b < 256 && rc == 0; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        rc = mk_vocab_push(v, s, MK_TT_BYTE, 0.0f);
    }
    if (rc == 0)
        rc = mk_vocab_fill(v, last ? 1 : 0);
    if (rc == 0 && last)
        rc = mk_vocab_push(v, last, MK_TT_CONTROL, 0.0f);
    if (rc == 0 && v->n != n)
        rc = -1;
    return rc;
}

/* GPT-2 byte-level BPE vocab: 256 byte characters (GPT-2's bytes_to_unicode
 * order), merged tokens, then <|endoftext|>, <|im_start|>, <|im_end|>. */
static int mk_vocab_gpt2(mk_vocab_t *v, size_t n)
{
    if (mk_vocab_init(v, n, 1) < 0)
        return -1;
    int printable[256] = {0};
    for (int b = '!'; b <= '~'; b++)
        printable[b] = 1;
    for (int b = 0xa1; b <= 0xac; b++)
        printable[b] = 1;
    for (int b = 0xae; b <= 0xff; b++)
        printable[b] = 1;
    int rc = 0;
    /* printable bytes map to themselves, first, in byte order */
    for (int b = 0; b < 256 && rc == 0; b++) {
        if (!printable[b])
            continue;
        char s[4];
        v->byte_cp[b] = (uint32_t)b;
        s[mk_utf8_put(s, (uint32_t)b)] = 0;
        rc = mk_vocab_push(v, s, MK_TT_NORMAL, 0.0f);
    }
    /* the rest map to U+0100 + k, in byte order */
    uint32_t k = 0;
    for (int b = 0; b < 256 && rc == 0; b++) {
        if (printable[b])
            continue;
        char s[4];
        v->byte_cp[b] = 0x100 + k++;
        s[mk_utf8_put(s, v->byte_cp[b])] = 0;
        rc = mk_vocab_push(v, s, MK_TT_NORMAL, 0.0f);
    }
    if (rc == 0)
        rc = mk_vocab_fill(v, 3);
    if (rc == 0)
        rc = mk_vocab_push(v, "<|endoftext|>", MK_TT_CONTROL, 0.0f);
    if (rc == 0)
        rc = mk_vocab_push(v, "<|im_start|>", MK_TT_CONTROL, 0.0f);
    if (rc == 0)
        rc = mk_vocab_push(v, "<|im_end|>", MK_TT_CONTROL, 0.0f);
    if (rc == 0 && v->n != n)
        rc = -1;
    return rc;
}

/* ---------------------------------------------------------------- model */

static const char mk_tmpl_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

static const char mk_tmpl_llama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";

static int mk_kv_arch(ggufw_t *w, const mk_opts_t *o, const char *key, uint32_t v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", o->arch_name, key);
    return ggufw_kv_u32(w, k, v);
}

static int mk_kv_arch_f32(ggufw_t *w, const mk_opts_t *o, const char *key, float v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", o->arch_name, key);
    return ggufw_kv_f32(w, k, v);
}

static uint32_t mk_head_dim(const mk_opts_t *o)
{
    return o->head_dim ? o->head_dim : o->dim / o->heads;
}

static int mk_metadata(ggufw_t *w, const mk_opts_t *o, const mk_vocab_t *v)
{
    uint32_t hd = mk_head_dim(o);
    char name[128];
    snprintf(name, sizeof name, "mkmodel-%s-%s-%ux%u", o->arch, o->wtype_name, o->dim, o->layers);
    int rc = ggufw_kv_str(w, "general.architecture", o->arch_name);
    rc |= ggufw_kv_str(w, "general.name", name);
    rc |= mk_kv_arch(w, o, "context_length", o->ctx);
    rc |= mk_kv_arch(w, o, "embedding_length", o->dim);
    rc |= mk_kv_arch(w, o, "feed_forward_length", o->ff);
    rc |= mk_kv_arch(w, o, "block_count", o->layers);
    rc |= mk_kv_arch(w, o, "attention.head_count", o->heads);
    rc |= mk_kv_arch(w, o, "attention.head_count_kv", o->kv_heads);
    rc |= mk_kv_arch(w, o, "rope.dimension_count", hd);
    rc |= mk_kv_arch_f32(w, o, "rope.freq_base", o->rope_base);
    rc |= mk_kv_arch_f32(w, o, "attention.layer_norm_rms_epsilon", o->eps);
    rc |= mk_kv_arch(w, o, "vocab_size", o->vocab);
    if (o->head_dim) {
        rc |= mk_kv_arch(w, o, "attention.key_length", o->head_dim);
        rc |= mk_kv_arch(w, o, "attention.value_length", o->head_dim);
    }
    if (o->rope_scaling) {
        char type[64];
        snprintf(type, sizeof type, "%s", o->rope_scaling);
        char *colon = strchr(type, ':');
        if (colon)
            *colon = 0;
        char k[128];
        snprintf(k, sizeof k, "%s.rope.scaling.type", o->arch_name);
        rc |= ggufw_kv_str(w, k, type);
        if (colon)
            rc |= mk_kv_arch_f32(w, o, "rope.scaling.factor", strtof(colon + 1, NULL));
    }
    for (int i = 0; i < o->n_extra_u32; i++) {
        char k[128];
        const char *eq = strchr(o->extra_u32[i], '=');
        snprintf(k, sizeof k, "%.*s", (int)(eq - o->extra_u32[i]), o->extra_u32[i]);
        rc |= ggufw_kv_u32(w, k, (uint32_t)strtoul(eq + 1, NULL, 10));
    }
    rc |= ggufw_kv_u32(w, "general.file_type", o->ftype);

    int qwen = strncmp(o->arch, "qwen", 4) == 0;
    if (!strcmp(o->arch, "gemma2")) {
        rc |= mk_kv_arch_f32(w, o, "attn_logit_softcapping", o->attn_softcap);
        rc |= mk_kv_arch_f32(w, o, "final_logit_softcapping", o->final_softcap);
    }
    if (!strncmp(o->arch, "gemma", 5) || !strcmp(o->arch, "phi3"))
        rc |= mk_kv_arch(w, o, "attention.sliding_window", o->window);
    if (o->rope_factors || o->rope_orig_ctx)
        rc |= mk_kv_arch(w, o, "rope.scaling.original_context_length",
                         o->rope_orig_ctx ? o->rope_orig_ctx : 64);
    if (o->rope_attn_factor != 0.0f)
        rc |= mk_kv_arch_f32(w, o, "rope.scaling.attn_factor", o->rope_attn_factor);
    rc |= ggufw_kv_str(w, "tokenizer.ggml.model", v->gpt2 ? "gpt2" : "llama");
    if (v->gpt2)
        rc |= ggufw_kv_str(w, "tokenizer.ggml.pre", qwen ? "qwen2" : "llama-bpe");
    rc |= ggufw_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->text, v->n);
    if (!v->gpt2)
        rc |= ggufw_kv_arr_f32(w, "tokenizer.ggml.scores", v->scores, v->n);
    rc |= ggufw_kv_arr_i32(w, "tokenizer.ggml.token_type", v->types, v->n);
    if (v->gpt2) {
        rc |= ggufw_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                               v->n_merges);
        uint32_t eot = (uint32_t)v->n - 3, im_end = (uint32_t)v->n - 1;
        rc |= ggufw_kv_u32(w, "tokenizer.ggml.bos_token_id", eot);
        rc |= ggufw_kv_u32(w, "tokenizer.ggml.eos_token_id", qwen ? im_end : eot);
        rc |= ggufw_kv_u32(w, "tokenizer.ggml.padding_token_id", eot);
        rc |= ggufw_kv_bool(w, "tokenizer.ggml.add_bos_token", !qwen);
    } else {
        rc |= ggufw_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
        rc |= ggufw_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
        rc |= ggufw_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        rc |= ggufw_kv_bool(w, "tokenizer.ggml.add_bos_token", 1);
    }
    char *tmpl = NULL;
    FILE *tf = o->chat_tmpl ? fopen(o->chat_tmpl, "rb") : NULL;
    if (tf) {
        size_t cap = 1 << 20, n;
        if ((tmpl = calloc(1, cap)) && (n = fread(tmpl, 1, cap - 1, tf)) > 0)
            tmpl[n] = 0;
        fclose(tf);
    }
    if (o->chat_tmpl && !tmpl)
        rc = -1;
    rc |= ggufw_kv_str(w, "tokenizer.chat_template",
                       tmpl   ? tmpl
                       : qwen ? mk_tmpl_chatml
                              : mk_tmpl_llama2);
    free(tmpl);
    return rc ? -1 : 0;
}

/* rope_freqs.weight as Llama 3.1 computes its RoPE scaling (factor 8, low
 * and high frequency factors 1 and 4) for an original context of 256, so a
 * small model has pairs in each regime: wavelengths under 64 positions keep
 * their frequency, those over 256 are divided by 8, those between by a
 * factor interpolated on original_context / wavelength. */
static int mk_rope_freqs(ggufw_t *w, const mk_opts_t *o, uint32_t hd)
{
    const double factor = 8.0, low = 1.0, high = 4.0, orig = 256.0;
    uint32_t half = hd / 2;
    float *f = malloc(half * sizeof *f);
    if (!f)
        return -1;
    for (uint32_t i = 0; i < half; i++) {
        double freq = pow((double)o->rope_base, -2.0 * i / (double)hd);
        double wavelen = 2.0 * M_PI / freq;
        if (wavelen < orig / high) {
            f[i] = 1.0f;
        } else if (wavelen > orig / low) {
            f[i] = (float)factor;
        } else {
            double smooth = (orig / wavelen - low) / (high - low);
            f[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
    uint64_t ne[1] = {half};
    int rc = ggufw_tensor(w, "rope_freqs.weight", GGUF_T_F32, 1, ne, f, half * sizeof *f);
    free(f);
    return rc;
}

/* Adds every tensor. Scales keep activations O(1): projections preserve
 * variance; residual branches are damped by 1/sqrt(2*layers); the embedding
 * and output head give logits with a standard deviation of about 2. */
static int mk_tensors(ggufw_t *w, const mk_opts_t *o, uint64_t *n_params)
{
    uint32_t hd = mk_head_dim(o);
    uint32_t q_dim = o->heads * hd, kv_dim = o->kv_heads * hd;
    float res_gain = 1.0f / sqrtf(2.0f * (float)o->layers);
    int qwen = !strcmp(o->arch, "qwen2");
    int qk_norm = !strcmp(o->arch, "qwen3") || !strcmp(o->arch, "gemma3");
    int gemma = !strncmp(o->arch, "gemma", 5), phi3 = !strcmp(o->arch, "phi3");
    int rc = mk_mat(w, o, "token_embd.weight", o->wtype, o->dim, o->vocab, 2.0f, n_params);
    rc |= mk_vec(w, o, "output_norm.weight", o->dim, 1.0f, 0.1f);
    *n_params += o->dim;
    if (!o->tied)
        rc |= mk_mat(w, o, "output.weight", o->wtype, o->dim, o->vocab, 2.0f, n_params);
    if (o->rope_freqs)
        rc |= mk_rope_freqs(w, o, hd);
    if (o->rope_factors) {
        /* short factors near 1, long ones growing to 40 over the pairs (Phi-3
         * 128k's shape) */
        float *f = malloc(hd * sizeof *f);
        if (!f)
            return -1;
        uint64_t s = mk_stream(o->seed, "rope_factors");
        mk_fill(&s, f, hd / 2, 1.1f, 0.1f);
        for (uint32_t i = 0; i < hd / 2; i++)
            f[hd / 2 + i] = 1.0f + 39.0f * (float)i / (float)(hd / 2);
        uint64_t ne[1] = {hd / 2};
        rc |=
            ggufw_tensor(w, "rope_factors_short.weight", GGUF_T_F32, 1, ne, f, hd / 2 * sizeof *f);
        rc |= ggufw_tensor(w, "rope_factors_long.weight", GGUF_T_F32, 1, ne, f + hd / 2,
                           hd / 2 * sizeof *f);
        free(f);
    }
    if (o->extra_tensor) {
        size_t n = (size_t)o->dim * o->ff * 2;
        float *x = calloc(n, sizeof *x);
        uint64_t ne[3] = {o->dim, o->ff, 2};
        rc |= x ? ggufw_tensor(w, o->extra_tensor, GGUF_T_F32, 3, ne, x, n * sizeof *x) : -1;
        free(x);
    }
    for (uint32_t l = 0; l < o->layers && rc == 0; l++) {
        char n[64];
#define MK_NAME(suffix) (snprintf(n, sizeof n, "blk.%u." suffix, l), n)
        rc |= mk_vec(w, o, MK_NAME("attn_norm.weight"), o->dim, 1.0f, 0.1f);
        if (phi3) {
            rc |= mk_mat(w, o, MK_NAME("attn_qkv.weight"), o->wtype, o->dim, q_dim + 2 * kv_dim,
                         1.0f, n_params);
        } else {
            rc |= mk_mat(w, o, MK_NAME("attn_q.weight"), o->wtype, o->dim, q_dim, 1.0f, n_params);
            rc |= mk_mat(w, o, MK_NAME("attn_k.weight"), o->wtype, o->dim, kv_dim, 1.0f, n_params);
            rc |= mk_mat(w, o, MK_NAME("attn_v.weight"), o->wtype, o->dim, kv_dim, 1.0f, n_params);
        }
        if (qwen) {
            rc |= mk_vec(w, o, MK_NAME("attn_q.bias"), q_dim, 0.0f, 0.5f);
            rc |= mk_vec(w, o, MK_NAME("attn_k.bias"), kv_dim, 0.0f, 0.5f);
            rc |= mk_vec(w, o, MK_NAME("attn_v.bias"), kv_dim, 0.0f, 0.5f);
            *n_params += q_dim + 2 * kv_dim;
        }
        if (qk_norm) {
            rc |= mk_vec(w, o, MK_NAME("attn_q_norm.weight"), hd, 1.0f, 0.3f);
            rc |= mk_vec(w, o, MK_NAME("attn_k_norm.weight"), hd, 1.0f, 0.3f);
            *n_params += 2ull * hd;
        }
        rc |= mk_mat(w, o, MK_NAME("attn_output.weight"), o->wtype, q_dim, o->dim, res_gain,
                     n_params);
        if (gemma) {
            rc |= mk_vec(w, o, MK_NAME("post_attention_norm.weight"), o->dim, 1.0f, 0.1f);
            rc |= mk_vec(w, o, MK_NAME("post_ffw_norm.weight"), o->dim, 1.0f, 0.1f);
            *n_params += 2ull * o->dim;
        }
        rc |= mk_vec(w, o, MK_NAME("ffn_norm.weight"), o->dim, 1.0f, 0.1f);
        if (phi3) { /* gate rows, then up rows */
            rc |=
                mk_mat(w, o, MK_NAME("ffn_up.weight"), o->wtype, o->dim, 2 * o->ff, 1.0f, n_params);
        } else {
            rc |= mk_mat(w, o, MK_NAME("ffn_gate.weight"), o->wtype, o->dim, o->ff, 1.0f, n_params);
            rc |= mk_mat(w, o, MK_NAME("ffn_up.weight"), o->wtype, o->dim, o->ff, 1.0f, n_params);
        }
        rc |= mk_mat(w, o, MK_NAME("ffn_down.weight"), o->wtype, o->ff, o->dim, 2.0f * res_gain,
                     n_params);
#undef MK_NAME
        *n_params += 2ull * o->dim;
    }
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    mk_opts_t o;
    int prc = mk_opts_parse(argc, argv, &o);
    if (prc != 0)
        return prc > 0 ? 0 : 2;

    mk_vocab_t v;
    int vrc = o.tok == MK_TOK_GPT2
                  ? mk_vocab_gpt2(&v, o.vocab)
                  : mk_vocab_spm(&v, o.vocab, strcmp(o.arch, "phi3") ? NULL : "<|endoftext|>");
    if (vrc < 0) {
        fprintf(stderr, "mkmodel: could not build a %u-token vocabulary\n", o.vocab);
        mk_vocab_free(&v);
        return 1;
    }
    ggufw_t *w = ggufw_new(o.version, 0);
    uint64_t n_params = 0;
    int rc = w ? mk_metadata(w, &o, &v) : -1;
    if (rc == 0)
        rc = mk_tensors(w, &o, &n_params);
    mk_vocab_free(&v);
    if (rc < 0) {
        fprintf(stderr, "mkmodel: out of memory building the model\n");
        ggufw_free(w);
        return 1;
    }
    if (ggufw_write_file(w, o.out) < 0) {
        fprintf(stderr, "mkmodel: cannot write %s\n", o.out);
        ggufw_free(w);
        return 1;
    }
    ggufw_free(w);
    FILE *f = fopen(o.out, "rb");
    long bytes = -1;
    if (f && fseek(f, 0, SEEK_END) == 0)
        bytes = ftell(f);
    if (f)
        fclose(f);
    printf("mkmodel: %s: %s %s dim %u layers %u heads %u/%u ff %u vocab %u (%s%s): "
           "%" PRIu64 " params (%.1fM), %ld bytes\n",
           o.out, o.arch, o.wtype_name, o.dim, o.layers, o.heads, o.kv_heads, o.ff, o.vocab,
           o.tok == MK_TOK_GPT2 ? "gpt2" : "spm", o.tied ? ", tied" : "", n_params,
           (double)n_params / 1e6, bytes);
    return 0;
}
