/* chat_tools_int: what the per-family tool renderers (chat_tools_hermes.c, _llama.c, _mistral.c) share with chat_tools.c: Python's json.dumps, the calls of an assistant message, Jinja's trim, the tool list. */
#ifndef CHAT_TOOLS_INT_H
#define CHAT_TOOLS_INT_H

#include <jansson.h>
#include <stddef.h>

#include "engine/chat_buf.h"
#include "engine/chat_tools.h"

/* s (n bytes) as a JSON string the way Python's json.dumps(ensure_ascii=False) writes it. */
void ct_py_string(chat_buf_t *b, const char *s, size_t n);

/* v as json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: None) at depth d. */
void ct_py_dump(chat_buf_t *b, const json_t *v, int indent, int d);

/* A call's {name, arguments} from one OpenAI tool_calls entry (its function object, or the
 * entry itself); the arguments as a JSON value: a string that parses is parsed (OpenAI sends
 * text, the template wants the object), else the value as given. New reference or NULL. */
json_t *ct_call_args(const json_t *call, const char **name);

/* One call as {"name": "N", "arguments": A} with A in json.dumps form. */
void ct_put_call(chat_buf_t *b, const json_t *call);

/* s as Jinja's |trim writes it (NULL: ""). */
void ct_put_trimmed(chat_buf_t *b, const char *s);

/* The tool object's function (OpenAI: {"type": "function", "function": {...}}). */
const json_t *ct_tool_fn(const json_t *tool);

/* The tool whose function is named name, or NULL. */
const json_t *ct_tool_named(const json_t *tools, const char *name);

/* One call from JSON text (n bytes): {id, type, function: {name, arguments}} when it is an
 * object with a string name among the tools and an object under key ("arguments", Llama 3's
 * "parameters"); else NULL. */
json_t *ct_call_of(const char *s, size_t n, const json_t *tools, const char *key, const char *id);

/* The content left when calls were taken out: trimmed of whitespace at both ends. */
char *ct_trimmed(const chat_buf_t *b);

/* The family renderers, add_generation_prompt on (docs/TOOLS.md). CHAT_OK, or CHAT_ERR_TEMPLATE
 * with err set where the template raises. */
int ct_render_hermes(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                     const json_t *tools, char *err, size_t errlen);
int ct_render_llama3(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                     const json_t *tools, char *err, size_t errlen);
int ct_render_mistral(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                      const json_t *tools, char *err, size_t errlen);
int ct_render_phi4(chat_buf_t *b, const chat_msg_t *msgs, size_t n, const json_t *tools, char *err,
                   size_t errlen);

/* 1 when name is one of Llama 3.1/3.3's built-in tools (brave_search, wolfram_alpha,
 * code_interpreter) and st is LLAMA3 (3.2's template has none). */
int ct_llama3_builtin(chat_tools_style_t st, const char *name);

/* A Llama 3.1/3.3 built-in call in text (spaces first allowed): <|python_tag|> (optional) and
 * name.call(k="v", ...) for a built-in tool among tools, arguments {k: "v"}; after the tag a
 * custom {"name", "parameters"} call, or any other text as code_interpreter's {"code"} when it
 * is among tools. New call or NULL. */
json_t *ct_llama3_builtin_call(const char *text, const json_t *tools, const char *id);

/* 1 when text (len bytes, spaces first skipped) may still become a built-in call: a part of
 * <|python_tag|>, or of "name.call(" for a built-in tool among tools. */
int ct_llama3_may_call(const char *text, size_t len, const json_t *tools);

/* A Mistral call id: 9 letters and digits from id_prefix and index (its template refuses any
 * other length). out holds 10 bytes. */
void ct_mistral_id(const char *id_prefix, size_t index, char out[10]);

/* ------------------------------------------------------------------ JSON scanning
 * (chat_tools_json.c): the raw text of a call as the model writes it, read as it grows. */

/* Past the spaces (JSON's whitespace) at s[i] (len bytes in all). */
size_t ct_json_ws(const char *s, size_t len, size_t i);

/* Past the JSON value starting at s[i] (len bytes in all); *st 1: whole, 0: cut off by len (the
 * value may go on), -1: not a value. Brackets are counted, not matched: jansson judges. */
size_t ct_json_skip(const char *s, size_t len, size_t i, int *st);

/* s (n bytes of JSON, maybe cut off) with the whitespace outside strings left out: a call's
 * arguments text, streamed and parsed alike. */
void ct_json_compact(chat_buf_t *b, const char *s, size_t n);

/* A call object {"name": N, key: A, ...} as far as it is written. */
typedef struct ct_scan {
    int state;           /* 1: the object is whole, 0: cut off by len, -1: not a call object */
    size_t end;          /* state 1: past its "}" */
    size_t name0, name1; /* the name's characters (between its quotes; 0, 0: no plain string) */
    int args;            /* key's value: 0 not seen, 1 cut off, 2 whole (the last key counts) */
    size_t a0, a1;       /* key's value: s[a0..a1) */
    int name_first;      /* the name came before key's value */
} ct_scan_t;

/* Scans the call object starting at s[i] (the "{"). */
void ct_call_scan(const char *s, size_t len, size_t i, const char *key, ct_scan_t *sc);

#endif
