// Tests of the compressors (include/moe/compress.h): for every registered codec,
// round trips on several shapes (1x1 up to 64x1024, odd sizes) and value ranges
// ([-1,1], [-1e4,1e4], signed log-uniform 1e-20..1e-3), each checked against the
// bound compress.h documents; fp16 and bf16 bit-exactly against a double-precision
// reference rounding. Also: out_bytes <= max_bytes, empty input, NaN/Inf policy,
// spec parsing, truncated and corrupt buffers, and no moe_malloc in the hot path.
// The data-dir argument is unused.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "moe/compress.h"
#include "moe_build_config.h"
#include "testutil.h"

typedef struct {
  size_t rows, cols;
} shape;

static const shape k_shapes[] = {{1, 1}, {1, 7}, {3, 5}, {5, 1}, {17, 33}, {64, 1024}};
enum { NSHAPES = sizeof k_shapes / sizeof k_shapes[0] };

typedef enum { DIST_UNIT, DIST_BIG, DIST_TINY, DIST_COUNT } dist;
static const char *const k_dist_names[] = {"[-1,1]", "[-1e4,1e4]", "+-[1e-20,1e-3] log"};

static void fill(float *x, size_t n, dist d, uint64_t seed) {
  if (d == DIST_UNIT) {
    tu_fill(x, n, seed, -1.0f, 1.0f);
  } else if (d == DIST_BIG) {
    tu_fill(x, n, seed, -1e4f, 1e4f);
  } else {  // magnitudes log-uniform in [1e-20, 1e-3], random signs
    tu_fill(x, n, seed, (float)log(1e-20), (float)log(1e-3));
    moe_rng rng;
    moe_rng_init(&rng, seed, 99);
    for (size_t i = 0; i < n; i++) {
      x[i] = (float)exp(x[i]) * ((moe_rng_u32(&rng) & 1u) ? -1.0f : 1.0f);
    }
  }
}

static moe_ctx *g_ctx;

static moe_compressor get(const char *spec) {
  moe_compressor c;
  memset(&c, 0, sizeof c);
  const moe_status st = moe_compressor_get(g_ctx, spec, &c);
  TU_CHECK(st == MOE_STATUS_OK, "moe_compressor_get(%s): %s", spec, moe_ctx_error(g_ctx));
  return c;
}

// Round trip x (rows, cols) -> y through c, checking sizes and that nothing is
// allocated through moe_malloc. Returns the compressed size, or SIZE_MAX on failure.
static size_t round_trip(const moe_compressor *c, const float *x, size_t rows, size_t cols,
                         float *y, unsigned char *buf, size_t cap) {
  const size_t max = moe_compress_max_bytes(c, rows, cols);
  TU_CHECK(max <= cap, "%s (%zu, %zu): max_bytes %zu > test buffer %zu", c->name, rows, cols, max,
           cap);
  size_t bytes = SIZE_MAX;
  const uint64_t a0 = moe_alloc_count();
  moe_status st = moe_compress(c, g_ctx, x, rows, cols, buf, max, &bytes);
  TU_CHECK(st == MOE_STATUS_OK, "%s compress (%zu, %zu): %s", c->name, rows, cols,
           moe_ctx_error(g_ctx));
  if (st != MOE_STATUS_OK) return SIZE_MAX;
  TU_CHECK(bytes <= max, "%s (%zu, %zu): wrote %zu bytes > max_bytes %zu", c->name, rows, cols,
           bytes, max);
  st = moe_decompress(c, g_ctx, buf, bytes, rows, cols, y);
  TU_CHECK(st == MOE_STATUS_OK, "%s decompress (%zu, %zu): %s", c->name, rows, cols,
           moe_ctx_error(g_ctx));
  TU_CHECK(moe_alloc_count() == a0, "%s: compress/decompress called moe_malloc", c->name);
  return st == MOE_STATUS_OK ? bytes : SIZE_MAX;
}

// ---- references ------------------------------------------------------------------

