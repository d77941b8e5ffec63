/* tu_logits: logits against a reference row (llama.cpp's, recorded as JSON) for the unit tests. */
#include <math.h>

#include "testutil.h"

tu_ref_cmp_t tu_ref_cmp(const float *l, const json_t *row, uint32_t nv)
{
    double mean = 0, var = 0, e2 = 0, top1 = -INFINITY, top2 = -INFINITY;
    uint32_t best = 0;
    for (uint32_t i = 0; i < nv; i++)
        mean += json_number_value(json_array_get(row, i)) / nv;
    for (uint32_t i = 0; i < nv; i++) {
        double r = json_number_value(json_array_get(row, i));
        var += (r - mean) * (r - mean) / nv;
        e2 += (l[i] - r) * (l[i] - r) / nv;
        if (r > top1) {
            top2 = top1;
            top1 = r;
            best = i;
        } else if (r > top2) {
            top2 = r;
        }
    }
    return (tu_ref_cmp_t){.rms = sqrt(e2), .std = sqrt(var), .margin = top1 - top2, .best = best};
}
