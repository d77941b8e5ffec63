/* bench_load: a load generator: C clients drive a running daemon over its unix socket; requests/s and latency percentiles per concurrency, and the time of the same request as a direct engine call. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "base/util.h"

#define PROMPT "Once upon a time"

typedef struct client {
    const char *sock, *model;
    int n_req, max_tokens;
    double *lat; /* n_req seconds */
    int errors;
} client_t;

static int connect_unix(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Reads one '\n'-terminated line into buf (static per client: small answers). */
static int read_line(int fd, char *buf, size_t cap, size_t *have)
{
    for (;;) {
        char *nl = memchr(buf, '\n', *have);
        if (nl)
            return (int)(nl - buf) + 1;
        if (*have == cap)
            return -1;
        ssize_t n = read(fd, buf + *have, cap - *have);
        if (n <= 0)
            return -1;
        *have += (size_t)n;
    }
}

static void *client_main(void *arg)
{
    client_t *c = arg;
    int fd = connect_unix(c->sock);
    if (fd < 0) {
        c->errors = c->n_req;
        return NULL;
    }
    char req[512], buf[65536];
    size_t have = 0;
    for (int i = 0; i < c->n_req; i++) {
        int n = snprintf(req, sizeof req,
                         "{\"op\":\"generate\",\"id\":%d,\"model\":\"%s\",\"prompt\":\"%s\","
                         "\"max_tokens\":%d,\"temperature\":0}\n",
                         i, c->model, PROMPT, c->max_tokens);
        double t0 = util_now_s();
        if (write(fd, req, (size_t)n) != n) {
            c->errors++;
            break;
        }
        int len = read_line(fd, buf, sizeof buf, &have);
        if (len < 0) {
            c->errors++;
            break;
        }
        c->lat[i] = util_now_s() - t0;
        if (!memmem(buf, (size_t)len, "\"event\":\"done\"", 14))
            c->errors++;
        memmove(buf, buf + len, have - (size_t)len);
        have -= (size_t)len;
    }
    close(fd);
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The same request through the engine in this process: tokenize, prefill,
 * greedy decode. Returns the best of reps, seconds. */
static double direct_call(const char *path, int max_tokens, int reps)
{
    char err[512];
    model_t *m = model_open(path, err, sizeof err);
    be_params_t bp = {.kind = BE_KIND_CPU, .threads = 1};
    backend_t *be = be_open(&bp, err, sizeof err);
    if (!m || !be) {
        fprintf(stderr, "bench_load: %s\n", err);
        exit(1);
    }
    fwd_t *f = fwd_new(be);
    float *logits = malloc(m->hp.n_vocab * sizeof(float));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = util_now_s();
        int32_t ids[64];
        int n = tok_encode(m->tok, PROMPT, strlen(PROMPT), tok_add_bos(m->tok), 1, ids, 64);
        kv_seq_t *kv = kv_seq_new(&m->hp, (uint32_t)(n + max_tokens), KV_TYPE_F16);
        sampler_params_t sp;
        sampler_params_default(&sp);
        sp.temperature = 0;
        sampler_t *smp = sampler_new(&sp, (int32_t)m->hp.n_vocab, err, sizeof err);
        fwd_seq_t s = {kv, ids, (uint32_t)n, logits, NULL};
        fwd_run(f, &m->hp, &m->w, &s, 1, NULL, err, sizeof err);
        for (int i = 1; i < max_tokens; i++) {
            int32_t id = sampler_sample(smp, logits);
            fwd_seq_t d = {kv, &id, 1, logits, NULL};
            fwd_run(f, &m->hp, &m->w, &d, 1, NULL, err, sizeof err);
        }
        sampler_sample(smp, logits);
        sampler_free(smp);
        kv_seq_free(kv);
        double t = util_now_s() - t0;
        if (t < best)
            best = t;
    }
    free(logits);
    fwd_free(f);
    be_close(be);
    model_close(m);
    return best;
}

/* usage: bench_load SOCKET MODEL_NAME MODEL_FILE MAX_TOKENS REQS_PER_CLIENT CLIENTS... */
int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: %s SOCKET MODEL MODEL_FILE MAX_TOKENS REQS CLIENTS...\n", argv[0]);
        return 2;
    }
    int max_tokens = atoi(argv[4]), reqs = atoi(argv[5]);
    double direct = direct_call(argv[3], max_tokens, 5);
    printf("clients,requests,errors,req_s,p50_ms,p99_ms,direct_ms,added_p50_ms\n");
    for (int a = 6; a < argc; a++) {
        int nc = atoi(argv[a]);
        client_t *cs = calloc((size_t)nc, sizeof *cs);
        pthread_t *th = calloc((size_t)nc, sizeof *th);
        double t0 = util_now_s();
        for (int i = 0; i < nc; i++) {
            cs[i] = (client_t){
                argv[1], argv[2], reqs, max_tokens, calloc((size_t)reqs, sizeof(double)), 0};
            pthread_create(&th[i], NULL, client_main, &cs[i]);
        }
        int errors = 0;
        double *all = malloc((size_t)nc * reqs * sizeof(double));
        for (int i = 0; i < nc; i++) {
            pthread_join(th[i], NULL);
            errors += cs[i].errors;
            memcpy(all + (size_t)i * reqs, cs[i].lat, (size_t)reqs * sizeof(double));
            free(cs[i].lat);
        }
        double wall = util_now_s() - t0;
        size_t n = (size_t)nc * reqs;
        qsort(all, n, sizeof(double), cmp_d);
        double p50 = all[n / 2],
               p99 = all[(size_t)((double)n * 0.99) < n ? (size_t)((double)n * 0.99) : n - 1];
        printf("%d,%zu,%d,%.1f,%.2f,%.2f,%.2f,%.2f\n", nc, n, errors, (double)n / wall, p50 * 1e3,
               p99 * 1e3, direct * 1e3, (p50 - direct) * 1e3);
        fflush(stdout);
        free(all);
        free(cs);
        free(th);
    }
    return 0;
}
