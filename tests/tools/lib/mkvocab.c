/* mkvocab: the vocabularies mkmodel writes (SentencePiece and GPT-2 byte-level BPE), grown so that every piece is reachable by merges. */
#include "mkvocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Token types, numbered as llama.cpp's llama_token_type. */
enum {
    MK_TT_NORMAL = 1,
    MK_TT_UNKNOWN = 2,
    MK_TT_CONTROL = 3,
    MK_TT_BYTE = 6
};

static uint64_t mk_hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static long mk_vocab_find(const mk_vocab_t *v, const char *s)
{
    size_t m = v->hash_cap - 1;
    for (size_t i = mk_hash_str(s) & m;; i = (i + 1) & m) {
        uint32_t e = v->hash[i];
        if (e == 0)
            return -1;
        if (!strcmp(v->text[e - 1], s))
            return (long)e - 1;
    }
}

void mk_vocab_free(mk_vocab_t *v)
{
    for (size_t i = 0; i < v->n; i++)
        free(v->text[i]);
    for (size_t i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->text);
    free(v->scores);
    free(v->types);
    free(v->merges);
    free(v->hash);
}

static int mk_vocab_init(mk_vocab_t *v, size_t cap, int gpt2)
{
    memset(v, 0, sizeof *v);
    v->cap = cap;
    v->gpt2 = gpt2;
    v->hash_cap = 1;
    while (v->hash_cap < cap * 2)
        v->hash_cap *= 2;
    v->text = calloc(cap, sizeof *v->text);
    v->scores = calloc(cap, sizeof *v->scores);
    v->types = calloc(cap, sizeof *v->types);
    v->merges = calloc(cap, sizeof *v->merges);
    v->hash = calloc(v->hash_cap, sizeof *v->hash);
    if (!v->text || !v->scores || !v->types || !v->merges || !v->hash) {
        mk_vocab_free(v);
        return -1;
    }
    return 0;
}

/* Appends a token (no duplicate check). -1 when full or out of memory. */
static int mk_vocab_push(mk_vocab_t *v, const char *s, int32_t type, float score)
{
    if (v->n >= v->cap)
        return -1;
    char *t = strdup(s);
    if (!t)
        return -1;
    size_t m = v->hash_cap - 1;
    size_t i = mk_hash_str(s) & m;
    while (v->hash[i])
        i = (i + 1) & m;
    v->hash[i] = (uint32_t)(v->n + 1);
    v->text[v->n] = t;
    v->types[v->n] = type;
    v->scores[v->n] = score;
    v->n++;
    return 0;
}

static size_t mk_utf8_put(char *dst, uint32_t cp)
{
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    dst[0] = (char)(0xc0 | (cp >> 6)); /* cp < 0x800 here */
    dst[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* Byte length of the last UTF-8 character of s (len > 0). */
static size_t mk_utf8_last(const char *s, size_t len)
{
    size_t i = len - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xc0) == 0x80)
        i--;
    return len - i;
}

/* Adds piece s (and first, recursively, its prefix without the last
 * character and that last character) unless present, so that every piece is
 * reachable by merging two shorter ones: s = prefix + last char. For GPT-2
 * this records the merge "prefix last". SPM pieces get decreasing scores.
 * Returns 0 (also when the vocab filled up meanwhile), -1 on no memory. */
static int mk_vocab_add(mk_vocab_t *v, const char *s, size_t reserve)
{
    if (v->n + reserve >= v->cap || mk_vocab_find(v, s) >= 0)
        return 0;
    size_t len = strlen(s);
    size_t last = mk_utf8_last(s, len);
    if (last < len) {
        char pre[256], tail[8];
        if (len >= sizeof pre || last >= sizeof tail)
            return 0;
        memcpy(pre, s, len - last);
        pre[len - last] = 0;
        memcpy(tail, s + len - last, last);
        tail[last] = 0;
        if (mk_vocab_add(v, pre, reserve) < 0 || mk_vocab_add(v, tail, reserve) < 0)
            return -1;
        if (v->n + reserve >= v->cap || mk_vocab_find(v, pre) < 0 || mk_vocab_find(v, tail) < 0)
            return 0;
        if (v->gpt2) {
            char *m = malloc(len + 2);
            if (!m)
                return -1;
            memcpy(m, pre, len - last);
            m[len - last] = ' ';
            memcpy(m + len - last + 1, tail, last + 1);
            v->merges[v->n_merges++] = m;
        }
    } else if (v->gpt2)
        return 0; /* every GPT-2 token but the 256 bases comes from a merge */
    return mk_vocab_push(v, s, MK_TT_NORMAL, -(float)(v->n));
}

