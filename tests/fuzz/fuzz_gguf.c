/* fuzz_gguf: GGUF bytes through gguf_open_mem, every kv and tensor accessor, tok_open and model_from_gguf. */
#include <string.h>

#include "fuzz.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

#define FZ_MAX_ELEMS 4096 /* array elements read per value: the rest cost time, not coverage */

static volatile uint64_t fz_sink; /* keeps the reads below from being optimised away */

static void fz_touch(const void *p, uint64_t n)
{
    const uint8_t *b = p;
    if (n)
        fz_sink += (uint64_t)b[0] + b[n - 1] + b[n / 2];
}

static void fz_value(const gguf_value_t *v, int depth)
{
    FUZZ_CHECK(depth < 64, "nesting %d", depth);
    FUZZ_CHECK(v->type < GGUF_VT_COUNT, "value type %u", (unsigned)v->type);
    (void)gguf_vtype_name(v->type);
    switch (v->type) {
    case GGUF_VT_STRING: fz_touch(v->v.str.ptr, v->v.str.len); break;
    case GGUF_VT_ARRAY: {
        uint64_t n = v->v.arr.n;
        FUZZ_CHECK(v->v.arr.type < GGUF_VT_COUNT, "element type %u", (unsigned)v->v.arr.type);
        if (v->v.arr.type == GGUF_VT_STRING || v->v.arr.type == GGUF_VT_ARRAY) {
            FUZZ_CHECK(n == 0 || v->v.arr.items, "no items for %llu elements",
                       (unsigned long long)n);
            for (uint64_t i = 0; i < n && i < FZ_MAX_ELEMS; i++)
                fz_value(&v->v.arr.items[i], depth + 1);
        } else if (n) {
            size_t es = gguf_vtype_size(v->v.arr.type);
            FUZZ_CHECK(es > 0, "element size 0");
            fz_touch(v->v.arr.data, n * es);
            for (uint64_t i = 0; i < n && i < FZ_MAX_ELEMS; i++)
                fz_sink += (uint64_t)gguf_arr_i64(v, i) + (uint64_t)(gguf_arr_f64(v, i) != 0);
        }
        break;
    }
    default: fz_sink += v->v.u64; break;
    }
}

static void fz_walk(const gguf_t *g, const uint8_t *data, size_t size)
{
    FUZZ_CHECK(gguf_base(g) == data, "base moved");
    FUZZ_CHECK(gguf_file_size(g) == size, "size %llu", (unsigned long long)gguf_file_size(g));
    /* without tensors the (empty) data section may start past the end */
    FUZZ_CHECK(gguf_data_offset(g) <= size || gguf_tensor_count(g) == 0,
               "data offset past the end");
    size_t al = gguf_alignment(g);
    FUZZ_CHECK(al > 0 && gguf_data_offset(g) % al == 0, "alignment %zu", al);
    fz_sink += gguf_version(g) + strlen(gguf_path(g));

    for (size_t i = 0; i < gguf_kv_count(g); i++) {
        const gguf_kv_t *kv = gguf_kv_at(g, i);
        FUZZ_CHECK(kv && kv->key, "kv %zu", i);
        fz_value(&kv->val, 0);
        FUZZ_CHECK(gguf_get(g, kv->key) != NULL, "key '%s' not found again", kv->key);
        uint64_t u64;
        uint32_t u32;
        int64_t i64;
        float f;
        int b;
        gguf_str_t s;
        const gguf_value_t *arr;
        fz_sink += (uint64_t)gguf_get_u64(g, kv->key, &u64) +
                   (uint64_t)gguf_get_u32(g, kv->key, &u32) +
                   (uint64_t)gguf_get_i64(g, kv->key, &i64) +
                   (uint64_t)gguf_get_f32(g, kv->key, &f) + (uint64_t)gguf_get_bool(g, kv->key, &b);
        if (gguf_get_str(g, kv->key, &s) == 0)
            fz_touch(s.ptr, s.len);
        if (gguf_get_arr(g, kv->key, GGUF_VT_COUNT, &arr) == 0)
            FUZZ_CHECK(arr->type == GGUF_VT_ARRAY, "array getter gave type %u",
                       (unsigned)arr->type);
        for (uint32_t t = 0; t < GGUF_VT_COUNT; t++)
            fz_sink += (uint64_t)gguf_get_arr(g, kv->key, (gguf_vtype_t)t, &arr);
    }
    FUZZ_CHECK(gguf_kv_at(g, gguf_kv_count(g)) == NULL, "kv past the end");

    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        FUZZ_CHECK(t && t->name, "tensor %zu", i);
        FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS, "n_dims %u", t->n_dims);
        uint32_t blck, bytes;
        FUZZ_CHECK(gguf_ttype_traits(t->type, &blck, &bytes) == 0, "tensor type %u",
                   (unsigned)t->type);
        FUZZ_CHECK(strcmp(gguf_ttype_name(t->type), "?") != 0, "type name");
        const uint8_t *d = t->data;
        FUZZ_CHECK(t->nbytes == 0 || (d >= data && (uint64_t)(d - data) <= size &&
                                      t->nbytes <= size - (uint64_t)(d - data)),
                   "tensor '%s' data outside the buffer", t->name);
        fz_touch(t->data, t->nbytes);
        for (uint32_t k = 0; k < GGUF_MAX_DIMS; k++)
            fz_sink += t->ne[k];
        FUZZ_CHECK(gguf_find_tensor(g, t->name) != NULL, "tensor '%s' not found again", t->name);
    }
    FUZZ_CHECK(gguf_tensor_at(g, gguf_tensor_count(g)) == NULL, "tensor past the end");
    FUZZ_CHECK(gguf_find_tensor(g, "") == NULL || gguf_tensor_count(g) > 0, "phantom tensor");
}

