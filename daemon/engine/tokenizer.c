/* tokenizer: text <-> token ids from GGUF tokenizer.* metadata, following llama.cpp's SPM and GPT-2 BPE tokenizers. */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "engine/tokenizer.h"

#include <limits.h>
#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_MAX_TEXT 65536u      /* longest accepted token / merge text, bytes */
#define TOK_MAX_INPUT (1u << 28) /* longest accepted tok_encode input, bytes */
#define TOK_NONE (-1)

/* ------------------------------------------------------------------ errors */

static void tok_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void tok_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ hash map */

/* Open addressing with linear probing; keys point into a pool owned by the
 * tok_t, so the map never copies or frees them. Load factor <= 1/2. */
typedef struct tok_slot {
    const char *key; /* NULL = empty slot */
    uint32_t len;    /* key bytes */
    uint32_t hash;
    int32_t val; /* token id or merge rank */
} tok_slot_t;

typedef struct tok_map {
    tok_slot_t *slots; /* (mask + 1) */
    size_t mask;
} tok_map_t;

static uint32_t tok_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a, then a murmur3 finalizer */

    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

static int tok_map_init(tok_map_t *m, size_t n)
{
    size_t cap = 16;

    if (n > SIZE_MAX / 4 / sizeof(tok_slot_t))
        return -1;
    while (cap < n * 2)
        cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots)
        return -1;
    m->mask = cap - 1;
    return 0;
}

static void tok_map_free(tok_map_t *m)
{
    free(m->slots);
    m->slots = NULL;
}

static tok_slot_t *tok_map_slot(const tok_map_t *m, const char *s, size_t n, uint32_t h)
{
    size_t i = h & m->mask;

    for (;;) {
        tok_slot_t *sl = &m->slots[i];
        if (!sl->key || (sl->hash == h && sl->len == n && memcmp(sl->key, s, n) == 0))
            return sl;
        i = (i + 1) & m->mask;
    }
}

/* Insert key -> val; an existing key keeps its value unless overwrite is set.
 * The map was sized for all inserts at init, so this cannot fail. */
static void tok_map_put(tok_map_t *m, const char *s, size_t n, int32_t val, int overwrite)
{
    uint32_t h = tok_hash(s, n);
    tok_slot_t *sl = tok_map_slot(m, s, n, h);

    if (sl->key && !overwrite)
        return;
    sl->key = s;
    sl->len = (uint32_t)n;
    sl->hash = h;
    sl->val = val;
}

static int32_t tok_map_get(const tok_map_t *m, const char *s, size_t n)
{
    const tok_slot_t *sl;

    if (!m->slots || n > TOK_MAX_TEXT * 2 + 1)
        return TOK_NONE;
    sl = tok_map_slot(m, s, n, tok_hash(s, n));
    return sl->key ? sl->val : TOK_NONE;
}

/* ------------------------------------------------------------------ UTF-8 and byte-level helpers */

/* Length of a UTF-8 sequence from its lead byte, as llama.cpp's
 * unicode_len_utf8 (continuation and invalid bytes count as 1). */