// Correct rounding of x to a binary format with `mant` fraction bits and minimum
// normal exponent emin, largest finite value maxv; in double (exact: x/ulp is a
// power-of-two scaling and nearbyint rounds to nearest even).
static float ref_round(float x, int mant, int emin, double maxv) {
  if (isnan(x) || isinf(x) || x == 0.0f) return x;
  int e;
  frexp(fabs((double)x), &e);  // |x| = m 2^e, m in [0.5, 1)
  const int k = (e - 1 < emin ? emin : e - 1) - mant;
  double r = ldexp(nearbyint(ldexp(fabs((double)x), -k)), k);
  if (r > maxv) r = INFINITY;
  return (float)copysign(r, (double)x);
}
static float ref_f16(float x) { return ref_round(x, 10, -14, 65504.0); }
static float ref_bf16(float x) { return ref_round(x, 7, -126, ldexp(255.0, 120)); }

// Same float, or both NaN.
static int same(float a, float b) {
  return (isnan(a) && isnan(b)) || (a == b && !signbit(a) == !signbit(b));
}

// ---- per-codec bound checks -------------------------------------------------------

static void check_exact(const char *what, const float *x, const float *y, size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (memcmp(&x[i], &y[i], sizeof(float)) != 0 && bad++ < 3) {
      printf("  %s[%zu]: %.9g -> %.9g\n", what, i, (double)x[i], (double)y[i]);
    }
  }
  TU_CHECK(bad == 0, "%s: %d elements not bit-identical", what, bad);
}

// fp16/bf16: bit-exact vs the reference rounding, plus the relative bound for
// normal values (2^-11 or 2^-8) and half a subnormal ulp below.
static void check_half(const char *what, const float *x, const float *y, size_t n, int is_bf16) {
  const double rel = is_bf16 ? ldexp(1, -8) : ldexp(1, -11);
  const double min_normal = is_bf16 ? FLT_MIN : ldexp(1, -14);
  const double max_normal = is_bf16 ? FLT_MAX : 65504.0;
  const double sub_abs = ldexp(1, -25);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    const float ref = is_bf16 ? ref_bf16(x[i]) : ref_f16(x[i]);
    const double ax = fabs((double)x[i]), err = fabs((double)y[i] - (double)x[i]);
    int ok = same(y[i], ref);
    if (ax >= min_normal && ax <= max_normal) ok = ok && err <= rel * ax;
    if (!is_bf16 && ax < min_normal) ok = ok && err <= sub_abs;
    if (!ok && bad++ < 3) {
      printf("  %s[%zu]: x %.9g -> %.9g, reference %.9g\n", what, i, (double)x[i], (double)y[i],
             (double)ref);
    }
  }
  TU_CHECK(bad == 0, "%s: %d elements off the correctly rounded value or bound", what, bad);
}

// int8: |y - x| <= scale/510 + 2^-21 (|bias| + scale) per row; the row min exact.
static void check_int8(const char *what, const float *x, const float *y, size_t rows, size_t cols) {
  int bad = 0;
  for (size_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols, *yr = y + r * cols;
    float lo = xr[0], hi = xr[0];
    for (size_t j = 1; j < cols; j++) {
      lo = fminf(lo, xr[j]);
      hi = fmaxf(hi, xr[j]);
    }
    const double scale = (double)hi - (double)lo;
    const double tol = scale / 510.0 + ldexp(fabs((double)lo) + scale, -21);
    for (size_t j = 0; j < cols; j++) {
      const double err = fabs((double)yr[j] - (double)xr[j]);
      const int ok = err <= tol && (xr[j] != lo || yr[j] == lo);
      if (!ok && bad++ < 3) {
        printf("  %s[%zu][%zu]: x %.9g -> %.9g, err %.3g > tol %.3g (row range %.6g)\n", what, r, j,
               (double)xr[j], (double)yr[j], err, tol, scale);
      }
    }
  }
  TU_CHECK(bad == 0, "%s: %d elements beyond half a quantisation step", what, bad);
}