/* A tokenizer that opened must answer for every id and encode some text. */
static void fz_tokenizer(const gguf_t *g)
{
    char err[256];
    tok_t *t = tok_open(g, err, sizeof err);
    if (!t)
        return;
    int32_t n = tok_vocab_size(t);
    FUZZ_CHECK(n > 0, "vocab size %d", n);
    char buf[64];
    for (int32_t id = 0; id < n && id < FZ_MAX_ELEMS; id++) {
        int k = tok_piece(t, id, id & 1, buf, sizeof buf);
        FUZZ_CHECK(k >= 0, "piece %d: %d", id, k);
        fz_sink +=
            (uint64_t)tok_type(t, id) + (uint64_t)tok_is_eog(t, id) + strlen(tok_text(t, id));
    }
    FUZZ_CHECK(tok_piece(t, n, 0, buf, sizeof buf) < 0, "piece past the vocabulary");
    static const char text[] =
        "Hello world! <s> 12345 \xC3\xA9t\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\n\t \xFF";
    int32_t ids[256];
    for (int special = 0; special < 2; special++) {
        int k = tok_encode(t, text, sizeof text - 1, 1, special, ids, 256);
        FUZZ_CHECK(k >= 0 && k <= 256, "encode: %d", k);
        tok_stream_t s;
        tok_stream_init(&s, t, special);
        for (int i = 0; i < k; i++) {
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < n, "encode gave id %d of %d", ids[i], n);
            (void)tok_stream_feed(&s, ids[i], buf, sizeof buf); /* a long piece: TOK_ERR_RANGE */
        }
        (void)tok_stream_flush(&s, buf, sizeof buf);
    }
    tok_close(t);
}

int fuzz_gguf(const uint8_t *data, size_t size)
{
    char err[256];
    gguf_t *g = gguf_open_mem(data, size, "fuzz.gguf", err, sizeof err);
    if (!g) {
        FUZZ_CHECK(strncmp(err, "fuzz.gguf", 9) == 0, "error does not name the file: %s", err);
        return 0;
    }
    fz_walk(g, data, size);
    fz_tokenizer(g);
    model_t *m = model_from_gguf(g, err, sizeof err); /* owns g from here, also on failure */
    if (m) {
        FUZZ_CHECK(m->tok && m->hp.n_layer > 0 && m->w.layers, "model without layers or tokenizer");
        fz_sink += m->n_params + m->weight_bytes;
    }
    model_close(m);
    return 0;
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_gguf(data, size);
}
#endif
