/* keyhash: the stored key format (SHA-256 in hex with its prefix), key generation and parsing. */
#include <criterion/criterion.h>
#include <string.h>

#include "keyhash.h"

Test(keyhash, the_hash_is_sha256_in_hex_with_its_prefix)
{
    char h[KEYHASH_LEN + 1];
    keyhash_of("abc", 3, h);
    cr_assert_str_eq(h, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

Test(keyhash, keygen_draws_distinct_keys_whose_hash_it_prints)
{
    char k1[80], k2[80], h1[KEYHASH_LEN + 1], h2[KEYHASH_LEN + 1], again[KEYHASH_LEN + 1];
    cr_assert_eq(keyhash_gen(k1, sizeof k1, h1), 0);
    cr_assert_eq(keyhash_gen(k2, sizeof k2, h2), 0);
    cr_assert_eq(strlen(k1), 68);
    cr_assert_eq(strncmp(k1, "gsk_", 4), 0);
    cr_assert_str_neq(k1, k2);
    keyhash_of(k1, strlen(k1), again);
    cr_assert_str_eq(again, h1);
    cr_assert_eq(keyhash_gen(k1, 10, h1), -1, "too small a buffer");
}

Test(keyhash, parse_takes_the_stored_form_and_refuses_anything_else)
{
    unsigned char b[32];
    const char *ok = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    cr_assert_eq(keyhash_parse(ok, b), 0);
    cr_assert_eq(b[0], 0xba);
    cr_assert_eq(b[31], 0xad);
    cr_assert_eq(keyhash_parse(ok, NULL), 0, "a check only");
    cr_assert_eq(keyhash_parse(NULL, b), -1);
    cr_assert_eq(keyhash_parse("sha256:ba78", b), -1, "too short");
    cr_assert_eq(
        keyhash_parse("sha512:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", b),
        -1, "another prefix");
    cr_assert_eq(
        keyhash_parse("sha256:BA7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", b),
        -1, "upper case");
    cr_assert_eq(
        keyhash_parse("sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a+", b),
        -1, "not hex");
}

Test(keyhash, the_digest_matches_the_printed_hash)
{
    unsigned char d[32], p[32];
    char h[KEYHASH_LEN + 1];
    keyhash_digest("gsk_x", 5, d);
    keyhash_of("gsk_x", 5, h);
    cr_assert_eq(keyhash_parse(h, p), 0);
    cr_assert_eq(memcmp(d, p, 32), 0);
}
