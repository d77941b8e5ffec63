/* worker_req: client requests on the worker: admission of generate and chat (prompt, context, sampling defaults merged) into the scheduler's queues, cancel, models and tokenize. Calls worker_seq, worker_report and the core. */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ admission */

/* s's tool-call reader (chat_tools_stream), its calls' ids "call_<serial>_<k>"; 0, or -1 after
 * answering the error. */
static int seq_tools_stream(wk_t *w, wk_seq_t *s)
{
    char prefix[48];
    snprintf(prefix, sizeof prefix, "call_%08llx_", (unsigned long long)++w->n_tool_calls);
    s->calls = chat_tools_stream_new(s->tools_style, s->req.tools, s->tools == WK_TOOLS_FORCED,
                                     !s->req.tools_serial, prefix);
    if (s->calls)
        return 0;
    wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "out of memory");
    return -1;
}

/* A chat request's tools against its model's syntax (docs/TOOLS.md): sets s->tools and, for a
 * forced call, the response_format its output follows; 0, or -1 after answering the error. */
static int seq_tools(wk_t *w, wk_seq_t *s, const wk_model_t *m, chat_family_t f,
                     chat_tools_style_t st)
{
    proto_req_t *r = &s->req;
    if (json_array_size(r->tools) && !r->tool_choice_set) /* the model's default */
        r->tool_choice = m->cfg.tool_choice;
    if (!json_array_size(r->tools) || r->tool_choice == CHAT_TOOL_NONE)
        return 0;
    s->tools_style = st;
    if (r->tool_choice == CHAT_TOOL_AUTO) {
        if (chat_tools_marker(st) || chat_tools_is_llama3(st)) {
            s->tools = chat_tools_marker(st) ? WK_TOOLS_BLOCKS : WK_TOOLS_JSON;
            return seq_tools_stream(w, s);
        }
        wk_send_error(w, s->conn, s->id, PROTO_E_BAD_REQUEST,
                      st == CHAT_TOOLS_PENDING
                          ? "model '%s': tools are not supported for family %s yet with "
                            "tool_choice auto; tool_choice required or a named function works "
                            "(the generic format, docs/TOOLS.md)"
                          : "model '%s': family %s has no tool-call syntax: tools need "
                            "tool_choice required or a named function (the generic format, "
                            "docs/TOOLS.md)",
                      m->name, chat_family_name(f));
        return -1;
    }
    s->tools = WK_TOOLS_FORCED;
    int many = r->tool_choice == CHAT_TOOL_REQUIRED && !r->tools_serial;
    r->response_format = chat_tools_call_schema(
        st, r->tools, r->tool_choice == CHAT_TOOL_NAMED ? r->tool_name : NULL, many);
    if (!r->response_format) {
        wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "out of memory");
        return -1;
    }
    return seq_tools_stream(w, s);
}

/* A chat request's prompt text (*text malloc'ed); 0, or -1 after answering the error. */
static int seq_chat_text(wk_t *w, wk_seq_t *s, const wk_model_t *m, char **text)
{
    const proto_req_t *r = &s->req;
    char err[512];
    int named = m->cfg.chat_template != NULL;
    chat_family_t f = named ? chat_family_from_name(m->cfg.chat_template) : m->chat;
    chat_tools_style_t st = named ? chat_tools_detect(f, NULL, 0) : m->tools;
    int rc;
    if (json_array_size(r->tools) || chat_tools_in_messages(r->messages, r->n_messages)) {
        if (seq_tools(w, s, m, f, st))
            return -1;
        rc = chat_tools_render(f, st, r->messages, r->n_messages,
                               r->tool_choice == CHAT_TOOL_NONE ? NULL : r->tools,
                               s->tools == WK_TOOLS_FORCED, text, err, sizeof err);
    } else {
        rc = chat_render(f, r->messages, r->n_messages, text, err, sizeof err);
    }
    if (rc) {
        wk_send_error(w, s->conn, s->id,
                      rc == CHAT_ERR_NOMEM ? PROTO_E_INTERNAL : PROTO_E_BAD_REQUEST,
                      "model '%s': %s", m->name, err);
        return -1;
    }
    return 0;
}

