/* Unit tests for the scheduler (queues, limits, swap-aware and fifo plans) and latency histograms. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "worker/scheduler.h"
#include "worker/stats.h"

static sched_cfg_t cfg(sched_policy_t p)
{
    return (sched_cfg_t){.policy = p,
                         .max_wait_s = 2.0,
                         .quantum = 4.0,
                         .min_quantum_s = 0.05,
                         .queue_limit = 4,
                         .max_queued = 6};
}

static sched_item_t *item(int model, double t)
{
    sched_item_t *it = calloc(1, sizeof *it);
    it->model = model;
    it->t_arrival = t;
    return it;
}

static void views_init(sched_model_view_t *v, int n)
{
    for (int i = 0; i < n; i++)
        v[i] = (sched_model_view_t){.resident = 0,
                                    .n_active = 0,
                                    .max_batch = 8,
                                    .swap_in_s = 0.1,
                                    .priority = 1.0,
                                    .can_admit = 1};
}

Test(sched, queue_limits_per_model_and_in_total_answer_overloaded)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 3);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sched_submit(s, item(0, i)), SCHED_OK);
    cr_assert_eq(sched_submit(s, item(0, 5)), SCHED_ERR_OVERLOADED);
    cr_assert_eq(sched_submit(s, item(1, 5)), SCHED_OK);
    cr_assert_eq(sched_submit(s, item(1, 6)), SCHED_OK);
    cr_assert_eq(sched_submit(s, item(2, 7)), SCHED_ERR_OVERLOADED, "max_queued is 6");
    cr_assert_eq(sched_queued_total(s), 6);
    for (int m = 0; m < 3; m++)
        for (sched_item_t *it; (it = sched_pop(s, m));)
            free(it);
    sched_free(s);
}

Test(sched, removing_a_queued_item_unlinks_it_from_the_middle)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 1);
    sched_item_t *a = item(0, 0), *b = item(0, 1), *d = item(0, 2);
    sched_submit(s, a);
    sched_submit(s, b);
    sched_submit(s, d);
    sched_remove(s, b);
    sched_remove(s, b); /* no-op */
    cr_assert_eq(sched_pop(s, 0), a);
    cr_assert_eq(sched_pop(s, 0), d);
    cr_assert_null(sched_pop(s, 0));
    free(a);
    free(b);
    free(d);
    sched_free(s);
}

Test(sched, swap_aware_prefers_a_resident_model_and_batches_its_queue)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 2);
    sched_item_t *its[4] = {item(0, 0.0), item(1, 0.1), item(1, 0.2), item(1, 0.3)};
    for (int i = 0; i < 4; i++)
        sched_submit(s, its[i]);
    sched_model_view_t v[2];
    views_init(v, 2);
    v[1].resident = 1;
    sched_plan_t p;
    sched_next(s, 0.5, v, &p);
    cr_assert_eq(p.model, 1, "the resident model goes first although model 0's request is older");
    cr_assert_eq(p.admit, 3);
    cr_assert_eq(p.switched, 0);
    cr_assert_eq(p.prefetch, 0, "the cold model with work is prefetched into free pages");
    for (int i = 0; i < 4; i++)
        sched_remove(s, its[i]), free(its[i]);
    sched_free(s);
}

Test(sched, swap_aware_switches_when_a_request_waits_past_max_wait)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 2);
    sched_item_t *a = item(0, 0.0), *b = item(1, 0.0);
    sched_submit(s, a);
    sched_submit(s, b);
    sched_model_view_t v[2];
    views_init(v, 2);
    v[1].resident = 1;
    v[1].n_active = 3; /* model 1 keeps having work */
    sched_plan_t p;
    sched_next(s, 1.0, v, &p);
    cr_assert_eq(p.model, 1);
    sched_next(s, 2.5, v, &p);
    cr_assert_eq(p.model, 0, "a request past max_wait forces the switch");
    cr_assert_eq(p.switched, 1);
    /* the freshly swapped-in model keeps the device for its quantum */
    v[0].resident = 0;
    sched_next(s, 2.51, v, &p);
    cr_assert_eq(p.model, 0);
    sched_remove(s, a);
    sched_remove(s, b);
    free(a);
    free(b);
    sched_free(s);
}

Test(sched, a_queue_blocked_on_kv_memory_does_not_hold_the_device)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 2);
    sched_item_t *a = item(0, 0.0);
    sched_submit(s, a);
    sched_model_view_t v[2];
    views_init(v, 2);
    v[0].resident = 1;
    v[0].can_admit = 0;
    v[1].n_active = 1;
    sched_plan_t p;
    sched_next(s, 0.1, v, &p);
    cr_assert_eq(p.model, 1, "model 0 cannot admit: model 1's running sequences step");
    sched_remove(s, a);
    free(a);
    sched_free(s);
}

