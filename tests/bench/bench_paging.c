/* bench_paging: page-in throughput (map vs copy, against raw copies into a mapped range and a plain buffer), time to first token resident / swapped / cold, decode speed by batch and context, and prefill speed, on any backend. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "worker/residency.h"
#include "worker/store.h"
#include "base/util.h"

/* How long one raw copy of the whole image may take before the run fails
 * (a 16 GB image at 1 GB/s, with margin). */
#define RAW_COPY_TIMEOUT_S 60.0
#define DECODE_CTX 128         /* positions in the cache when decode starts (default of --ctx) */
#define ZERO_CHUNK (64u << 20) /* bytes of zeros uploaded at a time to fill KV caches */
/* The serving sweep (--serving): decode at a long context for two batch
 * sizes, prefill of two prompt lengths. */
#define SWEEP_CTX 4096
#define SWEEP_B1 8
#define SWEEP_B2 32
#define SWEEP_P1 512
#define SWEEP_P2 2048

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
    fwd_seq_t s = {kv, prompt, 8, logits, NULL};
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

/* Raw copies of every segment from the host image to its place in the
 * device range at base, all queued at once: seconds from the first copy's
 * start to the last one's end. */
static double raw_copy_segs(backend_t *be, void *base, const store_model_t *sm)
{
    be_event_t *first = NULL, *last = NULL;
    int rc;
    for (uint32_t s = 0; s < sm->n_segs; s++) {
        be_event_t **ev = s == 0 ? &first : &last;
        if (s > 1)
            be->event_free(be->ctx, last);
        if ((rc = be->event_new(be->ctx, ev)))
            die_rc("event_new", rc);
        const store_seg_t *sg = &sm->segs[s];
        if ((rc = be->copy_h2d(be->ctx, (char *)base + sg->off, sm->image + sg->host_off,
                               sg->host_span, *ev)))
            die_rc("raw copy_h2d", rc);
    }
    be_event_t *end = last ? last : first;
    if ((rc = be_event_sync(be, end, RAW_COPY_TIMEOUT_S)))
        die_rc("raw copy wait", rc);
    be_copy_times_t t0, t1;
    if ((rc = be->event_times(be->ctx, first, &t0)) || (rc = be->event_times(be->ctx, end, &t1)))
        die_rc("raw copy event_times", rc);
    be->event_free(be->ctx, first);
    if (last)
        be->event_free(be->ctx, last);
    double s = t1.end - t0.start;
    if (!(s > 0) || !isfinite(s))
        die("raw copy", "no positive duration from the event times");
    return s;
}

/* Fills a KV cache's first n_pos positions with zeros through the
 * backend's upload (decode at a long context without prefilling it: the
 * values do not change the work an attention pass does). */
static void kv_fill_zero(backend_t *be, kv_seq_t *kv, uint32_t n_pos, const void *zeros)
{
    size_t bytes = (size_t)n_pos * kv->n_layer * kv->kv_dim * kv_type_size(kv->type);
    void *halves[2] = {kv->k, kv->v};
    for (int h = 0; h < 2; h++)
        for (size_t off = 0; off < bytes; off += ZERO_CHUNK) {
            size_t len = bytes - off < ZERO_CHUNK ? bytes - off : ZERO_CHUNK;
            int rc = be->upload(be->ctx, (char *)halves[h] + off, zeros, len);
            if (rc)
                die_rc("kv fill", rc);
        }
    kv->n_past = n_pos;
}

/* Decode of n steps for batch sequences, each with ctx positions already in
 * its cache (the first sequence prefilled for real when ctx <= DECODE_CTX,
 * else every cache zero-filled), model resident; returns tokens/s (batch
 * tokens per step). */
