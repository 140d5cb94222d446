// Tests of the CPU kernels (include/moe/kernels.h). For every op:
//   - forward against its naive `_ref` over awkward shapes (1 row, 1 column,
//     odd sizes, sizes that are not multiples of the vector/lane widths);
//   - backward against central finite differences of L = sum_i r_i out_i with a
//     fixed random r, and the accumulate (+=) contract on a pre-filled buffer;
//   - hand-computed cases with literal expected numbers, so a mistake shared by
//     a kernel and its `_ref` cannot pass.
// Tolerances (see each test): float kernels against double references use
// ~1e-5 relative (GELU 1e-6 element-wise); finite differences use eps 1e-2
// (3e-3 for the strongly non-linear layernorm input) with atol 5e-5..1e-3 and
// rtol 1e-3..1e-2, chosen from the gradient scale of each op: dropping a term,
// a factor of 2, or even scaling the x phi(x) term of gelu' or the xhat term of
// the layernorm dx by 0.95-0.999 makes these tests fail. GELU's tests run on the
// public functions and on every instruction-set copy the CPU supports (through
// the private hook in src/kernels/kernels_internal.h), and the copies are compared.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_internal.h"
#include "moe/kernels.h"
#include "testutil.h"

// ---- small helpers ---------------------------------------------------------------------

static double dot_d(const float *a, const float *b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
  return s;
}

static int bits_equal(const float *a, const float *b, size_t n) {
  return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

// want = base + delta, element-wise, checked with a tolerance: the accumulate
// contract (backward adds into a pre-filled buffer instead of overwriting).
static void check_accumulated(const char *name, const float *got, const float *base,
                              const float *delta, size_t n) {
  float *want = tu_fbuf(n);
  for (size_t i = 0; i < n; i++) want[i] = base[i] + delta[i];
  tu_allclose(name, got, want, n, 1e-6, 1e-5);
}

// ---- GEMM ---------------------------------------------------------------------------------

static void test_gemm_hand(void) {
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  const float ab[4] = {39, 45, 87, 101};   // 2 * A B + 1
  const float atb[4] = {26, 30, 38, 44};   // A^T B
  const float abt[4] = {17, 23, 39, 53};   // A B^T
  const float atbt[4] = {23, 31, 34, 46};  // A^T B^T
  for (int use_ref = 0; use_ref < 2; use_ref++) {
    void (*gemm)(int, int, int, int, int, float, const float *, int, const float *, int, float,
                 float *, int) = use_ref ? moe_gemm_ref : moe_gemm;
    float c[4] = {1, 1, 1, 1};
    gemm(0, 0, 2, 2, 2, 2.0f, a, 2, b, 2, 1.0f, c, 2);
    tu_allclose(use_ref ? "gemm_ref hand NN" : "gemm hand NN", c, ab, 4, 0, 0);
    gemm(1, 0, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    tu_allclose(use_ref ? "gemm_ref hand TN" : "gemm hand TN", c, atb, 4, 0, 0);
    gemm(0, 1, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    tu_allclose(use_ref ? "gemm_ref hand NT" : "gemm hand NT", c, abt, 4, 0, 0);
    gemm(1, 1, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    tu_allclose(use_ref ? "gemm_ref hand TT" : "gemm hand TT", c, atbt, 4, 0, 0);
  }
}

// All four transpose combinations, padded leading dimensions, alpha/beta not
// 0/1, and a check that padding columns of C are never written.
static void test_gemm_vs_ref(void) {
  static const int shapes[][3] = {{1, 1, 1},      {1, 7, 5},    {6, 1, 3},   {5, 7, 1},
                                  {13, 17, 19},   {33, 40, 65}, {2, 3, 130}, {64, 9, 4},
                                  {129, 33, 300}, {1, 600, 17}, {200, 45, 1}};
  const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
  char name[96];
  for (int s = 0; s < nshapes; s++) {
    const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        const int arows = ta ? k : m, acols = ta ? m : k;
        const int brows = tb ? n : k, bcols = tb ? k : n;
        const int lda = acols + 3, ldb = bcols + 2, ldc = n + 5;
        const float *a = tu_filled((size_t)arows * lda, 100 + s, -1.0f, 1.0f);
        const float *b = tu_filled((size_t)brows * ldb, 200 + s, -1.0f, 1.0f);
        float *c0 = tu_filled((size_t)m * ldc, 300 + s, -1.0f, 1.0f);
        float *c = tu_copy_of(c0, (size_t)m * ldc), *cr = tu_copy_of(c0, (size_t)m * ldc);
        moe_gemm(ta, tb, m, n, k, 0.7f, a, lda, b, ldb, -1.3f, c, ldc);
        moe_gemm_ref(ta, tb, m, n, k, 0.7f, a, lda, b, ldb, -1.3f, cr, ldc);
        // sgemm vs a double-accumulated reference: |error| ~ k * 2^-24 * O(1).
        snprintf(name, sizeof name, "gemm m%d n%d k%d ta%d tb%d", m, n, k, ta, tb);
        tu_allclose(name, c, cr, (size_t)m * ldc, 2e-6 * (k + 1), 1e-5);
        int pad_ok = 1;
        for (int i = 0; i < m; i++) {
          for (int j = n; j < ldc; j++) {
            const size_t o = (size_t)i * ldc + j;
            pad_ok &= c[o] == c0[o] && cr[o] == c0[o];
          }
        }
        TU_CHECK(pad_ok, "%s: wrote into the padding of C", name);
        // the same problem again on other buffers (a backend that caches per
        // shape must use this call's pointers): the same bits
        const float *a2 = tu_copy_of(a, (size_t)arows * lda),
                    *b2 = tu_copy_of(b, (size_t)brows * ldb);
        float *c2 = tu_copy_of(c0, (size_t)m * ldc);
        moe_gemm(ta, tb, m, n, k, 0.7f, a2, lda, b2, ldb, -1.3f, c2, ldc);
        TU_CHECK(bits_equal(c2, c, (size_t)m * ldc), "%s: a second call on copies gives other bits",
                 name);

        // beta = 0 must ignore C entirely, NaN included (BLAS semantics).
        for (size_t i = 0; i < (size_t)m * ldc; i++) c[i] = cr[i] = NAN;
        moe_gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
        moe_gemm_ref(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, cr, ldc);
        int finite = 1;
        for (int i = 0; i < m; i++) {
          for (int j = 0; j < n; j++) finite &= isfinite(c[(size_t)i * ldc + j]) != 0;
        }
        snprintf(name, sizeof name, "gemm beta0 m%d n%d k%d ta%d tb%d", m, n, k, ta, tb);
        TU_CHECK(finite, "%s: NaN in C survived beta = 0", name);
        for (int i = 0; i < m; i++) {
          tu_allclose(name, c + (size_t)i * ldc, cr + (size_t)i * ldc, (size_t)n, 2e-6 * (k + 1),
                      1e-5);
        }
      }
    }
  }
}

// The batch-invariant GEMM (moe_gemm_fixed). For every transpose combination:
//   - close to the double reference (test_gemm_vs_ref runs it too, through
//     moe_gemm on the fixed path);
//   - a row's bits do not depend on the call: the rows computed one at a time
//     and in calls of many sizes at shifted offsets equal one call of 2048 rows
//     bitwise (k above the kernels' blocks of 256 and 512 steps included);
//   - for one small shape, every batch size 1..2048 (rows [r0, r0 + b) at a
//     rotating offset r0) gives the full call's bits;
//   - k split over consecutive calls with beta = 1 equals one call bitwise;
//   - the portable path (fmaf) equals the path this CPU runs, bitwise.
// OpenBLAS fails the row checks (docs/reliability.md has the counts), so a
// kernel swapped for BLAS cannot pass.
static void gemm_fixed_call(int ta, int tb, int rows, int n, int k, const float *a, int lda, int r0,
                            const float *b, int ldb, float beta, float *c, int ldc) {
  // rows [r0, r0 + rows) of op(A): row r of op(A) starts at a + r * lda (N) or a + r (T)
  const float *ar = ta ? a + r0 : a + (size_t)r0 * (size_t)lda;
  moe_gemm_fixed(ta, tb, rows, n, k, 1.0f, ar, lda, b, ldb, beta, c + (size_t)r0 * (size_t)ldc,
                 ldc);
}

static void test_gemm_fixed(void) {
  // k = 1100: three blocks of the AVX2 kernel's 512 and five of the others' 256
  static const int shapes[][2] = {{8, 128}, {16, 512}, {3, 7},    {40, 300},
                                  {130, 5}, {17, 19},  {520, 40}, {24, 1100}};
  char name[96];
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int n = shapes[s][0], k = shapes[s][1], m = 2048;
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        const int lda = ta ? m : k, ldb = tb ? k : n;
        const float *a = tu_filled((size_t)m * k, 400 + (int)s, -1.0f, 1.0f);
        const float *b = tu_filled((size_t)k * n, 500 + (int)s, -1.0f, 1.0f);
        float *c0 = tu_filled((size_t)m * n, 700 + (int)s, -1.0f, 1.0f);
        float *c = tu_copy_of(c0, (size_t)m * n), *cr = tu_copy_of(c0, (size_t)m * n);
        moe_gemm_fixed(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, n);
        moe_gemm_ref(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, cr, n);
        snprintf(name, sizeof name, "gemm_fixed ta%d tb%d n%d k%d", ta, tb, n, k);
        tu_allclose(name, c, cr, (size_t)m * n, 2e-6 * (k + 1), 1e-5);

        float *port = tu_copy_of(c0, (size_t)m * n);
        moe_gemm_fixed_portable(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, port, n);
        TU_CHECK(bits_equal(port, c, (size_t)m * n),
                 "%s: the portable path (fmaf) and the %s path differ", name, moe_gemm_fixed_isa());

        float *one = tu_copy_of(c0, (size_t)m * n), *part = tu_copy_of(c0, (size_t)m * n);
        for (int i = 0; i < m; i++)
          gemm_fixed_call(ta, tb, 1, n, k, a, lda, i, b, ldb, 1.0f, one, n);
        TU_CHECK(bits_equal(one, c, (size_t)m * n),
                 "%s: a row alone gives other bits than in the 2048-row call", name);
        static const int sizes[] = {1, 2, 3, 5, 6, 7, 11, 16, 33, 100, 511, 1024, 2047};
        for (size_t q = 0; q < sizeof sizes / sizeof sizes[0]; q++) {
          memcpy(part, c0, (size_t)m * n * sizeof(float));
          for (int r0 = 0; r0 < m;) {
            // the first call is short by q % 5 rows: every size at shifted offsets
            const int want =
                r0 == 0 && sizes[q] > (int)(q % 5) ? sizes[q] - (int)(q % 5) : sizes[q];
            const int rows = m - r0 < want ? m - r0 : want;
            gemm_fixed_call(ta, tb, rows, n, k, a, lda, r0, b, ldb, 1.0f, part, n);
            r0 += rows;
          }
          TU_CHECK(bits_equal(part, c, (size_t)m * n),
                   "%s: calls of %d rows give other bits than one call", name, sizes[q]);
        }
        // k-continuation: k split at uneven points, beta 1 after the first call
        float *split = tu_copy_of(c0, (size_t)m * n);
        for (int p0 = 0, step = 1; p0 < k; step = step * 3 + 1) {
          const int kc = k - p0 < step ? k - p0 : step;
          const float *ap = ta ? a + (size_t)p0 * (size_t)lda : a + p0;
          const float *bp = tb ? b + p0 : b + (size_t)p0 * (size_t)ldb;
          moe_gemm_fixed(ta, tb, m, n, kc, 1.0f, ap, lda, bp, ldb, 1.0f, split, n);
          p0 += kc;
        }
        TU_CHECK(bits_equal(split, c, (size_t)m * n),
                 "%s: k split over calls gives other bits than one call", name);
        // beta = 0: C is not read (a NaN there does not survive) and the
        // chains start at +0, the same bits as beta = 1 over a zero C (k above
        // the 256-step blocking included: only the first block starts at 0)
        float *nanc = tu_fbuf((size_t)m * n), *zc = tu_fbuf((size_t)m * n);
        for (size_t i = 0; i < (size_t)m * n; i++) nanc[i] = NAN;
        moe_gemm_fixed(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, nanc, n);
        moe_gemm_fixed(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, zc, n);
        TU_CHECK(bits_equal(nanc, zc, (size_t)m * n),
                 "%s: beta 0 over NaN gives other bits than beta 1 over zeros", name);
        // alpha and beta other than 0 and 1: the portable path agrees, and a
        // row alone gives the full call's bits
        float *ab = tu_copy_of(c0, (size_t)m * n), *abp = tu_copy_of(c0, (size_t)m * n);
        float *ab1 = tu_copy_of(c0, (size_t)m * n);
        moe_gemm_fixed(ta, tb, m, n, k, -0.75f, a, lda, b, ldb, 0.5f, ab, n);
        moe_gemm_fixed_portable(ta, tb, m, n, k, -0.75f, a, lda, b, ldb, 0.5f, abp, n);
        TU_CHECK(bits_equal(ab, abp, (size_t)m * n),
                 "%s: alpha -0.75 beta 0.5: the portable path and the %s path differ", name,
                 moe_gemm_fixed_isa());
        for (int i = 0; i < m; i += 97) {
          const float *ar = ta ? a + i : a + (size_t)i * (size_t)lda;
          moe_gemm_fixed(ta, tb, 1, n, k, -0.75f, ar, lda, b, ldb, 0.5f, ab1 + (size_t)i * n, n);
          TU_CHECK(bits_equal(ab1 + (size_t)i * n, ab + (size_t)i * n, (size_t)n),
                   "%s: alpha -0.75 beta 0.5: row %d alone differs", name, i);
        }
      }
    }
  }
  // Every batch size 1..2048 on one small shape: rows [r0, r0 + b) of a
  // 2048-row matrix against the full call (r0 rotates so that every row is
  // covered at many offsets).
  const int m = 2048, n = 17, k = 19;
  const float *a = tu_filled((size_t)m * k, 801, -1.0f, 1.0f);
  const float *b = tu_filled((size_t)k * n, 802, -1.0f, 1.0f);
  float *full = tu_fbuf((size_t)m * n), *got = tu_fbuf((size_t)m * n);
  moe_gemm_fixed(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, full, n);
  int bad = 0;
  for (int bsz = 1; bsz <= m && !bad; bsz++) {
    const int r0 = (bsz * 37) % (m - bsz + 1);
    moe_gemm_fixed(0, 0, bsz, n, k, 1.0f, a + (size_t)r0 * k, k, b, n, 0.0f, got, n);
    if (!bits_equal(got, full + (size_t)r0 * n, (size_t)bsz * n)) bad = bsz;
  }
  TU_CHECK(!bad, "gemm_fixed: a batch of %d rows gives other bits than the 2048-row call", bad);
}

