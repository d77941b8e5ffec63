/* worker_req: inference requests on the worker: admission (prompt, context, sampling defaults merged), stop strings, streamed text, done and cancel. */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ sequences */

void wk_seq_free(wk_t *w, wk_seq_t *s)
{
    if (!s)
        return;
    if (s->kv)
        res_kv_free(w->res, s->kv);
    sampler_free(s->smp);
    json_decref(s->id);
    proto_req_free(&s->req);
    free(s->prompt);
    free(s->gen);
    free(s->redo);
    free(s->text);
    free(s);
}

void wk_seq_unlink(wk_model_t *m, wk_seq_t *s)
{
    wk_seq_t **pp = &m->active;
    while (*pp && *pp != s)
        pp = &(*pp)->next_active;
    if (*pp) {
        *pp = s->next_active;
        m->n_active--;
    }
}

/* Appends n bytes to the generated text (kept NUL-terminated); -1 when out
 * of memory (the text is then left as it was). */
static int text_append(wk_seq_t *s, const char *p, size_t n)
{
    size_t need = s->text_len + n + 1;
    if (need > s->text_cap) {
        size_t nc = need * 2;
        char *nt = realloc(s->text, nc);
        if (!nt)
            return -1;
        s->text = nt;
        s->text_cap = nc;
    }
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return 0;
}

/* A token event for s: the n bytes of text (a copy), the sampled token id
 * (-1 = none) and when it was produced. */
static void seq_send_token(wk_t *w, const wk_seq_t *s, const char *text, size_t n, int32_t token,
                           double t)
{
    wk_event_t ev = {.kind = WK_EVENT_TOKEN,
                     .conn = s->conn,
                     .id = s->id ? json_deep_copy(s->id) : NULL,
                     .text = strndup(text, n),
                     .token = token,
                     .ts = t};
    if (!ev.text) { /* out of memory: the token is not sent */
        wk_event_clear(&ev);
        return;
    }
    wk_emit(w, &ev);
}

/* Ends a sequence with a done event (and frees it). */
void wk_seq_finish(wk_t *w, wk_seq_t *s, proto_finish_t reason)
{
    wk_model_t *m = w->models[s->model];
    double t = wk_now();
    char piece[64];
    int np = tok_stream_flush(&s->ts, piece, sizeof piece);
    if (np > 0 && !s->stopped_on_string)
        text_append(s, piece, (size_t)np);
    if (s->req.stream && s->text_len > s->sent) {
        seq_send_token(w, s, s->text + s->sent, s->text_len - s->sent, -1, t);
        s->sent = s->text_len;
    }
    double queued = (s->t_admit ? s->t_admit : t) - s->t_arrival - s->swap_wait_s;
    proto_timing_t tm = {
        .queue_ms = (queued > 0 ? queued : 0) * 1e3,
        .swap_ms = s->swap_s * 1e3,
        .ttft_ms = s->t_first ? (s->t_first - s->t_arrival) * 1e3 : 0,
        .total_ms = (t - s->t_arrival) * 1e3,
        .swapped = s->swapped,
    };
    wk_event_t ev = {.kind = WK_EVENT_DONE,
                     .conn = s->conn,
                     .id = s->id ? json_deep_copy(s->id) : NULL,
                     .text = s->text, /* the whole text: the sequence ends here */
                     .finish = reason,
                     .prompt_tokens = s->n_prompt,
                     .completion_tokens = s->n_gen,
                     .timing = tm};
    s->text = NULL;
    s->text_len = s->text_cap = 0;
    wk_emit(w, &ev);
    if (reason == PROTO_FINISH_CANCELLED)
        m->svc.total_cancelled++;
    else
        m->svc.total_completed++;
    if (reason == PROTO_FINISH_EOS || reason == PROTO_FINISH_STOP)
        m->svc.total_stopped_early++;
    /* what sequences use, for shortest remaining first (sched_passes_left) */
    if (reason != PROTO_FINISH_CANCELLED && s->n_gen > 0)
        sched_note_output(w->sched, s->model, s->n_gen, s->max_tokens);
    stats_hist_add(&m->hist.latency, tm.total_ms);
    stats_hist_add(&m->hist.queue, tm.queue_ms);
    if (s->t_first)
        stats_hist_add(&m->hist.ttft, tm.ttft_ms);
    if (s->state == SEQ_ACTIVE)
        wk_seq_unlink(m, s);
    else if (s->state == SEQ_QUEUED)
        sched_remove(w->sched, &s->item);
    if (w->draining)
        w->drain_completed++;
    wk_seq_free(w, s);
}

void wk_seq_fail(wk_t *w, wk_seq_t *s, proto_err_t code, const char *msg)
{
    wk_model_t *m = w->models[s->model];
    wk_send_error(w, s->conn, s->id, code, "%s", msg);
    m->svc.total_failed++;
    if (s->state == SEQ_ACTIVE)
        wk_seq_unlink(m, s);
    else if (s->state == SEQ_QUEUED)
        sched_remove(w->sched, &s->item);
    wk_seq_free(w, s);
}

