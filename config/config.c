/* config: loads gpuswapd's YAML configuration into a validated plain struct, driven by one table of option descriptors. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml.h>

#include "base/log.h"
#include "engine/chat.h"
#include "keyhash.h"
#include "hostport.h"

/* ------------------------------------------------------------------ option table */

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
    OPT_RELOAD = 1u << 0,   /* SIGHUP may change it */
    OPT_NULLABLE = 1u << 1, /* ~, null or "" turns it off (NULL) */
    OPT_LO_OPEN = 1u << 2,  /* value must be > lo rather than >= lo */
    OPT_HI_OPEN = 1u << 3,  /* value must be < hi rather than <= hi */
    OPT_PATH =
        1u
        << 4, /* OPT_STR naming a file: a relative value is taken from the config file's directory */
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
    const char *what; /* OPT_STR: noun for messages ("address"); default "value" */
} opt_t;

/* OPT_ENUM tables: one name per value, NULL-terminated */
static const char *const backend_names[CFG_BACKEND_COUNT + 1] = {
    [CFG_BACKEND_AUTO] = "auto",
    [CFG_BACKEND_CUDA] = "cuda",
    [CFG_BACKEND_SIM] = "sim",
    [CFG_BACKEND_CPU] = "cpu",
};
static const char *const policy_names[CFG_POLICY_COUNT + 1] = {
    [CFG_POLICY_SWAP_AWARE] = "swap-aware",
    [CFG_POLICY_FIFO] = "fifo",
};
static const char *const kv_type_names[] = {"f16", "f32", NULL};

const char *cfg_backend_name(cfg_backend_t b)
{
    return (unsigned)b < CFG_BACKEND_COUNT ? backend_names[b] : NULL;
}

const char *cfg_policy_name(cfg_policy_t p)
{
    return (unsigned)p < CFG_POLICY_COUNT ? policy_names[p] : NULL;
}

static int check_sockpath(const void *field, char *why, size_t n);
static int check_hostport(const void *field, char *why, size_t n);
static int check_pow2(const void *field, char *why, size_t n);
static int check_name(const void *field, char *why, size_t n);
static int check_path(const void *field, char *why, size_t n);
static int check_chat_template(const void *field, char *why, size_t n);
static int check_key_hash(const void *field, char *why, size_t n);
static int check_ip(const void *field, char *why, size_t n);

#define C(f) offsetof(cfg_t, f)
#define M(f) offsetof(cfg_model_t, f)
#define SAMPLER_OPT_F32 OPT_FLOAT
#define SAMPLER_OPT_I32 OPT_I32
#define K(f) offsetof(cfg_key_t, f)
#define KiB 1024.0
#define MiB (1024.0 * KiB)
#define GiB (1024.0 * MiB)
#define UNBOUNDED HUGE_VAL
#define SECTION(parent, name)                                                                      \
    {                                                                                              \
        parent, name, OPT_SECTION, 0, NULL, 0, 0, OPT_RELOAD, NULL, NULL, NULL                     \
    }

/* Every option gpuswapd reads. The order here is the order cfg_print writes. */
static const opt_t opts[] = {
    SECTION("", "listen"),
    {"listen", "socket", OPT_STR, C(listen.socket), "/run/gpuswapd/gpuswapd.sock", 0, 0,
     OPT_NULLABLE | OPT_PATH, NULL, check_sockpath, "socket path"},
    {"listen", "mode", OPT_MODE, C(listen.mode), "0660", 0, 0, 0, NULL, NULL, NULL},
    {"listen", "tcp", OPT_STR, C(listen.tcp), NULL, 0, 0, OPT_NULLABLE, NULL, check_hostport,
     "address"},
    {"listen", "http", OPT_STR, C(listen.http), NULL, 0, 0, OPT_NULLABLE, NULL, check_hostport,
     "address"},
    {"listen", "max_line", OPT_SIZE, C(listen.max_line), "1MiB", 1 * KiB, 1 * GiB, 0, NULL, NULL,
     NULL},
    {"listen", "max_connections", OPT_U32, C(listen.max_connections), "1024", 1, 1000000, 0, NULL,
     NULL, NULL},
    {"listen", "drain_linger", OPT_DURATION, C(listen.drain_linger_ms), "0", 0, 3600000, OPT_RELOAD,
     NULL, NULL, NULL},

    SECTION("", "admin"),
    {"admin", "socket", OPT_STR, C(admin.socket), "/run/gpuswapd/admin.sock", 0, 0,
     OPT_NULLABLE | OPT_PATH, NULL, check_sockpath, "socket path"},
    {"admin", "mode", OPT_MODE, C(admin.mode), "0600", 0, 0, 0, NULL, NULL, NULL},
    {"admin", "uids", OPT_IDLIST, C(admin.uids), NULL, 0, 0, OPT_RELOAD, NULL, NULL, NULL},
    {"admin", "gids", OPT_IDLIST, C(admin.gids), NULL, 0, 0, OPT_RELOAD, NULL, NULL, NULL},

    SECTION("", "device"),
    {"device", "backend", OPT_ENUM, C(device.backend), "auto", 0, 0, 0, backend_names, NULL, NULL},
    {"device", "gpu", OPT_I32, C(device.gpu), "0", 0, 1023, 0, NULL, NULL, NULL},
    {"device", "memory", OPT_SIZE, C(device.memory), "0", 0, UNBOUNDED, 0, NULL, NULL, NULL},
    {"device", "page_size", OPT_SIZE, C(device.page_size), "2MiB", 4 * KiB, 1 * GiB, 0, NULL,
     check_pow2, NULL},
    {"device", "sim_bandwidth", OPT_RATE, C(device.sim_bandwidth), "0", 0, UNBOUNDED, 0, NULL, NULL,
     NULL},
    {"device", "sim_load_bandwidth", OPT_RATE, C(device.sim_load_bandwidth), "0", 0, UNBOUNDED, 0,
     NULL, NULL, NULL},
    {"device", "threads", OPT_U32, C(device.threads), "0", 0, 4096, 0, NULL, NULL, NULL},
    {"device", "copy_timeout", OPT_DURATION, C(device.copy_timeout_ms), "30s", 1, 3600000, 0, NULL,
     NULL, NULL},
    {"device", "fault_injection", OPT_BOOL, C(device.fault_injection), "false", 0, 0, 0, NULL, NULL,
     NULL},
    {"device", "prefill_chunk", OPT_U32, C(device.prefill_chunk), "512", 1, 1048576, 0, NULL, NULL,
     NULL},

    SECTION("", "host"),
    {"host", "memory", OPT_SIZE, C(host.memory), "0", 0, UNBOUNDED, OPT_RELOAD, NULL, NULL, NULL},

    SECTION("", "scheduler"),
    {"scheduler", "policy", OPT_ENUM, C(scheduler.policy), "swap-aware", 0, 0, OPT_RELOAD,
     policy_names, NULL, NULL},
    {"scheduler", "max_batch", OPT_U32, C(scheduler.max_batch), "16", 1, 4096, OPT_RELOAD, NULL,
     NULL, NULL},
    {"scheduler", "max_wait", OPT_DURATION, C(scheduler.max_wait_ms), "2s", 1, 3600000, OPT_RELOAD,
     NULL, NULL, NULL},
    {"scheduler", "max_stall", OPT_DURATION, C(scheduler.max_stall_ms), "500ms", 1, 3600000,
     OPT_RELOAD, NULL, NULL, NULL},
    {"scheduler", "quantum", OPT_DOUBLE, C(scheduler.quantum), "4", 0, 1000,
     OPT_RELOAD | OPT_LO_OPEN, NULL, NULL, NULL},
    {"scheduler", "queue_limit", OPT_U32, C(scheduler.queue_limit), "256", 1, 1000000, OPT_RELOAD,
     NULL, NULL, NULL},
    {"scheduler", "max_queued", OPT_U32, C(scheduler.max_queued), "4096", 1, 10000000, OPT_RELOAD,
     NULL, NULL, NULL},
    {"scheduler", "drain_timeout", OPT_DURATION, C(scheduler.drain_timeout_ms), "30s", 0, 3600000,
     OPT_RELOAD, NULL, NULL, NULL},

    SECTION("", "metrics"),
    {"metrics", "listen", OPT_STR, C(metrics.listen), NULL, 0, 0, OPT_NULLABLE, NULL,
     check_hostport, "address"},
    {"metrics", "vllm_compat", OPT_BOOL, C(metrics.vllm_compat), "false", 0, 0, 0, NULL, NULL,
     NULL},

    SECTION("", "log"),
    {"log", "level", OPT_ENUM, C(log.level), "info", 0, 0, OPT_RELOAD, log_level_names, NULL, NULL},

    SECTION("", "auth"),
    {"auth", "http", OPT_BOOL, C(auth.http), "false", 0, 0, 0, NULL, NULL, NULL},
    {"auth", "tcp", OPT_BOOL, C(auth.tcp), "false", 0, 0, 0, NULL, NULL, NULL},
    {"auth", "trusted_proxies", OPT_STRLIST, C(auth.trusted_proxies), NULL, 0, 0, OPT_RELOAD, NULL,
     check_ip, "address"},
    {"auth", "max_failures", OPT_U32, C(auth.max_failures), "5", 1, 1000000, OPT_RELOAD, NULL, NULL,
     NULL},
    {"auth", "backoff", OPT_DURATION, C(auth.backoff_ms), "1s", 1, 3600000, OPT_RELOAD, NULL, NULL,
     NULL},
    {"auth", "keys", OPT_KEYS, 0, NULL, 0, 0, OPT_RELOAD, NULL, NULL, NULL},
    {"auth.keys", "name", OPT_STR, K(name), NULL, 0, 0, 0, NULL, check_name, "key name"},
    {"auth.keys", "hash", OPT_STR, K(hash), NULL, 0, 0, 0, NULL, check_key_hash, "key hash"},
    {"auth.keys", "models", OPT_STRLIST, K(models), NULL, 0, 0, 0, NULL, NULL, "model name"},
    {"auth.keys", "rate", OPT_DOUBLE, K(rate), "0", 0, 1000000, 0, NULL, NULL, NULL},
    {"auth.keys", "burst", OPT_U32, K(burst), "0", 0, 1000000, 0, NULL, NULL, NULL},
    {"auth.keys", "max_concurrent", OPT_U32, K(max_concurrent), "0", 0, 1000000, 0, NULL, NULL,
     NULL},
    {"auth.keys", "tokens_per_minute", OPT_U32, K(tokens_per_minute), "0", 0, 1000000000, 0, NULL,
     NULL, NULL},

    {"", "models", OPT_MODELS, 0, NULL, 0, 0, OPT_RELOAD, NULL, NULL, NULL},
    {"models", "name", OPT_STR, M(name), NULL, 0, 0, 0, NULL, check_name, "model name"},
    {"models", "path", OPT_STR, M(path), NULL, 0, 0, OPT_PATH, NULL, check_path, "path"},
    {"models", "gpu_quota", OPT_SIZE, M(gpu_quota), "0", 0, UNBOUNDED, 0, NULL, NULL, NULL},
    {"models", "kv_cache", OPT_SIZE, M(kv_cache), "0", 0, UNBOUNDED, 0, NULL, NULL, NULL},
    {"models", "kv_type", OPT_ENUM, M(kv_type), "f16", 0, 0, 0, kv_type_names, NULL, NULL},
    {"models", "priority", OPT_DOUBLE, M(priority), "1", 0, 1000, OPT_LO_OPEN, NULL, NULL, NULL},
    {"models", "pinned", OPT_BOOL, M(pinned), "false", 0, 0, 0, NULL, NULL, NULL},
    {"models", "max_batch", OPT_U32, M(max_batch), NULL /* scheduler.max_batch */, 1, 4096, 0, NULL,
     NULL, NULL},
    {"models", "max_context", OPT_U32, M(max_context), "4096", 1, 1048576, 0, NULL, NULL, NULL},
    {"models", "chat_template", OPT_STR, M(chat_template), NULL, 0, 0, OPT_NULLABLE, NULL,
     check_chat_template, "chat template"},
    SECTION("models", "defaults"),
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    {"models.defaults",                                                                            \
     #name,                                                                                        \
     SAMPLER_OPT_##kind,                                                                           \
     M(defaults.name),                                                                             \
     #def,                                                                                         \
     lo,                                                                                           \
     hi,                                                                                           \
     ((bounds)&SAMPLER_LO_OPEN ? OPT_LO_OPEN : 0) | ((bounds)&SAMPLER_HI_OPEN ? OPT_HI_OPEN : 0),  \
     NULL,                                                                                         \
     NULL,                                                                                         \
     NULL},
    SAMPLER_PARAMS(X)
#undef X
        {"models.defaults", "max_tokens", OPT_I32, M(defaults.max_tokens), "256", 1, 1048576, 0,
         NULL, NULL, NULL},
};

