/* test_res_unit: experts as paging units: the store's units of a MoE layer (the rest, then each expert's three slices) and the residency manager mapping, copying and evicting one unit on its own on the sim backend, pages two units share, the pool's and the model's byte counts. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "worker/residency.h"
#include "worker/store.h"
#include "testutil.h"

/* 16 KiB pages against expert slices of 24 KiB (96 rows of 128 F16): each slice takes a page
 * and a half, so neighbouring experts share the page where one ends and the next begins. */
#define PAGE (16u << 10)
#define POOL_PAGES 512
#define MOE_ARGS                                                                                   \
    "--arch qwen3moe --type f16 --dim 128 --layers 2 --heads 4 --kv-heads 2 --ff 256 "             \
    "--experts 8 --experts-used 2 --expert-ff 96 --vocab 300 --seed 7"

typedef tu_res_t fixture_t;

static void fx_open(fixture_t *f, const char *args)
{
    tu_res_open(f, args, "moe", POOL_PAGES, PAGE, 0);
}

/* Pages of unit u of segment seg (its ranges' pages, a page two ranges share counted once). */
static size_t unit_pages(const store_model_t *sm, uint32_t seg, uint32_t u, uint8_t *mark)
{
    const store_unit_t *x = store_seg_unit(sm, seg, u);
    size_t n = 0;
    for (uint32_t k = 0; k < x->n_ranges; k++)
        for (size_t p = x->r[k].off / PAGE; p < (x->r[k].off + x->r[k].bytes + PAGE - 1) / PAGE;
             p++)
            if (!mark[p]) {
                mark[p] = 1;
                n++;
            }
    return n;
}

/* Pages units a and b (of one segment) take together. */
static size_t pages_of(const store_model_t *sm, uint32_t seg, uint32_t a, uint32_t b)
{
    uint8_t mark[4096] = {0};
    cr_assert_leq(sm->segs[seg].span / PAGE, sizeof mark);
    size_t n = unit_pages(sm, seg, a, mark);
    return a == b ? n : n + unit_pages(sm, seg, b, mark);
}

/* The unit's bytes on the device are the host image's. */
static void assert_unit_copied(const fixture_t *f, uint32_t seg, uint32_t u)
{
    const store_seg_t *ss = &f->sm->segs[seg];
    const store_unit_t *x = store_seg_unit(f->sm, seg, u);
    const uint8_t *dev = (const uint8_t *)res_model_base(f->rm) + ss->off;
    for (uint32_t k = 0; k < x->n_ranges; k++)
        cr_assert_eq(
            memcmp(dev + x->r[k].off, f->sm->image + ss->host_off + x->r[k].off, x->r[k].bytes), 0,
            "unit %u of segment %u: range %u differs on the device", u, seg, k);
}

static void map_wait(fixture_t *f, uint32_t seg, uint32_t u)
{
    char err[256] = "";
    cr_assert_eq(res_unit_map(f->res, f->rm, seg, u, err, sizeof err), RES_OK, "%s", err);
    cr_assert_eq(res_unit_wait(f->res, f->rm, seg, u), RES_OK);
    cr_assert_eq(res_unit_state(f->res, f->rm, seg, u), RES_SEG_RESIDENT);
}

