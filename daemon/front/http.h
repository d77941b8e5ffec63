/* http: the OpenAI-compatible HTTP front end and /metrics, on libevent's evhttp in the loop thread. */
#ifndef HTTP_H
#define HTTP_H

#include <event2/event.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "server.h"
#include "worker/wk_event.h"
#include "worker/worker.h"

/*
 * Enabled only when the config sets listen.http ("host:port"; bind loopback,
 * e.g. 127.0.0.1:8400, unless auth.http requires API keys). Routes:
 *
 *   POST /v1/completions        model, prompt (a string, an array of one
 *                               string, or token ids), max_tokens,
 *                               temperature, top_p, stop, seed, stream,
 *                               stream_options.include_usage,
 *                               presence_penalty, frequency_penalty;
 *                               extensions top_k, min_p, repeat_penalty
 *                               (alias repetition_penalty): every
 *                               SAMPLER_PARAMS row; logprobs N (0..20: the
 *                               token's and N alternatives' logprobs, the
 *                               legacy tokens/token_logprobs/top_logprobs/
 *                               text_offset shape), logit_bias, n (1..16),
 *                               echo (not with logprobs), suffix (models
 *                               with fill-in-the-middle tokens, else 400)
 *   POST /v1/chat/completions   the same with messages (content a string or
 *                               text parts; role developer = system),
 *                               max_completion_tokens (alias of max_tokens),
 *                               logprobs (boolean) and top_logprobs (0..20:
 *                               choices[i].logprobs.content[] of {token,
 *                               logprob, bytes, top_logprobs})
 *   GET  /v1/models, /v1/models/{id}
 *   GET  /health                200 {"status":"ok"}; 503 {"status":"draining"}
 *   GET  /metrics               Prometheus text 0.0.4, rendered from the
 *                               worker's one stats report (admin `stats`)
 *   /api/chat, /api/generate, /api/tags, /api/ps, /api/show, /api/version: Ollama's API
 *                               (http_ollama.c, docs/ollama.md): NDJSON streams, errors
 *                               {"error": "message"}, keep_alive as pin/unpin/evict
 *
 * Each HTTP request is translated into a JSON-lines request and parsed by
 * proto_parse_request (the socket's validation and messages), then handed to
 * the worker under a connection id from the server's space
 * (srv_conn_id_new); the server forwards the worker's events (wk_event.h) for
 * ids it does not own here (srv_set_foreign), and the answer is built from
 * their typed fields (http_chunk_of, http_completion_of). Errors go through
 * the server's one emitter
 * (srv_send_error: counted) and come back as OpenAI's shape
 * {"error":{"message","type","param":null,"code"}}, code being the wire code:
 *   400 bad_json, bad_request, context_overflow   404 unknown_model, unknown path
 *   405 known path, wrong method                  413 too_large (body > listen.max_line)
 *   429 rate_limited (Retry-After)                503 overloaded (Retry-After: for a deadline when
 *                                                 to try again, docs/overload.md), shutting_down,
 *                                                 cancelled
 *   401 unauthorized (WWW-Authenticate: Bearer)   500 internal
 *
 * API keys (auth.http, daemon/auth.c): every route but /health and /ready
 * needs "Authorization: Bearer KEY"; the key's allow-list goes with the
 * request to the worker (proto_req_t.allow) and its limits are checked before
 * it is submitted; /metrics there needs a key for every model (others: 404).
 * The metrics listener needs no key.
 * logprobs are the model's raw distribution, as OpenAI defines them: the
 * log-softmax of the logits before logit_bias, penalties, temperature and
 * truncation. n > 1 runs n sibling sequences (choice i's seed derived from
 * seed: sampler_seed_of_choice; choice 0 draws what n = 1 draws); usage counts
 * the prompt once and every choice's tokens.
 * OpenAI fields gpuswapd does not implement are accepted while they hold
 * their "off" value (best_of 1, no functions/function_call (the legacy API);
 * user, store, metadata and service_tier always) and are a 400 otherwise, as
 * is any unknown field. tools, tool_choice, parallel_tool_calls and messages'
 * tool_calls / tool_call_id (role tool) pass to the socket's chat op
 * (docs/TOOLS.md): answers with calls carry message.tool_calls (content null
 * when empty) and finish_reason "tool_calls"; streamed, the calls come as
 * delta.tool_calls chunks (index, id, type, name, then argument fragments)
 * before the final chunk. max_tokens defaults to the model's configured default, not OpenAI's 16.
 * llama.cpp's grammar extension (a GBNF-like grammar string) passes through
 * on both endpoints as the socket's grammar field.
 *
 * finish_reason: length -> "length"; stop and eos -> "stop"; cancelled ->
 * "stop" (stays within OpenAI's set; an HTTP client cannot cancel except by
 * disconnecting, after which nothing is sent).
 *
 * Streaming (stream: true) answers with server-sent events once the first
 * token or the end arrives, so errors found before generation starts keep
 * their status: one `data: {chunk}` per token (object "text_completion" with
 * choices[0].text, or "chat.completion.chunk" with choices[0].delta, the
 * first chat chunk of each choice carrying the role; choices[0].index the
 * choice and choices[0].logprobs the token's when asked), a final chunk per
 * choice with finish_reason, a
 * usage chunk when stream_options.include_usage, then `data: [DONE]`. An error
 * after the stream started is sent as `data: {"error":{...}}` and ends it.
 *
 * A client that disconnects while its request is queued or generating
 * cancels it (wk_cancel_conn): seen at once where the event backend reports
 * peer close (epoll), else at the next write. Bodies up to 2 x max_line are
 * read and refused with the JSON 413; longer ones are cut off by evhttp,
 * which answers 413 itself with its own (HTML) body.
 *
 * HTTP connections are counted against listen.max_connections on their own
 * (the unix and TCP JSON-lines connections have the same limit, counted by the
 * server). One over it is still accepted so that its request can be answered
 * 503 overloaded (OpenAI's shape, Retry-After: 1, Connection: close) if it
 * arrives within 5 s; at most 64 such connections wait at a time, and further
 * ones are closed at once.
 */

