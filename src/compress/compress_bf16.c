// "bf16": float32 -> bfloat16 (the top 16 bits) with round-to-nearest-even, and
// back by appending 16 zero bits.
// Why: half the bytes with float32's exponent range, so no overflow for
// activations that fp16 would turn into Inf; 8 significant bits.
// Not: saturating. NaN stays a quiet NaN (0x40 set so rounding cannot turn it
// into Inf); +-Inf stays; finite values that round past 0x1.FEp127 become +-Inf,
// as IEEE rounding says. Float subnormals round like any other value.
#include <stdint.h>
#include <string.h>

#include "moe/compress.h"

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (uint16_t)(u >> 16);
}

static size_t bf16_max_bytes(const moe_compressor *c, size_t rows, size_t cols) {
  (void)c;
  return rows * cols * sizeof(uint16_t);
}

// x (rows, cols) -> out (rows*cols bfloat16)
static moe_status bf16_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                                size_t cols, void *out, size_t *out_bytes) {
  const size_t n = rows * cols;
  unsigned char *o = out;
  (void)c;
  (void)ctx;
  for (size_t i = 0; i < n; i++) {
    const uint16_t h = f32_to_bf16(x[i]);
    memcpy(o + 2 * i, &h, sizeof h);
  }
  *out_bytes = n * sizeof(uint16_t);
  return MOE_STATUS_OK;
}

// in (rows*cols bfloat16) -> y (rows, cols)
static moe_status bf16_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in,
                                  size_t in_bytes, size_t rows, size_t cols, float *y) {
  moe_status st = MOE_STATUS_OK;
  const size_t n = rows * cols;
  const unsigned char *p = in;
  (void)c;
  MOE_FAIL_IF(ctx, in_bytes != n * sizeof(uint16_t), MOE_STATUS_BAD_FORMAT,
              "bf16: a (%zu, %zu) matrix is %zu bytes, got %zu", rows, cols, n * sizeof(uint16_t),
              in_bytes);
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h);
    const uint32_t u = (uint32_t)h << 16;
    memcpy(&y[i], &u, sizeof u);
  }
done:
  return st;
}

const moe_compressor moe_compressor_bf16_impl = {
    "bf16", 0, 0.0, bf16_max_bytes, bf16_compress, bf16_decompress};
