/* tokenizer_int: what the tokenizer's files share (tokenizer.c, tok_common.c, tok_spm.c, tok_bpe.c): the tok_t fields, the hash map, the encoding scratch and the helpers each file offers those above it; not for other modules. */
#ifndef TOKENIZER_INT_H
#define TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

#define TOK_MAX_TEXT 65536u      /* longest accepted token / merge text, bytes */
#define TOK_MAX_INPUT (1u << 28) /* longest accepted tok_encode input, bytes */
#define TOK_NONE (-1)

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

/* ------------------------------------------------------------------ BPE pre-tokenizers */

#define TOK_PRE_MAX_RE 6 /* patterns per row */

enum {
    TOK_PRE_IGNORE_MERGES = 1u << 0, /* a pre-token that is a whole token is not merged */
    TOK_PRE_ADD_BOS = 1u << 1,       /* BOS by default (add_bos_token still overrides) */
};

typedef struct tok_pre_def {
    const char *names;              /* tokenizer.ggml.pre values, separated by spaces */
    const char *re[TOK_PRE_MAX_RE]; /* patterns in order; unused slots NULL */
    unsigned flags;                 /* TOK_PRE_* */
} tok_pre_def_t;

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
    int32_t fim[3];                       /* fill-in-the-middle prefix, suffix, middle; -1 = none */
    int add_bos;
    int add_space_prefix;
    int ignore_merges;              /* BPE: a pre-token that is a whole token is not merged */
    const tok_pre_def_t *pre;       /* BPE pre-tokenizer */
    pcre2_code *re[TOK_PRE_MAX_RE]; /* its compiled patterns (n_re) */
    size_t n_re;
};

/* ------------------------------------------------------------------ encoding scratch */

typedef struct tok_out {
    int32_t *ids; /* caller's buffer (cap) */
    size_t cap;
    size_t n; /* ids produced, may exceed cap */
} tok_out_t;

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

/* ------------------------------------------------------------------ tok_common.c */

void tok_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int tok_map_init(tok_map_t *m, size_t n);
void tok_map_free(tok_map_t *m);
/* Insert key -> val; an existing key keeps its value unless overwrite is set.
 * The map was sized for all inserts at init, so this cannot fail. */
void tok_map_put(tok_map_t *m, const char *s, size_t n, int32_t val, int overwrite);
/* The value of key s[0..n), or TOK_NONE. */
int32_t tok_map_get(const tok_map_t *m, const char *s, size_t n);
/* Length of a UTF-8 sequence from its lead byte (continuation and invalid bytes count as 1). */
size_t tok_utf8_len(unsigned char c);
/* Writes cp as UTF-8 into out (4 bytes of room); returns the bytes written. */
size_t tok_utf8_put(char *out, uint32_t cp);
/* Decode one (possibly invalid) UTF-8 character of s[0..n); *cp = -1 when
 * invalid. Returns the bytes consumed (>= 1). */
size_t tok_utf8_get(const char *s, size_t n, int32_t *cp);
/* GPT-2 bytes_to_unicode(): the byte-level character of byte b. */
uint32_t tok_byte_to_cp(unsigned b);
/* Inverse of tok_byte_to_cp; -1 if cp is not a byte-level character. */
int tok_cp_to_byte(int32_t cp);
void tok_out_push(tok_out_t *o, int32_t id);
/* Grows *p (*cap elements of elem bytes) to hold need; 0 or TOK_ERR_NOMEM. */
int tok_reserve(void **p, size_t *cap, size_t need, size_t elem);
/* Merges w->buf[0..len) greedily (SPM scores, BPE ranks); the symbol count or a negative error. */
int tok_merge(const tok_t *t, tok_work_t *w, size_t len);

/* ------------------------------------------------------------------ tok_spm.c */

/* Parse "<0xNN>" (either hex case); -1 if the text is not of that form. */
int tok_parse_byte_token(const char *s, size_t n);
/* Encodes one raw fragment s[0..n) (with the space prefix when prefix is set) into o. */
int tok_encode_spm(const tok_t *t, tok_work_t *w, const char *s, size_t n, int prefix,
                   tok_out_t *o);

/* ------------------------------------------------------------------ tok_bpe.c */

/* Reads tokenizer.ggml.merges into t->merges. */
int tok_load_merges(tok_t *t, const gguf_t *g, char *err, size_t errlen);
/* Looks tokenizer.ggml.pre up in the pre-tokenizer table and compiles its patterns. */
int tok_compile_pre(tok_t *t, const gguf_t *g, char *err, size_t errlen);
/* Pre-tokenizes one raw fragment s[0..n) and merges each pre-token into o. */
int tok_encode_bpe(const tok_t *t, tok_work_t *w, const char *s, size_t n, tok_out_t *o);

#endif
