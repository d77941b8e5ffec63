/* wk_event: the typed events the worker hands to the front ends (socket server, HTTP), which each encode them once; no JSON text crosses. */
#ifndef WK_EVENT_H
#define WK_EVENT_H

#include <jansson.h>
#include <stdint.h>

#include "proto.h"

typedef enum wk_event_kind {
    WK_EVENT_TOKEN = 1, /* generated text streamed: text, token, ts */
    WK_EVENT_DONE,      /* a generation ended: text (all of it), finish, usage, timing */
    WK_EVENT_ERROR,     /* a request failed: code, message */
    WK_EVENT_RESULT,    /* an op's answer (models, stats, admin replies...): body */
    WK_EVENT_PROGRESS,  /* an admin load streams its progress: model, bytes, total */
} wk_event_kind_t;

/*
 * The fields of an event, declared once: X(own, type, name), own saying what
 * wk_event_clear does with it (VAL nothing, STR free(), JSON json_decref()).
 * Each kind reads only the fields its comment above names; the others stay
 * zero. Text is UTF-8 as the model wrote it, unchecked: the encoders write
 * U+FFFD for bad bytes. A new field is one row here plus the encoders that
 * show it (srv_event_line in server.c, the OpenAI encoders in http.c); the
 * outbox, the server's dispatch and the foreign sink carry it unchanged.
 */
#define WK_EVENT_FIELDS(X)                                                                         \
    X(VAL, uint64_t, conn)              /* the connection it goes to (server's id space) */        \
    X(JSON, json_t *, id)               /* the request's id, a reference; NULL = null */           \
    X(STR, char *, text)                /* TOKEN: the new text, maybe ""; DONE: all of it */       \
    X(VAL, int32_t, token)              /* TOKEN: sampled token id; -1 = none (end flush) */       \
    X(VAL, double, ts)                  /* TOKEN: s, monotonic clock, when made; < 0 = none */     \
    X(VAL, proto_finish_t, finish)      /* DONE: why the generation ended */                       \
    X(VAL, uint32_t, prompt_tokens)     /* DONE: usage, tokens of the prompt */                    \
    X(VAL, uint32_t, completion_tokens) /* DONE: usage, tokens generated */                        \
    X(VAL, uint32_t, cached_tokens)     /* DONE: usage, prompt tokens a cached prefix covered */   \
    X(VAL, proto_timing_t, timing)      /* DONE: queue/swap/ttft/total ms, swapped */              \
    X(VAL, proto_err_t, code)           /* ERROR: the wire code */                                 \
    X(STR, char *, message)             /* ERROR: what went wrong; NULL = the code itself */       \
    X(VAL, uint32_t, retry_ms)          /* ERROR: try again after this many ms; 0 = not said */    \
    X(JSON, json_t *, body)             /* RESULT: the answer's fields (object); NULL = none */    \
    X(STR, char *, model)               /* PROGRESS: the model being loaded */                     \
    X(VAL, uint64_t, bytes)             /* PROGRESS: bytes on the device so far */                 \
    X(VAL, uint64_t, total)             /* PROGRESS: bytes of the whole model */                   \
    X(VAL, uint32_t, index)             /* TOKEN, DONE: the choice, 0..choices-1 */                \
    X(VAL, uint32_t, choices)           /* TOKEN, DONE: the request's n (0 or 1: one choice) */    \
    X(VAL, uint32_t, left)              /* DONE: choices still running after this one */           \
    X(JSON, json_t *, logprobs)   /* TOKEN: the token's entry (proto_logprob_new); DONE:    \
                                           all of the choice's (array); NULL = not asked */      \
    X(JSON, json_t *, tool_calls) /* DONE: the calls parsed from the output (array of       \
                                           {id, type, function: {name, arguments}}); text is then \
                                           the content left; TOKEN: the calls' deltas as written  \
                                           (chat_tools_stream_feed); NULL = none */

#define WK_EVENT_FIELD(own, type, name) type name;
/* One event. Owned fields (STR, JSON) belong to the event: wk_event_clear
 * releases them; a front end reads an event it is handed without keeping
 * any pointer of it. */
typedef struct wk_event {
    wk_event_kind_t kind;
    WK_EVENT_FIELDS(WK_EVENT_FIELD)
} wk_event_t;
#undef WK_EVENT_FIELD

/* Releases what ev owns and zeroes it; accepts NULL. */
void wk_event_clear(wk_event_t *ev);

#endif
