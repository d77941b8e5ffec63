/* test_fleet: the fleet file loader and the placement: replicas on distinct hosts, independence from the hosts' order, balance, movement when a host is added, errors with their location. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet.h"

#define HEAD "proxy:\n  listen: 127.0.0.1:1\n  addresses: [127.0.0.1]\n"

/* A fleet of H hosts (80GiB each, in order, or reversed) and M models of varied sizes and loads. */
static char *fleet_text(int H, int M, int reversed)
{
    size_t cap = 256 + (size_t)(H + M) * 160;
    char *s = malloc(cap), *p = s;
    p += sprintf(p, HEAD "hosts:\n");
    for (int i = 0; i < H; i++) {
        int h = reversed ? H - 1 - i : i;
        p += sprintf(p,
                     "  - name: h%d\n    http: 127.0.0.1:%d\n    device_memory: 80GiB\n"
                     "    host_memory: 0\n",
                     h, 20000 + h);
    }
    p += sprintf(p, "models:\n");
    for (int m = 0; m < M; m++)
        p += sprintf(p, "  - name: m%d\n    path: /m/%d.gguf\n    size: %dMiB\n    load: %g\n", m,
                     m, 1000 + (m * 7919) % 15000, 10.0 / (m + 1));
    return s;
}

static fleet_t *load_ok(const char *text)
{
    char err[512] = "";
    fleet_t *f = NULL;
    int rc = fleet_load_string(text, "f.yaml", &f, err, sizeof err);
    cr_assert_eq(rc, 0, "load failed: %s", err);
    return f;
}

/* place[m][host name index] for a fleet whose hosts are named h0..h(H-1), in any file order. */
static unsigned char *place_by_name(const fleet_t *f)
{
    size_t H = f->n_hosts, M = f->n_models;
    unsigned char *raw = calloc(M * H, 1), *byname = calloc(M * H, 1);
    char err[256];
    cr_assert_eq(fleet_place(f, raw, err, sizeof err), 0, "%s", err);
    for (size_t h = 0; h < H; h++) {
        size_t idx = strtoul(f->hosts[h].name + 1, NULL, 10);
        for (size_t m = 0; m < M; m++)
            byname[m * H + idx] = raw[m * H + h];
    }
    free(raw);
    return byname;
}

Test(fleet, every_model_gets_its_replicas_on_distinct_hosts)
{
    char *t = fleet_text(5, 40, 0);
    fleet_t *f = load_ok(t);
    unsigned char *p = place_by_name(f);
    for (size_t m = 0; m < f->n_models; m++) {
        int n = 0;
        for (size_t h = 0; h < f->n_hosts; h++)
            n += p[m * f->n_hosts + h];
        cr_assert_eq(n, 2, "model %zu on %d hosts", m, n);
    }
    free(p);
    fleet_free(f);
    free(t);
}

Test(fleet, the_hosts_order_in_the_file_does_not_change_the_placement)
{
    char *a = fleet_text(6, 30, 0), *b = fleet_text(6, 30, 1);
    fleet_t *fa = load_ok(a), *fb = load_ok(b);
    unsigned char *pa = place_by_name(fa), *pb = place_by_name(fb);
    cr_assert_eq(memcmp(pa, pb, 6 * 30), 0);
    free(pa);
    free(pb);
    fleet_free(fa);
    fleet_free(fb);
    free(a);
    free(b);
}

Test(fleet, adding_a_host_moves_about_one_placement_in_h)
{
    for (int H = 4; H <= 16; H *= 2) {
        char *a = fleet_text(H, 200, 0), *b = fleet_text(H + 1, 200, 0);
        fleet_t *fa = load_ok(a), *fb = load_ok(b);
        unsigned char *pa = place_by_name(fa), *pb = place_by_name(fb);
        int moved = 0;
        for (int m = 0; m < 200; m++)
            for (int h = 0; h < H; h++)
                moved += pa[m * H + h] && !pb[m * (H + 1) + h];
        /* the new host's fair part is 400/(H+1); bounded loads move a few more */
        cr_assert_leq(moved, 2 * 400 / (H + 1), "%d -> %d hosts: %d of 400 moved", H, H + 1, moved);
        free(pa);
        free(pb);
        fleet_free(fa);
        fleet_free(fb);
        free(a);
        free(b);
    }
}

Test(fleet, no_host_gets_more_than_one_and_a_half_times_its_share_plus_one_model)
{
    char *t = fleet_text(8, 200, 0);
    fleet_t *f = load_ok(t);
    unsigned char *p = place_by_name(f);
    double bytes = 0, load = 0, per[8] = {0}, big = 0;
    for (size_t m = 0; m < 200; m++) {
        bytes += 2.0 * (double)f->models[m].size;
        load += f->models[m].load;
    }
    for (size_t m = 0; m < 200; m++) {
        double c = (double)f->models[m].size / bytes + f->models[m].load / 2 / load;
        big = c > big ? c : big;
        for (size_t h = 0; h < 8; h++)
            if (p[m * 8 + h])
                per[h] += c;
    }
    for (size_t h = 0; h < 8; h++)
        cr_assert_leq(per[h], 1.5 * 2.0 / 8 + big, "host %zu carries %g", h, per[h]);
    free(p);
    fleet_free(f);
    free(t);
}

