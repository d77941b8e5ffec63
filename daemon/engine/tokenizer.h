/* tokenizer: text <-> token ids from GGUF metadata (SentencePiece "llama" and GPT-2 byte-level BPE "gpt2" with llama.cpp's pre-tokenizers). */
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"

typedef struct tok tok_t;

typedef enum tok_kind {
    TOK_KIND_SPM = 1, /* tokenizer.ggml.model = "llama" */
    TOK_KIND_BPE = 2, /* tokenizer.ggml.model = "gpt2" */
} tok_kind_t;

/* Token types (tokenizer.ggml.token_type). */
enum {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

enum {
    TOK_OK = 0,
    TOK_ERR_FORMAT = -1, /* metadata missing or inconsistent */
    TOK_ERR_NOMEM = -2,
    TOK_ERR_RANGE = -3, /* output buffer too small / id out of range */
    TOK_ERR_UNSUPPORTED = -4,
};

/* Build from the GGUF's tokenizer.* metadata. The tok_t copies what it needs
 * and does not keep g. NULL + reason in err on failure (missing or mistyped
 * arrays, lengths that differ, ids out of range, empty tokens, an unknown
 * model or tokenizer.ggml.pre). Caller frees with tok_close. */
tok_t *tok_open(const gguf_t *g, char *err, size_t errlen);
void tok_close(tok_t *t); /* accepts NULL */

tok_kind_t tok_kind(const tok_t *t);
int32_t tok_vocab_size(const tok_t *t);
int32_t tok_bos(const tok_t *t); /* -1 if none */
int32_t tok_eos(const tok_t *t); /* -1 if none */
int tok_add_bos(const tok_t *t); /* whether a prompt gets BOS by default */
/* End of generation, as llama.cpp (c392e50) decides it: EOS,
 * tokenizer.ggml.eot_token_id / eom_token_id, the tokens "<|eot_id|>",
 * "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
 * "<EOT>" (which become CONTROL, whatever the file says, as in llama.cpp) and
 * the FIM pad/repo/file-separator tokens. */
int tok_is_eog(const tok_t *t, int32_t id);
int tok_type(const tok_t *t, int32_t id);
/* Token text as stored in the vocabulary (NUL-terminated, owned by t). */
const char *tok_text(const tok_t *t, int32_t id);
/* Find a token by exact text; -1 if absent. */
int32_t tok_find(const tok_t *t, const char *text);
/* The fill-in-the-middle tokens, prefix, suffix and middle, into ids[0..2]
 * (from the tokenizer.ggml.fim_{pre,suf,mid}_token_id keys, else by the texts
 * of Qwen2.5-Coder, StarCoder, CodeLlama and DeepSeek-Coder); 0, or -1 when
 * the vocabulary has no such three. */
int tok_fim(const tok_t *t, int32_t ids[3]);

/* Tokenize len bytes of UTF-8 text into ids (capacity cap). add_bos adds BOS
 * when the vocabulary has one; parse_special turns special-token text
 * (control/unknown tokens like "<s>", "<|im_start|>") into those tokens.
 * As in llama.cpp and Hugging Face, USER_DEFINED tokens' text is always
 * matched, parse_special or not; longer special texts are matched first.
 * Phi-3 vocabularies (by general.name) drop the whitespace after most
 * special tokens, as llama.cpp does. SPM adds the "▁" space prefix (when add_space_prefix) to the text at the
 * start and to text right after a special token, as llama.cpp does.
 * Thread-safe: t is only read. Returns the number of ids (which may exceed
 * cap: then only cap were written and the caller retries with a bigger
 * buffer), or a negative TOK_ERR_*. */
int tok_encode(const tok_t *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t *ids, size_t cap);

/* The bytes one token stands for (SPM: "▁" -> " ", <0xNN> -> byte; BPE: the
 * byte-level mapping undone; control and unknown tokens -> "" unless special
 * is set; user-defined tokens -> their text; unused tokens -> "").
 * Writes up to cap bytes (NUL-terminated when the length is below cap; buf
 * may be NULL with cap 0 to ask the length); returns the full length or
 * TOK_ERR_RANGE for a bad id. */
int tok_piece(const tok_t *t, int32_t id, int special, char *buf, size_t cap);

/* Streaming detokenizer: feeds ids, emits only complete UTF-8 characters. */
typedef struct tok_stream {
    const tok_t *t;
    unsigned char pending[8]; /* bytes of an incomplete UTF-8 sequence */
    size_t npending;
    int special; /* render control tokens' text */
} tok_stream_t;

void tok_stream_init(tok_stream_t *s, const tok_t *t, int special);
/* Write the text of id at out (cap bytes, NUL-terminated; the caller appends
 * it to its output); returns bytes written (excluding NUL) or negative on
 * error (bad id; TOK_ERR_RANGE when out is too small, and then s is left
 * unchanged so the call can be retried). Incomplete UTF-8 is held back
 * until completed; an invalid sequence is emitted as one U+FFFD per maximal
 * invalid prefix (as the Unicode standard recommends). */
int tok_stream_feed(tok_stream_t *s, int32_t id, char *out, size_t cap);
/* Flush what is still held back (as U+FFFD for an incomplete tail). */
int tok_stream_flush(tok_stream_t *s, char *out, size_t cap);

#endif
