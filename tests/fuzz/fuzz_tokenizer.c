/* fuzz_tokenizer: text through tok_encode (SPM and GPT-2 BPE vocabularies built in memory), ids through tok_piece and the streaming decoder. */
#include <string.h>

#include "fuzz.h"
#include "engine/gguf.h"
#include "ggufw.h"
#include "engine/tokenizer.h"

/*
 * Input: one flags byte, then UTF-8 (or any) text.
 *   bits 0-2  tokenizer: SPM, SPM without space prefix, BPE with
 *             pre-tokenizer gpt-2, llama-bpe, qwen2, deepseek-llm,
 *             deepseek-v3, tekken (the last three run several patterns)
 *   bit 3     add_bos          bit 4  parse_special
 *   bit 5     special (control tokens rendered by tok_piece and the stream)
 *   bits 6-7  output buffer size of the stream decoder: 1, 4, 16 or 256 bytes
 * The text is encoded; the ids are decoded back (BPE must give the text
 * back byte for byte when specials are not parsed); then the text's bytes
 * taken in pairs as little-endian ids (some out of range) go through
 * tok_piece and the stream decoder, whose output must be valid UTF-8.
 */

#define FZ_N_TOK 8
#define U2581 "\xE2\x96\x81"

static tok_t *fz_tok[FZ_N_TOK];
static const char *const fz_pre[FZ_N_TOK - 2] = {"gpt-2",        "llama-bpe",   "qwen2",
                                                 "deepseek-llm", "deepseek-v3", "tekken"};

/* ------------------------------------------------------------------ vocabularies */

typedef struct fz_vocab {
    char *text[512];
    float score[512];
    int32_t type[512];
    size_t n;
    const char *merge[64];
    size_t nmerge;
} fz_vocab_t;

static void fz_add(fz_vocab_t *v, const char *s, float score, int32_t type)
{
    FUZZ_CHECK(v->n < 512, "vocab full");
    v->text[v->n] = strdup(s);
    v->score[v->n] = score;
    v->type[v->n] = type;
    v->n++;
}

static void fz_spm_vocab(fz_vocab_t *v)
{
    static const struct {
        const char *text;
        float score;
    } pieces[] = {
        {U2581, -1},
        {"h", -1},
        {"e", -1},
        {"l", -1},
        {"o", -1},
        {"w", -1},
        {"r", -1},
        {"d", -1},
        {"ll", -2},
        {U2581 "h", -3},
        {U2581 "he", -4},
        {"llo", -5},
        {U2581 "hello", -6},
        {U2581 "w", -3},
        {"or", -3},
        {"ld", -3},
        {U2581 "world", -7},
        {"\xC3\xA9", -2},
        {"\xE4\xB8\xAD", -2},
        {"\xE6\x96\x87", -2},
        {"\xE4\xB8\xAD\xE6\x96\x87", -3},
        {"12", -2},
        {U2581 U2581, -2},
        {"\n", -1},
    };
    fz_add(v, "<unk>", 0, TOK_TYPE_UNKNOWN);
    fz_add(v, "<s>", 0, TOK_TYPE_CONTROL);
    fz_add(v, "</s>", 0, TOK_TYPE_CONTROL);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        fz_add(v, s, 0, TOK_TYPE_BYTE);
    }
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        fz_add(v, pieces[i].text, pieces[i].score, TOK_TYPE_NORMAL);
    fz_add(v, "<tool>", 0, TOK_TYPE_USER_DEFINED);
    fz_add(v, "<|im_start|>", 0, TOK_TYPE_CONTROL);
    fz_add(v, "<|im_end|>", 0, TOK_TYPE_CONTROL);
    fz_add(v, "<unused0>", 0, TOK_TYPE_UNUSED);
}

/* GPT-2 bytes_to_unicode() of b as UTF-8 into out[4]. */
static void fz_b2u(unsigned b, char out[4])
{
    unsigned cp, n = 0;
#define PRINTABLE(c)                                                                               \
    (((c) >= '!' && (c) <= '~') || ((c) >= 0xA1 && (c) <= 0xAC) || ((c) >= 0xAE && (c) <= 0xFF))
    if (PRINTABLE(b)) {
        cp = b;
    } else {
        for (unsigned c = 0; c < b; c++)
            n += !PRINTABLE(c);
        cp = 256 + n;
    }
#undef PRINTABLE
    memset(out, 0, 4);
    if (cp < 0x80) {
        out[0] = (char)cp;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
    }
}

#define G_SP "\xC4\xA0" /* byte-level ' ' */
#define G_NL "\xC4\x8A" /* byte-level '\n' */

