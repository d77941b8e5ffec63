/* Unit tests for the backend registry's helpers on the sim backend: be_event_sync, the host-side wait for a copy that bench_paging's raw baselines and residency use. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/util.h"

#define PAGE (64u << 10)
#define BYTES (4 * PAGE)

typedef struct fixture {
    backend_t *be;
    void *base;         /* reserved and mapped range of BYTES */
    unsigned char *src; /* BYTES of host memory with a pattern */
    be_event_t *ev;
} fixture_t;

static void fx_init(fixture_t *f)
{
    char err[256] = "";
    be_params_t p = {.kind = BE_KIND_SIM, .memory = 8 * PAGE, .page_size = PAGE, .threads = 1};
    f->be = be_open(&p, err, sizeof err);
    cr_assert_not_null(f->be, "%s", err);
    cr_assert_eq(f->be->reserve(f->be->ctx, BYTES, &f->base), 0);
    cr_assert_eq(f->be->map(f->be->ctx, f->base, 0, BYTES), 0);
    f->src = f->be->host_alloc(f->be->ctx, BYTES);
    cr_assert_not_null(f->src);
    for (size_t i = 0; i < BYTES; i++)
        f->src[i] = (unsigned char)(i * 31 + 5);
    cr_assert_eq(f->be->event_new(f->be->ctx, &f->ev), 0);
}

static void fx_fini(fixture_t *f)
{
    f->be->event_free(f->be->ctx, f->ev);
    f->be->host_free(f->be->ctx, f->src, BYTES);
    cr_assert_eq(f->be->unmap(f->be->ctx, f->base, 0, BYTES), 0);
    f->be->release(f->be->ctx, f->base, BYTES);
    be_close(f->be);
}

Test(backend, event_sync_returns_once_the_copy_has_landed_with_valid_times, .timeout = 30)
{
    fixture_t f;
    fx_init(&f);
    cr_assert_eq(f.be->copy_h2d(f.be->ctx, f.base, f.src, BYTES, f.ev), 0);
    cr_assert_eq(be_event_sync(f.be, f.ev, 10.0), 0);
    /* landed: done without waiting, times readable and ordered, data there */
    cr_assert_eq(f.be->event_done(f.be->ctx, f.ev), 1);
    be_copy_times_t t;
    cr_assert_eq(f.be->event_times(f.be->ctx, f.ev, &t), 0);
    cr_assert(t.queued > 0 && t.queued <= t.start && t.start <= t.end, "times %g %g %g", t.queued,
              t.start, t.end);
    cr_assert(isfinite(BYTES / (t.end - t.start)) || t.end == t.start);
    unsigned char back[256];
    cr_assert_eq(f.be->download(f.be->ctx, back, (char *)f.base + BYTES - sizeof back, sizeof back),
                 0);
    cr_assert_eq(memcmp(back, f.src + BYTES - sizeof back, sizeof back), 0);
    fx_fini(&f);
}

Test(backend, event_sync_times_out_on_a_copy_still_in_flight_then_sees_it_land, .timeout = 30)
{
    fixture_t f;
    fx_init(&f);
    be_fault_t slow = {.kind = BE_FAULT_COPY_SLOW, .count = 1, .delay_ms = 400};
    cr_assert_eq(f.be->inject(f.be->ctx, &slow), 0);
    cr_assert_eq(f.be->copy_h2d(f.be->ctx, f.base, f.src, BYTES, f.ev), 0);
    double t0 = util_now_s();
    cr_assert_eq(be_event_sync(f.be, f.ev, 0.05), BE_ERR_TIMEOUT);
    double waited = util_now_s() - t0;
    cr_assert(waited >= 0.05 && waited < 0.35, "waited %.3f s for a 0.05 s timeout", waited);
    cr_assert_eq(f.be->event_done(f.be->ctx, f.ev), 0, "the copy landed before its delay");
    be_copy_times_t t;
    cr_assert_neq(f.be->event_times(f.be->ctx, f.ev, &t), 0, "times of a pending copy");
    cr_assert_eq(be_event_sync(f.be, f.ev, 10.0), 0);
    cr_assert_eq(f.be->event_times(f.be->ctx, f.ev, &t), 0);
    cr_assert_geq(util_now_s() - t0, 0.4);
    fx_fini(&f);
}

Test(backend, event_sync_reports_a_failed_copy_as_a_device_error_not_a_timeout, .timeout = 30)
{
    fixture_t f;
    fx_init(&f);
    be_fault_t fail = {.kind = BE_FAULT_COPY_FAIL, .count = 1};
    cr_assert_eq(f.be->inject(f.be->ctx, &fail), 0);
    cr_assert_eq(f.be->copy_h2d(f.be->ctx, f.base, f.src, BYTES, f.ev), 0);
    cr_assert_eq(be_event_sync(f.be, f.ev, 10.0), BE_ERR_DEVICE);
    be_copy_times_t t;
    cr_assert_neq(f.be->event_times(f.be->ctx, f.ev, &t), 0, "times of a failed copy");
    /* the next copy with the same event is fine again */
    cr_assert_eq(f.be->copy_h2d(f.be->ctx, f.base, f.src, BYTES, f.ev), 0);
    cr_assert_eq(be_event_sync(f.be, f.ev, 10.0), 0);
    fx_fini(&f);
}

