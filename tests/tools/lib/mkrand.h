/* mkrand: the reproducible random streams the model and adapter generators draw their weights from (splitmix64). */
#ifndef MKRAND_H
#define MKRAND_H

#include <stdint.h>

/* The state step of a stream: value k comes from state s0 + (k + 1) * MKRAND_GAMMA, so any
 * position of a stream can be reached without generating the rest. */
#define MKRAND_GAMMA 0x9e3779b97f4a7c15ull

/* The next 64 random bits of the stream at *s (splitmix64). */
uint64_t mkrand_next(uint64_t *s);

/* The next value, uniform in [center - half, center + half) (24 random bits). */
float mkrand_uniform(uint64_t *s, float center, float half);

#endif
