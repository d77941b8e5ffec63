/* fuzz: the entry points of the fuzz targets, shared by libFuzzer drivers and the regression replay test. */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Each takes one input of size bytes (not NUL-terminated) and returns 0.
 * Hostile input must be refused cleanly; a broken invariant aborts, which
 * libFuzzer reports as a crash and Criterion as a failed test. */
int fuzz_gguf(const uint8_t *data, size_t size);
int fuzz_config(const uint8_t *data, size_t size);
int fuzz_proto(const uint8_t *data, size_t size);
int fuzz_http(const uint8_t *data, size_t size);
int fuzz_tokenizer(const uint8_t *data, size_t size);

/* An invariant of the code under test: report and abort when it breaks. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
