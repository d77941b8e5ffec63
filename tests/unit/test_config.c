/* test_config: the YAML config loader: the example file, defaults, every error class with its location, value parsers, print round trips and reload checks. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "testutil.h"

#define EXAMPLE "config/gpuswapd.yaml" /* unit tests run from the repository root */
#define MODELS "models:\n  - name: a\n    path: /m/a.gguf\n"

/* ------------------------------------------------------------------ helpers */

static cfg_t *load_ok(const char *yaml)
{
    char err[512] = "";
    cfg_t *c = NULL;
    int rc = cfg_load_string(yaml, "t.yaml", &c, err, sizeof err);
    cr_assert_eq(rc, 0, "load failed: %s\n--- yaml:\n%s", err, yaml);
    cr_assert_not_null(c);
    return c;
}

/* Loading yaml fails with code and exactly the message want. */
static void load_fails(const char *yaml, int code, const char *want)
{
    char err[512] = "";
    cfg_t *c = (cfg_t *)0x1;
    int rc = cfg_load_string(yaml, "t.yaml", &c, err, sizeof err);
    cr_assert_null(c, "no config on failure");
    cr_assert_eq(rc, code, "rc %d, want %d (%s)", rc, code, err);
    cr_assert_str_eq(err, want);
}

/* Loading yaml fails as invalid with a message that contains want. */
static void load_fails_with(const char *yaml, const char *want)
{
    char err[512] = "";
    cfg_t *c = NULL;
    int rc = cfg_load_string(yaml, "t.yaml", &c, err, sizeof err);
    cr_assert_null(c);
    cr_assert_eq(rc, CFG_ERR_INVALID, "rc %d (%s)", rc, err);
    cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
}

static char *print_str(const cfg_t *c)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    cr_assert_not_null(f);
    cr_assert_eq(cfg_print(c, f), 0);
    fclose(f);
    return s;
}

/* print -> load -> print gives the same text; returns nothing, frees all. */
static void assert_round_trip(const cfg_t *c)
{
    char *a = print_str(c);
    char err[512] = "";
    cfg_t *d = NULL;
    cr_assert_eq(cfg_load_string(a, "printed.yaml", &d, err, sizeof err), 0, "%s\n--- printed:\n%s",
                 err, a);
    char *b = print_str(d);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
    cfg_free(d);
}

/* ------------------------------------------------------------------ the example file */