// zfp: max |y - x| <= (2^(6 - rate) + 2^-23) * max|x| (empirical: the worst
// seen over these distributions is ~47 * 2^-rate; docs/compression.md).
static double zfp_err(const float *x, const float *y, size_t n) {
  double amax = 0.0, emax = 0.0;
  for (size_t i = 0; i < n; i++) {
    amax = fmax(amax, fabs((double)x[i]));
    emax = fmax(emax, fabs((double)y[i] - (double)x[i]));
  }
  return amax > 0.0 ? emax / amax : emax;
}

// ---- tests -------------------------------------------------------------------------

static void test_round_trips(float *x, float *y, unsigned char *buf, size_t cap) {
  const char *specs[] = {"none", "fp16", "bf16", "int8"};
  for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
    const moe_compressor c = get(specs[s]);
    for (int sh = 0; sh < NSHAPES; sh++) {
      const size_t rows = k_shapes[sh].rows, cols = k_shapes[sh].cols, n = rows * cols;
      for (int d = 0; d < DIST_COUNT; d++) {
        char what[128];
        snprintf(what, sizeof what, "%s (%zu, %zu) %s", specs[s], rows, cols, k_dist_names[d]);
        fill(x, n, (dist)d, 1000u + (uint64_t)(sh * 10 + d));
        if (round_trip(&c, x, rows, cols, y, buf, cap) == SIZE_MAX) continue;
        if (s == 0) check_exact(what, x, y, n);
        if (s == 1 || s == 2) check_half(what, x, y, n, s == 2);
        if (s == 3) check_int8(what, x, y, rows, cols);
      }
    }
  }
}

// Hand-computed roundings (the reference above is not the only oracle).
static void test_half_vectors(float *y, unsigned char *buf, size_t cap) {
  const moe_compressor f16 = get("fp16"), b16 = get("bf16");
  const float in16[] = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 65504.0f, 65519.0f, 65520.0f,
                        -65520.0f,       0x1p-24f,        0x1p-25f, 0x3p-25f, 0x1.8p-25f,
                        0x1p-14f,        -0.0f,           1e-8f,    3.0f,     0x1.ff4p-15f,
                        0x1.ffep-15f};
  const float out16[] = {1.0f,     1.0f + 0x1p-9f, 65504.0f,    65504.0f, INFINITY, -INFINITY,
                         0x1p-24f, 0.0f,           0x1p-23f,    0x1p-24f, 0x1p-14f, -0.0f,
                         0.0f,     3.0f,           0x1.ffp-15f, 0x1p-14f};
  const size_t n16 = sizeof in16 / sizeof in16[0];
  if (round_trip(&f16, in16, 1, n16, y, buf, cap) != SIZE_MAX) {
    for (size_t i = 0; i < n16; i++) {
      TU_CHECK(same(y[i], out16[i]), "fp16(%a) = %a, expected %a", (double)in16[i], (double)y[i],
               (double)out16[i]);
    }
  }
  const float inb[] = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, FLT_MAX,     0x1.FEp127f, -0x1.FFp127f,
                       0x1p-149f,      0x1p-133f,      0x1.8p-133f, -0.0f};
  const float outb[] = {1.0f, 1.0f + 0x1p-6f, INFINITY,  0x1.FEp127f, -INFINITY,
                        0.0f, 0x1p-133f,      0x1p-132f, -0.0f};
  const size_t nb = sizeof inb / sizeof inb[0];
  if (round_trip(&b16, inb, 1, nb, y, buf, cap) != SIZE_MAX) {
    for (size_t i = 0; i < nb; i++) {
      TU_CHECK(same(y[i], outb[i]), "bf16(%a) = %a, expected %a", (double)inb[i], (double)y[i],
               (double)outb[i]);
    }
  }
}

