/* auth: API keys: the key store (SHA-256 hashes), constant-time lookup, per-key limits and usage, and the back-off after failed attempts. */
#ifndef AUTH_H
#define AUTH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "proto.h"

/*
 * The loop thread calls everything but auth_report, which the worker's stats
 * report calls; one mutex inside makes that safe. Times are seconds on a
 * monotonic clock, passed in (auth_now() in the daemon) so that tests can
 * drive them.
 *
 * A key is never stored: the config holds "sha256:" + hex of SHA-256(key), a
 * presented key is hashed and compared with every stored hash in constant
 * time (CRYPTO_memcmp, no early exit). Nothing here logs, and no message or
 * report carries key material: keys appear by their configured name only.
 *
 * Limits per key (cfg_key_t): requests per second with a burst (a token
 * bucket of burst requests refilled at rate per second; every request but
 * auth and cancel takes one), generate/chat requests in flight, and tokens
 * per minute (a budget of tokens_per_minute refilled at tokens_per_minute/60
 * per second, charged with prompt + completion tokens when a request ends; a
 * request is admitted while the budget is above zero).
 *
 * Back-off: a wrong key counts a failure against the client address (the peer,
 * or the nearest untrusted address in X-Forwarded-For when the peer is one of
 * auth.trusted_proxies); from auth.max_failures consecutive failures on, the
 * address is refused (rate_limited) for auth.backoff, doubled per further
 * failure up to 64 times, whatever key it sends. A success clears its count.
 * A missing key is counted per listener but is no guess and starts no back-off.
 */

typedef struct auth auth_t;
typedef struct auth_key auth_key_t; /* a live or revoked key; reference counted */

enum {
    AUTH_OK = 0,
    AUTH_E_UNAUTHORIZED = -1, /* no key, or one no configured hash matches */
    AUTH_E_BACKOFF = -2,      /* the client address is backing off after failures */
    AUTH_E_LIMIT = -3,        /* a limit of the key (auth_cause_t says which) */
    AUTH_E_NOMEM = -4,
};

typedef enum auth_listener {
    AUTH_LST_HTTP = 0, /* listen.http */
    AUTH_LST_TCP,      /* listen.tcp (JSON lines) */
    AUTH_LST_UNIX, /* listen.socket: keys optional (an auth op narrows the connection to its key) */
    AUTH_LST_COUNT
} auth_listener_t;

typedef enum auth_cause {
    AUTH_CAUSE_RATE = 0,    /* requests per second */
    AUTH_CAUSE_CONCURRENCY, /* requests in flight */
    AUTH_CAUSE_TOKENS,      /* tokens per minute */
    AUTH_CAUSE_COUNT
} auth_cause_t;

/* A new store for cfg's auth section (cfg need not outlive it). NULL + reason. */
auth_t *auth_new(const cfg_t *cfg, char *err, size_t errlen);
/* Accepts NULL. Keys still referenced elsewhere stay valid until their last unref. */
void auth_free(auth_t *a);
/* Applies a reloaded config: a key with the same name and hash as before keeps
 * its counters and limit state, takes the new limits and models; every other
 * old key is revoked (auth_key_revoked). 0 or AUTH_E_NOMEM (nothing changed). */
int auth_reload(auth_t *a, const cfg_t *cfg);
/* Whether listener l requires a key (auth.http, auth.tcp; never the unix socket). */
int auth_required(const auth_t *a, auth_listener_t l);
/* Monotonic seconds. */
double auth_now(void);

/* The token of an Authorization header value "Bearer TOKEN" (scheme in any
 * case, spaces or tabs around TOKEN): 0 with *tok pointing into hdr and *len
 * its length (> 0), or -1 when hdr is NULL, another scheme, or empty. Pure. */
int auth_parse_bearer(const char *hdr, const char **tok, size_t *len);
/* The address to key the back-off on: peer, unless peer is a trusted proxy and
 * xff (an X-Forwarded-For value, may be NULL) names addresses: then the
 * rightmost one that is not a trusted proxy (or the leftmost, if all are).
 * Entries that are not IP addresses are skipped. Writes at most outlen - 1 bytes. */
void auth_client_addr(auth_t *a, const char *peer, const char *xff, char *out, size_t outlen);

/* Authenticates key (len bytes; NULL or len 0 = none sent) from client address
 * addr on listener l at time now. AUTH_OK with *out a new reference (the
 * caller unrefs); AUTH_E_UNAUTHORIZED; AUTH_E_BACKOFF with *retry_s set. */
int auth_check(auth_t *a, auth_listener_t l, const char *addr, const char *key, size_t len,
               double now, auth_key_t **out, uint32_t *retry_s);
/* Admits one request of key k: gen = generate or chat (counts against
 * max_concurrent and tokens_per_minute). AUTH_OK (a gen request then holds a
 * slot until auth_finish), or AUTH_E_LIMIT with *cause and *retry_s set. */
int auth_admit(auth_t *a, auth_key_t *k, int gen, double now, auth_cause_t *cause,
               uint32_t *retry_s);
/* An admitted gen request of k ended having used tokens (prompt + completion). */
void auth_finish(auth_t *a, auth_key_t *k, uint64_t tokens, double now);

void auth_key_ref(auth_key_t *k);
void auth_key_unref(auth_key_t *k); /* accepts NULL */
int auth_key_revoked(const auth_key_t *k);
const char *auth_key_name(const auth_key_t *k);
/* Whether k may use model name (NULL: whether it may use every model). */
int auth_key_allows(const auth_key_t *k, const char *model);
/* What k says of the requests it sends, into req: its allow-list (proto_req_t.allow, copies;
 * none when k may use every model), its name as req->tenant, its deadline where req sets none,
 * and the batch class when k is of it. 0, or -1 when out of memory (req frees what it got). A NULL
 * k changes nothing. */
int auth_key_apply(const auth_key_t *k, proto_req_t *req);

/* {"listeners":{"http":{..},"tcp":{..},"unix":{..}},"keys":{NAME:{..}},"curr_backoff_addresses":N}
 * (AUTH_REPORT_* below name the counters). Any thread. NULL on OOM. */
json_t *auth_report(auth_t *a);

/* Per listener: X(name, help) */
#define AUTH_LISTENER_COUNTERS(X)                                                                  \
    X(total_auth_ok, "successful authentications")                                                 \
    X(total_auth_missing, "requests or connections that sent no key where one is required")        \
    X(total_auth_invalid, "keys presented that match no configured key")                           \
    X(total_auth_backoff, "attempts refused because their address was backing off")

/* Per key: X(name, help) */
#define AUTH_KEY_COUNTERS(X)                                                                       \
    X(total_requests, "requests admitted")                                                         \
    X(total_tokens, "prompt + completion tokens of finished generate/chat requests")               \
    X(rejected_rate, "requests refused by the requests-per-second limit")                          \
    X(rejected_concurrency, "requests refused by the concurrent-requests limit")                   \
    X(rejected_tokens, "requests refused by the tokens-per-minute limit")                          \
    X(curr_inflight, "generate/chat requests in flight")

#endif
