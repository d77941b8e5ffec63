/* sampler_params: the tunable sampling parameters, declared once; every codec, option table and help text is built from SAMPLER_PARAMS. */
#ifndef SAMPLER_PARAMS_H
#define SAMPLER_PARAMS_H

#include <stddef.h>

/* The C type of a parameter. */
typedef enum sampler_kind {
    SAMPLER_KIND_F32, /* float */
    SAMPLER_KIND_I32, /* int32_t */
} sampler_kind_t;

/* Bounds flags: the range is [lo, hi] unless one of these opens an end. */
#define SAMPLER_LO_OPEN 1u /* value must be > lo */
#define SAMPLER_HI_OPEN 2u /* value must be < hi */

/* X(name, KIND, ctype, lo, hi, bounds, default, help)
 *   name     the field in every struct, the JSON/HTTP/config key; the CLI option is it with '-' for '_'
 *   KIND     F32 or I32 (SAMPLER_KIND_*), ctype its C type
 *   lo, hi   the accepted range, bounds SAMPLER_*_OPEN or 0
 *   default  the built-in default (a model's `defaults:` in the config overrides it)
 *   help     one line for --help and the docs
 * Adding a parameter is one row here plus its code in sampler.c; the protocol,
 * HTTP, config, worker merge, gpuswap and `gpuswapd generate` pick it up. */
#define SAMPLER_PARAMS(X)                                                                          \
    X(temperature, F32, float, 0, 100, 0, 0.8, "0 = greedy")                                       \
    X(top_k, I32, int32_t, 0, 1000000, 0, 40, "keep only the N most likely tokens; 0 = off")       \
    X(top_p, F32, float, 0, 1, SAMPLER_LO_OPEN, 0.95,                                              \
      "keep the likeliest tokens up to this total probability; 1 = off")                           \
    X(min_p, F32, float, 0, 1, 0, 0.05,                                                            \
      "drop tokens less likely than this times the best; 0 = off")                                 \
    X(repeat_penalty, F32, float, 0, 100, SAMPLER_LO_OPEN, 1,                                      \
      "divide the logits of the last 64 tokens by this; 1 = off")                                  \
    X(presence_penalty, F32, float, -2, 2, 0, 0,                                                   \
      "subtract this from the logit of each token generated so far")                               \
    X(frequency_penalty, F32, float, -2, 2, 0, 0,                                                  \
      "subtract this times its count from each generated token's logit")

/* Index of each parameter in sampler_param_descs. */
typedef enum sampler_param_id {
#define SAMPLER_X_ID(name, kind, ctype, lo, hi, bounds, def, help) SAMPLER_PARAM_##name,
    SAMPLER_PARAMS(SAMPLER_X_ID)
#undef SAMPLER_X_ID
    SAMPLER_PARAM_COUNT
} sampler_param_id_t;

/* Declares the parameters as struct fields: `SAMPLER_PARAMS(SAMPLER_X_FIELD)`. */
#define SAMPLER_X_FIELD(name, kind, ctype, lo, hi, bounds, def, help) ctype name;
/* Declares one has_<name> flag (int) per parameter. */
#define SAMPLER_X_HAS(name, kind, ctype, lo, hi, bounds, def, help) int has_##name;

/* One row of the table as data, for code that walks the parameters. */
typedef struct sampler_param_desc {
    const char *name; /* "top_p" */
    sampler_kind_t kind;
    double lo, hi;        /* range */
    unsigned bounds;      /* SAMPLER_LO_OPEN | SAMPLER_HI_OPEN */
    double def;           /* built-in default */
    const char *def_text; /* the default as written in the table ("0.95") */
    const char *help;     /* one line */
} sampler_param_desc_t;

extern const sampler_param_desc_t sampler_param_descs[SAMPLER_PARAM_COUNT];

/* 1 when v is inside d's range (NaN never is). */
int sampler_param_in_range(const sampler_param_desc_t *d, double v);
/* Writes d's range as "[0, 1]", "(0, 100]" into buf; returns buf. */
const char *sampler_param_range_text(const sampler_param_desc_t *d, char *buf, size_t len);
/* The descriptor named name (exact), or NULL. */
const sampler_param_desc_t *sampler_param_find(const char *name);

#endif
