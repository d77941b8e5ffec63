/* Unit tests for the tokenizer: llama.cpp reference vocabularies, hand-built SPM and GPT-2 BPE vocabularies, streaming, hostile metadata. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "ggufw.h"
#include "testutil.h"
#include "engine/tokenizer.h"

/* ------------------------------------------------------------------ helpers */

#define SEP "\n__ggml_vocab_test__\n"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
            buf[n] = '\0';
            *len = (size_t)n;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

/* Opens a reference vocabulary of tests/data (see tu_data_path for a missing file). */
static tok_t *open_model(const char *name)
{
    char path[1024], err[256] = "";
    gguf_t *g;
    tok_t *t;

    tu_data_path(path, sizeof path, name);
    g = gguf_open(path, err, sizeof err);
    cr_assert_not_null(g, "gguf_open(%s): %s", path, err);
    t = tok_open(g, err, sizeof err);
    gguf_close(g);
    cr_assert_not_null(t, "tok_open(%s): %s", path, err);
    return t;
}

/* Encodes into a malloc'ed array (caller frees); *n = count. */
static int32_t *encode(const tok_t *t, const char *s, size_t len, int add_bos, int special, int *n)
{
    int32_t *ids = malloc((len + 8) * sizeof *ids);
    cr_assert_not_null(ids);
    *n = tok_encode(t, s, len, add_bos, special, ids, len + 8);
    cr_assert_geq(*n, 0, "tok_encode failed: %d", *n);
    cr_assert_leq((size_t)*n, len + 8);
    return ids;
}

static void fmt_ids(char *out, size_t cap, const int32_t *ids, int n)
{
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < n && o + 16 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, " %d", (int)ids[i]);
    if (o + 16 >= cap)
        snprintf(out + o, cap - o, " ...");
}

/* Concatenated pieces (special = 0) into a malloc'ed NUL-terminated string. */
static char *decode(const tok_t *t, const int32_t *ids, int n, size_t *len)
{
    size_t cap = 64, o = 0;
    char *s = malloc(cap);
    cr_assert_not_null(s);
    for (int i = 0; i < n; i++) {
        int k = tok_piece(t, ids[i], 0, NULL, 0);
        cr_assert_geq(k, 0);
        while (o + (size_t)k + 1 > cap)
            s = realloc(s, cap *= 2);
        cr_assert_eq(tok_piece(t, ids[i], 0, s + o, cap - o), k);
        o += (size_t)k;
    }
    s[o] = '\0';
    *len = o;
    return s;
}

static void expect_ids(const tok_t *t, const char *s, int special, const int32_t *want, int nwant)
{
    char a[1024], b[1024];
    int n;
    int32_t *ids = encode(t, s, strlen(s), 0, special, &n);
    int same = n == nwant && memcmp(ids, want, (size_t)n * sizeof *ids) == 0;

    fmt_ids(a, sizeof a, ids, n);
    fmt_ids(b, sizeof b, want, nwant);
    free(ids);
    cr_assert(same, "\"%s\": got [%s ] want [%s ]", s, a, b);
}

#define EXPECT(t, s, special, ...)                                                                 \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids((t), (s), (special), want_, (int)(sizeof want_ / sizeof want_[0]));             \
    } while (0)

/* Id of a token that must exist. */
static int32_t id_of(const tok_t *t, const char *text)
{
    int32_t id = tok_find(t, text);
    cr_assert_geq(id, 0, "token \"%s\" not in vocabulary", text);
    return id;
}

/* ------------------------------------------------------------------ reference vocabularies */

/* Tokenizes every .inp string (no BOS, specials not parsed) and compares
 * with the .out line; then checks that the ids decode back to the string. */
static void check_reference(const char *name)
{
    char path[1024];
    size_t inlen = 0, outlen = 0, pos = 0, opos = 0;
    char *inp, *out;
    tok_t *t = open_model(name);
    int spm = tok_kind(t) == TOK_KIND_SPM;
    int k = 0;

    {
        char p2[1024];
        snprintf(p2, sizeof p2, "%s.inp", name);
        tu_data_path(path, sizeof path, p2);
        inp = read_all(path, &inlen);
        cr_assert_not_null(inp, "%s: cannot read", path);
        snprintf(p2, sizeof p2, "%s.out", name);
        tu_data_path(path, sizeof path, p2);
        out = read_all(path, &outlen);
        cr_assert_not_null(out, "%s: cannot read", path);
    }

    while (pos < inlen) {
        const char *sep = memmem(inp + pos, inlen - pos, SEP, strlen(SEP));
        const char *s = inp + pos;
        size_t slen, dlen;
        int32_t want[4096];
        int nwant = 0, n;
        int32_t *ids;
        char *line, *end, *dec;
        char a[2048], b[2048];

        cr_assert_not_null(sep, "%s.inp: string %d has no separator", name, k);
        slen = (size_t)(sep - s);
        pos += slen + strlen(SEP);

        cr_assert_lt(opos, outlen + 1, "%s.out: no line for string %d", name, k);
        line = out + opos;
        end = memchr(line, '\n', outlen - opos);
        if (!end)
            end = out + outlen;
        *end = '\0';
        opos = (size_t)(end - out) + 1;
        for (char *p = line; *p;) {
            char *q;
            long v = strtol(p, &q, 10);
            if (q == p)
                break;
            cr_assert_lt(nwant, 4096);
            want[nwant++] = (int32_t)v;
            p = q;
        }

        ids = encode(t, s, slen, 0, 0, &n);
        fmt_ids(a, sizeof a, ids, n);
        fmt_ids(b, sizeof b, want, nwant);
        cr_assert(n == nwant && memcmp(ids, want, (size_t)n * sizeof *ids) == 0,
                  "%s string %d \"%.*s\":\n got [%s ]\nwant [%s ]", name, k, (int)slen, s, a, b);

        /* round trip: SentencePiece's space prefix is the only difference */
        dec = decode(t, ids, n, &dlen);
        if (spm && dlen > 0 && dec[0] == ' ') {
            memmove(dec, dec + 1, dlen);
            dlen--;
        }
        cr_assert(dlen == slen && memcmp(dec, s, slen) == 0,
                  "%s string %d: decoded \"%s\" want \"%.*s\"", name, k, dec, (int)slen, s);

        /* the streaming decoder gives the same text for valid UTF-8 */
        {
            tok_stream_t st;
            char buf[256], acc[8192];
            size_t alen = 0;
            tok_stream_init(&st, t, 0);
            for (int i = 0; i < n; i++) {
                int r = tok_stream_feed(&st, ids[i], buf, sizeof buf);
                cr_assert_geq(r, 0);
                cr_assert_lt(alen + (size_t)r, sizeof acc);
                memcpy(acc + alen, buf, (size_t)r);
                alen += (size_t)r;
            }
            cr_assert_eq(tok_stream_flush(&st, buf, sizeof buf), 0);
            cr_assert(alen > 0 || n == 0);
            if (spm && alen > 0 && acc[0] == ' ')
                memmove(acc, acc + 1, --alen);
            cr_assert(alen == slen && memcmp(acc, s, slen) == 0,
                      "%s string %d: streamed text differs", name, k);
        }
        free(dec);
        free(ids);
        k++;
    }
    cr_assert_eq(k, 46, "%s.inp: %d strings", name, k);
    cr_assert_geq(opos, outlen, "%s.out has more lines than strings", name);
    free(inp);
    free(out);
    tok_close(t);
}