// The bf16 GEMM (moe_gemm_bf16) against the chain its header documents,
// written out naively here: the native kernel (AVX512_BF16 where the CPU has
// it) and the portable one must both give its bits, for every transpose, with
// alpha and beta, at every batch size, split over k at even points, and with
// operands whose products are subnormal or huge (the flushes and DAZ/FTZ).
static float bf16_in_t(float x) {
  if (fpclassify(x) == FP_SUBNORMAL) return copysignf(0.0f, x);
  return moe_bf16_to_float(moe_bf16_round(x));
}

static float flush_t(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

static void gemm_bf16_naive(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                            int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      float *cij = c + (size_t)i * ldc + j;
      float acc = beta == 0.0f ? 0.0f : beta == 1.0f ? *cij : *cij * beta;
      for (int p = 0; p < k; p += 2) {
        float av[2] = {0, 0}, bv[2] = {0, 0};
        for (int h = 0; h < 2 && p + h < k; h++) {
          const int q = p + h;
          av[h] = bf16_in_t(ta ? a[(size_t)q * lda + i] : a[(size_t)i * lda + q]);
          bv[h] = bf16_in_t(alpha * (tb ? b[(size_t)j * ldb + q] : b[(size_t)q * ldb + j]));
        }
        acc = flush_t(fmaf(av[0], bv[0], flush_t(fmaf(av[1], bv[1], flush_t(acc)))));
      }
      *cij = acc;
    }
  }
}

// Every 5th value tiny (products subnormal), every 11th huge, every 13th a
// subnormal float.
static float *filled_extreme(size_t n, uint64_t seed) {
  float *x = tu_filled(n, seed, -1.0f, 1.0f);
  for (size_t i = 0; i < n; i++) {
    if (i % 5 == 3) x[i] = ldexpf(x[i], -70);
    if (i % 11 == 7) x[i] = ldexpf(x[i], 60);
    if (i % 13 == 5) x[i] = ldexpf(x[i], -132);
  }
  return x;
}

static void test_gemm_bf16(void) {
  printf("gemm_bf16: the %s kernel\n", moe_gemm_bf16_isa());
  static const int shapes[][3] = {{300, 8, 128},  {300, 16, 512}, {300, 3, 7},
                                  {300, 40, 300}, {300, 130, 5},  {300, 17, 19},
                                  {300, 520, 40}, {1, 33, 1},     {9, 600, 257}};
  char name[96];
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        const int lda = ta ? m : k, ldb = tb ? k : n;
        const int extreme = (int)(s % 2);
        const float *a = extreme ? filled_extreme((size_t)m * k, 1400 + s)
                                 : tu_filled((size_t)m * k, 1400 + s, -1.0f, 1.0f);
        const float *b = extreme ? filled_extreme((size_t)k * n, 1500 + s)
                                 : tu_filled((size_t)k * n, 1500 + s, -1.0f, 1.0f);
        float *c0 = tu_filled((size_t)m * n, 1700 + s, -1.0f, 1.0f);
        snprintf(name, sizeof name, "gemm_bf16 m%d n%d k%d ta%d tb%d", m, n, k, ta, tb);
        // alpha, beta general; then beta 1 (accumulate), then beta 0 over NaN
        const float alphas[3] = {-0.75f, 1.0f, 1.0f}, betas[3] = {0.5f, 1.0f, 0.0f};
        for (int v = 0; v < 3; v++) {
          float *want = tu_copy_of(c0, (size_t)m * n), *got = tu_copy_of(c0, (size_t)m * n);
          float *port = tu_copy_of(c0, (size_t)m * n);
          if (betas[v] == 0.0f) {
            for (size_t i = 0; i < (size_t)m * n; i++) got[i] = port[i] = NAN;
          }
          gemm_bf16_naive(ta, tb, m, n, k, alphas[v], a, lda, b, ldb, betas[v], want, n);
          moe_gemm_bf16(ta, tb, m, n, k, alphas[v], a, lda, b, ldb, betas[v], got, n);
          moe_gemm_bf16_portable(ta, tb, m, n, k, alphas[v], a, lda, b, ldb, betas[v], port, n);
          TU_CHECK(bits_equal(got, want, (size_t)m * n),
                   "%s alpha %g beta %g: the %s kernel differs from the documented chain", name,
                   (double)alphas[v], (double)betas[v], moe_gemm_bf16_isa());
          TU_CHECK(bits_equal(port, want, (size_t)m * n),
                   "%s alpha %g beta %g: the portable kernel differs from the documented chain",
                   name, (double)alphas[v], (double)betas[v]);
        }
        // batch invariance: calls of many sizes at shifted offsets equal one call
        float *full = tu_copy_of(c0, (size_t)m * n), *part = tu_copy_of(c0, (size_t)m * n);
        moe_gemm_bf16(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, full, n);
        static const int sizes[] = {1, 2, 5, 7, 8, 9, 33, 129};
        for (size_t q = 0; q < sizeof sizes / sizeof sizes[0]; q++) {
          memcpy(part, c0, (size_t)m * n * sizeof(float));
          for (int r0 = 0; r0 < m;) {
            const int rows = m - r0 < sizes[q] ? m - r0 : sizes[q];
            const float *ar = ta ? a + r0 : a + (size_t)r0 * lda;
            moe_gemm_bf16(ta, tb, rows, n, k, 1.0f, ar, lda, b, ldb, 1.0f, part + (size_t)r0 * n,
                          n);
            r0 += rows;
          }
          TU_CHECK(bits_equal(part, full, (size_t)m * n),
                   "%s: calls of %d rows give other bits than one call", name, sizes[q]);
        }
        // k split at even points over calls (beta 1 after the first)
        memcpy(part, c0, (size_t)m * n * sizeof(float));
        for (int p0 = 0, step = 2; p0 < k; step += 6) {
          const int kc = k - p0 < step ? k - p0 : step;
          const float *ap = ta ? a + (size_t)p0 * lda : a + p0;
          const float *bp = tb ? b + p0 : b + (size_t)p0 * ldb;
          moe_gemm_bf16(ta, tb, m, n, kc, 1.0f, ap, lda, bp, ldb, 1.0f, part, n);
          p0 += kc;
        }
        TU_CHECK(bits_equal(part, full, (size_t)m * n),
                 "%s: k split at even points gives other bits than one call", name);
        tu_free_all();
      }
    }
  }
  // accuracy: within bf16 rounding of the double reference (inputs in [-1, 1])
  const int m = 64, n = 48, k = 200;
  const float *a = tu_filled((size_t)m * k, 1801, -1.0f, 1.0f);
  const float *b = tu_filled((size_t)k * n, 1802, -1.0f, 1.0f);
  float *c = tu_fbuf((size_t)m * n), *cr = tu_fbuf((size_t)m * n);
  moe_gemm_bf16(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  moe_gemm_ref(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, cr, n);
  double worst = 0;
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      double bound = 0;  // 2^-8 * sum |a b| (two roundings of 2^-9 each) + fp32 accumulation
      for (int p = 0; p < k; p++) bound += fabs((double)a[i * k + p] * b[p * n + j]);
      bound = bound * (ldexp(1.0, -8) + k * ldexp(1.0, -24));
      const double err = fabs((double)c[i * n + j] - cr[i * n + j]);
      if (err / bound > worst) worst = err / bound;
    }
  }
  printf("gemm_bf16: worst |error| / (2^-8 sum|ab| + k 2^-24 sum|ab|) = %.3f\n", worst);
  TU_CHECK(worst <= 1.0, "gemm_bf16: error %.3f x the bf16 bound", worst);
}

