/* sampler: picks the next token from logits (repetition penalty, greedy or temperature + top-k/top-p/min-p, seeded PRNG). */
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest repetition window we accept (the history is a ring of this many ids). */
#define SAMPLER_MAX_LAST_N (1 << 20)

/* One candidate token: its (penalised) logit and id. */
typedef struct sampler_cand {
    float logit;
    int32_t id;
} sampler_cand_t;

struct sampler {
    sampler_params_t p;
    int32_t n_vocab;
    uint64_t rng[4];      /* xoshiro256** state */
    int32_t *hist;        /* (repeat_last_n) ring of accepted ids */
    int32_t hist_len;     /* ids in the ring, <= repeat_last_n */
    int32_t hist_pos;     /* next slot to write */
    uint8_t *seen;        /* (n_vocab) scratch flags for the penalty, all 0 between calls */
    uint32_t *count;      /* (n_vocab) times each id was sampled; NULL when both penalties are 0 */
    int32_t *gen;         /* (n_vocab) distinct sampled ids, in first-seen order */
    int32_t n_gen;        /* ids in gen */
    sampler_cand_t *cand; /* (n_vocab) candidate scratch */
    double *w;            /* (n_vocab) unnormalised probabilities, parallel to cand */
    int32_t *bias_ids;    /* (n_bias) logit_bias ids, owned */
    float *bias;          /* (n_bias) added to those logits first */
};

/* ------------------------------------------------------------------ PRNG */

static uint64_t sampler_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t sampler_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman & Vigna). */
static uint64_t sampler_rng_next(uint64_t s[4])
{
    uint64_t r = sampler_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = sampler_rotl(s[3], 45);
    return r;
}

/* Uniform double in [0, 1) with 53 random bits. */
static double sampler_rng_unit(uint64_t s[4])
{
    return (double)(sampler_rng_next(s) >> 11) * 0x1.0p-53;
}

/* ------------------------------------------------------------------ params */

