/* test_store: the host model store: its throttled load (store_set_load_rate, pace and progress reports) and its host layout (small models packed, large ones as on the device). */
#include <criterion/criterion.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/util.h"
#include "engine/forward.h"
#include "worker/store.h"
#include "testutil.h"

typedef struct calls {
    int n;
    size_t last_done, total;
    int monotonic;
} calls_t;

static void on_progress(void *ctx, const char *name, size_t done, size_t total)
{
    calls_t *c = ctx;
    cr_assert_str_eq(name, "m");
    if (done < c->last_done)
        c->monotonic = 0;
    c->last_done = done;
    c->total = total;
    c->n++;
}

Test(store, a_throttled_load_takes_its_bytes_over_the_rate_and_reports_each_chunk, .timeout = 60)
{
    char path[256], err[512] = "";
    tu_mkmodel(path, sizeof path,
               "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300");
    be_params_t p = {
        .kind = BE_KIND_SIM, .memory = 64u << 20, .page_size = 64u << 10, .threads = 1};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);

    /* unthrottled: a model this small loads without progress reports */
    store_t *st = store_new(be, 0);
    calls_t c = {.monotonic = 1};
    store_set_progress(st, on_progress, &c);
    store_model_t *m;
    cr_assert_eq(store_load(st, "m", path, &m, err, sizeof err), STORE_OK, "%s", err);
    cr_assert_eq(c.n, 0);
    size_t bytes = m->host_bytes;
    store_unload(st, m);

    /* throttled to a third of its image per second: the weights (the image less
     * its page padding) take copied / rate seconds, between 1 and 3 */
    double rate = (double)bytes / 3;
    store_set_load_rate(st, rate);
    double t0 = util_now_s();
    cr_assert_eq(store_load(st, "m", path, &m, err, sizeof err), STORE_OK, "%s", err);
    double took = util_now_s() - t0;
    double want = (double)c.last_done / rate;
    cr_assert_geq(want, 0.5, "%zu bytes copied", c.last_done);
    cr_assert_geq(took, 0.95 * want, "took %.2f s, want %.2f", took, want);
    cr_assert_lt(took, 30.0, "took %.2f s", took);
    cr_assert_gt(c.n, 3, "%d reports", c.n);
    cr_assert(c.monotonic);
    cr_assert_eq(c.total, m->host_bytes);
    cr_assert_leq(c.last_done, m->host_bytes);
    cr_log_info("throttled load of %zu bytes at %.0f B/s: %.2f s (%.2f s wanted), %d reports",
                c.last_done, rate, took, want, c.n);
    store_unload(st, m);
    store_free(st);
    be_close(be);
    unlink(path);
}

/* A store on the sim backend with page pages; the backend is closed with it. */
static store_t *open_store(size_t page, backend_t **be)
{
    char err[256];
    be_params_t p = {.kind = BE_KIND_SIM, .memory = 64 * page, .page_size = page, .threads = 1};
    *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(*be, "%s", err);
    return store_new(*be, 0);
}

/* Each weight view's offset from its segment's start, in the host image and
 * in a device range at base (store_weights_at both ways), must agree. */
