/* workload: request traces for the simulator: Poisson or Gamma arrivals, Zipf model popularity, length distributions, and the Azure Functions 2019 trace format. */
#include "workload.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WL_MAX_REQS 50000000u /* refuse traces larger than this */
#define WL_AZURE_MINUTES 1440

/* ------------------------------------------------------------------ random numbers */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void wl_rng_seed(wl_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t wl_rng_u64(wl_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double wl_rng_uniform(wl_rng_t *r)
{
    return ((double)(wl_rng_u64(r) >> 11) + 0.5) * 0x1.0p-53;
}

double wl_rng_normal(wl_rng_t *r)
{
    double u = wl_rng_uniform(r), v = wl_rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* Marsaglia and Tsang; shape < 1 through Gamma(shape + 1) * U^(1/shape). */
double wl_rng_gamma(wl_rng_t *r, double shape)
{
    if (shape < 1.0) {
        double g = wl_rng_gamma(r, shape + 1.0);
        return g * pow(wl_rng_uniform(r), 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = wl_rng_normal(r), v = 1.0 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = wl_rng_uniform(r);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v;
    }
}

static uint32_t poisson(wl_rng_t *r, double lambda)
{
    if (lambda <= 0)
        return 0;
    if (lambda > 60) {
        double x = lambda + sqrt(lambda) * wl_rng_normal(r);
        return x < 0 ? 0 : (uint32_t)(x + 0.5);
    }
    double l = exp(-lambda), p = 1.0;
    uint32_t k = 0;
    for (;;) {
        p *= wl_rng_uniform(r);
        if (p <= l)
            return k;
        k++;
    }
}

/* ------------------------------------------------------------------ lengths */

static uint32_t len_draw(wl_rng_t *r, const wl_len_t *l)
{
    double x = l->median * (l->sigma > 0 ? exp(l->sigma * wl_rng_normal(r)) : 1.0);
    if (x < l->min)
        x = l->min;
    if (x > l->max)
        x = l->max;
    return (uint32_t)(x + 0.5);
}

double wl_len_mean(const wl_len_t *l)
{
    if (l->sigma <= 0) {
        double x = l->median < l->min ? l->min : l->median > l->max ? l->max : l->median;
        return (double)(uint32_t)(x + 0.5);
    }
    /* E[clamp(median * e^(sigma z))] by the midpoint rule over z in [-8, 8] */
    const int n = 4000;
    double sum = 0, h = 16.0 / n;
    for (int i = 0; i < n; i++) {
        double z = -8.0 + (i + 0.5) * h;
        double x = l->median * exp(l->sigma * z);
        x = x < l->min ? l->min : x > l->max ? l->max : x;
        sum += x * exp(-0.5 * z * z) * h;
    }
    return sum / sqrt(2.0 * M_PI);
}

/* ------------------------------------------------------------------ synthetic traces */

static int zipf_draw(wl_rng_t *r, const double *cdf, int n)
{
    double u = wl_rng_uniform(r) * cdf[n - 1];
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Unnormalized popularity of the model of rank i. */
static double zipf_weight(int i, double s)
{
    return 1.0 / pow(i + 1.0, s);
}

double wl_popularity(const wl_params_t *p, int model)
{
    double sum = 0;
    for (int i = 0; i < p->n_models; i++)
        sum += zipf_weight(i, p->zipf_s);
    return zipf_weight(model, p->zipf_s) / sum;
}

void wl_tokens_draw(wl_req_t *reqs, size_t n, const wl_req_t *src, size_t n_src, uint64_t seed)
{
    wl_rng_t rng;
    wl_rng_seed(&rng, seed);
    for (size_t i = 0; i < n && n_src; i++) {
        const wl_req_t *s = &src[wl_rng_u64(&rng) % n_src];
        reqs[i].prompt = s->prompt;
        reqs[i].output = s->output;
    }
}

int wl_generate(const wl_params_t *p, wl_req_t **out, size_t *n)
{
    if (p->n_models < 1 || p->rate <= 0 || p->duration_s <= 0 ||
        (p->arrival == WL_ARRIVAL_GAMMA && p->cv <= 0))
        return WL_ERR_ARG;
    double expect = p->rate * p->duration_s;
    if (expect > WL_MAX_REQS / 2)
        return WL_ERR_ARG;
    double *cdf = malloc((size_t)p->n_models * sizeof *cdf);
    size_t cap = (size_t)(expect * 1.2) + 64, k = 0;
    wl_req_t *v = malloc(cap * sizeof *v);
    if (!cdf || !v) {
        free(cdf);
        free(v);
        return WL_ERR_NOMEM;
    }
    double acc = 0;
    for (int i = 0; i < p->n_models; i++) {
        acc += zipf_weight(i, p->zipf_s);
        cdf[i] = acc;
    }
    wl_rng_t r;
    wl_rng_seed(&r, p->seed);
    double shape = p->arrival == WL_ARRIVAL_GAMMA ? 1.0 / (p->cv * p->cv) : 1.0;
    double mean = 1.0 / p->rate;
    for (double t = 0;;) {
        double gap = p->arrival == WL_ARRIVAL_GAMMA ? wl_rng_gamma(&r, shape) * mean / shape
                                                    : -log(wl_rng_uniform(&r)) * mean;
        t += gap;
        if (t >= p->duration_s)
            break;
        if (k == cap) {
            cap *= 2;
            wl_req_t *nv = realloc(v, cap * sizeof *v);
            if (!nv || cap > WL_MAX_REQS) {
                free(nv ? nv : v);
                free(cdf);
                return WL_ERR_NOMEM;
            }
            v = nv;
        }
        v[k].t = t;
        v[k].model = zipf_draw(&r, cdf, p->n_models);
        v[k].prompt = len_draw(&r, &p->prompt);
        v[k].output = len_draw(&r, &p->output);
        k++;
    }
    free(cdf);
    *out = v;
    *n = k;
    return WL_OK;
}

/* ------------------------------------------------------------------ request lists */

int wl_requests_read(const char *path, int n_models, wl_req_t **out, size_t *n, char *err,
                     size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return WL_ERR_IO;
    }
    int rc = WL_OK;
    char *line = NULL;
    size_t lcap = 0, nv = 0, cap = 0;
    wl_req_t *v = NULL;
    for (int lineno = 1; getline(&line, &lcap, f) >= 0; lineno++) {
        line[strcspn(line, "#\r\n")] = 0;
        if (line[strspn(line, " \t")] == 0)
            continue;
        double t;
        int model, used = 0;
        long long prompt, output;
        if (sscanf(line, "%lf %d %lld %lld %n", &t, &model, &prompt, &output, &used) != 4 ||
            line[used] != 0) {
            snprintf(err, errlen, "%s:%d: want \"arrival_s model prompt_tokens output_tokens\"",
                     path, lineno);
            rc = WL_ERR_FORMAT;
            break;
        }
        if (!(t >= 0) || model < 0 || model >= n_models || prompt < 1 || output < 1 ||
            prompt > UINT32_MAX || output > UINT32_MAX) {
            snprintf(err, errlen,
                     "%s:%d: bad request (arrival %g s, model %d of 0..%d, %lld "
                     "prompt and %lld output tokens)",
                     path, lineno, t, model, n_models - 1, prompt, output);
            rc = WL_ERR_FORMAT;
            break;
        }
        if (nv && t < v[nv - 1].t) {
            snprintf(err, errlen, "%s:%d: arrival %g s is before the one above it (%g s)", path,
                     lineno, t, v[nv - 1].t);
            rc = WL_ERR_FORMAT;
            break;
        }
        if (nv == cap) {
            cap = cap ? 2 * cap : 64;
            wl_req_t *nw = realloc(v, cap * sizeof *nw);
            if (!nw) {
                snprintf(err, errlen, "out of memory");
                rc = WL_ERR_NOMEM;
                break;
            }
            v = nw;
        }
        v[nv++] = (wl_req_t){
            .t = t, .model = model, .prompt = (uint32_t)prompt, .output = (uint32_t)output};
    }
    free(line);
    fclose(f);
    if (rc) {
        free(v);
        return rc;
    }
    *out = v;
    *n = nv;
    return WL_OK;
}

/* ------------------------------------------------------------------ Azure Functions 2019 */

typedef struct az_func {
    char *hash;       /* HashFunction, owned */
    uint32_t *counts; /* n_min invocations */
    uint64_t total;
    int row;
    int model;
} az_func_t;

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static int by_volume(const void *a, const void *b)
{
    const az_func_t *x = *(const az_func_t *const *)a, *y = *(const az_func_t *const *)b;
    if (x->total != y->total)
        return x->total > y->total ? -1 : 1;
    return x->row - y->row;
}

static int by_time(const void *a, const void *b)
{
    const wl_req_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->model - y->model;
}

/* Splits a CSV line in place (no quoting in this format); returns the field count. */
static size_t split_csv(char *line, char **f, size_t max)
{
    size_t n = 0;
    char *p = line;
    for (;;) {
        if (n < max)
            f[n] = p;
        n++;
        char *c = strchr(p, ',');
        if (!c)
            break;
        *c = 0;
        p = c + 1;
    }
    char *last = n <= max ? f[n - 1] : NULL;
    if (last)
        last[strcspn(last, "\r\n")] = 0;
    return n;
}

int wl_azure_read(const char *path, const wl_azure_t *a, wl_req_t **out, size_t *n, char *err,
                  size_t errlen)
{
    int rc = WL_ERR_FORMAT;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return WL_ERR_IO;
    }
    char *line = NULL;
    size_t lcap = 0;
    enum {
        MAXF = 4 + WL_AZURE_MINUTES
    };
    char **fld = malloc(MAXF * sizeof *fld);
    az_func_t *fn = NULL, **rank = NULL;
    wl_req_t *v = NULL;
    size_t n_fn = 0, cap_fn = 0, nv = 0;
    int n_cols = 0;
    if (!fld || a->n_models < 1 || a->time_scale <= 0 || a->start_min < 0) {
        rc = WL_ERR_ARG;
        snprintf(err, errlen, "bad arguments");
        goto done;
    }
    if (getline(&line, &lcap, f) < 0) {
        snprintf(err, errlen, "%s: empty file", path);
        goto done;
    }
    size_t nf = split_csv(line, fld, MAXF);
    if (nf < 5 || nf > MAXF || strcmp(fld[0], "HashOwner") || strcmp(fld[1], "HashApp") ||
        strcmp(fld[2], "HashFunction") || strcmp(fld[3], "Trigger")) {
        snprintf(err, errlen,
                 "%s:1: not an Azure Functions invocation file (want the header "
                 "HashOwner,HashApp,HashFunction,Trigger,1,...,1440)",
                 path);
        goto done;
    }
    for (size_t i = 4; i < nf; i++)
        if (strtol(fld[i], NULL, 10) != (long)(i - 3)) {
            snprintf(err, errlen, "%s:1: column %zu is '%s', want minute %zu", path, i + 1, fld[i],
                     i - 3);
            goto done;
        }
    n_cols = (int)(nf - 4);
    if (a->start_min >= n_cols) {
        rc = WL_ERR_ARG;
        snprintf(err, errlen, "%s: start minute %d past the %d minutes in the file", path,
                 a->start_min, n_cols);
        goto done;
    }
    int n_min =
        a->n_min > 0 && a->start_min + a->n_min <= n_cols ? a->n_min : n_cols - a->start_min;
    uint64_t all = 0;
    for (int lineno = 2; getline(&line, &lcap, f) >= 0; lineno++) {
        if (line[0] == '\n' || line[0] == 0)
            continue;
        nf = split_csv(line, fld, MAXF);
        if ((int)nf != 4 + n_cols) {
            snprintf(err, errlen, "%s:%d: %zu fields, the header has %d", path, lineno, nf,
                     4 + n_cols);
            goto done;
        }
        if (n_fn == cap_fn) {
            cap_fn = cap_fn ? 2 * cap_fn : 256;
            az_func_t *nfn = realloc(fn, cap_fn * sizeof *nfn);
            if (!nfn) {
                rc = WL_ERR_NOMEM;
                goto done;
            }
            fn = nfn;
        }
        az_func_t *z = &fn[n_fn];
        memset(z, 0, sizeof *z);
        z->row = lineno;
        z->hash = strdup(fld[2]);
        z->counts = calloc((size_t)n_min, sizeof *z->counts);
        n_fn++;
        if (!z->hash || !z->counts) {
            rc = WL_ERR_NOMEM;
            goto done;
        }
        for (int m = 0; m < n_min; m++) {
            const char *s = fld[4 + a->start_min + m];
            char *end;
            errno = 0;
            unsigned long c = strtoul(s, &end, 10);
            if (end == s || *end || errno || c > UINT32_MAX) {
                snprintf(err, errlen, "%s:%d: minute %d: '%s' is not a count", path, lineno,
                         a->start_min + m + 1, s);
                goto done;
            }
            z->counts[m] = (uint32_t)c;
            z->total += c;
        }
        all += z->total;
        if (all > WL_MAX_REQS) {
            rc = WL_ERR_ARG;
            snprintf(err, errlen, "%s: more than %u invocations in the window; use fewer minutes",
                     path, WL_MAX_REQS);
            goto done;
        }
    }
    /* top n_models by volume are models 0..n-1 in rank order; others hash */
    rank = malloc((n_fn ? n_fn : 1) * sizeof *rank);
    v = malloc((all ? all : 1) * sizeof *v);
    if (!rank || !v) {
        rc = WL_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < n_fn; i++)
        rank[i] = &fn[i];
    qsort(rank, n_fn, sizeof *rank, by_volume);
    for (size_t i = 0; i < n_fn; i++)
        rank[i]->model =
            i < (size_t)a->n_models ? (int)i : (int)(fnv1a(rank[i]->hash) % (uint64_t)a->n_models);
    wl_rng_t r;
    wl_rng_seed(&r, a->seed);
    double minute = 60.0 / a->time_scale;
    for (size_t i = 0; i < n_fn; i++)
        for (int m = 0; m < n_min; m++)
            for (uint32_t c = 0; c < fn[i].counts[m]; c++) {
                v[nv].t = (m + wl_rng_uniform(&r)) * minute;
                v[nv].model = fn[i].model;
                nv++;
            }
    qsort(v, nv, sizeof *v, by_time);
    for (size_t i = 0; i < nv; i++) {
        v[i].prompt = len_draw(&r, &a->prompt);
        v[i].output = len_draw(&r, &a->output);
    }
    *out = v;
    *n = nv;
    v = NULL;
    rc = WL_OK;
done:
    for (size_t i = 0; i < n_fn; i++) {
        free(fn[i].hash);
        free(fn[i].counts);
    }
    free(fn);
    free(rank);
    free(v);
    free(fld);
    free(line);
    fclose(f);
    return rc;
}

static void hex_id(wl_rng_t *r, char *buf)
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 64; i += 16) {
        uint64_t x = wl_rng_u64(r);
        for (int j = 0; j < 16; j++, x >>= 4)
            buf[i + j] = hx[x & 15];
    }
    buf[64] = 0;
}

int wl_azure_write_sample(const char *path, int n_func, double per_min, uint64_t seed)
{
    if (n_func < 1 || per_min <= 0)
        return WL_ERR_ARG;
    FILE *f = fopen(path, "w");
    if (!f)
        return WL_ERR_IO;
    static const char *const trig[] = {"http", "timer", "queue", "event", "storage"};
    wl_rng_t r;
    wl_rng_seed(&r, seed);
    double wsum = 0;
    for (int i = 0; i < n_func; i++)
        wsum += 1.0 / pow(i + 1.0, 1.1);
    fputs("HashOwner,HashApp,HashFunction,Trigger", f);
    for (int m = 1; m <= WL_AZURE_MINUTES; m++)
        fprintf(f, ",%d", m);
    fputc('\n', f);
    char owner[65], app[65], func[65];
    for (int i = 0; i < n_func; i++) {
        if (i % 4 == 0)
            hex_id(&r, owner);
        if (i % 2 == 0)
            hex_id(&r, app);
        hex_id(&r, func);
        fprintf(f, "%s,%s,%s,%s", owner, app, func, trig[i % 5]);
        /* on/off bursts: on periods of ~5 minutes, on 40% of the time */
        double rate = per_min * (1.0 / pow(i + 1.0, 1.1)) / wsum / 0.4;
        int on = wl_rng_uniform(&r) < 0.4;
        for (int m = 0; m < WL_AZURE_MINUTES; m++) {
            if (on && wl_rng_uniform(&r) < 0.2)
                on = 0;
            else if (!on && wl_rng_uniform(&r) < 0.2 * 0.4 / 0.6)
                on = 1;
            double diurnal = 0.6 + 0.4 * sin(2.0 * M_PI * m / WL_AZURE_MINUTES);
            fprintf(f, ",%u", on ? poisson(&r, rate * diurnal) : 0u);
        }
        fputc('\n', f);
    }
    int bad = ferror(f);
    if (fclose(f) || bad)
        return WL_ERR_IO;
    return WL_OK;
}

/* ------------------------------------------------------------------ recorded LLM requests */

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's civil algorithm). */
static long days_from_civil(long y, unsigned m, unsigned d)
{
    y -= m <= 2;
    long era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long)doe - 719468;
}