static void test_int8_special(float *y, unsigned char *buf, size_t cap) {
  const moe_compressor c = get("int8");
  // Row 0 constant (exact), row 1 two values (exact ends), row 2 with steps
  // exactly at quantisation ties and just off them.
  const float x[3][6] = {{3.25f, 3.25f, 3.25f, 3.25f, 3.25f, 3.25f},
                         {-7.0f, 9.0f, -7.0f, 9.0f, 9.0f, -7.0f},
                         {0.0f, 255.0f, 0.5f, 1.49f, 127.51f, 254.6f}};
  if (round_trip(&c, &x[0][0], 3, 6, y, buf, cap) != SIZE_MAX) {
    for (int j = 0; j < 6; j++) {
      TU_CHECK(y[j] == 3.25f, "int8 constant row: y[%d] = %.9g", j, (double)y[j]);
      TU_CHECK(y[6 + j] == x[1][j], "int8 two-valued row: y[%d] = %.9g, x %.9g", j,
               (double)y[6 + j], (double)x[1][j]);
    }
    // Row range 255: step 1, so q = round(x); 0.5 -> 1 (half up), 1.49 -> 1,
    // 127.51 -> 128, 254.6 -> 255.
    const float want[6] = {0.0f, 255.0f, 1.0f, 1.0f, 128.0f, 255.0f};
    for (int j = 0; j < 6; j++) {
      TU_CHECK(fabsf(y[12 + j] - want[j]) <= 1e-4f, "int8 step row: x %.9g -> %.9g, expected %g",
               (double)x[2][j], (double)y[12 + j], (double)want[j]);
    }
  }
  // A row whose range overflows float is rejected.
  const float wide[2] = {-3e38f, 3e38f};
  size_t bytes = 0;
  TU_CHECK(moe_compress(&c, g_ctx, wide, 1, 2, buf, cap, &bytes) == MOE_STATUS_INVALID_ARG,
           "int8 accepted a row range that overflows float");
  // A corrupt header (negative scale) is rejected.
  if (round_trip(&c, &x[0][0], 3, 6, y, buf, cap) != SIZE_MAX) {
    const float neg = -1.0f;
    memcpy(buf + 4, &neg, sizeof neg);
    TU_CHECK(moe_decompress(&c, g_ctx, buf, moe_compress_max_bytes(&c, 3, 6), 3, 6, y) ==
                 MOE_STATUS_BAD_FORMAT,
             "int8 accepted a negative scale");
  }
}