static size_t tok_utf8_len(unsigned char c)
{
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

static size_t tok_utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode one (possibly invalid) UTF-8 character of s[0..n); *cp = -1 when
 * invalid. Returns the bytes consumed (>= 1). */
static size_t tok_utf8_get(const char *s, size_t n, int32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t len = tok_utf8_len(u[0]);
    uint32_t v;

    *cp = -1;
    if (len == 1) {
        if (u[0] < 0x80)
            *cp = u[0];
        return 1;
    }
    if (len > n)
        return 1;
    v = u[0] & (0xFFu >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return 1;
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = (int32_t)v;
    return len;
}

/* GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order. */
static uint32_t tok_byte_to_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256 + b;
    if (b <= 160)
        return 256 + 33 + (b - 127);
    return 256 + 33 + 34; /* 173 */
}

/* Inverse of tok_byte_to_cp; -1 if cp is not a byte-level character. */
static int tok_cp_to_byte(int32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return cp;
    if (cp >= 256 && cp <= 288)
        return cp - 256;
    if (cp >= 289 && cp <= 322)
        return cp - 289 + 127;
    if (cp == 323)
        return 173;
    return -1;
}

/* ------------------------------------------------------------------ BPE pre-tokenizers */

/* What a tokenizer.ggml.pre name means, one row per behaviour, as llama.cpp
 * (c392e50, src/llama-vocab.cpp) defines the families; gpt-4o and llama4
 * come from later llama.cpp. Each row's patterns run in order: every pattern
 * splits each piece the previous ones left into its matches and the text
 * between them (both kept, as Hugging Face's Split(..., "isolated") and
 * llama.cpp do), seeing only that piece. Non-ASCII characters are written
 * as \x{...}. Where llama.cpp rewrote a pattern for std::regex and PCRE2 can
 * run the model's own (Hugging Face tokenizer.json) pattern, the table has
 * the original; case-insensitive contractions are spelled out ('[sS]...) as
 * llama.cpp does, so U+017F is not taken for 's'. A missing
 * tokenizer.ggml.pre means "default", as in llama.cpp. */

#define TOK_PRE_MAX_RE 6 /* patterns per row */

enum {
    TOK_PRE_IGNORE_MERGES = 1u << 0, /* a pre-token that is a whole token is not merged */
    TOK_PRE_ADD_BOS = 1u << 1,       /* BOS by default (add_bos_token still overrides) */
};

#define TOK_RE_GPT2                                                                                \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define TOK_RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
/* clang-format settles on no single layout of these two: */
/* clang-format off */
#define TOK_RE_LLAMA3                                                                               \
    TOK_RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"    \
                        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TOK_RE_QWEN2                                                                                \
    TOK_RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"         \
                        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* clang-format on */
#define TOK_RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define TOK_RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define TOK_RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
#define TOK_RE_CJK_HANGUL "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

typedef struct tok_pre_def {
    const char *names;              /* tokenizer.ggml.pre values, separated by spaces */
    const char *re[TOK_PRE_MAX_RE]; /* patterns in order; unused slots NULL */
    unsigned flags;                 /* TOK_PRE_* */
} tok_pre_def_t;

static const tok_pre_def_t tok_pre_defs[] = {
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", TOK_RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, 0},
    {"gpt-2 phi-2 roberta-bpe gigachat jina-es jina-de jina-v1-en jina-v2-es jina-v2-de jina-v2-code "
     "mpt olmo jais",
     {TOK_RE_GPT2},
     0},
    {"llama3 llama-v3 llama-bpe falcon3", {TOK_RE_LLAMA3}, TOK_PRE_IGNORE_MERGES | TOK_PRE_ADD_BOS},
    {"dbrx smaug-bpe chatglm-bpe", {TOK_RE_LLAMA3}, 0},
    {"qwen2 deepseek-r1-qwen megrez stablelm2", {TOK_RE_QWEN2}, 0},
    {"deepseek-llm",
     {"[\\r\\n]",
      "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
      "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
      "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
      "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
      "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
      "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
      "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
      "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
      "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
      "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
      "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
      "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
      "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
      "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
      "\\x{1E900}-\\x{1E943}]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", TOK_RE_CJK_HANGUL, "\\p{N}+"},
     0},
    {"deepseek-coder", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", TOK_RE_CJK_HANGUL, "\\p{N}"}, 0},
    {"deepseek-v3",
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
      "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", TOK_RE_GPT2, "[0-9][0-9][0-9]"}, 0},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b", {"\\p{N}", TOK_RE_GPT2}, 0},
    {"poro-chat bloom gpt3-finnish", {TOK_RE_PORO}, 0},
    {"viking", {TOK_RE_PORO, "\\p{N}"}, 0},
    {"tekken",
     {"[^\\r\\n\\p{L}\\p{N}]?" TOK_RE_UPPER "*" TOK_RE_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" TOK_RE_UPPER
      "+" TOK_RE_LOWER "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     TOK_PRE_IGNORE_MERGES | TOK_PRE_ADD_BOS},
    {"chameleon",
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", TOK_RE_GPT2},
     TOK_PRE_ADD_BOS},
    {"gpt-4o llama4",
     {"[^\\r\\n\\p{L}\\p{N}]?" TOK_RE_UPPER "*" TOK_RE_LOWER "+" TOK_RE_CONTRACTIONS "?"
      "|[^\\r\\n\\p{L}\\p{N}]?" TOK_RE_UPPER "+" TOK_RE_LOWER "*" TOK_RE_CONTRACTIONS "?"
      "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0},
};

/* The row whose names include name[0..n); NULL if none. */
static const tok_pre_def_t *tok_pre_find(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof tok_pre_defs / sizeof tok_pre_defs[0]; i++) {
        const char *p = tok_pre_defs[i].names;
        while (*p) {
            size_t k = strcspn(p, " ");
            if (k == n && memcmp(p, name, n) == 0)
                return &tok_pre_defs[i];
            p += k;
            p += *p == ' ';
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ the tokenizer */

enum {
    TOK_F_EOG = 1u << 0,    /* ends generation */
    TOK_F_LSTRIP = 1u << 1, /* special: whitespace before its text is dropped when it is parsed */
    TOK_F_RSTRIP = 1u << 2, /* special: whitespace after its text is dropped when it is parsed */
};

struct tok {
    tok_kind_t kind;
    int32_t n_vocab;
    char *pool;            /* every token text, each NUL-terminated */
    size_t *off;           /* (n_vocab) offset of the text in pool */
    uint32_t *len;         /* (n_vocab) text bytes */
    float *score;          /* (n_vocab) SPM merge scores; NULL for BPE */
    uint8_t *type;         /* (n_vocab) TOK_TYPE_* (0 = undefined) */
    uint8_t *flag;         /* (n_vocab) TOK_F_* */
    uint8_t *byte_val;     /* (n_vocab) SPM: the byte a <0xNN> token stands for */
    tok_map_t vocab;       /* text -> id (a duplicate text maps to its last id) */
    char *mpool;           /* BPE: every merge line, NUL-terminated */
    tok_map_t merges;      /* BPE: "left right" -> rank (first occurrence) */
    int32_t byte_tok[256]; /* byte -> id: SPM <0xNN>, BPE its byte-level char; -1 none */
    int32_t *specials;     /* (n_specials) CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    size_t n_specials;
    size_t max_len;                       /* longest token text, bytes */
    int32_t bos, eos, unk, pad, eot, eom; /* -1 = none */
    int add_bos;
    int add_space_prefix;
    int ignore_merges;              /* BPE: a pre-token that is a whole token is not merged */
    const tok_pre_def_t *pre;       /* BPE pre-tokenizer */
    pcre2_code *re[TOK_PRE_MAX_RE]; /* its compiled patterns (n_re) */
    size_t n_re;
};

static int tok_str_eq(gguf_str_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* An optional token id: absent, -1 and 4294967295 mean none. */
static int tok_load_id(const gguf_t *g, const char *key, int32_t n_vocab, int32_t *out, char *err,
                       size_t errlen)
{
    int64_t v;
    uint64_t u;
    int rc = gguf_get_i64(g, key, &v);

    *out = TOK_NONE;
    if (rc == GGUF_ERR_NOTFOUND)
        return 0;
    if (rc == GGUF_ERR_TYPE && gguf_get_u64(g, key, &u) == 0 && u == UINT64_MAX)
        return 0;
    if (rc != 0) {
        tok_err(err, errlen, "tokenizer: %s is not an integer token id", key);
        return TOK_ERR_FORMAT;
    }
    if (v == -1 || v == (int64_t)UINT32_MAX)
        return 0;
    if (v < 0 || v >= n_vocab) {
        tok_err(err, errlen, "tokenizer: %s = %lld is out of range (vocabulary has %d tokens)", key,
                (long long)v, (int)n_vocab);
        return TOK_ERR_RANGE;
    }
    *out = (int32_t)v;
    return 0;
}

static int tok_load_bool(const gguf_t *g, const char *key, int def, int *out, char *err,
                         size_t errlen)
{
    int rc = gguf_get_bool(g, key, out);

    if (rc == GGUF_ERR_NOTFOUND) {
        *out = def;
        return 0;
    }
    if (rc != 0) {
        tok_err(err, errlen, "tokenizer: %s is not a bool", key);
        return TOK_ERR_FORMAT;
    }
    *out = *out != 0;
    return 0;
}

static int tok_is_int_vtype(gguf_vtype_t t)
{
    return t == GGUF_VT_UINT8 || t == GGUF_VT_INT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_INT16 ||
           t == GGUF_VT_UINT32 || t == GGUF_VT_INT32 || t == GGUF_VT_UINT64 || t == GGUF_VT_INT64;
}

/* A required or optional array with n elements of an accepted type. */
static int tok_load_arr(const gguf_t *g, const char *key, int required, int want_float, uint64_t n,
                        const gguf_value_t **out, char *err, size_t errlen)
{
    int rc = gguf_get_arr(g, key, GGUF_VT_COUNT, out);
    gguf_vtype_t et;

    if (rc == GGUF_ERR_NOTFOUND && !required) {
        *out = NULL;
        return 0;
    }
    if (rc == GGUF_ERR_NOTFOUND) {
        tok_err(err, errlen, "tokenizer: %s is missing", key);
        return TOK_ERR_FORMAT;
    }
    if (rc != 0) {
        tok_err(err, errlen, "tokenizer: %s is not an array", key);
        return TOK_ERR_FORMAT;
    }
    et = (*out)->v.arr.type;
    if (want_float ? (et != GGUF_VT_FLOAT32 && et != GGUF_VT_FLOAT64) : !tok_is_int_vtype(et)) {
        tok_err(err, errlen, "tokenizer: %s has elements of type %s, expected %s", key,
                gguf_vtype_name(et), want_float ? "float" : "integer");
        return TOK_ERR_FORMAT;
    }
    if ((*out)->v.arr.n != n) {
        tok_err(err, errlen, "tokenizer: %s has %llu elements but tokenizer.ggml.tokens has %llu",
                key, (unsigned long long)(*out)->v.arr.n, (unsigned long long)n);
        return TOK_ERR_FORMAT;
    }
    return 0;
}

/* Parse "<0xNN>" (either hex case); -1 if the text is not of that form. */
static int tok_parse_byte_token(const char *s, size_t n)
{
    int v = 0;

    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                         : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static int tok_load_vocab(tok_t *t, const gguf_t *g, char *err, size_t errlen)
{
    const gguf_value_t *toks, *scores, *types;
    uint64_t n;
    size_t total = 0, pos = 0;
    int rc;

    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_VT_COUNT, &toks) != 0) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.tokens is missing or not an array");
        return TOK_ERR_FORMAT;
    }
    if (toks->v.arr.type != GGUF_VT_STRING || !toks->v.arr.items) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.tokens is not an array of strings");
        return TOK_ERR_FORMAT;
    }
    n = toks->v.arr.n;
    if (n == 0 || n >= (uint64_t)INT32_MAX) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.tokens has %llu tokens",
                (unsigned long long)n);
        return TOK_ERR_FORMAT;
    }
    t->n_vocab = (int32_t)n;

    rc = tok_load_arr(g, "tokenizer.ggml.scores", t->kind == TOK_KIND_SPM, 1, n, &scores, err,
                      errlen);
    if (rc < 0)
        return rc;
    rc = tok_load_arr(g, "tokenizer.ggml.token_type", 1, 0, n, &types, err, errlen);
    if (rc < 0)
        return rc;

    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = toks->v.arr.items[i].v.str.len;
        if (l == 0) {
            tok_err(err, errlen, "tokenizer: token %llu has empty text", (unsigned long long)i);
            return TOK_ERR_FORMAT;
        }
        if (l > TOK_MAX_TEXT) {
            tok_err(err, errlen, "tokenizer: token %llu is %llu bytes long (limit %u)",
                    (unsigned long long)i, (unsigned long long)l, TOK_MAX_TEXT);
            return TOK_ERR_FORMAT;
        }
        total += (size_t)l + 1;
    }

    t->pool = malloc(total);
    t->off = malloc(n * sizeof *t->off);
    t->len = malloc(n * sizeof *t->len);
    t->type = malloc(n);
    t->flag = calloc(n, 1);
    t->byte_val = calloc(n, 1);
    if (scores)
        t->score = malloc(n * sizeof *t->score);
    if (!t->pool || !t->off || !t->len || !t->type || !t->flag || !t->byte_val ||
        (scores && !t->score) || tok_map_init(&t->vocab, n) < 0) {
        tok_err(err, errlen, "tokenizer: out of memory for %llu tokens", (unsigned long long)n);
        return TOK_ERR_NOMEM;
    }

    for (uint64_t i = 0; i < n; i++) {
        gguf_str_t s = toks->v.arr.items[i].v.str;
        int64_t ty = gguf_arr_i64(types, i);

        if (ty < 0 || ty > TOK_TYPE_BYTE) {
            tok_err(err, errlen, "tokenizer: token %llu has unknown token_type %lld",
                    (unsigned long long)i, (long long)ty);
            return TOK_ERR_FORMAT;
        }
        t->type[i] = (uint8_t)ty;
        if (scores) {
            double sc = gguf_arr_f64(scores, i);
            if (isnan(sc)) {
                tok_err(err, errlen, "tokenizer: token %llu has a NaN score",
                        (unsigned long long)i);
                return TOK_ERR_FORMAT;
            }
            t->score[i] = (float)sc;
        }
        memcpy(t->pool + pos, s.ptr, s.len);
        t->pool[pos + s.len] = '\0';
        t->off[i] = pos;
        t->len[i] = (uint32_t)s.len;
        pos += s.len + 1;
        if (s.len > t->max_len)
            t->max_len = s.len;
        if (t->kind == TOK_KIND_SPM && ty == TOK_TYPE_BYTE) {
            int b = tok_parse_byte_token(s.ptr, s.len);
            if (b < 0) {
                tok_err(err, errlen,
                        "tokenizer: byte token %llu has text \"%.*s\", expected <0xNN>",
                        (unsigned long long)i, (int)(s.len > 32 ? 32 : s.len), s.ptr);
                return TOK_ERR_FORMAT;
            }
            t->byte_val[i] = (uint8_t)b;
        }
        /* llama.cpp: token_to_id[text] = i, so a duplicate maps to its last id */
        tok_map_put(&t->vocab, t->pool + t->off[i], s.len, (int32_t)i, 1);
    }
    return 0;
}

static int tok_load_merges(tok_t *t, const gguf_t *g, char *err, size_t errlen)
{
    const gguf_value_t *m;
    uint64_t n;
    size_t total = 0, pos = 0;

    if (gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_VT_COUNT, &m) != 0) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.merges is missing or not an array");
        return TOK_ERR_FORMAT;
    }
    if (m->v.arr.type != GGUF_VT_STRING || (m->v.arr.n && !m->v.arr.items)) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.merges is not an array of strings");
        return TOK_ERR_FORMAT;
    }
    n = m->v.arr.n;
    if (n >= (uint64_t)INT32_MAX) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.merges has %llu entries",
                (unsigned long long)n);
        return TOK_ERR_FORMAT;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = m->v.arr.items[i].v.str.len;
        if (l > TOK_MAX_TEXT * 2 + 1) {
            tok_err(err, errlen, "tokenizer: merge %llu is %llu bytes long", (unsigned long long)i,
                    (unsigned long long)l);
            return TOK_ERR_FORMAT;
        }
        total += (size_t)l + 1;
    }
    t->mpool = malloc(total ? total : 1);
    if (!t->mpool || tok_map_init(&t->merges, n) < 0) {
        tok_err(err, errlen, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
        return TOK_ERR_NOMEM;
    }
    for (uint64_t i = 0; i < n; i++) {
        gguf_str_t s = m->v.arr.items[i].v.str;
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;

        /* llama.cpp splits at the first space after the first byte; a line
         * without one can never match and is skipped. */
        if (!sp || (uint64_t)(sp - s.ptr) + 1 >= s.len)
            continue;
        memcpy(t->mpool + pos, s.ptr, s.len);
        t->mpool[pos + s.len] = '\0';
        tok_map_put(&t->merges, t->mpool + pos, s.len, (int32_t)i, 0);
        pos += s.len + 1;
    }
    return 0;
}