// moe_pairwise_*: the tree over leaves, checked against a recursive definition,
// and its alignment property: the sum of leaves [k 2^j, (k+1) 2^j) pushed
// alone, then combined as leaves of a smaller tree, gives the same bits as all
// leaves pushed at once (what ranks holding 2^j sequences each rely on).
static void pairwise_expect(float *out, const float *leaves, size_t n, int lo, int count) {
  if (count == 1) {
    memcpy(out, leaves + (size_t)lo * n, n * sizeof(float));
    return;
  }
  int half = 1;
  while (half * 2 < count) half *= 2;
  float *hi = tu_fbuf(n);
  pairwise_expect(out, leaves, n, lo, half);
  pairwise_expect(hi, leaves, n, lo + half, count - half);
  for (size_t i = 0; i < n; i++) out[i] = out[i] + hi[i];
}

static void test_pairwise(void) {
  moe_ctx *ctx = NULL;
  TU_CHECK(moe_ctx_create(&ctx) == MOE_STATUS_OK, "ctx");
  const size_t n = 37;
  float *leaves = tu_fbuf(n * 64);
  for (size_t i = 0; i < n * 64; i++) {
    leaves[i] = ldexpf(tu_filled(1, 900 + i, -1.0f, 1.0f)[0], (int)(i % 17) - 8);
  }
  float *want = tu_fbuf(n);
  moe_pairwise pw;
  TU_CHECK(moe_pairwise_init(ctx, &pw, n, 64) == MOE_STATUS_OK, "pairwise init");
  for (int count = 1; count <= 64; count++) {
    moe_pairwise_reset(&pw, n);
    for (int l = 0; l < count; l++) {
      memcpy(moe_pairwise_leaf(&pw), leaves + (size_t)l * n, n * sizeof(float));
      moe_pairwise_push(&pw);
    }
    pairwise_expect(want, leaves, n, 0, count);
    TU_CHECK(bits_equal(moe_pairwise_result(&pw), want, n),
             "pairwise: %d leaves differ from the tree", count);
  }
  // alignment: 4 blocks of 8 leaves, each block's sum a leaf of a 4-leaf tree
  float *blocks = tu_fbuf(n * 4);
  for (int b = 0; b < 4; b++) {
    moe_pairwise_reset(&pw, n);
    for (int l = 0; l < 8; l++) {
      memcpy(moe_pairwise_leaf(&pw), leaves + (size_t)(b * 8 + l) * n, n * sizeof(float));
      moe_pairwise_push(&pw);
    }
    memcpy(blocks + (size_t)b * n, moe_pairwise_result(&pw), n * sizeof(float));
  }
  float *two = tu_fbuf(n);
  pairwise_expect(two, blocks, n, 0, 4);
  pairwise_expect(want, leaves, n, 0, 32);
  TU_CHECK(bits_equal(two, want, n), "pairwise: 4 blocks of 8 do not give the 32-leaf tree");
  // no leaves: zeros; a smaller n after reset
  moe_pairwise_reset(&pw, 3);
  const float *z = moe_pairwise_result(&pw);
  TU_CHECK(z[0] == 0.0f && z[1] == 0.0f && z[2] == 0.0f, "pairwise: empty sum is not 0");
  moe_pairwise_free(&pw);
  TU_CHECK(moe_pairwise_init(ctx, &pw, n, 0) == MOE_STATUS_INVALID_ARG,
           "pairwise: 0 leaves accepted");
  moe_pairwise_free(&pw);  // a failed init leaves nothing to free: a no-op
  moe_ctx_destroy(ctx);
}

static void test_gemm_empty(void) {
  // k == 0: C = beta * C, and A, B are never read (NULL is fine).
  float c[6] = {1, 2, 3, 4, 5, 6}, want[6] = {0.5f, 1, 1.5f, 2, 2.5f, 3};
  float cr[6] = {1, 2, 3, 4, 5, 6};
  moe_gemm(0, 0, 2, 3, 0, 1.0f, NULL, 1, NULL, 3, 0.5f, c, 3);
  moe_gemm_ref(0, 0, 2, 3, 0, 1.0f, NULL, 1, NULL, 3, 0.5f, cr, 3);
  tu_allclose("gemm k=0 beta=0.5", c, want, 6, 0, 0);
  tu_allclose("gemm_ref k=0 beta=0.5", cr, want, 6, 0, 0);

  // k == 0, beta == 0: exact zeros even over NaN, padding untouched.
  float cn[8] = {NAN, NAN, NAN, 7, NAN, NAN, NAN, 7};
  const float zeros_pad[8] = {0, 0, 0, 7, 0, 0, 0, 7};
  moe_gemm(1, 1, 2, 3, 0, 2.0f, NULL, 2, NULL, 1, 0.0f, cn, 4);
  TU_CHECK(bits_equal(cn, zeros_pad, 8), "gemm k=0 beta=0 must write exact +0");
  float cnr[8] = {NAN, NAN, NAN, 7, NAN, NAN, NAN, 7};
  moe_gemm_ref(1, 1, 2, 3, 0, 2.0f, NULL, 2, NULL, 1, 0.0f, cnr, 4);
  TU_CHECK(bits_equal(cnr, zeros_pad, 8), "gemm_ref k=0 beta=0 must write exact +0");

  // m == 0 or n == 0: nothing is touched.
  float keep[4] = {1, 2, 3, 4};
  const float a[4] = {1, 1, 1, 1}, keep_want[4] = {1, 2, 3, 4};
  moe_gemm(0, 0, 0, 2, 2, 1.0f, a, 2, a, 2, 0.0f, keep, 2);
  moe_gemm(0, 0, 2, 0, 2, 1.0f, a, 2, a, 2, 0.0f, keep, 2);
  moe_gemm_ref(0, 0, 0, 2, 2, 1.0f, a, 2, a, 2, 0.0f, keep, 2);
  moe_gemm_ref(0, 0, 2, 0, 2, 1.0f, a, 2, a, 2, 0.0f, keep, 2);
  TU_CHECK(bits_equal(keep, keep_want, 4), "gemm with m or n = 0 wrote to C");
}

// ---- linear -------------------------------------------------------------------------------

typedef struct {
  const float *x, *w, *b, *r;
  float *y;
  int n, din, dout;
} linear_fd;

static double linear_loss(void *u) {
  linear_fd *c = u;
  moe_linear_forward(c->y, c->x, c->w, c->b, c->n, c->din, c->dout);
  return dot_d(c->r, c->y, (size_t)c->n * c->dout);
}

static void test_linear(void) {
  static const int shapes[][3] = {{1, 5, 3}, {7, 1, 4}, {9, 6, 1}, {16, 33, 20}, {3, 0, 4}};
  char name[96];
  for (int s = 0; s < 5; s++) {
    const int n = shapes[s][0], din = shapes[s][1], dout = shapes[s][2];
    const size_t nx = (size_t)n * din, nw = (size_t)din * dout, ny = (size_t)n * dout;
    float *x = tu_filled(nx, 11 + s, -1, 1), *w = tu_filled(nw, 12 + s, -1, 1);
    float *b = tu_filled((size_t)dout, 13 + s, -1, 1);
    for (int with_b = 0; with_b < 2; with_b++) {
      const float *bb = with_b ? b : NULL;
      float *y = tu_filled(ny, 14, -5, 5), *yr = tu_filled(ny, 15, -5, 5);  // overwritten
      moe_linear_forward(y, x, w, bb, n, din, dout);
      moe_linear_forward_ref(yr, x, w, bb, n, din, dout);
      snprintf(name, sizeof name, "linear fwd n%d din%d dout%d bias%d", n, din, dout, with_b);
      tu_allclose(name, y, yr, ny, 2e-6 * (din + 1), 1e-5);
    }
    if (din == 0) {
      float *y = tu_filled(ny, 16, -5, 5);
      moe_linear_forward(y, x, w, b, n, din, dout);
      int ok = 1;
      for (int i = 0; i < n; i++) ok &= bits_equal(y + (size_t)i * dout, b, (size_t)dout);
      TU_CHECK(ok, "linear with din = 0 must give y = b");
      continue;
    }

    // Backward from zero, then from a pre-filled buffer.
    float *r = tu_filled(ny, 17 + s, -1, 1);
    float *dx = tu_fbuf(nx), *dw = tu_fbuf(nw), *db = tu_fbuf((size_t)dout);
    moe_linear_backward(dx, dw, db, r, x, w, n, din, dout);
    linear_fd c = {x, w, b, r, tu_fbuf(ny), n, din, dout};
    snprintf(name, sizeof name, "linear dx n%d din%d dout%d", n, din, dout);
    tu_fd_check(name, linear_loss, &c, x, dx, nx, 1e-2f, 1e-3, 1e-2);
    snprintf(name, sizeof name, "linear dw n%d din%d dout%d", n, din, dout);
    tu_fd_check(name, linear_loss, &c, w, dw, nw, 1e-2f, 1e-3, 1e-2);
    snprintf(name, sizeof name, "linear db n%d din%d dout%d", n, din, dout);
    tu_fd_check(name, linear_loss, &c, b, db, (size_t)dout, 1e-2f, 1e-3, 1e-2);

    float *dx0 = tu_filled(nx, 18, -1, 1), *dw0 = tu_filled(nw, 19, -1, 1);
    float *db0 = tu_filled((size_t)dout, 20, -1, 1);
    float *dx1 = tu_copy_of(dx0, nx), *dw1 = tu_copy_of(dw0, nw),
          *db1 = tu_copy_of(db0, (size_t)dout);
    moe_linear_backward(dx1, dw1, db1, r, x, w, n, din, dout);
    check_accumulated("linear dx accumulates", dx1, dx0, dx, nx);
    check_accumulated("linear dw accumulates", dw1, dw0, dw, nw);
    check_accumulated("linear db accumulates", db1, db0, db, (size_t)dout);

    // dx and db may be NULL; dw is still produced.
    float *dw2 = tu_fbuf(nw);
    moe_linear_backward(NULL, dw2, NULL, r, x, w, n, din, dout);
    tu_allclose("linear dw with dx, db NULL", dw2, dw, nw, 0, 0);
  }
}

