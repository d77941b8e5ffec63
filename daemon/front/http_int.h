/* http_int: what http.c shares with its rooms (http_openai.c, http_metrics.c); not for other modules.
 * The rooms call nothing in http.c: http.c calls down into them. */
#ifndef HTTP_INT_H
#define HTTP_INT_H

#include <event2/buffer.h>
#include <jansson.h>

#include "http.h"

/* ------------------------------------------------------------------ http_openai.c */

/* The first chunk of a streamed chat answer's choice index: its delta carries the role
 * and empty content. A new reference, NULL on OOM. Pure: safe in any thread. */
json_t *http_role_chunk_of(const http_answer_t *a, uint32_t index);

/* ------------------------------------------------------------------ http_tools.c */

/* A chat answer's message for a DONE event: {role, content, tool_calls?}; with tool calls an
 * empty content is null. A new reference, NULL on OOM. */
json_t *http_tools_message(const wk_event_t *ev);
/* The streamed chunks of a DONE event's tool calls, as OpenAI sends them: per call one chunk with
 * index, id, type and name (arguments ""), then the arguments in fragments of at most 32 bytes
 * (never inside a UTF-8 character). An array of chunks (empty without calls), NULL on OOM. */
json_t *http_tool_chunks_of(const http_answer_t *a, const wk_event_t *ev);

/* ------------------------------------------------------------------ http_metrics.c */

/* Appends to b the Prometheus text (0.0.4) of rep, the worker's stats report:
 * the server and per-model families, the inference-gateway gauges (vllm_compat:
 * also under vLLM's names) and the API keys' usage (rep's "auth"). */
void http_metrics_render(struct evbuffer *b, const json_t *rep, int vllm_compat);

#endif
