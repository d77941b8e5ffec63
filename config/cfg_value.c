/* cfg_value: the config's value syntax: sizes, rates, durations and numbers parsed and formatted, and the message helpers. */
#include "config_int.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------------ small helpers */

/* Copies s into buf for a message: at most 60 bytes, control bytes as '?'. */
const char *cfg_sanitize(const char *s, char *buf, size_t n)
{
    size_t max = n - 1 < 60 ? n - 1 : 60, j = 0;
    for (size_t i = 0; s[i] && j < max; i++)
        buf[j++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (strlen(s) > max && max >= 3)
        memcpy(buf + max - 3, "...", 3);
    buf[j] = 0;
    return buf;
}

void cfg_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ value parsers */

static const struct unit {
    const char *name;
    uint64_t mult;
} size_units[] = {
    {"", 1},
    {"B", 1},
    {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},
    {"GiB", 1ull << 30},
    {"TiB", 1ull << 40},
};

static const struct unit duration_units[] = {
    {"ms", 1},
    {"s", 1000},
    {"m", 60000},
    {"h", 3600000},
};

/* Parses "<digits>[.<digits>]<unit>" with units from a table into an exact
 * integer count of the base unit. Returns 0, or CFG_ERR_INVALID with why set:
 * 1 = syntax or unit, 2 = negative, 3 = too large, 4 = not whole, 5 = no unit. */
static int parse_scaled(const char *s, const struct unit *units, size_t n_units, uint64_t *out,
                        int *why)
{
    const char *p = s;
    if (*p == '-') {
        *why = 2;
        return CFG_ERR_INVALID;
    }
    if (!(*p >= '0' && *p <= '9')) {
        *why = 1;
        return CFG_ERR_INVALID;
    }
    uint64_t ip = 0;
    bool big = false;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t dgt = (uint64_t)(*p - '0');
        if (big || ip > (UINT64_MAX - dgt) / 10)
            big = true;
        else
            ip = ip * 10 + dgt;
    }
    uint64_t frac = 0, fden = 1;
    bool frac_lost = false;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) {
            *why = 1;
            return CFG_ERR_INVALID;
        }
        for (int nd = 0; *p >= '0' && *p <= '9'; p++, nd++) {
            if (nd < 18) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                fden *= 10;
            } else if (*p != '0') {
                frac_lost = true;
            }
        }
    }
    while (*p == ' ')
        p++;
    const struct unit *u = NULL;
    for (size_t i = 0; i < n_units; i++)
        if (strcmp(p, units[i].name) == 0)
            u = &units[i];
    if (!u) {
        *why = 1;
        return CFG_ERR_INVALID;
    }
    if (big) {
        *why = 3;
        return CFG_ERR_INVALID;
    }
    unsigned __int128 f = (unsigned __int128)frac * u->mult;
    if (frac_lost || f % fden) {
        *why = 4;
        return CFG_ERR_INVALID;
    }
    unsigned __int128 v = (unsigned __int128)ip * u->mult + f / fden;
    if (v > UINT64_MAX) {
        *why = 3;
        return CFG_ERR_INVALID;
    }
    *out = (uint64_t)v;
    return 0;
}

/* "GB", "g", "Mb"...: spellings we refuse to guess the meaning of. */
static bool size_unit_ambiguous(const char *unit)
{
    static const char *const amb[] = {"k", "m", "g", "t", "kb", "mb", "gb", "tb", "b"};
    if (strcmp(unit, "B") == 0)
        return false;
    for (size_t i = 0; i < sizeof amb / sizeof amb[0]; i++)
        if (strcasecmp(unit, amb[i]) == 0)
            return true;
    return false;
}

int cfg_parse_size(const char *s, uint64_t *out, char *err, size_t errlen)
{
    int why = 0;
    if (parse_scaled(s, size_units, sizeof size_units / sizeof size_units[0], out, &why) == 0)
        return 0;
    const char *unit = s;
    while (*unit == '-' || *unit == '.' || (*unit >= '0' && *unit <= '9') || *unit == ' ')
        unit++;
    switch (why) {
    case 2: cfg_set_err(err, errlen, "sizes cannot be negative"); break;
    case 3: cfg_set_err(err, errlen, "too large: at most 16EiB - 1"); break;
    case 4: cfg_set_err(err, errlen, "not a whole number of bytes"); break;
    default:
        if (unit != s && size_unit_ambiguous(unit))
            cfg_set_err(err, errlen, "use B, KiB, MiB, GiB, TiB; '%.8s' is ambiguous", unit);
        else
            cfg_set_err(err, errlen, "use B, KiB, MiB, GiB, TiB");
    }
    return CFG_ERR_INVALID;
}

int cfg_parse_duration_ms(const char *s, uint64_t *out_ms, char *err, size_t errlen)
{
    int why = 0;
    static const struct unit zero[] = {{"", 0}};
    uint64_t v = 0;
    if (parse_scaled(s, duration_units, sizeof duration_units / sizeof duration_units[0], out_ms,
                     &why) == 0)
        return 0;
    if (why == 1 &&
        parse_scaled(s, zero, 1, &v, &why) == 0) { /* a bare number: only 0 needs no unit */
        if (strspn(s, "0.") == strlen(s)) {
            *out_ms = 0;
            return 0;
        }
        why = 5;
    }
    switch (why) {
    case 2: cfg_set_err(err, errlen, "durations cannot be negative"); break;
    case 3: cfg_set_err(err, errlen, "too large"); break;
    case 4: cfg_set_err(err, errlen, "not a whole number of milliseconds"); break;
    case 5: cfg_set_err(err, errlen, "missing unit: use ms, s, m, h, e.g. 250ms, 1.5s"); break;
    default: cfg_set_err(err, errlen, "use ms, s, m, h, e.g. 250ms, 1.5s");
    }
    return CFG_ERR_INVALID;
}

char *cfg_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes && u < 4 && bytes % 1024 == 0) {
        bytes /= 1024;
        u++;
    }
    if (bytes == 0)
        snprintf(buf, len, "0");
    else
        snprintf(buf, len, "%llu%s", (unsigned long long)bytes, names[u]);
    return buf;
}

char *cfg_format_duration_ms(uint64_t ms, char *buf, size_t len)
{
    if (ms == 0)
        snprintf(buf, len, "0");
    else if (ms % 3600000 == 0)
        snprintf(buf, len, "%lluh", (unsigned long long)(ms / 3600000));
    else if (ms % 60000 == 0)
        snprintf(buf, len, "%llum", (unsigned long long)(ms / 60000));
    else if (ms % 1000 == 0)
        snprintf(buf, len, "%llus", (unsigned long long)(ms / 1000));
    else
        snprintf(buf, len, "%llums", (unsigned long long)ms);
    return buf;
}
