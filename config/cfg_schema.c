/* cfg_schema: the option table, every option once (type, default, bounds, validator, reload class), with the checks its entries name. */
#include "config_int.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "base/log.h"
#include "engine/chat.h"
#include "hostport.h"
#include "keyhash.h"

/* ------------------------------------------------------------------ option table */

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
/* engine/chat_tools.h's chat_tool_choice_t order: auto, none, required */
static const char *const tool_choice_names[] = {"auto", "none", "required", NULL};
/* cfg_model_t.deadline_keep: 0 refuse, 1 keep */
static const char *const deadline_miss_names[] = {"refuse", "keep", NULL};
/* cfg_key_t.batch: 0 interactive, 1 batch */
static const char *const class_names[] = {"interactive", "batch", NULL};

const char *cfg_backend_name(cfg_backend_t b)
{
    return (unsigned)b < CFG_BACKEND_COUNT ? backend_names[b] : NULL;
}

const char *cfg_policy_name(cfg_policy_t p)
{
    return (unsigned)p < CFG_POLICY_COUNT ? policy_names[p] : NULL;
}

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
#define SECTION(parent, name, apply, doc)                                                          \
    {                                                                                              \
        parent, name, OPT_SECTION, 0, NULL, 0, 0, 0, NULL, NULL, NULL, apply, doc                  \
    }