static void test_zfp(float *x, float *y, unsigned char *buf, size_t cap) {
#if MOE_HAVE_ZFP
  const char *specs[] = {"zfp:4", "zfp", "zfp:12", "zfp:16", "zfp:24", "zfp:32"};
  const double rates[] = {4, 8, 12, 16, 24, 32};
  for (int s = 0; s < 6; s++) {
    const moe_compressor c = get(specs[s]);
    TU_CHECK(c.param == rates[s], "%s: param %g", specs[s], c.param);
    const double bound = ldexp(1.0, 6 - (int)rates[s]) + ldexp(1.0, -23);
    for (int sh = 0; sh < NSHAPES; sh++) {
      const size_t rows = k_shapes[sh].rows, cols = k_shapes[sh].cols, n = rows * cols;
      for (int d = 0; d < DIST_COUNT + 2; d++) {
        // DIST_COUNT: N(0,1); DIST_COUNT+1: a smooth field sin(r/7) cos(c/5).
        if (d < DIST_COUNT) {
          fill(x, n, (dist)d, 2000u + (uint64_t)(sh * 10 + d));
        } else if (d == DIST_COUNT) {
          moe_rng rng;
          moe_rng_init(&rng, 7, (uint64_t)sh);
          moe_rng_fill_normal(&rng, x, n, 0.0f, 1.0f);
        } else {
          for (size_t i = 0; i < n; i++) {
            x[i] = (float)(sin((double)(i / cols) / 7.0) * cos((double)(i % cols) / 5.0));
          }
        }
        const size_t bytes = round_trip(&c, x, rows, cols, y, buf, cap);
        if (bytes == SIZE_MAX) continue;
        TU_CHECK(bytes == moe_compress_max_bytes(&c, rows, cols),
                 "%s (%zu, %zu): fixed rate wrote %zu bytes, max_bytes %zu", specs[s], rows, cols,
                 bytes, moe_compress_max_bytes(&c, rows, cols));
        const double e = zfp_err(x, y, n);
        TU_CHECK(e <= bound, "%s (%zu, %zu) dist %d: max err %.3g * max|x| > bound %.3g", specs[s],
                 rows, cols, d, e, bound);
      }
    }
    // 2D payload of a 64x1024 matrix: exactly rate bits per value.
    const size_t want = 40 + (size_t)(rates[s] * 64 * 1024 / 8);
    TU_CHECK(moe_compress_max_bytes(&c, 64, 1024) == want, "%s: 64x1024 is %zu bytes, want %zu",
             specs[s], moe_compress_max_bytes(&c, 64, 1024), want);
  }
  // Higher rate, smaller error (the rate is really used).
  double prev = INFINITY;
  for (int r = 2; r <= 24; r += 2) {
    char spec[32];
    snprintf(spec, sizeof spec, "zfp:%d", r);
    const moe_compressor c = get(spec);
    fill(x, 17 * 33, DIST_UNIT, 77);
    if (round_trip(&c, x, 17, 33, y, buf, cap) == SIZE_MAX) continue;
    const double e = zfp_err(x, y, 17 * 33);
    TU_CHECK(e < prev, "zfp:%d error %.3g not below zfp:%d's %.3g", r, e, r - 2, prev);
    prev = e;
  }
  // Corrupt or mismatched buffers.
  const moe_compressor c = get("zfp");
  fill(x, 17 * 33, DIST_UNIT, 5);
  const size_t bytes = round_trip(&c, x, 17, 33, y, buf, cap);
  if (bytes != SIZE_MAX) {
    TU_CHECK(moe_decompress(&c, g_ctx, buf, bytes, 33, 17, y) == MOE_STATUS_BAD_FORMAT,
             "zfp decompressed a (17, 33) buffer as (33, 17)");
    TU_CHECK(moe_decompress(&c, g_ctx, buf, 20, 17, 33, y) == MOE_STATUS_BAD_FORMAT,
             "zfp accepted a buffer shorter than its header");
    buf[0] = 'X';
    TU_CHECK(moe_decompress(&c, g_ctx, buf, bytes, 17, 33, y) == MOE_STATUS_BAD_FORMAT,
             "zfp accepted a bad magic");
    size_t b2 = 0;
    TU_CHECK(moe_compress(&c, g_ctx, x, 17, 33, buf + 4, cap - 4, &b2) == MOE_STATUS_INVALID_ARG,
             "zfp accepted an unaligned output buffer");
  }
#else
  moe_compressor c;
  TU_CHECK(moe_compressor_get(g_ctx, "zfp", &c) == MOE_STATUS_UNSUPPORTED,
           "zfp without libzfp: not UNSUPPORTED");
  TU_CHECK(strstr(moe_ctx_error(g_ctx), "libzfp") != NULL, "zfp message: %s", moe_ctx_error(g_ctx));
  (void)x;
  (void)y;
  (void)buf;
  (void)cap;
#endif
}

