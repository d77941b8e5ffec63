/* config: loads gpuswapd's YAML configuration into a validated plain struct, driven by one table of option descriptors. */
#ifndef CONFIG_H
#define CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/sampler_params.h"

/*
 * Every option, its type, default, bounds and whether SIGHUP may change it
 * lives in one table in config.c; config/gpuswapd.yaml documents them all.
 * The loader rejects unknown and duplicate keys, wrong types, values out of
 * bounds and impossible combinations with a message of the form
 *
 *     gpuswapd.yaml:7:11: invalid size "12GB" for device.memory (use B, KiB, MiB, GiB, TiB; 'GB' is ambiguous)
 *
 * (file:line:column of the offending key or value, 1-based).
 *
 * Value syntax:
 *   size      a non-negative integer number of bytes with an optional binary
 *             unit: B, KiB, MiB, GiB, TiB ("12GiB", "1.5GiB", "4096").
 *             A fraction is allowed when the result is a whole number of
 *             bytes. K, M, G, T, KB, MB, GB, TB (and lower-case spellings)
 *             are rejected as ambiguous rather than guessed.
 *   rate      a size per second: "25GiB" or "25GiB/s".
 *   duration  a number with a unit: ms, s, m, h ("250ms", "1.5s", "1m");
 *             must be a whole number of milliseconds; bare "0" is allowed.
 *   bool      true, false, yes, no (any case).
 *   mode      an octal permission string such as "0660" (at most 0777).
 *   host:port "127.0.0.1:8400", "localhost:8400", "gpu_a.local:8400", "[::1]:8400"
 *             (config/hostport.h: IPv4, a DNS name, '_' allowed, or IPv6 in brackets).
 *   ~ / null  (or an empty value) turns an optional listener off.
 */

enum {
    CFG_OK = 0,
    CFG_ERR_IO = -1,      /* the file cannot be read */
    CFG_ERR_SYNTAX = -2,  /* not well-formed YAML */
    CFG_ERR_INVALID = -3, /* well-formed, but not a valid configuration */
    CFG_ERR_NOMEM = -4,
    CFG_ERR_RELOAD = -5, /* cfg_reload_check: a key that needs a restart changed */
};

typedef enum cfg_backend {
    CFG_BACKEND_AUTO = 0, /* cuda when a GPU is visible, else cpu */
    CFG_BACKEND_CUDA,
    CFG_BACKEND_SIM,
    CFG_BACKEND_CPU,
    CFG_BACKEND_COUNT
} cfg_backend_t;
const char *cfg_backend_name(cfg_backend_t b); /* "auto", "cuda", "sim", "cpu"; NULL outside */

typedef enum cfg_policy {
    CFG_POLICY_SWAP_AWARE = 0,
    CFG_POLICY_FIFO,
    CFG_POLICY_COUNT
} cfg_policy_t;
const char *cfg_policy_name(cfg_policy_t p); /* "swap-aware", "fifo"; NULL outside */

typedef enum cfg_kv_type {
    CFG_KV_F16 = 0,
    CFG_KV_F32,
} cfg_kv_type_t;

/* A list of numeric user or group ids. */
typedef struct cfg_idlist {
    uint32_t *ids; /* n entries, owned; NULL when n == 0 */
    size_t n;
} cfg_idlist_t;

/* A list of strings. */
typedef struct cfg_strlist {
    char **v; /* n entries, each owned; NULL when n == 0 */
    size_t n;
} cfg_strlist_t;

/* An API key (daemon/front/auth.c): the key itself is never stored, only its hash. */
typedef struct cfg_key {
    char *name;              /* unique, [A-Za-z0-9._:-]+: the label in stats and metrics; owned */
    char *hash;              /* "sha256:" + 64 lower-case hex digits of SHA-256(key); owned */
    cfg_strlist_t models;    /* configured model names it may use, or "*" for every model */
    double rate;             /* requests per second, 0 = unlimited */
    uint32_t burst;          /* requests at once on top of the rate; 0 = max(1, ceil(rate)) */
    uint32_t max_concurrent; /* generate/chat requests in flight, 0 = unlimited */
    uint32_t tokens_per_minute; /* prompt + completion tokens, 0 = unlimited */
    uint64_t deadline_ms;       /* first-token deadline of its requests that set none; 0 = none */
    int batch;                  /* its requests are of the batch class (docs/overload.md) */
    int line;                   /* 1-based line of this key's entry in the file */
} cfg_key_t;

