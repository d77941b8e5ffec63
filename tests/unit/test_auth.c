/* test_auth: the API key store: hashing, constant-time lookup, Bearer and X-Forwarded-For parsing, per-key limits and usage, the back-off, and reloads that keep or revoke keys. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front/auth.h"
#include "keyhash.h"
#include "config.h"

/* Two keys; their hashes (keyhash_of) go into the configs the tests load. */
#define ALPHA "alpha-key"
#define BETA "beta-key"

static char alpha_hash[KEYHASH_LEN + 1], beta_hash[KEYHASH_LEN + 1];

static cfg_t *load(const char *auth_yaml)
{
    keyhash_of(ALPHA, strlen(ALPHA), alpha_hash);
    keyhash_of(BETA, strlen(BETA), beta_hash);
    char yaml[4096];
    snprintf(yaml, sizeof yaml,
             "listen:\n  http: 127.0.0.1:8400\n  tcp: 127.0.0.1:8401\n%s"
             "models:\n  - name: a\n    path: /m/a.gguf\n  - name: b\n    path: /m/b.gguf\n",
             auth_yaml);
    char err[512] = "";
    cfg_t *c = NULL;
    cr_assert_eq(cfg_load_string(yaml, "t.yaml", &c, err, sizeof err), 0, "%s\n%s", err, yaml);
    return c;
}

/* A config with keys alpha (every model) and beta (model a, with limits). */
static cfg_t *two_keys(const char *alpha_more, const char *beta_more, const char *auth_more)
{
    char tmp[2048];
    keyhash_of(ALPHA, strlen(ALPHA), alpha_hash);
    keyhash_of(BETA, strlen(BETA), beta_hash);
    snprintf(tmp, sizeof tmp,
             "auth:\n  http: true\n  tcp: true\n%s  keys:\n"
             "    - name: alpha\n      hash: \"%s\"\n      models: [\"*\"]\n%s"
             "    - name: beta\n      hash: \"%s\"\n      models: [a]\n%s",
             auth_more, alpha_hash, alpha_more, beta_hash, beta_more);
    return load(tmp);
}

static auth_t *store(const cfg_t *c)
{
    char err[256] = "";
    auth_t *a = auth_new(c, err, sizeof err);
    cr_assert_not_null(a, "%s", err);
    return a;
}

static auth_key_t *check_ok(auth_t *a, const char *key, double now)
{
    auth_key_t *k = NULL;
    uint32_t retry = 0;
    int rc = auth_check(a, AUTH_LST_HTTP, "192.0.2.1", key, strlen(key), now, &k, &retry);
    cr_assert_eq(rc, AUTH_OK, "rc %d for %s", rc, key);
    cr_assert_not_null(k);
    return k;
}

Test(auth, a_known_key_authenticates_and_names_itself)
{
    cfg_t *c = two_keys("", "", "");
    auth_t *a = store(c);
    auth_key_t *k = check_ok(a, BETA, 10);
    cr_assert_str_eq(auth_key_name(k), "beta");
    cr_assert(auth_key_allows(k, "a"));
    cr_assert_not(auth_key_allows(k, "b"));
    cr_assert_not(auth_key_allows(k, NULL));
    auth_key_unref(k);
    k = check_ok(a, ALPHA, 10);
    cr_assert(auth_key_allows(k, "b") && auth_key_allows(k, "anything"));
    auth_key_unref(k);
    auth_free(a);
    cfg_free(c);
}

