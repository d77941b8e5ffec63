/* test_gguf: the GGUF reader on hand-built v2/v3 files, hostile headers and the real stories260K model. */
#include <criterion/criterion.h>

#include "testutil.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "ggufw.h"

#define NAME "test.gguf" /* the name hand-built buffers are opened under */

/* ------------------------------------------------------------------ byte builder */

/* A growable little-endian byte buffer for writing GGUF files by hand,
 * including the malformed ones a writer would refuse to produce. */
typedef struct bb {
    uint8_t *p;
    size_t len; /* bytes used */
    size_t cap; /* bytes allocated */
} bb_t;

static void bb_put(bb_t *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        cr_assert_not_null(b->p);
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void bb_le(bb_t *b, uint64_t v, size_t n)
{
    uint8_t x[8];
    for (size_t i = 0; i < n; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    bb_put(b, x, n);
}

static void bb_u8(bb_t *b, uint8_t v)
{
    bb_le(b, v, 1);
}
static void bb_u32(bb_t *b, uint32_t v)
{
    bb_le(b, v, 4);
}
static void bb_u64(bb_t *b, uint64_t v)
{
    bb_le(b, v, 8);
}

static void bb_f32(bb_t *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    bb_u32(b, u);
}

static void bb_f64(bb_t *b, double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    bb_u64(b, u);
}

static void bb_str(bb_t *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

static void bb_align(bb_t *b, size_t a)
{
    while (b->len % a)
        bb_u8(b, 0);
}

static void bb_header(bb_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}

static void bb_key(bb_t *b, const char *key, uint32_t vtype)
{
    bb_str(b, key);
    bb_u32(b, vtype);
}

/* One tensor info record as the file stores it. */
typedef struct tdesc {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t offset; /* bytes from the data section start */
} tdesc_t;

static void bb_tinfo(bb_t *b, const tdesc_t *t)
{
    bb_str(b, t->name);
    bb_u32(b, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++)
        bb_u64(b, t->ne[d]);
    bb_u32(b, t->type);
    bb_u64(b, t->offset);
}

/* A file with one string kv (or general.alignment when align is not 0), the
 * given tensor infos, padding, and data_len bytes of data 0, 1, 2... */
static void bb_simple(bb_t *b, uint32_t align, const tdesc_t *ts, size_t nt, size_t data_len)
{
    bb_header(b, 3, nt, 1);
    if (align) {
        bb_key(b, "general.alignment", GGUF_VT_UINT32);
        bb_u32(b, align);
    } else {
        bb_key(b, "general.name", GGUF_VT_STRING);
        bb_str(b, "simple");
    }
    for (size_t i = 0; i < nt; i++)
        bb_tinfo(b, &ts[i]);
    bb_align(b, align ? align : GGUF_DEFAULT_ALIGNMENT);
    for (size_t i = 0; i < data_len; i++)
        bb_u8(b, (uint8_t)i);
}

/* Opens b as NAME; the test fails if it does not parse. */
static gguf_t *open_ok(const bb_t *b)
{
    char err[512] = "";
    gguf_t *g = gguf_open_mem(b->p, b->len, NAME, err, sizeof err);
    cr_assert_not_null(g, "gguf_open_mem: %s", err);
    return g;
}

/* Opens b, expects a failure whose message names the file and contains want. */
static void open_fails(const bb_t *b, const char *want)
{
    char err[512] = "";
    gguf_t *g = gguf_open_mem(b->p, b->len, NAME, err, sizeof err);
    if (g)
        gguf_close(g);
    cr_assert_null(g, "parsed a file that should fail with '%s'", want);
    cr_assert(strncmp(err, NAME ": ", strlen(NAME) + 2) == 0,
              "message does not name the file: '%s'", err);
    cr_assert(strstr(err, want), "message '%s' does not contain '%s'", err, want);
}

/* ------------------------------------------------------------------ a file with every type */

/* Numeric array element types and three values each (stored truncated to the type). */
static const struct {
    const char *key;
    uint32_t type;
    int64_t iv[3];
    double fv[3];
} num_arrays[] = {
    {"a.u8", GGUF_VT_UINT8, {0, 7, 255}, {0}},
    {"a.i8", GGUF_VT_INT8, {-128, -1, 127}, {0}},
    {"a.u16", GGUF_VT_UINT16, {1, 300, 65535}, {0}},
    {"a.i16", GGUF_VT_INT16, {-32768, 5, 32767}, {0}},
    {"a.u32", GGUF_VT_UINT32, {0, 70000, 4294967295}, {0}},
    {"a.i32", GGUF_VT_INT32, {-2147483648ll, 0, 2147483647}, {0}},
    {"a.bool", GGUF_VT_BOOL, {1, 0, 1}, {0}},
    {"a.u64", GGUF_VT_UINT64, {0, 1ll << 40, INT64_MAX}, {0}},
    {"a.i64", GGUF_VT_INT64, {INT64_MIN, -3, INT64_MAX}, {0}},
    {"a.f32", GGUF_VT_FLOAT32, {0}, {0.5, -1.25, 1e30}},
    {"a.f64", GGUF_VT_FLOAT64, {0}, {1e-300, -2.5, 1e300}},
};
#define N_NUM_ARRAYS (sizeof num_arrays / sizeof num_arrays[0])

static const tdesc_t all_tensors[] = {
    {"tok_embd.weight", GGUF_T_F32, 2, {4, 3}, 0},               /* 48 bytes */
    {"blk.0.attn_q.weight", GGUF_T_Q8_0, 2, {64, 2}, 64},        /* 4 blocks: 136 bytes */
    {"output_norm.weight", GGUF_T_F16, 1, {8}, 256},             /* 16 bytes */
    {"blk.0.ffn_down.weight", GGUF_T_Q4_K, 3, {256, 1, 2}, 320}, /* 2 blocks: 288 bytes */
};
#define N_ALL_TENSORS (sizeof all_tensors / sizeof all_tensors[0])
static const uint64_t all_nbytes[N_ALL_TENSORS] = {48, 136, 16, 288};
/* Offsets above are multiples of 64; larger alignments scale them. */
static uint64_t all_offset(size_t i, uint32_t align)
{
    return all_tensors[i].offset * (align > 64 ? align / 64 : 1);
}

static size_t all_data_len(uint32_t align)
{
    return (size_t)all_offset(N_ALL_TENSORS - 1, align) + 288;
}
#define ALL_DATA_LEN 608

#define N_SCALAR_KV 14
#define N_ALL_KV                                                                                   \
    (N_SCALAR_KV + N_NUM_ARRAYS + 4 + 1) /* + string, nested, empty arrays, alignment */

/* Every value type, nested arrays, four tensors; align 0 = no alignment key
 * (default 32), else general.alignment = align. *hdr_len gets the bytes
 * before padding. */
static void build_all_types(bb_t *b, uint32_t version, uint32_t align, size_t *hdr_len)
{
    bb_header(b, version, N_ALL_TENSORS, N_ALL_KV - (align ? 0 : 1));
    bb_key(b, "s.u8", GGUF_VT_UINT8);
    bb_u8(b, 200);
    bb_key(b, "s.i8", GGUF_VT_INT8);
    bb_u8(b, (uint8_t)-100);
    bb_key(b, "s.u16", GGUF_VT_UINT16);
    bb_le(b, 60000, 2);
    bb_key(b, "s.i16", GGUF_VT_INT16);
    bb_le(b, (uint16_t)-30000, 2);
    bb_key(b, "s.u32", GGUF_VT_UINT32);
    bb_u32(b, 4000000000u);
    bb_key(b, "s.i32", GGUF_VT_INT32);
    bb_u32(b, (uint32_t)-2000000000);
    bb_key(b, "s.f32", GGUF_VT_FLOAT32);
    bb_f32(b, 3.25f);
    bb_key(b, "s.bool", GGUF_VT_BOOL);
    bb_u8(b, 1);
    bb_key(b, "s.false", GGUF_VT_BOOL);
    bb_u8(b, 0);
    bb_key(b, "s.str", GGUF_VT_STRING);
    bb_str(b, "hello, gguf");
    bb_key(b, "s.empty", GGUF_VT_STRING);
    bb_str(b, "");
    bb_key(b, "s.u64", GGUF_VT_UINT64);
    bb_u64(b, (1ull << 63) + 5);
    bb_key(b, "s.i64", GGUF_VT_INT64);
    bb_u64(b, (uint64_t) - (1ll << 62));
    bb_key(b, "s.f64", GGUF_VT_FLOAT64);
    bb_f64(b, -1.0e300);
    for (size_t i = 0; i < N_NUM_ARRAYS; i++) {
        bb_key(b, num_arrays[i].key, GGUF_VT_ARRAY);
        bb_u32(b, num_arrays[i].type);
        bb_u64(b, 3);
        for (int k = 0; k < 3; k++) {
            if (num_arrays[i].type == GGUF_VT_FLOAT32)
                bb_f32(b, (float)num_arrays[i].fv[k]);
            else if (num_arrays[i].type == GGUF_VT_FLOAT64)
                bb_f64(b, num_arrays[i].fv[k]);
            else
                bb_le(b, (uint64_t)num_arrays[i].iv[k], gguf_vtype_size(num_arrays[i].type));
        }
    }
    bb_key(b, "a.str", GGUF_VT_ARRAY);
    bb_u32(b, GGUF_VT_STRING);
    bb_u64(b, 3);
    bb_str(b, "a");
    bb_str(b, "");
    bb_str(b, "ccc");
    /* [["x", "yy"], [], ["zzz"]] */
    bb_key(b, "a.arr.str", GGUF_VT_ARRAY);
    bb_u32(b, GGUF_VT_ARRAY);
    bb_u64(b, 3);
    bb_u32(b, GGUF_VT_STRING);
    bb_u64(b, 2);
    bb_str(b, "x");
    bb_str(b, "yy");
    bb_u32(b, GGUF_VT_STRING);
    bb_u64(b, 0);
    bb_u32(b, GGUF_VT_STRING);
    bb_u64(b, 1);
    bb_str(b, "zzz");
    /* [[[1, 2]], [[]]] of int16 */
    bb_key(b, "a.arr.arr.i16", GGUF_VT_ARRAY);
    bb_u32(b, GGUF_VT_ARRAY);
    bb_u64(b, 2);
    bb_u32(b, GGUF_VT_ARRAY);
    bb_u64(b, 1);
    bb_u32(b, GGUF_VT_INT16);
    bb_u64(b, 2);
    bb_le(b, 1, 2);
    bb_le(b, 2, 2);
    bb_u32(b, GGUF_VT_ARRAY);
    bb_u64(b, 1);
    bb_u32(b, GGUF_VT_INT16);
    bb_u64(b, 0);
    bb_key(b, "a.empty", GGUF_VT_ARRAY);
    bb_u32(b, GGUF_VT_INT32);
    bb_u64(b, 0);
    if (align) {
        bb_key(b, "general.alignment", GGUF_VT_UINT32);
        bb_u32(b, align);
    }
    for (size_t i = 0; i < N_ALL_TENSORS; i++) {
        tdesc_t t = all_tensors[i];
        t.offset = all_offset(i, align);
        bb_tinfo(b, &t);
    }
    if (hdr_len)
        *hdr_len = b->len;
    bb_align(b, align ? align : GGUF_DEFAULT_ALIGNMENT);
    for (size_t i = 0; i < all_data_len(align); i++)
        bb_u8(b, (uint8_t)(i * 7 + 1));
}

static void check_all_types(const gguf_t *g)
{
    uint64_t u64;
    uint32_t u32;
    int64_t i64;
    float f;
    int bl;
    gguf_str_t s;

    cr_assert_eq(gguf_get_u64(g, "s.u8", &u64), 0);
    cr_assert_eq(u64, 200);
    cr_assert_eq(gguf_get_i64(g, "s.i8", &i64), 0);
    cr_assert_eq(i64, -100);
    cr_assert_eq(gguf_get_u32(g, "s.u16", &u32), 0);
    cr_assert_eq(u32, 60000);
    cr_assert_eq(gguf_get_i64(g, "s.i16", &i64), 0);
    cr_assert_eq(i64, -30000);
    cr_assert_eq(gguf_get_u32(g, "s.u32", &u32), 0);
    cr_assert_eq(u32, 4000000000u);
    cr_assert_eq(gguf_get_i64(g, "s.i32", &i64), 0);
    cr_assert_eq(i64, -2000000000);
    cr_assert_eq(gguf_get_f32(g, "s.f32", &f), 0);
    cr_assert_eq(f, 3.25f);
    cr_assert_eq(gguf_get_bool(g, "s.bool", &bl), 0);
    cr_assert_eq(bl, 1);
    cr_assert_eq(gguf_get_bool(g, "s.false", &bl), 0);
    cr_assert_eq(bl, 0);
    cr_assert_eq(gguf_get_str(g, "s.str", &s), 0);
    cr_assert_eq(s.len, 11);
    cr_assert(memcmp(s.ptr, "hello, gguf", 11) == 0);
    cr_assert_eq(gguf_get_str(g, "s.empty", &s), 0);
    cr_assert_eq(s.len, 0);
    cr_assert_eq(gguf_get_u64(g, "s.u64", &u64), 0);
    cr_assert_eq(u64, (1ull << 63) + 5);
    cr_assert_eq(gguf_get_i64(g, "s.i64", &i64), 0);
    cr_assert_eq(i64, -(1ll << 62));
    const gguf_value_t *v = gguf_get(g, "s.f64");
    cr_assert_not_null(v);
    cr_assert_eq(v->type, GGUF_VT_FLOAT64);
    cr_assert_eq(v->v.f64, -1.0e300);

    for (size_t i = 0; i < N_NUM_ARRAYS; i++) {
        const gguf_value_t *a;
        cr_assert_eq(gguf_get_arr(g, num_arrays[i].key, num_arrays[i].type, &a), 0, "%s",
                     num_arrays[i].key);
        cr_assert_eq(a->v.arr.n, 3);
        for (int k = 0; k < 3; k++) {
            if (num_arrays[i].type == GGUF_VT_FLOAT32)
                cr_assert_eq(gguf_arr_f64(a, k), (double)(float)num_arrays[i].fv[k]);
            else if (num_arrays[i].type == GGUF_VT_FLOAT64)
                cr_assert_eq(gguf_arr_f64(a, k), num_arrays[i].fv[k]);
            else
                cr_assert_eq(gguf_arr_i64(a, k), num_arrays[i].iv[k], "%s[%d]", num_arrays[i].key,
                             k);
        }
    }

    const gguf_value_t *a;
    cr_assert_eq(gguf_get_arr(g, "a.str", GGUF_VT_STRING, &a), 0);
    cr_assert_eq(a->v.arr.n, 3);
    cr_assert_eq(a->v.arr.items[0].v.str.len, 1);
    cr_assert_eq(a->v.arr.items[1].v.str.len, 0);
    cr_assert(a->v.arr.items[2].v.str.len == 3 &&
              memcmp(a->v.arr.items[2].v.str.ptr, "ccc", 3) == 0);

    cr_assert_eq(gguf_get_arr(g, "a.arr.str", GGUF_VT_ARRAY, &a), 0);
    cr_assert_eq(a->v.arr.n, 3);
    const gguf_value_t *in = a->v.arr.items;
    cr_assert(in[0].type == GGUF_VT_ARRAY && in[0].v.arr.type == GGUF_VT_STRING &&
              in[0].v.arr.n == 2);
    cr_assert(memcmp(in[0].v.arr.items[1].v.str.ptr, "yy", 2) == 0 &&
              in[0].v.arr.items[1].v.str.len == 2);
    cr_assert(in[1].type == GGUF_VT_ARRAY && in[1].v.arr.n == 0);
    cr_assert(in[2].v.arr.n == 1 && in[2].v.arr.items[0].v.str.len == 3);
    cr_assert(memcmp(in[2].v.arr.items[0].v.str.ptr, "zzz", 3) == 0);

    cr_assert_eq(gguf_get_arr(g, "a.arr.arr.i16", GGUF_VT_ARRAY, &a), 0);
    const gguf_value_t *deep = &a->v.arr.items[0].v.arr.items[0];
    cr_assert(deep->v.arr.type == GGUF_VT_INT16 && deep->v.arr.n == 2);
    cr_assert(gguf_arr_i64(deep, 0) == 1 && gguf_arr_i64(deep, 1) == 2);
    cr_assert_eq(a->v.arr.items[1].v.arr.items[0].v.arr.n, 0);

    cr_assert_eq(gguf_get_arr(g, "a.empty", GGUF_VT_COUNT, &a), 0);
    cr_assert(a->v.arr.type == GGUF_VT_INT32 && a->v.arr.n == 0);
}

static void check_all_tensors(const gguf_t *g, uint32_t align)
{
    cr_assert_eq(gguf_tensor_count(g), N_ALL_TENSORS);
    const uint8_t *base = gguf_base(g);
    for (size_t i = 0; i < N_ALL_TENSORS; i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        const tdesc_t *d = &all_tensors[i];
        uint64_t off = all_offset(i, align);
        cr_assert_str_eq(t->name, d->name);
        cr_assert_eq(t->type, d->type);
        cr_assert_eq(t->n_dims, d->n_dims);
        for (uint32_t k = 0; k < GGUF_MAX_DIMS; k++)
            cr_assert_eq(t->ne[k], k < d->n_dims ? d->ne[k] : 1, "%s ne[%u]", t->name, k);
        cr_assert_eq(t->offset, off);
        cr_assert_eq(t->nbytes, all_nbytes[i], "%s", t->name);
        cr_assert_eq((const uint8_t *)t->data, base + gguf_data_offset(g) + off);
        /* the data bytes are the pattern written at that offset */
        const uint8_t *p = t->data;
        for (uint64_t k = 0; k < t->nbytes; k++)
            cr_assert_eq(p[k], (uint8_t)((off + k) * 7 + 1));
        cr_assert_eq(gguf_find_tensor(g, d->name), t);
    }
    cr_assert_null(gguf_tensor_at(g, N_ALL_TENSORS));
    cr_assert_null(gguf_find_tensor(g, "no.such.tensor"));
}

/* ------------------------------------------------------------------ valid files */

Test(gguf, v3_file_round_trips_every_metadata_type_through_the_typed_getters)
{
    bb_t b = {0};
    build_all_types(&b, 3, 0, NULL);
    gguf_t *g = open_ok(&b);
    cr_assert_eq(gguf_version(g), 3);
    cr_assert_eq(gguf_kv_count(g), N_ALL_KV - 1);
    check_all_types(g);
    check_all_tensors(g, 32);
    cr_assert_str_eq(gguf_path(g), NAME);
    cr_assert_eq(gguf_file_size(g), b.len);
    gguf_close(g);
    free(b.p);
}

Test(gguf, v2_file_parses_the_same_as_v3)
{
    bb_t b = {0};
    build_all_types(&b, 2, 0, NULL);
    gguf_t *g = open_ok(&b);
    cr_assert_eq(gguf_version(g), 2);
    check_all_types(g);
    check_all_tensors(g, 32);
    gguf_close(g);
    free(b.p);
}

Test(gguf, kv_at_walks_the_keys_in_file_order)
{
    bb_t b = {0};
    build_all_types(&b, 3, 0, NULL);
    gguf_t *g = open_ok(&b);
    cr_assert_str_eq(gguf_kv_at(g, 0)->key, "s.u8");
    cr_assert_eq(gguf_kv_at(g, 0)->val.type, GGUF_VT_UINT8);
    cr_assert_str_eq(gguf_kv_at(g, gguf_kv_count(g) - 1)->key, "a.empty");
    cr_assert_null(gguf_kv_at(g, gguf_kv_count(g)));
    gguf_close(g);
    free(b.p);
}

Test(gguf, default_alignment_is_32_and_the_data_section_follows_the_padding)
{
    bb_t b = {0};
    size_t hdr;
    build_all_types(&b, 3, 0, &hdr);
    gguf_t *g = open_ok(&b);
    cr_assert_eq(gguf_alignment(g), 32);
    cr_assert_eq(gguf_data_offset(g), (hdr + 31) / 32 * 32);
    gguf_close(g);
    free(b.p);
}

Test(gguf, general_alignment_64_is_honoured_for_the_data_offset_and_tensors)
{
    bb_t b = {0};
    size_t hdr;
    build_all_types(&b, 3, 64, &hdr);
    gguf_t *g = open_ok(&b);
    cr_assert_eq(gguf_alignment(g), 64);
    cr_assert_eq(gguf_data_offset(g), (hdr + 63) / 64 * 64);
    cr_assert_eq(gguf_data_offset(g) % 64, 0);
    check_all_types(g);
    check_all_tensors(g, 64);
    gguf_close(g);
    free(b.p);

    /* 256: tensor offsets scaled to stay aligned */
    b = (bb_t){0};
    build_all_types(&b, 3, 256, &hdr);
    g = open_ok(&b);
    cr_assert_eq(gguf_alignment(g), 256);
    cr_assert_eq(gguf_data_offset(g), (hdr + 255) / 256 * 256);
    check_all_tensors(g, 256);
    gguf_close(g);
    free(b.p);
}

Test(gguf, files_from_the_test_writer_open_in_memory_and_through_mmap)
{
    for (uint32_t version = 2; version <= 3; version++) {
        ggufw_t *w = ggufw_new(version, 64);
        cr_assert_not_null(w);
        float f[6] = {1, 2, 3, 4, 5, 6};
        const char *toks[] = {"<s>", "</s>", "hello"};
        uint64_t ne[2] = {3, 2};
        cr_assert_eq(ggufw_kv_str(w, "general.architecture", "llama"), 0);
        cr_assert_eq(ggufw_kv_u32(w, "llama.block_count", 2), 0);
        cr_assert_eq(ggufw_kv_f32(w, "llama.rope.freq_base", 10000.0f), 0);
        cr_assert_eq(ggufw_kv_arr_str(w, "tokenizer.ggml.tokens", toks, 3), 0);
        cr_assert_eq(ggufw_tensor(w, "a", GGUF_T_F32, 2, ne, f, sizeof f), 0);
        cr_assert_eq(ggufw_tensor(w, "b", GGUF_T_F32, 1, ne, f, 12), 0);
        uint8_t *buf;
        size_t len;
        cr_assert_eq(ggufw_write_mem(w, &buf, &len), 0);

        char path[256];
        close(tu_tmpfile(path, sizeof path, "test_gguf"));
        cr_assert_eq(ggufw_write_file(w, path), 0);
        ggufw_free(w);

        char err[512] = "";
        gguf_t *gm = gguf_open_mem(buf, len, "mem", err, sizeof err);
        cr_assert_not_null(gm, "%s", err);
        gguf_t *gf = gguf_open(path, err, sizeof err);
        unlink(path);
        cr_assert_not_null(gf, "%s", err);
        cr_assert_eq(gguf_file_size(gf), len);
        cr_assert(memcmp(gguf_base(gf), buf, len) == 0, "file and memory images differ");
        cr_assert_str_eq(gguf_path(gf), path);
        const gguf_t *gs[2] = {gm, gf};
        for (int k = 0; k < 2; k++) {
            const gguf_t *g = gs[k];
            uint32_t n;
            float fb;
            gguf_str_t s;
            const gguf_value_t *arr;
            cr_assert_eq(gguf_version(g), version);
            cr_assert_eq(gguf_alignment(g), 64);
            cr_assert_eq(gguf_get_u32(g, "llama.block_count", &n), 0);
            cr_assert_eq(n, 2);
            cr_assert_eq(gguf_get_f32(g, "llama.rope.freq_base", &fb), 0);
            cr_assert_eq(fb, 10000.0f);
            cr_assert_eq(gguf_get_str(g, "general.architecture", &s), 0);
            cr_assert(s.len == 5 && memcmp(s.ptr, "llama", 5) == 0);
            cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_VT_STRING, &arr), 0);
            cr_assert_eq(arr->v.arr.n, 3);
            const gguf_tensor_t *ta = gguf_find_tensor(g, "a"), *tb = gguf_find_tensor(g, "b");
            cr_assert(ta && tb);
            cr_assert(ta->nbytes == 24 && tb->nbytes == 12 && tb->n_dims == 1 && tb->ne[0] == 3);
            cr_assert_eq(tb->offset % 64, 0);
            cr_assert(memcmp(ta->data, f, 24) == 0 && memcmp(tb->data, f, 12) == 0);
        }
        gguf_close(gm);
        gguf_close(gf);
        free(buf);
    }
}

Test(gguf, a_file_with_no_tensors_and_no_metadata_is_valid)
{
    bb_t b = {0};
    bb_header(&b, 3, 0, 0);
    gguf_t *g = open_ok(&b);
    cr_assert_eq(gguf_kv_count(g), 0);
    cr_assert_eq(gguf_tensor_count(g), 0);
    cr_assert_null(gguf_get(g, "anything"));
    gguf_close(g);
    free(b.p);
}

Test(gguf, type_traits_and_names_follow_ggml)
{
    uint32_t blck, bytes;
    cr_assert_eq(gguf_ttype_traits(GGUF_T_Q8_0, &blck, &bytes), 0);
    cr_assert(blck == 32 && bytes == 34);
    cr_assert_eq(gguf_ttype_traits(GGUF_T_Q4_K, &blck, &bytes), 0);
    cr_assert(blck == 256 && bytes == 144);
    cr_assert_eq(gguf_ttype_traits(GGUF_T_F16, &blck, &bytes), 0);
    cr_assert(blck == 1 && bytes == 2);
    cr_assert_eq(gguf_ttype_traits(4, &blck, &bytes), GGUF_ERR_TYPE); /* removed Q4_2 */
    cr_assert_eq(gguf_ttype_traits(1000, NULL, NULL), GGUF_ERR_TYPE);
    cr_assert_str_eq(gguf_ttype_name(GGUF_T_Q8_0), "Q8_0");
    cr_assert_str_eq(gguf_ttype_name(GGUF_T_BF16), "BF16");
    cr_assert_str_eq(gguf_ttype_name(99), "?");
    cr_assert_str_eq(gguf_vtype_name(GGUF_VT_STRING), "string");
    cr_assert_str_eq(gguf_vtype_name(99), "?");
    cr_assert_eq(gguf_vtype_size(GGUF_VT_FLOAT64), 8);
    cr_assert_eq(gguf_vtype_size(GGUF_VT_ARRAY), 0);
}

/* ------------------------------------------------------------------ typed getters */

Test(gguf, typed_getters_reject_wrong_types_and_out_of_range_values)
{
    bb_t b = {0};
    build_all_types(&b, 3, 0, NULL);
    gguf_t *g = open_ok(&b);
    uint64_t u64;
    uint32_t u32;
    int64_t i64;
    float f;
    int bl;
    gguf_str_t s;
    const gguf_value_t *a;
    cr_assert_eq(gguf_get_str(g, "s.u32", &s), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_u64(g, "s.str", &u64), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_u64(g, "s.i8", &u64), GGUF_ERR_TYPE);  /* negative */
    cr_assert_eq(gguf_get_u32(g, "s.u64", &u32), GGUF_ERR_TYPE); /* too big */
    cr_assert_eq(gguf_get_u32(g, "s.i64", &u32), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_i64(g, "s.u64", &i64), GGUF_ERR_TYPE); /* > INT64_MAX */
    cr_assert_eq(gguf_get_u64(g, "s.bool", &u64), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_i64(g, "s.f32", &i64), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_f32(g, "s.u32", &f), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_bool(g, "s.u8", &bl), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_str(g, "a.str", &s), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_arr(g, "s.str", GGUF_VT_COUNT, &a), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_arr(g, "a.str", GGUF_VT_INT32, &a), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_arr(g, "a.arr.str", GGUF_VT_STRING, &a), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_u64(g, "missing", &u64), GGUF_ERR_NOTFOUND);
    cr_assert_eq(gguf_get_str(g, "missing", &s), GGUF_ERR_NOTFOUND);
    cr_assert_eq(gguf_get_arr(g, "missing", GGUF_VT_COUNT, &a), GGUF_ERR_NOTFOUND);
    /* widening and sign conversions that fit succeed */
    cr_assert_eq(gguf_get_i64(g, "s.u32", &i64), 0);
    cr_assert_eq(i64, 4000000000ll);
    cr_assert_eq(gguf_get_u64(g, "s.i64", &u64), GGUF_ERR_TYPE);
    cr_assert_eq(gguf_get_f32(g, "s.f64", &f), 0);
    gguf_close(g);
    free(b.p);
}

/* ------------------------------------------------------------------ malformed files */

Test(gguf, tensor_data_past_the_end_names_the_tensor)
{
    tdesc_t ts[2] = {
        {"blk.0.attn_q.weight", GGUF_T_F32, 1, {8}, 0},
        {"blk.3.attn_q.weight", GGUF_T_F32, 2, {8, 4}, 32}, /* needs 128 bytes at 32 */
    };
    bb_t b = {0};
    bb_simple(&b, 0, ts, 2, 32 + 127);
    open_fails(&b, "tensor 'blk.3.attn_q.weight': data runs past end of file");
    b.len = 0;
    bb_simple(&b, 0, ts, 2, 32 + 128); /* exactly enough */
    gguf_close(open_ok(&b));
    free(b.p);
}

Test(gguf, tensor_offset_past_the_end_is_rejected)
{
    tdesc_t t = {"w", GGUF_T_F32, 1, {8}, 1ull << 40};
    bb_t b = {0};
    bb_simple(&b, 0, &t, 1, 64);
    open_fails(&b, "tensor 'w': data runs past end of file");
    free(b.p);
}

Test(gguf, unsupported_versions_are_rejected)
{
    uint32_t bad[] = {0, 1, 4, 0x03000000, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bb_t b = {0};
        bb_header(&b, bad[i], 0, 0);
        open_fails(&b, "unsupported GGUF version");
        free(b.p);
    }
}

Test(gguf, bad_magic_is_rejected)
{
    bb_t b = {0};
    bb_header(&b, 3, 0, 0);
    memcpy(b.p, "GGML", 4);
    open_fails(&b, "bad magic");
    b.len = 2;
    open_fails(&b, "magic");
    b.len = 0;
    open_fails(&b, "magic");
    free(b.p);
}

Test(gguf, duplicate_metadata_keys_are_rejected)
{
    bb_t b = {0};
    bb_header(&b, 3, 0, 3);
    bb_key(&b, "general.name", GGUF_VT_STRING);
    bb_str(&b, "a");
    bb_key(&b, "x", GGUF_VT_UINT8);
    bb_u8(&b, 1);
    bb_key(&b, "general.name", GGUF_VT_UINT32);
    bb_u32(&b, 2);
    open_fails(&b, "duplicate metadata key 'general.name'");
    free(b.p);
}

Test(gguf, duplicate_tensor_names_are_rejected)
{
    tdesc_t ts[3] = {
        {"a", GGUF_T_F32, 1, {8}, 0},
        {"b", GGUF_T_F32, 1, {8}, 32},
        {"a", GGUF_T_F32, 1, {8}, 64},
    };
    bb_t b = {0};
    bb_simple(&b, 0, ts, 3, 96);
    open_fails(&b, "duplicate tensor name 'a'");
    free(b.p);
}

Test(gguf, overlapping_tensors_are_rejected)
{
    tdesc_t ts[3] = {
        {"a", GGUF_T_F32, 1, {8}, 0},
        {"b", GGUF_T_F32, 1, {16}, 64}, /* 64..128 */
        {"c", GGUF_T_F32, 1, {8}, 96},  /* 96..128 */
    };
    bb_t b = {0};
    bb_simple(&b, 0, ts, 3, 160);
    open_fails(&b, "overlaps");
    /* the same offset twice */
    ts[2].offset = 0;
    b.len = 0;
    bb_simple(&b, 0, ts, 3, 160);
    open_fails(&b, "overlaps");
    /* touching is fine */
    ts[2].offset = 128;
    b.len = 0;
    bb_simple(&b, 0, ts, 3, 160);
    gguf_close(open_ok(&b));
    free(b.p);
}

Test(gguf, misaligned_tensor_offsets_are_rejected)
{
    tdesc_t t = {"w", GGUF_T_F32, 1, {8}, 16};
    bb_t b = {0};
    bb_simple(&b, 0, &t, 1, 64);
    open_fails(&b, "tensor 'w': data offset 16 is not aligned to 32");
    /* 16 is fine under general.alignment = 16 */
    b.len = 0;
    bb_simple(&b, 16, &t, 1, 64);
    gguf_close(open_ok(&b));
    /* 32 is not under 64 */
    t.offset = 32;
    b.len = 0;
    bb_simple(&b, 64, &t, 1, 128);
    open_fails(&b, "not aligned to 64");
    free(b.p);
}

Test(gguf, a_row_that_is_not_a_multiple_of_the_block_is_rejected)
{
    tdesc_t t = {"blk.0.ffn_up.weight", GGUF_T_Q8_0, 2, {33, 2}, 0};
    bb_t b = {0};
    bb_simple(&b, 0, &t, 1, 256);
    open_fails(
        &b,
        "tensor 'blk.0.ffn_up.weight': row of 33 elements is not a multiple of the Q8_0 block (32)");
    free(b.p);
}

Test(gguf, bad_alignment_values_and_types_are_rejected)
{
    uint32_t bad[] = {0, 3, 48, 1u << 21, UINT32_MAX};
    bb_t b = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b.len = 0;
        bb_header(&b, 3, 0, 1);
        bb_key(&b, "general.alignment", GGUF_VT_UINT32);
        bb_u32(&b, bad[i]);
        open_fails(&b, "is not a power of two up to 1 MiB");
    }
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "general.alignment", GGUF_VT_STRING);
    bb_str(&b, "32");
    open_fails(&b, "general.alignment has type string");
    free(b.p);
}

