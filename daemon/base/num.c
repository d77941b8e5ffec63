/* num: strict decimal number parsing (see num.h). */
#include "num.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int num_i64(const char *s, int64_t *v)
{
    if (!s)
        return NUM_SYNTAX;
    const char *p = s + (*s == '-');
    if (!*p || strspn(p, "0123456789") != strlen(p))
        return NUM_SYNTAX;
    errno = 0;
    long long x = strtoll(s, NULL, 10);
    if (errno == ERANGE)
        return NUM_RANGE;
    *v = x;
    return NUM_OK;
}

int num_i64_in(const char *s, int64_t lo, int64_t hi, int64_t *v)
{
    int64_t x;
    int rc = num_i64(s, &x);
    if (rc)
        return rc;
    if (x < lo || x > hi)
        return NUM_RANGE;
    *v = x;
    return NUM_OK;
}

int num_u64(const char *s, uint64_t *v)
{
    if (!s || !*s || strspn(s, "0123456789") != strlen(s))
        return NUM_SYNTAX;
    errno = 0;
    unsigned long long x = strtoull(s, NULL, 10);
    if (errno == ERANGE)
        return NUM_RANGE;
    *v = x;
    return NUM_OK;
}

int num_double(const char *s, bool is_float, double *v)
{
    if (!s || !*s || strspn(s, "0123456789.eE+-") != strlen(s) || !strpbrk(s, "0123456789"))
        return NUM_SYNTAX;
    char *end;
    errno = 0;
    double x = is_float ? (double)strtof(s, &end) : strtod(s, &end);
    if (*end)
        return NUM_SYNTAX;
    if (!isfinite(x))
        return NUM_RANGE;
    *v = x;
    return NUM_OK;
}

int num_double_in(const char *s, double lo, double hi, double *v)
{
    double x;
    int rc = num_double(s, false, &x);
    if (rc)
        return rc;
    if (!(x >= lo && x <= hi))
        return NUM_RANGE;
    *v = x;
    return NUM_OK;
}
