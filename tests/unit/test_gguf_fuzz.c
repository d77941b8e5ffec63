/* test_gguf_fuzz: deterministic mutation fuzzing of the GGUF reader (truncations, byte flips, hostile fields, bad type codes). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

#if UNDER_ASAN
#include <sanitizer/lsan_interface.h>
#endif

#define NAME "fuzz.gguf" /* the name every mutant is opened under */

/* ------------------------------------------------------------------ seed builder */

#define MAX_MARKS 256

/* A growable byte buffer that also remembers where the type fields are. */
typedef struct seed {
    uint8_t *p;
    size_t len;                /* bytes used */
    size_t cap;                /* bytes allocated */
    size_t hdr_len;            /* bytes before the data section padding */
    size_t type_at[MAX_MARKS]; /* offsets of u32 value/element/tensor type and n_dims fields */
    size_t n_type;
    size_t align_at; /* offset of the general.alignment value, 0 if none */
} seed_t;

static void sd_put(seed_t *s, const void *src, size_t n)
{
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 512;
        while (cap < s->len + n)
            cap *= 2;
        s->p = realloc(s->p, cap);
        cr_assert_not_null(s->p);
        s->cap = cap;
    }
    memcpy(s->p + s->len, src, n);
    s->len += n;
}

static void sd_le(seed_t *s, uint64_t v, size_t n)
{
    uint8_t x[8];
    for (size_t i = 0; i < n; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    sd_put(s, x, n);
}

static void sd_u32(seed_t *s, uint32_t v)
{
    sd_le(s, v, 4);
}
static void sd_u64(seed_t *s, uint64_t v)
{
    sd_le(s, v, 8);
}

static void sd_str(seed_t *s, const char *str)
{
    sd_u64(s, strlen(str));
    sd_put(s, str, strlen(str));
}

/* A u32 type code whose position the bad-type loop should revisit. */
static void sd_type(seed_t *s, uint32_t t)
{
    cr_assert_lt(s->n_type, MAX_MARKS);
    s->type_at[s->n_type++] = s->len;
    sd_u32(s, t);
}

static void sd_key(seed_t *s, const char *key, uint32_t vtype)
{
    sd_str(s, key);
    sd_type(s, vtype);
}

static void sd_arr(seed_t *s, const char *key, uint32_t elem, uint64_t n)
{
    sd_key(s, key, GGUF_VT_ARRAY);
    sd_type(s, elem);
    sd_u64(s, n);
}

typedef struct fz_tensor {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
} fz_tensor_t;

/* Tensor infos packed at the alignment, padding, then deterministic data;
 * the file ends exactly where the last tensor does. */
static void sd_tensors(seed_t *s, const fz_tensor_t *ts, size_t n, uint32_t align)
{
    uint64_t off = 0, end = 0;
    for (size_t i = 0; i < n; i++) {
        sd_str(s, ts[i].name);
        sd_type(s, ts[i].n_dims);
        for (uint32_t d = 0; d < ts[i].n_dims; d++)
            sd_u64(s, ts[i].ne[d]);
        sd_type(s, ts[i].type);
        sd_u64(s, off);
        end = off + ts[i].nbytes;
        off += (ts[i].nbytes + align - 1) / align * align;
    }
    s->hdr_len = s->len;
    while (s->len % align)
        sd_le(s, 0, 1);
    for (uint64_t i = 0; i < end; i++)
        sd_le(s, (uint8_t)(i * 31 + 7), 1);
}

/* Seed 0: v3, every value type including nested arrays, F32/F16/Q8_0 tensors. */
static void seed_all_types(seed_t *s)
{
    static const fz_tensor_t ts[] = {
        {"token_embd.weight", GGUF_T_F32, 2, {4, 2}, 32},
        {"blk.0.attn_norm.weight", GGUF_T_F16, 2, {8, 2}, 32},
        {"blk.0.attn_q.weight", GGUF_T_Q8_0, 2, {32, 2}, 68},
        {"output.weight", GGUF_T_Q8_0, 1, {64}, 68},
    };
    memset(s, 0, sizeof *s);
    sd_put(s, "GGUF", 4);
    sd_u32(s, 3);
    sd_u64(s, sizeof ts / sizeof ts[0]);
    sd_u64(s, 22);
    sd_key(s, "general.architecture", GGUF_VT_STRING);
    sd_str(s, "llama");
    sd_key(s, "u8", GGUF_VT_UINT8);
    sd_le(s, 250, 1);
    sd_key(s, "i8", GGUF_VT_INT8);
    sd_le(s, 0x80, 1);
    sd_key(s, "u16", GGUF_VT_UINT16);
    sd_le(s, 65535, 2);
    sd_key(s, "i16", GGUF_VT_INT16);
    sd_le(s, 0x8000, 2);
    sd_key(s, "u32", GGUF_VT_UINT32);
    sd_u32(s, 0xFFFFFFFFu);
    sd_key(s, "i32", GGUF_VT_INT32);
    sd_u32(s, 0x80000000u);
    sd_key(s, "f32", GGUF_VT_FLOAT32);
    sd_u32(s, 0x7F7FFFFFu); /* FLT_MAX */
    sd_key(s, "bool", GGUF_VT_BOOL);
    sd_le(s, 1, 1);
    sd_key(s, "u64", GGUF_VT_UINT64);
    sd_u64(s, UINT64_MAX);
    sd_key(s, "i64", GGUF_VT_INT64);
    sd_u64(s, 1ull << 63);
    sd_key(s, "f64", GGUF_VT_FLOAT64);
    sd_u64(s, 0x7FEFFFFFFFFFFFFFull); /* DBL_MAX */
    sd_arr(s, "a.u8", GGUF_VT_UINT8, 3);
    sd_le(s, 0x030201, 3);
    sd_arr(s, "a.i16", GGUF_VT_INT16, 2);
    sd_u32(s, 0x8000FFFFu);
    sd_arr(s, "a.u32", GGUF_VT_UINT32, 2);
    sd_u64(s, 0x00000001FFFFFFFFull);
    sd_arr(s, "a.f32", GGUF_VT_FLOAT32, 2);
    sd_u32(s, 0x3F800000u);
    sd_u32(s, 0x7F800000u);
    sd_arr(s, "a.f64", GGUF_VT_FLOAT64, 1);
    sd_u64(s, 0xC3E0000000000001ull);
    sd_arr(s, "a.bool", GGUF_VT_BOOL, 3);
    sd_le(s, 0x000101, 3);
    sd_arr(s, "a.u64", GGUF_VT_UINT64, 1);
    sd_u64(s, UINT64_MAX);
    sd_arr(s, "a.i64", GGUF_VT_INT64, 1);
    sd_u64(s, 1ull << 63);
    sd_arr(s, "tokenizer.ggml.tokens", GGUF_VT_STRING, 4);
    sd_str(s, "<s>");
    sd_str(s, "");
    sd_str(s, "hello");
    sd_str(s, "\xe2\x96\x81world");
    sd_arr(s, "a.arr.str", GGUF_VT_ARRAY, 2);
    sd_type(s, GGUF_VT_STRING);
    sd_u64(s, 2);
    sd_str(s, "x");
    sd_str(s, "yz");
    sd_type(s, GGUF_VT_ARRAY);
    sd_u64(s, 1);
    sd_type(s, GGUF_VT_STRING);
    sd_u64(s, 1);
    sd_str(s, "deep");
    sd_tensors(s, ts, sizeof ts / sizeof ts[0], 32);
}

/* Seed 1: v2 with general.alignment = 64 and a 4-d tensor. */
static void seed_aligned(seed_t *s)
{
    static const fz_tensor_t ts[] = {
        {"a", GGUF_T_F32, 4, {2, 2, 2, 2}, 64},
        {"b", GGUF_T_F16, 1, {3}, 6},
        {"c", GGUF_T_Q8_0, 3, {32, 1, 2}, 68},
    };
    memset(s, 0, sizeof *s);
    sd_put(s, "GGUF", 4);
    sd_u32(s, 2);
    sd_u64(s, sizeof ts / sizeof ts[0]);
    sd_u64(s, 3);
    sd_key(s, "general.name", GGUF_VT_STRING);
    sd_str(s, "aligned");
    sd_key(s, "general.alignment", GGUF_VT_UINT32);
    s->align_at = s->len;
    sd_u32(s, 64);
    sd_arr(s, "a.i32", GGUF_VT_INT32, 2);
    sd_u64(s, 0xFFFFFFFF00000001ull);
    sd_tensors(s, ts, sizeof ts / sizeof ts[0], 64);
}

/* Seed 2: the smallest interesting file, one kv and one tensor. */
static void seed_tiny(seed_t *s)
{
    static const fz_tensor_t ts[] = {{"w", GGUF_T_F32, 1, {2}, 8}};
    memset(s, 0, sizeof *s);
    sd_put(s, "GGUF", 4);
    sd_u32(s, 3);
    sd_u64(s, 1);
    sd_u64(s, 1);
    sd_key(s, "k", GGUF_VT_UINT8);
    sd_le(s, 1, 1);
    sd_tensors(s, ts, 1, 32);
}

static void (*const seed_fns[])(seed_t *) = {seed_all_types, seed_aligned, seed_tiny};
#define N_SEEDS (sizeof seed_fns / sizeof seed_fns[0])

/* ------------------------------------------------------------------ checking a result */

static volatile uint64_t sink; /* keeps the checksums alive */

typedef struct tally {
    long ok, failed;
} tally_t;

static uint64_t walk_value(const gguf_value_t *v, const uint8_t *lo, const uint8_t *hi, int depth,
                           const char *what)
{
    uint64_t sum = v->type;
    if (depth > 16)
        cr_assert_fail("%s: value nested %d deep", what, depth);
    if (v->type == GGUF_VT_STRING) {
        const uint8_t *p = (const uint8_t *)v->v.str.ptr;
        if (p < lo || p > hi || v->v.str.len > (uint64_t)(hi - p))
            cr_assert_fail("%s: string outside the buffer", what);
        for (uint64_t i = 0; i < v->v.str.len; i++)
            sum = sum * 31 + p[i];
        return sum;
    }
    if (v->type != GGUF_VT_ARRAY)
        return sum + v->v.u64;
    size_t esz = gguf_vtype_size(v->v.arr.type);
    if (esz) {
        const uint8_t *p = v->v.arr.data;
        if (p < lo || p > hi || v->v.arr.n > (uint64_t)(hi - p) / esz)
            cr_assert_fail("%s: array outside the buffer", what);
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            sum += (uint64_t)gguf_arr_i64(v, i);
            double d = gguf_arr_f64(v, i);
            sum += d == d; /* touch it without converting NaN/huge values */
        }
        return sum;
    }
    if (v->v.arr.n && !v->v.arr.items)
        cr_assert_fail("%s: %llu elements but no items", what, (unsigned long long)v->v.arr.n);
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        if (v->v.arr.items[i].type != v->v.arr.type)
            cr_assert_fail("%s: element %llu has type %u, array says %u", what,
                           (unsigned long long)i, v->v.arr.items[i].type, v->v.arr.type);
        sum += walk_value(&v->v.arr.items[i], lo, hi, depth + 1, what);
    }
    return sum;
}

