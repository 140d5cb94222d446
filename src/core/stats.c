// Statistics of repeated measurements (medians and quantiles), shared by the
// measurement harness, the trainer and the benchmarks.
#include <stdlib.h>

#include "moe/core.h"

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double moe_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double moe_quantile_sorted(const double *sorted, int n, double q) {
  const double pos = q * (n - 1);
  const int lo = (int)pos;
  const int hi = lo + 1 < n ? lo + 1 : lo;
  return sorted[lo] + (pos - lo) * (sorted[hi] - sorted[lo]);
}