#define N_OPTS (sizeof opts / sizeof opts[0])

_Static_assert(sizeof(cfg_backend_t) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(cfg_policy_t) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(cfg_kv_type_t) == sizeof(int), "enums are stored as int");

static bool opt_is_model(const opt_t *o)
{
    return strncmp(o->section, "models", 6) == 0;
}

/* Which struct an option lives in: cfg_t, a cfg_model_t or a cfg_key_t. */
enum {
    OPT_KIND_TOP = 0,
    OPT_KIND_MODEL = 1,
    OPT_KIND_KEY = 2
};
static int opt_kind(const opt_t *o)
{
    if (opt_is_model(o))
        return OPT_KIND_MODEL;
    return strncmp(o->section, "auth.keys", 9) == 0 ? OPT_KIND_KEY : OPT_KIND_TOP;
}

/* Index of the option key in section, or -1. */
static int opt_find(const char *section, const char *key)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strcmp(opts[i].section, section) == 0 && strcmp(opts[i].key, key) == 0)
            return (int)i;
    return -1;
}

/* ------------------------------------------------------------------ small helpers */

/* Copies s into buf for a message: at most 60 bytes, control bytes as '?'. */
static const char *sanitize(const char *s, char *buf, size_t n)
{
    size_t max = n - 1 < 60 ? n - 1 : 60, j = 0;
    for (size_t i = 0; s[i] && j < max; i++)
        buf[j++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (strlen(s) > max && max >= 3)
        memcpy(buf + max - 3, "...", 3);
    buf[j] = 0;
    return buf;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ value parsers */

static const struct unit {
    const char *name;
    uint64_t mult;
} size_units[] = {
    {"", 1},
    {"B", 1},
    {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},
    {"GiB", 1ull << 30},
    {"TiB", 1ull << 40},
};

static const struct unit duration_units[] = {
    {"ms", 1},
    {"s", 1000},
    {"m", 60000},
    {"h", 3600000},
};

/* Parses "<digits>[.<digits>]<unit>" with units from a table into an exact
 * integer count of the base unit. Returns 0, or CFG_ERR_INVALID with why set:
 * 1 = syntax or unit, 2 = negative, 3 = too large, 4 = not whole, 5 = no unit. */
static int parse_scaled(const char *s, const struct unit *units, size_t n_units, uint64_t *out,
                        int *why)
{
    const char *p = s;
    if (*p == '-') {
        *why = 2;
        return CFG_ERR_INVALID;
    }
    if (!(*p >= '0' && *p <= '9')) {
        *why = 1;
        return CFG_ERR_INVALID;
    }
    uint64_t ip = 0;
    bool big = false;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t dgt = (uint64_t)(*p - '0');
        if (big || ip > (UINT64_MAX - dgt) / 10)
            big = true;
        else
            ip = ip * 10 + dgt;
    }
    uint64_t frac = 0, fden = 1;
    bool frac_lost = false;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) {
            *why = 1;
            return CFG_ERR_INVALID;
        }
        for (int nd = 0; *p >= '0' && *p <= '9'; p++, nd++) {
            if (nd < 18) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                fden *= 10;
            } else if (*p != '0') {
                frac_lost = true;
            }
        }
    }
    while (*p == ' ')
        p++;
    const struct unit *u = NULL;
    for (size_t i = 0; i < n_units; i++)
        if (strcmp(p, units[i].name) == 0)
            u = &units[i];
    if (!u) {
        *why = 1;
        return CFG_ERR_INVALID;
    }
    if (big) {
        *why = 3;
        return CFG_ERR_INVALID;
    }
    unsigned __int128 f = (unsigned __int128)frac * u->mult;
    if (frac_lost || f % fden) {
        *why = 4;
        return CFG_ERR_INVALID;
    }
    unsigned __int128 v = (unsigned __int128)ip * u->mult + f / fden;
    if (v > UINT64_MAX) {
        *why = 3;
        return CFG_ERR_INVALID;
    }
    *out = (uint64_t)v;
    return 0;
}

/* "GB", "g", "Mb"...: spellings we refuse to guess the meaning of. */
static bool size_unit_ambiguous(const char *unit)
{
    static const char *const amb[] = {"k", "m", "g", "t", "kb", "mb", "gb", "tb", "b"};
    if (strcmp(unit, "B") == 0)
        return false;
    for (size_t i = 0; i < sizeof amb / sizeof amb[0]; i++)
        if (strcasecmp(unit, amb[i]) == 0)
            return true;
    return false;
}

int cfg_parse_size(const char *s, uint64_t *out, char *err, size_t errlen)
{
    int why = 0;
    if (parse_scaled(s, size_units, sizeof size_units / sizeof size_units[0], out, &why) == 0)
        return 0;
    const char *unit = s;
    while (*unit == '-' || *unit == '.' || (*unit >= '0' && *unit <= '9') || *unit == ' ')
        unit++;
    switch (why) {
    case 2: set_err(err, errlen, "sizes cannot be negative"); break;
    case 3: set_err(err, errlen, "too large: at most 16EiB - 1"); break;
    case 4: set_err(err, errlen, "not a whole number of bytes"); break;
    default:
        if (unit != s && size_unit_ambiguous(unit))
            set_err(err, errlen, "use B, KiB, MiB, GiB, TiB; '%.8s' is ambiguous", unit);
        else
            set_err(err, errlen, "use B, KiB, MiB, GiB, TiB");
    }
    return CFG_ERR_INVALID;
}

