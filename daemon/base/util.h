/* util: clocks and small helpers every layer of gpuswapd may use (header only; depends on nothing). */
#ifndef UTIL_H
#define UTIL_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

/* Elements of an array (not a pointer). */
#define UTIL_COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Seconds on CLOCK_MONOTONIC: for intervals and deadlines. */
static inline double util_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Milliseconds on CLOCK_MONOTONIC. */
static inline double util_now_ms(void)
{
    return util_now_s() * 1e3;
}

/* Nanoseconds on CLOCK_MONOTONIC, as an integer (for atomics). */
static inline uint64_t util_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleeps seconds (nothing when <= 0), resumed after signals. */
static inline void util_sleep_s(double seconds)
{
    if (!(seconds > 0))
        return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* Seconds since the epoch on CLOCK_REALTIME: for timestamps shown to people. */
static inline double util_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
