/* test_config_adapter: LoRA adapters in the config (models[] entries with base and adapter): loading, the typed errors, printing and what a change reloads. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#define MODELS "models:\n  - name: a\n    path: /m/a.gguf\n"

/* ------------------------------------------------------------------ helpers */

static cfg_t *load_ok(const char *yaml)
{
    char err[512] = "";
    cfg_t *c = NULL;
    int rc = cfg_load_string(yaml, "t.yaml", &c, err, sizeof err);
    cr_assert_eq(rc, 0, "load failed: %s\n--- yaml:\n%s", err, yaml);
    return c;
}

static void load_fails(const char *yaml, int code, const char *want)
{
    char err[512] = "";
    cfg_t *c = NULL;
    int rc = cfg_load_string(yaml, "t.yaml", &c, err, sizeof err);
    cr_assert_null(c, "no config on failure");
    cr_assert_eq(rc, code, "rc %d, want %d (%s)", rc, code, err);
    cr_assert_str_eq(err, want);
}

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

/* print -> load -> print gives the same text. */
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

/* ------------------------------------------------------------------ adapters */

Test(config, an_adapter_names_its_base_and_file_and_its_scale_defaults_to_1)
{
    cfg_t *c = load_ok(MODELS "  - name: a-lora\n    base: a\n    adapter: /m/l.gguf\n"
                              "  - name: b-lora\n    base: a\n    adapter: /m/k.gguf\n"
                              "    adapter_scale: -0.5\n");
    cr_assert_eq(c->n_models, 3);
    const cfg_model_t *l = cfg_find_model(c, "a-lora");
    cr_assert_not_null(l);
    cr_assert_null(l->path);
    cr_assert_str_eq(l->base, "a");
    cr_assert_str_eq(l->adapter, "/m/l.gguf");
    cr_assert_float_eq(l->adapter_scale, 1.0, 1e-12);
    cr_assert_float_eq(cfg_find_model(c, "b-lora")->adapter_scale, -0.5, 1e-12);
    cr_assert_null(cfg_find_model(c, "a")->base);
    assert_round_trip(c);
    cfg_free(c);
}

Test(config, an_adapter_with_an_unknown_base_is_an_error_naming_it)
{
    load_fails(MODELS "  - name: l\n    base: nope\n    adapter: /m/l.gguf\n", CFG_ERR_INVALID,
               "t.yaml:5:11: unknown base \"nope\" for models[1] ('l'): no model of that name");
}

Test(config, an_adapter_whose_base_is_an_adapter_is_an_error)
{
    load_fails(
        MODELS "  - name: l\n    base: a\n    adapter: /m/l.gguf\n"
               "  - name: l2\n    base: l\n    adapter: /m/l2.gguf\n",
        CFG_ERR_INVALID,
        "t.yaml:8:11: base \"l\" of models[2] ('l2') is itself an adapter (of 'a'); a base is "
        "a model with a path");
}

Test(config, an_adapter_with_a_path_too_is_an_error)
{
    load_fails(MODELS "  - name: l\n    base: a\n    path: /m/x.gguf\n    adapter: /m/l.gguf\n",
               CFG_ERR_INVALID,
               "t.yaml:7:14: models[1] ('l') has both path and adapter (an adapter's model file is "
               "its base's)");
}

Test(config, an_adapter_without_a_base_and_a_base_without_an_adapter_are_errors)
{
    load_fails(MODELS "  - name: l\n    adapter: /m/l.gguf\n", CFG_ERR_INVALID,
               "t.yaml:5:14: models[1] ('l') has an adapter but no base (the model it applies to)");
    load_fails(MODELS "  - name: l\n    base: a\n", CFG_ERR_INVALID,
               "t.yaml:5:11: models[1] ('l') has a base but no adapter file");
    load_fails_with(MODELS "  - name: l\n    adapter_scale: 2\n", "missing required key 'path'");
}

Test(config, changing_an_adapter_loads_it_again_and_names_the_keys)
{
    cfg_t *a = load_ok(MODELS "  - name: l\n    base: a\n    adapter: /m/l.gguf\n");
    cfg_t *b = load_ok(MODELS "  - name: l\n    base: a\n    adapter: /m/l2.gguf\n"
                              "    adapter_scale: 2\n");
    char buf[256];
    cr_assert_eq(cfg_model_reloads(&a->models[1], &b->models[1], buf, sizeof buf), 2);
    cr_assert_str_eq(buf, "adapter, adapter_scale");
    cr_assert_eq(cfg_model_reloads(&a->models[0], &b->models[0], buf, sizeof buf), 0);
    cfg_free(a);
    cfg_free(b);
}