Test(gguf, unknown_value_and_tensor_types_are_rejected)
{
    bb_t b = {0};
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "k", 13);
    bb_u32(&b, 0);
    open_fails(&b, "key 'k': unknown value type 13");

    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "k", GGUF_VT_ARRAY);
    bb_u32(&b, 77);
    bb_u64(&b, 1);
    open_fails(&b, "key 'k': array of unknown type 77");

    tdesc_t t = {"w", 5 /* removed Q4_3 */, 1, {32}, 0};
    b.len = 0;
    bb_simple(&b, 0, &t, 1, 64);
    open_fails(&b, "tensor 'w': unknown type 5");
    free(b.p);
}

Test(gguf, bool_values_other_than_0_and_1_are_rejected)
{
    bb_t b = {0};
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "flag", GGUF_VT_BOOL);
    bb_u8(&b, 2);
    open_fails(&b, "key 'flag': bool value 2");
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "flags", GGUF_VT_ARRAY);
    bb_u32(&b, GGUF_VT_BOOL);
    bb_u64(&b, 3);
    bb_u8(&b, 1);
    bb_u8(&b, 0);
    bb_u8(&b, 0xff);
    open_fails(&b, "key 'flags': bool element 2");
    free(b.p);
}

Test(gguf, arrays_nested_too_deeply_are_rejected)
{
    bb_t b = {0};
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "deep", GGUF_VT_ARRAY);
    for (int i = 0; i < 40; i++) {
        bb_u32(&b, GGUF_VT_ARRAY);
        bb_u64(&b, 1);
    }
    bb_u32(&b, GGUF_VT_UINT8);
    bb_u64(&b, 0);
    open_fails(&b, "key 'deep': arrays nested deeper than");
    free(b.p);
}

