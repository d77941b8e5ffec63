/* Unit tests for the host store and residency on the sim backend: property test, pipelining, partial page-in, quotas, KV pages. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "worker/residency.h"
#include "worker/store.h"
#include "testutil.h"
#include "base/util.h"

#define PAGE (64u << 10)
#define MAX_MODELS 4
#define PROMPT_LEN 6
#define DECODE 2

typedef struct fixture {
    backend_t *sim, *cpu;
    store_t *store;
    res_t *res;
    int n;
    store_model_t *sm[MAX_MODELS];
    res_model_t *rm[MAX_MODELS];
    char path[MAX_MODELS][256];
    float *ref[MAX_MODELS]; /* (PROMPT_LEN/DECODE steps, n_vocab) cpu logits */
    fwd_t *fw;
} fixture_t;

static const int32_t prompt[PROMPT_LEN] = {1, 17, 42, 99, 7, 250};
static const int32_t decode[DECODE] = {5, 123};

/* Runs prompt + decode on m with weights w; writes (1 + DECODE) logit rows. */
static int run_model(fwd_t *fw, const model_t *m, const model_weights_t *w, res_t *res,
                     res_model_t *rm, float *out)
{
    char err[256];
    kv_seq_t *kv = NULL;
    int own_kv = res == NULL;
    if (own_kv)
        kv = kv_seq_new(&m->hp, 32, KV_TYPE_F16);
    else
        cr_assert_eq(res_kv_new(res, rm, 32, &kv, err, sizeof err), 0, "%s", err);
    fwd_hooks_t h = rm ? res_hooks(rm) : (fwd_hooks_t){0};
    fwd_seq_t s = {kv, prompt, PROMPT_LEN, out, NULL};
    if (!own_kv)
        cr_assert_eq(res_kv_ensure(res, kv, PROMPT_LEN, err, sizeof err), 0, "%s", err);
    int rc = fwd_run(fw, &m->hp, w, &s, 1, rm ? &h : NULL, err, sizeof err);
    cr_assert_eq(rc, 0, "prefill: %s", err);
    for (int i = 0; i < DECODE; i++) {
        if (!own_kv)
            cr_assert_eq(res_kv_ensure(res, kv, PROMPT_LEN + i + 1, err, sizeof err), 0, "%s", err);
        fwd_seq_t d = {kv, &decode[i], 1, out + (size_t)(i + 1) * m->hp.n_vocab, NULL};
        rc = fwd_run(fw, &m->hp, w, &d, 1, rm ? &h : NULL, err, sizeof err);
        cr_assert_eq(rc, 0, "decode: %s", err);
    }
    if (own_kv)
        kv_seq_free(kv);
    else
        res_kv_free(res, kv);
    return 0;
}

static backend_t *open_be(const char *kind, size_t mem, double bw)
{
    char err[256];
    be_kind_t k;
    cr_assert_eq(be_kind_from_name(kind, &k), 0, "%s", kind);
    be_params_t p = {
        .kind = k, .memory = mem, .page_size = PAGE, .sim_bandwidth = bw, .threads = 2};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);
    return be;
}

static void fx_init(fixture_t *f, size_t pool_pages, double bw, const char *const *args, int n)
{
    memset(f, 0, sizeof *f);
    char err[512];
    f->sim = open_be("sim", pool_pages * PAGE, bw);
    f->cpu = open_be("cpu", 0, 0);
    f->store = store_new(f->sim, 0);
    f->res = res_new(f->sim, err, sizeof err);
    cr_assert_not_null(f->res, "%s", err);
    f->fw = fwd_new(f->sim);
    fwd_t *cfw = fwd_new(f->cpu);
    f->n = n;
    for (int i = 0; i < n; i++) {
        tu_mkmodel(f->path[i], sizeof f->path[i], args[i]);
        char name[16];
        snprintf(name, sizeof name, "m%d", i);
        cr_assert_eq(store_load(f->store, name, f->path[i], &f->sm[i], err, sizeof err), 0, "%s",
                     err);
        unlink(f->path[i]);
        res_cfg_t cfg = {0};
        cr_assert_eq(res_add(f->res, f->sm[i], &cfg, &f->rm[i], err, sizeof err), 0, "%s", err);
        const model_t *m = f->sm[i]->model;
        f->ref[i] = malloc((1 + DECODE) * m->hp.n_vocab * sizeof(float));
        run_model(cfw, m, &m->w, NULL, NULL, f->ref[i]);
    }
    fwd_free(cfw);
}

static void fx_fini(fixture_t *f)
{
    for (int i = 0; i < f->n; i++) {
        cr_assert_eq(res_remove(f->res, f->rm[i]), 0);
        store_unload(f->store, f->sm[i]);
        free(f->ref[i]);
    }
    res_free(f->res);
    store_free(f->store);
    fwd_free(f->fw);
    be_close(f->sim);
    be_close(f->cpu);
}

/* Pass on the sim backend through the residency manager; logits must equal
 * the cpu backend's bit for bit. */
static void run_and_check(fixture_t *f, int i)
{
    const model_t *m = f->sm[i]->model;
    size_t nv = m->hp.n_vocab;
    float *got = malloc((1 + DECODE) * nv * sizeof(float));
    run_model(f->fw, m, res_weights(f->rm[i]), f->res, f->rm[i], got);
    cr_assert_eq(memcmp(got, f->ref[i], (1 + DECODE) * nv * sizeof(float)), 0,
                 "model %d: sim logits differ from cpu logits", i);
    free(got);
}

static void check_invariants(fixture_t *f)
{
    stats_pool_t ps;
    res_pool_stats(f->res, &ps);
    size_t sum = 0;
    for (int i = 0; i < f->n; i++) {
        size_t b = res_model_bytes(f->rm[i]);
        const res_cfg_t *c = res_cfg(f->rm[i]);
        if (c->gpu_quota)
            cr_assert_leq(b, c->gpu_quota, "model %d holds %zu bytes, quota %zu", i, b,
                          c->gpu_quota);
        sum += b;
    }
    cr_assert_leq(ps.curr_pool_used, ps.curr_pool_pages);
    cr_assert_eq(sum, ps.curr_pool_used * ps.page_size, "pages accounted %zu vs used %llu", sum,
                 (unsigned long long)(ps.curr_pool_used * ps.page_size));
}

