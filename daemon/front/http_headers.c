/* http_headers: the request headers the HTTP front end reads beside the body: X-Forwarded-For (joined, for the client's address) and X-Deadline-Ms (a first-token deadline). */
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
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

int http_deadline_header(const struct evkeyvalq *in, uint32_t *ms)
{
    const char *v = evhttp_find_header(in, "X-Deadline-Ms");
    uint64_t x = 0;
    if (!v)
        return 0;
    if (num_u64(v, &x) || x < 1 || x > PROTO_MAX_DEADLINE_MS)
        return -1;
    if (!*ms) /* the body's deadline_ms, if any, comes first */
        *ms = (uint32_t)x;
    return 0;
}
