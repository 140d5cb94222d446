// Monotonic timers and small numeric helpers shared by every module.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <time.h>

#include "moe/core.h"

uint64_t moe_time_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double moe_time_ms_since(uint64_t start_ns) { return (double)(moe_time_ns() - start_ns) * 1e-6; }

ptrdiff_t moe_find_nonfinite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(x[i])) return (ptrdiff_t)i;
  }
  return -1;
}
