// Tests of the small kernels that other kernels and the gradient reductions are
// built from (include/moe/kernels.h), kept apart from tests/test_kernels.c:
//   - moe_add_inplace: every element the IEEE sum of its two operands, bit for
//     bit (the reference adds in double and rounds once: exact for a float sum),
//     at lengths around the vector widths and at unaligned offsets, without
//     touching the elements past n; signed zeros and infinities as IEEE says;
//   - moe_pairwise_wgrad: bitwise the pairwise tree (moe_pairwise_*, tested in
//     test_kernels) of each slice's own product and column sums, added into dw
//     and db; the alignment property the ranks rely on (two halves of 2^j
//     slices, then their two roots added, give the bits of all slices at
//     once); within 1e-5 of x^T dy in double; db NULL leaves db alone.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "moe/core.h"
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

// The reference: each slice's leaf formed here, summed by moe_pairwise, added to dw / db.
static void wgrad_expect(float *dw, float *db, const float *x, const float *dy, int slices,
                         int rows, int din, int dout) {
  moe_pairwise pw;
  const size_t nw = (size_t)din * dout;
  TU_CHECK(moe_pairwise_init(NULL, &pw, nw + (size_t)dout, slices) == MOE_STATUS_OK, "init");
  for (int q = 0; q < slices; q++) {
    float *leaf = moe_pairwise_leaf(&pw);
    memset(leaf, 0, (nw + (size_t)dout) * sizeof(float));
    moe_gemm(1, 0, din, dout, rows, 1.0f, x + (size_t)q * rows * din, din,
             dy + (size_t)q * rows * dout, dout, 0.0f, leaf, dout);
    moe_bias_add_backward(leaf + nw, dy + (size_t)q * rows * dout, rows, dout);
    moe_pairwise_push(&pw);
  }
  const float *root = moe_pairwise_result(&pw);
  for (size_t i = 0; i < nw; i++) dw[i] += root[i];
  for (int j = 0; j < dout; j++) db[j] += root[nw + (size_t)j];
  moe_pairwise_free(&pw);
}

static void test_pairwise_wgrad(void) {
  const int shapes[][4] = {
      {1, 1, 1, 1}, {3, 5, 7, 9}, {4, 16, 13, 17}, {5, 2, 33, 8}, {8, 9, 6, 3}};
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
    const int slices = shapes[t][0], rows = shapes[t][1], din = shapes[t][2], dout = shapes[t][3];
    const size_t N = (size_t)slices * rows, nw = (size_t)din * dout;
    const float *x = tu_filled(N * din, 3 + t, -1, 1), *dy = tu_filled(N * dout, 5 + t, -1, 1);
    // pre-filled dw and db: the root is added (+=)
    float *dw = tu_filled(nw, 7 + t, -1, 1), *db = tu_filled((size_t)dout, 9 + t, -1, 1);
    float *dw_want = tu_copy_of(dw, nw), *db_want = tu_copy_of(db, (size_t)dout);
    float *dw0 = tu_copy_of(dw, nw), *db0 = tu_copy_of(db, (size_t)dout);
    moe_pairwise pw;
    TU_CHECK(moe_pairwise_init(NULL, &pw, nw + (size_t)dout, slices) == MOE_STATUS_OK, "init");
    moe_pairwise_wgrad(&pw, NULL, dw, db, x, dy, slices, rows, din, dout);
    wgrad_expect(dw_want, db_want, x, dy, slices, rows, din, dout);
    TU_CHECK(bits_equal(dw, dw_want, nw) && bits_equal(db, db_want, (size_t)dout),
             "wgrad %dx%d rows, %dx%d: not the tree of the slices' products", slices, rows, din,
             dout);
    // against x^T dy and the column sums of dy in double
    float *dw_d = tu_fbuf(nw), *db_d = tu_fbuf((size_t)dout);
    for (int j = 0; j < dout; j++) {
      double sb = 0.0;
      for (size_t r = 0; r < N; r++) sb += dy[r * dout + (size_t)j];
      db_d[j] = (float)(db0[j] + sb);
      for (int i = 0; i < din; i++) {
        double s = 0.0;
        for (size_t r = 0; r < N; r++)
          s += (double)x[r * din + (size_t)i] * dy[r * dout + (size_t)j];
        dw_d[(size_t)i * dout + (size_t)j] = (float)(dw0[(size_t)i * dout + (size_t)j] + s);
      }
    }
    tu_allclose("wgrad dw vs double", dw, dw_d, nw, 1e-5, 1e-5);
    tu_allclose("wgrad db vs double", db, db_d, (size_t)dout, 1e-5, 1e-5);
    // without db: the same dw, db untouched
    float *dw2 = tu_copy_of(dw0, nw), *db2 = tu_copy_of(db0, (size_t)dout);
    moe_pairwise_wgrad(&pw, NULL, dw2, NULL, x, dy, slices, rows, din, dout);
    TU_CHECK(bits_equal(dw2, dw, nw) && bits_equal(db2, db0, (size_t)dout),
             "wgrad %d slices without db: dw differs or db touched", slices);
    // alignment: 2^j slices per half (a rank's share), the halves' roots added lo + hi
    if (slices % 2 == 0 && ((slices / 2) & (slices / 2 - 1)) == 0) {
      const int h = slices / 2;
      float *lo = tu_fbuf(nw + (size_t)dout), *hi = tu_fbuf(nw + (size_t)dout);
      float *all = tu_fbuf(nw + (size_t)dout);
      moe_pairwise_wgrad(&pw, NULL, lo, lo + nw, x, dy, h, rows, din, dout);
      moe_pairwise_wgrad(&pw, NULL, hi, hi + nw, x + (size_t)h * rows * din,
                         dy + (size_t)h * rows * dout, h, rows, din, dout);
      moe_add_inplace(lo, hi, nw + (size_t)dout);
      moe_pairwise_wgrad(&pw, NULL, all, all + nw, x, dy, slices, rows, din, dout);
      TU_CHECK(bits_equal(lo, all, nw + (size_t)dout),
               "wgrad: two halves of %d slices do not give the bits of all %d", h, slices);
    }
    moe_pairwise_free(&pw);
  }
}

int main(void) {
  test_add_inplace();
  tu_free_all();
  test_pairwise_wgrad();
  tu_free_all();
  return tu_finish("test_kernels_misc");
}
