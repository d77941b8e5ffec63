/* chat: renders chat messages into a prompt as llama.cpp's built-in chat templates do, the family detected from the model's template text. */
#include "engine/chat.h"
#include "engine/chat_buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the families */

/* How a message of one role is written: pre, the content, post. "%r" in
 * pre stands for the role, "%R" for the role with its first letter upper
 * case. A NULL pre means "as the row's other roles"; a NULL pre there means
 * the message is left out. */
typedef struct chat_turn {
    const char *pre;
    const char *post;
} chat_turn_t;

enum {
    CHAT_M_INST = 1u << 0,     /* match only text that starts with "mistral" or holds "[INST]" */
    CHAT_TRIM = 1u << 1,       /* every content trimmed of ASCII whitespace */
    CHAT_TRIM_REPLY = 1u << 2, /* the content of roles other than system and user trimmed */
    CHAT_SYS_MERGE =
        1u << 3, /* a system content is held, then written with "\n\n" after the next user
                                * message's pre (nothing when it is empty) */
    CHAT_SYS_FIRST = 1u << 4,  /* a system message is written only as the first message */
    CHAT_HEAD_OPENS = 1u << 5, /* the head opens the first turn */
};

typedef struct chat_def {
    chat_family_t id;
    const char *name; /* llama.cpp's name, also accepted as the template text */
    /* detection: the text holds every all[] needle and, if any[0], one of any[] */
    unsigned flags; /* CHAT_* above */
    const char *all[3];
    const char *any[2];
    /* rendering */
    const char *head; /* before everything */
    const char *open; /* turn-based families: starts a turn at a message when none is open;
                          * a message of a role other than system or user ends the turn */
    const char *sep;  /* (optional) between two messages */
    chat_turn_t sys, user, asst, other;
    const char *gen; /* the assistant prefix that ends the prompt; NULL none */
} chat_def_t;

#define FWBAR "\xEF\xBD\x9C"     /* U+FF5C, DeepSeek's fullwidth bar */
#define SPM_SPACE "\xE2\x96\x81" /* U+2581 */
#define DS_EOS "<" FWBAR "end" SPM_SPACE "of" SPM_SPACE "sentence" FWBAR ">"
#define MISTRAL_ANY                                                                                \
    {                                                                                              \
        "' [INST] ' + system_message", "[AVAILABLE_TOOLS]"                                         \
    }

/* Every family, in the order llama.cpp's matcher tries them (first match
 * wins; a family name as the whole text is tried before all of them). */