static uint64_t rs = 12345;
static uint32_t rnd(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

static size_t min_bytes(const store_model_t *sm)
{
    size_t mx = 0;
    for (uint32_t s = 1; s < sm->n_segs; s++)
        if (sm->segs[s].span > mx)
            mx = sm->segs[s].span;
    return sm->segs[0].span + mx;
}

static const char *const mixed[MAX_MODELS] = {
    "--type f32 --dim 128 --layers 4 --heads 8 --kv-heads 4 --ff 256 --vocab 512 --seed 1",
    "--type f16 --dim 64 --layers 3 --heads 4 --kv-heads 2 --ff 128 --vocab 320 --seed 2",
    "--type q8_0 --dim 128 --layers 6 --heads 4 --kv-heads 4 --ff 256 --vocab 400 --seed 3",
    "--arch qwen2 --type bf16 --dim 96 --layers 5 --heads 6 --kv-heads 2 --ff 192 --vocab 360 --seed 4",
};

Test(residency, random_page_in_run_evict_sequences_keep_every_invariant, .timeout = 240)
{
    fixture_t f;
    /* a pool that holds about two of the four models */
    fx_init(&f, 56, 0, mixed, MAX_MODELS);
    size_t total = 0;
    for (int i = 0; i < f.n; i++)
        total += f.sm[i]->image_bytes;
    cr_log_info("models need %zu pages together; pool has 56", total / PAGE);
    int packed = 0;
    for (int i = 0; i < f.n; i++) {
        cr_log_info("model %d: %zu pages, %zu host bytes (segments aligned to %zu)", i,
                    f.sm[i]->image_bytes / PAGE, f.sm[i]->host_bytes, f.sm[i]->host_align);
        packed += f.sm[i]->host_align < PAGE;
    }
    /* logits checked bit for bit also where a page-in copies less than the
     * span, into pages another model left its bytes in */
    cr_assert_gt(packed, 0, "no model packed closer than a page in host RAM");
    int pinned = -1;
    const int OPS = 4000;
    for (int op = 0; op < OPS; op++) {
        uint32_t kind = rnd(100);
        int i = (int)rnd((uint32_t)f.n);
        size_t pinned_before = pinned >= 0 ? res_model_bytes(f.rm[pinned]) : 0;
        if (kind < 50) {
            char err[256];
            cr_assert_eq(res_acquire(f.res, f.rm[i], err, sizeof err), 0, "%s", err);
            run_and_check(&f, i);
            res_release(f.res, f.rm[i]);
        } else if (kind < 65) {
            /* two models running at once: the second must not take the first's pages */
            int j = (i + 1 + (int)rnd((uint32_t)f.n - 1)) % f.n;
            /* only when both fit beside a pinned model (with KV slack):
             * otherwise the second one rightly finds no room */
            size_t need =
                f.sm[i]->image_bytes + f.sm[j]->image_bytes + 8 * PAGE +
                (pinned >= 0 && pinned != i && pinned != j ? f.sm[pinned]->image_bytes : 0);
            if (need > 56 * PAGE)
                continue;
            char err[256];
            cr_assert_eq(res_acquire(f.res, f.rm[i], err, sizeof err), 0, "%s", err);
            res_seg_state_t before[64];
            uint32_t ns = f.sm[i]->n_segs;
            for (uint32_t s = 0; s < ns; s++)
                before[s] = res_seg_state(f.res, f.rm[i], s);
            cr_assert_eq(res_acquire(f.res, f.rm[j], err, sizeof err), 0, "%s", err);
            run_and_check(&f, j);
            for (uint32_t s = 0; s < ns; s++)
                if (before[s] != RES_SEG_ABSENT)
                    cr_assert_neq(res_seg_state(f.res, f.rm[i], s), RES_SEG_ABSENT,
                                  "op %d: running model %d lost segment %u to model %d", op, i, s,
                                  j);
            res_release(f.res, f.rm[j]);
            run_and_check(&f, i);
            res_release(f.res, f.rm[i]);
        } else if (kind < 75) {
            if (i != pinned)
                cr_assert_eq(res_evict(f.res, f.rm[i], RES_CAUSE_ADMIN, 1 + rnd(4)), 0);
        } else if (kind < 85) {
            char err[256];
            cr_assert_eq(res_prefetch(f.res, f.rm[i], (int)rnd(2), err, sizeof err), 0, "%s", err);
        } else if (kind < 92) {
            /* pin one model at a time (a small one, so the rest still fit) */
            res_cfg_t c = *res_cfg(f.rm[1]);
            c.pinned = !c.pinned;
            char err[256];
            cr_assert_eq(res_set_cfg(f.res, f.rm[1], &c, err, sizeof err), 0);
            pinned = c.pinned ? 1 : -1;
            pinned_before = pinned >= 0 ? res_model_bytes(f.rm[1]) : 0;
        } else {
            /* a quota between the minimum to run and the whole model: streams */
            res_cfg_t c = *res_cfg(f.rm[i]);
            size_t lo = min_bytes(f.sm[i]) + 2 * PAGE, hi = f.sm[i]->image_bytes + 4 * PAGE;
            c.gpu_quota = rnd(3) ? lo + rnd((uint32_t)(hi - lo)) / PAGE * PAGE : 0;
            char err[256];
            cr_assert_eq(res_set_cfg(f.res, f.rm[i], &c, err, sizeof err), 0, "%s", err);
        }
        check_invariants(&f);
        /* others never take a pinned model's pages (its own pass may still
         * stream within its own quota) */
        if (pinned >= 0 && kind < 85 && i != pinned && !(kind >= 50 && kind < 65))
            cr_assert_geq(res_model_bytes(f.rm[pinned]), pinned_before,
                          "op %d: pinned model lost pages", op);
    }
    stats_res_t tot = {0};
    for (int i = 0; i < f.n; i++) {
        stats_res_t st;
        res_model_stats(f.res, f.rm[i], &st);
        stats_res_add(&tot, &st);
    }
    cr_log_info("%d ops: %llu page-ins, %llu hits, %llu misses, evictions capacity %llu quota %llu "
                "admin %llu",
                OPS, (unsigned long long)tot.total_page_ins, (unsigned long long)tot.total_hits,
                (unsigned long long)tot.total_misses, (unsigned long long)tot.evictions_capacity,
                (unsigned long long)tot.evictions_quota, (unsigned long long)tot.evictions_admin);
    cr_assert_gt(tot.evictions_capacity, 0, "the workload never forced an eviction");
    cr_assert_gt(tot.evictions_quota, 0, "the workload never streamed under a quota");
    fx_fini(&f);
}

/* Records when the pass first reads layer 0 and when each wait returned. */
typedef struct rec_hooks {
    fwd_hooks_t inner;
    double t_layer0;
} rec_hooks_t;

static int rec_wait(void *ctx, uint32_t seg)
{
    rec_hooks_t *h = ctx;
    int rc = h->inner.wait(h->inner.ctx, seg);
    if (seg == FWD_SEG_LAYER(0) && h->t_layer0 == 0)
        h->t_layer0 = util_now_s();
    return rc;
}

Test(residency, layer_zero_computes_before_the_last_layer_has_landed, .timeout = 60)
{
    static const char *const one[1] = {
        "--type f32 --dim 128 --layers 8 --heads 4 --ff 384 --vocab 320 --seed 9"};
    fixture_t f;
    enum {
        NP = 320
    };
    int32_t longp[NP];
    for (int i = 0; i < NP; i++)
        longp[i] = 1 + (i * 37) % 300;
    /* throttle the copy so the whole page-in takes about as long as the
     * compute of a 128-token prompt on this build (sanitizers are slower):
     * then pipelining matters most, and the bound has slack both ways */
    double bw;
    {
        fx_init(&f, 200, 0, one, 1);
        char e[256];
        const model_t *m0 = f.sm[0]->model;
        float *lg = malloc(m0->hp.n_vocab * sizeof(float));
        cr_assert_eq(res_acquire(f.res, f.rm[0], e, sizeof e), 0);
        kv_seq_t *kv0;
        cr_assert_eq(res_kv_new(f.res, f.rm[0], NP, &kv0, e, sizeof e), 0);
        cr_assert_eq(res_kv_ensure(f.res, kv0, NP, e, sizeof e), 0);
        fwd_hooks_t h0 = res_hooks(f.rm[0]);
        double best = 1e9;
        for (int r = 0; r < 3; r++) {
            kv_seq_reset(kv0);
            fwd_seq_t s0 = {kv0, longp, NP, lg, NULL};
            double t = util_now_s();
            cr_assert_eq(fwd_run(f.fw, &m0->hp, res_weights(f.rm[0]), &s0, 1, &h0, e, sizeof e), 0);
            t = util_now_s() - t;
            if (r > 0 && t < best)
                best = t;
        }
        res_kv_free(f.res, kv0);
        res_release(f.res, f.rm[0]);
        bw = (double)f.sm[0]->image_bytes / best;
        free(lg);
        fx_fini(&f);
    }
    fx_init(&f, 200, bw, one, 1);
    const model_t *m = f.sm[0]->model;
    char err[256];
    float *logits = malloc(m->hp.n_vocab * sizeof(float));
    /* compute time when resident, for the bound */
    cr_assert_eq(res_prefetch(f.res, f.rm[0], 0, err, sizeof err), 0);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0);
    kv_seq_t *kv;
    cr_assert_eq(res_kv_new(f.res, f.rm[0], NP, &kv, err, sizeof err), 0);
    cr_assert_eq(res_kv_ensure(f.res, kv, NP, err, sizeof err), 0);
    fwd_hooks_t h = res_hooks(f.rm[0]);
    fwd_seq_t s = {kv, longp, NP, logits, NULL};
    cr_assert_eq(fwd_run(f.fw, &m->hp, res_weights(f.rm[0]), &s, 1, &h, err, sizeof err), 0);
    kv_seq_reset(kv);
    double c0 = util_now_s();
    cr_assert_eq(fwd_run(f.fw, &m->hp, res_weights(f.rm[0]), &s, 1, &h, err, sizeof err), 0);
    double compute = util_now_s() - c0;
    res_release(f.res, f.rm[0]);
    cr_assert_eq(res_evict(f.res, f.rm[0], RES_CAUSE_ADMIN, 0), 0);

    /* swapped out: page in and run at once. Timing on a shared 2-core box
     * is noisy, so the pipelining must show in one of five trials (each
     * judged against its own copy time and the slower of the first resident
     * compute time and the one measured right after it). */
    int shown = 0;
    for (int trial = 0; trial < 5 && !shown; trial++) {
        cr_assert_eq(res_evict(f.res, f.rm[0], RES_CAUSE_ADMIN, 0), 0);
        kv_seq_reset(kv);
        rec_hooks_t rh = {.inner = res_hooks(f.rm[0])};
        fwd_hooks_t hh = {.wait = rec_wait, .ctx = &rh};
        double t0 = util_now_s();
        cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0);
        cr_assert_eq(fwd_run(f.fw, &m->hp, res_weights(f.rm[0]), &s, 1, &hh, err, sizeof err), 0);
        double ttft = util_now_s() - t0;
        /* the same pass again, now resident: the compute time under this
         * trial's load (another Criterion job shares the two cores) */
        kv_seq_reset(kv);
        double r0 = util_now_s();
        cr_assert_eq(fwd_run(f.fw, &m->hp, res_weights(f.rm[0]), &s, 1, &h, err, sizeof err), 0);
        double now = util_now_s() - r0;
        double comp = now > compute ? now : compute;
        res_release(f.res, f.rm[0]);
        uint32_t last = f.sm[0]->n_segs - 1;
        be_copy_times_t first_t, last_t;
        cr_assert_eq(res_seg_times(f.res, f.rm[0], 0, &first_t), 0);
        cr_assert_eq(res_seg_times(f.res, f.rm[0], last, &last_t), 0);
        double copy = last_t.end - first_t.start;
        cr_log_info("copy %.1f ms, compute %.1f ms, first token %.1f ms, layer 0 starts %.1f ms "
                    "before the last copy ends",
                    copy * 1e3, comp * 1e3, ttft * 1e3, (last_t.end - rh.t_layer0) * 1e3);
        /* structural: always true, whatever the timing noise */
        cr_assert_lt(rh.t_layer0, last_t.end, "layer 0 started only after the last copy ended");
        shown = ttft < copy + comp;
    }
    cr_assert(shown, "first token never came before copy + compute in five trials");
    res_kv_free(f.res, kv);
    free(logits);
    fx_fini(&f);
}