int cfg_parse_duration_ms(const char *s, uint64_t *out_ms, char *err, size_t errlen)
{
    int why = 0;
    static const struct unit zero[] = {{"", 0}};
    uint64_t v = 0;
    if (parse_scaled(s, duration_units, sizeof duration_units / sizeof duration_units[0], out_ms,
                     &why) == 0)
        return 0;
    if (why == 1 &&
        parse_scaled(s, zero, 1, &v, &why) == 0) { /* a bare number: only 0 needs no unit */
        if (strspn(s, "0.") == strlen(s)) {
            *out_ms = 0;
            return 0;
        }
        why = 5;
    }
    switch (why) {
    case 2: set_err(err, errlen, "durations cannot be negative"); break;
    case 3: set_err(err, errlen, "too large"); break;
    case 4: set_err(err, errlen, "not a whole number of milliseconds"); break;
    case 5: set_err(err, errlen, "missing unit: use ms, s, m, h, e.g. 250ms, 1.5s"); break;
    default: set_err(err, errlen, "use ms, s, m, h, e.g. 250ms, 1.5s");
    }
    return CFG_ERR_INVALID;
}

char *cfg_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes && u < 4 && bytes % 1024 == 0) {
        bytes /= 1024;
        u++;
    }
    if (bytes == 0)
        snprintf(buf, len, "0");
    else
        snprintf(buf, len, "%llu%s", (unsigned long long)bytes, names[u]);
    return buf;
}

char *cfg_format_duration_ms(uint64_t ms, char *buf, size_t len)
{
    if (ms == 0)
        snprintf(buf, len, "0");
    else if (ms % 3600000 == 0)
        snprintf(buf, len, "%lluh", (unsigned long long)(ms / 3600000));
    else if (ms % 60000 == 0)
        snprintf(buf, len, "%llum", (unsigned long long)(ms / 60000));
    else if (ms % 1000 == 0)
        snprintf(buf, len, "%llus", (unsigned long long)(ms / 1000));
    else
        snprintf(buf, len, "%llums", (unsigned long long)ms);
    return buf;
}

/* Decimal integer, optional '-', nothing else. 0, or 1 = syntax, 2 = range. */
static int parse_i64(const char *s, int64_t *v)
{
    const char *p = s + (*s == '-');
    if (!*p || strspn(p, "0123456789") != strlen(p))
        return 1;
    errno = 0;
    long long x = strtoll(s, NULL, 10);
    if (errno == ERANGE)
        return 2;
    *v = x;
    return 0;
}

/* A finite decimal number (no hex, inf or nan). 0, 1 = syntax, 2 = range. */
static int parse_double(const char *s, double *v, bool is_float)
{
    if (!*s || strspn(s, "0123456789.eE+-") != strlen(s) || !strpbrk(s, "0123456789"))
        return 1;
    char *end;
    errno = 0;
    double x = is_float ? (double)strtof(s, &end) : strtod(s, &end);
    if (*end)
        return 1;
    if (!isfinite(x))
        return 2;
    *v = x;
    return 0;
}

/* ------------------------------------------------------------------ string checks */

static int check_sockpath(const void *field, char *why, size_t n)
{
    const char *s = *(char *const *)field;
    if (strlen(s) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        snprintf(why, n, "longer than %zu bytes", sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
        return -1;
    }
    return 0;
}

/* The syntax is hostport.h's, the same as `gpuswap fleet` checks. */
static int check_hostport(const void *field, char *why, size_t n)
{
    return hostport_check(*(char *const *)field, why, n) ? -1 : 0;
}

static int check_pow2(const void *field, char *why, size_t n)
{
    uint64_t v = *(const uint64_t *)field;
    if (v & (v - 1)) {
        snprintf(why, n, "must be a power of two");
        return -1;
    }
    return 0;
}

static int check_name(const void *field, char *why, size_t n)
{
    const char *s = *(char *const *)field;
    size_t len = strlen(s);
    if (len == 0 || len > 128 ||
        strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") != len) {
        snprintf(why, n, "use 1 to 128 letters, digits and . _ : -");
        return -1;
    }
    return 0;
}

static int check_path(const void *field, char *why, size_t n)
{
    const char *s = *(char *const *)field;
    if (!*s || strlen(s) > 4095) {
        snprintf(why, n, "must be 1 to 4095 bytes");
        return -1;
    }
    return 0;
}

static int check_key_hash(const void *field, char *why, size_t n)
{
    const char *s = *(char *const *)field;
    if (keyhash_parse(s, NULL)) {
        snprintf(why, n, "use sha256: and 64 lower-case hex digits, as `gpuswap keygen` prints");
        return -1;
    }
    return 0;
}

static int check_ip(const void *field, char *why, size_t n)
{
    const char *s = *(char *const *)field;
    unsigned char buf[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, s, buf) != 1 && inet_pton(AF_INET6, s, buf) != 1) {
        snprintf(why, n, "use an IPv4 or IPv6 address");
        return -1;
    }
    return 0;
}

static int check_chat_template(const void *field, char *why, size_t n)
{
    const char *s = *(char *const *)field;

    if (chat_family_from_name(s) != CHAT_UNKNOWN)
        return 0;
    snprintf(why, n,
             "not a template name such as chatml, llama3, mistral-v7, gemma, phi3; "
             "config/gpuswapd.yaml lists them all");
    return -1;
}

/* ------------------------------------------------------------------ setting one value */

/* Describes o's bounds for a message, e.g. "between 1 and 4096", "> 0". */
static void fmt_bound(const opt_t *o, double v, char *buf, size_t n)
{
    switch (o->type) {
    case OPT_SIZE:
    case OPT_RATE: cfg_format_size((uint64_t)v, buf, n); break;
    case OPT_DURATION: cfg_format_duration_ms((uint64_t)v, buf, n); break;
    default: snprintf(buf, n, "%.15g", v);
    }
}

static void fmt_bounds(const opt_t *o, char *buf, size_t n)
{
    char lo[32], hi[32];
    fmt_bound(o, o->lo, lo, sizeof lo);
    fmt_bound(o, o->hi, hi, sizeof hi);
    const char *lop = o->flags & OPT_LO_OPEN ? ">" : ">=",
               *hip = o->flags & OPT_HI_OPEN ? "<" : "<=";
    if (o->hi == UNBOUNDED)
        snprintf(buf, n, "must be %s %s", lop, lo);
    else if (!(o->flags & (OPT_LO_OPEN | OPT_HI_OPEN)))
        snprintf(buf, n, "must be between %s and %s", lo, hi);
    else
        snprintf(buf, n, "must be %s %s and %s %s", lop, lo, hip, hi);
}

static bool in_bounds(const opt_t *o, double v)
{
    if (o->flags & OPT_LO_OPEN ? v <= o->lo : v < o->lo)
        return false;
    if (o->hi == UNBOUNDED)
        return true;
    return o->flags & OPT_HI_OPEN ? v < o->hi : v <= o->hi;
}

/* text, or dir/text for a relative OPT_PATH value when dir is set; NULL when out of memory. */
static char *opt_path_join(const opt_t *o, const char *dir, const char *text)
{
    if (!(o->flags & OPT_PATH) || !dir || text[0] == '/')
        return strdup(text);
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, text) < 0 ? NULL : p;
}

/* Parses text into the field of option o (name is its full dotted name, for
 * messages). null: the YAML value was empty/~/null. dir: the directory that
 * relative OPT_PATH values are taken from (NULL: as written). Returns 0, or an
 * error code with the reason (no location) in msg. */
