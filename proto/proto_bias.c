/* proto_bias: the request field "logit_bias" ({"token id": bias}), read and written; a room of proto.c. */
#include "proto.h"
#include "proto_int.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int proto_parse_logit_bias(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    if (!json_is_object(v))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'logit_bias' must be an object of token ids to numbers (got %s)",
                          proto_type_word(v));
    size_t n = json_object_size(v);
    if (n > PROTO_MAX_LOGIT_BIAS)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'logit_bias' has %zu entries (max %d)", n, PROTO_MAX_LOGIT_BIAS);
    if (n == 0)
        return 0;
    req->bias_ids = malloc(n * sizeof *req->bias_ids);
    req->bias = malloc(n * sizeof *req->bias);
    if (!req->bias_ids || !req->bias)
        return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    const char *key;
    const json_t *b;
    json_object_foreach ((json_t *)v, key, b) {
        char q[48], *end = NULL;
        proto_quote_short(q, sizeof q, key);
        errno = 0;
        long id = key[0] >= '0' && key[0] <= '9' ? strtol(key, &end, 10) : -1;
        if (id < 0 || id > INT32_MAX || errno || !end || *end)
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "logit_bias key %s is not a token id (a decimal integer)", q);
        double x = json_number_value(b);
        if (!json_is_number(b) || !(x >= -100 && x <= 100))
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "logit_bias[%s] must be a number in -100 .. 100", q);
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
        if (proto_set_new(o, k, json_real(req->bias[i]))) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}
