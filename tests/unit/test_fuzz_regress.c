/* test_fuzz_regress: replays every seed of tests/fuzz/corpus/<name>/ and every found-bug input of tests/fuzz/regress/<name>/ through fuzz_<name>(). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../fuzz/fuzz.h"
#include "testutil.h"

typedef int (*fuzz_fn)(const uint8_t *data, size_t size);

/* The fuzz directory: tests/fuzz from the repo root (where the unit tests
 * run), else next to the build directory named by GPUSWAPD_BUILD. */
static void fuzz_dir(char *out, size_t cap)
{
    struct stat st;
    snprintf(out, cap, "tests/fuzz");
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
        return;
    snprintf(out, cap, "%s/../tests/fuzz", tu_build_dir());
}

/* Runs every regular file of dir through fn, each in a buffer of exactly its
 * size (so a read past the end is caught under ASan); returns the count. */
static size_t replay_dir(const char *dir, fuzz_fn fn)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *e;
    if (!d)
        return 0;
    while ((e = readdir(d))) {
        char path[1024];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s", path);
        size_t len = (size_t)st.st_size;
        uint8_t *buf = malloc(len ? len : 1);
        cr_assert_not_null(buf);
        cr_assert_eq(fread(buf, 1, len, f), len, "%s: short read", path);
        fclose(f);
        cr_log_info("%s", path);
        cr_assert_eq(fn(buf, len), 0, "%s", path);
        free(buf);
        n++;
    }
    closedir(d);
    return n;
}

static void replay(const char *name, fuzz_fn fn)
{
    char root[512], dir[1024];
    fuzz_dir(root, sizeof root);
    snprintf(dir, sizeof dir, "%s/corpus/%s", root, name);
    size_t n = replay_dir(dir, fn);
    cr_assert_gt(n, 0, "no seeds in %s", dir);
    snprintf(dir, sizeof dir, "%s/regress/%s", root, name);
    replay_dir(dir, fn);
}

Test(fuzz_regress, gguf_seeds_and_regressions_are_refused_or_read_cleanly, .timeout = 120)
{
    replay("gguf", fuzz_gguf);
}

Test(fuzz_regress, config_seeds_and_regressions_load_or_fail_with_a_message, .timeout = 120)
{
    replay("config", fuzz_config);
}

Test(fuzz_regress, proto_seeds_and_regressions_parse_or_fail_and_round_trip, .timeout = 120)
{
    replay("proto", fuzz_proto);
}

Test(fuzz_regress, http_seeds_and_regressions_map_or_fail_cleanly, .timeout = 120)
{
    replay("http", fuzz_http);
}

Test(fuzz_regress, tokenizer_seeds_and_regressions_encode_and_decode_cleanly, .timeout = 120)
{
    replay("tokenizer", fuzz_tokenizer);
}
