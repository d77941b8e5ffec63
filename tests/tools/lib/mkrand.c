/* mkrand: splitmix64 streams and the uniform values the generators draw from them. */
#include "mkrand.h"

uint64_t mkrand_next(uint64_t *s)
{
    uint64_t z = (*s += MKRAND_GAMMA);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float mkrand_uniform(uint64_t *s, float center, float half)
{
    float u = (float)(mkrand_next(s) >> 40) * (1.0f / 16777216.0f); /* [0,1) */
    return center + half * (2.0f * u - 1.0f);
}