/* Appends text to the sequence; returns 1 when a stop string ended it. */
static int seq_append(wk_seq_t *s, const char *p, size_t n)
{
    size_t old_len = s->text_len;
    if (text_append(s, p, n))
        return 0;
    for (size_t i = 0; i < s->req.n_stop; i++) {
        /* a stop string may end anywhere in the new bytes: it starts at
         * most strlen(stop) - 1 bytes before them */
        size_t l = strlen(s->req.stop[i]);
        size_t from = old_len >= l ? old_len - l + 1 : 0;
        const char *hit = strstr(s->text + from, s->req.stop[i]);
        if (hit) {
            s->text_len = (size_t)(hit - s->text);
            s->text[s->text_len] = 0;
            s->stopped_on_string = 1;
            return 1;
        }
    }
    return 0;
}

/* How many bytes at the end of the text may still turn into a stop string. */
static size_t holdback(const wk_seq_t *s)
{
    size_t h = 0;
    for (size_t i = 0; i < s->req.n_stop; i++) {
        size_t l = strlen(s->req.stop[i]);
        if (l - 1 > h)
            h = l - 1;
    }
    return h;
}

/* The index of the loaded model a request names, or -1 after answering
 * unknown_model: the message lists the configured models, or says why the
 * named one failed. */
/* Whether req's API key (req->allow, set by the server) may use model name. */
static int allowed(const proto_req_t *req, const char *name)
{
    if (!req->allow)
        return 1;
    for (size_t i = 0; name && i < req->n_allow; i++)
        if (strcmp(req->allow[i], name) == 0)
            return 1;
    return 0;
}

/* A model the caller's key may not use is answered exactly as one that does
 * not exist, and the list names only the models it may use. */
int wk_named_model(wk_t *w, uint64_t conn, const proto_req_t *req)
{
    int mi = req->model && allowed(req, req->model) ? wk_find_model(w, req->model) : -1;
    if (mi < 0) {
        char names[1024] = "";
        for (int i = 0; i < w->n_models; i++) {
            if (!w->models[i] || w->models[i]->removing || !allowed(req, w->models[i]->name))
                continue;
            if (names[0])
                strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, w->models[i]->name, sizeof names - strlen(names) - 1);
        }
        wk_send_error(w, conn, req->id, PROTO_E_UNKNOWN_MODEL, "no model '%s' (configured: %s)",
                      req->model ? req->model : "", names);
        return -1;
    }
    wk_model_t *m = w->models[mi];
    if (!m->sm) {
        wk_send_error(w, conn, req->id, PROTO_E_UNKNOWN_MODEL, "model '%s' failed to load: %s",
                      m->name, m->load_error ? m->load_error : "?");
        return -1;
    }
    return mi;
}

/* One token event per generated token: the text that can no longer become
 * a stop string, never splitting a UTF-8 character between two events
 * ("" when all of it is held back). */
static void seq_stream(wk_t *w, wk_seq_t *s, int32_t id, double t)
{
    if (!s->text) { /* nothing generated as text yet */
        seq_send_token(w, s, "", 0, id, t);
        return;
    }
    size_t hold = holdback(s);
    size_t upto = s->text_len > s->sent + hold ? s->text_len - hold : s->sent;
    while (upto > s->sent && ((unsigned char)s->text[upto] & 0xC0) == 0x80)
        upto--;
    seq_send_token(w, s, s->text + s->sent, upto - s->sent, id, t);
    s->sent = upto;
}

void wk_seq_token(wk_t *w, wk_seq_t *s, float *logits, double t)
{
    wk_model_t *m = w->models[s->model];
    const model_t *mod = m->sm->model;
    int32_t id = sampler_sample(s->smp, logits);
    if (s->n_gen == s->gen_cap) { /* kept to rebuild its KV cache if it is given back */
        uint32_t cap = s->gen_cap ? 2 * s->gen_cap : 64;
        int32_t *g = realloc(s->gen, cap * sizeof *g);
        if (!g) {
            wk_seq_fail(w, s, PROTO_E_INTERNAL, "out of memory");
            return;
        }
        s->gen = g;
        s->gen_cap = cap;
    }
    s->gen[s->n_gen] = id;
    s->last = id;
    s->n_gen++;
    m->svc.total_generated_tokens++;
    if (!s->t_first)
        s->t_first = t;
    int eog = tok_is_eog(mod->tok, id);
    char piece[256];
    int np = eog ? 0 : tok_stream_feed(&s->ts, id, piece, sizeof piece);
    int stop = np > 0 && seq_append(s, piece, (size_t)np);
    if (s->req.stream && !stop)
        seq_stream(w, s, id, t);
    if (stop)
        wk_seq_finish(w, s, PROTO_FINISH_STOP);
    else if (eog)
        wk_seq_finish(w, s, PROTO_FINISH_EOS);
    else if (s->n_gen >= s->max_tokens)
        wk_seq_finish(w, s, PROTO_FINISH_LENGTH);
}

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
    if (seq_prompt(w, s, m) || seq_limits(w, s, m) || seq_sampler(w, s, m)) {
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

void wk_handle_req(wk_t *w, uint64_t conn, int admin, proto_req_t *req, double t_recv)
{
    if (admin) {
        wk_admin_op(w, conn, req, t_recv);
        proto_req_free(req);
        return;
    }
    switch (req->op) {
    case PROTO_OP_GENERATE:
    case PROTO_OP_CHAT: submit_gen(w, conn, req, t_recv); return;
    case PROTO_OP_MODELS: {
        json_t *rep = wk_report_models(w, 0), *arr = json_object_get(rep, "models");
        for (size_t i = json_array_size(arr); i-- > 0;)
            if (!allowed(req, json_string_value(json_object_get(json_array_get(arr, i), "name"))))
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
