/* keyhash: the stored form of API keys (SHA-256, hex) and key generation. */
#include "keyhash.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <string.h>

void keyhash_digest(const char *data, size_t len, unsigned char out[32])
{
    unsigned int n = 32;
    if (!EVP_Digest(data, len, out, &n, EVP_sha256(), NULL))
        memset(out, 0, 32); /* matches no configured hash: a lookup fails closed */
}

static void hex(const unsigned char *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

void keyhash_of(const char *key, size_t len, char *out)
{
    unsigned char h[32];
    keyhash_digest(key, len, h);
    memcpy(out, "sha256:", 7);
    hex(h, 32, out + 7);
    OPENSSL_cleanse(h, sizeof h);
}

int keyhash_gen(char *key, size_t keylen, char *hash)
{
    unsigned char r[32];
    if (keylen < 4 + 64 + 1 || RAND_bytes(r, sizeof r) != 1)
        return -1;
    memcpy(key, "gsk_", 4);
    hex(r, sizeof r, key + 4);
    OPENSSL_cleanse(r, sizeof r);
    keyhash_of(key, strlen(key), hash);
    return 0;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int keyhash_parse(const char *s, unsigned char out[32])
{
    if (!s || strncmp(s, "sha256:", 7) || strlen(s) != KEYHASH_LEN)
        return -1;
    for (int i = 0; i < 32; i++) {
        int hi = hexval(s[7 + 2 * i]), lo = hexval(s[8 + 2 * i]);
        if (hi < 0 || lo < 0)
            return -1;
        if (out)
            out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}