Test(sched, fifo_serves_in_arrival_order_and_batches_only_consecutive_requests)
{
    sched_cfg_t c = cfg(SCHED_POLICY_FIFO);
    sched_t *s = sched_new(&c, 2);
    sched_item_t *its[4] = {item(1, 0.0), item(1, 0.1), item(0, 0.2), item(1, 0.3)};
    for (int i = 0; i < 4; i++)
        sched_submit(s, its[i]);
    sched_model_view_t v[2];
    views_init(v, 2);
    v[0].resident = 1;
    sched_plan_t p;
    sched_next(s, 1.0, v, &p);
    cr_assert_eq(p.model, 1, "the oldest request's model, resident or not");
    cr_assert_eq(p.admit, 2, "the third request (model 0) arrived before the fourth");
    cr_assert_eq(p.prefetch, -1);
    for (int i = 0; i < 4; i++)
        sched_remove(s, its[i]), free(its[i]);
    sched_free(s);
}

Test(sched, nothing_to_do_gives_no_model)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 3);
    sched_model_view_t v[3];
    views_init(v, 3);
    sched_plan_t p;
    sched_next(s, 0, v, &p);
    cr_assert_eq(p.model, -1);
    cr_assert_eq(sched_resize(s, 5), SCHED_OK);
    sched_free(s);
}

/* ------------------------------------------------------------------ stats */

Test(stats, histogram_quantiles_land_in_the_right_bucket)
{
    stats_hist_t h = {0};
    cr_assert_eq(stats_hist_quantile(&h, 0.5), 0.0);
    for (int i = 1; i <= 100; i++)
        stats_hist_add(&h, (double)i);
    cr_assert_eq(h.n, 100);
    double p50 = stats_hist_quantile(&h, 0.5), p99 = stats_hist_quantile(&h, 0.99);
    cr_assert(p50 >= 50 && p50 <= 50 * 1.25, "p50 %g", p50);
    cr_assert(p99 >= 99 && p99 <= 99 * 1.25, "p99 %g", p99);
    stats_hist_add(&h, 1e12); /* clamps into the last bucket */
    cr_assert_eq(h.b[STATS_HIST_BUCKETS - 1], 1);
}

Test(stats, reset_zeroes_counters_and_keeps_gauges)
{
    stats_res_t a = {.total_page_ins = 5, .curr_resident_bytes = 7}, b = a;
    stats_res_add(&a, &b);
    cr_assert_eq(a.total_page_ins, 10);
    stats_res_reset(&a);
    cr_assert_eq(a.total_page_ins, 0);
    cr_assert_eq(a.curr_resident_bytes, 14);
}

/* ------------------------------------------------------------------ page-ins in the background */

static void drain(sched_t *s, int n)
{
    for (int m = 0; m < n; m++)
        for (sched_item_t *it; (it = sched_pop(s, m));)
            free(it);
}

Test(sched, a_loading_model_is_not_stepped_and_resident_ones_run_meanwhile)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 3);
    sched_submit(s, item(1, 0.0));
    sched_model_view_t v[3];
    views_init(v, 3);
    v[0].resident = 1;
    v[0].n_active = 1;
    v[1].loading = 1;
    sched_plan_t p;
    for (int k = 0; k < 3; k++) {
        sched_next(s, 0.1 + k, v, &p);
        cr_assert_eq(p.model, 0, "the running resident model keeps stepping while model 1 loads");
    }
    /* nothing resident has work: still no second page-in while one loads */
    v[0].n_active = 0;
    sched_submit(s, item(2, 0.5));
    sched_next(s, 5.0, v, &p);
    cr_assert_eq(p.model, -1, "one page-in at a time");
    v[1].loading = 0;
    sched_next(s, 5.1, v, &p);
    cr_assert(p.model == 1 || p.model == 2);
    drain(s, 3);
    sched_free(s);
}