Test(tokenizer, llama_spm_vocab_matches_every_reference_line_and_round_trips, .timeout = 60)
{
    check_reference("ggml-vocab-llama-spm.gguf");
}

Test(tokenizer, stories260k_vocab_matches_every_reference_line_and_round_trips, .timeout = 60)
{
    check_reference("stories260K.gguf");
}

Test(tokenizer, gpt2_bpe_vocab_matches_every_reference_line_and_round_trips, .timeout = 60)
{
    check_reference("vocab/ggml-vocab-gpt-2.gguf");
}

Test(tokenizer, deepseek_llm_bpe_vocab_matches_every_reference_line_and_round_trips, .timeout = 60)
{
    check_reference("vocab/ggml-vocab-deepseek-llm.gguf");
}

Test(tokenizer, starcoder_bpe_vocab_matches_every_reference_line_and_round_trips, .timeout = 60)
{
    check_reference("vocab/ggml-vocab-starcoder.gguf");
}

Test(tokenizer, llama_spm_vocab_reports_its_special_tokens)
{
    tok_t *t = open_model("ggml-vocab-llama-spm.gguf");

    cr_assert_eq(tok_kind(t), TOK_KIND_SPM);
    cr_assert_eq(tok_vocab_size(t), 32000);
    cr_assert_eq(tok_bos(t), 1);
    cr_assert_eq(tok_eos(t), 2);
    cr_assert(tok_add_bos(t));
    cr_assert(tok_is_eog(t, 2));
    cr_assert(!tok_is_eog(t, 1));
    cr_assert_eq(tok_type(t, 1), TOK_TYPE_CONTROL);
    cr_assert_eq(tok_type(t, 3), TOK_TYPE_BYTE);
    cr_assert_str_eq(tok_text(t, 1), "<s>");
    cr_assert_eq(tok_find(t, "</s>"), 2);
    cr_assert_eq(tok_find(t, "\xE2\x96\x81Hello"), 15043);
    cr_assert_eq(tok_find(t, "no such token"), -1);
    tok_close(t);
}

Test(tokenizer, llama_spm_special_text_becomes_control_tokens_only_when_asked)
{
    tok_t *t = open_model("ggml-vocab-llama-spm.gguf");
    int n;
    int32_t *ids;

    EXPECT(t, "<s>Hello", 1, 1, 15043); /* the space prefix follows a special token */
    EXPECT(t, "Hello</s>", 1, 15043, 2);
    ids = encode(t, "<s>Hello", 8, 0, 0, &n);
    for (int i = 0; i < n; i++)
        cr_assert_neq(ids[i], 1, "\"<s>\" parsed as BOS without parse_special");
    free(ids);
    ids = encode(t, "Hello", 5, 1, 0, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[1], 15043);
    free(ids);
    tok_close(t);
}

Test(tokenizer, stories260k_prompt_with_bos_matches_llama_cpp)
{
    tok_t *t = open_model("stories260K.gguf");
    int n;
    int32_t *ids = encode(t, "Once upon a time", 16, tok_add_bos(t), 1, &n);
    const int32_t want[] = {1, 403, 407, 261, 378};

    cr_assert_eq(n, 5);
    cr_assert_arr_eq(ids, want, sizeof want);
    free(ids);
    tok_close(t);
}

Test(tokenizer, encoding_100kb_of_text_is_fast, .timeout = 20)
{
    tok_t *t = open_model("ggml-vocab-llama-spm.gguf");
    const char *para =
        "The quick brown fox jumps over the lazy dog; 1234567 \xE4\xB8\x96\xE7\x95\x8C!\n";
    size_t pl = strlen(para), len = 0, cap = 100 * 1024;
    char *text = malloc(cap + pl);
    int n;
    int32_t *ids;

    while (len < cap) {
        memcpy(text + len, para, pl);
        len += pl;
    }
    ids = encode(t, text, len, 1, 1, &n);
    cr_assert_gt(n, (int)(len / 8));
    free(ids);
    free(text);
    tok_close(t);
}

/* ------------------------------------------------------------------ hand-built vocabularies */

#define TV_MAX 1024

typedef struct tv {
    char *text[TV_MAX];
    float score[TV_MAX];
    int32_t type[TV_MAX];
    size_t n;
    char *merge[256];
    size_t nmerge;
} tv_t;

enum {
    TV_OMIT_TOKENS = 1 << 0,
    TV_OMIT_SCORES = 1 << 1,
    TV_OMIT_TYPES = 1 << 2,
    TV_OMIT_MERGES = 1 << 3,
    TV_SHORT_SCORES = 1 << 4,
    TV_SHORT_TYPES = 1 << 5,
    TV_TOKENS_AS_I32 = 1 << 6,
};

static int32_t tv_add(tv_t *v, const char *text, float score, int32_t type)
{
    cr_assert_lt(v->n, TV_MAX);
    v->text[v->n] = strdup(text);
    v->score[v->n] = score;
    v->type[v->n] = type;
    return (int32_t)v->n++;
}

static void tv_merge(tv_t *v, const char *m)
{
    cr_assert_lt(v->nmerge, 256);
    v->merge[v->nmerge++] = strdup(m);
}

static void tv_free(tv_t *v)
{
    for (size_t i = 0; i < v->n; i++)
        free(v->text[i]);
    for (size_t i = 0; i < v->nmerge; i++)
        free(v->merge[i]);
    free(v);
}

typedef void (*tv_extra_fn)(ggufw_t *w);

/* Writes v with ggufw, opens it in memory and builds a tokenizer from it;
 * NULL with the reason in err if tok_open refuses. */