Test(residency, a_partially_evicted_model_pages_in_only_its_missing_tail)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 1);
    char err[256];
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0);
    run_and_check(&f, 0);
    res_release(f.res, f.rm[0]);
    stats_res_t a, b, c;
    res_model_stats(f.res, f.rm[0], &a);
    cr_assert_eq(res_evict(f.res, f.rm[0], RES_CAUSE_ADMIN, 3), 0);
    res_model_stats(f.res, f.rm[0], &b);
    uint64_t evicted = b.total_bytes_evicted - a.total_bytes_evicted;
    cr_assert_eq(b.evictions_admin - a.evictions_admin, 3);
    /* tail-first: the head and the last two layers went, layer 0 stayed */
    uint32_t n = f.sm[0]->n_segs;
    cr_assert_eq(res_seg_state(f.res, f.rm[0], n - 1), RES_SEG_ABSENT);
    cr_assert_eq(res_seg_state(f.res, f.rm[0], FWD_SEG_LAYER(0)), RES_SEG_RESIDENT);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0);
    run_and_check(&f, 0);
    res_release(f.res, f.rm[0]);
    res_model_stats(f.res, f.rm[0], &c);
    cr_assert_eq(
        c.total_bytes_in - b.total_bytes_in, evicted, "paged in %llu bytes after evicting %llu",
        (unsigned long long)(c.total_bytes_in - b.total_bytes_in), (unsigned long long)evicted);
    cr_assert_eq(c.total_page_ins - b.total_page_ins, 3);
    cr_assert_eq(c.total_misses - b.total_misses, 1);
    fx_fini(&f);
}