Test(sched, past_max_wait_the_oldest_request_pages_in_before_a_deeper_younger_queue)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    c.queue_limit = 8;
    c.max_queued = 16;
    sched_t *s = sched_new(&c, 3);
    sched_model_view_t v[3];
    views_init(v, 3);
    /* model 1: one request 3 s old; model 2: six requests 1.9 s old */
    sched_submit(s, item(1, 0.0));
    for (int k = 0; k < 6; k++)
        sched_submit(s, item(2, 1.1));
    sched_plan_t p;
    sched_next(s, 3.0, v, &p);
    cr_assert_eq(p.model, 1, "past max_wait the oldest request goes first (got %d)", p.model);
    /* both within max_wait: the deeper queue (wait x sqrt(depth)) first */
    drain(s, 3);
    sched_free(s);
    s = sched_new(&c, 3);
    sched_submit(s, item(1, 0.0));
    for (int k = 0; k < 6; k++)
        sched_submit(s, item(2, 0.5));
    sched_next(s, 1.5, v, &p);
    cr_assert_eq(p.model, 2, "within max_wait the deeper queue first (got %d)", p.model);
    drain(s, 3);
    sched_free(s);
}

Test(sched, prefetch_behind_a_page_in_only_once_its_copies_are_all_queued)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 4);
    sched_model_view_t v[4];
    views_init(v, 4);
    v[0].resident = 1;
    v[0].n_active = 1;
    v[1].fits = 1;
    v[2].fits = 1;
    sched_submit(s, item(1, 0.0));
    sched_submit(s, item(2, 0.1));
    sched_plan_t p;
    sched_next(s, 0.5, v, &p);
    cr_assert_eq(p.model, 0);
    cr_assert_eq(p.prefetch, 1, "the resident model steps and the oldest cold one is prefetched");
    v[1].loading = 1;
    sched_next(s, 0.6, v, &p);
    cr_assert_eq(p.model, 0);
    cr_assert_eq(p.prefetch, -1, "no second page-in while one is under way (got %d)", p.prefetch);
    /* its copies all queued and landing before the next round: the next
     * one queues behind them (FIFO) instead of the copy engine idling */
    v[1].queued = 1;
    sched_next(s, 0.65, v, &p);
    cr_assert_eq(p.model, 0);
    cr_assert_eq(p.prefetch, 2, "the next cold model queues behind (got %d)", p.prefetch);
    v[2].loading = 1; /* its copies not all queued yet: nothing more */
    v[3].fits = 1;
    sched_submit(s, item(3, 0.2));
    sched_next(s, 0.66, v, &p);
    cr_assert_eq(p.prefetch, -1, "not behind a page-in with copies left to queue (got %d)",
                 p.prefetch);
    v[1].queued = v[2].loading = v[3].fits = 0;
    /* nothing resident has work: the plan is itself a page-in, and no
     * prefetch starts beside it */
    v[1].loading = 0;
    v[0].n_active = 0;
    sched_next(s, 0.7, v, &p);
    cr_assert(p.model == 1 || p.model == 2);
    cr_assert(p.switched);
    cr_assert_eq(p.prefetch, -1, "no prefetch beside a page-in (got %d)", p.prefetch);
    drain(s, 4);
    sched_free(s);
}

Test(sched, a_resident_models_new_request_steps_in_another_models_quantum)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    c.quantum = 100; /* a long quantum for model 1 */
    sched_t *s = sched_new(&c, 2);
    sched_model_view_t v[2];
    views_init(v, 2);
    sched_submit(s, item(1, 0.0));
    v[0].resident = 1;
    v[0].last_step = 0.5;
    sched_plan_t p;
    sched_next(s, 1.0, v, &p); /* model 1 is cold, nothing else to do: its quantum begins */
    cr_assert_eq(p.model, 1);
    cr_assert_eq(p.switched, 1);
    v[1].resident = 1;
    v[1].n_active = 1;
    v[1].last_step = 1.05;
    /* a request for resident model 0 (nothing running there): stepping it
     * swaps nothing, so it does not wait out model 1's quantum */
    sched_submit(s, item(0, 1.06));
    sched_next(s, 1.1, v, &p);
    cr_assert_eq(p.model, 0, "model 0 waited longest since its pass; it is resident");
    cr_assert_eq(p.admit, 1);
    drain(s, 2);
    sched_free(s);
}