/* The prompt of a request as token ids (chat template, tokenizer, or the
 * ids verbatim); 0, or -1 after answering the error (s is then the
 * caller's to free). */
static int seq_prompt_text(wk_t *w, wk_seq_t *s, const wk_model_t *m)
{
    const model_t *mod = m->sm->model;
    char *text = s->req.prompt;
    int add_bos = tok_add_bos(mod->tok), owned = 0;
    if (s->req.op == PROTO_OP_CHAT) {
        if (seq_chat_text(w, s, m, &text))
            return -1;
        owned = 1;
    }
    size_t cap = strlen(text) + 8;
    s->prompt = malloc(cap * sizeof *s->prompt);
    int n = s->prompt ? tok_encode(mod->tok, text, strlen(text), add_bos, 1, s->prompt, cap)
                      : TOK_ERR_NOMEM;
    if (owned)
        free(text);
    if (n < 0) {
        wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "tokenizer failed (%d)", n);
        return -1;
    }
    s->n_prompt = (uint32_t)n;
    return 0;
}

static int seq_prompt(wk_t *w, wk_seq_t *s, const wk_model_t *m)
{
    const model_t *mod = m->sm->model;
    if (s->req.op == PROTO_OP_CHAT || s->req.prompt) {
        if (seq_prompt_text(w, s, m))
            return -1;
    } else {
        s->prompt = malloc((s->req.n_tokens ? s->req.n_tokens : 1) * sizeof *s->prompt);
        if (!s->prompt) {
            wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < s->req.n_tokens; i++) {
            if ((uint32_t)s->req.tokens[i] >= mod->hp.n_vocab) {
                wk_send_error(w, s->conn, s->id, PROTO_E_BAD_REQUEST,
                              "tokens[%zu] = %d is outside the vocabulary of %u", i,
                              s->req.tokens[i], mod->hp.n_vocab);
                return -1;
            }
            s->prompt[i] = s->req.tokens[i];
        }
        s->n_prompt = (uint32_t)s->req.n_tokens;
    }
    if (s->n_prompt == 0) {
        wk_send_error(w, s->conn, s->id, PROTO_E_BAD_REQUEST, "the prompt is empty");
        return -1;
    }
    return 0;
}

/* suffix: fill in the middle, the prompt becomes [BOS] FIM_PRE prompt FIM_SUF suffix FIM_MID
 * (the order llama.cpp's infill uses); 0, or -1 after answering the error. */
static int seq_fim(wk_t *w, wk_seq_t *s, const wk_model_t *m)
{
    const tok_t *tok = m->sm->model->tok;
    int32_t fim[3];
    if (!s->req.suffix)
        return 0;
    if (tok_fim(tok, fim)) {
        wk_send_error(w, s->conn, s->id, PROTO_E_BAD_REQUEST,
                      "model '%s' has no fill-in-the-middle tokens: 'suffix' needs them", m->name);
        return -1;
    }
    size_t len = strlen(s->req.suffix), cap = s->n_prompt + len + 8;
    int32_t *p = malloc(cap * sizeof *p);
    uint32_t at = 0, skip = s->n_prompt && s->prompt[0] == tok_bos(tok);
    if (p && skip)
        p[at++] = s->prompt[0];
    if (p) {
        p[at++] = fim[0];
        memcpy(p + at, s->prompt + skip, (s->n_prompt - skip) * sizeof *p);
        at += s->n_prompt - skip;
        p[at++] = fim[1];
    }
    int n = p ? tok_encode(tok, s->req.suffix, len, 0, 0, p + at, cap - at - 1) : TOK_ERR_NOMEM;
    if (n < 0 || (size_t)n > cap - at - 1) {
        free(p);
        wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "tokenizer failed (%d)", n);
        return -1;
    }
    at += (uint32_t)n;
    p[at++] = fim[2];
    free(s->prompt);
    s->prompt = p;
    s->n_prompt = at;
    return 0;
}