typedef struct tok_special_sort {
    uint32_t len;
    int32_t id;
} tok_special_sort_t;

static int tok_special_cmp(const void *a, const void *b)
{
    const tok_special_sort_t *x = a, *y = b;

    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int tok_build_specials(tok_t *t, char *err, size_t errlen)
{
    tok_special_sort_t *tmp;
    size_t k = 0;

    for (int32_t i = 0; i < t->n_vocab; i++) {
        int ty = t->type[i];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN)
            k++;
    }
    if (k == 0)
        return 0;
    tmp = malloc(k * sizeof *tmp);
    t->specials = malloc(k * sizeof *t->specials);
    if (!tmp || !t->specials) {
        free(tmp);
        tok_err(err, errlen, "tokenizer: out of memory for %zu special tokens", k);
        return TOK_ERR_NOMEM;
    }
    k = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int ty = t->type[i];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN)
            tmp[k++] = (tok_special_sort_t){.len = t->len[i], .id = i};
    }
    qsort(tmp, k, sizeof *tmp, tok_special_cmp);
    for (size_t i = 0; i < k; i++)
        t->specials[i] = tmp[i].id;
    t->n_specials = k;
    free(tmp);
    return 0;
}

/* Token texts that end generation in llama.cpp (c392e50), which also makes
 * each such token CONTROL whatever the file says (so its text is parsed only
 * as a special token and not printed). */
