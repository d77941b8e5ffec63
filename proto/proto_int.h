/* proto_int: the JSON helpers proto.c lends proto_answer.c; not for other modules. proto_answer.c
 * calls down into proto.c, never the other way. */
#ifndef PROTO_INT_H
#define PROTO_INT_H

#include <jansson.h>
#include <stddef.h>

#include "proto.h"

/* Writes a message into err (when given) and returns -code. */
int proto_fail(char *err, size_t errlen, proto_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The JSON type of v as a message word. */
const char *proto_type_word(const json_t *v);
/* A short printable rendering of a string value for messages, quoted, into out (cap bytes). */
void proto_quote_short(char *out, size_t cap, const char *s);

/* A copy of id for an answer (null when absent). */
json_t *proto_id_new(const json_t *id);
/* Sets key in obj to v (stolen); returns -1 when v is NULL or the set fails. */
int proto_set_new(json_t *obj, const char *key, json_t *v);
/* A time in ms rounded to 3 decimals; non-finite values become 0 (json_real refuses them). */
json_t *proto_ms_new(double ms);

/* Dumps root as one compact line with '\n' and releases root (NULL root = OOM upstream): a
 * malloc'ed string the caller frees, or NULL. */
char *proto_line_finish(json_t *root);
/* Parses line as one JSON value (jansson flags beside JSON_DECODE_ANY); NULL with *rc (a negative
 * PROTO_E_* code) and the error in err. */
json_t *proto_load_line(const char *line, size_t len, size_t flags, int *rc, char *err,
                        size_t errlen);

/* proto_bias.c (below proto.c: it calls none of the above): "logit_bias" ({"id": bias, ...}) into req; 0 or -code with err. */
int proto_parse_logit_bias(const json_t *v, proto_req_t *req, char *err, size_t errlen);
/* req's logit_bias as the wire writes it (a new object), NULL on OOM. */
json_t *proto_logit_bias_new(const proto_req_t *req);

/* proto_tools.c (below proto.c): the chat op's tool fields and the tool parts of messages;
 * 0 or -code with err, the encoders -1 on OOM. */
int proto_parse_tools(const json_t *v, proto_req_t *req, char *err, size_t errlen);
int proto_parse_tool_choice(const json_t *v, proto_req_t *req, char *err, size_t errlen);
int proto_parse_parallel_tools(const json_t *v, proto_req_t *req, char *err, size_t errlen);
int proto_tools_check(const proto_req_t *req, char *err, size_t errlen);
/* Frees the tool parts of req and of its messages (proto_req_free). */
void proto_tools_free(proto_req_t *req);
/* messages[i]'s tool_calls and tool_call_id (role: its index in system, user, assistant,
 * tool); an assistant message with calls and no content gets pm->content "". */
int proto_parse_msg_tools(size_t i, const json_t *m, int role, proto_msg_t *pm, char *err,
                          size_t errlen);
int proto_tools_encode(json_t *root, const proto_req_t *req);
int proto_tools_encode_msg(json_t *m, const proto_msg_t *pm);

#endif
