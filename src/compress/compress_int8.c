// "int8": ScheMoE's per-row 8-bit quantisation (ALGORITHMS.md 1.3).
// Per row (over the last dim): bias = min, scale = max - min,
//   q = round((x - bias) / scale * 255) as uint8,  x' = q / 255 * scale + bias.
// Format: rows x {float bias, float scale}, then rows*cols uint8 (row-major);
// 8*rows + rows*cols bytes. ScheMoE sends q, bias and scale as three
// all-to-alls; one buffer here carries all three.
// Why: a 4x smaller payload with an error bound of half a step per row,
// |x' - x| <= scale/510 (plus float rounding). Constant rows (scale 0) are exact.
// Not: NaN/Inf-safe. The affine map cannot represent them, so non-finite input
// and rows whose max - min overflows float are rejected with INVALID_ARG.
// ScheMoE truncates (uint8 cast); this rounds, halving the worst error.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "moe/compress.h"

static size_t int8_max_bytes(const moe_compressor *c, size_t rows, size_t cols) {
  (void)c;
  if (rows == 0 || cols == 0) return 0;
  return rows * 2 * sizeof(float) + rows * cols;
}

// x (rows, cols) -> out: header (rows, 2) floats, then q (rows, cols) uint8
static moe_status int8_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                                size_t cols, void *out, size_t *out_bytes) {
  moe_status st = MOE_STATUS_OK;
  const size_t n = rows * cols;
  unsigned char *hdr = out;
  (void)c;
  *out_bytes = 0;
  if (n == 0) goto done;  // out may be NULL: no pointer arithmetic before this
  uint8_t *q = (uint8_t *)out + rows * 2 * sizeof(float);
  const ptrdiff_t bad = moe_find_nonfinite(x, n);
  MOE_FAIL_IF(ctx, bad >= 0, MOE_STATUS_INVALID_ARG,
              "int8: x[%zu][%zu] = %g is not finite (int8 cannot represent NaN/Inf; use none, "
              "fp16 or bf16)",
              (size_t)bad / cols, (size_t)bad % cols, (double)x[bad]);
  for (size_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    uint8_t *qr = q + r * cols;
    float lo = xr[0], hi = xr[0];
    for (size_t j = 1; j < cols; j++) {
      lo = xr[j] < lo ? xr[j] : lo;
      hi = xr[j] > hi ? xr[j] : hi;
    }
    const float scale = hi - lo;
    MOE_FAIL_IF(ctx, !isfinite(scale), MOE_STATUS_INVALID_ARG,
                "int8: row %zu spans [%g, %g], a range that overflows float", r, (double)lo,
                (double)hi);
    memcpy(hdr + r * 2 * sizeof(float), &lo, sizeof lo);
    memcpy(hdr + r * 2 * sizeof(float) + sizeof(float), &scale, sizeof scale);
    if (scale == 0.0f) {
      memset(qr, 0, cols);
      continue;
    }
    // Divide in double: (x - lo) / scale * 255 lands within 1e-12 of the exact
    // quotient, so the round-half-up below is the correctly rounded step.
    const double inv = 255.0 / (double)scale;
    for (size_t j = 0; j < cols; j++) {
      double v = ((double)xr[j] - (double)lo) * inv + 0.5;
      v = v < 0.0 ? 0.0 : (v > 255.0 ? 255.0 : v);
      qr[j] = (uint8_t)v;
    }
  }
  *out_bytes = int8_max_bytes(c, rows, cols);
done:
  return st;
}

// in: header (rows, 2) floats, q (rows, cols) uint8 -> y (rows, cols)
static moe_status int8_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in,
                                  size_t in_bytes, size_t rows, size_t cols, float *y) {
  moe_status st = MOE_STATUS_OK;
  const size_t want = int8_max_bytes(c, rows, cols);
  const unsigned char *hdr = in;
  MOE_FAIL_IF(ctx, in_bytes != want, MOE_STATUS_BAD_FORMAT,
              "int8: a (%zu, %zu) matrix is %zu bytes, got %zu", rows, cols, want, in_bytes);
  if (want == 0) goto done;
  const uint8_t *q = (const uint8_t *)in + rows * 2 * sizeof(float);
  for (size_t r = 0; r < rows; r++) {
    float bias, scale;
    memcpy(&bias, hdr + r * 2 * sizeof(float), sizeof bias);
    memcpy(&scale, hdr + r * 2 * sizeof(float) + sizeof(float), sizeof scale);
    MOE_FAIL_IF(ctx, !isfinite(bias) || !isfinite(scale) || scale < 0.0f, MOE_STATUS_BAD_FORMAT,
                "int8: row %zu has a corrupt header (bias %g, scale %g)", r, (double)bias,
                (double)scale);
    const float step = scale / 255.0f;
    const uint8_t *qr = q + r * cols;
    float *yr = y + r * cols;
    for (size_t j = 0; j < cols; j++) yr[j] = (float)qr[j] * step + bias;
  }
done:
  return st;
}

const moe_compressor_entry moe_compressor_int8 = {
    .codec = {"int8", 0, 0.0, int8_max_bytes, int8_compress, int8_decompress},
    .description = "per-row min/range 8-bit quantisation (ScheMoE)",
    .available = 1,
    .identity = 0,
    .plannable = 1,
    .param = NULL,
    .compress_gbs = 1.12,
    .decompress_gbs = 19.7};