static const char *const tok_eog_text[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
};

/* Fill-in-the-middle pad, repository and file-separator tokens: llama.cpp
 * ends generation at them too, by id from the key or else by these texts. */
static const struct {
    const char *key;
    const char *text[4];
} tok_fim_eog[] = {
    {"tokenizer.ggml.fim_pad_token_id", {"<|fim_pad|>", "<fim-pad>", "<PAD>"}},
    {"tokenizer.ggml.fim_rep_token_id", {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"}},
    {"tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>"}},
};

/* Marks the end-of-generation tokens: EOS, EOT and EOM ids, the texts above
 * and the FIM ones. Runs before tok_build_specials (it changes types). */
static int tok_build_eog(tok_t *t, const gguf_t *g, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof tok_eog_text / sizeof tok_eog_text[0]; i++) {
        int32_t id = tok_map_get(&t->vocab, tok_eog_text[i], strlen(tok_eog_text[i]));
        if (id >= 0) {
            t->flag[id] |= TOK_F_EOG;
            t->type[id] = TOK_TYPE_CONTROL;
        }
    }
    for (size_t i = 0; i < sizeof tok_fim_eog / sizeof tok_fim_eog[0]; i++) {
        int32_t id;
        if (tok_load_id(g, tok_fim_eog[i].key, t->n_vocab, &id, err, errlen) < 0)
            return TOK_ERR_FORMAT;
        if (id >= 0) {
            t->flag[id] |= TOK_F_EOG;
            continue;
        }
        for (size_t k = 0; k < 4 && tok_fim_eog[i].text[k]; k++) {
            id = tok_map_get(&t->vocab, tok_fim_eog[i].text[k], strlen(tok_fim_eog[i].text[k]));
            if (id >= 0) {
                t->flag[id] |= TOK_F_EOG;
                t->type[id] = TOK_TYPE_CONTROL;
            }
        }
    }
    if (t->eos >= 0)
        t->flag[t->eos] |= TOK_F_EOG;
    if (t->eot >= 0)
        t->flag[t->eot] |= TOK_F_EOG;
    if (t->eom >= 0)
        t->flag[t->eom] |= TOK_F_EOG;
    return 0;
}

/* Whitespace that special tokens swallow, as llama.cpp sets it by model:
 * Phi-3 (general.name holding "phi-3" or "phi3", any case) strips it after
 * every special token but <unk>, <s> and <|endoftext|>, and after </s>; the
 * jina-v2 de/es/code pre-tokenizers strip it before <mask>. */
static void tok_build_strip(tok_t *t, const gguf_t *g)
{
    gguf_str_t name = {0}, pre = {0};
    char lower[256], pre_s[64];
    size_t n = 0, np = 0;

    if (gguf_get_str(g, "general.name", &name) == 0) {
        n = name.len < sizeof lower - 1 ? name.len : sizeof lower - 1;
        for (size_t i = 0; i < n; i++) {
            char c = name.ptr[i];
            lower[i] = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
        }
    }
    lower[n] = '\0';
    if (t->kind == TOK_KIND_BPE && gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0) {
        np = pre.len < sizeof pre_s - 1 ? pre.len : sizeof pre_s - 1;
        memcpy(pre_s, pre.ptr, np);
    }
    pre_s[np] = '\0';
    if (strstr(pre_s, "jina-v2-de") || strstr(pre_s, "jina-v2-es") ||
        strstr(pre_s, "jina-v2-code")) {
        int32_t id = tok_map_get(&t->vocab, "<mask>", 6);
        if (id >= 0)
            t->flag[id] |= TOK_F_LSTRIP;
    } else if (strstr(lower, "phi-3") || strstr(lower, "phi3")) {
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        int32_t id;
        for (size_t i = 0; i < t->n_specials; i++)
            t->flag[t->specials[i]] |= TOK_F_RSTRIP;
        if ((id = tok_map_get(&t->vocab, "</s>", 4)) >= 0)
            t->flag[id] |= TOK_F_RSTRIP;
        for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
            if ((id = tok_map_get(&t->vocab, keep[i], strlen(keep[i]))) >= 0)
                t->flag[id] &= (uint8_t)~TOK_F_RSTRIP;
    }
}

static void tok_build_bytes(tok_t *t)
{
    for (unsigned b = 0; b < 256; b++) {
        char s[8];
        int32_t id;

        if (t->kind == TOK_KIND_SPM) {
            snprintf(s, sizeof s, "<0x%02X>", b);
            id = tok_map_get(&t->vocab, s, 6);
            if (id < 0) { /* llama.cpp falls back to the byte itself as a token */
                s[0] = (char)b;
                id = tok_map_get(&t->vocab, s, 1);
            }
        } else {
            size_t n = tok_utf8_put(s, tok_byte_to_cp(b));
            id = tok_map_get(&t->vocab, s, n);
        }
        t->byte_tok[b] = id;
    }
}