// ---- bias add -------------------------------------------------------------------------------

typedef struct {
  const float *y0, *b, *r;
  float *y;
  int n, d;
} bias_fd;

static double bias_loss(void *u) {
  bias_fd *c = u;
  const size_t ny = (size_t)c->n * c->d;
  memcpy(c->y, c->y0, ny * sizeof(float));
  moe_bias_add_forward(c->y, c->b, c->n, c->d);
  return dot_d(c->r, c->y, ny);
}

static void test_bias(void) {
  // 130 x 600 spans several row and column blocks of the blocked column sum.
  static const int shapes[][2] = {{1, 1}, {1, 7}, {9, 1}, {13, 37}, {130, 600}};
  char name[64];
  for (int s = 0; s < 5; s++) {
    const int n = shapes[s][0], d = shapes[s][1];
    const size_t ny = (size_t)n * d;
    float *y0 = tu_filled(ny, 30 + s, -1, 1), *b = tu_filled((size_t)d, 31 + s, -1, 1);
    float *y = tu_copy_of(y0, ny), *yr = tu_copy_of(y0, ny);
    moe_bias_add_forward(y, b, n, d);
    moe_bias_add_forward_ref(yr, b, n, d);
    snprintf(name, sizeof name, "bias fwd n%d d%d", n, d);
    tu_allclose(name, y, yr, ny, 0, 0);  // one float add each: identical

    // Backward: column sums against double sums, then FD and accumulation.
    float *dy = tu_filled(ny, 32 + s, -1, 1), *db = tu_filled((size_t)d, 33, -1, 1);
    float *db0 = tu_copy_of(db, (size_t)d), *want = tu_fbuf((size_t)d);
    for (int j = 0; j < d; j++) {
      double sum = db0[j];
      for (int i = 0; i < n; i++) sum += dy[(size_t)i * d + j];
      want[j] = (float)sum;
    }
    moe_bias_add_backward(db, dy, n, d);
    snprintf(name, sizeof name, "bias bwd (accumulating) n%d d%d", n, d);
    tu_allclose(name, db, want, (size_t)d, 1e-7 * (n + 10), 1e-6);
    if (ny <= 1000) {
      float *db2 = tu_fbuf((size_t)d);
      moe_bias_add_backward(db2, dy, n, d);
      bias_fd c = {y0, b, dy, tu_fbuf(ny), n, d};
      snprintf(name, sizeof name, "bias db FD n%d d%d", n, d);
      tu_fd_check(name, bias_loss, &c, b, db2, (size_t)d, 1e-2f, 1e-3, 1e-2);
    }
  }
}

// ---- activations ---------------------------------------------------------------------------

static double gelu_d(double x) { return 0.5 * x * erfc(-x * 0.70710678118654752440); }
static double gelu_grad_d(double x) {
  return 0.5 * erfc(-x * 0.70710678118654752440) + x * exp(-0.5 * x * x) * 0.39894228040143267794;
}

// The GELU under test: the public functions (g_gelu_isa < 0, the copy this CPU
// picks), or one instruction-set copy through the private hook in
// kernels/kernels_internal.h, so every copy the CPU supports gets the same tests.
static int g_gelu_isa = -1;

static void gelu_fwd(float *y, const float *x, size_t n) {
  if (g_gelu_isa < 0) {
    moe_gelu_forward(y, x, n);
    return;
  }
  const int rc = moe_gelu_run_isa(g_gelu_isa, MOE_GELU_FORWARD, y, NULL, x, n);
  TU_CHECK(rc == 0, "moe_gelu_run_isa(%s, forward) failed", moe_gelu_isa_name(g_gelu_isa));
}

static void gelu_bwd(float *dx, const float *dy, const float *x, size_t n) {
  if (g_gelu_isa < 0) {
    moe_gelu_backward(dx, dy, x, n);
    return;
  }
  const int rc = moe_gelu_run_isa(g_gelu_isa, MOE_GELU_BACKWARD, dx, dy, x, n);
  TU_CHECK(rc == 0, "moe_gelu_run_isa(%s, backward) failed", moe_gelu_isa_name(g_gelu_isa));
}

// Check names prefixed with the copy under test ("gelu[avx2+fma] ...").
static const char *gelu_name(const char *what) {
  static char buf[128];
  snprintf(buf, sizeof buf, "gelu[%s] %s",
           g_gelu_isa < 0 ? "public" : moe_gelu_isa_name(g_gelu_isa), what);
  return buf;
}

typedef struct {
  const float *x, *r;
  float *y;
  size_t n;
  int relu;
} act_fd;

static double act_loss(void *u) {
  act_fd *c = u;
  if (c->relu) {
    moe_relu_forward(c->y, c->x, c->n);
  } else {
    gelu_fwd(c->y, c->x, c->n);
  }
  return dot_d(c->r, c->y, c->n);
}

// The dense sweep of the GELU tests: [-10, 10] in steps of 2^-12 (~2.4e-4:
// 81921 points, every one through the vector loops).
#define GELU_SWEEP_N 81921
static float gelu_sweep_x(size_t i) { return -10.0f + (float)i * (1.0f / 4096.0f); }