/* max_tokens against the context; 0, or -1 after answering the error. */
static int seq_limits(wk_t *w, wk_seq_t *s, const wk_model_t *m)
{
    s->max_tokens =
        s->req.has_max_tokens ? (uint32_t)s->req.max_tokens : (uint32_t)m->cfg.defaults.max_tokens;
    uint32_t ctx = wk_model_context(m);
    if ((uint64_t)s->n_prompt + s->max_tokens > ctx) {
        if (s->n_prompt >= ctx || s->req.has_max_tokens) {
            wk_send_error(
                w, s->conn, s->id, PROTO_E_CONTEXT_OVERFLOW,
                "%u prompt tokens + %u max_tokens exceed the context of %u for model '%s'",
                s->n_prompt, s->max_tokens, ctx, m->name);
            return -1;
        }
        s->max_tokens = ctx - s->n_prompt; /* the default shrinks to what fits */
    }
    return 0;
}

/* The sampler: the request's fields over the model's configured defaults;
 * 0, or -1 after answering the error. */
static int seq_sampler(wk_t *w, wk_seq_t *s, const wk_model_t *m)
{
    const model_t *mod = m->sm->model;
    char err[512];
    sampler_params_t sp;
    sampler_params_default(&sp);
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    sp.name = s->req.has_##name ? s->req.name : m->cfg.defaults.name;
    SAMPLER_PARAMS(X)
#undef X
    /* choice i of n draws from its own seed, derived from the request's */
    sp.seed = sampler_seed_of_choice(s->req.has_seed ? s->req.seed : (uint64_t)(s->t_arrival * 1e9),
                                     s->index);
    sp.bias_ids = s->req.bias_ids;
    sp.bias = s->req.bias;
    sp.n_bias = (int32_t)s->req.n_bias;
    s->smp = sampler_new(&sp, (int32_t)mod->hp.n_vocab, err, sizeof err);
    if (!s->smp) {
        wk_send_error(w, s->conn, s->id, PROTO_E_BAD_REQUEST, "%s", err);
        return -1;
    }
    for (uint32_t i = 0; i < s->n_prompt; i++)
        sampler_accept(s->smp, s->prompt[i]);
    tok_stream_init(&s->ts, mod->tok, 0);
    return 0;
}

/* echo: the prompt's text heads the answer (the prompt as sent, or its ids as text); 0, or -1
 * after answering the error. */
static int seq_echo(wk_t *w, wk_seq_t *s, const wk_model_t *m)
{
    if (!s->req.echo)
        return 0;
    size_t len = s->req.prompt ? strlen(s->req.prompt) : 0;
    char *text = s->req.prompt ? strdup(s->req.prompt) : NULL;
    if (!s->req.prompt) {
        tok_stream_t ts;
        tok_stream_init(&ts, m->sm->model->tok, 0);
        text = malloc(256 * ((size_t)s->n_prompt + 1));
        for (uint32_t i = 0; text && i <= s->n_prompt; i++) {
            int n = i < s->n_prompt ? tok_stream_feed(&ts, s->prompt[i], text + len, 256)
                                    : tok_stream_flush(&ts, text + len, 256);
            len += n > 0 ? (size_t)n : 0;
        }
    }
    if (!text) {
        wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "out of memory");
        return -1;
    }
    text[len] = 0;
    s->text = text;
    s->text_len = s->echo_len = len;
    s->text_cap = len + 1;
    return 0;
}

/* The matcher of a forced call's schema sc: for required with parallel calls in the <tool_call>
 * styles, one or more blocks "{call}\n</tool_call>" joined by "\n<tool_call>\n" (the prompt
 * opened the first), the model's own marker tokens allowed between calls (docs/TOOLS.md); else
 * one document. NULL on OOM. */