static tok_t *tv_open(const tv_t *v, const char *model, const char *pre, unsigned flags,
                      tv_extra_fn extra, char *err, size_t errlen)
{
    ggufw_t *w = ggufw_new(3, 0);
    uint8_t *buf = NULL;
    size_t len = 0;
    gguf_t *g;
    tok_t *t;
    char gerr[256] = "";
    size_t n = v->n;

    cr_assert_not_null(w);
    cr_assert_eq(ggufw_kv_str(w, "general.architecture", "llama"), 0);
    if (model)
        cr_assert_eq(ggufw_kv_str(w, "tokenizer.ggml.model", model), 0);
    if (pre)
        cr_assert_eq(ggufw_kv_str(w, "tokenizer.ggml.pre", pre), 0);
    if (flags & TV_TOKENS_AS_I32)
        cr_assert_eq(ggufw_kv_arr_i32(w, "tokenizer.ggml.tokens", v->type, n), 0);
    else if (!(flags & TV_OMIT_TOKENS))
        cr_assert_eq(ggufw_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->text, n),
                     0);
    if (!(flags & TV_OMIT_SCORES))
        cr_assert_eq(ggufw_kv_arr_f32(w, "tokenizer.ggml.scores", v->score,
                                      (flags & TV_SHORT_SCORES) ? n - 1 : n),
                     0);
    if (!(flags & TV_OMIT_TYPES))
        cr_assert_eq(ggufw_kv_arr_i32(w, "tokenizer.ggml.token_type", v->type,
                                      (flags & TV_SHORT_TYPES) ? n - 1 : n),
                     0);
    if (!(flags & TV_OMIT_MERGES) && model && strcmp(model, "gpt2") == 0)
        cr_assert_eq(
            ggufw_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merge, v->nmerge),
            0);
    if (extra)
        extra(w);
    cr_assert_eq(ggufw_write_mem(w, &buf, &len), 0);
    ggufw_free(w);
    g = gguf_open_mem(buf, len, "test-vocab", gerr, sizeof gerr);
    cr_assert_not_null(g, "gguf_open_mem: %s", gerr);
    t = tok_open(g, err, errlen);
    gguf_close(g);
    free(buf);
    return t;
}

/* ---- SentencePiece toy vocabulary */

#define U2581 "\xE2\x96\x81"

enum {
    SPM_UNK = 0,
    SPM_BOS = 1,
    SPM_EOS = 2,
    SPM_BYTE0 = 3,
    SPM_SP = 259
};

static tv_t *spm_vocab(void)
{
    tv_t *v = calloc(1, sizeof *v);
    static const struct {
        const char *text;
        float score;
    } pieces[] = {
        {U2581, -1},      {"h", -1},   {"e", -1},           {"l", -1},  {"o", -1},
        {"x", -1},        {"y", -1},   {"z", -1},           {"ll", -2}, {U2581 "h", -3},
        {U2581 "he", -4}, {"llo", -5}, {U2581 "hello", -6}, {"xy", -3}, {"yz", -2},
    };

    cr_assert_not_null(v);
    tv_add(v, "<unk>", 0, TOK_TYPE_UNKNOWN);
    tv_add(v, "<s>", 0, TOK_TYPE_CONTROL);
    tv_add(v, "</s>", 0, TOK_TYPE_CONTROL);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        tv_add(v, s, 0, TOK_TYPE_BYTE);
    }
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        tv_add(v, pieces[i].text, pieces[i].score, TOK_TYPE_NORMAL);
    tv_add(v, "<tool>", 0, TOK_TYPE_USER_DEFINED);
    return v;
}

static void spm_ids(ggufw_t *w)
{
    ggufw_kv_u32(w, "tokenizer.ggml.bos_token_id", SPM_BOS);
    ggufw_kv_u32(w, "tokenizer.ggml.eos_token_id", SPM_EOS);
    ggufw_kv_u32(w, "tokenizer.ggml.unknown_token_id", SPM_UNK);
    ggufw_kv_u32(w, "tokenizer.ggml.padding_token_id", 4294967295u);
}

static void spm_no_space_prefix(ggufw_t *w)
{
    spm_ids(w);
    ggufw_kv_bool(w, "tokenizer.ggml.add_space_prefix", 0);
}

static tok_t *spm_open(tv_extra_fn extra)
{
    char err[256] = "";
    tv_t *v = spm_vocab();
    tok_t *t = tv_open(v, "llama", NULL, 0, extra ? extra : spm_ids, err, sizeof err);
    tv_free(v);
    cr_assert_not_null(t, "tok_open: %s", err);
    return t;
}

Test(tokenizer, spm_merges_the_highest_scoring_pair_first)
{
    tok_t *t = spm_open(NULL);

    EXPECT(t, "hello", 0, id_of(t, U2581 "hello"));
    EXPECT(t, "xyz", 0, SPM_SP, id_of(t, "x"), id_of(t, "yz")); /* yz (-2) beats xy (-3) */
    tok_close(t);
}

Test(tokenizer, spm_breaks_score_ties_leftmost)
{
    tok_t *t = spm_open(NULL);

    EXPECT(t, "lll", 0, SPM_SP, id_of(t, "ll"), id_of(t, "l"));
    tok_close(t);
}

Test(tokenizer, spm_falls_back_to_byte_tokens_for_unknown_characters)
{
    tok_t *t = spm_open(NULL);

    EXPECT(t, "h\xC3\xA9", 0, id_of(t, U2581 "h"), SPM_BYTE0 + 0xC3, SPM_BYTE0 + 0xA9);
    EXPECT(t, "h h", 0, id_of(t, U2581 "h"), id_of(t, U2581 "h"));
    tok_close(t);
}

Test(tokenizer, spm_space_prefix_can_be_turned_off)
{
    tok_t *t = spm_open(spm_no_space_prefix);

    EXPECT(t, "hello", 0, id_of(t, "h"), id_of(t, "e"), id_of(t, "llo"));
    tok_close(t);
}

Test(tokenizer, spm_defaults_to_adding_bos_and_reports_eos_as_end_of_generation)
{
    tok_t *t = spm_open(NULL);
    int32_t ids[4];

    cr_assert(tok_add_bos(t));
    cr_assert_eq(tok_encode(t, "", 0, 1, 0, ids, 4), 1);
    cr_assert_eq(ids[0], SPM_BOS);
    cr_assert_eq(tok_encode(t, "", 0, 0, 0, ids, 4), 0);
    cr_assert(tok_is_eog(t, SPM_EOS));
    cr_assert(!tok_is_eog(t, SPM_BOS));
    cr_assert(!tok_is_eog(t, -1));
    cr_assert(!tok_is_eog(t, 1 << 20));
    tok_close(t);
}

Test(tokenizer, spm_parses_control_text_only_with_parse_special_and_user_defined_always)
{
    tok_t *t = spm_open(NULL);
    int32_t tool = id_of(t, "<tool>");
    int32_t hello = id_of(t, U2581 "hello");

    EXPECT(t, "<s>hello</s>", 1, SPM_BOS, hello, SPM_EOS);
    EXPECT(t, "hello<s>hello", 1, hello, SPM_BOS, hello);
    EXPECT(t, "<tool>hello", 0, tool, hello);
    /* without parse_special "<s>" is text: ▁ < s > as bytes */
    EXPECT(t, "<s>", 0, SPM_SP, SPM_BYTE0 + '<', SPM_BYTE0 + 's', SPM_BYTE0 + '>');
    tok_close(t);
}