/* A parse is either NULL with a message naming the file, or a gguf_t whose
 * every key, value and tensor byte lies inside buf and is consistent. */
static void check_result(gguf_t *g, const char *err, const uint8_t *buf, size_t len,
                         const char *what, tally_t *t)
{
    if (!g) {
        if (!err[0])
            cr_assert_fail("%s: NULL without an error message", what);
        if (strncmp(err, NAME ": ", strlen(NAME) + 2) != 0 || !err[strlen(NAME) + 2])
            cr_assert_fail("%s: message does not name the file and a problem: '%s'", what, err);
        t->failed++;
        return;
    }
    t->ok++;
    const uint8_t *lo = buf, *hi = buf + len;
    uint64_t sum = 0;
    size_t align = gguf_alignment(g);
    if (align == 0 || (align & (align - 1)) || gguf_data_offset(g) % align)
        cr_assert_fail("%s: alignment %zu, data offset %llu", what, align,
                       (unsigned long long)gguf_data_offset(g));
    if (gguf_version(g) != 2 && gguf_version(g) != 3)
        cr_assert_fail("%s: version %u accepted", what, gguf_version(g));
    for (size_t i = 0; i < gguf_kv_count(g); i++) {
        const gguf_kv_t *kv = gguf_kv_at(g, i);
        size_t klen = strlen(kv->key);
        if (klen == 0 || klen > 65535)
            cr_assert_fail("%s: key %zu of length %zu", what, i, klen);
        if (gguf_get(g, kv->key) != &kv->val)
            cr_assert_fail("%s: key '%s' is not unique", what, kv->key);
        sum += walk_value(&kv->val, lo, hi, 0, what);
        /* every getter on every key: conversions must not trap */
        uint64_t u64;
        uint32_t u32;
        int64_t i64;
        float f;
        int b;
        gguf_str_t s;
        const gguf_value_t *a;
        sum += (uint64_t)gguf_get_u64(g, kv->key, &u64) + (uint64_t)gguf_get_u32(g, kv->key, &u32) +
               (uint64_t)gguf_get_i64(g, kv->key, &i64) + (uint64_t)gguf_get_f32(g, kv->key, &f) +
               (uint64_t)gguf_get_bool(g, kv->key, &b) + (uint64_t)gguf_get_str(g, kv->key, &s) +
               (uint64_t)gguf_get_arr(g, kv->key, GGUF_VT_COUNT, &a);
    }
    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        uint32_t blck, bytes;
        if (gguf_find_tensor(g, t->name) != t)
            cr_assert_fail("%s: tensor '%s' is not unique", what, t->name);
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS || gguf_ttype_traits(t->type, &blck, &bytes))
            cr_assert_fail("%s: tensor '%s' has %u dims, type %u", what, t->name, t->n_dims,
                           t->type);
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            nel *= t->ne[d];
        if (t->ne[0] % blck || t->nbytes != nel / blck * bytes || t->offset % align)
            cr_assert_fail("%s: tensor '%s' size or offset inconsistent", what, t->name);
        const uint8_t *p = t->data;
        if (p != lo + gguf_data_offset(g) + t->offset || p < lo || p > hi ||
            t->nbytes > (uint64_t)(hi - p))
            cr_assert_fail("%s: tensor '%s' data outside the buffer", what, t->name);
        for (uint64_t k = 0; k < t->nbytes; k++)
            sum = sum * 131 + p[k];
    }
    sink += sum;
}