static int opt_set(const opt_t *o, const char *text, bool null, void *field, const char *name,
                   const char *dir, char *msg, size_t n)
{
    char val[64], why[160];
    sanitize(text, val, sizeof val);
    why[0] = 0;
    if (null && o->type == OPT_STR && (o->flags & OPT_NULLABLE)) {
        free(*(char **)field);
        *(char **)field = NULL;
        return 0;
    }
    if (null) {
        snprintf(msg, n, "missing value for %s", name);
        return CFG_ERR_INVALID;
    }
    double num = 0; /* the value as a number, for the bounds check */
    switch (o->type) {
    case OPT_STR: {
        if (!*text && (o->flags & OPT_NULLABLE)) {
            free(*(char **)field);
            *(char **)field = NULL;
            return 0;
        }
        char *copy = opt_path_join(o, dir, text);
        if (!copy) {
            snprintf(msg, n, "out of memory");
            return CFG_ERR_NOMEM;
        }
        if (o->check && o->check(&copy, why, sizeof why)) {
            snprintf(msg, n, "invalid %s \"%s\" for %s (%s)", o->what ? o->what : "value", val,
                     name, why);
            free(copy);
            return CFG_ERR_INVALID;
        }
        free(*(char **)field);
        *(char **)field = copy;
        return 0;
    }
    case OPT_MODE: {
        size_t len = strlen(text);
        if (len == 0 || len > 4 || strspn(text, "01234567") != len) {
            snprintf(msg, n, "invalid mode \"%s\" for %s (use an octal string such as \"0660\")",
                     val, name);
            return CFG_ERR_INVALID;
        }
        unsigned m = (unsigned)strtoul(text, NULL, 8);
        if (m > 0777) {
            snprintf(msg, n, "invalid mode \"%s\" for %s (at most 0777)", val, name);
            return CFG_ERR_INVALID;
        }
        memcpy(field, &m, sizeof m);
        return 0;
    }
    case OPT_SIZE:
    case OPT_RATE: {
        char buf[80];
        const char *t = text;
        size_t len = strlen(text);
        if (o->type == OPT_RATE && len >= 2 && len < sizeof buf &&
            strcmp(text + len - 2, "/s") == 0) {
            memcpy(buf, text, len - 2);
            buf[len - 2] = 0;
            t = buf;
        }
        uint64_t v;
        if (cfg_parse_size(t, &v, why, sizeof why)) {
            snprintf(msg, n, "invalid %s \"%s\" for %s (%s%s)",
                     o->type == OPT_RATE ? "rate" : "size", val, name, why,
                     o->type == OPT_RATE ? ", per second" : "");
            return CFG_ERR_INVALID;
        }
        memcpy(field, &v, sizeof v);
        num = (double)v;
        break;
    }
    case OPT_DURATION: {
        uint64_t v;
        if (cfg_parse_duration_ms(text, &v, why, sizeof why)) {
            snprintf(msg, n, "invalid duration \"%s\" for %s (%s)", val, name, why);
            return CFG_ERR_INVALID;
        }
        memcpy(field, &v, sizeof v);
        num = (double)v;
        break;
    }
    case OPT_U32:
    case OPT_I32: {
        int64_t v = 0;
        int r = parse_i64(text, &v);
        if (r == 1) {
            snprintf(msg, n, "invalid integer \"%s\" for %s", val, name);
            return CFG_ERR_INVALID;
        }
        num = r == 2 ? (text[0] == '-' ? -HUGE_VAL : HUGE_VAL) : (double)v;
        if (in_bounds(o, num)) { /* every U32/I32 bound lies inside its type */
            if (o->type == OPT_U32) {
                uint32_t u = (uint32_t)v;
                memcpy(field, &u, sizeof u);
            } else {
                int32_t i = (int32_t)v;
                memcpy(field, &i, sizeof i);
            }
        }
        break;
    }
    case OPT_DOUBLE:
    case OPT_FLOAT: {
        int r = parse_double(text, &num, o->type == OPT_FLOAT);
        if (r == 1) {
            snprintf(msg, n, "invalid number \"%s\" for %s", val, name);
            return CFG_ERR_INVALID;
        }
        if (r == 2)
            num = HUGE_VAL;
        if (o->type == OPT_DOUBLE) {
            memcpy(field, &num, sizeof num);
        } else {
            float f = (float)num;
            memcpy(field, &f, sizeof f);
        }
        break;
    }
    case OPT_BOOL: {
        int b;
        if (strcasecmp(text, "true") == 0 || strcasecmp(text, "yes") == 0) {
            b = 1;
        } else if (strcasecmp(text, "false") == 0 || strcasecmp(text, "no") == 0) {
            b = 0;
        } else {
            snprintf(msg, n, "invalid boolean \"%s\" for %s (use true, false, yes, no)", val, name);
            return CFG_ERR_INVALID;
        }
        memcpy(field, &b, sizeof b);
        return 0;
    }
    case OPT_ENUM: {
        for (int i = 0; o->names[i]; i++) {
            if (strcmp(text, o->names[i]) == 0) {
                memcpy(field, &i, sizeof i);
                return 0;
            }
        }
        int len = 0;
        char list[96];
        list[0] = 0;
        for (int i = 0; o->names[i]; i++)
            len +=
                snprintf(list + len, sizeof list - (size_t)len, "%s%s", i ? ", " : "", o->names[i]);
        snprintf(msg, n, "invalid value \"%s\" for %s (use %s)", val, name, list);
        return CFG_ERR_INVALID;
    }
    default: snprintf(msg, n, "internal: %s is not a scalar option", name); return CFG_ERR_INVALID;
    }
    if (!in_bounds(o, num)) {
        char b[96];
        fmt_bounds(o, b, sizeof b);
        snprintf(msg, n, "invalid value \"%s\" for %s (%s)", val, name, b);
        return CFG_ERR_INVALID;
    }
    if (o->check && o->check(field, why, sizeof why)) {
        snprintf(msg, n, "invalid value \"%s\" for %s (%s)", val, name, why);
        return CFG_ERR_INVALID;
    }
    return 0;
}

/* Sets every option of one kind (OPT_KIND_*: top level, model, key) that has a default. */
static int apply_defaults(int kind, void *base, char *err, size_t errlen)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (opt_kind(o) != kind || !o->def)
            continue;
        char msg[256];
        int rc = opt_set(o, o->def, false, (char *)base + o->off, o->key, NULL, msg, sizeof msg);
        if (rc) {
            set_err(err, errlen, "internal: default of %s.%s: %s", o->section, o->key, msg);
            return rc;
        }
    }
    return 0;
}

static void free_fields(int kind, void *base)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (opt_kind(o) != kind)
            continue;
        void *f = (char *)base + o->off;
        if (o->type == OPT_STR) {
            free(*(char **)f);
            *(char **)f = NULL;
        } else if (o->type == OPT_IDLIST) {
            cfg_idlist_t *l = f;
            free(l->ids);
            l->ids = NULL;
            l->n = 0;
        } else if (o->type == OPT_STRLIST) {
            cfg_strlist_t *l = f;
            for (size_t k = 0; k < l->n; k++)
                free(l->v[k]);
            free(l->v);
            l->v = NULL;
            l->n = 0;
        }
    }
}

/* ------------------------------------------------------------------ loader */

typedef struct mark {
    int line, col; /* 1-based; line 0 = not set */
} mark_t;

typedef struct ld {
    const char *file;
    const char
        *dir; /* the config file's directory, absolute: relative paths start there; NULL = cwd */
    yaml_document_t *doc;
    cfg_t *c;
    char *err;
    size_t errlen;
    mark_t root;
    mark_t top[N_OPTS]; /* where each top-level option's value is */
    mark_t *model;      /* n_models x N_OPTS: where each model option's value is */
    mark_t *model_at;   /* n_models: where each model entry starts */
    mark_t *key;        /* n_keys x N_OPTS: where each key option's value is */
    mark_t *key_at;     /* n_keys: where each key entry starts */
} ld_t;

static mark_t mark_of(const yaml_node_t *n)
{
    return (mark_t){(int)n->start_mark.line + 1, (int)n->start_mark.column + 1};
}

static int ld_fail(ld_t *ld, mark_t m, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ld_fail(ld_t *ld, mark_t m, int code, const char *fmt, ...)
{
    if (!ld->err || !ld->errlen)
        return code;
    int k = snprintf(ld->err, ld->errlen, "%s:%d:%d: ", ld->file, m.line, m.col);
    if (k >= 0 && (size_t)k < ld->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ld->err + k, ld->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return code;
}

static bool node_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = (const char *)n->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

/* "a mapping", "a list", "\"abc\"" or "nothing", for type-mismatch messages. */
static const char *describe(const yaml_node_t *n, char *buf, size_t len)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (node_is_null(n))
        return "nothing";
    char v[64];
    snprintf(buf, len, "\"%s\"", sanitize((const char *)n->data.scalar.value, v, sizeof v));
    return buf;
}

/* Optimal string alignment distance (edits and transpositions), for "did you mean". */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    size_t d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = a[i - 1] != b[j - 1];
            size_t v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

static int unknown_key(ld_t *ld, const yaml_node_t *k, const char *section, const char *where)
{
    const char *key = (const char *)k->data.scalar.value;
    char kb[64], in[96], hint[128];
    sanitize(key, kb, sizeof kb);
    if (*where)
        snprintf(in, sizeof in, "in %s", where);
    else
        snprintf(in, sizeof in, "at the top level");
    hint[0] = 0;
    const opt_t *best = NULL;
    size_t bestd = 3;
    for (size_t i = 0; i < N_OPTS; i++) {
        if (strcmp(opts[i].section, section))
            continue;
        size_t d = edit_distance(key, opts[i].key);
        if (d < bestd && d < strlen(key)) {
            best = &opts[i];
            bestd = d;
        }
    }
    if (best) {
        snprintf(hint, sizeof hint, " (did you mean '%s'?)", best->key);
    } else {
        for (size_t i = 0; i < N_OPTS; i++) {
            if (strcmp(opts[i].key, key) || !strcmp(opts[i].section, section))
                continue;
            const char *s = opts[i].section;
            if (!*s)
                snprintf(hint, sizeof hint, " ('%s' belongs at the top level)", opts[i].key);
            else if (opt_is_model(&opts[i]))
                snprintf(hint, sizeof hint, " ('%s' belongs in each models[] entry%s)", opts[i].key,
                         s[6] ? ", under defaults" : "");
            else
                snprintf(hint, sizeof hint, " (did you mean '%s.%s'?)", s, opts[i].key);
            break;
        }
    }
    return ld_fail(ld, mark_of(k), CFG_ERR_INVALID, "unknown key '%s' %s%s", kb, in, hint);
}

static int load_map(ld_t *ld, yaml_node_t *map, const char *section, const char *where, void *base,
                    mark_t *marks);

static int load_idlist(ld_t *ld, yaml_node_t *v, const char *name, cfg_idlist_t *l)
{
    char d[80];
    if (node_is_null(v))
        return 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "expected a list of ids for %s, got %s",
                       name, describe(v, d, sizeof d));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    uint32_t *ids = n ? calloc(n, sizeof *ids) : NULL;
    if (n && !ids)
        return ld_fail(ld, mark_of(v), CFG_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        int64_t x = -1;
        if (it->type != YAML_SCALAR_NODE || parse_i64((const char *)it->data.scalar.value, &x) ||
            x < 0 || x > 4294967294LL) {
            free(ids);
            return ld_fail(ld, mark_of(it), CFG_ERR_INVALID,
                           "invalid id %s in %s[%zu] (use a number 0..4294967294)",
                           describe(it, d, sizeof d), name, i);
        }
        ids[i] = (uint32_t)x;
    }
    free(l->ids);
    l->ids = ids;
    l->n = n;
    return 0;
}

