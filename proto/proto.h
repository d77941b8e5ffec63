/* proto: the JSON-line codec of the inference and admin sockets (proto/PROTOCOL.md), shared by the daemon and the C client. */
#ifndef PROTO_H
#define PROTO_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/chat.h"
#include "engine/sampler_params.h"

/* Limits the parser enforces (PROTOCOL.md section 5). */
#define PROTO_MAX_DEPTH 32              /* JSON nesting levels */
#define PROTO_MAX_ID_BYTES 256          /* id and target strings */
#define PROTO_MAX_NAME_BYTES 256        /* model names */
#define PROTO_MAX_KEY_BYTES 256         /* API keys (auth) */
#define PROTO_MAX_TOKENS 1000000        /* entries of "tokens" */
#define PROTO_MAX_MESSAGES 65536        /* entries of "messages" */
#define PROTO_MAX_STOP 16               /* entries of "stop" */
#define PROTO_MAX_STOP_BYTES 256        /* bytes of one stop string */
#define PROTO_MAX_TOP_LOGPROBS 20       /* top_logprobs */
#define PROTO_MAX_LOGIT_BIAS 1024       /* entries of "logit_bias" */
#define PROTO_MAX_CHOICES 16            /* n */
#define PROTO_MAX_DEADLINE_MS 86400000u /* deadline_ms: a day */

typedef enum proto_op {
    PROTO_OP_GENERATE = 1,
    PROTO_OP_CHAT,
    PROTO_OP_TOKENIZE,
    PROTO_OP_MODELS, /* both sockets */
    PROTO_OP_CANCEL,
    /* admin */
    PROTO_OP_STATS,
    PROTO_OP_LOAD,
    PROTO_OP_EVICT,
    PROTO_OP_PIN,
    PROTO_OP_UNPIN,
    PROTO_OP_RELOAD,
    PROTO_OP_DRAIN,
    PROTO_OP_FAULT, /* tests only: needs device.fault_injection (sim) */
    PROTO_OP_AUTH,  /* inference: present an API key (answered by the server, never the worker) */
} proto_op_t;

typedef enum proto_err {
    PROTO_E_BAD_JSON = 1,
    PROTO_E_BAD_REQUEST,
    PROTO_E_UNKNOWN_MODEL,
    PROTO_E_TOO_LARGE,
    PROTO_E_OVERLOADED,
    PROTO_E_CONTEXT_OVERFLOW,
    PROTO_E_CANCELLED,
    PROTO_E_SHUTTING_DOWN,
    PROTO_E_INTERNAL,
    PROTO_E_FORBIDDEN,
    PROTO_E_UNAUTHORIZED, /* no key, or one the daemon does not know (HTTP 401) */
    PROTO_E_RATE_LIMITED, /* a key's limit, or the back-off after failed attempts (HTTP 429) */
    PROTO_E_COUNT
} proto_err_t;

/* Why a generation ended: the done event's finish_reason. */
typedef enum proto_finish {
    PROTO_FINISH_STOP,      /* a stop string matched */
    PROTO_FINISH_EOS,       /* the model ended it (end-of-generation token) */
    PROTO_FINISH_LENGTH,    /* max_tokens or the context's end */
    PROTO_FINISH_CANCELLED, /* cancel op, or the client went away */
    PROTO_FINISH_COUNT
} proto_finish_t;
/* "stop", "eos", "length", "cancelled"; NULL outside the enum. */
const char *proto_finish_name(proto_finish_t f);

/* The wire code ("bad_json" ...); "internal" for a value outside the enum. */
const char *proto_err_code(proto_err_t e);
/* Inverse of proto_err_code; 0 for an unknown string or NULL. */
proto_err_t proto_err_from_code(const char *code);
/* The wire name of an op ("generate" ...); NULL for a value outside the enum. */
const char *proto_op_name(proto_op_t op);
/* The wire name of an admin fault kind ("copy_fail" ...); NULL outside the set. */
const char *proto_fault_name(int fault);
/* The admin fault kind past the backend's (be_fault_kind_t): the worker itself sleeps
 * delay_ms before each of its next count passes (a stall, for the latency tests). */
#define PROTO_FAULT_STALL 5

typedef chat_msg_t proto_msg_t; /* engine/chat.h: role ("system" | "user" | "assistant" |
                                   "tool"), content, tool_calls, tool_call_id */

