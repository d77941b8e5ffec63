/* test_gbnf: the GBNF-like grammar front end (accepted syntax; refusals naming line and column),
 * its pushdown matcher (byte strings accepted and refused, UTF-8 classes, the limits), the cache,
 * and token masks over a real 32,000-token vocabulary against a per-token check. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/constrain.h"
#include "engine/gguf.h"
#include "testutil.h"

/* ------------------------------------------------------------------ helpers */

static cons_grammar_t *compile_ok(const char *text)
{
    char err[512] = "";
    cons_grammar_t *g = cons_grammar_compile(text, NULL, err, sizeof err);
    cr_assert_not_null(g, "refused %s: %s", text, err);
    return g;
}

/* Compiles text expecting a refusal whose reason starts with want. */
static void compile_refused(const char *text, int want_code, const char *want)
{
    char err[512] = "";
    int code = 0;
    cons_grammar_t *g = cons_grammar_compile(text, &code, err, sizeof err);
    cr_assert_null(g, "accepted %s", text);
    cr_assert_eq(code, want_code, "%s: code %d (%s)", text, code, err);
    cr_assert(strncmp(err, want, strlen(want)) == 0, "%s: got '%s', want '%s...'", text, err, want);
}

/* Whether doc is accepted whole and complete. */
static int doc_ok(cons_grammar_t *g, const char *doc)
{
    cons_t *c = cons_new_grammar(g, tu_vocab_trie);
    cr_assert_not_null(c);
    int ok = cons_accept_bytes(c, doc, strlen(doc)) == 0 && cons_complete(c);
    cons_free(c);
    return ok;
}

/* The length of the longest prefix of doc the matcher takes, byte by byte. */
static size_t doc_prefix(cons_grammar_t *g, const char *doc)
{
    cons_t *c = cons_new_grammar(g, tu_vocab_trie);
    size_t i = 0;
    while (doc[i] && cons_accept_bytes(c, doc + i, 1) == 0)
        i++;
    cons_free(c);
    return i;
}

static int bit(const uint32_t *bits, int32_t id)
{
    return (int)(bits[id >> 5] >> (id & 31) & 1u);
}

#define ARITH                                                                                      \
    "# integer arithmetic\n"                                                                       \
    "root   ::= expr\n"                                                                            \
    "expr   ::= term ((\"+\" | \"-\") term)*\n"                                                    \
    "term   ::= factor ([*/] factor)*\n"                                                           \
    "factor ::= [0-9]{1,3} | \"(\" expr \")\"\n"

/* ------------------------------------------------------------------ parser */

