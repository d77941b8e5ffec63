/* gguf: a bounds-checked reader for GGUF v2/v3 model files (mmap'ed, zero copy). */
#ifndef GGUF_H
#define GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/wtype.h"

/* Metadata value types, numbered as in the file format. */
typedef enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
    GGUF_VT_COUNT
} gguf_vtype_t;

/* Tensor element types (gguf_ttype_t), their block sizes and names: kernels/wtype.h. */

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAGIC "GGUF"

/* Error codes (negative returns). */
enum {
    GGUF_OK = 0,
    GGUF_ERR_IO = -1,     /* open/stat/mmap failed */
    GGUF_ERR_FORMAT = -2, /* malformed or hostile file */
    GGUF_ERR_NOMEM = -3,
    GGUF_ERR_NOTFOUND = -4,
    GGUF_ERR_TYPE = -5, /* key exists with an incompatible type */
};

/* A string inside the mapped file: not NUL-terminated. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len; /* bytes */
} gguf_str_t;

/* A parsed metadata value. Numeric arrays point at raw little-endian
 * elements inside the mapping (possibly unaligned: use gguf_arr_*);
 * string and nested arrays carry a parsed items[] array. */
typedef struct gguf_value {
    gguf_vtype_t type;
    union {
        uint64_t u64; /* UINT8..UINT64, BOOL */
        int64_t i64;  /* INT8..INT64 */
        double f64;   /* FLOAT32, FLOAT64 */
        gguf_str_t str;
        struct {
            gguf_vtype_t type;        /* element type */
            uint64_t n;               /* element count */
            const uint8_t *data;      /* raw elements (numeric types) */
            struct gguf_value *items; /* parsed elements (STRING/ARRAY), n of them */
        } arr;
    } v;
} gguf_value_t;

typedef struct gguf_kv {
    char *key; /* NUL-terminated copy (owned by the gguf_t) */
    gguf_value_t val;
} gguf_kv_t;

typedef struct gguf_tensor {
    char *name; /* NUL-terminated copy (owned by the gguf_t) */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* elements per dim, innermost first; unused = 1 */
    gguf_ttype_t type;
    uint64_t offset;  /* bytes from the data section start */
    uint64_t nbytes;  /* bytes of tensor data */
    const void *data; /* points into the mapping */
} gguf_tensor_t;

typedef struct gguf gguf_t;

/* Open and validate a file; it stays mmap'ed read-only until gguf_close.
 * Returns NULL and writes a reason naming the file into err on failure. */
gguf_t *gguf_open(const char *path, char *err, size_t errlen);
/* Parse a caller-owned buffer (kept by pointer, not copied; must outlive the
 * gguf_t). name is used in error messages. */
gguf_t *gguf_open_mem(const void *buf, size_t size, const char *name, char *err, size_t errlen);
void gguf_close(gguf_t *g); /* accepts NULL */

uint32_t gguf_version(const gguf_t *g);
size_t gguf_alignment(const gguf_t *g);
uint64_t gguf_data_offset(const gguf_t *g);
uint64_t gguf_file_size(const gguf_t *g);
const char *gguf_path(const gguf_t *g);
const void *gguf_base(const gguf_t *g); /* start of the mapping */

size_t gguf_kv_count(const gguf_t *g);
const gguf_kv_t *gguf_kv_at(const gguf_t *g, size_t i);
const gguf_value_t *gguf_get(const gguf_t *g, const char *key); /* NULL if absent */

/* Typed getters: 0 on success, GGUF_ERR_NOTFOUND if absent, GGUF_ERR_TYPE if
 * the value has a different type or does not fit. Integers of any width and
 * signedness convert when in range; floats accept FLOAT32/FLOAT64. */
int gguf_get_u64(const gguf_t *g, const char *key, uint64_t *out);
int gguf_get_u32(const gguf_t *g, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_t *g, const char *key, int64_t *out);
int gguf_get_f32(const gguf_t *g, const char *key, float *out);
int gguf_get_bool(const gguf_t *g, const char *key, int *out);
int gguf_get_str(const gguf_t *g, const char *key, gguf_str_t *out);
/* A string value copied into buf (cap bytes, NUL-terminated): 1; 0 if absent (buf untouched);
 * GGUF_ERR_TYPE if not a string or cap - 1 bytes are too few (buf ""). */
int gguf_get_str_buf(const gguf_t *g, const char *key, char *buf, size_t cap);
/* Array of the given element type (GGUF_VT_COUNT = any). */
int gguf_get_arr(const gguf_t *g, const char *key, gguf_vtype_t elem, const gguf_value_t **out);

/* Element access for numeric arrays (bounds are the caller's: i < arr.n). */
int64_t gguf_arr_i64(const gguf_value_t *arr, uint64_t i);
double gguf_arr_f64(const gguf_value_t *arr, uint64_t i);

size_t gguf_tensor_count(const gguf_t *g);
const gguf_tensor_t *gguf_tensor_at(const gguf_t *g, size_t i);
const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name); /* NULL if absent */

const char *gguf_vtype_name(uint32_t type);

/* Element size in bytes of a scalar metadata type (0 for STRING/ARRAY). */
size_t gguf_vtype_size(uint32_t type);

#endif
