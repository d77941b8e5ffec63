/* stats: every counter and gauge declared once (X-macros), expanded for structs, reset, aggregation and reports. */
#include "stats.h"

#include <math.h>

stats_server_t stats_server;

/* bucket i holds values up to 0.01 ms * 1.25^i */
double stats_hist_bound(int i)
{
    return 0.01 * pow(1.25, i);
}

void stats_hist_add(stats_hist_t *h, double ms)
{
    int i = 0;
    if (ms > 0.01)
        i = (int)ceil(log(ms / 0.01) / log(1.25));
    if (i < 0)
        i = 0;
    if (i >= STATS_HIST_BUCKETS)
        i = STATS_HIST_BUCKETS - 1;
    h->b[i]++;
    h->n++;
    h->sum_ms += ms;
}

double stats_hist_quantile(const stats_hist_t *h, double q)
{
    if (!h->n)
        return 0.0;
    uint64_t want = (uint64_t)ceil(q * (double)h->n);
    if (want == 0)
        want = 1;
    uint64_t acc = 0;
    for (int i = 0; i < STATS_HIST_BUCKETS; i++) {
        acc += h->b[i];
        if (acc >= want)
            return stats_hist_bound(i);
    }
    return stats_hist_bound(STATS_HIST_BUCKETS - 1);
}