static double decode_speed(backend_t *be, res_t *res, res_model_t *rm, fwd_t *fw, float *logits,
                           int n, uint32_t ctx, int batch)
{
    const model_t *m = res_store_model(rm)->model;
    char err[256];
    if (res_acquire(res, rm, err, sizeof err))
        die("acquire", err);
    kv_seq_t *kv[256];
    fwd_seq_t d[256];
    int32_t tok[256];
    uint32_t n_ctx = ctx + (uint32_t)n;
    void *zeros = ctx > DECODE_CTX ? calloc(1, ZERO_CHUNK) : NULL;
    fwd_hooks_t h = res_hooks(rm);
    for (int b = 0; b < batch; b++) {
        if (res_kv_new(res, rm, n_ctx, &kv[b], err, sizeof err) ||
            res_kv_ensure(res, kv[b], n_ctx, err, sizeof err))
            die("kv", err);
        if (zeros) {
            kv_fill_zero(be, kv[b], ctx, zeros);
            continue;
        }
        int32_t prompt[DECODE_CTX];
        for (uint32_t i = 0; i < ctx; i++)
            prompt[i] = (int32_t)(1 + (i * 7919 + (uint32_t)b) % (m->hp.n_vocab - 1));
        fwd_seq_t s = {kv[b], prompt, ctx, logits, NULL};
        if (fwd_run(fw, &m->hp, res_weights(rm), &s, 1, &h, err, sizeof err))
            die("prefill", err);
    }
    free(zeros);
    float *lb = malloc((size_t)batch * m->hp.n_vocab * sizeof(float));
    if (!lb)
        die("decode", "out of memory");
    double t0 = util_now_s();
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < batch; b++) {
            tok[b] = (int32_t)(1 + ((uint32_t)i * 104729u + (uint32_t)b) % (m->hp.n_vocab - 1));
            d[b] = (fwd_seq_t){kv[b], &tok[b], 1, lb + (size_t)b * m->hp.n_vocab, NULL};
        }
        if (fwd_run(fw, &m->hp, res_weights(rm), d, batch, &h, err, sizeof err))
            die("decode", err);
    }
    double t = util_now_s() - t0;
    memcpy(logits, lb, m->hp.n_vocab * sizeof(float));
    free(lb);
    for (int b = 0; b < batch; b++)
        res_kv_free(res, kv[b]);
    res_release(res, rm);
    return (double)n * batch / t;
}

/* A prefill of n_tok tokens (one sequence, in chunks of the forward pass's
 * size), model resident; returns tokens/s, best of reps. */
static double prefill_speed(res_t *res, res_model_t *rm, fwd_t *fw, float *logits, uint32_t n_tok,
                            int reps)
{
    const model_t *m = res_store_model(rm)->model;
    char err[256];
    int32_t *prompt = malloc(n_tok * sizeof *prompt);
    if (!prompt)
        die("prefill", "out of memory");
    for (uint32_t i = 0; i < n_tok; i++)
        prompt[i] = (int32_t)(1 + (i * 7919) % (m->hp.n_vocab - 1));
    if (res_acquire(res, rm, err, sizeof err))
        die("acquire", err);
    fwd_hooks_t h = res_hooks(rm);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        kv_seq_t *kv;
        if (res_kv_new(res, rm, n_tok, &kv, err, sizeof err) ||
            res_kv_ensure(res, kv, n_tok, err, sizeof err))
            die("kv", err);
        fwd_seq_t s = {kv, prompt, n_tok, logits, NULL};
        double t0 = util_now_s();
        if (fwd_run(fw, &m->hp, res_weights(rm), &s, 1, &h, err, sizeof err))
            die("prefill", err);
        double t = util_now_s() - t0; /* the logits were downloaded: the pass is done */
        if (t < best)
            best = t;
        res_kv_free(res, kv);
    }
    res_release(res, rm);
    free(prompt);
    return n_tok / best;
}

/* Bytes a decode step reads: every weight but the embedding table (one row
 * of it per sequence), plus each sequence's KV cache at ctx positions. */
static double decode_bytes(const store_model_t *sm, uint32_t ctx, int batch)
{
    const model_hparams_t *hp = &sm->model->hp;
    double kv = (double)ctx * kv_bytes_per_pos(hp, KV_TYPE_F16);
    return (double)(sm->image_bytes - sm->segs[0].span) +
           batch * ((double)sm->segs[0].bytes / hp->n_vocab + kv);
}

