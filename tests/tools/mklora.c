/* mklora: writes a random-weight LoRA adapter, in llama.cpp's GGUF adapter format, for a given base model file. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/lora.h"
#include "engine/model.h"
#include "ggufw.h"
#include "mkrand.h"
#include "kernels/quant.h"
#include "kernels/wtype.h"

typedef struct mkl_opts {
    const char *base, *out;
    uint32_t rank;
    float alpha;      /* written unless < 0 */
    unsigned targets; /* 1 << lora_target_t */
    uint32_t type;    /* gguf_ttype_t of A and B */
    uint64_t seed;
    float gain;       /* B's values are uniform in +-gain / sqrt(rank) */
    const char *arch; /* general.architecture written (default: the base's) */
} mkl_opts_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: mklora --base BASE.gguf --out ADAPTER.gguf [options]\n"
               "  --rank R          rank of every pair (default 8)\n"
               "  --alpha A         adapter.lora.alpha (default: 2 x rank; -1 = not written)\n"
               "  --targets LIST    comma-separated of q,k,v,o,gate,up,down (default q,k,v,o)\n"
               "  --type T          f32, f16, bf16 or q8_0 (default f16)\n"
               "  --seed N          random stream (default 1)\n"
               "  --gain G          scale of B's values (default 1)\n"
               "  --arch NAME       general.architecture written (default: the base's)\n");
}

static const char *const short_names[LORA_N_TARGETS] = {"q", "k", "v", "o", "gate", "up", "down"};

static int parse_targets(const char *s, unsigned *out)
{
    *out = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < LORA_N_TARGETS && strcmp(t, short_names[k]))
            k++;
        if (k == LORA_N_TARGETS)
            return -1;
        *out |= 1u << k;
    }
    return *out ? 0 : -1;
}

static int parse_type(const char *s, uint32_t *t)
{
    static const struct {
        const char *name;
        uint32_t type;
    } types[] = {
        {"f32", GGUF_T_F32}, {"f16", GGUF_T_F16}, {"bf16", GGUF_T_BF16}, {"q8_0", GGUF_T_Q8_0}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(s, types[i].name)) {
            *t = types[i].type;
            return 0;
        }
    return -1;
}

static int parse(int argc, char **argv, mkl_opts_t *o)
{
    *o = (mkl_opts_t){
        .rank = 8, .alpha = 0.0f, .targets = 0xf, .type = GGUF_T_F16, .seed = 1, .gain = 1.0f};
    int alpha_set = 0;
    static const struct option lo[] = {{"base", required_argument, NULL, 'b'},
                                       {"out", required_argument, NULL, 'o'},
                                       {"rank", required_argument, NULL, 'r'},
                                       {"alpha", required_argument, NULL, 'a'},
                                       {"targets", required_argument, NULL, 't'},
                                       {"type", required_argument, NULL, 'T'},
                                       {"seed", required_argument, NULL, 's'},
                                       {"gain", required_argument, NULL, 'g'},
                                       {"arch", required_argument, NULL, 'A'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'b': o->base = optarg; break;
        case 'o': o->out = optarg; break;
        case 'r': o->rank = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'a': o->alpha = strtof(optarg, NULL), alpha_set = 1; break;
        case 't':
            if (parse_targets(optarg, &o->targets)) {
                fprintf(stderr, "mklora: bad --targets '%s'\n", optarg);
                return 2;
            }
            break;
        case 'T':
            if (parse_type(optarg, &o->type)) {
                fprintf(stderr, "mklora: bad --type '%s'\n", optarg);
                return 2;
            }
            break;
        case 's': o->seed = strtoull(optarg, NULL, 10); break;
        case 'g': o->gain = strtof(optarg, NULL); break;
        case 'A': o->arch = optarg; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
    }
    if (!o->base || !o->out || o->rank == 0 || o->rank > 4096 || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (!alpha_set)
        o->alpha = 2.0f * (float)o->rank;
    return 0;
}

/* A (rows, n) matrix of values uniform in +-half, stored as type. */
static int put_matrix(ggufw_t *w, const char *name, uint32_t type, uint32_t n, uint32_t rows,
                      float half, uint64_t *s)
{
    uint32_t blck;
    if (gguf_ttype_traits(type, &blck, NULL) || n % blck) {
        fprintf(stderr, "mklora: %s: rows of %u do not fit the type's blocks of %u\n", name, n,
                blck);
        return -1;
    }
    size_t rb = quant_row_bytes(type, n);
    uint8_t *data = malloc(rb * rows);
    float *row = malloc((size_t)n * sizeof *row);
    int rc = -1;
    if (data && row) {
        for (uint32_t r = 0; r < rows; r++) {
            for (uint32_t i = 0; i < n; i++)
                row[i] = mkrand_uniform(s, 0.0f, half);
            quant_row_from_f32(type, row, data + (size_t)r * rb, n);
        }
        uint64_t ne[2] = {n, rows};
        rc = ggufw_tensor(w, name, type, 2, ne, data, rb * rows);
    }
    free(data);
    free(row);
    return rc;
}

static int write_adapter(const mkl_opts_t *o, const model_t *m)
{
    ggufw_t *w = ggufw_new(3, 0);
    if (!w)
        return -1;
    gguf_str_t arch;
    char archbuf[64] = "llama";
    if (!gguf_get_str(m->gguf, "general.architecture", &arch))
        snprintf(archbuf, sizeof archbuf, "%.*s", (int)arch.len, arch.ptr);
    int rc = ggufw_kv_str(w, "general.architecture", o->arch ? o->arch : archbuf) ||
             ggufw_kv_str(w, "general.type", "adapter") || ggufw_kv_str(w, "adapter.type", "lora");
    if (!rc && o->alpha >= 0.0f)
        rc = ggufw_kv_f32(w, "adapter.lora.alpha", o->alpha);
    uint64_t s = o->seed * 0x2545f4914f6cdd1dull + 17;
    for (uint32_t l = 0; !rc && l < m->hp.n_layer; l++) {
        for (int k = 0; !rc && k < LORA_N_TARGETS; k++) {
            const model_weight_t *v = lora_base_view(m, l, (lora_target_t)k);
            if (!(o->targets & (1u << k)) || !v->data)
                continue;
            char name[128];
            snprintf(name, sizeof name, "blk.%u.%s.weight.lora_a", l, lora_target_name(k));
            rc = put_matrix(w, name, o->type, v->n_in, o->rank, 1.0f / sqrtf((float)v->n_in), &s);
            snprintf(name, sizeof name, "blk.%u.%s.weight.lora_b", l, lora_target_name(k));
            rc = rc || put_matrix(w, name, o->type, o->rank, v->n_out,
                                  o->gain / sqrtf((float)o->rank), &s);
        }
    }
    rc = rc || ggufw_write_file(w, o->out);
    ggufw_free(w);
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    mkl_opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    char err[512];
    model_t *m = model_open(o.base, err, sizeof err);
    if (!m) {
        fprintf(stderr, "mklora: %s\n", err);
        return 1;
    }
    rc = write_adapter(&o, m);
    model_close(m);
    if (rc) {
        fprintf(stderr, "mklora: could not write %s\n", o.out);
        return 1;
    }
    return 0;
}