Test(residency, a_model_under_a_small_quota_streams_its_layers_and_stays_within_it)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 1);
    char err[256];
    cr_assert_not(res_streams(f.rm[0]), "without a quota it fits the pool");
    res_cfg_t c = {.gpu_quota = min_bytes(f.sm[0]) + 2 * PAGE};
    cr_assert_eq(res_set_cfg(f.res, f.rm[0], &c, err, sizeof err), 0);
    cr_assert(res_streams(f.rm[0]), "its quota holds less than its weights: every pass streams");
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0);
        run_and_check(&f, 0);
        res_release(f.res, f.rm[0]);
        check_invariants(&f);
    }
    stats_res_t st;
    res_model_stats(f.res, f.rm[0], &st);
    cr_assert_gt(st.evictions_quota, 0);
    fx_fini(&f);
}

Test(residency, a_quota_below_the_minimum_to_run_is_refused_with_a_reason)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 1);
    char err[256];
    res_cfg_t c = {.gpu_quota = PAGE};
    res_model_t *dup;
    int rc = res_add(f.res, f.sm[0], &c, &dup, err, sizeof err);
    cr_assert_eq(rc, RES_ERR_QUOTA);
    cr_assert(strstr(err, "gpu_quota") != NULL, "%s", err);
    fx_fini(&f);
}

Test(residency, kv_pages_are_counted_and_returned)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 1);
    char err[256];
    stats_pool_t p0, p1, p2;
    res_pool_stats(f.res, &p0);
    kv_seq_t *kv;
    cr_assert_eq(res_kv_new(f.res, f.rm[0], 512, &kv, err, sizeof err), 0);
    cr_assert_eq(res_kv_ensure(f.res, kv, 300, err, sizeof err), 0, "%s", err);
    res_pool_stats(f.res, &p1);
    const model_hparams_t *hp = &f.sm[0]->model->hp;
    size_t per = 300ull * hp->n_layer * hp->n_head_kv * hp->head_dim * 2; /* F16, the default */
    size_t pages = 2 * ((per + PAGE - 1) / PAGE);
    cr_assert_eq(p1.curr_pool_used - p0.curr_pool_used, pages);
    cr_assert_neq(res_kv_ensure(f.res, kv, 513, err, sizeof err), 0);
    res_kv_free(f.res, kv);
    res_pool_stats(f.res, &p2);
    cr_assert_eq(p2.curr_pool_used, p0.curr_pool_used);
    stats_res_t st;
    res_model_stats(f.res, f.rm[0], &st);
    cr_assert_eq(st.total_kv_allocs, 1);
    cr_assert_eq(st.total_kv_frees, 1);
    cr_assert_eq(st.curr_kv_bytes, 0);
    fx_fini(&f);
}

/* Positions of a cache of model i whose K and V together take at most bytes. */
static uint32_t kv_pos_for(const fixture_t *f, int i, size_t bytes)
{
    return (uint32_t)(bytes / kv_bytes_per_pos(&f->sm[i]->model->hp, KV_TYPE_F16));
}

/* kv_cache as a reservation: another model's KV never maps into the part of
 * it the owner has not used, and the owner can map it. */
