/* ggufw: builds GGUF v2/v3 files in memory for tests, benchmarks and mkmodel. */
#include "ggufw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"

/* ---------------------------------------------------------------- types */

/* A growable byte buffer. */
typedef struct ggufw_buf {
    uint8_t *p;
    size_t len; /* bytes used */
    size_t cap; /* bytes allocated */
} ggufw_buf_t;

typedef struct ggufw_tensor {
    char *name;    /* owned copy */
    uint32_t type; /* gguf_ttype_t */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* elements per dim, innermost first */
    uint8_t *data;              /* owned copy, nbytes (NULL for a lazy tensor) */
    size_t nbytes;
    ggufw_fill_fn fill; /* lazy tensor: produces the data at write time */
    void *arg;          /* owned copy of fill's argument */
} ggufw_tensor_t;

struct ggufw {
    uint32_t version;
    uint32_t alignment; /* bytes */
    ggufw_buf_t kv;     /* serialized kvs, in call order */
    uint64_t n_kv;
    ggufw_tensor_t *tensors;
    size_t n_tensors;
    size_t cap_tensors;
};

/* ---------------------------------------------------------------- buffer */

static int ggufw_buf_reserve(ggufw_buf_t *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len)
        return -1;
    size_t need = b->len + extra;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int ggufw_buf_put(ggufw_buf_t *b, const void *src, size_t n)
{
    if (ggufw_buf_reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static int ggufw_buf_zero(ggufw_buf_t *b, size_t n)
{
    if (ggufw_buf_reserve(b, n) < 0)
        return -1;
    memset(b->p + b->len, 0, n);
    b->len += n;
    return 0;
}

/* Little-endian scalar writers (the file format is little-endian). */
static int ggufw_buf_u32(ggufw_buf_t *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    return ggufw_buf_put(b, x, sizeof x);
}

static int ggufw_buf_u64(ggufw_buf_t *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    return ggufw_buf_put(b, x, sizeof x);
}

static int ggufw_buf_str(ggufw_buf_t *b, const char *s, size_t n)
{
    if (ggufw_buf_u64(b, (uint64_t)n) < 0)
        return -1;
    return ggufw_buf_put(b, s, n);
}

static uint32_t ggufw_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---------------------------------------------------------------- lifecycle */

ggufw_t *ggufw_new(uint32_t version, uint32_t alignment)
{
    if (version != 2 && version != 3)
        return NULL;
    if (alignment == 0)
        alignment = GGUF_DEFAULT_ALIGNMENT;
    if ((alignment & (alignment - 1)) != 0)
        return NULL; /* must be a power of two */
    ggufw_t *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->version = version;
    w->alignment = alignment;
    return w;
}

void ggufw_free(ggufw_t *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
        free(w->tensors[i].arg);
    }
    free(w->tensors);
    free(w->kv.p);
    free(w);
}

/* ---------------------------------------------------------------- metadata */

/* Appends key + value type; on failure the kv buffer is rolled back. */
static int ggufw_kv_begin(ggufw_t *w, const char *key, uint32_t vtype, size_t *mark)
{
    if (!w || !key)
        return -1;
    *mark = w->kv.len;
    if (ggufw_buf_str(&w->kv, key, strlen(key)) < 0 || ggufw_buf_u32(&w->kv, vtype) < 0) {
        w->kv.len = *mark;
        return -1;
    }
    return 0;
}

static int ggufw_kv_end(ggufw_t *w, size_t mark, int rc)
{
    if (rc < 0) {
        w->kv.len = mark;
        return -1;
    }
    w->n_kv++;
    return 0;
}

int ggufw_kv_u32(ggufw_t *w, const char *key, uint32_t v)
{
    size_t mark;
    if (ggufw_kv_begin(w, key, GGUF_VT_UINT32, &mark) < 0)
        return -1;
    return ggufw_kv_end(w, mark, ggufw_buf_u32(&w->kv, v));
}

int ggufw_kv_i32(ggufw_t *w, const char *key, int32_t v)
{
    size_t mark;
    if (ggufw_kv_begin(w, key, GGUF_VT_INT32, &mark) < 0)
        return -1;
    return ggufw_kv_end(w, mark, ggufw_buf_u32(&w->kv, (uint32_t)v));
}

int ggufw_kv_u64(ggufw_t *w, const char *key, uint64_t v)
{
    size_t mark;
    if (ggufw_kv_begin(w, key, GGUF_VT_UINT64, &mark) < 0)
        return -1;
    return ggufw_kv_end(w, mark, ggufw_buf_u64(&w->kv, v));
}

int ggufw_kv_f32(ggufw_t *w, const char *key, float v)
{
    size_t mark;
    if (ggufw_kv_begin(w, key, GGUF_VT_FLOAT32, &mark) < 0)
        return -1;
    return ggufw_kv_end(w, mark, ggufw_buf_u32(&w->kv, ggufw_f32_bits(v)));
}

int ggufw_kv_bool(ggufw_t *w, const char *key, int v)
{
    size_t mark;
    if (ggufw_kv_begin(w, key, GGUF_VT_BOOL, &mark) < 0)
        return -1;
    uint8_t b = v ? 1 : 0;
    return ggufw_kv_end(w, mark, ggufw_buf_put(&w->kv, &b, 1));
}

int ggufw_kv_str(ggufw_t *w, const char *key, const char *v)
{
    if (!v)
        return -1;
    size_t mark;
    if (ggufw_kv_begin(w, key, GGUF_VT_STRING, &mark) < 0)
        return -1;
    return ggufw_kv_end(w, mark, ggufw_buf_str(&w->kv, v, strlen(v)));
}

int ggufw_kv_arr_str(ggufw_t *w, const char *key, const char *const *v, size_t n)
{
    if (n && !v)
        return -1;
    size_t mark;
    if (ggufw_kv_begin(w, key, GGUF_VT_ARRAY, &mark) < 0)
        return -1;
    int rc = ggufw_buf_u32(&w->kv, GGUF_VT_STRING);
    if (rc == 0)
        rc = ggufw_buf_u64(&w->kv, (uint64_t)n);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = v[i] ? ggufw_buf_str(&w->kv, v[i], strlen(v[i])) : -1;
    return ggufw_kv_end(w, mark, rc);
}

/* An array of 4-byte elements (f32 or i32) copied bit for bit, little-endian. */
static int kv_arr4(ggufw_t *w, const char *key, uint32_t elem, const void *v, size_t n)
{
    if (n && !v)
        return -1;
    size_t mark;
    if (ggufw_kv_begin(w, key, GGUF_VT_ARRAY, &mark) < 0)
        return -1;
    int rc = ggufw_buf_u32(&w->kv, elem);
    if (rc == 0)
        rc = ggufw_buf_u64(&w->kv, (uint64_t)n);
    if (rc == 0 && n > SIZE_MAX / 4)
        rc = -1;
    if (rc == 0)
        rc = ggufw_buf_reserve(&w->kv, n * 4);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint32_t bits;
        memcpy(&bits, (const uint8_t *)v + 4 * i, 4);
        rc = ggufw_buf_u32(&w->kv, bits);
    }
    return ggufw_kv_end(w, mark, rc);
}