#define GPUSWAPD_VERSION "0.2.0" /* --version and Ollama's GET /api/version */

typedef struct http http_t;

/* Binds cfg->listen.http and cfg->metrics.listen (at least one must be set;
 * the metrics listener serves GET /metrics and /health only) on base. cfg,
 * wk and srv must outlive the http_t. NULL + reason on failure. */
http_t *http_new(struct event_base *base, const cfg_t *cfg, wk_t *wk, srv_t *srv, char *err,
                 size_t errlen);
/* Closes the listener and every HTTP connection without telling the worker
 * (call after wk_free, before srv_free). Accepts NULL. */
void http_free(http_t *h);

/* The pure part of POST /v1/completions and /v1/chat/completions (path
 * selects which): maps an OpenAI request body (len bytes of JSON, not
 * NUL-terminated) onto one JSON-lines request tagged with id rid. Returns 0
 * with *line a malloc'ed, NUL-terminated line without the newline (caller
 * frees) and *include_usage set when the body asks for it; the line still
 * goes through proto_parse_request, which validates the values. On failure
 * *line is NULL, err holds the reason and the return value is
 * -PROTO_E_BAD_JSON (empty or malformed body), -PROTO_E_BAD_REQUEST (not an
 * object, an unknown or unsupported field, another path) or
 * -PROTO_E_INTERNAL (out of memory). No state is touched: safe in any thread. */
int http_request_map(const char *path, const char *body, size_t len, const char *rid, char **line,
                     int *include_usage, char *err, size_t errlen);

/* The Ollama routes (/api/..., http_ollama.c; docs/ollama.md). */
typedef enum http_ol {
    HTTP_OL_NONE = 0,
    HTTP_OL_CHAT,     /* POST /api/chat */
    HTTP_OL_GENERATE, /* POST /api/generate */
    HTTP_OL_TAGS,     /* GET  /api/tags: the configured models */
    HTTP_OL_PS,       /* GET  /api/ps: the models on the device */
    HTTP_OL_SHOW,     /* POST /api/show: one model's details */
    HTTP_OL_VERSION,  /* GET  /api/version */
} http_ol_t;

#define HTTP_KA_NONE INT64_MIN /* keep_alive absent: residency as the daemon's policy has it */

/* What an Ollama generation request says beside its JSON-lines line. */
typedef struct http_ol_req {
    int stream;         /* NDJSON answer: Ollama's default, off with "stream": false */
    int64_t keep_alive; /* ms: 0 unload after it, < 0 (-1) keep forever; HTTP_KA_NONE absent */
    int load;           /* no prompt (generate) or no messages (chat): load or unload only */
} http_ol_req_t;

/* The pure part of POST /api/chat and /api/generate (ol): maps an Ollama body (len bytes of
 * JSON) onto one JSON-lines request tagged rid, as http_request_map does (the same return
 * values, *line the caller's), and fills *info. Unknown fields and options are ignored as
 * Ollama ignores them; images, tools, template, context and think are refused. */
int http_ollama_map(http_ol_t ol, const char *body, size_t len, const char *rid, char **line,
                    http_ol_req_t *info, char *err, size_t errlen);

/* What an OpenAI answer says of its request (plain data; strings borrowed). */
typedef struct http_answer {
    const char *rid;   /* the answer's id: "cmpl-..." or "chatcmpl-..." */
    const char *model; /* the model the request named */
    int64_t created;   /* unix seconds at its arrival */
    int chat;          /* /v1/chat/completions (chat.completion objects), else /v1/completions */
    size_t *offset;    /* completions' logprobs.text_offset: characters of text before the next
                          token, one per choice (PROTO_MAX_CHOICES), advanced; NULL = from 0 */
} http_answer_t;

/* The OpenAI encoders of the worker's generation events: a new reference, or
 * NULL on OOM or for an event they do not encode. Pure: safe in any thread.
 *   http_chunk_of       one streamed chunk (object "text_completion" or
 *                       "chat.completion.chunk"): TOKEN -> its text (and
 *                       logprobs) in choices[0].text or .delta.content, with
 *                       the event's index; DONE -> that choice's last chunk,
 *                       with finish_reason; usage set: DONE -> the usage chunk
 *                       (choices empty, usage with total_tokens)
 *   http_choice_of      DONE -> one choice of a request without stream (index,
 *                       text or message, logprobs, finish_reason)
 *   http_completion_of  the last DONE of a request without stream -> the whole
 *                       answer: its choice plus those of the earlier DONEs
 *                       (more: http_choice_of's, an array, borrowed; NULL =
 *                       none) sorted by index, and the usage of the last */
json_t *http_chunk_of(const http_answer_t *a, const wk_event_t *ev, int usage);
json_t *http_choice_of(const http_answer_t *a, const wk_event_t *ev);
json_t *http_completion_of(const http_answer_t *a, const wk_event_t *ev, const json_t *more);

#endif