const sampler_param_desc_t sampler_param_descs[SAMPLER_PARAM_COUNT] = {
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    [SAMPLER_PARAM_##name] = {#name, SAMPLER_KIND_##kind, lo, hi, bounds, def, #def, help},
    SAMPLER_PARAMS(X)
#undef X
};

int sampler_param_in_range(const sampler_param_desc_t *d, double v)
{
    if (isnan(v))
        return 0;
    if ((d->bounds & SAMPLER_LO_OPEN) ? !(v > d->lo) : !(v >= d->lo))
        return 0;
    if ((d->bounds & SAMPLER_HI_OPEN) ? !(v < d->hi) : !(v <= d->hi))
        return 0;
    return 1;
}

const char *sampler_param_range_text(const sampler_param_desc_t *d, char *buf, size_t len)
{
    snprintf(buf, len, "%c%.10g, %.10g%c", (d->bounds & SAMPLER_LO_OPEN) ? '(' : '[', d->lo, d->hi,
             (d->bounds & SAMPLER_HI_OPEN) ? ')' : ']');
    return buf;
}

const sampler_param_desc_t *sampler_param_find(const char *name)
{
    for (int i = 0; i < SAMPLER_PARAM_COUNT; i++)
        if (strcmp(sampler_param_descs[i].name, name) == 0)
            return &sampler_param_descs[i];
    return NULL;
}

void sampler_params_default(sampler_params_t *p)
{
#define X(name, kind, ctype, lo, hi, bounds, def, help) p->name = (ctype)(def);
    SAMPLER_PARAMS(X)
#undef X
    p->repeat_last_n = 64;
    p->seed = 0;
    p->bias_ids = NULL;
    p->bias = NULL;
    p->n_bias = 0;
}

static int sampler_params_check(const sampler_params_t *p, int32_t n_vocab, char *err,
                                size_t errlen)
{
    if (n_vocab <= 0) {
        snprintf(err, errlen, "sampler: vocabulary size %d must be positive", (int)n_vocab);
        return -1;
    }
    if (!isfinite(p->temperature)) {
        snprintf(err, errlen, "sampler: temperature %g is not a finite number",
                 (double)p->temperature);
        return -1;
    }
    if (isnan(p->top_p) || p->top_p < 0) {
        snprintf(err, errlen, "sampler: top_p %g must be >= 0 (>= 1 turns it off)",
                 (double)p->top_p);
        return -1;
    }
    if (isnan(p->min_p) || p->min_p > 1) {
        snprintf(err, errlen, "sampler: min_p %g must be <= 1 (<= 0 turns it off)",
                 (double)p->min_p);
        return -1;
    }
    if (!isfinite(p->repeat_penalty) || p->repeat_penalty <= 0) {
        snprintf(err, errlen,
                 "sampler: repeat_penalty %g must be a finite number > 0 (1 turns it off)",
                 (double)p->repeat_penalty);
        return -1;
    }
    if (!isfinite(p->presence_penalty)) {
        snprintf(err, errlen, "sampler: presence_penalty %g is not a finite number",
                 (double)p->presence_penalty);
        return -1;
    }
    if (!isfinite(p->frequency_penalty)) {
        snprintf(err, errlen, "sampler: frequency_penalty %g is not a finite number",
                 (double)p->frequency_penalty);
        return -1;
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= n_vocab || !isfinite(p->bias[i])) {
            snprintf(err, errlen, "sampler: logit_bias for token %d: %s", (int)p->bias_ids[i],
                     isfinite(p->bias[i]) ? "outside the vocabulary" : "not a finite number");
            return -1;
        }
    }
    if (p->repeat_last_n < 0 || p->repeat_last_n > SAMPLER_MAX_LAST_N) {
        snprintf(err, errlen, "sampler: repeat_last_n %d must be in 0..%d", (int)p->repeat_last_n,
                 SAMPLER_MAX_LAST_N);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ lifecycle */

/* The caller frees the result with sampler_free. */
sampler_t *sampler_new(const sampler_params_t *p, int32_t n_vocab, char *err, size_t errlen)
{
    if (!p) {
        snprintf(err, errlen, "sampler: no parameters");
        return NULL;
    }
    if (sampler_params_check(p, n_vocab, err, errlen))
        return NULL;
    sampler_t *s = calloc(1, sizeof *s);
    if (!s)
        goto fail;
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = sampler_splitmix64(&x);
    if (p->repeat_last_n > 0) {
        s->hist = malloc((size_t)p->repeat_last_n * sizeof *s->hist);
        s->seen = calloc((size_t)n_vocab, 1);
        if (!s->hist || !s->seen)
            goto fail;
    }
    if (p->presence_penalty != 0 || p->frequency_penalty != 0) {
        s->count = calloc((size_t)n_vocab, sizeof *s->count);
        s->gen = malloc((size_t)n_vocab * sizeof *s->gen);
        if (!s->count || !s->gen)
            goto fail;
    }
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->w = malloc((size_t)n_vocab * sizeof *s->w);
    if (!s->cand || !s->w)
        goto fail;
    if (p->n_bias > 0) {
        s->bias_ids = malloc((size_t)p->n_bias * sizeof *s->bias_ids);
        s->bias = malloc((size_t)p->n_bias * sizeof *s->bias);
        if (!s->bias_ids || !s->bias)
            goto fail;
        memcpy(s->bias_ids, p->bias_ids, (size_t)p->n_bias * sizeof *s->bias_ids);
        memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
    }
    s->p.bias_ids = s->bias_ids; /* the caller's arrays are not kept */
    s->p.bias = s->bias;
    return s;
fail:
    snprintf(err, errlen, "sampler: out of memory for a vocabulary of %d", (int)n_vocab);
    sampler_free(s);
    return NULL;
}

void sampler_free(sampler_t *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->seen);
    free(s->count);
    free(s->gen);
    free(s->cand);
    free(s->w);
    free(s->bias_ids);
    free(s->bias);
    free(s);
}

void sampler_accept(sampler_t *s, int32_t id)
{
    if (!s || s->p.repeat_last_n <= 0 || id < 0 || id >= s->n_vocab)
        return;
    s->hist[s->hist_pos] = id;
    s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
    if (s->hist_len < s->p.repeat_last_n)
        s->hist_len++;
}

/* ------------------------------------------------------------------ pipeline */

/* Each distinct recent token is penalised once, as llama.cpp does. */
static void sampler_penalize(sampler_t *s, float *logits)
{
    float pen = s->p.repeat_penalty;
    if (pen == 1.0f || s->hist_len == 0)
        return;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t id = s->hist[i];
        if (s->seen[id])
            continue;
        s->seen[id] = 1;
        logits[id] = logits[id] > 0 ? logits[id] / pen : logits[id] * pen;
    }
    for (int32_t i = 0; i < s->hist_len; i++)
        s->seen[s->hist[i]] = 0;
}

