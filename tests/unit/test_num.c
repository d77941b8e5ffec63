/* Unit tests for base/num: the strict decimal parser every option and flag uses. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>

#include "base/num.h"

Test(num, i64_accepts_decimal_integers)
{
    int64_t v = 0;
    cr_assert_eq(num_i64("0", &v), NUM_OK);
    cr_assert_eq(v, 0);
    cr_assert_eq(num_i64("-42", &v), NUM_OK);
    cr_assert_eq(v, -42);
    cr_assert_eq(num_i64("9223372036854775807", &v), NUM_OK);
    cr_assert_eq(v, INT64_MAX);
    cr_assert_eq(num_i64("-9223372036854775808", &v), NUM_OK);
    cr_assert_eq(v, INT64_MIN);
}

Test(num, i64_refuses_what_strtoll_would_take)
{
    int64_t v = 7;
    const char *bad[] = {"", " 1", "1 ", "+1", "0x10", "1e3", "1.0", "-", "--1", "12a", "∞"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(num_i64(bad[i], &v), NUM_SYNTAX, "'%s'", bad[i]);
    cr_assert_eq(num_i64(NULL, &v), NUM_SYNTAX);
    cr_assert_eq(num_i64("9223372036854775808", &v), NUM_RANGE);
    cr_assert_eq(num_i64("-99999999999999999999", &v), NUM_RANGE);
    cr_assert_eq(v, 7, "untouched on failure");
}

Test(num, i64_in_bounds)
{
    int64_t v = 7;
    cr_assert_eq(num_i64_in("5", 1, 5, &v), NUM_OK);
    cr_assert_eq(v, 5);
    cr_assert_eq(num_i64_in("6", 1, 5, &v), NUM_RANGE);
    cr_assert_eq(num_i64_in("0", 1, 5, &v), NUM_RANGE);
    cr_assert_eq(num_i64_in("x", 1, 5, &v), NUM_SYNTAX);
    cr_assert_eq(v, 5);
}

Test(num, u64_full_range_no_sign)
{
    uint64_t v = 0;
    cr_assert_eq(num_u64("18446744073709551615", &v), NUM_OK);
    cr_assert_eq(v, UINT64_MAX);
    cr_assert_eq(num_u64("18446744073709551616", &v), NUM_RANGE);
    cr_assert_eq(num_u64("-1", &v), NUM_SYNTAX);
    cr_assert_eq(num_u64("+1", &v), NUM_SYNTAX);
    cr_assert_eq(num_u64("", &v), NUM_SYNTAX);
}

Test(num, double_finite_decimal_only)
{
    double v = 0;
    cr_assert_eq(num_double("0.5", false, &v), NUM_OK);
    cr_assert_float_eq(v, 0.5, 0);
    cr_assert_eq(num_double("-2e3", false, &v), NUM_OK);
    cr_assert_float_eq(v, -2000.0, 0);
    cr_assert_eq(num_double("1.", false, &v), NUM_OK);
    const char *bad[] = {"", ".", "e", "inf", "nan", "0x1p3", " 1", "1 ", "1,5", "1e", "--1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(num_double(bad[i], false, &v), NUM_SYNTAX, "'%s'", bad[i]);
    cr_assert_eq(num_double("1e999", false, &v), NUM_RANGE);
    cr_assert_eq(num_double("1e300", false, &v), NUM_OK);
    cr_assert_eq(num_double("1e300", true, &v), NUM_RANGE, "beyond float");
    cr_assert_eq(num_double("3.4e38", true, &v), NUM_OK);
    cr_assert(v <= FLT_MAX);
}

Test(num, double_in_bounds)
{
    double v = 0;
    cr_assert_eq(num_double_in("1", 0, 1, &v), NUM_OK);
    cr_assert_eq(num_double_in("1.0001", 0, 1, &v), NUM_RANGE);
    cr_assert_eq(num_double_in("-0.1", 0, 1, &v), NUM_RANGE);
    cr_assert_eq(num_double_in("abc", 0, 1, &v), NUM_SYNTAX);
}