Test(gguf, empty_keys_and_names_and_bad_dimension_counts_are_rejected)
{
    bb_t b = {0};
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "", GGUF_VT_UINT8);
    bb_u8(&b, 0);
    open_fails(&b, "metadata key 0: empty");

    tdesc_t t = {"", GGUF_T_F32, 1, {8}, 0};
    b.len = 0;
    bb_simple(&b, 0, &t, 1, 32);
    open_fails(&b, "tensor 0: name empty");

    t = (tdesc_t){"w", GGUF_T_F32, 0, {0}, 0};
    b.len = 0;
    bb_simple(&b, 0, &t, 1, 32);
    open_fails(&b, "tensor 'w': 0 dimensions");

    t = (tdesc_t){"w", GGUF_T_F32, 1, {0}, 0};
    b.len = 0;
    bb_simple(&b, 0, &t, 1, 32);
    open_fails(&b, "tensor 'w': dimension 0 is 0");

    /* five dims: the record is written by hand */
    b.len = 0;
    bb_header(&b, 3, 1, 0);
    bb_str(&b, "w");
    bb_u32(&b, 5);
    for (int i = 0; i < 5; i++)
        bb_u64(&b, 1);
    bb_u32(&b, GGUF_T_F32);
    bb_u64(&b, 0);
    bb_align(&b, 32);
    bb_u32(&b, 0);
    open_fails(&b, "tensor 'w': 5 dimensions");
    free(b.p);
}

