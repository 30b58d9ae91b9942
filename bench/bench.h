/* bench/bench.h - the timing helpers every dt benchmark shares (not part of the library).
   Include after defining _POSIX_C_SOURCE (clock_gettime) and after <stdlib.h> and <time.h>. */
#ifndef DT_BENCH_H
#define DT_BENCH_H

#if defined(__GNUC__) || defined(__clang__)
#define DT_BENCH_FN static __attribute__((unused)) /* a benchmark may use only some */
#else
#define DT_BENCH_FN static
#endif

/* Monotonic wall-clock seconds: never jumps with the system clock. */
DT_BENCH_FN double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

DT_BENCH_FN int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n timings (sorts them in place): machines are noisy, medians are what we quote. */
DT_BENCH_FN double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

#endif