Test(fleet, a_host_too_small_for_its_models_is_an_error_naming_it)
{
    fleet_t *f =
        load_ok(HEAD "hosts:\n  - name: a\n    http: h:1\n    device_memory: 1GiB\n"
                     "    host_memory: 1GiB\nmodels:\n  - name: m\n    path: /m\n    size: 2GiB\n");
    unsigned char p[1];
    char err[256];
    cr_assert_eq(fleet_place(f, p, err, sizeof err), FLEET_ERR_PLACE);
    cr_assert(
        strstr(err, "f.yaml:5: host 'a' must hold 2GiB of models, more than its host_memory 1GiB"),
        "%s", err);
    fleet_free(f);
}

Test(fleet, load_errors_name_file_line_and_column)
{
    static const struct {
        const char *yaml, *want;
    } cases[] = {
        {HEAD "  bogus: 1\n", "f.yaml:4:3: unknown key 'bogus' in proxy"},
        {HEAD "  listen: 127.0.0.1:2\n", "f.yaml:4:3: duplicate key 'listen' in proxy"},
        {HEAD "hosts:\n  - name: a b\n",
         "f.yaml:5:11: invalid host name \"a b\" ([A-Za-z0-9._-]+)"},
        {HEAD "hosts:\n  - name: a\n    http: h:1\n    device_memory: 12GB\n",
         "f.yaml:7:20: invalid size \"12GB\" for hosts[0].device_memory"},
        {HEAD "hosts:\n  - name: a\n", "f.yaml:5:5: hosts[0]: 'http' is required"},
        {"proxy: [1]\n", "f.yaml:1:8: proxy must be a mapping"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[512] = "";
        fleet_t *f = (fleet_t *)0x1;
        int rc = fleet_load_string(cases[i].yaml, "f.yaml", &f, err, sizeof err);
        cr_assert_null(f);
        cr_assert_eq(rc, FLEET_ERR_INVALID, "case %zu: rc %d (%s)", i, rc, err);
        cr_assert(strncmp(err, cases[i].want, strlen(cases[i].want)) == 0,
                  "case %zu: got '%s', want '%s'", i, err, cases[i].want);
    }
}

/* defaults: fleet's short names and any daemon option by its dotted name, each checked by the
 * daemon's schema; the options fleet sets per host are refused there. */
Test(fleet, defaults_take_daemon_options_through_the_schema)
{
    const char *hm =
        "hosts:\n  - name: a\n    http: 127.0.0.1:2\n    device_memory: 1GiB\n"
        "    host_memory: 0\nmodels:\n  - name: m\n    path: /m.gguf\n    size: 1MiB\n";
    char text[1024], err[512];
    fleet_t *f = NULL;
    snprintf(text, sizeof text,
             HEAD "defaults:\n  scheduler.max_stall: 2s\n  page_size: 64KiB\n"
                  "  metrics.vllm_compat: false\n%s",
             hm);
    f = load_ok(text);
    /* the short names first, in fleet's order, then the others in file order */
    const char *want[][2] = {{"device.backend", "auto"},
                             {"device.page_size", "64KiB"},
                             {"device.threads", "0"},
                             {"metrics.vllm_compat", "false"},
                             {"scheduler.drain_timeout", "30s"},
                             {"scheduler.max_stall", "2s"}};
    cr_assert_eq(f->defaults.n_options, 6);
    for (size_t i = 0; i < 6; i++) {
        cr_assert_str_eq(f->defaults.options[i], want[i][0]);
        cr_assert_str_eq(f->defaults.values[i], want[i][1]);
    }
    cr_assert_eq(f->defaults.drain_timeout_ms, 30000);
    fleet_free(f);
    const char *bad[][2] = {
        {"  scheduler.max_stall: soon\n", "f.yaml:5:24: defaults.scheduler.max_stall: invalid"},
        {"  page_size: 3MiB\n", "f.yaml:5:14: defaults.page_size: invalid"},
        {"  device.memory: 1GiB\n", "f.yaml:5:3: device.memory is set by the fleet"},
        {"  listen.http: 1.2.3.4:5\n", "f.yaml:5:3: listen.http is set by the fleet"},
        {"  device.nope: 1\n", "f.yaml:5:3: unknown key 'device.nope' in defaults"},
        {"  models.path: /x\n", "f.yaml:5:3: unknown key 'models.path' in defaults"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(text, sizeof text, HEAD "defaults:\n%s%s", bad[i][0], hm);
        f = NULL;
        cr_assert_eq(fleet_load_string(text, "f.yaml", &f, err, sizeof err), FLEET_ERR_INVALID,
                     "case %zu", i);
        cr_assert(!strncmp(err, bad[i][1], strlen(bad[i][1])), "case %zu: %s", i, err);
    }
}