static int load_strlist(ld_t *ld, yaml_node_t *v, const opt_t *o, const char *name,
                        cfg_strlist_t *l)
{
    char d[80], val[64], why[160];
    if (node_is_null(v))
        return 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "expected a list for %s, got %s", name,
                       describe(v, d, sizeof d));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    char **strs = n ? calloc(n, sizeof *strs) : NULL;
    if (n && !strs)
        return ld_fail(ld, mark_of(v), CFG_ERR_NOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        const char *text =
            it->type == YAML_SCALAR_NODE ? (const char *)it->data.scalar.value : NULL;
        if (!text || node_is_null(it) || !*text || strlen(text) != it->data.scalar.length) {
            rc = ld_fail(ld, mark_of(it), CFG_ERR_INVALID,
                         "invalid %s %s in %s[%zu] (use a non-empty string)",
                         o->what ? o->what : "value", describe(it, d, sizeof d), name, i);
        } else if (!(strs[i] = strdup(text))) {
            rc = ld_fail(ld, mark_of(it), CFG_ERR_NOMEM, "out of memory");
        } else if (o->check && o->check(&strs[i], why, sizeof why)) {
            rc =
                ld_fail(ld, mark_of(it), CFG_ERR_INVALID, "invalid %s \"%s\" in %s[%zu] (%s)",
                        o->what ? o->what : "value", sanitize(text, val, sizeof val), name, i, why);
        }
    }
    if (rc) {
        for (size_t i = 0; i < n; i++)
            free(strs[i]);
        free(strs);
        return rc;
    }
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = strs;
    l->n = n;
    return 0;
}

static int load_keys(ld_t *ld, yaml_node_t *v)
{
    char d[80];
    cfg_t *c = ld->c;
    if (node_is_null(v))
        return 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID,
                       "expected a list of keys for auth.keys, got %s", describe(v, d, sizeof d));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0)
        return 0;
    c->auth.keys = calloc(n, sizeof *c->auth.keys);
    ld->key = calloc(n * N_OPTS, sizeof *ld->key);
    ld->key_at = calloc(n, sizeof *ld->key_at);
    if (!c->auth.keys || !ld->key || !ld->key_at)
        return ld_fail(ld, mark_of(v), CFG_ERR_NOMEM, "out of memory");
    c->auth.n_keys = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        cfg_key_t *k = &c->auth.keys[i];
        char where[32];
        snprintf(where, sizeof where, "auth.keys[%zu]", i);
        ld->key_at[i] = mark_of(it);
        k->line = ld->key_at[i].line;
        if (it->type != YAML_MAPPING_NODE)
            return ld_fail(ld, mark_of(it), CFG_ERR_INVALID, "expected a mapping for %s, got %s",
                           where, describe(it, d, sizeof d));
        int rc = apply_defaults(OPT_KIND_KEY, k, ld->err, ld->errlen);
        if (rc)
            return rc;
        rc = load_map(ld, it, "auth.keys", where, k, &ld->key[i * N_OPTS]);
        if (rc)
            return rc;
    }
    return 0;
}

