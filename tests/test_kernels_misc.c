// Tests of the small kernels that other kernels and the gradient reductions are
// built from (include/moe/kernels.h), kept apart from tests/test_kernels.c:
//   - moe_add_inplace: every element the IEEE sum of its two operands, bit for
//     bit (the reference adds in double and rounds once: exact for a float sum),
//     at lengths around the vector widths and at unaligned offsets, without
//     touching the elements past n; signed zeros and infinities as IEEE says.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "moe/kernels.h"
#include "testutil.h"

static int bits_equal(const float *a, const float *b, size_t n) {
  return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

static void test_add_inplace(void) {
  const size_t lengths[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 1000, 4099};
  for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
    for (size_t off = 0; off < 3; off++) {
      const size_t n = lengths[li], total = n + off + 4;
      // values over many binades, so the sums round (a plain copy would not)
      float *dst = tu_filled(total, 11 + li, -1.0f, 1.0f), *src = tu_filled(total, 97 + li, -1, 1);
      for (size_t i = 0; i < total; i++) src[i] = ldexpf(src[i], (int)(i % 29) - 14);
      float *want = tu_copy_of(dst, total);
      for (size_t i = off; i < off + n; i++) want[i] = (float)((double)dst[i] + (double)src[i]);
      moe_add_inplace(dst + off, src + off, n);
      TU_CHECK(bits_equal(dst, want, total), "add_inplace n=%zu offset %zu: not the IEEE sums", n,
               off);
    }
  }
  // IEEE corner cases: -0 + -0 = -0, -0 + 0 = +0, inf + finite = inf, inf + -inf = NaN
  float d[4] = {-0.0f, -0.0f, INFINITY, INFINITY};
  const float s[4] = {-0.0f, 0.0f, -3.0f, -INFINITY};
  moe_add_inplace(d, s, 4);
  TU_CHECK(d[0] == 0.0f && signbit(d[0]) && d[1] == 0.0f && !signbit(d[1]) && isinf(d[2]) &&
               d[2] > 0 && isnan(d[3]),
           "add_inplace corner cases: %g %g %g %g", (double)d[0], (double)d[1], (double)d[2],
           (double)d[3]);
}

int main(void) {
  test_add_inplace();
  tu_free_all();
  return tu_finish("test_kernels_misc");
}