Test(sched, a_running_model_steps_within_max_stall_even_in_another_models_quantum)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    c.max_stall_s = 0.3;
    c.quantum = 100; /* a long quantum for model 1 */
    sched_t *s = sched_new(&c, 2);
    sched_model_view_t v[2];
    views_init(v, 2);
    for (int i = 0; i < 4; i++)
        sched_submit(s, item(1, 0.0));
    v[0].resident = 1;
    v[0].last_step = 1.0;
    sched_plan_t p;
    sched_next(s, 1.0, v,
               &p); /* model 1 is cold, nothing else to do: switched to, its quantum begins */
    cr_assert_eq(p.model, 1);
    v[0].n_active = 1; /* then model 0 gets a request running */
    v[1].resident = 1;
    v[1].n_active = 2;
    v[1].last_step = 1.05;
    v[0].last_step = 1.02;
    sched_next(s, 1.1, v, &p);
    cr_assert_eq(p.model, 0,
                 "in the quantum, running resident models interleave (the longest waiting first)");
    v[1].last_step = 1.15;
    v[0].last_step = 1.18;
    sched_next(s, 1.2, v, &p);
    cr_assert_eq(p.model, 1, "then model 1 again");
    /* past max_stall the running model gets the device whatever else holds */
    v[0].last_step = 1.0;
    v[1].last_step = 1.35;
    sched_next(s, 1.4, v, &p);
    cr_assert_eq(p.model, 0, "model 0 went 0.4 s without a step (max_stall 0.3 s)");
    drain(s, 2);
    sched_free(s);
}

/* Models 0 and 1 resident with sequences running, model 2 cold with a
 * request that arrived at 0; model 1 also has one queued (at 1). */
static sched_t *drain_setup(sched_item_t **its, sched_model_view_t *v, int fits)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 3);
    its[0] = item(2, 0.0);
    its[1] = item(1, 1.0);
    sched_submit(s, its[0]);
    sched_submit(s, its[1]);
    views_init(v, 3);
    v[0].resident = v[1].resident = 1;
    v[0].n_active = 3;
    v[1].n_active = 1;
    v[2].fits = fits;
    return s;
}

static void drain_teardown(sched_t *s, sched_item_t **its)
{
    for (int i = 0; i < 2; i++)
        sched_remove(s, its[i]), free(its[i]);
    sched_free(s);
}

Test(sched, past_max_wait_a_page_in_that_preempts_starts_and_the_drained_model_admits_nothing)
{
    sched_item_t *its[2];
    sched_model_view_t v[3];
    sched_t *s = drain_setup(its, v, -1);
    sched_plan_t p;
    /* steps of 10 ms: within max_wait the resident models step */
    double t = 0.0;
    for (; t < 1.99; t += 0.01) {
        sched_next(s, t, v, &p);
        cr_assert_neq(p.model, 2, "%.2f s: within max_wait", t);
    }
    for (; t < 2.2 && p.model != 2; t += 0.01)
        sched_next(s, t, v, &p);
    cr_assert_eq(p.model, 2, "past max_wait the page-in starts although it preempts");
    cr_assert_eq(p.switched, 1);
    cr_assert_eq(p.prefetch, -1, "no prefetch of a model that does not fit");
    /* model 1 (fewest sequences) drains: it admits nothing while its
     * sequences run, so the running models shrink back to what fits */
    sched_remove(s, its[0]); /* admitted */
    v[2].resident = 1;
    v[2].n_active = 1;
    v[2].fits = 0;
    int stepped1 = 0;
    for (int k = 0; k < 100; k++) { /* past model 2's quantum (0.4 s) */
        sched_next(s, 2.3 + 0.01 * k, v, &p);
        if (p.model == 1) {
            stepped1 = 1;
            cr_assert_eq(p.admit, 0, "the drained model admits nothing");
        }
    }
    cr_assert(stepped1, "its running sequence still steps");
    /* once idle it is picked, the drain is over and it admits again */
    v[1].n_active = 0;
    v[0].n_active = v[2].n_active = 0;
    sched_next(s, 3.5, v, &p);
    cr_assert_eq(p.model, 1);
    cr_assert_eq(p.admit, 1, "the drain is over: model 1 admits its request");
    drain_teardown(s, its);
}

/* Models 0 and 1 running (resident, or not: they lost pages, and their KV
 * caches hold pages all the same), two cold models that do not fit beside
 * them: one page-in that preempts per max_wait. */
