/* chatrender: prints the prompt gpuswapd renders for a socket chat request (stdin, one JSON line) under a chat template (a file of its Jinja text), as the worker renders it: the tests compare it with the Jinja rendering. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "engine/chat_tools.h"
#include "proto.h"

/* The whole of f as a malloc'ed string (*n bytes), NULL on failure. */
static char *slurp(FILE *f, size_t *n)
{
    size_t cap = 1 << 16;
    char *p = malloc(cap);
    *n = 0;
    while (p) {
        size_t k = fread(p + *n, 1, cap - *n - 1, f);
        *n += k;
        if (k == 0)
            break;
        if (*n + 1 == cap) {
            char *np = realloc(p, cap *= 2);
            if (!np)
                free(p);
            p = np;
        }
    }
    if (p)
        p[*n] = 0;
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: chatrender TEMPLATE_FILE < request.json\n");
        return 2;
    }
    FILE *tf = fopen(argv[1], "rb");
    size_t tn = 0, ln = 0;
    char *tmpl = tf ? slurp(tf, &tn) : NULL, *line = slurp(stdin, &ln), err[512], *out = NULL;
    if (tf)
        fclose(tf);
    if (!tmpl || !line) {
        fprintf(stderr, "chatrender: cannot read %s or stdin\n", argv[1]);
        return 1;
    }
    while (ln && (line[ln - 1] == '\n' || line[ln - 1] == '\r'))
        ln--;
    proto_req_t req;
    int rc = proto_parse_request(line, ln, 0, &req, NULL, err, sizeof err);
    if (rc) {
        fprintf(stderr, "chatrender: %s\n", err);
        return 1;
    }
    chat_family_t f = chat_detect(tmpl, tn);
    chat_tools_style_t st = chat_tools_detect(f, tmpl, tn);
    int forced = req.tool_choice == CHAT_TOOL_REQUIRED || req.tool_choice == CHAT_TOOL_NAMED;
    if (json_array_size(req.tools) || chat_tools_in_messages(req.messages, req.n_messages))
        rc = chat_tools_render(f, st, req.messages, req.n_messages,
                               req.tool_choice == CHAT_TOOL_NONE ? NULL : req.tools, forced, &out,
                               err, sizeof err);
    else
        rc = chat_render(f, req.messages, req.n_messages, &out, err, sizeof err);
    if (rc) {
        fprintf(stderr, "chatrender: %s\n", err);
        proto_req_free(&req);
        return 1;
    }
    fputs(out, stdout);
    free(out);
    free(tmpl);
    free(line);
    proto_req_free(&req);
    return 0;
}
