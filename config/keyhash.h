/* keyhash: the API key format the config stores and `gpuswap keygen` prints: "sha256:" + hex of SHA-256(key), and new random keys. */
#ifndef KEYHASH_H
#define KEYHASH_H

#include <stddef.h>

#define KEYHASH_LEN 71 /* "sha256:" + 64 hex digits, without the NUL */

/* SHA-256 of len bytes of data (all zero, matching no stored hash, if the digest fails). */
void keyhash_digest(const char *data, size_t len, unsigned char out[32]);
/* Writes "sha256:" + hex of SHA-256 of len bytes of key into out (KEYHASH_LEN + 1 bytes). */
void keyhash_of(const char *key, size_t len, char *out);
/* A new random key ("gsk_" + 64 hex digits, from the OS's CSPRNG) into key
 * (at least 69 bytes) and its hash into hash (KEYHASH_LEN + 1). 0 or -1. */
int keyhash_gen(char *key, size_t keylen, char *hash);
/* A stored hash s ("sha256:" + 64 lower-case hex digits) into its 32 bytes:
 * 0, or -1 when s is not one (out may be NULL: then only checks). */
int keyhash_parse(const char *s, unsigned char out[32]);

#endif