static void overload_spacing(int resident)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 4);
    sched_item_t *its[2] = {item(2, 0.0), item(3, 0.0)};
    sched_submit(s, its[0]);
    sched_submit(s, its[1]);
    sched_model_view_t v[4];
    views_init(v, 4);
    v[0].resident = v[1].resident = resident;
    v[0].n_active = 3;
    v[1].n_active = 1;
    v[2].fits = v[3].fits = -1;
    sched_plan_t p;
    sched_next(s, 2.1, v, &p);
    cr_assert(p.model == 2 || p.model == 3, "the first preempts at max_wait");
    int first = p.model, second = 5 - first;
    sched_remove(s, its[first - 2]);
    v[first].resident = 1;
    v[first].n_active = 1;
    v[first].fits = 0;
    /* the second cold model waits past max_wait: another page-in that
     * preempts waits SCHED_PREEMPT_GAP_HOLDS max_waits after the first, the
     * drain meanwhile */
    double gap = c.max_wait_s * SCHED_PREEMPT_GAP_HOLDS, t = 2.2;
    for (; t < 2.1 + gap - 0.05; t += 0.01) {
        sched_next(s, t, v, &p);
        cr_assert_neq(p.model, second, "%.2f s: one preempting page-in per %.1f s", t, gap);
    }
    for (; t < 2.1 + gap + 0.2 && p.model != second; t += 0.01)
        sched_next(s, t, v, &p);
    cr_assert_eq(p.model, second, "%.1f s after the first it starts", gap);
    sched_remove(s, its[second - 2]);
    free(its[0]);
    free(its[1]);
    sched_free(s);
}

Test(sched, under_overload_one_page_in_that_preempts_per_gap_the_next_drains)
{
    overload_spacing(1);
}

Test(sched, a_page_in_that_takes_a_running_non_resident_models_pages_counts_as_preempting)
{
    overload_spacing(0);
}

Test(sched, a_page_in_that_fits_or_that_the_caller_does_not_size_switches_at_max_wait)
{
    for (int fits = 0; fits <= 1; fits++) {
        sched_item_t *its[2];
        sched_model_view_t v[3];
        sched_t *s = drain_setup(its, v, fits);
        sched_plan_t p;
        sched_next(s, 2.5, v, &p);
        cr_assert_eq(p.model, 2, "fits %d: the switch at max_wait as before", fits);
        drain_teardown(s, its);
    }
}

Test(sched, the_hold_grows_with_the_measured_step_time)
{
    sched_item_t *its[2];
    sched_model_view_t v[3];
    sched_t *s = drain_setup(its, v, -1);
    sched_plan_t p;
    /* steps of 0.2 s (a slow machine): the hold is 100 steps, 20 s, not 8 s */
    double t = 0.1;
    for (; t < 19.5; t += 0.2) {
        sched_next(s, t, v, &p);
        cr_assert_neq(p.model, 2, "%.1f s: within 100 measured steps", t);
    }
    for (; t < 21.0 && p.model != 2; t += 0.2)
        sched_next(s, t, v, &p);
    cr_assert_eq(p.model, 2, "past them (%.1f s)", t);
    drain_teardown(s, its);
}

/* Two models above their quotas (each pass streams what its quota does not
 * hold) and a small resident one: the second streaming model's page-in does
 * not fit beside the first's running sequences. */
static sched_t *stream_setup(sched_item_t **it, sched_model_view_t *v)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    c.max_stall_s = 0.5;
    sched_t *s = sched_new(&c, 3);
    *it = item(1, 0.0);
    sched_submit(s, *it);
    views_init(v, 3);
    v[0].streams = v[1].streams = 1;
    v[0].n_active = 2; /* running, not resident between its passes */
    v[1].fits = -1;
    v[2].resident = 1;
    v[2].n_active = 1;
    return s;
}

Test(sched, a_streaming_models_page_in_waits_for_the_other_streaming_models_drain_past_max_wait)
{
    sched_item_t *it;
    sched_model_view_t v[3];
    sched_t *s = stream_setup(&it, v);
    sched_plan_t p;
    int stepped0 = 0;
    /* far past max_wait (2 s) and the hold: while model 0 runs, model 1 waits */
    for (double t = 0.01; t < 30.0; t += 0.01) {
        sched_next(s, t, v, &p);
        cr_assert_neq(p.model, 1, "%.2f s: two streaming models at once take each other's pages",
                      t);
        cr_assert_eq(p.prefetch, -1);
        if (p.model >= 0)
            v[p.model].last_step = t;
        if (p.model == 0) {
            stepped0 = 1;
            cr_assert_eq(p.admit, 0, "model 0 has nothing queued to admit");
        }
    }
    cr_assert(stepped0, "the running streaming model steps meanwhile");
    /* its sequences done, the page-in starts */
    v[0].n_active = 0;
    sched_next(s, 30.0, v, &p);
    cr_assert_eq(p.model, 1, "once model 0 is idle model 1 pages in");
    cr_assert_eq(p.switched, 1);
    sched_remove(s, it);
    free(it);
    sched_free(s);
}

/* stream_setup's models stepping every 10 ms while model 0 keeps running:
 * model 1 waits until hold s (asserted), then starts its page-in within
 * half a second (asserted); stepped models' last_step kept current. */
