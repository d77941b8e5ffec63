/* bench_paging: page-in throughput (map vs copy, against raw copies into a mapped range and a plain buffer), time to first token resident / swapped / cold, and batch-1 decode speed, on any backend. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "residency.h"
#include "store.h"
#include "base/util.h"

/* How long one raw copy of the whole image may take before the run fails
 * (a 16 GB image at 1 GB/s, with margin). */
#define RAW_COPY_TIMEOUT_S 60.0
#define DECODE_CTX 128 /* positions in the cache when decode starts */

static void die(const char *what, const char *err)
{
    fprintf(stderr, "bench_paging: %s: %s\n", what, err);
    exit(1);
}

static void die_rc(const char *what, int rc)
{
    char m[64];
    snprintf(m, sizeof m, "backend error %d%s", rc, rc == BE_ERR_TIMEOUT ? " (timeout)" : "");
    die(what, m);
}

/* Drop the file from the page cache so the next load reads the disk. */
static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* acquire + a short prefill to the first logits; returns seconds. */
static double first_token(res_t *res, res_model_t *rm, fwd_t *fw, float *logits)
{
    static const int32_t prompt[8] = {1, 100, 200, 300, 400, 500, 600, 700};
    char err[256];
    const model_t *m = res_store_model(rm)->model;
    double t0 = util_now_s();
    if (res_acquire(res, rm, err, sizeof err))
        die("acquire", err);
    kv_seq_t *kv;
    if (res_kv_new(res, rm, 64, &kv, err, sizeof err) || res_kv_ensure(res, kv, 8, err, sizeof err))
        die("kv", err);
    fwd_hooks_t h = res_hooks(rm);
    fwd_seq_t s = {kv, prompt, 8, logits};
    if (fwd_run(fw, &m->hp, res_weights(rm), &s, 1, &h, err, sizeof err))
        die("forward", err);
    double t = util_now_s() - t0;
    res_kv_free(res, kv);
    res_release(res, rm);
    return t;
}

/* One raw copy of bytes from src to dst on the copy queue, waited for on the
 * host (be_event_sync: on cuda be->wait only orders the compute stream);
 * returns the copy's own duration in seconds (event times). */
static double raw_copy(backend_t *be, void *dst, const void *src, size_t bytes)
{
    be_event_t *ev;
    int rc = be->event_new(be->ctx, &ev);
    if (rc)
        die_rc("event_new", rc);
    if ((rc = be->copy_h2d(be->ctx, dst, src, bytes, ev)))
        die_rc("raw copy_h2d", rc);
    if ((rc = be_event_sync(be, ev, RAW_COPY_TIMEOUT_S)))
        die_rc("raw copy wait", rc);
    be_copy_times_t t;
    if ((rc = be->event_times(be->ctx, ev, &t)))
        die_rc("raw copy event_times", rc);
    be->event_free(be->ctx, ev);
    double s = t.end - t.start;
    if (!(s > 0) || !isfinite(s))
        die("raw copy", "no positive duration from the event times");
    return s;
}

/* Batch-1 decode of n tokens after a DECODE_CTX-token prefill, model
 * resident; returns tokens/s of the decode steps. */
static double decode_speed(res_t *res, res_model_t *rm, fwd_t *fw, float *logits, int n)
{
    const model_t *m = res_store_model(rm)->model;
    char err[256];
    int32_t prompt[DECODE_CTX];
    for (int i = 0; i < DECODE_CTX; i++)
        prompt[i] = (int32_t)(1 + (i * 7919) % (m->hp.n_vocab - 1));
    if (res_acquire(res, rm, err, sizeof err))
        die("acquire", err);
    kv_seq_t *kv;
    uint32_t n_ctx = DECODE_CTX + (uint32_t)n;
    if (res_kv_new(res, rm, n_ctx, &kv, err, sizeof err) ||
        res_kv_ensure(res, kv, n_ctx, err, sizeof err))
        die("kv", err);
    fwd_hooks_t h = res_hooks(rm);
    fwd_seq_t s = {kv, prompt, DECODE_CTX, logits};
    if (fwd_run(fw, &m->hp, res_weights(rm), &s, 1, &h, err, sizeof err))
        die("prefill", err);
    double t0 = util_now_s();
    for (int i = 0; i < n; i++) {
        int32_t tok = (int32_t)(1 + (i * 104729) % (m->hp.n_vocab - 1));
        fwd_seq_t d = {kv, &tok, 1, logits};
        if (fwd_run(fw, &m->hp, res_weights(rm), &d, 1, &h, err, sizeof err))
            die("decode", err);
    }
    double t = util_now_s() - t0;
    res_kv_free(res, kv);
    res_release(res, rm);
    return n / t;
}