Test(gguf, truncated_headers_report_what_was_being_read)
{
    bb_t b = {0};
    size_t hdr;
    build_all_types(&b, 3, 0, &hdr);
    size_t full = b.len;
    b.len = 20; /* inside the metadata count */
    open_fails(&b, "metadata count at offset 16 runs past end of file (20 bytes)");
    b.len = hdr - 3; /* inside the last tensor's offset */
    open_fails(&b, "blk.0.ffn_down.weight at offset");
    b.len = full - ALL_DATA_LEN; /* all infos, no data */
    open_fails(&b, "data runs past end of file");
    free(b.p);
}

/* ------------------------------------------------------------------ hostile counts */

/* Caps the address space at what the process uses now plus extra bytes, so an
 * allocation sized from a hostile count fails instead of being overcommitted.
 * Not under AddressSanitizer, whose shadow memory needs terabytes of it. */
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

static void cap_address_space(size_t extra)
{
    if (UNDER_ASAN)
        return;
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f)
        return;
    if (fscanf(f, "%lu", &pages) != 1)
        pages = 0;
    fclose(f);
    if (!pages)
        return;
    struct rlimit rl = {.rlim_cur = pages * (rlim_t)sysconf(_SC_PAGESIZE) + extra};
    struct rlimit old;
    if (getrlimit(RLIMIT_AS, &old) == 0) {
        rl.rlim_max = old.rlim_max;
        if (rl.rlim_cur < old.rlim_max)
            setrlimit(RLIMIT_AS, &rl);
    }
}