typedef struct cfg_model {
    char *name;    /* unique, [A-Za-z0-9._:-]+, at most 128 bytes; owned */
    char *path;    /* GGUF file; a relative path in a file is taken from its directory; NULL for an
                   adapter; owned */
    char *base;    /* an adapter's base: the name of another model of the config, not an adapter;
                   NULL = a model of its own; owned */
    char *adapter; /* an adapter's LoRA GGUF file (instead of path); NULL = none; owned */
    double adapter_scale;  /* an adapter's scale (llama.cpp's --lora-scaled), default 1 */
    uint64_t gpu_quota;    /* bytes of weights + KV cache on the device; 0 = no quota */
    uint64_t kv_cache;     /* bytes of KV cache reserved on the device; 0 = as needed */
    cfg_kv_type_t kv_type; /* element type of its KV caches; default f16 */
    double priority;       /* > 0, default 1; scales urgency and the worth of keeping it */
    int pinned;            /* 1: never evicted once paged in */
    uint32_t max_batch;    /* sequences per step; default scheduler.max_batch */
    uint32_t prefix_cache; /* finished sequences kept for prefix reuse, LRU; 0 = off; default 16 */
    uint32_t max_context; /* positions per sequence (prompt + generated), default 4096; what applies
                              is at most the model's trained context (cfg_model_context) */
    int max_context_set;  /* the file sets max_context (lowering it is then worth a warning) */
    char *
        chat_template; /* chat template family name (chat_family_from_name) overriding the one detected
                          * from the file's tokenizer.chat_template; NULL = detect; owned */
    int tool_choice; /* chat_tool_choice_t for a chat request with tools that names none (Ollama's
                        API has no such field): auto (default), none or required */
    uint64_t deadline_ms; /* the TTFT deadline of a request that gives none (deadline_ms): one
                             predicted to miss it is refused at once, overloaded; 0 = none */
    int deadline_keep;    /* deadline_miss: keep: such a request is served late instead, its
                             deadline dropped (0: refuse, the default) */
    struct {              /* sampling defaults for requests that do not set them */
        SAMPLER_PARAMS(
            SAMPLER_X_FIELD) /* temperature, top_k, ...: ranges and defaults in sampler_params.h */
        int32_t max_tokens;  /* 1..max_context; default 256 */
    } defaults;
    int line; /* 1-based line of this model's entry in the file, for later messages */
} cfg_model_t;

/* listen.http of a config without a listen section (a models-only config), as gpuswapd serve */
#define CFG_DEFAULT_HTTP "127.0.0.1:8400"

typedef struct cfg {
    char *file;   /* name the config was loaded under, used in messages; owned */
    char *rundir; /* the runtime directory (cfg_runtime_dir) a default socket path is in, for the
                     daemon to create (0700; 0755 as root); NULL when the file names every socket */
    struct {
        char *socket;             /* unix socket path; NULL = no unix listener */
        unsigned mode;            /* permission bits of the socket, default 0660 */
        char *tcp;                /* JSON-lines TCP listener "host:port"; NULL = off (default) */
        char *http;               /* OpenAI-compatible HTTP "host:port"; NULL = off (default) */
        uint64_t max_line;        /* bytes: longest request line accepted, default 1MiB */
        uint32_t max_connections; /* open client connections, default 1024 */
        uint64_t drain_linger_ms; /* a drain first fails /ready and serves this long, then
                                     refuses new requests and drains; default 0 */
    } listen;
    struct {
        char *socket;      /* admin unix socket path; NULL = no admin socket */
        unsigned mode;     /* permission bits, default 0600 */
        cfg_idlist_t uids; /* peers allowed besides root and the daemon's own uid */
        cfg_idlist_t gids; /* peers whose primary gid is listed are allowed too */
    } admin;
    struct {
        cfg_backend_t backend;  /* default auto */
        int32_t gpu;            /* CUDA device ordinal, default 0 */
        uint64_t memory;        /* bytes in the device pool (weights + KV); required for sim;
                                   0 = cuda: 90% of free memory at start, cpu: unused */
        uint64_t page_size;     /* bytes per pool page: power of two, >= 4KiB, default 2MiB */
        uint64_t sim_bandwidth; /* bytes/s the sim copy thread is throttled to; 0 = unthrottled */
        uint64_t
            sim_load_bandwidth; /* sim: bytes/s a model is read into host RAM at; 0 = unthrottled */
        uint32_t threads;       /* CPU kernel threads; 0 = all cores */
        uint64_t
            copy_timeout_ms; /* a host->device copy not done by then fails its pass, default 30000 */
        int fault_injection; /* sim only: the admin `fault` op may inject failures, default off */
        uint32_t prefill_chunk; /* tokens per pass over the layers (long prompts run in chunks,
                                   scratch sized by it), default 512 */
    } device;
    struct {
        uint64_t memory;   /* bytes budget for the host model store; 0 = unlimited */
        uint64_t kv_cache; /* bytes of cached KV kept in host RAM (prefixes the device pool gave up
                              or whose model was paged out); 0 = none; within memory */
    } host;
    struct {
        cfg_policy_t policy;  /* default swap-aware */
        uint32_t max_batch;   /* default per-model batch size, default 16 */
        uint64_t max_wait_ms; /* a request waiting this long forces a switch, default 2000 */
        uint64_t
            max_stall_ms; /* running sequences go at most this long without a step, default 500 */
        double quantum;   /* stay on a busy model this many swap-in times, default 4 */
        uint32_t queue_limit;      /* queued requests per model, default 256 */
        uint32_t max_queued;       /* queued requests in all, default 4096 */
        uint64_t drain_timeout_ms; /* SIGTERM waits this long for running work, default 30000 */
        int prefix_cache; /* reuse cached prompt prefixes (models.prefix_cache), default on */
    } scheduler;
    struct {
        char *listen; /* a listener of its own for GET /metrics "host:port"; NULL = off (default) */
        int vllm_compat; /* also emit the gateway gauges under vLLM's names, default off */
    } metrics;
    struct {
        int level; /* index into log_level_names (LOG_LEVEL_OF_INDEX); default "info" */
    } log;
    struct {
        int http;                      /* listen.http requires a key (Bearer), default off */
        int tcp;                       /* listen.tcp requires a key (the auth op), default off */
        cfg_strlist_t trusted_proxies; /* peer IP addresses whose X-Forwarded-For is believed */
        uint32_t max_failures; /* failed attempts from one address before back-off, default 5 */
        uint64_t
            backoff_ms; /* the first back-off; doubles per further failure, at most 64x; default 1s */
        cfg_key_t *keys; /* n_keys entries, in file order; owned */
        size_t n_keys;
    } auth;
    cfg_model_t *models; /* n_models >= 1 entries, in file order; owned */
    size_t n_models;
} cfg_t;