static cons_t *seq_cons_new(const wk_seq_t *s, cons_schema_t *sc, const wk_model_t *m)
{
    const char *mk = chat_tools_marker(s->tools_style);
    if (s->tools != WK_TOOLS_FORCED || s->req.tool_choice != CHAT_TOOL_REQUIRED ||
        s->req.tools_serial || !mk || chat_tools_listed(s->tools_style))
        return cons_new(sc, m->cons_vocab);
    cons_t *c = cons_new_repeat(sc, m->cons_vocab, "\n</tool_call>", "\n<tool_call>\n");
    const char *texts[2] = {"<tool_call>", "</tool_call>"};
    int32_t ids[2] = {tok_find(m->sm->model->tok, texts[0]), tok_find(m->sm->model->tok, texts[1])};
    if (c && cons_allow_tokens(c, ids, texts, 2)) {
        cons_free(c);
        return NULL;
    }
    return c;
}

/* The matcher of response_format or grammar (the schema or grammar through the worker's cache,
 * the model's vocabulary trie built on first use); 0, or -1 after answering the error. */
static int seq_constrain(wk_t *w, wk_seq_t *s, wk_model_t *m)
{
    char err[512];
    int code = 0;
    const char *field = s->req.grammar ? "grammar" : "response_format";
    if (!s->req.response_format && !s->req.grammar)
        return 0;
    if (!w->cons_cache && !(w->cons_cache = cons_cache_new(64))) {
        wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "out of memory");
        return -1;
    }
    if (!m->cons_vocab) {
        if (!(m->cons_vocab = cons_vocab_new(m->sm->model->tok, err, sizeof err))) {
            wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "%s: %s", field, err);
            return -1;
        }
        log_info("model '%s': token trie for constrained decoding, %d tokens, %zu nodes", m->name,
                 cons_vocab_size(m->cons_vocab), cons_vocab_nodes(m->cons_vocab));
    }
    cons_schema_t *sc = NULL;
    cons_grammar_t *g = NULL;
    if (s->req.grammar)
        g = cons_cache_get_grammar(w->cons_cache, s->req.grammar, &code, err, sizeof err);
    else
        sc = cons_cache_get(w->cons_cache, s->req.response_format, &code, err, sizeof err);
    if (!sc && !g) {
        wk_send_error(w, s->conn, s->id,
                      code == CONS_ERR_NOMEM ? PROTO_E_INTERNAL : PROTO_E_BAD_REQUEST, "%s: %s%s",
                      field, err, code == CONS_ERR_UNSUPPORTED ? " (docs/CONSTRAINED.md)" : "");
        return -1;
    }
    s->cons = g ? cons_new_grammar(g, m->cons_vocab) : seq_cons_new(s, sc, m);
    cons_schema_unref(sc);
    cons_grammar_unref(g);
    if (!s->cons) {
        wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "out of memory");
        return -1;
    }
    return 0;
}

/* A sequence of req (a copy: req stays the caller's) for choice index; NULL after answering
 * the error. */
static wk_seq_t *seq_new(wk_t *w, uint64_t conn, const proto_req_t *req, int mi, wk_adapter_t *ad,
                         double t_recv, uint32_t index)
{
    wk_model_t *m = w->models[mi];
    wk_seq_t *s = calloc(1, sizeof *s);
    char *line = s ? proto_encode_request(req) : NULL;
    /* the request, copied through its own codec (the allow-list is checked already), and
     * what is not on the wire: the caller's key name (the prefix cache's isolation) */
    if (!line || proto_parse_request(line, strlen(line) - 1, 0, &s->req, NULL, NULL, 0)) {
        wk_send_error(w, conn, req->id, PROTO_E_INTERNAL, "out of memory");
        free(line);
        free(s);
        return NULL;
    }
    free(line);
    if (req->tenant && !(s->req.tenant = strdup(req->tenant))) {
        wk_send_error(w, conn, req->id, PROTO_E_INTERNAL, "out of memory");
        proto_req_free(&s->req);
        free(s);
        return NULL;
    }
    s->conn = conn;
    s->id = s->req.id ? json_incref(s->req.id) : NULL;
    s->model = mi;
    s->adapter = ad; /* before the prefix seed, which names it */
    if (ad)
        wk_lora_ref(ad, 1); /* holds its device copy while it is queued and runs */
    s->t_arrival = t_recv;
    s->index = index;
    if (seq_prompt(w, s, m) || seq_fim(w, s, m) || seq_limits(w, s, m) || seq_sampler(w, s, m) ||
        seq_echo(w, s, m) || seq_constrain(w, s, m)) {
        wk_seq_free(w, s);
        return NULL;
    }
    if (s->max_tokens) {
        wk_pfx_seed(m, s);
        s->pfx_hint = wk_pfx_hint(w, m, s); /* the prefill it will likely skip: its cost */
    }
    wk_dl_start(s, m);
    s->item.model = mi;
    s->item.batch = s->req.batch;
    s->item.t_arrival = s->t_arrival;
    s->item.user = s;
    return s;
}