static void stream_waits_then_preempts(int streams, double hold)
{
    sched_item_t *it;
    sched_model_view_t v[3];
    sched_t *s = stream_setup(&it, v);
    v[1].streams = streams;
    sched_plan_t p = {.model = -1};
    double t = 0.01;
    for (; t < hold + 0.5 && p.model != 1; t += 0.01) {
        sched_next(s, t, v, &p);
        cr_assert(p.model != 1 || t > hold - 0.1, "%.2f s: within the wait (%.0f s) it drains", t,
                  hold);
        if (p.model >= 0 && p.model != 1)
            v[p.model].last_step = t;
    }
    cr_assert_eq(p.model, 1, "past %.0f s it preempts (%.2f s)", hold, t);
    sched_remove(s, it);
    free(it);
    sched_free(s);
}

Test(sched, a_streaming_models_wait_for_the_other_ones_drain_is_bounded_by_60_holds)
{
    /* model 0 keeps running (a steady stream of its own requests): model 1
     * is not held off for good, it preempts after 60 holds (120 s) */
    stream_waits_then_preempts(1, 120.0);
}

Test(sched, a_small_models_page_in_past_the_hold_still_preempts_a_streaming_model)
{
    /* model 1 fits its quota: the bounded hold (max_wait) as for any page-in */
    stream_waits_then_preempts(0, 2.0);
}

Test(sched, with_many_models_running_the_nearly_done_step_first_else_round_robin)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    enum {
        N = SCHED_SRPT_RUNNING + 2
    };
    sched_t *s = sched_new(&c, N);
    sched_model_view_t v[N];
    views_init(v, N);
    /* SCHED_SRPT_RUNNING resident models running sequences, with these passes left */
    for (int m = 0; m < SCHED_SRPT_RUNNING; m++) {
        v[m].resident = 1;
        v[m].n_active = 1;
        v[m].steps_left = (uint32_t)(50 - 13 * (m % 3) + m);
    }
    uint32_t fewest = v[0].steps_left;
    int nearly_done = 0;
    for (int m = 1; m < SCHED_SRPT_RUNNING; m++)
        if (v[m].steps_left < fewest)
            fewest = v[m].steps_left, nearly_done = m;
    /* a resident model with a request to admit, and an idle one */
    int fresh = SCHED_SRPT_RUNNING;
    v[fresh].resident = v[fresh + 1].resident = 1;
    sched_item_t *it = item(fresh, 0.0);
    sched_submit(s, it);
    sched_plan_t p;
    sched_next(s, 0.1, v, &p);
    cr_assert_eq(p.model, fresh,
                 "a model that only has a request to admit steps first (its first token)");
    cr_assert_eq(p.admit, 1);
    sched_remove(s, it);
    free(it);
    for (int k = 0; k < 3; k++) {
        sched_next(s, 0.2 + k, v, &p);
        cr_assert_eq(p.model, nearly_done, "the model with the fewest passes left steps (%u)",
                     fewest);
    }
    /* one fewer running: round robin, passes left or not */
    v[nearly_done].n_active = 0;
    v[nearly_done].steps_left = 0;
    int seen[N] = {0};
    for (int k = 0; k < SCHED_SRPT_RUNNING - 1; k++) {
        sched_next(s, 4.0 + k, v, &p);
        cr_assert(p.model >= 0 && p.model < SCHED_SRPT_RUNNING && p.model != nearly_done);
        cr_assert_eq(seen[p.model]++, 0, "round robin: model %d twice in a round", p.model);
    }
    sched_free(s);
}

Test(sched, a_full_batch_with_a_queue_ranks_by_when_its_first_slot_frees)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    enum {
        N = SCHED_SRPT_RUNNING
    };
    sched_t *s = sched_new(&c, N);
    sched_model_view_t v[N];
    views_init(v, N);
    /* every model running: model 0 a full batch whose longest sequence has 90 passes left but
     * whose shortest ends in 3, with a request queued behind it; the others 20 passes left */
    for (int m = 0; m < N; m++) {
        v[m].resident = 1;
        v[m].n_active = 1;
        v[m].max_batch = 4;
        v[m].steps_left = v[m].steps_min = 20;
    }
    v[0].n_active = 4;
    v[0].steps_left = 90;
    v[0].steps_min = 3;
    sched_plan_t p;
    sched_next(s, 0.1, v, &p);
    cr_assert_neq(p.model, 0, "nothing queued: ranked by its longest sequence (90)");
    sched_item_t *it = item(0, 0.1);
    sched_submit(s, it);
    sched_next(s, 0.2, v, &p);
    cr_assert_eq(p.model, 0, "a request waits for a slot: ranked by its shortest sequence (3)");
    cr_assert_eq(p.admit, 0, "the batch is full");
    v[0].n_active = 3; /* a slot free: it admits, ranked as a model with a request to admit */
    sched_next(s, 0.3, v, &p);
    cr_assert_eq(p.model, 0);
    cr_assert_eq(p.admit, 1);
    sched_remove(s, it);
    free(it);
    sched_free(s);
}