Test(config, the_example_file_loads_cleanly)
{
    char err[512] = "";
    cfg_t *c = NULL;
    int rc = cfg_load_file(EXAMPLE, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(c->file, EXAMPLE);
    cr_assert_str_eq(c->listen.socket, "/run/gpuswapd/gpuswapd.sock");
    cr_assert_str_eq(c->admin.socket, "/run/gpuswapd/admin.sock");
    cr_assert_eq(c->admin.mode, 0600);
    cr_assert_eq(c->device.memory, 60ull << 30);
    cr_assert_eq(c->host.memory, 400ull << 30);
    cr_assert_eq(c->n_models, 4);
    const cfg_model_t *l = cfg_find_model(c, "llama3-8b-support");
    cr_assert(l && !l->path && l->adapter && !strcmp(l->base, "llama3-8b"));
    const cfg_model_t *m = cfg_find_model(c, "llama3-8b");
    cr_assert_not_null(m);
    cr_assert_eq(m->gpu_quota, 12ull << 30);
    cr_assert_eq(m->max_batch, 32);
    cr_assert_eq(m->max_context, 8192);
    cr_assert_float_eq(m->priority, 2.0, 1e-12);
    const cfg_model_t *q = cfg_find_model(c, "qwen2-7b");
    cr_assert(q && q->pinned);
    cr_assert_eq(q->max_batch, c->scheduler.max_batch);
    for (size_t i = 1; i < c->n_models; i++)
        cr_assert_gt(c->models[i].line, c->models[i - 1].line, "each model knows its line");
    cfg_free(c);
}

Test(config, the_example_serves_http_on_loopback_only_and_keeps_state_under_run_and_var_lib)
{
    char err[512] = "";
    cfg_t *c = NULL;
    cr_assert_eq(cfg_load_file(EXAMPLE, &c, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(c->listen.http);
    cr_assert(strncmp(c->listen.http, "127.0.0.1:", 10) == 0 ||
                  strncmp(c->listen.http, "[::1]:", 6) == 0,
              "http %s", c->listen.http);
    cr_assert_null(c->listen.tcp);
    cr_assert(strncmp(c->listen.socket, "/run/gpuswapd/", 14) == 0);
    for (size_t i = 0; i < c->n_models; i++) {
        const char *p = c->models[i].adapter ? c->models[i].adapter : c->models[i].path;
        cr_assert(strncmp(p, "/var/lib/gpuswapd/", 18) == 0, "%s", p);
    }
    cfg_free(c);
}

Test(config, the_example_mentions_every_key_the_printer_writes)
{
    char err[512] = "";
    cfg_t *c = NULL;
    cr_assert_eq(cfg_load_file(EXAMPLE, &c, err, sizeof err), 0, "%s", err);
    FILE *f = fopen(EXAMPLE, "r");
    cr_assert_not_null(f);
    static char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    char *p = print_str(c);
    for (char *line = strtok(p, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        char key[64];
        if (sscanf(line, " - %63[a-z_]:", key) != 1 && sscanf(line, " %63[a-z_]:", key) != 1)
            continue;
        char needle[80];
        snprintf(needle, sizeof needle, " %s:", key);
        char top[80];
        snprintf(top, sizeof top, "\n%s:", key);
        cr_assert(strstr(text, needle) || strstr(text, top), "example lacks key '%s'", key);
    }
    free(p);
    cfg_free(c);
}

Test(config, the_example_survives_a_print_and_reload_round_trip)
{
    char err[512] = "";
    cfg_t *c = NULL;
    cr_assert_eq(cfg_load_file(EXAMPLE, &c, err, sizeof err), 0, "%s", err);
    assert_round_trip(c);
    cfg_free(c);
}

/* ------------------------------------------------------------------ defaults */

Test(config, a_listen_section_turns_the_default_http_off_and_runtime_dir_follows_the_rules)
{
    cfg_t *c = load_ok("listen:\n  socket: /s.sock\nadmin:\n  socket: /a.sock\n" MODELS);
    cr_assert_null(c->listen.http, "a listen section names its listeners");
    cr_assert_null(c->rundir, "every socket named: no runtime directory to make");
    cfg_free(c);
    c = load_ok(MODELS);
    cr_assert_not_null(c->rundir, "a default socket: its directory is made at start");
    cr_assert(strncmp(c->listen.socket, c->rundir, strlen(c->rundir)) == 0, "%s in %s",
              c->listen.socket, c->rundir);
    cfg_free(c);
    char buf[256];
    cr_assert_eq(cfg_runtime_dir("/etc/x", buf, sizeof buf), 0);
    if (geteuid() == 0)
        cr_assert_str_eq(buf, "/run/gpuswapd");
    cr_assert_eq(cfg_runtime_dir("/etc/x", buf, 4), -1, "too long for the buffer");
}

Test(config, max_context_applies_at_most_the_trained_context_and_says_whether_set)
{
    cfg_t *c = load_ok(MODELS);
    cr_assert_eq(c->models[0].max_context, 4096);
    cr_assert_eq(c->models[0].max_context_set, 0);
    cr_assert_eq(cfg_model_context(&c->models[0], 2048), 2048);
    cr_assert_eq(cfg_model_context(&c->models[0], 8192), 4096);
    cr_assert_eq(cfg_model_context(&c->models[0], 0), 4096, "trained context unknown");
    cfg_free(c);
    c = load_ok("models:\n  - name: a\n    path: /m/a.gguf\n    max_context: 8192\n");
    cr_assert_eq(c->models[0].max_context_set, 1);
    cfg_free(c);
}

Test(config, changes_name_every_changed_key_as_the_file_does)
{
    cfg_t *a = load_ok("scheduler:\n  max_wait: 2s\n" MODELS);
    cfg_t *b = load_ok("scheduler:\n  max_wait: 3s\nlog:\n  level: debug\n"
                       "models:\n  - name: a\n    path: /m/a.gguf\n    chat_template: chatml\n"
                       "    gpu_quota: 4MiB\n    defaults:\n      top_k: 7\n");
    char buf[256];
    cr_assert_eq(cfg_model_changes(&a->models[0], &b->models[0], buf, sizeof buf), 3);
    cr_assert_str_eq(buf, "gpu_quota, chat_template, defaults.top_k");
    cr_assert_eq(cfg_model_changes(&a->models[0], &a->models[0], buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "");
    cr_assert_eq(cfg_changes(a, b, buf, sizeof buf), 2);
    cr_assert_str_eq(buf, "scheduler.max_wait, log.level");
    cr_assert_eq(cfg_changes(a, b, buf, 12), 2, "counted also when cut short");
    cr_assert_str_eq(buf, "scheduler.m");
    cfg_free(a);
    cfg_free(b);
}

Test(config, a_minimal_config_gets_the_documented_defaults)
{
    cfg_t *c = load_ok(MODELS);
    cr_assert_str_eq(c->file, "t.yaml");
    cr_assert_str_eq(c->listen.socket, "/run/gpuswapd/gpuswapd.sock");
    cr_assert_eq(c->listen.mode, 0660);
    cr_assert_null(c->listen.tcp);
    /* no listen section (a models-only config): OpenAI HTTP on loopback, as gpuswapd serve */
    cr_assert_str_eq(c->listen.http, CFG_DEFAULT_HTTP);
    cr_assert_eq(c->listen.max_line, 1u << 20);
    cr_assert_eq(c->listen.max_connections, 1024);
    cr_assert_str_eq(c->admin.socket, "/run/gpuswapd/admin.sock");
    cr_assert_eq(c->admin.mode, 0600);
    cr_assert_eq(c->admin.uids.n, 0);
    cr_assert_eq(c->admin.gids.n, 0);
    cr_assert_eq(c->device.backend, CFG_BACKEND_AUTO);
    cr_assert_eq(c->device.gpu, 0);
    cr_assert_eq(c->device.memory, 0);
    cr_assert_eq(c->device.page_size, 2u << 20);
    cr_assert_eq(c->device.sim_bandwidth, 0);
    cr_assert_eq(c->device.threads, 0);
    cr_assert_eq(c->host.memory, 0);
    cr_assert_eq(c->scheduler.policy, CFG_POLICY_SWAP_AWARE);
    cr_assert_eq(c->scheduler.max_batch, 16);
    cr_assert_eq(c->scheduler.max_wait_ms, 2000);
    cr_assert_eq(c->scheduler.max_stall_ms, 500);
    cr_assert_float_eq(c->scheduler.quantum, 4.0, 1e-12);
    cr_assert_eq(c->scheduler.queue_limit, 256);
    cr_assert_eq(c->scheduler.max_queued, 4096);
    cr_assert_eq(c->scheduler.drain_timeout_ms, 30000);
    cr_assert_eq(c->n_models, 1);
    const cfg_model_t *m = &c->models[0];
    cr_assert_str_eq(m->name, "a");
    cr_assert_str_eq(m->path, "/m/a.gguf");
    cr_assert_eq(m->gpu_quota, 0);
    cr_assert_eq(m->kv_cache, 0);
    cr_assert_eq(m->kv_type, CFG_KV_F16);
    cr_assert_float_eq(m->priority, 1.0, 1e-12);
    cr_assert_eq(m->pinned, 0);
    cr_assert_eq(m->max_batch, 16);
    cr_assert_eq(m->max_context, 4096);
    cr_assert_float_eq(m->defaults.temperature, 0.8f, 1e-7);
    cr_assert_eq(m->defaults.top_k, 40);
    cr_assert_float_eq(m->defaults.top_p, 0.95f, 1e-7);
    cr_assert_float_eq(m->defaults.min_p, 0.05f, 1e-7);
    cr_assert_float_eq(m->defaults.repeat_penalty, 1.0f, 1e-7);
    cr_assert_eq(m->defaults.max_tokens, 256);
    cr_assert_eq(m->line, 2);
    cfg_free(c);
}

Test(config, a_model_without_max_batch_inherits_the_scheduler_max_batch)
{
    cfg_t *c = load_ok("scheduler:\n  max_batch: 7\n" MODELS
                       "  - name: b\n    path: /m/b\n    max_batch: 3\n");
    cr_assert_eq(c->models[0].max_batch, 7);
    cr_assert_eq(c->models[1].max_batch, 3);
    cr_assert_eq(c->models[1].line, 6);
    cfg_free(c);
}

Test(config, values_of_every_type_are_read)
{
    cfg_t *c = load_ok(
        "listen:\n  socket: ~\n  mode: 0644\n  tcp: \"[::1]:9000\"\n  http: localhost:8400\n"
        "  max_line: 64KiB\n  max_connections: 10\n"
        "admin:\n  socket: /tmp/a.sock\n  mode: \"0660\"\n  uids: [0, 1000, 4294967294]\n  gids:\n    - 27\n"
        "device:\n  backend: sim\n  gpu: 2\n  memory: 1.5GiB\n  page_size: 64KiB\n"
        "  sim_bandwidth: 25GiB/s\n  threads: 4\n"
        "host:\n  memory: 1TiB\n"
        "scheduler:\n  policy: fifo\n  max_wait: 250ms\n  max_stall: 80ms\n  quantum: 2.5\n  drain_timeout: 1m\n"
        "models:\n  - name: llama3:8b-q8_0\n    path: rel/m.gguf\n    pinned: yes\n    priority: 0.25\n"
        "    kv_cache: 100MiB\n    gpu_quota: 1GiB\n    defaults: {temperature: 0, top_k: 0, top_p: 1,"
        " min_p: 0, repeat_penalty: 1.1, presence_penalty: -0.5, frequency_penalty: 2, max_tokens: 4096}\n");
    cr_assert_null(c->listen.socket);
    cr_assert_eq(c->listen.mode, 0644);
    cr_assert_str_eq(c->listen.tcp, "[::1]:9000");
    cr_assert_str_eq(c->listen.http, "localhost:8400");
    cr_assert_eq(c->listen.max_line, 64 << 10);
    cr_assert_eq(c->admin.uids.n, 3);
    cr_assert_eq(c->admin.uids.ids[2], 4294967294u);
    cr_assert_eq(c->admin.gids.n, 1);
    cr_assert_eq(c->admin.gids.ids[0], 27);
    cr_assert_eq(c->device.backend, CFG_BACKEND_SIM);
    cr_assert_eq(c->device.gpu, 2);
    cr_assert_eq(c->device.memory, 3ull << 29);
    cr_assert_eq(c->device.sim_bandwidth, 25ull << 30);
    cr_assert_eq(c->host.memory, 1ull << 40);
    cr_assert_eq(c->scheduler.policy, CFG_POLICY_FIFO);
    cr_assert_eq(c->scheduler.max_wait_ms, 250);
    cr_assert_eq(c->scheduler.max_stall_ms, 80);
    cr_assert_eq(c->scheduler.drain_timeout_ms, 60000);
    const cfg_model_t *m = cfg_find_model(c, "llama3:8b-q8_0");
    cr_assert_not_null(m);
    cr_assert_eq(m->pinned, 1);
    cr_assert_float_eq(m->defaults.repeat_penalty, 1.1f, 1e-7);
    cr_assert_float_eq(m->defaults.presence_penalty, -0.5f, 1e-7);
    cr_assert_float_eq(m->defaults.frequency_penalty, 2.0f, 1e-7);
    cr_assert_eq(m->defaults.max_tokens, 4096);
    cr_assert_eq(m->defaults.top_k, 0);
    cr_assert_null(cfg_find_model(c, "llama3"));
    assert_round_trip(c);
    cfg_free(c);
}

Test(config, a_sim_bandwidth_may_be_written_with_or_without_per_second)
{
    cfg_t *c = load_ok("device:\n  sim_bandwidth: 12GiB\n" MODELS);
    cr_assert_eq(c->device.sim_bandwidth, 12ull << 30);
    cfg_free(c);
    load_fails(
        "device:\n  sim_bandwidth: 12GB/s\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:18: invalid rate \"12GB/s\" for device.sim_bandwidth (use B, KiB, MiB, GiB, TiB; 'GB' is "
        "ambiguous, per second)");
}

/* ------------------------------------------------------------------ key errors */

Test(config, an_unknown_key_names_file_line_column_and_suggests_the_nearest_key)
{
    load_fails(MODELS "    gpu_qouta: 1GiB\n", CFG_ERR_INVALID,
               "t.yaml:4:5: unknown key 'gpu_qouta' in models[0] (did you mean 'gpu_quota'?)");
    load_fails("devices:\n  gpu: 1\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:1:1: unknown key 'devices' at the top level (did you mean 'device'?)");
    load_fails(
        MODELS "    defaults:\n      temprature: 1\n", CFG_ERR_INVALID,
        "t.yaml:5:7: unknown key 'temprature' in models[0].defaults (did you mean 'temperature'?)");
}

Test(config, an_unknown_key_that_belongs_elsewhere_says_where)
{
    load_fails("device:\n  max_wait: 1s\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:3: unknown key 'max_wait' in device (did you mean 'scheduler.max_wait'?)");
    load_fails(
        "priority: 2\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:1:1: unknown key 'priority' at the top level ('priority' belongs in each models[] entry)");
    load_fails_with("frobnicate: 1\n" MODELS,
                    "t.yaml:1:1: unknown key 'frobnicate' at the top level");
}

Test(config, a_duplicate_key_is_an_error_naming_both_lines)
{
    load_fails("device:\n  gpu: 1\n  gpu: 2\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:3:3: duplicate key 'gpu' in device (first set at line 2)");
    load_fails("device:\n  gpu: 1\ndevice:\n  gpu: 2\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:3:1: duplicate key 'device' at the top level (first set at line 2)");
    load_fails(MODELS "    path: /m/b\n", CFG_ERR_INVALID,
               "t.yaml:4:5: duplicate key 'path' in models[0] (first set at line 3)");
}

Test(config, a_duplicate_key_in_a_second_model_is_caught_per_model)
{
    cfg_t *c =
        load_ok(MODELS "  - name: b\n    path: /m/b\n"); /* same keys in two models are fine */
    cfg_free(c);
    load_fails(MODELS "  - name: b\n    name: c\n    path: /m/b\n", CFG_ERR_INVALID,
               "t.yaml:5:5: duplicate key 'name' in models[1] (first set at line 4)");
}

/* ------------------------------------------------------------------ type errors */

Test(config, a_list_where_a_value_is_wanted_is_an_error)
{
    load_fails("device:\n  memory: [1, 2]\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:11: expected a single value for device.memory, got a list");
    load_fails("device:\n  memory:\n    a: 1\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:3:5: expected a single value for device.memory, got a mapping");
}

Test(config, a_value_where_a_mapping_or_list_is_wanted_is_an_error)
{
    load_fails("device: cuda\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:1:9: expected a mapping for device, got \"cuda\"");
    load_fails("models: a.gguf\n", CFG_ERR_INVALID,
               "t.yaml:1:9: expected a list of models for models, got \"a.gguf\"");
    load_fails("models:\n  - a.gguf\n", CFG_ERR_INVALID,
               "t.yaml:2:5: expected a mapping for models[0], got \"a.gguf\"");
    load_fails("admin:\n  uids: 1000\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:9: expected a list of ids for admin.uids, got \"1000\"");
    load_fails("- 1\n- 2\n", CFG_ERR_INVALID,
               "t.yaml:1:1: expected a mapping at the top level, got a list");
}

Test(config, a_non_number_for_an_integer_is_an_error_naming_the_value)
{
    load_fails("scheduler:\n  max_batch: abc\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:14: invalid integer \"abc\" for scheduler.max_batch");
    load_fails("scheduler:\n  max_batch: 1.5\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:14: invalid integer \"1.5\" for scheduler.max_batch");
    load_fails("scheduler:\n  max_batch: 0x10\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:14: invalid integer \"0x10\" for scheduler.max_batch");
    load_fails("scheduler:\n  quantum: fast\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:12: invalid number \"fast\" for scheduler.quantum");
    load_fails("scheduler:\n  quantum: nan\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:12: invalid number \"nan\" for scheduler.quantum");
    load_fails("admin:\n  uids: [0, -1]\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:13: invalid id \"-1\" in admin.uids[1] (use a number 0..4294967294)");
}

Test(config, a_bad_size_names_the_value_and_the_units)
{
    load_fails(
        "device:\n  backend: sim\n  memory: 12GB\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:3:11: invalid size \"12GB\" for device.memory (use B, KiB, MiB, GiB, TiB; 'GB' is ambiguous)");
    load_fails(
        "device:\n  memory: 12 parsecs\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:11: invalid size \"12 parsecs\" for device.memory (use B, KiB, MiB, GiB, TiB)");
    load_fails("device:\n  memory: -1GiB\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:11: invalid size \"-1GiB\" for device.memory (sizes cannot be negative)");
    load_fails(
        "host:\n  memory: 99999999TiB\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:11: invalid size \"99999999TiB\" for host.memory (too large: at most 16EiB - 1)");
}

Test(config, other_bad_values_name_the_value_and_what_is_accepted)
{
    load_fails(
        "scheduler:\n  max_wait: 2\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:13: invalid duration \"2\" for scheduler.max_wait (missing unit: use ms, s, m, h, e.g. "
        "250ms, 1.5s)");
    load_fails(
        "scheduler:\n  max_wait: soon\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:13: invalid duration \"soon\" for scheduler.max_wait (use ms, s, m, h, e.g. 250ms, 1.5s)");
    load_fails(
        MODELS "    pinned: maybe\n", CFG_ERR_INVALID,
        "t.yaml:4:13: invalid boolean \"maybe\" for models[0].pinned (use true, false, yes, no)");
    load_fails("device:\n  backend: gpu\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:12: invalid value \"gpu\" for device.backend (use auto, cuda, sim, cpu)");
    load_fails("scheduler:\n  policy: lru\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:11: invalid value \"lru\" for scheduler.policy (use swap-aware, fifo)");
    load_fails(
        "listen:\n  mode: rw-rw----\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:9: invalid mode \"rw-rw----\" for listen.mode (use an octal string such as \"0660\")");
    load_fails("listen:\n  mode: \"4777\"\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:9: invalid mode \"4777\" for listen.mode (at most 0777)");
    load_fails(
        "listen:\n  http: 8400\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:9: invalid address \"8400\" for listen.http (use host:port, e.g. 127.0.0.1:8400, "
        "gpu-a.example:8400 or [::1]:8400)");
    load_fails(
        "listen:\n  http: localhost:99999\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:9: invalid address \"localhost:99999\" for listen.http (port must be 1..65535)");
    load_fails(
        "listen:\n  tcp: ::1:8400\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:8: invalid address \"::1:8400\" for listen.tcp (write an IPv6 address in brackets: "
        "[addr]:port)");
    load_fails(
        "models:\n  - name: my model\n    path: /m\n", CFG_ERR_INVALID,
        "t.yaml:2:11: invalid model name \"my model\" for models[0].name (use 1 to 128 letters, digits and . _ "
        ": -)");
    load_fails("models:\n  - name: a\n    path: \"\"\n", CFG_ERR_INVALID,
               "t.yaml:3:11: invalid path \"\" for models[0].path (must be 1 to 4095 bytes)");
    load_fails(MODELS "    max_context: ~\n", CFG_ERR_INVALID,
               "t.yaml:4:18: missing value for models[0].max_context");
    load_fails("models:\n  - name: a\n    path: \"a\\0b\"\n", CFG_ERR_INVALID,
               "t.yaml:3:11: value for models[0].path contains a NUL byte");
}

/* ------------------------------------------------------------------ bounds */

Test(config, a_value_out_of_bounds_is_an_error_naming_the_bounds)
{
    load_fails(
        "scheduler:\n  max_batch: 0\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:14: invalid value \"0\" for scheduler.max_batch (must be between 1 and 4096)");
    load_fails(
        MODELS "    max_batch: 0\n", CFG_ERR_INVALID,
        "t.yaml:4:16: invalid value \"0\" for models[0].max_batch (must be between 1 and 4096)");
    load_fails(MODELS "    priority: 0\n", CFG_ERR_INVALID,
               "t.yaml:4:15: invalid value \"0\" for models[0].priority (must be > 0 and <= 1000)");
    load_fails(
        MODELS "    priority: -1\n", CFG_ERR_INVALID,
        "t.yaml:4:15: invalid value \"-1\" for models[0].priority (must be > 0 and <= 1000)");
    load_fails(
        MODELS "    defaults:\n      min_p: 1.5\n", CFG_ERR_INVALID,
        "t.yaml:5:14: invalid value \"1.5\" for models[0].defaults.min_p (must be between 0 and 1)");
    load_fails(
        MODELS "    defaults:\n      presence_penalty: 2.5\n", CFG_ERR_INVALID,
        "t.yaml:5:25: invalid value \"2.5\" for models[0].defaults.presence_penalty (must be between -2 and 2)");
    load_fails(
        MODELS "    defaults:\n      frequency_penalty: -3\n", CFG_ERR_INVALID,
        "t.yaml:5:26: invalid value \"-3\" for models[0].defaults.frequency_penalty (must be between -2 and 2)");
    load_fails(
        MODELS "    defaults:\n      top_k: -5\n", CFG_ERR_INVALID,
        "t.yaml:5:14: invalid value \"-5\" for models[0].defaults.top_k (must be between 0 and 1000000)");
    load_fails(
        "listen:\n  max_line: 100B\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:13: invalid value \"100B\" for listen.max_line (must be between 1KiB and 1GiB)");
    load_fails(
        "scheduler:\n  max_wait: 2h\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:13: invalid value \"2h\" for scheduler.max_wait (must be between 1ms and 1h)");
    load_fails(
        "scheduler:\n  queue_limit: 99999999999999999999\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:16: invalid value \"99999999999999999999\" for scheduler.queue_limit (must be between 1 "
        "and 1000000)");
    load_fails(
        MODELS "    defaults:\n      temperature: 1e39\n", CFG_ERR_INVALID,
        "t.yaml:5:20: invalid value \"1e39\" for models[0].defaults.temperature (must be between 0 and 100)");
}

Test(config, a_page_size_must_be_a_power_of_two_multiple_of_4KiB)
{
    load_fails("device:\n  page_size: 3MiB\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:14: invalid value \"3MiB\" for device.page_size (must be a power of two)");
    load_fails(
        "device:\n  page_size: 2KiB\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:14: invalid value \"2KiB\" for device.page_size (must be between 4KiB and 1GiB)");
    cfg_t *c = load_ok("device:\n  page_size: 4KiB\n" MODELS);
    cr_assert_eq(c->device.page_size, 4096);
    cfg_free(c);
}

/* ------------------------------------------------------------------ combinations */

Test(config, the_sim_backend_requires_device_memory)
{
    load_fails(
        "device:\n  backend: sim\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:2:12: device.memory is required for backend sim (the size of the simulated device)");
    load_fails(
        "device:\n  backend: sim\n  memory: 0\n" MODELS, CFG_ERR_INVALID,
        "t.yaml:3:11: device.memory is required for backend sim (the size of the simulated device)");
    cfg_t *c = load_ok("device:\n  backend: cuda\n" MODELS); /* cuda: 0 = 90% of free memory */
    cfg_free(c);
}

Test(config, a_gpu_quota_larger_than_device_memory_is_an_error_naming_both)
{
    load_fails("device:\n  backend: sim\n  memory: 8GiB\n" MODELS
               "  - name: b\n    path: /m/b\n    gpu_quota: 12GiB\n",
               CFG_ERR_INVALID,
               "t.yaml:9:16: models[1].gpu_quota 12GiB exceeds device.memory 8GiB");
}

Test(config, kv_type_is_f16_or_f32)
{
    cfg_t *c = load_ok(MODELS "    kv_type: f32\n");
    cr_assert_eq(c->models[0].kv_type, CFG_KV_F32);
    cfg_free(c);
    load_fails(MODELS "    kv_type: q8_0\n", CFG_ERR_INVALID,
               "t.yaml:4:14: invalid value \"q8_0\" for models[0].kv_type (use f16, f32)");
}

Test(config, deadline_is_a_duration_off_by_default)
{
    cfg_t *c = load_ok(MODELS "    deadline: 1500ms\n");
    cr_assert_eq(c->models[0].deadline_ms, 1500);
    cfg_free(c);
    c = load_ok(MODELS);
    cr_assert_eq(c->models[0].deadline_ms, 0);
    cfg_free(c);
    load_fails_with(MODELS "    deadline: 2d\n", "models[0].deadline");
}

Test(config, tool_choice_is_the_default_of_requests_that_name_none)
{
    cfg_t *c = load_ok(MODELS "    tool_choice: required\n");
    cr_assert_eq(c->models[0].tool_choice, 2); /* CHAT_TOOL_REQUIRED */
    cfg_free(c);
    c = load_ok(MODELS);
    cr_assert_eq(c->models[0].tool_choice, 0); /* auto */
    cfg_free(c);
    load_fails(MODELS "    tool_choice: always\n", CFG_ERR_INVALID,
               "t.yaml:4:18: invalid value \"always\" for models[0].tool_choice (use auto, none, "
               "required)");
}

Test(config, a_kv_cache_larger_than_the_quota_or_the_device_is_an_error)
{
    load_fails(
        MODELS "    gpu_quota: 1GiB\n    kv_cache: 2GiB\n", CFG_ERR_INVALID,
        "t.yaml:5:15: models[0].kv_cache 2GiB exceeds its gpu_quota 1GiB (the quota covers weights and KV)");
    load_fails("device:\n  memory: 1GiB\n" MODELS "    kv_cache: 2GiB\n", CFG_ERR_INVALID,
               "t.yaml:6:15: models[0].kv_cache 2GiB exceeds device.memory 1GiB");
}

Test(config, max_tokens_beyond_max_context_is_an_error)
{
    load_fails(MODELS "    max_context: 128\n", CFG_ERR_INVALID,
               "t.yaml:4:18: models[0].defaults.max_tokens 256 exceeds its max_context 128");
    load_fails(MODELS "    defaults:\n      max_tokens: 5000\n", CFG_ERR_INVALID,
               "t.yaml:5:19: models[0].defaults.max_tokens 5000 exceeds its max_context 4096");
}

Test(config, a_model_chat_template_takes_a_family_name_and_defaults_to_detection)
{
    cfg_t *c = load_ok(MODELS "    chat_template: mistral-v7\n  - name: b\n    path: /m/b.gguf\n");
    cr_assert_str_eq(c->models[0].chat_template, "mistral-v7");
    cr_assert_null(c->models[1].chat_template);
    cfg_free(c);
    load_fails(
        MODELS "    chat_template: llama-3\n", CFG_ERR_INVALID,
        "t.yaml:4:20: invalid chat template \"llama-3\" for models[0].chat_template (not a template name "
        "such as chatml, llama3, mistral-v7, gemma, phi3; config/gpuswapd.yaml lists them all)");
}

Test(config, pinned_quotas_that_cannot_fit_together_are_an_error)
{
    load_fails(
        "device:\n  memory: 16GiB\n"
        "models:\n  - {name: a, path: /a, gpu_quota: 10GiB, pinned: true}\n"
        "  - {name: b, path: /b, gpu_quota: 10GiB, pinned: false}\n"
        "  - {name: c, path: /c, gpu_quota: 10GiB, pinned: true}\n",
        CFG_ERR_INVALID,
        "t.yaml:6:51: the gpu_quota of the pinned models up to models[2] add up to 20GiB, more than "
        "device.memory 16GiB");
}

Test(config, device_memory_must_be_a_whole_number_of_pages)
{
    load_fails("device:\n  memory: 1000MiB\n  page_size: 16MiB\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:11: device.memory 1000MiB is not a multiple of device.page_size 16MiB");
}

Test(config, duplicate_model_names_are_an_error)
{
    load_fails(
        MODELS "  - name: a\n    path: /m/other\n", CFG_ERR_INVALID,
        "t.yaml:4:11: duplicate model name \"a\" in models[1] (models[0], line 2, has it too)");
}

Test(config, models_is_required_and_each_needs_a_name_and_a_path)
{
    load_fails(
        "device:\n  gpu: 0\n", CFG_ERR_INVALID,
        "t.yaml:1:1: missing required key 'models' (a list of at least one model, each with a name and a "
        "path)");
    load_fails("models: []\n", CFG_ERR_INVALID, "t.yaml:1:9: models must list at least one model");
    load_fails("models:\n  - path: /m\n", CFG_ERR_INVALID,
               "t.yaml:2:5: missing required key 'name' in models[0]");
    load_fails("models:\n  - name: x\n", CFG_ERR_INVALID,
               "t.yaml:2:5: missing required key 'path' in models[0] ('x')");
}

Test(config, a_config_without_any_listener_is_an_error)
{
    load_fails("listen:\n  socket: ~\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:2:11: no listener: set listen.socket, listen.tcp or listen.http");
    cfg_t *c = load_ok("listen:\n  socket: \"\"\n  http: 127.0.0.1:1\n" MODELS);
    cr_assert_null(c->listen.socket);
    cfg_free(c);
}

Test(config, sockets_and_addresses_may_not_collide)
{
    load_fails("listen:\n  socket: /x.sock\nadmin:\n  socket: /x.sock\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:4:11: admin.socket \"/x.sock\" is the same path as listen.socket");
    load_fails("listen:\n  tcp: 127.0.0.1:1\n  http: 127.0.0.1:1\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:3:9: listen.http \"127.0.0.1:1\" is the same address as listen.tcp");
    char yaml[512];
    snprintf(yaml, sizeof yaml, "listen:\n  socket: /%0120d\n" MODELS, 0);
    load_fails_with(yaml, "(longer than 107 bytes)");
}

/* ------------------------------------------------------------------ file-level errors */

Test(config, a_yaml_syntax_error_names_its_location)
{
    char err[512];
    cfg_t *c = NULL;
    int rc = cfg_load_string("device:\n  gpu: [1, 2\n" MODELS, "t.yaml", &c, err, sizeof err);
    cr_assert_eq(rc, CFG_ERR_SYNTAX);
    cr_assert_null(c);
    cr_assert(strncmp(err, "t.yaml:", 7) == 0 && strstr(err, "YAML syntax error"), "%s", err);
    rc = cfg_load_string("a: b: c\n", "t.yaml", &c, err, sizeof err);
    cr_assert_eq(rc, CFG_ERR_SYNTAX);
    cr_assert_str_eq(
        err, "t.yaml:1:5: YAML syntax error: mapping values are not allowed in this context");
    rc = cfg_load_string("models:\n  - name: \xff\n", "t.yaml", &c, err, sizeof err);
    cr_assert_eq(rc, CFG_ERR_SYNTAX);
    cr_assert(strncmp(err, "t.yaml:2:11: YAML syntax error", 30) == 0, "%s", err);
}

Test(config, an_empty_file_or_a_second_document_is_an_error)
{
    load_fails("", CFG_ERR_INVALID,
               "t.yaml:1:1: the config is empty (at least 'models' is required)");
    load_fails("# only a comment\n", CFG_ERR_INVALID,
               "t.yaml:1:1: the config is empty (at least 'models' is required)");
    load_fails(MODELS "---\n" MODELS, CFG_ERR_INVALID,
               "t.yaml:5:1: a second YAML document; the config is one document");
}

Test(config, a_missing_file_is_an_io_error_naming_the_path)
{
    char err[512];
    cfg_t *c = (cfg_t *)0x1;
    int rc = cfg_load_file("/nonexistent/gpuswapd.yaml", &c, err, sizeof err);
    cr_assert_eq(rc, CFG_ERR_IO);
    cr_assert_null(c);
    cr_assert_str_eq(err, "/nonexistent/gpuswapd.yaml: cannot open: No such file or directory");
}

Test(config, a_file_error_carries_the_file_path)
{
    char path[256];
    int fd = tu_tmpfile(path, sizeof path, "gpuswapd-cfg");
    const char *yaml = MODELS "    gpu_qouta: 1GiB\n";
    cr_assert_eq(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
    char err[512], want[600];
    cfg_t *c = NULL;
    cr_assert_eq(cfg_load_file(path, &c, err, sizeof err), CFG_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:4:5: unknown key 'gpu_qouta' in models[0] (did you mean 'gpu_quota'?)", path);
    cr_assert_str_eq(err, want);
    unlink(path);
}

Test(config, relative_paths_in_a_file_are_taken_from_its_directory)
{
    char path[256];
    int fd = tu_tmpfile(path, sizeof path, "gpuswapd-cfg");
    const char *yaml =
        "listen:\n  socket: run/s.sock\nadmin:\n  socket: /abs/a.sock\n"
        "models:\n  - name: a\n    path: models/a.gguf\n  - name: b\n    path: /m/b.gguf\n";
    cr_assert_eq(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
    char err[512], want[600];
    cfg_t *c = NULL;
    cr_assert_eq(cfg_load_file(path, &c, err, sizeof err), 0, "%s", err);
    unlink(path);
    const char *dir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(want, sizeof want, "%s/models/a.gguf", dir);
    cr_assert_str_eq(c->models[0].path, want);
    snprintf(want, sizeof want, "%s/run/s.sock", dir);
    cr_assert_str_eq(c->listen.socket, want);
    cr_assert_str_eq(c->admin.socket, "/abs/a.sock");
    cr_assert_str_eq(c->models[1].path, "/m/b.gguf");
    cfg_free(c);
    /* from a string there is no file: a relative path stays as written (the working directory) */
    cr_assert_eq(cfg_load_string(yaml, "t.yaml", &c, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(c->models[0].path, "models/a.gguf");
    cfg_free(c);
}

Test(config, a_config_named_without_a_directory_takes_paths_from_the_working_directory)
{
    char dir[256], cwd[1024], err[512], want[1400];
    int fd = tu_tmpfile(dir, sizeof dir, "gpuswapd-cfgdir");
    close(fd);
    unlink(dir);
    cr_assert_eq(mkdir(dir, 0700), 0);
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(dir), 0);
    FILE *f = fopen("g.yaml", "w");
    cr_assert_not_null(f);
    fputs("models:\n  - name: a\n    path: a.gguf\n", f);
    fclose(f);
    cfg_t *c = NULL;
    int rc = cfg_load_file("g.yaml", &c, err, sizeof err);
    unlink("g.yaml");
    cr_assert_eq(chdir(cwd), 0);
    rmdir(dir);
    cr_assert_eq(rc, 0, "%s", err);
    snprintf(want, sizeof want, "%s/a.gguf", dir);
    cr_assert_str_eq(c->models[0].path, want);
    cfg_free(c);
}

Test(config, errors_fit_a_small_buffer_and_a_null_buffer)
{
    char err[16];
    cfg_t *c = NULL;
    cr_assert_eq(cfg_load_string("models: 1\n", "t.yaml", &c, err, sizeof err), CFG_ERR_INVALID);
    cr_assert_eq(strlen(err), sizeof err - 1);
    cr_assert_eq(cfg_load_string("models: 1\n", "t.yaml", &c, NULL, 0), CFG_ERR_INVALID);
    cr_assert_null(c);
    cfg_free(NULL);
}

/* ------------------------------------------------------------------ value parsers */

Test(config, sizes_parse_with_binary_units_and_fractions)
{
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {
        {"0", 0},
        {"4096", 4096},
        {"17B", 17},
        {"1KiB", 1024},
        {"2MiB", 2u << 20},
        {"12GiB", 12ull << 30},
        {"3TiB", 3ull << 40},
        {"1.5GiB", 3ull << 29},
        {"0.5KiB", 512},
        {"12 GiB", 12ull << 30},
        {"18446744073709551615", UINT64_MAX},
        {"16777215TiB", 16777215ull << 40},
        {"007MiB", 7u << 20},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 1;
        char err[128] = "";
        cr_assert_eq(cfg_parse_size(ok[i].s, &v, err, sizeof err), 0, "%s: %s", ok[i].s, err);
        cr_assert_eq(v, ok[i].v, "%s gave %llu", ok[i].s, (unsigned long long)v);
    }
}

Test(config, sizes_reject_overflow_negatives_bad_units_and_ambiguity)
{
    static const struct {
        const char *s, *why;
    } bad[] = {
        {"18446744073709551616", "too large: at most 16EiB - 1"},
        {"16777216TiB", "too large: at most 16EiB - 1"},
        {"99999999999999999999999GiB", "too large: at most 16EiB - 1"},
        {"-1", "sizes cannot be negative"},
        {"-1GiB", "sizes cannot be negative"},
        {"12GB", "use B, KiB, MiB, GiB, TiB; 'GB' is ambiguous"},
        {"12G", "use B, KiB, MiB, GiB, TiB; 'G' is ambiguous"},
        {"12kb", "use B, KiB, MiB, GiB, TiB; 'kb' is ambiguous"},
        {"1T", "use B, KiB, MiB, GiB, TiB; 'T' is ambiguous"},
        {"12b", "use B, KiB, MiB, GiB, TiB; 'b' is ambiguous"},
        {"12gib", "use B, KiB, MiB, GiB, TiB"},
        {"12PiB", "use B, KiB, MiB, GiB, TiB"},
        {"", "use B, KiB, MiB, GiB, TiB"},
        {"GiB", "use B, KiB, MiB, GiB, TiB"},
        {"1.", "use B, KiB, MiB, GiB, TiB"},
        {".5GiB", "use B, KiB, MiB, GiB, TiB"},
        {"0x10", "use B, KiB, MiB, GiB, TiB"},
        {"+1", "use B, KiB, MiB, GiB, TiB"},
        {"1e3", "use B, KiB, MiB, GiB, TiB"},
        {" 1", "use B, KiB, MiB, GiB, TiB"},
        {"1GiB1", "use B, KiB, MiB, GiB, TiB"},
        {"0.5B", "not a whole number of bytes"},
        {"1.0000000001KiB", "not a whole number of bytes"},
        {"1.00000000000000000000001KiB", "not a whole number of bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 77;
        char err[128] = "";
        cr_assert_eq(cfg_parse_size(bad[i].s, &v, err, sizeof err), CFG_ERR_INVALID,
                     "'%s' accepted", bad[i].s);
        cr_assert_str_eq(err, bad[i].why, "'%s'", bad[i].s);
        cr_assert_eq(v, 77, "output untouched on error");
    }
    uint64_t v;
    cr_assert_eq(cfg_parse_size("nope", &v, NULL, 0), CFG_ERR_INVALID);
}

Test(config, durations_parse_in_milliseconds)
{
    static const struct {
        const char *s;
        uint64_t ms;
    } ok[] = {
        {"250ms", 250}, {"2s", 2000}, {"1m", 60000},  {"1.5s", 1500},  {"1h", 3600000},
        {"0", 0},       {"0s", 0},    {"0.25s", 250}, {"1.5m", 90000}, {"0.001s", 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 1;
        char err[128] = "";
        cr_assert_eq(cfg_parse_duration_ms(ok[i].s, &v, err, sizeof err), 0, "%s: %s", ok[i].s,
                     err);
        cr_assert_eq(v, ok[i].ms, "%s gave %llu", ok[i].s, (unsigned long long)v);
    }
}

Test(config, durations_reject_overflow_negatives_missing_and_bad_units)
{
    static const struct {
        const char *s, *why;
    } bad[] = {
        {"2", "missing unit: use ms, s, m, h, e.g. 250ms, 1.5s"},
        {"1.5", "missing unit: use ms, s, m, h, e.g. 250ms, 1.5s"},
        {"-1s", "durations cannot be negative"},
        {"1.5ms", "not a whole number of milliseconds"},
        {"0.0001s", "not a whole number of milliseconds"},
        {"99999999999999999999s", "too large"},
        {"5124095576030432h", "too large"},
        {"2x", "use ms, s, m, h, e.g. 250ms, 1.5s"},
        {"2 sec", "use ms, s, m, h, e.g. 250ms, 1.5s"},
        {"s", "use ms, s, m, h, e.g. 250ms, 1.5s"},
        {"", "use ms, s, m, h, e.g. 250ms, 1.5s"},
        {"1S", "use ms, s, m, h, e.g. 250ms, 1.5s"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 77;
        char err[128] = "";
        cr_assert_eq(cfg_parse_duration_ms(bad[i].s, &v, err, sizeof err), CFG_ERR_INVALID,
                     "'%s' accepted", bad[i].s);
        cr_assert_str_eq(err, bad[i].why, "'%s'", bad[i].s);
    }
}

Test(config, formatted_sizes_and_durations_read_back_to_the_same_value)
{
    static const uint64_t sizes[] = {0,          1,          1000,       1024,
                                     1536,       2u << 20,   3ull << 29, 60ull << 30,
                                     1ull << 40, 5ull << 50, UINT64_MAX};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char buf[32];
        uint64_t v;
        cfg_format_size(sizes[i], buf, sizeof buf);
        cr_assert_eq(cfg_parse_size(buf, &v, NULL, 0), 0, "%s", buf);
        cr_assert_eq(v, sizes[i], "%s", buf);
    }
    char buf[32];
    cr_assert_str_eq(cfg_format_size(2u << 20, buf, sizeof buf), "2MiB");
    cr_assert_str_eq(cfg_format_size(1536, buf, sizeof buf), "1536B");
    cr_assert_str_eq(cfg_format_size(3ull << 29, buf, sizeof buf), "1536MiB");
    static const uint64_t ms[] = {0, 1, 250, 1000, 1500, 60000, 90000, 3600000, 7200000, 123456789};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        uint64_t v;
        cfg_format_duration_ms(ms[i], buf, sizeof buf);
        cr_assert_eq(cfg_parse_duration_ms(buf, &v, NULL, 0), 0, "%s", buf);
        cr_assert_eq(v, ms[i], "%s", buf);
    }
    cr_assert_str_eq(cfg_format_duration_ms(2000, buf, sizeof buf), "2s");
    cr_assert_str_eq(cfg_format_duration_ms(90000, buf, sizeof buf), "90s");
}

/* ------------------------------------------------------------------ printing */

Test(config, print_then_reload_gives_an_identical_print)
{
    cfg_t *c = load_ok(MODELS);
    assert_round_trip(c);
    cfg_free(c);
    c = load_ok(
        "listen:\n  socket: \"/tmp/we\\\"ird \\\\ path\\tsock\"\n  tcp: 0.0.0.0:7000\n"
        "admin:\n  socket: ~\n  uids: [1000, 1001]\n"
        "device:\n  backend: cpu\n  threads: 3\n"
        "scheduler:\n  quantum: 0.1\n  max_wait: 1.5s\n"
        "models:\n  - name: \"a.b:c-d_e\"\n    path: \"/p/\\u00e9t\\u00e9.gguf\"\n    priority: 0.3\n"
        "    defaults:\n      temperature: 0.1\n      top_p: 0.9\n");
    assert_round_trip(c);
    char *p = print_str(c);
    cr_assert(strstr(p, "socket: \"/tmp/we\\\"ird \\\\ path\\x09sock\"\n"), "%s", p);
    cr_assert(strstr(p, "  socket: ~\n"), "%s", p);
    cr_assert(strstr(p, "  uids: [1000, 1001]\n"), "%s", p);
    cr_assert(strstr(p, "  max_wait: 1500ms\n"), "%s", p);
    cr_assert(strstr(p, "  quantum: 0.1\n"), "%s", p);
    cr_assert(strstr(p, "    priority: 0.3\n"), "%s", p);
    cr_assert(strstr(p, "      temperature: 0.1\n"), "%s", p);
    cr_assert(strstr(p, "  - name: \"a.b:c-d_e\"\n    path: "), "%s", p);
    free(p);
    cfg_free(c);
}

Test(config, print_writes_every_key_with_defaults_filled_in)
{
    cfg_t *c = load_ok(MODELS);
    char *p = print_str(c);
    static const char *const want[] = {
        "listen:\n  socket: \"/run/gpuswapd/gpuswapd.sock\"\n  mode: \"0660\"\n  tcp: ~\n"
        "  http: \"127.0.0.1:8400\"\n  max_line: 1MiB\n  max_connections: 1024\n",
        "admin:\n  socket: \"/run/gpuswapd/admin.sock\"\n  mode: \"0600\"\n  uids: []\n  gids: []\n",
        "device:\n  backend: auto\n  gpu: 0\n  memory: 0\n  page_size: 2MiB\n  sim_bandwidth: 0\n  sim_load_bandwidth: 0\n"
        "  threads: 0\n",
        "host:\n  memory: 0\n",
        "scheduler:\n  policy: swap-aware\n  max_batch: 16\n  max_wait: 2s\n  max_stall: 500ms\n  quantum: 4\n"
        "  queue_limit: 256\n"
        "  max_queued: 4096\n  drain_timeout: 30s\n",
        "models:\n  - name: \"a\"\n    path: \"/m/a.gguf\"\n    base: ~\n    adapter: ~\n"
        "    adapter_scale: 1\n    gpu_quota: 0\n    kv_cache: 0\n    kv_type: f16\n    priority: 1\n"
        "    pinned: false\n    max_batch: 16\n    prefix_cache: 16\n    max_context: 4096\n    chat_template: ~\n    tool_choice: auto\n    deadline: 0\n    deadline_miss: refuse\n"
        "    defaults:\n      temperature: 0.8\n"
        "      top_k: 40\n      top_p: 0.95\n      min_p: 0.05\n      repeat_penalty: 1\n"
        "      presence_penalty: 0\n      frequency_penalty: 0\n      max_tokens: 256\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(p, want[i]), "printed:\n%s\nlacks:\n%s", p, want[i]);
    free(p);
    cfg_free(c);
}

/* ------------------------------------------------------------------ reload */

Test(config, reload_accepts_model_quota_and_scheduler_changes)
{
    cfg_t *a = load_ok("device:\n  backend: sim\n  memory: 8GiB\nadmin:\n  uids: [1]\n" MODELS);
    cfg_t *b = load_ok(
        "device:\n  backend: sim\n  memory: 8GiB\nadmin:\n  uids: [1, 2]\nhost:\n  memory: 1TiB\n"
        "scheduler:\n  policy: fifo\n  max_batch: 4\n  max_wait: 1s\n  quantum: 1\n"
        "models:\n  - name: a\n    path: /m/a2.gguf\n    gpu_quota: 4GiB\n    pinned: true\n"
        "  - name: new\n    path: /m/new.gguf\n    priority: 3\n"
        "  - name: new-lora\n    base: a\n    adapter: /m/l.gguf\n    adapter_scale: 0.5\n");
    char err[256] = "x";
    cr_assert_eq(cfg_reload_check(a, b, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(err, "");
    cr_assert_eq(cfg_reload_check(b, a, err, sizeof err), 0, "%s",
                 err); /* and removing them again */
    cr_assert_eq(cfg_reload_check(a, a, err, sizeof err), 0, "%s", err);
    cfg_free(a);
    cfg_free(b);
}

Test(config, reload_refuses_listener_and_device_changes_naming_every_key)
{
    static const struct {
        const char *yaml, *want;
    } cases[] = {
        /* a listen section turns the default HTTP listener off: two keys change */
        {"listen:\n  socket: /other.sock\n" MODELS,
         "t.yaml: listen.socket cannot change on reload (\"/run/gpuswapd/gpuswapd.sock\" -> \"/other.sock\"); "
         "listen.http cannot change on reload (\"127.0.0.1:8400\" -> ~); restart gpuswapd to apply them"},
        {"device:\n  memory: 8GiB\n  gpu: 1\n" MODELS,
         "t.yaml: device.gpu cannot change on reload (0 -> 1); device.memory cannot change on reload (0 -> "
         "8GiB); restart gpuswapd to apply them"},
        {"listen:\n  http: 127.0.0.1:8401\n" MODELS,
         "t.yaml: listen.http cannot change on reload (\"127.0.0.1:8400\" -> \"127.0.0.1:8401\"); restart "
         "gpuswapd to apply it"},
        {"listen:\n  mode: \"0666\"\n  http: 127.0.0.1:8400\n" MODELS,
         "t.yaml: listen.mode cannot change on reload (\"0660\" -> \"0666\"); restart gpuswapd to apply it"},
        {"admin:\n  socket: /a.sock\n" MODELS,
         "t.yaml: admin.socket cannot change on reload (\"/run/gpuswapd/admin.sock\" -> \"/a.sock\"); restart "
         "gpuswapd to apply it"},
        {"device:\n  backend: cpu\n" MODELS,
         "t.yaml: device.backend cannot change on reload (auto -> cpu); restart gpuswapd to apply it"},
        {"device:\n  memory: 8GiB\n" MODELS,
         "t.yaml: device.memory cannot change on reload (0 -> 8GiB); restart gpuswapd to apply it"},
        {"device:\n  page_size: 4KiB\n" MODELS,
         "t.yaml: device.page_size cannot change on reload (2MiB -> 4KiB); restart gpuswapd to apply it"},
        {"device:\n  gpu: 1\n" MODELS,
         "t.yaml: device.gpu cannot change on reload (0 -> 1); restart gpuswapd to apply it"},
    };
    cfg_t *cur = load_ok(MODELS);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cfg_t *next = load_ok(cases[i].yaml);
        char err[512] = "";
        cr_assert_eq(cfg_reload_check(cur, next, err, sizeof err), CFG_ERR_RELOAD, "%s",
                     cases[i].yaml);
        cr_assert_str_eq(err, cases[i].want);
        cfg_free(next);
    }
    cfg_free(cur);
}

/* ------------------------------------------------------------------ auth */

#define HASH_A                                                                                     \
    "sha256:"                                                                                      \
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define HASH_B                                                                                     \
    "sha256:"                                                                                      \
    "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
#define HTTP_TCP "listen:\n  http: 127.0.0.1:8400\n  tcp: 127.0.0.1:8401\n"

Test(config, auth_keys_load_with_their_models_limits_and_defaults)
{
    cfg_t *c = load_ok(
        HTTP_TCP "auth:\n  http: true\n  trusted_proxies: [\"10.0.0.1\", \"::1\"]\n  keys:\n"
                 "    - name: t1\n      hash: \"" HASH_A "\"\n      models: [\"*\"]\n"
                 "    - name: t2\n      hash: \"" HASH_B "\"\n      models: [a]\n      rate: 2.5\n"
                 "      burst: 5\n      max_concurrent: 3\n      tokens_per_minute: 1000\n" MODELS);
    cr_assert(c->auth.http);
    cr_assert_not(c->auth.tcp);
    cr_assert_eq(c->auth.max_failures, 5);
    cr_assert_eq(c->auth.backoff_ms, 1000);
    cr_assert_eq(c->auth.trusted_proxies.n, 2);
    cr_assert_str_eq(c->auth.trusted_proxies.v[1], "::1");
    cr_assert_eq(c->auth.n_keys, 2);
    cr_assert_str_eq(c->auth.keys[0].name, "t1");
    cr_assert_str_eq(c->auth.keys[0].models.v[0], "*");
    cr_assert_eq(c->auth.keys[0].rate, 0);
    cr_assert_eq(c->auth.keys[1].rate, 2.5);
    cr_assert_eq(c->auth.keys[1].burst, 5);
    cr_assert_eq(c->auth.keys[1].max_concurrent, 3);
    cr_assert_eq(c->auth.keys[1].tokens_per_minute, 1000);
    assert_round_trip(c);
    cfg_free(c);
}

Test(config, bad_auth_sections_are_errors_naming_the_place)
{
    static const struct {
        const char *yaml, *want;
    } cases[] = {
        {"listen:\n  http: ~\nauth:\n  http: true\n" MODELS,
         "t.yaml:4:9: auth.http requires a key on listen.http, which is off"},
        {"listen:\n  http: 127.0.0.1:8400\nauth:\n  tcp: true\n" MODELS,
         "t.yaml:4:8: auth.tcp requires a key on listen.tcp, which is off"},
        {"auth:\n  keys:\n    - name: k\n      hash: \"sha256:abc\"\n      models: [a]\n" MODELS,
         "invalid key hash \"sha256:abc\" for auth.keys[0].hash (use sha256: and 64 lower-case hex digits"},
        {"auth:\n  keys:\n    - name: k\n      models: [a]\n" MODELS,
         "missing required key 'hash' in auth.keys[0]"},
        {"auth:\n  keys:\n    - hash: \"" HASH_A "\"\n      models: [a]\n" MODELS,
         "missing required key 'name' in auth.keys[0]"},
        {"auth:\n  keys:\n    - name: k\n      hash: \"" HASH_A "\"\n" MODELS, "lists no models"},
        {"auth:\n  keys:\n    - name: k\n      hash: \"" HASH_A "\"\n      models: [nope]\n" MODELS,
         "auth.keys[0].models[0] \"nope\" is not a configured model"},
        {"auth:\n  keys:\n    - name: k\n      hash: \"" HASH_A "\"\n      models: [a]\n"
         "    - name: k\n      hash: \"" HASH_B "\"\n      models: [a]\n" MODELS,
         "duplicate key name \"k\""},
        {"auth:\n  keys:\n    - name: k\n      hash: \"" HASH_A "\"\n      models: [a]\n"
         "    - name: j\n      hash: \"" HASH_A "\"\n      models: [a]\n" MODELS,
         "has the same hash as auth.keys[0]"},
        {"auth:\n  trusted_proxies: [haproxy.local]\n" MODELS,
         "invalid address \"haproxy.local\" in auth.trusted_proxies[0] (use an IPv4 or IPv6 address)"},
        {"auth:\n  keys:\n    - name: k\n      hash: \"" HASH_A
         "\"\n      models: [a]\n      rate: -1\n" MODELS,
         "auth.keys[0].rate"},
        {"auth:\n  keys:\n    - name: k\n      hash: \"" HASH_A
         "\"\n      models: [a]\n      rpm: 1\n" MODELS,
         "unknown key 'rpm' in auth.keys[0]"},
        {"auth:\n  keys: 3\n" MODELS, "expected a list of keys for auth.keys"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        load_fails_with(cases[i].yaml, cases[i].want);
}

Test(config, reload_may_change_keys_but_not_which_listeners_require_them)
{
    cfg_t *a =
        load_ok(HTTP_TCP "auth:\n  http: true\n  keys:\n    - name: t1\n      hash: \"" HASH_A
                         "\"\n      models: [\"*\"]\n" MODELS);
    cfg_t *b = load_ok(
        HTTP_TCP "auth:\n  http: true\n  max_failures: 9\n  trusted_proxies: [\"127.0.0.1\"]\n"
                 "  keys:\n    - name: t2\n      hash: \"" HASH_B "\"\n      models: [a]\n" MODELS);
    cfg_t *c = load_ok(HTTP_TCP "auth:\n  tcp: true\n" MODELS);
    char err[256] = "";
    cr_assert_eq(cfg_reload_check(a, b, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cfg_reload_check(a, c, err, sizeof err), CFG_ERR_RELOAD);
    cr_assert(strstr(err, "auth.http cannot change on reload"), "%s", err);
    cfg_free(a);
    cfg_free(b);
    cfg_free(c);
}

Test(config, the_options_table_has_every_option_once_with_its_reload_class)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(cfg_options_markdown(f), 0);
    fclose(f);
    cr_assert(strstr(text, "| option | type | default | on reload | what |\n| --- |"), "%s", text);
    cr_assert(strstr(text, "| `models.path` | path | none | reloads the model |"), "%s", text);
    cr_assert(strstr(text, "| `device.memory` | size | `0` | restart |"), "%s", text);
    cr_assert(strstr(text, "| `scheduler.max_wait` | duration | `2s` | live |"), "%s", text);
    cr_assert(
        strstr(text, "| `models.defaults.temperature` | number | `0.8` | live | 0 = greedy |"),
        "%s", text);
    cr_assert_null(strstr(text, "`listen` |"), "sections are no rows");
    int rows = 0;
    for (const char *p = text; (p = strstr(p, "\n| `")); p++)
        rows++;
    cr_assert_gt(rows, 50);
    cr_assert_null(strstr(strstr(text, "`models.path`") + 1, "`models.path`"), "each option once");
    free(text);
}

Test(config, a_changed_path_kv_type_or_max_context_loads_the_model_again)
{
    cfg_t *a = load_ok(MODELS);
    cfg_model_t m = a->models[0];
    char buf[256];
    cr_assert_eq(cfg_model_reloads(&a->models[0], &m, buf, sizeof buf), 0);
    m.priority = 3;
    m.pinned = 1;
    cr_assert_eq(cfg_model_reloads(&a->models[0], &m, buf, sizeof buf), 0, "%s", buf);
    m.kv_type = CFG_KV_F32;
    m.max_context = 128;
    cr_assert_eq(cfg_model_reloads(&a->models[0], &m, buf, sizeof buf), 2);
    cr_assert_str_eq(buf, "kv_type, max_context");
    cfg_free(a);
}
