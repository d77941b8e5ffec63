/* config_int: the option schema's types and the helpers config's files share (cfg_schema.c, cfg_value.c, config.c, cfg_print.c); not for other modules. */
#ifndef CONFIG_INT_H
#define CONFIG_INT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

typedef enum opt_type {
    OPT_SECTION,  /* a mapping of further options */
    OPT_MODELS,   /* the list of model mappings */
    OPT_STR,      /* char *, owned */
    OPT_MODE,     /* unsigned, permission bits written in octal */
    OPT_SIZE,     /* uint64_t bytes */
    OPT_RATE,     /* uint64_t bytes per second */
    OPT_DURATION, /* uint64_t milliseconds */
    OPT_U32,      /* uint32_t */
    OPT_I32,      /* int32_t */
    OPT_DOUBLE,   /* double */
    OPT_FLOAT,    /* float */
    OPT_BOOL,     /* int, 0 or 1 */
    OPT_ENUM,     /* an enum (int-sized), one of names[] */
    OPT_IDLIST,   /* cfg_idlist_t */
    OPT_STRLIST,  /* cfg_strlist_t; check (if any) applies to each entry as an OPT_STR field */
    OPT_KEYS,     /* the list of API key mappings (auth.keys) */
} opt_type_t;

enum {
    OPT_NULLABLE = 1u << 1, /* ~, null or "" turns it off (NULL) */
    OPT_LO_OPEN = 1u << 2,  /* value must be > lo rather than >= lo */
    OPT_HI_OPEN = 1u << 3,  /* value must be < hi rather than <= hi */
    OPT_PATH =
        1u
        << 4, /* OPT_STR naming a file: a relative value is taken from the config file's directory */
    OPT_TILDE = 1u << 5, /* with OPT_NULLABLE: only ~ or null is NULL; "" is a value (checked) */
};

typedef struct opt {
    const char *section; /* "" (top level), "listen", ..., "models", "models.defaults" */
    const char *key;
    opt_type_t type;
    size_t off;      /* into cfg_t, or into cfg_model_t when section starts with "models" */
    const char *def; /* default, in config syntax; NULL = zero / NULL / empty */
    double lo, hi;   /* bounds of numeric types, in the stored unit */
    unsigned flags;  /* OPT_* */
    const char *const *names; /* OPT_ENUM: value i is names[i]; NULL-terminated */
    int (*check)(const void *field, char *why, size_t n); /* extra check after parsing */
    const char *what;  /* OPT_STR: noun for messages ("address"); default "value" */
    cfg_apply_t apply; /* what a reload that changes it does (CFG_APPLY_*) */
    const char *doc;   /* one line for the option table (`gpuswapd --options`, README) */
} opt_t;

#define CFG_MAX_OPTS 256 /* at least cfg_n_opts (a static assert says so) */
#define UNBOUNDED HUGE_VAL

/* ------------------------------------------------------------------ cfg_schema.c */

/* Every option gpuswapd reads, in the order cfg_print writes them. */
extern const opt_t cfg_opts[];
extern const size_t cfg_n_opts;

/* Which struct an option lives in: cfg_t, a cfg_model_t or a cfg_key_t. */
enum {
    OPT_KIND_TOP = 0,
    OPT_KIND_MODEL = 1,
    OPT_KIND_KEY = 2
};
bool cfg_opt_is_model(const opt_t *o);
int cfg_opt_kind(const opt_t *o);
/* Index of the option key in section, or -1. */
int cfg_opt_find(const char *section, const char *key);
/* A socket path fits sockaddr_un: 0, or -1 with why. */
int cfg_check_sockpath(const void *field, char *why, size_t n);

/* ------------------------------------------------------------------ config.c, cfg_print.c */

/* Parses text into the field of option o (name is its full dotted name, for
 * messages). null: the YAML value was empty/~/null. dir: the directory that
 * relative OPT_PATH values are taken from (NULL: as written). Returns 0, or an
 * error code with the reason (no location) in msg. */
int cfg_opt_set(const opt_t *o, const char *text, bool null, void *field, const char *name,
                const char *dir, char *msg, size_t n);
/* Writes the value of o stored at field in config syntax; quote: strings and modes in double
 * quotes (as YAML text), else bare (for an emitter that quotes them itself). */
void cfg_value_write(FILE *f, const opt_t *o, const void *field, bool quote);

/* ------------------------------------------------------------------ cfg_value.c */

/* Copies s into buf for a message: at most 60 bytes, control bytes as '?'. */
const char *cfg_sanitize(const char *s, char *buf, size_t n);
void cfg_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
