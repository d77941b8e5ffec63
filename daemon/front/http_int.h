/* http_int: what http.c shares with its rooms (http_openai.c, http_ollama.c, http_metrics.c, http_headers.c); not for other modules.
 * The rooms call nothing in http.c: http.c calls down into them. */
#ifndef HTTP_INT_H
#define HTTP_INT_H

#include <event2/buffer.h>
#include <jansson.h>
#include <time.h>

#include "http.h"
#include "proto.h"

/* ------------------------------------------------------------------ http_headers.c */

struct evkeyvalq;
/* Every X-Forwarded-For line of in, in order, joined by ","; NULL when there is none (or out of
 * memory). The caller frees it. */
char *http_forwarded_for(const struct evkeyvalq *in);
/* X-Deadline-Ms (deadline_ms) and X-Request-Class (interactive or batch) of in into req where
 * its body set neither: 0, or -1 with a message in err for a value out of range. */
int http_request_headers(const struct evkeyvalq *in, proto_req_t *req, char *err, size_t errlen);

/* ------------------------------------------------------------------ http_openai.c */

/* The first chunk of a streamed chat answer's choice index: its delta carries the role
 * and empty content. A new reference, NULL on OOM. Pure: safe in any thread. */
json_t *http_role_chunk_of(const http_answer_t *a, uint32_t index);

/* ------------------------------------------------------------------ http_ollama.c */

/* The Ollama route of path (*want_post: POST only, else GET/HEAD); HTTP_OL_NONE if none. */
http_ol_t http_ollama_route(const char *path, int *want_post);

/* keep_alive's timers (loop thread): a duration pins the model and unpins and evicts it at
 * the deadline. The admin ops go to the worker under ids nobody owns (answers dropped). */
typedef struct http_ka http_ka_t;
http_ka_t *http_ka_new(struct event_base *base, wk_t *wk, srv_t *srv); /* NULL on OOM */
void http_ka_free(http_ka_t *ka);                                      /* accepts NULL */
/* After a request for model: 0 unpins and evicts it now, < 0 pins it, a duration (ms) pins it
 * until a timer unpins and evicts it; HTTP_KA_NONE changes nothing. Replaces model's timer. */
void http_ka_apply(http_ka_t *ka, const char *model, int64_t keep_alive);
/* The unix time model's timer fires; 0 if it has none. */
time_t http_ka_deadline(const http_ka_t *ka, const char *model);

/* What an Ollama answer says of its request (strings borrowed). */
typedef struct http_ol_answer {
    http_ol_t ol;      /* HTTP_OL_CHAT (message.content) or HTTP_OL_GENERATE (response) */
    const char *model; /* the model the request named */
    int stream;        /* NDJSON: the final object's text is "" (the chunks had it) */
} http_ol_answer_t;

/* TOKEN -> one NDJSON chunk ("done": false); DONE -> the final object (done_reason and the
 * durations in ns, counts); other events NULL. A new reference, NULL on OOM. */
json_t *http_ollama_chunk_of(const http_ol_answer_t *a, const wk_event_t *ev);
/* The answer to a load (unload: 1, keep_alive 0) request without prompt. New reference. */
json_t *http_ollama_load_of(const http_ol_answer_t *a, int unload);
/* {"error": message}. A new reference. */
json_t *http_ollama_error_of(const char *message);

/* What /api/tags, /api/ps and /api/show need beside the admin models answer. */
typedef struct http_ol_list {
    http_ol_t ol;
    const char *model;     /* /api/show: the model asked for */
    const auth_key_t *key; /* the caller's key: only the models it may use; NULL = all */
    const http_ka_t *ka;   /* /api/ps: expires_at from keep_alive's timers */
    time_t t_start;        /* modified_at: when the daemon started */
} http_ol_list_t;

/* The admin models answer rep as Ollama's {"models": [...]}, or /api/show's object; NULL when
 * /api/show's model is not there (or out of memory). A new reference. */
json_t *http_ollama_list_of(const http_ol_list_t *l, const json_t *rep);
/* /api/show's body: its "model" (or "name") as *model (caller frees); 0, or -proto_err_t. */
int http_ollama_model_of(const char *body, size_t len, char **model, char *err, size_t errlen);

/* ------------------------------------------------------------------ http_tools.c */

/* A chat answer's message for a DONE event: {role, content, tool_calls?}; with tool calls an
 * empty content is null. A new reference, NULL on OOM. */
json_t *http_tools_message(const wk_event_t *ev);
/* The streamed chunks of a DONE event's tool calls, as OpenAI sends them: per call one chunk with
 * index, id, type and name (arguments ""), then the arguments in fragments of at most 32 bytes
 * (never inside a UTF-8 character). An array of chunks (empty without calls), NULL on OOM. */
json_t *http_tool_chunks_of(const http_answer_t *a, const wk_event_t *ev);
/* A TOKEN event's tool_calls (the deltas chat_tools_stream_feed wrote as the model wrote the
 * calls) as chunks, one a delta, each delta.tool_calls [that delta]. An array, NULL on OOM. */
json_t *http_tool_deltas_of(const http_answer_t *a, const wk_event_t *ev);

/* ------------------------------------------------------------------ http_metrics.c */

/* Appends to b the Prometheus text (0.0.4) of rep, the worker's stats report:
 * the server and per-model families, the inference-gateway gauges (vllm_compat:
 * also under vLLM's names) and the API keys' usage (rep's "auth"). */
void http_metrics_render(struct evbuffer *b, const json_t *rep, int vllm_compat);

#endif