static void usage(const char *argv0)
{
    fprintf(
        stderr,
        "usage: %s MODEL POOL_MIB [PAGE_KIB] [THREADS] [BACKEND] [--no-cold] [--decode N]\n"
        "          [--ctx N] [--batch B] [--decode-only] [--prefill-only N]\n"
        "  --no-cold      skip the cold (from disk) time to first token: the page cache is kept\n"
        "  --decode N     also time N decode steps after a %d-token prefill\n"
        "  --ctx N        positions in each cache when decode starts (default %d; above it\n"
        "                 the caches are zero-filled rather than prefilled)\n"
        "  --batch B      sequences decoded together, 1..256 (default 1)\n"
        "  --decode-only  only that (no paging or TTFT runs); prints\n"
        "                 model,bytes,batch,ctx,decode_tok_s,decode_bytes_per_tok,decode_gb_s\n"
        "  --prefill-only N  only time a prefill of N tokens (best of 2); prints\n"
        "                 model,bytes,prefill_tokens,prefill_tok_s,prefill_ms\n"
        "  --serving N    only the serving sweep (gpu-check): N decode steps at context %d\n"
        "                 for batch %d and %d, prefills of %d and %d tokens; prints one row each:\n"
        "                 model,bytes,kind,batch,tokens,tok_s,bytes_per_tok,gb_s\n",
        argv0, DECODE_CTX, DECODE_CTX, SWEEP_CTX, SWEEP_B1, SWEEP_B2, SWEEP_P1, SWEEP_P2);
}