/* Parses an exact-size heap copy of buf[0..len) (so AddressSanitizer sees
 * any read past its end) and checks the outcome. */
static void try_parse(const uint8_t *buf, size_t len, const char *what, tally_t *t)
{
    uint8_t *copy = malloc(len ? len : 1);
    cr_assert_not_null(copy);
    if (len)
        memcpy(copy, buf, len);
    char err[512] = "";
    gguf_t *g = gguf_open_mem(copy, len, NAME, err, sizeof err);
    check_result(g, err, copy, len, what, t);
    gguf_close(g);
    free(copy);
}

/* Under LeakSanitizer, fails the test if anything parsed so far leaked. */
static void check_no_leaks(void)
{
#if UNDER_ASAN
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "LeakSanitizer found leaks");
#endif
}

/* The mutation PRNG: splitmix64 from a fixed seed, so every run is the same. */
static uint64_t fz_rand(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void put_le(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ------------------------------------------------------------------ tests */

Test(gguf_fuzz, the_seed_files_parse_and_walk_cleanly)
{
    for (size_t i = 0; i < N_SEEDS; i++) {
        seed_t s;
        seed_fns[i](&s);
        char err[512] = "";
        gguf_t *g = gguf_open_mem(s.p, s.len, NAME, err, sizeof err);
        cr_assert_not_null(g, "seed %zu: %s", i, err);
        tally_t t = {0};
        check_result(g, err, s.p, s.len, "seed", &t);
        cr_assert_geq(gguf_tensor_count(g), 1);
        gguf_close(g);
        free(s.p);
    }
    seed_t s;
    seed_all_types(&s);
    gguf_t *g = gguf_open_mem(s.p, s.len, NAME, NULL, 0);
    cr_assert_eq(gguf_kv_count(g), 22);
    cr_assert_eq(gguf_tensor_count(g), 4);
    gguf_close(g);
    free(s.p);
    check_no_leaks();
}

Test(gguf_fuzz, every_truncation_of_every_seed_fails_cleanly, .timeout = 60)
{
    for (size_t i = 0; i < N_SEEDS; i++) {
        seed_t s;
        seed_fns[i](&s);
        tally_t t = {0};
        for (size_t len = 0; len <= s.len; len++) {
            char what[64];
            snprintf(what, sizeof what, "seed %zu cut to %zu", i, len);
            try_parse(s.p, len, what, &t);
        }
        /* only the whole file (the data ends exactly at the last tensor) parses */
        cr_assert_eq(t.ok, 1, "seed %zu: %ld truncations parsed", i, t.ok);
        free(s.p);
    }
    check_no_leaks();
}

Test(gguf_fuzz, thousands_of_random_byte_mutations_never_crash, .timeout = 60)
{
    uint64_t rng = 0x5eed5eed12345678ull;
    seed_t seeds[N_SEEDS];
    for (size_t i = 0; i < N_SEEDS; i++)
        seed_fns[i](&seeds[i]);
    uint8_t *buf = malloc(seeds[0].len + seeds[1].len + seeds[2].len);
    cr_assert_not_null(buf);
    tally_t t = {0};
    static const uint8_t interesting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x20, 0x40, 0x09, 0x08};
    for (int iter = 0; iter < 200000; iter++) {
        const seed_t *s = &seeds[fz_rand(&rng) % N_SEEDS];
        memcpy(buf, s->p, s->len);
        size_t len = s->len;
        int n_mut = 1 + (int)(fz_rand(&rng) % (iter % 3 == 0 ? 1 : 8));
        for (int m = 0; m < n_mut; m++) {
            uint64_t r = fz_rand(&rng);
            /* mostly the header, where the parser's decisions are */
            size_t pos = (r & 0xf) ? (r >> 8) % s->hdr_len : (r >> 8) % s->len;
            switch ((r >> 4) % 6) {
            case 0: buf[pos] ^= (uint8_t)(1u << ((r >> 40) % 8)); break;
            case 1: buf[pos] = (uint8_t)(r >> 48); break;
            case 2: buf[pos] = interesting[(r >> 40) % sizeof interesting]; break;
            case 3: buf[pos] += (uint8_t)((r >> 40) % 5) - 2; break;
            case 4: /* a random multi-byte run */
                for (size_t k = pos; k < len && k < pos + 1 + (r >> 40) % 8; k++)
                    buf[k] = (uint8_t)fz_rand(&rng);
                break;
            case 5: /* drop the tail */ len = pos; break;
            }
        }
        char what[64];
        snprintf(what, sizeof what, "random mutation %d", iter);
        try_parse(buf, len, what, &t);
    }
    /* the loop must reach both outcomes, or it is not exploring */
    cr_assert_gt(t.ok, 100, "only %ld mutants parsed", t.ok);
    cr_assert_gt(t.failed, 1000, "only %ld mutants failed", t.failed);
    free(buf);
    for (size_t i = 0; i < N_SEEDS; i++)
        free(seeds[i].p);
    check_no_leaks();
}

Test(gguf_fuzz, hostile_values_at_every_field_position_never_crash, .timeout = 60)
{
    static const uint64_t hostile[] = {
        0,          1,          0xFFFFFFFFull, 1ull << 32, 1ull << 63, UINT64_MAX, (uint64_t)-1 - 1,
        1ull << 62, 1ull << 60, 0x7FFFFFFFull, 33,         64,
    };
    tally_t t = {0};
    for (size_t i = 0; i < N_SEEDS; i++) {
        seed_t s;
        seed_fns[i](&s);
        uint8_t *buf = malloc(s.len);
        cr_assert_not_null(buf);
        /* every byte offset of the header (a superset of the 8-byte aligned
         * ones), as 8-byte and 4-byte little-endian fields */
        for (size_t pos = 0; pos < s.hdr_len; pos++) {
            for (size_t h = 0; h < sizeof hostile / sizeof hostile[0]; h++) {
                for (size_t w = 4; w <= 8; w += 4) {
                    if (pos + w > s.len)
                        continue;
                    memcpy(buf, s.p, s.len);
                    put_le(buf + pos, hostile[h], w);
                    char what[80];
                    snprintf(what, sizeof what, "seed %zu: %zu-byte 0x%llx at %zu", i, w,
                             (unsigned long long)hostile[h], pos);
                    try_parse(buf, s.len, what, &t);
                }
            }
        }
        free(buf);
        free(s.p);
    }
    cr_assert_gt(t.ok, 0);
    cr_assert_gt(t.failed, 0);
    check_no_leaks();
}

Test(gguf_fuzz, bad_type_codes_in_every_type_field_fail_cleanly, .timeout = 60)
{
    tally_t t = {0};
    for (size_t i = 0; i < N_SEEDS; i++) {
        seed_t s;
        seed_fns[i](&s);
        cr_assert_gt(s.n_type, 0);
        uint8_t *buf = malloc(s.len);
        cr_assert_not_null(buf);
        for (size_t k = 0; k < s.n_type; k++) {
            for (uint64_t code = 0; code < 48; code++) {
                uint32_t codes[3] = {(uint32_t)code, 0x80000000u | (uint32_t)code,
                                     UINT32_MAX - (uint32_t)code};
                for (int c = 0; c < (code < 4 ? 3 : 1); c++) {
                    memcpy(buf, s.p, s.len);
                    put_le(buf + s.type_at[k], codes[c], 4);
                    char what[80];
                    snprintf(what, sizeof what, "seed %zu: type field at %zu = %u", i, s.type_at[k],
                             codes[c]);
                    try_parse(buf, s.len, what, &t);
                }
            }
        }
        free(buf);
        free(s.p);
    }
    /* the original codes (and harmless substitutes) still parse */
    cr_assert_gt(t.ok, 0);
    cr_assert_gt(t.failed, 0);
    check_no_leaks();
}

Test(gguf_fuzz, every_alignment_value_fails_cleanly_or_parses_consistently, .timeout = 60)
{
    seed_t s;
    seed_aligned(&s);
    cr_assert_neq(s.align_at, 0);
    uint8_t *buf = malloc(s.len);
    cr_assert_not_null(buf);
    tally_t t = {0};
    for (int bit = 0; bit < 32; bit++) {
        uint32_t vals[3] = {1u << bit, (1u << bit) + 1, (1u << bit) - 1};
        for (int v = 0; v < 3; v++) {
            memcpy(buf, s.p, s.len);
            put_le(buf + s.align_at, vals[v], 4);
            char what[64];
            snprintf(what, sizeof what, "alignment %u", vals[v]);
            try_parse(buf, s.len, what, &t);
        }
    }
    /* 1..64 keep the tensors aligned and parse: 1, 2, 4, ..., 64 and 1 again as 2^0+0 */
    cr_assert_geq(t.ok, 7);
    free(buf);
    free(s.p);
    check_no_leaks();
}

Test(gguf_fuzz, wrong_versions_and_counts_in_the_header_fail_cleanly, .timeout = 60)
{
    /* header counts over a range around the truth, crossed with versions */
    seed_t s;
    seed_all_types(&s);
    uint8_t *buf = malloc(s.len);
    cr_assert_not_null(buf);
    tally_t t = {0};
    for (uint32_t version = 0; version <= 4; version++) {
        for (uint64_t nt = 0; nt < 8; nt++) {
            for (uint64_t nkv = 0; nkv < 26; nkv++) {
                memcpy(buf, s.p, s.len);
                put_le(buf + 4, version, 4);
                put_le(buf + 8, nt, 8);
                put_le(buf + 16, nkv, 8);
                char what[64];
                snprintf(what, sizeof what, "v%u, %llu tensors, %llu kvs", version,
                         (unsigned long long)nt, (unsigned long long)nkv);
                try_parse(buf, s.len, what, &t);
            }
        }
    }
    cr_assert_geq(t.ok, 1);
    free(buf);
    free(s.p);
    check_no_leaks();
}
