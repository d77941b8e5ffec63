/* gguf: a bounds-checked reader for GGUF v2/v3 model files (mmap'ed, zero copy). */
#include "engine/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Nesting depth of arrays of arrays we accept (hostile files could recurse). */
#define GGUF_MAX_NEST 8
/* Longest key / tensor name we accept. */
#define GGUF_MAX_NAME 65535

struct gguf {
    char *path;          /* owned copy, for messages */
    const uint8_t *base; /* mapping or caller buffer */
    uint64_t size;       /* bytes */
    int mapped;          /* base is our mmap */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    size_t n_kv;
    gguf_kv_t *kv;
    size_t n_tensors;
    gguf_tensor_t *tensors;
};

/* ------------------------------------------------------------------ traits */

_Static_assert(GGUF_ERR_TYPE == WTYPE_ERR_UNKNOWN, "gguf_ttype_traits answers GGUF_ERR_TYPE");

static const char *const vtype_names[GGUF_VT_COUNT] = {
    "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
    "bool",  "string", "array",  "uint64", "int64",  "float64",
};

const char *gguf_vtype_name(uint32_t type)
{
    return type < GGUF_VT_COUNT ? vtype_names[type] : "?";
}

size_t gguf_vtype_size(uint32_t type)
{
    switch (type) {
    case GGUF_VT_UINT8:
    case GGUF_VT_INT8:
    case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16:
    case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32:
    case GGUF_VT_INT32:
    case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64:
    case GGUF_VT_INT64:
    case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

/* ------------------------------------------------------------------ cursor */

typedef struct cursor {
    const uint8_t *p;
    uint64_t off, size;
    gguf_t *g;
    char *err;
    size_t errlen;
    int failed;
} cursor_t;

static void cfail(cursor_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cfail(cursor_t *c, const char *fmt, ...)
{
    if (c->failed)
        return;
    c->failed = 1;
    if (!c->err || !c->errlen)
        return;
    int n = snprintf(c->err, c->errlen, "%s: ", c->g->path);
    if (n < 0 || (size_t)n >= c->errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

static int cneed(cursor_t *c, uint64_t n, const char *what)
{
    if (c->failed)
        return -1;
    if (n > c->size - c->off) {
        cfail(c, "%s at offset %llu runs past end of file (%llu bytes)", what,
              (unsigned long long)c->off, (unsigned long long)c->size);
        return -1;
    }
    return 0;
}

static int crd(cursor_t *c, void *dst, size_t n, const char *what)
{
    if (cneed(c, n, what))
        return -1;
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return 0;
}

static int crd_u32(cursor_t *c, uint32_t *v, const char *what)
{
    return crd(c, v, 4, what);
}
static int crd_u64(cursor_t *c, uint64_t *v, const char *what)
{
    return crd(c, v, 8, what);
}

static int crd_str(cursor_t *c, gguf_str_t *s, const char *what)
{
    uint64_t len;
    if (crd_u64(c, &len, what))
        return -1;
    if (cneed(c, len, what))
        return -1;
    s->ptr = (const char *)c->p + c->off;
    s->len = len;
    c->off += len;
    return 0;
}

static char *str_dup(const gguf_str_t *s)
{
    char *r = malloc(s->len + 1);
    if (!r)
        return NULL;
    memcpy(r, s->ptr, s->len);
    r[s->len] = 0;
    return r;
}

/* ------------------------------------------------------------------ values */

static void value_free(gguf_value_t *v)
{
    if (v->type != GGUF_VT_ARRAY || !v->v.arr.items)
        return;
    for (uint64_t i = 0; i < v->v.arr.n; i++)
        value_free(&v->v.arr.items[i]);
    free(v->v.arr.items);
    v->v.arr.items = NULL;
}

/* A fixed-size value of type (sz bytes of the file). */
static int read_scalar(cursor_t *c, gguf_value_t *v, uint32_t type, size_t sz, const char *key)
{
    uint8_t raw[8] = {0};
    if (crd(c, raw, sz, key))
        return -1;
    switch (type) {
    case GGUF_VT_UINT8: v->v.u64 = raw[0]; break;
    case GGUF_VT_BOOL:
        if (raw[0] > 1) {
            cfail(c, "key '%s': bool value %u is not 0 or 1", key, raw[0]);
            return -1;
        }
        v->v.u64 = raw[0];
        break;
    case GGUF_VT_INT8: v->v.i64 = (int8_t)raw[0]; break;
    case GGUF_VT_UINT16: {
        uint16_t x;
        memcpy(&x, raw, 2);
        v->v.u64 = x;
        break;
    }
    case GGUF_VT_INT16: {
        int16_t x;
        memcpy(&x, raw, 2);
        v->v.i64 = x;
        break;
    }
    case GGUF_VT_UINT32: {
        uint32_t x;
        memcpy(&x, raw, 4);
        v->v.u64 = x;
        break;
    }
    case GGUF_VT_INT32: {
        int32_t x;
        memcpy(&x, raw, 4);
        v->v.i64 = x;
        break;
    }
    case GGUF_VT_FLOAT32: {
        float x;
        memcpy(&x, raw, 4);
        v->v.f64 = x;
        break;
    }
    case GGUF_VT_UINT64: {
        uint64_t x;
        memcpy(&x, raw, 8);
        v->v.u64 = x;
        break;
    }
    case GGUF_VT_INT64: {
        int64_t x;
        memcpy(&x, raw, 8);
        v->v.i64 = x;
        break;
    }
    case GGUF_VT_FLOAT64: {
        double x;
        memcpy(&x, raw, 8);
        v->v.f64 = x;
        break;
    }
    }
    return 0;
}

/* n elements of fixed-size type et (esz bytes each), used in place in the file. */
static int read_array_fixed(cursor_t *c, gguf_value_t *v, uint32_t et, size_t esz, uint64_t n,
                            const char *key)
{
    /* n * esz must fit in what is left of the file */
    if (n > (c->size - c->off) / esz) {
        cfail(c, "key '%s': array of %llu %s elements runs past end of file", key,
              (unsigned long long)n, gguf_vtype_name(et));
        return -1;
    }
    v->v.arr.n = n;
    v->v.arr.data = c->p + c->off;
    if (et == GGUF_VT_BOOL) {
        for (uint64_t i = 0; i < n; i++) {
            if (v->v.arr.data[i] > 1) {
                cfail(c, "key '%s': bool element %llu is not 0 or 1", key, (unsigned long long)i);
                return -1;
            }
        }
    }
    c->off += n * esz;
    return 0;
}

static int read_value(cursor_t *c, gguf_value_t *v, uint32_t type, int depth, const char *key);

/* An array (its element type and count, then the elements) at nesting depth. */
static int read_array(cursor_t *c, gguf_value_t *v, int depth, const char *key)
{
    if (depth >= GGUF_MAX_NEST) {
        cfail(c, "key '%s': arrays nested deeper than %d", key, GGUF_MAX_NEST);
        return -1;
    }
    uint32_t et;
    uint64_t n;
    if (crd_u32(c, &et, key) || crd_u64(c, &n, key))
        return -1;
    if (et >= GGUF_VT_COUNT) {
        cfail(c, "key '%s': array of unknown type %u", key, et);
        return -1;
    }
    v->v.arr.type = (gguf_vtype_t)et;
    size_t esz = gguf_vtype_size(et);
    if (esz)
        return read_array_fixed(c, v, et, esz, n, key);
    /* strings need >= 8 bytes each, arrays >= 12: bound n before allocating */
    uint64_t min_elem = et == GGUF_VT_STRING ? 8 : 12;
    if (n > (c->size - c->off) / min_elem) {
        cfail(c, "key '%s': array count %llu is larger than the file allows", key,
              (unsigned long long)n);
        return -1;
    }
    v->v.arr.items = calloc(n ? n : 1, sizeof(gguf_value_t));
    if (!v->v.arr.items) {
        cfail(c, "key '%s': out of memory for %llu elements", key, (unsigned long long)n);
        return -1;
    }
    v->v.arr.n = n;
    for (uint64_t i = 0; i < n; i++) {
        if (read_value(c, &v->v.arr.items[i], et, depth + 1, key)) {
            /* items after i are zeroed (calloc): value_free handles them */
            return -1;
        }
    }
    return 0;
}

static int read_value(cursor_t *c, gguf_value_t *v, uint32_t type, int depth, const char *key)
{
    memset(v, 0, sizeof *v);
    if (type >= GGUF_VT_COUNT) {
        cfail(c, "key '%s': unknown value type %u", key, type);
        return -1;
    }
    v->type = (gguf_vtype_t)type;
    size_t sz = gguf_vtype_size(type);
    if (sz)
        return read_scalar(c, v, type, sz, key);
    if (type == GGUF_VT_STRING)
        return crd_str(c, &v->v.str, key);
    return read_array(c, v, depth, key);
}

/* ------------------------------------------------------------------ parsing */

static int cmp_tensor_off(const void *a, const void *b)
{
    const gguf_tensor_t *x = *(const gguf_tensor_t *const *)a;
    const gguf_tensor_t *y = *(const gguf_tensor_t *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const gguf_tensor_t *x = *(const gguf_tensor_t *const *)a;
    const gguf_tensor_t *y = *(const gguf_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_kv_key(const void *a, const void *b)
{
    const gguf_kv_t *x = *(const gguf_kv_t *const *)a;
    const gguf_kv_t *y = *(const gguf_kv_t *const *)b;
    return strcmp(x->key, y->key);
}

/* The magic, the version and the two counts. */
static int parse_header(cursor_t *c, gguf_t *g, uint64_t *nt, uint64_t *nkv)
{
    char magic[4];
    if (crd(c, magic, 4, "magic"))
        return -1;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0) {
        cfail(c, "not a GGUF file (bad magic)");
        return -1;
    }
    if (crd_u32(c, &g->version, "version"))
        return -1;
    if (g->version != 2 && g->version != 3) {
        cfail(c, "unsupported GGUF version %u (2 and 3 are supported)", g->version);
        return -1;
    }
    if (crd_u64(c, nt, "tensor count") || crd_u64(c, nkv, "metadata count"))
        return -1;
    return 0;
}

/* The nkv metadata keys and values, into g->kv (g->n_kv counts those to free). */
static int parse_kvs(cursor_t *c, gguf_t *g, uint64_t nkv)
{
    /* each kv needs >= 8 (key len) + 4 (type) + 1 bytes; each tensor info >= 8+4+8+4+8 */
    if (nkv > (c->size - c->off) / 13) {
        cfail(c, "metadata count %llu is larger than the file allows", (unsigned long long)nkv);
        return -1;
    }
    g->kv = calloc(nkv ? nkv : 1, sizeof(gguf_kv_t));
    if (!g->kv) {
        cfail(c, "out of memory");
        return -1;
    }
    for (uint64_t i = 0; i < nkv; i++) {
        gguf_kv_t *kv = &g->kv[i];
        gguf_str_t key;
        uint32_t type;
        if (crd_str(c, &key, "metadata key"))
            return -1;
        if (key.len == 0 || key.len > GGUF_MAX_NAME || memchr(key.ptr, 0, key.len)) {
            cfail(c, "metadata key %llu: empty, too long or contains NUL", (unsigned long long)i);
            return -1;
        }
        kv->key = str_dup(&key);
        g->n_kv = i + 1;
        if (!kv->key) {
            cfail(c, "out of memory");
            return -1;
        }
        if (crd_u32(c, &type, kv->key))
            return -1;
        if (read_value(c, &kv->val, type, 0, kv->key))
            return -1;
    }
    return 0;
}

/* Refuses a metadata key given twice. */
static int check_dup_keys(cursor_t *c, gguf_t *g)
{
    if (g->n_kv <= 1)
        return 0;
    const gguf_kv_t **s = malloc(g->n_kv * sizeof *s);
    if (!s) {
        cfail(c, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < g->n_kv; i++)
        s[i] = &g->kv[i];
    qsort(s, g->n_kv, sizeof *s, cmp_kv_key);
    for (size_t i = 1; i < g->n_kv; i++) {
        if (strcmp(s[i - 1]->key, s[i]->key) == 0) {
            cfail(c, "duplicate metadata key '%s'", s[i]->key);
            free(s);
            return -1;
        }
    }
    free(s);
    return 0;
}

/* general.alignment, when given, into g->alignment. */
static int parse_alignment(cursor_t *c, gguf_t *g)
{
    const gguf_value_t *al = gguf_get(g, "general.alignment");
    if (!al)
        return 0;
    if (al->type != GGUF_VT_UINT32 && al->type != GGUF_VT_UINT64 && al->type != GGUF_VT_INT32) {
        cfail(c, "general.alignment has type %s, expected uint32", gguf_vtype_name(al->type));
        return -1;
    }
    uint64_t a = al->type == GGUF_VT_INT32 ? (uint64_t)al->v.i64 : al->v.u64;
    if (a == 0 || (a & (a - 1)) || a > (1u << 20)) {
        cfail(c, "general.alignment %llu is not a power of two up to 1 MiB", (unsigned long long)a);
        return -1;
    }
    g->alignment = a;
    return 0;
}

/* Tensor t's dimensions (t->n_dims of them); *nel = their product. */
static int parse_dims(cursor_t *c, gguf_tensor_t *t, uint64_t *nel)
{
    if (crd_u32(c, &t->n_dims, t->name))
        return -1;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
        cfail(c, "tensor '%s': %u dimensions (1..%d allowed)", t->name, t->n_dims, GGUF_MAX_DIMS);
        return -1;
    }
    *nel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (crd_u64(c, &t->ne[d], t->name))
            return -1;
        if (t->ne[d] == 0 || t->ne[d] > (1ull << 40)) {
            cfail(c, "tensor '%s': dimension %u is %llu", t->name, d, (unsigned long long)t->ne[d]);
            return -1;
        }
        if (*nel > UINT64_MAX / t->ne[d]) {
            cfail(c, "tensor '%s': element count overflows", t->name);
            return -1;
        }
        *nel *= t->ne[d];
    }
    return 0;
}

/* Tensor i's info: name, dimensions, type and data offset, its byte size worked out. */
static int parse_tensor_info(cursor_t *c, gguf_t *g, uint64_t i)
{
    gguf_tensor_t *t = &g->tensors[i];
    gguf_str_t name;
    if (crd_str(c, &name, "tensor name"))
        return -1;
    if (name.len == 0 || name.len > GGUF_MAX_NAME || memchr(name.ptr, 0, name.len)) {
        cfail(c, "tensor %llu: name empty, too long or contains NUL", (unsigned long long)i);
        return -1;
    }
    t->name = str_dup(&name);
    g->n_tensors = i + 1;
    if (!t->name) {
        cfail(c, "out of memory");
        return -1;
    }
    uint64_t nel;
    if (parse_dims(c, t, &nel))
        return -1;
    uint32_t type, blck, bytes;
    if (crd_u32(c, &type, t->name) || crd_u64(c, &t->offset, t->name))
        return -1;
    if (gguf_ttype_traits(type, &blck, &bytes)) {
        cfail(c, "tensor '%s': unknown type %u", t->name, type);
        return -1;
    }
    t->type = (gguf_ttype_t)type;
    if (t->ne[0] % blck) {
        cfail(c, "tensor '%s': row of %llu elements is not a multiple of the %s block (%u)",
              t->name, (unsigned long long)t->ne[0], gguf_ttype_name(type), blck);
        return -1;
    }
    /* nel / blck * bytes: nel < 2^64 so the division is safe; check the product */
    uint64_t nblk = nel / blck;
    if (nblk > UINT64_MAX / bytes) {
        cfail(c, "tensor '%s': byte size overflows", t->name);
        return -1;
    }
    t->nbytes = nblk * bytes;
    if (t->offset % g->alignment) {
        cfail(c, "tensor '%s': data offset %llu is not aligned to %llu", t->name,
              (unsigned long long)t->offset, (unsigned long long)g->alignment);
        return -1;
    }
    return 0;
}

/* The data section after the infos: each tensor's data inside the file. */
static int parse_data(cursor_t *c, gguf_t *g, uint64_t nt)
{
    /* data section starts at the next aligned offset */
    uint64_t off = c->off;
    uint64_t pad = (g->alignment - off % g->alignment) % g->alignment;
    if (off + pad > c->size && nt > 0) {
        cfail(c, "data section starts past end of file");
        return -1;
    }
    g->data_offset = off + pad;
    uint64_t data_size = c->size >= g->data_offset ? c->size - g->data_offset : 0;
    for (size_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            cfail(c, "tensor '%s': data runs past end of file", t->name);
            return -1;
        }
        t->data = g->base + g->data_offset + t->offset;
    }
    return 0;
}

/* Refuses a tensor name given twice and tensors whose data overlap. */
static int check_tensor_layout(cursor_t *c, gguf_t *g)
{
    if (g->n_tensors <= 1)
        return 0;
    const gguf_tensor_t **s = malloc(g->n_tensors * sizeof *s);
    if (!s) {
        cfail(c, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < g->n_tensors; i++)
        s[i] = &g->tensors[i];
    qsort(s, g->n_tensors, sizeof *s, cmp_tensor_name);
    for (size_t i = 1; i < g->n_tensors; i++) {
        if (strcmp(s[i - 1]->name, s[i]->name) == 0) {
            cfail(c, "duplicate tensor name '%s'", s[i]->name);
            free(s);
            return -1;
        }
    }
    qsort(s, g->n_tensors, sizeof *s, cmp_tensor_off);
    for (size_t i = 1; i < g->n_tensors; i++) {
        if (s[i - 1]->offset + s[i - 1]->nbytes > s[i]->offset) {
            cfail(c, "tensor '%s' overlaps tensor '%s'", s[i]->name, s[i - 1]->name);
            free(s);
            return -1;
        }
    }
    free(s);
    return 0;
}

static int parse(gguf_t *g, char *err, size_t errlen)
{
    cursor_t c = {.p = g->base, .off = 0, .size = g->size, .g = g, .err = err, .errlen = errlen};
    uint64_t nt, nkv;
    if (parse_header(&c, g, &nt, &nkv))
        return -1;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (parse_kvs(&c, g, nkv) || check_dup_keys(&c, g) || parse_alignment(&c, g))
        return -1;
    if (nt > (c.size - c.off) / 32) {
        cfail(&c, "tensor count %llu is larger than the file allows", (unsigned long long)nt);
        return -1;
    }
    g->tensors = calloc(nt ? nt : 1, sizeof(gguf_tensor_t));
    if (!g->tensors) {
        cfail(&c, "out of memory");
        return -1;
    }
    for (uint64_t i = 0; i < nt; i++)
        if (parse_tensor_info(&c, g, i))
            return -1;
    return parse_data(&c, g, nt) || check_tensor_layout(&c, g) ? -1 : 0;
}

/* ------------------------------------------------------------------ open/close */

static gguf_t *gguf_alloc(const char *name)
{
    gguf_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->path = strdup(name ? name : "(memory)");
    if (!g->path) {
        free(g);
        return NULL;
    }
    return g;
}

gguf_t *gguf_open_mem(const void *buf, size_t size, const char *name, char *err, size_t errlen)
{
    gguf_t *g = gguf_alloc(name);
    if (!g) {
        snprintf(err, errlen, "%s: out of memory", name ? name : "(memory)");
        return NULL;
    }
    g->base = buf;
    g->size = size;
    if (parse(g, err, errlen)) {
        gguf_close(g);
        return NULL;
    }
    return g;
}

gguf_t *gguf_open(const char *path, char *err, size_t errlen)
{
    gguf_t *g = gguf_alloc(path);
    if (!g) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        goto fail;
    }
    g->size = (uint64_t)st.st_size;
    if (g->size == 0) {
        snprintf(err, errlen, "%s: empty file", path);
        close(fd);
        goto fail;
    }
    void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    g->base = m;
    g->mapped = 1;
    if (parse(g, err, errlen))
        goto fail;
    return g;
fail:
    gguf_close(g);
    return NULL;
}

void gguf_close(gguf_t *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        value_free(&g->kv[i].val);
    }
    free(g->kv);
    for (size_t i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->tensors);
    if (g->mapped && g->base)
        munmap((void *)g->base, g->size);
    free(g->path);
    free(g);
}

/* ------------------------------------------------------------------ accessors */

uint32_t gguf_version(const gguf_t *g)
{
    return g->version;
}
size_t gguf_alignment(const gguf_t *g)
{
    return (size_t)g->alignment;
}
uint64_t gguf_data_offset(const gguf_t *g)
{
    return g->data_offset;
}
uint64_t gguf_file_size(const gguf_t *g)
{
    return g->size;
}
const char *gguf_path(const gguf_t *g)
{
    return g->path;
}
const void *gguf_base(const gguf_t *g)
{
    return g->base;
}
size_t gguf_kv_count(const gguf_t *g)
{
    return g->n_kv;
}
size_t gguf_tensor_count(const gguf_t *g)
{
    return g->n_tensors;
}

const gguf_kv_t *gguf_kv_at(const gguf_t *g, size_t i)
{
    return i < g->n_kv ? &g->kv[i] : NULL;
}

const gguf_tensor_t *gguf_tensor_at(const gguf_t *g, size_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const gguf_value_t *gguf_get(const gguf_t *g, const char *key)
{
    for (size_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0)
            return &g->kv[i].val;
    return NULL;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name)
{
    for (size_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

static int is_unsigned(gguf_vtype_t t)
{
    return t == GGUF_VT_UINT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_UINT32 ||
           t == GGUF_VT_UINT64 || t == GGUF_VT_BOOL;
}

static int is_signed(gguf_vtype_t t)
{
    return t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
}

int gguf_get_u64(const gguf_t *g, const char *key, uint64_t *out)
{
    const gguf_value_t *v = gguf_get(g, key);
    if (!v)
        return GGUF_ERR_NOTFOUND;
    if (is_unsigned(v->type) && v->type != GGUF_VT_BOOL) {
        *out = v->v.u64;
        return 0;
    }
    if (is_signed(v->type) && v->v.i64 >= 0) {
        *out = (uint64_t)v->v.i64;
        return 0;
    }
    return GGUF_ERR_TYPE;
}

int gguf_get_u32(const gguf_t *g, const char *key, uint32_t *out)
{
    uint64_t x;
    int rc = gguf_get_u64(g, key, &x);
    if (rc)
        return rc;
    if (x > UINT32_MAX)
        return GGUF_ERR_TYPE;
    *out = (uint32_t)x;
    return 0;
}

int gguf_get_i64(const gguf_t *g, const char *key, int64_t *out)
{
    const gguf_value_t *v = gguf_get(g, key);
    if (!v)
        return GGUF_ERR_NOTFOUND;
    if (is_signed(v->type)) {
        *out = v->v.i64;
        return 0;
    }
    if (is_unsigned(v->type) && v->type != GGUF_VT_BOOL && v->v.u64 <= INT64_MAX) {
        *out = (int64_t)v->v.u64;
        return 0;
    }
    return GGUF_ERR_TYPE;
}

int gguf_get_f32(const gguf_t *g, const char *key, float *out)
{
    const gguf_value_t *v = gguf_get(g, key);
    if (!v)
        return GGUF_ERR_NOTFOUND;
    if (v->type != GGUF_VT_FLOAT32 && v->type != GGUF_VT_FLOAT64)
        return GGUF_ERR_TYPE;
    *out = (float)v->v.f64;
    return 0;
}

int gguf_get_bool(const gguf_t *g, const char *key, int *out)
{
    const gguf_value_t *v = gguf_get(g, key);
    if (!v)
        return GGUF_ERR_NOTFOUND;
    if (v->type != GGUF_VT_BOOL)
        return GGUF_ERR_TYPE;
    *out = (int)v->v.u64;
    return 0;
}

int gguf_get_str(const gguf_t *g, const char *key, gguf_str_t *out)
{
    const gguf_value_t *v = gguf_get(g, key);
    if (!v)
        return GGUF_ERR_NOTFOUND;
    if (v->type != GGUF_VT_STRING)
        return GGUF_ERR_TYPE;
    *out = v->v.str;
    return 0;
}

int gguf_get_str_buf(const gguf_t *g, const char *key, char *buf, size_t cap)
{
    gguf_str_t v;
    if (!gguf_get(g, key))
        return 0;
    if (gguf_get_str(g, key, &v) || v.len >= cap) {
        if (cap)
            buf[0] = 0;
        return GGUF_ERR_TYPE;
    }
    memcpy(buf, v.ptr, v.len);
    buf[v.len] = 0;
    return 1;
}

int gguf_get_arr(const gguf_t *g, const char *key, gguf_vtype_t elem, const gguf_value_t **out)
{
    const gguf_value_t *v = gguf_get(g, key);
    if (!v)
        return GGUF_ERR_NOTFOUND;
    if (v->type != GGUF_VT_ARRAY || (elem != GGUF_VT_COUNT && v->v.arr.type != elem))
        return GGUF_ERR_TYPE;
    *out = v;
    return 0;
}

/* Saturating conversion: NaN and out-of-range values never reach a cast. */
static int64_t f64_to_i64(double x)
{
    if (!(x > -9.2e18 && x < 9.2e18))
        return 0;
    return (int64_t)x;
}

int64_t gguf_arr_i64(const gguf_value_t *a, uint64_t i)
{
    const uint8_t *p = a->v.arr.data + i * gguf_vtype_size(a->v.arr.type);
    switch (a->v.arr.type) {
    case GGUF_VT_UINT8:
    case GGUF_VT_BOOL: return p[0];
    case GGUF_VT_INT8: return (int8_t)p[0];
    case GGUF_VT_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        return x;
    }
    case GGUF_VT_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        return x;
    }
    case GGUF_VT_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    case GGUF_VT_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    case GGUF_VT_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        return (int64_t)x;
    }
    case GGUF_VT_INT64: {
        int64_t x;
        memcpy(&x, p, 8);
        return x;
    }
    case GGUF_VT_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        return f64_to_i64(x);
    }
    case GGUF_VT_FLOAT64: {
        double x;
        memcpy(&x, p, 8);
        return f64_to_i64(x);
    }
    default: return 0;
    }
}

double gguf_arr_f64(const gguf_value_t *a, uint64_t i)
{
    const uint8_t *p = a->v.arr.data + i * gguf_vtype_size(a->v.arr.type);
    switch (a->v.arr.type) {
    case GGUF_VT_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    case GGUF_VT_FLOAT64: {
        double x;
        memcpy(&x, p, 8);
        return x;
    }
    case GGUF_VT_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        return (double)x;
    }
    default: return (double)gguf_arr_i64(a, i);
    }
}