static int load_models(ld_t *ld, yaml_node_t *v)
{
    char d[80];
    cfg_t *c = ld->c;
    if (v->type != YAML_SEQUENCE_NODE)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID,
                       "expected a list of models for models, got %s", describe(v, d, sizeof d));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "models must list at least one model");
    c->models = calloc(n, sizeof *c->models);
    ld->model = calloc(n * N_OPTS, sizeof *ld->model);
    ld->model_at = calloc(n, sizeof *ld->model_at);
    if (!c->models || !ld->model || !ld->model_at)
        return ld_fail(ld, mark_of(v), CFG_ERR_NOMEM, "out of memory");
    c->n_models = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        cfg_model_t *m = &c->models[i];
        char where[32];
        snprintf(where, sizeof where, "models[%zu]", i);
        ld->model_at[i] = mark_of(it);
        m->line = ld->model_at[i].line;
        if (it->type != YAML_MAPPING_NODE)
            return ld_fail(ld, mark_of(it), CFG_ERR_INVALID, "expected a mapping for %s, got %s",
                           where, describe(it, d, sizeof d));
        int rc = apply_defaults(true, m, ld->err, ld->errlen);
        if (rc)
            return rc;
        rc = load_map(ld, it, "models", where, m, &ld->model[i * N_OPTS]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Loads the pairs of map, a mapping for section (e.g. "device",
 * "models.defaults"), into base; where is its display name ("device",
 * "models[2].defaults", "" at the top); marks records where each option was set. */
static int load_map(ld_t *ld, yaml_node_t *map, const char *section, const char *where, void *base,
                    mark_t *marks)
{
    char d[80];
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(ld->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(ld->doc, p->value);
        if (k->type != YAML_SCALAR_NODE)
            return ld_fail(ld, mark_of(k), CFG_ERR_INVALID, "expected a key %s%s, got %s",
                           *where ? "in " : "at the top level", where, describe(k, d, sizeof d));
        int i = opt_find(section, (const char *)k->data.scalar.value);
        if (i < 0)
            return unknown_key(ld, k, section, where);
        const opt_t *o = &opts[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s%s", where, *where ? "." : "", o->key);
        if (marks[i].line)
            return ld_fail(ld, mark_of(k), CFG_ERR_INVALID,
                           "duplicate key '%s' %s%s (first set at line %d)", o->key,
                           *where ? "in " : "at the top level", where, marks[i].line);
        marks[i] = mark_of(v);
        int rc;
        switch (o->type) {
        case OPT_SECTION: {
            if (node_is_null(v))
                break;
            if (v->type != YAML_MAPPING_NODE)
                return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "expected a mapping for %s, got %s",
                               name, describe(v, d, sizeof d));
            char child[64];
            snprintf(child, sizeof child, "%s%s%s", section, *section ? "." : "", o->key);
            rc = load_map(ld, v, child, name, base, marks);
            if (rc)
                return rc;
            break;
        }
        case OPT_MODELS:
            rc = load_models(ld, v);
            if (rc)
                return rc;
            break;
        case OPT_IDLIST:
            rc = load_idlist(ld, v, name, (cfg_idlist_t *)((char *)base + o->off));
            if (rc)
                return rc;
            break;
        case OPT_STRLIST:
            rc = load_strlist(ld, v, o, name, (cfg_strlist_t *)((char *)base + o->off));
            if (rc)
                return rc;
            break;
        case OPT_KEYS:
            rc = load_keys(ld, v);
            if (rc)
                return rc;
            break;
        default: {
            if (v->type != YAML_SCALAR_NODE)
                return ld_fail(ld, mark_of(v), CFG_ERR_INVALID,
                               "expected a single value for %s, got %s", name,
                               describe(v, d, sizeof d));
            const char *text = (const char *)v->data.scalar.value;
            if (strlen(text) != v->data.scalar.length)
                return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "value for %s contains a NUL byte",
                               name);
            char msg[384];
            rc = opt_set(o, text, node_is_null(v), (char *)base + o->off, name, ld->dir, msg,
                         sizeof msg);
            if (rc)
                return ld_fail(ld, mark_of(v), rc, "%s", msg);
        }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ cross-field checks */

/* Where option section.key was set, else where its section was, else the file start. */
static mark_t at_top(const ld_t *ld, const char *section, const char *key)
{
    int i = opt_find(section, key);
    if (i >= 0 && ld->top[i].line)
        return ld->top[i];
    i = opt_find("", section);
    if (i >= 0 && ld->top[i].line)
        return ld->top[i];
    return ld->root;
}

static mark_t at_model(const ld_t *ld, size_t mi, const char *section, const char *key)
{
    int i = opt_find(section, key);
    if (i >= 0 && ld->model[mi * N_OPTS + (size_t)i].line)
        return ld->model[mi * N_OPTS + (size_t)i];
    return ld->model_at[mi];
}

static bool model_set(const ld_t *ld, size_t mi, const char *section, const char *key)
{
    int i = opt_find(section, key);
    return i >= 0 && ld->model[mi * N_OPTS + (size_t)i].line != 0;
}

static mark_t at_key(const ld_t *ld, size_t ki, const char *key)
{
    int i = opt_find("auth.keys", key);
    if (i >= 0 && ld->key[ki * N_OPTS + (size_t)i].line)
        return ld->key[ki * N_OPTS + (size_t)i];
    return ld->key_at[ki];
}

/* auth.keys: names and hashes unique, every listed model configured (or "*"). */
static int validate_keys(ld_t *ld)
{
    cfg_t *c = ld->c;
    for (size_t i = 0; i < c->auth.n_keys; i++) {
        cfg_key_t *k = &c->auth.keys[i];
        if (!k->name)
            return ld_fail(ld, ld->key_at[i], CFG_ERR_INVALID,
                           "missing required key 'name' in auth.keys[%zu]", i);
        if (!k->hash)
            return ld_fail(
                ld, ld->key_at[i], CFG_ERR_INVALID,
                "missing required key 'hash' in auth.keys[%zu] ('%s'; `gpuswap keygen` prints one)",
                i, k->name);
        if (k->models.n == 0)
            return ld_fail(
                ld, at_key(ld, i, "models"), CFG_ERR_INVALID,
                "auth.keys[%zu] ('%s') lists no models (name them, or use [\"*\"] for every model)",
                i, k->name);
        for (size_t j = 0; j < i; j++) {
            if (strcmp(c->auth.keys[j].name, k->name) == 0)
                return ld_fail(
                    ld, at_key(ld, i, "name"), CFG_ERR_INVALID,
                    "duplicate key name \"%s\" in auth.keys[%zu] (auth.keys[%zu], line %d, has it too)",
                    k->name, i, j, c->auth.keys[j].line);
            if (strcmp(c->auth.keys[j].hash, k->hash) == 0)
                return ld_fail(ld, at_key(ld, i, "hash"), CFG_ERR_INVALID,
                               "auth.keys[%zu] ('%s') has the same hash as auth.keys[%zu] ('%s')",
                               i, k->name, j, c->auth.keys[j].name);
        }
        for (size_t m = 0; m < k->models.n; m++) {
            const char *name = k->models.v[m];
            if (strcmp(name, "*") == 0 || cfg_find_model(c, name))
                continue;
            char s[64];
            return ld_fail(ld, at_key(ld, i, "models"), CFG_ERR_INVALID,
                           "auth.keys[%zu].models[%zu] \"%s\" is not a configured model", i, m,
                           sanitize(name, s, sizeof s));
        }
    }
    return 0;
}

static int validate(ld_t *ld)
{
    cfg_t *c = ld->c;
    char a[32], b[32], s[64];
    if (c->n_models == 0)
        return ld_fail(
            ld, ld->root, CFG_ERR_INVALID,
            "missing required key 'models' (a list of at least one model, each with a name and a path)");

    /* listeners */
    if (!c->listen.socket && !c->listen.tcp && !c->listen.http)
        return ld_fail(ld, at_top(ld, "listen", "socket"), CFG_ERR_INVALID,
                       "no listener: set listen.socket, listen.tcp or listen.http");
    if (c->listen.tcp && c->listen.http && strcmp(c->listen.tcp, c->listen.http) == 0)
        return ld_fail(ld, at_top(ld, "listen", "http"), CFG_ERR_INVALID,
                       "listen.http \"%s\" is the same address as listen.tcp",
                       sanitize(c->listen.http, s, sizeof s));
    for (int k = 0; c->metrics.listen && k < 2; k++) {
        const char *other = k ? c->listen.tcp : c->listen.http;
        if (other && strcmp(other, c->metrics.listen) == 0)
            return ld_fail(ld, at_top(ld, "metrics", "listen"), CFG_ERR_INVALID,
                           "metrics.listen \"%s\" is the same address as %s",
                           sanitize(c->metrics.listen, s, sizeof s),
                           k ? "listen.tcp" : "listen.http");
    }
    if (c->auth.http && !c->listen.http)
        return ld_fail(ld, at_top(ld, "auth", "http"), CFG_ERR_INVALID,
                       "auth.http requires a key on listen.http, which is off");
    if (c->auth.tcp && !c->listen.tcp)
        return ld_fail(ld, at_top(ld, "auth", "tcp"), CFG_ERR_INVALID,
                       "auth.tcp requires a key on listen.tcp, which is off");
    if (c->listen.socket && c->admin.socket && strcmp(c->listen.socket, c->admin.socket) == 0)
        return ld_fail(ld, at_top(ld, "admin", "socket"), CFG_ERR_INVALID,
                       "admin.socket \"%s\" is the same path as listen.socket",
                       sanitize(c->admin.socket, s, sizeof s));

    /* device */
    uint64_t mem = c->device.memory;
    if (c->device.backend == CFG_BACKEND_SIM && mem == 0) {
        int i = opt_find("device", "memory");
        mark_t m = ld->top[i].line ? ld->top[i] : at_top(ld, "device", "backend");
        return ld_fail(
            ld, m, CFG_ERR_INVALID,
            "device.memory is required for backend sim (the size of the simulated device)");
    }
    if (c->device.fault_injection && c->device.backend != CFG_BACKEND_SIM)
        return ld_fail(ld, at_top(ld, "device", "fault_injection"), CFG_ERR_INVALID,
                       "device.fault_injection is for testing and needs backend sim");
    if (mem && mem % c->device.page_size)
        return ld_fail(ld, at_top(ld, "device", "memory"), CFG_ERR_INVALID,
                       "device.memory %s is not a multiple of device.page_size %s",
                       cfg_format_size(mem, a, sizeof a),
                       cfg_format_size(c->device.page_size, b, sizeof b));

    /* models */
    uint64_t pinned = 0;
    for (size_t i = 0; i < c->n_models; i++) {
        cfg_model_t *m = &c->models[i];
        if (!m->name)
            return ld_fail(ld, ld->model_at[i], CFG_ERR_INVALID,
                           "missing required key 'name' in models[%zu]", i);
        if (!m->path)
            return ld_fail(ld, ld->model_at[i], CFG_ERR_INVALID,
                           "missing required key 'path' in models[%zu] ('%s')", i, m->name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->models[j].name, m->name) == 0)
                return ld_fail(
                    ld, at_model(ld, i, "models", "name"), CFG_ERR_INVALID,
                    "duplicate model name \"%s\" in models[%zu] (models[%zu], line %d, has it too)",
                    m->name, i, j, c->models[j].line);
        if (!model_set(ld, i, "models", "max_batch"))
            m->max_batch = c->scheduler.max_batch;
        m->max_context_set = model_set(ld, i, "models", "max_context");
        if (m->gpu_quota && m->kv_cache > m->gpu_quota)
            return ld_fail(
                ld, at_model(ld, i, "models", "kv_cache"), CFG_ERR_INVALID,
                "models[%zu].kv_cache %s exceeds its gpu_quota %s (the quota covers weights and KV)",
                i, cfg_format_size(m->kv_cache, a, sizeof a),
                cfg_format_size(m->gpu_quota, b, sizeof b));
        if (mem && m->gpu_quota > mem)
            return ld_fail(ld, at_model(ld, i, "models", "gpu_quota"), CFG_ERR_INVALID,
                           "models[%zu].gpu_quota %s exceeds device.memory %s", i,
                           cfg_format_size(m->gpu_quota, a, sizeof a),
                           cfg_format_size(mem, b, sizeof b));
        if (mem && m->kv_cache > mem)
            return ld_fail(ld, at_model(ld, i, "models", "kv_cache"), CFG_ERR_INVALID,
                           "models[%zu].kv_cache %s exceeds device.memory %s", i,
                           cfg_format_size(m->kv_cache, a, sizeof a),
                           cfg_format_size(mem, b, sizeof b));
        if ((uint32_t)m->defaults.max_tokens > m->max_context) {
            mark_t at = model_set(ld, i, "models.defaults", "max_tokens")
                            ? at_model(ld, i, "models.defaults", "max_tokens")
                            : at_model(ld, i, "models", "max_context");
            return ld_fail(ld, at, CFG_ERR_INVALID,
                           "models[%zu].defaults.max_tokens %d exceeds its max_context %u", i,
                           (int)m->defaults.max_tokens, (unsigned)m->max_context);
        }
        if (mem && m->pinned && m->gpu_quota) {
            pinned += m->gpu_quota; /* each <= mem, so no overflow for any sane count */
            if (pinned > mem)
                return ld_fail(ld, at_model(ld, i, "models", "pinned"), CFG_ERR_INVALID,
                               "the gpu_quota of the pinned models up to models[%zu] add up to %s, "
                               "more than device.memory %s",
                               i, cfg_format_size(pinned, a, sizeof a),
                               cfg_format_size(mem, b, sizeof b));
        }
    }
    return validate_keys(ld);
}

/* ------------------------------------------------------------------ public API */

/* The 1-based line and column of byte offset off in text (reader errors carry only an offset). */
static mark_t mark_at_offset(const char *text, size_t off)
{
    mark_t m = {1, 1};
    for (size_t i = 0; i < off && text[i]; i++) {
        if (text[i] == '\n') {
            m.line++;
            m.col = 1;
        } else if (((unsigned char)text[i] & 0xc0) != 0x80) {
            m.col++;
        }
    }
    return m;
}

/* Loads the one document of parser into ld->c. */
int cfg_runtime_dir(const char *config_dir, char *buf, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int k;
    if (geteuid() == 0)
        k = snprintf(buf, len, "/run/gpuswapd");
    else if (xdg && xdg[0] == '/')
        k = snprintf(buf, len, "%s/gpuswapd", xdg);
    else if (config_dir)
        k = snprintf(buf, len, "%s", config_dir);
    else
        k = snprintf(buf, len, "/tmp/gpuswapd-%u", (unsigned)geteuid());
    return k < 0 || (size_t)k >= len ? -1 : 0;
}

/* The defaults that depend on how the file is written and who runs it: a config without a listen
 * section (a models-only config) serves OpenAI HTTP on CFG_DEFAULT_HTTP; a socket the file does
 * not name goes to the runtime directory (cfg_runtime_dir: the table's /run/gpuswapd as root),
 * which the daemon creates when missing (c->rundir). */
static int runtime_defaults(ld_t *ld)
{
    cfg_t *c = ld->c;
    if (!ld->top[opt_find("", "listen")].line && !c->listen.http &&
        !(c->listen.http = strdup(CFG_DEFAULT_HTTP)))
        return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
    static const struct {
        const char *section, *file;
        size_t off;
    } socks[] = {{"listen", "gpuswapd.sock", offsetof(cfg_t, listen.socket)},
                 {"admin", "admin.sock", offsetof(cfg_t, admin.socket)}};
    char dir[PATH_MAX], path[PATH_MAX + 32];
    if (cfg_runtime_dir(ld->dir, dir, sizeof dir))
        return ld_fail(ld, ld->root, CFG_ERR_INVALID, "the runtime directory's path is too long");
    for (size_t i = 0; i < sizeof socks / sizeof *socks; i++) {
        if (ld->top[opt_find(socks[i].section, "socket")].line)
            continue;
        if (geteuid() == 0) { /* the table's default, in /run/gpuswapd: created if missing */
            if (!c->rundir && !(c->rundir = strdup(dir)))
                return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
            continue;
        }
        char **field = (char **)((char *)c + socks[i].off), why[64];
        snprintf(path, sizeof path, "%s/%s", dir, socks[i].file);
        if (check_sockpath(&(const char *){path}, why, sizeof why))
            return ld_fail(ld, ld->root, CFG_ERR_INVALID,
                           "%s.socket: the default %s is %s: set it in the file", socks[i].section,
                           path, why);
        free(*field);
        if (!(*field = strdup(path)) || (!c->rundir && !(c->rundir = strdup(dir))))
            return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
    }
    return 0;
}

uint32_t cfg_model_context(const cfg_model_t *m, uint32_t n_ctx_train)
{
    return n_ctx_train && m->max_context > n_ctx_train ? n_ctx_train : m->max_context;
}

static int load_document(ld_t *ld, yaml_parser_t *parser, const char *yaml)
{
    yaml_document_t doc2;
    int rc;
    if (!yaml_parser_load(parser, ld->doc)) {
        ld->doc = NULL;
        goto syntax;
    }
    if (!yaml_parser_load(parser, &doc2))
        goto syntax;
    yaml_node_t *extra = yaml_document_get_root_node(&doc2);
    mark_t extra_at = extra ? mark_of(extra) : ld->root;
    yaml_document_delete(&doc2);
    if (extra)
        return ld_fail(ld, extra_at, CFG_ERR_INVALID,
                       "a second YAML document; the config is one document");

    yaml_node_t *root = yaml_document_get_root_node(ld->doc);
    if (!root || node_is_null(root))
        return ld_fail(ld, ld->root, CFG_ERR_INVALID,
                       "the config is empty (at least 'models' is required)");
    ld->root = mark_of(root);
    if (root->type != YAML_MAPPING_NODE) {
        char d[80];
        return ld_fail(ld, ld->root, CFG_ERR_INVALID, "expected a mapping at the top level, got %s",
                       describe(root, d, sizeof d));
    }
    ld->c = calloc(1, sizeof *ld->c);
    if (!ld->c || !(ld->c->file = strdup(ld->file)))
        return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
    rc = apply_defaults(false, ld->c, ld->err, ld->errlen);
    if (!rc)
        rc = load_map(ld, root, "", "", ld->c, ld->top);
    if (!rc)
        rc = runtime_defaults(ld);
    if (!rc)
        rc = validate(ld);
    return rc;

syntax:
    if (parser->error == YAML_MEMORY_ERROR)
        return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
    mark_t m = {(int)parser->problem_mark.line + 1, (int)parser->problem_mark.column + 1};
    if (parser->error == YAML_READER_ERROR)
        m = mark_at_offset(yaml, parser->problem_offset);
    return ld_fail(ld, m, CFG_ERR_SYNTAX, "YAML syntax error: %s%s%s",
                   parser->problem ? parser->problem : "unknown", parser->context ? " " : "",
                   parser->context ? parser->context : "");
}

/* cfg_load_string with relative paths taken from dir (NULL: the working directory). */
static int load_string_in(const char *yaml, const char *name, const char *dir, cfg_t **out,
                          char *err, size_t errlen)
{
    *out = NULL;
    if (err && errlen)
        err[0] = 0;
    if (!name)
        name = "<config>";
    yaml_parser_t parser;
    yaml_document_t doc;
    ld_t ld = {.file = name, .dir = dir, .doc = &doc, .err = err, .errlen = errlen, .root = {1, 1}};
    if (!yaml_parser_initialize(&parser)) {
        set_err(err, errlen, "%s: out of memory", name);
        return CFG_ERR_NOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, strlen(yaml));
    int rc = load_document(&ld, &parser, yaml);
    if (ld.doc)
        yaml_document_delete(ld.doc);
    yaml_parser_delete(&parser);
    free(ld.model);
    free(ld.model_at);
    free(ld.key);
    free(ld.key_at);
    if (rc) {
        cfg_free(ld.c);
        return rc;
    }
    *out = ld.c;
    return 0;
}

int cfg_load_string(const char *yaml, const char *name, cfg_t **out, char *err, size_t errlen)
{
    return load_string_in(yaml, name, NULL, out, err, errlen);
}

/* The absolute directory of path, as named (symlinks not followed); NULL when out of memory or the
 * working directory is gone. The caller frees it. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == path)
        return strdup("/");
    char *dir = slash ? strndup(path, (size_t)(slash - path)) : NULL, *cwd = NULL, *abs = NULL;
    if (dir && dir[0] == '/')
        return dir;
    if ((cwd = getcwd(NULL, 0)) &&
        asprintf(&abs, "%s%s%s", cwd, dir ? "/" : "", dir ? dir : "") < 0)
        abs = NULL;
    free(dir);
    free(cwd);
    return abs;
}

int cfg_load_file(const char *path, cfg_t **out, char *err, size_t errlen)
{
    enum {
        MAX_FILE = 16 << 20
    };
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return CFG_ERR_IO;
    }
    size_t cap = 0, len = 0;
    char *buf = NULL;
    int rc = 0;
    for (;;) {
        if (len + 1 >= cap) {
            if (cap >= MAX_FILE) {
                set_err(err, errlen, "%s: larger than 16MiB; not a config file?", path);
                rc = CFG_ERR_INVALID;
                goto out;
            }
            size_t ncap = cap ? cap * 2 : 4096;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                set_err(err, errlen, "%s: out of memory", path);
                rc = CFG_ERR_NOMEM;
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        size_t k = fread(buf + len, 1, cap - 1 - len, f);
        len += k;
        if (k == 0)
            break;
    }
    if (ferror(f)) {
        set_err(err, errlen, "%s: read error: %s", path, strerror(errno));
        rc = CFG_ERR_IO;
        goto out;
    }
    buf[len] = 0;
    if (memchr(buf, 0, len)) {
        set_err(err, errlen, "%s: contains a NUL byte; not a YAML file", path);
        rc = CFG_ERR_INVALID;
        goto out;
    }
    char *dir = dir_of(path);
    if (!dir) {
        set_err(err, errlen, "%s: cannot resolve its directory: %s", path, strerror(errno));
        rc = CFG_ERR_IO;
        goto out;
    }
    rc = load_string_in(buf, path, dir, out, err, errlen);
    free(dir);
out:
    free(buf);
    fclose(f);
    return rc;
}

void cfg_free(cfg_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_models; i++)
        free_fields(true, &c->models[i]);
    free(c->models);
    for (size_t i = 0; i < c->auth.n_keys; i++)
        free_fields(OPT_KIND_KEY, &c->auth.keys[i]);
    free(c->auth.keys);
    free_fields(false, c);
    free(c->file);
    free(c->rundir);
    free(c);
}

const cfg_model_t *cfg_find_model(const cfg_t *c, const char *name)
{
    for (size_t i = 0; c && name && i < c->n_models; i++)
        if (c->models[i].name && strcmp(c->models[i].name, name) == 0)
            return &c->models[i];
    return NULL;
}

/* ------------------------------------------------------------------ printing and reload */

static void print_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\x%02x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* Writes the value of o stored at field in config syntax. */
static void print_value(FILE *f, const opt_t *o, const void *field)
{
    char buf[64];
    switch (o->type) {
    case OPT_STR: {
        const char *s = *(char *const *)field;
        if (s)
            print_quoted(f, s);
        else
            fputs("~", f);
        break;
    }
    case OPT_MODE: {
        unsigned m;
        memcpy(&m, field, sizeof m);
        fprintf(f, "\"%04o\"", m);
        break;
    }
    case OPT_SIZE:
    case OPT_RATE: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "%s%s", cfg_format_size(v, buf, sizeof buf),
                o->type == OPT_RATE && v ? "/s" : "");
        break;
    }
    case OPT_DURATION: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        fputs(cfg_format_duration_ms(v, buf, sizeof buf), f);
        break;
    }
    case OPT_U32: {
        uint32_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "%u", (unsigned)v);
        break;
    }
    case OPT_I32: {
        int32_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "%d", (int)v);
        break;
    }
    case OPT_DOUBLE: { /* shortest text that reads back to the same double */
        double v;
        memcpy(&v, field, sizeof v);
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
        fputs(buf, f);
        break;
    }
    case OPT_FLOAT: {
        float v;
        memcpy(&v, field, sizeof v);
        for (int prec = 6; prec <= 9; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
            if (strtof(buf, NULL) == v)
                break;
        }
        fputs(buf, f);
        break;
    }
    case OPT_BOOL: {
        int v;
        memcpy(&v, field, sizeof v);
        fputs(v ? "true" : "false", f);
        break;
    }
    case OPT_ENUM: {
        int v;
        memcpy(&v, field, sizeof v);
        fputs(o->names[v], f);
        break;
    }
    case OPT_IDLIST: {
        const cfg_idlist_t *l = field;
        fputc('[', f);
        for (size_t i = 0; i < l->n; i++)
            fprintf(f, "%s%u", i ? ", " : "", (unsigned)l->ids[i]);
        fputc(']', f);
        break;
    }
    case OPT_STRLIST: {
        const cfg_strlist_t *l = field;
        fputc('[', f);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                fputs(", ", f);
            print_quoted(f, l->v[i]);
        }
        fputc(']', f);
        break;
    }
    default: break;
    }
}

