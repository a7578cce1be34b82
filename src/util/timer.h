/* timer: monotonic wall clock in milliseconds/seconds. */
#ifndef STRATA_TIMER_H
#define STRATA_TIMER_H
#include <time.h>
static inline double timer_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#endif