Test(store, a_moe_layer_is_its_rest_and_one_unit_per_expert_of_three_slices)
{
    fixture_t f;
    fx_open(&f, MOE_ARGS);
    const store_model_t *sm = f.sm;
    const uint32_t E = sm->model->hp.n_expert;
    cr_assert_eq(E, 8);
    cr_assert_eq(store_seg_units(sm, FWD_SEG_EMBED), 0, "the embedding pages in whole only");
    cr_assert_eq(store_seg_units(sm, FWD_SEG_HEAD(2)), 0, "so does the head");
    for (uint32_t l = 0; l < 2; l++) {
        const uint32_t seg = FWD_SEG_LAYER(l);
        const store_seg_t *ss = &sm->segs[seg];
        const model_layer_t *L = &sm->host.layers[l];
        cr_assert_eq(store_seg_units(sm, seg), E + 1);
        const store_unit_t *rest = store_seg_unit(sm, seg, STORE_UNIT_REST);
        cr_assert_eq(rest->n_ranges, 1);
        cr_assert_eq(rest->r[0].off, 0);
        size_t covered = rest->bytes;
        for (uint32_t e = 0; e < E; e++) {
            const store_unit_t *x = store_seg_unit(sm, seg, STORE_UNIT_EXPERT(e));
            const model_weight_t *stk[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
            cr_assert_eq(x->n_ranges, 3);
            for (int k = 0; k < 3; k++) {
                model_weight_t v = model_expert_view(stk[k], E, e);
                cr_assert_eq((const uint8_t *)v.data, sm->image + ss->host_off + x->r[k].off,
                             "layer %u expert %u: range %d is model_expert_view's slice", l, e, k);
                cr_assert_eq(x->r[k].bytes, v.nbytes);
                cr_assert_geq(x->r[k].off, rest->r[0].bytes, "after the rest");
            }
            covered += x->bytes;
        }
        /* the units hold every tensor byte of the layer (less the alignment gaps) */
        cr_assert_leq(covered, ss->bytes);
        cr_assert_geq(covered + 4 * 256, ss->bytes, "%zu of %zu bytes", covered, ss->bytes);
        cr_assert_lt((size_t)((const uint8_t *)L->gate_inp.data - sm->image) - ss->host_off,
                     rest->bytes, "the router is the rest's");
    }
    tu_res_close(&f);
}

Test(store, a_dense_model_has_no_units)
{
    fixture_t f;
    fx_open(&f, "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300");
    cr_assert_null(f.sm->units);
    for (uint32_t s = 0; s < f.sm->n_segs; s++)
        cr_assert_eq(store_seg_units(f.sm, s), 0);
    char err[256] = "";
    cr_assert_eq(res_unit_map(f.res, f.rm, FWD_SEG_LAYER(0), 0, err, sizeof err), RES_ERR_ARG);
    cr_assert_eq(res_weight_bytes(f.rm), 0);
    tu_res_close(&f);
}

Test(res_unit, one_expert_maps_and_copies_alone_and_counts_its_pages, .timeout = 30)
{
    fixture_t f;
    fx_open(&f, MOE_ARGS);
    const uint32_t seg = FWD_SEG_LAYER(1), u = STORE_UNIT_EXPERT(3);
    size_t free0 = tu_res_pool_free(f.res), pages = pages_of(f.sm, seg, u, u);
    map_wait(&f, seg, u);
    assert_unit_copied(&f, seg, u);
    cr_assert_eq(res_weight_bytes(f.rm), pages * PAGE, "%zu bytes for %zu pages",
                 res_weight_bytes(f.rm), pages);
    cr_assert_eq(res_unit_bytes(f.rm, seg), pages * PAGE);
    cr_assert_eq(tu_res_pool_free(f.res), free0 - pages);
    cr_assert_lt(pages * PAGE, f.sm->segs[seg].span / 4, "an expert is a fraction of its layer");
    /* the rest of the layer, and every other segment, untouched */
    cr_assert_eq(res_seg_state(f.res, f.rm, seg), RES_SEG_ABSENT);
    for (uint32_t x = 0; x < store_seg_units(f.sm, seg); x++)
        if (x != u)
            cr_assert_eq(res_unit_state(f.res, f.rm, seg, x), RES_SEG_ABSENT, "unit %u", x);
    for (uint32_t s = 0; s < f.sm->n_segs; s++) {
        if (s != seg)
            cr_assert_eq(res_seg_state(f.res, f.rm, s), RES_SEG_ABSENT);
        cr_assert_eq(res_unit_bytes(f.rm, s), s == seg ? pages * PAGE : 0);
    }
    stats_res_t st;
    res_model_stats(f.res, f.rm, &st);
    cr_assert_eq(st.total_bytes_in, store_seg_unit(f.sm, seg, u)->bytes, "its slices copied");
    cr_assert_eq(st.curr_resident_bytes, pages * PAGE);
    /* mapping it again changes nothing */
    char err[256] = "";
    cr_assert_eq(res_unit_map(f.res, f.rm, seg, u, err, sizeof err), RES_OK, "%s", err);
    cr_assert_eq(res_weight_bytes(f.rm), pages * PAGE);
    tu_res_close(&f);
}

Test(res_unit, evicting_one_expert_keeps_its_neighbours_and_their_shared_pages, .timeout = 30)
{
    fixture_t f;
    fx_open(&f, MOE_ARGS);
    const uint32_t seg = FWD_SEG_LAYER(0), a = STORE_UNIT_EXPERT(4), b = STORE_UNIT_EXPERT(5);
    const uint32_t rest = STORE_UNIT_REST;
    size_t free0 = tu_res_pool_free(f.res);
    size_t pa = pages_of(f.sm, seg, a, a), pb = pages_of(f.sm, seg, b, b),
           pab = pages_of(f.sm, seg, a, b), pr = pages_of(f.sm, seg, rest, rest);
    cr_assert_lt(pab, pa + pb, "experts 4 and 5 share pages (%zu + %zu, %zu together)", pa, pb,
                 pab);
    map_wait(&f, seg, a);
    map_wait(&f, seg, b);
    map_wait(&f, seg, rest);
    cr_assert_eq(res_weight_bytes(f.rm), (pab + pr) * PAGE, "shared pages counted once");
    cr_assert_eq(tu_res_pool_free(f.res), free0 - pab - pr);

    cr_assert_eq(res_unit_evict(f.res, f.rm, seg, a, RES_CAUSE_ADMIN), RES_OK);
    cr_assert_eq(res_unit_state(f.res, f.rm, seg, a), RES_SEG_ABSENT);
    cr_assert_eq(res_unit_state(f.res, f.rm, seg, b), RES_SEG_RESIDENT);
    cr_assert_eq(res_unit_state(f.res, f.rm, seg, rest), RES_SEG_RESIDENT);
    /* what expert 5 and the rest read is still there (an unmapped page would fault) */
    assert_unit_copied(&f, seg, b);
    assert_unit_copied(&f, seg, rest);
    cr_assert_eq(res_weight_bytes(f.rm), (pb + pr) * PAGE, "expert 4's own pages given back");
    cr_assert_eq(tu_res_pool_free(f.res), free0 - pb - pr);
    stats_res_t st;
    res_model_stats(f.res, f.rm, &st);
    cr_assert_eq(st.evictions_admin, 1);
    cr_assert_eq(st.total_bytes_evicted, (pab - pb) * PAGE);

    /* back again: its bytes are recopied into the page it shares with expert 5 */
    map_wait(&f, seg, a);
    assert_unit_copied(&f, seg, a);
    assert_unit_copied(&f, seg, b);
    cr_assert_eq(res_weight_bytes(f.rm), (pab + pr) * PAGE);
    cr_assert_eq(res_unit_evict(f.res, f.rm, seg, b, RES_CAUSE_ADMIN), RES_OK);
    cr_assert_eq(res_unit_evict(f.res, f.rm, seg, a, RES_CAUSE_ADMIN), RES_OK);
    cr_assert_eq(res_unit_evict(f.res, f.rm, seg, rest, RES_CAUSE_ADMIN), RES_OK);
    cr_assert_eq(res_weight_bytes(f.rm), 0);
    cr_assert_eq(res_unit_bytes(f.rm, seg), 0);
    cr_assert_eq(tu_res_pool_free(f.res), free0);
    tu_res_close(&f);
}

Test(res_unit, every_unit_of_a_layer_maps_exactly_its_segment, .timeout = 30)
{
    fixture_t f;
    fx_open(&f, MOE_ARGS);
    const uint32_t seg = FWD_SEG_LAYER(1);
    size_t free0 = tu_res_pool_free(f.res);
    for (uint32_t u = store_seg_units(f.sm, seg); u-- > 0;)
        map_wait(&f, seg, u);
    for (uint32_t u = 0; u < store_seg_units(f.sm, seg); u++)
        assert_unit_copied(&f, seg, u);
    cr_assert_eq(res_weight_bytes(f.rm), f.sm->segs[seg].span);
    cr_assert_eq(tu_res_pool_free(f.res), free0 - f.sm->segs[seg].span / PAGE);
    /* tail-first eviction takes the layer's units as one eviction */
    cr_assert_eq(res_evict(f.res, f.rm, RES_CAUSE_ADMIN, 1), RES_OK);
    cr_assert_eq(res_weight_bytes(f.rm), 0);
    cr_assert_eq(tu_res_pool_free(f.res), free0);
    stats_res_t st;
    res_model_stats(f.res, f.rm, &st);
    cr_assert_eq(st.evictions_admin, 1);
    tu_res_close(&f);
}

Test(res_unit, paging_the_model_whole_takes_the_layer_back_from_its_units, .timeout = 30)
{
    fixture_t f;
    char err[256] = "";
    fx_open(&f, MOE_ARGS);
    const uint32_t seg = FWD_SEG_LAYER(0);
    map_wait(&f, seg, STORE_UNIT_EXPERT(0));
    map_wait(&f, seg, STORE_UNIT_EXPERT(7));
    cr_assert_eq(res_prefetch(f.res, f.rm, RES_EVICT_NONE, err, sizeof err), RES_OK, "%s", err);
    for (uint32_t s = 0; s < f.sm->n_segs; s++)
        while (res_seg_state(f.res, f.rm, s) != RES_SEG_RESIDENT)
            usleep(1000);
    cr_assert(res_fully_resident(f.res, f.rm));
    cr_assert_eq(res_weight_bytes(f.rm), f.sm->image_bytes, "no page counted twice");
    cr_assert_eq(res_unit_bytes(f.rm, seg), 0, "held whole now");
    /* a unit of a layer held whole is there with it and leaves only with it */
    cr_assert_eq(res_unit_state(f.res, f.rm, seg, STORE_UNIT_EXPERT(3)), RES_SEG_RESIDENT);
    cr_assert_eq(res_unit_map(f.res, f.rm, seg, STORE_UNIT_EXPERT(3), err, sizeof err), RES_OK);
    cr_assert_eq(res_unit_wait(f.res, f.rm, seg, STORE_UNIT_EXPERT(3)), RES_OK);
    cr_assert_eq(res_unit_evict(f.res, f.rm, seg, STORE_UNIT_EXPERT(3), RES_CAUSE_ADMIN),
                 RES_ERR_BUSY);
    assert_unit_copied(&f, seg, STORE_UNIT_EXPERT(0));
    cr_assert_eq(res_evict(f.res, f.rm, RES_CAUSE_ADMIN, 0), RES_OK);
    cr_assert_eq(res_weight_bytes(f.rm), 0);
    tu_res_close(&f);
}

Test(res_unit, a_unit_beyond_the_quota_is_refused_and_maps_nothing, .timeout = 30)
{
    fixture_t f;
    char err[256] = "";
    fx_open(&f, MOE_ARGS);
    const uint32_t seg = FWD_SEG_LAYER(1), u = STORE_UNIT_EXPERT(2);
    size_t pages = pages_of(f.sm, seg, u, u);
    res_cfg_t cfg = {.gpu_quota = f.sm->image_bytes}; /* res_add's minimum fits in it */
    cr_assert_eq(res_set_cfg(f.res, f.rm, &cfg, err, sizeof err), RES_OK, "%s", err);
    cr_assert_eq(res_prefetch(f.res, f.rm, RES_EVICT_NONE, err, sizeof err), RES_OK, "%s", err);
    cr_assert_eq(res_evict(f.res, f.rm, RES_CAUSE_ADMIN, 1), RES_OK); /* the head */
    cr_assert_eq(res_evict(f.res, f.rm, RES_CAUSE_ADMIN, 1), RES_OK); /* layer 1 */
    cfg.gpu_quota = res_weight_bytes(f.rm) + (pages - 1) * PAGE;
    cr_assert_eq(res_set_cfg(f.res, f.rm, &cfg, err, sizeof err), RES_OK, "%s", err);
    size_t held = res_weight_bytes(f.rm), free0 = tu_res_pool_free(f.res);
    cr_assert_eq(res_unit_map(f.res, f.rm, seg, u, err, sizeof err), RES_ERR_NOSPACE);
    cr_assert(strstr(err, "unit 3 of segment 2"), "%s", err);
    cr_assert_eq(res_unit_state(f.res, f.rm, seg, u), RES_SEG_ABSENT);
    cr_assert_eq(res_weight_bytes(f.rm), held);
    cr_assert_eq(tu_res_pool_free(f.res), free0);
    cfg.gpu_quota += PAGE;
    cr_assert_eq(res_set_cfg(f.res, f.rm, &cfg, err, sizeof err), RES_OK, "%s", err);
    map_wait(&f, seg, u);
    cr_assert_eq(res_weight_bytes(f.rm), held + pages * PAGE);
    tu_res_close(&f);
}

Test(res_unit, a_failed_copy_or_map_gives_the_units_pages_back_and_spares_its_neighbours,
     .timeout = 30)
{
    fixture_t f;
    char err[256] = "";
    fx_open(&f, MOE_ARGS);
    const uint32_t seg = FWD_SEG_LAYER(0), e0 = STORE_UNIT_EXPERT(0), e1 = STORE_UNIT_EXPERT(1);
    map_wait(&f, seg, STORE_UNIT_REST);
    size_t held = res_weight_bytes(f.rm);
    /* the copy fails: the unit is unmapped again, the rest (sharing its first page) stays */
    be_fault_t fault = {BE_FAULT_COPY_FAIL, 1, 0};
    cr_assert_eq(f.be->inject(f.be->ctx, &fault), 0);
    cr_assert_eq(res_unit_map(f.res, f.rm, seg, e0, err, sizeof err), RES_OK, "%s", err);
    cr_assert_eq(res_unit_wait(f.res, f.rm, seg, e0), RES_ERR_DEVICE);
    cr_assert_eq(res_unit_state(f.res, f.rm, seg, e0), RES_SEG_ABSENT);
    cr_assert_eq(res_weight_bytes(f.rm), held);
    assert_unit_copied(&f, seg, STORE_UNIT_REST);
    /* the map fails: nothing stays mapped or counted */
    fault = (be_fault_t){BE_FAULT_MAP_FAIL, 1, 0};
    cr_assert_eq(f.be->inject(f.be->ctx, &fault), 0);
    cr_assert_neq(res_unit_map(f.res, f.rm, seg, e0, err, sizeof err), RES_OK);
    cr_assert_eq(res_unit_state(f.res, f.rm, seg, e0), RES_SEG_ABSENT);
    cr_assert_eq(res_weight_bytes(f.rm), held);
    /* and later maps and evictions count the shared pages right */
    map_wait(&f, seg, e0);
    map_wait(&f, seg, e1);
    assert_unit_copied(&f, seg, e0);
    cr_assert_eq(res_unit_evict(f.res, f.rm, seg, e0, RES_CAUSE_ADMIN), RES_OK);
    assert_unit_copied(&f, seg, STORE_UNIT_REST);
    assert_unit_copied(&f, seg, e1);
    cr_assert_eq(res_weight_bytes(f.rm), pages_of(f.sm, seg, STORE_UNIT_REST, e1) * PAGE);
    cr_assert_eq(res_unit_evict(f.res, f.rm, seg, e1, RES_CAUSE_ADMIN), RES_OK);
    cr_assert_eq(res_weight_bytes(f.rm), held);
    tu_res_close(&f);
}