Test(tokenizer, encode_reports_the_full_count_when_the_buffer_is_short)
{
    tok_t *t = spm_open(NULL);
    int32_t ids[3] = {-7, -7, -7};

    cr_assert_eq(tok_encode(t, "lll", 3, 1, 0, ids, 2), 4);
    cr_assert_eq(ids[0], SPM_BOS);
    cr_assert_eq(ids[1], SPM_SP);
    cr_assert_eq(ids[2], -7);
    cr_assert_eq(tok_encode(t, "lll", 3, 1, 0, NULL, 0), 4);
    tok_close(t);
}

Test(tokenizer, spm_pieces_undo_the_space_marker_and_bytes)
{
    tok_t *t = spm_open(NULL);
    char buf[32];

    cr_assert_eq(tok_piece(t, id_of(t, U2581 "hello"), 0, buf, sizeof buf), 6);
    cr_assert_str_eq(buf, " hello");
    cr_assert_eq(tok_piece(t, SPM_BYTE0 + 'A', 0, buf, sizeof buf), 1);
    cr_assert_eq(buf[0], 'A');
    cr_assert_eq(tok_piece(t, SPM_EOS, 0, buf, sizeof buf), 0);
    cr_assert_eq(tok_piece(t, SPM_EOS, 1, buf, sizeof buf), 4);
    cr_assert_str_eq(buf, "</s>");
    cr_assert_eq(tok_piece(t, id_of(t, "<tool>"), 0, buf, sizeof buf), 6);
    cr_assert_eq(tok_piece(t, id_of(t, U2581 "hello"), 0, buf, 3), 6); /* truncated, full length */
    cr_assert_eq(memcmp(buf, " he", 3), 0);
    cr_assert_lt(tok_piece(t, -1, 0, buf, sizeof buf), 0);
    cr_assert_lt(tok_piece(t, 100000, 0, buf, sizeof buf), 0);
    tok_close(t);
}

/* ---- streaming */

static void feed(tok_stream_t *s, int32_t id, const char *want)
{
    char out[64];
    int n = tok_stream_feed(s, id, out, sizeof out);
    cr_assert_eq(n, (int)strlen(want), "id %d: got %d bytes \"%s\", want \"%s\"", (int)id, n,
                 n >= 0 ? out : "", want);
    cr_assert_str_eq(out, want);
}

Test(tokenizer, stream_holds_a_split_character_until_it_is_complete)
{
    tok_t *t = spm_open(NULL);
    tok_stream_t s;
    char out[16];

    tok_stream_init(&s, t, 0);
    feed(&s, id_of(t, U2581 "h"), " h");
    feed(&s, SPM_BYTE0 + 0xC3, "");
    feed(&s, SPM_BYTE0 + 0xA9, "\xC3\xA9");
    feed(&s, SPM_BYTE0 + 0xF0, "");
    feed(&s, SPM_BYTE0 + 0x9F, "");
    feed(&s, SPM_BYTE0 + 0x98, "");
    feed(&s, SPM_BYTE0 + 0x80, "\xF0\x9F\x98\x80");
    cr_assert_eq(tok_stream_flush(&s, out, sizeof out), 0);
    cr_assert_str_eq(out, "");
    tok_close(t);
}

Test(tokenizer, stream_turns_invalid_bytes_into_replacement_characters)
{
    tok_t *t = spm_open(NULL);
    tok_stream_t s;
    char out[16];

    tok_stream_init(&s, t, 0);
    feed(&s, SPM_BYTE0 + 0xFF, "\xEF\xBF\xBD");
    feed(&s, SPM_BYTE0 + 0x80, "\xEF\xBF\xBD");
    feed(&s, SPM_BYTE0 + 0xC3, "");
    feed(&s, id_of(t, "h"), "\xEF\xBF\xBDh"); /* interrupted sequence */
    feed(&s, SPM_BYTE0 + 0xE0, "");
    feed(&s, SPM_BYTE0 + 0x80, "\xEF\xBF\xBD\xEF\xBF\xBD"); /* E0 80 is never valid */
    feed(&s, SPM_BYTE0 + 0xE2, "");
    feed(&s, SPM_BYTE0 + 0x82, "");
    cr_assert_eq(tok_stream_flush(&s, out, sizeof out), 3); /* incomplete tail */
    cr_assert_str_eq(out, "\xEF\xBF\xBD");
    cr_assert_eq(tok_stream_flush(&s, out, sizeof out), 0);
    tok_close(t);
}

Test(tokenizer, stream_renders_control_tokens_only_when_special)
{
    tok_t *t = spm_open(NULL);
    tok_stream_t s;

    tok_stream_init(&s, t, 0);
    feed(&s, SPM_EOS, "");
    tok_stream_init(&s, t, 1);
    feed(&s, SPM_EOS, "</s>");
    tok_close(t);
}

Test(tokenizer, stream_keeps_its_state_when_the_output_is_too_small)
{
    tok_t *t = spm_open(NULL);
    tok_stream_t s;
    char out[4];

    tok_stream_init(&s, t, 0);
    feed(&s, SPM_BYTE0 + 0xC3, "");
    cr_assert_lt(tok_stream_feed(&s, id_of(t, U2581 "hello"), out, sizeof out), 0);
    cr_assert_eq(s.npending, 1);
    feed(&s, SPM_BYTE0 + 0xA9, "\xC3\xA9");
    cr_assert_lt(tok_stream_feed(&s, 1 << 20, out, sizeof out), 0);
    tok_close(t);
}

/* ---- GPT-2 byte-level BPE toy vocabulary */

/* bytes_to_unicode() from GPT-2's encoder.py, written out independently. */
static void b2u(unsigned b, char out[4])
{
    unsigned cp, n = 0;
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);

    if (printable) {
        cp = b;
    } else {
        for (unsigned c = 0; c < b; c++)
            if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)))
                n++;
        cp = 256 + n;
    }
    memset(out, 0, 4);
    if (cp < 0x80) {
        out[0] = (char)cp;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
    }
}

#define G_SP "\xC4\xA0" /* Ġ = byte-level ' ' */
#define G_NL "\xC4\x8A" /* Ċ = byte-level '\n' */