/* A parsed request: plain data, every pointer owned by it (proto_req_free). */
typedef struct proto_req {
    proto_op_t op;
    json_t *id;      /* owned ref (string or integer), NULL if absent */
    char *model;     /* generate/chat/tokenize, and admin load/evict/pin/unpin */
    char *prompt;    /* generate: text, or NULL when tokens are given */
    int32_t *tokens; /* generate: (n_tokens) ids, or NULL when prompt is given */
    size_t n_tokens;
    proto_msg_t *messages; /* chat: (n_messages) */
    size_t n_messages;
    char *text;        /* tokenize */
    int add_bos;       /* tokenize: 1 unless "add_bos":false */
    char *target;      /* cancel: the target id as text (a string as is, an integer in decimal) */
    json_t *target_id; /* cancel: owned ref to the target id as sent; match with json_equal */
    /* sampling; has_* flags say which were given so model defaults apply to the rest */
    int32_t max_tokens;             /* >= 0 */
    SAMPLER_PARAMS(SAMPLER_X_FIELD) /* temperature, top_k, ...: ranges in sampler_params.h */
    uint64_t seed;                  /* 0 .. 2^63-1 */
    SAMPLER_PARAMS(SAMPLER_X_HAS)
    int has_max_tokens, has_seed;
    char **stop; /* (n_stop) non-empty strings; "stop":"x" gives one entry */
    size_t n_stop;
    int stream;           /* generate/chat: token events; admin load: progress events */
    int cache_off;        /* generate/chat: "cache_prompt": false, no prefix cache for it */
    char *cache_salt;     /* generate/chat: prefix cache entries are shared by whoever names the
                             same salt (instead of by API key); NULL = none */
    int logprobs;         /* generate/chat: each token's log-probability in the answer */
    int32_t top_logprobs; /* generate/chat: 0..PROTO_MAX_TOP_LOGPROBS alternatives per token
                             (needs logprobs) */
    int32_t *bias_ids;    /* generate/chat logit_bias: (n_bias) token ids, */
    float *bias;          /* and what is added to each one's logit, -100..100 */
    size_t n_bias;
    uint32_t deadline_ms;    /* generate/chat: its first token is wanted within this many ms of
                                arrival, else an overloaded answer at once (docs/overload.md);
                                0 = not given (the model's deadline, or none) */
    int batch;               /* generate/chat "class": "batch": it uses what interactive requests
                                leave (docs/overload.md); 0 = interactive (the default) */
    uint32_t n;              /* generate/chat: choices, 1..PROTO_MAX_CHOICES; 0 = not given (1) */
    int echo;                /* generate: the prompt's text heads the answer's text */
    char *suffix;            /* generate: the text after the gap (fill in the middle), or NULL */
    json_t *response_format; /* generate/chat: owned; {"type":"json_object"} or "json_schema" (the
                                worker compiles it); NULL = free text */
    char *grammar;   /* generate/chat: a GBNF-like grammar the output follows (the worker compiles
                      it; never with response_format); NULL = none */
    json_t *tools;   /* chat: owned; the OpenAI tool objects (array, validated:
                         {type: "function", function: {name, description?, parameters?}}); NULL
                         = none */
    int tool_choice; /* chat: chat_tool_choice_t (engine/chat_tools.h); 0 = auto */
    char *tool_name; /* chat: tool_choice's function name (CHAT_TOOL_NAMED), else NULL */
    int tool_choice_set; /* chat: the request named tool_choice (else the model's default applies) */
    int tools_serial;    /* chat: "parallel_tool_calls": false, at most one call */
    int fault;           /* admin fault: 0 off, 1 copy_fail, 2 copy_slow, 3 map_fail, 4 map_short
                  (be_fault_kind_t), 5 stall (PROTO_FAULT_STALL) */
    uint32_t fault_count;    /* admin fault: operations affected, 0 = not given (1) */
    uint32_t fault_delay_ms; /* admin fault copy_slow: extra ms per copy; stall: ms per pass */
    char *key;               /* auth: the API key as sent (secret: wiped by proto_req_free) */
    size_t key_len;          /* bytes of key, NULs (\u0000) included: a key holding one is checked
                     * whole and fails as a wrong key; 0 with key set = strlen(key) (encoders) */
    /* Not on the wire: the models the caller's API key may use, set by the server
     * (daemon/front/auth.c); NULL = every model. (n_allow) names, owned. */
    char **allow;
    size_t n_allow;
    /* Not on the wire: the name of the caller's API key, set by the server; NULL = no key.
     * The prefix cache shares entries only among requests of one key (or one cache_salt). */
    char *tenant;
} proto_req_t;

/* Parses one line (len bytes, without the newline; a trailing '\r' is fine).
 * admin selects the admin op set (models is in both). Returns 0 and fills req
 * (caller frees with proto_req_free; *id_out stays NULL, the id is req->id).
 * On failure returns -proto_err_t (BAD_JSON or BAD_REQUEST), writes the
 * message into err, leaves req empty (nothing to free), and sets *id_out to a
 * new reference to the request's id when one could be read (caller decrefs),
 * else NULL, so the error can be tagged. id_out and err may be NULL. */
int proto_parse_request(const char *line, size_t len, int admin, proto_req_t *req, json_t **id_out,
                        char *err, size_t errlen);
/* Sampling parameter i (sampler_param_id_t) of req as a double, and its has_ flag. */
void proto_req_sampler_get(const proto_req_t *req, int i, double *v, int *has);
/* Sets sampling parameter i of req to v (converted to its type) and its has_ flag. */
void proto_req_sampler_set(proto_req_t *req, int i, double v);
/* Frees everything req owns and zeroes it; accepts NULL. */
void proto_req_free(proto_req_t *req);

/* How every answer is dumped: compact, reals to 15 significant digits, so a
 * number reads the same on every surface (socket lines, HTTP bodies). */