// The GELU tests, on the copy selected by g_gelu_isa.
static void test_gelu_copy(void) {
  // Dense sweep, element-wise within 1e-6 relative of the double
  // 0.5 x erfc(-x / sqrt 2); plus the `_ref` itself against that definition.
  const size_t n = GELU_SWEEP_N;
  float *x = tu_fbuf(n), *y = tu_fbuf(n), *yr = tu_fbuf(n), *want = tu_fbuf(n);
  for (size_t i = 0; i < n; i++) {
    x[i] = gelu_sweep_x(i);
    want[i] = (float)gelu_d(x[i]);
  }
  gelu_fwd(y, x, n);
  moe_gelu_forward_ref(yr, x, n);
  tu_allclose(gelu_name("fwd vs exact on [-10, 10]"), y, want, n, 1e-37, 1e-6);
  tu_allclose(gelu_name("fwd vs ref on [-10, 10]"), y, yr, n, 1e-37, 1e-6);
  // Literal values of x Phi(x) (from Python's math.erfc in double).
  const float lx[5] = {1.0f, -1.0f, 2.0f, -3.0f, 0.5f};
  const float lwant[5] = {0.8413447460685429f, -0.15865525393145707f, 1.9544997361036416f,
                          -0.004049694094890287f, 0.34573123063700656f};
  float ly[5], lyr[5];
  gelu_fwd(ly, lx, 5);
  moe_gelu_forward_ref(lyr, lx, 5);
  tu_allclose(gelu_name("literal values"), ly, lwant, 5, 0, 1e-6);
  if (g_gelu_isa < 0) tu_allclose("gelu_ref literal values", lyr, lwant, 5, 0, 1e-7);

  // Random values, odd lengths (vector tails), and in place == out of place.
  static const size_t lens[] = {1, 3, 17, 1001};
  for (int s = 0; s < 4; s++) {
    float *xs = tu_filled(lens[s], 40 + s, -6, 6), *ys = tu_fbuf(lens[s]), *yrs = tu_fbuf(lens[s]);
    gelu_fwd(ys, xs, lens[s]);
    moe_gelu_forward_ref(yrs, xs, lens[s]);
    tu_allclose(gelu_name("fwd random"), ys, yrs, lens[s], 1e-37, 1e-6);
    gelu_fwd(xs, xs, lens[s]);
    TU_CHECK(bits_equal(xs, ys, lens[s]), "%s (n=%zu)",
             gelu_name("in place differs from out of place"), lens[s]);
  }

  // Special values: +-0, +-inf, NaN, beyond the tail cut-off, denormals.
  const float sx[] = {0.0f,  -0.0f,  INFINITY, -INFINITY, NAN,    30.0f,  -30.0f,
                      1e30f, -1e30f, 12.5f,    -12.5f,    1e-40f, -1e-40f};
  const size_t ns = sizeof sx / sizeof sx[0];
  float sy[sizeof sx / sizeof sx[0]], sg[sizeof sx / sizeof sx[0]], ones[sizeof sx / sizeof sx[0]];
  for (size_t i = 0; i < ns; i++) {
    sg[i] = 0.0f;
    ones[i] = 1.0f;
  }
  gelu_fwd(sy, sx, ns);
  gelu_bwd(sg, ones, sx, ns);
  TU_CHECK(sy[0] == 0.0f && sy[1] == 0.0f, "%s", gelu_name("(+-0) = 0"));
  TU_CHECK(sy[2] == INFINITY && sy[3] == 0.0f, "%s: %g %g", gelu_name("(inf) = inf, (-inf) = 0"),
           sy[2], sy[3]);
  TU_CHECK(isnan(sy[4]) && isnan(sg[4]), "%s", gelu_name("fwd and bwd of NaN are NaN"));
  TU_CHECK(sy[5] == 30.0f && sy[6] == 0.0f && sy[7] == 1e30f && sy[8] == 0.0f, "%s: %g %g %g %g",
           gelu_name("far tails"), sy[5], sy[6], sy[7], sy[8]);
  TU_CHECK(sy[9] == 12.5f && fabsf(sy[10]) < 1e-30f, "%s: %g %g", gelu_name("(+-12.5)"), sy[9],
           sy[10]);
  // Below -12 the result is -0 by design (activation.c).
  TU_CHECK(sy[3] == 0.0f && signbit(sy[3]) && sy[6] == 0.0f && signbit(sy[6]) && sy[8] == 0.0f &&
               signbit(sy[8]) && sy[10] == 0.0f && signbit(sy[10]),
           "%s: %g %g %g %g", gelu_name("(x < -12) = -0"), sy[3], sy[6], sy[8], sy[10]);
  TU_CHECK(fabsf(sy[11] - 0.5e-40f) < 1e-44f && fabsf(sy[12] + 0.5e-40f) < 1e-44f, "%s: %g %g",
           gelu_name("(denormal) = x/2"), sy[11], sy[12]);
  TU_CHECK(sg[0] == 0.5f && sg[1] == 0.5f && sg[2] == 1.0f && sg[3] == 0.0f && sg[5] == 1.0f &&
               sg[6] == 0.0f && sg[9] == 1.0f && fabsf(sg[10]) < 1e-30f,
           "%s: %g %g %g %g %g %g", gelu_name("bwd specials"), sg[0], sg[2], sg[3], sg[5], sg[6],
           sg[10]);

  // Backward against the analytic derivative in double over the sweep, with
  // dy = 1 and accumulation onto 0.25.
  float *dx = tu_fbuf(n), *dy = tu_fbuf(n), *gwant = tu_fbuf(n);
  for (size_t i = 0; i < n; i++) {
    dx[i] = 0.25f;
    dy[i] = 1.0f;
    gwant[i] = (float)(0.25 + gelu_grad_d(x[i]));
  }
  gelu_bwd(dx, dy, x, n);
  tu_allclose(gelu_name("bwd vs analytic (accumulated onto 0.25)"), dx, gwant, n, 1e-6, 1e-6);

  // And against finite differences of L = sum r gelu(x).
  const size_t nf = 301;
  float *xf = tu_filled(nf, 45, -5, 5), *r = tu_filled(nf, 46, -1, 1), *g = tu_fbuf(nf);
  gelu_bwd(g, r, xf, nf);
  act_fd c = {xf, r, tu_fbuf(nf), nf, 0};
  tu_fd_check(gelu_name("dx FD"), act_loss, &c, xf, g, nf, 1e-2f, 1e-3, 1e-2);

  // The errors themselves, for the log: forward relative to the double
  // definition, gelu' (from 0, dy = 1) absolute (it crosses 0 near x = -0.75).
  double fwd_rel = 0.0, bwd_abs = 0.0;
  float fwd_at = 0.0f, bwd_at = 0.0f;
  float *g1 = tu_fbuf(n);
  gelu_bwd(g1, dy, x, n);
  for (size_t i = 0; i < n; i++) {
    const double w = gelu_d(x[i]);
    const double e = w != 0.0 ? fabs((double)y[i] - w) / fabs(w) : fabs((double)y[i]);
    const double eg = fabs((double)g1[i] - gelu_grad_d(x[i]));
    if (e > fwd_rel) {
      fwd_rel = e;
      fwd_at = x[i];
    }
    if (eg > bwd_abs) {
      bwd_abs = eg;
      bwd_at = x[i];
    }
  }
  printf("%s: max rel err %.3g (x = %.9g); gelu' max abs err %.3g (x = %.9g)\n",
         gelu_name("fwd on [-10, 10]"), fwd_rel, fwd_at, bwd_abs, bwd_at);
}

// Every instruction-set copy this CPU supports, then the copies against each
// other and the public functions against the copy they should pick.
static void test_gelu(void) {
  g_gelu_isa = -1;
  test_gelu_copy();

  const unsigned mask = moe_gelu_isa_mask();
  TU_CHECK(mask & (1u << MOE_GELU_ISA_BASE), "gelu: baseline copy missing from mask 0x%x", mask);
  int widest = MOE_GELU_ISA_BASE;
  for (int isa = 0; isa < MOE_GELU_ISA_COUNT; isa++) {
    if (!((mask >> isa) & 1u)) {
      printf("gelu[%s]: not supported by this CPU or build, not tested\n", moe_gelu_isa_name(isa));
      continue;
    }
    widest = isa;
    g_gelu_isa = isa;
    test_gelu_copy();
  }
  g_gelu_isa = -1;

  // An unsupported copy or unknown op is refused and writes nothing.
  float probe_x[2] = {1.0f, -1.0f}, probe_y[2] = {7.0f, 7.0f};
  const float sevens[2] = {7.0f, 7.0f};
  TU_CHECK(
      moe_gelu_run_isa(MOE_GELU_ISA_COUNT, MOE_GELU_FORWARD, probe_y, NULL, probe_x, 2) == -1 &&
          moe_gelu_run_isa(-1, MOE_GELU_FORWARD, probe_y, NULL, probe_x, 2) == -1 &&
          moe_gelu_run_isa(MOE_GELU_ISA_BASE, 7, probe_y, NULL, probe_x, 2) == -1 &&
          bits_equal(probe_y, sevens, 2),
      "moe_gelu_run_isa must refuse an unknown copy or op");
  for (int isa = 0; isa < MOE_GELU_ISA_COUNT; isa++) {
    if (!((mask >> isa) & 1u)) {
      TU_CHECK(moe_gelu_run_isa(isa, MOE_GELU_FORWARD, probe_y, NULL, probe_x, 2) == -1 &&
                   bits_equal(probe_y, sevens, 2),
               "moe_gelu_run_isa ran %s, which the mask says is unsupported",
               moe_gelu_isa_name(isa));
    }
  }

  // Copies agree within the accuracy tolerance (they may differ in the last
  // bits where a compiler contracts to FMA), over the sweep and random inputs;
  // the public functions are bit for bit the widest supported copy.
  const size_t n = GELU_SWEEP_N, nr = 4099;
  float *x = tu_fbuf(n + nr), *dy = tu_fbuf(n + nr), *dx0 = tu_fbuf(n + nr);
  for (size_t i = 0; i < n; i++) x[i] = gelu_sweep_x(i);
  tu_fill(x + n, nr, 47, -13, 13);
  tu_fill(dy, n + nr, 48, -2, 2);
  tu_fill(dx0, n + nr, 49, -1, 1);
  float *yb = tu_fbuf(n + nr), *gb = tu_copy_of(dx0, n + nr);
  moe_gelu_run_isa(MOE_GELU_ISA_BASE, MOE_GELU_FORWARD, yb, NULL, x, n + nr);
  moe_gelu_run_isa(MOE_GELU_ISA_BASE, MOE_GELU_BACKWARD, gb, dy, x, n + nr);
  char name[96];
  for (int isa = 0; isa < MOE_GELU_ISA_COUNT; isa++) {
    if (!((mask >> isa) & 1u)) continue;
    float *y = tu_fbuf(n + nr), *g = tu_copy_of(dx0, n + nr);
    moe_gelu_run_isa(isa, MOE_GELU_FORWARD, y, NULL, x, n + nr);
    moe_gelu_run_isa(isa, MOE_GELU_BACKWARD, g, dy, x, n + nr);
    snprintf(name, sizeof name, "gelu fwd %s vs baseline", moe_gelu_isa_name(isa));
    tu_allclose(name, y, yb, n + nr, 1e-37, 1e-6);
    snprintf(name, sizeof name, "gelu bwd %s vs baseline", moe_gelu_isa_name(isa));
    tu_allclose(name, g, gb, n + nr, 1e-6, 1e-6);
    if (isa != widest) continue;
    float *yp = tu_fbuf(n + nr), *gp = tu_copy_of(dx0, n + nr);
    moe_gelu_forward(yp, x, n + nr);
    moe_gelu_backward(gp, dy, x, n + nr);
    TU_CHECK(bits_equal(yp, y, n + nr) && bits_equal(gp, g, n + nr),
             "gelu public functions differ from the widest supported copy (%s)",
             moe_gelu_isa_name(isa));
  }
}

static void test_relu(void) {
  const float x[] = {-2.0f, -0.0f, 0.0f, 1e-30f, 3.5f, -1e30f, NAN, INFINITY, -INFINITY};
  const float want[] = {0.0f, 0.0f, 0.0f, 1e-30f, 3.5f, 0.0f, NAN, INFINITY, 0.0f};
  const size_t n = sizeof x / sizeof x[0];
  float y[sizeof x / sizeof x[0]], yr[sizeof x / sizeof x[0]], yi[sizeof x / sizeof x[0]];
  moe_relu_forward(y, x, n);
  moe_relu_forward_ref(yr, x, n);
  memcpy(yi, x, sizeof yi);
  moe_relu_forward(yi, yi, n);
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    if (isnan(want[i])) {
      ok &= isnan(y[i]) && isnan(yr[i]) && isnan(yi[i]);
    } else {
      ok &= y[i] == want[i] && yr[i] == want[i] && yi[i] == want[i];
    }
  }
  TU_CHECK(ok, "relu hand values (NaN propagates, negatives and -0 -> 0)");

  static const size_t lens[] = {1, 5, 33, 1000};
  for (int s = 0; s < 4; s++) {
    float *xs = tu_filled(lens[s], 50 + s, -1, 1), *ys = tu_fbuf(lens[s]), *yrs = tu_fbuf(lens[s]);
    moe_relu_forward(ys, xs, lens[s]);
    moe_relu_forward_ref(yrs, xs, lens[s]);
    tu_allclose("relu fwd vs ref", ys, yrs, lens[s], 0, 0);
  }

  // Backward: FD away from the kink (|x| >= 0.05 > eps), accumulation, and
  // derivative 0 at exactly 0.
  const size_t nf = 200;
  float *xf = tu_filled(nf, 55, -1, 1), *r = tu_filled(nf, 56, -1, 1);
  for (size_t i = 0; i < nf; i++) {
    if (fabsf(xf[i]) < 0.05f) xf[i] += xf[i] < 0 ? -0.05f : 0.05f;
  }
  float *g = tu_fbuf(nf);
  moe_relu_backward(g, r, xf, nf);
  act_fd c = {xf, r, tu_fbuf(nf), nf, 1};
  tu_fd_check("relu dx FD", act_loss, &c, xf, g, nf, 1e-2f, 1e-4, 1e-3);
  float *g0 = tu_filled(nf, 57, -1, 1), *g1 = tu_copy_of(g0, nf);
  moe_relu_backward(g1, r, xf, nf);
  check_accumulated("relu dx accumulates", g1, g0, g, nf);
  float zx[2] = {0.0f, -0.0f}, zdy[2] = {1.0f, 1.0f}, zdx[2] = {0.5f, 0.5f};
  moe_relu_backward(zdx, zdy, zx, 2);
  TU_CHECK(zdx[0] == 0.5f && zdx[1] == 0.5f, "relu'(0) = 0");
}