/* Looks tokenizer.ggml.pre up in tok_pre_defs and compiles its patterns. */
static int tok_compile_pre(tok_t *t, const gguf_t *g, char *err, size_t errlen)
{
    gguf_str_t pre;
    int rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);

    if (rc != 0 && rc != GGUF_ERR_NOTFOUND) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.pre is not a string");
        return TOK_ERR_FORMAT;
    }
    if (rc == GGUF_ERR_NOTFOUND) {
        pre.ptr = "default";
        pre.len = 7;
    }
    t->pre = tok_pre_find(pre.ptr, pre.len);
    if (!t->pre) {
        tok_err(err, errlen, "tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = \"%.*s\"",
                (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
        return TOK_ERR_UNSUPPORTED;
    }
    t->ignore_merges = (t->pre->flags & TOK_PRE_IGNORE_MERGES) != 0;
    for (t->n_re = 0; t->n_re < TOK_PRE_MAX_RE && t->pre->re[t->n_re]; t->n_re++) {
        int ecode;
        PCRE2_SIZE eoff;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)t->pre->re[t->n_re], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ecode, &eoff, NULL);
        if (!re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ecode, msg, sizeof msg);
            tok_err(err, errlen,
                    "tokenizer: pre-tokenizer \"%.*s\" pattern %zu failed to compile at %zu: %s",
                    (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, t->n_re, (size_t)eoff,
                    (const char *)msg);
            return TOK_ERR_UNSUPPORTED;
        }
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
        t->re[t->n_re] = re;
    }
    return 0;
}

tok_t *tok_open(const gguf_t *g, char *err, size_t errlen)
{
    tok_t *t = NULL;
    gguf_str_t model;
    int rc;

    if (!g) {
        tok_err(err, errlen, "tokenizer: no model");
        return NULL;
    }
    rc = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc != 0) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.model is %s",
                rc == GGUF_ERR_NOTFOUND ? "missing" : "not a string");
        return NULL;
    }
    t = calloc(1, sizeof *t);
    if (!t) {
        tok_err(err, errlen, "tokenizer: out of memory");
        return NULL;
    }
    if (tok_str_eq(model, "llama")) {
        t->kind = TOK_KIND_SPM;
    } else if (tok_str_eq(model, "gpt2")) {
        t->kind = TOK_KIND_BPE;
    } else {
        tok_err(err, errlen,
                "tokenizer: unsupported tokenizer.ggml.model \"%.*s\" (want llama or gpt2)",
                (int)(model.len > 64 ? 64 : model.len), model.ptr);
        goto fail;
    }

    if (tok_load_vocab(t, g, err, errlen) < 0)
        goto fail;
    if (t->kind == TOK_KIND_BPE && tok_load_merges(t, g, err, errlen) < 0)
        goto fail;
    if (tok_load_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom, err, errlen) < 0)
        goto fail;
    if (t->kind == TOK_KIND_BPE && tok_compile_pre(t, g, err, errlen) < 0)
        goto fail;
    if (tok_load_bool(g, "tokenizer.ggml.add_bos_token",
                      t->kind == TOK_KIND_SPM || (t->pre && (t->pre->flags & TOK_PRE_ADD_BOS)),
                      &t->add_bos, err, errlen) < 0 ||
        tok_load_bool(g, "tokenizer.ggml.add_space_prefix", 1, &t->add_space_prefix, err, errlen) <
            0)
        goto fail;
    if (tok_build_eog(t, g, err, errlen) < 0 || tok_build_specials(t, err, errlen) < 0)
        goto fail;
    tok_build_strip(t, g);
    tok_build_bytes(t);
    return t;

fail:
    tok_close(t);
    return NULL;
}

void tok_close(tok_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    tok_map_free(&t->vocab);
    tok_map_free(&t->merges);
    free(t->mpool);
    free(t->specials);
    free(t->byte_val);
    free(t->flag);
    free(t->type);
    free(t->score);
    free(t->len);
    free(t->off);
    free(t->pool);
    free(t);
}

/* ------------------------------------------------------------------ accessors */

tok_kind_t tok_kind(const tok_t *t)
{
    return t ? t->kind : 0;
}
int32_t tok_vocab_size(const tok_t *t)
{
    return t ? t->n_vocab : 0;
}
int32_t tok_bos(const tok_t *t)
{
    return t ? t->bos : TOK_NONE;
}
int32_t tok_eos(const tok_t *t)
{
    return t ? t->eos : TOK_NONE;
}
int tok_add_bos(const tok_t *t)
{
    return t && t->add_bos && t->bos >= 0;
}

int tok_is_eog(const tok_t *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && (t->flag[id] & TOK_F_EOG);
}

int tok_type(const tok_t *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return TOK_ERR_RANGE;
    return t->type[id];
}

const char *tok_text(const tok_t *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return NULL;
    return t->pool + t->off[id];
}

int32_t tok_find(const tok_t *t, const char *text)
{
    if (!t || !text)
        return TOK_NONE;
    return tok_map_get(&t->vocab, text, strlen(text));
}

/* ------------------------------------------------------------------ encoding: shared machinery */

typedef struct tok_out {
    int32_t *ids; /* caller's buffer (cap) */
    size_t cap;
    size_t n; /* ids produced, may exceed cap */
} tok_out_t;

static void tok_out_push(tok_out_t *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

/* A piece of the input: raw text still to tokenize, or a special token. */
typedef struct tok_frag {
    size_t off, len; /* bytes of the input */
    int32_t id;      /* -1 = raw text */
} tok_frag_t;

/* A symbol of the merge chain: bytes [off, off+n) of the work buffer. */
typedef struct tok_sym {
    int prev, next;  /* -1 = none */
    uint32_t off, n; /* n == 0: merged into its left neighbour */
} tok_sym_t;

typedef struct tok_bigram {
    double key; /* smaller first: SPM -score, BPE merge rank */
    int left, right;
    uint32_t size; /* bytes of the merged text */
} tok_bigram_t;

/* Per-call scratch space (tok_t stays read-only, so encoding is thread-safe). */
typedef struct tok_work {
    char *buf; /* escaped fragment (SPM) or byte-level word (BPE) */
    size_t bufcap;
    tok_sym_t *sym;
    size_t symcap;
    tok_bigram_t *heap;
    size_t nheap, heapcap;
    char *pair; /* BPE "left right" lookup key */
    size_t paircap;
    tok_frag_t *frag; /* fragments of the input */
    size_t nfrag, fragcap;
    tok_frag_t *frag2; /* the next partition pass */
    size_t frag2cap;
    tok_frag_t *piece; /* BPE pre-tokens of one fragment (npiece) */
    size_t npiece, piececap;
    tok_frag_t *piece2; /* the next pattern's pass */
    size_t piece2cap;
    pcre2_match_data *md;
} tok_work_t;

static int tok_reserve(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t nc;
    void *q;

    if (need <= *cap)
        return 0;
    nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem)
            return TOK_ERR_NOMEM;
        nc *= 2;
    }
    q = realloc(*p, nc * elem);
    if (!q)
        return TOK_ERR_NOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

static void tok_work_free(tok_work_t *w)
{
    free(w->buf);
    free(w->sym);
    free(w->heap);
    free(w->pair);
    free(w->frag);
    free(w->frag2);
    free(w->piece);
    free(w->piece2);
    pcre2_match_data_free(w->md);
}