Test(backend, event_sync_refuses_a_missing_event)
{
    fixture_t f;
    fx_init(&f);
    cr_assert_eq(be_event_sync(f.be, NULL, 1.0), BE_ERR_ARG);
    cr_assert_eq(be_event_sync(NULL, f.ev, 1.0), BE_ERR_ARG);
    fx_fini(&f);
}

/* cuBLAS location needs no GPU: it runs here as it does at cuda open. */
Test(backend, cublas_is_located_or_the_reason_named_and_none_selects_the_own_kernel)
{
    char what[1536] = "";
    setenv("GPUSWAPD_CUBLAS", "none", 1);
    cr_assert_eq(be_cuda_cublas(what, sizeof what), 0, "%s", what);
    cr_assert(strncmp(what, "none: ", 6) == 0, "%s", what);

    setenv("GPUSWAPD_CUBLAS", "/nonexistent/libcublas.so.13", 1);
    int rc = be_cuda_cublas(what, sizeof what);
#ifdef GPUSWAPD_CUDA
    cr_assert_eq(rc, BE_ERR_ARG, "an unusable GPUSWAPD_CUBLAS file was accepted: %s", what);
    cr_assert(strstr(what, "/nonexistent/libcublas.so.13") != NULL, "%s", what);
#else
    cr_assert_eq(rc, 0);
#endif

    unsetenv("GPUSWAPD_CUBLAS");
    rc = be_cuda_cublas(what, sizeof what);
    cr_assert(rc == 0 || rc == 1, "rc %d: %s", rc, what);
    if (rc == 1)
        cr_assert(strstr(what, "libcublas.so.") != NULL && strncmp(what, "cuBLAS ", 7) == 0, "%s",
                  what);
    else
        cr_assert(strncmp(what, "none: ", 6) == 0 && strlen(what) > 6, "%s", what);
    cr_log_info("cuBLAS here: %s", what);
}

/* ------------------------------------------------------------------ ops tables */

Test(backend, every_backend_opens_with_a_complete_static_ops_table)
{
    static const be_kind_t kinds[] = {BE_KIND_CPU, BE_KIND_SIM};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        char err[256] = "";
        be_params_t p = {.kind = kinds[i], .memory = 8 * PAGE, .page_size = PAGE, .threads = 1};
        backend_t *be = be_open(&p, err, sizeof err);
        cr_assert_not_null(be, "%s: %s", be_kind_name(kinds[i]), err);
        cr_assert_not_null(be->ops);
        cr_assert_str_eq(be->name, be_kind_name(kinds[i]));
        /* the slots callers use are the table's, the optional ones filled in */
        cr_assert_eq(be->matmul, be->ops->matmul);
        cr_assert_eq(be->reserve, be->ops->reserve);
        cr_assert_not_null(be->inject);
        cr_assert_not_null(be->download);
        be_close(be);
    }
}

Test(backend, a_table_missing_a_required_slot_is_rejected_naming_it)
{
    char err[256] = "";
    be_params_t p = {.kind = BE_KIND_SIM, .memory = 8 * PAGE, .page_size = PAGE, .threads = 1};
    backend_t *sim = be_open(&p, err, sizeof err);
    cr_assert_not_null(sim, "%s", err);
    be_ops_t ops = *sim->ops;
    ops.attention = NULL;
    backend_t fake = {.name = "fake", .ctx = sim->ctx};
    cr_assert_eq(be_ops_install(&fake, &ops, err, sizeof err), BE_ERR_ARG);
    cr_assert(strstr(err, "fake") && strstr(err, "'attention'"), "%s", err);
    ops = *sim->ops;
    ops.close = NULL;
    cr_assert_eq(be_ops_install(&fake, &ops, err, sizeof err), BE_ERR_ARG);
    cr_assert(strstr(err, "'close'"), "%s", err);
    cr_assert_eq(be_ops_install(&fake, NULL, err, sizeof err), BE_ERR_ARG);
    /* optional slots may be missing: the dispatcher's fallbacks fill them */
    ops = *sim->ops;
    ops.inject = NULL;
    ops.event_times = NULL;
    ops.host_alloc = NULL;
    memset(&fake, 0, sizeof fake);
    fake.name = "fake";
    cr_assert_eq(be_ops_install(&fake, &ops, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(fake.inject);
    cr_assert_not_null(fake.event_times);
    cr_assert_not_null(fake.host_alloc);
    cr_assert_eq(fake.ops, &ops);
    cr_assert_eq(fake.map, sim->map);
    be_close(sim);
}

Test(backend, an_unknown_kind_is_refused_and_names_round_trip)
{
    char err[256] = "";
    be_params_t p = {.kind = BE_KIND_COUNT};
    cr_assert_null(be_open(&p, err, sizeof err));
    cr_assert(strstr(err, "unknown backend kind"), "%s", err);
    for (int k = 0; k < BE_KIND_COUNT; k++) {
        be_kind_t back;
        cr_assert_eq(be_kind_from_name(be_kind_name((be_kind_t)k), &back), 0);
        cr_assert_eq(back, (be_kind_t)k);
    }
    be_kind_t x;
    cr_assert_eq(be_kind_from_name("gpu", &x), BE_ERR_ARG);
    cr_assert_null(be_kind_name(BE_KIND_COUNT));
}
