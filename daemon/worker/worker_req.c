/* worker_req: client requests on the worker: admission of generate and chat (prompt, context, sampling defaults merged) into the scheduler's queues, cancel, models and tokenize. Calls worker_seq, worker_report and the core. */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ admission */

/* The prompt of a request as token ids (chat template, tokenizer, or the
 * ids verbatim); 0, or -1 after answering the error (s is then the
 * caller's to free). */
static int seq_prompt_text(wk_t *w, wk_seq_t *s, const wk_model_t *m)
{
    const model_t *mod = m->sm->model;
    char err[512];
    char *text = s->req.prompt;
    int add_bos = tok_add_bos(mod->tok), owned = 0;
    if (s->req.op == PROTO_OP_CHAT) {
        if (chat_render(m->cfg.chat_template ? chat_family_from_name(m->cfg.chat_template)
                                             : m->chat,
                        s->req.messages, s->req.n_messages, &text, err, sizeof err)) {
            wk_send_error(w, s->conn, s->id, PROTO_E_BAD_REQUEST, "model '%s': %s", m->name, err);
            return -1;
        }
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
    sp.seed = s->req.has_seed ? s->req.seed : (uint64_t)(s->t_arrival * 1e9);
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

/* response_format's matcher (the schema through the worker's cache, the model's vocabulary trie
 * built on first use); 0, or -1 after answering the error. */
static int seq_constrain(wk_t *w, wk_seq_t *s, wk_model_t *m)
{
    char err[512];
    int code = 0;
    if (!s->req.response_format)
        return 0;
    if (!w->cons_cache && !(w->cons_cache = cons_cache_new(64))) {
        wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "out of memory");
        return -1;
    }
    if (!m->cons_vocab) {
        if (!(m->cons_vocab = cons_vocab_new(m->sm->model->tok, err, sizeof err))) {
            wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "response_format: %s", err);
            return -1;
        }
        log_info("model '%s': token trie for constrained decoding, %d tokens, %zu nodes", m->name,
                 cons_vocab_size(m->cons_vocab), cons_vocab_nodes(m->cons_vocab));
    }
    cons_schema_t *sc =
        cons_cache_get(w->cons_cache, s->req.response_format, &code, err, sizeof err);
    if (!sc) {
        wk_send_error(w, s->conn, s->id,
                      code == CONS_ERR_NOMEM ? PROTO_E_INTERNAL : PROTO_E_BAD_REQUEST,
                      "response_format: %s%s", err,
                      code == CONS_ERR_UNSUPPORTED ? " (docs/CONSTRAINED.md)" : "");
        return -1;
    }
    s->cons = cons_new(sc, m->cons_vocab);
    cons_schema_unref(sc);
    if (!s->cons) {
        wk_send_error(w, s->conn, s->id, PROTO_E_INTERNAL, "out of memory");
        return -1;
    }
    return 0;
}

/* Validates and queues a generate/chat request. */
static void submit_gen(wk_t *w, uint64_t conn, proto_req_t *req, double t_recv)
{
    int mi = wk_named_model(w, conn, req);
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
    wk_seq_t *s = calloc(1, sizeof *s);
    if (!s) {
        wk_send_error(w, conn, req->id, PROTO_E_INTERNAL, "out of memory");
        proto_req_free(req);
        return;
    }
    s->req = *req;
    memset(req, 0, sizeof *req);
    s->conn = conn;
    s->id = s->req.id ? json_incref(s->req.id) : NULL;
    s->model = mi;
    s->t_arrival = t_recv;
    if (seq_prompt(w, s, m) || seq_limits(w, s, m) || seq_sampler(w, s, m) ||
        seq_constrain(w, s, m)) {
        wk_seq_free(w, s);
        return;
    }
    if (s->max_tokens == 0) {
        /* nothing to generate: answered at once, never queued */
        m->svc.total_requests++;
        wk_seq_finish(w, s, PROTO_FINISH_LENGTH);
        return;
    }
    s->item.model = mi;
    s->item.t_arrival = s->t_arrival;
    s->item.user = s;
    s->state = SEQ_QUEUED;
    if (sched_submit(w->sched, &s->item) != SCHED_OK) {
        wk_send_error(w, conn, s->id, PROTO_E_OVERLOADED,
                      "model '%s' has %u requests queued (limit %u, %u in all)", m->name,
                      sched_queued(w->sched, mi), w->cfg->scheduler.queue_limit,
                      sched_queued_total(w->sched));
        wk_seq_free(w, s);
        return;
    }
    m->svc.total_requests++;
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
        int mi = wk_named_model(w, conn, req);
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