static int tok_bigram_before(const tok_bigram_t *a, const tok_bigram_t *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static int tok_heap_push(tok_work_t *w, tok_bigram_t b)
{
    size_t i;

    if (tok_reserve((void **)&w->heap, &w->heapcap, w->nheap + 1, sizeof *w->heap) < 0)
        return TOK_ERR_NOMEM;
    i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_bigram_before(&b, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return 0;
}

static tok_bigram_t tok_heap_pop(tok_work_t *w)
{
    tok_bigram_t top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && tok_bigram_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!tok_bigram_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

/* Queue the merge of symbols left and right if the vocabulary allows it. */
static int tok_try_bigram(const tok_t *t, tok_work_t *w, int left, int right)
{
    const tok_sym_t *l, *r;
    tok_bigram_t b;
    size_t size;

    if (left < 0 || right < 0)
        return 0;
    l = &w->sym[left];
    r = &w->sym[right];
    size = (size_t)l->n + r->n;
    if (t->kind == TOK_KIND_SPM) {
        int32_t id;
        if (size > t->max_len)
            return 0;
        id =
            tok_map_get(&t->vocab, w->buf + l->off, size); /* the two symbols are adjacent in buf */
        if (id < 0)
            return 0;
        b.key = -(double)t->score[id];
    } else {
        int32_t rank;
        if (size > TOK_MAX_TEXT * 2) /* longer than any merge line */
            return 0;
        if (tok_reserve((void **)&w->pair, &w->paircap, size + 1, 1) < 0)
            return TOK_ERR_NOMEM;
        memcpy(w->pair, w->buf + l->off, l->n);
        w->pair[l->n] = ' ';
        memcpy(w->pair + l->n + 1, w->buf + r->off, r->n);
        rank = tok_map_get(&t->merges, w->pair, size + 1);
        if (rank < 0)
            return 0;
        b.key = rank;
    }
    b.left = left;
    b.right = right;
    b.size = (uint32_t)size;
    return tok_heap_push(w, b);
}

/* Split w->buf[0..len) into UTF-8 characters and merge greedily: the best
 * queued pair first (highest SPM score / lowest BPE rank; ties leftmost),
 * as llama.cpp does. Returns the symbol count or a negative error. */
static int tok_merge(const tok_t *t, tok_work_t *w, size_t len)
{
    size_t off = 0;
    int n = 0;

    if (tok_reserve((void **)&w->sym, &w->symcap, len, sizeof *w->sym) < 0)
        return TOK_ERR_NOMEM;
    while (off < len) {
        size_t cl = tok_utf8_len((unsigned char)w->buf[off]);
        if (cl > len - off)
            cl = len - off;
        w->sym[n] = (tok_sym_t){.prev = n - 1,
                                .next = off + cl == len ? -1 : n + 1,
                                .off = (uint32_t)off,
                                .n = (uint32_t)cl};
        off += cl;
        n++;
    }
    w->nheap = 0;
    for (int i = 1; i < n; i++)
        if (tok_try_bigram(t, w, i - 1, i) < 0)
            return TOK_ERR_NOMEM;
    while (w->nheap) {
        tok_bigram_t b = tok_heap_pop(w);
        tok_sym_t *l = &w->sym[b.left], *r = &w->sym[b.right];

        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* stale: one side was merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->sym[r->next].prev = b.left;
        if (tok_try_bigram(t, w, l->prev, b.left) < 0 || tok_try_bigram(t, w, b.left, l->next) < 0)
            return TOK_ERR_NOMEM;
    }
    return n;
}

/* ASCII whitespace, as C's isspace in the "C" locale. */
static int tok_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Split the input into raw text and special-token fragments: for each
 * special token, longest text first, every occurrence in the remaining raw
 * text is cut out (llama.cpp tokenizer_st_partition), with the whitespace
 * before (TOK_F_LSTRIP) or after (TOK_F_RSTRIP) it where the token says so.
 * USER_DEFINED tokens are always cut out (as llama.cpp and Hugging Face do);
 * CONTROL and UNKNOWN ones only with parse_special. */
static int tok_partition(const tok_t *t, tok_work_t *w, const char *text, size_t len,
                         int parse_special)
{
    w->nfrag = 0;
    if (len == 0)
        return 0;
    if (tok_reserve((void **)&w->frag, &w->fragcap, 1, sizeof *w->frag) < 0)
        return TOK_ERR_NOMEM;
    w->frag[0] = (tok_frag_t){.off = 0, .len = len, .id = TOK_NONE};
    w->nfrag = 1;

    for (size_t k = 0; k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        const char *st = t->pool + t->off[id];
        size_t sl = t->len[id], nf = 0, need = 0;

        if (!parse_special && t->type[id] != TOK_TYPE_USER_DEFINED)
            continue;
        for (size_t i = 0; i < w->nfrag; i++) { /* count the new fragments */
            const tok_frag_t *f = &w->frag[i];
            size_t pos = f->off, end = f->off + f->len;
            const char *p;
            if (f->id >= 0)
                continue;
            while (pos < end && (p = memmem(text + pos, end - pos, st, sl)) != NULL) {
                need += 2;
                pos = (size_t)(p - text) + sl;
            }
        }
        if (need == 0)
            continue;
        if (tok_reserve((void **)&w->frag2, &w->frag2cap, w->nfrag + need, sizeof *w->frag2) < 0)
            return TOK_ERR_NOMEM;
        for (size_t i = 0; i < w->nfrag; i++) {
            const tok_frag_t *f = &w->frag[i];
            size_t pos = f->off, end = f->off + f->len;
            const char *p;
            if (f->id >= 0) {
                w->frag2[nf++] = *f;
                continue;
            }
            while (pos < end && (p = memmem(text + pos, end - pos, st, sl)) != NULL) {
                size_t at = (size_t)(p - text), left = at;
                if (t->flag[id] & TOK_F_LSTRIP)
                    while (left > pos && tok_is_space(text[left - 1]))
                        left--;
                if (left > pos)
                    w->frag2[nf++] = (tok_frag_t){.off = pos, .len = left - pos, .id = TOK_NONE};
                w->frag2[nf++] = (tok_frag_t){.off = at, .len = sl, .id = id};
                pos = at + sl;
                if (t->flag[id] & TOK_F_RSTRIP)
                    while (pos < end && tok_is_space(text[pos]))
                        pos++;
            }
            if (pos < end)
                w->frag2[nf++] = (tok_frag_t){.off = pos, .len = end - pos, .id = TOK_NONE};
        }
        tok_frag_t *tmp = w->frag;
        size_t tmpcap = w->fragcap;
        w->frag = w->frag2;
        w->fragcap = w->frag2cap;
        w->frag2 = tmp;
        w->frag2cap = tmpcap;
        w->nfrag = nf;
    }
    return 0;
}

/* ------------------------------------------------------------------ encoding: SentencePiece */

/* Emit the ids of one final symbol: its token, or its bytes as <0xNN>
 * tokens, or unk for bytes without a token. */
static void tok_emit_spm(const tok_t *t, const char *s, size_t n, tok_out_t *o)
{
    int32_t id = tok_map_get(&t->vocab, s, n);

    if (id >= 0) {
        tok_out_push(o, id);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        id = t->byte_tok[(unsigned char)s[i]];
        if (id < 0)
            id = t->unk;
        if (id >= 0)
            tok_out_push(o, id);
    }
}

static int tok_encode_spm(const tok_t *t, tok_work_t *w, const char *s, size_t n, int prefix,
                          tok_out_t *o)
{
    size_t len = 0;
    int nsym;

    if (tok_reserve((void **)&w->buf, &w->bufcap, 3 * n + 3, 1) < 0)
        return TOK_ERR_NOMEM;
    if (prefix) {
        memcpy(w->buf, "\xE2\x96\x81", 3);
        len = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->buf + len, "\xE2\x96\x81", 3);
            len += 3;
        } else {
            w->buf[len++] = s[i];
        }
    }
    nsym = tok_merge(t, w, len);
    if (nsym < 0)
        return nsym;
    for (int i = nsym > 0 ? 0 : -1; i >= 0; i = w->sym[i].next)
        tok_emit_spm(t, w->buf + w->sym[i].off, w->sym[i].n, o);
    return 0;
}

/* ------------------------------------------------------------------ encoding: GPT-2 byte-level BPE */

static void tok_emit_bpe(const tok_t *t, const char *s, size_t n, tok_out_t *o)
{
    int32_t id = tok_map_get(&t->vocab, s, n);

    if (id >= 0) {
        tok_out_push(o, id);
        return;
    }
    /* fall back per byte-level character (one per input byte) */
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t cl = tok_utf8_get(s + i, n - i, &cp);
        int b = tok_cp_to_byte(cp);
        id = b >= 0 ? t->byte_tok[b] : TOK_NONE;
        if (id < 0)
            id = t->unk;
        if (id >= 0)
            tok_out_push(o, id);
        i += cl;
    }
}