static void test_all_common(float *x, float *y, unsigned char *buf, size_t cap) {
  const char *specs[] = {"none", "fp16", "bf16", "int8", "zfp"};
  const int nspecs = MOE_HAVE_ZFP ? 5 : 4;
  for (int s = 0; s < nspecs; s++) {
    const moe_compressor c = get(specs[s]);
    // Empty inputs: 0 bytes, nothing written, NULL buffers allowed.
    const shape empty[] = {{0, 0}, {0, 5}, {5, 0}};
    for (int e = 0; e < 3; e++) {
      size_t bytes = 99;
      TU_CHECK(moe_compress_max_bytes(&c, empty[e].rows, empty[e].cols) == 0,
               "%s: max_bytes of an empty matrix is not 0", specs[s]);
      TU_CHECK(moe_compress(&c, g_ctx, NULL, empty[e].rows, empty[e].cols, NULL, 0, &bytes) ==
                       MOE_STATUS_OK &&
                   bytes == 0,
               "%s: empty (%zu, %zu) compress: %s, %zu bytes", specs[s], empty[e].rows,
               empty[e].cols, moe_ctx_error(g_ctx), bytes);
      TU_CHECK(
          moe_decompress(&c, g_ctx, NULL, 0, empty[e].rows, empty[e].cols, NULL) == MOE_STATUS_OK,
          "%s: empty decompress: %s", specs[s], moe_ctx_error(g_ctx));
      TU_CHECK(moe_decompress(&c, g_ctx, buf, 8, empty[e].rows, empty[e].cols, y) ==
                   MOE_STATUS_BAD_FORMAT,
               "%s: empty decompress of 8 bytes accepted", specs[s]);
    }
    // Truncated, over-long and too-small buffers.
    fill(x, 15, DIST_UNIT, 3);
    const size_t bytes = round_trip(&c, x, 3, 5, y, buf, cap);
    if (bytes != SIZE_MAX) {
      TU_CHECK(moe_decompress(&c, g_ctx, buf, bytes - 1, 3, 5, y) == MOE_STATUS_BAD_FORMAT,
               "%s: a truncated buffer (%zu of %zu bytes) was accepted", specs[s], bytes - 1,
               bytes);
      TU_CHECK(moe_decompress(&c, g_ctx, buf, bytes + 8, 3, 5, y) == MOE_STATUS_BAD_FORMAT,
               "%s: an over-long buffer was accepted", specs[s]);
      size_t b2 = 0;
      TU_CHECK(moe_compress(&c, g_ctx, x, 3, 5, buf, moe_compress_max_bytes(&c, 3, 5) - 1, &b2) ==
                   MOE_STATUS_INVALID_ARG,
               "%s: a too-small output buffer was accepted", specs[s]);
      TU_CHECK(moe_compress(&c, g_ctx, NULL, 3, 5, buf, cap, &b2) == MOE_STATUS_INVALID_ARG,
               "%s: x = NULL accepted", specs[s]);
    }
    TU_CHECK(moe_compress_max_bytes(&c, SIZE_MAX / 2, 3) == SIZE_MAX,
             "%s: max_bytes of a huge matrix does not saturate", specs[s]);
    size_t b3 = 0;
    TU_CHECK(moe_compress(&c, g_ctx, x, SIZE_MAX / 2, 3, buf, cap, &b3) == MOE_STATUS_INVALID_ARG,
             "%s: a huge matrix was accepted", specs[s]);

    // NaN/Inf: preserved by none/fp16/bf16, rejected naming (row, col) otherwise.
    fill(x, 12, DIST_UNIT, 4);
    x[2 * 4 + 1] = NAN;
    x[2 * 4 + 3] = INFINITY;
    x[0] = -INFINITY;
    x[5] = -NAN;
    if (c.lossless || strcmp(specs[s], "fp16") == 0 || strcmp(specs[s], "bf16") == 0) {
      if (round_trip(&c, x, 3, 4, y, buf, cap) != SIZE_MAX) {
        TU_CHECK(isnan(y[9]) && isnan(y[5]), "%s: NaN not preserved (%g, %g)", specs[s],
                 (double)y[9], (double)y[5]);
        TU_CHECK(y[11] == INFINITY && y[0] == -INFINITY, "%s: Inf not preserved (%g, %g)", specs[s],
                 (double)y[11], (double)y[0]);
      }
    } else {
      x[0] = 0.5f;
      x[5] = 0.25f;  // the first non-finite is then x[2][1]
      size_t b4 = 0;
      TU_CHECK(moe_compress(&c, g_ctx, x, 3, 4, buf, cap, &b4) == MOE_STATUS_INVALID_ARG,
               "%s: NaN input accepted", specs[s]);
      TU_CHECK(strstr(moe_ctx_error(g_ctx), "x[2][1]") != NULL,
               "%s: the NaN message does not name x[2][1]: %s", specs[s], moe_ctx_error(g_ctx));
      x[9] = 1.0f;
      TU_CHECK(moe_compress(&c, g_ctx, x, 3, 4, buf, cap, &b4) == MOE_STATUS_INVALID_ARG &&
                   strstr(moe_ctx_error(g_ctx), "x[2][3]") != NULL,
               "%s: Inf input not rejected naming x[2][3]: %s", specs[s], moe_ctx_error(g_ctx));
    }
  }
  // none keeps NaN payloads and -0 bit for bit.
  const moe_compressor none = get("none");
  const uint32_t bits[4] = {0x7fc01234u, 0xffa00001u, 0x80000000u, 0x00000001u};
  float xb[4];
  memcpy(xb, bits, sizeof xb);
  if (round_trip(&none, xb, 2, 2, y, buf, cap) != SIZE_MAX) check_exact("none bits", xb, y, 4);
}