int main(int argc, char **argv)
{
    const char *pos[5] = {NULL};
    int n_pos = 0, cold_on = 1, n_decode = 0, decode_only = 0, batch = 1;
    long ctx = DECODE_CTX, prefill_only = 0, serving = 0;
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
        } else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) {
            ctx = atol(argv[++i]);
            if (ctx < 1 || ctx > 1 << 20) {
                usage(argv[0]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            batch = atoi(argv[++i]);
            if (batch < 1 || batch > 256) {
                usage(argv[0]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--serving") && i + 1 < argc) {
            serving = atol(argv[++i]);
            if (serving < 1 || serving > 4096) {
                usage(argv[0]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--prefill-only") && i + 1 < argc) {
            prefill_only = atol(argv[++i]);
            if (prefill_only < 1 || prefill_only > 1 << 20) {
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
    if (decode_only || prefill_only || serving)
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
    fprintf(stderr, "bench_paging: %s backend: %s\n", be->name,
            be->desc ? be->desc : "(no description)");
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

    if (serving) {
        decode_speed(be, res, rm, fw, logits, 2, DECODE_CTX, 1); /* pages the model in, warms up */
        printf("model,bytes,kind,batch,tokens,tok_s,bytes_per_tok,gb_s\n");
        const int batches[2] = {SWEEP_B1, SWEEP_B2};
        for (int k = 0; k < 2; k++) {
            double dec = decode_speed(be, res, rm, fw, logits, (int)serving, SWEEP_CTX, batches[k]);
            double tb = decode_bytes(sm, SWEEP_CTX, batches[k]) / batches[k];
            printf("%s,%zu,decode,%d,%d,%.1f,%.0f,%.1f\n", path, sm->image_bytes, batches[k],
                   SWEEP_CTX, dec, tb, dec * tb / 1e9);
            fflush(stdout);
        }
        const uint32_t lens[2] = {SWEEP_P1, SWEEP_P2};
        for (int k = 0; k < 2; k++) {
            double pf = prefill_speed(res, rm, fw, logits, lens[k], 2);
            printf("%s,%zu,prefill,1,%u,%.1f,0,0\n", path, sm->image_bytes, lens[k], pf);
            fflush(stdout);
        }
        goto out;
    }
    if (prefill_only) {
        prefill_speed(res, rm, fw, logits, 16, 1); /* pages the model in, warms up */
        double pf = prefill_speed(res, rm, fw, logits, (uint32_t)prefill_only, 2);
        printf("model,bytes,prefill_tokens,prefill_tok_s,prefill_ms\n");
        printf("%s,%zu,%ld,%.1f,%.2f\n", path, sm->image_bytes, prefill_only, pf,
               prefill_only / pf * 1e3);
        goto out;
    }
    if (decode_only) {
        decode_speed(be, res, rm, fw, logits, 4, DECODE_CTX, 1); /* pages the model in, warms up */
        double dec = decode_speed(be, res, rm, fw, logits, n_decode, (uint32_t)ctx, batch);
        /* bytes read per step, over the batch's tokens of that step */
        double tb = decode_bytes(sm, (uint32_t)ctx, batch);
        printf("model,bytes,batch,ctx,decode_tok_s,decode_bytes_per_tok,decode_gb_s\n");
        printf("%s,%zu,%d,%ld,%.1f,%.0f,%.1f\n", path, sm->image_bytes, batch, ctx, dec, tb / batch,
               dec * tb / batch / 1e9);
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
        if (t1.end - t0.queued < best_wall)
            best_wall = t1.end - t0.queued;
        if (copy_s < best_copy)
            best_copy = copy_s;
        if (map_s < best_map)
            best_map = map_s;
        /* plain memcpy of the same bytes into the mapped range (host-addressable
         * device memory only; elsewhere the column repeats the mapped raw copy):
         * each segment to its place, as a page-in copies it (a small model's
         * host image is packed closer than the device's pages) */
        if (host_addressable) {
            double m0 = util_now_s();
            for (uint32_t s = 0; s < sm->n_segs; s++)
                memcpy((char *)res_model_base(rm) + sm->segs[s].off,
                       sm->image + sm->segs[s].host_off, sm->segs[s].host_span);
            double mc = util_now_s() - m0;
            if (mc < best_memcpy)
                best_memcpy = mc;
        }
        /* raw copies of the same bytes, no mapping beside them: into the
         * model's mapped range (VMM on cuda), and the whole host image into a
         * plain buffer */
        double q = sm->host_bytes == sm->image_bytes
                       ? raw_copy(be, res_model_base(rm), sm->image, sm->image_bytes)
                       : raw_copy_segs(be, res_model_base(rm), sm);
        if (q < best_mapped)
            best_mapped = q;
        q = raw_copy(be, plain, sm->image, sm->host_bytes);
        if (q < best_plain)
            best_plain = q;
    }
    if (!host_addressable)
        best_memcpy = best_mapped;
    be->buf_free(be->ctx, plain);
    double gb = sm->host_bytes / 1e9; /* what page-ins copy (the device pages: image_bytes) */
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
        dec = decode_speed(be, res, rm, fw, logits, n_decode, DECODE_CTX, 1);
    /* swapped out to host RAM */
    double swapped = 1e30;
    for (int i = 0; i < 3; i++) {
        if (res_evict(res, rm, RES_CAUSE_ADMIN, 0))
            die("evict", "busy");
        double t = first_token(res, rm, fw, logits);
        if (t < swapped)
            swapped = t;
    }
    double tok_bytes = decode_bytes(sm, DECODE_CTX, 1);
    printf(
        "model,bytes,page_kib,map_s,map_gb_s,copy_s,copy_gb_s,memcpy_gb_s,copy_vs_memcpy,"
        "queue_gb_s,queue_vs_memcpy,pagein_wall_s,pagein_gb_s,ttft_resident_ms,ttft_swapped_ms,ttft_cold_ms,"
        "raw_plain_gb_s,pagein_vs_raw_mapped,pagein_vs_raw_plain,decode_tok_s,decode_bytes_per_tok\n");
    printf(
        "%s,%zu,%zu,%.4f,%.2f,%.4f,%.2f,%.2f,%.3f,%.2f,%.3f,%.4f,%.2f,%.1f,%.1f,%.1f,%.2f,%.3f,%.3f,"
        "%.1f,%.0f\n",
        path, sm->image_bytes, page >> 10, best_map, sm->image_bytes / 1e9 / best_map, best_copy,
        gb / best_copy, gb / best_memcpy, best_memcpy / best_copy, gb / best_mapped,
        best_memcpy / best_mapped, best_wall, gb / best_wall, resident * 1e3, swapped * 1e3,
        cold * 1e3, gb / best_plain, best_mapped / best_wall, best_plain / best_wall, dec,
        tok_bytes);
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
