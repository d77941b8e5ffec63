/* num: strict decimal numbers, the one parser that config values, CLI flags and fleet files use. */
#ifndef NUM_H
#define NUM_H

#include <stdbool.h>
#include <stdint.h>

/* Each returns NUM_OK with *v set, or NUM_SYNTAX (not the whole string a number of the
 * kind: empty, spaces, '+', hex, "inf", "nan", trailing bytes), or NUM_RANGE (a number,
 * outside what the type or [lo, hi] allows); *v is untouched on failure. */
enum {
    NUM_OK = 0,
    NUM_SYNTAX = 1,
    NUM_RANGE = 2
};

/* Decimal integer: optional '-', digits, nothing else. */
int num_i64(const char *s, int64_t *v);
/* The same, also in [lo, hi]. */
int num_i64_in(const char *s, int64_t lo, int64_t hi, int64_t *v);
/* Digits only (no sign), in [0, UINT64_MAX]. */
int num_u64(const char *s, uint64_t *v);
/* A finite decimal number ("1", "-0.5", "2e3"): digits, '.', 'e', 'E', '+', '-' only.
 * is_float: read as float, so values beyond float's range are NUM_RANGE. */
int num_double(const char *s, bool is_float, double *v);
/* The same, also in [lo, hi] (NaN bounds are not allowed). */
int num_double_in(const char *s, double lo, double hi, double *v);

#endif
