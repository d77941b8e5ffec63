/* constrain: output that follows a JSON schema (response_format json_object / json_schema) or a
 * GBNF-like grammar (the grammar field): compiled once into a byte automaton, and per decode step
 * the set of vocabulary tokens that keep the output a prefix of a valid document
 * (docs/CONSTRAINED.md). */
#ifndef CONSTRAIN_H
#define CONSTRAIN_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

enum {
    CONS_OK = 0,
    CONS_ERR_FORMAT = -1,      /* response_format malformed (not an object, no schema...), or a
                                  grammar that does not parse (err names line and column) */
    CONS_ERR_UNSUPPORTED = -2, /* a schema part it cannot enforce; err names its JSON pointer */
    CONS_ERR_NOMEM = -3,
};

/* A compiled schema: immutable once built, shared by reference count. */
typedef struct cons_schema cons_schema_t;
/* A compiled grammar: immutable once built, shared by reference count. */
typedef struct cons_grammar cons_grammar_t;
/* The vocabulary as a byte trie, built once per tokenizer; immutable, read by any thread. */
typedef struct cons_vocab cons_vocab_t;
/* One sequence's matcher: where it stands in the document and its mask buffer. */
typedef struct cons cons_t;
/* Compiled schemas by the hash of their canonical text (locked inside). */
typedef struct cons_cache cons_cache_t;

/* Compiles a response_format object ({"type": "json_object"} or {"type": "json_schema",
 * "json_schema": {"schema": {...}}}). NULL with the reason in err (and *code set to a CONS_ERR_*
 * when code is not NULL): a refused schema's reason starts with the JSON pointer of the part
 * ("/properties/when/format: keyword 'format' is not supported"). {"type": "text"} is a
 * CONS_ERR_FORMAT here: the caller leaves such requests unconstrained. Caller unrefs. */
cons_schema_t *cons_schema_compile(const json_t *response_format, int *code, char *err,
                                   size_t errlen);
cons_schema_t *cons_schema_ref(cons_schema_t *sc);
void cons_schema_unref(cons_schema_t *sc); /* accepts NULL */

/* Compiles a GBNF-like grammar (docs/CONSTRAINED.md: rules `name ::= ...`, the start rule
 * `root`). NULL with the reason in err (and *code set when code is not NULL): CONS_ERR_FORMAT for
 * a syntax error ("line 2 column 9: unterminated string literal"), an undefined rule, no root or
 * left recursion; CONS_ERR_UNSUPPORTED past a limit. Caller unrefs. */
cons_grammar_t *cons_grammar_compile(const char *text, int *code, char *err, size_t errlen);
cons_grammar_t *cons_grammar_ref(cons_grammar_t *g);
void cons_grammar_unref(cons_grammar_t *g); /* accepts NULL */

/* A cache of at most cap compiled schemas (oldest dropped first). NULL on OOM. */
cons_cache_t *cons_cache_new(size_t cap);
void cons_cache_free(cons_cache_t *c); /* accepts NULL; entries in use live on by their refs */
/* cons_schema_compile through the cache: the same canonical text (keys sorted, compact) compiles
 * once. Returns a new reference (caller unrefs) or NULL as cons_schema_compile. Thread-safe. */
cons_schema_t *cons_cache_get(cons_cache_t *c, const json_t *response_format, int *code, char *err,
                              size_t errlen);
/* cons_grammar_compile through the same cache (keyed apart from schemas). Thread-safe. */
cons_grammar_t *cons_cache_get_grammar(cons_cache_t *c, const char *text, int *code, char *err,
                                       size_t errlen);
/* Lookups that found a compiled schema / that compiled one. */
void cons_cache_counts(cons_cache_t *c, uint64_t *hits, uint64_t *misses);

/* The trie of t's token bytes (tok_piece without special text; tokens over 64 bytes and tokens
 * with no bytes are never allowed, end-of-generation tokens only once the document is complete).
 * NULL with a reason on failure. Caller frees with cons_vocab_free. */
cons_vocab_t *cons_vocab_new(const tok_t *t, char *err, size_t errlen);
void cons_vocab_free(cons_vocab_t *v); /* accepts NULL */
int32_t cons_vocab_size(const cons_vocab_t *v);
/* Nodes of the trie (its size; for the docs and tests). */
size_t cons_vocab_nodes(const cons_vocab_t *v);

/* A matcher at the start of a document of sc over v (both must outlive it; it takes a reference
 * to sc). NULL on OOM. Caller frees with cons_free. */
cons_t *cons_new(cons_schema_t *sc, const cons_vocab_t *v);
/* The same for a document of grammar g (it takes a reference to g). */
cons_t *cons_new_grammar(cons_grammar_t *g, const cons_vocab_t *v);
/* A matcher of one or more documents of sc, each followed by the text after and the next one
 * after the text between: doc after (between doc after)*, complete after each `after` (several
 * forced Hermes-style tool calls: after "\n</tool_call>", between "\n<tool_call>\n"). The texts
 * are written by tokens of their own (a token that spans a document's end and them is not
 * offered); between must hold a byte that no complete document may be followed by, and they are
 * 1..63 bytes together. NULL when they are not, or on OOM. Caller frees with cons_free. */
cons_t *cons_new_repeat(cons_schema_t *sc, const cons_vocab_t *v, const char *after,
                        const char *between);
/* Lets the n tokens ids, tokens without bytes in v (control tokens), be written as texts[k] where
 * a cons_new_repeat matcher's after/between holds that text, never inside a document (a
 * vocabulary's control-token tool-call markers); other ids are left out. 0, or -1 on OOM. */
int cons_allow_tokens(cons_t *c, const int32_t *ids, const char *const *texts, size_t n);
void cons_free(cons_t *c); /* accepts NULL */
/* The allowed tokens now, as a bit set of ceil(n_vocab / 32) words (bit id % 32 of word id / 32),
 * owned by c and valid until the next call; *n_allowed gets their count when not NULL. */
const uint32_t *cons_mask(cons_t *c, int32_t *n_allowed);
/* cons_mask, then logits of every disallowed token set to -INFINITY (n_vocab logits). Returns the
 * number of allowed tokens (0: a dead end, which a well-formed schema over a vocabulary holding
 * every byte never reaches). */
int32_t cons_mask_logits(cons_t *c, float *logits);
/* Advances by token id: 0, or -1 when the token is not allowed (c is then unchanged). An
 * end-of-generation token is accepted only when the document is complete. */
int cons_accept(cons_t *c, int32_t id);
/* Advances by raw bytes (tests, and text the caller forces): 0, or -1 at the first byte that
 * cannot follow (c is then unchanged). */
int cons_accept_bytes(cons_t *c, const char *bytes, size_t n);
/* 1 when what was accepted so far is a complete document. */
int cons_complete(const cons_t *c);

#endif