/* Every option gpuswapd reads. The order here is the order cfg_print writes. */
const opt_t cfg_opts[] = {
    SECTION("", "listen", CFG_APPLY_RESTART, "client listeners (JSON lines, OpenAI HTTP)"),
    {"listen", "socket", OPT_STR, C(listen.socket), "/run/gpuswapd/gpuswapd.sock", 0, 0,
     OPT_NULLABLE | OPT_PATH, NULL, cfg_check_sockpath, "socket path", CFG_APPLY_RESTART,
     "unix socket for JSON lines; ~ = none"},
    {"listen", "mode", OPT_MODE, C(listen.mode), "0660", 0, 0, 0, NULL, NULL, NULL,
     CFG_APPLY_RESTART, "permission bits of the socket (octal string)"},
    {"listen", "tcp", OPT_STR, C(listen.tcp), NULL, 0, 0, OPT_NULLABLE, NULL, check_hostport,
     "address", CFG_APPLY_RESTART, "JSON lines over TCP, host:port; off by default"},
    {"listen", "http", OPT_STR, C(listen.http), NULL, 0, 0, OPT_NULLABLE, NULL, check_hostport,
     "address", CFG_APPLY_RESTART,
     "OpenAI-compatible HTTP and /metrics, host:port; 127.0.0.1:8400 when the file has no listen section"},
    {"listen", "max_line", OPT_SIZE, C(listen.max_line), "1MiB", 1 * KiB, 1 * GiB, 0, NULL, NULL,
     NULL, CFG_APPLY_RESTART, "longest request line a client may send"},
    {"listen", "max_connections", OPT_U32, C(listen.max_connections), "1024", 1, 1000000, 0, NULL,
     NULL, NULL, CFG_APPLY_RESTART, "open client connections"},
    {"listen", "drain_linger", OPT_DURATION, C(listen.drain_linger_ms), "0", 0, 3600000, 0, NULL,
     NULL, NULL, CFG_APPLY_LIVE, "a drain first fails /ready and keeps serving this long"},

    SECTION("", "admin", CFG_APPLY_RESTART, "the admin socket"),
    {"admin", "socket", OPT_STR, C(admin.socket), "/run/gpuswapd/admin.sock", 0, 0,
     OPT_NULLABLE | OPT_PATH, NULL, cfg_check_sockpath, "socket path", CFG_APPLY_RESTART,
     "admin unix socket; ~ = none"},
    {"admin", "mode", OPT_MODE, C(admin.mode), "0600", 0, 0, 0, NULL, NULL, NULL, CFG_APPLY_RESTART,
     "permission bits of the admin socket"},
    {"admin", "uids", OPT_IDLIST, C(admin.uids), NULL, 0, 0, 0, NULL, NULL, NULL, CFG_APPLY_LIVE,
     "peer uids allowed besides root and the daemon's own"},
    {"admin", "gids", OPT_IDLIST, C(admin.gids), NULL, 0, 0, 0, NULL, NULL, NULL, CFG_APPLY_LIVE,
     "peer gids allowed"},

    SECTION("", "device", CFG_APPLY_RESTART, "the device and its memory pool"),
    {"device", "backend", OPT_ENUM, C(device.backend), "auto", 0, 0, 0, backend_names, NULL, NULL,
     CFG_APPLY_RESTART, "auto, cuda, sim or cpu; auto = cuda when a GPU is visible, else cpu"},
    {"device", "gpu", OPT_I32, C(device.gpu), "0", 0, 1023, 0, NULL, NULL, NULL, CFG_APPLY_RESTART,
     "CUDA device ordinal"},
    {"device", "memory", OPT_SIZE, C(device.memory), "0", 0, UNBOUNDED, 0, NULL, NULL, NULL,
     CFG_APPLY_RESTART, "device pool for weights and KV; 0 = cuda: 90% of free memory"},
    {"device", "page_size", OPT_SIZE, C(device.page_size), "2MiB", 4 * KiB, 1 * GiB, 0, NULL,
     check_pow2, NULL, CFG_APPLY_RESTART, "pool page, a power of two"},
    {"device", "sim_bandwidth", OPT_RATE, C(device.sim_bandwidth), "0", 0, UNBOUNDED, 0, NULL, NULL,
     NULL, CFG_APPLY_RESTART, "sim: host-to-device copy throttle per second; 0 = none"},
    {"device", "sim_load_bandwidth", OPT_RATE, C(device.sim_load_bandwidth), "0", 0, UNBOUNDED, 0,
     NULL, NULL, NULL, CFG_APPLY_RESTART,
     "sim: how fast a model is read into host RAM; 0 = unthrottled"},
    {"device", "threads", OPT_U32, C(device.threads), "0", 0, 4096, 0, NULL, NULL, NULL,
     CFG_APPLY_RESTART, "CPU kernel threads; 0 = all cores"},
    {"device", "copy_timeout", OPT_DURATION, C(device.copy_timeout_ms), "30s", 1, 3600000, 0, NULL,
     NULL, NULL, CFG_APPLY_RESTART, "a copy not done after this fails the requests waiting on it"},
    {"device", "fault_injection", OPT_BOOL, C(device.fault_injection), "false", 0, 0, 0, NULL, NULL,
     NULL, CFG_APPLY_RESTART, "sim, tests: lets the admin fault op inject failures"},
    {"device", "prefill_chunk", OPT_U32, C(device.prefill_chunk), "512", 1, 1048576, 0, NULL, NULL,
     NULL, CFG_APPLY_RESTART, "tokens per pass over the layers"},

    SECTION("", "host", CFG_APPLY_LIVE, "host RAM"),
    {"host", "memory", OPT_SIZE, C(host.memory), "0", 0, UNBOUNDED, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE, "budget for the host model store; 0 = unlimited (loads from now on must fit)"},
    {"host", "kv_cache", OPT_SIZE, C(host.kv_cache), "1GiB", 0, UNBOUNDED, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE,
     "cached KV kept in host RAM when the device pool gives it up or its model is paged out, and "
     "copied back instead of recomputed; 0 = none; counts against memory"},

    SECTION("", "scheduler", CFG_APPLY_LIVE, "batching and ordering"),
    {"scheduler", "policy", OPT_ENUM, C(scheduler.policy), "swap-aware", 0, 0, 0, policy_names,
     NULL, NULL, CFG_APPLY_LIVE, "swap-aware or fifo (the baseline)"},
    {"scheduler", "max_batch", OPT_U32, C(scheduler.max_batch), "16", 1, 4096, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE, "sequences per step, every model's default"},
    {"scheduler", "max_wait", OPT_DURATION, C(scheduler.max_wait_ms), "2s", 1, 3600000, 0, NULL,
     NULL, NULL, CFG_APPLY_LIVE, "a request queued this long forces a switch to its model"},
    {"scheduler", "max_stall", OPT_DURATION, C(scheduler.max_stall_ms), "500ms", 1, 3600000, 0,
     NULL, NULL, NULL, CFG_APPLY_LIVE, "a running model goes at most this long without a step"},
    {"scheduler", "quantum", OPT_DOUBLE, C(scheduler.quantum), "4", 0, 1000, OPT_LO_OPEN, NULL,
     NULL, NULL, CFG_APPLY_LIVE, "stay on a busy model at least this many of its swap-in times"},
    {"scheduler", "queue_limit", OPT_U32, C(scheduler.queue_limit), "256", 1, 1000000, 0, NULL,
     NULL, NULL, CFG_APPLY_LIVE, "queued requests per model; more are refused"},
    {"scheduler", "max_queued", OPT_U32, C(scheduler.max_queued), "4096", 1, 10000000, 0, NULL,
     NULL, NULL, CFG_APPLY_LIVE, "queued requests over all models"},
    {"scheduler", "drain_timeout", OPT_DURATION, C(scheduler.drain_timeout_ms), "30s", 0, 3600000,
     0, NULL, NULL, NULL, CFG_APPLY_LIVE, "on SIGTERM, how long running requests may finish"},
    {"scheduler", "prefix_cache", OPT_BOOL, C(scheduler.prefix_cache), "true", 0, 0, 0, NULL, NULL,
     NULL, CFG_APPLY_LIVE, "reuse the KV of a prompt's cached prefix (every model; off: none)"},

    SECTION("", "metrics", CFG_APPLY_RESTART, "Prometheus metrics"),
    {"metrics", "listen", OPT_STR, C(metrics.listen), NULL, 0, 0, OPT_NULLABLE, NULL,
     check_hostport, "address", CFG_APPLY_RESTART,
     "a listener serving only /metrics and /health; off by default"},
    {"metrics", "vllm_compat", OPT_BOOL, C(metrics.vllm_compat), "false", 0, 0, 0, NULL, NULL, NULL,
     CFG_APPLY_RESTART, "also the vLLM gauge names the inference gateway reads"},

    SECTION("", "log", CFG_APPLY_LIVE, "logging"),
    {"log", "level", OPT_ENUM, C(log.level), "info", 0, 0, 0, log_level_names, NULL, NULL,
     CFG_APPLY_LIVE, "error, warning, notice, info or debug"},

    SECTION("", "auth", CFG_APPLY_LIVE, "API keys"),
    {"auth", "http", OPT_BOOL, C(auth.http), "false", 0, 0, 0, NULL, NULL, NULL, CFG_APPLY_RESTART,
     "listen.http requires a Bearer key"},
    {"auth", "tcp", OPT_BOOL, C(auth.tcp), "false", 0, 0, 0, NULL, NULL, NULL, CFG_APPLY_RESTART,
     "listen.tcp requires an auth op first"},
    {"auth", "trusted_proxies", OPT_STRLIST, C(auth.trusted_proxies), NULL, 0, 0, 0, NULL, check_ip,
     "address", CFG_APPLY_LIVE, "peers whose X-Forwarded-For names the client"},
    {"auth", "max_failures", OPT_U32, C(auth.max_failures), "5", 1, 1000000, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE, "wrong keys in a row before an address backs off"},
    {"auth", "backoff", OPT_DURATION, C(auth.backoff_ms), "1s", 1, 3600000, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE, "first back-off, doubled per further failure"},
    {"auth", "keys", OPT_KEYS, 0, NULL, 0, 0, 0, NULL, NULL, NULL, CFG_APPLY_LIVE,
     "the keys: name, hash, models, limits"},
    {"auth.keys", "name", OPT_STR, K(name), NULL, 0, 0, 0, NULL, check_name, "key name",
     CFG_APPLY_LIVE, "unique label in stats and /metrics"},
    {"auth.keys", "hash", OPT_STR, K(hash), NULL, 0, 0, 0, NULL, check_key_hash, "key hash",
     CFG_APPLY_LIVE, "the key's `sha256:` hash (`gpuswap keygen` prints it)"},
    {"auth.keys", "models", OPT_STRLIST, K(models), NULL, 0, 0, 0, NULL, NULL, "model name",
     CFG_APPLY_LIVE, "model names it may use, or `*`"},
    {"auth.keys", "rate", OPT_DOUBLE, K(rate), "0", 0, 1000000, 0, NULL, NULL, NULL, CFG_APPLY_LIVE,
     "requests per second; 0 = unlimited"},
    {"auth.keys", "burst", OPT_U32, K(burst), "0", 0, 1000000, 0, NULL, NULL, NULL, CFG_APPLY_LIVE,
     "requests at once above the rate; 0 = max(1, rate)"},
    {"auth.keys", "max_concurrent", OPT_U32, K(max_concurrent), "0", 0, 1000000, 0, NULL, NULL,
     NULL, CFG_APPLY_LIVE, "generate/chat requests in flight; 0 = unlimited"},
    {"auth.keys", "tokens_per_minute", OPT_U32, K(tokens_per_minute), "0", 0, 1000000000, 0, NULL,
     NULL, NULL, CFG_APPLY_LIVE, "prompt + completion tokens; 0 = unlimited"},
    {"auth.keys", "deadline", OPT_DURATION, K(deadline_ms), "0", 0, 86400000, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE,
     "first-token deadline of its requests that set none (before the model's); 0 = none"},
    {"auth.keys", "class", OPT_ENUM, K(batch), "interactive", 0, 0, 0, class_names, NULL, NULL,
     CFG_APPLY_LIVE, "interactive, or batch: its requests use what interactive ones leave"},

    {"", "models", OPT_MODELS, 0, NULL, 0, 0, 0, NULL, NULL, NULL, CFG_APPLY_LIVE,
     "the models; a reload adds, removes and changes them"},
    {"models", "name", OPT_STR, M(name), NULL, 0, 0, 0, NULL, check_name, "model name",
     CFG_APPLY_LIVE, "unique name requests use (a new name is another model)"},
    {"models", "path", OPT_STR, M(path), NULL, 0, 0, OPT_PATH | OPT_NULLABLE | OPT_TILDE, NULL,
     check_path, "path", CFG_APPLY_MODEL,
     "the GGUF file (not for an adapter); relative to the config's directory"},
    {"models", "base", OPT_STR, M(base), NULL, 0, 0, OPT_NULLABLE | OPT_TILDE, NULL, check_name,
     "model name", CFG_APPLY_MODEL,
     "makes it a LoRA adapter of this model (another, not an adapter)"},
    {"models", "adapter", OPT_STR, M(adapter), NULL, 0, 0, OPT_PATH | OPT_NULLABLE | OPT_TILDE,
     NULL, check_path, "path", CFG_APPLY_MODEL,
     "an adapter's LoRA GGUF file, instead of path; relative to the config's directory"},
    {"models", "adapter_scale", OPT_DOUBLE, M(adapter_scale), "1", -100, 100, 0, NULL, NULL, NULL,
     CFG_APPLY_MODEL, "an adapter's scale (llama.cpp's --lora-scaled)"},
    {"models", "gpu_quota", OPT_SIZE, M(gpu_quota), "0", 0, UNBOUNDED, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE,
     "most device memory it may hold (an adapter: its weights, in its base's too); 0 = no quota"},
    {"models", "kv_cache", OPT_SIZE, M(kv_cache), "0", 0, UNBOUNDED, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE, "KV bytes reserved for it; 0 = none"},
    {"models", "kv_type", OPT_ENUM, M(kv_type), "f16", 0, 0, 0, kv_type_names, NULL, NULL,
     CFG_APPLY_MODEL, "KV cache elements: f16 or f32"},
    {"models", "priority", OPT_DOUBLE, M(priority), "1", 0, 1000, OPT_LO_OPEN, NULL, NULL, NULL,
     CFG_APPLY_LIVE, "> 0: weighs its queue and how much it is worth keeping"},
    {"models", "pinned", OPT_BOOL, M(pinned), "false", 0, 0, 0, NULL, NULL, NULL, CFG_APPLY_LIVE,
     "never evicted once paged in"},
    {"models", "max_batch", OPT_U32, M(max_batch), NULL /* scheduler.max_batch */, 1, 4096, 0, NULL,
     NULL, NULL, CFG_APPLY_LIVE, "sequences per step; default scheduler.max_batch"},
    {"models", "prefix_cache", OPT_U32, M(prefix_cache), "16", 0, 4096, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE, "finished sequences whose KV stays cached for prefix reuse; 0 = off"},
    {"models", "max_context", OPT_U32, M(max_context), "4096", 1, 1048576, 0, NULL, NULL, NULL,
     CFG_APPLY_MODEL, "positions per sequence, prompt + output (RoPE factors are chosen at load)"},
    {"models", "chat_template", OPT_STR, M(chat_template), NULL, 0, 0, OPT_NULLABLE, NULL,
     check_chat_template, "chat template", CFG_APPLY_LIVE,
     "how chat renders messages; default: detected from the file"},
    {"models", "tool_choice", OPT_ENUM, M(tool_choice), "auto", 0, 0, 0, tool_choice_names, NULL,
     NULL, CFG_APPLY_LIVE,
     "tool_choice of a chat request with tools that says none (auto, none or required)"},
    {"models", "deadline", OPT_DURATION, M(deadline_ms), "0", 0, 86400000, 0, NULL, NULL, NULL,
     CFG_APPLY_LIVE,
     "first-token deadline of a request that sets none: one predicted to miss it is refused at "
     "once (overloaded); 0 = none"},
    {"models", "deadline_miss", OPT_ENUM, M(deadline_keep), "refuse", 0, 0, 0, deadline_miss_names,
     NULL, NULL, CFG_APPLY_LIVE,
     "a request predicted to miss its deadline: refuse (at once, overloaded) or keep (served late, "
     "its deadline dropped)"},
    SECTION("models", "defaults", CFG_APPLY_LIVE, "sampling for requests that do not say"),
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
     NULL,                                                                                         \
     CFG_APPLY_LIVE,                                                                               \
     help},
    SAMPLER_PARAMS(X)