// ---- softmax and logsumexp -------------------------------------------------------------------

typedef struct {
  const float *x, *r;
  float *y;
  int n, d;
} softmax_fd;

static double softmax_loss(void *u) {
  softmax_fd *c = u;
  moe_softmax_forward(c->y, c->x, c->n, c->d);
  return dot_d(c->r, c->y, (size_t)c->n * c->d);
}

static void lse_ref(float *out, const float *x, int n, int d) {
  for (int i = 0; i < n; i++) {
    double m = -INFINITY, s = 0.0;
    for (int j = 0; j < d; j++) m = fmax(m, x[(size_t)i * d + j]);
    for (int j = 0; j < d; j++) s += exp(x[(size_t)i * d + j] - m);
    out[i] = (float)(m + log(s));
  }
}

static void test_softmax(void) {
  // Hand case: softmax(0, ln 3) = (1/4, 3/4); logsumexp = ln 4.
  const float hx[2] = {0.0f, 1.0986122886681098f}, hwant[2] = {0.25f, 0.75f};
  float hy[2], hl;
  moe_softmax_forward(hy, hx, 1, 2);
  tu_allclose("softmax hand", hy, hwant, 2, 0, 1e-6);
  moe_logsumexp_forward(&hl, hx, 1, 2);
  TU_CHECK(fabs(hl - 1.3862943611198906) < 1e-6, "logsumexp hand: %.9g", hl);

  static const int shapes[][2] = {{1, 1}, {1, 5}, {7, 1}, {5, 17}, {3, 33}, {4, 100}, {2, 1000}};
  char name[96];
  for (int s = 0; s < 7; s++) {
    const int n = shapes[s][0], d = shapes[s][1];
    const size_t nx = (size_t)n * d;
    for (int big = 0; big < 2; big++) {
      // big: entries ~1e4 (and spread 20 so the row is not uniform): stays finite.
      float *x = tu_filled(nx, 60 + s, -10, 10);
      if (big) {
        for (size_t i = 0; i < nx; i++) x[i] = 1e4f + x[i] * 2.0f;
      }
      float *y = tu_fbuf(nx), *yr = tu_fbuf(nx), *l = tu_fbuf((size_t)n), *lr = tu_fbuf((size_t)n);
      moe_softmax_forward(y, x, n, d);
      moe_softmax_forward_ref(yr, x, n, d);
      snprintf(name, sizeof name, "softmax fwd n%d d%d%s", n, d, big ? " (1e4)" : "");
      tu_allclose(name, y, yr, nx, 1e-9, 1e-5);
      double worst = 0.0;
      for (int i = 0; i < n; i++) {
        double sum = 0.0;
        for (int j = 0; j < d; j++) sum += y[(size_t)i * d + j];
        worst = fmax(worst, fabs(sum - 1.0));
      }
      TU_CHECK(worst < 1e-5, "%s: rows sum to 1 (worst |sum - 1| %.3g)", name, worst);
      float *yi = tu_copy_of(x, nx);
      moe_softmax_forward(yi, yi, n, d);
      TU_CHECK(bits_equal(yi, y, nx), "%s: in place differs from out of place", name);
      moe_logsumexp_forward(l, x, n, d);
      lse_ref(lr, x, n, d);
      snprintf(name, sizeof name, "logsumexp n%d d%d%s", n, d, big ? " (1e4)" : "");
      tu_allclose(name, l, lr, (size_t)n, 1e-6, 1e-6);
    }

    if (nx > 200) continue;
    // Backward: FD of L = sum r softmax(x) at x, and accumulation.
    float *x = tu_filled(nx, 70 + s, -3, 3), *r = tu_filled(nx, 71 + s, -1, 1);
    float *y = tu_fbuf(nx), *dx = tu_fbuf(nx);
    moe_softmax_forward(y, x, n, d);
    moe_softmax_backward(dx, r, y, n, d);
    softmax_fd c = {x, r, tu_fbuf(nx), n, d};
    snprintf(name, sizeof name, "softmax dx FD n%d d%d", n, d);
    tu_fd_check(name, softmax_loss, &c, x, dx, nx, 1e-2f, 2e-4, 1e-2);
    float *dx0 = tu_filled(nx, 72, -1, 1), *dx1 = tu_copy_of(dx0, nx);
    moe_softmax_backward(dx1, r, y, n, d);
    check_accumulated("softmax dx accumulates", dx1, dx0, dx, nx);
  }

  // -inf entries get probability 0; logsumexp of all -inf is -inf; NaN propagates.
  const float xinf[6] = {-INFINITY, 0.0f, 1.0f, -INFINITY, -INFINITY, -INFINITY};
  float yinf[3], linf[2];
  moe_softmax_forward(yinf, xinf, 1, 3);
  TU_CHECK(yinf[0] == 0.0f && fabsf(yinf[1] - 0.26894142f) < 1e-6f &&
               fabsf(yinf[2] - 0.73105858f) < 1e-6f,
           "softmax with -inf: %g %g %g", yinf[0], yinf[1], yinf[2]);
  moe_logsumexp_forward(linf, xinf, 2, 3);
  TU_CHECK(fabsf(linf[0] - 1.31326169f) < 1e-6f && linf[1] == -INFINITY,
           "logsumexp with -inf: %g %g", linf[0], linf[1]);
  const float xnan[3] = {1.0f, NAN, 2.0f};
  float ynan[3], lnan;
  moe_softmax_forward(ynan, xnan, 1, 3);
  moe_logsumexp_forward(&lnan, xnan, 1, 3);
  TU_CHECK(isnan(ynan[0]) && isnan(ynan[1]) && isnan(ynan[2]) && isnan(lnan),
           "softmax/logsumexp of a row with NaN is NaN");
}

// ---- top-k -------------------------------------------------------------------------------------

typedef struct {
  const float *x, *r;
  int32_t *idx;
  float *val;
  int n, d, k;
} topk_fd;

static double topk_loss(void *u) {
  topk_fd *c = u;
  moe_topk_forward(c->idx, c->val, c->x, c->n, c->d, c->k);
  return dot_d(c->r, c->val, (size_t)c->n * c->k);
}

static void test_topk(void) {
  // Hand cases: ties go to the lower index, NaN only after every number.
  const float x[5] = {1.0f, 3.0f, 3.0f, NAN, 2.0f};
  const int32_t want3[3] = {1, 2, 4}, want5[5] = {1, 2, 4, 0, 3};
  int32_t idx[5];
  float val[5];
  for (int use_ref = 0; use_ref < 2; use_ref++) {
    void (*topk)(int32_t *, float *, const float *, int, int, int) =
        use_ref ? moe_topk_forward_ref : moe_topk_forward;
    const char *who = use_ref ? "topk_ref" : "topk";
    topk(idx, val, x, 1, 5, 3);
    TU_CHECK(
        memcmp(idx, want3, sizeof want3) == 0 && val[0] == 3.0f && val[1] == 3.0f && val[2] == 2.0f,
        "%s k=3 of {1,3,3,NaN,2}: got %d %d %d", who, idx[0], idx[1], idx[2]);
    topk(idx, val, x, 1, 5, 5);
    TU_CHECK(memcmp(idx, want5, sizeof want5) == 0 && isnan(val[4]), "%s k=5: got %d %d %d %d %d",
             who, idx[0], idx[1], idx[2], idx[3], idx[4]);
    const float xn[4] = {NAN, NAN, -INFINITY, NAN};
    topk(idx, val, xn, 1, 4, 3);
    TU_CHECK(idx[0] == 2 && idx[1] == 0 && idx[2] == 1 && val[0] == -INFINITY,
             "%s: -inf beats NaN, NaNs by index: got %d %d %d", who, idx[0], idx[1], idx[2]);
    const float xz[3] = {-0.0f, 0.0f, -1.0f};
    topk(idx, val, xz, 1, 3, 2);
    TU_CHECK(idx[0] == 0 && idx[1] == 1, "%s: -0 and +0 tie by index: got %d %d", who, idx[0],
             idx[1]);
    const float xall[4] = {5.0f, 5.0f, 5.0f, 5.0f};
    topk(idx, val, xall, 1, 4, 4);
    TU_CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2 && idx[3] == 3,
             "%s: all equal keeps index order", who);
  }

  // Random rows with many ties (values on a 1/4 grid), some NaN and -inf.
  static const int shapes[][3] = {{1, 1, 1},   {1, 8, 8},    {5, 8, 2},  {7, 13, 3},
                                  {64, 64, 8}, {33, 256, 1}, {9, 17, 17}};
  char name[64];
  for (int s = 0; s < 7; s++) {
    const int n = shapes[s][0], d = shapes[s][1], k = shapes[s][2];
    const size_t nx = (size_t)n * d, nk = (size_t)n * k;
    float *xs = tu_filled(nx, 80 + s, -2, 2);
    for (size_t i = 0; i < nx; i++) {
      xs[i] = floorf(xs[i] * 4.0f) / 4.0f;
      if (i % 11 == 3) xs[i] = NAN;
      if (i % 13 == 5) xs[i] = -INFINITY;
    }
    int32_t *ia = tu_ibuf(nk), *ib = tu_ibuf(nk);
    float *va = tu_fbuf(nk), *vb = tu_fbuf(nk);
    moe_topk_forward(ia, va, xs, n, d, k);
    moe_topk_forward_ref(ib, vb, xs, n, d, k);
    snprintf(name, sizeof name, "topk idx n%d d%d k%d", n, d, k);
    tu_equal_i32(name, ia, ib, nk);
    int vals_ok = 1, order_ok = 1;
    for (size_t i = 0; i < nk; i++) {
      const size_t row = i / (size_t)k;
      vals_ok &=
          bits_equal(&va[i], &xs[row * d + (size_t)ia[i]], 1) && bits_equal(&va[i], &vb[i], 1);
      if (i % (size_t)k) order_ok &= isnan(va[i]) || va[i - 1] >= va[i];
    }
    TU_CHECK(vals_ok, "topk n%d d%d k%d: values match x[idx] and the ref", n, d, k);
    TU_CHECK(order_ok, "topk n%d d%d k%d: values descend", n, d, k);
  }

  // Backward: the scatter by hand, then FD at a point with distinct,
  // well-separated values (top-k is linear there), and accumulation.
  const int32_t bidx[4] = {2, 0, 1, 3};  // (2, 2)
  const float bdval[4] = {0.5f, -1.0f, 2.0f, 4.0f};
  float bdx[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  const float bwant[8] = {0.0f, 1.0f, 1.5f, 1.0f, 1.0f, 3.0f, 1.0f, 5.0f};
  moe_topk_backward(bdx, bdval, bidx, 2, 4, 2);
  tu_allclose("topk bwd scatter (accumulated onto 1)", bdx, bwant, 8, 0, 0);

  const int n = 6, d = 9, k = 3;
  float *xf = tu_fbuf((size_t)n * d);
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < d; j++) xf[i * d + j] = (float)((j * 5 + i * 3) % d) * 0.5f - 2.0f;
  }
  float *r = tu_filled((size_t)n * k, 90, -1, 1), *g = tu_fbuf((size_t)n * d);
  int32_t *fi = tu_ibuf((size_t)n * k);
  float *fv = tu_fbuf((size_t)n * k);
  moe_topk_forward(fi, fv, xf, n, d, k);
  moe_topk_backward(g, r, fi, n, d, k);
  topk_fd c = {xf, r, tu_ibuf((size_t)n * k), tu_fbuf((size_t)n * k), n, d, k};
  tu_fd_check("topk dx FD", topk_loss, &c, xf, g, (size_t)n * d, 1e-2f, 1e-4, 1e-3);
}