int ggufw_kv_arr_f32(ggufw_t *w, const char *key, const float *v, size_t n)
{
    return kv_arr4(w, key, GGUF_VT_FLOAT32, v, n);
}

int ggufw_kv_arr_i32(ggufw_t *w, const char *key, const int32_t *v, size_t n)
{
    return kv_arr4(w, key, GGUF_VT_INT32, v, n);
}

int ggufw_kv_raw(ggufw_t *w, const char *key, uint32_t vtype, const void *raw, size_t rawlen)
{
    if (rawlen && !raw)
        return -1;
    size_t mark;
    if (ggufw_kv_begin(w, key, vtype, &mark) < 0)
        return -1;
    return ggufw_kv_end(w, mark, ggufw_buf_put(&w->kv, raw, rawlen));
}

/* ---------------------------------------------------------------- tensors */

/* Appends a tensor entry with name and shape; *out points at it. */
static int ggufw_tensor_add(ggufw_t *w, const char *name, uint32_t type, uint32_t n_dims,
                            const uint64_t *ne, size_t nbytes, ggufw_tensor_t **out)
{
    if (!w || !name || n_dims > GGUF_MAX_DIMS || (n_dims && !ne))
        return -1;
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 16;
        ggufw_tensor_t *t = realloc(w->tensors, cap * sizeof *t);
        if (!t)
            return -1;
        w->tensors = t;
        w->cap_tensors = cap;
    }
    ggufw_tensor_t *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name)
        return -1;
    t->nbytes = nbytes;
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t i = 0; i < GGUF_MAX_DIMS; i++)
        t->ne[i] = i < n_dims ? ne[i] : 1;
    *out = t;
    return 0;
}

int ggufw_tensor(ggufw_t *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                 const void *data, size_t nbytes)
{
    ggufw_tensor_t *t;
    if ((nbytes && !data) || ggufw_tensor_add(w, name, type, n_dims, ne, nbytes, &t) < 0)
        return -1;
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->data) {
        free(t->name);
        return -1;
    }
    if (nbytes)
        memcpy(t->data, data, nbytes);
    w->n_tensors++;
    return 0;
}

int ggufw_tensor_lazy(ggufw_t *w, const char *name, uint32_t type, uint32_t n_dims,
                      const uint64_t *ne, size_t nbytes, ggufw_fill_fn fill, const void *arg,
                      size_t arg_len)
{
    ggufw_tensor_t *t;
    if (!fill || (arg_len && !arg) || ggufw_tensor_add(w, name, type, n_dims, ne, nbytes, &t) < 0)
        return -1;
    t->fill = fill;
    t->arg = malloc(arg_len ? arg_len : 1);
    if (!t->arg) {
        free(t->name);
        return -1;
    }
    if (arg_len)
        memcpy(t->arg, arg, arg_len);
    w->n_tensors++;
    return 0;
}

/* ---------------------------------------------------------------- output */