Test(auth, a_missing_wrong_or_prefix_key_is_unauthorized)
{
    cfg_t *c = two_keys("", "", "");
    auth_t *a = store(c);
    auth_key_t *k = (auth_key_t *)0x1;
    uint32_t retry = 9;
    cr_assert_eq(auth_check(a, AUTH_LST_TCP, "x", NULL, 0, 1, &k, &retry), AUTH_E_UNAUTHORIZED);
    cr_assert_null(k);
    cr_assert_eq(auth_check(a, AUTH_LST_TCP, "x", "alpha-ke", 8, 1, &k, &retry),
                 AUTH_E_UNAUTHORIZED);
    cr_assert_eq(auth_check(a, AUTH_LST_TCP, "x", "alpha-keyX", 10, 1, &k, &retry),
                 AUTH_E_UNAUTHORIZED);
    cr_assert_eq(auth_check(a, AUTH_LST_TCP, "x", alpha_hash, strlen(alpha_hash), 1, &k, &retry),
                 AUTH_E_UNAUTHORIZED, "the hash is not the key");
    json_t *rep = auth_report(a);
    const json_t *tcp = json_object_get(json_object_get(rep, "listeners"), "tcp");
    cr_assert_eq(json_integer_value(json_object_get(tcp, "total_auth_missing")), 1);
    cr_assert_eq(json_integer_value(json_object_get(tcp, "total_auth_invalid")), 3);
    cr_assert(json_is_true(json_object_get(tcp, "required")));
    cr_assert(json_is_false(
        json_object_get(json_object_get(json_object_get(rep, "listeners"), "unix"), "required")));
    json_decref(rep);
    auth_free(a);
    cfg_free(c);
}

Test(auth, listeners_require_keys_as_configured_and_never_the_unix_socket)
{
    cfg_t *c = load("");
    auth_t *a = store(c);
    cr_assert_not(auth_required(a, AUTH_LST_HTTP));
    cr_assert_not(auth_required(a, AUTH_LST_TCP));
    auth_free(a);
    cfg_free(c);
    c = two_keys("", "", "");
    a = store(c);
    cr_assert(auth_required(a, AUTH_LST_HTTP) && auth_required(a, AUTH_LST_TCP));
    cr_assert_not(auth_required(a, AUTH_LST_UNIX));
    cr_assert_not(auth_required(NULL, AUTH_LST_HTTP));
    auth_free(a);
    cfg_free(c);
}

