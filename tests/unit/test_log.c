/* test_log: the log module's levels, line format and journal priority prefixes; util.h's clocks. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/util.h"

/* Everything written to f so far, as a string the caller frees. */
static char *slurp(FILE *f)
{
    fflush(f);
    long n = ftell(f);
    char *s = calloc(1, (size_t)n + 1);
    rewind(f);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    return s;
}

static void reset(void)
{
    log_set_output(NULL, -1);
    log_set_level(LOG_LEVEL_INFO);
    unsetenv("JOURNAL_STREAM");
}

Test(log, lines_above_the_level_are_dropped, .fini = reset)
{
    FILE *f = tmpfile();
    log_set_output(f, 0);
    log_set_level(LOG_LEVEL_WARNING);
    log_info("not this %d", 1);
    log_warning("this %d", 2);
    log_error("and this");
    log_debug("not this either");
    char *s = slurp(f);
    cr_assert_str_eq(s, "gpuswapd: this 2\ngpuswapd: and this\n");
    free(s);
    fclose(f);
}

Test(log, journal_lines_start_with_their_syslog_priority, .fini = reset)
{
    FILE *f = tmpfile();
    log_set_output(f, 1);
    log_set_level(LOG_LEVEL_DEBUG);
    log_error("e");
    log_notice("n");
    log_debug("d");
    char *s = slurp(f);
    cr_assert_str_eq(s, "<3>gpuswapd: e\n<5>gpuswapd: n\n<7>gpuswapd: d\n");
    free(s);
    fclose(f);
}

Test(log, journal_stream_naming_stderr_turns_prefixes_on, .fini = reset)
{
    struct stat st;
    cr_assert_eq(fstat(2, &st), 0);
    char js[64];
    FILE *f = tmpfile();
    /* another device:inode (a pipe to something else): no prefixes */
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + 1);
    setenv("JOURNAL_STREAM", js, 1);
    log_set_output(f, -1);
    log_info("plain");
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", js, 1);
    log_set_output(f, -1);
    log_info("journal");
    char *s = slurp(f);
    cr_assert_str_eq(s, "gpuswapd: plain\n<6>gpuswapd: journal\n");
    free(s);
    fclose(f);
}

Test(log, a_long_line_is_truncated_and_still_ends_with_a_newline, .fini = reset)
{
    FILE *f = tmpfile();
    log_set_output(f, 0);
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    log_error("%s", big);
    char *s = slurp(f);
    size_t n = strlen(s);
    cr_assert(n > 1000 && n < sizeof big, "%zu", n);
    cr_assert_eq(s[n - 1], '\n');
    cr_assert_eq(strchr(s, '\n'), s + n - 1, "one line");
    free(s);
    fclose(f);
}

Test(log, level_names_follow_the_enum)
{
    cr_assert_str_eq(log_level_name(LOG_LEVEL_ERROR), "error");
    cr_assert_str_eq(log_level_name(LOG_LEVEL_DEBUG), "debug");
    cr_assert_null(log_level_name((log_level_t)2));
    for (int i = 0; log_level_names[i]; i++)
        cr_assert_str_eq(log_level_name(LOG_LEVEL_OF_INDEX(i)), log_level_names[i]);
}

Test(util, clocks_move_forward)
{
    double a = util_now_s();
    uint64_t ns = util_now_ns();
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    cr_assert_geq(util_now_s() - a, 0.002);
    cr_assert_geq(util_now_ns() - ns, 2000000u);
    cr_assert_gt(util_wall_s(), 1.6e9, "after 2020");
    int arr[7];
    cr_assert_eq(UTIL_COUNT_OF(arr), 7);
}