Test(sched, passes_left_is_what_is_asked_until_sequences_stop_short_of_it)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 1);
    cr_assert_eq(sched_passes_left(s, 0, 10, 600, 1), 590,
                 "nothing seen yet: max_tokens less n_gen");
    cr_assert_eq(sched_passes_left(s, 0, 700, 600, 1), 0);
    /* every sequence ran to its max_tokens: the asks are what is used */
    for (int k = 0; k < 100; k++)
        sched_note_output(s, 0, 20, 20);
    cr_assert_eq(sched_passes_left(s, 0, 0, 600, 1), 600);
    sched_free(s);

    s = sched_new(&c, 1);
    /* 32 sequences stopped short: too few to go by (their weight, faded, is 31.5) */
    for (int k = 0; k < 32; k++)
        sched_note_output(s, 0, 36, 600);
    cr_assert_eq(sched_passes_left(s, 0, 0, 600, 1), 600);
    sched_note_output(s, 0, 36, 600);
    cr_assert_eq(sched_passes_left(s, 0, 0, 600, 1), 36, "the length seen");
    cr_assert_eq(sched_passes_left(s, 0, 10, 600, 1), 26);
    cr_assert_eq(sched_passes_left(s, 0, 0, 20, 1), 20, "never more than asked");
    cr_assert_eq(sched_passes_left(s, 0, 100, 600, 1), 500, "longer than any seen: what it asked");
    sched_free(s);

    /* half stop at 10 tokens, half at 1000: the longest of n sequences is a higher quantile */
    s = sched_new(&c, 1);
    for (int k = 0; k < 200; k++)
        sched_note_output(s, 0, k % 2 ? 1000 : 10, 4096);
    uint32_t one = sched_passes_left(s, 0, 0, 4096, 1), eight = sched_passes_left(s, 0, 0, 4096, 8);
    cr_assert(one >= 10 && one <= 1000 && eight == 1000, "one %u eight %u", one, eight);
    cr_assert_eq(sched_passes_left(s, 0, 500, 4096, 1), 500, "past 10, only the 1000s remain");
    /* what fades: 2000 more sequences of 10 tokens leave little of the 1000s */
    for (int k = 0; k < 2000; k++)
        sched_note_output(s, 0, 10, 4096);
    cr_assert_eq(sched_passes_left(s, 0, 0, 4096, 1), 10);
    sched_free(s);
}

Test(sched, passes_left_follows_each_models_own_asks_once_it_has_seen_enough)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 3);
    /* model 0's clients ask for 600 and stop at 36; model 1's ask for exactly what they use */
    for (int k = 0; k < 40; k++)
        sched_note_output(s, 0, 36, 600);
    for (int k = 0; k < 8; k++)
        sched_note_output(s, 1, 36, 36);
    cr_assert_eq(sched_passes_left(s, 0, 0, 600, 1), 36, "model 0 goes by the lengths seen");
    cr_assert_eq(sched_passes_left(s, 1, 0, 600, 1), 36,
                 "model 1 has seen 8 sequences (faded, 7.97): too few of its own, so all "
                 "models' go");
    cr_assert_eq(sched_passes_left(s, 2, 0, 600, 1), 36, "model 2 has seen none: all models'");
    sched_note_output(s, 1, 36, 36);
    cr_assert_eq(sched_passes_left(s, 1, 0, 600, 1), 600,
                 "9 of model 1's ran to their max_tokens: its asks say it");
    cr_assert_eq(sched_passes_left(s, 0, 0, 600, 1), 36, "model 0 as before");
    cr_assert_eq(sched_passes_left(s, -1, 0, 600, 1), 36, "no model: all models'");
    sched_free(s);
}

/* ------------------------------------------------------------------ deadlines */

