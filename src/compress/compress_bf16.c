// "bf16": float32 -> bfloat16 (the top 16 bits) with round-to-nearest-even, and
// back by appending 16 zero bits.
// Why: half the bytes with float32's exponent range, so no overflow for
// activations that fp16 would turn into Inf; 8 significant bits.
// Not: saturating. NaN stays a quiet NaN (0x40 set so rounding cannot turn it
// into Inf); +-Inf stays; finite values that round past 0x1.FEp127 become +-Inf,
// as IEEE rounding says. Float subnormals round like any other value.
#include <stdint.h>
#include <string.h>

#include "compress/compress_internal.h"
#include "moe/compress.h"

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static size_t bf16_max_bytes(const moe_compressor *c, size_t rows, size_t cols) {
  (void)c;
  return moe_codec16_max_bytes(rows, cols);
}

// x (rows, cols) -> out (rows*cols bfloat16)
static moe_status bf16_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                                size_t cols, void *out, size_t *out_bytes) {
  (void)c;
  (void)ctx;
  moe_codec16_encode(f32_to_bf16, x, rows * cols, out, out_bytes);
  return MOE_STATUS_OK;
}

// in (rows*cols bfloat16) -> y (rows, cols)
static moe_status bf16_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in,
                                  size_t in_bytes, size_t rows, size_t cols, float *y) {
  (void)c;
  return moe_codec16_decode(bf16_to_f32, "bf16", ctx, in, in_bytes, rows, cols, y);
}

const moe_compressor_entry moe_compressor_bf16 = {
    .codec = {"bf16", 0, 0.0, bf16_max_bytes, bf16_compress, bf16_decompress},
    .description = "bfloat16 (top 16 bits), round-to-nearest-even",
    .available = 1,
    .identity = 0,
    .plannable = 1,
    .param = NULL,
    .compress_gbs = 5.14,
    .decompress_gbs = 12.9};
