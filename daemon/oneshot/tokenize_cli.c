/* tokenize_cli: the one-shot `gpuswapd tokenize` mode, text on stdin to token ids on stdout. */
#include "tokenize_cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

#define TOKENIZE_CLI_MAX_INPUT (256u << 20) /* bytes read from stdin at most */

typedef struct tokenize_cli_opts {
    const char *model; /* GGUF path; only its tokenizer.* metadata is used */
    int no_bos;        /* never add BOS */
    int special;       /* parse special-token text into those tokens */
    int pieces;        /* one line per token: id and its text as a JSON string */
} tokenize_cli_opts_t;

static void tokenize_cli_usage(FILE *f)
{
    fputs("usage: gpuswapd tokenize --model FILE [--no-bos] [--special] [--pieces] < TEXT\n"
          "Reads UTF-8 text on stdin (all of it, a final newline included) and prints its\n"
          "token ids, separated by spaces, on one line. The file may hold only a vocabulary.\n"
          "  -m, --model FILE  GGUF file whose tokenizer to use\n"
          "      --no-bos      do not add BOS (by default it is added when the vocabulary asks)\n"
          "      --special     turn special-token text (<s>, <|im_start|>, ...) into those tokens\n"
          "      --pieces      print one line per token: the id and its text as a JSON string\n",
          f);
}

/* 0 ok, 1 --help was printed, -1 usage error (already reported). */
static int tokenize_cli_parse(int argc, char **argv, tokenize_cli_opts_t *o)
{
    enum {
        O_NOBOS = 256,
        O_SPECIAL,
        O_PIECES
    };
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'},   {"no-bos", no_argument, 0, O_NOBOS},
        {"special", no_argument, 0, O_SPECIAL}, {"pieces", no_argument, 0, O_PIECES},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
    };
    int c;

    memset(o, 0, sizeof *o);
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case O_NOBOS: o->no_bos = 1; break;
        case O_SPECIAL: o->special = 1; break;
        case O_PIECES: o->pieces = 1; break;
        case 'h': tokenize_cli_usage(stdout); return 1;
        default: tokenize_cli_usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gpuswapd tokenize: unexpected argument '%s' (the text comes on stdin)\n",
                argv[optind]);
        return -1;
    }
    if (!o->model) {
        fprintf(stderr, "gpuswapd tokenize: --model FILE is required\n");
        tokenize_cli_usage(stderr);
        return -1;
    }
    return 0;
}

/* Reads all of f into a malloc'ed buffer (caller frees); NULL on error or
 * input over the limit, with the reason in err. */
static char *tokenize_cli_slurp(FILE *f, size_t *len, char *err, size_t errlen)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);

    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (;;) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
        if (n == cap) {
            char *nb;
            if (cap >= TOKENIZE_CLI_MAX_INPUT) {
                snprintf(err, errlen, "the input is over %u MiB", TOKENIZE_CLI_MAX_INPUT >> 20);
                free(buf);
                return NULL;
            }
            nb = realloc(buf, cap * 2);
            if (!nb) {
                snprintf(err, errlen, "out of memory");
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        snprintf(err, errlen, "reading stdin: %s", strerror(errno));
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Prints s[0..n) as a JSON string. */
static void tokenize_cli_put_json(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c < 0x20 || c == 0x7F)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f); /* UTF-8 as is (a byte piece may be half a character) */
    }
    fputc('"', f);
}

int tokenize_cli_main(int argc, char **argv)
{
    tokenize_cli_opts_t o;
    char err[512] = "";
    gguf_t *g = NULL;
    tok_t *t = NULL;
    char *text = NULL, *piece = NULL;
    int32_t *ids = NULL;
    size_t len = 0, cap;
    int n, status = 1;
    int rc = tokenize_cli_parse(argc, argv, &o);

    if (rc)
        return rc > 0 ? 0 : 2;
    g = gguf_open(o.model, err, sizeof err);
    if (!g) {
        fprintf(stderr, "gpuswapd tokenize: %s\n", err);
        goto done;
    }
    t = tok_open(g, err, sizeof err);
    if (!t) {
        fprintf(stderr, "gpuswapd tokenize: %s: %s\n", o.model, err);
        goto done;
    }
    text = tokenize_cli_slurp(stdin, &len, err, sizeof err);
    if (!text) {
        fprintf(stderr, "gpuswapd tokenize: %s\n", err);
        goto done;
    }
    cap = len + 2; /* a token covers at least one byte, plus BOS */
    ids = malloc(cap * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "gpuswapd tokenize: out of memory\n");
        goto done;
    }
    n = tok_encode(t, text, len, tok_add_bos(t) && !o.no_bos, o.special, ids, cap);
    if (n < 0 || (size_t)n > cap) {
        fprintf(stderr, "gpuswapd tokenize: cannot tokenize the input (error %d)\n", n);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (o.pieces) {
            int k = tok_piece(t, ids[i], 1, NULL, 0);
            char *np = k >= 0 ? realloc(piece, (size_t)k + 1) : NULL;
            if (!np) {
                fprintf(stderr, "gpuswapd tokenize: cannot render token %d\n", (int)ids[i]);
                goto done;
            }
            piece = np;
            tok_piece(t, ids[i], 1, piece, (size_t)k + 1);
            printf("%d ", (int)ids[i]);
            tokenize_cli_put_json(stdout, piece, (size_t)k);
            putchar('\n');
        } else {
            printf(i ? " %d" : "%d", (int)ids[i]);
        }
    }
    if (!o.pieces)
        putchar('\n');
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "gpuswapd tokenize: writing stdout failed\n");
        goto done;
    }
    status = 0;
done:
    free(piece);
    free(ids);
    free(text);
    tok_close(t);
    gguf_close(g);
    return status;
}