/* OpenAI's penalties over the tokens sampled so far (not the prompt):
 * logit -= frequency_penalty * count + presence_penalty * (count > 0). */
static void sampler_penalize_generated(sampler_t *s, float *logits)
{
    if (!s->count)
        return;
    for (int32_t i = 0; i < s->n_gen; i++) {
        int32_t id = s->gen[i];
        logits[id] -= s->p.frequency_penalty * (float)s->count[id] + s->p.presence_penalty;
    }
}

/* Counts a sampled id for sampler_penalize_generated. */
static void sampler_count(sampler_t *s, int32_t id)
{
    if (!s->count)
        return;
    if (s->count[id]++ == 0)
        s->gen[s->n_gen++] = id;
}

/* a ranks before b: higher logit, then lower id (a total order, so every
 * selection below is deterministic). */
static int sampler_cand_better(const sampler_cand_t *a, const sampler_cand_t *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int sampler_cand_cmp(const void *pa, const void *pb)
{
    const sampler_cand_t *a = pa, *b = pb;
    return sampler_cand_better(a, b) ? -1 : sampler_cand_better(b, a) ? 1 : 0;
}

/* Restores the heap property below i in a heap whose root is the worst candidate. */
static void sampler_heap_down(sampler_cand_t *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && sampler_cand_better(&h[m], &h[l]))
            m = l;
        if (r < n && sampler_cand_better(&h[m], &h[r]))
            m = r;
        if (m == i)
            return;
        sampler_cand_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Keeps the k best of n_vocab logits in s->cand[0..k), best first:
 * O(V log k) with a bounded heap instead of sorting the vocabulary. */
static void sampler_top_k(sampler_t *s, const float *logits, int32_t k)
{
    sampler_cand_t *h = s->cand;
    for (int32_t i = 0; i < k; i++)
        h[i] = (sampler_cand_t){.logit = logits[i], .id = i};
    for (int32_t i = k / 2 - 1; i >= 0; i--)
        sampler_heap_down(h, k, i);
    for (int32_t i = k; i < s->n_vocab; i++) {
        sampler_cand_t c = {.logit = logits[i], .id = i};
        if (sampler_cand_better(&c, &h[0])) {
            h[0] = c;
            sampler_heap_down(h, k, 0);
        }
    }
    /* heap sort: repeatedly move the worst to the end -> best first */
    for (int32_t n = k - 1; n > 0; n--) {
        sampler_cand_t t = h[0];
        h[0] = h[n];
        h[n] = t;
        sampler_heap_down(h, n, 0);
    }
}

/* Replaces NaN with -inf and +inf with FLT_MAX; returns the argmax (ties:
 * lowest id). */
static int32_t sampler_sanitize_argmax(float *logits, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 0; i < n; i++) {
        float x = logits[i];
        if (isnan(x))
            x = -INFINITY;
        else if (x == INFINITY)
            x = FLT_MAX;
        logits[i] = x;
        if (x > logits[best])
            best = i;
    }
    return best;
}

/* Order: repetition penalty, then presence/frequency penalties (both also in greedy mode),
 * then greedy argmax, or top-k -> softmax(l / T) -> top-p -> min-p ->
 * renormalise -> one PRNG draw. */
