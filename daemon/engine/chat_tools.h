/* chat_tools: tool calls in chat prompts (OpenAI's tools, assistant tool_calls, tool results) rendered per family, and the tool calls a model wrote parsed back (docs/TOOLS.md). */
#ifndef CHAT_TOOLS_H
#define CHAT_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "engine/chat.h"

/* How a model writes tool calls, from its template text. */
typedef enum chat_tools_style {
    CHAT_TOOLS_GENERIC = 0, /* no native syntax: tools only with tool_choice required or a named
                               function, the output one JSON object {"name", "arguments"} */
    CHAT_TOOLS_HERMES,      /* Qwen2.5-Instruct's template: a "# Tools" system block and
                               <tool_call>{json}</tool_call> blocks (Hermes' convention) */
    CHAT_TOOLS_PENDING,     /* a native syntax gpuswapd does not render yet (Llama 3.x without
                               its template text, Mistral, Phi-4-mini, Hermes 2 Pro/3's own
                               template): as GENERIC, but auto is refused as "not supported yet" */
    CHAT_TOOLS_LLAMA3,      /* Llama 3.1/3.3-Instruct's template: tools in the first user
                               message, a call is the answer {"name", "parameters"}, results in
                               ipython turns; "Today Date: 26 Jul 2024" */
    CHAT_TOOLS_LLAMA32,     /* Llama 3.2-Instruct's template: as LLAMA3, today's date
                               (strftime_now("%d %b %Y")) */
    CHAT_TOOLS_QWEN3,       /* Qwen3's template: HERMES's blocks, no default system message,
                               <think> kept only after the last user query */
    CHAT_TOOLS_HERMES2,     /* NousResearch Hermes 2 Pro / Hermes 3 tool_use template: tools as
                               Python signatures and JSON in the system turn, <tool_call> blocks,
                               results in "tool" turns */
    CHAT_TOOLS_MISTRAL,     /* Mistral Nemo's template: [AVAILABLE_TOOLS] before the last user
                               turn, calls as [TOOL_CALLS][{...}], [TOOL_RESULTS] with 9-character
                               call ids */
    CHAT_TOOLS_PHI4,        /* Phi-4-mini's template: the tools in the system turn between <|tool|>
                               and <|/tool|>, calls as <|tool_call|>[{...}]<|/tool_call|> */
    CHAT_TOOLS_MISTRAL3,    /* Mistral-7B-Instruct-v0.3's (v3) template: as MISTRAL with a space
                               after "[INST]", "[AVAILABLE_TOOLS]", "[TOOL_CALLS]" and
                               "[TOOL_RESULTS]", answers " " + trimmed content */
} chat_tools_style_t;

/* tool_choice: what the model may or must do. */
typedef enum chat_tool_choice {
    CHAT_TOOL_AUTO = 0, /* call or answer: free generation, calls parsed from the output */
    CHAT_TOOL_NONE,     /* never call: tools are not rendered, nothing is parsed */
    CHAT_TOOL_REQUIRED, /* a call to one of the tools, enforced (one or more where parallel
                           calls are allowed and the style lists calls or writes blocks) */
    CHAT_TOOL_NAMED,    /* exactly one call to the named function, enforced */
} chat_tool_choice_t;

/* The tool syntax of a model of family f whose template text is tmpl (len bytes; NULL = the
 * family's name was configured, no text). */
chat_tools_style_t chat_tools_detect(chat_family_t f, const char *tmpl, size_t len);

/* The style's name for messages ("hermes", ...). */
const char *chat_tools_style_name(chat_tools_style_t st);

/* 1 when any message carries tool_calls or has role "tool" (the conversation needs
 * chat_tools_render even without tools). */
int chat_tools_in_messages(const chat_msg_t *msgs, size_t n);

/* Renders msgs with tools (an array of OpenAI tool objects, NULL or empty = none listed) as
 * chat_render does: HERMES byte for byte as Qwen2.5-Instruct's Jinja template with
 * add_generation_prompt, LLAMA3/LLAMA32 as Llama 3.1/3.3/3.2-Instruct's (bos_token left to the
 * tokenizer; an assistant message with several calls, or tools without a message after the
 * system one, is CHAT_ERR_TEMPLATE as the template's raise_exception); GENERIC and PENDING through family f's table (docs/TOOLS.md: the tools
 * in a system message, calls and results as plain text). forced adds the text a forced call
 * starts with to the prompt (HERMES: "<tool_call>\n"). *out malloc'ed (caller frees);
 * CHAT_ERR_* with the reason in err. */
int chat_tools_render(chat_family_t f, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                      const json_t *tools, int forced, char **out, char *err, size_t errlen);