static size_t ggufw_pad(size_t off, size_t align)
{
    return (align - off % align) % align;
}

/* Serializes everything before the data section (header, kvs, tensor infos,
 * padding) into b, which the caller frees; *data_len gets the data section's
 * size in bytes. */
static int ggufw_write_header(const ggufw_t *w, ggufw_buf_t *b, size_t *data_len)
{
    int extra_align = w->alignment != GGUF_DEFAULT_ALIGNMENT;
    int rc = ggufw_buf_put(b, GGUF_MAGIC, 4);
    if (rc == 0)
        rc = ggufw_buf_u32(b, w->version);
    if (rc == 0)
        rc = ggufw_buf_u64(b, (uint64_t)w->n_tensors);
    if (rc == 0)
        rc = ggufw_buf_u64(b, w->n_kv + (uint64_t)extra_align);
    if (rc == 0 && extra_align) {
        static const char key[] = "general.alignment";
        rc = ggufw_buf_str(b, key, sizeof key - 1);
        if (rc == 0)
            rc = ggufw_buf_u32(b, GGUF_VT_UINT32);
        if (rc == 0)
            rc = ggufw_buf_u32(b, w->alignment);
    }
    if (rc == 0)
        rc = ggufw_buf_put(b, w->kv.p, w->kv.len);

    /* Tensor infos; offsets relative to the data section, each aligned. */
    size_t off = 0;
    for (size_t i = 0; rc == 0 && i < w->n_tensors; i++) {
        const ggufw_tensor_t *t = &w->tensors[i];
        rc = ggufw_buf_str(b, t->name, strlen(t->name));
        if (rc == 0)
            rc = ggufw_buf_u32(b, t->n_dims);
        for (uint32_t d = 0; rc == 0 && d < t->n_dims; d++)
            rc = ggufw_buf_u64(b, t->ne[d]);
        if (rc == 0)
            rc = ggufw_buf_u32(b, t->type);
        if (rc == 0)
            rc = ggufw_buf_u64(b, (uint64_t)off);
        off += t->nbytes;
        off += ggufw_pad(off, w->alignment);
    }
    if (rc == 0)
        rc = ggufw_buf_zero(b, ggufw_pad(b->len, w->alignment));
    *data_len = off;
    return rc;
}

int ggufw_write_mem(const ggufw_t *w, uint8_t **buf, size_t *len)
{
    if (!w || !buf || !len)
        return -1;
    ggufw_buf_t b = {0};
    size_t data_len = 0;
    int rc = ggufw_write_header(w, &b, &data_len);
    if (rc == 0)
        rc = ggufw_buf_reserve(&b, data_len);
    for (size_t i = 0; rc == 0 && i < w->n_tensors; i++) {
        const ggufw_tensor_t *t = &w->tensors[i];
        if (t->fill) {
            rc = ggufw_buf_reserve(&b, t->nbytes);
            if (rc == 0)
                rc = t->fill(t->arg, b.p + b.len, t->nbytes);
            if (rc == 0)
                b.len += t->nbytes;
        } else {
            rc = ggufw_buf_put(&b, t->data, t->nbytes);
        }
        if (rc == 0)
            rc = ggufw_buf_zero(&b, ggufw_pad(t->nbytes, w->alignment));
    }
    if (rc < 0) {
        free(b.p);
        return -1;
    }
    *buf = b.p;
    *len = b.len;
    return 0;
}

/* Streams tensor data straight from the tensors (no second in-memory copy). */
int ggufw_write_file(const ggufw_t *w, const char *path)
{
    if (!w || !path)
        return -1;
    static const uint8_t zeros[256];
    ggufw_buf_t b = {0};
    size_t data_len = 0;
    if (ggufw_write_header(w, &b, &data_len) < 0) {
        free(b.p);
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(b.p);
        return -1;
    }
    int rc = fwrite(b.p, 1, b.len, f) == b.len ? 0 : -1;
    free(b.p);
    uint8_t *lazy = NULL; /* one buffer for the lazy tensors, as big as the largest */
    size_t lazy_cap = 0;
    for (size_t i = 0; rc == 0 && i < w->n_tensors; i++) {
        const ggufw_tensor_t *t = &w->tensors[i];
        const uint8_t *data = t->data;
        if (t->fill) {
            if (t->nbytes > lazy_cap) {
                free(lazy);
                lazy_cap = t->nbytes;
                lazy = malloc(lazy_cap);
                if (!lazy) {
                    lazy_cap = 0;
                    rc = -1;
                    break;
                }
            }
            if (t->nbytes && t->fill(t->arg, lazy, t->nbytes) < 0) {
                rc = -1;
                break;
            }
            data = lazy;
        }
        if (t->nbytes && fwrite(data, 1, t->nbytes, f) != t->nbytes)
            rc = -1;
        size_t pad = ggufw_pad(t->nbytes, w->alignment);
        while (rc == 0 && pad > 0) {
            size_t n = pad < sizeof zeros ? pad : sizeof zeros;
            if (fwrite(zeros, 1, n, f) != n)
                rc = -1;
            pad -= n;
        }
    }
    free(lazy);
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}