/* Writes the options of section at indent; dash: the first line opens a list item. */
static void print_section(FILE *f, const cfg_t *c, const char *section, const void *base,
                          int indent, bool dash)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (strcmp(o->section, section))
            continue;
        if (dash)
            fprintf(f, "%*s- ", indent - 2, "");
        else
            fprintf(f, "%*s", indent, "");
        dash = false;
        if (o->type == OPT_SECTION) {
            char child[64];
            snprintf(child, sizeof child, "%s%s%s", section, *section ? "." : "", o->key);
            fprintf(f, "%s:\n", o->key);
            print_section(f, c, child, base, indent + 2, false);
        } else if (o->type == OPT_MODELS) {
            fprintf(f, "%s:\n", o->key);
            for (size_t m = 0; m < c->n_models; m++)
                print_section(f, c, "models", &c->models[m], indent + 4, true);
        } else if (o->type == OPT_KEYS) {
            fprintf(f, "%s:%s\n", o->key, c->auth.n_keys ? "" : " []");
            for (size_t k = 0; k < c->auth.n_keys; k++)
                print_section(f, c, "auth.keys", &c->auth.keys[k], indent + 4, true);
        } else {
            fprintf(f, "%s: ", o->key);
            print_value(f, o, (const char *)base + o->off);
            fputc('\n', f);
        }
    }
}

