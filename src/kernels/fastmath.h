// Private float math shared by the vectorized CPU kernels (activation.c,
// softmax.c, layernorm.c): an exp() written as straight-line float arithmetic,
// bitwise select/mask helpers, and lane-split row reductions.
//
// Why it exists: glibc's expf/erff are scalar calls that GCC and clang do not
// vectorize without -ffast-math, and a plain float sum is not vectorized
// either (reordering it changes the rounding). libmoe is not built with
// -ffast-math (it would also break the NaN/inf handling and the exact-split
// tricks below), so the kernels use these helpers instead: no calls, no
// branches, no float->int conversions, so loops built from them vectorize with
// baseline SSE2 and with the AVX2/AVX-512 copies of activation.c.
//
// Accuracy:
//   - fm_exp_split(hi, lo) = exp(hi + lo) to ~1 ulp (Cephes expf polynomial
//     after a Cody-Waite reduction) wherever the result is a normal float; the
//     lo part carries bits of the argument below float precision (GELU passes
//     -x^2/2 split exactly; softmax passes lo = -0).
//   - The row reductions add into FM_LANES independent partial sums, then the
//     tail, then the lanes in order: a fixed summation order, so results do
//     not depend on the instruction set, and each partial sum is only ~d/16
//     additions deep (less rounding error than one running sum).
//
// Everything is static inline: the compiler inlines it into (and vectorizes it
// with) each kernel's loops. Any change here changes the results of every
// kernel above; test_kernels checks their accuracy.
#ifndef MOE_KERNELS_FASTMATH_H
#define MOE_KERNELS_FASTMATH_H

#include <stdint.h>
#include <string.h>

// ---- bit masks -------------------------------------------------------------------

// Selections are done on the bits, not with `?:` on floats: GCC sinks the
// arithmetic of a `?:` arm into a branch and then refuses to if-convert it back
// (a float op "could trap"), which stops the loop from vectorizing.

// v with its bits ANDed with mask (mask all ones: v; all zeros: +0).
static inline float fm_bits_and(float v, uint32_t mask) {
  uint32_t b;
  memcpy(&b, &v, sizeof b);
  b &= mask;
  memcpy(&v, &b, sizeof v);
  return v;
}

// mask ? a : b, for masks that are all ones or all zeros.
static inline float fm_bits_select(uint32_t mask, float a, float b) {
  uint32_t ab, bb;
  memcpy(&ab, &a, sizeof ab);
  memcpy(&bb, &b, sizeof bb);
  ab = (ab & mask) | (bb & ~mask);
  memcpy(&a, &ab, sizeof a);
  return a;
}

// ---- exp ---------------------------------------------------------------------------

// exp(hi + lo), with lo a correction below the precision of hi (pass -0.0f for
// none: the compiler then drops the additions, and hi + -0 == hi exactly).
//
// Valid while n = round((hi + lo) / ln2) is in [-126, 127], i.e. for hi + lo
// in about [-87.3, 88.0], where 2^n is a normal float built in the exponent
// field. Outside that range the result is meaningless but nothing traps
// (unsigned integer arithmetic only): callers mask it out. NaN gives NaN.
static inline float fm_exp_split(float hi, float lo) {
  // Cody-Waite reduction hi + lo = n ln2 + r, |r| <= ln2/2; n is rounded by the
  // 1.5 * 2^23 trick so its integer value lands in the low mantissa bits of
  // `shifter` (avoids a float->int conversion the vectorizer would need SSE4.1
  // rounding for, and that would be UB on NaN).
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const float shifter = (hi + lo) * 1.44269504088896341f + magic;
  const float n = shifter - magic;
  float r = hi - n * 0.693359375f;  // exact: 0.693359375 has 9 bits
  r = r + lo;
  r = r - n * -2.12194440e-4f;  // ln2 - 0.693359375
  // exp(r) on [-ln2/2, ln2/2] (Cephes expf polynomial, ~1 ulp).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * (r * r) + r + 1.0f;
  uint32_t sbits;
  memcpy(&sbits, &shifter, sizeof sbits);
  sbits = (sbits - 0x4B400000u + 127u) << 23;  // 2^n, built in the exponent field
  float scale;
  memcpy(&scale, &sbits, sizeof scale);
  return er * scale;
}

// ---- row reductions ------------------------------------------------------------------

// Independent partial sums per reduction: 16 floats are one AVX-512 register,
// two AVX2 or four SSE2 registers, and hide the add latency.
#define FM_LANES 16

// sum_j x_j over x (d).
static inline float fm_row_sum(const float *restrict x, int d) {
  float lane[FM_LANES] = {0};
  int j = 0;
  for (; j + FM_LANES <= d; j += FM_LANES) {
    for (int l = 0; l < FM_LANES; l++) lane[l] += x[j + l];
  }
  float s = 0.0f;
  for (; j < d; j++) s += x[j];
  for (int l = 0; l < FM_LANES; l++) s += lane[l];
  return s;
}

// sum_j a_j b_j over a, b (d).
static inline float fm_row_dot(const float *restrict a, const float *restrict b, int d) {
  float lane[FM_LANES] = {0};
  int j = 0;
  for (; j + FM_LANES <= d; j += FM_LANES) {
    for (int l = 0; l < FM_LANES; l++) lane[l] += a[j + l] * b[j + l];
  }
  float s = 0.0f;
  for (; j < d; j++) s += a[j] * b[j];
  for (int l = 0; l < FM_LANES; l++) s += lane[l];
  return s;
}

// sum_j (x_j - mean)^2 over x (d): the second pass of a two-pass variance.
static inline float fm_row_sq_dev(const float *restrict x, int d, float mean) {
  float lane[FM_LANES] = {0};
  int j = 0;
  for (; j + FM_LANES <= d; j += FM_LANES) {
    for (int l = 0; l < FM_LANES; l++) {
      const float c = x[j + l] - mean;
      lane[l] += c * c;
    }
  }
  float s = 0.0f;
  for (; j < d; j++) s += (x[j] - mean) * (x[j] - mean);
  for (int l = 0; l < FM_LANES; l++) s += lane[l];
  return s;
}

#endif