Test(sched, the_admission_gap_is_the_mean_of_the_last_gaps_while_a_backlog_lasted)
{
    sched_gap_t g = {0};
    cr_assert_float_eq(sched_first_token_s(&g, 10, 0.5, 0.1), 0.6, 1e-12,
                       "nothing measured: no wait per request ahead");
    sched_gap_note(&g, 1.0, 0); /* nothing queued after it */
    sched_gap_note(&g, 5.0, 1); /* idle time before it: not a gap */
    cr_assert_eq(g.n, 0);
    sched_gap_note(&g, 5.4, 1); /* 0.4 s after one that left a backlog */
    sched_gap_note(&g, 5.4, 1); /* admitted in the same pass: 0 */
    cr_assert_eq(g.n, 2);
    cr_assert_float_eq(sched_first_token_s(&g, 4, 1.0, 0.05), 1.0 + 4 * 0.2 + 0.05, 1e-12);
    sched_gap_note(&g, 9.0, 0); /* the backlog lasted until it: a gap still */
    cr_assert_eq(g.n, 3);
    sched_gap_note(&g, 20.0, 0); /* after an empty queue: none */
    cr_assert_eq(g.n, 3);
    /* a burst cycle (one 3.2 s gap, then 31 admitted at once) repeated: the window holds whole
     * cycles, so the mean is the cycle's, 0.1 s, whenever it is read */
    sched_gap_t b = {0};
    double t = 1;
    sched_gap_note(&b, t, 1);
    for (int cycle = 0; cycle < 8; cycle++) {
        t += 3.2;
        for (int k = 0; k < 32; k++) {
            sched_gap_note(&b, t, 1);
            if (cycle >= 2 && k == 0)
                cr_assert_float_eq(b.sum / b.n, 0.1, 1e-9, "cycle %d", cycle);
        }
    }
    cr_assert_eq(b.n, SCHED_GAP_WINDOW);
}

/* ------------------------------------------------------------------ request classes */

Test(sched, interactive_requests_queue_ahead_of_the_batch_class_each_in_arrival_order)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    c.queue_limit = c.max_queued = 16;
    sched_t *s = sched_new(&c, 1);
    sched_item_t *b1 = item(0, 0), *i1 = item(0, 1), *b2 = item(0, 2), *i2 = item(0, 3);
    b1->batch = b2->batch = 1;
    sched_item_t *order[] = {b1, i1, b2, i2};
    for (int k = 0; k < 4; k++)
        cr_assert_eq(sched_submit(s, order[k]), SCHED_OK);
    sched_remove(s, i1); /* out of the middle, and back: still ahead of the batch class */
    sched_submit(s, i1);
    sched_item_t *want[] = {i2, i1, b1, b2};
    for (int k = 0; k < 4; k++)
        cr_assert_eq(sched_pop(s, 0), want[k], "position %d", k);
    cr_assert_null(sched_pop(s, 0));
    sched_submit(s, b1); /* a batch queue alone, then an interactive request */
    sched_submit(s, i1);
    cr_assert_eq(sched_pop(s, 0), i1);
    cr_assert_eq(sched_pop(s, 0), b1);
    for (int k = 0; k < 4; k++)
        free(order[k]);
    sched_free(s);
}

Test(sched, a_model_with_only_batch_work_waits_while_another_has_interactive_work)
{
    sched_cfg_t c = cfg(SCHED_POLICY_SWAP_AWARE);
    sched_t *s = sched_new(&c, 2);
    sched_item_t *b = item(0, 0.0), *i = item(1, 1.0);
    b->batch = 1;
    sched_submit(s, b);
    sched_submit(s, i);
    sched_model_view_t v[2];
    views_init(v, 2);
    v[0].resident = v[1].resident = 1;
    sched_plan_t p;
    sched_next(s, 9.0, v, &p); /* b waited past max_wait: it would go first as interactive */
    cr_assert_eq(p.model, 1, "the interactive model goes first");
    sched_remove(s, i);
    sched_next(s, 9.0, v, &p);
    cr_assert_eq(p.model, 0, "the batch class uses what is left");
    /* running batch sequences still step within max_stall */
    v[0].n_active = v[0].n_active_batch = 1;
    v[0].last_step = 8.0;
    sched_submit(s, i);
    c.max_stall_s = 0.5;
    sched_set_cfg(s, &c);
    sched_next(s, 9.0, v, &p);
    cr_assert_eq(p.model, 0, "a batch stream past max_stall steps");
    v[0].last_step = 8.9;
    sched_next(s, 9.0, v, &p);
    cr_assert_eq(p.model, 1);
    sched_remove(s, i);
    sched_remove(s, b);
    free(b);
    free(i);
    sched_free(s);
}