int cfg_print(const cfg_t *c, FILE *f)
{
    fputs("# gpuswapd effective configuration (every key, defaults filled in)\n", f);
    print_section(f, c, "", c, 0, false);
    return ferror(f) ? CFG_ERR_IO : 0;
}

static bool value_equal(const opt_t *o, const void *a, const void *b)
{
    switch (o->type) {
    case OPT_STR: {
        const char *x = *(char *const *)a, *y = *(char *const *)b;
        return x == y || (x && y && strcmp(x, y) == 0);
    }
    case OPT_IDLIST: {
        const cfg_idlist_t *x = a, *y = b;
        return x->n == y->n && (x->n == 0 || memcmp(x->ids, y->ids, x->n * sizeof *x->ids) == 0);
    }
    case OPT_STRLIST: {
        const cfg_strlist_t *x = a, *y = b;
        if (x->n != y->n)
            return false;
        for (size_t i = 0; i < x->n; i++)
            if (strcmp(x->v[i], y->v[i]))
                return false;
        return true;
    }
    case OPT_SIZE:
    case OPT_RATE:
    case OPT_DURATION: return memcmp(a, b, sizeof(uint64_t)) == 0;
    case OPT_DOUBLE: return *(const double *)a == *(const double *)b;
    case OPT_FLOAT: return *(const float *)a == *(const float *)b;
    default: /* every remaining type is 4 bytes wide */ return memcmp(a, b, 4) == 0;
    }
}

/* Appends "name" to buf, comma-separated; counts it in *n. */
static void change_add(char *buf, size_t len, size_t *used, int *n, const char *sec,
                       const char *key)
{
    int k =
        snprintf(buf + *used, len - *used, "%s%s%s%s", *n ? ", " : "", sec, *sec ? "." : "", key);
    if (k > 0)
        *used = *used + (size_t)k < len ? *used + (size_t)k : len - 1;
    ++*n;
}

int cfg_model_changes(const cfg_model_t *a, const cfg_model_t *b, char *buf, size_t len)
{
    size_t used = 0;
    int n = 0;
    if (len)
        buf[0] = 0;
    for (size_t i = 0; i < N_OPTS && len; i++) {
        const opt_t *o = &opts[i];
        if (opt_kind(o) != OPT_KIND_MODEL || o->type == OPT_SECTION || !strcmp(o->key, "name"))
            continue;
        if (!value_equal(o, (const char *)a + o->off, (const char *)b + o->off))
            change_add(buf, len, &used, &n, strcmp(o->section, "models") ? o->section + 7 : "",
                       o->key);
    }
    return n;
}

int cfg_changes(const cfg_t *a, const cfg_t *b, char *buf, size_t len)
{
    size_t used = 0;
    int n = 0;
    if (len)
        buf[0] = 0;
    for (size_t i = 0; i < N_OPTS && len; i++) {
        const opt_t *o = &opts[i];
        if (opt_kind(o) != OPT_KIND_TOP || o->type == OPT_SECTION || o->type == OPT_MODELS)
            continue;
        bool same = true;
        if (o->type == OPT_KEYS) {
            same = a->auth.n_keys == b->auth.n_keys;
            for (size_t k = 0; same && k < a->auth.n_keys; k++)
                for (size_t j = 0; same && j < N_OPTS; j++)
                    if (opt_kind(&opts[j]) == OPT_KIND_KEY)
                        same = value_equal(&opts[j], (const char *)&a->auth.keys[k] + opts[j].off,
                                           (const char *)&b->auth.keys[k] + opts[j].off);
        } else
            same = value_equal(o, (const char *)a + o->off, (const char *)b + o->off);
        if (!same)
            change_add(buf, len, &used, &n, o->section, o->key);
    }
    return n;
}

int cfg_reload_check(const cfg_t *cur, const cfg_t *next, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (opt_kind(o) != OPT_KIND_TOP || o->type == OPT_SECTION || o->type == OPT_MODELS ||
            o->type == OPT_KEYS || (o->flags & OPT_RELOAD))
            continue;
        const void *a = (const char *)cur + o->off, *b = (const char *)next + o->off;
        if (value_equal(o, a, b))
            continue;
        char *was = NULL, *now = NULL;
        size_t wl = 0, nl = 0;
        FILE *fw = open_memstream(&was, &wl), *fn = open_memstream(&now, &nl);
        if (fw)
            print_value(fw, o, a);
        if (fn)
            print_value(fn, o, b);
        if (fw)
            fclose(fw);
        if (fn)
            fclose(fn);
        char sw[64], sn[64];
        set_err(err, errlen,
                "%s: %s.%s cannot change on reload (%s -> %s); restart gpuswapd to apply it",
                next->file ? next->file : "<config>", o->section, o->key,
                sanitize(was ? was : "?", sw, sizeof sw), sanitize(now ? now : "?", sn, sizeof sn));
        free(was);
        free(now);
        return CFG_ERR_RELOAD;
    }
    return 0;
}
