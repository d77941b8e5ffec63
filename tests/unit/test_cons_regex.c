/* cons_regex: JSON Schema patterns as position automata, checked against PCRE2 (an ECMA-like
 * search, as JSON Schema defines "pattern") on random ASCII strings, and the formats' patterns on
 * strings of each format. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <criterion/criterion.h>
#include <pcre2.h>
#include <string.h>

#include "engine/cons_regex.h"

/* Runs s through re: -1 when the automaton died at some character, else whether it accepts. */
static int run(const cons_re_t *re, const char *s, size_t n, size_t *died_at)
{
    uint64_t st = cons_re_init(re);
    for (size_t i = 0; i < n; i++) {
        st = cons_re_step(re, st, (unsigned char)s[i]);
        if (!st) {
            *died_at = i + 1;
            return -1;
        }
    }
    return cons_re_accepts(re, st);
}

static pcre2_code *pcre(const char *pattern)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL);
    cr_assert_not_null(c, "pcre2 refused %s", pattern);
    return c;
}

/* 1 full match (a search, as JSON Schema's pattern), 0 none; with partial, a prefix that a
 * longer string could extend to a match counts too. */
static int pcre_search(pcre2_code *c, const char *s, size_t n, int partial)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)s, n, 0, partial ? PCRE2_PARTIAL_HARD : 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0 || (partial && rc == PCRE2_ERROR_PARTIAL);
}

static const char *const patterns[] = {
    "^.+/.+$",
    "^https://",
    "^[a-zA-Z0-9-_]+$",
    "^[a-zA-Z0-9-_.]+$",
    "^[0-9]+-[0-9]+-[0-9]+$",
    "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$",
    "ab|cd",
    "a(b|c)*d",
    "^(?:x|y){2,3}z?$",
    "[^a-c]{2}$",
    "\\d\\d:\\d{2}",
    "^\\w+\\s\\S+$",
    "^a{0,2}b{1,}$",
    "^$",
    "",
    "^(a|)b$",
    "^[\\-.]+\\.x$",
    "\\$\\^\\(",
    "^[a-f]*?0+$",
};

Test(cons_regex, agrees_with_pcre2_on_random_ascii_strings, .timeout = 60)
{
    static const char alpha[] = "abcdxyz0129-_./:+=AZ $^( \t";
    uint64_t rng = 99;
    for (size_t p = 0; p < sizeof patterns / sizeof patterns[0]; p++) {
        cons_re_t re;
        char err[200];
        cr_assert_eq(cons_re_compile(patterns[p], &re, err, sizeof err), 0, "%s: %s", patterns[p],
                     err);
        pcre2_code *c = pcre(patterns[p]);
        for (int k = 0; k < 4000; k++) {
            char s[16];
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t n = (size_t)(rng >> 60) % 13;
            for (size_t i = 0; i < n; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                s[i] = alpha[(rng >> 33) % (sizeof alpha - 1)];
            }
            size_t died = 0;
            int ours = run(&re, s, n, &died);
            if (ours >= 0) {
                cr_assert_eq(ours, pcre_search(c, s, n, 0), "%s on '%.*s'", patterns[p], (int)n, s);
                continue;
            }
            /* died: no extension of the prefix matches (only an anchored start can die) */
            cr_assert(re.anchored_start, "%s died on '%.*s'", patterns[p], (int)n, s);
            cr_assert(!pcre_search(c, s, died, 1), "%s died on '%.*s' which can still match",
                      patterns[p], (int)died, s);
        }
        pcre2_code_free(c);
    }
}

Test(cons_regex, refuses_what_it_cannot_enforce)
{
    static const char *const bad[] = {
        "(?=a)b", "a\\1", "\\bword", "a^b",   "^a|b$",    "[a-",   "(ab",
        "ab)",    "*a",   "x{3,1}",  "a{70}", "\xc3\xa9", "[z-a]", "(?<n>a)",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cons_re_t re;
        char err[200] = "";
        cr_assert_eq(cons_re_compile(bad[i], &re, err, sizeof err), -1, "%s compiled", bad[i]);
        cr_assert(strncmp(err, "pattern '", 9) == 0, "%s: %s", bad[i], err);
    }
}

Test(cons_regex, non_ascii_characters_go_only_where_every_one_matches)
{
    cons_re_t re;
    char err[200];
    cr_assert_eq(cons_re_compile("^[^a]$", &re, err, sizeof err), 0);
    cr_assert_neq(cons_re_step(&re, cons_re_init(&re), CONS_RE_OTHER), 0);
    static const char *const ascii_only[] = {"^.$", "^\\s$", "^\\S$", "^[^\\s]$", "^\\w$"};
    for (size_t i = 0; i < sizeof ascii_only / sizeof ascii_only[0]; i++) {
        cr_assert_eq(cons_re_compile(ascii_only[i], &re, err, sizeof err), 0);
        cr_assert_eq(cons_re_step(&re, cons_re_init(&re), CONS_RE_OTHER), 0, "%s", ascii_only[i]);
    }
}

static int whole(const char *format, const char *s)
{
    cons_re_t re;
    char err[200];
    const char *p = cons_re_format(format);
    cr_assert_not_null(p, "%s", format);
    cr_assert_eq(cons_re_compile(p, &re, err, sizeof err), 0, "%s: %s", format, err);
    size_t died;
    return run(&re, s, strlen(s), &died) == 1;
}

Test(cons_regex, formats_take_their_strings_and_refuse_others)
{
    cr_assert(whole("date", "2024-02-28") && whole("date", "1999-12-31") &&
              whole("date", "2023-04-30"));
    cr_assert(!whole("date", "2024-02-30") && !whole("date", "2023-04-31") &&
              !whole("date", "2024-13-01") && !whole("date", "24-01-01"));
    cr_assert(whole("date-time", "2024-05-06T07:08:09Z") &&
              whole("date-time", "2024-05-06T23:59:59.123+05:30"));
    cr_assert(!whole("date-time", "2024-05-06 07:08:09Z") &&
              !whole("date-time", "2024-05-06T24:00:00Z") &&
              !whole("date-time", "2024-05-06T07:08:09"));
    cr_assert(whole("time", "07:08:09Z") && !whole("time", "7:08:09Z"));
    cr_assert(whole("email", "ada.lovelace@example.com") && !whole("email", "ada@") &&
              !whole("email", "@example.com") && !whole("email", "a..b@example.com"));
    cr_assert(whole("uuid", "123e4567-e89b-12d3-a456-426614174000") &&
              !whole("uuid", "123e4567e89b12d3a456426614174000"));
    cr_assert(whole("ipv4", "192.168.0.255") && !whole("ipv4", "256.1.1.1") &&
              !whole("ipv4", "01.1.1.1"));
    cr_assert(whole("uri", "https://example.com/a/b.html") && whole("uri", "http://x") &&
              !whole("uri", "example.com") && !whole("uri", "https://exa mple.com"));
    cr_assert(whole("hostname", "api.example.org") && !whole("hostname", "-x"));
    cr_assert_null(cons_re_format("int32"));
}