/* Hostile counts must fail on the size check, never by trying to allocate. */
static void open_fails_fast(const bb_t *b, const char *want)
{
    char err[512] = "";
    gguf_t *g = gguf_open_mem(b->p, b->len, NAME, err, sizeof err);
    if (g)
        gguf_close(g);
    cr_assert_null(g, "parsed a hostile file (want '%s')", want);
    cr_assert(strstr(err, want), "message '%s' does not contain '%s'", err, want);
    cr_assert_null(strstr(err, "out of memory"), "tried to allocate: %s", err);
}

Test(gguf, huge_metadata_and_tensor_counts_fail_fast, .timeout = 10)
{
    cap_address_space(256u << 20);
    bb_t b = {0};
    bb_header(&b, 3, 0, 1ull << 62);
    bb_key(&b, "k", GGUF_VT_UINT8);
    bb_u8(&b, 0);
    open_fails_fast(&b, "metadata count 4611686018427387904 is larger than the file allows");
    b.len = 0;
    bb_header(&b, 3, UINT64_MAX, 0);
    open_fails_fast(&b, "tensor count");
    b.len = 0;
    bb_header(&b, 3, 1ull << 62, 0);
    for (int i = 0; i < 64; i++)
        bb_u8(&b, 0);
    open_fails_fast(&b, "tensor count 4611686018427387904 is larger than the file allows");
    free(b.p);
}