// ---- layernorm ---------------------------------------------------------------------------------

typedef struct {
  const float *x, *gamma, *beta, *r;
  float *y, *mean, *rstd;
  int n, d;
} ln_fd;

static double ln_loss(void *u) {
  ln_fd *c = u;
  moe_layernorm_forward(c->y, c->mean, c->rstd, c->x, c->gamma, c->beta, c->n, c->d, 1e-5f);
  return dot_d(c->r, c->y, (size_t)c->n * c->d);
}

static void test_layernorm(void) {
  // Hand case: x = (1, 2, 3, 4): mean 2.5, var 1.25, gamma 2, beta 1.
  const float hx[4] = {1, 2, 3, 4}, hg[4] = {2, 2, 2, 2}, hb[4] = {1, 1, 1, 1};
  float hy[4], hm, hr, hwant[4];
  const double hrs = 1.0 / sqrt(1.25 + 1e-5);
  for (int j = 0; j < 4; j++) hwant[j] = (float)((hx[j] - 2.5) * hrs * 2.0 + 1.0);
  moe_layernorm_forward(hy, &hm, &hr, hx, hg, hb, 1, 4, 1e-5f);
  tu_allclose("layernorm hand y", hy, hwant, 4, 1e-6, 1e-6);
  TU_CHECK(hm == 2.5f && fabs(hr - hrs) < 1e-6, "layernorm hand mean %g rstd %g", hm, hr);

  static const int shapes[][2] = {{1, 1}, {1, 7}, {5, 1}, {4, 16}, {3, 37}, {2, 300}};
  char name[96];
  for (int s = 0; s < 6; s++) {
    const int n = shapes[s][0], d = shapes[s][1];
    const size_t nx = (size_t)n * d;
    // Offset mean (5 + U(-1, 1)): the variance must not cancel.
    float *x = tu_filled(nx, 100 + s, 4, 6), *gamma = tu_filled((size_t)d, 101 + s, 0.5f, 1.5f);
    float *beta = tu_filled((size_t)d, 102 + s, -0.5f, 0.5f);
    float *y = tu_fbuf(nx), *yr = tu_fbuf(nx), *m = tu_fbuf((size_t)n), *mr = tu_fbuf((size_t)n);
    float *rs = tu_fbuf((size_t)n), *rsr = tu_fbuf((size_t)n);
    moe_layernorm_forward(y, m, rs, x, gamma, beta, n, d, 1e-5f);
    moe_layernorm_forward_ref(yr, mr, rsr, x, gamma, beta, n, d, 1e-5f);
    snprintf(name, sizeof name, "layernorm fwd n%d d%d", n, d);
    tu_allclose(name, y, yr, nx, 1e-5, 1e-5);
    tu_allclose("layernorm mean", m, mr, (size_t)n, 0, 1e-6);
    tu_allclose("layernorm rstd", rs, rsr, (size_t)n, 0, 1e-5);

    if (d == 1 || nx > 200) continue;  // d = 1: y = beta exactly, gradient 0
    // Backward: FD for dx, dgamma, dbeta on x in [-1, 1] (O(1) rstd so the
    // finite differences are well conditioned), then accumulation.
    float *xb = tu_filled(nx, 103 + s, -1, 1), *r = tu_filled(nx, 104 + s, -1, 1);
    moe_layernorm_forward(y, m, rs, xb, gamma, beta, n, d, 1e-5f);
    float *dx = tu_fbuf(nx), *dg = tu_fbuf((size_t)d), *db = tu_fbuf((size_t)d);
    moe_layernorm_backward(dx, dg, db, r, xb, m, rs, gamma, n, d);
    ln_fd c = {xb, gamma, beta, r, tu_fbuf(nx), tu_fbuf((size_t)n), tu_fbuf((size_t)n), n, d};
    snprintf(name, sizeof name, "layernorm dx FD n%d d%d", n, d);
    tu_fd_check(name, ln_loss, &c, xb, dx, nx, 3e-3f, 1e-3, 1e-2);
    snprintf(name, sizeof name, "layernorm dgamma FD n%d d%d", n, d);
    tu_fd_check(name, ln_loss, &c, gamma, dg, (size_t)d, 1e-2f, 1e-3, 1e-2);
    snprintf(name, sizeof name, "layernorm dbeta FD n%d d%d", n, d);
    tu_fd_check(name, ln_loss, &c, beta, db, (size_t)d, 1e-2f, 1e-3, 1e-2);
    float *dx0 = tu_filled(nx, 105, -1, 1), *dg0 = tu_filled((size_t)d, 106, -1, 1);
    float *db0 = tu_filled((size_t)d, 107, -1, 1);
    float *dx1 = tu_copy_of(dx0, nx), *dg1 = tu_copy_of(dg0, (size_t)d),
          *db1 = tu_copy_of(db0, (size_t)d);
    moe_layernorm_backward(dx1, dg1, db1, r, xb, m, rs, gamma, n, d);
    check_accumulated("layernorm dx accumulates", dx1, dx0, dx, nx);
    check_accumulated("layernorm dgamma accumulates", dg1, dg0, dg, (size_t)d);
    check_accumulated("layernorm dbeta accumulates", db1, db0, db, (size_t)d);
  }
}

// ---- cross-entropy ---------------------------------------------------------------------------

typedef struct {
  const float *logits;
  const int32_t *targets;
  int n, v;
  float dloss;
} ce_fd;

static double ce_loss(void *u) {
  ce_fd *c = u;
  return (double)c->dloss *
         (double)moe_cross_entropy_forward(NULL, c->logits, c->targets, c->n, c->v);
}