/* One pre-token: map its bytes to byte-level characters, then merge. */
static int tok_bpe_word(const tok_t *t, tok_work_t *w, const char *s, size_t n, tok_out_t *o)
{
    size_t len = 0;
    int nsym;

    if (tok_reserve((void **)&w->buf, &w->bufcap, 2 * n, 1) < 0)
        return TOK_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        len += tok_utf8_put(w->buf + len, tok_byte_to_cp((unsigned char)s[i]));
    if (t->ignore_merges) {
        int32_t id = tok_map_get(&t->vocab, w->buf, len);
        if (id >= 0) {
            tok_out_push(o, id);
            return 0;
        }
    }
    nsym = tok_merge(t, w, len);
    if (nsym < 0)
        return nsym;
    for (int i = nsym > 0 ? 0 : -1; i >= 0; i = w->sym[i].next)
        tok_emit_bpe(t, w->buf + w->sym[i].off, w->sym[i].n, o);
    return 0;
}

/* Appends piece [off, off+len) to w->piece2 (len 0 is dropped). */
static int tok_piece_push(tok_work_t *w, size_t *np, size_t off, size_t len)
{
    if (len == 0)
        return 0;
    if (tok_reserve((void **)&w->piece2, &w->piece2cap, *np + 1, sizeof *w->piece2) < 0)
        return TOK_ERR_NOMEM;
    w->piece2[(*np)++] = (tok_frag_t){.off = off, .len = len, .id = TOK_NONE};
    return 0;
}

/* Splits piece p of s with pattern re into its matches and the text between
 * them, appended to w->piece2. The pattern sees only the piece. */
static int tok_split(tok_work_t *w, const pcre2_code *re, const char *s, tok_frag_t p, size_t *np)
{
    const char *sub = s + p.off;
    size_t pos = 0, gap = 0; /* gap: start of the text not yet emitted */
    int rc;

    while (pos < p.len) {
        PCRE2_SIZE *ov;
        size_t mstart, mend;

        rc = pcre2_match(re, (PCRE2_SPTR)sub, p.len, pos, 0, w->md, NULL);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* e.g. JIT stack limit: retry interpreted */
            rc = pcre2_match(re, (PCRE2_SPTR)sub, p.len, pos, PCRE2_NO_JIT, w->md, NULL);
        if (rc < 0) /* no (more) matches; a failing match is treated the same way */
            break;
        ov = pcre2_get_ovector_pointer(w->md);
        mstart = ov[0];
        mend = ov[1];
        if (mstart < pos || mend < mstart || mend > p.len) /* cannot happen; stay safe */
            break;
        if (mend == mstart) { /* empty match: no piece; step one character */
            int32_t cp;
            pos = mstart + tok_utf8_get(sub + mstart, p.len - mstart, &cp);
            continue;
        }
        if ((rc = tok_piece_push(w, np, p.off + gap, mstart - gap)) < 0 ||
            (rc = tok_piece_push(w, np, p.off + mstart, mend - mstart)) < 0)
            return rc;
        gap = pos = mend;
    }
    return tok_piece_push(w, np, p.off + gap, p.len - gap);
}

/* Pre-tokenizes s[0..n) with the pre-tokenizer's patterns in turn, then
 * merges each pre-token. */
static int tok_encode_bpe(const tok_t *t, tok_work_t *w, const char *s, size_t n, tok_out_t *o)
{
    int rc;

    if (n == 0)
        return 0;
    if (!w->md) {
        w->md = pcre2_match_data_create(16, NULL);
        if (!w->md)
            return TOK_ERR_NOMEM;
    }
    if (tok_reserve((void **)&w->piece, &w->piececap, 1, sizeof *w->piece) < 0)
        return TOK_ERR_NOMEM;
    w->piece[0] = (tok_frag_t){.off = 0, .len = n, .id = TOK_NONE};
    w->npiece = 1;
    for (size_t r = 0; r < t->n_re; r++) {
        size_t np = 0;
        tok_frag_t *tmp;
        size_t tmpcap;

        for (size_t i = 0; i < w->npiece; i++)
            if ((rc = tok_split(w, t->re[r], s, w->piece[i], &np)) < 0)
                return rc;
        tmp = w->piece;
        tmpcap = w->piececap;
        w->piece = w->piece2;
        w->piececap = w->piece2cap;
        w->piece2 = tmp;
        w->piece2cap = tmpcap;
        w->npiece = np;
    }
    for (size_t i = 0; i < w->npiece; i++)
        if ((rc = tok_bpe_word(t, w, s + w->piece[i].off, w->piece[i].len, o)) < 0)
            return rc;
    return 0;
}

/* ------------------------------------------------------------------ encoding: entry point */