static void fz_bpe_vocab(fz_vocab_t *v)
{
    static const char *const merges[] = {
        "h e",
        "l l",
        "he ll",
        "hell o",
        G_SP " w",
        "o r",
        G_SP "w or",
        "l d",
        G_SP "wor ld",
        "' t",
        "' s",
        G_SP " " G_SP,
        G_NL " " G_NL,
        "\xC3\x83 \xC2\xA9",
        "1 2",
        "12 3",
        "\xC3\xA4 \xC2\xB8",
        "\xC3\xA4\xC2\xB8 \xC2\xAD",
        G_SP " h",
        G_SP "h ello",
        "e llo",
        "a a",
        "aa aa",
    };
    for (unsigned b = 0; b < 256; b++) { /* id == byte value */
        char s[4];
        fz_b2u(b, s);
        fz_add(v, s, 0, TOK_TYPE_NORMAL);
    }
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        char s[64];
        const char *sp = strchr(merges[i], ' ');
        snprintf(s, sizeof s, "%.*s%s", (int)(sp - merges[i]), merges[i], sp + 1);
        fz_add(v, s, 0, TOK_TYPE_NORMAL);
        v->merge[v->nmerge++] = merges[i];
    }
    fz_add(v, "<|endoftext|>", 0, TOK_TYPE_CONTROL);
    fz_add(v, "<|im_start|>", 0, TOK_TYPE_CONTROL);
    fz_add(v, "<|im_end|>", 0, TOK_TYPE_CONTROL);
    fz_add(v, "<tool>", 0, TOK_TYPE_USER_DEFINED);
    fz_add(v, "<unused0>", 0, TOK_TYPE_UNUSED);
}

/* Writes a tokenizer-only GGUF in memory and opens it. */
static tok_t *fz_open(int which)
{
    fz_vocab_t *v = calloc(1, sizeof *v);
    FUZZ_CHECK(v, "calloc");
    int spm = which < 2;
    if (spm)
        fz_spm_vocab(v);
    else
        fz_bpe_vocab(v);
    ggufw_t *w = ggufw_new(3, 0);
    FUZZ_CHECK(w, "ggufw_new");
    ggufw_kv_str(w, "general.architecture", "llama");
    ggufw_kv_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (!spm)
        ggufw_kv_str(w, "tokenizer.ggml.pre", fz_pre[which - 2]);
    ggufw_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->text, v->n);
    ggufw_kv_arr_f32(w, "tokenizer.ggml.scores", v->score, v->n);
    ggufw_kv_arr_i32(w, "tokenizer.ggml.token_type", v->type, v->n);
    if (!spm)
        ggufw_kv_arr_str(w, "tokenizer.ggml.merges", v->merge, v->nmerge);
    ggufw_kv_u32(w, "tokenizer.ggml.bos_token_id", spm ? 1 : (uint32_t)v->n - 5);
    ggufw_kv_u32(w, "tokenizer.ggml.eos_token_id", spm ? 2 : (uint32_t)v->n - 5);
    if (spm)
        ggufw_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (which == 1)
        ggufw_kv_bool(w, "tokenizer.ggml.add_space_prefix", 0);
    uint8_t *buf = NULL;
    size_t len = 0;
    FUZZ_CHECK(ggufw_write_mem(w, &buf, &len) == 0, "ggufw_write_mem");
    ggufw_free(w);
    char err[256] = "";
    gguf_t *g = gguf_open_mem(buf, len, "fuzz-vocab", err, sizeof err);
    FUZZ_CHECK(g, "gguf_open_mem: %s", err);
    tok_t *t = tok_open(g, err, sizeof err);
    FUZZ_CHECK(t, "tok_open(%d): %s", which, err);
    gguf_close(g);
    free(buf);
    for (size_t i = 0; i < v->n; i++)
        free(v->text[i]);
    free(v);
    return t;
}

/* ------------------------------------------------------------------ checks */

/* Strict UTF-8 (no overlongs, surrogates or values past U+10FFFF), no NUL. */
static int fz_utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c == 0)
            return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else
            return 0;
        for (size_t k = 1; k <= need; k++) {
            if (i + k >= n)
                return 0;
            unsigned d = s[i + k];
            if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF))
                return 0;
        }
        i += need + 1;
    }
    return 1;
}

/* tok_piece of id into a growing buffer: appends to *out (len *n, cap *cap). */
static void fz_piece_append(const tok_t *t, int32_t id, int special, char **out, size_t *n,
                            size_t *cap)
{
    int k = tok_piece(t, id, special, NULL, 0);
    FUZZ_CHECK(k >= 0, "piece length of id %d: %d", id, k);
    if (*n + (size_t)k + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *n + (size_t)k + 1)
            c *= 2;
        *out = realloc(*out, c);
        FUZZ_CHECK(*out, "realloc");
        *cap = c;
    }
    int k2 = tok_piece(t, id, special, *out + *n, *cap - *n);
    FUZZ_CHECK(k2 == k, "piece of id %d: %d then %d", id, k, k2);
    *n += (size_t)k;
}