Test(gguf, huge_array_counts_fail_fast, .timeout = 10)
{
    cap_address_space(256u << 20);
    const uint32_t elems[] = {GGUF_VT_UINT8, GGUF_VT_UINT64, GGUF_VT_BOOL, GGUF_VT_STRING,
                              GGUF_VT_ARRAY};
    const uint64_t counts[] = {1ull << 60, 1ull << 62, UINT64_MAX};
    for (size_t e = 0; e < sizeof elems / sizeof elems[0]; e++) {
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            bb_t b = {0};
            bb_header(&b, 3, 0, 1);
            bb_key(&b, "arr", GGUF_VT_ARRAY);
            bb_u32(&b, elems[e]);
            bb_u64(&b, counts[c]);
            for (int i = 0; i < 100; i++)
                bb_u8(&b, 0);
            open_fails_fast(&b, "key 'arr': array");
            free(b.p);
        }
    }
    /* a huge count nested inside an array of arrays */
    bb_t b = {0};
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "arr", GGUF_VT_ARRAY);
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, GGUF_VT_STRING);
    bb_u64(&b, 1ull << 60);
    open_fails_fast(&b, "larger than the file allows");
    free(b.p);
}

Test(gguf, huge_string_lengths_fail_fast, .timeout = 10)
{
    cap_address_space(256u << 20);
    const uint64_t lens[] = {1ull << 63, UINT64_MAX, 1ull << 32};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        /* as a value */
        bb_t b = {0};
        bb_header(&b, 3, 0, 1);
        bb_key(&b, "s", GGUF_VT_STRING);
        bb_u64(&b, lens[i]);
        bb_put(&b, "abc", 3);
        open_fails_fast(&b, "s at offset 45 runs past end of file");
        /* as a key */
        b.len = 0;
        bb_header(&b, 3, 0, 1);
        bb_u64(&b, lens[i]);
        bb_put(&b, "abcdefgh", 8);
        open_fails_fast(&b, "metadata key at offset 32 runs past end of file");
        /* as a tensor name */
        b.len = 0;
        bb_header(&b, 3, 1, 0);
        bb_u64(&b, lens[i]);
        for (int k = 0; k < 40; k++)
            bb_u8(&b, 'x');
        open_fails_fast(&b, "tensor name at offset 32 runs past end of file");
        /* inside an array of strings */
        b.len = 0;
        bb_header(&b, 3, 0, 1);
        bb_key(&b, "toks", GGUF_VT_ARRAY);
        bb_u32(&b, GGUF_VT_STRING);
        bb_u64(&b, 2);
        bb_str(&b, "ok");
        bb_u64(&b, lens[i]);
        bb_put(&b, "abcdefgh", 8);
        open_fails_fast(&b, "toks at offset");
        free(b.p);
    }
}