static const char *const bpe_merges[] = {
    "3 4",       "1 2",         "l l",         "h e",
    "he ll",     "hell o",      G_SP " w",     "o r",
    G_SP "w or", "l d",         G_SP "wor ld", "' t",
    "' T",       G_SP " " G_SP, G_NL " " G_NL, "\xC3\x83 \xC2\xA9",
    "a a",       G_SP " b",     "b c",         "a b",
};

static tv_t *bpe_vocab(void)
{
    tv_t *v = calloc(1, sizeof *v);

    cr_assert_not_null(v);
    for (unsigned b = 0; b < 256; b++) { /* id == byte value */
        char s[4];
        b2u(b, s);
        tv_add(v, s, 0, TOK_TYPE_NORMAL);
    }
    for (size_t i = 0; i < sizeof bpe_merges / sizeof bpe_merges[0]; i++) {
        char s[64];
        const char *sp = strchr(bpe_merges[i], ' ');
        snprintf(s, sizeof s, "%.*s%s", (int)(sp - bpe_merges[i]), bpe_merges[i], sp + 1);
        tv_add(v, s, 0, TOK_TYPE_NORMAL);
        tv_merge(v, bpe_merges[i]);
    }
    tv_add(v, "xyz", 0, TOK_TYPE_NORMAL); /* no merges lead to it */
    tv_add(v, "<|endoftext|>", 0, TOK_TYPE_CONTROL);
    tv_add(v, "<|im_start|>", 0, TOK_TYPE_CONTROL);
    tv_add(v, "<|im_end|>", 0, TOK_TYPE_CONTROL);
    tv_add(v, "<|end|>", 0, TOK_TYPE_CONTROL);
    tv_add(v, "<tool>", 0, TOK_TYPE_USER_DEFINED);
    return v;
}

static int32_t g_eot_id; /* id of "<|end|>", set before tv_open */

static void bpe_ids(ggufw_t *w)
{
    ggufw_kv_u32(w, "tokenizer.ggml.bos_token_id", 0);
    ggufw_kv_i32(w, "tokenizer.ggml.padding_token_id", -1);
    ggufw_kv_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)g_eot_id);
}

static void bpe_ids_add_bos(ggufw_t *w)
{
    bpe_ids(w);
    ggufw_kv_bool(w, "tokenizer.ggml.add_bos_token", 1);
}

static tok_t *bpe_open(const char *pre, tv_extra_fn extra)
{
    char err[256] = "";
    tv_t *v = bpe_vocab();
    tok_t *t;

    g_eot_id = (int32_t)v->n - 2;
    t = tv_open(v, "gpt2", pre, 0, extra ? extra : bpe_ids, err, sizeof err);
    tv_free(v);
    cr_assert_not_null(t, "tok_open: %s", err);
    return t;
}

Test(tokenizer, bpe_merges_by_lowest_rank_then_leftmost)
{
    tok_t *t = bpe_open("gpt-2", NULL);

    cr_assert_eq(tok_kind(t), TOK_KIND_BPE);
    EXPECT(t, "hello world", 0, id_of(t, "hello"), id_of(t, G_SP "world"));
    EXPECT(t, "abc", 0, 'a', id_of(t, "bc")); /* "b c" ranks before "a b" */
    EXPECT(t, "aaa", 0, id_of(t, "aa"), 'a');
    tok_close(t);
}

Test(tokenizer, gpt2_pre_tokenizer_keeps_digit_runs_and_lowercase_contractions)
{
    tok_t *t = bpe_open("gpt-2", NULL);

    EXPECT(t, "12345", 0, id_of(t, "12"), id_of(t, "34"), '5');
    EXPECT(t, "don't DON'T", 0, 'd', 'o', 'n', id_of(t, "'t"), ' ', 'D', 'O', 'N', '\'', 'T');
    EXPECT(t, "a  b", 0, 'a', ' ', id_of(t, G_SP "b"));
    EXPECT(t, "a  ", 0, 'a', id_of(t, G_SP G_SP));
    EXPECT(t, "a\n\nb", 0, 'a', '\n', '\n', 'b');
    tok_close(t);
}

Test(tokenizer, missing_pre_tokenizer_is_llama_cpp_default_isolating_punctuation_and_digit_triples)
{
    tok_t *t = bpe_open(NULL, NULL); /* no tokenizer.ggml.pre: "default" */

    EXPECT(t, "12345", 0, id_of(t, "12"), '3', '4', '5'); /* "123" "45" */
    EXPECT(t, "don't", 0, 'd', 'o', 'n', '\'', 't');      /* ' is punctuation: no contraction */
    EXPECT(t, "hello world", 0, id_of(t, "hello"), id_of(t, G_SP "world"));
    tok_close(t);
    t = bpe_open("default", NULL);
    EXPECT(t, "12345", 0, id_of(t, "12"), '3', '4', '5');
    tok_close(t);
}

Test(tokenizer, starcoder_family_splits_every_digit)
{
    static const char *const names[] = {"starcoder", "refact", "command-r", "smollm",
                                        "codeshell", "exaone", "minerva-7b"};

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tok_t *t = bpe_open(names[i], NULL);
        EXPECT(t, "12345", 0, '1', '2', '3', '4', '5');
        EXPECT(t, "don't", 0, 'd', 'o', 'n', id_of(t, "'t"));
        tok_close(t);
    }
}

Test(tokenizer, falcon_isolates_punctuation_and_digit_triples)
{
    tok_t *t = bpe_open("falcon", NULL);

    EXPECT(t, "12345", 0, id_of(t, "12"), '3', '4', '5');
    EXPECT(t, "don't", 0, 'd', 'o', 'n', '\'', 't');
    EXPECT(t, "a`b", 0, 'a', '`', 'b');
    tok_close(t);
}

Test(tokenizer, bloom_family_splits_only_at_spaces_and_sentence_punctuation)
{
    static const char *const names[] = {"bloom", "poro-chat", "gpt3-finnish"};

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tok_t *t = bpe_open(names[i], NULL);
        /* "12345" stays one pre-token, so the merges see all of it */
        EXPECT(t, "12345", 0, id_of(t, "12"), id_of(t, "34"), '5');
        EXPECT(t, "hello world.", 0, id_of(t, "hello"), id_of(t, G_SP "world"), '.');
        EXPECT(t, "ab(c", 0, id_of(t, "ab"), '(', 'c'); /* '(' is in the class as written */
        tok_close(t);
    }
    tok_t *t = bpe_open("viking", NULL); /* the same, then every digit alone */
    EXPECT(t, "12345", 0, '1', '2', '3', '4', '5');
    tok_close(t);
}

Test(tokenizer, deepseek_coder_splits_digits_and_newlines_and_letters_from_punctuation)
{
    tok_t *t = bpe_open("deepseek-coder", NULL);

    EXPECT(t, "12", 0, '1', '2');
    EXPECT(t, "a\n\nb", 0, 'a', '\n', '\n', 'b');
    EXPECT(t, "hello world", 0, id_of(t, "hello"), id_of(t, G_SP "world"));
    tok_close(t);
}