/* Bytes a decode step reads: every weight but the embedding table (one row
 * of it), plus the KV cache at DECODE_CTX positions. */
static double decode_bytes(const store_model_t *sm)
{
    const model_hparams_t *hp = &sm->model->hp;
    double kv = 2.0 * DECODE_CTX * hp->n_layer * (double)hp->n_head_kv * hp->head_dim * sizeof(float);
    return (double)(sm->image_bytes - sm->segs[0].span) + (double)sm->segs[0].bytes / hp->n_vocab +
           kv;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s MODEL POOL_MIB [PAGE_KIB] [THREADS] [BACKEND] [--no-cold] [--decode N]\n"
            "          [--decode-only]\n"
            "  --no-cold      skip the cold (from disk) time to first token: the page cache is kept\n"
            "  --decode N     also time N batch-1 decode steps after a %d-token prefill\n"
            "  --decode-only  only that (no paging or TTFT runs); prints\n"
            "                 model,bytes,decode_tok_s,decode_bytes_per_tok,decode_gb_s\n",
            argv0, DECODE_CTX);
}

int main(int argc, char **argv)
{
    const char *pos[5] = {NULL};
    int n_pos = 0, cold_on = 1, n_decode = 0, decode_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-cold")) {
            cold_on = 0;
        } else if (!strcmp(argv[i], "--decode-only")) {
            decode_only = 1;
        } else if (!strcmp(argv[i], "--decode") && i + 1 < argc) {
            n_decode = atoi(argv[++i]);
            if (n_decode < 1 || n_decode > 4096) {
                usage(argv[0]);
                return 2;
            }
        } else if (argv[i][0] == '-' || n_pos == 5) {
            usage(argv[0]);
            return 2;
        } else {
            pos[n_pos++] = argv[i];
        }
    }
    if (n_pos < 2 || (decode_only && !n_decode)) {
        usage(argv[0]);
        return 2;
    }
    if (decode_only)
        cold_on = 0;
    const char *path = pos[0];
    size_t pool = (size_t)atol(pos[1]) << 20;
    size_t page = n_pos > 2 ? (size_t)atol(pos[2]) << 10 : 2u << 20;
    int threads = n_pos > 3 ? atoi(pos[3]) : 0;
    const char *kind = n_pos > 4 ? pos[4] : "sim";
    char err[512];
    be_kind_t k;
    if (be_kind_from_name(kind, &k))
        die("backend", "unknown backend kind (auto, cpu, sim, cuda)");
    be_params_t bp = {.kind = k, .memory = pool, .page_size = page, .threads = threads};
    backend_t *be = be_open(&bp, err, sizeof err);
    if (!be)
        die("backend", err);
    fprintf(stderr, "bench_paging: %s backend: %s\n", be->name, be->desc ? be->desc : "(no description)");
    store_t *st = store_new(be, 0);
    res_t *res = res_new(be, err, sizeof err);
    fwd_t *fw = fwd_new(be);
    if (!st || !res || !fw)
        die("setup", err);

    if (cold_on)
        drop_cache(path);
    double tc0 = util_now_s();
    store_model_t *sm;
    if (store_load(st, "bench", path, &sm, err, sizeof err))
        die("load", err);
    double load_s = util_now_s() - tc0;
    res_model_t *rm;
    res_cfg_t cfg = {0};
    if (res_add(res, sm, &cfg, &rm, err, sizeof err))
        die("add", err);
    float *logits = malloc(sm->model->hp.n_vocab * sizeof(float));
    if (!logits)
        die("setup", "out of memory");

    if (decode_only) {
        decode_speed(res, rm, fw, logits, 4); /* pages the model in, warms up */
        double dec = decode_speed(res, rm, fw, logits, n_decode);
        double tb = decode_bytes(sm);
        printf("model,bytes,decode_tok_s,decode_bytes_per_tok,decode_gb_s\n");
        printf("%s,%zu,%.1f,%.0f,%.1f\n", path, sm->image_bytes, dec, tb, dec * tb / 1e9);
        goto out;
    }

    /* cold: from disk through the store, page-in, first token */
    double cold = load_s + first_token(res, rm, fw, logits);
    if (!cold_on)
        cold = NAN;

    /* A plain device buffer (cudaMalloc on cuda) for the second raw baseline. */
    void *plain = be->buf_alloc(be->ctx, sm->image_bytes);
    if (!plain)
        die("buf_alloc", "no plain device buffer the size of the image");

    /* page-in throughput: evict all, then page in with no compute */
    double best_copy = 1e30, best_map = 1e30, best_memcpy = 1e30, best_mapped = 1e30;
    double best_plain = 1e30;
    double best_wall = 1e30; /* first copy queued to last copy landed */
    int host_addressable = strcmp(be->name, "sim") == 0;
    for (int rep = 0; rep < 3; rep++) {
        if (res_evict(res, rm, RES_CAUSE_ADMIN, 0))
            die("evict", "busy");
        stats_res_t a, b;
        res_model_stats(res, rm, &a);
        if (res_prefetch(res, rm, 0, err, sizeof err))
            die("prefetch", err);
        double deadline = util_now_s() + RAW_COPY_TIMEOUT_S;
        while (!res_fully_resident(res, rm)) {
            if (util_now_s() > deadline)
                die("page-in", "not fully resident within the timeout");
            usleep(100);
        }
        res_model_stats(res, rm, &b);
        if (b.total_device_errors != a.total_device_errors)
            die("page-in", "device errors during the page-in");
        double map_s = (b.total_map_ns - a.total_map_ns) / 1e9;
        be_copy_times_t t0, t1;
        if (res_seg_times(res, rm, 0, &t0) || res_seg_times(res, rm, sm->n_segs - 1, &t1))
            die("page-in", "no copy times for the first or last segment");
        double copy_s = (b.total_copy_ns - a.total_copy_ns) / 1e9;
        if (t1.end - t0.queued < best_wall) best_wall = t1.end - t0.queued;
        if (copy_s < best_copy) best_copy = copy_s;
        if (map_s < best_map) best_map = map_s;
        /* plain memcpy of the same bytes into the mapped range (host-addressable
         * device memory only; elsewhere the column repeats the mapped raw copy) */
        if (host_addressable) {
            double m0 = util_now_s();
            memcpy(res_model_base(rm), sm->image, sm->image_bytes);
            double mc = util_now_s() - m0;
            if (mc < best_memcpy) best_memcpy = mc;
        }
        /* raw copies of the same bytes, no mapping beside them: into the
         * model's mapped range (VMM on cuda), and into a plain buffer */
        double q = raw_copy(be, res_model_base(rm), sm->image, sm->image_bytes);
        if (q < best_mapped) best_mapped = q;
        q = raw_copy(be, plain, sm->image, sm->image_bytes);
        if (q < best_plain) best_plain = q;
    }
    if (!host_addressable)
        best_memcpy = best_mapped;
    be->buf_free(be->ctx, plain);
    double gb = sm->image_bytes / 1e9;
    /* resident */
    double resident = 1e30;
    for (int i = 0; i < 3; i++) {
        double t = first_token(res, rm, fw, logits);
        if (t < resident)
            resident = t;
    }
    /* decode at batch 1, resident */
    double dec = NAN;
    if (n_decode)
        dec = decode_speed(res, rm, fw, logits, n_decode);
    /* swapped out to host RAM */
    double swapped = 1e30;
    for (int i = 0; i < 3; i++) {
        if (res_evict(res, rm, RES_CAUSE_ADMIN, 0))
            die("evict", "busy");
        double t = first_token(res, rm, fw, logits);
        if (t < swapped)
            swapped = t;
    }
    double tok_bytes = decode_bytes(sm);
    printf("model,bytes,page_kib,map_s,map_gb_s,copy_s,copy_gb_s,memcpy_gb_s,copy_vs_memcpy,"
           "queue_gb_s,queue_vs_memcpy,pagein_wall_s,pagein_gb_s,ttft_resident_ms,ttft_swapped_ms,ttft_cold_ms,"
           "raw_plain_gb_s,pagein_vs_raw_mapped,pagein_vs_raw_plain,decode_tok_s,decode_bytes_per_tok\n");
    printf("%s,%zu,%zu,%.4f,%.2f,%.4f,%.2f,%.2f,%.3f,%.2f,%.3f,%.4f,%.2f,%.1f,%.1f,%.1f,%.2f,%.3f,%.3f,"
           "%.1f,%.0f\n",
           path, sm->image_bytes, page >> 10, best_map, gb / best_map, best_copy, gb / best_copy,
           gb / best_memcpy, best_memcpy / best_copy, gb / best_mapped, best_memcpy / best_mapped,
           best_wall, gb / best_wall, resident * 1e3, swapped * 1e3, cold * 1e3, gb / best_plain,
           best_mapped / best_wall, best_plain / best_wall, dec, tok_bytes);
out:
    free(logits);
    res_remove(res, rm);
    store_unload(st, sm);
    fwd_free(fw);
    res_free(res);
    store_free(st);
    be_close(be);
    return 0;
}
