/* tok_bpe: the GPT-2 byte-level BPE ("gpt2") family: its merges, the pre-tokenizers (llama.cpp's patterns, run with PCRE2) and the encoding of raw text. */
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer_int.h"

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

/* ------------------------------------------------------------------ loading */

int tok_load_merges(tok_t *t, const gguf_t *g, char *err, size_t errlen)
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

int tok_compile_pre(tok_t *t, const gguf_t *g, char *err, size_t errlen)
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
int tok_encode_bpe(const tok_t *t, tok_work_t *w, const char *s, size_t n, tok_out_t *o)
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