Test(residency, a_kv_reservation_is_kept_for_its_model)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 2);
    char err[256];
    res_cfg_t c0 = {.kv_reserve = 8 * PAGE};
    cr_assert_eq(res_set_cfg(f.res, f.rm[0], &c0, err, sizeof err), 0, "%s", err);
    kv_seq_t *kv1, *kv0;
    uint32_t cap1 = kv_pos_for(&f, 1, 100 * PAGE);
    cr_assert_eq(res_kv_new(f.res, f.rm[1], cap1, &kv1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f.res, kv1, kv_pos_for(&f, 1, 2 * PAGE), err, sizeof err), 0, "%s",
                 err);
    size_t all = res_kv_available(f.res);
    cr_assert_gt(all, 12 * PAGE, "the test needs room beyond the reservation");
    cr_assert_eq(res_kv_available_for(f.res, f.rm[1]), all - 8 * PAGE);
    cr_assert_eq(res_kv_available_for(f.res, f.rm[0]), all);
    /* m1 cannot grow into m0's reservation, and says why */
    size_t mapped1 = res_model_bytes(f.rm[1]) - res_weight_bytes(f.rm[1]); /* its KV */
    uint32_t over = kv_pos_for(&f, 1, mapped1 + all - 4 * PAGE);
    cr_assert_eq(res_kv_ensure(f.res, kv1, over, err, sizeof err), RES_ERR_NOSPACE);
    cr_assert(strstr(err, "reserved by other models' kv_cache"), "%s", err);
    /* up to the reservation's edge it grows */
    uint32_t fits = kv_pos_for(&f, 1, mapped1 + all - 10 * PAGE);
    cr_assert_eq(res_kv_ensure(f.res, kv1, fits, err, sizeof err), 0, "%s", err);
    cr_assert_geq(res_kv_available_for(f.res, f.rm[0]), 8 * PAGE);
    /* and m0 gets its reservation whole */
    uint32_t n0 = kv_pos_for(&f, 0, 8 * PAGE);
    cr_assert_eq(res_kv_new(f.res, f.rm[0], n0, &kv0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f.res, kv0, n0, err, sizeof err), 0, "%s", err);
    check_invariants(&f);
    res_kv_free(f.res, kv0);
    res_kv_free(f.res, kv1);
    fx_fini(&f);
}

Test(residency, host_budget_refuses_a_model_that_does_not_fit_and_keeps_the_others)
{
    char err[512], p1[256], p2[256];
    backend_t *be = open_be("sim", 64 * PAGE, 0);
    tu_mkmodel(p1, sizeof p1, mixed[1]);
    tu_mkmodel(p2, sizeof p2, mixed[0]);
    store_t *st = store_new(be, 40 * PAGE);
    store_model_t *a, *b;
    cr_assert_eq(store_load(st, "small", p1, &a, err, sizeof err), 0, "%s", err);
    int rc = store_load(st, "big", p2, &b, err, sizeof err);
    cr_assert_eq(rc, STORE_ERR_BUDGET);
    cr_assert(strstr(err, "host budget") && strstr(err, "big"), "%s", err);
    cr_assert_eq(store_used(st), a->host_bytes);
    cr_assert_eq(store_load(st, "bad", "/nonexistent.gguf", &b, err, sizeof err), STORE_ERR_LOAD);
    cr_assert(strstr(err, "/nonexistent.gguf") != NULL, "%s", err);
    store_unload(st, a);
    cr_assert_eq(store_used(st), 0);
    store_free(st);
    be_close(be);
    unlink(p1);
    unlink(p2);
}

/* A pass over model 0 through the hooks; the fwd_run return code. */
static int try_pass(fixture_t *f, char *err, size_t errlen)
{
    const model_t *m = f->sm[0]->model;
    kv_seq_t *kv = NULL;
    cr_assert_eq(res_kv_new(f->res, f->rm[0], 32, &kv, err, errlen), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f->res, kv, PROMPT_LEN, err, errlen), 0, "%s", err);
    float *out = malloc(m->hp.n_vocab * sizeof(float));
    fwd_hooks_t h = res_hooks(f->rm[0]);
    fwd_seq_t s = {kv, prompt, PROMPT_LEN, out, NULL};
    int rc = fwd_run(f->fw, &m->hp, res_weights(f->rm[0]), &s, 1, &h, err, errlen);
    free(out);
    res_kv_free(f->res, kv);
    return rc;
}

Test(residency, a_failed_copy_fails_the_pass_and_the_segment_is_paged_in_again)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 1);
    char err[256];
    const char *why;
    be_fault_t fault = {BE_FAULT_COPY_FAIL, 1, 0};
    cr_assert_eq(f.sim->inject(f.sim->ctx, &fault), 0);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    cr_assert_neq(try_pass(&f, err, sizeof err), 0, "a pass over a failed copy must fail");
    cr_assert_eq(res_last_error(f.rm[0], &why), RES_ERR_DEVICE);
    cr_assert(strstr(why, "failed to copy segment 0"), "%s", why);
    res_release(f.res, f.rm[0]);
    cr_assert_eq(res_seg_state(f.res, f.rm[0], FWD_SEG_EMBED), RES_SEG_ABSENT);
    check_invariants(&f);
    stats_res_t st;
    res_model_stats(f.res, f.rm[0], &st);
    cr_assert_eq(st.total_device_errors, 1);
    /* the next pass pages the segment in again and computes the right logits */
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    run_and_check(&f, 0);
    res_release(f.res, f.rm[0]);
    cr_assert(res_fully_resident(f.res, f.rm[0]));
    check_invariants(&f);
    fx_fini(&f);
}

/* A map that fails for lack of physical memory with nothing idle to evict:
 * device memory exhausted, the budget lowered (never below the largest
 * model), the pool consistent; once the device gives again, it runs. */
Test(residency, a_failed_map_is_device_memory_exhausted_and_leaves_the_pool_consistent)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 1);
    char err[256];
    be_fault_t fault = {BE_FAULT_MAP_SHORT, 1, 0};
    cr_assert_eq(f.sim->inject(f.sim->ctx, &fault), 0);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), RES_ERR_NOMEM);
    cr_assert(strstr(err, "device memory exhausted"), "%s", err);
    check_invariants(&f);
    stats_pool_t ps;
    res_pool_stats(f.res, &ps);
    cr_assert_lt(ps.curr_pool_pages, 100, "the budget is lowered to what the device gave");
    cr_assert_eq(ps.curr_budget_cut_bytes, (100 - ps.curr_pool_pages) * PAGE);
    cr_assert_geq(ps.curr_pool_pages * PAGE, f.sm[0]->image_bytes + 2 * PAGE,
                  "never below the largest model and the KV minimum");
    /* persistent: nothing was freed, so it fails again, and changes nothing */
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), RES_ERR_NOMEM);
    check_invariants(&f);
    fault.kind = BE_FAULT_OFF;
    cr_assert_eq(f.sim->inject(f.sim->ctx, &fault), 0);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    run_and_check(&f, 0);
    res_release(f.res, f.rm[0]);
    check_invariants(&f);
    fx_fini(&f);
}

