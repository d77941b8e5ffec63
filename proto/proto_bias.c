/* proto_bias: the request field "logit_bias" ({"token id": bias}), read and written; a room below proto.c that calls nothing of it. */
#include "proto.h"
#include "proto_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A bad_request message into err; returns -PROTO_E_BAD_REQUEST. */
__attribute__((format(printf, 3, 4))) static int bias_fail(char *err, size_t errlen,
                                                           const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -PROTO_E_BAD_REQUEST;
}

int proto_parse_logit_bias(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    if (!json_is_object(v))
        return bias_fail(err, errlen,
                         "field 'logit_bias' must be an object of token ids (keys) to numbers");
    size_t n = json_object_size(v);
    if (n > PROTO_MAX_LOGIT_BIAS)
        return bias_fail(err, errlen, "field 'logit_bias' has %zu entries (max %d)", n,
                         PROTO_MAX_LOGIT_BIAS);
    if (n == 0)
        return 0;
    req->bias_ids = malloc(n * sizeof *req->bias_ids);
    req->bias = malloc(n * sizeof *req->bias);
    if (!req->bias_ids || !req->bias) {
        bias_fail(err, errlen, "out of memory");
        return -PROTO_E_INTERNAL;
    }
    const char *key;
    const json_t *b;
    json_object_foreach ((json_t *)v, key, b) {
        char *end = NULL;
        errno = 0;
        long id = key[0] >= '0' && key[0] <= '9' ? strtol(key, &end, 10) : -1;
        if (id < 0 || id > INT32_MAX || errno || !end || *end)
            return bias_fail(err, errlen,
                             "logit_bias key \"%.32s\" is not a token id (a decimal integer)", key);
        double x = json_number_value(b);
        if (!json_is_number(b) || !(x >= -100 && x <= 100))
            return bias_fail(err, errlen, "logit_bias[\"%.32s\"] must be a number in -100 .. 100",
                             key);
        req->bias_ids[req->n_bias] = (int32_t)id;
        req->bias[req->n_bias] = (float)x;
        req->n_bias++;
    }
    return 0;
}

json_t *proto_logit_bias_new(const proto_req_t *req)
{
    json_t *o = json_object();
    for (size_t i = 0; o && i < req->n_bias; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", (int)req->bias_ids[i]);
        if (json_object_set_new(o, k, json_real(req->bias[i]))) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}