int tok_encode(const tok_t *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t *ids, size_t cap)
{
    tok_work_t w = {0};
    tok_out_t o = {.ids = ids, .cap = ids ? cap : 0, .n = 0};
    int prev_special = 1; /* SPM: the space prefix goes before the first text and after specials */
    int rc = 0;

    if (!t || (!text && len))
        return TOK_ERR_RANGE;
    if (len > TOK_MAX_INPUT)
        return TOK_ERR_RANGE;
    if (add_bos && t->bos >= 0)
        tok_out_push(&o, t->bos);
    rc = tok_partition(t, &w, text, len, parse_special);
    for (size_t i = 0; rc == 0 && i < w.nfrag; i++) {
        const tok_frag_t f = w.frag[i];
        if (f.id >= 0) {
            tok_out_push(&o, f.id);
            prev_special = 1;
        } else if (t->kind == TOK_KIND_SPM) {
            rc =
                tok_encode_spm(t, &w, text + f.off, f.len, t->add_space_prefix && prev_special, &o);
            prev_special = 0;
        } else {
            rc = tok_encode_bpe(t, &w, text + f.off, f.len, &o);
        }
    }
    tok_work_free(&w);
    if (rc < 0)
        return rc;
    if (o.n > INT_MAX)
        return TOK_ERR_RANGE;
    return (int)o.n;
}

/* ------------------------------------------------------------------ decoding */

typedef struct tok_wr {
    char *buf;
    size_t cap;
    size_t n; /* full length, may exceed cap */
} tok_wr_t;

static void tok_wr_put(tok_wr_t *w, const char *s, size_t n)
{
    if (w->n < w->cap) {
        size_t k = w->cap - w->n < n ? w->cap - w->n : n;
        memcpy(w->buf + w->n, s, k);
    }
    w->n += n;
}

int tok_piece(const tok_t *t, int32_t id, int special, char *buf, size_t cap)
{
    tok_wr_t w = {.buf = buf, .cap = buf ? cap : 0, .n = 0};
    const char *s;
    size_t n;

    if (!t || id < 0 || id >= t->n_vocab)
        return TOK_ERR_RANGE;
    s = t->pool + t->off[id];
    n = t->len[id];
    switch (t->type[id]) {
    case TOK_TYPE_CONTROL:
    case TOK_TYPE_UNKNOWN:
        if (special)
            tok_wr_put(&w, s, n);
        break;
    case TOK_TYPE_USER_DEFINED: tok_wr_put(&w, s, n); break;
    case TOK_TYPE_NORMAL:
    case TOK_TYPE_BYTE:
        if (t->kind == TOK_KIND_SPM && t->type[id] == TOK_TYPE_BYTE) {
            char c = (char)t->byte_val[id];
            tok_wr_put(&w, &c, 1);
        } else if (t->kind == TOK_KIND_SPM) {
            for (size_t i = 0; i < n;) {
                if (n - i >= 3 && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                    tok_wr_put(&w, " ", 1);
                    i += 3;
                } else {
                    tok_wr_put(&w, s + i, 1);
                    i++;
                }
            }
        } else {
            for (size_t i = 0; i < n;) {
                int32_t cp;
                size_t cl = tok_utf8_get(s + i, n - i, &cp);
                int b = tok_cp_to_byte(cp);
                if (b >= 0) {
                    char c = (char)b;
                    tok_wr_put(&w, &c, 1);
                } else {
                    tok_wr_put(&w, s + i, cl); /* not a byte-level char: as stored */
                }
                i += cl;
            }
        }
        break;
    default: /* UNUSED, undefined: nothing, as llama.cpp */ break;
    }
    if (w.n < w.cap)
        buf[w.n] = '\0';
    return (int)w.n;
}

/* ------------------------------------------------------------------ streaming decoder */

void tok_stream_init(tok_stream_t *s, const tok_t *t, int special)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->special = special;
}

/* Emit the complete characters of b[0..m) into out (cap, NUL-terminated),
 * invalid sequences (and NUL bytes) as U+FFFD; an incomplete tail goes back into s->pending
 * unless final. Nothing in s changes when out is too small. */
static int tok_stream_emit(tok_stream_t *s, const unsigned char *b, size_t m, int final, char *out,
                           size_t cap)
{
    static const char repl[3] = {'\xEF', '\xBF', '\xBD'};
    size_t i = 0, o = 0, hold = 0;

    if (!out || cap == 0)
        return TOK_ERR_RANGE;
    while (i < m) {
        unsigned char c = b[i];
        size_t need, k = 1;
        unsigned lo = 0x80, hi = 0xBF;
        const char *src;
        size_t srcn;

        if (c == 0x00) {
            need = SIZE_MAX; /* NUL would end the C string the text travels in */
        } else if (c < 0x80) {
            need = 0;
        } else if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            need = SIZE_MAX; /* never valid */
        }
        if (need != SIZE_MAX) {
            while (k <= need && i + k < m) {
                unsigned d = b[i + k];
                if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF))
                    break;
                k++;
            }
        }
        if (need != SIZE_MAX && k == need + 1) {
            src = (const char *)b + i;
            srcn = k;
        } else if (need != SIZE_MAX && i + k == m && !final) {
            hold = k; /* incomplete, but valid so far: wait for more */
            break;
        } else {
            src = repl; /* one U+FFFD for the maximal invalid prefix */
            srcn = 3;
        }
        if (o + srcn + 1 > cap)
            return TOK_ERR_RANGE;
        memcpy(out + o, src, srcn);
        o += srcn;
        i += k;
    }
    out[o] = '\0';
    memcpy(s->pending, b + i, hold);
    s->npending = hold;
    if (o > INT_MAX)
        return TOK_ERR_RANGE;
    return (int)o;
}

int tok_stream_feed(tok_stream_t *s, int32_t id, char *out, size_t cap)
{
    unsigned char small[256], *b = small;
    size_t np;
    int n, rc;

    if (!s || !s->t)
        return TOK_ERR_RANGE;
    np = s->npending < sizeof s->pending ? s->npending : sizeof s->pending;
    n = tok_piece(s->t, id, s->special, NULL, 0);
    if (n < 0)
        return n;
    if (np + (size_t)n > sizeof small) {
        b = malloc(np + (size_t)n);
        if (!b)
            return TOK_ERR_NOMEM;
    }
    memcpy(b, s->pending, np);
    tok_piece(s->t, id, s->special, (char *)b + np, (size_t)n);
    rc = tok_stream_emit(s, b, np + (size_t)n, 0, out, cap);
    if (b != small)
        free(b);
    return rc;
}

int tok_stream_flush(tok_stream_t *s, char *out, size_t cap)
{
    unsigned char b[sizeof s->pending];
    size_t np;

    if (!s)
        return TOK_ERR_RANGE;
    np = s->npending < sizeof s->pending ? s->npending : sizeof s->pending;
    memcpy(b, s->pending, np);
    return tok_stream_emit(s, b, np, 1, out, cap);
}
