/* tu_vocab: the real 32,000-token SPM vocabulary of tests/data and its trie, shared by the
 * constrained-decoding tests (test_constrain for schemas, test_gbnf for grammars). */
#include <criterion/criterion.h>

#include "engine/constrain.h"
#include "engine/gguf.h"
#include "testutil.h"

tok_t *tu_vocab_tok;
cons_vocab_t *tu_vocab_trie;

void tu_vocab_setup(void)
{
    tok_t **tok = &tu_vocab_tok;
    cons_vocab_t **vocab = &tu_vocab_trie;
    char path[1024], err[256] = "";
    tu_data_path(path, sizeof path, "ggml-vocab-llama-spm.gguf");
    gguf_t *g = gguf_open(path, err, sizeof err);
    cr_assert_not_null(g, "gguf_open(%s): %s", path, err);
    *tok = tok_open(g, err, sizeof err);
    gguf_close(g);
    cr_assert_not_null(*tok, "tok_open: %s", err);
    *vocab = cons_vocab_new(*tok, err, sizeof err);
    cr_assert_not_null(*vocab, "cons_vocab_new: %s", err);
}

void tu_vocab_teardown(void)
{
    cons_vocab_free(tu_vocab_trie);
    tok_close(tu_vocab_tok);
    tu_vocab_trie = NULL;
    tu_vocab_tok = NULL;
}