Test(tokenizer, deepseek_v3_splits_digit_triples)
{
    tok_t *t = bpe_open("deepseek-v3", NULL);

    EXPECT(t, "12345", 0, id_of(t, "12"), '3', '4', '5');
    EXPECT(t, "hello world", 0, id_of(t, "hello"), id_of(t, G_SP "world"));
    tok_close(t);
}

Test(tokenizer, tekken_and_gpt4o_split_words_at_case_changes)
{
    tok_t *t = bpe_open("tekken", NULL);

    cr_assert(tok_add_bos(t), "tekken adds BOS by default");
    EXPECT(t, "aaBc", 0, id_of(t, "aa"), 'B', 'c');
    EXPECT(t, "12", 0, '1', '2');
    tok_close(t);
    t = bpe_open("gpt-4o", NULL);
    cr_assert(!tok_add_bos(t));
    EXPECT(t, "aaBc", 0, id_of(t, "aa"), 'B', 'c');
    EXPECT(t, "12345", 0, id_of(t, "12"), '3', '4', '5');
    EXPECT(t, "DON'T", 0, 'D', 'O', 'N', id_of(t, "'T")); /* contractions of any case */
    tok_close(t);
}

Test(tokenizer, every_llama_cpp_pre_tokenizer_name_opens)
{
    static const char *const names[] = {
        "default",      "llama3",         "llama-v3",     "llama-bpe",  "falcon3",
        "deepseek-llm", "deepseek-coder", "deepseek-v3",  "falcon",     "mpt",
        "starcoder",    "gpt-2",          "phi-2",        "jina-es",    "jina-de",
        "gigachat",     "jina-v1-en",     "jina-v2-es",   "jina-v2-de", "jina-v2-code",
        "roberta-bpe",  "refact",         "command-r",    "qwen2",      "deepseek-r1-qwen",
        "stablelm2",    "olmo",           "dbrx",         "smaug-bpe",  "poro-chat",
        "chatglm-bpe",  "viking",         "jais",         "tekken",     "smollm",
        "codeshell",    "bloom",          "gpt3-finnish", "exaone",     "chameleon",
        "minerva-7b",   "megrez",         "gpt-4o",       "llama4",
    };

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tok_t *t = bpe_open(names[i], NULL);
        int n;
        const char *s = "Hello, world! 123 \xE4\xB8\x96\n";
        int32_t *ids = encode(t, s, strlen(s), 0, 0, &n);
        size_t dlen;
        char *dec = decode(t, ids, n, &dlen);
        cr_assert_str_eq(dec, s, "%s does not round-trip", names[i]);
        free(dec);
        free(ids);
        tok_close(t);
    }
}

Test(tokenizer, llama3_family_adds_bos_by_default_unless_the_file_says_otherwise)
{
    tok_t *t = bpe_open("llama-bpe", NULL);
    cr_assert(tok_add_bos(t));
    tok_close(t);
    t = bpe_open("qwen2", NULL);
    cr_assert(!tok_add_bos(t));
    tok_close(t);
}

Test(tokenizer, llama3_pre_tokenizer_splits_digits_in_threes_and_any_case_contractions)
{
    tok_t *t = bpe_open("llama-bpe", NULL);

    EXPECT(t, "12345", 0, id_of(t, "12"), '3', '4', '5');
    EXPECT(t, "don't DON'T", 0, 'd', 'o', 'n', id_of(t, "'t"), ' ', 'D', 'O', 'N', id_of(t, "'T"));
    EXPECT(t, "a  b", 0, 'a', ' ', id_of(t, G_SP "b"));
    EXPECT(t, "a\n\nb", 0, 'a', id_of(t, G_NL G_NL), 'b');
    EXPECT(t, "xyz", 0, id_of(t, "xyz")); /* whole-word tokens skip the merges */
    tok_close(t);
}

Test(tokenizer, qwen2_pre_tokenizer_splits_single_digits)
{
    tok_t *t = bpe_open("qwen2", NULL);

    EXPECT(t, "12345", 0, '1', '2', '3', '4', '5');
    EXPECT(t, "DON'T", 0, 'D', 'O', 'N', id_of(t, "'T"));
    EXPECT(t, "a\n\nb", 0, 'a', id_of(t, G_NL G_NL), 'b');
    EXPECT(t, "xyz", 0, 'x', 'y', 'z');
    tok_close(t);
}

Test(tokenizer, bpe_parses_special_text_only_when_asked)
{
    tok_t *t = bpe_open("gpt-2", NULL);
    int32_t eot = id_of(t, "<|endoftext|>");
    int32_t hello = id_of(t, "hello");
    int n;
    int32_t *ids;

    EXPECT(t, "hello<|endoftext|>world", 1, hello, eot, 'w', id_of(t, "or"), id_of(t, "ld"));
    EXPECT(t, "<tool>hello", 0, id_of(t, "<tool>"), hello);
    ids = encode(t, "hello<|endoftext|>", 18, 0, 0, &n);
    cr_assert_eq(n, 1 + 2 + 9 + 2, "got %d ids", n); /* hello, "<|", e n d o f t e x t, "|>" */
    cr_assert_eq(ids[0], hello);
    cr_assert_eq(ids[1], '<');
    cr_assert_eq(ids[2], '|');
    for (int i = 0; i < n; i++)
        cr_assert_neq(ids[i], eot);
    free(ids);
    tok_close(t);
}

Test(tokenizer, bpe_round_trips_non_ascii_utf8)
{
    tok_t *t = bpe_open("gpt-2", NULL);
    const char *s = "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C";
    int n;
    size_t dlen;
    int32_t *ids;
    char *dec;

    EXPECT(t, s, 0, 'h', id_of(t, "\xC3\x83\xC2\xA9"), id_of(t, "ll"), 'o', ' ', 0xE4, 0xB8, 0x96,
           0xE7, 0x95, 0x8C);
    ids = encode(t, s, strlen(s), 0, 0, &n);
    dec = decode(t, ids, n, &dlen);
    cr_assert_str_eq(dec, s);
    free(dec);
    free(ids);
    tok_close(t);
}

Test(tokenizer, bpe_encodes_invalid_utf8_byte_by_byte)
{
    tok_t *t = bpe_open("llama-bpe", NULL);
    const char s[] = "a\xFF\xC3 b";
    int n;
    size_t dlen;
    int32_t *ids = encode(t, s, sizeof s - 1, 0, 0, &n);
    char *dec = decode(t, ids, n, &dlen);

    cr_assert_eq(dlen, sizeof s - 1);
    cr_assert_eq(memcmp(dec, s, dlen), 0);
    free(dec);
    free(ids);
    tok_close(t);
}