#undef X
        {"models.defaults", "max_tokens", OPT_I32, M(defaults.max_tokens), "256", 1, 1048576, 0,
         NULL, NULL, NULL, CFG_APPLY_LIVE, "tokens generated at most; at most max_context"},
};

const size_t cfg_n_opts = sizeof cfg_opts / sizeof cfg_opts[0];
_Static_assert(sizeof cfg_opts / sizeof cfg_opts[0] <= CFG_MAX_OPTS, "raise CFG_MAX_OPTS");

_Static_assert(sizeof(cfg_backend_t) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(cfg_policy_t) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(cfg_kv_type_t) == sizeof(int), "enums are stored as int");

bool cfg_opt_is_model(const opt_t *o)
{
    return strncmp(o->section, "models", 6) == 0;
}

int cfg_opt_kind(const opt_t *o)
{
    if (cfg_opt_is_model(o))
        return OPT_KIND_MODEL;
    return strncmp(o->section, "auth.keys", 9) == 0 ? OPT_KIND_KEY : OPT_KIND_TOP;
}

/* Index of the option key in section, or -1. */
int cfg_opt_find(const char *section, const char *key)
{
    for (size_t i = 0; i < cfg_n_opts; i++)
        if (strcmp(cfg_opts[i].section, section) == 0 && strcmp(cfg_opts[i].key, key) == 0)
            return (int)i;
    return -1;
}

/* ------------------------------------------------------------------ string checks */

int cfg_check_sockpath(const void *field, char *why, size_t n)
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