Test(gguf, tensor_dimensions_whose_product_overflows_fail_fast, .timeout = 10)
{
    cap_address_space(256u << 20);
    tdesc_t t = {"big", GGUF_T_F32, 4, {1ull << 32, 1ull << 32, 1ull << 32, 2}, 0};
    bb_t b = {0};
    bb_simple(&b, 0, &t, 1, 64);
    open_fails_fast(&b, "tensor 'big': element count overflows");
    /* a single absurd dimension */
    t = (tdesc_t){"big", GGUF_T_F32, 2, {8, 1ull << 63}, 0};
    b.len = 0;
    bb_simple(&b, 0, &t, 1, 64);
    open_fails_fast(&b, "tensor 'big': dimension 1 is 9223372036854775808");
    /* no overflow in elements, but bytes far beyond the file */
    t = (tdesc_t){"big", GGUF_T_F64, 2, {1ull << 30, 1ull << 30}, 0};
    b.len = 0;
    bb_simple(&b, 0, &t, 1, 64);
    open_fails_fast(&b, "tensor 'big': data runs past end of file");
    /* bytes overflow: 2^62 elements of 8 bytes */
    t = (tdesc_t){"big", GGUF_T_I64, 2, {1ull << 31, 1ull << 31}, 0};
    b.len = 0;
    bb_simple(&b, 0, &t, 1, 64);
    open_fails_fast(&b, "tensor 'big': byte size overflows");
    free(b.p);
}

/* ------------------------------------------------------------------ files on disk */

Test(gguf, a_missing_path_gives_an_error_with_strerror_text)
{
    char err[512] = "";
    const char *path = "/nonexistent/dir/model.gguf";
    cr_assert_null(gguf_open(path, err, sizeof err));
    cr_assert(strstr(err, path), "'%s' does not name the path", err);
    cr_assert(strstr(err, strerror(ENOENT)), "'%s' lacks '%s'", err, strerror(ENOENT));
}

