// "fp16": float32 -> IEEE 754 binary16 with round-to-nearest-even, in portable C
// (no _Float16, no F16C), and back.
// Why: the paper's FP16 baseline (ALGORITHMS.md 1.3) as a payload codec: half
// the bytes, 11 significant bits.
// Not: saturating. Like IEEE conversion, |x| >= 65520 becomes +-Inf; NaN stays a
// quiet NaN (sign and top payload bits kept); +-Inf stays +-Inf; values below
// 2^-14 become half subnormals (correctly rounded), below 2^-25 signed zero.
//
// Method (F. Giesen's float_to_half_fast3_rtne / half_to_float): normal halves
// rebias the exponent and round with the "add 0xfff + lsb" trick on the bits;
// subnormal halves are produced by a float addition of 0.5, whose hardware
// round-to-nearest-even aligns the mantissa exactly where half's ulp (2^-24)
// sits. It needs the default rounding mode and no flush-to-zero, as C gives.
#include <stdint.h>
#include <string.h>

#include "compress/compress_internal.h"
#include "moe/compress.h"

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t o;
  u &= 0x7fffffffu;
  if (u >= 0x47800000u) {  // |f| >= 65536 (so Inf), or NaN
    o = u > 0x7f800000u ? 0x7e00u | ((u >> 13) & 0x3ffu) : 0x7c00u;
  } else if (u < 0x38800000u) {  // |f| < 2^-14: subnormal half or zero
    const float r = f32_from_bits(u) + 0.5f;
    o = f32_bits(r) - 0x3f000000u;
  } else {  // normal half, or rounds up to Inf for [65520, 65536)
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += 0xc8000fffu + mant_odd;  // exponent -= 112 (mod 2^32), round to nearest even
    o = u >> 13;
  }
  return (uint16_t)(o | sign);
}

static float f16_to_f32(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t u = ((uint32_t)h & 0x7fffu) << 13;
  const uint32_t e = u & shifted_exp;
  u += (uint32_t)(127 - 15) << 23;
  if (e == shifted_exp) {
    u += (uint32_t)(128 - 16) << 23;  // Inf/NaN: exponent all ones
  } else if (e == 0) {                // zero or subnormal: renormalise via float math
    u += 1u << 23;
    u = f32_bits(f32_from_bits(u) - f32_from_bits(113u << 23));
  }
  return f32_from_bits(u | ((uint32_t)h & 0x8000u) << 16);
}

static size_t fp16_max_bytes(const moe_compressor *c, size_t rows, size_t cols) {
  (void)c;
  return moe_codec16_max_bytes(rows, cols);
}

// x (rows, cols) -> out (rows*cols binary16)
static moe_status fp16_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                                size_t cols, void *out, size_t *out_bytes) {
  (void)c;
  (void)ctx;
  moe_codec16_encode(f32_to_f16, x, rows * cols, out, out_bytes);
  return MOE_STATUS_OK;
}

// in (rows*cols binary16) -> y (rows, cols)
static moe_status fp16_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in,
                                  size_t in_bytes, size_t rows, size_t cols, float *y) {
  (void)c;
  return moe_codec16_decode(f16_to_f32, "fp16", ctx, in, in_bytes, rows, cols, y);
}

const moe_compressor_entry moe_compressor_fp16 = {
    .codec = {"fp16", 0, 0.0, fp16_max_bytes, fp16_compress, fp16_decompress},
    .description = "IEEE binary16, round-to-nearest-even",
    .available = 1,
    .identity = 0,
    .plannable = 1,
    .param = NULL,
    .compress_gbs = 1.95,
    .decompress_gbs = 4.09};
