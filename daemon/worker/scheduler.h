/* scheduler: per-model request queues and the policy that picks which model steps next (swap-aware or fifo); no threads, no engine. Its names keep the sched_ prefix. */
#ifndef SCHEDULER_H
#define SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

typedef enum sched_policy {
    SCHED_POLICY_SWAP_AWARE = 0,
    SCHED_POLICY_FIFO = 1,
} sched_policy_t;

typedef struct sched_cfg {
    sched_policy_t policy;
    double max_wait_s; /* a request waiting longer forces a switch to its model */
    double
        max_stall_s; /* a model with running sequences steps at least this often (0 = no bound) */
    double quantum;  /* stay on a swapped-in model this many times its swap-in time */
    double min_quantum_s; /* floor for the quantum (tiny models swap in microseconds) */
    uint32_t queue_limit; /* queued requests per model */
    uint32_t max_queued;  /* queued requests in all */
} sched_cfg_t;

/* Under overload (more models with running sequences than the pool holds),
 * page-ins that preempt running sequences start at most one per this many
 * holds (a hold: max_wait, or 100 measured steps where steps are slow). Each
 * one pauses a model's sequences and cuts the batches of the models it
 * cycles through (tracesim, 17 scenario rows x 12 seeds, against one per
 * hold: page-ins 1.394 -> 1.333x the best baseline, p99 TTFT 0.827 -> 0.818,
 * end-to-end 0.951 -> 0.921; 4 models at load 0.95 made 12-19% fewer
 * page-ins at the same or lower p99s). */
#define SCHED_PREEMPT_GAP_HOLDS 4.0

/* With at least this many resident models running sequences, the resident
 * models with work step shortest remaining first (a model that only has
 * requests to admit first, then the fewest passes left: view.steps_left)
 * instead of round robin: a round over many running models is long, and
 * finishing the nearly done ones frees their pages and the device for the
 * next. With fewer it would only hold long streams back (down to max_stall)
 * for little. tracesim, models per GPU (H200 settings, worst of 3 seeds):
 * Q4_K_M-sized 76 -> 81 with the real token mix, 43 -> 50 with synthetic
 * tokens; BF16 34 -> 34 and 13 -> 16; the 17 scenario rows x 12 seeds
 * (pools of 3 models) unchanged. At 3: those rows lost (page-ins 1.333 ->
 * 1.360x the best baseline, end-to-end p99 0.921 -> 0.941x; 1.13-1.16x in
 * light load: long streams paced by max_stall) and BF16 served 33; at 6
 * and 8: 81 and 82 Q4_K_M-sized, 15 and 13 BF16 with synthetic tokens.
 * A model with requests queued ranks by them: 0 where it can admit one (its
 * first token), else (a full batch) its shortest sequence's passes left (when a
 * slot frees). Ranked by its longest sequence, a popular model's queue waited
 * for max_stall steps while less loaded models stepped (make bench-overload,
 * Q4_K_M-sized, Zipf 1.0, 2 s deadline: N* 52 -> 69 models, and goodput at
 * 0.125-0.2 req/s a model 0.78-0.92 at 52 -> 0.86-1.00 at 69; models per GPU: Q4_K_M-sized with the real token mix 81 -> 80,
 * the others and the 17 scenario rows x 3 seeds unchanged). */
#define SCHED_SRPT_RUNNING 4

enum {
    SCHED_OK = 0,
    SCHED_ERR_OVERLOADED = -1,
    SCHED_ERR_ARG = -2,
};

/* One request as the scheduler sees it; the caller owns the memory and
 * keeps it alive until it is finished or cancelled. */
typedef struct sched_item {
    int model;
    double t_arrival; /* seconds, caller's clock */
    uint64_t seq;     /* arrival order, set by sched_submit */
    void *user;
    int batch; /* the batch class: queued after the model's interactive requests, and its
                         model waits while another has interactive work (set before submit) */
    struct sched_item *next, *prev; /* queue links (scheduler's) */
    int queued;
} sched_item_t;

/* What the caller tells the scheduler about a model at decision time. */
typedef struct sched_model_view {
    int resident;            /* it can run without a page-in: every segment on the device, or the
                             copies still in flight covered by its compute (res_ready_in) */
    uint32_t n_active;       /* sequences admitted and not finished */
    uint32_t max_batch;      /* sequences it may run at once */
    double swap_in_s;        /* measured (or estimated) time to page it in */
    double priority;         /* > 0 */
    int can_admit;           /* its next queued request would get a KV cache now */
    int loading;             /* its page-in is on the copy engine and it cannot run yet */
    int queued;              /* (optional) loading, every copy its page-in needs is queued, and they
                             land before the caller's next round (within its longest pass): a
                             page-in queued now follows them (the copy engine is FIFO) */
    double last_step;        /* when its last pass ended (caller's clock; 0 = never or unknown) */
    int fits;                /* (optional) not resident: its page-in fits in free pages and pages of
                             models nobody has work for, with room left for the KV caches of the
                             work queued: 1 yes, -1 no (it would evict models with work), 0 the
                             caller does not say (switches are then planned as if it fits) */
    uint32_t steps_left;     /* (optional) the most passes any of its running sequences may still
                             take (sched_passes_left; 0 = none or unknown) */
    uint32_t steps_min;      /* (optional) the fewest passes any of its running sequences may still
                             take (sched_passes_left alone): when its first slot frees */
    int streams;             /* its gpu_quota (or the pool) is below its size: every pass streams
                             what the quota does not hold (so it is never resident) */
    uint32_t n_active_batch; /* (optional) of n_active, sequences of the batch class */
} sched_model_view_t;