/* What a reload that changes an option does: it applies at once, the model
 * is loaded again from its file (requests under way finish on the old one),
 * or it needs a restart (the reload is refused, naming every such key). */
typedef enum cfg_apply {
    CFG_APPLY_LIVE = 0,
    CFG_APPLY_MODEL,
    CFG_APPLY_RESTART,
} cfg_apply_t;

/* Loads and validates a config file. On success *out is a new config the
 * caller frees with cfg_free; on failure *out is NULL, the return value is a
 * CFG_ERR_* code and err holds "file:line:col: reason". */
int cfg_load_file(const char *path, cfg_t **out, char *err, size_t errlen);
/* The same from a NUL-terminated string; name stands for the file in
 * messages and in cfg_t.file. */
int cfg_load_string(const char *yaml, const char *name, cfg_t **out, char *err, size_t errlen);
void cfg_free(cfg_t *c); /* accepts NULL */

/* Writes the effective config (every key, defaults filled in) as YAML that
 * cfg_load_string accepts again and that prints identically. 0 or CFG_ERR_IO. */
int cfg_print(const cfg_t *c, FILE *f);

/* Where sockets go that a config does not name: /run/gpuswapd as root; else
 * $XDG_RUNTIME_DIR/gpuswapd, else config_dir (the config file's directory), else
 * /tmp/gpuswapd-UID. 0, or -1 when it does not fit buf. */
int cfg_runtime_dir(const char *config_dir, char *buf, size_t len);

/* The positions a sequence of model m may use: its max_context (default 4096), at most the
 * model's trained context n_ctx_train (0: unknown). */
uint32_t cfg_model_context(const cfg_model_t *m, uint32_t n_ctx_train);

/* The model called name, or NULL. The pointer lives as long as c. */
const cfg_model_t *cfg_find_model(const cfg_t *c, const char *name);

/* Whether next may replace cur on SIGHUP: every option whose class is not
 * CFG_APPLY_RESTART may change (the listeners, the admin socket and its mode,
 * every device and metrics key, auth.http and auth.tcp may not). 0, or
 * CFG_ERR_RELOAD with every such key that changed named in err. */
int cfg_reload_check(const cfg_t *cur, const cfg_t *next, char *err, size_t errlen);

/* What a reload changes, named as the file names the keys, comma-separated into buf (cut short
 * when it does not fit): a model's options ("gpu_quota, chat_template, defaults.temperature";
 * its name aside), the top-level ones ("scheduler.max_wait, auth.keys"). The count. */
int cfg_model_changes(const cfg_model_t *a, const cfg_model_t *b, char *buf, size_t len);
int cfg_changes(const cfg_t *a, const cfg_t *b, char *buf, size_t len);
/* Of a model's changes, those that load it again from its file (CFG_APPLY_MODEL: path, kv_type,
 * max_context), named into buf as cfg_model_changes does. The count (0: it changes in place). */
int cfg_model_reloads(const cfg_model_t *a, const cfg_model_t *b, char *buf, size_t len);

/* Every option as a Markdown table (option, type, default, what a reload does, a line of doc):
 * `gpuswapd --options`, and README's table, which make check keeps equal. 0 or CFG_ERR_IO. */
int cfg_options_markdown(FILE *f);

/* Value parsers, shared with the CLI. s is the whole text (no surrounding
 * blanks). 0 with *out set, or CFG_ERR_INVALID with a short reason in err
 * (e.g. "use B, KiB, MiB, GiB, TiB", "too large"); err may be NULL. */
int cfg_parse_size(const char *s, uint64_t *out, char *err, size_t errlen);
int cfg_parse_duration_ms(const char *s, uint64_t *out_ms, char *err, size_t errlen);

/* Formats bytes with the largest binary unit that divides it exactly
 * ("2MiB", "1536KiB", "1000B"), ms likewise ("250ms", "2s", "1m"); both read
 * back identically through the parsers. Returns buf. */
char *cfg_format_size(uint64_t bytes, char *buf, size_t len);
char *cfg_format_duration_ms(uint64_t ms, char *buf, size_t len);

#endif