int32_t sampler_sample(sampler_t *s, float *logits)
{
    const sampler_params_t *p = &s->p;
    int32_t V = s->n_vocab;
    for (int32_t i = 0; i < p->n_bias; i++)
        logits[p->bias_ids[i]] += p->bias[i];
    sampler_penalize(s, logits);
    sampler_penalize_generated(s, logits);
    int32_t best = sampler_sanitize_argmax(logits, V);
    if (p->temperature <= 0 || logits[best] == -INFINITY) {
        sampler_accept(s, best);
        sampler_count(s, best);
        return best;
    }

    /* candidates: the top k (sorted) or the whole vocabulary (id order) */
    int32_t n;
    int sorted = 0;
    if (p->top_k > 0 && p->top_k < V) {
        n = p->top_k;
        sampler_top_k(s, logits, n);
        sorted = 1;
    } else {
        n = V;
        for (int32_t i = 0; i < V; i++)
            s->cand[i] = (sampler_cand_t){.logit = logits[i], .id = i};
    }

    /* softmax(logit / T) up to the factor 1/sum: the best candidate has w = 1 */
    double inv_t = 1.0 / (double)p->temperature;
    double m = logits[best], sum = 0;
    for (int32_t i = 0; i < n; i++) {
        s->w[i] = exp(((double)s->cand[i].logit - m) * inv_t);
        sum += s->w[i];
    }

    /* min-p: p < min_p * p_max  <=>  w < min_p. It only ever drops a tail of
     * the sorted order, so doing it before top-p (with top-p's cumulative
     * still measured against the top-k sum) gives the same set as after, and
     * leaves fewer candidates to sort. */
    if (p->min_p > 0) {
        int32_t j = 0;
        for (int32_t i = 0; i < n; i++) {
            if (s->w[i] >= (double)p->min_p) {
                s->cand[j] = s->cand[i];
                s->w[j] = s->w[i];
                j++;
            }
        }
        n = j; /* >= 1: the best has w = 1 >= min_p */
    }

    /* top-p: the smallest prefix whose probability reaches top_p */
    if (p->top_p < 1) {
        if (!sorted) {
            qsort(s->cand, (size_t)n, sizeof *s->cand, sampler_cand_cmp);
            for (int32_t i = 0; i < n; i++)
                s->w[i] = exp(((double)s->cand[i].logit - m) * inv_t);
        }
        double goal = (double)p->top_p * sum, acc = 0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            acc += s->w[i];
            if (acc >= goal) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }

    /* renormalise over what is left and draw */
    double total = 0;
    for (int32_t i = 0; i < n; i++)
        total += s->w[i];
    double target = sampler_rng_unit(s->rng) * total, acc = 0;
    int32_t pick = s->cand[0].id;
    for (int32_t i = 0; i < n; i++) {
        if (s->w[i] <= 0)
            continue;
        acc += s->w[i];
        pick = s->cand[i].id;
        if (acc > target)
            break;
    }
    sampler_accept(s, pick);
    sampler_count(s, pick);
    return pick;
}

/* ------------------------------------------------------------------ logprobs */

double sampler_logprobs(const float *logits, int32_t n_vocab, int32_t k, sampler_logprob_t *top)
{
    double m = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++)
        if (logits[i] > m) /* false for NaN */
            m = logits[i];
    if (m == -INFINITY) { /* nothing has any weight */
        for (int32_t j = 0; j < k && j < n_vocab; j++)
            top[j] = (sampler_logprob_t){.id = j, .logprob = -INFINITY};
        return -INFINITY;
    }
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (logits[i] > -INFINITY) /* false for NaN */
            sum += exp((double)logits[i] - m);
    double lse = m + log(sum);
    if (k > n_vocab)
        k = n_vocab;
    /* the k best by insertion: top[0..n) sorted best first, lower id first on ties */
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab && k > 0; i++) {
        float v = isnan(logits[i]) ? -INFINITY : logits[i];
        if (n == k && !(v > top[n - 1].logprob))
            continue;
        int32_t j = n < k ? n++ : n - 1;
        while (j > 0 && v > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (sampler_logprob_t){.id = i, .logprob = v};
    }
    for (int32_t j = 0; j < n; j++)
        top[j].logprob = (float)((double)top[j].logprob - lse);
    return lse;
}

uint64_t sampler_seed_of_choice(uint64_t seed, uint32_t i)
{
    if (i == 0)
        return seed;
    uint64_t x = seed ^ ((uint64_t)i * 0xd1342543de82ef95ull);
    return sampler_splitmix64(&x);
}