/* The loaded model a request names, or its base when it names an adapter (*ad set, else NULL);
 * -1 after answering unknown_model. */
static int named_target(wk_t *w, uint64_t conn, const proto_req_t *req, wk_adapter_t **ad)
{
    *ad = req->model && wk_allowed(req, req->model) ? wk_lora_find(w, req->model) : NULL;
    if (!*ad)
        return wk_named_model(w, conn, req);
    if (!wk_lora_usable(w, conn, req, *ad))
        return -1;
    return wk_find_model(w, (*ad)->cfg.base);
}

/* Validates and queues a generate/chat request: one sequence per choice (n). */
static void submit_gen(wk_t *w, uint64_t conn, proto_req_t *req, double t_recv)
{
    wk_adapter_t *ad = NULL;
    int mi = named_target(w, conn, req, &ad);
    if (mi < 0) {
        proto_req_free(req);
        return;
    }
    wk_model_t *m = w->models[mi];
    if (w->draining) {
        wk_send_error(w, conn, req->id, PROTO_E_SHUTTING_DOWN, "the daemon is draining");
        proto_req_free(req);
        return;
    }
    uint32_t n = req->n > 1 ? req->n : 1, k = 0;
    wk_seq_t *seqs[PROTO_MAX_CHOICES] = {0};
    wk_group_t *g = n > 1 ? calloc(1, sizeof *g) : NULL;
    if (n > 1 && !g)
        wk_send_error(w, conn, req->id, PROTO_E_INTERNAL, "out of memory");
    for (; k < n && (n == 1 || g); k++) {
        if (!(seqs[k] = seq_new(w, conn, req, mi, ad, t_recv, k)))
            break;
        if (g) {
            seqs[k]->grp = g;
            g->refs++;
        }
    }
    if (g) {
        g->n = g->left = n;
        if (!g->refs)
            free(g);
    }
    uint32_t queued = 0;
    if (k == n)
        for (; queued < n; queued++) {
            wk_seq_t *s = seqs[queued];
            s->state = s->max_tokens ? SEQ_QUEUED : SEQ_NEW; /* nothing to generate: never queued */
            if (s->max_tokens && queued == 0 && wk_dl_arrival(w, s)) {
                s->state = SEQ_NEW;
                break;
            }
            if (s->max_tokens && sched_submit(w->sched, &s->item) != SCHED_OK) {
                m->svc.total_queue_refused++;
                m->svc.total_batch_refused += req->batch != 0;
                wk_send_error(w, conn, s->id, PROTO_E_OVERLOADED,
                              "model '%s' has %u requests queued (limit %u, %u in all)", m->name,
                              sched_queued(w->sched, mi), w->cfg->scheduler.queue_limit,
                              sched_queued_total(w->sched));
                break;
            }
        }
    if (queued < n) { /* an error was answered: none of them runs */
        for (uint32_t i = 0; i < n; i++) {
            if (seqs[i] && i < queued && seqs[i]->state == SEQ_QUEUED)
                sched_remove(w->sched, &seqs[i]->item);
            wk_seq_free(w, seqs[i]);
        }
        proto_req_free(req);
        return;
    }
    m->svc.total_batch_requests += req->batch != 0;
    proto_req_free(req);
    m->svc.total_requests++;
    if (ad)
        ad->st.total_requests++;
    for (uint32_t i = 0; i < n; i++)
        if (seqs[i]->state == SEQ_NEW) /* max_tokens 0: answered at once */
            wk_seq_finish(w, seqs[i], PROTO_FINISH_LENGTH);
}