static const chat_def_t chat_defs[] = {
    {CHAT_PHI4,
     "phi4",
     0,
     {"<|im_start|>", "<|im_sep|>"},
     {0},
     .other = {"<|im_start|>%r<|im_sep|>", "<|im_end|>"},
     .gen = "<|im_start|>assistant<|im_sep|>"},
    {CHAT_CHATML,
     "chatml",
     0,
     {"<|im_start|>"},
     {0},
     .other = {"<|im_start|>%r\n", "<|im_end|>\n"},
     .gen = "<|im_start|>assistant\n"},
    {CHAT_MISTRAL_V7,
     "mistral-v7",
     CHAT_M_INST,
     {"[SYSTEM_PROMPT]"},
     {0},
     .sys = {"[SYSTEM_PROMPT] ", "[/SYSTEM_PROMPT]"},
     .user = {"[INST] ", "[/INST]"},
     .other = {" ", "</s>"}},
    {CHAT_MISTRAL_V1,
     "mistral-v1",
     CHAT_M_INST,
     {" [INST]"},
     MISTRAL_ANY,
     .open = " [INST] ",
     .sys = {"", "\n\n"},
     .user = {"", " [/INST]"},
     .other = {" ", "</s>"}},
    {CHAT_MISTRAL_V3_TEKKEN,
     "mistral-v3-tekken",
     CHAT_M_INST,
     {"\"[INST]\""},
     MISTRAL_ANY,
     .open = "[INST]",
     .sys = {"", "\n\n"},
     .user = {"", "[/INST]"},
     .other = {"", "</s>"}},
    {CHAT_MISTRAL_V3,
     "mistral-v3",
     CHAT_M_INST | CHAT_TRIM_REPLY,
     {0},
     MISTRAL_ANY,
     .open = "[INST] ",
     .sys = {"", "\n\n"},
     .user = {"", "[/INST]"},
     .other = {" ", "</s>"}},
    {CHAT_LLAMA2_SYS_STRIP,
     "llama2-sys-strip",
     CHAT_M_INST | CHAT_TRIM | CHAT_HEAD_OPENS,
     {"content.strip()"},
     {0},
     .head = "[INST] ",
     .open = "[INST] ",
     .sys = {"<<SYS>>\n", "\n<</SYS>>\n\n"},
     .user = {"", " [/INST]"},
     .other = {"", "</s>"}},
    {CHAT_LLAMA2_SYS_BOS,
     "llama2-sys-bos",
     CHAT_M_INST | CHAT_HEAD_OPENS,
     {"bos_token + '[INST]"},
     {0},
     .head = "[INST] ",
     .open = "<s>[INST] ",
     .sys = {"<<SYS>>\n", "\n<</SYS>>\n\n"},
     .user = {"", " [/INST]"},
     .other = {"", "</s>"}},
    {CHAT_LLAMA2_SYS,
     "llama2-sys",
     CHAT_M_INST | CHAT_HEAD_OPENS,
     {"<<SYS>>"},
     {0},
     .head = "[INST] ",
     .open = "[INST] ",
     .sys = {"<<SYS>>\n", "\n<</SYS>>\n\n"},
     .user = {"", " [/INST]"},
     .other = {"", "</s>"}},
    {CHAT_LLAMA2,
     "llama2",
     CHAT_M_INST | CHAT_HEAD_OPENS,
     {0},
     {0},
     .head = "[INST] ",
     .open = "[INST] ",
     .sys = {"", "\n"},
     .user = {"", " [/INST]"},
     .other = {"", "</s>"}},
    {CHAT_PHI3,
     "phi3",
     0,
     {"<|assistant|>", "<|end|>"},
     {0},
     .other = {"<|%r|>\n", "<|end|>\n"},
     .gen = "<|assistant|>\n"},
    {CHAT_FALCON3,
     "falcon3",
     0,
     {"<|assistant|>", "<|user|>", "</s>"},
     {0},
     .other = {"<|%r|>\n", "\n"},
     .gen = "<|assistant|>\n"},
    {CHAT_GLMEDGE,
     "glmedge",
     0,
     {"<|assistant|>", "<|user|>"},
     {0},
     .other = {"<|%r|>\n", ""},
     .gen = "<|assistant|>"},
    {CHAT_ZEPHYR,
     "zephyr",
     0,
     {"<|user|>", "<|endoftext|>"},
     {0},
     .other = {"<|%r|>\n", "<|endoftext|>\n"},
     .gen = "<|assistant|>\n"},
    {CHAT_MONARCH,
     "monarch",
     0,
     {"bos_token + message['role']"},
     {0},
     .sep = "<s>",
     .other = {"%r\n", "</s>\n"},
     .gen = "<s>assistant\n"},
    {CHAT_GEMMA,
     "gemma",
     CHAT_TRIM | CHAT_SYS_MERGE,
     {"<start_of_turn>"},
     {0},
     .user = {"<start_of_turn>user\n", "<end_of_turn>\n"},
     .asst = {"<start_of_turn>model\n", "<end_of_turn>\n"},
     .other = {"<start_of_turn>%r\n", "<end_of_turn>\n"},
     .gen = "<start_of_turn>model\n"},
    {CHAT_ORION,
     "orion",
     CHAT_SYS_MERGE,
     {"'\\n\\nAssistant: ' + eos_token"},
     {0},
     .user = {"Human: ", "\n\nAssistant: </s>"},
     .other = {"", "</s>"}},
    {CHAT_OPENCHAT,
     "openchat",
     0,
     {"GPT4 Correct "},
     {0},
     .sys = {"", "<|end_of_turn|>"},
     .other = {"GPT4 Correct %R: ", "<|end_of_turn|>"},
     .gen = "GPT4 Correct Assistant:"},
    {CHAT_VICUNA_ORCA,
     "vicuna-orca",
     0,
     {"USER: ", "ASSISTANT: ", "SYSTEM: "},
     {0},
     .sys = {"SYSTEM: ", "\n"},
     .user = {"USER: ", "\n"},
     .asst = {"ASSISTANT: ", "</s>\n"},
     .gen = "ASSISTANT:"},
    {CHAT_VICUNA,
     "vicuna",
     0,
     {"USER: ", "ASSISTANT: "},
     {0},
     .sys = {"", "\n\n"},
     .user = {"USER: ", "\n"},
     .asst = {"ASSISTANT: ", "</s>\n"},
     .gen = "ASSISTANT:"},
    {CHAT_DEEPSEEK,
     "deepseek",
     0,
     {"### Instruction:", "<|EOT|>"},
     {0},
     .sys = {"", ""},
     .user = {"### Instruction:\n", "\n"},
     .asst = {"### Response:\n", "\n<|EOT|>\n"},
     .gen = "### Response:\n"},
    {CHAT_COMMAND_R,
     "command-r",
     CHAT_TRIM,
     {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"},
     {0},
     .sys = {"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>"},
     .user = {"<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>"},
     .asst = {"<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"},
     .gen = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {CHAT_LLAMA3,
     "llama3",
     CHAT_TRIM,
     {"<|start_header_id|>", "<|end_header_id|>"},
     {0},
     .other = {"<|start_header_id|>%r<|end_header_id|>\n\n", "<|eot_id|>"},
     .gen = "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    {CHAT_CHATGLM3,
     "chatglm3",
     0,
     {"[gMASK]sop"},
     {0},
     .head = "[gMASK]sop",
     .other = {"<|%r|>\n ", ""},
     .gen = "<|assistant|>"},
    {CHAT_CHATGLM4,
     "chatglm4",
     0,
     {"[gMASK]<sop>"},
     {0},
     .head = "[gMASK]<sop>",
     .other = {"<|%r|>\n", ""},
     .gen = "<|assistant|>"},
    {CHAT_MINICPM,
     "minicpm",
     CHAT_TRIM,
     {"<\xE7\x94\xA8\xE6\x88\xB7>"},
     {0},
     .user = {"<\xE7\x94\xA8\xE6\x88\xB7>", "<AI>"},
     .other = {"", ""}},
    {CHAT_DEEPSEEK2,
     "deepseek2",
     0,
     {"'Assistant: ' + message['content'] + eos_token"},
     {0},
     .sys = {"", "\n\n"},
     .user = {"User: ", "\n\n"},
     .asst = {"Assistant: ", DS_EOS},
     .gen = "Assistant:"},
    {CHAT_DEEPSEEK3,
     "deepseek3",
     0,
     {"<" FWBAR "Assistant" FWBAR ">", "<" FWBAR "User" FWBAR ">", DS_EOS},
     {0},
     .sys = {"", "\n\n"},
     .user = {"<" FWBAR "User" FWBAR ">", ""},
     .asst = {"<" FWBAR "Assistant" FWBAR ">", DS_EOS},
     .gen = "<" FWBAR "Assistant" FWBAR ">"},
    {CHAT_EXAONE3,
     "exaone3",
     CHAT_TRIM,
     {"[|system|]", "[|assistant|]", "[|endofturn|]"},
     {0},
     .sys = {"[|system|]", "[|endofturn|]\n"},
     .user = {"[|user|]", "\n"},
     .asst = {"[|assistant|]", "[|endofturn|]\n"},
     .gen = "[|assistant|]"},
    {CHAT_RWKV_WORLD,
     "rwkv-world",
     0,
     {"rwkv-world"},
     {0},
     .user = {"User: ", "\n\nAssistant:"},
     .other = {"", "\n\n"}},
    {CHAT_GRANITE,
     "granite",
     0,
     {"<|start_of_role|>"},
     {0},
     .other = {"<|start_of_role|>%r<|end_of_role|>", "<|end_of_text|>\n"},
     .gen = "<|start_of_role|>assistant<|end_of_role|>\n"},
    {CHAT_GIGACHAT,
     "gigachat",
     CHAT_SYS_FIRST,
     {"message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]"},
     {0},
     .head = "<s>",
     .sys = {"", "<|message_sep|>"},
     .user = {"user<|role_sep|>",
              "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"},
     .asst = {"assistant<|role_sep|>", "<|message_sep|>"},
     .gen = "assistant<|role_sep|>"},
    {CHAT_MEGREZ,
     "megrez",
     0,
     {"<|role_start|>"},
     {0},
     .other = {"<|role_start|>%r<|role_end|>", "<|turn_end|>"},
     .gen = "<|role_start|>assistant<|role_end|>"},
};

#define CHAT_NDEFS (sizeof chat_defs / sizeof chat_defs[0])

static const chat_def_t *chat_def_of(chat_family_t f)
{
    for (size_t i = 0; i < CHAT_NDEFS; i++)
        if (chat_defs[i].id == f)
            return &chat_defs[i];
    return NULL;
}

/* ------------------------------------------------------------------ detection */

static int chat_has(const char *s, size_t len, const char *needle)
{
    return memmem(s, len, needle, strlen(needle)) != NULL;
}

static int chat_def_matches(const chat_def_t *d, const char *s, size_t len)
{
    if ((d->flags & CHAT_M_INST) && !(len >= 7 && memcmp(s, "mistral", 7) == 0) &&
        !chat_has(s, len, "[INST]"))
        return 0;
    for (size_t i = 0; i < sizeof d->all / sizeof d->all[0] && d->all[i]; i++)
        if (!chat_has(s, len, d->all[i]))
            return 0;
    if (d->any[0]) {
        size_t i = 0;
        while (i < sizeof d->any / sizeof d->any[0] && d->any[i] && !chat_has(s, len, d->any[i]))
            i++;
        if (i == sizeof d->any / sizeof d->any[0] || !d->any[i])
            return 0;
    }
    return 1;
}

chat_family_t chat_detect(const char *tmpl, size_t len)
{
    if (!tmpl || !len)
        return CHAT_NONE;
    for (size_t i = 0; i < CHAT_NDEFS; i++)
        if (strlen(chat_defs[i].name) == len && memcmp(chat_defs[i].name, tmpl, len) == 0)
            return chat_defs[i].id;
    for (size_t i = 0; i < CHAT_NDEFS; i++)
        if (chat_def_matches(&chat_defs[i], tmpl, len))
            return chat_defs[i].id;
    return CHAT_UNKNOWN;
}

chat_family_t chat_family_from_name(const char *name)
{
    for (size_t i = 0; name && i < CHAT_NDEFS; i++)
        if (strcmp(chat_defs[i].name, name) == 0)
            return chat_defs[i].id;
    return CHAT_UNKNOWN;
}

const char *chat_family_name(chat_family_t f)
{
    const chat_def_t *d = chat_def_of(f);
    return d ? d->name : f == CHAT_NONE ? "none" : "unknown";
}

void chat_family_list(char *buf, size_t cap)
{
    size_t o = 0;

    if (!buf || cap == 0)
        return;
    buf[0] = '\0';
    for (size_t i = 0; i < CHAT_NDEFS && o < cap; i++) {
        int k = snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", chat_defs[i].name);
        if (k < 0)
            break;
        o += (size_t)k;
    }
}

/* ------------------------------------------------------------------ rendering */

/* Writes a pre or post string, "%r" and "%R" replaced by the role. */
static void chat_put_fmt(chat_buf_t *b, const char *fmt, const char *role)
{
    for (const char *p = fmt; p && *p;) {
        const char *pc = strchr(p, '%');
        if (!pc) {
            chat_puts(b, p);
            break;
        }
        chat_put(b, p, (size_t)(pc - p));
        if (pc[1] == 'r' || pc[1] == 'R') {
            size_t rn = strlen(role);
            if (pc[1] == 'R' && rn && role[0] >= 'a' && role[0] <= 'z') {
                char c = (char)(role[0] - 'a' + 'A');
                chat_put(b, &c, 1);
                chat_put(b, role + 1, rn - 1);
            } else {
                chat_put(b, role, rn);
            }
            p = pc + 2;
        } else {
            chat_put(b, pc, 1);
            p = pc + 1;
        }
    }
}

static int chat_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* The content with ASCII whitespace trimmed from both ends when trim is set. */
static void chat_put_content(chat_buf_t *b, const char *s, int trim)
{
    size_t n = strlen(s);

    if (trim) {
        while (n && chat_is_space(s[n - 1]))
            n--;
        while (n && chat_is_space(*s)) {
            s++;
            n--;
        }
    }
    chat_put(b, s, n);
}

/* The format of a role in d; NULL when such messages are left out. */
static const chat_turn_t *chat_turn_of(const chat_def_t *d, const char *role)
{
    const chat_turn_t *t = NULL;

    if (strcmp(role, "system") == 0)
        t = &d->sys;
    else if (strcmp(role, "user") == 0)
        t = &d->user;
    else if (strcmp(role, "assistant") == 0)
        t = &d->asst;
    if (!t || !t->pre)
        t = &d->other;
    return t->pre ? t : NULL;
}

static void chat_render_def(const chat_def_t *d, const chat_msg_t *msgs, size_t n, chat_buf_t *b)
{
    const char *held = NULL; /* CHAT_SYS_MERGE: a system content waiting for the next user turn */
    int in_turn = (d->flags & CHAT_HEAD_OPENS) != 0, written = 0;

    chat_puts(b, d->head);
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        const char *content = msgs[i].content ? msgs[i].content : "";
        int is_sys = strcmp(role, "system") == 0, is_user = strcmp(role, "user") == 0;
        const chat_turn_t *t;

        if (is_sys && (d->flags & CHAT_SYS_MERGE)) {
            held = content;
            continue;
        }
        if (is_sys && (d->flags & CHAT_SYS_FIRST) && i != 0)
            continue;
        t = chat_turn_of(d, role);
        if (!t)
            continue;
        if (d->open && !in_turn) {
            chat_puts(b, d->open);
            in_turn = 1;
        }
        if (d->sep && written)
            chat_puts(b, d->sep);
        chat_put_fmt(b, t->pre, role);
        if (held && is_user) {
            size_t before = b->len;
            chat_put_content(b, held, (d->flags & CHAT_TRIM) != 0);
            if (b->len > before) /* an empty system text adds nothing */
                chat_puts(b, "\n\n");
            held = NULL;
        }
        chat_put_content(b, content,
                         (d->flags & CHAT_TRIM) ||
                             ((d->flags & CHAT_TRIM_REPLY) && !is_sys && !is_user));
        chat_put_fmt(b, t->post, role);
        if (!is_sys && !is_user)
            in_turn = 0;
        written = 1;
    }
    chat_puts(b, d->gen);
}

int chat_render(chat_family_t f, const chat_msg_t *msgs, size_t n, char **out, char *err,
                size_t errlen)
{
    const chat_def_t *d = chat_def_of(f);
    chat_buf_t b = {0};

    *out = NULL;
    if (!d) {
        char names[1024];
        chat_family_list(names, sizeof names);
        snprintf(
            err, errlen,
            f == CHAT_NONE
                ? "the model's file has no chat template (tokenizer.chat_template): name one with "
                  "chat_template: in its config (%s), or use generate with a prompt"
                : "the model's chat template (tokenizer.chat_template) is none gpuswapd knows: name "
                  "one with chat_template: in its config (%s), or use generate with a prompt",
            names);
        return CHAT_ERR_TEMPLATE;
    }
    chat_put(&b, "", 0);
    chat_render_def(d, msgs, n, &b);
    if (b.oom) {
        free(b.p);
        snprintf(err, errlen, "out of memory rendering the chat");
        return CHAT_ERR_NOMEM;
    }
    *out = b.p;
    return CHAT_OK;
}