static void test_specs(void) {
  const char *good[] = {"none", "fp16", "bf16", "int8"};
  for (int i = 0; i < 4; i++) {
    const moe_compressor c = get(good[i]);
    TU_CHECK(strcmp(c.name, good[i]) == 0, "get(%s) gave %s", good[i], c.name);
    TU_CHECK(c.lossless == (i == 0), "%s: lossless %d", good[i], c.lossless);
  }
  TU_CHECK(strcmp(moe_compressor_names(), MOE_HAVE_ZFP ? "none, fp16, bf16, int8, zfp[:RATE]"
                                                       : "none, fp16, bf16, int8") == 0,
           "names: %s", moe_compressor_names());
  const char *bad[] = {"",       "foo",   "NONE",   "fp16x",  "int8:4",  "zfp:",     "zfp:0",
                       "zfp:33", "zfp:x", "zfp:8x", "zfp:-8", "zfp:nan", "zfp:0.99", "zf"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    moe_compressor c;
    const moe_status st = moe_compressor_get(g_ctx, bad[i], &c);
    const int zfp_unsupported = !MOE_HAVE_ZFP && strncmp(bad[i], "zfp", 3) == 0;
    TU_CHECK(st == (zfp_unsupported ? MOE_STATUS_UNSUPPORTED : MOE_STATUS_INVALID_ARG),
             "spec '%s' gave %s", bad[i], moe_status_str(st));
  }
  moe_compressor c;
  moe_compressor_get(g_ctx, "lz4", &c);
  TU_CHECK(strstr(moe_ctx_error(g_ctx), "lz4") && strstr(moe_ctx_error(g_ctx), "int8"),
           "unknown-name message does not list the valid ones: %s", moe_ctx_error(g_ctx));
#if MOE_HAVE_ZFP
  moe_compressor_get(g_ctx, "zfp:40", &c);
  TU_CHECK(strstr(moe_ctx_error(g_ctx), "[1, 32]") != NULL, "bad-rate message: %s",
           moe_ctx_error(g_ctx));
  TU_CHECK(get("zfp:1").param == 1.0 && get("zfp:32").param == 32.0 &&
               get("zfp:8.5").param == 8.5 && get("zfp").param == 8.0,
           "zfp rates 1, 32, 8.5 and the default 8 not parsed");
#endif
  TU_CHECK(moe_compressor_get(g_ctx, NULL, &c) == MOE_STATUS_INVALID_ARG, "NULL spec accepted");
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  if (moe_ctx_create(&g_ctx) != MOE_STATUS_OK) return 1;
  const size_t nmax = 64 * 1024;
  const size_t cap = 8 * nmax + 4096;
  float *x = moe_malloc(nmax * sizeof(float)), *y = moe_malloc(nmax * sizeof(float));
  unsigned char *buf = moe_malloc(cap);
  TU_CHECK(x && y && buf, "cannot allocate the test buffers");
  if (x && y && buf) {
    test_specs();
    test_round_trips(x, y, buf, cap);
    test_half_vectors(y, buf, cap);
    test_int8_special(y, buf, cap);
    test_zfp(x, y, buf, cap);
    test_all_common(x, y, buf, cap);
  }
  moe_free(x);
  moe_free(y);
  moe_free(buf);
  moe_ctx_destroy(g_ctx);
  return tu_finish("test_compress");
}