/* Adds text in the vocab's alphabet: for SPM ' ' becomes the word-start
 * marker (texts with control characters are skipped: SPM spells those with
 * byte tokens); for GPT-2 every byte becomes its byte-level character. */
static int mk_vocab_add_text(mk_vocab_t *v, const char *text, size_t reserve)
{
    char buf[256];
    size_t j = 0;
    for (const char *p = text; *p; p++) {
        uint8_t b = (uint8_t)*p;
        if (j + 4 >= sizeof buf)
            return 0;
        if (v->gpt2) {
            j += mk_utf8_put(buf + j, v->byte_cp[b]);
        } else if (b == ' ') {
            memcpy(buf + j, "\xe2\x96\x81", 3);
            j += 3;
        } else if (b < 0x20) {
            return 0;
        } else {
            buf[j++] = (char)b;
        }
    }
    buf[j] = 0;
    return mk_vocab_add(v, buf, reserve);
}

/* Letters in English frequency order; systematic pieces use this order. */
static const char mk_letters[] = "etaoinshrdlucmwfgypbvkjxqz";

static const char *const mk_seed_pieces[] = {
    " ",     " t",     " a",      " s",    " w",    " h",    " o",     " b",    " m",    " i",
    " c",    " f",     " d",      " l",    " p",    " the",  " a",     " and",  " to",   " of",
    " was",  " in",    " he",     " she",  " it",   " that", " is",    " on",   " for",  " with",
    " his",  " her",   " they",   " you",  " said", " had",  " one",   " day",  " time", " once",
    " upon", " there", " little", " girl", " boy",  " big",  " happy", " play", " saw",  " mom",
    " dog",  " cat",   " friend", " went", " park", " not",  " but",   " so",   "th",    "he",
    "in",    "er",     "an",      "re",    "on",    "at",    "en",     "nd",    "ed",    "es",
    "or",    "ing",    "ion",     "ll",    "ly",    "ou",    "st",     "ar",    "al",    "it",
    "is",    "le",     "ve",      "se",    "ch",    "sh",    "ck",     ".",     ",",     "!",
    "?",     "'",      "\"",      "-",     ":",     ";",     "(",      ")",     "0",     "1",
    "2",     "3",      "4",       "5",     "6",     "7",     "8",      "9",     "\n",    " The",
    " Once", " One",   " He",     " She",  " They", " It",   " Lily",  " Tom",  " Ben",  " Sue",
    "A",     "B",      "C",       "D",     "E",     "F",     "G",      "H",     "I",     "J",
    "K",     "L",      "M",       "N",     "O",     "P",     "Q",      "R",     "S",     "T",
    "U",     "V",      "W",       "X",     "Y",     "Z",
};

/* Fills the normal pieces: the seed list, then every letter string of
 * length 1, 2, 3, ... with and without the word-start marker, until the vocab
 * has cap - reserve tokens. */
static int mk_vocab_fill(mk_vocab_t *v, size_t reserve)
{
    for (size_t i = 0; i < sizeof mk_seed_pieces / sizeof mk_seed_pieces[0]; i++)
        if (mk_vocab_add_text(v, mk_seed_pieces[i], reserve) < 0)
            return -1;
    size_t nl = sizeof mk_letters - 1;
    for (size_t len = 1; v->n + reserve < v->cap && len < 32; len++) {
        size_t idx[32] = {0};
        for (;;) {
            char s[40];
            s[0] = ' ';
            for (size_t k = 0; k < len; k++)
                s[1 + k] = mk_letters[idx[k]];
            s[1 + len] = 0;
            if (mk_vocab_add_text(v, s + 1, reserve) < 0 || mk_vocab_add_text(v, s, reserve) < 0)
                return -1;
            if (v->n + reserve >= v->cap)
                return 0;
            size_t k = len;
            while (k > 0 && ++idx[k - 1] == nl)
                idx[--k] = 0;
            if (k == 0)
                break;
        }
    }
    return 0;
}