Test(auth, bearer_headers_parse_and_others_do_not)
{
    const char *t;
    size_t n;
    cr_assert_eq(auth_parse_bearer("Bearer abc", &t, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(strncmp(t, "abc", 3), 0);
    cr_assert_eq(auth_parse_bearer("  bearer \t gsk_x1  ", &t, &n), 0);
    cr_assert_eq(n, 6);
    cr_assert_eq(strncmp(t, "gsk_x1", 6), 0);
    cr_assert_eq(auth_parse_bearer("BEARER k", &t, &n), 0);
    const char *bad[] = {NULL,        "",          "Bearer",     "Bearer ",      "Bearer   ",
                         "Basic abc", "Bearerabc", "Bearer a b", "Bearer a\x01", "Token abc"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(auth_parse_bearer(bad[i], &t, &n), -1, "case %zu", i);
}

Test(auth, forwarded_for_is_believed_only_from_trusted_proxies)
{
    cfg_t *c = two_keys("", "", "  trusted_proxies: [\"127.0.0.1\", \"10.0.0.9\"]\n");
    auth_t *a = store(c);
    char out[64];
    auth_client_addr(a, "127.0.0.1", "198.51.100.7", out, sizeof out);
    cr_assert_str_eq(out, "198.51.100.7");
    auth_client_addr(a, "127.0.0.1", "203.0.113.1, 198.51.100.7, 10.0.0.9", out, sizeof out);
    cr_assert_str_eq(out, "198.51.100.7", "the rightmost untrusted hop");
    auth_client_addr(a, "127.0.0.1", "junk, 198.51.100.8 ,  ", out, sizeof out);
    cr_assert_str_eq(out, "198.51.100.8", "entries that are not addresses are skipped");
    auth_client_addr(a, "127.0.0.1", "10.0.0.9", out, sizeof out);
    cr_assert_str_eq(out, "10.0.0.9", "all trusted: the leftmost");
    auth_client_addr(a, "127.0.0.1", "nonsense", out, sizeof out);
    cr_assert_str_eq(out, "127.0.0.1");
    auth_client_addr(a, "192.0.2.5", "198.51.100.7", out, sizeof out);
    cr_assert_str_eq(out, "192.0.2.5", "an untrusted peer's header is ignored");
    auth_client_addr(a, "::ffff:127.0.0.1", "2001:db8::1", out, sizeof out);
    cr_assert_str_eq(out, "2001:db8::1", "a v4-mapped peer is its v4 address");
    auth_client_addr(a, "127.0.0.1", NULL, out, sizeof out);
    cr_assert_str_eq(out, "127.0.0.1");
    auth_free(a);
    cfg_free(c);
}

Test(auth, repeated_failures_back_off_the_address_and_a_success_clears_it)
{
    cfg_t *c = two_keys("", "", "  max_failures: 3\n  backoff: 2s\n");
    auth_t *a = store(c);
    auth_key_t *k = NULL;
    uint32_t retry = 0;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(auth_check(a, AUTH_LST_HTTP, "198.51.100.1", "nope", 4, 100, &k, &retry),
                     AUTH_E_UNAUTHORIZED);
    cr_assert_eq(
        auth_check(a, AUTH_LST_HTTP, "198.51.100.1", ALPHA, strlen(ALPHA), 100.5, &k, &retry),
        AUTH_E_BACKOFF, "even a good key waits");
    cr_assert_eq(retry, 2);
    cr_assert_null(k);
    k = check_ok(a, ALPHA, 100.5); /* another address is not affected */
    auth_key_unref(k);
    cr_assert_eq(auth_check(a, AUTH_LST_HTTP, "198.51.100.1", "nope", 4, 102.1, &k, &retry),
                 AUTH_E_UNAUTHORIZED);
    cr_assert_eq(
        auth_check(a, AUTH_LST_HTTP, "198.51.100.1", ALPHA, strlen(ALPHA), 103, &k, &retry),
        AUTH_E_BACKOFF);
    cr_assert_eq(retry, 4, "the fourth failure doubles it (2 s x 2 from 102.1)");
    cr_assert_eq(
        auth_check(a, AUTH_LST_HTTP, "198.51.100.1", ALPHA, strlen(ALPHA), 106.2, &k, &retry),
        AUTH_OK);
    auth_key_unref(k);
    cr_assert_eq(auth_check(a, AUTH_LST_HTTP, "198.51.100.1", "nope", 4, 107, &k, &retry),
                 AUTH_E_UNAUTHORIZED, "a success started the count again");
    json_t *rep = auth_report(a);
    const json_t *http = json_object_get(json_object_get(rep, "listeners"), "http");
    cr_assert_eq(json_integer_value(json_object_get(http, "total_auth_backoff")), 2);
    cr_assert_eq(json_integer_value(json_object_get(http, "total_auth_invalid")), 5);
    json_decref(rep);
    auth_free(a);
    cfg_free(c);
}

Test(auth, a_missing_key_starts_no_back_off)
{
    cfg_t *c = two_keys("", "", "  max_failures: 1\n");
    auth_t *a = store(c);
    auth_key_t *k = NULL;
    uint32_t retry = 0;
    for (int i = 0; i < 5; i++)
        cr_assert_eq(auth_check(a, AUTH_LST_HTTP, "x", NULL, 0, 1, &k, &retry),
                     AUTH_E_UNAUTHORIZED);
    k = NULL;
    cr_assert_eq(auth_check(a, AUTH_LST_HTTP, "x", ALPHA, strlen(ALPHA), 1, &k, &retry), AUTH_OK);
    auth_key_unref(k);
    auth_free(a);
    cfg_free(c);
}

Test(auth, the_rate_limit_passes_a_burst_then_refills_at_the_rate)
{
    cfg_t *c = two_keys("", "      rate: 2\n      burst: 3\n", "");
    auth_t *a = store(c);
    auth_key_t *k = check_ok(a, BETA, 10);
    auth_cause_t cause;
    uint32_t retry;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(auth_admit(a, k, 0, 10, &cause, &retry), AUTH_OK, "request %d of the burst",
                     i);
    cr_assert_eq(auth_admit(a, k, 0, 10, &cause, &retry), AUTH_E_LIMIT);
    cr_assert_eq(cause, AUTH_CAUSE_RATE);
    cr_assert_eq(retry, 1);
    cr_assert_eq(auth_admit(a, k, 0, 10.4, &cause, &retry), AUTH_E_LIMIT,
                 "0.8 of a request refilled");
    cr_assert_eq(auth_admit(a, k, 0, 10.5, &cause, &retry), AUTH_OK, "one refilled at 2/s");
    cr_assert_eq(auth_admit(a, k, 0, 100, &cause, &retry), AUTH_OK);
    cr_assert_eq(auth_admit(a, k, 0, 100, &cause, &retry), AUTH_OK);
    cr_assert_eq(auth_admit(a, k, 0, 100, &cause, &retry), AUTH_OK);
    cr_assert_eq(auth_admit(a, k, 0, 100, &cause, &retry), AUTH_E_LIMIT,
                 "refills stop at the burst");
    auth_key_t *other = check_ok(a, ALPHA, 100);
    for (int i = 0; i < 50; i++)
        cr_assert_eq(auth_admit(a, other, 1, 100, &cause, &retry), AUTH_OK,
                     "the other key is unlimited");
    for (int i = 0; i < 50; i++)
        auth_finish(a, other, 2, 100);
    json_t *rep = auth_report(a);
    const json_t *b = json_object_get(json_object_get(rep, "keys"), "beta");
    cr_assert_eq(json_integer_value(json_object_get(b, "total_requests")), 7);
    cr_assert_eq(json_integer_value(json_object_get(b, "rejected_rate")), 3);
    const json_t *al = json_object_get(json_object_get(rep, "keys"), "alpha");
    cr_assert_eq(json_integer_value(json_object_get(al, "total_tokens")), 100);
    cr_assert_eq(json_integer_value(json_object_get(al, "curr_inflight")), 0);
    json_decref(rep);
    auth_key_unref(k);
    auth_key_unref(other);
    auth_free(a);
    cfg_free(c);
}

Test(auth, the_concurrency_limit_counts_generations_in_flight)
{
    cfg_t *c = two_keys("", "      max_concurrent: 2\n", "");
    auth_t *a = store(c);
    auth_key_t *k = check_ok(a, BETA, 1);
    auth_cause_t cause;
    uint32_t retry;
    cr_assert_eq(auth_admit(a, k, 1, 1, &cause, &retry), AUTH_OK);
    cr_assert_eq(auth_admit(a, k, 1, 1, &cause, &retry), AUTH_OK);
    cr_assert_eq(auth_admit(a, k, 1, 1, &cause, &retry), AUTH_E_LIMIT);
    cr_assert_eq(cause, AUTH_CAUSE_CONCURRENCY);
    cr_assert_eq(auth_admit(a, k, 0, 1, &cause, &retry), AUTH_OK,
                 "a models or tokenize op takes no slot");
    auth_finish(a, k, 7, 2);
    cr_assert_eq(auth_admit(a, k, 1, 2, &cause, &retry), AUTH_OK,
                 "a finished request gave its slot back");
    auth_key_unref(k);
    auth_free(a);
    cfg_free(c);
}

Test(auth, tokens_per_minute_refuse_while_the_budget_is_spent)
{
    cfg_t *c = two_keys("", "      tokens_per_minute: 600\n", "");
    auth_t *a = store(c);
    auth_key_t *k = check_ok(a, BETA, 1);
    auth_cause_t cause;
    uint32_t retry;
    cr_assert_eq(auth_admit(a, k, 1, 1, &cause, &retry), AUTH_OK);
    auth_finish(a, k, 700, 1); /* 100 tokens over: 10 s to pay back at 10/s */
    cr_assert_eq(auth_admit(a, k, 1, 1, &cause, &retry), AUTH_E_LIMIT);
    cr_assert_eq(cause, AUTH_CAUSE_TOKENS);
    cr_assert(retry >= 10 && retry <= 11, "retry %u", retry);
    cr_assert_eq(auth_admit(a, k, 0, 1, &cause, &retry), AUTH_OK, "ops that use no tokens pass");
    cr_assert_eq(auth_admit(a, k, 1, 12, &cause, &retry), AUTH_OK, "paid back");
    auth_key_unref(k);
    auth_free(a);
    cfg_free(c);
}

Test(auth, a_key_gives_its_requests_its_allow_list_name_deadline_and_class)
{
    cfg_t *c = two_keys("", "      deadline: 1500ms\n      class: batch\n", "");
    auth_t *a = store(c);
    auth_key_t *al = check_ok(a, ALPHA, 1), *be = check_ok(a, BETA, 1);
    proto_req_t r = {0};
    cr_assert_eq(auth_key_apply(al, &r), 0);
    cr_assert_null(r.allow, "every model: no list");
    cr_assert_eq(r.n_allow, 0);
    cr_assert_str_eq(r.tenant, "alpha");
    cr_assert_eq(r.deadline_ms, 0);
    cr_assert_eq(r.batch, 0);
    proto_req_free(&r);
    memset(&r, 0, sizeof r);
    cr_assert_eq(auth_key_apply(be, &r), 0);
    cr_assert_eq(r.n_allow, 1);
    cr_assert_str_eq(r.allow[0], "a");
    cr_assert_eq(r.deadline_ms, 1500);
    cr_assert_eq(r.batch, 1);
    proto_req_free(&r);
    memset(&r, 0, sizeof r);
    r.deadline_ms = 300; /* the request's own deadline comes first */
    cr_assert_eq(auth_key_apply(be, &r), 0);
    cr_assert_eq(r.deadline_ms, 300);
    proto_req_free(&r);
    memset(&r, 0, sizeof r);
    cr_assert_eq(auth_key_apply(NULL, &r), 0);
    cr_assert_null(r.tenant);
    auth_key_unref(al);
    auth_key_unref(be);
    auth_free(a);
    cfg_free(c);
}

Test(auth, a_reload_revokes_removed_keys_and_keeps_the_state_of_the_others)
{
    cfg_t *c = two_keys("", "      rate: 1\n      burst: 1\n", "");
    auth_t *a = store(c);
    auth_key_t *al = check_ok(a, ALPHA, 1), *be = check_ok(a, BETA, 1);
    auth_cause_t cause;
    uint32_t retry;
    cr_assert_eq(auth_admit(a, be, 0, 1, &cause, &retry), AUTH_OK);
    char tmp[1024];
    snprintf(tmp, sizeof tmp,
             "auth:\n  http: true\n  tcp: true\n  keys:\n    - name: beta\n      hash: \"%s\"\n"
             "      models: [a, b]\n      rate: 1\n      burst: 1\n",
             beta_hash);
    cfg_t *next = load(tmp);
    cr_assert_eq(auth_reload(a, next), 0);
    cr_assert(auth_key_revoked(al), "alpha is gone");
    cr_assert_not(auth_key_revoked(be));
    cr_assert(auth_key_allows(be, "b"), "beta took its new models");
    cr_assert_eq(auth_admit(a, be, 0, 1, &cause, &retry), AUTH_E_LIMIT, "its bucket was kept");
    auth_key_t *k = NULL;
    cr_assert_eq(auth_check(a, AUTH_LST_HTTP, "x", ALPHA, strlen(ALPHA), 2, &k, &retry),
                 AUTH_E_UNAUTHORIZED);
    cr_assert_str_eq(auth_key_name(al), "alpha", "a revoked key stays readable while referenced");
    json_t *rep = auth_report(a);
    cr_assert_null(json_object_get(json_object_get(rep, "keys"), "alpha"));
    json_decref(rep);
    auth_key_unref(al);
    auth_key_unref(be);
    auth_free(a);
    cfg_free(c);
    cfg_free(next);
}

Test(auth, the_report_names_keys_and_carries_no_key_material)
{
    cfg_t *c = two_keys("", "", "");
    auth_t *a = store(c);
    auth_key_t *k = check_ok(a, ALPHA, 1);
    json_t *rep = auth_report(a);
    char *s = json_dumps(rep, 0);
    cr_assert(strstr(s, "\"alpha\"") && strstr(s, "\"beta\""));
    cr_assert_null(strstr(s, ALPHA));
    cr_assert_null(strstr(s, BETA));
    cr_assert_null(strstr(s, alpha_hash + 7));
    cr_assert_null(strstr(s, beta_hash + 7));
    free(s);
    json_decref(rep);
    auth_key_unref(k);
    auth_free(a);
    cfg_free(c);
}
