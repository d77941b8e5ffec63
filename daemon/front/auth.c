/* auth: API keys: the key store (SHA-256 hashes), constant-time lookup, per-key limits and usage, and the back-off after failed attempts. */
#include "auth.h"

#include <arpa/inet.h>
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/util.h"
#include "keyhash.h"

#define AUTH_MAX_ADDRS 1024  /* client addresses remembered for the back-off */
#define AUTH_ADDR_LEN 64     /* bytes of one address, NUL included */
#define AUTH_MAX_DOUBLINGS 6 /* back-off grows to at most 64 x auth.backoff */

struct auth_key {
    int refs;               /* the store's reference plus every holder's */
    int revoked;            /* gone from the config: holders close */
    char *name;             /* owned */
    unsigned char hash[32]; /* SHA-256 of the key */
    char **models;          /* (n_models) allowed names, owned; all = 1 when "*" */
    size_t n_models;
    int all;
    double rate;             /* requests/s, 0 = unlimited */
    double burst;            /* bucket size */
    uint32_t max_concurrent; /* 0 = unlimited */
    uint32_t deadline_ms;    /* its requests' first-token deadline where they set none; 0 = none */
    int batch;               /* its requests are of the batch class */
    double tpm;              /* tokens per minute, 0 = unlimited */
    double bucket, bucket_t; /* requests available, at time bucket_t */
    double budget, budget_t; /* tokens available (may be negative), at time budget_t */
#define AUTH_FIELD(name, help) uint64_t name;
    AUTH_KEY_COUNTERS(AUTH_FIELD)
#undef AUTH_FIELD
};

typedef struct auth_addr {
    char addr[AUTH_ADDR_LEN]; /* "" = free slot */
    uint32_t fails;           /* consecutive failures */
    double until;             /* refused until then */
    double last;              /* last failure */
} auth_addr_t;

typedef struct auth_lst_stats {
#define AUTH_FIELD(name, help) uint64_t name;
    AUTH_LISTENER_COUNTERS(AUTH_FIELD)
#undef AUTH_FIELD
} auth_lst_stats_t;

struct auth {
    pthread_mutex_t mu; /* guards everything below */
    int required[AUTH_LST_COUNT];
    auth_key_t **keys; /* (n_keys) live keys, the store holds one reference each */
    size_t n_keys;
    char **proxies; /* (n_proxies) trusted proxy addresses, canonical text */
    size_t n_proxies;
    uint32_t max_failures;
    double backoff; /* seconds */
    auth_addr_t addrs[AUTH_MAX_ADDRS];
    auth_lst_stats_t lst[AUTH_LST_COUNT];
};

static const char *const lst_names[AUTH_LST_COUNT] = {"http", "tcp", "unix"};

/* ------------------------------------------------------------------ clock */

double auth_now(void)
{
    return util_now_s();
}

/* ------------------------------------------------------------------ parsing */

int auth_parse_bearer(const char *hdr, const char **tok, size_t *len)
{
    if (!hdr)
        return -1;
    while (*hdr == ' ' || *hdr == '\t')
        hdr++;
    if (strncasecmp(hdr, "bearer", 6) || (hdr[6] != ' ' && hdr[6] != '\t'))
        return -1;
    const char *p = hdr + 6;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) /* a token is one word of visible characters */
        if ((unsigned char)p[i] <= 0x20 || (unsigned char)p[i] == 0x7f)
            return -1;
    *tok = p;
    *len = n;
    return 0;
}

/* The canonical text of IP address s into out, or -1 when s is not one. */
static int canon_ip(const char *s, size_t len, char *out, size_t outlen)
{
    char buf[AUTH_ADDR_LEN];
    unsigned char bin[sizeof(struct in6_addr)];
    while (len && (*s == ' ' || *s == '\t')) {
        s++;
        len--;
    }
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    if (inet_pton(AF_INET, buf, bin) == 1)
        return inet_ntop(AF_INET, bin, out, (socklen_t)outlen) ? 0 : -1;
    if (inet_pton(AF_INET6, buf, bin) == 1) {
        static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(bin, v4mapped, 12) == 0) /* ::ffff:1.2.3.4 is 1.2.3.4 */
            return inet_ntop(AF_INET, bin + 12, out, (socklen_t)outlen) ? 0 : -1;
        return inet_ntop(AF_INET6, bin, out, (socklen_t)outlen) ? 0 : -1;
    }
    return -1;
}

