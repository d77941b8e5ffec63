/* worker_seq: a sequence's life on the worker once admitted: each sampled token (stop strings,
 * streamed text held back until it cannot become one), its end with a done event or an error, and
 * freeing it. Calls worker_pfx (a finished sequence's KV kept), the core (worker.c) and below. */
#include "worker_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wk_seq_free(wk_t *w, wk_seq_t *s)
{
    if (!s)
        return;
    res_kv_restore_cancel(w->res, &s->restore); /* its copy writes into s->kv until it lands */
    if (s->kv)
        res_kv_free(w->res, s->kv);
    sampler_free(s->smp);
    cons_free(s->cons);
    chat_tools_stream_free(s->calls);
    json_decref(s->id);
    proto_req_free(&s->req);
    free(s->prompt);
    free(s->gen);
    free(s->redo);
    free(s->text);
    json_decref(s->lp);
    free(s->raw);
    if (s->grp && --s->grp->refs == 0)
        free(s->grp);
    if (s->adapter && wk_lora_ref(s->adapter, -1) == 0)
        w->lora_dirty = 1; /* a removed or changed adapter may go now */
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
 * (-1 = none), when it was produced and its logprobs entry (taken; NULL = none). */
static void seq_send_token(wk_t *w, const wk_seq_t *s, const char *text, size_t n, int32_t token,
                           double t, json_t *lp, json_t *calls /* deltas, stolen */)
{
    wk_event_t ev = {.kind = WK_EVENT_TOKEN,
                     .conn = s->conn,
                     .id = s->id ? json_deep_copy(s->id) : NULL,
                     .text = strndup(text, n),
                     .token = token,
                     .ts = t,
                     .index = s->index,
                     .choices = s->grp ? s->grp->n : 1,
                     .logprobs = lp,
                     .tool_calls = calls};
    if (!ev.text) { /* out of memory: the token is not sent */
        wk_event_clear(&ev);
        return;
    }
    wk_emit(w, &ev);
}

/* The counters and histograms of a request that ended with reason (timing tm; first: it
 * sampled a token). */
static void seq_count_end(wk_t *w, wk_model_t *m, proto_finish_t reason, const proto_timing_t *tm,
                          int first)
{
    if (reason == PROTO_FINISH_CANCELLED)
        m->svc.total_cancelled++;
    else
        m->svc.total_completed++;
    if (reason == PROTO_FINISH_EOS || reason == PROTO_FINISH_STOP)
        m->svc.total_stopped_early++;
    stats_hist_add(&m->hist.latency, tm->total_ms);
    stats_hist_add(&m->hist.queue, tm->queue_ms);
    if (first)
        stats_hist_add(&m->hist.ttft, tm->ttft_ms);
    if (w->draining)
        w->drain_completed++;
}

/* The tool calls in s's text (docs/TOOLS.md), the text then replaced by the content left; NULL
 * when there are none (or out of memory: the text stays content). *deltas: what the calls add to
 * those streamed (chat_tools_stream_end). */
static json_t *seq_tool_calls(wk_seq_t *s, json_t **deltas)
{
    char *content = NULL;
    json_t *calls = NULL;
    *deltas = NULL;
    if (!s->calls || !s->text)
        return NULL;
    if (chat_tools_stream_end(s->calls, s->text, &calls, &content, deltas) <= 0)
        return NULL;
    free(s->text);
    s->text = content;
    s->text_len = strlen(content);
    s->text_cap = s->text_len + 1;
    return calls;
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
    json_t *deltas, *calls = seq_tool_calls(s, &deltas);
    if (s->req.stream && (s->text_len > s->sent || deltas)) {
        size_t n = s->text_len > s->sent ? s->text_len - s->sent : 0;
        seq_send_token(w, s, s->text + s->sent, n, -1, t, NULL, deltas);
        s->sent += n;
        deltas = NULL;
    }
    json_decref(deltas);
    double queued = (s->t_admit ? s->t_admit : t) - s->t_arrival - s->swap_wait_s;
    proto_timing_t tm = {
        .queue_ms = (queued > 0 ? queued : 0) * 1e3,
        .swap_ms = s->swap_s * 1e3,
        .ttft_ms = s->t_first ? (s->t_first - s->t_arrival) * 1e3 : 0,
        .total_ms = (t - s->t_arrival) * 1e3,
        .swapped = s->swapped,
    };
    if (s->req.logprobs && !s->req.stream && !s->lp)
        s->lp = json_array(); /* asked, and no token: none */
    wk_group_t *g = s->grp;
    if (g) {
        g->left--;
        g->generated += s->n_gen;
    }
    wk_event_t ev = {.kind = WK_EVENT_DONE,
                     .conn = s->conn,
                     .id = s->id ? json_deep_copy(s->id) : NULL,
                     .text = s->text, /* the whole text: the sequence ends here */
                     .finish = reason,
                     .prompt_tokens = s->n_prompt,
                     /* n > 1: its own choice's, and the last one the whole request's */
                     .completion_tokens = g && g->left == 0 ? g->generated : s->n_gen,
                     .cached_tokens = s->n_cached,
                     .timing = tm,
                     .index = s->index,
                     .choices = g ? g->n : 1,
                     .left = g ? g->left : 0,
                     .logprobs = s->lp,
                     .tool_calls = calls};
    s->text = NULL;
    s->lp = NULL;
    s->text_len = s->text_cap = 0;
    if (g && g->failed)
        wk_event_clear(&ev); /* a sibling's error answered the request */
    else
        wk_emit(w, &ev);
    /* what sequences use, for shortest remaining first (sched_passes_left) */
    if (reason != PROTO_FINISH_CANCELLED && s->n_gen > 0)
        sched_note_output(w->sched, s->model, s->n_gen, s->max_tokens);
    if (!g || (g->left == 0 && !g->failed)) /* a request counts once: n > 1 at its last choice */
        seq_count_end(w, m, reason, &tm, s->t_first != 0);
    if (s->state == SEQ_ACTIVE)
        wk_seq_unlink(m, s);
    else if (s->state == SEQ_QUEUED)
        sched_remove(w->sched, &s->item);
    if (reason != PROTO_FINISH_CANCELLED && s->state == SEQ_ACTIVE)
        wk_pfx_keep(w, s); /* its KV stays for the next request that shares its prefix */
    wk_seq_free(w, s);
}

/* Ends s with one error for its request (code; retry_ms when refused for its deadline). */
static void seq_end_error(wk_t *w, wk_seq_t *s, proto_err_t code, uint32_t retry_ms,
                          const char *msg)
{
    wk_model_t *m = w->models[s->model];
    if (!s->grp || !s->grp->failed) { /* one error answers all the siblings */
        if (retry_ms)
            wk_send_retry(w, s->conn, s->id, retry_ms, "%s", msg);
        else {
            wk_send_error(w, s->conn, s->id, code, "%s", msg);
            m->svc.total_failed++;
            if (s->adapter)
                s->adapter->st.total_failed++;
        }
    }
    if (s->grp)
        s->grp->failed = 1;
    if (s->state == SEQ_ACTIVE)
        wk_seq_unlink(m, s);
    else if (s->state == SEQ_QUEUED)
        sched_remove(w->sched, &s->item);
    wk_seq_free(w, s);
}

void wk_seq_fail(wk_t *w, wk_seq_t *s, proto_err_t code, const char *msg)
{
    seq_end_error(w, s, code, 0, msg);
}

void wk_seq_refuse(wk_t *w, wk_seq_t *s, uint32_t retry_ms, const char *msg)
{
    seq_end_error(w, s, PROTO_E_OVERLOADED, retry_ms ? retry_ms : 1, msg);
}

/* A request with a deadline got its first token at t: met or missed (its first choice counts),
 * and how far that came from the time predicted on its arrival. */
static void seq_deadline_note(wk_model_t *m, const wk_seq_t *s, double t)
{
    if (!s->t_deadline || s->index)
        return;
    if (t <= s->t_deadline)
        m->svc.total_deadline_met++;
    else
        m->svc.total_deadline_missed++;
    if (s->dl_predicted >= 0)
        stats_hist_add(&m->hist.ttft_error, fabs(t - s->t_arrival - s->dl_predicted) * 1e3);
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
        if (from < s->echo_len) /* never inside the echoed prompt */
            from = s->echo_len;
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

/* One token event per generated token: the text that can no longer become
 * a stop string, never splitting a UTF-8 character between two events
 * ("" when all of it is held back). */
static void seq_stream(wk_t *w, wk_seq_t *s, int32_t id, double t, json_t *lp)
{
    if (!s->text) { /* nothing generated as text yet */
        seq_send_token(w, s, "", 0, id, t, lp, NULL);
        return;
    }
    size_t hold = holdback(s);
    size_t upto = s->text_len > s->sent + hold ? s->text_len - hold : s->sent;
    json_t *calls = NULL; /* tool calls: their deltas; content stops short of them */
    size_t cut = s->calls ? chat_tools_stream_feed(s->calls, s->text, s->text_len, &calls) : upto;
    if (cut < upto)
        upto = cut > s->sent ? cut : s->sent;
    while (upto > s->sent && ((unsigned char)s->text[upto] & 0xC0) == 0x80)
        upto--;
    seq_send_token(w, s, s->text + s->sent, upto - s->sent, id, t, lp, calls);
    s->sent = upto;
}

/* The text token id adds to s's output (cap bytes at out, as tok_stream_feed): the stream's, or,
 * for a request with tools, the whole text of a control token that is one of its style's call
 * markers (chat_tools_is_marker: the parser must see it, the vocabulary may hold it as a control
 * token), after what the stream held back; other control tokens stay without text. */
static int seq_piece(wk_seq_t *s, const tok_t *tok, int32_t id, char *out, size_t cap)
{
    char m[64];
    int n =
        s->calls && tok_piece(tok, id, 0, NULL, 0) == 0 ? tok_piece(tok, id, 1, m, sizeof m) : 0;
    if (n <= 0 || (size_t)n >= sizeof m || !chat_tools_is_marker(s->tools_style, m, (size_t)n))
        return tok_stream_feed(&s->ts, id, out, cap);
    int k = tok_stream_flush(&s->ts, out, cap);
    if (k < 0 || (size_t)k + (size_t)n >= cap)
        return k < 0 ? k : TOK_ERR_RANGE;
    memcpy(out + k, m, (size_t)n + 1);
    return k + n;
}

/* The entry of token id drawn from raw logits whose log-sum-exp is lse (proto_logprob_new),
 * with the k alternatives of top; NULL on OOM. */
static json_t *seq_logprob_entry(const tok_t *tok, int32_t id, double lp,
                                 const sampler_logprob_t *top, int32_t k)
{
    char piece[256];
    int np = tok_piece(tok, id, 0, piece, sizeof piece);
    json_t *e = proto_logprob_new(id, piece, np > 0 ? (size_t)np : 0, lp);
    if (!e || k <= 0)
        return e;
    json_t *alts = json_array();
    for (int32_t j = 0; alts && j < k; j++) {
        np = tok_piece(tok, top[j].id, 0, piece, sizeof piece);
        json_array_append_new(
            alts, proto_logprob_new(top[j].id, piece, np > 0 ? (size_t)np : 0, top[j].logprob));
    }
    if (!alts || json_object_set_new(e, "top_logprobs", alts)) {
        json_decref(e);
        return NULL;
    }
    return e;
}

/* logprobs asked: keeps the model's own logits of this step in s->raw (the sampler then
 * changes its copy) and writes the step's top alternatives; the log-sum-exp, or NAN when
 * not asked or out of memory. */
static double seq_logprobs_pre(wk_seq_t *s, const float *logits, int32_t n_vocab,
                               sampler_logprob_t *top)
{
    if (!s->req.logprobs)
        return NAN;
    if (!s->raw && !(s->raw = malloc((size_t)n_vocab * sizeof *s->raw)))
        return NAN;
    memcpy(s->raw, logits, (size_t)n_vocab * sizeof *s->raw);
    return sampler_logprobs(logits, n_vocab, s->req.top_logprobs, top);
}

void wk_seq_token(wk_t *w, wk_seq_t *s, float *logits, double t)
{
    wk_model_t *m = w->models[s->model];
    const model_t *mod = m->sm->model;
    if (s->grp && s->grp->failed) { /* a sibling failed: the request is answered */
        wk_seq_fail(w, s, PROTO_E_INTERNAL, "");
        return;
    }
    sampler_logprob_t top[PROTO_MAX_TOP_LOGPROBS];
    int32_t n_vocab = (int32_t)mod->hp.n_vocab;
    double lse = seq_logprobs_pre(s, logits, n_vocab, top);
    if (s->cons && cons_mask_logits(s->cons, logits) == 0) {
        wk_seq_fail(w, s, PROTO_E_INTERNAL,
                    s->req.grammar ? "grammar: no token can continue the output"
                                   : "response_format: no token can continue the output");
        return;
    }
    int32_t id = sampler_sample(s->smp, logits);
    if (s->cons && cons_accept(s->cons, id) < 0) {
        wk_seq_fail(w, s, PROTO_E_INTERNAL,
                    s->req.grammar ? "grammar: the sampled token does not fit"
                                   : "response_format: the sampled token does not fit");
        return;
    }
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
    if (s->adapter)
        s->adapter->st.total_generated_tokens++;
    if (!s->t_first) {
        s->t_first = t;
        seq_deadline_note(m, s, t);
    }
    int eog = tok_is_eog(mod->tok, id);
    json_t *lp = NULL; /* the end-of-generation token has none, as it has no text */
    if (!isnan(lse) && !eog)
        lp = seq_logprob_entry(mod->tok, id, (double)s->raw[id] - lse, top, s->req.top_logprobs);
    if (lp && !s->req.stream) {
        if (!s->lp)
            s->lp = json_array();
        json_array_append_new(s->lp, lp);
        lp = NULL;
    }
    char piece[256];
    int np = eog ? 0 : seq_piece(s, mod->tok, id, piece, sizeof piece);
    int stop = np > 0 && seq_append(s, piece, (size_t)np);
    if (s->req.stream && !stop)
        seq_stream(w, s, id, t, lp);
    else
        json_decref(lp);
    if (stop)
        wk_seq_finish(w, s, PROTO_FINISH_STOP);
    else if (eog)
        wk_seq_finish(w, s, PROTO_FINISH_EOS);
    else if (s->n_gen >= s->max_tokens)
        wk_seq_finish(w, s, PROTO_FINISH_LENGTH);
}