/* The persistent map failure lasts until something is freed: the page-in
 * that meets it lowers the budget to what is mapped, evicts the idle model
 * and maps again, and the pass runs. */
Test(residency, a_map_failing_for_lack_of_memory_evicts_idle_models_and_retries)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 2);
    char err[256];
    cr_assert_eq(res_acquire(f.res, f.rm[1], err, sizeof err), 0, "%s", err);
    run_and_check(&f, 1);
    res_release(f.res, f.rm[1]);
    size_t held = res_model_bytes(f.rm[1]);
    cr_assert_gt(held, 0);
    be_fault_t fault = {BE_FAULT_MAP_SHORT, 1, 0};
    cr_assert_eq(f.sim->inject(f.sim->ctx, &fault), 0);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    run_and_check(&f, 0);
    res_release(f.res, f.rm[0]);
    check_invariants(&f);
    stats_res_t st1, st0;
    res_model_stats(f.res, f.rm[1], &st1);
    res_model_stats(f.res, f.rm[0], &st0);
    cr_assert_gt(st1.evictions_capacity, 0, "the idle model gave its pages");
    cr_assert_eq(st0.total_device_errors, 0, "a map recovered by evicting is no device error");
    stats_pool_t ps;
    res_pool_stats(f.res, &ps);
    cr_assert_lt(ps.curr_pool_pages, 100);
    cr_assert_gt(ps.curr_budget_cut_bytes, 0);
    /* the other model still runs within the lowered budget */
    cr_assert_eq(res_acquire(f.res, f.rm[1], err, sizeof err), 0, "%s", err);
    run_and_check(&f, 1);
    res_release(f.res, f.rm[1]);
    check_invariants(&f);
    fx_fini(&f);
}

Test(residency, a_copy_slower_than_the_timeout_fails_the_pass_then_lands, .timeout = 60)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 1);
    char err[256];
    const char *why;
    res_set_copy_timeout(f.res, 0.05);
    be_fault_t fault = {BE_FAULT_COPY_SLOW, 1, 400};
    cr_assert_eq(f.sim->inject(f.sim->ctx, &fault), 0);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    cr_assert_neq(try_pass(&f, err, sizeof err), 0);
    cr_assert_eq(res_last_error(f.rm[0], &why), RES_ERR_TIMEOUT);
    cr_assert(strstr(why, "did not complete within"), "%s", why);
    res_release(f.res, f.rm[0]);
    /* still in flight: evicting it waits for the copy to land, never frees pages under it */
    cr_assert_eq(res_seg_state(f.res, f.rm[0], FWD_SEG_EMBED), RES_SEG_INFLIGHT);
    cr_assert_eq(res_evict(f.res, f.rm[0], RES_CAUSE_ADMIN, 0), 0);
    check_invariants(&f);
    res_set_copy_timeout(f.res, 30);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    run_and_check(&f, 0);
    res_release(f.res, f.rm[0]);
    fx_fini(&f);
}

/* The page-in correctness check gpu-check runs on cuda (tu_pagein.c), here
 * on sim: swapped-in and quota-streamed passes equal a resident pass bit for
 * bit. */
Test(residency, swapped_in_and_quota_streamed_passes_equal_a_resident_pass_bit_for_bit,
     .timeout = 60)
{
    backend_t *be = open_be("sim", 64 * PAGE, 0);
    tu_pagein_equal(be);
    be_close(be);
}

/* ------------------------------------------------------------------ background page-ins */

static size_t pages_of_model(const store_model_t *sm)
{
    return (sm->image_bytes + PAGE - 1) / PAGE;
}

/* Three copies of one model in a pool with room for two of them (plus 4
 * pages: a small KV cache). */
static void fx_init_two_of_three(fixture_t *f)
{
    const char *three_alike[3] = {mixed[1], mixed[1], mixed[1]};
    fx_init(f, 200, 0, three_alike, 1); /* the model's size */
    size_t need = pages_of_model(f->sm[0]);
    fx_fini(f);
    fx_init(f, 2 * need + 4, 0, three_alike, 3);
}

Test(residency, a_background_page_in_becomes_runnable_once_its_copies_are_covered, .timeout = 60)
{
    fixture_t f;
    const char *one[1] = {mixed[2]};
    /* a throttled copy engine: the whole model takes about 0.3 s */
    char err[256];
    fx_init(&f, 100, 0, one, 1);
    double bw = (double)f.sm[0]->image_bytes / 0.3;
    fx_fini(&f);
    fx_init(&f, 100, bw, one, 1);
    cr_assert(isinf(res_ready_in(f.res, f.rm[0], 0)), "nothing queued: not runnable");
    size_t window = res_pagein_window(f.res, f.rm[0], 0, 0);
    cr_assert_eq(res_prefetch_ahead(f.res, f.rm[0], RES_EVICT_ANY, window, err, sizeof err), 0,
                 "%s", err);
    cr_assert_gt(res_inflight(f.rm[0]), 0);
    cr_assert_lt((uint32_t)res_inflight(f.rm[0]), f.sm[0]->n_segs, "only a window is queued");
    cr_assert(isinf(res_ready_in(f.res, f.rm[0], 0)),
              "only a window is queued: not runnable yet (%d of %u)", res_inflight(f.rm[0]),
              f.sm[0]->n_segs);
    /* queue the rest as the window drains, never blocking */
    double t0 = util_now_s();
    int polls = 0;
    while (res_ready_in(f.res, f.rm[0], 0) != 0) {
        double t = util_now_s();
        cr_assert_eq(res_prefetch_ahead(f.res, f.rm[0], RES_EVICT_ANY, window, err, sizeof err), 0);
        cr_assert_lt(util_now_s() - t, 0.05, "queueing a window must not wait for copies");
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        polls++;
    }
    double took = util_now_s() - t0;
    cr_assert(res_fully_resident(f.res, f.rm[0]), "no compute measured: runnable once all landed");
    cr_assert_gt(polls, 10);
    cr_assert_gt(took, 0.2, "%.3f s", took);
    /* with a pass as long as the copy the last layers need not have landed */
    cr_assert_eq(res_evict(f.res, f.rm[0], RES_CAUSE_ADMIN, 0), 0);
    cr_assert_eq(res_prefetch(f.res, f.rm[0], RES_EVICT_ANY, err, sizeof err), 0);
    t0 = util_now_s();
    while (res_ready_in(f.res, f.rm[0], 0.5) != 0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_lt(util_now_s() - t0, 0.25, "covered before the whole copy landed (%.3f s)",
                 util_now_s() - t0);
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0);
    run_and_check(&f, 0); /* the pass waits for what is still in flight, logits exact */
    res_release(f.res, f.rm[0]);
    fx_fini(&f);
}