Test(gguf, directories_and_empty_files_are_rejected)
{
    char err[512] = "";
    cr_assert_null(gguf_open("/tmp", err, sizeof err));
    cr_assert(strstr(err, "/tmp: not a regular file"), "%s", err);
    char path[256];
    close(tu_tmpfile(path, sizeof path, "test_gguf_empty"));
    err[0] = 0;
    gguf_t *g = gguf_open(path, err, sizeof err);
    unlink(path);
    cr_assert_null(g);
    cr_assert(strstr(err, "empty file"), "%s", err);
}

Test(gguf, a_hostile_file_on_disk_fails_with_the_path_in_the_message)
{
    tdesc_t t = {"w", GGUF_T_F32, 1, {64}, 0};
    bb_t b = {0};
    bb_simple(&b, 0, &t, 1, 100);
    char path[256];
    int fd = tu_tmpfile(path, sizeof path, "test_gguf_bad");
    cr_assert_eq(write(fd, b.p, b.len), (ssize_t)b.len);
    close(fd);
    char err[512] = "";
    gguf_t *g = gguf_open(path, err, sizeof err);
    unlink(path);
    cr_assert_null(g);
    char want[600];
    snprintf(want, sizeof want, "%s: tensor 'w': data runs past end of file", path);
    cr_assert_str_eq(err, want);
    free(b.p);
}

/* Opens tests/data/<file> (see tu_data_path for a missing file). */
static gguf_t *open_data(const char *file)
{
    char path[1024], err[512] = "";
    tu_data_path(path, sizeof path, file);
    gguf_t *g = gguf_open(path, err, sizeof err);
    cr_assert_not_null(g, "%s", err);
    return g;
}

Test(gguf, the_real_stories260K_model_opens_with_its_known_layout)
{
    gguf_t *g = open_data("stories260K.gguf");
    cr_assert_eq(gguf_version(g), 3);
    cr_assert_eq(gguf_kv_count(g), 19);
    cr_assert_eq(gguf_tensor_count(g), 48);
    cr_assert_eq(gguf_alignment(g), 32);
    cr_assert_eq(gguf_file_size(g), 1185376);
    gguf_str_t arch;
    cr_assert_eq(gguf_get_str(g, "general.architecture", &arch), 0);
    cr_assert(arch.len == 5 && memcmp(arch.ptr, "llama", 5) == 0);
    const gguf_value_t *toks;
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks), 0);
    cr_assert_eq(toks->v.arr.n, 512);
    uint64_t end = 0;
    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        cr_assert_eq(t->offset % 32, 0, "%s", t->name);
        uint64_t e = gguf_data_offset(g) + t->offset + t->nbytes;
        if (e > end)
            end = e;
    }
    cr_assert_leq(end, gguf_file_size(g));
    cr_assert_not_null(gguf_find_tensor(g, "token_embd.weight"));
    cr_assert_not_null(gguf_find_tensor(g, "blk.4.ffn_down.weight"));
    gguf_close(g);
}

Test(gguf, the_llama_vocab_only_file_opens_with_no_tensors)
{
    gguf_t *g = open_data("ggml-vocab-llama-spm.gguf");
    cr_assert_eq(gguf_tensor_count(g), 0);
    const gguf_value_t *toks;
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks), 0);
    cr_assert_eq(toks->v.arr.n, 32000);
    uint32_t bos;
    cr_assert_eq(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos), 0);
    cr_assert_eq(bos, 1);
    gguf_close(g);
}

/* fill callback of the lazy-tensor test: byte i = seed + i */
static int lazy_fill(const void *arg, uint8_t *dst, size_t nbytes)
{
    uint8_t seed = *(const uint8_t *)arg;
    for (size_t i = 0; i < nbytes; i++)
        dst[i] = (uint8_t)(seed + i);
    return 0;
}

static int lazy_fail(const void *arg, uint8_t *dst, size_t nbytes)
{
    (void)arg;
    (void)dst;
    (void)nbytes;
    return -1;
}

Test(gguf, lazy_tensors_write_the_same_bytes_as_eager_ones_in_memory_and_to_a_file)
{
    uint8_t d0[40], d1[100];
    uint8_t s0 = 3, s1 = 200;
    lazy_fill(&s0, d0, sizeof d0);
    lazy_fill(&s1, d1, sizeof d1);
    uint64_t ne0[1] = {10}, ne1[2] = {25, 1};
    ggufw_t *eager = ggufw_new(3, 0), *lazy = ggufw_new(3, 0);
    cr_assert_eq(ggufw_tensor(eager, "a", GGUF_T_F32, 1, ne0, d0, sizeof d0), 0);
    cr_assert_eq(ggufw_tensor(eager, "b", GGUF_T_F32, 2, ne1, d1, sizeof d1), 0);
    cr_assert_eq(ggufw_tensor_lazy(lazy, "a", GGUF_T_F32, 1, ne0, sizeof d0, lazy_fill, &s0, 1), 0);
    s0 = 99; /* the argument was copied */
    cr_assert_eq(ggufw_tensor_lazy(lazy, "b", GGUF_T_F32, 2, ne1, sizeof d1, lazy_fill, &s1, 1), 0);
    uint8_t *be, *bl;
    size_t le, ll;
    cr_assert_eq(ggufw_write_mem(eager, &be, &le), 0);
    cr_assert_eq(ggufw_write_mem(lazy, &bl, &ll), 0);
    cr_assert_eq(le, ll);
    cr_assert_eq(memcmp(be, bl, le), 0, "lazy tensors serialize differently in memory");
    char path[] = "/tmp/gpuswapd-test-lazy-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(ggufw_write_file(lazy, path), 0);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    uint8_t *bf = malloc(le + 1);
    size_t lf = fread(bf, 1, le + 1, f);
    fclose(f);
    unlink(path);
    cr_assert_eq(lf, le);
    cr_assert_eq(memcmp(be, bf, le), 0, "lazy tensors written to a file differ");
    /* a fill that fails fails the write */
    ggufw_t *bad = ggufw_new(3, 0);
    cr_assert_eq(ggufw_tensor_lazy(bad, "a", GGUF_T_F32, 1, ne0, sizeof d0, lazy_fail, NULL, 0), 0);
    uint8_t *bb;
    size_t lb;
    cr_assert_eq(ggufw_write_mem(bad, &bb, &lb), -1);
    free(be);
    free(bl);
    free(bf);
    ggufw_free(eager);
    ggufw_free(lazy);
    ggufw_free(bad);
}