static void check_same_offsets(const store_model_t *m)
{
    const model_hparams_t *hp = &m->model->hp;
    model_layer_t *hl = calloc(hp->n_layer, sizeof *hl), *dl = calloc(hp->n_layer, sizeof *dl);
    model_weights_t hw, dw;
    const uint8_t *base = (const uint8_t *)(uintptr_t)(1ull << 40);
    cr_assert_eq(store_weights_at(m, m->image, STORE_AT_HOST, &hw, hl), STORE_OK);
    cr_assert_eq(store_weights_at(m, base, STORE_AT_DEVICE, &dw, dl), STORE_OK);
    const uint8_t *h[] = {hw.tok_embd.data, hl[0].wq.data, hl[hp->n_layer - 1].w_down.data,
                          hw.output_norm.data};
    const uint8_t *d[] = {dw.tok_embd.data, dl[0].wq.data, dl[hp->n_layer - 1].w_down.data,
                          dw.output_norm.data};
    const uint32_t seg[] = {FWD_SEG_EMBED, FWD_SEG_LAYER(0), FWD_SEG_LAYER(hp->n_layer - 1),
                            FWD_SEG_HEAD(hp->n_layer)};
    for (int i = 0; i < 4; i++) {
        const store_seg_t *s = &m->segs[seg[i]];
        cr_assert_eq((size_t)(h[i] - m->image) - s->host_off, (size_t)(d[i] - base) - s->off,
                     "view %d sits at another offset in its segment on the host", i);
        cr_assert_leq((size_t)(h[i] - m->image) - s->host_off, s->bytes);
    }
    cr_assert_eq(
        memcmp(hl[0].wq.data, m->model->w.layers[0].wq.data, m->model->w.layers[0].wq.nbytes), 0,
        "the host image holds the file's weights");
    free(hl);
    free(dl);
}

Test(store, a_small_model_takes_its_weights_in_host_ram_not_whole_device_pages)
{
    char path[256], err[512] = "";
    tu_data_path(path, sizeof path, "stories260K.gguf");
    backend_t *be;
    store_t *st = open_store(2u << 20, &be);
    store_model_t *m;
    cr_assert_eq(store_load(st, "m", path, &m, err, sizeof err), STORE_OK, "%s", err);
    size_t tensors = 0;
    for (uint32_t s = 0; s < m->n_segs; s++) {
        const store_seg_t *sg = &m->segs[s];
        tensors += sg->bytes;
        cr_assert_eq(sg->off % (2u << 20), 0, "segment %u: the device layout stays page-aligned",
                     s);
        cr_assert_eq(sg->span, (sg->bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20));
        cr_assert_leq(sg->bytes, sg->host_span);
        cr_assert_leq(sg->host_span, sg->span);
        cr_assert_eq(sg->host_off % 4096, 0);
    }
    /* 1.2 MB of weights in 7 segments: 14 MiB when each took whole 2 MiB pages */
    cr_log_info("stories260K: %zu tensor bytes, host %zu (align %zu), device %zu", tensors,
                m->host_bytes, m->host_align, m->image_bytes);
    cr_assert_eq(m->image_bytes, (size_t)m->n_segs * (2u << 20));
    cr_assert_leq(m->host_bytes, tensors + m->n_segs * 4096, "host %zu for %zu bytes of weights",
                  m->host_bytes, tensors);
    cr_assert_eq(store_used(st), m->host_bytes);
    check_same_offsets(m);
    store_unload(st, m);
    cr_assert_eq(store_used(st), 0);
    store_free(st);
    be_close(be);
}

Test(store, a_large_model_keeps_the_device_layout_in_host_ram)
{
    char path[256], err[512] = "";
    /* layers of about 1.6 MiB against 64 KiB pages: page padding is under 1/64 of them */
    tu_mkmodel(path, sizeof path,
               "--type f16 --dim 512 --layers 4 --heads 8 --kv-heads 8 --ff 1024 --vocab 512");
    backend_t *be;
    store_t *st = open_store(64u << 10, &be);
    store_model_t *m;
    cr_assert_eq(store_load(st, "m", path, &m, err, sizeof err), STORE_OK, "%s", err);
    cr_assert_eq(m->host_align, 64u << 10);
    cr_assert_eq(m->host_bytes, m->image_bytes);
    for (uint32_t s = 0; s < m->n_segs; s++) {
        cr_assert_eq(m->segs[s].host_off, m->segs[s].off);
        cr_assert_eq(m->segs[s].host_span, m->segs[s].span, "segment %u: copied whole", s);
    }
    check_same_offsets(m);
    store_unload(st, m);
    store_free(st);
    be_close(be);
    unlink(path);
}