typedef struct sched_plan {
    int model;      /* model to step (or, not resident, to start paging in), -1 = nothing to do */
    uint32_t admit; /* queued requests of it to admit before the step */
    int prefetch;   /* a model to page into free pages meanwhile, -1 = none */
    int switched;   /* this plan pages in a model that was not resident */
} sched_plan_t;

typedef struct sched sched_t;

sched_t *sched_new(const sched_cfg_t *cfg, int n_models);
void sched_free(sched_t *s); /* accepts NULL */
void sched_set_cfg(sched_t *s, const sched_cfg_t *cfg);
/* Grow or shrink the model table (reload); queues of removed models must be empty. */
int sched_resize(sched_t *s, int n_models);

int sched_submit(sched_t *s, sched_item_t *it);  /* SCHED_ERR_OVERLOADED when full */
void sched_remove(sched_t *s, sched_item_t *it); /* unqueue (cancel); no-op if not queued */
/* The next queued item of a model (oldest first), NULL if none; pop removes it. */
sched_item_t *sched_peek(sched_t *s, int model);
sched_item_t *sched_pop(sched_t *s, int model);
uint32_t sched_queued(const sched_t *s, int model);
uint32_t sched_queued_total(const sched_t *s);

/* Output lengths: sched_note_output takes what a finished sequence of a
 * model generated and asked for (lengths of all models together, older
 * ones fading); sched_passes_left is what the longest of a model's
 * n_running sequences, one that generated n_gen of its max_tokens, may
 * still take (view.steps_left): max_tokens - n_gen; or, where most
 * sequences stopped before their max_tokens (clients often ask for far more
 * than they use; the model's own sequences once it has had enough, else all
 * models'), the n/(n+1) quantile of the lengths seen past n_gen, less
 * n_gen, when lower. tracesim, H200 settings, 77 Q4_K_M-sized models,
 * clients asking for 4096 tokens (--ask-tokens), 12 seeds: p99 TTFT
 * geometric mean 2.66 s ranked by max_tokens, 1.73 s round robin, 1.35 s
 * so; 1.03 s knowing each output. With every other model's clients asking
 * for 4096 (--ask-stride 2): 1.54 s deciding for all models together, 1.15
 * s for each model on its own. */
void sched_note_output(sched_t *s, int model, uint32_t n_gen, uint32_t max_tokens);
uint32_t sched_passes_left(sched_t *s, int model, uint32_t n_gen, uint32_t max_tokens,
                           uint32_t n_running);

/* Decide the next step. views has n_models entries. */
void sched_next(sched_t *s, double now, const sched_model_view_t *views, sched_plan_t *plan);

/* First-token deadlines (docs/overload.md), shared by the worker and tracesim. A model's
 * admission gap: the mean time between two of its admissions while requests were still queued
 * behind them, the wait its queue adds per request ahead (the model's batch and the other
 * models' share of the device, measured rather than modelled). Zeroed: nothing measured.
 * The mean of the last SCHED_GAP_WINDOW gaps: admissions come in bursts (a batch's worth after a
 * page-in, then none for a while), and a window longer than a batch holds whole cycles, where a
 * moving average weighs the one long gap of a cycle by when it came (tracesim, H200 settings,
 * 0.08 req/s a model: an average weighing each new gap 0.2 refused requests that came in time). */
#define SCHED_GAP_WINDOW 64
typedef struct sched_gap {
    double s[SCHED_GAP_WINDOW]; /* the last gaps, a ring */
    double sum;                 /* of the n in it */
    uint32_t n, next;           /* gaps in it; where the next goes */
    double last;                /* caller's clock of the last admission (0 = none) */
    int backlog;                /* requests were still queued after it */
} sched_gap_t;

/* A request was admitted at now; backlog: requests of the model are still queued after it. */
void sched_gap_note(sched_gap_t *g, double now, int backlog);
/* Predicted seconds from now to the first token of a request with ahead requests of its model
 * queued before it: wait_s until the model can run (what is left of its page-in), ahead
 * admission gaps, and its own first pass (prefill_s). Each part unknown is 0: never a refusal
 * on a guess. */
double sched_first_token_s(const sched_gap_t *g, uint32_t ahead, double wait_s, double prefill_s);

#endif
