/* http_headers: the request headers the HTTP front end reads beside the body: X-Forwarded-For (joined, for the client's address), X-Deadline-Ms (a first-token deadline) and X-Request-Class (interactive or batch). */
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/num.h"
#include "http_int.h"
#include "proto.h"

char *http_forwarded_for(const struct evkeyvalq *in)
{
    /* every X-Forwarded-For line in order, joined: a proxy appends its own line after any
     * the client sent, and the walk from the right must see it first */
    size_t len = 0;
    const struct evkeyval *kv;
    for (kv = in->tqh_first; kv; kv = kv->next.tqe_next)
        if (strcasecmp(kv->key, "X-Forwarded-For") == 0)
            len += strlen(kv->value) + 1;
    char *out = len ? malloc(len) : NULL;
    if (!out)
        return NULL;
    out[0] = 0;
    for (kv = in->tqh_first; kv; kv = kv->next.tqe_next)
        if (strcasecmp(kv->key, "X-Forwarded-For") == 0) {
            if (out[0])
                strcat(out, ",");
            strcat(out, kv->value);
        }
    return out;
}

int http_request_headers(const struct evkeyvalq *in, proto_req_t *req, char *err, size_t errlen)
{
    const char *v = evhttp_find_header(in, "X-Deadline-Ms");
    uint64_t x = 0;
    if (v && (num_u64(v, &x) || x < 1 || x > PROTO_MAX_DEADLINE_MS)) {
        snprintf(err, errlen,
                 "header X-Deadline-Ms must be a whole number of milliseconds, 1 to %u",
                 PROTO_MAX_DEADLINE_MS);
        return -1;
    }
    if (v && !req->deadline_ms) /* the body's deadline_ms, if any, comes first */
        req->deadline_ms = (uint32_t)x;
    v = evhttp_find_header(in, "X-Request-Class");
    if (v && strcmp(v, "batch") != 0 && strcmp(v, "interactive") != 0) {
        snprintf(err, errlen, "header X-Request-Class must be interactive or batch");
        return -1;
    }
    if (v && !req->batch)
        req->batch = strcmp(v, "batch") == 0;
    return 0;
}
