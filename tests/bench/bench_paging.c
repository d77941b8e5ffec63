/* bench_paging: page-in throughput (map vs copy, against plain memcpy) and time to first token for a resident, swapped-out and cold model on the sim backend. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "forward.h"
#include "residency.h"
#include "store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *err)
{
    fprintf(stderr, "bench_paging: %s: %s\n", what, err);
    exit(1);
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
    double t0 = now_s();
    if (res_acquire(res, rm, err, sizeof err))
        die("acquire", err);
    kv_seq_t *kv;
    if (res_kv_new(res, rm, 64, &kv, err, sizeof err) || res_kv_ensure(res, kv, 8, err, sizeof err))
        die("kv", err);
    fwd_hooks_t h = res_hooks(rm);
    fwd_seq_t s = {kv, prompt, 8, logits};
    if (fwd_run(fw, &m->hp, res_weights(rm), &s, 1, &h, err, sizeof err))
        die("forward", err);
    double t = now_s() - t0;
    res_kv_free(res, kv);
    res_release(res, rm);
    return t;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL POOL_MIB [PAGE_KIB] [THREADS] [BACKEND]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    size_t pool = (size_t)atol(argv[2]) << 20;
    size_t page = argc > 3 ? (size_t)atol(argv[3]) << 10 : 2u << 20;
    int threads = argc > 4 ? atoi(argv[4]) : 0;
    const char *kind = argc > 5 ? argv[5] : "sim";
    char err[512];
    be_params_t bp = {.kind = kind, .memory = pool, .page_size = page, .threads = threads};
    backend_t *be = be_open(&bp, err, sizeof err);
    if (!be)
        die("backend", err);
    store_t *st = store_new(be, 0);
    res_t *res = res_new(be, err, sizeof err);
    fwd_t *fw = fwd_new(be);
    if (!st || !res || !fw)
        die("setup", err);

    drop_cache(path);
    double tc0 = now_s();
    store_model_t *sm;
    if (store_load(st, "bench", path, &sm, err, sizeof err))
        die("load", err);
    double load_s = now_s() - tc0;
    res_model_t *rm;
    res_cfg_t cfg = {0};
    if (res_add(res, sm, &cfg, &rm, err, sizeof err))
        die("add", err);
    float *logits = malloc(sm->model->hp.n_vocab * sizeof(float));

    /* cold: from disk through the store, page-in, first token */
    double cold = load_s + first_token(res, rm, fw, logits);

    /* page-in throughput: evict all, then page in with no compute */
    double best_copy = 1e30, best_map = 1e30, best_memcpy = 1e30, best_queue = 1e30;
    double best_wall = 1e30; /* first copy queued to last copy landed */
    for (int rep = 0; rep < 3; rep++) {
        if (res_evict(res, rm, RES_CAUSE_ADMIN, 0))
            die("evict", "busy");
        stats_res_t a, b;
        res_model_stats(res, rm, &a);
        if (res_prefetch(res, rm, 0, err, sizeof err))
            die("prefetch", err);
        while (!res_fully_resident(res, rm))
            usleep(100);
        res_model_stats(res, rm, &b);
        double map_s = (b.total_map_ns - a.total_map_ns) / 1e9;
        be_copy_times_t t0, t1;
        res_seg_times(res, rm, 0, &t0);
        res_seg_times(res, rm, sm->n_segs - 1, &t1);
        double copy_s = (b.total_copy_ns - a.total_copy_ns) / 1e9;
        if (t1.end - t0.queued < best_wall) best_wall = t1.end - t0.queued;
        if (copy_s < best_copy) best_copy = copy_s;
        if (map_s < best_map) best_map = map_s;
        /* plain memcpy of the same bytes into the already-mapped range */
        /* (host-addressable device memory only: on cuda the baseline is the
         * copy queue below, a plain pinned cudaMemcpyAsync of the same bytes) */
        int host_addressable = strcmp(be->name, "sim") == 0;
        if (host_addressable) {
            double m0 = now_s();
            memcpy(res_model_base(rm), sm->image, sm->image_bytes);
            double mc = now_s() - m0;
            if (mc < best_memcpy) best_memcpy = mc;
        }
        /* the copy queue alone, same bytes, already mapped (no mapping beside it) */
        be_event_t *ev;
        be->event_new(be->ctx, &ev);
        be->copy_h2d(be->ctx, res_model_base(rm), sm->image, sm->image_bytes, ev);
        be->wait(be->ctx, ev);
        be_copy_times_t qt;
        be->event_times(be->ctx, ev, &qt);
        be->event_free(be->ctx, ev);
        if (qt.end - qt.start < best_queue) best_queue = qt.end - qt.start;
        if (!host_addressable)
            best_memcpy = best_queue;
    }
    double gb = sm->image_bytes / 1e9;
    /* resident */
    double resident = 1e30;
    for (int i = 0; i < 3; i++) {
        double t = first_token(res, rm, fw, logits);
        if (t < resident)
            resident = t;
    }
    /* swapped out to host RAM */
    double swapped = 1e30;
    for (int i = 0; i < 3; i++) {
        res_evict(res, rm, RES_CAUSE_ADMIN, 0);
        double t = first_token(res, rm, fw, logits);
        if (t < swapped)
            swapped = t;
    }
    printf("model,bytes,page_kib,map_s,map_gb_s,copy_s,copy_gb_s,memcpy_gb_s,copy_vs_memcpy,"
           "queue_gb_s,queue_vs_memcpy,pagein_wall_s,pagein_gb_s,ttft_resident_ms,ttft_swapped_ms,ttft_cold_ms\n");
    printf("%s,%zu,%zu,%.4f,%.2f,%.4f,%.2f,%.2f,%.3f,%.2f,%.3f,%.4f,%.2f,%.1f,%.1f,%.1f\n", path,
           sm->image_bytes, page >> 10, best_map, gb / best_map, best_copy, gb / best_copy,
           gb / best_memcpy, best_memcpy / best_copy, gb / best_queue, best_memcpy / best_queue,
           best_wall, gb / best_wall, resident * 1e3, swapped * 1e3, cold * 1e3);
    free(logits);
    res_remove(res, rm);
    store_unload(st, sm);
    fwd_free(fw);
    res_free(res);
    store_free(st);
    be_close(be);
    return 0;
}