Test(tokenizer, bpe_pieces_undo_the_byte_level_mapping)
{
    tok_t *t = bpe_open("gpt-2", NULL);
    char buf[32];

    cr_assert_eq(tok_piece(t, id_of(t, G_SP "world"), 0, buf, sizeof buf), 6);
    cr_assert_str_eq(buf, " world");
    cr_assert_eq(tok_piece(t, '\n', 0, buf, sizeof buf), 1);
    cr_assert_str_eq(buf, "\n");
    cr_assert_eq(tok_piece(t, id_of(t, "<|endoftext|>"), 0, buf, sizeof buf), 0);
    cr_assert_eq(tok_piece(t, id_of(t, "<|endoftext|>"), 1, buf, sizeof buf), 13);
    cr_assert_str_eq(buf, "<|endoftext|>");
    tok_close(t);
}

Test(tokenizer, bpe_defaults_to_no_bos_unless_the_vocabulary_asks)
{
    tok_t *t = bpe_open("gpt-2", NULL);
    cr_assert(!tok_add_bos(t));
    tok_close(t);
    t = bpe_open("gpt-2", bpe_ids_add_bos);
    cr_assert(tok_add_bos(t));
    tok_close(t);
}

Test(tokenizer, bpe_end_of_generation_covers_eos_eot_and_chat_end_tokens)
{
    tok_t *t = bpe_open("qwen2", NULL);

    cr_assert(tok_is_eog(t, id_of(t, "<|endoftext|>")));
    cr_assert(tok_is_eog(t, id_of(t, "<|im_end|>")));
    cr_assert(tok_is_eog(t, id_of(t, "<|end|>"))); /* eot_token_id */
    cr_assert(!tok_is_eog(t, id_of(t, "<|im_start|>")));
    cr_assert(!tok_is_eog(t, 'a'));
    cr_assert_eq(tok_eos(t), -1);
    tok_close(t);
}

/* Id of text in v (the toy vocabularies' own list). */
static int32_t tv_id(const tv_t *v, const char *text)
{
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->text[i], text) == 0)
            return (int32_t)i;
    cr_assert_fail("\"%s\" not in the toy vocabulary", text);
    return -1;
}

static int32_t g_fim_sep_id; /* for bpe_ids_fim_sep */

static void bpe_ids_fim_sep(ggufw_t *w)
{
    bpe_ids(w);
    ggufw_kv_u32(w, "tokenizer.ggml.fim_sep_token_id", (uint32_t)g_fim_sep_id);
}

