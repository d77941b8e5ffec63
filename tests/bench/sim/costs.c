/* costs: the simulator's device figures, measured ones from gpu-check's figures files (tests/tools/gpu-check.sh) or an H200's datasheet figures. */
#include "costs.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_PTS 16

typedef struct report {
    double pagein_8b, pagein_1g; /* GB/s; 0 = absent */
    double dec_b[MAX_PTS], dec_ctx[MAX_PTS], dec_tps[MAX_PTS], dec_bpt[MAX_PTS];
    int n_dec;
    double pre_tok, pre_tps; /* the longest prefill figure; 0 = absent */
    double model_bytes;      /* the 8B file's bytes; 0 = absent */
    char gpu[96];
    int not_gpu; /* the report says NOT A GPU CHECK */
} report_t;

/* ------------------------------------------------------------------ reading the figures */

/* Reads one figures file (gpu-check.sh's gpu-check-N-figures.txt) into r, adding to what is there:
 * "gpu NAME", "test_only 1", "pagein_1g_gb_s X", "pagein_8b_gb_s X", "model_8b_bytes N",
 * "decode BATCH CONTEXT TOK_S BYTES_PER_TOKEN", "prefill TOKENS TOK_S"; '#' lines and other keys
 * are passed over (the file has more figures than the simulator takes). */
static int figures_read(const char *path, report_t *r, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        double a, b, c, d;
        int flag;
        char name[96];
        if (line[0] == '#')
            continue;
        if (sscanf(line, "gpu %95[^\n]", name) == 1)
            snprintf(r->gpu, sizeof r->gpu, "%s", name);
        else if (sscanf(line, "test_only %d", &flag) == 1)
            r->not_gpu |= flag != 0;
        else if (sscanf(line, "pagein_1g_gb_s %lf", &a) == 1 && a > 0)
            r->pagein_1g = a;
        else if (sscanf(line, "pagein_8b_gb_s %lf", &a) == 1 && a > 0)
            r->pagein_8b = a;
        else if (sscanf(line, "model_8b_bytes %lf", &a) == 1 && a > 0)
            r->model_bytes = a;
        else if (sscanf(line, "decode %lf %lf %lf %lf", &a, &b, &c, &d) == 4 &&
                 r->n_dec < MAX_PTS && a >= 1 && c > 0 && d > 0) {
            r->dec_b[r->n_dec] = a;
            r->dec_ctx[r->n_dec] = b;
            r->dec_tps[r->n_dec] = c;
            r->dec_bpt[r->n_dec++] = d;
        } else if (sscanf(line, "prefill %lf %lf", &a, &b) == 2 && a > r->pre_tok && b > 0) {
            r->pre_tok = a;
            r->pre_tps = b;
        }
    }
    fclose(f);
    return 0;
}