/* Every sequence of a connection (queued or active), for cancel. */
int wk_cancel_where(wk_t *w, uint64_t conn, const json_t *target, int silent)
{
    int found = 0;
    for (int mi = 0; mi < w->n_models; mi++) {
        wk_model_t *m = w->models[mi];
        if (!m)
            continue;
        for (wk_seq_t *s = m->active, *nx; s; s = nx) {
            nx = s->next_active;
            if (s->conn == conn && (!target || (s->id && json_equal(s->id, target)))) {
                found++;
                if (silent) {
                    if (!s->grp || s->grp->refs == 1) /* n > 1: once, with its last choice */
                        m->svc.total_cancelled++;
                    wk_seq_unlink(m, s);
                    wk_seq_free(w, s);
                } else {
                    wk_seq_finish(w, s, PROTO_FINISH_CANCELLED);
                }
            }
        }
        for (sched_item_t *it = sched_peek(w->sched, mi), *nx; it; it = nx) {
            nx = it->next;
            wk_seq_t *s = it->user;
            if (s->conn == conn && (!target || (s->id && json_equal(s->id, target)))) {
                found++;
                if (silent) {
                    if (!s->grp || s->grp->refs == 1) /* n > 1: once, with its last choice */
                        m->svc.total_cancelled++;
                    sched_remove(w->sched, it);
                    wk_seq_free(w, s);
                } else {
                    wk_seq_finish(w, s, PROTO_FINISH_CANCELLED);
                }
            }
        }
    }
    return found;
}

/* ------------------------------------------------------------------ inbox */

void wk_handle_req(wk_t *w, uint64_t conn, proto_req_t *req, double t_recv)
{
    switch (req->op) {
    case PROTO_OP_GENERATE:
    case PROTO_OP_CHAT: submit_gen(w, conn, req, t_recv); return;
    case PROTO_OP_MODELS: {
        json_t *rep = wk_report_models(w, 0), *arr = json_object_get(rep, "models");
        for (size_t i = json_array_size(arr); i-- > 0;)
            if (!wk_allowed(req,
                            json_string_value(json_object_get(json_array_get(arr, i), "name"))))
                json_array_remove(arr, i);
        wk_send_ok(w, conn, req->id, rep);
        break;
    }
    case PROTO_OP_CANCEL: {
        int found = wk_cancel_where(w, conn, req->target_id, 0);
        wk_send_ok(w, conn, req->id, json_pack("{s:b}", "found", found > 0));
        break;
    }
    case PROTO_OP_TOKENIZE: {
        wk_adapter_t *ad; /* an adapter tokenizes as its base */
        int mi = named_target(w, conn, req, &ad);
        if (mi < 0)
            break;
        const tok_t *t = w->models[mi]->sm->model->tok;
        size_t len = strlen(req->text), cap = len + 8;
        int32_t *ids = malloc(cap * sizeof *ids);
        int n = ids ? tok_encode(t, req->text, len, req->add_bos && tok_add_bos(t), 1, ids, cap)
                    : TOK_ERR_NOMEM;
        if (n < 0) {
            wk_send_error(w, conn, req->id, PROTO_E_INTERNAL, "tokenizer failed (%d)", n);
        } else {
            json_t *arr = json_array();
            for (int i = 0; i < n; i++)
                json_array_append_new(arr, json_integer(ids[i]));
            wk_send_ok(w, conn, req->id, json_pack("{s:o}", "tokens", arr));
        }
        free(ids);
        break;
    }
    default:
        wk_send_error(w, conn, req->id, PROTO_E_BAD_REQUEST, "op not accepted on this socket");
        break;
    }
    proto_req_free(req);
}