Test(tokenizer, llama_cpp_end_of_generation_texts_end_generation_and_become_control)
{
    char err[256] = "";
    tv_t *v = bpe_vocab();
    tok_t *t;
    int32_t eot, eot2, fsep, fpre;

    eot = tv_add(v, "<end_of_turn>", 0, TOK_TYPE_NORMAL);
    eot2 = tv_add(v, "<EOT>", 0, TOK_TYPE_USER_DEFINED);
    fsep = tv_add(v, "<|file_sep|>", 0, TOK_TYPE_NORMAL);
    fpre = tv_add(v, "<|fim_prefix|>", 0, TOK_TYPE_NORMAL);
    g_eot_id = tv_id(v, "<|end|>");
    t = tv_open(v, "gpt2", "qwen2", 0, bpe_ids, err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    for (int32_t id = 0; id < tok_vocab_size(t); id++) {
        const char *x = tok_text(t, id);
        int want = id == eot || id == eot2 || id == fsep || strcmp(x, "<|endoftext|>") == 0 ||
                   strcmp(x, "<|im_end|>") == 0 || strcmp(x, "<|end|>") == 0;
        cr_assert_eq(tok_is_eog(t, id), want, "\"%s\": eog %d, want %d", x, tok_is_eog(t, id),
                     want);
    }
    cr_assert_eq(tok_type(t, eot), TOK_TYPE_CONTROL);
    cr_assert_eq(tok_type(t, eot2), TOK_TYPE_CONTROL);
    cr_assert_eq(tok_type(t, fsep), TOK_TYPE_CONTROL);
    cr_assert_eq(tok_type(t, fpre), TOK_TYPE_NORMAL); /* FIM prefix: neither end nor control */
    EXPECT(t, "a<end_of_turn>", 1, 'a', eot);
    {
        int n;
        int32_t *ids = encode(t, "a<end_of_turn>", 14, 0, 0, &n);
        for (int i = 0; i < n; i++)
            cr_assert_neq(ids[i], eot, "CONTROL text is parsed only with parse_special");
        free(ids);
    }
    tok_close(t);

    /* a fim_sep_token_id key names the separator: the text is no longer looked for */
    g_fim_sep_id = tv_id(v, "xyz");
    t = tv_open(v, "gpt2", "qwen2", 0, bpe_ids_fim_sep, err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    cr_assert(tok_is_eog(t, g_fim_sep_id));
    cr_assert(!tok_is_eog(t, fsep));
    cr_assert_eq(tok_type(t, fsep), TOK_TYPE_NORMAL);
    tok_close(t);
    tv_free(v);
}

static void spm_phi3(ggufw_t *w)
{
    spm_ids(w);
    ggufw_kv_str(w, "general.name", "Phi-3 Mini 4K Instruct");
}

Test(tokenizer, phi3_special_tokens_swallow_the_whitespace_after_them_but_not_unk_s_or_endoftext)
{
    char err[256] = "";
    tv_t *v = spm_vocab();
    int32_t user = tv_add(v, "<|user|>", 0, TOK_TYPE_CONTROL);
    int32_t end = tv_add(v, "<|end|>", 0, TOK_TYPE_USER_DEFINED);
    tok_t *phi = tv_open(v, "llama", NULL, 0, spm_phi3, err, sizeof err);
    tok_t *other = tv_open(v, "llama", NULL, 0, spm_ids, err, sizeof err);
    int32_t hello, *ids;
    int n, nl = 0;

    cr_assert_not_null(phi, "%s", err);
    cr_assert_not_null(other, "%s", err);
    hello = id_of(phi, U2581 "hello");
    EXPECT(phi, "<|user|>\n hello", 1, user, hello);
    EXPECT(phi, "<|end|>\nhello", 1, end, hello); /* <|end|> became CONTROL (it ends generation) */
    cr_assert(tok_is_eog(phi, end) && tok_type(phi, end) == TOK_TYPE_CONTROL);
    /* <s> keeps what follows: its space becomes a "▁" of its own */
    EXPECT(phi, "<s> hello", 1, SPM_BOS, id_of(phi, U2581), hello);
    /* without the Phi-3 name the newline stays, as a byte token */
    ids = encode(other, "<|user|>\nhello", 14, 0, 1, &n);
    for (int i = 0; i < n; i++)
        nl += ids[i] == SPM_BYTE0 + '\n';
    cr_assert(n > 2 && ids[0] == user && nl == 1, "%d ids", n);
    free(ids);
    tok_close(phi);
    tok_close(other);
    tv_free(v);
}

Test(tokenizer, bpe_encoding_a_long_word_is_fast, .timeout = 20)
{
    tok_t *t = bpe_open("llama-bpe", NULL);
    size_t len = 200 * 1024;
    char *s = malloc(len);
    int n;
    int32_t *ids;

    for (size_t i = 0; i < len; i++)
        s[i] = "ab cd\n1234 hello world "[i % 23];
    memset(s, 'a', len / 2); /* one 100 KB word */
    ids = encode(t, s, len, 0, 0, &n);
    cr_assert_gt(n, 0);
    free(ids);
    free(s);
    tok_close(t);
}

/* ------------------------------------------------------------------ hostile metadata */

static void expect_refused(const char *model, const char *pre, unsigned flags, tv_extra_fn extra,
                           void (*mutate)(tv_t *), const char *needle)
{
    char err[256] = "";
    tv_t *v = (model && strcmp(model, "gpt2") == 0) ? bpe_vocab() : spm_vocab();
    tok_t *t;

    if (mutate)
        mutate(v);
    t = tv_open(v, model, pre, flags, extra, err, sizeof err);
    tv_free(v);
    if (t)
        tok_close(t);
    cr_assert_null(t, "tok_open accepted it (want an error mentioning \"%s\")", needle);
    cr_assert(strstr(err, needle) != NULL, "error \"%s\" does not mention \"%s\"", err, needle);
}

static void empty_token(tv_t *v)
{
    free(v->text[270]);
    v->text[270] = strdup("");
}

static void bad_type(tv_t *v)
{
    v->type[5] = 99;
}
static void bad_byte_text(tv_t *v)
{
    free(v->text[10]);
    v->text[10] = strdup("<0xZZ>");
}
static void nan_score(tv_t *v)
{
    v->score[7] = NAN;
}
static void bos_out_of_range(ggufw_t *w)
{
    ggufw_kv_u32(w, "tokenizer.ggml.bos_token_id", 100000);
}
static void eos_negative(ggufw_t *w)
{
    ggufw_kv_i32(w, "tokenizer.ggml.eos_token_id", -5);
}
static void eos_as_string(ggufw_t *w)
{
    ggufw_kv_str(w, "tokenizer.ggml.eos_token_id", "2");
}
static void add_bos_as_u32(ggufw_t *w)
{
    ggufw_kv_u32(w, "tokenizer.ggml.add_bos_token", 1);
}

Test(tokenizer, open_refuses_a_missing_model)
{
    char err[64] = "";
    cr_assert_null(tok_open(NULL, err, sizeof err));
    cr_assert_neq(err[0], '\0');
}

Test(tokenizer, open_refuses_missing_or_unknown_tokenizer_model)
{
    expect_refused(NULL, NULL, 0, NULL, NULL, "tokenizer.ggml.model is missing");
    expect_refused("bert", NULL, 0, NULL, NULL, "unsupported tokenizer.ggml.model \"bert\"");
}

Test(tokenizer, open_refuses_missing_or_mistyped_token_list)
{
    expect_refused("llama", NULL, TV_OMIT_TOKENS, NULL, NULL, "tokenizer.ggml.tokens");
    expect_refused("llama", NULL, TV_TOKENS_AS_I32, NULL, NULL, "not an array of strings");
}

Test(tokenizer, open_refuses_scores_or_types_of_another_length)
{
    expect_refused("llama", NULL, TV_SHORT_SCORES, NULL, NULL,
                   "tokenizer.ggml.scores has 274 elements");
    expect_refused("llama", NULL, TV_SHORT_TYPES, NULL, NULL,
                   "tokenizer.ggml.token_type has 274 elements");
}

Test(tokenizer, open_refuses_missing_scores_types_or_merges)
{
    expect_refused("llama", NULL, TV_OMIT_SCORES, NULL, NULL, "tokenizer.ggml.scores is missing");
    expect_refused("llama", NULL, TV_OMIT_TYPES, NULL, NULL,
                   "tokenizer.ggml.token_type is missing");
    expect_refused("gpt2", NULL, TV_OMIT_MERGES, NULL, NULL, "tokenizer.ggml.merges");
}

Test(tokenizer, open_refuses_special_ids_out_of_range)
{
    expect_refused("llama", NULL, 0, bos_out_of_range, NULL,
                   "bos_token_id = 100000 is out of range");
    expect_refused("llama", NULL, 0, eos_negative, NULL, "eos_token_id = -5 is out of range");
    expect_refused("llama", NULL, 0, eos_as_string, NULL, "eos_token_id is not an integer");
    expect_refused("llama", NULL, 0, add_bos_as_u32, NULL, "add_bos_token is not a bool");
}

Test(tokenizer, open_refuses_empty_tokens_and_bad_token_types)
{
    expect_refused("llama", NULL, 0, NULL, empty_token, "token 270 has empty text");
    expect_refused("llama", NULL, 0, NULL, bad_type, "token 5 has unknown token_type 99");
    expect_refused("llama", NULL, 0, NULL, bad_byte_text, "byte token 10");
    expect_refused("llama", NULL, 0, NULL, nan_score, "NaN");
}

Test(tokenizer, open_refuses_an_unknown_pre_tokenizer)
{
    expect_refused("gpt2", "mystery-pre", 0, NULL, NULL,
                   "unknown pre-tokenizer tokenizer.ggml.pre = \"mystery-pre\"");
    /* llama.cpp's name is "gpt-2"; "gpt2" is the tokenizer model, not a pre-tokenizer */
    expect_refused("gpt2", "gpt2", 0, NULL, NULL, "\"gpt2\"");
}

/* ------------------------------------------------------------------ fill in the middle */

Test(tokenizer, fim_tokens_are_found_by_their_family_texts)
{
    tok_t *t = open_model("vocab/ggml-vocab-starcoder.gguf");
    int32_t ids[3] = {-1, -1, -1};
    cr_assert_eq(tok_fim(t, ids), 0);
    cr_assert_str_eq(tok_text(t, ids[0]), "<fim_prefix>");
    cr_assert_str_eq(tok_text(t, ids[1]), "<fim_suffix>");
    cr_assert_str_eq(tok_text(t, ids[2]), "<fim_middle>");
    tok_close(t);
    t = open_model("stories260K.gguf");
    cr_assert_eq(tok_fim(t, ids), -1, "a vocabulary without them has none");
    tok_close(t);
}