/* a->mu held. */
static int do_is_proxy(const auth_t *a, const char *addr)
{
    for (size_t i = 0; i < a->n_proxies; i++)
        if (strcmp(a->proxies[i], addr) == 0)
            return 1;
    return 0;
}

void auth_client_addr(auth_t *a, const char *peer, const char *xff, char *out, size_t outlen)
{
    char pc[AUTH_ADDR_LEN];
    if (!outlen)
        return;
    if (!peer || canon_ip(peer, strlen(peer), pc, sizeof pc))
        snprintf(pc, sizeof pc, "%s", peer ? peer : "");
    snprintf(out, outlen, "%s", pc);
    pthread_mutex_lock(&a->mu);
    if (xff && do_is_proxy(a, pc)) {
        /* walk from the right: the last hop our trusted proxy added first */
        const char *end = xff + strlen(xff);
        char first[AUTH_ADDR_LEN] = "";
        while (end > xff) {
            const char *start = end;
            while (start > xff && start[-1] != ',')
                start--;
            char c[AUTH_ADDR_LEN];
            if (canon_ip(start, (size_t)(end - start), c, sizeof c) == 0) {
                snprintf(first, sizeof first, "%s", c);
                if (!do_is_proxy(a, c))
                    break;
            }
            end = start > xff ? start - 1 : xff;
        }
        if (first[0])
            snprintf(out, outlen, "%s", first);
    }
    pthread_mutex_unlock(&a->mu);
}

/* ------------------------------------------------------------------ keys */

void auth_key_ref(auth_key_t *k)
{
    __atomic_add_fetch(&k->refs, 1, __ATOMIC_RELAXED);
}

