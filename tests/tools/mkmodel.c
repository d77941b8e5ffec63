/* mkmodel: writes random-weight Llama-family GGUF models (llama, qwen2, qwen3, gemma2, gemma3, phi3, and the mixtures of experts Mixtral-style llama, qwen2moe, qwen3moe) of any shape and weight type, with a working tokenizer. */
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
#include "mkvocab.h"
#include "mkrand.h"
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
    const char *control[8]; /* --control: control tokens at the vocabulary's end (n_control) */
    int n_control;
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
    int tied;                       /* omit output.weight */
    uint32_t version;               /* GGUF version, 2 or 3 */
    uint32_t threads;               /* weight generation threads; 0 = every online CPU */
    uint32_t experts, experts_used; /* mixture of experts (expert_count, expert_used_count) */
    uint32_t expert_ff, shared_ff;  /* qwen*moe expert / qwen2moe shared expert widths; 0 = ff */
} mk_opts_t;

static void mk_usage(FILE *f)
{
    fprintf(f,
            "usage: mkmodel --out FILE [options]\n"
            "  --arch A                  llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen2moe\n"
            "                            or qwen3moe (default llama; gemma is always tied)\n"
            "  --experts N --experts-used K\n"
            "                            a mixture of N experts, top K (llama: Mixtral-style,\n"
            "                            experts --ff wide; required by qwen2moe/qwen3moe)\n"
            "  --expert-ff N             qwen*moe: each expert's width (default ff / K)\n"
            "  --shared-ff N             qwen2moe: the shared expert's width (default ff)\n"
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
            "  --control TEXT            a control token TEXT at the vocabulary's end (up to 8\n"
            "                            times; --vocab counts them)\n"
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
        (!strcmp(what, "attn_v") || !strncmp(what, "ffn_down", 8))) { /* _exps, _shexp too */
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

/* An expert's width and the shared expert's (qwen2moe): --expert-ff or
 * ff / K, --shared-ff or ff (llama.cpp's defaults). */
static uint32_t mk_expert_ff(const mk_opts_t *o)
{
    if (!strstr(o->arch, "moe"))
        return o->ff;
    return o->expert_ff ? o->expert_ff : o->ff / o->experts_used;
}

static uint32_t mk_shared_ff(const mk_opts_t *o)
{
    return o->shared_ff ? o->shared_ff : o->ff;
}

/* Nonzero unless the expert widths are whole blocks of every type used. */
static int mk_check_moe_blocks(const mk_opts_t *o)
{
    uint32_t types[2] = {o->wtype, o->wtype_more ? o->wtype_more : o->wtype};
    for (int i = 0; i < 2; i++)
        if (!mk_expert_ff(o) || !quant_row_bytes(types[i], mk_expert_ff(o)) ||
            (!strcmp(o->arch, "qwen2moe") && !quant_row_bytes(types[i], mk_shared_ff(o))))
            return 1;
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
        O_CONTROL,
        O_SOFTCAP,
        O_WINDOW,
        O_ROPE_FACTORS,
        O_ROPE_ATTN,
        O_ROPE_ORIG,
        O_CHAT_TMPL,
        O_EXPERTS,
        O_EXPERTS_USED,
        O_EXPERT_FF,
        O_SHARED_FF
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
        {"control", required_argument, NULL, O_CONTROL},
        {"softcap", required_argument, NULL, O_SOFTCAP},
        {"window", required_argument, NULL, O_WINDOW},
        {"rope-factors", no_argument, NULL, O_ROPE_FACTORS},
        {"rope-attn-factor", required_argument, NULL, O_ROPE_ATTN},
        {"rope-orig-ctx", required_argument, NULL, O_ROPE_ORIG},
        {"chat-template", required_argument, NULL, O_CHAT_TMPL},
        {"experts", required_argument, NULL, O_EXPERTS},
        {"experts-used", required_argument, NULL, O_EXPERTS_USED},
        {"expert-ff", required_argument, NULL, O_EXPERT_FF},
        {"shared-ff", required_argument, NULL, O_SHARED_FF},
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
                strcmp(optarg, "gemma2") && strcmp(optarg, "gemma3") && strcmp(optarg, "phi3") &&
                strcmp(optarg, "qwen2moe") && strcmp(optarg, "qwen3moe"))
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
        case O_EXPERTS: u = &o->experts; break;
        case O_EXPERTS_USED: u = &o->experts_used; break;
        case O_EXPERT_FF: u = &o->expert_ff; break;
        case O_SHARED_FF: u = &o->shared_ff; break;
        case O_EXTRA_TENSOR: o->extra_tensor = optarg; break;
        case O_EXTRA_U32:
            bad = !strchr(optarg, '=') || o->n_extra_u32 == 8;
            if (!bad)
                o->extra_u32[o->n_extra_u32++] = optarg;
            break;
        case O_CONTROL:
            bad = !*optarg || o->n_control == 8;
            if (!bad)
                o->control[o->n_control++] = optarg;
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
    else if ((o->experts || o->experts_used) &&
             (strcmp(o->arch, "llama") && strcmp(o->arch, "qwen2moe") &&
              strcmp(o->arch, "qwen3moe")))
        why = "--experts is for --arch llama, qwen2moe or qwen3moe";
    else if (strstr(o->arch, "moe") && !o->experts)
        why = "qwen2moe and qwen3moe need --experts and --experts-used";
    else if (o->experts && (o->experts > 256 || !o->experts_used || o->experts_used > o->experts))
        why = "--experts-used must be in 1..--experts, --experts at most 256";
    else if ((o->expert_ff && !strstr(o->arch, "moe")) ||
             (o->shared_ff && strcmp(o->arch, "qwen2moe")))
        why = "--expert-ff is for qwen2moe/qwen3moe, --shared-ff for qwen2moe";
    else if (o->experts && mk_check_moe_blocks(o))
        why = "--expert-ff and --shared-ff must be whole blocks of the weight type";
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

/* Per-tensor stream: the same seed and name always give the same values. */
static uint64_t mk_stream(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    mkrand_next(&s);
    return s;
}

/* n values uniform in [center - half, center + half). */
static void mk_fill(uint64_t *s, float *x, size_t n, float center, float half)
{
    for (size_t i = 0; i < n; i++)
        x[i] = mkrand_uniform(s, center, half);
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
    uint64_t s = a->s0 + (uint64_t)j->r0 * a->n_in * MKRAND_GAMMA;
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
static int mk_mat_n(ggufw_t *w, const mk_opts_t *o, const char *name, uint32_t type, uint32_t n_in,
                    uint32_t n_out, uint32_t n_mat, float gain, uint64_t *n_params);

static int mk_mat(ggufw_t *w, const mk_opts_t *o, const char *name, uint32_t type, uint32_t n_in,
                  uint32_t n_out, float gain, uint64_t *n_params)
{
    return mk_mat_n(w, o, name, type, n_in, n_out, 0, gain, n_params);
}

/* mk_mat of n_mat matrices stacked on a third dimension (GGUF [n_in, n_out,
 * n_mat], experts); n_mat 0: a 2-D weight. */
static int mk_mat_n(ggufw_t *w, const mk_opts_t *o, const char *name, uint32_t type, uint32_t n_in,
                    uint32_t n_out, uint32_t n_mat, float gain, uint64_t *n_params)
{
    uint32_t n_rows = n_out * (n_mat ? n_mat : 1);
    if (type == o->wtype)
        type = mk_tensor_type(o, name);
    size_t row_bytes =
        type == GGUF_T_F32 ? (size_t)n_in * sizeof(float) : quant_row_bytes(type, n_in);
    if (row_bytes == 0 || n_out == 0)
        return -1;
    mk_mat_arg_t a = {mk_stream(o->seed, name),         type,      n_in, n_rows,
                      gain * sqrtf(3.0f / (float)n_in), o->threads};
    uint64_t ne[3] = {n_in, n_out, n_mat};
    int rc = ggufw_tensor_lazy(w, name, type, n_mat ? 3 : 2, ne, row_bytes * n_rows, mk_mat_fill,
                               &a, sizeof a);
    *n_params += (uint64_t)n_in * n_rows;
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
    if (o->experts) {
        rc |= mk_kv_arch(w, o, "expert_count", o->experts);
        rc |= mk_kv_arch(w, o, "expert_used_count", o->experts_used);
    }
    if (o->experts && strstr(o->arch, "moe"))
        rc |= mk_kv_arch(w, o, "expert_feed_forward_length", mk_expert_ff(o));
    if (!strcmp(o->arch, "qwen2moe"))
        rc |= mk_kv_arch(w, o, "expert_shared_feed_forward_length", mk_shared_ff(o));
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
        uint32_t ext = (uint32_t)o->n_control; /* --control tokens follow <|im_end|> */
        uint32_t eot = (uint32_t)v->n - 3 - ext, im_end = (uint32_t)v->n - 1 - ext;
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

/* Layer l's mixture of experts: the router (F32, as llama.cpp's converter
 * and llama-quantize keep it; gain 2, so routing is decisive), the experts
 * stacked [n_in, n_out, experts], and qwen2moe's shared expert with its 1-D
 * F32 gate. */
static int mk_experts(ggufw_t *w, const mk_opts_t *o, uint32_t l, float res_gain,
                      uint64_t *n_params)
{
    char n[64];
    uint32_t ef = mk_expert_ff(o), ne = o->experts, sf = mk_shared_ff(o);
#define MK_NAME(suffix) (snprintf(n, sizeof n, "blk.%u." suffix, l), n)
    int rc = mk_mat(w, o, MK_NAME("ffn_gate_inp.weight"), GGUF_T_F32, o->dim, ne, 2.0f, n_params);
    rc |= mk_mat_n(w, o, MK_NAME("ffn_gate_exps.weight"), o->wtype, o->dim, ef, ne, 1.0f, n_params);
    rc |= mk_mat_n(w, o, MK_NAME("ffn_up_exps.weight"), o->wtype, o->dim, ef, ne, 1.0f, n_params);
    rc |= mk_mat_n(w, o, MK_NAME("ffn_down_exps.weight"), o->wtype, ef, o->dim, ne, 2.0f * res_gain,
                   n_params);
    if (!strcmp(o->arch, "qwen2moe")) {
        rc |= mk_vec(w, o, MK_NAME("ffn_gate_inp_shexp.weight"), o->dim, 0.0f, 0.3f);
        *n_params += o->dim;
        rc |= mk_mat(w, o, MK_NAME("ffn_gate_shexp.weight"), o->wtype, o->dim, sf, 1.0f, n_params);
        rc |= mk_mat(w, o, MK_NAME("ffn_up_shexp.weight"), o->wtype, o->dim, sf, 1.0f, n_params);
        rc |= mk_mat(w, o, MK_NAME("ffn_down_shexp.weight"), o->wtype, sf, o->dim, 2.0f * res_gain,
                     n_params);
    }
#undef MK_NAME
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
    int qwen = !strcmp(o->arch, "qwen2") || !strcmp(o->arch, "qwen2moe");
    int qk_norm =
        !strcmp(o->arch, "qwen3") || !strcmp(o->arch, "qwen3moe") || !strcmp(o->arch, "gemma3");
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
        if (o->experts) {
            rc |= mk_experts(w, o, l, res_gain, n_params);
        } else if (phi3) { /* gate rows, then up rows */
            rc |=
                mk_mat(w, o, MK_NAME("ffn_up.weight"), o->wtype, o->dim, 2 * o->ff, 1.0f, n_params);
        } else {
            rc |= mk_mat(w, o, MK_NAME("ffn_gate.weight"), o->wtype, o->dim, o->ff, 1.0f, n_params);
            rc |= mk_mat(w, o, MK_NAME("ffn_up.weight"), o->wtype, o->dim, o->ff, 1.0f, n_params);
        }
        if (!o->experts)
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
                  ? mk_vocab_gpt2(&v, o.vocab, o.control, (size_t)o.n_control)
                  : mk_vocab_spm(&v, o.vocab, strcmp(o.arch, "phi3") ? NULL : "<|endoftext|>",
                                 o.control, (size_t)o.n_control);
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
