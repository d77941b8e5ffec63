/* fuzz_config: YAML text through cfg_load_string; what loads must print, load again identically and pass cfg_reload_check against a fixed good config. */
#include <string.h>

#include "config.h"
#include "fuzz.h"

static const char fz_good_yaml[] = "listen:\n"
                                   "  socket: /run/gpuswapd/gpuswapd.sock\n"
                                   "  http: 127.0.0.1:8400\n"
                                   "admin:\n"
                                   "  socket: /run/gpuswapd/admin.sock\n"
                                   "  uids: [1000]\n"
                                   "device:\n"
                                   "  backend: sim\n"
                                   "  memory: 1GiB\n"
                                   "scheduler:\n"
                                   "  max_wait: 2s\n"
                                   "models:\n"
                                   "  - name: a\n"
                                   "    path: a.gguf\n"
                                   "  - name: b\n"
                                   "    path: b.gguf\n"
                                   "    gpu_quota: 512MiB\n"
                                   "    pinned: true\n";

static cfg_t *fz_good; /* loaded once, kept for the process */

/* cfg_print into a malloc'ed string (caller frees). */
static char *fz_print(const cfg_t *c)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    FUZZ_CHECK(f, "open_memstream");
    FUZZ_CHECK(cfg_print(c, f) == 0, "cfg_print failed");
    FUZZ_CHECK(fclose(f) == 0, "fclose");
    return s;
}

int fuzz_config(const uint8_t *data, size_t size)
{
    char err[512];
    if (!fz_good)
        FUZZ_CHECK(cfg_load_string(fz_good_yaml, "good.yaml", &fz_good, err, sizeof err) == 0,
                   "the fixed config: %s", err);
    char *yaml = malloc(size + 1);
    if (!yaml)
        return 0;
    memcpy(yaml, data, size);
    yaml[size] = '\0';
    cfg_t *c = (cfg_t *)0x1;
    err[0] = '\0';
    int rc = cfg_load_string(yaml, "fuzz.yaml", &c, err, sizeof err);
    free(yaml);
    if (rc != 0) {
        FUZZ_CHECK(c == NULL, "no config on failure");
        FUZZ_CHECK(rc == CFG_ERR_SYNTAX || rc == CFG_ERR_INVALID || rc == CFG_ERR_NOMEM, "rc %d",
                   rc);
        FUZZ_CHECK(strncmp(err, "fuzz.yaml", 9) == 0, "error does not name the file: '%s'", err);
        return 0;
    }
    FUZZ_CHECK(c && c->n_models >= 1 && c->models, "loaded without models");

    /* the printed config loads again and prints identically */
    char *a = fz_print(c);
    cfg_t *d = NULL;
    rc = cfg_load_string(a, "printed.yaml", &d, err, sizeof err);
    FUZZ_CHECK(rc == 0, "printed config does not load: %s\n--- printed:\n%s", err, a);
    char *b = fz_print(d);
    FUZZ_CHECK(strcmp(a, b) == 0, "printed twice differently:\n%s\n---\n%s", a, b);
    FUZZ_CHECK(cfg_reload_check(c, d, err, sizeof err) == 0, "reload of its own print: %s", err);
    free(a);
    free(b);
    cfg_free(d);

    for (size_t i = 0; i < c->n_models; i++)
        FUZZ_CHECK(cfg_find_model(c, c->models[i].name) != NULL, "model '%s' not found",
                   c->models[i].name);
    rc = cfg_reload_check(fz_good, c, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == CFG_ERR_RELOAD, "reload check rc %d", rc);
    rc = cfg_reload_check(c, fz_good, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == CFG_ERR_RELOAD, "reload check rc %d", rc);
    FUZZ_CHECK(cfg_reload_check(c, c, err, sizeof err) == 0, "reload against itself: %s", err);
    cfg_free(c);
    return 0;
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_config(data, size);
}
#endif