static void fz_encode(const tok_t *t, int which, const char *text, size_t len, int add_bos,
                      int parse_special)
{
    size_t cap = len + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    FUZZ_CHECK(ids, "malloc");
    int n = tok_encode(t, text, len, add_bos, parse_special, ids, cap);
    FUZZ_CHECK(n >= 0, "tok_encode: %d", n);
    if ((size_t)n > cap) {
        cap = (size_t)n;
        ids = realloc(ids, cap * sizeof *ids);
        FUZZ_CHECK(ids, "realloc");
        FUZZ_CHECK(tok_encode(t, text, len, add_bos, parse_special, ids, cap) == n, "retry count");
    }
    /* a short buffer gives the same count and the same first ids */
    int32_t head[2];
    FUZZ_CHECK(tok_encode(t, text, len, add_bos, parse_special, head, 2) == n, "count with cap 2");
    for (int i = 0; i < n && i < 2; i++)
        FUZZ_CHECK(head[i] == ids[i], "id %d differs with cap 2", i);
    int32_t nv = tok_vocab_size(t);
    for (int i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv, "id %d out of range", ids[i]);
    if (add_bos && tok_bos(t) >= 0)
        FUZZ_CHECK(n >= 1 && ids[0] == tok_bos(t), "no BOS first");

    /* byte-level BPE without specials loses nothing */
    if (which >= 2 && !parse_special) {
        char *dec = NULL;
        size_t dn = 0, dcap = 0;
        for (int i = add_bos && tok_bos(t) >= 0; i < n; i++)
            fz_piece_append(t, ids[i], 0, &dec, &dn, &dcap);
        FUZZ_CHECK(dn == len && (len == 0 || memcmp(dec, text, len) == 0),
                   "BPE round trip: %zu bytes in, %zu out", len, dn);
        free(dec);
    }
    free(ids);
}

static void fz_stream(const tok_t *t, const uint8_t *p, size_t len, int special, size_t ocap)
{
    tok_stream_t s;
    tok_stream_init(&s, t, special);
    char *all = NULL;
    size_t an = 0, acap = 0;
    char *out = malloc(ocap);
    char big[1024];
    FUZZ_CHECK(out, "malloc");
    int32_t nv = tok_vocab_size(t);
    for (size_t i = 0; i + 1 < len; i += 2) {
        int32_t id = (int32_t)(p[i] | (p[i + 1] << 8)) - 8; /* a few negative, some past nv */
        if (id >= nv + 8)
            id %= nv + 8;
        int k = tok_piece(t, id, special, big, sizeof big);
        if (id < 0 || id >= nv) {
            FUZZ_CHECK(k < 0, "piece of bad id %d: %d", id, k);
            FUZZ_CHECK(tok_stream_feed(&s, id, big, sizeof big) < 0, "feed of bad id %d", id);
            continue;
        }
        FUZZ_CHECK(k >= 0, "piece of id %d: %d", id, k);
        tok_stream_t before = s;
        int r = tok_stream_feed(&s, id, out, ocap);
        const char *got = out;
        if (r == TOK_ERR_RANGE) {
            FUZZ_CHECK(before.npending == s.npending &&
                           memcmp(before.pending, s.pending, sizeof s.pending) == 0,
                       "stream changed on TOK_ERR_RANGE");
            r = tok_stream_feed(&s, id, big, sizeof big);
            got = big;
        }
        FUZZ_CHECK(r >= 0, "feed of id %d: %d", id, r);
        FUZZ_CHECK(strlen(got) == (size_t)r, "feed returned %d for %zu bytes", r, strlen(got));
        FUZZ_CHECK(s.npending < sizeof s.pending, "pending %zu", s.npending);
        if (an + (size_t)r + 1 > acap) {
            acap = (an + (size_t)r + 1) * 2;
            all = realloc(all, acap);
            FUZZ_CHECK(all, "realloc");
        }
        memcpy(all + an, got, (size_t)r);
        an += (size_t)r;
    }
    int r = tok_stream_flush(&s, big, sizeof big);
    FUZZ_CHECK(r >= 0 && s.npending == 0, "flush: %d", r);
    FUZZ_CHECK(an == 0 || fz_utf8_ok((const unsigned char *)all, an),
               "stream output is not valid UTF-8");
    FUZZ_CHECK(fz_utf8_ok((const unsigned char *)big, (size_t)r),
               "flush output is not valid UTF-8");
    free(all);
    free(out);
}

int fuzz_tokenizer(const uint8_t *data, size_t size)
{
    if (!fz_tok[0])
        for (int i = 0; i < FZ_N_TOK; i++)
            fz_tok[i] = fz_open(i);
    if (size == 0)
        return 0;
    unsigned flags = data[0];
    int which = (int)(flags & 7) % FZ_N_TOK;
    const tok_t *t = fz_tok[which];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    static const size_t ocaps[4] = {1, 4, 16, 256};

    fz_encode(t, which, text, len, (flags >> 3) & 1, (flags >> 4) & 1);
    fz_stream(t, data + 1, len, (flags >> 5) & 1, ocaps[flags >> 6]);
    int32_t id = tok_find(t, "<|im_end|>");
    FUZZ_CHECK(id >= 0 && tok_is_eog(t, id), "<|im_end|> is end of generation");
    return 0;
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_tokenizer(data, size);
}
#endif