/* The response_format (json_schema) a forced call's output follows: {"name": the function (const)
 * or one of the tools' names (enum), "arguments" ("parameters" for LLAMA3/LLAMA32): the
 * function's parameters schema (named, or required with one tool) or any object}; for the listed
 * styles a JSON list of that call, of exactly one or, with many (required with parallel calls),
 * one or more. A new reference; NULL when name names no tool or on OOM. */
json_t *chat_tools_call_schema(chat_tools_style_t st, const json_t *tools, const char *name,
                               int many);

/* Parses a model's output into content and tool calls (docs/TOOLS.md: which output stays
 * content). forced: the whole text is one JSON call (the prompt held any opening tag);
 * otherwise HERMES <tool_call> blocks, LLAMA3/LLAMA32 a whole text (spaces aside) that is one
 * {"name", "parameters"} object (other styles: nothing is parsed); forced with parallel in the
 * <tool_call> styles, a text that is no one call is read as blocks after the prompt's opening
 * tag ("{call}\n</tool_call>\n<tool_call>\n{call}..."). parallel 0 keeps the
 * first call and leaves later blocks in the content. ids: each call's id is id_prefix followed
 * by its index. Returns the number of calls; *calls (new array of {id, type, function: {name,
 * arguments}}, arguments a JSON text) and *content (malloc'ed) are set when it is > 0 and
 * left NULL otherwise; -1 on OOM. */
int chat_tools_parse(chat_tools_style_t st, const char *text, const json_t *tools, int forced,
                     int parallel, const char *id_prefix, json_t **calls, char **content);

/* A generation's calls streamed as they are written (docs/TOOLS.md "Streaming"): opaque. */
typedef struct chat_tools_stream chat_tools_stream_t;

/* A stream for a generation parsed as chat_tools_parse(st, ..., tools, forced, parallel,
 * id_prefix) parses it (tools: a reference is taken). NULL on OOM; chat_tools_stream_free. */
chat_tools_stream_t *chat_tools_stream_new(chat_tools_style_t st, const json_t *tools, int forced,
                                           int parallel, const char *id_prefix);

/* Accepts NULL. */
void chat_tools_stream_free(chat_tools_stream_t *ts);

/* text: the whole output so far (len bytes; it only grows between calls). Returns how many of
 * its bytes may go out as content (those before any call, or what may still become one);
 * *deltas: a new array of OpenAI delta.tool_calls entries for what the calls added since the last
 * feed ({index, id, type, function: {name, arguments: ""}} when a call opens, its name written
 * and known, before its arguments; {index, function: {arguments: fragment}} as they grow, with
 * whitespace outside strings left out), NULL when none. */
size_t chat_tools_stream_feed(chat_tools_stream_t *ts, const char *text, size_t len,
                              json_t **deltas);

/* The end: chat_tools_parse of the whole text (*calls, *content, its return), each call's id
 * set to the one streamed, and *deltas (new array, NULL with no call) for what the calls add to
 * what was streamed: the rest of an opened call's arguments, and whole every call that was not
 * opened, at the index after the opened ones. An opened call the parse did not take (cut off,
 * invalid) keeps its index: its text is in *content. -1 on OOM (nothing set). */
int chat_tools_stream_end(chat_tools_stream_t *ts, const char *text, json_t **calls, char **content,
                          json_t **deltas);

/* The text a call opens with in free generation ("<tool_call>", "[TOOL_CALLS]",
 * "<|tool_call|>"); NULL for the styles without one (Llama 3.x: the whole answer; generic). */
const char *chat_tools_marker(chat_tools_style_t st);

/* 1 when text (len bytes) is one of the style's tool-call markers, the texts a real vocabulary
 * may hold as control tokens and the worker then keeps in the decoded output of a request with
 * tools: "<tool_call>" and "</tool_call>" (hermes, qwen3, hermes2), "[TOOL_CALLS]" (mistral),
 * "<|tool_call|>" and "<|/tool_call|>" (phi4), "<|python_tag|>" (Llama 3.1/3.3); 0 otherwise. */
int chat_tools_is_marker(chat_tools_style_t st, const char *text, size_t len);

/* 1 for the styles whose calls are one JSON array after the marker (Mistral, Phi-4-mini). */
int chat_tools_listed(chat_tools_style_t st);

/* 1 for the styles whose call is the whole answer, a {"name", "parameters"} object (Llama 3.x). */
int chat_tools_is_llama3(chat_tools_style_t st);

/* Appends v as Python's json.dumps(v, ensure_ascii=False) writes it (", " and ": " separators,
 * keys in their order, floats as repr) to a malloc'ed string (caller frees); NULL on OOM. */
char *chat_tools_pyjson(const json_t *v);

#endif
