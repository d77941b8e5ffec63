/* ggufw: an in-memory GGUF v3 writer for tests, benchmarks and mkmodel (not used by the daemon). */
#ifndef GGUFW_H
#define GGUFW_H

#include <stddef.h>
#include <stdint.h>

typedef struct ggufw ggufw_t;

/* version 2 or 3; alignment 0 = default 32 (written as general.alignment only
 * when not 32). NULL on bad arguments / no memory. */
ggufw_t *ggufw_new(uint32_t version, uint32_t alignment);
void ggufw_free(ggufw_t *w); /* accepts NULL */

/* Metadata, written in call order. 0 on success, -1 on error. */
int ggufw_kv_u32(ggufw_t *w, const char *key, uint32_t v);
int ggufw_kv_i32(ggufw_t *w, const char *key, int32_t v);
int ggufw_kv_u64(ggufw_t *w, const char *key, uint64_t v);
int ggufw_kv_f32(ggufw_t *w, const char *key, float v);
int ggufw_kv_bool(ggufw_t *w, const char *key, int v);
int ggufw_kv_str(ggufw_t *w, const char *key, const char *v);
int ggufw_kv_arr_str(ggufw_t *w, const char *key, const char *const *v, size_t n);
int ggufw_kv_arr_f32(ggufw_t *w, const char *key, const float *v, size_t n);
int ggufw_kv_arr_i32(ggufw_t *w, const char *key, const int32_t *v, size_t n);
/* Any scalar/array value given as raw bytes: vtype = GGUF value type; for
 * arrays (vtype 9) raw holds elem type (u32), count (u64) and the elements
 * exactly as in the file. Lets tests write odd and nested values. */
int ggufw_kv_raw(ggufw_t *w, const char *key, uint32_t vtype, const void *raw, size_t rawlen);

/* A tensor: data (nbytes) is copied; ne innermost first. */
int ggufw_tensor(ggufw_t *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                 const void *data, size_t nbytes);

/* Produces a lazy tensor's nbytes of data into dst; 0 on success, -1 fails
 * the write. */
typedef int (*ggufw_fill_fn)(const void *arg, uint8_t *dst, size_t nbytes);

/* A tensor whose data fill(arg, ...) produces only when the file is written,
 * one tensor at a time, so a model far larger than memory can be streamed
 * out. arg (arg_len bytes) is copied. */
int ggufw_tensor_lazy(ggufw_t *w, const char *name, uint32_t type, uint32_t n_dims,
                      const uint64_t *ne, size_t nbytes, ggufw_fill_fn fill, const void *arg,
                      size_t arg_len);

/* Serialize: *buf is malloc'ed (caller frees), *len its size. */
int ggufw_write_mem(const ggufw_t *w, uint8_t **buf, size_t *len);
int ggufw_write_file(const ggufw_t *w, const char *path);

#endif