/* what: figures files separated by commas (the two gpu-check calls'), read in order. */
static int report_read(const char *what, report_t *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    char path[1024];
    for (const char *p = what; *p;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof path) {
            snprintf(err, errlen, "'%s': an empty or overlong path in the list", what);
            return -1;
        }
        memcpy(path, p, n);
        path[n] = 0;
        if (figures_read(path, r, err, errlen))
            return -1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* ------------------------------------------------------------------ the fit */

/* Solves the n x n system m x = v in place (partial pivoting); 0, or -1 when singular. */
static int solve(int n, double m[3][3], double v[3], double x[3])
{
    for (int c = 0; c < n; c++) {
        int p = c;
        for (int r = c + 1; r < n; r++)
            if (fabs(m[r][c]) > fabs(m[p][c]))
                p = r;
        if (fabs(m[p][c]) < 1e-300)
            return -1;
        for (int k = 0; k < n; k++) {
            double t = m[c][k];
            m[c][k] = m[p][k];
            m[p][k] = t;
        }
        double t = v[c];
        v[c] = v[p];
        v[p] = t;
        for (int r = 0; r < n; r++) {
            if (r == c)
                continue;
            double f = m[r][c] / m[c][c];
            for (int k = 0; k < n; k++)
                m[r][k] -= f * m[c][k];
            v[r] -= f * v[c];
        }
    }
    for (int c = 0; c < n; c++)
        x[c] = v[c] / m[c][c];
    return 0;
}

/* Step time T_i = b_i / tps_i against the columns named by use (bit 0: t_step, 1: bytes, 2:
 * t_token x batch), each row weighted by 1 / T_i (relative residuals). Fills fit[3] (unused
 * columns 0) and *worst, the largest relative residual; 0, or -1 when the fit is singular or a
 * coefficient is negative. */
static int fit_steps(const report_t *r, unsigned use, double fit[3], double *worst)
{
    int col[3], n = 0;
    for (int k = 0; k < 3; k++)
        if (use & (1u << k))
            col[n++] = k;
    double m[3][3] = {{0}}, v[3] = {0}, x[3] = {0};
    for (int i = 0; i < r->n_dec; i++) {
        double T = r->dec_b[i] / r->dec_tps[i];
        double row[3] = {1.0 / T, r->dec_bpt[i] * r->dec_b[i] / T, r->dec_b[i] / T};
        for (int a = 0; a < n; a++) {
            for (int b = 0; b < n; b++)
                m[a][b] += row[col[a]] * row[col[b]];
            v[a] += row[col[a]]; /* T / T */
        }
    }
    if (solve(n, m, v, x))
        return -1;
    fit[0] = fit[1] = fit[2] = 0;
    for (int a = 0; a < n; a++) {
        if (x[a] < 0 || (col[a] == 1 && x[a] == 0))
            return -1;
        fit[col[a]] = x[a];
    }
    *worst = 0;
    for (int i = 0; i < r->n_dec; i++) {
        double T = r->dec_b[i] / r->dec_tps[i];
        double p = fit[0] + fit[1] * r->dec_bpt[i] * r->dec_b[i] + fit[2] * r->dec_b[i];
        *worst = fmax(*worst, fabs(p - T) / T);
    }
    return 0;
}

static int distinct_points(const report_t *r)
{
    int n = 0;
    for (int i = 0; i < r->n_dec; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= r->dec_b[j] == r->dec_b[i] && r->dec_ctx[j] == r->dec_ctx[i];
        n += !seen;
    }
    return n;
}

/* ------------------------------------------------------------------ costs_load */

static void datasheet(sim_cost_t *k, costs_src_t *s)
{
    k->h2d_bw = COSTS_H200_H2D_GBS * 1e9;
    k->hbm_bw = COSTS_H200_HBM_GBS * 1e9;
    k->flops = COSTS_H200_TFLOPS * 1e12;
    k->t_step_s = k->t_token_s = 0;
    snprintf(s->h2d, sizeof s->h2d, "datasheet: H200 host->device %.0f GB/s", COSTS_H200_H2D_GBS);
    snprintf(s->hbm, sizeof s->hbm, "datasheet: H200 HBM %.0f GB/s", COSTS_H200_HBM_GBS);
    snprintf(s->step, sizeof s->step,
             "datasheet: no per-step or per-token time beyond t_fixed %.3g ms", k->t_fixed_s * 1e3);
    snprintf(s->flops, sizeof s->flops, "datasheet: H200 dense BF16 %.0f TFLOP/s",
             COSTS_H200_TFLOPS);
    s->n_measured = 0;
}

int costs_load(const char *what, sim_cost_t *k, costs_src_t *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    datasheet(k, s);
    if (!strcmp(what, "h200"))
        return 0;
    report_t r;
    if (report_read(what, &r, err, errlen))
        return -1;
    char on[128];
    snprintf(on, sizeof on, "%.80s%s", r.gpu[0] ? r.gpu : "an unnamed device",
             r.not_gpu ? ", a test report (NOT A GPU CHECK)" : "");

    double pg = r.pagein_8b > 0 ? r.pagein_8b : r.pagein_1g;
    if (pg > 0) {
        k->h2d_bw = pg * 1e9;
        snprintf(s->h2d, sizeof s->h2d, "measured: page-in %.4g GB/s (%s stage) on %s", pg,
                 r.pagein_8b > 0 ? "8B ttft8b" : "1.1 GB paging", on);
        s->n_measured++;
    }

    /* every subset of t_step, bytes/hbm, t_token*batch with bytes/hbm and no more unknowns than
     * distinct decode points whose coefficients come out non-negative; the closest fit wins */
    static const unsigned sets[4] = {7u, 3u, 6u, 2u};
    const int np = distinct_points(&r);
    double fit[3] = {0}, worst = INFINITY;
    int got = 0;
    for (int i = 0; i < 4; i++) {
        double f[3], w;
        if (np >= __builtin_popcount(sets[i]) && fit_steps(&r, sets[i], f, &w) == 0 &&
            w < worst - 1e-9) {
            memcpy(fit, f, sizeof fit);
            worst = w;
            got = 1;
        }
    }
    if (got) {
        k->hbm_bw = 1.0 / fit[1];
        k->t_fixed_s = 0;
        k->t_step_s = fit[0];
        k->t_token_s = fit[2];
        snprintf(s->hbm, sizeof s->hbm,
                 "measured: %.4g GB/s effective, fit to %d decode figure%s on %s", k->hbm_bw / 1e9,
                 r.n_dec, r.n_dec == 1 ? "" : "s", on);
        snprintf(
            s->step, sizeof s->step,
            "measured: t_step %.4g ms, t_token %.4g ms (the same fit; worst step time off by %.1f%%)",
            k->t_step_s * 1e3, k->t_token_s * 1e3, worst * 100);
        s->n_measured += 2;
    }

    if (r.pre_tok > 0 && got && r.n_dec > 0) {
        double w = r.dec_bpt[0]; /* the first decode figure: batch 1, short context (decode8b) */
        for (int i = 0; i < r.n_dec; i++)
            if (r.dec_b[i] == 1 && r.dec_ctx[i] < r.dec_ctx[0])
                w = r.dec_bpt[i];
        double params = (r.model_bytes > 0 ? r.model_bytes : w) / 2.0; /* BF16 */
        double t = r.pre_tok / r.pre_tps - k->t_step_s - w / k->hbm_bw;
        if (t > 0) {
            k->flops = 2.0 * params * r.pre_tok / t;
            snprintf(s->flops, sizeof s->flops,
                     "measured: %.4g TFLOP/s effective, prefill of %.0f tokens at %.4g tok/s on %s",
                     k->flops / 1e12, r.pre_tok, r.pre_tps, on);
            s->n_measured++;
        }
    }
    return 0;
}