void auth_key_unref(auth_key_t *k)
{
    if (!k || __atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    for (size_t i = 0; i < k->n_models; i++)
        free(k->models[i]);
    free(k->models);
    free(k->name);
    OPENSSL_cleanse(k->hash, sizeof k->hash);
    free(k);
}

int auth_key_revoked(const auth_key_t *k)
{
    return __atomic_load_n(&k->revoked, __ATOMIC_ACQUIRE);
}

const char *auth_key_name(const auth_key_t *k)
{
    return k->name;
}

int auth_key_allows(const auth_key_t *k, const char *model)
{
    if (k->all)
        return 1;
    for (size_t i = 0; model && i < k->n_models; i++)
        if (strcmp(k->models[i], model) == 0)
            return 1;
    return 0;
}

/* k's allow-list as new copies: 0 with *out NULL when k may use every model; -1 when out of
 * memory. */
static int key_allow_copy(const auth_key_t *k, char ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (k->all)
        return 0;
    char **v = calloc(k->n_models ? k->n_models : 1, sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < k->n_models; i++) {
        if (!(v[i] = strdup(k->models[i]))) {
            for (size_t j = 0; j < i; j++)
                free(v[j]);
            free(v);
            return -1;
        }
    }
    *out = v;
    *n = k->n_models;
    return 0;
}

int auth_key_apply(const auth_key_t *k, proto_req_t *req)
{
    if (!k)
        return 0;
    if (!req->deadline_ms)
        req->deadline_ms = k->deadline_ms;
    req->batch |= k->batch;
    if (key_allow_copy(k, &req->allow, &req->n_allow))
        return -1;
    return (req->tenant = strdup(k->name)) ? 0 : -1;
}

/* Takes c's models and limits into k (a new key, or a kept one on reload). */
static int key_configure(auth_key_t *k, const cfg_key_t *c)
{
    char **models = calloc(c->models.n ? c->models.n : 1, sizeof *models);
    if (!models)
        return -1;
    int all = 0;
    for (size_t i = 0; i < c->models.n; i++) {
        if (strcmp(c->models.v[i], "*") == 0)
            all = 1;
        if (!(models[i] = strdup(c->models.v[i]))) {
            for (size_t j = 0; j < i; j++)
                free(models[j]);
            free(models);
            return -1;
        }
    }
    for (size_t i = 0; i < k->n_models; i++)
        free(k->models[i]);
    free(k->models);
    k->models = models;
    k->n_models = c->models.n;
    k->all = all;
    double burst = c->burst ? (double)c->burst : ceil(c->rate);
    if (burst < 1)
        burst = 1;
    int fresh = k->burst == 0 && k->bucket_t == 0;
    if (fresh || c->rate != k->rate || burst != k->burst)
        k->bucket = burst; /* a new or changed limit starts full */
    k->rate = c->rate;
    k->burst = burst;
    k->max_concurrent = c->max_concurrent;
    k->deadline_ms = (uint32_t)c->deadline_ms;
    k->batch = c->batch;
    if (fresh || (double)c->tokens_per_minute != k->tpm)
        k->budget = (double)c->tokens_per_minute;
    k->tpm = (double)c->tokens_per_minute;
    return 0;
}

static auth_key_t *key_new(const cfg_key_t *c)
{
    auth_key_t *k = calloc(1, sizeof *k);
    if (!k || !(k->name = strdup(c->name)) || keyhash_parse(c->hash, k->hash) ||
        key_configure(k, c)) {
        if (k)
            free(k->name);
        free(k);
        return NULL;
    }
    k->refs = 1;
    return k;
}

/* ------------------------------------------------------------------ the store */

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Builds the new key table and proxy list for cfg; a->mu held. Keys equal in
 * name and hash to a current one are kept (a reference moves to the new table). */
static int do_apply(auth_t *a, const cfg_t *cfg)
{
    const size_t nk = cfg->auth.n_keys, np = cfg->auth.trusted_proxies.n;
    auth_key_t **keys = calloc(nk ? nk : 1, sizeof *keys);
    char **proxies = calloc(np ? np : 1, sizeof *proxies);
    unsigned char *kept = calloc(a->n_keys ? a->n_keys : 1, 1);
    if (!keys || !proxies || !kept)
        goto fail;
    for (size_t i = 0; i < np; i++) {
        char c[AUTH_ADDR_LEN];
        const char *p = cfg->auth.trusted_proxies.v[i];
        if (canon_ip(p, strlen(p), c, sizeof c))
            snprintf(c, sizeof c, "%s", p);
        if (!(proxies[i] = strdup(c)))
            goto fail;
    }
    for (size_t i = 0; i < nk; i++) {
        const cfg_key_t *c = &cfg->auth.keys[i];
        unsigned char h[32];
        if (keyhash_parse(c->hash, h))
            goto fail;
        for (size_t j = 0; j < a->n_keys && !keys[i]; j++) {
            auth_key_t *o = a->keys[j];
            if (!kept[j] && strcmp(o->name, c->name) == 0 && memcmp(o->hash, h, 32) == 0) {
                if (key_configure(o, c))
                    goto fail;
                kept[j] = 1;
                keys[i] = o;
            }
        }
        if (!keys[i] && !(keys[i] = key_new(c)))
            goto fail;
    }
    for (size_t j = 0; j < a->n_keys; j++) {
        if (kept[j])
            continue;
        __atomic_store_n(&a->keys[j]->revoked, 1, __ATOMIC_RELEASE);
        auth_key_unref(a->keys[j]);
    }
    free(a->keys);
    free(kept);
    a->keys = keys;
    a->n_keys = nk;
    free_list(a->proxies, a->n_proxies);
    a->proxies = proxies;
    a->n_proxies = np;
    a->max_failures = cfg->auth.max_failures;
    a->backoff = (double)cfg->auth.backoff_ms / 1000.0;
    a->required[AUTH_LST_HTTP] = cfg->auth.http;
    a->required[AUTH_LST_TCP] = cfg->auth.tcp;
    a->required[AUTH_LST_UNIX] = 0;
    return 0;
fail:
    /* new keys only: a kept key is in a->keys too and keeps its store reference there
     * (its models may already be the new ones: harmless, the reload is refused) */
    for (size_t i = 0; keys && i < nk; i++) {
        int old = 0;
        for (size_t j = 0; j < a->n_keys; j++)
            old |= keys[i] == a->keys[j];
        if (keys[i] && !old)
            auth_key_unref(keys[i]);
    }
    free(keys);
    free_list(proxies, np);
    free(kept);
    return AUTH_E_NOMEM;
}

auth_t *auth_new(const cfg_t *cfg, char *err, size_t errlen)
{
    auth_t *a = calloc(1, sizeof *a);
    if (!a || pthread_mutex_init(&a->mu, NULL)) {
        free(a);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (do_apply(a, cfg)) {
        auth_free(a);
        snprintf(err, errlen, "auth: out of memory");
        return NULL;
    }
    return a;
}

void auth_free(auth_t *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n_keys; i++)
        auth_key_unref(a->keys[i]);
    free(a->keys);
    free_list(a->proxies, a->n_proxies);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

int auth_reload(auth_t *a, const cfg_t *cfg)
{
    pthread_mutex_lock(&a->mu);
    int rc = do_apply(a, cfg);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int auth_required(const auth_t *a, auth_listener_t l)
{
    return a && (int)l >= 0 && l < AUTH_LST_COUNT && a->required[l];
}

/* ------------------------------------------------------------------ checking */

static uint32_t retry_of(double s)
{
    double c = ceil(s);
    return c < 1 ? 1 : c > 86400 ? 86400 : (uint32_t)c;
}

/* The slot of addr, or NULL; a->mu held. */
static auth_addr_t *do_addr_find(auth_t *a, const char *addr)
{
    for (size_t i = 0; i < AUTH_MAX_ADDRS; i++)
        if (a->addrs[i].addr[0] && strcmp(a->addrs[i].addr, addr) == 0)
            return &a->addrs[i];
    return NULL;
}

/* A slot for addr: a free one, else the one whose last failure is oldest; a->mu held. */
static auth_addr_t *do_addr_claim(auth_t *a, const char *addr)
{
    auth_addr_t *best = &a->addrs[0];
    for (size_t i = 0; i < AUTH_MAX_ADDRS; i++) {
        if (!a->addrs[i].addr[0]) {
            best = &a->addrs[i];
            break;
        }
        if (a->addrs[i].last < best->last)
            best = &a->addrs[i];
    }
    memset(best, 0, sizeof *best);
    snprintf(best->addr, sizeof best->addr, "%s", addr);
    return best;
}

int auth_check(auth_t *a, auth_listener_t l, const char *addr, const char *key, size_t len,
               double now, auth_key_t **out, uint32_t *retry_s)
{
    *out = NULL;
    *retry_s = 0;
    if ((int)l < 0 || l >= AUTH_LST_COUNT)
        l = AUTH_LST_TCP;
    if (!addr)
        addr = "";
    pthread_mutex_lock(&a->mu);
    auth_lst_stats_t *st = &a->lst[l];
    auth_addr_t *ad = do_addr_find(a, addr);
    if (ad && ad->until > now) {
        st->total_auth_backoff++;
        *retry_s = retry_of(ad->until - now);
        pthread_mutex_unlock(&a->mu);
        return AUTH_E_BACKOFF;
    }
    if (!key || len == 0) {
        st->total_auth_missing++;
        pthread_mutex_unlock(&a->mu);
        return AUTH_E_UNAUTHORIZED;
    }
    unsigned char h[32];
    keyhash_digest(key, len, h);
    auth_key_t *found = NULL;
    for (size_t i = 0; i < a->n_keys; i++) { /* every key compared, in constant time */
        int eq = CRYPTO_memcmp(h, a->keys[i]->hash, 32) == 0;
        if (eq && !found)
            found = a->keys[i];
    }
    OPENSSL_cleanse(h, sizeof h);
    if (!found) {
        st->total_auth_invalid++;
        if (!ad)
            ad = do_addr_claim(a, addr);
        ad->fails++;
        ad->last = now;
        if (ad->fails >= a->max_failures) {
            uint32_t d = ad->fails - a->max_failures;
            ad->until = now + a->backoff *
                                  (double)(1u << (d > AUTH_MAX_DOUBLINGS ? AUTH_MAX_DOUBLINGS : d));
        }
        pthread_mutex_unlock(&a->mu);
        return AUTH_E_UNAUTHORIZED;
    }
    if (ad)
        memset(ad, 0, sizeof *ad);
    st->total_auth_ok++;
    auth_key_ref(found);
    *out = found;
    pthread_mutex_unlock(&a->mu);
    return AUTH_OK;
}

int auth_admit(auth_t *a, auth_key_t *k, int gen, double now, auth_cause_t *cause,
               uint32_t *retry_s)
{
    *retry_s = 0;
    pthread_mutex_lock(&a->mu);
    int rc = AUTH_OK;
    if (k->rate > 0) {
        double t = now - k->bucket_t;
        if (k->bucket_t > 0 && t > 0)
            k->bucket = fmin(k->burst, k->bucket + t * k->rate);
        k->bucket_t = now;
    }
    if (k->tpm > 0) {
        double t = now - k->budget_t;
        if (k->budget_t > 0 && t > 0)
            k->budget = fmin(k->tpm, k->budget + t * k->tpm / 60.0);
        k->budget_t = now;
    }
    if (k->rate > 0 && k->bucket < 1) {
        *cause = AUTH_CAUSE_RATE;
        *retry_s = retry_of((1 - k->bucket) / k->rate);
        k->rejected_rate++;
        rc = AUTH_E_LIMIT;
    } else if (gen && k->max_concurrent && k->curr_inflight >= k->max_concurrent) {
        *cause = AUTH_CAUSE_CONCURRENCY;
        *retry_s = 1;
        k->rejected_concurrency++;
        rc = AUTH_E_LIMIT;
    } else if (gen && k->tpm > 0 && k->budget <= 0) {
        *cause = AUTH_CAUSE_TOKENS;
        *retry_s = retry_of((1 - k->budget) * 60.0 / k->tpm);
        k->rejected_tokens++;
        rc = AUTH_E_LIMIT;
    } else {
        if (k->rate > 0)
            k->bucket -= 1;
        if (gen)
            k->curr_inflight++;
        k->total_requests++;
    }
    pthread_mutex_unlock(&a->mu);
    return rc;
}

void auth_finish(auth_t *a, auth_key_t *k, uint64_t tokens, double now)
{
    pthread_mutex_lock(&a->mu);
    if (k->curr_inflight)
        k->curr_inflight--;
    k->total_tokens += tokens;
    if (k->tpm > 0) {
        double t = now - k->budget_t;
        if (k->budget_t > 0 && t > 0)
            k->budget = fmin(k->tpm, k->budget + t * k->tpm / 60.0);
        k->budget_t = now;
        k->budget -= (double)tokens;
    }
    pthread_mutex_unlock(&a->mu);
}

/* ------------------------------------------------------------------ report */

json_t *auth_report(auth_t *a)
{
    json_t *rep = json_object(), *lst = json_object(), *keys = json_object();
    if (!rep || !lst || !keys) {
        json_decref(rep);
        json_decref(lst);
        json_decref(keys);
        return NULL;
    }
    pthread_mutex_lock(&a->mu);
    for (int l = 0; l < AUTH_LST_COUNT; l++) {
        json_t *o = json_object();
        json_object_set_new(o, "required", json_boolean(a->required[l]));
#define AUTH_JSON(name, help)                                                                      \
    json_object_set_new(o, #name, json_integer((json_int_t)a->lst[l].name));
        AUTH_LISTENER_COUNTERS(AUTH_JSON)
#undef AUTH_JSON
        json_object_set_new(lst, lst_names[l], o);
    }
    for (size_t i = 0; i < a->n_keys; i++) {
        const auth_key_t *k = a->keys[i];
        json_t *o = json_object();
#define AUTH_JSON(name, help) json_object_set_new(o, #name, json_integer((json_int_t)k->name));
        AUTH_KEY_COUNTERS(AUTH_JSON)
#undef AUTH_JSON
        json_object_set_new(keys, k->name, o);
    }
    size_t backing = 0;
    double now = auth_now();
    for (size_t i = 0; i < AUTH_MAX_ADDRS; i++)
        backing += a->addrs[i].addr[0] && a->addrs[i].until > now;
    pthread_mutex_unlock(&a->mu);
    json_object_set_new(rep, "listeners", lst);
    json_object_set_new(rep, "keys", keys);
    json_object_set_new(rep, "curr_backoff_addresses", json_integer((json_int_t)backing));
    return rep;
}