Test(residency, idle_models_nobody_waits_for_are_evicted_first_and_running_ones_last, .timeout = 60)
{
    fixture_t f;
    char err[256];
    fx_init_two_of_three(&f);
    kv_seq_t *kv = NULL;
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_new(f.res, f.rm[0], 8, &kv, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f.res, kv, 8, err, sizeof err), 0, "%s", err);
    res_release(f.res, f.rm[0]); /* m0: a running sequence paused between passes */
    cr_assert(!res_lost_pages(f.rm[0]));
    cr_assert_eq(res_prefetch(f.res, f.rm[1], RES_EVICT_NONE, err, sizeof err), 0, "%s", err);
    while (!res_fully_resident(f.res, f.rm[1]))
        ;
    /* m1 idle with work queued: a prefetch may take only pages nobody waits for */
    res_set_wanted(f.rm[1], 1);
    cr_assert_eq(res_prefetch(f.res, f.rm[2], RES_EVICT_UNWANTED, err, sizeof err), 0, "%s", err);
    stats_res_t s0, s1;
    res_model_stats(f.res, f.rm[1], &s1);
    cr_assert_eq(s1.evictions_capacity, 0, "a model with work queued is not taken by a prefetch");
    /* evicting as a pass does: the idle model goes before the running one */
    cr_assert_eq(res_prefetch(f.res, f.rm[2], RES_EVICT_ANY, err, sizeof err), 0, "%s", err);
    res_model_stats(f.res, f.rm[0], &s0);
    res_model_stats(f.res, f.rm[1], &s1);
    cr_assert_gt(s1.evictions_capacity, 0);
    cr_assert_eq(s0.evictions_preemption, 0, "the running model kept its pages");
    while (!res_fully_resident(f.res, f.rm[2]))
        ;
    res_kv_free(f.res, kv);
    fx_fini(&f);
}

Test(residency, pinning_past_the_pool_is_refused_and_changes_nothing)
{
    fixture_t f;
    char err[256];
    fx_init_two_of_three(&f);
    res_cfg_t c = {.pinned = 1};
    cr_assert_eq(res_set_cfg(f.res, f.rm[0], &c, err, sizeof err), 0, "%s", err);
    /* two pinned leave less than the third needs to run */
    cr_assert_eq(res_set_cfg(f.res, f.rm[1], &c, err, sizeof err), RES_ERR_QUOTA);
    cr_assert(strstr(err, "pool"), "%s", err);
    cr_assert_eq(res_cfg(f.rm[1])->pinned, 0);
    c.pinned = 0;
    cr_assert_eq(res_set_cfg(f.res, f.rm[0], &c, err, sizeof err), 0, "%s", err);
    fx_fini(&f);
}

Test(residency, only_a_pass_takes_pages_of_paused_sequences_and_within_the_stall_budget,
     .timeout = 60)
{
    fixture_t f;
    char err[256];
    fx_init_two_of_three(&f);
    res_cfg_t pin = {.pinned = 1};
    cr_assert_eq(res_set_cfg(f.res, f.rm[1], &pin, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_prefetch(f.res, f.rm[1], RES_EVICT_NONE, err, sizeof err), 0, "%s", err);
    kv_seq_t *kv = NULL;
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_new(f.res, f.rm[0], 8, &kv, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f.res, kv, 8, err, sizeof err), 0, "%s", err);
    res_release(f.res, f.rm[0]); /* m0: a running sequence paused between passes */
    cr_assert(!res_lost_pages(f.rm[0]));
    while (!res_fully_resident(f.res, f.rm[0]) || !res_fully_resident(f.res, f.rm[1]))
        ;
    /* a page-in ahead of m2's pass takes nothing from m0, however generous max_stall */
    res_set_max_stall(f.res, 100);
    cr_assert_eq(res_prefetch(f.res, f.rm[2], RES_EVICT_ANY, err, sizeof err), 0, "%s", err);
    stats_res_t s0;
    res_model_stats(f.res, f.rm[0], &s0);
    cr_assert_eq(s0.evictions_preemption, 0, "a background page-in preempted running sequences");
    cr_assert(!res_fully_resident(f.res, f.rm[2]), "m2 fits only with m0's pages");
    /* a budget smaller than anything queued ahead: m2's pass would stream its own */
    res_set_max_stall(f.res, 1e-9);
    cr_assert_eq(res_acquire(f.res, f.rm[2], err, sizeof err), 0, "%s", err);
    res_release(f.res, f.rm[2]);
    res_model_stats(f.res, f.rm[0], &s0);
    cr_assert_eq(s0.evictions_preemption, 0, "a pass took more than the stall budget");
    /* within the budget the pass takes m0's tail, the last resort */
    res_set_max_stall(f.res, 100);
    cr_assert_eq(res_acquire(f.res, f.rm[2], err, sizeof err), 0, "%s", err);
    run_and_check(&f, 2);
    res_release(f.res, f.rm[2]);
    res_model_stats(f.res, f.rm[0], &s0);
    cr_assert_gt(s0.evictions_preemption, 0);
    cr_assert(res_lost_pages(f.rm[0]), "m0 lost pages to m2: its next pass is due early");
    cr_assert(!res_lost_pages(f.rm[2]), "m2 took pages, it lost none");
    /* m0's next pass takes them back */
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    cr_assert(!res_lost_pages(f.rm[0]), "its pass began: nothing lost since");
    res_release(f.res, f.rm[0]);
    res_kv_free(f.res, kv);
    fx_fini(&f);
}