/* Appends the n_extra control tokens extra (duplicates of a token refused). */
static int mk_vocab_push_extra(mk_vocab_t *v, const char *const *extra, size_t n_extra)
{
    for (size_t i = 0; i < n_extra; i++)
        if (mk_vocab_find(v, extra[i]) >= 0 || mk_vocab_push(v, extra[i], MK_TT_CONTROL, 0.0f))
            return -1;
    return 0;
}

/* SentencePiece vocab: <unk> <s> </s>, the 256 byte tokens, pieces, a last
 * control token `last` unless NULL (Phi-3's <|endoftext|>, which llama.cpp
 * looks up in a model it names phi3), then the extra control tokens. */
int mk_vocab_spm(mk_vocab_t *v, size_t n, const char *last, const char *const *extra,
                 size_t n_extra)
{
    if (mk_vocab_init(v, n, 0) < 0)
        return -1;
    int rc = mk_vocab_push(v, "<unk>", MK_TT_UNKNOWN, 0.0f);
    rc |= mk_vocab_push(v, "<s>", MK_TT_CONTROL, 0.0f);
    rc |= mk_vocab_push(v, "</s>", MK_TT_CONTROL, 0.0f);
    for (int b = 0; b < 256 && rc == 0; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        rc = mk_vocab_push(v, s, MK_TT_BYTE, 0.0f);
    }
    if (rc == 0)
        rc = mk_vocab_fill(v, (last ? 1 : 0) + n_extra);
    if (rc == 0 && last)
        rc = mk_vocab_push(v, last, MK_TT_CONTROL, 0.0f);
    if (rc == 0)
        rc = mk_vocab_push_extra(v, extra, n_extra);
    if (rc == 0 && v->n != n)
        rc = -1;
    return rc;
}

/* GPT-2 byte-level BPE vocab: 256 byte characters (GPT-2's bytes_to_unicode
 * order), merged tokens, then <|endoftext|>, <|im_start|>, <|im_end|> and the
 * extra control tokens. */
int mk_vocab_gpt2(mk_vocab_t *v, size_t n, const char *const *extra, size_t n_extra)
{
    if (mk_vocab_init(v, n, 1) < 0)
        return -1;
    int printable[256] = {0};
    for (int b = '!'; b <= '~'; b++)
        printable[b] = 1;
    for (int b = 0xa1; b <= 0xac; b++)
        printable[b] = 1;
    for (int b = 0xae; b <= 0xff; b++)
        printable[b] = 1;
    int rc = 0;
    /* printable bytes map to themselves, first, in byte order */
    for (int b = 0; b < 256 && rc == 0; b++) {
        if (!printable[b])
            continue;
        char s[4];
        v->byte_cp[b] = (uint32_t)b;
        s[mk_utf8_put(s, (uint32_t)b)] = 0;
        rc = mk_vocab_push(v, s, MK_TT_NORMAL, 0.0f);
    }
    /* the rest map to U+0100 + k, in byte order */
    uint32_t k = 0;
    for (int b = 0; b < 256 && rc == 0; b++) {
        if (printable[b])
            continue;
        char s[4];
        v->byte_cp[b] = 0x100 + k++;
        s[mk_utf8_put(s, v->byte_cp[b])] = 0;
        rc = mk_vocab_push(v, s, MK_TT_NORMAL, 0.0f);
    }
    if (rc == 0)
        rc = mk_vocab_fill(v, 3 + n_extra);
    if (rc == 0)
        rc = mk_vocab_push(v, "<|endoftext|>", MK_TT_CONTROL, 0.0f);
    if (rc == 0)
        rc = mk_vocab_push(v, "<|im_start|>", MK_TT_CONTROL, 0.0f);
    if (rc == 0)
        rc = mk_vocab_push(v, "<|im_end|>", MK_TT_CONTROL, 0.0f);
    if (rc == 0)
        rc = mk_vocab_push_extra(v, extra, n_extra);
    if (rc == 0 && v->n != n)
        rc = -1;
    return rc;
}