Test(constrain_gbnf, compiles_the_supported_syntax)
{
    static const char *const ok[] = {
        "root ::= \"yes\" | \"no\"",
        ARITH,
        "root ::= [a-z0-9_]+ \"=\" [^\"\\\\]* # comment\n",
        "root ::= . . ?",
        "root ::= x{2} x{1,} x{0,3} x{,2}\nx ::= \"x\"",
        "root ::= \"\\n\\t\\r\\\\\\\"\\x41\\u00e9\\U0001F600\" [\\[\\]\\-]",
        "root ::= \"é€\" [α-ω]",
        "root ::=\n  \"{\" ws (\n    item (\",\" ws item)*\n  )? \"}\"\nitem ::= [a-z]+\nws ::= "
        "[ ]?\n",
        "root ::= a\n  | b\na ::= \"a\"\nb ::= \"b\"",
        "root ::= \"\"",
        "root ::= list\nlist ::= \"[\" (list | [0-9])* \"]\"",
        "root-rule ::= \"x\"\nroot ::= root-rule",
        "\r\nroot ::= \"a\"\r\n",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        cons_grammar_unref(compile_ok(ok[i]));
}

Test(constrain_gbnf, refuses_malformed_grammars_naming_line_and_column)
{
    compile_refused("root ::= \"abc", CONS_ERR_FORMAT, "line 1 column 10: unterminated string");
    compile_refused("root ::= x\nx ::= [a-z", CONS_ERR_FORMAT,
                    "line 2 column 7: unterminated character class");
    compile_refused("root ::= (\"a\" | \"b\"", CONS_ERR_FORMAT, "line 1 column 10: missing ')'");
    compile_refused("root ::= \"a\")", CONS_ERR_FORMAT, "line 1 column 13: unmatched ')'");
    compile_refused("root = \"a\"", CONS_ERR_FORMAT, "line 1 column 6: expected '::='");
    compile_refused("root ::= \"a\"\n\n  ::= \"b\"", CONS_ERR_FORMAT,
                    "line 3 column 3: expected a rule name");
    compile_refused("root ::= \"a\" x{3,1}\nx ::= \"x\"", CONS_ERR_FORMAT,
                    "line 1 column 15: {3,1}: the maximum is below the minimum");
    compile_refused("root ::= x{a}\nx ::= \"x\"", CONS_ERR_FORMAT,
                    "line 1 column 11: expected {m}");
    compile_refused("root ::= \"\\q\"", CONS_ERR_FORMAT, "line 1 column 11: unknown escape '\\q'");
    compile_refused("root ::= [z-a]", CONS_ERR_FORMAT, "line 1 column 11: range ends before");
    compile_refused("root ::= []", CONS_ERR_FORMAT, "line 1 column 10: empty character class");
    compile_refused("root ::= \"a\" ; \"b\"", CONS_ERR_FORMAT, "line 1 column 14: unexpected ';'");
    compile_refused("root ::= \"a\" b ::= \"b\"", CONS_ERR_FORMAT,
                    "line 1 column 14: the definition of 'b' must start on a new line");
    compile_refused("root ::= \"a\"\nroot ::= \"b\"", CONS_ERR_FORMAT,
                    "line 2 column 1: rule 'root' is defined twice");
    compile_refused("root ::= \"\xff\"", CONS_ERR_FORMAT, "line 1 column 11: invalid UTF-8");
}

Test(constrain_gbnf, refuses_undefined_rules_no_root_and_left_recursion)
{
    compile_refused("root ::= item+\n", CONS_ERR_FORMAT, "line 1 column 10: undefined rule 'item'");
    compile_refused("start ::= \"a\"", CONS_ERR_FORMAT, "the grammar has no 'root' rule");
    compile_refused("root ::= expr\nexpr ::= expr \"+\" [0-9] | [0-9]", CONS_ERR_FORMAT,
                    "line 2 column 1: rule 'expr' is left-recursive");
    compile_refused("root ::= a\na ::= b? \"x\" | \"y\"\nb ::= a \"z\"", CONS_ERR_FORMAT,
                    "line 2 column 1: rule 'a' is left-recursive");
    compile_refused("root ::= (\"a\"?)*", CONS_ERR_FORMAT,
                    "line 1 column 16: the repeated item can match the empty string");
    compile_refused("root ::= x{1000,1001}\nx ::= \"x\"", CONS_ERR_UNSUPPORTED,
                    "line 1 column 11: repetition counts above 1000");
}

/* ------------------------------------------------------------------ matcher */

Test(constrain_gbnf, accepts_what_the_grammar_derives, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    cons_grammar_t *g = compile_ok(ARITH);
    static const char *const good[] = {"1", "12+3", "(1+2)*3", "((7))", "1/2-3*4", "999"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert(doc_ok(g, good[i]), "refused '%s'", good[i]);
    /* bad documents: the length of the prefix taken */
    static const struct {
        const char *doc;
        size_t ok;
    } bad[] = {{"1000", 3}, {"1++2", 2}, {"(1", 2}, {")", 0}, {"1 + 2", 1}, {"a", 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t got = doc_prefix(g, bad[i].doc);
        cr_assert_eq(got, bad[i].ok, "'%s': took %zu bytes, want %zu", bad[i].doc, got, bad[i].ok);
    }
    cr_assert_not(doc_ok(g, "(1"), "an open parenthesis is not complete");
    cr_assert_not(doc_ok(g, ""), "the empty string is not an expression");
    cons_grammar_unref(g);

    g = compile_ok("root ::= (\"yes\" | \"no\") \".\"?");
    cr_assert(doc_ok(g, "yes") && doc_ok(g, "no.") && !doc_ok(g, "ye") && !doc_ok(g, "yes.."));
    cons_grammar_unref(g);

    g = compile_ok("root ::= x{2,4} y{3}\nx ::= \"ab\"\ny ::= [0-9]");
    cr_assert(doc_ok(g, "abab123") && doc_ok(g, "abababab000"));
    cr_assert(!doc_ok(g, "ab123") && !doc_ok(g, "ababababab123") && !doc_ok(g, "abab12"));
    cons_grammar_unref(g);
}

Test(constrain_gbnf, classes_are_utf8_aware, .init = tu_vocab_setup, .fini = tu_vocab_teardown)
{
    cons_grammar_t *g = compile_ok("root ::= [α-ω]+ \"!\" [^\"\\\\]* \"\\\"\" .");
    cr_assert(doc_ok(g, "αβγ!x€😀y\"é"));
    cr_assert_not(doc_ok(g, "a!\"x"), "ASCII is outside [α-ω]");
    cr_assert_eq(doc_prefix(g, "αA"), 2, "A refused right after α");
    /* the first byte of a character outside the class is refused at once */
    cr_assert_eq(doc_prefix(g, "€"), 0);
    /* invalid UTF-8: a lone continuation byte, an overlong form, a surrogate */
    cr_assert_eq(doc_prefix(g, "α!\x80"), 3);
    cr_assert_eq(doc_prefix(g, "α!\xc0\x80"), 3);
    cr_assert_eq(doc_prefix(g, "α!\xed\xa0\x80"), 4); /* at 0xa0: U+D800.. */
    /* . takes any one character, several bytes long or not */
    cr_assert(doc_ok(g, "ω!\"😀"));
    cr_assert_not(doc_ok(g, "ω!\"ab"));
    cons_grammar_unref(g);
}

Test(constrain_gbnf, nesting_past_the_limit_is_refused_not_crashed, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    cons_grammar_t *g = compile_ok("root ::= \"(\" root \")\" | \"x\"");
    char doc[1024];
    memset(doc, '(', 400);
    doc[400] = 0;
    size_t got = doc_prefix(g, doc);
    cr_assert(got > 60 && got < 400, "took %zu of 400 nested parentheses", got);
    memset(doc, '(', 50);
    doc[50] = 'x';
    memset(doc + 51, ')', 50);
    doc[101] = 0;
    cr_assert(doc_ok(g, doc));
    cons_grammar_unref(g);
}

Test(constrain_gbnf, caches_a_grammar_by_its_text)
{
    char err[256];
    cons_cache_t *c = cons_cache_new(4);
    cons_grammar_t *a = cons_cache_get_grammar(c, "root ::= \"a\"", NULL, err, sizeof err);
    cons_grammar_t *b = cons_cache_get_grammar(c, "root ::= \"a\"", NULL, err, sizeof err);
    cr_assert_not_null(a);
    cr_assert_eq(a, b, "the same text compiles once");
    int code = 0;
    cr_assert_null(cons_cache_get_grammar(c, "root ::= (", &code, err, sizeof err));
    cr_assert_eq(code, CONS_ERR_FORMAT);
    uint64_t hits, misses;
    cons_cache_counts(c, &hits, &misses);
    cr_assert_eq(hits, 1);
    cr_assert_eq(misses, 2);
    cons_grammar_unref(a);
    cons_grammar_unref(b);
    cons_cache_free(c);
}

/* ------------------------------------------------------------------ masks */

/* The mask at prefix equals, token by token, whether a fresh matcher at prefix takes the
 * token's bytes. */
static int32_t check_mask_at(cons_grammar_t *g, const char *prefix)
{
    char piece[128];
    cons_t *c = cons_new_grammar(g, tu_vocab_trie), *d = NULL;
    cr_assert_eq(cons_accept_bytes(c, prefix, strlen(prefix)), 0, "prefix '%s'", prefix);
    int32_t n;
    const uint32_t *bits = cons_mask(c, &n);
    int32_t count = 0;
    for (int32_t id = 0; id < cons_vocab_size(tu_vocab_trie); id++) {
        int len = tok_piece(tu_vocab_tok, id, 0, piece, sizeof piece);
        int want;
        if (tok_is_eog(tu_vocab_tok, id))
            want = cons_complete(c);
        else if (len <= 0 || len > 64)
            want = 0;
        else { /* d stays at prefix while it refuses (a refusal leaves it unchanged) */
            if (!d) {
                d = cons_new_grammar(g, tu_vocab_trie);
                cons_accept_bytes(d, prefix, strlen(prefix));
            }
            want = cons_accept_bytes(d, piece, (size_t)len) == 0;
            if (want) {
                cons_free(d);
                d = NULL;
            }
        }
        cr_assert_eq(bit(bits, id), want, "prefix '%s', token %d '%.*s'", prefix, id,
                     len > 0 ? len : 0, piece);
        count += want;
    }
    cr_assert_eq(n, count, "prefix '%s': count", prefix);
    cr_assert_gt(n, 0, "prefix '%s': a dead end", prefix);
    cons_free(c);
    cons_free(d);
    return n;
}

Test(constrain_gbnf, masks_agree_with_the_matcher_on_a_real_vocabulary, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown, .timeout = 120)
{
    cr_assert_eq(cons_vocab_size(tu_vocab_trie), 32000);
    cons_grammar_t *g = compile_ok(ARITH);
    static const char *const arith[] = {"", "1", "12", "(3+", "((1*2)"};
    for (size_t i = 0; i < sizeof arith / sizeof arith[0]; i++)
        cr_assert_lt(check_mask_at(g, arith[i]), 2000, "few tokens are arithmetic");
    cons_grammar_unref(g);
    g = compile_ok("root ::= \"say \\\"\" [^\"\\\\]* \"\\\" \" (\"yes\" | \"no\")");
    static const char *const str[] = {"", "say \"", "say \"hé", "say \"\xe2\x82", "say \"x\" y"};
    for (size_t i = 0; i < sizeof str / sizeof str[0]; i++) {
        int32_t n = check_mask_at(g, str[i]);
        cr_assert(i == 0 || i >= 3 || n > 10000, "'%s': %d tokens go in a string", str[i], n);
    }
    cons_grammar_unref(g);
}

Test(constrain_gbnf, random_walks_over_the_mask_end_in_the_language, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown, .timeout = 120)
{
    cons_grammar_t *g = compile_ok(ARITH);
    srand(7);
    for (int walk = 0; walk < 20; walk++) {
        cons_t *c = cons_new_grammar(g, tu_vocab_trie);
        char out[4096];
        size_t len = 0;
        for (int step = 0; step < 200; step++) {
            int32_t n;
            const uint32_t *bits = cons_mask(c, &n);
            cr_assert_gt(n, 0, "walk %d: a dead end after '%.*s'", walk, (int)len, out);
            int32_t pick = rand() % n, id = -1;
            for (id = 0; id < cons_vocab_size(tu_vocab_trie); id++)
                if (bit(bits, id) && pick-- == 0)
                    break;
            cr_assert_eq(cons_accept(c, id), 0);
            if (tok_is_eog(tu_vocab_tok, id))
                break;
            int k = tok_piece(tu_vocab_tok, id, 0, out + len, sizeof out - len);
            len += k > 0 ? (size_t)k : 0;
        }
        out[len] = 0;
        if (cons_complete(c))
            cr_assert(doc_ok(g, out), "walk %d: '%s'", walk, out);
        cons_free(c);
    }
    cons_grammar_unref(g);
}