int wl_llm_trace_read(const char *path, const wl_llm_trace_t *a, wl_req_t **out, size_t *n,
                      char *err, size_t errlen)
{
    if (a->n_models < 1 || !(a->time_scale > 0)) {
        snprintf(err, errlen, "bad trace parameters");
        return WL_ERR_ARG;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return WL_ERR_IO;
    }
    double *cdf = malloc((size_t)a->n_models * sizeof *cdf);
    int rc = WL_OK;
    char *line = NULL;
    size_t lcap = 0, nv = 0, cap = 0;
    wl_req_t *v = NULL;
    double t0 = 0;
    wl_rng_t rng;
    wl_rng_seed(&rng, a->seed);
    if (!cdf) {
        snprintf(err, errlen, "out of memory");
        rc = WL_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < a->n_models; i++)
        cdf[i] = (i ? cdf[i - 1] : 0) + zipf_weight(i, a->zipf_s);
    for (int lineno = 1; getline(&line, &lcap, f) >= 0; lineno++) {
        line[strcspn(line, "\r\n")] = 0;
        if (lineno == 1) {
            if (strcmp(line, "TIMESTAMP,ContextTokens,GeneratedTokens")) {
                snprintf(err, errlen,
                         "%s:1: not an LLM request trace (want the header "
                         "TIMESTAMP,ContextTokens,GeneratedTokens)",
                         path);
                rc = WL_ERR_FORMAT;
                break;
            }
            continue;
        }
        if (line[0] == 0)
            continue;
        int Y, M, D, h, mi, used = 0;
        double sec;
        long long ctx, gen;
        if (sscanf(line, "%d-%d-%d %d:%d:%lf,%lld,%lld%n", &Y, &M, &D, &h, &mi, &sec, &ctx, &gen,
                   &used) != 8 ||
            line[used] != 0 || M < 1 || M > 12 || D < 1 || D > 31 || h < 0 || h > 23 || mi < 0 ||
            mi > 59 || !(sec >= 0 && sec < 61) || ctx < 0 || gen < 0 || ctx > UINT32_MAX ||
            gen > UINT32_MAX) {
            snprintf(err, errlen,
                     "%s:%d: want \"YYYY-MM-DD HH:MM:SS.frac,context_tokens,"
                     "generated_tokens\"",
                     path, lineno);
            rc = WL_ERR_FORMAT;
            break;
        }
        double t = (double)days_from_civil(Y, (unsigned)M, (unsigned)D) * 86400.0 + h * 3600.0 +
                   mi * 60.0 + sec;
        if (nv == 0)
            t0 = t;
        t = (t - t0) / a->time_scale;
        if (nv && t < v[nv - 1].t) {
            snprintf(err, errlen, "%s:%d: request out of time order", path, lineno);
            rc = WL_ERR_FORMAT;
            break;
        }
        uint32_t o = gen > 0 ? (uint32_t)gen : 1, p = ctx > 0 ? (uint32_t)ctx : 1;
        if (a->max_ctx && o >= a->max_ctx)
            o = a->max_ctx / 2;
        if (a->max_ctx && p + o > a->max_ctx)
            p = a->max_ctx - o;
        if (nv == cap) {
            cap = cap ? 2 * cap : 1024;
            wl_req_t *nw = realloc(v, cap * sizeof *nw);
            if (!nw) {
                snprintf(err, errlen, "out of memory");
                rc = WL_ERR_NOMEM;
                break;
            }
            v = nw;
        }
        v[nv++] = (wl_req_t){
            .t = t, .model = zipf_draw(&rng, cdf, a->n_models), .prompt = p, .output = o};
    }
done:
    free(cdf);
    free(line);
    fclose(f);
    if (rc == WL_OK && nv == 0) {
        snprintf(err, errlen, "%s: no requests", path);
        rc = WL_ERR_FORMAT;
    }
    if (rc) {
        free(v);
        return rc;
    }
    *out = v;
    *n = nv;
    return WL_OK;
}