Test(residency, a_segment_lands_in_the_order_its_copy_was_queued, .timeout = 60)
{
    fixture_t f;
    const char *one[1] = {mixed[2]};
    char err[256];
    fx_init(&f, 100, 0, one, 1);
    double bw = (double)f.sm[0]->image_bytes / 0.3;
    fx_fini(&f);
    fx_init(&f, 100, bw, one, 1);
    uint32_t last = f.sm[0]->n_segs - 1;
    cr_assert(isinf(res_seg_lands_in(f.res, f.rm[0], 0)), "not mapped: never lands");
    cr_assert_eq(res_acquire(f.res, f.rm[0], err, sizeof err), 0, "%s", err);
    /* the bandwidth is measured from the first copy that lands */
    while (res_seg_lands_in(f.res, f.rm[0], 0) > 0)
        ;
    double a = res_seg_lands_in(f.res, f.rm[0], 1), b = res_seg_lands_in(f.res, f.rm[0], last);
    cr_assert(a > 0 && b > a && b < 1.0, "layer 1 lands in %.3f s, the last segment in %.3f s", a,
              b);
    run_and_check(&f, 0);
    cr_assert_eq(res_seg_lands_in(f.res, f.rm[0], last), 0, "landed");
    res_release(f.res, f.rm[0]);
    fx_fini(&f);
}

Test(residency, a_page_in_fits_only_in_free_pages_and_those_of_models_nobody_has_work_for,
     .timeout = 60)
{
    fixture_t f;
    char err[256];
    fx_init_two_of_three(&f);
    cr_assert_eq(res_pagein_fits(f.res, f.rm[2], res_spare_pages(f.res), 0), 1,
                 "an empty pool holds it");
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(res_prefetch(f.res, f.rm[i], RES_EVICT_NONE, err, sizeof err), 0, "%s", err);
        while (!res_fully_resident(f.res, f.rm[i]))
            ;
    }
    cr_assert_eq(res_pagein_fits(f.res, f.rm[2], res_spare_pages(f.res), 0), 1,
                 "m0 and m1 are idle and unwanted");
    res_set_wanted(f.rm[0], 1);
    cr_assert_eq(res_pagein_fits(f.res, f.rm[2], res_spare_pages(f.res), 0), 1,
                 "m1 still gives way");
    cr_assert_eq(res_pagein_fits(f.res, f.rm[2], res_spare_pages(f.res), 5 * (size_t)PAGE), -1,
                 "not beside the KV caches of the work queued");
    res_set_wanted(f.rm[1], 1);
    cr_assert_eq(res_pagein_fits(f.res, f.rm[2], res_spare_pages(f.res), 0), -1,
                 "both have work: it would evict one");
    cr_assert_eq(res_pagein_fits(f.res, f.rm[0], res_spare_pages(f.res), 0), 1,
                 "a resident model has nothing missing");
    fx_fini(&f);
}

/* Forward-pass scratch comes off the pool as it grows: never given back,
 * idle models evicted for its pages, never below what the largest model
 * needs (the rest runs beyond the budget, shown by peak_device_bytes). */
Test(residency, scratch_comes_off_the_pool_as_it_grows_evicting_idle_models)
{
    fixture_t f;
    fx_init(&f, 100, 0, mixed, 2);
    char err[256];
    stats_pool_t ps;
    res_scratch_note(f.res, 3 * PAGE - 1);
    res_pool_stats(f.res, &ps);
    cr_assert_eq(ps.curr_pool_pages, 97, "3 pages off the pool, got %llu",
                 (unsigned long long)ps.curr_pool_pages);
    cr_assert_eq(ps.curr_scratch_reserved_bytes, 3 * PAGE);
    cr_assert_eq(ps.curr_scratch_bytes, 3 * PAGE - 1);
    res_scratch_note(f.res, PAGE);
    res_pool_stats(f.res, &ps);
    cr_assert_eq(ps.curr_pool_pages, 97, "a smaller scratch gives nothing back");
    /* both models resident and idle: a scratch larger than the free pages evicts */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(res_acquire(f.res, f.rm[i], err, sizeof err), 0, "%s", err);
        run_and_check(&f, i);
        res_release(f.res, f.rm[i]);
    }
    res_pool_stats(f.res, &ps);
    size_t used = ps.curr_pool_used;
    cr_assert_eq(used * PAGE, f.sm[0]->image_bytes + f.sm[1]->image_bytes);
    size_t want = 3 + ps.curr_pool_free + 1; /* pages: one more than is free */
    res_scratch_note(f.res, want * PAGE);
    res_pool_stats(f.res, &ps);
    cr_assert_eq(ps.curr_scratch_reserved_bytes, want * PAGE);
    cr_assert_eq(ps.curr_pool_pages, 100 - want);
    cr_assert_lt(ps.curr_pool_used, used, "an idle model gave pages back");
    cr_assert_leq(ps.peak_device_bytes, 100 * PAGE, "within the device budget");
    check_invariants(&f);
    /* more than the whole pool: the pool keeps what the largest model needs, the rest
     * runs beyond the budget */
    res_scratch_note(f.res, 200 * PAGE);
    res_pool_stats(f.res, &ps);
    cr_assert_geq(ps.curr_pool_pages * PAGE, f.sm[0]->image_bytes + 2 * PAGE,
                  "never below the largest model and the KV minimum");
    cr_assert_gt(ps.peak_device_bytes, 100 * PAGE, "the overshoot shows in the peak");
    /* and both still run in what is left */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(res_acquire(f.res, f.rm[i], err, sizeof err), 0, "%s", err);
        run_and_check(&f, i);
        res_release(f.res, f.rm[i]);
    }
    check_invariants(&f);
    fx_fini(&f);
}
