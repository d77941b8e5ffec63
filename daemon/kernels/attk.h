/* attk: attention's inner loops over an F16 KV cache (a block of queries' scores against K rows, their weighted sum of V rows), portable, AVX2 and AVX-512 as quant's ISA choice says. */
#ifndef ATTK_H
#define ATTK_H

#include <stddef.h>
#include <stdint.h>

/* Floats of scratch attk_scores_f16 needs for rows of hd elements. */
size_t attk_scratch_floats(size_t hd);

/* Scores of nq queries q[j] (hd floats each) against the F16 K rows lo .. hi (row p at
 * k + (p - lo) * k_stride halves): sc[j * cap + p] = dot(q[j], K row p). A score's bits depend on
 * its query and row only, never on nq, lo or hi, so a token scored alone (decode) and in a block
 * (prefill) gets the same number. scratch: attk_scratch_floats(hd) floats. */
void attk_scores_f16(const float *const *q, int nq, const uint16_t *k, size_t k_stride, uint32_t lo,
                     uint32_t hi, size_t hd, float *sc, size_t cap, float *scratch);

/* o[j][i] += w[j][p] * V[p][i] for rows p = 0 .. nrows - 1 in order (V row p at v + p * v_stride
 * halves), i < hd, j < ny: per element the same FMAs in the same order whatever ny, so each
 * output is what it gets alone. */
void attk_values_f16(float *const *o, const float *const *w, int ny, const uint16_t *v,
                     size_t v_stride, size_t nrows, size_t hd);

/* s[i] *= scale for i < n; returns the largest (-INFINITY for n 0). */
float attk_scale_max(float *s, size_t n, float scale);

/* s[i] = s[i] * inv rounded to the nearest half (ties to even), back as a float. */
void attk_mul_round_f16(float *s, size_t n, float inv);

#endif