static void test_cross_entropy(void) {
  // Hand case: rows (1, 2, 3) -> target 2, (0, 0, 0) -> target 1, a third row
  // ignored; an ignored row counts neither in the sum nor in the mean.
  const float hl[9] = {1, 2, 3, 0, 0, 0, 50, -50, 7};
  const int32_t ht[3] = {2, 1, -1};
  const double row0 = log(exp(1.0) + exp(2.0) + exp(3.0)) - 3.0;  // 0.40760596
  const double row1 = log(3.0);
  const double hwant = (row0 + row1) / 2.0;
  float hp[9];
  const float hloss = moe_cross_entropy_forward(hp, hl, ht, 3, 3);
  const float hloss_ref = moe_cross_entropy_forward_ref(hl, ht, 3, 3);
  TU_CHECK(fabs(hloss - hwant) < 1e-6, "CE hand: %.9g want %.9g", hloss, hwant);
  TU_CHECK(fabs(hloss_ref - hwant) < 1e-6, "CE_ref hand: %.9g want %.9g", hloss_ref, hwant);
  TU_CHECK(fabs(hwant - 0.753109126556245) < 1e-12, "CE hand constant");
  float hp_want[9];
  moe_softmax_forward_ref(hp_want, hl, 3, 3);
  tu_allclose("CE probs = softmax (ignored rows too)", hp, hp_want, 9, 1e-9, 1e-6);

  // Backward of the hand case, dloss = 2: row 0: 2 (p - e_2) / 2.
  float hd[9] = {0};
  moe_cross_entropy_backward(hd, hp, ht, 3, 3, 2.0f);
  float hd_want[9];
  for (int j = 0; j < 9; j++) hd_want[j] = j < 6 ? hp[j] : 0.0f;
  hd_want[2] -= 1.0f;
  hd_want[4] -= 1.0f;
  tu_allclose("CE bwd hand", hd, hd_want, 9, 1e-7, 1e-6);

  // Every row ignored: loss 0 and no gradient.
  const int32_t none[3] = {-1, -1, -1};
  float hd2[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  const float ones9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  TU_CHECK(moe_cross_entropy_forward(NULL, hl, none, 3, 3) == 0.0f &&
               moe_cross_entropy_forward_ref(hl, none, 3, 3) == 0.0f,
           "CE with every row ignored is 0");
  moe_cross_entropy_backward(hd2, hp, none, 3, 3, 1.0f);
  TU_CHECK(bits_equal(hd2, ones9, 9), "CE bwd with every row ignored adds nothing");

  // Random shapes vs ref, including logits around 1e4.
  static const int shapes[][2] = {{1, 1}, {1, 5}, {6, 11}, {9, 40}, {3, 1000}};
  char name[64];
  for (int s = 0; s < 5; s++) {
    const int n = shapes[s][0], v = shapes[s][1];
    const size_t nl = (size_t)n * v;
    int32_t *t = tu_ibuf((size_t)n);
    for (int i = 0; i < n; i++) t[i] = (i % 4 == 3) ? -1 : (int32_t)((i * 7 + 1) % v);
    for (int big = 0; big < 2; big++) {
      float *l = tu_filled(nl, 110 + s, -4, 4);
      if (big) {
        for (size_t i = 0; i < nl; i++) l[i] = 1e4f + 3.0f * l[i];
      }
      float *p = tu_fbuf(nl);
      const float loss = moe_cross_entropy_forward(p, l, t, n, v);
      const float loss_ref = moe_cross_entropy_forward_ref(l, t, n, v);
      snprintf(name, sizeof name, "CE fwd n%d v%d%s", n, v, big ? " (1e4)" : "");
      TU_CHECK(isfinite(loss) && fabs(loss - loss_ref) <= 1e-5 * (1.0 + fabs(loss_ref)),
               "%s: %.9g vs ref %.9g", name, loss, loss_ref);
    }

    if (nl > 500) continue;
    // Backward vs FD of dloss * loss; ignored rows receive exactly nothing.
    float *l = tu_filled(nl, 120 + s, -2, 2), *p = tu_fbuf(nl);
    moe_cross_entropy_forward(p, l, t, n, v);
    float *dl = tu_fbuf(nl);
    moe_cross_entropy_backward(dl, p, t, n, v, 0.7f);
    ce_fd c = {l, t, n, v, 0.7f};
    snprintf(name, sizeof name, "CE dlogits FD n%d v%d", n, v);
    tu_fd_check(name, ce_loss, &c, l, dl, nl, 1e-2f, 5e-5, 1e-2);
    float *dl0 = tu_filled(nl, 121, -1, 1), *dl1 = tu_copy_of(dl0, nl);
    moe_cross_entropy_backward(dl1, p, t, n, v, 0.7f);
    check_accumulated("CE dlogits accumulates", dl1, dl0, dl, nl);
    int ignored_ok = 1;
    for (int i = 0; i < n; i++) {
      if (t[i] < 0) ignored_ok &= bits_equal(dl1 + (size_t)i * v, dl0 + (size_t)i * v, (size_t)v);
    }
    TU_CHECK(ignored_ok, "CE: ignored rows must get no gradient");
  }
}

// ---- AdamW -----------------------------------------------------------------------------------

static void test_adamw(void) {
  const moe_adamw_config cfg = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f};

  // First step from m = v = 0: m_hat = g, v_hat = g^2, so each parameter moves
  // by lr * g / (|g| + eps) ~ lr * sign(g) after decaying by 1 - lr * wd; g = 0
  // only decays. Literal numbers, independent of the kernels' formula.
  float p[3] = {0.5f, -1.0f, 2.0f}, m[3] = {0}, v[3] = {0};
  const float g[3] = {0.1f, -0.2f, 0.0f};
  moe_adamw_update(p, m, v, g, 3, &cfg, 1);
  const float p1_want[3] = {0.4895f, -0.989f, 1.998f};
  tu_allclose("adamw first step (literal)", p, p1_want, 3, 1e-6, 1e-6);

  // A later step (t = 3) from non-zero state, expected values written out
  // from the formula in double (torch.optim.AdamW order of operations).
  float p3[4] = {0.5f, -1.0f, 2.0f, 0.0f}, m3[4] = {0.01f, 0.0f, -0.02f, 0.3f};
  float v3[4] = {1e-4f, 0.0f, 4e-4f, 0.01f};
  const float g3[4] = {0.1f, -0.2f, 0.0f, -0.05f};
  float pw[4], mw[4], vw[4];
  // The config holds floats, so the expected values start from those.
  const double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, wd = cfg.weight_decay;
  for (int i = 0; i < 4; i++) {
    double pi = p3[i] * (1.0 - lr * wd);
    const double mi = b1 * m3[i] + (1.0 - b1) * g3[i];
    const double vi = b2 * v3[i] + (1.0 - b2) * (double)g3[i] * g3[i];
    const double bc1 = 1.0 - b1 * b1 * b1, bc2 = 1.0 - b2 * b2 * b2;  // t = 3
    pi -= lr / bc1 * mi / (sqrt(vi) / sqrt(bc2) + eps);
    pw[i] = (float)pi;
    mw[i] = (float)mi;
    vw[i] = (float)vi;
  }
  float pr3[4], mr3[4], vr3[4];
  memcpy(pr3, p3, sizeof pr3);
  memcpy(mr3, m3, sizeof mr3);
  memcpy(vr3, v3, sizeof vr3);
  moe_adamw_update(p3, m3, v3, g3, 4, &cfg, 3);
  moe_adamw_update_ref(pr3, mr3, vr3, g3, 4, &cfg, 3);
  tu_allclose("adamw t=3 p (hand)", p3, pw, 4, 1e-7, 1e-6);
  tu_allclose("adamw t=3 m (hand)", m3, mw, 4, 1e-9, 1e-6);
  tu_allclose("adamw t=3 v (hand)", v3, vw, 4, 1e-12, 1e-6);
  tu_allclose("adamw_ref t=3 p (hand)", pr3, pw, 4, 1e-7, 1e-6);

  // Many parameters over several steps: update vs ref from the same state.
  const size_t n = 1003;
  float *pa = tu_filled(n, 130, -1, 1), *ga = tu_fbuf(n), *ma = tu_fbuf(n), *va = tu_fbuf(n);
  float *pb = tu_copy_of(pa, n), *mb = tu_fbuf(n), *vb = tu_fbuf(n);
  const moe_adamw_config cfg2 = {3e-3f, 0.8f, 0.99f, 1e-6f, 0.01f};
  for (int t = 1; t <= 5; t++) {
    tu_fill(ga, n, 131 + (uint64_t)t, -1, 1);
    moe_adamw_update(pa, ma, va, ga, n, &cfg2, t);
    moe_adamw_update_ref(pb, mb, vb, ga, n, &cfg2, t);
  }
  tu_allclose("adamw p vs ref (5 steps)", pa, pb, n, 1e-6, 1e-5);
  tu_allclose("adamw m vs ref (5 steps)", ma, mb, n, 1e-7, 1e-5);
  tu_allclose("adamw v vs ref (5 steps)", va, vb, n, 1e-8, 1e-5);
}

// ---- BLAS control -----------------------------------------------------------------------------

static void test_blas_info(void) {
  const char *name = moe_blas_name();
  TU_CHECK(name && strlen(name) > 0, "moe_blas_name is empty");
  moe_blas_set_threads(1);
  float a[1] = {2}, b[1] = {3}, c[1] = {0};
  moe_gemm(0, 0, 1, 1, 1, 1.0f, a, 1, b, 1, 0.0f, c, 1);
  TU_CHECK(c[0] == 6.0f, "gemm after set_threads(1)");
}

// The catalogue: names and lookups, errors naming the valid backends.
static void test_backend_catalogue(void) {
  moe_ctx *ctx = NULL;
  TU_CHECK(moe_ctx_create(&ctx) == MOE_STATUS_OK, "ctx");
  const moe_backend *b = NULL;
  TU_CHECK(moe_backend_find(ctx, "fixed", &b) == MOE_STATUS_OK && b && b->batch_invariant,
           "the fixed backend must exist and be batch-invariant");
  TU_CHECK(moe_backend_find(ctx, "openblas", &b) == MOE_STATUS_OK && b && !b->batch_invariant,
           "the openblas backend must exist and not claim batch invariance");
  TU_CHECK(moe_backend_find(ctx, "cublas2", &b) == MOE_STATUS_INVALID_ARG && !b,
           "an unknown backend must be refused");
  TU_CHECK(strstr(moe_ctx_error(ctx), "cublas2") && strstr(moe_ctx_error(ctx), "fixed") &&
               strstr(moe_ctx_error(ctx), "openblas"),
           "the error must name the backend and the valid ones: %s", moe_ctx_error(ctx));
  const moe_status on = moe_backend_find(ctx, "onednn", &b);
  TU_CHECK(
      on == MOE_STATUS_OK || (on == MOE_STATUS_UNSUPPORTED && strstr(moe_ctx_error(ctx), "oneDNN")),
      "onednn: found, or refused saying oneDNN is not built (%s)", moe_ctx_error(ctx));
  TU_CHECK(strstr(moe_backend_names(), "fixed") == moe_backend_names(),
           "the names start with the default, fixed: %s", moe_backend_names());
  moe_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  void (*const tests[])(void) = {
      test_blas_info, test_gemm_hand, test_gemm_vs_ref,   test_gemm_fixed,
      test_gemm_bf16, test_pairwise,  test_gemm_empty,    test_linear,
      test_bias,      test_gelu,      test_relu,          test_softmax,
      test_topk,      test_layernorm, test_cross_entropy, test_adamw};
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    tests[i]();
    tu_free_all();
  }
  // moe_gemm's contract on every other compute backend this build can run
  // (the tests above ran the default, fixed one)
  int nb = 0;
  const moe_backend *const *list = moe_backend_list(&nb);
  for (int i = 0; i < nb; i++) {
    if (list[i]->unavailable()) {
      printf("backend %s: skipped (%s)\n", list[i]->name, list[i]->unavailable());
      continue;
    }
    moe_backend_use(list[i], 1);
    TU_CHECK(moe_backend_current() == list[i], "moe_backend_use(%s) did not stick", list[i]->name);
    printf("backend %s: %s\n", list[i]->name, list[i]->describe());
    test_gemm_hand();
    test_gemm_vs_ref();
    test_gemm_empty();
    tu_free_all();
  }
  test_backend_catalogue();
  moe_backend_use(NULL, 1);
  TU_CHECK(moe_backend_current() == list[0], "moe_backend_use(NULL) is not the fixed backend");
  return tu_finish("test_kernels");
}