#define PROTO_DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(15))

/* ------------------------------------------------------------------ encoders
 * Each returns one malloc'ed, NUL-terminated line INCLUDING the trailing '\n'
 * (caller frees with free()), NULL on OOM. id may be NULL (encoded as null).
 * Text that is not valid UTF-8 is encoded with U+FFFD for the bad bytes. */

/* What a token or done line adds for a request with n > 1 or logprobs. */
typedef struct proto_choice {
    uint32_t index;           /* the choice, 0..n-1; written when n > 1 */
    uint32_t n;               /* the request's choices */
    uint32_t left;            /* done: choices still running after this one; written when n > 1 */
    const json_t *logprobs;   /* token: one entry (object), done: an array of them; NULL = none */
    const json_t *tool_calls; /* done: the calls parsed from the output (array of {id, type,
                                 function: {name, arguments}}), finish_reason then "tool_calls";
                                 token: the calls' deltas as written (OpenAI's delta.tool_calls
                                 entries); NULL = none */
} proto_choice_t;
/* {"id":..,"event":"token","text":..,"token":N,"ts":S}; ts: seconds on the
 * daemon's monotonic clock when the token was produced (omitted when < 0);
 * c (NULL = none) adds "index", "logprobs" and "tool_calls" (deltas). */
char *proto_encode_token(const json_t *id, const char *text, int32_t token, double ts,
                         const proto_choice_t *c);

typedef struct proto_timing {
    double queue_ms, swap_ms, ttft_ms, total_ms; /* ms, encoded with 3 decimals at most */
    int swapped;
} proto_timing_t;

/* {"id":..,"event":"done","text":..,"finish_reason":..,"usage":{..},"timing":{..}} (and
 * "tool_calls" when c has them);
 * usage.cached_tokens (prompt tokens a cached prefix covered) only when not 0; t NULL omits
 * "timing"; c (NULL = none) adds "index", "left" and "logprobs". */
char *proto_encode_done(const json_t *id, const char *text, const char *finish_reason,
                        uint32_t prompt_tokens, uint32_t completion_tokens, uint32_t cached_tokens,
                        const proto_timing_t *t, const proto_choice_t *c);
/* {"id":..,"event":"error","ok":false,"error":{"code":..,"message":..}}: the one
 * shape of error on both sockets (the server's error emitter calls this).
 * message NULL uses the code itself; retry_after_ms, when not 0, goes into the error object
 * (overloaded: when to try again). */
char *proto_encode_error(const json_t *id, proto_err_t code, const char *message,
                         uint32_t retry_after_ms);
/* {"id":..,"ok":true, <fields of body>}: body is stolen (released even on
 * failure), may be NULL; its "id" and "ok" keys, if any, are ignored. A body
 * that is not an object gives NULL. */
char *proto_encode_ok(const json_t *id, json_t *body);
/* {"id":..,"event":"progress","model":..,"bytes":..,"total":..} (admin load). */
char *proto_encode_progress(const json_t *id, const char *model, uint64_t bytes, uint64_t total);

/* A JSON string of s (NULL: ""), bytes that are not valid UTF-8 written as U+FFFD, as
 * every encoder writes text; new reference, NULL on OOM. For front ends that build
 * their own answers from the same text (daemon/front/http.c). */
json_t *proto_str_new(const char *s);

/* One token's logprobs entry as token and done lines carry it (PROTOCOL.md):
 * {"token":id,"text":..,"bytes":[..],"logprob":x[,"top_logprobs":[{"token","text","bytes",
 * "logprob"}..]]}; piece is the token's n bytes (any bytes: "text" is their UTF-8 with U+FFFD
 * for bad ones, "bytes" the exact ones). A new object, NULL on OOM. */
json_t *proto_logprob_new(int32_t token, const char *piece, size_t n, double logprob);

/* ------------------------------------------------------------------ client side */

/* Builds the request line for req (the inverse of proto_parse_request: parsing
 * the result gives an equal req). Only the fields req's op takes are written,
 * sampling fields only where has_* is set. NULL on OOM or an invalid op. */
char *proto_encode_request(const proto_req_t *req);

typedef struct proto_event {
    enum {
        PROTO_EV_TOKEN = 1,
        PROTO_EV_DONE,
        PROTO_EV_ERROR,
        PROTO_EV_OK,
        PROTO_EV_PROGRESS
    } kind;
    json_t *root; /* owned: the whole line */
    json_t *id;   /* borrowed from root; NULL when absent or null */
} proto_event_t;

/* Parses one line from the server. Returns 0 and fills ev (free with
 * proto_event_free), or -PROTO_E_BAD_JSON / -PROTO_E_BAD_REQUEST (not an
 * object, unknown event, a required field missing or mistyped) with ev empty
 * and a message in err. Checks: token has text and token, done has text and
 * finish_reason, error has error.code; unknown fields are ignored. */
int proto_parse_event(const char *line, size_t len, proto_event_t *ev, char *err, size_t errlen);
/* Releases ev->root and zeroes ev; accepts NULL. */
void proto_event_free(proto_event_t *ev);

#endif
