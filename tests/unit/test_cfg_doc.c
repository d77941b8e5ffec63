/* test_cfg_doc: a config built option by option through the schema: values checked as the loader checks them, written with libyaml's emitter, and read back by the loader to the same values, awkward strings included. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg_doc.h"
#include "config.h"

static char *write_doc(const cfg_doc_t *d)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert(f);
    cr_assert_eq(cfg_doc_write(d, f), 0);
    fclose(f);
    return text;
}

static void set_ok(cfg_doc_t *d, const char *k, const char *v)
{
    char why[256] = "";
    cr_assert_eq(cfg_doc_set(d, k, v, why, sizeof why), 0, "%s = %s: %s", k, v, why);
}

Test(cfg_doc, values_are_checked_as_the_loader_checks_them)
{
    cfg_doc_t *d = cfg_doc_new();
    char why[256];
    cr_assert_eq(cfg_doc_set(d, "device.page_size", "3MiB", why, sizeof why), CFG_ERR_INVALID);
    cr_assert(strstr(why, "device.page_size"), "%s", why);
    cr_assert_eq(cfg_doc_set(d, "device.backend", "tpu", why, sizeof why), CFG_ERR_INVALID);
    cr_assert_eq(cfg_doc_set(d, "device.memory", "12GB", why, sizeof why), CFG_ERR_INVALID);
    cr_assert(strstr(why, "ambiguous"), "%s", why);
    cr_assert_eq(cfg_doc_set(d, "listen.http", "localhost:99999", why, sizeof why),
                 CFG_ERR_INVALID);
    cr_assert_eq(cfg_doc_set(d, "device.threads", "-1", why, sizeof why), CFG_ERR_INVALID);
    /* not options with one value */
    cr_assert_eq(cfg_doc_set(d, "device.nope", "1", why, sizeof why), CFG_ERR_INVALID);
    cr_assert(strstr(why, "device.nope"), "%s", why);
    cr_assert_eq(cfg_doc_set(d, "device", "1", why, sizeof why), CFG_ERR_INVALID);
    cr_assert_eq(cfg_doc_set(d, "auth.keys", "1", why, sizeof why), CFG_ERR_INVALID);
    cr_assert_eq(cfg_doc_set(d, "models", "1", why, sizeof why), CFG_ERR_INVALID);
    cr_assert_eq(cfg_doc_set(d, "path", "/x", why, sizeof why), CFG_ERR_INVALID);
    cr_assert(cfg_doc_known("scheduler.max_stall"));
    cr_assert(!cfg_doc_known("models.path"));
    cr_assert(!cfg_doc_known("auth.trusted_proxies"), "a list");
    /* a failed set leaves nothing behind: the document is still empty but for models */
    int m = cfg_doc_add_model(d);
    cr_assert_eq(cfg_doc_model_set(d, (size_t)m, "name", "a", why, sizeof why), 0, "%s", why);
    cr_assert_eq(cfg_doc_model_set(d, (size_t)m, "name", "bad name!", why, sizeof why),
                 CFG_ERR_INVALID);
    cr_assert_eq(cfg_doc_model_set(d, 5, "name", "a", why, sizeof why), CFG_ERR_INVALID);
    char *t = write_doc(d);
    cr_assert_str_eq(t, "models:\n- {}\n", "%s", t);
    free(t);
    cfg_doc_free(d);
}

Test(cfg_doc, written_in_schema_order_and_read_back_to_the_same_values)
{
    cfg_doc_t *d = cfg_doc_new();
    char why[256];
    /* set out of order, one twice: written in the schema's order, the last value */
    set_ok(d, "scheduler.max_stall", "250ms");
    set_ok(d, "device.backend", "sim");
    set_ok(d, "device.memory", "1GiB");
    set_ok(d, "device.page_size", "64KiB");
    set_ok(d, "device.page_size", "128KiB");
    set_ok(d, "listen.socket", "/tmp/a: b #c/\"q\"\\ é.sock");
    set_ok(d, "listen.http", "[::1]:8400");
    set_ok(d, "admin.mode", "0640");
    int m = cfg_doc_add_model(d);
    cr_assert_eq(cfg_doc_model_set(d, (size_t)m, "name", "true", why, sizeof why), 0, "%s", why);
    cr_assert_eq(cfg_doc_model_set(d, (size_t)m, "path", "/m/- [x]: {y} #z.gguf", why, sizeof why),
                 0, "%s", why);
    cr_assert_eq(cfg_doc_model_set(d, (size_t)m, "defaults.temperature", "0.25", why, sizeof why),
                 0, "%s", why);
    char *t = write_doc(d);
    cr_assert(strstr(t, "listen:") < strstr(t, "device:"), "%s", t);
    cr_assert(strstr(t, "device:") < strstr(t, "scheduler:"), "%s", t);
    cr_assert(strstr(t, "page_size: 128KiB"), "%s", t);
    cfg_t *c = NULL;
    char err[512] = "";
    cr_assert_eq(cfg_load_string(t, "doc.yaml", &c, err, sizeof err), 0, "%s\n%s", err, t);
    cr_assert_str_eq(c->listen.socket, "/tmp/a: b #c/\"q\"\\ é.sock");
    cr_assert_str_eq(c->listen.http, "[::1]:8400");
    cr_assert_eq(c->device.page_size, 128u << 10);
    cr_assert_eq(c->device.backend, CFG_BACKEND_SIM);
    cr_assert_eq(c->scheduler.max_stall_ms, 250);
    cr_assert_eq(c->admin.mode, 0640);
    cr_assert_eq(c->n_models, 1);
    cr_assert_str_eq(c->models[0].name, "true");
    cr_assert_str_eq(c->models[0].path, "/m/- [x]: {y} #z.gguf");
    cr_assert_float_eq(c->models[0].defaults.temperature, 0.25f, 0);
    cfg_free(c);
    free(t);
    cfg_doc_free(d);
}
